//! `--async`: keeps the kernel's index of which task drives which coroutine
//! (`TASK_OF_COROUTINE`, see `profiler_common::CoroutineKey`) for every process whose task
//! chains the kernel reads. With it the kernel names the task that eagerly started a running
//! one (aiohttp's request tasks, `eager_start=True`, eager task factories): nothing in a
//! running eager task points back to its creator.
//!
//! Runs on a thread of its own (it reads target memory; the event loop never does for this):
//! every `ROUND` it lists each process's tasks, at most `MAX_INDEXED` per process and round,
//! about two reads a task, and tells the kernel what changed. An entry may be stale by up to a
//! round: the kernel uses one only after reading that the task drives the coroutine at sample
//! time, and otherwise shows the creator by its coroutine.

use std::{
    collections::HashMap,
    sync::{Arc, mpsc},
    time::Duration,
};

use crate::{target::asyncio::AsyncReader, kernel::loader::Registry, target::memory::ProcessMemory};

/// How often each process's tasks are listed.
const ROUND: Duration = Duration::from_millis(250);
/// Tasks indexed per process and round (the kernel's map holds `TASK_INDEX_SLOTS` in all).
const MAX_INDEXED: usize = 4096;

/// The index's thread; it ends when this is dropped.
pub(crate) struct TaskIndex {
    add: mpsc::Sender<(u32, u64, AsyncReader)>,
}

/// One indexed process: its reader and what the kernel was told (coroutine → task).
struct Indexed {
    /// The process's start time (`discovery::is_alive`): a reused pid is another process.
    start_time: u64,
    reader: AsyncReader,
    told: HashMap<u64, u64>,
}

impl TaskIndex {
    /// Starts the thread; `None` if it cannot be started (eager creators are then shown by
    /// their coroutine).
    pub(crate) fn start(registry: Arc<Registry>) -> Option<TaskIndex> {
        let (add, added) = mpsc::channel();
        std::thread::Builder::new().name("pyperch-tasks".into()).spawn(move || run(&registry, &added)).ok()?;
        Some(TaskIndex { add })
    }

    /// Indexes process `pid` (started at `start_time`) from now on, until it exits.
    pub(crate) fn add(&self, pid: u32, start_time: u64, reader: AsyncReader) {
        let _ = self.add.send((pid, start_time, reader));
    }
}

fn run(registry: &Registry, added: &mpsc::Receiver<(u32, u64, AsyncReader)>) {
    let mut processes: HashMap<u32, Indexed> = HashMap::new();
    loop {
        match added.recv_timeout(ROUND) {
            Ok((pid, start_time, reader)) => {
                // Indexed at once: the process's samples are being read already.
                let mut indexed = Indexed { start_time, reader, told: HashMap::new() };
                if refresh(registry, pid, &mut indexed) {
                    processes.insert(pid, indexed);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        processes.retain(|&pid, indexed| refresh(registry, pid, indexed));
    }
}

/// Lists `pid`'s tasks and tells the kernel what changed; false once the process is gone
/// (its entries are then forgotten).
fn refresh(registry: &Registry, pid: u32, indexed: &mut Indexed) -> bool {
    let mem = ProcessMemory::new(pid);
    let alive = |i: &Indexed| crate::target::discovery::is_alive(pid, i.start_time);
    let listed = if alive(indexed) { indexed.reader.task_coroutines(&mem, MAX_INDEXED).ok() } else { None };
    let Some(pairs) = listed else {
        if alive(indexed) {
            // Caught mid-change: the next round reads again.
            return true;
        }
        for &coro in indexed.told.keys() {
            registry.set_task_of_coroutine(pid, coro, 0);
        }
        return false;
    };
    let now: HashMap<u64, u64> = pairs.into_iter().map(|(task, coro)| (coro, task)).collect();
    for (&coro, &task) in &now {
        if indexed.told.get(&coro) != Some(&task) {
            registry.set_task_of_coroutine(pid, coro, task);
        }
    }
    for &coro in indexed.told.keys() {
        if !now.contains_key(&coro) {
            registry.set_task_of_coroutine(pid, coro, 0);
        }
    }
    indexed.told = now;
    true
}
