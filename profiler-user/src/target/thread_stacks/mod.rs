//! Every thread of one Python process at one moment, read from its memory without stopping
//! it: the layer `pyperch dump` shows, and the session reads blocked threads with.
//!
//! - `proc_threads`: what the kernel says about each thread (running, sleeping, waiting on what);
//! - `stack`: each thread's Python stack, read twice and accepted only when both reads agree;
//! - `values`: the bounded rendering of local variables (`--locals`).
//!
//! Nothing here writes to the target or runs its code: it is read with `process_vm_readv`
//! and `/proc`, and every byte read is bounded and checked.

pub mod stack;
pub mod proc_threads;
pub mod values;

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::target::asyncio::{AsyncReader, AsyncioError, TaskInfo};
use crate::target::discovery::{DiscoveryError, PythonProcess};
use crate::target::layout::debug_offsets;
use crate::target::layout::inspection::{GLIBC_PTHREAD_TID, GilLocation, InspectionLayout, inspection_layout};
use crate::target::memory::{MemoryError, ProcessMemory};
use profiler_common::{MAX_EXCEPTION_ITEMS, NO_FIELD};

pub use stack::{Frame, Local, StackRead};
pub use proc_threads::{Activity, TaskState};

/// Interpreters followed in `_PyRuntime.interpreters`.
const MAX_INTERPRETERS: usize = 256;
/// Thread states followed, over every interpreter.
const MAX_THREAD_STATES: usize = 65_536;
/// Reads of the thread-state lists before giving up on two equal ones.
const LIST_ATTEMPTS: u32 = 8;
/// How long a process whose threads vanished during the dump gets to show that it exited.
pub(crate) const EXIT_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// What `dump` shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct DumpOptions {
    /// Local variables of every frame.
    pub locals: bool,
    /// Every asyncio task (`--async`, CPython 3.14+).
    pub async_tasks: bool,
}

/// One thread in the dump.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadDump {
    pub tid: u32,
    /// The thread's Python name (`threading.Thread.name`, read from the interpreter's
    /// registry) when `threading` knows it, else its OS name (`comm`).
    pub name: String,
    pub main: bool,
    pub holds_gil: bool,
    /// Whether the thread handles an exception: an item of its exception-state chain holds
    /// one (`exception_state`; what `--mode exception` keeps, CPython's "has exception").
    /// `None`: a native thread, a version whose layout is not known, or a chain that changed
    /// between two reads or went on past the bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handling_exception: Option<bool>,
    #[serde(flatten)]
    pub kernel: TaskState,
    /// Whether the thread has a Python thread state (native threads have none).
    pub python: bool,
    /// Root first; `None` when the thread runs no Python or its stack could not be read
    /// consistently (then `problem` says why).
    pub stack: Option<Vec<Frame>>,
    /// Reads of the stack it took to get two equal ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The stack was deeper than `stack::MAX_FRAMES` and is cut at its root end.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The whole dump.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessDump {
    pub pid: u32,
    pub command: String,
    pub python_version: String,
    /// The thread holding the GIL, if one does (and it could be told).
    pub gil_holder: Option<u32>,
    pub threads: Vec<ThreadDump>,
    /// Threads that ended while the dump was taken (listed by the kernel, gone when read).
    pub threads_ended: u32,
    /// `--async`: every asyncio task, with where it is suspended and who awaits it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<TaskInfo>>,
    /// Stacks not shown because the dump held `stack::MAX_DUMP_BYTES` already.
    #[serde(skip_serializing_if = "is_zero")]
    pub stacks_not_shown: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The problem of a thread whose stack is not shown for the dump's memory bound.
pub fn over_budget_problem() -> String {
    format!("the dump holds at most {} MiB of frames, names and locals", stack::MAX_DUMP_BYTES >> 20)
}

/// Why there is no dump. Each is one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("no process {0} is running")]
    NoProcess(u32),
    #[error("process {0} exited during the dump, so no dump is shown")]
    Exited(u32),
    #[error("{0}")]
    Discovery(DiscoveryError),
    #[error("process {pid} runs Python {version}, which pyperch dump cannot read: {reason}")]
    Unsupported { pid: u32, version: String, reason: String },
    #[error("process {0} has no Python interpreter running yet (or any more)")]
    NoInterpreter(u32),
    #[error(
        "the thread list of process {0} kept changing ({LIST_ATTEMPTS} reads differed): threads start and end too fast to list them at one moment"
    )]
    ListUnstable(u32),
    #[error("could not read the memory of process {pid}: {source}")]
    Memory { pid: u32, source: MemoryError },
    #[error("{0}")]
    Async(AsyncioError),
}

/// One Python thread state found in the interpreters' lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ThreadStateRef {
    interpreter: u64,
    tstate: u64,
}

/// Dumps `process`, already inspected (see the module docs).
pub fn dump_inspected(process: &PythonProcess, options: DumpOptions) -> Result<ProcessDump, DumpError> {
    let pid = process.pid;
    let mem = ProcessMemory::new(pid);
    // Threads vanish one by one when a process is killed, and its memory reads fail, before
    // its main thread shows the exit: a process that looks alive after a failure gets
    // `EXIT_GRACE` to show it, so a dump is never cut short (or failed) by an exit.
    let exited = || !proc_threads::process_alive(pid, process.start_time);
    let exited_after_grace = || {
        exited() || {
            std::thread::sleep(EXIT_GRACE);
            exited()
        }
    };
    let fail = |error: DumpError| {
        let gone = matches!(&error, DumpError::Memory { source: MemoryError::Read { source, .. }, .. }
            if source.raw_os_error() == Some(libc::ESRCH));
        if gone || exited_after_grace() { DumpError::Exited(pid) } else { error }
    };

    // Refused before anything is read, with the reason (version, `_asyncio` not loaded).
    let async_reader = if options.async_tasks { Some(AsyncReader::new(process).map_err(DumpError::Async)?) } else { None };
    let inspection = inspection_for(process, &mem).map_err(fail)?;
    let states = thread_states(process, &inspection, &mem).map_err(fail)?;
    let holders = gil_holders(process, &inspection, &mem, &states);

    // Thread states by the kernel thread id they run on.
    let mut by_tid: HashMap<u32, u64> = HashMap::new();
    for state in &states {
        if let Some(tid) = thread_id(process, &mem, state.tstate) {
            by_tid.entry(tid).or_insert(state.tstate);
        }
    }

    let tids = proc_threads::task_ids(pid).ok_or(DumpError::Exited(pid))?;
    let python_names = crate::target::thread_registry::read_once(process, &tids);
    let mut reader = stack::StackReader::new(process, inspection);
    let mut threads = Vec::with_capacity(tids.len());
    // Python threads whose kernel thread is already gone.
    let mut ended = by_tid.keys().filter(|tid| tids.binary_search(tid).is_err()).count() as u32;
    let mut not_shown = 0u32;
    for tid in tids {
        // A thread that ended since the listing is left out (and counted).
        let Some(kernel) = proc_threads::task_state(pid, tid) else {
            ended += 1;
            continue;
        };
        let tstate = by_tid.get(&tid).copied();
        let (stack, attempts, truncated, problem) = match tstate {
            None => (None, None, false, None),
            Some(tstate) => match reader.read(tstate, options.locals) {
                Ok(StackRead::Consistent { frames, attempts, truncated }) => (Some(frames), Some(attempts), truncated, None),
                Ok(StackRead::OverBudget) => {
                    not_shown += 1;
                    (None, None, false, Some(over_budget_problem()))
                }
                Ok(StackRead::Inconsistent { attempts, last_problem }) => (
                    None,
                    Some(attempts),
                    false,
                    Some(format!("no consistent stack in {attempts} reads: {last_problem}")),
                ),
                Err(e) => {
                    if exited_after_grace() {
                        return Err(DumpError::Exited(pid));
                    }
                    ended += 1;
                    (None, Some(1), false, Some(format!("the thread ended while it was read ({e})")))
                }
            },
        };
        threads.push(ThreadDump {
            tid,
            name: python_names.get(&tid).cloned().unwrap_or_else(|| kernel.name.clone()),
            main: tid == pid,
            holds_gil: tstate.is_some_and(|t| holders.contains(&t)),
            handling_exception: tstate.and_then(|t| handling_exception(process, &mem, t)),
            kernel,
            python: tstate.is_some(),
            stack,
            attempts,
            truncated,
            problem,
        });
    }
    // A process still alive after the grace really had threads end.
    if if ended > 0 { exited_after_grace() } else { exited() } {
        return Err(DumpError::Exited(pid));
    }
    threads.sort_by_key(|t| (!t.main, t.tid));
    let gil_holder = threads.iter().find(|t| t.holds_gil).map(|t| t.tid);
    let tasks = match &async_reader {
        None => None,
        Some(reader) => Some(
            reader
                .list_tasks(&mem)
                .map_err(|e| if exited_after_grace() { DumpError::Exited(pid) } else { DumpError::Async(e) })?,
        ),
    };
    Ok(ProcessDump {
        pid,
        command: process.comm.clone(),
        python_version: process.version_label(),
        gil_holder,
        threads,
        threads_ended: ended,
        tasks,
        stacks_not_shown: not_shown,
    })
}

/// The inspection layout of the target: 3.13+ from its own `_Py_DebugOffsets`.
fn inspection_for(process: &PythonProcess, mem: &ProcessMemory) -> Result<InspectionLayout, DumpError> {
    let unsupported = |reason: String| DumpError::Unsupported {
        pid: process.pid,
        version: process.version_label(),
        reason,
    };
    let offsets = if process.version.publishes_debug_offsets() {
        let bytes = mem
            .read_vec(process.runtime_address, debug_offsets::MAX_ENCODED_SIZE)
            .map_err(|source| DumpError::Memory { pid: process.pid, source })?;
        Some(debug_offsets::decode(&bytes).map_err(|e| unsupported(e.to_string()))?)
    } else {
        None
    };
    inspection_layout(process.version, offsets.as_ref()).map_err(|e| unsupported(e.to_string()))
}

/// Every thread state of every interpreter, from two equal reads of the lists.
fn thread_states(
    process: &PythonProcess,
    inspection: &InspectionLayout,
    mem: &ProcessMemory,
) -> Result<Vec<ThreadStateRef>, DumpError> {
    let mut previous = None;
    for _ in 0..LIST_ATTEMPTS {
        let current = read_thread_states(process, inspection, mem)?;
        if previous.as_ref() == Some(&current) {
            if current.is_empty() {
                return Err(DumpError::NoInterpreter(process.pid));
            }
            return Ok(current);
        }
        previous = Some(current);
    }
    Err(DumpError::ListUnstable(process.pid))
}

fn read_thread_states(
    process: &PythonProcess,
    inspection: &InspectionLayout,
    mem: &ProcessMemory,
) -> Result<Vec<ThreadStateRef>, DumpError> {
    let read = |address: u64| mem.read_u64(address).map_err(|source| DumpError::Memory { pid: process.pid, source });
    let thread = &process.layout.thread;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut interpreter = read(process.interpreters_head_address())?;
    for _ in 0..MAX_INTERPRETERS {
        if interpreter == 0 || !seen.insert(interpreter) {
            break;
        }
        let mut tstate = read(interpreter.wrapping_add(thread.interp_threads_head.into()))?;
        while out.len() < MAX_THREAD_STATES {
            if tstate == 0 || !seen.insert(tstate) {
                break;
            }
            out.push(ThreadStateRef { interpreter, tstate });
            tstate = read(tstate.wrapping_add(thread.next.into()))?;
        }
        interpreter = read(interpreter.wrapping_add(inspection.interp_next.into()))?;
    }
    Ok(out)
}

/// The kernel thread id a thread state runs on: `native_thread_id` (3.11+), else glibc's
/// `struct pthread` at `thread_id` (`pthread_self()`) holds it.
fn thread_id(process: &PythonProcess, mem: &ProcessMemory, tstate: u64) -> Option<u32> {
    let thread = &process.layout.thread;
    let tid = if thread.native_thread_id != NO_FIELD {
        mem.read_u64(tstate.wrapping_add(thread.native_thread_id.into())).ok()?
    } else {
        let pthread = mem.read_u64(tstate.wrapping_add(thread.thread_id.into())).ok()?;
        u64::from(mem.read_u32(pthread.wrapping_add(GLIBC_PTHREAD_TID.into())).ok()?)
    };
    u32::try_from(tid).ok().filter(|&t| t != 0)
}

/// Whether the thread of `tstate` handles an exception, by the definition `--mode exception`
/// uses (the kernel's `exception` module): some item of the chain from `exc_info` through
/// `previous_item` holds one (neither NULL nor None). The thread runs on while it is read: the
/// answer is given only when two walks of the chain visit the same items with the same
/// outcome; `None` otherwise, and for an unknown layout, an unreadable item or a chain longer
/// than `MAX_EXCEPTION_ITEMS`.
fn handling_exception(process: &PythonProcess, mem: &ProcessMemory, tstate: u64) -> Option<bool> {
    let layout = process.exception;
    if layout.exc_info == 0 || process.none_address == 0 {
        return None;
    }
    let walk = || -> Option<(bool, Vec<u64>)> {
        let mut items = Vec::new();
        let mut item = mem.read_u64(tstate.wrapping_add(layout.exc_info.into())).ok()?;
        while item != 0 {
            if items.len() >= MAX_EXCEPTION_ITEMS {
                return None;
            }
            items.push(item);
            let value = mem.read_u64(item.wrapping_add(layout.handled.into())).ok()?;
            if value != 0 && value != process.none_address {
                return Some((true, items));
            }
            item = mem.read_u64(item.wrapping_add(layout.previous.into())).ok()?;
        }
        Some((false, items))
    };
    let first = walk()?;
    (walk()? == first).then_some(first.0)
}

/// The thread states holding a GIL (one per GIL: subinterpreters may have their own).
fn gil_holders(
    process: &PythonProcess,
    inspection: &InspectionLayout,
    mem: &ProcessMemory,
    states: &[ThreadStateRef],
) -> HashSet<u64> {
    if let Some(holds) = inspection.holds_gil {
        return states
            .iter()
            .filter(|s| mem.read_u32(s.tstate.wrapping_add(holds.into())).is_ok_and(|v| v != 0))
            .map(|s| s.tstate)
            .collect();
    }
    let known: HashSet<u64> = states.iter().map(|s| s.tstate).collect();
    let mut holders = HashSet::new();
    match inspection.gil {
        GilLocation::RuntimeCurrent { offset } => {
            if let Ok(t) = mem.read_u64(process.runtime_address.wrapping_add(offset.into())) {
                holders.insert(t);
            }
        }
        GilLocation::InterpreterGil { gil_pointer, last_holder, locked } => {
            let interpreters: HashSet<u64> = states.iter().map(|s| s.interpreter).collect();
            for interpreter in interpreters {
                let Ok(gil) = mem.read_u64(interpreter.wrapping_add(gil_pointer.into())) else { continue };
                let is_locked = mem.read_u32(gil.wrapping_add(locked.into())).is_ok_and(|v| v != 0);
                if let (true, Ok(t)) = (is_locked, mem.read_u64(gil.wrapping_add(last_holder.into()))) {
                    holders.insert(t);
                }
            }
        }
    }
    holders.retain(|t| known.contains(t));
    holders
}
