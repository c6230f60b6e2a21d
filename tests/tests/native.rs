//! `--native` and `--kernel`: native frames in place between the Python frames, kernel frames
//! on top, and the Python frames unchanged.
//!
//! workloads/native.py runs one of three workloads (ctypes with workloads/native_lib.c built
//! here, zlib + sorted, a /dev/zero reader); split.py (see versions.rs) checks that the Python
//! frames are the same validated ones as without `--native`.

use std::{fs, path::PathBuf, process::Command, time::Duration};

use pyperch_tests::*;

const LIBRARY: &str = "libpyperch_native.so";

/// Compiles native_lib.c into a directory the interpreter sees; returns the host directory
/// (removed by the caller) and the library's path as the interpreter sees it.
fn build_library(py: &Python) -> Result<(PathBuf, String), String> {
    let cc = find_program("cc").or_else(|| find_program("gcc")).ok_or("no C compiler (cc or gcc) on PATH")?;
    let name = format!("native-lib-{}-{}", std::process::id(), py.label);
    let guest = PathBuf::from("/tmp/pyperch-tests").join(&name);
    let host = match &py.rootfs {
        Some(root) => root.join(guest.strip_prefix("/").unwrap()),
        None => guest.clone(),
    };
    fs::create_dir_all(&host).map_err(|e| format!("cannot create {}: {e}", host.display()))?;
    let status = Command::new(&cc)
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(host.join(LIBRARY))
        .arg(workload_source("native_lib.c"))
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cc.display()))?;
    if !status.success() {
        return Err(format!("{} failed to compile native_lib.c ({})", cc.display(), describe_status(status)));
    }
    Ok((host, guest.join(LIBRARY).to_string_lossy().into_owned()))
}

/// Source files of native frames that have DWARF line numbers (`function (file.c:line)`).
const NATIVE_SOURCES: [&str; 8] = [".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".S", ".rs"];

/// A Python frame: `function (file.py:line)`. Native frames carry no line, or one in a
/// native source file (from DWARF).
fn is_python(frame: &str) -> bool {
    let f = PyFrame::parse(frame);
    f.line.is_some() && !NATIVE_SOURCES.iter().any(|ext| f.file.ends_with(ext))
}

/// The C function `func` of native_lib.c (built with -g), named with its source line.
fn is_c_function(frame: &str, func: &str) -> bool {
    let f = PyFrame::parse(frame);
    f.name == func && f.file.ends_with("native_lib.c") && f.line.is_some()
}

/// Index of the first Python frame named `func` in the stack's frames.
fn python_index(stack: &Stack, func: &str) -> Option<usize> {
    stack.frames.iter().position(|f| is_python(f) && PyFrame::parse(f).is(func))
}

/// Records `pid` with `flags` for `seconds` at 199 Hz.
fn record_native(pid: u32, flags: &[&str], seconds: &str) -> Recording {
    let pid = pid.to_string();
    let mut args = vec!["--pid", &pid, "--duration", seconds, "--rate", "199", "--stats"];
    args.extend_from_slice(flags);
    record(&args)
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

/// The C functions of a ctypes library: the CPU-bound one is the leaf right below the Python
/// line that called it; the callback's Python frames sit above the C function that called
/// them, which sits above the Python caller.
fn c_frames(label: &str) {
    let Some(py) = python(label) else { return };
    c_frames_on(&py);
}

/// Debian's own python3.11 (a static, stripped executable: `.dynsym` and `.eh_frame` only).
fn debian_3_11() -> Option<Python> {
    let exe = PathBuf::from("/usr/bin/python3.11");
    if !exe.is_file() {
        skip("Debian's python3.11 (/usr/bin/python3.11) is not installed");
        return None;
    }
    Some(Python { label: "debian-3.11".into(), major: 3, minor: 11, exe, rootfs: None })
}

fn c_frames_on(py: &Python) {
    let py = py.clone();
    let (lib_dir, lib) = match build_library(&py) {
        Ok(built) => built,
        Err(reason) => {
            skip(format!("{}: {reason}", py.describe()));
            return;
        }
    };
    let mut w = Workload::spawn(&py, "native.py", &["ctypes", "{dir}/out.json", "120", &lib]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record_native(w.pid, &["--native"], "5");
    w.terminate();
    let _ = fs::remove_dir_all(&lib_dir);
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    // Named `function (native_lib.c:LINE)` from the library's DWARF.
    let spin_frame = "pyperch_spin (native_lib.c:LINE)";
    let callback_frame = "pyperch_callback (native_lib.c:LINE)";

    let spin_total = mine.count(|s| python_index(s, "c_spin_caller").is_some());
    let spin_placed = mine.count(|s| {
        let Some(caller) = python_index(s, "c_spin_caller") else { return false };
        // The C function is the leaf, below the caller, with no Python frame in between.
        s.frames.last().is_some_and(|f| is_c_function(f, "pyperch_spin")) && !s.frames[caller + 1..].iter().any(|f| is_python(f))
    });
    let cb_total = mine.count(|s| python_index(s, "py_callback").is_some());
    let cb_placed = mine.count(|s| {
        let (Some(caller), Some(callback)) = (python_index(s, "callback_caller"), python_index(s, "py_callback")) else {
            return false;
        };
        s.frames.iter().position(|f| is_c_function(f, "pyperch_callback")).is_some_and(|c| caller < c && c < callback)
    });
    let unmerged = mine.count(|s| s.frames.iter().any(|f| f == "<unmerged native>"));
    note(format!(
        "{}: {} samples; pyperch_spin placed in {spin_placed} of {spin_total}, pyperch_callback between the Python frames in {cb_placed} of {cb_total}; {unmerged} unmerged",
        py.describe(),
        mine.total()
    ));
    assert!(spin_total >= 100, "{}: only {spin_total} samples in c_spin_caller{d}", py.describe());
    assert!(cb_total >= 10, "{}: only {cb_total} samples in py_callback{d}", py.describe());
    assert!(
        share(spin_placed, spin_total) >= 0.8,
        "{}: `{spin_frame}` is the leaf under c_spin_caller in only {spin_placed} of {spin_total} samples (want >= 80 %){d}",
        py.describe()
    );
    assert!(
        share(cb_placed, cb_total) >= 0.8,
        "{}: `{callback_frame}` lies between callback_caller and py_callback in only {cb_placed} of {cb_total} samples (want >= 80 %){d}",
        py.describe()
    );
    assert!(share(unmerged, mine.total()) <= 0.05, "{}: {unmerged} of {} samples unmerged{d}", py.describe(), mine.total());
}

#[test]
fn native_c_frames_3_9() {
    c_frames("3.9");
}

/// 3.11 merges by the frames' `is_entry` flags.
#[test]
fn native_c_frames_3_11() {
    c_frames("3.11");
}

#[test]
fn native_c_frames_debian_3_11() {
    if let Some(py) = debian_3_11() {
        c_frames_on(&py);
    }
}

#[test]
fn native_c_frames_3_12() {
    c_frames("3.12");
}

#[test]
fn native_c_frames_3_13() {
    c_frames("3.13");
}

#[test]
fn native_c_frames_sid_3_15() {
    c_frames("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn native_c_frames_ft_3_14() {
    c_frames(FT_3_14);
}

/// zlib.compress shows libz under the calling line; sorted(key=f) shows the C sort between
/// the caller and f.
fn zlib_and_sorted(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "native.py", &["zlib", "{dir}/out.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record_native(w.pid, &["--native"], "5");
    w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);

    let last_python = |s: &Stack| s.frames.iter().rposition(|f| is_python(f));
    let zlib_total = mine.count(|s| last_python(s).is_some_and(|i| PyFrame::parse(&s.frames[i]).is("zlib_caller")));
    let zlib_placed = mine.count(|s| {
        let Some(i) = last_python(s) else { return false };
        PyFrame::parse(&s.frames[i]).is("zlib_caller") && s.frames[i + 1..].iter().any(|f| f.contains("(libz.so"))
    });
    let key_total = mine.count(|s| python_index(s, "sort_key").is_some());
    let key_placed = mine.count(|s| {
        let (Some(caller), Some(key)) = (python_index(s, "sort_caller"), python_index(s, "sort_key")) else { return false };
        caller < key && s.frames[caller + 1..key].iter().any(|f| !is_python(f))
    });
    note(format!(
        "{}: libz under zlib_caller in {zlib_placed} of {zlib_total} samples; a native frame between sort_caller and sort_key in {key_placed} of {key_total}",
        py.describe()
    ));
    assert!(zlib_total >= 50, "{}: only {zlib_total} samples ending in zlib_caller{d}", py.describe());
    assert!(key_total >= 10, "{}: only {key_total} samples in sort_key{d}", py.describe());
    assert!(
        share(zlib_placed, zlib_total) >= 0.8,
        "{}: a libz frame follows zlib_caller in only {zlib_placed} of {zlib_total} samples (want >= 80 %){d}",
        py.describe()
    );
    assert!(
        share(key_placed, key_total) >= 0.8,
        "{}: a native frame lies between sort_caller and sort_key in only {key_placed} of {key_total} samples (want >= 80 %){d}",
        py.describe()
    );
}

#[test]
fn native_zlib_and_sorted_3_11() {
    zlib_and_sorted("3.11");
}

#[test]
fn native_zlib_and_sorted_3_12() {
    zlib_and_sorted("3.12");
}

#[test]
fn native_zlib_and_sorted_sid_3_15() {
    zlib_and_sorted("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn native_zlib_and_sorted_ft_3_14() {
    zlib_and_sorted(FT_3_14);
}

fn signal_workload(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid we spawned and a valid signal number has no memory effects.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// A thread reading /dev/zero: with --kernel, the share of its samples with kernel frames
/// agrees within 5 points with its system-time share, measured by the workload itself over
/// the same window.
fn kernel_dev_zero(label: &str, flags: &[&str]) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "native.py", &["zero", "{dir}/zero.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    // About 3000 samples: under 1 point of sampling noise against the 5-point bar. The workload measures its times between SIGUSR1 and SIGUSR2, sent when sampling
    // has begun and when the recording's duration is over, so both cover the same window.
    const SECONDS: u64 = 6;
    let pid = w.pid.to_string();
    let seconds = SECONDS.to_string();
    let mut args = vec!["--pid", &pid, "--duration", &seconds, "--rate", "499", "--stats"];
    args.extend_from_slice(flags);
    let run = RecordRun::start(&args);
    let sampling = run.wait_until_sampling(Duration::from_secs(60));
    signal_workload(w.pid, libc::SIGUSR1);
    std::thread::sleep(Duration::from_secs(SECONDS));
    signal_workload(w.pid, libc::SIGUSR2);
    let rec = run.finish();
    let status = w.terminate();
    assert!(sampling, "{}: pyperch did not start sampling within 60 s{}", py.describe(), rec.diag());
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} native.py zero did not exit cleanly: {status:?}{d}", py.describe());
    let measured = w.read_json("zero.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    assert!(measured.get("windowed").and_then(|v| v.as_bool()) == Some(true), "{}: the workload did not see the window's start signal{d}", py.describe());
    let utime = json_f64(&measured, &["utime"]).unwrap();
    let stime = json_f64(&measured, &["stime"]).unwrap();
    let mine = rec.profile.for_pid(w.pid);
    let reader = mine.filter(|s| python_index(s, "zero_reader").is_some());
    let total = reader.total();
    let kernel = reader.count(|s| s.frames.iter().any(|f| f.ends_with("_[k]")));
    let named = reader.count(|s| s.frames.iter().any(|f| f.ends_with("_[k]") && !f.starts_with('<')));
    let profiled = share(kernel, total);
    let own = stime / (utime + stime);
    let cpu = json_f64(&measured, &["cpu"]).unwrap();
    let in_read = json_f64(&measured, &["in_read"]).unwrap();
    note(format!(
        "{}: {total} samples of zero_reader, {kernel} with kernel frames ({:.1} %), {named} named; system-time share {:.1} % ({stime:.2} of {:.2} s); in read() {:.1} % ({in_read:.2} of {cpu:.2} s)",
        py.describe(),
        profiled * 100.0,
        own * 100.0,
        utime + stime,
        in_read / cpu * 100.0,
    ));
    assert!(total >= 200, "{}: only {total} samples of zero_reader{d}", py.describe());
    assert!(named * 10 >= kernel * 9, "{}: {named} of {kernel} kernel stacks have named frames{d}", py.describe());
    // The system-time share compared is the exact one (scheduler-clock CPU time spent inside
    // read(), nearly all of it in the kernel): the kernel's utime/stime split is sampled at
    // the 250 Hz tick, about 1 point of noise unloaded but 5 to 10 points on a loaded
    // machine where the thread gets a fraction of a CPU (both are printed above).
    let exact = in_read / cpu;
    assert!(
        (profiled - exact).abs() <= 0.05,
        "{}: kernel frames in {:.1} % of zero_reader's samples, but its system time is {:.1} % of its CPU time; want within 5 points{d}",
        py.describe(),
        profiled * 100.0,
        exact * 100.0
    );
}

#[test]
fn kernel_frames_dev_zero_3_12() {
    kernel_dev_zero("3.12", &["--kernel"]);
}

#[test]
fn kernel_frames_dev_zero_with_native_sid_3_15() {
    kernel_dev_zero("sid-3.15", &["--kernel", "--native"]);
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn kernel_frames_dev_zero_with_native_ft_3_14() {
    kernel_dev_zero(FT_3_14, &["--kernel", "--native"]);
}

/// What the split and deep workloads must show with --native: native frames in at least 90 %
/// of the samples, the Python frames `leaf` accepts (exactly the workload's chain) in at least
/// 95 %, and the leaf_a/leaf_b split within 5 points of the workload's own measurement.
fn check_leaf_split(
    py: &Python,
    mine: &Profile,
    leaf: impl Fn(&Stack) -> Option<&'static str>,
    (a_secs, b_secs): (f64, f64),
    what: &str,
    d: &str,
) {
    let total = mine.total();
    let a = mine.count(|s| leaf(s) == Some("leaf_a"));
    let b = mine.count(|s| leaf(s) == Some("leaf_b"));
    let native = mine.count(|s| s.frames.iter().skip(1).any(|f| !is_python(f)));
    let complete = share(a + b, total);
    let profiled = share(a, a + b);
    let own = a_secs / (a_secs + b_secs);
    note(format!(
        "{} {what}: {total} samples, {native} with native frames, {:.1} % exact; leaf_a {:.1} % profiled vs {:.1} % measured",
        py.describe(),
        complete * 100.0,
        profiled * 100.0,
        own * 100.0
    ));
    assert!(total >= 100, "{}: only {total} samples{d}", py.describe());
    assert!(native * 10 >= total * 9, "{}: only {native} of {total} samples carry native frames{d}", py.describe());
    assert!(complete >= 0.95, "{}: only {:.1} % of samples exact ({what}){d}", py.describe(), complete * 100.0);
    assert!(
        (profiled - own).abs() <= 0.05,
        "{}: leaf_a share {:.1} % vs the workload's own {:.1} %; want within 5 points{d}",
        py.describe(),
        profiled * 100.0,
        own * 100.0
    );
}

/// With --native the Python frames are the same validated ones: split.py's chain is complete
/// in the same share of samples and the leaf split matches the workload's own measurement.
fn python_frames_unchanged(label: &str) {
    const CHAIN: usize = 28;
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "split.py", &["{dir}/split.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record_native(w.pid, &["--native"], "5");
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} split.py did not exit cleanly: {status:?}{d}", py.describe());
    let measured = w.read_json("split.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    let a_secs = json_f64(&measured, &["leaf_a"]).unwrap();
    let b_secs = json_f64(&measured, &["leaf_b"]).unwrap();
    // The Python frames alone, in order; native frames must sit only around and between them.
    let leaf = |s: &Stack| -> Option<&'static str> {
        let frames: Vec<PyFrame> = s.frames.iter().filter(|f| is_python(f)).map(|f| PyFrame::parse(f)).collect();
        let start = frames.iter().position(|f| f.is("chain_00"))?;
        if frames.len() != start + CHAIN + 1 {
            return None;
        }
        for (k, f) in frames[start..start + CHAIN].iter().enumerate() {
            if !f.is(&format!("chain_{k:02}")) || !f.file.ends_with("split.py") {
                return None;
            }
        }
        ["leaf_a", "leaf_b"].into_iter().find(|name| frames[start + CHAIN].is(name))
    };
    check_leaf_split(&py, &rec.profile.for_pid(w.pid), leaf, (a_secs, b_secs), "full chain", &d);
}

#[test]
fn native_python_frames_unchanged_3_9() {
    python_frames_unchanged("3.9");
}

#[test]
fn native_python_frames_unchanged_3_12() {
    python_frames_unchanged("3.12");
}

#[test]
fn native_python_frames_unchanged_sid_3_15() {
    python_frames_unchanged("sid-3.15");
}

/// Deep recursion (300 Python frames, beyond the kernel's 64 full frames) with --native: the
/// Python frames are exactly those of deep.py, completed and validated as without --native,
/// and the leaf split matches the workload's own measurement. On 3.9 (a C stack frame per
/// Python call) the native stack ends in `<truncated native>` long before the bottom.
fn deep_python_frames_unchanged(label: &str) {
    const DEPTH: usize = 300;
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "deep.py", &["300", "{dir}/deep.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record_native(w.pid, &["--native"], "5");
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} deep.py failed: {status:?}{d}", py.describe());
    let measured = w.read_json("deep.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    let a_secs = json_f64(&measured, &["leaf_a"]).unwrap();
    let b_secs = json_f64(&measured, &["leaf_b"]).unwrap();
    let leaf = |s: &Stack| -> Option<&'static str> {
        let frames: Vec<PyFrame> = s.frames.iter().filter(|f| is_python(f)).map(|f| PyFrame::parse(f)).collect();
        if frames.len() != DEPTH + 4 || !frames[0].is("<module>") || !frames[DEPTH + 2].is("hot_loop") {
            return None;
        }
        if !frames[1..DEPTH + 2].iter().all(|f| f.is("recurse")) {
            return None;
        }
        ["leaf_a", "leaf_b"].into_iter().find(|name| frames[DEPTH + 3].is(name))
    };
    check_leaf_split(&py, &rec.profile.for_pid(w.pid), leaf, (a_secs, b_secs), &format!("depth {DEPTH}"), &d);
}

#[test]
fn native_deep_python_frames_unchanged_3_9() {
    deep_python_frames_unchanged("3.9");
}

#[test]
fn native_deep_python_frames_unchanged_3_12() {
    deep_python_frames_unchanged("3.12");
}

#[test]
fn native_deep_python_frames_unchanged_sid_3_15() {
    deep_python_frames_unchanged("sid-3.15");
}

/// `--format pprof` with `--native --kernel --kernel-addresses`, read by `go tool pprof
/// -raw`: kernel frames carry an address in the `[kernel]` mapping (only when asked: see
/// hostile_native.rs for the default, without), native frames an address in the mapping
/// of their file (full path and build id).
#[test]
fn native_pprof_mappings_go_tool_pprof_3_12() {
    let Some(go) = find_program("go") else {
        skip("go is not installed (`cargo xtask test` installs Debian's golang-go)");
        return;
    };
    let Some(py) = python("3.12") else { return };
    let mut w = Workload::spawn(&py, "native.py", &["zero", "{dir}/zero.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let dir = std::env::temp_dir().join("pyperch-tests").join(format!("native-pprof-{}", random_hex(8)));
    fs::create_dir_all(&dir).unwrap();
    let out = dir.join("profile.pb.gz");
    let pid = w.pid.to_string();
    let run = pyperch(
        &["record", "--pid", &pid, "--duration", "3", "--rate", "199", "--native", "--kernel", "--kernel-addresses", "--format", "pprof", "--output", out.to_str().unwrap()],
        std::time::Duration::from_secs(90),
    );
    w.terminate();
    let d = run.diag();
    assert!(run.success(), "pyperch record failed{d}");
    let printed = Command::new(&go)
        .args(["tool", "pprof", "-raw"])
        .arg(&out)
        .env("HOME", &dir)
        .env("GOCACHE", dir.join("cache"))
        .env("PPROF_TMPDIR", &dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} tool pprof: {e}", go.display()));
    let _ = fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&printed.stdout).into_owned();
    let d = format!("{d}\n--- go tool pprof -raw:\n{text}\n--- its stderr:\n{}", String::from_utf8_lossy(&printed.stderr));
    assert!(printed.status.success(), "go tool pprof cannot read the file{d}");
    // `Locations`: `ID: 0xADDRESS M=MAPPING function file:line ...`;
    // `Mappings`: `ID: 0xSTART/0xLIMIT/0xOFFSET FILE BUILDID [FN]`.
    let mut section = "";
    let mut locations: Vec<(u64, u64, String)> = Vec::new();
    let mut mappings: std::collections::HashMap<u64, (String, String)> = std::collections::HashMap::new();
    for line in text.lines().map(str::trim) {
        if line == "Locations" || line == "Mappings" {
            section = if line == "Locations" { "l" } else { "m" };
            continue;
        }
        let Some((id, rest)) = line.split_once(": ") else { continue };
        let Ok(id) = id.trim().parse::<u64>() else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        match section {
            "l" if words.len() >= 3 && words[1].starts_with("M=") => {
                let address = u64::from_str_radix(words[0].trim_start_matches("0x"), 16).unwrap_or(0);
                let mapping = words[1][2..].parse().unwrap_or(0);
                locations.push((address, mapping, words[2].to_string()));
            }
            "m" if words.len() >= 2 => {
                let build_id = if words.len() >= 3 && words[2] != "[FN]" { words[2].to_string() } else { String::new() };
                mappings.insert(id, (words[1].to_string(), build_id));
            }
            _ => {}
        }
    }
    let kernel = locations
        .iter()
        .find(|(address, m, f)| f.ends_with("_[k]") && *address != 0 && mappings.get(m).is_some_and(|(file, _)| file == "[kernel]"));
    let native = locations.iter().find(|(address, m, f)| {
        *address != 0
            && !f.contains("+0x")
            && !f.ends_with("_[k]")
            && mappings.get(m).is_some_and(|(file, build_id)| file.contains("libpython3.12") && build_id.len() >= 16)
    });
    note(format!("kernel frame: {kernel:?}; libpython frame: {native:?}"));
    assert!(kernel.is_some(), "no kernel frame with an address in the [kernel] mapping{d}");
    assert!(native.is_some(), "no named libpython frame with an address in libpython's mapping (with its build id){d}");
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The number before `label` in `line` (`..., 12 loading (...)`), if any.
fn count_before(line: &str, label: &str) -> Option<u64> {
    let at = line.find(label)?;
    line[..at].split([' ', ',', ';', ':']).rfind(|w| !w.is_empty())?.parse().ok()
}

/// Issue #10, rule "no file I/O on the sampling loop": the ctypes library of `c_frames`
/// lives on a FUSE file system whose server is then stopped (SIGSTOP), after the process
/// loaded it and ran its code once. Reading that file for its unwind tables hangs for ever.
/// A 3 s `--native` recording must still get the process's samples at the sampling rate
/// and end on time; the samples running in the library keep their Python frames behind
/// `<loading native>` (no frame of the library is guessed), and are counted in `--stats`.
#[test]
fn native_hung_library_does_not_stall_sampling() {
    const RATE: f64 = 499.0;
    const SECONDS: f64 = 3.0;
    if !is_root() {
        skip("needs root (FUSE mount)");
        return;
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        skip("/dev/fuse does not exist on this machine: the hung file cannot be made");
        return;
    }
    // A static interpreter: discovery finds Python in the executable and never opens the
    // hung library.
    let Some(py) = debian_3_11() else { return };
    // Its own directory for the library (not that of `native_c_frames_debian_3_11`).
    let py = Python { label: "debian-3.11-fuse".into(), ..py };
    let (lib_dir, _) = match build_library(&py) {
        Ok(built) => built,
        Err(reason) => {
            skip(format!("{}: {reason}", py.describe()));
            return;
        }
    };
    let mnt = lib_dir.join("mnt");
    let warm = lib_dir.join("warm.json");
    fs::create_dir_all(&mnt).unwrap();
    let content = format!("@{}", lib_dir.join(LIBRARY).display());
    let served = mnt.join("lib.so");
    let native_py = workload_source("native.py");
    let server = Workload::spawn(
        &py,
        "fuse_stall.py",
        &[
            &mnt.to_string_lossy(),
            &content,
            &py.exe.to_string_lossy(),
            &native_py.to_string_lossy(),
            "ctypes",
            &warm.to_string_lossy(),
            "60",
            &served.to_string_lossy(),
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let fields = server.ready_fields();
    let pid_of = |k: &str| fields.get(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or_else(|| panic!("{k}= in {fields:?}"));
    let (server_pid, pid) = (pid_of("server"), pid_of("mapper"));
    let cleanup = KillPids(vec![server_pid, pid]);
    // The library's code has run once (paged in): from now on nobody answers for the file.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !warm.is_file() {
        assert!(std::time::Instant::now() < deadline, "the workload never ran the library from the FUSE mount");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: kill(2) of the server our workload forked.
    unsafe { libc::kill(server_pid as libc::pid_t, libc::SIGSTOP) };
    note("the FUSE server holding the ctypes library is stopped: reading the library hangs");

    let (pid_arg, rate, seconds) = (pid.to_string(), format!("{RATE}"), format!("{SECONDS}"));
    let started = std::time::Instant::now();
    let run = RecordRun::start(&["--pid", &pid_arg, "--duration", &seconds, "--rate", &rate, "--stats", "--native"]);
    let sampling = run.wait_until_sampling(std::time::Duration::from_secs(30));
    let (t0, cpu0) = (std::time::Instant::now(), cpu_ticks(pid));
    std::thread::sleep(std::time::Duration::from_secs_f64(SECONDS - 0.5));
    let (t1, cpu1) = (std::time::Instant::now(), cpu_ticks(pid));
    let rec = run.finish();
    let elapsed = started.elapsed();
    drop(cleanup);
    drop(server);
    let _ = fs::remove_dir_all(&lib_dir);
    let d = rec.diag_pid(pid);
    assert!(sampling, "pyperch never started sampling{d}");
    rec.assert_ok();
    // Start-up on a loaded 2-core machine, the duration, writing the profile.
    let limit = std::time::Duration::from_secs_f64(SECONDS + 8.0);
    assert!(elapsed <= limit, "pyperch record --duration {SECONDS} took {elapsed:?} (limit {limit:?}){d}");

    // SAFETY: sysconf has no preconditions.
    let ticks = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    let cpu_share = match (cpu0, cpu1) {
        (Some(a), Some(b)) => (b.saturating_sub(a) as f64 / ticks / (t1 - t0).as_secs_f64()).min(1.0),
        _ => panic!("cannot read the workload's CPU time{d}"),
    };
    let expected = RATE * SECONDS * cpu_share;
    let mine = rec.profile.for_pid(pid);
    let spin = mine.count(|s| python_index(s, "c_spin_caller").is_some());
    let loading = mine.count(|s| s.frames.iter().any(|f| f == "<loading native>"));
    let spin_loading = mine.count(|s| {
        python_index(s, "c_spin_caller").is_some() && s.frames.last().is_some_and(|f| f == "<loading native>")
    });
    let guessed = mine.count(|s| s.frames.iter().any(|f| f.contains("pyperch_spin") || f.contains("pyperch_callback") || f.contains("lib.so")));
    let stats_loading = rec.run.stderr_lines().iter().find_map(|l| {
        let l = l.trim_start();
        l.starts_with("native:").then(|| count_before(l, "loading (maps or file still being read)")).flatten()
    });
    let files_line = rec.run.stderr_lines().into_iter().find(|l| l.trim_start().starts_with("native files")).unwrap_or("").to_string();
    note(format!(
        "{} samples ({expected:.0} expected: {RATE} Hz x {SECONDS} s x {:.0} % of a CPU); c_spin_caller {spin}, of which {spin_loading} end in <loading native>; {loading} <loading native> in all, --stats says {stats_loading:?}; {}",
        mine.total(),
        cpu_share * 100.0,
        files_line.trim()
    ));
    assert!(
        mine.total() as f64 >= 0.9 * expected,
        "{} samples of pid {pid}, fewer than 90 % of the {expected:.0} expected: the sampling loop was held up{d}",
        mine.total()
    );
    assert!(spin >= 100, "only {spin} samples in c_spin_caller{d}");
    assert!(
        share(spin_loading, spin) >= 0.8,
        "only {spin_loading} of {spin} samples of c_spin_caller end in `<loading native>` right below it{d}"
    );
    assert_eq!(guessed, 0, "frames of the unread library were shown{d}");
    assert_eq!(stats_loading, Some(loading), "--stats does not count the <loading native> samples{d}");
    assert!(
        count_before(&files_line, "files being read now").is_some_and(|n| n >= 1),
        "--stats does not show the hung file as being read: {files_line:?}{d}"
    );
}

/// C++ names are demangled in every output (issue #31): a member function template of a
/// namespace, called through ctypes, shows as `pyperch::Spinner<int>::spin(double)` (what
/// `c++filt` gives for `_ZN7pyperch7SpinnerIiE4spinEd`) right below the Python caller, and no
/// frame keeps a mangled name.
#[test]
fn native_cpp_names_demangled_3_12() {
    let Some(py) = python("3.12") else { return };
    let Some(cxx) = find_program("g++").or_else(|| find_program("c++")) else {
        return skip("no C++ compiler (g++ or c++) on PATH");
    };
    let dir = PathBuf::from("/tmp/pyperch-tests").join(format!("native-cpp-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("a directory for the library");
    let lib = dir.join("libpyperch_cpp.so");
    let status = Command::new(&cxx)
        .args(["-O2", "-g", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(workload_source("native_cpp.cpp"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cxx.display()));
    assert!(status.success(), "{} failed to compile native_cpp.cpp ({})", cxx.display(), describe_status(status));
    let mut w = Workload::spawn(&py, "native_cpp.py", &[&lib.to_string_lossy(), "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let rec = record_native(w.pid, &["--native"], "4");
    w.terminate();
    let _ = fs::remove_dir_all(&dir);
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.count(|s| python_index(s, "cpp_caller").is_some());
    let named = mine.count(|s| {
        let Some(caller) = python_index(s, "cpp_caller") else { return false };
        s.frames[caller + 1..].iter().any(|f| PyFrame::parse(f).name == "pyperch::Spinner<int>::spin(double)")
    });
    let mangled = mine.count(|s| s.frames.iter().any(|f| f.contains("_ZN7pyperch")));
    note(format!("{}: {named} of {total} samples in cpp_caller show pyperch::Spinner<int>::spin(double); {mangled} keep a mangled name", py.describe()));
    assert!(total >= 100, "only {total} samples in cpp_caller{d}");
    assert!(share(named, total) >= 0.8, "only {named} of {total} samples in cpp_caller show pyperch::Spinner<int>::spin(double){d}");
    assert_eq!(mangled, 0, "frames keep the mangled name _ZN7pyperch...{d}");
}
