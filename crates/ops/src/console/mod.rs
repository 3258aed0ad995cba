//! The web console at `/console`, for principals with the operator role: the calls held for
//! approval (approve, deny), the quarantined upstream tools (the definition's diff, approve),
//! the dead letters (mark applied, mark not applied, compensate) and
//! the journal (filtered by state, tool, principal — of calls made under an idempotency key,
//! the only ones whose principal the journal records — and time).
//!
//! Server-rendered HTML, served behind the console's own door ([`door`]: the listener's bearer
//! credentials, or a browser's session cookie from `/console/login`); a principal without the
//! operator role (`[console]`) is refused `403`, and is never given a session. Every value from the journal is written through
//! [`crate::html::escape`]; a page's Content-Security-Policy allows no script at all, except a
//! job's page ([`jobs`]), which runs ring0's own live-tail script by a nonce. Each form
//! carries a CSRF token (HMAC of the principal under a key in the state directory) that a POST
//! must return. A decision goes through the same functions as the other channels: the held
//! call's record in the journal ([`ring0_journal::Journal::hold_decide`], decided once) and
//! [`crate::operator`].

pub mod door;
pub mod jobs;

use crate::html::escape;
use crate::operator;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, KeyInit, Mac};
use ring0_core::{IntentState, Principal};
use ring0_journal::{HoldDecided, HoldState, IntentRecord, PersonFinding};
use ring0_mcp::Gateway;
use sha2::Sha256;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

/// The console's root.
pub const CONSOLE_PATH: &str = "/console";
/// The key file for CSRF tokens in the state directory.
pub const KEY_FILE: &str = "console.key";
/// Most journal records one page shows.
pub const JOURNAL_ROWS_MAX: usize = 200;
/// Longest text of one cell (arguments, a summary, a note) on a page.
pub const CELL_BYTES_MAX: usize = 2048;
/// Largest form body read.
const FORM_BYTES_MAX: usize = 4096;
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'";

/// Who may use the console.
#[derive(Debug, Clone)]
pub struct Operators {
    /// Principal ids with the operator role.
    pub ids: Vec<String>,
    /// Groups with the operator role.
    pub groups: Vec<String>,
}

impl Operators {
    /// Whether `p` has the operator role: its id is listed, or one of its groups.
    pub fn admit(&self, p: &Principal) -> bool {
        self.ids.contains(&p.id) || p.groups.iter().any(|g| self.groups.contains(g))
    }
}

/// The console of one running server.
pub struct Console {
    gateway: Gateway,
    operators: Operators,
    key: Vec<u8>,
    log: ring0_mcp::Log,
    /// Where `ring0.lock` (approved definitions) and the pending ones are.
    workspace: PathBuf,
    state_dir: PathBuf,
    /// The background jobs the shell tool started, when this server runs any.
    jobs: Option<ring0_tools::JobSessions>,
    /// Browsers signed in at `/console/login`.
    sessions: door::BrowserSessions,
}

impl Console {
    /// `key` signs the forms' CSRF tokens (see [`crate::webhook::signing_key`]); `workspace`
    /// and `state_dir` hold the approved and the quarantined upstream definitions.
    pub fn new(
        gateway: Gateway,
        operators: Operators,
        key: Vec<u8>,
        log: ring0_mcp::Log,
        workspace: PathBuf,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            gateway,
            operators,
            key,
            log,
            workspace,
            state_dir,
            jobs: None,
            sessions: door::BrowserSessions::default(),
        }
    }

    /// The console as the HTTP listener serves it: its pages behind its own door (a bearer
    /// credential checked by the listener's authenticator, or a browser's session cookie; see
    /// [`door`]), with the sign-in form and sign-out beside them.
    pub fn door(self: &Arc<Self>) -> ring0_mcp::door::operations::SelfAuthenticated {
        let console = self.clone();
        Arc::new(move |auth| {
            let gate = door::Door {
                console: console.clone(),
                auth,
            };
            let pages = console.routes().layer(axum::middleware::from_fn_with_state(
                gate.clone(),
                door::authenticate,
            ));
            let sign = axum::Router::new()
                .route(
                    door::LOGIN_PATH,
                    axum::routing::get(door::login_form).post(door::login),
                )
                .route(door::LOGOUT_PATH, axum::routing::post(door::logout))
                .with_state(gate);
            pages.merge(sign)
        })
    }

    /// Shows `jobs`, the server's background jobs, at `/console/jobs`.
    pub fn with_jobs(mut self, jobs: ring0_tools::JobSessions) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// The console's pages, for a door that puts the request's `Principal` in its extensions
    /// (the listener's authenticated side, or [`Console::door`]).
    pub fn routes(self: &Arc<Self>) -> axum::Router {
        jobs::routes(axum::Router::new())
            .route(CONSOLE_PATH, axum::routing::get(home))
            .route("/console/journal", axum::routing::get(journal))
            .route(
                "/console/approvals/{id}/{action}",
                axum::routing::post(decide_held),
            )
            .route(
                "/console/intents/{id}/{action}",
                axum::routing::post(settle),
            )
            .route("/console/tools", axum::routing::get(tools))
            .route("/console/tools/approve", axum::routing::post(approve_tool))
            .with_state(self.clone())
    }

    fn csrf(&self, p: &Principal) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| <Hmac<Sha256> as KeyInit>::new(&Default::default()));
        mac.update(b"ring0-console-csrf-v1\0");
        mac.update(p.id.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The refusal of a principal that is not an operator or (for a POST) did not return the
    /// CSRF token; `None` lets it through.
    fn refusal(&self, p: &Principal, form: Option<&Bytes>) -> Option<Response> {
        if !self.operators.admit(p) {
            return Some(plain(
                StatusCode::FORBIDDEN,
                "the console is for principals with the operator role ([console] operators)",
            ));
        }
        if let Some(body) = form {
            let sent = form_value(body, "csrf").unwrap_or_default();
            if body.len() > FORM_BYTES_MAX || sent != self.csrf(p) {
                return Some(plain(
                    StatusCode::FORBIDDEN,
                    "the form's token is not valid",
                ));
            }
        }
        None
    }

    fn form(&self, p: &Principal, action: &str, label: &str) -> String {
        format!(
            "<form method=post action=\"{}\"><input type=hidden name=csrf value=\"{}\">\
             <button>{}</button></form>",
            escape(action),
            self.csrf(p),
            escape(label)
        )
    }
}

fn plain(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

fn page(title: &str, body: &str) -> Response {
    page_with_script(title, body, None)
}

/// A console page; with `nonce`, the page may run the scripts carrying it (ring0's own, see
/// [`jobs`]) and fetch from its own origin, and nothing else.
fn page_with_script(title: &str, body: &str, nonce: Option<&str>) -> Response {
    let nav = "<nav><a href=\"/console\">Pending</a><a href=\"/console/tools\">Quarantined tools</a>\
         <a href=\"/console/journal\">Journal</a><a href=\"/console/jobs\">Jobs</a>\
         <form method=post action=\"/console/logout\"><button>Sign out</button></form></nav>";
    document(title, nav, body, nonce)
}

/// A page without the console's navigation (the sign-in form).
fn page_signed_out(title: &str, body: &str) -> Response {
    document(title, "", body, None)
}

fn document(title: &str, nav: &str, body: &str, nonce: Option<&str>) -> Response {
    let csp = match nonce {
        Some(nonce) => format!("{CSP}; script-src 'nonce-{nonce}'; connect-src 'self'"),
        None => CSP.to_string(),
    };
    let html = format!(
        "<!doctype html><html><head><meta charset=utf-8><title>ring0 console: {t}</title>\
         <style>body{{font:14px system-ui;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}}\
         pre{{white-space:pre-wrap;max-width:60em;margin:0}}form{{display:inline}}\
         nav a{{margin-right:1em}}.add{{background:#e6ffec}}.del{{background:#ffebe9}}\
         pre.diff{{margin-top:.5em;border-top:1px dashed #ccc}}\
         pre.tail{{background:#f6f8fa;padding:8px;max-height:40em;overflow:auto}}\
         .problem{{color:#b00}}</style></head><body>{nav}<h1>{t}</h1>{body}</body></html>",
        t = escape(title)
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, csp.as_str()),
        ],
        html,
    )
        .into_response()
}

fn cell(text: &str) -> String {
    escape(ring0_core::text::truncate_utf8(text, CELL_BYTES_MAX))
}

/// The value of `key` in an `application/x-www-form-urlencoded` body or query, decoded.
fn form_value(body: &[u8], key: &str) -> Option<String> {
    std::str::from_utf8(body)
        .ok()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
        .and_then(percent_decoded)
}

/// `+` as a space and `%XX` as its byte; `None` for a malformed escape or text that is not
/// UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn qualified(p: &ring0_mcp::pin::PendingPin) -> String {
    ring0_mcp::names::qualify(&p.alias, &p.tool).unwrap_or_else(|_| p.tool.clone())
}

/// The upstream definitions waiting for approval, each with its diff against the approved one.
async fn tools(State(c): State<Arc<Console>>, Extension(p): Extension<Principal>) -> Response {
    if let Some(refused) = c.refusal(&p, None) {
        return refused;
    }
    let pending = ring0_mcp::pin::pending(&c.state_dir);
    let mut body = String::new();
    if pending.is_empty() {
        body.push_str("<p>No tool is waiting for approval.</p>");
    }
    for waiting in &pending {
        let approved = ring0_mcp::pin_review::approved_pin(&c.workspace, waiting);
        let diff = ring0_mcp::pin_review::diff(&c.state_dir, approved.as_deref(), waiting);
        let name = qualified(waiting);
        let _ = write!(
            body,
            "<h2>{}</h2><p>{} — definition {}</p><pre>{}</pre><pre>{}</pre>\
             <form method=post action=\"/console/tools/approve\">\
             <input type=hidden name=csrf value=\"{}\">\
             <input type=hidden name=name value=\"{}\"><input type=hidden name=pin value=\"{}\">\
             <button>Approve this definition</button></form>",
            escape(&name),
            cell(&waiting.reason),
            escape(&waiting.pin),
            cell(&waiting.changes.join("\n")),
            escape(ring0_core::text::truncate_utf8(&diff, 16 * CELL_BYTES_MAX)),
            c.csrf(&p),
            escape(&name),
            escape(&waiting.pin),
        );
    }
    page("Quarantined tools", &body)
}

/// Approves exactly the definition the person saw (its pin), as `ring0 approve-tool --pin`.
async fn approve_tool(
    State(c): State<Arc<Console>>,
    Extension(p): Extension<Principal>,
    form: Bytes,
) -> Response {
    if let Some(refused) = c.refusal(&p, Some(&form)) {
        return refused;
    }
    let (Some(name), Some(pin)) = (form_value(&form, "name"), form_value(&form, "pin")) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "the form names no tool and definition",
        );
    };
    let waiting = ring0_mcp::pin::pending(&c.state_dir)
        .into_iter()
        .find(|w| qualified(w) == name);
    match waiting {
        None => plain(
            StatusCode::NOT_FOUND,
            "nothing of that name waits for approval",
        ),
        Some(w) if w.pin != pin => plain(
            StatusCode::CONFLICT,
            "another definition waits now; review it again",
        ),
        Some(_) => match ring0_mcp::pin::approve(&c.workspace, &c.state_dir, &name) {
            Ok(done) => {
                c.log.line(&format!(
                    "console: {} approved by {}",
                    done.join(", "),
                    p.id
                ));
                Redirect::to("/console/tools").into_response()
            }
            Err(why) => plain(StatusCode::CONFLICT, &why),
        },
    }
}

async fn home(State(c): State<Arc<Console>>, Extension(p): Extension<Principal>) -> Response {
    if let Some(refused) = c.refusal(&p, None) {
        return refused;
    }
    let journal = c.gateway.journal().clone();
    let mut body = String::from("<h2>Calls waiting for approval</h2>");
    let held = journal.holds_pending().await.unwrap_or_default();
    let now = crate::held::now_ms();
    let held: Vec<_> = held.into_iter().filter(|h| h.is_pending_at(now)).collect();
    if held.is_empty() {
        body.push_str("<p>None.</p>");
    } else {
        body.push_str("<table><tr><th>approval</th><th>tool</th><th>principal</th><th>call</th><th>decide</th></tr>");
        for h in &held {
            let base = format!("/console/approvals/{}", h.approval_id);
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre>{}</td><td>{}{}{}</td></tr>",
                cell(&h.approval_id),
                cell(&h.tool),
                cell(&h.principal),
                cell(&h.summary),
                rendered_change(h),
                c.form(&p, &format!("{base}/approve"), "Approve"),
                match &h.remember {
                    Some(what) => c.form(
                        &p,
                        &format!("{base}/approve-session"),
                        &format!("Allow for {what}"),
                    ),
                    None => String::new(),
                },
                c.form(&p, &format!("{base}/deny"), "Deny"),
            );
        }
        body.push_str("</table>");
    }
    body.push_str(&dead_letters(&c, &p).await);
    page("Pending", &body)
}

/// The dead letters, each with the forms that settle it.
async fn dead_letters(c: &Console, p: &Principal) -> String {
    let mut body = String::new();
    body.push_str("<h2>Dead letters</h2>");
    let records = c
        .gateway
        .journal()
        .recent(ring0_journal::limits::RECENT_LIMIT_MAX)
        .await
        .unwrap_or_default();
    let dead: Vec<&IntentRecord> = records
        .iter()
        .filter(|r| r.state == IntentState::DeadLetter)
        .collect();
    if dead.is_empty() {
        body.push_str("<p>None.</p>");
    } else {
        body.push_str("<table><tr><th>intent</th><th>tool</th><th>arguments</th><th>why</th><th>settle</th></tr>");
        for r in dead {
            let base = format!("/console/intents/{}", r.id);
            let why = r
                .timeline
                .last()
                .and_then(|e| e.note.clone())
                .unwrap_or_default();
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td><pre>{}</pre></td><td>{}</td><td>{}{}{}</td></tr>",
                r.id,
                cell(&r.tool),
                cell(&r.canonical_args),
                cell(&why),
                c.form(p, &format!("{base}/applied"), "Mark applied"),
                c.form(p, &format!("{base}/not-applied"), "Mark not applied"),
                c.form(p, &format!("{base}/compensate"), "Compensate"),
            );
        }
        body.push_str("</table>");
    }
    body
}

/// What a held `apply_patch` or `write_file` would change, as a diff: the patch's lines, or
/// the new content as added lines under the path; empty for any other call. Bounded, escaped.
fn rendered_change(h: &ring0_journal::HeldCall) -> String {
    let Some(args) = &h.arguments else {
        return String::new();
    };
    let text = |key: &str| args.get(key).and_then(serde_json::Value::as_str);
    let lines: Vec<String> = match (h.tool.as_str(), text("patch"), text("content")) {
        ("apply_patch", Some(patch), _) => patch.lines().map(str::to_string).collect(),
        ("write_file", _, Some(content)) => {
            let mut out = vec![format!("+++ {}", text("path").unwrap_or("?"))];
            out.extend(content.lines().map(|l| format!("+{l}")));
            out
        }
        _ => return String::new(),
    };
    let mut html = String::from("<pre class=diff>");
    let mut shown = 0usize;
    for line in lines {
        shown += line.len() + 1;
        if shown > 16 * CELL_BYTES_MAX {
            html.push_str("<span>… (cut)</span>\n");
            break;
        }
        let class = match line.as_bytes().first() {
            Some(b'+') if !line.starts_with("+++") => "add",
            Some(b'-') if !line.starts_with("---") => "del",
            _ => "ctx",
        };
        let _ = writeln!(html, "<span class={class}>{}</span>", escape(&line));
    }
    html.push_str("</pre>");
    html
}

/// The journal's records, newest first, filtered by `state`, `tool` and `since_ms`.
async fn journal(
    State(c): State<Arc<Console>>,
    Extension(p): Extension<Principal>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Some(refused) = c.refusal(&p, None) {
        return refused;
    }
    let query = query.unwrap_or_default();
    let filter = |key: &str| form_value(query.as_bytes(), key).filter(|v| !v.is_empty());
    let (state, tool, principal) = (filter("state"), filter("tool"), filter("principal"));
    let since: u64 = filter("since_ms").and_then(|v| v.parse().ok()).unwrap_or(0);
    let records = c
        .gateway
        .journal()
        .recent(ring0_journal::limits::RECENT_LIMIT_MAX)
        .await
        .unwrap_or_default();
    let mut body = format!(
        "<form method=get>state <input name=state value=\"{}\"> tool <input name=tool value=\"{}\"> \
         principal <input name=principal value=\"{}\"> \
         since (Unix ms) <input name=since_ms value=\"{}\"> <button>Filter</button></form>\
         <table><tr><th>intent</th><th>state</th><th>tool</th><th>scope</th><th>arguments</th><th>timeline</th><th>receipt</th></tr>",
        escape(state.as_deref().unwrap_or("")),
        escape(tool.as_deref().unwrap_or("")),
        escape(principal.as_deref().unwrap_or("")),
        since
    );
    let shown = records
        .iter()
        .filter(|r| state.as_deref().is_none_or(|s| r.state.as_str() == s))
        .filter(|r| tool.as_deref().is_none_or(|t| r.tool == t))
        // The journal names the principal of a call made under an idempotency key.
        .filter(|r| {
            principal
                .as_deref()
                .is_none_or(|p| r.client_key.as_ref().is_some_and(|k| k.principal == p))
        })
        .filter(|r| r.created_ms() >= since)
        .take(JOURNAL_ROWS_MAX);
    for r in shown {
        let timeline: Vec<String> = r
            .timeline
            .iter()
            .map(|e| format!("{} {}", e.state, e.note.as_deref().unwrap_or("")))
            .collect();
        let receipt = r
            .receipt
            .as_ref()
            .and_then(|x| serde_json::to_string(&x.outcome).ok())
            .unwrap_or_default();
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td><td><pre>{}</pre></td><td><pre>{}</pre></td></tr>",
            r.id,
            r.state,
            cell(&r.tool),
            cell(&r.scope),
            cell(&r.canonical_args),
            cell(&timeline.join("\n")),
            cell(&receipt),
        );
    }
    body.push_str("</table>");
    page("Journal", &body)
}

async fn decide_held(
    State(c): State<Arc<Console>>,
    Extension(p): Extension<Principal>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    form: Bytes,
) -> Response {
    if let Some(refused) = c.refusal(&p, Some(&form)) {
        return refused;
    }
    let by = format!("console ({})", p.id);
    let state = match action.as_str() {
        "approve" => HoldState::Approved {
            by,
            for_session: false,
        },
        "approve-session" => HoldState::Approved {
            by,
            for_session: true,
        },
        "deny" => HoldState::Denied {
            by,
            reason: "denied in the console".into(),
        },
        _ => return plain(StatusCode::NOT_FOUND, "no such action"),
    };
    match c.gateway.journal().hold_decide(&id, state).await {
        Ok(HoldDecided::Decided(h)) => {
            c.log.line(&format!(
                "console: {} {} by {}",
                h.approval_id,
                h.state.as_str(),
                p.id
            ));
            Redirect::to(CONSOLE_PATH).into_response()
        }
        Ok(HoldDecided::AlreadyDecided(_)) => plain(StatusCode::CONFLICT, "already decided"),
        Ok(HoldDecided::Lapsed(_)) => plain(StatusCode::GONE, "it expired before this decision"),
        Ok(HoldDecided::NotFound) => plain(StatusCode::NOT_FOUND, "no such approval"),
        Err(e) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the journal: {e}"),
        ),
    }
}

async fn settle(
    State(c): State<Arc<Console>>,
    Extension(p): Extension<Principal>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    form: Bytes,
) -> Response {
    if let Some(refused) = c.refusal(&p, Some(&form)) {
        return refused;
    }
    let id = match operator::parse_intent_id(&id) {
        Ok(id) => id,
        Err(e) => return plain(StatusCode::NOT_FOUND, &e),
    };
    let note = format!("in the console by {}", p.id);
    let journal = c.gateway.journal().clone();
    let done = match action.as_str() {
        "applied" => operator::resolve(journal.as_ref(), id, PersonFinding::Applied, &note)
            .await
            .map(|r| crate::control::describe_resolution(&r)),
        "not-applied" => operator::resolve(journal.as_ref(), id, PersonFinding::NotApplied, &note)
            .await
            .map(|r| crate::control::describe_resolution(&r)),
        "compensate" => {
            let generation = c.gateway.generation();
            operator::compensate(&generation.kernel, Some(generation.gate.clone()), id, &note)
                .await
                .map(|x| crate::control::describe_compensation(&x))
        }
        _ => return plain(StatusCode::NOT_FOUND, "no such action"),
    };
    match done {
        Ok(message) => {
            c.log.line(&format!("console: {message}"));
            Redirect::to(CONSOLE_PATH).into_response()
        }
        Err(why) => plain(StatusCode::CONFLICT, &why),
    }
}
