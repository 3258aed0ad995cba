//! Scope state: the rules every session of one (principal, scope) shares.
//!
//! A host may open several kernel sessions for one conversation: an MCP connection opens one per
//! overlapping call, a reconnect opens a new one under the same scope. The rules that span a
//! conversation's calls live here, keyed by (principal id, scope), so they hold whichever session
//! a call arrives on:
//! - the exact-repeat guard (consecutive identical calls, counted per scope);
//! - equal conflict keys of concurrent rounds run one after the other ([`ScopeState::serialize`]);
//! - a write whose outcome stayed unknown blocks later writes with its conflict key, or every
//!   later write when it has none, until the journal says it settled ([`ScopeState::blocker`]).
//!
//! The registry is bounded: at most [`SCOPES_MAX`] scopes, and a scope no session holds is
//! forgotten once idle for [`SCOPE_IDLE_MS`] (or sooner when the registry is full, least recently
//! used first). A host needs no API for any of it: sessions opened with the same principal and
//! scope share one state.

use crate::admit::{RepeatGuard, RepeatLimits};
use ring0_journal::{IntentId, Journal};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most scopes whose state the kernel keeps at once (4096).
pub const SCOPES_MAX: usize = 4096;
/// A scope no session holds is forgotten after this long without a session opened on it (1 h).
pub const SCOPE_IDLE_MS: u64 = 60 * 60 * 1000;
/// Most unsettled writes one scope remembers (1024); beyond it a new one blocks every write of
/// the scope, as an unkeyed one does (fail closed).
pub const UNSETTLED_PER_SCOPE_MAX: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is a whole-value operation: a panic elsewhere cannot leave
    // one half-made.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes of one scope whose outcome is unknown, by conflict key.
#[derive(Default)]
struct Unsettled {
    keyed: HashMap<String, IntentId>,
    unkeyed: Vec<IntentId>,
}

impl Unsettled {
    fn len(&self) -> usize {
        self.keyed.len() + self.unkeyed.len()
    }

    /// The writes that block a write with this conflict key.
    fn blocking(&self, key: Option<&str>) -> Vec<IntentId> {
        let mut ids = self.unkeyed.clone();
        if let Some(id) = key.and_then(|k| self.keyed.get(k)) {
            ids.push(*id);
        }
        ids
    }

    fn forget(&mut self, id: IntentId) {
        self.unkeyed.retain(|u| *u != id);
        self.keyed.retain(|_, u| *u != id);
    }
}

/// What every session of one (principal, scope) shares.
pub(crate) struct ScopeState {
    pub(crate) repeat: Mutex<RepeatGuard>,
    key_turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    unsettled: Mutex<Unsettled>,
}

/// The turn of one conflict key in its scope: held while the call commits, runs and settles.
pub(crate) struct KeyTurn<'a> {
    scope: &'a ScopeState,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut turns = lock(&self.scope.key_turns);
        // Only the map holds it: nobody runs or waits with this key, so it can go.
        if turns
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            turns.remove(&self.key);
        }
    }
}

impl ScopeState {
    fn new(limits: RepeatLimits) -> Self {
        Self {
            repeat: Mutex::new(RepeatGuard::new(limits)),
            key_turns: Mutex::new(HashMap::new()),
            unsettled: Mutex::new(Unsettled::default()),
        }
    }

    pub(crate) fn repeat(&self) -> MutexGuard<'_, RepeatGuard> {
        lock(&self.repeat)
    }

    /// Waits for this conflict key's turn in the scope: calls with equal keys, from any round of
    /// any session of the scope, run one after another.
    pub(crate) async fn serialize(&self, key: &str) -> KeyTurn<'_> {
        let mutex = lock(&self.key_turns)
            .entry(key.to_string())
            .or_default()
            .clone();
        let guard = mutex.lock_owned().await;
        KeyTurn {
            scope: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }

    /// Remembers a write whose outcome stayed unknown: it blocks later writes with its key (or
    /// every later write without one) until it settles.
    pub(crate) fn note_unsettled(&self, key: Option<&str>, id: IntentId) {
        let mut u = lock(&self.unsettled);
        match key {
            Some(k) if u.len() < UNSETTLED_PER_SCOPE_MAX => {
                u.keyed.insert(k.to_string(), id);
            }
            _ => {
                if !u.unkeyed.contains(&id) {
                    u.unkeyed.push(id);
                }
            }
        }
    }

    /// The unsettled write that blocks a write with this conflict key, if any. A remembered
    /// write the journal says has settled is forgotten; one the journal cannot be asked about
    /// still blocks (fail closed).
    pub(crate) async fn blocker(
        &self,
        journal: &dyn Journal,
        key: Option<&str>,
    ) -> Option<IntentId> {
        let candidates = lock(&self.unsettled).blocking(key);
        for id in candidates {
            match journal.get(id).await {
                Ok(Some(record)) if !record.state.is_uncertain() => {
                    lock(&self.unsettled).forget(id);
                }
                Ok(None) => lock(&self.unsettled).forget(id),
                _ => return Some(id),
            }
        }
        None
    }
}

struct Entry {
    state: Arc<ScopeState>,
    last_opened: Instant,
}

/// The kernel's scopes, by (principal id, scope).
#[derive(Default)]
pub(crate) struct ScopeRegistry {
    scopes: Mutex<HashMap<(String, String), Entry>>,
}

impl ScopeRegistry {
    /// The state of (principal, scope), shared with every other session open on it.
    pub(crate) fn open(
        &self,
        principal: &str,
        scope: &str,
        limits: RepeatLimits,
    ) -> Arc<ScopeState> {
        let mut scopes = lock(&self.scopes);
        let now = Instant::now();
        let slot = (principal.to_string(), scope.to_string());
        if let Some(entry) = scopes.get_mut(&slot) {
            entry.last_opened = now;
            return entry.state.clone();
        }
        if scopes.len() >= SCOPES_MAX {
            let idle = Duration::from_millis(SCOPE_IDLE_MS);
            scopes.retain(|_, e| Arc::strong_count(&e.state) > 1 || now - e.last_opened < idle);
        }
        if scopes.len() >= SCOPES_MAX {
            // Still full: forget the least recently opened scope no session holds.
            let unheld = scopes
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.state) == 1)
                .min_by_key(|(_, e)| e.last_opened)
                .map(|(k, _)| k.clone());
            if let Some(k) = unheld {
                scopes.remove(&k);
            }
        }
        let state = Arc::new(ScopeState::new(limits));
        if scopes.len() < SCOPES_MAX {
            scopes.insert(
                slot,
                Entry {
                    state: state.clone(),
                    last_opened: now,
                },
            );
        }
        // Every slot is held by a live session: this one gets a state of its own.
        state
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.scopes).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_of_one_principal_and_scope_share_state_and_others_do_not() {
        let r = ScopeRegistry::default();
        let a = r.open("alice", "s", RepeatLimits::default());
        let b = r.open("alice", "s", RepeatLimits::default());
        let c = r.open("bob", "s", RepeatLimits::default());
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn a_full_registry_forgets_a_scope_no_session_holds() {
        let r = ScopeRegistry::default();
        let held = r.open("p", "held", RepeatLimits::default());
        for n in 0..SCOPES_MAX + 10 {
            drop(r.open("p", &format!("s{n}"), RepeatLimits::default()));
        }
        assert!(r.len() <= SCOPES_MAX);
        assert!(Arc::ptr_eq(
            &held,
            &r.open("p", "held", RepeatLimits::default())
        ));
    }
}
