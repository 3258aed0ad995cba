//! Background jobs as the other replicas of a deployment see them.
//!
//! A job's processes run on the replica whose `shell` call started it, and die with it. With a
//! shared (PostgreSQL) journal, that replica records each of its jobs there
//! (`ring0_journal::Deployment::job_put`): the owner (the digest of the scope whose call
//! started it, so a job stays another session's wherever it is asked about) and the status it
//! last saw — when it started and when it finished. A job tool that does not know a handle
//! asks the record before answering "unknown job": a finished job is answered with its final
//! status; a job whose replica stopped (its lease lapsed: killed, or lost with its machine) is
//! reported KILLED, since its process tree ended with that replica; a running job of a live
//! replica is inspected and waited for through its record, cancelled through a request left on
//! the record that its replica reads every [`CANCEL_POLL`] (the call waits, bounded, for the job
//! to finish), and writing to it is refused here, naming the replica that can.

use ring0_journal::Deployment;
use ring0_journal::deployment::SHARED_JOB_REPORT_BYTES_MAX;
use ring0_kernel::ToolError;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often `job_wait` and `job_cancel` read the record of a job another replica runs.
const RECORD_POLL: Duration = Duration::from_millis(250);
/// How long `job_cancel` of a job another replica runs waits for that replica to cancel it.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
/// How often a replica reads the cancel requests other replicas left for its jobs.
pub(crate) const CANCEL_POLL: Duration = Duration::from_millis(500);

/// The shared job records, once the front end joined a deployment.
#[derive(Clone, Default)]
pub(crate) struct JobRecords(Arc<OnceLock<Arc<dyn Deployment>>>);

/// What a job tool asks of a job another replica started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    Inspect,
    Wait(Duration),
    Cancel,
    SendInput,
}

impl JobRecords {
    /// Records jobs in `deployment` from now on (once; later calls change nothing).
    pub(crate) fn share(&self, deployment: Arc<dyn Deployment>) {
        let _ = self.0.set(deployment);
    }

    /// Whether job `job` has finished by its shared record (or its replica stopped, which ended
    /// it); `None` when no replica recorded it. For the probe of `job_cancel`, which has no
    /// scope to check and discloses nothing.
    pub(crate) async fn settled(&self, job: &str) -> Option<bool> {
        let record = self.0.get()?.job_get(job).await.ok()??;
        Some(record.finished || !record.replica_live)
    }

    /// Asks every replica to cancel the jobs of `owner` not started detached (its session
    /// ended), best effort.
    pub(crate) async fn end_of(&self, owner: &str) {
        if let Some(deployment) = self.0.get() {
            let _ = deployment.jobs_end_of(owner).await;
        }
    }

    /// Whether this replica joined a deployment.
    pub(crate) fn is_shared(&self) -> bool {
        self.0.get().is_some()
    }

    /// The handles of this replica's jobs other replicas asked it to cancel (none when the
    /// record cannot be read: it is read again at the next poll).
    pub(crate) async fn to_cancel(&self) -> Vec<String> {
        match self.0.get() {
            Some(deployment) => deployment.jobs_to_cancel().await.unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Records what this replica knows of a job of `owner` (best effort: a job whose record
    /// could not be written is still answered by this replica).
    pub(crate) async fn publish(&self, owner: &str, status: &Value, finished: bool) {
        let Some(deployment) = self.0.get() else {
            return;
        };
        let Some(handle) = status.get("job").and_then(Value::as_str) else {
            return;
        };
        let mut report = status.to_string();
        if report.len() > SHARED_JOB_REPORT_BYTES_MAX {
            // The output travels only in the owner's own answer; the record keeps the rest.
            let mut trimmed = status.clone();
            if let Some(o) = trimmed.as_object_mut() {
                o.remove("observation");
                o.remove("summary");
            }
            report = trimmed.to_string();
        }
        if report.len() <= SHARED_JOB_REPORT_BYTES_MAX {
            let _ = deployment.job_put(handle, owner, &report, finished).await;
        }
    }

    /// The answer about job `job` of `owner` from its shared record, when this replica does not
    /// run it; `None` when no replica recorded it for `owner` (it is unknown).
    pub(crate) async fn elsewhere(
        &self,
        owner: &str,
        job: &str,
        asked: Asked,
    ) -> Option<Result<Value, ToolError>> {
        let deployment = self.0.get()?;
        let deadline = match asked {
            Asked::Wait(timeout) => Instant::now() + timeout,
            Asked::Cancel => Instant::now() + CANCEL_WAIT,
            _ => Instant::now(),
        };
        let mut cancel_asked = false;
        loop {
            let record = match deployment.job_get(job).await {
                Ok(Some(r)) if r.owner == owner => r,
                Ok(_) => return None,
                Err(e) => {
                    return Some(Err(ToolError::not_applied(format!(
                        "job {job:?} is not on this replica, and the shared record could not be read: {e}"
                    ))));
                }
            };
            let mut report: Value = serde_json::from_str(&record.report).unwrap_or(Value::Null);
            let settled = record.finished || !record.replica_live;
            if !record.finished && !record.replica_live {
                report["state"] = json!("KILLED");
                report["note"] = json!(format!(
                    "the replica that ran it ({}) stopped; its process tree ended with it",
                    record.replica
                ));
            }
            match asked {
                Asked::SendInput if settled => {
                    return Some(Err(ToolError::not_applied(format!(
                        "job {job:?} has finished ({})",
                        report["state"].as_str().unwrap_or("unknown")
                    ))));
                }
                Asked::SendInput if !settled => {
                    return Some(Err(ToolError::not_applied(format!(
                        "job {job:?} runs on replica {}, which holds its input: send this \
                         call through a connection to that replica",
                        record.replica
                    ))));
                }
                // The replica running it cancels it at its next read of the requests.
                Asked::Cancel if !settled && !cancel_asked => {
                    if let Err(e) = deployment.job_request_cancel(job, owner).await {
                        return Some(Err(ToolError::not_applied(format!(
                            "job {job:?} runs on replica {}; asking it to cancel the job failed: {e}",
                            record.replica
                        ))));
                    }
                    cancel_asked = true;
                    continue;
                }
                Asked::Cancel if !settled && Instant::now() >= deadline => {
                    return Some(Err(ToolError::unknown(format!(
                        "job {job:?} runs on replica {}, which was asked to cancel it and has not \
                         reported it finished within {} s",
                        record.replica,
                        CANCEL_WAIT.as_secs()
                    ))));
                }
                Asked::Wait(_) | Asked::Cancel if !settled && Instant::now() < deadline => {
                    tokio::time::sleep(RECORD_POLL.min(deadline - Instant::now())).await;
                    continue;
                }
                _ => {}
            }
            if !settled {
                report["note"] = json!(format!(
                    "runs on replica {}; this is its state as that replica last recorded it",
                    record.replica
                ));
            }
            return Some(Ok(report));
        }
    }
}
