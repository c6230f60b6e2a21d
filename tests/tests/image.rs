//! The agent's image: `deploy/Containerfile` builds offline (`--network none`, no pulls) with
//! Debian's podman from the context `cargo xtask test` stages (as `cargo xtask image` does),
//! and the image holds exactly the stripped binary, the shared libraries `ldd` lists for it,
//! the CA bundle and empty mount points; its entry point is the binary, on `PATH`.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use pyperch_tests::*;

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Paths (no leading `/` or `./`, directories without a trailing `/`) in a tar archive.
fn tar_entries(tar: &Path) -> Result<BTreeSet<String>, String> {
    Ok(run(Command::new("tar").arg("-tf").arg(tar))?
        .lines()
        .map(|l| l.trim_start_matches("./").trim_start_matches('/').trim_end_matches('/').to_string())
        .filter(|l| !l.is_empty() && l != ".")
        .collect())
}

#[test]
fn image_builds_offline_and_holds_only_the_binary_and_its_libraries() {
    if !is_root() {
        skip("building an image with podman needs root here");
        return;
    }
    if Command::new("podman").arg("--version").stdout(Stdio::null()).status().is_err() {
        skip("podman is not installed (`cargo xtask test` installs Debian's podman)");
        return;
    }
    let Some(rootfs) = std::env::var_os("PYPERCH_IMAGE_ROOTFS").map(PathBuf::from) else {
        skip("PYPERCH_IMAGE_ROOTFS is not set: `cargo xtask test` stages the image's build context");
        return;
    };
    let context = rootfs.parent().expect("the context holds rootfs/").to_path_buf();
    let name = format!("localhost/pyperch-e2e:{}", random_hex(8));
    let dir = std::env::temp_dir().join("pyperch-tests").join(format!("image-{}", random_hex(8)));
    fs::create_dir_all(&dir).unwrap();
    let result = (|| -> Result<(), String> {
        run(Command::new("podman")
            .args(["build", "--network", "none", "--pull=never", "-f"])
            .arg(context.join("Containerfile"))
            .args(["-t", &name])
            .arg(&context))?;
        let size: u64 = run(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &name]))?
            .trim()
            .parse()
            .map_err(|e| format!("image size: {e}"))?;
        note(format!("{name}: {size} bytes ({:.1} MiB)", size as f64 / 1048576.0));
        assert!(size < 32 << 20, "the image is {size} bytes: more than the binary and its libraries");
        let config = run(Command::new("podman").args(["image", "inspect", "--format", "{{json .Config}}", &name]))?;
        let config: serde_json::Value = serde_json::from_str(&config).map_err(|e| e.to_string())?;
        assert_eq!(config["Entrypoint"], serde_json::json!(["/usr/local/bin/pyperch"]), "entry point: {config}");
        assert!(
            config["Env"].as_array().is_some_and(|e| e.iter().any(|v| v == "PATH=/usr/local/bin")),
            "pyperch is not on the image's PATH: {config}"
        );

        // The layers' files, exactly.
        let archive = dir.join("image.tar");
        run(Command::new("podman").args(["save", "--format", "docker-archive", "-o"]).arg(&archive).arg(&name))?;
        let unpacked = dir.join("unpacked");
        fs::create_dir_all(&unpacked).unwrap();
        run(Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&unpacked))?;
        let manifest: serde_json::Value =
            serde_json::from_slice(&fs::read(unpacked.join("manifest.json")).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        let mut files = BTreeSet::new();
        for layer in manifest[0]["Layers"].as_array().ok_or("no layers")? {
            files.extend(tar_entries(&unpacked.join(layer.as_str().ok_or("layer name")?))?);
        }
        let mut want: BTreeSet<String> = ["usr/local/bin/pyperch", "etc/ssl/certs/ca-certificates.crt", "tmp", "proc", "dev", "sys"]
            .map(String::from)
            .into();
        let ldd = run(Command::new("ldd").arg(pyperch_bin()))?;
        for line in ldd.lines() {
            let path = line.split_once("=>").map_or(line, |(_, r)| r).split_whitespace().next().unwrap_or("");
            if let Some(rel) = path.strip_prefix('/') {
                want.insert(rel.to_string());
            }
        }
        // Parent directories of the files.
        for f in want.clone() {
            let mut p = Path::new(&f).parent();
            while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty()) {
                want.insert(dir.to_string_lossy().into_owned());
                p = dir.parent();
            }
        }
        assert_eq!(files, want, "the image's files are not exactly the binary, its libraries, the CA bundle and mount points");
        Ok(())
    })();
    let _ = Command::new("podman").args(["rmi", "-f", &name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    let _ = fs::remove_dir_all(&dir);
    result.unwrap_or_else(|e| panic!("{e}"));
}
