//! Which counter, per version, tells the kernel that no code object was replaced since it last
//! checked one (`profiler_common::code_generation`):
//! - 3.12: `_Py_next_func_version`, the interpreter-wide creation counter, when the file names
//!   it (`.dynsym` or, in builds that keep it, `.symtab`);
//! - 3.14+: the per-interpreter deallocation counter `interpreter_state.code_object_generation`
//!   of `_Py_DebugOffsets`, when its offset lies inside the interpreter state;
//! - none otherwise (3.8-3.11, 3.13, stripped 3.12 builds).

use profiler_common::code_generation::{CREATED_AT, FREED_IN_INTERP, NONE};

use super::{Version, debug_offsets::DebugOffsets};

/// Whether `version` counts code-object creations in `_Py_NEXT_FUNC_VERSION`'s symbol
/// `_Py_next_func_version` (a 4-byte counter), which discovery then looks for.
pub fn has_creation_counter(version: Version) -> bool {
    version.minor == 12
}

/// `(kind, at)` for `ProcessInfo::code_generation*`: `at` is the counter's address for
/// `CREATED_AT` (`next_func_version`: the symbol's address in the process, when the file names
/// it), its offset in the interpreter state for `FREED_IN_INTERP`.
pub fn code_generation(version: Version, next_func_version: Option<u64>, published: Option<&DebugOffsets>) -> (u32, u64) {
    match (version.minor, next_func_version, published) {
        (12, Some(at), _) => (CREATED_AT, at),
        (minor, _, Some(d)) if minor >= 14 => {
            let size = d.get("interpreter_state", "size").unwrap_or(0);
            match d.get("interpreter_state", "code_object_generation") {
                Some(offset) if offset != 0 && offset.saturating_add(8) <= size => (FREED_IN_INTERP, offset),
                _ => (NONE, 0),
            }
        }
        _ => (NONE, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_generation_counter_by_version() {
        // 3.12 with the symbol: its address in the process.
        let at = Some(0x7f00_0057_c800);
        assert_eq!(code_generation(Version::new(3, 12, 1), at, None), (CREATED_AT, 0x7f00_0057_c800));
        assert!(has_creation_counter(Version::new(3, 12, 1)));
        // The symbol means nothing to other versions; 3.13 has no counter at all.
        assert_eq!(code_generation(Version::new(3, 13, 0), at, None), (NONE, 0));
        assert!(!has_creation_counter(Version::new(3, 13, 0)));
        assert_eq!(code_generation(Version::new(3, 12, 1), None, None), (NONE, 0));
        // 3.14+ without `_Py_DebugOffsets`: none.
        assert_eq!(code_generation(Version::new(3, 15, 2), None, None), (NONE, 0));
    }
}
