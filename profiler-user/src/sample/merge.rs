//! Stage 4, merge: the Python frames of a sample → the stack shown, with what goes around
//! them merged in one place (as the OpenTelemetry profiler merges its unwinders' frames):
//! native frames spliced at the interpreter's evaluation frames (`--native`, `native` and `native_merge`),
//! the running asyncio task's chain in place of the event loop's machinery (`--async`), the
//! `interpreter <id>` frame (subinterpreters), the leaf the record's charge names
//! (`<off-cpu: ...>`, `<GC>`), and the kernel frames where an off-CPU interval blocked
//! (`--kernel`).
//!
//! Input: `stack`, the shown Python frames root first; `walked`, every interpreter frame
//! with its id (native part only); `shown`, which full frames produced a frame of `stack`.
//! Output: `stack` as it is added to the profile; `result` set when a frame cannot be made
//! (the profile is full, a task's coroutine unreadable).

use std::{sync::mpsc, time::Instant};

use profiler_common::{FrameEntry, RUNNING_TASK_UNKNOWN, SampleHeader, task_level_flags};

use super::{
    Charge, FrameError, FrameId, Target,
    aggregate::{FrameName, Profile},
    decode::Decoded,
    process::{ASYNC_RETRY, AsyncState},
};
use crate::{
    target::asyncio::{AsyncReader, AsyncioError, ChainMiss},
    sample::native_merge::WalkedFrame,
};

/// Stage 4 of the sample path (see `crate::sample`).
impl Target {
    /// Merges native, task and kernel frames (and the interpreter and leaf frames) around the
    /// Python frames on `stack` (see the module's doc). `walked` is kept for the next sample.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn merge(
        &mut self,
        header: &SampleHeader,
        record: &Decoded,
        charge: &Charge,
        threads: bool,
        shown: u64,
        stack: &mut Vec<FrameId>,
        walked: Vec<WalkedFrame>,
        profile: &mut Profile,
        result: &mut Result<(), FrameError>,
    ) {
        // The Python frames are final here; native and kernel frames go around them.
        let mut merged = std::mem::take(&mut self.merged);
        let collecting = header.flags & profiler_common::sample_flags::GC != 0;
        if let (Ok(()), Some(part), Some(native)) = (&*result, record.native_part, self.native.as_mut()) {
            if !stack.is_empty() {
                match native.finish(stack, &walked, part, collecting, profile, &mut self.counters, &mut merged) {
                    Ok(()) => std::mem::swap(stack, &mut merged),
                    Err(_) => *result = Err(FrameError::ProfileFull),
                }
            }
        }
        self.merged = merged;
        self.walked = walked;
        if result.is_ok() && record.native_part.is_none() && !stack.is_empty() && matches!(self.asyncio, AsyncState::Pending { .. } | AsyncState::Ready(_)) {
            let frames: Vec<FrameEntry> = record.frames.iter().collect();
            *result = self.apply_async(header, record.chain_time(header), &frames, shown, stack, profile);
        }
        if result.is_ok() && threads && header.interpreter != 0 && !stack.is_empty() {
            // `interpreter <id>` right after the thread, for processes with subinterpreters.
            match synthetic_frame(profile, format!("interpreter {}", header.interpreter - 1)) {
                Ok(id) => stack.insert(0, id),
                Err(e) => *result = Err(e),
            }
        }
        if let (Ok(()), Some(leaf)) = (&*result, charge.leaf) {
            match profile.try_intern_static(leaf) {
                Some(id) => stack.push(id),
                None => *result = Err(FrameError::ProfileFull),
            }
        }
        if let (Ok(()), Some(kernel), Some(native)) = (&*result, charge.kernel.as_deref(), self.native.as_mut()) {
            if native.push_blocked_kernel_frames(kernel, profile, stack).is_err() {
                *result = Err(FrameError::ProfileFull);
            }
        }
    }

    /// The asyncio reader, if made; starts (or collects) the job that makes it when due.
    pub(crate) fn async_reader(&mut self) -> Option<AsyncReader> {
        if let AsyncState::Pending { retry_at, job } = &mut self.asyncio {
            match job.as_ref().map(mpsc::Receiver::try_recv) {
                Some(Ok(Ok(reader))) => self.asyncio = AsyncState::Ready(Box::new(reader)),
                Some(Ok(Err(AsyncioError::NotLoaded { .. } | AsyncioError::Discovery { .. })))
                | Some(Err(mpsc::TryRecvError::Disconnected)) => {
                    *retry_at = Instant::now() + ASYNC_RETRY;
                    *job = None;
                }
                Some(Ok(Err(_))) => self.asyncio = AsyncState::Refused,
                Some(Err(mpsc::TryRecvError::Empty)) => {}
                None if Instant::now() >= *retry_at => {
                    let (tx, rx) = mpsc::channel();
                    let process = self.process.clone();
                    let spawned = std::thread::Builder::new()
                        .name("pyperch-asyncio".into())
                        .spawn(move || {
                            let _ = tx.send(AsyncReader::new(&process));
                        });
                    match spawned {
                        Ok(_) => *job = Some(rx),
                        Err(_) => *retry_at = Instant::now() + ASYNC_RETRY,
                    }
                }
                None => {}
            }
        }
        match &self.asyncio {
            AsyncState::Ready(reader) => Some((**reader).clone()),
            _ => None,
        }
    }

    /// Replaces the event-loop machinery of `stack` (root first; `shown` has bit `i` set when
    /// full frame `i`, leaf first, produced a frame of it) by the running task's chain as the
    /// kernel read it with the sample (at `chain_time`: the sample's, or an off-CPU interval's
    /// switch-out): each awaiting task root first with its coroutine frames
    /// (where it waits), then the running task's own frames from its coroutine's up. Leaves
    /// the stack alone when the thread runs no task or the chain is not whole (counted).
    fn apply_async(
        &mut self,
        header: &SampleHeader,
        chain_time: u64,
        frames: &[FrameEntry],
        shown: u64,
        stack: &mut Vec<FrameId>,
        profile: &mut Profile,
    ) -> Result<(), FrameError> {
        let Some(reader) = self.async_reader() else { return Ok(()) };
        let pending = self.chains.remove(&(chain_time, header.tid));
        let miss = |target: &mut Self, miss: ChainMiss| {
            *target.counters.async_misses.entry(miss).or_default() += 1;
            Ok(())
        };
        match header.running_task {
            0 => return Ok(()),
            RUNNING_TASK_UNKNOWN => return miss(self, ChainMiss::ReadLate),
            _ => {}
        }
        let chain = match pending {
            Some(Ok(chain)) => chain,
            Some(Err(reason)) => return miss(self, reason),
            None => return miss(self, ChainMiss::NoRecord),
        };
        // The running task's coroutine frame among the sampled ones: it and the frames above
        // it are the task's own; below it, the loop's machinery.
        let frame = reader.coroutine_frame(chain.running().coro);
        let generator = self.process.layout.frame_semantics.owner_generator;
        let Some(i) = frames.iter().position(|e| e.frame == frame && Some(e.owner) == generator) else {
            return miss(self, ChainMiss::NotOnStack);
        };
        if i >= 64 || shown >> i & 1 == 0 {
            return miss(self, ChainMiss::NotOnStack);
        }
        // Stack entries (root first) of the full frames up to index `j` (leaf first).
        let entries_up_to = |j: usize| {
            let mask = if j >= 63 { u64::MAX } else { (1u64 << (j + 1)) - 1 };
            (shown & mask).count_ones() as usize
        };
        let Some(keep_from) = stack.len().checked_sub(entries_up_to(i)) else { return Ok(()) };
        // A task awaited by no one that runs inside another coroutine's step was started
        // eagerly (`eager_start=True`, aiohttp's request tasks): its creator's coroutine frames
        // lie right below its own (below the creation call). The kernel names the creating
        // task when its index knows it (`CREATED_EAGERLY`: the next level, with its awaiters);
        // else the creator is shown by its coroutine, with nothing above it. Below the loop's
        // machinery no coroutine frame lies.
        let creator = (chain.running().awaiters == 0).then(|| creator_frames(frames, i, generator)).flatten();
        let eager_level = chain.running().flags & task_level_flags::CREATED_EAGERLY != 0;
        let creator_ids: Vec<FrameId> = match creator {
            // The creator's coroutine frames, root first (the creation call's frames left out).
            Some((nearest, k)) => (nearest..=k)
                .rev()
                .filter(|&j| shown >> j & 1 != 0)
                .filter_map(|j| stack.len().checked_sub(entries_up_to(j)).map(|at| stack[at]))
                .collect(),
            None => Vec::new(),
        };
        let objects = self.process.layout.objects;
        let str_type = self.process.str_type_address;
        let mut logical = Vec::with_capacity(stack.len());
        if let (Some((_, k)), false) = (creator, eager_level) {
            let name = self.code_entry(&frames[k], frames[k].check).map(|c| c.info.qualname.to_string()).unwrap_or_else(|_| "?".into());
            logical.push(synthetic_frame(profile, format!("task {name}"))?);
            logical.extend_from_slice(&creator_ids);
            self.counters.async_eager_creators += 1;
        }
        let levels = chain.levels();
        for (at, level) in levels.iter().enumerate().rev() {
            // The chain goes through one of several awaiters: said right before the task.
            let awaited_by = level.task.awaiters;
            if awaited_by > 1 {
                logical.push(synthetic_frame(profile, format!("(awaited by {awaited_by} tasks)"))?);
            }
            // The level of the task that started the running one eagerly: its frames are
            // the sampled ones, and its coroutine's frame must be the one found there.
            let is_creator = eager_level && at == 1;
            let coroutine = match creator {
                Some((_, k)) if is_creator => frames[k],
                _ if at == 0 => frames[i],
                _ => match level.frames.first() {
                    Some(&first) => first,
                    None => return miss(self, ChainMiss::Unreadable),
                },
            };
            if is_creator && (creator.is_none() || reader.coroutine_frame(level.task.coro) != coroutine.frame) {
                return miss(self, ChainMiss::Unreadable);
            }
            // A task never named is shown by its coroutine, so that one task per request
            // aggregates; the running task's coroutine frame is the sampled one.
            // (`Task-<n>` once its name was asked for, as `asyncio::waits` shows it too.)
            let qualname = self.code_entry(&coroutine, coroutine.check).map(|c| c.info.qualname.to_string()).ok();
            let name = match (level.given_name(&objects, str_type), qualname) {
                (Some(name), qualname) => crate::target::asyncio::waits::shown_task_name(&name, qualname.as_deref()),
                (None, Some(qualname)) => qualname,
                (None, None) => "?".into(),
            };
            logical.push(synthetic_frame(profile, format!("task {name}"))?);
            if is_creator {
                logical.extend_from_slice(&creator_ids);
                self.counters.async_eager_creators += 1;
            }
            for entry in level.frames {
                if let Some(id) = self.frame_id(entry, entry.check, profile)? {
                    logical.push(id);
                }
            }
        }
        logical.extend_from_slice(&stack[keep_from..]);
        *stack = logical;
        self.counters.async_task_stacks += 1;
        Ok(())
    }
}

/// For a running task whose coroutine frame is full frame `i` (leaf first): the full frames
/// of its creating task's coroutines when it was started eagerly, i.e. the run of coroutine
/// frames nearest below it (rootwards), as (nearest, outermost); `None` when there is none.
/// The kernel finds the creator by the same rule (`task_chain::creator_step`).
fn creator_frames(frames: &[FrameEntry], i: usize, generator: Option<u8>) -> Option<(usize, usize)> {
    let is_coroutine = |e: &FrameEntry| Some(e.owner) == generator;
    let nearest = i + 1 + frames.get(i + 1..)?.iter().position(is_coroutine)?;
    let run = frames[nearest..].iter().take_while(|e| is_coroutine(e)).count();
    Some((nearest, nearest + run - 1))
}

/// A frame that is not a Python function (`task <name>`, `interpreter <id>`): no file, no line.
fn synthetic_frame(profile: &mut Profile, name: String) -> Result<FrameId, FrameError> {
    profile.try_intern(FrameName { function: name.into(), file: "".into(), line: 0, native: None }).ok_or(FrameError::ProfileFull)
}
