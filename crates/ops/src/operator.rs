//! A person's settlement of calls the journal could not settle itself: `ring0 journal resolve`
//! and `ring0 journal compensate`, and the same actions from the running server's control
//! channel ([`crate::control`]).
//!
//! - [`resolve`]: a DEAD_LETTER (or UNKNOWN) intent is marked applied (ACKED: an identical retry
//!   is answered with the recorded receipt) or not applied (FAILED: an identical retry runs).
//! - [`compensate`]: the tool's declared compensating tool ([`ring0_core::ToolSpec::compensation`])
//!   is called with the compensated call's prepared arguments, as a call of its own through the
//!   kernel — prepared, authorized by the policy for the local principal, journaled, settled —
//!   and once it is ACKED the compensated intent ends COMPENSATED. The compensating call carries
//!   the idempotency key `compensate:<intent id>`, so asking twice (or again after a crash
//!   between the two steps) undoes the effect once.

use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{IntentState, Principal, ProposedArguments, ProposedCall, Round};
use ring0_journal::{IntentId, IntentRecord, Journal, PersonFinding};
use ring0_kernel::{Authorizer, Kernel, RoundOptions, SessionConfig};
use std::sync::Arc;

/// Longest note a person attaches to a settlement (recorded in the intent's timeline).
pub const NOTE_BYTES_MAX: usize = 1024;

/// The idempotency-key prefix of a compensating call: one compensation per intent.
pub const COMPENSATION_KEY_PREFIX: &str = "compensate:";

/// What a compensation did.
#[derive(Debug, Clone)]
pub struct Compensation {
    /// The compensated intent, now COMPENSATED.
    pub record: IntentRecord,
    /// The compensating tool.
    pub tool: String,
    /// The compensating call's own intent.
    pub intent: Option<String>,
    /// Whether the compensating call ran now (`false`: an earlier request ran it, and its
    /// recorded result was reused).
    pub ran_now: bool,
}

/// Parses an intent id as `ring0 journal ls` prints it.
pub fn parse_intent_id(text: &str) -> Result<IntentId, String> {
    IntentId::parse_str(text.trim())
        .map_err(|_| format!("{text:?} is not an intent id (`ring0 journal ls` lists them)"))
}

/// A person's note, checked against [`NOTE_BYTES_MAX`].
pub fn checked_note(note: &str) -> Result<&str, String> {
    if note.len() > NOTE_BYTES_MAX {
        return Err(format!(
            "the note is {} bytes; at most {NOTE_BYTES_MAX} are recorded",
            note.len()
        ));
    }
    Ok(note)
}

async fn load(journal: &dyn Journal, id: IntentId) -> Result<IntentRecord, String> {
    journal
        .get(id)
        .await
        .map_err(|e| format!("reading intent {id}: {e}"))?
        .ok_or_else(|| format!("no intent {id} in the journal"))
}

/// Marks a DEAD_LETTER or UNKNOWN intent applied or not applied.
pub async fn resolve(
    journal: &dyn Journal,
    id: IntentId,
    finding: PersonFinding,
    note: &str,
) -> Result<IntentRecord, String> {
    let note = checked_note(note)?;
    let record = load(journal, id).await?;
    ring0_journal::resolve_by_person(journal, &record, finding, note)
        .await
        .map_err(|e| e.to_string())
}

/// The compensating tool `kernel` knows for `record`'s tool, or why there is none.
fn compensating_tool(kernel: &Kernel, record: &IntentRecord) -> Result<String, String> {
    let registry = kernel.registry();
    let Some(spec) = registry.get(&record.tool).map(|t| &t.spec) else {
        return Err(format!(
            "the tool {} of intent {} is not among the tools served here; an upstream's \
             tool is compensated through a running `ring0 serve` with its upstream up (start \
             it and run this again)",
            record.tool, record.id
        ));
    };
    let Some(tool) = spec.compensation.clone() else {
        return Err(format!(
            "the tool {} declares no compensating tool (`compensation` in its \
             [upstreams.tools.NAME]); settle the intent with `ring0 journal resolve`",
            record.tool
        ));
    };
    if registry.get(&tool).is_none() {
        return Err(format!(
            "the compensating tool {tool} of {} is not served here (is its upstream up?)",
            record.tool
        ));
    }
    Ok(tool)
}

/// What the compensating call left: its own intent, and whether it ran now.
struct CompensatingCall {
    intent: Option<String>,
    ran_now: bool,
}

/// Runs `tool` with `record`'s prepared arguments as a round of its own for the local
/// principal, under the key `compensate:<intent>`; `Err` says why it did not complete (ACKED
/// with a result that is not an error).
async fn run_compensating_call(
    kernel: &Kernel,
    authorizer: Option<Arc<dyn Authorizer>>,
    record: &IntentRecord,
    tool: &str,
) -> Result<CompensatingCall, String> {
    let id = record.id;
    let arguments: serde_json::Value = serde_json::from_str(&record.canonical_args)
        .map_err(|e| format!("the recorded arguments of intent {id} do not parse: {e}"))?;
    let call = ProposedCall {
        index: 0,
        call_id: format!("compensate-{id}"),
        tool: tool.to_string(),
        arguments: ProposedArguments::Value(arguments),
        idempotency_key: Some(format!("{COMPENSATION_KEY_PREFIX}{id}")),
    };
    let mut config =
        SessionConfig::new(format!("{COMPENSATION_KEY_PREFIX}{id}")).principal(Principal::local());
    if let Some(authorizer) = authorizer {
        config = config.authorizer(authorizer);
    }
    let round = Round {
        calls: vec![call],
        text: None,
    };
    let outcome = kernel
        .open_session(config)
        .run_round(round, &RoundOptions::default())
        .await;
    let receipt = outcome
        .receipts
        .first()
        .ok_or("the kernel answered the compensating call with no receipt")?;
    let why = match (&receipt.outcome, receipt.state) {
        (CallOutcome::Completed { observation }, Some(IntentState::Acked))
            if !observation.is_error =>
        {
            outcome.delivered();
            return Ok(CompensatingCall {
                intent: receipt.intent_id.clone(),
                ran_now: receipt.disposition == Disposition::Dispatched,
            });
        }
        (CallOutcome::Completed { observation }, state) => format!(
            "{}: {}",
            state.map_or("not journaled".into(), |s| s.to_string()),
            ring0_core::text::truncate_utf8(&observation.text, NOTE_BYTES_MAX)
        ),
        (CallOutcome::Rejected { rejection }, _) => {
            format!("{}: {}", rejection.status.as_str(), rejection.message)
        }
        (other, _) => format!("{other:?}"),
    };
    Err(format!(
        "the compensating call {tool} did not complete ({why}); intent {id} stays {}",
        record.state
    ))
}

/// Undoes an ACKED, DEAD_LETTER or UNKNOWN intent's effect with its tool's compensating tool,
/// through `kernel` under `authorizer` (the serving generation's gate, or the policy), for
/// the local principal; then marks it COMPENSATED.
pub async fn compensate(
    kernel: &Kernel,
    authorizer: Option<Arc<dyn Authorizer>>,
    id: IntentId,
    note: &str,
) -> Result<Compensation, String> {
    let note = checked_note(note)?;
    let journal = kernel.journal().clone();
    let record = load(journal.as_ref(), id).await?;
    if !matches!(
        record.state,
        IntentState::Acked | IntentState::DeadLetter | IntentState::Unknown
    ) || !record.mutating
    {
        return Err(format!(
            "intent {id} is {}; only an ACKED, DEAD_LETTER or UNKNOWN write is compensated",
            record.state
        ));
    }
    let tool = compensating_tool(kernel, &record)?;
    let done = run_compensating_call(kernel, authorizer, &record, &tool).await?;
    let why = format!(
        "compensated by {tool}{}{}",
        done.intent
            .as_deref()
            .map(|i| format!(" (intent {i})"))
            .unwrap_or_default(),
        if note.is_empty() {
            String::new()
        } else {
            format!(": {note}")
        }
    );
    // The record may have moved while the compensating call ran (a settlement by another
    // hand): the compare-and-set below is made on what it is now.
    let current = load(journal.as_ref(), id).await?;
    let record = ring0_journal::compensate(journal.as_ref(), &current, None, &why)
        .await
        .map_err(|e| format!("the compensating call ran, but intent {id}: {e}"))?;
    Ok(Compensation {
        record,
        tool,
        intent: done.intent,
        ran_now: done.ran_now,
    })
}
