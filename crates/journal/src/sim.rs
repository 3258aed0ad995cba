//! A deterministic simulation of the commit protocol under every failure the journal must
//! survive.
//!
//! One seed is one world: a handful of user intents (refunds of distinct orders), an external
//! service that does or does not honour idempotency keys and that can be probed, a tool whose
//! settlement kind matches the service, a host that follows the kernel's protocol
//! (`propose` → [`drive`]; [`recover`] on every start) and a model with no memory that proposes
//! the intents again and again with fresh (or duplicated, or recycled) call ids, reworded
//! arguments and now and then a revised canonicalizer.
//!
//! Nothing real decides an outcome: one seeded RNG draws every event and every fault, time is a
//! [`ManualClock`], and concurrency is simulated by polling the hosts' futures one step at a
//! time — every journal and executor call is a yield point — in an order the RNG picks. A crash
//! drops every future mid-step (all in-memory state is lost) and reopens the journal from its
//! log; a stream abort drops one future.
//!
//! Injected faults ([`Fault`]): ack loss, crash before dispatch, crash after
//! dispatch before ack, reorder (two equivalent proposals racing), provider not idempotent,
//! prompt revision (rewording, and a new canonicalizer version), duplicate and recycled call ids,
//! stream abort, timeout, cancellation before dispatch.
//!
//! Checked properties ([`Property`]):
//! - P1: at most one external effect per user intent;
//! - P2: after UNKNOWN only RECONCILING, COMPENSATED or DEAD_LETTER (and every step of every
//!   timeline is a legal transition);
//! - P3: an intent cancelled before dispatch never reached the service;
//! - P4: every proposal is decided the same by a journal rebuilt from the log alone;
//! - P5: the same events with another model's wording and call ids give the same outcome.
//!
//! At the end of each seed the world is quiesced (faults off, restart, recovery, a person settles
//! dead letters, the model proposes everything once more) and nothing may be left unsettled.

use crate::clock::ManualClock;
use crate::memory::MemoryJournal;
use crate::postgres::{PostgresJournal, PostgresOptions};
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
use crate::recovery::{Executor, RecoveryPolicy, drive, recover};
use crate::settle::{DispatchOutcome, cancel_before_dispatch, compensate, synthetic_receipt};
use crate::sqlite::{SqliteJournal, SqliteOptions};
use crate::{Journal, JournalError, machine};
use async_trait::async_trait;
use rand::{RngExt, SeedableRng};
use rand_xorshift::XorShiftRng;
use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{
    FailureClass, Fingerprint, IntentState, Observation, ProbeFinding, Receipt, SemanticKey,
    Settlement, canonical,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// The failures the simulation injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    AckLoss,
    CrashBeforeDispatch,
    CrashAfterDispatch,
    Reorder,
    ProviderNotIdempotent,
    PromptRewording,
    CanonicalizerRevision,
    DuplicateCallId,
    RecycledCallId,
    StreamAbort,
    Timeout,
    CancelBeforeDispatch,
}

impl Fault {
    pub const ALL: [Fault; 12] = [
        Self::AckLoss,
        Self::CrashBeforeDispatch,
        Self::CrashAfterDispatch,
        Self::Reorder,
        Self::ProviderNotIdempotent,
        Self::PromptRewording,
        Self::CanonicalizerRevision,
        Self::DuplicateCallId,
        Self::RecycledCallId,
        Self::StreamAbort,
        Self::Timeout,
        Self::CancelBeforeDispatch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::AckLoss => "ack_loss",
            Self::CrashBeforeDispatch => "crash_before_dispatch",
            Self::CrashAfterDispatch => "crash_after_dispatch",
            Self::Reorder => "reorder",
            Self::ProviderNotIdempotent => "provider_not_idempotent",
            Self::PromptRewording => "prompt_rewording",
            Self::CanonicalizerRevision => "canonicalizer_revision",
            Self::DuplicateCallId => "duplicate_call_id",
            Self::RecycledCallId => "recycled_call_id",
            Self::StreamAbort => "stream_abort",
            Self::Timeout => "timeout",
            Self::CancelBeforeDispatch => "cancel_before_dispatch",
        }
    }
}

/// The properties the simulation checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Property {
    /// At most one external effect per semantic intent.
    P1,
    /// After UNKNOWN only RECONCILING, COMPENSATED or DEAD_LETTER; every step legal.
    P2,
    /// Pre-dispatch cancellation touches nothing external.
    P3,
    /// Decisions from the log alone.
    P4,
    /// Same outcome whatever model or prompt template produced the proposals.
    P5,
    /// Nothing left unsettled (UNKNOWN, RECONCILING, DISPATCHED, RECORDED) after quiescence.
    Settled,
}

/// Totals of a simulation run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimReport {
    pub seeds: u64,
    /// Seeds with at least one violated property.
    pub violations: u64,
    pub by_property: BTreeMap<Property, u64>,
    /// How often each fault was actually injected.
    pub faults: BTreeMap<Fault, u64>,
    /// How often each state was entered (REJECTED_* counting refused proposals).
    pub states: BTreeMap<&'static str, u64>,
    /// The first few violations, with their seeds, to replay.
    pub examples: Vec<String>,
    /// External effects applied, proposals decided, crashes simulated.
    pub effects: u64,
    pub proposals: u64,
    pub crashes: u64,
}

/// Most violation examples a report keeps.
const EXAMPLES_MAX: usize = 10;

impl SimReport {
    fn merge(&mut self, other: SimReport) {
        self.seeds += other.seeds;
        self.violations += other.violations;
        for (k, v) in other.by_property {
            *self.by_property.entry(k).or_default() += v;
        }
        for (k, v) in other.faults {
            *self.faults.entry(k).or_default() += v;
        }
        for (k, v) in other.states {
            *self.states.entry(k).or_default() += v;
        }
        for e in other.examples {
            if self.examples.len() < EXAMPLES_MAX {
                self.examples.push(e);
            }
        }
        self.effects += other.effects;
        self.proposals += other.proposals;
        self.crashes += other.crashes;
    }

    /// Counts one more world's faults, states and totals, as one more seed (its violations
    /// are the caller's to check).
    pub fn add_world(&mut self, run: &WorldRun) {
        self.seeds += 1;
        for (k, v) in &run.faults {
            *self.faults.entry(*k).or_default() += v;
        }
        for (k, v) in &run.states {
            *self.states.entry(*k).or_default() += v;
        }
        self.effects += run.effects;
        self.proposals += run.proposals;
        self.crashes += run.crashes;
    }

    /// Faults never injected.
    pub fn unreached_faults(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|c| self.faults.get(c).copied().unwrap_or(0) == 0)
            .collect()
    }

    /// States never entered.
    pub fn unreached_states(&self) -> Vec<IntentState> {
        IntentState::ALL
            .into_iter()
            .filter(|s| self.states.get(s.as_str()).copied().unwrap_or(0) == 0)
            .collect()
    }
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seeds: {} violations: {}", self.seeds, self.violations)?;
        for p in [
            Property::P1,
            Property::P2,
            Property::P3,
            Property::P4,
            Property::P5,
            Property::Settled,
        ] {
            let n = self.by_property.get(&p).copied().unwrap_or(0);
            writeln!(f, "  {p:?}: {n}")?;
        }
        writeln!(f, "faults:")?;
        for c in Fault::ALL {
            let n = self.faults.get(&c).copied().unwrap_or(0);
            writeln!(f, "  {}: {n}", c.name())?;
        }
        writeln!(f, "states:")?;
        for s in IntentState::ALL {
            let n = self.states.get(s.as_str()).copied().unwrap_or(0);
            writeln!(f, "  {}: {n}", s.as_str())?;
        }
        writeln!(
            f,
            "proposals: {} effects: {} crashes: {}",
            self.proposals, self.effects, self.crashes
        )?;
        for e in &self.examples {
            writeln!(f, "violation: {e}")?;
        }
        Ok(())
    }
}

/// Runs seeds `0..seeds` on the in-memory journal.
pub fn run_simulation(seeds: u64) -> SimReport {
    run_seeds(0..seeds)
}

/// Runs a range of seeds on the in-memory journal.
pub fn run_seeds(seeds: std::ops::Range<u64>) -> SimReport {
    let mut report = SimReport::default();
    for seed in seeds {
        report.merge(run_seed(seed));
    }
    report
}

/// Which journal a simulated world runs on.
#[derive(Debug, Clone)]
pub enum SimBackend {
    Memory,
    /// A SQLite journal file at this path (created fresh; removed first if present).
    Sqlite(PathBuf),
    /// A PostgreSQL journal at this URL, which must name an empty database (or schema): a
    /// world's log is what it leaves there. A crash closes the replica and opens a new one, as
    /// a restarted process does; recovery takes the records of the one that closed.
    Postgres(String),
}

/// One seed: the world run twice with two different models (wordings and call ids), checked
/// for P1–P5, on the in-memory journal.
pub fn run_seed(seed: u64) -> SimReport {
    let a = run_world(seed, 0, &SimBackend::Memory);
    let b = run_world(seed, 1, &SimBackend::Memory);
    let mut report = SimReport {
        seeds: 1,
        ..SimReport::default()
    };
    let mut violated: BTreeSet<Property> = BTreeSet::new();
    for (p, why) in a.violations.iter().chain(&b.violations) {
        violated.insert(*p);
        if report.examples.len() < EXAMPLES_MAX {
            report.examples.push(format!("seed {seed}: {p:?}: {why}"));
        }
    }
    if a.outcome != b.outcome {
        violated.insert(Property::P5);
        report.examples.push(format!(
            "seed {seed}: P5: model A ended {:?}, model B ended {:?}",
            a.outcome, b.outcome
        ));
    }
    for p in &violated {
        *report.by_property.entry(*p).or_default() += 1;
    }
    report.violations = u64::from(!violated.is_empty());
    for run in [&a, &b] {
        report.add_world(run);
    }
    // Two models' worlds, one seed.
    report.seeds = 1;
    report
}

/// The observable result of one simulated world.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorldRun {
    /// Per user intent: final state of its record, effects applied, effects compensated.
    pub outcome: Vec<(Option<IntentState>, u32, u32)>,
    /// Every decision and transition result, in order (for comparing backends).
    pub trace: Vec<String>,
    pub violations: Vec<(Property, String)>,
    pub faults: BTreeMap<Fault, u64>,
    pub states: BTreeMap<&'static str, u64>,
    pub effects: u64,
    pub proposals: u64,
    pub crashes: u64,
}

// ---------------------------------------------------------------------------------------------
// The world

/// One order the service holds.
#[derive(Debug, Clone, Default)]
struct Resource {
    /// Effects applied (P1: at most one).
    applied: u32,
    compensated: u32,
    /// Bumped by every change, including changes by someone else.
    version: u64,
}

#[derive(Debug, Default)]
struct Service {
    honours_keys: bool,
    resources: Vec<Resource>,
    seen_keys: HashSet<String>,
    /// (record id, idempotency key) of every request that reached the service.
    requests: Vec<(IntentId, String)>,
}

impl Service {
    fn apply(&mut self, intent: usize, record: &IntentRecord) {
        self.requests
            .push((record.id, record.idempotency_key.clone()));
        if self.honours_keys && !self.seen_keys.insert(record.idempotency_key.clone()) {
            return;
        }
        let r = &mut self.resources[intent];
        r.applied += 1;
        r.version += 1;
    }
}

struct Inner {
    rng: XorShiftRng,
    faults_on: bool,
    crashed: bool,
    yielded: bool,
    service: Service,
    settlement: Settlement,
    faults: BTreeMap<Fault, u64>,
    states: BTreeMap<&'static str, u64>,
    violations: Vec<(Property, String)>,
    trace: Vec<String>,
    /// Cancelled records, with how many service requests had been made at that moment and
    /// whether the record had ever been dispatched.
    cancelled: Vec<(IntentId, usize, bool)>,
    proposals: u64,
}

impl Inner {
    fn hit(&mut self, fault: Fault) {
        *self.faults.entry(fault).or_default() += 1;
    }

    fn chance(&mut self, p: f64) -> bool {
        self.faults_on && self.rng.random_bool(p)
    }

    fn violation(&mut self, p: Property, why: String) {
        self.violations.push((p, why));
    }
}

struct Ctx {
    inner: Mutex<Inner>,
}

impl Ctx {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Returns `Pending` once (a yield point for the scheduler), then `Ready`.
struct YieldNow<'a> {
    ctx: &'a Ctx,
    done: bool,
}

impl Future for YieldNow<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.done {
            return Poll::Ready(());
        }
        self.done = true;
        self.ctx.lock().yielded = true;
        Poll::Pending
    }
}

fn yield_now(ctx: &Ctx) -> YieldNow<'_> {
    YieldNow { ctx, done: false }
}

/// The process dies here: marks the crash and never completes; the scheduler drops the future.
async fn crash(ctx: &Ctx) -> ! {
    ctx.lock().crashed = true;
    std::future::pending::<()>().await;
    unreachable!("a crashed future is never polled to completion")
}

/// Which user intent a record is about: the order in its canonical arguments.
fn intent_of(record: &IntentRecord) -> Option<usize> {
    let args: Value = serde_json::from_str(&record.canonical_args).ok()?;
    args.get("order")?
        .as_str()?
        .strip_prefix("o-")?
        .parse()
        .ok()
}

/// The journal as the simulated host sees it: every call is a yield point, writes may crash
/// before or after they commit, and (on the memory backend) every proposal is also decided by
/// a journal rebuilt from the log alone (P4).
struct SimJournal {
    inner: Arc<dyn Journal>,
    memory: Option<Arc<MemoryJournal>>,
    ctx: Arc<Ctx>,
}

impl SimJournal {
    fn trace(&self, line: String) {
        self.ctx.lock().trace.push(line);
    }

    fn entered(&self, state: IntentState) {
        *self.ctx.lock().states.entry(state.as_str()).or_default() += 1;
    }
}

/// Probability that a journal write crashes just before, or just after, it commits.
const CRASH_AROUND_WRITE_P: f64 = 0.015;

fn summary(d: &ProposeDecision) -> String {
    match d.record() {
        Some(r) => format!("{} {} {} f{}", d.kind(), r.id, r.state, r.fence),
        None => d.kind().to_string(),
    }
}

#[async_trait]
impl Journal for SimJournal {
    async fn propose(&self, p: Proposal) -> Result<ProposeDecision, JournalError> {
        yield_now(&self.ctx).await;
        if self.ctx.lock().chance(CRASH_AROUND_WRITE_P) {
            crash(&self.ctx).await;
        }
        let rebuilt = self.memory.as_ref().map(|m| {
            let clock = Arc::new(ManualClock::new(0));
            MemoryJournal::from_records(m.records(), clock)
        });
        let decision = self.inner.propose(p.clone()).await;
        if let (Some(rebuilt), Ok(live)) = (rebuilt, &decision) {
            let from_log = rebuilt.propose(p).await;
            let same = match (&from_log, live) {
                (Ok(ProposeDecision::Recorded(a)), ProposeDecision::Recorded(b)) => {
                    a.state == b.state && (a.fence == 1) == (b.fence == 1)
                }
                (Ok(a), b) => {
                    a.kind() == b.kind()
                        && a.record().map(|r| (r.id, r.state, r.fence))
                            == b.record().map(|r| (r.id, r.state, r.fence))
                }
                (Err(_), _) => false,
            };
            if !same {
                self.ctx.lock().violation(
                    Property::P4,
                    format!("live decision {live:?} but from the log alone {from_log:?}"),
                );
            }
        }
        match &decision {
            Ok(d) => {
                self.trace(format!("propose -> {}", summary(d)));
                match d {
                    ProposeDecision::Recorded(r) => {
                        if r.fence == 1 {
                            self.entered(IntentState::Proposed);
                        }
                        self.entered(IntentState::Recorded);
                    }
                    ProposeDecision::Duplicate(_) => self.entered(IntentState::RejectedDuplicate),
                    ProposeDecision::Conflict { .. } | ProposeDecision::KeyConflict(_) => {
                        self.entered(IntentState::RejectedConflict)
                    }
                    ProposeDecision::Replay(_) => {}
                }
            }
            Err(e) => self.trace(format!("propose -> error {e}")),
        }
        if self.ctx.lock().chance(CRASH_AROUND_WRITE_P) {
            crash(&self.ctx).await;
        }
        decision
    }

    async fn transition(&self, t: Transition) -> Result<IntentRecord, JournalError> {
        yield_now(&self.ctx).await;
        if self.ctx.lock().chance(CRASH_AROUND_WRITE_P) {
            crash(&self.ctx).await;
        }
        let to = t.to;
        let result = self.inner.transition(t).await;
        match &result {
            Ok(r) => {
                self.trace(format!("transition {} -> {} f{}", r.id, r.state, r.fence));
                self.entered(to);
            }
            Err(e) => self.trace(format!("transition -> {to} refused: {e}")),
        }
        if self.ctx.lock().chance(CRASH_AROUND_WRITE_P) {
            crash(&self.ctx).await;
        }
        result
    }

    fn incarnation(&self) -> Option<u64> {
        self.inner.incarnation()
    }

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError> {
        yield_now(&self.ctx).await;
        self.inner.get(id).await
    }

    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError> {
        yield_now(&self.ctx).await;
        self.inner.find_by_key(key).await
    }

    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError> {
        yield_now(&self.ctx).await;
        self.inner.open_records().await
    }

    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        yield_now(&self.ctx).await;
        self.inner.recent(limit).await
    }

    async fn memo_get(
        &self,
        fingerprint: &Fingerprint,
        max_age_ms: u64,
    ) -> Result<Option<Observation>, JournalError> {
        self.inner.memo_get(fingerprint, max_age_ms).await
    }

    async fn memo_put(
        &self,
        fingerprint: &Fingerprint,
        observation: &Observation,
    ) -> Result<bool, JournalError> {
        self.inner.memo_put(fingerprint, observation).await
    }
}

/// The executor, the external service and its probe.
struct SimExec {
    ctx: Arc<Ctx>,
}

fn sim_receipt(record: &IntentRecord, text: &str) -> Receipt {
    Receipt::new(
        record.last_call_id().to_string(),
        0,
        record.tool.clone(),
        Disposition::Dispatched,
        CallOutcome::Completed {
            observation: Observation::text(text),
        },
    )
}

/// What goes wrong with one simulated dispatch.
#[derive(Clone, Copy)]
enum DispatchFault {
    None,
    AckLoss,
    Timeout,
    StreamAbort,
    CrashMidFlight,
    Refused,
}

#[async_trait]
impl Executor for SimExec {
    fn settlement(&self, _: &IntentRecord) -> Settlement {
        self.ctx.lock().settlement
    }

    async fn snapshot(&self, record: &IntentRecord) -> Option<Value> {
        yield_now(&self.ctx).await;
        let st = self.ctx.lock();
        let intent = intent_of(record)?;
        (st.settlement == Settlement::Probe).then(|| json!(st.service.resources[intent].version))
    }

    async fn dispatch(&self, record: &IntentRecord) -> DispatchOutcome {
        yield_now(&self.ctx).await;
        let (fault, applied_if_ambiguous) = {
            let mut st = self.ctx.lock();
            let fault = if st.faults_on {
                match st.rng.random_range(0..100u32) {
                    0..=49 => DispatchFault::None,
                    50..=59 => DispatchFault::AckLoss,
                    60..=69 => DispatchFault::Timeout,
                    70..=77 => DispatchFault::StreamAbort,
                    78..=87 => DispatchFault::CrashMidFlight,
                    _ => DispatchFault::Refused,
                }
            } else {
                DispatchFault::None
            };
            let coin = st.rng.random_bool(0.5);
            (fault, coin)
        };
        let intent = intent_of(record).expect("simulated intents name their order");
        let class = {
            let mut st = self.ctx.lock();
            let ambiguous = !matches!(fault, DispatchFault::None | DispatchFault::Refused);
            if ambiguous && !st.service.honours_keys {
                st.hit(Fault::ProviderNotIdempotent);
            }
            match fault {
                DispatchFault::None => {
                    st.service.apply(intent, record);
                    return DispatchOutcome::Applied(sim_receipt(record, "refunded"));
                }
                DispatchFault::Refused => Some(FailureClass::ConnectionRefused),
                DispatchFault::AckLoss => {
                    st.hit(Fault::AckLoss);
                    st.service.apply(intent, record);
                    Some(FailureClass::ConnectionLost)
                }
                DispatchFault::Timeout => {
                    st.hit(Fault::Timeout);
                    if applied_if_ambiguous {
                        st.service.apply(intent, record);
                    }
                    Some(FailureClass::Timeout)
                }
                DispatchFault::StreamAbort => {
                    st.hit(Fault::StreamAbort);
                    if applied_if_ambiguous {
                        st.service.apply(intent, record);
                    }
                    Some(FailureClass::StreamAborted)
                }
                DispatchFault::CrashMidFlight => {
                    if applied_if_ambiguous {
                        st.service.apply(intent, record);
                    }
                    None
                }
            }
        };
        match class {
            Some(class) => DispatchOutcome::Failed {
                class,
                receipt: sim_receipt(record, "no answer"),
            },
            None => crash(&self.ctx).await,
        }
    }

    async fn probe(&self, record: &IntentRecord) -> ProbeFinding {
        yield_now(&self.ctx).await;
        let st = self.ctx.lock();
        let Some(intent) = intent_of(record) else {
            return ProbeFinding::Indeterminate("unknown order".into());
        };
        let r = &st.service.resources[intent];
        if r.applied > 0 {
            ProbeFinding::Applied(Box::new(Observation {
                structured: Some(json!({"order": intent, "applied": r.applied})),
                ..Observation::text("the refund is there")
            }))
        } else if record.snapshot == Some(json!(r.version)) {
            ProbeFinding::Unchanged
        } else {
            ProbeFinding::Indeterminate("the order changed, but not by this refund".into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model: no memory, only the user's goals

/// How one proposal came about, so the faults it exercises can be counted once decided.
#[derive(Debug, Clone, Copy, Default)]
struct Tags {
    race: bool,
    duplicate_id: bool,
    recycled_id: bool,
    reworded: bool,
    revised: bool,
}

struct Model {
    rng: XorShiftRng,
    /// Call ids used so far, with the intent each was used for.
    used: Vec<(String, usize)>,
    style: u64,
}

impl Model {
    /// The model's text for refunding order `intent`: equivalent JSON, worded its own way.
    fn args_text(&mut self, intent: usize) -> String {
        let amount = 10 + intent as u64;
        let amount_text = match self.rng.random_range(0..3u32) {
            0 => amount.to_string(),
            1 => format!("{amount}.0"),
            _ => format!("{}e1", amount as f64 / 10.0),
        };
        let order = if self.rng.random_bool(0.5) {
            format!("\"o-{intent}\"")
        } else {
            // The same string with an escaped letter.
            format!("\"\\u006f-{intent}\"")
        };
        let space = if self.rng.random_bool(0.5) { " " } else { "" };
        if self.rng.random_bool(0.5) {
            format!("{{\"order\":{space}{order},{space}\"amount\":{space}{amount_text}}}")
        } else {
            format!("{{{space}\"amount\": {amount_text}, \"order\": {order}{space}}}")
        }
    }

    fn call_id(&mut self, intent: usize, tags: &mut Tags) -> String {
        let roll = self.rng.random_range(0..100u32);
        let same: Vec<_> = self
            .used
            .iter()
            .filter(|(_, i)| *i == intent)
            .cloned()
            .collect();
        let other: Vec<_> = self
            .used
            .iter()
            .filter(|(_, i)| *i != intent)
            .cloned()
            .collect();
        if roll < 10 && !same.is_empty() {
            tags.duplicate_id = true;
            let n = self.rng.random_range(0..same.len());
            return same[n].0.clone();
        }
        if roll < 20 && !other.is_empty() {
            tags.recycled_id = true;
            let n = self.rng.random_range(0..other.len());
            return other[n].0.clone();
        }
        let id = match self.style {
            0 => format!("call_{:08x}", self.rng.random::<u32>()),
            _ => format!("toolu_{:016x}", self.rng.random::<u64>()),
        };
        self.used.push((id.clone(), intent));
        id
    }
}

const SCOPE: &str = "user:42:task:refunds";
const TOOL: &str = "refund";

/// Prepares a proposal from the model's text, as the kernel would: strict parse, canonical
/// arguments, semantic key. A revised canonicalizer stamps version 2 on the same digest input.
fn prepare(args_text: &str, call_id: String, host_id: Option<IntentId>, revised: bool) -> Proposal {
    let args = canonical::parse_strict(args_text).expect("the model's JSON is valid");
    let canonical_args = canonical::canonical_string(&args).expect("canonicalizable");
    let mut semantic_key = SemanticKey::compute(TOOL, &args, SCOPE, 0).expect("keyed");
    if revised {
        semantic_key.version += 1;
    }
    Proposal {
        intent_id: host_id,
        semantic_key,
        scope: SCOPE.into(),
        attempt_epoch: 0,
        tool: TOOL.into(),
        canonical_args,
        call_id,
        mutating: true,
        client_key: None,
        principal: None,
    }
}

// ---------------------------------------------------------------------------------------------
// The host and the scheduler

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// What the kernel does with one proposed call.
async fn host_call(j: Arc<SimJournal>, exec: Arc<SimExec>, p: Proposal, tags: Tags) {
    let raw_differs = tags.reworded;
    let decision = j.propose(p.clone()).await;
    {
        let mut st = j.ctx.lock();
        st.proposals += 1;
        if let Ok(d) = &decision {
            if let Some(r) = d.record()
                && !matches!(d, ProposeDecision::Conflict { .. })
                && r.semantic_key != p.semantic_key
            {
                st.violation(
                    Property::P1,
                    format!(
                        "call id {} was answered with another intent's record",
                        p.call_id
                    ),
                );
            }
            if tags.duplicate_id {
                st.hit(Fault::DuplicateCallId);
            }
            if tags.recycled_id {
                st.hit(Fault::RecycledCallId);
            }
            match d {
                ProposeDecision::Duplicate(_) if tags.race => st.hit(Fault::Reorder),
                ProposeDecision::Duplicate(_) | ProposeDecision::Replay(_) if raw_differs => {
                    st.hit(Fault::PromptRewording)
                }
                ProposeDecision::Conflict { .. } if tags.revised => {
                    st.hit(Fault::CanonicalizerRevision)
                }
                _ => {}
            }
        }
    }
    if let Ok(ProposeDecision::Recorded(r)) = decision {
        let _ = drive(&*j, &*exec, r).await;
    }
}

async fn host_cancel(j: Arc<SimJournal>) {
    // Every record, oldest first: `open_records` is what recovery must settle, which on a
    // shared journal leaves out this host's own recorded calls (its live tasks hold them).
    let Ok(all) = j.recent(usize::MAX).await else {
        return;
    };
    let recorded: Vec<_> = all
        .into_iter()
        .rev()
        .filter(|r| r.state == IntentState::Recorded)
        .collect();
    if recorded.is_empty() {
        return;
    }
    let pick = {
        let mut st = j.ctx.lock();
        st.rng.random_range(0..recorded.len())
    };
    let r = &recorded[pick];
    if cancel_before_dispatch(&*j, r, "cancelled before dispatch")
        .await
        .is_ok()
    {
        let mut st = j.ctx.lock();
        st.hit(Fault::CancelBeforeDispatch);
        let seen = st.service.requests.len();
        st.cancelled.push((r.id, seen, r.attempts > 0));
    }
}

/// A person settles one dead letter from the service's truth.
async fn person_settles(j: Arc<SimJournal>, all: bool) {
    let Ok(recent) = j.recent(usize::MAX).await else {
        return;
    };
    for r in recent
        .into_iter()
        .filter(|r| r.state == IntentState::DeadLetter)
    {
        let applied = {
            let st = j.ctx.lock();
            intent_of(&r).is_some_and(|i| st.service.resources[i].applied > 0)
        };
        let t = if applied {
            Transition::to(&r, IntentState::Acked)
                .note("a person confirmed the effect")
                .receipt(synthetic_receipt(&r, None))
        } else {
            Transition::to(&r, IntentState::Failed).note("a person confirmed nothing happened")
        };
        let _ = j.transition(t).await;
        if !all {
            return;
        }
    }
}

/// The host decides an acknowledged refund was unwanted and runs its compensating action.
async fn host_compensates(j: Arc<SimJournal>) {
    let Ok(recent) = j.recent(usize::MAX).await else {
        return;
    };
    let Some(r) = recent.into_iter().find(|r| r.state == IntentState::Acked) else {
        return;
    };
    yield_now(&j.ctx).await;
    if let Some(i) = intent_of(&r) {
        let mut st = j.ctx.lock();
        st.service.resources[i].compensated += 1;
        st.service.resources[i].version += 1;
    }
    let _ = compensate(&*j, &r, None, "refund reversed by the host").await;
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls a task until it completes, yields, or crashes. Pending for any other reason is real
/// I/O (the SQLite writer thread), waited for; the order of events never depends on it.
fn step(ctx: &Ctx, task: &mut Task, waker: &Waker) -> bool {
    let mut cx = Context::from_waker(waker);
    loop {
        ctx.lock().yielded = false;
        if task.as_mut().poll(&mut cx).is_ready() {
            return true;
        }
        let st = ctx.lock();
        if st.crashed || st.yielded {
            return false;
        }
        drop(st);
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}

struct World {
    ctx: Arc<Ctx>,
    clock: Arc<ManualClock>,
    backend: SimBackend,
    journal: Arc<SimJournal>,
    exec: Arc<SimExec>,
    tasks: Vec<Task>,
    waker: Waker,
    crashes: u64,
}

impl World {
    fn open(
        backend: &SimBackend,
        ctx: &Arc<Ctx>,
        clock: &Arc<ManualClock>,
        log: Vec<IntentRecord>,
    ) -> Arc<SimJournal> {
        let (inner, memory): (Arc<dyn Journal>, _) = match backend {
            SimBackend::Memory => {
                let m = Arc::new(MemoryJournal::from_records(log, clock.clone()));
                (m.clone(), Some(m))
            }
            SimBackend::Sqlite(path) => {
                let options = SqliteOptions {
                    clock: clock.clone(),
                    readers: 1,
                    check_integrity: false,
                    ..SqliteOptions::default()
                };
                let j = SqliteJournal::open_with(path, options).expect("simulation journal opens");
                (Arc::new(j), None)
            }
            SimBackend::Postgres(url) => {
                let options = PostgresOptions {
                    clock: clock.clone(),
                    pool_connections: 2,
                    ..PostgresOptions::default()
                };
                let j = PostgresJournal::open(url, options).expect("simulation journal opens");
                (Arc::new(j), None)
            }
        };
        Arc::new(SimJournal {
            inner,
            memory,
            ctx: ctx.clone(),
        })
    }

    fn spawn(&mut self, task: impl Future<Output = ()> + 'static) {
        self.tasks.push(Box::pin(task));
    }

    /// Polls one task (picked by the RNG) one step.
    fn poll_one(&mut self) {
        if self.tasks.is_empty() {
            return;
        }
        let i = self.ctx.lock().rng.random_range(0..self.tasks.len());
        let done = step(&self.ctx, &mut self.tasks[i], &self.waker);
        if done {
            drop(self.tasks.swap_remove(i));
        }
        if self.ctx.lock().crashed {
            self.crash_and_restart();
        }
    }

    /// The process dies: every future is dropped, the journal reopened from its log alone, and
    /// recovery starts.
    fn crash_and_restart(&mut self) {
        self.tasks.clear();
        self.crashes += 1;
        let log = match &self.journal.memory {
            Some(m) => m.records(),
            None => Vec::new(),
        };
        {
            let mut st = self.ctx.lock();
            st.crashed = false;
            st.trace.push("crash".into());
        }
        // Which faults this crash exercised, read from the log as the successor will.
        let open = self.block_on_inner(self.journal.inner.open_records());
        {
            let mut st = self.ctx.lock();
            for r in open.unwrap_or_default() {
                match r.state {
                    IntentState::Recorded => st.hit(Fault::CrashBeforeDispatch),
                    IntentState::Dispatched => st.hit(Fault::CrashAfterDispatch),
                    _ => {}
                }
            }
        }
        // The old journal must be gone (it holds the write lock, or its lease) before the new
        // one opens.
        let placeholder = Arc::new(SimJournal {
            inner: Arc::new(MemoryJournal::new()),
            memory: None,
            ctx: self.ctx.clone(),
        });
        self.journal = placeholder;
        self.journal = Self::open(&self.backend, &self.ctx, &self.clock, log);
        // The successor takes what was left before it serves anything, as `ring0 serve` does
        // (on a shared journal the take moves those records' fences; elsewhere it only reads);
        // settling them then runs beside the new calls.
        let _ = self.block_on_inner(self.journal.inner.open_records());
        let (j, e) = (self.journal.clone(), self.exec.clone());
        self.spawn(async move {
            let _ = recover(&*j, &*e, RecoveryPolicy::default()).await;
        });
    }

    fn block_on_inner<T>(&self, fut: impl Future<Output = T>) -> T {
        let mut fut = std::pin::pin!(fut);
        let mut cx = Context::from_waker(&self.waker);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park_timeout(std::time::Duration::from_millis(50));
        }
    }

    fn run_all(&mut self) {
        // Bounded: every task finishes within its protocol's step bound unless it crashes, and
        // crashes are off when this is called.
        for _ in 0..100_000 {
            if self.tasks.is_empty() {
                return;
            }
            self.poll_one();
        }
    }
}

/// Runs one world: `seed` draws the events, `model` picks the model's wording and call ids.
pub fn run_world(seed: u64, model: u64, backend: &SimBackend) -> WorldRun {
    remove_backend_files(backend);
    let mut rng = XorShiftRng::seed_from_u64(seed);
    let plan = WorldPlan::draw(&mut rng);
    let mut model = Model::new(seed, model);
    let mut world = World::start(backend, plan.context(rng));
    for _ in 0..plan.steps {
        world.step(&mut model, &plan);
    }
    world.quiesce(&mut model, &plan);
    check(&world, plan.intents)
}

/// A SQLite world starts from an empty database.
fn remove_backend_files(backend: &SimBackend) {
    if let SimBackend::Sqlite(path) = backend {
        for suffix in ["", "-wal", "-shm", ".lock"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
    }
}

/// What a seed draws before the first event: the user's intents, the service and the tool's
/// settlement, whether the host names intents, and how many events happen.
struct WorldPlan {
    intents: usize,
    honours_keys: bool,
    settlement: Settlement,
    host_ids: Option<Vec<IntentId>>,
    steps: u32,
}

impl WorldPlan {
    fn draw(rng: &mut XorShiftRng) -> Self {
        let intents = rng.random_range(1..=3usize);
        let honours_keys = rng.random_bool(0.5);
        let settlement = match (honours_keys, rng.random_range(0..10u32)) {
            (true, 0..=6) => Settlement::IdempotencyKey,
            (true, _) => Settlement::Probe,
            (false, 0..=6) => Settlement::Probe,
            (false, _) => Settlement::None,
        };
        let host_ids: Option<Vec<IntentId>> = rng.random_bool(0.5).then(|| {
            (0..intents)
                .map(|_| uuid::Builder::from_random_bytes(rng.random()).into_uuid())
                .collect()
        });
        let steps = rng.random_range(24..=48u32);
        Self {
            intents,
            honours_keys,
            settlement,
            host_ids,
            steps,
        }
    }

    /// The world's shared state, drawing every later event from `rng`.
    fn context(&self, rng: XorShiftRng) -> Arc<Ctx> {
        Arc::new(Ctx {
            inner: Mutex::new(Inner {
                rng,
                faults_on: true,
                crashed: false,
                yielded: false,
                service: Service {
                    honours_keys: self.honours_keys,
                    resources: vec![Resource::default(); self.intents],
                    ..Service::default()
                },
                settlement: self.settlement,
                faults: BTreeMap::new(),
                states: BTreeMap::new(),
                violations: Vec::new(),
                trace: Vec::new(),
                cancelled: Vec::new(),
                proposals: 0,
            }),
        })
    }
}

impl Model {
    fn new(seed: u64, style: u64) -> Self {
        Self {
            rng: XorShiftRng::seed_from_u64(
                seed ^ 0x9e37_79b9_7f4a_7c15 ^ style.wrapping_mul(0x1234_5678_9abc_def1),
            ),
            used: Vec::new(),
            style,
        }
    }
}

impl World {
    fn start(backend: &SimBackend, ctx: Arc<Ctx>) -> Self {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let journal = World::open(backend, &ctx, &clock, Vec::new());
        World {
            exec: Arc::new(SimExec { ctx: ctx.clone() }),
            ctx,
            clock,
            backend: backend.clone(),
            journal,
            tasks: Vec::new(),
            waker: Waker::from(Arc::new(ThreadWaker(std::thread::current()))),
            crashes: 0,
        }
    }

    /// The model proposes refunding order `intent`, worded its own way, through a host.
    fn propose(&mut self, model: &mut Model, plan: &WorldPlan, intent: usize, mut tags: Tags) {
        let text = model.args_text(intent);
        let call_id = model.call_id(intent, &mut tags);
        let canonical = format!("{{\"amount\":{},\"order\":\"o-{intent}\"}}", 10 + intent);
        tags.reworded = text != canonical;
        let host_id = plan.host_ids.as_ref().map(|ids| ids[intent]);
        let p = prepare(&text, call_id, host_id, tags.revised);
        let (j, e) = (self.journal.clone(), self.exec.clone());
        self.spawn(host_call(j, e, p, tags));
    }

    /// One drawn event, then a few drawn polls of the hosts' futures.
    fn step(&mut self, model: &mut Model, plan: &WorldPlan) {
        let ctx = self.ctx.clone();
        let (event, intent, advance) = {
            let mut st = ctx.lock();
            (
                st.rng.random_range(0..100u32),
                st.rng.random_range(0..plan.intents),
                st.rng.random_range(1..50u64),
            )
        };
        self.clock.advance_ms(advance);
        match event {
            0..=29 => self.propose(model, plan, intent, Tags::default()),
            30..=37 => {
                let race = Tags {
                    race: true,
                    ..Tags::default()
                };
                self.propose(model, plan, intent, race);
                self.propose(model, plan, intent, race);
            }
            38..=41 => {
                let revised = Tags {
                    revised: true,
                    ..Tags::default()
                };
                self.propose(model, plan, intent, revised);
            }
            42..=49 => {
                let j = self.journal.clone();
                self.spawn(host_cancel(j));
            }
            50..=52 => {
                ctx.lock().crashed = true;
                self.crash_and_restart();
            }
            53..=56 if !self.tasks.is_empty() => {
                // The model's stream aborted: the host drops one call's future mid-protocol.
                let i = ctx.lock().rng.random_range(0..self.tasks.len());
                drop(self.tasks.swap_remove(i));
                ctx.lock().hit(Fault::StreamAbort);
            }
            57..=59 => {
                let j = self.journal.clone();
                self.spawn(person_settles(j, false));
            }
            60..=61 => {
                let j = self.journal.clone();
                self.spawn(host_compensates(j));
            }
            62..=63 => {
                let mut st = ctx.lock();
                st.service.resources[intent].version += 1;
            }
            _ => {}
        }
        let polls = ctx.lock().rng.random_range(1..6u32);
        for _ in 0..polls {
            self.poll_one();
        }
    }

    /// No more faults; restart, recover, let a person settle, propose everything again.
    fn quiesce(&mut self, model: &mut Model, plan: &WorldPlan) {
        self.ctx.lock().faults_on = false;
        self.ctx.lock().crashed = true;
        self.crash_and_restart();
        self.run_all();
        let j = self.journal.clone();
        self.spawn(person_settles(j, true));
        self.run_all();
        for intent in 0..plan.intents {
            self.propose(model, plan, intent, Tags::default());
            self.run_all();
        }
    }
}

/// The world after quiescence: every property checked, and what it leaves.
fn check(world: &World, intents: usize) -> WorldRun {
    let records = world
        .block_on_inner(world.journal.inner.recent(usize::MAX))
        .unwrap_or_default();
    let mut st = world.ctx.lock();
    for r in &records {
        check_settled_and_legal(&mut st, r);
    }
    check_one_effect_per_intent(&mut st);
    check_cancelled_never_reached(&mut st);
    let outcome = (0..intents)
        .map(|i| {
            let text = format!("{{\"amount\":{},\"order\":\"o-{i}\"}}", 10 + i);
            let key = prepare(&text, String::new(), None, false).semantic_key;
            let state = records
                .iter()
                .filter(|r| r.semantic_key == key)
                .map(|r| r.state)
                .next();
            let res = &st.service.resources[i];
            (state, res.applied, res.compensated)
        })
        .collect();
    WorldRun {
        outcome,
        trace: std::mem::take(&mut st.trace),
        violations: std::mem::take(&mut st.violations),
        faults: std::mem::take(&mut st.faults),
        states: std::mem::take(&mut st.states),
        effects: st
            .service
            .resources
            .iter()
            .map(|r| u64::from(r.applied))
            .sum(),
        proposals: st.proposals,
        crashes: world.crashes,
    }
}

/// `Settled`: nothing is left open after quiescence; P2: after UNKNOWN only RECONCILING,
/// COMPENSATED or DEAD_LETTER, and every step of the timeline is legal.
fn check_settled_and_legal(st: &mut Inner, r: &IntentRecord) {
    if matches!(
        r.state,
        IntentState::Unknown
            | IntentState::Reconciling
            | IntentState::Dispatched
            | IntentState::Recorded
            | IntentState::Proposed
    ) {
        st.violation(
            Property::Settled,
            format!("intent {} left {} after quiescence", r.id, r.state),
        );
    }
    for pair in r.timeline.windows(2) {
        let (from, to) = (pair[0].state, pair[1].state);
        if from == IntentState::Unknown
            && !matches!(
                to,
                IntentState::Reconciling | IntentState::Compensated | IntentState::DeadLetter
            )
        {
            st.violation(Property::P2, format!("intent {}: UNKNOWN → {to}", r.id));
        }
        if !machine::is_allowed(from, to) {
            st.violation(
                Property::P2,
                format!("intent {}: illegal {from} → {to}", r.id),
            );
        }
    }
}

/// P1: at most one external effect per user intent.
fn check_one_effect_per_intent(st: &mut Inner) {
    for (i, res) in st.service.resources.clone().iter().enumerate() {
        if res.applied > 1 {
            st.violation(
                Property::P1,
                format!("order o-{i} was refunded {} times", res.applied),
            );
        }
    }
}

/// P3: an intent cancelled before dispatch never reached the service.
fn check_cancelled_never_reached(st: &mut Inner) {
    for (id, seen, dispatched_before) in st.cancelled.clone() {
        let requests = &st.service.requests;
        let ever = requests.iter().any(|(r, _)| *r == id);
        let after = requests[seen..].iter().any(|(r, _)| *r == id);
        if after || (ever && !dispatched_before) {
            st.violation(
                Property::P3,
                format!("intent {id} was cancelled before dispatch yet reached the service"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_identically() {
        let a = run_world(7, 0, &SimBackend::Memory);
        let b = run_world(7, 0, &SimBackend::Memory);
        assert_eq!(a, b);
        assert!(!a.trace.is_empty());
    }

    #[test]
    fn the_report_prints_the_totals_line_first() {
        let report = run_simulation(3);
        let text = report.to_string();
        assert!(text.starts_with("seeds: 3 violations: 0\n"), "{text}");
        assert!(text.contains("ack_loss:"), "{text}");
    }
}
