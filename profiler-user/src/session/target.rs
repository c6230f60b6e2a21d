//! One profiled process and the path of its samples: the kernel's frames, completed below
//! the first 64 through the frame cache (`completion`), turned into named frames through the
//! code-object cache (`symbolize`), added to the profile (`aggregate`).

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use profiler_common::{
    FRAME_ENTRY_SIZE, FrameEntry, FrameLayout, MAX_FULL_FRAMES, ProcessInfo, SampleHeader, sample_status,
};

use crate::{
    aggregate::{FrameId, FrameName, Profile},
    completion::{TailCache, TailSource, read_code_check},
    discovery::{self, PythonProcess},
    loader::{KernelProgram, LoadError},
    memory::ProcessMemory,
    record::RecordError,
    stats::{Counters, SampleOutcome},
    symbolize::{self, CodeInfo, SymbolError},
};

/// Bounds on the per-process symbol caches (emptied and refilled when reached).
const MAX_CACHED_CODES: usize = 1 << 16;
const MAX_CACHED_POSITIONS: usize = 1 << 20;

/// One Python process being profiled, with its caches.
pub(crate) struct Target {
    pub(super) process: PythonProcess,
    /// The registration this target belongs to (`ProcessInfo::generation`): samples carrying
    /// another one were taken under an earlier registration of the same PID (another process,
    /// or this one before an exec) and are never attributed to this target.
    pub(super) generation: u32,
    /// The frame layout registered with the kernel, with the validation word's fields.
    kernel_frame: FrameLayout,
    mem: ProcessMemory,
    /// Code objects by address, with their validation word.
    codes: HashMap<u64, Arc<CodeEntry>>,
    /// (code, validation word, instruction offset, owned by a generator) → the frame shown,
    /// or `None` for a frame CPython itself hides (not started yet). Keyed by the word the
    /// kernel (or the validated tail) saw, so a replaced code object never hits.
    positions: HashMap<(u64, u32, i32, bool), Option<FrameId>>,
    tails: TailCache,
    pub(super) counters: Counters,
    /// Still running and registered with the kernel.
    pub(super) alive: bool,
    /// `/proc/PID/exe` when registered: a change means the process exec'd another program.
    pub(super) exe_link: PathBuf,
    /// Scratch stack (root first), reused between samples.
    stack: Vec<FrameId>,
}

/// The generation of the next registration, after `registered` earlier ones: unique for the
/// session (until 2^32 registrations), never 0.
pub(super) fn next_generation(registered: u64) -> u32 {
    (registered.wrapping_add(1) as u32).max(1)
}

/// Registers `process` with the kernel. `Ok(false)` when it cannot be sampled now but may be
/// later: the kernel's map is full (counted by the loader; retried on a later scan), or the
/// process exited before its registration took effect. In the latter case the entry is
/// removed again: the kernel frees the slots of exiting processes, but one that exited before
/// its entry existed would otherwise leave it behind, and a reused PID would be sampled with it.
pub(super) fn register(kernel: &mut KernelProgram, process: &PythonProcess, info: &ProcessInfo) -> Result<bool, RecordError> {
    match kernel.register(process.pid, info) {
        Ok(()) => {}
        Err(LoadError::MapFull { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    if !discovery::is_alive(process.pid, process.start_time) {
        kernel.unregister(process.pid);
        return Ok(false);
    }
    Ok(true)
}

/// A symbolized code object and the validation word it had when read.
struct CodeEntry {
    info: CodeInfo,
    check: u32,
}

/// Why a frame could not be turned into a name.
enum FrameError {
    /// Not readable, or not a code object.
    BadCode,
    /// The code object at that address is not the one the kernel saw.
    Changed,
}

impl Target {
    pub(super) fn new(process: PythonProcess, generation: u32) -> Self {
        let mem = ProcessMemory::new(process.pid);
        let exe_link = std::fs::read_link(format!("/proc/{}/exe", process.pid)).unwrap_or_default();
        Self {
            kernel_frame: process.layout.kernel_frame_layout(),
            generation,
            process,
            mem,
            exe_link,
            codes: HashMap::new(),
            positions: HashMap::new(),
            tails: TailCache::default(),
            counters: Counters::default(),
            alive: true,
            stack: Vec::with_capacity(64),
        }
    }

    pub(super) fn process_sample(&mut self, header: &SampleHeader, body: &[u8], profile: &mut Profile, threads: bool) -> SampleOutcome {
        match header.status {
            sample_status::COMPLETE => {}
            sample_status::NO_THREAD_STATE => return SampleOutcome::NoThreadState,
            sample_status::NO_FRAME => return SampleOutcome::Idle,
            sample_status::TRUNCATED => return SampleOutcome::Truncated,
            _ => return SampleOutcome::KernelReadFault,
        }
        // Read through the sampled thread: it was running a moment ago, whereas the process's
        // first thread may have exited (its pid then no longer has an address space).
        self.mem = ProcessMemory::new(header.tid);
        let n_full = (header.n_full as usize).min(MAX_FULL_FRAMES).min(body.len() / FRAME_ENTRY_SIZE);
        let full = |i: usize| -> FrameEntry {
            // SAFETY: i < n_full ≤ body.len() / FRAME_ENTRY_SIZE; FrameEntry is plain data.
            unsafe { std::ptr::read_unaligned(body.as_ptr().add(i * FRAME_ENTRY_SIZE) as *const FrameEntry) }
        };
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let mut result = Ok(());
        if header.n_hashed > 0 {
            let layout = self.kernel_frame;
            let tail = match self.tails.complete(&self.mem, &layout, header.tail_first, header.n_hashed, header.tail_hash) {
                Ok(tail) => tail,
                Err(_) => {
                    self.stack = stack;
                    return SampleOutcome::StaleTail;
                }
            };
            match tail.source {
                TailSource::Hit => self.counters.frame_cache_hits += 1,
                TailSource::Partial => self.counters.frame_cache_partial_hits += 1,
                TailSource::Miss => self.counters.frame_cache_misses += 1,
            }
            self.counters.frames_from_memory += tail.frames_from_memory as u64;
            self.counters.frames_from_cache += (tail.tail.frames.len() - tail.frames_from_memory) as u64;
            match tail.tail.symbols.get() {
                Some(ids) => stack.extend_from_slice(ids),
                None => {
                    // Each tail frame carries the check it was validated with (part of the hash).
                    for entry in tail.tail.frames.iter().rev() {
                        match self.frame_id(entry, entry.check, profile) {
                            Ok(Some(id)) => stack.push(id),
                            Ok(None) => {}
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    if result.is_ok() {
                        let _ = tail.tail.symbols.set(stack.as_slice().into());
                    }
                }
            }
        }
        self.counters.frames_from_kernel += n_full as u64;
        if result.is_ok() {
            for i in (0..n_full).rev() {
                let entry = full(i);
                match self.frame_id(&entry, entry.check, profile) {
                    Ok(Some(id)) => stack.push(id),
                    Ok(None) => {}
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        let outcome = match result {
            Err(FrameError::BadCode) => SampleOutcome::BadCodeObject,
            Err(FrameError::Changed) => SampleOutcome::ChangedCodeObject,
            Ok(()) if stack.is_empty() => SampleOutcome::Idle,
            Ok(()) => {
                profile.add(header.tgid, threads.then_some(header.tid), &stack, 1);
                SampleOutcome::Ok
            }
        };
        self.stack = stack;
        outcome
    }

    /// The frame shown for one interpreter frame; `None` for frames CPython hides (shims,
    /// frames not started yet). `check` is the validation word the kernel saw for the frame's
    /// code object (carried by full frames, folded into the tail hash for the others).
    fn frame_id(&mut self, entry: &FrameEntry, check: u32, profile: &mut Profile) -> Result<Option<FrameId>, FrameError> {
        let semantics = self.process.layout.frame_semantics;
        if let Some(shim) = semantics.shim_owner {
            if entry.owner != u8::MAX && entry.owner >= shim {
                return Ok(None);
            }
        }
        let generator = semantics.owner_generator.is_some_and(|g| g == entry.owner);
        if let Some(id) = self.positions.get(&(entry.code, check, entry.instr_offset, generator)) {
            self.counters.code_cache_hits += 1;
            return Ok(*id);
        }
        let code = self.code_entry(entry, check)?;
        let key = (entry.code, code.check, entry.instr_offset, generator);
        if let Some(id) = self.positions.get(&key) {
            return Ok(*id);
        }
        let info = &code.info;
        let incomplete = !generator
            && self.process.layout.code.firsttraceable.is_some()
            && (entry.instr_offset as i64) < 2 * info.firsttraceable as i64;
        let id = if incomplete {
            None
        } else {
            let line = info.line(entry.instr_offset).unwrap_or(0);
            Some(profile.intern(FrameName { function: info.qualname.clone(), file: info.filename.clone(), line }))
        };
        if self.positions.len() >= MAX_CACHED_POSITIONS {
            self.positions.clear();
        }
        self.positions.insert(key, id);
        Ok(id)
    }

    /// The frame's code object, from the cache when its validation word matches `expected`
    /// (the kernel's), else read again; an error when what is in memory now is not what the
    /// kernel saw.
    fn code_entry(&mut self, entry: &FrameEntry, expected: u32) -> Result<Arc<CodeEntry>, FrameError> {
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
        let layout = &self.process.layout;
        let info = symbolize::read_code(&self.mem, layout, self.process.code_type_address, address)
            .map_err(|_: SymbolError| FrameError::BadCode)?;
        let after = read_code_check(&self.mem, &self.kernel_frame, entry);
        if after != before {
            return Err(FrameError::Changed);
        }
        let code = Arc::new(CodeEntry { info, check: after });
        if self.codes.len() >= MAX_CACHED_CODES {
            self.codes.clear();
        }
        self.codes.insert(address, code.clone());
        if expected != after {
            // It changed again after the sample: what we read is not what was sampled.
            return Err(FrameError::Changed);
        }
        Ok(code)
    }
}
