//! Reading targets: everything pyperch learns from a Python process's memory and files.
//!
//! - `discovery`: which processes run CPython, which version and build, where its runtime is;
//! - `layout`: per-version facts (structure offsets, frame semantics) as data, for the kernel
//!   and for userspace;
//! - `memory`: reads of target memory, with byte budgets and deadlines;
//! - `symbolize`: code objects to names, files and lines;
//! - `asyncio`: task graphs and coroutine chains;
//! - `native`: native frames (mappings, ELF and DWARF files, kernel symbols);
//! - `thread_registry`: Python thread names from the interpreter's own registry;
//! - `thread_stacks`: every thread of a process and its Python stack now, read twice from
//!   memory (`dump`, the waits of threads blocked since before sampling, `top`);
//! - `budget`: work on a target that may block (opening its files, reading /proc), run on a
//!   thread of its own with a time budget.
//!
//! Nothing here imports from a command or from the session.

pub mod asyncio;
pub(crate) mod budget;
pub mod discovery;
pub mod layout;
pub mod memory;
pub mod native;
pub mod symbolize;
pub mod thread_registry;
pub mod thread_stacks;
