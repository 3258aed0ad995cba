//! The file tools' checkpoint hooks: what a mutation records before it changes anything, and
//! that a mutation whose checkpoint cannot be recorded is refused.

mod common;

use common::Env;
use ring0_checkpoint::{Checkpoints, PathState};
use serde_json::json;

fn store(env: &Env) -> Checkpoints {
    Checkpoints::open(env.dir.path().join("state/checkpoints"), &env.ws).unwrap()
}

#[tokio::test]
async fn write_file_and_apply_patch_record_what_they_touch_before_changing_it() {
    let env = Env::new();
    env.write("a.txt", "old\n");
    env.write("gone.txt", "bye\n");
    let (r, is_error) = env
        .call(
            "write_file",
            json!({"path": "new/dir/b.txt", "content": "b\n", "create_dirs": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    let patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-old\n+new\n*** Delete File: gone.txt\n*** End Patch\n";
    let (r, is_error) = env.call("apply_patch", json!({"patch": patch})).await;
    assert!(!is_error, "{r}");
    let all = store(&env).list().unwrap();
    assert_eq!(all.len(), 1, "one checkpoint for the session: {all:?}");
    let paths = &all[0].paths;
    assert_eq!(
        paths["new"],
        PathState::Absent,
        "a created directory is recorded absent"
    );
    assert_eq!(paths["new/dir/b.txt"], PathState::Absent);
    assert!(matches!(&paths["a.txt"], PathState::File { bytes: 4, .. }));
    assert!(matches!(&paths["gone.txt"], PathState::File { .. }));

    let report = store(&env).restore(&all[0].id, false).unwrap();
    assert_eq!(env.read("a.txt").as_deref(), Some("old\n"), "{report:?}");
    assert_eq!(env.read("gone.txt").as_deref(), Some("bye\n"));
    assert!(!env.path("new").exists());
}

#[tokio::test]
async fn a_mutation_whose_checkpoint_cannot_be_recorded_is_refused_and_changes_nothing() {
    let env = Env::new();
    env.write("a.txt", "old\n");
    std::fs::write(
        env.dir.path().join("state/checkpoints/index.json"),
        "not json",
    )
    .unwrap();
    let (r, is_error) = env
        .call(
            "write_file",
            json!({"path": "a.txt", "content": "new\n", "overwrite": true}),
        )
        .await;
    assert!(is_error);
    assert!(
        r.to_string().contains("checkpoint could not be recorded"),
        "{r}"
    );
    assert_eq!(env.read("a.txt").as_deref(), Some("old\n"));
    let patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-old\n+new\n*** End Patch\n";
    let (r, is_error) = env.call("apply_patch", json!({"patch": patch})).await;
    assert!(is_error, "{r}");
    assert_eq!(env.read("a.txt").as_deref(), Some("old\n"));
}
