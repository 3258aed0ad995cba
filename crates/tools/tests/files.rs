//! The file, search and shell tools through the kernel, as a model sees them.

mod common;

use common::{Env, failure, structured, text};
use serde_json::json;

#[tokio::test]
async fn read_file_returns_text_and_where_to_continue() {
    let env = Env::new();
    env.write("a.txt", "hello\nworld\n");
    let (r, is_error) = env
        .call(
            "read_file",
            json!({"path": "a.txt", "offset_bytes": 6, "max_bytes": 3}),
        )
        .await;
    assert!(!is_error, "{r}");
    assert_eq!(text(&r), "wor");
    let s = structured(&r);
    assert_eq!(s["next_offset"], 9);
    assert_eq!(s["size_bytes"], 12);
    assert_eq!(s["eof"], false);
}

#[tokio::test]
async fn read_file_never_splits_a_character() {
    let env = Env::new();
    env.write("u.txt", "aé");
    let (r, _) = env
        .call("read_file", json!({"path": "u.txt", "max_bytes": 2}))
        .await;
    assert_eq!(text(&r), "a");
    assert_eq!(structured(&r)["next_offset"], 1);
}

#[tokio::test]
async fn read_file_cuts_large_text_to_its_budget_and_says_where_to_continue() {
    let env = Env::new();
    env.write("big.txt", &"\"quoted\"\n".repeat(20_000));
    let (r, is_error) = env
        .call(
            "read_file",
            json!({"path": "big.txt", "max_bytes": 1_048_576}),
        )
        .await;
    assert!(!is_error, "the result fits the model-visible limits: {r}");
    let s = structured(&r);
    let returned = s["bytes_returned"].as_u64().unwrap();
    assert!(returned > 0 && returned < 180_000);
    assert_eq!(s["next_offset"], returned);
    assert!(s["note"].as_str().unwrap().contains("next_offset"));
}

#[tokio::test]
async fn read_file_refuses_binary_and_directories() {
    let env = Env::new();
    std::fs::write(env.path("b.bin"), [0xffu8, 0xfe, 0x00, 0x01]).unwrap();
    std::fs::create_dir(env.path("d")).unwrap();
    let (r, is_error) = env.call("read_file", json!({"path": "b.bin"})).await;
    assert!(is_error && failure(&r).contains("not UTF-8"), "{r}");
    let (r, is_error) = env.call("read_file", json!({"path": "d"})).await;
    assert!(is_error && failure(&r).contains("list_dir"), "{r}");
}

#[tokio::test]
async fn list_dir_pages_with_a_signed_cursor() {
    let env = Env::new();
    for i in 0..250 {
        env.write(&format!("d/f{i:03}.txt"), "x");
    }
    let (r, _) = env.call("list_dir", json!({"path": "d"})).await;
    let s = structured(&r);
    let first = s["entries"].as_array().unwrap();
    assert_eq!(first.len(), 200, "at most 200 entries a page");
    assert_eq!(first[0]["name"], "f000.txt");
    let cursor = s["next_cursor"].as_str().unwrap().to_string();
    let (r, _) = env
        .call("list_dir", json!({"path": "d", "cursor": cursor}))
        .await;
    let s = structured(&r);
    let second = s["entries"].as_array().unwrap();
    assert_eq!(second.len(), 50);
    assert_eq!(second[0]["name"], "f200.txt");
    assert!(s.get("next_cursor").is_none());
}

#[tokio::test]
async fn cursor_of_another_query_or_altered_is_refused() {
    let env = Env::new();
    for i in 0..5 {
        env.write(&format!("d/f{i}.txt"), "x");
    }
    let (r, _) = env.call("list_dir", json!({"path": "d", "limit": 2})).await;
    let cursor = structured(&r)["next_cursor"].as_str().unwrap().to_string();
    let (r, is_error) = env
        .call(
            "list_dir",
            json!({"path": ".", "limit": 2, "cursor": cursor}),
        )
        .await;
    assert!(is_error && failure(&r).contains("another query"), "{r}");
    let mut altered = cursor.clone();
    altered.replace_range(10..11, if &cursor[10..11] == "A" { "B" } else { "A" });
    let (r, is_error) = env
        .call(
            "list_dir",
            json!({"path": "d", "limit": 2, "cursor": altered}),
        )
        .await;
    assert!(
        is_error && failure(&r).contains("start the listing again"),
        "{r}"
    );
}

#[tokio::test]
async fn listings_respect_gitignore() {
    let env = Env::new();
    env.write(".gitignore", "target/\n*.log\n");
    env.write("src/main.rs", "fn main() {}\n");
    env.write("target/debug/out", "bin");
    env.write("run.log", "log");
    env.write("sub/.gitignore", "!keep.log\n");
    env.write("sub/keep.log", "kept");
    let (r, _) = env.call("list_dir", json!({})).await;
    let names: Vec<&str> = structured(&r)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["src", "sub"]);
    let (r, _) = env.call("glob", json!({"pattern": "**/*"})).await;
    let paths: Vec<&str> = structured(&r)["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec!["src/main.rs", "sub/keep.log"]);
}

#[tokio::test]
async fn search_returns_lines_with_numbers_a_page_at_a_time() {
    let env = Env::new();
    env.write("a.rs", "fn one() {}\nlet x = 1;\nfn two() {}\n");
    env.write("b/c.rs", "// fn in a comment\n");
    env.write("bin.dat", "fn \0 binary");
    let (r, _) = env
        .call("search", json!({"pattern": "fn \\w+", "limit": 2}))
        .await;
    let s = structured(&r);
    let m = s["matches"].as_array().unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(
        m[0],
        json!({"path": "a.rs", "line": 1, "text": "fn one() {}"})
    );
    assert_eq!(m[1]["line"], 3);
    let cursor = s["next_cursor"].as_str().unwrap().to_string();
    let (r, _) = env
        .call(
            "search",
            json!({"pattern": "fn \\w+", "limit": 2, "cursor": cursor}),
        )
        .await;
    let s = structured(&r);
    let m = s["matches"].as_array().unwrap();
    assert_eq!(m.len(), 1, "{s}");
    assert_eq!(m[0]["path"], "b/c.rs");
    assert!(s.get("next_cursor").is_none());
}

#[tokio::test]
async fn search_reports_a_bad_pattern_clearly() {
    let env = Env::new();
    let (r, is_error) = env.call("search", json!({"pattern": "(unclosed"})).await;
    assert!(is_error && failure(&r).contains("pattern"), "{r}");
}

#[tokio::test]
async fn write_file_needs_overwrite_to_replace() {
    let env = Env::new();
    env.write("a.txt", "old");
    let (r, is_error) = env
        .call("write_file", json!({"path": "a.txt", "content": "new"}))
        .await;
    assert!(is_error && failure(&r).contains("overwrite: true"), "{r}");
    assert_eq!(env.read("a.txt").unwrap(), "old");
    let (r, is_error) = env
        .call(
            "write_file",
            json!({"path": "a.txt", "content": "new", "overwrite": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    assert_eq!(env.read("a.txt").unwrap(), "new");
    assert_eq!(structured(&r)["replaced"], true);
}

#[tokio::test]
async fn write_file_creates_directories_only_when_asked() {
    let env = Env::new();
    let (_, is_error) = env
        .call("write_file", json!({"path": "x/y/z.txt", "content": "1"}))
        .await;
    assert!(is_error);
    let (r, is_error) = env
        .call(
            "write_file",
            json!({"path": "x/y/z.txt", "content": "1", "create_dirs": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    assert_eq!(env.read("x/y/z.txt").unwrap(), "1");
    let stray: Vec<_> = std::fs::read_dir(env.path("x/y")).unwrap().collect();
    assert_eq!(stray.len(), 1, "no temporary file left behind");
}

#[tokio::test]
async fn write_file_probe_recognises_its_own_result() {
    use ring0_kernel::ProbeFinding;
    let env = Env::new();
    let cfg = common::config(&env.ws, &env.dir.path().join("state"));
    let tools = ring0_tools::builtin_tools(&cfg).unwrap();
    let write = &tools
        .iter()
        .find(|(s, _)| s.name == "write_file")
        .unwrap()
        .1;
    let args = json!({"path": "p.txt", "content": "v2", "overwrite": true});
    env.write("p.txt", "v1");
    let snapshot = write.snapshot(&args).await;
    assert_eq!(
        write.probe(&args, snapshot.as_ref()).await,
        ProbeFinding::Unchanged
    );
    env.write("p.txt", "v2");
    assert!(matches!(
        write.probe(&args, snapshot.as_ref()).await,
        ProbeFinding::Applied(_)
    ));
    env.write("p.txt", "someone else");
    assert!(matches!(
        write.probe(&args, snapshot.as_ref()).await,
        ProbeFinding::Indeterminate(_)
    ));
}

#[tokio::test]
async fn shell_runs_argv_in_the_workspace() {
    let env = Env::new();
    env.write("sub/f.txt", "x");
    let (r, is_error) = env
        .call("shell", json!({"argv": ["ls"], "cwd": "sub"}))
        .await;
    assert!(!is_error, "{r}");
    let obs = &r["outcome"]["observation"];
    assert_eq!(obs["exit_code"], 0);
    assert!(obs["text"].as_str().unwrap().contains("f.txt"), "{obs}");
}

#[tokio::test]
async fn shell_needs_exactly_one_of_argv_and_command() {
    let env = Env::new();
    let (r, is_error) = env.call("shell", json!({})).await;
    assert!(is_error && failure(&r).contains("exactly one"), "{r}");
}

#[tokio::test]
async fn background_shell_returns_a_handle_and_job_wait_its_result() {
    let env = Env::new();
    let (r, is_error) = env
        .call(
            "shell",
            json!({"argv": ["sh", "-c", "echo done-marker"], "background": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    let job = structured(&r)["job"].as_str().unwrap().to_string();
    assert!(job.starts_with("job_"));
    let (r, is_error) = env
        .call("job_wait", json!({"job": job, "timeout_ms": 60_000}))
        .await;
    assert!(!is_error, "{r}");
    let status = structured(&r);
    assert_eq!(status["state"], "COMPLETED", "{status}");
    assert!(status.to_string().contains("done-marker"), "{status}");
    let (r, is_error) = env
        .call(
            "job_inspect",
            json!({"job": "job_00000000000000000000000000000000"}),
        )
        .await;
    assert!(is_error && failure(&r).contains("unknown job"), "{r}");
}

#[tokio::test]
async fn a_background_job_reports_its_completion_on_the_session_event_stream() {
    let env = Env::new();
    let mut events = env.session.subscribe();
    let (r, is_error) = env
        .call(
            "shell",
            json!({"argv": ["sh", "-c", "echo event-marker"], "background": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    let job = structured(&r)["job"].as_str().unwrap().to_string();
    let update = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            if let ring0_kernel::Event::JobUpdate { job, state, detail } =
                events.recv().await.unwrap()
            {
                return (job, state, detail);
            }
        }
    })
    .await
    .expect("the completion arrived as an event, without polling");
    assert_eq!(update.0, job);
    assert_eq!(update.1, "COMPLETED");
    assert_eq!(update.2["job"], job);
}

#[test]
fn directory_fsync_works_on_a_directory_handle() {
    let dir = tempfile::tempdir().unwrap();
    let handle =
        cap_std::fs::Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).unwrap();
    handle.open(".").unwrap().into_std().sync_all().unwrap();
}

#[tokio::test]
async fn shell_output_of_any_size_fits_what_the_model_may_see() {
    let env = Env::new();
    // Quotes and control bytes double or sextuple in JSON: the worst case for the projection.
    let script = "yes '\"\"\\\\' | head -c 400000; printf '\\001%.0s' $(seq 1 20000) >&2";
    let (r, is_error) = env
        .call("shell", json!({"argv": ["sh", "-c", script]}))
        .await;
    assert_ne!(r["status"], "projection_failed", "{r}");
    assert!(!is_error, "{r}");
    assert!(r.to_string().len() <= 64 * 1024, "{}", r.to_string().len());
}

#[tokio::test]
async fn listing_names_full_of_escapes_ends_the_page_early_with_a_cursor() {
    let env = Env::new();
    for i in 0..200 {
        let name = format!("{i:03}{}", "\u{1}".repeat(200));
        std::fs::write(env.path(&name), "x").unwrap();
    }
    let (r, is_error) = env.call("list_dir", json!({})).await;
    assert!(!is_error, "{r}");
    assert!(r.to_string().len() <= 64 * 1024);
    let s = structured(&r);
    let n = s["entries"].as_array().unwrap().len();
    assert!(n > 0 && n < 200, "{n}");
    assert!(s["next_cursor"].is_string(), "the rest is one cursor away");
}

#[tokio::test]
async fn search_matches_full_of_escapes_end_the_page_early_with_a_cursor() {
    let env = Env::new();
    let line = format!("hit{}\n", "\u{1}".repeat(230));
    env.write("noisy.txt", &line.repeat(300));
    let (r, is_error) = env.call("search", json!({"pattern": "hit"})).await;
    assert!(!is_error, "{r}");
    assert!(r.to_string().len() <= 64 * 1024);
    let s = structured(&r);
    let n = s["matches"].as_array().unwrap().len();
    assert!(n > 0 && n < 200, "{n}");
    assert!(s["next_cursor"].is_string());
}

#[tokio::test]
async fn search_over_many_files_keeps_walk_order_across_pages() {
    let env = Env::new();
    for i in 0..300 {
        env.write(
            &format!("d{:02}/f{i:03}.txt", i % 7),
            &format!("x\nneedle {i}\n"),
        );
    }
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..3 {
        let mut args = json!({"pattern": "needle"});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let (r, is_error) = env.call("search", args).await;
        assert!(!is_error, "{r}");
        let s = structured(&r);
        for m in s["matches"].as_array().unwrap() {
            assert_eq!(m["line"], 2);
            seen.push(m["path"].as_str().unwrap().to_string());
        }
        cursor = s["next_cursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen.len(), 300, "every match exactly once");
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "in walk (path) order");
}
