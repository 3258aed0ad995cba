//! The supervision loop shared by one-shot runs and background jobs.
//!
//! One task owns the process: it drains stdout and stderr as bytes arrive (so a tool never
//! stalls on a full pipe), awaits the root's exit (an event from tokio's reaper, no polling),
//! watches the deadline and the cancellation signal, enforces the output ceiling, and runs the
//! teardown. Output keeps being collected during teardown, so whatever a process printed before
//! a timeout, a cancel or its SIGTERM handler ran is returned.

use crate::capture::stream_label;
use crate::limits;
use crate::probe;
use crate::spawn::{OutputReaders, Spawned};
use crate::teardown::{self, TeardownReport};
use ring0_shape::Stream;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The root process exited by itself.
    Exited,
    /// The deadline passed; the tree was torn down.
    TimedOut,
    /// The caller cancelled; the tree was torn down.
    Cancelled,
    /// Output passed the byte ceiling; the pipes were closed and the tree torn down.
    OutputCeiling,
    /// Supervision itself failed (reading a pipe or waiting for the process); the tree was torn
    /// down.
    SupervisionFailed,
}

/// How the root process ended, as the kernel reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitReport {
    /// Exit code, if it exited. Reported as is: 0 is not taken to mean success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Terminating signal number, if a signal ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub core_dumped: bool,
}

impl ExitReport {
    pub(crate) fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
            core_dumped: status.core_dumped(),
        }
    }
}

/// What the loop tells its owner as things happen.
pub(crate) trait Monitor: Send {
    fn on_output(&mut self, stream: Stream, bytes: &[u8]);
    /// The root exited; input can no longer be delivered.
    fn on_root_exit(&mut self) {}
    /// Two consecutive probes found the job blocked reading its input.
    fn on_input_wait(&mut self) {}
    /// Incremented by every input write, so a probe that straddles one is discarded.
    fn input_epoch(&self) -> u64 {
        0
    }
}

/// Facts of a finished supervision.
#[derive(Debug, Clone)]
pub(crate) struct Supervised {
    pub ending: Ending,
    pub exit: Option<ExitReport>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes read past the ceiling and discarded.
    pub discarded_bytes: u64,
    pub teardown: Option<TeardownReport>,
    /// The pipes had to be closed by ring0 after the tree was gone (something outside it held
    /// them open).
    pub pipes_force_closed: bool,
    pub error: Option<String>,
    pub elapsed: Duration,
}

pub(crate) struct Limits {
    pub deadline: Instant,
    pub grace: Duration,
    pub output_ceiling_bytes: u64,
    pub probe_input: bool,
}

type TeardownFuture = Pin<Box<dyn Future<Output = TeardownReport> + Send>>;

/// Runs the loop to the end. `cancel` resolving starts a teardown.
pub(crate) async fn supervise<C>(
    spawned: Spawned,
    limits: Limits,
    monitor: &mut dyn Monitor,
    cancel: C,
) -> Supervised
where
    C: Future<Output = ()> + Send,
{
    let started = Instant::now();
    let Spawned {
        mut root,
        readers,
        writer,
        input_object,
        identity,
        registration,
        sandbox,
    } = spawned;
    // The input writer belongs to the owner (jobs keep their own handle); a one-shot run has
    // none to keep, and dropping it closes the child's stdin.
    drop(writer);

    // A terminal's merged output is read as stdout.
    type Reader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
    let (mut out, mut err): (Option<Reader>, Option<Reader>) = match readers {
        OutputReaders::Pipes { stdout, stderr } => (Some(Box::new(stdout)), Some(Box::new(stderr))),
        OutputReaders::Tty(read) => (Some(Box::new(read)), None),
    };
    let mut out_buf = vec![0u8; limits::READ_CHUNK_BYTES];
    let mut err_buf = vec![0u8; limits::READ_CHUNK_BYTES];

    let mut result = Supervised {
        ending: Ending::Exited,
        exit: None,
        stdout_bytes: 0,
        stderr_bytes: 0,
        discarded_bytes: 0,
        teardown: None,
        pipes_force_closed: false,
        error: None,
        elapsed: Duration::ZERO,
    };
    let mut ending: Option<Ending> = None;
    let mut exited = false;
    let mut teardown_fut: Option<TeardownFuture> = None;
    let mut teardown_done = false;
    let mut drain_deadline: Option<Instant> = None;

    tokio::pin!(cancel);
    let mut cancel_fired = false;
    let deadline = tokio::time::Instant::from_std(limits.deadline);

    let probe_input = limits.probe_input && input_object.is_some();
    let mut probe = tokio::time::interval(limits::INPUT_PROBE_INTERVAL);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe_hits = 0u32;
    let mut probe_epoch = 0u64;

    let start_teardown = |identity: &teardown::RunIdentity| -> TeardownFuture {
        Box::pin(teardown::teardown(identity.clone(), limits.grace))
    };

    loop {
        let pipes_open = out.is_some() || err.is_some();
        if exited && teardown_fut.is_none() {
            if !pipes_open {
                break;
            }
            if drain_deadline.is_none() {
                drain_deadline = Some(Instant::now() + limits::POST_EXIT_DRAIN_MAX);
            }
        }

        // Total bytes so far, for the ceiling.
        let total = result.stdout_bytes + result.stderr_bytes;

        tokio::select! {
            report = run_teardown(&mut teardown_fut), if teardown_fut.is_some() => {
                teardown_fut = None;
                teardown_done = true;
                result.teardown = Some(merge(result.teardown, report));
                if !exited && report.survivors > 0 {
                    // The root itself survived SIGKILL (uninterruptible sleep): waiting for it
                    // could take forever, so report and stop supervising.
                    result.error.get_or_insert_with(|| {
                        format!("{} processes survived SIGKILL", report.survivors)
                    });
                    break;
                }
            }
            status = root.wait(), if !exited => {
                exited = true;
                monitor.on_root_exit();
                match status {
                    Ok(status) => result.exit = Some(ExitReport::from_status(status)),
                    Err(e) => {
                        result.error.get_or_insert_with(|| format!("waiting for the process: {e}"));
                        ending.get_or_insert(Ending::SupervisionFailed);
                    }
                }
                if teardown_fut.is_none() && !teardown_done && teardown::may_have_survivors(&identity) {
                    teardown_fut = Some(start_teardown(&identity));
                }
            }
            read = read_some(&mut out, &mut out_buf), if out.is_some() => {
                handle_read(read, Stream::Stdout, &out_buf, &mut out, total, &limits, monitor, &mut result, &mut ending);
            }
            read = read_some(&mut err, &mut err_buf), if err.is_some() => {
                handle_read(read, Stream::Stderr, &err_buf, &mut err, total, &limits, monitor, &mut result, &mut ending);
            }
            () = tokio::time::sleep_until(deadline), if ending.is_none() && !exited => {
                ending = Some(Ending::TimedOut);
            }
            () = &mut cancel, if !cancel_fired => {
                cancel_fired = true;
                if ending.is_none() && !exited {
                    ending = Some(Ending::Cancelled);
                }
            }
            _ = probe.tick(), if probe_input && !exited && ending.is_none() => {
                let epoch = monitor.input_epoch();
                let blocked = input_object
                    .as_ref()
                    .is_some_and(|input| probe::blocked_on_input(identity.root, input));
                if blocked && epoch == probe_epoch {
                    probe_hits += 1;
                    if probe_hits == 2 {
                        monitor.on_input_wait();
                    }
                } else {
                    probe_hits = u32::from(blocked);
                }
                probe_epoch = epoch;
            }
            () = sleep_until_opt(drain_deadline), if drain_deadline.is_some() && teardown_fut.is_none() => {
                // The tree is gone but something still holds the pipes: stop waiting.
                out = None;
                err = None;
                result.pipes_force_closed = true;
            }
        }

        // Any ending other than a natural exit tears the tree down (once).
        if let Some(e) = ending
            && e != Ending::Exited
            && teardown_fut.is_none()
            && !teardown_done
            && (!exited || teardown::may_have_survivors(&identity))
        {
            if e == Ending::OutputCeiling {
                out = None;
                err = None;
            }
            teardown_fut = Some(start_teardown(&identity));
        }
    }
    drop(registration);
    drop(sandbox);
    crate::reaper::sweep_adopted_zombies();
    result.ending = ending.unwrap_or(Ending::Exited);
    result.elapsed = started.elapsed();
    result
}

fn merge(previous: Option<TeardownReport>, next: TeardownReport) -> TeardownReport {
    match previous {
        None => next,
        Some(p) => TeardownReport {
            processes_signalled: p.processes_signalled + next.processes_signalled,
            killed_after_grace: p.killed_after_grace + next.killed_after_grace,
            survivors: next.survivors,
            elapsed_ms: p.elapsed_ms + next.elapsed_ms,
        },
    }
}

async fn run_teardown(teardown: &mut Option<TeardownFuture>) -> TeardownReport {
    match teardown.as_mut() {
        Some(running) => running.await,
        None => std::future::pending().await,
    }
}

async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut Option<R>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match reader.as_mut() {
        // A terminal's master side reports EIO once every slave descriptor is closed: that is
        // its end-of-file.
        Some(r) => match r.read(buf).await {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
            other => other,
        },
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

#[allow(clippy::too_many_arguments)]
fn handle_read<R>(
    read: io::Result<usize>,
    stream: Stream,
    buf: &[u8],
    reader: &mut Option<R>,
    total_before: u64,
    limits: &Limits,
    monitor: &mut dyn Monitor,
    result: &mut Supervised,
    ending: &mut Option<Ending>,
) {
    match read {
        Ok(0) => *reader = None,
        Ok(n) => {
            let room = limits.output_ceiling_bytes.saturating_sub(total_before);
            let keep = usize::try_from(room).unwrap_or(usize::MAX).min(n);
            if keep > 0 {
                monitor.on_output(stream, &buf[..keep]);
            }
            match stream {
                Stream::Stdout => result.stdout_bytes += keep as u64,
                Stream::Stderr => result.stderr_bytes += keep as u64,
            }
            if keep < n {
                result.discarded_bytes += (n - keep) as u64;
                *reader = None;
                if ending.is_none() || *ending == Some(Ending::Exited) {
                    *ending = Some(Ending::OutputCeiling);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) => {
            *reader = None;
            result
                .error
                .get_or_insert_with(|| format!("reading {}: {e}", stream_label(stream)));
            if ending.is_none() {
                *ending = Some(Ending::SupervisionFailed);
            }
        }
    }
}
