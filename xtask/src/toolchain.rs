//! `cargo xtask setup`: what building pyperch needs — the nightly toolchain's `rust-src`,
//! and bpf-linker (pinned, `--locked`) linked against the LLVM inside that toolchain, cached
//! in `$HOME/.cache/pyperch/tools`. Idempotent.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, anyhow, bail};

use super::*;


pub(crate) fn setup(p: &Paths) -> Result<()> {
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

pub(crate) fn nightly_sysroot() -> Result<PathBuf> {
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

pub(crate) fn ensure_rust_src(sysroot: &Path) -> Result<()> {
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
pub(crate) fn bpf_linker_version(p: &Paths) -> Option<String> {
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
pub(crate) const BPF_LINKER_VERSION: &str = "0.13.0";

/// Whether a `bpf-linker --version` line names the pinned release.
pub(crate) fn is_pinned_bpf_linker(version_line: &str) -> bool {
    version_line.split_whitespace().nth(1) == Some(BPF_LINKER_VERSION)
}

pub(crate) fn ensure_bpf_linker(p: &Paths, nightly_sysroot: &Path) -> Result<()> {
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
