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
    // 8 s: on a loaded machine the task reader may be made after sampling started; samples
    // before that keep their plain stack (counted), and must stay a small share.
    let rec = record(&["--pid", &pid, "--duration", "8", "--rate", "199", "--async", "--stats"]);
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
            ["task A", "a_coro", "task B", "b_coro", "task C", "c_coro", "c_work"],
            "the logical stack of task C is wrong: {:?}{d}",
            s.frames
        );
        // Above A only the task awaiting it: asyncio.run's root task, never named, so shown by
        // its coroutine, waiting in main.
        assert_eq!(n[..a], ["task main", "main"], "task A is awaited by exactly the root task: {:?}{d}", s.frames);
        assert!(!n.iter().any(|f| MACHINERY.iter().any(|m| name_matches(f, m))), "loop machinery shown: {:?}{d}", s.frames);
    }
    assert!(
        logical * 10 >= with_c.total() * 9,
        "only {logical} of {} samples in c_work show the task chain{d}",
        with_c.total()
    );
    assert!(rec.run.stderr.contains("asyncio: "), "--stats does not count asyncio task stacks{d}");
}

/// The number `--stats` gives after `label` in its asyncio line (the first one: whole run).
fn stat_count(stderr: &str, label: &str) -> u64 {
    let Some(at) = stderr.find(label) else { return 0 };
    stderr[at + label.len()..].split_whitespace().next().and_then(|n| n.trim_end_matches(';').parse().ok()).unwrap_or(0)
}

fn gather(label: &str) {
    let Some(py) = python(label) else { return };
    let (w, rec) = record_async(&py, "gather");
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    let working = mine.filter(|s| s.has_function("child_work"));
    let logical = working.count(|s| names(s).iter().any(|f| f.starts_with("task child_")));
    // Samples taken before the asyncio reader was made (late on a loaded machine) carry no
    // kernel-recorded running task; reading it afterwards finds another child task running
    // most of the time. They are counted apart in --stats and not held against the 90 %.
    let late = stat_count(&rec.run.stderr, "sampled before the kernel read task chains");
    let judged = working.total().saturating_sub(late);
    assert!(
        logical * 10 >= judged * 9 && logical > 0 && late * 2 <= working.total(),
        "only {logical} of {} samples in child_work show their task ({late} sampled before the kernel recorded running tasks){d}",
        working.total()
    );
    for i in 0..3 {
        let me = format!("task child_{i}");
        let with = mine.filter(|s| names(s).contains(&me));
        assert!(with.total() * 10 >= total, "{me} has {} of {total} samples{d}", with.total());
        for s in &with.stacks {
            let n = names(s);
            let at = n.iter().position(|f| *f == me).unwrap_or(0);
            // P waits in `parent`, at its gather.
            assert!(at >= 2 && n[at - 2] == "task P" && n[at - 1] == "parent", "{me} is not shown under its parent task P waiting in parent: {:?}{d}", s.frames);
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

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn async_chain_ft_3_14() {
    chain(FT_3_14);
}

#[test]
fn async_gather_sid_3_14() {
    gather("sid-3.14");
}

#[test]
fn async_gather_sid_3_15() {
    gather("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn async_gather_ft_3_14() {
    gather(FT_3_14);
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

/// `dump --async`: every task with who awaits it and where it is suspended (task C runs on
/// the main thread; A and B wait in their coroutines; the root task awaits A); `--json` holds
/// the same links by address. `top --async` shows the logical stack too.
fn dump_and_top(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "asyncio_tasks.py", &["chain", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let text = pyperch(&["dump", "--pid", &pid, "--async"], std::time::Duration::from_secs(30));
    let json = pyperch(&["dump", "--pid", &pid, "--async", "--json"], std::time::Duration::from_secs(30));
    let top = pyperch(
        &["top", "--pid", &pid, "--async", "--once", "--window", "2", "--rate", "199", "--rows", "40"],
        std::time::Duration::from_secs(60),
    );
    w.terminate();
    let d = format!("{}{}{}", text.diag(), json.diag(), top.diag());
    assert!(text.success() && json.success() && top.success(), "{}: a command failed{d}", py.describe());
    for needle in [
        "asyncio tasks: 4",
        "task C (awaited by task B)",
        "task B (awaited by task A)",
        "task A (awaited by task Task-1)",
        "task Task-1 (not awaited by a task)",
        "suspended in b_coro (",
        "suspended in a_coro (",
    ] {
        assert!(text.stdout.contains(needle), "dump --async does not show {needle:?}{d}");
    }
    assert!(text.stdout.contains(&format!("running on thread {pid}")), "task C is not shown running on the main thread{d}");
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap_or_else(|e| panic!("dump --json: {e}{d}"));
    let tasks = doc["tasks"].as_array().unwrap_or_else(|| panic!("no tasks array{d}"));
    let address = |name: &str| -> serde_json::Value {
        tasks.iter().find(|t| t["name"] == name).map(|t| t["address"].clone()).unwrap_or_else(|| panic!("no task {name}{d}"))
    };
    let awaited_by = |name: &str| -> Vec<serde_json::Value> {
        tasks.iter().find(|t| t["name"] == name).and_then(|t| t["awaited_by"].as_array().cloned()).unwrap_or_default()
    };
    assert_eq!(awaited_by("C"), [address("B")], "{d}");
    assert_eq!(awaited_by("B"), [address("A")], "{d}");
    assert_eq!(awaited_by("A"), [address("Task-1")], "{d}");
    assert!(top.stdout.contains("task C") && top.stdout.contains("c_work"), "top --async does not show task C's logical stack{d}");
    assert!(!top.stdout.contains("_run_once"), "top --async shows the loop machinery{d}");
}

#[test]
fn async_dump_and_top_sid_3_14() {
    dump_and_top("sid-3.14");
}

#[test]
fn async_dump_and_top_sid_3_15() {
    dump_and_top("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn async_dump_and_top_ft_3_14() {
    dump_and_top(FT_3_14);
}

/// `dump --async` of a process older than 3.14 is refused in one sentence with the reason.
#[test]
fn async_dump_refused_before_3_14() {
    let Some(py) = first_python(&["3.12", "sid-3.13", "3.13"]) else { return };
    let mut w = Workload::spawn(&py, "asyncio_tasks.py", &["chain", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let run = pyperch(&["dump", "--pid", &pid, "--async"], std::time::Duration::from_secs(30));
    w.terminate();
    let d = run.diag();
    assert!(!run.success(), "dump --async on {} should be refused{d}", py.describe());
    run.assert_clear_error();
    assert!(run.stderr.contains("asyncio task stacks need CPython 3.14 or later"), "the reason is not given{d}");
}

/// `dump --async --json` of the chain with its event loop on a second thread: tasks A and B
/// are suspended at the exact lines of their `await`s. On a free-threaded build that thread
/// runs its own copy of the coroutines' bytecode, so the lines come through the copy
/// (issue #30); on a default build the same workload is the reference.
fn suspended_lines_on_a_second_thread(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "asyncio_tasks.py", &["chain-thread", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let json = pyperch(&["dump", "--pid", &pid, "--async", "--json"], std::time::Duration::from_secs(30));
    w.terminate();
    let d = json.diag();
    assert!(json.success(), "{}: dump --async --json failed{d}", py.describe());
    let source = std::fs::read_to_string(workload_source("asyncio_tasks.py")).expect("asyncio_tasks.py");
    let line_of = |needle: &str| -> u64 {
        source.lines().position(|l| l.contains(needle)).map(|i| i as u64 + 1).unwrap_or_else(|| panic!("no {needle:?} in the workload"))
    };
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap_or_else(|e| panic!("dump --json: {e}{d}"));
    let tasks = doc["tasks"].as_array().unwrap_or_else(|| panic!("no tasks array{d}"));
    for (task, function, awaits) in [("A", "a_coro", "create_task(b_coro()"), ("B", "b_coro", "create_task(c_coro()")] {
        let t = tasks.iter().find(|t| t["name"] == task).unwrap_or_else(|| panic!("no task {task}{d}"));
        let frames = t["suspended_at"].as_array().cloned().unwrap_or_default();
        let frame = frames.iter().find(|f| f["function"] == function).unwrap_or_else(|| panic!("task {task} is not suspended in {function}{d}"));
        note(format!("{}: task {task} suspended in {function} at line {}", py.describe(), frame["line"]));
        assert_eq!(frame["line"].as_u64(), Some(line_of(awaits)), "{}: task {task}'s line in {function}{d}", py.describe());
    }
}

#[test]
fn async_suspended_lines_on_a_second_thread_sid_3_14() {
    suspended_lines_on_a_second_thread("sid-3.14");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn async_suspended_lines_on_a_second_thread_ft_3_14() {
    suspended_lines_on_a_second_thread(FT_3_14);
}
