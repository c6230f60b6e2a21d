//! `cargo xtask wheel [--out DIR] [--libc musl|glibc]`: the `pyperch` wheel, so that `pip
//! install pyperch` gives a `pyperch` command (as `pip install py-spy` does).
//!
//! maturin's binary bindings (`bindings = "bin"`, the repository's `pyproject.toml`) package
//! the release binary, which carries its kernel programs inside (`include_bytes_aligned!` of
//! profiler-user's build.rs), so the wheel needs no other file. Two builds ([`FLAVOURS`]):
//! - `musl` (the default, the one to publish): pyperch statically linked against musl for
//!   `x86_64-unknown-linux-musl`, with no shared library and no C library of the host's, so
//!   one wheel runs on glibc and musl hosts alike; tagged `manylinux_2_5` (auditwheel's
//!   most compatible glibc policy, which it verifies) and `musllinux_1_1` (which it cannot
//!   analyse: see [`check_policy`]). Its own build of the workspace, in its target's folder
//!   (`target/x86_64-unknown-linux-musl/release`; about 5.5 CPU-minutes from scratch).
//! - `glibc`: the release build of `cargo xtask build` itself, so it costs seconds after one;
//!   maturin picks its manylinux tag from the glibc symbol versions it needs. The one visible
//!   effect: maturin's stripped link replaces `target/release/pyperch` until the next `cargo
//!   build` puts the unstripped one back (cargo keeps both links; neither is redone).
//!
//! Invariants:
//! - maturin and auditwheel are the pinned [`WHEEL_TOOLS`], in their own venv under the
//!   per-user cache (`~/.cache/pyperch/wheel-tools`), installed only when missing.
//! - The wheel returned is the only `pyperch-*.whl` in the output folder (older ones are
//!   removed first), and `auditwheel show` found it consistent with every platform tag its
//!   file name claims (see [`check_policy`]): a wheel claiming a policy it does not meet is
//!   an error.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, anyhow, bail};

use super::*;

/// The PyPI packages that build and check the wheel, with their pinned versions.
pub(crate) const WHEEL_TOOLS: [(&str, &str); 2] = [("maturin", "1.16.0"), ("auditwheel", "6.8.2")];

/// Which C library the wheel's binary is built against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Libc {
    /// Statically linked against musl: one wheel for glibc and musl hosts.
    Musl,
    /// Dynamically linked against the build machine's glibc (manylinux_2_XX from its symbols).
    Glibc,
}

/// How one [`Libc`]'s wheel is built.
pub(crate) struct Flavour {
    pub libc: Libc,
    /// maturin's `--target` (`None`: the host's, i.e. the build of `cargo xtask build`).
    pub target: Option<&'static str>,
    /// maturin's `--compatibility` (empty: maturin picks the tag from the symbols it sees).
    pub compatibility: &'static [&'static str],
    /// Debian packages the build needs, by a program each provides.
    pub apt: &'static [(&'static str, &'static str)],
}

/// The builds, by [`Libc`].
pub(crate) const FLAVOURS: [Flavour; 2] = [
    Flavour {
        libc: Libc::Musl,
        target: Some("x86_64-unknown-linux-musl"),
        // maturin warns that the Rust compiler does not support manylinux_2_5: true of its
        // glibc targets, not of a static binary, which needs no glibc at all.
        compatibility: &["manylinux_2_5", "musllinux_1_1"],
        // musl-gcc for the C parts of dependencies (ring).
        apt: &[("x86_64-linux-musl-gcc", "musl-tools")],
    },
    Flavour { libc: Libc::Glibc, target: None, compatibility: &[], apt: &[] },
];

/// The [`Flavour`] of `libc`.
pub(crate) fn flavour(libc: Libc) -> &'static Flavour {
    FLAVOURS.iter().find(|f| f.libc == libc).expect("FLAVOURS has every Libc")
}

/// The venv holding [`WHEEL_TOOLS`].
pub(crate) fn wheel_tools_venv(p: &Paths) -> PathBuf {
    p.cache.join("wheel-tools")
}

/// The `auditwheel` of the tools venv (the end-to-end test runs it too).
pub(crate) fn auditwheel(p: &Paths) -> PathBuf {
    wheel_tools_venv(p).join("bin/auditwheel")
}

/// `cargo xtask wheel [--out DIR] [--libc LIBC]` (default `target/wheels`, musl).
pub(crate) fn wheel(p: &Paths, out: Option<PathBuf>, libc: Libc) -> Result<()> {
    let out = match out {
        Some(dir) if dir.is_relative() => env::current_dir()?.join(dir),
        Some(dir) => dir,
        None => p.target.join("wheels"),
    };
    let flavour = flavour(libc);
    setup(p)?;
    setup_wheel_tools(p)?;
    setup_flavour(p, flavour)?;
    let wheel = build_wheel(p, flavour, &out)?;
    step(format!("wheel: install it with `pip install {}`", wheel.display()));
    Ok(())
}

/// The wheel `cargo xtask test` builds and tests: the one `cargo xtask wheel` makes by
/// default, so that what is published is what was tested. Its cost in a CI run from a fresh
/// clone is its own build of the workspace for the musl target (measured on a 2-core machine:
/// `cargo xtask wheel` from an empty target folder 5 min 44 s, 7 min 50 s while another build
/// shared the CPUs; a few seconds once built); `Libc::Glibc` would cost seconds (the release
/// build's own link) but test a wheel that only runs on glibc 2.34+.
pub(crate) const TEST_WHEEL: Libc = Libc::Musl;

/// The wheel for tests/tests/wheel.rs ([`TEST_WHEEL`]), as the environment of the
/// end-to-end tests: `PYPERCH_WHEEL` and `PYPERCH_AUDITWHEEL` when it was built and checked;
/// when its tools cannot be installed (PyPI, rustup or apt unreachable) nothing, and the test
/// skips; when the build or the policy check fails, `PYPERCH_WHEEL_ERROR` with the sentence,
/// and the test fails with it.
pub(crate) fn wheel_for_tests(p: &Paths) -> Vec<(&'static str, Option<OsString>)> {
    let flavour = flavour(TEST_WHEEL);
    if let Err(err) = setup_wheel_tools(p).and_then(|()| setup_flavour(p, flavour)) {
        warn(format!("{err:#}; the wheel test (tests/tests/wheel.rs) will skip"));
        return vec![("PYPERCH_WHEEL", None), ("PYPERCH_WHEEL_ERROR", None)];
    }
    match build_wheel(p, flavour, &p.target.join("wheels")) {
        Ok(wheel) => vec![
            ("PYPERCH_WHEEL", Some(wheel.into())),
            ("PYPERCH_AUDITWHEEL", Some(auditwheel(p).into())),
            ("PYPERCH_WHEEL_ERROR", None),
        ],
        Err(err) => {
            warn(format!("{err:#}; the wheel test (tests/tests/wheel.rs) will fail with this"));
            vec![("PYPERCH_WHEEL", None), ("PYPERCH_WHEEL_ERROR", Some(format!("{err:#}").into()))]
        }
    }
}

/// Builds `flavour`'s wheel into `out` and checks its platform tags with auditwheel; returns
/// its path. Needs [`setup_wheel_tools`], [`setup_flavour`] and what `cargo xtask setup`
/// installs (bpf-linker).
pub(crate) fn build_wheel(p: &Paths, flavour: &Flavour, out: &Path) -> Result<PathBuf> {
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    remove_old_wheels(out)?;
    let mut maturin = Command::new(wheel_tools_venv(p).join("bin/maturin"));
    maturin.current_dir(&p.root).args(["build", "--release", "--strip", "--out"]).arg(out);
    if let Some(target) = flavour.target {
        maturin.args(["--target", target]);
    }
    if !flavour.compatibility.is_empty() {
        maturin.arg("--compatibility").args(flavour.compatibility);
    }
    maturin.env("CARGO_TARGET_DIR", &p.target);
    step(format!("wheel ({}): {}", format!("{:?}", flavour.libc).to_lowercase(), shown(&maturin)));
    run_checked(&mut maturin, "building the wheel with maturin")?;
    let wheel = only_wheel(out)?;
    let claimed = platform_tags(&wheel)?;
    let audit = auditwheel_show(p, &wheel)?;
    check_policy(&claimed, &audit)?;
    step(format!(
        "wheel: {} (auditwheel: consistent with {}, {}; claims {})",
        wheel.display(),
        audit.overall_tag,
        if audit.is_self_contained() { "no shared library needed" } else { "needs the system's C library" },
        claimed.join(", ")
    ));
    Ok(wheel)
}

/// A command's program (file name only) and arguments, for the step line.
fn shown(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program()).file_name().unwrap_or_default().to_string_lossy().into_owned();
    std::iter::once(program).chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned())).collect::<Vec<_>>().join(" ")
}

/// Whether the tools venv holds exactly the pinned [`WHEEL_TOOLS`].
fn wheel_tools_present(python: &Path) -> bool {
    let names: Vec<&str> = WHEEL_TOOLS.iter().map(|(name, _)| *name).collect();
    let script = format!("import importlib.metadata as m; print(' '.join(m.version(n) for n in {names:?}))");
    let wanted: Vec<&str> = WHEEL_TOOLS.iter().map(|(_, version)| *version).collect();
    Command::new(python)
        .args(["-c", &script])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == wanted.join(" "))
}

/// Creates the tools venv and installs the pinned [`WHEEL_TOOLS`] when they are missing.
pub(crate) fn setup_wheel_tools(p: &Paths) -> Result<()> {
    let venv = wheel_tools_venv(p);
    let python = venv.join("bin/python");
    let pins: Vec<String> = WHEEL_TOOLS.iter().map(|(name, version)| format!("{name}=={version}")).collect();
    if wheel_tools_present(&python) {
        step(format!("wheel tools: present ({}, {})", pins.join(", "), venv.display()));
        return Ok(());
    }
    step(format!("wheel tools: installing {} into {}", pins.join(", "), venv.display()));
    if !python.is_file() {
        let host_python = find_program("python3")
            .ok_or_else(|| anyhow!("python3 is not installed, and the wheel tools need a venv"))?;
        run_checked(Command::new(host_python).arg("-m").arg("venv").arg(&venv), "creating the wheel tools' venv")?;
    }
    run_checked(
        Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(&pins),
        "installing maturin and auditwheel",
    )?;
    if !wheel_tools_present(&python) {
        bail!("{} still does not hold {} after installing them", venv.display(), pins.join(" and "));
    }
    Ok(())
}

/// What `flavour`'s build needs beyond `cargo xtask setup`: its Rust target's standard
/// library (`rustup target add`) and its Debian packages, each installed when missing.
pub(crate) fn setup_flavour(p: &Paths, flavour: &Flavour) -> Result<()> {
    if let Some(target) = flavour.target {
        ensure_rust_target(&p.root, target)?;
    }
    for (program, package) in flavour.apt {
        if find_program(program).is_some() {
            step(format!("{program} ({package}): present"));
            continue;
        }
        if !is_root() {
            bail!("{program} is missing and installing Debian's {package} needs root");
        }
        step(format!("{program}: missing, running `apt-get install -y {package}`"));
        let mut install = Command::new("apt-get");
        install.args(["install", "-y", package]).env("DEBIAN_FRONTEND", "noninteractive");
        let what = format!("installing {package}");
        if !status_of(&mut install, &what)?.success() {
            run_checked(Command::new("apt-get").arg("update"), "apt-get update")?;
            run_checked(&mut install, &what)?;
        }
    }
    Ok(())
}

/// `rustup target add TARGET` for the toolchain that builds pyperch in `root`, unless
/// installed.
fn ensure_rust_target(root: &Path, target: &str) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .current_dir(root)
        .output()
        .context("could not run `rustup target list --installed`")?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|l| l.trim() == target) {
        step(format!("Rust target {target}: present"));
        return Ok(());
    }
    step(format!("Rust target {target}: missing, running `rustup target add {target}`"));
    run_checked(
        Command::new("rustup").args(["target", "add", target]).current_dir(root),
        &format!("installing the Rust standard library for {target}"),
    )
}

/// The `pyperch-*.whl` files in `dir`.
fn wheels_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    Ok(entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("pyperch-") && n.ends_with(".whl"))
        })
        .collect())
}

/// Removes earlier pyperch wheels from `out`, so that the one maturin writes is the only one.
fn remove_old_wheels(out: &Path) -> Result<()> {
    for old in wheels_in(out)? {
        fs::remove_file(&old).with_context(|| format!("cannot remove the older wheel {}", old.display()))?;
    }
    Ok(())
}

/// The one wheel maturin wrote into `out`.
fn only_wheel(out: &Path) -> Result<PathBuf> {
    match wheels_in(out)?.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("maturin succeeded but wrote no pyperch-*.whl into {}", out.display()),
        many => bail!("maturin wrote {} pyperch wheels into {}, expected one", many.len(), out.display()),
    }
}

/// The platform tags of a wheel's file name (`NAME-VERSION-PY-ABI-PLATFORM.whl`; PLATFORM
/// may hold several tags joined by dots).
pub(crate) fn platform_tags(wheel: &Path) -> Result<Vec<String>> {
    let name = wheel
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no UTF-8 file name", wheel.display()))?;
    let platform = name
        .strip_suffix(".whl")
        .and_then(|stem| stem.rsplit('-').next())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| anyhow!("{name} is not a wheel file name (NAME-VERSION-PY-ABI-PLATFORM.whl)"))?;
    Ok(platform.split('.').map(str::to_string).collect())
}

/// What `auditwheel show --json` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Audit {
    /// The most compatible platform tag the wheel is consistent with.
    pub overall_tag: String,
    /// Shared libraries the wheel's ELF files need from the system.
    pub external_libs: usize,
    /// Libraries whose versioned symbols they reference.
    pub versioned_symbols: usize,
}

impl Audit {
    /// Needs no shared library and no versioned symbol: statically linked, so no C library
    /// of the host's is involved (auditwheel cannot tell glibc from musl then, and says so).
    pub fn is_self_contained(&self) -> bool {
        self.external_libs == 0 && self.versioned_symbols == 0
    }

    /// Reads `auditwheel show --json`'s output.
    pub fn parse(json: &str) -> Result<Audit> {
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| anyhow!("`auditwheel show --json` printed no JSON: {e}"))?;
        let overall_tag = v["overall_tag"]
            .as_str()
            .ok_or_else(|| anyhow!("`auditwheel show --json` gave no overall_tag"))?
            .to_string();
        let count = |key: &str| v[key].as_object().map_or(0, |o| o.len());
        Ok(Audit { overall_tag, external_libs: count("external_libs"), versioned_symbols: count("versioned_symbols") })
    }
}

/// `auditwheel show --json WHEEL`.
fn auditwheel_show(p: &Paths, wheel: &Path) -> Result<Audit> {
    let out = Command::new(auditwheel(p))
        .args(["show", "--json"])
        .arg(wheel)
        .output()
        .map_err(|e| anyhow!("could not run {}: {e}", auditwheel(p).display()))?;
    if !out.status.success() {
        bail!(
            "`auditwheel show {}` failed ({}): {}",
            wheel.display(),
            describe(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Audit::parse(&String::from_utf8_lossy(&out.stdout))
}

/// A Linux platform tag's C library family and version: `manylinux_2_17_x86_64` →
/// ("manylinux", 2, 17); the legacy aliases by the glibc they stand for (PEP 600).
pub(crate) fn policy(tag: &str) -> Option<(&'static str, u32, u32)> {
    const LEGACY: [(&str, u32, u32); 3] = [("manylinux1_", 2, 5), ("manylinux2010_", 2, 12), ("manylinux2014_", 2, 17)];
    if let Some((_, major, minor)) = LEGACY.iter().find(|(prefix, ..)| tag.starts_with(prefix)) {
        return Some(("manylinux", *major, *minor));
    }
    let (family, rest) = ["manylinux", "musllinux"]
        .into_iter()
        .find_map(|family| Some((family, tag.strip_prefix(family)?.strip_prefix('_')?)))?;
    let mut numbers = rest.splitn(3, '_');
    let major = numbers.next()?.parse().ok()?;
    let minor = numbers.next()?.parse().ok()?;
    Some((family, major, minor))
}

/// Every tag the wheel claims must be a policy it meets: a manylinux tag no older than the
/// one auditwheel found (a wheel needing glibc 2.34 may not claim manylinux_2_17); a
/// musllinux tag only for a self-contained wheel ([`Audit::is_self_contained`]), which
/// needs nothing of any C library (auditwheel analyses one libc per wheel and reports the
/// glibc policy then).
pub(crate) fn check_policy(claimed: &[String], audit: &Audit) -> Result<()> {
    let found = &audit.overall_tag;
    let (family, major, minor) = policy(found)
        .filter(|(family, ..)| *family == "manylinux" || audit.is_self_contained())
        .ok_or_else(|| anyhow!("auditwheel found the wheel consistent with {found:?}, which is no manylinux tag"))?;
    for tag in claimed {
        let ok = match policy(tag) {
            Some(("musllinux", ..)) => audit.is_self_contained(),
            Some((f, ma, mi)) => f == family && (ma, mi) >= (major, minor),
            None => false,
        };
        if !ok {
            bail!("the wheel claims the platform tag {tag}, but auditwheel finds it consistent only with {found}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(tags: &[&str]) -> Vec<String> {
        tags.iter().map(|t| t.to_string()).collect()
    }

    fn audit(tag: &str, self_contained: bool) -> Audit {
        let n = usize::from(!self_contained);
        Audit { overall_tag: tag.to_string(), external_libs: n, versioned_symbols: n }
    }

    #[test]
    fn platform_tags_come_from_the_file_name() {
        let tags = platform_tags(Path::new("/x/pyperch-0.1.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")).unwrap();
        assert_eq!(tags, ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]);
        assert!(platform_tags(Path::new("pyperch.tar.gz")).is_err());
    }

    #[test]
    fn auditwheel_json_is_read() {
        let glibc = r#"{"version": 1, "overall_tag": "manylinux_2_34_x86_64", "external_libs": {},
            "versioned_symbols": {"libc.so.6": ["GLIBC_2.34"], "libgcc_s.so.1": ["GCC_3.0"]}}"#;
        assert_eq!(Audit::parse(glibc).unwrap(), Audit { overall_tag: "manylinux_2_34_x86_64".into(), external_libs: 0, versioned_symbols: 2 });
        let static_musl = r#"{"overall_tag": "manylinux_2_5_x86_64", "external_libs": {}, "versioned_symbols": {}}"#;
        assert!(Audit::parse(static_musl).unwrap().is_self_contained());
        assert!(Audit::parse("not json").is_err());
        assert!(Audit::parse("{}").is_err());
    }

    #[test]
    fn a_wheel_may_claim_only_policies_it_meets() {
        let glibc_2_34 = audit("manylinux_2_34_x86_64", false);
        assert!(check_policy(&claims(&["manylinux_2_34_x86_64"]), &glibc_2_34).is_ok());
        assert!(check_policy(&claims(&["manylinux_2_17_x86_64"]), &glibc_2_34).is_err());
        assert!(check_policy(&claims(&["manylinux1_x86_64"]), &glibc_2_34).is_err());
        assert!(check_policy(&claims(&["musllinux_1_2_x86_64"]), &glibc_2_34).is_err());
        assert!(check_policy(&claims(&["linux_x86_64"]), &glibc_2_34).is_err());
        let glibc_2_17 = audit("manylinux_2_17_x86_64", false);
        assert!(check_policy(&claims(&["manylinux_2_17_x86_64", "manylinux2014_x86_64"]), &glibc_2_17).is_ok());
        let static_binary = audit("manylinux_2_5_x86_64", true);
        let musl_wheel = ["manylinux1_x86_64", "manylinux_2_5_x86_64", "musllinux_1_1_x86_64"];
        assert!(check_policy(&claims(&musl_wheel), &static_binary).is_ok());
    }

    #[test]
    fn every_libc_has_a_flavour() {
        for libc in [Libc::Musl, Libc::Glibc] {
            assert_eq!(flavour(libc).libc, libc);
        }
    }
}
