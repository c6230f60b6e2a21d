//! Where suspended asyncio tasks wait (`--async` with `--mode wall` or `off-cpu`).
//!
//! One *round* reads a process's task graph: every task on the thread states' and the
//! interpreter's task lists (one read per task: its object holds the list's next link), and
//! for each suspended task (its coroutine suspended, not running on any thread) its await
//! stack: its coroutine's frame and the coroutines it awaits, down to the innermost await.
//! Each such task gives a [`WaitStack`]: the tasks awaiting it, root first, each with its own
//! coroutine frames (down to the line awaiting the next task), then the task with its frames.
//! The caller (`session::task_waits`) charges each stack the time since the task was last
//! charged, ending it with [`WAIT_LEAF`].
//!
//! Exact or nothing: a coroutine chain is kept only when two reads in a row agree; a task
//! whose awaiter, read as suspended in a chain that awaits another task, no longer awaits it
//! is dropped; a cycle or an awaiter that cannot be read drops the chain. Drops are counted
//! ([`WaitRound`]). Reads go through the thread's read budget (`memory::with_read_budget`):
//! when it runs out the round stops, and the tasks not read are counted; the next round
//! starts where this one stopped ([`WaitReader::cursor`]), so every task is read in turn.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use profiler_common::{FrameBytes, FrameEntry, decode_frame};

use super::{AsyncReader, CopyLines, MAX_AWAIT_CHAIN, MAX_CORO_DEPTH, TaskFrame};
use crate::{
    target::memory::{ProcessMemory, field_u64},
    target::symbolize::{self, CodeInfo, read_code_check},
};

/// The leaf under a suspended task's await stack.
pub const WAIT_LEAF: &str = "<task waiting>";
/// Tasks listed per round (beyond them the listing stops; counted as not read).
pub const MAX_LISTED: usize = 100_000;
/// Code objects remembered between rounds (the cache is emptied when full).
const MAX_CODES: usize = 4096;
/// Largest read of a coroutine object and its frame.
const MAX_CORO_READ: usize = 1024;
/// Bytes read from a coroutine at once: its frame and usually the top of its value stack
/// (which holds what it awaits), saving a read per coroutine.
const CORO_WINDOW: usize = 384;

/// One frame of a wait stack, root first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WaitFrame {
    /// `task <name>`.
    Task(String),
    /// `(awaited by N tasks)`: the task below is awaited by N tasks; the chain above goes
    /// through one of them (the one at the lowest address).
    AwaitedBy(usize),
    /// A coroutine frame.
    Code(TaskFrame),
}

impl WaitFrame {
    /// The frame's shown name (`task B`, `(awaited by 3 tasks)`; a function's qualname).
    pub fn name(&self) -> String {
        match self {
            WaitFrame::Task(name) => format!("task {name}"),
            WaitFrame::AwaitedBy(n) => format!("(awaited by {n} tasks)"),
            WaitFrame::Code(f) => f.function.clone(),
        }
    }
}

/// A suspended task's await stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitStack {
    /// The task object (identifies it between rounds while it lives).
    pub task: u64,
    /// The native thread id of the thread whose task list holds the task (its event loop's
    /// thread), if known.
    pub thread: Option<u64>,
    /// Root first, without [`WAIT_LEAF`].
    pub frames: Vec<WaitFrame>,
}

/// What one round read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitRound {
    pub stacks: Vec<WaitStack>,
    /// Every task listed (the tasks charged are `stacks`; see the counts below for the rest).
    pub listed: Vec<u64>,
    /// Tasks read that wait for nothing: running on a thread now (their thread's samples
    /// have them), created and not started yet, or finished and not freed yet.
    pub not_waiting: Vec<u64>,
    /// Suspended tasks whose chain did not read the same twice, or whose awaiter no longer
    /// awaited them.
    pub unsettled: u64,
    /// Tasks (or an awaiter of theirs) that could not be read.
    pub unreadable: u64,
    /// Suspended tasks not read because the round's read budget ran out (or listed past
    /// [`MAX_LISTED`]).
    pub over_budget: u64,
    /// The listing stopped early (budget or cap): tasks past it are not known.
    pub listing_cut: bool,
}

/// A task as listed: its object's bytes and the thread whose list holds it.
struct Listed {
    bytes: Vec<u8>,
    thread: Option<u64>,
}

/// What one round has read of each task (each is read once per round).
#[derive(Default)]
struct Memo {
    chains: HashMap<u64, (Chain, u64, Option<Mark>)>,
    links: HashMap<u64, Link>,
}

/// A task as read once per round after its chain settled: the awaiter followed (the lowest
/// address) and how many there are, its shown name and its type.
#[derive(Clone, Debug)]
struct Link {
    first: Option<u64>,
    count: usize,
    name: String,
    task_type: u64,
}

/// A task's own coroutine chain, read twice alike.
#[derive(Clone, Debug)]
enum Chain {
    /// Frames outermost first, and what the innermost coroutine awaits and its type (0:
    /// nothing, or a coroutine not followed).
    Suspended { frames: Vec<TaskFrame>, awaits: u64, awaits_type: u64 },
    NotSuspended,
    Unsettled,
    Unreadable,
}

/// Reads the wait stacks of one process, round after round.
pub struct WaitReader {
    reader: AsyncReader,
    /// (code object, validation word) → what it shows.
    codes: HashMap<(u64, u32), Arc<CodeInfo>>,
    /// Where the next round starts reading suspended tasks (an index into the listing
    /// sorted by address), so that a budget smaller than the graph reads every task in turn.
    cursor: usize,
    /// `gi_frame_state` values of a suspended coroutine.
    suspended_states: &'static [i8],
    /// Code object → its validation word, read once per round.
    checks: HashMap<u64, u32>,
    /// The state and instruction word of the outermost coroutine of the last chain read.
    last_mark: Option<Mark>,
    /// The `str` and `int` types' addresses (static types): known, or once a task name
    /// showed them.
    str_type: Option<u64>,
    int_type: Option<u64>,
    /// Lines through threads' bytecode copies (free-threaded builds), made anew each round.
    lines: CopyLines,
}

impl WaitReader {
    pub fn new(reader: AsyncReader) -> Self {
        let suspended_states = reader.awaits.suspended_states;
        let str_type = reader.types.str;
        Self { str_type, reader, codes: HashMap::new(), cursor: 0, suspended_states, checks: HashMap::new(), int_type: None, last_mark: None, lines: CopyLines::default() }
    }

    pub fn pid(&self) -> u32 {
        self.reader.pid
    }

    /// One round (see the module's documentation). Reads stop where the thread's read budget
    /// ends.
    pub fn round(&mut self, mem: &ProcessMemory) -> WaitRound {
        let mut round = WaitRound::default();
        self.checks.clear();
        // Before any frame of this round is read.
        self.lines = CopyLines::new(&self.reader, mem);
        let mut running: HashSet<u64> = HashSet::new();
        let mut tasks: HashMap<u64, Listed> = HashMap::new();
        round.listing_cut = self.list(mem, &mut tasks, &mut running).is_err();
        let mut order: Vec<u64> = tasks.keys().copied().collect();
        order.sort_unstable();
        round.listed = order.clone();
        let n = order.len();
        if n == 0 {
            return round;
        }
        let start = self.cursor % n;
        let mut memo = Memo::default();
        let mut progressed = false;
        for k in 0..n {
            let task = order[(start + k) % n];
            if running.contains(&task) {
                round.not_waiting.push(task);
                continue;
            }
            let (chain, _, _) = self.chain_of(mem, task, &tasks, &mut memo.chains);
            let outcome = match chain {
                Chain::Suspended { .. } => self.stack_of(mem, task, &tasks, &running, &mut memo),
                other => Err(other),
            };
            if crate::target::memory::budget_exhausted() {
                // Stopped here: this task and the rest are read by the next rounds, from this
                // one; or from the next one if this one alone took the whole budget.
                round.over_budget += (k..n).filter(|j| !running.contains(&order[(start + j) % n])).count() as u64;
                self.cursor = (start + k + usize::from(!progressed)) % n;
                return round;
            }
            progressed = true;
            match outcome {
                Ok(frames) => round.stacks.push(WaitStack { task, thread: tasks.get(&task).and_then(|l| l.thread), frames }),
                Err(Chain::NotSuspended) => round.not_waiting.push(task),
                Err(Chain::Unsettled) => round.unsettled += 1,
                Err(_) => round.unreadable += 1,
            }
        }
        self.cursor = start;
        round
    }

    /// Every task of the process with its bytes and the thread whose list holds it, and the
    /// tasks running now. `Err` when the listing stopped early (a read failed, the budget or
    /// [`MAX_LISTED`]); what was listed until then is kept.
    fn list(&self, mem: &ProcessMemory, tasks: &mut HashMap<u64, Listed>, running: &mut HashSet<u64>) -> Result<(), ()> {
        let r = &self.reader;
        let mut interp = mem.read_u64(r.interpreters_head).map_err(|_| ())?;
        for _ in 0..super::MAX_INTERPRETERS {
            if interp == 0 {
                break;
            }
            let mut tstate = mem.read_u64(interp.wrapping_add(r.layout.thread.interp_threads_head.into())).map_err(|_| ())?;
            for _ in 0..super::MAX_THREADS {
                if tstate == 0 {
                    break;
                }
                // Running task, native thread id and next: one read of the thread state's
                // first bytes when they hold all three, else three reads.
                let task = mem.read_u64(tstate.wrapping_add(r.asyncio.thread_running_task.into())).map_err(|_| ())?;
                if task != 0 {
                    running.insert(task);
                }
                let tid = mem.read_u64(tstate.wrapping_add(r.layout.thread.native_thread_id.into())).ok();
                self.list_tasks_at(mem, tstate.wrapping_add(r.asyncio.thread_tasks_head.into()), tid, tasks)?;
                tstate = mem.read_u64(tstate.wrapping_add(r.layout.thread.next.into())).map_err(|_| ())?;
            }
            self.list_tasks_at(mem, interp.wrapping_add(r.asyncio.interp_tasks_head.into()), None, tasks)?;
            interp = match r.interpreters {
                Some(i) => mem.read_u64(interp.wrapping_add(i.next.into())).map_err(|_| ())?,
                None => 0,
            };
        }
        Ok(())
    }

    /// The tasks of the list whose head node is at `head`: each task object read whole once
    /// (its node's next link is inside it).
    fn list_tasks_at(&self, mem: &ProcessMemory, head: u64, thread: Option<u64>, tasks: &mut HashMap<u64, Listed>) -> Result<(), ()> {
        let r = &self.reader;
        let next_at = u64::from(r.objects.llist_next);
        let mut node = mem.read_u64(head.wrapping_add(next_at)).map_err(|_| ())?;
        let mut steps = 0;
        while node != 0 && node != head {
            if tasks.len() >= MAX_LISTED || steps >= MAX_LISTED {
                return Err(());
            }
            steps += 1;
            let task = node.wrapping_sub(r.asyncio.task_node.into());
            let bytes = mem.read_vec(task, r.asyncio.task_size as usize).map_err(|_| ())?;
            let next = field_u64(&bytes, (r.asyncio.task_node + r.objects.llist_next) as usize).ok_or(())?;
            let is_task = bytes.get(r.asyncio.task_is_task as usize) == Some(&1) && r.layout.objects.live_count(&bytes, LIVE_BELOW);
            if is_task && tasks.insert(task, Listed { bytes, thread }).is_some() {
                // A node seen twice: the list loops (torn or forged); stop here.
                return Err(());
            }
            node = next;
        }
        Ok(())
    }

    /// The coroutine chain of `task` (memoized for the round).
    /// The coroutine chain of `task` and the coroutine it was read from (memoized for the
    /// round).
    fn chain_of(
        &mut self,
        mem: &ProcessMemory,
        task: u64,
        tasks: &HashMap<u64, Listed>,
        chains: &mut HashMap<u64, (Chain, u64, Option<Mark>)>,
    ) -> (Chain, u64, Option<Mark>) {
        if let Some(c) = chains.get(&task) {
            return c.clone();
        }
        let coro = match tasks.get(&task) {
            Some(l) => field_u64(&l.bytes, self.reader.asyncio.task_coro as usize).unwrap_or(0),
            None => match mem.read_u64(task.wrapping_add(self.reader.asyncio.task_coro.into())) {
                Ok(c) => c,
                Err(_) => return (Chain::Unreadable, 0, None),
            },
        };
        let first = self.coroutine_chain(mem, coro);
        let second = self.coroutine_chain(mem, coro);
        let mark = self.last_mark.take();
        let chain = match (first, second) {
            (Some(a), Some(b)) if same(&a, &b) => a,
            (None, _) | (_, None) => Chain::Unreadable,
            _ => Chain::Unsettled,
        };
        chains.insert(task, (chain.clone(), coro, mark));
        (chain, coro, mark)
    }

    /// The wait stack of suspended `task`: its awaiters' chains root first, then its own.
    fn stack_of(
        &mut self,
        mem: &ProcessMemory,
        task: u64,
        tasks: &HashMap<u64, Listed>,
        running: &HashSet<u64>,
        memo: &mut Memo,
    ) -> Result<Vec<WaitFrame>, Chain> {
        let Memo { chains, links } = memo;
        // Leaf first: [task frames..., task name, (awaited by)?, awaiter frames, ...].
        let mut parts: Vec<Vec<WaitFrame>> = Vec::new();
        let mut seen = HashSet::from([task]);
        let mut current = task;
        for _ in 0..MAX_AWAIT_CHAIN {
            let (Chain::Suspended { frames, .. }, coro, mark) = self.chain_of(mem, current, tasks, chains) else {
                return Err(Chain::Unsettled);
            };
            // The task as it is now, after its chain settled (not as listed): it must still be
            // a live task holding the coroutine read, and who awaits it is read from it (a
            // task created just before the listing may be given its awaiter by `gather` or a
            // TaskGroup only after it, and a task freed since then may have a successor at
            // its address).
            let link = match links.get(&current) {
                Some(link) => link.clone(),
                None => {
                    let now = self.reader.read_task(mem, current).map_err(|_| Chain::Unreadable)?;
                    let holds = field_u64(&now, self.reader.asyncio.task_coro as usize) == Some(coro);
                    if !holds || !self.reader.layout.objects.live_count(&now, LIVE_BELOW) {
                        return Err(Chain::Unsettled);
                    }
                    let task_type = self.reader.ob_type(&now);
                    let awaiters = self.reader.awaiters(mem, &now, task_type).map_err(|_| Chain::Unreadable)?;
                    let name = shown_task_name(&self.task_name(mem, &now), frames.first().map(|f| f.function.as_str()));
                    // Its coroutine still where it was when its chain settled: the awaiters
                    // read belong to that wait (a task that finished meanwhile has lost them).
                    if mark.is_none() || self.mark(mem, coro) != mark {
                        return Err(Chain::Unsettled);
                    }
                    let link = Link { first: awaiters.iter().map(|(a, _)| *a).min(), count: awaiters.len(), name, task_type };
                    links.insert(current, link.clone());
                    link
                }
            };
            let task_type = link.task_type;
            let mut part = vec![WaitFrame::Task(link.name.clone())];
            part.extend(frames.into_iter().map(WaitFrame::Code));
            let Some(awaiter) = link.first else {
                parts.push(part);
                break;
            };
            if link.count > 1 {
                part.insert(0, WaitFrame::AwaitedBy(link.count));
            }
            parts.push(part);
            if !seen.insert(awaiter) || running.contains(&awaiter) {
                // A cycle, or an awaiter running now: not a chain of waits.
                return Err(Chain::Unsettled);
            }
            // The awaiter must still be suspended awaiting this task (when it awaits a task
            // directly; through gather or a TaskGroup it awaits a future).
            if let (Chain::Suspended { awaits, awaits_type, .. }, _, _) = self.chain_of(mem, awaiter, tasks, chains) {
                if awaits != current && awaits_type == task_type {
                    return Err(Chain::Unsettled);
                }
            }
            current = awaiter;
        }
        Ok(parts.into_iter().rev().flatten().collect())
    }

    /// The frames of coroutine `coro` and of the coroutines it awaits, outermost first, and
    /// what the innermost awaits; `None` when something could not be read.
    fn coroutine_chain(&mut self, mem: &ProcessMemory, coro: u64) -> Option<Chain> {
        let r = Facts {
            layout: self.reader.layout,
            objects: self.reader.objects,
            yield_from_states: self.reader.awaits.yield_from_states,
            awaited_slot: self.reader.awaits.awaited_slot,
        };
        if coro == 0 {
            return None;
        }
        let frame_layout = r.layout.frame;
        let iframe = r.objects.gen_iframe as usize;
        let frame_size = (frame_layout.read_size as usize).min(profiler_common::FRAME_READ_MAX);
        let len = (iframe + frame_size).max(r.objects.gen_frame_state as usize + 1).max(r.layout.objects.ob_type as usize + 8);
        if len > MAX_CORO_READ {
            return None;
        }
        let sp_in_frame = (r.objects.frame_stackpointer as usize + 8 <= frame_size).then_some(r.objects.frame_stackpointer as usize);
        let mut frames = Vec::new();
        let mut current = coro;
        let window = len.max(CORO_WINDOW);
        let read_coro = |address: u64| mem.read_vec(address, window).or_else(|_| mem.read_vec(address, len));
        let mut bytes = read_coro(current).ok()?;
        let coro_type = field_u64(&bytes, r.layout.objects.ob_type as usize)?;
        self.last_mark = mark_of(&r, &bytes);
        for depth in 0..MAX_CORO_DEPTH {
            let state = *bytes.get(r.objects.gen_frame_state as usize)? as i8;
            if !self.suspended_states.contains(&state) {
                if depth == 0 {
                    return Some(Chain::NotSuspended);
                }
                // An awaited coroutine that is not suspended: the chain is changing.
                return Some(Chain::Unsettled);
            }
            let frame = current.wrapping_add(r.objects.gen_iframe.into());
            let mut buf: FrameBytes = [0; profiler_common::FRAME_READ_MAX + 8];
            buf[..frame_size].copy_from_slice(bytes.get(iframe..iframe + frame_size)?);
            let mut entry = FrameEntry::default();
            decode_frame(&frame_layout, frame, &buf, &mut entry);
            let code = self.code(mem, &entry)?;
            frames.push(TaskFrame {
                function: code.qualname.to_string(),
                file: code.filename.to_string(),
                line: self.lines.line(&self.reader, mem, &entry, &code),
            });
            if !r.yield_from_states.contains(&state) {
                return Some(Chain::Suspended { frames, awaits: 0, awaits_type: 0 });
            }
            // Suspended in `await`: the awaited object is on top of the frame's stack.
            let sp = match sp_in_frame {
                Some(at) => field_u64(&buf, at)?,
                None => mem.read_u64(frame.wrapping_add(r.objects.frame_stackpointer.into())).ok()?,
            };
            let slot = sp.wrapping_sub(8 * r.awaited_slot);
            let in_window = slot.checked_sub(current).and_then(|at| field_u64(&bytes, usize::try_from(at).ok()?));
            let awaited = match in_window {
                Some(word) => word,
                None => mem.read_u64(slot).ok()?,
            } & frame_layout.code_mask;
            if awaited == 0 {
                return Some(Chain::Suspended { frames, awaits: 0, awaits_type: 0 });
            }
            let next = match read_coro(awaited) {
                Ok(next) => next,
                // Smaller than a coroutine and at the end of its mapping: not a coroutine.
                Err(_) => {
                    let awaits_type = mem.read_u64(awaited.wrapping_add(r.layout.objects.ob_type.into())).ok()?;
                    return Some(Chain::Suspended { frames, awaits: awaited, awaits_type });
                }
            };
            let awaits_type = field_u64(&next, r.layout.objects.ob_type as usize)?;
            if awaits_type != coro_type {
                return Some(Chain::Suspended { frames, awaits: awaited, awaits_type });
            }
            current = awaited;
            bytes = next;
        }
        Some(Chain::Suspended { frames, awaits: 0, awaits_type: 0 })
    }

    /// The mark of coroutine `coro` now.
    fn mark(&self, mem: &ProcessMemory, coro: u64) -> Option<Mark> {
        let r = Facts {
            layout: self.reader.layout,
            objects: self.reader.objects,
            yield_from_states: self.reader.awaits.yield_from_states,
            awaited_slot: self.reader.awaits.awaited_slot,
        };
        let len = (r.objects.gen_iframe as usize + r.layout.frame.instr as usize + 8).max(r.objects.gen_frame_state as usize + 1);
        mark_of(&r, &mem.read_vec(coro, len).ok()?)
    }

    /// The code object of a frame, from the cache when its validation word is the same.
    fn code(&mut self, mem: &ProcessMemory, entry: &FrameEntry) -> Option<Arc<CodeInfo>> {
        let layout = self.reader.layout.kernel_frame_layout();
        let check = *self.checks.entry(entry.code).or_insert_with(|| read_code_check(mem, &layout, entry));
        if let Some(code) = self.codes.get(&(entry.code, check)) {
            return Some(code.clone());
        }
        let info = Arc::new(symbolize::read_code(mem, &self.reader.layout, &self.reader.types, entry.code).ok()?);
        if read_code_check(mem, &layout, entry) != check {
            return None;
        }
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        self.codes.insert((entry.code, check), info.clone());
        Some(info)
    }
}

impl WaitReader {
    /// A task's name as `AsyncReader::task_name` reads it, with fewer reads: the name
    /// object's type is compared with `str`'s and `int`'s addresses (static types), and its
    /// name read only for a type not seen yet.
    fn task_name(&mut self, mem: &ProcessMemory, task: &[u8]) -> String {
        let r = &self.reader;
        let name = field_u64(task, r.asyncio.task_name as usize).unwrap_or(0);
        let Ok(ty) = mem.read_u64(name.wrapping_add(r.layout.objects.ob_type.into())) else { return "?".into() };
        if Some(ty) != self.str_type && Some(ty) != self.int_type {
            match r.type_name(mem, name).as_deref() {
                Some("str") if self.str_type.is_none() => self.str_type = Some(ty),
                Some("int") if self.int_type.is_none() => self.int_type = Some(ty),
                _ => return "?".into(),
            }
        }
        if Some(ty) == self.str_type {
            return symbolize::read_str(mem, &r.layout.objects, name, super::MAX_TASK_NAME_CHARS, self.str_type)
                .unwrap_or_else(|_| "?".into());
        }
        if Some(ty) == self.int_type {
            return r.small_int(mem, name).map_or_else(|| "?".into(), |n| format!("Task-{n}"));
        }
        "?".into()
    }
}

/// What a coroutine walk needs of the reader (copied, so the code cache can be updated).
struct Facts {
    layout: crate::target::layout::PythonLayout,
    objects: crate::target::layout::published::ObjectOffsets,
    yield_from_states: &'static [i8],
    awaited_slot: u64,
}

/// Where a coroutine is: its frame state and its frame's instruction word.
type Mark = (i8, u64);

/// The mark of a coroutine from its bytes (read from its start).
fn mark_of(r: &Facts, bytes: &[u8]) -> Option<Mark> {
    let state = *bytes.get(r.objects.gen_frame_state as usize)? as i8;
    let instr = field_u64(bytes, r.objects.gen_iframe as usize + r.layout.frame.instr as usize)?;
    Some((state, instr))
}

/// Whether two reads of a chain agree.
fn same(a: &Chain, b: &Chain) -> bool {
    match (a, b) {
        (Chain::Suspended { frames: f1, awaits: a1, .. }, Chain::Suspended { frames: f2, awaits: a2, .. }) => f1 == f2 && a1 == a2,
        (Chain::NotSuspended, Chain::NotSuspended) => true,
        _ => false,
    }
}

/// A live task's reference count (default builds) stays below this; a freed small object's
/// first word holds the allocator's free-list link (an address, or 0) instead
/// (`ObjectLayout::live_count`).
const LIVE_BELOW: u64 = 1 << 32;

/// The name a task is shown by (SHAPE of `--async`): an explicit name as it is; an automatic
/// one (`Task-<n>`) by its coroutine's qualname, so tasks made per request aggregate.
pub fn shown_task_name(name: &str, coroutine: Option<&str>) -> String {
    let automatic = name.strip_prefix("Task-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match coroutine {
        Some(qualname) if automatic => qualname.to_string(),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_names_show_the_coroutine() {
        assert_eq!(shown_task_name("Task-12", Some("handle")), "handle");
        assert_eq!(shown_task_name("Task-12", None), "Task-12");
        assert_eq!(shown_task_name("worker-3", Some("work")), "worker-3");
        assert_eq!(shown_task_name("Task-", Some("work")), "Task-");
        assert_eq!(shown_task_name("Task-1x", Some("work")), "Task-1x");
    }

    #[test]
    fn freed_objects_have_no_live_count() {
        let objects = crate::target::layout::ObjectLayout::TEST_312;
        let object = |first: u64| first.to_le_bytes().to_vec();
        assert!(objects.live_count(&object(3), LIVE_BELOW));
        assert!(!objects.live_count(&object(0), LIVE_BELOW));
        assert!(!objects.live_count(&object(0x7f12_3456_7890), LIVE_BELOW));
        // Free-threaded heads: the owner's count at 0x0c, the shared count (two flag bits)
        // at 0x10; the first word is the owning thread's id (or, once freed, a link).
        let ft = crate::target::layout::ObjectLayout::TEST_314T;
        let head = |local: u32, shared: i64| {
            let mut b = vec![0u8; 0x20];
            b[..8].copy_from_slice(&0x7f12_3456_7890u64.to_le_bytes());
            b[0x0c..0x10].copy_from_slice(&local.to_le_bytes());
            b[0x10..0x18].copy_from_slice(&shared.to_le_bytes());
            b
        };
        assert!(ft.live_count(&head(1, 0), LIVE_BELOW), "owned by its thread");
        assert!(ft.live_count(&head(0, 2 << 2), LIVE_BELOW), "shared references only");
        assert!(!ft.live_count(&head(0, 3), LIVE_BELOW), "merged, spent (the flags alone)");
        assert!(!ft.live_count(&head(0, -4), LIVE_BELOW), "queued to merge at zero");
        assert!(!ft.live_count(&head(1, 0)[..0x10], LIVE_BELOW), "a short head");
    }
}

/// Rounds against real 3.14 and 3.15 interpreters (Debian sid root, under chroot; skipped with
/// a message when absent): a root task awaits task A, which gathers B1 and B2 (automatic
/// names: shown by their coroutines); B1 awaits C, which sleeps; B2 sleeps in b2_inner.
#[cfg(test)]
mod live_tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::target::memory::ReadBudget;

    const SCRIPT: &str = r#"
import asyncio
async def c_sleep():
    await asyncio.sleep(0.2)
    print("ready", flush=True)
    await asyncio.sleep(60)
async def b1():
    await asyncio.create_task(c_sleep(), name="C")
async def b2_inner():
    await asyncio.sleep(60)
async def b2():
    await b2_inner()
async def a():
    await asyncio.gather(asyncio.create_task(b1()), asyncio.create_task(b2()))
async def main():
    await asyncio.create_task(a(), name="A")
asyncio.run(main())
"#;

    fn names(stack: &WaitStack) -> Vec<String> {
        stack.frames.iter().map(WaitFrame::name).collect()
    }

    fn waits_of(minor: u32) {
        let Some((_child, process)) = super::super::live_tests::start_sid(minor, SCRIPT) else { return };
        let pid = process.pid;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mem = ProcessMemory::new(pid);
        // The module's section may be found a moment after the process is (as the session's
        // retries allow for).
        let async_reader = loop {
            match AsyncReader::new(&process) {
                Ok(r) => break r,
                Err(e) => assert!(Instant::now() < deadline, "{e}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut reader = WaitReader::new(async_reader.clone());
        let round = reader.round(&mem);
        assert_eq!(round.listed.len(), 5, "{round:#?}");
        assert_eq!((round.unsettled, round.unreadable, round.over_budget), (0, 0, 0), "{round:#?}");
        let mut stacks: Vec<Vec<String>> = round.stacks.iter().map(names).collect();
        stacks.sort();
        let expected: [&[&str]; 5] = [
            &["task main", "main"],
            &["task main", "main", "task A", "a"],
            &["task main", "main", "task A", "a", "task b1", "b1"],
            &["task main", "main", "task A", "a", "task b1", "b1", "task C", "c_sleep", "sleep"],
            &["task main", "main", "task A", "a", "task b2", "b2", "b2_inner", "sleep"],
        ];
        let mut expected: Vec<Vec<String>> = expected.iter().map(|e| e.iter().map(|s| s.to_string()).collect()).collect();
        expected.sort();
        assert_eq!(stacks, expected, "{round:#?}");
        // The line awaiting in b2_inner.
        let b2 = round.stacks.iter().find(|s| names(s).contains(&"b2_inner".to_string())).expect("b2");
        let inner = b2.frames.iter().find_map(|f| match f {
            WaitFrame::Code(c) if c.function == "b2_inner" => Some(c.line),
            _ => None,
        });
        assert_eq!(inner, Some(10), "{b2:#?}");

        // A budget one read short of a whole round: rounds stop early (counted), and each
        // starts where the last stopped, so every task is read within a few rounds (a task
        // whose stack alone costs more than the budget would be skipped, and counted).
        let whole = round_cost(&mut WaitReader::new(async_reader.clone()), &mem);
        let budget = ReadBudget { reads: whole.reads - 1, bytes: whole.bytes, exhausted: false };
        let mut small = WaitReader::new(async_reader.clone());
        let mut seen = std::collections::HashSet::new();
        let mut over = 0;
        for _ in 0..10 {
            let (round, used) = crate::target::memory::with_read_budget(budget, || small.round(&mem));
            assert!(used.reads <= budget.reads);
            over += round.over_budget;
            seen.extend(round.stacks.iter().map(|s| s.task));
        }
        assert!(over > 0, "a budget short of a round never ran out");
        assert_eq!(seen.len(), 5, "not every suspended task was read in turn");
    }

    /// What one whole round reads.
    fn round_cost(reader: &mut WaitReader, mem: &ProcessMemory) -> ReadBudget {
        let limit = ReadBudget { reads: u64::MAX, bytes: u64::MAX, exhausted: false };
        crate::target::memory::with_read_budget(limit, || reader.round(mem)).1
    }

    #[test]
    fn waits_sid_3_14() {
        waits_of(14);
    }

    #[test]
    fn waits_sid_3_15() {
        waits_of(15);
    }
}
