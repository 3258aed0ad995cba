//! One-shot supervised runs: spawn, capture, bound, tear down, shape — the path of a tool call
//! whose implementation is a command, and of `ring0 run`.

use crate::capture::Shaping;
use crate::error::ExecError;
use crate::spawn;
use crate::spec::{CommandSpec, ExecPolicy, PreparedCommand};
use crate::supervise::{self, Ending, ExitReport, Limits, Monitor};
use crate::teardown::TeardownReport;
use ring0_core::Observation;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::Instant;

/// The envelope of a finished run: what happened, in numbers. It is the `structured` part of the
/// observation, and what a shaper's `finish` receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The command line, shortened for display.
    pub command: String,
    pub ending: Ending,
    /// How the root process ended; absent when it could not be observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitReport>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes read past the output ceiling and discarded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub discarded_bytes: u64,
    pub output_ceiling_bytes: u64,
    pub timeout_ms: u64,
    pub duration_ms: u64,
    /// Present when processes had to be signalled (timeout, cancel, ceiling, or leftovers after
    /// the root exited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub teardown: Option<TeardownReport>,
    /// Something outside the supervised tree held the output pipes open after it was gone;
    /// ring0 closed them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pipes_force_closed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RunSummary {
    /// Whether the run did not finish by itself: timed out, cancelled, cut at the ceiling, or
    /// supervision failed. An exit code is reported, never judged: a non-zero code is not an
    /// error of the run, and 0 is not success.
    pub fn is_error(&self) -> bool {
        self.ending != Ending::Exited || self.error.is_some()
    }

    /// What the model must be told beyond the exit status: why supervision ended the run, or
    /// what went wrong supervising it. `None` for a run that exited by itself cleanly.
    pub fn supervision_note(&self) -> Option<String> {
        let ending = match self.ending {
            Ending::Exited => None,
            Ending::TimedOut => Some(format!(
                "Timed out after {} ms; the process group was terminated. Output up to then is shown.",
                self.timeout_ms
            )),
            Ending::Cancelled => Some(
                "Cancelled; the process group was terminated. Output up to then is shown."
                    .to_owned(),
            ),
            Ending::OutputCeiling => Some(format!(
                "Output ceiling of {} bytes reached ({} further bytes discarded); the pipes were closed and the process group killed.",
                self.output_ceiling_bytes, self.discarded_bytes
            )),
            Ending::SupervisionFailed => {
                Some("Supervision failed; the process group was terminated.".to_owned())
            }
        };
        let error = self.error.as_deref().map(|e| format!("ring0: {e}."));
        match (ending, error) {
            (None, None) => None,
            (Some(a), None) | (None, Some(a)) => Some(format!("[{a}]")),
            (Some(a), Some(b)) => Some(format!("[{a} {b}]")),
        }
    }

    /// One line stating how the run ended.
    pub fn status_line(&self) -> String {
        let exit = match self.exit {
            Some(ExitReport {
                code: Some(code), ..
            }) => format!("exit code {code}"),
            Some(ExitReport {
                signal: Some(sig), ..
            }) => format!("killed by signal {sig}"),
            _ => "exit status unknown".to_owned(),
        };
        let ending = match self.ending {
            Ending::Exited => String::new(),
            Ending::TimedOut => format!("; timed out after {} ms", self.timeout_ms),
            Ending::Cancelled => "; cancelled".to_owned(),
            Ending::OutputCeiling => format!(
                "; output ceiling of {} bytes reached ({} further bytes discarded), process group killed",
                self.output_ceiling_bytes, self.discarded_bytes
            ),
            Ending::SupervisionFailed => "; supervision failed".to_owned(),
        };
        let error = self
            .error
            .as_deref()
            .map(|e| format!("; {e}"))
            .unwrap_or_default();
        format!(
            "[ring0: {exit}{ending}{error}; {} stdout bytes, {} stderr bytes, {} ms]",
            self.stdout_bytes, self.stderr_bytes, self.duration_ms
        )
    }
}

/// A finished run: the shaped observation and the envelope it was shaped from.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    pub observation: Observation,
    pub summary: RunSummary,
}

struct RunMonitor {
    shaper: Shaping,
}

impl Monitor for RunMonitor {
    fn on_output(&mut self, stream: ring0_shape::Stream, bytes: &[u8]) {
        self.shaper.push(stream, bytes);
    }
}

/// Runs one command under supervision and returns its shaped observation.
///
/// Returns `Err` only when nothing ran (the request broke a rule of `policy`, or the program
/// could not be started). Once the process exists, every outcome — exit, timeout, cancellation,
/// output ceiling — is an `Ok` report whose summary says which, with the output collected up to
/// that point. When `cancel` resolves, the process tree is torn down (SIGTERM, the policy's grace
/// period, SIGKILL) and the report returned; dropping the returned future instead leaves the
/// tree to the parent-death signal and to the next teardown, so prefer `cancel`.
///
/// Interactive input needs a background job ([`crate::JobManager`]): `spec.stdin` must be
/// [`crate::StdinMode::Null`] here.
pub async fn run_command<C>(
    policy: &ExecPolicy,
    spec: &CommandSpec,
    cancel: C,
) -> Result<RunReport, ExecError>
where
    C: Future<Output = ()> + Send,
{
    let prepared = PreparedCommand::prepare(policy, spec)?;
    run_prepared(&prepared, cancel).await
}

/// [`run_command`] for a command already checked against its policy.
pub async fn run_prepared<C>(prepared: &PreparedCommand, cancel: C) -> Result<RunReport, ExecError>
where
    C: Future<Output = ()> + Send,
{
    if prepared.stdin.is_interactive() {
        return Err(ExecError::InteractiveNeedsJob);
    }
    let mut monitor = RunMonitor {
        shaper: Shaping::new(&prepared.shape)?,
    };
    let started = Instant::now();
    let spawned = spawn::spawn(prepared)?;
    let limits = Limits {
        deadline: started + prepared.timeout,
        grace: prepared.grace,
        output_ceiling_bytes: prepared.output_ceiling_bytes,
        probe_input: false,
    };
    let done = supervise::supervise(spawned, limits, &mut monitor, cancel).await;
    let summary = RunSummary {
        command: prepared.display(),
        ending: done.ending,
        exit: done.exit,
        stdout_bytes: done.stdout_bytes,
        stderr_bytes: done.stderr_bytes,
        discarded_bytes: done.discarded_bytes,
        output_ceiling_bytes: prepared.output_ceiling_bytes,
        timeout_ms: u64::try_from(prepared.timeout.as_millis()).unwrap_or(u64::MAX),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        teardown: done.teardown,
        pipes_force_closed: done.pipes_force_closed,
        error: done.error,
    };
    let observation = monitor.shaper.finish(&summary);
    Ok(RunReport {
        observation,
        summary,
    })
}
