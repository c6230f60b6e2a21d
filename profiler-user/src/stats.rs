//! Counts of every outcome, for the summary and `--stats`.
//!
//! A sample is counted exactly once in `SampleOutcome`: it either becomes a stack in the
//! profile (`Ok`) or is dropped for one named reason.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What became of one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SampleOutcome {
    /// Complete, validated and symbolized.
    Ok,
    /// The kernel found no thread state for the thread (not a Python thread, or not yet).
    NoThreadState,
    /// The thread state had no current frame (a thread not running Python code).
    Idle,
    /// The stack was deeper than the kernel walks.
    Truncated,
    /// The frame chain loops back on itself within the frames the kernel sends in full: only
    /// a forged or corrupt interpreter state does that (longer loops count as `Truncated`).
    CyclicChain,
    /// The kernel could not read a frame.
    KernelReadFault,
    /// The frames below the kernel's full ones changed before userspace could read them,
    /// or could not be read: the completion did not hash like the kernel's walk.
    StaleTail,
    /// A frame's code object could not be read or was not a code object.
    BadCodeObject,
    /// A frame's code object was freed and replaced between the sample and its reading.
    ChangedCodeObject,
    /// The process was not (or no longer) known to userspace.
    UnknownProcess,
    /// The stack needed a frame or stack new to the profile, which is at its byte budget.
    ProfileFull,
    /// The process had several interpreters and its version (before 3.13) lends thread
    /// states across threads: which stack the thread runs cannot be told.
    SubinterpreterUnknown,
}

impl SampleOutcome {
    pub const ALL: [SampleOutcome; 12] = [
        SampleOutcome::Ok,
        SampleOutcome::NoThreadState,
        SampleOutcome::Idle,
        SampleOutcome::Truncated,
        SampleOutcome::CyclicChain,
        SampleOutcome::KernelReadFault,
        SampleOutcome::StaleTail,
        SampleOutcome::BadCodeObject,
        SampleOutcome::ChangedCodeObject,
        SampleOutcome::UnknownProcess,
        SampleOutcome::ProfileFull,
        SampleOutcome::SubinterpreterUnknown,
    ];

    pub fn label(&self) -> &'static str {
        match self {
            SampleOutcome::Ok => "ok",
            SampleOutcome::NoThreadState => "no thread state",
            SampleOutcome::Idle => "idle (no Python frame)",
            SampleOutcome::Truncated => "truncated (too deep)",
            SampleOutcome::CyclicChain => "cyclic frame chain",
            SampleOutcome::KernelReadFault => "read fault (kernel)",
            SampleOutcome::StaleTail => "stale tail (completion did not validate)",
            SampleOutcome::BadCodeObject => "bad code object",
            SampleOutcome::ChangedCodeObject => "code object changed since the sample",
            SampleOutcome::UnknownProcess => "unknown process",
            SampleOutcome::ProfileFull => "dropped: profile at its memory budget",
            SampleOutcome::SubinterpreterUnknown => "dropped: subinterpreters before 3.13",
        }
    }
}

/// Counters of one process (or of the whole run).
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub outcomes: BTreeMap<SampleOutcome, u64>,
    /// Tail completions served entirely from the frame cache.
    pub frame_cache_hits: u64,
    /// Tail completions that read some frames and found the rest cached.
    pub frame_cache_partial_hits: u64,
    /// Tail completions read from target memory (and validated).
    pub frame_cache_misses: u64,
    /// Tails not in the cache whose record had waited in the worker's queue longer than
    /// `session::event_loop::TAIL_READ_MAX_WAIT`: not read, counted as stale tails.
    pub tails_too_late: u64,
    /// Target memory reads and bytes made for this process.
    pub memory_reads: u64,
    pub memory_bytes: u64,
    /// Ring-buffer bytes received for this process.
    pub ring_bytes: u64,
    /// Frames taken from the kernel record / the frame cache / target memory.
    pub frames_from_kernel: u64,
    pub frames_from_cache: u64,
    pub frames_from_memory: u64,
    /// Code-object lookups answered by the cache / needing a read.
    pub code_cache_hits: u64,
    pub code_cache_misses: u64,
    /// Records whose full frames repeated an earlier record's: their shown frames were taken
    /// whole, without a lookup per frame (`sample::full_frames_memo`).
    pub full_frames_memo_hits: u64,
    /// Code objects whose cached symbol was found stale and re-read.
    pub stale_invalidations: u64,
    /// Code objects taken from the kernel's copies made at sample time (`CodeSnapshot`) /
    /// copies that did not decode (their frames were read from live memory instead).
    pub code_snapshots: u64,
    pub code_snapshots_bad: u64,
    /// Free-threaded builds: frames of a thread's own bytecode copy whose offset was made
    /// relative to it / shown without a line (the copy changed since the sample, or did not
    /// read).
    pub tlbc_rebased: u64,
    pub tlbc_unresolved: u64,
    /// Times a symbol or frame cache was emptied to stay within its byte budget.
    pub cache_evictions: u64,
    /// Off-CPU intervals received (`--mode wall/off-cpu`; each is also one outcome above).
    pub off_cpu_intervals: u64,
    /// Nanoseconds of off-CPU time charged to a stack / to `<off-cpu: short>` / dropped with
    /// their record (its outcome says why).
    pub off_cpu_ns: u64,
    pub off_cpu_short_ns: u64,
    pub off_cpu_dropped_ns: u64,
    /// `--async`: samples shown as the running task's logical stack.
    pub async_task_stacks: u64,
    /// Of those, stacks of an eagerly started task shown under the task that created it.
    pub async_eager_creators: u64,
    /// `--async`: samples of a thread running a task that kept their plain stack, and why.
    pub async_misses: BTreeMap<crate::target::asyncio::ChainMiss, u64>,
    /// `--native`: samples whose native frames were merged with the Python frames; whose
    /// native unwind ended before the bottom (merged from the leaf, the rest after a
    /// `<truncated native>` marker); shown unmerged (counts disagreed); without user registers
    /// or stack copy; with a malformed native part.
    pub native_merged: u64,
    pub native_truncated: u64,
    pub native_unmerged: u64,
    pub native_no_stack: u64,
    pub native_malformed: u64,
    /// Samples kept whose thread was running the garbage collector (kernel's `sample_flags::GC`);
    /// without `--native` they end in a `<GC>` frame.
    pub gc_samples: u64,
    /// `--native`: samples shown with their Python frames behind `<loading native>`: the
    /// process's maps or a file they ran in were still being read (off the sampling loop).
    pub native_loading: u64,
    /// `--native`: samples held at the process's start until its files were read (or for
    /// at most 2 s; each is also counted by how it was finally shown).
    pub native_held: u64,
    /// `--native` walked in the kernel: samples by how the walk ended
    /// (`profiler_common::walk_end`, indexed by its value).
    pub native_walk_ends: [u64; profiler_common::walk_end::LAST as usize + 1],
    /// `--async` with wall or off-CPU time: suspended tasks' waits (`session::task_waits`).
    pub task_waits: TaskWaitCounts,
}

/// What reading suspended asyncio tasks' waits did (`session::task_waits`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskWaitCounts {
    /// Rounds (reads of the task graph) and the stacks they charged.
    pub rounds: u64,
    pub charges: u64,
    /// Nanoseconds charged to suspended tasks' await stacks.
    pub wait_ns: u64,
    /// Suspended tasks not charged in a round: their chain did not read the same twice (or
    /// their awaiter had moved on) / could not be read / the round's read budget ran out
    /// before them / the profile was full.
    pub unsettled: u64,
    pub unreadable: u64,
    pub over_budget: u64,
    pub profile_full: u64,
    /// Target reads and bytes of all rounds, and the largest round's.
    pub reads: u64,
    pub bytes: u64,
    pub max_round_reads: u64,
    pub max_round_bytes: u64,
    /// The most tasks one round listed.
    pub max_tasks: u64,
    /// Time spent in rounds (the helper's thread), and the longest round's.
    pub round_ns: u64,
    pub max_round_ns: u64,
}

impl TaskWaitCounts {
    pub fn add(&mut self, o: &TaskWaitCounts) {
        self.rounds += o.rounds;
        self.charges += o.charges;
        self.wait_ns += o.wait_ns;
        self.unsettled += o.unsettled;
        self.unreadable += o.unreadable;
        self.over_budget += o.over_budget;
        self.profile_full += o.profile_full;
        self.reads += o.reads;
        self.bytes += o.bytes;
        self.max_round_reads = self.max_round_reads.max(o.max_round_reads);
        self.max_round_bytes = self.max_round_bytes.max(o.max_round_bytes);
        self.max_tasks = self.max_tasks.max(o.max_tasks);
        self.round_ns += o.round_ns;
        self.max_round_ns = self.max_round_ns.max(o.max_round_ns);
    }
}

impl Counters {
    pub fn count(&mut self, outcome: SampleOutcome) {
        *self.outcomes.entry(outcome).or_default() += 1;
    }

    pub fn samples(&self) -> u64 {
        self.outcomes.values().sum()
    }

    pub fn ok(&self) -> u64 {
        self.outcomes.get(&SampleOutcome::Ok).copied().unwrap_or(0)
    }

    pub fn add(&mut self, other: &Counters) {
        for (k, v) in &other.outcomes {
            *self.outcomes.entry(*k).or_default() += v;
        }
        self.frame_cache_hits += other.frame_cache_hits;
        self.frame_cache_partial_hits += other.frame_cache_partial_hits;
        self.frame_cache_misses += other.frame_cache_misses;
        self.tails_too_late += other.tails_too_late;
        self.memory_reads += other.memory_reads;
        self.memory_bytes += other.memory_bytes;
        self.ring_bytes += other.ring_bytes;
        self.frames_from_kernel += other.frames_from_kernel;
        self.frames_from_cache += other.frames_from_cache;
        self.frames_from_memory += other.frames_from_memory;
        self.code_cache_hits += other.code_cache_hits;
        self.full_frames_memo_hits += other.full_frames_memo_hits;
        self.code_cache_misses += other.code_cache_misses;
        self.stale_invalidations += other.stale_invalidations;
        self.code_snapshots += other.code_snapshots;
        self.code_snapshots_bad += other.code_snapshots_bad;
        self.tlbc_rebased += other.tlbc_rebased;
        self.tlbc_unresolved += other.tlbc_unresolved;
        self.cache_evictions += other.cache_evictions;
        self.off_cpu_intervals += other.off_cpu_intervals;
        self.off_cpu_ns += other.off_cpu_ns;
        self.off_cpu_short_ns += other.off_cpu_short_ns;
        self.off_cpu_dropped_ns += other.off_cpu_dropped_ns;
        self.async_task_stacks += other.async_task_stacks;
        self.async_eager_creators += other.async_eager_creators;
        for (k, v) in &other.async_misses {
            *self.async_misses.entry(*k).or_default() += v;
        }
        self.native_merged += other.native_merged;
        self.native_truncated += other.native_truncated;
        self.native_unmerged += other.native_unmerged;
        self.native_no_stack += other.native_no_stack;
        self.native_malformed += other.native_malformed;
        self.gc_samples += other.gc_samples;
        self.native_loading += other.native_loading;
        self.native_held += other.native_held;
        for (a, b) in self.native_walk_ends.iter_mut().zip(other.native_walk_ends) {
            *a += b;
        }
        self.task_waits.add(&other.task_waits);
    }

    /// A multi-line report, indented by `indent`.
    pub fn report(&self, indent: &str) -> String {
        let mut s = String::new();
        let total = self.samples();
        let _ = writeln!(s, "{indent}samples: {total}");
        for outcome in SampleOutcome::ALL {
            let n = self.outcomes.get(&outcome).copied().unwrap_or(0);
            if n > 0 || outcome == SampleOutcome::Ok {
                let pct = if total > 0 { 100.0 * n as f64 / total as f64 } else { 0.0 };
                let _ = writeln!(s, "{indent}  {:<42} {n:>10} ({pct:5.1}%)", outcome.label());
            }
        }
        let _ = writeln!(
            s,
            "{indent}frame cache: {} full hits, {} partial hits, {} misses, {} not read (their records waited too long); frames from kernel {}, from cache {}, from memory {}",
            self.frame_cache_hits,
            self.frame_cache_partial_hits,
            self.frame_cache_misses,
            self.tails_too_late,
            self.frames_from_kernel,
            self.frames_from_cache,
            self.frames_from_memory
        );
        let _ = writeln!(
            s,
            "{indent}code-object cache: {} hits, {} misses, {} stale invalidations, {} copied by the kernel at sample time ({} not decoded); records whose full frames repeated an earlier record's: {}; cache evictions (byte budget): {}",
            self.code_cache_hits,
            self.code_cache_misses,
            self.stale_invalidations,
            self.code_snapshots,
            self.code_snapshots_bad,
            self.full_frames_memo_hits,
            self.cache_evictions
        );
        if self.tlbc_rebased + self.tlbc_unresolved > 0 {
            let _ = writeln!(
                s,
                "{indent}threads' bytecode copies (free-threaded): {} frame positions rebased, {} shown without a line (the copy changed since the sample, or did not read)",
                self.tlbc_rebased, self.tlbc_unresolved
            );
        }
        let per_sample = |v: u64| if total > 0 { v as f64 / total as f64 } else { 0.0 };
        let _ = writeln!(
            s,
            "{indent}target memory: {} reads, {} bytes ({:.2} reads per sample); ring buffer: {} bytes ({:.0} per sample)",
            self.memory_reads,
            self.memory_bytes,
            per_sample(self.memory_reads),
            self.ring_bytes,
            per_sample(self.ring_bytes)
        );
        if self.off_cpu_intervals > 0 || self.off_cpu_short_ns > 0 {
            let ms = |ns: u64| ns as f64 / 1e6;
            let _ = writeln!(
                s,
                "{indent}off-CPU: {} intervals, {:.1} ms on stacks, {:.1} ms short (<off-cpu: short>), {:.1} ms dropped",
                self.off_cpu_intervals,
                ms(self.off_cpu_ns),
                ms(self.off_cpu_short_ns),
                ms(self.off_cpu_dropped_ns)
            );
        }
        if self.async_task_stacks > 0 || !self.async_misses.is_empty() {
            let _ = write!(
                s,
                "{indent}asyncio: {} task stacks ({} of eager tasks under their creator); kept plain:",
                self.async_task_stacks, self.async_eager_creators
            );
            for miss in crate::target::asyncio::ChainMiss::ALL {
                let n = self.async_misses.get(&miss).copied().unwrap_or(0);
                let _ = write!(s, " {} {n};", miss.label());
            }
            s.push('\n');
        }
        if self.native_merged + self.native_unmerged + self.native_no_stack + self.native_malformed + self.native_loading > 0 {
            let _ = writeln!(
                s,
                "{indent}native: {} merged ({} with a truncated native stack), {} unmerged, {} without a user stack, {} malformed, {} loading (maps or file still being read); {} held at the start until the files were read",
                self.native_merged,
                self.native_truncated,
                self.native_unmerged,
                self.native_no_stack,
                self.native_malformed,
                self.native_loading,
                self.native_held
            );
        }
        if self.native_walk_ends.iter().any(|&n| n > 0) {
            let _ = write!(s, "{indent}native walk in the kernel ended:");
            for (i, n) in self.native_walk_ends.iter().enumerate().skip(1) {
                let _ = write!(s, " {} {n};", walk_end_label(i as u32));
            }
            s.push('\n');
        }
        let w = &self.task_waits;
        if w.rounds > 0 {
            let per_round = |n: u64| n as f64 / w.rounds as f64;
            let _ = writeln!(
                s,
                "{indent}asyncio task waits: {} rounds, {} task waits charged ({:.3} s); not charged: {} unsettled (chain changed while read), {} unreadable, {} over the round's read budget, {} profile full; reads per round {:.0} (max {}), bytes per round {:.0} (max {}), {:.0} us per round (max {:.0}); up to {} tasks",
                w.rounds,
                w.charges,
                w.wait_ns as f64 / 1e9,
                w.unsettled,
                w.unreadable,
                w.over_budget,
                w.profile_full,
                per_round(w.reads),
                w.max_round_reads,
                per_round(w.bytes),
                w.max_round_bytes,
                per_round(w.round_ns) / 1e3,
                w.max_round_ns as f64 / 1e3,
                w.max_tasks
            );
        }
        if self.gc_samples > 0 {
            let _ = writeln!(s, "{indent}garbage collector: {} samples collecting (<GC> without --native)", self.gc_samples);
        }
        s
    }
}

/// `--stats`' words for each `profiler_common::walk_end` value (by value).
const WALK_END_LABELS: [&str; profiler_common::walk_end::LAST as usize + 1] = [
    "by copy",
    "at the outermost frame",
    "in code outside any mapped file",
    "at a table not loaded yet",
    "in code without unwind rows",
    "at an unsupported rule",
    "at an unreadable stack word",
    "at a frame not above its callee",
    "at the depth limit",
    "before the process's mappings were loaded",
    "not started, its tables loading (the stack copied and unwound by pyperch)",
];

pub fn walk_end_label(end: u32) -> &'static str {
    WALK_END_LABELS.get(end as usize).copied().unwrap_or("unknown")
}
