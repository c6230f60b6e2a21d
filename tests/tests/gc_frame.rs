//! `<GC>` frames (without `--native`): a CPU sample taken while the sampled thread runs the
//! garbage collector ends in a `<GC>` frame.
//!
//! gc_share.py disables automatic collection, waits for the test's go (given once pyperch
//! samples), spins in `quiet` (allocations, no collection), then alternates `make_cycles`
//! (cyclic garbage) and `collect` (gc.collect(), whose CPU time it measures with
//! time.thread_time around the call) for a fixed CPU time. The recording spans the
//! workloads' whole measured lives, and their phases are bounded by CPU time, so a loaded
//! machine changes neither the samples per phase nor the truth. Checks, per process:
//! - the share of `churn`'s samples ending in `<GC>` is within 5 points of the share of its
//!   CPU time spent inside gc.collect() (at 3999 Hz: over 2000 samples of `churn`);
//! - `<GC>` is only ever the leaf, inside `churn` right on `collect` (the only caller of the
//!   collector there), and `quiet` has none. (Before the go, the interpreter's start-up may
//!   collect automatically: such samples rightly end in `<GC>` too.)
//!
//! 3.9, 3.12 (with `--kernel`, where `<GC>` ends the Python frames under the kernel frames)
//! and sid 3.15 run alone; the other supported versions share one recording (their
//! CPU-time-bounded phases give each the same number of samples on two busy CPUs).

use std::{collections::BTreeMap, time::Duration};

use pyperch_tests::*;

const RATE: &str = "3999";
/// CPU seconds of `quiet` and of `churn`.
const QUIET: &str = "0.1";
const CHURN: &str = "0.6";
const GC: &str = "<GC>";

/// `pyperch record --pid ...` of gc_share.py on the available interpreters among `labels`,
/// from the go to the workloads' exit; `None` (skipped) when none is available.
fn record_all(labels: &[&str], extra: &[&str]) -> Option<(Recording, Vec<Workload>)> {
    let pythons: Vec<Python> = labels.iter().filter_map(|l| python(l)).collect();
    if pythons.is_empty() {
        return None;
    }
    let mut workloads: Vec<Workload> = pythons
        .iter()
        .map(|py| {
            Workload::spawn(py, "gc_share.py", &["{dir}/result.json", QUIET, CHURN, "{dir}/go"])
                .unwrap_or_else(|e| panic!("{e:#}"))
        })
        .collect();
    let pids: Vec<String> = workloads.iter().map(|w| w.pid.to_string()).collect();
    let mut args = vec!["--rate", RATE, "--duration", "120", "--stats"];
    args.extend_from_slice(extra);
    for pid in &pids {
        args.extend(["--pid", pid.as_str()]);
    }
    let rec = RecordRun::start(&args);
    assert!(rec.wait_until_sampling(Duration::from_secs(30)), "pyperch did not start sampling");
    // The --pid processes are registered right after the perf events open.
    std::thread::sleep(Duration::from_millis(300));
    for w in &workloads {
        std::fs::write(w.dir.host_path("go"), b"go").expect("cannot write the go file");
    }
    for w in &mut workloads {
        assert!(w.wait_exit(Duration::from_secs(60)).is_some(), "{} did not finish within 60 s", w.python.describe());
    }
    // SAFETY: plain kill(2) on our own child: SIGINT ends the recording (writing the profile).
    unsafe { libc::kill(rec.pid() as libc::pid_t, libc::SIGINT) };
    let rec = rec.finish();
    rec.assert_ok();
    Some((rec, workloads))
}

/// The checks of the module doc for each launched workload.
fn check(rec: &Recording, workloads: &[Workload]) {
    let d = rec.diag();
    for w in workloads {
        let m = w.read_json("result.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
        let (churn_cpu, in_gc) = (m["churn"].as_f64().unwrap_or(0.0), m["in_gc"].as_f64().unwrap_or(0.0));
        let profile = rec.profile.for_pid(w.pid);
        let d = rec.diag_pid(w.pid);
        let describe = &w.python.describe();

        let churn = profile.count(|s| s.has_function("churn"));
        let gc = profile.count(|s| s.has_function("churn") && user_frames(s).last().is_some_and(|f| f.name == GC));
        let quiet = profile.count(|s| s.has_function("quiet"));
        let quiet_gc = profile.count(|s| s.has_function("quiet") && s.frames.iter().any(|f| f == GC));
        // `<GC>` only as the leaf, and in `churn` right on `collect`.
        let mut misplaced: BTreeMap<String, u64> = BTreeMap::new();
        for s in profile.stacks.iter().filter(|s| s.frames.iter().any(|f| f == GC)) {
            let frames = user_frames(s);
            let n = frames.len();
            let placed = frames.last().is_some_and(|f| f.name == GC)
                && frames[..n - 1].iter().all(|f| f.name != GC)
                && (!s.has_function("churn") || (n >= 2 && frames[n - 2].is("collect")));
            if !placed {
                *misplaced.entry(s.frames.join(";")).or_default() += s.count;
            }
        }
        let (share, truth) = (gc as f64 / churn.max(1) as f64, in_gc / churn_cpu.max(1e-9));
        note(format!(
            "{describe}: {:.2} % of churn's CPU time in gc.collect(), {:.2} % of its {churn} samples in <GC>; quiet {quiet} samples, {quiet_gc} in <GC>",
            truth * 100.0,
            share * 100.0
        ));
        assert!(churn >= 1500, "{describe}: only {churn} samples of churn (want at least 1500){d}");
        assert!(quiet >= 100, "{describe}: only {quiet} samples of quiet (want at least 100){d}");
        assert!(gc > 0, "{describe}: no <GC> frame although {:.2} s went into gc.collect(){d}", in_gc);
        assert_eq!(quiet_gc, 0, "{describe}: <GC> frames while no collection ran (quiet){d}");
        assert!(misplaced.is_empty(), "{describe}: <GC> frames elsewhere than as the leaf right on collect: {misplaced:?}{d}");
        assert!(
            (share - truth).abs() <= 0.05,
            "{describe}: {:.2} % of churn's samples end in <GC>, but it spent {:.2} % of its CPU time in gc.collect(): want within 5 points{d}",
            share * 100.0,
            truth * 100.0
        );
    }
}

/// The stack's frames below the process (and thread) frame, without the kernel frames that
/// `--kernel` puts on top (`function_[k]`).
fn user_frames(s: &Stack) -> Vec<PyFrame> {
    let mut frames = s.python_frames();
    while frames.last().is_some_and(|f| f.name.ends_with("_[k]")) {
        frames.pop();
    }
    frames
}

fn gc_share(labels: &[&str], extra: &[&str]) {
    let Some((rec, workloads)) = record_all(labels, extra) else { return };
    check(&rec, &workloads);
}

#[test]
fn gc_frame_share_3_9() {
    gc_share(&["3.9"], &[]);
}

/// With `--kernel` (no user frames): `<GC>` ends the Python frames, under the kernel frames.
#[test]
fn gc_frame_share_with_kernel_3_12() {
    gc_share(&["3.12"], &["--kernel"]);
}

#[test]
fn gc_frame_share_sid_3_15() {
    gc_share(&["sid-3.15"], &[]);
}

/// The other supported versions, in one recording.
#[test]
fn gc_frame_share_other_versions() {
    gc_share(&["3.8", "3.10", "3.11", "3.13", "sid-3.13", "sid-3.14"], &[]);
}
