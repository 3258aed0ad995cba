//! Memoization of deterministic reads.
//!
//! A tool that is both `deterministic` and nullipotent gives the same observation for the same
//! prepared arguments, so within a TTL the journal may serve the stored observation instead of
//! running the tool again. The point is byte-identical observations: a model's prompt prefix
//! stays cache-friendly when a repeated read returns exactly the bytes it returned before.
//! Entries are keyed by [`ring0_core::Fingerprint`] (tool plus canonical prepared arguments).

use crate::limits::MEMO_OBSERVATION_BYTES_MAX;
use ring0_core::{Effect, Fingerprint, Observation, ToolSpec};

/// Whether a tool's observations may be memoized: deterministic and nullipotent, nothing else.
pub fn memoizable(spec: &ToolSpec) -> bool {
    spec.deterministic && spec.effect == Effect::Nullipotent
}

/// One stored observation, as the exact JSON text that was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoEntry {
    pub text: String,
    pub stored_ms: u64,
}

impl MemoEntry {
    /// `None` when the observation is too large to memoize (it is then simply not memoized).
    pub fn new(observation: &Observation, stored_ms: u64) -> Option<Self> {
        let text = serde_json::to_string(observation).ok()?;
        (text.len() <= MEMO_OBSERVATION_BYTES_MAX).then_some(Self { text, stored_ms })
    }

    /// The stored observation if it is younger than `max_age_ms`. A timestamp from the future
    /// (the clock went back) is not served: its age is unknown.
    pub fn serve(&self, now_ms: u64, max_age_ms: u64) -> Option<Observation> {
        fresh(self.stored_ms, now_ms, max_age_ms)
            .then(|| serde_json::from_str(&self.text).ok())
            .flatten()
    }
}

pub(crate) fn fresh(stored_ms: u64, now_ms: u64, max_age_ms: u64) -> bool {
    stored_ms <= now_ms && now_ms - stored_ms <= max_age_ms
}

/// The entry to evict first: the oldest, ties broken by fingerprint so eviction is deterministic.
pub(crate) fn oldest(entries: impl Iterator<Item = (Fingerprint, u64)>) -> Option<Fingerprint> {
    entries.min_by_key(|(fp, at)| (*at, *fp)).map(|(fp, _)| fp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_deterministic_nullipotent_tools_are_memoizable() {
        let schema = json!({"type": "object"});
        let read = ToolSpec::read("stat", "", schema.clone());
        assert!(!memoizable(&read));
        assert!(memoizable(&read.clone().deterministic(true)));
        let write = ToolSpec::new("put", "", schema).deterministic(true);
        assert!(!memoizable(&write));
    }

    #[test]
    fn entries_expire_after_their_ttl_and_never_serve_from_the_future() {
        let e = MemoEntry::new(&Observation::text("x"), 1_000).unwrap();
        assert_eq!(e.serve(1_500, 500), Some(Observation::text("x")));
        assert_eq!(e.serve(1_501, 500), None);
        assert_eq!(e.serve(999, 500), None);
    }

    #[test]
    fn oversized_observations_are_not_memoized() {
        let big = Observation::text("a".repeat(MEMO_OBSERVATION_BYTES_MAX));
        assert!(MemoEntry::new(&big, 0).is_none());
    }
}
