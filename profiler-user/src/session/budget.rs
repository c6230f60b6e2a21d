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
        atomic::{AtomicI32, AtomicUsize, Ordering},
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
    /// Threads started and not yet finished (including the one waited on).
    running: Arc<AtomicUsize>,
}

impl Budgeted {
    /// Runs `work` on its own thread and returns its result if it finishes within `budget`.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        budget: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Overrun> {
        // Every running thread but the one we are about to start has overrun (the caller
        // waits for each in turn), so this bounds the blocked ones.
        if self.running.load(Ordering::Relaxed) >= MAX_OVERRUNNING {
            return Err(Overrun::TooManyBlocked);
        }
        let (send, receive) = mpsc::sync_channel(1);
        let running = self.running.clone();
        running.fetch_add(1, Ordering::Relaxed);
        let tid = Arc::new(AtomicI32::new(0));
        let thread_tid = tid.clone();
        let spawned = thread::Builder::new().name("pyperch-inspect".into()).stack_size(256 << 10).spawn(move || {
            // SAFETY: gettid has no preconditions.
            thread_tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            let result = work();
            running.fetch_sub(1, Ordering::Relaxed);
            // The caller may have stopped waiting; then the result is dropped here.
            let _ = send.send(result);
        });
        let Ok(handle) = spawned else {
            self.running.fetch_sub(1, Ordering::Relaxed);
            return Err(Overrun::NoThread);
        };
        let started = Instant::now();
        // A thread that delivered its result is about to end: joined, so that callers that
        // must be single-threaded afterwards (dropping capabilities) are.
        let finish = |result: T| {
            let _ = handle.join();
            Ok(result)
        };
        match receive.recv_timeout(budget) {
            Ok(result) => return finish(result),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(Overrun::TimedOut),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        // Still at work: wait on while it is runnable (slow), give up once it waits.
        while started.elapsed() < budget * SLOW_BUDGET_FACTOR && is_runnable(tid.load(Ordering::Relaxed)) {
            match receive.recv_timeout(SLOW_CHECK) {
                Ok(result) => return finish(result),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        match receive.try_recv() {
            Ok(result) => finish(result),
            Err(_) => Err(Overrun::TimedOut),
        }
    }

    /// Threads that overran their budget and are still blocked.
    pub(crate) fn blocked(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
}

/// Whether our own thread `tid` is running or runnable (state `R` in its stat line), as
/// opposed to waiting in the kernel.
fn is_runnable(tid: i32) -> bool {
    if tid <= 0 {
        // Not started yet: it is waiting for a CPU.
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return false };
    // The state follows the parenthesised name, which may itself hold parentheses.
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state == "R")
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
