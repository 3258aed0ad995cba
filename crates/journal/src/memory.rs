//! An in-memory journal: the protocol without durability. For tests, the simulator and hosts that
//! accept losing the log with the process.
//!
//! It stores records and three indexes (id, semantic key, content digest) and leaves every
//! decision to the private `decide` module, the code the durable backend runs too. The indexes are derived
//! from the records alone ([`MemoryJournal::from_records`]), which is what P4 ("decisions from
//! the log alone") asks of a backend.

use crate::clock::{Clock, SystemClock};
use crate::decide::{self, Found, Write};
use crate::hold::{self, HOLDS_LISTED_MAX, HeldCall, HoldDecided, HoldState};
use crate::limits::{CLIENT_KEYS_PER_PRINCIPAL_MAX, MEMO_ENTRIES_MAX, RECENT_LIMIT_MAX};
use crate::memo::{self, MemoEntry};
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
use crate::{Journal, JournalError};
use async_trait::async_trait;
use ring0_core::{Fingerprint, Observation, SemanticKey};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::decide::decide_existing;

#[derive(Default)]
struct State {
    records: HashMap<IntentId, IntentRecord>,
    by_key: HashMap<SemanticKey, IntentId>,
    by_content: HashMap<String, IntentId>,
    /// Explicit idempotency keys: (principal, key) → the record they name.
    by_client_key: HashMap<(String, String), IntentId>,
    /// Per principal, its keys in the order they were bound (oldest first), for the bound.
    client_keys_order: HashMap<String, VecDeque<(String, IntentId)>>,
    order: Vec<IntentId>,
    memo: HashMap<Fingerprint, MemoEntry>,
    /// Held calls by approval id (see [`crate::hold`]).
    holds: HashMap<String, HeldCall>,
}

impl State {
    /// Binds a keyed record's key, forgetting the principal's oldest keys beyond the bound.
    fn bind_client_key(&mut self, record: &IntentRecord) {
        let Some(ck) = &record.client_key else {
            return;
        };
        let slot = (ck.principal.clone(), ck.key.clone());
        self.by_client_key.insert(slot, record.id);
        let order = self
            .client_keys_order
            .entry(ck.principal.clone())
            .or_default();
        order.push_back((ck.key.clone(), record.id));
        while order.len() > CLIENT_KEYS_PER_PRINCIPAL_MAX {
            let Some((key, id)) = order.pop_front() else {
                break;
            };
            let slot = (ck.principal.clone(), key);
            if self.by_client_key.get(&slot) == Some(&id) {
                self.by_client_key.remove(&slot);
            }
        }
    }

    fn store(&mut self, write: Write) {
        match write {
            Write::Insert(record) => {
                if record.mutating {
                    self.by_key.insert(record.semantic_key, record.id);
                    self.by_content
                        .insert(decide::record_content_digest(&record), record.id);
                    self.bind_client_key(&record);
                }
                self.order.push(record.id);
                self.records.insert(record.id, record);
            }
            Write::Update(record) => {
                self.records.insert(record.id, record);
            }
        }
    }
}

/// The journal in a mutex. Decisions are the same as the durable backend's.
pub struct MemoryJournal {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    incarnation: u64,
}

impl Default for MemoryJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryJournal {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            clock,
            incarnation: 1,
        }
    }

    /// Rebuilds a journal from its records alone (in insertion order), as a restart would.
    pub fn from_records(records: Vec<IntentRecord>, clock: Arc<dyn Clock>) -> Self {
        let mut journal = Self::with_clock(clock);
        journal.incarnation = decide::next_incarnation(records.iter());
        {
            let mut st = journal.lock();
            for record in records {
                st.store(Write::Insert(record));
            }
        }
        journal
    }

    /// Every record, in insertion order: the log a restart starts from.
    pub fn records(&self) -> Vec<IntentRecord> {
        let st = self.lock();
        st.order
            .iter()
            .filter_map(|id| st.records.get(id))
            .cloned()
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every write is one
        // map insertion of a fully built record.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Journal for MemoryJournal {
    async fn propose(&self, p: Proposal) -> Result<ProposeDecision, JournalError> {
        let mut st = self.lock();
        let by_id = p.intent_id.and_then(|id| st.records.get(&id));
        let (by_key, by_content) = if p.mutating {
            (
                st.by_key
                    .get(&p.semantic_key)
                    .and_then(|id| st.records.get(id)),
                st.by_content
                    .get(&decide::proposal_content_digest(&p))
                    .and_then(|id| st.records.get(id)),
            )
        } else {
            (None, None)
        };
        let by_client_key = p
            .client_key
            .as_ref()
            .filter(|_| p.mutating)
            .and_then(|ck| {
                st.by_client_key
                    .get(&(ck.principal.clone(), ck.key.clone()))
            })
            .and_then(|id| st.records.get(id));
        let found = Found {
            by_client_key,
            by_id,
            by_key,
            by_content,
        };
        // An id is drawn for every proposal the host names none for, used or not, as the SQLite
        // journal draws it before its writer decides: the same clock gives both the same ids.
        let id = p.intent_id.unwrap_or_else(|| self.clock.new_id());
        let now = self.clock.now_ms();
        let plan = decide::plan_propose(&p, found, now, self.incarnation, || {
            decide::new_record(&p, id, now, self.incarnation)
        })?;
        if let Some(write) = plan.write {
            st.store(write);
        }
        Ok(plan.decision)
    }

    async fn transition(&self, t: Transition) -> Result<IntentRecord, JournalError> {
        let mut st = self.lock();
        let record = st.records.get(&t.id).ok_or(JournalError::NotFound(t.id))?;
        let next = decide::plan_transition(record, &t, self.clock.now_ms(), self.incarnation)?;
        st.store(Write::Update(next.clone()));
        Ok(next)
    }

    fn mark_delivered(&self, id: IntentId) {
        if let Some(record) = self.lock().records.get_mut(&id) {
            record.delivered = true;
        }
    }

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError> {
        Ok(self.lock().records.get(&id).cloned())
    }

    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError> {
        let st = self.lock();
        Ok(st
            .by_key
            .get(key)
            .and_then(|id| st.records.get(id))
            .cloned())
    }

    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError> {
        let st = self.lock();
        Ok(st
            .order
            .iter()
            .filter_map(|id| st.records.get(id))
            .filter(|r| !r.state.is_terminal())
            .cloned()
            .collect())
    }

    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let st = self.lock();
        Ok(st
            .order
            .iter()
            .rev()
            .take(limit.min(RECENT_LIMIT_MAX))
            .filter_map(|id| st.records.get(id))
            .cloned()
            .collect())
    }

    async fn hold_put(&self, held: &HeldCall) -> Result<bool, JournalError> {
        self.lock()
            .holds
            .insert(held.approval_id.clone(), held.clone());
        Ok(true)
    }

    async fn hold_get(&self, approval_id: &str) -> Result<Option<HeldCall>, JournalError> {
        Ok(self.lock().holds.get(approval_id).cloned())
    }

    async fn holds_pending(&self) -> Result<Vec<HeldCall>, JournalError> {
        let mut pending: Vec<HeldCall> = self
            .lock()
            .holds
            .values()
            .filter(|h| h.state == HoldState::Pending)
            .cloned()
            .collect();
        pending.sort_by_key(|h| h.created_ms);
        pending.truncate(HOLDS_LISTED_MAX);
        Ok(pending)
    }

    async fn hold_decide(
        &self,
        approval_id: &str,
        state: HoldState,
    ) -> Result<HoldDecided, JournalError> {
        let now = self.clock.now_ms();
        let mut guard = self.lock();
        let Some(held) = guard.holds.get(approval_id).cloned() else {
            return Ok(HoldDecided::NotFound);
        };
        let outcome = hold::decide(held, state, now);
        if let Some(changed) = outcome.changed() {
            guard
                .holds
                .insert(changed.approval_id.clone(), changed.clone());
        }
        Ok(outcome)
    }

    fn incarnation(&self) -> Option<u64> {
        Some(self.incarnation)
    }

    async fn memo_get(
        &self,
        fingerprint: &Fingerprint,
        max_age_ms: u64,
    ) -> Result<Option<Observation>, JournalError> {
        let st = self.lock();
        Ok(st
            .memo
            .get(fingerprint)
            .and_then(|entry| entry.serve(self.clock.now_ms(), max_age_ms)))
    }

    async fn memo_put(
        &self,
        fingerprint: &Fingerprint,
        observation: &Observation,
    ) -> Result<bool, JournalError> {
        let Some(entry) = MemoEntry::new(observation, self.clock.now_ms()) else {
            return Ok(false);
        };
        let mut st = self.lock();
        if !st.memo.contains_key(fingerprint)
            && st.memo.len() >= MEMO_ENTRIES_MAX
            && let Some(oldest) = memo::oldest(st.memo.iter().map(|(fp, e)| (*fp, e.stored_ms)))
        {
            st.memo.remove(&oldest);
        }
        st.memo.insert(*fingerprint, entry);
        Ok(true)
    }
}
