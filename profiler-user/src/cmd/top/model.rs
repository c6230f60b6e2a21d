//! What `pyperch top` shows, as numbers: per function (or per line) of each process and
//! thread, the share of samples in which it runs itself (own) and in which it is on the stack
//! at all (total), over a sliding window of the last ticks and since the start.
//!
//! Invariants: a stack counts at most once in any row's `total` (a recursive function is one
//! row per stack, not one per frame), and its innermost frame once in one row's `own`; so no
//! share exceeds 100 %.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Functions merge the lines of one function; lines keep them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    Functions,
    Lines,
}

/// One row: a function (line 0) or a line of one process and thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowKey {
    pub pid: u32,
    pub tid: Option<u32>,
    pub function: Arc<str>,
    pub file: Arc<str>,
    /// 0 in the functions view (and for unknown lines).
    pub line: u32,
}

/// Samples of one row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub own: u64,
    pub total: u64,
}

/// One tick's samples, counted both ways.
#[derive(Debug, Default)]
pub struct Tick {
    lines: HashMap<RowKey, Counts>,
    functions: HashMap<RowKey, Counts>,
    samples: HashMap<u32, u64>,
}

/// One frame of a sampled stack.
pub struct FrameRef<'a> {
    pub function: &'a Arc<str>,
    pub file: &'a Arc<str>,
    pub line: u32,
}

impl Tick {
    /// Counts one stack (root first) seen `count` times.
    pub fn add(&mut self, pid: u32, tid: Option<u32>, frames: &[FrameRef<'_>], count: u64) {
        *self.samples.entry(pid).or_default() += count;
        for (map, granularity) in [(&mut self.lines, Granularity::Lines), (&mut self.functions, Granularity::Functions)] {
            let key = |f: &FrameRef<'_>| RowKey {
                pid,
                tid,
                function: f.function.clone(),
                file: f.file.clone(),
                line: if granularity == Granularity::Lines { f.line } else { 0 },
            };
            let mut seen = HashSet::new();
            for frame in frames {
                let k = key(frame);
                if seen.insert(k.clone()) {
                    map.entry(k).or_default().total += count;
                }
            }
            if let Some(leaf) = frames.last() {
                map.entry(key(leaf)).or_default().own += count;
            }
        }
    }

    fn rows(&self, granularity: Granularity) -> &HashMap<RowKey, Counts> {
        match granularity {
            Granularity::Lines => &self.lines,
            Granularity::Functions => &self.functions,
        }
    }
}

/// One row as shown: shares in percent.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub key: RowKey,
    pub window_own: f64,
    pub window_total: f64,
    pub all_own: f64,
    pub all_total: f64,
}

/// The column rows are sorted by (descending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    WindowOwn,
    WindowTotal,
    AllOwn,
    AllTotal,
}

impl SortBy {
    pub fn next(self) -> Self {
        match self {
            SortBy::WindowOwn => SortBy::WindowTotal,
            SortBy::WindowTotal => SortBy::AllOwn,
            SortBy::AllOwn => SortBy::AllTotal,
            SortBy::AllTotal => SortBy::WindowOwn,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SortBy::WindowOwn => "own (window)",
            SortBy::WindowTotal => "total (window)",
            SortBy::AllOwn => "own (since start)",
            SortBy::AllTotal => "total (since start)",
        }
    }
}

/// The sliding window and the totals since the start.
pub struct Model {
    window: VecDeque<Tick>,
    window_ticks: usize,
    all: Tick,
    /// Process labels (command names), by pid.
    pub processes: BTreeMap<u32, String>,
    /// Thread names as every output shows them (`output::thread_name_text`: the Python
    /// name, else the OS name), by tid; at most [`MAX_THREAD_NAMES`].
    pub thread_names: HashMap<u32, String>,
}

/// Thread names kept for the THREAD column.
pub const MAX_THREAD_NAMES: usize = 65_536;

impl Model {
    pub fn new(window_ticks: usize) -> Self {
        Self {
            window: VecDeque::new(),
            window_ticks: window_ticks.max(1),
            all: Tick::default(),
            processes: BTreeMap::new(),
            thread_names: HashMap::new(),
        }
    }

    /// The THREAD column of a row's thread: its name, or empty.
    pub fn thread_name(&self, tid: Option<u32>) -> &str {
        tid.and_then(|t| self.thread_names.get(&t)).map_or("", String::as_str)
    }

    /// Records the name of thread `tid` (the last one read wins).
    pub fn set_thread_name(&mut self, tid: u32, name: String) {
        if self.thread_names.len() < MAX_THREAD_NAMES || self.thread_names.contains_key(&tid) {
            self.thread_names.insert(tid, name);
        }
    }

    /// Adds one tick: it enters the window (pushing the oldest out) and the totals.
    pub fn push(&mut self, tick: Tick) {
        for (granularity, rows) in [(Granularity::Lines, &tick.lines), (Granularity::Functions, &tick.functions)] {
            let all = match granularity {
                Granularity::Lines => &mut self.all.lines,
                Granularity::Functions => &mut self.all.functions,
            };
            for (k, c) in rows {
                let e = all.entry(k.clone()).or_default();
                e.own += c.own;
                e.total += c.total;
            }
        }
        for (pid, n) in &tick.samples {
            *self.all.samples.entry(*pid).or_default() += n;
        }
        self.window.push_back(tick);
        while self.window.len() > self.window_ticks {
            self.window.pop_front();
        }
    }

    /// Samples in the window and since the start, of `pid` or of every process.
    pub fn samples(&self, pid: Option<u32>) -> (u64, u64) {
        let of = |t: &Tick| match pid {
            Some(p) => t.samples.get(&p).copied().unwrap_or(0),
            None => t.samples.values().sum(),
        };
        (self.window.iter().map(of).sum(), of(&self.all))
    }

    /// Pids seen, in order.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.all.samples.keys().copied().chain(self.processes.keys().copied()).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// The rows of `pid` (or all), sorted by `sort` then by name, at most `limit`.
    pub fn rows(&self, granularity: Granularity, pid: Option<u32>, sort: SortBy, limit: usize) -> Vec<Row> {
        let keep = |k: &RowKey| pid.is_none_or(|p| k.pid == p);
        let mut window: HashMap<&RowKey, Counts> = HashMap::new();
        for tick in &self.window {
            for (k, c) in tick.rows(granularity).iter().filter(|(k, _)| keep(k)) {
                let e = window.entry(k).or_default();
                e.own += c.own;
                e.total += c.total;
            }
        }
        let (window_samples, all_samples) = self.samples(pid);
        let share = |n: u64, of: u64| if of == 0 { 0.0 } else { 100.0 * n as f64 / of as f64 };
        let mut rows: Vec<Row> = self
            .all
            .rows(granularity)
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, all)| {
                let w = window.get(k).copied().unwrap_or_default();
                Row {
                    key: k.clone(),
                    window_own: share(w.own, window_samples),
                    window_total: share(w.total, window_samples),
                    all_own: share(all.own, all_samples),
                    all_total: share(all.total, all_samples),
                }
            })
            .collect();
        let value = |r: &Row| match sort {
            SortBy::WindowOwn => (r.window_own, r.all_own),
            SortBy::WindowTotal => (r.window_total, r.all_total),
            SortBy::AllOwn => (r.all_own, r.window_own),
            SortBy::AllTotal => (r.all_total, r.window_total),
        };
        rows.sort_by(|a, b| value(b).partial_cmp(&value(a)).unwrap_or(std::cmp::Ordering::Equal).then(a.key.cmp(&b.key)));
        rows.truncate(limit);
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames<'a>(names: &'a [(Arc<str>, Arc<str>, u32)]) -> Vec<FrameRef<'a>> {
        names.iter().map(|(f, file, line)| FrameRef { function: f, file, line: *line }).collect()
    }

    #[test]
    fn shares() {
        let s = |x: &str| Arc::<str>::from(x);
        let a = [(s("main"), s("m.py"), 1), (s("work"), s("m.py"), 5)];
        let b = [(s("main"), s("m.py"), 2), (s("rec"), s("m.py"), 9), (s("rec"), s("m.py"), 9)];
        let mut tick = Tick::default();
        tick.add(7, Some(7), &frames(&a), 3);
        tick.add(7, Some(7), &frames(&b), 1);
        let mut model = Model::new(2);
        model.push(tick);
        let rows = model.rows(Granularity::Functions, None, SortBy::WindowOwn, 10);
        assert_eq!(rows[0].key.function.as_ref(), "work");
        assert_eq!(rows[0].window_own, 75.0);
        let main = rows.iter().find(|r| r.key.function.as_ref() == "main").unwrap();
        assert_eq!(main.window_total, 100.0, "main on every stack, merged over its lines");
        let rec = rows.iter().find(|r| r.key.function.as_ref() == "rec").unwrap();
        assert_eq!(rec.window_total, 25.0, "recursion counts once per stack");
        let lines = model.rows(Granularity::Lines, None, SortBy::WindowTotal, 10);
        assert_eq!(lines.iter().filter(|r| r.key.function.as_ref() == "main").count(), 2);
        // The window slides; the totals stay.
        model.push(Tick::default());
        model.push(Tick::default());
        assert_eq!(model.samples(None), (0, 4));
        let rows = model.rows(Granularity::Functions, Some(7), SortBy::AllOwn, 1);
        assert_eq!((rows[0].window_own, rows[0].all_own), (0.0, 75.0));
        assert!(model.rows(Granularity::Functions, Some(8), SortBy::AllOwn, 10).is_empty());
    }
}
