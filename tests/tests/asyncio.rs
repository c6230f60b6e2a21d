//! `record --async`: a thread running an asyncio event loop is shown as the logical stack of
//! its running task, `task <name>` frames from the root task down to it and then its
//! coroutine frames, instead of the event loop's machinery (CPython 3.14+); a process of an
//! older version given with --pid is refused with the reason.

use pyperch_tests::*;

/// The Python frame names of a stack (after the process root).
fn names(s: &Stack) -> Vec<String> {
    s.python_frames().into_iter().map(|f| f.name).collect()
}

/// Loop machinery that a logical stack must not show.
const MACHINERY: [&str; 5] = ["run_forever", "_run_once", "run_until_complete", "Handle._run", "Runner.run"];

fn record_async(py: &Python, mode: &str) -> (Workload, Recording) {
    let mut w = Workload::spawn(py, "asyncio_tasks.py", &[mode, "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "4", "--rate", "199", "--async", "--stats"]);
    w.terminate();
    rec.assert_ok();
    (w, rec)
}

fn chain(label: &str) {
    let Some(py) = python(label) else { return };
    let (w, rec) = record_async(&py, "chain");
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let with_c = mine.filter(|s| s.has_function("c_work"));
    assert!(with_c.total() * 2 >= mine.total() && with_c.total() > 0, "c_work should dominate the samples{d}");
    let mut logical = 0;
    for s in &with_c.stacks {
        let n = names(s);
        let Some(a) = n.iter().position(|f| f == "task A") else { continue };
        logical += s.count;
        assert_eq!(
            n[a..],
            ["task A", "task B", "task C", "c_coro", "c_work"],
            "the logical stack of task C is wrong: {:?}{d}",
            s.frames
        );
        // Above A only the tasks awaiting it (the root task of asyncio.run, awaiting A).
        assert!(n[..a].iter().all(|f| f.starts_with("task ")), "frames above task A that are not tasks: {:?}{d}", s.frames);
        assert_eq!(n[..a].len(), 1, "task A is awaited by exactly the root task: {:?}{d}", s.frames);
        assert!(!n.iter().any(|f| MACHINERY.iter().any(|m| name_matches(f, m))), "loop machinery shown: {:?}{d}", s.frames);
    }
    assert!(
        logical * 10 >= with_c.total() * 9,
        "only {logical} of {} samples in c_work show the task chain{d}",
        with_c.total()
    );
    assert!(rec.run.stderr.contains("asyncio: "), "--stats does not count asyncio task stacks{d}");
}

fn gather(label: &str) {
    let Some(py) = python(label) else { return };
    let (w, rec) = record_async(&py, "gather");
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    let working = mine.filter(|s| s.has_function("child_work"));
    let logical = working.count(|s| names(s).iter().any(|f| f.starts_with("task child_")));
    assert!(
        logical * 10 >= working.total() * 9 && logical > 0,
        "only {logical} of {} samples in child_work show their task{d}",
        working.total()
    );
    for i in 0..3 {
        let me = format!("task child_{i}");
        let with = mine.filter(|s| names(s).contains(&me));
        assert!(with.total() * 10 >= total, "{me} has {} of {total} samples{d}", with.total());
        for s in &with.stacks {
            let n = names(s);
            let at = n.iter().position(|f| *f == me).unwrap_or(0);
            assert!(at >= 1 && n[at - 1] == "task P", "{me} is not shown under its parent task P: {:?}{d}", s.frames);
            assert_eq!(n[at + 1..].first().map(String::as_str), Some("child"), "{me}'s own frames: {:?}{d}", s.frames);
            assert!(!n.iter().any(|f| MACHINERY.iter().any(|m| name_matches(f, m))), "loop machinery shown: {:?}{d}", s.frames);
        }
    }
}

#[test]
fn async_chain_sid_3_14() {
    chain("sid-3.14");
}

#[test]
fn async_chain_sid_3_15() {
    chain("sid-3.15");
}

#[test]
fn async_gather_sid_3_14() {
    gather("sid-3.14");
}

#[test]
fn async_gather_sid_3_15() {
    gather("sid-3.15");
}

/// Before 3.14 CPython keeps no awaiter links: `--async --pid` of such a process is refused
/// in one sentence naming the reason.
#[test]
fn async_refused_before_3_14() {
    let Some(py) = first_python(&["sid-3.13", "3.13", "3.12"]) else { return };
    let mut w = Workload::spawn(&py, "asyncio_tasks.py", &["chain", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let run = pyperch(&["record", "--pid", &pid, "--duration", "2", "--async", "-o", "/dev/null", "-f", "raw"], std::time::Duration::from_secs(60));
    w.terminate();
    let d = run.diag();
    assert!(!run.success(), "--async on {} should be refused{d}", py.describe());
    run.assert_clear_error();
    assert!(run.stderr.contains("asyncio task stacks need CPython 3.14 or later"), "the reason is not given{d}");
}
