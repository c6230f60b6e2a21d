//! The validation word of a code object as it is in target memory now
//! (`profiler_common::code_check`), read the way the kernel reads it: shared by the sample
//! path (`sample::complete`, `sample::symbolize`), `asyncio::waits` and `dump`.

use profiler_common::{
    FRAME_READ_MAX, FrameBytes, FrameEntry, FrameLayout, code_check, code_check_applies, code_check_needs_strings,
    code_check_size, code_check_strings,
};

use crate::target::memory::ProcessMemory;

/// The validation word of `entry`'s code object as it is in memory now, computed exactly as
/// the kernel does (same reads, same rule for unreadable parts: an unreadable window gives 0,
/// an unreadable string `[0, 0]`), so that it equals the kernel's word iff the fields agree.
pub fn read_code_check(mem: &ProcessMemory, layout: &FrameLayout, entry: &FrameEntry) -> u32 {
    if !code_check_applies(layout, entry) {
        return 0;
    }
    let size = code_check_size(layout) as usize;
    if size == 0 {
        return 0;
    }
    let mut window: FrameBytes = [0; FRAME_READ_MAX + 8];
    if mem.read(entry.code.wrapping_add(layout.check_start as u64), &mut window[..size]).is_err() {
        return 0;
    }
    let (mut name, mut filename) = ([0u64; 2], [0u64; 2]);
    if code_check_needs_strings(layout, &window) {
        let (name_ptr, filename_ptr) = code_check_strings(layout, &window);
        name = read_str_key(mem, name_ptr.wrapping_add(layout.check_str as u64));
        filename = read_str_key(mem, filename_ptr.wrapping_add(layout.check_str as u64));
    }
    code_check(layout, &window, name, filename)
}

/// A `str`'s (length, cached hash), or zeros when unreadable (as in the kernel).
fn read_str_key(mem: &ProcessMemory, address: u64) -> [u64; 2] {
    let mut bytes = [0u8; 16];
    if mem.read(address, &mut bytes).is_err() {
        return [0, 0];
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
    [word(0), word(8)]
}
