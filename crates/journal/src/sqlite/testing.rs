//! Helpers of this module's tests: proposals, journals opened with a chosen key-index tuning,
//! direct looks at the file, and the writer's batch run without its thread.

use super::SqliteJournal;
use super::SqliteOptions;
use super::files::Files;
use super::key_index::{IndexTuning, KeyIndex, Staged};
use super::requests::{Done, PreparedProposal, Proposed, WriteJob};
use super::schema::{configure_writer, migrate, open_connection};
use super::writer::{Gather, commit_batch};
use crate::clock::SystemClock;
use crate::memo::MemoEntry;
use crate::record::{Proposal, ProposeDecision};
use crate::{Journal, JournalError};
use futures::channel::oneshot;
use futures::executor::block_on;
use ring0_core::canonical::canonical_string;
use ring0_core::{Fingerprint, SemanticKey};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

/// A memo write: a request that needs no record.
pub(crate) fn request() -> WriteJob {
    let fingerprint = Fingerprint::compute("read", &serde_json::json!({})).unwrap();
    let entry = MemoEntry {
        text: "{}".into(),
        stored_ms: 0,
    };
    WriteJob::MemoPut(fingerprint, entry, oneshot::channel().0)
}

/// A mutating proposal of `refund(order n)`, under the current canonicalizer.
pub(crate) fn refund(n: u64, call_id: &str) -> Proposal {
    let args = serde_json::json!({"order": n, "amount": 5});
    Proposal {
        intent_id: None,
        semantic_key: SemanticKey::compute("refund", &args, "user:1", 0).unwrap(),
        scope: "user:1".into(),
        attempt_epoch: 0,
        tool: "refund".into(),
        canonical_args: canonical_string(&args).unwrap(),
        call_id: call_id.into(),
        mutating: true,
        client_key: None,
        principal: None,
    }
}

pub(crate) fn kind(d: &ProposeDecision) -> &'static str {
    d.kind()
}

/// Never folds while open; folds on a clean close unless `fold_on_close` is false.
pub(crate) fn no_idle_fold(fold_on_close: bool) -> IndexTuning {
    IndexTuning {
        fold_idle: None,
        fold_on_close,
        ..IndexTuning::default()
    }
}

pub(crate) fn open(path: &Path, tuning: IndexTuning) -> SqliteJournal {
    SqliteJournal::open_tuned(path, SqliteOptions::default(), tuning).unwrap()
}

/// Opens the journal at `path`, records the refunds of `orders` and closes it.
pub(crate) fn closed_with_refunds(path: &Path, tuning: IndexTuning, orders: std::ops::Range<u64>) {
    let j = open(path, tuning);
    for n in orders {
        block_on(j.propose(refund(n, "first"))).unwrap();
    }
}

/// Rows of the key-index table, read through a connection of its own.
pub(crate) fn indexed_keys(path: &Path) -> i64 {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.query_row("SELECT count(*) FROM intent_keys", [], |r| r.get(0))
        .unwrap()
}

/// The key-index watermark as committed, read through a connection of its own.
pub(crate) fn watermark(path: &Path) -> i64 {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.query_row("SELECT indexed_through FROM key_index_watermark", [], |r| {
        r.get(0)
    })
    .unwrap()
}

/// The writer's connection and key index, to run batches directly.
pub(crate) struct Writer {
    pub(crate) conn: Connection,
    pub(crate) files: Files,
    pub(crate) index: KeyIndex,
    pub(crate) staged: Staged,
}

impl Writer {
    pub(crate) fn open(path: &Path) -> Self {
        let files = Files::new(path);
        let conn = open_connection(&files, true).unwrap();
        configure_writer(&conn, &files, &SqliteOptions::default()).unwrap();
        migrate(&conn, &files).unwrap();
        let index = KeyIndex::load(&conn, &files, no_idle_fold(true)).unwrap();
        Self {
            conn,
            files,
            index,
            staged: Staged::default(),
        }
    }

    /// Decides the proposals as one batch and commits it.
    pub(crate) fn batch(
        &mut self,
        proposals: Vec<Proposal>,
    ) -> Vec<Result<&'static str, JournalError>> {
        let (_tx, rx) = mpsc::sync_channel(1);
        let mut batch: Vec<WriteJob> = proposals
            .into_iter()
            .map(|p| {
                WriteJob::Propose(
                    Arc::new(PreparedProposal::new(p, &SystemClock, 1)),
                    oneshot::channel().0,
                )
            })
            .collect();
        let (results, _) = commit_batch(
            &mut self.conn,
            &self.files,
            &SystemClock,
            1,
            &mut batch,
            &rx,
            Gather::after(0, Duration::ZERO),
            &mut self.index,
            &mut self.staged,
        );
        results
            .into_iter()
            .map(|r| {
                r.map(|done| match done {
                    Done::Decision(Proposed::Fresh) => "recorded",
                    Done::Decision(Proposed::Decided(d)) => kind(&d),
                    _ => unreachable!("a proposal decides"),
                })
            })
            .collect()
    }

    /// Makes the insert of any intent proposed with this call id fail: a job whose
    /// savepoint is rolled back (`ABORT`), or a whole batch that is (`ROLLBACK`).
    pub(crate) fn fail_inserts(&self, call_id: &str, how: &str) {
        self.conn
            .execute_batch(&format!(
                "CREATE TEMP TRIGGER fail_{call_id} BEFORE INSERT ON intents
                 WHEN NEW.call_ids LIKE '%\"{call_id}\"%'
                 BEGIN SELECT RAISE({how}, 'injected failure'); END;"
            ))
            .unwrap();
    }
}
