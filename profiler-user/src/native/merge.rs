//! Splicing the Python frames into the native stack: every native frame of the interpreter's
//! evaluation function stands for one group of Python frames (3.8-3.10: one frame; 3.12+:
//! the frames between two shim entry frames). Pure functions over ids, unit-tested.
//!
//! Invariant: a result is produced only when the evaluation frames and the groups can be
//! paired one to one from the leaf (all of them when the native unwind reached the bottom of
//! the stack; the leaf-most ones when the copied stack ended first). Otherwise `None`, and
//! the caller shows the Python frames alone with an `<unmerged native>` marker.

use crate::aggregate::FrameId;

/// How a version's interpreter frames map onto calls of the evaluation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalGrouping {
    /// 3.8-3.10: one evaluation call per Python frame.
    PerFrame,
    /// 3.12+: each evaluation call pushes a shim frame (owner `>= shim_owner`) below the
    /// frames it runs.
    Shims { shim_owner: u8 },
    /// The boundaries are not known (3.11 marks them with `is_entry`, not sampled yet).
    Unknown,
}

/// One interpreter frame as walked: its shown frame (`None`: hidden by CPython) and owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkedFrame {
    pub id: Option<FrameId>,
    pub owner: u8,
}

/// The groups of shown frames, leaf first (each group leaf first); `None` when the version's
/// boundaries are unknown.
pub fn groups(leaf_first: &[WalkedFrame], grouping: EvalGrouping) -> Option<Vec<Vec<FrameId>>> {
    match grouping {
        EvalGrouping::Unknown => None,
        EvalGrouping::PerFrame => Some(leaf_first.iter().map(|f| f.id.into_iter().collect()).collect()),
        EvalGrouping::Shims { shim_owner } => {
            let mut out = Vec::new();
            let mut current = Vec::new();
            let mut frames_in_current = 0usize;
            for f in leaf_first {
                if f.owner != u8::MAX && f.owner >= shim_owner {
                    // A shim closes the group of the evaluation call that pushed it. Two shims
                    // in a row (3.15's base frame below the bottom shim) close nothing.
                    if frames_in_current > 0 {
                        out.push(std::mem::take(&mut current));
                        frames_in_current = 0;
                    }
                } else {
                    frames_in_current += 1;
                    current.extend(f.id);
                }
            }
            if frames_in_current > 0 {
                out.push(current);
            }
            Some(out)
        }
    }
}

/// One native frame: its shown frame and whether it is the evaluation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFrame {
    pub id: FrameId,
    pub is_eval: bool,
}

/// The merged stack, leaf first; `None` when the counts do not pair (see the module docs).
/// `complete`: the native unwind reached the bottom of the stack. When it did not, the groups
/// below the last evaluation frame follow `truncated` (a marker frame).
pub fn merge(
    groups: &[Vec<FrameId>],
    native_leaf_first: &[NativeFrame],
    complete: bool,
    truncated: FrameId,
) -> Option<Vec<FrameId>> {
    let evals = native_leaf_first.iter().filter(|f| f.is_eval).count();
    if evals > groups.len() || (complete && evals != groups.len()) {
        return None;
    }
    let mut out = Vec::with_capacity(native_leaf_first.len() + groups.iter().map(Vec::len).sum::<usize>() + 1);
    let mut next_group = 0;
    for f in native_leaf_first {
        if f.is_eval {
            out.extend_from_slice(&groups[next_group]);
            next_group += 1;
        } else {
            out.push(f.id);
        }
    }
    if next_group < groups.len() {
        out.push(truncated);
        for g in &groups[next_group..] {
            out.extend_from_slice(g);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(id: u32, owner: u8) -> WalkedFrame {
        WalkedFrame { id: Some(id), owner }
    }
    const EVAL: NativeFrame = NativeFrame { id: 900, is_eval: true };
    fn n(id: u32) -> NativeFrame {
        NativeFrame { id, is_eval: false }
    }

    #[test]
    fn per_frame_groups() {
        let g = groups(&[f(1, 255), f(2, 255)], EvalGrouping::PerFrame).unwrap();
        assert_eq!(g, vec![vec![1], vec![2]]);
    }

    #[test]
    fn shim_groups_and_the_315_base_frame() {
        // leaf: 1, 2 (one call), shim, 3 (another call), shim, base frame (shim owner too).
        let walked = [f(1, 0), f(2, 0), f(10, 3), f(3, 0), f(11, 3), f(12, 3)];
        let g = groups(&walked, EvalGrouping::Shims { shim_owner: 3 }).unwrap();
        assert_eq!(g, vec![vec![1, 2], vec![3]]);
        // A hidden frame still belongs to its call.
        let walked = [WalkedFrame { id: None, owner: 0 }, f(10, 3), f(3, 0), f(11, 3)];
        let g = groups(&walked, EvalGrouping::Shims { shim_owner: 3 }).unwrap();
        assert_eq!(g, vec![vec![], vec![3]]);
        assert!(groups(&walked, EvalGrouping::Unknown).is_none());
    }

    #[test]
    fn merges_in_place_and_refuses_mismatches() {
        // leaf: C function 50, eval (group [1]), sort 51, eval (group [2, 3]), main 52.
        let native = [n(50), EVAL, n(51), EVAL, n(52)];
        let g = vec![vec![1], vec![2, 3]];
        assert_eq!(merge(&g, &native, true, 999), Some(vec![50, 1, 51, 2, 3, 52]));
        // One group too many for a complete unwind: never spliced.
        let g3 = vec![vec![1], vec![2], vec![3]];
        assert_eq!(merge(&g3, &native, true, 999), None);
        // Truncated unwind: the rest follows the marker.
        assert_eq!(merge(&g3, &native, false, 999), Some(vec![50, 1, 51, 2, 52, 999, 3]));
        // More evaluation frames than groups: never.
        assert_eq!(merge(&g[..1], &native, false, 999), None);
    }
}
