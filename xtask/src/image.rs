//! `cargo xtask image`: the OCI image of the agent, built offline.
//!
//! The image holds the stripped release binary and exactly the shared libraries it links
//! (as `ldd` lists them: the C library, libgcc_s and the dynamic loader), the system's CA
//! bundle for HTTPS uploads, empty mount points (`/tmp`, `/proc`, `/dev`, `/sys`), and nothing else: `deploy/Containerfile` is
//! `FROM scratch`, so no base image is pulled. This module stages the build context
//! (`target/image/`: `rootfs/` and a copy of the Containerfile) and runs the container tool
//! found on the machine (podman, else a docker whose daemon answers; Debian's podman is
//! installed when neither is there) with `--network none` and no pulls.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, anyhow, bail};

use super::*;

/// The image's name as docs/kubernetes.md and the manifest give it (`localhost/` is podman's
/// prefix for images that come from no registry).
pub(crate) fn default_image_name() -> String {
    format!("localhost/pyperch:{}", env!("CARGO_PKG_VERSION"))
}

/// Where the binary sits in the image (on the image's PATH).
const BINARY_IN_IMAGE: &str = "usr/local/bin/pyperch";
/// The CA bundle the agent reads for HTTPS uploads (profiler-user/src/export/upload/tls.rs).
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// `cargo xtask image [-- --name NAME] [--stage-only]`.
pub(crate) fn image(p: &Paths, args: &[String]) -> Result<()> {
    let mut name = default_image_name();
    let mut stage_only = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--name" => name = rest.next().ok_or_else(|| anyhow!("--name needs an image name"))?.clone(),
            "--stage-only" => stage_only = true,
            other => bail!("unknown option {other:?}; usage: cargo xtask image [-- --name NAME] [--stage-only]"),
        }
    }
    let bin = build(p)?;
    let context = p.target.join("image");
    stage(p, &bin, &context)?;
    if stage_only {
        step(format!("image: build context staged in {} (build it with: podman build -f deploy/Containerfile {})", context.display(), context.display()));
        return Ok(());
    }
    let tool = container_tool()?;
    step(format!("image: {tool} build -t {name} (offline, FROM scratch)"));
    run_checked(
        Command::new(&tool)
            .args(["build", "--network", "none", "--pull=never", "-f"])
            .arg(context.join("Containerfile"))
            .args(["-t", &name])
            .arg(&context),
        "building the image",
    )?;
    let size = image_size(&tool, &name)?;
    step(format!("image: {name}, {} ({size} bytes)", human(size)));
    println!("{name} {size}");
    Ok(())
}

/// Stages the build context in `context`: `Containerfile` and `rootfs/` with the stripped
/// binary, the shared libraries it needs, the CA bundle and `/tmp`.
pub(crate) fn stage(p: &Paths, bin: &Path, context: &Path) -> Result<()> {
    if context.exists() {
        fs::remove_dir_all(context).with_context(|| format!("removing the old {}", context.display()))?;
    }
    let rootfs = context.join("rootfs");
    let target = rootfs.join(BINARY_IN_IMAGE);
    fs::create_dir_all(target.parent().expect("has a parent"))?;
    run_checked(
        Command::new("strip").arg("--strip-all").arg("-o").arg(&target).arg(bin),
        "stripping the binary (strip, from binutils)",
    )?;
    for lib in shared_libraries(bin)? {
        let rel = lib.strip_prefix("/").unwrap_or(&lib);
        let dest = rootfs.join(rel);
        fs::create_dir_all(dest.parent().expect("has a parent"))?;
        // The file itself, not a symlink to it: the image has nothing else to point at.
        fs::copy(&lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
    }
    let ca = Path::new("/").join(CA_BUNDLE);
    if ca.is_file() {
        let dest = rootfs.join(CA_BUNDLE);
        fs::create_dir_all(dest.parent().expect("has a parent"))?;
        fs::copy(&ca, &dest).with_context(|| format!("copying {}", ca.display()))?;
    } else {
        warn(format!("{} is missing (Debian's ca-certificates): the image can only upload over plain HTTP or with --upload-ca-file", ca.display()));
    }
    // Empty mount points: /tmp (the writable scratch) and those every runtime mounts over;
    // with a read-only root filesystem nothing can create them later.
    for dir in ["tmp", "proc", "dev", "sys"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy(p.root.join("deploy/Containerfile"), context.join("Containerfile")).context("copying deploy/Containerfile")?;
    step(format!("image: staged {} (stripped binary {} bytes)", context.display(), fs::metadata(&target)?.len()));
    Ok(())
}

/// The shared libraries `bin` loads, as absolute paths, from `ldd`'s output (the vDSO has no
/// file and is left out).
pub(crate) fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().map_err(|e| anyhow!("running ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        bail!("ldd {} failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    }
    let libs = parse_ldd(&text)?;
    Ok(libs)
}

/// The library paths of `ldd` output lines `name => /path (addr)` and `/path (addr)`.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("=> not found") {
            bail!("a shared library of pyperch is missing: {line}");
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let path = path.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// podman, else a docker whose daemon answers; Debian's podman is installed when neither is.
pub(crate) fn container_tool() -> Result<String> {
    let works = |tool: &str| {
        find_program(tool).is_some()
            && Command::new(tool).arg("info").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if works("podman") {
        return Ok("podman".into());
    }
    if works("docker") {
        return Ok("docker".into());
    }
    apt_install_if_missing("podman", "podman", "the image build and the Kubernetes tests");
    if works("podman") {
        return Ok("podman".into());
    }
    bail!("no container tool: neither podman nor a docker with a running daemon is available, and Debian's podman could not be installed")
}

/// The image's size in bytes, as the tool reports it.
fn image_size(tool: &str, name: &str) -> Result<u64> {
    let out = Command::new(tool)
        .args(["image", "inspect", "--format", "{{.Size}}", name])
        .output()
        .map_err(|e| anyhow!("{tool} image inspect: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().map_err(|_| anyhow!("{tool} image inspect {name} gave no size: {text:?}"))
}

fn human(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        let libs = parse_ldd(text).unwrap();
        assert_eq!(
            libs,
            ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
                .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
    }

    #[test]
    fn name_follows_the_version() {
        assert_eq!(default_image_name(), format!("localhost/pyperch:{}", env!("CARGO_PKG_VERSION")));
    }
}
