//! The messages of pprof's `profile.proto` (github.com/google/pprof, `proto/profile.proto`,
//! package `perftools.profiles`; a copy is in tests/fixtures/profile.proto), declared for
//! the `prost` protobuf crate.
//!
//! Why hand-declared structs rather than code generated at build time: the schema is small,
//! stable (proto3, unchanged field numbers since its publication) and needs no imports, so
//! `#[derive(prost::Message)]` structs written from it keep the build free of any protobuf
//! compiler (neither `protoc` nor a pure-Rust one such as `protox`) and of a build script.
//! `prost` does all of the encoding. Every message and field of the schema is declared, with
//! the schema's field number and protobuf type; fields pyperch does not fill stay at their
//! default and, as proto3 specifies, are not written. Repeated scalars are packed (proto3's
//! default).

/// `message Profile`: the whole profile.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each value of a sample means (type and unit, as string-table indices).
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples: a stack (leaf first) with one value per sample type.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Binary mappings (none for Python code).
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Code locations referenced by samples.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions referenced by locations.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile; index 0 must be `""`.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regular expression (string index) of frames to drop.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regular expression (string index) of frames to keep.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// When the profile was collected, in nanoseconds since the Unix epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long the profile covers, in nanoseconds.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// What one sampling event stands for.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// How much of `period_type` lies between two sampling events.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The sample type to show by default (string index of its type).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `message ValueType`: a type and a unit, both string-table indices.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// String index of the type (`samples`, `cpu`, ...).
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// String index of the unit (`count`, `nanoseconds`, ...).
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `message Sample`: one stack and its values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Location ids, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per `Profile.sample_type`, in the same order.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels of this sample.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `message Label`: a string (`str`) or numeric (`num`) label of a sample.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// String index of the key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String index of the value (string labels).
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// The value (numeric labels).
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// String index of the unit of `num`.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `message Mapping`: a mapped binary.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Unique non-zero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Start address of the mapping.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End address of the mapping.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// Offset in the file of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// String index of the file's path.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// String index of the build id.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Whether function names are known.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Whether file names are known.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Whether line numbers are known.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Whether inlined frames are known.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `message Location`: a code location, with its (possibly inlined) lines.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique non-zero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Id of the mapping holding `address` (0: none).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Instruction address (0: none).
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// The lines of this location, innermost (inlined) first.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Whether the location stands for several folded frames.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// `message Line`: a function and a line in it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// Id of the function.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number in the source file (0: unknown).
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Column number (0: unknown).
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// `message Function`: a function of the source code.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Unique non-zero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// String index of the name shown to people.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// String index of the name as the system knows it (mangled).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// String index of the source file's path.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// Line where the function starts.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
