//! `pip install pyperch`: the wheel `cargo xtask wheel` builds (`PYPERCH_WHEEL`, set by
//! `cargo xtask test`, which builds it first), installed offline into a fresh venv of the
//! system's Python, gives a `pyperch` command that profiles on its own: no other file of the
//! repository or the build is needed. `auditwheel show` agrees with the platform tag the
//! wheel's file name claims (`PYPERCH_AUDITWHEEL`: xtask's pinned auditwheel); the default
//! wheel is pyperch statically linked against musl, also tagged musllinux, and that claim is
//! checked here (no shared library, no versioned symbol, and it runs in an empty root).
//!
//! This stands for py-spy's `pip install py-spy` and Austin's `austin-dist` wheels: the way a
//! Python user gets a native profiler, with no compiler and no clone.
//!
//! Without `PYPERCH_WHEEL` (a direct `cargo test`) the tests skip and say so; with
//! `PYPERCH_WHEEL_ERROR` (xtask could not build or check the wheel) they fail with it.

use std::{
    env,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use pyperch_tests::*;

/// The wheel under test, or `None` (the test skips) when `PYPERCH_WHEEL` is not set.
fn wheel() -> Option<PathBuf> {
    if let Some(err) = env::var_os("PYPERCH_WHEEL_ERROR").filter(|e| !e.is_empty()) {
        panic!("cargo xtask could not build the wheel: {}", err.to_string_lossy());
    }
    match env::var_os("PYPERCH_WHEEL").filter(|w| !w.is_empty()) {
        Some(wheel) => {
            let wheel = PathBuf::from(wheel);
            assert!(wheel.is_file(), "PYPERCH_WHEEL={} does not exist", wheel.display());
            Some(wheel)
        }
        None => {
            skip("PYPERCH_WHEEL is not set (`cargo xtask test` builds the wheel and sets it; or `cargo xtask wheel`)");
            None
        }
    }
}

/// The wheel file name's fields: `pyperch-VERSION-PY-ABI-PLATFORM.whl` → (VERSION, the
/// platform tags PLATFORM joins with dots).
fn name_fields(wheel: &Path) -> (String, Vec<String>) {
    let name = wheel.file_name().and_then(|n| n.to_str()).expect("a UTF-8 wheel file name");
    let fields: Vec<&str> = name.strip_suffix(".whl").expect("a .whl file").split('-').collect();
    assert_eq!(fields.len(), 5, "{name} is not NAME-VERSION-PY-ABI-PLATFORM.whl");
    assert_eq!(fields[0], "pyperch", "the distribution is named pyperch");
    (fields[1].to_string(), fields[4].split('.').map(str::to_string).collect())
}

/// Runs `cmd` to completion within `timeout`.
fn run(cmd: Command, timeout: Duration) -> Run {
    Running::start(cmd).expect("cannot start the command").finish(timeout)
}

/// `PROGRAM ARG` to completion within 30 s.
fn run_with(program: &Path, arg: &str) -> Run {
    let mut cmd = Command::new(program);
    cmd.arg(arg);
    run(cmd, Duration::from_secs(30))
}

/// A scratch folder under the system temporary directory, removed unless the test failed.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = env::temp_dir().join("pyperch-tests").join(format!("{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("cannot create a scratch folder");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// The frame texts of every `<title>` of an SVG, read by the venv's Python's XML parser;
/// panics if the SVG does not parse.
fn svg_titles(python: &Path, svg: &Path, d: &str) -> Vec<String> {
    let script = "import sys, json, xml.etree.ElementTree as ET\n\
                  root = ET.parse(sys.argv[1]).getroot()\n\
                  print(json.dumps([e.text or '' for e in root.iter() if e.tag.endswith('title')]))\n";
    let out = Command::new(python).args(["-c", script]).arg(svg).output().expect("run the XML parser");
    assert!(out.status.success(), "the SVG does not parse as XML: {}{d}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("titles as JSON")
}

/// A fresh venv of the system's `python3` with the wheel installed from its file only
/// (`--no-index`: nothing from PyPI); returns the venv's folder.
fn venv_with_wheel(dir: &Path, wheel: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let mut create = Command::new("python3");
    create.args(["-m", "venv"]).arg(&venv);
    let made = run(create, Duration::from_secs(120));
    assert!(made.success(), "python3 -m venv failed{}", made.diag());
    let mut install = Command::new(venv.join("bin/python"));
    install
        .args(["-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check", "--quiet"])
        .arg(wheel);
    let installed = run(install, Duration::from_secs(120));
    assert!(installed.success(), "pip install of the wheel failed{}", installed.diag());
    venv
}

#[test]
fn wheel_installs_a_pyperch_command_that_profiles() {
    let Some(wheel) = wheel() else { return };
    if !is_root() {
        skip("profiling needs root");
        return;
    }
    let (version, _) = name_fields(&wheel);
    let dir = Scratch::new("wheel");
    let venv = venv_with_wheel(&dir.0, &wheel);
    let pyperch = venv.join("bin/pyperch");
    assert!(pyperch.is_file(), "the wheel installed no {}", pyperch.display());

    let shown = run_with(&pyperch, "--version");
    assert!(shown.success(), "pyperch --version failed{}", shown.diag());
    assert_eq!(shown.stdout.trim(), format!("pyperch {version}"), "--version names the wheel's version{}", shown.diag());
    let help = run_with(&pyperch, "--help");
    assert!(help.success() && help.stdout.contains("record"), "pyperch --help does not list `record`{}", help.diag());

    // The README's first profile: `pyperch record -o profile.svg -- python3 app.py`, with the
    // venv's own python3 and a workload whose hot function is known (launch.py: about 2 s in
    // launch_busy, then exit status 3).
    let script = dir.0.join("launch.py");
    fs::copy(workload_source("launch.py"), &script).expect("copy launch.py");
    let svg = dir.0.join("profile.svg");
    let mut record = Command::new(&pyperch);
    record
        .args(["record", "--duration", "30", "-o"])
        .arg(&svg)
        .arg("--")
        .arg(venv.join("bin/python3"))
        .arg(&script);
    let rec = run(record, Duration::from_secs(90));
    let d = rec.diag();
    assert_eq!(rec.code(), Some(3), "pyperch should end with the command and exit with its status 3{d}");
    let titles = svg_titles(&venv.join("bin/python3"), &svg, &d);
    assert!(
        titles.iter().any(|t| t.starts_with("launch_busy")),
        "the flame graph has no launch_busy frame ({} titles){d}",
        titles.len()
    );
}

/// `auditwheel show --json WHEEL` with `$PYPERCH_AUDITWHEEL`, or `None` (skip) when unset.
fn auditwheel_show(wheel: &Path) -> Option<serde_json::Value> {
    let Some(auditwheel) = env::var_os("PYPERCH_AUDITWHEEL").filter(|a| !a.is_empty()) else {
        skip("PYPERCH_AUDITWHEEL is not set (`cargo xtask test` sets it to its pinned auditwheel)");
        return None;
    };
    let mut show = Command::new(auditwheel);
    show.args(["show", "--json"]).arg(wheel);
    let shown = run(show, Duration::from_secs(120));
    assert!(shown.success(), "auditwheel show failed{}", shown.diag());
    Some(serde_json::from_str(&shown.stdout).unwrap_or_else(|e| panic!("auditwheel printed no JSON: {e}{}", shown.diag())))
}

#[test]
fn auditwheel_agrees_with_the_wheel_name() {
    let Some(wheel) = wheel() else { return };
    let Some(audit) = auditwheel_show(&wheel) else { return };
    let (_, claimed) = name_fields(&wheel);
    let tag = audit["overall_tag"].as_str().unwrap_or_else(|| panic!("auditwheel gave no overall_tag: {audit}"));
    note(format!("auditwheel: {} is consistent with {tag}", wheel.display()));
    assert!(
        claimed.iter().any(|c| c == tag),
        "auditwheel finds the wheel consistent with {tag}, but its name claims {}: {audit}",
        claimed.join(".")
    );
    // A musllinux claim holds only for a binary that needs nothing of any C library:
    // auditwheel analyses a wheel for one libc (glibc when it cannot tell), so it is checked
    // here: no shared library, no versioned symbol, and the binary runs where no C library
    // exists at all (an empty root).
    if claimed.iter().any(|c| c.starts_with("musllinux")) {
        for key in ["external_libs", "versioned_symbols"] {
            assert!(
                audit[key].as_object().is_some_and(|o| o.is_empty()),
                "the wheel claims musllinux but its binary needs {key} {}",
                audit[key]
            );
        }
        runs_in_an_empty_root(&wheel);
    }
}

/// The wheel's `pyperch` alone in an otherwise empty folder, run there with `chroot`: no
/// dynamic loader, no C library, no /proc. `--version` must answer.
fn runs_in_an_empty_root(wheel: &Path) {
    if !is_root() {
        skip("chroot needs root");
        return;
    }
    let dir = Scratch::new("wheel-empty-root");
    let extract = "import sys, zipfile\n\
                   z = zipfile.ZipFile(sys.argv[1])\n\
                   name = next(n for n in z.namelist() if n.endswith('.data/scripts/pyperch'))\n\
                   open(sys.argv[2], 'wb').write(z.read(name))\n";
    let bin = dir.0.join("pyperch");
    let mut unzip = Command::new("python3");
    unzip.args(["-c", extract]).arg(wheel).arg(&bin);
    let unzipped = run(unzip, Duration::from_secs(60));
    assert!(unzipped.success(), "cannot take pyperch out of the wheel{}", unzipped.diag());
    fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod pyperch");
    let mut chrooted = Command::new("chroot");
    chrooted.arg(&dir.0).args(["/pyperch", "--version"]);
    let shown = run(chrooted, Duration::from_secs(30));
    assert!(
        shown.success() && shown.stdout.starts_with("pyperch "),
        "the wheel's pyperch does not run in a root holding nothing else{}",
        shown.diag()
    );
}
