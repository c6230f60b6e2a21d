//! Work on a target that may block, run with a time budget.
//!
//! Inspecting a process opens its mapped files and reads its /proc entries. A hostile or
//! broken process can make any of that block for ever (a file on a FUSE mount that never
//! answers, a mapping whose page faults never complete). Such work runs on a thread of its
//! own; the caller waits at most the budget and then goes on without it. A thread that is
//! still runnable at the end of its budget is slow, not blocked (a loaded machine): it gets
//! up to `SLOW_BUDGET_FACTOR` budgets before it counts as overrun. A thread that
//! overran stays blocked in the kernel until whatever it waits for answers (threads cannot
//! be cancelled), so at most `MAX_OVERRUNNING` of them may exist at once: beyond that,
//! budgeted work is refused (and counted) rather than piling up threads.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

/// Threads that outlived their budget and are still blocked, at most.
pub(crate) const MAX_OVERRUNNING: usize = 16;
/// A thread still running (not waiting) after its budget is waited for, up to this many
/// budgets in all.
const SLOW_BUDGET_FACTOR: u32 = 8;
/// How often a slow thread's state is checked once its budget has passed.
const SLOW_CHECK: Duration = Duration::from_millis(50);

/// Why budgeted work gave no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overrun {
    /// It did not finish within its budget (its thread is left to finish on its own).
    TimedOut,
    /// Too many earlier threads are still blocked; the work was not started.
    TooManyBlocked,
    /// No thread could be started.
    NoThread,
}

/// Runs budgeted work and keeps count of the threads that overran.
#[derive(Clone, Default)]
pub(crate) struct Budgeted {
    /// Threads that overran their budget and have not finished yet.
    overrunning: Arc<AtomicUsize>,
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
    overrunning: Arc<AtomicUsize>,
    started: Instant,
}

impl Budgeted {
    /// Runs `work` on its own thread and returns its result if it finishes within `budget`.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        budget: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Overrun> {
        self.start(work)?.wait(budget)
    }

    /// Starts `work` on its own thread; several may run at once (their budgets then overlap).
    pub(crate) fn start<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<Started<T>, Overrun> {
        if self.overrunning.load(Ordering::Relaxed) >= MAX_OVERRUNNING {
            return Err(Overrun::TooManyBlocked);
        }
        let (send, receive) = mpsc::sync_channel(1);
        let tid = Arc::new(AtomicI32::new(0));
        let state = Arc::new(AtomicU8::new(RUNNING));
        let (thread_tid, thread_state, overrunning) = (tid.clone(), state.clone(), self.overrunning.clone());
        let spawned = thread::Builder::new().name("pyperch-inspect".into()).stack_size(256 << 10).spawn(move || {
            // SAFETY: gettid has no preconditions.
            thread_tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            let result = work();
            // The caller may have stopped waiting; then the result is dropped here.
            let _ = send.send(result);
            if thread_state.swap(FINISHED, Ordering::AcqRel) == ABANDONED {
                overrunning.fetch_sub(1, Ordering::Relaxed);
            }
        });
        let handle = spawned.map_err(|_| Overrun::NoThread)?;
        Ok(Started { receive, handle, tid, state, overrunning: self.overrunning.clone(), started: Instant::now() })
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
        // Still at work: wait on while it is runnable (slow), give up once it waits.
        while self.started.elapsed() < budget * SLOW_BUDGET_FACTOR && crate::memory::deadline::thread_is_runnable(self.tid.load(Ordering::Relaxed)) {
            match self.receive.recv_timeout(SLOW_CHECK) {
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
        if self.state.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.overrunning.fetch_add(1, Ordering::Relaxed);
            return Err(Overrun::TimedOut);
        }
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

    #[test]
    fn results_within_budget_and_overruns_bounded() {
        let budgeted = Budgeted::default();
        assert_eq!(budgeted.run(Duration::from_secs(5), || 7), Ok(7));
        let (release, wait) = mpsc::channel::<()>();
        let wait = Arc::new(std::sync::Mutex::new(wait));
        for _ in 0..MAX_OVERRUNNING {
            let wait = wait.clone();
            let r = budgeted.run(Duration::from_millis(10), move || {
                let _ = wait.lock().map(|w| w.recv());
            });
            assert_eq!(r, Err(Overrun::TimedOut));
        }
        assert_eq!(budgeted.blocked(), MAX_OVERRUNNING);
        assert_eq!(budgeted.run(Duration::from_secs(1), || 1), Err(Overrun::TooManyBlocked));
        drop(release);
        for _ in 0..500 {
            if budgeted.blocked() == 0 {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(budgeted.blocked(), 0);
        assert_eq!(budgeted.run(Duration::from_secs(5), || 2), Ok(2));
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
