//! Code-object snapshots (`profiler_common::CodeSnapshot`): what symbolization needs from a
//! sampled frame's code object, copied while the stopped thread's frame keeps it alive, and
//! sent once per code object and validation word, before the record that carries the frame.
//! A module's body, a class body or the functions of a module dropped again are freed within
//! milliseconds; userspace reads records later and would otherwise find them gone.

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, generated},
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use profiler_common::{
    CODE_SNAPSHOT_HEADER, CodeSnapshot, FrameLayout, SNAP_CODE_MAX, SNAP_FILENAME_AT, SNAP_FILENAME_MAX, SNAP_NAME_AT,
    SNAP_NAME_MAX, SNAP_TABLE_AT, SNAP_TABLE_MAX, counter, record_kind,
};

use crate::frame_walk::read_u64;
use crate::maps::{bump, output_record};

/// Slots of [`SnapScratch::sent`] (a power of two).
const SENT_SLOTS: usize = 512;

/// A code object whose snapshot this CPU sent (or found already sent, or could not make).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SentSlot {
    code: u64,
    check: u32,
    tgid: u32,
}

/// Per-CPU: the code objects this CPU dealt with recently (direct-mapped by code address and
/// word), which spares the shared map's lookup for the code objects of every walk (the frames
/// a process runs again and again).
#[repr(C)]
pub struct SnapScratch {
    sent: [SentSlot; SENT_SLOTS],
}

#[map]
static SNAP_SCRATCH: PerCpuArray<SnapScratch> = PerCpuArray::with_max_entries(1, 0);

/// The snapshot being built, one entry per possible CPU (indexed by the CPU's number; the
/// loader sets the entries to the number of possible CPUs). Not a per-CPU array: a per-CPU
/// value is limited to 32 KiB, and the line table's region alone is 64 KiB (a large module's
/// body, such as `html.entities`, has a 37 KiB table).
#[map]
static SNAP_BUFFER: Array<CodeSnapshot> = Array::with_max_entries(1, 0);

/// Key of [`CODE_SEEN`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SeenKey {
    code: u64,
    tgid: u32,
    check: u32,
}

/// Code objects (by process, address and validation word) whose snapshot was sent on any
/// CPU, with the registration (`ProcessInfo::generation`) it was sent under. Least recently
/// used entries go first: a code object forgotten here is sent again, never missed.
#[map]
static CODE_SEEN: LruHashMap<SeenKey, u32> = LruHashMap::with_max_entries(16384, 0);

/// Sends the snapshot of the code object at `code` (validation word `check`) of process
/// `tgid` (registration `generation`), unless it was sent before. Called for frames whose
/// word the walk read from the target (not from the check cache: those were dealt with by
/// an earlier walk on this CPU).
#[inline(always)]
pub fn ensure_sent(layout: &FrameLayout, tgid: u32, generation: u32, time_ns: u64, code: u64, check: u32) {
    if layout.snap_code_size == 0 || check == 0 || code == 0 {
        return;
    }
    let Some(scratch) = SNAP_SCRATCH.get_ptr_mut(0) else { return };
    // SAFETY: a per-CPU array value; the programs that call this do not interrupt each other
    // on one CPU (see `sampling::Scratch`).
    let scratch = unsafe { &mut *scratch };
    let index = ((code ^ check as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 55) as usize & (SENT_SLOTS - 1);
    let slot = &mut scratch.sent[index];
    if slot.code == code && slot.check == check && slot.tgid == tgid {
        return;
    }
    slot.code = code;
    slot.check = check;
    slot.tgid = tgid;
    let key = SeenKey { code, tgid, check };
    // SAFETY: the value is only read.
    if unsafe { CODE_SEEN.get(&key) }.is_some_and(|g| *g == generation) {
        return;
    }
    let _ = CODE_SEEN.insert(&key, &generation, 0);
    // SAFETY: a helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(snap) = SNAP_BUFFER.get_ptr_mut(cpu) else {
        bump(counter::CODE_SNAPSHOTS_SKIPPED);
        return;
    };
    // SAFETY: this CPU's entry; the programs that call this do not interrupt each other on
    // one CPU (as for `SNAP_SCRATCH`).
    let snap = unsafe { &mut *snap };
    match fill(layout, code, snap) {
        Some(table_len) => {
            let head = &mut snap.head;
            head.header.kind = record_kind::CODE_SNAPSHOT;
            head.header.tgid = tgid;
            head.header.generation = generation;
            head.header.time_ns = time_ns;
            head.code = code;
            head.check = check;
            let len = CODE_SNAPSHOT_HEADER + SNAP_TABLE_AT + table_len;
            output_record(snap as *const CodeSnapshot as *const core::ffi::c_void, len);
            bump(counter::CODE_SNAPSHOTS);
        }
        None => bump(counter::CODE_SNAPSHOTS_SKIPPED),
    }
}

/// Copies the code object and its three objects into `snap`'s regions; the line table's
/// bytes on success. `None` when one is unreadable or larger than its region.
#[inline(always)]
fn fill(layout: &FrameLayout, code: u64, snap: &mut CodeSnapshot) -> Option<usize> {
    let size = layout.snap_code_size as usize;
    let size = if size > SNAP_CODE_MAX - 8 { SNAP_CODE_MAX - 8 } else { size };
    copy(snap.bytes.as_mut_ptr(), size, code)?;
    snap.head.code_len = size as u32;
    let name = word(&snap.bytes, layout.snap_name);
    let filename = word(&snap.bytes, layout.snap_filename);
    let table = word(&snap.bytes, layout.snap_linetable);
    snap.head.name_at = name;
    snap.head.filename_at = filename;
    snap.head.table_at = table;
    // SAFETY (both): the regions lie inside `bytes` (`SNAP_*_AT + SNAP_*_MAX <= SNAP_BYTES`).
    snap.head.name_len = copy_str(layout, unsafe { snap.bytes.as_mut_ptr().add(SNAP_NAME_AT) }, SNAP_NAME_MAX, name)? as u32;
    snap.head.filename_len =
        copy_str(layout, unsafe { snap.bytes.as_mut_ptr().add(SNAP_FILENAME_AT) }, SNAP_FILENAME_MAX, filename)? as u32;
    let table_size = read_u64(table.wrapping_add(layout.snap_bytes_size as u64));
    let table_len = (layout.snap_bytes_data as u64).checked_add(table_size)?;
    if table_len >= SNAP_TABLE_MAX as u64 {
        return None;
    }
    let table_len = table_len as usize;
    // SAFETY: as above.
    copy(unsafe { snap.bytes.as_mut_ptr().add(SNAP_TABLE_AT) }, table_len, table)?;
    snap.head.table_len = table_len as u32;
    Some(table_len)
}

/// Copies a `str` object (header and characters) to `to`, a region of `cap` bytes; its bytes.
/// The characters' width is not decoded here: up to 4 bytes each are copied when they fit,
/// else the exact size of an ASCII string (a read running into an unmapped page fails).
#[inline(always)]
fn copy_str(layout: &FrameLayout, to: *mut u8, cap: usize, address: u64) -> Option<usize> {
    if address == 0 {
        return None;
    }
    let length = read_u64(address.wrapping_add(layout.check_str as u64));
    if length >= cap as u64 {
        return None;
    }
    let widest = (layout.snap_str_compact as u64).wrapping_add(length * 4);
    let widest = if widest > (cap - 8) as u64 { (cap - 8) as u64 } else { widest } as usize;
    if copy(to, widest, address).is_some() {
        return Some(widest);
    }
    let ascii = (layout.snap_str_ascii as u64).wrapping_add(length).wrapping_add(1);
    if ascii > (cap - 8) as u64 {
        return None;
    }
    copy(to, ascii as usize, address)?;
    Some(ascii as usize)
}

/// Reads `len` bytes (masked below `SNAP_TABLE_MAX`) at `from` into `to`.
#[inline(always)]
fn copy(to: *mut u8, len: usize, from: u64) -> Option<()> {
    // The callers' own bounds let LLVM drop a plain mask, and 5.10's verifier does not follow
    // them through the 32-bit size: hide the value so that the mask stays.
    let len = (core::hint::black_box(len) as u32) & (SNAP_TABLE_MAX as u32 - 1);
    if len == 0 {
        return None;
    }
    // SAFETY: every caller's region holds `len` bytes (bounded by its own cap).
    let ret = unsafe { generated::bpf_probe_read_user(to as *mut _, len, from as *const _) };
    (ret == 0).then_some(())
}

/// The u64 at `offset` (masked into the code region) of the snapshot's bytes.
#[inline(always)]
fn word(bytes: &[u8; profiler_common::SNAP_BYTES], offset: u32) -> u64 {
    let offset = (offset as usize) & (SNAP_CODE_MAX - 1);
    // SAFETY: offset < SNAP_CODE_MAX and `bytes` extends far beyond it.
    unsafe { core::ptr::read_unaligned(bytes.as_ptr().add(offset) as *const u64) }
}
