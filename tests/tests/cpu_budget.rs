//! `--max-cpu` (issue #33): pyperch holds its own CPU (its threads plus its kernel programs'
//! run time) under a budget by having the kernel keep only a share of the samples, each kept
//! sample counting for the skipped ones.
//!
//! The target is the shape of py-spy #872 (py-spy slowed a 159-thread torch process 5-15×):
//! one CPython process with 500 CPU-bound threads (`workloads/many_threads.py`, about 3/4 of
//! its time in leaf_a, 1/4 in leaf_b), recorded with `--pid` at 20 kHz, a rate whose cost is
//! several times the budget. Checked:
//! - pyperch's CPU over a window after the controller settled, measured from outside (user +
//!   system time in `/proc/<pyperch>/stat`, plus `run_time_ns` of the BPF programs it holds,
//!   from their fdinfo: pyperch keeps the kernel's BPF statistics on while it runs with a
//!   budget) is within the budget + 10 %;
//! - the budget did bite (`--stats`'s effective rate fell below the requested rate);
//! - leaf_a's and leaf_b's shares of the profile are within 2 points of an unbudgeted
//!   recording's of the same process at the same rate, made by a second pyperch at the same
//!   time (the weights keep profiles unbiased), and its total stands for as many samples
//!   (within 10 %: the two start and end a little apart).
//!
//! CPU seconds are measured, never wall-clock deadlines; on a loaded machine pyperch gets less
//! CPU, which only lowers what is measured.
//!
//! The off-CPU modes are checked the same way on a context-switch storm
//! ([`budget_holds_pyperch_cpu_in_a_switch_storm`]).

use std::{fs, time::Duration};

use pyperch_tests::*;

const THREADS: &str = "500";
const RATE: &str = "20000";
/// Percent of one CPU.
const BUDGET: f64 = 2.0;
/// How long the controller gets to settle after sampling began, then the measured window.
const SETTLE: Duration = Duration::from_secs(7);
const WINDOW: Duration = Duration::from_secs(10);

/// Voluntary context switches of every thread of `pid` so far (`/proc/PID/task/*/status`).
fn voluntary_switches(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|status| {
            status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:")).and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// The shares of the process's profile under functions `a` and `b`, and its total.
fn function_shares(rec: &Recording, pid: u32, a: &str, b: &str) -> (f64, f64, u64) {
    let p = rec.profile.for_pid(pid);
    let total = p.total();
    let share = |f: &str| if total == 0 { 0.0 } else { p.count(|s| s.has_function(f)) as f64 / total as f64 };
    (share(a), share(b), total)
}

/// leaf_a's and leaf_b's shares of the process's samples.
fn leaf_shares(rec: &Recording, pid: u32) -> (f64, f64, u64) {
    let p = rec.profile.for_pid(pid);
    let total = p.total();
    let a = p.count(|s| s.has_function("leaf_a"));
    let b = p.count(|s| s.has_function("leaf_b"));
    let share = |n: u64| if total == 0 { 0.0 } else { n as f64 / total as f64 };
    (share(a), share(b), total)
}

#[test]
fn budget_holds_pyperch_cpu_with_500_busy_threads() {
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.14", "3.10"]) else {
        skip("no CPython 3.10-3.12 or sid 3.14");
        return;
    };
    let mut w = Workload::spawn(&py, "many_threads.py", &[THREADS, "300"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();

    // The reference: an unbudgeted pyperch at the same rate over the same time, beside the
    // budgeted one (each pyperch has its own events, programs and maps), so that both see the
    // same workload whatever it does on a loaded machine.
    let free_run = RecordRun::start(&["--pid", &pid, "--rate", RATE]);
    let budget = BUDGET.to_string();
    let run = RecordRun::start(&["--pid", &pid, "--rate", RATE, "--max-cpu", &budget, "--stats"]);
    assert!(free_run.wait_until_sampling(Duration::from_secs(60)), "the unbudgeted pyperch did not start sampling");
    assert!(run.wait_until_sampling(Duration::from_secs(60)), "pyperch did not start sampling");
    let pyperch = run.pid();
    std::thread::sleep(SETTLE);
    let (threads0, bpf0) = pyperch_cpu(pyperch);
    let started = std::time::Instant::now();
    std::thread::sleep(WINDOW);
    let (threads1, bpf1) = pyperch_cpu(pyperch);
    let window = started.elapsed().as_secs_f64();
    let budgeted = run.interrupt();
    let free = free_run.interrupt();
    w.terminate();
    budgeted.assert_ok();
    free.assert_ok();
    let (free_a, free_b, free_total) = leaf_shares(&free, w.pid);
    let d = budgeted.diag_pid(w.pid);

    let (threads, bpf) = (threads1 - threads0, bpf1 - bpf0);
    let percent = (threads + bpf) * 100.0 / window;
    let (a, b, total) = leaf_shares(&budgeted, w.pid);
    let rate = effective_rate(&budgeted.run.stderr);
    note(format!(
        "{}: pyperch {percent:.2}% of one CPU over {window:.1} s (threads {threads:.3} s, BPF {bpf:.3} s), budget {BUDGET}%; effective rate (min, mean, last) {rate:?} of {RATE} Hz; leaf_a {:.1}% / leaf_b {:.1}% budgeted ({total} samples' worth) vs {:.1}% / {:.1}% unbudgeted at the same time ({free_total} samples)",
        py.describe(),
        a * 100.0,
        b * 100.0,
        free_a * 100.0,
        free_b * 100.0,
    ));

    assert!(
        budgeted.run.stderr.contains("CPU budget (--max-cpu): 2% of one CPU") && !budgeted.run.stderr.contains("kernel programs not measured"),
        "--stats does not report the budget with the kernel programs measured{d}"
    );
    assert!(bpf > 0.0, "no BPF run time seen in pyperch's programs' fdinfo: are the kernel's statistics on?{d}");
    let (min_hz, _, last_hz) = rate.unwrap_or_else(|| panic!("no effective-rate line in --stats{d}"));
    let requested: f64 = RATE.parse().expect("rate");
    assert!(min_hz < requested && last_hz < requested, "the budget never lowered the rate: {rate:?}{d}");
    assert!(last_hz >= 1.0, "below the 1 Hz floor: {rate:?}{d}");
    assert_within_budget(BUDGET, percent, threads, bpf, window, "", &d);
    // The skipped samples are stood for by the kept ones: the shares are the unbudgeted
    // recording's (each of tens of thousands of samples: a standard error far below a point).
    assert_shares_close(&[("leaf_a", a, free_a), ("leaf_b", b, free_b)], &d);
    // And the kept samples stand for as many as were taken beside them (the two recordings
    // start and end a little apart: 10 %).
    assert_stands_for(total, free_total, "samples", &d);
    assert!(free_a > 0.5 && free_b > 0.1, "the unbudgeted profile does not show the workload's split{}", free.diag_pid(w.pid));
}

/// The storm of issue #33, "a Python process with 500 threads each switching about 2,000
/// times a second", scaled to what this suite's 2-CPU machines can run and a 2 % budget can
/// hold: `workloads/switch_storm.py`, STORM_THREADS threads each sleeping STORM_SLEEP
/// seconds over and over (three in four in `wait_a`, one in four in `wait_b`), recorded
/// `--mode wall --max-cpu 2` with `--pid`, beside an unbudgeted `--mode wall` pyperch on the
/// same process at the same time. The process's switch rate over the window is measured
/// (voluntary switches of its threads) and noted. Checked, as for the CPU-bound case:
/// - pyperch's CPU over the window, measured from outside (threads + BPF run time), within the
///   budget + 10 %;
/// - the budget bit: `--stats` says fewer than every context switch was walked, and its
///   last share is below 1;
/// - wait_a's and wait_b's shares of the profile within 2 points of the unbudgeted run's (the
///   walked intervals count for the skipped ones), and the total stands for as much time
///   (within 10 %).
///
/// This storm is held mostly by the sampled share (the scheduler-switch program's pauses,
/// the next test's subject, may take a part if a cut of the share barely lowers the cost): about 20,000 switches a second (100 per thread), pyperch at 1.6 to 2.0 %, one
/// switch in 5 to 8 walked, the shares within half a point. The issue's full storm, where the
/// program's call on every switch is itself over the budget, is the next test's.
#[test]
fn budget_holds_pyperch_cpu_in_a_switch_storm() {
    const STORM_THREADS: &str = "200";
    const STORM_SLEEP: &str = "0.01";
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.14", "3.10"]) else {
        skip("no CPython 3.10-3.12 or sid 3.14");
        return;
    };
    let (w, BudgetRuns { budgeted, free, threads, bpf, window, percent, per_second }) =
        switch_storm_runs(&py, &[STORM_THREADS, "300", STORM_SLEEP]);
    let d = budgeted.diag_pid(w.pid);
    let threads_n: f64 = STORM_THREADS.parse().expect("threads");
    let (a, b, total) = function_shares(&budgeted, w.pid, "wait_a", "wait_b");
    let (free_a, free_b, free_total) = function_shares(&free, w.pid, "wait_a", "wait_b");
    let walked = budgeted.run.stderr.lines().find(|l| l.contains("context switches walked")).unwrap_or("").trim().to_string();
    note(format!(
        "{}: {per_second:.0} voluntary switches/s ({:.0} per thread of {STORM_THREADS}); pyperch {percent:.2}% of one CPU over {window:.1} s (threads {threads:.3} s, BPF {bpf:.3} s), budget {BUDGET}%; {walked}; wait_a {:.1}% / wait_b {:.1}% budgeted ({:.1} s) vs {:.1}% / {:.1}% unbudgeted ({:.1} s)",
        py.describe(),
        per_second / threads_n,
        a * 100.0,
        b * 100.0,
        total as f64 / 1e9,
        free_a * 100.0,
        free_b * 100.0,
        free_total as f64 / 1e9,
    ));

    assert!(bpf > 0.0, "no BPF run time seen in pyperch's programs' fdinfo: are the kernel's statistics on?{d}");
    let (last_one_in, _) = walked_share(&walked, &d);
    assert!(last_one_in > 1, "the budget never lowered the share of context switches walked: {walked}{d}");
    assert_within_budget(BUDGET, percent, threads, bpf, window, &format!(" at {per_second:.0} switches/s"), &d);
    assert_shares_close(&[("wait_a", a, free_a), ("wait_b", b, free_b)], &d);
    assert_stands_for(total, free_total, "ns", &d);
    assert!(free_a > 0.5 && free_b > 0.1, "the unbudgeted profile does not show the workload's split{}", free.diag_pid(w.pid));
}

/// The storm of issue #33 at full strength: 500 threads each sleeping 500 us over and over
/// (`workloads/switch_storm.py`; about 2,000 sleeps a second each asked, 300,000-400,000
/// context switches a second reached on the 2-CPU test machine). Every context switch on the
/// host runs the scheduler-switch program, walked or not (0.11-0.16 us a run): at this rate
/// that fixed cost alone is 4-6 % of a CPU, which no share of walks lowers. So `--max-cpu`
/// pauses the program (attached one time slice in `n` of each second, `kernel::switch_gate`),
/// and a walked switch-out counts `n` times more. Recorded `--mode wall --max-cpu 2 --pid`
/// beside an unbudgeted `--mode wall` pyperch on the same process. Checked:
/// - pyperch's CPU over the window, measured from outside (threads + BPF run time), within
///   the budget + 10 % (before pauses: 6.7 % at this storm, and 43 % unbudgeted);
/// - `--stats` says the program was paused, and names the time slices in force;
/// - wait_a's and wait_b's shares within 2 points of the unbudgeted run's, and the total
///   stands for as much time (within 10 %): the pauses' weights keep the profile unbiased;
/// - beside the storm, 100 threads sleep 100 ms at a time in `wait_long`: waits longer than
///   the drain, which a pause can hide the end of. Their share stays within 2 points of the
///   unbudgeted run's (the kept ones are weighed by the chance that their end was seen;
///   without that weight they came out 30 % short).
#[test]
fn budget_holds_in_the_issues_switch_storm_by_pausing_the_switch_program() {
    const STORM_THREADS: &str = "500";
    const STORM_SLEEP: &str = "0.0005";
    const LONG_THREADS: &str = "100";
    const LONG_SLEEP: &str = "0.1";
    let Some(py) = first_python(&["3.12", "3.11", "sid-3.14", "3.10"]) else {
        skip("no CPython 3.10-3.12 or sid 3.14");
        return;
    };
    let (w, BudgetRuns { budgeted, free, threads, bpf, window, percent, per_second }) =
        switch_storm_runs(&py, &[STORM_THREADS, "300", STORM_SLEEP, LONG_THREADS, LONG_SLEEP]);
    let d = budgeted.diag_pid(w.pid);
    let (a, b, total) = function_shares(&budgeted, w.pid, "wait_a", "wait_b");
    let (free_a, free_b, free_total) = function_shares(&free, w.pid, "wait_a", "wait_b");
    let (long, _, _) = function_shares(&budgeted, w.pid, "wait_long", "wait_long");
    let (free_long, _, _) = function_shares(&free, w.pid, "wait_long", "wait_long");
    let stats = &budgeted.run.stderr;
    let walked = stats.lines().find(|l| l.contains("context switches walked")).unwrap_or("").trim().to_string();
    let paused = stats.lines().find(|l| l.contains("scheduler-switch program paused")).unwrap_or("").trim().to_string();
    note(format!(
        "{}: {per_second:.0} voluntary switches/s; pyperch {percent:.2}% of one CPU over {window:.1} s (threads {threads:.3} s, BPF {bpf:.3} s), budget {BUDGET}%; {walked}; {paused}; wait_a {:.1}% / wait_b {:.1}% / wait_long {:.1}% budgeted ({:.1} s) vs {:.1}% / {:.1}% / {:.1}% unbudgeted ({:.1} s)",
        py.describe(),
        a * 100.0,
        b * 100.0,
        long * 100.0,
        total as f64 / 1e9,
        free_a * 100.0,
        free_b * 100.0,
        free_long * 100.0,
        free_total as f64 / 1e9,
    ));

    assert!(bpf > 0.0, "no BPF run time seen in pyperch's programs' fdinfo: are the kernel's statistics on?{d}");
    assert!(!paused.is_empty() && !paused.contains(": 0 pauses"), "--stats does not say the scheduler-switch program was paused: {paused:?}{d}");
    assert!(walked.contains("attached one second in"), "--stats does not name the program's time slices: {walked:?}{d}");
    assert_within_budget(BUDGET, percent, threads, bpf, window, &format!(" at {per_second:.0} switches/s"), &d);
    assert_shares_close(&[("wait_a", a, free_a), ("wait_b", b, free_b), ("wait_long", long, free_long)], &d);
    assert_stands_for(total, free_total, "ns", &d);
    assert!(free_a > 0.4 && free_b > 0.1 && free_long > 0.1, "the unbudgeted profile does not show the workload's split{}", free.diag_pid(w.pid));
}

/// Outside truth for the off-CPU budget: a real threaded server from PyPI, waitress 3.0.2 (the
/// pinned server packages `cargo xtask test` installs into the sid rootfs), serving a WSGI app
/// (`workloads/server_waitress.py`: 16 worker threads; each request runs `cpu_work`, 0.3 ms of
/// pure Python, or `io_wait`, a 1 ms sleep) under local load (`workloads/server_load.py`, 16
/// keep-alive connections), as users run it. Measured here: about 30,000 context switches a
/// second in the server, 55,000 on the host. Recorded `--mode wall --pid` with `--max-cpu`
/// beside an unbudgeted `--mode wall` pyperch ([`budget_runs`]), at two budgets:
/// - 2 %: walking every switch costs about 5 %, so only a share of them is walked (1 in 8
///   to 11);
/// - 1 %: the scheduler-switch program's call on every switch of the host is itself about
///   0.7 %, so the program is paused as well (attached one second in 2).
///
/// Checked at each: pyperch's CPU over the window within the budget + 10 %; `--stats` says the
/// budget bit (a share below 1; at 1 %, pauses); the shares of `cpu_work`, `io_wait` and the
/// idle workers' wait (waitress's `handler_thread` in `Condition.wait`) within 2 points of the
/// unbudgeted run's; the total stands for as much time (within 10 %).
///
/// This case found a bias our own storms had not: a thread blocked from before the recording
/// to its end (here the workload's `threading.Timer`, 17 s of 306) was dropped once a pause had
/// come, its wait no longer proven. Its arrivals count, read with its stack and read again at
/// the end, now proves it (`blocked_at_start::proven_across_pauses`): the budgeted total went
/// from 5-8 % short to within 1 %.
fn waitress_under_budget(budget: f64, paused: bool) {
    let Some(py) = python("sid-3.14") else { return };
    let Some(rootfs) = py.rootfs.clone() else { return skip(format!("{} is not run under chroot", py.describe())) };
    let packages = server_packages_dir(&py);
    if !rootfs.join(packages.trim_start_matches('/')).join("waitress").is_dir() {
        return skip(format!("{} has no waitress (installed by `cargo xtask test`)", rootfs.join(packages.trim_start_matches('/')).display()));
    }
    let env = [("PYTHONPATH", packages.as_str())];
    let mut server = Workload::spawn_env(&py, "server_waitress.py", &["16", "120"], &env).unwrap_or_else(|e| panic!("{e:#}"));
    let port = server.ready_fields().get("port").cloned().unwrap_or_else(|| panic!("no port in {:?}", server.ready));
    let mut load = Workload::spawn(&py, "server_load.py", &[&port, "16", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let BudgetRuns { budgeted, free, threads, bpf, window, percent, per_second } = budget_runs(server.pid, budget);
    load.terminate();
    let load_done = load.stdout_lines().join(" | ");
    server.terminate();
    let d = format!("{}\n--- load: {load_done}", budgeted.diag_pid(server.pid));
    let shares = |rec: &Recording| {
        let p = rec.profile.for_pid(server.pid);
        let total = p.total();
        let share = |f: &str| if total == 0 { 0.0 } else { p.count(|s| s.has_function(f)) as f64 / total as f64 };
        let idle = if total == 0 { 0.0 } else { p.count(|s| s.has_function("handler_thread") && s.has_function("Condition.wait")) as f64 / total as f64 };
        (share("cpu_work"), share("io_wait"), idle, total)
    };
    let (cpu, io, idle, total) = shares(&budgeted);
    let (free_cpu, free_io, free_idle, free_total) = shares(&free);
    let stats = &budgeted.run.stderr;
    let walked = stats.lines().find(|l| l.contains("context switches walked")).unwrap_or("").trim().to_string();
    let pauses = stats.lines().find(|l| l.contains("scheduler-switch program paused")).unwrap_or("").trim().to_string();
    note(format!(
        "{} waitress, --max-cpu {budget}: {per_second:.0} voluntary switches/s in the server; pyperch {percent:.2}% of one CPU over {window:.1} s (threads {threads:.3} s, BPF {bpf:.3} s); {walked}; {pauses}; cpu_work {:.1}% / io_wait {:.1}% / idle workers {:.1}% budgeted ({:.1} s) vs {:.1}% / {:.1}% / {:.1}% unbudgeted ({:.1} s); load: {load_done}",
        py.describe(),
        cpu * 100.0,
        io * 100.0,
        idle * 100.0,
        total as f64 / 1e9,
        free_cpu * 100.0,
        free_io * 100.0,
        free_idle * 100.0,
        free_total as f64 / 1e9,
    ));

    assert!(bpf > 0.0, "no BPF run time seen in pyperch's programs' fdinfo: are the kernel's statistics on?{d}");
    assert!(
        free_cpu > 0.005 && free_io > 0.01 && free_idle > 0.2,
        "the unbudgeted profile does not show the server's work, waits and idle workers{}",
        free.diag_pid(server.pid)
    );
    let (_, mean_share) = walked_share(&walked, &d);
    assert!(mean_share < 0.9, "the budget barely lowered the share of context switches walked: {walked}{d}");
    if paused {
        assert!(!pauses.is_empty() && !pauses.contains(": 0 pauses"), "--stats does not say the scheduler-switch program was paused: {pauses:?}{d}");
    }
    assert_within_budget(budget, percent, threads, bpf, window, &format!(" at {per_second:.0} switches/s"), &d);
    assert_shares_close(&[("cpu_work", cpu, free_cpu), ("io_wait", io, free_io), ("idle workers", idle, free_idle)], &d);
    assert_stands_for(total, free_total, "ns", &d);
}

#[test]
fn budget_holds_on_a_waitress_server_under_load_by_a_share_of_walks() {
    waitress_under_budget(BUDGET, false);
}

#[test]
fn budget_holds_on_a_waitress_server_under_load_by_pausing_the_switch_program() {
    waitress_under_budget(1.0, true);
}

/// A process recorded `--mode wall --pid` with `--max-cpu BUDGET` (and `--stats`) beside an
/// unbudgeted `--mode wall` pyperch on the same process, both ended with Ctrl-C after SETTLE
/// and WINDOW; the budgeted pyperch's CPU over the window, measured from outside, and the
/// process's voluntary switches in it.
struct BudgetRuns {
    budgeted: Recording,
    free: Recording,
    threads: f64,
    bpf: f64,
    window: f64,
    percent: f64,
    per_second: f64,
}

fn budget_runs(pid: u32, budget: f64) -> BudgetRuns {
    let target = pid.to_string();
    let free_run = RecordRun::start(&["--pid", &target, "--mode", "wall"]);
    let budget = budget.to_string();
    let run = RecordRun::start(&["--pid", &target, "--mode", "wall", "--max-cpu", &budget, "--stats"]);
    assert!(free_run.wait_until_switch_hooked(Duration::from_secs(60)), "the unbudgeted pyperch did not hook context switches");
    assert!(run.wait_until_switch_hooked(Duration::from_secs(60)), "pyperch did not hook context switches");
    let pyperch = run.pid();
    std::thread::sleep(SETTLE);
    let (threads0, bpf0) = pyperch_cpu(pyperch);
    let switches0 = voluntary_switches(pid);
    let started = std::time::Instant::now();
    std::thread::sleep(WINDOW);
    let (threads1, bpf1) = pyperch_cpu(pyperch);
    let switches1 = voluntary_switches(pid);
    let window = started.elapsed().as_secs_f64();
    let budgeted = run.interrupt();
    let free = free_run.interrupt();
    budgeted.assert_ok();
    free.assert_ok();
    let (threads, bpf) = (threads1 - threads0, bpf1 - bpf0);
    BudgetRuns {
        percent: (threads + bpf) * 100.0 / window,
        per_second: switches1.saturating_sub(switches0) as f64 / window,
        budgeted,
        free,
        threads,
        bpf,
        window,
    }
}

/// `workloads/switch_storm.py ARGS` under [`budget_runs`] at [`BUDGET`]; the workload has
/// ended.
fn switch_storm_runs(py: &Python, args: &[&str]) -> (Workload, BudgetRuns) {
    let mut w = Workload::spawn(py, "switch_storm.py", args).unwrap_or_else(|e| panic!("{e:#}"));
    let runs = budget_runs(w.pid, BUDGET);
    w.terminate();
    (w, runs)
}

/// `--stats`'s `context switches walked 1 in N last, mean share S%` line → (N, S as a
/// fraction).
fn walked_share(walked: &str, d: &str) -> (u32, f64) {
    let field = |after: &str, end: char| walked.split(after).nth(1).and_then(|r| r.split(end).next()).map(str::trim);
    let last = field("1 in ", ' ').and_then(|n| n.parse().ok());
    let mean = field("mean share ", '%').and_then(|n| n.parse::<f64>().ok());
    match (last, mean) {
        (Some(last), Some(mean)) => (last, mean / 100.0),
        _ => panic!("no share of context switches walked in --stats: {walked:?}{d}"),
    }
}

/// Each (function, budgeted share, unbudgeted share) within 2 points: the walks and samples
/// kept stand for those skipped.
fn assert_shares_close(shares: &[(&str, f64, f64)], d: &str) {
    for &(name, budgeted_share, free_share) in shares {
        assert!(
            (budgeted_share - free_share).abs() <= 0.02,
            "{name}: {:.1}% of the budgeted profile vs {:.1}% unbudgeted, more than 2 points apart{d}",
            budgeted_share * 100.0,
            free_share * 100.0
        );
    }
}

/// pyperch's CPU over the window (`percent` of one CPU: `threads` + `bpf` seconds over
/// `window`) within `budget` + 10 %.
fn assert_within_budget(budget: f64, percent: f64, threads: f64, bpf: f64, window: f64, at: &str, d: &str) {
    assert!(
        percent <= budget * 1.1,
        "pyperch used {percent:.2}% of one CPU (threads {threads:.3} s + BPF {bpf:.3} s over {window:.1} s){at}, over the budget of {budget}% + 10 %{d}"
    );
}

/// The budgeted profile's total stands for as much as the unbudgeted one beside it holds
/// (the two recordings start and end a little apart: 10 %).
fn assert_stands_for(total: u64, free_total: u64, unit: &str, d: &str) {
    let worth = total as f64 / free_total.max(1) as f64;
    assert!((0.9..=1.1).contains(&worth), "the budgeted profile stands for {total} {unit}, the unbudgeted one holds {free_total}{d}");
}
