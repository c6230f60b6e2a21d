//! The scheduler-switch program (`--mode wall` and `--mode off-cpu`): exact off-CPU time.
//!
//! Attached to the `sched_switch` tracepoint, which runs in the context of the thread leaving
//! the CPU (`prev`, still `current`, its memory still mapped) and names the one coming in:
//! - `prev` of a registered process: its Python stack is walked now, with the sampling
//!   program's walk, and kept in its `OFF_CPU_THREADS` entry with the time and the reason (preempted
//!   while runnable: `preempt` or `prev_state == TASK_RUNNING`; otherwise asleep, and asleep
//!   waiting for the GIL when `gil::waiting_for_gil` says so). The stack cannot change while
//!   the thread is off a CPU, so it is the stack of the whole interval. With `--kernel`, the
//!   kernel stack where it left (`OFF_CPU_KERNEL_STACKS`) goes with it, by id.
//! - `next` of a registered process with a pending switch-out: the interval ends now; its
//!   length is written into the kept record, which is sent (through this CPU's batch,
//!   `off_cpu_batch`). Intervals shorter than
//!   `MIN_OFF_CPU_NS` are not sent; their time is summed in the thread's entry and sent with
//!   the thread's next record, so no time is lost. At the end userspace reads the entries:
//!   what is left, and the kept records of threads still switched out, charged up to the end.
//! - `next` of a registered process with no entry for its registration (it was already
//!   switched out when its process was registered): the time of this first switch-in is
//!   noted (`ThreadSwitch::first_in_ns`); userspace charges the wait before it, with the stack
//!   it read while the thread was still off (`blocked_at_start` in profiler-user).
//!
//! Why not walk on the way back in: that needs a hook in the incoming thread's context
//! (`finish_task_switch`), and kernels without kprobes (`CONFIG_KPROBES=n`, as on this 6.18
//! build) or where it is a compiler clone (`finish_task_switch.isra.0`, no fentry) have none.
//!
//! `--max-cpu` (`maps::SAMPLE_SHARE` holds a divisor `d` above 1): only one switch-out of a
//! registered thread in `d`, at random, is walked, and its record carries `d` in its flags
//! (`sample_flags::WEIGHT_SHIFT`, set on the kept record, so the weight is the one its choice
//! was made with even if the divisor changes before the switch-in). A switch-out not chosen
//! costs no walk: the thread is noted running (`note_running`) and its interval is not sent,
//! so the chosen intervals, each counted `d` times by userspace, stand for all of them: the
//! choice is made before the interval's length is known, so the expected off-CPU time per
//! stack is the true one. A chosen interval shorter than `MIN_OFF_CPU_NS` adds its length
//! times its weight to the thread's short time, which is therefore kept weighted.
//! What is left per switch not walked is made small too (`RUNNING_THREADS`): a thread known
//! to have nothing pending costs no lookup of its entry, at its switch-out (nor of its
//! process, whose generation `switch_filter` kept) or at its switch-in.
//!
//! Pauses (`--max-cpu`, when even the program's call on every switch is over the budget):
//! userspace detaches the program between time slices (`profiler-user`'s
//! `kernel::switch_gate`), and `maps::switch_share_draw` weighs a walked switch-out by the
//! slices too, and walks none while the program drains before a pause. A switch-out keeps
//! its thread's arrivals count (`sched_info.pcount`, [`arrivals`]); a switch-in ends the
//! pending interval only if the count is unchanged, that is if the thread did not run unseen
//! in between: otherwise its true end fell in a pause, and the interval is dropped
//! (`counter::OFF_CPU_END_MISSED`), never charged with time the thread ran.
//!
//! For threads of unregistered processes the program costs one read of a small array of
//! registration hints (`switch_filter::REGISTERED_HINT`) for `next` (after two loads of its
//! ids), and a `PROCESSES` lookup only when the hint cannot rule it out: whether `prev` is
//! registered was decided when it came in (`switch_filter`).

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, LruHashMap, PerCpuArray, StackTrace},
    programs::{BtfTracePointContext, tracing::StackIdContext},
};
use profiler_common::{
    FrameEntry, MAX_FULL_FRAMES, OffCpuInterval, ThreadSwitch, counter,
    off_cpu_reason, record_kind, sample_flags,
};

use crate::gil::waiting_for_gil;
use crate::maps::{PROCESSES, bump, switch_share_draw};
use crate::switch_filter::{NO_GENERATION, prev_generation};
use crate::off_cpu_batch::send_off_cpu_record;
use crate::native_stack::kernel_stacks_wanted;
use crate::switch_filter;
use crate::sampling::{Record, record_len, set_weight, walk_current_stack};

/// Intervals shorter than this (nanoseconds) are summed, not sent. Set at load time.
#[unsafe(no_mangle)]
static MIN_OFF_CPU_NS: u64 = 0;
/// The longest short interval weighted exactly: `u64::MAX / MAX_WEIGHT`, so that its length
/// times its weight fits in a u64.
const MAX_WEIGHTED_NS: u64 = u64::MAX / sample_flags::MAX_WEIGHT as u64;
/// Offsets of `task_struct.pid` and `task_struct.tgid`, from BTF (the verifier checks the
/// loads at them against the kernel's BTF too).
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u64 = 0;
/// Offset of `task_struct.sched_info.pcount` (the thread's arrivals on a CPU), from BTF; 0
/// when unknown (then a switch-in is not checked against the arrivals, and userspace never
/// pauses the program).
#[unsafe(no_mangle)]
static TASK_PCOUNT_OFFSET: u64 = 0;

/// Thread `task`'s arrivals on a CPU (`sched_info.pcount`), 0 when the offset is unknown.
/// At `sched_switch` the incoming thread's count does not include this arrival yet (the
/// scheduler counts it after the tracepoint, in `context_switch`), and the outgoing thread's
/// includes the run it ends: so a switch-in whose count equals the one kept at the thread's
/// switch-out is the first arrival since, the true end of that interval.
#[inline(always)]
fn arrivals(task: *const u8) -> u64 {
    // SAFETY: `task` is one of the tracepoint's tasks (typed memory the verifier lets the
    // program load from); the offset is a frozen load-time constant from BTF, which the
    // verifier checks against the same BTF.
    unsafe {
        let offset = core::ptr::read_volatile(&TASK_PCOUNT_OFFSET) as usize;
        if task.is_null() || offset == 0 {
            return 0;
        }
        core::ptr::read_volatile(task.add(offset) as *const u64)
    }
}

/// Per registered thread: its switch state and the record walked at its last switch-out.
/// One map value for both, so a switch-out and a switch-in each cost one lookup of the
/// thread. The record of a switch-out is copied over the entry's (only the bytes it uses) and
/// the entry stays when the thread runs (userspace reads the record only while a switch-out
/// is pending): inserting and deleting entries at every switch costs more than the copy.
#[repr(C)]
pub struct OffCpuThread {
    pub state: ThreadSwitch,
    pub record: Record,
}

const _: () = assert!(core::mem::size_of::<OffCpuThread>() == profiler_common::OFF_CPU_THREAD_SIZE);

/// Registered threads by tid: an LRU map, so exited threads' entries make room for new ones.
/// A thread whose entry was evicted while it was off a CPU (more registered threads than
/// slots) starts over at its switch-in, as if first seen then.
#[map]
pub static OFF_CPU_THREADS: LruHashMap<u32, OffCpuThread> = LruHashMap::with_max_entries(16384, 0);

/// Threads known to have nothing pending (`sampled share`): slot `tid % RUNNING_SLOTS` holds
/// [`running_key`]`(tid, generation)` only while thread `tid` has an `OFF_CPU_THREADS` entry
/// for registration `generation` with no switch-out pending (the entry may have been evicted
/// since, which only makes it start over as eviction always does). Written only under a share
/// (a switch-out not walked, the switch-in of an interval walked with a weight above 1), and
/// cleared by every walked switch-out of the thread before it sets its pending interval, and
/// by its exit; another thread's key in the slot only costs the lookups it saves. A
/// thread's switches are serialised by the scheduler (its switch-in sees its switch-out's
/// writes), and only thread `tid` writes its own key, so a slot holding it is never stale.
/// The loader sizes it (one slot outside the off-CPU modes).
#[map]
static RUNNING_THREADS: Array<u64> = Array::with_max_entries(RUNNING_SLOTS, 0);
const RUNNING_SLOTS: u32 = 16384;

/// The key of thread `tid` under registration `generation` in `RUNNING_THREADS` (never 0:
/// tid 0 is never registered).
#[inline(always)]
fn running_key(tid: u32, generation: u32) -> u64 {
    ((tid as u64) << 32) | generation as u64
}

/// Whether thread `tid` is known to have nothing pending under registration `generation`.
#[inline(always)]
fn known_running(tid: u32, generation: u32) -> bool {
    RUNNING_THREADS.get(tid % RUNNING_SLOTS).is_some_and(|k| *k == running_key(tid, generation))
}

/// Notes that thread `tid` has nothing pending under registration `generation`.
#[inline(always)]
fn set_running(tid: u32, generation: u32) {
    if let Some(k) = RUNNING_THREADS.get_ptr_mut(tid % RUNNING_SLOTS) {
        // SAFETY: an array value; a racing writer of another thread's key only costs that
        // thread the lookups its key would save (see `RUNNING_THREADS`).
        unsafe { *k = running_key(tid, generation) };
    }
}

/// Clears thread `tid`'s key (any generation) from its slot, if there.
#[inline(always)]
fn clear_running(tid: u32) {
    if let Some(k) = RUNNING_THREADS.get_ptr_mut(tid % RUNNING_SLOTS) {
        // SAFETY: as in `set_running`.
        unsafe {
            if *k >> 32 == tid as u64 {
                *k = 0;
            }
        }
    }
}

/// A zeroed entry, never written: the source of every new `OFF_CPU_THREADS` entry (too large
/// for the program's stack).
#[map]
static NEW_THREAD: PerCpuArray<OffCpuThread> = PerCpuArray::with_max_entries(1, 0);

/// Thread `tid`'s entry, if it has one.
#[inline(always)]
fn thread_entry(tid: u32) -> Option<&'static mut OffCpuThread> {
    // SAFETY: a map value; only this thread's own switches write it, and a thread is switched
    // on one CPU at a time.
    OFF_CPU_THREADS.get_ptr_mut(&tid).map(|p| unsafe { &mut *p })
}

/// Thread `tid`'s entry, made (zeroed) if it has none; `None` only if it cannot be made.
#[inline(always)]
fn thread_entry_or_new(tid: u32) -> Option<&'static mut OffCpuThread> {
    if let Some(entry) = thread_entry(tid) {
        return Some(entry);
    }
    // SAFETY: a per-CPU value that nothing writes: all zeros.
    let zero = unsafe { &*NEW_THREAD.get_ptr(0)? };
    OFF_CPU_THREADS.insert(&tid, zero, 0).ok()?;
    thread_entry(tid)
}

/// `--kernel`: the kernel stacks where registered threads blocked, each kept once (ids are
/// stable: a slot that holds another stack is never overwritten, the switch-out goes without
/// one and is counted in `counter::OFF_CPU_NO_KERNEL_STACK`). The loader sizes it (one entry
/// without `--kernel`); userspace reads a stack by the id an interval carries.
#[map]
static OFF_CPU_KERNEL_STACKS: StackTrace = StackTrace::with_max_entries(1, 0);

/// `TASK_DEAD` in `prev_state`: the thread's last switch-out, on its way out of `do_exit`.
/// It starts no interval (nothing will switch it back in); its entries are freed instead.
const TASK_DEAD: u32 = 0x80;

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`, in `prev`'s context. A BTF tracepoint: `next` comes as typed
/// kernel memory, so its ids are two loads rather than a helper read.
#[btf_tracepoint(function = "sched_switch")]
pub fn pyperch_sched_switch(ctx: BtfTracePointContext) -> i32 {
    // Preempted: the scheduler took the CPU from a runnable thread (`preempt`, or a switch on
    // the way back to user mode, where `prev_state` is still TASK_RUNNING, 0).
    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    let epoch = switch_filter::epoch();
    let prev_pid_tgid = bpf_get_current_pid_tgid();
    let prev_tid = prev_pid_tgid as u32;
    if !switch_filter::prev_is_unregistered(prev_tid, epoch) {
        if prev_state as u32 & TASK_DEAD != 0 {
            forget_thread(prev_tid);
        } else {
            let generation = prev_generation(prev_tid, epoch);
            let prev: *const u8 = ctx.arg(1);
            switch_out(&ctx, prev, prev_pid_tgid, preempt as u8 != 0 || prev_state as u32 == 0, generation);
        }
    }
    let next: *const u8 = ctx.arg(2);
    let (tid, registered, generation) = switch_in(next);
    switch_filter::remember_next(tid, registered, generation, epoch);
    0
}

/// The kernel's monotonic clock (read only for registered threads: unregistered ones cost
/// the lookups alone).
fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// `prev` (the current thread, `pid_tgid`) leaves the CPU: walks and keeps its stack, if the
/// sampled share chooses this switch-out (every one without a budget). `generation`: its
/// registration's, when `switch_filter` kept it (else `NO_GENERATION`).
fn switch_out(ctx: &BtfTracePointContext, prev: *const u8, pid_tgid: u64, preempt: bool, generation: u64) {
    let tid = pid_tgid as u32;
    // 0: not walked; else the divisor (times the program's time slices under pauses), the
    // weight of the interval.
    let weight = switch_share_draw();
    if weight == 0 && generation != NO_GENERATION && known_running(tid, generation as u32) {
        // Not walked, and its entry already says it runs with nothing pending.
        bump(counter::SWITCH_SHARE_SKIPPED);
        return;
    }
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: the map value is only read, and the kernel keeps it alive for this run.
    let Some(info) = (unsafe { PROCESSES.get(&tgid) }) else {
        return;
    };
    if weight == 0 {
        bump(counter::SWITCH_SHARE_SKIPPED);
        note_running(info, tgid, tid);
        set_running(tid, info.generation);
        return;
    }
    // From here this switch-out may leave an interval pending: the thread is no longer known
    // to have none (before its state is written; its switch-in comes after).
    clear_running(tid);
    let reason = if preempt { off_cpu_reason::PREEMPTED } else { off_cpu_reason::SLEEP };
    let Some((scratch, _)) = walk_current_stack(info, tgid, tid, record_kind::OFF_CPU) else {
        note_running(info, tgid, tid);
        return;
    };
    if weight > 1 {
        // Kept with the record (`start_walk` cleared the flags; no other flag is set in
        // off-CPU records).
        set_weight(scratch, weight);
    }
    // `--async`: the running task's chain as it switches out, sent now (its record goes at
    // the switch-in, which userspace matches by this time).
    crate::task_chain::send_chain(info, scratch);
    // The interval starts when the walk did (its record's time, one clock read for both).
    let now = scratch.record.header.time_ns;
    let reason = if reason == off_cpu_reason::SLEEP
        && waiting_for_gil(
            info,
            tgid,
            scratch.record.header.thread_state,
            &scratch.tstate_bytes,
            &mut scratch.gils,
            scratch.next_interpreter_id,
        ) {
        off_cpu_reason::GIL_WAIT
    } else {
        reason
    };
    let Some(thread) = thread_entry_or_new(tid) else {
        return;
    };
    let state = &mut thread.state;
    if state.generation != info.generation || state.tgid != tgid {
        // The tid now belongs to another registration: its unsent time went with the old one.
        *state = ThreadSwitch { tgid, generation: info.generation, ..ThreadSwitch::default() };
    }
    if !keep_record(&mut thread.record, &scratch.record) {
        bump(counter::OFF_CPU_LOST);
        thread.state.switched_out_ns = 0;
        return;
    }
    let kernel_stack = blocking_kernel_stack(ctx);
    let state = &mut thread.state;
    state.switched_out_ns = now;
    state.reason = reason;
    state.kernel_stack = kernel_stack;
    state.arrivals = arrivals(prev);
}

/// `--kernel`: the kernel stack of the thread switching out (where it blocked, or was
/// preempted), as its `OFF_CPU_KERNEL_STACKS` id plus one; 0 without `--kernel` or when it
/// could not be kept (counted).
fn blocking_kernel_stack(ctx: &BtfTracePointContext) -> u32 {
    if !kernel_stacks_wanted() {
        return 0;
    }
    match ctx.get_stackid(&OFF_CPU_KERNEL_STACKS, 0) {
        Ok(id) if id >= 0 && id < u32::MAX as i64 => id as u32 + 1,
        _ => {
            bump(counter::OFF_CPU_NO_KERNEL_STACK);
            0
        }
    }
}

/// A switch-out whose stack was not kept still says the thread was running under this
/// registration (so its next switch-in is not taken for the end of a wait that began before
/// the registration): an entry with nothing pending.
fn note_running(info: &profiler_common::ProcessInfo, tgid: u32, tid: u32) {
    let Some(thread) = thread_entry_or_new(tid) else { return };
    let state = &mut thread.state;
    if state.generation != info.generation || state.tgid != tgid {
        *state = ThreadSwitch { tgid, generation: info.generation, ..ThreadSwitch::default() };
    }
    state.switched_out_ns = 0;
}

/// Frees the entry of thread `tid`, which exits: its off-CPU time ends with it (time it had
/// summed but not sent is at most `MIN_OFF_CPU_NS` per interval, already counted short).
fn forget_thread(tid: u32) {
    clear_running(tid);
    let _ = OFF_CPU_THREADS.remove(&tid);
}

/// Ends `next`'s pending interval, if any. Returns `next`'s tid, whether its process is
/// registered (true when unknown) and its registration's generation (when looked up, else
/// `NO_GENERATION`), for `switch_filter::remember_next`.
fn switch_in(next: *const u8) -> (u32, bool, u64) {
    // SAFETY: `next` is the tracepoint's task (typed memory the verifier lets the program
    // load from); the offsets are frozen load-time constants from BTF, which the verifier
    // checks against the same BTF.
    let (tgid, tid) = unsafe {
        let tgid_offset = core::ptr::read_volatile(&TASK_TGID_OFFSET) as usize;
        let pid_offset = core::ptr::read_volatile(&TASK_PID_OFFSET) as usize;
        if next.is_null() || tgid_offset == 0 || pid_offset == 0 {
            return (0, true, NO_GENERATION);
        }
        (
            core::ptr::read_volatile(next.add(tgid_offset) as *const u32),
            core::ptr::read_volatile(next.add(pid_offset) as *const u32),
        )
    };
    if tgid == 0 || !switch_filter::maybe_registered(tgid) {
        return (tid, false, NO_GENERATION);
    }
    // SAFETY: as in `switch_out`.
    let Some(info) = (unsafe { PROCESSES.get(&tgid) }) else {
        return (tid, false, NO_GENERATION);
    };
    if !known_running(tid, info.generation) {
        charge_interval(info, tgid, tid, next);
    }
    (tid, true, info.generation as u64)
}

/// Ends the pending interval of `tid` (of registered process `tgid`) that is switched in now.
///
/// A thread with no entry for this registration was switched out before it was registered:
/// this switch-in ends a wait the kernel did not see begin. Its time is noted
/// (`first_in_ns`), for userspace to charge from the registration on (see
/// `profiler-user/src/session/blocked_at_start.rs`); one insert, once per thread.
fn charge_interval(info: &profiler_common::ProcessInfo, tgid: u32, tid: u32, next: *const u8) {
    let first_switch_in = || ThreadSwitch {
        tgid,
        generation: info.generation,
        first_in_ns: now(),
        first_in_arrivals: arrivals(next),
        ..ThreadSwitch::default()
    };
    let Some(thread) = thread_entry(tid) else {
        if let Some(thread) = thread_entry_or_new(tid) {
            thread.state = first_switch_in();
        }
        return;
    };
    let state = &mut thread.state;
    if state.generation != info.generation || state.tgid != tgid {
        *state = first_switch_in();
        return;
    }
    if state.switched_out_ns == 0 {
        return;
    }
    if arrivals(next) != state.arrivals {
        // It ran since it switched out, unseen (the program was paused): this is not the end
        // of that interval, whose true end is unknown. Dropped, never charged with time it ran.
        state.switched_out_ns = 0;
        bump(counter::OFF_CPU_END_MISSED);
        if thread.record.header.flags >> sample_flags::WEIGHT_SHIFT > 1 {
            set_running(tid, info.generation);
        }
        return;
    }
    let now = now();
    let interval = OffCpuInterval {
        off_ns: now.saturating_sub(state.switched_out_ns),
        short_ns: state.short_ns,
        switched_out_ns: state.switched_out_ns,
        reason: state.reason,
        kernel_stack: state.kernel_stack,
    };
    state.switched_out_ns = 0;
    if thread.record.header.flags >> sample_flags::WEIGHT_SHIFT > 1 {
        // Under a share: nothing pending now, so its switch-outs not walked cost no lookup.
        set_running(tid, info.generation);
    }
    // SAFETY: a frozen load-time constant.
    let min = unsafe { core::ptr::read_volatile(&MIN_OFF_CPU_NS) };
    if interval.off_ns < min {
        // Weighted now, with the weight this interval was chosen with (1 without a budget).
        // No 128-bit multiply in BPF: the length is capped so the product fits (the weight is
        // at most `MAX_WEIGHT`, 2^24; the cap is over 18 minutes, far above any minimum).
        let weight = sample_flags::weight(thread.record.header.flags) as u64;
        let off_ns = if interval.off_ns > MAX_WEIGHTED_NS { MAX_WEIGHTED_NS } else { interval.off_ns };
        state.short_ns = state.short_ns.saturating_add(off_ns * weight);
        bump(counter::OFF_CPU_SHORT);
        return;
    }
    state.short_ns = 0;
    bump(counter::OFF_CPU_INTERVALS);
    let record = &mut thread.record;
    record.header.time_ns = now;
    let n_full = record.header.n_full as usize;
    let n = if n_full > MAX_FULL_FRAMES { MAX_FULL_FRAMES } else { n_full };
    if let Some(slot) = record.frames.get_mut(n) {
        // SAFETY: `OffCpuInterval` is plain data of exactly one `FrameEntry`'s size (asserted
        // in profiler-common), written into that slot.
        unsafe { core::ptr::write_unaligned(slot as *mut FrameEntry as *mut OffCpuInterval, interval) };
        send_off_cpu_record(record as *const Record as *const c_void, record_len(n_full, 1), now);
    }
}

/// Copies `record` (just walked) over `kept` (a thread's entry): its header and full frames.
fn keep_record(kept: &mut Record, record: &Record) -> bool {
    let len = record_len(record.header.n_full as usize, 0);
    // SAFETY: `kept` is a map value of `size_of::<Record>()` bytes and `len` is at most that;
    // `record` is as large. The helper copies kernel memory (the per-CPU scratch).
    let ret = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            kept as *mut Record as *mut c_void,
            len as u32,
            record as *const Record as *const c_void,
        )
    };
    ret == 0
}
