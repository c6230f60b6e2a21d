//! The Chrome trace event format (JSON object form), as opened by Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing`.
//!
//! One track per sampled thread (`pid` = process, `tid` = thread, named by `M` metadata
//! events: the process's name, and the thread's as [`super::thread_title`] says). The profile's [`Timeline`] gives each thread's runs of equal consecutive samples;
//! they become nested `B`/`E` (begin/end) events, one pair per frame, ROOT FIRST: at a
//! change of stack, the frames that are no longer on it end and the new ones begin, so a
//! frame present in consecutive samples is one event. A run lasts from its first sample to
//! one sampling period after its last (or the next run's first sample, if sooner); between
//! runs further apart the track is empty (the thread was not on a CPU). Times (`ts`) are
//! microseconds since the first sample of the recording. Events of one thread are in time
//! order and every `B` has its `E`.

use std::io::{BufWriter, Write};

use serde_json::{Value, json};

use crate::sample::aggregate::{FrameId, Profile};
use crate::sample::timeline::Timeline;

use super::{Format, OutputError, process_name, thread_title};

/// Writes the trace of `profile`'s timeline (an empty trace when it kept none).
pub fn write(profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
    let wrap = OutputError::write(Format::Chrometrace);
    let mut out = BufWriter::new(out);
    let empty = Timeline::default();
    let timeline = profile.timeline().unwrap_or(&empty);
    let result = (|| -> std::io::Result<()> {
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")?;
        let mut first = true;
        // Streamed: the events are never all in memory at once.
        events(profile, timeline, &mut |event| {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut out, &event).map_err(std::io::Error::other)
        })?;
        out.write_all(b"\n],\"otherData\":")?;
        // How it was recorded (the trace format's free-form metadata, shown by Perfetto).
        let facts: std::collections::BTreeMap<_, _> = super::recording_facts(profile).into_iter().collect();
        serde_json::to_writer(&mut out, &facts).map_err(std::io::Error::other)?;
        out.write_all(b"}\n")?;
        out.flush()
    })();
    result.map_err(wrap)
}

/// Emits every event of the trace, metadata first, then each thread's begin/end events.
fn events(
    profile: &Profile,
    timeline: &Timeline,
    emit: &mut dyn FnMut(Value) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let base = timeline.first_ns().unwrap_or(0);
    let us = |ns: u64| (ns.saturating_sub(base)) as f64 / 1000.0;
    let period = timeline.period_ns();
    let threads = timeline.threads();
    let mut named = std::collections::BTreeSet::new();
    for &((pid, tid), _) in &threads {
        if named.insert(pid) {
            emit(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": pid,
                "args": {"name": process_name(profile, pid)}}))?;
        }
        emit(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
            "args": {"name": thread_title(profile, pid, tid)}}))?;
    }
    for ((pid, tid), runs) in threads {
        let mut open: Vec<FrameId> = Vec::new();
        let mut open_end = 0u64;
        for (i, run) in runs.iter().enumerate() {
            let frames = timeline.stack(run.stack);
            let common = if open.is_empty() || run.first_ns > open_end {
                0
            } else {
                open.iter().zip(frames).take_while(|(a, b)| a == b).count()
            };
            // Frames that ended: at the earlier of this run's start and the last run's end.
            let end_at = open_end.min(run.first_ns);
            while open.len() > common {
                if let Some(id) = open.pop() {
                    emit(frame_event(profile, "E", id, pid, tid, us(end_at)))?;
                }
            }
            for &id in &frames[common..] {
                emit(frame_event(profile, "B", id, pid, tid, us(run.first_ns)))?;
                open.push(id);
            }
            let next_start = runs.get(i + 1).map_or(u64::MAX, |r| r.first_ns);
            open_end = run.last_ns.saturating_add(period).min(next_start);
        }
        while let Some(id) = open.pop() {
            emit(frame_event(profile, "E", id, pid, tid, us(open_end)))?;
        }
    }
    Ok(())
}

fn frame_event(profile: &Profile, phase: &str, id: FrameId, pid: u32, tid: u32, ts: f64) -> Value {
    let frame = profile.frame(id);
    let name = if frame.line == 0 {
        format!("{} ({})", frame.function, frame.file)
    } else {
        format!("{} ({}:{})", frame.function, frame.file, frame.line)
    };
    if phase == "B" {
        json!({"ph": "B", "name": name, "cat": "python", "pid": pid, "tid": tid, "ts": ts,
            "args": {"file": &*frame.file, "line": frame.line}})
    } else {
        json!({"ph": "E", "name": name, "cat": "python", "pid": pid, "tid": tid, "ts": ts})
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sample::aggregate::FrameName;

    #[test]
    fn nested_begin_end_per_thread() {
        let mut p = Profile::new();
        p.keep_timeline(10_000);
        let f = |p: &mut Profile, name: &str| {
            p.intern(FrameName { function: Arc::from(name), file: Arc::from("/a.py"), line: 1, native: None })
        };
        let (main, a, b) = (f(&mut p, "main"), f(&mut p, "a"), f(&mut p, "b"));
        for (t, stack) in [(0u64, vec![main, a]), (10_000, vec![main, a]), (20_000, vec![main, b]), (100_000, vec![main, b])] {
            p.add(1, None, &stack, 1);
            p.add_time(1, 7, 1_000_000 + t, &stack);
        }
        let mut out = Vec::new();
        assert!(write(&p, &mut out).is_ok());
        let json: Value = serde_json::from_slice(&out).expect("valid JSON");
        let events = json["traceEvents"].as_array().cloned().unwrap_or_default();
        let phases: Vec<(String, String, f64)> = events
            .iter()
            .filter(|e| e["ph"] != "M")
            .map(|e| (e["ph"].as_str().unwrap_or("").into(), e["name"].as_str().unwrap_or("").into(), e["ts"].as_f64().unwrap_or(-1.0)))
            .collect();
        let expect = |ph: &str, name: &str, ts: f64| (ph.to_string(), format!("{name} (/a.py:1)"), ts);
        assert_eq!(
            phases,
            vec![
                expect("B", "main", 0.0),
                expect("B", "a", 0.0),
                expect("E", "a", 20.0),
                expect("B", "b", 20.0),
                // A gap of several periods: everything ends one period after the last sample.
                expect("E", "b", 30.0),
                expect("E", "main", 30.0),
                expect("B", "main", 100.0),
                expect("B", "b", 100.0),
                expect("E", "b", 110.0),
                expect("E", "main", 110.0),
            ]
        );
        assert_eq!(events.iter().filter(|e| e["ph"] == "M").count(), 2);
    }

    #[test]
    fn thread_name_metadata_carries_the_name() {
        let mut p = Profile::new();
        p.keep_timeline(10_000);
        let f = p.intern(FrameName { function: Arc::from("f"), file: Arc::from("/a.py"), line: 1, native: None });
        for tid in [1, 2, 3] {
            p.add(1, Some(tid), &[f], 1);
            p.add_time(1, tid, 1_000_000, &[f]);
        }
        p.set_thread_name(2, "io;pool");
        let mut out = Vec::new();
        assert!(write(&p, &mut out).is_ok());
        let json: Value = serde_json::from_slice(&out).expect("valid JSON");
        let names: Vec<(u64, String)> = json["traceEvents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .map(|e| (e["tid"].as_u64().unwrap_or(0), e["args"]["name"].as_str().unwrap_or("").to_string()))
            .collect();
        assert_eq!(names, [(1, "main (tid 1)".to_string()), (2, "io,pool (tid 2)".to_string()), (3, "thread 3".to_string())]);
    }

    #[test]
    fn no_timeline_is_an_empty_trace() {
        let mut out = Vec::new();
        assert!(write(&Profile::new(), &mut out).is_ok());
        let json: Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(json["traceEvents"].as_array().map(Vec::len), Some(0));
    }
}
