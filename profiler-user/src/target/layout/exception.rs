//! Where each version's thread state says which exception the thread is handling
//! (`--mode exception`), as data.
//!
//! `PyThreadState.exc_info` points at the topmost `_PyErr_StackItem` (the tstate's own
//! `exc_state`, or a running generator's); an item handles an exception when its
//! `exc_value` (3.11+) / `exc_type` (3.8-3.10) is neither NULL nor None, and items that
//! handle nothing defer to `previous_item` (CPython's `_PyErr_GetTopmostException`, what
//! `sys.exc_info()` reports; CPython 3.15's profiler flags such threads "has exception").
//!
//! Offsets measured on x86_64 inside an `except` block (the `exc_info` word pointing into
//! the tstate at an item holding the caught exception): pyenv 3.8.18-3.13.0 and Debian
//! sid 3.13.18, 3.14.10, 3.15.2 (3.15's `exc_state` agrees with its `_Py_DebugOffsets`).

use super::Version;

/// The `ProcessInfo::exc_*` offsets of one version (`exc_info` 0: unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExceptionLayout {
    pub exc_info: u32,
    pub handled: u32,
    pub previous: u32,
}

/// `(minor, offset of exc_info in PyThreadState)`.
const EXC_INFO: [(u8, u32); 8] =
    [(8, 0x90), (9, 0x90), (10, 0x90), (11, 0x78), (12, 0x68), (13, 0x78), (14, 0x78), (15, 0x90)];

/// The exception layout of `version`; unknown (`exc_info` 0) outside 3.8-3.15.
pub fn exception_layout(version: Version) -> ExceptionLayout {
    if version.major != 3 {
        return ExceptionLayout::default();
    }
    let Some(&(_, exc_info)) = EXC_INFO.iter().find(|(minor, _)| *minor == version.minor) else {
        return ExceptionLayout::default();
    };
    if version.minor <= 10 {
        // { exc_type, exc_value, exc_traceback, previous_item }
        ExceptionLayout { exc_info, handled: 0, previous: 24 }
    } else {
        // { exc_value, previous_item }
        ExceptionLayout { exc_info, handled: 0, previous: 8 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_table() {
        assert_eq!(exception_layout(Version::new(3, 9, 18)), ExceptionLayout { exc_info: 0x90, handled: 0, previous: 24 });
        assert_eq!(exception_layout(Version::new(3, 12, 1)), ExceptionLayout { exc_info: 0x68, handled: 0, previous: 8 });
        assert_eq!(exception_layout(Version::new(3, 7, 16)).exc_info, 0);
        assert_eq!(exception_layout(Version::new(2, 7, 18)).exc_info, 0);
    }

    /// The kernel reads an item's words from one read of `EXCEPTION_ITEM_READ` bytes.
    #[test]
    fn item_words_fit_the_kernel_read() {
        for minor in 8..=15 {
            let l = exception_layout(Version::new(3, minor, 0));
            for offset in [l.handled, l.previous] {
                assert!(offset % 8 == 0 && (offset as usize) + 8 <= profiler_common::EXCEPTION_ITEM_READ, "3.{minor}: {l:?}");
            }
        }
    }
}
