//! Free-threaded CPython (PEP 703): interpreters built by hand, taken from
//! `PYPERCH_FT_PYTHON` (3.14t); each test says plainly that it did not run where it is unset.
//!
//! Until free-threaded support lands (issue #30), pyperch refuses such a process with one
//! clear sentence instead of reading it with the default build's object layout.

use std::time::Duration;

use pyperch_tests::*;

/// `pyperch list` names a running 3.14t and says, in one sentence, that free-threaded builds
/// are not supported yet; `record --pid` of it ends with that sentence, without a panic.
#[test]
fn free_threaded_3_14_is_refused_in_one_sentence() {
    let Some(py) = free_threaded_python("PYPERCH_FT_PYTHON", 14) else { return };
    let mut w = Workload::spawn(&py, "rebuilt_deep.py", &["10", "1000", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let list = pyperch(&["list"], Duration::from_secs(60));
    let pid = w.pid.to_string();
    let row = list.stdout.lines().find(|l| l.split_whitespace().next() == Some(pid.as_str())).map(str::to_string);
    let rec = pyperch(&["record", "--pid", &pid, "--duration", "1"], Duration::from_secs(60));
    w.terminate();
    note(format!("list: {row:?}; record: {}", rec.stderr.trim()));
    let row = row.unwrap_or_else(|| panic!("pid {pid} is not listed:\n{}", list.stdout));
    assert!(row.contains("free-threaded builds are not supported yet"), "list row: {row}");
    assert!(!rec.stderr.contains("panicked"), "record panicked: {}", rec.stderr);
    assert!(rec.stderr.contains("free-threaded builds are not supported yet"), "record said: {}", rec.stderr);
}
