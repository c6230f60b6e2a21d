//! Line numbers of the leaf frame match the interpreter's own: lnotab (3.8/3.9), the pair
//! table (3.10) and the location table (3.11+), including their long encodings.
//!
//! line_numbers.py alternates between two functions that each spend their time on one
//! source line (hot_short: near its `def`; hot_far: past a 255-byte bytecode offset and a
//! 127-line gap) and reports those lines as the interpreter sees them.

use std::collections::BTreeMap;

use pyperch_tests::*;

const HOT: [&str; 2] = ["hot_short", "hot_far"];

fn lines(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "line_numbers.py", &["{dir}/lines.json", "120"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "4", "--rate", "199"]);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(
        status.is_some_and(|s| s.success()),
        "line_numbers.py did not exit cleanly: {status:?}{d}"
    );
    let result = w
        .read_json("lines.json")
        .unwrap_or_else(|e| panic!("{e:#}{d}"));
    let mine = rec.profile.for_pid(w.pid);

    for func in HOT {
        let expected =
            json_f64(&result, &["expected", func]).unwrap_or_else(|e| panic!("{e:#}")) as u32;
        // The workload's own check: a monitor thread read the running frame's f_lineno.
        let observed: BTreeMap<u32, u64> = result["observed"][func]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        let observed_top = observed.iter().max_by_key(|(_, n)| **n).map(|(l, _)| *l);
        assert_eq!(
            observed_top,
            Some(expected),
            "workload self-check: {} reports {func} running on lines {observed:?}, expected {expected}",
            py.describe()
        );

        let mut profiled: BTreeMap<Option<u32>, u64> = BTreeMap::new();
        for s in mine.stacks.iter().filter(|s| s.leaf_is(func)) {
            *profiled.entry(s.leaf().unwrap().line).or_insert(0) += s.count;
        }
        let total: u64 = profiled.values().sum();
        assert!(
            total >= 20,
            "{}: only {total} samples end in {func}{d}",
            py.describe()
        );
        let right = profiled.get(&Some(expected)).copied().unwrap_or(0);
        assert!(
            right as f64 >= 0.9 * total as f64,
            "{}: {func} spins on line {expected} (the interpreter says so), but the profile's leaf lines \
             are {profiled:?} ({right} of {total} right, want >= 90 %){d}",
            py.describe()
        );
    }
}

#[test]
fn lines_3_8() {
    lines("3.8");
}

#[test]
fn lines_3_9() {
    lines("3.9");
}

#[test]
fn lines_3_10() {
    lines("3.10");
}

#[test]
fn lines_3_11() {
    lines("3.11");
}

#[test]
fn lines_3_12() {
    lines("3.12");
}

#[test]
fn lines_3_13() {
    lines("3.13");
}

#[test]
fn lines_sid_3_13() {
    lines("sid-3.13");
}

#[test]
fn lines_sid_3_14() {
    lines("sid-3.14");
}

#[test]
fn lines_sid_3_15() {
    lines("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn lines_ft_3_14() {
    lines(FT_3_14);
}
