//! The session's worker loop: takes the records the drain thread (`drain`) read from the
//! ring buffer, drives discovery, progress and periodic work on one beat, and ends on the
//! duration or a signal (noticed by the drain thread), or the launched command's exit.

use std::{
    io::IsTerminal,
    process::Child,
    time::{Duration, Instant},
};

use super::{Session, drain::{self, LoopEnd}};
use super::error::SessionError;

/// The ring buffer is drained when the kernel wakes the drain thread (only once a batch has
/// accumulated) and on the discovery beat, which keeps a session's fixed cost low; but after
/// a sample came too late (its code object or deep stack had already changed when we read
/// it: code churning, processes exiting) and in the first second after a process is
/// registered, often (`drain`'s busy interval), so that short-lived code objects and
/// processes are read before they are gone.
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

/// A deep stack's tail that is not in the frame cache is read from the target only for a
/// record that waited less than this in the worker's queue (`Session::read_tails`): behind
/// that, the stack has most likely changed, and a worker that spends its reads on tails that
/// fail their check falls further behind (a reloading 3.12 sampled at 2 kHz beside another
/// process: 92 % of its samples dropped as stale tails, 27 reads each, its queue full). Tails
/// in the cache are served at any age: the kernel's hash names exactly what it saw.
pub(crate) const TAIL_READ_MAX_WAIT: Duration = Duration::from_millis(100);

/// Processes one record taken from the queue; its tail may be read only if it did not wait
/// there longer than `TAIL_READ_MAX_WAIT`.
fn take_up(session: &mut Session, (_, queued_at, record): drain::Queue) {
    session.read_tails = queued_at.elapsed() <= TAIL_READ_MAX_WAIT;
    session.on_ring_item(&record);
}

/// Records the worker takes from the inbox at a time, between its looks at the clock.
const TAKE_AT_ONCE: usize = 256;
/// How long the worker goes on with records still queued once sampling stopped; what is
/// left then is dropped and counted, so that the end never waits on a slow target.
const END_BUDGET: Duration = Duration::from_secs(1);

/// Runs the session until `control` says stop. Two threads: the drain thread
/// (`drain`) reads the ring buffer into bounded queues and answers the duration and the
/// signals; this thread, the worker, owns the session and does everything else, its reads
/// of target memory with a deadline (`memory::deadline`). Then sampling stops (the kernel
/// programs are detached) and what is still in the ring buffer and in the CPUs' batches of
/// off-CPU records is processed too.
pub(crate) fn run_loop(
    session: &mut Session,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    mut control: LoopControl<'_>,
) -> Result<LoopEnd, SessionError> {
    crate::target::memory::deadline::guard_this_thread();
    session.start_discovery(control.discovery_interval)?;
    session.cpu_budget.start().map_err(|e| SessionError::Runtime(format!("could not start the CPU budget's thread: {e}")))?;
    let started = Instant::now();
    // Drains on the discovery beat at least (discovery runs on its own thread).
    let beat = control.discovery_interval;
    let drain = drain::start(ring, control.duration, beat, started).map_err(|e| SessionError::Runtime(e.to_string()))?;
    let shared = drain.shared.clone();
    let mut next_scan = Instant::now();
    // Progress lines are due at whole seconds of the recording.
    let mut progress_due: u32 = 1;
    let mut late_at_last_drain = session.late_samples;
    let mut registered_at_last_drain = session.registered;
    // Processes registered before the loop (`--pid`) are new too, and so is a launched
    // command, which discovery registers as soon as its interpreter is initialised: its first
    // records are read within the busy interval, before a short program exits with them.
    if session.registered > 0 || control.child.is_some() {
        shared.busy_until(Instant::now() + NEW_PROCESS_HOLD);
    }
    let period = control.periodic.as_ref().map(|(d, _)| *d);
    let mut next_periodic = period.map(|p| started + p);
    let interactive = std::io::stderr().is_terminal();
    let mut records: std::collections::VecDeque<drain::Queue> = std::collections::VecDeque::with_capacity(TAKE_AT_ONCE);
    let end = loop {
        let mut wake_at = next_scan;
        if control.progress {
            wake_at = wake_at.min(started + PROGRESS_INTERVAL * progress_due);
        }
        if let Some(at) = next_periodic {
            wake_at = wake_at.min(at);
        }
        // Records left from the last turn are taken up at once, after the periodic work.
        let wait_until = if records.is_empty() { wake_at } else { Instant::now() };
        let ended = shared.take(wait_until, TAKE_AT_ONCE, &mut records);
        session.apply_discovery();
        // The end and the periodic work are looked at between records (a record may wait on
        // a target up to a read's deadline): what is left waits for the next turn, or the
        // end's budget.
        while !shared.has_ended() && next_periodic.is_none_or(|at| Instant::now() < at) {
            let Some(item) = records.pop_front() else { break };
            take_up(session, item);
        }
        session.release_due_held(false);
        if let Some(end) = ended.or_else(|| shared.end_reason()) {
            break end;
        }
        let now = Instant::now();
        if session.late_samples != late_at_last_drain {
            shared.busy_until(now + BUSY_HOLD);
            late_at_last_drain = session.late_samples;
        }
        if session.registered != registered_at_last_drain {
            shared.busy_until(now + NEW_PROCESS_HOLD);
            registered_at_last_drain = session.registered;
        }
        if now >= next_scan {
            if let Some(c) = control.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    shared.end(LoopEnd::CommandExited(exit_code(status)));
                    continue;
                }
            }
            if control.until_exited.is_some_and(|w| w.all_exited()) {
                shared.end(LoopEnd::TargetsExited);
                continue;
            }
            next_scan = now + session.beat_interval(beat);
        }
        if control.progress && now >= started + PROGRESS_INTERVAL * progress_due {
            show_progress(session, started, progress_due, interactive);
            progress_due = (now.duration_since(started).as_secs() as u32).saturating_add(1);
        }
        if let (Some(at), Some(p)) = (next_periodic, period) {
            if now >= at {
                if let Some((_, hook)) = control.periodic.as_mut() {
                    hook(session);
                }
                // After a stall the next period starts from now: no burst of late ticks.
                next_periodic = Some((at + p).max(Instant::now()));
            }
        }
    };
    if interactive && control.progress {
        eprint!("\r\x1b[K");
    }
    session.stop_discovery();
    // The budget's thread holds the programs' descriptors: it ends (its last second
    // accounted) before they are unloaded.
    session.cpu_budget.stop();
    // Sampling stops before the last drain, so that every record sent is read, and what
    // the CPUs still hold in their batches of off-CPU records is read after it.
    session.kernel.detach();
    session.sampling_stopped_ns = Some(crate::kernel::loader::monotonic_ns());
    drain.finish();
    let end_by = Instant::now() + END_BUDGET;
    session.apply_discovery();
    loop {
        if records.is_empty() {
            shared.take(Instant::now(), TAKE_AT_ONCE, &mut records);
        }
        if records.is_empty() {
            break;
        }
        if Instant::now() >= end_by {
            // The drain thread has ended: nothing more arrives.
            shared.take(Instant::now(), usize::MAX, &mut records);
            shared.dropped_at_end(records.len() as u64);
            records.clear();
            break;
        }
        if let Some(item) = records.pop_front() {
            take_up(session, item);
        }
    }
    for batch in session.kernel.unsent_off_cpu_batches() {
        session.off_cpu_batches_at_end += 1;
        session.on_off_cpu_records(&batch);
    }
    session.release_due_held(true);
    session.drain_counts = shared.counts();
    Ok(end)
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
