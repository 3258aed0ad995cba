//! Where a journal gets time and fresh intent ids.
//!
//! Decisions never depend on the clock (only timestamps in timelines and memoization ages do), but
//! the simulator must be reproducible to the byte: it injects a [`ManualClock`] whose time moves
//! only when the simulation says so and whose ids come from a counter.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// A source of timestamps (milliseconds since the Unix epoch) and of new intent ids.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
    /// A fresh UUIDv7 (time-ordered).
    fn new_id(&self) -> Uuid;
}

/// Wall-clock time and random UUIDv7 ids: what a running host uses.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn new_id(&self) -> Uuid {
        Uuid::now_v7()
    }
}

/// A clock that moves only when told to, with ids drawn from a counter: deterministic.
#[derive(Debug, Default)]
pub struct ManualClock {
    state: Mutex<(u64, u64)>,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self {
            state: Mutex::new((start_ms, 0)),
        }
    }

    pub fn advance_ms(&self, ms: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = st.0.saturating_add(ms);
    }

    pub fn set_ms(&self, ms: u64) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 = ms;
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn new_id(&self) -> Uuid {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.1 += 1;
        let mut counter = [0u8; 10];
        counter[2..].copy_from_slice(&st.1.to_be_bytes());
        uuid::Builder::from_unix_timestamp_millis(st.0, &counter).into_uuid()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_ids_are_distinct_and_ordered() {
        let clock = ManualClock::new(1_000);
        let a = clock.new_id();
        let b = clock.new_id();
        clock.advance_ms(5);
        let c = clock.new_id();
        assert!(a < b && b < c);
        assert_eq!(a.get_version_num(), 7);
        assert_eq!(clock.now_ms(), 1_005);
    }

    #[test]
    fn manual_clocks_with_the_same_history_agree() {
        let (x, y) = (ManualClock::new(7), ManualClock::new(7));
        assert_eq!(x.new_id(), y.new_id());
    }
}
