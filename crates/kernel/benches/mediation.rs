//! Per-call mediation overhead: a no-op in-process tool called through the whole pipeline
//! (provider parse, prepare, admit, plan, commit to the in-memory journal, dispatch, settle,
//! project, render) against the same async function awaited directly, in the same run.
//!
//! `cargo bench -p ring0-kernel --bench mediation`
//!
//! Four shapes are measured:
//! - one call per round through `Session::handle_turn` (OpenAI Chat Completions in and out): the
//!   headline figure, and the one `bench/peers` compares against other frameworks;
//! - one call per round through `Session::run_round` (no provider parse or render);
//! - one write per round through `Session::run_round`: committed to the in-memory journal,
//!   dispatched and settled through the journal's protocol;
//! - a round of 64 read-only calls in `SafeParallel` through `handle_turn`, reported per call;
//! - one call per round through `handle_turn` of a tool from a realistic catalog: every BFCL
//!   definition (`shared/data/bfcl`, or `RING0_BFCL_DIR`) registered after compatibility
//!   preparation, and `find_restaurants` (four parameters, an array among them) called with its
//!   ground-truth arguments. Skipped, saying so, when the corpus is not there.
//!
//! Inputs (turns, rounds, arguments) are built before each timed batch, so only the call is
//! timed. Each batch gets a fresh kernel and session, so the journal holds one batch's intents
//! (as a long run would) instead of growing for the whole benchmark. Each figure is the median
//! of several batches after warm-up batches; the spread (fastest and slowest batch) is printed
//! beside it. The last lines are machine-readable for `bench/peers/run.sh`.
//!
//! Each batch is timed twice: by the wall clock, and by the CPU time of the one thread that runs
//! the current-thread runtime (`/proc/thread-self/schedstat`), which on a machine shared with
//! other work counts only what this loop did. The peers' script measures its thread the same
//! way, so both ratios come from the same run; the CPU ratios are the ones to trust when the
//! wall-clock batches spread widely.
//!
//! This is a plain timing loop rather than a statistics framework: the quantity is a ratio of two
//! loops measured side by side, and the peers script needs a single parseable number.

use ring0_core::{Observation, ProposedArguments, ProposedCall, ProviderFormat, Round, ToolSpec};
use ring0_kernel::{
    CallContext, GrantTable, Kernel, RoundOptions, SchedulingMode, Session, SessionConfig,
    ToolError, tool_fn,
};
use serde_json::{Value, json};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Calls per timed batch (the journal of one batch's kernel holds this many intents).
const CALLS_PER_BATCH: usize = 2048;
/// Calls in the parallel round shape.
const ROUND_CALLS: usize = 64;
/// Untimed batches before measuring, per shape.
const WARMUP_BATCHES: usize = 3;
/// Timed batches per shape; the median is reported.
const SAMPLES: usize = 21;
/// Direct calls per timed batch: the direct call is tens of nanoseconds, so it needs more
/// iterations than the mediated one for the clock to resolve it well.
const DIRECT_CALLS_PER_BATCH: usize = 200_000;

const TOOL: &str = "noop";
/// The same function registered as a write: committed to the journal and settled through it.
const WRITE_TOOL: &str = "noop_write";

/// The realistic catalog's called tool, and the corpus files its definitions come from.
const CATALOG_TOOL: &str = "find_restaurants";
const CATALOG_FILES: &[&str] = &[
    "BFCL_v4_multiple.json",
    "BFCL_v4_simple_python.json",
    "BFCL_v4_parallel.json",
    "BFCL_v4_parallel_multiple.json",
];
/// Lets a checkout keep the corpus elsewhere.
const BFCL_DIR_ENV: &str = "RING0_BFCL_DIR";

/// The tool: echoes its one integer argument. The same function is registered with the kernel
/// and awaited directly as the baseline.
async fn noop(_ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
    Ok(Observation::json(json!({"x": args["x"]})))
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"x": {"type": "integer", "description": "any integer"}},
        "required": ["x"]
    })
}

fn session(mode: SchedulingMode) -> Session {
    let kernel = Kernel::builder()
        .tool(
            ToolSpec::read(TOOL, "returns its argument", schema()),
            tool_fn(noop),
        )
        .expect("the benchmark tool registers")
        .authorizer(Arc::new(GrantTable::allow(
            &[TOOL],
            ring0_core::Authority::A0,
        )))
        .build();
    kernel.open_session(SessionConfig::new("bench").mode(mode))
}

/// A session whose one tool is a write, so each call is committed to the in-memory journal,
/// dispatched and settled through the journal's protocol.
fn write_session() -> Session {
    let spec = ToolSpec::new(WRITE_TOOL, "returns its argument", schema())
        .effect(ring0_core::Effect::Idempotent)
        .authority(ring0_core::Authority::A1)
        .strategy(&[ring0_core::Strategy::Exploitation])
        .settlement(ring0_core::Settlement::IdempotencyKey);
    let kernel = Kernel::builder()
        .tool(spec, tool_fn(noop))
        .expect("the benchmark tool registers")
        .authorizer(Arc::new(GrantTable::allow(
            &[WRITE_TOOL],
            ring0_core::Authority::A1,
        )))
        .build();
    kernel.open_session(SessionConfig::new("bench"))
}

/// Every distinct BFCL definition (first one of each name wins), or `None` without the corpus.
fn bfcl_catalog() -> Option<Vec<Value>> {
    let dir = std::env::var_os(BFCL_DIR_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/bfcl")
        });
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for file in CATALOG_FILES {
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).ok()?;
            for f in case["function"].as_array().into_iter().flatten() {
                if let Some(name) = f["name"].as_str()
                    && seen.insert(name.to_string())
                {
                    out.push(f.clone());
                }
            }
        }
    }
    Some(out)
}

/// A session over the whole catalog, each tool a read that echoes its arguments; with the
/// number of tools that registered.
fn catalog_session(catalog: &[Value]) -> (Session, usize) {
    let mut builder = Kernel::builder();
    let mut registered = 0;
    for f in catalog {
        let spec = ToolSpec::read(
            f["name"].as_str().unwrap_or_default(),
            f["description"].as_str().unwrap_or_default(),
            f["parameters"].clone(),
        );
        let tool = tool_fn(|_ctx, args: Value| async move { Ok(Observation::json(args)) });
        builder = match builder.tool(spec, tool) {
            Ok(b) => {
                registered += 1;
                b
            }
            Err(refused) => *refused.builder,
        };
    }
    let kernel = builder
        .authorizer(Arc::new(GrantTable::allow(
            &["*"],
            ring0_core::Authority::A0,
        )))
        .build();
    (kernel.open_session(SessionConfig::new("bench")), registered)
}

/// A turn calling the catalog's tool with its ground-truth arguments (BFCL case
/// `multiple_115`), the number of results varying per call.
fn catalog_turn(i: usize) -> Value {
    let args = json!({"location": "Manhattan", "food_type": "Thai", "number": i % 50 + 1,
                      "dietary_requirements": ["vegan", format!("v{i}")]});
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": format!("call_{i}"), "type": "function",
         "function": {"name": CATALOG_TOOL, "arguments": args.to_string()}}]})
}

async fn catalog_batch(b: usize, catalog: &[Value]) -> (Elapsed, usize) {
    let (session, _) = catalog_session(catalog);
    let base = b * CALLS_PER_BATCH;
    let turns: Vec<Value> = (base..base + CALLS_PER_BATCH).map(catalog_turn).collect();
    (time_turns(&session, &turns).await, CALLS_PER_BATCH)
}

/// Runs every turn through `handle_turn`; the time it took. Every call must complete.
async fn time_turns(session: &Session, turns: &[Value]) -> Elapsed {
    let options = RoundOptions::default();
    let mut failed = 0;
    let start = Clock::start();
    for turn in turns {
        let out = session
            .handle_turn(ProviderFormat::OpenAiChat, turn, &options)
            .await
            .expect("a well-formed turn");
        failed += out.round.results.iter().filter(|r| r.is_error).count();
        black_box(out);
    }
    let elapsed = start.elapsed();
    assert_eq!(failed, 0, "benchmark calls must complete, not be rejected");
    elapsed
}

/// An OpenAI Chat Completions assistant turn with calls `first..first + n`. Arguments differ
/// per call so the exact-repeat guard and the journal see distinct intents, as in a real run.
fn chat_turn(first: usize, n: usize) -> Value {
    let calls: Vec<Value> = (first..first + n)
        .map(|i| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": TOOL, "arguments": format!("{{\"x\":{i}}}")}})
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}

fn one_call_round(i: usize, tool: &str) -> Round {
    Round {
        calls: vec![ProposedCall {
            index: 0,
            call_id: format!("call_{i}"),
            tool: tool.into(),
            arguments: ProposedArguments::Text(format!("{{\"x\":{i}}}")),
            idempotency_key: None,
        }],
        text: None,
    }
}

/// Nanoseconds per call of each timed batch.
struct Samples(Vec<f64>);

impl Samples {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }
    fn median(&self) -> f64 {
        let v = self.sorted();
        v[v.len() / 2]
    }
    fn min(&self) -> f64 {
        self.sorted()[0]
    }
    fn max(&self) -> f64 {
        self.sorted()[self.0.len() - 1]
    }
}

/// The CPU time this thread has run, in nanoseconds: the first field of
/// `/proc/thread-self/schedstat` (0 where the file is not there).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The start of a timed batch, on both clocks.
struct Clock {
    wall: Instant,
    cpu_ns: u64,
}

/// How long a batch took: by the wall clock, and on this thread's CPU.
struct Elapsed {
    wall: Duration,
    cpu: Duration,
}

impl Clock {
    fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu_ns: thread_cpu_ns(),
        }
    }

    fn elapsed(&self) -> Elapsed {
        Elapsed {
            wall: self.wall.elapsed(),
            cpu: Duration::from_nanos(thread_cpu_ns().saturating_sub(self.cpu_ns)),
        }
    }
}

/// Per-call figures of one shape, by the wall clock and on the thread's CPU.
struct Measured {
    wall: Samples,
    cpu: Samples,
}

/// Runs `WARMUP_BATCHES + SAMPLES` batches of `batch`, which returns (elapsed, calls).
async fn measure<F, Fut>(mut batch: F) -> Measured
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = (Elapsed, usize)>,
{
    let mut wall = Vec::with_capacity(SAMPLES);
    let mut cpu = Vec::with_capacity(SAMPLES);
    for b in 0..WARMUP_BATCHES + SAMPLES {
        let (elapsed, calls) = batch(b).await;
        if b >= WARMUP_BATCHES {
            wall.push(elapsed.wall.as_nanos() as f64 / calls as f64);
            cpu.push(elapsed.cpu.as_nanos() as f64 / calls as f64);
        }
    }
    Measured {
        wall: Samples(wall),
        cpu: Samples(cpu),
    }
}

async fn direct_batch(b: usize) -> (Elapsed, usize) {
    let ctx = CallContext {
        call_id: "call_0".into(),
        intent_id: None,
        idempotency_key: None,
        scope: Arc::from("bench"),
        session: Arc::new(ring0_kernel::SessionInfo::detached("bench")),
        cancel: CancellationToken::new(),
        timeout_ms: ring0_core::spec::TIMEOUT_MS_DEFAULT,
        events: ring0_kernel::EventSink::detached(),
        extensions: Default::default(),
    };
    let base = b * DIRECT_CALLS_PER_BATCH;
    let args: Vec<Value> = (base..base + DIRECT_CALLS_PER_BATCH)
        .map(|i| json!({"x": i}))
        .collect();
    let start = Clock::start();
    for a in args {
        let out = noop(ctx.clone(), a).await;
        black_box(out.expect("the tool never fails"));
    }
    (start.elapsed(), DIRECT_CALLS_PER_BATCH)
}

async fn handle_turn_batch(b: usize, per_round: usize, mode: SchedulingMode) -> (Elapsed, usize) {
    let session = session(mode);
    let rounds = CALLS_PER_BATCH / per_round;
    let base = b * CALLS_PER_BATCH;
    let turns: Vec<Value> = (0..rounds)
        .map(|r| chat_turn(base + r * per_round, per_round))
        .collect();
    (time_turns(&session, &turns).await, rounds * per_round)
}

async fn run_round_batch(b: usize, write: bool) -> (Elapsed, usize) {
    let (session, tool) = if write {
        (write_session(), WRITE_TOOL)
    } else {
        (session(SchedulingMode::SafeParallel), TOOL)
    };
    let base = b * CALLS_PER_BATCH;
    let rounds: Vec<Round> = (base..base + CALLS_PER_BATCH)
        .map(|i| one_call_round(i, tool))
        .collect();
    let options = RoundOptions::default();
    let mut failed = 0;
    let start = Clock::start();
    for round in rounds {
        let out = session.run_round(round, &options).await;
        failed += out.results.iter().filter(|r| r.is_error).count();
        black_box(out);
    }
    let elapsed = start.elapsed();
    assert_eq!(failed, 0, "benchmark calls must complete, not be rejected");
    (elapsed, CALLS_PER_BATCH)
}

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

fn line(label: &str, s: &Samples, direct: f64) {
    let m = s.median();
    println!(
        "{label:<52} {:>9.3} µs/call  (batches {:.3}–{:.3})  {:>8.0}× direct  overhead {:>8.3} µs/call",
        us(m),
        us(s.min()),
        us(s.max()),
        m / direct,
        us(m - direct),
    );
}

/// Every shape's figures.
struct Shapes {
    direct: Measured,
    direct_after: Measured,
    single: Measured,
    core: Measured,
    writes: Measured,
    round64: Measured,
    realistic: Option<(usize, Measured)>,
}

/// Prints the figures of one clock, then its machine-readable lines (`ring0_{key}…=`), for
/// `bench/peers/run.sh`.
fn report(m: &Shapes, clock: &str, key: &str, by: fn(&Measured) -> &Samples) {
    let (direct, d) = (by(&m.direct), by(&m.direct).median());
    println!(
        "ring0 mediation overhead ({clock}): no-op in-process tool, in-memory journal, \
         current-thread runtime"
    );
    println!(
        "median of {SAMPLES} batches after {WARMUP_BATCHES} warm-up batches; \
         {CALLS_PER_BATCH} mediated calls or {DIRECT_CALLS_PER_BATCH} direct calls per batch"
    );
    println!(
        "{:<52} {:>9.3} µs/call  (batches {:.3}–{:.3}; again at the end: {:.3})",
        "direct: the tool function awaited",
        us(d),
        us(direct.min()),
        us(direct.max()),
        us(by(&m.direct_after).median()),
    );
    line(
        "one call per round, handle_turn (OpenAI chat)",
        by(&m.single),
        d,
    );
    line("one call per round, run_round", by(&m.core), d);
    line("one write per round, run_round (journal)", by(&m.writes), d);
    line(
        &format!("{ROUND_CALLS} reads per round, SafeParallel, handle_turn"),
        by(&m.round64),
        d,
    );
    match &m.realistic {
        Some((tools, s)) => line(
            &format!("{CATALOG_TOOL} in a {tools}-tool BFCL catalog, handle_turn"),
            by(s),
            d,
        ),
        None => println!(
            "realistic catalog: skipped, the BFCL corpus is not there (set {BFCL_DIR_ENV})"
        ),
    }
    println!("ring0_{key}direct_us_per_call={:.4}", us(d));
    if let Some((_, s)) = &m.realistic {
        println!(
            "ring0_{key}overhead_us_per_call_catalog={:.3}",
            us(by(s).median() - d)
        );
    }
    println!(
        "ring0_{key}overhead_us_per_call={:.3}",
        us(by(&m.single).median() - d)
    );
    println!(
        "ring0_{key}overhead_us_per_call_round{ROUND_CALLS}={:.3}",
        us(by(&m.round64).median() - d)
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let direct = measure(direct_batch).await;
        let single = measure(|b| handle_turn_batch(b, 1, SchedulingMode::SafeParallel)).await;
        let core = measure(|b| run_round_batch(b, false)).await;
        let writes = measure(|b| run_round_batch(b, true)).await;
        let round64 =
            measure(|b| handle_turn_batch(b, ROUND_CALLS, SchedulingMode::SafeParallel)).await;
        let catalog = bfcl_catalog();
        let realistic = match &catalog {
            Some(c) => Some((catalog_session(c).1, measure(|b| catalog_batch(b, c)).await)),
            None => None,
        };
        // The direct figure is measured again at the end: if the machine's speed changed during
        // the run, the two direct figures disagree and the ratios deserve less trust.
        let direct_after = measure(direct_batch).await;

        let shapes = Shapes {
            direct,
            direct_after,
            single,
            core,
            writes,
            round64,
            realistic,
        };
        report(&shapes, "wall clock", "", |m| &m.wall);
        println!();
        report(&shapes, "this thread's CPU time", "cpu_", |m| &m.cpu);
    });
}
