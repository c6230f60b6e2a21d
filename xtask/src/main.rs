//! `cargo xtask`: pyperch's developer front door.
//!
//! - `setup`  installs what a build needs (nightly `rust-src`, bpf-linker in the per-user
//!   tool cache `$HOME/.cache/pyperch/tools`), skipping whatever is already there.
//! - `build`  setup, then `cargo build --release -p profiler-user` (→ `target/release/pyperch`).
//! - `run -- ARGS`  build, then run `target/release/pyperch ARGS` (its exit status is ours).
//! - `test [-- FILTER...]`  setup, test fixtures (the Debian sid root filesystem with
//!   python3.13/3.14/3.15), build, unit tests, then the end-to-end tests serially; then the
//!   forged-memory tests again against pyperch built with overflow checks (`release-checked`
//!   profile, `target/release-checked/pyperch`), when the filters select them.
//! - `fixtures`  only the test fixtures (the sid rootfs), created when missing.
//! - `soak [-- --minutes N]`  the memory soak test (`tests/tests/soak.rs`) run for N minutes
//!   (default 10): `pyperch agent --interval 1s` under code-object and process churn, its
//!   RSS growth per hour and peak printed. `test` runs it too, for 75 s.
//! - `bench [-- OPTIONS]`  pyperch beside py-spy, Austin and CPython's own profiler; writes
//!   `BENCHMARKS.md` and `bench/results.json` (see `bench/README.md`).
//!
//! Everything cached lives outside the clone, under `$HOME/.cache/pyperch`, so that a CI run
//! on a fresh clone of the same machine reuses it.

use std::{
    env,
    ffi::OsString,
    fs,
    io::{self, Write},
    os::unix::{fs::symlink, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};

mod apt_sources;
mod bench;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "pyperch's developer tasks: setup, build, run, test, fixtures, fuzz, soak, bench."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building pyperch needs (nightly rust-src, bpf-linker); idempotent.
    Setup,
    /// Setup, then build target/release/pyperch.
    Build,
    /// Build, then run target/release/pyperch with ARGS and exit with its status.
    Run {
        /// Arguments for pyperch (put them after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Prepare the end-to-end tests' fixtures only (the Debian sid rootfs); idempotent.
    Fixtures,
    /// Setup, test fixtures, build, unit tests, then the end-to-end tests (serially).
    Test {
        /// Test-name filters (and libtest flags) for the end-to-end tests, after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        filters: Vec<OsString>,
    },
    /// Long fuzz run: every parser's proptest target with overflow checks (debug build),
    /// CASES cases each (default 20000; the unit tests run a few hundred).
    Fuzz {
        #[arg(long, default_value_t = 20_000)]
        cases: u64,
    },
    /// The memory soak test for N minutes: the agent under churn, RSS growth and peak.
    Soak {
        /// `--minutes N` (default 10), after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks against py-spy, Austin and CPython's profiler (writes BENCHMARKS.md).
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Setup => Paths::new().and_then(|p| setup(&p)),
        Cmd::Build => Paths::new().and_then(|p| build(&p).map(|_| ())),
        Cmd::Fixtures => Paths::new().and_then(|p| match setup_test_fixtures(&p) {
            Some(_) => Ok(()),
            None => Err(anyhow!(
                "the Debian sid rootfs is not available (see the warning above)"
            )),
        }),
        Cmd::Run { args } => Paths::new().and_then(|p| run(&p, &args)),
        Cmd::Fuzz { cases } => Paths::new().and_then(|p| fuzz(&p, cases)),
        Cmd::Test { filters } => Paths::new().and_then(|p| test(&p, &filters)),
        Cmd::Soak { args } => Paths::new().and_then(|p| soak(&p, soak_minutes(&args)?)),
        Cmd::Bench { args } => Paths::new().and_then(|p| {
            bench::run(&p, &args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>())
        }),
    };
    if let Err(err) = result {
        // One readable sentence, with the causes chained after it.
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

/// Where things are.
struct Paths {
    /// The workspace root (the directory of the top-level Cargo.toml).
    root: PathBuf,
    /// `$HOME/.cache/pyperch`.
    cache: PathBuf,
    /// The cargo target directory.
    target: PathBuf,
}

impl Paths {
    fn new() -> Result<Self> {
        // `cargo run` sets CARGO_MANIFEST_DIR at run time too; fall back to the value baked in
        // at compile time.
        let manifest = env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let root = manifest
            .parent()
            .ok_or_else(|| {
                anyhow!(
                    "cannot find the workspace root above {}",
                    manifest.display()
                )
            })?
            .to_path_buf();
        let home = env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .ok_or_else(|| {
                anyhow!("HOME is not set, so the tool cache $HOME/.cache/pyperch has no place")
            })?;
        let cache = PathBuf::from(home).join(".cache/pyperch");
        let target = match env::var_os("CARGO_TARGET_DIR").filter(|t| !t.is_empty()) {
            Some(t) => {
                let t = PathBuf::from(t);
                if t.is_absolute() {
                    t
                } else {
                    env::current_dir()?.join(t)
                }
            }
            None => root.join("target"),
        };
        Ok(Self {
            root,
            cache,
            target,
        })
    }

    fn tools_bin(&self) -> PathBuf {
        self.cache.join("tools/bin")
    }

    fn bpf_linker(&self) -> PathBuf {
        self.tools_bin().join("bpf-linker")
    }

    fn pyperch(&self) -> PathBuf {
        self.target.join("release/pyperch")
    }

    fn sid_rootfs(&self) -> PathBuf {
        match env::var_os("PYPERCH_SID_ROOTFS").filter(|p| !p.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => self.cache.join("sid-rootfs"),
        }
    }
}

fn step(msg: impl std::fmt::Display) {
    println!("[xtask] {msg}");
    let _ = io::stdout().flush();
}

fn warn(msg: impl std::fmt::Display) {
    eprintln!("[xtask] warning: {msg}");
}

/// The `cargo` that runs us (cargo sets CARGO for `cargo run`), else the one on PATH.
fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs a command to completion, turning "not found" and failures into one sentence.
fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = status_of(cmd, what)?;
    if !status.success() {
        bail!("{what} failed ({})", describe(status));
    }
    Ok(())
}

fn status_of(cmd: &mut Command, what: &str) -> Result<ExitStatus> {
    cmd.status().map_err(|e| spawn_error(cmd, what, e))
}

fn spawn_error(cmd: &Command, what: &str, e: io::Error) -> anyhow::Error {
    let program = cmd.get_program().to_string_lossy().into_owned();
    if e.kind() == io::ErrorKind::NotFound {
        anyhow!("{what} needs `{program}`, which is not installed or not on PATH")
    } else {
        anyhow!("{what}: could not start `{program}`: {e}")
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

// ---------------------------------------------------------------------------------------
// setup
// ---------------------------------------------------------------------------------------

fn setup(p: &Paths) -> Result<()> {
    // rustup drives both the nightly toolchain (for the eBPF crate) and rust-src.
    match Command::new("rustup")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => bail!(
            "`rustup --version` failed ({}), and rustup is needed to build the eBPF part",
            describe(s)
        ),
        Err(_) => bail!(
            "rustup is not installed or not on PATH; install it from https://rustup.rs (pyperch needs its nightly toolchain to build the eBPF part)"
        ),
    }
    let sysroot = nightly_sysroot()?;
    ensure_rust_src(&sysroot)?;
    ensure_bpf_linker(p, &sysroot)?;
    Ok(())
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .stderr(Stdio::piped())
        .output()
        .context("could not run `rustup run nightly rustc`")?;
    if !out.status.success() {
        bail!(
            "the nightly Rust toolchain is not usable (`rustup run nightly rustc --print sysroot` failed); install it with `rustup toolchain install nightly`"
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn ensure_rust_src(sysroot: &Path) -> Result<()> {
    if sysroot.join("lib/rustlib/src/rust").is_dir() {
        step("rust-src (nightly): present");
        return Ok(());
    }
    step(
        "rust-src (nightly): missing, running `rustup component add rust-src --toolchain nightly`",
    );
    run_checked(
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
        "installing rust-src for the nightly toolchain",
    )?;
    if !sysroot.join("lib/rustlib/src/rust").is_dir() {
        bail!(
            "rust-src was installed but {} still does not exist",
            sysroot.join("lib/rustlib/src/rust").display()
        );
    }
    Ok(())
}

/// `Some(version line)` when the cached bpf-linker exists and runs.
fn bpf_linker_version(p: &Paths) -> Option<String> {
    let linker = p.bpf_linker();
    if !linker.is_file() {
        return None;
    }
    let out = Command::new(&linker)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The bpf-linker release pyperch is built with, installed with its own Cargo.lock
/// (`--locked`) so that every machine builds the same dependency versions.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Whether a `bpf-linker --version` line names the pinned release.
fn is_pinned_bpf_linker(version_line: &str) -> bool {
    version_line.split_whitespace().nth(1) == Some(BPF_LINKER_VERSION)
}

fn ensure_bpf_linker(p: &Paths, nightly_sysroot: &Path) -> Result<()> {
    match bpf_linker_version(p) {
        Some(version) if is_pinned_bpf_linker(&version) => {
            step(format!(
                "bpf-linker: present ({version}, {})",
                p.bpf_linker().display()
            ));
            return Ok(());
        }
        Some(version) => step(format!(
            "bpf-linker: {} is {version}, not the pinned {BPF_LINKER_VERSION}; rebuilding it",
            p.bpf_linker().display()
        )),
        None if p.bpf_linker().exists() => step(format!(
            "bpf-linker: {} exists but does not run, rebuilding it",
            p.bpf_linker().display()
        )),
        None => step(format!(
            "bpf-linker: missing, building it into {}",
            p.tools_bin().display()
        )),
    }

    // bpf-linker must link against the same LLVM as the rustc that emits the bitcode: the
    // libLLVM shipped inside the nightly toolchain.
    let lib_dir = nightly_sysroot.join("lib");
    let llvm_lib = fs::read_dir(&lib_dir)
        .with_context(|| format!("cannot read the nightly toolchain's {}", lib_dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("libLLVM.so.") && name.contains("-rust-"))
        .ok_or_else(|| anyhow!("the nightly toolchain has no libLLVM.so.*-rust-* in {}, so bpf-linker cannot be built against it", lib_dir.display()))?;
    // libLLVM.so.22.1-rust-1.97.0-nightly → 22
    let major: u32 = llvm_lib["libLLVM.so.".len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| anyhow!("cannot tell the LLVM major version from {llvm_lib}"))?;
    let llvm_prefix = p.cache.join("llvm");
    let prefix_lib = llvm_prefix.join("lib");
    fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("cannot create {}", prefix_lib.display()))?;
    for name in ["libLLVM.so", llvm_lib.as_str()] {
        let link = prefix_lib.join(name);
        if link.symlink_metadata().is_ok() {
            fs::remove_file(&link).with_context(|| format!("cannot replace {}", link.display()))?;
        }
        symlink(lib_dir.join(&llvm_lib), &link)
            .with_context(|| format!("cannot create the symlink {}", link.display()))?;
    }
    step(format!(
        "bpf-linker: `cargo install bpf-linker --version ={BPF_LINKER_VERSION} --locked --no-default-features --features llvm-{major}` against {} (takes a few minutes)",
        lib_dir.join(&llvm_lib).display()
    ));
    fs::create_dir_all(&p.cache)?;
    run_checked(
        cargo()
            .current_dir(&p.cache)
            .env("LLVM_PREFIX", &llvm_prefix)
            .arg("install")
            .arg("--root")
            .arg(p.cache.join("tools"))
            .arg("bpf-linker")
            .arg("--version")
            .arg(format!("={BPF_LINKER_VERSION}"))
            // Replaces a cached copy of another version, or one that no longer runs.
            .args(["--locked", "--force", "--no-default-features", "--features"])
            .arg(format!("llvm-{major}")),
        "building bpf-linker",
    )?;
    match bpf_linker_version(p) {
        Some(version) if is_pinned_bpf_linker(&version) => {
            step(format!("bpf-linker: built ({version})"));
            Ok(())
        }
        Some(version) => bail!(
            "bpf-linker was built but `{} --version` says {version}, not {BPF_LINKER_VERSION}",
            p.bpf_linker().display()
        ),
        None => bail!(
            "bpf-linker was built but `{} --version` does not run",
            p.bpf_linker().display()
        ),
    }
}

// ---------------------------------------------------------------------------------------
// test fixtures: the Debian sid root filesystem
// ---------------------------------------------------------------------------------------

const SID_PYTHONS: [&str; 3] = ["python3.13", "python3.14", "python3.15"];

fn rootfs_missing_pythons(rootfs: &Path) -> Vec<&'static str> {
    SID_PYTHONS
        .iter()
        .copied()
        .filter(|py| !rootfs.join("usr/bin").join(py).exists())
        .collect()
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Makes sure the sid rootfs exists; returns its path when it is complete.
fn setup_test_fixtures(p: &Paths) -> Option<PathBuf> {
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
fn setup_c_compiler() {
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
fn apt_install_if_missing(program: &str, package: &str, purpose: &str) {
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
fn setup_go() {
    apt_install_if_missing("go", "golang-go", "the pprof reader tests");
}

/// The agent's TLS tests (tests/tests/agent_auth.rs) make a throw-away CA and server
/// certificate with the `openssl` command.
fn setup_openssl() {
    apt_install_if_missing("openssl", "openssl", "the agent's TLS tests");
}

fn build_sid_rootfs(rootfs: &Path) -> Result<()> {
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
fn remove_partial(tmp: &Path) {
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
const TEST_VENV_PACKAGES: [&str; 2] = ["protobuf", "grpcio-tools"];

/// Makes sure `$HOME/.cache/pyperch/test-venv` can import protobuf and grpc_tools; on
/// failure (say PyPI is unreachable) warns, and the tests that need it skip.
fn setup_test_venv(p: &Paths) {
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
const OTLP_DECODER_SPEC: &str = "opentelemetry-proto==1.45.2";

/// Installs [`OTLP_DECODER_SPEC`] in the test venv, for tests/otlp.rs's independent
/// decoder (tests/fixtures/otlp_receiver.py); without it those tests skip.
fn setup_otlp_decoder(python: &Path) {
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
fn setup_perfetto(python: &Path) {
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
const SPEEDSCOPE_NPM: &str = "speedscope@1.25.0";

/// Where the speedscope web app is installed: `$HOME/.cache/pyperch/npm`.
fn speedscope_dir(p: &Paths) -> PathBuf {
    p.cache.join("npm/node_modules/speedscope/dist/release")
}

/// The viewer tests (tests/tests/viewers.rs) open pyperch's files in headless Chromium
/// (Debian's `chromium`) and through speedscope's web app (npm). Both are installed when
/// missing (idempotent); a failure only makes those tests skip.
fn setup_viewers(p: &Paths) {
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
// build / run / test
// ---------------------------------------------------------------------------------------

fn build(p: &Paths) -> Result<PathBuf> {
    setup(p)?;
    build_only(p)
}

/// `cargo build --release -p profiler-user`, without the set-up steps.
fn build_only(p: &Paths) -> Result<PathBuf> {
    step("build: cargo build --release -p profiler-user");
    run_checked(
        cargo()
            .current_dir(&p.root)
            .args(["build", "--release", "-p", "profiler-user"]),
        "building pyperch",
    )?;
    let bin = p.pyperch();
    if !bin.is_file() {
        bail!("the build succeeded but {} does not exist", bin.display());
    }
    step(format!("build: {}", bin.display()));
    Ok(bin)
}

/// The end-to-end tests that also run against the overflow-checked build.
const CHECKED_TEST_FILE: &str = "forged_memory";
const CHECKED_TEST_NAMES: [&str; 4] =
    ["forged_memory_3_9", "forged_memory_3_12", "forged_memory_sid_3_14", "forged_memory_sid_3_15"];

/// Whether libtest `filters` select any of the checked-build tests.
fn selects_checked_tests(filters: &[OsString]) -> bool {
    let names: Vec<String> =
        filters.iter().map(|f| f.to_string_lossy().into_owned()).filter(|f| !f.starts_with('-')).collect();
    names.is_empty() || names.iter().any(|f| CHECKED_TEST_NAMES.iter().any(|t| t.contains(f.as_str())))
}

/// `cargo build --profile release-checked -p profiler-user`: pyperch with overflow checks.
fn build_checked(p: &Paths) -> Result<PathBuf> {
    step("build: cargo build --profile release-checked -p profiler-user (overflow checks)");
    run_checked(
        cargo().current_dir(&p.root).args(["build", "--profile", "release-checked", "-p", "profiler-user"]),
        "building pyperch with overflow checks",
    )?;
    let bin = p.target.join("release-checked/pyperch");
    if !bin.is_file() {
        bail!("the build succeeded but {} does not exist", bin.display());
    }
    Ok(fs::canonicalize(&bin).unwrap_or(bin))
}

fn run(p: &Paths, args: &[OsString]) -> Result<()> {
    let bin = build(p)?;
    // Replace this process: pyperch gets the terminal's signals directly and its exit status
    // becomes ours.
    let err = Command::new(&bin).args(args).exec();
    Err(anyhow!("could not run {}: {err}", bin.display()))
}

/// The fuzz targets (`fuzz` test modules of profiler-user) in a debug build, which has
/// overflow checks, with `cases` cases each. Not part of `test`: a debug build of the
/// workspace's dependencies takes minutes on a small machine; `test` runs the same targets
/// with a few hundred cases in its release unit tests.
fn fuzz(p: &Paths, cases: u64) -> Result<()> {
    setup(p)?;
    step(format!("fuzz: PYPERCH_FUZZ_CASES={cases} cargo test -p profiler-user --lib fuzz"));
    let status = status_of(
        cargo()
            .current_dir(&p.root)
            .args(["test", "-p", "profiler-user", "--lib", "fuzz"])
            .env("PYPERCH_FUZZ_CASES", cases.to_string()),
        "running the fuzz targets",
    )?;
    if !status.success() {
        bail!("a fuzz target failed ({}): its minimal failing input is printed above", describe(status));
    }
    step("fuzz: all targets passed");
    Ok(())
}

/// The minutes of `cargo xtask soak -- --minutes N` (10 by default).
fn soak_minutes(args: &[String]) -> Result<u64> {
    match args {
        [] => Ok(10),
        [flag, n] if flag == "--minutes" => {
            n.parse().map_err(|_| anyhow!("--minutes takes a whole number of minutes, not {n:?}"))
        }
        _ => bail!("usage: cargo xtask soak [-- --minutes N]"),
    }
}

fn soak(p: &Paths, minutes: u64) -> Result<()> {
    setup(p)?;
    setup_test_venv(p);
    let bin = build_only(p)?;
    let bin = fs::canonicalize(&bin).unwrap_or(bin);
    let seconds = minutes.max(1) * 60;
    step(format!("soak: tests/tests/soak.rs for {seconds} s (PYPERCH_SOAK_SECONDS) with PYPERCH_BIN={}", bin.display()));
    run_checked(
        cargo()
            .current_dir(&p.root)
            .args(["test", "--release", "-p", "pyperch-tests", "--test", "soak", "--", "--nocapture", "--test-threads=1"])
            .env("PYPERCH_BIN", &bin)
            .env("PYPERCH_TEST_VENV", p.cache.join("test-venv"))
            .env("PYPERCH_SOAK_SECONDS", seconds.to_string()),
        "running the soak test",
    )
}

fn test(p: &Paths, filters: &[OsString]) -> Result<()> {
    setup(p)?;
    let rootfs = setup_test_fixtures(p);
    setup_test_venv(p);
    setup_c_compiler();
    setup_go();
    setup_viewers(p);
    setup_openssl();
    let bin = build_only(p)?;
    let bin = fs::canonicalize(&bin).unwrap_or(bin);

    step("test: unit tests (cargo test --release -p profiler-common -p profiler-user -p xtask)");
    let unit = status_of(
        cargo().current_dir(&p.root).args([
            "test",
            "--release",
            "-p",
            "profiler-common",
            "-p",
            "profiler-user",
            "-p",
            "xtask",
        ]),
        "running the unit tests",
    )?;

    step(format!(
        "test: end-to-end tests (cargo test --release -p pyperch-tests -- --test-threads=1) with PYPERCH_BIN={}{}",
        bin.display(),
        match &rootfs {
            Some(r) => format!(" PYPERCH_SID_ROOTFS={}", r.display()),
            None => " (no sid rootfs: its tests skip)".to_string(),
        }
    ));
    let mut e2e = cargo();
    e2e.current_dir(&p.root)
        .args([
            "test",
            "--release",
            "--no-fail-fast",
            "-p",
            "pyperch-tests",
            "--",
            "--test-threads=1",
        ])
        .args(filters)
        .env("PYPERCH_BIN", &bin)
        .env("PYPERCH_TEST_VENV", p.cache.join("test-venv"))
        .env("PYPERCH_SPEEDSCOPE_DIR", speedscope_dir(p));
    match &rootfs {
        Some(r) => e2e.env("PYPERCH_SID_ROOTFS", r),
        None => e2e.env_remove("PYPERCH_SID_ROOTFS"),
    };
    let mut e2e = status_of(&mut e2e, "running the end-to-end tests")?;

    if selects_checked_tests(filters) {
        let checked = build_checked(p)?;
        step(format!(
            "test: forged-memory tests against the overflow-checked build (PYPERCH_BIN={})",
            checked.display()
        ));
        let mut again = cargo();
        again
            .current_dir(&p.root)
            .args(["test", "--release", "-p", "pyperch-tests", "--test", CHECKED_TEST_FILE, "--", "--test-threads=1"])
            .args(filters)
            .env("PYPERCH_BIN", &checked)
            .env("PYPERCH_TEST_VENV", p.cache.join("test-venv"));
        match &rootfs {
            Some(r) => again.env("PYPERCH_SID_ROOTFS", r),
            None => again.env_remove("PYPERCH_SID_ROOTFS"),
        };
        let again = status_of(&mut again, "running the forged-memory tests against the checked build")?;
        if e2e.success() && !again.success() {
            e2e = again;
        }
    }

    match (unit.success(), e2e.success()) {
        (true, true) => {
            step("test: all passed");
            Ok(())
        }
        (false, true) => bail!("the unit tests failed ({})", describe(unit)),
        (true, false) => bail!("the end-to-end tests failed ({})", describe(e2e)),
        (false, false) => bail!("the unit tests and the end-to-end tests failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pinned_bpf_linker_is_reused() {
        assert!(is_pinned_bpf_linker(&format!("bpf-linker {BPF_LINKER_VERSION}")));
        assert!(!is_pinned_bpf_linker("bpf-linker 0.9.15"));
        assert!(!is_pinned_bpf_linker(""));
    }
}
