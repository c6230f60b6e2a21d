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
