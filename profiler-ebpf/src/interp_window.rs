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

use aya_ebpf::helpers::{bpf_probe_read_user, generated};
use profiler_common::{NO_FIELD, ProcessInfo, code_generation, gc_check};

/// The longest span read at once (a power of two).
pub const INTERP_WINDOW_BYTES: usize = 512;

/// Up to [`INTERP_WINDOW_BYTES`] of the sampled thread's interpreter state, read in this
/// program run; lives in the per-CPU scratch, `len == 0` when empty.
#[repr(C)]
pub struct InterpWindow {
    /// Target address of `bytes[0]`.
    address: u64,
    /// Valid bytes from `address`; 0: empty.
    len: u64,
    /// Room for any masked offset plus one u64.
    bytes: [u8; INTERP_WINDOW_BYTES + 8],
}

impl InterpWindow {
    /// Empties the window, then reads the span of interpreter `interp` that holds both the
    /// collector's flag and the code-object generation, when the process's layout has both
    /// as interpreter fields no more than [`INTERP_WINDOW_BYTES`] apart. Left empty otherwise
    /// or on a fault (each field is then read on its own).
    #[inline(always)]
    pub fn fill(&mut self, info: &ProcessInfo, interp: u64) {
        self.len = 0;
        if interp == 0
            || info.gc_check != gc_check::INTERP_FLAG
            || info.code_generation_kind != code_generation::FREED_IN_INTERP
            || info.tstate_interp == NO_FIELD
        {
            return;
        }
        let (flag, generation) = (info.gc_collecting, info.code_generation_at);
        let start = if flag < generation { flag } else { generation };
        let end = if flag + 4 > generation + 8 { flag + 4 } else { generation + 8 };
        let len = end.wrapping_sub(start);
        if len == 0 || len > INTERP_WINDOW_BYTES as u64 {
            return;
        }
        let address = interp.wrapping_add(start);
        // SAFETY: the helper writes at most `len` <= INTERP_WINDOW_BYTES bytes into `bytes`.
        let ret = unsafe {
            generated::bpf_probe_read_user(
                self.bytes.as_mut_ptr() as *mut core::ffi::c_void,
                (len as u32) & (2 * INTERP_WINDOW_BYTES as u32 - 1),
                address as *const core::ffi::c_void,
            )
        };
        if ret == 0 {
            self.address = address;
            self.len = len;
        }
    }

    /// Empties the window.
    #[inline(always)]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Offset in `bytes` of the `size` bytes at `address`, when the window holds them.
    #[inline(always)]
    fn offset_of(&self, address: u64, size: u64) -> Option<usize> {
        let offset = address.wrapping_sub(self.address);
        (self.len != 0 && address >= self.address && offset.checked_add(size)? <= self.len)
            .then_some(offset as usize & (INTERP_WINDOW_BYTES - 1))
    }

    /// The u32 at `address`: from the window when it holds it, else read from the target;
    /// `None` on a fault.
    #[inline(always)]
    pub fn u32_at(&self, address: u64) -> Option<u32> {
        match self.offset_of(address, 4) {
            // SAFETY: at < INTERP_WINDOW_BYTES and `bytes` has 8 bytes more than that.
            Some(at) => Some(unsafe { core::ptr::read_unaligned(self.bytes.as_ptr().add(at) as *const u32) }),
            // SAFETY: bpf_probe_read_user tolerates any address.
            None => unsafe { bpf_probe_read_user(address as *const u32) }.ok(),
        }
    }

    /// The u64 at `address`, as [`u32_at`](Self::u32_at).
    #[inline(always)]
    pub fn u64_at(&self, address: u64) -> Option<u64> {
        match self.offset_of(address, 8) {
            // SAFETY: as in `u32_at`.
            Some(at) => Some(unsafe { core::ptr::read_unaligned(self.bytes.as_ptr().add(at) as *const u64) }),
            // SAFETY: as in `u32_at`.
            None => unsafe { bpf_probe_read_user(address as *const u64) }.ok(),
        }
    }
}
