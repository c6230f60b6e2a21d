//! The profile being built during a recording.
//!
//! A [`Profile`] counts samples per distinct stack. Stacks are keyed by process, optionally
//! thread, and the sequence of interned Python frames, root first. [`Profile::add`] is on the
//! hot path (once per sample): for a stack that was seen before it hashes the borrowed slice,
//! finds the existing entry and bumps its counter without allocating. Only the first sighting
//! of a stack copies the frames into a boxed [`StackKey`].
//!
//! Frames are interned ([`Profile::intern`]) so that a stack is a small slice of `u32`s and a
//! frame's strings are stored once however many stacks contain it.
//!
//! Memory: a profile counts the bytes of its interned frames (their strings' lengths plus a
//! fixed overhead) and of its stacks, and refuses to grow past its byte budget
//! ([`Profile::try_intern`] and [`Profile::add`] say no to a NEW frame or stack; known ones
//! are still counted). The session drops such a sample and counts it, so a profile over its
//! budget stays true, only incomplete, visibly. `record` keeps one profile for the whole run
//! ([`RECORD_PROFILE_BUDGET`]); the agent starts a new one every interval
//! ([`Profile::take_interval`]), so what an interval used is freed once it is uploaded.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};

/// Bytes a `record` profile may hold (interned frames and stacks).
pub const RECORD_PROFILE_BUDGET: usize = 128 << 20;
/// Bytes one interval's profile may hold in the agent.
pub const AGENT_INTERVAL_BUDGET: usize = 32 << 20;
/// Accounted per interned frame beside its strings: the `frames` slot, the `frame_ids` entry
/// (key, id, control byte, spare capacity) and the two strings' allocation headers.
const FRAME_OVERHEAD: usize = 160;
/// Accounted per stack beside its frame ids: the table slot (key, count) and the boxed slice's
/// allocation header.
const STACK_OVERHEAD: usize = 80;

/// One frame as shown to users (a Python frame, or with `--native`/`--kernel` a native or
/// kernel frame, or a marker).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameName {
    /// The function's (qualified, when the interpreter provides it) name.
    pub function: Arc<str>,
    /// The source file of the code object.
    pub file: Arc<str>,
    /// The line being executed; `0` means unknown.
    pub line: u32,
    /// Native and kernel frames: where their code is (pprof writes it as a mapping and an
    /// address); `None` for Python frames and markers.
    pub native: Option<Arc<NativeOrigin>>,
}

pub use crate::target::native::{NativeMapping, NativeOrigin};
pub use super::FrameId;

/// How a process is labelled in the output.
#[derive(Clone, Debug, Default)]
pub struct ProcessLabel {
    /// The kernel's short command name (`/proc/<pid>/comm`).
    pub comm: String,
    /// Path of the executable.
    pub exe: String,
    /// The CPython version, e.g. `3.12.4`.
    pub version: String,
    /// Full container id, when the process runs in a container of a known runtime.
    pub container_id: Option<String>,
    /// Kubernetes pod UID, when the process runs in a pod.
    pub pod_uid: Option<String>,
    /// The working directory as the process sees it, for short file names.
    pub cwd: Option<String>,
    /// Kubernetes namespace, pod name and container name, from the runtime's annotations
    /// (see [`crate::host::pod_names`]); `None` outside a pod or when the runtime keeps none.
    pub pod_names: Option<std::sync::Arc<crate::host::pod_names::PodNames>>,
}

/// Which line a frame shows (`--function`, `--nolineno`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LineNumbers {
    /// The line being executed (default).
    #[default]
    Current,
    /// The function's first line: one frame per function (`--function`).
    FunctionStart,
    /// None: one frame per function, shown without a line (`--nolineno`).
    Hidden,
}

impl LineNumbers {
    /// The line to show, given the current line (computed only when needed) and the
    /// function's first line.
    pub fn pick(self, current: impl FnOnce() -> u32, first: u32) -> u32 {
        match self {
            LineNumbers::Current => current(),
            LineNumbers::FunctionStart => first,
            LineNumbers::Hidden => 0,
        }
    }
}

/// When and how fast a profile was sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    pub start: std::time::SystemTime,
    pub duration: std::time::Duration,
    pub rate_hz: u64,
    /// Samples taken but dropped (not exact, see `--stats`) in this recording or interval.
    pub dropped: u64,
    /// Samples the kernel could not hand over (ring buffer full) in it.
    pub lost: u64,
    /// `--max-cpu`: the budget and the effective rate in this recording or interval.
    pub budget: Option<BudgetFacts>,
}

/// The effective rate (the requested rate ÷ the sampled share's divisor, see
/// `session::cpu_budget`) over some time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateSummary {
    pub min_hz: f64,
    /// Weighted by the time each divisor was in force.
    pub mean_hz: f64,
    pub last_hz: f64,
}

/// The share of context switches walked (`--max-cpu` in `--mode wall`/`off-cpu`: the kernel
/// walks one switch-out of a profiled thread in the divisor, see `session::cpu_budget`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SwitchShare {
    /// The divisor in force last: one switch-out in this many walked.
    pub last_one_in: u32,
    /// The share walked (1 ÷ divisor), weighted by the time each divisor was in force.
    pub mean_share: f64,
}

impl SwitchShare {
    /// `1 in 8 last, mean share 20.50%`: what `--stats` and the profiles' title lines say.
    pub fn describe(&self) -> String {
        format!("1 in {} last, mean share {:.2}%", self.last_one_in, self.mean_share * 100.0)
    }
}

/// What a profile says about `--max-cpu` (`output::recording_facts`): the values are those
/// of the requested rate and of every context switch; the samples were kept at the effective
/// rate and the switches walked at the effective share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetFacts {
    /// `--max-cpu`, percent of one CPU.
    pub max_cpu_percent: f64,
    pub rate: RateSummary,
    /// In the off-CPU modes (`wall`, `off-cpu`); `None` in the others.
    pub switches: Option<SwitchShare>,
}

/// Identity of one counted stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    /// The process the sample was taken in.
    pub pid: u32,
    /// The thread, present only when recording per thread (`--threads`).
    pub tid: Option<u32>,
    /// Interned frames, ROOT FIRST (outermost call at index 0, the running function last).
    pub frames: Box<[FrameId]>,
}

/// Per-process bookkeeping: its label (once known) and how many samples it received.
#[derive(Debug, Default)]
struct ProcessEntry {
    label: Option<ProcessLabel>,
    samples: u64,
}

/// Samples counted per stack, plus the interned frames and process labels they refer to.
///
/// Invariants:
/// - `frames[id]` is the frame interned as `id`, and `frame_ids` maps it back to `id`;
/// - each [`StackKey`] appears at most once in `stacks`, and its count is non-zero;
/// - `total` is the (saturating) sum of all stack counts, and each process's `samples` is the
///   (saturating) sum of the counts of its stacks.
pub struct Profile {
    frames: Vec<FrameName>,
    frame_ids: hashbrown::HashMap<FrameName, FrameId>,
    processes: hashbrown::HashMap<u32, ProcessEntry>,
    /// Per stack: its value (samples, or nanoseconds in the time modes) and its events (the
    /// samples and off-CPU intervals that make up the value).
    stacks: HashTable<(StackKey, u64, u64)>,
    /// Which time the values are (see [`crate::time_mode`]): sample counts in `cpu` mode,
    /// nanoseconds in `wall` and `off-cpu` modes.
    time_mode: crate::time_mode::TimeMode,
    hasher: DefaultHashBuilder,
    total: u64,
    /// Outputs start every stack with the process's container (`--by-container`).
    container_root: bool,
    /// When the samples were taken and at which rate, for formats that carry it (pprof).
    timing: Option<Timing>,
    /// Returned by [`Profile::frame`] for an id this profile never handed out, so that a
    /// caller's mistake shows up as a visible `[unknown frame]` rather than a panic.
    unknown: FrameName,
    /// Which line frames show; read when frames are interned.
    line_numbers: LineNumbers,
    /// Per-thread sample times, kept only for formats that show time (chrometrace, gecko).
    timeline: Option<super::timeline::Timeline>,
    /// Accounted bytes of the interned frames and the stacks (see the module doc).
    bytes: usize,
    /// No new frame or stack is taken once `bytes` would exceed this.
    budget: usize,
    /// Which generation of interning this is: `FrameId`s are only valid within one epoch,
    /// and caches holding them are emptied when it changes ([`Profile::take_interval`]).
    epoch: u64,
    /// With `--threads`: the OS names of threads, by tid (at most [`MAX_THREAD_NAMES`]).
    thread_names: HashMap<u32, Arc<str>>,
    /// Ids of the synthetic frames named by static strings ([`Profile::try_intern_static`]),
    /// by the string's address and length: a handful (the `<off-cpu: ...>` leaves).
    static_ids: Vec<(&'static str, FrameId)>,
}

/// Synthetic frames whose ids a profile remembers (more are interned as usual).
const MAX_STATIC_IDS: usize = 16;

/// Thread names a profile keeps.
pub const MAX_THREAD_NAMES: usize = 65_536;

impl Default for Profile {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profile")
            .field("frames", &self.frames.len())
            .field("processes", &self.processes.len())
            .field("stacks", &self.stacks.len())
            .field("total", &self.total)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Profile {
    /// An empty profile.
    pub fn new() -> Self {
        Profile {
            frames: Vec::new(),
            frame_ids: hashbrown::HashMap::new(),
            processes: hashbrown::HashMap::new(),
            stacks: HashTable::new(),
            time_mode: crate::time_mode::TimeMode::Cpu,
            hasher: DefaultHashBuilder::default(),
            total: 0,
            container_root: false,
            timing: None,
            unknown: FrameName {
                function: Arc::from("[unknown frame]"),
                file: Arc::from(""),
                line: 0,
                native: None,
            },
            line_numbers: LineNumbers::Current,
            timeline: None,
            bytes: 0,
            budget: RECORD_PROFILE_BUDGET,
            epoch: 0,
            thread_names: HashMap::new(),
            static_ids: Vec::new(),
        }
    }

    /// An empty profile with the same settings (container root, timing, line numbers) and no
    /// timeline.
    pub fn empty_like(&self) -> Profile {
        let mut p = Profile::new();
        p.container_root = self.container_root;
        p.timing = self.timing.clone();
        p.line_numbers = self.line_numbers;
        p.time_mode = self.time_mode;
        p.thread_names = self.thread_names.clone();
        // A copy of a profile that was within its budget.
        p.budget = usize::MAX;
        p
    }

    pub fn set_line_numbers(&mut self, mode: LineNumbers) {
        self.line_numbers = mode;
    }

    pub fn line_numbers(&self) -> LineNumbers {
        self.line_numbers
    }

    /// Starts keeping per-thread sample times (see [`crate::sample::timeline`]).
    pub fn keep_timeline(&mut self, period_ns: u64) {
        self.timeline = Some(super::timeline::Timeline::new(period_ns));
    }

    pub fn set_timeline(&mut self, timeline: super::timeline::Timeline) {
        self.timeline = Some(timeline);
    }

    pub fn timeline(&self) -> Option<&super::timeline::Timeline> {
        self.timeline.as_ref()
    }

    /// Notes when a stack already counted with [`Profile::add`] was sampled, if a timeline
    /// is kept.
    pub fn add_time(&mut self, pid: u32, tid: u32, time_ns: u64, frames_root_first: &[FrameId]) {
        if let Some(t) = self.timeline.as_mut() {
            t.add(pid, tid, time_ns, frames_root_first);
        }
    }

    /// Sets the byte budget (see the module doc); what is already held stays.
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
    }

    /// Accounted bytes of the interned frames and stacks.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The interning generation `FrameId`s belong to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Like [`Profile::intern`], but `None` for a frame not interned yet that would take the
    /// profile past its byte budget.
    pub fn try_intern(&mut self, frame: FrameName) -> Option<FrameId> {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return Some(id);
        }
        if self.bytes.saturating_add(frame_bytes(&frame)) > self.budget {
            return None;
        }
        Some(self.intern(frame))
    }

    /// [`Profile::try_intern`] for a synthetic frame (no file, no line) named by a static
    /// string, such as the `<off-cpu: ...>` frame every off-CPU record ends in: its id is
    /// remembered, so later ones cost no allocation. Same ids as `try_intern` would give.
    pub fn try_intern_static(&mut self, name: &'static str) -> Option<FrameId> {
        if let Some(&(_, id)) = self.static_ids.iter().find(|(n, _)| std::ptr::eq(*n, name)) {
            return Some(id);
        }
        let id = self.try_intern(FrameName { function: Arc::from(name), file: Arc::from(""), line: 0, native: None })?;
        if self.static_ids.len() < MAX_STATIC_IDS {
            self.static_ids.push((name, id));
        }
        Some(id)
    }

    /// Returns the id of `frame`, interning it on first sight. Equal frames get equal ids.
    ///
    /// Should more than `u32::MAX` distinct frames ever be interned (impossible in practice),
    /// the extra ones all share the last id rather than wrapping around.
    pub fn intern(&mut self, frame: FrameName) -> FrameId {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let Ok(id) = FrameId::try_from(self.frames.len()) else {
            return FrameId::MAX;
        };
        self.bytes = self.bytes.saturating_add(frame_bytes(&frame));
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// The frame interned as `id`.
    ///
    /// An id this profile never returned from [`Profile::intern`] yields a placeholder named
    /// `[unknown frame]` (with an empty file and line 0) instead of panicking.
    pub fn frame(&self, id: FrameId) -> &FrameName {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.frames.get(i))
            .unwrap_or(&self.unknown)
    }

    /// Number of distinct interned frames; valid ids are `0..frame_count()`.
    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// Records how process `pid` is labelled. Called when a process is first seen; calling it
    /// again (e.g. after an `exec`) replaces the label but keeps the process's sample count.
    pub fn set_process(&mut self, pid: u32, label: ProcessLabel) {
        self.processes.entry(pid).or_default().label = Some(label);
    }

    /// Records the name of thread `tid` (replacing an older one; ignored once
    /// [`MAX_THREAD_NAMES`] other threads are named).
    pub fn set_thread_name(&mut self, tid: u32, name: &str) {
        if self.thread_names.len() < MAX_THREAD_NAMES || self.thread_names.contains_key(&tid) {
            self.thread_names.insert(tid, Arc::from(name));
        }
    }

    /// The name of thread `tid`, if known.
    pub fn thread_name(&self, tid: u32) -> Option<&str> {
        self.thread_names.get(&tid).map(|n| &**n)
    }

    /// The label of process `pid`, if [`Profile::set_process`] was called for it.
    pub fn process(&self, pid: u32) -> Option<&ProcessLabel> {
        self.processes.get(&pid).and_then(|p| p.label.as_ref())
    }

    /// Counts `count` samples of a stack given ROOT FIRST. `tid` is `Some` only when recording
    /// per thread (`--threads`).
    ///
    /// A repeat stack costs one hash of the slice and no allocation. `count == 0` records
    /// nothing (no empty entry is created). Counters saturate at `u64::MAX`. An empty
    /// `frames_root_first` is a valid stack: the process was sampled outside Python code.
    ///
    /// Returns `false`, counting nothing, for a stack not seen before that would take the
    /// profile past its byte budget.
    pub fn add(&mut self, pid: u32, tid: Option<u32>, frames_root_first: &[FrameId], count: u64) -> bool {
        self.add_weighted(pid, tid, frames_root_first, count, count)
    }

    /// As [`Profile::add`], for `events` samples or intervals worth `count` together (the
    /// value: nanoseconds in the time modes). Nothing is recorded when `count == 0`.
    pub fn add_weighted(&mut self, pid: u32, tid: Option<u32>, frames_root_first: &[FrameId], count: u64, events: u64) -> bool {
        if count == 0 {
            return true;
        }
        let hash = stack_hash(&self.hasher, pid, tid, frames_root_first);
        let same = |(key, _, _): &(StackKey, u64, u64)| {
            key.pid == pid && key.tid == tid && *key.frames == *frames_root_first
        };
        if let Some((_, n, e)) = self.stacks.find_mut(hash, same) {
            *n = n.saturating_add(count);
            *e = e.saturating_add(events);
        } else {
            let cost = stack_bytes(frames_root_first.len());
            if self.bytes.saturating_add(cost) > self.budget {
                return false;
            }
            self.bytes += cost;
            let key = StackKey {
                pid,
                tid,
                frames: Box::from(frames_root_first),
            };
            let hasher = &self.hasher;
            self.stacks.insert_unique(hash, (key, count, events), |(k, _, _)| {
                stack_hash(hasher, k.pid, k.tid, &k.frames)
            });
        }
        self.total = self.total.saturating_add(count);
        let process = self.processes.entry(pid).or_default();
        process.samples = process.samples.saturating_add(count);
        true
    }

    /// All samples counted so far, over every process.
    pub fn total_samples(&self) -> u64 {
        self.total
    }

    /// Samples counted for process `pid` (0 for a process never sampled).
    pub fn samples_of(&self, pid: u32) -> u64 {
        self.processes.get(&pid).map_or(0, |p| p.samples)
    }

    /// Pids of every process that was labelled or sampled, in ascending order.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    /// Number of distinct stacks.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// Makes outputs start every stack with a `container <short id>` frame.
    pub fn set_container_root(&mut self, on: bool) {
        self.container_root = on;
    }

    pub fn container_root(&self) -> bool {
        self.container_root
    }

    pub fn set_timing(&mut self, timing: Timing) {
        self.timing = Some(timing);
    }

    pub fn timing(&self) -> Option<&Timing> {
        self.timing.as_ref()
    }

    /// Hands over everything counted so far (stacks, interned frames, labels) and starts
    /// afresh in a new epoch, with the same settings and budget, keeping the labels of the
    /// processes `keep_label` accepts (those still profiled). Nothing of the interval stays
    /// behind: its frames and stacks are freed with the returned profile. `FrameId`s handed
    /// out before are valid in the returned profile only (the agent, at every interval).
    pub fn take_interval(&mut self, keep_label: impl Fn(u32) -> bool) -> Profile {
        let mut fresh = Profile::new();
        fresh.container_root = self.container_root;
        fresh.budget = self.budget;
        fresh.line_numbers = self.line_numbers;
        fresh.time_mode = self.time_mode;
        fresh.epoch = self.epoch.wrapping_add(1);
        fresh.thread_names = self.thread_names.clone();
        for (pid, entry) in &self.processes {
            if let Some(label) = entry.label.as_ref().filter(|_| keep_label(*pid)) {
                fresh.set_process(*pid, label.clone());
            }
        }
        std::mem::replace(self, fresh)
    }

    /// A profile holding only the stacks `keep` accepts, their processes' labels and only the
    /// frames they use (ids renumbered), without a byte budget.
    pub fn filtered(&self, keep: impl Fn(&StackKey) -> bool) -> Profile {
        let mut part = Profile::new();
        part.container_root = self.container_root;
        part.timing = self.timing.clone();
        part.budget = usize::MAX;
        part.line_numbers = self.line_numbers;
        part.time_mode = self.time_mode;
        part.thread_names = self.thread_names.clone();
        let mut ids: HashMap<FrameId, FrameId> = HashMap::new();
        let mut frames = Vec::new();
        for (key, count, events) in self.stacks_with_events() {
            if keep(key) {
                if let Some(label) = self.process(key.pid) {
                    part.set_process(key.pid, label.clone());
                }
                frames.clear();
                for id in key.frames.iter() {
                    let new = match ids.get(id) {
                        Some(new) => *new,
                        None => {
                            let new = part.intern(self.frame(*id).clone());
                            ids.insert(*id, new);
                            new
                        }
                    };
                    frames.push(new);
                }
                part.add_weighted(key.pid, key.tid, &frames, count, events);
            }
        }
        part
    }

    /// Every distinct stack with its (non-zero) count, in no particular order.
    pub fn stacks(&self) -> impl Iterator<Item = (&StackKey, u64)> {
        self.stacks.iter().map(|(key, count, _)| (key, *count))
    }

    /// Every distinct stack with its value and its number of events (samples and off-CPU
    /// intervals; equal to the value in `cpu` mode).
    pub fn stacks_with_events(&self) -> impl Iterator<Item = (&StackKey, u64, u64)> {
        self.stacks.iter().map(|(key, count, events)| (key, *count, *events))
    }

    /// Sets which time the values are (nanoseconds in `wall` and `off-cpu` modes).
    pub fn set_time_mode(&mut self, mode: crate::time_mode::TimeMode) {
        self.time_mode = mode;
    }

    pub fn time_mode(&self) -> crate::time_mode::TimeMode {
        self.time_mode
    }
}

/// Accounted bytes of one interned frame.
fn frame_bytes(frame: &FrameName) -> usize {
    // A native origin's mapping is shared by the frames of one file; its own size counts.
    frame.function.len() + frame.file.len() + FRAME_OVERHEAD + frame.native.as_ref().map_or(0, |_| 48)
}

/// Accounted bytes of one stack of `depth` frames.
fn stack_bytes(depth: usize) -> usize {
    depth * std::mem::size_of::<FrameId>() + STACK_OVERHEAD
}

/// The hash of a stack identity. Used both for borrowed lookups in [`Profile::add`] and for
/// rehashing stored keys, so the two must hash exactly the same fields the same way.
fn stack_hash(hasher: &DefaultHashBuilder, pid: u32, tid: Option<u32>, frames: &[FrameId]) -> u64 {
    hasher.hash_one((pid, tid, frames))
}

/// Stage 5 of the sample path, aggregate: one sample's stack (root first) and its value →
/// the profile (and the timeline, when kept), with the sample's outcome.
///
/// Input: the `result` of the earlier stages, the number of Python frames the stack holds
/// (none: the thread ran no Python code), the value of the record (`Charge::value`).
/// Output: `Ok` once added; the earlier stages' error as its outcome; `Idle`; `ProfileFull`
/// when the profile is at its budget.
pub(crate) fn add_sample(
    profile: &mut Profile,
    header: &profiler_common::SampleHeader,
    threads: bool,
    stack: &[FrameId],
    python_frames: usize,
    value: u64,
    result: Result<(), super::FrameError>,
) -> crate::stats::SampleOutcome {
    use super::FrameError;
    use crate::stats::SampleOutcome;
    match result {
        Err(FrameError::BadCode) => SampleOutcome::BadCodeObject,
        Err(FrameError::Changed) => SampleOutcome::ChangedCodeObject,
        Err(FrameError::ProfileFull) => SampleOutcome::ProfileFull,
        Ok(()) if python_frames == 0 => SampleOutcome::Idle,
        Ok(()) if !profile.add_weighted(header.tgid, threads.then_some(header.tid), stack, value, 1) => SampleOutcome::ProfileFull,
        Ok(()) => {
            profile.add_time(header.tgid, header.tid, header.time_ns, stack);
            SampleOutcome::Ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(function: &str, file: &str, line: u32) -> FrameName {
        FrameName {
            function: Arc::from(function),
            file: Arc::from(file),
            line,
            native: None,
        }
    }

    #[test]
    fn intern_dedups_and_round_trips() {
        let mut p = Profile::new();
        let a = p.intern(name("main", "app.py", 1));
        let b = p.intern(name("work", "app.py", 7));
        let a2 = p.intern(name("main", "app.py", 1));
        let a_other_line = p.intern(name("main", "app.py", 2));
        assert_eq!(a, a2);
        assert_ne!(a, b);
        assert_ne!(a, a_other_line);
        assert_eq!(p.frame_count(), 3);
        assert_eq!(p.frame(b), &name("work", "app.py", 7));
        assert_eq!(&*p.frame(999).function, "[unknown frame]");
    }

    #[test]
    fn add_counts_repeat_stacks_once() {
        let mut p = Profile::new();
        let a = p.intern(name("main", "app.py", 1));
        let b = p.intern(name("work", "app.py", 7));
        p.add(10, None, &[a, b], 1);
        p.add(10, None, &[a, b], 2);
        p.add(10, None, &[a], 1);
        p.add(10, Some(11), &[a, b], 1);
        p.add(20, None, &[a, b], 5);
        p.add(20, None, &[], 1);
        p.add(20, None, &[a], 0);

        assert_eq!(p.total_samples(), 11);
        assert_eq!(p.samples_of(10), 5);
        assert_eq!(p.samples_of(20), 6);
        assert_eq!(p.samples_of(30), 0);
        assert_eq!(p.stack_count(), 5);

        let mut stacks: Vec<(StackKey, u64)> = p.stacks().map(|(k, n)| (k.clone(), n)).collect();
        stacks.sort();
        let key = |pid, tid, frames: &[FrameId]| StackKey {
            pid,
            tid,
            frames: Box::from(frames),
        };
        assert_eq!(
            stacks,
            vec![
                (key(10, None, &[a]), 1),
                (key(10, None, &[a, b]), 3),
                (key(10, Some(11), &[a, b]), 1),
                (key(20, None, &[]), 1),
                (key(20, None, &[a, b]), 5),
            ]
        );
        let sum: u64 = p.stacks().map(|(_, n)| n).sum();
        assert_eq!(sum, p.total_samples());
    }

    #[test]
    fn many_stacks_survive_rehashing() {
        let mut p = Profile::new();
        let ids: Vec<FrameId> = (0..50)
            .map(|i| p.intern(name(&format!("f{i}"), "m.py", i)))
            .collect();
        for round in 0..3 {
            for len in 1..=ids.len() {
                p.add(1, Some(round), &ids[..len], 1);
            }
            for len in 1..=ids.len() {
                p.add(1, Some(round), &ids[..len], 1);
            }
        }
        assert_eq!(p.stack_count(), 150);
        assert!(p.stacks().all(|(_, n)| n == 2));
        assert_eq!(p.total_samples(), 300);
    }

    #[test]
    fn process_labels() {
        let mut p = Profile::new();
        assert!(p.process(1).is_none());
        p.add(1, None, &[], 3);
        p.set_process(
            1,
            ProcessLabel {
                comm: "python3".into(),
                exe: "/usr/bin/python3.12".into(),
                version: "3.12.4".into(), ..Default::default()
            },
        );
        assert_eq!(p.process(1).map(|l| l.comm.as_str()), Some("python3"));
        assert_eq!(p.samples_of(1), 3);
        p.set_process(
            2,
            ProcessLabel {
                comm: "gunicorn".into(),
                exe: "/usr/bin/python3".into(),
                version: "3.11.9".into(), ..Default::default()
            },
        );
        assert_eq!(p.pids(), vec![1, 2]);
    }

    #[test]
    fn counters_saturate() {
        let mut p = Profile::new();
        p.add(1, None, &[], u64::MAX);
        p.add(1, None, &[], 1);
        assert_eq!(p.total_samples(), u64::MAX);
        assert_eq!(p.samples_of(1), u64::MAX);
        assert_eq!(p.stacks().next().map(|(_, n)| n), Some(u64::MAX));
    }

    #[test]
    fn budget_refuses_new_frames_and_stacks_but_counts_known_ones() {
        let mut p = Profile::new();
        let long = "f".repeat(4096);
        let a = p.try_intern(name(&long, "m.py", 1)).unwrap();
        assert!(p.add(1, None, &[a], 1));
        // A 4 KiB name is counted by its bytes.
        assert!(p.bytes() >= 4096 + "m.py".len());
        p.set_budget(p.bytes());
        assert_eq!(p.try_intern(name("g", "m.py", 2)), None, "a new frame past the budget");
        assert_eq!(p.try_intern(name(&long, "m.py", 1)), Some(a), "a known frame is still found");
        assert!(p.add(1, None, &[a], 2), "a known stack is still counted");
        assert!(!p.add(1, None, &[a, a], 1), "a new stack past the budget");
        assert_eq!(p.total_samples(), 3);
        assert_eq!(p.stack_count(), 1);
    }

    #[test]
    fn take_interval_hands_over_everything_and_starts_a_new_epoch() {
        let mut p = Profile::new();
        p.set_budget(1 << 20);
        let label = |comm: &str| ProcessLabel { comm: comm.into(), ..Default::default() };
        p.set_process(1, label("alive"));
        p.set_process(2, label("gone"));
        let a = p.intern(name("main", "app.py", 1));
        p.add(1, None, &[a], 4);
        p.add(2, None, &[a], 1);
        let epoch = p.epoch();
        let part = p.take_interval(|pid| pid == 1);
        assert_eq!(part.total_samples(), 5);
        assert_eq!(part.frame(a), &name("main", "app.py", 1));
        assert_eq!(part.process(2).map(|l| l.comm.as_str()), Some("gone"));
        assert_ne!(p.epoch(), epoch);
        assert_eq!((p.frame_count(), p.stack_count(), p.total_samples(), p.bytes()), (0, 0, 0, 0));
        assert_eq!(p.pids(), vec![1], "only the labels of processes still profiled stay");
        assert_eq!(p.samples_of(1), 0);
        let _ = p.try_intern(name(&"x".repeat(2 << 20), "big.py", 1)).map(|_| panic!("the budget carries over"));
    }

    #[test]
    fn filtered_keeps_only_the_frames_it_uses() {
        let mut p = Profile::new();
        let a = p.intern(name("a", "m.py", 1));
        let b = p.intern(name("b", "m.py", 2));
        let c = p.intern(name("c", "m.py", 3));
        p.add(1, None, &[a, c], 2);
        p.add(2, None, &[b], 1);
        let part = p.filtered(|k| k.pid == 1);
        assert_eq!(part.frame_count(), 2);
        let stacks: Vec<(Vec<String>, u64)> = part
            .stacks()
            .map(|(k, n)| (k.frames.iter().map(|id| part.frame(*id).function.to_string()).collect(), n))
            .collect();
        assert_eq!(stacks, vec![(vec!["a".to_string(), "c".to_string()], 2)]);
    }
}
