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
//! Threads that are not guarded read on their own stack as before, but still refuse
//! quarantined processes.

use std::{
    cell::RefCell,
    collections::HashSet,
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use super::MemoryError;

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

/// One read for a reader thread: the buffer travels there and back.
struct Job {
    pid: u32,
    address: u64,
    buf: Vec<u8>,
}

/// What a reader sends back: the buffer and the raw result (bytes read, or the error).
type Reply = (Vec<u8>, std::io::Result<usize>);

/// A guarded thread's reader.
struct Reader {
    jobs: mpsc::Sender<Job>,
    replies: mpsc::Receiver<Reply>,
    tid: Arc<AtomicI32>,
    abandoned: Arc<AtomicBool>,
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
        let (jobs, take) = mpsc::channel::<Job>();
        let (answer, replies) = mpsc::channel::<Reply>();
        let tid = Arc::new(AtomicI32::new(0));
        let abandoned = Arc::new(AtomicBool::new(false));
        let (thread_tid, thread_abandoned) = (tid.clone(), abandoned.clone());
        let spawned = thread::Builder::new().name("pyperch-read".into()).stack_size(128 << 10).spawn(move || {
            // SAFETY: gettid has no preconditions.
            thread_tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            // Ends when the guarded thread drops or abandons its reader (the sender).
            while let Ok(mut job) = take.recv() {
                let result = super::raw_read(job.pid, job.address, &mut job.buf);
                if answer.send((job.buf, result)).is_err() {
                    break;
                }
            }
            // The flag is set before the sender is dropped, so it is seen here.
            if thread_abandoned.load(Ordering::Acquire) {
                STUCK.fetch_sub(1, Ordering::Relaxed);
            }
        });
        spawned.ok().map(|_| Reader { jobs, replies, tid, abandoned })
    }

    /// Gives up on this reader: it is blocked in the kernel, and ends on its own if that
    /// read ever returns.
    fn abandon(self) {
        STUCK.fetch_add(1, Ordering::Relaxed);
        self.abandoned.store(true, Ordering::Release);
        drop(self.jobs);
    }
}

/// A read of `buf.len()` bytes at `address` in `pid` on this (guarded) thread's reader:
/// the number of bytes read, or why not.
pub(super) fn read(pid: u32, address: u64, buf: &mut [u8]) -> Result<usize, MemoryError> {
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
        let job = Job { pid, address, buf: vec![0u8; buf.len()] };
        if reader.jobs.send(job).is_err() {
            *slot = None;
            return Err(MemoryError::Unanswered { pid, address });
        }
        match wait(reader) {
            Some((bytes, result)) => {
                let got = result.map_err(|source| MemoryError::Read { pid, address, len: buf.len(), source })?;
                let got = got.min(bytes.len()).min(buf.len());
                buf[..got].copy_from_slice(&bytes[..got]);
                Ok(got)
            }
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

/// The reader's answer within the deadline (longer while it is runnable); `None`: it is
/// blocked.
fn wait(reader: &Reader) -> Option<Reply> {
    let started = Instant::now();
    match reader.replies.recv_timeout(READ_DEADLINE) {
        Ok(reply) => return Some(reply),
        Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        Err(mpsc::RecvTimeoutError::Timeout) => {}
    }
    while started.elapsed() < READ_DEADLINE * SLOW_FACTOR && thread_is_runnable(reader.tid.load(Ordering::Relaxed)) {
        match reader.replies.recv_timeout(SLOW_CHECK) {
            Ok(reply) => return Some(reply),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    // One last look: it may have answered just now.
    reader.replies.try_recv().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

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
