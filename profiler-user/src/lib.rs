//! pyperch: a whole-host sampling profiler for CPython, built on eBPF.
//!
//! The folders are the layers, and a sample goes through them in this order:
//! `kernel` (load and attach the eBPF programs: perf event → kernel walk → ring buffer) →
//! `session` (the drain thread copies records into bounded per-process queues; the worker
//! takes them) → `sample` (one record's path: decode → complete → symbolize → merge native,
//! task and kernel frames → aggregate) → `output` (profile files) or `export` (the agent's
//! uploads). `cmd` holds the commands, at the edge: they build a session
//! (`session::builder`) and write what it gathered. Beside the path: `target` reads Python
//! processes (discovery, per-version layouts, memory with budgets, symbolization, asyncio,
//! native frames, thread stacks), `host` knows the machine (containers, pod names,
//! privileges, seccomp, kernel BTF); `stats` counts every outcome, `text` makes target text
//! safe to show, `filter` says which processes to profile, `time_mode` which time a profile
//! shows. The layers import one another without a circle, and nothing imports a command
//! (`xtask/src/layers.rs` checks both with the unit tests).

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
