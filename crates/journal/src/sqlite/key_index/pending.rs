//! The key-index entries not yet folded into the tables: [`PendingIndex`], the writer's
//! in-memory log of them with a look-up map per key kind, and [`Staged`], the entries of the
//! batch being decided, which join it only once the batch commits.
//!
//! Both are plain data: the writer (see the parent module) decides when entries are pushed,
//! published and folded, and readers look keys up through a shared lock.

use ring0_core::SemanticKey;
use std::collections::{HashMap, VecDeque};

/// SHA-256 content digest of an intent (see `decide::content_digest`), as bytes.
pub(crate) type ContentDigest = [u8; 32];

/// One mutating intent's index entries: its row and the two keys it is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub seq: i64,
    pub key: SemanticKey,
    pub content: ContentDigest,
}

/// The index entries above the watermark, oldest first, with a lookup map per key kind.
#[derive(Debug, Default)]
pub(crate) struct PendingIndex {
    /// In `seq` order (intents are inserted with increasing `seq`): what to fold next.
    log: VecDeque<IndexEntry>,
    /// The latest pending `seq` per semantic key.
    by_key: HashMap<SemanticKey, i64>,
    /// The latest pending `seq` per content digest.
    by_content: HashMap<ContentDigest, i64>,
}

impl PendingIndex {
    /// An empty index with room for `cap` entries, so it never grows under load: growing a
    /// hash map rehashes every entry it holds at once, and the batch that triggered it would
    /// wait for tens of thousands of rehashes (a latency spike measured in milliseconds).
    /// Memory is reserved, not touched, until entries arrive.
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            log: VecDeque::with_capacity(cap),
            by_key: HashMap::with_capacity(cap),
            by_content: HashMap::with_capacity(cap),
        }
    }

    /// Pending intents (each with one key and one content entry).
    pub fn len(&self) -> usize {
        self.log.len()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    pub fn seq_of_key(&self, key: &SemanticKey) -> Option<i64> {
        self.by_key.get(key).copied()
    }

    pub fn seq_of_content(&self, content: &ContentDigest) -> Option<i64> {
        self.by_content.get(content).copied()
    }

    /// Adds the entry of an intent newer than every pending one; a key or content digest that
    /// was pending now names the newer intent (the last insert wins, as an upsert would).
    pub fn push(&mut self, entry: IndexEntry) {
        debug_assert!(self.log.back().is_none_or(|last| last.seq < entry.seq));
        self.by_key.insert(entry.key, entry.seq);
        self.by_content.insert(entry.content, entry.seq);
        self.log.push_back(entry);
    }

    /// The `n` oldest entries, to fold.
    pub fn oldest(&self, n: usize) -> Vec<IndexEntry> {
        self.log.iter().take(n).copied().collect()
    }

    /// The `seq` of the oldest entry after the first `n`: what the watermark must stay below
    /// once those `n` are folded.
    pub fn seq_after(&self, n: usize) -> Option<i64> {
        self.log.get(n).map(|e| e.seq)
    }

    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.log.clear();
        self.by_key.clear();
        self.by_content.clear();
    }

    /// Forgets the `n` oldest entries once they are committed to the SQL tables. A key or
    /// content digest is removed from its lookup map only if the map still names the folded
    /// intent: a newer pending intent with the same key keeps its entry.
    pub fn remove_oldest(&mut self, n: usize) {
        for entry in self.log.drain(..n.min(self.log.len())) {
            if self.by_key.get(&entry.key) == Some(&entry.seq) {
                self.by_key.remove(&entry.key);
            }
            if self.by_content.get(&entry.content) == Some(&entry.seq) {
                self.by_content.remove(&entry.content);
            }
        }
    }
}

/// The entries of the batch being decided: committed with it or not at all. A job's entry is
/// staged only once its savepoint is released, so a job rolled back leaves nothing here. The
/// same structure as the pending index, kept apart until the COMMIT succeeds.
#[derive(Debug, Default)]
pub(crate) struct Staged(PendingIndex);

impl Staged {
    pub fn push(&mut self, entry: IndexEntry) {
        self.0.push(entry);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn seq_of_key(&self, key: &SemanticKey) -> Option<i64> {
        self.0.seq_of_key(key)
    }

    pub fn seq_of_content(&self, content: &ContentDigest) -> Option<i64> {
        self.0.seq_of_content(content)
    }

    /// Moves the staged entries into `pending` (after the batch's COMMIT), oldest first.
    pub fn drain_into(&mut self, pending: &mut PendingIndex) {
        for entry in self.0.log.drain(..) {
            pending.push(entry);
        }
        self.0.clear();
    }

    /// Drops every staged entry (the batch did not commit).
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring0_core::identity::Digest32;

    fn entry(seq: i64, key: u8, content: u8) -> IndexEntry {
        IndexEntry {
            seq,
            key: SemanticKey {
                version: 1,
                digest: Digest32([key; 32]),
            },
            content: [content; 32],
        }
    }

    #[test]
    fn the_latest_pending_intent_of_a_key_is_the_one_found() {
        let mut p = PendingIndex::default();
        p.push(entry(1, 7, 1));
        p.push(entry(2, 7, 2));
        assert_eq!(p.seq_of_key(&entry(0, 7, 0).key), Some(2));
        assert_eq!(p.seq_of_content(&[1; 32]), Some(1));
    }

    #[test]
    fn folding_an_older_intent_keeps_a_newer_one_with_the_same_key() {
        let mut p = PendingIndex::default();
        p.push(entry(1, 7, 1));
        p.push(entry(2, 7, 2));
        p.remove_oldest(1);
        assert_eq!(p.seq_of_key(&entry(0, 7, 0).key), Some(2));
        assert_eq!(p.seq_of_content(&[1; 32]), None);
        assert_eq!(p.len(), 1);
        assert_eq!(p.seq_after(0), Some(2));
    }
}
