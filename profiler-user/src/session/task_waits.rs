//! Suspended asyncio tasks' wait time (`--async` with `--mode wall` or `--mode off-cpu`),
//! read on a helper thread of its own, never on the sampling loop.
//!
//! Every sampling period (`--rate`) the helper reads the task graph of each process whose
//! asyncio reader exists ([`crate::target::asyncio::waits`], one *round*), within [`ROUND_BUDGET`]
//! per process and round. Each suspended task read is charged the time since it was last
//! charged (or since it was first listed, or last seen running or not started), on its wait
//! stack ending in [`WAIT_LEAF`]; a running task is not charged here (its thread's samples
//! have it). A task left unread by a round (budget, a chain that did not settle) keeps its
//! time for the next round that reads it; a task that ends before then loses it. Rounds
//! never take more than a third of a CPU: after a round of `t` the helper sleeps at least
//! `2t` (and until the next period).
//!
//! The session collects the charges without blocking (`try_lock`), at most every
//! [`SYNC_PERIOD`], and adds them to the profile. At most [`MAX_STACKS`] distinct stacks
//! wait to be collected; charges beyond are counted (`profile_full`).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    target::asyncio::{
        AsyncReader,
        waits::{WaitFrame, WaitReader},
    },
    target::memory::{ProcessMemory, ReadBudget, with_read_budget},
    stats::TaskWaitCounts,
};

pub(crate) use crate::target::asyncio::waits::WAIT_LEAF;

/// Reads and bytes one process's round may read.
pub(crate) const ROUND_BUDGET: ReadBudget = ReadBudget { reads: 20_000, bytes: 4 << 20, exhausted: false };
/// How often the session collects what the helper charged.
pub(crate) const SYNC_PERIOD: Duration = Duration::from_millis(250);
/// How long tasks missing from cut listings are remembered (see `last_whole_listing`).
const FORGET_AFTER: Duration = Duration::from_secs(10);
/// Processes read per round.
const MAX_PIDS: usize = 4096;
/// Distinct stacks waiting to be collected.
const MAX_STACKS: usize = 65_536;

/// A process to read: pid, registration generation, its reader.
pub(crate) type WaitTarget = (u32, u32, AsyncReader);

/// One charged stack: (pid, generation) and (event loop's thread, frames root first).
type StackKey = (Option<u64>, Vec<WaitFrame>);

/// What the helper charged since the session last collected.
#[derive(Default)]
pub(crate) struct Charges {
    /// Per (pid, generation): stack → (nanoseconds, tasks charged).
    pub(crate) stacks: HashMap<(u32, u32), HashMap<StackKey, (u64, u64)>>,
    pub(crate) counts: HashMap<(u32, u32), TaskWaitCounts>,
    distinct: usize,
}

/// The helper's inbox (processes) and outbox (charges); it stops when this is dropped.
pub(crate) struct TaskWaits {
    targets: Arc<Mutex<Vec<WaitTarget>>>,
    charges: Arc<Mutex<Charges>>,
    stop: Arc<AtomicBool>,
    last_sync: Option<Instant>,
}

/// One process's state on the helper.
struct ProcessWaits {
    generation: u32,
    reader: WaitReader,
    /// Task → from when its wait is not charged yet.
    pending: HashMap<u64, Instant>,
    /// When a whole listing (not cut by the budget) was last read: tasks not on it are gone.
    /// While listings are cut, tasks are forgotten once [`FORGET_AFTER`] passed without one.
    last_whole_listing: Option<Instant>,
    last_round: Option<Instant>,
}

impl TaskWaits {
    /// Starts the helper, reading every `period`; `None` if no thread can be started (task
    /// waits are then not charged).
    pub(crate) fn start(period: Duration) -> Option<Self> {
        let waits = TaskWaits { targets: Arc::default(), charges: Arc::default(), stop: Arc::default(), last_sync: None };
        let (targets, charges, stop) = (waits.targets.clone(), waits.charges.clone(), waits.stop.clone());
        std::thread::Builder::new()
            .name("pyperch-task-waits".into())
            .spawn(move || {
                let mut processes: HashMap<u32, ProcessWaits> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let wanted: Vec<WaitTarget> = targets.lock().map(|t| t.clone()).unwrap_or_default();
                    processes.retain(|pid, p| wanted.iter().any(|(w, g, _)| w == pid && *g == p.generation));
                    for (pid, generation, reader) in wanted.into_iter().take(MAX_PIDS) {
                        let p = processes.entry(pid).or_insert_with(|| ProcessWaits {
                            generation,
                            reader: WaitReader::new(reader),
                            pending: HashMap::new(),
                            last_whole_listing: None,
                            last_round: None,
                        });
                        let (stacks, counts) = p.round(period);
                        if let Ok(mut out) = charges.lock() {
                            out.add((pid, generation), stacks, counts);
                        }
                    }
                    let spent = started.elapsed();
                    std::thread::sleep(period.saturating_sub(spent).max(spent * 2).max(Duration::from_millis(1)));
                }
            })
            .ok()?;
        Some(waits)
    }

    /// Whether the session should exchange with the helper now (at most every
    /// [`SYNC_PERIOD`]).
    pub(crate) fn due(&mut self) -> bool {
        if self.last_sync.is_some_and(|t| t.elapsed() < SYNC_PERIOD) {
            return false;
        }
        self.last_sync = Some(Instant::now());
        true
    }

    /// Makes the next [`TaskWaits::due`] true (the last exchange before the profile is
    /// written).
    pub(crate) fn sync_next(&mut self) {
        self.last_sync = None;
    }

    /// Tells the helper which processes to read; skipped if it holds the lock right now.
    pub(crate) fn set_targets(&self, targets: Vec<WaitTarget>) {
        if let Ok(mut t) = self.targets.try_lock() {
            *t = targets;
        }
    }

    /// What was charged since the last call (nothing if the helper holds the lock now).
    pub(crate) fn take(&self) -> Charges {
        self.charges.try_lock().map(|mut c| std::mem::take(&mut *c)).unwrap_or_default()
    }
}

impl Drop for TaskWaits {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Charges {
    fn add(&mut self, key: (u32, u32), stacks: Vec<(StackKey, u64)>, mut counts: TaskWaitCounts) {
        let mine = self.stacks.entry(key).or_default();
        for (stack, ns) in stacks {
            if let Some(slot) = mine.get_mut(&stack) {
                slot.0 += ns;
                slot.1 += 1;
            } else if self.distinct < MAX_STACKS {
                mine.insert(stack, (ns, 1));
                self.distinct += 1;
            } else {
                counts.profile_full += 1;
                counts.charges -= 1;
                counts.wait_ns -= ns;
            }
        }
        self.counts.entry(key).or_default().add(&counts);
    }
}

impl ProcessWaits {
    /// One round: the stacks to charge with their nanoseconds, and the counts.
    fn round(&mut self, period: Duration) -> (Vec<(StackKey, u64)>, TaskWaitCounts) {
        let mem = ProcessMemory::new(self.reader.pid());
        let started = Instant::now();
        let (round, used) = with_read_budget(ROUND_BUDGET, || self.reader.round(&mem));
        let now = Instant::now();
        let round_ns = u64::try_from(now.duration_since(started).as_nanos()).unwrap_or(u64::MAX);
        let first_seen = self.last_round.unwrap_or_else(|| now.checked_sub(period).unwrap_or(now));
        self.last_round = Some(now);
        let stale = self.last_whole_listing.is_none_or(|t| now.duration_since(t) > FORGET_AFTER);
        if !round.listing_cut || stale {
            // Tasks no longer listed have ended: their uncharged time goes with them. (A cut
            // listing may miss live tasks; it prunes only when no whole one came for long,
            // which bounds what is kept.)
            let listed: std::collections::HashSet<u64> = round.listed.iter().copied().collect();
            self.pending.retain(|t, _| listed.contains(t));
            if !round.listing_cut {
                self.last_whole_listing = Some(now);
            }
        }
        for &t in &round.listed {
            self.pending.entry(t).or_insert(first_seen);
        }
        // Running and not started tasks wait for nothing: their time is not a task wait.
        for t in &round.not_waiting {
            self.pending.insert(*t, now);
        }
        let mut stacks = Vec::with_capacity(round.stacks.len());
        let mut counts = TaskWaitCounts {
            rounds: 1,
            unsettled: round.unsettled,
            unreadable: round.unreadable,
            over_budget: round.over_budget,
            reads: used.reads,
            bytes: used.bytes,
            max_round_reads: used.reads,
            max_round_bytes: used.bytes,
            max_tasks: round.listed.len() as u64,
            round_ns,
            max_round_ns: round_ns,
            ..Default::default()
        };
        for s in round.stacks {
            let since = self.pending.insert(s.task, now).unwrap_or(first_seen);
            let ns = u64::try_from(now.saturating_duration_since(since).as_nanos()).unwrap_or(u64::MAX);
            if ns == 0 {
                continue;
            }
            counts.charges += 1;
            counts.wait_ns += ns;
            stacks.push(((s.thread, s.frames), ns));
        }
        (stacks, counts)
    }
}
