//! Who a console request is, and signing in from a browser.
//!
//! A browser cannot add a bearer header by hand, so the console has its own door in front of
//! its pages ([`Console::door`]): a request is the principal of
//! - its `Authorization: Bearer` credential, checked by the listener's authenticator (as for
//!   `/mcp`: a tool or a script keeps working), else
//! - its session cookie ([`COOKIE_NAME`]): an opaque random id that `/console/login` handed
//!   out after checking the operator's token, looked up in a table kept in memory
//!   ([`BrowserSessions`]: bounded, each session ending after [`SESSION_IDLE`] unused or
//!   [`SESSION_LIFETIME`] in all, at `/console/logout`, or when the server stops); the cookie
//!   never holds the token, and the table holds only the id's SHA-256, else
//! - nobody: a page asked for is redirected to `/console/login`, anything else is `401`.
//!
//! A listener without credentials serves every request as `local`, as it does `/mcp`. The
//! cookie is `HttpOnly`, `SameSite=Strict`, scoped to `/console`, and `Secure` when the request
//! came over TLS (a TLS-terminating proxy's `X-Forwarded-Proto: https`: ring0 itself serves
//! plain HTTP). Only operators are given a session. Every POST whose `Origin` is not the
//! listener's own is refused (the sign-in form included, so no page elsewhere can sign a
//! browser in); the forms keep their CSRF tokens.

use super::{CONSOLE_PATH, Console, page_signed_out, plain};
use crate::html::escape;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use ring0_core::Principal;
use ring0_mcp::auth::{Authenticator, Unauthenticated};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The sign-in form.
pub const LOGIN_PATH: &str = "/console/login";
/// Signing out.
pub const LOGOUT_PATH: &str = "/console/logout";
/// The session cookie's name.
pub const COOKIE_NAME: &str = "ring0_console";
/// Browser sessions kept at most; signing in past it ends the least recently used one.
pub const SESSIONS_MAX: usize = 1024;
/// A session unused this long has ended.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after sign-in, used or not.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 60 * 60);
/// Largest sign-in form read (a JWT fits).
const LOGIN_FORM_BYTES_MAX: usize = ring0_mcp::auth::AUTHORIZATION_BYTES_MAX + 64;
/// Random bytes of a session id.
const SESSION_ID_BYTES: usize = 32;

/// The console's browser sessions: the SHA-256 of each id, the principal it signed in as, and
/// when it was made and last used.
#[derive(Default)]
pub struct BrowserSessions {
    table: Mutex<HashMap<[u8; 32], Session>>,
}

struct Session {
    principal: Principal,
    created: Instant,
    used: Instant,
}

impl Session {
    fn is_live_at(&self, now: Instant) -> bool {
        now.duration_since(self.used) < SESSION_IDLE
            && now.duration_since(self.created) < SESSION_LIFETIME
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl BrowserSessions {
    /// A new session for `principal`: its id (hex), to go in the cookie. Fails only when the
    /// system's random source does.
    pub fn open(&self, principal: Principal) -> Result<String, String> {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; SESSION_ID_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| "the system's random source failed".to_string())?;
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.retain(|_, s| s.is_live_at(now));
        while table.len() >= SESSIONS_MAX {
            let Some(oldest) = table.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| *k) else {
                break;
            };
            table.remove(&oldest);
        }
        table.insert(
            digest(&id),
            Session {
                principal,
                created: now,
                used: now,
            },
        );
        Ok(id)
    }

    /// The principal of a live session `id`, which counts as a use; `None` for anything else.
    pub fn principal(&self, id: &str) -> Option<Principal> {
        if id.len() != 2 * SESSION_ID_BYTES || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let key = digest(id);
        let now = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        match table.get_mut(&key) {
            Some(s) if s.is_live_at(now) => {
                s.used = now;
                Some(s.principal.clone())
            }
            Some(_) => {
                table.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends session `id`, if there is one.
    pub fn close(&self, id: &str) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.remove(&digest(id));
    }

    /// Sessions held now (live or not yet purged).
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// No session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The console's door: the console and the listener's authenticator.
#[derive(Clone)]
pub(super) struct Door {
    pub console: Arc<Console>,
    pub auth: Option<Arc<Authenticator>>,
}

/// The session id a request's cookie carries.
fn cookie_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE_NAME).then(|| value.trim().to_string())
        })
}

/// Whether a request's `Origin`, when it has one, is the listener's own (its `Host`).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

/// Whether the request reached ring0 over TLS (through a proxy that terminated it).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

fn cookie(headers: &HeaderMap, value: &str, max_age: Duration) -> HeaderValue {
    let secure = if over_tls(headers) { "; Secure" } else { "" };
    let text = format!(
        "{COOKIE_NAME}={value}; Path={CONSOLE_PATH}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.as_secs()
    );
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Who `headers` say the request is, or the refusal of a credential that is not valid.
async fn principal_of(door: &Door, headers: &HeaderMap) -> Result<Option<Principal>, Response> {
    let Some(auth) = &door.auth else {
        return Ok(Some(Principal::local()));
    };
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let result = auth.authenticate(Some(value.as_bytes())).await;
        for problem in auth.take_problems() {
            door.console.log.line(&format!("auth: {problem}"));
        }
        return match result {
            Ok(p) => Ok(Some(p)),
            Err(why) => Err(unauthorized(auth, &why)),
        };
    }
    Ok(cookie_session(headers).and_then(|id| door.console.sessions.principal(&id)))
}

fn unauthorized(auth: &Authenticator, why: &Unauthenticated) -> Response {
    let mut response = plain(StatusCode::UNAUTHORIZED, "the credential is not valid");
    if let Ok(challenge) = HeaderValue::from_str(&auth.challenge(why)) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    }
    response
}

/// The door in front of every console route but sign-in and sign-out: the request's
/// principal goes in its extensions, or it is sent to sign in.
pub(super) async fn authenticate(
    State(door): State<Door>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::POST && !same_origin(request.headers()) {
        return plain(
            StatusCode::FORBIDDEN,
            "the form was not sent from this console",
        );
    }
    match principal_of(&door, request.headers()).await {
        Err(refused) => refused,
        Ok(Some(principal)) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Ok(None) if request.method() == Method::GET => Redirect::to(LOGIN_PATH).into_response(),
        Ok(None) => plain(StatusCode::UNAUTHORIZED, "sign in at /console/login first"),
    }
}

fn login_page(status: StatusCode, problem: Option<&str>) -> Response {
    let problem = problem
        .map(|p| format!("<p class=problem>{}</p>", escape(p)))
        .unwrap_or_default();
    let body = format!(
        "{problem}<form method=post action=\"{LOGIN_PATH}\">\
         <label>Operator token <input type=password name=token autocomplete=current-password \
         required autofocus></label> <button>Sign in</button></form>"
    );
    let mut response = page_signed_out("Sign in", &body);
    *response.status_mut() = status;
    response
}

/// The sign-in form.
pub(super) async fn login_form(State(door): State<Door>) -> Response {
    if door.auth.is_none() {
        // Every request is `local` here: there is nothing to sign in as.
        return Redirect::to(CONSOLE_PATH).into_response();
    }
    login_page(StatusCode::OK, None)
}

/// Checks the token as the listener would, and gives an operator a session.
pub(super) async fn login(State(door): State<Door>, headers: HeaderMap, form: Bytes) -> Response {
    let Some(auth) = &door.auth else {
        return Redirect::to(CONSOLE_PATH).into_response();
    };
    if !same_origin(&headers) {
        return plain(
            StatusCode::FORBIDDEN,
            "the form was not sent from this console",
        );
    }
    if form.len() > LOGIN_FORM_BYTES_MAX {
        return login_page(StatusCode::PAYLOAD_TOO_LARGE, Some("the form is too large"));
    }
    let token = super::form_value(&form, "token").unwrap_or_default();
    let token = token.trim();
    if token.is_empty() {
        return login_page(StatusCode::UNAUTHORIZED, Some("no token was given"));
    }
    let principal = match auth
        .authenticate(Some(format!("Bearer {token}").as_bytes()))
        .await
    {
        Ok(p) => p,
        Err(_) => return login_page(StatusCode::UNAUTHORIZED, Some("the token is not valid")),
    };
    if !door.console.operators.admit(&principal) {
        door.console.log.line(&format!(
            "console: sign-in refused to {}: not an operator",
            principal.id
        ));
        return login_page(
            StatusCode::FORBIDDEN,
            Some("the console is for principals with the operator role ([console] operators)"),
        );
    }
    let id = principal.id.clone();
    let session = match door.console.sessions.open(principal) {
        Ok(session) => session,
        Err(why) => return plain(StatusCode::SERVICE_UNAVAILABLE, &why),
    };
    door.console.log.line(&format!("console: {id} signed in"));
    let mut response = Redirect::to(CONSOLE_PATH).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie(&headers, &session, SESSION_LIFETIME),
    );
    response
}

/// Ends the browser's session and clears its cookie.
pub(super) async fn logout(State(door): State<Door>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return plain(
            StatusCode::FORBIDDEN,
            "the form was not sent from this console",
        );
    }
    if let Some(id) = cookie_session(&headers) {
        door.console.sessions.close(&id);
    }
    let mut response = Redirect::to(LOGIN_PATH).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie(&headers, "", Duration::ZERO));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_names_its_principal_until_it_is_closed_and_nothing_else_does() {
        let sessions = BrowserSessions::default();
        let id = sessions.open(Principal::local()).unwrap();
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.principal(&id).unwrap().id, Principal::local().id);
        let other = sessions.open(Principal::local()).unwrap();
        assert_ne!(id, other, "ids are random");
        for bad in ["", "zz", &id[..63], &"0".repeat(64), &format!("{id} ")] {
            assert!(sessions.principal(bad).is_none(), "{bad:?}");
        }
        sessions.close(&id);
        assert!(sessions.principal(&id).is_none());
        assert!(sessions.principal(&other).is_some());
    }

    #[test]
    fn the_table_is_bounded_ending_the_least_recently_used_session() {
        let sessions = BrowserSessions::default();
        let first = sessions.open(Principal::local()).unwrap();
        let kept = sessions.open(Principal::local()).unwrap();
        for _ in 2..SESSIONS_MAX {
            sessions.open(Principal::local()).unwrap();
        }
        assert!(sessions.principal(&kept).is_some());
        sessions.open(Principal::local()).unwrap();
        assert_eq!(sessions.len(), SESSIONS_MAX);
        assert!(
            sessions.principal(&first).is_none(),
            "the least recently used ended"
        );
        assert!(sessions.principal(&kept).is_some());
    }

    #[test]
    fn a_post_from_another_origin_is_told_apart_from_the_consoles_own() {
        let headers = |origin: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8808"));
            if let Some(o) = origin {
                h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
            }
            h
        };
        assert!(same_origin(&headers(None)));
        assert!(same_origin(&headers(Some("http://127.0.0.1:8808"))));
        assert!(!same_origin(&headers(Some("http://evil.example"))));
        assert!(!same_origin(&headers(Some("null"))));
        assert!(!same_origin(&headers(Some("http://127.0.0.1:9999"))));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_behind_tls() {
        let mut headers = HeaderMap::new();
        let plain = cookie(&headers, "abc", SESSION_LIFETIME);
        let plain = plain.to_str().unwrap();
        assert!(
            plain.contains("HttpOnly") && plain.contains("SameSite=Strict"),
            "{plain}"
        );
        assert!(!plain.contains("Secure"), "{plain}");
        headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let secure = cookie(&headers, "abc", SESSION_LIFETIME);
        assert!(secure.to_str().unwrap().ends_with("; Secure"));
    }
}
