//! Process events: fork, exit and exec tracepoints keep `PROCESSES` true to the living
//! processes.
//!
//! Diagnostics (`aya-log`, at debug level): the rare events that change what is sampled, a
//! registered process exiting or exec'ing, one line each. They cost nothing unless userspace
//! enables them (`AYA_LOG_LEVEL` is frozen at 0 without `RUST_LOG`, and the verifier drops
//! the dead branch); each is one ring-buffer record, at most one per process lifetime.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::counter;

use aya_log_ebpf::debug;

use crate::maps::{PROCESSES, bump};

/// Offsets of `task_struct.signal` and `signal_struct.live` (from BTF; 0 when unknown): a
/// thread group is dead when the exiting task leaves `live` at 0.
#[unsafe(no_mangle)]
static TASK_SIGNAL_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static SIGNAL_LIVE_OFFSET: u64 = 0;

/// Attached by userspace to the `sched_process_fork` tracepoint: counts changes to the set of
/// processes.
#[raw_tracepoint]
pub fn pyperch_process_event(_ctx: RawTracePointContext) -> i32 {
    bump(counter::PROCESS_EVENTS);
    0
}

/// Attached to `sched_process_exit`, which fires for every exiting thread (in its context,
/// after `do_exit` decremented `signal->live`): counts it, and when the whole thread group is
/// gone removes the process from `PROCESSES`. The slot is free at once (the map never fills
/// with dead processes), and a PID reused later is not sampled with the old layout.
#[raw_tracepoint]
pub fn pyperch_process_exit(ctx: RawTracePointContext) -> i32 {
    bump(counter::PROCESS_EVENTS);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if thread_group_dead(pid_tgid as u32 == tgid) && PROCESSES.remove(&tgid).is_ok() {
        bump(counter::REGISTERED_EXITS);
        debug!(&ctx, "registered process {} exited: its kernel slot is free", tgid);
    }
    0
}

/// Whether the exiting current task was the last live thread of its group. Without the BTF
/// offsets, falls back to "the group leader exits" (in a normal exit the process is dying).
fn thread_group_dead(is_leader: bool) -> bool {
    // SAFETY: read_volatile of frozen globals; the kernel reads tolerate any address.
    unsafe {
        let signal_offset = core::ptr::read_volatile(&TASK_SIGNAL_OFFSET) as usize;
        let live_offset = core::ptr::read_volatile(&SIGNAL_LIVE_OFFSET) as usize;
        if signal_offset == 0 || live_offset == 0 {
            return is_leader;
        }
        let task = bpf_get_current_task() as *const u8;
        let Ok(signal) = bpf_probe_read_kernel(task.add(signal_offset) as *const u64) else {
            return is_leader;
        };
        match bpf_probe_read_kernel((signal as *const u8).add(live_offset) as *const i32) {
            Ok(live) => live == 0,
            Err(_) => is_leader,
        }
    }
}

/// Attached to `sched_process_exec`: counts it, and stops sampling the process if it was
/// registered, since the registered layout described the program it just replaced.
#[raw_tracepoint]
pub fn pyperch_process_exec(ctx: RawTracePointContext) -> i32 {
    bump(counter::PROCESS_EVENTS);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if PROCESSES.remove(&tgid).is_ok() {
        bump(counter::REGISTERED_EXECS);
        debug!(&ctx, "registered process {} exec'd: not sampled until discovery looks at it again", tgid);
    }
    0
}

