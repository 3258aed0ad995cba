//! The console's background jobs: `/console/jobs` lists every session's jobs from the job
//! manager (id, command, state, start, exit), and `/console/jobs/{job}` shows one with the tail
//! of its output, kept live by a script ring0 serves itself ([`TAIL_SCRIPT_PATH`]): the page's
//! Content-Security-Policy allows that script by a nonce made for the response and nothing
//! else, and the script polls `/console/jobs/{job}/tail` (same origin) and writes the answer
//! with `textContent`, never as markup. Without it the page is complete; a reload refreshes.

use super::{Console, cell, page_with_script, plain};
use crate::html::escape;
use axum::Extension;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use ring0_core::Principal;
use ring0_exec::JobStatus;
use serde_json::json;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// Most jobs the list shows (the newest).
pub const JOBS_ROWS_MAX: usize = 200;
/// Lines of output a job's page shows and its tail answers.
pub const TAIL_LINES: usize = 200;
/// Most bytes of output a job's page shows and its tail answers (the last lines are cut to it).
pub const TAIL_BYTES_MAX: usize = 64 * 1024;
/// Where the live tail's script is served.
pub const TAIL_SCRIPT_PATH: &str = "/console/tail.js";
const TAIL_SCRIPT: &str = include_str!("tail.js");

/// The job routes, for the console's router.
pub(super) fn routes(router: axum::Router<Arc<Console>>) -> axum::Router<Arc<Console>> {
    router
        .route("/console/jobs", axum::routing::get(list))
        .route("/console/jobs/{job}", axum::routing::get(job_page))
        .route("/console/jobs/{job}/tail", axum::routing::get(tail))
        .route(TAIL_SCRIPT_PATH, axum::routing::get(script))
}

/// `123` → `Sat, 05 Dec 2026 08:00:00 GMT`.
fn when(ms: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(ms))
}

/// How a finished job ended: `exit 0`, `signal 9`, or its state's own note; empty while it
/// runs.
fn exit_of(status: &JobStatus) -> String {
    let exit = status.summary.as_ref().and_then(|s| s.exit);
    match exit.map(|e| (e.code, e.signal)) {
        Some((Some(code), _)) => format!("exit {code}"),
        Some((None, Some(signal))) => format!("signal {signal}"),
        _ if status.state.is_terminal() => status.note.clone().unwrap_or_default(),
        _ => String::new(),
    }
}

async fn list(State(c): State<Arc<Console>>, Extension(p): Extension<Principal>) -> Response {
    if let Some(refused) = c.refusal(&p, None) {
        return refused;
    }
    let Some(jobs) = &c.jobs else {
        return page_with_script("Jobs", "<p>This server runs no background jobs.</p>", None);
    };
    let listed = match jobs.every_session(JOBS_ROWS_MAX).await {
        Ok(listed) => listed,
        Err(why) => {
            let body = format!("<p>The job table is unavailable: {}</p>", cell(&why));
            return page_with_script("Jobs", &body, None);
        }
    };
    let mut body = String::new();
    if listed.is_empty() {
        body.push_str("<p>No background job.</p>");
    } else {
        body.push_str(
            "<table><tr><th>job</th><th>command</th><th>state</th><th>started</th><th>exit</th></tr>",
        );
        for job in &listed {
            let id = job.job.to_string();
            let _ = write!(
                body,
                "<tr><td><a href=\"/console/jobs/{}\">{}</a></td><td><pre>{}</pre></td>\
                 <td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&id),
                escape(&id),
                cell(&job.command),
                job.state,
                when(job.started_at_ms),
                cell(&exit_of(job)),
            );
        }
        body.push_str("</table>");
    }
    page_with_script("Jobs", &body, None)
}

/// The last [`TAIL_LINES`] lines of a job's output, at most [`TAIL_BYTES_MAX`] bytes (the
/// newest kept), and its status; or the refusal to show it.
async fn snapshot(c: &Console, job: &str) -> Result<(JobStatus, String), Response> {
    let Some(jobs) = &c.jobs else {
        return Err(plain(StatusCode::NOT_FOUND, "no such job"));
    };
    let snapshot = jobs
        .inspect_any_session(job, TAIL_LINES)
        .await
        .map_err(|why| plain(StatusCode::NOT_FOUND, &why))?;
    let tail = snapshot.tail;
    let mut cut = tail.len().saturating_sub(TAIL_BYTES_MAX);
    while !tail.is_char_boundary(cut) {
        cut += 1;
    }
    Ok((snapshot.status, tail[cut..].to_string()))
}

async fn job_page(
    State(c): State<Arc<Console>>,
    Extension(p): Extension<Principal>,
    UrlPath(job): UrlPath<String>,
) -> Response {
    if let Some(refused) = c.refusal(&p, None) {
        return refused;
    }
    let (status, tail) = match snapshot(&c, &job).await {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let id = status.job.to_string();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let body = format!(
        "<table><tr><th>job</th><td>{id}</td></tr><tr><th>command</th><td><pre>{command}</pre></td></tr>\
         <tr><th>state</th><td id=state>{state}</td></tr><tr><th>started</th><td>{started}</td></tr>\
         <tr><th>exit</th><td id=exit>{exit}</td></tr></table>\
         <h2>Output, last {TAIL_LINES} lines <small id=live></small></h2>\
         <pre id=tail class=tail data-source=\"/console/jobs/{id}/tail\">{tail}</pre>\
         <script nonce=\"{nonce}\" src=\"{TAIL_SCRIPT_PATH}\"></script>",
        id = escape(&id),
        command = cell(&status.command),
        state = status.state,
        started = when(status.started_at_ms),
        exit = cell(&exit_of(&status)),
        tail = escape(&tail),
    );
    page_with_script(&format!("Job {id}"), &body, Some(&nonce))
}

/// What the live tail reads: `{state, exit, finished, tail}`.
async fn tail(
    State(c): State<Arc<Console>>,
    Extension(p): Extension<Principal>,
    UrlPath(job): UrlPath<String>,
) -> Response {
    if let Some(refused) = c.refusal(&p, None) {
        return refused;
    }
    let (status, tail) = match snapshot(&c, &job).await {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let answer = json!({
        "state": status.state.as_str(),
        "exit": exit_of(&status),
        "finished": status.state.is_terminal(),
        "tail": tail,
    });
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        answer.to_string(),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        TAIL_SCRIPT,
    )
        .into_response()
}
