//! `--mode wall`, `--mode off-cpu` and `--mode cpu` against time the workload measured itself.
//!
//! time_modes.py runs, once the test says go (after pyperch samples), five threads for a few
//! seconds: spin_sleep (3 ms spin / 7 ms time.sleep), lock_waiter (blocked on a lock held
//! 20 ms at a time), lock_holder, pipe_reader (blocked in os.read on a pipe fed every 10 ms)
//! and pipe_feeder; it writes each function's wall time and each thread's lifetime
//! (perf_counter) to a JSON file. The checks, per thread (`--threads`; a thread is found by
//! the functions in its stacks, so tids inside a PID namespace need no mapping):
//! - wall mode: spin_part's and sleep_part's shares of spin_sleep's wall time within 2 points
//!   of the measured shares; the off-CPU time of wait_lock, read_pipe and sleep_part within
//!   2 % of the measured times; each thread's whole profile (on-CPU samples × period plus
//!   off-CPU intervals) equals its lifetime within 1 %, which also shows that no time is
//!   counted twice; the intervals came through the CPUs' batches (`--stats`), read whole and
//!   once; with a timeline (`--format chrometrace`) they come one by one, in time order;
//! - off-cpu mode: only `<off-cpu: ...>` stacks, with the same off-CPU times;
//! - cpu mode: no `<off-cpu: ...>` frame, spin_part has the samples, sleep_part none to speak of;
//! - gil mode (gil_share.py: four pure-Python threads on two CPUs contending for the GIL,
//!   one hashing with the GIL released, one sleeping): each of the four threads' share of the
//!   samples within 3 points of its share of the GIL (its CPU time, `time.thread_time`: a
//!   thread running Python holds the GIL), and the hashing thread, busy on a CPU without the
//!   GIL, nearly absent;
//! - wall mode on gil_share.py (`gil_wait`): each of the four threads' `<off-cpu: GIL wait>`
//!   time is the rest of its lifetime (see the function), and `time.sleep` stays
//!   `<off-cpu: sleep>`.
//!
//! The truth is measured by the workload on the same clock as the recording, so a loaded
//! machine changes both alike; what matters is that the recording covers the threads' whole
//! lives (they start after sampling has begun and end well before it stops).

use std::{collections::BTreeMap, fs, time::Duration};

use pyperch_tests::*;

/// How long the workload's threads run.
const SECONDS: f64 = 6.0;
/// Samples per second: a 1 ms period keeps the error of the sampled on-CPU part of a
/// thread's wall time well under 1 %.
const RATE: &str = "999";

/// One thread of the profile: its stacks (Python frames by name, leaf last, down to the
/// `<off-cpu: ...>` frame if any) and values (ns); with `--kernel`, each off-CPU stack's kernel
/// frames (above that frame, root first) in `kernel`, index for index.
#[derive(Default, Debug)]
struct ThreadTime {
    stacks: Vec<(Vec<String>, u64)>,
    kernel: Vec<Vec<String>>,
}

impl ThreadTime {
    fn total(&self) -> u64 {
        self.stacks.iter().map(|(_, n)| n).sum()
    }

    fn has(&self, function: &str) -> bool {
        self.stacks.iter().any(|(f, _)| f.iter().any(|x| x == function))
    }

    /// Nanoseconds of the stacks holding `function`, off-CPU only when `off_cpu`.
    fn of(&self, function: &str, off_cpu: Option<bool>) -> u64 {
        self.stacks
            .iter()
            .filter(|(f, _)| f.iter().any(|x| x == function))
            .filter(|(f, _)| off_cpu.is_none_or(|off| is_off_cpu(f) == off))
            .map(|(_, n)| n)
            .sum()
    }
}

fn is_off_cpu(frames: &[String]) -> bool {
    frames.last().is_some_and(|leaf| leaf.starts_with("<off-cpu: "))
}

/// The profile of process `pid` per `thread <tid>` frame, frames reduced to function names.
fn threads_of(profile: &Profile, pid: u32) -> BTreeMap<u32, ThreadTime> {
    let mut threads: BTreeMap<u32, ThreadTime> = BTreeMap::new();
    for stack in profile.for_pid(pid).stacks {
        let Some(tid) = stack.tid() else { continue };
        let mut names: Vec<String> = stack.python_frames().into_iter().map(|f| f.name).collect();
        let kernel = match names.iter().position(|n| n.starts_with("<off-cpu: ")) {
            Some(marker) => names.split_off(marker + 1),
            None => Vec::new(),
        };
        let thread = threads.entry(tid).or_default();
        thread.stacks.push((names, stack.count));
        thread.kernel.push(kernel);
    }
    threads
}

/// The thread whose stacks hold `function`.
fn thread_with<'a>(threads: &'a BTreeMap<u32, ThreadTime>, function: &str, d: &str) -> &'a ThreadTime {
    let found: Vec<&ThreadTime> = threads.values().filter(|t| t.has(function)).collect();
    assert_eq!(found.len(), 1, "want exactly one thread running {function}, found {}{d}", found.len());
    found[0]
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Asserts `got` (ns) is within `pct` % of `want` (s).
fn within_pct(what: &str, got: u64, want: f64, pct: f64, d: &str) {
    let got = secs(got);
    let error = 100.0 * (got - want).abs() / want;
    note(format!("{what}: profiled {got:.4} s, measured {want:.4} s ({error:.2} % off)"));
    assert!(error <= pct, "{what}: profiled {got:.4} s vs measured {want:.4} s: {error:.2} % off, want within {pct} %{d}");
}

/// Where the workload runs: its pid as pyperch sees it, its scratch directory, and what
/// keeps it alive.
struct Running {
    pid: u32,
    go: std::path::PathBuf,
    result: std::path::PathBuf,
    describe: String,
    _keep: Box<dyn std::any::Any>,
}

/// A recording of the workload in `mode` (plus `extra` flags), the threads started once
/// sampling runs. Returns the recording and the workload's measurements.
fn record_workload(running: Running, mode: &str, extra: &[&str]) -> (Recording, serde_json::Value, u32) {
    record_workload_for(running, mode, extra, SECONDS)
}

/// `record_workload` for a workload whose threads run `seconds`: the recording ends
/// once it has written its measurements (a minute later at the latest).
fn record_workload_for(running: Running, mode: &str, extra: &[&str], seconds: f64) -> (Recording, serde_json::Value, u32) {
    let pid = running.pid.to_string();
    // A long --duration only as a backstop: the recording is ended with SIGINT (Ctrl-C) once
    // the workload has written its measurements, i.e. after its threads have ended.
    let duration = format!("{}", seconds + 60.0);
    let mut args = vec!["--pid", &pid, "--mode", mode, "--threads", "--rate", RATE, "--duration", &duration, "--stats"];
    args.extend_from_slice(extra);
    let rec = RecordRun::start(&args);
    assert!(rec.wait_until_sampling(Duration::from_secs(30)), "pyperch did not start sampling {}", running.describe);
    // The scheduler-switch program attaches after the perf events (wall and off-CPU modes).
    let switches = mode == "wall" || mode == "off-cpu" || extra.contains(&"--idle");
    if switches {
        assert!(
            rec.wait_until_switch_hooked(Duration::from_secs(30)),
            "pyperch did not attach its scheduler-switch program {}",
            running.describe
        );
    }
    fs::write(&running.go, b"go").expect("cannot write the go file");
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds + 50.0);
    let measured = loop {
        let text = fs::read_to_string(&running.result).unwrap_or_default();
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
            break Some(value);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Samples and intervals already in the kernel's ring buffer are read before pyperch
    // stops; the short wait covers those still being taken at the threads' ends.
    std::thread::sleep(Duration::from_millis(300));
    let rec = rec.interrupt();
    rec.assert_ok();
    let d = rec.diag_pid(running.pid);
    let measured = measured.unwrap_or_else(|| panic!("{}: no measurements in {}{d}", running.describe, running.result.display()));
    (rec, measured, running.pid)
}

fn spawn_plain(label: &str) -> Option<Running> {
    spawn_script(label, "time_modes.py")
}

fn spawn_script(label: &str, script: &str) -> Option<Running> {
    spawn_script_for(label, script, SECONDS)
}

/// `script` run by `label`'s interpreter, its threads running `seconds` once told to go.
fn spawn_script_for(label: &str, script: &str, seconds: f64) -> Option<Running> {
    let py = python(label)?;
    let w = Workload::spawn(&py, script, &["{dir}/result.json", &seconds.to_string(), "{dir}/go"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    Some(Running {
        pid: w.pid,
        go: w.dir.host_path("go"),
        result: w.dir.host_path("result.json"),
        describe: py.describe(),
        _keep: Box::new(w),
    })
}

fn measured(m: &serde_json::Value, thread: &str, field: &str) -> f64 {
    json_f64(m, &[thread, field]).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The wall-mode checks of the module doc.
fn check_wall(rec: &Recording, m: &serde_json::Value, pid: u32, describe: &str) {
    let d = rec.diag_pid(pid);
    let threads = threads_of(&rec.profile, pid);
    note(format!("{describe}: wall mode"));

    let spinner = thread_with(&threads, "spin_sleep", &d);
    let lifetime = measured(m, "spin_sleep", "lifetime");
    let total = secs(spinner.total());
    for part in ["spin_part", "sleep_part"] {
        let share = secs(spinner.of(part, None)) / total;
        let truth = measured(m, "spin_sleep", part) / lifetime;
        note(format!("{describe}: {part} share of spin_sleep's wall time: profiled {:.2} %, measured {:.2} %", share * 100.0, truth * 100.0));
        assert!(
            (share - truth).abs() <= 0.02,
            "{describe}: {part} has {:.2} % of spin_sleep's profiled wall time, measured {:.2} %: want within 2 points{d}",
            share * 100.0,
            truth * 100.0
        );
    }
    within_pct(&format!("{describe}: sleep_part off-CPU"), spinner.of("sleep_part", Some(true)), measured(m, "spin_sleep", "sleep_part"), 2.0, &d);
    let waiter = thread_with(&threads, "lock_waiter", &d);
    within_pct(&format!("{describe}: wait_lock off-CPU"), waiter.of("wait_lock", Some(true)), measured(m, "lock_waiter", "wait_lock"), 2.0, &d);
    let reader = thread_with(&threads, "pipe_reader", &d);
    within_pct(&format!("{describe}: read_pipe off-CPU"), reader.of("read_pipe", Some(true)), measured(m, "pipe_reader", "read_pipe"), 2.0, &d);
    for (thread, t) in [("spin_sleep", spinner), ("lock_waiter", waiter), ("pipe_reader", reader)] {
        within_pct(&format!("{describe}: {thread} wall total vs lifetime"), t.total(), measured(m, thread, "lifetime"), 1.0, &d);
    }
    // The intervals above reached pyperch in the CPUs' batches (`off_cpu_batch`).
    let (sent, at_end) = off_cpu_batches(&rec.run.stderr).unwrap_or_else(|| panic!("{describe}: --stats shows no off-CPU batches{d}"));
    note(format!("{describe}: off-CPU records came in {sent} batches, {at_end} read at the end"));
    assert!(sent > 0, "{describe}: no batch of off-CPU records was sent{d}");
}

/// `--stats`' "sent in N batches, M batches read at the end" → (N, M).
fn off_cpu_batches(stats: &str) -> Option<(u64, u64)> {
    let line = stats.lines().find(|l| l.contains("kernel off-CPU intervals:"))?;
    let rest = line.split("sent in ").nth(1)?;
    let sent = rest.split_whitespace().next()?.parse().ok()?;
    let at_end = rest.split(", ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some((sent, at_end))
}

/// `--mode wall --format chrometrace`: a timeline needs each thread's records in time order,
/// so the off-CPU records are sent one by one (no batch) and none is out of order; the trace
/// holds `<off-cpu: ...>` events.
#[test]
fn wall_timeline_in_time_order() {
    let Some(running) = spawn_plain("3.12") else { return };
    let pid = running.pid.to_string();
    let trace = running.result.with_file_name("wall.trace.json");
    let trace_str = trace.to_string_lossy().into_owned();
    let rec = std::thread::spawn(move || {
        pyperch(
            &["record", "--pid", &pid, "--mode", "wall", "--duration", "4", "--format", "chrometrace", "-o", &trace_str, "--stats"],
            Duration::from_secs(90),
        )
    });
    std::thread::sleep(Duration::from_secs(1));
    fs::write(&running.go, b"go").expect("cannot write the go file");
    let run = rec.join().expect("the recording thread");
    let d = run.diag();
    assert_eq!(run.code(), Some(0), "{}: pyperch failed{d}", running.describe);
    let (sent, at_end) = off_cpu_batches(&run.stderr).unwrap_or_else(|| panic!("{}: --stats shows no off-CPU intervals{d}", running.describe));
    assert_eq!((sent, at_end), (0, 0), "{}: off-CPU records were batched although a timeline is kept{d}", running.describe);
    assert!(run.stderr.contains(" 0 out of order"), "{}: timeline samples out of order{d}", running.describe);
    let text = fs::read_to_string(&trace).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}{d}", running.describe));
    let off_cpu = json["traceEvents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("<off-cpu: ")))
        .count();
    assert!(off_cpu > 0, "{}: no <off-cpu: ...> event in the trace{d}", running.describe);
}

fn wall(label: &str) {
    let Some(running) = spawn_plain(label) else { return };
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload(running, "wall", &[]);
    check_wall(&rec, &m, pid, &describe);
}

#[test]
fn wall_3_8() {
    wall("3.8");
}

#[test]
fn wall_3_9() {
    wall("3.9");
}

#[test]
fn wall_3_10() {
    wall("3.10");
}

#[test]
fn wall_3_11() {
    wall("3.11");
}

#[test]
fn wall_3_12() {
    wall("3.12");
}

#[test]
fn wall_3_13() {
    wall("3.13");
}

#[test]
fn wall_sid_3_13() {
    wall("sid-3.13");
}

#[test]
fn wall_sid_3_14() {
    wall("sid-3.14");
}

#[test]
fn wall_sid_3_15() {
    wall("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn wall_ft_3_14() {
    wall(FT_3_14);
}

/// Off-CPU mode: nothing but off-CPU stacks, and the same exact waiting times.
fn off_cpu(label: &str) {
    off_cpu_with(label, &[]);
}

/// `off_cpu` with `extra` flags for pyperch; returns the workload's threads.
fn off_cpu_with(label: &str, extra: &[&str]) -> Option<(BTreeMap<u32, ThreadTime>, String)> {
    let running = spawn_plain(label)?;
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload(running, "off-cpu", extra);
    let d = rec.diag_pid(pid);
    let threads = threads_of(&rec.profile, pid);
    for (tid, t) in &threads {
        for (frames, n) in &t.stacks {
            assert!(is_off_cpu(frames), "{describe}: thread {tid} has an on-CPU stack in off-cpu mode: {frames:?} {n}{d}");
        }
    }
    let spinner = thread_with(&threads, "spin_sleep", &d);
    within_pct(&format!("{describe}: sleep_part off-CPU"), spinner.of("sleep_part", None), measured(&m, "spin_sleep", "sleep_part"), 2.0, &d);
    let waiter = thread_with(&threads, "lock_waiter", &d);
    within_pct(&format!("{describe}: wait_lock off-CPU"), waiter.of("wait_lock", None), measured(&m, "lock_waiter", "wait_lock"), 2.0, &d);
    let reader = thread_with(&threads, "pipe_reader", &d);
    within_pct(&format!("{describe}: read_pipe off-CPU"), reader.of("read_pipe", None), measured(&m, "pipe_reader", "read_pipe"), 2.0, &d);
    // spin_part is on a CPU but for preemptions and GIL hand-overs: far below its wall time.
    let spin_off = secs(spinner.of("spin_part", None));
    let spin_wall = measured(&m, "spin_sleep", "spin_part");
    assert!(spin_off < spin_wall * 0.6, "{describe}: spin_part has {spin_off:.3} s off-CPU of {spin_wall:.3} s wall{d}");
    Some((threads, d))
}

#[test]
fn off_cpu_3_8() {
    off_cpu("3.8");
}

#[test]
fn off_cpu_3_12() {
    off_cpu("3.12");
}

#[test]
fn off_cpu_sid_3_15() {
    off_cpu("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn off_cpu_ft_3_14() {
    off_cpu(FT_3_14);
}

/// `--mode off-cpu --kernel`: the same exact times on the same Python stacks, and above each
/// interval's `<off-cpu: ...>` frame the kernel stack where the thread was switched out,
/// root first, each frame a `_[k]` one, ending in the scheduler and with none of the tracing
/// that took it: `time.sleep` blocked in the kernel's nanosleep, `os.read` in the pipe's
/// read, the lock in a futex wait (at least 95 % of each function's `<off-cpu: sleep>` time:
/// a wait can end in another kernel path, as a GIL hand-over, but not often).
#[test]
fn off_cpu_kernel_stacks_3_12() {
    let Some((threads, d)) = off_cpu_with("3.12", &["--kernel"]) else { return };
    let mut with_kernel = 0u64;
    let mut off_total = 0u64;
    for t in threads.values() {
        for ((frames, n), kernel) in t.stacks.iter().zip(&t.kernel) {
            if frames.last().is_none_or(|leaf| leaf == "<off-cpu: short>") {
                continue;
            }
            off_total += n;
            if kernel.is_empty() {
                continue;
            }
            with_kernel += n;
            assert!(kernel.iter().all(|k| k.ends_with("_[k]")), "not all kernel frames: {kernel:?}{d}");
            assert!(!kernel.iter().any(|k| k.starts_with("bpf_") || k.starts_with("__traceiter_")), "tracing frames shown: {kernel:?}{d}");
            let leaf = kernel.last().map(String::as_str).unwrap_or_default();
            assert!(leaf.contains("schedule"), "the leaf kernel frame is not the scheduler: {kernel:?}{d}");
        }
    }
    assert!(
        with_kernel as f64 >= 0.99 * off_total as f64,
        "only {with_kernel} of {off_total} ns of off-CPU time have kernel frames{d}"
    );
    for (function, kernel_function) in [("sleep_part", "nanosleep"), ("read_pipe", "pipe_read"), ("wait_lock", "futex")] {
        let t = thread_with(&threads, function, &d);
        let slept = t.stacks.iter().zip(&t.kernel).filter(|((f, _), _)| {
            f.iter().any(|x| x == function) && f.last().is_some_and(|l| l == "<off-cpu: sleep>")
        });
        let (mut total, mut found) = (0u64, 0u64);
        for ((_, n), kernel) in slept {
            total += n;
            if kernel.iter().any(|k| k.contains(kernel_function)) {
                found += n;
            }
        }
        note(format!("{function}: {:.1} % of its sleep in a kernel function named *{kernel_function}*", 100.0 * found as f64 / total.max(1) as f64));
        assert!(total > 0 && found as f64 >= 0.95 * total as f64, "{function}: {found} of {total} ns asleep in *{kernel_function}*{d}");
    }
}

/// CPU mode (the default) is unchanged: samples of running threads only, counted not timed.
#[test]
fn cpu_mode_shows_only_running_time() {
    let Some(running) = spawn_plain("3.12") else { return };
    let describe = running.describe.clone();
    let (rec, _m, pid) = record_workload(running, "cpu", &[]);
    let d = rec.diag_pid(pid);
    let threads = threads_of(&rec.profile, pid);
    assert!(threads.values().all(|t| t.stacks.iter().all(|(f, _)| !is_off_cpu(f))), "{describe}: off-CPU frames in cpu mode{d}");
    let spinner = thread_with(&threads, "spin_sleep", &d);
    let (spin, sleep) = (spinner.of("spin_part", None), spinner.of("sleep_part", None));
    assert!(spin >= 500, "{describe}: only {spin} samples in spin_part{d}");
    assert!(sleep * 50 <= spin, "{describe}: sleep_part has {sleep} samples against spin_part's {spin}{d}");
}

/// Wall mode inside a PID namespace (and a cgroup), as in containers: the kernel's tids are
/// not the namespace's, and nothing depends on them.
#[test]
fn wall_in_pid_namespace() {
    let Some((py, mut cgroups)) = namespaced_python_and_cgroups() else { return };
    let cgroup = format!("/pyperch-e2e-{}.slice/time-modes.scope", random_hex(8));
    let c = Contained::spawn(
        &py,
        &mut cgroups,
        &cgroup,
        true,
        "time_modes.py",
        &["{dir}/result.json", &SECONDS.to_string(), "{dir}/go"],
        &format!("tm{}", random_hex(6)),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(c.namespaced);
    let running = Running {
        pid: c.host_pid,
        go: c.dir.host_path("go"),
        result: c.dir.host_path("result.json"),
        describe: format!("{} in a PID namespace", py.describe()),
        _keep: Box::new((c, cgroups)),
    };
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload(running, "wall", &[]);
    check_wall(&rec, &m, pid, &describe);
}

/// `--idle` and `--gil` are py-spy's names for `--mode wall` and `--mode gil`: combined with
/// another mode, or with each other, they are one clear sentence; so is a bad `--min-off-cpu`.
#[test]
fn mode_flags_are_checked() {
    let run = pyperch(&["record", "--gil", "--idle", "--duration", "1"], Duration::from_secs(30));
    run.assert_clear_error();
    assert!(run.error_line().contains("--mode gil"), "{}", run.diag());
    let run = pyperch(&["record", "--gil", "--mode", "wall", "--duration", "1"], Duration::from_secs(30));
    run.assert_clear_error();
    assert!(run.error_line().contains("--mode gil"), "{}", run.diag());
    let run = pyperch(&["record", "--idle", "--mode", "off-cpu", "--duration", "1"], Duration::from_secs(30));
    run.assert_clear_error();
    assert!(run.error_line().contains("--mode wall"), "{}", run.diag());
    let run = pyperch(&["record", "--min-off-cpu", "5", "--duration", "1"], Duration::from_secs(30));
    assert!(!run.success() && run.stderr.contains("unit"), "{}", run.diag());
}

/// `--idle` records off-CPU time (it is `--mode wall`).
#[test]
fn idle_is_wall_mode() {
    let Some(running) = spawn_plain("3.12") else { return };
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload(running, "cpu", &["--idle"]);
    check_wall(&rec, &m, pid, &describe);
}

/// `--mode gil`: see the module doc.
fn gil(label: &str) {
    let Some(running) = spawn_script(label, "gil_share.py") else { return };
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload(running, "gil", &[]);
    let d = rec.diag_pid(pid);
    let threads = threads_of(&rec.profile, pid);
    let names = ["gil_a", "gil_b", "gil_c", "gil_d"];
    let samples: Vec<u64> = names.iter().map(|n| thread_with(&threads, n, &d).total()).collect();
    let held: Vec<f64> = names.iter().map(|n| json_f64(&m, &[n]).unwrap_or_else(|e| panic!("{e:#}"))).collect();
    let (all_samples, all_held) = (samples.iter().sum::<u64>() as f64, held.iter().sum::<f64>());
    assert!(all_samples >= 1000.0, "{describe}: only {all_samples} samples of the GIL holders{d}");
    for (i, name) in names.iter().enumerate() {
        let (share, truth) = (samples[i] as f64 / all_samples, held[i] / all_held);
        note(format!("{describe}: {name} holds the GIL {:.2} % of the time, profiled {:.2} %", truth * 100.0, share * 100.0));
        assert!(
            (share - truth).abs() <= 0.03,
            "{describe}: {name} has {:.2} % of the gil-mode samples, held the GIL {:.2} % of the time: want within 3 points{d}",
            share * 100.0,
            truth * 100.0
        );
    }
    let hasher: u64 = threads.values().filter(|t| t.has("hash_free")).map(ThreadTime::total).sum();
    let hash_cpu = json_f64(&m, &["hash_free"]).unwrap_or(0.0);
    note(format!("{describe}: hash_free ran {hash_cpu:.2} s on a CPU without the GIL; {hasher} gil-mode samples"));
    assert!(
        (hasher as f64) < all_samples * 0.05,
        "{describe}: hash_free (GIL released, {hash_cpu:.2} s on a CPU) has {hasher} gil-mode samples against {all_samples} of the holders{d}"
    );
}

/// How long gil_share.py's threads run for `gil_wait`: its checks compare exact times (the
/// kernel's intervals, the threads' own clocks), not sample counts, so a short run suffices.
const GIL_WAIT_SECONDS: f64 = 2.5;

/// Wall mode on gil_share.py: each of the four contending threads spends its time holding the
/// GIL (its CPU time), preempted, or waiting for the GIL. So its `<off-cpu: GIL wait>` time
/// equals its lifetime minus its CPU time minus its (exact, kernel-measured) preempted and
/// short off-CPU time, within 3 points of its lifetime, and its plain `<off-cpu: sleep>` is
/// nearly nothing. The sleeper's 10 ms sleeps (`select`, which releases the GIL before its
/// timeout starts) stay `<off-cpu: sleep>`: at least the sleep time it asked for (a GIL wait
/// taken for a sleep would be missing there), at most the time its calls took.
fn gil_wait(label: &str) {
    let Some(running) = spawn_script_for(label, "gil_share.py", GIL_WAIT_SECONDS) else { return };
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload_for(running, "wall", &[], GIL_WAIT_SECONDS);
    let d = rec.diag_pid(pid);
    let threads = threads_of(&rec.profile, pid);
    let leaf_of = |t: &ThreadTime, function: &str, leaf: &str| -> f64 {
        secs(
            t.stacks
                .iter()
                .filter(|(f, _)| f.iter().any(|x| x == function) && f.last().is_some_and(|l| l == leaf))
                .map(|(_, n)| n)
                .sum(),
        )
    };
    for name in ["gil_a", "gil_b", "gil_c", "gil_d"] {
        let t = thread_with(&threads, name, &d);
        let lifetime = json_f64(&m, &["lifetime", name]).unwrap_or_else(|e| panic!("{e:#}"));
        let cpu = json_f64(&m, &[name]).unwrap_or_else(|e| panic!("{e:#}"));
        let gil_wait = leaf_of(t, name, "<off-cpu: GIL wait>");
        let preempted = leaf_of(t, name, "<off-cpu: preempted>");
        let sleep = leaf_of(t, name, "<off-cpu: sleep>");
        let short = secs(t.stacks.iter().filter(|(f, _)| f.iter().any(|x| x == "<off-cpu: short>")).map(|(_, n)| n).sum());
        let want = lifetime - cpu - preempted - short;
        note(format!(
            "{describe}: {name} lived {lifetime:.3} s, on a CPU {cpu:.3} s; profiled GIL wait {gil_wait:.3} s \
             (want {want:.3} s), preempted {preempted:.3} s, short {short:.4} s, sleep {sleep:.4} s"
        ));
        assert!(
            gil_wait >= 0.2 * lifetime,
            "{describe}: {name} has only {gil_wait:.3} s of GIL wait in {lifetime:.3} s: the contention proves nothing{d}"
        );
        assert!(
            (gil_wait - want).abs() <= 0.03 * lifetime,
            "{describe}: {name} has {gil_wait:.3} s of <off-cpu: GIL wait>, want {want:.3} s (lifetime {lifetime:.3} - CPU \
             {cpu:.3} - preempted {preempted:.3} - short {short:.4}) within 3 % of its lifetime{d}"
        );
        assert!(
            sleep <= 0.03 * lifetime,
            "{describe}: {name} waits only for the GIL but has {sleep:.3} s of <off-cpu: sleep> in {lifetime:.3} s{d}"
        );
    }
    let t = thread_with(&threads, "sleeper", &d);
    let requested = measured(&m, "sleeper", "requested");
    let in_sleep = measured(&m, "sleeper", "in_sleep");
    let sleep = leaf_of(t, "sleeper", "<off-cpu: sleep>");
    note(format!(
        "{describe}: sleeper asked for {requested:.3} s of sleep, its calls took {in_sleep:.3} s; profiled sleep {sleep:.3} s, \
         GIL wait {:.3} s",
        leaf_of(t, "sleeper", "<off-cpu: GIL wait>")
    ));
    assert!(
        sleep >= 0.98 * requested && sleep <= 1.02 * in_sleep,
        "{describe}: sleeper has {sleep:.3} s of <off-cpu: sleep>; it asked for {requested:.3} s and its calls took \
         {in_sleep:.3} s{d}"
    );
}

#[test]
fn gil_wait_3_9() {
    gil_wait("3.9");
}

#[test]
fn gil_wait_3_12() {
    gil_wait("3.12");
}

#[test]
fn gil_wait_sid_3_15() {
    gil_wait("sid-3.15");
}

/// A free-threaded 3.14 run with `PYTHON_GIL=1` (skipped where `PYPERCH_FT_PYTHON` is unset):
/// its GIL struct starts with `enabled`, 8 bytes longer than a default build's.
#[test]
fn gil_wait_ft_3_14_gil() {
    gil_wait(FT_GIL_3_14);
}

#[test]
fn gil_ft_3_14_gil() {
    gil(FT_GIL_3_14);
}

#[test]
fn gil_3_8() {
    gil("3.8");
}

#[test]
fn gil_3_9() {
    gil("3.9");
}

#[test]
fn gil_3_10() {
    gil("3.10");
}

#[test]
fn gil_3_11() {
    gil("3.11");
}

#[test]
fn gil_3_12() {
    gil("3.12");
}

#[test]
fn gil_3_13() {
    gil("3.13");
}

#[test]
fn gil_sid_3_13() {
    gil("sid-3.13");
}

#[test]
fn gil_sid_3_14() {
    gil("sid-3.14");
}

#[test]
fn gil_sid_3_15() {
    gil("sid-3.15");
}

/// `--mode exception` (exception_share.py): the threads spinning inside an `except` block
/// (directly, or in a generator run from one) have the samples, each a fair share of its CPU
/// time; the threads spinning outside one (never raised, or after a handled exception, when
/// the thread's exception state holds None or NULL) have none.
fn exception(label: &str) {
    let Some(running) = spawn_script(label, "exception_share.py") else { return };
    let describe = running.describe.clone();
    let (rec, m, pid) = record_workload(running, "exception", &[]);
    let d = rec.diag_pid(pid);
    let threads = threads_of(&rec.profile, pid);
    for name in ["in_handler", "generator_in_handler"] {
        let samples = thread_with(&threads, name, &d).total();
        let cpu = json_f64(&m, &[name]).unwrap_or_else(|e| panic!("{e:#}"));
        note(format!("{describe}: {name} ran {cpu:.2} s on a CPU inside an except block; {samples} exception-mode samples"));
        // At 999 Hz a thread gets about 1000 samples per CPU second; half is a wide margin.
        assert!(
            samples as f64 >= cpu * 500.0,
            "{describe}: {name} ran {cpu:.2} s handling an exception but has only {samples} exception-mode samples{d}"
        );
    }
    for name in ["outside_handler", "after_handler"] {
        // Their spin, where the workload asserts that nothing is handled: before it, the
        // thread may rightly be sampled inside an `except` of the import machinery (setting
        // its OS name imports ctypes), as seen once in about 40 runs.
        let samples: u64 = threads
            .values()
            .flat_map(|t| &t.stacks)
            .filter(|(frames, _)| frames.iter().any(|f| f == name) && frames.iter().any(|f| f == "spin"))
            .map(|(_, n)| n)
            .sum();
        let cpu = json_f64(&m, &[name]).unwrap_or_else(|e| panic!("{e:#}"));
        note(format!("{describe}: {name} ran {cpu:.2} s on a CPU handling nothing; {samples} exception-mode samples"));
        assert!(cpu > 0.2, "{describe}: {name} hardly ran ({cpu:.2} s): the check would prove nothing{d}");
        assert_eq!(samples, 0, "{describe}: {name} handles no exception but has {samples} exception-mode samples{d}");
    }
    let stats = &rec.run.stderr;
    assert!(
        stats.contains("samples of threads not handling an exception dropped"),
        "{describe}: --stats does not count the dropped samples{d}"
    );
}

// Side by side, three interpreters at a time: each check is against the thread's own CPU
// time (samples per CPU second, half the rate as the margin) or is zero samples, whatever
// share of the CPU the workload gets.
#[test]
fn exception_3_8_to_3_10() {
    side_by_side(&["3.8", "3.9", "3.10"], 3, |label| exception(label));
}

#[test]
fn exception_3_11_to_3_13() {
    side_by_side(&["3.11", "3.12", "3.13"], 3, |label| exception(label));
}

#[test]
fn exception_sid_3_13_to_3_15() {
    side_by_side(&["sid-3.13", "sid-3.14", "sid-3.15"], 3, |label| {
        exception(label)
    });
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn exception_ft_3_14() {
    exception(FT_3_14);
}

/// `--threads` names each thread frame with the thread's name: exception_share.py names its
/// threads `pp-<function>` (prctl, and the same `threading.Thread` name, which wins where
/// threading knows the thread), and the thread running each function shows that name.
fn thread_names(label: &str) {
    let Some(running) = spawn_script(label, "exception_share.py") else { return };
    let describe = running.describe.clone();
    let (rec, _m, pid) = record_workload(running, "cpu", &[]);
    let d = rec.diag_pid(pid);
    for function in ["in_handler", "outside_handler"] {
        let want = format!("pp-{function}");
        let want = &want[..want.len().min(15)];
        let names: std::collections::BTreeSet<Option<String>> = rec
            .profile
            .for_pid(pid)
            .stacks
            .iter()
            .filter(|s| s.python_frames().iter().any(|f| f.name == function))
            .map(|s| s.thread_name().map(str::to_string))
            .collect();
        note(format!("{describe}: thread of {function} named {names:?}"));
        assert!(!names.is_empty(), "{describe}: no stack of {function}{d}");
        assert!(names.contains(&Some(want.to_string())), "{describe}: {function}'s thread is not named {want}: {names:?}{d}");
        // Before its prctl the thread shows the name it inherited: never another thread's.
        for name in names.iter().flatten() {
            assert!(!name.starts_with("pp-") || name == want, "{describe}: {function}'s thread named {name}{d}");
        }
    }
}

// Side by side: the checks are which names the threads' stacks carry.
#[test]
fn thread_names_3_9_3_12_sid_3_15() {
    side_by_side(&["3.9", "3.12", "sid-3.15"], 3, |label| thread_names(label));
}

/// Wall mode on blocked_start.py: threads switched out since before pyperch started. The
/// thread blocked for the whole recording is charged all of it, in `blocked_forever` under
/// `<off-cpu: sleep>`; the thread that wakes about 1 s into the recording has its wait up to
/// then charged too, so its whole profile is as long as the recording. The recording's length
/// is the spinner's whole profile (a thread on a CPU all along, its samples × period plus
/// its GIL waits: the wall tests check such totals against the thread's lifetime within 1 %).
fn blocked_at_start(label: &str) {
    let Some(py) = python(label) else { return };
    let w = Workload::spawn(&py, "blocked_start.py", &["{dir}/go"]).unwrap_or_else(|e| panic!("{e:#}"));
    let describe = py.describe();
    let pid = w.pid.to_string();
    let rec = RecordRun::start(&["--pid", &pid, "--mode", "wall", "--threads", "--rate", RATE, "--duration", "3", "--stats"]);
    assert!(rec.wait_until_sampling(Duration::from_secs(30)), "pyperch did not start sampling {describe}");
    // The waker wakes 1 s after this: well after its stack was read.
    std::thread::sleep(Duration::from_millis(300));
    fs::write(w.dir.host_path("go"), b"go").expect("cannot write the go file");
    let rec = rec.finish();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    let threads = threads_of(&rec.profile, w.pid);
    let spinner = thread_with(&threads, "spin", &d);
    let length = secs(spinner.total());
    note(format!("{describe}: the recording is {length:.4} s long (the spinner's profile)"));

    let blocked = thread_with(&threads, "blocked_forever", &d);
    for (frames, n) in &blocked.stacks {
        assert!(
            is_off_cpu(frames) && frames.last().is_some_and(|l| l == "<off-cpu: sleep>"),
            "{describe}: the thread blocked all along has a stack other than <off-cpu: sleep>: {frames:?} {n}{d}"
        );
    }
    within_pct(&format!("{describe}: blocked_forever's whole profile vs the recording"), blocked.total(), length, 2.0, &d);

    let waker = thread_with(&threads, "late_waker", &d);
    let waited = secs(waker.of("wait_for_go", Some(true)));
    note(format!("{describe}: wait_for_go off-CPU {waited:.4} s"));
    assert!(waited > 0.5, "{describe}: the late waker's wait before it woke has {waited:.4} s, want about 1.3 s{d}");
    assert!(waker.has("spin_sleep"), "{describe}: the late waker shows nothing after it woke{d}");
    within_pct(&format!("{describe}: late_waker's whole profile vs the recording"), waker.total(), length, 2.0, &d);

    let stats = rec.run.stderr_lines().into_iter().find(|l| l.contains("blocked at start")).unwrap_or_default().to_string();
    note(format!("{describe}: {}", stats.trim()));
    let charged: u64 = stats
        .split("threads charged")
        .next()
        .and_then(|s| s.rsplit(' ').find(|w| !w.is_empty()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(charged >= 2, "{describe}: --stats says {charged} threads blocked at start were charged, want at least 2: {stats:?}{d}");
}

#[test]
fn wall_blocked_at_start_3_12() {
    blocked_at_start("3.12");
}

#[test]
fn wall_blocked_at_start_sid_3_15() {
    blocked_at_start("sid-3.15");
}
