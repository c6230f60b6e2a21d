//! The Gecko profile format (JSON), as the Firefox Profiler (<https://profiler.firefox.com>)
//! opens it: "Load a profile from file".
//!
//! Written at [`GECKO_PROFILE_VERSION`] 31, the version whose layout this module follows
//! (firefox-devtools/profiler `src/types/gecko-profile.ts` and the upgraders in
//! `src/profile-logic/gecko-profile-versioning.ts`); the Firefox Profiler upgrades older
//! versions itself, so a newer front end still opens these files.
//!
//! Layout:
//! - `meta`: the version, `startTime` (wall-clock ms of the recording's start), `interval`
//!   (the sampling period in ms), the [`CATEGORIES`] list, `presymbolicated: true` (frames
//!   are names, not addresses) and the fields the format requires (`stackwalk`, `debug`, ...).
//! - `threads`: one per sampled thread (one track each), sorted by (pid, tid), named as
//!   [`super::thread_title`] says (`<name> (tid T)` when the thread's name is known), each with its
//!   own `stringTable`, `frameTable` (location `function (file:line)`, line, category),
//!   `stackTable` (prefix, frame: stacks are built ROOT FIRST, a stack's prefix always has a
//!   smaller index) and `samples` (stack, time, eventDelay 0).
//! - `libs`, `pausedRanges`, `processes`: empty (Python frames need no symbolication).
//!
//! Sample times come from the profile's [`Timeline`]: the kernel's CLOCK_MONOTONIC time of
//! each sample, in ms since the first sample of the recording. The timeline keeps runs of
//! equal consecutive samples (first time, last time, count); a run's samples are placed evenly
//! between its first and last time, so the first and last are exact and the others are off
//! by less than the run's longest gap (at most [`crate::sample::timeline::MAX_GAP_PERIODS`] periods),
//! never on another stack. Every sample the timeline kept is written, once.
//!
//! Without a timeline (it is kept only for formats that show time) the file has no threads.

use std::collections::HashMap;
use std::io::{BufWriter, Write};

use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};
use serde_json::{Value, json};

use crate::sample::aggregate::{FrameId, FrameName, Profile};
use crate::sample::timeline::{Run, Timeline};

use super::{Format, NO_PYTHON_FRAMES, OutputError, process_name, thread_title};

/// The Gecko profile format version written (`meta.version`).
pub const GECKO_PROFILE_VERSION: u32 = 31;

/// What kind of code a frame is; its index in [`CATEGORIES`] is the frame's `category`.
/// Native and kernel frames do not exist in pyperch yet: their categories are listed so that
/// adding them changes no index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// Placeholders such as [`NO_PYTHON_FRAMES`].
    Other = 0,
    /// A Python function.
    Python = 1,
    /// Native (C, C++, Rust) code in the process.
    Native = 2,
    /// The kernel.
    Kernel = 3,
}

/// `(name, color)` of each [`Category`], in index order; colors are the Firefox Profiler's.
pub const CATEGORIES: [(&str, &str); 4] =
    [("Other", "grey"), ("Python", "blue"), ("Native", "orange"), ("Kernel", "red")];

/// The category of an interned frame: every frame pyperch interns today is Python code.
fn category_of(_frame: &FrameName) -> Category {
    Category::Python
}

/// `function (file:line)`, or `function (file)` when the line is unknown (0): the form the
/// Firefox Profiler (and speedscope's importer) split into function and file.
pub fn location(frame: &FrameName) -> String {
    if frame.line == 0 {
        format!("{} ({})", frame.function, frame.file)
    } else {
        format!("{} ({}:{})", frame.function, frame.file, frame.line)
    }
}

/// Writes `profile` as a Gecko profile (no threads when it kept no timeline).
pub fn write(profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
    let wrap = OutputError::write(Format::Gecko);
    let mut out = BufWriter::new(out);
    let empty = Timeline::default();
    let timeline = profile.timeline().unwrap_or(&empty);
    let result = (|| -> std::io::Result<()> {
        out.write_all(b"{\"meta\":")?;
        serde_json::to_writer(&mut out, &meta(profile, timeline)).map_err(std::io::Error::other)?;
        out.write_all(b",\"libs\":[],\"pausedRanges\":[],\"processes\":[],\"threads\":[\n")?;
        let base = timeline.first_ns().unwrap_or(0);
        // One thread in memory at a time; its samples are streamed.
        for (i, ((pid, tid), runs)) in timeline.threads().into_iter().enumerate() {
            if i > 0 {
                out.write_all(b",\n")?;
            }
            let thread = ThreadTables::build(profile, timeline, runs);
            let samples = Samples { runs, stack_of_run: &thread.stack_of_run, base };
            let value = GeckoThread {
                name: thread_title(profile, pid, tid),
                process_name: process_name(profile, pid),
                process_type: "default",
                pid,
                tid,
                register_time: 0,
                unregister_time: None,
                markers: json!({
                    "schema": {"name": 0, "startTime": 1, "endTime": 2, "phase": 3, "category": 4, "data": 5},
                    "data": [],
                }),
                samples: Table { schema: json!({"stack": 0, "time": 1, "eventDelay": 2}), data: samples },
                frame_table: Table {
                    schema: json!({"location": 0, "relevantForJS": 1, "innerWindowID": 2, "implementation": 3,
                        "line": 4, "column": 5, "category": 6, "subcategory": 7}),
                    data: &thread.frames,
                },
                stack_table: Table { schema: json!({"prefix": 0, "frame": 1}), data: &thread.stacks },
                string_table: &thread.strings,
            };
            serde_json::to_writer(&mut out, &value).map_err(std::io::Error::other)?;
        }
        out.write_all(b"\n]}\n")?;
        out.flush()
    })();
    result.map_err(wrap)
}

/// One entry of `threads` (field order as in the format's documentation).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GeckoThread<'a> {
    name: String,
    process_name: String,
    process_type: &'static str,
    pid: u32,
    tid: u32,
    register_time: u32,
    unregister_time: Option<u32>,
    markers: Value,
    samples: Table<Samples<'a>>,
    frame_table: Table<&'a [FrameRow]>,
    stack_table: Table<&'a [(Option<usize>, usize)]>,
    string_table: &'a [String],
}

/// A `{schema, data}` table.
#[derive(Serialize)]
struct Table<T> {
    schema: Value,
    data: T,
}

fn meta(profile: &Profile, timeline: &Timeline) -> Value {
    let start_ms = profile
        .timing()
        .and_then(|t| t.start.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let categories: Vec<Value> = CATEGORIES
        .iter()
        .map(|(name, color)| json!({"name": name, "color": color, "subcategories": ["Other"]}))
        .collect();
    json!({
        "version": GECKO_PROFILE_VERSION,
        "startTime": start_ms,
        "shutdownTime": null,
        "interval": timeline.period_ns() as f64 / 1e6,
        "stackwalk": 0,
        "debug": 0,
        "gcpoison": 0,
        "asyncstack": 0,
        "processType": 0,
        "product": "pyperch",
        // How it was recorded: one line (shown as the profile's arguments) and as fields.
        "arguments": super::recording_line(profile),
        "pyperch": super::recording_facts(profile).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        "presymbolicated": true,
        "categories": categories,
        "markerSchema": [],
    })
}

/// One frameTable row: location, relevantForJS, innerWindowID, implementation, line, column,
/// category, subcategory.
type FrameRow = (usize, bool, Option<u32>, Option<u32>, Option<u32>, Option<u32>, u32, u32);

/// The string, frame and stack tables of one thread, and each run's stack index.
struct ThreadTables {
    strings: Vec<String>,
    frames: Vec<FrameRow>,
    /// `(prefix, frame)`; a prefix is always a smaller index.
    stacks: Vec<(Option<usize>, usize)>,
    stack_of_run: Vec<usize>,
}

impl ThreadTables {
    fn build(profile: &Profile, timeline: &Timeline, runs: &[Run]) -> Self {
        let mut t = ThreadTables { strings: Vec::new(), frames: Vec::new(), stacks: Vec::new(), stack_of_run: Vec::new() };
        let mut string_ids: HashMap<String, usize> = HashMap::new();
        let mut frame_ids: HashMap<Option<FrameId>, usize> = HashMap::new();
        let mut stack_ids: HashMap<(Option<usize>, usize), usize> = HashMap::new();
        let mut by_timeline_stack: HashMap<u32, usize> = HashMap::new();
        for run in runs {
            if let Some(&stack) = by_timeline_stack.get(&run.stack) {
                t.stack_of_run.push(stack);
                continue;
            }
            let ids = timeline.stack(run.stack);
            // An empty stack is the placeholder frame alone (as in every other format).
            let frames: Vec<Option<FrameId>> =
                if ids.is_empty() { vec![None] } else { ids.iter().map(|&id| Some(id)).collect() };
            let mut prefix = None;
            for frame in frames {
                let frame_index = *frame_ids.entry(frame).or_insert_with(|| {
                    let (text, line, category) = match frame {
                        Some(id) => {
                            let name = profile.frame(id);
                            (location(name), (name.line != 0).then_some(name.line), category_of(name))
                        }
                        None => (NO_PYTHON_FRAMES.to_string(), None, Category::Other),
                    };
                    let next = string_ids.len();
                    let string = *string_ids.entry(text.clone()).or_insert(next);
                    if string == t.strings.len() {
                        t.strings.push(text);
                    }
                    t.frames.push((string, false, None, None, line, None, category as u32, 0));
                    t.frames.len() - 1
                });
                let stack = *stack_ids.entry((prefix, frame_index)).or_insert_with(|| {
                    t.stacks.push((prefix, frame_index));
                    t.stacks.len() - 1
                });
                prefix = Some(stack);
            }
            let stack = prefix.unwrap_or(0);
            by_timeline_stack.insert(run.stack, stack);
            t.stack_of_run.push(stack);
        }
        t
    }
}

/// A thread's `samples.data`: `[stack, time_ms, 0]` for every sample of every run.
struct Samples<'a> {
    runs: &'a [Run],
    stack_of_run: &'a [usize],
    base: u64,
}

impl Serialize for Samples<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for (run, &stack) in self.runs.iter().zip(self.stack_of_run) {
            for time_ns in sample_times(run) {
                let ms = time_ns.saturating_sub(self.base) as f64 / 1e6;
                seq.serialize_element(&(stack, ms, 0))?;
            }
        }
        seq.end()
    }
}

/// The times of a run's samples: its first and last exactly, the others evenly between.
fn sample_times(run: &Run) -> impl Iterator<Item = u64> + '_ {
    let n = u64::from(run.samples.max(1));
    let span = run.last_ns.saturating_sub(run.first_ns);
    (0..n).map(move |i| {
        if n == 1 {
            run.first_ns
        } else {
            // u128: span * i cannot overflow.
            run.first_ns + (u128::from(span) * u128::from(i) / u128::from(n - 1)) as u64
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn frame(p: &mut Profile, function: &str, line: u32) -> FrameId {
        p.intern(FrameName { function: Arc::from(function), file: Arc::from("/srv/app.py"), line, native: None })
    }

    /// The profile written and parsed back.
    fn written(p: &Profile) -> Value {
        let mut out = Vec::new();
        assert!(write(p, &mut out).is_ok());
        serde_json::from_slice(&out).expect("valid JSON")
    }

    /// A sample's frames, root first, resolved through the thread's tables.
    fn resolve(thread: &Value, stack: &Value) -> Vec<String> {
        let mut names = Vec::new();
        let mut at = stack.as_u64();
        while let Some(i) = at {
            let row = &thread["stackTable"]["data"][i as usize];
            let frame = &thread["frameTable"]["data"][row[1].as_u64().unwrap_or(u64::MAX) as usize];
            let string = frame[0].as_u64().unwrap_or(u64::MAX) as usize;
            names.push(thread["stringTable"][string].as_str().unwrap_or("?").to_string());
            let prefix = row[0].as_u64();
            assert!(prefix.is_none_or(|p| p < i), "a prefix must come first");
            at = prefix;
        }
        names.reverse();
        names
    }

    #[test]
    fn one_thread_per_track_with_sample_times() {
        let mut p = Profile::new();
        p.keep_timeline(10_000_000); // 100 Hz
        let (main, work, other) = (frame(&mut p, "main", 10), frame(&mut p, "work", 0), frame(&mut p, "other", 3));
        let base = 5_000_000_000u64;
        let samples: [(u32, u64, Vec<FrameId>); 6] = [
            (7, 0, vec![main, work]),
            (7, 10, vec![main, work]),
            (7, 20, vec![main, work]),
            (7, 30, vec![main, other]),
            (8, 15, vec![]),
            (8, 200, vec![main]),
        ];
        for (tid, ms, stack) in &samples {
            p.add(7, Some(*tid), stack, 1);
            p.add_time(7, *tid, base + ms * 1_000_000, stack);
        }
        let json = written(&p);
        assert_eq!(json["meta"]["version"], GECKO_PROFILE_VERSION);
        assert_eq!(json["meta"]["interval"], 10.0);
        let names: Vec<&str> = json["meta"]["categories"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["Other", "Python", "Native", "Kernel"]);
        let threads = json["threads"].as_array().cloned().unwrap_or_default();
        assert_eq!(threads.len(), 2);
        assert_eq!((threads[0]["pid"].as_u64(), threads[0]["tid"].as_u64()), (Some(7), Some(7)));
        assert_eq!(threads[0]["name"], "main (tid 7)");
        assert_eq!(threads[1]["name"], "thread 8");

        let t = &threads[0];
        let data = t["samples"]["data"].as_array().cloned().unwrap_or_default();
        let got: Vec<(Vec<String>, f64)> = data.iter().map(|s| (resolve(t, &s[0]), s[1].as_f64().unwrap_or(-1.0))).collect();
        let mw = vec!["main (/srv/app.py:10)".to_string(), "work (/srv/app.py)".to_string()];
        let mo = vec!["main (/srv/app.py:10)".to_string(), "other (/srv/app.py:3)".to_string()];
        assert_eq!(got, vec![(mw.clone(), 0.0), (mw.clone(), 10.0), (mw, 20.0), (mo, 30.0)]);
        // Python frames are in the Python category, with their line (null when unknown).
        let frames = t["frameTable"]["data"].as_array().cloned().unwrap_or_default();
        assert!(frames.iter().all(|f| f[6] == Category::Python as u32 && f.as_array().map(Vec::len) == Some(8)));
        assert_eq!(frames[0][4], 10);
        assert_eq!(frames[1][4], Value::Null);

        let t = &threads[1];
        let data = t["samples"]["data"].as_array().cloned().unwrap_or_default();
        assert_eq!(resolve(t, &data[0][0]), vec![NO_PYTHON_FRAMES.to_string()]);
        assert_eq!(data[0][1], 15.0);
        assert_eq!(data[1][1], 200.0);
        let frames = t["frameTable"]["data"].as_array().cloned().unwrap_or_default();
        assert_eq!(frames[0][6], Category::Other as u32);
    }

    #[test]
    fn tracks_are_named_after_their_threads() {
        let mut p = Profile::new();
        p.keep_timeline(10_000_000);
        let main = frame(&mut p, "main", 1);
        for tid in [7, 8, 9] {
            p.add(7, Some(tid), &[main], 1);
            p.add_time(7, tid, 1_000_000, &[main]);
        }
        p.set_thread_name(7, "python3");
        p.set_thread_name(8, "worker\n\"1\"");
        let json = written(&p);
        let names: Vec<&str> =
            json["threads"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(names, ["python3 (tid 7)", "worker \"1\" (tid 8)", "thread 9"]);
    }

    #[test]
    fn run_samples_are_spread_between_first_and_last() {
        let run = Run { stack: 0, first_ns: 100, last_ns: 400, samples: 4 };
        assert_eq!(sample_times(&run).collect::<Vec<_>>(), vec![100, 200, 300, 400]);
        let one = Run { stack: 0, first_ns: 100, last_ns: 100, samples: 1 };
        assert_eq!(sample_times(&one).collect::<Vec<_>>(), vec![100]);
        let huge = Run { stack: 0, first_ns: 0, last_ns: u64::MAX, samples: 3 };
        assert_eq!(sample_times(&huge).last(), Some(u64::MAX));
    }

    #[test]
    fn hostile_names_stay_json_strings() {
        let mut p = Profile::new();
        p.keep_timeline(1_000_000);
        let odd = frame(&mut p, "odd\"name\n</svg>", 1);
        p.add(1, Some(1), &[odd], 1);
        p.add_time(1, 1, 1, &[odd]);
        let json = written(&p);
        assert_eq!(json["threads"][0]["stringTable"][0], "odd\"name\n</svg> (/srv/app.py:1)");
    }

    #[test]
    fn no_timeline_no_threads() {
        let json = written(&Profile::new());
        assert_eq!(json["threads"].as_array().map(Vec::len), Some(0));
        assert_eq!(json["meta"]["version"], GECKO_PROFILE_VERSION);
    }
}
