//! Helpers shared by the journal's integration tests.
#![allow(dead_code)]

use ring0_core::{SemanticKey, canonical::canonical_string};
use ring0_journal::{
    Clock, Journal, ManualClock, MemoryJournal, Proposal, SqliteJournal, SqliteOptions,
};
use serde_json::{Value, json};
use std::sync::Arc;

/// A proposal of `tool(args)` in `scope`, epoch 0, mutating, with a given call id.
pub fn proposal(tool: &str, args: Value, scope: &str, call_id: &str) -> Proposal {
    Proposal {
        intent_id: None,
        semantic_key: SemanticKey::compute(tool, &args, scope, 0).unwrap(),
        scope: scope.into(),
        attempt_epoch: 0,
        tool: tool.into(),
        canonical_args: canonical_string(&args).unwrap(),
        call_id: call_id.into(),
        mutating: true,
        client_key: None,
    }
}

pub fn refund(amount: u64, call_id: &str) -> Proposal {
    proposal(
        "refund",
        json!({"order": "o-1", "amount": amount}),
        "user:42:checkout:7",
        call_id,
    )
}

/// A journal under test, on either backend, that can be dropped and reopened from its log.
pub struct Backend {
    pub journal: Arc<dyn Journal>,
    pub clock: Arc<ManualClock>,
    dir: Option<tempfile::TempDir>,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Memory,
    Sqlite,
}

impl Backend {
    pub fn memory() -> Self {
        let clock = Arc::new(ManualClock::new(1_000_000));
        Self {
            journal: Arc::new(MemoryJournal::with_clock(clock.clone())),
            clock,
            dir: None,
            kind: Kind::Memory,
        }
    }

    pub fn sqlite() -> Self {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let dir = tempfile::tempdir().unwrap();
        let journal = SqliteJournal::open_with(dir.path().join("j.db"), options(&clock)).unwrap();
        Self {
            journal: Arc::new(journal),
            clock,
            dir: Some(dir),
            kind: Kind::Sqlite,
        }
    }

    /// Drops every in-memory structure and opens the journal again from its log alone.
    pub async fn reopen(&mut self) {
        match self.kind {
            Kind::Memory => {
                let records = {
                    let j = self.journal.clone();
                    let mut all = j.recent(usize::MAX).await.unwrap();
                    all.reverse();
                    all
                };
                self.journal = Arc::new(MemoryJournal::from_records(records, self.clock.clone()));
            }
            Kind::Sqlite => {
                let path = self.dir.as_ref().unwrap().path().join("j.db");
                // Drop the old handle first: it holds the write lock.
                self.journal = Arc::new(MemoryJournal::new());
                self.journal =
                    Arc::new(SqliteJournal::open_with(path, options(&self.clock)).unwrap());
            }
        }
    }
}

pub fn options(clock: &Arc<ManualClock>) -> SqliteOptions {
    SqliteOptions {
        clock: clock.clone() as Arc<dyn Clock>,
        ..SqliteOptions::default()
    }
}

/// Generates one test per backend for each async behaviour `fn name(b: &mut Backend)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $name() {
                futures::executor::block_on(super::$name(&mut super::common::Backend::memory()))
            })*
        }
        mod sqlite {
            $(#[test]
            fn $name() {
                futures::executor::block_on(super::$name(&mut super::common::Backend::sqlite()))
            })*
        }
    };
}
