//! Code objects as the kernel copied them at sample time (`profiler_common::CodeSnapshot`),
//! decoded with the same reads and checks as live memory (`read_code`) but served from the
//! copied bytes: what a snapshot holds is what the code object was while a sampled frame
//! kept it alive, however soon it was freed afterwards.

use profiler_common::{
    CODE_SNAPSHOT_HEADER, CodeSnapshotHead, SNAP_CODE_MAX, SNAP_FILENAME_AT, SNAP_FILENAME_MAX, SNAP_NAME_AT,
    SNAP_NAME_MAX, SNAP_TABLE_AT, SNAP_TABLE_MAX,
};

use super::{CodeInfo, SymbolError, TypeAddresses, read_code};
use crate::target::layout::PythonLayout;
use crate::target::memory::{MemoryError, ProcessMemory, ReadMemory};

/// The regions of one snapshot: (target address, bytes copied from there). Reads must lie
/// inside one region; type objects' words (long-lived) are read from the live process.
pub struct SnapshotMemory<'a> {
    regions: [(u64, &'a [u8]); 4],
    live: &'a ProcessMemory,
}

impl ReadMemory for SnapshotMemory<'_> {
    fn read_into(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let not_copied = MemoryError::NotCopied { address, len: buf.len() };
        for &(start, bytes) in &self.regions {
            let Some(from) = address.checked_sub(start) else { continue };
            let Ok(from) = usize::try_from(from) else { continue };
            if let Some(part) = from.checked_add(buf.len()).and_then(|end| bytes.get(from..end)) {
                if start != 0 {
                    buf.copy_from_slice(part);
                    return Ok(());
                }
            }
        }
        Err(not_copied)
    }

    fn read_type_word(&self, address: u64) -> Result<u64, MemoryError> {
        self.live.read_u64(address)
    }
}

/// A decoded snapshot: the code object's address, its validation word, what it shows.
pub struct Snapshot {
    pub code: u64,
    pub check: u32,
    pub info: CodeInfo,
}

/// Decodes one `record_kind::CODE_SNAPSHOT` record (whole, header included) of a process
/// with `layout`; the type checks are those of a live read (`types`). Lengths are the
/// kernel's, bounded here again by the regions and the record's own length.
pub fn decode_snapshot(
    record: &[u8],
    layout: &PythonLayout,
    types: &TypeAddresses,
    live: &ProcessMemory,
) -> Result<Snapshot, SymbolError> {
    let bad = SymbolError::BadField { address: 0, field: "snapshot", reason: "malformed record" };
    let snap = CodeSnapshotHead::read(record).ok_or(bad)?;
    let bytes = &record[CODE_SNAPSHOT_HEADER..];
    let region = |at: usize, cap: usize, len: u32| -> &[u8] {
        let len = (len as usize).min(cap);
        bytes.get(at..at + len).unwrap_or(&[])
    };
    let memory = SnapshotMemory {
        regions: [
            (snap.code, region(0, SNAP_CODE_MAX, snap.code_len)),
            (snap.name_at, region(SNAP_NAME_AT, SNAP_NAME_MAX, snap.name_len)),
            (snap.filename_at, region(SNAP_FILENAME_AT, SNAP_FILENAME_MAX, snap.filename_len)),
            (snap.table_at, region(SNAP_TABLE_AT, SNAP_TABLE_MAX, snap.table_len)),
        ],
        live,
    };
    let info = read_code(&memory, layout, types, snap.code)?;
    Ok(Snapshot { code: snap.code, check: snap.check, info })
}
