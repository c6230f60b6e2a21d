//! Storms (issue #33): pyperch's cost under loads that would make an unbounded profiler's
//! cost follow the host's, scaled down to fit the suite. The full-size storms, with py-spy
//! beside pyperch, are measured by `cargo xtask bench -- --only storms` (BENCHMARKS.md).
//!
//! pyperch's CPU is measured from outside: its threads' user + system time from /proc, plus
//! the run time of the BPF programs it holds (`run_time_ns` in their fdinfo; pyperch keeps the
//! kernel's BPF statistics on while it runs with `--max-cpu`). CPU seconds and memory are
//! asserted, never wall-clock time.

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt;

use pyperch_tests::*;

/// The agent's default budget, percent of one CPU.
const BUDGET: f64 = 2.0;

/// Issue #33's storm "1,000 short-lived Python processes a minute", scaled down: 40 s of a
/// spawner starting `python short_lived.py child` (about 40 ms of CPU in short_lived_a and
/// short_lived_b, then exit) 1,000 times a minute, recorded by a system-wide pyperch (no
/// `--pid`: every new Python process is discovered as it starts) at 1 kHz with `--max-cpu 2`.
/// Checked, over 15 s after 6 s of settling:
/// - pyperch's CPU (threads from /proc/PID/stat, which keeps the time of its threads that
///   ended, such as file readers, plus its BPF programs) is within the budget + 10 %;
/// - its peak resident set (VmHWM, polled) stays under 128 MiB: a system-wide pyperch holds
///   about 60 MB here before the churn (the ring buffer, maps, the binary, byte-bounded
///   caches); state kept per process seen grows with the hundreds of processes the storm
///   starts (measured: flat at 64 MB in one run; 74 -> 83 MB over the window in another,
///   about 36 KB per process, 83 MB peak),
///   and 128 MiB is about twice the steady size: 200 KB kept per short process, or the growth
///   going on for a few minutes more, would cross it;
/// - it profiled the short processes: short_lived_a shows in the profile for at least 50
///   distinct short-lived processes.
#[test]
fn short_lived_processes_system_wide_within_budget() {
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10"]) else {
        skip("no pyenv CPython 3.10-3.13");
        return;
    };
    const SETTLE: Duration = Duration::from_secs(6);
    const WINDOW: Duration = Duration::from_secs(15);
    let mut w = Workload::spawn(&py, "short_lived.py", &["1000", "40"]).unwrap_or_else(|e| panic!("{e:#}"));
    let budget = BUDGET.to_string();
    let run = RecordRun::start(&["--rate", "1000", "--max-cpu", &budget, "--stats"]);
    assert!(run.wait_until_sampling(Duration::from_secs(60)), "pyperch did not start sampling");
    let pyperch = run.pid();
    let done = Arc::new(AtomicBool::new(false));
    let rss = watch_peak_rss(pyperch, done.clone());
    std::thread::sleep(SETTLE);
    let (threads0, bpf0) = pyperch_cpu(pyperch);
    let rss0 = status_kb(pyperch, "VmRSS").unwrap_or(0);
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let (threads1, bpf1) = pyperch_cpu(pyperch);
    let rss1 = status_kb(pyperch, "VmRSS").unwrap_or(0);
    let window = started.elapsed().as_secs_f64();
    let rec = run.interrupt();
    done.store(true, Ordering::Relaxed);
    let peak_kb = rss.join().expect("RSS watcher");
    w.terminate();
    let spawned = w.stdout_lines().join(" ");
    rec.assert_ok();
    let d = rec.diag();

    let (threads, bpf) = (threads1 - threads0, bpf1 - bpf0);
    let percent = (threads + bpf) * 100.0 / window;
    let short: BTreeSet<u32> = rec
        .profile
        .stacks
        .iter()
        .filter(|s| s.has_function("short_lived_a") && s.pid() != Some(w.pid))
        .filter_map(|s| s.pid())
        .collect();
    let rate = effective_rate(&rec.run.stderr);
    note(format!(
        "{}: pyperch {percent:.2}% of one CPU over {window:.1} s (threads {threads:.3} s, BPF {bpf:.3} s), budget {BUDGET}%; effective rate (min, mean, last) {rate:?} of 1000 Hz; peak RSS {:.1} MB (VmRSS {:.1} -> {:.1} MB over the window); short_lived_a seen in {} short-lived processes ({spawned})",
        py.describe(),
        peak_kb as f64 / 1024.0,
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0,
        short.len(),
    ));
    assert!(
        rec.run.stderr.contains("CPU budget (--max-cpu): 2% of one CPU") && !rec.run.stderr.contains("kernel programs not measured"),
        "--stats does not report the budget with the kernel programs measured{d}"
    );
    assert!(bpf > 0.0, "no BPF run time seen in pyperch's programs' fdinfo{d}");
    assert!(
        percent <= BUDGET * 1.1,
        "pyperch used {percent:.2}% of one CPU (threads {threads:.3} s + BPF {bpf:.3} s over {window:.1} s), over the budget of {BUDGET}% + 10 %{d}"
    );
    assert!(peak_kb <= 128 * 1024, "pyperch's peak RSS was {peak_kb} kB, over 128 MiB{d}");
    assert!(short.len() >= 50, "short_lived_a in only {} short-lived processes ({spawned}){d}", short.len());
}

/// Issue #33: "the cost per sample does not grow with the number of threads (8 vs 500
/// threads, same rate)". The same CPU-bound work (`many_threads.py`, 12 nested calls, then
/// leaf_a / leaf_b) in 8 and in 500 threads, each recorded with `--pid` at 1 kHz, twice each
/// in turn (the lower of each pair counts: other jobs only add). pyperch's CPU over a 6 s
/// window (its threads' time from /proc/PID/task/*/schedstat, in ns, plus its BPF programs'
/// run time) divided by the samples taken in it (runs of its perf-event program). Both with
/// one perf event per CPU (`--subprocesses`; `--pid` alone uses it too beyond 64 threads),
/// so that the two differ only in their threads; the CPU-bound target keeps both CPUs busy,
/// so nearly every run is one of its samples. With
/// `--max-cpu 100`, a budget this rate never reaches (under 1 % here), so that pyperch keeps
/// the kernel's BPF statistics on without shedding anything. The 500-thread cost per sample
/// must be at most 1.75× the 8-thread one, and its userspace part (pyperch's threads) at
/// most 1.3×. Measured with one event per CPU for both: 1.43× in all (2.3 against 3.3 us),
/// of which the threads' part 1.1× (0.96 against 1.04 us) and the kernel program's 1.6× (1.4
/// against 2.3 us: it reads the stacks of 500 threads from colder caches; nothing in it
/// scans the threads, the thread state comes from its TLS slot); with one event per thread
/// 1.07-1.24×, once 1.55×.
#[test]
fn cost_per_sample_does_not_grow_with_threads() {
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.14", "3.10"]) else {
        skip("no CPython 3.10-3.12 or sid 3.14");
        return;
    };
    // Twice each, alternating: other jobs on the machine only add to a measurement (cache
    // and memory contention), so the lower of the two is each one's cost.
    let mut costs = [f64::MAX, f64::MAX];
    let mut user_costs = [f64::MAX, f64::MAX];
    for (i, threads) in ["8", "500", "8", "500"].into_iter().enumerate() {
        let mut w = Workload::spawn(&py, "many_threads.py", &[threads, "120"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let run = RecordRun::start(&["--pid", &pid, "--subprocesses", "--rate", "1000", "--max-cpu", "100", "--stats"]);
        assert!(run.wait_until_sampling(Duration::from_secs(60)), "pyperch did not start sampling");
        let pyperch = run.pid();
        std::thread::sleep(Duration::from_secs(3));
        let (t0, b0, s0) = (thread_cpu_ns(pyperch), bpf_run_time_ns(pyperch).values().sum::<u64>(), bpf_sampler_runs(pyperch));
        std::thread::sleep(Duration::from_secs(6));
        let (t1, b1, s1) = (thread_cpu_ns(pyperch), bpf_run_time_ns(pyperch).values().sum::<u64>(), bpf_sampler_runs(pyperch));
        let rec = run.interrupt();
        w.terminate();
        rec.assert_ok();
        let d = rec.diag_pid(w.pid);
        let (user_ns, bpf_ns, samples) = (thread_cpu_ns_between(&t0, &t1), b1 - b0, s1 - s0);
        assert!(samples >= 1000, "{threads} threads: only {samples} samples in the window{d}");
        assert!(bpf_ns > 0, "{threads} threads: no BPF run time in the window{d}");
        let (user_us, bpf_us) = (user_ns as f64 / 1e3 / samples as f64, bpf_ns as f64 / 1e3 / samples as f64);
        let pids = rec.profile.pids();
        assert!(pids.contains(&w.pid), "{threads} threads: the target is not in the profile{d}");
        note(format!(
            "{}: {threads} threads: {samples} samples in the window, {:.2} us per sample ({user_us:.2} threads + {bpf_us:.2} BPF)",
            py.describe(),
            user_us + bpf_us
        ));
        costs[i % 2] = costs[i % 2].min(user_us + bpf_us);
        user_costs[i % 2] = user_costs[i % 2].min(user_us);
    }
    let ratio = costs[1] / costs[0];
    let user_ratio = user_costs[1] / user_costs[0];
    note(format!("500 / 8 threads: {ratio:.2}x per sample, {user_ratio:.2}x of it in pyperch's threads"));
    assert!(ratio <= 1.75, "a sample costs {:.2} us with 500 threads, {:.2} us with 8: {ratio:.2}x, over 1.75x", costs[1], costs[0]);
    assert!(
        user_ratio <= 1.3,
        "pyperch's threads spend {:.2} us per sample with 500 threads, {:.2} us with 8: {user_ratio:.2}x, over 1.3x",
        user_costs[1],
        user_costs[0]
    );
}

/// Issue #33's "non-Python context-switch storm": `dd bs=1 | cat` (every one-byte write
/// wakes the reader; 250,000-300,000 switches a second on the 2-CPU test machine) beside a
/// CPU-bound Python process (`many_threads.py` with 4 threads: 3/4 of its CPU in leaf_a, 1/4
/// in leaf_b), recorded by a system-wide `--mode wall` pyperch at 1 kHz with `--max-cpu 2`,
/// beside an unbudgeted one. None of the storm's switches is a profiled thread's, so no share
/// of walks lowers its cost: every switch runs the scheduler-switch program's early exit
/// (2.3-2.4 % of a CPU at this rate, measured, with or without a share), and the budget holds
/// only by pausing the program (`kernel::switch_gate`). Checked over 10 s after 7 s of
/// settling: pyperch's CPU (threads + BPF, from outside) within the budget + 10 %; the Python
/// process's leaf shares within 2 points of the unbudgeted run's.
#[test]
fn non_python_switch_storm_system_wide_within_budget() {
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10"]) else {
        skip("no pyenv CPython 3.10-3.13");
        return;
    };
    const SETTLE: Duration = Duration::from_secs(7);
    const WINDOW: Duration = Duration::from_secs(10);
    let mut storm = std::process::Command::new("sh")
        .args(["-c", "exec dd if=/dev/zero bs=1 count=100000000000 status=none | cat > /dev/null"])
        .process_group(0)
        .spawn()
        .expect("sh");
    let mut w = Workload::spawn(&py, "many_threads.py", &["4", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let free_run = RecordRun::start(&["--mode", "wall", "--rate", "1000"]);
    let budget = BUDGET.to_string();
    let run = RecordRun::start(&["--mode", "wall", "--rate", "1000", "--max-cpu", &budget, "--stats"]);
    assert!(free_run.wait_until_switch_hooked(Duration::from_secs(60)), "the unbudgeted pyperch did not hook context switches");
    assert!(run.wait_until_switch_hooked(Duration::from_secs(60)), "pyperch did not hook context switches");
    let pyperch = run.pid();
    std::thread::sleep(SETTLE);
    let (threads0, bpf0) = pyperch_cpu(pyperch);
    let ctxt0 = host_context_switches();
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let (threads1, bpf1) = pyperch_cpu(pyperch);
    let ctxt1 = host_context_switches();
    let window = started.elapsed().as_secs_f64();
    let rec = run.interrupt();
    let free = free_run.interrupt();
    w.terminate();
    // SAFETY: kill(2) of the storm's process group, which this test started.
    unsafe { libc::kill(-(storm.id() as libc::pid_t), libc::SIGKILL) };
    let _ = storm.wait();
    rec.assert_ok();
    free.assert_ok();
    let d = rec.diag_pid(w.pid);

    let (threads, bpf) = (threads1 - threads0, bpf1 - bpf0);
    let percent = (threads + bpf) * 100.0 / window;
    let per_second = ctxt1.saturating_sub(ctxt0) as f64 / window;
    let shares = |r: &Recording| {
        let p = r.profile.for_pid(w.pid);
        let (a, b) = (p.count(|s| s.has_function("leaf_a")) as f64, p.count(|s| s.has_function("leaf_b")) as f64);
        if a + b > 0.0 { (a / (a + b), b / (a + b)) } else { (0.0, 0.0) }
    };
    let ((a, b), (free_a, free_b)) = (shares(&rec), shares(&free));
    let paused = rec.run.stderr.lines().find(|l| l.contains("scheduler-switch program paused")).unwrap_or("not paused").trim().to_string();
    note(format!(
        "{}: {per_second:.0} context switches/s on the host; pyperch {percent:.2}% of one CPU over {window:.1} s (threads {threads:.3} s, BPF {bpf:.3} s), budget {BUDGET}%; {paused}; leaf_a {:.1}% / leaf_b {:.1}% budgeted vs {:.1}% / {:.1}% unbudgeted",
        py.describe(),
        a * 100.0,
        b * 100.0,
        free_a * 100.0,
        free_b * 100.0,
    ));
    assert!(bpf > 0.0, "no BPF run time seen in pyperch's programs' fdinfo{d}");
    assert!(
        percent <= BUDGET * 1.1,
        "pyperch used {percent:.2}% of one CPU (threads {threads:.3} s + BPF {bpf:.3} s over {window:.1} s) at {per_second:.0} switches/s, over the budget of {BUDGET}% + 10 %{d}"
    );
    assert!(free_a > 0.5, "the unbudgeted profile does not show the workload's split{}", free.diag_pid(w.pid));
    assert!((a - free_a).abs() <= 0.02, "leaf_a: {:.1}% budgeted vs {:.1}% unbudgeted, more than 2 points apart{d}", a * 100.0, free_a * 100.0);
}

/// Context switches on the whole host since boot (`ctxt` in /proc/stat).
fn host_context_switches() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("ctxt ").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(0)
}
