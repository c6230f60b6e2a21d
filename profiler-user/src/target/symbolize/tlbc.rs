//! Thread-local bytecode (free-threaded builds, PEP 703): each thread but the first runs its
//! own copy of a code object's bytecode, `co_tlbc->entries[tlbc_index]`, and its frames'
//! instruction pointers point into that copy. The kernel sends every instruction offset
//! relative to the code object's own bytecode (`co_code_adaptive`), so an offset of a frame
//! whose `tlbc_index` is not 0 is rebased here against its copy before a line is looked up.
//!
//! Invariants:
//! - A copy's address is trusted only for the index-pool generation it was read under
//!   (`tlbc_indices.tlbc_generation`, which the interpreter moves on every allocation and
//!   release of an index): read before and after, and equal to the generation the kernel
//!   read at sample time. Then no thread came or went between the sample and the read, so
//!   index `i` belonged to the same thread, whose copy lives as long as its index is held.
//! - A rebased offset lies inside the code object's bytecode (`0 <= offset < 2 * Py_SIZE`)
//!   and is even; anything else is "unresolved": the frame is shown without a line, never
//!   with another line, and counted.
//! - At most [`MAX_BASES`] copies are remembered per process, all of one generation.

use std::collections::HashMap;

pub use crate::target::layout::TlbcLayout;
use crate::target::memory::{MemoryError, ReadMemory};

/// The most copies remembered per process (about 40 bytes each); past it the table starts
/// again empty.
pub const MAX_BASES: usize = 8192;

/// Indices past this are not looked up (a thread index is small: one per live thread).
const MAX_INDEX: u32 = 1 << 16;

/// Why an offset was not rebased (each shown without a line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// The generation moved between the sample and the read, or the kernel did not read it,
    /// or the sample's thread was not of the main interpreter.
    GenerationMoved,
    /// The array, its entry or the code object's size did not read, or were implausible.
    Unreadable,
    /// The rebased offset falls outside the code object's bytecode.
    OutOfRange,
}

/// The bases of one process's bytecode copies, by (code object, validation word, index),
/// for one generation.
#[derive(Default)]
pub struct TlbcBases {
    generation: u32,
    /// (code, check, index) → (copy's address, bytecode length in bytes).
    bases: HashMap<(u64, u32, u32), (u64, u64)>,
    /// The main interpreter's address, once found.
    main_interp: Option<u64>,
}

impl TlbcBases {
    /// The offset of a frame of code object `code` (validation word `check`), sent by the
    /// kernel as `raw` (relative to `co_code_adaptive`) with index `index`, taken when the
    /// generation was `sampled` (0: not read). `interpreters_head` is the address of
    /// `_PyRuntime.interpreters.head`.
    pub fn rebase(
        &mut self,
        mem: &dyn ReadMemory,
        layout: &TlbcLayout,
        interpreters_head: u64,
        (code, check, index, raw): (u64, u32, u32, i32),
        sampled: u32,
    ) -> Result<i32, Unresolved> {
        if index == 0 {
            return Ok(raw);
        }
        if sampled == 0 || index >= MAX_INDEX {
            return Err(Unresolved::GenerationMoved);
        }
        let key = (code, check, index);
        let found = if sampled == self.generation { self.bases.get(&key).copied() } else { None };
        let (base, len) = match found {
            Some(found) => found,
            None => {
                let interp = self.main_interp(mem, layout.interp_next, interpreters_head).ok_or(Unresolved::Unreadable)?;
                let generation_at = interp.wrapping_add(u64::from(layout.generation));
                let now = read_u32(mem, generation_at).map_err(|_| Unresolved::Unreadable)?;
                if now != sampled {
                    return Err(Unresolved::GenerationMoved);
                }
                let found = read_base(mem, layout, code, index)?;
                if read_u32(mem, generation_at).map_err(|_| Unresolved::Unreadable)? != sampled {
                    return Err(Unresolved::GenerationMoved);
                }
                if self.generation != sampled || self.bases.len() >= MAX_BASES {
                    self.bases.clear();
                    self.generation = sampled;
                }
                self.bases.insert(key, found);
                found
            }
        };
        rebased(raw, code, layout.code_adaptive, base, len)
    }

    /// The main interpreter's generation now (0 when it does not read): what a reader of
    /// live frames (not of samples) passes to [`rebase`](Self::rebase), read before the
    /// frames.
    pub fn generation_now(&mut self, mem: &dyn ReadMemory, layout: &TlbcLayout, interpreters_head: u64) -> u32 {
        let Some(interp) = self.main_interp(mem, layout.interp_next, interpreters_head) else { return 0 };
        read_u32(mem, interp.wrapping_add(u64::from(layout.generation))).unwrap_or(0)
    }

    /// The main interpreter (the last of the list, which lives as long as the process).
    fn main_interp(&mut self, mem: &dyn ReadMemory, next_at: u32, interpreters_head: u64) -> Option<u64> {
        if self.main_interp.is_some() {
            return self.main_interp;
        }
        // A bounded walk to the end of the list.
        let mut interp = mem.read_u64(interpreters_head).ok()?;
        for _ in 0..64 {
            if interp == 0 {
                return None;
            }
            let next = mem.read_u64(interp.wrapping_add(u64::from(next_at))).ok()?;
            if next == 0 {
                self.main_interp = Some(interp);
                return self.main_interp;
            }
            interp = next;
        }
        None
    }
}

fn read_u32(mem: &dyn ReadMemory, address: u64) -> Result<u32, MemoryError> {
    let mut b = [0u8; 4];
    mem.read_into(address, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// The address of copy `index` of code object `code`, and the bytecode's length in bytes.
fn read_base(mem: &dyn ReadMemory, layout: &TlbcLayout, code: u64, index: u32) -> Result<(u64, u64), Unresolved> {
    let bad = |_| Unresolved::Unreadable;
    let array = mem.read_u64(code.wrapping_add(u64::from(layout.code_tlbc))).map_err(bad)?;
    let size = mem.read_u64(array).map_err(bad)?;
    // `Py_ssize_t size`: at least the thread's index + 1 (the array only grows).
    if array == 0 || size > u64::from(MAX_INDEX) || u64::from(index) >= size {
        return Err(Unresolved::Unreadable);
    }
    let base = mem.read_u64(array.wrapping_add(8).wrapping_add(8 * u64::from(index))).map_err(bad)?;
    let units = mem.read_u64(code.wrapping_add(u64::from(layout.code_size))).map_err(bad)?;
    if base == 0 || units == 0 || units > 1 << 28 {
        return Err(Unresolved::Unreadable);
    }
    Ok((base, units * 2))
}

/// `raw` (relative to the code object's own bytecode at `code + code_adaptive`) made
/// relative to the copy at `base`: exact in 32 bits, as the true offset fits in them.
fn rebased(raw: i32, code: u64, code_adaptive: u32, base: u64, len: u64) -> Result<i32, Unresolved> {
    let own = code.wrapping_add(u64::from(code_adaptive));
    let offset = (raw as u32).wrapping_add(own.wrapping_sub(base) as u32) as i32;
    if offset < 0 || offset as u64 >= len || offset % 2 != 0 {
        return Err(Unresolved::OutOfRange);
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Memory of (address, bytes) pieces, the latest first.
    struct Fake {
        pieces: RefCell<Vec<(u64, Vec<u8>)>>,
    }

    impl Fake {
        fn put(&self, address: u64, bytes: &[u8]) {
            self.pieces.borrow_mut().push((address, bytes.to_vec()));
        }
    }

    impl ReadMemory for Fake {
        fn read_into(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
            for (start, bytes) in self.pieces.borrow().iter().rev() {
                if address >= *start && address + buf.len() as u64 <= start + bytes.len() as u64 {
                    let from = (address - start) as usize;
                    buf.copy_from_slice(&bytes[from..from + buf.len()]);
                    return Ok(());
                }
            }
            Err(MemoryError::NotCopied { address, len: buf.len() })
        }
        fn read_type_word(&self, address: u64) -> Result<u64, MemoryError> {
            self.read_u64(address)
        }
    }

    const LAYOUT: TlbcLayout = TlbcLayout { code_tlbc: 0xe0, code_adaptive: 0xe8, code_size: 0x20, generation: 0x40, interp_next: 0x18 };
    const HEAD: u64 = 0x1000;
    const INTERP: u64 = 0x2000;
    const CODE: u64 = 0x10_0000;
    const ARRAY: u64 = 0x20_0000;

    /// One interpreter at generation 5; a code object of 50 units whose copies 1 and 2 are
    /// at `below` (under the code object) and `above`.
    fn process(below: u64, above: u64) -> Fake {
        let f = Fake { pieces: RefCell::new(Vec::new()) };
        f.put(HEAD, &INTERP.to_le_bytes());
        f.put(INTERP + 0x18, &0u64.to_le_bytes());
        f.put(INTERP + 0x40, &5u32.to_le_bytes());
        f.put(CODE + 0x20, &50u64.to_le_bytes());
        f.put(CODE + 0xe0, &ARRAY.to_le_bytes());
        let mut array = 3u64.to_le_bytes().to_vec();
        for e in [CODE + 0xe8, below, above] {
            array.extend_from_slice(&e.to_le_bytes());
        }
        f.put(ARRAY, &array);
        f
    }

    /// The kernel's raw offset for an instruction at `offset` in the copy at `base`.
    fn raw(base: u64, offset: u64) -> i32 {
        (base + offset).wrapping_sub(CODE + 0xe8) as i32
    }

    #[test]
    fn index_zero_passes_through_and_copies_rebase_on_both_sides() {
        let (below, above) = (0x1000_0000, 0x7f00_0000_0000);
        let mem = process(below, above);
        let mut t = TlbcBases::default();
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 0, 24), 0), Ok(24), "index 0 needs nothing");
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 30)), 5), Ok(30));
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 2, raw(above, 98)), 5), Ok(98));
        // From the table now: the array is gone, the answer is the same.
        mem.put(CODE + 0xe0, &0u64.to_le_bytes());
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 2, raw(above, 4)), 5), Ok(4));
    }

    #[test]
    fn a_moved_generation_or_a_bad_array_is_unresolved() {
        let (below, above) = (0x1000_0000, 0x7f00_0000_0000);
        let mem = process(below, above);
        let mut t = TlbcBases::default();
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 2)), 4), Err(Unresolved::GenerationMoved));
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 2)), 0), Err(Unresolved::GenerationMoved));
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 3, raw(below, 2)), 5), Err(Unresolved::Unreadable), "index past size");
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 100)), 5), Err(Unresolved::OutOfRange), "past 50 units");
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 3)), 5), Err(Unresolved::OutOfRange), "odd");
        // A NULL entry (the thread has not run this code object yet).
        mem.put(ARRAY + 16, &0u64.to_le_bytes());
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 8, 1, raw(below, 2)), 5), Err(Unresolved::Unreadable));
    }

    #[test]
    fn a_new_generation_forgets_the_copies_of_the_old_one() {
        let (below, above) = (0x1000_0000, 0x7f00_0000_0000);
        let mem = process(below, above);
        let mut t = TlbcBases::default();
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 2)), 5), Ok(2));
        // A thread left and another took index 1: a new copy, generation 7.
        let moved: u64 = 0x3000_0000;
        mem.put(ARRAY + 16, &moved.to_le_bytes());
        mem.put(INTERP + 0x40, &7u32.to_le_bytes());
        // A sample of the old generation is no longer answered (its thread is gone).
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(below, 2)), 6), Err(Unresolved::GenerationMoved));
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(moved, 6)), 7), Ok(6));
        assert_eq!(t.generation, 7);
        assert_eq!(t.bases.len(), 1);
    }

    #[test]
    fn the_main_interpreter_is_the_last_of_the_list() {
        let mem = process(0x1000_0000, 0x2000_0000);
        // A subinterpreter at the head, the main one after it.
        mem.put(HEAD, &0x3000u64.to_le_bytes());
        mem.put(0x3000 + 0x18, &INTERP.to_le_bytes());
        mem.put(0x3000 + 0x40, &99u32.to_le_bytes());
        let mut t = TlbcBases::default();
        assert_eq!(t.rebase(&mem, &LAYOUT, HEAD, (CODE, 9, 1, raw(0x1000_0000, 2)), 5), Ok(2));
        assert_eq!(t.main_interp, Some(INTERP));
    }
}
