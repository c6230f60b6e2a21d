//! Threads already switched out when their process was registered (`record --mode wall` and
//! `--mode off-cpu`): the wait the scheduler-switch program did not see begin.
//!
//! The kernel charges an off-CPU interval from a switch-out it saw to the switch-in that ends
//! it. A thread blocked since before the kernel watched its process (a worker in
//! `queue.get()`, `time.sleep(3600)`, `Thread.join`) has no such switch-out; the kernel notes
//! instead the time of its first switch-in (`ThreadSwitch::first_in_ns`), or nothing if it
//! never runs before the end. Its wait from the registration `R` up to that switch-in `T` (or
//! the end `E`) was spent with one unchanging stack, which userspace reads from the target's
//! memory the way `pyperch dump` does ([`crate::target::thread_stacks::dump_inspected`]), on a thread of its
//! own (never on the sampling loop), once the kernel watches the process: for `record`'s
//! explicit processes from the attach of the scheduler-switch program, for those discovery
//! finds later from their registration (`DiscoveryEvent::Registered`). The snapshot ends at
//! `S`, read after every stack of the process was read. At the end of a period (`agent`'s
//! interval, `top`'s tick) and at the end of the recording the kernel's entries are read, and
//! each snapshot's threads are charged (the part of their wait not charged yet) or dropped; a
//! thread whose wait is over (or that was dropped) is closed, a thread still blocked stays
//! open for the next period, so a worker asleep for months shows in every period's profile.
//!
//! Exact or nothing, per thread ([`verdict`]):
//! - first switch seen a switch-out: it was running at `R`; the kernel has all of its time;
//! - first switch a switch-in at `T` > `S`: it had not run since `R` when its stack was read,
//!   so that stack is the wait's: `[R, T]` is charged to it;
//! - first switch a switch-in at `T` <= `S`: it may have run before it was read; the wait is
//!   dropped (counted: "woke before they were read");
//! - no switch at all up to `E`: its state when read tells whether it was running (`R`: the
//!   kernel's samples have it) or off a CPU all along: `[R, E]` is charged, if the thread is
//!   still the one that was read (same start time; an exited thread's entry is freed by the
//!   kernel, so its wait is dropped and counted as ended).
//!
//! A thread started after `R` cannot be charged: its first switch is the switch-in that
//! starts it, and it has Python frames only once it has run, so a snapshot that shows it with
//! frames was taken after that switch-in (`T` <= `S`: dropped, and counted with the waits that
//! woke before they were read); one read before it ran has no frames (nothing).
//!
//! The leaf says why: `<off-cpu: preempted>` for a thread that was runnable (`R` in `stat`)
//! when read, `<off-cpu: sleep>` otherwise. A wait for the GIL needs no leaf of its own here:
//! a thread waiting for the GIL sleeps at most one switch interval (5 ms) at a time before it
//! wakes to ask again, so its first switch-in comes before its snapshot is done and the wait
//! is dropped as "woke before it was read", never charged as a sleep.
//! Not done with native or kernel frames (`--native`, `--kernel`) or asyncio task stacks
//! (`--async`): the snapshot has Python frames only, so those recordings keep the former
//! behaviour.

use std::sync::{
    Arc, mpsc,
    atomic::{AtomicUsize, Ordering},
};
use std::time::Duration;

use profiler_common::off_cpu_reason;

use crate::target::discovery::PythonProcess;
use crate::target::thread_stacks::{self, DumpOptions, Frame};

/// How long the end of a recording waits for snapshots still being read.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// One thread as read by a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ThreadRead {
    pub(crate) tid: u32,
    /// `stat` field 22, to tell the thread from a later one with its tid.
    pub(crate) start_time: u64,
    /// `R` in `stat` when read: on a CPU or waiting for one.
    pub(crate) runnable: bool,
    /// Root first; `None`: not read consistently.
    pub(crate) frames: Option<Vec<Frame>>,
    /// Its arrivals on a CPU (`schedstat`), read before its stack; `None`: not read. The same
    /// count later proves it has not run since, across pauses of the scheduler-switch program
    /// ([`proven_across_pauses`]).
    pub(crate) arrivals: Option<u64>,
}

/// The threads of one process, read after its registration.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) pid: u32,
    pub(crate) generation: u32,
    /// When the kernel watched the process (monotonic clock, ns): `R`.
    pub(crate) registered_ns: u64,
    /// When every stack of the process had been read: `S`.
    pub(crate) taken_ns: u64,
    /// `None`: the process could not be read (it is dropped as a whole).
    pub(crate) threads: Option<Vec<ThreadRead>>,
}

/// A thread of a snapshot whose wait may still be charged.
#[derive(Debug)]
pub(crate) struct OpenThread {
    pub(crate) read: ThreadRead,
    /// Charged up to here (monotonic ns; `R` before the first charge).
    pub(crate) charged_until: u64,
}

/// A snapshot received, with its threads still open.
#[derive(Debug)]
pub(crate) struct OpenSnapshot {
    pub(crate) pid: u32,
    pub(crate) generation: u32,
    pub(crate) registered_ns: u64,
    pub(crate) taken_ns: u64,
    pub(crate) threads: Vec<OpenThread>,
    /// What [`held_bytes`] counted for it, given back when it closes.
    held: usize,
}

/// What a period's look at one open thread decided (see [`step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Charge `ns` more (from `charged_until` to `until`) below a leaf for `reason`.
    Charge { ns: u64, until: u64, reason: u32, first: bool },
    /// Nothing more to do with the thread, whose charges (if any) are complete.
    Close(Option<Dropped>),
    /// Still blocked: look again at the next period.
    Keep,
}

/// One period's decision for `thread` (charged up to `charged_until` so far), at `now_ns`;
/// `last`: the recording ends (an open thread is closed after its charge).
pub(crate) fn step(
    registered_ns: u64,
    taken_ns: u64,
    now_ns: u64,
    thread: &OpenThread,
    first: FirstSwitch,
    alive: bool,
    last: bool,
) -> Step {
    let charged_before = thread.charged_until > registered_ns;
    match verdict(registered_ns, taken_ns, now_ns, &thread.read, first, alive) {
        Verdict::Nothing => Step::Close(None),
        // A thread charged in an earlier period that is gone now ended after that period
        // (an exit needs a switch-in, whose entry the kernel freed): its charges stand.
        Verdict::Dropped(Dropped::Ended) if charged_before => Step::Close(None),
        Verdict::Dropped(why) => Step::Close(Some(why)),
        Verdict::Charge { ns, reason } => {
            let until = registered_ns.saturating_add(ns);
            let over = last || matches!(first, FirstSwitch::In(_));
            if until > thread.charged_until {
                Step::Charge { ns: until - thread.charged_until, until, reason, first: !charged_before }
            } else if over {
                Step::Close(None)
            } else {
                Step::Keep
            }
        }
    }
}

/// What the kernel saw of a thread since its process was registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstSwitch {
    /// No switch at all.
    None,
    /// A switch-in at this time, before any switch-out.
    In(u64),
    /// A switch-out: it was running.
    Out,
}

impl FirstSwitch {
    /// From the kernel's entry for the thread, if it is of this registration.
    pub(crate) fn of(entry: Option<&profiler_common::ThreadSwitch>, pid: u32, generation: u32) -> Self {
        match entry.filter(|e| e.tgid == pid && e.generation == generation) {
            None => FirstSwitch::None,
            Some(e) if e.first_in_ns != 0 => FirstSwitch::In(e.first_in_ns),
            Some(_) => FirstSwitch::Out,
        }
    }
}

/// Whether what the kernel saw of `thread` (`first`, and `entry`'s count at that switch-in)
/// still tells its wait exactly when the scheduler-switch program was paused since the
/// registration; `arrivals_now`: the thread's count read now, after the caller's time (asked
/// for only when no switch was seen). The snapshot itself must have been read with the
/// program attached (the caller checks), so a run before the read was seen.
///
/// - a switch-in seen: the thread did not run between its count's read and that switch-in if
///   the kernel's count there is the same;
/// - no switch seen: it has not run since its count's read if the count now is the same;
/// - a switch-out seen: nothing is charged anyway.
///
/// Not proven (dropped, counted as `Paused`): a count not read, or another count.
pub(crate) fn proven_across_pauses(thread: &ThreadRead, first: FirstSwitch, first_in_arrivals: u64, arrivals_now: impl FnOnce() -> Option<u64>) -> bool {
    match (first, thread.arrivals) {
        (FirstSwitch::Out, _) => true,
        (_, None) => false,
        // 0: the kernel had no count (no BTF offset).
        (FirstSwitch::In(_), Some(read)) => first_in_arrivals != 0 && first_in_arrivals == read,
        (FirstSwitch::None, Some(read)) => arrivals_now() == Some(read),
    }
}

/// Why a wait at the start was not charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// It ran before (or while) its stack was read.
    WokeBeforeRead,
    /// Its stack could not be read consistently, or the snapshot was not done in time.
    NotRead,
    /// It ended before the recording did.
    Ended,
    /// The scheduler-switch program was paused while the snapshot was read, or the thread ran
    /// unseen during a later pause (`--max-cpu`; see [`proven_across_pauses`]).
    Paused,
}

/// What to do with one thread of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not blocked at the start, or no Python frames: nothing to add (the kernel has it).
    Nothing,
    /// Charge `ns` with the stack read, below a leaf for `reason` (`off_cpu_reason`).
    Charge { ns: u64, reason: u32 },
    Dropped(Dropped),
}

/// The rule of the module docs for one thread read at `taken_ns`, of a process registered at
/// `registered_ns`, the recording ending at `end_ns`; `alive`: the same thread still exists
/// at the end.
pub(crate) fn verdict(registered_ns: u64, taken_ns: u64, end_ns: u64, thread: &ThreadRead, first: FirstSwitch, alive: bool) -> Verdict {
    if thread.frames.as_ref().is_some_and(|f| f.is_empty()) {
        // No Python code on the thread: the kernel's intervals of such a thread show nothing either.
        return Verdict::Nothing;
    }
    let reason = if thread.runnable { off_cpu_reason::PREEMPTED } else { off_cpu_reason::SLEEP };
    let charge = |until: u64| match &thread.frames {
        None => Verdict::Dropped(Dropped::NotRead),
        Some(_) => Verdict::Charge { ns: until.min(end_ns).saturating_sub(registered_ns), reason },
    };
    match first {
        FirstSwitch::Out => Verdict::Nothing,
        FirstSwitch::In(t) if t <= registered_ns => Verdict::Nothing,
        FirstSwitch::In(t) if t <= taken_ns => Verdict::Dropped(Dropped::WokeBeforeRead),
        FirstSwitch::In(t) => charge(t),
        FirstSwitch::None if thread.runnable => Verdict::Nothing,
        FirstSwitch::None if !alive => Verdict::Dropped(Dropped::Ended),
        FirstSwitch::None => charge(end_ns),
    }
}

/// Threads whose arrivals a snapshot reads, at most (one short `schedstat` read each); the
/// others' waits are not proven across a pause.
const MAX_ARRIVALS_READ: usize = 4096;

/// Reads every thread of `process` (its arrivals, then its stack and state), for a snapshot.
fn read_threads(process: &PythonProcess) -> Option<Vec<ThreadRead>> {
    let arrivals: std::collections::HashMap<u32, u64> = thread_stacks::proc_threads::task_ids(process.pid)
        .unwrap_or_default()
        .into_iter()
        .take(MAX_ARRIVALS_READ)
        .filter_map(|tid| Some((tid, crate::kernel::switch_gate::thread_arrivals(process.pid, tid)?)))
        .collect();
    let dumped = thread_stacks::dump_inspected(process, DumpOptions::default()).ok()?;
    let threads = dumped
        .threads
        .into_iter()
        .filter(|t| t.python)
        .filter_map(|t| {
            let start_time = thread_stacks::proc_threads::task_start(process.pid, t.tid)?;
            Some(ThreadRead { tid: t.tid, start_time, runnable: t.kernel.state == "R", frames: t.stack, arrivals: arrivals.get(&t.tid).copied() })
        })
        .collect();
    Some(threads)
}

/// Snapshots waiting to be read, at most; more are not read (counted).
const MAX_QUEUED: usize = 256;

/// Bytes that the snapshots of one recording may hold in all (each is kept until the end, one
/// per registered process, so a long whole-host recording would otherwise grow with every
/// process it meets): once over, further processes are not read (counted as not read).
const HELD_BUDGET: usize = 32 << 20;

/// The bytes `threads` hold: their entries, frames and the frames' strings.
fn held_bytes(threads: &[ThreadRead]) -> usize {
    let frame = |f: &Frame| std::mem::size_of::<Frame>() + f.function.len() + f.file.len();
    threads
        .iter()
        .map(|t| std::mem::size_of::<ThreadRead>() + t.frames.as_deref().map_or(0, |fs| fs.iter().map(frame).sum()))
        .sum()
}

/// One snapshot to take.
struct Request {
    process: PythonProcess,
    generation: u32,
    registered_ns: u64,
}

/// The thread that reads snapshots, one after another, and sends each back.
struct Worker {
    requests: mpsc::SyncSender<Request>,
    done: mpsc::Receiver<(Snapshot, usize)>,
    /// Bytes the open snapshots hold (the worker adds, closing gives back).
    held: Arc<AtomicUsize>,
}

impl Worker {
    fn start() -> Option<Worker> {
        let (requests, asked) = mpsc::sync_channel::<Request>(MAX_QUEUED);
        let (send, done) = mpsc::channel();
        let held = Arc::new(AtomicUsize::new(0));
        let held_by_worker = held.clone();
        std::thread::Builder::new()
            .name("pyperch-blocked".into())
            .spawn(move || {
                for Request { process, generation, registered_ns } in asked {
                    let room = held_by_worker.load(Ordering::Relaxed) < HELD_BUDGET;
                    let threads = if room { read_threads(&process) } else { None };
                    let bytes = threads.as_deref().map_or(0, held_bytes);
                    held_by_worker.fetch_add(bytes, Ordering::Relaxed);
                    let taken_ns = crate::kernel::loader::monotonic_ns();
                    let snapshot = Snapshot { pid: process.pid, generation, registered_ns, taken_ns, threads };
                    if send.send((snapshot, bytes)).is_err() {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Worker { requests, done, held })
    }
}

/// The snapshots asked for, read on a thread of their own (started at the first one, after
/// privileges were dropped), and what came of them.
#[derive(Default)]
pub(crate) struct BlockedAtStart {
    enabled: bool,
    worker: Option<Worker>,
    /// Snapshots asked for and not received yet.
    outstanding: u64,
    /// Snapshots received whose threads are not all closed.
    pub(crate) open: Vec<OpenSnapshot>,
    pub(crate) charged_threads: u64,
    pub(crate) charged_ns: u64,
    pub(crate) woke_before_read: u64,
    pub(crate) not_read: u64,
    pub(crate) ended: u64,
    /// Waits whose thread may have run unseen while the scheduler-switch program was paused
    /// (`--max-cpu`, see `kernel::switch_gate`).
    pub(crate) paused: u64,
    /// Processes whose snapshot failed, was not taken (queue full or `HELD_BUDGET` spent) or
    /// was not done by the end.
    pub(crate) processes_not_read: u64,
}

impl BlockedAtStart {
    /// Takes snapshots from now on (`record` in the off-CPU modes: it charges them at the end).
    pub(crate) fn enable(&mut self) {
        self.enabled = true;
    }

    /// Whether snapshots are taken (for `--stats`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Asks for a snapshot of `process` (registration `generation`), which the kernel watches
    /// since `registered_ns`.
    pub(crate) fn ask(&mut self, process: PythonProcess, generation: u32, registered_ns: u64) {
        if !self.enabled {
            return;
        }
        if self.worker.is_none() {
            self.worker = Worker::start();
        }
        let sent = self.worker.as_ref().is_some_and(|w| w.requests.try_send(Request { process, generation, registered_ns }).is_ok());
        if sent {
            self.outstanding += 1;
        } else {
            self.processes_not_read += 1;
        }
    }

    /// Moves the snapshots done into [`BlockedAtStart::open`]; `last`: the recording ends,
    /// so wait up to `FINISH_WAIT` in all for those still being read (the rest are counted as
    /// not read).
    pub(crate) fn receive(&mut self, last: bool) {
        let deadline = std::time::Instant::now() + FINISH_WAIT;
        if let Some(worker) = &self.worker {
            while self.outstanding > 0 {
                let next = if last {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    worker.done.recv_timeout(left).ok()
                } else {
                    worker.done.try_recv().ok()
                };
                let Some((snapshot, held)) = next else { break };
                self.outstanding -= 1;
                let Some(threads) = snapshot.threads else {
                    self.processes_not_read += 1;
                    continue;
                };
                let threads =
                    threads.into_iter().map(|read| OpenThread { read, charged_until: snapshot.registered_ns }).collect();
                self.open.push(OpenSnapshot {
                    pid: snapshot.pid,
                    generation: snapshot.generation,
                    registered_ns: snapshot.registered_ns,
                    taken_ns: snapshot.taken_ns,
                    threads,
                    held,
                });
            }
        }
        if last {
            self.processes_not_read += std::mem::take(&mut self.outstanding);
        }
    }

    /// Forgets the open snapshots left without threads, giving their bytes back.
    pub(crate) fn close_empty(&mut self) {
        let held = self.worker.as_ref().map(|w| w.held.clone());
        self.open.retain(|s| {
            if s.threads.is_empty() {
                if let Some(held) = &held {
                    held.fetch_sub(s.held, Ordering::Relaxed);
                }
                false
            } else {
                true
            }
        });
    }

    /// Counts one verdict (charges are counted by the caller once added).
    pub(crate) fn count_dropped(&mut self, why: Dropped) {
        match why {
            Dropped::WokeBeforeRead => self.woke_before_read += 1,
            Dropped::NotRead => self.not_read += 1,
            Dropped::Ended => self.ended += 1,
            Dropped::Paused => self.paused += 1,
        }
    }

    /// The `--stats` line.
    pub(crate) fn report(&self) -> String {
        format!(
            "blocked at start (off-CPU before the first switch seen): {} threads charged ({:.3} s), dropped: {} woke before they were read, {} not read, {} ended; {} processes not read",
            self.charged_threads,
            self.charged_ns as f64 / 1e9,
            self.woke_before_read,
            self.not_read,
            self.ended,
            self.processes_not_read
        ) + &if self.paused > 0 {
            format!("; {} dropped after a pause of the scheduler-switch program (--max-cpu)", self.paused)
        } else {
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(runnable: bool, frames: Option<usize>) -> ThreadRead {
        let frame = Frame { function: "f".into(), file: "f.py".into(), line: Some(1), first_line: 1, locals: None };
        ThreadRead { tid: 7, start_time: 1, runnable, frames: frames.map(|n| vec![frame; n]), arrivals: Some(40) }
    }

    const R: u64 = 1_000;
    const S: u64 = 2_000;
    const E: u64 = 10_000;

    #[test]
    fn running_at_registration_adds_nothing() {
        assert_eq!(verdict(R, S, E, &thread(false, Some(2)), FirstSwitch::Out, true), Verdict::Nothing);
        assert_eq!(verdict(R, S, E, &thread(true, Some(2)), FirstSwitch::None, true), Verdict::Nothing);
        // Switched in between the attach and the registration time.
        assert_eq!(verdict(R, S, E, &thread(false, Some(2)), FirstSwitch::In(R), true), Verdict::Nothing);
    }

    #[test]
    fn woken_after_the_read_is_charged_up_to_the_switch_in() {
        let v = verdict(R, S, E, &thread(false, Some(2)), FirstSwitch::In(S + 500), false);
        assert_eq!(v, Verdict::Charge { ns: S + 500 - R, reason: off_cpu_reason::SLEEP });
        let v = verdict(R, S, E, &thread(true, Some(2)), FirstSwitch::In(S + 1), true);
        assert_eq!(v, Verdict::Charge { ns: S + 1 - R, reason: off_cpu_reason::PREEMPTED });
    }

    #[test]
    fn woken_before_the_read_is_dropped() {
        assert_eq!(verdict(R, S, E, &thread(false, Some(2)), FirstSwitch::In(S), true), Verdict::Dropped(Dropped::WokeBeforeRead));
        assert_eq!(verdict(R, S, E, &thread(false, Some(2)), FirstSwitch::In(R + 1), true), Verdict::Dropped(Dropped::WokeBeforeRead));
    }

    #[test]
    fn blocked_all_along_is_charged_to_the_end() {
        let v = verdict(R, S, E, &thread(false, Some(3)), FirstSwitch::None, true);
        assert_eq!(v, Verdict::Charge { ns: E - R, reason: off_cpu_reason::SLEEP });
        assert_eq!(verdict(R, S, E, &thread(false, Some(3)), FirstSwitch::None, false), Verdict::Dropped(Dropped::Ended));
    }

    #[test]
    fn unread_or_empty_stacks() {
        assert_eq!(verdict(R, S, E, &thread(false, None), FirstSwitch::None, true), Verdict::Dropped(Dropped::NotRead));
        assert_eq!(verdict(R, S, E, &thread(false, None), FirstSwitch::In(S + 1), true), Verdict::Dropped(Dropped::NotRead));
        assert_eq!(verdict(R, S, E, &thread(false, Some(0)), FirstSwitch::None, true), Verdict::Nothing);
    }

    fn open(frames: Option<usize>, charged_until: u64) -> OpenThread {
        OpenThread { read: thread(false, frames), charged_until }
    }

    #[test]
    fn periods_charge_a_thread_still_asleep_part_by_part() {
        // First period, ending at P1: [R, P1], its first charge.
        let p1 = S + 1_000;
        let t = open(Some(2), R);
        let step1 = step(R, S, p1, &t, FirstSwitch::None, true, false);
        assert_eq!(step1, Step::Charge { ns: p1 - R, until: p1, reason: off_cpu_reason::SLEEP, first: true });
        // Second period: only [P1, P2], still open.
        let t = open(Some(2), p1);
        let p2 = p1 + 3_000;
        assert_eq!(step(R, S, p2, &t, FirstSwitch::None, true, false), Step::Charge { ns: 3_000, until: p2, reason: off_cpu_reason::SLEEP, first: false });
        // Woke at W before P3: [P2, W] and closed (the kernel has the rest).
        let t = open(Some(2), p2);
        let w = p2 + 500;
        assert_eq!(step(R, S, p2 + 2_000, &t, FirstSwitch::In(w), true, false), Step::Charge { ns: 500, until: w, reason: off_cpu_reason::SLEEP, first: false });
        // Nothing new since the last period: kept, or closed at the end.
        let t = open(Some(2), p2);
        assert_eq!(step(R, S, p2, &t, FirstSwitch::None, true, false), Step::Keep);
        assert_eq!(step(R, S, p2, &t, FirstSwitch::None, true, true), Step::Close(None));
    }

    #[test]
    fn a_thread_gone_after_charges_keeps_them() {
        // Never charged: dropped as ended (counted).
        assert_eq!(step(R, S, E, &open(Some(2), R), FirstSwitch::None, false, false), Step::Close(Some(Dropped::Ended)));
        // Charged up to an earlier period's end: it ended after that; closed, not counted.
        assert_eq!(step(R, S, E, &open(Some(2), S + 10), FirstSwitch::None, false, false), Step::Close(None));
        // Woke before its snapshot was read: dropped whatever the period.
        assert_eq!(step(R, S, E, &open(Some(2), R), FirstSwitch::In(S), true, false), Step::Close(Some(Dropped::WokeBeforeRead)));
    }

    #[test]
    fn across_pauses_the_arrivals_count_proves_a_wait() {
        let t = thread(false, Some(2));
        // No switch seen: the count now must be the one read before the stack.
        assert!(proven_across_pauses(&t, FirstSwitch::None, 0, || Some(40)));
        assert!(!proven_across_pauses(&t, FirstSwitch::None, 0, || Some(41)), "ran unseen in a pause");
        assert!(!proven_across_pauses(&t, FirstSwitch::None, 0, || None), "gone, or no read left");
        // A switch-in seen: the kernel's count there must be the same.
        assert!(proven_across_pauses(&t, FirstSwitch::In(S + 5), 40, || panic!("not read")));
        assert!(!proven_across_pauses(&t, FirstSwitch::In(S + 5), 42, || None));
        assert!(!proven_across_pauses(&t, FirstSwitch::In(S + 5), 0, || None), "no count in the kernel");
        // Running first: nothing to charge, nothing to prove.
        assert!(proven_across_pauses(&t, FirstSwitch::Out, 0, || None));
        // No count read with the snapshot: never proven.
        let unread = ThreadRead { arrivals: None, ..t };
        assert!(!proven_across_pauses(&unread, FirstSwitch::None, 0, || Some(40)));
    }

    #[test]
    fn held_bytes_count_frames_and_their_strings() {
        let empty = held_bytes(&[thread(false, None)]);
        assert_eq!(empty, std::mem::size_of::<ThreadRead>());
        let two = held_bytes(&[thread(false, Some(2))]);
        assert_eq!(two, empty + 2 * (std::mem::size_of::<Frame>() + "f".len() + "f.py".len()));
    }

    #[test]
    fn kernel_entries_of_other_registrations_are_no_switch() {
        let entry = profiler_common::ThreadSwitch { tgid: 5, generation: 2, first_in_ns: 99, ..Default::default() };
        assert_eq!(FirstSwitch::of(Some(&entry), 5, 2), FirstSwitch::In(99));
        assert_eq!(FirstSwitch::of(Some(&entry), 5, 3), FirstSwitch::None);
        assert_eq!(FirstSwitch::of(Some(&entry), 6, 2), FirstSwitch::None);
        assert_eq!(FirstSwitch::of(None, 5, 2), FirstSwitch::None);
        let running = profiler_common::ThreadSwitch { tgid: 5, generation: 2, ..Default::default() };
        assert_eq!(FirstSwitch::of(Some(&running), 5, 2), FirstSwitch::Out);
    }
}
