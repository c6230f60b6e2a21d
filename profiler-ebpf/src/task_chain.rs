//! `--async`: the running asyncio task's chain, read at sample time (`profiler_common::
//! TaskChain`, whose doc says what is read and the bounds).
//!
//! The read is one `bpf_loop` of at most `MAX_TASK_STEPS` steps over a small state machine:
//! read a task (`Phase::Task`), then, for an awaiting task, its coroutine frames one per step
//! (`Phase::Frames`), then its awaiters: the one pointer, or an awaiter set eight slots per
//! step (`Phase::Set`), choosing the live task of lowest address. The sampled thread is
//! stopped and runs the event loop that owns these tasks, so what is read is one state of
//! the graph. Needs `bpf_loop` (5.17+): on older kernels no chain is read (userspace says so).

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated},
    macros::map,
    maps::PerCpuArray,
};
use profiler_common::{
    FrameBytes, FrameEntry, MAX_TASK_FRAMES, MAX_TASK_LEVELS, MAX_TASK_SET_SLOTS, MAX_TASK_STEPS,
    ProcessInfo, SET_SLOTS_PER_READ, TASK_NAME_BYTES, TaskChain, TaskLayout, record_kind,
    task_chain_status,
};

use crate::frame_walk::{read_frame, read_u64};
use crate::maps::output_record;
use crate::sampling::Scratch;
use crate::target_bytes::TargetBytes;

/// What the next step does.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Phase {
    Task = 0,
    Frames = 1,
    Set = 2,
    Done = 3,
}

/// Per-CPU: the record being built and the read's state.
#[repr(C)]
pub struct ChainScratch {
    chain: TaskChain,
    phase: Phase,
    level: u32,
    /// `Phase::Task`: the task to read.
    task: u64,
    /// The current level's `task_awaited_by` and whether it is a set.
    awaited_by: u64,
    awaited_by_is_set: u64,
    /// `Phase::Frames`: the coroutine whose frame is next, and the type of the level's own.
    coro: u64,
    coro_type: u64,
    /// `Phase::Set`: the table, its slots, the next slot, live tasks so far and the lowest.
    table: u64,
    slots: u64,
    slot: u64,
    live: u64,
    best: u64,
    task_bytes: TargetBytes<{ 256 + 8 }>,
    frame_bytes: FrameBytes,
}

#[map]
static CHAIN_SCRATCH: PerCpuArray<ChainScratch> = PerCpuArray::with_max_entries(1, 0);

/// The `bpf_loop` callback's context.
#[repr(C)]
struct LoopContext {
    chain: *mut ChainScratch,
    sample: *mut Scratch,
    info: *const ProcessInfo,
}

/// Reads and sends the chain of the running task of the sample in `sample` (its header's
/// `running_task`), when the process asked for chains and a task runs. Call after the walk
/// and before sending the sample's record.
#[inline(always)]
pub fn send_chain(info: &ProcessInfo, sample: &mut Scratch) {
    let layout = &info.tasks;
    let task = sample.record.header.running_task;
    if layout.task_read == 0 || task == 0 || task == profiler_common::RUNNING_TASK_UNKNOWN {
        return;
    }
    let Some(s) = CHAIN_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU array value; the programs that use it do not interrupt each other on
    // one CPU (see `sampling::Scratch`).
    let s = unsafe { &mut *s };
    s.chain.header = sample.record.header;
    s.chain.header.kind = record_kind::TASK_CHAIN;
    s.chain.header.n_full = 0;
    s.chain.status = task_chain_status::OVER_BUDGET;
    s.chain.n_levels = 0;
    s.chain.n_frames = 0;
    s.chain.steps = 0;
    s.phase = Phase::Task;
    s.level = 0;
    s.task = task;
    let mut context = LoopContext {
        chain: s as *mut ChainScratch,
        sample: sample as *mut Scratch,
        info: info as *const ProcessInfo,
    };
    // SAFETY: bpf_loop calls the callback with the context, which outlives the call.
    unsafe {
        generated::bpf_loop(
            MAX_TASK_STEPS,
            step_callback as *mut c_void,
            &mut context as *mut LoopContext as *mut c_void,
            0,
        );
    }
    output_record(
        &s.chain as *const TaskChain as *const c_void,
        core::mem::size_of::<TaskChain>(),
    );
}

extern "C" fn step_callback(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `send_chain` passes a live `LoopContext` of per-CPU values and the map value.
    let (s, sample, info) = unsafe {
        let c = &*(context as *const LoopContext);
        (&mut *c.chain, &mut *c.sample, &*c.info)
    };
    s.chain.steps += 1;
    let go_on = match s.phase {
        Phase::Task => task_step(s, &info.tasks),
        Phase::Frames => frame_step(s, sample, info),
        Phase::Set => set_step(s, &info.tasks),
        Phase::Done => false,
    };
    if go_on { 0 } else { 1 }
}

/// Ends the read with `status`.
#[inline(always)]
fn finish(s: &mut ChainScratch, status: u32) -> bool {
    s.chain.status = status;
    s.phase = Phase::Done;
    false
}

/// Reads task `s.task` as level `s.level`. Returns false when the read is over.
#[inline(always)]
fn task_step(s: &mut ChainScratch, l: &TaskLayout) -> bool {
    let level = s.level as usize;
    if level >= MAX_TASK_LEVELS {
        return finish(s, task_chain_status::OVER_BUDGET);
    }
    let task = s.task;
    for i in 0..MAX_TASK_LEVELS {
        if i < level && s.chain.levels[i].task == task {
            return finish(s, task_chain_status::CYCLE);
        }
    }
    if !s.task_bytes.read(task, l.task_read as u64) {
        return finish(s, task_chain_status::UNREADABLE);
    }
    let b = &s.task_bytes;
    let byte = |offset: u32| b.u32_at(task.wrapping_add(offset as u64)).map(|v| v & 0xff);
    let word = |offset: u32| b.u64_at(task.wrapping_add(offset as u64));
    let (Some(is_task), Some(ty), Some(coro), Some(name), Some(by), Some(is_set)) = (
        byte(l.task_is_task),
        word(l.ob_type),
        word(l.task_coro),
        word(l.task_name),
        word(l.task_awaited_by),
        byte(l.task_awaited_by_is_set),
    ) else {
        return finish(s, task_chain_status::UNREADABLE);
    };
    // Subclasses of asyncio.Task are tasks too: the flag, not the type, says so.
    if is_task != 1 || ty == 0 || coro == 0 {
        return finish(s, task_chain_status::UNREADABLE);
    }
    let Some(entry) = s.chain.levels.get_mut(level) else {
        return finish(s, task_chain_status::OVER_BUDGET);
    };
    entry.task = task;
    entry.coro = coro;
    entry.name = name;
    entry.awaiters = 0;
    entry.n_frames = 0;
    if let Some(bytes) = s.chain.names.get_mut(level) {
        copy_name(bytes, name);
    }
    s.chain.n_levels = level as u32 + 1;
    s.awaited_by = by;
    s.awaited_by_is_set = is_set as u64;
    if level == 0 {
        // The running task's own frames are the sample's.
        return next_level(s, l);
    }
    s.coro = coro;
    s.coro_type = read_u64(coro.wrapping_add(l.ob_type as u64));
    s.phase = Phase::Frames;
    true
}

/// The first `TASK_NAME_BYTES` of the object at `name` (fewer when they cross into
/// unreadable memory; zeros when none can be read).
#[inline(always)]
fn copy_name(bytes: &mut [u8; TASK_NAME_BYTES], name: u64) {
    // SAFETY: the helper writes at most the given size into `bytes`.
    let whole = unsafe {
        generated::bpf_probe_read_user(
            bytes.as_mut_ptr() as *mut c_void,
            TASK_NAME_BYTES as u32,
            name as *const c_void,
        )
    };
    if whole == 0 {
        return;
    }
    // The buffer holds an earlier chain's bytes: what is not read now is zeroed, and with
    // nothing read the object's type word reads 0 (userspace then shows no name).
    for i in TASK_NAME_BYTES / 16..TASK_NAME_BYTES / 8 {
        write_word(bytes, i, 0);
    }
    // SAFETY: as above, half the size.
    let half = unsafe {
        generated::bpf_probe_read_user(
            bytes.as_mut_ptr() as *mut c_void,
            (TASK_NAME_BYTES / 2) as u32,
            name as *const c_void,
        )
    };
    if half != 0 {
        for i in 0..TASK_NAME_BYTES / 16 {
            write_word(bytes, i, 0);
        }
    }
}

/// Writes word `i` of `bytes`.
#[inline(always)]
fn write_word(bytes: &mut [u8; TASK_NAME_BYTES], i: usize, value: u64) {
    if let Some(word) = bytes.get_mut(8 * i..8 * i + 8) {
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// After a level's task (and frames): on to the task awaiting it, or the end at a root.
#[inline(always)]
fn next_level(s: &mut ChainScratch, l: &TaskLayout) -> bool {
    let by = s.awaited_by;
    if by == 0 {
        return finish(s, task_chain_status::COMPLETE);
    }
    if s.awaited_by_is_set == 0 {
        return to_awaiter(s, by, 1);
    }
    // SAFETY: bpf_probe_read_user tolerates any address.
    let (Ok(mask), Ok(table)) = (unsafe {
        (
            bpf_probe_read_user((by + l.set_mask as u64) as *const u64),
            bpf_probe_read_user((by + l.set_table as u64) as *const u64),
        )
    }) else {
        return finish(s, task_chain_status::UNREADABLE);
    };
    let slots = mask.wrapping_add(1);
    if slots > MAX_TASK_SET_SLOTS {
        return finish(s, task_chain_status::OVER_BUDGET);
    }
    if slots < SET_SLOTS_PER_READ as u64 || slots % SET_SLOTS_PER_READ as u64 != 0 || table == 0 {
        return finish(s, task_chain_status::UNREADABLE);
    }
    s.table = table;
    s.slots = slots;
    s.slot = 0;
    s.live = 0;
    s.best = 0;
    s.phase = Phase::Set;
    true
}

/// The current level is awaited by `awaiters` live tasks, `task` the one followed.
#[inline(always)]
fn to_awaiter(s: &mut ChainScratch, task: u64, awaiters: u32) -> bool {
    if let Some(entry) = s.chain.levels.get_mut(s.level as usize) {
        entry.awaiters = awaiters;
    }
    s.level += 1;
    s.task = task;
    s.phase = Phase::Task;
    true
}

/// Reads eight slots of the awaiter set: live entries whose key is a task.
#[inline(always)]
fn set_step(s: &mut ChainScratch, l: &TaskLayout) -> bool {
    // SAFETY: bpf_probe_read_user tolerates any address.
    let Ok(keys) = (unsafe {
        bpf_probe_read_user((s.table + s.slot * 16) as *const [u64; 2 * SET_SLOTS_PER_READ])
    }) else {
        return finish(s, task_chain_status::UNREADABLE);
    };
    for i in 0..SET_SLOTS_PER_READ {
        let (key, hash) = (keys[2 * i], keys[2 * i + 1]);
        // A deleted entry keeps the set's dummy key with hash -1.
        if key != 0 && hash != u64::MAX && is_task(key, l) {
            s.live += 1;
            if s.best == 0 || key < s.best {
                s.best = key;
            }
        }
    }
    s.slot += SET_SLOTS_PER_READ as u64;
    if s.slot < s.slots {
        return true;
    }
    if s.live == 0 {
        // Every awaiter is gone: a root now.
        return finish(s, task_chain_status::COMPLETE);
    }
    let (best, live) = (s.best, s.live as u32);
    to_awaiter(s, best, live)
}

/// Whether the object at `object` says it is a task (`task_is_task`).
#[inline(always)]
fn is_task(object: u64, l: &TaskLayout) -> bool {
    // SAFETY: bpf_probe_read_user tolerates any address.
    unsafe { bpf_probe_read_user(object.wrapping_add(l.task_is_task as u64) as *const u8) }.is_ok_and(|b| b == 1)
}

/// Reads the frame of coroutine `s.coro`, one of the current (awaiting) level's; follows the
/// coroutine it awaits, if suspended in `await` on one of the same type.
#[inline(always)]
fn frame_step(s: &mut ChainScratch, sample: &mut Scratch, info: &ProcessInfo) -> bool {
    let l = &info.tasks;
    let n = s.chain.n_frames as usize;
    if n >= MAX_TASK_FRAMES {
        return finish(s, task_chain_status::OVER_BUDGET);
    }
    let frame = s.coro.wrapping_add(l.gen_iframe as u64);
    let mut entry = FrameEntry::default();
    if read_frame(&info.frame, frame, &mut s.frame_bytes, &mut entry).is_none() {
        return finish(s, task_chain_status::UNREADABLE);
    }
    let read_before = sample.walk.checks_read;
    entry.check = sample.code_check_of(&entry);
    if sample.walk.checks_read != read_before {
        let h = &s.chain.header;
        crate::code_snapshot::ensure_sent(
            &info.frame,
            h.tgid,
            h.generation,
            h.time_ns,
            entry.code,
            entry.check,
        );
    }
    if let Some(slot) = s.chain.frames.get_mut(n) {
        *slot = entry;
    }
    s.chain.n_frames = n as u32 + 1;
    if let Some(level) = s.chain.levels.get_mut(s.level as usize) {
        level.n_frames += 1;
    }
    // SAFETY: bpf_probe_read_user tolerates any address.
    let state =
        unsafe { bpf_probe_read_user(s.coro.wrapping_add(l.gen_frame_state as u64) as *const i8) }
            .unwrap_or(0) as i32;
    if state != l.suspended_state_a && state != l.suspended_state_b {
        return next_level(s, l);
    }
    let sp = read_u64(frame.wrapping_add(l.frame_stackpointer as u64));
    let awaited = read_u64(sp.wrapping_sub(8 * l.awaited_slot as u64)) & info.frame.code_mask;
    if sp == 0 || awaited == 0 || read_u64(awaited.wrapping_add(l.ob_type as u64)) != s.coro_type {
        return next_level(s, l);
    }
    s.coro = awaited;
    true
}
