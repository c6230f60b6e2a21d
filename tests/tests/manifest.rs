//! `deploy/kubernetes/` stays valid and honest:
//! - it validates in strict mode against the oldest and the newest Kubernetes versions
//!   docs/kubernetes.md names (`Supported Kubernetes versions: A to B`), with PyPI's
//!   `kubernetes-validate` (installed in the test venv by `cargo xtask test`);
//! - upload credentials come only from the Secret mounted as files, through `--upload-*-file`
//!   flags that `pyperch agent --help` lists;
//! - the memory limit is the soak test's measured peak (docs/safety.md, *Memory*) plus the margin
//!   the manifest states;
//! - the image is the one `cargo xtask image` builds (`localhost/pyperch:<version>`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use pyperch_tests::*;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn manifests() -> Vec<PathBuf> {
    let dir = repo_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
}

/// The venv's python when it has kubernetes-validate (and so PyYAML); else SKIP.
fn validator_python() -> Option<PathBuf> {
    let python = test_venv().join("bin/python");
    let ok = Command::new(&python).args(["-c", "import kubernetes_validate, yaml"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip(format!(
            "{} has no kubernetes-validate (`cargo xtask test` installs it from PyPI; PyPI may have been unreachable)",
            python.display()
        ));
        return None;
    }
    Some(python)
}

/// Every document of the manifest as JSON (PyYAML's safe loader).
fn documents(python: &Path, file: &Path) -> Vec<Value> {
    let out = Command::new(python)
        .args(["-c", "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))"])
        .arg(file)
        .output()
        .expect("python");
    assert!(out.status.success(), "{} does not parse as YAML: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("JSON")
}

fn agent_container(python: &Path) -> Value {
    for file in manifests() {
        for doc in documents(python, &file) {
            if doc["kind"] == "DaemonSet" {
                return doc["spec"]["template"]["spec"].clone();
            }
        }
    }
    panic!("no DaemonSet in deploy/kubernetes/");
}

/// `(oldest, newest)` from docs/kubernetes.md's line `Supported Kubernetes versions: 1.A to 1.B`.
fn supported_versions() -> (String, String) {
    let readme = fs::read_to_string(repo_root().join("docs/kubernetes.md")).expect("docs/kubernetes.md");
    let line = readme
        .lines()
        .find_map(|l| l.split_once("Supported Kubernetes versions:").map(|(_, r)| r.to_string()))
        .expect("docs/kubernetes.md names the supported Kubernetes versions (`Supported Kubernetes versions: 1.A to 1.B`)");
    let words: Vec<&str> = line.split_whitespace().map(|w| w.trim_matches(|c: char| !c.is_ascii_digit() && c != '.')).collect();
    let versions: Vec<&str> = words.iter().copied().filter(|w| w.starts_with("1.")).collect();
    assert!(versions.len() >= 2, "cannot read the versions in {line:?}");
    (versions[0].to_string(), versions[1].to_string())
}

#[test]
fn manifest_validates_strictly_against_oldest_and_newest_kubernetes() {
    let Some(python) = validator_python() else { return };
    let (oldest, newest) = supported_versions();
    for version in [&oldest, &newest] {
        for file in manifests() {
            let out = Command::new(&python)
                .args(["-m", "kubernetes_validate", "--strict", "--kubernetes-version", &format!("{version}.0")])
                .arg(&file)
                .output()
                .expect("kubernetes-validate");
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            note(format!("kubernetes-validate --strict -k {version}.0 {}: {}", file.display(), text.trim().replace('\n', " | ")));
            assert!(out.status.success(), "{} is not valid for Kubernetes {version} (strict):\n{text}", file.display());
            assert!(text.contains("passed"), "kubernetes-validate checked nothing in {}:\n{text}", file.display());
        }
    }
}

#[test]
fn manifest_upload_credentials_come_from_the_secret_as_files() {
    let Some(python) = validator_python() else { return };
    let spec = agent_container(&python);
    let container = &spec["containers"][0];
    // The Secret volume and its mount.
    let volume = spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["secret"].is_object()))
        .expect("a Secret volume for the upload credentials");
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == volume["name"]))
        .expect("the Secret volume is mounted");
    assert_eq!(mount["readOnly"], true, "the credentials are mounted read-only");
    let dir = mount["mountPath"].as_str().expect("mountPath").to_string();

    // Every credential flag of the manifest, live or commented out, names a file of the
    // Secret, and is one the agent has.
    let text: String = manifests().iter().map(|f| fs::read_to_string(f).unwrap()).collect();
    let args: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().trim_start_matches('#').trim().strip_prefix("- ").map(|a| a.split_whitespace().next().unwrap_or("").trim_matches('"').to_string()))
        .collect();
    let help = pyperch(&["agent", "--help"], std::time::Duration::from_secs(30));
    assert!(help.success(), "pyperch agent --help failed{}", help.diag());
    let mut checked = 0;
    for (i, arg) in args.iter().enumerate() {
        if arg.starts_with("--upload-") && arg.ends_with("-file") {
            assert!(help.stdout.contains(arg.as_str()), "the manifest names {arg}, which `pyperch agent --help` does not list");
            let path = args.get(i + 1).expect("a path after the flag");
            // --upload-header-file takes NAME=FILE.
            let path = if arg == "--upload-header-file" { path.split_once('=').map_or(path.as_str(), |(_, p)| p) } else { path.as_str() };
            assert!(path.starts_with(&format!("{dir}/")), "{arg} {path} is not a file of the Secret mounted at {dir}");
            checked += 1;
        }
        assert!(
            !matches!(arg.as_str(), "--upload-password" | "--upload-token" | "--password" | "--token"),
            "a credential given as an argument ({arg}): it must come from a file"
        );
    }
    assert!(checked >= 2, "the manifest shows no --upload-*-file credentials ({checked})");
    let live: Vec<&str> = container["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert!(!live.iter().any(|a| a.contains("password") && !a.ends_with("-file")), "a password in the live arguments: {live:?}");
}

/// The first number in `text` after `marker`, as f64.
fn number_after(text: &str, marker: &str) -> Option<f64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let start = rest.find(|c: char| c.is_ascii_digit())?;
    let end = rest[start..].find(|c: char| !c.is_ascii_digit() && c != '.').map_or(rest.len(), |e| start + e);
    rest[start..end].trim_end_matches('.').parse().ok()
}

#[test]
fn manifest_memory_limit_is_the_soak_peak_plus_a_stated_margin() {
    let Some(python) = validator_python() else { return };
    let readme = fs::read_to_string(repo_root().join("docs/safety.md")).expect("docs/safety.md");
    let memory = &readme[readme.find("Soak test").expect("docs/safety.md's soak test paragraph")..];
    let peak = number_after(memory, "peak ").expect("docs/safety.md states the soak peak (`peak N MiB`)");
    let text = fs::read_to_string(repo_root().join("deploy/kubernetes/daemonset.yaml")).unwrap();
    let stated_peak = number_after(&text, "soak peak ").expect("the manifest states the soak peak it uses");
    let margin = number_after(&text, "margin ").expect("the manifest states its margin");
    assert_eq!(stated_peak, peak.ceil(), "the manifest's soak peak is not docs/safety.md's measured {peak} MiB (rounded up)");
    let spec = agent_container(&python);
    let limit = spec["containers"][0]["resources"]["limits"]["memory"].as_str().expect("a memory limit");
    let limit_mib: f64 = limit.strip_suffix("Mi").and_then(|n| n.parse().ok()).expect("the limit in Mi");
    note(format!("memory limit {limit} = soak peak {stated_peak} MiB (docs/safety.md: {peak}) + margin {margin} MiB"));
    assert_eq!(limit_mib, stated_peak + margin, "the limit {limit} is not soak peak {stated_peak} + margin {margin} MiB");
}

#[test]
fn manifest_image_is_the_one_cargo_xtask_image_builds() {
    let Some(python) = validator_python() else { return };
    let cargo = fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    let version = cargo
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = ").map(|v| v.trim_matches('"').to_string()))
        .expect("the workspace version");
    let spec = agent_container(&python);
    let image = spec["containers"][0]["image"].as_str().expect("image");
    assert_eq!(image, format!("localhost/pyperch:{version}"), "the manifest's image is not the name `cargo xtask image` gives");
    let readme = fs::read_to_string(repo_root().join("docs/kubernetes.md")).expect("docs/kubernetes.md");
    assert!(readme.contains(image), "docs/kubernetes.md does not name the image {image}");
}
