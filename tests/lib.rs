//! Shared helpers for pyperch's end-to-end tests.
//!
//! The binary under test is `$PYPERCH_BIN` (`cargo xtask test` sets it). The tests run real
//! CPython interpreters, found through a configurable list (see [`configured_pythons`]):
//!
//! - `PYPERCH_TEST_PYTHONS="LABEL=PATH,LABEL=chroot:ROOTFS:PATH,..."` replaces the whole
//!   default list, e.g. `3.8=/opt/py38/bin/python3.8,sid-3.14=chroot:/srv/sid:/usr/bin/python3.14`.
//!   A label ends in the `MAJOR.MINOR` version it runs.
//! - Otherwise: pyenv's newest `3.X.*` for X = 6…13 under `$PYENV_ROOT`, `$(pyenv root)`,
//!   `$HOME/.pyenv` or `/root/.pyenv` (labels `3.6` … `3.13`), plus Debian sid's
//!   `/usr/bin/python3.13`, `3.14`, `3.15` inside `$PYPERCH_SID_ROOTFS` (default
//!   `$HOME/.cache/pyperch/sid-rootfs`), run as `chroot ROOTFS /usr/bin/python3.X` (labels
//!   `sid-3.13`, `sid-3.14`, `sid-3.15`).
//!
//! A missing interpreter makes its test print `SKIP ...` on stderr and pass; it never fails.
//! Workloads (`tests/workloads/*.py`) are copied into a scratch directory that the interpreter
//! can see (under the rootfs's `/tmp/pyperch-tests/` for chroot ones).

use std::{
    collections::{BTreeMap, BTreeSet},
    env,
    ffi::OsString,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Read, Write},
    os::unix::{fs::PermissionsExt, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

// ---------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------

fn test_name() -> String {
    thread::current().name().unwrap_or("?").to_string()
}

/// Prints a note straight to the process's stderr, bypassing libtest's capture, so that
/// skips are visible in a normal `cargo test` run.
pub fn note(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "[{}] {msg}", test_name());
}

/// Prints `SKIP <test>: <reason>` (visible even when output is captured).
pub fn skip(reason: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "SKIP {}: {reason}", test_name());
}

/// Runs `check` on every item side by side, `at_once` at a time, each on a thread named after
/// the test (so `note` and `skip` still say which test speaks), and fails with every failed
/// item's message. Only for checks whose assertions do not depend on how much CPU the
/// recordings get (exactness, which processes a filter keeps, a minimum of samples far below
/// what a shared CPU still gives): side by side they cost less wall time and check the same.
pub fn side_by_side<T: Sync>(items: &[T], at_once: usize, check: impl Fn(&T) + Sync) {
    let name = test_name();
    let mut failures = Vec::new();
    for group in items.chunks(at_once.max(1)) {
        thread::scope(|scope| {
            let handles: Vec<_> = group
                .iter()
                .map(|item| {
                    let check = &check;
                    thread::Builder::new()
                        .name(name.clone())
                        .spawn_scoped(scope, move || check(item))
                        .expect("cannot start a test thread")
                })
                .collect();
            for handle in handles {
                if let Err(payload) = handle.join() {
                    let msg = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "(a panic without a message)".to_string());
                    failures.push(msg);
                }
            }
        });
    }
    assert!(failures.is_empty(), "{} of {} side-by-side checks failed:\n{}", failures.len(), items.len(), failures.join("\n\n"));
}

/// Sends `signal` to our own child, gives it `grace` to exit, then kills it; reaped either way.
pub fn stop_child(child: &mut Child, signal: libc::c_int, grace: Duration) {
    // SAFETY: plain kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

// ---------------------------------------------------------------------------------------
// The binary under test
// ---------------------------------------------------------------------------------------

/// `$PYPERCH_BIN`; panics with an explanation when it is not set or does not exist.
pub fn pyperch_bin() -> PathBuf {
    let bin = env::var_os("PYPERCH_BIN")
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "PYPERCH_BIN is not set: run the end-to-end tests with `cargo xtask test`, or set \
             PYPERCH_BIN to the absolute path of target/release/pyperch"
            )
        });
    let bin = PathBuf::from(bin);
    assert!(
        bin.is_file(),
        "PYPERCH_BIN={} does not exist (build it with `cargo xtask build`)",
        bin.display()
    );
    bin
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------
// Pythons
// ---------------------------------------------------------------------------------------

/// One configured interpreter (it may be missing on this machine).
#[derive(Clone, Debug)]
pub struct PythonSpec {
    /// `3.8`, `sid-3.14`, ...
    pub label: String,
    /// The executable: a host path, or a path inside `rootfs`.
    pub exe: PathBuf,
    /// Run as `chroot ROOTFS EXE` when set.
    pub rootfs: Option<PathBuf>,
}

/// An interpreter that exists here.
#[derive(Clone, Debug)]
pub struct Python {
    pub label: String,
    pub major: u32,
    pub minor: u32,
    pub exe: PathBuf,
    pub rootfs: Option<PathBuf>,
}

/// The labels every per-version test covers, in order.
pub const SUPPORTED_LABELS: [&str; 9] = [
    "3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "sid-3.13", "sid-3.14", "sid-3.15",
];

fn version_of_label(label: &str) -> Option<(u32, u32)> {
    let tail = label
        .rsplit(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    let mut it = tail.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

fn pyenv_root() -> Option<PathBuf> {
    if let Some(r) = env::var_os("PYENV_ROOT").filter(|r| !r.is_empty()) {
        return Some(PathBuf::from(r));
    }
    if let Ok(out) = Command::new("pyenv")
        .arg("root")
        .stderr(Stdio::null())
        .output()
    {
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !s.is_empty() {
            return Some(PathBuf::from(s));
        }
    }
    let home = env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv"));
    home.into_iter()
        .chain([PathBuf::from("/root/.pyenv")])
        .find(|p| p.join("versions").is_dir())
}

/// The root filesystem holding Debian sid's python3.13/3.14/3.15.
pub fn sid_rootfs() -> PathBuf {
    match env::var_os("PYPERCH_SID_ROOTFS").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/pyperch/sid-rootfs"),
    }
}

/// The newest `versions/3.MINOR.PATCH` of a pyenv root.
fn pyenv_version_dir(root: &Path, minor: u32) -> Option<PathBuf> {
    let prefix = format!("3.{minor}.");
    fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let patch: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((patch, e.path()))
        })
        .max_by_key(|(patch, _)| *patch)
        .map(|(_, p)| p)
}

/// The configured interpreters, available or not (see the module documentation).
pub fn configured_pythons() -> Vec<PythonSpec> {
    if let Some(list) = env::var_os("PYPERCH_TEST_PYTHONS").filter(|l| !l.is_empty()) {
        return list
            .to_string_lossy()
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .filter_map(|entry| {
                let Some((label, value)) = entry.split_once('=') else {
                    note(format!(
                        "PYPERCH_TEST_PYTHONS: ignoring `{entry}` (expected LABEL=PATH)"
                    ));
                    return None;
                };
                let (exe, rootfs) = match value
                    .strip_prefix("chroot:")
                    .and_then(|v| v.split_once(':'))
                {
                    Some((rootfs, exe)) => (PathBuf::from(exe), Some(PathBuf::from(rootfs))),
                    None => (PathBuf::from(value), None),
                };
                Some(PythonSpec {
                    label: label.trim().to_string(),
                    exe,
                    rootfs,
                })
            })
            .collect();
    }
    let mut specs = Vec::new();
    let root = pyenv_root();
    for minor in 6..=13u32 {
        let exe = match root.as_deref().and_then(|r| pyenv_version_dir(r, minor)) {
            Some(dir) => dir.join(format!("bin/python3.{minor}")),
            None => root
                .as_deref()
                .unwrap_or(Path::new("/root/.pyenv"))
                .join(format!("versions/3.{minor}.*/bin/python3.{minor}")),
        };
        specs.push(PythonSpec {
            label: format!("3.{minor}"),
            exe,
            rootfs: None,
        });
    }
    let rootfs = sid_rootfs();
    for minor in 13..=15u32 {
        specs.push(PythonSpec {
            label: format!("sid-3.{minor}"),
            exe: PathBuf::from(format!("/usr/bin/python3.{minor}")),
            rootfs: Some(rootfs.clone()),
        });
    }
    specs
}

impl PythonSpec {
    /// `Ok` when the interpreter can be run here, else why not.
    pub fn resolve(&self) -> Result<Python, String> {
        let (major, minor) = version_of_label(&self.label).ok_or_else(|| {
            format!(
                "label `{}` does not end in a MAJOR.MINOR version",
                self.label
            )
        })?;
        match &self.rootfs {
            None => {
                if !self.exe.is_file() {
                    return Err(format!("{} does not exist", self.exe.display()));
                }
            }
            Some(rootfs) => {
                let inside = rootfs.join(self.exe.strip_prefix("/").unwrap_or(&self.exe));
                if !rootfs.is_dir() {
                    return Err(format!(
                        "the rootfs {} does not exist (`cargo xtask test` builds it)",
                        rootfs.display()
                    ));
                }
                if !inside.exists() {
                    return Err(format!("{} does not exist", inside.display()));
                }
                if !is_root() {
                    return Err("running it under chroot needs root".into());
                }
            }
        }
        Ok(Python {
            label: self.label.clone(),
            major,
            minor,
            exe: self.exe.clone(),
            rootfs: self.rootfs.clone(),
        })
    }
}

/// The interpreter with this label, or `None` after printing a SKIP message.
pub fn python(label: &str) -> Option<Python> {
    if label == FT_3_14 {
        return free_threaded_python("PYPERCH_FT_PYTHON", 14);
    }
    if label == FT_GIL_3_14 {
        return free_threaded_python("PYPERCH_FT_PYTHON", 14).map(|py| Python { label: FT_GIL_3_14.to_string(), ..py });
    }
    let specs = configured_pythons();
    let Some(spec) = specs.iter().find(|s| s.label == label) else {
        skip(format!(
            "python {label} is not in the configured list (PYPERCH_TEST_PYTHONS)"
        ));
        return None;
    };
    match spec.resolve() {
        Ok(py) => Some(py),
        Err(why) => {
            skip(format!("python {label} is not available: {why}"));
            None
        }
    }
}

/// The label of the free-threaded 3.14 of `PYPERCH_FT_PYTHON` ([`free_threaded_python`]):
/// [`python`] takes it like any other label, so a per-version test runs on it too.
pub const FT_3_14: &str = "ft-3.14";

/// The same free-threaded 3.14 run with `PYTHON_GIL=1` ([`Python::command`] sets it): a
/// free-threaded build with a GIL, whose GIL-mode tests must pass as on a default build.
pub const FT_GIL_3_14: &str = "ft-3.14-gil";

/// A free-threaded interpreter (PEP 703), built by hand: no package these machines can
/// install ships one, and its source and build recipe are never part of this project. Taken
/// from the environment variable `var` (`PYPERCH_FT_PYTHON` for 3.14t; `PYPERCH_FT313_PYTHON`,
/// `PYPERCH_FT315_PYTHON`); `None` after a SKIP line that says the free-threaded tests did not
/// run. A variable that names an interpreter of another minor version, or one with a GIL, is
/// a mistake in the set-up: the test fails and says so.
pub fn free_threaded_python(var: &str, minor: u32) -> Option<Python> {
    let Some(exe) = env::var_os(var).filter(|p| !p.is_empty()).map(PathBuf::from) else {
        skip(format!(
            "{var} is not set: the free-threaded 3.{minor}t tests did not run (point it at a hand-built python3.{minor}t)"
        ));
        return None;
    };
    if !exe.is_file() {
        panic!("{var} names {}, which does not exist", exe.display());
    }
    let probe = Command::new(&exe)
        .args(["-c", "import sys, sysconfig; print(sys.version_info[0], sys.version_info[1], sysconfig.get_config_var('Py_GIL_DISABLED') or 0)"])
        .output()
        .unwrap_or_else(|e| panic!("{var}: cannot run {}: {e}", exe.display()));
    let out = String::from_utf8_lossy(&probe.stdout);
    let fields: Vec<u32> = out.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    match fields.as_slice() {
        [3, m, 1] if *m == minor => {}
        _ => panic!(
            "{var} names {}, which is not a free-threaded CPython 3.{minor} (it says: major, minor, Py_GIL_DISABLED = {})",
            exe.display(),
            out.trim()
        ),
    }
    Some(Python { label: format!("ft-3.{minor}"), major: 3, minor, exe, rootfs: None })
}

/// A CPython linked against musl (as in Alpine images), built by hand: no package these
/// machines can install ships one, and its source and build recipe are never part of this
/// project. Taken from `PYPERCH_MUSL_PYTHON`; `None` after a SKIP line that says the musl
/// tests did not run. A variable naming an interpreter that is not musl-linked (its
/// `sys.implementation._multiarch` does not end in `-musl`) is a mistake in the set-up: the
/// test fails and says so. Labelled `musl-3.X`.
pub fn musl_python() -> Option<Python> {
    const VAR: &str = "PYPERCH_MUSL_PYTHON";
    let Some(exe) = env::var_os(VAR).filter(|p| !p.is_empty()).map(PathBuf::from) else {
        skip(format!("{VAR} is not set: the musl tests did not run (point it at a hand-built CPython linked against musl)"));
        return None;
    };
    if !exe.is_file() {
        panic!("{VAR} names {}, which does not exist", exe.display());
    }
    let probe = Command::new(&exe)
        .args(["-c", "import sys; v = sys.version_info; print(v[0], v[1], getattr(sys.implementation, '_multiarch', ''))"])
        .output()
        .unwrap_or_else(|e| panic!("{VAR}: cannot run {}: {e}", exe.display()));
    let out = String::from_utf8_lossy(&probe.stdout).to_string();
    let fields: Vec<&str> = out.split_whitespace().collect();
    match fields.as_slice() {
        [major, minor, multiarch] if multiarch.ends_with("-musl") => {
            let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
                panic!("{VAR}: {} printed an unreadable version: {}", exe.display(), out.trim())
            };
            Some(Python { label: format!("musl-{major}.{minor}"), major, minor, exe, rootfs: None })
        }
        _ => panic!(
            "{VAR} names {}, which is not a CPython linked against musl (it says: major, minor, multiarch = {}{})",
            exe.display(),
            out.trim(),
            String::from_utf8_lossy(&probe.stderr).trim()
        ),
    }
}

/// The interpreter with this label if it exists, silently.
pub fn python_quiet(label: &str) -> Option<Python> {
    configured_pythons()
        .into_iter()
        .find(|s| s.label == label)?
        .resolve()
        .ok()
}

/// The first available of `labels` (in order), or `None` after printing a SKIP message.
/// The interpreters of the sid root filesystem, preferred for tests that run processes in
/// their own PID and mount namespaces.
pub const NAMESPACED_PREFERENCE: [&str; 3] = ["sid-3.14", "sid-3.15", "sid-3.13"];

/// A Python for namespaced tests (see `NAMESPACED_PREFERENCE`) and a fresh cgroup tree;
/// `None`, after a SKIP message, when unshare, the interpreters or cgroups are missing.
pub fn namespaced_python_and_cgroups() -> Option<(Python, Cgroups)> {
    let py = first_python(&NAMESPACED_PREFERENCE)?;
    if find_program("unshare").is_none() {
        skip("unshare (util-linux) is not installed");
        return None;
    }
    match Cgroups::new() {
        Ok(c) => Some((py, c)),
        Err(why) => {
            skip(format!("cannot create cgroups: {why}"));
            None
        }
    }
}

/// Where `cargo xtask test` installs the pinned server packages (aiohttp, uvicorn, waitress,
/// ...) inside the sid rootfs for `py` (xtask's `server_packages_dir`), as the interpreter sees
/// it: put it on `PYTHONPATH`.
pub fn server_packages_dir(py: &Python) -> String {
    format!("/opt/pyperch-servers/python{}.{}", py.major, py.minor)
}

pub fn first_python(labels: &[&str]) -> Option<Python> {
    let found = labels.iter().find_map(|l| python_quiet(l));
    if found.is_none() {
        skip(format!("none of the pythons {labels:?} is available"));
    }
    found
}

/// Every configured interpreter that is available.
pub fn available_pythons() -> Vec<Python> {
    configured_pythons()
        .iter()
        .filter_map(|s| s.resolve().ok())
        .collect()
}

impl Python {
    pub fn version(&self) -> (u32, u32) {
        (self.major, self.minor)
    }

    pub fn is_chroot(&self) -> bool {
        self.rootfs.is_some()
    }

    /// The argv prefix that runs this interpreter: `[EXE]` or `[chroot, ROOTFS, EXE]`.
    /// `chroot` execs the interpreter, so the process it starts *is* the interpreter.
    pub fn argv(&self) -> Vec<OsString> {
        match &self.rootfs {
            None => vec![self.exe.clone().into()],
            Some(r) => vec!["chroot".into(), r.clone().into(), self.exe.clone().into()],
        }
    }

    pub fn command(&self) -> Command {
        let argv = self.argv();
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        if self.label == FT_GIL_3_14 {
            cmd.env("PYTHON_GIL", "1");
        }
        cmd
    }

    pub fn describe(&self) -> String {
        match &self.rootfs {
            None => format!("python {} ({})", self.label, self.exe.display()),
            Some(r) => format!(
                "python {} (chroot {} {})",
                self.label,
                r.display(),
                self.exe.display()
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scratch directories and workloads
// ---------------------------------------------------------------------------------------

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The source of a workload script.
pub fn workload_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(name)
}

/// A scratch directory the interpreter can see: `host` is its path for us, `guest` the path
/// the interpreter uses (they differ under chroot). Holds a copy of every workload script.
/// Removed on drop.
#[derive(Debug)]
pub struct WorkDir {
    pub host: PathBuf,
    pub guest: PathBuf,
}

impl WorkDir {
    pub fn new(py: &Python, tag: &str) -> Result<Self> {
        let name = unique(tag);
        let (host, guest) = match &py.rootfs {
            None => {
                let host = env::temp_dir().join("pyperch-tests").join(&name);
                (host.clone(), host)
            }
            Some(r) => {
                let guest = PathBuf::from("/tmp/pyperch-tests").join(&name);
                (r.join(guest.strip_prefix("/").unwrap()), guest)
            }
        };
        fs::create_dir_all(&host).with_context(|| format!("cannot create {}", host.display()))?;
        let src = workload_source("");
        for entry in fs::read_dir(&src).with_context(|| format!("cannot read {}", src.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "py") {
                fs::copy(&path, host.join(path.file_name().unwrap()))
                    .with_context(|| format!("cannot copy {}", path.display()))?;
            }
        }
        Ok(Self { host, guest })
    }

    pub fn host_path(&self, rel: &str) -> PathBuf {
        self.host.join(rel)
    }

    pub fn guest_path(&self, rel: &str) -> String {
        self.guest.join(rel).to_string_lossy().into_owned()
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // Kept after a failure, for a look at what the workload wrote.
        if !thread::panicking() {
            let _ = fs::remove_dir_all(&self.host);
        }
    }
}

/// A child whose stdout lines arrive on a channel, and the `ready` line it printed.
struct Started {
    child: Child,
    lines: mpsc::Receiver<String>,
    ready: String,
}

/// Spawns `cmd` (stdout piped) and waits up to 60 s for a line starting with `ready`; the
/// child is killed if it never prints one. `what` names it in errors.
fn start_until_ready(cmd: &mut Command, what: &str) -> Result<Started> {
    let mut child = cmd.spawn().with_context(|| format!("cannot start {what}"))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("{what} was started without a stdout pipe");
    };
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with("ready") => return Ok(Started { child, lines, ready: line }),
            Ok(_) => continue,
            Err(_) => {
                let status = child.try_wait().ok().flatten();
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{what} did not print its ready line ({})",
                    match status {
                        Some(s) => format!("it exited: {}", describe_status(s)),
                        None => "still running after 60 s".into(),
                    }
                );
            }
        }
    }
}

/// A running workload; killed on drop.
pub struct Workload {
    pub pid: u32,
    pub python: Python,
    pub dir: WorkDir,
    pub script: String,
    /// The `ready ...` line it printed.
    pub ready: String,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Workload {
    /// Starts `python SCRIPT ARGS...` and waits (up to 60 s) for its `ready` line. In `args`,
    /// `{dir}` stands for the scratch directory as the interpreter sees it.
    pub fn spawn(py: &Python, script: &str, args: &[&str]) -> Result<Self> {
        Self::spawn_env(py, script, args, &[])
    }

    /// [`spawn`](Self::spawn) with these environment variables set for the interpreter.
    pub fn spawn_env(py: &Python, script: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let dir = WorkDir::new(py, script.trim_end_matches(".py"))?;
        let mut cmd = py.command();
        cmd.envs(env.iter().copied());
        cmd.arg(dir.guest_path(script))
            .args(
                args.iter()
                    .map(|a| a.replace("{dir}", &dir.guest.to_string_lossy())),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let started = start_until_ready(&mut cmd, &format!("{} {script}", py.describe()))?;
        Ok(Workload {
            pid: started.child.id(),
            python: py.clone(),
            dir,
            script: script.to_string(),
            ready: started.ready,
            child: started.child,
            lines: started.lines,
        })
    }

    /// Further stdout lines, without waiting.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// `name=value` pairs of the ready line (e.g. thread ids).
    pub fn ready_fields(&self) -> BTreeMap<String, String> {
        self.ready
            .split_whitespace()
            .filter_map(|f| {
                f.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect()
    }

    /// SIGTERM, then waits up to 30 s (SIGKILL after that).
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) };
        self.wait_exit(Duration::from_secs(30)).or_else(|| {
            let _ = self.child.kill();
            self.child.wait().ok()
        })
    }

    /// Waits for the exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reads a JSON file the workload wrote into its scratch directory.
    pub fn read_json(&self, rel: &str) -> Result<serde_json::Value> {
        let path = self.dir.host_path(rel);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "{} {} did not write {}",
                self.python.describe(),
                self.script,
                path.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILLs the pids on drop (processes a test's workloads forked, such as FUSE servers).
pub struct KillPids(pub Vec<u32>);

impl Drop for KillPids {
    fn drop(&mut self) {
        for pid in &self.0 {
            // SAFETY: kill(2) of processes this test started.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// A plain child process (e.g. `sleep 30`), killed on drop.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn spawn(program: &str, args: &[&str]) -> Result<Self> {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        Ok(Self(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The inclusive line range of `def NAME(` in a workload script (up to the next top-level
/// statement).
pub fn function_lines(script: &str, name: &str) -> Option<(u32, u32)> {
    let text = fs::read_to_string(workload_source(script)).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("def {name}(")))?;
    let mut end = start;
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        if !l.is_empty() && !l.starts_with(' ') && !l.starts_with('#') {
            break;
        }
        if !l.trim().is_empty() {
            end = i;
        }
    }
    Some((start as u32 + 1, end as u32 + 1))
}

// ---------------------------------------------------------------------------------------
// Running pyperch
// ---------------------------------------------------------------------------------------

pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}

/// A finished command.
#[derive(Debug)]
pub struct Run {
    pub argv: Vec<String>,
    /// `None` when it had to be killed after the timeout.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn timed_out(&self) -> bool {
        self.status.is_none()
    }

    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// Non-empty stderr lines.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Command line, status, time, stdout and stderr, for failure messages.
    pub fn diag(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\n--- command: {}", self.argv.join(" "));
        let _ = writeln!(
            s,
            "--- result: {} after {:.1} s",
            match self.status {
                Some(st) => describe_status(st),
                None => "TIMED OUT (killed)".into(),
            },
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "--- stderr ({} lines, last 40):",
            self.stderr.lines().count()
        );
        tail_into(&mut s, &self.stderr, 40);
        if !self.stdout.trim().is_empty() {
            let _ = writeln!(s, "--- stdout (last 20 lines):");
            tail_into(&mut s, &self.stdout, 20);
        }
        s
    }

    /// Asserts the "clear error" contract: failed (not killed, not timed out), exactly one
    /// stderr line starting with `error: `, no panic or backtrace.
    pub fn assert_clear_error(&self) {
        let d = self.diag();
        assert!(!self.timed_out(), "pyperch did not return{d}");
        let status = self.status.unwrap();
        assert!(
            status.code().is_some(),
            "pyperch died from a signal instead of exiting with an error{d}"
        );
        assert!(
            !status.success(),
            "pyperch exited 0 where an error was expected{d}"
        );
        let lower = self.stderr.to_lowercase();
        assert!(!lower.contains("panicked"), "pyperch panicked{d}");
        assert!(
            !lower.contains("backtrace"),
            "pyperch printed a backtrace{d}"
        );
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "expected exactly one stderr line starting with `error: `{d}"
        );
    }

    /// The single `error: ` line (after [`Run::assert_clear_error`]).
    pub fn error_line(&self) -> String {
        self.stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or("")
            .to_string()
    }
}

fn tail_into(s: &mut String, text: &str, n: usize) {
    let lines: Vec<&str> = text.lines().collect();
    for l in &lines[lines.len().saturating_sub(n)..] {
        let _ = writeln!(s, "    {l}");
    }
}

/// A started command whose output is being collected.
pub struct Running {
    pub argv: Vec<String>,
    child: Child,
    start: Instant,
    out: thread::JoinHandle<String>,
    err: thread::JoinHandle<String>,
}

fn collect(mut r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

impl Running {
    pub fn start(mut cmd: Command) -> Result<Self> {
        let argv: Vec<String> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", argv[0]))?;
        let out = collect(child.stdout.take().unwrap());
        let err = collect(child.stderr.take().unwrap());
        Ok(Self {
            argv,
            child,
            start,
            out,
            err,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout`; after that sends SIGINT, then SIGKILL 5 s later.
    pub fn finish(mut self, timeout: Duration) -> Run {
        let deadline = self.start + timeout;
        let mut status = None;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                status = Some(s);
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let elapsed = self.start.elapsed();
        if status.is_none() {
            stop_child(&mut self.child, libc::SIGINT, Duration::from_secs(5));
        }
        let stdout = self.out.join().unwrap_or_default();
        let stderr = self.err.join().unwrap_or_default();
        Run {
            argv: self.argv,
            status,
            stdout,
            stderr,
            elapsed,
        }
    }
}

/// `pyperch ARGS` with a timeout.
pub fn pyperch(args: &[&str], timeout: Duration) -> Run {
    let mut cmd = Command::new(pyperch_bin());
    cmd.args(args);
    Running::start(cmd)
        .expect("cannot start pyperch")
        .finish(timeout)
}

/// A `pyperch record` run with collapsed output.
pub struct Recording {
    pub run: Run,
    /// The collapsed file's text (empty when it was not written).
    pub collapsed: String,
    pub profile: Profile,
    pub output: PathBuf,
}

/// A `pyperch record` in progress.
pub struct RecordRun {
    running: Running,
    output: PathBuf,
    timeout: Duration,
}

fn scratch_file(name: &str) -> PathBuf {
    let dir = env::temp_dir().join("pyperch-tests").join(unique("record"));
    fs::create_dir_all(&dir).expect("cannot create a scratch directory");
    dir.join(name)
}

/// `--duration SECS` in `args`, if any.
fn duration_arg(args: &[&str]) -> Option<f64> {
    let end = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let args = &args[..end];
    args.iter()
        .position(|a| *a == "--duration")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--duration=")?.parse().ok())
        })
}

impl RecordRun {
    /// Starts `pyperch record --format collapsed --output TMP ARGS...`. The timeout is the
    /// `--duration` plus 60 s (120 s without one).
    pub fn start(args: &[&str]) -> Self {
        Self::start_env(args, &[])
    }

    /// `start` with extra environment variables for pyperch.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let output = scratch_file("profile.collapsed");
        let timeout = Duration::from_secs_f64(duration_arg(args).map_or(120.0, |d| d + 60.0));
        let mut cmd = Command::new(pyperch_bin());
        cmd.args(["record", "--format", "collapsed", "--output"])
            .arg(&output)
            .args(args)
            .envs(env.iter().copied());
        let running = Running::start(cmd).expect("cannot start pyperch");
        Self {
            running,
            output,
            timeout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// Waits (up to `timeout`) until pyperch holds a perf event or a BPF link (aya attaches a
    /// perf-event program through a bpf_link and closes the perf event's own fd), i.e. until
    /// sampling has begun. Returns whether that was seen.
    pub fn wait_until_sampling(&self, timeout: Duration) -> bool {
        sampling_began(self.pid(), timeout)
    }

    /// Waits (up to `timeout`) until pyperch runs its drain thread (`pyperch-drain`), which
    /// its loop starts once the processes named with `--pid` are inspected and registered:
    /// from then on their samples are kept. (`wait_until_sampling` is earlier: the perf events
    /// are open before the processes are inspected, which under load takes seconds for a
    /// score of them.) Returns whether it was seen.
    pub fn wait_until_registered(&self, timeout: Duration) -> bool {
        let pid = self.pid();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if has_thread_named(pid, "pyperch-drain") {
                return true;
            }
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits (up to `timeout`) until pyperch holds the BPF link of its scheduler-switch
    /// program (`tp_name: sched_switch` in the link's fdinfo) and runs its drain thread
    /// (`pyperch-drain`). `--mode wall/off-cpu` attach that program before the privilege drop,
    /// and the processes named with `--pid` are registered after it (the kernel watches a
    /// process from its registration); the drain thread starts once they are: from then on
    /// every switch of theirs is seen. Returns whether both were seen.
    pub fn wait_until_switch_hooked(&self, timeout: Duration) -> bool {
        let pid = self.pid();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
                return false;
            };
            let hooked = entries.filter_map(|e| e.ok()).any(|e| {
                fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("bpf_link"))
                    && fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy()))
                        .is_ok_and(|info| info.lines().any(|l| l.split_whitespace().eq(["tp_name:", "sched_switch"])))
            });
            if hooked && has_thread_named(pid, "pyperch-drain") {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Ends the recording as Ctrl-C does (SIGINT: pyperch drains what the kernel sent,
    /// writes its output and exits 0), then `finish`. For tests that end the recording when
    /// their workload is done rather than after a fixed `--duration` with room to spare.
    pub fn interrupt(self) -> Recording {
        // SAFETY: kill(2) with the pid of the pyperch we started; no memory effects.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGINT) };
        self.finish()
    }

    pub fn finish(self) -> Recording {
        let run = self.running.finish(self.timeout);
        let collapsed = fs::read_to_string(&self.output).unwrap_or_default();
        let profile = Profile::parse(&collapsed);
        Recording {
            run,
            collapsed,
            profile,
            output: self.output,
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        // Kept after a failure (its path is in the diagnostics).
        if let (false, Some(dir)) = (thread::panicking(), self.output.parent()) {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// `pyperch record --format collapsed --output TMP ARGS...`, to completion.
pub fn record(args: &[&str]) -> Recording {
    RecordRun::start(args).finish()
}

impl Recording {
    /// Everything useful when a test fails: the command, status, stderr, and the head of
    /// the collapsed output (heaviest stacks first).
    pub fn diag(&self) -> String {
        let mut s = self.run.diag();
        let _ = writeln!(
            s,
            "--- collapsed output {}: {} lines, {} samples{}; heaviest 30:",
            self.output.display(),
            self.profile.stacks.len(),
            self.profile.total(),
            if self.profile.malformed.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} MALFORMED (first: {:?})",
                    self.profile.malformed.len(),
                    self.profile.malformed[0]
                )
            }
        );
        s.push_str(&self.profile.head(30));
        s
    }

    /// `diag` plus the heaviest stacks of one process.
    pub fn diag_pid(&self, pid: u32) -> String {
        let mut s = self.diag();
        let p = self.profile.for_pid(pid);
        let _ = writeln!(s, "--- pid {pid}: {} samples; heaviest 15:", p.total());
        s.push_str(&p.head(15));
        s
    }

    /// Asserts a clean finish: exit 0 within the timeout, no panic, a well-formed profile.
    pub fn assert_ok(&self) {
        let d = self.diag();
        assert!(!self.run.timed_out(), "pyperch record did not return{d}");
        assert!(self.run.success(), "pyperch record failed{d}");
        assert!(!self.run.stderr.contains("panicked"), "pyperch panicked{d}");
        assert!(
            self.output.is_file(),
            "pyperch record did not write {}{d}",
            self.output.display()
        );
        assert!(
            self.profile.malformed.is_empty(),
            "malformed collapsed lines{d}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Collapsed stacks
// ---------------------------------------------------------------------------------------

/// One Python frame, `<qualname> (<file>:<line>)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrame {
    pub name: String,
    pub file: String,
    pub line: Option<u32>,
}

impl PyFrame {
    /// Parses `<qualname> (<file>:<line>)`; a frame without that suffix is all name.
    pub fn parse(s: &str) -> PyFrame {
        if let Some((inner, open)) = s.strip_suffix(')').and_then(|i| Some((i, i.rfind(" (")?))) {
            let name = &inner[..open];
            let loc = &inner[open + 2..];
            let (file, line) = match loc.rsplit_once(':') {
                Some((f, l)) => (f, l.parse().ok()),
                None => (loc, None),
            };
            return PyFrame {
                name: name.to_string(),
                file: file.to_string(),
                line,
            };
        }
        PyFrame {
            name: s.to_string(),
            file: String::new(),
            line: None,
        }
    }

    /// The function name matches `func` (the qualname is `func` or ends in `.func`).
    pub fn is(&self, func: &str) -> bool {
        name_matches(&self.name, func)
    }
}

pub fn name_matches(qualname: &str, func: &str) -> bool {
    qualname == func
        || qualname
            .strip_suffix(func)
            .is_some_and(|p| p.ends_with('.'))
}

/// One collapsed line.
#[derive(Clone, Debug)]
pub struct Stack {
    pub frames: Vec<String>,
    pub count: u64,
}

impl Stack {
    /// From the root frame `<comm> (pid <pid>)`.
    pub fn pid(&self) -> Option<u32> {
        let root = self.frames.first()?;
        let inner = root.strip_suffix(')')?;
        let at = inner.rfind("(pid ")?;
        inner[at + 5..].trim().parse().ok()
    }

    pub fn comm(&self) -> Option<&str> {
        let root = self.frames.first()?;
        Some(root[..root.rfind(" (pid ")?].trim())
    }

    /// From the `thread <tid>` or `thread <tid> <name>` frame (with `--threads`).
    pub fn tid(&self) -> Option<u32> {
        self.frames.get(1)?.strip_prefix("thread ")?.split(' ').next()?.trim().parse().ok()
    }

    /// The `<name>` of a `thread <tid> <name>` frame, if the thread's name was known.
    pub fn thread_name(&self) -> Option<&str> {
        let rest = self.frames.get(1)?.strip_prefix("thread ")?;
        let (tid, name) = rest.split_once(' ')?;
        tid.parse::<u32>().ok()?;
        Some(name)
    }

    /// The frames after the root (and the thread frame, if any): the Python stack, root first.
    pub fn python_frames(&self) -> Vec<PyFrame> {
        let skip = if self.tid().is_some() { 2 } else { 1 };
        self.frames
            .iter()
            .skip(skip)
            .map(|f| PyFrame::parse(f))
            .collect()
    }

    pub fn leaf(&self) -> Option<PyFrame> {
        self.python_frames().pop()
    }

    pub fn leaf_is(&self, func: &str) -> bool {
        self.leaf().is_some_and(|f| f.is(func))
    }

    pub fn has_function(&self, func: &str) -> bool {
        self.python_frames().iter().any(|f| f.is(func))
    }
}

/// A parsed collapsed file.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub stacks: Vec<Stack>,
    /// Lines that are not `frame;frame;... COUNT`.
    pub malformed: Vec<String>,
}

impl Profile {
    pub fn parse(text: &str) -> Profile {
        let mut p = Profile::default();
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            match line
                .rsplit_once(' ')
                .and_then(|(stack, n)| Some((stack, n.parse::<u64>().ok()?)))
            {
                Some((stack, count)) if !stack.is_empty() => p.stacks.push(Stack {
                    frames: stack.split(';').map(str::to_string).collect(),
                    count,
                }),
                _ => p.malformed.push(line.to_string()),
            }
        }
        p
    }

    pub fn total(&self) -> u64 {
        self.stacks.iter().map(|s| s.count).sum()
    }

    /// Samples of the stacks matching `pred`.
    pub fn count(&self, pred: impl Fn(&Stack) -> bool) -> u64 {
        self.stacks
            .iter()
            .filter(|s| pred(s))
            .map(|s| s.count)
            .sum()
    }

    pub fn filter(&self, pred: impl Fn(&Stack) -> bool) -> Profile {
        Profile {
            stacks: self.stacks.iter().filter(|s| pred(s)).cloned().collect(),
            malformed: Vec::new(),
        }
    }

    pub fn for_pid(&self, pid: u32) -> Profile {
        self.filter(|s| s.pid() == Some(pid))
    }

    pub fn pids(&self) -> BTreeSet<u32> {
        self.stacks.iter().filter_map(Stack::pid).collect()
    }

    /// Samples with `func` anywhere in the Python stack.
    pub fn with_function(&self, func: &str) -> u64 {
        self.count(|s| s.has_function(func))
    }

    /// Samples whose leaf frame is `func`.
    pub fn with_leaf(&self, func: &str) -> u64 {
        self.count(|s| s.leaf_is(func))
    }

    /// Samples per leaf function name ("" for stacks without Python frames).
    pub fn leaf_histogram(&self) -> BTreeMap<String, u64> {
        let mut h = BTreeMap::new();
        for s in &self.stacks {
            *h.entry(s.leaf().map(|f| f.name).unwrap_or_default())
                .or_insert(0) += s.count;
        }
        h
    }

    /// Samples per thread id (with `--threads`) of the stacks holding `func`.
    pub fn threads_of(&self, func: &str) -> BTreeMap<u32, u64> {
        let mut h = BTreeMap::new();
        for s in self.stacks.iter().filter(|s| s.has_function(func)) {
            if let Some(tid) = s.tid() {
                *h.entry(tid).or_insert(0) += s.count;
            }
        }
        h
    }

    /// The heaviest `n` stacks, one per line.
    pub fn head(&self, n: usize) -> String {
        let mut sorted: Vec<&Stack> = self.stacks.iter().collect();
        sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
        let mut s = String::new();
        for st in sorted.iter().take(n) {
            let _ = writeln!(s, "    {} {}", st.frames.join(";"), st.count);
        }
        if sorted.len() > n {
            let _ = writeln!(s, "    ... {} more lines", sorted.len() - n);
        }
        s
    }
}

// ---------------------------------------------------------------------------------------
// Misc
// ---------------------------------------------------------------------------------------

/// A pid that is not in use (starting from `hint`, which should be near pid_max).
pub fn unused_pid(hint: u32) -> u32 {
    (0..1000)
        .map(|i| hint - i)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap_or(hint)
}

/// A copy of the binary under test in a world-writable scratch directory, so that an
/// unprivileged user can run it even when the clone sits in a private home. Removed on drop.
pub struct WorldRunnableCopy {
    pub bin: PathBuf,
    pub dir: PathBuf,
}

impl WorldRunnableCopy {
    pub fn new() -> Result<Self> {
        let dir = env::temp_dir().join(unique("pyperch-nonroot"));
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777))?;
        let bin = dir.join("pyperch");
        fs::copy(pyperch_bin(), &bin)?;
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;
        Ok(Self { bin, dir })
    }
}

impl Drop for WorldRunnableCopy {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Program `name` on PATH or in the sbin directories.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A number inside a workload's JSON result.
pub fn json_f64(v: &serde_json::Value, path: &[&str]) -> Result<f64> {
    let mut cur = v;
    for p in path {
        cur = cur
            .get(*p)
            .ok_or_else(|| anyhow!("missing field {path:?} in {v}"))?;
    }
    cur.as_f64()
        .ok_or_else(|| anyhow!("field {path:?} is not a number in {v}"))
}

// ---------------------------------------------------------------------------------------
// Containers: cgroups, PID and mount namespaces (tests/containers.rs, tests/agent.rs)
// ---------------------------------------------------------------------------------------

/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup`, or e.g.
/// `/sys/fs/cgroup/unified` on a "hybrid" host (the first `cgroup2` entry of
/// `/proc/self/mounts`).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir.replace("\\040", " ")))
    })
}

/// `n` random lowercase hex digits (from /dev/urandom).
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n.div_ceil(2)];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("cannot read /dev/urandom");
    let mut s: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    s.truncate(n);
    s
}

/// A random Kubernetes pod UID: a lowercase version-4 UUID with dashes.
pub fn random_pod_uid() -> String {
    let h = random_hex(32);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// The cgroup path containerd's CRI plugin uses under Kubernetes (systemd driver) for a
/// container of a Burstable pod.
pub fn kubepods_cgroup(pod_uid: &str, container_id: &str) -> String {
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container_id}.scope",
        pod_uid.replace('-', "_")
    )
}

/// The pod's own cgroup in [`kubepods_cgroup`], with a trailing `/`.
pub fn kubepods_pod_cgroup(pod_uid: &str) -> String {
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/",
        pod_uid.replace('-', "_")
    )
}

/// The cgroup path Docker uses with the systemd cgroup driver.
pub fn docker_cgroup(container_id: &str) -> String {
    format!("/system.slice/docker-{container_id}.scope")
}

/// The pids listed in a cgroup's `cgroup.procs`.
fn cgroup_procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// cgroup v2 directories created by a test; on drop, the processes still in them (the
/// test's own) are killed and the directories removed, deepest first. Directories that
/// already existed (say a shared `/system.slice`) are left alone.
pub struct Cgroups {
    pub root: PathBuf,
    created: Vec<PathBuf>,
}

impl Cgroups {
    /// `Err(why)` when there is no writable cgroup v2 hierarchy here.
    pub fn new() -> Result<Self, String> {
        if !is_root() {
            return Err("creating cgroups needs root".into());
        }
        let root = cgroup2_root().ok_or("no cgroup2 file system is mounted")?;
        let probe = root.join(format!("pyperch-e2e-probe-{}", random_hex(8)));
        fs::create_dir(&probe)
            .map_err(|e| format!("cannot create a cgroup under {}: {e}", root.display()))?;
        let _ = fs::remove_dir(&probe);
        Ok(Self {
            root,
            created: Vec::new(),
        })
    }

    /// The directory of cgroup `path` (as written in /proc/PID/cgroup).
    pub fn dir(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Creates cgroup `path` (and its missing parents); returns its directory.
    pub fn create(&mut self, path: &str) -> Result<PathBuf> {
        let mut dir = self.root.clone();
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            dir.push(seg);
            if !dir.is_dir() {
                fs::create_dir(&dir)
                    .with_context(|| format!("cannot create the cgroup {}", dir.display()))?;
                self.created.push(dir.clone());
            }
        }
        Ok(dir)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            for attempt in 0..100 {
                for pid in cgroup_procs(dir) {
                    // SAFETY: plain kill(2) of a process in a cgroup this test created.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if attempt == 99 => note(format!(
                        "could not remove the cgroup {}: {e}",
                        dir.display()
                    )),
                    Err(_) => thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

/// The pid's parent, from /proc/PID/stat.
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The `NSpid:` line of /proc/PID/status (outermost pid first); empty when unreadable.
pub fn nspid_of(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|r| {
            r.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// User + system CPU time of a live workload `pid`, in clock ticks (panics once it is gone).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("workload stat");
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..].split(' ').collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// The BPF programs `pid` holds, by program id (a program held through several descriptors
/// counted once): (program type, `run_time_ns`, `run_cnt`) from /proc/PID/fdinfo. The run
/// figures grow only while the kernel's BPF statistics are on (pyperch keeps them on while it
/// runs with `--max-cpu`). Types: 7 perf event (the sampler), 17 raw tracepoint, 26 tracing.
pub fn bpf_programs(pid: u32) -> BTreeMap<u64, (u32, u64, u64)> {
    let mut programs = BTreeMap::new();
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return programs };
    for entry in entries.filter_map(|e| e.ok()) {
        let Ok(text) = fs::read_to_string(entry.path()) else { continue };
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(kind), Some(run_time), Some(runs)) =
            (field("prog_id:"), field("prog_type:"), field("run_time_ns:"), field("run_cnt:"))
        {
            programs.insert(id, (kind as u32, run_time, runs));
        }
    }
    programs
}

/// `run_time_ns` of each BPF program `pid` holds, by program id.
pub fn bpf_run_time_ns(pid: u32) -> BTreeMap<u64, u64> {
    bpf_programs(pid).into_iter().map(|(id, (_, t, _))| (id, t)).collect()
}

/// Runs so far of the perf-event (sampling) programs `pid` holds: with `--pid`, each run is
/// one sample of a target thread (per-task events).
pub fn bpf_sampler_runs(pid: u32) -> u64 {
    bpf_programs(pid).values().filter(|p| p.0 == 7).map(|p| p.2).sum()
}

/// CPU time (user + system, ns) of each live thread of `pid`, from
/// /proc/PID/task/TID/schedstat (nanoseconds, where /proc/PID/stat counts clock ticks).
pub fn thread_cpu_ns(pid: u32) -> BTreeMap<u32, u64> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return BTreeMap::new() };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| {
            let tid = t.file_name().to_string_lossy().parse().ok()?;
            let ns = fs::read_to_string(t.path().join("schedstat")).ok()?.split_whitespace().next()?.parse().ok()?;
            Some((tid, ns))
        })
        .collect()
}

/// CPU ns between two [`thread_cpu_ns`] readings: for each thread alive at the second, its
/// time since the first (all of it for a thread started in between).
pub fn thread_cpu_ns_between(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> u64 {
    after.iter().map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0))).sum()
}

/// A pyperch's CPU so far, measured from outside: its threads (user + system from
/// /proc/PID/stat, clock ticks → seconds) and its BPF programs' run time (seconds).
pub fn pyperch_cpu(pid: u32) -> (f64, f64) {
    let threads = cpu_ticks(pid) as f64 / clock_ticks_per_second();
    let bpf = bpf_run_time_ns(pid).values().sum::<u64>() as f64 / 1e9;
    (threads, bpf)
}

/// The `--stats` line "CPU budget: effective rate ...": (min, mean, last) in Hz.
pub fn effective_rate(stderr: &str) -> Option<(f64, f64, f64)> {
    let line = stderr.lines().find(|l| l.contains("CPU budget: effective rate"))?;
    let numbers: Vec<f64> = line.split_whitespace().filter_map(|w| w.parse::<f64>().ok()).collect();
    Some((*numbers.first()?, *numbers.get(1)?, *numbers.get(2)?))
}

/// Whether process `pid` has a thread whose name (`comm`) is `name`.
pub fn has_thread_named(pid: u32, name: &str) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(|t| t.ok()).any(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
}

/// Waits until `pid` (a pyperch) holds a perf event or a BPF link: sampling has begun.
pub fn sampling_began(pid: u32, timeout: Duration) -> bool {
    let fd_dir = PathBuf::from(format!("/proc/{pid}/fd"));
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let Ok(entries) = fs::read_dir(&fd_dir) else {
            return false;
        };
        let open = entries.filter_map(|e| e.ok()).any(|e| {
            fs::read_link(e.path()).is_ok_and(|t| {
                let t = t.to_string_lossy();
                t.contains("[perf_event]") || t.contains("bpf_link")
            })
        });
        if open {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Polls `VmHWM` of `pid` every 20 ms until `done`; the highest value seen, in kB.
pub fn watch_peak_rss(pid: u32, done: std::sync::Arc<std::sync::atomic::AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut peak = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(status_kb(pid, "VmHWM").unwrap_or(0));
            thread::sleep(Duration::from_millis(20));
        }
        peak.max(status_kb(pid, "VmHWM").unwrap_or(0))
    })
}

/// A `VmHWM:`/`VmRSS:`-style line of /proc/PID/status, in kB.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A Python workload started inside cgroup `cgroup` (which it and its descendants stay
/// in), optionally in its own PID and mount namespaces:
/// `sh -c 'echo $$ > CGROUP/cgroup.procs && exec unshare --pid --mount --fork [--root=ROOTFS] EXE SCRIPT ARGS... TAG'`.
///
/// The interpreter runs through a symlink with a unique name (`pyc` + 6 hex digits), which
/// becomes its command name (`comm`), and gets a unique last argument `tag`, so that
/// `--comm` and `--cmdline` can single it out. Killed on drop.
pub struct Contained {
    /// The interpreter's pid as this test (the host) sees it.
    pub host_pid: u32,
    /// The cgroup path, as /proc/PID/cgroup shows it.
    pub cgroup: String,
    /// Its command name (the symlink's name).
    pub comm: String,
    /// The unique last argument of its command line.
    pub tag: String,
    /// Whether it has its own PID and mount namespaces.
    pub namespaced: bool,
    pub python: Python,
    pub dir: WorkDir,
    pub script: String,
    pub ready: String,
    child: Child,
    /// Kept so that the reader thread's channel stays open (in a Mutex: `Contained` is shared
    /// by `side_by_side` checks).
    _lines: std::sync::Mutex<mpsc::Receiver<String>>,
}

impl Contained {
    /// Starts `SCRIPT ARGS... TAG` (see the type) and waits up to 60 s for its `ready` line.
    /// `tag` is appended to the command line (spin.py and split.py ignore extra arguments).
    pub fn spawn(
        py: &Python,
        cgroups: &mut Cgroups,
        cgroup: &str,
        namespaced: bool,
        script: &str,
        args: &[&str],
        tag: &str,
    ) -> Result<Self> {
        let dir = WorkDir::new(py, script.trim_end_matches(".py"))?;
        let cg_dir = cgroups.create(cgroup)?;
        let comm = format!("pyc{}", random_hex(6));
        std::os::unix::fs::symlink(&py.exe, dir.host_path(&comm))
            .with_context(|| format!("cannot create the symlink {comm} -> {}", py.exe.display()))?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(cg_dir.join("cgroup.procs"));
        match (namespaced, &py.rootfs) {
            (true, Some(r)) => {
                cmd.args(["unshare", "--pid", "--mount", "--fork"])
                    .arg(format!("--root={}", r.display()));
            }
            (true, None) => {
                cmd.args(["unshare", "--pid", "--mount", "--fork"]);
            }
            (false, Some(r)) => {
                cmd.arg("chroot").arg(r);
            }
            (false, None) => {}
        }
        cmd.arg(dir.guest_path(&comm))
            .arg(dir.guest_path(script))
            .args(
                args.iter()
                    .map(|a| a.replace("{dir}", &dir.guest.to_string_lossy())),
            )
            .arg(tag)
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let started = start_until_ready(&mut cmd, &format!("{} {script} in {cgroup}", py.describe()))?;
        let launcher = started.child.id();
        let mut me = Contained {
            host_pid: launcher,
            cgroup: cgroup.to_string(),
            comm,
            tag: tag.to_string(),
            namespaced,
            python: py.clone(),
            dir,
            script: script.to_string(),
            ready: started.ready,
            child: started.child,
            _lines: std::sync::Mutex::new(started.lines),
        };
        if namespaced {
            // unshare --fork: the interpreter is the launcher's only child.
            let deadline = Instant::now() + Duration::from_secs(10);
            me.host_pid = loop {
                let child = fs::read_dir("/proc")?
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                    .find(|p| parent_pid(*p) == Some(launcher));
                if let Some(p) = child {
                    break p;
                }
                if Instant::now() > deadline {
                    bail!("cannot find the interpreter started by unshare (pid {launcher})");
                }
                thread::sleep(Duration::from_millis(20));
            };
        }
        let own = fs::read_to_string(format!("/proc/{}/cgroup", me.host_pid)).unwrap_or_default();
        if !own.lines().any(|l| l == format!("0::{cgroup}")) {
            bail!(
                "pid {} is not in the cgroup {cgroup}: /proc/{}/cgroup says {own:?}",
                me.host_pid,
                me.host_pid
            );
        }
        Ok(me)
    }

    /// The NSpid line of the interpreter (host pid first).
    pub fn nspid(&self) -> Vec<u32> {
        nspid_of(self.host_pid)
    }

    /// The interpreter's file name (what `process.executable.name` should say).
    pub fn exe_name(&self) -> String {
        self.python
            .exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The script as the interpreter sees it (the file name in its frames).
    pub fn script_path(&self) -> String {
        self.dir.guest_path(&self.script)
    }

    pub fn describe(&self) -> String {
        format!(
            "pid {} ({}, comm {}, {}in cgroup {})",
            self.host_pid,
            self.python.describe(),
            self.comm,
            if self.namespaced {
                "own PID+mount namespaces, "
            } else {
                ""
            },
            self.cgroup
        )
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of the interpreter this test started (the init of its PID
        // namespace, whose death ends the namespace).
        unsafe { libc::kill(self.host_pid as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// pprof decoding and the ingest receiver (tests/fixtures/ingest_receiver.py)
// ---------------------------------------------------------------------------------------

/// A file under tests/fixtures/.
/// Starts a fixture server (`cmd`: its stdout is piped here) that prints `port N ...` as its
/// first line once it accepts connections, and returns it with that port. A server that
/// prints anything else is killed and the test fails; `what` names it in the message.
pub fn spawn_fixture_server(cmd: &mut Command, what: &str) -> (Child, u16) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let mut first = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut first);
    }
    let port = first.strip_prefix("port ").and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse().ok());
    let Some(port) = port else {
        stop_child(&mut child, libc::SIGKILL, Duration::from_secs(1));
        panic!("{what} did not start (it printed {first:?})");
    };
    (child, port)
}

/// The JSON lines a fixture logged so far (a partly written last line is left out).
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The virtualenv with `protobuf` and `grpcio-tools` that `cargo xtask test` prepares:
/// `$PYPERCH_TEST_VENV`, else `$HOME/.cache/pyperch/test-venv`.
pub fn test_venv() -> PathBuf {
    match env::var_os("PYPERCH_TEST_VENV").filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v),
        None => PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/pyperch/test-venv"),
    }
}

/// The test venv's python, when it can import protobuf and grpc_tools; else why not.
pub fn pprof_python() -> Result<PathBuf, String> {
    let venv = test_venv();
    let python = venv.join("bin/python");
    if !python.is_file() {
        return Err(format!(
            "the test virtualenv {} does not exist (`cargo xtask test` creates it with the PyPI \
             packages protobuf and grpcio-tools; PyPI may have been unreachable)",
            venv.display()
        ));
    }
    let out = Command::new(&python)
        .args(["-c", "import google.protobuf, grpc_tools.protoc"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} cannot import protobuf and grpc_tools ({}); rerun `cargo xtask test` with PyPI \
             reachable",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(python)
}

/// Decodes a pprof file with the official schema (ingest_receiver.py `decode`): the JSON
/// summary `{sample_type, period_type, period, samples: [{labels, values, stack}], errors}`,
/// each stack leaf first as `[name, file, line]`.
pub fn decode_pprof(python: &Path, file: &Path) -> Result<serde_json::Value> {
    let out = Command::new(python)
        .arg(fixture_path("ingest_receiver.py"))
        .arg("decode")
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ingest_receiver.py decode")?;
    if !out.status.success() {
        bail!(
            "ingest_receiver.py decode {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("ingest_receiver.py decode printed no JSON")
}

/// A running ingest receiver on 127.0.0.1 (see tests/fixtures/ingest_receiver.py); stopped
/// on drop.
pub struct IngestReceiver {
    pub port: u16,
    /// When it starts accepting (Unix seconds).
    pub refuse_until: f64,
    /// Its JSON-lines log of every request.
    pub log: PathBuf,
    dir: PathBuf,
    child: Child,
}

impl IngestReceiver {
    /// Starts the receiver, answering 503 for the first `refuse_seconds`.
    pub fn start(python: &Path, refuse_seconds: f64) -> Result<Self> {
        Self::start_with(python, refuse_seconds, &[])
    }

    /// Starts the receiver logging counts only for each profile (`--brief`: no samples), for
    /// long runs.
    pub fn start_brief(python: &Path) -> Result<Self> {
        Self::start_with(python, 0.0, &["--brief"])
    }

    fn start_with(python: &Path, refuse_seconds: f64, extra: &[&str]) -> Result<Self> {
        let dir = env::temp_dir().join("pyperch-tests").join(unique("ingest"));
        fs::create_dir_all(&dir)?;
        let log = dir.join("requests.jsonl");
        let mut child = Command::new(python)
            .arg(fixture_path("ingest_receiver.py"))
            .arg("serve")
            .arg("--log")
            .arg(&log)
            .arg("--refuse-seconds")
            .arg(refuse_seconds.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start ingest_receiver.py")?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .context("cannot read the receiver's port")?;
        let fields: Vec<&str> = first.split_whitespace().collect();
        let parsed = match fields.as_slice() {
            ["port", port, "refuse_until", until] => port.parse().ok().zip(until.parse().ok()),
            _ => None,
        };
        let Some((port, refuse_until)) = parsed else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("ingest_receiver.py did not start (it printed {first:?})");
        };
        Ok(Self {
            port,
            refuse_until,
            log,
            dir,
            child,
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request logged so far (a partly written last line is left out).
    pub fn entries(&self) -> Vec<serde_json::Value> {
        json_lines(&self.log)
    }

    /// The requests it accepted (status 200), in arrival order.
    pub fn accepted(&self) -> Vec<serde_json::Value> {
        self.entries()
            .into_iter()
            .filter(|e| e["status"] == 200)
            .collect()
    }

    /// Whether the receiver is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for IngestReceiver {
    fn drop(&mut self) {
        stop_child(&mut self.child, libc::SIGTERM, Duration::from_secs(3));
        if !thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Splits a Pyroscope application name `app{k="v",k2="v2"}` into the app and its labels.
pub fn parse_pyroscope_name(name: &str) -> Option<(String, BTreeMap<String, String>)> {
    let (app, rest) = name.split_once('{')?;
    let inner = rest.strip_suffix('}')?;
    let mut labels = BTreeMap::new();
    for pair in inner.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=')?;
        let v = v.strip_prefix('"')?.strip_suffix('"')?;
        labels.insert(k.to_string(), v.to_string());
    }
    Some((app.to_string(), labels))
}
