//! Stage 3, symbolize: interpreter frames → the frames shown (function, file, line), through
//! the process's code-object cache (by address and validation word) and position cache (by
//! code object, word, instruction offset and owner), and the full-frames memo.
//!
//! Input: frame entries as the kernel (or the validated tail) saw them, each with the
//! validation word of its code object. Output: a frame id of the profile, `None` for a frame
//! CPython hides (shims, frames not started yet), or an error that drops the sample: the code
//! object is unreadable (`BadCode`), not the one the kernel saw (`Changed`), or the profile is
//! full. A code object read from memory is kept only if its word read before and after its
//! fields is the kernel's and it still looks alive (see `still_a_code_object`).

use std::sync::Arc;

use profiler_common::FrameEntry;

use super::{
    FrameError, FrameId, Target,
    aggregate::{FrameName, Profile},
    caches::{self},
    decode::Decoded,
    process::CodeEntry,
};
use crate::{
    sample::native_merge::WalkedFrame,
    target::symbolize::{self, SymbolError, TypeAddresses, read_code_check},
};

/// Stage 3 of the sample path (see `crate::sample`).
impl Target {
    /// The record's full frames, root first, onto `stack` (after the tail's), and with a
    /// native part each onto `walked`; taken whole from the full-frames memo when a record
    /// without native part repeats an earlier one's frames. Returns the bits of the full
    /// frames (bit `i`: full frame `i`, leaf first) that produced a frame of `stack`; sets
    /// `result` to the first frame's error (nothing is symbolized after an error).
    pub(crate) fn symbolize_full_frames(
        &mut self,
        record: &Decoded,
        profile: &mut Profile,
        stack: &mut Vec<FrameId>,
        walked: &mut Vec<WalkedFrame>,
        result: &mut Result<(), FrameError>,
    ) -> u64 {
        self.counters.frames_from_kernel += record.frames.len() as u64;
        // Bit i: full frame i (leaf first) produced a frame of `stack`.
        let mut shown = 0u64;
        // Without native frames (which need each frame's own entry), a record whose full
        // frames repeat an earlier one's takes its ids whole.
        let memo = result.is_ok() && record.native_part.is_none();
        let remembered = memo
            .then(|| {
                self.full_frames.set_key(record.frames.iter());
                self.full_frames.get()
            })
            .flatten();
        if let Some((ids, bits)) = remembered {
            stack.extend_from_slice(ids);
            shown = bits;
            self.counters.full_frames_memo_hits += 1;
        } else if result.is_ok() {
            let from = stack.len();
            for i in (0..record.frames.len()).rev() {
                let entry = record.full(i);
                let id = self.frame_id(&entry, entry.check, profile);
                if record.native_part.is_some() {
                    walked.push(WalkedFrame { address: entry.frame, id: id.as_ref().ok().copied().flatten(), owner: entry.owner, is_entry: entry.flags & profiler_common::frame_flags::ENTRY != 0 });
                }
                match id {
                    Ok(Some(id)) => {
                        stack.push(id);
                        shown |= 1 << i;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        *result = Err(e);
                        break;
                    }
                }
            }
            if memo && result.is_ok() {
                self.full_frames.insert(&stack[from..], shown);
                // The memo has its own cap; this keeps the process's sum within its budget.
                self.reserve(0);
            }
        }
        shown
    }

    /// The frame shown for one interpreter frame; `None` for frames CPython hides (shims,
    /// frames not started yet). `check` is the validation word the kernel saw for the frame's
    /// code object (carried by full frames, folded into the tail hash for the others).
    pub(crate) fn frame_id(&mut self, entry: &FrameEntry, check: u32, profile: &mut Profile) -> Result<Option<FrameId>, FrameError> {
        let semantics = self.process.layout.frame_semantics;
        if let Some(shim) = semantics.shim_owner {
            if entry.owner != u8::MAX && entry.owner >= shim {
                return Ok(None);
            }
        }
        let generator = semantics.owner_generator.is_some_and(|g| g == entry.owner);
        // A thread's own bytecode copy (free-threaded builds): the offset made relative to
        // it; a frame whose copy cannot be trusted is shown without a line.
        let offset = match self.instr_offset(entry, check) {
            Some(offset) => offset,
            None => {
                let code = self.code_entry(entry, check)?;
                let info = &code.info;
                let line = profile.line_numbers().pick(|| 0, info.firstlineno);
                let name = FrameName { function: info.qualname.clone(), file: info.filename.clone(), line, native: None };
                return Ok(Some(profile.try_intern(name).ok_or(FrameError::ProfileFull)?));
            }
        };
        if let Some(id) = self.positions.get(&(entry.code, check, offset, generator)) {
            self.counters.code_cache_hits += 1;
            return Ok(*id);
        }
        let code = self.code_entry(entry, check)?;
        let key = (entry.code, code.check, offset, generator);
        if let Some(id) = self.positions.get(&key) {
            return Ok(*id);
        }
        let info = &code.info;
        let incomplete = !generator
            && self.process.layout.code.firsttraceable.is_some()
            && (offset as i64) < 2 * info.firsttraceable as i64;
        let id = if incomplete {
            None
        } else {
            let line = profile.line_numbers().pick(|| info.line(offset).unwrap_or(0), info.firstlineno);
            let name = FrameName { function: info.qualname.clone(), file: info.filename.clone(), line, native: None };
            Some(profile.try_intern(name).ok_or(FrameError::ProfileFull)?)
        };
        self.reserve(caches::position_bytes());
        self.positions.insert(key, id, caches::position_bytes());
        Ok(id)
    }

    /// The frame's instruction offset in its code object's own bytecode: as the kernel sent
    /// it, or rebased from the thread's copy (free-threaded builds, `tlbc_index != 0`);
    /// `None` (counted) when that copy cannot be trusted (`symbolize::tlbc`).
    fn instr_offset(&mut self, entry: &FrameEntry, check: u32) -> Option<i32> {
        if entry.tlbc_index == 0 {
            return Some(entry.instr_offset);
        }
        let Some(layout) = self.process.layout.tlbc else {
            self.counters.tlbc_unresolved += 1;
            return None;
        };
        let head = self.registered.interpreters_head_addr;
        let frame = (entry.code, check, entry.tlbc_index, entry.instr_offset);
        match self.tlbc.rebase(&self.mem, &layout, head, frame, self.tlbc_generation) {
            Ok(offset) => {
                self.counters.tlbc_rebased += 1;
                Some(offset)
            }
            Err(_) => {
                self.counters.tlbc_unresolved += 1;
                None
            }
        }
    }

    /// Keeps a code object the kernel copied at sample time (`CodeSnapshot`), which comes
    /// before the records whose frames need it: they find it in the cache under the word the
    /// kernel computed from the same bytes, even if the code object is gone by then. A
    /// snapshot that does not decode (counted) leaves those frames to a read of live memory.
    pub(crate) fn add_snapshot(&mut self, record: &[u8]) {
        let types = TypeAddresses {
            code: self.process.code_type_address,
            str: self.process.str_type_address,
            bytes: self.process.bytes_type_address,
        };
        match symbolize::decode_snapshot(record, &self.process.layout, &types, &self.mem) {
            Ok(snap) => {
                self.counters.code_snapshots += 1;
                let code = Arc::new(CodeEntry { info: snap.info, check: snap.check });
                let bytes = caches::code_bytes(&code.info);
                self.reserve(bytes);
                self.codes.insert(snap.code, code, bytes);
                self.account();
            }
            Err(_) => self.counters.code_snapshots_bad += 1,
        }
    }

    /// Whether the object at `address` still looks alive as a code object after its fields
    /// and strings were read. A code object freed meanwhile keeps its validation word (freed
    /// memory is not cleared) while its name may already be another object's memory; but the
    /// allocator writes its free-list links over the object's head: glibc's over the type
    /// word, pymalloc's over the reference count (`ObjectLayout::live_count`).
    fn still_a_code_object(&self, address: u64) -> bool {
        let objects = &self.process.layout.objects;
        let mut head = [0u8; 32];
        let Some(head) = head.get_mut(..objects.ob_type as usize + 8) else { return false };
        if self.mem.read(address, head).is_err() {
            return false;
        }
        let ob_type = crate::target::memory::field_u64(head, objects.ob_type as usize);
        ob_type == Some(self.process.code_type_address) && objects.live_count(head, 1 << 40)
    }

    /// The frame's code object, from the cache when its validation word matches `expected`
    /// (the kernel's), else read again; an error when what is in memory now is not what the
    /// kernel saw.
    pub(crate) fn code_entry(&mut self, entry: &FrameEntry, expected: u32) -> Result<Arc<CodeEntry>, FrameError> {
        let address = entry.code;
        if let Some(code) = self.codes.get(&address) {
            if expected == code.check {
                self.counters.code_cache_hits += 1;
                return Ok(code.clone());
            }
            // Freed and replaced by another code object since we read it.
            self.counters.stale_invalidations += 1;
        }
        self.counters.code_cache_misses += 1;
        // The word before and after reading the fields: equal, the fields belong to one code
        // object with that word (the kernel's, or the sample is dropped below).
        let before = read_code_check(&self.mem, &self.kernel_frame, entry);
        let types = TypeAddresses {
            code: self.process.code_type_address,
            str: self.process.str_type_address,
            bytes: self.process.bytes_type_address,
        };
        let info = symbolize::read_code(&self.mem, &self.process.layout, &types, address)
            .map_err(|_: SymbolError| FrameError::BadCode)?;
        let after = read_code_check(&self.mem, &self.kernel_frame, entry);
        if after != before || !self.still_a_code_object(address) {
            return Err(FrameError::Changed);
        }
        let code = Arc::new(CodeEntry { info, check: after });
        let bytes = caches::code_bytes(&code.info);
        self.reserve(bytes);
        self.codes.insert(address, code.clone(), bytes);
        if expected != after {
            // It changed again after the sample: what we read is not what was sampled.
            return Err(FrameError::Changed);
        }
        Ok(code)
    }
}
