//! pyperch: a whole-host sampling profiler for CPython, built on eBPF.
//!
//! Data flows one way, and the modules follow it:
//! `loader` (perf events → kernel walk → ring buffer) → `session` → `sample` (one stage per
//! file: `decode`, `complete` (stacks deeper than the kernel went, through a validated frame
//! cache), `symbolize` (code objects → names and lines), `merge` (native, task and kernel
//! frames), `aggregate`) → `output`. `discovery` and `layout` find Python processes and tell
//! the kernel how to walk them; `memory` reads targets; `stats` counts every outcome;
//! `privileges` drops what is not needed once the kernel program is attached.

pub mod agent;
pub mod asyncio;
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
pub mod sample;
pub mod seccomp;
mod session;
pub mod stats;
pub mod symbolize;
pub mod task_events;
pub mod text;
pub mod thread_registry;
pub mod time_mode;
pub mod top;
pub mod upload;

// The sample path's modules at their paths before they moved into `sample/`, for the files
// not edited with the move (commands, `dump`); to be removed when those paths are updated.
pub use sample::{aggregate, complete as completion, timeline};
