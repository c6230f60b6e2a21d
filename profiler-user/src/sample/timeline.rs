//! When each thread ran which stack: the per-sample times that `--format chrometrace` needs.
//!
//! Memory stays proportional to stack *changes*, not to samples: a thread's sample whose
//! stack equals the thread's previous one, and which follows it within [`MAX_GAP_PERIODS`]
//! sampling periods, extends the previous [`Run`] instead of adding one. At most
//! [`MAX_RUNS`] runs are kept in all; samples that would need more are counted in
//! `dropped_over_cap` (they still count in the aggregated profile) and shown by `--stats`.

use std::collections::HashMap;

use super::FrameId;

/// The most runs kept over all threads (about 24 bytes each: some 24 MB).
pub const MAX_RUNS: usize = 1_000_000;
/// A gap longer than this many sampling periods ends a run even if the stack is the same
/// (the thread was off the CPU in between).
pub const MAX_GAP_PERIODS: u64 = 3;

/// Consecutive samples of one thread with the same stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Index into [`Timeline::stack`].
    pub stack: u32,
    /// Kernel time (CLOCK_MONOTONIC, ns) of the first and last sample of the run.
    pub first_ns: u64,
    pub last_ns: u64,
    pub samples: u32,
}

/// The runs of every sampled thread, in time order per thread.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    period_ns: u64,
    stacks: Vec<Box<[FrameId]>>,
    stack_ids: HashMap<Box<[FrameId]>, u32>,
    threads: HashMap<(u32, u32), Vec<Run>>,
    runs: usize,
    /// Samples not kept because [`MAX_RUNS`] was reached.
    pub dropped_over_cap: u64,
    /// Samples older than their thread's last one (not placed; counted only).
    pub out_of_order: u64,
}

impl Timeline {
    /// An empty timeline for samples taken every `period_ns`.
    pub fn new(period_ns: u64) -> Self {
        Timeline { period_ns: period_ns.max(1), ..Default::default() }
    }

    /// Notes that thread `tid` of process `pid` was sampled at `time_ns` with `frames`
    /// (root first).
    pub fn add(&mut self, pid: u32, tid: u32, time_ns: u64, frames: &[FrameId]) {
        let max_gap = self.period_ns.saturating_mul(MAX_GAP_PERIODS);
        let runs = self.threads.entry((pid, tid)).or_default();
        if let Some(last) = runs.last_mut() {
            if time_ns < last.last_ns {
                self.out_of_order += 1;
                return;
            }
            if *self.stacks[last.stack as usize] == *frames && time_ns - last.last_ns <= max_gap {
                last.last_ns = time_ns;
                last.samples = last.samples.saturating_add(1);
                return;
            }
        }
        if self.runs >= MAX_RUNS {
            self.dropped_over_cap += 1;
            return;
        }
        let stack = match self.stack_ids.get(frames) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.stacks.len()).unwrap_or(u32::MAX);
                self.stacks.push(Box::from(frames));
                self.stack_ids.insert(Box::from(frames), id);
                id
            }
        };
        runs.push(Run { stack, first_ns: time_ns, last_ns: time_ns, samples: 1 });
        self.runs += 1;
    }

    /// The sampling period in nanoseconds.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// The frames (root first) of a run's stack.
    pub fn stack(&self, id: u32) -> &[FrameId] {
        self.stacks.get(id as usize).map(|s| &**s).unwrap_or(&[])
    }

    /// Every thread's runs, sorted by (pid, tid).
    pub fn threads(&self) -> Vec<((u32, u32), &[Run])> {
        let mut threads: Vec<((u32, u32), &[Run])> = self.threads.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        threads.sort_by_key(|(k, _)| *k);
        threads
    }

    /// Runs kept.
    pub fn run_count(&self) -> usize {
        self.runs
    }

    /// The earliest sample time, if any.
    pub fn first_ns(&self) -> Option<u64> {
        self.threads.values().filter_map(|runs| runs.first()).map(|r| r.first_ns).min()
    }

    /// The same timeline with every frame id mapped through `map` (given the process);
    /// frames `map` does not know are dropped from their stack.
    pub fn remapped(&self, mut map: impl FnMut(u32, FrameId) -> Option<FrameId>) -> Timeline {
        let mut out = Timeline {
            period_ns: self.period_ns,
            runs: self.runs,
            dropped_over_cap: self.dropped_over_cap,
            out_of_order: self.out_of_order,
            ..Default::default()
        };
        for (&(pid, tid), runs) in &self.threads {
            let mut mapped_runs = Vec::with_capacity(runs.len());
            for run in runs {
                let frames: Vec<FrameId> = self.stack(run.stack).iter().filter_map(|&id| map(pid, id)).collect();
                let stack = match out.stack_ids.get(frames.as_slice()) {
                    Some(&id) => id,
                    None => {
                        let id = u32::try_from(out.stacks.len()).unwrap_or(u32::MAX);
                        out.stacks.push(frames.clone().into_boxed_slice());
                        out.stack_ids.insert(frames.into_boxed_slice(), id);
                        id
                    }
                };
                mapped_runs.push(Run { stack, ..*run });
            }
            out.threads.insert((pid, tid), mapped_runs);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_consecutive_samples_merge() {
        let mut t = Timeline::new(10);
        t.add(1, 1, 100, &[1, 2]);
        t.add(1, 1, 110, &[1, 2]);
        t.add(1, 2, 110, &[1, 2]);
        t.add(1, 1, 120, &[1, 3]);
        t.add(1, 1, 130, &[1, 2]);
        // A long gap: a new run although the stack is the same.
        t.add(1, 1, 500, &[1, 2]);
        t.add(1, 1, 400, &[1, 2]);
        let threads = t.threads();
        assert_eq!(threads.len(), 2);
        let runs = threads[0].1;
        assert_eq!(runs.len(), 4);
        assert_eq!((runs[0].first_ns, runs[0].last_ns, runs[0].samples), (100, 110, 2));
        assert_eq!(t.stack(runs[1].stack), &[1, 3]);
        assert_eq!(runs[0].stack, runs[2].stack);
        assert_eq!(t.out_of_order, 1);
        assert_eq!(t.run_count(), 5);
        assert_eq!(t.first_ns(), Some(100));
    }

    #[test]
    fn remapping_keeps_runs() {
        let mut t = Timeline::new(10);
        t.add(1, 1, 100, &[1, 2]);
        t.add(1, 1, 110, &[3]);
        let r = t.remapped(|_, id| (id != 2).then_some(id + 10));
        let runs = r.threads()[0].1;
        assert_eq!(r.stack(runs[0].stack), &[11]);
        assert_eq!(r.stack(runs[1].stack), &[13]);
    }
}
