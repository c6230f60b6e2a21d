//! pyperch: a whole-host sampling profiler for CPython, built on eBPF.
//!
//! Data flows one way, and the modules follow it:
//! `loader` (perf events → kernel walk → ring buffer) → `session` → `sample` (one stage per
//! file: `decode`, `complete` (stacks deeper than the kernel went, through a validated frame
//! cache), `symbolize` (code objects → names and lines), `merge` (native, task and kernel
//! frames), `aggregate`) → `output`. `discovery` and `layout` find Python processes and tell
//! the kernel how to walk them; `memory` reads targets; `stats` counts every outcome;
//! `privileges` drops what is not needed once the kernel program is attached.

pub mod cmd;
pub mod export;
pub mod filter;
pub mod host;
#[cfg(test)]
mod fuzzing;
#[cfg(test)]
mod fuzz_targets;
pub mod kernel;
pub mod output;
pub mod sample;
mod session;
pub mod stats;
pub mod target;
pub mod text;
pub mod time_mode;
