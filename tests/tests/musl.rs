//! CPython linked against musl (as in Alpine images): an interpreter built by hand, taken
//! from `PYPERCH_MUSL_PYTHON` (its libpython shared, as Alpine's is); each test says plainly
//! that it did not run where it is unset.
//!
//! What issue #31 asks of musl targets (workloads/native_libc.py, whose functions report the
//! lines they run, as the interpreter sees them):
//! - plain `record`: every sample in `inner` holds exactly the workload's stack,
//!   `<module>` → main → run_chain → outer → middle → inner, each frame on its own line;
//! - `record --native`, with the kernel walk and with `--native-walk copy`: libpython's C
//!   frames merged between the Python ones (`builtin_sum` under `sum_caller`'s line,
//!   `list_sort_impl` between `sort_caller` and its Python key function), the Python frames
//!   unchanged;
//! - musl's own code keeps next to no unwind tables (`.eh_frame` rows for four functions in
//!   Debian's musl 1.2.3): a native stack that reaches it stops there, and says so in musl's
//!   name, `<native unwind stopped in musl libc (no unwind tables)>`: at the leaf for a thread
//!   inside a system call (`os.read`, entered through musl's syscall code), at the root for
//!   every other stack (below `Py_BytesMain`, musl's `__libc_start_main`). Never the generic
//!   "without unwind rows", never a frame guessed inside musl.

use std::collections::BTreeMap;

use pyperch_tests::*;

const SCRIPT: &str = "native_libc.py";
/// How a native stack that reached musl's libc ends (profiler-user's `MUSL_STOP_MARKER`).
const MUSL_STOP: &str = "<native unwind stopped in musl libc (no unwind tables)>";
/// Markers that must not appear on a musl target's stacks: the generic stop for want of rows
/// (musl's stops name musl) and the copy's end (the workload's stacks fit the copy).
const NOT_ON_MUSL: [&str; 2] = ["<native unwind stopped in code without unwind rows>", "<truncated native>"];

/// The lines the workload reported (`{"lines": {function: line}}`).
fn reported_lines(w: &Workload, d: &str) -> BTreeMap<String, u32> {
    let result = w.read_json("out.json").unwrap_or_else(|e| panic!("{e:#}{d}"));
    result["lines"]
        .as_object()
        .map(|o| o.iter().filter_map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?))).collect())
        .unwrap_or_default()
}

/// The workload's own frames of a stack (`name (native_libc.py:LINE)`), root first.
fn script_frames(s: &Stack) -> Vec<PyFrame> {
    s.frames.iter().map(|f| PyFrame::parse(f)).filter(|f| f.file.ends_with(SCRIPT) && f.line.is_some()).collect()
}

/// The exact Python stack `functions` (root first) on the lines the workload reported.
fn expected(lines: &BTreeMap<String, u32>, functions: &[&str]) -> Vec<(String, u32)> {
    functions
        .iter()
        .map(|f| (f.to_string(), *lines.get(*f).unwrap_or_else(|| panic!("the workload reported no line for {f}: {lines:?}"))))
        .collect()
}

fn as_pairs(frames: &[PyFrame]) -> Vec<(String, u32)> {
    frames.iter().map(|f| (f.name.clone(), f.line.unwrap_or(0))).collect()
}

fn function(frame: &str) -> String {
    PyFrame::parse(frame).name
}

/// Plain `record`: the samples in `inner` (nearly all) hold exactly
/// `<module>;main;run_chain;outer;middle;inner`, each on the line the interpreter reported.
#[test]
fn musl_python_stacks_exact() {
    let Some(py) = musl_python() else { return };
    let mut w = Workload::spawn(&py, SCRIPT, &["chain", "{dir}/out.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rec = record(&["--pid", &pid, "--duration", "4", "--rate", "199", "--stats"]);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} {SCRIPT} chain failed: {status:?}{d}", py.describe());
    let lines = reported_lines(&w, &d);
    let want = expected(&lines, &["<module>", "main", "run_chain", "outer", "middle", "inner"]);
    let mine = rec.profile.for_pid(w.pid);
    let total = mine.total();
    let in_inner = mine.count(|s| s.leaf_is("inner"));
    let exact = mine.count(|s| s.leaf_is("inner") && s.python_frames().len() == want.len() && as_pairs(&script_frames(s)) == want);
    let wrong: Vec<String> = mine
        .stacks
        .iter()
        .filter(|s| s.leaf_is("inner") && !(s.python_frames().len() == want.len() && as_pairs(&script_frames(s)) == want))
        .map(|s| format!("{} x{}", s.frames.join(";"), s.count))
        .collect();
    note(format!("{}: {total} samples, {in_inner} in inner, {exact} exactly {want:?}", py.describe()));
    assert!(total >= 200, "{}: only {total} samples{d}", py.describe());
    assert!(in_inner * 10 >= total * 9, "{}: only {in_inner} of {total} samples in inner{d}", py.describe());
    assert!(wrong.is_empty(), "{}: samples in inner that are not exactly {want:?}:\n{}{d}", py.describe(), wrong.join("\n"));
}

/// `record --native` (with `walk`'s extra flags) of the `native` workload: libpython's
/// frames merged between the workload's Python frames, which stay exact; every stack that
/// reached musl's libc says so, in musl's name.
fn native_frames_merged(walk: &[&str]) {
    let Some(py) = musl_python() else { return };
    let mut w = Workload::spawn(&py, SCRIPT, &["native", "{dir}/out.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let mut args = vec!["--pid", &pid, "--native", "--duration", "6", "--rate", "199", "--stats"];
    args.extend_from_slice(walk);
    let rec = record(&args);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} {SCRIPT} native failed: {status:?}{d}", py.describe());
    let lines = reported_lines(&w, &d);
    let mine = rec.profile.for_pid(w.pid);
    let what = format!("{} --native {}", py.describe(), walk.join(" "));

    // sum(range(...)): libpython's builtin_sum right under sum_caller's line.
    let sum_stack = expected(&lines, &["<module>", "main", "run_native", "sum_caller"]);
    let under_sum = |s: &Stack| script_frames(s).last().is_some_and(|f| f.is("sum_caller"));
    let sum_total = mine.count(under_sum);
    let sum_placed = mine.count(|s| {
        let Some(at) = s.frames.iter().rposition(|f| PyFrame::parse(f).is("sum_caller")) else { return false };
        as_pairs(&script_frames(s)) == sum_stack && s.frames.get(at + 1).is_some_and(|f| function(f).starts_with("builtin_sum"))
    });
    // sorted(..., key=sort_key): libpython's list sort between the caller and the key.
    let mut sort_stack = expected(&lines, &["<module>", "main", "run_native_sort", "sort_caller"]);
    sort_stack[2].0 = "run_native".into();
    let key_total = mine.count(|s| s.has_function("sort_key"));
    let key_placed = mine.count(|s| {
        let frames = script_frames(s);
        let (Some(caller), Some(key)) = (
            s.frames.iter().position(|f| PyFrame::parse(f).is("sort_caller")),
            s.frames.iter().position(|f| PyFrame::parse(f).is("sort_key")),
        ) else {
            return false;
        };
        frames.len() == 5
            && as_pairs(&frames[..4]) == sort_stack
            && caller < key
            && s.frames[caller + 1..key].iter().any(|f| function(f) == "list_sort_impl")
    });
    // Every stack stops in musl's libc (at its root, or at its leaf where the sample was
    // taken in musl's code) and says so, but those unmerged and those taken before the
    // process's files were read.
    let loading = mine.count(|s| s.frames.iter().any(|f| f == "<loading native>"));
    let musl_marked = mine.count(|s| s.frames.iter().any(|f| f == MUSL_STOP));
    let at_root = mine.count(|s| s.frames.get(1).is_some_and(|f| f == MUSL_STOP));
    let unmerged = mine.count(|s| s.frames.iter().any(|f| f == "<unmerged native>"));
    let not_on_musl: Vec<String> =
        mine.stacks.iter().filter(|s| s.frames.iter().any(|f| NOT_ON_MUSL.contains(&f.as_str()))).map(|s| s.frames.join(";")).collect();
    note(format!(
        "{what}: {} samples, {loading} behind <loading native>, {musl_marked} ending in musl's marker ({at_root} at the root), {unmerged} unmerged; builtin_sum under sum_caller in {sum_placed} of {sum_total}; list_sort_impl between sort_caller and sort_key in {key_placed} of {key_total}",
        mine.total()
    ));
    assert!(sum_total >= 100, "{what}: only {sum_total} samples under sum_caller{d}");
    assert!(key_total >= 10, "{what}: only {key_total} samples in sort_key{d}");
    // The rest: samples taken inside musl's malloc and memcpy, whose stacks stop at the leaf.
    assert!(sum_placed * 10 >= sum_total * 7, "{what}: builtin_sum right under sum_caller's line {:?} in only {sum_placed} of {sum_total} samples{d}", sum_stack[3]);
    assert!(key_placed * 10 >= key_total * 7, "{what}: list_sort_impl between sort_caller and sort_key in only {key_placed} of {key_total} samples{d}");
    assert!(unmerged * 20 <= mine.total(), "{what}: {unmerged} of {} samples unmerged{d}", mine.total());
    assert!(loading * 10 <= mine.total(), "{what}: {loading} of {} samples behind <loading native>{d}", mine.total());
    assert!(
        musl_marked + unmerged + loading == mine.total(),
        "{what}: {} samples do not say where their native stack stopped{d}",
        mine.total() - musl_marked - unmerged - loading
    );
    assert!(at_root * 2 >= mine.total(), "{what}: only {at_root} of {} samples stop at the root in musl{d}", mine.total());
    assert!(not_on_musl.is_empty(), "{what}: stacks with {NOT_ON_MUSL:?}:\n{}{d}", not_on_musl.join("\n"));
}

#[test]
fn musl_native_frames_merged_kernel_walk() {
    native_frames_merged(&[]);
}

#[test]
fn musl_native_frames_merged_copy() {
    native_frames_merged(&["--native-walk", "copy"]);
}

/// A thread reading /dev/zero a byte at a time (most of its CPU time inside `read`, entered
/// through musl's syscall code): its samples taken in the system call end at the leaf in
/// musl's marker and the musl function the walk stopped in, right under `read_caller`'s line; `--stats` counts the kernel walk's stops
/// as "in code without unwind rows", as for any file without rows.
fn stops_in_musl_say_so(walk: &[&str]) {
    let Some(py) = musl_python() else { return };
    let mut w = Workload::spawn(&py, SCRIPT, &["syscalls", "{dir}/out.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let mut args = vec!["--pid", &pid, "--native", "--duration", "5", "--rate", "199", "--stats"];
    args.extend_from_slice(walk);
    let rec = record(&args);
    let status = w.terminate();
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(status.is_some_and(|s| s.success()), "{} {SCRIPT} syscalls failed: {status:?}{d}", py.describe());
    let lines = reported_lines(&w, &d);
    let mine = rec.profile.for_pid(w.pid);
    let what = format!("{} --native {}", py.describe(), walk.join(" "));
    let reader = expected(&lines, &["<module>", "main", "run_syscalls", "read_caller"]);
    let under_reader = mine.count(|s| s.has_function("read_caller"));
    // Stopped at the leaf: the workload's exact frames, then musl's marker and the musl
    // function the walk stopped in, nothing else.
    let in_musl_libc = |f: &str| f.ends_with(" (libc.so)") || f.contains("ld-musl") || f.starts_with("libc.so+");
    let stopped_in_read = mine.count(|s| {
        let n = s.frames.len();
        n == reader.len() + 3 && s.frames[n - 2] == MUSL_STOP && in_musl_libc(&s.frames[n - 1]) && as_pairs(&script_frames(s)) == reader
    });
    let not_on_musl: Vec<String> =
        mine.stacks.iter().filter(|s| s.frames.iter().any(|f| NOT_ON_MUSL.contains(&f.as_str()))).map(|s| s.frames.join(";")).collect();
    note(format!("{what}: {under_reader} samples under read_caller, {stopped_in_read} stopped in musl's libc right under its line {:?}", reader[3]));
    assert!(under_reader >= 100, "{what}: only {under_reader} samples under read_caller{d}");
    assert!(stopped_in_read * 4 >= under_reader, "{what}: only {stopped_in_read} of {under_reader} samples end in {MUSL_STOP} under read_caller{d}");
    assert!(not_on_musl.is_empty(), "{what}: stacks with {NOT_ON_MUSL:?}:\n{}{d}", not_on_musl.join("\n"));
    if walk.is_empty() {
        // Counted in --stats as every walk's end is: "in code without unwind rows N".
        let counted = rec
            .run
            .stderr
            .lines()
            .find_map(|l| l.split("in code without unwind rows ").nth(1)?.split(';').next()?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        assert!(counted >= stopped_in_read, "{what}: --stats counts {counted} walks ended without unwind rows, fewer than {stopped_in_read}{d}");
    }
}

#[test]
fn musl_native_stops_in_libc_say_so_kernel_walk() {
    stops_in_musl_say_so(&[]);
}

#[test]
fn musl_native_stops_in_libc_say_so_copy() {
    stops_in_musl_say_so(&["--native-walk", "copy"]);
}
