//! A workspace in a temporary directory, the built-in tools in a kernel over it, and helpers to
//! call them as a model would.

#![allow(dead_code)]

use ring0_core::{Authority, ProviderFormat};
use ring0_kernel::{CallContext, GrantTable, Kernel, RoundOptions, Session, SessionConfig, Tool};
use ring0_tools::{ToolsConfig, Workspace, builtin_tools};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Env {
    pub dir: tempfile::TempDir,
    pub ws: PathBuf,
    pub session: Session,
    pub kernel: Kernel,
    calls: AtomicUsize,
}

pub fn config(ws: &Path, state: &Path) -> ToolsConfig {
    ToolsConfig::new(ws, state, vec![7u8; 32])
}

impl Env {
    /// An empty workspace `ws/` beside a `state/` directory, all tools granted up to A2.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        Self::with_workspace(dir, ws)
    }

    pub fn with_workspace(dir: tempfile::TempDir, ws: PathBuf) -> Self {
        let cfg = config(&ws, &dir.path().join("state"));
        Self::with_config(dir, ws, &cfg)
    }

    /// The tools as `cfg` configures them, over `ws`.
    pub fn with_config(dir: tempfile::TempDir, ws: PathBuf, cfg: &ToolsConfig) -> Self {
        let mut builder = Kernel::builder();
        for (spec, tool) in builtin_tools(cfg).unwrap() {
            builder = builder.tool(spec, tool).unwrap();
        }
        let kernel = builder
            .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A2)))
            .build();
        let session = kernel.open_session(SessionConfig::new("test"));
        Self {
            dir,
            ws,
            session,
            kernel,
            calls: AtomicUsize::new(0),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path(rel)).ok()
    }

    /// One call through the kernel (an Anthropic turn); returns (model-visible JSON, is_error).
    pub async fn call(&self, tool: &str, input: Value) -> (Value, bool) {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let turn = json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("toolu_{n}"), "name": tool, "input": input}
        ]});
        let out = self
            .session
            .handle_turn(ProviderFormat::Anthropic, &turn, &RoundOptions::default())
            .await
            .unwrap();
        let block = &out.message["content"][0];
        let is_error = block["is_error"].as_bool().unwrap_or(false);
        let text = match &block["content"] {
            Value::String(s) => s.clone(),
            other => other[0]["text"].as_str().unwrap_or_default().to_string(),
        };
        (
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            is_error,
        )
    }
}

/// The structured result of a completed call.
pub fn structured(result: &Value) -> &Value {
    &result["outcome"]["observation"]["structured"]
}

/// The text of a completed call.
pub fn text(result: &Value) -> &str {
    result["outcome"]["observation"]["text"]
        .as_str()
        .unwrap_or_default()
}

/// The failure message of a failed or rejected call.
pub fn failure(result: &Value) -> String {
    result["outcome"]["message"]
        .as_str()
        .or(result["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

pub fn ctx(scope: &str) -> CallContext {
    CallContext {
        call_id: "direct".into(),
        intent_id: None,
        idempotency_key: None,
        scope: Arc::from(scope),
        session: Arc::new(ring0_kernel::SessionInfo::detached(scope)),
        cancel: Default::default(),
        timeout_ms: 30_000,
        events: ring0_kernel::EventSink::detached(),
        extensions: Default::default(),
    }
}

pub fn workspace(ws: &Path, state: &Path) -> Arc<Workspace> {
    Arc::new(Workspace::open(&config(ws, state)).unwrap())
}

/// Calls an executor directly (no kernel), for tight loops.
pub async fn direct(tool: &dyn Tool, args: Value) -> Result<ring0_core::Observation, String> {
    tool.call(ctx("test"), args).await.map_err(|e| e.message)
}
