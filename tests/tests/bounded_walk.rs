//! The kernel walk without `bpf_loop` (for kernels before 5.17), forced on this kernel with
//! `PYPERCH_KERNEL_WALK=bounded`: the same complete, exact deep stacks as the `bpf_loop`
//! walk (deep_stacks.rs), through its tail calls (64 frames in full, then 64 hashed frames
//! per tail call). `cargo xtask test-kernels` runs it on a real 5.10 kernel.

use pyperch_tests::*;

const VERSIONS: [&str; 3] = ["3.9", "3.11", "sid-3.15"];

/// Whether the stack is exactly `<module>`, DEPTH + 1 `recurse` frames, `hot_loop` and a leaf.
fn exact(stack: &Stack, depth: usize) -> bool {
    let frames = stack.python_frames();
    frames.len() == depth + 4
        && frames[0].is("<module>")
        && frames[1..depth + 2].iter().all(|f| f.is("recurse") && f.line.is_some())
        && frames[depth + 2].is("hot_loop")
        && (frames[depth + 3].is("leaf_a") || frames[depth + 3].is("leaf_b"))
}

fn bounded_recursion(label: &str, depth: usize) {
    let Some(py) = python(label) else { return };
    let depth_arg = depth.to_string();
    let mut w = Workload::spawn(&py, "deep.py", &[&depth_arg, "{dir}/deep.json", "120"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = RecordRun::start_env(
        &["--pid", &pid, "--duration", "4", "--rate", "499", "--stats"],
        &[("PYPERCH_KERNEL_WALK", "bounded")],
    )
    .finish();
    w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    let whole = mine.count(|s| exact(s, depth));
    note(format!("{} depth {depth}, bounded walk: {whole} of {total} samples complete at the exact depth", py.describe()));
    assert!(total >= 200, "{}: only {total} samples at depth {depth}{d}", py.describe());
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{}: only {whole} of {total} samples complete at depth {depth} with the bounded walk{d}",
        py.describe()
    );
}

#[test]
fn bounded_walk_recursion_depth_300() {
    for label in VERSIONS {
        bounded_recursion(label, 300);
    }
}

/// 1,505 frames: 64 in full and 1,441 hashed over 23 tail calls.
#[test]
fn bounded_walk_recursion_depth_1500() {
    for label in VERSIONS {
        bounded_recursion(label, 1500);
    }
}
