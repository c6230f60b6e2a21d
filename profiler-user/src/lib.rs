//! pyperch: a whole-host sampling profiler for CPython, built on eBPF.
//!
//! Data flows one way, and the modules follow it:
//! `loader` (perf events → kernel walk → ring buffer) → `completion` (stacks deeper than the
//! kernel went, through a validated frame cache) → `symbolize` (code objects → names and
//! lines) → `aggregate` → `output`. `discovery` and `layout` find Python processes and tell
//! the kernel how to walk them; `memory` reads targets; `stats` counts every outcome;
//! `privileges` drops what is not needed once the kernel program is attached.

pub mod agent;
pub mod aggregate;
pub mod asyncio;
pub mod completion;
pub mod containers;
pub mod discovery;
pub mod dump;
pub mod explain;
pub mod filenames;
pub mod filter;
mod kernel_btf;
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
pub mod pod_names;
pub mod privileges;
pub mod record;
pub mod seccomp;
mod session;
pub mod stats;
pub mod symbolize;
pub mod task_events;
pub mod text;
pub mod thread_stacks;
pub mod thread_registry;
pub mod time_mode;
pub mod timeline;
pub mod top;
pub mod upload;
