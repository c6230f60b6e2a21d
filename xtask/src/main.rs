//! `cargo xtask`: pyperch's developer front door.
//!
//! - `setup`  installs what a build needs (nightly `rust-src`, bpf-linker in the per-user
//!   tool cache `$HOME/.cache/pyperch/tools`), skipping whatever is already there.
//! - `build`  setup, then `cargo build --release -p profiler-user` (→ `target/release/pyperch`).
//! - `run -- ARGS`  build, then run `target/release/pyperch ARGS` (its exit status is ours).
//! - `test [-- FILTER...]`  setup, test fixtures (the Debian sid root filesystem with
//!   python3.13/3.14/3.15, and pinned aiohttp/uvicorn/Starlette for its 3.14 and 3.15), the
//!   wheel (`wheel::TEST_WHEEL`, for tests/tests/wheel.rs), build,
//!   unit tests (the crates', then the benchmark package's `bench/tests` with `python3 -m
//!   unittest`), then the end-to-end tests (`--test-threads=1`; the files listed in
//!   `e2e::SIDE_BY_SIDE` two at a time first, then every other file alone; see `e2e.rs`); then
//!   the forged-memory tests again against pyperch built with overflow checks (`release-checked`
//!   profile, `target/release-checked/pyperch`), when the filters select them.
//! - `fixtures`  only the test fixtures (the sid rootfs), created when missing.
//! - `soak [-- --minutes N]`  the memory soak test (`tests/tests/soak.rs`) run for N minutes
//!   (default 10): `pyperch agent --interval 1s` under code-object and process churn, its
//!   RSS growth per hour and peak printed. `test` runs it too, for 75 s.
//! - `image [-- --name NAME] [--stage-only]`  the agent's OCI image from `deploy/Containerfile`
//!   (FROM scratch: the stripped binary and the shared libraries it needs), built offline
//!   with podman or docker; prints its name and size.
//! - `wheel [--out DIR] [--libc musl|glibc]`  the `pyperch` wheel (maturin's binary bindings,
//!   pinned maturin and auditwheel in `$HOME/.cache/pyperch/wheel-tools`; by default pyperch
//!   statically linked against musl, for glibc and musl hosts alike), its platform tags
//!   checked with `auditwheel show`; `test` builds it too, for tests/tests/wheel.rs (see
//!   `wheel.rs`).
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
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, ExitStatus},
};

use anyhow::{Result, anyhow, bail};
use clap::{Parser, Subcommand};

mod apt_sources;
mod bench;
mod e2e;
mod fixtures;
mod image;
mod k8s_tools;
#[cfg(test)]
mod layers;
mod stack_check;
mod test_kernels;
mod toolchain;
mod wheel;

use fixtures::*;
use toolchain::*;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "pyperch's developer tasks: setup, build, run, test, test-kernels, fixtures, fuzz, soak, image, wheel, bench."
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
    /// Setup, test fixtures, build, unit tests, then the end-to-end tests (one test at a time
    /// per file; a few files two at a time).
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
    /// The agent's OCI image (deploy/Containerfile, FROM scratch), built offline with podman
    /// or docker; prints its name and size. Options after `--`: `--name NAME`,
    /// `--stage-only` (only the build context in target/image).
    Image {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Boots Debian 11's (5.10) and Debian 12's (6.1) kernels under qemu and checks that
    /// pyperch loads and gives correct stacks in each (downloads and caches the kernels).
    TestKernels,
    /// The `pyperch` wheel (maturin, binary bindings) checked with auditwheel: `pip install
    /// target/wheels/pyperch-*.whl` gives a `pyperch` command.
    Wheel {
        /// The folder to write the wheel into (default: target/wheels).
        #[arg(long)]
        out: Option<PathBuf>,
        /// musl: statically linked, one wheel for glibc and musl hosts; glibc: the release
        /// build of `cargo xtask build`, tagged by the glibc it needs.
        #[arg(long, value_enum, default_value_t = wheel::Libc::Musl)]
        libc: wheel::Libc,
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
        Cmd::TestKernels => Paths::new().and_then(|p| test_kernels::run(&p, test_kernels::Scope::Full)),
        Cmd::Soak { args } => Paths::new().and_then(|p| soak(&p, soak_minutes(&args)?)),
        Cmd::Image { args } => Paths::new().and_then(|p| image::image(&p, &args)),
        Cmd::Wheel { out, libc } => Paths::new().and_then(|p| wheel::wheel(&p, out, libc)),
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
// helpers shared by the tasks
// ---------------------------------------------------------------------------------------

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
    setup_server_packages(p, rootfs.as_deref());
    let ft_servers = setup_ft_server_packages(p);
    let numpy_venv = setup_numpy_venv(p);
    setup_c_compiler();
    setup_go();
    setup_viewers(p);
    setup_openssl();
    k8s_tools::setup_kubernetes_tests(p);
    setup_tmux();
    // The wheel (wheel::TEST_WHEEL) before `build_only`, so that pyperch's own build is the
    // last word on target/release/pyperch (a glibc wheel's stripped link is uplifted there).
    let wheel_env = wheel::wheel_for_tests(p);
    let bin = build_only(p)?;
    let bin = fs::canonicalize(&bin).unwrap_or(bin);
    // The agent image's root filesystem, for the Kubernetes tests' agent container.
    let image_rootfs = match image::stage(p, &bin, &p.target.join("image")) {
        Ok(()) => Some(p.target.join("image/rootfs")),
        Err(err) => {
            warn(format!("could not stage the image's build context: {err:#}; the Kubernetes tests make their own root"));
            None
        }
    };

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
    let unit = if unit.success() { bench::unit_tests(p)? } else { unit };

    step(format!(
        "test: end-to-end tests (tests/tests/*.rs, --test-threads=1; some files two at a time) with PYPERCH_BIN={}{}",
        bin.display(),
        match &rootfs {
            Some(r) => format!(" PYPERCH_SID_ROOTFS={}", r.display()),
            None => " (no sid rootfs: its tests skip)".to_string(),
        }
    ));
    let mut env: Vec<(&str, Option<OsString>)> = vec![
        ("PYPERCH_BIN", Some(bin.clone().into())),
        ("PYPERCH_TEST_VENV", Some(p.cache.join("test-venv").into())),
        ("PYPERCH_SPEEDSCOPE_DIR", Some(speedscope_dir(p).into())),
        ("PYPERCH_SID_ROOTFS", rootfs.clone().map(Into::into)),
    ];
    env.extend(wheel_env);
    if let Some(rootfs) = &image_rootfs {
        env.push(("PYPERCH_IMAGE_ROOTFS", Some(rootfs.clone().into())));
    }
    if let Some(dir) = &ft_servers {
        env.push(("PYPERCH_FT_SERVER_PACKAGES", Some(dir.clone().into())));
    }
    if let Some(dir) = &numpy_venv {
        env.push(("PYPERCH_NUMPY_VENV", Some(dir.clone().into())));
    }
    let mut e2e = e2e::run(&p.root, &p.target.join("tmp/e2e-logs"), &env, filters)?;

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
        if !again.success() {
            e2e = false;
        }
    }

    match (unit.success(), e2e) {
        // The whole suite also boots the oldest kernel (the short run of `cargo xtask
        // test-kernels`); a filtered run is for one's own tests and skips it.
        (true, true) if filters.is_empty() => {
            test_kernels::run(p, test_kernels::Scope::Quick)?;
            step("test: all passed (with Debian 11's 5.10 kernel under qemu; `cargo xtask test-kernels` boots both)");
            Ok(())
        }
        (true, true) => {
            step("test: all passed");
            Ok(())
        }
        (false, true) => bail!("the unit tests failed ({})", describe(unit)),
        (true, false) => bail!("the end-to-end tests failed (the files are named above)"),
        (false, false) => bail!("the unit tests and the end-to-end tests failed"),
    }
}
