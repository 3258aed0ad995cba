//! Property: over generated interleavings of calls with and without an idempotency key,
//! reconnects (a new session on the same scope, or on a new scope), dropped responses (a
//! delivery ticket never marked) and restarts (the SQLite journal closed, reopened and
//! recovered), the effects counted by the tool match a simple model of the rules:
//! - a keyed call has at most one effect, whatever scope or session retries it;
//! - a call without a key runs when it has no predecessor in its scope or its predecessor's
//!   result was delivered, and is answered with the predecessor's result otherwise;
//! - every call is answered (never an error), a replay with its predecessor's intent.

mod common;
use common::*;
use proptest::prelude::*;
use ring0_core::ProposedCall;
use ring0_core::receipt::Disposition;
use ring0_journal::{Journal, SqliteJournal};
use ring0_kernel::{Kernel, RoundOptions, SessionConfig};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Generated cases (each opens and reopens a SQLite journal).
const CASES: u32 = 64;
const SCOPES: [&str; 3] = ["conn-a", "conn-b", "conn-c"];

#[derive(Debug, Clone)]
enum Op {
    Call {
        intent: u8,
        keyed: bool,
        scope: usize,
        delivered: bool,
    },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, any::<bool>(), 0usize..SCOPES.len(), any::<bool>()).prop_map(
            |(intent, keyed, scope, delivered)| Op::Call { intent, keyed, scope, delivered }
        ),
        1 => Just(Op::Restart),
    ]
}

/// What the rules say, per logical call.
#[derive(Default)]
struct Model {
    /// Keyed calls that ran, with their intent.
    keyed: HashMap<u8, String>,
    /// Unkeyed calls by (scope, intent): the intent that answers the next retry, and whether
    /// its result was delivered.
    plain: HashMap<(usize, u8), (String, bool)>,
    /// Effects per tool tag.
    effects: HashMap<String, usize>,
}

fn tag(intent: u8, keyed: bool) -> String {
    format!("{}{intent}", if keyed { "k" } else { "u" })
}

fn open(path: &Path, rec: &Arc<Recorder>) -> Kernel {
    let journal: Arc<dyn Journal> = Arc::new(SqliteJournal::open(path).unwrap());
    recorder_kernel(rec).journal(journal).build()
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let rec = Recorder::new();
    let mut kernel = open(&path, &rec);
    let mut model = Model::default();
    for op in ops {
        let Op::Call {
            intent,
            keyed,
            scope,
            delivered,
        } = op
        else {
            drop(kernel);
            kernel = open(&path, &rec);
            kernel.recover().await.unwrap();
            continue;
        };
        let t = tag(intent, keyed);
        let c = ProposedCall {
            idempotency_key: keyed.then(|| format!("key-{intent}")),
            ..call(0, "write", json!({"tag": t}))
        };
        // Every call arrives on a session of its own: a reconnect, or an overlapping call.
        let out = kernel
            .open_session(SessionConfig::new(SCOPES[scope]))
            .run_round(round(vec![c]), &RoundOptions::default())
            .await;
        let receipt = &out.receipts[0];
        prop_assert!(!receipt.is_error(), "every call is answered: {receipt:?}");
        let id = receipt.intent_id.clone().unwrap();
        let before = if keyed {
            model.keyed.get(&intent).cloned()
        } else {
            match model.plain.get(&(scope, intent)) {
                Some((id, false)) => Some(id.clone()),
                _ => None,
            }
        };
        match before {
            Some(expected) => {
                prop_assert_eq!(receipt.disposition, Disposition::Replayed);
                prop_assert_eq!(&id, &expected);
            }
            None => {
                prop_assert_eq!(receipt.disposition, Disposition::Dispatched);
                *model.effects.entry(t.clone()).or_default() += 1;
            }
        }
        if keyed {
            model.keyed.insert(intent, id.clone());
        } else {
            model.plain.insert((scope, intent), (id.clone(), delivered));
        }
        if delivered {
            out.delivered();
        }
    }
    drop(kernel);
    let mut counted: HashMap<String, usize> = HashMap::new();
    for mark in rec.log() {
        if let Mark::Start { index, .. } = mark {
            *counted.entry(index).or_default() += 1;
        }
    }
    for intent in 0..3u8 {
        let keyed_effects = counted.get(&tag(intent, true)).copied().unwrap_or(0);
        prop_assert!(keyed_effects <= 1, "a key has at most one effect");
    }
    prop_assert_eq!(counted, model.effects);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn one_effect_per_logical_call_and_genuine_repeats_run(
        ops in proptest::collection::vec(op(), 1..16)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops))?;
    }
}
