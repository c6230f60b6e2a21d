//! Free-threaded CPython (PEP 703): interpreters built by hand, taken from
//! `PYPERCH_FT_PYTHON` (3.14t); each test says plainly that it did not run where it is unset.
//!
//! What issue #30 asks of a 3.14t, each case named: `list` shows the build; four threads
//! spinning in parallel on two CPUs get each its own CPU share within 3 points, every edge
//! real, every line one the function has (threads but the first run their own copy of the
//! bytecode); two chains alternating at the same frame addresses never mix; at depth 300
//! every stack shown is whole; `--mode gil` on a process without a GIL says so in one
//! sentence, and with `PYTHON_GIL=1` keeps the holder's samples as usual.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use pyperch_tests::*;

const SPINNERS: [&str; 4] = ["spin_0", "spin_1", "spin_2", "spin_3"];

/// Caller → callee edges `parallel_threads.py` has among its own functions.
const EDGES: [(&str, &str); 14] = [
    ("run", "spin_0"),
    ("run", "spin_1"),
    ("run", "spin_2"),
    ("run", "spin_3"),
    ("spin_0", "recurse"),
    ("spin_1", "recurse"),
    ("spin_2", "recurse"),
    ("spin_3", "recurse"),
    ("recurse", "recurse"),
    ("recurse", "spin"),
    ("spin", "shared_leaf"),
    ("spin", "alpha_1"),
    ("alpha_1", "alpha_2"),
    ("alpha_2", "shared_leaf"),
];
const MORE_EDGES: [(&str, &str); 3] = [("spin", "beta_1"), ("beta_1", "beta_2"), ("beta_2", "shared_leaf")];

/// The interpreter's own version string with its build's `t` (`3.14.7t`).
fn version_label(py: &Python) -> String {
    let out = py
        .command()
        .args(["-c", "import sys; v = sys.version_info; print(f'{v.major}.{v.minor}.{v.micro}t')"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", py.describe()));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `pyperch list` names a running 3.14t with its build (`3.14.7t`) and profiles it.
#[test]
fn free_threaded_list_shows_the_build() {
    let Some(py) = free_threaded_python("PYPERCH_FT_PYTHON", 14) else { return };
    let mut w = Workload::spawn(&py, "parallel_threads.py", &["{dir}/result.json", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let list = pyperch(&["list"], Duration::from_secs(60));
    w.terminate();
    let pid = w.pid.to_string();
    let row = list.stdout.lines().find(|l| l.split_whitespace().next() == Some(pid.as_str())).map(str::to_string);
    note(format!("list: {row:?}"));
    let row = row.unwrap_or_else(|| panic!("pid {pid} is not listed:\n{}\n{}", list.stdout, list.stderr));
    let label = version_label(&py);
    assert!(row.split_whitespace().any(|f| f == label), "the row does not show {label}: {row}");
    assert!(!row.contains("not supported"), "list row: {row}");
}

/// One recording of `parallel_threads.py` (depth `depth`, `--threads`, 6 s at `rate`):
/// the recording, the workload (ended) and what it wrote.
fn parallel(py: &Python, depth: usize, rate: &str) -> (Recording, Workload, serde_json::Value) {
    let depth_arg = depth.to_string();
    let mut w = Workload::spawn(py, "parallel_threads.py", &["{dir}/result.json", "120", &depth_arg])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "6", "--rate", rate, "--threads", "--stats"]);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} parallel_threads.py failed: {status:?}{d}", py.describe());
    let result = w.read_json("result.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    (rec, w, result)
}

/// Every frame of the workload's own functions (those with lines in `result`): on one of
/// its function's lines, called by a caller it has; and no stack mixes the alpha and beta
/// chains. Returns (frames checked, frames without a line).
fn check_stacks(profile: &Profile, result: &serde_json::Value, d: &str) -> (u64, u64) {
    let lines: BTreeMap<String, BTreeSet<u32>> = result["lines"]
        .as_object()
        .expect("lines")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_array().expect("list").iter().filter_map(|l| l.as_u64()).map(|l| l as u32).collect()))
        .collect();
    let edges: BTreeSet<(&str, &str)> = EDGES.iter().chain(MORE_EDGES.iter()).copied().collect();
    let (mut frames, mut lineless) = (0, 0);
    for s in &profile.stacks {
        let python = s.python_frames();
        let ours: Vec<&PyFrame> = python.iter().filter(|f| f.file.ends_with("parallel_threads.py")).collect();
        let alpha = ours.iter().any(|f| f.name.starts_with("alpha_"));
        let beta = ours.iter().any(|f| f.name.starts_with("beta_"));
        assert!(!(alpha && beta), "a stack mixes the alpha and beta chains (it never happened): {}{d}", s.frames.join(";"));
        for pair in ours.windows(2) {
            let edge = (pair[0].name.as_str(), pair[1].name.as_str());
            assert!(edges.contains(&edge), "{} calls {}: an edge the program does not have, in {}{d}", edge.0, edge.1, s.frames.join(";"));
        }
        for f in &ours {
            let Some(known) = lines.get(&f.name) else { continue };
            frames += s.count;
            match f.line {
                Some(line) => assert!(known.contains(&line), "{} on line {line}, which it does not have ({known:?}): {}{d}", f.name, s.frames.join(";")),
                None => lineless += s.count,
            }
        }
    }
    (frames, lineless)
}

/// Four threads spinning in parallel on two CPUs (each running its own copy of the shared
/// functions' bytecode): each thread's share of samples within 3 points of its share of CPU
/// time, each under its own thread, every edge real and every line right, alpha and beta never
/// mixed.
#[test]
fn free_threaded_parallel_threads_exact() {
    let Some(py) = free_threaded_python("PYPERCH_FT_PYTHON", 14) else { return };
    let (rec, w, result) = parallel(&py, 0, "499");
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let native: BTreeMap<String, u32> = w.ready_fields().into_iter().filter_map(|(k, v)| Some((k, v.parse().ok()?))).collect();
    let (frames, lineless) = check_stacks(&mine, &result, &d);
    let cpu: BTreeMap<String, f64> = SPINNERS.iter().map(|s| (s.to_string(), json_f64(&result, &["cpu", s]).unwrap_or(0.0))).collect();
    let cpu_total: f64 = cpu.values().sum();
    let samples: BTreeMap<&str, u64> = SPINNERS.iter().map(|s| (*s, mine.count(|st| st.has_function(s)))).collect();
    let sample_total: u64 = samples.values().sum();
    let mut shares = Vec::new();
    for spinner in SPINNERS {
        let own = cpu[spinner] / cpu_total.max(1e-9);
        let profiled = samples[spinner] as f64 / sample_total.max(1) as f64;
        shares.push(format!("{spinner} {:.1} % profiled vs {:.1} % CPU", profiled * 100.0, own * 100.0));
        let threads = mine.threads_of(spinner);
        assert_eq!(threads.keys().copied().collect::<Vec<_>>(), vec![native[spinner]], "{spinner} is not (only) under its thread {}{d}", native[spinner]);
        assert!((profiled - own).abs() <= 0.03, "{spinner}: {:.1} % of samples vs {:.1} % of CPU time{d}", profiled * 100.0, own * 100.0);
    }
    let stats = &rec.run.stderr;
    let rebased = stats.lines().find(|l| l.contains("bytecode copies")).unwrap_or("(no line on threads' bytecode copies)").trim().to_string();
    note(format!("{}: {sample_total} samples of the spinners; {}; {frames} frames checked, {lineless} without a line; {rebased}", py.describe(), shares.join(", ")));
    assert!(sample_total >= 2000, "only {sample_total} samples of the four spinning threads{d}");
    assert!(lineless * 100 <= frames, "{lineless} of {frames} frames without a line{d}");
    assert!(stats.contains("bytecode copies"), "no frame ran a thread's own bytecode copy: the case is not exercised{d}");
}

/// Depth 300 in each of the four threads: every stack shown is whole (`run`, the spinner,
/// 301 `recurse` frames, `spin`, the leaf chain), and at most 1 % of samples dropped.
#[test]
fn free_threaded_depth_300_whole() {
    let Some(py) = free_threaded_python("PYPERCH_FT_PYTHON", 14) else { return };
    let (rec, w, result) = parallel(&py, 300, "199");
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    check_stacks(&mine, &result, &d);
    let spinning = mine.filter(|s| SPINNERS.iter().any(|f| s.has_function(f)));
    let partial: Vec<String> = spinning
        .stacks
        .iter()
        .filter(|s| s.python_frames().iter().filter(|f| f.is("recurse")).count() != 301 || !s.has_function("spin"))
        .take(5)
        .map(|s| s.frames.join(";"))
        .collect();
    let total = spinning.total();
    note(format!("{}: {total} samples at depth 300", py.describe()));
    assert!(total >= 600, "only {total} samples of the spinning threads{d}");
    assert!(partial.is_empty(), "stacks shown that are not whole:\n{}{d}", partial.join("\n"));
}

/// `--mode gil` on a 3.14t without a GIL says so in one sentence (and keeps nothing of it);
/// with `PYTHON_GIL=1` the process has a GIL and the holder's samples are kept as usual.
#[test]
fn free_threaded_gil_mode() {
    let Some(py) = free_threaded_python("PYPERCH_FT_PYTHON", 14) else { return };
    let mut w = Workload::spawn(&py, "parallel_threads.py", &["{dir}/result.json", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "2", "--mode", "gil", "--stats"]);
    w.terminate();
    let d = rec.diag_pid(w.pid);
    let said = rec.run.stderr.lines().find(|l| l.contains("runs without a GIL")).map(str::to_string);
    note(format!("without a GIL: {said:?}, {} samples kept", rec.profile.for_pid(w.pid).total()));
    assert!(said.is_some(), "no sentence about the missing GIL{d}");
    assert_eq!(rec.profile.for_pid(w.pid).total(), 0, "samples kept though no thread holds a GIL{d}");

    let mut w = Workload::spawn_env(&py, "parallel_threads.py", &["{dir}/result.json", "60"], &[("PYTHON_GIL", "1")])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "3", "--rate", "499", "--mode", "gil", "--threads", "--stats"]);
    w.terminate();
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let kept = mine.count(|s| SPINNERS.iter().any(|f| s.has_function(f)));
    let stats = rec.run.stderr.lines().find(|l| l.contains("kernel --mode gil")).unwrap_or("").trim().to_string();
    note(format!("PYTHON_GIL=1: {kept} samples of the spinners kept; {stats}"));
    assert!(!rec.run.stderr.contains("runs without a GIL"), "a process with a GIL was said to have none{d}");
    // Four threads share one GIL on two CPUs: about half of the CPU samples hold it.
    assert!(kept >= 200, "only {kept} samples kept under PYTHON_GIL=1{d}");
    assert!(stats.contains("not holding the GIL"), "no samples dropped as not holding the GIL{d}");
}
