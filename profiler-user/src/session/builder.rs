//! One place where a session is built and started, for every command that runs one
//! (`record`, `agent`, `top`): the command states what it needs in a [`SessionBuilder`],
//! and [`SessionBuilder::start`] does the start-up in its one order:
//!
//! 1. the given processes must exist (only `/proc/PID/stat` is read: no helper thread yet);
//! 2. the kernel program is loaded, its ring buffer taken, kernel symbols read (they need
//!    privileges that are dropped below);
//! 3. the session is made and configured (with `--max-cpu`, the kernel's BPF statistics
//!    turned on, which needs the privileges dropped below);
//! 4. the sampling programs are attached (per-task events for `--pid` alone where asked, none
//!    before a held launch, every CPU otherwise; the scheduler switch in the off-CPU modes);
//! 5. a command to launch is started (held before its exec until its events are open);
//! 6. privileges are dropped, while pyperch still has one thread;
//! 7. only then are the given processes inspected (inspection runs helper threads that a
//!    hostile file may keep blocked, and reads what targets control), refused when they
//!    cannot be profiled, and registered;
//! 8. blocked threads are read from their registration on (off-CPU modes).
//!
//! The loop is run by [`StartedSession::run`], once: its drain thread starts after the
//! given processes are registered.

use std::{path::PathBuf, process::Child, time::Duration};

use super::{
    Budgeted, DISCOVERY_INTERVAL, LAUNCH_DISCOVERY_INTERVAL, LoopControl, LoopEnd, Scope, Session,
    error::{MAX_RATE, SessionError},
    event_loop::PeriodicHook,
    exit_watch::ExitWatch,
    run_loop,
};
use crate::{
    sample::aggregate::LineNumbers,
    target::discovery::{self, DiscoveryError, PythonProcess},
    filter::ProcessFilter,
    kernel::loader::KernelProgram,
    host::privileges,
    time_mode::TimeOptions,
};

/// Starts a command to profile (`record -- cmd`) once the programs are attached and before
/// privileges are dropped; `held` asks for it to be held before its exec until its per-task
/// events are open (opened on the given kernel program).
pub(crate) type Launcher = Box<dyn FnOnce(&mut KernelProgram, bool) -> Result<Child, SessionError>>;

/// What a command needs from its session; see the module docs for what [`Self::start`] does.
pub(crate) struct SessionBuilder {
    /// Only these processes; empty = every Python process on the host.
    pub(crate) pids: Vec<u32>,
    /// With `pids`: also every descendant of them, present and future (`--subprocesses`).
    pub(crate) subprocesses: bool,
    /// Only processes passing these filters.
    pub(crate) filter: ProcessFilter,
    /// Separate stacks by thread.
    pub(crate) threads: bool,
    pub(crate) rate: u64,
    /// Which time to profile; the kernel program is loaded with these.
    pub(crate) time: TimeOptions,
    /// Native and kernel frames (`--native`, `--kernel`).
    pub(crate) native: crate::target::native::NativeOptions,
    /// asyncio task stacks (`--async`).
    pub(crate) async_stacks: bool,
    /// With `async_stacks`: a given process whose version has no task stacks is refused.
    pub(crate) refuse_unsupported_async: bool,
    /// `--pid` alone interrupts only the given processes' tasks (per-task events that follow
    /// new threads and children) instead of every CPU.
    pub(crate) per_task_events: bool,
    /// The command to launch, if any; the session then profiles it and its descendants.
    pub(crate) launch: Option<Launcher>,
    /// The file written at the end, kept writable through the privilege drop.
    pub(crate) output: Option<PathBuf>,
    /// Which line frames show (`--function`, `--nolineno`).
    pub(crate) line_numbers: LineNumbers,
    /// Start every stack with the process's container.
    pub(crate) container_root: bool,
    /// The profile's memory budget, if not the default.
    pub(crate) profile_budget: Option<usize>,
    /// Keep a timeline of samples (chrometrace).
    pub(crate) timeline: bool,
    /// How warnings begin (`pyperch`, `pyperch agent`).
    pub(crate) name: &'static str,
    /// `--max-cpu`: pyperch's CPU budget, percent of one CPU (`cpu_budget`).
    pub(crate) max_cpu: Option<f64>,
}

impl SessionBuilder {
    /// A builder for `rate` and `time`, every other part at its default: the whole host, no
    /// filter, no threads, no native frames, no launch.
    pub(crate) fn new(name: &'static str, rate: u64, time: TimeOptions) -> Self {
        SessionBuilder {
            pids: Vec::new(),
            subprocesses: false,
            filter: ProcessFilter::default(),
            threads: false,
            rate,
            time,
            native: crate::target::native::NativeOptions::default(),
            async_stacks: false,
            refuse_unsupported_async: false,
            per_task_events: false,
            launch: None,
            output: None,
            line_numbers: LineNumbers::default(),
            container_root: false,
            profile_budget: None,
            timeline: false,
            name,
            max_cpu: None,
        }
    }

    /// The kernel and privileges pyperch needs, checked before anything is loaded.
    pub(crate) fn preflight(&self) -> Result<(), SessionError> {
        Ok(crate::kernel::loader::preflight()?)
    }

    /// Builds and starts the session (see the module docs), up to its loop.
    pub(crate) fn start(self) -> Result<StartedSession, SessionError> {
        // Only whether they exist is checked before attaching: inspecting them may leave a
        // thread behind (an opener waiting on a file that never answers), and the privilege drop
        // must run while pyperch has one thread; they are inspected once it has run.
        check_pids_exist(&self.pids)?;

        let mut kernel = KernelProgram::load_with(&self.time, self.native)?;
        let ring = kernel.take_ring_buffer()?;
        // Kernel symbols need privileges that are dropped once sampling starts: read them now.
        let kallsyms = self.native.kernel.then(crate::target::native::Kallsyms::load).flatten();
        if self.native.kernel && kallsyms.is_none() {
            eprintln!("{}: warning: /proc/kallsyms shows no addresses; kernel frames will read <kernel>_[k]", self.name);
        }
        let scope = match (self.pids.is_empty(), self.subprocesses) {
            (true, _) => Scope::Host,
            (false, false) => Scope::Pids(self.pids.iter().copied().collect()),
            (false, true) => Scope::Trees(self.pids.iter().copied().collect()),
        };
        let mut session = Session::new(kernel, scope, self.filter.clone(), self.threads);
        session.set_time_mode(self.time.mode, self.rate);
        session.set_min_off_cpu(self.time.min_off_cpu);
        session.set_async_stacks(self.async_stacks);
        session.profile.set_container_root(self.container_root);
        session.profile.set_line_numbers(self.line_numbers);
        if let Some(bytes) = self.profile_budget {
            session.profile.set_budget(bytes);
        }
        if self.native.any() {
            let tables = session.kernel.unwind_tables();
            session.set_native(crate::target::native::NativeContext::new(self.native, kallsyms, tables));
        }
        if self.timeline {
            session.profile.keep_timeline(1_000_000_000 / self.rate.max(1));
        }
        // Turning the kernel's BPF statistics on needs privileges dropped below.
        if let Some(percent) = self.max_cpu {
            let share = session.kernel.take_sample_share().ok_or_else(|| SessionError::Runtime("the sampled share was taken twice".into()))?;
            let programs = session.kernel.program_fds();
            let prepared = super::cpu_budget::Prepared::new(percent, self.rate, self.time.mode.off_cpu(), share, programs);
            if !super::cpu_budget::lock(&prepared.state()).bpf_measured {
                eprintln!(
                    "{}: warning: the kernel's BPF statistics cannot be turned on: --max-cpu measures pyperch's threads only",
                    self.name
                );
            }
            session.cpu_budget.prepare(prepared);
        }
        // With chosen processes (and no --subprocesses) or a launched command, only their tasks
        // are interrupted (per-task events that follow new threads and children); otherwise
        // every CPU is.
        let launched = self.launch.is_some();
        let launch_only = launched && self.pids.is_empty() && self.per_task_events;
        let mut pids_only = !launched && !self.pids.is_empty() && !self.subprocesses && self.per_task_events;
        if pids_only && crate::kernel::thread_events::many_threads(&self.pids) {
            log::info!(
                "over {} threads in the given processes: one perf event per CPU instead of one per thread",
                crate::kernel::thread_events::PER_TASK_MAX_THREADS
            );
            pids_only = false;
        }
        if pids_only {
            session.kernel.attach_tasks(self.rate, &self.pids)?;
        } else if !launch_only {
            session.kernel.attach(self.rate)?;
        }
        // Every registered process is watched from then on; the waits of threads already
        // switched out at their registration are charged from then (`read_blocked_threads`).
        if self.time.mode.off_cpu() {
            session.kernel.attach_off_cpu()?;
            // `--max-cpu` may pause it when its cost on every switch is over the budget.
            if let Some(gate) = session.kernel.pausable_switch_gate() {
                session.cpu_budget.set_switch_gate(gate);
            }
        }

        let mut child = None;
        if let Some(launch) = self.launch {
            let spawned = launch(&mut session.kernel, launch_only)?;
            session.scope = Scope::Launched { root: spawned.id() };
            child = Some(spawned);
        }
        // Attached and launched: keep only what sampling needs (before any other thread starts).
        privileges::drop_after_attach(&privileges::Keep { output: self.output.clone(), command: child.is_some() })?;
        session.kernel.start_kernel_log();
        let initial = if self.subprocesses {
            // The given processes need not be Python, nor match the filters: their descendants may.
            let mut ready = Vec::new();
            for &pid in &self.pids {
                match inspect_pids(&[pid], &self.filter) {
                    Ok(mut p) => ready.append(&mut p),
                    Err(SessionError::NotPython { .. } | SessionError::PidFiltered { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            ready
        } else {
            inspect_pids(&self.pids, &self.filter)?
        };
        if self.async_stacks && self.refuse_unsupported_async && !self.subprocesses {
            // An explicit process that cannot have task stacks is refused, with the reason.
            if let Some(p) = initial.iter().find(|p| !crate::target::asyncio::supported(p.version)) {
                let reason = crate::target::asyncio::AsyncioError::TooOld { pid: p.pid, version: p.version }.to_string();
                return Err(SessionError::Unsupported { pid: p.pid, comm: p.comm.clone(), reason });
            }
        }
        for p in initial {
            session.add_process(p)?;
        }
        session.read_blocked_threads();

        let discovery_interval = if child.is_some() { LAUNCH_DISCOVERY_INTERVAL } else { DISCOVERY_INTERVAL };
        // `--pid` alone: the recording also ends once every given process has exited.
        let exit_watch = if pids_only { ExitWatch::open(&self.pids) } else { None };
        Ok(StartedSession { session, ring: Some(ring), child, exit_watch, discovery_interval })
    }
}

/// A session started by [`SessionBuilder::start`]: attached, privileges dropped, the given
/// processes registered; sampled once [`Self::run`] runs its loop.
pub(crate) struct StartedSession {
    pub(crate) session: Session,
    /// Taken by the loop.
    ring: Option<aya::maps::RingBuf<aya::maps::MapData>>,
    /// The launched command, if any.
    pub(crate) child: Option<Child>,
    /// With per-task events for `--pid` alone: the given processes, whose exits end the loop.
    pub(crate) exit_watch: Option<ExitWatch>,
    discovery_interval: Duration,
}

impl StartedSession {
    /// Runs the session's loop (see `run_loop`) until `duration` elapsed, a signal, the
    /// launched command's exit or the given processes' exits; `periodic` runs every period
    /// inside it. The loop runs once: a second call fails.
    pub(crate) fn run<'a>(
        &'a mut self,
        duration: Option<Duration>,
        progress: bool,
        periodic: Option<(Duration, &'a mut PeriodicHook<'a>)>,
    ) -> Result<LoopEnd, SessionError> {
        let ring = self.ring.take().ok_or_else(|| SessionError::Runtime("the session's loop already ran".into()))?;
        let control = LoopControl {
            duration,
            child: self.child.as_mut(),
            progress,
            discovery_interval: self.discovery_interval,
            periodic,
            until_exited: self.exit_watch.as_ref(),
        };
        run_loop(&mut self.session, ring, control)
    }
}

/// Checks `--rate` (a user mistake, before anything else is done).
pub(crate) fn check_rate(rate: u64) -> Result<(), SessionError> {
    if rate == 0 || rate > MAX_RATE { Err(SessionError::Rate(rate)) } else { Ok(()) }
}

/// `NoSuchProcess` for the first of `pids` that does not exist; reads only `/proc/PID/stat`
/// on this thread (no helper thread, so it may run before the privilege drop).
pub(crate) fn check_pids_exist(pids: &[u32]) -> Result<(), SessionError> {
    match pids.iter().find(|&&pid| discovery::start_time(pid).is_none()) {
        Some(&pid) => Err(SessionError::NoSuchProcess(pid)),
        None => Ok(()),
    }
}

/// Time given to inspecting each process named with `--pid`, before sampling starts. Longer
/// than discovery's [`INSPECT_BUDGET`](super::INSPECT_BUDGET): the user named it, pyperch
/// has nothing else to do yet, and a process with hundreds of busy threads leaves pyperch's
/// looking thread a small share of the CPUs (CI: 200 busy threads, side by side with another test, outlasted 1.5 s). A
/// file that never answers still ends the start with that sentence, after this long.
const EXPLICIT_INSPECT_BUDGET: Duration = Duration::from_secs(10);

/// Explicit PIDs must exist, be Python and pass the filters; those whose interpreter is
/// not initialised yet are registered later by the session's scans.
/// Inspects each of `pids` with a time budget. Runs helper threads that may outlive it (a
/// file that never answers): call it only after [`privileges::drop_after_attach`].
pub(crate) fn inspect_pids(pids: &[u32], filter: &ProcessFilter) -> Result<Vec<PythonProcess>, SessionError> {
    let mut ready = Vec::new();
    for &pid in pids {
        if discovery::start_time(pid).is_none() {
            return Err(SessionError::NoSuchProcess(pid));
        }
        // A process whose files or /proc entries never answer must not hang the start.
        let budgeted = Budgeted::default();
        let checked_filter = filter.clone();
        let inspected = budgeted
            .run_for(pid, EXPLICIT_INSPECT_BUDGET, move || {
                (checked_filter.is_empty() || checked_filter.matches(pid)).then(|| discovery::inspect(pid))
            })
            .map_err(|_| SessionError::Inspect {
                pid,
                message: format!(
                    "its /proc entries or mapped files did not answer within {:.0} s",
                    EXPLICIT_INSPECT_BUDGET.as_secs_f64()
                ),
            })?;
        let Some(inspected) = inspected else {
            return Err(SessionError::PidFiltered { pid, filters: filter.describe() });
        };
        match inspected {
            Ok(p) => ready.push(p),
            Err(DiscoveryError::NotReady { .. }) => {}
            Err(DiscoveryError::Gone { .. }) => return Err(SessionError::NoSuchProcess(pid)),
            Err(DiscoveryError::NotPython { pid, comm }) => return Err(SessionError::NotPython { pid, comm }),
            Err(DiscoveryError::Unsupported { pid, comm, reason }) => {
                return Err(SessionError::Unsupported { pid, comm, reason });
            }
            Err(e) => return Err(SessionError::Inspect { pid, message: e.to_string() }),
        }
    }
    Ok(ready)
}
