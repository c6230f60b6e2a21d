//! Every supported CPython version: deep stacks are complete and the CPU split between two
//! leaves matches the split the workload measured itself.
//!
//! split.py descends through chain_00 … chain_27 and then calls leaf_a (~30 %) or leaf_b
//! (~70 %), timing each leaf with time.thread_time.

use pyperch_tests::*;

const CHAIN: usize = 28;

/// `Some(leaf)` when the Python stack holds chain_00 … chain_27 in order, directly
/// followed by the leaf frame leaf_a or leaf_b, all located in split.py.
fn full_chain_leaf(stack: &Stack) -> Option<&'static str> {
    let frames = stack.python_frames();
    let start = frames.iter().position(|f| f.is("chain_00"))?;
    if frames.len() != start + CHAIN + 1 {
        return None;
    }
    for (k, f) in frames[start..start + CHAIN].iter().enumerate() {
        if !f.is(&format!("chain_{k:02}")) || !f.file.ends_with("split.py") || f.line.is_none() {
            return None;
        }
    }
    let leaf = &frames[start + CHAIN];
    if !leaf.file.ends_with("split.py") || leaf.line.is_none() {
        return None;
    }
    ["leaf_a", "leaf_b"].into_iter().find(|name| leaf.is(name))
}

fn split(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "split.py", &["{dir}/split.json", "120"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "5", "--rate", "199"]);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(
        status.is_some_and(|s| s.success()),
        "{} split.py did not exit cleanly: {status:?}{d}",
        py.describe()
    );
    let measured = w
        .read_json("split.json")
        .unwrap_or_else(|e| panic!("{e:#}{d}"));
    let a_secs = json_f64(&measured, &["leaf_a"]).unwrap();
    let b_secs = json_f64(&measured, &["leaf_b"]).unwrap();

    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    assert!(
        total >= 100,
        "only {total} samples of {} pid {} in 5 s at 199 Hz{d}",
        py.describe(),
        w.pid
    );

    let a = mine.count(|s| full_chain_leaf(s) == Some("leaf_a"));
    let b = mine.count(|s| full_chain_leaf(s) == Some("leaf_b"));
    let complete = (a + b) as f64 / total as f64;
    assert!(
        complete >= 0.95,
        "{}: only {:.1} % of {total} samples hold chain_00..chain_27 (split.py) ending in leaf_a/leaf_b (want >= 95 %){d}",
        py.describe(),
        complete * 100.0
    );

    let profiled = a as f64 / (a + b) as f64;
    let own = a_secs / (a_secs + b_secs);
    note(format!(
        "{}: {total} samples, {:.1} % with the full chain; leaf_a share profiled {:.1} %, measured {:.1} %",
        py.describe(),
        complete * 100.0,
        profiled * 100.0,
        own * 100.0
    ));
    assert!(
        (profiled - own).abs() <= 0.05,
        "{}: profiled leaf_a share {:.1} % ({a} of {} samples) vs the workload's own {:.1} % \
         ({a_secs:.2} s / {:.2} s); want within 5 points{d}",
        py.describe(),
        profiled * 100.0,
        a + b,
        own * 100.0,
        a_secs + b_secs
    );
}

#[test]
fn split_3_8() {
    split("3.8");
}

#[test]
fn split_3_9() {
    split("3.9");
}

#[test]
fn split_3_10() {
    split("3.10");
}

#[test]
fn split_3_11() {
    split("3.11");
}

#[test]
fn split_3_12() {
    split("3.12");
}

#[test]
fn split_3_13() {
    split("3.13");
}

#[test]
fn split_sid_3_13() {
    split("sid-3.13");
}

#[test]
fn split_sid_3_14() {
    split("sid-3.14");
}

#[test]
fn split_sid_3_15() {
    split("sid-3.15");
}
