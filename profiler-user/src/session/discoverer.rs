//! Discovery on its own thread: finds the Python processes to profile, registers them with
//! the kernel program, and tells the sampling loop through a channel.
//!
//! Nothing here runs on the sampling loop. Every piece of work that can block on a target
//! (opening its mapped files, reading its maps, command line, cgroup and memory) runs with a
//! time budget (`budget`): a process that does not answer in time is skipped, counted, and
//! looked at again later with a growing delay, so one hostile or broken process delays
//! nobody else for more than one budget.
//!
//! Ordering invariant: a process is announced to the loop (`DiscoveryEvent::Added`) before it
//! is registered with the kernel, and unregistered before it is announced gone, so the loop,
//! which reads this channel before each batch of samples, knows every process a sample can
//! come from.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use profiler_common::ProcessInfo;

use super::Scope;
use crate::{
    target::budget::{Budgeted, Overrun, Started, thread_cpu_ns},
    sample::aggregate::ProcessLabel,
    host::containers,
    target::discovery::{self, DiscoveryError, PythonProcess},
    filter::ProcessFilter,
    kernel::loader::Registry,
    target::memory::ProcessMemory,
};

/// Processes already looked at are checked again (PID reuse, exec) this often; young ones
/// are looked at on every scan that lists /proc.
const FULL_SCAN_PERIOD: Duration = Duration::from_secs(10);
/// Processes younger than this (in clock ticks: 10 s at Linux's 100 Hz) are looked at on every
/// scan that lists /proc.
const YOUNG_PROCESS_TICKS: u64 = 1000;
/// The scan interval once every explicitly given pid is registered: nothing can join any more.
const SETTLED_PIDS_INTERVAL: Duration = Duration::from_secs(1);
/// Time given to inspecting one process (its /proc entries, its mapped files, its memory).
pub(crate) const INSPECT_BUDGET: Duration = Duration::from_millis(1500);
/// "Not Python" verdicts are re-checked this many times, this far apart.
const RECHECKS: u32 = 3;
const RECHECK_DELAY: Duration = Duration::from_millis(300);
/// Delays before another look at an interpreter that is not initialised yet: doubling from the
/// first to the last (2,000 processes that load libpython and never initialise it cost a few
/// hundred short looks per second at most).
const NOT_READY_DELAYS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Delays before another look at a process that did not answer within the budget, or could
/// not be registered.
const OVERRUN_DELAYS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// What discovery tells the sampling loop.
pub(crate) enum DiscoveryEvent {
    /// A process to profile; the kernel samples it from just after this is sent.
    Added(Box<NewTarget>),
    /// The process announced by `Added` under `generation` is registered: the kernel watches
    /// it since `at_ns` (monotonic clock, read after the registration).
    Registered { pid: u32, generation: u32, at_ns: u64 },
    /// The process exited; the kernel no longer samples it. Samples in flight still count.
    Exited(u32),
    /// The process at this pid is no longer the one announced (it exec'd another program, its
    /// PID was reused, or its registration failed): forget it now.
    Replaced(u32),
}

/// A process to profile, with what was read of it off the sampling loop.
pub(crate) struct NewTarget {
    pub(crate) process: PythonProcess,
    /// `/proc/PID/exe` when registered: a change means the process exec'd another program.
    pub(crate) exe_link: PathBuf,
    pub(crate) label: ProcessLabel,
    /// The registration's generation (`ProcessInfo::generation`), set when it is registered.
    pub(crate) generation: u32,
    /// What the kernel was given at registration (set with `generation`).
    pub(crate) info: ProcessInfo,
    /// A free-threaded process that ran without a GIL when it was looked at (`--mode gil`
    /// keeps none of its samples while it does).
    pub(crate) no_gil: bool,
}

/// Counts of discovery's work, shown by `--stats`.
#[derive(Default)]
pub(crate) struct DiscoveryStats {
    /// Processes inspected (each look counts).
    pub(crate) inspected: AtomicU64,
    /// Looks that did not finish within `INSPECT_BUDGET` (skipped, retried later).
    pub(crate) timed_out: AtomicU64,
    /// Looks not started because too many earlier ones are still blocked.
    pub(crate) refused: AtomicU64,
    /// Registrations the kernel map refused (for example when full); retried later.
    pub(crate) register_failures: AtomicU64,
    /// Looks that overran their budget and are still blocked in the kernel (now).
    pub(crate) still_blocked: AtomicU64,
    /// Scans put off by `--max-cpu` (see `Discoverer::paced`), and the wait they added.
    pub(crate) paced: AtomicU64,
    pub(crate) paced_ns: AtomicU64,
}

impl DiscoveryStats {
    /// The `--stats` line.
    pub(crate) fn report(&self) -> String {
        format!(
            "discovery: {} looks at processes, {} did not answer within {:.1} s (skipped, retried later), {} not started (too many blocked), {} still blocked, {} registrations refused by the kernel, {} oversized ELF tables not read; {} scans put off by --max-cpu ({:.1} s of waits added)",
            self.inspected.load(Relaxed),
            self.timed_out.load(Relaxed),
            INSPECT_BUDGET.as_secs_f64(),
            self.refused.load(Relaxed),
            self.still_blocked.load(Relaxed),
            self.register_failures.load(Relaxed),
            discovery::oversized_tables(),
            self.paced.load(Relaxed),
            self.paced_ns.load(Relaxed) as f64 / 1e9,
        )
    }
}

/// The running discovery thread. Dropping it stops the thread at its next step (a look in
/// progress ends within its budget); it is never joined, so stopping never waits on a target.
pub(crate) struct DiscoveryHandle {
    pub(crate) events: mpsc::Receiver<DiscoveryEvent>,
    /// Closed on drop, which wakes and stops the thread.
    _stop: mpsc::Sender<()>,
}

/// A process registered with the kernel, as discovery remembers it.
struct Registered {
    start_time: u64,
    exe_link: PathBuf,
}

/// A process found not profilable, and whether to look again: a process caught in the middle
/// of `exec` can look like anything, so a "not Python" verdict is re-checked a few times.
struct Rejection {
    start_time: u64,
    exe: PathBuf,
    checks: u32,
    recheck_at: Option<Instant>,
}

/// A process to look at again later, and when.
struct Backoff {
    start_time: u64,
    next_look: Instant,
    delay: Duration,
    /// The interpreter found at the last look, not yet initialised: only its memory needs
    /// another look.
    inspected: Option<PythonProcess>,
}

/// A launched command is watched closely until its interpreter is registered, for this long
/// after discovery starts: scans every `FAST_WATCH_DIVISOR`-th of the time since then (at
/// least `FAST_WATCH_MIN`, at most the configured interval), and the command itself is looked
/// at on every scan whatever earlier looks concluded (not Python yet while its loader maps
/// libpython, not initialised yet). An interpreter takes a few milliseconds to initialise and
/// is registered within about one interval of it: the program's first line is sampled. The
/// decreasing beat bounds the cost: about 110 scans in the whole window.
const FAST_WATCH: Duration = Duration::from_secs(2);
const FAST_WATCH_MIN: Duration = Duration::from_millis(1);
const FAST_WATCH_DIVISOR: u32 = 20;

/// Looks at processes run at once, at most.
const PARALLEL_LOOKS: usize = 8;
/// The longest wait `--max-cpu` puts between two scans.
const MAX_PACED: Duration = Duration::from_secs(5);

/// What a look knows before its examination ends.
struct Look {
    pid: u32,
    start_time: u64,
    young: bool,
    exe: PathBuf,
    checks: u32,
}

/// The first half of a look at a process.
enum Prepared {
    Settled(u64),
    Pending,
    Look(Look, Result<Started<Examination>, Overrun>),
}

/// What one budgeted look at a process found.
enum Examination {
    /// Does not pass the filters.
    Filtered,
    /// Ready: register it with this layout.
    Ready(Box<NewTarget>, ProcessInfo),
    /// A Python whose interpreter is not initialised yet.
    NotReady(Option<PythonProcess>),
    /// Not profilable (or gone).
    Failed(DiscoveryError),
    /// A Python whose interpreter state cannot be read as expected: reported once.
    Broken(String),
}

/// Starts discovery on its own thread. `registered` are the processes the session has
/// registered already (explicit pids), with their start times and executables.
pub(crate) fn start(
    registry: Arc<Registry>,
    scope: Scope,
    filter: ProcessFilter,
    registered: Vec<(u32, u64, PathBuf)>,
    interval: Duration,
    allowance: Option<f64>,
    stats: Arc<DiscoveryStats>,
) -> std::io::Result<DiscoveryHandle> {
    let (events, receive_events) = mpsc::channel();
    let (stop, stopped) = mpsc::channel::<()>();
    let mut discoverer = Discoverer {
        registry,
        scope,
        filter,
        events,
        stats,
        budgeted: Budgeted::default(),
        registered: registered
            .into_iter()
            .map(|(pid, start_time, exe_link)| (pid, Registered { start_time, exe_link }))
            .collect(),
        rejected: HashMap::new(),
        reported: HashSet::new(),
        settled: HashMap::new(),
        pending: HashSet::new(),
        backoff: HashMap::new(),
        last_full_scan: None,
        last_process_events: None,
        last_registered_execs: None,
        own_pid: std::process::id(),
        clock: TickClock::new(),
        started: Instant::now(),
        allowance,
    };
    thread::Builder::new().name("pyperch-discovery".into()).spawn(move || {
        loop {
            let (own, looks) = (thread_cpu_ns(), discoverer.budgeted.cpu_ns());
            discoverer.scan();
            let spent = thread_cpu_ns().saturating_sub(own) + discoverer.budgeted.cpu_ns().saturating_sub(looks);
            let wait = discoverer.paced(discoverer.scan_interval(interval), spent);
            match stopped.recv_timeout(wait) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => break,
            }
        }
    })?;
    Ok(DiscoveryHandle { events: receive_events, _stop: stop })
}

struct Discoverer {
    registry: Arc<Registry>,
    scope: Scope,
    filter: ProcessFilter,
    events: mpsc::Sender<DiscoveryEvent>,
    stats: Arc<DiscoveryStats>,
    budgeted: Budgeted,
    registered: HashMap<u32, Registered>,
    /// Processes seen not to be profilable, by pid.
    rejected: HashMap<u32, Rejection>,
    /// Unsupported interpreters already reported.
    reported: HashSet<(u32, u64)>,
    /// PIDs present at the last scan whose state is settled (registered or rejected), with
    /// their start times.
    settled: HashMap<u32, u64>,
    /// PIDs at the last scan whose state is not settled: interpreters still starting, "not
    /// Python" verdicts to check again, processes that did not answer in time. They are
    /// looked at on every scan (when their backoff allows).
    pending: HashSet<u32>,
    /// When pending processes may be looked at again.
    backoff: HashMap<u32, Backoff>,
    /// When processes already looked at were last checked again.
    last_full_scan: Option<Instant>,
    /// The kernel's fork/exec/exit count at the last scan (`None`: not tracked).
    last_process_events: Option<u64>,
    /// The kernel's count of registered processes that exec'd, at the last scan.
    last_registered_execs: Option<u64>,
    own_pid: u32,
    clock: TickClock,
    /// When discovery started (the launched command's fast watch is timed from it).
    started: Instant,
    /// With `--max-cpu`: the share of one CPU discovery may use (see `paced`).
    allowance: Option<f64>,
}

impl Discoverer {
    fn send(&self, event: DiscoveryEvent) {
        // The loop has ended when nobody receives; the thread stops at its next step.
        let _ = self.events.send(event);
    }

    /// The launched command while it is watched closely (see [`FAST_WATCH`]).
    fn fast_watched(&self) -> Option<u32> {
        match self.scope {
            Scope::Launched { root } if !self.registered.contains_key(&root) && self.started.elapsed() < FAST_WATCH => {
                Some(root)
            }
            _ => None,
        }
    }

    /// The wait before the next scan under `--max-cpu`: at least `interval`, and long enough
    /// that the last scan's CPU (`spent_ns`: this thread's and its finished looks') is at most
    /// `allowance` of the time until the next (at most `MAX_PACED`). So process churn (each
    /// new process listed and looked at) costs at most that share of the budget
    /// (`DISCOVERY_SHARE_OF_BUDGET`), the sampling rate being lowered to fit the rest. New
    /// processes are then found later; one that lives shorter than the wait may be missed.
    /// Never while a launched command is watched closely.
    fn paced(&self, interval: Duration, spent_ns: u64) -> Duration {
        let Some(allowance) = self.allowance.filter(|a| *a > 0.0) else { return interval };
        if self.fast_watched().is_some() {
            return interval;
        }
        let needed = Duration::from_secs_f64((spent_ns as f64 / 1e9 / allowance).min(MAX_PACED.as_secs_f64()));
        if needed <= interval {
            return interval;
        }
        self.stats.paced.fetch_add(1, Relaxed);
        self.stats.paced_ns.fetch_add(u64::try_from((needed - interval).as_nanos()).unwrap_or(u64::MAX), Relaxed);
        needed
    }

    /// How long until the next scan.
    fn scan_interval(&self, configured: Duration) -> Duration {
        if self.fast_watched().is_some() {
            return (self.started.elapsed() / FAST_WATCH_DIVISOR).clamp(FAST_WATCH_MIN, configured.max(FAST_WATCH_MIN));
        }
        match &self.scope {
            Scope::Pids(pids) if pids.iter().all(|p| self.registered.contains_key(p)) => {
                configured.max(SETTLED_PIDS_INTERVAL)
            }
            _ => configured,
        }
    }

    /// Looks for new processes, exited ones, reused PIDs. /proc is listed only when the kernel
    /// saw a fork, exec or exit since the last scan, or every FULL_SCAN_PERIOD.
    fn scan(&mut self) {
        if let Some(root) = self.fast_watched() {
            // Looked at now, whatever earlier looks concluded; an interpreter found but not
            // initialised keeps what was read of it (only its memory is read again).
            self.rejected.remove(&root);
            self.settled.remove(&root);
            self.pending.insert(root);
            if let Some(backoff) = self.backoff.get_mut(&root) {
                backoff.next_look = Instant::now();
            }
            // First, before any listing of /proc (tens of milliseconds on a busy host).
            let now = self.clock.now_ticks();
            self.look_at_all(&[root], now);
        }
        // Every FULL_SCAN_PERIOD, settled processes are looked at again: PID reuse,
        // `exec`, and changes that filters depend on. In between, only new PIDs cost work.
        let full = self.last_full_scan.is_none_or(|t| t.elapsed() >= FULL_SCAN_PERIOD);
        // Read before listing: an event during the listing shows at the next scan.
        let events = self.registry.process_events();
        // Registered processes that exec'd, which the kernel unregistered: find which below.
        let execs = self.registry.registered_execs();
        let kernel_dropped_some = execs != self.last_registered_execs;
        let unchanged = events.is_some() && events == self.last_process_events && !kernel_dropped_some;
        self.last_process_events = events;
        self.last_registered_execs = execs;
        if !full && unchanged {
            // The same processes as at the last scan: only pending ones need another look.
            let now = self.clock.now_ticks();
            let pending: Vec<u32> = self.pending.iter().copied().collect();
            self.look_at_all(&pending, now);
            return;
        }
        if full {
            self.last_full_scan = Some(Instant::now());
        }
        let listing: Vec<u32> = match &self.scope {
            // Explicit pids: no need to list the whole of /proc.
            Scope::Pids(pids) => {
                pids.iter().copied().filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()).collect()
            }
            _ => discovery::python_pids_candidates(),
        };
        let present: HashSet<u32> = listing.iter().copied().collect();
        let mut exited = Vec::new();
        let mut execed = Vec::new();
        for (pid, registered) in &self.registered {
            if !present.contains(pid) || (full && !discovery::is_alive(*pid, registered.start_time)) {
                exited.push(*pid);
            } else if (kernel_dropped_some && !self.registry.is_registered(*pid))
                || (full
                    && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe != registered.exe_link))
            {
                // Same process, new program: its layout and caches no longer apply.
                execed.push(*pid);
            }
        }
        for pid in exited {
            // Unregistered first: no sample of it follows the news.
            self.registry.unregister(pid);
            self.registered.remove(&pid);
            self.send(DiscoveryEvent::Exited(pid));
        }
        for pid in execed {
            self.registry.unregister(pid);
            self.registered.remove(&pid);
            self.settled.remove(&pid);
            self.send(DiscoveryEvent::Replaced(pid));
        }
        self.settled.retain(|pid, _| present.contains(pid));
        self.pending.retain(|pid| present.contains(pid));
        self.backoff.retain(|pid, _| present.contains(pid));
        self.rejected.retain(|pid, _| present.contains(pid));
        self.reported.retain(|(pid, _)| present.contains(pid));
        let now = self.clock.now_ticks();
        if let Scope::Pids(pids) = &self.scope {
            if pids.iter().all(|p| self.registered.contains_key(p)) {
                // Explicit pids are all registered; nothing new can join.
                return;
            }
        }
        let mut to_look: Vec<u32> = listing
            .into_iter()
            .filter(|pid| {
                // Young processes stay under watch: a shell about to exec Python looks settled.
                let settled_and_old =
                    self.settled.get(pid).is_some_and(|start| now.saturating_sub(*start) > YOUNG_PROCESS_TICKS);
                *pid != self.own_pid && (full || !settled_and_old)
            })
            .collect();
        if to_look.len() > PARALLEL_LOOKS {
            // Busiest first: only processes on a CPU are sampled, so registering them first
            // loses the fewest samples when many processes are waiting (a host's first scan,
            // thousands of idle ones).
            let mut by_cpu: Vec<(u64, u32)> =
                to_look.iter().map(|&pid| (discovery::cpu_ticks(pid).unwrap_or(0), pid)).collect();
            by_cpu.sort_unstable_by(|a, b| b.0.cmp(&a.0));
            to_look = by_cpu.into_iter().map(|(_, pid)| pid).collect();
        }
        self.look_at_all(&to_look, now);
    }

    /// Looks at these processes, several at once (their budgets overlap: on a loaded machine
    /// a look waits mostly for a CPU), and files each as settled or pending.
    fn look_at_all(&mut self, pids: &[u32], now: u64) {
        for chunk in pids.chunks(PARALLEL_LOOKS) {
            let prepared: Vec<(u32, Prepared)> = chunk.iter().map(|&pid| (pid, self.prepare(pid, now))).collect();
            for (pid, prepared) in prepared {
                let verdict = match prepared {
                    Prepared::Settled(start_time) => Some(start_time),
                    Prepared::Pending => None,
                    Prepared::Look(look, started) => {
                        let examination = started.and_then(|s| s.wait(INSPECT_BUDGET));
                        self.stats.still_blocked.store(self.budgeted.blocked() as u64, Relaxed);
                        self.conclude(look, examination)
                    }
                };
                self.file(pid, verdict);
            }
        }
    }

    /// Files a process as settled (`Some(start time)`) or pending.
    fn file(&mut self, pid: u32, verdict: Option<u64>) {
        match verdict {
            Some(start_time) => {
                self.settled.insert(pid, start_time);
                self.pending.remove(&pid);
                self.backoff.remove(&pid);
            }
            None => {
                self.settled.remove(&pid);
                self.pending.insert(pid);
            }
        }
    }

    /// The first half of a look at one process: what is known without touching its files
    /// (settled, or pending until its backoff ends), or the budgeted examination, started.
    fn prepare(&mut self, pid: u32, now: u64) -> Prepared {
        let Some(start_time) = discovery::start_time(pid) else { return Prepared::Pending };
        // Only a young process can be caught in the middle of exec.
        let young = now.saturating_sub(start_time) <= YOUNG_PROCESS_TICKS;
        if !self.scope.accepts(pid) {
            return Prepared::Settled(start_time);
        }
        if self.registered.get(&pid).is_some_and(|r| r.start_time == start_time) {
            return Prepared::Settled(start_time);
        }
        if self.registered.remove(&pid).is_some() {
            // The PID was reused (or the process exec'd): the old process is gone.
            self.registry.unregister(pid);
            self.send(DiscoveryEvent::Replaced(pid));
        }
        let mut inspected = None;
        if let Some(backoff) = self.backoff.get_mut(&pid) {
            if backoff.start_time == start_time {
                if Instant::now() < backoff.next_look {
                    return Prepared::Pending;
                }
                inspected = backoff.inspected.take();
            } else {
                self.backoff.remove(&pid);
            }
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let mut checks = 0;
        if let Some(r) = self.rejected.get(&pid) {
            if r.start_time == start_time && r.exe == exe {
                match r.recheck_at {
                    Some(at) if Instant::now() >= at => checks = r.checks,
                    Some(_) => return Prepared::Pending,
                    None => return Prepared::Settled(start_time),
                }
            }
        }
        self.stats.inspected.fetch_add(1, Relaxed);
        let filter = self.filter.clone();
        let started = self.budgeted.start_for(pid, move || match inspected {
            // Only its memory can have changed since the last look.
            Some(process) => ready(process),
            None => examine(pid, &filter),
        });
        Prepared::Look(Look { pid, start_time, young, exe, checks }, started)
    }

    /// The second half of a look: registers a Python process to profile. Returns its start
    /// time when its state is settled (registered, or rejected for good), `None` while it is
    /// pending (an interpreter still starting, a verdict to check again soon, a process that
    /// did not answer in time).
    fn conclude(&mut self, look: Look, examination: Result<Examination, Overrun>) -> Option<u64> {
        let Look { pid, start_time, young, exe, checks } = look;
        let failure = match examination {
            Ok(Examination::Filtered) => return Some(start_time),
            Ok(Examination::Ready(mut target, mut info)) => {
                // Announced first, registered second (see the module docs), under a
                // generation of its own, which every sample of this registration carries.
                let generation = self.registry.next_generation();
                info.generation = generation;
                target.generation = generation;
                target.info = info;
                let exe_link = target.exe_link.clone();
                let process = target.process.clone();
                self.send(DiscoveryEvent::Added(target));
                let registered = super::target::register(&self.registry, &process, &info);
                if !matches!(registered, Ok(true)) {
                    self.stats.register_failures.fetch_add(1, Relaxed);
                    if let Err(e) = registered {
                        if self.reported.insert((pid, start_time)) {
                            eprintln!("pyperch: warning: {}; will retry", crate::text::lines(&e.to_string()));
                        }
                    }
                    // A full map (counted by the registry) or a process that just exited.
                    self.send(DiscoveryEvent::Replaced(pid));
                    self.back_off(pid, start_time, OVERRUN_DELAYS, None);
                    return None;
                }
                self.send(DiscoveryEvent::Registered { pid, generation, at_ns: crate::kernel::loader::monotonic_ns() });
                self.registered.insert(pid, Registered { start_time, exe_link });
                return Some(start_time);
            }
            Ok(Examination::NotReady(process)) => {
                self.back_off(pid, start_time, NOT_READY_DELAYS, process);
                return None;
            }
            Ok(Examination::Failed(e)) => e,
            Ok(Examination::Broken(message)) => {
                if self.reported.insert((pid, start_time)) {
                    eprintln!("pyperch: warning: cannot inspect process {pid}: {}", crate::text::field(&message));
                }
                self.rejected.insert(pid, Rejection { start_time, exe, checks: checks + 1, recheck_at: None });
                return Some(start_time);
            }
            Err(overrun) => {
                let counter = match overrun {
                    Overrun::TimedOut => &self.stats.timed_out,
                    Overrun::TooManyBlocked | Overrun::NoThread => &self.stats.refused,
                };
                counter.fetch_add(1, Relaxed);
                self.back_off(pid, start_time, OVERRUN_DELAYS, None);
                return None;
            }
        };
        let reject = |checks: u32, retry: bool| Rejection {
            start_time,
            exe: exe.clone(),
            checks: checks + 1,
            recheck_at: (retry && young && checks < RECHECKS).then(|| Instant::now() + RECHECK_DELAY),
        };
        let rejection = match failure {
            DiscoveryError::Gone(_) => return None,
            DiscoveryError::NotReady { .. } => {
                self.back_off(pid, start_time, NOT_READY_DELAYS, None);
                return None;
            }
            DiscoveryError::Unsupported { pid, comm, reason } => {
                if self.reported.insert((pid, start_time)) {
                    let (comm, reason) = (crate::text::field(&comm), crate::text::field(&reason));
                    eprintln!("pyperch: warning: skipping process {pid} ({comm}): {reason}");
                }
                reject(checks, false)
            }
            _ => reject(checks, true),
        };
        let settled = rejection.recheck_at.is_none();
        self.rejected.insert(pid, rejection);
        settled.then_some(start_time)
    }

    /// Schedules another look at `pid`, later each time (from `delays.0` doubling to `delays.1`).
    fn back_off(&mut self, pid: u32, start_time: u64, delays: (Duration, Duration), inspected: Option<PythonProcess>) {
        let delay = match self.backoff.get(&pid) {
            Some(b) if b.start_time == start_time => (b.delay * 2).clamp(delays.0, delays.1),
            _ => delays.0,
        };
        self.backoff.insert(pid, Backoff { start_time, next_look: Instant::now() + delay, delay, inspected });
    }
}

/// One look at a process, run with a budget: the filters, its mapped files, its memory.
fn examine(pid: u32, filter: &ProcessFilter) -> Examination {
    if !filter.is_empty() && !filter.matches(pid) {
        return Examination::Filtered;
    }
    match discovery::inspect(pid) {
        Ok(process) => ready(process),
        Err(DiscoveryError::NotReady { .. }) => Examination::NotReady(None),
        Err(e) => Examination::Failed(e),
    }
}

/// What the kernel needs to sample an inspected Python process, if its interpreter is ready.
fn ready(process: PythonProcess) -> Examination {
    let pid = process.pid;
    let mem = ProcessMemory::new(pid);
    let info = match process.kernel_info(&mem) {
        Ok(info) => ProcessInfo { frame: process.layout.kernel_frame_layout(), ..info },
        Err(DiscoveryError::NotReady { .. }) => return Examination::NotReady(Some(process)),
        Err(DiscoveryError::Gone(pid)) => return Examination::Failed(DiscoveryError::Gone(pid)),
        Err(e) => return Examination::Broken(e.to_string()),
    };
    let exe_link = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let label = process_label(&process);
    let no_gil = runs_without_gil(&mem, &info);
    Examination::Ready(Box::new(NewTarget { process, exe_link, label, generation: 0, info, no_gil }), info)
}

/// Whether a free-threaded process's main interpreter has its GIL disabled now (the check
/// the kernel makes per sample under `--mode gil`, `gil_check::INTERP_HOLDER_IF_ENABLED`).
pub(crate) fn runs_without_gil(mem: &ProcessMemory, info: &ProcessInfo) -> bool {
    if info.gil_check != profiler_common::gil_check::INTERP_HOLDER_IF_ENABLED {
        return false;
    }
    let Ok(interp) = mem.read_u64(info.interpreters_head_addr) else { return false };
    let mut enabled = [0u8; 4];
    interp != 0 && mem.read(interp.wrapping_add(u64::from(info.gil_enabled)), &mut enabled).is_ok() && enabled == [0; 4]
}

/// How a process is named in profiles: its command, executable, version, container and pod
/// (read from its cgroup), and working directory (for short file names).
pub(super) fn process_label(process: &PythonProcess) -> ProcessLabel {
    let container = containers::for_process(process.pid);
    let pod_names = crate::host::pod_names::for_container(&container);
    ProcessLabel {
        comm: process.comm.clone(),
        exe: process.exe.display().to_string(),
        version: process.version_label(),
        container_id: container.container_id,
        pod_uid: container.pod_uid,
        cwd: crate::output::filenames::process_cwd(process.pid),
        pod_names,
    }
}

/// Time since boot in clock ticks, the unit of a process's start time: /proc/uptime read
/// once, then advanced with a monotonic clock.
struct TickClock {
    ticks_at_start: f64,
    started: Instant,
    hz: f64,
}

impl TickClock {
    fn new() -> Self {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let uptime = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        Self { ticks_at_start: uptime * hz, started: Instant::now(), hz }
    }

    fn now_ticks(&self) -> u64 {
        (self.ticks_at_start + self.started.elapsed().as_secs_f64() * self.hz) as u64
    }
}
