//! One thread's Python stack, read consistently from a running target.
//!
//! The chain of frames is read twice (each frame: its address, code object, instruction
//! position, owner and the code object's validation word, `profiler_common::code_check`);
//! names, lines and locals are read between the two reads. The stack is accepted only if the
//! second read equals the first, frame for frame, except the position in the innermost frame
//! (a running thread moves on; the position shown is the second read's, whose frames below it
//! were identical before and after). Otherwise the whole read starts again, at most
//! [`MAX_ATTEMPTS`] times, and the thread is reported as not read consistently: a stack is
//! never put together from two moments.
//!
//! Memory: a frame shares its function and file names with every other frame of the same
//! code object (`Arc<str>`, one per code object read), and one dump holds at most
//! [`MAX_DUMP_BYTES`] of frames, names, line tables and locals in all (counted as they are
//! kept); a stack that would go past it is not shown, and says why.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use profiler_common::{FRAME_READ_MAX, FrameBytes, FrameEntry, FrameLayout, NO_FIELD, decode_frame};
use serde::Serialize;

use super::values::{self, Rendered};
use crate::target::symbolize::read_code_check;
use crate::target::discovery::PythonProcess;
use crate::target::layout::inspection::{InspectionLayout, LocalsLayout};
use crate::target::memory::{MemoryError, ProcessMemory, field_u64};
use crate::target::symbolize::{self, CodeInfo, TlbcBases, TypeAddresses};

/// Reads of a whole stack before giving up on a consistent one.
pub const MAX_ATTEMPTS: u32 = 8;
/// Frames walked per thread; deeper stacks are cut (and say so).
pub const MAX_FRAMES: usize = 4096;
/// Frames read in the whole dump (every thread, every attempt): a target whose (possibly
/// forged) chains are all `MAX_FRAMES` deep cannot keep the dump reading for long.
pub const MAX_FRAME_READS: u64 = 4 << 20;
/// Local variables shown per frame.
pub const MAX_LOCALS: usize = 64;
/// Bytes one dump holds at most: shown frames, the names and line tables of the code objects
/// read, and rendered locals (see the module docs).
pub const MAX_DUMP_BYTES: usize = 64 << 20;
/// Accounted per code object read beside its strings and line table.
const CODE_OVERHEAD: usize = 128;
/// Longest `co_localspluskinds` read (a code object has at most this many fast locals here).
const MAX_KINDS: usize = 1 << 16;
/// `CO_FAST_LOCAL`, `CO_FAST_CELL`, `CO_FAST_FREE`, `CO_FAST_HIDDEN` in `co_localspluskinds`.
const CO_FAST_LOCAL: u8 = 0x20;
const CO_FAST_NOT_PLAIN: u8 = 0x40 | 0x80 | 0x10;

/// One local variable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Local {
    pub name: String,
    #[serde(flatten)]
    pub value: Rendered,
}

/// One shown frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// Shared with every frame of the same code object.
    #[serde(serialize_with = "shared_str")]
    pub function: Arc<str>,
    #[serde(serialize_with = "shared_str")]
    pub file: Arc<str>,
    /// The line being executed, when the line table has one.
    pub line: Option<u32>,
    /// The first line of the function (`co_firstlineno`), for profiles that show it.
    #[serde(skip)]
    pub first_line: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locals: Option<Vec<Local>>,
}

fn shared_str<S: serde::Serializer>(text: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(text)
}

impl Frame {
    /// Bytes accounted for this frame beside its shared names: the frame and its locals.
    fn held_bytes(&self) -> usize {
        std::mem::size_of::<Frame>()
            + self.locals.iter().flatten().map(|l| std::mem::size_of::<Local>() + l.name.len() + l.value.value.len()).sum::<usize>()
    }
}

/// The outcome of reading one thread's stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StackRead {
    /// Root first.
    Consistent { frames: Vec<Frame>, attempts: u32, truncated: bool },
    /// Every attempt saw the stack change (or a frame that does not read).
    Inconsistent { attempts: u32, last_problem: String },
    /// Not shown: the dump holds [`MAX_DUMP_BYTES`] already.
    OverBudget,
}

/// Per-dump state: the process and its layouts, and the code objects already read (by
/// address and validation word).
pub struct StackReader<'a> {
    pub mem: ProcessMemory,
    pub process: &'a PythonProcess,
    pub inspection: InspectionLayout,
    frame_layout: FrameLayout,
    types: TypeAddresses,
    codes: HashMap<(u64, u32), Arc<CodeInfo>>,
    /// Frames read so far in this dump (bounded by `MAX_FRAME_READS`).
    frame_reads: u64,
    /// Bytes held so far (bounded by `MAX_DUMP_BYTES`): accepted stacks and cached code.
    held: usize,
    /// Free-threaded builds: the threads' bytecode copies, and the generation read before
    /// the stack being read (`symbolize::tlbc`).
    tlbc: TlbcBases,
    tlbc_generation: u32,
}

/// Why one attempt failed.
enum Problem {
    /// The target changed while it was read: try again.
    Changed(String),
    /// The memory is gone (the process may have exited).
    Memory(MemoryError),
    /// The dump read `MAX_FRAME_READS` frames already.
    Budget,
    /// The dump holds `MAX_DUMP_BYTES` already.
    Full,
}

impl<'a> StackReader<'a> {
    pub fn new(process: &'a PythonProcess, inspection: InspectionLayout) -> Self {
        Self {
            mem: ProcessMemory::new(process.pid),
            process,
            inspection,
            frame_layout: process.layout.kernel_frame_layout(),
            types: TypeAddresses {
                code: process.code_type_address,
                str: process.str_type_address,
                bytes: process.bytes_type_address,
            },
            codes: HashMap::new(),
            frame_reads: 0,
            held: 0,
            tlbc: TlbcBases::default(),
            tlbc_generation: 0,
        }
    }

    /// Whether the dump holds [`MAX_DUMP_BYTES`]: no more stacks are read.
    pub fn full(&self) -> bool {
        self.held >= MAX_DUMP_BYTES
    }

    /// Bytes held so far (see [`MAX_DUMP_BYTES`]).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// The innermost frame of a thread state (0 when it runs no Python).
    fn current_frame(&self, tstate: u64) -> Result<u64, MemoryError> {
        let thread = &self.process.layout.thread;
        let frame = self.mem.read_u64(tstate.wrapping_add(thread.frame.into()))?;
        if thread.cframe_frame == NO_FIELD || frame == 0 {
            return Ok(frame);
        }
        self.mem.read_u64(frame.wrapping_add(thread.cframe_frame.into()))
    }

    /// One walk of the chain, innermost first; `truncated` when it went past `MAX_FRAMES`.
    fn read_chain(&mut self, tstate: u64) -> Result<(Vec<FrameEntry>, bool), Problem> {
        let layout = &self.frame_layout;
        let read_size = (layout.read_size as usize).min(FRAME_READ_MAX - 1);
        let mut frame = self.current_frame(tstate).map_err(Problem::Memory)?;
        let mut chain = Vec::new();
        let mut seen = HashSet::new();
        while frame != 0 {
            if chain.len() >= MAX_FRAMES {
                return Ok((chain, true));
            }
            if !seen.insert(frame) {
                return Err(Problem::Changed("the frame chain loops".into()));
            }
            self.frame_reads += 1;
            if self.frame_reads > MAX_FRAME_READS {
                return Err(Problem::Budget);
            }
            let mut buf: FrameBytes = [0; FRAME_READ_MAX + 8];
            self.mem.read(frame, &mut buf[..read_size]).map_err(Problem::Memory)?;
            let mut entry = FrameEntry::default();
            let previous = decode_frame(layout, frame, &buf, &mut entry);
            entry.check = read_code_check(&self.mem, layout, &entry);
            chain.push(entry);
            frame = previous;
        }
        Ok((chain, false))
    }

    /// The code object of `entry`, read and checked: its validation word before and after
    /// reading its fields must equal the one the chain read saw.
    fn code(&mut self, entry: &FrameEntry) -> Result<Arc<CodeInfo>, Problem> {
        if let Some(code) = self.codes.get(&(entry.code, entry.check)) {
            return Ok(code.clone());
        }
        if self.full() {
            return Err(Problem::Full);
        }
        let info = symbolize::read_code(&self.mem, &self.process.layout, &self.types, entry.code)
            .map_err(|e| Problem::Changed(format!("a code object does not read: {e}")))?;
        let after = read_code_check(&self.mem, &self.frame_layout, entry);
        if after != entry.check {
            return Err(Problem::Changed("a code object changed while it was read".into()));
        }
        self.held += CODE_OVERHEAD + info.qualname.len() + info.filename.len() + info.linetable.len();
        let info = Arc::new(info);
        self.codes.insert((entry.code, entry.check), info.clone());
        Ok(info)
    }

    /// Reads the stack of one thread state (see the module docs).
    pub fn read(&mut self, tstate: u64, with_locals: bool) -> Result<StackRead, MemoryError> {
        let mut last_problem = String::new();
        if self.full() {
            return Ok(StackRead::OverBudget);
        }
        for attempt in 1..=MAX_ATTEMPTS {
            match self.attempt(tstate, with_locals) {
                Ok((frames, truncated)) => {
                    let bytes: usize = frames.iter().map(Frame::held_bytes).sum();
                    if self.held + bytes > MAX_DUMP_BYTES {
                        self.held = MAX_DUMP_BYTES;
                        return Ok(StackRead::OverBudget);
                    }
                    self.held += bytes;
                    return Ok(StackRead::Consistent { frames, attempts: attempt, truncated });
                }
                Err(Problem::Full) => return Ok(StackRead::OverBudget),
                Err(Problem::Changed(why)) => last_problem = why,
                Err(Problem::Budget) => {
                    return Ok(StackRead::Inconsistent {
                        attempts: attempt,
                        last_problem: format!("the dump read its limit of {MAX_FRAME_READS} frames"),
                    });
                }
                Err(Problem::Memory(e)) => {
                    // A thread that ended frees its frames: stop trying when the thread state
                    // itself no longer reads.
                    if self.mem.read_u64(tstate).is_err() {
                        return Err(e);
                    }
                    last_problem = format!("memory changed while it was read ({e})");
                }
            }
        }
        Ok(StackRead::Inconsistent { attempts: MAX_ATTEMPTS, last_problem })
    }

    fn attempt(&mut self, tstate: u64, with_locals: bool) -> Result<(Vec<Frame>, bool), Problem> {
        if let Some(layout) = self.process.layout.tlbc {
            let head = self.process.interpreters_head_address();
            self.tlbc_generation = self.tlbc.generation_now(&self.mem, &layout, head);
        }
        let (first, truncated) = self.read_chain(tstate)?;
        let mut frames = Vec::with_capacity(first.len());
        let mut innermost_shown = false;
        let mut bytes = 0;
        for (i, entry) in first.iter().enumerate() {
            if let Some(frame) = self.frame(entry, with_locals)? {
                innermost_shown |= i == 0;
                bytes += frame.held_bytes();
                if self.held + bytes > MAX_DUMP_BYTES {
                    return Err(Problem::Full);
                }
                frames.push(frame);
            }
        }
        let (second, _) = self.read_chain(tstate)?;
        if !same_stack(&first, &second) {
            return Err(Problem::Changed("the stack changed between two reads".into()));
        }
        // The innermost frame's position as of the second read.
        if let (Some(entry), Some(shown)) = (second.first(), frames.first_mut()) {
            if innermost_shown && entry.instr_offset != first[0].instr_offset {
                let code = self.code(entry)?;
                shown.line = self.offset(entry).and_then(|offset| code.line(offset));
            }
        }
        frames.reverse();
        Ok((frames, truncated))
    }

    /// The frame's instruction offset in its code object's own bytecode (rebased from the
    /// thread's copy on free-threaded builds); `None` when that copy cannot be trusted.
    fn offset(&mut self, entry: &FrameEntry) -> Option<i32> {
        if entry.tlbc_index == 0 {
            return Some(entry.instr_offset);
        }
        let layout = self.process.layout.tlbc?;
        let head = self.process.interpreters_head_address();
        let frame = (entry.code, entry.check, entry.tlbc_index, entry.instr_offset);
        self.tlbc.rebase(&self.mem, &layout, head, frame, self.tlbc_generation).ok()
    }

    fn visible(&self, entry: &FrameEntry) -> bool {
        let semantics = self.process.layout.frame_semantics;
        !semantics.shim_owner.is_some_and(|shim| entry.owner != u8::MAX && entry.owner >= shim)
    }

    /// The frame as shown, `None` for frames CPython hides (shims, frames not started yet).
    fn frame(&mut self, entry: &FrameEntry, with_locals: bool) -> Result<Option<Frame>, Problem> {
        if !self.visible(entry) {
            return Ok(None);
        }
        let semantics = self.process.layout.frame_semantics;
        let code = self.code(entry)?;
        let generator = semantics.owner_generator.is_some_and(|g| g == entry.owner);
        // A frame of a thread's own bytecode copy that cannot be rebased: shown, no line.
        let offset = self.offset(entry);
        let incomplete = !generator
            && self.process.layout.code.firsttraceable.is_some()
            && offset.is_some_and(|offset| i64::from(offset) < 2 * i64::from(code.firsttraceable));
        if incomplete {
            return Ok(None);
        }
        let locals = with_locals.then(|| self.locals(entry));
        Ok(Some(Frame {
            function: code.qualname.clone(),
            file: code.filename.clone(),
            line: offset.and_then(|offset| code.line(offset)),
            first_line: code.firstlineno,
            locals,
        }))
    }

    /// The plain local variables of one frame (not cells or free variables), bound ones only,
    /// at most `MAX_LOCALS`.
    fn locals(&self, entry: &FrameEntry) -> Vec<Local> {
        let objects = &self.process.layout.objects;
        let values = &self.inspection.values;
        let mem = &self.mem;
        let read_int = |address: u64| mem.read_u32(address).ok().map(|v| v as i32).and_then(|v| usize::try_from(v).ok());
        let (names, kinds, frame_values, mask) = match self.inspection.locals {
            LocalsLayout::VarNames { varnames, nlocals, frame_values } => {
                let Ok(tuple) = mem.read_u64(entry.code.wrapping_add(varnames.into())) else { return Vec::new() };
                let Some(count) = read_int(entry.code.wrapping_add(nlocals.into())) else { return Vec::new() };
                let Some(mut names) = values::read_name_tuple(mem, objects, values, tuple, MAX_LOCALS) else {
                    return Vec::new();
                };
                names.truncate(count);
                (names, None, frame_values, !0u64)
            }
            LocalsLayout::LocalsPlus { names, kinds, count, frame_values, value_mask } => {
                let Ok(tuple) = mem.read_u64(entry.code.wrapping_add(names.into())) else { return Vec::new() };
                let Some(count) = read_int(entry.code.wrapping_add(count.into())) else { return Vec::new() };
                let Some(mut list) = values::read_name_tuple(mem, objects, values, tuple, MAX_LOCALS) else {
                    return Vec::new();
                };
                list.truncate(count);
                let kinds = mem
                    .read_u64(entry.code.wrapping_add(kinds.into()))
                    .ok()
                    .and_then(|b| symbolize::read_bytes(mem, objects, b, MAX_KINDS, None).ok());
                let Some(kinds) = kinds else { return Vec::new() };
                (list, Some(kinds), frame_values, value_mask)
            }
        };
        let Ok(raw) = mem.read_vec(entry.frame.wrapping_add(frame_values.into()), names.len() * 8) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            if let Some(kinds) = &kinds {
                let kind = kinds.get(i).copied().unwrap_or(0);
                if kind & CO_FAST_LOCAL == 0 || kind & CO_FAST_NOT_PLAIN != 0 {
                    continue;
                }
            }
            let Some(pointer) = field_u64(&raw, i * 8).map(|p| p & mask) else { continue };
            if pointer == 0 {
                continue; // not bound yet, or deleted
            }
            out.push(Local { name, value: values::render(mem, objects, values, pointer) });
        }
        out
    }
}

/// Two reads of a chain show the same stack: same frames, code objects, owners and code
/// validation words, and the same positions in every frame but the innermost.
fn same_stack(first: &[FrameEntry], second: &[FrameEntry]) -> bool {
    first.len() == second.len()
        && first.iter().zip(second).enumerate().all(|(i, (a, b))| {
            a.frame == b.frame
                && a.code == b.code
                && a.owner == b.owner
                && a.check == b.check
                && (i == 0 || a.instr_offset == b.instr_offset)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(frame: u64, instr: i32) -> FrameEntry {
        FrameEntry { frame, code: frame + 1, instr_offset: instr, check: 7, owner: 0, flags: 0, _pad: [0; 2], tlbc_index: 0 }
    }

    #[test]
    fn stacks_compare() {
        let a = [entry(1, 10), entry(2, 20)];
        assert!(same_stack(&a, &a));
        assert!(same_stack(&a, &[entry(1, 12), entry(2, 20)]), "the innermost position may move");
        assert!(!same_stack(&a, &[entry(1, 10), entry(2, 22)]), "a caller's may not");
        assert!(!same_stack(&a, &[entry(1, 10)]));
        let mut other = a;
        other[1].check = 8;
        assert!(!same_stack(&a, &other));
    }
}
