//! The shown frames of a record's full frames, remembered whole: a record whose full frames
//! repeat an earlier record's (a loop sampled again and again) gets its frame ids in one
//! lookup instead of one position lookup per frame.
//!
//! The key holds, per full frame, exactly what [`super::Target`]'s frame lookup
//! depends on: the code object's address, the validation word the kernel saw, the
//! instruction offset and the frame's owner (shims, generators). So a hit gives the ids that
//! looking the frames up one by one would give: the same position entries, under the same
//! validation words (a replaced code object has another word, and misses). Keys are compared
//! in full, never by hash alone. The memo holds ids of one profile epoch and is emptied with
//! the position cache; it has its own byte cap, past which it is emptied (and refills).

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};
use profiler_common::FrameEntry;

use super::FrameId;

/// Bytes the memo of one process may hold (within the process's cache budget).
const MEMO_BUDGET: usize = 2 << 20;
/// Accounted per entry beside its key and ids: the table slot and two allocation headers.
const ENTRY_OVERHEAD: usize = 64;
/// `u64` words of key per frame: the code address with the owner in its top byte, then the
/// instruction offset and the validation word.
const WORDS_PER_FRAME: usize = 2;
/// Where the owner goes in a frame's first key word.
const OWNER_SHIFT: u32 = 56;

struct Entry {
    key: Box<[u64]>,
    /// Root first, as they go on the stack.
    ids: Box<[FrameId]>,
    /// Bit i: full frame i (leaf first) produced one of `ids`.
    shown: u64,
}

/// Full frames → shown frame ids, for one process.
pub(crate) struct FullFramesMemo {
    table: HashTable<Entry>,
    hasher: DefaultHashBuilder,
    bytes: usize,
    /// The key of the record being looked up (scratch), and its hash.
    key: Vec<u64>,
    hash: u64,
    /// Whether `key` holds the last record's key (see [`FullFramesMemo::set_key`]).
    keyed: bool,
}

impl Default for FullFramesMemo {
    fn default() -> Self {
        Self { table: HashTable::new(), hasher: DefaultHashBuilder::default(), bytes: 0, key: Vec::new(), hash: 0, keyed: false }
    }
}

impl FullFramesMemo {
    /// Makes `frames` (a record's full frames, leaf first) the key of the next
    /// [`get`](Self::get) / [`insert`](Self::insert).
    /// False (no key: the record goes without the memo) when a code address has any of its
    /// top 8 bits set, where the key keeps the owner (user addresses never reach them).
    pub(super) fn set_key(&mut self, frames: impl Iterator<Item = FrameEntry>) -> bool {
        self.key.clear();
        self.keyed = false;
        for f in frames {
            // A free-threaded frame running a thread's own bytecode copy: its offset is
            // rebased per lookup, so such records are not memoized.
            if f.code >> OWNER_SHIFT != 0 || f.tlbc_index != 0 {
                return false;
            }
            let words: [u64; WORDS_PER_FRAME] =
                [f.code | (f.owner as u64) << OWNER_SHIFT, ((f.instr_offset as u32 as u64) << 32) | f.check as u64];
            self.key.extend_from_slice(&words);
        }
        self.hash = self.hasher.hash_one(self.key.as_slice());
        self.keyed = true;
        true
    }

    /// The ids (root first) and the shown bits remembered for the key.
    pub(super) fn get(&self) -> Option<(&[FrameId], u64)> {
        if !self.keyed {
            return None;
        }
        let key = self.key.as_slice();
        self.table.find(self.hash, |e| *e.key == *key).map(|e| (&*e.ids, e.shown))
    }

    /// Remembers `ids` (root first) and `shown` for the key.
    pub(super) fn insert(&mut self, ids: &[FrameId], shown: u64) {
        if !self.keyed {
            return;
        }
        let cost = self.key.len() * 8 + std::mem::size_of_val(ids) + ENTRY_OVERHEAD;
        if self.bytes.saturating_add(cost) > MEMO_BUDGET {
            self.clear();
        }
        let entry = Entry { key: self.key.as_slice().into(), ids: ids.into(), shown };
        let hasher = &self.hasher;
        self.table.insert_unique(self.hash, entry, |e| hasher.hash_one(&*e.key));
        self.bytes += cost;
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Empties the memo and frees its memory.
    pub(super) fn clear(&mut self) {
        self.table = HashTable::new();
        self.bytes = 0;
    }
}

/// Frames of a record a key covers: `WORDS_PER_FRAME` words each.
#[cfg(test)]
fn frames_in(memo: &FullFramesMemo) -> usize {
    memo.key.len() / WORDS_PER_FRAME
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(code: u64, offset: i32, check: u32, owner: u8) -> FrameEntry {
        FrameEntry { frame: 0x1000 + code, code, instr_offset: offset, check, owner, ..Default::default() }
    }

    /// A hit needs every keyed field of every frame equal; the frame address is not keyed.
    #[test]
    fn hits_only_on_equal_code_offset_check_and_owner() {
        let mut memo = FullFramesMemo::default();
        let frames = [frame(0x10, 4, 7, 0), frame(0x20, 8, 9, 0)];
        memo.set_key(frames.iter().copied());
        assert_eq!(frames_in(&memo), 2);
        assert!(memo.get().is_none());
        let ids = [3 as FrameId, 5];
        memo.insert(&ids, 0b11);
        let before = memo.bytes();
        memo.set_key(frames.iter().map(|f| FrameEntry { frame: 0x9999, ..*f }));
        assert_eq!(memo.get(), Some((&ids[..], 0b11)));
        for changed in [
            frame(0x11, 4, 7, 0),
            frame(0x10, 6, 7, 0),
            frame(0x10, 4, 8, 0),
            frame(0x10, 4, 7, 1),
        ] {
            memo.set_key([changed, frames[1]].into_iter());
            assert!(memo.get().is_none(), "{changed:?}");
        }
        memo.set_key(frames[..1].iter().copied());
        assert!(memo.get().is_none(), "a prefix is another key");
        assert!(!memo.set_key([frame(1 << 56, 4, 7, 0)].into_iter()));
        assert!(memo.get().is_none(), "no key for an address with its top byte set");
        memo.insert(&ids, 0b11);
        assert_eq!(memo.bytes(), before, "nor an entry");
    }

    /// Past its cap the memo empties itself before taking more.
    #[test]
    fn stays_within_its_budget() {
        let mut memo = FullFramesMemo::default();
        for code in 0..100_000u64 {
            memo.set_key([frame(code, 0, 1, 0)].into_iter());
            memo.insert(&[1], 1);
            assert!(memo.bytes() <= MEMO_BUDGET);
        }
        memo.clear();
        assert_eq!(memo.bytes(), 0);
    }
}
