//! Journal reads: the calling principal's intents, as the journal recorded them.
//!
//! A host that lost a response, or wants to show what its agent did, reads the intents its
//! principal's calls made: each with its state, timeline, attempts and how its receipt ended.
//! Only records that name the caller as their principal are shown; a record of another
//! principal, or of none (written before principals were recorded), is answered as unknown,
//! the same answer as an id that does not exist.

use crate::Api;
use crate::error::{ApiError, ErrorKind};
use crate::routes::{journal_unavailable, principal};
use axum::Extension;
use axum::extract::{Path, State};
use ring0_core::receipt::{CallOutcome, TimelineEntry};
use ring0_core::{IntentState, Principal};
use ring0_journal::{IntentRecord, Journal};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Most intents one list answers with.
pub const INTENTS_LISTED_MAX: usize = 200;
/// Intents a list answers with when it names no `limit`.
pub const INTENTS_LISTED_DEFAULT: usize = 50;
/// Most recent journal records a list looks through for the caller's: older intents are read
/// by id (`GET /v1/intents/{id}`).
pub const INTENTS_SCANNED_MAX: usize = ring0_journal::limits::RECENT_LIMIT_MAX;
/// Timeline entries shown of one intent (its latest).
pub const TIMELINE_ENTRIES_MAX: usize = 64;
/// Longest note of a timeline entry shown, in bytes.
pub const TIMELINE_NOTE_BYTES_MAX: usize = 1024;
/// Longest tool name a list may filter by, in bytes.
pub const TOOL_FILTER_BYTES_MAX: usize = 256;
/// Largest receipt (as JSON) shown with one intent; a larger one is left out and said so.
pub const RECEIPT_BYTES_MAX: usize = 64 * 1024;

const _: () = assert!(INTENTS_LISTED_DEFAULT <= INTENTS_LISTED_MAX);
const _: () = assert!(INTENTS_LISTED_MAX <= INTENTS_SCANNED_MAX);

/// One step of an intent's life.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IntentStep {
    /// The state it entered (`RECORDED`, `DISPATCHED`, `ACKED`, …).
    pub state: String,
    /// When, in Unix milliseconds.
    pub at_ms: u64,
    /// Why, when the journal recorded a note (cut to 1024 bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How an intent's receipt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// The tool returned an observation (which may still report an error).
    Completed,
    /// The tool failed.
    Failed,
    /// The call was refused before anything ran.
    Rejected,
}

/// One intent, bounded: what it called, where it stands, how it ended.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IntentSummary {
    /// The intent's id.
    pub id: String,
    /// The tool it called.
    pub tool: String,
    /// The session scope it ran in.
    pub scope: String,
    /// Its state (`RECORDED`, `DISPATCHED`, `ACKED`, `FAILED`, `UNKNOWN`, …).
    pub state: String,
    /// Whether it may change the world.
    pub mutating: bool,
    /// Times it was dispatched.
    pub attempts: u32,
    /// When it was recorded (its first timeline entry), in Unix milliseconds.
    pub created_ms: u64,
    /// When it last changed, in Unix milliseconds.
    pub updated_ms: u64,
    /// Its latest steps, oldest first (at most 64).
    pub timeline: Vec<IntentStep>,
    /// Earlier steps left out of `timeline`.
    pub timeline_omitted: usize,
    /// How its receipt ended; absent while it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeKind>,
    /// Whether its receipt reports an error; absent while it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
}

/// The calling principal's intents, most recent first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IntentList {
    /// At most `limit` intents.
    pub intents: Vec<IntentSummary>,
}

/// One intent with its receipt.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IntentDetail {
    /// The intent.
    #[serde(flatten)]
    pub intent: IntentSummary,
    /// Its receipt as the journal stored it, when it has one of at most 65536 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Value>,
    /// It has a receipt larger than the bound, left out.
    pub receipt_omitted: bool,
}

/// The query of an intent list.
#[derive(Debug, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct IntentQuery {
    /// Only intents in this state (`ACKED`, `UNKNOWN`, …).
    pub state: Option<String>,
    /// Only intents of this tool (at most 256 bytes).
    pub tool: Option<String>,
    /// At most this many intents, 1 to 200. Default 50.
    pub limit: Option<usize>,
}

/// A checked intent query.
#[derive(Debug, PartialEq)]
struct IntentFilter {
    state: Option<IntentState>,
    tool: Option<String>,
    limit: usize,
}

impl IntentFilter {
    fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut filter = Self {
            state: None,
            tool: None,
            limit: INTENTS_LISTED_DEFAULT,
        };
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match key.as_ref() {
                "state" => {
                    let state =
                        serde_json::from_value(Value::String(value.to_string())).map_err(|_| {
                            ApiError::invalid(
                                "state",
                                format!("{value:?} is not an intent state (ACKED, UNKNOWN, …)"),
                            )
                        })?;
                    filter.state = Some(state);
                }
                "tool" if value.is_empty() || value.len() > TOOL_FILTER_BYTES_MAX => {
                    return Err(ApiError::invalid(
                        "tool",
                        format!("a tool name is 1 to {TOOL_FILTER_BYTES_MAX} bytes"),
                    ));
                }
                "tool" => filter.tool = Some(value.to_string()),
                "limit" => {
                    filter.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=INTENTS_LISTED_MAX).contains(n))
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "limit",
                                format!("{value:?} is not a number from 1 to {INTENTS_LISTED_MAX}"),
                            )
                        })?;
                }
                _ => {
                    return Err(ApiError::invalid(
                        "",
                        format!("unknown query parameter {key:?}; state, tool and limit are taken"),
                    ));
                }
            }
        }
        Ok(filter)
    }

    fn admits(&self, record: &IntentRecord) -> bool {
        self.state.is_none_or(|s| record.state == s)
            && self.tool.as_ref().is_none_or(|t| &record.tool == t)
    }
}

/// Whether `record` acted for `principal`. A record naming no principal is nobody's.
fn belongs_to(record: &IntentRecord, principal: &Principal) -> bool {
    let named = record
        .principal
        .as_deref()
        .or(record.client_key.as_ref().map(|k| k.principal.as_str()));
    named == Some(principal.id.as_str())
}

fn state_name(state: IntentState) -> String {
    match serde_json::to_value(state) {
        Ok(Value::String(name)) => name,
        _ => format!("{state:?}"),
    }
}

fn step(entry: &TimelineEntry) -> IntentStep {
    IntentStep {
        state: state_name(entry.state),
        at_ms: entry.at_ms,
        note: entry
            .note
            .as_deref()
            .map(|n| ring0_core::limits::clip_with_length(n, TIMELINE_NOTE_BYTES_MAX).into_owned()),
    }
}

fn summary(record: &IntentRecord) -> IntentSummary {
    let skipped = record.timeline.len().saturating_sub(TIMELINE_ENTRIES_MAX);
    let (outcome, is_error) = match &record.receipt {
        Some(receipt) => {
            let kind = match &receipt.outcome {
                CallOutcome::Completed { .. } => OutcomeKind::Completed,
                CallOutcome::Failed { .. } => OutcomeKind::Failed,
                CallOutcome::Rejected { .. } => OutcomeKind::Rejected,
            };
            (Some(kind), Some(receipt.outcome.is_error()))
        }
        None => (None, None),
    };
    IntentSummary {
        id: record.id.to_string(),
        tool: record.tool.clone(),
        scope: record.scope.clone(),
        state: state_name(record.state),
        mutating: record.mutating,
        attempts: record.attempts,
        created_ms: record.timeline.first().map_or(0, |e| e.at_ms),
        updated_ms: record.timeline.last().map_or(0, |e| e.at_ms),
        timeline: record.timeline[skipped..].iter().map(step).collect(),
        timeline_omitted: skipped,
        outcome,
        is_error,
    }
}

/// The calling principal's intents, most recent first, among the journal's latest records.
#[utoipa::path(get, path = "/v1/intents", tag = "journal",
    params(IntentQuery),
    responses(
        (status = 200, body = IntentList),
        (status = 422, body = ApiError), (status = 503, body = ApiError),
    ))]
pub(crate) async fn list_intents(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    uri: axum::http::Uri,
) -> Result<axum::Json<IntentList>, ApiError> {
    let principal = principal(who)?;
    let filter = IntentFilter::parse(uri.query())?;
    let journal: &dyn Journal = api.inner.parts.gateway.journal().as_ref();
    let records = journal
        .recent(INTENTS_SCANNED_MAX)
        .await
        .map_err(journal_unavailable)?;
    let intents = records
        .iter()
        .filter(|r| belongs_to(r, &principal) && filter.admits(r))
        .take(filter.limit)
        .map(summary)
        .collect();
    Ok(axum::Json(IntentList { intents }))
}

/// One of the calling principal's intents, with its timeline and receipt.
#[utoipa::path(get, path = "/v1/intents/{id}", tag = "journal",
    params(("id" = String, Path, description = "The intent's id")),
    responses(
        (status = 200, body = IntentDetail),
        (status = 404, body = ApiError), (status = 503, body = ApiError),
    ))]
pub(crate) async fn get_intent(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<axum::Json<IntentDetail>, ApiError> {
    let principal = principal(who)?;
    let unknown = || ApiError::new(ErrorKind::NotFound, format!("no intent {id:?} of yours"));
    let intent_id = ring0_journal::IntentId::parse_str(id.trim()).map_err(|_| unknown())?;
    let record = api
        .inner
        .parts
        .gateway
        .journal()
        .get(intent_id)
        .await
        .map_err(journal_unavailable)?
        .filter(|r| belongs_to(r, &principal))
        .ok_or_else(unknown)?;
    let receipt = record
        .receipt
        .as_ref()
        .and_then(|r| serde_json::to_value(r).ok());
    let fits = receipt
        .as_ref()
        .is_some_and(|r| r.to_string().len() <= RECEIPT_BYTES_MAX);
    Ok(axum::Json(IntentDetail {
        intent: summary(&record),
        receipt_omitted: receipt.is_some() && !fits,
        receipt: receipt.filter(|_| fits),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_query_takes_state_tool_and_a_bounded_limit_only() {
        let f = IntentFilter::parse(Some("state=ACKED&tool=wire_money&limit=3")).unwrap();
        assert_eq!(f.state, Some(IntentState::Acked));
        assert_eq!(f.tool.as_deref(), Some("wire_money"));
        assert_eq!(f.limit, 3);
        assert_eq!(
            IntentFilter::parse(None).unwrap().limit,
            INTENTS_LISTED_DEFAULT
        );
        for bad in [
            "state=acked",
            "limit=0",
            "limit=201",
            "limit=x",
            "tool=",
            "other=1",
        ] {
            let e = IntentFilter::parse(Some(bad)).unwrap_err();
            assert_eq!(e.status, ErrorKind::ValidationError, "{bad}");
        }
    }
}
