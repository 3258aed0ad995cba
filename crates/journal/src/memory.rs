//! An in-memory journal: the protocol without durability. For tests, benchmarks and hosts that
//! accept losing the log with the process.

use crate::machine;
use crate::record::{
    CALL_IDS_PER_RECORD_MAX, IntentId, IntentRecord, Proposal, ProposeDecision, Transition,
};
use crate::{Journal, JournalError};
use async_trait::async_trait;
use ring0_core::receipt::TimelineEntry;
use ring0_core::{IntentState, SemanticKey};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use uuid::Uuid;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Default)]
struct State {
    records: HashMap<IntentId, IntentRecord>,
    by_key: HashMap<SemanticKey, IntentId>,
    order: Vec<IntentId>,
}

/// The journal in a mutex. Decisions are the same as the durable backends'.
#[derive(Default)]
pub struct MemoryJournal {
    state: Mutex<State>,
}

impl MemoryJournal {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Decides a proposal against the record already holding its key (shared by every backend).
pub fn decide_existing(existing: &IntentRecord, proposal: &Proposal) -> Option<ProposeDecision> {
    use IntentState::*;
    if existing.semantic_key.version != proposal.semantic_key.version {
        return Some(ProposeDecision::Conflict {
            reason: format!(
                "canonicalizer version {} differs from recorded version {}",
                proposal.semantic_key.version, existing.semantic_key.version
            ),
            existing: Some(existing.clone()),
        });
    }
    match existing.state {
        Proposed | Recorded | Dispatched | Unknown | Reconciling => {
            Some(ProposeDecision::Duplicate(existing.clone()))
        }
        Acked => Some(ProposeDecision::Replay(existing.clone())),
        // Definitely not applied: a new proposal may record it again.
        Failed => None,
        Compensated => Some(ProposeDecision::Conflict {
            reason: "this intent was compensated; a new attempt needs a new epoch".into(),
            existing: Some(existing.clone()),
        }),
        DeadLetter => Some(ProposeDecision::Conflict {
            reason: "this intent awaits a person's settlement (DEAD_LETTER)".into(),
            existing: Some(existing.clone()),
        }),
        RejectedDuplicate | RejectedConflict => None,
    }
}

fn push_call_id(record: &mut IntentRecord, call_id: &str) {
    if record.call_ids.len() < CALL_IDS_PER_RECORD_MAX {
        record.call_ids.push(call_id.to_string());
    }
}

#[async_trait]
impl Journal for MemoryJournal {
    async fn propose(&self, p: Proposal) -> Result<ProposeDecision, JournalError> {
        let mut st = self.state.lock().expect("journal mutex");
        if let Some(id) = p.intent_id
            && let Some(existing) = st.records.get(&id)
            && existing.semantic_key != p.semantic_key
        {
            return Ok(ProposeDecision::Conflict {
                reason: format!(
                    "intent id {id} is bound to semantic key {}, not {}",
                    existing.semantic_key, p.semantic_key
                ),
                existing: Some(existing.clone()),
            });
        }
        if p.mutating
            && let Some(id) = st.by_key.get(&p.semantic_key).copied()
        {
            let existing = st.records.get_mut(&id).expect("indexed record exists");
            push_call_id(existing, &p.call_id);
            if let Some(decision) = decide_existing(existing, &p) {
                return Ok(decision);
            }
            if existing.state == IntentState::Failed {
                machine::check(existing.state, IntentState::Recorded)?;
                existing.state = IntentState::Recorded;
                existing.fence += 1;
                existing.receipt = None;
                existing.timeline.push(TimelineEntry {
                    state: IntentState::Recorded,
                    at_ms: now_ms(),
                    note: Some("re-proposed after a definite failure".into()),
                });
                return Ok(ProposeDecision::Recorded(existing.clone()));
            }
        }
        let id = p.intent_id.unwrap_or_else(Uuid::now_v7);
        let at = now_ms();
        let record = IntentRecord {
            id,
            idempotency_key: p.semantic_key.idempotency_key(p.attempt_epoch),
            semantic_key: p.semantic_key,
            scope: p.scope,
            attempt_epoch: p.attempt_epoch,
            tool: p.tool,
            canonical_args: p.canonical_args,
            call_ids: vec![p.call_id],
            mutating: p.mutating,
            fence: 1,
            attempts: 0,
            state: IntentState::Recorded,
            timeline: vec![
                TimelineEntry {
                    state: IntentState::Proposed,
                    at_ms: at,
                    note: None,
                },
                TimelineEntry {
                    state: IntentState::Recorded,
                    at_ms: at,
                    note: None,
                },
            ],
            receipt: None,
            snapshot: None,
        };
        if record.mutating {
            st.by_key.insert(record.semantic_key, id);
        }
        st.order.push(id);
        st.records.insert(id, record.clone());
        Ok(ProposeDecision::Recorded(record))
    }

    async fn transition(&self, t: Transition) -> Result<IntentRecord, JournalError> {
        let mut st = self.state.lock().expect("journal mutex");
        let record = st
            .records
            .get_mut(&t.id)
            .ok_or(JournalError::NotFound(t.id))?;
        if record.fence != t.expected_fence {
            return Err(JournalError::StaleFence {
                id: t.id,
                expected: t.expected_fence,
                actual: record.fence,
            });
        }
        machine::check(record.state, t.to)?;
        record.state = t.to;
        record.fence += 1;
        if t.to == IntentState::Dispatched {
            record.attempts += 1;
        }
        if t.receipt.is_some() {
            record.receipt = t.receipt;
        }
        if t.snapshot.is_some() {
            record.snapshot = t.snapshot;
        }
        record.timeline.push(TimelineEntry {
            state: t.to,
            at_ms: now_ms(),
            note: t.note,
        });
        Ok(record.clone())
    }

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError> {
        Ok(self
            .state
            .lock()
            .expect("journal mutex")
            .records
            .get(&id)
            .cloned())
    }

    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError> {
        let st = self.state.lock().expect("journal mutex");
        Ok(st
            .by_key
            .get(key)
            .and_then(|id| st.records.get(id))
            .cloned())
    }

    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError> {
        let st = self.state.lock().expect("journal mutex");
        Ok(st
            .order
            .iter()
            .filter_map(|id| st.records.get(id))
            .filter(|r| !r.state.is_terminal())
            .cloned()
            .collect())
    }

    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let st = self.state.lock().expect("journal mutex");
        Ok(st
            .order
            .iter()
            .rev()
            .take(limit)
            .filter_map(|id| st.records.get(id))
            .cloned()
            .collect())
    }
}
