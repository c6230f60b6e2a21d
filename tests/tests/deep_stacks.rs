//! Deep stacks at kernel speed: complete and exact at any depth, and never a stack that did
//! not happen (frame-address reuse, changing parent lines, code objects reallocated at the
//! same address).

use std::ffi::OsString;

use pyperch_tests::*;

/// Versions the deep-stack tests run on: one of each frame model (3.8-3.10 frame objects,
/// 3.11 and 3.12 interpreter frames, 3.13+ `_Py_DebugOffsets`, 3.15 static).
const VERSIONS: [&str; 4] = ["3.9", "3.11", "3.13", "sid-3.15"];

/// `Some(leaf)` when the stack is exactly `<module>`, DEPTH + 1 `recurse` frames, `hot_loop`
/// and leaf_a or leaf_b.
fn exact_leaf(stack: &Stack, depth: usize) -> Option<&'static str> {
    let frames = stack.python_frames();
    if frames.len() != depth + 4 || !frames[0].is("<module>") {
        return None;
    }
    if !frames[1..depth + 2].iter().all(|f| f.is("recurse") && f.line.is_some()) {
        return None;
    }
    if !frames[depth + 2].is("hot_loop") {
        return None;
    }
    ["leaf_a", "leaf_b"].into_iter().find(|leaf| frames[depth + 3].is(leaf))
}

fn recursion(label: &str, depth: usize) {
    let Some(py) = python(label) else { return };
    let depth_arg = depth.to_string();
    let mut w = Workload::spawn(&py, "deep.py", &[&depth_arg, "{dir}/deep.json", "120"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "5", "--rate", "499", "--stats"]);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} deep.py failed: {status:?}{d}", py.describe());
    let measured = w.read_json("deep.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    let a_secs = json_f64(&measured, &["leaf_a"]).unwrap();
    let b_secs = json_f64(&measured, &["leaf_b"]).unwrap();
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    assert!(total >= 300, "only {total} samples at depth {depth}{d}");
    let a = mine.count(|s| exact_leaf(s, depth) == Some("leaf_a"));
    let b = mine.count(|s| exact_leaf(s, depth) == Some("leaf_b"));
    let complete = (a + b) as f64 / total as f64;
    let profiled = a as f64 / (a + b).max(1) as f64;
    let own = a_secs / (a_secs + b_secs);
    note(format!(
        "{} depth {depth}: {total} samples, {:.1} % complete at the exact depth; leaf_a {:.1} % profiled vs {:.1} % measured",
        py.describe(),
        complete * 100.0,
        profiled * 100.0,
        own * 100.0
    ));
    assert!(complete >= 0.95, "{}: only {:.1} % of samples complete at depth {depth}{d}", py.describe(), complete * 100.0);
    assert!((profiled - own).abs() <= 0.05, "{}: leaf split {:.1} % vs {:.1} %{d}", py.describe(), profiled * 100.0, own * 100.0);
    // Deep samples are completed from the frame cache, not by re-reading memory each time.
    let stats = &rec.run.stderr;
    assert!(stats.contains("full hits"), "no frame-cache statistics in --stats output{d}");
}

#[test]
fn recursion_depth_300() {
    side_by_side(&VERSIONS, 2, |label| recursion(label, 300));
}

#[test]
fn recursion_depth_1500() {
    side_by_side(&VERSIONS, 2, |label| recursion(label, 1500));
}

/// Two chains alternating in a tight loop never mix, over at least 100,000 samples.
#[test]
fn alternating_chains_never_mix() {
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10"]) else { return };
    let Some(py2) = first_python(&["sid-3.15", "sid-3.14", "3.9", "3.8"]) else { return };
    let w1 = Workload::spawn(&py, "frame_reuse.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let w2 = Workload::spawn(&py2, "frame_reuse.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let (p1, p2) = (w1.pid.to_string(), w2.pid.to_string());
    let rec = record(&["--pid", &p1, "--pid", &p2, "--duration", "14", "--rate", "10000", "--stats"]);
    rec.assert_ok();
    let d = rec.diag();
    let total = rec.profile.total();
    let mixed = rec.profile.count(|s| {
        let frames = s.python_frames();
        let alpha = frames.iter().any(|f| f.name.starts_with("alpha_"));
        let beta = frames.iter().any(|f| f.name.starts_with("beta_"));
        alpha && beta
    });
    let leaves = rec.profile.count(|s| s.leaf_is("shared_leaf"));
    note(format!("{total} samples, {mixed} mixing the two chains, {leaves} in shared_leaf"));
    assert!(total >= 100_000, "only {total} samples; the check needs at least 100,000{d}");
    assert_eq!(mixed, 0, "{mixed} samples mix alpha_* and beta_* frames: stacks that never happened{d}");
    // Every shared_leaf sample sits under exactly one complete chain.
    let whole = rec.profile.count(|s| {
        let names: Vec<String> = s.python_frames().iter().map(|f| f.name.clone()).collect();
        let tail: Vec<&str> = names.iter().rev().take(4).map(String::as_str).collect();
        tail == ["shared_leaf", "alpha_3", "alpha_2", "alpha_1"] || tail == ["shared_leaf", "beta_3", "beta_2", "beta_1"]
    });
    assert_eq!(whole, leaves, "some shared_leaf samples are not under a complete chain{d}");
}

/// The parent's line follows the call that is running, though the child's frame address is
/// the same for both calls.
#[test]
fn parent_line_follows_the_call() {
    // Side by side: the checks are exactness and a minimum far below what a shared CPU gives.
    side_by_side(&["3.10", "3.12", "sid-3.14"], 3, |label| parent_line(label));
}

fn parent_line(label: &str) {
    let Some(py) = python(label) else { return };
    let w = Workload::spawn(&py, "parent_line.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let fields = w.ready_fields();
    let one: u32 = fields["one"].parse().unwrap();
    let two: u32 = fields["two"].parse().unwrap();
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "4", "--rate", "2000"]);
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    let mut right = 0;
    let mut wrong = 0;
    for s in &rec.profile.stacks {
        let frames = s.python_frames();
        let Some(p) = frames.iter().position(|f| f.is("parent")) else { continue };
        let (Some(child), Some(spin)) = (frames.get(p + 1), frames.get(p + 2)) else { continue };
        if !child.is("child") {
            continue;
        }
        let expected = if spin.is("spin_one") {
            one
        } else if spin.is("spin_two") {
            two
        } else {
            continue;
        };
        if frames[p].line == Some(expected) {
            right += s.count;
        } else {
            wrong += s.count;
        }
    }
    note(format!("{}: {right} samples with the right parent line, {wrong} wrong", py.describe()));
    assert!(right > 200, "{}: too few parent/child/spin samples ({right}){d}", py.describe());
    assert_eq!(wrong, 0, "{}: {wrong} samples show the other call's parent line{d}", py.describe());
}

/// Code objects compiled, run and dropped in a loop: each function's samples carry its own
/// name, file and line, never those of an earlier code object at the same address.
#[test]
fn reallocated_code_objects_keep_their_own_names() {
    for label in ["3.9", "3.12", "sid-3.15"] {
        let Some(py) = python(label) else { continue };
        let dir = WorkDir::new(&py, "churn").unwrap_or_else(|e| panic!("{e:#}"));
        let count = 120usize;
        let ms = 40.0;
        let rate = 997.0;
        let mut argv: Vec<String> = vec!["--rate".into(), "997".into(), "--".into()];
        argv.extend(py.argv().into_iter().map(|a: OsString| a.to_string_lossy().into_owned()));
        argv.push(dir.guest_path("code_churn.py"));
        argv.extend([count.to_string(), ms.to_string(), dir.guest_path("churn.json")]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let rec = record(&argv);
        rec.assert_ok();
        let d = rec.diag();
        let mut per_fn = vec![0u64; count];
        for s in &rec.profile.stacks {
            let Some(leaf) = s.leaf() else { continue };
            let Some(i) = leaf.name.strip_prefix("fn_").and_then(|n| n.parse::<usize>().ok()) else { continue };
            assert!(i < count, "unknown function {}{d}", leaf.name);
            assert_eq!(leaf.file, format!("<churn_{i}>"), "{}: fn_{i} shown with another code object's file{d}", py.describe());
            let pad = (i % 5) as u32;
            let line = leaf.line.unwrap_or(0);
            assert!(
                (2 + pad..=5 + pad).contains(&line),
                "{}: fn_{i} shown at line {line}, which is not one of its own lines{d}",
                py.describe()
            );
            per_fn[i] += s.count;
        }
        let expected = ms / 1000.0 * rate;
        let seen = per_fn.iter().filter(|&&n| n as f64 >= 0.3 * expected).count();
        let too_many = per_fn.iter().enumerate().filter(|(_, n)| **n as f64 > 2.0 * expected + 10.0).count();
        note(format!(
            "{}: {seen} of {count} functions have at least 30 % of their ~{expected:.0} expected samples; {too_many} have more than twice",
            py.describe()
        ));
        assert!(seen as f64 >= 0.9 * count as f64, "{}: only {seen} of {count} functions were attributed their samples{d}", py.describe());
        assert_eq!(too_many, 0, "{}: some functions got other functions' samples{d}", py.describe());
    }
}

/// Depth of the rebuilt recursion: as in `cargo xtask test-kernels`, far below the kernel's
/// 64 full frames.
const REBUILT_DEPTH: usize = 400;

/// Where a stack of `rebuilt_deep.py` is: `Some(true)` the whole recursion down to `leaf`,
/// `Some(false)` a stack the workload has on its way down or up, `None` one it never has.
fn rebuilt_stack(stack: &Stack) -> Option<bool> {
    let frames = stack.python_frames();
    let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
    let [module, main, rest @ ..] = names.as_slice() else { return (names == ["<module>"]).then_some(false) };
    if *module != "<module>" || *main != "main" {
        return None;
    }
    let deep = rest.iter().take_while(|n| **n == "deep").count();
    match &rest[deep..] {
        [] if deep <= REBUILT_DEPTH + 1 => Some(false),
        ["middle"] | ["middle", "leaf"] if deep == REBUILT_DEPTH + 1 => Some(rest.len() == deep + 2),
        _ => None,
    }
}

/// The percentage `--stats` gives for stale tails (0 when none were counted).
fn stale_tail_percent(stats: &str) -> f64 {
    stats
        .lines()
        .filter(|l| l.starts_with(' ') && l.contains("stale tail (completion did not validate)"))
        .find_map(|l| l.rsplit_once('(')?.1.trim().trim_end_matches("%)").trim().parse().ok())
        .unwrap_or(0.0)
}

/// A 400-deep recursion rebuilt over and over (the workload of `cargo xtask test-kernels`):
/// the hashed tail must be read from the target before the stack changes. Reading it one
/// frame at a time through the worker's deadline reader could not (96-99 % of the samples
/// were dropped as stale tails on 3.9 and 3.12); a chain read does, and the drain's busy
/// interval after late samples keeps the wait for a record short. Most samples are kept
/// and whole, and none is a stack the workload never has. The leaf lasts about half a
/// millisecond on 3.11+, whose frames are rebuilt in the same places (the workload of
/// test-kernels), and 20 ms on 3.9, whose 340 tail frames are objects taken from the
/// allocator again at every rebuild, in another order, and read one by one (about 1 ms: a
/// leaf of 1 ms there keeps about a fifth of the samples).
#[test]
fn rebuilt_recursion_is_completed() {
    side_by_side(&["3.9", "3.12", "3.13", "sid-3.15"], 1, |label| {
        let Some(py) = python(label) else { return };
        let iterations = if *label == "3.9" { "480000" } else { "20000" };
        let depth = REBUILT_DEPTH.to_string();
        let mut w = Workload::spawn(&py, "rebuilt_deep.py", &[&depth, iterations, "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let rec = record(&["--pid", &pid, "--duration", "4", "--rate", "199", "--stats"]);
        let status = w.terminate();
        rec.assert_ok();
        let d = rec.diag_pid(w.pid);
        assert!(status.is_some_and(|s| s.success()), "{} rebuilt_deep.py failed: {status:?}{d}", py.describe());
        let mine = rec.profile.for_pid(w.pid);
        let total = mine.total();
        let whole = mine.count(|s| rebuilt_stack(s) == Some(true));
        let impossible = mine.count(|s| rebuilt_stack(s).is_none());
        let stale = stale_tail_percent(&rec.run.stderr);
        note(format!("{}: {total} samples kept, {whole} through all {} deep frames; {stale:.1} % stale tails", py.describe(), REBUILT_DEPTH + 1));
        assert_eq!(impossible, 0, "{}: {impossible} stacks the workload never has{d}", py.describe());
        assert!(stale <= 25.0, "{}: {stale:.1} % of the samples dropped as stale tails{d}", py.describe());
        assert!(whole * 10 >= total * 8, "{}: only {whole} of {total} samples whole{d}", py.describe());
    });
}
