//! Durable commits per second of the PostgreSQL journal, single against grouped.
//!
//! Four phases per round, on one database, in a schema of their own dropped at the end: one
//! proposer and [`PROPOSERS`] concurrent proposers (async tasks on one executor thread, as the
//! kernel's calls reach the journal), each with group commit off (every proposal its own
//! transaction; the pool's connections let up to 16 run at once) and on (a batch per
//! transaction, one `COMMIT`). The result is the median over [`ROUNDS`] of each round's ratios,
//! so load from elsewhere on the machine moves a round, not the result.
//!
//! The server's durability settings are printed with the figures: on a cluster with
//! `fsync=off` (the tests' throw-away one) a `COMMIT` costs a round trip, not a disk flush,
//! and grouping saves less than it does on a durable server. `bench/journal/run.sh` runs this
//! against a durable throw-away cluster and an `fsync=off` one.
//!
//! To say where the time goes, each phase at [`PROPOSERS`] proposers also prints the CPU time
//! spent per commit by the server's backends serving the journals (when the server runs on
//! this machine: read from `/proc`, by the pids `pg_stat_activity` names) and by this process
//! (the proposers and the journals' runtimes), and the grouped phase the journal's own account
//! of its batches ([`ring0_journal::GroupStats`]). A grouped batch of new intents costs five
//! round trips whatever its size (`BEGIN`, the read, the insert, the claims, `COMMIT`), so once
//! batches are large the rate is bounded by CPU, not by waiting.
//!
//! Last measured (`bash bench/journal/run.sh`, 2 cores shared with a compile, load average
//! 6.8): durable, 896 single and 2,832 grouped commits/s at 64 proposers (3.2x); fsync=off,
//! 1,105 and 4,016 (4.0x). The target of 10x is not met, and CPU says why: a single commit
//! costs about 950 µs of server CPU and 350 µs of this process's, a grouped one about 150 µs
//! and 60 µs, so on the same cores the ratio cannot pass about 6x whatever the round trips.
//! Of a grouped commit's server CPU, most is per row: the insert of the intent (about 36 µs)
//! and its two claims (about 40 µs each, of which the foreign-key check on `intent_seq` is
//! about 25 µs).
//!
//! The database is `RING0_BENCH_POSTGRES_URL`, or else `RING0_TEST_POSTGRES_URL`; without
//! either this part is skipped with a message.

use super::{PROPOSERS, median, ms, percentile, proposal};
use futures::executor::{LocalPool, block_on};
use futures::task::LocalSpawnExt;
use ring0_journal::{
    GroupStats, Journal, PostgresJournal, PostgresOptions, Proposal, ProposeDecision,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Proposals of the one proposer per phase.
const SINGLE_COMMITS: usize = 100;
/// Proposals per proposer in the concurrent phases.
const PER_PROPOSER: usize = 20;
/// Interleaved rounds of the four phases.
const ROUNDS: usize = 5;

/// The variables naming the database, in the order they are read.
const URL_VARS: [&str; 2] = ["RING0_BENCH_POSTGRES_URL", "RING0_TEST_POSTGRES_URL"];

/// Commits per second of the four phases of one round, and the CPU time per commit of the
/// phases at [`PROPOSERS`] proposers.
struct Round {
    single_1: f64,
    grouped_1: f64,
    single_n: Phase,
    grouped_n: Phase,
}

/// What a phase at [`PROPOSERS`] proposers measured.
struct Phase {
    rate: f64,
    /// CPU microseconds per commit of the server's journal backends (`None`: not on this
    /// machine) and of this process.
    server_us: Option<f64>,
    client_us: f64,
}

pub fn run() {
    let Some(url) = URL_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
    else {
        println!(
            "PostgreSQL: skipped: no database; set {} (or {}) to a server this benchmark may \
             create a schema in",
            URL_VARS[0], URL_VARS[1]
        );
        return;
    };
    let schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
    admin(&url, &format!("CREATE SCHEMA {schema}"));
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{sep}options=-c%20search_path%3D{schema}");
    println!(
        "journal commit benchmark: PostgreSQL, {}",
        admin_settings(&url)
    );
    let open = |group_commit| {
        Arc::new(
            PostgresJournal::open(
                &scoped,
                PostgresOptions {
                    group_commit,
                    ..PostgresOptions::default()
                },
            )
            .expect("the benchmark's database opens"),
        )
    };
    let (single, grouped) = (open(false), open(true));
    for n in 0..20 {
        commit(&single, proposal("pg-warm-s", n));
        commit(&grouped, proposal("pg-warm-g", n));
    }
    let rounds: Vec<Round> = (0..ROUNDS)
        .map(|r| round(&url, &single, &grouped, r))
        .collect();
    let ratio = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    println!(
        "PostgreSQL commits/s, median of {ROUNDS} rounds: 1 proposer {:.0} single, {:.0} grouped; \
         {PROPOSERS} proposers {:.0} single, {:.0} grouped",
        ratio(&|r| r.single_1),
        ratio(&|r| r.grouped_1),
        ratio(&|r| r.single_n.rate),
        ratio(&|r| r.grouped_n.rate),
    );
    let cpu = |f: &dyn Fn(&Round) -> Option<f64>| {
        let v: Option<Vec<f64>> = rounds.iter().map(f).collect();
        v.map_or("unknown (the server is not on this machine)".into(), |v| {
            format!("{:.0} µs", median(v))
        })
    };
    println!(
        "PostgreSQL CPU per commit at {PROPOSERS} proposers, median of {ROUNDS} rounds: server \
         {} single, {} grouped; this process {:.0} µs single, {:.0} µs grouped ({} cores)",
        cpu(&|r| r.single_n.server_us),
        cpu(&|r| r.grouped_n.server_us),
        ratio(&|r| r.single_n.client_us),
        ratio(&|r| r.grouped_n.client_us),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "PostgreSQL grouped / single at {PROPOSERS} proposers, median of {ROUNDS} rounds: {:.1}x \
         (target >= 10x); grouped at {PROPOSERS} / single at 1 proposer: {:.1}x; grouped / single \
         at 1 proposer: {:.2}x",
        ratio(&|r| r.grouped_n.rate / r.single_n.rate),
        ratio(&|r| r.grouped_n.rate / r.single_1),
        ratio(&|r| r.grouped_1 / r.single_1),
    );
    drop((single, grouped));
    admin(&url, &format!("DROP SCHEMA {schema} CASCADE"));
}

fn round(
    url: &str,
    single: &Arc<PostgresJournal>,
    grouped: &Arc<PostgresJournal>,
    r: usize,
) -> Round {
    Round {
        single_1: one_proposer(single, &format!("pg-s1-{r}"), r, "single"),
        grouped_1: one_proposer(grouped, &format!("pg-g1-{r}"), r, "grouped"),
        single_n: measured(url, single, &format!("pg-sn-{r}"), r, "single"),
        grouped_n: measured(url, grouped, &format!("pg-gn-{r}"), r, "grouped"),
    }
}

/// [`many_proposers`] with the CPU it cost, and the journal's account of its batches.
fn measured(url: &str, j: &Arc<PostgresJournal>, run: &str, r: usize, mode: &str) -> Phase {
    let (server, client) = (server_cpu(url), process_cpu());
    let batches = j.group_stats();
    let rate = many_proposers(j, run, r, mode);
    let commits = (PROPOSERS * PER_PROPOSER) as f64;
    let per_commit = |spent: Duration| spent.as_secs_f64() * 1e6 / commits;
    // Per backend: one the pool opened during the phase ran all its time in it.
    let server_us = server.zip(server_cpu(url)).map(|(before, after)| {
        per_commit(
            after
                .iter()
                .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or_default()))
                .sum(),
        )
    });
    let client_us = per_commit(process_cpu().saturating_sub(client));
    let batches = batches.zip(j.group_stats()).map(|(b, a)| a.since(&b));
    println!(
        "round {r} PostgreSQL {PROPOSERS} proposers, {mode}: CPU per commit: server {}, this \
         process {client_us:.0} µs{}",
        server_us.map_or("unknown".into(), |us| format!("{us:.0} µs")),
        batches.map_or(String::new(), batch_line),
    );
    Phase {
        rate,
        server_us,
        client_us,
    }
}

/// The journal's batches during a phase: how many, how large, how long.
fn batch_line(s: GroupStats) -> String {
    let batches = s.batches.max(1) as f64;
    format!(
        "; {} batches of {:.1} proposals on average, {:.2} ms each; {} proposals decided alone",
        s.batches,
        s.batched as f64 / batches,
        s.batch_time.as_secs_f64() * 1e3 / batches,
        s.alone
    )
}

/// CPU time this process has run, all its threads (from `/proc/self/task/*/schedstat`, in
/// nanoseconds; zero where there is no `/proc`).
fn process_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter_map(|t| run_time(&t.path().join("schedstat")))
        .sum()
}

/// CPU time each of the server's backends serving ring0 has run, by pid, when they are
/// processes of this machine (`None` otherwise).
fn server_cpu(url: &str) -> Option<HashMap<i32, Duration>> {
    let pids: Vec<i32> = with_admin(url, async |c| {
        c.query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'ring0'",
            &[],
        )
        .await
        .map(|rows| rows.iter().filter_map(|r| r.try_get(0).ok()).collect())
        .unwrap_or_default()
    });
    let times: Option<HashMap<i32, Duration>> = pids
        .iter()
        .map(|pid| {
            let path = format!("/proc/{pid}/schedstat");
            run_time(std::path::Path::new(&path)).map(|t| (*pid, t))
        })
        .collect();
    times.filter(|t| !t.is_empty())
}

/// The first field of a `schedstat` file: nanoseconds the task has run on a CPU.
fn run_time(path: &std::path::Path) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

fn commit(j: &PostgresJournal, p: Proposal) -> Duration {
    let started = Instant::now();
    let d = block_on(j.propose(p)).expect("durable commit");
    let latency = started.elapsed();
    assert!(matches!(d, ProposeDecision::Recorded(_)), "{d:?}");
    latency
}

fn one_proposer(j: &PostgresJournal, run: &str, r: usize, mode: &str) -> f64 {
    let proposals: Vec<Proposal> = (0..SINGLE_COMMITS).map(|n| proposal(run, n)).collect();
    let started = Instant::now();
    let mut latencies: Vec<Duration> = proposals.into_iter().map(|p| commit(j, p)).collect();
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    let rate = SINGLE_COMMITS as f64 / secs;
    println!(
        "round {r} PostgreSQL 1 proposer, {mode}: {SINGLE_COMMITS} commits in {secs:.2} s = \
         {rate:.0} commits/s; latency p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    rate
}

fn many_proposers(j: &Arc<PostgresJournal>, run: &str, r: usize, mode: &str) -> f64 {
    let mut pool = LocalPool::new();
    let samples: Rc<RefCell<Vec<Duration>>> = Rc::new(RefCell::new(Vec::new()));
    for t in 0..PROPOSERS {
        let proposals: Vec<Proposal> = (0..PER_PROPOSER)
            .map(|n| proposal(run, t * PER_PROPOSER + n))
            .collect();
        let (j, samples) = (j.clone(), samples.clone());
        pool.spawner()
            .spawn_local(async move {
                for p in proposals {
                    let started = Instant::now();
                    let d = j.propose(p).await.expect("durable commit");
                    samples.borrow_mut().push(started.elapsed());
                    assert!(matches!(d, ProposeDecision::Recorded(_)), "{d:?}");
                }
            })
            .expect("a local task spawns");
    }
    let started = Instant::now();
    pool.run();
    let secs = started.elapsed().as_secs_f64();
    let mut latencies = samples.take();
    latencies.sort();
    let total = PROPOSERS * PER_PROPOSER;
    let rate = total as f64 / secs;
    println!(
        "round {r} PostgreSQL {PROPOSERS} proposers, {mode}: {total} commits in {secs:.2} s = \
         {rate:.0} commits/s; latency p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    rate
}

/// Runs `f` with a connection of the benchmark's own, beside the journals'.
fn with_admin<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime starts");
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("the benchmark's database accepts a connection");
        let driver = tokio::spawn(connection);
        let out = f(&client).await;
        drop(client);
        let _ = driver.await;
        out
    })
}

fn admin(url: &str, sql: &str) {
    with_admin(url, async |c| c.batch_execute(sql).await.expect(sql));
}

/// The server's settings that decide what a `COMMIT` costs.
fn admin_settings(url: &str) -> String {
    with_admin(url, async |c| {
        let mut shown = Vec::new();
        for name in ["fsync", "synchronous_commit", "commit_delay"] {
            let value: String = c
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .and_then(|row| row.try_get(0))
                .unwrap_or_else(|e| format!("unknown ({e})"));
            shown.push(format!("{name}={value}"));
        }
        shown.join(", ")
    })
}
