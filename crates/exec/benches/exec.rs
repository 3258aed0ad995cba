//! `cargo bench -p ring0-exec`: supervision overhead, measured against baselines in the same run.
//!
//! 1. Spawn + capture + shape of `true` and of `seq 1 100000` through `run_command`, against a
//!    bare `std::process::Command::output()` of the same command (ratio; targets ≤ 1.5× and
//!    ≤ 1.2×), with token counting on (the default) and off, with the sandbox off, on (warm
//!    namespaces, the default) and on with every namespace created per process.
//! 2. 1,000 concurrent `sleep 2` background jobs: ring0's own CPU time (utime + stime of this
//!    process, from /proc/self/stat) while they wait, as a share of wall time (target ≤ 2%).
//!    Each job first blocks opening a FIFO and then execs `sleep 2`; opening the FIFO for
//!    writing releases all of them at once, so the 1,000 sleeps run concurrently however long
//!    starting them took, and the window measured is from that release to the first exit.
//! 3. Teardown of a 100-process tree: time from `cancel` to zero survivors, checked in /proc.
//!
//! Iteration counts can be scaled with RING0_BENCH_SCALE (default 1).

use ring0_exec::{
    CommandSpec, ExecPolicy, JobEvent, JobManager, JobsConfig, SessionId, run_command,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn scale() -> usize {
    std::env::var("RING0_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn workspace() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ring0-exec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// utime + stime of this process, in clock ticks.
fn self_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Run time of every thread of this process in nanoseconds, from /proc/self/task/*/schedstat
/// (precise scheduler accounting, unlike the tick-sampled utime/stime).
fn self_runtime_ns() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
            total += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

fn ticks_per_second() -> f64 {
    // The kernel's USER_HZ; 100 on every Linux configuration in use.
    100.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn compare(label: &str, argv: &[&str], policy: &ExecPolicy, rounds: usize) {
    // Warm up both paths (page cache, allocator, runtime threads).
    for _ in 0..5 {
        std::process::Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        run_command(
            policy,
            &CommandSpec::argv(argv.to_vec()),
            std::future::pending(),
        )
        .await
        .unwrap();
    }
    let mut bare = Vec::with_capacity(rounds);
    let mut supervised = Vec::with_capacity(rounds);
    // Interleaved, so drift on a shared machine hits both alike.
    for _ in 0..rounds {
        let t = Instant::now();
        let out = std::process::Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        bare.push(t.elapsed());
        std::hint::black_box(out);

        let t = Instant::now();
        let report = run_command(
            policy,
            &CommandSpec::argv(argv.to_vec()),
            std::future::pending(),
        )
        .await
        .unwrap();
        supervised.push(t.elapsed());
        std::hint::black_box(report);
    }
    let (b, s) = (median(bare), median(supervised));
    println!(
        "{label:<44} bare {:>9.3} ms   ring0 {:>9.3} ms   ratio {:.2}x",
        b.as_secs_f64() * 1e3,
        s.as_secs_f64() * 1e3,
        s.as_secs_f64() / b.as_secs_f64()
    );
}

async fn spawn_capture_shape(ws: &Path) {
    println!("== spawn + capture + shape vs std::process::Command::output() (medians)");
    let rounds = 200 * scale();
    // The default policy runs everything in the sandbox; the unconfined rows show its share.
    let with_tokens = ExecPolicy::new(ws);
    let mut without_tokens = ExecPolicy::new(ws);
    without_tokens.shape.count_tokens = false;
    let unconfined = ExecPolicy::new(ws).sandbox(ring0_exec::Sandbox::off());
    let mut unconfined_without_tokens = unconfined.clone();
    unconfined_without_tokens.shape.count_tokens = false;
    compare(
        "true (sandbox off, tokens on)",
        &["true"],
        &unconfined,
        rounds,
    )
    .await;
    compare(
        "true (sandbox off, tokens off)",
        &["true"],
        &unconfined_without_tokens,
        rounds,
    )
    .await;
    let cold = ExecPolicy::new(ws).sandbox(with_tokens.sandbox.without_warm_namespaces());
    let mut cold_without_tokens = cold.clone();
    cold_without_tokens.shape.count_tokens = false;
    compare(
        "true (sandbox, every namespace per process)",
        &["true"],
        &cold_without_tokens,
        rounds,
    )
    .await;
    compare("true (token counting on)", &["true"], &with_tokens, rounds).await;
    compare(
        "true (token counting off)",
        &["true"],
        &without_tokens,
        rounds,
    )
    .await;
    let rounds = 40 * scale();
    compare(
        "seq 1 100000 (sandbox off, tokens off)",
        &["seq", "1", "100000"],
        &unconfined_without_tokens,
        rounds,
    )
    .await;
    compare(
        "seq 1 100000 (token counting on)",
        &["seq", "1", "100000"],
        &with_tokens,
        rounds,
    )
    .await;
    compare(
        "seq 1 100000 (token counting off)",
        &["seq", "1", "100000"],
        &without_tokens,
        rounds,
    )
    .await;
}

async fn idle_jobs(ws: &Path) {
    const JOBS: usize = 1000;
    println!("== {JOBS} concurrent `sleep 2` jobs: ring0 CPU while they wait");
    // Supervision's cost is measured here, without the sandbox (1,000 namespaces at once would
    // measure the kernel's namespace creation instead).
    let policy = ExecPolicy::new(ws)
        .allow_shell(true)
        .sandbox(ring0_exec::Sandbox::off());
    let mut config = JobsConfig::new(ws.join("state-idle"), policy);
    config.jobs_per_session = JOBS;
    config.jobs_total = JOBS;
    config.session_events = JOBS;
    let (jobs, _) = JobManager::open(config).await.unwrap();
    let session = SessionId::new("bench").unwrap();
    let mut events = jobs.open_session(&session).unwrap();

    let fifo = ws.join("barrier");
    let _ = std::fs::remove_file(&fifo);
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let script = format!("exec < {}; exec sleep 2", fifo.display());

    let start_cpu = self_cpu_ticks();
    let started = Instant::now();
    for _ in 0..JOBS {
        jobs.start(&session, &CommandSpec::shell(script.clone()))
            .await
            .unwrap();
    }
    let start_elapsed = started.elapsed();
    let start_cpu_used = self_cpu_ticks() - start_cpu;
    // Let every shell reach the FIFO before releasing them; meanwhile 1,000 jobs are live and
    // blocked, which is a waiting window of its own.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let blocked_cpu = self_cpu_ticks();
    let blocked_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let blocked_wall = blocked_started.elapsed();
    let blocked_cpu_used = self_cpu_ticks() - blocked_cpu;

    // Release the barrier; after the execs have settled, measure a window that ends before
    // the first sleep can exit.
    let released = Instant::now();
    drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wait_cpu = self_cpu_ticks();
    let wait_runtime = self_runtime_ns();
    let wait_started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let wait_wall = wait_started.elapsed();
    let wait_cpu_used = self_cpu_ticks() - wait_cpu;
    let wait_runtime_used = self_runtime_ns() - wait_runtime;
    if let Some(JobEvent::Finished { status }) = events.try_recv() {
        panic!(
            "a job finished inside the waiting window: {:?} {:?}",
            status.state,
            status.observation.map(|o| o.text)
        );
    }
    let first = events.recv().await.unwrap();
    let first_exit = released.elapsed();
    assert!(matches!(first, JobEvent::Finished { .. }));

    let mut finished = 1;
    while finished < JOBS {
        if let Some(JobEvent::Finished { .. }) = events.recv().await {
            finished += 1;
        }
    }
    let total_wall = started.elapsed();
    let total_cpu = self_cpu_ticks() - start_cpu;
    let tps = ticks_per_second();
    println!(
        "starting {JOBS} jobs: {:.0} ms wall, {:.0} ms ring0 CPU",
        start_elapsed.as_secs_f64() * 1e3,
        start_cpu_used as f64 / tps * 1e3
    );
    println!(
        "all {JOBS} blocked on the barrier ({:.0} ms wall): {:.0} ms ring0 CPU = {:.2}% of wall",
        blocked_wall.as_secs_f64() * 1e3,
        blocked_cpu_used as f64 / tps * 1e3,
        100.0 * (blocked_cpu_used as f64 / tps) / blocked_wall.as_secs_f64()
    );
    println!(
        "all {JOBS} sleeping ({:.0} ms window, 300 ms after release): {:.0} ms ring0 CPU = {:.2}% of wall (target <= 2%)",
        wait_wall.as_secs_f64() * 1e3,
        wait_cpu_used as f64 / tps * 1e3,
        100.0 * (wait_cpu_used as f64 / tps) / wait_wall.as_secs_f64()
    );
    println!(
        "  same window by scheduler run time of ring0's live threads (schedstat): {:.1} ms = {:.2}% of wall",
        wait_runtime_used as f64 / 1e6,
        100.0 * (wait_runtime_used as f64 / 1e9) / wait_wall.as_secs_f64()
    );
    println!(
        "  first exit {:.0} ms after release",
        first_exit.as_secs_f64() * 1e3
    );
    println!(
        "whole cycle (start, wait, {JOBS} completions): {:.0} ms wall, {:.0} ms ring0 CPU",
        total_wall.as_secs_f64() * 1e3,
        total_cpu as f64 / tps * 1e3
    );
    jobs.shutdown().await;
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat[stat.rfind(')').unwrap() + 2..].chars().next(),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

async fn tree_teardown(ws: &Path) {
    const TREE: usize = 100;
    println!("== teardown of a {TREE}-process tree: cancel until zero survivors");
    let policy = ExecPolicy::new(ws).allow_shell(true);
    let (jobs, _) = JobManager::open(JobsConfig::new(ws.join("state-tree"), policy))
        .await
        .unwrap();
    let session = SessionId::new("tree").unwrap();
    let _events = jobs.open_session(&session).unwrap();
    let mut times = Vec::new();
    for round in 0..5 * scale() {
        let pids = ws.join(format!("tree-{round}"));
        let script = format!(
            "for i in $(seq {}); do sleep 1000 & echo $! >> {p}; done; echo $$ >> {p}; wait",
            TREE - 1,
            p = pids.display()
        );
        let job = jobs
            .start(&session, &CommandSpec::shell(script))
            .await
            .unwrap()
            .job
            .to_string();
        loop {
            let n = std::fs::read_to_string(&pids)
                .map(|s| s.lines().count())
                .unwrap_or(0);
            if n >= TREE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t = Instant::now();
        jobs.cancel(&session, &job).await.unwrap();
        let elapsed = t.elapsed();
        let listed: Vec<i32> = std::fs::read_to_string(&pids)
            .unwrap()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        let survivors = listed.iter().filter(|p| alive(**p)).count();
        assert_eq!(survivors, 0, "survivors after teardown");
        times.push(elapsed);
    }
    let each: Vec<String> = times
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
        .collect();
    println!(
        "{TREE} processes: median {:.1} ms to zero survivors (runs: {} ms)",
        median(times).as_secs_f64() * 1e3,
        each.join(", ")
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ws = workspace();
    // RING0_BENCH_ONLY=spawn|idle|teardown runs one part (for profiling).
    let only = std::env::var("RING0_BENCH_ONLY").unwrap_or_default();
    let wants = |part: &str| only.is_empty() || only == part;
    runtime.block_on(async {
        if wants("spawn") {
            spawn_capture_shape(&ws).await;
        }
        if wants("idle") {
            idle_jobs(&ws).await;
        }
        if wants("teardown") {
            tree_teardown(&ws).await;
        }
    });
    let _ = std::fs::remove_dir_all(&ws);
}
