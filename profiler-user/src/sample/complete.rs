//! Completing stacks deeper than the kernel's full frames, through a validated frame cache.
//!
//! The kernel ships the leading frames of a sample in full and, for the frames below them,
//! only the address of the first one, their count and `frame_hash` folded over all of them
//! (the "tail"). A tail is accepted only if it hashes exactly like the kernel's walk of the
//! same thread at the instant of the sample:
//! - full hit: the tail cached under (first frame, count, hash) was itself validated against
//!   that same hash when it was built, so it is the same sequence of frames;
//! - partial hit: frames are read from target memory until one starts a cached suffix with
//!   the right number of frames below it; the suffix is accepted only if the frames read so
//!   far followed by it fold to the kernel's hash;
//! - miss: the whole tail is read from memory and kept only if it hashes the same.
//!
//! Two call chains that reuse frame addresses therefore never splice: any difference in a
//! frame's address, code object address, instruction offset, owner or code-object validation
//! word (`profiler_common::code_check`, which the kernel computes for every tail frame too)
//! changes the hash, and a tail that does not hash like the kernel's walk is dropped, never
//! emitted. A function replaced by a same-named one at the same address (a module reload)
//! below the full frames is therefore caught like one among them. Every cached frame keeps
//! the check it was validated with, so its symbols are looked up under that check.

use std::{cell::OnceCell, rc::Rc};

// foldhash, seeded at random per process (keys come from targets): looked up per deep sample.
use hashbrown::HashMap;

use profiler_common::{
    FRAME_READ_MAX, FrameBytes, FrameEntry, FrameLayout, HASH_SEED, SampleHeader, code_check_applies, decode_frame,
    frame_hash,
};

use super::{FrameError, FrameId, Target, aggregate::Profile, decode::Decoded};
// At its path from before it moved to `symbolize` (for `dump`).
pub use crate::target::symbolize::read_code_check;
use crate::{
    target::memory::{Chain, ProcessMemory},
    sample::native_merge::WalkedFrame,
    stats::SampleOutcome,
};

/// Bytes of cached tails kept per process (see `TailCache::bytes`) before the cache is
/// emptied.
const MAX_TAIL_BYTES: usize = 8 << 20;
/// Tails kept per process before the cache is emptied.
const MAX_TAILS: usize = 8192;
/// Frames of a tail read from memory in one round trip (`ProcessMemory::read_chain`): the
/// frames of a changing stack must all be read before it changes (a leaf that returns
/// within a millisecond, like the recursion of `cargo xtask test-kernels`), while a cached
/// suffix found part way wastes at most this many reads.
const CHAIN_PIECE: usize = 64;
/// Accounted per cached frame: the entry in its tail, its shown id once symbolized, and its
/// `suffixes` entry (key, tail pointer, index, control byte, spare capacity).
const FRAME_BYTES: usize = std::mem::size_of::<FrameEntry>() + std::mem::size_of::<FrameId>() + 48;
/// Accounted per cached tail: its `tails` entry and the shared allocation (counts, header,
/// the frames' and symbols' allocation headers).
const TAIL_BYTES: usize = 128;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompletionError {
    #[error("a frame of the tail could not be read")]
    Unreadable,
    /// Not in the cache, and reading was not allowed (its record waited too long).
    #[error("the tail is not cached and its record is too old to read it")]
    TooLate,
    #[error("the tail read from memory does not match the kernel's walk")]
    Mismatch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TailKey {
    first: u64,
    count: u32,
    hash: u64,
}

/// A validated tail, and its symbolized form once computed.
#[derive(Debug)]
pub struct CachedTail {
    /// Frames below the kernel's full frames, leaf-most first.
    pub frames: Box<[FrameEntry]>,
    /// The frames as shown (root first, hidden frames left out), filled on first use.
    pub symbols: OnceCell<Box<[FrameId]>>,
}

/// How a tail was completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailSource {
    /// Entirely from the cache.
    Hit,
    /// Some frames read from memory, the rest from a cached suffix.
    Partial,
    /// Entirely read from memory.
    Miss,
}

/// A completed tail.
pub struct Tail {
    pub tail: Rc<CachedTail>,
    pub source: TailSource,
    /// Frames read from target memory for this completion.
    pub frames_from_memory: usize,
}

/// Validated tails of one process.
#[derive(Default)]
pub struct TailCache {
    tails: HashMap<TailKey, Rc<CachedTail>>,
    /// (frame address, frames from it to the bottom) → a cached tail holding that suffix and
    /// the suffix's index in it.
    suffixes: HashMap<(u64, u32), (Rc<CachedTail>, u32)>,
    cached_frames: usize,
    /// Times the cache was emptied to stay within its bounds.
    pub evictions: u64,
}

impl TailCache {
    /// The `count` frames starting at `first` whose `frame_hash` fold is `hash`; read from
    /// `mem` (when not cached) only if `may_read`.
    pub fn complete(
        &mut self,
        mem: &ProcessMemory,
        layout: &FrameLayout,
        (first, count, hash): (u64, u32, u64),
        may_read: bool,
    ) -> Result<Tail, CompletionError> {
        let key = TailKey { first, count, hash };
        if let Some(tail) = self.tails.get(&key) {
            return Ok(Tail { tail: tail.clone(), source: TailSource::Hit, frames_from_memory: 0 });
        }
        if !may_read {
            return Err(CompletionError::TooLate);
        }
        let mut frames: Vec<FrameEntry> = Vec::with_capacity(count as usize);
        let mut running = HASH_SEED;
        let mut address = first;
        let mut source = TailSource::Miss;
        let mut read = 0usize;
        let size = (layout.read_size as usize).min(FRAME_READ_MAX);
        // The check of the last code object read, by address (recursion repeats it; if the
        // object changed meanwhile, the kernel's first read of it already differs and so
        // does the hash).
        let mut last: Option<(u64, u32)> = None;
        // Frames read ahead by the last chain read, not yet taken (indexes into `chain`).
        let mut chain: Vec<u8> = Vec::new();
        let mut pending = 0..0;
        while frames.len() < count as usize {
            if address == 0 {
                return Err(CompletionError::Mismatch);
            }
            let remaining = count - frames.len() as u32;
            if let Some((cached, start)) = self.suffixes.get(&(address, remaining)) {
                let suffix = &cached.frames[*start as usize..];
                let folded = suffix.iter().fold(running, frame_hash);
                if suffix.len() == remaining as usize && folded == hash {
                    frames.extend_from_slice(suffix);
                    running = folded;
                    address = 0;
                    source = TailSource::Partial;
                    break;
                }
            }
            if pending.is_empty() {
                // The next frames in one chain read: one round trip for up to CHAIN_PIECE.
                let piece = Chain { size, link: layout.previous as usize, max: (remaining as usize).min(CHAIN_PIECE) };
                mem.read_chain(address, piece, &mut chain).map_err(|_| CompletionError::Unreadable)?;
                pending = 0..chain.len() / size;
            }
            let Some(bytes) = pending.next().and_then(|at| chain.get(at * size..(at + 1) * size)) else {
                return Err(CompletionError::Unreadable);
            };
            let mut buf: FrameBytes = [0; FRAME_READ_MAX + 8];
            buf[..size].copy_from_slice(bytes);
            read += 1;
            let mut entry = FrameEntry::default();
            let previous = decode_frame(layout, address, &buf, &mut entry);
            entry.check = match last {
                Some((code, check)) if code == entry.code && code_check_applies(layout, &entry) => check,
                _ => {
                    let check = read_code_check(mem, layout, &entry);
                    if code_check_applies(layout, &entry) {
                        last = Some((entry.code, check));
                    }
                    check
                }
            };
            running = frame_hash(running, &entry);
            frames.push(entry);
            address = previous;
        }
        if address != 0 || running != hash {
            return Err(CompletionError::Mismatch);
        }
        let tail = Rc::new(CachedTail { frames: frames.into_boxed_slice(), symbols: OnceCell::new() });
        self.insert(key, tail.clone());
        Ok(Tail { tail, source, frames_from_memory: read })
    }

    /// Accounted bytes held: a fixed amount per tail and per frame (`TAIL_BYTES`,
    /// `FRAME_BYTES`), never below what the maps and tails hold while their spare capacity
    /// stays under the hash maps' usual load.
    pub fn bytes(&self) -> usize {
        self.tails.len() * TAIL_BYTES + self.cached_frames * FRAME_BYTES
    }

    /// Empties the cache and frees its memory (the maps' capacity too).
    pub fn clear(&mut self) {
        self.tails = HashMap::new();
        self.suffixes = HashMap::new();
        self.cached_frames = 0;
    }

    fn insert(&mut self, key: TailKey, tail: Rc<CachedTail>) {
        let n = tail.frames.len();
        if self.tails.len() >= MAX_TAILS || self.bytes() + TAIL_BYTES + n * FRAME_BYTES > MAX_TAIL_BYTES {
            self.clear();
            self.evictions += 1;
        }
        self.cached_frames += n;
        for (i, frame) in tail.frames.iter().enumerate() {
            self.suffixes.insert((frame.frame, (n - i) as u32), (tail.clone(), i as u32));
        }
        self.tails.insert(key, tail);
    }
}


/// Stage 2 of the sample path (see `crate::sample`).
impl Target {
    /// Complete: the frames the kernel only hashed (`header.n_hashed` below the full ones,
    /// from `tail_first`), from the validated tail cache or read again from the target.
    ///
    /// Input: the header's tail (`tail_first`, `n_hashed`, `tail_hash`); `stack` and
    /// `walked` empty. Output: the tail's shown frames on `stack` (root first), and with a
    /// native part every interpreter frame of it on `walked`; `Ok(Err(_))` when one of its
    /// frames cannot be shown (the sample's outcome, decided at aggregation);
    /// `Err(StaleTail)` when the tail in memory is no longer the one the kernel hashed.
    pub(crate) fn complete(
        &mut self,
        header: &SampleHeader,
        record: &Decoded,
        profile: &mut Profile,
        stack: &mut Vec<FrameId>,
        walked: &mut Vec<WalkedFrame>,
    ) -> Result<Result<(), FrameError>, SampleOutcome> {
        let mut result = Ok(());
        if header.n_hashed == 0 {
            return Ok(result);
        }
        let layout = self.kernel_frame;
        let evictions = self.tails.evictions;
        let tail = match self.tails.complete(&self.mem, &layout, (header.tail_first, header.n_hashed, header.tail_hash), self.read_tails) {
            Ok(tail) => tail,
            Err(e) => {
                if e == CompletionError::TooLate {
                    self.counters.tails_too_late += 1;
                }
                return Err(SampleOutcome::StaleTail);
            }
        };
        self.counters.cache_evictions += self.tails.evictions - evictions;
        // The tail cache has its own bound; this keeps the process's sum within its budget.
        self.reserve(0);
        match tail.source {
            TailSource::Hit => self.counters.frame_cache_hits += 1,
            TailSource::Partial => self.counters.frame_cache_partial_hits += 1,
            TailSource::Miss => self.counters.frame_cache_misses += 1,
        }
        self.counters.frames_from_memory += tail.frames_from_memory as u64;
        self.counters.frames_from_cache += (tail.tail.frames.len() - tail.frames_from_memory) as u64;
        match tail.tail.symbols.get() {
            Some(ids) if record.native_part.is_none() => stack.extend_from_slice(ids),
            _ => {
                // Each tail frame carries the check it was validated with (part of the hash).
                for entry in tail.tail.frames.iter().rev() {
                    let shown = self.frame_id(entry, entry.check, profile);
                    if record.native_part.is_some() {
                        walked.push(WalkedFrame { address: entry.frame, id: shown.as_ref().ok().copied().flatten(), owner: entry.owner, is_entry: entry.flags & profiler_common::frame_flags::ENTRY != 0 });
                    }
                    match shown {
                        Ok(Some(id)) => stack.push(id),
                        Ok(None) => {}
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
                if result.is_ok() && tail.tail.symbols.get().is_none() {
                    let _ = tail.tail.symbols.set(stack.as_slice().into());
                }
            }
        }
        Ok(result)
    }
}

