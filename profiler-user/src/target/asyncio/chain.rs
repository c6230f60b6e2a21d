//! The running task's chain as the kernel read it at sample time (`profiler_common::
//! TaskChain`): checked and taken apart here, with no read of target memory (the record is
//! all there is; a task named by a `str` is named from the bytes the kernel copied).

use profiler_common::{
    FrameEntry, MAX_TASK_FRAMES, MAX_TASK_LEVELS, Plain, TASK_NAME_BYTES, TaskChain,
    TaskLevel, task_chain_status,
};

use super::{ChainMiss, MAX_TASK_NAME_CHARS};
use crate::target::layout::ObjectLayout;
use crate::target::memory::{MemoryError, ReadMemory};
use crate::target::symbolize;

/// A chain record whose counts are consistent (`levels` and `frames` hold what the kernel
/// filled, no more). Level 0 is the running task.
pub struct Chain {
    record: Box<TaskChain>,
}

/// One level of a [`Chain`].
pub struct Level<'a> {
    pub task: &'a TaskLevel,
    /// The task's coroutine frames (awaiting tasks only), its coroutine's frame first.
    pub frames: &'a [FrameEntry],
    name_bytes: &'a [u8; TASK_NAME_BYTES],
}

impl Chain {
    /// Checks one `record_kind::TASK_CHAIN` record (whole, header included): a read the kernel
    /// could not finish is the reason the sample keeps its plain stack.
    pub fn parse(bytes: &[u8]) -> Result<Chain, ChainMiss> {
        let record = Box::new(TaskChain::read(bytes).ok_or(ChainMiss::Unreadable)?);
        match record.status {
            task_chain_status::COMPLETE => {}
            task_chain_status::OVER_BUDGET => return Err(ChainMiss::OverBudget),
            _ => return Err(ChainMiss::Unreadable),
        }
        let levels = record.n_levels as usize;
        let frames = record.n_frames as usize;
        let claimed: usize = record
            .levels
            .iter()
            .take(levels)
            .map(|l| l.n_frames as usize)
            .sum();
        if levels == 0
            || levels > MAX_TASK_LEVELS
            || frames > MAX_TASK_FRAMES
            || claimed != frames
            || record.levels[0].n_frames != 0
        {
            return Err(ChainMiss::Unreadable);
        }
        Ok(Chain { record })
    }

    pub fn tid(&self) -> u32 {
        self.record.header.tid
    }

    pub fn time_ns(&self) -> u64 {
        self.record.header.time_ns
    }

    /// The running task (level 0).
    pub fn running(&self) -> &TaskLevel {
        &self.record.levels[0]
    }

    /// The levels, the running task first and the root last.
    pub fn levels(&self) -> Vec<Level<'_>> {
        let r = &*self.record;
        let mut start = 0usize;
        let mut levels = Vec::with_capacity(r.n_levels as usize);
        for (task, name_bytes) in r.levels.iter().zip(&r.names).take(r.n_levels as usize) {
            let end = start + task.n_frames as usize;
            levels.push(Level {
                task,
                frames: r.frames.get(start..end).unwrap_or(&[]),
                name_bytes,
            });
            start = end;
        }
        levels
    }
}

impl Level<'_> {
    /// The name the task was given, when it is a `str` (a task never named has an `int`
    /// there, the number of its automatic name `Task-<n>`): `None` for those, and for a name
    /// the kernel could not copy. Names longer than the copy end in `…`.
    pub fn given_name(&self, objects: &ObjectLayout, str_type: Option<u64>) -> Option<String> {
        let str_type = str_type?;
        let type_word = self
            .name_bytes
            .get(objects.ob_type as usize..objects.ob_type as usize + 8)?;
        if u64::from_le_bytes(type_word.try_into().ok()?) != str_type {
            return None;
        }
        let copy = CopiedObject {
            address: self.task.name,
            bytes: self.name_bytes,
        };
        // An ASCII name of up to the bytes after the header, else a shorter cut (wider kinds).
        let ascii_room = TASK_NAME_BYTES.saturating_sub(objects.str_ascii_data as usize);
        let wide_room = TASK_NAME_BYTES.saturating_sub(objects.str_compact_data as usize) / 4;
        for cut in [ascii_room.min(MAX_TASK_NAME_CHARS), wide_room] {
            if let Ok((text, full)) =
                symbolize::read_str_prefix(&copy, objects, self.task.name, cut, Some(str_type))
            {
                return Some(if full > text.chars().count() {
                    format!("{text}…")
                } else {
                    text
                });
            }
        }
        None
    }
}

/// The bytes the kernel copied from one object: reads must lie inside them; type objects are
/// not read (a name's type is compared by address).
struct CopiedObject<'a> {
    address: u64,
    bytes: &'a [u8],
}

impl ReadMemory for CopiedObject<'_> {
    fn read_into(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let part = address
            .checked_sub(self.address)
            .and_then(|from| usize::try_from(from).ok())
            .and_then(|from| self.bytes.get(from..from.checked_add(buf.len())?));
        match part {
            Some(part) => {
                buf.copy_from_slice(part);
                Ok(())
            }
            None => Err(MemoryError::NotCopied {
                address,
                len: buf.len(),
            }),
        }
    }

    fn read_type_word(&self, address: u64) -> Result<u64, MemoryError> {
        Err(MemoryError::NotCopied { address, len: 8 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{SampleHeader, record_kind};

    const OBJECTS: ObjectLayout = ObjectLayout::TEST_312;
    const STR_TYPE: u64 = 0x5000;

    fn record(levels: &[(u64, u32, u32)], frames: u32, status: u32) -> Vec<u8> {
        let mut chain = TaskChain::zeroed();
        chain.header = SampleHeader {
            kind: record_kind::TASK_CHAIN,
            tid: 7,
            time_ns: 99,
            ..Default::default()
        };
        chain.status = status;
        chain.n_levels = levels.len() as u32;
        chain.n_frames = frames;
        for (i, &(task, awaiters, n_frames)) in levels.iter().enumerate() {
            chain.levels[i] = TaskLevel {
                task,
                coro: task + 8,
                name: 0x9000 + i as u64 * 0x100,
                awaiters,
                n_frames: n_frames as u16,
                flags: 0,
            };
        }
        chain.as_bytes().to_vec()
    }

    fn ascii_name(text: &str) -> [u8; TASK_NAME_BYTES] {
        let mut b = [0u8; TASK_NAME_BYTES];
        b[8..16].copy_from_slice(&STR_TYPE.to_le_bytes());
        b[0x10..0x18].copy_from_slice(&(text.len() as u64).to_le_bytes());
        b[0x20..0x24].copy_from_slice(&(1u32 << 2 | 1 << 5 | 1 << 6).to_le_bytes());
        let n = text.len().min(TASK_NAME_BYTES - 0x28);
        b[0x28..0x28 + n].copy_from_slice(&text.as_bytes()[..n]);
        b
    }

    #[test]
    fn consistent_records_only() {
        let ok = Chain::parse(&record(
            &[(0x100, 1, 0), (0x200, 0, 2)],
            2,
            task_chain_status::COMPLETE,
        ))
        .expect("valid");
        let levels: Vec<_> = ok
            .levels()
            .iter()
            .map(|l| (l.task.task, l.frames.len()))
            .collect();
        assert_eq!(levels, [(0x100, 0), (0x200, 2)]);
        assert_eq!((ok.tid(), ok.time_ns()), (7, 99));
        let bad = |bytes: &[u8]| Chain::parse(bytes).err();
        assert_eq!(
            bad(&record(&[(0x100, 1, 0), (0x200, 0, 2)], 3, 0)),
            Some(ChainMiss::Unreadable),
            "frame counts disagree"
        );
        assert_eq!(
            bad(&record(&[(0x100, 0, 1)], 1, 0)),
            Some(ChainMiss::Unreadable),
            "running task with frames"
        );
        assert_eq!(
            bad(&record(&[], 0, 0)),
            Some(ChainMiss::Unreadable),
            "no level"
        );
        assert_eq!(
            bad(&record(&[(0x100, 0, 0)], 0, task_chain_status::OVER_BUDGET)),
            Some(ChainMiss::OverBudget)
        );
        assert_eq!(
            bad(&record(&[(0x100, 0, 0)], 0, task_chain_status::CYCLE)),
            Some(ChainMiss::Unreadable)
        );
        assert_eq!(
            bad(&record(&[(0x100, 0, 0)], 0, 0)[..100]),
            Some(ChainMiss::Unreadable),
            "short"
        );
        let mut many = record(&[(0x100, 0, 0)], 0, 0);
        many[SAMPLE_HEADER + 4..SAMPLE_HEADER + 8]
            .copy_from_slice(&(MAX_TASK_LEVELS as u32 + 1).to_le_bytes());
        assert_eq!(bad(&many), Some(ChainMiss::Unreadable), "too many levels");
    }
    const SAMPLE_HEADER: usize = profiler_common::SAMPLE_HEADER_SIZE;

    #[test]
    fn names_from_copied_bytes() {
        let task = TaskLevel {
            name: 0x9000,
            ..Default::default()
        };
        let level = |bytes: &'static [u8; TASK_NAME_BYTES]| Level {
            task: Box::leak(Box::new(task)),
            frames: &[],
            name_bytes: bytes,
        };
        let b: &'static _ = Box::leak(Box::new(ascii_name("conn-handler")));
        assert_eq!(
            level(b).given_name(&OBJECTS, Some(STR_TYPE)).as_deref(),
            Some("conn-handler")
        );
        let long = "x".repeat(200);
        let mut b = ascii_name(&long);
        b[0x10..0x18].copy_from_slice(&200u64.to_le_bytes());
        let b: &'static _ = Box::leak(Box::new(b));
        let shown = level(b)
            .given_name(&OBJECTS, Some(STR_TYPE))
            .expect("cut name");
        assert!(shown.ends_with('…') && shown.len() < 200, "{shown}");
        // An int (an automatic name), or nothing copied: no given name.
        let mut b = ascii_name("7");
        b[8..16].copy_from_slice(&0x6000u64.to_le_bytes());
        let b: &'static _ = Box::leak(Box::new(b));
        assert_eq!(level(b).given_name(&OBJECTS, Some(STR_TYPE)), None);
        let b: &'static _ = Box::leak(Box::new([0u8; TASK_NAME_BYTES]));
        assert_eq!(level(b).given_name(&OBJECTS, Some(STR_TYPE)), None);
    }
}
