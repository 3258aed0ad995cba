//! The background jobs an API session's calls started (the built-in `shell` with
//! `background: true`), read by the session's own principal.
//!
//! The shell tool keeps jobs by the kernel session's scope. A session whose scope is its own id
//! (the default) is the only one that can name that scope, so its jobs are its own; a session
//! that named a scope of its own may share it with other sessions, of other principals too, and
//! its jobs are not listed here (`409`): listing them could show another principal's commands.

use crate::Api;
use crate::error::{ApiError, ErrorKind};
use crate::routes::principal;
use axum::Extension;
use axum::extract::{Path, State};
use ring0_core::Principal;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

/// Most jobs one list answers with (the newest).
pub const JOBS_LISTED_MAX: usize = 200;
/// Longest command shown of one job, in bytes.
pub const JOB_COMMAND_BYTES_MAX: usize = 1024;

/// Reads the background jobs of a kernel session's scope, newest first, at most the bound
/// given; the error says why the job table could not be read.
pub type JobsOfScope = Arc<
    dyn Fn(
            String,
            usize,
        )
            -> futures::future::BoxFuture<'static, Result<Vec<ring0_exec::JobStatus>, String>>
        + Send
        + Sync,
>;

/// One background job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobSummary {
    /// The job's handle (`job_…`), as the shell tool named it to the model.
    pub job: String,
    /// `RUNNING`, `STREAMING`, `COMPLETED`, `FAILED`, `KILLED`, …
    pub state: String,
    /// The command it runs (cut to 1024 bytes).
    pub command: String,
    /// When it started, in Unix milliseconds.
    pub started_at_ms: u64,
    /// When it ended, in Unix milliseconds; absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// How long it has run, in milliseconds.
    pub elapsed_ms: u64,
    /// Output bytes written to its log.
    pub log_bytes: u64,
}

/// A session's background jobs, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobList {
    /// At most 200.
    pub jobs: Vec<JobSummary>,
}

fn summary(status: &ring0_exec::JobStatus) -> JobSummary {
    let state = match serde_json::to_value(status.state) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{:?}", status.state),
    };
    JobSummary {
        job: status.job.to_string(),
        state,
        command: ring0_core::limits::clip_with_length(&status.command, JOB_COMMAND_BYTES_MAX)
            .into_owned(),
        started_at_ms: status.started_at_ms,
        finished_at_ms: status.finished_at_ms,
        elapsed_ms: status.elapsed_ms,
        log_bytes: status.log_bytes,
    }
}

/// The background jobs the session's calls started, newest first.
#[utoipa::path(get, path = "/v1/sessions/{id}/jobs", tag = "sessions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = JobList),
        (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 503, body = ApiError),
    ))]
pub(crate) async fn list_jobs(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<axum::Json<JobList>, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    if session.settings.scope != session.id {
        return Err(ApiError::conflict(
            "this session named a scope of its own, which other sessions may share: its jobs are not listed",
        ));
    }
    let Some(jobs_of) = &api.inner.jobs else {
        return Ok(axum::Json(JobList { jobs: Vec::new() }));
    };
    let jobs = jobs_of(session.settings.scope.clone(), JOBS_LISTED_MAX)
        .await
        .map_err(|e| ApiError::new(ErrorKind::Unavailable, format!("background jobs: {e}")))?;
    Ok(axum::Json(JobList {
        jobs: jobs.iter().take(JOBS_LISTED_MAX).map(summary).collect(),
    }))
}
