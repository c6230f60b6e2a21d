//! CPython 3.15's own profiler, `python -m profiling.sampling` (its tests in
//! github:python/cpython `Lib/test/test_profiling/test_sampling_profiler/`: test_cli.py,
//! test_modes.py, test_integration.py), its command-line scenarios written anew as pyperch
//! tests on 3.9, 3.12 and sid 3.15. Each test names the case it stands for; the workloads
//! are `workloads/sampling_*.py`. CPython's `run SCRIPT` is `pyperch record -- python
//! SCRIPT`, its `attach PID` is `pyperch record --pid PID`.
//!
//! Where pyperch deliberately differs:
//! - No target: CPython refuses; pyperch profiles every Python on the host (whole_host.rs).
//! - `-a/--all-threads`: pyperch always samples every thread (the mode tests below rely on
//!   it: their workers are not the main thread).
//! - Formats: no pstats, jsonl or binary (pstats is a per-function table of call counts
//!   pyperch cannot know from samples; `pyperch top` shows the function table, the other two
//!   are CPython's own files); `--heatmap` is `--format heatmap -o DIR` (viewers.rs: plain
//!   HTML pages, without CPython's call-graph navigation); the flame graph is an SVG, not HTML; collapsed
//!   stacks without `-o` go to standard output, not to `collapsed.PID.txt`.
//! - `--live` is `pyperch top` (top.rs); `dump` is `pyperch dump` (dump.rs); `--native` shows
//!   the real native frames instead of one `<native>` marker (native.rs); `<GC>` frames are
//!   always shown, there is no `--no-gc` (gc_frame.rs); `--async-aware` is `--async`
//!   (asyncio.rs); `--subprocesses` writes one profile, each process under its own root
//!   (pyspy_suite.rs), not one file per process; `--blocking` does not exist: pyperch never
//!   stops its targets.

use std::{collections::BTreeSet, fs, time::Duration};

use pyperch_tests::*;
use serde_json::Value;

/// The issue's versions: every case runs on each of them.
const VERSIONS: [&str; 3] = ["3.9", "3.12", "sid-3.15"];

/// `record [FLAGS] -- PYTHON [PY_ARGS] SCRIPT ARGS`, to completion, with `env` for pyperch
/// (and so for the command).
fn launch(py: &Python, flags: &[&str], py_args: &[&str], script: &[String], env: &[(&str, &str)]) -> Recording {
    let mut all: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    all.push("--".into());
    all.extend(py.argv().into_iter().map(|a| a.to_string_lossy().into_owned()));
    all.extend(py_args.iter().map(|s| s.to_string()));
    all.extend(script.iter().cloned());
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    RecordRun::start_env(&all, env).finish()
}

/// What sampling_argv.py wrote: its arguments, `__name__` and `__spec__.name`.
fn argv_seen(dir: &WorkDir) -> (Vec<String>, String, Option<String>) {
    let text = fs::read_to_string(dir.host_path("argv.json")).unwrap_or_default();
    let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let argv = json["argv"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string)).collect();
    (argv, json["name"].as_str().unwrap_or("").to_string(), json["spec"].as_str().map(str::to_string))
}

/// test_cli.py `test_cli_script_with_arguments` and `test_cli_complex_script_arguments`:
/// `run script.py --input file.txt -v --output=/tmp/out positional`. The script gets exactly
/// its arguments (none taken by the profiler, even those that look like its flags: they
/// follow `--`, where CPython's `run` stops parsing at the script), is profiled, and
/// pyperch exits with the script's status.
#[test]
fn sampling_cli_run_script_with_arguments() {
    let args = ["--input", "file.txt", "-v", "--output=/tmp/out", "positional", "--flag"];
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "sampling-argv").unwrap_or_else(|e| panic!("{e:#}"));
        let mut script = vec![dir.guest_path("sampling_argv.py"), dir.guest_path("argv.json")];
        script.extend(args.iter().map(|s| s.to_string()));
        let rec = launch(&py, &[], &[], &script, &[("PYPERCH_ARGV_SECONDS", "1.5")]);
        let d = rec.diag();
        rec.assert_ok();
        let (argv, name, _) = argv_seen(&dir);
        assert_eq!(argv, args, "{}: the script's arguments{d}", py.describe());
        assert_eq!(name, "__main__", "{}{d}", py.describe());
        assert!(rec.profile.with_function("argv_busy") > 0, "{}: no argv_busy samples{d}", py.describe());
    });
}

/// test_cli.py `test_cli_module_with_arguments` / `test_cli_long_module_option`:
/// `run -m mymodule arg1 arg2 --flag`. pyperch has no `-m` of its own: the command is
/// `python -m module ...`, run as given; the module sees its arguments and runs as
/// `__main__` with its spec.
#[test]
fn sampling_cli_run_module_with_arguments() {
    let args = ["arg1", "arg2", "--flag"];
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "sampling-module").unwrap_or_else(|e| panic!("{e:#}"));
        let mut script = vec!["sampling_argv".to_string(), dir.guest_path("argv.json")];
        script.extend(args.iter().map(|s| s.to_string()));
        let path = dir.guest_path("");
        let rec = launch(&py, &[], &["-m"], &script, &[("PYTHONPATH", path.as_str()), ("PYPERCH_ARGV_SECONDS", "1.5")]);
        let d = rec.diag();
        rec.assert_ok();
        let (argv, name, spec) = argv_seen(&dir);
        assert_eq!(argv, args, "{}: the module's arguments{d}", py.describe());
        assert_eq!((name.as_str(), spec.as_deref()), ("__main__", Some("sampling_argv")), "{}: run as a module{d}", py.describe());
        assert!(rec.profile.with_function("argv_busy") > 0, "{}: no argv_busy samples{d}", py.describe());
    });
}

/// test_integration.py `test_sampling_basic_functionality` (its script: recursive Fibonacci,
/// a CPU loop, nested functions, run until it ends by itself): without `--duration` the
/// recording lasts as long as the script, pyperch exits with its status (0), and the profile
/// holds every path, the nested functions under their callers (with their qualified names
/// `nested_calls.<locals>.level1` from 3.11 on, as CPython reports them).
#[test]
fn sampling_cli_run_to_completion() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "sampling-run").unwrap_or_else(|e| panic!("{e:#}"));
        let rec = launch(&py, &["--rate", "499"], &[], &[dir.guest_path("sampling_run.py"), "1.5".into()], &[]);
        let d = rec.diag();
        rec.assert_ok();
        assert!(!rec.run.stderr.contains("was ended"), "{}: the script should end by itself{d}", py.describe());
        for f in ["slow_fibonacci", "cpu_intensive_work", "medium_computation"] {
            assert!(rec.profile.with_function(f) > 0, "{}: no {f} samples{d}", py.describe());
        }
        let deep_fib = rec.profile.stacks.iter().any(|s| s.python_frames().iter().filter(|f| f.is("slow_fibonacci")).count() >= 3);
        assert!(deep_fib, "{}: slow_fibonacci never seen recursing{d}", py.describe());
        let chain = ["main_loop", "nested_calls", "level1", "level2", "medium_computation"];
        let nested = rec.profile.stacks.iter().any(|s| {
            let names: Vec<String> = s.python_frames().into_iter().map(|f| f.name).collect();
            names.windows(chain.len()).any(|w| w.iter().zip(chain).all(|(n, c)| name_matches(n, c)))
        });
        assert!(nested, "{}: no stack main_loop;nested_calls;level1;level2;medium_computation{d}", py.describe());
        if py.version() >= (3, 11) {
            assert!(
                rec.profile.with_function("nested_calls.<locals>.level1.<locals>.level2") > 0,
                "{}: level2's qualified name{d}",
                py.describe()
            );
        }
    });
}

/// test_cli.py `test_cli_mutually_exclusive_pid_script` / `_pid_module`: a process and a
/// command to launch are one or the other ("only one target type can be specified"): one
/// error line, exit status 2, nothing started.
#[test]
fn sampling_cli_pid_and_command_exclusive() {
    let run = pyperch(&["record", "--pid", "1", "--", "python3", "myscript.py"], Duration::from_secs(30));
    run.assert_clear_error();
    assert_eq!(run.code(), Some(2), "a usage error exits 2{}", run.diag());
    assert!(run.error_line().contains("--pid"), "the error should name --pid{}", run.diag());
}

/// test_modes.py `test_mode_validation`: an unknown `--mode` is refused with the list of
/// modes (CPython: wall, cpu, gil, exception; pyperch adds off-cpu), exit status 2.
#[test]
fn sampling_cli_invalid_mode() {
    let run = pyperch(&["record", "--pid", "12345", "--mode", "invalid"], Duration::from_secs(30));
    run.assert_clear_error();
    assert_eq!(run.code(), Some(2), "a usage error exits 2{}", run.diag());
    assert!(run.error_line().contains("invalid value 'invalid'"), "{}", run.diag());
    assert!(run.stderr.contains("cpu, wall, off-cpu, gil, exception"), "the modes should be listed{}", run.diag());
}

/// test_cli.py `test_cli_mutually_exclusive_format_options` (`--pstats --collapsed`): two
/// output formats are refused. pyperch names a format with `--format`, once; and it has no
/// pstats (see the file's comment): asking for it lists the formats it has.
#[test]
fn sampling_cli_one_output_format() {
    let run = pyperch(&["record", "--pid", "12345", "--format", "collapsed", "--format", "flamegraph"], Duration::from_secs(30));
    run.assert_clear_error();
    assert_eq!(run.code(), Some(2), "{}", run.diag());
    let run = pyperch(&["record", "--pid", "12345", "--format", "pstats"], Duration::from_secs(30));
    run.assert_clear_error();
    assert!(
        run.error_line().contains("invalid value 'pstats'") && run.stderr.contains("collapsed") && run.stderr.contains("gecko"),
        "--format pstats should be refused with the formats pyperch writes{}",
        run.diag()
    );
}

/// CPython's rate forms (`-r 10khz`, `-r 10k`, `-r 2000`; test_modes.py
/// `test_gil_mode_cli_argument_parsing` passes `-r 2000 -d 5`): `--rate 1khz` samples ten
/// times as often as `--rate 100` (between 6 and 14 times, both recordings of the same
/// spinning process at once); a rate that is not a number of Hz is refused.
#[test]
fn sampling_cli_rate_forms() {
    for label in VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "peer_busy.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let fast = RecordRun::start(&["--pid", &pid, "-d", "3", "-r", "1khz"]);
        let slow = RecordRun::start(&["--pid", &pid, "-d", "3", "-r", "100"]);
        let (fast, slow) = (fast.finish(), slow.finish());
        let d = format!("{}{}", fast.diag(), slow.diag());
        fast.assert_ok();
        slow.assert_ok();
        let (f, s) = (fast.profile.total(), slow.profile.total());
        // A floor for the ratio's statistical margin, not a time (the CPU share depends on load).
        assert!(s >= 30, "{}: only {s} samples at 100 Hz{d}", py.describe());
        assert!(f >= 6 * s && f <= 14 * s, "{}: 1khz gave {f} samples, 100 Hz {s}: not about ten times{d}", py.describe());
    }
    for bad in ["fast", "10mhz", "0"] {
        let run = pyperch(&["record", "--pid", "12345", "--rate", bad], Duration::from_secs(30));
        run.assert_clear_error();
    }
}

/// test_cli.py `test_cli_default_collapsed_filename`: CPython writes `--collapsed` without
/// `-o` to `collapsed.PID.txt`; pyperch deliberately writes collapsed stacks without
/// `--output` to standard output (so they can be piped into flamegraph.pl or grep), and
/// its messages stay on standard error.
#[test]
fn sampling_cli_collapsed_to_stdout() {
    for label in VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "peer_busy.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let run = pyperch(&["record", "--pid", &pid, "--duration", "2", "--format", "collapsed"], Duration::from_secs(90));
        let d = run.diag();
        assert!(run.success(), "{}: pyperch failed{d}", py.describe());
        let profile = Profile::parse(&run.stdout);
        assert!(profile.malformed.is_empty(), "{}: standard output holds more than collapsed stacks{d}", py.describe());
        assert!(profile.with_function("busy_loop") > 0, "{}: no busy_loop on standard output{d}", py.describe());
    }
}

/// One of test_modes.py's integration cases: `sampling_modes.py CASE` in `--mode MODE` and in
/// `--mode wall` at once (both `attach` with all threads): `mode` keeps `shown` and never
/// `hidden`; wall keeps both.
fn mode_vs_wall(case: &str, mode: &str, shown: &str, hidden: &str) {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "sampling_modes.py", &[case, "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let filtered = RecordRun::start(&["--pid", &pid, "--duration", "3", "--mode", mode]);
        let wall = RecordRun::start(&["--pid", &pid, "--duration", "3", "--mode", "wall"]);
        let (filtered, wall) = (filtered.finish(), wall.finish());
        let d = format!("{}{}", filtered.diag(), wall.diag());
        filtered.assert_ok();
        wall.assert_ok();
        assert!(filtered.profile.with_function(shown) > 0, "{}: --mode {mode} shows no {shown}{d}", py.describe());
        assert_eq!(filtered.profile.with_function(hidden), 0, "{}: --mode {mode} shows {hidden}{d}", py.describe());
        for f in [shown, hidden] {
            assert!(wall.profile.with_function(f) > 0, "{}: --mode wall shows no {f}{d}", py.describe());
        }
    });
}

/// test_modes.py `test_cpu_mode_integration_filtering`: `--mode cpu` keeps the spinning
/// cpu_active_worker, not the sleeping idle_worker; `--mode wall` both.
#[test]
fn sampling_cli_mode_cpu_filters_idle() {
    mode_vs_wall("cpu", "cpu", "cpu_active_worker", "idle_worker");
}

/// test_modes.py `test_gil_mode_integration_behavior`: `--mode gil` keeps gil_holding_work
/// (and, beyond CPython's check, never the sleeping gil_releasing_work); `--mode wall` both.
#[test]
fn sampling_cli_mode_gil_filters_releasing() {
    mode_vs_wall("gil", "gil", "gil_holding_work", "gil_releasing_work");
}

/// test_modes.py `test_exception_mode_integration_filtering`: `--mode exception` keeps
/// exception_handling_worker (spinning inside `except`), not normal_worker (spinning
/// outside any); `--mode wall` both.
#[test]
fn sampling_cli_mode_exception_filters_normal() {
    mode_vs_wall("exception", "exception", "exception_handling_worker", "normal_worker");
}

/// The output formats CPython's profiler and pyperch share (test_collectors.py and
/// test_integration.py write collapsed, flamegraph and gecko files from a profiled script):
/// from one spinning process at once, collapsed stacks, the flame graph (an SVG here, an
/// HTML page in CPython), speedscope and the gecko profile (the Firefox Profiler's format)
/// each hold busy_loop in peer_busy.py.
#[test]
fn sampling_cli_output_formats() {
    for label in VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "peer_busy.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let out = |name: &str| w.dir.host_path(name).to_string_lossy().into_owned();
        let (svg, scope, gecko) = (out("profile.svg"), out("profile.json"), out("profile.gecko.json"));
        let collapsed = RecordRun::start(&["--pid", &pid, "--duration", "3"]);
        let others: Vec<(String, Running)> = [("flamegraph", &svg), ("speedscope", &scope), ("gecko", &gecko)]
            .into_iter()
            .map(|(format, path)| {
                let mut cmd = std::process::Command::new(pyperch_bin());
                cmd.args(["record", "--pid", &pid, "--duration", "3", "--format", format, "-o", path]);
                (format.to_string(), Running::start(cmd).expect("cannot start pyperch"))
            })
            .collect();
        let collapsed = collapsed.finish();
        let runs: Vec<(String, Run)> = others.into_iter().map(|(f, r)| (f, r.finish(Duration::from_secs(90)))).collect();
        let d = format!("{}{}", collapsed.diag(), runs.iter().map(|(_, r)| r.diag()).collect::<String>());
        collapsed.assert_ok();
        for (format, run) in &runs {
            assert!(run.success(), "{}: --format {format} failed{d}", py.describe());
        }
        assert!(collapsed.profile.with_function("busy_loop") > 0, "{}: collapsed{d}", py.describe());
        let svg_text = fs::read_to_string(&svg).unwrap_or_default();
        assert!(svg_text.contains("<svg") && svg_text.contains("busy_loop"), "{}: the flame graph{d}", py.describe());
        let json = |path: &str| -> Value {
            serde_json::from_str(&fs::read_to_string(path).unwrap_or_default())
                .unwrap_or_else(|e| panic!("{}: {path} is not JSON: {e}{d}", py.describe()))
        };
        let scope_json = json(&scope);
        let names: BTreeSet<&str> =
            scope_json["shared"]["frames"].as_array().into_iter().flatten().filter_map(|f| f["name"].as_str()).collect();
        assert!(names.contains("busy_loop"), "{}: speedscope's frames{d}", py.describe());
        let gecko_json = json(&gecko);
        let threads = gecko_json["threads"].as_array().cloned().unwrap_or_default();
        assert!(!threads.is_empty(), "{}: the gecko profile has no thread{d}", py.describe());
        let samples: u64 = threads
            .iter()
            .map(|t| t["samples"]["length"].as_u64().or_else(|| t["samples"]["data"].as_array().map(|a| a.len() as u64)).unwrap_or(0))
            .sum();
        assert!(samples > 0, "{}: the gecko profile has no sample{d}", py.describe());
        let strings = gecko_json.to_string();
        assert!(strings.contains("busy_loop"), "{}: the gecko profile does not name busy_loop{d}", py.describe());
    }
}
