//! py-spy's own integration suite (`tests/integration_test.py`, `tests/integration_test.rs`
//! and their scripts in github:benfred/py-spy), each scenario written anew as a pyperch test
//! on 3.9, 3.12 and sid 3.15. Each test names the py-spy case it stands for; the workloads
//! are `workloads/peer_*.py`. py-spy's `get_stack_traces()` (one snapshot of a process,
//! sleeping threads included) is `pyperch dump`; its `record` runs are `pyperch record`.
//! Where pyperch deliberately differs, the test says so and why.
//!
//! Cases already ported elsewhere: `test_shell_completions` is
//! `pyspy_compat_completions_bash` (pyspy_compat.rs).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use pyperch_tests::*;
use serde_json::Value;

/// The versions: every case runs on each of them.
const VERSIONS: [&str; 3] = ["3.9", "3.12", "sid-3.15"];

/// The 1-based line of `script` marked with the comment `# @marker`.
fn marked_line(script: &str, marker: &str) -> u32 {
    let text = fs::read_to_string(workload_source(script)).unwrap_or_else(|e| panic!("{script}: {e}"));
    let tag = format!("# @{marker}");
    let at = text.lines().position(|l| l.trim_end().ends_with(&tag)).unwrap_or_else(|| panic!("no {tag} in {script}"));
    at as u32 + 1
}

/// `pyperch record --format collapsed [FLAGS] -- PYTHON SCRIPT ARGS` (launch mode, as py-spy's
/// Python suite runs it), to completion.
fn launch(py: &Python, dir: &WorkDir, flags: &[&str], script: &str, args: &[&str]) -> Recording {
    let mut all: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    all.push("--".into());
    all.extend(py.argv().into_iter().map(|a| a.to_string_lossy().into_owned()));
    all.push(dir.guest_path(script));
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    record(&all)
}

/// `pyperch dump --pid PID --json --locals`, parsed.
fn dump_json(pid: u32) -> (Run, Value) {
    let pid = pid.to_string();
    let run = pyperch(&["dump", "--pid", &pid, "--json", "--locals"], Duration::from_secs(30));
    let json = serde_json::from_str(&run.stdout).unwrap_or(Value::Null);
    (run, json)
}

/// A dumped frame: function, file, line.
type DumpedFrame = (String, String, Option<u64>);

/// `(function, file, line)` of a dumped thread's frames, root first.
fn dumped_frames(thread: &Value) -> Vec<DumpedFrame> {
    thread["stack"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("").to_string(),
                f["file"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64(),
            )
        })
        .collect()
}

/// The dump of a sleeping workload's main thread once its stack has settled: a snapshot
/// taken right after `ready` may still catch the print; up to 20 tries, 100 ms apart,
/// until the leaf is `leaf`.
fn dump_main_until(w: &Workload, leaf: &str) -> (Run, Value, Vec<DumpedFrame>) {
    let mut last = None;
    for _ in 0..20 {
        let (run, json) = dump_json(w.pid);
        let frames = json["threads"].as_array().and_then(|t| t.first()).map(dumped_frames).unwrap_or_default();
        let done = frames.last().is_some_and(|f| f.0 == leaf);
        last = Some((run, json, frames));
        if done {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    last.expect("at least one dump")
}

/// The frame of a collapsed stack as (name, file, line), pseudo-frames (`<off-cpu: ...>`,
/// `<GC>`) left out.
fn real_frames(stack: &Stack) -> Vec<PyFrame> {
    stack.python_frames().into_iter().filter(|f| !f.file.is_empty()).collect()
}

/// py-spy `test_longsleep` (integration_test.py, `--idle` half): a script asleep the whole
/// time, recorded with `--idle` for 2 s, shows ≥ 95 % of its samples in one stack,
/// `<module>` at the call line then `longsleep` at the sleep line. pyperch's `--idle` is
/// `--mode wall`: the weight is nanoseconds, not samples, and the stack ends in the
/// pseudo-frame `<off-cpu: sleep>` saying why the thread was off the CPU (py-spy shows the
/// two Python frames alone). A script asleep since before pyperch looked is charged from
/// its blocked stack, read from memory (main's 3ea7bf0; before it, such a recording could
/// come out empty).
#[test]
fn pyspy_longsleep_idle() {
    let (module, sleep) = (marked_line("peer_sleep.py", "module"), marked_line("peer_sleep.py", "sleep"));
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "peer-longsleep").unwrap_or_else(|e| panic!("{e:#}"));
        let rec = launch(&py, &dir, &["--idle", "--duration", "2"], "peer_sleep.py", &[]);
        let d = rec.diag();
        rec.assert_ok();
        let total = rec.profile.total();
        let top = rec.profile.stacks.iter().max_by_key(|s| s.count).unwrap_or_else(|| panic!("{}: empty profile{d}", py.describe()));
        assert!(top.count * 100 >= total * 95, "{}: the heaviest stack holds {} of {total}, under 95 %{d}", py.describe(), top.count);
        let frames: Vec<(String, Option<u32>)> = real_frames(top).into_iter().map(|f| (f.name, f.line)).collect();
        assert_eq!(
            frames,
            vec![("<module>".to_string(), Some(module)), ("longsleep".to_string(), Some(sleep))],
            "{}: the sleeping stack{d}",
            py.describe()
        );
        assert_eq!(top.frames.last().map(String::as_str), Some("<off-cpu: sleep>"), "{}: the leaf says why{d}", py.describe());
    });
}

/// py-spy `test_longsleep` (integration_test.py, `--gil` half): the same script recorded
/// with `--gil` has at most 10 samples (py-spy's bound). pyperch records none, writes no
/// file for an empty profile (an existing one is left as it was) and says why on stderr.
#[test]
fn pyspy_longsleep_gil() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "peer-longsleep-gil").unwrap_or_else(|e| panic!("{e:#}"));
        let rec = launch(&py, &dir, &["--gil", "--duration", "2"], "peer_sleep.py", &[]);
        let d = rec.diag();
        assert_eq!(rec.run.code(), Some(0), "{}: pyperch failed{d}", py.describe());
        assert!(rec.profile.total() <= 10, "{}: {} samples of a sleeping script with --gil{d}", py.describe(), rec.profile.total());
        if rec.profile.total() == 0 {
            assert!(
                rec.run.stderr.contains("the profile is empty") && rec.run.stderr.contains("GIL"),
                "{}: an empty --gil recording should say why, naming the GIL{d}",
                py.describe()
            );
        }
    });
}

/// py-spy `test_busyloop` (integration_test.py: `--gil` keeps ~all samples of a busy loop)
/// and `test_busy_loop` (integration_test.rs: the thread is reported active). A cpu-mode and
/// a `--gil` recording of the same spinning process at once: the `--gil` one keeps ≥ 80 %
/// of the cpu one's samples (the loop always holds the GIL; py-spy's bound is 95 of ~100
/// possible samples; pyperch's cpu-mode count is the reference, over a window a little
/// shifted from the `--gil` one's, hence the wider margin), nearly all in
/// busy_loop; `pyperch dump` shows the thread running and holding the GIL.
#[test]
fn pyspy_busyloop_gil_and_active() {
    for label in VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "peer_busy.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let cpu = RecordRun::start(&["--pid", &pid, "--duration", "3", "--rate", "199"]);
        let gil = RecordRun::start(&["--pid", &pid, "--duration", "3", "--rate", "199", "--gil"]);
        let (cpu, gil) = (cpu.finish(), gil.finish());
        let (dump_run, dump) = dump_json(w.pid);
        let d = format!("{}{}{}", cpu.diag(), gil.diag(), dump_run.diag());
        cpu.assert_ok();
        gil.assert_ok();
        let (c, g) = (cpu.profile.total(), gil.profile.total());
        // A floor for the ratio's statistical margin, not a time: the loop's CPU share
        // depends on the machine's load.
        assert!(c >= 40, "{}: only {c} cpu-mode samples of a busy loop{d}", py.describe());
        assert!(g * 100 >= c * 80, "{}: --gil kept {g} of {c} samples of a loop holding the GIL{d}", py.describe());
        assert!(gil.profile.with_function("busy_loop") * 100 >= g * 95, "{}: --gil samples outside busy_loop{d}", py.describe());
        let main = &dump["threads"][0];
        assert_eq!(main["activity"], "running", "{}: the busy thread should be shown running{d}", py.describe());
        assert_eq!(main["holds_gil"], true, "{}: the busy thread holds the GIL{d}", py.describe());
    }
}

/// py-spy `test_thread_names` (both suites): ten threads named `CustomThreadName-N` through
/// `threading` and the main thread, recorded with `--threads --idle`: the profile's thread
/// frames carry exactly those eleven names (`thread <tid> <name>`). On main pyperch shows
/// the OS thread names (`python3.12`, or threading's name cut to 15 bytes from 3.14 on),
/// not threading's: this test waits for branch thread-names.
#[test]
fn pyspy_thread_names() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "peer-thread-names").unwrap_or_else(|e| panic!("{e:#}"));
        let rec = launch(&py, &dir, &["--threads", "--idle", "--duration", "3"], "peer_thread_names.py", &["60"]);
        let d = rec.diag();
        rec.assert_ok();
        let names: BTreeSet<String> = rec.profile.stacks.iter().filter_map(|s| s.thread_name().map(str::to_string)).collect();
        let mut want: BTreeSet<String> = (0..10).map(|i| format!("CustomThreadName-{i}")).collect();
        want.insert("MainThread".into());
        assert_eq!(names, want, "{}: the threads' names{d}", py.describe());
    });
}

/// py-spy `test_recursive` (integration_test.rs, its issue 56): module code calling
/// recurse(20) in a loop. Every stack starts at `<module>` on the loop's two lines and holds
/// at most 21 recurse frames (py-spy: ≤ 22 frames); no stack starts inside the recursion.
#[test]
fn pyspy_recursive() {
    let lines = BTreeSet::from([Some(marked_line("peer_recursive.py", "loop")), Some(marked_line("peer_recursive.py", "call"))]);
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "peer_recursive.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let rec = record(&["--pid", &pid, "--duration", "3", "--rate", "499"]);
        let d = rec.diag();
        rec.assert_ok();
        assert!(rec.profile.with_function("recurse") > 0, "{}: no recurse samples{d}", py.describe());
        for s in &rec.profile.stacks {
            let frames = real_frames(s);
            let root = frames.first().unwrap_or_else(|| panic!("{}: a stack without Python frames: {:?}{d}", py.describe(), s.frames));
            assert!(root.name == "<module>" && lines.contains(&root.line), "{}: a stack not rooted at the module's loop: {:?}{d}", py.describe(), s.frames);
            let depth = frames.iter().filter(|f| f.is("recurse")).count();
            assert!(depth <= 21, "{}: {depth} recurse frames (at most 21): {:?}{d}", py.describe(), s.frames);
            assert!(frames.len() <= 22, "{}: {} frames (at most 22): {:?}{d}", py.describe(), frames.len(), s.frames);
        }
    });
}

/// One of py-spy's non-ASCII cases (`test_unicode`: a file name holding 💩, `test_cyrillic`:
/// a function named кириллица): the dump of the sleeping script shows `<module>` at the
/// call line and `func` at the sleep line in `script` (py-spy's `get_stack_traces`; the
/// dump shows full paths); a recording of the spinning script shows `func` in a file whose
/// name is `script`, in collapsed stacks and in speedscope's frame table (the format py-spy's
/// Python suite reads). py-spy's `short_filename` is the bare `script` (the path below the
/// entry of `sys.path` holding it); pyperch's short name of a script outside site-packages
/// and the standard library is its path relative to the process's working directory
/// (here the full path: the workload runs elsewhere), so the test checks the last
/// component; short names themselves are `pyspy_compat_short_filenames`.
fn non_ascii_case(script: &str, func: &str) {
    let (module, sleep) = (marked_line(script, "module"), marked_line(script, "sleep"));
    let spin = [marked_line(script, "loop"), marked_line(script, "spin")];
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let asleep = Workload::spawn(&py, script, &["sleep", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let (run, _, frames) = dump_main_until(&asleep, func);
        let d = run.diag();
        assert!(run.success(), "{}: dump failed{d}", py.describe());
        let got: Vec<(String, Option<u64>)> = frames.iter().map(|f| (f.0.clone(), f.2)).collect();
        assert_eq!(
            got,
            vec![("<module>".to_string(), Some(module.into())), (func.to_string(), Some(sleep.into()))],
            "{}: the sleeping stack{d}",
            py.describe()
        );
        assert!(frames.iter().all(|f| f.1.ends_with(&format!("/{script}"))), "{}: the file names{d}", py.describe());

        let busy = Workload::spawn(&py, script, &["spin", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = busy.pid.to_string();
        let speedscope = busy.dir.host_path("profile.json");
        let speedscope_str = speedscope.to_string_lossy().into_owned();
        let collapsed = RecordRun::start(&["--pid", &pid, "--duration", "3"]);
        let scope_run = pyperch(&["record", "--pid", &pid, "--duration", "3", "--format", "speedscope", "-o", &speedscope_str], Duration::from_secs(90));
        let collapsed = collapsed.finish();
        let d = format!("{}{}", collapsed.diag(), scope_run.diag());
        collapsed.assert_ok();
        let in_func: Vec<PyFrame> =
            collapsed.profile.stacks.iter().flat_map(|s| s.python_frames()).filter(|f| f.name == func).collect();
        assert!(!in_func.is_empty(), "{}: no {func} samples{d}", py.describe());
        assert!(
            in_func.iter().all(|f| f.file == script || f.file.ends_with(&format!("/{script}"))),
            "{}: {func}'s file name should end in {script}{d}",
            py.describe()
        );
        assert!(
            in_func.iter().all(|f| f.line.is_some_and(|l| spin.contains(&l))),
            "{}: {func} outside its spin loop's lines {spin:?}{d}",
            py.describe()
        );
        assert!(scope_run.success(), "{}: speedscope recording failed{d}", py.describe());
        let json: Value = serde_json::from_str(&fs::read_to_string(&speedscope).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{}: speedscope output is not JSON: {e}{d}", py.describe()));
        let found = json["shared"]["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["name"].as_str() == Some(func) && f["file"].as_str().is_some_and(|p| p.ends_with(script)));
        assert!(found, "{}: speedscope has no frame {func} in {script}{d}", py.describe());
    });
}

/// py-spy `test_unicode`: a script whose file name holds an emoji.
#[test]
fn pyspy_unicode_filename() {
    non_ascii_case("peer_unicode💩.py", "function1");
}

/// py-spy `test_cyrillic`: a function named in Cyrillic letters.
#[test]
fn pyspy_cyrillic_function_name() {
    non_ascii_case("peer_cyrillic.py", "кириллица");
}

/// py-spy `test_local_vars` (`dump --locals`), standard-library values only: the sleeping
/// function's arguments then locals, in order, with their values. pyperch deliberately
/// renders differently from py-spy: strings as Python's repr (`'foo'`, py-spy `"foo"`), and
/// containers as `<list of 2>` (py-spy formats their contents): the dump reads a bounded
/// number of bytes of the target per value, never walks a target's containers, and a long
/// string is cut at 100 characters with its length (py-spy cuts at a byte budget).
#[test]
fn pyspy_local_vars() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "peer_local_vars.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let (run, json, frames) = dump_main_until(&w, "local_variable_lookup");
        let d = run.diag();
        assert!(run.success(), "{}: dump failed{d}", py.describe());
        assert_eq!(frames.len(), 2, "{}: two frames, as py-spy checks{d}", py.describe());
        let locals: Vec<(String, String)> = json["threads"][0]["stack"][1]["locals"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| (l["name"].as_str().unwrap_or("").to_string(), l["value"].as_str().unwrap_or("").to_string()))
            .collect();
        let names: Vec<&str> = locals.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["seconds", "arg1", "arg2", "arg3", "local1", "local2", "local3", "local4", "local5", "local6", "local25", "local26"],
            "{}: arguments first, then locals, in order{d}",
            py.describe()
        );
        let value = |n: &str| locals.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()).unwrap_or("");
        for (name, want) in [
            ("arg1", "'foo'"),
            ("arg2", "None"),
            ("arg3", "True"),
            ("local1", "<list of 2>"),
            ("local2", "<tuple of 3>"),
            ("local3", "123456789123456789"),
            ("local4", "3.1415"),
            ("local5", "<dict of 2>"),
            ("local6", "<tuple of 2>"),
            ("local26", "''"),
        ] {
            assert_eq!(value(name), want, "{}: {name}{d}", py.describe());
        }
        // py-spy's issue 766: a long non-ASCII string starts with its characters intact.
        assert!(value("local25").starts_with("'测试1测试1"), "{}: local25 = {:?}{d}", py.describe(), value("local25"));
        assert!(value("local25").ends_with("(1500 characters)"), "{}: local25's length{d}", py.describe());
    });
}

/// py-spy `test_subprocesses`: a parent and two multiprocessing children (fork before 3.14,
/// forkserver from 3.14 on), `--subprocesses` of the parent: samples of at least three
/// distinct processes. (py-spy's children sleep and its sampler reports idle threads; here
/// they spin, so the default CPU mode sees them.)
#[test]
fn pyspy_subprocesses() {
    // One version at a time: three spinning processes each, on a 2-core machine.
    for label in VERSIONS {
        let Some(py) = python(label) else { continue };
        let w = Workload::spawn(&py, "peer_subprocesses.py", &["three", "{dir}", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let rec = record(&["--pid", &pid, "--subprocesses", "--duration", "3", "--rate", "199", "--stats"]);
        let d = rec.diag();
        rec.assert_ok();
        let children: BTreeSet<u32> = fs::read_dir(&w.dir.host)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("child-")?.parse().ok())
            .collect();
        let busy: BTreeSet<u32> = rec.profile.pids().into_iter().filter(|p| rec.profile.for_pid(*p).with_function("family_busy") > 0).collect();
        assert!(busy.contains(&w.pid), "{}: no samples of the parent{d}", py.describe());
        for c in &children {
            assert!(busy.contains(c), "{}: no samples of the child {c}{d}", py.describe());
        }
        assert!(busy.len() >= 3, "{}: {} processes in family_busy, want 3 (children {children:?}){d}", py.describe(), busy.len());
    }
}

/// py-spy `test_subprocesses_zombiechild`: a child that exited and was never waited for (a
/// zombie) does not stop `--subprocesses` of its parent: the recording succeeds and holds
/// the parent's samples.
#[test]
fn pyspy_subprocesses_zombie_child() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "peer_subprocesses.py", &["zombie", "{dir}", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let rec = record(&["--pid", &pid, "--subprocesses", "--duration", "2"]);
        let d = rec.diag();
        rec.assert_ok();
        assert!(rec.profile.for_pid(w.pid).with_function("family_busy") > 0, "{}: no samples of the parent{d}", py.describe());
    });
}

/// py-spy `test_negative_linenumber_increment` (its PR 208): a list comprehension written
/// over several lines, sleeping in its element. Before 3.12: `<module>` at the call,
/// `f` and `<listcomp>` within the comprehension's lines; from 3.12 (PEP 709 inlines it):
/// `<module>` and `f` only.
#[test]
fn pyspy_negative_linenumber_increment() {
    let script = "peer_listcomp.py";
    let (first, last, module) = (marked_line(script, "first"), marked_line(script, "last"), marked_line(script, "module"));
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, script, &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let inlined = py.version() >= (3, 12);
        let leaf = if inlined { "f" } else { "<listcomp>" };
        let (run, _, frames) = dump_main_until(&w, leaf);
        let d = run.diag();
        assert!(run.success(), "{}: dump failed{d}", py.describe());
        let names: Vec<&str> = frames.iter().map(|f| f.0.as_str()).collect();
        let want: &[&str] = if inlined { &["<module>", "f"] } else { &["<module>", "f", "<listcomp>"] };
        assert_eq!(names, want, "{}: the frames{d}", py.describe());
        assert_eq!(frames[0].2, Some(module.into()), "{}: <module>'s line{d}", py.describe());
        for f in &frames[1..] {
            assert!(
                f.2.is_some_and(|l| (u64::from(first)..=u64::from(last)).contains(&l)),
                "{}: {} at line {:?}, outside the comprehension's lines {first}-{last}{d}",
                py.describe(),
                f.0,
                f.2
            );
        }
    });
}

/// py-spy `test_delayed_subprocess` (delayed_launch.sh): `--pid` of a shell (not a Python)
/// that starts a Python half a second after sampling began, with `--subprocesses`: the
/// Python child's samples, under the child's own pid.
#[test]
fn pyspy_delayed_subprocess() {
    let Some(sh) = find_program("sh") else {
        skip("sh is not installed");
        return;
    };
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let dir = WorkDir::new(&py, "peer-delayed").unwrap_or_else(|e| panic!("{e:#}"));
        let go = dir.host_path("go");
        let python: Vec<String> = py.argv().into_iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let mut cmd = Command::new(&sh);
        // The shell waits for the go file (written once pyperch samples), sleeps half a
        // second, then runs the Python as its child (`; true` keeps it from exec'ing it).
        cmd.args(["-c", "while [ ! -e \"$0\" ]; do sleep 0.05; done; sleep 0.5; \"$@\"; true"])
            .arg(&go)
            .args(&python)
            .arg(dir.guest_path("peer_delayed.py"))
            .arg("60");
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let shell = KillOnDrop(cmd.spawn().expect("cannot start sh"));
        let shell_pid = shell.pid();
        let pid = shell_pid.to_string();
        let rec = RecordRun::start(&["--pid", &pid, "--subprocesses", "--duration", "5"]);
        let sampling = rec.wait_until_sampling(Duration::from_secs(60));
        fs::write(&go, "go").expect("cannot write the go file");
        let rec = rec.finish();
        drop(shell);
        let d = rec.diag();
        assert!(sampling, "{}: pyperch never started sampling{d}", py.describe());
        rec.assert_ok();
        let pids: BTreeMap<u32, u64> =
            rec.profile.pids().into_iter().map(|p| (p, rec.profile.for_pid(p).with_function("delayed_busy"))).collect();
        assert!(pids.values().any(|&n| n > 0), "{}: no samples of the delayed Python{d}", py.describe());
        assert!(!pids.contains_key(&shell_pid), "{}: samples under the shell's pid{d}", py.describe());
    });
}

/// py-spy `test_dump_subprocesses_no_duplication` (its dump's duplicate-per-thread bug): the
/// dump of a process with four threads and a Python child lists the process once and each
/// of its five threads once; the child, dumped on its own, once with its one thread. pyperch
/// deliberately has no `dump --subprocesses`: a dump is one process's snapshot, taken
/// without stopping it; a tree is `pyperch dump` once per pid (or `record --subprocesses`).
#[test]
fn pyspy_dump_no_duplication() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "peer_dump_threads.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let child: u32 = w.ready_fields().get("child").and_then(|c| c.parse().ok()).expect("child pid in the ready line");
        // The child needs a moment to initialise its interpreter (py-spy waits 500 ms).
        thread::sleep(Duration::from_millis(500));
        for (pid, threads) in [(w.pid, 5), (child, 1)] {
            let text = pyperch(&["dump", "--pid", &pid.to_string()], Duration::from_secs(30));
            let (run, json) = dump_json(pid);
            let d = format!("{}{}", text.diag(), run.diag());
            assert!(text.success() && run.success(), "{}: dump of {pid} failed{d}", py.describe());
            let header = format!("Process {pid} ");
            assert_eq!(text.stdout.lines().filter(|l| l.starts_with(&header)).count(), 1, "{}: process {pid} listed once{d}", py.describe());
            let tids: Vec<u64> = json["threads"].as_array().into_iter().flatten().filter_map(|t| t["tid"].as_u64()).collect();
            let unique: BTreeSet<u64> = tids.iter().copied().collect();
            assert_eq!(tids.len(), unique.len(), "{}: a thread of {pid} listed twice{d}", py.describe());
            assert_eq!(tids.len(), threads, "{}: threads of {pid}{d}", py.describe());
        }
    });
}

/// py-spy `test_thread_reuse` (with `--native`): threads started and joined one after
/// another, recorded with `--native`: the recording succeeds, holds the short-lived
/// threads' reused_worker frames and no malformed stack (py-spy allowed 3 failed snapshots
/// of 100; pyperch never stops a thread, so there is nothing to fail).
#[test]
fn pyspy_thread_reuse_native() {
    side_by_side(&VERSIONS, 3, |label| {
        let Some(py) = python(label) else { return };
        let w = Workload::spawn(&py, "peer_thread_reuse.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let rec = record(&["--pid", &pid, "--native", "--threads", "--duration", "3"]);
        let d = rec.diag();
        rec.assert_ok();
        let threads = rec.profile.threads_of("reused_worker");
        assert!(threads.len() >= 2, "{}: reused_worker in {} threads, want several short-lived ones{d}", py.describe(), threads.len());
    });
}
