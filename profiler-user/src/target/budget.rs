//! Work on a target that may block, run with a time budget.
//!
//! Inspecting a process opens its mapped files and reads its /proc entries. A hostile or
//! broken process can make any of that block for ever (a file on a FUSE mount that never
//! answers, a mapping whose page faults never complete). Such work runs on a thread of its
//! own; the caller waits at most the budget and then goes on without it. A thread that is
//! still runnable at the end of its budget, or that keeps arriving on a CPU between waits
//! (reads from a disk slowed by a loaded machine), is slow, not blocked: it gets up to
//! `SLOW_BUDGET_FACTOR` budgets before it counts as overrun, as long as no `PROGRESS_WINDOW`
//! (or budget, if shorter) passes without it running. A thread that
//! overran stays blocked in the kernel until whatever it waits for answers (threads cannot
//! be cancelled), so at most `MAX_OVERRUNNING_PER_PROCESS` of them may exist at once for
//! work on one process (`run_for`, `start_for`): beyond that, more work on that process is
//! refused (and counted) rather than piling up threads, while work on other processes goes
//! on: one process can use up its own allowance, never the others'. `MAX_OVERRUNNING` bounds
//! the blocked threads of all processes together (a resource bound).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

/// Threads that outlived their budget and are still blocked, at most, in all.
pub(crate) const MAX_OVERRUNNING: usize = 128;
/// Threads that outlived their budget and are still blocked, at most, working on one process.
pub(crate) const MAX_OVERRUNNING_PER_PROCESS: usize = 2;
/// A thread still running (not waiting) after its budget is waited for, up to this many
/// budgets in all.
const SLOW_BUDGET_FACTOR: u32 = 8;
/// How often a slow thread's state is checked once its budget has passed.
const SLOW_CHECK: Duration = Duration::from_millis(50);
/// A slow thread caught waiting is still waited for if it arrived on a CPU within this long:
/// a thread blocked for good (a file that never answers) does not arrive again.
const PROGRESS_WINDOW: Duration = Duration::from_millis(500);

/// Why budgeted work gave no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overrun {
    /// It did not finish within its budget (its thread is left to finish on its own).
    TimedOut,
    /// Too many earlier threads are still blocked (for this process, or in all); the work
    /// was not started.
    TooManyBlocked,
    /// No thread could be started.
    NoThread,
}

/// Runs budgeted work and keeps count of the threads that overran.
#[derive(Clone, Default)]
pub(crate) struct Budgeted {
    /// Threads that overran their budget and have not finished yet.
    overrunning: Arc<AtomicUsize>,
    /// The same, by the process they work on (entries at 0 are removed).
    by_process: Arc<Mutex<HashMap<u32, usize>>>,
    /// CPU time the finished pieces of work used on their threads, nanoseconds.
    cpu_ns: Arc<AtomicU64>,
}

/// CPU time the calling thread has used so far, nanoseconds (0 if the clock cannot be read).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `t` is.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// Whose allowance a piece of work is charged to.
#[derive(Clone)]
struct Charge {
    overrunning: Arc<AtomicUsize>,
    by_process: Arc<Mutex<HashMap<u32, usize>>>,
    pid: Option<u32>,
}

impl Charge {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<u32, usize>> {
        // Plain counters: a panic while holding the lock leaves them usable.
        self.by_process.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self) {
        self.overrunning.fetch_add(1, Ordering::Relaxed);
        if let Some(pid) = self.pid {
            *self.counts().entry(pid).or_default() += 1;
        }
    }

    fn remove(&self) {
        self.overrunning.fetch_sub(1, Ordering::Relaxed);
        if let Some(pid) = self.pid {
            let mut counts = self.counts();
            if let Some(n) = counts.get_mut(&pid) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&pid);
                }
            }
        }
    }
}

/// The life of one piece of budgeted work, decided once: whoever moves it out of `RUNNING`
/// first (the thread finishing, or the caller giving up) decides whether it overran.
const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const ABANDONED: u8 = 2;

/// Budgeted work started on its own thread; `wait` for its result.
pub(crate) struct Started<T> {
    receive: mpsc::Receiver<T>,
    handle: thread::JoinHandle<()>,
    tid: Arc<AtomicI32>,
    state: Arc<AtomicU8>,
    charge: Charge,
    started: Instant,
}

impl Budgeted {
    /// Runs `work` on its own thread and returns its result if it finishes within `budget`.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        budget: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Overrun> {
        self.start_charged(None, work)?.wait(budget)
    }

    /// [`Budgeted::run`] for work on process `pid`: refused while `pid` has
    /// [`MAX_OVERRUNNING_PER_PROCESS`] blocked threads.
    pub(crate) fn run_for<T: Send + 'static>(
        &self,
        pid: u32,
        budget: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Overrun> {
        self.start_charged(Some(pid), work)?.wait(budget)
    }

    /// [`Budgeted::start`] for work on process `pid` (see [`Budgeted::run_for`]).
    pub(crate) fn start_for<T: Send + 'static>(
        &self,
        pid: u32,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Started<T>, Overrun> {
        self.start_charged(Some(pid), work)
    }

    /// Starts `work` on its own thread; several may run at once (their budgets then overlap).
    #[allow(dead_code)]
    pub(crate) fn start<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<Started<T>, Overrun> {
        self.start_charged(None, work)
    }

    fn start_charged<T: Send + 'static>(
        &self,
        pid: Option<u32>,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Started<T>, Overrun> {
        let charge = Charge { overrunning: self.overrunning.clone(), by_process: self.by_process.clone(), pid };
        if self.overrunning.load(Ordering::Relaxed) >= MAX_OVERRUNNING {
            return Err(Overrun::TooManyBlocked);
        }
        if pid.is_some_and(|pid| charge.counts().get(&pid).copied().unwrap_or(0) >= MAX_OVERRUNNING_PER_PROCESS) {
            return Err(Overrun::TooManyBlocked);
        }
        let (send, receive) = mpsc::sync_channel(1);
        let tid = Arc::new(AtomicI32::new(0));
        let state = Arc::new(AtomicU8::new(RUNNING));
        let (thread_tid, thread_state, thread_charge) = (tid.clone(), state.clone(), charge.clone());
        let cpu_ns = self.cpu_ns.clone();
        let spawned = thread::Builder::new().name("pyperch-inspect".into()).stack_size(256 << 10).spawn(move || {
            // SAFETY: gettid has no preconditions.
            thread_tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            let result = work();
            cpu_ns.fetch_add(thread_cpu_ns(), Ordering::Relaxed);
            // The caller may have stopped waiting; then the result is dropped here.
            let _ = send.send(result);
            if thread_state.swap(FINISHED, Ordering::AcqRel) == ABANDONED {
                thread_charge.remove();
            }
        });
        let handle = spawned.map_err(|_| Overrun::NoThread)?;
        Ok(Started { receive, handle, tid, state, charge, started: Instant::now() })
    }

    /// CPU time the pieces of work finished so far used, nanoseconds.
    pub(crate) fn cpu_ns(&self) -> u64 {
        self.cpu_ns.load(Ordering::Relaxed)
    }

    /// Threads that overran their budget and are still blocked.
    pub(crate) fn blocked(&self) -> usize {
        self.overrunning.load(Ordering::Relaxed)
    }
}

impl<T> Started<T> {
    /// The result, if the work finishes within `budget` of its start (longer while its thread
    /// is still running rather than waiting, up to `SLOW_BUDGET_FACTOR` budgets).
    pub(crate) fn wait(self, budget: Duration) -> Result<T, Overrun> {
        let deadline = self.started + budget;
        let first = deadline.saturating_duration_since(Instant::now());
        match self.receive.recv_timeout(first) {
            Ok(result) => return self.finish(result),
            Err(mpsc::RecvTimeoutError::Disconnected) => return self.give_up(),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        // Still at work: wait on while it is runnable or runs now and then (slow), give up
        // once it has waited a whole `PROGRESS_WINDOW` without running.
        use crate::target::memory::deadline::{thread_arrivals, thread_is_runnable};
        let tid = || self.tid.load(Ordering::Relaxed);
        // Short budgets (tests, quick looks) give up as soon.
        let window = PROGRESS_WINDOW.min(budget);
        let (mut arrivals, mut moved_at) = (thread_arrivals(tid()), Instant::now());
        while self.started.elapsed() < budget * SLOW_BUDGET_FACTOR {
            let now = thread_arrivals(tid());
            if now.is_some() && now != arrivals {
                (arrivals, moved_at) = (now, Instant::now());
            }
            if !thread_is_runnable(tid()) && moved_at.elapsed() >= window {
                break;
            }
            match self.receive.recv_timeout(SLOW_CHECK.min(window)) {
                Ok(result) => return self.finish(result),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        self.give_up()
    }

    /// A thread that delivered its result is about to end: joined, so that callers that
    /// must be single-threaded afterwards (dropping capabilities) are.
    fn finish(self, result: T) -> Result<T, Overrun> {
        let _ = self.handle.join();
        Ok(result)
    }

    fn give_up(self) -> Result<T, Overrun> {
        // Charged before the thread can see ABANDONED (and discharge it when it ends).
        self.charge.add();
        if self.state.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return Err(Overrun::TimedOut);
        }
        self.charge.remove();
        // It finished just now.
        match self.receive.try_recv() {
            Ok(result) => self.finish(result),
            Err(_) => Err(Overrun::TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mostly waiting, as a thread reading from a slow disk, but back on a CPU every few
    /// milliseconds: slow, not blocked, so it is waited for past its budget.
    #[test]
    fn a_thread_that_keeps_running_now_and_then_is_waited_for() {
        let budgeted = Budgeted::default();
        let r = budgeted.run(Duration::from_millis(100), || {
            for _ in 0..60 {
                thread::sleep(Duration::from_millis(5));
            }
            9
        });
        assert_eq!(r, Ok(9));
        assert_eq!(budgeted.blocked(), 0);
    }

    #[test]
    fn results_within_budget_and_overruns_bounded() {
        let budgeted = Budgeted::default();
        assert_eq!(budgeted.run(Duration::from_secs(5), || 7), Ok(7));
        let (release, wait) = mpsc::channel::<()>();
        let wait = Arc::new(std::sync::Mutex::new(wait));
        // Issue #28 item 3: one process (pid 1) uses up its own allowance, not the others'.
        for _ in 0..MAX_OVERRUNNING_PER_PROCESS {
            let wait = wait.clone();
            let r = budgeted.run_for(1, Duration::from_millis(10), move || {
                let _ = wait.lock().map(|w| w.recv());
            });
            assert_eq!(r, Err(Overrun::TimedOut));
        }
        assert_eq!(budgeted.blocked(), MAX_OVERRUNNING_PER_PROCESS);
        assert_eq!(budgeted.run_for(1, Duration::from_secs(1), || 1), Err(Overrun::TooManyBlocked));
        assert_eq!(budgeted.run_for(2, Duration::from_secs(5), || 3), Ok(3));
        // In all, at most MAX_OVERRUNNING, whichever processes they are for.
        for pid in 0..(MAX_OVERRUNNING - MAX_OVERRUNNING_PER_PROCESS) as u32 {
            let wait = wait.clone();
            let r = budgeted.run_for(100 + pid, Duration::from_millis(1), move || {
                let _ = wait.lock().map(|w| w.recv());
            });
            assert_eq!(r, Err(Overrun::TimedOut));
        }
        assert_eq!(budgeted.blocked(), MAX_OVERRUNNING);
        assert_eq!(budgeted.run_for(3, Duration::from_secs(1), || 1), Err(Overrun::TooManyBlocked));
        assert_eq!(budgeted.run(Duration::from_secs(1), || 1), Err(Overrun::TooManyBlocked));
        drop(release);
        for _ in 0..500 {
            if budgeted.blocked() == 0 {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(budgeted.blocked(), 0);
        assert!(budgeted.by_process.lock().expect("counts").is_empty());
        assert_eq!(budgeted.run(Duration::from_secs(5), || 2), Ok(2));
        assert_eq!(budgeted.run_for(1, Duration::from_secs(5), || 4), Ok(4));
        // Slow but running: waited for beyond the budget.
        let spin = budgeted.run(Duration::from_millis(20), || {
            let until = Instant::now() + Duration::from_millis(60);
            let mut n = 0u64;
            while Instant::now() < until {
                n = n.wrapping_add(1);
            }
            n > 0
        });
        assert_eq!(spin, Ok(true));
    }
}
