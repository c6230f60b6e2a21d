//! Where the `threading` module's registry of `Thread` objects is, per version: what
//! `crate::target::thread_registry` needs to read Python thread names (`threading._active`, ident →
//! `Thread`, whose `_name` and `_native_id` attributes name and place the thread).
//!
//! The path: `sys.modules` (a `dict` the interpreter state points to) → the `threading`
//! module object → its `__dict__` (`PyModuleObject.md_dict`) → `_active` (a `dict`) → each
//! `Thread` → its instance attributes, which are kept
//! - 3.8-3.10: in a `__dict__` at `tp_dictoffset` (a plain, often key-sharing, `dict`);
//! - 3.11: in a "managed dict": a values array at `obj - 32` (keys: the type's
//!   `ht_cached_keys`) or, once materialised, a `dict` at `obj - 24`;
//! - 3.12: one tagged word at `obj - 24`: odd = values array (at word + 1), even = `dict`;
//! - 3.13+: a `dict` at `obj - 24` if materialised, else inline values right after the
//!   object (`obj + tp_basicsize`, type flag `Py_TPFLAGS_INLINE_VALUES`), headed by 8 bytes
//!   (`capacity`, `size`, `embedded`, `valid`, padding), valid only while `valid` is set.
//!
//! 3.8-3.12 offsets were read with gdb from the DWARF of the pyenv builds named in each row;
//! 3.13+ take what `_Py_DebugOffsets` publishes (`imports_modules`, `dict_object`, and in
//! 3.15 `tp_basicsize`, `tp_dictoffset`, `ht_cached_keys`) from the target, and the rest from
//! here (the 3.13.0 DWARF; 3.14/3.15 `ht_cached_keys` = `sizeof(PyTypeObject)` + 464, the
//! method tables and three pointers that precede it, which reproduces 3.15's published 0x378).
//!
//! Free-threaded 3.14t: see [`FREE_THREADED_ROWS`] (its object head is 16 bytes longer, and its
//! managed `dict` pointer is at `obj - 8`: no GC head precedes its objects).
//!
//! Invariant: every offset here only says where to read; the reader bounds every read and
//! checks every type, so a wrong offset costs a name, never a wrong read size.

use super::Version;
use super::debug_offsets::DebugOffsets;

/// `PyDictKeysObject`'s header, by generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeysLayout {
    /// 3.8-3.10: `Py_ssize_t dk_size` (a power of two), `dk_nentries`, indices of 1/2/4/8
    /// bytes (by `dk_size`) from `indices`; entries `{hash, key, value}` (24 bytes).
    Sized { size: u32, nentries: u32, indices: u32 },
    /// 3.11+: `u8 dk_log2_index_bytes`, `u8 dk_kind`, `dk_nentries`; the index table is
    /// `1 << dk_log2_index_bytes` bytes from `indices`; entries `{hash, key, value}` for kind
    /// 0 (general), `{key, value}` for 1 (unicode) and 2 (split).
    Log2 { log2_index_bytes: u32, kind: u32, nentries: u32, indices: u32 },
}

/// `dict` objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DictLayout {
    pub ma_keys: u32,
    /// `ma_values`: NULL for a combined table, else the split table's values.
    pub ma_values: u32,
    /// Where the value pointers start in a values block (`PyDictValues`): 0 up to 3.12, 8
    /// from 3.13 (after `capacity`, `size`, `embedded`, `valid` and padding).
    pub values_start: u32,
    pub keys: KeysLayout,
}

/// Where a Python class's instance keeps its attributes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttributeStorage {
    /// 3.8-3.10: a `dict` pointer at `tp_dictoffset`.
    DictOffset,
    /// 3.11: values array pointer at `obj + values`, `dict` pointer at `obj + dict`.
    ManagedSplit { values: i32, dict: i32, cached_keys: u32 },
    /// 3.12: one word at `obj + word`: odd = values (at word + 1), even = `dict`.
    ManagedTagged { word: i32, cached_keys: u32 },
    /// 3.13+: `dict` pointer at `obj + dict`; else inline values at `obj + tp_basicsize`.
    ManagedInline { dict: i32, cached_keys: u32 },
}

/// Everything the registry reader needs beyond the stack walk's `PythonLayout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadingLayout {
    /// Offset of `PyObject *modules` (`sys.modules`) in `PyInterpreterState`.
    pub interp_modules: u32,
    /// `PyModuleObject.md_dict`.
    pub module_dict: u32,
    pub dict: DictLayout,
    pub attributes: AttributeStorage,
    /// `PyTypeObject` fields: `tp_name`, `tp_basicsize`, `tp_flags`, `tp_dictoffset`.
    pub type_name: u32,
    pub type_basicsize: u32,
    pub type_flags: u32,
    pub type_dictoffset: u32,
    /// `int`: `Some(lv_tag)` from 3.12 (digit count << 3 | sign), else `None` (the signed
    /// digit count is `ob_size`, at `int_size`); 30-bit digits from `int_digits`.
    pub int_tag: Option<u32>,
    pub int_size: u32,
    pub int_digits: u32,
}

/// `Py_TPFLAGS_MANAGED_DICT` (3.11+), `Py_TPFLAGS_INLINE_VALUES` (3.13+),
/// `Py_TPFLAGS_HEAPTYPE`.
pub const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
pub const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
pub const TPFLAGS_HEAPTYPE: u64 = 1 << 9;

const SIZED_KEYS: KeysLayout = KeysLayout::Sized { size: 0x8, nentries: 0x20, indices: 0x28 };
const LOG2_KEYS: KeysLayout = KeysLayout::Log2 { log2_index_bytes: 0x9, kind: 0xa, nentries: 0x18, indices: 0x20 };

/// One row: a minor version, the build its offsets were read from (for the reader), and
/// what differs between versions (the rest is common, see [`threading_layout`]).
struct Row {
    minor: u8,
    #[cfg_attr(not(test), allow(dead_code))]
    verified_on: &'static str,
    /// `None` for 3.13+: taken from `_Py_DebugOffsets.interpreter_state.imports_modules`.
    interp_modules: Option<u32>,
    keys: KeysLayout,
    values_start: u32,
    attributes: AttributeStorage,
    int_tag: Option<u32>,
}

const ROWS: &[Row] = &[
    Row {
        minor: 8,
        verified_on: "pyenv 3.8.18",
        interp_modules: Some(0x38),
        keys: SIZED_KEYS,
        values_start: 0,
        attributes: AttributeStorage::DictOffset,
        int_tag: None,
    },
    Row {
        minor: 9,
        verified_on: "pyenv 3.9.18",
        interp_modules: Some(0x358),
        keys: SIZED_KEYS,
        values_start: 0,
        attributes: AttributeStorage::DictOffset,
        int_tag: None,
    },
    Row {
        minor: 10,
        verified_on: "pyenv 3.10.13",
        interp_modules: Some(0x358),
        keys: SIZED_KEYS,
        values_start: 0,
        attributes: AttributeStorage::DictOffset,
        int_tag: None,
    },
    Row {
        minor: 11,
        verified_on: "pyenv 3.11.7",
        interp_modules: Some(0x378),
        keys: LOG2_KEYS,
        values_start: 0,
        attributes: AttributeStorage::ManagedSplit { values: -32, dict: -24, cached_keys: 0x368 },
        int_tag: None,
    },
    Row {
        minor: 12,
        verified_on: "pyenv 3.12.1",
        interp_modules: Some(0x3b0),
        keys: LOG2_KEYS,
        values_start: 0,
        attributes: AttributeStorage::ManagedTagged { word: -24, cached_keys: 0x370 },
        int_tag: Some(0x10),
    },
    Row {
        minor: 13,
        verified_on: "pyenv 3.13.0, Debian 3.13.18",
        interp_modules: None,
        keys: LOG2_KEYS,
        values_start: 8,
        attributes: AttributeStorage::ManagedInline { dict: -24, cached_keys: 0x370 },
        int_tag: Some(0x10),
    },
    Row {
        minor: 14,
        verified_on: "Debian 3.14.10",
        interp_modules: None,
        keys: LOG2_KEYS,
        values_start: 8,
        attributes: AttributeStorage::ManagedInline { dict: -24, cached_keys: 0x370 },
        int_tag: Some(0x10),
    },
    Row {
        minor: 15,
        verified_on: "Debian 3.15.2",
        interp_modules: None,
        keys: LOG2_KEYS,
        values_start: 8,
        attributes: AttributeStorage::ManagedInline { dict: -24, cached_keys: 0x378 },
        int_tag: Some(0x10),
    },
];

/// What differs in a free-threaded build (PEP 703), whose object head is 16 bytes longer and
/// whose objects have no GC head before them (so the managed `dict` pointer is the word just
/// before the object). Values 3.14t does not publish in `_Py_DebugOffsets`; the published
/// ones (`dict_object`, `type_object.tp_name`/`tp_flags`, `long_object`) are taken from it.
struct FreeThreadedRow {
    minor: u8,
    #[cfg_attr(not(test), allow(dead_code))]
    verified_on: &'static str,
    module_dict: u32,
    managed_dict: i32,
    cached_keys: u32,
    type_basicsize: u32,
    type_dictoffset: u32,
}

const FREE_THREADED_ROWS: &[FreeThreadedRow] = &[FreeThreadedRow {
    minor: 14,
    verified_on: "hand-built 3.14.7t: DWARF (gdb), and the managed dict read back with ctypes",
    module_dict: 0x20,
    managed_dict: -8,
    cached_keys: 0x380,
    type_basicsize: 0x30,
    type_dictoffset: 0x130,
}];

/// Why there is no registry layout (names then stay the OS names).
#[derive(Debug, thiserror::Error)]
pub enum ThreadingLayoutError {
    #[error("pyperch has no threading-registry layout for CPython {0}")]
    Unknown(Version),
    #[error("the target's _Py_DebugOffsets lack {0}")]
    Missing(&'static str),
    #[error("pyperch has no threading-registry layout for free-threaded builds yet (CPython {0}t)")]
    FreeThreaded(Version),
}

/// The layout for `version`; `offsets` (the target's decoded `_Py_DebugOffsets`) is required
/// for 3.13+, and its published values win over the table's.
pub fn threading_layout(version: Version, offsets: Option<&DebugOffsets>) -> Result<ThreadingLayout, ThreadingLayoutError> {
    if version.major != 3 {
        return Err(ThreadingLayoutError::Unknown(version));
    }
    // Its objects' fields lie 16 bytes further and its managed dict elsewhere.
    let free_threaded = match offsets.is_some_and(|o| o.free_threaded) {
        true => Some(
            FREE_THREADED_ROWS.iter().find(|r| r.minor == version.minor).ok_or(ThreadingLayoutError::FreeThreaded(version))?,
        ),
        false => None,
    };
    let row = ROWS.iter().find(|r| r.minor == version.minor).ok_or(ThreadingLayoutError::Unknown(version))?;
    let published = |group: &str, field: &str| offsets.and_then(|o| o.get(group, field)).and_then(|v| u32::try_from(v).ok());
    let interp_modules = match row.interp_modules {
        Some(offset) => offset,
        None => published("interpreter_state", "imports_modules")
            .ok_or(ThreadingLayoutError::Missing("interpreter_state.imports_modules"))?,
    };
    let attributes = match (row.attributes, free_threaded) {
        (AttributeStorage::ManagedInline { .. }, Some(ft)) => {
            AttributeStorage::ManagedInline { dict: ft.managed_dict, cached_keys: ft.cached_keys }
        }
        (other, _) => other,
    };
    let attributes = match (attributes, published("heap_type_object", "ht_cached_keys")) {
        (AttributeStorage::ManagedInline { dict, .. }, Some(cached_keys)) => AttributeStorage::ManagedInline { dict, cached_keys },
        (other, _) => other,
    };
    // The object head's length moves what follows it.
    let head = if free_threaded.is_some() { 0x10 } else { 0 };
    Ok(ThreadingLayout {
        interp_modules,
        module_dict: free_threaded.map_or(0x10, |ft| ft.module_dict),
        dict: DictLayout {
            ma_keys: published("dict_object", "ma_keys").unwrap_or(0x20),
            ma_values: published("dict_object", "ma_values").unwrap_or(0x28),
            values_start: row.values_start,
            keys: row.keys,
        },
        attributes,
        type_name: published("type_object", "tp_name").unwrap_or(0x18 + head),
        type_basicsize: published("type_object", "tp_basicsize").unwrap_or(free_threaded.map_or(0x20, |ft| ft.type_basicsize)),
        type_flags: published("type_object", "tp_flags").unwrap_or(0xa8 + head),
        type_dictoffset: published("type_object", "tp_dictoffset").unwrap_or(free_threaded.map_or(0x120, |ft| ft.type_dictoffset)),
        int_tag: row.int_tag.map(|tag| published("long_object", "lv_tag").unwrap_or(tag + head)),
        int_size: 0x10 + head,
        int_digits: published("long_object", "ob_digit").unwrap_or(0x18 + head),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_cover_3_8_to_3_15() {
        for minor in 8..=12 {
            let l = threading_layout(Version::new(3, minor, 0), None).expect("row");
            assert_eq!(matches!(l.dict.keys, KeysLayout::Sized { .. }), minor <= 10);
            assert_eq!(l.int_tag.is_some(), minor >= 12);
        }
        for minor in 13..=15 {
            assert!(threading_layout(Version::new(3, minor, 0), None).is_err(), "3.{minor} needs its debug offsets");
        }
        assert!(threading_layout(Version::new(3, 7, 0), None).is_err());
        assert!(threading_layout(Version::new(3, 16, 0), None).is_err());
        for row in ROWS {
            assert!(!row.verified_on.is_empty());
        }
        for row in FREE_THREADED_ROWS {
            assert!(!row.verified_on.is_empty());
        }
    }
}
