//! `pyperch dump`: every thread of one Python process at one moment, without stopping it.
//!
//! The threads and their stacks are read by [`crate::target::thread_stacks`] (shared with the
//! session); this command finds the process and shows what was read:
//! - `render`: the text and JSON outputs.

pub mod render;

use crate::target::discovery::{self, DiscoveryError};
use crate::target::thread_stacks::{EXIT_GRACE, proc_threads};

pub use crate::target::thread_stacks::{
    Activity, DumpError, DumpOptions, Frame, Local, ProcessDump, StackRead, TaskState, ThreadDump, dump_inspected,
    over_budget_problem, stack,
};

/// Dumps process `pid` (see the module docs).
pub fn dump(pid: u32, options: DumpOptions) -> Result<ProcessDump, DumpError> {
    let process = match discovery::inspect(pid) {
        Ok(p) => p,
        Err(DiscoveryError::Gone(_)) => return Err(DumpError::NoProcess(pid)),
        // A process that exited while it was inspected (a zombie maps nothing) is not
        // "not Python": say it is gone.
        Err(_) if !proc_threads::running(pid) || {
            std::thread::sleep(EXIT_GRACE);
            !proc_threads::running(pid)
        } =>
        {
            return Err(DumpError::NoProcess(pid));
        }
        Err(e) => return Err(DumpError::Discovery(e)),
    };
    dump_inspected(&process, options)
}
