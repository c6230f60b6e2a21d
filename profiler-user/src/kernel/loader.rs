//! Loading the kernel program: preflight checks, kernel structure offsets from BTF, the
//! per-CPU perf events, and the maps userspace talks through.
//!
//! The kernel program is embedded in the binary at build time (see build.rs).

use std::{
    fs,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    maps::ProgramArray,
    programs::{
        BtfTracePoint, PerfEvent, ProgramType, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use profiler_common::{ProcessInfo, counter};

/// The kernel program, built by build.rs for bpfel-unknown-none.
static KERNEL_PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";
/// The oldest kernel pyperch runs on: ring buffers (5.8), and tail calls from programs
/// with BPF-to-BPF calls on x86-64 (5.10) for the walk without `bpf_loop` (5.17).
const MIN_KERNEL: (u32, u32) = (5, 10);

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("pyperch lacks {missing}, so it cannot start; run it as root, for example with sudo")]
    NotPrivileged { missing: String },
    #[error("this kernel has no BTF ({BTF_PATH} is missing); pyperch needs a kernel built with CONFIG_DEBUG_INFO_BTF=y")]
    NoBtf,
    #[error("kernel {found} is too old; pyperch needs Linux {}.{} or newer ", MIN_KERNEL.0, MIN_KERNEL.1)]
    KernelTooOld { found: String },
    #[error("could not read the kernel's BTF ({BTF_PATH}): {0}")]
    Btf(String),
    #[error("the kernel's BTF has no {0}; pyperch cannot find thread registers on this kernel")]
    BtfMissing(&'static str),
    #[error("the kernel refused pyperch's eBPF program: {0}")]
    Load(String),
    #[error("could not attach to the CPU clock of process {pid}: {message}")]
    AttachTask { pid: u32, message: String },
    #[error("could not attach to the CPU clock on CPU {cpu}: {message}")]
    Attach { cpu: u32, message: String },
    #[error("{what} needs Linux 5.17 or newer (the bpf_loop helper); this kernel lacks it")]
    NeedsBpfLoop { what: &'static str },
    #[error("could not list the online CPUs: {0}")]
    Cpus(String),
    #[error("eBPF map {0} is missing from the kernel program")]
    MissingMap(&'static str),
    #[error("could not register process {pid} with the kernel program: {message}")]
    Register { pid: u32, message: String },
    /// The kernel's process map has no free slot: the caller retries later (slots free up as
    /// registered processes exit).
    #[error("could not register process {pid}: the kernel's process map is full ({slots} processes)")]
    MapFull { pid: u32, slots: u32 },
}

/// The environment variable of the per-part microbenchmark (`cargo xtask bench --only parts`).
pub const BENCH_STOP_ENV: &str = "PYPERCH_BENCH_STOP_AFTER";

/// Test-only: `PYPERCH_BENCH_STOP_AFTER=registration|thread-state|full-frames|tail` makes the
/// sampling program stop after that part and send nothing (`profiler_common::bench_stop`),
/// so the benchmark can time each part from the BPF run-time statistics. Unset (or any other
/// value, with a warning) loads the normal program.
fn bench_stop_after() -> u64 {
    use profiler_common::bench_stop;
    let Some(value) = std::env::var_os(BENCH_STOP_ENV) else { return bench_stop::NONE };
    let stop = match value.to_str().unwrap_or("") {
        "registration" => bench_stop::REGISTRATION,
        "thread-state" => bench_stop::THREAD_STATE,
        "full-frames" => bench_stop::FULL_FRAMES,
        "tail" => bench_stop::TAIL,
        "" | "none" => return bench_stop::NONE,
        other => {
            eprintln!("warning: {BENCH_STOP_ENV}={other:?} is not a part of the walk; ignored");
            return bench_stop::NONE;
        }
    };
    eprintln!("warning: {BENCH_STOP_ENV} is set: the sampling program stops early and records nothing (a benchmark mode)");
    stop
}

/// Checks what a user can fix before anything is loaded: privileges, BTF, kernel version.
pub fn preflight() -> Result<(), LoadError> {
    if let Some(missing) = crate::host::privileges::missing_to_start() {
        return Err(LoadError::NotPrivileged { missing });
    }
    if fs::metadata(BTF_PATH).is_err() {
        return Err(LoadError::NoBtf);
    }
    if crate::host::kernel_version() < MIN_KERNEL {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        return Err(LoadError::KernelTooOld { found: release.trim().to_string() });
    }
    Ok(())
}

/// Whether this process may load BPF programs, open system-wide perf events and read other
/// processes' memory: CAP_SYS_ADMIN, or CAP_BPF + CAP_PERFMON; plus CAP_SYS_PTRACE.
pub fn has_capabilities() -> bool {
    crate::host::privileges::missing_to_start().is_none()
}

/// The `(struct, member)` pairs whose offsets [`kernel_offsets`] reads, in the order of its
/// results.
pub(crate) const KERNEL_MEMBERS: [(&str, &str); 9] = [
    ("task_struct", "thread"),
    ("thread_struct", "fsbase"),
    ("task_struct", "signal"),
    ("signal_struct", "live"),
    ("task_struct", "pid"),
    ("task_struct", "tgid"),
    ("task_struct", "stack"),
    ("task_struct", "sched_info"),
    ("sched_info", "pcount"),
];

/// Where a task's saved user registers lie from the bottom of its kernel stack on x86_64:
/// `THREAD_SIZE` (16 KiB: `PAGE_SIZE << 2`, kernels without KASAN) minus `sizeof(struct
/// pt_regs)` (168), as the kernel's `task_pt_regs()` computes it (no top-of-stack padding on
/// x86_64). The bounded sampler reads them there (`profiler-ebpf`'s `native_stack`), where
/// `bpf_task_pt_regs` (5.15) is missing, and takes them only when their code segment is user
/// mode's: on a kernel built otherwise (KASAN's 32 KiB stacks) the samples lose their native
/// frames, never gain wrong ones.
const TASK_PT_REGS_OFFSET: u64 = 16384 - 168;

/// Offsets of `thread.fsbase` (required), `signal` and `signal_struct.live` (optional) in
/// `struct task_struct`, from the running kernel's BTF (one pass over it, see `kernel_btf`).
pub fn kernel_offsets() -> Result<KernelOffsets, LoadError> {
    let bytes = fs::read(BTF_PATH).map_err(|e| LoadError::Btf(e.to_string()))?;
    let btf = crate::host::kernel_btf::KernelBtf::new(&bytes).map_err(|e| LoadError::Btf(e.to_string()))?;
    let found = btf.member_offsets(&KERNEL_MEMBERS).map_err(|e| LoadError::Btf(e.to_string()))?;
    let thread_offset = found[0].ok_or(LoadError::BtfMissing("thread"))?;
    let fsbase_offset = found[1].ok_or(LoadError::BtfMissing("fsbase"))?;
    // Optional: without them the kernel program treats the group leader's exit as the
    // process's (see `pyperch_process_exit`), and off-CPU time cannot be measured
    // (`--mode wall/off-cpu` refused).
    let [signal, live, task_pid, task_tgid, task_stack] = [found[2], found[3], found[4], found[5], found[6]].map(|o| o.unwrap_or(0));
    // Optional: without it `--max-cpu` never pauses the scheduler-switch program.
    let task_pcount = match (found[7], found[8]) {
        (Some(info), Some(pcount)) => info + pcount,
        _ => 0,
    };
    Ok(KernelOffsets { fsbase: thread_offset + fsbase_offset, task_signal: signal, signal_live: live, task_pid, task_tgid, task_stack, task_pcount })
}

/// Kernel structure offsets the kernel program needs, from BTF.
#[derive(Debug, Clone, Copy)]
pub struct KernelOffsets {
    /// `task_struct.thread.fsbase`.
    pub fsbase: u64,
    /// `task_struct.signal` (0: unknown).
    pub task_signal: u64,
    /// `signal_struct.live` (0: unknown).
    pub signal_live: u64,
    /// `task_struct.pid` and `task_struct.tgid` (0: unknown).
    pub task_pid: u64,
    pub task_tgid: u64,
    /// `task_struct.stack` (0: unknown; the bounded sampler then sends no native frames).
    pub task_stack: u64,
    /// `task_struct.sched_info.pcount`, a thread's arrivals on a CPU (0: unknown; the
    /// scheduler-switch program is then never paused, see `switch_gate`).
    pub task_pcount: u64,
}

/// Slots of the kernel's process map (`PROCESSES`): registered processes at once. The
/// environment variable `PYPERCH_PROCESS_SLOTS` overrides it (1 to 1,048,576), for hosts with
/// more Python processes, and for tests of a full map.
pub const DEFAULT_PROCESS_SLOTS: u32 = 16384;

fn process_slots() -> u32 {
    std::env::var("PYPERCH_PROCESS_SLOTS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| (1..=1 << 20).contains(n))
        .unwrap_or(DEFAULT_PROCESS_SLOTS)
}

/// How the kernel program walks the frames: the same records either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// `pyperch_sample`: `bpf_loop` callbacks (Linux 5.17+).
    BpfLoop,
    /// `pyperch_sample_bounded` + `pyperch_sample_tail`: bounded loops chained by tail calls,
    /// for kernels without `bpf_loop`.
    Bounded,
}

impl Walk {
    /// The walk for this kernel: `bpf_loop` where the kernel has it (probed by loading a
    /// one-call perf-event program), bounded loops otherwise. `PYPERCH_KERNEL_WALK=bounded`
    /// (or `bpf_loop`) forces one, for tests.
    pub fn for_this_kernel() -> Walk {
        match std::env::var("PYPERCH_KERNEL_WALK").ok().as_deref() {
            Some("bounded") => return Walk::Bounded,
            Some("bpf_loop") => return Walk::BpfLoop,
            _ => {}
        }
        match aya::sys::is_helper_supported(ProgramType::PerfEvent, aya::sys::BpfHelper::BPF_FUNC_loop) {
            Ok(false) => Walk::Bounded,
            // Supported, or the probe itself failed: the bpf_loop program's own load tells.
            _ => Walk::BpfLoop,
        }
    }

    /// The program attached to the perf events.
    fn entry_program(self) -> &'static str {
        match self {
            Walk::BpfLoop => SAMPLE_PROGRAM,
            Walk::Bounded => SAMPLE_BOUNDED_PROGRAM,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Walk::BpfLoop => "bpf_loop",
            Walk::Bounded => "bounded loops",
        }
    }
}

/// The loaded kernel program and its maps.
pub struct KernelProgram {
    ebpf: Ebpf,
    walk: Walk,
    /// Per-task perf events (`attach_tasks`); closing them detaches.
    task_events: Vec<std::os::fd::OwnedFd>,
    registry: Arc<Registry>,
    attached_cpus: usize,
    /// Whether BTF gave `task_struct.pid` and `.tgid` (needed for off-CPU time).
    task_ids_known: bool,
    /// `--native` walked in the kernel: its unwind tables.
    unwind_tables: Option<Arc<crate::kernel::unwind_tables::Tables>>,
    /// With `RUST_LOG`: the kernel programs' aya-log records, until `start_kernel_log`.
    kernel_log: Option<Arc<Mutex<aya_log::EbpfLogger<&'static dyn log::Log>>>>,
    /// The sampled share's divisor (`SAMPLE_SHARE`), until `take_sample_share`.
    sample_share: Option<SampleShare>,
    /// Whether BTF gave `task_struct.sched_info.pcount` (needed to pause the
    /// scheduler-switch program).
    arrivals_known: bool,
    /// The scheduler-switch program's attachment (`attach_off_cpu`).
    switch_gate: Option<Arc<crate::kernel::switch_gate::SwitchGate>>,
}

/// `--max-cpu`'s handle on the kernel's sampled share (`SAMPLE_SHARE`): the CPU samplers
/// keep one sample of a registered process in the divisor written here, at random, and mark
/// each kept sample with it (`sample_flags::WEIGHT_SHIFT`). Usable from any thread.
pub struct SampleShare(aya::maps::Array<MapData, u32>);

impl SampleShare {
    /// Keeps one CPU sample in `divisor` from now on (1: every one).
    pub fn set(&mut self, divisor: u32) -> Result<(), LoadError> {
        self.0.set(profiler_common::share_slot::DIVISOR, divisor.max(1), 0).map_err(|e| LoadError::Load(error_chain(&e)))
    }

    /// The scheduler-switch program's time slices (see `switch_gate`): it is attached one
    /// slice in `slices`, and weighs the switch-outs it walks that many times more;
    /// `share_slot::DRAINING` while it drains before a pause.
    pub fn set_switch_slices(&mut self, slices: u32) -> Result<(), LoadError> {
        self.0.set(profiler_common::share_slot::SWITCH_SLICES, slices.max(1), 0).map_err(|e| LoadError::Load(error_chain(&e)))
    }
}

/// Opens per-task CPU-clock events running the sampling program (see
/// [`KernelProgram::task_attacher`]); holds the program's descriptor number only, which the
/// `KernelProgram` keeps open.
#[derive(Clone, Copy, Debug)]
pub struct TaskAttacher {
    program: std::os::fd::RawFd,
    hz: u64,
}

impl TaskAttacher {
    /// Inheriting events on every thread of `pid` (and so on every thread and child it
    /// creates from now on).
    pub fn open(&self, pid: u32) -> Result<Vec<std::os::fd::OwnedFd>, LoadError> {
        let mut events = Vec::new();
        crate::kernel::thread_events::open_for_process(pid, self.hz, self.program, &mut events)
            .map_err(|e| LoadError::AttachTask { pid, message: e.to_string() })?;
        Ok(events)
    }
}

/// The kernel program's maps that discovery works with: which processes are registered
/// (and with which layout), and the kernel's counters. Shared between the sampling loop and
/// the discovery thread; every operation is one map syscall on an fd that stays open.
pub struct Registry {
    processes: Mutex<BpfHashMap<MapData, u32, ProcessInfo>>,
    counters: PerCpuArray<MapData, u64>,
    /// Whether the process-event programs are attached to the scheduler's tracepoints.
    process_events_attached: AtomicBool,
    /// Slots of `PROCESSES`.
    slots: u32,
    /// Registrations refused because `PROCESSES` was full (each is retried later).
    map_full: AtomicU64,
    /// Registrations handed out (`ProcessInfo::generation`).
    generations: AtomicU32,
    /// The kernel's `REGISTRATION_EPOCH` (slot 0), bumped after every registration: the
    /// scheduler-switch program trusts a per-CPU "not registered" answer only while it is
    /// unchanged (see profiler-ebpf's `switch_filter`).
    registration_epoch: Mutex<aya::maps::Array<MapData, u64>>,
    /// The kernel's `REGISTERED_HINT`: the slot of each registered tgid is set before its
    /// insert into `PROCESSES` (see profiler-ebpf's `switch_filter`).
    registered_hint: Mutex<aya::maps::Array<MapData, u32>>,
    /// The kernel's `TASK_OF_COROUTINE` (`--async`): coroutine → task, per process, filled by
    /// `session::task_index`.
    task_index: Mutex<BpfHashMap<MapData, profiler_common::CoroutineKey, u64>>,
}

/// The kernel program's entry points: one per sample, one per fork or exit, one per exec.
const SAMPLE_PROGRAM: &str = "pyperch_sample";
/// The walk without `bpf_loop`: entry program, and the tail program it chains to through
/// slot 0 of `WALK_PROGRAMS`.
const SAMPLE_BOUNDED_PROGRAM: &str = "pyperch_sample_bounded";
const SAMPLE_TAIL_PROGRAM: &str = "pyperch_sample_tail";
const WALK_PROGRAMS_MAP: &str = "WALK_PROGRAMS";
const PROCESS_EVENT_PROGRAM: &str = "pyperch_process_event";
const PROCESS_EXEC_PROGRAM: &str = "pyperch_process_exec";
const PROCESS_EXIT_PROGRAM: &str = "pyperch_process_exit";
const TRACEPOINT_PROGRAMS: [&str; 3] = [PROCESS_EVENT_PROGRAM, PROCESS_EXEC_PROGRAM, PROCESS_EXIT_PROGRAM];
/// The scheduler-switch program (`--mode wall/off-cpu`), on the `sched_switch` tracepoint.
const SWITCH_PROGRAM: &str = "pyperch_sched_switch";

/// `--kernel` with off-CPU time: the map of kernel stacks where threads blocked, and its
/// number of slots (each 1 KiB: 16 MiB). A stack whose slot holds another one is not kept
/// (counted), so the slots are many more than the distinct blocking stacks of a host.
const OFF_CPU_KERNEL_STACKS: &str = "OFF_CPU_KERNEL_STACKS";
const OFF_CPU_KERNEL_STACK_SLOTS: u32 = 16384;

/// The scheduler-switch program's per-thread map (`OFF_CPU_THREADS`, an LRU map of threads
/// switched out) and its slots in the modes that attach it (each about 2.2 KB: 36 MB).
const OFF_CPU_THREADS: &str = "OFF_CPU_THREADS";
const OFF_CPU_THREAD_SLOTS: u32 = 16384;

/// The scheduler-switch program's slots of threads known to have nothing pending under the
/// sampled share (`RUNNING_THREADS`, 8 bytes each: 128 KiB) in the modes that attach it; the
/// kernel program's `RUNNING_SLOTS` is the same number (it picks a slot by tid modulo it).
const RUNNING_THREADS: &str = "RUNNING_THREADS";
const RUNNING_THREAD_SLOTS: u32 = 16384;

/// The scheduler tracepoints that count changes to the set of processes, and the program
/// attached to each (the exit program also frees the slot of a registered process).
const PROCESS_TRACEPOINTS: [(&str, &str); 3] = [
    ("sched_process_fork", PROCESS_EVENT_PROGRAM),
    ("sched_process_exit", PROCESS_EXIT_PROGRAM),
    ("sched_process_exec", PROCESS_EXEC_PROGRAM),
];

/// How old a CPU's batch of off-CPU records may grow before the kernel sends it
/// (`profiler-ebpf/src/off_cpu_batch.rs`): long enough to gather the records of a busy CPU
/// (about ten at 1,000 switches per second), short beside every period that charges
/// pending waits (a second or more).
const OFF_CPU_BATCH_AGE_NS: u64 = 20_000_000;

/// A value of the kernel map `OFF_CPU_BATCH` (`profiler_common::OffCpuBatch`), as bytes.
type OffCpuBatchBytes = [u8; std::mem::size_of::<profiler_common::OffCpuBatch>()];

/// A value of the kernel map `OFF_CPU_THREADS`, as bytes.
type OffCpuThreadBytes = [u8; profiler_common::OFF_CPU_THREAD_SIZE];

/// The thread's state and its kept record, from an `OFF_CPU_THREADS` value.
fn split_off_cpu_thread(bytes: &OffCpuThreadBytes) -> (profiler_common::ThreadSwitch, &[u8]) {
    // The value's type holds a `ThreadSwitch` and more: the split cannot fail.
    profiler_common::ThreadSwitch::split(bytes).unwrap_or_default()
}

/// Kernel-side counters (summed over CPUs).
#[derive(Debug, Default, Clone, Copy)]
pub struct KernelCounters {
    /// Perf events that hit a registered process and that the sampled share kept.
    pub sampled: u64,
    /// Perf events that hit a registered process and that the sampled share skipped
    /// (`--max-cpu`).
    pub share_skipped: u64,
    /// Switch-outs of registered threads that the sampled share did not walk (`--max-cpu`
    /// in the off-CPU modes).
    pub switch_share_skipped: u64,
    /// Records dropped because the ring buffer was full.
    pub ringbuf_full: u64,
    /// Off-CPU intervals sent / summed as short / whose walked stack was not kept.
    pub off_cpu_intervals: u64,
    pub off_cpu_short: u64,
    pub off_cpu_lost: u64,
    /// Off-CPU intervals dropped at a switch-in: the thread had run unseen since it switched
    /// out (the scheduler-switch program was paused, `--max-cpu`).
    pub off_cpu_end_missed: u64,
    /// `--kernel`: switch-outs whose kernel stack could not be kept (charged without it).
    pub off_cpu_no_kernel_stack: u64,
    /// `--mode gil`: samples dropped as not the GIL's holder / of versions that cannot tell.
    pub not_gil_holder: u64,
    /// `--mode gil`: samples of free-threaded processes running without a GIL.
    pub no_gil: u64,
    pub gil_unknown: u64,
    /// `--mode exception`: samples dropped as not handling an exception / of versions whose
    /// exception state is not known.
    pub not_handling_exception: u64,
    pub exception_unknown: u64,
    /// `--mode exception`: samples dropped because the exception-state chain was longer than
    /// the kernel follows.
    pub exception_chain_too_long: u64,
    /// Code objects whose validation word the walks took from the kernel's per-CPU cache /
    /// read from the target (`profiler_common::code_generation`).
    pub code_checks_cached: u64,
    pub code_checks_read: u64,
    /// Code-object snapshots sent / not made (too large or unreadable).
    pub code_snapshots: u64,
    pub code_snapshots_skipped: u64,
    /// Ring-buffer items that carried a CPU's batch of off-CPU records.
    pub off_cpu_batches: u64,
}

impl KernelProgram {
    /// Loads and verifies the kernel program (not attached yet), without native context.
    pub fn load() -> Result<Self, LoadError> {
        Self::load_with(&crate::time_mode::TimeOptions::default(), crate::target::native::NativeOptions::default())
    }

    /// As [`KernelProgram::load`], for the time mode `time` (off-CPU intervals shorter than
    /// `min_off_cpu` are summed rather than sent; in `--mode gil` only samples of threads
    /// holding the GIL are taken; in `--mode exception` only samples of threads handling an
    /// exception) and with `native` saying what the program records beside the Python frames
    /// (both frozen into the program).
    pub fn load_with(time: &crate::time_mode::TimeOptions, native: crate::target::native::NativeOptions) -> Result<Self, LoadError> {
        let min_off_cpu_ns = u64::try_from(time.min_off_cpu.as_nanos()).unwrap_or(u64::MAX);
        // Batches only where there are off-CPU records: the CPU sampler's check is then free.
        let batch_age_ns = if time.batch_off_cpu && time.mode.off_cpu() { OFF_CPU_BATCH_AGE_NS } else { 0 };
        let gil_only = u64::from(time.mode == crate::time_mode::TimeMode::Gil);
        let exception_only = u64::from(time.mode == crate::time_mode::TimeMode::Exception);
        let stack_bytes = u64::from(native.stack_bytes.min(profiler_common::MAX_NATIVE_STACK_BYTES as u32));
        let kernel_stack = u64::from(native.kernel);
        let walk_in_kernel = stack_bytes != 0 && native.walk == crate::target::native::NativeWalk::Kernel;
        // The walk's maps take memory only when it runs (the row cache: 96 KiB per CPU).
        let (row_slots, unwind_process_slots, row_cache_slots) = if walk_in_kernel {
            (crate::kernel::unwind_tables::ROW_SLOTS, crate::kernel::unwind_tables::PROCESS_SLOTS, ROW_CACHE_SLOTS)
        } else {
            (1, 1, 1)
        };
        let native_walk = u64::from(walk_in_kernel);
        let log_level = kernel_log_level();
        let off_cpu = time.mode.off_cpu();
        let kernel_stack_slots = if native.kernel && off_cpu { OFF_CPU_KERNEL_STACK_SLOTS } else { 1 };
        // The scheduler-switch program's per-thread map is preallocated (36 MB to zero): only
        // the modes that attach it get its slots.
        let off_cpu_thread_slots = if off_cpu { OFF_CPU_THREAD_SLOTS } else { 1 };
        let running_thread_slots = if off_cpu { RUNNING_THREAD_SLOTS } else { 1 };
        let bench_stop = bench_stop_after();
        let offsets = kernel_offsets()?;
        let slots = process_slots();
        // The code-object snapshot's buffer: one entry per possible CPU (by CPU number).
        let possible_cpus = aya::util::nr_cpus().map_err(|(what, e)| LoadError::Cpus(format!("{what}: {e}")))?;
        let possible_cpus = u32::try_from(possible_cpus).unwrap_or(u32::MAX);
        // Kernels >= 5.11 charge BPF memory to the memory cgroup; RLIMIT_MEMLOCK only matters
        // on older ones, and raising it needs CAP_SYS_RESOURCE. Try, and go on either way.
        raise_memlock_limit();
        let mut ebpf = EbpfLoader::new()
            .override_global("TASK_FSBASE_OFFSET", &offsets.fsbase, true)
            .override_global("TASK_SIGNAL_OFFSET", &offsets.task_signal, true)
            .override_global("SIGNAL_LIVE_OFFSET", &offsets.signal_live, true)
            .override_global("MIN_OFF_CPU_NS", &min_off_cpu_ns, true)
            .override_global("OFF_CPU_BATCH_AGE_NS", &batch_age_ns, true)
            .override_global("GIL_ONLY", &gil_only, true)
            .override_global("EXCEPTION_ONLY", &exception_only, true)
            .override_global("TASK_PID_OFFSET", &offsets.task_pid, true)
            .override_global("TASK_TGID_OFFSET", &offsets.task_tgid, true)
            .override_global("TASK_PCOUNT_OFFSET", &offsets.task_pcount, true)
            .override_global("TASK_STACK_OFFSET", &offsets.task_stack, true)
            .override_global("TASK_PT_REGS_OFFSET", &TASK_PT_REGS_OFFSET, true)
            .override_global("NATIVE_STACK_BYTES", &stack_bytes, true)
            .override_global("KERNEL_STACK", &kernel_stack, true)
            .override_global("NATIVE_WALK", &native_walk, true)
            .override_global("AYA_LOG_LEVEL", &log_level, true)
            .map_max_entries(UNWIND_ROWS, row_slots)
            .map_max_entries(UNWIND_PROCESSES, unwind_process_slots)
            .map_max_entries("ROW_CACHE", row_cache_slots)
            .override_global("BENCH_STOP_AFTER", &bench_stop, true)
            .map_max_entries("PROCESSES", slots)
            .map_max_entries(OFF_CPU_KERNEL_STACKS, kernel_stack_slots)
            .map_max_entries(OFF_CPU_THREADS, off_cpu_thread_slots)
            .map_max_entries(RUNNING_THREADS, running_thread_slots)
            .map_max_entries("SNAP_BUFFER", possible_cpus)
            .load(KERNEL_PROGRAM)
            .map_err(|e| LoadError::Load(error_chain(&e)))?;
        let walk = Walk::for_this_kernel();
        // Kernel stacks are recorded by the bpf_loop sampler only; `--native` by both (the
        // bounded sampler walks with a bounded loop and finds the user registers itself).
        if walk == Walk::Bounded && kernel_stack != 0 {
            return Err(LoadError::NeedsBpfLoop { what: "--kernel" });
        }
        let sample: &mut PerfEvent = program_mut(&mut ebpf, walk.entry_program())?;
        sample.load().map_err(|e| LoadError::Load(error_chain(&e)))?;
        if walk == Walk::Bounded {
            load_tail_program(&mut ebpf)?;
        }
        for name in TRACEPOINT_PROGRAMS {
            let program: &mut RawTracePoint = program_mut(&mut ebpf, name)?;
            program.load().map_err(|e| LoadError::Load(error_chain(&e)))?;
        }
        // The scheduler-switch program walks with bpf_loop: only where the kernel has it. It is
        // a BTF tracepoint (its arguments are typed by the kernel's BTF, which wall mode needs
        // anyway for the task's ids). Loaded only in the modes that attach it: its verification
        // is the largest part of start-up (about 0.3 s of CPU on 6.18).
        if walk == Walk::BpfLoop && off_cpu {
            let btf = aya::Btf::from_sys_fs().map_err(|e| LoadError::Btf(error_chain(&e)))?;
            let switch: &mut BtfTracePoint = program_mut(&mut ebpf, SWITCH_PROGRAM)?;
            switch.load("sched_switch", &btf).map_err(|e| LoadError::Load(error_chain(&e)))?;
        }
        let processes = BpfHashMap::try_from(ebpf.take_map("PROCESSES").ok_or(LoadError::MissingMap("PROCESSES"))?)
            .map_err(|e| LoadError::Load(error_chain(&e)))?;
        let counters = PerCpuArray::try_from(ebpf.take_map("COUNTERS").ok_or(LoadError::MissingMap("COUNTERS"))?)
            .map_err(|e| LoadError::Load(error_chain(&e)))?;
        let registration_epoch = aya::maps::Array::try_from(
            ebpf.take_map("REGISTRATION_EPOCH").ok_or(LoadError::MissingMap("REGISTRATION_EPOCH"))?,
        )
        .map_err(|e| LoadError::Load(error_chain(&e)))?;
        let registered_hint = aya::maps::Array::try_from(
            ebpf.take_map("REGISTERED_HINT").ok_or(LoadError::MissingMap("REGISTERED_HINT"))?,
        )
        .map_err(|e| LoadError::Load(error_chain(&e)))?;
        let task_index = BpfHashMap::try_from(ebpf.take_map("TASK_OF_COROUTINE").ok_or(LoadError::MissingMap("TASK_OF_COROUTINE"))?)
            .map_err(|e| LoadError::Load(error_chain(&e)))?;
        // The kernel's records go to `log` (env_logger under RUST_LOG); a failure only loses them.
        let kernel_log = if log_level > 0 {
            match aya_log::EbpfLogger::init(&mut ebpf) {
                Ok(logger) => Some(Arc::new(Mutex::new(logger))),
                Err(e) => {
                    log::warn!("the kernel programs' log records cannot be read: {}", error_chain(&e));
                    None
                }
            }
        } else {
            None
        };
        let sample_share = aya::maps::Array::try_from(ebpf.take_map("SAMPLE_SHARE").ok_or(LoadError::MissingMap("SAMPLE_SHARE"))?)
            .map(SampleShare)
            .map_err(|e| LoadError::Load(error_chain(&e)))?;
        let unwind_tables = if walk_in_kernel { Some(Arc::new(take_unwind_tables(&mut ebpf, row_slots)?)) } else { None };
        let registry = Arc::new(Registry {
            processes: Mutex::new(processes),
            task_index: Mutex::new(task_index),
            counters,
            process_events_attached: AtomicBool::new(false),
            slots,
            map_full: AtomicU64::new(0),
            generations: AtomicU32::new(0),
            registration_epoch: Mutex::new(registration_epoch),
            registered_hint: Mutex::new(registered_hint),
        });
        Ok(Self {
            ebpf,
            walk,
            task_events: Vec::new(),
            registry,
            attached_cpus: 0,
            task_ids_known: offsets.task_pid != 0 && offsets.task_tgid != 0,
            arrivals_known: offsets.task_pcount != 0,
            switch_gate: None,
            unwind_tables,
            kernel_log,
            sample_share: Some(sample_share),
        })
    }

    /// The handle on the sampled share (`--max-cpu`), once.
    pub fn take_sample_share(&mut self) -> Option<SampleShare> {
        self.sample_share.take()
    }

    /// Descriptors of every loaded program (duplicates, owned by the caller), for reading
    /// their run time (`/proc/self/fdinfo`: `run_time_ns`, counted while the kernel's BPF
    /// statistics are on) from another thread.
    pub fn program_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.ebpf
            .programs()
            .filter_map(|(_, program)| program.fd().ok())
            .filter_map(|fd| fd.as_fd().try_clone_to_owned().ok())
            .collect()
    }

    /// Attaches to the CPU clock of every online CPU, sampling at `hz`, and to the scheduler's
    /// process tracepoints (if that fails, discovery lists /proc on every scan instead).
    pub fn attach(&mut self, hz: u64) -> Result<(), LoadError> {
        let attached = self.attach_process_events().is_ok();
        self.registry.process_events_attached.store(attached, Ordering::Relaxed);
        let cpus = aya::util::online_cpus().map_err(|(what, e)| LoadError::Cpus(format!("{what}: {e}")))?;
        let program: &mut PerfEvent = program_mut(&mut self.ebpf, self.walk.entry_program())?;
        for cpu in cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(hz),
                    false,
                )
                .map_err(|e| LoadError::Attach { cpu, message: error_chain(&e) })?;
            self.attached_cpus += 1;
        }
        Ok(())
    }

    /// Attaches the scheduler-switch programs: off-CPU intervals of registered threads are
    /// sent from now on (`--mode wall/off-cpu`).
    /// The program must have been loaded for an off-CPU mode (`load_with`), which alone loads
    /// the scheduler-switch program.
    pub fn attach_off_cpu(&mut self) -> Result<(), LoadError> {
        if self.walk != Walk::BpfLoop {
            return Err(LoadError::NeedsBpfLoop { what: "off-CPU time (--mode wall, --mode off-cpu)" });
        }
        if !self.task_ids_known {
            return Err(LoadError::BtfMissing("task_struct.pid/tgid (needed to measure off-CPU time)"));
        }
        use std::os::fd::AsFd;
        let program: &mut BtfTracePoint = program_mut(&mut self.ebpf, SWITCH_PROGRAM)?;
        let fd = program
            .fd()
            .map_err(|e| LoadError::Load(format!("sched_switch: {}", error_chain(&e))))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| LoadError::Load(format!("sched_switch: {e}")))?;
        let gate = crate::kernel::switch_gate::SwitchGate::new(fd);
        gate.open().map_err(|e| LoadError::Load(format!("sched_switch: {e}")))?;
        self.switch_gate = Some(Arc::new(gate));
        Ok(())
    }

    /// The scheduler-switch program's attachment, once attached, if `--max-cpu` may pause it
    /// (BTF gave the threads' arrivals count, which keeps the waits exact across pauses).
    pub fn pausable_switch_gate(&self) -> Option<Arc<crate::kernel::switch_gate::SwitchGate>> {
        self.switch_gate.clone().filter(|_| self.arrivals_known)
    }

    /// The scheduler-switch program's attachment, once attached.
    pub fn switch_gate(&self) -> Option<&crate::kernel::switch_gate::SwitchGate> {
        self.switch_gate.as_deref()
    }

    /// The scheduler-switch program's per-thread state, read once at the end (after
    /// `detach`): by tid, each thread's pending switch-out and unsent short time
    /// (`ThreadSwitch`), and the record walked at its pending switch-out, if one is pending
    /// (the kernel's `Record`: header, frames, trailer slot).
    pub fn pending_off_cpu(&self) -> Vec<(u32, profiler_common::ThreadSwitch, Option<Vec<u8>>)> {
        let Some(threads) = self.off_cpu_threads() else { return Vec::new() };
        threads
            .iter()
            .filter_map(Result::ok)
            .map(|(tid, bytes)| {
                let (state, record) = split_off_cpu_thread(&bytes);
                let record = (state.switched_out_ns != 0).then(|| record.to_vec());
                (tid, state, record)
            })
            .collect()
    }

    /// Thread `tid`'s scheduler-switch state now (one lookup), for checking that a record
    /// read by [`KernelProgram::pending_off_cpu`] while sampling runs still belongs to the
    /// pending switch-out it was read with.
    pub fn thread_switch(&self, tid: u32) -> Option<profiler_common::ThreadSwitch> {
        let bytes = self.off_cpu_threads()?.get(&tid, 0).ok()?;
        Some(split_off_cpu_thread(&bytes).0)
    }

    /// The off-CPU records left in every CPU's batch (`OFF_CPU_BATCH`), read once at the end
    /// (after `detach`): one run of whole records per CPU that holds any.
    pub fn unsent_off_cpu_batches(&self) -> Vec<Vec<u8>> {
        let Some(map) = self.ebpf.map("OFF_CPU_BATCH") else { return Vec::new() };
        let Ok(batches) = PerCpuArray::<&MapData, OffCpuBatchBytes>::try_from(map) else { return Vec::new() };
        let Ok(values) = batches.get(&0, 0) else { return Vec::new() };
        let records_at = std::mem::offset_of!(profiler_common::OffCpuBatch, bytes);
        values
            .iter()
            .filter_map(|bytes| {
                let len = u32::from_ne_bytes(bytes[..4].try_into().ok()?) as usize;
                let records = bytes.get(records_at..records_at + len.min(profiler_common::OFF_CPU_BATCH_BYTES))?;
                (!records.is_empty()).then(|| records.to_vec())
            })
            .collect()
    }

    /// The scheduler-switch program's per-thread entries (`OFF_CPU_THREADS`), by tid.
    fn off_cpu_threads(&self) -> Option<aya::maps::HashMap<&MapData, u32, OffCpuThreadBytes>> {
        aya::maps::HashMap::try_from(self.ebpf.map(OFF_CPU_THREADS)?).ok()
    }

    /// `--kernel`: the kernel stack that an off-CPU interval's `kernel_stack` names (its id
    /// plus one), return addresses leaf first; `None` when the map has no such stack. A kept
    /// stack is never replaced, so an id names one stack for the whole recording.
    pub fn off_cpu_kernel_stack(&self, kernel_stack: u32) -> Option<Vec<u64>> {
        let id = kernel_stack.checked_sub(1)?;
        let map = aya::maps::StackTraceMap::try_from(self.ebpf.map(OFF_CPU_KERNEL_STACKS)?).ok()?;
        let trace = map.get(&id, 0).ok()?;
        // aya ends a trace at its first zero address.
        Some(trace.frames().iter().map(|f| f.ip).collect())
    }

    /// Attaches to the CPU clock of the given processes only (every thread of each, and the
    /// threads and children they create from now on), sampling at `hz`, instead of every
    /// CPU: the rest of the host is never interrupted. Also attaches the process
    /// tracepoints, as `attach` does.
    pub fn attach_tasks(&mut self, hz: u64, pids: &[u32]) -> Result<(), LoadError> {
        use std::os::fd::{AsFd, AsRawFd};
        let attached = self.attach_process_events().is_ok();
        self.registry.process_events_attached.store(attached, Ordering::Relaxed);
        let program: &mut PerfEvent = program_mut(&mut self.ebpf, self.walk.entry_program())?;
        let fd = program.fd().map_err(|e| LoadError::Load(error_chain(&e)))?.as_fd().as_raw_fd();
        for &pid in pids {
            crate::kernel::thread_events::open_for_process(pid, hz, fd, &mut self.task_events)
                .map_err(|e| LoadError::AttachTask { pid, message: e.to_string() })?;
        }
        Ok(())
    }

    /// What opening per-task events takes, for a command about to be launched: the process
    /// tracepoints are attached here, as `attach_tasks` does, and the events are opened by
    /// [`TaskAttacher::open`] on another thread (while the command waits before its `exec`,
    /// see `launch::spawn_held`), then handed back with [`KernelProgram::adopt_task_events`].
    /// The attacher is valid while this program is loaded.
    pub fn task_attacher(&mut self, hz: u64) -> Result<TaskAttacher, LoadError> {
        use std::os::fd::{AsFd, AsRawFd};
        let attached = self.attach_process_events().is_ok();
        self.registry.process_events_attached.store(attached, Ordering::Relaxed);
        let program: &mut PerfEvent = program_mut(&mut self.ebpf, self.walk.entry_program())?;
        let program = program.fd().map_err(|e| LoadError::Load(error_chain(&e)))?.as_fd().as_raw_fd();
        Ok(TaskAttacher { program, hz })
    }

    /// Keeps events opened by a [`TaskAttacher`]: closed by `detach`, as `attach_tasks`'s.
    pub fn adopt_task_events(&mut self, events: Vec<std::os::fd::OwnedFd>) {
        self.task_events.extend(events);
    }

    /// Perf events opened by `attach_tasks` (one per thread present then).
    pub fn attached_tasks(&self) -> usize {
        self.task_events.len()
    }

    fn attach_process_events(&mut self) -> Result<(), LoadError> {
        for (tracepoint, name) in PROCESS_TRACEPOINTS {
            let program: &mut RawTracePoint = program_mut(&mut self.ebpf, name)?;
            program.attach(tracepoint).map_err(|e| LoadError::Load(error_chain(&e)))?;
        }
        Ok(())
    }

    /// The maps discovery works with, shareable with another thread.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    pub fn register(&self, pid: u32, info: &ProcessInfo) -> Result<(), LoadError> {
        self.registry.register(pid, info)
    }

    pub fn unregister(&self, pid: u32) {
        self.registry.unregister(pid)
    }

    pub fn counters(&self) -> KernelCounters {
        self.registry.counters()
    }

    /// Registrations refused because the kernel's process map was full.
    pub fn map_full(&self) -> u64 {
        self.registry.map_full()
    }

    /// Registered processes whose last thread exited (the kernel freed their slots).
    pub fn registered_exits(&self) -> u64 {
        self.registry.registered_exits()
    }

    /// How the loaded program walks the frames.
    pub fn walk(&self) -> Walk {
        self.walk
    }

    pub fn attached_cpus(&self) -> usize {
        self.attached_cpus
    }

    /// With `RUST_LOG`: a thread that writes the kernel programs' log records (aya-log) to the
    /// log every 100 ms. Started after the privilege drop (which wants one thread); never the
    /// drain thread. Without `RUST_LOG` nothing runs (the programs' log calls are compiled out
    /// by the verifier: their level is frozen at 0).
    pub fn start_kernel_log(&mut self) {
        let Some(logger) = self.kernel_log.clone() else { return };
        let spawned = std::thread::Builder::new().name("pyperch-klog".into()).spawn(move || {
            loop {
                logger.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).flush();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        if let Err(e) = spawned {
            log::warn!("the kernel programs' log records will not be shown: {e}");
        }
    }

    /// The kernel's unwind tables, when `--native` walks in the kernel.
    pub fn unwind_tables(&self) -> Option<Arc<dyn crate::target::native::tables::TableSink>> {
        self.unwind_tables.clone().map(|t| t as Arc<dyn crate::target::native::tables::TableSink>)
    }

    /// Takes the ring buffer the kernel writes samples to.
    pub fn take_ring_buffer(&mut self) -> Result<RingBuf<MapData>, LoadError> {
        let map = self.ebpf.take_map("SAMPLES").ok_or(LoadError::MissingMap("SAMPLES"))?;
        RingBuf::try_from(map).map_err(|e| LoadError::Load(error_chain(&e)))
    }

    /// Detaches from every CPU: no sample is produced after this returns.
    pub fn detach(&mut self) {
        self.task_events.clear();
        // The kernel's last log records (an exit that ended the recording) before the end.
        if let Some(logger) = &self.kernel_log {
            logger.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).flush();
        }
        if let Ok(program) = program_mut::<PerfEvent>(&mut self.ebpf, self.walk.entry_program()) {
            let _ = program.unload();
        }
        for name in TRACEPOINT_PROGRAMS {
            if let Ok(program) = program_mut::<RawTracePoint>(&mut self.ebpf, name) {
                let _ = program.unload();
            }
        }
        if let Some(gate) = &self.switch_gate {
            gate.retire();
        }
        if let Ok(program) = program_mut::<BtfTracePoint>(&mut self.ebpf, SWITCH_PROGRAM) {
            let _ = program.unload();
        }
        self.attached_cpus = 0;
        self.registry.process_events_attached.store(false, Ordering::Relaxed);
    }
}
impl Registry {

    /// How many forks, execs and exits the kernel has seen since `attach`; `None` when that is
    /// not tracked. Only changes matter: an unchanged value means the same set of processes.
    pub fn process_events(&self) -> Option<u64> {
        self.process_events_attached.load(Ordering::Relaxed).then(|| self.counter_sum(counter::PROCESS_EVENTS))
    }

    /// How many registered processes exec'd (and were unregistered by the kernel) since
    /// `attach`; `None` when that is not tracked.
    pub fn registered_execs(&self) -> Option<u64> {
        self.process_events_attached.load(Ordering::Relaxed).then(|| self.counter_sum(counter::REGISTERED_EXECS))
    }

    /// Whether the kernel still samples `pid` (it unregisters processes that exec).
    pub fn is_registered(&self, pid: u32) -> bool {
        self.processes().get(&pid, 0).is_ok()
    }

    /// Tells the kernel to sample `pid` with this layout. A full map is counted in
    /// `map_full` and reported as `LoadError::MapFull` (warned about once), for a later retry.
    pub fn register(&self, pid: u32, info: &ProcessInfo) -> Result<(), LoadError> {
        // Before the insert: the switch program takes a hint of 0 for proof of no registration.
        let hinted = {
            let mut hint = self.registered_hint.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            hint.set(pid % profiler_common::REGISTERED_HINT_SLOTS, 1, 0)
        };
        hinted.map_err(|e| LoadError::Load(format!("registration hint: {}", error_chain(&e))))?;
        let inserted = self.processes().insert(pid, *info, 0);
        match inserted {
            Ok(()) => {
                self.bump_registration_epoch();
                Ok(())
            }
            Err(aya::maps::MapError::SyscallError(e))
                if matches!(e.io_error.raw_os_error(), Some(libc::E2BIG) | Some(libc::ENOSPC) | Some(libc::ENOMEM)) =>
            {
                if self.map_full.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "pyperch: warning: the kernel's process map is full ({} processes); more are registered as others exit (set PYPERCH_PROCESS_SLOTS to raise it)",
                        self.slots
                    );
                }
                Err(LoadError::MapFull { pid, slots: self.slots })
            }
            Err(e) => Err(LoadError::Register { pid, message: error_chain(&e) }),
        }
    }

    /// Tells the scheduler-switch program that a process was registered: its per-CPU "not
    /// registered" answers taken before now are no longer trusted. Called after the insert.
    /// If the write fails the program keeps trusting old answers: a thread of the new process
    /// already on a CPU then misses its first switch-out (its time until it next runs), so
    /// the failure is reported.
    fn bump_registration_epoch(&self) {
        let mut epoch = self.registration_epoch.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let next = epoch.get(&0, 0).unwrap_or(0).wrapping_add(1);
        if let Err(e) = epoch.set(0, next, 0) {
            eprintln!("pyperch: warning: could not update the kernel's registration epoch: {}", error_chain(&e));
        }
    }

    /// Registrations refused because the kernel's process map was full.
    pub fn map_full(&self) -> u64 {
        self.map_full.load(Ordering::Relaxed)
    }

    /// The generation of a new registration (`ProcessInfo::generation`): unique for the
    /// session until 2^32 registrations, never 0 (the kernel's samples carry it, and
    /// userspace attributes a sample only to the registration it was taken under).
    pub fn next_generation(&self) -> u32 {
        loop {
            let g = self.generations.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if g != 0 {
                return g;
            }
        }
    }

    /// Registered processes whose last thread exited (the kernel freed their slots).
    pub fn registered_exits(&self) -> u64 {
        self.counter_sum(counter::REGISTERED_EXITS)
    }

    /// Stops sampling `pid` (it exited, or its PID was reused). Absent pids are fine.
    pub fn unregister(&self, pid: u32) {
        let _ = self.processes().remove(&pid);
    }

    pub fn counters(&self) -> KernelCounters {
        KernelCounters {
            sampled: self.counter_sum(counter::SAMPLED),
            ringbuf_full: self.counter_sum(counter::RINGBUF_FULL),
            off_cpu_intervals: self.counter_sum(counter::OFF_CPU_INTERVALS),
            off_cpu_short: self.counter_sum(counter::OFF_CPU_SHORT),
            off_cpu_lost: self.counter_sum(counter::OFF_CPU_LOST),
            off_cpu_end_missed: self.counter_sum(counter::OFF_CPU_END_MISSED),
            off_cpu_no_kernel_stack: self.counter_sum(counter::OFF_CPU_NO_KERNEL_STACK),
            not_gil_holder: self.counter_sum(counter::NOT_GIL_HOLDER),
            no_gil: self.counter_sum(counter::NO_GIL),
            share_skipped: self.counter_sum(counter::SHARE_SKIPPED),
            switch_share_skipped: self.counter_sum(counter::SWITCH_SHARE_SKIPPED),
            gil_unknown: self.counter_sum(counter::GIL_UNKNOWN),
            not_handling_exception: self.counter_sum(counter::NOT_HANDLING_EXCEPTION),
            exception_unknown: self.counter_sum(counter::EXCEPTION_UNKNOWN),
            exception_chain_too_long: self.counter_sum(counter::EXCEPTION_CHAIN_TOO_LONG),
            code_checks_cached: self.counter_sum(counter::CODE_CHECKS_CACHED),
            code_checks_read: self.counter_sum(counter::CODE_CHECKS_READ),
            code_snapshots: self.counter_sum(counter::CODE_SNAPSHOTS),
            code_snapshots_skipped: self.counter_sum(counter::CODE_SNAPSHOTS_SKIPPED),
            off_cpu_batches: self.counter_sum(counter::OFF_CPU_BATCHES),
        }
    }

    /// One of the kernel program's per-CPU counters, summed over CPUs (0 if unreadable).
    fn counter_sum(&self, index: u32) -> u64 {
        self.counters.get(&index, 0).map(|values| values.iter().copied().sum()).unwrap_or(0)
    }

    /// The registration map; a poisoned lock (a panic elsewhere) still yields the map, whose
    /// state is always consistent (each operation is one syscall).
    fn processes(&self) -> std::sync::MutexGuard<'_, BpfHashMap<MapData, u32, ProcessInfo>> {
        self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells the kernel that task `task` of process `tgid` drives coroutine `coro` (`0`:
    /// forgets the coroutine). Best effort: the map is least-recently-used, and the kernel
    /// uses an entry only after reading that the task drives the coroutine.
    pub fn set_task_of_coroutine(&self, tgid: u32, coro: u64, task: u64) {
        let key = profiler_common::CoroutineKey { tgid, _pad: 0, coro };
        let mut map = self.task_index.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = if task == 0 { map.remove(&key) } else { map.insert(key, task, 0) };
    }

}


/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns` (in `kernel::clock`, which
/// `switch_gate` uses too).
pub use crate::kernel::clock::monotonic_ns;

/// aya-log's level for the kernel programs (`AYA_LOG_LEVEL`: 0 off, 1 error ... 5 trace),
/// from the level `RUST_LOG` set for the log (off without it).
fn kernel_log_level() -> u8 {
    match log::max_level() {
        log::LevelFilter::Off => 0,
        log::LevelFilter::Error => 1,
        log::LevelFilter::Warn => 2,
        log::LevelFilter::Info => 3,
        log::LevelFilter::Debug => 4,
        log::LevelFilter::Trace => 5,
    }
}

/// The native walk's maps: rows (mapped into this process) and processes.
const UNWIND_ROWS: &str = "UNWIND_ROWS";
const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
const UNWIND_GENERATION: &str = "UNWIND_GENERATION";
/// Slots of the kernel walk's per-CPU row cache (`ROW_CACHE` in profiler-ebpf's
/// native_unwind.rs, which indexes it with the same power of two).
const ROW_CACHE_SLOTS: u32 = 4096;

fn take_unwind_tables(ebpf: &mut Ebpf, row_slots: u32) -> Result<crate::kernel::unwind_tables::Tables, LoadError> {
    let processes = BpfHashMap::try_from(ebpf.take_map(UNWIND_PROCESSES).ok_or(LoadError::MissingMap(UNWIND_PROCESSES))?)
        .map_err(|e| LoadError::Load(error_chain(&e)))?;
    let rows = match ebpf.take_map(UNWIND_ROWS).ok_or(LoadError::MissingMap(UNWIND_ROWS))? {
        aya::maps::Map::Array(data) => data,
        _ => return Err(LoadError::Load(format!("{UNWIND_ROWS} is not an array map"))),
    };
    let generation = aya::maps::Array::try_from(ebpf.take_map(UNWIND_GENERATION).ok_or(LoadError::MissingMap(UNWIND_GENERATION))?)
        .map_err(|e| LoadError::Load(error_chain(&e)))?;
    crate::kernel::unwind_tables::Tables::new(&rows, row_slots, processes, generation)
        .map_err(|e| LoadError::Load(format!("cannot map {UNWIND_ROWS} into memory: {e}")))
}

/// Loads `pyperch_sample_tail` and puts it in the slot `pyperch_sample_bounded` tail-calls.
/// The map keeps the program alive for as long as `ebpf` holds the map.
fn load_tail_program(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let tail: &mut PerfEvent = program_mut(ebpf, SAMPLE_TAIL_PROGRAM)?;
    tail.load().map_err(|e| LoadError::Load(error_chain(&e)))?;
    let fd = tail
        .fd()
        .map_err(|e| LoadError::Load(error_chain(&e)))?
        .try_clone()
        .map_err(|e| LoadError::Load(e.to_string()))?;
    let map = ebpf.map_mut(WALK_PROGRAMS_MAP).ok_or(LoadError::MissingMap(WALK_PROGRAMS_MAP))?;
    let mut slots = ProgramArray::try_from(map).map_err(|e| LoadError::Load(error_chain(&e)))?;
    slots.set(0, &fd, 0).map_err(|e| LoadError::Load(error_chain(&e)))
}

/// The kernel program `name`, as its program type.
fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, LoadError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| LoadError::Load(format!("program {name} not found")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| LoadError::Load(error_chain(&e)))
}

fn raise_memlock_limit() {
    let limit = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit reads the struct we pass; failure is harmless (see caller).
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
}

/// An error and its causes on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    // The verifier log is long; keep the first and last lines only.
    if message.lines().count() > 12 {
        let lines: Vec<&str> = message.lines().collect();
        message = format!("{} [...] {}", lines[..4].join(" "), lines[lines.len() - 6..].join(" "));
    }
    message
}
