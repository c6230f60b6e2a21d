//! Splicing the Python frames into the native stack: every native frame of the interpreter's
//! evaluation function stands for one group of Python frames. Pure functions over ids,
//! unit-tested.
//!
//! How a group finds its native frame:
//! - 3.12+: each evaluation call pushes a shim frame below the Python frames it runs, and
//!   that shim lives in the evaluation function's own C stack frame. The native frame whose
//!   stack range holds the shim's address is that call, whatever its symbol (Debian's static
//!   interpreters have no symbol for the split-off parts of the function).
//! - 3.11: each evaluation call runs the frames from one with `is_entry` set (the call's
//!   first, its bottom) up to the next one; the evaluation frames are found by name.
//! - 3.8-3.10: one evaluation call per Python frame; the evaluation frames are found by name.
//!
//! Invariant: a result is produced only when every group is paired with one native frame,
//! in order from the leaf, and every native frame named as the evaluation function got a
//! group (but the frame an unwind stopped in, whose extent is unknown) — except that when the
//! unwound stack ended before the bottom, the groups past its end follow a marker. Otherwise
//! `None`, and the caller shows the Python frames alone with an `<unmerged native>` marker. A
//! stack unwound short of its bottom always carries the marker: where Python groups remain,
//! before them; else at the root, so that no such stack reads as whole.

use super::FrameId;

/// How a version's interpreter frames map onto calls of the evaluation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalGrouping {
    /// 3.8-3.10: one evaluation call per Python frame.
    PerFrame,
    /// 3.12+: shim frames (owner `>= shim_owner`) close the group of each call.
    Shims { shim_owner: u8 },
    /// 3.11: a frame with `is_entry` set is the bottom frame of its call's group.
    Entries,
    /// The boundaries are not known.
    Unknown,
}

/// One interpreter frame as walked: address, shown frame (`None`: hidden by CPython), owner,
/// and whether it is the first frame of an evaluation call (3.11 `is_entry`; else false).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkedFrame {
    pub address: u64,
    pub id: Option<FrameId>,
    pub owner: u8,
    pub is_entry: bool,
}

/// The Python frames of one evaluation call, leaf first, and the address of the shim that
/// closes them (3.12+).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub ids: Vec<FrameId>,
    pub shim: Option<u64>,
}

/// The groups, leaf first; `None` when the version's boundaries are unknown.
pub fn groups(leaf_first: &[WalkedFrame], grouping: EvalGrouping) -> Option<Vec<Group>> {
    match grouping {
        EvalGrouping::Unknown => None,
        EvalGrouping::PerFrame => {
            Some(leaf_first.iter().map(|f| Group { ids: f.id.into_iter().collect(), shim: None }).collect())
        }
        EvalGrouping::Entries => {
            let mut out = Vec::new();
            let mut current = Vec::new();
            let mut frames_in_current = 0usize;
            for f in leaf_first {
                frames_in_current += 1;
                current.extend(f.id);
                if f.is_entry {
                    out.push(Group { ids: std::mem::take(&mut current), shim: None });
                    frames_in_current = 0;
                }
            }
            // Frames below the last entry frame belong to no call we can name: refuse.
            if frames_in_current > 0 {
                return None;
            }
            Some(out)
        }
        EvalGrouping::Shims { shim_owner } => {
            let mut out = Vec::new();
            let mut current = Vec::new();
            let mut frames_in_current = 0usize;
            for f in leaf_first {
                if f.owner != u8::MAX && f.owner >= shim_owner {
                    // Two shims in a row (3.15's base frame below the bottom shim) close nothing.
                    if frames_in_current > 0 {
                        out.push(Group { ids: std::mem::take(&mut current), shim: Some(f.address) });
                        frames_in_current = 0;
                    }
                } else {
                    frames_in_current += 1;
                    current.extend(f.id);
                }
            }
            if frames_in_current > 0 {
                out.push(Group { ids: current, shim: None });
            }
            Some(out)
        }
    }
}

/// One native frame: its shown frame, whether its symbol is the evaluation function, and
/// the stack range it occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFrame {
    pub id: FrameId,
    pub is_eval: bool,
    pub low: u64,
    pub high: u64,
}

/// The merged stack, leaf first; `None` when the frames do not pair (see the module docs).
/// `complete`: the native unwind reached the bottom of the stack.
pub fn merge(groups: &[Group], native: &[NativeFrame], complete: bool, truncated: FrameId) -> Option<Vec<FrameId>> {
    // Which group each native frame stands for.
    let mut owner: Vec<Option<usize>> = vec![None; native.len()];
    let by_stack = groups.iter().any(|g| g.shim.is_some());
    let mut placed = 0;
    if by_stack {
        let mut from = 0;
        for (gi, g) in groups.iter().enumerate() {
            let found = g.shim.and_then(|shim| {
                native[from..].iter().position(|f| f.low <= shim && shim < f.high).map(|k| from + k)
            });
            match found {
                Some(k) => {
                    owner[k] = Some(gi);
                    from = k + 1;
                    placed = gi + 1;
                }
                None => break,
            }
        }
    } else {
        let mut next = 0;
        for (k, f) in native.iter().enumerate() {
            if f.is_eval {
                if next >= groups.len() {
                    return None;
                }
                owner[k] = Some(next);
                next += 1;
            }
        }
        placed = next;
    }
    // Every evaluation frame by name stands for a group; but for the frame a walk stopped in
    // (an empty extent: its size is unknown), whose group, if any, lies past the unwound
    // stack and follows the marker.
    if native.iter().zip(&owner).any(|(f, o)| f.is_eval && o.is_none() && !(by_stack && f.low == f.high)) {
        return None;
    }
    if placed < groups.len() {
        // Only groups past the end of the unwound stack may be left over.
        let top = native.last().map_or(0, |f| f.high);
        let beyond = groups[placed..].iter().all(|g| g.shim.is_none_or(|s| s >= top));
        if complete || !beyond {
            return None;
        }
    }
    let mut out = Vec::with_capacity(native.len() + groups.iter().map(|g| g.ids.len()).sum::<usize>() + 1);
    for (f, o) in native.iter().zip(&owner) {
        match o {
            Some(gi) => out.extend_from_slice(&groups[*gi].ids),
            None => out.push(f.id),
        }
    }
    // Where the unwind stopped: before the groups it did not reach, else at the root (the
    // native frames below it are not known: musl's libc below `main`, a copy that ended).
    if placed < groups.len() || !complete {
        out.push(truncated);
    }
    for g in &groups[placed..] {
        out.extend_from_slice(&g.ids);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(address: u64, id: u32, owner: u8) -> WalkedFrame {
        WalkedFrame { address, id: Some(id), owner, is_entry: false }
    }
    fn n(id: u32, is_eval: bool, low: u64, high: u64) -> NativeFrame {
        NativeFrame { id, is_eval, low, high }
    }

    #[test]
    fn per_frame_groups() {
        let g = groups(&[w(1, 1, 255), w(2, 2, 255)], EvalGrouping::PerFrame).unwrap();
        assert_eq!(g.iter().map(|g| g.ids.clone()).collect::<Vec<_>>(), vec![vec![1], vec![2]]);
    }

    #[test]
    fn shim_groups_and_the_315_base_frame() {
        // leaf: 1, 2 (one call), shim, 3 (another call), shim, base frame (shim owner too).
        let walked = [w(0, 1, 0), w(0, 2, 0), w(0x100, 10, 3), w(0, 3, 0), w(0x200, 11, 3), w(0x900, 12, 3)];
        let g = groups(&walked, EvalGrouping::Shims { shim_owner: 3 }).unwrap();
        assert_eq!(g, vec![Group { ids: vec![1, 2], shim: Some(0x100) }, Group { ids: vec![3], shim: Some(0x200) }]);
        // A hidden frame still belongs to its call.
        let walked = [WalkedFrame { address: 0, id: None, owner: 0, is_entry: false }, w(0x100, 10, 3)];
        let g = groups(&walked, EvalGrouping::Shims { shim_owner: 3 }).unwrap();
        assert_eq!(g, vec![Group { ids: vec![], shim: Some(0x100) }]);
        assert!(groups(&walked, EvalGrouping::Unknown).is_none());
    }

    #[test]
    fn entry_groups_3_11() {
        let e = |id: u32| WalkedFrame { is_entry: true, ..w(0, id, 0) };
        // leaf: 1, 2 (entry: one call), 3 (entry: another call).
        let g = groups(&[w(0, 1, 0), e(2), e(3)], EvalGrouping::Entries).unwrap();
        assert_eq!(g.iter().map(|g| g.ids.clone()).collect::<Vec<_>>(), vec![vec![1, 2], vec![3]]);
        // A bottom frame that is no entry frame: the calls cannot be told.
        assert!(groups(&[e(1), w(0, 2, 0)], EvalGrouping::Entries).is_none());
    }

    #[test]
    fn merges_by_name_and_refuses_mismatches() {
        // leaf: C function 50, eval (group [1]), sort 51, eval (group [2]), main 52.
        let native = [n(50, false, 0, 0), n(900, true, 0, 0), n(51, false, 0, 0), n(901, true, 0, 0), n(52, false, 0, 0)];
        let g = |ids: &[&[u32]]| ids.iter().map(|i| Group { ids: i.to_vec(), shim: None }).collect::<Vec<_>>();
        assert_eq!(merge(&g(&[&[1], &[2]]), &native, true, 999), Some(vec![50, 1, 51, 2, 52]));
        // One group too many for a complete unwind: never spliced.
        assert_eq!(merge(&g(&[&[1], &[2], &[3]]), &native, true, 999), None);
        // The copied stack ended first: the rest follows the marker.
        assert_eq!(merge(&g(&[&[1], &[2], &[3]]), &native, false, 999), Some(vec![50, 1, 51, 2, 52, 999, 3]));
        // More evaluation frames than groups: never.
        assert_eq!(merge(&g(&[&[1]]), &native, false, 999), None);
    }

    #[test]
    fn merges_by_shim_address_whatever_the_names() {
        // Stack ranges: C 0x00-0x10, eval (unnamed) 0x10-0x40, C 0x40-0x50, eval 0x50-0x90, main.
        let native =
            [n(50, false, 0, 0x10), n(60, false, 0x10, 0x40), n(51, false, 0x40, 0x50), n(61, false, 0x50, 0x90), n(52, false, 0x90, u64::MAX)];
        let groups = vec![Group { ids: vec![1, 2], shim: Some(0x20) }, Group { ids: vec![3], shim: Some(0x60) }];
        assert_eq!(merge(&groups, &native, true, 999), Some(vec![50, 1, 2, 51, 3, 52]));
        // A shim in no frame of a complete stack: never spliced.
        let lost = vec![groups[0].clone(), Group { ids: vec![3], shim: Some(0x5) }];
        assert_eq!(merge(&lost, &native, true, 999), None);
        // A named evaluation frame without a group: never spliced.
        let mut named = native;
        named[4].is_eval = true;
        assert_eq!(merge(&groups, &named, true, 999), None);
        // Truncated: groups whose shims lie past the unwound stack follow the marker.
        let short = &native[..4];
        let more = vec![groups[0].clone(), groups[1].clone(), Group { ids: vec![4], shim: Some(0x100) }];
        assert_eq!(merge(&more, short, false, 999), Some(vec![50, 1, 2, 51, 3, 999, 4]));
        // The walk stopped in an evaluation frame (empty extent): shown, its group after the
        // marker.
        let stopped = [native[0], native[1], native[2], n(61, true, 0x50, 0x50)];
        assert_eq!(merge(&groups, &stopped, false, 999), Some(vec![50, 1, 2, 51, 61, 999, 3]));
    }

    #[test]
    fn a_stack_unwound_short_of_its_bottom_always_says_where() {
        // musl: every group placed, the unwind stopped below them (in its libc, below
        // `Py_BytesMain`): the marker at the root, never a stack that reads as whole.
        let native = [n(50, false, 0, 0x10), n(60, false, 0x10, 0x40), n(52, false, 0x40, 0x50)];
        let groups = vec![Group { ids: vec![1, 2], shim: Some(0x20) }];
        assert_eq!(merge(&groups, &native, false, 999), Some(vec![50, 1, 2, 52, 999]));
        assert_eq!(merge(&groups, &native, true, 999), Some(vec![50, 1, 2, 52]));
        // Stopped at the leaf (a thread inside a system call in musl's libc): nothing
        // unwound, the marker at the leaf and every Python frame below it.
        assert_eq!(merge(&groups, &[], false, 999), Some(vec![999, 1, 2]));
        // By name (3.8-3.11) likewise.
        let by_name = [Group { ids: vec![1], shim: None }];
        assert_eq!(merge(&by_name, &[n(50, false, 0, 0), n(900, true, 0, 0)], false, 999), Some(vec![50, 1, 999]));
        assert_eq!(merge(&by_name, &[], false, 999), Some(vec![999, 1]));
    }
}
