//! A span of target memory read in one helper call during this program run, then served
//! field by field: the thread state's first bytes (`thread_state::TstateBytes`) and the
//! interpreter fields a CPU sample reads (`interp_window::InterpWindow`).
//!
//! Every byte comes from this program run, read while the sampled thread is stopped: a field
//! served from the span is one the target held during the run, as a read of its own gives. A
//! field outside the span (or any field, when the span is empty) is read on its own.

use aya_ebpf::helpers::{bpf_probe_read_user, generated};

/// Up to `N - 8` bytes of target memory (`N - 8` a power of two; the 8 more bytes give room
/// for any masked offset plus one u64). Lives in the per-CPU scratch; `len == 0` when empty.
#[repr(C)]
pub struct TargetBytes<const N: usize> {
    /// Target address of `bytes[0]`.
    address: u64,
    /// Valid bytes from `address`; 0: empty.
    len: u64,
    bytes: [u8; N],
}

impl<const N: usize> TargetBytes<N> {
    /// The longest span read at once.
    pub const SPAN: usize = {
        assert!(N > 8 && (N - 8).is_power_of_two());
        N - 8
    };

    /// Empties the span.
    #[inline(always)]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Reads the `len` bytes at `address` (at most [`Self::SPAN`]); false (empty) on a fault
    /// or a longer `len`.
    #[inline(always)]
    pub fn read(&mut self, address: u64, len: u64) -> bool {
        self.len = 0;
        if len == 0 || len > Self::SPAN as u64 {
            return false;
        }
        // SAFETY: the helper writes at most `len` <= SPAN < N bytes into `bytes`.
        let ret = unsafe {
            generated::bpf_probe_read_user(
                self.bytes.as_mut_ptr() as *mut core::ffi::c_void,
                (len as u32) & (2 * Self::SPAN as u32 - 1),
                address as *const core::ffi::c_void,
            )
        };
        self.address = address;
        if ret == 0 {
            self.len = len;
        }
        ret == 0
    }

    /// Offset in `bytes` of the `size` bytes at `address`, when the span holds them.
    #[inline(always)]
    fn offset_of(&self, address: u64, size: u64) -> Option<usize> {
        let offset = address.wrapping_sub(self.address);
        (self.len != 0 && address >= self.address && offset.checked_add(size)? <= self.len)
            .then_some(offset as usize & (Self::SPAN - 1))
    }

    /// The u32 at `address`: from the span when it holds it, else read from the target;
    /// `None` on a fault.
    #[inline(always)]
    pub fn u32_at(&self, address: u64) -> Option<u32> {
        match self.offset_of(address, 4) {
            // SAFETY: at < SPAN and `bytes` has 8 bytes more than that.
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
