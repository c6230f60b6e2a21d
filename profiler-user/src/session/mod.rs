//! The sampling session shared by `record` and `agent`: which processes are profiled, the
//! kernel registrations, and the path of every sample from the ring buffer to the profile
//! (completion → symbolization → aggregation).

mod event_loop;
mod target;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use profiler_common::{SAMPLE_HEADER_SIZE, SampleHeader};

use crate::{
    aggregate::{ProcessLabel, Profile},
    containers,
    discovery::{self, DiscoveryError, PythonProcess},
    filter::ProcessFilter,
    loader::KernelProgram,
    memory::{self, ProcessMemory},
    record::RecordError,
    stats::{Counters, SampleOutcome},
};

pub(crate) use event_loop::{LoopControl, LoopEnd, exit_code, run_loop};
use target::Target;

/// How often the session looks for new Python processes (a launched command's children are
/// looked for more often: short scripts matter there). A look costs almost nothing while the
/// kernel has seen no fork, exec or exit since the previous one; otherwise /proc is listed.
/// The ring buffer is drained on the same beat (more often after late samples, see
/// `DRAIN_INTERVAL_BUSY`).
pub(crate) const DISCOVERY_INTERVAL: Duration = Duration::from_millis(250);
pub(crate) const LAUNCH_DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);
/// The beat once every explicitly given pid is registered: nothing can join any more, so the
/// beat only drains the ring buffer (the kernel wakes us early when a batch accumulates).
const SETTLED_PIDS_INTERVAL: Duration = Duration::from_secs(1);
/// Processes already looked at are checked again (PID reuse, exec) this often; young ones
/// are looked at on every scan that lists /proc.
const FULL_SCAN_PERIOD: Duration = Duration::from_secs(10);
/// Processes younger than this (in clock ticks: 10 s at Linux's 100 Hz) are looked at on every
/// scan that lists /proc.
const YOUNG_PROCESS_TICKS: u64 = 1000;
/// Exited processes whose counts are kept for `--stats` (the oldest are summed up).
const MAX_RETIRED: usize = 4096;

/// Which processes the session profiles.
pub(crate) enum Scope {
    Host,
    Pids(HashSet<u32>),
    /// A launched command and its descendants.
    Launched { root: u32 },
}

impl Scope {
    fn accepts(&self, pid: u32) -> bool {
        match self {
            Scope::Host => true,
            Scope::Pids(pids) => pids.contains(&pid),
            Scope::Launched { root } => {
                let mut p = pid;
                for _ in 0..64 {
                    if p == *root {
                        return true;
                    }
                    match discovery::parent_pid(p) {
                        Some(parent) if parent > 1 => p = parent,
                        _ => return false,
                    }
                }
                false
            }
        }
    }
}

/// The state of a recording.
pub(crate) struct Session {
    pub(crate) kernel: KernelProgram,
    pub(crate) scope: Scope,
    pub(crate) filter: ProcessFilter,
    targets: HashMap<u32, Target>,
    /// Counts of processes no longer profiled (exited, or their PID reused).
    retired: Vec<Retired>,
    /// Summed counts of retired processes pushed out of `retired`.
    retired_overflow: Counters,
    /// Processes seen not to be profilable, by pid.
    rejected: HashMap<u32, Rejection>,
    /// Unsupported interpreters already reported.
    reported: HashSet<(u32, u64)>,
    pub(crate) profile: Profile,
    threads: bool,
    unknown_process_samples: u64,
    pub(crate) malformed_records: u64,
    own_pid: u32,
    /// Processes that were ever registered.
    pub(crate) registered: u64,
    /// PIDs present at the last scan whose state is settled (registered or rejected), with
    /// their start times.
    settled: HashMap<u32, u64>,
    /// When processes already looked at were last checked again.
    last_full_scan: Option<Instant>,
    /// The kernel's fork/exec/exit count at the last scan (`None`: not tracked).
    last_process_events: Option<u64>,
    /// The kernel's count of registered processes that exec'd, at the last scan.
    last_registered_execs: Option<u64>,
    /// PIDs at the last scan whose state is not settled: interpreters still starting, "not
    /// Python" verdicts to check again. They are looked at on every scan.
    pending: HashSet<u32>,
    /// Samples dropped because what they point to had changed before we read it.
    late_samples: u64,
    clock: TickClock,
}

/// A process found not profilable, and whether to look again: a process caught in the middle
/// of `exec` can look like anything, so a "not Python" verdict is re-checked a few times.
struct Rejection {
    start_time: u64,
    exe: PathBuf,
    checks: u32,
    recheck_at: Option<Instant>,
}

/// "Not Python" verdicts are re-checked this many times, this far apart.
const RECHECKS: u32 = 3;
const RECHECK_DELAY: Duration = Duration::from_millis(300);

/// The counts of a process no longer profiled.
pub(crate) struct Retired {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) version: String,
    pub(crate) counters: Counters,
}

impl Session {
    pub(crate) fn new(kernel: KernelProgram, scope: Scope, filter: ProcessFilter, threads: bool) -> Self {
        Session {
            kernel,
            scope,
            filter,
            targets: HashMap::new(),
            retired: Vec::new(),
            retired_overflow: Counters::default(),
            rejected: HashMap::new(),
            reported: HashSet::new(),
            profile: Profile::new(),
            threads,
            unknown_process_samples: 0,
            malformed_records: 0,
            own_pid: std::process::id(),
            registered: 0,
            settled: HashMap::new(),
            last_full_scan: None,
            last_process_events: None,
            last_registered_execs: None,
            pending: HashSet::new(),
            late_samples: 0,
            clock: TickClock::new(),
        }
    }

    /// Registers a Python process with the kernel if its interpreter is ready.
    pub(crate) fn add_process(&mut self, process: PythonProcess) -> Result<bool, RecordError> {
        let pid = process.pid;
        let mem = ProcessMemory::new(pid);
        let generation = target::next_generation(self.registered);
        let info = match process.kernel_info(&mem) {
            Ok(info) => profiler_common::ProcessInfo { frame: process.layout.kernel_frame_layout(), generation, ..info },
            Err(DiscoveryError::NotReady { .. }) => return Ok(false),
            Err(e) => return Err(RecordError::Inspect { pid, message: e.to_string() }),
        };
        if !target::register(&mut self.kernel, &process, &info)? {
            return Ok(false);
        }
        let container = containers::for_process(pid);
        self.profile.set_process(
            pid,
            ProcessLabel {
                comm: process.comm.clone(),
                exe: process.exe.display().to_string(),
                version: process.version.to_string(),
                container_id: container.container_id,
                pod_uid: container.pod_uid,
            },
        );
        self.targets.insert(pid, Target::new(process, generation));
        self.registered += 1;
        Ok(true)
    }

    /// Looks for new processes, exited ones, reused PIDs. /proc is listed only when the kernel
    /// saw a fork, exec or exit since the last scan, or every FULL_SCAN_PERIOD.
    pub(crate) fn scan(&mut self) {
        // Every FULL_SCAN_PERIOD, settled processes are looked at again: PID reuse,
        // `exec`, and changes that filters depend on. In between, only new PIDs cost work.
        let full = self.last_full_scan.is_none_or(|t| t.elapsed() >= FULL_SCAN_PERIOD);
        // Read before listing: an event during the listing shows at the next scan.
        let events = self.kernel.process_events();
        // Registered processes that exec'd, which the kernel unregistered: find which below.
        let execs = self.kernel.registered_execs();
        let kernel_dropped_some = execs != self.last_registered_execs;
        let unchanged = events.is_some() && events == self.last_process_events && !kernel_dropped_some;
        self.last_process_events = events;
        self.last_registered_execs = execs;
        if !full && unchanged {
            // The same processes as at the last scan: only pending ones need another look.
            let now = self.clock.now_ticks();
            for pid in self.pending.clone() {
                self.look_at(pid, now);
            }
            return;
        }
        if full {
            self.last_full_scan = Some(Instant::now());
        }
        let listing = match &self.scope {
            // Explicit pids: no need to list the whole of /proc.
            Scope::Pids(pids) => {
                pids.iter().copied().filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()).collect()
            }
            _ => discovery::python_pids_candidates(),
        };
        let present: HashSet<u32> = listing.iter().copied().collect();
        // Exited targets: stop sampling them, keep their caches for samples in flight.
        let mut execed = Vec::new();
        for (pid, target) in self.targets.iter_mut() {
            if !target.alive {
                continue;
            }
            if !present.contains(pid) || (full && !discovery::is_alive(*pid, target.process.start_time)) {
                target.alive = false;
                self.kernel.unregister(*pid);
            } else if (kernel_dropped_some && !self.kernel.is_registered(*pid))
                || (full && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe != target.exe_link))
            {
                // Same process, new program: its layout and caches no longer apply.
                self.kernel.unregister(*pid);
                execed.push(*pid);
            }
        }
        for pid in execed {
            self.settled.remove(&pid);
            if let Some(old) = self.targets.remove(&pid) {
                self.retire(old);
            }
        }
        self.settled.retain(|pid, _| present.contains(pid));
        self.pending.retain(|pid| present.contains(pid));
        let now = self.clock.now_ticks();
        if let Scope::Pids(pids) = &self.scope {
            if pids.iter().all(|p| self.targets.get(p).is_some_and(|t| t.alive)) {
                // Explicit pids are all registered; nothing new can join.
                return;
            }
        }
        for pid in listing {
            // Young processes stay under watch: a shell about to exec Python looks settled.
            let settled_and_old =
                self.settled.get(&pid).is_some_and(|start| now.saturating_sub(*start) > YOUNG_PROCESS_TICKS);
            if pid == self.own_pid || (!full && settled_and_old) {
                continue;
            }
            self.look_at(pid, now);
        }
    }

    /// Considers one process and files it as settled or pending.
    fn look_at(&mut self, pid: u32, now: u64) {
        match self.consider(pid, now) {
            Some(start_time) => {
                self.settled.insert(pid, start_time);
                self.pending.remove(&pid);
            }
            None => {
                self.settled.remove(&pid);
                self.pending.insert(pid);
            }
        }
    }

    /// Looks at one process: registers it if it is a Python process to profile. Returns its
    /// start time when its state is settled (registered, or rejected for good), `None` while
    /// it is pending (an interpreter still starting, or a verdict to check again soon).
    fn consider(&mut self, pid: u32, now: u64) -> Option<u64> {
        let start_time = discovery::start_time(pid)?;
        // Only a young process can be caught in the middle of exec.
        let young = now.saturating_sub(start_time) <= YOUNG_PROCESS_TICKS;
        if !self.scope.accepts(pid) {
            return Some(start_time);
        }
        if self.targets.get(&pid).is_some_and(|t| t.alive && t.process.start_time == start_time) {
            return Some(start_time);
        }
        if !self.filter.is_empty() && !self.filter.matches(pid) {
            return Some(start_time);
        }
        if self.targets.contains_key(&pid) {
            // The PID was reused (or the process exec'd): the old process is gone.
            self.kernel.unregister(pid);
            if let Some(old) = self.targets.remove(&pid) {
                self.retire(old);
            }
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let mut checks = 0;
        if let Some(r) = self.rejected.get(&pid) {
            if r.start_time == start_time && r.exe == exe {
                match r.recheck_at {
                    Some(at) if Instant::now() >= at => checks = r.checks,
                    Some(_) => return None,
                    None => return Some(start_time),
                }
            }
        }
        let reject = |checks: u32, retry: bool| Rejection {
            start_time,
            exe: exe.clone(),
            checks: checks + 1,
            recheck_at: (retry && young && checks < RECHECKS).then(|| Instant::now() + RECHECK_DELAY),
        };
        let rejection = match discovery::inspect(pid) {
            Ok(process) => match self.add_process(process) {
                Ok(registered) => return registered.then_some(start_time),
                Err(e) => {
                    eprintln!("pyperch: warning: {e}");
                    reject(checks, false)
                }
            },
            Err(DiscoveryError::NotReady { .. }) => return None,
            Err(DiscoveryError::Unsupported { pid, comm, reason }) => {
                if self.reported.insert((pid, start_time)) {
                    eprintln!("pyperch: warning: skipping process {pid} ({comm}): {reason}");
                }
                reject(checks, false)
            }
            Err(_) => reject(checks, true),
        };
        let settled = rejection.recheck_at.is_none();
        self.rejected.insert(pid, rejection);
        settled.then_some(start_time)
    }

    /// Keeps the counts of a target no longer profiled, and frees its caches.
    fn retire(&mut self, old: Target) {
        self.retired.push(Retired {
            pid: old.process.pid,
            comm: old.process.comm.clone(),
            version: old.process.version.to_string(),
            counters: old.counters,
        });
        if self.retired.len() > MAX_RETIRED {
            let oldest = self.retired.remove(0);
            self.retired_overflow.add(&oldest.counters);
        }
    }

    /// Forgets exited processes (keeping their counts); for long-running sessions, where
    /// samples still in flight for them no longer matter.
    pub(crate) fn prune_exited(&mut self) {
        let dead: Vec<u32> = self.targets.iter().filter(|(_, t)| !t.alive).map(|(pid, _)| *pid).collect();
        for pid in dead {
            if let Some(t) = self.targets.remove(&pid) {
                self.retire(t);
            }
        }
    }

    /// How long until the next scan, given the configured discovery interval.
    fn scan_interval(&self, configured: Duration) -> Duration {
        match &self.scope {
            Scope::Pids(pids) if pids.iter().all(|p| self.targets.get(p).is_some_and(|t| t.alive)) => {
                configured.max(SETTLED_PIDS_INTERVAL)
            }
            _ => configured,
        }
    }

    /// Processes being profiled now.
    pub(crate) fn live_processes(&self) -> usize {
        self.targets.values().filter(|t| t.alive).count()
    }

    /// Processes with at least one sample in the profile.
    pub(crate) fn sampled_processes(&self) -> usize {
        let mut pids: HashSet<u32> = HashSet::new();
        for t in self.targets.values() {
            if t.counters.ok() > 0 {
                pids.insert(t.process.pid);
            }
        }
        for r in &self.retired {
            if r.counters.ok() > 0 {
                pids.insert(r.pid);
            }
        }
        pids.len()
    }

    /// Per-process counts, live and retired, by pid.
    pub(crate) fn per_process(&self) -> Vec<(u32, String, String, bool, &Counters)> {
        let mut rows: Vec<(u32, String, String, bool, &Counters)> = self
            .targets
            .values()
            .map(|t| (t.process.pid, t.process.comm.clone(), t.process.version.to_string(), t.alive, &t.counters))
            .chain(self.retired.iter().map(|r| (r.pid, r.comm.clone(), r.version.clone(), false, &r.counters)))
            .collect();
        rows.sort_by_key(|r| r.0);
        rows
    }

    pub(crate) fn on_record(&mut self, bytes: &[u8]) {
        if bytes.len() < SAMPLE_HEADER_SIZE {
            self.malformed_records += 1;
            return;
        }
        // SAFETY: the record starts with a SampleHeader (plain data), checked for length.
        let header: SampleHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const SampleHeader) };
        // Only the registration the sample was taken under: never a reused PID's successor.
        let Some(target) = self.targets.get_mut(&header.tgid).filter(|t| t.generation == header.generation) else {
            self.unknown_process_samples += 1;
            return;
        };
        let (reads, read_bytes) = (memory::READS.load(Relaxed), memory::BYTES_READ.load(Relaxed));
        let outcome = target.process_sample(&header, &bytes[SAMPLE_HEADER_SIZE..], &mut self.profile, self.threads);
        target.counters.count(outcome);
        target.counters.ring_bytes += bytes.len() as u64;
        // Reads happen on this thread only, so the difference is this sample's.
        target.counters.memory_reads += memory::READS.load(Relaxed) - reads;
        if matches!(outcome, SampleOutcome::ChangedCodeObject | SampleOutcome::BadCodeObject | SampleOutcome::StaleTail) {
            self.late_samples += 1;
        }
        target.counters.memory_bytes += memory::BYTES_READ.load(Relaxed) - read_bytes;
    }

    pub(crate) fn totals(&self) -> Counters {
        let mut total = self.retired_overflow.clone();
        for t in self.targets.values() {
            total.add(&t.counters);
        }
        for r in &self.retired {
            total.add(&r.counters);
        }
        for _ in 0..self.unknown_process_samples {
            total.count(SampleOutcome::UnknownProcess);
        }
        total
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
