//! The end-to-end tests' fixtures: the Debian sid root filesystem (python3.13-3.15, built
//! from the machine's own apt mirror), the test venv (protobuf, grpcio-tools, perfetto,
//! opentelemetry-proto), real asyncio servers (aiohttp, uvicorn, Starlette) for the sid
//! pythons 3.14/3.15, and the programs some tests need from Debian or npm (a C compiler,
//! Go, openssl, Chromium, speedscope). Each is installed only when missing.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, anyhow, bail};

use super::*;


pub(crate) const SID_PYTHONS: [&str; 3] = ["python3.13", "python3.14", "python3.15"];

pub(crate) fn rootfs_missing_pythons(rootfs: &Path) -> Vec<&'static str> {
    SID_PYTHONS
        .iter()
        .copied()
        .filter(|py| !rootfs.join("usr/bin").join(py).exists())
        .collect()
}

/// Makes sure the sid rootfs exists; returns its path when it is complete.
pub(crate) fn setup_test_fixtures(p: &Paths) -> Option<PathBuf> {
    let rootfs = p.sid_rootfs();
    if rootfs.exists() {
        let missing = rootfs_missing_pythons(&rootfs);
        if missing.is_empty() {
            step(format!("sid rootfs: present ({})", rootfs.display()));
            return Some(rootfs);
        }
        // Not ours to repair: it may be someone else's, or still being created.
        warn(format!(
            "{} exists but has no {}; the tests that need Debian sid's pythons will skip (remove it to have it rebuilt)",
            rootfs.display(),
            missing.join("/")
        ));
        return None;
    }
    match build_sid_rootfs(&rootfs) {
        Ok(()) => Some(rootfs),
        Err(err) => {
            warn(format!(
                "could not build the Debian sid rootfs at {}: {err:#}; the tests that need python3.13/3.14/3.15 from sid will skip",
                rootfs.display()
            ));
            None
        }
    }
}

/// The hostile-host tests compile small C programs (one of them static): gcc and the static
/// C library, installed from Debian when missing (idempotent; a failure only makes those
/// tests skip).
pub(crate) fn setup_c_compiler() {
    let static_libc = ["/usr/lib/x86_64-linux-gnu/libc.a", "/usr/lib64/libc.a", "/usr/lib/libc.a"];
    if find_program("gcc").is_some() && static_libc.iter().any(|p| Path::new(p).exists()) {
        step("C compiler: present");
        return;
    }
    if !is_root() {
        warn("gcc or the static C library is missing and apt-get needs root; the hostile-host tests skip");
        return;
    }
    step("C compiler: missing, running `apt-get install -y gcc libc6-dev`");
    let mut install = Command::new("apt-get");
    install.args(["install", "-y", "gcc", "libc6-dev"]).env("DEBIAN_FRONTEND", "noninteractive");
    let installed = status_of(&mut install, "installing gcc").is_ok_and(|s| s.success())
        || (run_checked(Command::new("apt-get").arg("update"), "apt-get update").is_ok()
            && status_of(&mut install, "installing gcc").is_ok_and(|s| s.success()));
    if !installed {
        warn("could not install gcc and libc6-dev; the hostile-host tests skip");
    }
}

/// Installs Debian's `package` when `program` is missing (idempotent; retried once after
/// `apt-get update`); a failure only makes the tests that need it skip (`purpose` names them).
pub(crate) fn apt_install_if_missing(program: &str, package: &str, purpose: &str) {
    if find_program(program).is_some() {
        step(format!("{program} ({purpose}): present"));
        return;
    }
    if !is_root() {
        warn(format!("{program} is missing and apt-get needs root; {purpose} skip"));
        return;
    }
    step(format!("{program}: missing, running `apt-get install -y {package}`"));
    let mut install = Command::new("apt-get");
    install.args(["install", "-y", package]).env("DEBIAN_FRONTEND", "noninteractive");
    let what = format!("installing {package}");
    let installed = status_of(&mut install, &what).is_ok_and(|s| s.success())
        || (run_checked(Command::new("apt-get").arg("update"), "apt-get update").is_ok()
            && status_of(&mut install, &what).is_ok_and(|s| s.success()));
    if !installed {
        warn(format!("could not install {package}; {purpose} skip"));
    }
}

/// The pprof tests read every pprof pyperch writes with a third-party reader, `go tool pprof`
/// (Debian's `golang-go`).
pub(crate) fn setup_go() {
    apt_install_if_missing("go", "golang-go", "the pprof reader tests");
}

/// The agent's TLS tests (tests/tests/agent_auth.rs) make a throw-away CA and server
/// certificate with the `openssl` command.
pub(crate) fn setup_openssl() {
    apt_install_if_missing("openssl", "openssl", "the agent's TLS tests");
}

/// `pyperch top` runs full-screen: its tests (tests/tests/top.rs) drive it inside a tmux
/// session and read the screen with `tmux capture-pane`.
pub(crate) fn setup_tmux() {
    apt_install_if_missing("tmux", "tmux", "the `pyperch top` screen tests");
}

pub(crate) fn build_sid_rootfs(rootfs: &Path) -> Result<()> {
    if !is_root() {
        bail!("debootstrap and chroot need root");
    }
    let debootstrap = match find_program("debootstrap") {
        Some(d) => d,
        None => {
            step("sid rootfs: debootstrap missing, running `apt-get install -y debootstrap`");
            let mut install = Command::new("apt-get");
            install
                .args(["install", "-y", "debootstrap"])
                .env("DEBIAN_FRONTEND", "noninteractive");
            if !status_of(&mut install, "installing debootstrap")?.success() {
                step("sid rootfs: apt-get install failed, running `apt-get update` and retrying");
                run_checked(Command::new("apt-get").arg("update"), "apt-get update")?;
                run_checked(&mut install, "installing debootstrap")?;
            }
            find_program("debootstrap")
                .ok_or_else(|| anyhow!("debootstrap is still not found after installing it"))?
        }
    };
    // The machine's own Debian mirror, as its apt is configured: none is written here.
    let mirror = apt_sources::debian_mirror(&apt_sources::configured_sources(Path::new("/")))
        .ok_or_else(|| {
            anyhow!(
                "no Debian archive (a `deb` entry with the main component, signed by debian-archive-keyring) in /etc/apt/sources.list or /etc/apt/sources.list.d/, so debootstrap has no mirror to use"
            )
        })?;
    let parent = rootfs
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", rootfs.display()))?;
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = rootfs
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sid-rootfs".into());
    let tmp = parent.join(format!("{name}.partial-{}", std::process::id()));
    let log_path = parent.join(format!("{name}-build.log"));
    let log = fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    step(format!(
        "sid rootfs: missing, running debootstrap from {mirror} (apt's configured mirror) into {} (about a minute; log in {})",
        tmp.display(),
        log_path.display()
    ));
    let status = status_of(
        Command::new(&debootstrap)
            .arg("--variant=minbase")
            .arg(format!("--include={}", SID_PYTHONS.join(",")))
            .arg("sid")
            .arg(&tmp)
            .arg(&mirror)
            .stdout(log.try_clone()?)
            .stderr(log),
        "building the sid rootfs",
    )?;
    let missing = rootfs_missing_pythons(&tmp);
    if !status.success() || !missing.is_empty() {
        remove_partial(&tmp);
        if !status.success() {
            bail!(
                "debootstrap failed ({}); see {}",
                describe(status),
                log_path.display()
            );
        }
        bail!(
            "debootstrap finished but the rootfs has no {}; see {}",
            missing.join("/"),
            log_path.display()
        );
    }
    if rootfs.exists() {
        // Someone else finished first; keep theirs.
        remove_partial(&tmp);
        step(format!(
            "sid rootfs: {} appeared meanwhile, keeping it",
            rootfs.display()
        ));
        return Ok(());
    }
    fs::rename(&tmp, rootfs)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), rootfs.display()))?;
    step(format!("sid rootfs: built ({})", rootfs.display()));
    Ok(())
}

/// Removes our own half-built rootfs, unless something is still mounted inside it
/// (removing a tree with /proc or /sys mounted inside would be dangerous).
pub(crate) fn remove_partial(tmp: &Path) {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = tmp.to_string_lossy().into_owned();
    if mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .any(|m| m.starts_with(&prefix))
    {
        warn(format!(
            "left {} in place because something is still mounted inside it",
            tmp.display()
        ));
        return;
    }
    if let Err(err) = fs::remove_dir_all(tmp) {
        warn(format!("could not remove {}: {err}", tmp.display()));
    }
}

// ---------------------------------------------------------------------------------------
// test fixtures: the Python virtualenv of the ingest receiver (tests/fixtures/)
// ---------------------------------------------------------------------------------------

/// PyPI packages of the tests' pprof decoder: protobuf, and grpcio-tools for its protoc.
pub(crate) const TEST_VENV_PACKAGES: [&str; 2] = ["protobuf", "grpcio-tools"];

/// Makes sure `$HOME/.cache/pyperch/test-venv` can import protobuf and grpc_tools; on
/// failure (say PyPI is unreachable) warns, and the tests that need it skip.
/// numpy from PyPI with its own OpenBLAS, and py-spy beside it (tests/native_walk.rs, issue
/// #31: the numpy stacks a stack copy could not reach, and the peer on the same process).
const NUMPY_VENV_PACKAGES: [&str; 2] = ["numpy==2.3.5", "py-spy==0.4.3"];

/// The numpy venv (`PYPERCH_NUMPY_VENV`): pyenv's 3.12 with [`NUMPY_VENV_PACKAGES`], made when
/// missing; `None` (its tests skip) without pyenv's 3.12 or when pip fails.
pub(crate) fn setup_numpy_venv(p: &Paths) -> Option<PathBuf> {
    let venv = p.cache.join("numpy-venv");
    let python = venv.join("bin/python");
    let usable = || {
        venv.join("bin/py-spy").is_file()
            && Command::new(&python)
                .args(["-c", "import numpy; assert numpy.__version__ == '2.3.5'"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    };
    if usable() {
        step(format!("numpy venv: present ({})", venv.display()));
        return Some(venv);
    }
    let Some(base) = crate::test_kernels::pyenv_python("3.12") else {
        warn("no pyenv Python 3.12: the numpy tests (tests/native_walk.rs) skip");
        return None;
    };
    step(format!("numpy venv: creating {} from {} with {}", venv.display(), base.display(), NUMPY_VENV_PACKAGES.join(", ")));
    let result = (|| -> Result<()> {
        if !python.is_file() {
            run_checked(Command::new(&base).arg("-m").arg("venv").arg(&venv), "creating the numpy virtualenv")?;
        }
        run_checked(
            Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(NUMPY_VENV_PACKAGES),
            "installing numpy and py-spy",
        )?;
        if !usable() {
            bail!("{} still lacks numpy 2.3.5 or py-spy", venv.display());
        }
        Ok(())
    })();
    match result {
        Ok(()) => Some(venv),
        Err(err) => {
            warn(format!("{err:#}; the numpy tests (tests/native_walk.rs) skip"));
            None
        }
    }
}

pub(crate) fn setup_test_venv(p: &Paths) {
    let venv = p.cache.join("test-venv");
    let python = venv.join("bin/python");
    let usable = || {
        Command::new(&python)
            .args(["-c", "import google.protobuf, grpc_tools.protoc"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if usable() {
        step(format!("test venv: present ({})", venv.display()));
        setup_perfetto(&python);
        setup_otlp_decoder(&python);
        return;
    }
    step(format!(
        "test venv: creating {} with {}",
        venv.display(),
        TEST_VENV_PACKAGES.join(", ")
    ));
    let result = (|| -> Result<()> {
        if !python.is_file() {
            let host_python =
                find_program("python3").ok_or_else(|| anyhow!("python3 is not installed"))?;
            run_checked(
                Command::new(host_python).arg("-m").arg("venv").arg(&venv),
                "creating the test virtualenv",
            )?;
        }
        run_checked(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(TEST_VENV_PACKAGES),
            "installing the test virtualenv's packages",
        )?;
        if !usable() {
            bail!(
                "{} still cannot import protobuf and grpc_tools",
                python.display()
            );
        }
        Ok(())
    })();
    match result {
        Ok(()) => step("test venv: ready"),
        Err(err) => warn(format!(
            "{err:#}; the tests that decode pprof (tests/agent.rs, part of tests/containers.rs) will skip"
        )),
    }
    setup_perfetto(&python);
    setup_otlp_decoder(&python);
}

/// The PyPI `opentelemetry-proto` release whose OTLP profiles schema (v1development, with
/// the request-level `ProfilesDictionary`) is the one of the `opentelemetry-proto` crate
/// pinned in profiler-user/Cargo.toml (both carry opentelemetry-proto 1.10.0's .proto
/// files). The profiles schema is alpha: move both pins together.
pub(crate) const OTLP_DECODER_SPEC: &str = "opentelemetry-proto==1.45.2";

/// Installs [`OTLP_DECODER_SPEC`] in the test venv, for tests/otlp.rs's independent
/// decoder (tests/fixtures/otlp_receiver.py); without it those tests skip.
pub(crate) fn setup_otlp_decoder(python: &Path) {
    let version = || {
        Command::new(python)
            .args(["-c", "import importlib.metadata as m, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2; print(m.version('opentelemetry-proto'))"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let wanted = OTLP_DECODER_SPEC.rsplit("==").next().unwrap_or_default();
    if !python.is_file() || version().as_deref() == Some(wanted) {
        return;
    }
    step(format!("test venv: installing {OTLP_DECODER_SPEC} (the OTLP decoder of tests/otlp.rs)"));
    let installed = run_checked(
        Command::new(python).args(["-m", "pip", "install", "--quiet", OTLP_DECODER_SPEC]),
        "installing opentelemetry-proto in the test virtualenv",
    );
    if let Err(err) = installed.and_then(|()| {
        if version().as_deref() == Some(wanted) { Ok(()) } else { bail!("{OTLP_DECODER_SPEC} is still not importable") }
    }) {
        warn(format!("{err:#}; the OTLP tests (tests/otlp.rs) will skip"));
    }
}

/// Installs Perfetto's Python trace processor (PyPI `perfetto`) in the test venv, for the
/// chrometrace test; without it that test checks the trace event schema only (and says so).
pub(crate) fn setup_perfetto(python: &Path) {
    let importable = || {
        Command::new(python)
            .args(["-c", "import perfetto.trace_processor"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !python.is_file() || importable() {
        return;
    }
    step("test venv: installing perfetto (trace processor, for the chrometrace test)");
    let installed = run_checked(
        Command::new(python).args(["-m", "pip", "install", "--quiet", "perfetto"]),
        "installing perfetto in the test virtualenv",
    );
    if let Err(err) = installed.and_then(|()| if importable() { Ok(()) } else { bail!("perfetto is still not importable") }) {
        warn(format!("{err:#}; the chrometrace test will check the trace event schema only"));
    }
}

/// The speedscope release the viewer tests open profiles in (npm package `speedscope`, which
/// carries the built web app under `dist/release`).
pub(crate) const SPEEDSCOPE_NPM: &str = "speedscope@1.25.0";

/// Where the speedscope web app is installed: `$HOME/.cache/pyperch/npm`.
pub(crate) fn speedscope_dir(p: &Paths) -> PathBuf {
    p.cache.join("npm/node_modules/speedscope/dist/release")
}

/// The viewer tests (tests/tests/viewers.rs) open pyperch's files in headless Chromium
/// (Debian's `chromium`) and through speedscope's web app (npm). Both are installed when
/// missing (idempotent); a failure only makes those tests skip.
pub(crate) fn setup_viewers(p: &Paths) {
    if Path::new("/usr/bin/chromium").exists() {
        step("chromium: present");
    } else if !is_root() {
        warn("chromium is missing and apt-get needs root; the viewer tests skip");
    } else {
        step("chromium: missing, running `apt-get install -y --no-install-recommends chromium`");
        let mut install = Command::new("apt-get");
        install
            .args(["install", "-y", "--no-install-recommends", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive");
        let installed = status_of(&mut install, "installing chromium").is_ok_and(|s| s.success())
            || (run_checked(Command::new("apt-get").arg("update"), "apt-get update").is_ok()
                && status_of(&mut install, "installing chromium").is_ok_and(|s| s.success()));
        if !installed {
            warn("could not install chromium; the viewer tests skip");
        }
    }
    let app = speedscope_dir(p);
    if app.join("index.html").is_file() {
        step(format!("speedscope: present ({})", app.display()));
        return;
    }
    let Some(npm) = find_program("npm") else {
        warn("npm is not installed, so speedscope cannot be; the viewer tests that need it skip");
        return;
    };
    let prefix = p.cache.join("npm");
    step(format!("speedscope: installing {SPEEDSCOPE_NPM} with npm into {}", prefix.display()));
    let result = fs::create_dir_all(&prefix)
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            run_checked(
                Command::new(npm)
                    .args(["install", "--no-audit", "--no-fund", "--prefix"])
                    .arg(&prefix)
                    .arg(SPEEDSCOPE_NPM),
                "installing speedscope with npm",
            )
        });
    match result {
        Ok(()) if app.join("index.html").is_file() => step("speedscope: ready"),
        Ok(()) => warn(format!("npm installed speedscope but {} has no index.html; the viewer tests that need it skip", app.display())),
        Err(err) => warn(format!("{err:#}; the viewer tests that need speedscope skip")),
    }
}

// ---------------------------------------------------------------------------------------
// test fixtures: real servers for the sid pythons (tests/tests/async_servers.rs,
// tests/tests/cpu_budget.rs)
// ---------------------------------------------------------------------------------------

/// The PyPI releases the tests run as real servers (async_servers.rs: aiohttp; uvicorn with
/// Starlette. cpu_budget.rs: waitress, a threaded WSGI server, pure Python) and every
/// dependency they import on 3.14/3.15, each pinned, installed without dependency resolution
/// so that nothing unpinned comes in. Every one has a cp314 and a cp315 wheel (or a pure
/// one), so the C extensions (aiohttp's HTTP parser, multidict, yarl, frozenlist, propcache)
/// are the ones users get. Move the pins together.
pub(crate) const SERVER_PACKAGES: [&str; 16] = [
    "aiohttp==3.14.5",
    "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0",
    "attrs==26.1.0",
    "frozenlist==1.8.0",
    "multidict==7.2.1",
    "propcache==0.5.4",
    "yarl==1.25.1",
    "idna==3.20",
    "uvicorn==0.54.0",
    "click==8.5.1",
    "h11==0.16.0",
    "starlette==1.10.0",
    "anyio==4.16.0",
    "typing_extensions==4.16.0",
    "waitress==3.0.2",
];

/// The sid interpreters the servers are installed for (asyncio task stacks need 3.14+).
pub(crate) const SERVER_PYTHONS: [&str; 2] = ["python3.14", "python3.15"];

/// The directory inside the sid rootfs, as its `python` sees it, that holds the server
/// packages for `python` (a name of [`SERVER_PYTHONS`]); the tests put it on `PYTHONPATH`.
/// Keep in step with tests/tests/async_servers.rs.
pub(crate) fn server_packages_dir(python: &str) -> String {
    format!("/opt/pyperch-servers/{python}")
}

/// The file in each server packages directory that lists the pins it was installed with.
const SERVER_PINS_FILE: &str = "pyperch-pins.txt";

/// Makes sure every interpreter of [`SERVER_PYTHONS`] in the sid rootfs can import the
/// pinned [`SERVER_PACKAGES`] from [`server_packages_dir`] (there is no pip inside the
/// rootfs: the test venv's pip fetches the wheels for the target's version and ABI with
/// `--target`). Idempotent: a directory whose pins file matches and whose interpreter imports
/// the servers is kept. A failure only makes the server tests skip.
pub(crate) fn setup_server_packages(p: &Paths, rootfs: Option<&Path>) {
    let Some(rootfs) = rootfs else { return };
    let pip_python = p.cache.join("test-venv/bin/python");
    let pins = SERVER_PACKAGES.join("\n") + "\n";
    for python in SERVER_PYTHONS {
        if !rootfs.join("usr/bin").join(python).exists() {
            continue;
        }
        let guest = server_packages_dir(python);
        let dir = rootfs.join(guest.trim_start_matches('/'));
        if fs::read_to_string(dir.join(SERVER_PINS_FILE)).is_ok_and(|t| t == pins)
            && servers_importable(rootfs, python, &guest)
        {
            step(format!("server packages for sid {python}: present ({})", dir.display()));
            continue;
        }
        step(format!(
            "server packages for sid {python}: installing {} (and their pinned dependencies) into {}",
            SERVER_PACKAGES.iter().filter(|s| ["aiohttp", "uvicorn", "starlette", "waitress"].iter().any(|n| s.starts_with(&format!("{n}==")))).copied().collect::<Vec<_>>().join(", "),
            dir.display()
        ));
        if let Err(err) = install_server_packages(&pip_python, rootfs, python, &dir, &pins) {
            warn(format!("{err:#}; the real-server tests (tests/tests/async_servers.rs) skip on sid {python}"));
        }
    }
}

/// Whether `chroot ROOTFS /usr/bin/PYTHON` imports the servers with `PYTHONPATH=GUEST`.
fn servers_importable(rootfs: &Path, python: &str, guest: &str) -> bool {
    let mut cmd = Command::new("chroot");
    cmd.arg(rootfs).arg(format!("/usr/bin/{python}"));
    imports_servers(cmd, Path::new(guest))
}

/// Whether the interpreter `cmd` runs imports the servers with `PYTHONPATH=FROM`.
fn imports_servers(mut cmd: Command, from: &Path) -> bool {
    cmd.args(["-c", "import aiohttp.web, uvicorn, starlette.applications, anyio, waitress"])
        .env("PYTHONPATH", from)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `pip install --target TARGET` of [`SERVER_PACKAGES`]' wheels for CPython `version` with
/// ABI `abi` (`cp314`, `cp314t`, ...), by the test venv's pip.
fn pip_install_servers(pip_python: &Path, version: &str, abi: &str, target: &Path, python: &str) -> Result<()> {
    run_checked(
        Command::new(pip_python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:"])
            .args(["--python-version", version, "--implementation", "cp", "--abi", abi])
            .args(["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"])
            .arg("--target")
            .arg(target)
            .args(SERVER_PACKAGES),
        &format!("installing the server packages for {python}"),
    )
}

/// Where the server packages for the free-threaded 3.14 of `PYPERCH_FT_PYTHON` go (a host
/// directory: that interpreter is built by hand on the host, never by this project). The
/// tests find it in `PYPERCH_FT_SERVER_PACKAGES`.
pub(crate) fn ft_server_packages_dir(p: &Paths) -> PathBuf {
    p.cache.join("ft-servers/python3.14t")
}

/// Where `PYPERCH_FT_PYTHON` names a free-threaded 3.14, makes sure it imports the pinned
/// [`SERVER_PACKAGES`] (their `cp314t` wheels: the C extensions built for free threading)
/// from [`ft_server_packages_dir`]; returns that directory when it does. Unset: nothing to
/// do (the free-threaded tests say they did not run). A failure only makes the free-threaded
/// server tests skip.
pub(crate) fn setup_ft_server_packages(p: &Paths) -> Option<PathBuf> {
    let exe = std::env::var_os("PYPERCH_FT_PYTHON").filter(|v| !v.is_empty()).map(PathBuf::from)?;
    let dir = ft_server_packages_dir(p);
    let pins = SERVER_PACKAGES.join("\n") + "\n";
    let importable = |from: &Path| imports_servers(Command::new(&exe), from);
    if fs::read_to_string(dir.join(SERVER_PINS_FILE)).is_ok_and(|t| t == pins) && importable(&dir) {
        step(format!("server packages for the free-threaded 3.14: present ({})", dir.display()));
        return Some(dir);
    }
    step(format!("server packages for the free-threaded 3.14 ({}): installing into {}", exe.display(), dir.display()));
    let pip_python = p.cache.join("test-venv/bin/python");
    let tmp = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let result = (|| -> Result<()> {
        if !pip_python.is_file() {
            bail!("{} (the test venv, whose pip installs them) is missing", pip_python.display());
        }
        pip_install_servers(&pip_python, "3.14", "cp314t", &tmp, "python3.14t")?;
        if !importable(&tmp) {
            bail!("{} cannot import aiohttp, uvicorn, starlette and waitress from {}", exe.display(), tmp.display());
        }
        fs::write(tmp.join(SERVER_PINS_FILE), &pins).with_context(|| format!("cannot write into {}", tmp.display()))?;
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("cannot remove the stale {}", dir.display()))?;
        }
        fs::rename(&tmp, &dir).with_context(|| format!("cannot rename {} to {}", tmp.display(), dir.display()))?;
        Ok(())
    })();
    match result {
        Ok(()) => {
            step("server packages for the free-threaded 3.14: ready");
            Some(dir)
        }
        Err(err) => {
            let _ = fs::remove_dir_all(&tmp);
            warn(format!("{err:#}; the free-threaded real-server tests skip"));
            None
        }
    }
}

/// Installs the pins into a fresh directory next to `dir`, checks the interpreter imports
/// them from there, then puts it in place of `dir`.
fn install_server_packages(pip_python: &Path, rootfs: &Path, python: &str, dir: &Path, pins: &str) -> Result<()> {
    if !is_root() {
        bail!("chroot needs root");
    }
    if !pip_python.is_file() {
        bail!("{} (the test venv, whose pip installs them) is missing", pip_python.display());
    }
    let version = python.trim_start_matches("python");
    let abi = format!("cp{}", version.replace('.', ""));
    let parent = dir.parent().ok_or_else(|| anyhow!("{} has no parent directory", dir.display()))?;
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = parent.join(format!("{python}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let result = (|| -> Result<()> {
        pip_install_servers(pip_python, version, &abi, &tmp, python)?;
        let guest_tmp = Path::new("/").join(tmp.strip_prefix(rootfs).context("the packages directory is outside the rootfs")?);
        if !servers_importable(rootfs, python, &guest_tmp.to_string_lossy()) {
            bail!("sid {python} cannot import aiohttp, uvicorn, starlette and waitress from {}", tmp.display());
        }
        fs::write(tmp.join(SERVER_PINS_FILE), pins).with_context(|| format!("cannot write into {}", tmp.display()))?;
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("cannot remove the stale {}", dir.display()))?;
        }
        fs::rename(&tmp, dir).with_context(|| format!("cannot rename {} to {}", tmp.display(), dir.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    } else {
        step(format!("server packages for sid {python}: ready"));
    }
    result
}
