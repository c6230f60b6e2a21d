//! Symbolization: code objects in a target → qualified names, file names and lines.
//!
//! - `linetable`: pure decoders of the three line-table formats (instruction offset → line);
//! - `strings`: `str` / `bytes` objects read out of a target, bounded and checked;
//! - `code`: one code object (`read_code` → `CodeInfo`), validated by its type pointer.
//!
//! Everything read from a target is untrusted: lengths are bounded by the constants below
//! (and by `memory::MAX_READ`), loops by the bytes they consume, and a malformed object is an
//! error, never a panic.

pub mod linetable;

mod check;
mod code;
mod snapshot;
mod strings;
mod tlbc;

#[cfg(test)]
mod live_tests;

pub use check::read_code_check;
pub use code::{CodeInfo, TypeAddresses, read_code};
pub use snapshot::{Snapshot, SnapshotMemory, decode_snapshot};
pub use strings::{is_compact_ascii, read_bytes, read_str, read_str_prefix};
pub use tlbc::{TlbcBases, TlbcLayout, Unresolved};

use crate::target::memory::MemoryError;

/// Longest `co_name` / `co_qualname` accepted, in characters.
pub const MAX_NAME_CHARS: usize = 4096;
/// Longest `co_filename` accepted, in characters.
pub const MAX_PATH_CHARS: usize = 4096;
/// Largest line table accepted, in bytes.
pub const MAX_LINETABLE_BYTES: usize = crate::target::memory::MAX_READ;

/// Why a code object (or a string in it) could not be read.
#[derive(thiserror::Error, Debug)]
pub enum SymbolError {
    /// The object's type pointer is not `&PyCode_Type`: a frame was reused, a shim, or not a
    /// code object at all.
    #[error("object at {address:#x} is not a code object (type {ob_type:#x})")]
    NotCode { address: u64, ob_type: u64 },
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A `str` or `bytes` field of a code object points to an object of another type.
    #[error("object at {address:#x} is not a {expected} (type {ob_type:#x})")]
    WrongType { address: u64, expected: &'static str, ob_type: u64 },
    #[error("malformed str object at {address:#x}: {reason}")]
    BadString { address: u64, reason: &'static str },
    #[error("malformed bytes object at {address:#x}: {reason}")]
    BadBytes { address: u64, reason: &'static str },
    /// A length above the bound for that object (`max`: characters for a `str`, bytes for a
    /// `bytes`).
    #[error("object at {address:#x} is too long: {len} (at most {max})")]
    TooLong { address: u64, len: u64, max: usize },
    /// A field of the code object is unusable (negative, or outside the layout's read size).
    #[error("code object at {address:#x}: {field} {reason}")]
    BadField { address: u64, field: &'static str, reason: &'static str },
}
