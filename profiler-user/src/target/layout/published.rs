//! Offsets beyond the stack walk: the interpreter list (subinterpreters) and the objects an
//! asyncio task graph is made of (generators, sets, ints, the intrusive task lists).
//!
//! 3.13+ take them from `_Py_DebugOffsets` (every value checked against its group's `size`
//! before use); 3.12 has a small table (its `PyInterpreterState` starts with `next` and the
//! `int64_t id`, its `PyThreadState` with `prev`, `next`, `interp`). Older versions: none.

use super::{Version, debug_offsets::DebugOffsets};

/// Where a thread state's interpreter and the interpreter list's links are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpreterOffsets {
    /// `next` in `PyInterpreterState` (the list starts at `_PyRuntime.interpreters.head`,
    /// newest first: the main interpreter is the last).
    pub next: u32,
    /// `int64_t id` in `PyInterpreterState` (the main interpreter's is 0); `None` (3.8-3.12)
    /// when subinterpreters are only detected, not followed:
    /// there `_xxsubinterpreters.run_string` runs a thread on the subinterpreter's first thread
    /// state, which belongs to the thread that created it, so no thread state tells which
    /// thread runs where, and samples of such processes are dropped while they have several
    /// interpreters.
    pub id: Option<u32>,
    /// `interp` in `PyThreadState` (GIL waits and the collector's flag use it on every
    /// version; subinterpreters only where `id` is known).
    pub tstate_interp: Option<u32>,
}

/// `interp` in `PyThreadState` in 3.8-3.12: its third pointer (`prev`, `next`, `interp`);
/// 3.13+ publish it (`thread_state.interp`).
const TSTATE_INTERP_LEGACY: u32 = 0x10;

/// Object offsets the asyncio reader needs (3.14+, all from `_Py_DebugOffsets`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectOffsets {
    /// `gi_iframe` / `cr_iframe`: the coroutine's own interpreter frame, inline.
    pub gen_iframe: u32,
    /// `int8_t gi_frame_state`.
    pub gen_frame_state: u32,
    /// `stackpointer` of an interpreter frame (the awaited object is on top while suspended).
    pub frame_stackpointer: u32,
    /// `PySetObject`: `used`, `table`, `mask` (entries are `{key, hash}`, 16 bytes).
    pub set_used: u32,
    pub set_table: u32,
    pub set_mask: u32,
    /// `PyLongObject`: `lv_tag` and the first digit (30-bit digits).
    pub long_tag: u32,
    pub long_digits: u32,
    /// `next` in `struct llist_node`.
    pub llist_next: u32,
    /// `tp_name` (a C string) in a type object.
    pub type_name: u32,
}

/// Interpreter-list offsets for `version`, if pyperch can follow subinterpreters there.
pub fn interpreter_offsets(version: Version, published: Option<&DebugOffsets>) -> Option<InterpreterOffsets> {
    match (version.minor_key(), published) {
        // `next` is the first field of `PyInterpreterState` in 3.8-3.12 (cpython-internals §3).
        ((3, 8..=12), _) => Some(InterpreterOffsets { next: 0, id: None, tstate_interp: Some(TSTATE_INTERP_LEGACY) }),
        ((3, 13..), Some(d)) => Some(InterpreterOffsets {
            next: field(d, "interpreter_state", "next", 8)?,
            id: Some(field(d, "interpreter_state", "id", 8)?),
            tstate_interp: Some(field(d, "thread_state", "interp", 8)?),
        }),
        _ => None,
    }
}

/// Why threads in subinterpreters of `version` cannot be sampled, or `None` when they can.
pub fn interpreter_support_gap(version: Version) -> Option<&'static str> {
    (version.minor_key() < (3, 13)).then_some(
        "threads in subinterpreters cannot be sampled before CPython 3.13, whose subinterpreter API runs threads on thread states of other threads (samples are dropped while a process has several interpreters)",
    )
}

/// Object offsets for the asyncio reader (3.14+).
pub fn object_offsets(published: &DebugOffsets) -> Option<ObjectOffsets> {
    let d = published;
    Some(ObjectOffsets {
        gen_iframe: field(d, "gen_object", "gi_iframe", 0)?,
        gen_frame_state: field(d, "gen_object", "gi_frame_state", 1)?,
        frame_stackpointer: field(d, "interpreter_frame", "stackpointer", 8)?,
        set_used: field(d, "set_object", "used", 8)?,
        set_table: field(d, "set_object", "table", 8)?,
        set_mask: field(d, "set_object", "mask", 8)?,
        long_tag: field(d, "long_object", "lv_tag", 8)?,
        long_digits: field(d, "long_object", "ob_digit", 4)?,
        // `llist_node` has no size: it is two pointers.
        llist_next: d.get("llist_node", "next").filter(|&v| v <= 8).map(|v| v as u32)?,
        type_name: field(d, "type_object", "tp_name", 8)?,
    })
}

/// `group.name`, when `value + width` fits within the group's `size`.
fn field(d: &DebugOffsets, group: &str, name: &str, width: u64) -> Option<u32> {
    let size = d.get(group, "size")?;
    let value = d.get(group, name)?;
    (value.checked_add(width)? <= size && size < 1 << 24).then_some(value as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_gaps() {
        let v312 = Version::new(3, 12, 1);
        let detect_only = InterpreterOffsets { next: 0, id: None, tstate_interp: Some(0x10) };
        assert_eq!(interpreter_offsets(v312, None), Some(detect_only));
        assert_eq!(interpreter_offsets(Version::new(3, 8, 18), None), Some(detect_only));
        // 3.13+ without decoded offsets: nothing guessed.
        assert_eq!(interpreter_offsets(Version::new(3, 14, 0), None), None);
        assert!(interpreter_support_gap(v312).is_some());
        assert!(interpreter_support_gap(Version::new(3, 13, 0)).is_none());
    }
}
