//! What a py-spy user types: launch-mode endings (`--duration` ends the launched command,
//! `--keep-running`, Ctrl-C once), `--function`/`--nolineno`, `--subprocesses`, short file
//! names, `--format raw`/`chrometrace`, shell completions.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use pyperch_tests::*;

const HOST_PREFERENCE: [&str; 6] = ["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"];
/// The versions every new flag is checked on (the 3.9, 3.12 and sid 3.15).
const FLAG_VERSIONS: [&str; 3] = ["3.9", "3.12", "sid-3.15"];
/// pyperch's grace between SIGTERM and SIGKILL (launch::GRACE).
const GRACE: Duration = Duration::from_secs(2);
/// Start-up (BPF load, discovery) and writing, on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_secs(20);

/// The launched script's pid, from its state file.
fn state_pid(state: &Path) -> Option<u32> {
    fs::read_to_string(state).ok()?.lines().find_map(|l| l.strip_prefix("pid ")?.trim().parse().ok())
}

/// Whether `pid` still exists (as anything but a zombie).
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `path` to hold a line for which `done` is true.
fn wait_for_line(path: &Path, limit: Duration, done: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if fs::read_to_string(path).is_ok_and(|t| t.lines().any(&done)) {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

fn kill_pid(pid: u32) {
    // SAFETY: kill(2) on a pid this test started (the launched script).
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}

/// `pyperch record --duration 2 --format collapsed -o OUT [EXTRA] -- PYTHON forever.py MODE
/// STATE`, to completion; returns the run, the profile's text and the script's pid.
fn launch_forever(py: &Python, dir: &WorkDir, mode: &str, extra: &[&str]) -> (Run, String, Option<u32>) {
    let out = dir.host_path("profile.txt");
    let state = dir.host_path("state");
    let mut args: Vec<String> = vec!["record".into(), "--duration".into(), "2".into(), "--format".into(), "collapsed".into(), "-o".into()];
    args.push(out.to_string_lossy().into_owned());
    args.extend(extra.iter().map(|a| a.to_string()));
    args.push("--".into());
    if extra.contains(&"--keep-running") {
        // The command outlives pyperch: it must not hold the pipes this test reads pyperch's
        // output from (the same holds for any pipeline around `--keep-running`).
        args.extend(["sh".into(), "-c".into(), "exec \"$@\" >/dev/null 2>&1".into(), "sh".into()]);
    }
    args.extend(py.argv().into_iter().map(|a: OsString| a.to_string_lossy().into_owned()));
    args.extend([dir.guest_path("forever.py"), mode.into(), dir.guest_path("state")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = pyperch(&args, Duration::from_secs(2) + GRACE + MARGIN + Duration::from_secs(30));
    let text = fs::read_to_string(&out).unwrap_or_default();
    (run, text, state_pid(&state))
}

fn check_launch_ends(mode: &str, function: Option<&str>) {
    let Some(py) = first_python(&HOST_PREFERENCE) else { return };
    let dir = WorkDir::new(&py, &format!("forever-{mode}")).unwrap_or_else(|e| panic!("{e:#}"));
    let (run, text, pid) = launch_forever(&py, &dir, mode, &[]);
    let d = format!("{}\n--- profile:\n{}", run.diag(), text.lines().take(20).collect::<Vec<_>>().join("\n"));
    if let Some(pid) = pid.filter(|p| alive(*p)) {
        kill_pid(pid);
        panic!("{}: the launched script (pid {pid}) is still running after pyperch returned{d}", py.describe());
    }
    assert!(!run.timed_out(), "pyperch did not return although --duration 2 elapsed{d}");
    assert!(
        run.elapsed < Duration::from_secs(2) + GRACE + MARGIN,
        "pyperch took {:.1} s: more than the duration (2 s) plus the grace ({} s) plus {} s for start-up{d}",
        run.elapsed.as_secs_f64(),
        GRACE.as_secs(),
        MARGIN.as_secs()
    );
    assert_eq!(run.code(), Some(0), "pyperch should exit 0 once the profile is written{d}");
    assert!(pid.is_some(), "the script never wrote its pid{d}");
    let profile = Profile::parse(&text);
    assert!(profile.malformed.is_empty(), "malformed collapsed lines{d}");
    match function {
        Some(f) => assert!(profile.with_function(f) > 0, "{}: no {f} in the profile{d}", py.describe()),
        None => {
            // Asleep the whole time once started: nothing sampled in the sleep. The command is
            // sampled from its first instruction, so its start-up (imports, a few ms of CPU)
            // may give a sample or two on a busy machine (a sleeping script took 1 of 2 s').
            assert!(
                !profile.stacks.iter().any(|s| s.has_function("forever_sleep")),
                "samples of a sleeping script in its sleep{d}"
            );
            assert!(profile.total() <= 5, "{} samples of a script asleep after start-up{d}", profile.total());
            if profile.total() == 0 {
                assert!(
                    run.stderr.contains("the profile is empty: the command's Python processes were asleep")
                        && run.stderr.contains("--idle"),
                    "an empty recording of a sleeping script should say it was asleep and name --idle{d}"
                );
            }
        }
    }
    assert!(run.stderr.contains("was ended"), "pyperch should say it ended the command{d}");
}

#[test]
fn pyspy_compat_launch_duration_ends_busy_command() {
    check_launch_ends("busy", Some("forever_busy"));
}

#[test]
fn pyspy_compat_launch_duration_ends_sleeping_command() {
    check_launch_ends("sleep", None);
}

#[test]
fn pyspy_compat_launch_duration_kills_command_ignoring_sigterm() {
    check_launch_ends("ignore_term", Some("forever_busy"));
}

#[test]
fn pyspy_compat_launch_keep_running() {
    let Some(py) = first_python(&HOST_PREFERENCE) else { return };
    let dir = WorkDir::new(&py, "forever-keep").unwrap_or_else(|e| panic!("{e:#}"));
    let (run, text, pid) = launch_forever(&py, &dir, "busy", &["--keep-running"]);
    let still_running = pid.is_some_and(alive);
    if let Some(pid) = pid {
        kill_pid(pid);
    }
    let d = run.diag();
    assert!(!run.timed_out(), "pyperch did not return with --keep-running{d}");
    assert_eq!(run.code(), Some(0), "pyperch should exit 0{d}");
    assert!(still_running, "with --keep-running the script should still run after pyperch returned{d}");
    assert!(Profile::parse(&text).with_function("forever_busy") > 0, "no forever_busy in the profile{d}");
}

/// Whether pyperch (`pid`) holds a perf event or BPF link, i.e. samples.
fn sampling(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|entries| {
        entries.filter_map(|e| e.ok()).any(|e| {
            fs::read_link(e.path()).is_ok_and(|t| {
                let t = t.to_string_lossy();
                t.contains("[perf_event]") || t.contains("bpf_link")
            })
        })
    })
}

/// A terminal's Ctrl-C goes to the whole foreground process group: pyperch and the command.
/// Simulated with killpg(SIGINT) on a group of their own. The command must see SIGINT once
/// (pyperch adds none), then pyperch's SIGTERM after the grace.
#[test]
fn pyspy_compat_launch_ctrl_c_reaches_command_once() {
    let Some(py) = first_python(&HOST_PREFERENCE) else { return };
    let dir = WorkDir::new(&py, "forever-ctrl-c").unwrap_or_else(|e| panic!("{e:#}"));
    let out = dir.host_path("profile.txt");
    let state = dir.host_path("state");
    let mut cmd = Command::new(pyperch_bin());
    cmd.args(["record", "--duration", "120", "--format", "collapsed", "-o"]).arg(&out).arg("--");
    cmd.args(py.argv()).args([dir.guest_path("forever.py"), "count_sigint".into(), dir.guest_path("state")]);
    cmd.process_group(0);
    let running = Running::start(cmd).expect("cannot start pyperch");
    let group = running.pid();
    let ready = wait_for_line(&state, Duration::from_secs(60), |l| l.starts_with("pid "));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sampling(group) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    // Let the recording gather a few samples.
    thread::sleep(Duration::from_secs(1));
    // SAFETY: killpg on the process group this test created for pyperch.
    unsafe { libc::killpg(group as libc::pid_t, libc::SIGINT) };
    let run = running.finish(Duration::from_secs(60));
    let states = fs::read_to_string(&state).unwrap_or_default();
    let pid = state_pid(&state);
    let d = format!("{}\n--- script's state file:\n{states}", run.diag());
    if let Some(pid) = pid.filter(|p| alive(*p)) {
        kill_pid(pid);
        panic!("the launched script (pid {pid}) is still running after pyperch returned{d}");
    }
    assert!(ready, "the script never started{d}");
    assert!(!run.timed_out(), "pyperch did not return after Ctrl-C{d}");
    assert_eq!(run.code(), Some(0), "pyperch should exit 0 once the profile is written{d}");
    let sigints = states.lines().filter(|l| l.starts_with("sigint ")).count();
    assert_eq!(sigints, 1, "the command should see the terminal's SIGINT once, not more{d}");
    assert!(
        states.lines().any(|l| l == "term 1"),
        "after the grace, the command should get SIGTERM from pyperch{d}"
    );
    assert!(
        Profile::parse(&fs::read_to_string(&out).unwrap_or_default()).with_function("forever_busy") > 0,
        "no forever_busy in the profile{d}"
    );
}

/// The distinct (file, line) of `func`'s frames.
fn frames_of(profile: &Profile, func: &str) -> BTreeSet<(String, Option<u32>)> {
    profile
        .stacks
        .iter()
        .flat_map(|s| s.python_frames())
        .filter(|f| f.is(func))
        .map(|f| (f.file, f.line))
        .collect()
}

/// `--function` merges a function's lines into one frame at its first line; `--nolineno`
/// into one frame without a line (here with `--format raw`, py-spy's name for collapsed).
#[test]
fn pyspy_compat_function_merges_lines() {
    for label in FLAG_VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "two_lines.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let base = ["--pid", pid.as_str(), "--duration", "4"];
        let per_line = RecordRun::start(&base);
        let per_function = RecordRun::start(&[&base[..], &["--function"]].concat());
        let raw_out = w.dir.host_path("nolineno.txt");
        let raw_out_str = raw_out.to_string_lossy().into_owned();
        let nolineno = pyperch(
            &[&["record", "--format", "raw", "-o", raw_out_str.as_str(), "--nolineno"][..], &base[..]].concat(),
            Duration::from_secs(90),
        );
        let per_line = per_line.finish();
        let per_function = per_function.finish();
        let d = format!("{}{}{}", per_line.diag(), per_function.diag(), nolineno.diag());
        let (first, _) = function_lines("two_lines.py", "two_lines_work").expect("two_lines_work in two_lines.py");
        let lines = frames_of(&per_line.profile, "two_lines_work");
        assert!(lines.len() >= 2, "{}: two_lines_work should show on two lines without --function{d}", py.describe());
        let merged = frames_of(&per_function.profile, "two_lines_work");
        assert_eq!(merged.len(), 1, "{}: --function should show two_lines_work as one frame{d}", py.describe());
        assert_eq!(
            merged.iter().next().and_then(|(_, l)| *l),
            Some(first),
            "{}: --function shows the function's first line, as py-spy does{d}",
            py.describe()
        );
        assert_eq!(nolineno.code(), Some(0), "--format raw --nolineno failed{d}");
        let raw = Profile::parse(&fs::read_to_string(&raw_out).unwrap_or_default());
        assert!(raw.malformed.is_empty(), "--format raw is not collapsed stacks{d}");
        let unnumbered = frames_of(&raw, "two_lines_work");
        assert_eq!(unnumbered.len(), 1, "{}: --nolineno should show two_lines_work once{d}", py.describe());
        assert_eq!(unnumbered.iter().next().map(|(_, l)| *l), Some(None), "--nolineno shows no line{d}");
    }
}

/// `--pid P --subprocesses` profiles a grandchild of P started after the recording began.
#[test]
fn pyspy_compat_subprocesses_finds_late_grandchild() {
    side_by_side(&FLAG_VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "late_grandchild.py", &["{dir}"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let rec = RecordRun::start(&["--pid", pid.as_str(), "--subprocesses", "--duration", "12"]);
        let sampling = rec.wait_until_sampling(Duration::from_secs(60));
        // Only now does the tree grow.
        fs::write(w.dir.host_path("go"), "go").expect("cannot write the go file");
        let rec = rec.finish();
        let d = rec.diag();
        assert!(sampling, "pyperch never started sampling{d}");
        rec.assert_ok();
        let grandchild = fs::read_to_string(w.dir.host_path("grandchild"))
            .ok()
            .and_then(|t| t.trim().strip_prefix("grandchild ")?.parse::<u32>().ok());
        let Some(grandchild) = grandchild else { panic!("{}: the grandchild never started{d}", py.describe()) };
        assert!(
            rec.profile.for_pid(grandchild).with_function("grandchild_busy") > 0,
            "{}: no grandchild_busy samples of the grandchild {grandchild}{}",
            py.describe(),
            rec.diag_pid(grandchild)
        );
    });
}

/// Default short file names: a module in a virtualenv's site-packages shows as
/// `shortmod.py`, the standard library's textwrap as `textwrap.py`; `--full-filenames`
/// shows the full paths.
#[test]
fn pyspy_compat_short_filenames() {
    side_by_side(&FLAG_VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "short_names.py", &["{dir}", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let base = ["--pid", pid.as_str(), "--duration", "4"];
        let short = RecordRun::start(&base);
        let full = RecordRun::start(&[&base[..], &["--full-filenames"]].concat());
        let (short, full) = (short.finish(), full.finish());
        let d = format!("{}{}", short.diag(), full.diag());
        short.assert_ok();
        full.assert_ok();
        let files = |p: &Profile, func: &str| -> BTreeSet<String> { frames_of(p, func).into_iter().map(|(f, _)| f).collect() };
        let site = w.ready_fields().get("site").cloned().unwrap_or_default();
        assert_eq!(
            files(&short.profile, "shortmod_work"),
            BTreeSet::from(["shortmod.py".to_string()]),
            "{}: a site-packages module should show as its name below site-packages{d}",
            py.describe()
        );
        assert_eq!(
            files(&full.profile, "shortmod_work"),
            BTreeSet::from([format!("{site}/shortmod.py")]),
            "{}: --full-filenames should show the full path{d}",
            py.describe()
        );
        let stdlib: BTreeMap<String, u64> = short
            .profile
            .stacks
            .iter()
            .flat_map(|s| s.python_frames())
            .filter(|f| f.file.ends_with("textwrap.py"))
            .map(|f| (f.file, 1))
            .collect();
        assert_eq!(
            stdlib.keys().cloned().collect::<Vec<_>>(),
            vec!["textwrap.py".to_string()],
            "{}: the standard library's textwrap should show as textwrap.py{d}",
            py.describe()
        );
        let full_stdlib = full.profile.stacks.iter().flat_map(|s| s.python_frames()).any(|f| {
            f.file.starts_with('/') && f.file.ends_with(&format!("/python{}.{}/textwrap.py", py.version().0, py.version().1))
        });
        assert!(full_stdlib, "{}: --full-filenames should show textwrap's full path{d}", py.describe());
    });
}

/// The events of one chrometrace file, checked against the trace event format: every event
/// has ph/pid/tid, B/E have a name and a numeric ts, per track the times never go back and
/// every B is closed by an E of the same name. Returns the B events' names.
fn check_trace_schema(json: &serde_json::Value) -> Result<Vec<String>, String> {
    let events = json["traceEvents"].as_array().ok_or("no traceEvents array")?;
    let mut open: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
    let mut last_ts: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    let mut names = Vec::new();
    let mut thread_names = 0;
    for e in events {
        let ph = e["ph"].as_str().ok_or_else(|| format!("event without ph: {e}"))?;
        let track = (e["pid"].as_u64().ok_or("event without pid")?, e["tid"].as_u64().ok_or("event without tid")?);
        match ph {
            "M" => thread_names += usize::from(e["name"] == "thread_name"),
            "B" | "E" => {
                let name = e["name"].as_str().ok_or_else(|| format!("{ph} event without name: {e}"))?.to_string();
                let ts = e["ts"].as_f64().ok_or_else(|| format!("{ph} event without ts: {e}"))?;
                if last_ts.get(&track).is_some_and(|&t| ts < t) {
                    return Err(format!("time goes back on track {track:?} at {e}"));
                }
                last_ts.insert(track, ts);
                let stack = open.entry(track).or_default();
                if ph == "B" {
                    names.push(name.clone());
                    stack.push(name);
                } else if stack.pop().as_deref() != Some(name.as_str()) {
                    return Err(format!("E without a matching B: {e}"));
                }
            }
            other => return Err(format!("unexpected phase {other}")),
        }
    }
    if let Some((track, stack)) = open.iter().find(|(_, s)| !s.is_empty()) {
        return Err(format!("track {track:?} ends with open events {stack:?}"));
    }
    if thread_names != last_ts.len() {
        return Err(format!("{} tracks but {thread_names} thread names", last_ts.len()));
    }
    Ok(names)
}

/// Loads the trace with Perfetto's trace processor (PyPI `perfetto`, in the test venv) and
/// returns the number of slices named two_lines_work... and the name it gives thread `tid`
/// (from the trace's `thread_name` metadata), or why it could not run.
fn perfetto_slices(trace: &Path, tid: u32) -> Result<(u64, Option<String>), String> {
    let venv = std::env::var_os("PYPERCH_TEST_VENV").map(PathBuf::from).ok_or("PYPERCH_TEST_VENV is not set")?;
    let python = venv.join("bin/python");
    let script = "import sys\nfrom perfetto.trace_processor import TraceProcessor, TraceProcessorConfig\n\
        tp = TraceProcessor(trace=sys.argv[1], config=TraceProcessorConfig(load_timeout=60))\n\
        rows = tp.query(\"select count(*) as n from slice where name like 'two_lines_work%'\")\n\
        print('slices', next(iter(rows)).n)\n\
        for r in tp.query('select name from thread where tid = %d and name is not null' % int(sys.argv[2])):\n    print('thread', r.name)\n\
        tp.close()\n";
    let mut cmd = Command::new(&python);
    cmd.args(["-c", script]).arg(trace).arg(tid.to_string()).stdin(Stdio::null());
    let run = Running::start(cmd).map_err(|e| format!("cannot run {}: {e:#}", python.display()))?.finish(Duration::from_secs(180));
    let count = run.stdout.lines().find_map(|l| l.strip_prefix("slices ")?.trim().parse::<u64>().ok());
    let name = run.stdout.lines().find_map(|l| Some(l.strip_prefix("thread ")?.to_string()));
    match count {
        Some(n) if run.success() => Ok((n, name)),
        _ => Err(format!(
            "the trace processor did not run: {}",
            run.stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim()
        )),
    }
}

/// `--format chrometrace`: a trace event JSON file, one track per thread (named after the
/// thread's OS name, without `--threads`), nested frames.
#[test]
fn pyspy_compat_chrometrace() {
    for label in FLAG_VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "two_lines.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let trace = w.dir.host_path("profile.trace.json");
        let trace_str = trace.to_string_lossy().into_owned();
        let run = pyperch(
            &["record", "--pid", pid.as_str(), "--duration", "3", "--format", "chrometrace", "-o", trace_str.as_str(), "--stats"],
            Duration::from_secs(90),
        );
        let comm = fs::read_to_string(format!("/proc/{pid}/task/{pid}/comm")).unwrap_or_default().trim_end().to_string();
        let d = run.diag();
        assert_eq!(run.code(), Some(0), "{}: pyperch failed{d}", py.describe());
        let text = fs::read_to_string(&trace).unwrap_or_default();
        let json: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}{d}", py.describe()));
        let names = check_trace_schema(&json).unwrap_or_else(|e| panic!("{}: {e}{d}", py.describe()));
        let work = names.iter().filter(|n| n.starts_with("two_lines_work (")).count();
        assert!(work > 0, "{}: no two_lines_work event in the trace{d}", py.describe());
        assert!(run.stderr.contains("timeline (chrometrace)"), "--stats should report the timeline{d}");
        // The main thread's track is named after its OS name (two_lines.py keeps the process's).
        let main = format!("{comm} (tid {pid})");
        let named = json["traceEvents"].as_array().into_iter().flatten().find(|e| {
            e["ph"] == "M" && e["name"] == "thread_name" && e["tid"].as_u64() == Some(u64::from(w.pid))
        });
        assert!(!comm.is_empty(), "{}: no name of the main thread in /proc{d}", py.describe());
        assert_eq!(named.and_then(|e| e["args"]["name"].as_str()), Some(main.as_str()), "{}: the main thread's track name{d}", py.describe());
        match perfetto_slices(&trace, w.pid) {
            Ok((n, name)) => {
                note(format!("{}: Perfetto's trace processor loaded the trace: {n} two_lines_work slices", py.describe()));
                assert_eq!(n as usize, work, "{}: Perfetto sees another number of slices than the file has{d}", py.describe());
                assert_eq!(name.as_deref(), Some(main.as_str()), "{}: Perfetto's name of the main thread{d}", py.describe());
            }
            Err(why) => note(format!(
                "{}: checked against the trace event schema only, not by Perfetto: {why}",
                py.describe()
            )),
        }
    }
}

/// The bash script from `pyperch completions bash`, sourced by bash, completes `rec`.
#[test]
fn pyspy_compat_completions_bash() {
    let Some(bash) = find_program("bash") else {
        skip("bash is not installed");
        return;
    };
    let run = pyperch(&["completions", "bash"], Duration::from_secs(30));
    assert!(run.success(), "pyperch completions bash failed{}", run.diag());
    let dir = std::env::temp_dir().join("pyperch-tests");
    fs::create_dir_all(&dir).expect("scratch directory");
    let script = dir.join(format!("completion-{}.bash", std::process::id()));
    fs::write(&script, &run.stdout).expect("cannot write the completion script");
    let probe = format!(
        "source '{}' || exit 9\nCOMP_WORDS=(pyperch rec); COMP_CWORD=1; COMP_LINE='pyperch rec'; COMP_POINT=${{#COMP_LINE}}\n_pyperch pyperch rec pyperch\necho \"reply:${{COMPREPLY[*]}}\"\n",
        script.display()
    );
    let out = Command::new(bash).args(["--norc", "-c", &probe]).output().expect("cannot run bash");
    let _ = fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reply = stdout.lines().find_map(|l| l.strip_prefix("reply:")).unwrap_or("").trim().to_string();
    assert_eq!(reply, "record", "bash completed `pyperch rec` to {reply:?}; stderr: {}", String::from_utf8_lossy(&out.stderr));
}
