//! `cargo bench -p ring0-tools`: `read_file` of 1 MiB and `search` over a generated 10,000-file
//! tree, each against ripgrep (`rg`) on the same data in the same run. Prints medians and ratios.
//!
//! ring0's side is the tool executor as the kernel dispatches it (`Tool::call` with JSON
//! arguments, the result built as an observation), minus the kernel's own mediation, which
//! `cargo bench -p ring0-kernel --bench mediation` measures. ripgrep's side is a process per
//! run, so its figure includes process start-up; an in-process `std::fs::read` is printed as a
//! floor for the read.

use ring0_kernel::{CallContext, Tool};
use ring0_tools::{ToolsConfig, builtin_tools};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILES: usize = 10_000;
const DIRS: usize = 100;
const RUNS: usize = 11;
const READ_BYTES: usize = 1024 * 1024;

/// Deterministic pseudo-random words.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

const WORDS: &[&str] = &[
    "fn", "let", "match", "struct", "impl", "return", "value", "config", "error", "result",
    "option", "string", "vector", "handle", "session", "kernel", "journal", "policy", "shape",
];

fn line(rng: &mut Lcg) -> String {
    let n = 4 + (rng.next() % 8) as usize;
    (0..n)
        .map(|_| WORDS[(rng.next() as usize) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn generate(root: &Path) -> usize {
    let mut rng = Lcg(42);
    let mut needles = 0;
    for d in 0..DIRS {
        let dir = root.join(format!("dir{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..FILES / DIRS {
            let mut text = String::new();
            for l in 0..40 {
                text.push_str(&line(&mut rng));
                if (d * 100 + f) % 97 == 0 && l == 20 {
                    text.push_str(&format!(" NEEDLE_{}", d * 100 + f));
                    needles += 1;
                }
                text.push('\n');
            }
            std::fs::write(dir.join(format!("file{f:03}.txt")), text).unwrap();
        }
    }
    let mut big = String::with_capacity(READ_BYTES);
    while big.len() < READ_BYTES - 200 {
        big.push_str(&line(&mut rng));
        big.push('\n');
    }
    while big.len() < READ_BYTES {
        big.push('x');
    }
    std::fs::write(root.join("big.txt"), big).unwrap();
    needles
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time<F: FnMut()>(mut f: F) -> Duration {
    f(); // warm-up (page cache, allocator)
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn ctx() -> CallContext {
    CallContext {
        call_id: "bench".into(),
        intent_id: None,
        idempotency_key: None,
        scope: Arc::from("bench"),
        session: Arc::new(ring0_kernel::SessionInfo::detached("bench")),
        cancel: Default::default(),
        timeout_ms: 60_000,
        events: ring0_kernel::EventSink::detached(),
        extensions: Default::default(),
    }
}

fn rg(args: &[&str], dir: &Path) -> String {
    let out = Command::new("rg")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("ripgrep (`rg`) must be installed: apt-get install ripgrep");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    if Command::new("rg").arg("--version").output().is_err() {
        eprintln!("ripgrep (`rg`) is not installed: apt-get install ripgrep");
        std::process::exit(1);
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let needles = generate(&ws);
    let mut cfg = ToolsConfig::new(&ws, dir.path().join("state"), vec![1u8; 32]);
    // The benchmark reads the whole MiB in one call (the model-facing default is 32 KiB).
    cfg.read_text_bytes_max = 2 * READ_BYTES;
    let tools = builtin_tools(&cfg).unwrap();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|(s, _)| s.name == name)
            .unwrap()
            .1
            .clone()
    };
    let (read, search) = (tool("read_file"), tool("search"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let call = |t: &Arc<dyn Tool>, args: Value| rt.block_on(t.call(ctx(), args)).unwrap();

    // read_file of 1 MiB.
    let obs = call(&read, json!({"path": "big.txt", "max_bytes": READ_BYTES}));
    assert_eq!(obs.text.len(), READ_BYTES, "the whole MiB is returned");
    let t_read = time(|| {
        call(&read, json!({"path": "big.txt", "max_bytes": READ_BYTES}));
    });
    let t_std = time(|| {
        std::hint::black_box(std::fs::read(ws.join("big.txt")).unwrap());
    });
    let rg_lines: usize = rg(&["--no-config", "-c", "", "big.txt"], &ws)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(rg_lines > 0, "ripgrep read the file");
    let t_rg_read = time(|| {
        rg(&["--no-config", "-c", "", "big.txt"], &ws);
    });

    // search over 10,000 files.
    let args = json!({"pattern": "NEEDLE_[0-9]+"});
    let found = call(&search, args.clone());
    let structured = found.structured.unwrap();
    let ours = structured["matches"].as_array().unwrap().len();
    assert_eq!(structured["files_searched"], FILES as u64 + 1);
    let theirs = rg(&["--no-config", "-n", "NEEDLE_[0-9]+"], &ws)
        .lines()
        .count();
    assert_eq!((ours, theirs), (needles, needles), "both find every needle");
    let t_search = time(|| {
        call(&search, args.clone());
    });
    let t_rg_search = time(|| {
        rg(&["--no-config", "-n", "NEEDLE_[0-9]+"], &ws);
    });
    let t_rg_search_1 = time(|| {
        rg(&["--no-config", "-j1", "-n", "NEEDLE_[0-9]+"], &ws);
    });

    println!(
        "ring0-tools benchmark (median of {RUNS} runs, {} files, 2 search threads)",
        FILES + 1
    );
    println!(
        "read_file 1 MiB:    ring0 {}   rg {}   std::fs::read {}   ring0/rg = {:.2}   ring0/std = {:.2}",
        ms(t_read),
        ms(t_rg_read),
        ms(t_std),
        t_read.as_secs_f64() / t_rg_read.as_secs_f64(),
        t_read.as_secs_f64() / t_std.as_secs_f64()
    );
    println!(
        "search 10,000 files: ring0 {}   rg {}   rg -j1 {}   ring0/rg = {:.2}   ring0/rg-j1 = {:.2}   ({needles} matches)",
        ms(t_search),
        ms(t_rg_search),
        ms(t_rg_search_1),
        t_search.as_secs_f64() / t_rg_search.as_secs_f64(),
        t_search.as_secs_f64() / t_rg_search_1.as_secs_f64()
    );
}
