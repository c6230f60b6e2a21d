//! asyncio task stacks (CPython 3.14+), read from outside the target.
//!
//! CPython 3.14 publishes what an outside reader needs (`offsets`): each thread state holds the
//! task its event loop is running (`asyncio_running_task`), each `_asyncio.Task` its coroutine
//! and who awaits it (`task_awaited_by`: one task, or a set of them), and every live task is
//! on an intrusive list of its thread (or of the interpreter once that thread exited).
//! Before 3.14 none of this exists (no awaiter links at all), so older versions are refused
//! with that reason.
//!
//! Two uses:
//! - [`AsyncReader::kernel_layout`], for `record --async` (and `top`, `agent`): what the kernel
//!   needs to read the sampled thread's running task and the tasks awaiting it at sample time
//!   (`profiler_common::TaskChain`), taken apart by [`chain`] with no read of its own. A chain
//!   is shown only when the running task's coroutine frame is one of the frames the kernel
//!   sampled (same address, owned by a generator); anything else is a [`ChainMiss`] and the
//!   sample keeps its plain stack.
//! - [`AsyncReader::list_tasks`], for `dump --async`: every task of the process with its name,
//!   who awaits it, the thread running it, and where its coroutine chain is suspended.
//!
//! Every byte read is untrusted: sizes come from the checked offsets, loops are bounded
//! (`MAX_*`), cycles end the walk, and nothing read here is trusted as a type without
//! comparing type pointers.

pub mod chain;
pub mod offsets;
pub mod waits;

#[cfg(test)]
mod live_tests;

use std::collections::{HashMap, HashSet};

use profiler_common::{FrameBytes, FrameEntry, TASK_READ_MAX, TaskLayout, decode_frame};
use serde::Serialize;

use crate::{
    target::discovery::{self, PythonProcess},
    target::layout::{
        PythonLayout, Version,
        awaits::{AwaitLayout, await_layout},
        published::{InterpreterOffsets, ObjectOffsets},
    },
    target::memory::{MemoryError, ProcessMemory, field_u64},
    target::symbolize::{self, CodeInfo, TlbcBases, TypeAddresses},
};

pub use offsets::AsyncioOffsets;

/// Awaiting tasks followed from the running one.
pub const MAX_AWAIT_CHAIN: usize = 256;
/// Characters of a task name kept.
pub const MAX_TASK_NAME_CHARS: usize = 256;
/// Tasks listed per process.
pub const MAX_TASKS: usize = 100_000;
/// Slots of an awaiter set read (its `mask + 1`).
pub const MAX_SET_SLOTS: u64 = 4096;
/// Coroutines followed down one task's `await` chain.
pub const MAX_CORO_DEPTH: usize = 64;
/// Interpreters and thread states looked at when listing tasks.
const MAX_INTERPRETERS: usize = 64;
const MAX_THREADS: usize = 4096;
/// Attempts at reading one suspended task's coroutine chain the same twice in a row.
const SETTLE_ATTEMPTS: usize = 3;

/// Why asyncio task stacks cannot be read from a process (one sentence each).
#[derive(thiserror::Error, Debug)]
pub enum AsyncioError {
    #[error(
        "asyncio task stacks need CPython 3.14 or later, and process {pid} runs {version}: earlier versions do not record which task awaits which"
    )]
    TooOld { pid: u32, version: Version },
    #[error("process {pid} (CPython {version}) does not publish the object offsets asyncio task stacks need")]
    NoObjectOffsets { pid: u32, version: Version },
    #[error("the _asyncio module's debug offsets are malformed: {0}")]
    BadOffsets(&'static str),
    #[error("process {pid} has not loaded the _asyncio module (it has not imported asyncio yet)")]
    NotLoaded { pid: u32 },
    #[error("process {pid}: {message}")]
    Discovery { pid: u32, message: String },
    #[error("the object at {address:#x} is not an asyncio task")]
    NotATask { address: u64 },
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// Why a sample of a thread running a task keeps its plain stack (counted in `--stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainMiss {
    /// The running task's coroutine frame is not among the frames the kernel sent in full
    /// (it lies deeper than 64 frames, or the task's coroutine is not a Python coroutine).
    NotOnStack,
    /// Sampled before the kernel was asked to read this process's task chains (the asyncio
    /// reader was not made yet): how much of a recording's start went by without them.
    ReadLate,
    /// The kernel could not read the chain: a task, frame or set unreadable, an awaiter not
    /// a task, a cycle.
    Unreadable,
    /// The chain goes on beyond the kernel's bounds (`profiler_common::MAX_TASK_STEPS`...).
    OverBudget,
    /// A task ran but no chain record came with the sample (the ring buffer was full, or this
    /// kernel lacks `bpf_loop` and reads no chains).
    NoRecord,
}

impl ChainMiss {
    pub const ALL: [ChainMiss; 5] =
        [ChainMiss::NotOnStack, ChainMiss::ReadLate, ChainMiss::Unreadable, ChainMiss::OverBudget, ChainMiss::NoRecord];

    pub fn label(self) -> &'static str {
        match self {
            ChainMiss::NotOnStack => "running task's coroutine not among the sampled frames",
            ChainMiss::ReadLate => "sampled before the kernel read task chains",
            ChainMiss::Unreadable => "task graph unreadable",
            ChainMiss::OverBudget => "task graph over the read budget",
            ChainMiss::NoRecord => "no task chain sent",
        }
    }
}

/// One frame of a suspended coroutine chain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct TaskFrame {
    pub function: String,
    pub file: String,
    /// 0 when unknown.
    pub line: u32,
}

/// One task, for `dump --async`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskInfo {
    /// Address of the task object (identifies it within one listing).
    pub address: u64,
    pub name: String,
    /// Addresses of the tasks awaiting this one (empty for a root task).
    pub awaited_by: Vec<u64>,
    /// The native thread id of the thread whose event loop is running it now.
    pub running_on: Option<u64>,
    /// Where the task's coroutine chain is suspended, the task's own coroutine first and the
    /// innermost awaited coroutine last. Empty for a running task, and when the chain did
    /// not read the same twice in a row (`settled` is then false).
    pub suspended_at: Vec<TaskFrame>,
    pub settled: bool,
}

/// Lines of suspended coroutine frames that ran on a thread with its own copy of the
/// bytecode (free-threaded builds: `tlbc_index` > 0), rebased against that copy
/// (`symbolize::TlbcBases`). The index pool's generation is read when the reader is made,
/// before the frames it is used for; a copy is trusted only while it has not moved since.
///
/// A suspended frame may outlive its thread (and the thread's index): its instruction
/// pointer then points into a copy that was freed. Copies of one code object are of one size,
/// and the allocator places blocks of one size class at the same address or apart: a new copy
/// at index `i` either lies where the freed one was (the same bytecode: the offset and line
/// are right) or apart from it, and then the offset falls outside it and the frame is shown
/// without a line (`Unresolved::OutOfRange`), never with another line.
#[derive(Default)]
pub(crate) struct CopyLines {
    bases: TlbcBases,
    /// The generation read at the start, when the process has copies.
    generation: Option<u32>,
}

impl CopyLines {
    /// Reads the generation now (free-threaded processes only): call before reading frames.
    pub(crate) fn new(reader: &AsyncReader, mem: &ProcessMemory) -> Self {
        let mut bases = TlbcBases::default();
        let generation = reader.layout.tlbc.map(|layout| bases.generation_now(mem, &layout, reader.interpreters_head));
        Self { bases, generation }
    }

    /// The line of a frame of `code` (0 when unknown or not to be trusted).
    pub(crate) fn line(&mut self, reader: &AsyncReader, mem: &ProcessMemory, entry: &FrameEntry, code: &CodeInfo) -> u32 {
        if entry.tlbc_index == 0 {
            return code.line(entry.instr_offset).unwrap_or(0);
        }
        let (Some(layout), Some(generation)) = (reader.layout.tlbc, self.generation) else { return 0 };
        let frame = (entry.code, entry.check, entry.tlbc_index, entry.instr_offset);
        match self.bases.rebase(mem, &layout, reader.interpreters_head, frame, generation) {
            Ok(offset) => code.line(offset).unwrap_or(0),
            Err(_) => 0,
        }
    }
}

/// Reads the asyncio state of one process.
#[derive(Clone, Debug)]
pub struct AsyncReader {
    pid: u32,
    asyncio: AsyncioOffsets,
    objects: ObjectOffsets,
    layout: PythonLayout,
    types: TypeAddresses,
    interpreters: Option<InterpreterOffsets>,
    interpreters_head: u64,
    /// Where a suspended coroutine keeps what it awaits.
    awaits: AwaitLayout,
}

/// Whether `version` can have asyncio task stacks.
pub fn supported(version: Version) -> bool {
    await_layout(version).is_some()
}

impl AsyncReader {
    /// The reader for `process`, or why there is none (yet: `NotLoaded` may change once the
    /// process imports asyncio).
    pub fn new(process: &PythonProcess) -> Result<Self, AsyncioError> {
        let (pid, version) = (process.pid, process.version);
        let Some(awaits) = await_layout(version) else {
            return Err(AsyncioError::TooOld { pid, version });
        };
        let objects = process.objects.ok_or(AsyncioError::NoObjectOffsets { pid, version })?;
        let bytes = match &process.asyncio_debug {
            Some(bytes) => bytes.clone(),
            None => discovery::asyncio_module_section(pid)
                .map_err(|e| AsyncioError::Discovery { pid, message: e.to_string() })?
                .ok_or(AsyncioError::NotLoaded { pid })?,
        };
        let asyncio = offsets::decode(&bytes)?;
        Ok(Self {
            pid,
            asyncio,
            objects,
            layout: process.layout,
            types: TypeAddresses {
                code: process.code_type_address,
                str: process.str_type_address,
                bytes: process.bytes_type_address,
            },
            interpreters: process.interpreters,
            interpreters_head: process.interpreters_head_address(),
            awaits,
        })
    }

    pub fn offsets(&self) -> &AsyncioOffsets {
        &self.asyncio
    }

    /// What the kernel needs to read this process's task chains at sample time, or `None`
    /// when a task field lies beyond what it reads of a task at once.
    pub fn kernel_layout(&self) -> Option<TaskLayout> {
        let a = &self.asyncio;
        let ob_type = self.layout.objects.ob_type;
        // The bytes of a task the fields need (the decoded offsets lie within the task's size).
        let ends = [a.task_coro + 8, a.task_name + 8, a.task_awaited_by + 8, a.task_is_task + 1, a.task_awaited_by_is_set + 1, ob_type + 8];
        let task_read = ends.into_iter().max()?;
        if task_read > TASK_READ_MAX {
            return None;
        }
        let state = |i: usize| self.awaits.yield_from_states.get(i).map_or(i32::MIN, |&s| i32::from(s));
        Some(TaskLayout {
            task_read,
            _pad: 0,
            task_coro: a.task_coro,
            task_name: a.task_name,
            task_awaited_by: a.task_awaited_by,
            task_awaited_by_is_set: a.task_awaited_by_is_set,
            task_is_task: a.task_is_task,
            ob_type,
            gen_iframe: self.objects.gen_iframe,
            gen_frame_state: self.objects.gen_frame_state,
            frame_stackpointer: self.objects.frame_stackpointer,
            awaited_slot: self.awaits.awaited_slot as u32,
            suspended_state_a: state(0),
            suspended_state_b: state(1),
            set_mask: self.objects.set_mask,
            set_table: self.objects.set_table,
            owner_generator: self.layout.frame_semantics.owner_generator?.into(),
            _pad2: 0,
        })
    }

    /// Where a coroutine's interpreter frame lies in the coroutine object.
    pub fn coroutine_frame(&self, coro: u64) -> u64 {
        coro.wrapping_add(self.objects.gen_iframe.into())
    }

    /// Every task of the process (at most `MAX_TASKS`), for `dump --async`.
    pub fn list_tasks(&self, mem: &ProcessMemory) -> Result<Vec<TaskInfo>, AsyncioError> {
        let (addresses, running) = self.task_addresses(mem, MAX_TASKS)?;
        let mut seen = HashSet::new();
        let mut tasks = Vec::new();
        for address in addresses {
            if !seen.insert(address) {
                continue;
            }
            // A task that finished since it was listed is skipped.
            let Ok(bytes) = self.read_task(mem, address) else { continue };
            let task_type = self.ob_type(&bytes);
            let awaited_by = match self.awaiters(mem, &bytes, task_type) {
                Ok(awaiters) => awaiters.into_iter().map(|(a, _)| a).collect(),
                Err(_) => Vec::new(),
            };
            let running_on = running.get(&address).copied();
            let (suspended_at, settled) = if running_on.is_some() {
                (Vec::new(), true)
            } else {
                let coro = field_u64(&bytes, self.asyncio.task_coro as usize).unwrap_or(0);
                self.settled_coroutine_stack(mem, coro)
            };
            tasks.push(TaskInfo { address, name: self.task_name(mem, &bytes), awaited_by, running_on, suspended_at, settled });
        }
        Ok(tasks)
    }

    /// The tasks on the lists of every thread and interpreter (at most `max`), and the thread
    /// (native id) running each running one.
    fn task_addresses(&self, mem: &ProcessMemory, max: usize) -> Result<(Vec<u64>, HashMap<u64, u64>), AsyncioError> {
        let mut addresses = Vec::new();
        let mut running: HashMap<u64, u64> = HashMap::new();
        let mut interp = mem.read_u64(self.interpreters_head)?;
        for _ in 0..MAX_INTERPRETERS {
            if interp == 0 {
                break;
            }
            self.collect_list(mem, interp.wrapping_add(self.asyncio.interp_tasks_head.into()), max, &mut addresses)?;
            let mut tstate = mem.read_u64(interp.wrapping_add(self.layout.thread.interp_threads_head.into()))?;
            for _ in 0..MAX_THREADS {
                if tstate == 0 {
                    break;
                }
                self.collect_list(mem, tstate.wrapping_add(self.asyncio.thread_tasks_head.into()), max, &mut addresses)?;
                let task = mem.read_u64(tstate.wrapping_add(self.asyncio.thread_running_task.into()))?;
                if task != 0 {
                    let tid = mem.read_u64(tstate.wrapping_add(self.layout.thread.native_thread_id.into()))?;
                    running.insert(task, tid);
                }
                tstate = mem.read_u64(tstate.wrapping_add(self.layout.thread.next.into()))?;
            }
            interp = match self.interpreters {
                Some(i) => mem.read_u64(interp.wrapping_add(i.next.into()))?,
                None => 0,
            };
        }
        Ok((addresses, running))
    }

    /// Each task of the process (at most `max`) with the coroutine it drives: what the kernel
    /// needs to name the task that eagerly started a running one (`TASK_OF_COROUTINE`). About
    /// two reads a task; a task that finished meanwhile is left out (or is caught by the
    /// kernel's own check).
    pub fn task_coroutines(&self, mem: &ProcessMemory, max: usize) -> Result<Vec<(u64, u64)>, AsyncioError> {
        let (addresses, _) = self.task_addresses(mem, max)?;
        let coro = u64::from(self.asyncio.task_coro);
        Ok(addresses.into_iter().filter_map(|task| Some((task, mem.read_u64(task.wrapping_add(coro)).ok().filter(|&c| c != 0)?))).collect())
    }

    /// Appends the tasks of the intrusive list whose head node is at `head`.
    fn collect_list(&self, mem: &ProcessMemory, head: u64, max: usize, out: &mut Vec<u64>) -> Result<(), AsyncioError> {
        let next = u64::from(self.objects.llist_next);
        let mut node = mem.read_u64(head.wrapping_add(next))?;
        let mut steps = 0;
        while node != 0 && node != head && out.len() < max && steps < max {
            out.push(node.wrapping_sub(self.asyncio.task_node.into()));
            node = mem.read_u64(node.wrapping_add(next))?;
            steps += 1;
        }
        Ok(())
    }

    /// The task object's bytes; `task_is_task` must be set.
    fn read_task(&self, mem: &ProcessMemory, address: u64) -> Result<Vec<u8>, AsyncioError> {
        let bytes = mem.read_vec(address, self.asyncio.task_size as usize)?;
        if bytes.get(self.asyncio.task_is_task as usize) != Some(&1) {
            return Err(AsyncioError::NotATask { address });
        }
        Ok(bytes)
    }

    fn ob_type(&self, object: &[u8]) -> u64 {
        field_u64(object, self.layout.objects.ob_type as usize).unwrap_or(0)
    }

    /// The tasks (of type `task_type`) awaiting the task whose bytes are `task`.
    fn awaiters(&self, mem: &ProcessMemory, task: &[u8], task_type: u64) -> Result<Vec<(u64, Vec<u8>)>, ChainMiss> {
        let by = field_u64(task, self.asyncio.task_awaited_by as usize).unwrap_or(0);
        if by == 0 {
            return Ok(Vec::new());
        }
        let is_set = task.get(self.asyncio.task_awaited_by_is_set as usize).copied().unwrap_or(0) != 0;
        let candidates = if is_set { self.set_members(mem, by)? } else { vec![by] };
        let mut found = Vec::new();
        for candidate in candidates {
            // Set slots may hold the set's dummy key: only objects of the task's type count.
            if let Ok(bytes) = self.read_task(mem, candidate) {
                if task_type != 0 && self.ob_type(&bytes) == task_type {
                    found.push((candidate, bytes));
                }
            }
        }
        Ok(found)
    }

    /// The keys of the set at `set` (live and dummy slots alike; callers check them).
    fn set_members(&self, mem: &ProcessMemory, set: u64) -> Result<Vec<u64>, ChainMiss> {
        let o = &self.objects;
        let read = |offset: u32| mem.read_u64(set.wrapping_add(offset.into())).map_err(|_| ChainMiss::Unreadable);
        let (mask, table) = (read(o.set_mask)?, read(o.set_table)?);
        let slots = mask.checked_add(1).filter(|&n| n <= MAX_SET_SLOTS).ok_or(ChainMiss::Unreadable)?;
        let bytes = mem.read_vec(table, slots as usize * 16).map_err(|_| ChainMiss::Unreadable)?;
        Ok((0..slots as usize).filter_map(|i| field_u64(&bytes, 16 * i)).filter(|&key| key != 0).collect())
    }

    /// A task's name: its `str`, or `Task-<n>` for the number CPython keeps until the name
    /// is first asked for; `?` when neither can be read.
    fn task_name(&self, mem: &ProcessMemory, task: &[u8]) -> String {
        let name = field_u64(task, self.asyncio.task_name as usize).unwrap_or(0);
        if name == 0 {
            return "?".into();
        }
        match self.type_name(mem, name).as_deref() {
            Some("str") => symbolize::read_str(mem, &self.layout.objects, name, MAX_TASK_NAME_CHARS, self.types.str)
                .unwrap_or_else(|_| "?".into()),
            Some("int") => self.small_int(mem, name).map_or_else(|| "?".into(), |n| format!("Task-{n}")),
            _ => "?".into(),
        }
    }

    /// `tp_name` of the object's type (under 16 bytes; longer names are not wanted here).
    fn type_name(&self, mem: &ProcessMemory, object: u64) -> Option<String> {
        let ty = mem.read_u64(object.wrapping_add(self.layout.objects.ob_type.into())).ok()?;
        let name = mem.read_u64(ty.wrapping_add(self.objects.type_name.into())).ok()?;
        mem.read_c_string(name, 15)
    }

    /// A non-negative `int` of at most two 30-bit digits.
    fn small_int(&self, mem: &ProcessMemory, object: u64) -> Option<u64> {
        let tag = mem.read_u64(object.wrapping_add(self.objects.long_tag.into())).ok()?;
        let (digits, sign) = (tag >> 3, tag & 3);
        if sign == 2 || digits > 2 {
            return None;
        }
        let raw = mem.read_vec(object.wrapping_add(self.objects.long_digits.into()), 8).ok()?;
        let digit = |i: usize| u64::from(crate::target::memory::field_u32(&raw, 4 * i).unwrap_or(0) & 0x3fff_ffff);
        Some(match digits {
            0 => 0,
            1 => digit(0),
            _ => digit(0) | digit(1) << 30,
        })
    }

    /// The coroutine chain from `coro`, read until two reads in a row agree.
    fn settled_coroutine_stack(&self, mem: &ProcessMemory, coro: u64) -> (Vec<TaskFrame>, bool) {
        let mut previous = self.coroutine_stack(mem, coro);
        for _ in 0..SETTLE_ATTEMPTS {
            let current = self.coroutine_stack(mem, coro);
            if current == previous {
                if let Some(frames) = current {
                    return (frames, true);
                }
                return (Vec::new(), false);
            }
            previous = current;
        }
        (Vec::new(), false)
    }

    /// The frames of the coroutine `coro` and of the coroutines it awaits, outermost first;
    /// `None` when a frame cannot be read.
    fn coroutine_stack(&self, mem: &ProcessMemory, coro: u64) -> Option<Vec<TaskFrame>> {
        if coro == 0 {
            return None;
        }
        let mut lines = CopyLines::new(self, mem);
        let coro_type = mem.read_u64(coro.wrapping_add(self.layout.objects.ob_type.into())).ok()?;
        let frame_layout = self.layout.frame;
        let mut frames = Vec::new();
        let mut current = coro;
        for _ in 0..MAX_CORO_DEPTH {
            let frame = current.wrapping_add(self.objects.gen_iframe.into());
            let mut buf: FrameBytes = [0; profiler_common::FRAME_READ_MAX + 8];
            let size = (frame_layout.read_size as usize).min(profiler_common::FRAME_READ_MAX);
            mem.read(frame, &mut buf[..size]).ok()?;
            let mut entry = FrameEntry::default();
            decode_frame(&frame_layout, frame, &buf, &mut entry);
            let code = symbolize::read_code(mem, &self.layout, &self.types, entry.code).ok()?;
            frames.push(TaskFrame {
                function: code.qualname.to_string(),
                file: code.filename.to_string(),
                line: lines.line(self, mem, &entry, &code),
            });
            let mut state = [0u8; 1];
            mem.read(current.wrapping_add(self.objects.gen_frame_state.into()), &mut state).ok()?;
            if !self.awaits.yield_from_states.contains(&(state[0] as i8)) {
                break;
            }
            // Suspended in `await`: the awaited object is on top of the frame's stack.
            let sp = mem.read_u64(frame.wrapping_add(self.objects.frame_stackpointer.into())).ok()?;
            let slot = sp.wrapping_sub(8 * self.awaits.awaited_slot);
            let awaited = mem.read_u64(slot).ok()? & frame_layout.code_mask;
            let awaited_type = mem.read_u64(awaited.wrapping_add(self.layout.objects.ob_type.into())).ok()?;
            if awaited == 0 || awaited_type != coro_type {
                break;
            }
            current = awaited;
        }
        Some(frames)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}
