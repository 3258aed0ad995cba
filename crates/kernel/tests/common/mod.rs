//! Shared test fixtures: a recording tool and helpers to build kernels and rounds.
#![allow(dead_code)]

use ring0_core::{Authority, Observation, ProposedArguments, ProposedCall, Round, ToolSpec};
use ring0_kernel::{CallContext, GrantTable, Kernel, KernelBuilder, Tool, ToolError};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What happened, in order, across all calls of a recorder.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    Start { index: String, key: Option<String> },
    End { index: String },
}

/// A tool that records starts and ends, tracks concurrency and counts effects.
#[derive(Default)]
pub struct Recorder {
    pub log: Mutex<Vec<Mark>>,
    pub running: AtomicUsize,
    pub max_running: AtomicUsize,
    pub calls: AtomicUsize,
    /// Running calls per conflict key, to catch two equal keys at once.
    pub by_key: Mutex<HashMap<String, usize>>,
    pub key_overlap: AtomicUsize,
}

impl Recorder {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn log(&self) -> Vec<Mark> {
        self.log.lock().unwrap().clone()
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Arguments understood by the recorder tool: `tag` (echoed), `delay_ms`, `fail`
/// (`"unknown"` | `"not_applied"` | `"panic"` | `"hang"`), `key` (conflict key).
pub struct RecorderTool(pub Arc<Recorder>);

#[async_trait::async_trait]
impl Tool for RecorderTool {
    async fn call(&self, _ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let r = &self.0;
        let tag = args["tag"].as_str().unwrap_or_default().to_string();
        let key = args.get("key").and_then(Value::as_str).map(str::to_string);
        r.calls.fetch_add(1, Ordering::SeqCst);
        let now = r.running.fetch_add(1, Ordering::SeqCst) + 1;
        r.max_running.fetch_max(now, Ordering::SeqCst);
        if let Some(k) = &key {
            let mut by_key = r.by_key.lock().unwrap();
            let n = by_key.entry(k.clone()).or_default();
            *n += 1;
            if *n > 1 {
                r.key_overlap.fetch_add(1, Ordering::SeqCst);
            }
        }
        r.log.lock().unwrap().push(Mark::Start {
            index: tag.clone(),
            key: key.clone(),
        });
        let delay = args["delay_ms"].as_u64().unwrap_or(0);
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        let fail = args["fail"].as_str().unwrap_or_default().to_string();
        if fail == "hang" {
            std::future::pending::<()>().await;
        }
        r.log.lock().unwrap().push(Mark::End { index: tag.clone() });
        if let Some(k) = &key {
            *r.by_key.lock().unwrap().get_mut(k).unwrap() -= 1;
        }
        r.running.fetch_sub(1, Ordering::SeqCst);
        match fail.as_str() {
            "unknown" => Err(ToolError::unknown("connection reset after send")),
            "not_applied" => Err(ToolError::not_applied("connection refused")),
            "panic" => panic!("tool bug"),
            _ => Ok(Observation::json(json!({"tag": tag}))),
        }
    }
}

pub fn recorder_schema() -> Value {
    json!({"type": "object", "properties": {
        "tag": {"type": "string"},
        "delay_ms": {"type": "integer", "minimum": 0},
        "fail": {"type": "string"},
        "key": {"type": "string"}
    }, "required": ["tag"]})
}

/// A read, a write and a keyed write over one recorder.
pub fn recorder_kernel(rec: &Arc<Recorder>) -> KernelBuilder {
    use ring0_core::{ConcurrencyMark, Effect, Settlement, Strategy};
    let read = ToolSpec::read("read", "a read", recorder_schema());
    let write = ToolSpec::new("write", "an unkeyed write", recorder_schema())
        .effect(Effect::NonIdempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation]);
    let keyed = ToolSpec::new("keyed_write", "a keyed write", recorder_schema())
        .effect(Effect::Idempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation])
        .conflict_key("k:{key}");
    let par = ToolSpec::new(
        "parallel_write",
        "a write marked parallel",
        recorder_schema(),
    )
    .effect(Effect::Idempotent)
    .authority(Authority::A1)
    .strategy(&[Strategy::Neutral])
    .concurrency(ConcurrencyMark::Parallel)
    .conflict_key("k:{key}");
    let seq_read = ToolSpec::read(
        "sequential_read",
        "a read marked sequential",
        recorder_schema(),
    )
    .concurrency(ConcurrencyMark::Sequential);
    let idem = ToolSpec::new(
        "idem_write",
        "a write the provider deduplicates",
        recorder_schema(),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A2)
    .strategy(&[Strategy::Exploitation])
    .settlement(Settlement::IdempotencyKey);
    let t = || Arc::new(RecorderTool(rec.clone())) as Arc<dyn Tool>;
    Kernel::builder()
        .tool(read, t())
        .unwrap()
        .tool(write, t())
        .unwrap()
        .tool(keyed, t())
        .unwrap()
        .tool(par, t())
        .unwrap()
        .tool(seq_read, t())
        .unwrap()
        .tool(idem, t())
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A2)))
}

pub fn call(index: usize, tool: &str, args: Value) -> ProposedCall {
    ProposedCall {
        index,
        call_id: format!("call_{index}"),
        tool: tool.into(),
        arguments: ProposedArguments::Value(args),
        idempotency_key: None,
    }
}

pub fn round(calls: Vec<ProposedCall>) -> Round {
    Round { calls, text: None }
}
