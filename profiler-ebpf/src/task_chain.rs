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
    helpers::generated,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use profiler_common::{
    CoroutineKey, FrameBytes, FrameEntry, MAX_FULL_FRAMES, MAX_TASK_FRAMES, MAX_TASK_LEVELS, MAX_TASK_SET_SLOTS,
    MAX_TASK_STEPS, ProcessInfo, SET_SLOTS_PER_READ, TASK_INDEX_SLOTS, TASK_NAME_BYTES, TaskChain, TaskLayout,
    record_kind, task_chain_status, task_level_flags,
};

use crate::frame_walk::{read_frame, read_u64};
use crate::maps::output_record;
use crate::sampling::Scratch;

/// What the next step does.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Phase {
    Task = 0,
    Frames = 1,
    Set = 2,
    Creator = 3,
    Done = 4,
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
    /// The level of the task that eagerly started the running one (0: none).
    creator_level: u64,
    /// `Phase::Set`: the slots read by the last step (key, hash).
    keys: [u64; 2 * SET_SLOTS_PER_READ],
    slot: u64,
    live: u64,
    best: u64,
    frame_bytes: FrameBytes,
}

/// Coroutine → the task driving it, per process, as userspace last listed them
/// (`profiler_common::CoroutineKey`).
#[map]
static TASK_OF_COROUTINE: LruHashMap<CoroutineKey, u64> = LruHashMap::with_max_entries(TASK_INDEX_SLOTS, 0);

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
    s.creator_level = 0;
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
        Phase::Creator => creator_step(s, sample, info),
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
    // One read per field: a span read at once would be served through an offset the
    // compiler proves in bounds but older verifiers (6.1) cannot follow.
    let byte = |offset: u32| read_u8(task.wrapping_add(offset as u64)).map(u32::from);
    let word = |offset: u32| read_word(task.wrapping_add(offset as u64));
    // Field by field, each failure ending the read at once (one combined test of six reads
    // made the compiler keep values 6.1's verifier saw as uninitialised on some paths).
    let Some(is_task) = byte(l.task_is_task) else { return finish(s, task_chain_status::UNREADABLE) };
    let Some(ty) = word(l.ob_type) else { return finish(s, task_chain_status::UNREADABLE) };
    let Some(coro) = word(l.task_coro) else { return finish(s, task_chain_status::UNREADABLE) };
    let Some(name) = word(l.task_name) else { return finish(s, task_chain_status::UNREADABLE) };
    let Some(by) = word(l.task_awaited_by) else { return finish(s, task_chain_status::UNREADABLE) };
    let Some(is_set) = byte(l.task_awaited_by_is_set) else { return finish(s, task_chain_status::UNREADABLE) };
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
    entry.flags = 0;
    if let Some(bytes) = s.chain.names.get_mut(level) {
        copy_name(bytes, name);
    }
    s.chain.n_levels = level as u32 + 1;
    s.awaited_by = by;
    s.awaited_by_is_set = is_set as u64;
    if level == 0 || level as u64 == s.creator_level {
        // The running task's own frames are the sample's, and so are those of the task
        // that started it eagerly.
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
    if by == 0 && s.level == 0 {
        // Awaited by no one: the running task may have been started eagerly in another
        // task's step.
        s.phase = Phase::Creator;
        return true;
    }
    if by == 0 {
        return finish(s, task_chain_status::COMPLETE);
    }
    if s.awaited_by_is_set == 0 {
        return to_awaiter(s, by, 1);
    }
    let (Some(mask), Some(table)) = (read_word(by.wrapping_add(l.set_mask as u64)), read_word(by.wrapping_add(l.set_table as u64))) else {
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
    s.keys = [0; 2 * SET_SLOTS_PER_READ];
    // SAFETY: the helper writes at most the size of `keys` into it.
    let ret = unsafe {
        generated::bpf_probe_read_user(
            s.keys.as_mut_ptr() as *mut c_void,
            (16 * SET_SLOTS_PER_READ) as u32,
            s.table.wrapping_add(s.slot * 16) as *const c_void,
        )
    };
    if ret != 0 {
        return finish(s, task_chain_status::UNREADABLE);
    }
    for i in 0..SET_SLOTS_PER_READ {
        let (key, hash) = (s.keys[2 * i], s.keys[2 * i + 1]);
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

/// The u64 at `address`; the buffer is zeroed first, so no path reads it uninitialised (older
/// verifiers refuse that).
#[inline(always)]
fn read_word(address: u64) -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: the helper writes at most 8 bytes into `value`.
    let ret = unsafe { generated::bpf_probe_read_user(&mut value as *mut u64 as *mut c_void, 8, address as *const c_void) };
    (ret == 0).then_some(value)
}

/// The byte at `address`, as [`read_word`].
#[inline(always)]
fn read_u8(address: u64) -> Option<u8> {
    let mut value = 0u8;
    // SAFETY: the helper writes at most 1 byte into `value`.
    let ret = unsafe { generated::bpf_probe_read_user(&mut value as *mut u8 as *mut c_void, 1, address as *const c_void) };
    (ret == 0).then_some(value)
}

/// Whether the object at `object` says it is a task (`task_is_task`).
#[inline(always)]
fn is_task(object: u64, l: &TaskLayout) -> bool {
    read_u8(object.wrapping_add(l.task_is_task as u64)) == Some(1)
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
    let state = read_u8(s.coro.wrapping_add(l.gen_frame_state as u64)).unwrap_or(0) as i8 as i32;
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

/// For a running task awaited by no one: the task whose step started it eagerly, when the
/// sampled frames say so. Its coroutine frame is the outermost of the run of coroutine frames
/// nearest below the running task's; the task driving that coroutine is looked up in
/// `TASK_OF_COROUTINE` and accepted only if it drives it now. Else the chain ends here.
#[inline(always)]
fn creator_step(s: &mut ChainScratch, sample: &Scratch, info: &ProcessInfo) -> bool {
    let l = &info.tasks;
    let running = s.chain.levels[0].coro.wrapping_add(l.gen_iframe as u64);
    let n_full = sample.record.header.n_full as usize;
    let (mut found_running, mut in_run, mut outermost) = (false, false, 0u64);
    for j in 0..MAX_FULL_FRAMES {
        if j >= n_full {
            break;
        }
        let e = &sample.record.frames[j];
        let coroutine = e.owner as u32 == l.owner_generator;
        if !found_running {
            found_running = coroutine && e.frame == running;
        } else if coroutine {
            in_run = true;
            outermost = e.frame;
        } else if in_run {
            break;
        }
    }
    if outermost == 0 {
        return finish(s, task_chain_status::COMPLETE);
    }
    let coro = outermost.wrapping_sub(l.gen_iframe as u64);
    let key = CoroutineKey { tgid: s.chain.header.tgid, _pad: 0, coro };
    // SAFETY: the value is copied out at once.
    let Some(task) = (unsafe { TASK_OF_COROUTINE.get(&key) }).copied() else {
        return finish(s, task_chain_status::COMPLETE);
    };
    if read_u64(task.wrapping_add(l.task_coro as u64)) != coro || !is_task(task, l) {
        return finish(s, task_chain_status::COMPLETE);
    }
    s.chain.levels[0].flags |= task_level_flags::CREATED_EAGERLY;
    s.creator_level = 1;
    to_awaiter(s, task, 0)
}
