//! Which semantic keys and content digests may be in the key-index tables, so the writer probes
//! those tables only when they may hold an answer.
//!
//! Every new mutating proposal is looked up by key and by content. Most are new: the entries of
//! the batch and the in-memory map (see the `key_index` module) miss, and without a filter the
//! writer would run a SQL probe of both tables only to learn they miss too — measured with
//! `perf` during `cargo bench -p ring0-journal --bench commit`, about a quarter of the writer's
//! time deciding a proposal. A Bloom filter over the folded entries answers "certainly not
//! there" for almost all of them in a few memory reads.
//!
//! - It is built at open from the two tables (a scan of their keys, like the integrity check
//!   that already reads the whole file), and every fold adds its entries before it commits, so
//!   the filter never misses an entry the tables hold. A false positive only costs the probe.
//! - It grows as a scalable Bloom filter: when the newest filter holds its capacity, a new one
//!   twice as large takes the next entries, and a lookup asks them all. Nothing is ever
//!   rebuilt.
//! - Past [`FOLDED_FILTER_BYTES_MAX`], or if the tables hold something it cannot read, it gives
//!   up: it answers "may be there" for everything, and the writer probes as if it had none.
//!
//! The keys are SHA-256 digests, so the filter's hash functions are words of the digest itself
//! (made different for each filter). A model that grinds digests to fill it costs the journal
//! its probes back, nothing else. Written by hand: a Bloom filter over digests that are already
//! uniformly distributed is a few lines, smaller than any crate's general-purpose one.

use super::pending::ContentDigest;
use crate::limits::{FOLDED_FILTER_BYTES_MAX, FOLDED_FILTER_INITIAL_ENTRIES};
use ring0_core::SemanticKey;

/// Bits per entry (16): with three probes, about 0.5% false positives at capacity.
const BITS_PER_ENTRY: u64 = 16;
/// Bits set and tested per entry.
const PROBES: usize = 3;

/// One Bloom filter of a fixed capacity.
struct Bloom {
    bits: Vec<u64>,
    /// Bit count minus one (the bit count is a power of two).
    mask: u64,
    /// Entries it takes before the next filter opens.
    capacity: u64,
    len: u64,
    /// Makes this filter's bit positions independent of the other filters'.
    salt: u64,
}

impl Bloom {
    fn new(capacity: u64, salt: u64) -> Self {
        let bits = (capacity * BITS_PER_ENTRY).next_power_of_two().max(64);
        Self {
            bits: vec![0; (bits / 64) as usize],
            mask: bits - 1,
            capacity,
            len: 0,
            salt,
        }
    }

    fn bytes(&self) -> usize {
        self.bits.len() * 8
    }

    /// The bits of an entry: three of its digest's words, each a uniform 64-bit value already.
    fn positions(&self, words: [u64; 4]) -> [u64; PROBES] {
        std::array::from_fn(|i| (words[i] ^ self.salt) & self.mask)
    }

    fn insert(&mut self, words: [u64; 4]) {
        for p in self.positions(words) {
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
        }
        self.len += 1;
    }

    fn may_contain(&self, words: [u64; 4]) -> bool {
        self.positions(words)
            .iter()
            .all(|p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }
}

/// A scalable Bloom filter of one kind of key.
struct Scalable {
    filters: Vec<Bloom>,
    /// False once it gave up: everything may be there.
    usable: bool,
    /// Most bytes its filters may hold together.
    bytes_max: usize,
}

impl Scalable {
    /// A chain whose first filter takes `initial` entries, within `bytes_max`; one that gave up
    /// from the start if that filter alone would need more.
    fn new(initial: u64, bytes_max: usize) -> Self {
        let bits = initial.max(1).saturating_mul(BITS_PER_ENTRY);
        if bits / 8 > bytes_max as u64 {
            return Self {
                filters: Vec::new(),
                usable: false,
                bytes_max,
            };
        }
        Self {
            filters: vec![Bloom::new(initial.max(1), 0)],
            usable: true,
            bytes_max,
        }
    }

    fn bytes(&self) -> usize {
        self.filters.iter().map(Bloom::bytes).sum()
    }

    fn insert(&mut self, words: [u64; 4]) {
        if !self.usable {
            return;
        }
        let full = self.filters.last().is_none_or(|f| f.len >= f.capacity);
        if full {
            let capacity = self.filters.last().map_or(1, |f| f.capacity * 2);
            let next = Bloom::new(capacity, salt(self.filters.len()));
            if self.bytes() + next.bytes() > self.bytes_max {
                self.give_up();
                return;
            }
            self.filters.push(next);
        }
        if let Some(f) = self.filters.last_mut() {
            f.insert(words);
        }
    }

    fn may_contain(&self, words: [u64; 4]) -> bool {
        !self.usable || self.filters.iter().any(|f| f.may_contain(words))
    }

    fn give_up(&mut self) {
        self.usable = false;
        self.filters = Vec::new();
    }
}

/// A different constant per filter of a chain.
fn salt(n: usize) -> u64 {
    (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn words(bytes: &[u8; 32]) -> [u64; 4] {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    [word(0), word(1), word(2), word(3)]
}

fn key_words(key: &SemanticKey) -> [u64; 4] {
    // Two versions of a key with the same digest are different keys.
    let version = u64::from(key.version).wrapping_mul(0xff51_afd7_ed55_8ccd);
    words(&key.digest.0).map(|w| w ^ version)
}

/// The filter of the keys and contents folded into the key-index tables.
pub(crate) struct FoldedFilter {
    keys: Scalable,
    contents: Scalable,
}

impl FoldedFilter {
    /// An empty filter sized for `expected` entries of each kind (at least
    /// [`FOLDED_FILTER_INITIAL_ENTRIES`]).
    pub fn new(expected: u64) -> Self {
        let initial = expected.max(FOLDED_FILTER_INITIAL_ENTRIES as u64);
        // Each kind has half of the bound, so both together stay within it.
        let half = FOLDED_FILTER_BYTES_MAX / 2;
        Self {
            keys: Scalable::new(initial, half),
            contents: Scalable::new(initial, half),
        }
    }

    /// Records that an entry is (or is about to be) in the tables.
    pub fn insert(&mut self, key: &SemanticKey, content: &ContentDigest) {
        self.insert_key(key);
        self.insert_content(content);
    }

    pub fn insert_key(&mut self, key: &SemanticKey) {
        self.keys.insert(key_words(key));
    }

    pub fn insert_content(&mut self, content: &ContentDigest) {
        self.contents.insert(words(content));
    }

    /// False only when the tables certainly hold no entry for `key`.
    pub fn may_contain_key(&self, key: &SemanticKey) -> bool {
        self.keys.may_contain(key_words(key))
    }

    /// False only when the tables certainly hold no entry for `content`.
    pub fn may_contain_content(&self, content: &ContentDigest) -> bool {
        self.contents.may_contain(words(content))
    }

    /// Stops filtering: every lookup may be in the tables from now on.
    pub fn give_up(&mut self) {
        self.keys.give_up();
        self.contents.give_up();
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.keys.bytes() + self.contents.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring0_core::identity::Digest32;
    use sha2::{Digest, Sha256};

    fn digest(n: u64) -> [u8; 32] {
        Sha256::digest(n.to_be_bytes()).into()
    }

    fn key(n: u64, version: u32) -> SemanticKey {
        SemanticKey {
            version,
            digest: Digest32(digest(n)),
        }
    }

    #[test]
    fn everything_inserted_is_found_across_growth() {
        // A chain first sized for 64 entries, given 100 times that: it grows several filters
        // deep, and still finds every entry while new ones stay mostly absent.
        let mut f = Scalable::new(64, FOLDED_FILTER_BYTES_MAX);
        let n = 6_400;
        for i in 0..n {
            f.insert(words(&digest(i)));
        }
        assert!(f.filters.len() >= 6, "{} filters", f.filters.len());
        assert!((0..n).all(|i| f.may_contain(words(&digest(i)))));
        let absent = (n..2 * n)
            .filter(|&i| !f.may_contain(words(&digest(i))))
            .count();
        assert!(absent as f64 > 0.95 * n as f64, "{absent} of {n}");
    }

    #[test]
    fn keys_never_inserted_are_almost_all_answered_absent() {
        let n = FOLDED_FILTER_INITIAL_ENTRIES as u64;
        let mut f = FoldedFilter::new(0);
        for i in 0..n {
            f.insert(&key(i, 1), &digest(i));
        }
        let absent = (n..2 * n)
            .filter(|&i| !f.may_contain_key(&key(i, 1)))
            .count();
        assert!(absent as f64 > 0.98 * n as f64, "{absent} of {n}");
        // The same digest under another canonicalizer version is another key.
        let other_version = (0..n).filter(|&i| !f.may_contain_key(&key(i, 2))).count();
        assert!(
            other_version as f64 > 0.98 * n as f64,
            "{other_version} of {n}"
        );
    }

    #[test]
    fn a_chain_that_would_outgrow_its_memory_bound_gives_up_instead() {
        // Room for the first filter (64 entries: 128 bytes) and the next two, not the fourth.
        let bytes_max = 128 + 256 + 512 + 100;
        let mut f = Scalable::new(64, bytes_max);
        let mut inserted = 0;
        while f.usable {
            f.insert(words(&digest(inserted)));
            inserted += 1;
            assert!(f.bytes() <= bytes_max, "{} bytes", f.bytes());
        }
        assert_eq!(
            inserted,
            64 + 128 + 256 + 1,
            "it gives up at the entry that needs more"
        );
        assert_eq!(f.bytes(), 0);
        assert!(f.may_contain(words(&digest(10_000))));
    }

    #[test]
    fn both_kinds_together_stay_within_the_memory_bound() {
        let f = FoldedFilter::new(0);
        assert_eq!(
            f.keys.bytes_max + f.contents.bytes_max,
            FOLDED_FILTER_BYTES_MAX
        );
    }

    #[test]
    fn a_filter_too_large_for_its_memory_bound_is_never_built() {
        let f = FoldedFilter::new(u64::MAX);
        assert_eq!(f.bytes(), 0);
        assert!(f.may_contain_key(&key(1, 1)));
    }

    #[test]
    fn a_filter_that_gave_up_answers_that_everything_may_be_there() {
        let mut f = FoldedFilter::new(0);
        f.give_up();
        f.insert(&key(1, 1), &digest(1));
        assert!(f.may_contain_key(&key(2, 1)));
        assert!(f.may_contain_content(&digest(2)));
        assert_eq!(f.bytes(), 0);
    }
}
