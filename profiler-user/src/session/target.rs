//! One profiled process and the path of its samples: the kernel's frames, completed below
//! the first 64 through the frame cache (`completion`), turned into named frames through the
//! code-object cache (`symbolize`), added to the profile (`aggregate`).

use std::{
    path::PathBuf,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use profiler_common::{
    task_level_flags, FRAME_ENTRY_SIZE, FrameEntry, FullFrames, off_cpu_trailer, FrameLayout, INTERPRETER_UNKNOWN, MAX_FULL_FRAMES, RUNNING_TASK_UNKNOWN, ProcessInfo, SampleHeader, record_kind, sample_status,
};

use crate::{
    aggregate::{FrameId, FrameName, Profile},
    asyncio::{AsyncReader, AsyncioError, ChainMiss, chain::Chain},
    completion::{TailCache, TailSource, read_code_check},
    discovery::{self, PythonProcess},
    loader::{LoadError, Registry},
    memory::ProcessMemory,
    native::{
        NativeContext,
        merge::{EvalGrouping, WalkedFrame},
        sample::NativeSampler,
    },
    stats::{Counters, SampleOutcome},
    symbolize::{self, CodeInfo, SymbolError, TypeAddresses},
};

use super::cache_budget::{self, CACHE_BYTES, LedgerShare, PROCESS_BUDGET, SizedMap};
use super::full_frames_memo::FullFramesMemo;

/// One Python process being profiled, with its caches.
pub(crate) struct Target {
    pub(super) process: PythonProcess,
    /// The registration this target belongs to (`ProcessInfo::generation`): samples carrying
    /// another one were taken under an earlier registration of the same PID (another process,
    /// or this one before an exec) and are never attributed to this target.
    pub(super) generation: u32,
    /// What the kernel was given at registration (registered again, unchanged but for the
    /// task fields, once `--async`'s reader exists).
    pub(super) registered: ProcessInfo,
    /// The frame layout registered with the kernel, with the validation word's fields.
    kernel_frame: FrameLayout,
    mem: ProcessMemory,
    /// Code objects by address, with their validation word.
    codes: SizedMap<u64, Arc<CodeEntry>>,
    /// (code, validation word, instruction offset, owned by a generator) → the frame shown,
    /// or `None` for a frame CPython itself hides (not started yet). Ids of `epoch`. Keyed by
    /// the word the kernel (or the validated tail) saw, so a replaced code object never hits.
    positions: SizedMap<(u64, u32, i32, bool), Option<FrameId>>,
    /// Records' full frames → their shown frames, whole (ids of `epoch`, as `positions`).
    full_frames: FullFramesMemo,
    /// Validated deep-stack tails; their symbolized forms hold ids of `epoch`.
    tails: TailCache,
    /// The profile epoch the cached frame ids belong to (`Profile::epoch`).
    epoch: Option<u64>,
    /// The caches' bytes as last reported to the process-wide ledger (`budget`).
    ledger: LedgerShare,
    pub(super) counters: Counters,
    /// Still running and registered with the kernel.
    pub(super) alive: bool,
    /// `/proc/PID/exe` when registered: a change means the process exec'd another program.
    pub(super) exe_link: PathBuf,
    /// Scratch stack (root first), reused between samples.
    stack: Vec<FrameId>,
    /// asyncio task stacks (`--async`), see `crate::asyncio`.
    asyncio: AsyncState,
    /// Whether the kernel was asked to record the running task (once the reader exists).
    async_registered: bool,
    /// Task chains the kernel sent, by (time read, thread), each waiting for the record it
    /// came with: a CPU sample's comes right after it; an off-CPU interval's at the thread's
    /// switch-in, in a CPU's batch, after chains of later switch-outs. At most
    /// `PENDING_CHAINS`, the oldest dropped first.
    chains: std::collections::BTreeMap<(u64, u32), Result<Chain, ChainMiss>>,
    /// `--native` / `--kernel`: the native side of this process's samples.
    native: Option<NativeSampler>,
    /// With `native`: every interpreter frame of the sample, root first (scratch).
    walked: Vec<WalkedFrame>,
    /// With `native`: the merged stack (scratch).
    merged: Vec<FrameId>,
    /// With `--native`: records held at the process's start while its files are read.
    pub(super) held: super::native_hold::HeldSamples,
}

/// What one record is worth in the profile: its value (1 sample, the sampling period, or an
/// off-CPU interval in nanoseconds), the frame added below its Python frames, if any
/// (`<off-cpu: sleep>`...), and with `--kernel` the kernel stack where an off-CPU interval
/// blocked (return addresses leaf first), shown above that frame.
#[derive(Clone, Debug)]
pub(crate) struct Charge {
    pub(crate) value: u64,
    pub(crate) leaf: Option<&'static str>,
    pub(crate) kernel: Option<Arc<[u64]>>,
}

impl Charge {
    /// A record worth `value`, with `leaf` below its Python frames and no kernel stack.
    pub(crate) fn new(value: u64, leaf: Option<&'static str>) -> Self {
        Charge { value, leaf, kernel: None }
    }
}

/// Whether samples of this process get asyncio task stacks.
enum AsyncState {
    Off,
    /// Asked for; the reader is made on a thread of its own (it reads `/proc/PID/maps` and
    /// may open the `_asyncio` module's file, which the sampling loop never does), started at
    /// the first sample after `retry_at` (the module appears only once the process imports
    /// asyncio); `job` receives its result.
    Pending { retry_at: Instant, job: Option<mpsc::Receiver<Result<AsyncReader, AsyncioError>>> },
    Ready(Box<AsyncReader>),
    /// Not possible for this process (version, malformed offsets): plain stacks.
    Refused,
}

/// Task chains kept waiting for their records, per process: a few per thread (off-CPU
/// intervals' records come batched, up to a sampling period later); more are chains whose
/// records were lost or not sent (intervals shorter than `--min-off-cpu`).
const PENDING_CHAINS: usize = 1024;

/// How long a process without a loaded `_asyncio` module waits before it is looked at again.
const ASYNC_RETRY: Duration = Duration::from_secs(1);

/// A symbolized code object and the validation word it had when read.
struct CodeEntry {
    info: CodeInfo,
    check: u32,
}

/// Registers `process` with the kernel. `Ok(false)` when it cannot be sampled now but may be
/// later: the kernel's map is full (counted by the registry; retried on a later scan), or the
/// process exited before its registration took effect. In the latter case the entry is
/// removed again: the kernel frees the slots of exiting processes, but one that exited before
/// its entry existed would otherwise leave it behind, and a reused PID would be sampled with it.
pub(super) fn register(registry: &Registry, process: &PythonProcess, info: &ProcessInfo) -> Result<bool, LoadError> {
    match registry.register(process.pid, info) {
        Ok(()) => {}
        Err(LoadError::MapFull { .. }) => return Ok(false),
        Err(e) => return Err(e),
    }
    if !discovery::is_alive(process.pid, process.start_time) {
        registry.unregister(process.pid);
        return Ok(false);
    }
    Ok(true)
}

/// Why a frame could not be turned into a name.
enum FrameError {
    /// Not readable, or not a code object.
    BadCode,
    /// The code object at that address is not the one the kernel saw.
    Changed,
    /// The profile is at its byte budget and this frame is new to it.
    ProfileFull,
}

impl Target {
    pub(super) fn new(process: PythonProcess, exe_link: PathBuf, generation: u32, registered: ProcessInfo, native: Option<Arc<NativeContext>>) -> Self {
        let mem = ProcessMemory::new(process.pid);
        let semantics = process.layout.frame_semantics;
        let grouping = match (semantics.shim_owner, semantics.owner_generator) {
            (Some(shim_owner), _) => EvalGrouping::Shims { shim_owner },
            // 3.11: owners but no shims; `is_entry` marks the first frame of each call.
            (None, Some(_)) if process.layout.frame.is_entry != profiler_common::NO_FIELD => EvalGrouping::Entries,
            (None, Some(_)) => EvalGrouping::Unknown,
            (None, None) => EvalGrouping::PerFrame,
        };
        let native = native.map(|context| NativeSampler::new(process.pid, context, grouping));
        Self {
            kernel_frame: process.layout.kernel_frame_layout(),
            generation,
            registered,
            process,
            mem,
            exe_link,
            codes: SizedMap::default(),
            positions: SizedMap::default(),
            full_frames: FullFramesMemo::default(),
            tails: TailCache::default(),
            epoch: None,
            ledger: LedgerShare::new(&CACHE_BYTES),
            counters: Counters::default(),
            alive: true,
            stack: Vec::with_capacity(64),
            asyncio: AsyncState::Off,
            async_registered: false,
            chains: Default::default(),
            native,
            walked: Vec::new(),
            merged: Vec::new(),
            held: Default::default(),
        }
    }

    /// Once per target, when the asyncio reader exists (made now if due): the offset of the
    /// running task in thread states, for the kernel to record at sample time
    /// (`ProcessInfo::running_task`), and what it needs to read the task chains (`None` when
    /// this process's tasks are beyond what it reads).
    pub(super) fn async_registration_due(&mut self) -> Option<(u32, Option<profiler_common::TaskLayout>, AsyncReader)> {
        if self.async_registered {
            return None;
        }
        self.async_reader();
        match &self.asyncio {
            AsyncState::Ready(reader) if !self.async_registered => {
                self.async_registered = true;
                Some((reader.offsets().thread_running_task, reader.kernel_layout(), (**reader).clone()))
            }
            _ => None,
        }
    }

    /// Keeps a task chain record for the sample that follows it; a malformed or unfinished
    /// one is kept as the reason that sample stays plain.
    pub(super) fn add_task_chain(&mut self, header: &SampleHeader, bytes: &[u8]) {
        self.counters.ring_bytes += bytes.len() as u64;
        while self.chains.len() >= PENDING_CHAINS {
            self.chains.pop_first();
        }
        self.chains.insert((header.time_ns, header.tid), Chain::parse(bytes));
    }

    /// Asks for asyncio task stacks (`--async`); versions before 3.14 keep plain stacks.
    pub(super) fn enable_async(&mut self) {
        self.asyncio = if crate::asyncio::supported(self.process.version) {
            AsyncState::Pending { retry_at: Instant::now(), job: None }
        } else {
            AsyncState::Refused
        };
    }

    /// Makes the asyncio reader now, waiting at most `budget` (for processes given with
    /// `--pid`, inspected before sampling starts, so that their first samples already carry
    /// the running task; never on the sampling loop).
    pub(super) fn resolve_async_now(&mut self, budget: Duration) {
        if !matches!(self.asyncio, AsyncState::Pending { job: None, .. }) {
            return;
        }
        let process = self.process.clone();
        let made = super::Budgeted::default().run(budget, move || AsyncReader::new(&process));
        self.asyncio = match made {
            Ok(Ok(reader)) => AsyncState::Ready(Box::new(reader)),
            Ok(Err(AsyncioError::NotLoaded { .. } | AsyncioError::Discovery { .. })) | Err(_) => {
                AsyncState::Pending { retry_at: Instant::now() + ASYNC_RETRY, job: None }
            }
            Ok(Err(_)) => AsyncState::Refused,
        };
    }

    /// The asyncio reader, if made; starts (or collects) the job that makes it when due.
    fn async_reader(&mut self) -> Option<AsyncReader> {
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

    /// The asyncio reader, once made (for the task-wait helper, `task_waits`).
    pub(super) fn ready_async_reader(&self) -> Option<AsyncReader> {
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
                (Some(name), qualname) => crate::asyncio::waits::shown_task_name(&name, qualname.as_deref()),
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

    pub(super) fn process_sample(&mut self, header: &SampleHeader, body: &[u8], profile: &mut Profile, threads: bool, charge: Charge) -> SampleOutcome {
        if self.epoch != Some(profile.epoch()) {
            // A new interval's profile: the cached frame ids belong to the previous one.
            self.positions.clear();
            self.full_frames.clear();
            self.tails.clear();
            if let Some(n) = self.native.as_mut() {
                n.clear();
            }
            self.epoch = Some(profile.epoch());
        }
        let outcome = self.process_sample_inner(header, body, profile, threads, charge);
        self.account();
        outcome
    }

    /// With native frames: whether the process's maps or files are still being read.
    pub(super) fn native_waiting(&mut self) -> bool {
        self.native.as_mut().is_some_and(|n| n.waiting())
    }

    /// Bytes held by this process's caches.
    pub(super) fn cache_bytes(&self) -> usize {
        self.codes.bytes()
            + self.positions.bytes()
            + self.full_frames.bytes()
            + self.tails.bytes()
            + self.native.as_ref().map_or(0, |n| n.bytes())
    }

    /// Empties this process's caches (over a byte budget); they refill from the target.
    pub(super) fn clear_caches(&mut self) {
        self.codes.clear();
        self.positions.clear();
        self.full_frames.clear();
        self.tails.clear();
        if let Some(n) = self.native.as_mut() {
            n.clear();
        }
        self.counters.cache_evictions += 1;
        self.account();
    }

    /// Reports the caches' bytes to the process-wide ledger.
    fn account(&mut self) {
        self.ledger.report(self.cache_bytes());
    }

    /// Makes room for `bytes` more: empties the caches if they would exceed `PROCESS_BUDGET`.
    fn reserve(&mut self, bytes: usize) {
        if self.cache_bytes().saturating_add(bytes) > PROCESS_BUDGET {
            self.clear_caches();
        }
    }

    fn process_sample_inner(&mut self, header: &SampleHeader, body: &[u8], profile: &mut Profile, threads: bool, charge: Charge) -> SampleOutcome {
        if header.interpreter == INTERPRETER_UNKNOWN {
            return SampleOutcome::SubinterpreterUnknown;
        }
        match header.status {
            sample_status::COMPLETE => {}
            sample_status::NO_THREAD_STATE => return SampleOutcome::NoThreadState,
            sample_status::NO_FRAME => return SampleOutcome::Idle,
            sample_status::TRUNCATED if full_frames_repeat(header, body) => return SampleOutcome::CyclicChain,
            sample_status::TRUNCATED => return SampleOutcome::Truncated,
            _ => return SampleOutcome::KernelReadFault,
        }
        // Read through the sampled thread: it was running a moment ago, whereas the process's
        // first thread may have exited (its pid then no longer has an address space).
        self.mem = ProcessMemory::new(header.tid);
        let frames = FullFrames::new(header, body);
        let n_full = frames.len();
        let full = |i: usize| -> FrameEntry { frames.get(i).unwrap_or_default() };
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let native_part = (header.kind == record_kind::CPU_SAMPLE_NATIVE && self.native.is_some())
            .then(|| body.get(header.n_full as usize * FRAME_ENTRY_SIZE..))
            .flatten();
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        let mut result = Ok(());
        if header.n_hashed > 0 {
            let layout = self.kernel_frame;
            let evictions = self.tails.evictions;
            let tail = match self.tails.complete(&self.mem, &layout, header.tail_first, header.n_hashed, header.tail_hash) {
                Ok(tail) => tail,
                Err(_) => {
                    self.stack = stack;
                    return SampleOutcome::StaleTail;
                }
            };
            self.counters.cache_evictions += self.tails.evictions - evictions;
            // The tail cache has its own bound; this keeps the process's sum within its budget.
            self.reserve(0);
            match tail.source {
                TailSource::Hit => self.counters.frame_cache_hits += 1,
                TailSource::Partial => self.counters.frame_cache_partial_hits += 1,
                TailSource::Miss => self.counters.frame_cache_misses += 1,
            }
            self.counters.frames_from_memory += tail.frames_from_memory as u64;
            self.counters.frames_from_cache += (tail.tail.frames.len() - tail.frames_from_memory) as u64;
            match tail.tail.symbols.get() {
                Some(ids) if native_part.is_none() => stack.extend_from_slice(ids),
                _ => {
                    // Each tail frame carries the check it was validated with (part of the hash).
                    for entry in tail.tail.frames.iter().rev() {
                        let shown = self.frame_id(entry, entry.check, profile);
                        if native_part.is_some() {
                            walked.push(WalkedFrame { address: entry.frame, id: shown.as_ref().ok().copied().flatten(), owner: entry.owner, is_entry: entry.flags & profiler_common::frame_flags::ENTRY != 0 });
                        }
                        match shown {
                            Ok(Some(id)) => stack.push(id),
                            Ok(None) => {}
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    if result.is_ok() && tail.tail.symbols.get().is_none() {
                        let _ = tail.tail.symbols.set(stack.as_slice().into());
                    }
                }
            }
        }
        self.counters.frames_from_kernel += n_full as u64;
        // Bit i: full frame i (leaf first) produced a frame of `stack`.
        let mut shown = 0u64;
        // Without native frames (which need each frame's own entry), a record whose full
        // frames repeat an earlier one's takes its ids whole.
        let memo = result.is_ok() && native_part.is_none();
        let remembered = memo
            .then(|| {
                self.full_frames.set_key((0..n_full).map(full));
                self.full_frames.get()
            })
            .flatten();
        if let Some((ids, bits)) = remembered {
            stack.extend_from_slice(ids);
            shown = bits;
            self.counters.full_frames_memo_hits += 1;
        } else if result.is_ok() {
            let from = stack.len();
            for i in (0..n_full).rev() {
                let entry = full(i);
                let id = self.frame_id(&entry, entry.check, profile);
                if native_part.is_some() {
                    walked.push(WalkedFrame { address: entry.frame, id: id.as_ref().ok().copied().flatten(), owner: entry.owner, is_entry: entry.flags & profiler_common::frame_flags::ENTRY != 0 });
                }
                match id {
                    Ok(Some(id)) => {
                        stack.push(id);
                        shown |= 1 << i;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        result = Err(e);
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
        let python_frames = stack.len();
        // The Python frames are final here; native and kernel frames go around them.
        let mut merged = std::mem::take(&mut self.merged);
        let collecting = header.flags & profiler_common::sample_flags::GC != 0;
        if let (Ok(()), Some(part), Some(native)) = (&result, native_part, self.native.as_mut()) {
            if !stack.is_empty() {
                match native.finish(&stack, &walked, part, collecting, profile, &mut self.counters, &mut merged) {
                    Ok(()) => std::mem::swap(&mut stack, &mut merged),
                    Err(_) => result = Err(FrameError::ProfileFull),
                }
            }
        }
        self.merged = merged;
        self.walked = walked;
        if result.is_ok() && native_part.is_none() && !stack.is_empty() && matches!(self.asyncio, AsyncState::Pending { .. } | AsyncState::Ready(_)) {
            let frames: Vec<FrameEntry> = (0..n_full).map(full).collect();
            // An off-CPU interval's chain was read as the thread switched out.
            let chain_time = match header.kind {
                record_kind::OFF_CPU => off_cpu_trailer(header, body).map_or(0, |i| i.switched_out_ns),
                _ => header.time_ns,
            };
            result = self.apply_async(header, chain_time, &frames, shown, &mut stack, profile);
        }
        if result.is_ok() && threads && header.interpreter != 0 && !stack.is_empty() {
            // `interpreter <id>` right after the thread, for processes with subinterpreters.
            match synthetic_frame(profile, format!("interpreter {}", header.interpreter - 1)) {
                Ok(id) => stack.insert(0, id),
                Err(e) => result = Err(e),
            }
        }
        if let (Ok(()), Some(leaf)) = (&result, charge.leaf) {
            match profile.try_intern_static(leaf) {
                Some(id) => stack.push(id),
                None => result = Err(FrameError::ProfileFull),
            }
        }
        if let (Ok(()), Some(kernel), Some(native)) = (&result, charge.kernel.as_deref(), self.native.as_mut()) {
            if native.push_blocked_kernel_frames(kernel, profile, &mut stack).is_err() {
                result = Err(FrameError::ProfileFull);
            }
        }
        let outcome = match result {
            Err(FrameError::BadCode) => SampleOutcome::BadCodeObject,
            Err(FrameError::Changed) => SampleOutcome::ChangedCodeObject,
            Err(FrameError::ProfileFull) => SampleOutcome::ProfileFull,
            Ok(()) if python_frames == 0 => SampleOutcome::Idle,
            Ok(()) if !profile.add_weighted(header.tgid, threads.then_some(header.tid), &stack, charge.value, 1) => {
                SampleOutcome::ProfileFull
            }
            Ok(()) => {
                profile.add_time(header.tgid, header.tid, header.time_ns, &stack);
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
            let line = profile.line_numbers().pick(|| info.line(entry.instr_offset).unwrap_or(0), info.firstlineno);
            let name = FrameName { function: info.qualname.clone(), file: info.filename.clone(), line, native: None };
            Some(profile.try_intern(name).ok_or(FrameError::ProfileFull)?)
        };
        self.reserve(cache_budget::position_bytes());
        self.positions.insert(key, id, cache_budget::position_bytes());
        Ok(id)
    }

    /// Keeps a code object the kernel copied at sample time (`CodeSnapshot`), which comes
    /// before the records whose frames need it: they find it in the cache under the word the
    /// kernel computed from the same bytes, even if the code object is gone by then. A
    /// snapshot that does not decode (counted) leaves those frames to a read of live memory.
    pub(super) fn add_snapshot(&mut self, record: &[u8]) {
        let types = TypeAddresses {
            code: self.process.code_type_address,
            str: self.process.str_type_address,
            bytes: self.process.bytes_type_address,
        };
        match symbolize::decode_snapshot(record, &self.process.layout, &types, &self.mem) {
            Ok(snap) => {
                self.counters.code_snapshots += 1;
                let code = Arc::new(CodeEntry { info: snap.info, check: snap.check });
                let bytes = cache_budget::code_bytes(&code.info);
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
    /// word, pymalloc's over the reference count (where a live object holds a count, never
    /// an address).
    fn still_a_code_object(&self, address: u64) -> bool {
        let objects = &self.process.layout.objects;
        let Ok(ob_type) = self.mem.read_u64(address.wrapping_add(u64::from(objects.ob_type))) else { return false };
        if ob_type != self.process.code_type_address {
            return false;
        }
        // With the default object head (the count at 0, the type at 8); free-threaded builds
        // keep other words there.
        if objects.ob_type == 8 {
            let Ok(count) = self.mem.read_u64(address) else { return false };
            return count != 0 && count < 1 << 40;
        }
        true
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
        let bytes = cache_budget::code_bytes(&code.info);
        self.reserve(bytes);
        self.codes.insert(address, code.clone(), bytes);
        if expected != after {
            // It changed again after the sample: what we read is not what was sampled.
            return Err(FrameError::Changed);
        }
        Ok(code)
    }
}

/// A frame that is not a Python function (`task <name>`, `interpreter <id>`): no file, no line.
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

fn synthetic_frame(profile: &mut Profile, name: String) -> Result<FrameId, FrameError> {
    profile.try_intern(FrameName { function: name.into(), file: "".into(), line: 0, native: None }).ok_or(FrameError::ProfileFull)
}

/// Whether the full frames of a record visit one frame address twice: the chain loops (a
/// forged or corrupt interpreter state), rather than being deeper than the kernel walks.
fn full_frames_repeat(header: &SampleHeader, body: &[u8]) -> bool {
    let frames = FullFrames::new(header, body);
    let n = frames.len();
    let mut addresses = [0u64; MAX_FULL_FRAMES];
    for (slot, entry) in addresses.iter_mut().zip(frames.iter()) {
        *slot = entry.frame;
    }
    let addresses = &mut addresses[..n];
    addresses.sort_unstable();
    addresses.windows(2).any(|w| w[0] == w[1])
}
