//! `cargo xtask wheel [--out DIR]`: the `pyperch` wheel, so that `pip install pyperch` gives a
//! `pyperch` command (as `pip install py-spy` does).
//!
//! maturin's binary bindings (`bindings = "bin"`, the repository's `pyproject.toml`) package
//! the release binary, which carries its kernel programs inside (`include_bytes_aligned!` of
//! profiler-user's build.rs), so the wheel needs no other file. maturin builds with the
//! same profile and target directory as `cargo xtask build`: only the final link differs
//! (`--strip`), and cargo keeps both links apart, so the wheel costs seconds after a build.
//! The one visible effect: `target/release/pyperch` is the stripped copy until the next
//! `cargo build` puts the unstripped one back (cargo relinks nothing, it links the kept file).
//!
//! Invariants:
//! - maturin and auditwheel are the pinned [`WHEEL_TOOLS`], in their own venv under the
//!   per-user cache (`~/.cache/pyperch/wheel-tools`), installed only when missing.
//! - The wheel returned is the only `pyperch-*.whl` in the output folder (older ones are
//!   removed first), and `auditwheel show` found it consistent with every platform tag its
//!   file name claims: a wheel claiming a policy it does not meet is an error.

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

/// The venv holding [`WHEEL_TOOLS`].
pub(crate) fn wheel_tools_venv(p: &Paths) -> PathBuf {
    p.cache.join("wheel-tools")
}

/// The `auditwheel` of the tools venv (the end-to-end test runs it too).
pub(crate) fn auditwheel(p: &Paths) -> PathBuf {
    wheel_tools_venv(p).join("bin/auditwheel")
}

/// `cargo xtask wheel [--out DIR]` (default `target/wheels`).
pub(crate) fn wheel(p: &Paths, out: Option<PathBuf>) -> Result<()> {
    let out = match out {
        Some(dir) if dir.is_relative() => env::current_dir()?.join(dir),
        Some(dir) => dir,
        None => p.target.join("wheels"),
    };
    setup(p)?;
    setup_wheel_tools(p)?;
    let wheel = build_wheel(p, &out)?;
    step(format!("wheel: install it with `pip install {}`", wheel.display()));
    Ok(())
}

/// Builds the wheel into `out` and checks its platform tags with auditwheel; returns its
/// path. Needs [`setup_wheel_tools`] and what `cargo xtask setup` installs (bpf-linker).
pub(crate) fn build_wheel(p: &Paths, out: &Path) -> Result<PathBuf> {
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    remove_old_wheels(out)?;
    step(format!("wheel: maturin build --release --strip --out {}", out.display()));
    run_checked(
        Command::new(wheel_tools_venv(p).join("bin/maturin"))
            .current_dir(&p.root)
            .args(["build", "--release", "--strip", "--out"])
            .arg(out)
            .env("CARGO_TARGET_DIR", &p.target),
        "building the wheel with maturin",
    )?;
    let wheel = only_wheel(out)?;
    let claimed = platform_tags(&wheel)?;
    let consistent = auditwheel_show(p, &wheel)?;
    check_policy(&claimed, &consistent)?;
    step(format!(
        "wheel: {} (auditwheel: consistent with {consistent}; claims {})",
        wheel.display(),
        claimed.join(", ")
    ));
    Ok(wheel)
}

/// The wheel for tests/tests/wheel.rs, as the environment of the end-to-end tests:
/// `PYPERCH_WHEEL` and `PYPERCH_AUDITWHEEL` when it was built and checked; when the tools
/// cannot be installed (PyPI unreachable) nothing, and the test skips; when the build or the
/// policy check fails, `PYPERCH_WHEEL_ERROR` with the sentence, and the test fails with it.
/// Runs before `build_only`, which puts the unstripped `target/release/pyperch` back.
pub(crate) fn wheel_for_tests(p: &Paths) -> Vec<(&'static str, Option<OsString>)> {
    if let Err(err) = setup_wheel_tools(p) {
        warn(format!("{err:#}; the wheel test (tests/tests/wheel.rs) will skip"));
        return vec![("PYPERCH_WHEEL", None), ("PYPERCH_WHEEL_ERROR", None)];
    }
    match build_wheel(p, &p.target.join("wheels")) {
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

/// Whether the tools venv holds exactly the pinned [`WHEEL_TOOLS`].
fn wheel_tools_present(python: &Path) -> bool {
    let names: Vec<&str> = WHEEL_TOOLS.iter().map(|(name, _)| *name).collect();
    let script = format!(
        "import importlib.metadata as m; print(' '.join(m.version(n) for n in {names:?}))"
    );
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

/// `auditwheel show WHEEL`: the most compatible platform tag the wheel is consistent with.
fn auditwheel_show(p: &Paths, wheel: &Path) -> Result<String> {
    let out = Command::new(auditwheel(p))
        .arg("show")
        .arg(wheel)
        .output()
        .map_err(|e| anyhow!("could not run {}: {e}", auditwheel(p).display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "`auditwheel show {}` failed ({}): {}",
            wheel.display(),
            describe(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    consistent_tag(&text).ok_or_else(|| anyhow!("`auditwheel show` named no platform tag the wheel is consistent with: {}", text.trim()))
}

/// The tag of auditwheel's sentence `... is consistent with the following platform tag:
/// "TAG".` (auditwheel wraps its lines, so the words are joined first).
pub(crate) fn consistent_tag(show_output: &str) -> Option<String> {
    let words = show_output.split_whitespace().collect::<Vec<_>>().join(" ");
    let rest = words.split("consistent with the following platform tag: ").nth(1)?;
    let tag = rest.trim_start_matches('"').split('"').next()?;
    (!tag.is_empty()).then(|| tag.to_string())
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

/// Every tag the wheel claims must be a Linux policy no older than the one auditwheel found
/// it consistent with, in the same C library family (a wheel needing glibc 2.34 may not
/// claim manylinux_2_17).
pub(crate) fn check_policy(claimed: &[String], consistent: &str) -> Result<()> {
    let (family, major, minor) =
        policy(consistent).ok_or_else(|| anyhow!("auditwheel named {consistent:?}, which is no manylinux or musllinux tag"))?;
    for tag in claimed {
        match policy(tag) {
            Some((f, ma, mi)) if f == family && (ma, mi) >= (major, minor) => {}
            _ => bail!("the wheel claims the platform tag {tag}, but auditwheel finds it consistent only with {consistent}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_tags_come_from_the_file_name() {
        let tags = platform_tags(Path::new("/x/pyperch-0.1.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")).unwrap();
        assert_eq!(tags, ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]);
        assert!(platform_tags(Path::new("pyperch.tar.gz")).is_err());
    }

    #[test]
    fn auditwheel_sentence_is_read_across_wrapped_lines() {
        let out = "pyperch-0.1.0-py3-none-manylinux_2_34_x86_64.whl is consistent with\nthe following platform tag: \"manylinux_2_34_x86_64\".\n\nThe wheel references ...";
        assert_eq!(consistent_tag(out).as_deref(), Some("manylinux_2_34_x86_64"));
        assert_eq!(consistent_tag("nothing here"), None);
    }

    #[test]
    fn a_wheel_may_claim_only_policies_it_meets() {
        let claims = |tags: &[&str]| tags.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert!(check_policy(&claims(&["manylinux_2_34_x86_64"]), "manylinux_2_34_x86_64").is_ok());
        assert!(check_policy(&claims(&["manylinux_2_17_x86_64", "manylinux2014_x86_64"]), "manylinux_2_17_x86_64").is_ok());
        assert!(check_policy(&claims(&["manylinux_2_17_x86_64"]), "manylinux_2_34_x86_64").is_err());
        assert!(check_policy(&claims(&["manylinux1_x86_64"]), "manylinux_2_17_x86_64").is_err());
        assert!(check_policy(&claims(&["musllinux_1_2_x86_64"]), "manylinux_2_17_x86_64").is_err());
        assert!(check_policy(&claims(&["linux_x86_64"]), "manylinux_2_34_x86_64").is_err());
    }
}
