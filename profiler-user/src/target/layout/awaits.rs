//! Where a coroutine suspended in `await` keeps what it awaits, per version: what asyncio task
//! stacks need beyond the offsets `.AsyncioDebug` and `_Py_DebugOffsets` publish (3.14+;
//! earlier versions do not record which task awaits which).

use super::Version;

/// One version's facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwaitLayout {
    /// `gi_frame_state` values of a coroutine suspended in `await` (yield from).
    pub yield_from_states: &'static [i8],
    /// Where the awaited object is on a suspended frame's stack, in words below its
    /// `stackpointer`: 1 in 3.14; 2 in 3.15, whose `SEND` keeps one more value above it.
    pub awaited_slot: u64,
    /// `gi_frame_state` values of a suspended coroutine (in `await` or at a `yield`).
    pub suspended_states: &'static [i8],
}

const AWAIT_3_14: AwaitLayout = AwaitLayout { yield_from_states: &[-1], awaited_slot: 1, suspended_states: &[-2, -1] };
/// 3.15 and later.
const AWAIT_3_15: AwaitLayout = AwaitLayout { yield_from_states: &[2, 3], awaited_slot: 2, suspended_states: &[1, 2, 3] };

/// The facts for `version`; `None` before 3.14, which has no asyncio task stacks.
pub fn await_layout(version: Version) -> Option<AwaitLayout> {
    match version.minor_key() {
        key if key < (3, 14) => None,
        (3, 14) => Some(AWAIT_3_14),
        _ => Some(AWAIT_3_15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_stacks_start_with_3_14() {
        assert_eq!(await_layout(Version::new(3, 13, 0)), None);
        assert_eq!(await_layout(Version::new(3, 14, 0)).map(|a| a.awaited_slot), Some(1));
        assert_eq!(await_layout(Version::new(3, 15, 0)).map(|a| a.yield_from_states), Some(&[2i8, 3][..]));
    }
}
