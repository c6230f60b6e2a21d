//! `cargo xtask bench [-- DRIVER-OPTIONS]`: pyperch side by side with py-spy, Austin and
//! CPython's own sampling profiler, on this machine, in one run.
//!
//! 1. `cargo xtask setup` (idempotent), then `cargo build --release -p profiler-user`.
//! 2. The peers, in a virtual environment at `$HOME/.cache/pyperch/bench-venv`:
//!    `pip install 'py-spy==0.4.*' 'austin-dist==3.7.0'` (only when they are missing;
//!    Austin 4.x needs a newer glibc than Debian 12's).
//! 3. The Debian sid root filesystem (`$HOME/.cache/pyperch/sid-rootfs`, or
//!    `$PYPERCH_SID_ROOTFS`), where CPython 3.15 and its `profiling.sampling` live; when it is
//!    missing the CPython-profiler column is skipped (`cargo xtask test` builds it).
//! 4. `bench/driver.py` (stdlib Python 3.9+, run as root; it runs the package
//!    `bench/pyperch_bench`, whose unit tests `cargo xtask test` runs), which runs every case and writes
//!    `BENCHMARKS.md` and `bench/results.json`. Options after `--` go to the driver
//!    (`cargo xtask bench -- --help`, `-- --quick` for a short trial run).
//!
//! The `native` section (`-- --only native`) runs pyperch `--native` beside `py-spy --native`
//! and pyperch `--kernel` beside plain pyperch, and reports ring-buffer bytes per sample and
//! losses at 1 and 10 kHz.
//!
//! The `parts` section (`-- --only parts`, `bench/pyperch_bench/walk_parts.py`) times the sampling program
//! part by part (stopped after each part with `PYPERCH_BENCH_STOP_AFTER`, test-only), and
//! `idlehost` the early exit for unregistered processes and pyperch's CPU per second on a
//! whole host with 50 idle Python processes.
//!
//! The `startup` section (`-- --only startup`, `bench/pyperch_bench/first_contact.py`) measures short
//! programs beside `py-spy record`: start-up CPU, time to first sample after the program's
//! first line, and samples kept during a loop of imports.
//!
//! The `storms` section (`-- --only storms`, `bench/pyperch_bench/storms.py`, issue #33)
//! measures pyperch under `--max-cpu 2` beside an unbudgeted pyperch and py-spy in four
//! storms (500 threads switching, a non-Python switch storm, 1,000 short-lived Python
//! processes a minute, 500 CPU-bound threads), the cost per sample with 8 vs 500 threads and
//! `dump` of 500 threads.
//!
//! See `bench/README.md` for what is measured and how to read the results.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{Paths, build, is_root, run_checked};

const PY_SPY_SPEC: &str = "py-spy==0.4.*";
const AUSTIN_SPEC: &str = "austin-dist==3.7.0";

fn say(msg: impl std::fmt::Display) {
    println!("[xtask bench] {msg}");
}

/// The first line of `PROGRAM ARGS...`'s standard output (or error), if it runs.
fn output_line(program: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

/// A Python 3.9+ to run the driver (stdlib only): the system one first.
fn driver_python() -> Result<PathBuf> {
    let candidates = ["/usr/bin/python3", "/usr/local/bin/python3", "python3"];
    for c in candidates {
        let p = PathBuf::from(c);
        if let Some(v) = output_line(
            &p,
            &["-c", "import sys; print('%d %d' % sys.version_info[:2])"],
        ) {
            let mut it = v.split_whitespace().filter_map(|x| x.parse::<u32>().ok());
            match (it.next(), it.next()) {
                (Some(3), Some(minor)) if minor >= 9 => return Ok(p),
                _ => {}
            }
        }
    }
    bail!("the benchmark driver needs Python 3.9 or newer as python3 (with the venv module)")
}

/// py-spy 0.4 and Austin 3.7 in `venv`, installed only when missing.
fn ensure_peers(python: &Path, venv: &Path) -> Result<()> {
    let bin = venv.join("bin");
    if !bin.join("python").is_file() {
        say(format!(
            "peers: creating the virtual environment {}",
            venv.display()
        ));
        if let Some(parent) = venv.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        run_checked(
            Command::new(python).args(["-m", "venv"]).arg(venv),
            "creating the benchmark venv",
        )?;
    }
    let py_spy = output_line(&bin.join("py-spy"), &["--version"]);
    let austin = output_line(&bin.join("austin"), &["--version"]);
    let py_spy_ok = py_spy
        .as_deref()
        .is_some_and(|v| v.starts_with("py-spy 0.4."));
    let austin_ok = austin.as_deref().is_some_and(|v| v.contains("3.7.0"));
    if py_spy_ok && austin_ok {
        say(format!(
            "peers: present ({}, {})",
            py_spy.unwrap_or_default(),
            austin.unwrap_or_default()
        ));
        return Ok(());
    }
    say(format!(
        "peers: pip install '{PY_SPY_SPEC}' '{AUSTIN_SPEC}' into {}",
        venv.display()
    ));
    run_checked(
        Command::new(bin.join("pip")).args(["install", "--quiet", PY_SPY_SPEC, AUSTIN_SPEC]),
        "installing py-spy and Austin",
    )?;
    for (tool, want) in [("py-spy", "py-spy 0.4."), ("austin", "3.7.0")] {
        match output_line(&bin.join(tool), &["--version"]) {
            Some(v) if v.contains(want) => say(format!("peers: {v}")),
            other => bail!("{tool} was installed but `{tool} --version` says {other:?}"),
        }
    }
    Ok(())
}

/// The benchmark package's unit tests (`bench/tests`: its parsers, accuracy, ratios and the
/// report's table; no profiler runs): part of `cargo xtask test`'s unit tests.
pub fn unit_tests(p: &Paths) -> Result<ExitStatus> {
    let python = driver_python()?;
    crate::step(format!(
        "test: benchmark unit tests ({} -m unittest discover -s bench/tests -t bench)",
        python.display()
    ));
    crate::status_of(
        Command::new(&python)
            .args(["-B", "-m", "unittest", "discover", "-s", "bench/tests", "-t", "bench"])
            .current_dir(&p.root),
        "running the benchmark's unit tests",
    )
}

pub fn run(p: &Paths, args: &[String]) -> Result<()> {
    if !is_root() {
        bail!(
            "`cargo xtask bench` must run as root: pyperch loads eBPF programs, and the peers attach with ptrace"
        );
    }
    let (root, cache) = (&p.root, &p.cache);

    // 1. Build pyperch (after the idempotent set-up of its build tools).
    let pyperch = build(p)?;

    // 2. The peers.
    let python = driver_python()?;
    let venv = cache.join("bench-venv");
    ensure_peers(&python, &venv)?;

    // 3. The sid root filesystem for CPython 3.15 and its own profiler.
    let rootfs = match env::var_os("PYPERCH_SID_ROOTFS").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => cache.join("sid-rootfs"),
    };
    let rootfs_arg = if rootfs.join("usr/bin/python3.15").exists() {
        say(format!(
            "sid rootfs: {} (CPython 3.15 present)",
            rootfs.display()
        ));
        rootfs.display().to_string()
    } else {
        say(format!(
            "sid rootfs: {} has no usr/bin/python3.15; the CPython-profiler column is skipped (`cargo xtask test` builds the rootfs)",
            rootfs.display()
        ));
        String::new()
    };

    // 4. numpy for the native section's native-heavy workload (issue #31).
    let numpy_venv = crate::fixtures::setup_numpy_venv(p);

    // 5. The driver.
    let mut command_line = String::from("cargo xtask bench");
    if !args.is_empty() {
        command_line.push_str(" -- ");
        command_line.push_str(&args.join(" "));
    }
    let driver = root.join("bench/driver.py");
    say(format!("driver: {} {}", python.display(), driver.display()));
    let mut driver_command = Command::new(&python);
    if let Some(venv) = &numpy_venv {
        driver_command.env("PYPERCH_NUMPY_VENV", venv);
    }
    run_checked(
        driver_command
            .arg(&driver)
            .arg("--pyperch")
            .arg(&pyperch)
            .arg("--venv")
            .arg(&venv)
            .arg("--rootfs")
            .arg(&rootfs_arg)
            .arg("--command")
            .arg(&command_line)
            .args(args)
            .current_dir(&root),
        "the benchmark driver (bench/driver.py)",
    )?;
    say("done");
    Ok(())
}
