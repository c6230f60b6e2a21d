//! Decoding of `_Py_DebugOffsets`, the table of offsets CPython 3.13+ embeds at the start of
//! `_PyRuntime` for out-of-process readers.
//!
//! Encoding: `char cookie[8] = "xdebugpy"`, `u64 version` (`PY_VERSION_HEX`),
//! `u64 free_threaded`, then little-endian `u64` fields in declaration order. The order is
//! different in every minor version, so each has its own field list ([`FIELD_LISTS`]). The
//! structure is statically initialised: it can be read from the ELF file as well as from a
//! running process.
//!
//! Invariants of a [`DebugOffsets`] value: its cookie matched, its version has a field list,
//! it is a free-threaded build only where pyperch knows one (3.14), and every offset later
//! used lies inside its group's `size` (itself below a sane bound). [`DebugOffsets::layout`]
//! (in `layout.rs`) adds the facts of `tables::extras_for` and checks that the frame fields
//! fit in one kernel read.

mod layout;

use profiler_common::FRAME_READ_MAX;

use super::tables;
use super::{PythonLayout, Version};
#[cfg(test)]
use super::ObjectLayout;
#[cfg(test)]
use profiler_common::{ThreadLayout, instr_kind};

/// The first 8 bytes of `_Py_DebugOffsets` (no NUL).
pub const COOKIE: &[u8; 8] = b"xdebugpy";
/// Cookie, `version`, `free_threaded`.
pub const HEADER_SIZE: usize = 24;

/// A group of fields: its name and the names of its `u64` fields, in declaration order.
type Group = (&'static str, &'static [&'static str]);

/// The encoding of one minor version.
#[derive(Debug)]
pub struct FieldList {
    pub minor: u8,
    /// The first `PY_VERSION_HEX` with this encoding (pre-releases before it differ).
    pub min_hex: u64,
    pub groups: &'static [Group],
}

impl FieldList {
    /// Number of `u64` fields after the header.
    pub const fn field_count(&self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.groups.len() {
            n += self.groups[i].1.len();
            i += 1;
        }
        n
    }

    /// `sizeof(_Py_DebugOffsets)` for this version.
    pub const fn encoded_size(&self) -> usize {
        HEADER_SIZE + 8 * self.field_count()
    }
}

const RUNTIME_STATE: Group = ("runtime_state", &["size", "finalizing", "interpreters_head"]);
const INTERP_3_13: Group = (
    "interpreter_state",
    &[
        "size",
        "id",
        "next",
        "threads_head",
        "gc",
        "imports_modules",
        "sysdict",
        "builtins",
        "ceval_gil",
        "gil_runtime_state",
        "gil_runtime_state_enabled",
        "gil_runtime_state_locked",
        "gil_runtime_state_holder",
    ],
);
const INTERP_3_14: Group = (
    "interpreter_state",
    &[
        "size",
        "id",
        "next",
        "threads_head",
        "threads_main",
        "gc",
        "imports_modules",
        "sysdict",
        "builtins",
        "ceval_gil",
        "gil_runtime_state",
        "gil_runtime_state_enabled",
        "gil_runtime_state_locked",
        "gil_runtime_state_holder",
        "code_object_generation",
        "tlbc_generation",
    ],
);
const THREAD_3_13: Group = (
    "thread_state",
    &["size", "prev", "next", "interp", "current_frame", "thread_id", "native_thread_id", "datastack_chunk", "status"],
);
const THREAD_3_15: Group = (
    "thread_state",
    &[
        "size",
        "prev",
        "next",
        "interp",
        "current_frame",
        "base_frame",
        "last_profiled_frame",
        "last_profiled_frame_seq",
        "thread_id",
        "native_thread_id",
        "datastack_chunk",
        "status",
        "holds_gil",
        "gil_requested",
        "current_exception",
        "exc_state",
    ],
);
const ERR_STACKITEM: Group = ("err_stackitem", &["exc_value"]);
const FRAME_3_13: Group =
    ("interpreter_frame", &["size", "previous", "executable", "instr_ptr", "localsplus", "owner"]);
const FRAME_3_14: Group = (
    "interpreter_frame",
    &["size", "previous", "executable", "instr_ptr", "localsplus", "owner", "stackpointer", "tlbc_index"],
);
const CODE_3_13: &[&str] = &[
    "size",
    "filename",
    "name",
    "qualname",
    "linetable",
    "firstlineno",
    "argcount",
    "localsplusnames",
    "localspluskinds",
    "co_code_adaptive",
];
const CODE_3_14: &[&str] = &[
    "size",
    "filename",
    "name",
    "qualname",
    "linetable",
    "firstlineno",
    "argcount",
    "localsplusnames",
    "localspluskinds",
    "co_code_adaptive",
    "co_tlbc",
];
const PYOBJECT: Group = ("pyobject", &["size", "ob_type"]);
const TYPE_3_13: Group = ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]);
const TYPE_3_15: Group = ("type_object", &["size", "tp_name", "tp_repr", "tp_flags", "tp_basicsize", "tp_dictoffset"]);
const HEAP_TYPE: Group = ("heap_type_object", &["size", "ht_cached_keys"]);
const TUPLE: Group = ("tuple_object", &["size", "ob_item", "ob_size"]);
const LIST: Group = ("list_object", &["size", "ob_item", "ob_size"]);
const SET: Group = ("set_object", &["size", "used", "table", "mask"]);
const DICT: Group = ("dict_object", &["size", "ma_keys", "ma_values"]);
const FLOAT: Group = ("float_object", &["size", "ob_fval"]);
const LONG: Group = ("long_object", &["size", "lv_tag", "ob_digit"]);
const BYTES: Group = ("bytes_object", &["size", "ob_size", "ob_sval"]);
const UNICODE_3_13: Group = ("unicode_object", &["size", "state", "length", "asciiobject_size"]);
const UNICODE_3_15: Group =
    ("unicode_object", &["size", "state", "length", "asciiobject_size", "compactunicodeobject_size"]);
const GC_3_13: Group = ("gc", &["size", "collecting"]);
const GC_3_15: Group = ("gc", &["size", "collecting", "frame", "generation_stats_size", "generation_stats"]);
const GEN: Group = ("gen_object", &["size", "gi_name", "gi_iframe", "gi_frame_state"]);
const LLIST_NODE: Group = ("llist_node", &["next", "prev"]);
const DEBUGGER_SUPPORT: Group = (
    "debugger_support",
    &[
        "eval_breaker",
        "remote_debugger_support",
        "remote_debugging_enabled",
        "debugger_pending_call",
        "debugger_script_path",
        "debugger_script_path_size",
    ],
);

/// The known encodings. Sizes: 0x248 (3.13), 0x2f8 (3.14), 0x378 (3.15).
pub static FIELD_LISTS: &[FieldList] = &[
    FieldList {
        minor: 13,
        min_hex: 0x030d_00f0,
        groups: &[
            RUNTIME_STATE,
            INTERP_3_13,
            THREAD_3_13,
            FRAME_3_13,
            ("code_object", CODE_3_13),
            PYOBJECT,
            TYPE_3_13,
            TUPLE,
            LIST,
            DICT,
            FLOAT,
            LONG,
            BYTES,
            UNICODE_3_13,
            GC_3_13,
        ],
    },
    FieldList {
        minor: 14,
        min_hex: 0x030e_00f0,
        groups: &[
            RUNTIME_STATE,
            INTERP_3_14,
            THREAD_3_13,
            FRAME_3_14,
            ("code_object", CODE_3_14),
            PYOBJECT,
            TYPE_3_13,
            TUPLE,
            LIST,
            SET,
            DICT,
            FLOAT,
            LONG,
            BYTES,
            UNICODE_3_13,
            GC_3_13,
            GEN,
            LLIST_NODE,
            DEBUGGER_SUPPORT,
        ],
    },
    FieldList {
        minor: 15,
        // `last_profiled_frame_seq` arrived in 3.15.0b4 and moved every later field.
        min_hex: 0x030f_00b4,
        groups: &[
            RUNTIME_STATE,
            INTERP_3_14,
            THREAD_3_15,
            ERR_STACKITEM,
            FRAME_3_14,
            ("code_object", CODE_3_14),
            PYOBJECT,
            TYPE_3_15,
            HEAP_TYPE,
            TUPLE,
            LIST,
            SET,
            DICT,
            FLOAT,
            LONG,
            BYTES,
            UNICODE_3_15,
            GC_3_15,
            GEN,
            LLIST_NODE,
            DEBUGGER_SUPPORT,
        ],
    },
];

/// The largest encoding: reading this many bytes from `_PyRuntime` is always enough.
pub const MAX_ENCODED_SIZE: usize = {
    let mut max = 0;
    let mut i = 0;
    while i < FIELD_LISTS.len() {
        let size = FIELD_LISTS[i].encoded_size();
        if size > max {
            max = size;
        }
        i += 1;
    }
    max
};

#[derive(Debug, thiserror::Error)]
pub enum DebugOffsetsError {
    #[error("no _Py_DebugOffsets: the runtime starts with {found:02x?}, not the cookie \"xdebugpy\"")]
    BadCookie { found: Vec<u8> },
    #[error("_Py_DebugOffsets of CPython {version_hex:#x} needs {need} bytes but only {got} were read")]
    Truncated { version_hex: u64, need: usize, got: usize },
    #[error(
        "CPython {version} (version word {version_hex:#x}) has no known _Py_DebugOffsets layout (known: 3.13, 3.14, 3.15)"
    )]
    UnknownVersion { version: Version, version_hex: u64 },
    #[error(
        "CPython pre-release {version_hex:#x} predates the known _Py_DebugOffsets layout of 3.{minor} (from {min_hex:#x} on)"
    )]
    PreRelease { version_hex: u64, minor: u8, min_hex: u64 },
    #[error("free-threaded builds are not supported yet (CPython {version} reports free_threaded = {flag})")]
    FreeThreaded { version: Version, flag: u64 },
    #[error("_Py_DebugOffsets of CPython {version} has free_threaded = {flag:#x}, neither 0 nor 1: the data looks corrupt")]
    BadFreeThreaded { version: Version, flag: u64 },
    #[error(
        "_Py_DebugOffsets of CPython {version} has {field} = {value:#x}, beyond its bound {limit:#x}: the data looks corrupt"
    )]
    OutOfRange { version: Version, field: String, value: u64, limit: u64 },
    #[error("_Py_DebugOffsets of CPython {version} has no field {field} (a bug in pyperch's field list)")]
    MissingField { version: Version, field: String },
    #[error("CPython {version} is missing from pyperch's table of facts not in _Py_DebugOffsets")]
    NoExtras { version: Version },
}

/// Whether `bytes` starts with the `_Py_DebugOffsets` cookie.
pub fn has_cookie(bytes: &[u8]) -> bool {
    bytes.get(..COOKIE.len()) == Some(COOKIE.as_slice())
}

/// The `version` word, if `bytes` starts with the cookie.
pub fn peek_version(bytes: &[u8]) -> Option<Version> {
    if !has_cookie(bytes) {
        return None;
    }
    crate::target::memory::field_u64(bytes, 8).map(Version::from_hex)
}

/// The field list for a minor version.
pub fn field_list(version: Version) -> Option<&'static FieldList> {
    if version.major != 3 {
        return None;
    }
    FIELD_LISTS.iter().find(|list| list.minor == version.minor)
}

/// A decoded `_Py_DebugOffsets` (see the module docs for its invariants).
#[derive(Clone, Debug)]
pub struct DebugOffsets {
    pub version: Version,
    /// `free_threaded`: 1 for a free-threaded build (PEP 703), else 0.
    pub free_threaded: bool,
    /// `PY_VERSION_HEX`, with release level and serial.
    pub version_hex: u64,
    values: Vec<(&'static str, &'static str, u64)>,
}

/// `offset + width` must not exceed `bound`.
enum Bound {
    /// The `size` field of a group.
    GroupSize(&'static str),
    /// A constant.
    Max(u64),
}

/// One range check: `(group, field, width in bytes, bound)`.
type Check = (&'static str, &'static str, u64, Bound);

/// What is checked before any offset is used. Fields absent in a version are skipped.
const CHECKS: &[Check] = &[
    ("runtime_state", "size", 0, Bound::Max(1 << 24)),
    ("runtime_state", "interpreters_head", 8, Bound::GroupSize("runtime_state")),
    ("interpreter_state", "size", 0, Bound::Max(1 << 24)),
    ("interpreter_state", "next", 8, Bound::GroupSize("interpreter_state")),
    ("interpreter_state", "threads_head", 8, Bound::GroupSize("interpreter_state")),
    ("thread_state", "size", 0, Bound::Max(1 << 16)),
    ("thread_state", "next", 8, Bound::GroupSize("thread_state")),
    ("thread_state", "current_frame", 8, Bound::GroupSize("thread_state")),
    ("thread_state", "thread_id", 8, Bound::GroupSize("thread_state")),
    ("thread_state", "native_thread_id", 8, Bound::GroupSize("thread_state")),
    ("interpreter_frame", "size", 0, Bound::Max(1 << 12)),
    ("interpreter_frame", "previous", 8, Bound::GroupSize("interpreter_frame")),
    ("interpreter_frame", "executable", 8, Bound::GroupSize("interpreter_frame")),
    ("interpreter_frame", "instr_ptr", 8, Bound::GroupSize("interpreter_frame")),
    ("interpreter_frame", "owner", 1, Bound::GroupSize("interpreter_frame")),
    ("interpreter_frame", "previous", 8, Bound::Max(FRAME_READ_MAX as u64 - 1)),
    ("interpreter_frame", "executable", 8, Bound::Max(FRAME_READ_MAX as u64 - 1)),
    ("interpreter_frame", "instr_ptr", 8, Bound::Max(FRAME_READ_MAX as u64 - 1)),
    ("interpreter_frame", "owner", 1, Bound::Max(FRAME_READ_MAX as u64 - 1)),
    ("code_object", "size", 0, Bound::Max(1 << 12)),
    ("code_object", "filename", 8, Bound::GroupSize("code_object")),
    ("code_object", "name", 8, Bound::GroupSize("code_object")),
    ("code_object", "qualname", 8, Bound::GroupSize("code_object")),
    ("code_object", "linetable", 8, Bound::GroupSize("code_object")),
    ("code_object", "firstlineno", 4, Bound::GroupSize("code_object")),
    ("code_object", "co_code_adaptive", 0, Bound::GroupSize("code_object")),
    ("pyobject", "size", 0, Bound::Max(1 << 8)),
    ("pyobject", "ob_type", 8, Bound::GroupSize("pyobject")),
    ("unicode_object", "size", 0, Bound::Max(1 << 8)),
    ("unicode_object", "length", 8, Bound::GroupSize("unicode_object")),
    ("unicode_object", "state", 4, Bound::GroupSize("unicode_object")),
    ("unicode_object", "asciiobject_size", 0, Bound::GroupSize("unicode_object")),
    ("unicode_object", "compactunicodeobject_size", 0, Bound::GroupSize("unicode_object")),
    ("bytes_object", "size", 0, Bound::Max(1 << 8)),
    ("bytes_object", "ob_size", 8, Bound::GroupSize("bytes_object")),
    ("bytes_object", "ob_sval", 0, Bound::GroupSize("bytes_object")),
    // Free-threaded builds' bytecode copies (`symbolize::tlbc`).
    ("interpreter_state", "tlbc_generation", 4, Bound::GroupSize("interpreter_state")),
    ("code_object", "co_tlbc", 8, Bound::GroupSize("code_object")),
    ("tuple_object", "ob_size", 8, Bound::GroupSize("tuple_object")),
];

/// Decodes and checks `_Py_DebugOffsets` from `bytes` (at least [`MAX_ENCODED_SIZE`] bytes
/// read from `_PyRuntime` is always enough; fewer is fine if the version's encoding fits).
pub fn decode(bytes: &[u8]) -> Result<DebugOffsets, DebugOffsetsError> {
    if !has_cookie(bytes) {
        let found = bytes.get(..COOKIE.len()).unwrap_or(bytes).to_vec();
        return Err(DebugOffsetsError::BadCookie { found });
    }
    let header = |offset| crate::target::memory::field_u64(bytes, offset);
    let (Some(version_hex), Some(free_threaded)) = (header(8), header(16)) else {
        return Err(DebugOffsetsError::Truncated {
            version_hex: header(8).unwrap_or(0),
            need: HEADER_SIZE,
            got: bytes.len(),
        });
    };
    let version = Version::from_hex(version_hex);
    let list = field_list(version).ok_or(DebugOffsetsError::UnknownVersion { version, version_hex })?;
    if version_hex < list.min_hex {
        return Err(DebugOffsetsError::PreRelease { version_hex, minor: list.minor, min_hex: list.min_hex });
    }
    if free_threaded > 1 {
        return Err(DebugOffsetsError::BadFreeThreaded { version, flag: free_threaded });
    }
    // The free-threaded builds whose facts outside `_Py_DebugOffsets` pyperch knows.
    if free_threaded == 1 && tables::extras_for(version, true).is_none() {
        return Err(DebugOffsetsError::FreeThreaded { version, flag: free_threaded });
    }
    let need = list.encoded_size();
    if bytes.len() < need {
        return Err(DebugOffsetsError::Truncated { version_hex, need, got: bytes.len() });
    }
    let mut values = Vec::with_capacity(list.field_count());
    let mut offset = HEADER_SIZE;
    for (group, fields) in list.groups {
        for field in *fields {
            let value = crate::target::memory::field_u64(bytes, offset).ok_or(DebugOffsetsError::Truncated {
                version_hex,
                need,
                got: bytes.len(),
            })?;
            values.push((*group, *field, value));
            offset += 8;
        }
    }
    let decoded = DebugOffsets { version, free_threaded: free_threaded == 1, version_hex, values };
    decoded.check()?;
    Ok(decoded)
}

/// Decodes `bytes` and builds the complete layout (see [`DebugOffsets::layout`]).
pub fn layout_from_bytes(bytes: &[u8]) -> Result<PythonLayout, DebugOffsetsError> {
    decode(bytes)?.layout()
}

impl DebugOffsets {
    /// The value of `group.field`, if this version has it.
    pub fn get(&self, group: &str, field: &str) -> Option<u64> {
        self.values.iter().find(|(g, f, _)| *g == group && *f == field).map(|(_, _, v)| *v)
    }

    /// Every field in declaration order, as `(group, field, value)`.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
        self.values.iter().copied()
    }

    fn check(&self) -> Result<(), DebugOffsetsError> {
        for (group, field, width, bound) in CHECKS {
            let Some(value) = self.get(group, field) else { continue };
            let limit = match bound {
                Bound::Max(limit) => *limit,
                Bound::GroupSize(sized) => self.require(sized, "size")?,
            };
            if value.saturating_add(*width) > limit {
                return Err(self.out_of_range(group, field, value, limit));
            }
        }
        Ok(())
    }

    fn out_of_range(&self, group: &str, field: &str, value: u64, limit: u64) -> DebugOffsetsError {
        DebugOffsetsError::OutOfRange { version: self.version, field: format!("{group}.{field}"), value, limit }
    }

    fn require(&self, group: &str, field: &str) -> Result<u64, DebugOffsetsError> {
        self.get(group, field)
            .ok_or_else(|| DebugOffsetsError::MissingField { version: self.version, field: format!("{group}.{field}") })
    }

    /// A required field as a `u32` offset (all checked offsets are far below `u32::MAX`).
    fn offset(&self, group: &str, field: &str) -> Result<u32, DebugOffsetsError> {
        let value = self.require(group, field)?;
        u32::try_from(value).map_err(|_| self.out_of_range(group, field, value, u32::MAX as u64))
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::layout::LineTableFormat;
    use profiler_common::NO_FIELD;

    /// Reads `_Py_DebugOffsets` out of an ELF file: the bytes at the start of `.PyRuntime`.
    /// (A tiny reader on purpose, independent of `discovery`.)
    fn read_from_elf(path: &str) -> Option<Vec<u8>> {
        use object::read::elf::{FileHeader, SectionHeader};
        let data = std::fs::read(path).ok()?;
        let header = object::elf::FileHeader64::<object::Endianness>::parse(data.as_slice()).ok()?;
        let endian = header.endian().ok()?;
        let sections = header.sections(endian, data.as_slice()).ok()?;
        let (_, section) = sections.section_by_name(endian, b".PyRuntime")?;
        let bytes = section.data(endian, data.as_slice()).ok()?;
        Some(bytes.get(..MAX_ENCODED_SIZE)?.to_vec())
    }

    const SID: &str = "/root/.cache/pyperch/sid-rootfs/usr/bin";

    fn load(path: &str) -> Option<Vec<u8>> {
        let bytes = read_from_elf(path);
        if bytes.is_none() {
            eprintln!("skipping: {path} is absent or has no .PyRuntime section");
        }
        bytes
    }

    /// The values of the notes' section 3 column (and 6b) for one version.
    struct Expected {
        interpreters_head: u32,
        threads_head: u32,
        thread_id: u32,
        native_thread_id: u32,
        owner: u32,
        code_adaptive: u32,
        read_size: u32,
        code_mask: u64,
        pthread_key: Option<u32>,
        firsttraceable: u32,
        str_compact_data: u32,
    }

    fn check(bytes: &[u8], minor: u8, e: &Expected) {
        let decoded = decode(bytes).expect("decodes");
        assert_eq!(decoded.version.minor, minor);
        assert_eq!(decoded.fields().count(), field_list(decoded.version).expect("list").field_count());
        let l = decoded.layout().expect("layout");
        assert_eq!(l.interpreters_head, e.interpreters_head);
        assert_eq!(l.pthread_key, e.pthread_key);
        assert_eq!(
            l.thread,
            ThreadLayout {
                frame: 0x48,
                cframe_frame: NO_FIELD,
                native_thread_id: e.native_thread_id,
                thread_id: e.thread_id,
                next: 8,
                interp_threads_head: e.threads_head,
            }
        );
        assert_eq!(
            (l.frame.previous, l.frame.code, l.frame.instr, l.frame.instr_kind, l.frame.owner),
            (0x08, 0x00, 0x38, instr_kind::POINTER, e.owner)
        );
        assert_eq!(l.frame.code_adaptive, e.code_adaptive);
        assert_eq!(l.frame.read_size, e.read_size);
        assert_eq!(l.frame.code_mask, e.code_mask);
        let c = l.code;
        assert_eq!((c.filename, c.name, c.qualname, c.firstlineno, c.linetable), (0x70, 0x78, Some(0x80), 0x44, 0x88));
        assert_eq!(c.firsttraceable, Some(e.firsttraceable));
        assert_eq!(c.line_format, LineTableFormat::LocationTable);
        assert_eq!(c.size, e.code_adaptive);
        assert_eq!(
            l.objects,
            ObjectLayout {
                free_threaded: false,
                ob_type: 8,
                str_length: 0x10,
                str_state: 0x20,
                str_ascii_data: 0x28,
                str_compact_data: e.str_compact_data,
                bytes_size: 0x10,
                bytes_data: 0x20,
            }
        );
        assert_eq!(l.frame_semantics.shim_owner, Some(3));
        assert!(!l.frame_semantics.position_is_previous);
    }

    const EXPECTED_3_13: Expected = Expected {
        interpreters_head: 0x278,
        threads_head: 0x1cb0,
        thread_id: 0x98,
        native_thread_id: 0xa0,
        owner: 0x46,
        code_adaptive: 0xc8,
        read_size: 0x48,
        code_mask: !0,
        pthread_key: Some(0x874),
        firsttraceable: 0xb8,
        str_compact_data: 0x38,
    };

    #[test]
    fn sizes_match_cpython() {
        let sizes: Vec<_> = FIELD_LISTS.iter().map(|l| (l.minor, l.encoded_size())).collect();
        assert_eq!(sizes, [(13, 0x248), (14, 0x2f8), (15, 0x378)]);
        assert_eq!(MAX_ENCODED_SIZE, 0x378);
    }

    #[test]
    fn pyenv_3_13_0() {
        let Some(bytes) = load("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0") else { return };
        check(&bytes, 13, &EXPECTED_3_13);
        let d = decode(&bytes).expect("decodes");
        assert_eq!(d.version_hex, 0x030d_00f0);
        assert_eq!(d.version, Version::new(3, 13, 0));
        assert_eq!(d.get("runtime_state", "size"), Some(0x452b8));
        assert_eq!(d.get("thread_state", "size"), Some(0x130));
        assert_eq!(d.get("interpreter_frame", "size"), Some(0x50));
        assert_eq!(d.get("code_object", "size"), Some(0xd0));
        assert_eq!(d.get("interpreter_state", "gil_runtime_state_enabled"), Some(0));
        assert_eq!(d.get("gc", "collecting"), Some(0xc8));
    }

    #[test]
    fn debian_3_13() {
        let Some(bytes) = load(&format!("{SID}/python3.13")) else { return };
        check(&bytes, 13, &EXPECTED_3_13);
        assert_eq!(decode(&bytes).expect("decodes").get("thread_state", "size"), Some(0x138));
    }

    /// A free-threaded 3.14 built by hand (issue #30), from `PYPERCH_FT_PYTHON`: its own
    /// `_Py_DebugOffsets` with pyperch's free-threaded facts (checked against the build's
    /// DWARF: `_co_firsttraceable` 0xd0, `co_version` 0x6c, `co_tlbc` 0xe0, a compact
    /// non-ASCII `str`'s data at 0x48, the frame's `tlbc_index` 0x48 and `owner` 0x4e).
    #[test]
    fn free_threaded_3_14() {
        let Some(exe) = std::env::var_os("PYPERCH_FT_PYTHON").filter(|p| !p.is_empty()) else {
            eprintln!("skipping: PYPERCH_FT_PYTHON is not set (a hand-built python3.14t)");
            return;
        };
        let exe = std::path::PathBuf::from(exe);
        let lib = exe.parent().and_then(|bin| bin.parent()).map(|root| root.join("lib/libpython3.14t.so.1.0"));
        let bytes = lib
            .as_deref()
            .and_then(|l| read_from_elf(&l.to_string_lossy()))
            .or_else(|| read_from_elf(&exe.to_string_lossy()))
            .expect("PYPERCH_FT_PYTHON's executable or libpython3.14t has a .PyRuntime section");
        let d = decode(&bytes).expect("decodes");
        assert!(d.free_threaded);
        assert_eq!((d.version.major, d.version.minor), (3, 14));
        assert_eq!(d.get("interpreter_frame", "tlbc_index"), Some(0x48));
        assert_eq!(d.get("interpreter_frame", "owner"), Some(0x4e));
        assert_eq!(d.get("code_object", "co_tlbc"), Some(0xe0));
        assert_eq!(d.get("code_object", "co_code_adaptive"), Some(0xe8));
        let l = d.layout().expect("layout");
        assert!(l.free_threaded);
        assert_eq!(l.pthread_key, Some(0x924));
        assert_eq!((l.frame.previous, l.frame.code, l.frame.instr, l.frame.owner), (0x08, 0x00, 0x38, 0x4e));
        assert_eq!((l.frame.read_size, l.frame.code_adaptive, l.frame.code_mask), (0x50, 0xe8, !3));
        assert_eq!(l.frame.tlbc_index, 0x48);
        let c = l.code;
        assert_eq!((c.filename, c.name, c.qualname, c.firstlineno, c.linetable), (0x80, 0x88, Some(0x90), 0x54, 0x98));
        assert_eq!((c.firsttraceable, c.version), (Some(0xd0), Some(0x6c)));
        assert_eq!(l.objects, ObjectLayout::TEST_314T);
        // The validation window covers the same immutable fields as the default build's,
        // 16 bytes further.
        assert_eq!(crate::target::layout::check_window(&l.code), (0x50, 0x40));
        let t = l.tlbc.expect("a free-threaded build's bytecode copies");
        assert_eq!((t.code_tlbc, t.code_adaptive, t.code_size), (0xe0, 0xe8, 0x20));
        let (generation, next) = (d.get("interpreter_state", "tlbc_generation"), d.get("interpreter_state", "next"));
        assert_eq!((Some(u64::from(t.generation)), Some(u64::from(t.interp_next))), (generation, next));
        assert!(t.generation > 0x100, "tlbc_generation lies past the interpreter's head");
        // Its GIL (used with PYTHON_GIL=1): `enabled` first, so `last_holder` and `locked`
        // lie 8 bytes further than in default builds, in a struct 8 bytes longer.
        use crate::target::layout::gil;
        let location = gil::holder_location(d.version, Some(&d));
        assert_eq!(location, Some(gil::GilLocation::InterpreterGil { gil_pointer: 0x10, last_holder: 0x10, locked: 0x18 }));
        let wait = gil::gil_wait_layout(d.version, Some(&bytes));
        assert_eq!((wait.kind, wait.size, wait.at), (profiler_common::gil_wait::INTERP_POINTER, 0xd8, 0x10));
        // The threading registry (DWARF of the same build; managed dict read back with ctypes).
        use crate::target::layout::threading::{AttributeStorage, threading_layout};
        let t = threading_layout(d.version, Some(&d)).expect("a free-threaded 3.14 has a threading layout");
        assert_eq!((t.interp_modules, t.module_dict, t.dict.ma_keys, t.dict.ma_values, t.dict.values_start), (0x1e20, 0x20, 0x30, 0x38, 8));
        assert_eq!(t.attributes, AttributeStorage::ManagedInline { dict: -8, cached_keys: 0x380 });
        assert_eq!((t.type_name, t.type_basicsize, t.type_flags, t.type_dictoffset), (0x28, 0x30, 0xb8, 0x130));
        assert_eq!((t.int_tag, t.int_digits), (Some(0x20), 0x28));
    }

    #[test]
    fn debian_3_14() {
        let Some(bytes) = load(&format!("{SID}/python3.14")) else { return };
        let expected = Expected {
            interpreters_head: 0x328,
            threads_head: 0x1cb0,
            thread_id: 0x98,
            native_thread_id: 0xa0,
            owner: 0x4a,
            code_adaptive: 0xd0,
            read_size: 0x50,
            code_mask: !3,
            pthread_key: Some(0x924),
            firsttraceable: 0xc0,
            str_compact_data: 0x38,
        };
        check(&bytes, 14, &expected);
        let d = decode(&bytes).expect("decodes");
        assert_eq!(d.version_hex, 0x030e_0af0);
        let location = crate::target::layout::gil::holder_location(d.version, Some(&d));
        let want = crate::target::layout::gil::GilLocation::InterpreterGil { gil_pointer: 0x10, last_holder: 0x8, locked: 0x10 };
        assert_eq!(location, Some(want), "the debug offsets' GIL fields agree with the default build's table");
        assert_eq!(d.get("set_object", "mask"), Some(0x20));
        assert_eq!(d.get("gen_object", "gi_iframe"), Some(0x48));
        assert_eq!(d.get("gen_object", "gi_frame_state"), Some(0x43));
        assert_eq!(d.get("debugger_support", "remote_debugging_enabled"), Some(0x1f8c));
        assert_eq!(d.get("debugger_support", "debugger_script_path_size"), Some(0x200));
    }

    #[test]
    fn debian_3_15() {
        let Some(bytes) = load(&format!("{SID}/python3.15")) else { return };
        let expected = Expected {
            interpreters_head: 0x3a8,
            threads_head: 0x1ca8,
            thread_id: 0xb0,
            native_thread_id: 0xb8,
            owner: 0x4a,
            code_adaptive: 0xd0,
            read_size: 0x50,
            code_mask: !3,
            pthread_key: None,
            firsttraceable: 0xc0,
            str_compact_data: 0x38,
        };
        check(&bytes, 15, &expected);
        let d = decode(&bytes).expect("decodes");
        assert_eq!(d.version_hex, 0x030f_02f0);
        assert_eq!(d.get("thread_state", "base_frame"), Some(0x50));
        assert_eq!(d.get("thread_state", "last_profiled_frame_seq"), Some(0x60));
        assert_eq!(d.get("thread_state", "exc_state"), Some(0x120));
        assert_eq!(d.get("heap_type_object", "ht_cached_keys"), Some(0x378));
        assert_eq!(d.get("gc", "generation_stats"), Some(0x68));
        assert_eq!(d.get("debugger_support", "remote_debugger_support"), Some(0x158));
        assert_eq!(d.get("debugger_support", "debugger_script_path_size"), Some(0x200));
    }

    /// A synthetic 3.13.0 encoding with the values of the notes, for the rejection tests.
    fn synthetic_3_13() -> Vec<u8> {
        let values: [u64; 70] = [
            0x452b8, 0x260, 0x278, // runtime_state
            0x2f998, 0x1c68, 0x1c60, 0x1cb0, 0x1ce8, 0x1de8, 0x1dd8, 0x1de0, 0x10, 0x1e48, 0, 0x1e58, 0x1e50, 0x130, 0,
            8, 0x10, 0x48, 0x98, 0xa0, 0xe8, 0x20, // thread_state
            0x50, 8, 0, 0x38, 0x48, 0x46, // interpreter_frame
            0xd0, 0x70, 0x78, 0x80, 0x88, 0x44, 0x34, 0x60, 0x68, 0xc8, // code_object
            0x10, 8, 0x1a0, 0x18, 0x58, 0xa8, 0x20, 0x18, 0x10, 0x28, 0x18, 0x10, 0x30, 0x20, 0x28, 0x18, 0x10, 0x20,
            0x10, 0x18, 0x28, 0x10, 0x20, 0x40, 0x20, 0x10, 0x28, 0xf0, 0xc8,
        ];
        let mut bytes = COOKIE.to_vec();
        bytes.extend(0x030d_00f0u64.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        for v in values {
            bytes.extend(v.to_le_bytes());
        }
        bytes
    }

    fn set(bytes: &mut [u8], offset: usize, value: u64) {
        bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// Byte offset of a field in the 3.13 encoding.
    fn offset_of(group: &str, field: &str) -> usize {
        let list = field_list(Version::new(3, 13, 0)).expect("list");
        let mut offset = HEADER_SIZE;
        for (g, fields) in list.groups {
            for f in *fields {
                if *g == group && *f == field {
                    return offset;
                }
                offset += 8;
            }
        }
        panic!("no field {group}.{field}");
    }

    #[test]
    fn synthetic_decodes_like_pyenv() {
        check(&synthetic_3_13(), 13, &EXPECTED_3_13);
    }

    #[test]
    fn rejects_bad_input() {
        let good = synthetic_3_13();
        assert!(matches!(decode(b"xdebugp"), Err(DebugOffsetsError::BadCookie { .. })));
        assert!(matches!(decode(&[0u8; 0x400]), Err(DebugOffsetsError::BadCookie { .. })));
        assert!(matches!(decode(&good[..0x100]), Err(DebugOffsetsError::Truncated { .. })));
        assert!(matches!(decode(&good[..12]), Err(DebugOffsetsError::Truncated { .. })));

        let mut b = good.clone();
        set(&mut b, 8, 0x030c_01f0);
        assert!(matches!(decode(&b), Err(DebugOffsetsError::UnknownVersion { .. })));
        set(&mut b, 8, 0x0310_00f0);
        assert!(matches!(decode(&b), Err(DebugOffsetsError::UnknownVersion { .. })));
        set(&mut b, 8, 0x030d_00a1);
        assert!(matches!(decode(&b), Err(DebugOffsetsError::PreRelease { .. })));

        let mut b = good.clone();
        set(&mut b, 16, 1);
        let err = decode(&b).expect_err("free-threaded");
        assert!(err.to_string().contains("free-threaded builds are not supported yet"), "{err}");

        let mut b = good.clone();
        set(&mut b, offset_of("interpreter_frame", "owner"), 0x90);
        let err = decode(&b).expect_err("owner out of the frame");
        assert!(matches!(err, DebugOffsetsError::OutOfRange { .. }), "{err}");

        // Inside a (bogus) large frame, but beyond what one kernel read covers.
        let mut b = good.clone();
        set(&mut b, offset_of("interpreter_frame", "size"), 0x400);
        set(&mut b, offset_of("interpreter_frame", "previous"), 0x200);
        let err = decode(&b).expect_err("previous beyond FRAME_READ_MAX");
        assert!(err.to_string().contains("interpreter_frame.previous"), "{err}");

        let mut b = good;
        set(&mut b, offset_of("runtime_state", "interpreters_head"), 1 << 40);
        assert!(matches!(decode(&b), Err(DebugOffsetsError::OutOfRange { .. })));
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::config;

    /// An encoding of a known version, cookie intact, fields mostly plausible offsets.
    fn encoding() -> impl Strategy<Value = Vec<u8>> {
        let field = prop_oneof![8 => 0u64..0x400, 1 => any::<u64>(), 1 => Just(u64::MAX), 1 => 0u64..(1 << 25)];
        (0..FIELD_LISTS.len(), prop::collection::vec(field, MAX_ENCODED_SIZE / 8), any::<u8>(), prop_oneof![3 => Just(0u64), 1 => any::<u64>()], any::<bool>())
            .prop_map(|(i, fields, serial, free_threaded, pre_release)| {
                let list = &FIELD_LISTS[i];
                let version = if pre_release { list.min_hex - 1 } else { list.min_hex | u64::from(serial & 0x0f) };
                let mut bytes = COOKIE.to_vec();
                bytes.extend_from_slice(&version.to_le_bytes());
                bytes.extend_from_slice(&free_threaded.to_le_bytes());
                for value in &fields[..list.field_count()] {
                    bytes.extend_from_slice(&value.to_le_bytes());
                }
                bytes
            })
    }

    proptest! {
        #![proptest_config(config(512))]

        /// A layout built from any table keeps every invariant the kernel and the readers rely on.
        #[test]
        fn fuzz_debug_offsets(mut bytes in encoding(), cut in any::<prop::sample::Index>(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4)) {
            for (at, value) in flips {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            if cut.index(4) == 0 {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            let _ = peek_version(&bytes);
            if let Ok(layout) = layout_from_bytes(&bytes) {
                prop_assert!((layout.frame.read_size as usize) < FRAME_READ_MAX);
                prop_assert!(layout.code.size <= 1 << 12);
                let objects = &layout.objects;
                for offset in [objects.ob_type, objects.str_length, objects.str_state, objects.str_ascii_data, objects.str_compact_data, objects.bytes_size, objects.bytes_data] {
                    prop_assert!(offset <= 1 << 8, "{offset:#x}");
                }
            }
        }

        #[test]
        fn fuzz_debug_offsets_bytes(bytes in prop::collection::vec(any::<u8>(), 0..MAX_ENCODED_SIZE + 16)) {
            let _ = decode(&bytes);
        }
    }
}
