//! `--threads`: every thread gets its own `thread <tid>` frame, and a thread running C code
//! with the GIL released (hashlib over 64 MiB) is still attributed to its Python stack.

use std::collections::BTreeMap;

use pyperch_tests::*;

const SPINNERS: [&str; 4] = ["spin_alpha", "spin_beta", "spin_gamma", "spin_delta"];

fn threads(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "threads.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    // "ready PID hash_worker=TID spin_alpha=TID ..." with native thread ids.
    let native: BTreeMap<String, u32> = w
        .ready_fields()
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect();
    let pid = w.pid.to_string();
    let rec = record(&[
        "--pid",
        &pid,
        "--duration",
        "4",
        "--rate",
        "199",
        "--threads",
    ]);
    w.terminate();
    rec.assert_ok();
    let d = format!(
        "{}\n--- native thread ids reported by the workload: {native:?}\n",
        rec.diag_pid(w.pid)
    );
    let mine = rec.profile.for_pid(w.pid);
    assert!(
        mine.total() > 0,
        "no samples of {} pid {}{d}",
        py.describe(),
        w.pid
    );
    let without_thread = mine.count(|s| s.tid().is_none());
    assert_eq!(
        without_thread, 0,
        "{without_thread} samples have no `thread <tid>` frame after the root{d}"
    );

    let mut dominant = BTreeMap::new();
    for func in SPINNERS.iter().chain(["hash_worker"].iter()) {
        let tids = mine.threads_of(func);
        let Some((&tid, _)) = tids.iter().max_by_key(|(_, n)| **n) else {
            panic!(
                "{}: {func} does not appear in the profile{d}",
                py.describe()
            );
        };
        assert_eq!(
            tids.len(),
            1,
            "{func} appears under several threads {tids:?}{d}"
        );
        if let Some(&expected) = native.get(*func) {
            assert_eq!(
                tid, expected,
                "{func} runs in native thread {expected} but is shown under thread {tid}{d}"
            );
        }
        dominant.insert(*func, tid);
    }
    let distinct: std::collections::BTreeSet<u32> = dominant.values().copied().collect();
    assert_eq!(
        distinct.len(),
        5,
        "the spin functions and hash_worker should be under 5 distinct threads: {dominant:?}{d}"
    );
}

#[test]
fn threads_3_8() {
    threads("3.8");
}

#[test]
fn threads_3_9() {
    threads("3.9");
}

#[test]
fn threads_3_10() {
    threads("3.10");
}

#[test]
fn threads_3_11() {
    threads("3.11");
}

#[test]
fn threads_3_12() {
    threads("3.12");
}

#[test]
fn threads_3_13() {
    threads("3.13");
}

#[test]
fn threads_sid_3_13() {
    threads("sid-3.13");
}

#[test]
fn threads_sid_3_14() {
    threads("sid-3.14");
}

#[test]
fn threads_sid_3_15() {
    threads("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn threads_ft_3_14() {
    threads(FT_3_14);
}
