//! CPython's own remote-inspection scenarios (`Lib/test/test_external_inspection.py`: thread
//! status, GIL, exception and stack cases), written anew against pyperch on 3.9, 3.12 and
//! Debian sid's 3.15, with `workloads/cpython_inspection.py`. Each test names the CPython
//! cases it stands for; asyncio's cases are `asyncio.rs`'s.
//!
//! Where pyperch deliberately differs:
//! - CPython reads a thread's status in one snapshot (`RemoteUnwinder(mode=...)`); pyperch's
//!   modes are sampling profiles, so "the thread has status S" becomes "the thread's samples
//!   are kept in `--mode S`" (and `pyperch dump` for the one-moment view).
//! - CPython's exception threads sleep in `time.sleep(0.01)` loops; `--mode exception` keeps
//!   on-CPU samples, so the workload's threads spin in their scenario instead (the dump
//!   tests park them, as CPython does).
//! - CPython checks function names ("Thread.run"); pyperch shows the code object's qualname
//!   from 3.11 on and its name before (as `sys._current_frames()` does), so the stacks are
//!   compared with the interpreter's own view of itself, frame for frame.
//! - Not ported: the opcode and column cases (`test_opcodes_collection`,
//!   `test_location_tuple_*`: pyperch reports lines, not columns or opcodes), the frame-cache
//!   identity cases (`TestFrameCaching`: CPython's object reuse; pyperch's cache is proven
//!   by `deep_stacks.rs` and `exact_reuse.rs`, its lines by `line_numbers.rs`), the
//!   subinterpreter cases (`subinterpreters.rs`) and asyncio's (`asyncio.rs`).

use std::{fs, time::Duration};

use pyperch_tests::*;
use serde_json::Value;

const RATE: &str = "999";
/// Least CPU time (s) a thread must get for its check to prove something: about 40 samples
/// at `RATE` (the machine may be loaded: nine spinning threads share one GIL).
const MIN_CPU: f64 = 0.04;
/// Seconds the spinning scenarios run once told to go.
const SECONDS: f64 = 3.0;

/// A workload of `cpython_inspection.py` running `scenario`.
struct Scenario {
    w: Workload,
    /// What it wrote before "ready" (tids, ...).
    measured: Value,
}

fn spawn(label: &str, scenario: &str) -> Option<Scenario> {
    let py = python(label)?;
    let w = Workload::spawn(&py, "cpython_inspection.py", &[scenario, "{dir}/result.json", &SECONDS.to_string(), "{dir}/go"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let measured = w.read_json("result.json").unwrap_or_else(|e| panic!("{e:#}"));
    Some(Scenario { w, measured })
}

impl Scenario {
    fn describe(&self) -> String {
        self.w.python.describe()
    }

    fn tid(&self, name: &str) -> u64 {
        self.measured["tids"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: the workload recorded no tid for {name}: {}", self.describe(), self.measured))
    }

    /// `(scenario, what CPython reports: handling an exception)`, as the workload lists them.
    fn handling(&self) -> Vec<(String, bool)> {
        self.measured["handling"]
            .as_object()
            .expect("handling")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bool().expect("bool")))
            .collect()
    }

    /// Records it with `args` from before the go file until its threads are done (the
    /// workload's "done"), then ends the recording with Ctrl-C. Returns the recording (not
    /// checked: an empty one writes no file) and the final measurements.
    fn record_run(&self, args: &[&str], env: &[(&str, &str)]) -> (Recording, Value) {
        let pid = self.w.pid.to_string();
        let mut all = vec!["--pid", &pid, "--rate", RATE, "--duration", "90", "--stats"];
        all.extend_from_slice(args);
        let rec = RecordRun::start_env(&all, env);
        assert!(rec.wait_until_sampling(Duration::from_secs(30)), "{}: pyperch did not start sampling", self.describe());
        fs::write(self.w.dir.host_path("go"), b"go").expect("cannot write the go file");
        let deadline = std::time::Instant::now() + Duration::from_secs_f64(SECONDS + 60.0);
        let measured = loop {
            if let Ok(v) = self.w.read_json("result.json") {
                if v["done"] == true {
                    break Some(v);
                }
            }
            if std::time::Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        std::thread::sleep(Duration::from_millis(300));
        let rec = rec.interrupt();
        let d = rec.diag_pid(self.w.pid);
        let measured = measured.unwrap_or_else(|| panic!("{}: the workload did not finish{d}", self.describe()));
        (rec, measured)
    }

    /// Runs `pyperch dump --json` on it.
    fn dump(&self) -> (Value, String) {
        let run = pyperch(&["dump", "--pid", &self.w.pid.to_string(), "--json"], Duration::from_secs(60));
        let d = run.diag();
        assert!(run.success(), "{}: pyperch dump failed{d}", self.describe());
        let dump: Value =
            serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{}: dump --json is not JSON: {e}{d}", self.describe()));
        (dump, d)
    }
}

fn thread_by_tid(dump: &Value, tid: u64) -> &Value {
    dump["threads"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["tid"].as_u64() == Some(tid)))
        .unwrap_or_else(|| panic!("thread {tid} is not in the dump:\n{dump:#}"))
}

/// `[function, file, line]` of every frame of a dumped thread, root first.
fn dumped_stack(thread: &Value) -> Vec<Value> {
    thread["stack"]
        .as_array()
        .map(|frames| frames.iter().map(|f| serde_json::json!([f["function"], f["file"], f["line"]])).collect())
        .unwrap_or_default()
}

/// Samples of `profile` in the scenario `name`'s own work (`busy`'s spin, where the workload
/// asserts what `sys.exc_info()` says). Not its wait for the go file: `os.path.exists` runs
/// an `except` block of its own whenever the file is missing.
fn scenario_samples(profile: &Profile, name: &str) -> u64 {
    profile.count(|s| s.has_function(name) && s.has_function("busy") && !s.has_function("wait_for_go"))
}

/// CPython: `TestExceptionDetectionScenarios` (`test_except_block_has_exception`,
/// `test_finally_propagating_has_exception`, `test_finally_after_except_no_exception`,
/// `test_finally_no_exception_no_flag`), `TestDetectionOfThreadStatus`'s
/// `test_thread_status_exception_mode_filtering` (the normal thread filtered out), and the
/// generator cases `test_outer_handler_while_generator_runs` and
/// `test_outer_handler_while_nested_generators_run` (nine generators deep), plus a generator
/// handling its own exception (kept) and one suspended inside its `except` block while the
/// thread runs on (not the thread's exception: dropped).
/// In `--mode exception`, each handling scenario keeps at least half the samples its CPU time
/// calls for; the others keep none, and --stats counts the dropped samples.
/// `env`: for pyperch (`PYPERCH_KERNEL_WALK=bounded`: the kernel walk without `bpf_loop`).
fn exception_mode(label: &str, env: &[(&str, &str)]) {
    let Some(s) = spawn(label, "exceptions") else { return };
    let describe = format!("{} {env:?}", s.describe());
    let (rec, m) = s.record_run(&["--mode", "exception"], env);
    rec.assert_ok();
    let d = rec.diag_pid(s.w.pid);
    let profile = rec.profile.for_pid(s.w.pid);
    for (name, handling) in s.handling() {
        let samples = scenario_samples(&profile, &name);
        let cpu = json_f64(&m, &["cpu", &name]).unwrap_or_else(|e| panic!("{e:#}"));
        note(format!("{describe}: {name} (handling: {handling}) ran {cpu:.2} s; {samples} exception-mode samples"));
        assert!(cpu > MIN_CPU, "{describe}: {name} hardly ran ({cpu:.2} s): the check would prove nothing{d}");
        if handling {
            // At 999 Hz a thread gets about 1000 samples per CPU second; half is a wide margin.
            assert!(
                samples as f64 >= cpu * 500.0,
                "{describe}: {name} handles an exception for {cpu:.2} s of CPU but has only {samples} exception-mode samples{d}"
            );
        } else {
            assert_eq!(samples, 0, "{describe}: {name} handles no exception but has {samples} exception-mode samples{d}");
        }
    }
    assert!(
        rec.run.stderr.contains("samples of threads not handling an exception dropped"),
        "{describe}: --stats does not count the dropped samples{d}"
    );
}

// Side by side (three interpreters at once): each check is against the thread's own CPU time
// (samples per CPU second, half the rate as the margin) or is zero samples.
#[test]
fn exception_mode_3_9_3_12_sid_3_15() {
    side_by_side(&["3.9", "3.12", "sid-3.15"], 3, |label| {
        exception_mode(label, &[])
    });
}

/// The same with the kernel walk for kernels without `bpf_loop` (its bounded loop).
#[test]
fn exception_mode_bounded_walk_3_12() {
    exception_mode("3.12", &[("PYPERCH_KERNEL_WALK", "bounded")]);
}

/// CPython: `test_thread_status_exception_detection` and the scenarios of
/// `TestExceptionDetectionScenarios` and the generator cases, as a status at one moment:
/// `pyperch dump` says "handling an exception" of exactly the threads parked in a scenario
/// CPython flags "has exception" (JSON `handling_exception`, and the text form).
fn exception_status_dump(label: &str) {
    let Some(s) = spawn(label, "exceptions_hold") else { return };
    let describe = s.describe();
    let (dump, d) = s.dump();
    for (name, handling) in s.handling() {
        let thread = thread_by_tid(&dump, s.tid(&name));
        assert_eq!(
            thread["handling_exception"].as_bool(),
            Some(handling),
            "{describe}: {name} should be handling an exception: {handling}{d}"
        );
    }
    let text = pyperch(&["dump", "--pid", &s.w.pid.to_string()], Duration::from_secs(60));
    let td = text.diag();
    assert!(text.success(), "{describe}: text dump failed{td}");
    let line_of = |name: &str| {
        let tid = s.tid(name);
        text.stdout
            .lines()
            .find(|l| l.starts_with(&format!("Thread {tid} ")))
            .unwrap_or_else(|| panic!("{describe}: no line for thread {tid} ({name}){td}"))
            .to_string()
    };
    assert!(line_of("except_block").contains("handling an exception"), "{describe}: except_block{td}");
    assert!(!line_of("normal_thread").contains("handling an exception"), "{describe}: normal_thread{td}");
}

// Side by side: a status at one moment, whatever CPU the threads get.
#[test]
fn exception_status_dump_3_9_3_12_sid_3_15() {
    side_by_side(&["3.9", "3.12", "sid-3.15"], 3, |label| {
        exception_status_dump(label)
    });
}

/// Past the bound (no CPython case: CPython walks the whole chain): a thread handling an
/// exception under 600 nested generators has a chain longer than pyperch follows (512 items,
/// `profiler_common::MAX_EXCEPTION_ITEMS`). pyperch cannot tell, so it keeps none of those
/// samples and counts them in --stats (a sample of a thread that may handle nothing is worse
/// than a dropped one); `dump` gives no answer for that thread.
fn chain_past_the_bound(label: &str, env: &[(&str, &str)]) {
    let Some(s) = spawn(label, "too_long") else { return };
    let describe = format!("{} {env:?}", s.describe());
    let (dump, dd) = s.dump();
    let thread = thread_by_tid(&dump, s.tid("too_long"));
    assert!(thread.get("handling_exception").is_none(), "{describe}: dump must not tell for a chain past the bound{dd}");
    let (rec, m) = s.record_run(&["--mode", "exception"], env);
    let d = rec.diag_pid(s.w.pid);
    // Every sample is dropped: the profile is empty, and pyperch says so (no file written).
    assert!(!rec.run.timed_out() && rec.run.success(), "{describe}: pyperch record failed{d}");
    let cpu = json_f64(&m, &["cpu", "too_long"]).unwrap_or_else(|e| panic!("{e:#}"));
    let kept = scenario_samples(&rec.profile, "too_long");
    let dropped = rec
        .run
        .stderr
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("dropped, ")?.1.split_once("dropped, ")?;
            rest.strip_suffix(" items dropped")?.split_whitespace().next()?.parse::<u64>().ok()
        })
        .unwrap_or(0);
    note(format!("{describe}: too_long ran {cpu:.2} s; {kept} samples kept, {dropped} counted as past the bound"));
    assert_eq!(kept, 0, "{describe}: samples past the bound kept{d}");
    assert!(cpu > MIN_CPU, "{describe}: too_long hardly ran ({cpu:.2} s){d}");
    assert!(dropped as f64 >= cpu * 500.0, "{describe}: {dropped} samples counted as past the bound for {cpu:.2} s of CPU{d}");
}

// Side by side (three interpreters at once): each check is against the thread's own CPU time
// (samples per CPU second, half the rate as the margin) or is zero samples.
#[test]
fn chain_past_the_bound_3_9_3_12_sid_3_15() {
    side_by_side(&["3.9", "3.12", "sid-3.15"], 3, |label| {
        chain_past_the_bound(label, &[])
    });
}

#[test]
fn chain_past_the_bound_bounded_walk_3_12() {
    chain_past_the_bound("3.12", &[("PYPERCH_KERNEL_WALK", "bounded")]);
}

/// CPython: `test_remote_stack_trace` (bar -> baz -> foo in a thread, read from another
/// process), `test_only_active_thread` (three workers asleep, the main thread busy: it alone
/// holds the GIL), `test_thread_status_detection` and `test_thread_status_gil_detection`
/// (the busy thread on a CPU holding the GIL, the sleepers neither), plus the stack
/// scenarios: a frame inside an `except` block, a thread blocked on a lock, one asleep 300
/// frames down a recursion; all after `import ctypes` (`test_self_trace_after_ctypes_import`). `pyperch dump`: every blocked thread's stack equals the
/// interpreter's own view (`sys._current_frames()`), frame for frame; kernel states; the GIL.
fn stacks_dump(label: &str) {
    let Some(s) = spawn(label, "stacks") else { return };
    let describe = s.describe();
    // The main thread prints "ready" and only then spins: give the others time to let go of
    // the GIL.
    std::thread::sleep(Duration::from_millis(300));
    let (dump, d) = s.dump();
    for name in ["foo", "asleep_in_except", "blocked_on_lock", "recurse"] {
        let want = s.measured["stacks"][name].as_array().unwrap_or_else(|| panic!("no stack for {name}")).clone();
        let thread = thread_by_tid(&dump, s.tid(name));
        assert_eq!(dumped_stack(thread), want, "{describe}: stack of the {name} thread{d}");
    }
    let names = |name: &str| -> Vec<String> {
        dumped_stack(thread_by_tid(&dump, s.tid(name)))
            .iter()
            .map(|f| f[0].as_str().unwrap_or("").rsplit('.').next().unwrap_or("").to_string())
            .collect()
    };
    let foo = names("foo");
    assert!(foo.ends_with(&["bar".into(), "baz".into(), "foo".into()]), "{describe}: bar -> baz -> foo: {foo:?}{d}");
    assert_eq!(names("recurse").iter().filter(|n| *n == "recurse").count(), 301, "{describe}: recurse(300) .. recurse(0){d}");
    let in_except = thread_by_tid(&dump, s.tid("asleep_in_except"));
    assert_eq!(in_except["handling_exception"], true, "{describe}: asleep in an except block{d}");
    assert_eq!(thread_by_tid(&dump, s.tid("foo"))["handling_exception"], false, "{describe}: foo{d}");

    let locked = thread_by_tid(&dump, s.tid("blocked_on_lock"));
    assert_eq!(locked["activity"], "waiting", "{describe}: blocked_on_lock{d}");
    assert_eq!(locked["syscall"], "futex", "{describe}: blocked_on_lock{d}");
    for name in ["foo", "worker_0", "worker_1", "worker_2"] {
        let t = thread_by_tid(&dump, s.tid(name));
        assert_eq!(t["activity"], "sleeping", "{describe}: {name} asleep{d}");
        assert_eq!(t["holds_gil"], false, "{describe}: {name} holds no GIL{d}");
    }
    let main = s.measured["main"].as_u64().expect("main tid");
    let main_thread = thread_by_tid(&dump, main);
    assert_eq!(main_thread["main"], true, "{describe}{d}");
    let leaf = dumped_stack(main_thread).last().cloned().unwrap_or_default();
    assert_eq!(leaf[0], "main_work", "{describe}: the main thread's leaf{d}");
    // test_only_active_thread: exactly one GIL holder, the busy main thread.
    assert_eq!(dump["gil_holder"].as_u64(), Some(main), "{describe}: GIL holder{d}");
    let holders = dump["threads"].as_array().expect("threads").iter().filter(|t| t["holds_gil"] == true).count();
    assert_eq!(holders, 1, "{describe}: one GIL holder{d}");
}

#[test]
fn stacks_dump_3_9() {
    stacks_dump("3.9");
}

#[test]
fn stacks_dump_3_12() {
    stacks_dump("3.12");
}

#[test]
fn stacks_dump_sid_3_15() {
    stacks_dump("sid-3.15");
}

/// CPython: `test_thread_status_detection` / `test_thread_status_gil_detection` /
/// `test_thread_status_all_mode_detection` and `test_only_active_thread` as profiles of the
/// stacks scenario: in `--mode cpu` and `--mode gil` every sample is the busy main thread's
/// (the sleepers are neither on a CPU nor GIL holders); in `--mode wall` the sleepers are
/// there too, each with its whole stack over an off-CPU leaf (bar -> baz -> foo, the frame
/// in the except block, the lock, 300 frames of recursion).
fn stacks_modes(label: &str) {
    let Some(s) = spawn(label, "stacks") else { return };
    let describe = s.describe();
    let pid = s.w.pid.to_string();
    for mode in ["cpu", "gil"] {
        let rec = record(&["--pid", &pid, "--mode", mode, "--rate", RATE, "--duration", "2", "--threads"]);
        rec.assert_ok();
        let d = rec.diag_pid(s.w.pid);
        let profile = rec.profile.for_pid(s.w.pid);
        let busy = profile.count(|st| st.has_function("main_work"));
        note(format!("{describe}: --mode {mode}: {} samples, {busy} of main_work", profile.total()));
        assert!(busy >= 100, "{describe}: --mode {mode}: only {busy} samples of the busy thread{d}");
        for name in ["foo", "asleep_in_except", "blocked_on_lock", "recurse", "worker_thread"] {
            assert_eq!(profile.with_function(name), 0, "{describe}: --mode {mode}: samples of the sleeping {name}{d}");
        }
    }
    let rec = record(&["--pid", &pid, "--mode", "wall", "--rate", RATE, "--duration", "2", "--threads"]);
    rec.assert_ok();
    let d = rec.diag_pid(s.w.pid);
    let profile = rec.profile.for_pid(s.w.pid);
    for name in ["foo", "asleep_in_except", "blocked_on_lock", "recurse", "worker_thread"] {
        // Values are nanoseconds in wall mode.
        let off_cpu = profile.count(|st| st.has_function(name) && st.frames.last().is_some_and(|f| f.starts_with("<off-cpu")));
        note(format!("{describe}: --mode wall: {name} has {:.3} s off the CPU", off_cpu as f64 / 1e9));
        assert!(off_cpu > 0, "{describe}: --mode wall: no off-CPU time of the blocked {name}{d}");
    }
    let chain = profile.count(|st| {
        let names: Vec<String> = st
            .python_frames()
            .iter()
            .filter(|f| !f.name.starts_with('<'))
            .map(|f| f.name.rsplit('.').next().unwrap_or("").to_string())
            .collect();
        names.ends_with(&["bar".into(), "baz".into(), "foo".into()])
    });
    assert!(chain > 0, "{describe}: --mode wall: no bar -> baz -> foo stack{d}");
    let deep = profile.count(|st| st.python_frames().iter().filter(|f| f.is("recurse")).count() == 301);
    assert!(deep > 0, "{describe}: --mode wall: no stack with all 301 recurse frames{d}");
}

// Side by side (three interpreters at once): at least 100 of the busy thread's ~2,000 samples,
// none of the sleepers', and the sleepers' presence in wall mode, whatever CPU each gets.
#[test]
fn stacks_modes_3_9_3_12_sid_3_15() {
    side_by_side(&["3.9", "3.12", "sid-3.15"], 3, |label| stacks_modes(label));
}
