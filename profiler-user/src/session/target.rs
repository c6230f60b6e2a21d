//! The session's side of one profiled process (`sample::Target`): its registration with the
//! kernel, and the set-up of its asyncio reader (made off the sampling loop). What happens to
//! its samples is the sample path (`crate::sample`).

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use profiler_common::{ProcessInfo, SampleHeader};

use crate::{
    target::asyncio::{AsyncReader, AsyncioError, chain::Chain},
    target::discovery::{self, PythonProcess},
    kernel::loader::{LoadError, Registry},
    target::memory::ProcessMemory,
    target::native::NativeContext,
    sample::{
        Target,
        caches::{CACHE_BYTES, LedgerShare, SizedMap},
        complete::TailCache,
        full_frames_memo::FullFramesMemo,
        native::NativeSampler,
        native_merge::EvalGrouping,
        process::{ASYNC_RETRY, AsyncState, PENDING_CHAINS},
    },
    stats::Counters,
};

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

impl Target {
    pub(crate) fn new(process: PythonProcess, exe_link: PathBuf, generation: u32, registered: ProcessInfo, native: Option<Arc<NativeContext>>) -> Self {
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
            read_tails: true,
            tlbc: Default::default(),
            tlbc_generation: 0,
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
    pub(crate) fn async_registration_due(&mut self) -> Option<(u32, Option<profiler_common::TaskLayout>, AsyncReader)> {
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
    pub(crate) fn add_task_chain(&mut self, header: &SampleHeader, bytes: &[u8]) {
        self.counters.ring_bytes += bytes.len() as u64;
        while self.chains.len() >= PENDING_CHAINS {
            self.chains.pop_first();
        }
        self.chains.insert((header.time_ns, header.tid), Chain::parse(bytes));
    }

    /// Asks for asyncio task stacks (`--async`); versions before 3.14 keep plain stacks.
    pub(crate) fn enable_async(&mut self) {
        self.asyncio = if crate::target::asyncio::supported(self.process.version) {
            AsyncState::Pending { retry_at: Instant::now(), job: None }
        } else {
            AsyncState::Refused
        };
    }

    /// Makes the asyncio reader now, waiting at most `budget` (for processes given with
    /// `--pid`, inspected before sampling starts, so that their first samples already carry
    /// the running task; never on the sampling loop).
    pub(crate) fn resolve_async_now(&mut self, budget: Duration) {
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

    /// The asyncio reader, once made (for the task-wait helper, `task_waits`).
    pub(crate) fn ready_async_reader(&self) -> Option<AsyncReader> {
        match &self.asyncio {
            AsyncState::Ready(reader) => Some((**reader).clone()),
            _ => None,
        }
    }

    /// With native frames: whether the process's maps or files are still being read.
    pub(crate) fn native_waiting(&mut self) -> bool {
        self.native.as_mut().is_some_and(|n| n.waiting())
    }
}
