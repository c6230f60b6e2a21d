//! With `--pid`, pyperch interrupts only the chosen processes (per-task perf events with
//! `inherit` instead of one per CPU): a thread the target starts after the recording began
//! must still be sampled.

use pyperch_tests::*;

#[test]
fn pid_events_follow_a_thread_started_later() {
    for label in ["3.9", "3.12", "sid-3.15"] {
        let Some(py) = python(label) else { continue };
        let mut w = Workload::spawn(&py, "late_thread.py", &["1.5", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        // The workload starts its thread 1.5 s after it is told that sampling has begun.
        let run = RecordRun::start(&["--pid", &pid, "--duration", "5", "--rate", "199", "--stats"]);
        let sampling = run.wait_until_sampling(std::time::Duration::from_secs(60));
        // SAFETY: kill(2) with the pid of a child we spawned; no memory effects.
        unsafe { libc::kill(w.pid as libc::pid_t, libc::SIGUSR1) };
        let rec = run.finish();
        w.terminate();
        rec.assert_ok();
        assert!(sampling, "{}: pyperch did not start sampling within 60 s{}", py.describe(), rec.diag());
        let d = rec.diag_pid(w.pid);
        let late = rec.profile.for_pid(w.pid).count(|s| s.leaf_is("late_worker"));
        note(format!("{}: {late} samples in the thread started 1.5 s into the recording", py.describe()));
        // The thread spins for about 3.5 s of the 5 s at 199 Hz (about 700 samples); the
        // machine may be loaded.
        assert!(late >= 50, "{}: only {late} samples in late_worker: the new thread was not followed{d}", py.describe());
    }
}

/// The perf events pyperch `pid` holds.
fn perf_events_held(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("[perf_event]")))
        .count()
}

/// Issue #33's storms found that one perf event per thread slows a process with hundreds of
/// threads (the py-spy #872 shape: 38 % against 15 % with one event per CPU at 10 kHz).
/// `--pid` of a 200-thread process therefore samples with one event per CPU (the events pyperch
/// holds as perf-event descriptors: at most about one per CPU, not one per thread), and
/// still profiles the process; a process
/// with 8 threads keeps its per-thread events.
#[test]
fn pid_of_a_process_with_many_threads_uses_one_event_per_cpu() {
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.15", "3.10"]) else {
        skip("no CPython 3.10-3.12 or sid 3.15");
        return;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (threads, per_thread) in [("200", false), ("8", true)] {
        let mut w = Workload::spawn(&py, "many_threads.py", &[threads, "120"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let run = RecordRun::start(&["--pid", &pid, "--rate", "199", "--stats"]);
        let sampling = run.wait_until_sampling(std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_secs(2));
        let held = perf_events_held(run.pid());
        let rec = run.interrupt();
        w.terminate();
        rec.assert_ok();
        assert!(sampling, "{}: pyperch did not start sampling within 60 s{}", py.describe(), rec.diag());
        let d = rec.diag_pid(w.pid);
        let leaf = rec.profile.for_pid(w.pid).count(|s| s.has_function("leaf_a") || s.has_function("leaf_b"));
        note(format!("{} threads: pyperch held {held} perf events ({cpus} CPUs); {leaf} samples in leaf_a/leaf_b", threads));
        if per_thread {
            assert!(held >= 8, "{threads} threads: only {held} perf events: per-thread events expected{d}");
        } else {
            assert!(held <= cpus + 2, "{threads} threads: {held} perf events held, over one per CPU ({cpus}){d}");
        }
        assert!(leaf >= 50, "{threads} threads: only {leaf} samples in leaf_a/leaf_b{d}");
    }
}
