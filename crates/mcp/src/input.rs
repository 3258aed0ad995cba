//! Questions asked during a `tools/call` of the stateless 2026-07-28 era.
//!
//! In that era the server may not send the client requests of its own. When something serving a
//! call needs an answer from the client — ring0's approval question, or an upstream's
//! `elicitation/create`, `sampling/createMessage` or `roots/list` — the downstream `tools/call`
//! answers at once with an `input_required` result carrying the question(s) and a
//! `requestState`, while the call itself stays where it is: its kernel round keeps running in the
//! background, and the upstream request that asked keeps waiting. The client answers by calling
//! the tool again with `inputResponses` and that `requestState`; the answers go to the waiting
//! askers and the same round continues, so the journal holds one intent and the upstream sees one
//! call. The retry's response is the call's result (or the next question).
//!
//! `requestState` is a sealed handle ([`Seal`]): `r0s1.<payload>.<tag>`, the payload naming the
//! parked call (128 random bits), the replica that parked it, its expiry and the digest that
//! binds it to the call (tool and arguments) and to who made it (the HTTP request's principal
//! or the stdio session), the tag an HMAC-SHA256 over the payload under a key every replica of
//! a deployment shares (on PostgreSQL, made once in the database: see
//! `ring0_journal::deployment`; a single process draws its own). A retry is checked against the
//! seal before anything is looked up: a forged or altered state, an expired one or one bound to
//! another call or principal is refused whatever replica it reaches. The round itself cannot
//! travel (an upstream's question is an open request to the replica that forwarded its call),
//! so a retry that reaches another replica is handed to the one that parked the call
//! ([`crate::handoff`]), named by the seal; one whose replica stopped is refused with what to
//! do. Each is used once and expires after [`INPUT_WAIT`]; an expired question is answered
//! with an error, which the asker (the upstream server, or the approval gate) turns into its
//! own outcome. At most [`PARKED_CALLS_MAX`] calls wait at once.

use crate::delivery::Answer;
use crate::limits::{INPUT_BATCH_GRACE, INPUT_WAIT, PARKED_CALLS_MAX, QUESTIONS_PER_CALL_MAX};
use crate::rpc::{code, error_object};
use rmcp::model::ErrorData;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What an asker receives: the client's result, or a JSON-RPC error object.
pub type Reply = Result<Value, Value>;

/// One question for the client: a request it would have received in the sessionful era.
pub struct Question {
    pub method: String,
    pub params: Option<Value>,
    pub answer: oneshot::Sender<Reply>,
}

/// The asking side, held by the call's downstream relay.
#[derive(Clone)]
pub struct Asker(mpsc::Sender<Question>);

impl Asker {
    /// Asks the client through the call's `input_required` result and waits for the answer on
    /// its retry (at most [`INPUT_WAIT`]).
    pub async fn ask(&self, method: &str, params: Option<Value>) -> Reply {
        let (tx, rx) = oneshot::channel();
        let question = Question {
            method: method.to_string(),
            params,
            answer: tx,
        };
        let gone = || {
            error_object(
                code::INTERNAL_ERROR,
                format!("{method}: the client's call is no longer waiting for an answer"),
            )
        };
        self.0.send(question).await.map_err(|_| gone())?;
        match tokio::time::timeout(INPUT_WAIT, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) | Err(_) => Err(error_object(
                code::INTERNAL_ERROR,
                format!(
                    "{method}: the client did not answer within {} s (the question expired)",
                    INPUT_WAIT.as_secs()
                ),
            )),
        }
    }
}

/// Points a call's downstream (progress, logs) at the request that answers it now.
pub trait Retarget: Send + Sync {
    fn retarget(&self, peer: rmcp::Peer<rmcp::RoleServer>, progress_token: Option<Value>);
}

/// A call of the 2026-07-28 era whose round runs in the background.
pub struct Pending {
    relay: Arc<dyn Retarget>,
    binding: String,
    done: JoinHandle<Result<Answer, ErrorData>>,
    questions: mpsc::Receiver<Question>,
    /// Cancels the round (the client abandoned the call).
    cancel: CancellationToken,
    /// Questions sent to the client, by key, waiting for its retry.
    open: BTreeMap<String, oneshot::Sender<Reply>>,
    asked: u64,
    parked_at: Option<Instant>,
}

/// What one step of a pending call produced.
pub enum Step {
    /// The call finished: its result (or protocol error).
    Done(Result<Answer, ErrorData>),
    /// The call asks the client: an `input_required` result.
    Asked(Value),
}

impl Step {
    pub fn into_result(self) -> Result<Answer, ErrorData> {
        match self {
            Step::Done(r) => r,
            Step::Asked(v) => Ok(Answer::from(v)),
        }
    }
}

/// The channel a call's relay asks through, and the receiving end for [`Pending::start`].
pub fn channel() -> (Asker, mpsc::Receiver<Question>) {
    let (tx, rx) = mpsc::channel(QUESTIONS_PER_CALL_MAX);
    (Asker(tx), rx)
}

/// What binds a `requestState` to one call of one client: the tool, its arguments and who
/// asked (`principal`: the HTTP request's principal, or the stdio session's scope).
pub fn binding(tool: &str, arguments: Option<&Map<String, Value>>, principal: &str) -> String {
    let args = arguments
        .map(|a| Value::Object(a.clone()))
        .unwrap_or_else(|| json!({}));
    let canonical =
        ring0_core::canonical::canonical_string(&args).unwrap_or_else(|_| args.to_string());
    let mut h = Sha256::new();
    for part in [tool, &canonical, principal] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Pending {
    /// A call whose round is `done`, asking through `questions`.
    pub fn start(
        binding: String,
        done: JoinHandle<Result<Answer, ErrorData>>,
        questions: mpsc::Receiver<Question>,
        cancel: CancellationToken,
        relay: Arc<dyn Retarget>,
    ) -> Self {
        Self {
            relay,
            binding,
            done,
            questions,
            cancel,
            open: BTreeMap::new(),
            asked: 0,
            parked_at: None,
        }
    }

    /// Reports the call's progress to a retry's stream from now on.
    pub fn retarget(&self, peer: rmcp::Peer<rmcp::RoleServer>, progress_token: Option<Value>) {
        self.relay.retarget(peer, progress_token);
    }

    /// Runs the call until it finishes or asks the client; a question parks the call in
    /// `parked` and returns the `input_required` result. `client_gone` is the downstream
    /// request's cancellation: the client closed its stream, so the call is cancelled.
    pub async fn step(mut self, parked: &Parked, client_gone: &CancellationToken) -> Step {
        let mut questions_open = true;
        loop {
            enum Event {
                Done(Result<Answer, ErrorData>),
                Question(Option<Question>),
                Gone,
            }
            let event = tokio::select! {
                r = &mut self.done => Event::Done(r.unwrap_or_else(|e| Err(ErrorData::internal_error(format!("the call failed: {e}"), None)))),
                q = self.questions.recv(), if questions_open => Event::Question(q),
                _ = client_gone.cancelled() => Event::Gone,
            };
            match event {
                Event::Done(r) => return Step::Done(r),
                Event::Gone => {
                    self.cancel.cancel();
                    let r = (&mut self.done).await;
                    return Step::Done(r.unwrap_or_else(|e| {
                        Err(ErrorData::internal_error(
                            format!("the call failed: {e}"),
                            None,
                        ))
                    }));
                }
                // Every asker is gone (the round is finishing): only the result is left.
                Event::Question(None) => questions_open = false,
                Event::Question(Some(first)) => {
                    let mut batch = vec![first];
                    // Questions asked together (an upstream's several input requests) go out
                    // in one result.
                    while batch.len() < QUESTIONS_PER_CALL_MAX {
                        match tokio::time::timeout(INPUT_BATCH_GRACE, self.questions.recv()).await {
                            Ok(Some(q)) => batch.push(q),
                            Ok(None) | Err(_) => break,
                        }
                    }
                    let mut requests = Map::new();
                    for q in batch {
                        self.asked += 1;
                        let key = format!("q{}", self.asked);
                        let mut request = json!({"method": q.method});
                        if let Some(p) = q.params {
                            request["params"] = p;
                        }
                        requests.insert(key.clone(), request);
                        self.open.insert(key, q.answer);
                    }
                    match parked.park(self) {
                        Ok(state) => {
                            return Step::Asked(json!({
                                "resultType": "input_required",
                                "inputRequests": requests,
                                "requestState": state,
                            }));
                        }
                        Err(mut back) => {
                            for (_, tx) in std::mem::take(&mut back.open) {
                                let _ = tx.send(Err(error_object(
                                    code::INTERNAL_ERROR,
                                    format!(
                                        "ring0 has {PARKED_CALLS_MAX} calls waiting for their clients' answers; the question cannot be asked now"
                                    ),
                                )));
                            }
                            self = back;
                        }
                    }
                }
            }
        }
    }
}

/// The prefix of every `requestState` ring0 issues (version 1 of the format).
const STATE_PREFIX: &str = "r0s1.";
/// Longest `requestState` read: a longer one is refused unread.
pub const REQUEST_STATE_BYTES_MAX: usize = 1024;

/// What a `requestState` says, once its tag is checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sealed {
    /// The parked call, on the replica that parked it.
    pub id: String,
    /// The replica that parked it (0 for a process that shares nothing).
    pub replica: u64,
    /// The call and principal it answers ([`binding`]).
    pub binding: String,
    /// When it expires, in milliseconds since the epoch.
    pub expires_ms: u64,
}

/// Why a `requestState` was refused before any lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsealed {
    /// Not one ring0 issued: malformed, forged, or altered.
    Forged,
    /// Issued, but past its expiry.
    Expired,
}

/// Signs and checks `requestState`s: the key every replica shares and this replica's number.
pub struct Seal {
    key: ring::hmac::Key,
    replica: u64,
}

impl Seal {
    /// A seal under `key` for `replica`.
    pub fn new(key: &[u8], replica: u64) -> Self {
        Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
            replica,
        }
    }

    /// A seal of a process that shares nothing: a random key of its own, replica 0.
    pub fn private() -> Self {
        let mut key = Vec::with_capacity(32);
        key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        Self::new(&key, 0)
    }

    /// This replica's number.
    pub fn replica(&self) -> u64 {
        self.replica
    }

    fn seal(&self, sealed: &Sealed) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = b64.encode(serde_json::to_vec(sealed).expect("a state serializes"));
        let tag = ring::hmac::sign(&self.key, payload.as_bytes());
        format!("{STATE_PREFIX}{payload}.{}", b64.encode(tag.as_ref()))
    }

    /// What `state` says, if ring0 issued it under this key and it has not expired.
    pub fn open(&self, state: &str) -> Result<Sealed, Unsealed> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        if state.len() > REQUEST_STATE_BYTES_MAX {
            return Err(Unsealed::Forged);
        }
        let (payload, tag) = state
            .strip_prefix(STATE_PREFIX)
            .and_then(|rest| rest.split_once('.'))
            .ok_or(Unsealed::Forged)?;
        let tag = b64.decode(tag).map_err(|_| Unsealed::Forged)?;
        // Constant-time comparison of the tag.
        ring::hmac::verify(&self.key, payload.as_bytes(), &tag).map_err(|_| Unsealed::Forged)?;
        let bytes = b64.decode(payload).map_err(|_| Unsealed::Forged)?;
        let sealed: Sealed = serde_json::from_slice(&bytes).map_err(|_| Unsealed::Forged)?;
        if now_ms() >= sealed.expires_ms {
            return Err(Unsealed::Expired);
        }
        Ok(sealed)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn refusal(state: Unsealed) -> ErrorData {
    ErrorData::invalid_params(
        match state {
            Unsealed::Forged => {
                "requestState is not one ring0 issued (malformed, forged or altered); call the tool again without it"
            }
            Unsealed::Expired => {
                "requestState expired (each is kept for a limited time); call the tool again without it"
            }
        },
        None,
    )
}

/// Calls parked until their clients answer, by `requestState`. Expired calls are dropped
/// whenever a call is parked or resumed (their askers' own wait ends at the same bound).
#[derive(Clone)]
pub struct Parked {
    calls: Arc<Mutex<HashMap<String, Pending>>>,
    seal: Arc<RwLock<Arc<Seal>>>,
    ttl: Duration,
}

impl Default for Parked {
    fn default() -> Self {
        Self::with_ttl(INPUT_WAIT)
    }
}

impl Parked {
    /// A registry whose calls expire after `ttl` ([`INPUT_WAIT`] by default), sealing under a
    /// key of its own until [`Parked::share`].
    pub fn with_ttl(ttl: Duration) -> Self {
        Self {
            calls: Arc::new(Mutex::new(HashMap::new())),
            seal: Arc::new(RwLock::new(Arc::new(Seal::private()))),
            ttl,
        }
    }

    /// Seals from now on with the deployment's shared key, as `replica` (before serving).
    pub fn share(&self, seal: Seal) {
        *self.seal.write().expect("seal") = Arc::new(seal);
    }

    /// The seal in use.
    pub fn seal(&self) -> Arc<Seal> {
        self.seal.read().expect("seal").clone()
    }

    fn sweep(&self, calls: &mut HashMap<String, Pending>) {
        calls.retain(|_, p| p.parked_at.is_some_and(|at| at.elapsed() < self.ttl));
    }

    fn park(&self, mut pending: Pending) -> Result<String, Pending> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let seal = self.seal();
        let state = seal.seal(&Sealed {
            id: id.clone(),
            replica: seal.replica(),
            binding: pending.binding.clone(),
            expires_ms: now_ms().saturating_add(self.ttl.as_millis() as u64),
        });
        let mut calls = self.calls.lock().expect("parked");
        self.sweep(&mut calls);
        if calls.len() >= PARKED_CALLS_MAX {
            return Err(pending);
        }
        pending.parked_at = Some(Instant::now());
        calls.insert(id, pending);
        Ok(state)
    }

    /// How many calls wait for their clients now.
    pub fn len(&self) -> usize {
        self.calls.lock().expect("parked").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The replica holding the call `state` names, when the state is sound and that replica is
    /// another one (a retry to hand over, [`crate::handoff`]).
    pub fn elsewhere(&self, state: &str) -> Option<u64> {
        let seal = self.seal();
        seal.open(state)
            .ok()
            .map(|s| s.replica)
            .filter(|r| *r != seal.replica())
    }

    /// Takes the call a retry names and hands it the client's answers. A state that is not
    /// ring0's, expired, bound to another call or client, parked by another replica, or unknown
    /// (used already) is refused, and a call parked for someone else stays parked.
    pub fn resume(
        &self,
        state: &str,
        binding: &str,
        responses: &BTreeMap<String, Value>,
    ) -> Result<Pending, ErrorData> {
        // Expired calls go first, whatever this retry names: their askers hear it now.
        self.sweep(&mut self.calls.lock().expect("parked"));
        let seal = self.seal();
        let sealed = seal.open(state).map_err(refusal)?;
        if sealed.binding != binding {
            return Err(ErrorData::invalid_params(
                "requestState was issued for a different call or principal; retry with the same tool and arguments",
                None,
            ));
        }
        if sealed.replica != seal.replica() {
            return Err(ErrorData::invalid_params(
                format!(
                    "requestState names a call parked by replica {}, which cannot be reached (it stopped, or its lease lapsed); call the tool again without it",
                    sealed.replica
                ),
                None,
            ));
        }
        let mut pending = {
            let mut calls = self.calls.lock().expect("parked");
            self.sweep(&mut calls);
            match calls.get(&sealed.id) {
                None => {
                    return Err(ErrorData::invalid_params(
                        "requestState is unknown or expired (each is used once and kept for a limited time); call the tool again without it",
                        None,
                    ));
                }
                // The seal bound the state to this call; the parked call agrees.
                Some(p) if p.binding != binding => {
                    return Err(ErrorData::invalid_params(
                        "requestState was issued for a different call or principal; retry with the same tool and arguments",
                        None,
                    ));
                }
                Some(_) => calls.remove(&sealed.id).expect("present"),
            }
        };
        for (key, tx) in std::mem::take(&mut pending.open) {
            let reply = match responses.get(&key) {
                Some(answer) => Ok(answer.clone()),
                None => Err(error_object(
                    code::INVALID_PARAMS,
                    format!("the client's retry carried no answer for input request {key:?}"),
                )),
            };
            let _ = tx.send(reply);
        }
        Ok(pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoRelay;
    impl Retarget for NoRelay {
        fn retarget(&self, _: rmcp::Peer<rmcp::RoleServer>, _: Option<Value>) {}
    }

    fn no_relay() -> Arc<dyn Retarget> {
        Arc::new(NoRelay)
    }

    fn finished(v: Value) -> JoinHandle<Result<Answer, ErrorData>> {
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            Ok(Answer::from(v))
        })
    }

    #[tokio::test]
    async fn a_question_parks_the_call_and_the_retry_gets_the_answer_and_the_result() {
        let parked = Parked::default();
        let (asker, rx) = channel();
        let round = tokio::spawn(async move {
            let answer = asker
                .ask("elicitation/create", Some(json!({"message": "ok?"})))
                .await;
            Ok(Answer::from(json!({"answer": answer.unwrap()})))
        });
        let gone = CancellationToken::new();
        let pending = Pending::start("b".into(), round, rx, CancellationToken::new(), no_relay());
        let Step::Asked(first) = pending.step(&parked, &gone).await else {
            panic!("expected a question")
        };
        assert_eq!(first["resultType"], "input_required");
        assert_eq!(first["inputRequests"]["q1"]["method"], "elicitation/create");
        let state = first["requestState"].as_str().unwrap().to_string();
        assert_eq!(parked.len(), 1);
        let answers = BTreeMap::from([("q1".to_string(), json!({"action": "accept"}))]);
        let pending = parked.resume(&state, "b", &answers).unwrap();
        let Step::Done(Ok(result)) = pending.step(&parked, &gone).await else {
            panic!("expected the result")
        };
        assert_eq!(result.value["answer"]["action"], "accept");
        assert!(
            parked.resume(&state, "b", &answers).is_err(),
            "a state is used once"
        );
    }

    #[tokio::test]
    async fn a_state_bound_to_another_call_is_refused_and_stays_parked() {
        let parked = Parked::default();
        let (asker, rx) = channel();
        let round = tokio::spawn(async move {
            let _ = asker.ask("roots/list", None).await;
            Ok(Answer::from(json!({})))
        });
        let pending = Pending::start(
            "mine".into(),
            round,
            rx,
            CancellationToken::new(),
            no_relay(),
        );
        let Step::Asked(first) = pending.step(&parked, &CancellationToken::new()).await else {
            panic!("expected a question")
        };
        let state = first["requestState"].as_str().unwrap();
        let err = parked
            .resume(state, "theirs", &BTreeMap::new())
            .err()
            .unwrap();
        assert!(err.message.contains("different call"), "{}", err.message);
        assert_eq!(parked.len(), 1);
        let err = parked
            .resume("r0s-guess", "mine", &BTreeMap::new())
            .err()
            .unwrap();
        assert!(
            err.message.contains("not one ring0 issued"),
            "{}",
            err.message
        );
        assert_eq!(parked.len(), 1);
    }

    fn parked_state(parked: &Parked) -> String {
        let (asker, rx) = channel();
        let round = tokio::spawn(async move {
            let _ = asker.ask("roots/list", None).await;
            Ok(Answer::from(json!({})))
        });
        let pending = Pending::start(
            "mine".into(),
            round,
            rx,
            CancellationToken::new(),
            no_relay(),
        );
        let rt = tokio::runtime::Handle::current();
        let step = tokio::task::block_in_place(|| {
            rt.block_on(pending.step(parked, &CancellationToken::new()))
        });
        let Step::Asked(first) = step else {
            panic!("expected a question")
        };
        first["requestState"].as_str().unwrap().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_altered_or_foreign_state_is_refused_before_any_lookup() {
        let parked = Parked::default();
        parked.share(Seal::new(&[7; 32], 1));
        let state = parked_state(&parked);
        // Each character of the payload or tag changed in turn: never accepted.
        let body = &state[STATE_PREFIX.len()..];
        for i in [0, body.len() / 2, body.len() - 1] {
            let mut altered: Vec<char> = body.chars().collect();
            altered[i] = if altered[i] == 'A' { 'B' } else { 'A' };
            let altered: String = altered.into_iter().collect();
            let err = parked
                .resume(
                    &format!("{STATE_PREFIX}{altered}"),
                    "mine",
                    &BTreeMap::new(),
                )
                .err()
                .unwrap();
            assert!(
                err.message.contains("not one ring0 issued"),
                "{}",
                err.message
            );
        }
        // Signed under another key (another deployment): refused.
        let other = Parked::default();
        other.share(Seal::new(&[8; 32], 1));
        assert_eq!(other.seal().open(&state), Err(Unsealed::Forged));
        // The same key on replica 2: another replica's call, to hand over.
        let peer = Parked::default();
        peer.share(Seal::new(&[7; 32], 2));
        assert_eq!(peer.elsewhere(&state), Some(1));
        assert_eq!(parked.elsewhere(&state), None);
        let err = peer.resume(&state, "mine", &BTreeMap::new()).err().unwrap();
        assert!(err.message.contains("replica 1"), "{}", err.message);
        // Bound to the call and principal: another binding is refused even by the owner.
        let err = parked
            .resume(&state, "theirs", &BTreeMap::new())
            .err()
            .unwrap();
        assert!(err.message.contains("different call"), "{}", err.message);
        assert!(parked.resume(&state, "mine", &BTreeMap::new()).is_ok());
    }

    #[tokio::test]
    async fn a_call_that_asks_nothing_returns_its_result() {
        let (_asker, rx) = channel();
        let pending = Pending::start(
            "b".into(),
            finished(json!({"ok": true})),
            rx,
            CancellationToken::new(),
            no_relay(),
        );
        let step = pending
            .step(&Parked::default(), &CancellationToken::new())
            .await;
        assert_eq!(step.into_result().unwrap().value["ok"], true);
    }

    #[tokio::test]
    async fn an_expired_question_cannot_be_answered_and_its_asker_gets_an_error() {
        let parked = Parked::with_ttl(Duration::from_millis(10));
        let (asker, rx) = channel();
        let (seen_tx, seen_rx) = oneshot::channel();
        let round = tokio::spawn(async move {
            let reply = asker.ask("elicitation/create", None).await;
            let _ = seen_tx.send(reply);
            Ok(Answer::from(json!({})))
        });
        let pending = Pending::start("b".into(), round, rx, CancellationToken::new(), no_relay());
        let Step::Asked(first) = pending.step(&parked, &CancellationToken::new()).await else {
            panic!("expected a question")
        };
        let state = first["requestState"].as_str().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let err = parked.resume(state, "b", &BTreeMap::new()).err().unwrap();
        assert!(err.message.contains("expired"), "{}", err.message);
        assert_eq!(parked.seal().open(state), Err(Unsealed::Expired));
        let reply = tokio::time::timeout(Duration::from_secs(10), seen_rx)
            .await
            .expect("the asker is answered")
            .unwrap();
        let error = reply.unwrap_err();
        assert!(
            error["message"].as_str().unwrap().contains("expired"),
            "{error}"
        );
        assert!(parked.is_empty());
    }

    #[tokio::test]
    async fn the_clients_cancellation_cancels_a_call_waiting_for_its_first_step() {
        let (_asker, rx) = channel();
        let cancel = CancellationToken::new();
        let round_cancel = cancel.clone();
        let round = tokio::spawn(async move {
            round_cancel.cancelled().await;
            Ok(Answer::from(json!({"cancelled": true})))
        });
        let gone = CancellationToken::new();
        gone.cancel();
        let step = Pending::start("b".into(), round, rx, cancel, no_relay())
            .step(&Parked::default(), &gone)
            .await;
        assert_eq!(step.into_result().unwrap().value["cancelled"], true);
    }

    #[test]
    fn bindings_differ_by_tool_arguments_and_principal() {
        let a = Map::from_iter([("x".to_string(), json!(1))]);
        let b = Map::from_iter([("x".to_string(), json!(2))]);
        let base = binding("t", Some(&a), "p");
        assert_eq!(base, binding("t", Some(&a.clone()), "p"));
        assert_ne!(base, binding("u", Some(&a), "p"));
        assert_ne!(base, binding("t", Some(&b), "p"));
        assert_ne!(base, binding("t", Some(&a), "q"));
    }
}
