//! Where each version keeps its garbage collector's `collecting` flag (`<GC>` frames), as data.
//!
//! The `int collecting` of `struct _gc_runtime_state` is 1 from the start to the end of every
//! collection (automatic or `gc.collect()`, including the callbacks and finalizers it runs),
//! else 0. Where that struct lives:
//! - 3.8: in `_PyRuntime` (`_PyRuntime.gc`, one collector for the process);
//! - 3.9-3.12: in each `PyInterpreterState` (`interp->gc`); offsets from DWARF of the pyenv
//!   builds 3.8.18-3.12.1;
//! - 3.13+: `_Py_DebugOffsets` publishes both `interpreter_state.gc` and `gc.collecting`.
//!
//! Every value below was also checked at run time on pyenv 3.8.18-3.13.0 and Debian sid
//! 3.13.18, 3.14.10 and 3.15.2: the word reads 1 inside a `gc.callbacks` callback and 0 before
//! and after `gc.collect()`.
//!
//! The flag is shared by the interpreter's threads: the kernel also checks that the sampled
//! thread holds the GIL (`layout::gil`), as the collecting thread does. Free-threaded builds
//! (no GIL; their `_Py_DebugOffsets` are not decoded) get no `<GC>` frames.

use profiler_common::{gc_check, gil_check};

use super::{Version, debug_offsets};

/// 3.8: `_PyRuntime.gc.collecting` (`gc` at 0x158, `collecting` at 0xc8 in it).
const RUNTIME_COLLECTING_3_8: u64 = 0x220;
/// `(minor, offset of gc.collecting in PyInterpreterState)` for 3.9-3.12.
const INTERP_COLLECTING: [(u8, u64); 4] = [(9, 0x330), (10, 0x330), (11, 0x350), (12, 0x138)];

/// How one process tells that its collector runs (the `ProcessInfo::gc_*` fields, except that
/// `RUNTIME_FLAG`'s `collecting` is an offset in `_PyRuntime` here, made an address at
/// registration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcLayout {
    pub check: u32,
    pub collecting: u64,
}

/// The collector layout of `version`; `debug_offsets` are the bytes of the file's
/// `_Py_DebugOffsets` (3.13+). Unknown (`gc_check::UNKNOWN`) when the version or its offsets
/// do not tell, or when `gil` (the same version's GIL layout) cannot tell the GIL's holder.
pub fn gc_layout(version: Version, debug_offsets: Option<&[u8]>, gil: u32) -> GcLayout {
    let unknown = GcLayout::default();
    if version.major != 3 || gil == gil_check::UNKNOWN {
        return unknown;
    }
    if version.minor == 8 {
        return GcLayout { check: gc_check::RUNTIME_FLAG, collecting: RUNTIME_COLLECTING_3_8 };
    }
    if let Some(&(_, collecting)) = INTERP_COLLECTING.iter().find(|(minor, _)| *minor == version.minor) {
        return GcLayout { check: gc_check::INTERP_FLAG, collecting };
    }
    let Some(decoded) = debug_offsets.and_then(|b| debug_offsets::decode(b).ok()) else { return unknown };
    published(|group, field| decoded.get(group, field)).unwrap_or(unknown)
}

/// The 3.13+ layout from published offsets (`get(group, field)`), each checked against its
/// group's size.
fn published(get: impl Fn(&str, &str) -> Option<u64>) -> Option<GcLayout> {
    let interp_size = get("interpreter_state", "size")?;
    let gc = get("interpreter_state", "gc")?;
    let gc_size = get("gc", "size")?;
    let flag = get("gc", "collecting")?;
    let fits = flag.checked_add(4)? <= gc_size && gc.checked_add(gc_size)? <= interp_size;
    fits.then_some(GcLayout { check: gc_check::INTERP_FLAG, collecting: gc + flag })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_versions_come_from_the_tables() {
        let l = gc_layout(Version::new(3, 8, 18), None, gil_check::RUNTIME_TSTATE);
        assert_eq!((l.check, l.collecting), (gc_check::RUNTIME_FLAG, 0x220));
        let l = gc_layout(Version::new(3, 11, 7), None, gil_check::RUNTIME_TSTATE);
        assert_eq!(l, GcLayout { check: gc_check::INTERP_FLAG, collecting: 0x350 });
        let l = gc_layout(Version::new(3, 12, 1), None, gil_check::INTERP_HOLDER);
        assert_eq!(l.collecting, 0x138);
        // No GIL holder to tell the collecting thread by: nothing.
        assert_eq!(gc_layout(Version::new(3, 12, 1), None, gil_check::UNKNOWN).check, gc_check::UNKNOWN);
        assert_eq!(gc_layout(Version::new(3, 13, 0), None, gil_check::INTERP_HOLDER).check, gc_check::UNKNOWN);
        assert_eq!(gc_layout(Version::new(2, 7, 18), None, gil_check::RUNTIME_TSTATE).check, gc_check::UNKNOWN);
    }

    /// Debian sid 3.15.2's published values (cpython-internals §6b), and one that does not fit.
    #[test]
    fn published_offsets_are_bounded() {
        let values = |collecting: u64| {
            move |group: &str, field: &str| match (group, field) {
                ("interpreter_state", "size") => Some(0x373c0),
                ("interpreter_state", "gc") => Some(0x1ce8),
                ("gc", "size") => Some(0xb0),
                ("gc", "collecting") => Some(collecting),
                _ => None,
            }
        };
        let l = published(values(0x70)).expect("fits");
        assert_eq!(l, GcLayout { check: gc_check::INTERP_FLAG, collecting: 0x1ce8 + 0x70 });
        assert_eq!(published(values(0xb0)), None);
    }
}
