//! The mediation kernel: every tool call a model proposes passes through here.
//!
//! ```text
//! ingest → prepare → admit → plan → commit → approve → dispatch → settle → shape → project
//! ```
//!
//! A host builds a [`Kernel`] with its tools, opens a [`Session`] (scope, grants, execution
//! mode, limits) and hands it each model turn in any supported provider format. It gets back
//! the tool-result message in the same format, the canonical receipts, and events on
//! [`Session::subscribe`].
//!
//! Each call answered by a journal record comes back with a [`DeliveryTicket`]
//! ([`RoundOutcome::delivery`]): mark it once the result reached the caller, and an identical
//! call after that runs again; until then it is answered with that result (see [`delivery`]).
//!
//! This crate must never let a tool run except through the pipeline: nothing is dispatched before
//! every call of the round is prepared, nothing mutating is dispatched before it is committed to
//! the journal, and nothing a model or tool says grants authority.
//!
//! # Example
//!
//! ```
//! use ring0_core::{Authority, Observation, ProviderFormat, ToolSpec};
//! use ring0_kernel::{GrantTable, Kernel, RoundOptions, SessionConfig, tool_fn};
//! use serde_json::json;
//! use std::sync::Arc;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let weather = ToolSpec::read(
//!     "get_weather",
//!     "Current temperature of a city",
//!     json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
//! );
//! let kernel = Kernel::builder()
//!     .tool(weather, tool_fn(|_ctx, args| async move {
//!         Ok(Observation::json(json!({"city": args["city"], "celsius": 21})))
//!     }))
//!     .unwrap()
//!     .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
//!     .build();
//! let session = kernel.open_session(SessionConfig::new("user:42"));
//!
//! // An OpenAI Chat Completions assistant message with one good and one bad call.
//! let turn = json!({"role": "assistant", "tool_calls": [
//!     {"id": "call_1", "type": "function",
//!      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
//!     {"id": "call_2", "type": "function",
//!      "function": {"name": "get_weather", "arguments": "{\"town\":\"Oslo\"}"}}
//! ]});
//! let out = session
//!     .handle_turn(ProviderFormat::OpenAiChat, &turn, &RoundOptions::default())
//!     .await
//!     .unwrap();
//! let messages = out.message.as_array().unwrap();
//! assert_eq!(messages[0]["tool_call_id"], "call_1");
//! assert!(messages[0]["content"].as_str().unwrap().contains("\"celsius\":21"));
//! // The bad call comes back as a structured error the model can correct itself from.
//! let error: serde_json::Value =
//!     serde_json::from_str(messages[1]["content"].as_str().unwrap()).unwrap();
//! assert_eq!(error["status"], "validation_error");
//! let locs: Vec<&str> = error["errors"].as_array().unwrap().iter()
//!     .map(|e| e["loc"].as_str().unwrap()).collect();
//! assert!(locs.contains(&"/city") && locs.contains(&"/town"), "every error, not the first");
//! # });
//! ```

pub mod admit;
pub mod assemble;
pub mod catalog;
mod commit;
pub mod compat;
pub mod delivery;
mod dispatch;
pub mod events;
pub mod plan;
pub mod policy;
pub mod prepare;
pub mod project;
mod recover;
pub mod registry;
mod round;
pub mod scope;
mod session;
mod settle;
mod shape;
mod streaming;
pub mod tool;
pub mod trace;
pub mod traits;
pub mod validate;

pub use admit::{RepeatLimits, ToolChoice};
pub use delivery::DeliveryTicket;
pub use dispatch::SETTLE_REDISPATCH_MAX;
pub use events::{Event, EventObserver};
pub use plan::SchedulingMode;
pub use policy::{
    AuthAdmission, AuthDecision, AuthRequest, Authorizer, GrantTable, PolicyRewrite, SessionInfo,
};
pub use project::{ProjectionInput, Projector};
pub use registry::{RegistrationError, Registry};
pub use session::{
    IDEMPOTENCY_KEY_RETENTION_MS_DEFAULT, IN_FLIGHT_WAIT_MS_DEFAULT, Kernel, KernelBuilder,
    MAX_CONCURRENT_TOOLS_DEFAULT, RoundOptions, RoundOutcome, SECRET_VALUES_MAX, SPILL_READER_TOOL,
    SecretValuesError, Session, SessionConfig, Termination, ToolRefused, TurnOutcome,
};
pub use streaming::{LEDGER_TURNS_MAX, RoundIdentity, StreamNotice, StreamingRound};
pub use tool::{
    CallContext, CallExtensions, EventSink, FailureClass, OnCancel, ProbeFinding, Tool, ToolError,
    tool_fn,
};
