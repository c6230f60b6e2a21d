//! asyncio task chains read by the kernel at sample time (`--async`, CPython 3.14+).
//!
//! When a sampled thread's event loop runs a task, the sampling program reads, while the
//! thread is stopped, the running task and the tasks awaiting it up to the root (through one
//! awaiter where several await a task: the lowest address, as CPython's own profiler picks),
//! and for each awaiting task the coroutine frames where it waits. It sends them as one
//! [`TaskChain`] record right before the sample's own record (same `tgid`, `tid`,
//! `time_ns`). Reading at sample time is what makes a server's chains right: its per-request
//! tasks are often gone by the time userspace could read them.
//!
//! Every read is bounded: at most `MAX_TASK_STEPS` steps per sample (a step reads one task,
//! one coroutine frame, or one slot of an awaiter set), `MAX_TASK_LEVELS` tasks,
//! `MAX_TASK_FRAMES` frames, sets of at most `MAX_TASK_SET_SLOTS` slots. A graph beyond them
//! is sent with `task_chain_status::OVER_BUDGET` and the sample keeps its plain stack.

use crate::{FrameEntry, SampleHeader};

/// Tasks of one chain, the running one included.
pub const MAX_TASK_LEVELS: usize = 16;
/// Coroutine frames of the awaiting tasks of one chain, all levels together.
pub const MAX_TASK_FRAMES: usize = 48;
/// Slots of one awaiter set scanned at most (its `mask + 1`).
pub const MAX_TASK_SET_SLOTS: u64 = 128;
/// Steps of one chain's read (see the module's doc).
pub const MAX_TASK_STEPS: u32 = 512;
/// Bytes of a task object the chain's fields may lie in (`TaskLayout::task_read`).
pub const TASK_READ_MAX: u32 = 256;
/// Bytes of a task's name object copied (its header and the first characters).
pub const TASK_NAME_BYTES: usize = 128;
/// Slots of an awaiter set read at once.
pub const SET_SLOTS_PER_READ: usize = 8;

/// What the kernel needs to read task chains (`ProcessInfo::tasks`), with the running task's
/// offset `ProcessInfo::running_task`. Offsets come from the target's `_asyncio` debug
/// offsets and `_Py_DebugOffsets`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLayout {
    /// Bytes of a task object the fields below lie in (at most `TASK_READ_MAX`; the kernel
    /// reads each field on its own). 0 (the default): no chain is read.
    pub task_read: u32,
    pub _pad: u32,
    /// In the task object.
    pub task_coro: u32,
    pub task_name: u32,
    pub task_awaited_by: u32,
    /// `u8` fields.
    pub task_awaited_by_is_set: u32,
    pub task_is_task: u32,
    /// `ob_type` in every object.
    pub ob_type: u32,
    /// In a coroutine object: its embedded interpreter frame, and its `gi_frame_state` (`i8`).
    pub gen_iframe: u32,
    pub gen_frame_state: u32,
    /// In an interpreter frame: `stackpointer`.
    pub frame_stackpointer: u32,
    /// Where the awaited object is on a frame suspended in `await`: this many words below
    /// its `stackpointer`.
    pub awaited_slot: u32,
    /// The `gi_frame_state` values of a coroutine suspended in `await` (`yield from`); an
    /// unused one is `i32::MIN`.
    pub suspended_state_a: i32,
    pub suspended_state_b: i32,
    /// In a set object: `mask` and `table`.
    pub set_mask: u32,
    pub set_table: u32,
    /// `FrameEntry::owner` of a frame owned by a generator or coroutine.
    pub owner_generator: u32,
    pub _pad2: u32,
}

/// How a chain's read ended (`TaskChain::status`).
pub mod task_chain_status {
    /// Read up to the root task.
    pub const COMPLETE: u32 = 0;
    /// A task, a frame or a set could not be read, or an awaiter was not a task.
    pub const UNREADABLE: u32 = 1;
    /// The graph goes on beyond the kernel's bounds (levels, frames, set slots, steps).
    pub const OVER_BUDGET: u32 = 2;
    /// A task seen twice: not a real await chain.
    pub const CYCLE: u32 = 3;
}

/// One task of a chain.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLevel {
    pub task: u64,
    pub coro: u64,
    /// Address of the task's name object (copied into `TaskChain::names`).
    pub name: u64,
    /// Live tasks awaiting this one (0: a root task); the next level is one of them.
    pub awaiters: u32,
    /// This task's coroutine frames in `TaskChain::frames`, after those of the levels below
    /// (awaiting tasks only: the running task's frames are the sample's own), its
    /// coroutine's frame first and the innermost awaiting coroutine's last.
    pub n_frames: u16,
    /// Bits of `task_level_flags`.
    pub flags: u16,
}

/// Bits of `TaskLevel::flags`.
pub mod task_level_flags {
    /// The running task was started eagerly inside the step of the next level's task (it is
    /// awaited by no one yet): that task's coroutine frames are the sampled ones below it.
    pub const CREATED_EAGERLY: u16 = 1;
}

/// Key of the kernel's map from coroutines to the tasks that drive them, which userspace
/// fills from each `--async` process's task lists (`TASK_OF_COROUTINE`): how the task that
/// eagerly started the running one is found. A hit is used only once the task it names is
/// read at sample time and drives that coroutine.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CoroutineKey {
    pub tgid: u32,
    pub _pad: u32,
    pub coro: u64,
}

/// Entries of that map.
pub const TASK_INDEX_SLOTS: u32 = 65536;

/// A `record_kind::TASK_CHAIN` record: level 0 is the running task (`SampleHeader::
/// running_task`), each next level a task awaiting the one before.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TaskChain {
    /// `kind` is `record_kind::TASK_CHAIN`; the rest as in the sample it belongs to.
    pub header: SampleHeader,
    /// One of `task_chain_status`.
    pub status: u32,
    pub n_levels: u32,
    pub n_frames: u32,
    /// Steps the read took (at most `MAX_TASK_STEPS`).
    pub steps: u32,
    pub levels: [TaskLevel; MAX_TASK_LEVELS],
    /// The first `TASK_NAME_BYTES` of each level's name object.
    pub names: [[u8; TASK_NAME_BYTES]; MAX_TASK_LEVELS],
    pub frames: [FrameEntry; MAX_TASK_FRAMES],
}

pub const TASK_CHAIN_SIZE: usize = core::mem::size_of::<TaskChain>();
const _: () = assert!(core::mem::size_of::<TaskLevel>() == 32);
const _: () = assert!(core::mem::size_of::<TaskLayout>() == 72);
const _: () =
    assert!(TASK_CHAIN_SIZE == crate::SAMPLE_HEADER_SIZE + 16 + 32 * 16 + 128 * 16 + 32 * 48);
