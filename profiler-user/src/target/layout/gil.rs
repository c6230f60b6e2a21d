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
//!
//! Free-threaded 3.14 (`3.14t`) has the same fields in a struct that starts with `int
//! enabled` (0 while the process runs without a GIL, the default; 1 with `PYTHON_GIL=1`):
//! `--mode gil` reads it per sample (`gil_check::INTERP_HOLDER_IF_ENABLED`). `dump` takes
//! `last_holder` and `locked` within the struct from `_Py_DebugOffsets` too (0x10 and 0x18 in
//! 3.14t, 0x8 and 0x10 in default builds); without a GIL `locked` stays 0 and no thread is
//! shown holding it.
//!
//! Where the GIL itself is (`--mode wall/off-cpu`: a thread asleep in a futex call inside it
//! waits for the GIL, [`gil_wait_layout`]): the `struct _gil_runtime_state` (its mutex and
//! condition variables, 0xd0 bytes on x86_64 glibc in every version) is
//! - 3.8-3.11: `_PyRuntime.ceval.gil`, at an offset per minor version (DWARF of the pyenv
//!   builds 3.8.18, 3.9.18, 3.10.13, 3.11.7);
//! - 3.12+: wherever the thread's interpreter's `ceval.gil` points (its own `_gil`, or the
//!   main interpreter's when shared); the pointer's offset from DWARF of pyenv 3.12.1, and
//!   for 3.13+ from `_Py_DebugOffsets` (`interpreter_state.ceval_gil`). 3.14t's struct is 8
//!   bytes longer (0xd8: `enabled` and padding first; DWARF of a hand-built 3.14.7t).

use profiler_common::{gil_check, gil_wait};

use super::{Version, debug_offsets, debug_offsets::DebugOffsets};

/// How one process tells the GIL's holder (the `ProcessInfo::gil_*` fields, except that
/// `RUNTIME_TSTATE`'s holder is an offset in `_PyRuntime` here, made an address at
/// registration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GilLayout {
    pub check: u32,
    pub holder: u64,
    pub locked: u32,
    /// `INTERP_HOLDER_IF_ENABLED`: the offset of the GIL's `int enabled` in the interpreter.
    pub enabled: u32,
}

/// `gilstate.tstate_current` in `_PyRuntime`, by minor version: the one table of where
/// 3.8-3.11 keep the GIL's holder (the kernel's check and `dump` both read it).
const RUNTIME_TSTATE_CURRENT: [(u8, u64); 4] = [(8, 0x558), (9, 0x238), (10, 0x238), (11, 0x240)];
/// `_gil_runtime_state.last_holder` and `.locked` in default builds (x86_64, 3.8-3.15: after
/// `interval`); 3.13+ publish them (relative to the interpreter) in `_Py_DebugOffsets`.
const GIL_STATE_LAST_HOLDER: u32 = 0x8;
const GIL_STATE_LOCKED: u32 = 0x10;
/// 3.12: `PyInterpreterState._gil`, the interpreter's own `_gil_runtime_state`.
const INTERP_OWN_GIL_3_12: u64 = 0x410;

/// Where the thread holding the GIL is recorded (what `dump` reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GilLocation {
    /// `_PyRuntime.gilstate.tstate_current` (3.8-3.11): the attached thread state, NULL while
    /// no thread holds the GIL.
    RuntimeCurrent { offset: u32 },
    /// `interp->ceval.gil` points to a `_gil_runtime_state` whose `last_holder` is the holder
    /// while `locked` (an `int`) is 1 (3.12+; both offsets within the struct).
    InterpreterGil { gil_pointer: u32, last_holder: u32, locked: u32 },
}

/// `_PyRuntime.gilstate.tstate_current`'s offset for 3.8-3.11.
fn runtime_tstate_current(version: Version) -> Option<u64> {
    if version.major != 3 {
        return None;
    }
    RUNTIME_TSTATE_CURRENT.iter().find(|(minor, _)| *minor == version.minor).map(|&(_, offset)| offset)
}

/// Where `version` records the GIL's holder for `dump`; `offsets` (the target's decoded
/// `_Py_DebugOffsets`) are needed for 3.13+. `None` when the version or its offsets do not
/// tell.
pub fn holder_location(version: Version, offsets: Option<&DebugOffsets>) -> Option<GilLocation> {
    if version.major != 3 {
        return None;
    }
    if let Some(offset) = runtime_tstate_current(version) {
        return Some(GilLocation::RuntimeCurrent { offset: u32::try_from(offset).ok()? });
    }
    let (gil_pointer, last_holder, locked) = match version.minor {
        ..=11 => return None,
        12 => (INTERP_GIL_POINTER_3_12, GIL_STATE_LAST_HOLDER, GIL_STATE_LOCKED),
        _ => {
            let offsets = offsets?;
            let pointer = offsets.get("interpreter_state", "ceval_gil")?;
            match within_gil_struct(offsets) {
                Some((holder, locked)) => (pointer, holder, locked),
                // Default builds all agree on the struct; a free-threaded one must say.
                None if !offsets.free_threaded => (pointer, GIL_STATE_LAST_HOLDER, GIL_STATE_LOCKED),
                None => return None,
            }
        }
    };
    Some(GilLocation::InterpreterGil { gil_pointer: u32::try_from(gil_pointer).ok()?, last_holder, locked })
}

/// `last_holder` and `locked` within `_gil_runtime_state`, from 3.13+'s `_Py_DebugOffsets`
/// (which give them relative to the interpreter, as the interpreter's own `_gil` is).
fn within_gil_struct(offsets: &DebugOffsets) -> Option<(u32, u32)> {
    let gil = offsets.get("interpreter_state", "gil_runtime_state").filter(|g| *g != 0)?;
    let within = |field| {
        let at = offsets.get("interpreter_state", field)?.checked_sub(gil)?;
        u32::try_from(at).ok().filter(|a| *a + 8 <= gil_state_size(offsets))
    };
    Some((within("gil_runtime_state_holder")?, within("gil_runtime_state_locked")?))
}

/// The GIL layout of `version`; `debug_offsets` are the bytes of the file's
/// `_Py_DebugOffsets` (3.13+). `UNKNOWN` when the version or its offsets do not tell.
pub fn gil_layout(version: Version, debug_offsets: Option<&[u8]>) -> GilLayout {
    let unknown = GilLayout::default();
    if version.major != 3 {
        return unknown;
    }
    if let Some(offset) = runtime_tstate_current(version) {
        return GilLayout { check: gil_check::RUNTIME_TSTATE, holder: offset, locked: 0, enabled: 0 };
    }
    if version.minor == 12 {
        return GilLayout {
            check: gil_check::INTERP_HOLDER,
            holder: INTERP_OWN_GIL_3_12 + u64::from(GIL_STATE_LAST_HOLDER),
            locked: INTERP_OWN_GIL_3_12 as u32 + GIL_STATE_LOCKED,
            enabled: 0,
        };
    }
    let Some(decoded) = debug_offsets.and_then(|b| debug_offsets::decode(b).ok()) else { return unknown };
    if let Some(flag) = decoded.get("thread_state", "holds_gil") {
        return GilLayout { check: gil_check::TSTATE_FLAG, holder: flag, locked: 0, enabled: 0 };
    }
    match (
        decoded.get("interpreter_state", "gil_runtime_state_holder"),
        decoded.get("interpreter_state", "gil_runtime_state_locked").and_then(|l| u32::try_from(l).ok()),
    ) {
        (Some(holder), Some(locked)) if holder != 0 && locked != 0 && !decoded.free_threaded => {
            GilLayout { check: gil_check::INTERP_HOLDER, holder, locked, enabled: 0 }
        }
        // `enabled` is published relative to the GIL's struct (its first field: 0).
        (Some(holder), Some(locked)) if holder != 0 && locked != 0 => {
            let gil = decoded.get("interpreter_state", "gil_runtime_state").unwrap_or(0);
            let enabled = decoded.get("interpreter_state", "gil_runtime_state_enabled").map(|e| gil.saturating_add(e));
            match enabled.and_then(|e| u32::try_from(e).ok()) {
                Some(enabled) if gil != 0 && enabled < locked => {
                    GilLayout { check: gil_check::INTERP_HOLDER_IF_ENABLED, holder, locked, enabled }
                }
                _ => unknown,
            }
        }
        _ => unknown,
    }
}

/// How one process's kernel program finds the GIL's struct (the `ProcessInfo::gil_wait_*`
/// fields, except that `RUNTIME_ADDRESS`'s `at` is an offset in `_PyRuntime` here, made an
/// address at registration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GilWaitLayout {
    pub kind: u32,
    pub size: u32,
    pub at: u64,
}

/// `_PyRuntime.ceval.gil`, by minor version.
const RUNTIME_GIL: [(u8, u64); 4] = [(8, 0x480), (9, 0x160), (10, 0x160), (11, 0x168)];
/// 3.12: `PyInterpreterState.ceval.gil` (the pointer; the thread's interpreter is found with
/// `ProcessInfo::tstate_interp`).
const INTERP_GIL_POINTER_3_12: u64 = 0x180;
/// `sizeof(struct _gil_runtime_state)` in GIL builds, 3.8-3.15 (x86_64 glibc: `interval`,
/// `last_holder`, `locked`, `switch_number`, then two condition variables of 48 bytes and two
/// mutexes of 40).
const GIL_STATE_SIZE: u32 = 0xd0;
/// The same in 3.14t: `int enabled` (and padding) first.
const GIL_STATE_SIZE_FREE_THREADED: u32 = 0xd8;

/// `sizeof(struct _gil_runtime_state)` of the build `offsets` describe.
fn gil_state_size(offsets: &DebugOffsets) -> u32 {
    if offsets.free_threaded { GIL_STATE_SIZE_FREE_THREADED } else { GIL_STATE_SIZE }
}

/// Where `version`'s GIL is; `debug_offsets` as for [`gil_layout`]. `UNKNOWN` (GIL waits then
/// show as plain sleeps) when the version or its offsets do not tell.
pub fn gil_wait_layout(version: Version, debug_offsets: Option<&[u8]>) -> GilWaitLayout {
    let unknown = GilWaitLayout::default();
    if version.major != 3 {
        return unknown;
    }
    if let Some(&(_, offset)) = RUNTIME_GIL.iter().find(|(minor, _)| *minor == version.minor) {
        return GilWaitLayout { kind: gil_wait::RUNTIME_ADDRESS, size: GIL_STATE_SIZE, at: offset };
    }
    if version.minor == 12 {
        return GilWaitLayout { kind: gil_wait::INTERP_POINTER, size: GIL_STATE_SIZE, at: INTERP_GIL_POINTER_3_12 };
    }
    let Some(decoded) = debug_offsets.and_then(|b| debug_offsets::decode(b).ok()) else { return unknown };
    match decoded.get("interpreter_state", "ceval_gil") {
        Some(pointer) if pointer != 0 => GilWaitLayout { kind: gil_wait::INTERP_POINTER, size: gil_state_size(&decoded), at: pointer },
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

    #[test]
    fn gil_struct_locations_come_from_the_tables() {
        let l = gil_wait_layout(Version::new(3, 8, 18), None);
        assert_eq!((l.kind, l.at, l.size), (gil_wait::RUNTIME_ADDRESS, 0x480, 0xd0));
        let l = gil_wait_layout(Version::new(3, 11, 7), None);
        assert_eq!((l.kind, l.at), (gil_wait::RUNTIME_ADDRESS, 0x168));
        let l = gil_wait_layout(Version::new(3, 12, 1), None);
        assert_eq!((l.kind, l.at), (gil_wait::INTERP_POINTER, 0x180));
        // 3.13+ need the target's _Py_DebugOffsets.
        assert_eq!(gil_wait_layout(Version::new(3, 13, 0), None).kind, gil_wait::UNKNOWN);
        assert_eq!(gil_wait_layout(Version::new(2, 7, 18), None).kind, gil_wait::UNKNOWN);
    }

    #[test]
    fn dump_reads_the_holder_where_the_kernel_checks_it() {
        for minor in 8..=11 {
            let version = Version::new(3, minor, 0);
            let Some(GilLocation::RuntimeCurrent { offset }) = holder_location(version, None) else { panic!("3.{minor}") };
            assert_eq!(u64::from(offset), gil_layout(version, None).holder, "3.{minor}");
        }
        let version = Version::new(3, 12, 1);
        let Some(GilLocation::InterpreterGil { gil_pointer, last_holder, locked }) = holder_location(version, None) else {
            panic!("3.12")
        };
        assert_eq!((gil_pointer, last_holder, locked), (0x180, 0x8, 0x10));
        assert_eq!(u64::from(gil_pointer), gil_wait_layout(version, None).at);
        assert_eq!(holder_location(Version::new(3, 13, 0), None), None, "3.13 needs the debug offsets");
        assert_eq!(holder_location(Version::new(3, 7, 0), None), None);
        assert_eq!(holder_location(Version::new(2, 7, 18), None), None);
    }
}
