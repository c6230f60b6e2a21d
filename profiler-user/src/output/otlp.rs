//! OpenTelemetry profiles: an OTLP `ExportProfilesServiceRequest` (schema `v1development`,
//! the message types of the `opentelemetry-proto` crate, encoded by prost), as written by
//! `record --format otlp` and posted by `agent --otlp-endpoint` to [`PROFILES_PATH`].
//!
//! The profiles signal is alpha: its schema and its HTTP path carry the version
//! `v1development`, and both live here only ([`PROFILES_PATH`] and the crate's module path).
//!
//! What the request holds:
//! - one shared `ProfilesDictionary` (strings, functions, locations, stacks, attributes);
//!   every table starts with its zero value, as the schema requires (`string_table[0]` is
//!   `""`, `stack_table[0]` is the empty stack...), so index 0 always means "not set";
//! - one `ResourceProfiles` per process, in pid order, whose resource attributes follow
//!   the semantic conventions: `process.pid` (int), `process.executable.name`,
//!   `process.executable.path`, `process.runtime.name` (`CPython`), `process.runtime.version`,
//!   `container.id`, `k8s.pod.uid`, `k8s.namespace.name`, `k8s.pod.name` and
//!   `k8s.container.name` when known, `host.name` and `service.name` when given;
//! - in it, one `ScopeProfiles` (scope `pyperch` with its version) holding one `Profile`:
//!   `sample_type` `samples`/`count`, `period_type` `cpu`/`nanoseconds` with `period`,
//!   `time_unix_nano` and `duration_nano` from the profile's timing (left out when unknown);
//! - one `Sample` per distinct [`StackKey`] of that process, `values = [count]` (clamped to
//!   `i64::MAX`), its stack's `location_indices` LEAF FIRST (the schema's order; a
//!   [`StackKey`] is root first), and with `--threads` a `thread.id` (int) attribute and,
//!   when the thread's name is known, a `thread.name` (string) one;
//! - one `Location` per distinct (function, line) with a single `Line` (line 0: unknown),
//!   one `Function` per distinct (name, file); no mappings (Python code has no binary
//!   mapping). A stack with no Python frames gets one [`NO_PYTHON_FRAMES`] location.
//!
//! Invariants: every index in the request is within its table; the output is deterministic
//! (processes in pid order, samples in [`StackKey`] order, table entries in order of first
//! use; no random profile id).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::io::{self, Write};
use std::time::UNIX_EPOCH;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile as OtlpProfile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::sample::aggregate::{FrameId, Profile, StackKey};

use super::NO_PYTHON_FRAMES;

/// The OTLP/HTTP path of the profiles signal, appended to `--otlp-endpoint`. The signal is
/// alpha; this is the one place its version appears outside the proto module paths.
pub const PROFILES_PATH: &str = "/v1development/profiles";
/// The media type of an OTLP/HTTP binary protobuf body.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// What each sample value counts: samples.
pub const SAMPLE_TYPE: (&str, &str) = ("samples", "count");
/// What one sample stands for: `period` nanoseconds of CPU time.
pub const PERIOD_TYPE: (&str, &str) = ("cpu", "nanoseconds");

/// Resource-level facts that are not in the [`Profile`] itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceInfo {
    /// `host.name`: the machine's node name.
    pub host_name: Option<String>,
    /// `service.name` (the agent's `--app-name`).
    pub service_name: Option<String>,
    /// Whether a process in a named pod gets `service.name` `<namespace>/<container>`
    /// instead of `service_name` (the agent without an explicit `--app-name`).
    pub service_name_from_pod: bool,
}

impl ResourceInfo {
    /// The host's node name from `uname`, and no service name.
    pub fn of_this_host() -> ResourceInfo {
        ResourceInfo { host_name: host_name(), service_name: None, service_name_from_pod: false }
    }
}

/// The node name of this host (`uname -n`), if it is non-empty text.
pub fn host_name() -> Option<String> {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_str().ok()?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// Writes `profile` to `out` as one serialized `ExportProfilesServiceRequest`, flushed.
pub fn write(profile: &Profile, info: &ResourceInfo, out: &mut dyn Write) -> io::Result<()> {
    out.write_all(&encode(profile, info))?;
    out.flush()
}

/// `profile` as a serialized `ExportProfilesServiceRequest` (the OTLP/HTTP body).
pub fn encode(profile: &Profile, info: &ResourceInfo) -> Vec<u8> {
    request(profile, info).encode_to_vec()
}

/// `profile` as an `ExportProfilesServiceRequest` (see the module's documentation).
pub fn request(profile: &Profile, info: &ResourceInfo) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let mut by_pid: BTreeMap<u32, Vec<(&StackKey, u64)>> = BTreeMap::new();
    for (key, count) in profile.stacks() {
        by_pid.entry(key.pid).or_default().push((key, count));
    }
    // In the time modes the values are nanoseconds of wall or off-CPU time.
    let mode = profile.time_mode();
    let (sample_type, period_type) = if mode.in_nanoseconds() {
        let t = dict.value_type((mode.pprof_type(), "nanoseconds"));
        (t, dict.value_type((mode.pprof_type(), "nanoseconds")))
    } else {
        (dict.value_type(SAMPLE_TYPE), dict.value_type(PERIOD_TYPE))
    };
    let timing = profile.timing();
    let (time_unix_nano, duration_nano, period) = match timing {
        Some(t) => (
            t.start
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            u64::try_from(t.duration.as_nanos()).unwrap_or(u64::MAX),
            1_000_000_000_i64.checked_div(i64::try_from(t.rate_hz).unwrap_or(i64::MAX)).unwrap_or(0),
        ),
        None => (0, 0, 0),
    };
    // How it was recorded, as the profile's attributes.
    let recorded: Vec<i32> =
        super::recording_facts(profile).iter().map(|(k, v)| dict.string_attribute(k, v)).collect();
    let mut resource_profiles = Vec::with_capacity(by_pid.len());
    for (pid, mut stacks) in by_pid {
        stacks.sort_unstable();
        let samples = stacks
            .iter()
            .map(|(key, count)| Sample {
                stack_index: dict.stack(profile, &key.frames),
                attribute_indices: thread_attributes(profile, &mut dict, key.tid),
                link_index: 0,
                values: vec![i64::try_from(*count).unwrap_or(i64::MAX)],
                timestamps_unix_nano: Vec::new(),
            })
            .collect();
        let otlp_profile = OtlpProfile {
            attribute_indices: recorded.clone(),
            sample_type: Some(sample_type),
            samples,
            time_unix_nano,
            duration_nano,
            period_type: Some(period_type),
            period,
            ..Default::default()
        };
        resource_profiles.push(ResourceProfiles {
            resource: Some(Resource { attributes: resource_attributes(profile, pid, info), ..Default::default() }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "pyperch".to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                profiles: vec![otlp_profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }
    ExportProfilesServiceRequest { resource_profiles, dictionary: Some(dict.finish()) }
}

/// The semantic-convention resource attributes of process `pid` (empty values left out).
fn resource_attributes(profile: &Profile, pid: u32, info: &ResourceInfo) -> Vec<KeyValue> {
    let mut out = vec![int_key_value("process.pid", pid.into())];
    let mut text = |key: &str, value: Option<&str>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            out.push(string_key_value(key, value));
        }
    };
    if let Some(label) = profile.process(pid) {
        let exe_name = std::path::Path::new(&label.exe)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| label.comm.clone());
        text("process.executable.name", Some(&exe_name));
        text("process.executable.path", Some(&label.exe));
        text("process.runtime.name", Some("CPython"));
        text("process.runtime.version", Some(&label.version));
        text("container.id", label.container_id.as_deref());
        text("k8s.pod.uid", label.pod_uid.as_deref());
        for (key, value) in super::k8s_name_labels(label) {
            text(&key, Some(&value));
        }
    }
    text("host.name", info.host_name.as_deref());
    let pod_service = profile
        .process(pid)
        .and_then(|l| l.pod_names.as_deref())
        .filter(|_| info.service_name_from_pod)
        .map(|n| n.service_name());
    text("service.name", pod_service.as_deref().or(info.service_name.as_deref()));
    out
}

fn string_key_value(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.to_string())) }),
        ..Default::default()
    }
}

fn int_key_value(key: &str, value: i64) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }), ..Default::default() }
}

/// A sample's attributes with `--threads`: `thread.id` (int) and, when the thread's name is
/// known, `thread.name` (string, see [`super::thread_name_text`]); none without a thread.
fn thread_attributes(profile: &Profile, dict: &mut Dictionary, tid: Option<u32>) -> Vec<i32> {
    let Some(tid) = tid else { return Vec::new() };
    let mut out = vec![dict.int_attribute("thread.id", tid.into())];
    if let Some(name) = super::thread_name_text(profile, tid) {
        out.push(dict.string_attribute("thread.name", &name));
    }
    out
}

/// The value of an interned attribute (`AnyValue` is not hashable).
#[derive(Clone, PartialEq, Eq, Hash)]
enum AttributeValue {
    Int(i64),
    String(String),
}

/// One table of the dictionary: entries in order of first use, each once.
///
/// Invariant: `items[0]` is the zero value given to [`Table::new`], and `index` maps every
/// item to its position.
struct Table<T: Clone + Eq + Hash> {
    items: Vec<T>,
    index: HashMap<T, i32>,
}

impl<T: Clone + Eq + Hash> Table<T> {
    fn new(zero: T) -> Self {
        Table { items: vec![zero.clone()], index: HashMap::from([(zero, 0)]) }
    }

    /// The index of `item`, adding it on first use. Past `i32::MAX` entries (impossible in
    /// practice: the request would be gigabytes) the zero value's index 0 is returned.
    fn get(&mut self, item: T) -> i32 {
        if let Some(&i) = self.index.get(&item) {
            return i;
        }
        let Ok(i) = i32::try_from(self.items.len()) else { return 0 };
        self.items.push(item.clone());
        self.index.insert(item, i);
        i
    }
}

/// The dictionary being built. Attribute values are interned through their key and value
/// (`KeyValueAndUnit` holds an `AnyValue`, which is not hashable).
struct Dictionary {
    strings: Table<String>,
    functions: Table<Function>,
    locations: Table<(i32, i64)>,
    stacks: Table<Vec<i32>>,
    attributes: Table<(i32, AttributeValue)>,
    /// Interned frame → location index, so a frame's strings are looked up once.
    frame_locations: HashMap<FrameId, i32>,
}

impl Dictionary {
    fn new() -> Self {
        Dictionary {
            strings: Table::new(String::new()),
            functions: Table::new(Function::default()),
            locations: Table::new((0, 0)),
            stacks: Table::new(Vec::new()),
            attributes: Table::new((0, AttributeValue::Int(0))),
            frame_locations: HashMap::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        match self.strings.index.get(s) {
            Some(&i) => i,
            None => self.strings.get(s.to_string()),
        }
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> ValueType {
        ValueType { type_strindex: self.string(kind), unit_strindex: self.string(unit) }
    }

    /// The location of one `(function name, file, line)`.
    fn location(&mut self, function: &str, file: &str, line: u32) -> i32 {
        let function = Function {
            name_strindex: self.string(function),
            system_name_strindex: 0,
            filename_strindex: self.string(file),
            start_line: 0,
        };
        let function_index = self.functions.get(function);
        self.locations.get((function_index, i64::from(line)))
    }

    /// The stack index of `frames` (root first), written leaf first.
    fn stack(&mut self, profile: &Profile, frames: &[FrameId]) -> i32 {
        let mut locations: Vec<i32> = Vec::with_capacity(frames.len().max(1));
        for &id in frames.iter().rev() {
            let index = match self.frame_locations.get(&id) {
                Some(&i) => i,
                None => {
                    let frame = profile.frame(id);
                    let i = self.location(&frame.function, &frame.file, frame.line);
                    self.frame_locations.insert(id, i);
                    i
                }
            };
            locations.push(index);
        }
        if locations.is_empty() {
            locations.push(self.location(NO_PYTHON_FRAMES, "", 0));
        }
        self.stacks.get(locations)
    }

    fn int_attribute(&mut self, key: &str, value: i64) -> i32 {
        let key = self.string(key);
        self.attributes.get((key, AttributeValue::Int(value)))
    }

    fn string_attribute(&mut self, key: &str, value: &str) -> i32 {
        let key = self.string(key);
        self.attributes.get((key, AttributeValue::String(value.to_string())))
    }

    fn finish(self) -> ProfilesDictionary {
        ProfilesDictionary {
            mapping_table: vec![Mapping::default()],
            location_table: self
                .locations
                .items
                .into_iter()
                .enumerate()
                .map(|(i, (function_index, line))| {
                    if i == 0 {
                        return Location::default();
                    }
                    Location { lines: vec![Line { function_index, line, column: 0 }], ..Default::default() }
                })
                .collect(),
            function_table: self.functions.items,
            link_table: vec![Link::default()],
            string_table: self.strings.items,
            attribute_table: self
                .attributes
                .items
                .into_iter()
                .enumerate()
                .map(|(i, (key_strindex, value))| {
                    if i == 0 {
                        return KeyValueAndUnit::default();
                    }
                    let value = match value {
                        AttributeValue::Int(v) => any_value::Value::IntValue(v),
                        AttributeValue::String(s) => any_value::Value::StringValue(s),
                    };
                    KeyValueAndUnit { key_strindex, value: Some(AnyValue { value: Some(value) }), unit_strindex: 0 }
                })
                .collect(),
            stack_table: self.stacks.items.into_iter().map(|location_indices| Stack { location_indices }).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::sample_profile;

    fn decode(bytes: &[u8]) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest::decode(bytes).expect("pyperch's OTLP request decodes")
    }

    /// The leaf-first function names of one sample.
    fn stack_names(dict: &ProfilesDictionary, sample: &Sample) -> Vec<String> {
        let stack = &dict.stack_table[sample.stack_index as usize];
        stack
            .location_indices
            .iter()
            .map(|&l| {
                let line = dict.location_table[l as usize].lines[0];
                let f = dict.function_table[line.function_index as usize];
                dict.string_table[f.name_strindex as usize].clone()
            })
            .collect()
    }

    fn attribute<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
        attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn otlp_request_round_trips_with_zero_values_first() {
        let profile = sample_profile();
        let info = ResourceInfo { host_name: Some("box".into()), service_name: None, service_name_from_pod: false };
        let req = decode(&encode(&profile, &info));
        let dict = req.dictionary.as_ref().expect("a dictionary");
        assert_eq!(dict.string_table[0], "");
        assert_eq!(dict.mapping_table, vec![Mapping::default()]);
        assert_eq!(dict.location_table[0], Location::default());
        assert_eq!(dict.function_table[0], Function::default());
        assert_eq!(dict.link_table, vec![Link::default()]);
        assert_eq!(dict.attribute_table[0], KeyValueAndUnit::default());
        assert_eq!(dict.stack_table[0], Stack::default());
        // Every index is within its table.
        for l in &dict.location_table[1..] {
            assert_eq!(l.lines.len(), 1);
            assert!((l.lines[0].function_index as usize) < dict.function_table.len());
        }
        for f in &dict.function_table {
            assert!((f.name_strindex as usize) < dict.string_table.len());
            assert!((f.filename_strindex as usize) < dict.string_table.len());
        }
        for s in &dict.stack_table[1..] {
            assert!(!s.location_indices.is_empty());
            assert!(s.location_indices.iter().all(|&l| l > 0 && (l as usize) < dict.location_table.len()));
        }
        // One resource per process, in pid order.
        let pids: Vec<_> = req
            .resource_profiles
            .iter()
            .map(|rp| attribute(&rp.resource.as_ref().unwrap().attributes, "process.pid").cloned())
            .collect();
        assert_eq!(
            pids,
            [100, 200, 300].map(|p| Some(any_value::Value::IntValue(p))).to_vec()
        );
        let mut total = 0;
        for rp in &req.resource_profiles {
            let attrs = &rp.resource.as_ref().unwrap().attributes;
            assert_eq!(attribute(attrs, "host.name"), Some(&any_value::Value::StringValue("box".into())));
            let p = &rp.scope_profiles[0].profiles[0];
            let st = p.sample_type.unwrap();
            assert_eq!(dict.string_table[st.type_strindex as usize], "samples");
            assert_eq!(dict.string_table[st.unit_strindex as usize], "count");
            for s in &p.samples {
                total += s.values[0];
            }
        }
        assert_eq!(total as u64, profile.total_samples());
        let p100 = &req.resource_profiles[0];
        assert_eq!(
            attribute(&p100.resource.as_ref().unwrap().attributes, "process.executable.name"),
            Some(&any_value::Value::StringValue("python3.12".into()))
        );
        let s = &p100.scope_profiles[0].profiles[0].samples;
        let names: Vec<_> = s.iter().map(|s| (stack_names(dict, s), s.values[0])).collect();
        assert!(names.contains(&(vec!["work".into(), "main".into(), "<module>".into()], 3)), "{names:?}");
        assert!(names.contains(&(vec!["odd;name\nx".into(), "<module>".into()], 1)), "{names:?}");
    }

    #[test]
    fn otlp_threads_and_empty_stacks() {
        let profile = sample_profile();
        let req = request(&profile, &ResourceInfo::default());
        let dict = req.dictionary.as_ref().unwrap();
        let p200 = &req.resource_profiles[1].scope_profiles[0].profiles[0];
        let mut tids = Vec::new();
        for s in &p200.samples {
            assert_eq!(s.attribute_indices.len(), 1);
            let kv = &dict.attribute_table[s.attribute_indices[0] as usize];
            assert_eq!(dict.string_table[kv.key_strindex as usize], "thread.id");
            tids.push(kv.value.as_ref().and_then(|v| v.value.clone()));
            if s.values[0] == 2 {
                assert_eq!(stack_names(dict, s), vec![NO_PYTHON_FRAMES.to_string()]);
            }
        }
        tids.sort_by_key(|v| format!("{v:?}"));
        tids.dedup();
        assert_eq!(tids.len(), 2, "{tids:?}");
        // No thread attribute without --threads.
        assert!(req.resource_profiles[0].scope_profiles[0].profiles[0].samples.iter().all(|s| s.attribute_indices.is_empty()));
    }

    #[test]
    fn otlp_thread_names() {
        let mut profile = sample_profile();
        profile.set_thread_name(201, "web;1");
        let req = request(&profile, &ResourceInfo::default());
        let dict = req.dictionary.as_ref().unwrap();
        let p200 = &req.resource_profiles[1].scope_profiles[0].profiles[0];
        for s in &p200.samples {
            let attrs: Vec<(String, Option<any_value::Value>)> = s
                .attribute_indices
                .iter()
                .map(|&i| {
                    let kv = &dict.attribute_table[i as usize];
                    (dict.string_table[kv.key_strindex as usize].clone(), kv.value.as_ref().and_then(|v| v.value.clone()))
                })
                .collect();
            let tid = attrs.iter().find(|(k, _)| k == "thread.id").and_then(|(_, v)| v.clone());
            let name = attrs.iter().find(|(k, _)| k == "thread.name").and_then(|(_, v)| v.clone());
            match tid {
                Some(any_value::Value::IntValue(201)) => {
                    assert_eq!(name, Some(any_value::Value::StringValue("web,1".into())), "{attrs:?}")
                }
                Some(any_value::Value::IntValue(202)) => assert_eq!(name, None, "{attrs:?}"),
                other => panic!("unexpected thread.id {other:?}"),
            }
        }
    }

    #[test]
    fn otlp_output_is_deterministic() {
        let profile = sample_profile();
        let info = ResourceInfo::default();
        assert_eq!(encode(&profile, &info), encode(&profile, &info));
        let empty = request(&Profile::new(), &info);
        assert!(empty.resource_profiles.is_empty());
        assert_eq!(empty.dictionary.unwrap().string_table[0], "");
    }
}
