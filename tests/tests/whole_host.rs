//! Without --pid, pyperch samples every Python process on the host: three interpreters of
//! different versions (one of them inside the sid chroot when available) that run before the
//! recording starts, and a fourth one started about 1 s after sampling began.

use std::{thread, time::Duration};

use pyperch_tests::*;

/// Preferred order: pyenv 3.9, pyenv 3.12, sid 3.14 (chroot), then the others.
const PREFERENCE: [&str; 9] = [
    "3.9", "3.12", "sid-3.14", "3.11", "3.10", "3.8", "sid-3.15", "3.13", "sid-3.13",
];
const LEAVES: [&str; 3] = ["leaf_red", "leaf_green", "leaf_blue"];
const ALL_LEAVES: [&str; 4] = ["leaf_red", "leaf_green", "leaf_blue", "leaf_late"];

#[test]
fn three_versions_and_a_late_starter() {
    // Three interpreters of distinct versions, then one more (preferably yet another one).
    let available: Vec<Python> = PREFERENCE.iter().filter_map(|l| python_quiet(l)).collect();
    let mut chosen: Vec<Python> = Vec::new();
    for py in &available {
        if chosen.len() < 3 && !chosen.iter().any(|c| c.version() == py.version()) {
            chosen.push(py.clone());
        }
    }
    if chosen.is_empty() {
        skip("no supported python is available");
        return;
    }
    if chosen.len() < 3 {
        note(format!(
            "only {} distinct python versions are available; running with those",
            chosen.len()
        ));
    }
    let late_py = available
        .iter()
        .find(|p| !chosen.iter().any(|c| c.label == p.label))
        .unwrap_or(&chosen[0])
        .clone();

    note(format!(
        "running {} and, 1 s into the recording, {}",
        chosen
            .iter()
            .map(Python::describe)
            .collect::<Vec<_>>()
            .join(", "),
        late_py.describe()
    ));
    let mut early: Vec<(Workload, &str)> = chosen
        .iter()
        .zip(LEAVES)
        .map(|(py, leaf)| {
            let w =
                Workload::spawn(py, "spin.py", &[leaf, "120"]).unwrap_or_else(|e| panic!("{e:#}"));
            (w, leaf)
        })
        .collect();

    let run = RecordRun::start(&["--duration", "6"]);
    // "1 s after the recording began": after pyperch has attached its sampling program.
    if !run.wait_until_sampling(Duration::from_secs(8)) {
        note(
            "did not see pyperch attach its perf events within 8 s; starting the late process 1 s from now anyway",
        );
    }
    thread::sleep(Duration::from_secs(1));
    let mut late = Workload::spawn(&late_py, "spin.py", &["leaf_late", "120"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let rec = run.finish();
    late.terminate();
    for (w, _) in early.iter_mut() {
        w.terminate();
    }
    rec.assert_ok();

    let mut everyone: Vec<(&Workload, &str)> = early.iter().map(|(w, l)| (w, *l)).collect();
    everyone.push((&late, "leaf_late"));
    let summary: String = everyone
        .iter()
        .map(|(w, leaf)| {
            format!(
                "\n    pid {} = {} running {leaf}",
                w.pid,
                w.python.describe()
            )
        })
        .collect();
    for (w, leaf) in &everyone {
        let d = format!("{}\n--- processes:{summary}", rec.diag_pid(w.pid));
        let mine = rec.profile.for_pid(w.pid);
        let total = mine.total();
        assert!(
            total > 0,
            "no samples of pid {} ({} running {leaf}){d}",
            w.pid,
            w.python.describe()
        );
        let hits = mine.with_leaf(leaf);
        // The late one is sampled from its start-up on; the others spin throughout.
        let want = if *leaf == "leaf_late" { 0.5 } else { 0.8 };
        assert!(
            hits as f64 >= want * total as f64,
            "pid {} ({}): {hits} of {total} samples end in {leaf} (want >= {:.0} %){d}",
            w.pid,
            w.python.describe(),
            want * 100.0
        );
        for other in ALL_LEAVES.iter().filter(|o| *o != leaf) {
            let wrong = mine.with_function(other);
            assert_eq!(
                wrong,
                0,
                "pid {} ({}) has {wrong} samples in {other}, which another process runs{d}",
                w.pid,
                w.python.describe()
            );
        }
    }
}

/// A profiled process that replaces itself with another interpreter (os.execv, same pid) is
/// profiled again at once: the kernel stops sampling it with the old layout when it execs,
/// and pyperch registers the new program as soon as its interpreter is up.
#[test]
fn a_process_that_execs_another_python_is_followed() {
    let host: Vec<Python> = ["3.9", "3.12", "3.11", "3.10", "3.13", "3.8"]
        .iter()
        .filter_map(|l| python_quiet(l))
        .filter(|p| p.rootfs.is_none())
        .collect();
    let (Some(first), Some(second)) = (host.first(), host.iter().find(|p| p.version() != host[0].version())) else {
        skip("two host pythons of different versions are needed");
        return;
    };
    let then = format!("exec:leaf_late:3:{}", second.exe.display());
    let mut w =
        Workload::spawn(first, "spin.py", &["leaf_old", "60", &then]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record(&["--duration", "7"]);
    w.terminate();
    rec.assert_ok();
    let d = format!(
        "{}\n--- process: pid {} = {} running leaf_old, exec'ing {} running leaf_late after 3 s",
        rec.diag_pid(w.pid),
        w.pid,
        first.describe(),
        second.describe()
    );
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    let (old, late) = (mine.with_leaf("leaf_old"), mine.with_leaf("leaf_late"));
    assert!(old > 0, "no samples of the first program (leaf_old){d}");
    // Exec about 2.5 s into a 7 s recording: the new program runs for most of it.
    assert!(
        late as f64 >= 0.3 * total as f64,
        "{late} of {total} samples in the program exec'd (leaf_late), want >= 30 %{d}"
    );
}
