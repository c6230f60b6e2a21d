//! Where each version says which thread holds the GIL (`--mode gil`), as data.
//!
//! - 3.8-3.11: `_PyRuntime.gilstate.tstate_current` holds the holder's tstate and is NULL
//!   while the GIL is free; offsets in `_PyRuntime` from DWARF of the pyenv builds (see
//!   `/work/shared/notes/cpython-internals.md`, section 2).
//! - 3.12: the main interpreter's own `_gil` (`last_holder`, `locked`); offsets from DWARF of
//!   pyenv 3.12.1.
//! - 3.13, 3.14: the same fields, from `_Py_DebugOffsets` (`gil_runtime_state_holder`,
//!   `gil_runtime_state_locked`).
//! - 3.15: the tstate's `holds_gil`, from `_Py_DebugOffsets`.
//!
//! `last_holder` stays set after the GIL is released, so 3.12-3.14 also need `locked`.

use profiler_common::gil_check;

use super::{Version, debug_offsets};

/// How one process tells the GIL's holder (the `ProcessInfo::gil_*` fields, except that
/// `RUNTIME_TSTATE`'s holder is an offset in `_PyRuntime` here, made an address at
/// registration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GilLayout {
    pub check: u32,
    pub holder: u64,
    pub locked: u32,
}

/// `gilstate.tstate_current` in `_PyRuntime`, by minor version.
const RUNTIME_TSTATE_CURRENT: [(u8, u64); 4] = [(8, 0x558), (9, 0x238), (10, 0x238), (11, 0x240)];
/// 3.12: `PyInterpreterState._gil.last_holder` and `._gil.locked`.
const INTERP_GIL_3_12: (u64, u32) = (0x418, 0x420);

/// The GIL layout of `version`; `debug_offsets` are the bytes of the file's
/// `_Py_DebugOffsets` (3.13+). `UNKNOWN` when the version or its offsets do not tell.
pub fn gil_layout(version: Version, debug_offsets: Option<&[u8]>) -> GilLayout {
    let unknown = GilLayout::default();
    if version.major != 3 {
        return unknown;
    }
    if let Some(&(_, offset)) = RUNTIME_TSTATE_CURRENT.iter().find(|(minor, _)| *minor == version.minor) {
        return GilLayout { check: gil_check::RUNTIME_TSTATE, holder: offset, locked: 0 };
    }
    if version.minor == 12 {
        return GilLayout { check: gil_check::INTERP_HOLDER, holder: INTERP_GIL_3_12.0, locked: INTERP_GIL_3_12.1 };
    }
    let Some(decoded) = debug_offsets.and_then(|b| debug_offsets::decode(b).ok()) else { return unknown };
    if let Some(flag) = decoded.get("thread_state", "holds_gil") {
        return GilLayout { check: gil_check::TSTATE_FLAG, holder: flag, locked: 0 };
    }
    match (
        decoded.get("interpreter_state", "gil_runtime_state_holder"),
        decoded.get("interpreter_state", "gil_runtime_state_locked").and_then(|l| u32::try_from(l).ok()),
    ) {
        (Some(holder), Some(locked)) if holder != 0 && locked != 0 => {
            GilLayout { check: gil_check::INTERP_HOLDER, holder, locked }
        }
        _ => unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_versions_come_from_the_tables() {
        let l = gil_layout(Version::new(3, 9, 18), None);
        assert_eq!((l.check, l.holder), (gil_check::RUNTIME_TSTATE, 0x238));
        let l = gil_layout(Version::new(3, 12, 1), None);
        assert_eq!((l.check, l.holder, l.locked), (gil_check::INTERP_HOLDER, 0x418, 0x420));
        assert_eq!(gil_layout(Version::new(3, 13, 0), None).check, gil_check::UNKNOWN);
        assert_eq!(gil_layout(Version::new(2, 7, 18), None).check, gil_check::UNKNOWN);
    }
}
