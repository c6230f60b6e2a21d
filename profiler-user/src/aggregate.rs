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

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};

/// One Python frame as shown to users.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameName {
    /// The function's (qualified, when the interpreter provides it) name.
    pub function: Arc<str>,
    /// The source file of the code object.
    pub file: Arc<str>,
    /// The line being executed; `0` means unknown.
    pub line: u32,
}

/// Index of an interned [`FrameName`] within one [`Profile`].
///
/// Ids are dense and assigned in interning order starting at 0, so they are only meaningful
/// for the profile that produced them.
pub type FrameId = u32;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    pub start: std::time::SystemTime,
    pub duration: std::time::Duration,
    pub rate_hz: u64,
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
    frame_ids: HashMap<FrameName, FrameId>,
    processes: HashMap<u32, ProcessEntry>,
    stacks: HashTable<(StackKey, u64)>,
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
    timeline: Option<crate::timeline::Timeline>,
}

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
            .finish()
    }
}

impl Profile {
    /// An empty profile.
    pub fn new() -> Self {
        Profile {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            processes: HashMap::new(),
            stacks: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            total: 0,
            container_root: false,
            timing: None,
            unknown: FrameName {
                function: Arc::from("[unknown frame]"),
                file: Arc::from(""),
                line: 0,
            },
            line_numbers: LineNumbers::Current,
            timeline: None,
        }
    }

    /// An empty profile with the same settings (container root, timing, line numbers) and no
    /// timeline.
    pub fn empty_like(&self) -> Profile {
        let mut p = Profile::new();
        p.container_root = self.container_root;
        p.timing = self.timing.clone();
        p.line_numbers = self.line_numbers;
        p
    }

    pub fn set_line_numbers(&mut self, mode: LineNumbers) {
        self.line_numbers = mode;
    }

    pub fn line_numbers(&self) -> LineNumbers {
        self.line_numbers
    }

    /// Starts keeping per-thread sample times (see [`crate::timeline`]).
    pub fn keep_timeline(&mut self, period_ns: u64) {
        self.timeline = Some(crate::timeline::Timeline::new(period_ns));
    }

    pub fn set_timeline(&mut self, timeline: crate::timeline::Timeline) {
        self.timeline = Some(timeline);
    }

    pub fn timeline(&self) -> Option<&crate::timeline::Timeline> {
        self.timeline.as_ref()
    }

    /// Notes when a stack already counted with [`Profile::add`] was sampled, if a timeline
    /// is kept.
    pub fn add_time(&mut self, pid: u32, tid: u32, time_ns: u64, frames_root_first: &[FrameId]) {
        if let Some(t) = self.timeline.as_mut() {
            t.add(pid, tid, time_ns, frames_root_first);
        }
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
    pub fn add(&mut self, pid: u32, tid: Option<u32>, frames_root_first: &[FrameId], count: u64) {
        if count == 0 {
            return;
        }
        let hash = stack_hash(&self.hasher, pid, tid, frames_root_first);
        let same = |(key, _): &(StackKey, u64)| {
            key.pid == pid && key.tid == tid && *key.frames == *frames_root_first
        };
        if let Some((_, n)) = self.stacks.find_mut(hash, same) {
            *n = n.saturating_add(count);
        } else {
            let key = StackKey {
                pid,
                tid,
                frames: Box::from(frames_root_first),
            };
            let hasher = &self.hasher;
            self.stacks.insert_unique(hash, (key, count), |(k, _)| {
                stack_hash(hasher, k.pid, k.tid, &k.frames)
            });
        }
        self.total = self.total.saturating_add(count);
        let process = self.processes.entry(pid).or_default();
        process.samples = process.samples.saturating_add(count);
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

    /// Moves the stacks counted so far into a new profile and starts counting afresh.
    /// Interned frames and process labels are kept on both sides, so `FrameId`s handed out
    /// before stay valid here (the agent uses this at every interval).
    pub fn take_stacks(&mut self) -> Profile {
        let mut taken = Profile {
            frames: self.frames.clone(),
            frame_ids: HashMap::new(),
            processes: HashMap::new(),
            stacks: std::mem::take(&mut self.stacks),
            hasher: self.hasher.clone(),
            total: std::mem::take(&mut self.total),
            container_root: self.container_root,
            timing: self.timing.clone(),
            unknown: self.unknown.clone(),
            line_numbers: self.line_numbers,
            timeline: None,
        };
        for (pid, entry) in self.processes.iter_mut() {
            taken.processes.insert(*pid, ProcessEntry { label: entry.label.clone(), samples: std::mem::take(&mut entry.samples) });
        }
        taken
    }

    /// A profile holding only the stacks `keep` accepts (labels and frames kept).
    pub fn filtered(&self, keep: impl Fn(&StackKey) -> bool) -> Profile {
        let mut part = Profile {
            frames: self.frames.clone(),
            frame_ids: HashMap::new(),
            processes: HashMap::new(),
            stacks: HashTable::new(),
            hasher: self.hasher.clone(),
            total: 0,
            container_root: self.container_root,
            timing: self.timing.clone(),
            unknown: self.unknown.clone(),
            line_numbers: self.line_numbers,
            timeline: None,
        };
        for (key, count) in self.stacks() {
            if keep(key) {
                if let Some(label) = self.process(key.pid) {
                    part.set_process(key.pid, label.clone());
                }
                part.add(key.pid, key.tid, &key.frames, count);
            }
        }
        part
    }

    /// Every distinct stack with its (non-zero) count, in no particular order.
    pub fn stacks(&self) -> impl Iterator<Item = (&StackKey, u64)> {
        self.stacks.iter().map(|(key, count)| (key, *count))
    }
}

/// The hash of a stack identity. Used both for borrowed lookups in [`Profile::add`] and for
/// rehashing stored keys, so the two must hash exactly the same fields the same way.
fn stack_hash(hasher: &DefaultHashBuilder, pid: u32, tid: Option<u32>, frames: &[FrameId]) -> u64 {
    hasher.hash_one((pid, tid, frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(function: &str, file: &str, line: u32) -> FrameName {
        FrameName {
            function: Arc::from(function),
            file: Arc::from(file),
            line,
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
}
