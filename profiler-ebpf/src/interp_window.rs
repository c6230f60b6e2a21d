//! The interpreter-state fields a CPU sample reads besides the thread state, in one helper
//! call where they lie close together.
//!
//! From 3.14 on a CPU sample reads two fields of its interpreter: the collector's
//! `collecting` flag (`gc::collecting`) and the code-object generation that keys the
//! kernel's validation-word cache (`sampling::code_generation`). In 3.14 and 3.15 they are a
//! few hundred bytes apart, and a helper read costs about the same up to 512 bytes as for 4,
//! so the span that holds both is read once. Every field outside the span is read on its own,
//! exactly as before.
//!
//! The bytes are read in this program run, before the frames, where the two single reads
//! were made: each value is one the target held during the run, as a read of its own gives.

use profiler_common::{ProcessInfo, code_generation, gc_check};

use crate::target_bytes::TargetBytes;

/// The longest span read at once (a power of two).
pub const INTERP_WINDOW_BYTES: usize = 512;

/// Up to [`INTERP_WINDOW_BYTES`] of the sampled thread's interpreter state, read in this
/// program run; lives in the per-CPU scratch.
#[repr(C)]
pub struct InterpWindow {
    bytes: TargetBytes<{ INTERP_WINDOW_BYTES + 8 }>,
}

impl InterpWindow {
    /// Empties the window, then reads the span of interpreter `interp` that holds both the
    /// collector's flag and the code-object generation, when the process's layout has both
    /// as interpreter fields no more than [`INTERP_WINDOW_BYTES`] apart. Left empty otherwise
    /// or on a fault (each field is then read on its own).
    #[inline(always)]
    pub fn fill(&mut self, info: &ProcessInfo, interp: u64) {
        self.bytes.clear();
        if interp == 0
            || info.gc_check != gc_check::INTERP_FLAG
            || info.code_generation_kind != code_generation::FREED_IN_INTERP
        {
            return;
        }
        let (flag, generation) = (info.gc_collecting, info.code_generation_at);
        let start = if flag < generation { flag } else { generation };
        let end = if flag + 4 > generation + 8 { flag + 4 } else { generation + 8 };
        self.bytes.read(interp.wrapping_add(start), end.wrapping_sub(start));
    }

    /// Empties the window.
    #[inline(always)]
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// The u32 at `address`: from the window when it holds it, else read from the target;
    /// `None` on a fault.
    #[inline(always)]
    pub fn u32_at(&self, address: u64) -> Option<u32> {
        self.bytes.u32_at(address)
    }

    /// The u64 at `address`, as [`u32_at`](Self::u32_at).
    #[inline(always)]
    pub fn u64_at(&self, address: u64) -> Option<u64> {
        self.bytes.u64_at(address)
    }
}
