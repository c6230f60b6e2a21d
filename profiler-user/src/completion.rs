//! Completing stacks deeper than the kernel's full frames, through a validated frame cache.
//!
//! The kernel ships the leading frames of a sample in full and, for the frames below them,
//! only the address of the first one, their count and `frame_hash` folded over all of them
//! (the "tail"). A tail is accepted only if it hashes exactly like the kernel's walk of the
//! same thread at the instant of the sample:
//! - on a cache hit, the tail cached under (first frame, count, hash) was itself validated
//!   against that same hash when it was read, so it is the same sequence of frames;
//! - on a miss, the tail is read from target memory, and kept only if its hash matches.
//!
//! Two call chains that reuse frame addresses therefore never splice: any difference in a
//! frame's address, code object, instruction offset or owner changes the hash.

use std::{collections::HashMap, sync::Arc};

use profiler_common::{FrameBytes, FrameEntry, FrameLayout, HASH_SEED, decode_frame, frame_hash};

use crate::memory::ProcessMemory;

/// Tails kept per process before the cache is emptied and refilled.
const MAX_TAILS: usize = 4096;
/// Frames kept per process (summed over the cached tails).
const MAX_CACHED_FRAMES: usize = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompletionError {
    #[error("a frame of the tail could not be read")]
    Unreadable,
    #[error("the tail read from memory does not match the kernel's walk")]
    Mismatch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TailKey {
    first: u64,
    count: u32,
    hash: u64,
}

/// Validated tails of one process.
#[derive(Default)]
pub struct TailCache {
    tails: HashMap<TailKey, Arc<[FrameEntry]>>,
    cached_frames: usize,
}

/// A completed tail and where it came from.
pub struct Tail {
    /// Frames below the kernel's full frames, leaf-most first.
    pub frames: Arc<[FrameEntry]>,
    pub from_cache: bool,
}

impl TailCache {
    /// The `count` frames starting at `first` whose `frame_hash` fold is `hash`.
    pub fn complete(
        &mut self,
        mem: &ProcessMemory,
        layout: &FrameLayout,
        first: u64,
        count: u32,
        hash: u64,
    ) -> Result<Tail, CompletionError> {
        let key = TailKey { first, count, hash };
        if let Some(frames) = self.tails.get(&key) {
            return Ok(Tail { frames: frames.clone(), from_cache: true });
        }
        let frames: Arc<[FrameEntry]> = read_tail(mem, layout, first, count, hash)?.into();
        if self.tails.len() >= MAX_TAILS || self.cached_frames + frames.len() > MAX_CACHED_FRAMES {
            self.tails.clear();
            self.cached_frames = 0;
        }
        self.cached_frames += frames.len();
        self.tails.insert(key, frames.clone());
        Ok(Tail { frames, from_cache: false })
    }
}

/// Reads `count` frames from `first` and checks them against the kernel's `hash`; the last
/// one must be the bottom of the stack (no previous frame), as it was for the kernel.
pub fn read_tail(
    mem: &ProcessMemory,
    layout: &FrameLayout,
    first: u64,
    count: u32,
    hash: u64,
) -> Result<Vec<FrameEntry>, CompletionError> {
    let mut frames = Vec::with_capacity(count as usize);
    let mut running = HASH_SEED;
    let mut address = first;
    let size = (layout.read_size as usize).min(profiler_common::FRAME_READ_MAX);
    for _ in 0..count {
        if address == 0 {
            return Err(CompletionError::Mismatch);
        }
        let mut buf: FrameBytes = [0; profiler_common::FRAME_READ_MAX + 8];
        mem.read(address, &mut buf[..size]).map_err(|_| CompletionError::Unreadable)?;
        let mut entry = FrameEntry::default();
        let previous = decode_frame(layout, address, &buf, &mut entry);
        running = frame_hash(running, &entry);
        frames.push(entry);
        address = previous;
    }
    if address != 0 || running != hash {
        return Err(CompletionError::Mismatch);
    }
    Ok(frames)
}
