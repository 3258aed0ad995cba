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
//! and grouping saves less than it does on a durable server.
//!
//! The database is `RING0_BENCH_POSTGRES_URL`, or else `RING0_TEST_POSTGRES_URL`; without
//! either this part is skipped with a message.

use super::{PROPOSERS, median, ms, percentile, proposal};
use futures::executor::{LocalPool, block_on};
use futures::task::LocalSpawnExt;
use ring0_journal::{Journal, PostgresJournal, PostgresOptions, Proposal, ProposeDecision};
use std::cell::RefCell;
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

/// Commits per second of the four phases of one round.
struct Round {
    single_1: f64,
    grouped_1: f64,
    single_n: f64,
    grouped_n: f64,
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
    let rounds: Vec<Round> = (0..ROUNDS).map(|r| round(&single, &grouped, r)).collect();
    let ratio = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    println!(
        "PostgreSQL commits/s, median of {ROUNDS} rounds: 1 proposer {:.0} single, {:.0} grouped; \
         {PROPOSERS} proposers {:.0} single, {:.0} grouped",
        ratio(&|r| r.single_1),
        ratio(&|r| r.grouped_1),
        ratio(&|r| r.single_n),
        ratio(&|r| r.grouped_n),
    );
    println!(
        "PostgreSQL grouped / single at {PROPOSERS} proposers, median of {ROUNDS} rounds: {:.1}x \
         (target >= 10x); grouped at {PROPOSERS} / single at 1 proposer: {:.1}x; grouped / single \
         at 1 proposer: {:.2}x",
        ratio(&|r| r.grouped_n / r.single_n),
        ratio(&|r| r.grouped_n / r.single_1),
        ratio(&|r| r.grouped_1 / r.single_1),
    );
    drop((single, grouped));
    admin(&url, &format!("DROP SCHEMA {schema} CASCADE"));
}

fn round(single: &Arc<PostgresJournal>, grouped: &Arc<PostgresJournal>, r: usize) -> Round {
    Round {
        single_1: one_proposer(single, &format!("pg-s1-{r}"), r, "single"),
        grouped_1: one_proposer(grouped, &format!("pg-g1-{r}"), r, "grouped"),
        single_n: many_proposers(single, &format!("pg-sn-{r}"), r, "single"),
        grouped_n: many_proposers(grouped, &format!("pg-gn-{r}"), r, "grouped"),
    }
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
