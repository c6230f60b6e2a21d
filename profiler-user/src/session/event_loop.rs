//! The session's event loop: drains the ring buffer, drives discovery and progress on one
//! beat, and ends on the duration, the launched command's exit, or a signal.

use std::{
    io::IsTerminal,
    process::Child,
    time::{Duration, Instant},
};

use tokio::io::{Interest, unix::AsyncFd};

use super::Session;
use crate::record::RecordError;

/// How often the ring buffer is drained when the kernel has not woken us (it wakes us only
/// once a batch has accumulated): on the discovery beat, which keeps a session's fixed cost
/// low; but after a sample came too late (its code object or deep stack had already changed
/// when we read it: code churning, processes exiting) and in the first second after a
/// process is registered, often, so that short-lived code objects and processes are read
/// before they are gone.
const DRAIN_INTERVAL_BUSY: Duration = Duration::from_millis(10);
/// How long after the last late sample the busy interval is kept.
const BUSY_HOLD: Duration = Duration::from_secs(5);
/// How long after a process is registered the busy interval is kept: the kernel wakes us
/// only once a batch of records has accumulated, so without it a process that lives about a
/// second could exit before its first records are read (and its code objects with it).
const NEW_PROCESS_HOLD: Duration = Duration::from_secs(1);
/// How often the progress line is updated (on the next beat after it is due).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Work done every period inside the loop (the agent's uploads).
pub(crate) type PeriodicHook<'a> = dyn FnMut(&mut Session) + 'a;

/// What ends a session's event loop, and what runs periodically inside it.
pub(crate) struct LoopControl<'a> {
    /// Stop after this long.
    pub(crate) duration: Option<Duration>,
    /// Stop when this launched command exits.
    pub(crate) child: Option<&'a mut Child>,
    /// Show progress on stderr (elapsed, samples, processes).
    pub(crate) progress: bool,
    /// How often to look for new processes.
    pub(crate) discovery_interval: Duration,
    /// Called every period with the session (the agent's uploads).
    pub(crate) periodic: Option<(Duration, &'a mut PeriodicHook<'a>)>,
    /// Stop once all these processes have exited (`record --pid`).
    pub(crate) until_exited: Option<&'a super::exit_watch::ExitWatch>,
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopEnd {
    DurationElapsed,
    /// The launched command exited with this status (128 + signal when killed).
    CommandExited(i32),
    /// Ctrl-C (SIGINT).
    Interrupted,
    /// SIGTERM.
    Terminated,
    /// Every process `record --pid` was given has exited.
    TargetsExited,
}

/// Runs the session: reads samples as the kernel sends them, scans for processes, until
/// `control` says stop. Then sampling stops (the kernel programs are detached) and what is
/// still in the ring buffer and in the CPUs' batches of off-CPU records is processed too.
pub(crate) async fn run_loop(
    session: &mut Session,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    mut control: LoopControl<'_>,
) -> Result<LoopEnd, RecordError> {
    let runtime_error = |e: std::io::Error| RecordError::Runtime(e.to_string());
    // SAFETY: the ring buffer owns its fd, which stays open for the AsyncFd's lifetime.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| RecordError::Runtime(e.to_string()))?;
    session.start_discovery(control.discovery_interval)?;
    let started = Instant::now();
    // One timer drives draining, the launched command's check and progress, so that an idle
    // session wakes only on the beat (discovery runs on its own thread).
    let beat = control.discovery_interval;
    let drain = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(drain);
    let mut next_scan = Instant::now();
    // Progress lines are due at whole seconds of the recording.
    let mut progress_due: u32 = 1;
    let mut late_at_last_drain = session.late_samples;
    let mut last_late: Option<Instant> = None;
    let mut registered_at_last_drain = session.registered;
    // Processes registered before the loop (`--pid`) are new too, and so is a launched
    // command, which discovery registers as soon as its interpreter is initialised: its first
    // records are read within `DRAIN_INTERVAL_BUSY`, before a short program exits with them.
    let mut last_registered: Option<Instant> =
        (session.registered > 0 || control.child.is_some()).then(Instant::now);
    let period = control.periodic.as_ref().map(|(d, _)| *d).unwrap_or(Duration::from_secs(3600));
    let mut periodic_tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let deadline = control.duration.map(|d| tokio::time::Instant::from_std(started + d));
    let interactive = std::io::stderr().is_terminal();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(runtime_error)?;
    let end = loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(runtime_error)?;
                drain_ring(session, guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = &mut drain => {
                drain_ring(session, ring.get_mut());
                let now = Instant::now();
                if session.late_samples != late_at_last_drain {
                    last_late = Some(now);
                    late_at_last_drain = session.late_samples;
                }
                if session.registered != registered_at_last_drain {
                    last_registered = Some(now);
                    registered_at_last_drain = session.registered;
                }
                if now >= next_scan {
                    if let Some(c) = control.child.as_mut() {
                        if let Ok(Some(status)) = c.try_wait() {
                            break LoopEnd::CommandExited(exit_code(status));
                        }
                    }
                    if control.until_exited.is_some_and(|w| w.all_exited()) {
                        break LoopEnd::TargetsExited;
                    }
                    next_scan = now + session.beat_interval(beat);
                }
                if control.progress && now >= started + PROGRESS_INTERVAL * progress_due {
                    show_progress(session, started, progress_due, interactive);
                    progress_due = (now.duration_since(started).as_secs() as u32).saturating_add(1);
                }
                let busy = last_late.is_some_and(|t| now.duration_since(t) < BUSY_HOLD)
                    || last_registered.is_some_and(|t| now.duration_since(t) < NEW_PROCESS_HOLD);
                let next = if busy { now + DRAIN_INTERVAL_BUSY } else { next_scan };
                drain.as_mut().reset(tokio::time::Instant::from_std(next));
            }
            _ = periodic_tick.tick(), if control.periodic.is_some() => {
                drain_ring(session, ring.get_mut());
                if let Some((_, hook)) = control.periodic.as_mut() {
                    hook(session);
                }
            }
            _ = sleep => break LoopEnd::DurationElapsed,
            _ = &mut ctrl_c => break LoopEnd::Interrupted,
            _ = sigterm.recv() => break LoopEnd::Terminated,
        }
    };
    if interactive && control.progress {
        eprint!("\r\x1b[K");
    }
    session.stop_discovery();
    // Sampling stops before the last drain, so that every record sent is read, and what
    // the CPUs still hold in their batches of off-CPU records is read after it.
    session.kernel.detach();
    session.sampling_stopped_ns = Some(crate::loader::monotonic_ns());
    drain_ring(session, ring.get_mut());
    for batch in session.kernel.unsent_off_cpu_batches() {
        session.off_cpu_batches_at_end += 1;
        session.on_off_cpu_records(&batch);
    }
    session.release_due_held(true);
    Ok(end)
}

/// Processes every record waiting in the ring buffer, after what discovery reported (so the
/// processes the samples come from are known).
fn drain_ring(session: &mut Session, ring: &mut aya::maps::RingBuf<aya::maps::MapData>) {
    session.apply_discovery();
    while let Some(item) = ring.next() {
        session.on_ring_item(&item);
    }
    session.release_due_held(false);
}

/// Updates the progress line on stderr: in place on a terminal, every 5 s otherwise.
/// `second` is the whole second of the recording the line is due for.
fn show_progress(session: &Session, started: Instant, second: u32, interactive: bool) {
    let line = format!(
        "pyperch: {:>6.1} s  {:>9} samples  {:>4} processes",
        started.elapsed().as_secs_f64(),
        session.totals().samples(),
        session.live_processes()
    );
    if interactive {
        eprint!("\r{line}\x1b[K");
    } else if second.is_multiple_of(5) {
        eprintln!("{line}");
    }
}

/// The exit status of a finished command, shell-style.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}
