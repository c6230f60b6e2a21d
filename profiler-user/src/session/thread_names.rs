//! Thread names for `--threads` and the timeline formats, read on a helper thread of its
//! own every [`PERIOD`], never on the sampling loop, and handed to the session without
//! blocking it. A thread's name is
//! - its Python name, when the process's `threading` module knows the thread (the `name` of
//!   its `threading.Thread`, read from the interpreter's registry in the target's memory by
//!   `crate::target::thread_registry`; on every version 3.8-3.15, whole up to the shown 64
//!   characters, and read again every round, so a rename shows);
//! - else the name the OS knows, `/proc/PID/task/TID/comm` (`prctl(PR_SET_NAME)`,
//!   `pthread_setname_np`, and on CPython 3.14+ the Thread's name cut to 15 bytes): threads
//!   started from C, and processes that have not imported `threading`.
//!
//! A thread keeps the last Python name read for it while it lives, also in the moment between
//! `threading` forgetting it (it ends) and its end.
//!
//! Bounds: at most [`MAX_PIDS`] processes and [`MAX_TASKS`] threads of each are looked at per
//! round, a `comm` file is read up to 64 bytes (the kernel's limit is 16), the registry is read
//! within `thread_registry::READ_BUDGET` bytes per process and round, and at most
//! [`MAX_NAMES`] names wait to be handed over. A name is decoded with `text::decode` (bytes
//! that are not UTF-8 become `\xNN`); outputs escape it further as their format needs.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::target::thread_registry::{RegistryReader, RegistryTarget};

/// How often the helper reads the names.
pub(crate) const PERIOD: Duration = Duration::from_millis(300);
const MAX_PIDS: usize = 4096;
const MAX_TASKS: usize = 4096;
const MAX_NAMES: usize = 65_536;

/// The helper thread's inbox (which processes) and outbox (tid → name); it stops when this is
/// dropped.
pub(crate) struct ThreadNamer {
    pids: Arc<Mutex<Vec<RegistryTarget>>>,
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
                // One process whose memory does not answer must not stop the names of all
                // the others: its read is given up and the process quarantined.
                crate::target::memory::deadline::guard_this_thread();
                let mut readers: HashMap<u32, ProcessNames> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let wanted: Vec<RegistryTarget> = pids.lock().map(|p| p.clone()).unwrap_or_default();
                    let mut found = HashMap::new();
                    let live: HashSet<u32> = wanted.iter().map(|t| t.pid).collect();
                    readers.retain(|pid, _| live.contains(pid));
                    for target in wanted.into_iter().take(MAX_PIDS) {
                        let names = readers.entry(target.pid).or_insert_with(|| ProcessNames::new(target));
                        if names.reader.target().start_time != target.start_time {
                            *names = ProcessNames::new(target);
                        }
                        names.read(&mut found);
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
    pub(crate) fn set_targets(&self, pids: Vec<RegistryTarget>) {
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

/// One process's names: its registry reader, and the Python names its live threads had.
struct ProcessNames {
    reader: RegistryReader,
    python: HashMap<u32, String>,
}

impl ProcessNames {
    fn new(target: RegistryTarget) -> Self {
        Self { reader: RegistryReader::new(target), python: HashMap::new() }
    }

    /// Adds the names of the process's threads to `found`: Python names where known, else
    /// the OS names.
    fn read(&mut self, found: &mut HashMap<u32, String>) {
        let pid = self.reader.target().pid;
        let tids = crate::target::discovery::task_ids(pid, MAX_TASKS).unwrap_or_default();
        // A registry that cannot be read this round (budget, a torn read) keeps the names
        // read before; threads that ended are forgotten.
        if let Ok(python) = self.reader.read(&tids) {
            self.python.extend(python);
        }
        // `task_ids` lists them sorted.
        self.python.retain(|tid, _| tids.binary_search(tid).is_ok());
        for tid in tids {
            if let Some(name) = self.python.get(&tid) {
                found.insert(tid, name.clone());
            } else if let Some(name) = crate::target::discovery::read_task_comm(pid, tid) {
                found.insert(tid, name);
            }
        }
    }
}

/// Adds the OS names of `pid`'s threads to `found`.
#[cfg(test)]
fn read_process(pid: u32, found: &mut HashMap<u32, String>) {
    for tid in crate::target::discovery::task_ids(pid, MAX_TASKS).unwrap_or_default() {
        if let Some(name) = crate::target::discovery::read_task_comm(pid, tid) {
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
