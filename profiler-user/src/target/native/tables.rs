//! What the kernel's native walk needs of one process (`--native`, the default walk): each
//! executable mapping with its file's unwind rows (`unwind_table`), handed to a
//! [`TableSink`] (the kernel's maps, `kernel::unwind_tables`) whenever the process's modules
//! change. This side never touches the kernel: it only says what a process maps.

use std::sync::Arc;

use profiler_common::UnwindRow;

/// How the kernel unwinds through one mapping.
#[derive(Clone, Debug)]
pub enum MappingRows {
    /// With its file's rows (shared by every process mapping the same file read).
    Rows(Arc<[UnwindRow]>),
    /// Its file has no table the walk can use: frame pointers.
    FramePointers,
    /// Its file is still being read: a walk reaching it stops and says so.
    Loading,
}

/// One executable mapping: `file address = address - bias`.
#[derive(Clone, Debug)]
pub struct MappingTable {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub rows: MappingRows,
}

/// Where the mappings go. Calls come from the threads that complete samples, never from the
/// thread draining the ring buffer; each returns quickly (no file is read).
pub trait TableSink: Send + Sync {
    /// Replaces process `pid`'s mappings (sorted by start). `owner` names the caller: a
    /// removal by an earlier owner of a reused pid leaves a later owner's mappings alone.
    fn set_process(&self, pid: u32, owner: u64, mappings: &[MappingTable]);
    /// Forgets process `pid` (if `owner` still owns it); its files' rows are freed with their
    /// last user.
    fn remove_process(&self, pid: u32, owner: u64);
    /// `--stats`' words about the tables.
    fn report(&self) -> String;
}
