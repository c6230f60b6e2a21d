//! Where a native or kernel frame's code is: what a profile keeps of it (`FrameName::native`)
//! and pprof writes as a mapping and an address.

use std::sync::Arc;

/// Where a native or kernel frame's code is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NativeOrigin {
    /// Start of the frame's function (the frame's own address when no symbol covers it), in
    /// `mapping`'s address space.
    pub address: u64,
    pub mapping: Arc<NativeMapping>,
}

/// A file's executable code as pprof's `Mapping` describes it. User-space files are given
/// at their link addresses (the same for every process that maps them, whatever the load
/// address): `start..limit` is the file's executable segment and `offset` its file offset.
/// The kernel is `[kernel]` at its runtime addresses, with no file offset.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NativeMapping {
    /// The path as the target saw it, or `[kernel]`.
    pub file: Arc<str>,
    /// The GNU build id in lower-case hex, or empty.
    pub build_id: Arc<str>,
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
}
