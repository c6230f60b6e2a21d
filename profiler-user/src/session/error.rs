//! Why a session cannot start or run: the errors of its start-up (`builder`) and of its loop,
//! shared by every command that runs one. Each is one sentence for the user; Display escapes
//! text from targets and paths (see `text`).

use crate::{kernel::loader::LoadError, host::privileges::PrivilegeError};

/// The highest sampling rate (`--rate`).
pub const MAX_RATE: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("no process with PID {0} exists")]
    NoSuchProcess(u32),
    #[error("process {pid} ({}) is not a Python interpreter: no _PyRuntime in its executable or libraries", crate::text::field(.comm))]
    NotPython { pid: u32, comm: String },
    #[error("process {pid} ({}) cannot be profiled: {}", crate::text::field(.comm), crate::text::field(.reason))]
    Unsupported { pid: u32, comm: String, reason: String },
    #[error("cannot inspect process {pid}: {}", crate::text::field(.message))]
    Inspect { pid: u32, message: String },
    #[error("could not start {}: {source}", crate::text::field(.command))]
    Launch { command: String, source: std::io::Error },
    #[error("the sampling rate must be between 1 and {MAX_RATE} Hz (got {0})")]
    Rate(u64),
    #[error("the event loop failed: {0}")]
    Runtime(String),
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error("process {pid} does not match {}", crate::text::field(.filters))]
    PidFiltered { pid: u32, filters: String },
}
