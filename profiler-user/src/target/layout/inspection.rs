//! Per-version facts that `pyperch dump` needs beyond a stack walk: who holds the GIL, the
//! interpreter list, and where a frame's local variables and their names are.
//!
//! 3.8-3.12 come from [`LEGACY`] (offsets read with gdb from the DWARF of the pyenv builds
//! named in each row); 3.13+ take every offset `_Py_DebugOffsets` publishes from the target
//! itself and only the rest (`co_nlocalsplus`, `ma_used`) from [`MODERN_EXTRAS`]. Where the
//! GIL's holder is comes from `gil` (one table for the kernel's check and for `dump`).
//!
//! Invariant: every offset here is a read position into an object the caller reads with a
//! bounded size; nothing here is trusted to make a read safe, only to make it meaningful.

use super::Version;
use super::debug_offsets::DebugOffsets;
pub use super::gil::GilLocation;
use super::gil::holder_location;

/// How a frame's local variables are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalsLayout {
    /// 3.8-3.10: `co_varnames` (a tuple of `str`), `int co_nlocals`, and the values at
    /// `f_localsplus` of the `PyFrameObject`.
    VarNames { varnames: u32, nlocals: u32, frame_values: u32 },
    /// 3.11+: `co_localsplusnames` (tuple), `co_localspluskinds` (bytes), `int
    /// co_nlocalsplus`, values at `localsplus` of the `_PyInterpreterFrame`; `value_mask`
    /// clears the `_PyStackRef` tag bits (3.14+).
    LocalsPlus { names: u32, kinds: u32, count: u32, frame_values: u32, value_mask: u64 },
}

/// Object fields used to render a value (offsets from the object address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueLayout {
    /// `PyVarObject.ob_size` (tuple, list; the sign and digit count of an `int` before 3.12).
    pub var_size: u32,
    /// First item of a tuple.
    pub tuple_items: u32,
    /// `int`: `Some(lv_tag)` for 3.12+ (digit count << 3 | sign), `None` when the sign and
    /// digit count are `ob_size`.
    pub long_tag: Option<u32>,
    pub long_digits: u32,
    pub float_value: u32,
    pub dict_used: u32,
    pub set_used: u32,
    pub type_name: u32,
    pub type_flags: u32,
}

/// Everything `dump` needs for one minor version, beyond the `PythonLayout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InspectionLayout {
    /// `PyInterpreterState.next`.
    pub interp_next: u32,
    pub gil: GilLocation,
    /// `PyThreadState.holds_gil` (3.15+), which says it directly.
    pub holds_gil: Option<u32>,
    pub locals: LocalsLayout,
    pub values: ValueLayout,
}

/// glibc x86_64: offset of `pid_t tid` in `struct pthread` (at `pthread_self()`), the same in
/// glibc 2.36 and 2.43; checked on pyenv 3.8-3.10 against `threading.get_native_id()`.
/// 3.8-3.10 thread states only carry `pthread_self()`; a value that is not one of the target's
/// thread ids is not used.
pub const GLIBC_PTHREAD_TID: u32 = 0x2d0;

/// `tp_name` and `tp_flags` in `PyTypeObject`, 3.8-3.15.
const TYPE_NAME: u32 = 0x18;
const TYPE_FLAGS: u32 = 0xa8;
/// `PyDictObject.ma_used`, 3.8-3.15; 16 bytes further in free-threaded builds (32-byte
/// object head; 3.14.7t's DWARF).
const DICT_USED: u32 = 0x10;
const DICT_USED_FREE_THREADED: u32 = 0x20;

const fn values_before_3_12() -> ValueLayout {
    ValueLayout {
        var_size: 0x10,
        tuple_items: 0x18,
        long_tag: None,
        long_digits: 0x18,
        float_value: 0x10,
        dict_used: DICT_USED,
        set_used: 0x18,
        type_name: TYPE_NAME,
        type_flags: TYPE_FLAGS,
    }
}

/// One row: a minor version before 3.13 (`PyInterpreterState.next` is the struct's first
/// field there; where the GIL's holder is comes from `gil::holder_location`).
struct LegacyRow {
    minor: u8,
    /// The build the offsets were read from (with gdb, from its DWARF): for the reader.
    #[cfg_attr(not(test), allow(dead_code))]
    verified_on: &'static str,
    locals: LocalsLayout,
    values: ValueLayout,
}

const LEGACY: &[LegacyRow] = &[
    LegacyRow {
        minor: 8,
        verified_on: "pyenv 3.8.18",
        locals: LocalsLayout::VarNames { varnames: 0x48, nlocals: 0x1c, frame_values: 0x168 },
        values: values_before_3_12(),
    },
    LegacyRow {
        minor: 9,
        verified_on: "pyenv 3.9.18",
        locals: LocalsLayout::VarNames { varnames: 0x48, nlocals: 0x1c, frame_values: 0x168 },
        values: values_before_3_12(),
    },
    LegacyRow {
        minor: 10,
        verified_on: "pyenv 3.10.13",
        locals: LocalsLayout::VarNames { varnames: 0x48, nlocals: 0x1c, frame_values: 0x160 },
        values: values_before_3_12(),
    },
    LegacyRow {
        minor: 11,
        verified_on: "pyenv 3.11.7",
        locals: LocalsLayout::LocalsPlus { names: 0x60, kinds: 0x68, count: 0x4c, frame_values: 0x48, value_mask: !0 },
        values: values_before_3_12(),
    },
    LegacyRow {
        minor: 12,
        verified_on: "pyenv 3.12.1",
        locals: LocalsLayout::LocalsPlus { names: 0x60, kinds: 0x68, count: 0x48, frame_values: 0x48, value_mask: !0 },
        values: ValueLayout { long_tag: Some(0x10), ..values_before_3_12() },
    },
];

/// What 3.13+ does not publish in `_Py_DebugOffsets`.
struct ModernExtras {
    minor: u8,
    /// `int co_nlocalsplus`.
    nlocalsplus: u32,
    /// The same in the free-threaded build (`None`: not known, no dump of its locals).
    nlocalsplus_free_threaded: Option<u32>,
    /// Tag bits of a `_PyStackRef` in `localsplus`.
    value_mask: u64,
}

const MODERN_EXTRAS: &[ModernExtras] = &[
    ModernExtras { minor: 13, nlocalsplus: 0x48, nlocalsplus_free_threaded: None, value_mask: !0 },
    // 3.14.7t's DWARF: `co_nlocalsplus` at 0x58.
    ModernExtras { minor: 14, nlocalsplus: 0x48, nlocalsplus_free_threaded: Some(0x58), value_mask: !3 },
    ModernExtras { minor: 15, nlocalsplus: 0x48, nlocalsplus_free_threaded: None, value_mask: !3 },
];

/// Why no inspection layout exists.
#[derive(Debug, thiserror::Error)]
pub enum InspectionError {
    #[error("pyperch has no thread-dump layout for CPython {0}")]
    Unknown(Version),
    #[error("the target's _Py_DebugOffsets lack {0}")]
    Missing(&'static str),
}

/// The layout for `version`; `offsets` (the target's decoded `_Py_DebugOffsets`) is required
/// for 3.13+.
pub fn inspection_layout(version: Version, offsets: Option<&DebugOffsets>) -> Result<InspectionLayout, InspectionError> {
    if version.major != 3 {
        return Err(InspectionError::Unknown(version));
    }
    if let Some(row) = LEGACY.iter().find(|r| r.minor == version.minor) {
        let gil = holder_location(version, None).ok_or(InspectionError::Unknown(version))?;
        return Ok(InspectionLayout { interp_next: 0, gil, holds_gil: None, locals: row.locals, values: row.values });
    }
    let extras = MODERN_EXTRAS.iter().find(|e| e.minor == version.minor).ok_or(InspectionError::Unknown(version))?;
    let offsets = offsets.ok_or(InspectionError::Missing("every offset (not readable)"))?;
    let get = |group: &'static str, field: &'static str, what: &'static str| {
        offsets.get(group, field).and_then(|v| u32::try_from(v).ok()).ok_or(InspectionError::Missing(what))
    };
    let optional = |group: &str, field: &str| offsets.get(group, field).and_then(|v| u32::try_from(v).ok());
    let (nlocalsplus, dict_used) = match offsets.free_threaded {
        false => (extras.nlocalsplus, DICT_USED),
        true => (extras.nlocalsplus_free_threaded.ok_or(InspectionError::Unknown(version))?, DICT_USED_FREE_THREADED),
    };
    Ok(InspectionLayout {
        interp_next: get("interpreter_state", "next", "interpreter_state.next")?,
        gil: holder_location(version, Some(offsets)).ok_or(InspectionError::Missing("interpreter_state.ceval_gil"))?,
        holds_gil: optional("thread_state", "holds_gil"),
        locals: LocalsLayout::LocalsPlus {
            names: get("code_object", "localsplusnames", "code_object.localsplusnames")?,
            kinds: get("code_object", "localspluskinds", "code_object.localspluskinds")?,
            count: nlocalsplus,
            frame_values: get("interpreter_frame", "localsplus", "interpreter_frame.localsplus")?,
            value_mask: extras.value_mask,
        },
        values: ValueLayout {
            var_size: get("tuple_object", "ob_size", "tuple_object.ob_size")?,
            tuple_items: get("tuple_object", "ob_item", "tuple_object.ob_item")?,
            long_tag: Some(get("long_object", "lv_tag", "long_object.lv_tag")?),
            long_digits: get("long_object", "ob_digit", "long_object.ob_digit")?,
            float_value: get("float_object", "ob_fval", "float_object.ob_fval")?,
            dict_used,
            set_used: optional("set_object", "used").unwrap_or(0x18),
            type_name: get("type_object", "tp_name", "type_object.tp_name")?,
            type_flags: get("type_object", "tp_flags", "type_object.tp_flags")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_rows_cover_3_8_to_3_12() {
        for row in LEGACY {
            assert!(row.verified_on.starts_with("pyenv 3."), "{}", row.verified_on);
        }
        for minor in 8..=12 {
            let layout = inspection_layout(Version::new(3, minor, 0), None).expect("row");
            assert_eq!(layout.interp_next, 0);
            assert_eq!(matches!(layout.gil, GilLocation::RuntimeCurrent { .. }), minor <= 11);
            assert_eq!(matches!(layout.locals, LocalsLayout::VarNames { .. }), minor <= 10);
        }
        assert!(inspection_layout(Version::new(3, 13, 0), None).is_err(), "3.13 needs the debug offsets");
        assert!(inspection_layout(Version::new(3, 7, 0), None).is_err());
        assert!(inspection_layout(Version::new(2, 7, 0), None).is_err());
    }
}
