//! The sampling program: on every CPU-clock perf event, for a thread of a registered process,
//! finds its `PyThreadState`, walks the interpreter frames from the current one towards the
//! bottom, and writes one record (header, leading frames in full, the rest hashed).
//!
//! The walk itself ([`walk_current_stack`]) is shared with the scheduler-switch program
//! (`sched_switch`), which walks a thread as it leaves a CPU.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_user, generated},
    macros::{map, perf_event},
    maps::PerCpuArray,
    programs::PerfEventContext,
};
use profiler_common::{
    FrameBytes, FrameEntry, FrameLayout, HASH_SEED, MAX_FULL_FRAMES, MAX_HASHED_FRAMES, NO_FIELD, ProcessInfo,
    SampleHeader, bench_stop, code_generation, counter, frame_hash, record_kind, sample_flags, sample_status,
};

use crate::frame_walk::{CheckCache, FrameBlock, FrameBlocks, WalkState, read_frame_blocked, walk_code_check};
use crate::gil::GilAddressCache;
use crate::interp_window::InterpWindow;
use crate::maps::{PROCESSES, add, bump, share_keeps};
use crate::thread_state::{
    TstateBytes, current_fsbase_btf, find_thread_state_into, interpreter_of_with, running_task_of,
    several_interpreters_and_next_id,
};

/// A ring-buffer record: the header, up to `MAX_FULL_FRAMES` frames, and one more slot for a
/// kind-specific trailer written right after the last full frame (`record_kind::OFF_CPU`).
#[repr(C)]
pub struct Record {
    pub header: SampleHeader,
    pub frames: [FrameEntry; MAX_FULL_FRAMES + 1],
}

/// Per-CPU scratch space: the record being built and the bytes of the frame being read.
/// Shared by the sampling and the scheduler-switch programs: both run with interrupts off on
/// their CPU (the CPU-clock perf event's hrtimer handler, and `sched_switch` inside
/// `__schedule` with the run queue locked), so neither interrupts the other on one CPU.
#[repr(C)]
pub struct Scratch {
    pub record: Record,
    layout: FrameLayout,
    pub(crate) walk: WalkState,
    frame: FrameBytes,
    /// The check window of the frame's code object (see `code_check`).
    code: FrameBytes,
    /// Frame bytes read at once during this walk (`frame_walk::read_frame_blocked`).
    blocks: FrameBlocks,
    /// Heap bytes around code objects read at once during this walk (`frame_code_check`).
    code_block: FrameBlock,
    /// The first bytes of the walked thread's state, read once by the lookup.
    pub tstate_bytes: TstateBytes,
    /// The interpreter fields a CPU sample reads, when close together (read once per walk).
    interp_window: InterpWindow,
    /// Validation words of code objects checked by earlier walks on this CPU (kept across
    /// walks, unlike the blocks).
    checks: CheckCache,
    /// `_PyRuntime.interpreters.next_id` as this walk read it (0: not read).
    pub next_interpreter_id: u64,
    /// GIL addresses read by earlier switch-outs on this CPU (kept across walks).
    pub gils: GilAddressCache,
}

impl Scratch {
    /// The validation word of `entry`'s code object, computed as the walk computes its
    /// frames' (with its caches), for frames read after the walk (`task_chain`).
    #[inline(always)]
    pub(crate) fn code_check_of(&mut self, entry: &FrameEntry) -> u32 {
        walk_code_check(&self.layout, entry, &mut self.code, &mut self.code_block, &mut self.walk, &mut self.checks)
    }
}

#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Test-only: `profiler_common::bench_stop`, frozen at load time (0 in every normal run).
#[unsafe(no_mangle)]
static BENCH_STOP_AFTER: u64 = 0;

#[perf_event]
pub fn pyperch_sample(ctx: PerfEventContext) -> u32 {
    // Off-CPU records this CPU gathered go out within a sampling period (`off_cpu_batch`).
    crate::off_cpu_batch::send_if_old();
    let Some((info, tgid, tid, weight)) = wanted_sample(false) else {
        return 0;
    };
    // SAFETY: a plain read of a global the loader froze.
    let stop = unsafe { core::ptr::read_volatile(&BENCH_STOP_AFTER) };
    if stop == bench_stop::REGISTRATION {
        return 0;
    }
    if let Some((scratch, n_full)) = walk_stages(info, tgid, tid, record_kind::CPU_SAMPLE, stop) {
        set_weight(scratch, weight);
        if stop == bench_stop::NONE {
            crate::task_chain::send_chain(info, scratch);
            emit_sample::<false>(&ctx, scratch, n_full);
        }
    }
    0
}

/// The start of every sampling program: the running thread's process registration, tgid and
/// tid, and the sample's weight (the sampled share's divisor, `maps::share_keeps`), when its
/// process is registered, the sampled share keeps this sample (counted `SAMPLED` from there)
/// and the mode wants this thread's sample (`--mode gil`, `--mode exception`); `None`
/// otherwise (the early exit for the rest of the host is the one map lookup). `bounded`: the
/// calling program may not use `bpf_loop`.
#[inline(always)]
pub(crate) fn wanted_sample(bounded: bool) -> Option<(&'static ProcessInfo, u32, u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // SAFETY: the map value is only read, and the kernel keeps it alive for this run.
    let info = unsafe { PROCESSES.get(&tgid) }?;
    let weight = share_keeps()?;
    bump(counter::SAMPLED);
    if !crate::gil::sample_wanted(info, tid) || !crate::exception::sample_wanted(info, tid, bounded) {
        return None;
    }
    Some((info, tgid, tid, weight))
}

/// Writes a CPU sample's weight into its header's flags (`sample_flags::WEIGHT_SHIFT`), after
/// `start_walk` cleared them.
#[inline(always)]
pub(crate) fn set_weight(scratch: &mut Scratch, weight: u32) {
    let w = if weight > sample_flags::MAX_WEIGHT { sample_flags::MAX_WEIGHT } else { weight };
    scratch.record.header.flags |= w << sample_flags::WEIGHT_SHIFT;
}

/// Walks the Python stack of the running thread `tid` of process `tgid` into this CPU's
/// scratch record: fills the header (with `kind`) and the full frames. Returns the scratch and
/// the number of full frames for the caller to send (see [`emit_sample`]); `None` only if the
/// per-CPU scratch is unavailable. The running thread's memory must be the current one.
/// Needs `bpf_loop` (5.17+); `sampling_bounded` drives the same steps without it.
pub fn walk_current_stack(info: &ProcessInfo, tgid: u32, tid: u32, kind: u32) -> Option<(&'static mut Scratch, usize)> {
    walk_stages(info, tgid, tid, kind, bench_stop::NONE)
}

/// [`walk_current_stack`], ending after the part `stop` (`bench_stop`, test-only; `None`
/// then, nothing to send).
#[inline(always)]
fn walk_stages(info: &ProcessInfo, tgid: u32, tid: u32, kind: u32, stop: u64) -> Option<(&'static mut Scratch, usize)> {
    let scratch = scratch_mut()?;
    let pid_tgid = ((tgid as u64) << 32) | tid as u64;
    if !start_walk(info, pid_tgid, kind, current_fsbase_btf(), scratch) {
        return Some((scratch, 0));
    }
    if stop == bench_stop::THREAD_STATE {
        return None;
    }
    // The callbacks get this CPU's scratch through the loop's context (a pointer on our
    // stack), not from a map lookup per frame.
    let mut context = LoopContext { scratch: scratch as *mut Scratch };
    let context_ptr = &mut context as *mut LoopContext as *mut c_void;
    // SAFETY: bpf_loop calls the callback with `context_ptr`, which outlives the call.
    unsafe {
        generated::bpf_loop(MAX_FULL_FRAMES as u32, full_frame_loop_step as *mut c_void, context_ptr, 0);
    }
    if stop == bench_stop::FULL_FRAMES {
        return None;
    }
    let scratch = scratch_mut()?;
    if start_tail(scratch) {
        // SAFETY: as above.
        unsafe {
            generated::bpf_loop(MAX_HASHED_FRAMES as u32, hashed_frame_loop_step as *mut c_void, context_ptr, 0);
        }
    }
    let scratch = scratch_mut()?;
    let n_full = finish_walk(scratch);
    if stop == bench_stop::TAIL {
        return None;
    }
    Some((scratch, n_full))
}

/// Fills the header and finds the first frame of the running thread (`pid_tgid` as
/// `bpf_get_current_pid_tgid` gives it: tgid above, tid below), whose thread pointer is
/// `fsbase`. Returns true when the walk is set up in
/// `scratch.walk`; false when the sample ended early (no thread state, no frame): the header
/// then says why and the record has no frames.
pub(crate) fn start_walk(info: &ProcessInfo, pid_tgid: u64, kind: u32, fsbase: u64, scratch: &mut Scratch) -> bool {
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let header = &mut scratch.record.header;
    header.generation = info.generation;
    header.kind = kind;
    header.time_ns = unsafe { bpf_ktime_get_ns() };
    header.tgid = tgid;
    header.tid = tid;
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.n_full = 0;
    header.n_hashed = 0;
    header.tail_first = 0;
    header.tail_hash = 0;
    header.thread_state = 0;
    header.interpreter = 0;
    header.running_task = profiler_common::RUNNING_TASK_UNKNOWN;
    header.flags = 0;
    header.tlbc_generation = 0;

    // Read once (one helper call) for the lookup, the header and the check cache's key.
    let (several, next_interpreter_id) = several_interpreters_and_next_id(info);
    scratch.next_interpreter_id = next_interpreter_id;
    let bytes = &mut scratch.tstate_bytes;
    let tstate = find_thread_state_into(info, tid, fsbase, several, bytes);
    if tstate == 0 {
        header.status = sample_status::NO_THREAD_STATE;
        return false;
    }
    header.thread_state = tstate;
    header.interpreter = interpreter_of_with(info, tstate, several, bytes);
    header.running_task = running_task_of(info, tstate, bytes);
    scratch.interp_window.clear();
    if kind != record_kind::OFF_CPU {
        // The collector's flag and (3.14+) the code-object generation, read at once when close.
        if several.is_none() && info.tstate_interp != NO_FIELD {
            scratch.interp_window.fill(info, scratch.tstate_bytes.field(tstate, info.tstate_interp));
        }
        if crate::gc::collecting(info, tstate, &scratch.tstate_bytes, &scratch.interp_window) {
            header.flags |= sample_flags::GC;
        }
    }
    if info.tlbc_generation != 0 && info.tstate_interp != NO_FIELD {
        // Free-threaded builds: which threads' bytecode copies the frames' indices name.
        let interp = scratch.tstate_bytes.field(tstate, info.tstate_interp);
        if interp != 0 {
            let at = interp.wrapping_add(info.tlbc_generation as u64);
            header.tlbc_generation = scratch.interp_window.u32_at(at).unwrap_or(0);
        }
    }
    let bytes = &scratch.tstate_bytes;
    let mut frame = bytes.field(tstate, info.thread.frame);
    scratch.blocks.clear();
    if frame != 0 && info.thread.cframe_frame != NO_FIELD {
        frame = scratch.blocks.u64_around(frame.wrapping_add(info.thread.cframe_frame as u64));
    }
    if frame == 0 {
        header.status = sample_status::NO_FRAME;
        return false;
    }

    let cache_ok = match code_generation(info, tstate, several, &scratch.tstate_bytes, &scratch.interp_window) {
        Some(counter) => {
            scratch.checks.begin(tgid, info.generation, counter, next_interpreter_id);
            1
        }
        None => 0,
    };
    scratch.layout = info.frame;
    scratch.code_block.len = 0;
    scratch.walk = WalkState {
        frame,
        hash: HASH_SEED,
        n_full: 0,
        n_hashed: 0,
        status: sample_status::TRUNCATED,
        last_check: 0,
        cache_ok,
        last_code: 0,
        checks_cached: 0,
        checks_read: 0,
    };
    true
}

/// The process's code-generation counter now (`ProcessInfo::code_generation_kind`), or
/// `None` when it has none that proves anything: unknown, unreadable, exhausted (3.12's
/// creation counter stops at 0), or a deallocation counter of one interpreter in a process
/// that has several (code objects freed in another would not move it). With that counter the
/// cache is also keyed by the next interpreter id: a subinterpreter created and gone between
/// two walks (whose threads could have freed a code object) changes it.
#[inline(always)]
fn code_generation(
    info: &ProcessInfo,
    tstate: u64,
    several: Option<u64>,
    bytes: &TstateBytes,
    window: &InterpWindow,
) -> Option<u64> {
    match info.code_generation_kind {
        code_generation::CREATED_AT => {
            // SAFETY: bpf_probe_read_user tolerates any address.
            let counter = unsafe { bpf_probe_read_user(info.code_generation_at as *const u32) }.ok()?;
            (counter != 0).then_some(counter as u64)
        }
        code_generation::FREED_IN_INTERP if several.is_none() && info.tstate_interp != NO_FIELD => {
            let interp = bytes.field(tstate, info.tstate_interp);
            if interp == 0 {
                return None;
            }
            window.u64_at(interp.wrapping_add(info.code_generation_at))
        }
        _ => None,
    }
}

/// After the full frames: whether frames remain below them (then the hashed walk starts at
/// `tail_first`).
pub(crate) fn start_tail(scratch: &mut Scratch) -> bool {
    if scratch.walk.status == sample_status::TRUNCATED && scratch.walk.frame != 0 {
        scratch.record.header.tail_first = scratch.walk.frame;
        return true;
    }
    false
}

/// Ends the walk: the status (a walk that stopped at a frame still to read was truncated),
/// the counts and the tail hash go into the header. Returns the number of full frames.
pub(crate) fn finish_walk(scratch: &mut Scratch) -> usize {
    let walk = scratch.walk;
    let header = &mut scratch.record.header;
    header.status = if walk.status == sample_status::TRUNCATED && walk.frame == 0 {
        sample_status::COMPLETE
    } else {
        walk.status
    };
    header.n_full = walk.n_full;
    header.n_hashed = walk.n_hashed;
    header.tail_hash = walk.hash;
    if walk.checks_cached != 0 {
        add(counter::CODE_CHECKS_CACHED, walk.checks_cached as u64);
    }
    if walk.checks_read != 0 {
        add(counter::CODE_CHECKS_READ, walk.checks_read as u64);
    }
    walk.n_full as usize
}

pub fn scratch_mut() -> Option<&'static mut Scratch> {
    // SAFETY: a per-CPU array value; this program does not run reentrantly on one CPU.
    SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The `bpf_loop` callbacks' context: this CPU's scratch value (never null).
#[repr(C)]
struct LoopContext {
    scratch: *mut Scratch,
}

/// bpf_loop callback: [`full_frame_on`] with the scratch from the context.
extern "C" fn full_frame_loop_step(index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `walk_stages` passes a live `LoopContext` holding this CPU's scratch value.
    let s = unsafe { &mut *(*(context as *mut LoopContext)).scratch };
    full_frame_on(s, index)
}

/// bpf_loop callback: [`hashed_frame_on`] with the scratch from the context.
extern "C" fn hashed_frame_loop_step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: as in `full_frame_loop_step`.
    let s = unsafe { &mut *(*(context as *mut LoopContext)).scratch };
    hashed_frame_on(s)
}

/// One full frame with this CPU's scratch looked up (for `sampling_bounded`). Returns 1 to stop.
pub(crate) fn full_frame_step(index: u64) -> i64 {
    let Some(s) = scratch_mut() else { return 1 };
    full_frame_on(s, index)
}

/// One hashed frame with this CPU's scratch looked up (for `sampling_bounded`).
pub(crate) fn hashed_frame_step() -> i64 {
    let Some(s) = scratch_mut() else { return 1 };
    hashed_frame_on(s)
}

/// Reads frame `index` into the record. Returns 1 to stop.
#[inline(always)]
fn full_frame_on(s: &mut Scratch, index: u64) -> i64 {
    if s.walk.frame == 0 {
        s.walk.status = sample_status::COMPLETE;
        return 1;
    }
    let i = index as usize;
    if i >= MAX_FULL_FRAMES {
        return 1;
    }
    let entry = &mut s.record.frames[i];
    let Some(previous) = read_frame_blocked(&s.layout, s.walk.frame, &mut s.blocks, &mut s.frame, entry) else {
        s.walk.status = sample_status::READ_FAULT;
        return 1;
    };
    let read_before = s.walk.checks_read;
    entry.check = walk_code_check(&s.layout, entry, &mut s.code, &mut s.code_block, &mut s.walk, &mut s.checks);
    if s.walk.checks_read != read_before {
        let (code, check) = (entry.code, entry.check);
        let header = &s.record.header;
        crate::code_snapshot::ensure_sent(&s.layout, header.tgid, header.generation, header.time_ns, code, check);
    }
    s.walk.n_full = i as u32 + 1;
    s.walk.frame = previous;
    0
}

/// Reads one frame below the full ones and folds it into the tail hash. Returns 1 to stop.
#[inline(always)]
fn hashed_frame_on(s: &mut Scratch) -> i64 {
    if s.walk.frame == 0 {
        s.walk.status = sample_status::COMPLETE;
        return 1;
    }
    let mut entry = FrameEntry::default();
    let Some(previous) = read_frame_blocked(&s.layout, s.walk.frame, &mut s.blocks, &mut s.frame, &mut entry) else {
        s.walk.status = sample_status::READ_FAULT;
        return 1;
    };
    entry.check = walk_code_check(&s.layout, &entry, &mut s.code, &mut s.code_block, &mut s.walk, &mut s.checks);
    s.walk.hash = frame_hash(s.walk.hash, &entry);
    s.walk.n_hashed += 1;
    s.walk.frame = previous;
    0
}

/// Sends a CPU sample: the header and the first `n_full` frames, with native context when
/// `--native` / `--kernel` ask for it (`native_stack`). `BOUNDED`: from the sampler without
/// `bpf_loop` (`sampling_bounded`).
pub(crate) fn emit_sample<const BOUNDED: bool>(ctx: &PerfEventContext, scratch: &Scratch, n_full: usize) {
    crate::native_stack::emit::<BOUNDED>(ctx, &scratch.record as *const Record as *const c_void, record_len(n_full, 0));
}

/// Bytes of a record with the header, `n_full` frames (at most `MAX_FULL_FRAMES`) and
/// `trailer_slots` (0 or 1) slots after them: never more than the size of `Record`.
#[inline(always)]
pub(crate) fn record_len(n_full: usize, trailer_slots: usize) -> usize {
    let n = if n_full > MAX_FULL_FRAMES { MAX_FULL_FRAMES } else { n_full };
    let n = n + if trailer_slots > 0 { 1 } else { 0 };
    let len = core::mem::size_of::<SampleHeader>() + n * core::mem::size_of::<FrameEntry>();
    if len > core::mem::size_of::<Record>() { core::mem::size_of::<Record>() } else { len }
}
