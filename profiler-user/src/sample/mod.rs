//! The per-sample path: what happens to one ring-buffer record of a profiled process, as
//! named stages, one file each, run in this order by [`Target::process_sample`]:
//!
//! 1. [`decode`]: the record's header and bytes → its full frames, or the outcome that
//!    ends it (no thread state, truncated, a cyclic chain, ...). No memory read.
//! 2. [`complete`]: the frames the kernel only hashed (below the first `MAX_FULL_FRAMES`) →
//!    their entries, from the validated frame cache or read again from the target, checked
//!    against the kernel's hash; a tail that changed ends the sample (`StaleTail`).
//! 3. [`symbolize`]: each interpreter frame → the frame shown (function, file, line), through
//!    the code-object and position caches; a code object that is not the one the kernel saw
//!    ends the sample.
//! 4. [`merge`]: the Python frames (root first) → the stack shown, with native frames spliced
//!    in (`--native`), the running asyncio task's chain in place of the event loop (`--async`),
//!    the interpreter, the leaf the charge names (`<off-cpu: ...>`, `<GC>`) and the kernel
//!    frames (`--kernel`) around them.
//! 5. [`aggregate`]: the stack and what the record is worth ([`Charge`]) → the profile (and
//!    the timeline, [`timeline`]), with the sample's outcome.
//!
//! [`native`] is one process's native side of its samples (unwinding, names, the splice of
//! [`native_merge`]), used by `merge`; [`hold`] keeps a `--native` process's first records
//! until its files are read.
//! Invariants of the whole path: nothing here blocks or reads files (the session's worker
//! runs it, never the drain thread); every read of target memory is within the sample's byte budget; a frame is shown
//! only when what was read is what the kernel saw (else the sample is dropped and counted).

use std::sync::Arc;

pub mod aggregate;
pub(crate) mod caches;
pub mod complete;
pub(crate) mod decode;
pub(crate) mod full_frames_memo;
pub(crate) mod hold;
pub(crate) mod merge;
pub mod native;
pub mod native_merge;
pub(crate) mod process;
pub(crate) mod symbolize;
pub mod timeline;

pub(crate) use process::Target;

/// Index of an interned [`FrameName`](aggregate::FrameName) within one
/// [`Profile`](aggregate::Profile); the timeline holds stacks of them too.
///
/// Ids are dense and assigned in interning order starting at 0, so they are only meaningful
/// for the profile that produced them.
pub type FrameId = u32;

/// What one record is worth in the profile: its value (1 sample, the sampling period, or an
/// off-CPU interval in nanoseconds), the frame added below its Python frames, if any
/// (`<off-cpu: sleep>`...), and with `--kernel` the kernel stack where an off-CPU interval
/// blocked (return addresses leaf first), shown above that frame.
#[derive(Clone, Debug)]
pub(crate) struct Charge {
    pub(crate) value: u64,
    pub(crate) leaf: Option<&'static str>,
    pub(crate) kernel: Option<Arc<[u64]>>,
}

impl Charge {
    /// A record worth `value`, with `leaf` below its Python frames and no kernel stack.
    pub(crate) fn new(value: u64, leaf: Option<&'static str>) -> Self {
        Charge { value, leaf, kernel: None }
    }
}

/// Why a frame could not be turned into a name.
pub(crate) enum FrameError {
    /// Not readable, or not a code object.
    BadCode,
    /// The code object at that address is not the one the kernel saw.
    Changed,
    /// The profile is at its byte budget and this frame is new to it.
    ProfileFull,
}
