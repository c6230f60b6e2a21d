//! Forged memory: target processes that forge their own interpreter state through ctypes
//! (workloads/forged_memory.py, with the C helper workloads/forged_spin.c) while a benign
//! process is profiled in the same recording.
//!
//! For every scenario: each sample is counted under the expected outcome in `--stats` (or is
//! an `ok` sample of the real frames around the forging), no stack shows a name the process
//! never ran, pyperch exits cleanly (no panic; `cargo xtask test` also runs this file against
//! a build with overflow checks, see xtask), the recording ends on time and the ring buffer
//! never overflows (the sampling loop keeps pace), and the benign process keeps at least
//! 90 % of the samples its CPU time calls for, all with its own leaf.

use std::{
    collections::BTreeMap,
    fs,
    path::PathBuf,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use pyperch_tests::*;

/// One interpreter of each frame model: 3.8-3.10 frame objects, 3.11/3.12 `_PyCFrame`,
/// 3.13+ `current_frame` with tagged code pointers (3.14) and a static build.
const VERSIONS: [&str; 4] = ["3.9", "3.12", "sid-3.14", "sid-3.15"];

const DURATION_SECS: u64 = 8;
const RATE: u64 = 499;

/// Scenario (see forged_memory.py) → the outcome label its forged samples are counted under.
const SCENARIOS: [(&str, &str); 19] = [
    ("self_cycle", "cyclic frame chain"),
    ("two_cycle", "cyclic frame chain"),
    ("long_cycle", "truncated (too deep)"),
    ("kernel_frame", "read fault (kernel)"),
    ("kernel_previous", "read fault (kernel)"),
    ("kernel_code", "bad code object"),
    ("code_huge_linetable", "bad code object"),
    ("code_negative_linetable", "bad code object"),
    ("code_negative_firstlineno", "bad code object"),
    ("code_huge_firstlineno", "ok"),
    ("qualname_huge_length", "bad code object"),
    ("qualname_negative_length", "bad code object"),
    ("qualname_bad_kind", "bad code object"),
    ("qualname_ascii_ucs4", "bad code object"),
    ("qualname_noncompact_kernel", "bad code object"),
    ("qualname_not_str", "bad code object"),
    ("filename_huge_length", "bad code object"),
    ("linetable_max_varints", "ok"),
    ("linetable_churn", "code object changed since the sample"),
];

/// The only function names a forging process's code objects carry (`churning_name` is the
/// `co_name` of linetable_churn's forged code object, which is also its qualname up to 3.10:
/// shown when a sample catches its hash unchanged), and `<GC>`, the frame pyperch adds when a
/// sample catches the real frames around the forging while the garbage collector runs (seen in
/// CI: one sample of two_cycle's process in 8 s).
const FORGER_FUNCTIONS: [&str; 6] = ["<module>", "main", "spin_forged", "forged_target", "churning_name", "<GC>"];

/// Compiles forged_spin.c into a directory the interpreter sees; returns (host dir, the
/// library's path for the interpreter).
fn build_library(py: &Python) -> Result<(PathBuf, String), String> {
    let gcc = find_program("gcc").or_else(|| find_program("cc")).ok_or("no C compiler (gcc or cc) on PATH")?;
    let name = format!("forged-lib-{}-{}", std::process::id(), py.label);
    let guest = PathBuf::from("/tmp/pyperch-tests").join(&name);
    let host = match &py.rootfs {
        Some(root) => root.join(guest.strip_prefix("/").unwrap()),
        None => guest.clone(),
    };
    fs::create_dir_all(&host).map_err(|e| format!("cannot create {}: {e}", host.display()))?;
    let out = host.join("libforged.so");
    let status = Command::new(&gcc)
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(workload_source("forged_spin.c"))
        .status()
        .map_err(|e| format!("cannot run {}: {e}", gcc.display()))?;
    if !status.success() {
        return Err(format!("{} failed to compile forged_spin.c ({})", gcc.display(), describe_status(status)));
    }
    Ok((host, guest.join("libforged.so").to_string_lossy().into_owned()))
}

/// Outcome counts per pid, from the `--stats` report.
fn outcomes_by_pid(stats: &str) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut all: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    let mut current: Option<u32> = None;
    for line in stats.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("process ") {
            current = rest.split_whitespace().next().and_then(|p| p.parse().ok());
            continue;
        }
        let Some(pid) = current else { continue };
        // `<label>   <count> ( 12.3%)`
        let Some(open) = t.strip_suffix("%)").and_then(|s| s.rfind('(')) else { continue };
        let Some((label, count)) = t[..open].trim_end().rsplit_once(char::is_whitespace) else { continue };
        if let Ok(n) = count.parse::<u64>() {
            all.entry(pid).or_default().insert(label.trim().to_string(), n);
        }
    }
    all
}

/// `kernel: N samples ..., M lost (ring buffer full)` → M.
fn ring_buffer_losses(stats: &str) -> Option<u64> {
    let line = stats.lines().find(|l| l.contains("lost (ring buffer full)"))?;
    let before = line.split(" lost (ring buffer full)").next()?;
    before.rsplit(", ").next()?.trim().parse().ok()
}

/// CPU time (user + system) of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

fn forged(label: &str) {
    let Some(py) = python(label) else { return };
    let (lib_dir, lib) = match build_library(&py) {
        Ok(l) => l,
        Err(e) => return skip(format!("forged memory on {}: {e}", py.describe())),
    };
    let max = (DURATION_SECS + 100).to_string();
    let mut benign = Workload::spawn(&py, "spin.py", &["leaf_blue", &max]).unwrap_or_else(|e| panic!("{e:#}"));
    let mut forgers: Vec<(&str, &str, Workload)> = SCENARIOS
        .iter()
        .map(|&(scenario, outcome)| {
            // From 3.12 the validation word is the code object's `co_version`, unique per code
            // object: a name whose cached hash is scribbled over belongs to the same code
            // object, so its samples are exact (`ok`), not "changed".
            let outcome = if scenario == "linetable_churn" && py.version() >= (3, 12) { "ok" } else { outcome };
            let w = Workload::spawn(&py, "forged_memory.py", &[&lib, scenario, &max]).unwrap_or_else(|e| panic!("{e:#}"));
            (scenario, outcome, w)
        })
        .collect();

    let pids: Vec<String> = std::iter::once(benign.pid).chain(forgers.iter().map(|f| f.2.pid)).map(|p| p.to_string()).collect();
    let duration = DURATION_SECS.to_string();
    let rate = RATE.to_string();
    let mut args = vec!["--duration", &duration, "--rate", &rate, "--stats"];
    for p in &pids {
        args.extend(["--pid", p.as_str()]);
    }
    let started = Instant::now();
    let run = RecordRun::start(&args);
    assert!(run.wait_until_sampling(Duration::from_secs(30)), "{}: pyperch never started sampling", py.describe());
    let events_open = Instant::now();
    assert!(run.wait_until_registered(Duration::from_secs(30)), "{}: pyperch never started its loop", py.describe());
    // The benign process's CPU time is measured over a window inside sampling: its samples are
    // kept from its registration, before the loop's drain thread starts (waited for above).
    // The perf events open earlier, before 20 processes are inspected: a window begun there
    // once found the benign process a fifth short of its expected samples in CI. `--duration`
    // counts from the loop's start, just before `cpu_before`. The window must not run to
    // pyperch's exit: after sampling stops pyperch still symbolizes and writes its output
    // (seconds under CI's load) while the process spins on unsampled.
    let inspecting = events_open.elapsed();
    let window_start = Instant::now();
    let cpu_before = cpu_seconds(benign.pid).expect("the benign process's CPU time");
    let window_end = window_start + Duration::from_secs(DURATION_SECS) - Duration::from_millis(250);
    thread::sleep(window_end.saturating_duration_since(Instant::now()));
    let cpu_after = cpu_seconds(benign.pid).expect("the benign process's CPU time");
    let rec = run.finish();
    let elapsed = started.elapsed();
    let benign_status = benign.terminate();
    for (_, _, w) in &mut forgers {
        w.terminate();
    }
    let _ = fs::remove_dir_all(&lib_dir);

    rec.assert_ok();
    let d = rec.diag();
    let stats = &rec.run.stderr;
    let d = format!("{d}\n--- stats:\n{stats}");
    assert!(benign_status.is_some(), "{}: spin.py did not stop{d}", py.describe());

    // The loop kept pace: on time, nothing lost for want of reading.
    assert!(
        elapsed < Duration::from_secs(DURATION_SECS + 20),
        "{}: an {DURATION_SECS} s recording took {elapsed:?}{d}",
        py.describe()
    );
    assert_eq!(ring_buffer_losses(stats), Some(0), "{}: samples lost in the ring buffer{d}", py.describe());

    let outcomes = outcomes_by_pid(stats);
    let mut summary = Vec::new();
    for (scenario, expected, w) in &forgers {
        let counts = outcomes.get(&w.pid).cloned().unwrap_or_default();
        let total: u64 = counts.values().sum();
        let hit = counts.get(*expected).copied().unwrap_or(0);
        let ok = counts.get("ok").copied().unwrap_or(0);
        summary.push(format!("{scenario} {hit}/{total}"));
        assert!(total >= 5, "{} {scenario}: only {total} samples{d}", py.describe());
        assert!(
            hit as f64 >= 0.8 * total as f64,
            "{} {scenario}: {hit} of {total} samples counted as `{expected}`: {counts:?}{d}",
            py.describe()
        );
        let accounted = if *expected == "ok" { hit } else { hit + ok };
        assert_eq!(accounted, total, "{} {scenario}: unexpected outcomes {counts:?}{d}", py.describe());
        // Whatever became a stack names only functions the process runs.
        let mine = rec.profile.for_pid(w.pid);
        for s in &mine.stacks {
            for f in s.python_frames() {
                assert!(
                    FORGER_FUNCTIONS.contains(&f.name.as_str()),
                    "{} {scenario}: a stack shows `{}`, which the process never ran: {:?}{d}",
                    py.describe(),
                    f.name,
                    s.frames
                );
            }
        }
        if *expected == "ok" {
            let leaf = mine.with_leaf("forged_target");
            assert!(leaf as f64 >= 0.8 * total as f64, "{} {scenario}: {leaf} of {total} in forged_target{d}", py.describe());
        }
    }

    // The benign process: its samples, with its own names.
    let cpu = cpu_after - cpu_before;
    let expected = cpu * RATE as f64;
    let mine = rec.profile.for_pid(benign.pid);
    let right = mine.with_leaf("leaf_blue");
    note(format!(
        "{}: benign {right} samples in leaf_blue of {} ({:.0} expected from {cpu:.2} s CPU in a window of sampling; the processes were inspected {:.2} s after the perf events opened); forged: {}",
        py.describe(),
        mine.total(),
        expected,
        inspecting.as_secs_f64(),
        summary.join(", ")
    ));
    assert!(expected >= 100.0, "{}: the benign process ran only {cpu:.2} s of CPU{d}", py.describe());
    assert!(
        right as f64 >= 0.9 * expected,
        "{}: the benign process kept {right} samples of {expected:.0} expected{d}",
        py.describe()
    );
    assert!(right as f64 >= 0.99 * mine.total() as f64, "{}: benign samples with wrong names{d}", py.describe());
}

#[test]
fn forged_memory_3_9() {
    forged(VERSIONS[0]);
}

#[test]
fn forged_memory_3_12() {
    forged(VERSIONS[1]);
}

#[test]
fn forged_memory_sid_3_14() {
    forged(VERSIONS[2]);
}

#[test]
fn forged_memory_sid_3_15() {
    forged(VERSIONS[3]);
}
