//! Interpreter layouts: where CPython keeps what a stack walk needs, per version.
//!
//! The facts are data, kept apart from the walking logic (as py-spy does):
//! - `tables` holds the layouts of 3.8-3.12 and the few fields 3.13+ does not publish;
//! - `debug_offsets` decodes `_Py_DebugOffsets`, which 3.13+ embeds at the start of
//!   `_PyRuntime`, and is the source of truth for those versions.
//!
//! A `PythonLayout` is complete: the kernel part (`ThreadLayout`, `FrameLayout`) goes into the
//! BPF map as plain numbers; the rest is used by userspace to complete and symbolize stacks.

pub mod awaits;
pub mod code_generation;
pub mod debug_offsets;
pub mod exception;
pub mod gc;
pub mod gil;
pub mod inspection;
pub mod published;
pub mod tables;
pub mod threading;

use profiler_common::{FrameLayout, ThreadLayout};

/// A CPython version, as `PY_VERSION_HEX` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
}

impl Version {
    pub const fn new(major: u8, minor: u8, micro: u8) -> Self {
        Self { major, minor, micro }
    }

    /// From `PY_VERSION_HEX` (0xMMmmppRS).
    pub fn from_hex(hex: u64) -> Self {
        Self { major: (hex >> 24) as u8, minor: (hex >> 16) as u8, micro: (hex >> 8) as u8 }
    }

    /// (major, minor): layouts are keyed by minor version.
    pub fn minor_key(&self) -> (u8, u8) {
        (self.major, self.minor)
    }

    /// Whether this version's `_PyRuntime` starts with `_Py_DebugOffsets` (3.13+), the source
    /// of its layouts.
    pub fn publishes_debug_offsets(&self) -> bool {
        self.minor >= 13
    }
}

/// The oldest CPython pyperch reads.
pub const OLDEST_SUPPORTED: Version = Version::new(3, 8, 0);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

/// The three encodings of the instruction-to-line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.8, 3.9: `co_lnotab`, pairs of (u8 byte step, i8 line step).
    Lnotab,
    /// 3.10: `co_linetable`, pairs of (u8 byte step, i8 line step, -128 = no line).
    PairTable,
    /// 3.11+: `co_linetable`, the location table (varint entries).
    LocationTable,
}

/// Code object fields (offsets from the code object address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    /// Size to read from a code object: covers every offset here (and `co_code_adaptive`).
    pub size: u32,
    pub filename: u32,
    pub name: u32,
    /// `co_qualname` (3.11+); older versions only have `co_name`.
    pub qualname: Option<u32>,
    /// `int co_firstlineno`.
    pub firstlineno: u32,
    /// `co_lnotab` (3.8, 3.9) or `co_linetable` (3.10+): a bytes object.
    pub linetable: u32,
    pub line_format: LineTableFormat,
    /// `int _co_firsttraceable` (3.11+): frames before it are not yet visible to Python.
    pub firsttraceable: Option<u32>,
    /// `uint32_t co_version` (3.12+): set once per code object from the interpreter's
    /// function-version counter, which never repeats (it stops at 0 when exhausted).
    pub version: Option<u32>,
}

/// Layout of the objects we decode: every object's type pointer, `str` and `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectLayout {
    pub ob_type: u32,
    pub str_length: u32,
    pub str_state: u32,
    /// Where the characters of a compact ASCII string start.
    pub str_ascii_data: u32,
    /// Where the characters of a compact non-ASCII string start.
    pub str_compact_data: u32,
    pub bytes_size: u32,
    pub bytes_data: u32,
    /// A free-threaded build's objects (PEP 703): a `str`'s state bits sit one byte higher
    /// (`interned` is a whole byte) and a type's `tp_flags` 16 bytes further.
    pub free_threaded: bool,
}

/// A free-threaded object head (PEP 703): `ob_tid` (0), `ob_flags`, `ob_mutex`, `ob_gc_bits`,
/// then `uint32_t ob_ref_local` (0x0c) and `Py_ssize_t ob_ref_shared` (0x10), whose low two
/// bits are flags; `ob_type` at 0x18 (CPython 3.14's `Include/object.h`).
const FT_REF_LOCAL: usize = 0x0c;
const FT_REF_SHARED: usize = 0x10;

impl ObjectLayout {
    /// Whether an object's head (`head`: its first bytes, through `ob_type`) holds the
    /// reference count of a live object. A freed object's first word is the allocator's
    /// free-list link: in a default build that is the count's word, so it must lie in
    /// `1..below` (a live count never reaches an address); in a free-threaded build a freed
    /// object's counts are both spent (its owner's count 0, the shared count not above 0),
    /// whereas a live object holds a reference in one of them.
    pub fn live_count(&self, head: &[u8], below: u64) -> bool {
        use crate::target::memory::{field_u32, field_u64};
        if self.free_threaded {
            let local = field_u32(head, FT_REF_LOCAL);
            let shared = field_u64(head, FT_REF_SHARED).map(|w| w as i64);
            return match (local, shared) {
                (Some(local), Some(shared)) => local != 0 || shared >> 2 > 0,
                _ => false,
            };
        }
        field_u64(head, 0).is_some_and(|n| (1..below).contains(&n))
    }

    /// Free-threaded CPython 3.14t's (3.14.7t's `_Py_DebugOffsets` and DWARF), for unit tests.
    #[cfg(test)]
    pub(crate) const TEST_314T: ObjectLayout = ObjectLayout {
        free_threaded: true,
        ob_type: 0x18,
        str_length: 0x20,
        str_state: 0x30,
        str_ascii_data: 0x38,
        str_compact_data: 0x48,
        bytes_size: 0x20,
        bytes_data: 0x30,
    };

    /// CPython 3.12-3.15's (default build), for unit tests that build objects by hand.
    #[cfg(test)]
    pub(crate) const TEST_312: ObjectLayout = ObjectLayout {
        free_threaded: false,
        ob_type: 8,
        str_length: 0x10,
        str_state: 0x20,
        str_ascii_data: 0x28,
        str_compact_data: 0x38,
        bytes_size: 0x10,
        bytes_data: 0x20,
    };
}

/// What a frame's `owner` and instruction position mean in this version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameSemantics {
    /// `FRAME_OWNED_BY_GENERATOR` (3.11+).
    pub owner_generator: Option<u8>,
    /// Frames with `owner >= shim_owner` are interpreter shims / C-stack entries / the 3.15
    /// base sentinel, never shown (3.12+).
    pub shim_owner: Option<u8>,
    /// True when the position is the *last executed* instruction (3.11, 3.12 `prev_instr`),
    /// false when it is the current one (3.13+ `instr_ptr`) or `f_lasti` (3.8-3.10).
    pub position_is_previous: bool,
}

/// Everything needed to find, walk and symbolize the stacks of one interpreter version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonLayout {
    pub version: Version,
    /// A free-threaded build (PEP 703; `_Py_DebugOffsets.free_threaded`): its object header
    /// is 32 bytes and every object field moves by 16.
    pub free_threaded: bool,
    /// Where a free-threaded build keeps its threads' bytecode copies (`None` elsewhere).
    pub tlbc: Option<TlbcLayout>,
    /// Offset of `interpreters.head` in `_PyRuntime`.
    pub interpreters_head: u32,
    /// Offset in `_PyRuntime` of the `int` pthread key of `autoTSSkey` (3.8-3.14), if any.
    pub pthread_key: Option<u32>,
    pub thread: ThreadLayout,
    pub frame: FrameLayout,
    pub frame_semantics: FrameSemantics,
    pub code: CodeLayout,
    pub objects: ObjectLayout,
}

/// Where a free-threaded build keeps its threads' bytecode copies (all from the target's
/// own `_Py_DebugOffsets`; read by `symbolize::tlbc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlbcLayout {
    /// `co_tlbc` in the code object: a `_PyCodeArray *`, `{Py_ssize_t size; char *entries[]}`.
    pub code_tlbc: u32,
    /// `co_code_adaptive` in the code object: what the kernel's offsets are relative to.
    pub code_adaptive: u32,
    /// `ob_size` of the code object (its bytecode's length in 2-byte code units).
    pub code_size: u32,
    /// `tlbc_indices.tlbc_generation` (`uint32_t`) in `PyInterpreterState`.
    pub generation: u32,
    /// `next` in `PyInterpreterState`.
    pub interp_next: u32,
}

/// Offset of the cached hash (`Py_hash_t`) in every `str` object, 3.8-3.15 default builds; it
/// directly follows the length (`ObjectLayout::str_length`), so one 16-byte read gets both.
pub const STR_HASH_OFFSET: u32 = 0x18;

/// The code-object window the validation word is computed from (`profiler_common::code_check`):
/// `(start, size)`, 8-aligned, covering `co_firstlineno`, `co_filename`, `co_name` and
/// `co_version` (3.12+). Without `co_version` (3.8-3.11) it also reaches `co_linetable`, so
/// that every immutable pointer from `co_firstlineno` to the line table takes part. Every word
/// in it is immutable for the code object's life (checked per version in the tests: the
/// fields between are counts, `co_version` and object pointers set at creation).
pub fn check_window(code: &CodeLayout) -> (u32, u32) {
    let mut fields = vec![(code.firstlineno, 4), (code.filename, 8), (code.name, 8)];
    match code.version {
        Some(v) => fields.push((v, 4)),
        None => fields.push((code.linetable, 8)),
    }
    let start = fields.iter().map(|(o, _)| *o).min().unwrap_or(0) & !7;
    let end = fields.iter().map(|(o, w)| o + w).max().unwrap_or(0);
    (start, ((end - start) + 7) & !7)
}

impl PythonLayout {
    /// The frame layout the kernel uses: `frame` plus where the validation word's fields are.
    pub fn kernel_frame_layout(&self) -> FrameLayout {
        let (start, size) = check_window(&self.code);
        let fits = (size as usize) < profiler_common::FRAME_READ_MAX;
        FrameLayout {
            check_start: start,
            // A window that does not fit is refused when the layout is built (see
            // `debug_offsets`, and the tables' tests); never read past the buffer here.
            check_size: if fits { size } else { 0 },
            check_name: self.code.name - start,
            check_filename: self.code.filename - start,
            check_version: self.code.version.map_or(profiler_common::NO_FIELD, |v| v - start),
            check_str: self.objects.str_length,
            shim_owner: self.frame_semantics.shim_owner.map_or(profiler_common::NO_FIELD, u32::from),
            // Snapshots only when the code object's fields fit the kernel's region.
            snap_code_size: if (self.code.size as usize) < profiler_common::SNAP_CODE_MAX - 8 { self.code.size } else { 0 },
            snap_name: self.code.qualname.unwrap_or(self.code.name),
            snap_filename: self.code.filename,
            snap_linetable: self.code.linetable,
            snap_str_ascii: self.objects.str_ascii_data,
            snap_str_compact: self.objects.str_compact_data,
            snap_bytes_size: self.objects.bytes_size,
            snap_bytes_data: self.objects.bytes_data,
            ..self.frame
        }
    }
}
