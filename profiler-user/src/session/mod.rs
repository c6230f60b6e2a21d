//! The sampling session shared by `record` and `agent`: which processes are profiled, the
//! kernel registrations, and the path of every sample from the ring buffer to the profile
//! (completion → symbolization → aggregation).

pub(crate) mod blocked_at_start;
pub(crate) mod builder;
mod cache_budget;
pub(crate) mod cpu_budget;
mod discoverer;
pub mod error;
pub(crate) mod drain;
mod event_loop;
pub(crate) mod exit_watch;
mod off_cpu;
mod off_cpu_kernel;
pub(crate) mod report;
mod target;
mod task_index;
mod task_waits;
mod thread_names;

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Duration,
};

use profiler_common::{
    MalformedBatch, OffCpuRecords, SampleHeader, off_cpu_trailer, record_body, record_kind, sample_flags, split_record,
};

use crate::{
    sample::aggregate::{ProcessLabel, Profile},
    target::asyncio::AsyncReader,
    target::discovery::{self, DiscoveryError, PythonProcess},
    filter::ProcessFilter,
    kernel::loader::KernelProgram,
    target::memory::{self, ProcessMemory},
    stats::{Counters, SampleOutcome},
    time_mode::{GC_FRAME, TimeMode, off_cpu_leaf},
};

pub(crate) use drain::LoopEnd;
pub(crate) use event_loop::{LoopControl, exit_code, run_loop};
pub(crate) use crate::target::budget::Budgeted;
pub(crate) use discoverer::{DiscoveryStats, INSPECT_BUDGET};
use discoverer::{DiscoveryEvent, DiscoveryHandle};
use crate::sample::{Charge, Target};
pub use error::SessionError;

/// How often discovery looks for new Python processes (a launched command's children are
/// looked for more often: short scripts matter there). A look costs almost nothing while the
/// kernel has seen no fork, exec or exit since the previous one; otherwise /proc is listed.
/// The ring buffer is drained on the same beat (more often after late samples, see
/// `DRAIN_INTERVAL_BUSY`).
pub(crate) const DISCOVERY_INTERVAL: Duration = Duration::from_millis(250);
pub(crate) const LAUNCH_DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);
/// The share of `--max-cpu` discovery may use at most (process churn: each new process
/// listed and looked at); the sampling gets the rest, or more while discovery is quiet.
pub(crate) const DISCOVERY_SHARE_OF_BUDGET: f64 = 0.75;
/// The drain beat once every explicitly given pid is registered: nothing can join any more
/// (the kernel wakes the loop early when a batch of samples accumulates).
const SETTLED_PIDS_INTERVAL: Duration = Duration::from_secs(1);
/// Exited processes whose counts are kept for `--stats` (the oldest are summed up).
const MAX_RETIRED: usize = 4096;

/// Which processes the session profiles.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    Host,
    Pids(HashSet<u32>),
    /// A launched command and its descendants.
    Launched { root: u32 },
    /// These processes and their descendants, present and future (`--pid` with
    /// `--subprocesses`).
    Trees(HashSet<u32>),
}

impl Scope {
    fn accepts(&self, pid: u32) -> bool {
        match self {
            Scope::Host => true,
            Scope::Pids(pids) => pids.contains(&pid),
            Scope::Launched { root } => descends_from(pid, |p| p == *root),
            Scope::Trees(roots) => descends_from(pid, |p| roots.contains(&p)),
        }
    }
}

/// `--async`: once the target's asyncio reader exists, registers the process again so that
/// the kernel reads each sample's running task and the tasks awaiting it at sample time
/// (`profiler_common::TaskChain`): the chain as it was when the sample was taken, not when
/// it is processed. On a kernel without `bpf_loop` only the running task is recorded (its
/// samples keep their plain stacks, counted). Not registered again if it exited meanwhile
/// (`target::register`).
fn register_running_task(kernel: &KernelProgram, target: &mut Target, to_index: &mut Vec<(u32, u64, AsyncReader)>) {
    if let Some(info) = with_running_task(kernel, target, to_index) {
        let _ = target::register(&kernel.registry(), &target.process, &info);
    }
}

/// The target's registration with the task fields, once its asyncio reader exists and it
/// was not registered so yet (`None` otherwise). Nothing is read from the target here.
fn with_running_task(kernel: &KernelProgram, target: &mut Target, to_index: &mut Vec<(u32, u64, AsyncReader)>) -> Option<profiler_common::ProcessInfo> {
    let (offset, tasks, reader) = target.async_registration_due()?;
    let tasks = match kernel.walk() {
        crate::kernel::loader::Walk::BpfLoop => tasks.unwrap_or_default(),
        crate::kernel::loader::Walk::Bounded => Default::default(),
    };
    if tasks.task_read != 0 {
        to_index.push((target.process.pid, target.process.start_time, reader));
    }
    Some(profiler_common::ProcessInfo { running_task: offset, tasks, ..target.registered })
}

/// Whether `pid` or one of its first 64 ancestors is a root (init is never one).
fn descends_from(pid: u32, is_root: impl Fn(u32) -> bool) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if is_root(p) {
            return true;
        }
        match discovery::parent_pid(p) {
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

/// The state of a recording, on the sampling loop's thread. Discovery runs on a thread of its
/// own (`discoverer`) from `start_discovery` on, and reports through a channel.
/// Processes too old for asyncio task stacks named in a warning under `--async`.
const MAX_ASYNC_WARNINGS: u32 = 5;

pub(crate) struct Session {
    pub(crate) kernel: KernelProgram,
    /// Which processes to profile; given to discovery when it starts.
    pub(crate) scope: Scope,
    pub(crate) filter: ProcessFilter,
    targets: hashbrown::HashMap<u32, Target>,
    /// Counts of processes no longer profiled (exited, or their PID reused).
    retired: Vec<Retired>,
    /// Summed counts of retired processes pushed out of `retired`.
    retired_overflow: Counters,
    pub(crate) profile: Profile,
    threads: bool,
    /// With `--threads` or a timeline (`gecko`, `chrometrace`): the helper reading thread
    /// names off the sampling loop (started with discovery).
    namer: Option<thread_names::ThreadNamer>,
    /// Threads already switched out when the kernel began to watch their process.
    pub(crate) blocked: blocked_at_start::BlockedAtStart,
    /// Which records count and what each is worth (`--mode`).
    time_mode: TimeMode,
    /// Nanoseconds between two CPU-clock samples (the value of one in the time modes).
    period_ns: u64,
    unknown_process_samples: u64,
    /// Code-object snapshots of no current target (a process gone or not registered now).
    pub(crate) unknown_process_snapshots: u64,
    pub(crate) malformed_records: u64,
    /// Samples whose completion or symbols needed more than `SAMPLE_READ_BUDGET`.
    pub(crate) samples_over_read_budget: u64,
    /// Records of processes in quarantine (`memory::deadline`), dropped.
    pub(crate) quarantined_records: u64,
    /// What the drain thread counted (set when the loop ends).
    pub(crate) drain_counts: drain::DrainCounts,
    /// CPUs' batches of off-CPU records read from the kernel's map at the end (not sent).
    pub(crate) off_cpu_batches_at_end: u64,
    /// Off-CPU intervals still pending at the end whose thread ran unseen during a pause of
    /// the scheduler-switch program (`--max-cpu`): dropped.
    pub(crate) off_cpu_paused_dropped: u64,
    /// When the kernel programs were detached (kernel monotonic clock): waits still pending
    /// are charged up to here, not up to when the last records were processed.
    pub(crate) sampling_stopped_ns: Option<u64>,
    /// Processes that were ever registered.
    pub(crate) registered: u64,
    /// Samples dropped because what they point to had changed before we read it.
    late_samples: u64,
    /// Whether the record being processed waited little enough in the queue for its tail to
    /// be read from the target when not cached (`event_loop::TAIL_READ_MAX_WAIT`).
    pub(crate) read_tails: bool,
    discovery: Option<DiscoveryHandle>,
    pub(crate) discovery_stats: Arc<DiscoveryStats>,
    /// `--async`: asyncio task stacks for the processes that can have them.
    async_stacks: bool,
    /// Processes registered under `--async` whose version has no task stacks.
    async_too_old: u32,
    /// With `async_stacks`: the kernel's coroutine → task index (`task_index`), started with
    /// the first record (threads start only once capabilities were dropped), and the
    /// processes registered for task chains it has not been given yet.
    task_index: Option<task_index::TaskIndex>,
    to_index: Vec<(u32, u64, AsyncReader)>,
    /// `--native` / `--kernel`: what the kernel records beside the Python frames.
    native: Option<Arc<crate::target::native::NativeContext>>,
    /// Bytes of records held by all processes while their native files are read
    /// (`sample::hold`).
    held_bytes: usize,
    /// `--kernel` with off-CPU time: the kernel stacks where threads blocked, by id.
    pub(crate) kernel_stacks: off_cpu_kernel::KernelStacks,
    /// How far pending off-CPU intervals were charged at periods' ends (`off_cpu`).
    charged: off_cpu::ChargedParts,
    /// `--min-off-cpu`: pending intervals shorter than this are not charged at a period's end.
    min_off_cpu_ns: u64,
    /// `--async` with wall or off-CPU time: the helper reading suspended tasks' waits.
    task_waits: Option<task_waits::TaskWaits>,
    /// `--max-cpu`: pyperch's CPU held under a budget by a sampled share.
    pub(crate) cpu_budget: cpu_budget::SessionBudget,
}

/// What one sample may read from its target (its walk's tail, code objects, names, line
/// tables): past it the rest of the sample is not read (it is dropped, or shows what was
/// read, as any unreadable part) and counted. A 1,500-frame stack never seen before needs
/// about 9,000 reads.
pub(crate) const SAMPLE_READ_BUDGET: memory::ReadBudget = memory::ReadBudget { reads: 32 << 10, bytes: 32 << 20, exhausted: false };

/// What is kept of a target that is no longer profiled; the rest is freed here.
fn retired_entry(old: Target) -> Retired {
    Retired {
        pid: old.process.pid,
        comm: old.process.comm.clone(),
        version: old.process.version_label(),
        counters: old.counters,
    }
}

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
            targets: hashbrown::HashMap::new(),
            retired: Vec::new(),
            retired_overflow: Counters::default(),
            profile: Profile::new(),
            threads,
            namer: None,
            blocked: blocked_at_start::BlockedAtStart::default(),
            time_mode: TimeMode::Cpu,
            period_ns: 0,
            unknown_process_samples: 0,
            unknown_process_snapshots: 0,
            malformed_records: 0,
            quarantined_records: 0,
            samples_over_read_budget: 0,
            drain_counts: drain::DrainCounts::default(),
            off_cpu_batches_at_end: 0,
            off_cpu_paused_dropped: 0,
            sampling_stopped_ns: None,
            registered: 0,
            late_samples: 0,
            read_tails: true,
            discovery: None,
            discovery_stats: Arc::default(),
            native: None,
            held_bytes: 0,
            kernel_stacks: Default::default(),
            charged: Default::default(),
            min_off_cpu_ns: 0,
            async_stacks: false,
            async_too_old: 0,
            task_index: None,
            to_index: Vec::new(),
            task_waits: None,
            cpu_budget: Default::default(),
        }
    }

    /// Sets which time the profile shows (`--mode`) and the sampling rate (for the value of a
    /// CPU sample in the time modes).
    pub(crate) fn set_time_mode(&mut self, mode: TimeMode, rate_hz: u64) {
        self.time_mode = mode;
        self.period_ns = 1_000_000_000 / rate_hz.max(1);
        self.profile.set_time_mode(mode);
    }

    /// `--min-off-cpu`, for the pending intervals charged at a period's end.
    pub(crate) fn set_min_off_cpu(&mut self, min: std::time::Duration) {
        self.min_off_cpu_ns = u64::try_from(min.as_nanos()).unwrap_or(u64::MAX);
    }

    /// `--kernel` in an off-CPU mode: off-CPU intervals carry the kernel stack where the
    /// thread blocked.
    pub(crate) fn off_cpu_kernel_stacks(&self) -> bool {
        self.time_mode.off_cpu() && self.native.as_ref().is_some_and(|n| n.options.kernel)
    }

    /// In the off-CPU modes, starts reading the stacks of the threads of every registered
    /// process, for the waits that began before the kernel watched it (see
    /// `blocked_at_start`). Called once the processes given at the start are registered and
    /// the scheduler-switch program is attached: the kernel has watched them since at least
    /// now. (Not since the attach: a process is watched from its registration, which follows
    /// the attach and the privilege drop; a wait charged from the attach would include time
    /// the thread ran before it blocked.) Python frames only: not with native user frames
    /// (`--native`) or asyncio task stacks; with `--kernel` alone such a wait is shown without
    /// kernel frames (where it blocked was not seen).
    /// Processes that discovery registers from now on are read likewise, from their
    /// registration (`DiscoveryEvent::Registered`).
    pub(crate) fn read_blocked_threads(&mut self) {
        let registered_ns = crate::kernel::loader::monotonic_ns();
        let user_native = self.native.as_ref().is_some_and(|n| n.options.stack_bytes != 0);
        if !self.time_mode.off_cpu() || user_native || self.async_stacks {
            return;
        }
        self.blocked.enable();
        let processes: Vec<(PythonProcess, u32)> =
            self.targets.values().filter(|t| t.alive).map(|t| (t.process.clone(), t.generation)).collect();
        for (process, generation) in processes {
            self.blocked.ask(process, generation, registered_ns);
        }
    }


    /// Gives the processes registered for task chains to the coroutine → task index, started
    /// now if it is not yet (called while sampling: capabilities are dropped by then).
    fn feed_task_index(&mut self) {
        if self.task_index.is_none() {
            self.task_index = task_index::TaskIndex::start(self.kernel.registry());
        }
        for (pid, start_time, reader) in self.to_index.drain(..) {
            if let Some(index) = &self.task_index {
                index.add(pid, start_time, reader);
            }
        }
    }

    /// Asks for asyncio task stacks (`--async`) in every process added from now on.
    pub(crate) fn set_async_stacks(&mut self, on: bool) {
        self.async_stacks = on;

    }

    /// Native and kernel frames for the targets added from now on (`--native`, `--kernel`).
    pub(crate) fn set_native(&mut self, native: crate::target::native::NativeContext) {
        self.native = Some(Arc::new(native));
    }

    /// `--stats`' line of the native side's reading of maps and files (with native frames).
    pub(crate) fn native_io_report(&self) -> Option<String> {
        let native = self.native.as_ref()?;
        let io = native.io.as_ref()?.report();
        Some(match &native.tables {
            Some(t) => format!("{io}\n  {}", t.report()),
            None => io,
        })
    }

    /// Under `--mode gil`, says once per process that a free-threaded process without a GIL
    /// (`no_gil`, as discovery read it) will have no samples.
    fn warn_if_no_gil(&self, process: &PythonProcess, no_gil: bool) {
        if no_gil && self.time_mode == TimeMode::Gil {
            eprintln!(
                "pyperch: warning: process {} ({}, CPython {}) runs without a GIL: --mode gil keeps none of its samples (PYTHON_GIL=1 gives it one)",
                process.pid,
                crate::text::field(&process.comm),
                process.version_label()
            );
        }
    }

    /// With `--async`, says (for the first [`MAX_ASYNC_WARNINGS`] processes) that a process
    /// too old for asyncio task stacks keeps plain ones: `record --pid` refuses such a
    /// process, but the agent and whole-host recordings profile it as it is.
    fn warn_if_no_task_stacks(&mut self, process: &PythonProcess) {
        if !self.async_stacks || crate::target::asyncio::supported(process.version) {
            return;
        }
        self.async_too_old += 1;
        if self.async_too_old <= MAX_ASYNC_WARNINGS {
            eprintln!(
                "pyperch: warning: process {} ({}, CPython {}) keeps plain stacks under --async: asyncio task stacks need CPython 3.14 or later{}",
                process.pid,
                crate::text::field(&process.comm),
                process.version_label(),
                if self.async_too_old == MAX_ASYNC_WARNINGS { " (further such processes are not named)" } else { "" }
            );
        }
    }

    /// Registers a Python process with the kernel if its interpreter is ready. Only before
    /// discovery starts (explicit pids, inspected by the caller).
    pub(crate) fn add_process(&mut self, process: PythonProcess) -> Result<bool, SessionError> {
        let pid = process.pid;
        let mem = ProcessMemory::new(pid);
        let generation = self.kernel.registry().next_generation();
        let info = match process.kernel_info(&mem) {
            Ok(info) => profiler_common::ProcessInfo { frame: process.layout.kernel_frame_layout(), generation, ..info },
            Err(DiscoveryError::NotReady { .. }) => return Ok(false),
            Err(e) => return Err(SessionError::Inspect { pid, message: e.to_string() }),
        };
        let label = discoverer::process_label(&process);
        let exe_link = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        self.warn_if_no_gil(&process, discoverer::runs_without_gil(&mem, &info));
        self.warn_if_no_task_stacks(&process);
        let mut target = self.new_target(process, exe_link, generation, info);
        // With --async, the asyncio reader is made before the first registration, so that no
        // sample is taken without the running task (which would keep its plain stack).
        let mut to_index = Vec::new();
        let mut registration = info;
        if self.async_stacks {
            target.resolve_async_now(INSPECT_BUDGET);
            registration = with_running_task(&self.kernel, &mut target, &mut to_index).unwrap_or(info);
        }
        if !target::register(&self.kernel.registry(), &target.process, &registration)? {
            return Ok(false);
        }
        self.to_index.extend(to_index);
        self.insert_target(target, label);
        Ok(true)
    }

    /// A target for `process`, not registered with the kernel yet.
    fn new_target(&self, process: PythonProcess, exe_link: PathBuf, generation: u32, info: profiler_common::ProcessInfo) -> Target {
        let mut target = Target::new(process, exe_link, generation, info, self.native.clone());
        if self.async_stacks {
            // Registered for task chains once its reader is made: right away for processes
            // given with --pid (`resolve_async_now`), else after a sample (`process_record`).
            target.enable_async();
        }
        target
    }

    /// Adds a target registered with the kernel.
    fn insert_target(&mut self, target: Target, label: ProcessLabel) {
        let pid = target.process.pid;
        self.profile.set_process(pid, label);
        if let Some(old) = self.targets.insert(pid, target) {
            self.retire(old);
        }
        self.registered += 1;
    }

    /// Starts discovery on its own thread, scanning every `interval`.
    pub(crate) fn start_discovery(&mut self, interval: Duration) -> Result<(), SessionError> {
        // The native side's worker too: threads start only once capabilities are dropped.
        if let Some(io) = self.native.as_ref().and_then(|n| n.io.as_ref()) {
            io.start_worker();
        }
        let registered = self
            .targets
            .values()
            .filter(|t| t.alive)
            .map(|t| (t.process.pid, t.process.start_time, t.exe_link.clone()))
            .collect();
        let handle = discoverer::start(
            self.kernel.registry(),
            self.scope.clone(),
            self.filter.clone(),
            registered,
            interval,
            // Three quarters of `--max-cpu` at most for discovery; the budget's controller
            // lowers the sampling rate to fit the rest.
            self.cpu_budget.state().map(|b| b.budget_percent / 100.0 * DISCOVERY_SHARE_OF_BUDGET),
            self.discovery_stats.clone(),
        )
        .map_err(|e| SessionError::Runtime(format!("could not start the discovery thread: {e}")))?;
        self.discovery = Some(handle);
        // Started with discovery: after pyperch dropped its capabilities (a single thread then).
        // Formats with a timeline show one track per thread, so they name threads too.
        if (self.threads || self.profile.timeline().is_some()) && self.namer.is_none() {
            self.namer = thread_names::ThreadNamer::start();
        }
        if self.async_stacks && self.time_mode.off_cpu() && self.task_waits.is_none() {
            self.task_waits = task_waits::TaskWaits::start(Duration::from_nanos(self.period_ns.max(1)));
        }
        Ok(())
    }

    /// Stops discovery (without waiting for it) and applies what it reported until now.
    pub(crate) fn stop_discovery(&mut self) {
        if let Some(namer) = self.namer.as_mut() {
            namer.sync_next();
        }
        if let Some(waits) = self.task_waits.as_mut() {
            waits.sync_next();
        }
        self.apply_discovery();
        self.discovery = None;
        // Its last charges are in: the helper stops (nothing is read after sampling ends).
        self.task_waits = None;
    }

    /// Applies what discovery reported since the last call. Called before every batch of
    /// samples, so every registered process is known when its samples arrive.
    pub(crate) fn apply_discovery(&mut self) {
        self.sync_thread_names();
        self.sync_task_waits();
        let Some(handle) = &self.discovery else { return };
        let events: Vec<DiscoveryEvent> = handle.events.try_iter().collect();
        for event in events {
            match event {
                DiscoveryEvent::Added(new) => {
                    let discoverer::NewTarget { process, exe_link, label, generation, info, no_gil } = *new;
                    self.warn_if_no_gil(&process, no_gil);
                    self.warn_if_no_task_stacks(&process);
                    let target = self.new_target(process, exe_link, generation, info);
                    self.insert_target(target, label);
                }
                DiscoveryEvent::Registered { pid, generation, at_ns } => {
                    if let Some(target) = self.targets.get(&pid).filter(|t| t.generation == generation && t.alive) {
                        let process = target.process.clone();
                        self.blocked.ask(process, generation, at_ns);
                    }
                }
                DiscoveryEvent::Exited(pid) => {
                    // Kept (not sampled any more) for samples still in flight.
                    if let Some(target) = self.targets.get_mut(&pid) {
                        target.alive = false;
                    }
                }
                DiscoveryEvent::Replaced(pid) => {
                    self.release_held(pid);
                    if let Some(old) = self.targets.remove(&pid) {
                        self.retire(old);
                    }
                }
            }
        }
    }

    /// When thread names are read (see `namer`): gives the name helper the live processes and
    /// the profile the names it read (never waits for the helper).
    fn sync_thread_names(&mut self) {
        let Some(namer) = self.namer.as_mut() else { return };
        if !namer.due() {
            return;
        }
        namer.set_targets(
            self.targets.values().filter(|t| t.alive).map(|t| crate::target::thread_registry::RegistryTarget::of(&t.process)).collect(),
        );
        for (tid, name) in namer.take() {
            self.profile.set_thread_name(tid, &name);
        }
    }

    /// With task waits (see `task_waits`): gives the helper the processes whose asyncio reader
    /// exists (making the readers due, off this thread) and adds what it charged to the
    /// profile (never waits for the helper).
    fn sync_task_waits(&mut self) {
        let Some(waits) = self.task_waits.as_mut() else { return };
        if !waits.due() {
            return;
        }
        let mut wanted = Vec::new();
        for target in self.targets.values_mut().filter(|t| t.alive) {
            register_running_task(&self.kernel, target, &mut self.to_index);
            if let Some(reader) = target.ready_async_reader() {
                wanted.push((target.process.pid, target.generation, reader));
            }
        }
        waits.set_targets(wanted);
        let charges = waits.take();
        if !self.to_index.is_empty() {
            self.feed_task_index();
        }
        for (key, mut counts) in charges.counts {
            let Some(target) = self.targets.get_mut(&key.0).filter(|t| t.generation == key.1) else { continue };
            for ((thread, frames), (ns, tasks)) in charges.stacks.get(&key).into_iter().flatten() {
                if !add_wait_stack(&mut self.profile, key.0, self.threads.then_some(*thread).flatten(), frames, *ns, *tasks) {
                    counts.profile_full += tasks;
                    counts.charges -= tasks;
                    counts.wait_ns -= ns;
                }
            }
            target.counters.task_waits.add(&counts);
        }
    }

    /// Keeps the counts of a target no longer profiled, and frees its caches.
    fn retire(&mut self, old: Target) {
        // `old` (and its native unwinder) is dropped inside `retired_entry`.
        let entry = retired_entry(old);
        self.retired.push(entry);
        // The process's native unwinder held its files: free those no process uses now.
        if self.native.is_some() {
            crate::target::native::file_cache::release_unused();
        }
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
            // It exited: its PID may be a new process's, readable again.
            crate::target::memory::deadline::release(pid);
            self.release_held(pid);
            if let Some(t) = self.targets.remove(&pid) {
                self.retire(t);
            }
        }
    }

    /// How long until the next drain on the beat, given the configured discovery interval.
    fn beat_interval(&self, configured: Duration) -> Duration {
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

    /// Processes with at least one sample (or, in the off-CPU modes, measured wait) in the
    /// profile.
    pub(crate) fn sampled_processes(&self) -> usize {
        let mut pids: HashSet<u32> = HashSet::new();
        for t in self.targets.values() {
            if t.counters.ok() > 0 || t.counters.off_cpu_ns > 0 || t.counters.task_waits.wait_ns > 0 {
                pids.insert(t.process.pid);
            }
        }
        for r in &self.retired {
            if r.counters.ok() > 0 || r.counters.off_cpu_ns > 0 || r.counters.task_waits.wait_ns > 0 {
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
            .map(|t| (t.process.pid, t.process.comm.clone(), t.process.version_label(), t.alive, &t.counters))
            .chain(self.retired.iter().map(|r| (r.pid, r.comm.clone(), r.version.clone(), false, &r.counters)))
            .collect();
        rows.sort_by_key(|r| r.0);
        rows
    }

    pub(crate) fn on_record(&mut self, bytes: &[u8]) {
        self.on_record_from(bytes, true);
    }

    /// One ring-buffer item: a record, or (kind `OFF_CPU`) a CPU's batch of off-CPU records,
    /// each as long as its header's `n_full` says (`off_cpu_record_len`).
    pub(crate) fn on_ring_item(&mut self, bytes: &[u8]) {
        let Some(header) = SampleHeader::read(bytes) else {
            self.malformed_records += 1;
            return;
        };
        if header.kind == record_kind::TASK_CHAIN {
            // Kept for the sample that follows it, of the registration it was read under.
            if let Some(target) = self.targets.get_mut(&header.tgid).filter(|t| t.generation == header.generation) {
                target.add_task_chain(&header, bytes);
            }
            return;
        }
        if header.kind == record_kind::CODE_SNAPSHOT {
            // Only the registration it was copied under.
            match self.targets.get_mut(&header.tgid).filter(|t| t.generation == header.generation) {
                Some(target) => target.add_snapshot(bytes),
                None => self.unknown_process_snapshots += 1,
            }
            return;
        }
        if header.kind != record_kind::OFF_CPU {
            return self.on_record(bytes);
        }
        self.on_off_cpu_records(bytes);
    }

    /// Off-CPU records one after the other (a CPU's batch); a batch that ends inside a
    /// record is counted malformed from there.
    pub(crate) fn on_off_cpu_records(&mut self, bytes: &[u8]) {
        for record in OffCpuRecords::new(bytes) {
            match record {
                Ok((_, record)) => self.on_record(record),
                Err(MalformedBatch) => self.malformed_records += 1,
            }
        }
    }

    /// One record; `from_kernel`: read from the ring buffer (an off-CPU interval then charges
    /// only what periods' ends did not), else made from what the kernel kept (`off_cpu`).
    fn on_record_from(&mut self, bytes: &[u8], from_kernel: bool) {
        let Some((header, body)) = split_record(bytes) else {
            self.malformed_records += 1;
            return;
        };
        if crate::target::memory::deadline::is_quarantined(header.tgid) {
            // Its memory did not answer once: nothing more is read from it.
            self.quarantined_records += 1;
            return;
        }
        let charge = match header.kind {
            record_kind::CPU_SAMPLE | record_kind::CPU_SAMPLE_NATIVE if !self.time_mode.on_cpu() => return,
            record_kind::CPU_SAMPLE | record_kind::CPU_SAMPLE_NATIVE => {
                let value = if self.time_mode.in_nanoseconds() { self.period_ns } else { 1 };
                // A sample kept by `--max-cpu`'s sampled share stands for that many.
                Charge::new(weighted(value, header.flags), gc_leaf(&header))
            }
            record_kind::OFF_CPU if self.time_mode.off_cpu() => {
                let Some(interval) = off_cpu_trailer(&header, body) else {
                    self.malformed_records += 1;
                    return;
                };
                let leaf = off_cpu_leaf(interval.reason);
                self.add_short_off_cpu(header.tgid, header.generation, header.tid, interval.short_ns);
                let value = if from_kernel {
                    let rest = self.charged.remaining(header.tid, interval.switched_out_ns, interval.off_ns);
                    // An ended wait that pauses could have hidden stands for those they hid
                    // (`kernel::switch_gate`; 1 without pauses).
                    let end_weight = self.kernel.switch_gate().map_or(1.0, |g| {
                        g.end_weight(interval.switched_out_ns, interval.switched_out_ns.saturating_add(interval.off_ns))
                    });
                    if end_weight > 1.0 { (rest as f64 * end_weight).round() as u64 } else { rest }
                } else {
                    interval.off_ns
                };
                if value == 0 {
                    return;
                }
                // An interval walked by `--max-cpu`'s sampled share stands for that many
                // (its short time came weighted already).
                let value = weighted(value, header.flags);
                let kernel = self.kernel_stacks.get(&self.kernel, interval.kernel_stack);
                Charge { value, leaf: Some(leaf), kernel }
            }
            _ => {
                self.malformed_records += 1;
                return;
            }
        };
        if self.targets.get(&header.tgid).is_none_or(|t| t.generation != header.generation) {
            // Discovery may have announced it (or its successor) after our last look.
            self.apply_discovery();
        }
        // With --native, a process's first samples wait (briefly, bounded) for its files.
        if header.kind == record_kind::CPU_SAMPLE_NATIVE {
            if let Some(target) = self.targets.get_mut(&header.tgid).filter(|t| t.generation == header.generation) {
                let waiting = target.native_waiting();
                if target.held.hold(bytes, charge.clone(), waiting, &mut self.held_bytes) {
                    target.counters.native_held += 1;
                    return;
                }
                if !target.held.is_empty() {
                    self.release_held(header.tgid);
                }
            }
        }
        self.process_record(&header, bytes, charge);
    }

    /// Processes every held record of `pid`, oldest first (see `sample::hold`).
    fn release_held(&mut self, pid: u32) {
        let Some(target) = self.targets.get_mut(&pid) else { return };
        let records = target.held.take(&mut self.held_bytes);
        for (record, charge) in records {
            if let Some(header) = SampleHeader::read(&record) {
                self.process_record(&header, &record, charge);
            }
        }
    }

    /// Processes the held records that are due (their files are in, or they waited long
    /// enough); `all`: every held record (the end of the recording, or of a process).
    pub(crate) fn release_due_held(&mut self, all: bool) {
        if self.held_bytes == 0 {
            return;
        }
        let due: Vec<u32> = self
            .targets
            .iter_mut()
            .filter_map(|(pid, t)| {
                let waiting = !all && t.native_waiting();
                (t.held.due(waiting) || (all && !t.held.is_empty())).then_some(*pid)
            })
            .collect();
        for pid in due {
            self.release_held(pid);
        }
    }

    /// One record of a known kind, with what it is worth, after any holding.
    fn process_record(&mut self, header: &SampleHeader, bytes: &[u8], charge: Charge) {
        let header = *header;
        // Only the registration the sample was taken under: never a reused PID's successor.
        let Some(target) = self.targets.get_mut(&header.tgid).filter(|t| t.generation == header.generation) else {
            self.unknown_process_samples += 1;
            return;
        };
        let (reads, read_bytes) = (memory::READS.load(Relaxed), memory::BYTES_READ.load(Relaxed));
        let value = charge.value;
        target.read_tails = self.read_tails;
        let (outcome, used) = memory::with_read_budget(SAMPLE_READ_BUDGET, || {
            target.process_sample(&header, record_body(bytes).unwrap_or_default(), &mut self.profile, self.threads, charge)
        });
        if used.exhausted {
            self.samples_over_read_budget += 1;
        }
        register_running_task(&self.kernel, target, &mut self.to_index);
        target.counters.count(outcome);
        if outcome == SampleOutcome::Ok && header.kind != record_kind::OFF_CPU && header.flags & sample_flags::GC != 0 {
            target.counters.gc_samples += 1;
        }
        if header.kind == record_kind::OFF_CPU {
            target.counters.off_cpu_intervals += 1;
            if outcome == SampleOutcome::Ok {
                target.counters.off_cpu_ns += value;
            } else {
                target.counters.off_cpu_dropped_ns += value;
            }
        }
        target.counters.ring_bytes += bytes.len() as u64;
        // Reads happen on this thread only, so the difference is this sample's.
        target.counters.memory_reads += memory::READS.load(Relaxed) - reads;
        if matches!(outcome, SampleOutcome::ChangedCodeObject | SampleOutcome::BadCodeObject | SampleOutcome::StaleTail) {
            self.late_samples += 1;
        }
        target.counters.memory_bytes += memory::BYTES_READ.load(Relaxed) - read_bytes;
        if !self.to_index.is_empty() {
            self.feed_task_index();
        }
        self.enforce_cache_budget();
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


/// Adds one suspended task's await stack (root first) with its wait to the profile, ending
/// in `<task waiting>`; `false` when the profile is full.
fn add_wait_stack(
    profile: &mut Profile,
    pid: u32,
    thread: Option<u64>,
    frames: &[crate::target::asyncio::waits::WaitFrame],
    ns: u64,
    tasks: u64,
) -> bool {
    use crate::{sample::aggregate::FrameName, target::asyncio::waits::WaitFrame};
    let mut stack = Vec::with_capacity(frames.len() + 1);
    for frame in frames {
        let name = match frame {
            WaitFrame::Code(f) => {
                let line = profile.line_numbers().pick(|| f.line, f.line);
                FrameName { function: f.function.as_str().into(), file: f.file.as_str().into(), line, native: None }
            }
            other => FrameName { function: other.name().into(), file: "".into(), line: 0, native: None },
        };
        match profile.try_intern(name) {
            Some(id) => stack.push(id),
            None => return false,
        }
    }
    match profile.try_intern_static(task_waits::WAIT_LEAF) {
        Some(id) => stack.push(id),
        None => return false,
    }
    let tid = thread.and_then(|t| u32::try_from(t).ok());
    profile.add_weighted(pid, tid, &stack, ns, tasks)
}

/// What a record's `value` (a CPU sample's period or count, an off-CPU interval's length)
/// counts for: times the weight in its flags (`sample_flags::weight`: the divisor of
/// `--max-cpu`'s sampled share it was kept or walked under; 1 without one), saturating.
fn weighted(value: u64, flags: u32) -> u64 {
    value.saturating_mul(u64::from(sample_flags::weight(flags)))
}

/// The `<GC>` leaf of a CPU sample whose thread was collecting garbage (the kernel's
/// `sample_flags::GC`). Records with native context get it from the native merge instead:
/// with `--kernel` alone under the kernel frames, with `--native` not at all (the user stack
/// shows the collector's C functions).
fn gc_leaf(header: &SampleHeader) -> Option<&'static str> {
    (header.kind == record_kind::CPU_SAMPLE && header.flags & sample_flags::GC != 0).then_some(GC_FRAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only plain CPU samples flagged by the kernel end in `<GC>`; native ones and off-CPU
    /// intervals never do.
    #[test]
    fn gc_leaf_only_for_flagged_plain_cpu_samples() {
        let flagged = SampleHeader { kind: record_kind::CPU_SAMPLE, flags: sample_flags::GC, ..Default::default() };
        assert_eq!(gc_leaf(&flagged), Some(GC_FRAME));
        assert_eq!(gc_leaf(&SampleHeader { flags: 0, ..flagged }), None);
        assert_eq!(gc_leaf(&SampleHeader { kind: record_kind::CPU_SAMPLE_NATIVE, ..flagged }), None);
        assert_eq!(gc_leaf(&SampleHeader { kind: record_kind::OFF_CPU, ..flagged }), None);
    }

    /// A record kept or walked under the sampled share counts its value that many times: an
    /// off-CPU interval of 350 us walked one switch in 16 stands for 5.6 ms; without a
    /// weight (0) or with the GC bit alone it counts once; the product saturates.
    #[test]
    fn values_are_weighted_by_the_share() {
        use sample_flags::{GC, MAX_WEIGHT, WEIGHT_SHIFT};
        assert_eq!(weighted(350_000, 0), 350_000);
        assert_eq!(weighted(350_000, GC), 350_000);
        assert_eq!(weighted(350_000, 1 << WEIGHT_SHIFT), 350_000);
        assert_eq!(weighted(350_000, 16 << WEIGHT_SHIFT), 5_600_000);
        assert_eq!(weighted(350_000, GC | (16 << WEIGHT_SHIFT)), 5_600_000);
        assert_eq!(weighted(u64::MAX / 2, MAX_WEIGHT << WEIGHT_SHIFT), u64::MAX);
        // Unbiased: 1,000 intervals walked one in 10 at random stand, in expectation, for
        // 10,000 intervals of the same lengths.
        let walked: u64 = (0..1000).map(|i| weighted(100_000 + i, 10 << WEIGHT_SHIFT)).sum();
        let all: u64 = (0..1000).map(|i| 10 * (100_000 + i)).sum();
        assert_eq!(walked, all);
    }
}
