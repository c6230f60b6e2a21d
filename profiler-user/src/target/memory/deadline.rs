//! Reads of target memory with a deadline, and the quarantine of targets whose memory does
//! not answer.
//!
//! `process_vm_readv` faults the target's pages in for us. A page of a file on a FUSE server
//! that stopped answering, or of a `userfaultfd` range nobody serves, blocks the reading thread
//! in the kernel for as long as the target likes, and a thread cannot be cancelled. So:
//!
//! - A thread that must never wait on a target (the session's worker, which owns the
//!   profile) calls [`guard_this_thread`]. Its reads then run on a reader thread of its own
//!   (made once, reused); it waits at most [`READ_DEADLINE`] for each, longer only while the
//!   reader is runnable (a loaded machine: slow, not blocked), up to [`SLOW_FACTOR`]
//!   deadlines.
//! - A reader that did not answer is abandoned (it ends by itself if its read ever returns)
//!   and its target quarantined: from then on every read of that process, from any thread,
//!   fails at once ([`MemoryError::Quarantined`]), and the session drops its records
//!   (counted on `--stats`). A quarantined process stays so until [`release`] (the process
//!   exited).
//! - At most [`MAX_STUCK`] abandoned readers may be blocked at once; past that, guarded reads
//!   fail at once rather than piling up threads (one per hostile process reaches it only
//!   with that many hostile processes, each of which is quarantined).
//!
//! - A read is handed over through one slot, not a channel: while reads come in runs (a
//!   stack, a code object's strings) the reader polls for the next one and the guarded
//!   thread for its answer, so a read costs about what it costs on the thread itself (a
//!   couple of microseconds; waking a sleeping thread costs ten or more). A chain of frames
//!   is one job ([`super::ProcessMemory::read_chain`]): a deep tail that changes every
//!   millisecond is read whole before it changes.
//!
//! Threads that are not guarded read on their own stack as before, but still refuse
//! quarantined processes.

use std::{
    cell::RefCell,
    collections::HashSet,
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use super::{Chain, ChainEnd, MemoryError};

/// How long a guarded read is waited for (its reader blocked in the kernel).
pub const READ_DEADLINE: Duration = Duration::from_millis(500);
/// A reader still runnable at its deadline is waited for up to this many deadlines.
const SLOW_FACTOR: u32 = 8;
/// How often a slow reader's state is looked at once its deadline has passed.
const SLOW_CHECK: Duration = Duration::from_millis(50);
/// Abandoned readers that may be blocked at once.
pub const MAX_STUCK: usize = 64;

/// Processes whose memory did not answer a guarded read (by PID).
static QUARANTINED: LazyLock<Mutex<HashSet<u32>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
/// How many PIDs `QUARANTINED` holds: reads skip its lock while it is 0.
static QUARANTINED_NOW: AtomicUsize = AtomicUsize::new(0);
/// Processes quarantined over the run.
pub static QUARANTINED_TOTAL: AtomicU64 = AtomicU64::new(0);
/// Abandoned readers still blocked.
static STUCK: AtomicUsize = AtomicUsize::new(0);
/// Guarded reads refused because `MAX_STUCK` readers were blocked.
pub static REFUSED_TOO_MANY_STUCK: AtomicU64 = AtomicU64::new(0);

/// Whether reads of `pid` are refused (a read of its memory did not answer).
pub fn is_quarantined(pid: u32) -> bool {
    QUARANTINED_NOW.load(Ordering::Relaxed) > 0 && QUARANTINED.lock().map(|q| q.contains(&pid)).unwrap_or(false)
}

/// Puts `pid` in quarantine (its memory did not answer in time); `true` if it was not yet.
pub fn quarantine(pid: u32) -> bool {
    let Ok(mut q) = QUARANTINED.lock() else { return false };
    let new = q.insert(pid);
    if new {
        QUARANTINED_NOW.store(q.len(), Ordering::Relaxed);
        QUARANTINED_TOTAL.fetch_add(1, Ordering::Relaxed);
    }
    new
}

/// Lifts the quarantine of `pid` (the process exited: a new one may get its PID).
pub fn release(pid: u32) {
    if QUARANTINED_NOW.load(Ordering::Relaxed) == 0 {
        return;
    }
    if let Ok(mut q) = QUARANTINED.lock() {
        q.remove(&pid);
        QUARANTINED_NOW.store(q.len(), Ordering::Relaxed);
    }
}

/// Abandoned readers still blocked in the kernel.
pub fn stuck_readers() -> usize {
    STUCK.load(Ordering::Relaxed)
}

/// How long the guarded thread polls for its reader's answer before it sleeps, when the
/// reader was awake to take the read. A read of resident memory takes a microsecond or two
/// and waking a sleeping thread ten or more (more in a VM): a tail of 400 frames pays that
/// some 800 times, and a stack that changes every millisecond is gone by its last frame.
const ANSWER_SPIN: Duration = Duration::from_micros(50);
/// How long a reader stays awake for the next read after answering one, while reads come
/// in runs (the read it just answered came within this time of the one before).
const NEXT_SPIN: Duration = Duration::from_micros(30);
/// The guarded thread's sleeps are cut into pieces this long (it also watches the clock).
const NAP: Duration = Duration::from_millis(5);

/// The states of a [`Slot`].
const EMPTY: u8 = 0;
const POSTED: u8 = 1;
const DONE: u8 = 2;

/// One read at a time between a guarded thread and its reader. `state` says whose turn it
/// is: the guarded thread fills `job` and posts it (`POSTED`), the reader answers in `job`
/// (`DONE`), the guarded thread takes the answer. A side sleeps only after saying so
/// (`*_asleep`, then a last look at `state`), and the other side wakes it after changing
/// `state` (all `SeqCst`), so no wake-up is lost.
struct Slot {
    state: AtomicU8,
    job: Mutex<Job>,
    reader_asleep: AtomicBool,
    guarded_asleep: AtomicBool,
    /// The guarded thread no longer uses this reader (it ended, or gave the reader up).
    closed: AtomicBool,
    /// The reader was given up on a read that did not answer (counted in `STUCK`).
    abandoned: AtomicBool,
    /// The guarded thread, woken by the reader's answer.
    guarded: thread::Thread,
}

/// The read asked for, and its answer.
struct Job {
    pid: u32,
    address: u64,
    /// Bytes asked for; after a chain read, the bytes of its records in `buf`.
    len: usize,
    /// A chain of records from `address` instead of `len` bytes.
    chain: Option<Chain>,
    /// Grows to the longest read asked for (at most `MAX_READ`) and is reused.
    buf: Vec<u8>,
    result: std::io::Result<usize>,
    /// A chain read's end.
    chain_end: Option<ChainEnd>,
}

/// A guarded thread's reader.
struct Reader {
    slot: Arc<Slot>,
    thread: thread::Thread,
    tid: Arc<AtomicI32>,
}

thread_local! {
    /// This thread's reader once it is guarded (`None` inside: guarded, reader not made yet
    /// or abandoned).
    static GUARD: RefCell<Option<Option<Reader>>> = const { RefCell::new(None) };
}

/// From now on this thread's reads of target memory have a deadline (see the module doc).
pub fn guard_this_thread() {
    GUARD.with(|g| {
        let mut g = g.borrow_mut();
        if g.is_none() {
            *g = Some(None);
        }
    });
}

/// Whether this thread's reads run with a deadline.
pub(super) fn guarded() -> bool {
    GUARD.with(|g| g.borrow().is_some())
}

impl Reader {
    fn start() -> Option<Reader> {
        let slot = Arc::new(Slot {
            state: AtomicU8::new(EMPTY),
            job: Mutex::new(Job { pid: 0, address: 0, len: 0, chain: None, buf: Vec::new(), result: Ok(0), chain_end: None }),
            reader_asleep: AtomicBool::new(false),
            guarded_asleep: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            guarded: thread::current(),
        });
        let tid = Arc::new(AtomicI32::new(0));
        let (thread_slot, thread_tid) = (slot.clone(), tid.clone());
        let spawned = thread::Builder::new()
            .name("pyperch-read".into())
            .stack_size(128 << 10)
            .spawn(move || reader_loop(&thread_slot, &thread_tid));
        spawned.ok().map(|handle| Reader { slot, thread: handle.thread().clone(), tid })
    }

    /// Gives up on this reader: it is blocked in the kernel, and ends on its own if that
    /// read ever returns.
    fn abandon(self) {
        STUCK.fetch_add(1, Ordering::Relaxed);
        self.slot.abandoned.store(true, Ordering::SeqCst);
        // Dropping closes the slot.
    }

    /// One read on the reader, waited for within the deadline: `None` when it did not
    /// answer (blocked in the kernel).
    fn read(&self, pid: u32, address: u64, buf: &mut [u8]) -> Option<std::io::Result<usize>> {
        self.ask(pid, address, buf.len(), None, |job| {
            let result = std::mem::replace(&mut job.result, Ok(0));
            if let Ok(got) = result {
                let got = got.min(buf.len()).min(job.buf.len());
                buf[..got].copy_from_slice(&job.buf[..got]);
                return Ok(got);
            }
            result
        })
    }

    /// A chain read on the reader (see `ProcessMemory::read_chain`), its records appended
    /// to `out`; `None` when it did not answer.
    fn read_chain(&self, pid: u32, first: u64, chain: Chain, out: &mut Vec<u8>) -> Option<ChainEnd> {
        self.ask(pid, first, 0, Some(chain), |job| {
            let end = job.chain_end.take().unwrap_or(ChainEnd::Next(0));
            let got = job.len.min(job.buf.len());
            out.extend_from_slice(&job.buf[..got]);
            end
        })
    }

    /// Posts a job, waits for the answer within the deadline and hands it to `take`.
    fn ask<T>(&self, pid: u32, address: u64, len: usize, chain: Option<Chain>, take: impl FnOnce(&mut Job) -> T) -> Option<T> {
        let slot = &self.slot;
        {
            let mut job = slot.job.lock().ok()?;
            (job.pid, job.address, job.len, job.chain) = (pid, address, len, chain);
        }
        slot.state.store(POSTED, Ordering::SeqCst);
        let reader_awake = !slot.reader_asleep.load(Ordering::SeqCst);
        if !reader_awake {
            self.thread.unpark();
        }
        if !self.wait(if reader_awake { ANSWER_SPIN } else { Duration::ZERO }) {
            return None;
        }
        let mut job = slot.job.lock().ok()?;
        slot.state.store(EMPTY, Ordering::SeqCst);
        Some(take(&mut job))
    }

    /// Waits for the answer: polls for `spin`, then sleeps; past `READ_DEADLINE` only while
    /// the reader is runnable (a loaded machine: slow, not blocked), up to `SLOW_FACTOR`
    /// deadlines. `false`: no answer.
    fn wait(&self, spin: Duration) -> bool {
        let slot = &self.slot;
        let done = || slot.state.load(Ordering::SeqCst) == DONE;
        let started = Instant::now();
        while started.elapsed() < spin {
            if done() {
                return true;
            }
            pause(started);
        }
        let mut next_look = READ_DEADLINE;
        loop {
            if done() {
                return true;
            }
            let waited = started.elapsed();
            if waited >= next_look {
                if waited >= READ_DEADLINE * SLOW_FACTOR || !thread_is_runnable(self.tid.load(Ordering::Relaxed)) {
                    // One last look: it may have answered just now.
                    return done();
                }
                next_look = waited + SLOW_CHECK;
            }
            slot.guarded_asleep.store(true, Ordering::SeqCst);
            if !done() {
                thread::park_timeout(NAP.min(next_look.saturating_sub(waited)).max(Duration::from_micros(100)));
            }
            slot.guarded_asleep.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for Reader {
    /// The guarded thread ended or gave the reader up: the reader ends too (once its read
    /// returns, if it is blocked in one).
    fn drop(&mut self) {
        self.slot.closed.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// A reader's life: it waits for a read (awake a while when reads come in runs, else
/// asleep), does it and answers, until the guarded thread closes the slot.
fn reader_loop(slot: &Slot, tid: &AtomicI32) {
    // SAFETY: gettid has no preconditions.
    tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
    let mut last_answer: Option<Instant> = None;
    let mut in_a_run = false;
    while next_read(slot, if in_a_run { NEXT_SPIN } else { Duration::ZERO }) {
        in_a_run = last_answer.is_some_and(|t| t.elapsed() < NEXT_SPIN);
        if let Ok(mut job) = slot.job.lock() {
            let job = &mut *job;
            if let Some(chain) = job.chain {
                let mut records = std::mem::take(&mut job.buf);
                records.clear();
                job.chain_end = Some(super::raw_chain(job.pid, job.address, chain, &mut records));
                job.len = records.len();
                job.buf = records;
            } else {
                if job.buf.len() < job.len {
                    job.buf.resize(job.len, 0);
                }
                job.result = super::raw_read(job.pid, job.address, &mut job.buf[..job.len]);
            }
        }
        last_answer = Some(Instant::now());
        slot.state.store(DONE, Ordering::SeqCst);
        if slot.guarded_asleep.load(Ordering::SeqCst) {
            slot.guarded.unpark();
        }
    }
    // Set before the slot was closed, so it is seen here.
    if slot.abandoned.load(Ordering::SeqCst) {
        STUCK.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A pause between two looks while polling: a busy-wait for the first microseconds, then
/// a yield of the CPU (the other side may be waiting for it, on a machine with few CPUs).
fn pause(started: Instant) {
    if started.elapsed() < Duration::from_micros(5) {
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

/// Waits for the next read: polls for `spin`, then sleeps. `false`: the slot was closed.
fn next_read(slot: &Slot, spin: Duration) -> bool {
    let posted = || slot.state.load(Ordering::SeqCst) == POSTED;
    let closed = || slot.closed.load(Ordering::SeqCst);
    let started = Instant::now();
    loop {
        if closed() {
            return false;
        }
        if posted() {
            return true;
        }
        if started.elapsed() < spin {
            pause(started);
            continue;
        }
        slot.reader_asleep.store(true, Ordering::SeqCst);
        if !posted() && !closed() {
            thread::park();
        }
        slot.reader_asleep.store(false, Ordering::SeqCst);
    }
}

/// A read of `buf.len()` bytes at `address` in `pid` on this (guarded) thread's reader:
/// the number of bytes read, or why not.
pub(super) fn read(pid: u32, address: u64, buf: &mut [u8]) -> Result<usize, MemoryError> {
    let result = on_reader(pid, address, |reader| reader.read(pid, address, buf))?;
    result.map_err(|source| MemoryError::Read { pid, address, len: buf.len(), source })
}

/// A chain read (see `ProcessMemory::read_chain`) on this (guarded) thread's reader.
pub(super) fn read_chain(pid: u32, first: u64, chain: Chain, out: &mut Vec<u8>) -> Result<ChainEnd, MemoryError> {
    on_reader(pid, first, |reader| reader.read_chain(pid, first, chain, out))
}

/// Runs `ask` on this guarded thread's reader (made if needed); a reader that did not
/// answer (`None`) is abandoned and `pid` quarantined.
fn on_reader<T>(pid: u32, address: u64, ask: impl FnOnce(&Reader) -> Option<T>) -> Result<T, MemoryError> {
    GUARD.with(|g| {
        let mut g = g.borrow_mut();
        let slot = g.get_or_insert(None);
        if slot.is_none() {
            if STUCK.load(Ordering::Relaxed) >= MAX_STUCK {
                REFUSED_TOO_MANY_STUCK.fetch_add(1, Ordering::Relaxed);
                return Err(MemoryError::Unanswered { pid, address });
            }
            *slot = Reader::start();
        }
        let Some(reader) = slot.as_ref() else {
            return Err(MemoryError::Unanswered { pid, address });
        };
        match ask(reader) {
            Some(answer) => Ok(answer),
            None => {
                if let Some(reader) = slot.take() {
                    reader.abandon();
                }
                quarantine(pid);
                Err(MemoryError::Quarantined { pid })
            }
        }
    })
}

/// Whether our own thread `tid` is running or runnable (state `R` in its stat line), as
/// opposed to waiting in the kernel. A thread not started yet (`tid` 0) waits for a CPU.
pub(crate) fn thread_is_runnable(tid: i32) -> bool {
    if tid <= 0 {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return false };
    // The state follows the parenthesised name, which may itself hold parentheses.
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state == "R")
}

/// How many times our own thread `tid` has arrived on a CPU (`schedstat`'s third field):
/// a count that moves shows a thread at work, even one caught waiting (a read from a slow
/// disk), where a thread stuck on a file that never answers does not arrive again. `None`
/// when it cannot be read (0 for a thread not started yet).
pub(crate) fn thread_arrivals(tid: i32) -> Option<u64> {
    if tid <= 0 {
        return Some(0);
    }
    task_arrivals("self", tid as u32)
}

/// Thread `tid`'s arrivals on a CPU (`sched_info.pcount`, the third field of
/// `/proc/<proc>/task/TID/schedstat`; `proc` a pid, or `self` for pyperch's own threads),
/// `None` when it cannot be read (the thread is gone). Bounded: at most 256 bytes, of a file
/// that is one short line. The one reader of that count (`kernel::switch_gate` reads targets'
/// threads with it).
pub(crate) fn task_arrivals(proc: &str, tid: u32) -> Option<u64> {
    use std::io::Read;
    let file = std::fs::File::open(format!("/proc/{proc}/task/{tid}/schedstat")).ok()?;
    let mut text = String::new();
    file.take(256).read_to_string(&mut text).ok()?;
    arrivals_of(&text)
}

/// The arrivals field of a schedstat line.
fn arrivals_of(schedstat: &str) -> Option<u64> {
    schedstat.split_ascii_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_arrivals_are_read() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        assert!(thread_arrivals(tid).is_some_and(|n| n >= 1));
        assert_eq!(thread_arrivals(0), Some(0));
        assert_eq!(thread_arrivals(i32::MAX), None);
        assert!(task_arrivals(&std::process::id().to_string(), tid as u32).is_some_and(|n| n >= 1));
        assert_eq!(arrivals_of("245089 0 17\n"), Some(17));
        assert_eq!(arrivals_of("245089 0\n"), None);
        assert_eq!(arrivals_of("a b c"), None);
    }

    /// A guarded thread reads through its reader like any other; a process in quarantine is
    /// refused from every thread until released.
    #[test]
    fn guarded_reads_and_quarantine() {
        let value = 0x1234_5678_9abc_def0u64;
        let address = &value as *const u64 as u64;
        let me = std::process::id();
        let mem = super::super::ProcessMemory::new(me);
        let got = thread::scope(|s| {
            s.spawn(|| {
                guard_this_thread();
                assert!(guarded());
                (0..3).map(|_| mem.read_u64(address).ok()).collect::<Vec<_>>()
            })
            .join()
            .ok()
        });
        assert_eq!(got, Some(vec![Some(value); 3]));
        // A PID nobody has (above pid_max) stands for a quarantined process.
        let pid = 1 << 23;
        assert!(!is_quarantined(pid));
        assert!(quarantine(pid));
        assert!(!quarantine(pid));
        let other = super::super::ProcessMemory::new(pid);
        assert!(matches!(other.read_u64(0x1000), Err(MemoryError::Quarantined { .. })));
        release(pid);
        assert!(!is_quarantined(pid));
        assert!(matches!(other.read_u64(0x1000), Err(MemoryError::Read { .. })));
    }
}
