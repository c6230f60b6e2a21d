//! pyperch: a whole-host sampling profiler for CPython, built on eBPF.
//!
//! Data flows one way, and the modules follow it:
//! `loader` (perf events → kernel walk → ring buffer) → `completion` (stacks deeper than the
//! kernel went, through a validated frame cache) → `symbolize` (code objects → names and
//! lines) → `aggregate` → `output`. `discovery` and `layout` find Python processes and tell
//! the kernel how to walk them; `memory` reads targets; `stats` counts every outcome;
//! `host` knows the machine: containers and pod names, `privileges` (dropped once the kernel
//! program is attached), seccomp, per-task perf events, the kernel's BTF.

pub mod agent;
pub mod aggregate;
pub mod asyncio;
pub mod completion;
pub mod discovery;
pub mod dump;
pub mod explain;
pub mod filenames;
pub mod filter;
pub mod host;
#[cfg(test)]
mod fuzzing;
#[cfg(test)]
mod fuzz_targets;
pub mod launch;
pub mod layout;
pub mod list;
pub mod loader;
pub mod memory;
pub mod native;
pub mod output;
pub mod output_file;
pub mod record;
mod session;
pub mod stats;
pub mod symbolize;
pub mod text;
pub mod thread_registry;
pub mod time_mode;
pub mod timeline;
pub mod top;
pub mod upload;
