//! Subinterpreters: a process running CPU-bound code in its main interpreter and in two
//! subinterpreters (each on its own thread) is sampled with every thread's own stack, and
//! with `--threads` each stack starts with `interpreter <id>` after the thread. Before 3.13,
//! where the subinterpreter API lends thread states across threads, the samples of such a
//! process are dropped (counted) and `list` says why.

use pyperch_tests::*;

/// `interpreter <id>` right after `thread <tid>`.
fn interpreter_of(s: &Stack) -> Option<i64> {
    s.frames.get(2)?.strip_prefix("interpreter ")?.parse().ok()
}

fn subinterpreters(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "subinterpreters.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let ready = w.ready_fields();
    let field = |k: &str| -> i64 { ready.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("ready line {:?} lacks {k}", w.ready)) };
    let (main_tid, one, two) = (field("main"), field("sub_one"), field("sub_two"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "5", "--rate", "199", "--threads"]);
    w.terminate();
    rec.assert_ok();
    let d = format!("{}\n--- ready line: {}\n", rec.diag_pid(w.pid), w.ready);
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    assert!(total > 0, "no samples of {}{d}", py.describe());
    let without = mine.count(|s| interpreter_of(s).is_none());
    assert_eq!(without, 0, "{without} samples lack `interpreter <id>` after the thread{d}");

    let mut threads = Vec::new();
    for (work, outer, id) in [("sub_one_work", "sub_one_outer", one), ("sub_two_work", "sub_two_outer", two), ("main_spin", "main", 0)] {
        let with = mine.filter(|s| s.has_function(work));
        assert!(
            with.total() * 10 >= total,
            "{work} (interpreter {id}) has {} of {total} samples: each of the three spinning threads should have a fair share{d}",
            with.total()
        );
        for s in &with.stacks {
            assert_eq!(interpreter_of(s), Some(id), "{work} is shown under the wrong interpreter: {:?}{d}", s.frames);
            let frames = s.python_frames();
            // frames[0] is the interpreter frame; then the interpreter's own stack, root first.
            let names: Vec<&str> = frames.iter().skip(1).map(|f| f.name.as_str()).collect();
            assert_eq!(names.first(), Some(&"<module>"), "{work}'s stack does not start at its module: {:?}{d}", s.frames);
            assert!(
                names.len() >= 2 && names[names.len() - 2..] == [outer, work],
                "{work} should be the leaf, called by {outer}: {:?}{d}",
                s.frames
            );
            if id != 0 {
                assert!(
                    !names.iter().any(|n| n.contains("Thread") || *n == "main_spin"),
                    "the stack of a subinterpreter thread holds main-interpreter frames: {:?}{d}",
                    s.frames
                );
            }
        }
        let tids = with.threads_of(work);
        assert_eq!(tids.len(), 1, "{work} appears under several threads {tids:?}{d}");
        let tid = *tids.keys().next().unwrap_or(&0);
        if id == 0 {
            assert_eq!(i64::from(tid), main_tid, "main_spin runs in the main thread {main_tid}{d}");
        }
        threads.push(tid);
    }
    threads.sort_unstable();
    threads.dedup();
    assert_eq!(threads.len(), 3, "the three spinners should be on three threads{d}");
    // The two launcher threads run in their subinterpreters all along: their main-interpreter
    // thread states (blocked in the call that entered the subinterpreter) must never be shown.
    let launcher = mine.count(|s| s.has_function("run"));
    assert_eq!(launcher, 0, "samples show a launcher thread's main-interpreter stack{d}");
}

#[test]
fn subinterpreters_sid_3_14() {
    subinterpreters("sid-3.14");
}

#[test]
fn subinterpreters_sid_3_15() {
    subinterpreters("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn subinterpreters_ft_3_14() {
    subinterpreters(FT_3_14);
}

#[test]
fn subinterpreters_sid_3_13() {
    subinterpreters("sid-3.13");
}

#[test]
fn subinterpreters_3_13() {
    subinterpreters("3.13");
}

/// 3.12: `_xxsubinterpreters.run_string` runs the calling thread on the subinterpreter's
/// first thread state (another thread's): no stack of such a process can be attributed, so
/// every sample is dropped and counted, and `list` says why.
#[test]
fn subinterpreters_3_12_refused() {
    let Some(py) = python("3.12") else { return };
    let mut w = Workload::spawn(&py, "subinterpreters.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let list = pyperch(&["list"], std::time::Duration::from_secs(60));
    let rec = record(&["--pid", &pid, "--duration", "3", "--rate", "199", "--threads", "--stats"]);
    w.terminate();
    let d = format!("{}\n--- list:\n{}", rec.diag(), list.stdout);
    assert!(rec.run.success(), "pyperch record failed{d}");
    assert_eq!(rec.profile.for_pid(w.pid).total(), 0, "a 3.12 process with subinterpreters got stacks{d}");
    assert!(rec.run.stderr.contains("dropped: subinterpreters before 3.13"), "the drops are not counted in --stats{d}");
    let row = list.stdout.lines().find(|l| l.split_whitespace().next() == Some(pid.as_str())).unwrap_or_default();
    assert!(row.contains("threads in subinterpreters cannot be sampled before CPython 3.13"), "list does not say why: {row:?}{d}");
}
