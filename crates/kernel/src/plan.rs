//! Plan: accepted calls become ordered execution epochs.
//!
//! - `Sequential`: every call is its own epoch.
//! - `SafeParallel`: consecutive read-only calls and tools marked `Parallel` share an epoch;
//!   any other write is a barrier.
//! - `Parallel`: consecutive calls share an epoch unless a tool is marked `Sequential`.
//!
//! A barrier waits for everything before it and runs alone; calls after it may overlap again.
//! Inside an epoch, `max_concurrent_tools` and conflict keys still apply (see `dispatch`).

use ring0_core::{ConcurrencyMark, Effect};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulingMode {
    Sequential,
    #[default]
    SafeParallel,
    Parallel,
}

/// A group of calls that may overlap. `calls` are positions in the planned slice, in source order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    pub calls: Vec<usize>,
    pub barrier: bool,
}

fn overlaps(mode: SchedulingMode, effect: Effect, mark: ConcurrencyMark) -> bool {
    match (mode, mark) {
        (_, ConcurrencyMark::Sequential) | (SchedulingMode::Sequential, _) => false,
        (_, ConcurrencyMark::Parallel) | (SchedulingMode::Parallel, _) => true,
        (SchedulingMode::SafeParallel, ConcurrencyMark::Default) => effect.is_read_only(),
    }
}

/// Splits calls, given in source order as `(effect, mark)`, into epochs.
pub fn plan(mode: SchedulingMode, calls: &[(Effect, ConcurrencyMark)]) -> Vec<Epoch> {
    let mut epochs: Vec<Epoch> = Vec::new();
    for (pos, &(effect, mark)) in calls.iter().enumerate() {
        if overlaps(mode, effect, mark) {
            match epochs.last_mut() {
                Some(open) if !open.barrier => open.calls.push(pos),
                _ => epochs.push(Epoch {
                    calls: vec![pos],
                    barrier: false,
                }),
            }
        } else {
            epochs.push(Epoch {
                calls: vec![pos],
                barrier: true,
            });
        }
    }
    epochs
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConcurrencyMark::*;
    use Effect::*;

    fn shape(epochs: &[Epoch]) -> Vec<(Vec<usize>, bool)> {
        epochs
            .iter()
            .map(|e| (e.calls.clone(), e.barrier))
            .collect()
    }

    #[test]
    fn safe_parallel_overlaps_reads_and_makes_writes_barriers() {
        let calls = [
            (Nullipotent, Default),
            (Nullipotent, Default),
            (Idempotent, Default),
            (Nullipotent, Default),
        ];
        assert_eq!(
            shape(&plan(SchedulingMode::SafeParallel, &calls)),
            vec![(vec![0, 1], false), (vec![2], true), (vec![3], false)]
        );
    }

    #[test]
    fn safe_parallel_lets_writes_marked_parallel_overlap() {
        let calls = [(Nullipotent, Default), (NonIdempotent, Parallel)];
        assert_eq!(
            shape(&plan(SchedulingMode::SafeParallel, &calls)),
            vec![(vec![0, 1], false)]
        );
    }

    #[test]
    fn sequential_mode_gives_every_call_its_own_epoch() {
        let calls = [(Nullipotent, Parallel), (Nullipotent, Default)];
        assert_eq!(
            shape(&plan(SchedulingMode::Sequential, &calls)),
            vec![(vec![0], true), (vec![1], true)]
        );
    }

    #[test]
    fn parallel_mode_overlaps_everything_but_sequential_marks() {
        let calls = [
            (NonIdempotent, Default),
            (Idempotent, Default),
            (Nullipotent, Sequential),
            (Idempotent, Default),
        ];
        assert_eq!(
            shape(&plan(SchedulingMode::Parallel, &calls)),
            vec![(vec![0, 1], false), (vec![2], true), (vec![3], false)]
        );
    }
}
