//! pprof's `profile.proto` (github.com/google/pprof, `proto/profile.proto`), gzip-compressed,
//! as read by `go tool pprof`, Pyroscope, Grafana and most continuous-profiling back ends.
//!
//! The protobuf is encoded by hand by a small writer (module `wire`); the field numbers are
//! those of `profile.proto` (listed next to each constant below).
//!
//! What the file holds:
//! - `sample_type`: one value, `samples`/`count`; `period_type`: `cpu`/`nanoseconds`, with
//!   `period`, `time_nanos` and `duration_nanos` from [`Timing`] (left out when zero);
//! - one `Function` per distinct (function name, file) pair; `system_name` and `start_line`
//!   are left out (with `system_name == name`, `go tool pprof` would "demangle" the name and
//!   strip `<...>` as if it were C++ template arguments, turning `<module>` into nothing);
//! - one `Location` per distinct (function, line) pair, with a single `Line`; no mappings
//!   (`mapping_id` 0: Python code has no binary mapping); an unknown line (0) is left out;
//! - one `Sample` per distinct [`StackKey`], with `location_id` LEAF FIRST (the pprof
//!   convention; [`StackKey::frames`] is root first), `value = [count]` (clamped to
//!   `i64::MAX`), and one string `Label` per pair returned by the caller's `labels` closure
//!   (pairs with an empty key or value are skipped: an empty string cannot be told apart from
//!   an absent one in proto3). A stack with no Python frames gets a single
//!   [`super::NO_PYTHON_FRAMES`] location, so every sample has at least one location.
//!
//! Invariants: `string_table[0]` is `""`; every id is non-zero and ids are dense from 1;
//! every `location_id` names a written `Location` and every `function_id` a written
//! `Function`; every string index is `< string_table.len()`. The output is deterministic:
//! samples are written in [`StackKey`] order, ids and strings are numbered in order of first
//! use, and the gzip header carries no timestamp.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::{Duration, SystemTime};

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::aggregate::{FrameId, Profile, StackKey};

use super::NO_PYTHON_FRAMES;

/// The only sample type: how many samples landed on a stack.
pub const SAMPLE_TYPE: (&str, &str) = ("samples", "count");
/// What one sample stands for: `period` nanoseconds of CPU time.
pub const PERIOD_TYPE: (&str, &str) = ("cpu", "nanoseconds");

/// Field numbers of `profile.proto`.
mod field {
    // message Profile
    pub const PROFILE_SAMPLE_TYPE: u32 = 1;
    pub const PROFILE_SAMPLE: u32 = 2;
    pub const PROFILE_LOCATION: u32 = 4;
    pub const PROFILE_FUNCTION: u32 = 5;
    pub const PROFILE_STRING_TABLE: u32 = 6;
    pub const PROFILE_TIME_NANOS: u32 = 9;
    pub const PROFILE_DURATION_NANOS: u32 = 10;
    pub const PROFILE_PERIOD_TYPE: u32 = 11;
    pub const PROFILE_PERIOD: u32 = 12;
    // message ValueType
    pub const VALUE_TYPE_TYPE: u32 = 1;
    pub const VALUE_TYPE_UNIT: u32 = 2;
    // message Sample
    pub const SAMPLE_LOCATION_ID: u32 = 1;
    pub const SAMPLE_VALUE: u32 = 2;
    pub const SAMPLE_LABEL: u32 = 3;
    // message Label
    pub const LABEL_KEY: u32 = 1;
    pub const LABEL_STR: u32 = 2;
    // message Location
    pub const LOCATION_ID: u32 = 1;
    pub const LOCATION_LINE: u32 = 4;
    // message Line
    pub const LINE_FUNCTION_ID: u32 = 1;
    pub const LINE_LINE: u32 = 2;
    // message Function
    pub const FUNCTION_ID: u32 = 1;
    pub const FUNCTION_NAME: u32 = 2;
    pub const FUNCTION_FILENAME: u32 = 4;
}

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
/// `time_nanos`, `duration_nanos` and `period` fields. `out` is flushed before returning
/// `Ok`.
pub fn write_with_timing(
    profile: &Profile,
    labels: &dyn Fn(&StackKey) -> Vec<(String, String)>,
    timing: &Timing,
    out: &mut dyn Write,
) -> Result<(), PprofError> {
    let wrap = |source| PprofError::Write { source };
    let mut gz = GzEncoder::new(out, Compression::default());
    encode(profile, labels, timing, &mut gz).map_err(wrap)?;
    let out = gz.finish().map_err(wrap)?;
    out.flush().map_err(wrap)
}

/// Buffers top-level fields and hands them to `out` in large pieces.
struct Chunked<'a> {
    out: &'a mut dyn Write,
    buffer: Vec<u8>,
}

impl Chunked<'_> {
    const CHUNK: usize = 64 * 1024;

    /// Appends a length-delimited top-level field holding `message`.
    fn message(&mut self, field: u32, message: &[u8]) -> io::Result<()> {
        wire::bytes(&mut self.buffer, field, message);
        self.drain(Self::CHUNK)
    }

    /// Appends a varint top-level field (left out when zero).
    fn int(&mut self, field: u32, value: i64) -> io::Result<()> {
        wire::int(&mut self.buffer, field, value);
        self.drain(Self::CHUNK)
    }

    /// Writes the buffer out once it holds at least `threshold` bytes.
    fn drain(&mut self, threshold: usize) -> io::Result<()> {
        if self.buffer.len() >= threshold {
            self.out.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// The string table: `strings[i]` has index `i`, and `index` maps each string back.
///
/// Invariant: `strings[0]` is `""`, and each string appears once.
struct Strings {
    strings: Vec<String>,
    index: HashMap<String, u64>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            strings: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn intern(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as u64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Functions and locations numbered in order of first use.
///
/// Invariants: `functions[k]` has id `k + 1` and `locations[k]` has id `k + 1`; every
/// location's function id is `<= functions.len()`.
struct Table {
    strings: Strings,
    /// `(name, filename)` string indices.
    functions: Vec<(u64, u64)>,
    function_ids: HashMap<(u64, u64), u64>,
    /// `(function id, line)`.
    locations: Vec<(u64, u32)>,
    location_ids: HashMap<(u64, u32), u64>,
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
            frame_locations: HashMap::new(),
            no_python: None,
        }
    }

    fn location(&mut self, function: &str, file: &str, line: u32) -> u64 {
        let key = (self.strings.intern(function), self.strings.intern(file));
        let next = self.functions.len() as u64 + 1;
        let function_id = *self.function_ids.entry(key).or_insert(next);
        if function_id == next {
            self.functions.push(key);
        }
        let next = self.locations.len() as u64 + 1;
        let location_id = *self.location_ids.entry((function_id, line)).or_insert(next);
        if location_id == next {
            self.locations.push((function_id, line));
        }
        location_id
    }

    fn frame_location(&mut self, profile: &Profile, id: FrameId) -> u64 {
        if let Some(&location) = self.frame_locations.get(&id) {
            return location;
        }
        let frame = profile.frame(id);
        let location = self.location(&frame.function, &frame.file, frame.line);
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

/// Encodes the (uncompressed) profile message into `out`.
fn encode(
    profile: &Profile,
    labels: &dyn Fn(&StackKey) -> Vec<(String, String)>,
    timing: &Timing,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut out = Chunked {
        out,
        buffer: Vec::with_capacity(Chunked::CHUNK * 2),
    };
    let mut table = Table::new();
    let mut message = Vec::new();

    let value_type = |strings: &mut Strings, message: &mut Vec<u8>, (kind, unit): (&str, &str)| {
        message.clear();
        wire::uint(message, field::VALUE_TYPE_TYPE, strings.intern(kind));
        wire::uint(message, field::VALUE_TYPE_UNIT, strings.intern(unit));
    };
    value_type(&mut table.strings, &mut message, SAMPLE_TYPE);
    out.message(field::PROFILE_SAMPLE_TYPE, &message)?;

    let mut stacks: Vec<(&StackKey, u64)> = profile.stacks().collect();
    stacks.sort_unstable();
    let mut location_ids: Vec<u64> = Vec::new();
    let mut label = Vec::new();
    for (key, count) in stacks {
        location_ids.clear();
        if key.frames.is_empty() {
            location_ids.push(table.no_python_location());
        }
        for &id in key.frames.iter().rev() {
            location_ids.push(table.frame_location(profile, id));
        }
        message.clear();
        wire::packed(&mut message, field::SAMPLE_LOCATION_ID, &location_ids);
        let value = i64::try_from(count).unwrap_or(i64::MAX);
        wire::packed(&mut message, field::SAMPLE_VALUE, &[value as u64]);
        for (k, v) in labels(key) {
            if k.is_empty() || v.is_empty() {
                continue;
            }
            label.clear();
            wire::uint(&mut label, field::LABEL_KEY, table.strings.intern(&k));
            wire::uint(&mut label, field::LABEL_STR, table.strings.intern(&v));
            wire::bytes(&mut message, field::SAMPLE_LABEL, &label);
        }
        out.message(field::PROFILE_SAMPLE, &message)?;
    }

    let mut line = Vec::new();
    for (index, &(function_id, line_number)) in table.locations.iter().enumerate() {
        line.clear();
        wire::uint(&mut line, field::LINE_FUNCTION_ID, function_id);
        wire::uint(&mut line, field::LINE_LINE, u64::from(line_number));
        message.clear();
        wire::uint(&mut message, field::LOCATION_ID, index as u64 + 1);
        wire::bytes(&mut message, field::LOCATION_LINE, &line);
        out.message(field::PROFILE_LOCATION, &message)?;
    }
    for (index, &(name, file)) in table.functions.iter().enumerate() {
        message.clear();
        wire::uint(&mut message, field::FUNCTION_ID, index as u64 + 1);
        wire::uint(&mut message, field::FUNCTION_NAME, name);
        wire::uint(&mut message, field::FUNCTION_FILENAME, file);
        out.message(field::PROFILE_FUNCTION, &message)?;
    }

    // Every string is interned before the table is written: the period type's now.
    value_type(&mut table.strings, &mut message, PERIOD_TYPE);
    let period_type = std::mem::take(&mut message);
    for s in &table.strings.strings {
        out.message(field::PROFILE_STRING_TABLE, s.as_bytes())?;
    }
    out.int(field::PROFILE_TIME_NANOS, timing.start_unix_nanos)?;
    out.int(field::PROFILE_DURATION_NANOS, timing.duration_nanos)?;
    out.message(field::PROFILE_PERIOD_TYPE, &period_type)?;
    out.int(field::PROFILE_PERIOD, timing.period_nanos)?;
    out.drain(0)
}

/// A minimal protobuf (proto3) encoder: just what `profile.proto` needs.
///
/// Scalars equal to zero are left out, as proto3 does (a reader cannot tell them from
/// absent ones); length-delimited fields are always written, even when empty.
mod wire {
    /// Wire type of varints.
    const VARINT: u64 = 0;
    /// Wire type of strings, bytes, embedded messages and packed repeated scalars.
    const LEN: u64 = 2;

    /// Appends `value` as a base-128 varint.
    pub fn varint(buf: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            buf.push((value & 0x7f) as u8 | 0x80);
            value >>= 7;
        }
        buf.push(value as u8);
    }

    /// How many bytes [`varint`] takes for `value`.
    pub fn varint_len(value: u64) -> usize {
        let bits = 64 - (value | 1).leading_zeros() as usize;
        bits.div_ceil(7)
    }

    fn key(buf: &mut Vec<u8>, field: u32, wire_type: u64) {
        varint(buf, (u64::from(field) << 3) | wire_type);
    }

    /// A `uint64` field; left out when zero.
    pub fn uint(buf: &mut Vec<u8>, field: u32, value: u64) {
        if value != 0 {
            key(buf, field, VARINT);
            varint(buf, value);
        }
    }

    /// An `int64` field (negative values take ten bytes, as protobuf specifies); left out
    /// when zero.
    pub fn int(buf: &mut Vec<u8>, field: u32, value: i64) {
        uint(buf, field, value as u64);
    }

    /// A length-delimited field (string, bytes or embedded message).
    pub fn bytes(buf: &mut Vec<u8>, field: u32, data: &[u8]) {
        key(buf, field, LEN);
        varint(buf, data.len() as u64);
        buf.extend_from_slice(data);
    }

    /// A packed repeated `uint64`/`int64` field; left out when `values` is empty.
    pub fn packed(buf: &mut Vec<u8>, field: u32, values: &[u64]) {
        if values.is_empty() {
            return;
        }
        let len: usize = values.iter().map(|&v| varint_len(v)).sum();
        key(buf, field, LEN);
        varint(buf, len as u64);
        for &v in values {
            varint(buf, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;

    use flate2::read::GzDecoder;

    use super::*;
    use crate::output::tests::sample_profile;

    /// One decoded protobuf field value.
    #[derive(Debug, Clone)]
    enum Value {
        Varint(u64),
        Bytes(Vec<u8>),
    }

    /// Decodes a varint at `*pos`.
    fn read_varint(data: &[u8], pos: &mut usize) -> u64 {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = data[*pos];
            *pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return value;
            }
        }
        panic!("varint too long");
    }

    /// Decodes one message into `(field number, value)` pairs, in order. Panics on anything
    /// but wire types 0 and 2 (the writer uses no others).
    fn fields(data: &[u8]) -> Vec<(u32, Value)> {
        let mut pos = 0;
        let mut out = Vec::new();
        while pos < data.len() {
            let key = read_varint(data, &mut pos);
            let field = u32::try_from(key >> 3).expect("field number");
            match key & 7 {
                0 => out.push((field, Value::Varint(read_varint(data, &mut pos)))),
                2 => {
                    let len = usize::try_from(read_varint(data, &mut pos)).expect("len");
                    out.push((field, Value::Bytes(data[pos..pos + len].to_vec())));
                    pos += len;
                }
                other => panic!("unexpected wire type {other}"),
            }
        }
        assert_eq!(pos, data.len(), "message overruns");
        out
    }

    fn varint_of(fields: &[(u32, Value)], number: u32) -> u64 {
        let mut result = 0;
        for (field, value) in fields {
            if *field == number {
                match value {
                    Value::Varint(v) => result = *v,
                    Value::Bytes(_) => panic!("field {number} is not a varint"),
                }
            }
        }
        result
    }

    fn messages_of(fields: &[(u32, Value)], number: u32) -> Vec<Vec<u8>> {
        fields
            .iter()
            .filter(|(field, _)| *field == number)
            .map(|(_, value)| match value {
                Value::Bytes(bytes) => bytes.clone(),
                Value::Varint(_) => panic!("field {number} is not length-delimited"),
            })
            .collect()
    }

    /// A repeated scalar, accepting both packed and unpacked encodings.
    fn repeated_of(fields: &[(u32, Value)], number: u32) -> Vec<u64> {
        let mut out = Vec::new();
        for (field, value) in fields {
            if *field == number {
                match value {
                    Value::Varint(v) => out.push(*v),
                    Value::Bytes(bytes) => {
                        let mut pos = 0;
                        while pos < bytes.len() {
                            out.push(read_varint(bytes, &mut pos));
                        }
                    }
                }
            }
        }
        out
    }

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

    fn decode(gzipped: &[u8]) -> Decoded {
        let mut raw = Vec::new();
        GzDecoder::new(gzipped)
            .read_to_end(&mut raw)
            .expect("valid gzip");
        let profile = fields(&raw);
        let strings: Vec<String> = messages_of(&profile, 6)
            .into_iter()
            .map(|bytes| String::from_utf8(bytes).expect("utf-8 string"))
            .collect();
        let string = |index: u64| -> String {
            strings
                .get(usize::try_from(index).expect("index"))
                .expect("string index in range")
                .clone()
        };
        let value_type = |bytes: &[u8]| {
            let f = fields(bytes);
            (string(varint_of(&f, 1)), string(varint_of(&f, 2)))
        };

        // Function id → (name, file).
        let mut functions = BTreeMap::new();
        for bytes in messages_of(&profile, 5) {
            let f = fields(&bytes);
            let id = varint_of(&f, 1);
            assert_ne!(id, 0, "function ids are non-zero");
            assert_eq!(varint_of(&f, 3), 0, "no system_name");
            let previous =
                functions.insert(id, (string(varint_of(&f, 2)), string(varint_of(&f, 4))));
            assert!(previous.is_none(), "duplicate function id {id}");
        }
        // Location id → (function, file, line).
        let mut locations = BTreeMap::new();
        for bytes in messages_of(&profile, 4) {
            let f = fields(&bytes);
            let id = varint_of(&f, 1);
            assert_ne!(id, 0, "location ids are non-zero");
            assert_eq!(varint_of(&f, 2), 0, "no mapping");
            let lines = messages_of(&f, 4);
            assert_eq!(lines.len(), 1, "one line per location");
            let line = fields(&lines[0]);
            let (name, file) = functions
                .get(&varint_of(&line, 1))
                .expect("line names a function")
                .clone();
            let number = varint_of(&line, 2) as i64;
            let previous = locations.insert(id, (name, file, number));
            assert!(previous.is_none(), "duplicate location id {id}");
        }
        let samples = messages_of(&profile, 2)
            .iter()
            .map(|bytes| {
                let f = fields(bytes);
                let frames = repeated_of(&f, 1)
                    .into_iter()
                    .map(|id| locations.get(&id).expect("location exists").clone())
                    .collect();
                let labels = messages_of(&f, 3)
                    .iter()
                    .map(|label| {
                        let l = fields(label);
                        assert_eq!(varint_of(&l, 3), 0, "no num");
                        (string(varint_of(&l, 1)), string(varint_of(&l, 2)))
                    })
                    .collect();
                (frames, repeated_of(&f, 2), labels)
            })
            .collect();
        let period_types = messages_of(&profile, 11);
        assert_eq!(period_types.len(), 1);
        Decoded {
            sample_types: messages_of(&profile, 1)
                .iter()
                .map(|b| value_type(b))
                .collect(),
            period_type: value_type(&period_types[0]),
            period: varint_of(&profile, 12),
            time_nanos: varint_of(&profile, 9),
            duration_nanos: varint_of(&profile, 10),
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
        assert_eq!(decoded.sample_types, pairs(&[("samples", "count")]));
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
        assert_eq!(decoded.samples, expected);
        let total: u64 = decoded.samples.iter().map(|(_, v, _)| v[0]).sum();
        assert_eq!(total, sample_profile().total_samples());
    }

    #[test]
    fn same_function_different_lines_share_the_function() {
        let mut p = Profile::new();
        let intern = |p: &mut Profile, function: &str, file: &str, line| {
            p.intern(crate::aggregate::FrameName {
                function: function.into(),
                file: file.into(),
                line,
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

    #[test]
    fn huge_counts_are_clamped() {
        let mut p = Profile::new();
        p.add(1, None, &[], u64::MAX);
        let decoded = decode(&written(&p, &Timing::default()));
        assert_eq!(decoded.samples[0].1, vec![i64::MAX as u64]);
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
    fn many_stacks_cross_chunk_boundaries() {
        let mut p = Profile::new();
        let ids: Vec<FrameId> = (0..300)
            .map(|i| {
                p.intern(crate::aggregate::FrameName {
                    function: format!("function_number_{i}").into(),
                    file: "/a/rather/long/path/to/some/module.py".into(),
                    line: i,
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

    #[test]
    fn varints() {
        for value in [
            0,
            1,
            127,
            128,
            300,
            16383,
            16384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            wire::varint(&mut buf, value);
            assert_eq!(buf.len(), wire::varint_len(value), "{value}");
            let mut pos = 0;
            assert_eq!(read_varint(&buf, &mut pos), value);
        }
        let mut buf = Vec::new();
        wire::varint(&mut buf, 300);
        assert_eq!(buf, [0xac, 0x02]);
        let mut buf = Vec::new();
        wire::int(&mut buf, 1, -1);
        assert_eq!(buf.len(), 11, "negative int64 is a ten-byte varint");
    }
}
