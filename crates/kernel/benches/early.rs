//! Early execution on a simulated stream: a detached call followed by a 2,000-token write
//! streamed at 50 tokens/s. Prints the time from the detached call's completion to its start
//! with early execution and when waiting for the end of the round, and the saving.
//!
//! The stream runs on tokio's paused clock (virtual time: 40 s of generation take no wall time);
//! the early path's real dispatch latency is measured separately on the real clock.
//!
//! Run: `cargo bench -p ring0-kernel --bench early`

use async_trait::async_trait;
use ring0_core::{
    Authority, Effect, ExecutionProfile, Observation, ProviderFormat, Strategy, ToolSpec,
};
use ring0_kernel::{
    CallContext, GrantTable, Kernel, RoundIdentity, RoundOptions, SessionConfig, Tool, ToolError,
};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const WRITE_TOKENS: usize = 2_000;
const TOKENS_PER_SECOND: u64 = 50;

struct Stamp(Arc<Mutex<Option<Instant>>>);

#[async_trait]
impl Tool for Stamp {
    async fn call(&self, _ctx: CallContext, _args: Value) -> Result<Observation, ToolError> {
        self.0.lock().unwrap().get_or_insert(Instant::now());
        Ok(Observation::text("scheduled"))
    }
}

fn kernel(early: bool, stamp: Arc<Mutex<Option<Instant>>>) -> Kernel {
    let schema = json!({"type": "object", "properties": {"task": {"type": "string"}, "text": {"type": "string"}}});
    let mut delegate = ToolSpec::new("delegate", "", schema.clone())
        .effect(Effect::NonIdempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Neutral]);
    if early {
        delegate = delegate.execution(ExecutionProfile::EARLY);
    }
    let write = ToolSpec::new("write", "", schema)
        .effect(Effect::Idempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation]);
    Kernel::builder()
        .tool(delegate, Arc::new(Stamp(stamp)))
        .unwrap()
        .tool(write, Arc::new(Stamp(Arc::new(Mutex::new(None)))))
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
        .build()
}

/// Streams the round; returns the delay from the delegate's last event (its block completing,
/// which includes assembly and preparation) to its start.
async fn run(early: bool, tokens: usize, token_gap: Duration) -> Duration {
    let stamp = Arc::new(Mutex::new(None));
    let k = kernel(early, stamp.clone());
    let session = k.open_session(SessionConfig::new("bench"));
    let mut round = session.streaming_round(
        ProviderFormat::Anthropic,
        RoundIdentity::new("t", 0),
        RoundOptions::default(),
    );
    let ev = |v: Value| v;
    round.push(&ev(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "d", "name": "delegate", "input": {}}}))).await.unwrap();
    round.push(&ev(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"task\":\"research\"}"}}))).await.unwrap();
    let completed = Instant::now();
    round
        .push(&ev(json!({"type": "content_block_stop", "index": 0})))
        .await
        .unwrap();
    round.push(&ev(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "w", "name": "write", "input": {}}}))).await.unwrap();
    round.push(&ev(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"text\":\""}}))).await.unwrap();
    for i in 0..tokens {
        tokio::time::sleep(token_gap).await;
        round.push(&ev(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": format!("t{i} ")}}))).await.unwrap();
    }
    round.push(&ev(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"}"}}))).await.unwrap();
    round
        .push(&ev(json!({"type": "content_block_stop", "index": 1})))
        .await
        .unwrap();
    round
        .push(&ev(json!({"type": "message_stop"})))
        .await
        .unwrap();
    let out = round.finish().await;
    assert!(
        out.receipts.iter().all(|r| !r.is_error()),
        "{:?}",
        out.receipts
    );
    let started = stamp.lock().unwrap().expect("the delegate ran");
    started.saturating_duration_since(completed)
}

fn main() {
    let gap = Duration::from_millis(1000 / TOKENS_PER_SECOND);
    let virtual_rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let early = virtual_rt().block_on(run(true, WRITE_TOKENS, gap));
    let late = virtual_rt().block_on(run(false, WRITE_TOKENS, gap));
    println!(
        "simulated stream: detached call, then a {WRITE_TOKENS}-token write at {TOKENS_PER_SECOND} tokens/s"
    );
    println!(
        "  completion -> start, early execution:      {:>10.3} s",
        early.as_secs_f64()
    );
    println!(
        "  completion -> start, end of round:         {:>10.3} s",
        late.as_secs_f64()
    );
    println!(
        "  saving:                                    {:>10.3} s",
        (late - early).as_secs_f64()
    );

    // The early path's own latency on the real clock (no tokens streamed after it).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut samples: Vec<Duration> = (0..200)
        .map(|_| rt.block_on(run(true, 0, Duration::ZERO)))
        .collect();
    samples.sort();
    println!(
        "  real early-start latency (200 runs):       p50 {:.1} µs, p99 {:.1} µs",
        samples[100].as_secs_f64() * 1e6,
        samples[197].as_secs_f64() * 1e6
    );
}
