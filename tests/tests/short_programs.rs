//! Short programs, whole: code objects that live for milliseconds (module bodies, class
//! bodies, the functions of a module dropped again) are named from the kernel's copy made at
//! sample time, so samples taken while a program imports are kept, and every frame shown is
//! one the program ran. The case stands for the measurement (a launched program that
//! imports 40 standard-library modules in a loop for a second: 57.6% of its samples dropped
//! as "bad code object"; py-spy drops none).

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use pyperch_tests::*;

/// A frame-object version (3.9, no `co_qualname`), 3.12 (`co_version`) and a 3.15 static build.
const VERSIONS: [&str; 3] = ["3.9", "3.12", "sid-3.15"];

/// Outcomes that lose a sample that ran Python code (pyperch's own list in `explain.rs`).
const DROPS: [&str; 6] = [
    "truncated (too deep)",
    "read fault (kernel)",
    "stale tail (completion did not validate)",
    "bad code object",
    "code object changed since the sample",
    "unknown process",
];

/// `pyperch record --format collapsed ARGS -- PYTHON SCRIPT SCRIPT_ARGS`.
fn launch(py: &Python, dir: &WorkDir, args: &[&str], script: &str, script_args: &[&str]) -> Recording {
    let output: PathBuf = dir.host_path("profile.collapsed");
    let mut cmd = Command::new(pyperch_bin());
    cmd.args(["record", "--format", "collapsed", "--output"]).arg(&output).args(args).arg("--");
    cmd.args(py.argv().into_iter().map(|a: OsString| a));
    cmd.arg(dir.guest_path(script));
    cmd.args(script_args.iter().map(|a| a.replace("{dir}", &dir.guest.to_string_lossy())));
    let run = Running::start(cmd).expect("cannot start pyperch").finish(Duration::from_secs(180));
    let collapsed = std::fs::read_to_string(&output).unwrap_or_default();
    let profile = Profile::parse(&collapsed);
    Recording { run, collapsed, profile, output }
}

/// The whole run's outcome counts from `--stats` (`<label>  <count> ( 12.3%)` lines before
/// the first process's section).
fn outcomes(stats: &str) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    for line in stats.lines() {
        let t = line.trim();
        if t.starts_with("process ") {
            break;
        }
        let Some(open) = t.strip_suffix("%)").and_then(|s| s.rfind('(')) else { continue };
        let Some((label, count)) = t[..open].trim_end().rsplit_once(char::is_whitespace) else { continue };
        if let Ok(n) = count.parse::<u64>() {
            all.insert(label.trim().to_string(), n);
        }
    }
    all
}

fn import_loop(label: &str) {
    let Some(py) = python(label) else { return };
    let dir = WorkDir::new(&py, "import_loop").unwrap_or_else(|e| panic!("{e:#}"));
    let rec = launch(&py, &dir, &["--rate", "999", "--stats"], "import_loop.py", &["3", "{dir}/imports.json"]);
    let d = rec.diag();
    assert_eq!(rec.run.code(), Some(0), "{}: pyperch or the workload failed{d}", py.describe());
    let text = std::fs::read_to_string(dir.host_path("imports.json")).unwrap_or_else(|e| panic!("no result: {e}{d}"));
    let result: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad result: {e}{d}"));
    // file → name → lines its code objects have.
    let mut codes: BTreeMap<String, BTreeMap<String, BTreeSet<u64>>> = BTreeMap::new();
    for (file, names) in result["codes"].as_object().into_iter().flatten() {
        for (name, lines) in names.as_object().into_iter().flatten() {
            let lines = lines.as_array().into_iter().flatten().filter_map(|l| l.as_u64()).collect();
            codes.entry(file.clone()).or_default().insert(name.clone(), lines);
        }
    }
    let counts = outcomes(&rec.run.stderr);
    let total: u64 = counts.values().sum();
    let dropped: u64 = DROPS.iter().map(|o| counts.get(*o).copied().unwrap_or(0)).sum();
    // Every frame shown is a code object of a module the process imported (or of the
    // script), on a line that code object has. Frames of `<string>` are the `exec` of the
    // site-packages' .pth lines at start-up, whose source is gone: only their name is known.
    let (mut frames, mut module_bodies, mut lineless) = (0u64, 0u64, 0u64);
    let mut wrong = Vec::new();
    for s in &rec.profile.stacks {
        let python = s.python_frames();
        for f in &python {
            if f.file.is_empty() {
                continue; // `<GC>` and the like: no code object.
            }
            frames += s.count;
            // Paths are shown shortened (below their sys.path entry): match by suffix.
            let suffix = format!("/{}", f.file);
            // `<string>` also holds namedtuple's `__new__`, made by `eval` of a lambda.
            let ran = if f.file == "<string>" {
                f.name == "<module>" || f.name == "<lambda>"
            } else if f.file == "<frozen getpath>" {
                // 3.11+: the interpreter runs the frozen getpath module while it starts (it
                // computes sys.path), before any import the workload can list; sampled from
                // the first instruction, a launch may catch it.
                f.name == "<module>"
            } else {
                let mut known = codes.iter().filter(|(file, _)| **file == f.file || file.ends_with(&suffix));
                match f.line {
                    Some(line) => known.any(|(_, names)| names.get(&f.name).is_some_and(|lines| lines.contains(&u64::from(line)))),
                    // A frame shown without its line (its offset past the line table's end, as
                    // CPython's own addr2line would say): the code object's name must be right.
                    None => {
                        let named = known.any(|(_, names)| names.contains_key(&f.name));
                        if named {
                            lineless += s.count;
                        }
                        named
                    }
                }
            };
            if !ran && wrong.len() < 20 {
                wrong.push(format!("{} ({}:{:?}) in {} x{}", f.name, f.file, f.line, s.frames.join(";"), s.count));
            }
        }
        if python.iter().any(|f| f.name == "<module>" && !f.file.ends_with("import_loop.py") && !f.file.starts_with('<')) {
            module_bodies += s.count;
        }
    }
    let pct = |n: u64| if total > 0 { 100.0 * n as f64 / total as f64 } else { 0.0 };
    note(format!(
        "{}: {} rounds; {total} samples, {dropped} dropped ({:.2}%); {module_bodies} samples inside a module's body; {frames} frames checked, {} not run, {lineless} without a line",
        py.describe(),
        result["rounds"],
        pct(dropped),
        wrong.len()
    ));
    assert!(lineless * 100 <= frames, "{}: {lineless} of {frames} frames shown without a line{d}", py.describe());
    assert!(wrong.is_empty(), "{}: frames the program did not run:\n{}{d}", py.describe(), wrong.join("\n"));
    assert!(total >= 200, "{}: too few samples ({total}){d}", py.describe());
    assert!(dropped * 100 <= total, "{}: {dropped} of {total} samples dropped (at most 1%): {counts:?}{d}", py.describe());
    assert!(module_bodies * 10 >= total, "{}: few samples inside module bodies ({module_bodies} of {total}){d}", py.describe());
}

/// The import loop on 3.9, 3.12 and 3.15: at most 1% of samples dropped, no frame it did
/// not run.
#[test]
fn short_programs_import_loop_whole() {
    side_by_side(&VERSIONS, 1, |label| import_loop(label));
}
