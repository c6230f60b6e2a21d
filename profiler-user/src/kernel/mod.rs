//! The kernel side, seen from userspace: loading the eBPF programs, attaching them to perf
//! events and tracepoints, and the maps shared with them (process registrations, the ring
//! buffer, off-CPU state, stacks).

pub mod loader;
