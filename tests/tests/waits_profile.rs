//! Waits are a profile: in `--mode wall` / `--mode off-cpu` (and py-spy's `--idle`), threads
//! asleep since before pyperch looked are content like any sample (issue #26, deliverable 1).
//!
//! Stands for py-spy's `test_longsleep` / `test_idle` (a script that only calls
//! `time.sleep`, recorded with `--idle`: py-spy shows the sleeping line) and for what a user
//! tries next: ten sleeping threads with non-ASCII function names, attached with `--pid`,
//! found on the whole host, launched, and watched by `top` and the agent (the agent's test is
//! in agent.rs, beside its other wall-mode test).
//!
//! sleepers.py starts N threads in `sleeper_ü` → `wait_here` (`time.sleep`) and the main
//! thread in `main_sleep`, and prints their native ids once every one of them sleeps. The
//! kernel sees no switch of theirs while the recording lasts, so each wait is charged from a
//! stack read from the target's memory (`session/blocked_at_start.rs`) from when the kernel
//! watched the process to the end: each thread's value is the recording's length.

use std::time::Duration;

use pyperch_tests::*;

const THREADS: usize = 10;

/// The sleeping threads' native ids, main first, from the ready line.
fn tids(w: &Workload) -> Vec<u32> {
    let fields = w.ready_fields();
    let tids: Vec<u32> = fields.get("tids").map(|t| t.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_default();
    assert_eq!(tids.len(), THREADS + 1, "sleepers.py printed {:?}", w.ready);
    tids
}

/// Checks that every sleeper of `w` is in `rec` with its own stack, its value between 80 %
/// of `seconds` and the recording's whole length.
fn check_sleepers(rec: &Recording, w: &Workload, seconds: f64, with_threads: bool) {
    let d = rec.diag_pid(w.pid);
    rec.assert_ok();
    assert!(rec.run.stderr.contains("blocked since the start"), "the summary does not say waits were charged{d}");
    assert!(!rec.run.stderr.contains("profile is empty"), "an empty profile reported{d}");
    let p = rec.profile.for_pid(w.pid);
    let is_wait = |s: &Stack| s.frames.last().is_some_and(|f| f == "<off-cpu: sleep>");
    let main_ns = p.count(|s| is_wait(s) && s.has_function("main_sleep"));
    let workers_ns = p.count(|s| is_wait(s) && s.has_function("sleeper_ü") && s.has_function("wait_here"));
    let low = 0.8 * seconds * 1e9;
    // The recording lasts a little longer than --duration (its end is when the programs
    // were detached): allow 30 %.
    let high = 1.3 * seconds * 1e9;
    assert!((low..=high).contains(&(main_ns as f64)), "main_sleep: {main_ns} ns for {seconds} s{d}");
    let n = THREADS as f64;
    assert!((n * low..=n * high).contains(&(workers_ns as f64)), "{THREADS} sleepers: {workers_ns} ns for {seconds} s each{d}");
    if with_threads {
        let by_thread = p.threads_of("wait_here");
        for tid in &tids(w)[1..] {
            let ns = by_thread.get(tid).copied().unwrap_or(0) as f64;
            assert!((low..=high).contains(&ns), "thread {tid}: {ns} ns in wait_here for {seconds} s{d}");
        }
    }
}

/// `record --pid` of a process asleep since before: each thread's whole wait.
fn pid_sleepers(label: &str, mode: &[&str]) {
    let Some(py) = python(label) else { return };
    let w = Workload::spawn(&py, "sleepers.py", &[&THREADS.to_string(), "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let mut args = vec!["--pid", &pid, "--threads", "--duration", "2"];
    args.extend_from_slice(mode);
    let rec = record(&args);
    check_sleepers(&rec, &w, 2.0, true);
}

#[test]
fn pid_sleepers_wall_3_9() {
    pid_sleepers("3.9", &["--mode", "wall"]);
}

#[test]
fn pid_sleepers_wall_3_12() {
    pid_sleepers("3.12", &["--mode", "wall"]);
}

#[test]
fn pid_sleepers_wall_sid_3_15() {
    pid_sleepers("sid-3.15", &["--mode", "wall"]);
}

/// py-spy's `--idle`, and `--mode off-cpu`, the same.
#[test]
fn pid_sleepers_idle_and_off_cpu_3_12() {
    pid_sleepers("3.12", &["--idle"]);
    pid_sleepers("3.12", &["--mode", "off-cpu"]);
}

/// py-spy's `test_longsleep` as users run it: `record --idle -- python script.py`, the
/// script asleep from its first moments (launched, so registered after it fell asleep).
fn launched_longsleep(label: &str) {
    let Some(py) = python(label) else { return };
    let dir = WorkDir::new(&py, "longsleep").unwrap_or_else(|e| panic!("{e:#}"));
    let mut args: Vec<String> = ["--idle", "--duration", "3", "--"].iter().map(|s| s.to_string()).collect();
    args.extend(py.argv().iter().map(|a| a.to_string_lossy().into_owned()));
    args.extend([dir.guest_path("sleepers.py"), "0".into(), "60".into()]);
    let rec = record(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let d = rec.diag();
    rec.assert_ok();
    let asleep = rec.profile.count(|s| s.has_function("main_sleep") && s.frames.last().is_some_and(|f| f == "<off-cpu: sleep>"));
    assert!(asleep > 0, "the sleeping line is not in the profile{d}");
    assert!(!rec.run.stderr.contains("profile is empty"), "an empty profile reported{d}");
}

#[test]
fn launched_longsleep_3_9() {
    launched_longsleep("3.9");
}

#[test]
fn launched_longsleep_3_12() {
    launched_longsleep("3.12");
}

#[test]
fn launched_longsleep_sid_3_15() {
    launched_longsleep("sid-3.15");
}

/// The whole host (no `--pid`): found by its command line, charged the same.
#[test]
fn whole_host_sleepers_wall() {
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.15"]) else { return };
    let w = Workload::spawn(&py, "sleepers.py", &[&THREADS.to_string(), "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record(&["--mode", "wall", "--cmdline", "sleepers\\.py", "--duration", "2"]);
    check_sleepers(&rec, &w, 2.0, false);
}

/// `top --mode wall`: the waits show tick by tick, not only at a recording's end.
#[test]
fn top_wall_shows_sleepers() {
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.15"]) else { return };
    let w = Workload::spawn(&py, "sleepers.py", &[&THREADS.to_string(), "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let run = pyperch(&["top", "--pid", &pid, "--once", "--window", "2", "--mode", "wall", "--rows", "80"], Duration::from_secs(60));
    let d = run.diag();
    assert!(run.success(), "top --once failed{d}");
    for f in ["<off-cpu: sleep>", "wait_here", "sleeper_ü", "main_sleep"] {
        assert!(run.stdout.contains(f), "top --mode wall does not show {f}{d}");
    }
}
