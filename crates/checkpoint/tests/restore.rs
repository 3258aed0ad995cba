//! Checkpoints as a specification: what restoring puts back, what it removes, and when it
//! refuses.

use ring0_checkpoint::{CheckpointError, Checkpoints};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

struct Fixture {
    _tmp: tempfile::TempDir,
    ws: std::path::PathBuf,
    store: Checkpoints,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir_all(ws.join("src/deep")).unwrap();
    fs::write(ws.join("README.md"), "read me\n").unwrap();
    fs::write(ws.join("src/lib.rs"), "pub fn one() {}\n").unwrap();
    fs::write(ws.join("src/deep/data.txt"), "deep\n").unwrap();
    fs::write(ws.join("run.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("src/lib.rs", ws.join("link")).unwrap();
    let store = Checkpoints::open(tmp.path().join("state/checkpoints"), &ws).unwrap();
    Fixture {
        _tmp: tmp,
        ws,
        store,
    }
}

/// Every path under `dir` with what it holds, for comparing whole trees.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(base)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o777;
            if meta.is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", fs::read_link(&path).unwrap().display()),
                );
            } else if meta.is_dir() {
                out.insert(rel, format!("dir {mode:o}"));
                walk(base, &path, out);
            } else {
                out.insert(
                    rel,
                    format!("{mode:o} {}", fs::read_to_string(&path).unwrap()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A write as the file tools make it: recorded before, done, recorded after.
fn tool_write(f: &Fixture, scope: &str, path: &str, content: &str) -> String {
    let id = f.store.before(scope, &[path]).unwrap();
    let full = f.ws.join(path);
    fs::create_dir_all(full.parent().unwrap()).unwrap();
    fs::write(full, content).unwrap();
    f.store.after(&[path]).unwrap();
    id
}

#[test]
fn restore_after_writes_and_a_removed_subdirectory_gives_the_tree_back() {
    let f = fixture();
    let original = tree(&f.ws);
    let id = tool_write(&f, "s", "src/lib.rs", "pub fn two() {}\n");
    assert_eq!(tool_write(&f, "s", "new/dir/file.txt", "new\n"), id);
    // A contained `rm -rf src/deep` and `chmod -x run.sh`, checkpointed as a command is.
    assert_eq!(f.store.snapshot_tree("s").unwrap(), id);
    fs::remove_dir_all(f.ws.join("src/deep")).unwrap();
    fs::set_permissions(f.ws.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::remove_file(f.ws.join("link")).unwrap();
    fs::write(f.ws.join("made-by-command.txt"), "x").unwrap();
    f.store.after_tree("s").unwrap();

    let report = f.store.restore(&id, false).unwrap();
    assert_eq!(tree(&f.ws), original);
    assert!(
        report.removed.contains(&"made-by-command.txt".to_string()),
        "{report:?}"
    );
    assert!(report.removed.contains(&"new".to_string()), "{report:?}");
    assert!(
        report.dirs_created.contains(&"src/deep".to_string()),
        "{report:?}"
    );
    assert!(
        f.store.list().unwrap().is_empty(),
        "an undone checkpoint stays listed"
    );
}

#[test]
fn restoring_an_earlier_checkpoint_undoes_the_later_ones_too() {
    let f = fixture();
    let original = tree(&f.ws);
    let first = tool_write(&f, "one", "README.md", "first\n");
    let second = tool_write(&f, "two", "README.md", "second\n");
    tool_write(&f, "two", "src/lib.rs", "changed\n");
    assert_ne!(first, second);
    let listed: Vec<String> = f.store.list().unwrap().into_iter().map(|c| c.id).collect();
    assert_eq!(listed, [first.clone(), second.clone()]);
    let report = f.store.restore(&first, false).unwrap();
    assert_eq!(report.undone, [first, second]);
    assert_eq!(tree(&f.ws), original);
}

#[test]
fn restoring_the_later_checkpoint_keeps_the_earlier_ones_effects() {
    let f = fixture();
    tool_write(&f, "one", "README.md", "first\n");
    let second = tool_write(&f, "two", "README.md", "second\n");
    f.store.restore(&second, false).unwrap();
    assert_eq!(
        fs::read_to_string(f.ws.join("README.md")).unwrap(),
        "first\n"
    );
    assert_eq!(f.store.list().unwrap().len(), 1);
}

#[test]
fn a_change_made_outside_ring0_refuses_the_restore_and_names_the_path() {
    let f = fixture();
    let id = tool_write(&f, "s", "README.md", "by ring0\n");
    fs::write(f.ws.join("README.md"), "by a person\n").unwrap();
    let err = f.store.restore(&id, false).unwrap_err();
    match &err {
        CheckpointError::ChangedOutside { paths, .. } => assert_eq!(paths, &["README.md"]),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(
        fs::read_to_string(f.ws.join("README.md")).unwrap(),
        "by a person\n"
    );
    let report = f.store.restore(&id, true).unwrap();
    assert_eq!(report.overwritten_outside_changes, ["README.md"]);
    assert_eq!(
        fs::read_to_string(f.ws.join("README.md")).unwrap(),
        "read me\n"
    );
}

#[test]
fn a_file_created_outside_ring0_after_a_tree_checkpoint_refuses_the_restore() {
    let f = fixture();
    let id = f.store.snapshot_tree("s").unwrap();
    f.store.after_tree("s").unwrap();
    fs::write(f.ws.join("notes-of-a-person.txt"), "keep me").unwrap();
    let err = f.store.restore(&id, false).unwrap_err();
    assert!(err.to_string().contains("notes-of-a-person.txt"), "{err}");
    assert!(f.ws.join("notes-of-a-person.txt").exists());
}

#[test]
fn ignored_files_are_neither_recorded_nor_removed() {
    let f = fixture();
    fs::write(f.ws.join(".gitignore"), "target/\n").unwrap();
    fs::create_dir_all(f.ws.join("target")).unwrap();
    fs::write(f.ws.join("target/big.o"), "object").unwrap();
    let id = f.store.snapshot_tree("s").unwrap();
    fs::write(f.ws.join("target/more.o"), "object").unwrap();
    fs::remove_file(f.ws.join("target/big.o")).unwrap();
    f.store.after_tree("s").unwrap();
    f.store.restore(&id, false).unwrap();
    assert!(f.ws.join("target/more.o").exists());
    assert!(!f.ws.join("target/big.o").exists());
}

#[test]
fn the_store_inside_the_workspace_is_never_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("a.txt"), "a").unwrap();
    let store = Checkpoints::open(tmp.path().join(".ring0/checkpoints"), tmp.path())
        .unwrap()
        .skip(&[tmp.path().join(".ring0")]);
    let id = store.snapshot_tree("s").unwrap();
    let checkpoint = store.list().unwrap().remove(0);
    assert_eq!(checkpoint.id, id);
    let paths: Vec<&String> = checkpoint.paths.keys().collect();
    assert_eq!(paths, ["a.txt"]);
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let f = fixture();
    for bad in ["../outside", "/etc/passwd", "", "a/../../b"] {
        let err = f.store.before("s", &[bad]).unwrap_err();
        assert!(
            matches!(err, CheckpointError::OutsideWorkspace(_)),
            "{bad}: {err}"
        );
    }
    for bad in ["cp-999999", "cp-../../etc", "nonsense"] {
        let err = f.store.restore(bad, false).unwrap_err();
        assert!(matches!(err, CheckpointError::NotFound(_)), "{bad}: {err}");
    }
}

#[test]
fn a_damaged_blob_stops_the_restore_before_any_change() {
    let f = fixture();
    let id = tool_write(&f, "s", "README.md", "changed\n");
    tool_write(&f, "s", "src/lib.rs", "changed too\n");
    let blobs = f.ws.parent().unwrap().join("state/checkpoints/blobs");
    for shard in fs::read_dir(&blobs).unwrap() {
        for blob in fs::read_dir(shard.unwrap().path()).unwrap() {
            fs::write(blob.unwrap().path(), "tampered").unwrap();
        }
    }
    let err = f.store.restore(&id, false).unwrap_err();
    assert!(matches!(err, CheckpointError::Corrupt(_)), "{err}");
    assert_eq!(
        fs::read_to_string(f.ws.join("README.md")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        fs::read_to_string(f.ws.join("src/lib.rs")).unwrap(),
        "changed too\n"
    );
}

#[test]
fn skipped_paths_are_not_recorded_by_a_mutation_either() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("ring0.toml"), "[workspace]\n").unwrap();
    let store = Checkpoints::open(tmp.path().join(".ring0/checkpoints"), tmp.path())
        .unwrap()
        .skip(&[tmp.path().join(".ring0"), tmp.path().join("ring0.toml")]);
    store
        .before("s", &["ring0.toml", ".ring0/journal.db", "a.txt"])
        .unwrap();
    let paths: Vec<String> = store.list().unwrap()[0].paths.keys().cloned().collect();
    assert_eq!(paths, ["a.txt"]);
}

#[test]
fn past_the_kept_number_the_oldest_checkpoint_is_dropped_with_its_blobs() {
    let f = fixture();
    let store = Checkpoints::open(f.ws.parent().unwrap().join("state/checkpoints"), &f.ws)
        .unwrap()
        .keep(2);
    for (scope, content) in [("a", "1\n"), ("b", "2\n"), ("c", "3\n")] {
        store.before(scope, &["README.md"]).unwrap();
        fs::write(f.ws.join("README.md"), content).unwrap();
        store.after(&["README.md"]).unwrap();
    }
    let ids: Vec<String> = store.list().unwrap().into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["cp-000002", "cp-000003"]);
    let blobs = f.ws.parent().unwrap().join("state/checkpoints/blobs");
    let count: usize = fs::read_dir(&blobs)
        .unwrap()
        .map(|s| fs::read_dir(s.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(
        count, 2,
        "the blob of the original README is gone with its checkpoint"
    );
}
