//! pprof's `profile.proto` (github.com/google/pprof, `proto/profile.proto`), gzip-compressed,
//! as read by `go tool pprof`, Pyroscope, Grafana and most continuous-profiling back ends.
//!
//! The messages are those of [`proto`] (the schema declared for the `prost` crate, which does
//! all of the protobuf encoding); this module only fills them in.
//!
//! What the file holds:
//! - `sample_type`: `samples`/`count` and, when the sampling period is known,
//!   `cpu`/`nanoseconds` (= samples × period), the CPU-profile pair Pyroscope, Grafana and
//!   `go tool pprof` expect (Pyroscope files a profile whose sample type names `cpu` as
//!   `process_cpu`); `period_type`: `cpu`/`nanoseconds`, with `period` (10⁹ / rate),
//!   `time_nanos` and `duration_nanos` from [`Timing`] (left out when zero, i.e. unknown;
//!   an unknown period leaves out the `cpu` sample type rather than writing zeros);
//! - one `Function` per distinct (function name, file) pair, `filename` the full path;
//!   `system_name` and `start_line` are left out (with `system_name == name`, `go tool pprof`
//!   would "demangle" the name and strip `<...>` as if it were C++ template arguments,
//!   turning `<module>` into nothing);
//! - one `Location` per distinct (function, line) pair, with a single `Line`; Python frames
//!   have no mapping (`mapping_id` 0); native and kernel frames (`--native`, `--kernel`) add
//!   their `address` and `mapping_id`, one `Mapping` per file segment (link addresses, file
//!   name, build id) and one `[kernel]`; an unknown line (0) is left out;
//! - one `Sample` per distinct [`StackKey`], with `location_id` LEAF FIRST (the pprof
//!   convention; [`StackKey::frames`] is root first), `value = [count, count × period]`
//!   (saturating at `i64::MAX`), and one string `Label` per pair returned by the caller's
//!   `labels` closure (pairs with an empty key or value are skipped: an empty string cannot
//!   be told apart from an absent one in proto3). A stack with no Python frames gets a single
//!   [`super::NO_PYTHON_FRAMES`] location, so every sample has at least one location.
//!
//! - in `--mode wall` and `--mode off-cpu` the values are already nanoseconds: the sample
//!   types are `samples`/`count` (on-CPU samples and off-CPU intervals) and `wall` or
//!   `off-cpu`/`nanoseconds`, the period type the same time type.
//!
//! Invariants: `string_table[0]` is `""`; every id is non-zero and ids are dense from 1;
//! every `location_id` names a written `Location` and every `function_id` a written
//! `Function`; every string index is `< string_table.len()`; every sample has one value per
//! sample type. The output is deterministic: samples are written in [`StackKey`] order, ids
//! and strings are numbered in order of first use, and the gzip header carries no timestamp.

pub mod proto;

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::{Duration, SystemTime};

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message as _;

use std::sync::Arc;

use crate::sample::aggregate::{FrameId, NativeMapping, NativeOrigin, Profile, StackKey};

use super::NO_PYTHON_FRAMES;

/// The first sample type: how many samples landed on a stack.
pub const SAMPLE_TYPE: (&str, &str) = ("samples", "count");
/// The second sample type, written when the period is known: CPU time, samples × period.
pub const CPU_SAMPLE_TYPE: (&str, &str) = ("cpu", "nanoseconds");
/// What one sample stands for: `period` nanoseconds of CPU time.
pub const PERIOD_TYPE: (&str, &str) = ("cpu", "nanoseconds");

/// Why a pprof profile could not be written.
#[derive(thiserror::Error, Debug)]
pub enum PprofError {
    /// The destination (or the gzip stream in front of it) refused the bytes.
    #[error("could not write the pprof profile: {source}")]
    Write {
        /// What the destination reported.
        source: io::Error,
    },
}

impl From<PprofError> for io::Error {
    fn from(error: PprofError) -> io::Error {
        match error {
            PprofError::Write { source } => source,
        }
    }
}

/// When and how densely the profile was sampled. All zero (the [`Default`]) means unknown,
/// and the corresponding fields are left out of the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// When recording started, in nanoseconds since the Unix epoch (`time_nanos`).
    pub start_unix_nanos: i64,
    /// How long recording lasted, in nanoseconds (`duration_nanos`).
    pub duration_nanos: i64,
    /// Nanoseconds of CPU time between two samples, i.e. 10⁹ / rate (`period`).
    pub period_nanos: i64,
}

impl Timing {
    /// The timing of a recording that started at `start`, lasted `duration` and sampled each
    /// CPU `rate_hz` times a second. Values that do not fit an `i64` saturate; a start before
    /// the epoch and a zero rate give 0 (unknown).
    pub fn new(start: SystemTime, duration: Duration, rate_hz: u64) -> Timing {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        Timing {
            start_unix_nanos: start
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(nanos)
                .unwrap_or(0),
            duration_nanos: nanos(duration),
            period_nanos: 1_000_000_000_i64
                .checked_div(i64::try_from(rate_hz).unwrap_or(i64::MAX))
                .unwrap_or(0),
        }
    }
}

/// Writes `profile` to `out` as a gzip-compressed pprof profile with unknown timing (see
/// [`write_with_timing`]). `labels` is called once per stack and returns that sample's
/// string labels as `(key, value)` pairs.
pub fn write(
    profile: &Profile,
    labels: &dyn Fn(&StackKey) -> Vec<(String, String)>,
    out: &mut dyn Write,
) -> Result<(), PprofError> {
    write_with_timing(profile, labels, &Timing::default(), out)
}

/// Writes `profile` to `out` as a gzip-compressed pprof profile, with `timing` in the
/// `time_nanos`, `duration_nanos` and `period` fields (and the `cpu`/`nanoseconds` values).
/// `out` is flushed before returning `Ok`.
pub fn write_with_timing(
    profile: &Profile,
    labels: &dyn Fn(&StackKey) -> Vec<(String, String)>,
    timing: &Timing,
    out: &mut dyn Write,
) -> Result<(), PprofError> {
    let wrap = |source| PprofError::Write { source };
    let message = build(profile, labels, timing).encode_to_vec();
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&message).map_err(wrap)?;
    let out = gz.finish().map_err(wrap)?;
    out.flush().map_err(wrap)
}

/// The string table: `strings[i]` has index `i`, and `index` maps each string back.
///
/// Invariant: `strings[0]` is `""`, and each string appears once.
struct Strings {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            strings: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> proto::ValueType {
        proto::ValueType {
            r#type: self.intern(kind),
            unit: self.intern(unit),
        }
    }
}

/// Functions and locations numbered in order of first use.
///
/// Invariants: `functions[k].id == k + 1` and `locations[k].id == k + 1`; every location's
/// function id is `<= functions.len()`.
struct Table {
    strings: Strings,
    functions: Vec<proto::Function>,
    /// `(name, filename)` string indices → function id.
    function_ids: HashMap<(i64, i64), u64>,
    locations: Vec<proto::Location>,
    /// `(function id, line, mapping id, address)` → location id.
    location_ids: HashMap<(u64, u32, u64, u64), u64>,
    mappings: Vec<proto::Mapping>,
    /// Mapping → mapping id.
    mapping_ids: HashMap<Arc<NativeMapping>, u64>,
    /// Location of each frame id already seen.
    frame_locations: HashMap<FrameId, u64>,
    /// Location of [`NO_PYTHON_FRAMES`], once used.
    no_python: Option<u64>,
}

impl Table {
    fn new() -> Table {
        Table {
            strings: Strings::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            frame_locations: HashMap::new(),
            no_python: None,
        }
    }

    /// The id of a native frame's mapping, written once.
    fn mapping(&mut self, mapping: &Arc<NativeMapping>) -> u64 {
        if let Some(&id) = self.mapping_ids.get(mapping) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let filename = self.strings.intern(&mapping.file);
        let build_id = self.strings.intern(&mapping.build_id);
        self.mappings.push(proto::Mapping {
            id,
            memory_start: mapping.start,
            memory_limit: mapping.limit,
            file_offset: mapping.offset,
            filename,
            build_id,
            // Every location carries its function: readers need not symbolize.
            has_functions: true,
            ..Default::default()
        });
        self.mapping_ids.insert(mapping.clone(), id);
        id
    }

    fn location(&mut self, function: &str, file: &str, line: u32) -> u64 {
        self.location_at(function, file, line, None)
    }

    fn location_at(&mut self, function: &str, file: &str, line: u32, native: Option<&NativeOrigin>) -> u64 {
        let (mapping_id, address) = match native {
            Some(origin) => (self.mapping(&origin.mapping), origin.address),
            None => (0, 0),
        };
        let key = (self.strings.intern(function), self.strings.intern(file));
        let next = self.functions.len() as u64 + 1;
        let function_id = *self.function_ids.entry(key).or_insert(next);
        if function_id == next {
            self.functions.push(proto::Function {
                id: function_id,
                name: key.0,
                filename: key.1,
                ..Default::default()
            });
        }
        let next = self.locations.len() as u64 + 1;
        let location_id = *self.location_ids.entry((function_id, line, mapping_id, address)).or_insert(next);
        if location_id == next {
            self.locations.push(proto::Location {
                id: location_id,
                mapping_id,
                address,
                line: vec![proto::Line {
                    function_id,
                    line: i64::from(line),
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        location_id
    }

    fn frame_location(&mut self, profile: &Profile, id: FrameId) -> u64 {
        if let Some(&location) = self.frame_locations.get(&id) {
            return location;
        }
        let frame = profile.frame(id);
        let location = self.location_at(&frame.function, &frame.file, frame.line, frame.native.as_deref());
        self.frame_locations.insert(id, location);
        location
    }

    fn no_python_location(&mut self) -> u64 {
        match self.no_python {
            Some(location) => location,
            None => {
                let location = self.location(NO_PYTHON_FRAMES, "", 0);
                self.no_python = Some(location);
                location
            }
        }
    }
}

/// The (uncompressed) profile message.
fn build(
    profile: &Profile,
    labels: &dyn Fn(&StackKey) -> Vec<(String, String)>,
    timing: &Timing,
) -> proto::Profile {
    let mut table = Table::new();
    let mode = profile.time_mode();
    // In the time modes (`wall`, `off-cpu`) values are nanoseconds already, events the count.
    let timed = mode.in_nanoseconds();
    let with_cpu = timed || timing.period_nanos > 0;
    let mut sample_type = vec![table.strings.value_type(SAMPLE_TYPE)];
    if with_cpu {
        sample_type.push(table.strings.value_type((mode.pprof_type(), "nanoseconds")));
    }

    let mut stacks: Vec<(&StackKey, u64, u64)> = profile.stacks_with_events().collect();
    stacks.sort_unstable();
    let mut samples = Vec::with_capacity(stacks.len());
    for (key, count, events) in stacks {
        let mut location_id = Vec::with_capacity(key.frames.len().max(1));
        if key.frames.is_empty() {
            location_id.push(table.no_python_location());
        }
        for &id in key.frames.iter().rev() {
            location_id.push(table.frame_location(profile, id));
        }
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        let events = i64::try_from(events).unwrap_or(i64::MAX);
        let mut value = vec![if timed { events } else { count }];
        if timed {
            value.push(count);
        } else if with_cpu {
            value.push(count.saturating_mul(timing.period_nanos));
        }
        let label = labels(key)
            .into_iter()
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .map(|(k, v)| proto::Label {
                key: table.strings.intern(&k),
                str: table.strings.intern(&v),
                ..Default::default()
            })
            .collect();
        samples.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
    let period_type = Some(table.strings.value_type(if timed { (mode.pprof_type(), "nanoseconds") } else { PERIOD_TYPE }));
    // How it was recorded, as `key=value` comments (`go tool pprof -comments`).
    let comment = super::recording_facts(profile).iter().map(|(k, v)| table.strings.intern(&format!("{k}={v}"))).collect();
    proto::Profile {
        comment,
        sample_type,
        sample: samples,
        mapping: table.mappings,
        location: table.locations,
        function: table.functions,
        string_table: table.strings.strings,
        time_nanos: timing.start_unix_nanos,
        duration_nanos: timing.duration_nanos,
        period_type,
        period: timing.period_nanos,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;

    use flate2::read::GzDecoder;
    use prost::Message;

    use super::*;
    use crate::output::tests::sample_profile;

    /// A sample as read back: frames leaf first as `(function, file, line)`, values, labels.
    type DecodedSample = (Vec<(String, String, i64)>, Vec<u64>, Vec<(String, String)>);

    /// The profile as read back, with every reference resolved.
    #[derive(Debug)]
    struct Decoded {
        strings: Vec<String>,
        sample_types: Vec<(String, String)>,
        period_type: (String, String),
        period: u64,
        time_nanos: u64,
        duration_nanos: u64,
        /// Per sample: frames leaf first as `(function, file, line)`, values, labels.
        samples: Vec<DecodedSample>,
        function_count: usize,
        location_count: usize,
    }

    /// Reads a written profile back with prost (the independent check, `go tool pprof`,
    /// is in tests/tests/pprof_readers.rs), checking the module's invariants on the way.
    fn decode(gzipped: &[u8]) -> Decoded {
        let mut raw = Vec::new();
        GzDecoder::new(gzipped)
            .read_to_end(&mut raw)
            .expect("valid gzip");
        let profile = proto::Profile::decode(raw.as_slice()).expect("a valid Profile message");
        let strings = profile.string_table.clone();
        let string = |index: i64| -> String {
            strings
                .get(usize::try_from(index).expect("index"))
                .expect("string index in range")
                .clone()
        };
        let value_type = |v: &proto::ValueType| (string(v.r#type), string(v.unit));

        // Function id → (name, file).
        let mut functions = BTreeMap::new();
        for f in &profile.function {
            assert_ne!(f.id, 0, "function ids are non-zero");
            assert_eq!(f.system_name, 0, "no system_name");
            let previous = functions.insert(f.id, (string(f.name), string(f.filename)));
            assert!(previous.is_none(), "duplicate function id {}", f.id);
        }
        // Location id → (function, file, line).
        let mut locations = BTreeMap::new();
        for l in &profile.location {
            assert_ne!(l.id, 0, "location ids are non-zero");
            assert_eq!(l.mapping_id, 0, "no mapping");
            assert_eq!(l.line.len(), 1, "one line per location");
            let line = &l.line[0];
            let (name, file) = functions
                .get(&line.function_id)
                .expect("line names a function")
                .clone();
            let previous = locations.insert(l.id, (name, file, line.line));
            assert!(previous.is_none(), "duplicate location id {}", l.id);
        }
        assert!(profile.mapping.is_empty(), "no mappings");
        let samples = profile
            .sample
            .iter()
            .map(|s| {
                assert_eq!(
                    s.value.len(),
                    profile.sample_type.len(),
                    "one value per type"
                );
                let frames = s
                    .location_id
                    .iter()
                    .map(|id| locations.get(id).expect("location exists").clone())
                    .collect();
                let labels = s
                    .label
                    .iter()
                    .map(|l| {
                        assert_eq!(l.num, 0, "no num");
                        (string(l.key), string(l.str))
                    })
                    .collect();
                let values = s.value.iter().map(|&v| v as u64).collect();
                (frames, values, labels)
            })
            .collect();
        Decoded {
            sample_types: profile.sample_type.iter().map(value_type).collect(),
            period_type: value_type(profile.period_type.as_ref().expect("a period type")),
            period: profile.period as u64,
            time_nanos: profile.time_nanos as u64,
            duration_nanos: profile.duration_nanos as u64,
            function_count: functions.len(),
            location_count: locations.len(),
            strings,
            samples,
        }
    }

    /// The labels the caller is expected to pass.
    fn labels(key: &StackKey) -> Vec<(String, String)> {
        let mut labels = vec![
            ("process.pid".to_owned(), key.pid.to_string()),
            (
                "process.executable.name".to_owned(),
                format!("exe{}", key.pid),
            ),
        ];
        if let Some(tid) = key.tid {
            labels.push(("thread.id".to_owned(), tid.to_string()));
        }
        if key.pid == 200 {
            labels.push(("container.id".to_owned(), "c".repeat(64)));
            labels.push(("k8s.pod.uid".to_owned(), String::new()));
            labels.push((String::new(), "ignored".to_owned()));
        }
        labels
    }

    fn written(profile: &Profile, timing: &Timing) -> Vec<u8> {
        let mut out = Vec::new();
        write_with_timing(profile, &labels, timing, &mut out).expect("write");
        out
    }

    fn frame(function: &str, file: &str, line: i64) -> (String, String, i64) {
        (function.to_owned(), file.to_owned(), line)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn round_trip() {
        let timing = Timing {
            start_unix_nanos: 1_700_000_000_123_456_789,
            duration_nanos: 15_000_000_000,
            period_nanos: 10_101_010,
        };
        let decoded = decode(&written(&sample_profile(), &timing));

        assert_eq!(decoded.strings[0], "");
        let mut unique = decoded.strings.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), decoded.strings.len(), "strings are unique");
        assert_eq!(
            decoded.sample_types,
            pairs(&[("samples", "count"), ("cpu", "nanoseconds")])
        );
        assert_eq!(
            decoded.period_type,
            ("cpu".to_owned(), "nanoseconds".to_owned())
        );
        assert_eq!(decoded.period, 10_101_010);
        assert_eq!(decoded.time_nanos, 1_700_000_000_123_456_789);
        assert_eq!(decoded.duration_nanos, 15_000_000_000);

        // Functions: <module>, main (app.py), work (lib.py), odd, [no Python frames].
        assert_eq!(decoded.function_count, 5);
        // Locations: one per (function, line): the four frames plus [no Python frames].
        assert_eq!(decoded.location_count, 5);

        let module = frame("<module>", "/srv/app.py", 3);
        let main = frame("main", "/srv/app.py", 10);
        let work = frame("work", "/srv/lib.py", 0);
        let odd = frame("odd;name\nx", "/srv/we;ird.py", 5);
        let none = frame(NO_PYTHON_FRAMES, "", 0);
        let base = |pid: &str| {
            vec![
                ("process.pid", pid.to_owned()),
                ("process.executable.name", format!("exe{pid}")),
            ]
        };
        let with = |pid: &str, extra: &[(&str, String)]| -> Vec<(String, String)> {
            base(pid)
                .into_iter()
                .chain(extra.iter().cloned())
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
        };
        let cid = "c".repeat(64);
        // In StackKey order: (pid, tid, frames root first); frames below are LEAF FIRST.
        let expected = vec![
            (
                vec![main.clone(), module.clone()],
                vec![3],
                with("100", &[]),
            ),
            (
                vec![work.clone(), main.clone(), module.clone()],
                vec![3],
                with("100", &[]),
            ),
            (vec![odd.clone(), module.clone()], vec![1], with("100", &[])),
            (
                vec![main.clone(), module.clone()],
                vec![4],
                with(
                    "200",
                    &[
                        ("thread.id", "201".to_owned()),
                        ("container.id", cid.clone()),
                    ],
                ),
            ),
            (
                vec![none.clone()],
                vec![2],
                with(
                    "200",
                    &[
                        ("thread.id", "202".to_owned()),
                        ("container.id", cid.clone()),
                    ],
                ),
            ),
            (
                vec![work.clone(), main.clone(), module.clone()],
                vec![5],
                with(
                    "200",
                    &[
                        ("thread.id", "202".to_owned()),
                        ("container.id", cid.clone()),
                    ],
                ),
            ),
            (vec![main.clone()], vec![1], with("300", &[])),
        ];
        // Each value pair is (samples, samples × period).
        let expected: Vec<DecodedSample> = expected
            .into_iter()
            .map(|(frames, values, labels)| {
                (frames, vec![values[0], values[0] * 10_101_010], labels)
            })
            .collect();
        assert_eq!(decoded.samples, expected);
        let total: u64 = decoded.samples.iter().map(|(_, v, _)| v[0]).sum();
        assert_eq!(total, sample_profile().total_samples());
        let cpu: u64 = decoded.samples.iter().map(|(_, v, _)| v[1]).sum();
        assert_eq!(cpu, sample_profile().total_samples() * 10_101_010);
    }

    #[test]
    fn thread_name_label_beside_thread_id() {
        let mut profile = sample_profile();
        profile.set_thread_name(202, "pool-2");
        let mut out = Vec::new();
        write_with_timing(&profile, &|key| crate::output::pprof_labels(&profile, key), &Timing::default(), &mut out)
            .expect("write");
        let decoded = decode(&out);
        for (_, _, labels) in &decoded.samples {
            let get = |k: &str| labels.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
            match get("thread.id") {
                Some("202") => assert_eq!(get("thread.name"), Some("pool-2"), "{labels:?}"),
                _ => assert_eq!(get("thread.name"), None, "{labels:?}"),
            }
        }
        assert!(decoded.samples.iter().any(|(_, _, l)| l.contains(&("thread.name".to_string(), "pool-2".to_string()))));
    }

    #[test]
    fn same_function_different_lines_share_the_function() {
        let mut p = Profile::new();
        let intern = |p: &mut Profile, function: &str, file: &str, line| {
            p.intern(crate::sample::aggregate::FrameName {
                function: function.into(),
                file: file.into(),
                line,
                native: None,
            })
        };
        let a1 = intern(&mut p, "f", "a.py", 1);
        let a2 = intern(&mut p, "f", "a.py", 2);
        let b1 = intern(&mut p, "f", "b.py", 1);
        p.add(1, None, &[a1, a2, b1], 7);
        p.add(1, None, &[a2], 1);
        let decoded = decode(&written(&p, &Timing::default()));
        assert_eq!(decoded.function_count, 2);
        assert_eq!(decoded.location_count, 3);
        assert_eq!(decoded.samples.len(), 2);
        assert_eq!(
            decoded.samples[0].0,
            vec![
                frame("f", "b.py", 1),
                frame("f", "a.py", 2),
                frame("f", "a.py", 1)
            ]
        );
        assert_eq!(decoded.samples[0].1, vec![7]);
        // Unknown timing: left out, read back as zero.
        assert_eq!(
            (decoded.period, decoded.time_nanos, decoded.duration_nanos),
            (0, 0, 0)
        );
    }

    #[test]
    fn empty_profile() {
        let decoded = decode(&written(&Profile::new(), &Timing::default()));
        assert!(decoded.samples.is_empty());
        assert_eq!(decoded.function_count, 0);
        assert_eq!(decoded.strings[0], "");
        assert_eq!(decoded.sample_types, pairs(&[("samples", "count")]));
    }

    /// In the time modes the values are nanoseconds already: `samples` counts the events
    /// (samples and off-CPU intervals), the second type is the mode's time.
    #[test]
    fn wall_mode_values_are_events_and_nanoseconds() {
        let mut p = Profile::new();
        p.set_time_mode(crate::time_mode::TimeMode::Wall);
        p.add_weighted(1, Some(2), &[], 7_000_000, 1);
        p.add_weighted(1, Some(2), &[], 1_000_000, 1);
        let decoded = decode(&written(&p, &Timing { period_nanos: 1_000_000, ..Timing::default() }));
        assert_eq!(decoded.sample_types, pairs(&[("samples", "count"), ("wall", "nanoseconds")]));
        assert_eq!(decoded.period_type, ("wall".to_string(), "nanoseconds".to_string()));
        assert_eq!(decoded.samples[0].1, vec![2, 8_000_000]);
    }

    #[test]
    fn huge_counts_are_clamped() {
        let mut p = Profile::new();
        p.add(1, None, &[], u64::MAX);
        let decoded = decode(&written(&p, &Timing::default()));
        assert_eq!(decoded.samples[0].1, vec![i64::MAX as u64]);
        let timing = Timing {
            period_nanos: 1_000,
            ..Timing::default()
        };
        let decoded = decode(&written(&p, &timing));
        assert_eq!(decoded.samples[0].1, vec![i64::MAX as u64, i64::MAX as u64]);
    }

    #[test]
    fn unknown_frame_ids_do_not_panic() {
        let mut p = Profile::new();
        p.add(1, None, &[12345], 1);
        let decoded = decode(&written(&p, &Timing::default()));
        assert_eq!(decoded.samples[0].0, vec![frame("[unknown frame]", "", 0)]);
    }

    #[test]
    fn deterministic() {
        let profile = sample_profile();
        let timing = Timing::default();
        assert_eq!(written(&profile, &timing), written(&profile, &timing));
    }

    #[test]
    fn native_frames_carry_their_mapping_and_address() {
        use crate::sample::aggregate::{FrameName, NativeMapping, NativeOrigin};
        let mapping = Arc::new(NativeMapping {
            file: "/usr/lib/libz.so.1".into(),
            build_id: "abcd".into(),
            start: 0x2000,
            limit: 0x9000,
            offset: 0x2000,
        });
        let mut p = Profile::new();
        let native = |address| Some(Arc::new(NativeOrigin { address, mapping: mapping.clone() }));
        let a = p.intern(FrameName { function: "deflate".into(), file: "libz.so.1".into(), line: 0, native: native(0x2100) });
        let b = p.intern(FrameName { function: "inflate".into(), file: "libz.so.1".into(), line: 0, native: native(0x3100) });
        let py = p.intern(FrameName { function: "f".into(), file: "a.py".into(), line: 3, native: None });
        p.add(1, None, &[py, a, b], 2);
        let mut out = Vec::new();
        write(&p, &|_| Vec::new(), &mut out).unwrap();
        let mut raw = Vec::new();
        GzDecoder::new(&out[..]).read_to_end(&mut raw).unwrap();
        let m = proto::Profile::decode(&raw[..]).unwrap();
        assert_eq!(m.mapping.len(), 1, "one mapping for the two frames of one file");
        let mapping = &m.mapping[0];
        assert_eq!((mapping.id, mapping.memory_start, mapping.memory_limit, mapping.file_offset), (1, 0x2000, 0x9000, 0x2000));
        assert_eq!(m.string_table[mapping.filename as usize], "/usr/lib/libz.so.1");
        assert_eq!(m.string_table[mapping.build_id as usize], "abcd");
        let located: Vec<(u64, u64)> = m.sample[0]
            .location_id
            .iter()
            .map(|id| {
                let l = &m.location[*id as usize - 1];
                (l.mapping_id, l.address)
            })
            .collect();
        assert_eq!(located, vec![(1, 0x3100), (1, 0x2100), (0, 0)]);
    }

    #[test]
    fn many_stacks_cross_chunk_boundaries() {
        let mut p = Profile::new();
        let ids: Vec<FrameId> = (0..300)
            .map(|i| {
                p.intern(crate::sample::aggregate::FrameName {
                    function: format!("function_number_{i}").into(),
                    file: "/a/rather/long/path/to/some/module.py".into(),
                    line: i,
                    native: None,
                })
            })
            .collect();
        for len in 1..=ids.len() {
            p.add(7, Some(len as u32), &ids[..len], len as u64);
        }
        let decoded = decode(&written(&p, &Timing::default()));
        assert_eq!(decoded.samples.len(), 300);
        assert_eq!(decoded.location_count, 300);
        assert_eq!(decoded.function_count, 300);
        for (frames, values, _) in &decoded.samples {
            assert_eq!(values[0] as usize, frames.len());
            assert_eq!(
                frames.last(),
                Some(&frame(
                    "function_number_0",
                    "/a/rather/long/path/to/some/module.py",
                    0
                ))
            );
        }
    }

    #[test]
    fn write_errors_are_reported() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let error = write(&sample_profile(), &labels, &mut Broken).expect_err("must fail");
        assert_eq!(
            error.to_string(),
            "could not write the pprof profile: disk full"
        );
        assert_eq!(io::Error::from(error).kind(), io::ErrorKind::StorageFull);
    }

    #[test]
    fn timing_from_rate() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(2);
        let timing = Timing::new(start, Duration::from_millis(1500), 99);
        assert_eq!(timing.start_unix_nanos, 2_000_000_000);
        assert_eq!(timing.duration_nanos, 1_500_000_000);
        assert_eq!(timing.period_nanos, 10_101_010);
        assert_eq!(Timing::new(start, Duration::ZERO, 0).period_nanos, 0);
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(
            Timing::new(before, Duration::MAX, u64::MAX).start_unix_nanos,
            0
        );
        assert_eq!(
            Timing::new(before, Duration::MAX, 1).duration_nanos,
            i64::MAX
        );
    }
}
