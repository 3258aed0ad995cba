//! `ring0 turn --format openai|responses|anthropic < message.json`: every call of one model turn,
//! mediated; the tool-result message(s) printed in the same format.
//!
//! Each run is a new request. Once the results are written to standard output they count as
//! delivered, so feeding the same turn again runs its mutating calls again (a new attempt of
//! each, with its own provider idempotency key); a run that died before printing left its
//! results undelivered, and the next identical run is answered with them instead of acting
//! twice. A call with an explicit idempotency key is answered with its recorded result for as
//! long as the key is kept, whatever was delivered.

use crate::call_cmd::{SessionArgs, open, runtime};
use clap::Args;
use ring0_core::ProviderFormat;
use ring0_kernel::RoundOptions;
use serde_json::Value;
use std::io::{Read, Write};
use tracing::Instrument;

/// Largest turn read from standard input.
const TURN_BYTES_MAX: u64 = 16 * 1024 * 1024;

#[derive(Args)]
pub struct TurnArgs {
    #[command(flatten)]
    pub session: SessionArgs,
    /// The turn's format: openai (Chat Completions), responses (OpenAI Responses), anthropic.
    #[arg(long)]
    pub format: String,
    /// Attempt epoch (default 0): a host's own count of attempts, part of every call's
    /// identity. Not needed for repeats: a turn whose results were printed runs again when fed
    /// again.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
}

pub fn run(
    args: TurnArgs,
    state_dir: Option<&std::path::Path>,
    log: crate::LogOptions,
) -> Result<String, String> {
    let format = match ProviderFormat::parse_name(&args.format) {
        Some(
            f @ (ProviderFormat::OpenAiChat
            | ProviderFormat::OpenAiResponses
            | ProviderFormat::Anthropic),
        ) => f,
        _ => {
            return Err(format!(
                "--format {:?}: expected openai, responses or anthropic",
                args.format
            ));
        }
    };
    let mut text = String::new();
    std::io::stdin()
        .take(TURN_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("reading standard input: {e}"))?;
    if text.len() as u64 > TURN_BYTES_MAX {
        return Err(format!("the turn is larger than {TURN_BYTES_MAX} bytes"));
    }
    let turn: Value =
        serde_json::from_str(&text).map_err(|e| format!("standard input is not JSON: {e}"))?;
    let crate::call_cmd::Opened { built, telemetry } = open(&args.session, state_dir, log)?;
    let session = built.kernel.open_session(
        built
            .session_config(&args.session.scope)
            .attempt_epoch(args.epoch),
    );
    let rt = runtime()?;
    rt.block_on(crate::call_cmd::recover(&built.kernel))?;
    // One span for the turn, the parent of every call's stages.
    let span = tracing::info_span!(
        "ring0 turn",
        gen_ai.operation.name = "execute_tool",
        gen_ai.provider.format = args.format.as_str(),
        ring0.principal = "local",
    );
    let handled = rt.block_on(
        session
            .handle_turn(format, &turn, &RoundOptions::default())
            .instrument(span),
    );
    drop(rt);
    telemetry.shutdown();
    let out = handled.map_err(|e| e.to_string())?;
    if let Some(message) = &out.round.policy_message {
        tracing::warn!(target: "ring0", "{message}");
    }
    if let Some(t) = &out.round.terminated {
        tracing::warn!(target: "ring0", "the run must end: {t:?}");
    }
    let mut rendered = serde_json::to_string_pretty(&out.message).map_err(|e| e.to_string())?;
    rendered.push('\n');
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(rendered.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing the results: {e}"))?;
    // Written: the results reached the caller, so the same turn fed again is a new request.
    out.round.delivered();
    Ok(String::new())
}
