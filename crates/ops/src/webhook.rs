//! The webhook approval channel: each held call is POSTed to a configured URL with an approve
//! and a deny link. A link is signed (HMAC-SHA256 under a key kept in the state directory) over
//! the approval id, the action, the principal, the tool, the prepared arguments' fingerprint and
//! its expiry, so it decides that call and no other; it expires with the held call; and it is
//! one-time, because the decision is a compare-and-set on the held call in the journal
//! (`ring0_journal::Journal::hold_decide`).
//!
//! The links point at ring0's own HTTP listener: `GET` shows what the link would decide (a page
//! with one button, so a link preview or prefetch never decides anything), `POST` decides.
//! The journal records the decision; the waiting call (or, after a restart, the held-call
//! watcher in [`crate::held`]) acts on it.

use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use ring0_journal::{HeldCall, HoldDecided, HoldState, Journal};
use serde_json::json;
use sha2::Sha256;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The links' route on the HTTP listener: `/approvals/{id}/{approve|deny}`.
pub const LINK_ROUTE: &str = "/approvals/{id}/{action}";
/// The key file in the state directory.
pub const KEY_FILE: &str = "webhook.key";
/// How long one POST to the receiver may take.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest summary sent in a POST or shown on a link's page.
pub const SUMMARY_SHOWN_BYTES_MAX: usize = 4096;
/// Separates the signed fields' domain from every other MAC ring0 makes.
const DOMAIN: &[u8] = b"ring0-approval-link-v1\0";

type HmacSha256 = Hmac<Sha256>;

/// A decision a link makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkAction {
    Approve,
    Deny,
}

impl LinkAction {
    fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Deny => "deny",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "approve" => Some(Self::Approve),
            "deny" => Some(Self::Deny),
            _ => None,
        }
    }
}

/// The webhook channel of one running server.
pub struct Webhook {
    url: String,
    /// Set once the listener is bound when not configured (`--http 127.0.0.1:0`).
    link_base: std::sync::OnceLock<String>,
    key: Vec<u8>,
    client: reqwest::Client,
    journal: Arc<dyn Journal>,
    log: ring0_mcp::Log,
}

/// The signing key `file` under `state_dir` ([`KEY_FILE`] for the links), created (private) on
/// first use, so links stay valid across a restart (`ring0_shape::keyfile`, as every signing key
/// of ring0's).
pub fn signing_key(state_dir: &Path, file: &str) -> Result<Vec<u8>, String> {
    let path = state_dir.join(file);
    ring0_shape::keyfile::load_or_create(&path)
        .map(Vec::from)
        .map_err(|e| format!("{}: {e}", path.display()))
}

impl Webhook {
    /// POSTs to `url`; links start with `link_base` (`http://host:port`), or, when `None`,
    /// with what [`Webhook::listening_on`] is told.
    pub fn new(
        url: String,
        link_base: Option<String>,
        key: Vec<u8>,
        journal: Arc<dyn Journal>,
        log: ring0_mcp::Log,
    ) -> Result<Self, String> {
        let client = ring0_mcp::upstream::http::client()?;
        let base = std::sync::OnceLock::new();
        if let Some(link_base) = link_base {
            let _ = base.set(link_base.trim_end_matches('/').to_string());
        }
        Ok(Self {
            url,
            link_base: base,
            key,
            client,
            journal,
            log,
        })
    }

    /// The listener's bound address, the links' base unless one was configured.
    pub fn listening_on(&self, addr: std::net::SocketAddr) {
        let _ = self.link_base.set(format!("http://{addr}"));
    }

    fn mac(&self, held: &HeldCall, action: LinkAction, expires_ms: u64) -> HmacSha256 {
        // HMAC takes keys of any length.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| <HmacSha256 as KeyInit>::new(&Default::default()));
        mac.update(DOMAIN);
        for field in [
            held.approval_id.as_str(),
            action.as_str(),
            held.principal.as_str(),
            held.tool.as_str(),
            held.args_hash.as_str(),
        ] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field.as_bytes());
        }
        mac.update(&expires_ms.to_be_bytes());
        mac
    }

    /// The signed link deciding `held` with `action`.
    pub fn link(&self, held: &HeldCall, action: LinkAction) -> String {
        let sig = hex(&self
            .mac(held, action, held.deadline_ms)
            .finalize()
            .into_bytes());
        format!(
            "{}/approvals/{}/{}?exp={}&sig={sig}",
            self.link_base.get().map_or("", String::as_str),
            held.approval_id,
            action.as_str(),
            held.deadline_ms
        )
    }

    fn verify(&self, held: &HeldCall, action: LinkAction, link: &LinkQuery) -> bool {
        let Some(sig) = unhex(&link.sig) else {
            return false;
        };
        self.mac(held, action, link.exp).verify_slice(&sig).is_ok()
    }

    /// Offers `held` to the receiver: one POST, bounded by [`POST_TIMEOUT`]; a failure is
    /// logged (the other channels still decide).
    pub async fn offer(&self, held: &HeldCall) {
        let body = json!({
            "approval_id": held.approval_id,
            "tool": held.tool,
            "principal": held.principal,
            "args_hash": held.args_hash,
            "summary": ring0_core::text::truncate_utf8(&held.summary, SUMMARY_SHOWN_BYTES_MAX),
            "deadline_ms": held.deadline_ms,
            "approve_url": self.link(held, LinkAction::Approve),
            "deny_url": self.link(held, LinkAction::Deny),
        });
        let sent = self
            .client
            .post(&self.url)
            .timeout(POST_TIMEOUT)
            .json(&body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => self.log.line(&format!(
                "approval {}: the webhook answered {}",
                held.approval_id,
                r.status()
            )),
            Err(e) => self.log.line(&format!(
                "approval {}: the webhook could not be reached: {e}",
                held.approval_id
            )),
        }
    }

    /// The links' routes, for the HTTP listener's open side: the signature is their credential.
    pub fn routes(self: &Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route(LINK_ROUTE, axum::routing::get(show).post(decide))
            .with_state(self.clone())
    }

    /// Checks a link against the held call it names: the held call, or the refusal to answer.
    async fn checked(
        &self,
        id: &str,
        action: &str,
        link: &LinkQuery,
    ) -> Result<(HeldCall, LinkAction), Response> {
        let refuse = |status: StatusCode, why: &str| {
            (
                status,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("{why}\n"),
            )
                .into_response()
        };
        let Some(action) = LinkAction::parse(action) else {
            return Err(refuse(StatusCode::NOT_FOUND, "no such link"));
        };
        let held = match self.journal.hold_get(id).await {
            Ok(Some(held)) => held,
            Ok(None) => return Err(refuse(StatusCode::NOT_FOUND, "no such approval")),
            Err(e) => {
                self.log.line(&format!("approval link {id}: {e}"));
                return Err(refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the journal did not answer",
                ));
            }
        };
        if !self.verify(&held, action, link) {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                "this link is not valid for this approval",
            ));
        }
        if crate::held::now_ms() >= link.exp {
            return Err(refuse(StatusCode::GONE, "this link has expired"));
        }
        Ok((held, action))
    }
}

/// A link's query: its expiry and signature.
#[derive(Debug)]
pub struct LinkQuery {
    exp: u64,
    sig: String,
}

impl LinkQuery {
    /// `exp=…&sig=…`, nothing else read; `None` when either is missing or malformed.
    fn parse(query: Option<&str>) -> Option<Self> {
        let (mut exp, mut sig) = (None, None);
        for pair in query?.split('&').take(8) {
            match pair.split_once('=') {
                Some(("exp", v)) => exp = v.parse().ok(),
                Some(("sig", v)) if v.len() <= 128 => sig = Some(v.to_string()),
                _ => {}
            }
        }
        Some(Self {
            exp: exp?,
            sig: sig?,
        })
    }
}

fn malformed() -> Response {
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "the link is malformed: it needs its exp and sig\n",
    )
        .into_response()
}

async fn show(
    State(hook): State<Arc<Webhook>>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(link) = LinkQuery::parse(query.as_deref()) else {
        return malformed();
    };
    let (held, action) = match hook.checked(&id, &action, &link).await {
        Ok(ok) => ok,
        Err(refused) => return refused,
    };
    let esc = crate::html::escape;
    let page = format!(
        "<!doctype html><meta charset=utf-8><title>ring0: {verb} {tool}</title>\
         <h1>{verb} this call?</h1><p>{state}</p><pre>{summary}</pre>\
         <form method=post action=\"?exp={exp}&amp;sig={sig}\"><button>{verb}</button></form>",
        verb = if action == LinkAction::Approve {
            "Approve"
        } else {
            "Deny"
        },
        tool = esc(&held.tool),
        state = esc(held.state.as_str()),
        summary = esc(ring0_core::text::truncate_utf8(
            &held.summary,
            SUMMARY_SHOWN_BYTES_MAX
        )),
        exp = link.exp,
        sig = esc(&link.sig),
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; form-action 'self'",
            ),
        ],
        page,
    )
        .into_response()
}

async fn decide(
    State(hook): State<Arc<Webhook>>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(link) = LinkQuery::parse(query.as_deref()) else {
        return malformed();
    };
    let (held, action) = match hook.checked(&id, &action, &link).await {
        Ok(ok) => ok,
        Err(refused) => return refused,
    };
    let state = match action {
        LinkAction::Approve => HoldState::Approved {
            by: "webhook".into(),
            for_session: false,
        },
        LinkAction::Deny => HoldState::Denied {
            by: "webhook".into(),
            reason: "denied through the webhook link".into(),
        },
    };
    let (status, text) = match hook.journal.hold_decide(&held.approval_id, state).await {
        Ok(HoldDecided::Decided(h)) => (
            StatusCode::OK,
            format!("{} {}: {}", h.approval_id, h.state.as_str(), h.tool),
        ),
        Ok(HoldDecided::AlreadyDecided(h)) => (
            StatusCode::CONFLICT,
            format!(
                "{} was already decided ({})",
                h.approval_id,
                h.state.as_str()
            ),
        ),
        Ok(HoldDecided::Lapsed(h)) => (
            StatusCode::GONE,
            format!("{} expired before this decision", h.approval_id),
        ),
        Ok(HoldDecided::NotFound) => (StatusCode::NOT_FOUND, "no such approval".into()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("the journal: {e}")),
    };
    hook.log.line(&format!("approval link: {text}"));
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
