//! speedscope's JSON file format (<https://www.speedscope.app/file-format-schema.json>).
//!
//! Layout of the file:
//! - `shared.frames`: every Python frame used by some stack, as `{name, file, line}` (`line`
//!   omitted when unknown), plus [`super::NO_PYTHON_FRAMES`] if a stack had no Python frames.
//!   Frames are numbered in order of first use, walking the stacks in sorted order;
//! - `profiles`: one `"sampled"` profile per process, named `<comm> (pid N)`, or per process
//!   and thread, named `<comm> (pid N) thread T`, or `<comm> (pid N) thread T (<name>)` when
//!   the thread's name is known (see [`super::thread_label`]), when recording per thread; ordered by pid,
//!   then tid (a process's thread-less stacks first);
//! - in each profile, `samples[i]` is a stack of indices into `shared.frames`, ROOT FIRST, and
//!   `weights[i]` its sample count; `unit` is `"none"`, `startValue` 0 and `endValue` the sum
//!   of the weights.
//!
//! Invariants checked by the tests: every index is `< shared.frames.len()`, `samples` and
//! `weights` have the same length, and the weights of all profiles sum to the profile's
//! total sample count.

use std::collections::HashMap;
use std::io::{BufWriter, Write};

use serde::Serialize;

use crate::sample::aggregate::{FrameId, Profile, StackKey};

use super::{Format, NO_PYTHON_FRAMES, OutputError, process_name, thread_label};

/// The `$schema` every speedscope file declares.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// Writes `profile` to `out` as a speedscope file named `title`.
pub fn write(profile: &Profile, title: &str, out: &mut dyn Write) -> Result<(), OutputError> {
    let file = build(profile, title);
    let mut out = BufWriter::new(out);
    serde_json::to_writer(&mut out, &file).map_err(|error| {
        if error.is_io() {
            OutputError::Write {
                format: Format::Speedscope,
                source: error.into(),
            }
        } else {
            OutputError::Json(error)
        }
    })?;
    out.write_all(b"\n")
        .and_then(|()| out.flush())
        .map_err(OutputError::write(Format::Speedscope))
}

/// The whole file.
#[derive(Serialize, Debug)]
struct File {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared,
    profiles: Vec<SampledProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex", skip_serializing_if = "Option::is_none")]
    active_profile_index: Option<usize>,
    exporter: String,
}

#[derive(Serialize, Debug)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Serialize, Debug)]
struct Frame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize, Debug)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// Numbers frames in order of first use and records them in `shared.frames`.
#[derive(Default)]
struct FrameTable {
    frames: Vec<Frame>,
    index_of: HashMap<FrameId, usize>,
    no_python: Option<usize>,
}

impl FrameTable {
    fn index(&mut self, profile: &Profile, id: FrameId) -> usize {
        if let Some(&index) = self.index_of.get(&id) {
            return index;
        }
        let frame = profile.frame(id);
        let index = self.frames.len();
        self.frames.push(Frame {
            name: frame.function.to_string(),
            file: (!frame.file.is_empty()).then(|| frame.file.to_string()),
            line: (frame.line != 0).then_some(frame.line),
        });
        self.index_of.insert(id, index);
        index
    }

    fn no_python(&mut self) -> usize {
        if let Some(index) = self.no_python {
            return index;
        }
        let index = self.frames.len();
        self.frames.push(Frame {
            name: NO_PYTHON_FRAMES.to_owned(),
            file: None,
            line: None,
        });
        self.no_python = Some(index);
        index
    }
}

fn build(profile: &Profile, title: &str) -> File {
    let mut stacks: Vec<(&StackKey, u64)> = profile.stacks().collect();
    stacks.sort_unstable();

    let mut table = FrameTable::default();
    let mut profiles: Vec<SampledProfile> = Vec::new();
    let mut current: Option<(u32, Option<u32>)> = None;
    for (key, count) in stacks {
        let owner = (key.pid, key.tid);
        if current != Some(owner) {
            current = Some(owner);
            let mut name = process_name(profile, key.pid);
            if let Some(tid) = key.tid {
                name.push(' ');
                name.push_str(&thread_label(profile, tid));
            }
            profiles.push(SampledProfile {
                kind: "sampled",
                name,
                unit: if profile.time_mode().in_nanoseconds() { "nanoseconds" } else { "none" },
                start_value: 0,
                end_value: 0,
                samples: Vec::new(),
                weights: Vec::new(),
            });
        }
        let stack: Vec<usize> = if key.frames.is_empty() {
            vec![table.no_python()]
        } else {
            key.frames
                .iter()
                .map(|&id| table.index(profile, id))
                .collect()
        };
        // `current` was set just above, so `profiles` is never empty here.
        if let Some(sampled) = profiles.last_mut() {
            sampled.samples.push(stack);
            sampled.weights.push(count);
            sampled.end_value = sampled.end_value.saturating_add(count);
        }
    }

    File {
        schema: SCHEMA,
        shared: Shared {
            frames: table.frames,
        },
        active_profile_index: (!profiles.is_empty()).then_some(0),
        profiles,
        // speedscope shows the name in its title bar: with how it was recorded.
        name: format!("{title} ({})", super::recording_line(profile)),
        exporter: format!("pyperch {}", env!("CARGO_PKG_VERSION")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::output::tests::sample_profile;

    fn written(profile: &Profile, title: &str) -> Value {
        let mut out = Vec::new();
        let result = write(profile, title, &mut out);
        assert!(result.is_ok(), "{result:?}");
        serde_json::from_slice(&out).unwrap_or(Value::Null)
    }

    #[test]
    fn parseable_and_consistent() {
        let profile = sample_profile();
        let json = written(&profile, "my recording");
        assert_eq!(json["$schema"], SCHEMA);
        assert_eq!(json["name"], format!("my recording (pyperch {}, mode cpu)", env!("CARGO_PKG_VERSION")));
        assert_eq!(
            json["exporter"],
            format!("pyperch {}", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(json["activeProfileIndex"], 0);

        let frames = json["shared"]["frames"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // 4 Python frames plus the no-Python marker.
        assert_eq!(frames.len(), 5);
        assert!(frames.iter().all(|f| f["name"].is_string()));
        let odd = frames.iter().find(|f| f["name"] == "odd;name\nx");
        assert_eq!(
            odd.map(|f| &f["file"]),
            Some(&Value::from("/srv/we;ird.py"))
        );
        assert_eq!(odd.map(|f| &f["line"]), Some(&Value::from(5)));
        let work = frames.iter().find(|f| f["name"] == "work");
        assert_eq!(work.map(|f| f.get("line").is_none()), Some(true));

        let profiles = json["profiles"].as_array().cloned().unwrap_or_default();
        let names: Vec<&str> = profiles.iter().filter_map(|p| p["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "python3 (pid 100)",
                "gunicorn (pid 200) thread 201",
                "gunicorn (pid 200) thread 202",
                "[unknown] (pid 300)",
            ]
        );
        let mut total = 0;
        for p in &profiles {
            assert_eq!(p["type"], "sampled");
            assert_eq!(p["unit"], "none");
            assert_eq!(p["startValue"], 0);
            let samples = p["samples"].as_array().cloned().unwrap_or_default();
            let weights = p["weights"].as_array().cloned().unwrap_or_default();
            assert_eq!(samples.len(), weights.len());
            assert!(!samples.is_empty());
            for stack in &samples {
                let stack = stack.as_array().cloned().unwrap_or_default();
                assert!(!stack.is_empty());
                for index in stack {
                    let index = index.as_u64().unwrap_or(u64::MAX);
                    assert!(index < frames.len() as u64, "index {index} out of range");
                }
            }
            let sum: u64 = weights.iter().filter_map(Value::as_u64).sum();
            assert_eq!(p["endValue"], sum);
            total += sum;
        }
        assert_eq!(total, profile.total_samples());
        assert_eq!(profiles[0]["endValue"], profile.samples_of(100));

        // Root first: pid 100's first stack is <module> → main.
        let first: Vec<&str> = profiles[0]["samples"][0]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|i| i.as_u64())
                    .filter_map(|i| frames[i as usize]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(first, ["<module>", "main"]);
    }

    #[test]
    fn profiles_carry_thread_names() {
        let mut profile = sample_profile();
        profile.set_thread_name(201, "web-1");
        profile.set_thread_name(202, "evil\"name\n</x>");
        let json = written(&profile, "t");
        let names: Vec<String> = json["profiles"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            names,
            [
                "python3 (pid 100)",
                "gunicorn (pid 200) thread 201 (web-1)",
                "gunicorn (pid 200) thread 202 (evil\"name </x>)",
                "[unknown] (pid 300)",
            ]
        );
    }

    #[test]
    fn deterministic() {
        let a = written(&sample_profile(), "t");
        let b = written(&sample_profile(), "t");
        assert_eq!(a, b);
    }

    #[test]
    fn empty_profile_is_valid_json() {
        let json = written(&Profile::new(), "empty");
        assert_eq!(json["profiles"], Value::Array(Vec::new()));
        assert_eq!(json["shared"]["frames"], Value::Array(Vec::new()));
        assert!(json.get("activeProfileIndex").is_none());
    }
}
