//! What the Kubernetes tests (tests/tests/kubernetes.rs, tests/tests/manifest.rs) need:
//! Debian's `containerd` (its `ctr` runs both containers of tests/tests/kubernetes.rs; the test
//! starts its own daemon), `runc` (the OCI runtime containerd's shim and CRI-O run
//! containers with, and the test's fallback when containerd cannot run here) and `conmon`
//! (CRI-O's container monitor: the CRI-O cases start it as CRI-O does; Debian packages no
//! CRI-O itself, in any suite), Debian's `podman` (tests/tests/image.rs builds the image
//! from deploy/Containerfile with it), and PyPI's `kubernetes-validate` (pinned: its release
//! fixes which Kubernetes schemas it ships) in the test venv. Each is installed only when
//! missing; a failure makes those tests skip with the reason.

use std::process::{Command, Stdio};

use super::*;

/// The validator and its schemas (Kubernetes 1.25-1.37 for this release).
pub(crate) const KUBERNETES_VALIDATE_SPEC: &str = "kubernetes-validate==1.37.0";

pub(crate) fn setup_kubernetes_tests(p: &Paths) {
    apt_install_if_missing("runc", "runc", "the Kubernetes runtime tests");
    apt_install_if_missing("ctr", "containerd", "the Kubernetes runtime tests through containerd");
    apt_install_if_missing("conmon", "conmon", "the Kubernetes CRI-O tests");
    apt_install_if_missing("podman", "podman", "the image build test");
    let python = p.cache.join("test-venv/bin/python");
    let present = || {
        Command::new(&python)
            .args(["-c", "import importlib.metadata as m; assert m.version('kubernetes-validate') == '1.37.0'"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if present() {
        step(format!("{KUBERNETES_VALIDATE_SPEC}: present in the test venv"));
        return;
    }
    if !python.is_file() {
        warn("no test venv: the manifest validation test skips");
        return;
    }
    step(format!("test venv: pip install {KUBERNETES_VALIDATE_SPEC}"));
    let ok = status_of(Command::new(&python).args(["-m", "pip", "install", "--quiet", KUBERNETES_VALIDATE_SPEC]), "installing kubernetes-validate")
        .is_ok_and(|s| s.success());
    if !ok || !present() {
        warn(format!("could not install {KUBERNETES_VALIDATE_SPEC}; the manifest validation test skips"));
    }
}
