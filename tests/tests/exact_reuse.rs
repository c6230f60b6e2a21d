//! Exact under reuse: no sample shows a stack that did not happen when code objects, frames
//! or PIDs are reused. Same-named functions from alternating files recreated at one address;
//! a reloaded module whose frames sit below the first 64; a PID handed to a successor
//! process; a small process map that frees its slots as processes exit.

use std::{
    ffi::OsString,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use pyperch_tests::*;

/// Frame-object (3.9), 3.11 interpreter frames (no `co_version`), 3.12 (`co_version`, tables)
/// and a 3.13+ static build (`_Py_DebugOffsets`).
const VERSIONS: [&str; 4] = ["3.9", "3.11", "3.12", "sid-3.14"];

/// `(file, line)` lists the workload wrote, by key.
fn lines(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v["lines"][key].as_array().map(|a| a.iter().filter_map(|l| l.as_u64()).map(|l| l as u32).collect()).unwrap_or_default()
}

fn same_name(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "same_name.py", &["120", "60", "{dir}/same_name.json"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    // The workload spins 120 x 60 ms; the recording ends when it has exited (the
    // --duration is only a backstop).
    let run = RecordRun::start(&["--pid", &pid, "--duration", "60", "--rate", "4999", "--stats"]);
    let status = w.wait_exit(Duration::from_secs(60));
    let rec = run.interrupt();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} same_name.py failed: {status:?}{d}", py.describe());
    let result = w.read_json("same_name.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    let (a_lines, b_lines) = (lines(&result, "a.py"), lines(&result, "b.py"));
    let mine = rec.profile.for_pid(w.pid);
    let mut good = 0u64;
    let mut bad = Vec::new();
    for s in &mine.stacks {
        let frames = s.python_frames();
        let Some(leaf) = frames.last().filter(|f| f.is("wrapper")) else { continue };
        let Some(caller) = frames.len().checked_sub(2).map(|i| &frames[i]) else { continue };
        let (file, valid) = if caller.is("run_a") {
            ("a.py", &a_lines)
        } else if caller.is("run_b") {
            ("b.py", &b_lines)
        } else {
            bad.push(s.frames.join(";"));
            continue;
        };
        if leaf.file == file && leaf.line.is_some_and(|l| valid.contains(&l)) {
            good += s.count;
        } else {
            bad.push(format!("{} x{}", s.frames.join(";"), s.count));
        }
    }
    note(format!(
        "{}: {good} wrapper samples attributed right, {} stacks wrong; code object reused at the other file's address in {} of {} iterations",
        py.describe(),
        bad.len(),
        result["reused"],
        result["iterations"]
    ));
    assert!(bad.is_empty(), "{}: samples show a file/line that was not running:\n{}{d}", py.describe(), bad.join("\n"));
    assert!(good >= 500, "{}: only {good} wrapper samples{d}", py.describe());
    // 3.12 (its code-object counter) and 3.14+ (its deallocation counter) let the kernel keep
    // validation words between walks: the exactness above held with that cache in use.
    if label == "3.12" || label.starts_with("sid-") {
        let cached = kernel_cached_checks(&rec.run.stderr);
        assert!(cached > 0, "{}: no code-object check came from the kernel's cache{d}", py.describe());
    }
}

/// `--stats`: validation words the kernel took from its cache.
fn kernel_cached_checks(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("kernel code-object checks: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Functions named alike from alternating files, recreated at the same address: every sample
/// of `wrapper` shows the file (and a line of it) that was running, as its caller proves.
#[test]
fn exact_reuse_same_name_alternating_files() {
    // Side by side: every check is exactness (and a minimum far below what a shared CPU gives).
    side_by_side(&VERSIONS, VERSIONS.len(), |label| same_name(label));
}

fn reload_below_64(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "reload_deep.py", &["60", "120", "{dir}/reload.json"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    // The workload runs 60 phases of 120 ms; the recording ends when it has exited (the
    // --duration is only a backstop).
    let run = RecordRun::start(&["--pid", &pid, "--duration", "60", "--rate", "1999", "--stats"]);
    let status = w.wait_exit(Duration::from_secs(60));
    let rec = run.interrupt();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} reload_deep.py failed: {status:?}{d}", py.describe());
    let result = w.read_json("reload.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    let mine = rec.profile.for_pid(w.pid);
    let mut good = 0u64;
    let mut bad = Vec::new();
    for s in &mine.stacks {
        let frames = s.python_frames();
        if !frames.last().is_some_and(|f| f.is("spin")) {
            continue;
        }
        let variant = if frames.iter().any(|f| f.is("deep_a")) {
            "a"
        } else if frames.iter().any(|f| f.is("deep_b")) {
            "b"
        } else {
            continue;
        };
        let valid = lines(&result, variant);
        // The reloaded module's frames: `entry` and 21 `descend`, over 100 frames from the leaf.
        let module: Vec<&PyFrame> = frames.iter().filter(|f| f.file.ends_with("reloaded.py")).collect();
        let leaf_distance = frames.len() - frames.iter().position(|f| f.file.ends_with("reloaded.py")).unwrap_or(0);
        let right = module.len() == 22
            && module.iter().all(|f| f.line.is_some_and(|l| valid.contains(&l)))
            && module[0].is("entry")
            && module[1..].iter().all(|f| f.is("descend"))
            && leaf_distance > 64;
        if right {
            good += s.count;
        } else {
            bad.push(format!("{} x{}", s.frames.join(";"), s.count));
        }
    }
    note(format!(
        "{}: {good} samples with the reloaded module right below depth 64, {} stacks wrong; descend reused the other variant's address in {} of {} phases",
        py.describe(),
        bad.len(),
        result["reused"],
        result["phases"]
    ));
    assert!(bad.is_empty(), "{}: samples show the other variant's module frames:\n{}{d}", py.describe(), bad.join("\n"));
    assert!(good >= 500, "{}: only {good} complete samples{d}", py.describe());
}

/// A module reloaded with alternating sources (same names and bytecode, other lines), its
/// frames below the first 64: never shown with the other variant's lines.
#[test]
fn exact_reuse_module_reload_below_64() {
    side_by_side(&VERSIONS, VERSIONS.len(), |label| reload_below_64(label));
}

/// `pyperch record ARGS -- PYTHON SCRIPT SCRIPT_ARGS`, with extra environment variables.
fn launch(py: &Python, dir: &WorkDir, args: &[&str], script: &str, script_args: &[&str], env: &[(&str, &str)]) -> Recording {
    let output: PathBuf = dir.host_path("profile.collapsed");
    let mut cmd = Command::new(pyperch_bin());
    cmd.args(["record", "--format", "collapsed", "--output"]).arg(&output).args(args).arg("--");
    cmd.args(py.argv().into_iter().map(|a: OsString| a));
    cmd.arg(dir.guest_path(script));
    cmd.args(script_args.iter().map(|a| a.replace("{dir}", &dir.guest.to_string_lossy())));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = Running::start(cmd).expect("cannot start pyperch").finish(Duration::from_secs(120));
    let collapsed = std::fs::read_to_string(&output).unwrap_or_default();
    let profile = Profile::parse(&collapsed);
    Recording { run, collapsed, profile, output }
}

fn read_json(path: PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// A process exits and a successor gets its PID: no sample of either is shown under the
/// other's label (comm `pyold` runs only `old_work`, `pynew` only `new_work`).
#[test]
fn exact_reuse_pid_reused_after_exit() {
    if !is_root() {
        skip("writing /proc/sys/kernel/ns_last_pid needs root");
        return;
    }
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10", "3.9"]) else { return };
    let dir = WorkDir::new(&py, "pid_reuse").unwrap_or_else(|e| panic!("{e:#}"));
    let rec = launch(&py, &dir, &["--rate", "4999", "--stats"], "pid_reuse.py", &["1500", "1500", "{dir}/pid.json"], &[]);
    let d = rec.diag();
    assert_eq!(rec.run.code(), Some(0), "pyperch or the workload failed{d}");
    let result = read_json(dir.host_path("pid.json"));
    let old = result["old"].as_u64().unwrap_or(0) as u32;
    let reused = result["reused"].as_bool().unwrap_or(false);
    // The promise: the successor is never sampled under the old process's label (its samples
    // are taken under its own registration, or dropped). Known gap, outside the sampling path:
    // the profile keys processes by PID, so once the successor is registered its label also
    // names the predecessor's samples in the output; that is reported, not asserted.
    let mut wrong = Vec::new();
    let mut relabeled = 0u64;
    let (mut old_ok, mut new_ok) = (0u64, 0u64);
    for s in &rec.profile.stacks {
        let comm = s.comm().unwrap_or("");
        let old_work = s.has_function("old_work");
        let new_work = s.has_function("new_work");
        match comm {
            "pyold" if new_work => wrong.push(s.frames.join(";")),
            "pyold" if old_work => old_ok += s.count,
            "pynew" if new_work => new_ok += s.count,
            "pynew" if old_work && reused => relabeled += s.count,
            "pynew" if old_work => wrong.push(s.frames.join(";")),
            _ if new_work => wrong.push(s.frames.join(";")),
            _ => {}
        }
    }
    note(format!(
        "{}: PID {old} {} (after {} tries); {new_ok} samples of pynew, none under another label: {}; {old_ok} of pyold under its label, {relabeled} under the successor's (known gap: labels are per PID in the profile)",
        py.describe(),
        if reused { "reused by the successor" } else { "NOT reused (other processes took it)" },
        result["tries"],
        wrong.is_empty()
    ));
    assert!(wrong.is_empty(), "samples under the wrong process label:\n{}{d}", wrong.join("\n"));
    assert!(new_ok >= 100, "the successor should be sampled ({new_ok}){d}");
    assert!(old_ok + relabeled >= 100, "the first process should be sampled ({old_ok} + {relabeled}){d}");
    if !reused {
        skip("the successor did not get the same PID; only the labels were checked");
    }
}

/// `(refused, freed)` from the `--stats` line about the kernel's process map.
fn map_stats(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr.lines().find(|l| l.contains("kernel process map:"))?;
    let numbers: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    Some((*numbers.first()?, *numbers.get(1)?))
}

/// With 4 slots (the driver and 3 children), 8 waves of 3 short-lived children are all
/// sampled (the kernel frees each slot when its process exits), and 6 children at once are
/// all sampled too: the 3 refused at first (counted) are registered once slots free up.
#[test]
fn exact_reuse_process_map_frees_slots() {
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10", "3.9"]) else { return };
    let dir = WorkDir::new(&py, "slots").unwrap_or_else(|e| panic!("{e:#}"));
    let rec = launch(
        &py,
        &dir,
        &["--rate", "999", "--stats"],
        "slots.py",
        &["8", "3", "700", "6", "4500", "{dir}/slots.json"],
        &[("PYPERCH_PROCESS_SLOTS", "4")],
    );
    let d = rec.diag();
    assert_eq!(rec.run.code(), Some(0), "pyperch or the workload failed{d}");
    let result = read_json(dir.host_path("slots.json"));
    let (refused, freed) = map_stats(&rec.run.stderr).unwrap_or_else(|| panic!("no process-map line in --stats{d}"));
    let missing: Vec<String> = (0..8)
        .map(|w| format!("wave_{w}"))
        .chain((0..6).map(|k| format!("late_{k}")))
        .filter(|f| rec.profile.with_function(f) == 0)
        .collect();
    note(format!(
        "{}: {} children; {refused} registrations refused (map full), {freed} slots freed by exits; not sampled: {missing:?}",
        py.describe(),
        result["children"]
    ));
    assert!(missing.is_empty(), "children never sampled: {missing:?}{d}");
    assert!(refused >= 1, "6 children at once should not all fit in 4 slots{d}");
    // Every registered child freed its slot by exiting (8 waves of 3, and the late ones).
    assert!(freed >= 24, "only {freed} slots freed by exits{d}");
}
