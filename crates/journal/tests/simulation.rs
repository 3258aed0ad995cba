//! The deterministic simulation as part of the test suite.

mod common;

use ring0_journal::sim::{SimBackend, SimReport, run_seeds, run_world};

/// Seeds the test suite runs (`ring0 journal sim --seeds 100000` is the long run).
const SUITE_SEEDS: u64 = 2_000;

#[test]
fn two_thousand_seeds_violate_nothing_and_reach_every_failure_class_and_state() {
    let report = run_seeds(0..SUITE_SEEDS);
    println!("{report}");
    assert_eq!(report.seeds, SUITE_SEEDS);
    assert_eq!(report.violations, 0, "{report}");
    assert!(report.unreached_faults().is_empty(), "{report}");
    assert!(report.unreached_states().is_empty(), "{report}");
    assert!(report.crashes > SUITE_SEEDS, "{report}");
}

/// Seeds replayed on SQLite: fewer, since every write is a real fsynced transaction.
const BACKEND_SEEDS: u64 = 40;

#[test]
fn the_sqlite_backend_makes_the_same_decisions_as_the_memory_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.db");
    for seed in 0..BACKEND_SEEDS {
        let memory = run_world(seed, 0, &SimBackend::Memory);
        let sqlite = run_world(seed, 0, &SimBackend::Sqlite(path.clone()));
        assert!(
            sqlite.violations.is_empty(),
            "seed {seed}: {:?}",
            sqlite.violations
        );
        assert_eq!(memory.outcome, sqlite.outcome, "seed {seed}");
        assert_eq!(memory.trace, sqlite.trace, "seed {seed}");
    }
}

/// Seeds of the long run that once found a double effect (a recovery still running after a
/// restart re-dispatched a call a live task had in flight).
const REGRESSION_SEEDS: [u64; 3] = [13_472, 26_729, 55_473];

#[test]
fn seeds_that_once_found_a_double_effect_stay_clean() {
    for seed in REGRESSION_SEEDS {
        let report = ring0_journal::sim::run_seed(seed);
        assert_eq!(report.violations, 0, "seed {seed}: {report}");
    }
}

/// Seeds replayed on PostgreSQL in the suite, in [`POSTGRES_PARTS`] tests of consecutive seeds
/// that the test runner runs beside the others; `RING0_SIM_POSTGRES_SEEDS=N` runs `N` instead
/// (the command is in docs/deploy.md).
const POSTGRES_SEEDS_DEFAULT: u64 = 2_000;
/// Parts the PostgreSQL seeds are split in: each part reaches every failure class and state.
const POSTGRES_PARTS: u64 = 4;

#[test]
fn the_postgres_backend_makes_the_same_decisions_as_the_memory_backend_part_1() {
    postgres_part(0);
}

#[test]
fn the_postgres_backend_makes_the_same_decisions_as_the_memory_backend_part_2() {
    postgres_part(1);
}

#[test]
fn the_postgres_backend_makes_the_same_decisions_as_the_memory_backend_part_3() {
    postgres_part(2);
}

#[test]
fn the_postgres_backend_makes_the_same_decisions_as_the_memory_backend_part_4() {
    postgres_part(3);
}

/// Replays part `part` of the seeds on PostgreSQL and on memory: the same outcome, the same
/// trace (fences aside), no violated property, and every failure class and state reached on
/// PostgreSQL. Each part has a schema of its own, emptied between seeds.
fn postgres_part(part: u64) {
    let seeds = std::env::var("RING0_SIM_POSTGRES_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(POSTGRES_SEEDS_DEFAULT);
    let per_part = seeds.div_ceil(POSTGRES_PARTS);
    let range = (part * per_part).min(seeds)..((part + 1) * per_part).min(seeds);
    let Some(url) = common::fresh_postgres_schema() else {
        return;
    };
    let started = std::time::Instant::now();
    let mut reached = SimReport::default();
    for seed in range.clone() {
        if seed > range.start {
            common::empty_schema(&url);
        }
        let memory = run_world(seed, 0, &SimBackend::Memory);
        let postgres = run_world(seed, 0, &SimBackend::Postgres(url.clone()));
        assert!(
            postgres.violations.is_empty(),
            "seed {seed}: {:?}",
            postgres.violations
        );
        assert_eq!(memory.outcome, postgres.outcome, "seed {seed}");
        // The same steps in the same order with the same decisions; only the fences differ,
        // where a restarted replica took the records of the one that closed (a take moves the
        // fence, so the closed one is refused if it wakes up).
        assert_eq!(
            without_fences(&memory.trace),
            without_fences(&postgres.trace),
            "seed {seed}"
        );
        assert!(
            postgres.trace.iter().filter(|l| *l == "crash").count() > 0
                || memory.trace == postgres.trace,
            "seed {seed}: without a restart nothing is taken, and the fences agree too"
        );
        reached.add_world(&postgres);
    }
    println!(
        "seeds {range:?} on PostgreSQL, traces identical to memory, in {:.1} s\n{reached}",
        started.elapsed().as_secs_f64()
    );
    if range.end - range.start >= POSTGRES_SEEDS_DEFAULT / POSTGRES_PARTS {
        assert!(reached.unreached_faults().is_empty(), "{reached}");
        assert!(reached.unreached_states().is_empty(), "{reached}");
    }
}

/// A trace with the fences left out: each step's (` f<N>` at its end) and those a refusal names
/// (`…: expected N, record is at M`).
fn without_fences(trace: &[String]) -> Vec<&str> {
    trace
        .iter()
        .map(|step| {
            let step = step.split(": expected ").next().unwrap_or(step);
            match step.rsplit_once(" f") {
                Some((before, fence)) if fence.chars().all(|c| c.is_ascii_digit()) => before,
                _ => step,
            }
        })
        .collect()
}
