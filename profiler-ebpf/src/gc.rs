//! `<GC>` frames: whether the sampled thread is running CPython's cyclic garbage collector,
//! read with the per-version numbers of `ProcessInfo::gc_*` (userspace's table `layout::gc`).
//!
//! The interpreter's `collecting` flag says that *a* collection is under way, not which
//! thread runs it; the collecting thread holds the GIL for the whole collection, so the flag
//! reading 1 and the sampled thread holding the GIL (`gil::holds_gil`) together say it is
//! this one. Where the GIL holder cannot be told, nothing is marked.

use profiler_common::{NO_FIELD, ProcessInfo, gc_check};

use crate::gil::holds_gil;
use crate::interp_window::InterpWindow;
use crate::thread_state::TstateBytes;

/// Whether the thread whose state is `tstate` (not 0; its first bytes in `bytes`) collects
/// garbage now. The flag comes from `window` when it holds it.
#[inline(always)]
pub fn collecting(info: &ProcessInfo, tstate: u64, bytes: &TstateBytes, window: &InterpWindow) -> bool {
    let flag = match info.gc_check {
        gc_check::RUNTIME_FLAG => info.gc_collecting,
        gc_check::INTERP_FLAG if info.tstate_interp != NO_FIELD => {
            let interp = bytes.field(tstate, info.tstate_interp);
            if interp == 0 {
                return false;
            }
            interp + info.gc_collecting
        }
        _ => return false,
    };
    // The flag is an `int` set to exactly 1 while collecting: any other value means the
    // numbers do not fit this build, and nothing is marked.
    window.u32_at(flag) == Some(1) && holds_gil(info, tstate) == Some(true)
}
