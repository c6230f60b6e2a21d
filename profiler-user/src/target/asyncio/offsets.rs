//! `_Py_AsyncioModuleDebugOffsets` (3.14+): the `.AsyncioDebug` section the `_asyncio`
//! module carries (in the `_asyncio` shared object, or in the interpreter's file when built
//! in). Thirteen `u64`, in three groups each starting with its struct's `size`:
//! - task object: size, task_name, task_awaited_by, task_is_task (u8),
//!   task_awaited_by_is_set (u8), task_coro, task_node (`struct llist_node`);
//! - interpreter state: size, asyncio_tasks_head (tasks of threads that exited);
//! - thread state (`_PyThreadStateImpl`): size, asyncio_running_loop, asyncio_running_task,
//!   asyncio_tasks_head.
//!
//! Invariant of a decoded value: every field plus its width lies within its group's size, and
//! sizes are bounded, so reads sized by them stay small.

use super::AsyncioError;

/// Bytes of the encoding.
pub const ENCODED_SIZE: usize = 13 * 8;
/// Upper bounds on the struct sizes (3.14: task 0xa8, interpreter 0x37248, thread 0x3a8).
const MAX_TASK_SIZE: u64 = 0x1000;
const MAX_INTERP_SIZE: u64 = 1 << 24;
const MAX_THREAD_SIZE: u64 = 1 << 16;

/// The decoded section (all offsets from the start of their struct).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncioOffsets {
    pub task_size: u32,
    pub task_name: u32,
    pub task_awaited_by: u32,
    pub task_is_task: u32,
    pub task_awaited_by_is_set: u32,
    pub task_coro: u32,
    pub task_node: u32,
    pub interp_tasks_head: u32,
    pub thread_running_loop: u32,
    pub thread_running_task: u32,
    pub thread_tasks_head: u32,
}

/// Decodes and checks the section's bytes.
pub fn decode(bytes: &[u8]) -> Result<AsyncioOffsets, AsyncioError> {
    let word = |i: usize| crate::target::memory::field_u64(bytes, 8 * i).ok_or(AsyncioError::BadOffsets("section too short"));
    let bounded = |size: u64, max: u64, what: &'static str| {
        if size == 0 || size > max { Err(AsyncioError::BadOffsets(what)) } else { Ok(size) }
    };
    let within = |value: u64, width: u64, size: u64| -> Result<u32, AsyncioError> {
        match value.checked_add(width) {
            Some(end) if end <= size => Ok(value as u32),
            _ => Err(AsyncioError::BadOffsets("a field lies outside its struct")),
        }
    };
    let task = bounded(word(0)?, MAX_TASK_SIZE, "task object size out of range")?;
    let interp = bounded(word(7)?, MAX_INTERP_SIZE, "interpreter state size out of range")?;
    let thread = bounded(word(9)?, MAX_THREAD_SIZE, "thread state size out of range")?;
    Ok(AsyncioOffsets {
        task_size: task as u32,
        task_name: within(word(1)?, 8, task)?,
        task_awaited_by: within(word(2)?, 8, task)?,
        task_is_task: within(word(3)?, 1, task)?,
        task_awaited_by_is_set: within(word(4)?, 1, task)?,
        task_coro: within(word(5)?, 8, task)?,
        task_node: within(word(6)?, 16, task)?,
        interp_tasks_head: within(word(8)?, 16, interp)?,
        thread_running_loop: within(word(10)?, 8, thread)?,
        thread_running_task: within(word(11)?, 8, thread)?,
        thread_tasks_head: within(word(12)?, 16, thread)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The sections of Debian's 3.14.10 `_asyncio` module and 3.15.2 executable.
    const DEBIAN_3_14: [u64; 13] =
        [0xa8, 0x88, 0x60, 0x6c, 0x6d, 0x80, 0x98, 0x37248, 0x2a80, 0x3a8, 0x360, 0x368, 0x370];
    const DEBIAN_3_15: [u64; 13] =
        [0xa8, 0x88, 0x60, 0x6c, 0x6d, 0x80, 0x98, 0x373c0, 0x2a68, 0x450, 0x400, 0x408, 0x418];

    #[test]
    fn real_sections() {
        let o = decode(&encode(&DEBIAN_3_14)).expect("3.14 decodes");
        assert_eq!((o.task_name, o.task_awaited_by, o.task_coro, o.task_node), (0x88, 0x60, 0x80, 0x98));
        assert_eq!((o.thread_running_task, o.thread_tasks_head, o.interp_tasks_head), (0x368, 0x370, 0x2a80));
        let o = decode(&encode(&DEBIAN_3_15)).expect("3.15 decodes");
        assert_eq!((o.thread_running_loop, o.thread_running_task, o.thread_tasks_head), (0x400, 0x408, 0x418));
    }

    #[test]
    fn hostile_sections() {
        assert!(decode(&encode(&DEBIAN_3_14[..12])).is_err(), "short");
        let mut w = DEBIAN_3_14;
        w[5] = 0xa4; // task_coro + 8 beyond the task size
        assert!(decode(&encode(&w)).is_err());
        let mut w = DEBIAN_3_14;
        w[0] = u64::MAX;
        assert!(decode(&encode(&w)).is_err());
        let mut w = DEBIAN_3_14;
        w[11] = u64::MAX - 2; // overflow when adding the width
        assert!(decode(&encode(&w)).is_err());
        assert!(decode(&[]).is_err());
    }
}
