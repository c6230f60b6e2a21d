//! Per-version facts, as data.
//!
//! Two tables live here:
//! - [`LEGACY`]: complete layouts of CPython 3.8-3.12, which publish no offsets of their own.
//!   Rows are keyed by minor version; every offset was checked against the pyenv build named
//!   in the row (see `/work/shared/notes/cpython-internals.md`, sections 2 and 3).
//! - [`EXTRAS`]: the few facts 3.13+ does not carry in `_Py_DebugOffsets` (the pthread key
//!   offset, `_co_firsttraceable`, frame-owner meanings, the line-table format, the tag mask
//!   of the code pointer). `debug_offsets` combines them with the decoded offsets.
//!
//! Invariants of every layout produced here (checked by the tests below):
//! - `frame.read_size` covers `previous`, `code`, `instr` and `owner`, is a multiple of 8 and
//!   is strictly below `FRAME_READ_MAX` (the kernel masks it with `FRAME_READ_MAX - 1`);
//! - `code.size` covers every code-object field listed and reaches `co_code_adaptive`;
//! - `frame.code_adaptive` is 0 exactly when `frame.instr_kind` is not `POINTER`.

use profiler_common::{FRAME_READ_MAX, FrameLayout, NO_FIELD, ThreadLayout, instr_kind};

use super::{CodeLayout, FrameSemantics, LineTableFormat, ObjectLayout, PythonLayout, Version};

/// No tag bits on the code pointer (before 3.14).
pub const CODE_MASK_PLAIN: u64 = !0;
/// `_PyStackRef` tag bits cleared (3.14+).
pub const CODE_MASK_STACKREF: u64 = !3;

/// One row of [`LEGACY`]: the whole layout of one minor version before 3.13.
#[derive(Clone, Copy, Debug)]
pub struct LegacyRow {
    pub minor: u8,
    /// The build these offsets were verified against (for the reader, not the code).
    pub verified_on: &'static str,
    /// The layout; `layout.version.micro` is 0 here and filled in by [`layout_for`].
    pub layout: PythonLayout,
}

/// One row of [`EXTRAS`]: what 3.13+ leaves out of `_Py_DebugOffsets`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extras {
    pub minor: u8,
    /// The row of the free-threaded build of `minor` (PEP 703), whose objects' fields sit 16
    /// bytes further than the default build's.
    pub free_threaded: bool,
    /// Offset in `_PyRuntime` of the `int` key of `autoTSSkey`, or `None` (3.15 has no key).
    pub pthread_key: Option<u32>,
    /// Offset of `int _co_firsttraceable` in a code object.
    pub firsttraceable: u32,
    /// Offset of `uint32_t co_version` in a code object (not in `_Py_DebugOffsets`).
    pub code_version: u32,
    pub frame_semantics: FrameSemantics,
    pub line_format: LineTableFormat,
    /// Applied to the frame's code pointer.
    pub code_mask: u64,
    /// Where a compact non-ASCII `str` keeps its characters, for versions whose
    /// `_Py_DebugOffsets` has no `compactunicodeobject_size` (3.13, 3.14).
    pub str_compact_data: u32,
    pub verified_on: &'static str,
}

/// Position of `f_lasti`/`prev_instr`/`instr_ptr` and width of the value the kernel uses.
const fn instr_width(kind: u32) -> u32 {
    if kind == instr_kind::POINTER { 8 } else { 4 }
}

const fn max(a: u32, b: u32) -> u32 {
    if a > b { a } else { b }
}

/// The smallest 8-byte multiple covering every field the kernel reads from a frame.
pub const fn frame_read_size(previous: u32, code: u32, instr: u32, kind: u32, owner: u32) -> u32 {
    let mut end = max(previous + 8, code + 8);
    end = max(end, instr + instr_width(kind));
    if owner != NO_FIELD {
        end = max(end, owner + 1);
    }
    (end + 7) & !7
}

/// A `FrameLayout` whose `read_size` is derived from its fields.
pub const fn frame_layout(
    previous: u32,
    code: u32,
    instr: u32,
    kind: u32,
    owner: u32,
    code_adaptive: u32,
    code_mask: u64,
) -> FrameLayout {
    FrameLayout {
        read_size: frame_read_size(previous, code, instr, kind, owner),
        previous,
        code,
        instr,
        instr_kind: kind,
        owner,
        code_adaptive,
        // Filled in by `PythonLayout::kernel_frame_layout`, which knows the code layout.
        check_start: 0,
        check_size: 0,
        check_name: NO_FIELD,
        check_filename: NO_FIELD,
        check_version: NO_FIELD,
        check_str: NO_FIELD,
        shim_owner: NO_FIELD,
        code_mask,
        is_entry: NO_FIELD,
        tlbc_index: NO_FIELD,
        // Filled in by `PythonLayout::kernel_frame_layout` too.
        snap_code_size: 0,
        snap_name: 0,
        snap_filename: 0,
        snap_linetable: 0,
        snap_str_ascii: 0,
        snap_str_compact: 0,
        snap_bytes_size: 0,
        snap_bytes_data: 0,
    }
}

/// `layout` with its `is_entry` flag at `offset` (a `bool`), read size grown to cover it.
pub const fn with_is_entry(layout: FrameLayout, offset: u32) -> FrameLayout {
    let read_size = (max(layout.read_size, offset + 1) + 7) & !7;
    FrameLayout { is_entry: offset, read_size, ..layout }
}

/// Bytes to read from a code object: up to `co_code_adaptive` (3.11+) and past every field.
pub const fn code_read_size(
    filename: u32,
    name: u32,
    qualname: Option<u32>,
    firstlineno: u32,
    linetable: u32,
    firsttraceable: Option<u32>,
    code_adaptive: u32,
) -> u32 {
    let mut end = max(filename + 8, name + 8);
    if let Some(q) = qualname {
        end = max(end, q + 8);
    }
    end = max(end, firstlineno + 4);
    end = max(end, linetable + 8);
    if let Some(t) = firsttraceable {
        end = max(end, t + 4);
    }
    end = max(end, code_adaptive);
    (end + 7) & !7
}

#[allow(clippy::too_many_arguments)]
const fn code_layout(
    filename: u32,
    name: u32,
    qualname: Option<u32>,
    firstlineno: u32,
    linetable: u32,
    line_format: LineTableFormat,
    firsttraceable: Option<u32>,
    code_adaptive: u32,
    version: Option<u32>,
) -> CodeLayout {
    CodeLayout {
        size: code_read_size(filename, name, qualname, firstlineno, linetable, firsttraceable, code_adaptive),
        filename,
        name,
        qualname,
        firstlineno,
        linetable,
        line_format,
        firsttraceable,
        version,
    }
}

/// `str`/`bytes` before 3.12: `PyASCIIObject` 0x30 bytes, `PyCompactUnicodeObject` 0x48.
const OBJECTS_UNTIL_3_11: ObjectLayout = ObjectLayout {
    free_threaded: false,
    ob_type: 0x08,
    str_length: 0x10,
    str_state: 0x20,
    str_ascii_data: 0x30,
    str_compact_data: 0x48,
    bytes_size: 0x10,
    bytes_data: 0x20,
};

/// 3.12 dropped `wstr` (and `wstr_length`): 0x28 and 0x38.
const OBJECTS_3_12: ObjectLayout = ObjectLayout { str_ascii_data: 0x28, str_compact_data: 0x38, ..OBJECTS_UNTIL_3_11 };

/// 3.8-3.10: no owner; the position is `f_lasti`.
const SEMANTICS_FRAME_OBJECT: FrameSemantics =
    FrameSemantics { owner_generator: None, shim_owner: None, position_is_previous: false };
/// 3.11: owners THREAD 0, GENERATOR 1, FRAME_OBJECT 2; no shims; `prev_instr`.
const SEMANTICS_3_11: FrameSemantics =
    FrameSemantics { owner_generator: Some(1), shim_owner: None, position_is_previous: true };
/// 3.12: CSTACK 3 marks the entry shim; `prev_instr`.
const SEMANTICS_3_12: FrameSemantics =
    FrameSemantics { owner_generator: Some(1), shim_owner: Some(3), position_is_previous: true };
/// 3.13+: CSTACK (3.13) / INTERPRETER (3.14, 3.15) = 3 and above are shims; `instr_ptr`.
const SEMANTICS_3_13: FrameSemantics =
    FrameSemantics { owner_generator: Some(1), shim_owner: Some(3), position_is_previous: false };

/// 3.8-3.10 thread states: `tstate.frame` points at the `PyFrameObject`; no native id.
const THREAD_UNTIL_3_10: ThreadLayout = ThreadLayout {
    frame: 0x18,
    cframe_frame: NO_FIELD,
    native_thread_id: NO_FIELD,
    thread_id: 0xb0,
    next: 0x08,
    interp_threads_head: 0x08,
};

/// 3.8 and 3.9 share every frame and code offset (`f_lasti` counts bytes).
const fn layout_3_8_or_3_9(minor: u8, pthread_key: u32) -> PythonLayout {
    PythonLayout {
        version: Version::new(3, minor, 0),
        free_threaded: false,
        tlbc: None,
        interpreters_head: 0x20,
        pthread_key: Some(pthread_key),
        thread: THREAD_UNTIL_3_10,
        frame: frame_layout(0x18, 0x20, 0x68, instr_kind::LASTI_BYTES, NO_FIELD, 0, CODE_MASK_PLAIN),
        frame_semantics: SEMANTICS_FRAME_OBJECT,
        code: code_layout(0x68, 0x70, None, 0x28, 0x78, LineTableFormat::Lnotab, None, 0, None),
        objects: OBJECTS_UNTIL_3_11,
    }
}

/// Complete layouts of the versions without `_Py_DebugOffsets`.
pub static LEGACY: &[LegacyRow] = &[
    LegacyRow { minor: 8, verified_on: "pyenv 3.8.18", layout: layout_3_8_or_3_9(8, 0x574) },
    LegacyRow { minor: 9, verified_on: "pyenv 3.9.18", layout: layout_3_8_or_3_9(9, 0x24c) },
    LegacyRow {
        minor: 10,
        verified_on: "pyenv 3.10.13",
        layout: PythonLayout {
            version: Version::new(3, 10, 0),
            free_threaded: false,
            tlbc: None,
            interpreters_head: 0x20,
            pthread_key: Some(0x24c),
            thread: THREAD_UNTIL_3_10,
            // `f_lasti` counts 2-byte code units from 3.10 on.
            frame: frame_layout(0x18, 0x20, 0x60, instr_kind::LASTI_UNITS, NO_FIELD, 0, CODE_MASK_PLAIN),
            frame_semantics: SEMANTICS_FRAME_OBJECT,
            code: code_layout(0x68, 0x70, None, 0x28, 0x78, LineTableFormat::PairTable, None, 0, None),
            objects: OBJECTS_UNTIL_3_11,
        },
    },
    LegacyRow {
        minor: 11,
        verified_on: "pyenv 3.11.7",
        layout: PythonLayout {
            version: Version::new(3, 11, 0),
            free_threaded: false,
            tlbc: None,
            interpreters_head: 0x28,
            pthread_key: Some(0x254),
            // `tstate.cframe` (0x38) -> `_PyCFrame.current_frame` (+0x08).
            thread: ThreadLayout {
                frame: 0x38,
                cframe_frame: 0x08,
                native_thread_id: 0xa0,
                thread_id: 0x98,
                next: 0x08,
                interp_threads_head: 0x10,
            },
            // previous 0x30, f_code 0x20, prev_instr 0x38, owner 0x45, is_entry 0x44.
            frame: with_is_entry(frame_layout(0x30, 0x20, 0x38, instr_kind::POINTER, 0x45, 0xb8, CODE_MASK_PLAIN), 0x44),
            frame_semantics: SEMANTICS_3_11,
            code: code_layout(0x70, 0x78, Some(0x80), 0x48, 0x88, LineTableFormat::LocationTable, Some(0xa8), 0xb8, None),
            objects: OBJECTS_UNTIL_3_11,
        },
    },
    LegacyRow {
        minor: 12,
        verified_on: "pyenv 3.12.1",
        layout: PythonLayout {
            version: Version::new(3, 12, 0),
            free_threaded: false,
            tlbc: None,
            interpreters_head: 0x28,
            pthread_key: Some(0x60c),
            // `tstate.cframe` (0x38) -> `_PyCFrame.current_frame` (+0x00).
            thread: ThreadLayout {
                frame: 0x38,
                cframe_frame: 0x00,
                native_thread_id: 0x90,
                thread_id: 0x88,
                next: 0x08,
                interp_threads_head: 0x48,
            },
            // f_code 0x00, previous 0x08, prev_instr 0x38, owner 0x46.
            frame: frame_layout(0x08, 0x00, 0x38, instr_kind::POINTER, 0x46, 0xc0, CODE_MASK_PLAIN),
            frame_semantics: SEMANTICS_3_12,
            // `co_version` at 0x5c (after `co_nfreevars`): unique per code object.
            code: code_layout(
                0x70,
                0x78,
                Some(0x80),
                0x44,
                0x88,
                LineTableFormat::LocationTable,
                Some(0xb0),
                0xc0,
                Some(0x5c),
            ),
            objects: OBJECTS_3_12,
        },
    },
];

/// What `_Py_DebugOffsets` leaves out, for 3.13+.
pub static EXTRAS: &[Extras] = &[
    Extras {
        minor: 13,
        free_threaded: false,
        pthread_key: Some(0x874),
        firsttraceable: 0xb8,
        code_version: 0x5c,
        frame_semantics: SEMANTICS_3_13,
        line_format: LineTableFormat::LocationTable,
        code_mask: CODE_MASK_PLAIN,
        str_compact_data: 0x38,
        verified_on: "pyenv 3.13.0, Debian 3.13.18",
    },
    Extras {
        minor: 14,
        free_threaded: false,
        pthread_key: Some(0x924),
        firsttraceable: 0xc0,
        code_version: 0x5c,
        frame_semantics: SEMANTICS_3_13,
        line_format: LineTableFormat::LocationTable,
        code_mask: CODE_MASK_STACKREF,
        str_compact_data: 0x38,
        verified_on: "Debian 3.14.10",
    },
    Extras {
        minor: 15,
        free_threaded: false,
        // `autoTSSkey` is gone: the bound thread state is the TLS word `_Py_tss_gilstate`.
        pthread_key: None,
        firsttraceable: 0xc0,
        code_version: 0x5c,
        frame_semantics: SEMANTICS_3_13,
        line_format: LineTableFormat::LocationTable,
        code_mask: CODE_MASK_STACKREF,
        str_compact_data: 0x38,
        verified_on: "Debian 3.15.2",
    },
    Extras {
        minor: 14,
        free_threaded: true,
        pthread_key: Some(0x924),
        // 16 bytes further than the default build's, as every code object field.
        firsttraceable: 0xd0,
        code_version: 0x6c,
        frame_semantics: SEMANTICS_3_13,
        line_format: LineTableFormat::LocationTable,
        code_mask: CODE_MASK_STACKREF,
        str_compact_data: 0x48,
        verified_on: "CPython 3.14.7 built with --disable-gil",
    },
];

/// The complete layout of a CPython 3.8-3.12, or `None` for any other version.
pub fn layout_for(version: Version) -> Option<PythonLayout> {
    if version.major != 3 {
        return None;
    }
    let row = LEGACY.iter().find(|row| row.minor == version.minor)?;
    Some(PythonLayout { version, ..row.layout })
}

/// The facts `_Py_DebugOffsets` does not carry, for a CPython 3.13+ (its free-threaded build
/// if `free_threaded`); `None` if unknown.
pub fn extras_for(version: Version, free_threaded: bool) -> Option<&'static Extras> {
    if version.major != 3 {
        return None;
    }
    EXTRAS.iter().find(|row| row.minor == version.minor && row.free_threaded == free_threaded)
}

/// Whether `frame` satisfies the invariants the kernel relies on (see the module docs).
pub fn frame_layout_is_sane(frame: &FrameLayout) -> bool {
    let needed = frame_read_size(frame.previous, frame.code, frame.instr, frame.instr_kind, frame.owner);
    let kind_known =
        [instr_kind::LASTI_BYTES, instr_kind::LASTI_UNITS, instr_kind::POINTER].contains(&frame.instr_kind);
    let adaptive_ok = (frame.instr_kind == instr_kind::POINTER) == (frame.code_adaptive != 0);
    kind_known
        && adaptive_ok
        && frame.read_size >= needed
        && frame.read_size.is_multiple_of(8)
        && (frame.read_size as usize) < FRAME_READ_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_legacy() -> impl Iterator<Item = PythonLayout> {
        LEGACY.iter().map(|row| layout_for(Version::new(3, row.minor, 1)).expect("row exists"))
    }

    #[test]
    fn layout_for_covers_3_8_to_3_12_only() {
        for minor in 8..=12 {
            let v = Version::new(3, minor, 7);
            assert_eq!(layout_for(v).map(|l| l.version), Some(v), "3.{minor}");
        }
        for v in [Version::new(3, 7, 16), Version::new(3, 13, 0), Version::new(2, 8, 0)] {
            assert!(layout_for(v).is_none(), "{v}");
        }
        for minor in 13..=15 {
            assert!(extras_for(Version::new(3, minor, 0), false).is_some());
        }
        assert!(extras_for(Version::new(3, 12, 0), false).is_none());
        assert!(extras_for(Version::new(3, 16, 0), false).is_none());
    }

    #[test]
    fn frame_read_sizes_are_minimal_and_bounded() {
        let expected = [(8, 0x70), (9, 0x70), (10, 0x68), (11, 0x48), (12, 0x48)];
        for (minor, size) in expected {
            let l = layout_for(Version::new(3, minor, 0)).expect("row");
            assert_eq!(l.frame.read_size, size, "3.{minor}");
            assert!(frame_layout_is_sane(&l.frame), "3.{minor}: {:?}", l.frame);
        }
        // 3.14/3.15 owner at 0x4a.
        assert_eq!(frame_read_size(8, 0, 0x38, instr_kind::POINTER, 0x4a), 0x50);
    }

    #[test]
    fn code_sizes_cover_fields() {
        for l in all_legacy() {
            let c = l.code;
            for end in [c.filename + 8, c.name + 8, c.firstlineno + 4, c.linetable + 8] {
                assert!(end <= c.size, "{}: {end:#x} > {:#x}", l.version, c.size);
            }
            if let Some(q) = c.qualname {
                assert!(q + 8 <= c.size);
            }
            if let Some(t) = c.firsttraceable {
                assert!(t + 4 <= c.size);
            }
            assert!(l.frame.code_adaptive <= c.size);
        }
        let l311 = layout_for(Version::new(3, 11, 7)).expect("row");
        assert_eq!(l311.code.size, 0xb8);
        let l38 = layout_for(Version::new(3, 8, 18)).expect("row");
        assert_eq!(l38.code.size, 0x80);
    }

    /// The validation window of every version: where the notes put `co_firstlineno`,
    /// `co_filename`, `co_name`, `co_linetable` (3.8-3.11) and `co_version` (3.12+), one read
    /// below `FRAME_READ_MAX`, holding only fields set at creation.
    #[test]
    fn check_windows_cover_the_fields_in_one_read() {
        use crate::target::layout::check_window;
        let expected = [(8, (0x28, 0x58)), (9, (0x28, 0x58)), (10, (0x28, 0x58)), (11, (0x48, 0x48)), (12, (0x40, 0x40))];
        for (minor, window) in expected {
            let l = layout_for(Version::new(3, minor, 0)).expect("row");
            assert_eq!(check_window(&l.code), window, "3.{minor}");
            let k = l.kernel_frame_layout();
            assert_eq!((k.check_start, k.check_size), window);
            assert!((k.check_size as usize) < FRAME_READ_MAX);
            assert_eq!(k.check_start + k.check_name, l.code.name);
            assert_eq!(k.check_start + k.check_filename, l.code.filename);
            assert_eq!(k.check_version == NO_FIELD, minor < 12);
            // The (length, hash) pair is read at once: the hash follows the length.
            assert_eq!(k.check_str + 8, crate::target::layout::STR_HASH_OFFSET);
            assert_eq!(k.shim_owner, if minor >= 12 { 3 } else { NO_FIELD });
        }
        for minor in 13..=15 {
            assert_eq!(extras_for(Version::new(3, minor, 0), false).expect("row").code_version, 0x5c);
        }
    }

    #[test]
    fn per_version_facts_match_the_notes() {
        let keys: Vec<_> = all_legacy().map(|l| l.pthread_key).collect();
        assert_eq!(keys, [Some(0x574), Some(0x24c), Some(0x24c), Some(0x254), Some(0x60c)]);
        let l310 = layout_for(Version::new(3, 10, 13)).expect("row");
        assert_eq!(l310.frame.instr_kind, instr_kind::LASTI_UNITS);
        assert_eq!(l310.code.line_format, LineTableFormat::PairTable);
        assert_eq!(l310.thread.native_thread_id, NO_FIELD);
        let l311 = layout_for(Version::new(3, 11, 7)).expect("row");
        assert_eq!((l311.thread.frame, l311.thread.cframe_frame), (0x38, 0x08));
        assert!(l311.frame_semantics.position_is_previous);
        let l312 = layout_for(Version::new(3, 12, 1)).expect("row");
        assert_eq!((l312.thread.frame, l312.thread.cframe_frame), (0x38, 0x00));
        assert_eq!(l312.frame_semantics.shim_owner, Some(3));
        assert_eq!(l312.objects.str_ascii_data, 0x28);
        for l in all_legacy() {
            assert_eq!(l.frame.code_mask, CODE_MASK_PLAIN);
        }
        let e = |minor| extras_for(Version::new(3, minor, 0), false).expect("row");
        assert_eq!(e(13).pthread_key, Some(0x874));
        assert_eq!(e(14).pthread_key, Some(0x924));
        assert_eq!(e(15).pthread_key, None);
        assert_eq!(e(13).code_mask, !0);
        assert_eq!(e(14).code_mask, !3);
        assert_eq!(e(15).firsttraceable, 0xc0);
    }
}
