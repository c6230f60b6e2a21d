//! One profiled process as its samples see it ([`Target`]), and the order of the stages
//! each of its records goes through (`process_sample`).

use std::{
    path::PathBuf,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use profiler_common::{FrameLayout, ProcessInfo, SampleHeader};

use super::{
    Charge, FrameId,
    aggregate::Profile,
    caches::{LedgerShare, PROCESS_BUDGET, SizedMap},
    complete::TailCache,
    full_frames_memo::FullFramesMemo,
    native::NativeSampler,
    native_merge::WalkedFrame,
};
use crate::{
    target::asyncio::{AsyncReader, AsyncioError, ChainMiss, chain::Chain},
    target::discovery::PythonProcess,
    target::memory::ProcessMemory,
    stats::{Counters, SampleOutcome},
    target::symbolize::CodeInfo,
};

/// One Python process being profiled, with its caches: the state every stage of its samples
/// reads and keeps. Made and registered by the session (`session::target`).
pub(crate) struct Target {
    pub(crate) process: PythonProcess,
    /// The registration this target belongs to (`ProcessInfo::generation`): samples carrying
    /// another one were taken under an earlier registration of the same PID (another process,
    /// or this one before an exec) and are never attributed to this target.
    pub(crate) generation: u32,
    /// What the kernel was given at registration (registered again, unchanged but for the
    /// task fields, once `--async`'s reader exists).
    pub(crate) registered: ProcessInfo,
    /// The frame layout registered with the kernel, with the validation word's fields.
    pub(crate) kernel_frame: FrameLayout,
    pub(crate) mem: ProcessMemory,
    /// Code objects by address, with their validation word.
    pub(crate) codes: SizedMap<u64, Arc<CodeEntry>>,
    /// (code, validation word, instruction offset, owned by a generator) → the frame shown,
    /// or `None` for a frame CPython itself hides (not started yet). Ids of `epoch`. Keyed by
    /// the word the kernel (or the validated tail) saw, so a replaced code object never hits.
    pub(crate) positions: SizedMap<(u64, u32, i32, bool), Option<FrameId>>,
    /// Records' full frames → their shown frames, whole (ids of `epoch`, as `positions`).
    pub(crate) full_frames: FullFramesMemo,
    /// Validated deep-stack tails (`complete`); their symbolized forms hold ids of `epoch`.
    pub(crate) tails: TailCache,
    /// Free-threaded builds: where the threads' bytecode copies are (`symbolize::tlbc`).
    pub(crate) tlbc: crate::target::symbolize::TlbcBases,
    /// The bytecode-copy generation of the record being processed (0: frames of threads with
    /// their own copy are shown without a line): the kernel's, when the process had one
    /// interpreter at sample time (the main one, whose generation the rebase reads).
    pub(crate) tlbc_generation: u32,
    /// Whether a tail not in `tails` may be read from memory for the record being processed
    /// (set by the session per record: not when it waited too long in the queue).
    pub(crate) read_tails: bool,
    /// The profile epoch the cached frame ids belong to (`Profile::epoch`).
    pub(crate) epoch: Option<u64>,
    /// The caches' bytes as last reported to the process-wide ledger (`budget`).
    pub(crate) ledger: LedgerShare,
    pub(crate) counters: Counters,
    /// Still running and registered with the kernel.
    pub(crate) alive: bool,
    /// `/proc/PID/exe` when registered: a change means the process exec'd another program.
    pub(crate) exe_link: PathBuf,
    /// Scratch stack (root first), reused between samples.
    pub(crate) stack: Vec<FrameId>,
    /// asyncio task stacks (`--async`), see `crate::target::asyncio`.
    pub(crate) asyncio: AsyncState,
    /// Whether the kernel was asked to record the running task (once the reader exists).
    pub(crate) async_registered: bool,
    /// Task chains the kernel sent, by (time read, thread), each waiting for the record it
    /// came with: a CPU sample's comes right after it; an off-CPU interval's at the thread's
    /// switch-in, in a CPU's batch, after chains of later switch-outs. At most
    /// `PENDING_CHAINS`, the oldest dropped first.
    pub(crate) chains: std::collections::BTreeMap<(u64, u32), Result<Chain, ChainMiss>>,
    /// `--native` / `--kernel`: the native side of this process's samples.
    pub(crate) native: Option<NativeSampler>,
    /// With `native`: every interpreter frame of the sample, root first (scratch).
    pub(crate) walked: Vec<WalkedFrame>,
    /// With `native`: the merged stack (scratch).
    pub(crate) merged: Vec<FrameId>,
    /// With `--native`: records held at the process's start while its files are read.
    pub(crate) held: super::hold::HeldSamples,
}

/// Whether samples of this process get asyncio task stacks.
pub(crate) enum AsyncState {
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
pub(crate) const PENDING_CHAINS: usize = 1024;

/// How long a process without a loaded `_asyncio` module waits before it is looked at again.
pub(crate) const ASYNC_RETRY: Duration = Duration::from_secs(1);

/// A symbolized code object and the validation word it had when read.
pub(crate) struct CodeEntry {
    pub(crate) info: CodeInfo,
    pub(crate) check: u32,
}

impl Target {
    /// One record of this process (`body`: what follows its header) worth `charge`: its
    /// stack added to `profile` (by thread when `threads`), and its outcome for `--stats`.
    /// Runs under the session's per-sample read budget, on the sampling loop.
    pub(crate) fn process_sample(&mut self, header: &SampleHeader, body: &[u8], profile: &mut Profile, threads: bool, charge: Charge) -> SampleOutcome {
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
        self.tlbc_generation = if header.interpreter == 0 { header.tlbc_generation } else { 0 };
        let outcome = self.process_sample_inner(header, body, profile, threads, charge);
        self.account();
        outcome
    }

    /// The stages of one record (see the module `sample`), each ending the sample with its
    /// outcome when it cannot go on. `body` is what follows the header.
    fn process_sample_inner(&mut self, header: &SampleHeader, body: &[u8], profile: &mut Profile, threads: bool, charge: Charge) -> SampleOutcome {
        // 1. Decode: the walk's status and the full frames.
        let record = match super::decode::decode(header, body, self.native.is_some()) {
            Ok(record) => record,
            Err(outcome) => return outcome,
        };
        // Read through the sampled thread: it was running a moment ago, whereas the process's
        // first thread may have exited (its pid then no longer has an address space).
        self.mem = ProcessMemory::new(header.tid);
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        // 2. Complete: the hashed tail below the full frames (symbolized as it is added).
        let mut result = match self.complete(header, &record, profile, &mut stack, &mut walked) {
            Ok(result) => result,
            Err(outcome) => {
                self.stack = stack;
                return outcome;
            }
        };
        // 3. Symbolize: the full frames.
        let shown = self.symbolize_full_frames(&record, profile, &mut stack, &mut walked, &mut result);
        let python_frames = stack.len();
        // 4. Merge: native, task and kernel frames (and the interpreter, the leaf) around them.
        self.merge(header, &record, &charge, threads, shown, &mut stack, walked, profile, &mut result);
        // 5. Aggregate.
        let outcome = super::aggregate::add_sample(profile, header, threads, &stack, python_frames, charge.value, result);
        self.stack = stack;
        outcome
    }

    /// Bytes held by this process's caches.
    pub(crate) fn cache_bytes(&self) -> usize {
        self.codes.bytes()
            + self.positions.bytes()
            + self.full_frames.bytes()
            + self.tails.bytes()
            + self.native.as_ref().map_or(0, |n| n.bytes())
    }

    /// Empties this process's caches (over a byte budget); they refill from the target.
    pub(crate) fn clear_caches(&mut self) {
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
    pub(crate) fn account(&mut self) {
        self.ledger.report(self.cache_bytes());
    }

    /// Makes room for `bytes` more: empties the caches if they would exceed `PROCESS_BUDGET`.
    pub(crate) fn reserve(&mut self, bytes: usize) {
        if self.cache_bytes().saturating_add(bytes) > PROCESS_BUDGET {
            self.clear_caches();
        }
    }
}
