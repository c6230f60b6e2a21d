//! A Kubernetes node as the DaemonSet sees it, with a real container runtime: Debian's
//! containerd (a daemon of the test's own, namespace `k8s.io`, its runc shim
//! `io.containerd.runc.v2`), driven through `ctr run --config <full OCI spec>` as the CRI
//! plugin drives it for a kubelet. Where containerd cannot start or run a probe container
//! here, the test says why (the exact error) and runs the same specs with Debian's `runc`
//! directly, on bundles laid out where containerd's shim keeps them. On a CRI-O node (Debian
//! packages no CRI-O, in any suite), the test plays CRI-O's part with the programs CRI-O runs
//! containers with: Debian's `conmon`, started with CRI-O's arguments in the bundle directory
//! (`<node>/<runroot>/overlay-containers/<id>/userdata`, a custom `runroot`), and `runc`.
//!
//! - A Python workload runs in a container whose bundle containerd's shim writes itself
//!   (`<state>/io.containerd.runtime.v2.task/k8s.io/<id>/config.json`, the state directory
//!   being `<node>/run/containerd`, or k3s's and RKE2's `<node>/run/k3s/containerd` in the
//!   k3s case, so the path below `<node>` is a node's; the agent gets
//!   `<node>` as the node's root), with the annotations containerd's CRI plugin writes
//!   (`io.kubernetes.cri.sandbox-name`, `-namespace`, `-uid`,
//!   `io.kubernetes.cri.container-name`...) and the cgroup path a kubelet gives it: cgroupfs
//!   driver `/kubepods/burstable/pod<uid>/<64-hex id>`, or the systemd driver's
//!   `kubepods.slice/.../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`
//!   (as a path: no systemd runs here).
//! - On a CRI-O node, the workload's bundle is CRI-O's run directory under a custom
//!   `runroot`, `<node>/run/custom-containers/storage/overlay-containers/<id>/userdata` (and
//!   its persistent copy under `<node>/var/lib/custom-containers/storage`), with the
//!   annotations CRI-O writes (`io.kubernetes.pod.name`, `.namespace`, `.uid`,
//!   `io.kubernetes.container.name`, `io.kubernetes.cri-o.*`...), in `/kubepods/burstable/pod<uid>/crio-<id>`
//!   or `kubepods-burstable-pod<uid>.slice/crio-<id>.scope`, conmon in `crio-conmon-<id>`
//!   beside it; pyperch finds the bundle from conmon only. A conmon whose bundle is not
//!   CRI-O's layout is refused (counted by `--stats`), its container unnamed.
//! - pyperch runs in a second container with exactly the privileges
//!   `deploy/kubernetes/daemonset.yaml` grants, read from the manifest: the host's PID
//!   namespace, only the manifest's capabilities (bounding, effective and permitted sets),
//!   no new privileges, the manifest's seccomp profile (`Localhost`:
//!   deploy/kubernetes/seccomp-pyperch.json as the spec's `linux.seccomp`), uid 0 (pyperch
//!   switches to 65534 once attached, with SETUID/SETGID from the list), a read-only root (the
//!   binary and the shared libraries it links, as the image holds them) with a writable
//!   scratch `/tmp` (0777, as an emptyDir), `/sys/kernel/btf` and `/sys/fs/cgroup` read-only, and the manifest's
//!   memory limit on its cgroup.
//! - Checked: `list` (CONTAINER, POD, NAME), a pprof recording filtered by `--namespace`
//!   and `--pod-name` (exact stacks; labels `container.id`, `k8s.pod.uid`,
//!   `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`), a `--by-container`
//!   recording (`pod <ns>/<name>`, `container <name>` frames), and the agent's uploads to a
//!   receiver on 127.0.0.1 (`service_name` `<namespace>/<container>`, the names as labels;
//!   that run shares the host's network namespace to reach it).
//!
//! Not expressible here, and said in the output: AppArmor (`Unconfined` in the manifest; this
//! kernel has no AppArmor, so no profile applies either way), the pod network (the agent
//! container gets an empty network namespace: these recordings upload nothing), and the
//! `emptyDir` size limit (kubelet eviction, not a runtime setting).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pyperch_tests::*;
use serde_json::json;

const MANIFEST: &str = "deploy/kubernetes/daemonset.yaml";
const NAMESPACE: &str = "shop";
const CONTAINER_NAME: &str = "checkout-api";
const SCRIPT: &str = r#"import sys, time

def leaf_checkout(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

def handle_request():
    return leaf_checkout(20000)

def main():
    deadline = time.monotonic() + float(sys.argv[1])
    print("ready", flush=True)
    while time.monotonic() < deadline:
        handle_request()

main()
"#;

/// Whole-line ranges of each function of [`SCRIPT`] (1-based, inclusive), and the line of
/// the module-level call.
fn script_lines(function: &str) -> (u32, u32) {
    let lines: Vec<&str> = SCRIPT.lines().collect();
    if function == "<module>" {
        let at = lines.iter().position(|l| *l == "main()").expect("main() call") as u32 + 1;
        return (at, at);
    }
    let start = lines.iter().position(|l| l.starts_with(&format!("def {function}("))).expect("function") + 1;
    let end = lines[start..].iter().position(|l| l.is_empty()).map_or(lines.len(), |n| start + n);
    (start as u32, end as u32)
}

/// The workload's call path, root first.
const CALL_PATH: [&str; 4] = ["<module>", "main", "handle_request", "leaf_checkout"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The manifest's container settings this test reproduces.
struct Grants {
    capabilities: Vec<String>,
    memory_limit: u64,
    /// The container's seccomp profile when the manifest names a `Localhost` one: the
    /// repository's deploy/kubernetes/seccomp-pyperch.json (OCI `linux.seccomp` format).
    seccomp: Option<serde_json::Value>,
}

/// Reads the capabilities and the memory limit of the agent container from the manifest
/// (a line-based read of the file's known shape; the validation test checks the schema).
fn manifest_grants() -> Result<Grants, String> {
    let text = fs::read_to_string(repo_root().join(MANIFEST)).map_err(|e| format!("{MANIFEST}: {e}"))?;
    let mut capabilities = Vec::new();
    let mut in_add = false;
    let mut memory_limit = None;
    let mut in_limits = false;
    let mut seccomp = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        if t == "localhostProfile: profiles/pyperch.json" {
            let path = repo_root().join("deploy/kubernetes/seccomp-pyperch.json");
            let profile = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            seccomp = Some(serde_json::from_slice(&profile).map_err(|e| format!("{}: {e}", path.display()))?);
        }
        if t == "add:" {
            in_add = true;
            continue;
        }
        if in_add {
            match t.strip_prefix("- ") {
                Some(cap) => capabilities.push(format!("CAP_{}", cap.trim())),
                None => in_add = false,
            }
        }
        if t == "limits:" {
            in_limits = true;
            continue;
        }
        if in_limits && let Some(v) = t.strip_prefix("memory:") {
            let v = v.trim().trim_matches('"');
            let mib: u64 = v.strip_suffix("Mi").and_then(|n| n.parse().ok()).ok_or(format!("memory limit {v:?} not in Mi"))?;
            memory_limit = Some(mib << 20);
            in_limits = false;
        }
    }
    if capabilities.is_empty() {
        return Err(format!("no capabilities.add list in {MANIFEST}"));
    }
    Ok(Grants { capabilities, memory_limit: memory_limit.ok_or(format!("no memory limit in {MANIFEST}"))?, seccomp })
}

/// The masked and read-only paths containerd's default spec gives an unprivileged container.
fn masked_paths() -> serde_json::Value {
    json!([
        "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
        "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
        "/sys/firmware", "/sys/devices/virtual/powercap"
    ])
}

fn readonly_paths() -> serde_json::Value {
    json!(["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"])
}

/// A container started with `runc`; killed, deleted and its bundle removed on drop.
struct RuncContainer {
    id: String,
    bundle: PathBuf,
    /// Directories to remove after the container (cgroup parents, the bundle's parents).
    cleanup: Vec<PathBuf>,
}

impl RuncContainer {
    /// `runc run --detach` of `config` in `bundle`; stdout and stderr go to `log`.
    fn start_detached(id: &str, bundle: &Path, config: &serde_json::Value, log: &Path) -> Result<Self, String> {
        fs::create_dir_all(bundle).map_err(|e| format!("{}: {e}", bundle.display()))?;
        fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(config).unwrap()).map_err(|e| e.to_string())?;
        let out = fs::File::create(log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let status = Command::new("runc")
            .args(["run", "--detach", "--bundle"])
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("runc: {e}"))?;
        let container = RuncContainer { id: id.into(), bundle: bundle.into(), cleanup: Vec::new() };
        if !status.success() {
            return Err(format!("runc run {id} failed: {}", fs::read_to_string(log).unwrap_or_default()));
        }
        Ok(container)
    }

    /// The container's init process as the host sees it.
    fn pid(&self) -> Option<u32> {
        let out = Command::new("runc").args(["state", &self.id]).output().ok()?;
        let state: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        state["pid"].as_u64().map(|p| p as u32)
    }
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        let _ = Command::new("runc").args(["kill", &self.id, "KILL"]).stderr(Stdio::null()).status();
        for _ in 0..50 {
            let ok = Command::new("runc").args(["delete", "--force", &self.id]).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = fs::remove_dir_all(&self.bundle);
        for dir in &self.cleanup {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// containerd's state directory below a node's root: kubeadm's (and containerd's default),
/// k3s's and RKE2's, microk8s's (the snap's), and docker's embedded containerd's.
const STATE_KUBEADM: &str = "run/containerd";
const STATE_K3S: &str = "run/k3s/containerd";
const STATE_MICROK8S: &str = "var/snap/microk8s/common/run/containerd";
const STATE_DOCKER: &str = "var/run/docker/containerd/daemon";

/// Where containerd's runc shim keeps a container's bundle, relative to its state directory
/// (`/run/containerd` on a node).
const TASK_DIR: &str = "io.containerd.runtime.v2.task/k8s.io";

/// A containerd daemon of this test's own (Debian's, through its runc shim): config, root,
/// state, runc root, FIFOs and sockets all in a temporary directory, so a system containerd
/// is never touched (containerd 1.6 puts only its shims' sockets, named by a hash of the
/// daemon's socket path, in `/run/containerd/s`); containers live in namespace `k8s.io`, as
/// the CRI plugin's do. Its state directory is `<node>/run/containerd`: the shim writes each
/// container's `config.json` at `<node>/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/`,
/// the very path it has below a node's root, and the agent is given `<node>` as the node's
/// root. The daemon is killed (by its own pid) and the directory removed on drop.
struct Containerd {
    dir: PathBuf,
    node: PathBuf,
    /// The state directory below `<node>` (one of the `STATE_*` layouts).
    state: &'static str,
    socket: PathBuf,
    child: std::process::Child,
    version: String,
}

impl Containerd {
    /// Starts the daemon in `dir` and waits until `ctr version` answers.
    fn start(dir: &Path, state_dir: &'static str) -> Result<Self, String> {
        let node = dir.join("node");
        let state = node.join(state_dir);
        let root = dir.join("root");
        let socket = dir.join("containerd.sock");
        for d in [&state, &root] {
            fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let config = format!(
            "version = 2\nroot = {root:?}\nstate = {state:?}\n\
             # No CRI plugin: the test plays the kubelet's and the CRI plugin's part, through ctr.\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = {sock:?}\n[ttrpc]\n  address = {ttrpc:?}\n[debug]\n  address = \"\"\n",
            root = root.display().to_string(),
            state = state.display().to_string(),
            sock = socket.display().to_string(),
            ttrpc = format!("{}.ttrpc", socket.display()),
        );
        fs::write(dir.join("config.toml"), config).map_err(|e| e.to_string())?;
        let log = dir.join("containerd.log");
        let out = fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("containerd: {e}"))?;
        let mut daemon = Containerd { dir: dir.into(), node, state: state_dir, socket, child, version: String::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                return Err(format!("containerd exited ({status}): {}", fs::read_to_string(&log).unwrap_or_default()));
            }
            if let Ok(out) = daemon.ctr().arg("version").output()
                && out.status.success()
            {
                let text = String::from_utf8_lossy(&out.stdout);
                daemon.version = text.lines().filter_map(|l| l.trim_start().strip_prefix("Version:")).last().unwrap_or("").trim().to_string();
                return Ok(daemon);
            }
            if Instant::now() > deadline {
                return Err(format!("containerd did not answer on {} within 30 s: {}", daemon.socket.display(), fs::read_to_string(&log).unwrap_or_default()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr` talking to this daemon, in namespace `k8s.io`.
    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&self.socket).args(["--namespace", "k8s.io"]);
        cmd
    }

    /// `ctr run` of the full runtime spec `config` (written to this daemon's directory) as
    /// container `id`, with runc's state and the FIFOs under this daemon's directory; `args`
    /// go before the id.
    fn run_cmd(&self, id: &str, config: &serde_json::Value, args: &[&str]) -> Command {
        let spec = self.dir.join(format!("{id}.spec.json"));
        fs::write(&spec, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        let mut cmd = self.ctr();
        cmd.arg("run")
            .arg("--config")
            .arg(&spec)
            .arg("--runc-root")
            .arg(self.dir.join("runc"))
            .arg("--fifo-dir")
            .arg(self.dir.join("fifo"))
            .args(args)
            .arg(id);
        cmd
    }

    /// The `config.json` containerd's shim wrote for container `id`.
    fn bundle_config(&self, id: &str) -> PathBuf {
        self.node.join(self.state).join(TASK_DIR).join(id).join("config.json")
    }

    /// Runs `/usr/bin/true` of `rootfs` in a container of its own (read-only root, its own
    /// namespaces and cgroup), to show the shim and runc work here before the test relies on
    /// them.
    fn probe(&self, rootfs: &Path) -> Result<(), String> {
        let id = format!("pyperch-e2e-probe-{}", random_hex(12));
        let cgroup = format!("/pyperch-e2e-probe/{id}");
        let config = json!({
            "ociVersion": "1.1.0",
            "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "args": ["/usr/bin/true"], "env": ["PATH=/usr/bin"], "cwd": "/", "noNewPrivileges": true},
            "root": {"path": rootfs, "readonly": true},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
                "cgroupsPath": cgroup,
                "maskedPaths": masked_paths(),
                "readonlyPaths": readonly_paths()
            }
        });
        let run = Running::start(self.run_cmd(&id, &config, &["--rm"])).map_err(|e| format!("ctr: {e:#}"))?.finish(Duration::from_secs(60));
        self.remove(&id);
        for d in cgroup_dirs(&cgroup, 1) {
            let _ = fs::remove_dir(d);
        }
        if run.success() {
            Ok(())
        } else {
            Err(format!("a probe container (`ctr run --config`, /usr/bin/true) failed:{}", run.diag()))
        }
    }

    /// Kills container `id`'s task and deletes the task and the container.
    fn remove(&self, id: &str) {
        let _ = self.ctr().args(["task", "kill", "--signal", "SIGKILL", id]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        for _ in 0..50 {
            let gone = self.ctr().args(["task", "delete", "--force", id]).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
                || !self.ctr().args(["task", "ls", "--quiet"]).output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == id));
            if gone {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.ctr().args(["container", "delete", id]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The node's container runtime and where it keeps its state below the node's root.
#[derive(Clone, Copy, Debug)]
enum Node {
    /// containerd, with its state directory (one of the `STATE_*` layouts).
    Containerd(&'static str),
    /// CRI-O with its own `runroot` and `root` ([`CRIO_RUNROOT`], [`CRIO_ROOT`]); each
    /// container's bundle is `<runroot>/overlay-containers/<id>/userdata`
    /// ([`CrioBundle::Crio`]), or, for the refusal case, a directory of no runtime's layout.
    CriO(CrioBundle),
}

/// Where the test's CRI-O part puts a container's bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrioBundle {
    /// CRI-O's own place: `<node>/<CRIO_RUNROOT>/overlay-containers/<id>/userdata`.
    Crio,
    /// `<node>/bundles/<id>`: no CRI-O layout, so pyperch refuses it (and counts it).
    Elsewhere,
}

/// The runtime the containers run with: containerd through `ctr`, or, where containerd
/// cannot run here (said in the output with the exact error), runc directly on bundles laid
/// out where containerd's shim keeps them; on a CRI-O node, conmon and runc started as CRI-O
/// starts them (no CRI-O package exists in Debian: the test plays CRI-O's part).
enum Runtime {
    Containerd(Containerd),
    Runc,
    CriO(CrioNode),
}

impl Runtime {
    /// containerd when its daemon starts and runs a probe container through its runc shim;
    /// runc otherwise, with the exact reason printed. A CRI-O node needs conmon: `Err` (the
    /// reason to skip) without it.
    fn pick(dir: &Path, rootfs: &Path, node: Node) -> Result<Runtime, String> {
        let state = match node {
            Node::Containerd(state) => state,
            Node::CriO(_) => return CrioNode::new(dir).map(Runtime::CriO),
        };
        Ok(Self::pick_containerd(dir, rootfs, state))
    }

    fn pick_containerd(dir: &Path, rootfs: &Path, state: &'static str) -> Runtime {
        if Command::new("ctr").arg("--version").stdout(Stdio::null()).status().is_err() {
            note("runtime: runc directly, because `ctr` is not installed (`cargo xtask test` installs Debian's containerd)");
            return Runtime::Runc;
        }
        match Containerd::start(&dir.join("containerd"), state).and_then(|d| d.probe(rootfs).map(|()| d)) {
            Ok(daemon) => {
                note(format!(
                    "runtime: containerd {} (a daemon of this test's own, namespace k8s.io, runc shim io.containerd.runc.v2), containers started with `ctr run --config <full OCI spec>`",
                    daemon.version
                ));
                Runtime::Containerd(daemon)
            }
            Err(why) => {
                note(format!("runtime: runc directly, because containerd cannot run containers here: {why}"));
                Runtime::Runc
            }
        }
    }
}

/// A container started with containerd; removed on drop.
struct CtrContainer<'a> {
    daemon: &'a Containerd,
    id: String,
    pid: Option<u32>,
    cleanup: Vec<PathBuf>,
}

impl<'a> CtrContainer<'a> {
    /// `ctr run --detach` of `config`; its output goes to `log`.
    fn start_detached(daemon: &'a Containerd, id: &str, config: &serde_json::Value, log: &Path) -> Result<Self, String> {
        let pid_file = daemon.dir.join(format!("{id}.pid"));
        let log_uri = format!("file://{}", log.display());
        let out = daemon
            .run_cmd(id, config, &["--detach", "--log-uri", &log_uri, "--pid-file", &pid_file.display().to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("ctr: {e}"))?;
        let mut container = CtrContainer { daemon, id: id.into(), pid: None, cleanup: Vec::new() };
        if !out.status.success() {
            return Err(format!("ctr run {id} failed ({}): {}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
        }
        container.pid = fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse().ok());
        Ok(container)
    }
}

impl Drop for CtrContainer<'_> {
    fn drop(&mut self) {
        self.daemon.remove(&self.id);
        for dir in &self.cleanup {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// The workload's container, under any runtime.
enum Workload<'a> {
    Containerd(CtrContainer<'a>),
    Runc(RuncContainer),
    CriO(ConmonContainer),
}

impl Workload<'_> {
    fn pid(&self) -> Option<u32> {
        match self {
            Workload::Containerd(c) => c.pid,
            Workload::Runc(c) => c.pid(),
            Workload::CriO(c) => c.pid,
        }
    }

    fn cleanup(&mut self) -> &mut Vec<PathBuf> {
        match self {
            Workload::Containerd(c) => &mut c.cleanup,
            Workload::Runc(c) => &mut c.cleanup,
            Workload::CriO(c) => &mut c.cleanup,
        }
    }
}

/// CRI-O's `runroot` and `root` on a node whose crio.conf moves them off containers/storage's
/// defaults (`/run/containers/storage`, `/var/lib/containers/storage`, the fixed places
/// pyperch also looks): below the node's root.
const CRIO_RUNROOT: &str = "run/custom-containers/storage";
const CRIO_ROOT: &str = "var/lib/custom-containers/storage";

/// A CRI-O node of the test's own: `<dir>/node` as the node's root (the agent is given it as
/// such), conmon's and runc's state below it where CRI-O keeps them (`/var/run/crio` for exit
/// files and attach sockets, `/run/runc` as runc's root, `/var/log/pods` for logs).
struct CrioNode {
    node: PathBuf,
    conmon: String,
}

impl CrioNode {
    /// `Err` (why the test skips) when conmon is not installed.
    fn new(dir: &Path) -> Result<Self, String> {
        let out = Command::new("conmon")
            .arg("--version")
            .output()
            .map_err(|e| format!("conmon is not installed ({e}; `cargo xtask test` installs Debian's conmon)"))?;
        let conmon = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string();
        note(format!("runtime: {conmon} and runc, started with the arguments CRI-O gives them (no CRI-O package in Debian: the test plays CRI-O's part); the agent's container runs with runc directly"));
        Ok(CrioNode { node: dir.join("node"), conmon })
    }

    fn runc_root(&self) -> PathBuf {
        self.node.join("run/runc")
    }
}

/// A container started as CRI-O starts one (cri-o `internal/oci/runtime_oci.go`
/// `CreateContainer`, `StartContainer`): its `config.json` written into the bundle directory
/// and, as CRI-O does, into its persistent directory `<node>/<CRIO_ROOT>/overlay-containers/<id>/userdata`;
/// conmon started in the bundle directory with CRI-O's arguments and its two socket pairs
/// (`_OCI_SYNCPIPE`, `_OCI_STARTPIPE`), moved into its cgroup (`crio-conmon-<id>` beside the
/// container's) before it may go on, its first process reaped once it has forked; then
/// `runc start`. The container is killed and deleted, and conmon gone, on drop.
struct ConmonContainer {
    id: String,
    runc_root: PathBuf,
    /// The container's init process, as conmon reports it on the sync pipe.
    pid: Option<u32>,
    /// The conmon process that stays the container's parent.
    conmon_pid: Option<u32>,
    cleanup: Vec<PathBuf>,
}

impl ConmonContainer {
    /// `parents`: the cgroup directories above conmon's (the pod's first), removed after it
    /// when empty, even when the start fails.
    #[allow(clippy::too_many_arguments)]
    fn start(node: &CrioNode, id: &str, bundle: &Path, config: &serde_json::Value, log: &Path, name: &str, conmon_cgroup: &str, parents: &[String]) -> Result<Self, String> {
        use std::io::{BufRead, Write};
        use std::os::{fd::AsRawFd, unix::process::CommandExt};
        let persist = node.node.join(CRIO_ROOT).join("overlay-containers").join(id).join("userdata");
        let exits = node.node.join("var/run/crio/exits");
        let sockets = node.node.join("var/run/crio");
        for d in [bundle, &persist, &exits, &sockets, &node.runc_root(), log.parent().unwrap()] {
            fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let spec = serde_json::to_vec_pretty(config).unwrap();
        for d in [bundle, &persist] {
            fs::write(d.join("config.json"), &spec).map_err(|e| e.to_string())?;
        }
        let mut cleanup = cgroup_dirs(conmon_cgroup, 0);
        let conmon_dirs = cleanup.clone();
        cleanup.extend(parents.iter().flat_map(|p| cgroup_dirs(p, 0)));
        let mut container = ConmonContainer { id: id.into(), runc_root: node.runc_root(), pid: None, conmon_pid: None, cleanup };
        let path = |p: &Path| p.display().to_string();
        let args = vec![
            "-b".to_string(), path(bundle), "-c".into(), id.into(), "--exit-dir".into(), path(&exits), "-l".into(), path(log),
            "--log-level".into(), "info".into(), "-n".into(), name.into(), "-P".into(), path(&bundle.join("conmon-pidfile")),
            "-p".into(), path(&bundle.join("pidfile")), "--persist-dir".into(), path(&persist), "-r".into(), "/usr/sbin/runc".into(),
            "--runtime-arg".into(), format!("--root={}", path(&node.runc_root())), "--socket-dir-path".into(), path(&sockets),
            "--syslog".into(), "-u".into(), id.into(), "--log-size-max".into(), "-1".into(),
        ];
        let (sync_parent, sync_child) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
        let (mut start_parent, start_child) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
        let (sync_fd, start_fd) = (sync_child.as_raw_fd(), start_child.as_raw_fd());
        let out = fs::File::create(node.node.join(format!("conmon-{id}.out"))).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new("conmon");
        cmd.args(&args).current_dir(bundle).env_clear().env("_OCI_SYNCPIPE", "3").env("_OCI_STARTPIPE", "4").stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec; the two
        // descriptors are first moved above 4 so that neither dup2 overwrites the other.
        unsafe {
            cmd.pre_exec(move || {
                let sync = libc::fcntl(sync_fd, libc::F_DUPFD_CLOEXEC, 10);
                let start = libc::fcntl(start_fd, libc::F_DUPFD_CLOEXEC, 10);
                if sync < 0 || start < 0 || libc::dup2(sync, 3) < 0 || libc::dup2(start, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut first = cmd.spawn().map_err(|e| format!("conmon: {e}"))?;
        drop((sync_child, start_child));
        let conmon_out = || fs::read_to_string(node.node.join(format!("conmon-{id}.out"))).unwrap_or_default();
        // As CRI-O's cgroup manager does before letting conmon go on: conmon into its own
        // cgroup in every hierarchy that takes it (a v1 cpuset with no CPUs yet does not).
        for dir in &conmon_dirs {
            if cgroup_hierarchy_of(dir).is_some() && fs::create_dir_all(dir).is_ok() {
                let _ = fs::write(dir.join("cgroup.procs"), first.id().to_string());
            }
        }
        start_parent.write_all(&[0]).map_err(|e| format!("conmon's start pipe: {e}: {}", conmon_out()))?;
        let status = first.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("conmon exited {status}: {}", conmon_out()));
        }
        sync_parent.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
        let mut line = String::new();
        let _ = std::io::BufReader::new(&sync_parent).read_line(&mut line);
        let sync: serde_json::Value = serde_json::from_str(&line).map_err(|e| format!("conmon's sync pipe gave {line:?} ({e}): {}", conmon_out()))?;
        container.conmon_pid = fs::read_to_string(bundle.join("conmon-pidfile")).ok().and_then(|p| p.trim().parse().ok());
        match sync["pid"].as_i64() {
            Some(pid) if pid > 0 => container.pid = Some(pid as u32),
            _ => return Err(format!("conmon could not create the container: {line}: {}", conmon_out())),
        }
        let started = Command::new("runc").arg("--root").arg(&container.runc_root).args(["start", id]).output().map_err(|e| format!("runc: {e}"))?;
        if !started.status.success() {
            return Err(format!("runc start {id}: {}{}", String::from_utf8_lossy(&started.stdout), String::from_utf8_lossy(&started.stderr)));
        }
        Ok(container)
    }

    /// Whether conmon `pid` still runs this container (a recycled pid is never signalled).
    fn conmon_alive(&self, pid: u32) -> bool {
        fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).any(|w| w == self.id.as_bytes()))
    }
}

impl Drop for ConmonContainer {
    fn drop(&mut self) {
        let runc = |args: &[&str]| {
            Command::new("runc").arg("--root").arg(&self.runc_root).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
        };
        runc(&["kill", &self.id, "KILL"]);
        for _ in 0..50 {
            if runc(&["delete", "--force", &self.id]) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // conmon exits once its container has; if it has not within 5 s, it is killed.
        if let Some(pid) = self.conmon_pid {
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.conmon_alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if self.conmon_alive(pid) {
                // SAFETY: a plain kill(2) of the conmon this container started (checked above).
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        for dir in &self.cleanup {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// The mounted cgroup hierarchy (a directory holding `cgroup.procs`) `dir` lies in, if any.
fn cgroup_hierarchy_of(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().skip(1).find(|a| a.join("cgroup.procs").is_file()).map(Path::to_path_buf)
}

/// Every cgroup directory `path` (a cgroupfs path) has under the mounted hierarchies, deepest
/// first, for `path` and each parent up to `levels` up.
fn cgroup_dirs(path: &str, levels: usize) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(entries) = fs::read_dir("/sys/fs/cgroup") else { return dirs };
    let hierarchies: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    let mut p = PathBuf::from(path.trim_start_matches('/'));
    for _ in 0..=levels {
        for h in &hierarchies {
            dirs.push(h.join(&p));
        }
        // The hierarchy root itself when cgroup v2 is mounted at /sys/fs/cgroup.
        dirs.push(Path::new("/sys/fs/cgroup").join(&p));
        if !p.pop() || p.as_os_str().is_empty() {
            break;
        }
    }
    dirs
}

/// What a case needs, or why it skips.
struct Setup {
    rootfs: PathBuf,
    python_in_rootfs: String,
    decoder: PathBuf,
    grants: Grants,
}

fn setup() -> Option<Setup> {
    if !is_root() {
        skip("the Kubernetes runtime tests run containers: they need root");
        return None;
    }
    if Command::new("runc").arg("--version").stdout(Stdio::null()).status().is_err() {
        skip("runc is not installed (`cargo xtask test` installs Debian's runc)");
        return None;
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        skip("no /sys/kernel/btf/vmlinux to mount into the agent's container");
        return None;
    }
    let rootfs = sid_rootfs();
    let Some(python_in_rootfs) = ["python3.13", "python3.14", "python3.15"]
        .iter()
        .map(|p| format!("/usr/bin/{p}"))
        .find(|p| rootfs.join(p.trim_start_matches('/')).is_file())
    else {
        skip(format!("the sid root filesystem {} (the workload's container image) has no python3.13-3.15", rootfs.display()));
        return None;
    };
    let decoder = match pprof_python() {
        Ok(p) => p,
        Err(why) => {
            skip(format!("cannot decode pprof: {why}"));
            return None;
        }
    };
    let grants = manifest_grants().unwrap_or_else(|e| panic!("{e}"));
    Some(Setup { rootfs, python_in_rootfs, decoder, grants })
}

/// The agent's root filesystem: the binary at /usr/local/bin/pyperch and the shared
/// libraries `ldd` lists, as `cargo xtask image` stages them; `tmp/` as the mount point of
/// the scratch directory.
fn agent_rootfs(dir: &Path) -> PathBuf {
    // The image's own root filesystem, as `cargo xtask test` stages it (stripped binary of
    // this build and its libraries).
    if let Some(staged) = std::env::var_os("PYPERCH_IMAGE_ROOTFS").map(PathBuf::from)
        && staged.join("usr/local/bin/pyperch").is_file()
    {
        note(format!("agent root filesystem: the image's, staged at {}", staged.display()));
        return staged;
    }
    let root = dir.join("agent-rootfs");
    let bin = pyperch_bin();
    let dest = root.join("usr/local/bin/pyperch");
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    fs::copy(&bin, &dest).unwrap_or_else(|e| panic!("copying {}: {e}", bin.display()));
    let ldd = Command::new("ldd").arg(&bin).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line.split_once("=>").map_or(line, |(_, r)| r).split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            let dest = root.join(path.trim_start_matches('/'));
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            fs::copy(path, &dest).unwrap_or_else(|e| panic!("copying {path}: {e}"));
        }
    }
    for d in ["tmp", "proc", "dev", "sys"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    root
}

/// The agent's environment: `PATH`, and `PYPERCH_HOST_ROOT`: under this test's containerd
/// or on its CRI-O node, its `<node>` directory (holding `run/containerd/...` as a node's root does), reached
/// through this test's own process as the agent (host PID namespace) reaches `/proc/1/root`;
/// under runc, only where the node's PID 1 cannot be opened even by root (a sandbox whose
/// PID 1 is not the node's init): the node's root is then reached through this test's own
/// process.
fn agent_env(rt: &Runtime) -> Vec<String> {
    let mut env = vec!["PATH=/usr/local/bin".to_string()];
    let node = match rt {
        Runtime::Containerd(d) => Some(&d.node),
        Runtime::CriO(n) => Some(&n.node),
        Runtime::Runc => None,
    };
    if let Some(node) = node {
        env.push(format!("PYPERCH_HOST_ROOT=/proc/{}/root{}", std::process::id(), node.display()));
        return env;
    }
    if fs::read_dir("/proc/1/root").is_err() {
        note("/proc/1/root cannot be opened here (PID 1 is not the node's init): PYPERCH_HOST_ROOT points at the test process's root");
        env.push(format!("PYPERCH_HOST_ROOT=/proc/{}/root", std::process::id()));
    }
    env
}

/// One run of `pyperch ARGS` in a container with the DaemonSet's privileges.
fn agent_run(s: &Setup, rt: &Runtime, dir: &Path, rootfs: &Path, scratch: &Path, args: &[&str], timeout: Duration) -> Run {
    agent_run_in(s, rt, dir, rootfs, scratch, args, timeout, false)
}

/// [`agent_run`], in the host's network namespace when `host_network` (to reach this test's
/// receiver on 127.0.0.1; the DaemonSet reaches its backend through the pod network).
#[allow(clippy::too_many_arguments)]
fn agent_run_in(s: &Setup, rt: &Runtime, dir: &Path, rootfs: &Path, scratch: &Path, args: &[&str], timeout: Duration, host_network: bool) -> Run {
    let id = format!("pyperch-e2e-agent-{}", random_hex(12));
    let cgroup = format!("/pyperch-e2e-agent/{id}");
    let caps = &s.grants.capabilities;
    let mut argv = vec!["/usr/local/bin/pyperch".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let mut namespaces = vec![json!({"type": "mount"}), json!({"type": "ipc"}), json!({"type": "uts"})];
    if !host_network {
        namespaces.push(json!({"type": "network"}));
    }
    let mut config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": argv,
            "env": agent_env(rt),
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps, "inheritable": [], "ambient": []},
            "noNewPrivileges": true
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": "pyperch-agent",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/kernel/btf", "type": "bind", "source": "/sys/kernel/btf", "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]},
            {"destination": "/sys/fs/cgroup", "type": "bind", "source": "/sys/fs/cgroup", "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]},
            {"destination": "/tmp", "type": "bind", "source": scratch, "options": ["rbind", "rw", "nosuid", "nodev"]}
        ],
        "linux": {
            // No "pid" namespace: hostPID. No "cgroup" namespace (cgroup v1 nodes get none).
            "namespaces": namespaces,
            "cgroupsPath": cgroup,
            "resources": {"memory": {"limit": s.grants.memory_limit}},
            "maskedPaths": masked_paths(),
            "readonlyPaths": readonly_paths()
        }
    });
    if let Some(profile) = &s.grants.seccomp {
        config["linux"]["seccomp"] = profile.clone();
    }
    let run = match rt {
        Runtime::Containerd(d) => {
            let run = Running::start(d.run_cmd(&id, &config, &["--rm"])).expect("ctr run").finish(timeout);
            d.remove(&id);
            run
        }
        Runtime::Runc | Runtime::CriO(_) => {
            let bundle = dir.join(&id);
            fs::create_dir_all(&bundle).unwrap();
            fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
            let mut cmd = Command::new("runc");
            cmd.args(["run", "--bundle"]).arg(&bundle).arg(&id);
            let run = Running::start(cmd).expect("runc run").finish(timeout);
            let _ = Command::new("runc").args(["delete", "--force", &id]).stderr(Stdio::null()).status();
            let _ = fs::remove_dir_all(&bundle);
            run
        }
    };
    for d in cgroup_dirs(&cgroup, 1) {
        let _ = fs::remove_dir(d);
    }
    run
}

/// The two cgroup drivers of a kubelet.
#[derive(Clone, Copy, Debug)]
enum Driver {
    Cgroupfs,
    Systemd,
}

/// The cgroup path a kubelet gives a Burstable pod's container `leaf` (see [`container_leaf`]),
/// and the directories it adds above the container's (the pod's first).
fn kubelet_cgroup(driver: Driver, uid: &str, leaf: &str) -> (String, Vec<String>) {
    match driver {
        Driver::Cgroupfs => {
            let pod = format!("/kubepods/burstable/pod{uid}");
            (format!("{pod}/{leaf}"), vec![pod, "/kubepods/burstable".into(), "/kubepods".into()])
        }
        Driver::Systemd => {
            let u = uid.replace('-', "_");
            let pod = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice");
            (format!("{pod}/{leaf}"), vec![pod, "/kubepods.slice/kubepods-burstable.slice".into(), "/kubepods.slice".into()])
        }
    }
}

/// The last segment of the cgroup of container `id` (or of CRI-O's conmon for it, when
/// `conmon`) under a kubelet's cgroup driver: containerd's `<id>` (cgroupfs) or
/// `cri-containerd-<id>.scope` (systemd); CRI-O's `crio-<id>` or `crio-<id>.scope`, and
/// `crio-conmon-<id>` or `crio-conmon-<id>.scope` for its conmon (cri-o
/// `internal/config/cgmgr`).
fn container_leaf(driver: Driver, node: Node, id: &str, conmon: bool) -> String {
    let prefix = match (node, conmon) {
        (Node::Containerd(_), _) => match driver {
            Driver::Cgroupfs => "",
            Driver::Systemd => "cri-containerd-",
        },
        (Node::CriO(_), false) => "crio-",
        (Node::CriO(_), true) => "crio-conmon-",
    };
    let suffix = if matches!(driver, Driver::Systemd) { ".scope" } else { "" };
    format!("{prefix}{id}{suffix}")
}

/// The runtime spec's annotations for the workload: those containerd's CRI plugin writes, or
/// those CRI-O writes (cri-o `internal/factory/container/container.go`
/// `SpecAddAnnotations`: its own `io.kubernetes.cri-o.*` keys, then the kubelet's annotations
/// and labels as they are, `io.kubernetes.pod.name`, `.namespace`, `.uid` and
/// `io.kubernetes.container.name` among the labels).
fn workload_annotations(node: Node, id: &str, uid: &str, pod_name: &str, rootfs: &Path, log: &Path) -> serde_json::Value {
    let sandbox = random_hex(64);
    match node {
        Node::Containerd(_) => json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": CONTAINER_NAME,
            "io.kubernetes.cri.image-name": "registry.example/shop/checkout:1.0",
            "io.kubernetes.cri.sandbox-id": sandbox,
            "io.kubernetes.cri.sandbox-name": pod_name,
            "io.kubernetes.cri.sandbox-namespace": NAMESPACE,
            "io.kubernetes.cri.sandbox-uid": uid
        }),
        Node::CriO(_) => {
            let labels = json!({
                "io.kubernetes.container.name": CONTAINER_NAME,
                "io.kubernetes.pod.name": pod_name,
                "io.kubernetes.pod.namespace": NAMESPACE,
                "io.kubernetes.pod.uid": uid
            });
            let kube_annotations = json!({
                "io.kubernetes.container.hash": "6c8cf1d3",
                "io.kubernetes.container.restartCount": "0",
                "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                "io.kubernetes.container.terminationMessagePolicy": "File",
                "io.kubernetes.pod.terminationGracePeriod": "30"
            });
            let mut a = json!({
                "io.container.manager": "cri-o",
                "io.kubernetes.cri-o.Annotations": kube_annotations.to_string(),
                "io.kubernetes.cri-o.ContainerID": id,
                "io.kubernetes.cri-o.ContainerType": "container",
                "io.kubernetes.cri-o.Created": "2026-11-28T10:00:00.000000000Z",
                "io.kubernetes.cri-o.ImageName": "registry.example/shop/checkout:1.0",
                "io.kubernetes.cri-o.ImageRef": random_hex(64),
                "io.kubernetes.cri-o.Labels": labels.to_string(),
                "io.kubernetes.cri-o.LogPath": log,
                "io.kubernetes.cri-o.Metadata": json!({"name": CONTAINER_NAME}).to_string(),
                "io.kubernetes.cri-o.MountPoint": rootfs,
                "io.kubernetes.cri-o.Name": format!("k8s_{CONTAINER_NAME}_{pod_name}_{NAMESPACE}_{uid}_0"),
                "io.kubernetes.cri-o.ResolvPath": "",
                "io.kubernetes.cri-o.SandboxID": sandbox,
                "io.kubernetes.cri-o.SandboxName": format!("k8s_{pod_name}_{NAMESPACE}_{uid}_0"),
                "io.kubernetes.cri-o.SeccompProfilePath": "RuntimeDefault",
                "io.kubernetes.cri-o.Stdin": "false",
                "io.kubernetes.cri-o.StdinOnce": "false",
                "io.kubernetes.cri-o.TTY": "false",
                "io.kubernetes.cri-o.Volumes": "[]",
                "kubernetes.io/config.seen": "2026-11-28T10:00:00.000000000Z",
                "kubernetes.io/config.source": "api"
            });
            for (k, v) in kube_annotations.as_object().unwrap().iter().chain(labels.as_object().unwrap()) {
                a[k] = v.clone();
            }
            a
        }
    }
}

fn kubernetes_case(driver: Driver, node: Node) {
    let Some(s) = setup() else { return };
    note(format!(
        "agent container: host PID namespace, capabilities {} only (bounding/effective/permitted), no new privileges, seccomp {}, uid 0 (65534 once attached), read-only root, scratch /tmp (0777), /sys/kernel/btf and /sys/fs/cgroup read-only, memory limit {} MiB",
        s.grants.capabilities.join(" "),
        if s.grants.seccomp.is_some() { "profile deploy/kubernetes/seccomp-pyperch.json (Localhost)" } else { "none (Unconfined)" },
        s.grants.memory_limit >> 20
    ));
    note("not expressible here: appArmorProfile Unconfined (no AppArmor on this kernel: nothing applies either way), the pod network (an empty network namespace: nothing is uploaded), emptyDir sizeLimit (enforced by kubelet eviction, not the runtime)");
    let dir = std::env::temp_dir().join("pyperch-tests").join(format!("k8s-{}", random_hex(8)));
    let app = dir.join("app");
    fs::create_dir_all(&app).unwrap();
    fs::write(app.join("checkout.py"), SCRIPT).unwrap();
    let scratch = dir.join("scratch");
    fs::create_dir_all(&scratch).unwrap();
    // As the kubelet creates an emptyDir volume: mode 0777 (pyperch writes there as nobody).
    fs::set_permissions(&scratch, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let rt = match Runtime::pick(&dir, &s.rootfs, node) {
        Ok(rt) => rt,
        Err(why) => {
            let _ = fs::remove_dir_all(&dir);
            return skip(why);
        }
    };
    if let Node::Containerd(state) = node
        && state != STATE_KUBEADM
        && matches!(rt, Runtime::Runc)
    {
        // Without containerd there is no shim to find the bundle from.
        let _ = fs::remove_dir_all(&dir);
        return skip(format!("the state directory {state} needs containerd's shim, and containerd does not run here (above)"));
    }

    // The workload: a Burstable pod's container as containerd's CRI plugin, or CRI-O,
    // creates it.
    let id = random_hex(64);
    let uid = random_pod_uid();
    let pod_name = format!("checkout-{}-{}", random_hex(9), random_hex(5));
    let (cgroup, parents) = kubelet_cgroup(driver, &uid, &container_leaf(driver, node, &id, false));
    // CRI-O's bundle, and its log where the kubelet asks for it
    // (`/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`).
    let crio_bundle = match (&rt, node) {
        (Runtime::CriO(n), Node::CriO(CrioBundle::Crio)) => n.node.join(CRIO_RUNROOT).join("overlay-containers").join(&id).join("userdata"),
        (Runtime::CriO(n), _) => n.node.join("bundles").join(&id),
        _ => PathBuf::new(),
    };
    let log = match &rt {
        Runtime::CriO(n) => n.node.join(format!("var/log/pods/{NAMESPACE}_{pod_name}_{uid}/{CONTAINER_NAME}/0.log")),
        _ => dir.join("workload.log"),
    };
    let config = json!({
        "ociVersion": "1.1.0",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [s.python_in_rootfs, "/app/checkout.py", "300"],
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "cwd": "/app",
            "capabilities": {
                "bounding": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"],
                "effective": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"],
                "permitted": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
            }
        },
        "root": {"path": s.rootfs, "readonly": true},
        "hostname": pod_name,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/app", "type": "bind", "source": app, "options": ["rbind", "ro"]}
        ],
        "annotations": workload_annotations(node, &id, &uid, &pod_name, &s.rootfs, &log),
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
            "cgroupsPath": cgroup,
            "maskedPaths": masked_paths(),
            "readonlyPaths": readonly_paths()
        }
    });
    let mut workload = match &rt {
        Runtime::Containerd(d) => Workload::Containerd(CtrContainer::start_detached(d, &id, &config, &log).unwrap_or_else(|e| panic!("{e}"))),
        Runtime::CriO(n) => {
            let (conmon_cgroup, conmon_parents) = kubelet_cgroup(driver, &uid, &container_leaf(driver, node, &id, true));
            let name = format!("k8s_{CONTAINER_NAME}_{pod_name}_{NAMESPACE}_{uid}_0");
            // No `-s` (CRI-O's systemd cgroup manager): it makes conmon run runc with
            // `--systemd-cgroup`, and no systemd runs here; the systemd driver's paths are
            // given as cgroupfs paths, as for containerd above.
            Workload::CriO(ConmonContainer::start(n, &id, &crio_bundle, &config, &log, &name, &conmon_cgroup, &conmon_parents).unwrap_or_else(|e| panic!("{e}")))
        }
        Runtime::Runc => {
            // The bundle where containerd's shim would keep it on a node.
            let bundle = Path::new("/run/containerd").join(TASK_DIR).join(&id);
            let mut c = RuncContainer::start_detached(&id, &bundle, &config, &log).unwrap_or_else(|e| panic!("{e}"));
            // The runtime's state directories, if this test made them (removed only when empty).
            c.cleanup.extend(["/run/containerd/io.containerd.runtime.v2.task/k8s.io", "/run/containerd/io.containerd.runtime.v2.task", "/run/containerd"].map(PathBuf::from));
            Workload::Runc(c)
        }
    };
    for parent in &parents {
        let dirs = cgroup_dirs(parent, 0);
        workload.cleanup().extend(dirs);
    }
    // containerd wrote the bundle itself: the spec pyperch reads is the one the shim handed
    // to runc, at the path a node has for it.
    if let Runtime::Containerd(d) = &rt {
        let path = d.bundle_config(&id);
        let written: serde_json::Value = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| panic!("containerd wrote no readable bundle at {}", path.display()));
        assert_eq!(written["annotations"]["io.kubernetes.cri.sandbox-name"], pod_name.as_str(), "annotations in {}", path.display());
        assert_eq!(written["linux"]["cgroupsPath"], cgroup.as_str(), "cgroupsPath in {}", path.display());
        note(format!("containerd's shim wrote the workload's bundle at {}", path.display()));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fs::read_to_string(&log).unwrap_or_default().contains("ready") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = workload.pid().expect("the runtime gives the workload's pid");
    let host_cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let d0 = format!(
        "\n--- driver {driver:?}, workload pid {pid}, container {id}, pod {NAMESPACE}/{pod_name} ({uid})\n--- /proc/{pid}/cgroup:\n{host_cgroup}--- workload log: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(host_cgroup.contains(&cgroup), "the workload is not in the kubelet-shaped cgroup {cgroup}{d0}");
    if let (Runtime::CriO(n), Workload::CriO(c)) = (&rt, &workload) {
        // conmon, not a fixed path, is what leads to the bundle: it is the workload's parent,
        // outside its cgroup, and the bundle is nowhere pyperch looks by default.
        let conmon = c.conmon_pid.expect("conmon wrote its pid file");
        let parent = fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|st| st.rsplit_once(") ").and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok()));
        assert_eq!(parent, Some(conmon), "the workload's parent is not conmon {conmon}{d0}");
        let conmon_cgroup = fs::read_to_string(format!("/proc/{conmon}/cgroup")).unwrap_or_default();
        assert!(!conmon_cgroup.contains(&cgroup), "conmon is in the container's cgroup:\n{conmon_cgroup}{d0}");
        note(format!(
            "{} (pid {conmon}) runs the workload from the bundle {} (its cwd and -b), persistent copy under {}; conmon's cgroups: {}",
            n.conmon,
            crio_bundle.display(),
            n.node.join(CRIO_ROOT).display(),
            conmon_cgroup.lines().collect::<Vec<_>>().join(" ")
        ));
    }

    let rootfs = agent_rootfs(&dir);

    // `list` inside the agent's container.
    let list = agent_run(&s, &rt, &dir, &rootfs, &scratch, &["list"], Duration::from_secs(90));
    let d = format!("{}{d0}", list.diag());
    assert!(list.success(), "pyperch list failed in the agent's container{d}");
    let row: Vec<&str> = list
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pid.to_string().as_str()))
        .unwrap_or_else(|| panic!("pyperch list does not show pid {pid}{d}"))
        .split_whitespace()
        .collect();
    assert_eq!(row.get(6).copied(), Some(&id[..12]), "CONTAINER{d}");
    assert_eq!(row.get(7).copied(), Some(uid.as_str()), "POD{d}");
    let want_name = match node {
        Node::CriO(CrioBundle::Elsewhere) => "(unannotated)".to_string(),
        _ => format!("{NAMESPACE}/{pod_name}/{CONTAINER_NAME}"),
    };
    assert_eq!(row.get(8).copied(), Some(want_name.as_str()), "NAME{d}");
    assert_eq!(row.get(9).copied(), Some("ok"), "STATUS{d}");

    if let Node::CriO(CrioBundle::Elsewhere) = node {
        // A conmon whose bundle is not CRI-O's layout: refused, counted, and no name shown
        // (the annotations in it are valid and its pod UID is the cgroup's).
        let rec = agent_run(&s, &rt, &dir, &rootfs, &scratch, &["record", "--duration", "2", "--pid", &pid.to_string(), "--output", "/tmp/refused.txt", "--stats"], Duration::from_secs(90));
        let d = format!("{}{d0}", rec.diag());
        assert!(rec.success(), "pyperch record failed in the agent's container{d}");
        assert!(rec.stderr.contains("1 bundles refused"), "the conmon bundle outside CRI-O's layout is not counted as refused{d}");
        drop(workload);
        drop(rt);
        let _ = fs::remove_dir_all(&dir);
        return;
    }

    // A pprof recording filtered by namespace and pod name.
    let pod_regex = format!("^{pod_name}$");
    let rec = agent_run(
        &s,
        &rt,
        &dir,
        &rootfs,
        &scratch,
        &["record", "--duration", "5", "--format", "pprof", "--output", "/tmp/profile.pb.gz", "--namespace", NAMESPACE, "--pod-name", &pod_regex, "--stats"],
        Duration::from_secs(90),
    );
    let d = format!("{}{d0}", rec.diag());
    assert!(rec.success(), "pyperch record failed in the agent's container{d}");
    let decoded = decode_pprof(&s.decoder, &scratch.join("profile.pb.gz")).unwrap_or_else(|e| panic!("{e:#}{d}"));
    assert_eq!(decoded["errors"], json!([]), "the pprof is not consistent{d}");
    let samples = decoded["samples"].as_array().cloned().unwrap_or_default();
    let d = format!("{d}\n--- decoded (first 3000 chars): {}", decoded.to_string().chars().take(3000).collect::<String>());
    let mut total = 0;
    let mut full = 0;
    for sample in &samples {
        let labels = &sample["labels"];
        assert_eq!(labels["process.pid"], pid.to_string().as_str(), "only the filtered pod's process is recorded{d}");
        for (key, want) in [
            ("container.id", id.as_str()),
            ("k8s.pod.uid", uid.as_str()),
            ("k8s.namespace.name", NAMESPACE),
            ("k8s.pod.name", pod_name.as_str()),
            ("k8s.container.name", CONTAINER_NAME),
        ] {
            assert_eq!(labels[key], want, "label {key}{d}");
        }
        let count = sample["values"][0].as_i64().unwrap_or(0);
        total += count;
        // Exact stacks: root first, a prefix of the workload's call path, each frame in
        // its function's lines of /app/checkout.py.
        let stack: Vec<&serde_json::Value> = sample["stack"].as_array().map(|a| a.iter().rev().collect()).unwrap_or_default();
        assert!(stack.len() >= 2 && stack.len() <= CALL_PATH.len(), "a stack off the call path: {stack:?}{d}");
        for (frame, want) in stack.iter().zip(CALL_PATH) {
            assert_eq!(frame[0], want, "a frame off the call path in {stack:?}{d}");
            assert_eq!(frame[1], "/app/checkout.py", "file of {want}{d}");
            let line = frame[2].as_u64().unwrap_or(0) as u32;
            let (first, last) = script_lines(want);
            assert!((first..=last).contains(&line), "{want} at line {line}, outside {first}..={last}{d}");
        }
        if stack.len() == CALL_PATH.len() {
            full += count;
        }
    }
    assert!(total >= 50, "only {total} samples of the workload in 5 s{d}");
    assert!(full as f64 >= 0.8 * total as f64, "{full} of {total} samples end in leaf_checkout{d}");

    // `--by-container` frames.
    let rec = agent_run(
        &s,
        &rt,
        &dir,
        &rootfs,
        &scratch,
        &["record", "--duration", "3", "--format", "collapsed", "--output", "/tmp/stacks.txt", "--by-container", "--namespace", NAMESPACE],
        Duration::from_secs(90),
    );
    let text = fs::read_to_string(scratch.join("stacks.txt")).unwrap_or_default();
    let d = format!("{}{d0}\n--- stacks:\n{text}", rec.diag());
    assert!(rec.success(), "pyperch record --by-container failed{d}");
    let profile = Profile::parse(&text);
    assert!(profile.total() > 0, "no stacks{d}");
    for st in &profile.stacks {
        assert_eq!(st.frames.first().map(String::as_str), Some(format!("pod {NAMESPACE}/{pod_name}").as_str()), "pod frame{d}");
        assert_eq!(st.frames.get(1).map(String::as_str), Some(format!("container {CONTAINER_NAME}").as_str()), "container frame{d}");
        let rest = Stack { frames: st.frames[2..].to_vec(), count: st.count };
        assert_eq!(rest.pid(), Some(pid), "process frame{d}");
    }

    // The agent's uploads: service_name `<namespace>/<container>` and the names as labels.
    let receiver = IngestReceiver::start(&s.decoder, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let url = format!("http://127.0.0.1:{}", receiver.port);
    let agent = agent_run_in(
        &s,
        &rt,
        &dir,
        &rootfs,
        &scratch,
        &["agent", "--upload-url", &url, "--interval", "2s", "--duration", "5s", "--namespace", NAMESPACE, "--pod-name", &pod_regex],
        Duration::from_secs(90),
        true,
    );
    let entries = receiver.entries();
    let d = format!("{}{d0}\n--- uploads: {entries:?}", agent.diag());
    assert!(agent.success(), "pyperch agent failed in the agent's container{d}");
    let names: Vec<&str> = entries.iter().filter_map(|e| e["query"]["name"].as_str()).collect();
    assert!(!names.is_empty(), "no upload reached the receiver{d}");
    for name in &names {
        let service = format!("{NAMESPACE}/{CONTAINER_NAME}{{");
        assert!(name.starts_with(&service), "service_name of {name} is not {NAMESPACE}/{CONTAINER_NAME}{d}");
        for label in [
            format!("k8s.namespace.name=\"{NAMESPACE}\""),
            format!("k8s.pod.name=\"{pod_name}\""),
            format!("k8s.container.name=\"{CONTAINER_NAME}\""),
            format!("k8s.pod.uid=\"{uid}\""),
            format!("container.id=\"{id}\""),
        ] {
            assert!(name.contains(&label), "{label} missing in {name}{d}");
        }
    }
    drop(receiver);

    drop(workload);
    drop(rt);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn kubernetes_containerd_cgroupfs_driver_under_daemonset_privileges() {
    kubernetes_case(Driver::Cgroupfs, Node::Containerd(STATE_KUBEADM));
}

#[test]
fn kubernetes_containerd_systemd_driver_under_daemonset_privileges() {
    kubernetes_case(Driver::Systemd, Node::Containerd(STATE_KUBEADM));
}

/// k3s's (and RKE2's) layout (issue #32, "pods named on every node layout"): containerd's
/// state directory is `<node>/run/k3s/containerd`, where no fixed path of pyperch's looks;
/// the bundle is found from the container's own shim (its working directory), and every name
/// check above holds.
#[test]
fn kubernetes_containerd_k3s_state_directory_under_daemonset_privileges() {
    kubernetes_case(Driver::Cgroupfs, Node::Containerd(STATE_K3S));
}

/// microk8s's layout (issue #32): containerd's state under the snap's directory,
/// `<node>/var/snap/microk8s/common/run/containerd`; found from the shim as for k3s.
#[test]
fn kubernetes_containerd_microk8s_state_directory_under_daemonset_privileges() {
    kubernetes_case(Driver::Cgroupfs, Node::Containerd(STATE_MICROK8S));
}

/// docker's embedded containerd's layout (issue #32): its state directory
/// `<node>/var/run/docker/containerd/daemon`; found from the shim as for k3s.
#[test]
fn kubernetes_containerd_docker_embedded_state_directory_under_daemonset_privileges() {
    kubernetes_case(Driver::Cgroupfs, Node::Containerd(STATE_DOCKER));
}

/// CRI-O (issue #32): conmon and runc started as CRI-O starts them, the bundle in CRI-O's run
/// directory under a custom `runroot` (`<node>/run/custom-containers/storage/overlay-containers/<id>/userdata`,
/// where no fixed path of pyperch's looks), CRI-O's annotations, the cgroupfs driver's
/// `/kubepods/burstable/pod<uid>/crio-<id>` (conmon in `.../pod<uid>/crio-conmon-<id>`):
/// the bundle is found from conmon, and every name check above holds.
#[test]
fn kubernetes_crio_cgroupfs_driver_custom_runroot_under_daemonset_privileges() {
    kubernetes_case(Driver::Cgroupfs, Node::CriO(CrioBundle::Crio));
}

/// CRI-O with the systemd driver's `kubepods-burstable-pod<uid>.slice/crio-<id>.scope` (as a
/// cgroupfs path, conmon without `-s`: no systemd runs here; conmon in
/// `crio-conmon-<id>.scope` beside it).
#[test]
fn kubernetes_crio_systemd_driver_custom_runroot_under_daemonset_privileges() {
    kubernetes_case(Driver::Systemd, Node::CriO(CrioBundle::Crio));
}

/// A conmon whose bundle is not CRI-O's layout (`<node>/bundles/<id>`), holding valid CRI-O
/// annotations whose pod UID is the cgroup's: pyperch refuses it (`--stats` counts it) and
/// `list` shows no name.
#[test]
fn kubernetes_crio_bundle_outside_crio_layout_is_refused() {
    kubernetes_case(Driver::Cgroupfs, Node::CriO(CrioBundle::Elsewhere));
}
