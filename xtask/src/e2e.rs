//! The end-to-end test files (`tests/tests/*.rs`), run by `cargo xtask test`.
//!
//! Each file is its own test binary, built once by `cargo test --no-run` and then run
//! directly with `--test-threads=1` (the tests in a file one after the other: most sample the
//! CPU). The files in [`SIDE_BY_SIDE`] run first, two files at a time; every other file then
//! runs alone, in name order. A file belongs in `SIDE_BY_SIDE` only when none of its
//! assertions depends on how much CPU its workloads or pyperch get (exactness, presence, a
//! minimum of samples far below what a shared CPU still gives, generous time-outs), and when
//! it neither records the whole host without a filter nor needs anything exclusive (fixed
//! ports, names or kernel state): whatever the other file runs beside it must not change its
//! outcome; the tests of such a file that do not qualify are named in [`ALONE_TESTS`] and run
//! in the alone phase. Each side-by-side file's output is kept and printed whole when it ends;
//! the time of each file is printed at the end.

use std::{
    collections::VecDeque,
    ffi::OsString,
    fs,
    io::{self, BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::{cargo, describe, step, warn};

/// The files run two at a time (see the module's comment for what qualifies one), the
/// longest first. Their longest waits are idle (the agent's outage and network faults, the
/// soak's fixed length), which is where running side by side saves the most.
pub(crate) const SIDE_BY_SIDE: [&str; 17] = [
    "agent",
    "soak",
    "agent_auth",
    "privileges",
    "bounded_walk",
    "bad_input",
    "hostile_text",
    "image",
    "line_numbers",
    "manifest",
    "otlp",
    "pprof_readers",
    "subinterpreters",
    "task_events",
    "threads",
    "viewers",
    "wheel",
];

/// Tests of a side-by-side file that run in the alone phase instead (by name prefix): the
/// agent's wall-mode tests check each interval's share of a measured wait.
const ALONE_TESTS: [(&str, &[&str]); 1] = [("agent", &["agent_wall_mode_"])];

/// The name prefixes of `file`'s tests that run alone (none for most files).
fn alone_tests(file: &str) -> &'static [&'static str] {
    ALONE_TESTS
        .iter()
        .find(|(f, _)| *f == file)
        .map_or(&[], |(_, prefixes)| prefixes)
}

/// How many side-by-side files run at once (the machine has 2 cores).
const AT_ONCE: usize = 2;

/// One test binary: the file's name (`tests/tests/NAME.rs`) and its executable.
struct Binary {
    name: String,
    exe: PathBuf,
}

/// How one file went.
struct Outcome {
    name: String,
    ok: bool,
    took: Duration,
    side_by_side: bool,
}

/// Builds the test binaries (`cargo test --release -p pyperch-tests --no-run`) and returns
/// them by file name.
fn build(root: &Path) -> Result<Vec<Binary>> {
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args([
            "test",
            "--release",
            "-p",
            "pyperch-tests",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| anyhow!("building the end-to-end tests: could not start cargo: {e}"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("building the end-to-end tests: no output from cargo"))?;
    let mut binaries = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        // The integration-test targets (the library's own unit-test binary has no tests).
        if !line.contains("\"reason\":\"compiler-artifact\"")
            || !line.contains("\"kind\":[\"test\"]")
        {
            continue;
        }
        let (Some(exe), Some(src)) = (
            json_string(&line, "executable"),
            json_string(&line, "src_path"),
        ) else {
            continue;
        };
        let src = PathBuf::from(src);
        let Some(name) = src.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        binaries.push(Binary {
            name,
            exe: PathBuf::from(exe),
        });
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!(
            "building the end-to-end tests failed ({})",
            describe(status)
        );
    }
    if binaries.is_empty() {
        bail!("cargo built no end-to-end test binaries");
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    binaries.dedup_by(|a, b| a.name == b.name);
    Ok(binaries)
}

/// The string value of `"key":"..."` in one line of cargo's JSON (paths: no escapes expected;
/// a value with any is skipped).
fn json_string<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let len = line[start..].find('"')?;
    let value = &line[start..start + len];
    (!value.contains('\\')).then_some(value)
}

/// Runs every end-to-end test file (see the module's comment) with `filters` (libtest
/// filters and flags) and `env` set (`None`: removed); true when all passed.
pub(crate) fn run(
    root: &Path,
    log_dir: &Path,
    env: &[(&str, Option<OsString>)],
    filters: &[OsString],
) -> Result<bool> {
    let binaries = build(root)?;
    let command = |b: &Binary, extra: &[OsString]| {
        let mut cmd = Command::new(&b.exe);
        // Where `cargo test` runs them: the package's directory.
        cmd.current_dir(root.join("tests"))
            .arg("--test-threads=1")
            .args(filters)
            .args(extra);
        for (key, value) in env {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        cmd
    };
    let (beside, alone): (Vec<&Binary>, Vec<&Binary>) = binaries
        .iter()
        .partition(|b| SIDE_BY_SIDE.contains(&b.name.as_str()));
    for name in SIDE_BY_SIDE {
        if !beside.iter().any(|b| b.name == name) {
            warn(format!(
                "tests/tests/{name}.rs is listed side by side but was not built"
            ));
        }
    }
    fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let outcomes = Mutex::new(Vec::new());

    step(format!(
        "test: {} end-to-end test files {AT_ONCE} at a time ({}), each file's output when it ends",
        beside.len(),
        beside
            .iter()
            .map(|b| b.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    // In the list's order: the longest first, so that the two lanes end close together.
    let mut beside = beside;
    beside.sort_by_key(|b| SIDE_BY_SIDE.iter().position(|n| *n == b.name));
    let queue = Mutex::new(beside.into_iter().collect::<VecDeque<_>>());
    let phase = Instant::now();
    thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| {
                loop {
                    let Some(b) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    let log = log_dir.join(format!("{}.log", b.name));
                    let start = Instant::now();
                    let skips: Vec<OsString> = alone_tests(&b.name)
                        .iter()
                        .flat_map(|prefix| ["--skip".into(), (*prefix).into()])
                        .collect();
                    let ok = run_logged(command(b, &skips), &log);
                    let took = start.elapsed();
                    let text = fs::read_to_string(&log).unwrap_or_default();
                    // One file's output at a time, whole.
                    let mut outcomes = outcomes.lock().unwrap();
                    let mut out = io::stdout().lock();
                    let _ = writeln!(
                        out,
                        "[xtask] tests/tests/{}.rs (side by side), {:.0} s, {}:\n{text}",
                        b.name,
                        took.as_secs_f64(),
                        match &ok {
                            Ok(true) => "passed".to_string(),
                            Ok(false) => "FAILED".to_string(),
                            Err(e) => format!("FAILED: {e:#}"),
                        }
                    );
                    let _ = out.flush();
                    outcomes.push(Outcome {
                        name: b.name.clone(),
                        ok: matches!(ok, Ok(true)),
                        took,
                        side_by_side: true,
                    });
                }
            });
        }
    });

    let side_by_side_took = phase.elapsed();
    let phase = Instant::now();
    // The side-by-side files' tests that run alone, then the other files.
    let mut alone: Vec<(&Binary, Vec<OsString>)> =
        alone.into_iter().map(|b| (b, Vec::new())).collect();
    for b in &binaries {
        let prefixes = alone_tests(&b.name);
        if prefixes.is_empty() || !SIDE_BY_SIDE.contains(&b.name.as_str()) {
            continue;
        }
        // Every other test of the file (already run) skipped by name.
        let mut skips = Vec::new();
        for name in list_tests(&command(b, &[]))? {
            if !prefixes.iter().any(|p| name.starts_with(p)) {
                skips.push("--skip".into());
                skips.push(name.into());
            }
        }
        alone.insert(0, (b, skips));
    }
    for (b, extra) in alone {
        step(format!(
            "test: tests/tests/{}.rs{}",
            b.name,
            if extra.is_empty() {
                ""
            } else {
                " (the tests that run alone)"
            }
        ));
        let start = Instant::now();
        let ok = match command(b, &extra).status() {
            Ok(status) => status.success(),
            Err(e) => {
                warn(format!("could not start {}: {e}", b.exe.display()));
                false
            }
        };
        outcomes.lock().unwrap().push(Outcome {
            name: b.name.clone(),
            ok,
            took: start.elapsed(),
            side_by_side: false,
        });
    }

    let alone_took = phase.elapsed();
    let outcomes = outcomes.into_inner().unwrap();
    let mut summary = format!(
        "test: end-to-end files by wall time ({:.0} s side by side, then {:.0} s alone)",
        side_by_side_took.as_secs_f64(),
        alone_took.as_secs_f64()
    );
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by_key(|o| std::cmp::Reverse(o.took));
    for o in &sorted {
        summary.push_str(&format!(
            "\n    {:>6.1} s  {}{}{}",
            o.took.as_secs_f64(),
            o.name,
            if o.side_by_side {
                " (side by side)"
            } else {
                ""
            },
            if o.ok { "" } else { "  FAILED" }
        ));
    }
    step(summary);
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok)
        .map(|o| o.name.as_str())
        .collect();
    if !failed.is_empty() {
        step(format!(
            "test: end-to-end files with failures: {}",
            failed.join(", ")
        ));
    }
    Ok(failed.is_empty())
}

/// The names of the tests `cmd` (a test binary with its filters) would run.
fn list_tests(cmd: &Command) -> Result<Vec<String>> {
    let mut list = Command::new(cmd.get_program());
    list.args(cmd.get_args())
        .args(["--list", "--format", "terse"])
        .stdin(Stdio::null());
    if let Some(dir) = cmd.get_current_dir() {
        list.current_dir(dir);
    }
    let out = list.output().with_context(|| {
        format!(
            "listing the tests of {}",
            cmd.get_program().to_string_lossy()
        )
    })?;
    if !out.status.success() {
        bail!(
            "listing the tests of {} failed ({})",
            cmd.get_program().to_string_lossy(),
            describe(out.status)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// Runs `cmd` with its stdout and stderr into `log`; whether it passed.
fn run_logged(mut cmd: Command, log: &Path) -> Result<bool> {
    let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = file.try_clone().context("duplicating the log file")?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .with_context(|| format!("starting {}", cmd.get_program().to_string_lossy()))?;
    Ok(status.success())
}
