//! Durable approvals: a held call is recorded in the journal before anyone is asked, decided
//! there once, and released after a restart.
//!
//! - [`DurableApprover`] wraps the server's other channels (the MCP client, `ring0 approve`):
//!   it records the held call ([`ring0_journal::HeldCall`], with its principal, tool, arguments'
//!   fingerprint, deadline and the channels it is offered on), offers it to the webhook, and
//!   waits for the first decision — a channel's answer, or a decision made on the journal's
//!   record (a webhook link). Either way the record is decided once; a channel that answers
//!   after another decided is overruled by the record.
//!   The wait for a decision made on the record is the journal's ([`Journal::hold_wait`]): a
//!   shared (PostgreSQL) journal tells the replica whose call waits when any replica decided
//!   it, so an approval given through one replica releases the call parked on another.
//! - [`HeldWatcher`]: the held calls an earlier process left PENDING whose intents this process
//!   took for recovery (their intents stay RECORDED: recovery leaves a held intent alone) are
//!   watched until decided: approved → the intent is dispatched
//!   ([`ring0_kernel::Kernel::release_held`], once, by the journal's fence), denied or lapsed →
//!   it is settled REJECTED_CONFLICT, nothing sent. At start; and on a shared journal after
//!   every recovery pass, since a replica that died leaves its held calls to whichever replica
//!   takes its intents once its lease lapsed (a live replica's held calls are never adopted).

use crate::webhook::Webhook;
use async_trait::async_trait;
use ring0_journal::{HeldCall, HoldDecided, HoldState, IntentRecord, Journal};
use ring0_kernel::CallExtensions;
use ring0_mcp::Gateway;
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver};
use std::sync::Arc;
use std::time::Duration;

/// How often the watcher reads the held calls it watches for a decision. A person's answer is
/// not latency sensitive.
pub const HOLD_POLL_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The server's approver: the other channels, with the held call recorded in the journal and
/// offered to the webhook.
pub struct DurableApprover {
    channels: Arc<dyn Approver>,
    /// The journal and the webhook, attached once the kernel (which takes this approver) has
    /// opened the journal: until then a held call is asked through `channels` alone.
    durable: std::sync::OnceLock<Durable>,
    log: ring0_mcp::Log,
}

struct Durable {
    journal: Arc<dyn Journal>,
    webhook: Option<Arc<Webhook>>,
}

impl DurableApprover {
    /// `channels` asks the client and the terminal.
    pub fn new(channels: Arc<dyn Approver>, log: ring0_mcp::Log) -> Self {
        Self {
            channels,
            durable: std::sync::OnceLock::new(),
            log,
        }
    }

    /// Records held calls in `journal` from now on, and offers them to `webhook` when one is
    /// configured. Attached once; a second call changes nothing.
    pub fn attach(&self, journal: Arc<dyn Journal>, webhook: Option<Arc<Webhook>>) {
        let _ = self.durable.set(Durable { journal, webhook });
    }

    fn held_call(&self, durable: &Durable, request: &ApprovalRequest) -> HeldCall {
        let mut channels = vec!["client".to_string(), "terminal".to_string()];
        if durable.webhook.is_some() {
            channels.push("webhook".into());
        }
        HeldCall {
            approval_id: request.id.clone(),
            tool: request.tool.clone(),
            scope: request.scope.clone(),
            call_id: request.call_id.clone(),
            principal: request.principal.clone(),
            args_hash: request.args_hash.clone(),
            summary: ring0_core::text::truncate_utf8(
                &request.summary,
                ring0_journal::hold::HOLD_SUMMARY_BYTES_MAX,
            )
            .to_string(),
            arguments: serde_json::to_string(&request.args)
                .ok()
                .filter(|text| text.len() <= ring0_journal::hold::HOLD_ARGS_BYTES_MAX)
                .map(|_| request.args.clone()),
            channels,
            remember: request.remember.clone(),
            created_ms: request.created_at_ms,
            deadline_ms: request.deadline_ms,
            incarnation: durable.journal.incarnation().unwrap_or(0),
            state: HoldState::Pending,
            decided_ms: None,
        }
    }

    /// Records a channel's answer on the held call; when another decision came first, that one
    /// stands.
    async fn settle_with(
        &self,
        journal: &dyn Journal,
        request: &ApprovalRequest,
        answer: ApprovalOutcome,
    ) -> ApprovalOutcome {
        let state = match &answer {
            ApprovalOutcome::Approved { .. } | ApprovalOutcome::ApprovedForSession { .. } => {
                HoldState::Approved {
                    by: "client or terminal".into(),
                    for_session: matches!(answer, ApprovalOutcome::ApprovedForSession { .. }),
                }
            }
            ApprovalOutcome::Denied { reason } => HoldState::Denied {
                by: "client or terminal".into(),
                reason: reason.clone(),
            },
            ApprovalOutcome::TimedOut => HoldState::Expired {
                why: "no answer before its deadline".into(),
            },
            ApprovalOutcome::Pending { .. } => HoldState::Expired {
                why: "answered with a confirmation code for the model to send again".into(),
            },
        };
        match journal.hold_decide(&request.id, state).await {
            Ok(HoldDecided::AlreadyDecided(held)) => outcome_of(&held, request),
            Ok(HoldDecided::Lapsed(_)) => ApprovalOutcome::TimedOut,
            Ok(HoldDecided::Decided(_) | HoldDecided::NotFound) => answer,
            Err(e) => {
                self.log.line(&format!(
                    "approval {}: the decision could not be recorded: {e}",
                    request.id
                ));
                answer
            }
        }
    }
}

/// The outcome a decided held call gives the call waiting for it. The approval binds to the
/// request's own fingerprint, which the held call was recorded with.
fn outcome_of(held: &HeldCall, request: &ApprovalRequest) -> ApprovalOutcome {
    match &held.state {
        HoldState::Approved { for_session, .. } if held.args_hash == request.args_hash => {
            let args_hash = held.args_hash.clone();
            // "For this session" only where the request offered it.
            if *for_session && request.remember.is_some() {
                ApprovalOutcome::ApprovedForSession { args_hash }
            } else {
                ApprovalOutcome::Approved { args_hash }
            }
        }
        HoldState::Approved { .. } => ApprovalOutcome::Denied {
            reason: "the approval names other arguments".into(),
        },
        HoldState::Denied { reason, .. } => ApprovalOutcome::Denied {
            reason: reason.clone(),
        },
        HoldState::Expired { .. } | HoldState::Pending => ApprovalOutcome::TimedOut,
    }
}

/// Waits for a decision made on the held call's record (by this process or, on a shared
/// journal, any replica), until its deadline.
async fn decided_in_journal(journal: &dyn Journal, id: &str, deadline_ms: u64) -> Option<HeldCall> {
    let wait = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
    journal.hold_wait(id, wait).await
}

/// Expires a held call whose wait was dropped undecided (the call's round ended), so it is
/// never listed as pending nor released later.
struct ExpireIfUndecided {
    journal: Arc<dyn Journal>,
    id: Option<String>,
}

impl Drop for ExpireIfUndecided {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let journal = self.journal.clone();
        runtime.spawn(async move {
            let why = HoldState::Expired {
                why: "the call ended before a decision".into(),
            };
            let _ = journal.hold_decide(&id, why).await;
        });
    }
}

#[async_trait]
impl Approver for DurableApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.decide_for(request, &CallExtensions::default()).await
    }

    async fn decide_for(
        &self,
        request: &ApprovalRequest,
        extensions: &CallExtensions,
    ) -> ApprovalOutcome {
        let Some(durable) = self.durable.get() else {
            return self.channels.decide_for(request, extensions).await;
        };
        let journal = durable.journal.clone();
        let held = self.held_call(durable, request);
        let stored = match journal.hold_put(&held).await {
            Ok(stored) => stored,
            Err(e) => {
                self.log.line(&format!(
                    "approval {}: not recorded in the journal ({e}); it lasts as long as this process",
                    request.id
                ));
                false
            }
        };
        if !stored {
            return self.channels.decide_for(request, extensions).await;
        }
        let mut guard = ExpireIfUndecided {
            journal: journal.clone(),
            id: Some(request.id.clone()),
        };
        if let Some(webhook) = &durable.webhook {
            let (webhook, held) = (webhook.clone(), held.clone());
            tokio::spawn(async move { webhook.offer(&held).await });
        }
        let channels = self.channels.decide_for(request, extensions);
        let recorded = decided_in_journal(journal.as_ref(), &request.id, request.deadline_ms);
        tokio::pin!(channels, recorded);
        let outcome = tokio::select! {
            biased;
            answer = &mut channels => self.settle_with(journal.as_ref(), request, answer).await,
            decided = &mut recorded => match decided {
                Some(held) => outcome_of(&held, request),
                None => {
                    self.settle_with(journal.as_ref(), request, ApprovalOutcome::TimedOut)
                        .await
                }
            },
        };
        guard.id = None;
        outcome
    }
}

/// The approval ids this process watches, so that adopting again (after each recovery pass
/// of a shared journal) never watches one twice.
#[derive(Clone, Default)]
pub struct Watched(Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl Watched {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        // A panic while holding the lock leaves a set of whole ids.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` was newly taken to watch.
    fn take(&self, id: &str) -> bool {
        self.lock().insert(id.to_string())
    }

    fn done(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// Held calls an earlier process left PENDING, watched until decided.
pub struct HeldWatcher {
    held: Vec<HeldCall>,
    watched: Watched,
}

impl HeldWatcher {
    /// Takes from `journal` the unreleased held calls ([`Journal::holds_unreleased`]) of earlier
    /// processes (or, on a shared journal, of replicas whose lease lapsed) whose RECORDED
    /// intents this process now holds
    /// for recovery ([`Journal::open_records`]), leaving those `watched` already has. One whose
    /// deadline passed is watched too: the first look expires it and settles its intent.
    pub async fn adopt(journal: &dyn Journal, log: &ring0_mcp::Log, watched: &Watched) -> Self {
        let me = journal.incarnation().unwrap_or(0);
        let unreleased = journal.holds_unreleased().await;
        let (pending, open) = match (unreleased, journal.open_records().await) {
            (Ok(pending), Ok(open)) => (pending, open),
            (Err(e), _) | (_, Err(e)) => {
                log.line(&format!("held calls could not be read: {e}"));
                (Vec::new(), Vec::new())
            }
        };
        let taken = |h: &HeldCall| {
            open.iter()
                .any(|r| r.state == ring0_core::IntentState::Recorded && h.holds(r))
        };
        let held: Vec<HeldCall> = pending
            .into_iter()
            .filter(|h| h.incarnation != me && taken(h) && watched.take(&h.approval_id))
            .collect();
        if !held.is_empty() {
            log.line(&format!(
                "{} call(s) held before the restart still wait for approval (held by a process \
                 or replica that stopped)",
                held.len()
            ));
        }
        Self {
            held,
            watched: watched.clone(),
        }
    }

    /// How many held calls it watches.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether it watches none.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Watches each held call until it is decided or lapses, then releases or refuses its
    /// intent with the gateway's current kernel.
    pub async fn watch(self, gateway: Gateway, log: ring0_mcp::Log) {
        let watched = self.watched;
        let mut waiting = self.held;
        while !waiting.is_empty() {
            tokio::time::sleep(HOLD_POLL_INTERVAL).await;
            let mut still = Vec::with_capacity(waiting.len());
            for held in waiting {
                let journal = gateway.journal().clone();
                let current = match journal.hold_get(&held.approval_id).await {
                    Ok(Some(current)) => current,
                    Ok(None) | Err(_) => held,
                };
                if current.state == HoldState::Pending && now_ms() < current.deadline_ms {
                    still.push(current);
                    continue;
                }
                let decided = if current.state == HoldState::Pending {
                    let why = HoldState::Expired {
                        why: "no decision before its deadline".into(),
                    };
                    match journal.hold_decide(&current.approval_id, why).await {
                        Ok(HoldDecided::Decided(h) | HoldDecided::Lapsed(h))
                        | Ok(HoldDecided::AlreadyDecided(h)) => h,
                        _ => current,
                    }
                } else {
                    current
                };
                log.line(&release(&gateway, &decided).await);
                watched.done(&decided.approval_id);
            }
            waiting = still;
        }
    }
}

/// Acts on a decided held call of an earlier process: dispatches its intent when approved,
/// settles it REJECTED_CONFLICT otherwise. Returns what it did, for the log.
async fn release(gateway: &Gateway, held: &HeldCall) -> String {
    let journal = gateway.journal().clone();
    let record = match held_intent(journal.as_ref(), held).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return format!(
                "approval {}: its call is no longer waiting ({})",
                held.approval_id,
                held.state.as_str()
            );
        }
        Err(e) => return format!("approval {}: {e}", held.approval_id),
    };
    match &held.state {
        HoldState::Approved { by, .. } => {
            let kernel = gateway.generation().kernel.clone();
            match kernel.release_held(record.id).await {
                Ok(done) => format!(
                    "approval {} (by {by}): intent {} ran after the restart: {}",
                    held.approval_id, done.id, done.state
                ),
                Err(e) => format!("approval {}: intent {}: {e}", held.approval_id, record.id),
            }
        }
        other => {
            let note = format!("held for approval and {}: nothing was sent", other.as_str());
            match ring0_journal::cancel_before_dispatch(journal.as_ref(), &record, &note).await {
                Ok(done) => format!(
                    "approval {}: intent {} is {}",
                    held.approval_id, done.id, done.state
                ),
                Err(e) => format!("approval {}: intent {}: {e}", held.approval_id, record.id),
            }
        }
    }
}

/// The RECORDED intent a held call holds, if it is still waiting.
async fn held_intent(
    journal: &dyn Journal,
    held: &HeldCall,
) -> Result<Option<IntentRecord>, ring0_journal::JournalError> {
    Ok(journal
        .open_records()
        .await?
        .into_iter()
        .find(|r| r.state == ring0_core::IntentState::Recorded && held.holds(r)))
}
