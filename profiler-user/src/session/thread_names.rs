//! Thread names for `--threads`: each profiled process's `/proc/PID/task/TID/comm` (the
//! name the OS knows: `prctl(PR_SET_NAME)`, `pthread_setname_np`, and on CPython 3.14+ the
//! `threading.Thread` name), read on a helper thread of its own every [`PERIOD`], never on
//! the sampling loop, and handed to the session without blocking it.
//!
//! Bounds: at most [`MAX_PIDS`] processes and [`MAX_TASKS`] threads of each are looked at per
//! round, a `comm` file is read up to 64 bytes (the kernel's limit is 16), and at most
//! [`MAX_NAMES`] names wait to be handed over. A name is decoded with `text::decode` (bytes
//! that are not UTF-8 become `\xNN`); outputs escape it further as their format needs.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// How often the helper reads the names.
pub(crate) const PERIOD: Duration = Duration::from_millis(300);
const MAX_PIDS: usize = 4096;
const MAX_TASKS: usize = 4096;
const MAX_NAMES: usize = 65_536;

/// The helper thread's inbox (which processes) and outbox (tid → name); it stops when this is
/// dropped.
pub(crate) struct ThreadNamer {
    pids: Arc<Mutex<Vec<u32>>>,
    names: Arc<Mutex<HashMap<u32, String>>>,
    stop: Arc<AtomicBool>,
    /// When the session last exchanged with the helper (see [`ThreadNamer::due`]).
    last_sync: Option<Instant>,
}

impl ThreadNamer {
    /// Starts the helper thread; `None` if the thread cannot be started (names then stay off).
    pub(crate) fn start() -> Option<Self> {
        let namer = ThreadNamer { pids: Arc::default(), names: Arc::default(), stop: Arc::default(), last_sync: None };
        let (pids, names, stop) = (namer.pids.clone(), namer.names.clone(), namer.stop.clone());
        std::thread::Builder::new()
            .name("pyperch-names".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let wanted: Vec<u32> = pids.lock().map(|p| p.clone()).unwrap_or_default();
                    let mut found = HashMap::new();
                    for pid in wanted.into_iter().take(MAX_PIDS) {
                        read_process(pid, &mut found);
                    }
                    if let Ok(mut out) = names.lock() {
                        for (tid, name) in found {
                            if out.len() < MAX_NAMES || out.contains_key(&tid) {
                                out.insert(tid, name);
                            }
                        }
                    }
                    std::thread::sleep(PERIOD);
                }
            })
            .ok()?;
        Some(namer)
    }

    /// Whether the session should exchange with the helper now: at most once per [`PERIOD`]
    /// (the helper reads no more often), so the sampling loop, which asks before every batch,
    /// does not rebuild the process list each time.
    pub(crate) fn due(&mut self) -> bool {
        if self.last_sync.is_some_and(|t| t.elapsed() < PERIOD) {
            return false;
        }
        self.last_sync = Some(Instant::now());
        true
    }

    /// Makes the next [`ThreadNamer::due`] true (the last exchange before the profile is
    /// written).
    pub(crate) fn sync_next(&mut self) {
        self.last_sync = None;
    }

    /// Tells the helper which processes to look at; skipped if it holds the lock right now.
    pub(crate) fn set_pids(&self, pids: Vec<u32>) {
        if let Ok(mut p) = self.pids.try_lock() {
            *p = pids;
        }
    }

    /// Names read since the last call (empty if the helper holds the lock right now).
    pub(crate) fn take(&self) -> HashMap<u32, String> {
        self.names.try_lock().map(|mut n| std::mem::take(&mut *n)).unwrap_or_default()
    }
}

impl Drop for ThreadNamer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Adds the names of `pid`'s threads to `found`.
fn read_process(pid: u32, found: &mut HashMap<u32, String>) {
    for tid in crate::discovery::task_ids(pid, MAX_TASKS).unwrap_or_default() {
        if let Some(name) = crate::discovery::read_task_comm(pid, tid) {
            found.insert(tid, name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_threads() {
        let mut found = HashMap::new();
        read_process(std::process::id(), &mut found);
        assert!(!found.is_empty());
        assert!(found.values().all(|n| !n.ends_with('\n') && n.len() <= 64));
    }
}
