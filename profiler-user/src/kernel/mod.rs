//! The kernel side, seen from userspace: loading the eBPF programs, attaching them to perf
//! events and tracepoints, and the maps shared with them (process registrations, the ring
//! buffer, off-CPU state, stacks); `thread_events`: the CPU clock of chosen processes' threads
//! only (per-task perf events, for `--pid` and a launched command); `switch_gate`: the
//! scheduler-switch program's attachment, which `--max-cpu` may pause.

pub mod clock;
pub mod loader;
pub mod switch_gate;
pub mod thread_events;
pub mod unwind_tables;
