//! Stage 1, decode: a record's header and body → its full frames and native part, or the
//! outcome that ends the sample before any memory is read.
//!
//! Input: the header (checked by the session: a known kind, the registration's generation)
//! and the bytes after it. Output: a [`Decoded`] record, or `Err(outcome)` for a walk the
//! kernel could not finish (no thread state, no frame, a truncated or cyclic chain, a read
//! fault) and for a process whose interpreters cannot be told apart.

use profiler_common::{
    FRAME_ENTRY_SIZE, FrameEntry, FullFrames, INTERPRETER_UNKNOWN, MAX_FULL_FRAMES, SampleHeader, off_cpu_trailer, record_kind,
    sample_status,
};

use crate::stats::SampleOutcome;

/// A record whose walk is whole: what the later stages read of it.
pub(crate) struct Decoded<'a> {
    /// The full frames, leaf first.
    pub(crate) frames: FullFrames<'a>,
    /// `--native` / `--kernel` (`native`): the bytes after the full frames of a
    /// `CPU_SAMPLE_NATIVE` record (trailer, kernel addresses, user stack); else `None`.
    pub(crate) native_part: Option<&'a [u8]>,
    body: &'a [u8],
}

impl Decoded<'_> {
    /// Full frame `i` (0 is the leaf); `i` below `frames.len()`.
    #[inline]
    pub(crate) fn full(&self, i: usize) -> FrameEntry {
        self.frames.get(i).unwrap_or_default()
    }

    /// When the running task's chain was read (`--async`): the sample's time, or for an
    /// off-CPU interval the switch-out (its chain was read as the thread switched out).
    pub(crate) fn chain_time(&self, header: &SampleHeader) -> u64 {
        match header.kind {
            record_kind::OFF_CPU => off_cpu_trailer(header, self.body).map_or(0, |i| i.switched_out_ns),
            _ => header.time_ns,
        }
    }
}

/// Decodes one record (`body`: what follows `header`); `native`: the process gets native
/// frames (its native part is wanted).
pub(crate) fn decode<'a>(header: &SampleHeader, body: &'a [u8], native: bool) -> Result<Decoded<'a>, SampleOutcome> {
    if header.interpreter == INTERPRETER_UNKNOWN {
        return Err(SampleOutcome::SubinterpreterUnknown);
    }
    match header.status {
        sample_status::COMPLETE => {}
        sample_status::NO_THREAD_STATE => return Err(SampleOutcome::NoThreadState),
        sample_status::NO_FRAME => return Err(SampleOutcome::Idle),
        sample_status::TRUNCATED if full_frames_repeat(header, body) => return Err(SampleOutcome::CyclicChain),
        sample_status::TRUNCATED => return Err(SampleOutcome::Truncated),
        _ => return Err(SampleOutcome::KernelReadFault),
    }
    let native_part = (header.kind == record_kind::CPU_SAMPLE_NATIVE && native)
        .then(|| body.get(header.n_full as usize * FRAME_ENTRY_SIZE..))
        .flatten();
    Ok(Decoded { frames: FullFrames::new(header, body), native_part, body })
}

/// Whether the full frames of a record visit one frame address twice: the chain loops (a
/// forged or corrupt interpreter state), rather than being deeper than the kernel walks.
fn full_frames_repeat(header: &SampleHeader, body: &[u8]) -> bool {
    let frames = FullFrames::new(header, body);
    let n = frames.len();
    let mut addresses = [0u64; MAX_FULL_FRAMES];
    for (slot, entry) in addresses.iter_mut().zip(frames.iter()) {
        *slot = entry.frame;
    }
    let addresses = &mut addresses[..n];
    addresses.sort_unstable();
    addresses.windows(2).any(|w| w[0] == w[1])
}
