//! Which container (and Kubernetes pod) a process runs in, read from `/proc`.
//!
//! The only source is the process's cgroup path (`/proc/PID/cgroup`): container runtimes
//! and the kubelet name cgroups after the container id and the pod UID, in a handful of
//! well-known shapes (see [`attribute`]). The PID-namespace view comes from the `NSpid` line
//! of `/proc/PID/status`.
//!
//! The guiding rule: **an unknown shape gives no container id, never a wrong one.** A
//! segment is only read as a container id when its position in the path is one a runtime is
//! known to use, and an id is only accepted when it is exactly 64 lowercase hex digits. A
//! 64-hex-looking segment anywhere else (for instance containerd's ambiguous
//! `/<namespace>/<id>` shape outside Kubernetes) is ignored.
//!
//! Nothing here panics on its input: garbage in `/proc` (or a process that vanished between
//! two reads) yields an empty [`ContainerInfo`].

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Files read from `/proc` are small; anything longer than this is not what we expect, and
/// only this much of it is read.
const MAX_PROC_FILE: u64 = 64 * 1024;

/// Length of a full container id, in (lowercase hex) characters.
pub const CONTAINER_ID_LEN: usize = 64;

/// Length of the abbreviated id that `docker ps` and `crictl ps` show.
pub const SHORT_ID_LEN: usize = 12;

/// The container runtime that named a cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// Docker (`docker-<id>.scope`, `/docker/<id>`).
    Docker,
    /// containerd's CRI plugin (`cri-containerd-<id>.scope`) or nerdctl
    /// (`nerdctl-<id>.scope`).
    Containerd,
    /// CRI-O (`crio-<id>.scope`, or `crio-<id>` under a cgroupfs-driver pod).
    CriO,
    /// Podman (`libpod-<id>.scope`, or `libpod-<id>` under `libpod_parent`).
    Podman,
}

impl Runtime {
    /// A short lowercase name: `docker`, `containerd`, `cri-o` or `podman`.
    pub fn name(&self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The Kubernetes quality-of-service class of a pod, as encoded in its cgroup path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// No QoS segment: the pod cgroup sits directly under `kubepods`.
    Guaranteed,
    /// Under `kubepods-burstable` / `kubepods/burstable`.
    Burstable,
    /// Under `kubepods-besteffort` / `kubepods/besteffort`.
    BestEffort,
}

impl QosClass {
    /// The name Kubernetes uses in `status.qosClass`.
    pub fn name(&self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What is known about the container a process runs in.
///
/// Invariants:
/// - `container_id`, when present, is exactly [`CONTAINER_ID_LEN`] lowercase hex digits;
/// - `runtime` is only present together with `container_id` (but the id may be known
///   without the runtime: the cgroupfs-driver Kubernetes shape does not say which runtime);
/// - `pod_uid`, when present, is either a lowercase UUID with dashes
///   (`8-4-4-4-12` hex digits) or 32 lowercase hex digits (the hash-derived UID of a static
///   pod); `qos_class` is only present together with `pod_uid`;
/// - `nspid` is empty when unknown; otherwise its first element is the pid in the reader's
///   PID namespace and its last the pid in the process's innermost namespace.
///
/// The [`Default`] value (everything empty) means "not in a recognised container".
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ContainerInfo {
    /// The full 64-hex-digit container id.
    pub container_id: Option<String>,
    /// The runtime that created the container, when the path says.
    pub runtime: Option<Runtime>,
    /// The Kubernetes pod UID, with dashes (the systemd form of the path uses underscores).
    pub pod_uid: Option<String>,
    /// The pod's QoS class.
    pub qos_class: Option<QosClass>,
    /// The cgroup path the rest was derived from (see [`parse_cgroup_file`]); empty when
    /// unknown.
    pub cgroup_path: String,
    /// The `NSpid` line of `/proc/PID/status`: outermost (reader's) pid first, innermost last.
    pub nspid: Vec<u32>,
}

impl ContainerInfo {
    /// The first [`SHORT_ID_LEN`] hex digits of the container id (what `docker ps` shows).
    pub fn short_id(&self) -> Option<&str> {
        self.container_id
            .as_deref()
            .and_then(|id| id.get(..SHORT_ID_LEN))
    }

    /// The process's pid inside its innermost PID namespace (its pid "in the container").
    pub fn namespace_pid(&self) -> Option<u32> {
        self.nspid.last().copied()
    }
}

/// Picks, from the contents of `/proc/PID/cgroup`, the cgroup path to attribute.
///
/// Each line is `hierarchy-id:controllers:path`. Candidates, in order of preference:
/// 1. the cgroup v2 line (`0::/path`);
/// 2. the v1 `name=systemd` line;
/// 3. the v1 line whose controllers include `cpu`;
/// 4. the v1 line whose controllers include `memory`.
///
/// The first candidate from which [`attribute`] derives a container id is returned; failing
/// that, the first from which it derives a pod UID; failing that, the first candidate. (On
/// a "hybrid" host the v2 line may say `/` while the v1 controllers hold the container's
/// path, hence the look past the first candidate.) A trailing ` (deleted)` (a cgroup removed
/// while the process still runs) is stripped. Malformed lines, and paths not starting with
/// `/`, are skipped; with no usable line the result is empty.
pub fn parse_cgroup_file(contents: &str) -> String {
    let mut unified: Option<&str> = None;
    let mut systemd: Option<&str> = None;
    let mut cpu: Option<&str> = None;
    let mut memory: Option<&str> = None;
    for line in contents.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        if !path.starts_with('/') || hierarchy.parse::<u32>().is_err() {
            continue;
        }
        if hierarchy == "0" && controllers.is_empty() {
            unified.get_or_insert(path);
            continue;
        }
        for controller in controllers.split(',') {
            let slot = match controller {
                "name=systemd" => &mut systemd,
                "cpu" => &mut cpu,
                "memory" => &mut memory,
                _ => continue,
            };
            slot.get_or_insert(path);
        }
    }
    let candidates: Vec<&str> = [unified, systemd, cpu, memory]
        .into_iter()
        .flatten()
        .collect();
    let chosen = candidates
        .iter()
        .find(|path| attribute(path).container_id.is_some())
        .or_else(|| {
            candidates
                .iter()
                .find(|path| attribute(path).pod_uid.is_some())
        })
        .or(candidates.first());
    chosen.map(|path| (*path).to_owned()).unwrap_or_default()
}

/// Derives the container and pod from a cgroup path. Pure; `nspid` is left empty and
/// `cgroup_path` is set to `cgroup_path`.
///
/// The container is the outermost (leftmost) segment of one of these shapes; segments
/// after it (cgroups the container made inside its own, like crun's `/container`, or a
/// nested runtime's) do not change the attribution. Outermost, because a container that can
/// write its own cgroup tree (cgroup v2 delegation) can create a sub-cgroup named after
/// another container's id and move into it: it must not borrow that container's id (and
/// with it the pod names and `service_name`). Docker in Docker is the outer container.
///
/// | segment(s) | runtime |
/// |---|---|
/// | `docker-<id>.scope` | Docker |
/// | `docker/<id>` (two segments) | Docker |
/// | `cri-containerd-<id>.scope`, `nerdctl-<id>.scope` | containerd |
/// | `crio-<id>.scope` | CRI-O |
/// | `libpod-<id>.scope`, `libpod_parent/libpod-<id>` | Podman |
/// | `<pod segment>/<id>` (cgroupfs-driver Kubernetes) | unknown (`None`) |
/// | `<pod segment>/crio-<id>` (cgroupfs-driver CRI-O) | CRI-O |
///
/// Pod segments, which also give the QoS class:
/// - systemd driver: `<prefix>kubepods[-burstable|-besteffort]-pod<uid>.slice`, the UID
///   with `_` for `-` (any `<prefix>-`, such as kind's `kubelet-`, is allowed);
/// - cgroupfs driver: `kubepods[/burstable|/besteffort]/pod<uid>`; when the path is shown
///   relative to the reader's cgroup namespace (it starts with `/..`), the part above the pod
///   segment may be cut off, and then `burstable/pod<uid>`, `besteffort/pod<uid>` and a bare
///   leading `pod<uid>` (QoS class unknown) are accepted too.
///
/// The pod is the segment just above the container's; with no container, a pod segment
/// that ends the path. Anything else, including a bare 64-hex segment in any other position,
/// yields no container id.
pub fn attribute(cgroup_path: &str) -> ContainerInfo {
    let mut info = ContainerInfo {
        cgroup_path: cgroup_path.to_owned(),
        ..ContainerInfo::default()
    };
    let Some(path) = Segments::parse(cgroup_path) else {
        return info;
    };
    let segments = &path.segments;

    let container = (0..segments.len())
        .find_map(|i| container_at(&path, i).map(|(runtime, id)| (i, runtime, id)));
    let pod_index = match container {
        Some((i, runtime, id)) => {
            info.container_id = Some(id.to_owned());
            info.runtime = runtime;
            i.checked_sub(1)
        }
        None => segments.len().checked_sub(1),
    };
    if let Some((uid, qos)) = pod_index.and_then(|i| pod_at(&path, i)) {
        info.pod_uid = Some(uid);
        info.qos_class = qos;
    }
    info
}

/// Reads the container attribution of process `pid` from the host's `/proc`.
///
/// Returns the empty [`ContainerInfo`] if `/proc/PID/cgroup` or `/proc/PID/status` cannot
/// be read (the process exited, permissions, no procfs). Never panics.
pub fn for_process(pid: u32) -> ContainerInfo {
    for_process_in(Path::new("/proc"), pid)
}

/// [`for_process`] with procfs mounted at `proc_root` (e.g. `/host/proc`).
pub fn for_process_in(proc_root: &Path, pid: u32) -> ContainerInfo {
    let dir = proc_root.join(pid.to_string());
    let (Ok(cgroup), Ok(status)) = (
        read_small(&dir.join("cgroup")),
        read_small(&dir.join("status")),
    ) else {
        return ContainerInfo::default();
    };
    let mut info = attribute(&parse_cgroup_file(&cgroup));
    info.nspid = parse_nspid(&status);
    info
}

/// The pids of the `NSpid:` line of a `/proc/PID/status` file, outermost first; empty if
/// the line is missing (kernels before 4.1) or malformed.
pub fn parse_nspid(status: &str) -> Vec<u32> {
    let Some(rest) = status.lines().find_map(|line| line.strip_prefix("NSpid:")) else {
        return Vec::new();
    };
    rest.split_whitespace()
        .map(str::parse::<u32>)
        .collect::<Result<Vec<u32>, _>>()
        .unwrap_or_default()
}

/// Reads at most [`MAX_PROC_FILE`] bytes of `path` as (lossy) UTF-8.
fn read_small(path: &Path) -> io::Result<String> {
    let mut bytes = Vec::new();
    File::open(path)?
        .take(MAX_PROC_FILE)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A cgroup path split into its segments.
///
/// Invariant: no segment is empty, `.` or `..`; `relative` says whether the path began with
/// `/..` segments (a path shown relative to the reader's cgroup namespace), which were
/// removed.
struct Segments<'a> {
    segments: Vec<&'a str>,
    relative: bool,
}

impl<'a> Segments<'a> {
    /// `None` for a path that is not absolute or has `..` after its first real segment.
    fn parse(path: &'a str) -> Option<Self> {
        let rest = path.strip_prefix('/')?;
        let mut segments = Vec::new();
        let mut relative = false;
        for segment in rest.split('/') {
            match segment {
                "" | "." => {}
                ".." if segments.is_empty() => relative = true,
                ".." => return None,
                _ => segments.push(segment),
            }
        }
        Some(Segments { segments, relative })
    }

    fn get(&self, i: usize) -> Option<&'a str> {
        self.segments.get(i).copied()
    }

    /// The segment before `i`, if any.
    fn before(&self, i: usize) -> Option<&'a str> {
        i.checked_sub(1).and_then(|j| self.get(j))
    }
}

/// The container whose id is in segment `i`, if segment `i` (with its parent) has one of
/// the known shapes: its runtime (when the shape says) and its id.
fn container_at<'a>(path: &Segments<'a>, i: usize) -> Option<(Option<Runtime>, &'a str)> {
    let segment = path.get(i)?;
    if let Some(stem) = segment.strip_suffix(".scope") {
        const SCOPES: [(&str, Runtime); 5] = [
            ("docker-", Runtime::Docker),
            ("cri-containerd-", Runtime::Containerd),
            ("nerdctl-", Runtime::Containerd),
            ("crio-", Runtime::CriO),
            ("libpod-", Runtime::Podman),
        ];
        return SCOPES.iter().find_map(|(prefix, runtime)| {
            let id = stem.strip_prefix(prefix)?;
            is_container_id(id).then_some((Some(*runtime), id))
        });
    }
    let parent = path.before(i)?;
    if is_container_id(segment) {
        if parent == "docker" {
            return Some((Some(Runtime::Docker), segment));
        }
        if pod_at(path, i - 1).is_some() {
            return Some((None, segment));
        }
        return None;
    }
    if let Some(id) = segment.strip_prefix("crio-")
        && is_container_id(id)
        && pod_at(path, i - 1).is_some()
    {
        return Some((Some(Runtime::CriO), id));
    }
    if let Some(id) = segment.strip_prefix("libpod-")
        && is_container_id(id)
        && parent == "libpod_parent"
    {
        return Some((Some(Runtime::Podman), id));
    }
    None
}

/// The pod UID (with dashes) and QoS class named by segment `i`, if it is a Kubernetes pod
/// segment in a known position.
fn pod_at(path: &Segments<'_>, i: usize) -> Option<(String, Option<QosClass>)> {
    let segment = path.get(i)?;

    // systemd driver: `[<prefix>-]kubepods[-burstable|-besteffort]-pod<uid_>.slice`.
    if let Some(stem) = segment.strip_suffix(".slice") {
        let (parents, pod) = stem.rsplit_once('-')?;
        let uid = pod_uid(pod.strip_prefix("pod")?, '_')?;
        let mut parts = parents.rsplit('-');
        let qos = match parts.next()? {
            "kubepods" => QosClass::Guaranteed,
            "burstable" if parts.next()? == "kubepods" => QosClass::Burstable,
            "besteffort" if parts.next()? == "kubepods" => QosClass::BestEffort,
            _ => return None,
        };
        return Some((uid, Some(qos)));
    }

    // cgroupfs driver: `kubepods[/burstable|/besteffort]/pod<uid>`.
    let uid = pod_uid(segment.strip_prefix("pod")?, '-')?;
    let qos = match (
        path.before(i),
        i.checked_sub(1).and_then(|j| path.before(j)),
    ) {
        (Some("kubepods"), _) => Some(QosClass::Guaranteed),
        (Some("burstable"), Some("kubepods")) => Some(QosClass::Burstable),
        (Some("besteffort"), Some("kubepods")) => Some(QosClass::BestEffort),
        (Some("burstable"), None) if path.relative => Some(QosClass::Burstable),
        (Some("besteffort"), None) if path.relative => Some(QosClass::BestEffort),
        (None, _) if path.relative => None,
        _ => return None,
    };
    Some((uid, qos))
}

/// A pod UID as written in a cgroup name, with `separator` between its groups, in canonical
/// form: a dashed lowercase UUID, or 32 lowercase hex digits (static pods). `None` for
/// anything else.
fn pod_uid(text: &str, separator: char) -> Option<String> {
    if text.len() == 32 && is_lower_hex(text) {
        return Some(text.to_owned());
    }
    let groups: Vec<&str> = text.split(separator).collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    (lengths == [8, 4, 4, 4, 12] && groups.iter().all(|g| is_lower_hex(g)))
        .then(|| groups.join("-"))
}

/// Exactly [`CONTAINER_ID_LEN`] lowercase hex digits.
fn is_container_id(text: &str) -> bool {
    text.len() == CONTAINER_ID_LEN && is_lower_hex(text)
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
    const ID2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
    const UID_US: &str = "1a2b3c4d_5e6f_4a7b_8c9d_0e1f2a3b4c5d";
    const STATIC_UID: &str = "8b2f6c1de0a94c3b9f7e6d5c4b3a2910";

    /// Checks the full attribution of `path`.
    fn check(
        path: &str,
        id: Option<&str>,
        runtime: Option<Runtime>,
        pod: Option<&str>,
        qos: Option<QosClass>,
    ) {
        let info = attribute(path);
        assert_eq!(info.container_id.as_deref(), id, "id of {path}");
        assert_eq!(info.runtime, runtime, "runtime of {path}");
        assert_eq!(info.pod_uid.as_deref(), pod, "pod of {path}");
        assert_eq!(info.qos_class, qos, "qos of {path}");
        assert_eq!(info.cgroup_path, path);
        assert!(info.nspid.is_empty());
    }

    fn nothing(path: &str) {
        check(path, None, None, None, None);
    }

    #[test]
    fn docker_systemd_and_cgroupfs() {
        use Runtime::Docker;
        check(
            &format!("/system.slice/docker-{ID}.scope"),
            Some(ID),
            Some(Docker),
            None,
            None,
        );
        check(&format!("/docker/{ID}"), Some(ID), Some(Docker), None, None);
        check(
            &format!("/docker/{ID}/"),
            Some(ID),
            Some(Docker),
            None,
            None,
        );
        // Docker in Docker: the outermost container (the host's runtime knows that one).
        check(
            &format!("/docker/{ID}/docker/{ID2}"),
            Some(ID),
            Some(Docker),
            None,
            None,
        );
        // systemd running inside a container makes its own cgroups.
        check(
            &format!("/system.slice/docker-{ID}.scope/system.slice/cron.service"),
            Some(ID),
            Some(Docker),
            None,
            None,
        );
        // Rootless Docker.
        check(
            &format!("/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope"),
            Some(ID),
            Some(Docker),
            None,
            None,
        );
        // The daemon itself is not a container.
        nothing("/system.slice/docker.service");
        nothing("/system.slice/containerd.service");
    }

    #[test]
    fn kubernetes_systemd_driver() {
        use QosClass::*;
        use Runtime::*;
        let burstable = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{ID}.scope"
        );
        check(
            &burstable,
            Some(ID),
            Some(Containerd),
            Some(UID),
            Some(Burstable),
        );
        let guaranteed =
            format!("/kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{ID}.scope");
        check(
            &guaranteed,
            Some(ID),
            Some(Containerd),
            Some(UID),
            Some(Guaranteed),
        );
        let besteffort = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice/crio-{ID}.scope"
        );
        check(
            &besteffort,
            Some(ID),
            Some(CriO),
            Some(UID),
            Some(BestEffort),
        );
        // CRI-O with crun on cgroup v2: the payload in a `container` sub-cgroup.
        let crun = format!("{besteffort}/container");
        check(&crun, Some(ID), Some(CriO), Some(UID), Some(BestEffort));
        // cri-dockerd.
        let dockerd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/docker-{ID}.scope"
        );
        check(&dockerd, Some(ID), Some(Docker), Some(UID), Some(Burstable));
        // Static pod (UID is a 32-hex hash).
        let static_pod =
            format!("/kubepods.slice/kubepods-pod{STATIC_UID}.slice/cri-containerd-{ID}.scope");
        check(
            &static_pod,
            Some(ID),
            Some(Containerd),
            Some(STATIC_UID),
            Some(Guaranteed),
        );
        // kind: a node in a Docker container, kubelet slices prefixed with `kubelet-`. Seen
        // from the host, the outermost container is the node's (the host's runtime knows it);
        // seen from inside the node (its cgroup namespace), the pod's container.
        let in_node = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_US}.slice/cri-containerd-{ID}.scope"
        );
        check(&format!("/system.slice/docker-{ID2}.scope{in_node}"), Some(ID2), Some(Docker), None, None);
        check(&in_node, Some(ID), Some(Containerd), Some(UID), Some(BestEffort));
        // Issue #28 item 9: a container that writes its own cgroup tree names a sub-cgroup
        // after another container (and its pod): it keeps its own id and pod.
        check(&format!("{guaranteed}/kubepods-besteffort-pod{STATIC_UID}.slice/cri-containerd-{ID2}.scope"), Some(ID), Some(Containerd), Some(UID), Some(Guaranteed));
        check(&format!("{guaranteed}/docker-{ID2}.scope"), Some(ID), Some(Containerd), Some(UID), Some(Guaranteed));
        // The pod slice alone: a pod, no container.
        let pod_only = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice"
        );
        check(&pod_only, None, None, Some(UID), Some(Burstable));
        // QoS slices alone.
        nothing("/kubepods.slice/kubepods-burstable.slice");
        nothing("/kubepods.slice");
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        use QosClass::*;
        check(
            &format!("/kubepods/burstable/pod{UID}/{ID}"),
            Some(ID),
            None,
            Some(UID),
            Some(Burstable),
        );
        check(
            &format!("/kubepods/besteffort/pod{UID}/{ID}"),
            Some(ID),
            None,
            Some(UID),
            Some(BestEffort),
        );
        check(
            &format!("/kubepods/pod{UID}/{ID}"),
            Some(ID),
            None,
            Some(UID),
            Some(Guaranteed),
        );
        check(
            &format!("/kubepods/pod{STATIC_UID}/{ID}"),
            Some(ID),
            None,
            Some(STATIC_UID),
            Some(Guaranteed),
        );
        // Under a custom --cgroup-root.
        check(
            &format!("/kubelet/kubepods/burstable/pod{UID}/{ID}"),
            Some(ID),
            None,
            Some(UID),
            Some(Burstable),
        );
        // CRI-O with the cgroupfs manager.
        check(
            &format!("/kubepods/burstable/pod{UID}/crio-{ID}"),
            Some(ID),
            Some(Runtime::CriO),
            Some(UID),
            Some(Burstable),
        );
        check(
            &format!("/kubepods/burstable/pod{UID}"),
            None,
            None,
            Some(UID),
            Some(Burstable),
        );
        // A QoS directory without kubepods above it, in an absolute path: unknown.
        nothing(&format!("/burstable/pod{UID}/{ID}"));
        nothing(&format!("/pod{UID}/{ID}"));
        // The dashed UID is the cgroupfs form; underscores there are not a known shape.
        nothing(&format!("/kubepods/burstable/pod{UID_US}/{ID}"));
        // Issue #28 item 9: a victim's pod and id written below a container's own cgroup.
        check(
            &format!("/kubepods/burstable/pod{UID}/{ID}/kubepods/pod{STATIC_UID}/{ID2}"),
            Some(ID),
            None,
            Some(UID),
            Some(Burstable),
        );
    }

    #[test]
    fn paths_relative_to_a_cgroup_namespace() {
        use QosClass::*;
        use Runtime::*;
        // What an agent in its own cgroup namespace sees of a process in another pod.
        check(
            &format!(
                "/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice/cri-containerd-{ID}.scope"
            ),
            Some(ID),
            Some(Containerd),
            Some(UID),
            Some(BestEffort),
        );
        check(
            &format!("/../../besteffort/pod{UID}/{ID}"),
            Some(ID),
            None,
            Some(UID),
            Some(BestEffort),
        );
        check(
            &format!("/../../pod{UID}/{ID}"),
            Some(ID),
            None,
            Some(UID),
            None,
        );
        // A sibling container of the same pod: a bare id with nothing known above it.
        nothing(&format!("/../{ID}"));
        check(
            &format!("/../cri-containerd-{ID}.scope"),
            Some(ID),
            Some(Containerd),
            None,
            None,
        );
        check(
            &format!("/../../../../system.slice/docker-{ID}.scope"),
            Some(ID),
            Some(Docker),
            None,
            None,
        );
        // `..` after a real segment never appears in /proc; refuse it.
        nothing(&format!("/docker/../docker/{ID}"));
    }

    #[test]
    fn podman_and_nerdctl() {
        use Runtime::*;
        check(
            &format!("/machine.slice/libpod-{ID}.scope"),
            Some(ID),
            Some(Podman),
            None,
            None,
        );
        check(
            &format!("/machine.slice/libpod-{ID}.scope/container"),
            Some(ID),
            Some(Podman),
            None,
            None,
        );
        check(
            &format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
            ),
            Some(ID),
            Some(Podman),
            None,
            None,
        );
        check(
            &format!("/libpod_parent/libpod-{ID}"),
            Some(ID),
            Some(Podman),
            None,
            None,
        );
        // conmon is not the container.
        nothing(&format!("/machine.slice/libpod-conmon-{ID}.scope"));
        nothing(&format!("/libpod-{ID}"));
        check(
            &format!("/system.slice/nerdctl-{ID}.scope"),
            Some(ID),
            Some(Containerd),
            None,
            None,
        );
    }

    #[test]
    fn unknown_shapes_give_no_id() {
        // containerd outside Kubernetes: `/<namespace>/<id>` is ambiguous.
        nothing(&format!("/default/{ID}"));
        nothing(&format!("/moby/{ID}"));
        nothing(&format!("/{ID}"));
        nothing(&format!("/ecs/{ID2}/{ID}"));
        nothing(&format!("/system.slice/{ID}.scope"));
        nothing(&format!("/system.slice/unknown-{ID}.scope"));
        // Ids must be exactly 64 lowercase hex digits.
        let upper = ID.to_uppercase();
        nothing(&format!("/docker/{upper}"));
        nothing(&format!("/system.slice/docker-{upper}.scope"));
        nothing(&format!("/docker/{}", &ID[..63]));
        nothing(&format!("/docker/{ID}0"));
        nothing(&format!("/system.slice/docker-{}.scope", &ID[1..]));
        nothing(&format!("/system.slice/docker-{ID}z.scope"));
        nothing(&format!("/system.slice/docker-{}g.scope", &ID[1..]));
        // Malformed pod UIDs.
        nothing(&format!("/kubepods/burstable/pod{}/{ID}", &UID[1..]));
        nothing(&format!(
            "/kubepods/burstable/pod{}/{ID}",
            UID.to_uppercase()
        ));
        nothing(&format!("/kubepods/burstable/pod/{ID}"));
        nothing("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod.slice");
        nothing(&format!("/kubepods.slice/kubepods-other-pod{UID_US}.slice"));
        nothing(&format!(
            "/kubepods.slice/other-burstable-pod{UID_US}.slice"
        ));
        nothing(&format!("/kubepods.slice/burstable-pod{UID_US}.slice"));
        nothing(&format!("/x/kubepods-pod{UID}.slice"));
        // A known container followed by an unknown 64-hex segment: the known one counts.
        check(
            &format!("/docker/{ID}/{ID2}"),
            Some(ID),
            Some(Runtime::Docker),
            None,
            None,
        );
        // Host processes.
        nothing("/");
        nothing("/init.scope");
        nothing("/user.slice/user-1000.slice/session-2.scope");
        nothing("");
        nothing("relative/docker/x");
        nothing(&format!("docker/{ID}"));
    }

    #[test]
    fn garbage_paths_do_not_panic() {
        let long = "a/".repeat(10_000);
        for path in [
            "//",
            "/..",
            "/../..",
            "/.",
            "/\u{0}",
            "/é/ü",
            "/-.slice",
            "/pod.slice",
            "/-pod.slice",
            "/kubepods-pod.slice",
            "/.scope",
            "/docker-.scope",
            "/crio-",
            long.as_str(),
            &format!("/{long}"),
        ] {
            let info = attribute(path);
            assert_eq!(info.container_id, None, "{path:?}");
        }
        // Non-ASCII of the right byte length must not be sliced mid-character.
        let multibyte = "é".repeat(32);
        nothing(&format!("/docker/{multibyte}"));
        nothing(&format!("/system.slice/docker-{multibyte}.scope"));
        nothing(&format!("/kubepods/pod{}/{ID}", "é".repeat(18)));
    }

    #[test]
    fn short_id_and_namespace_pid() {
        let info = ContainerInfo {
            container_id: Some(ID.to_owned()),
            nspid: vec![4321, 17, 1],
            ..ContainerInfo::default()
        };
        assert_eq!(info.short_id(), Some(&ID[..12]));
        assert_eq!(info.namespace_pid(), Some(1));
        let empty = ContainerInfo::default();
        assert_eq!(empty.short_id(), None);
        assert_eq!(empty.namespace_pid(), None);
    }

    #[test]
    fn cgroup_v2_file() {
        let file = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            parse_cgroup_file(&file),
            format!("/system.slice/docker-{ID}.scope")
        );
        assert_eq!(parse_cgroup_file("0::/\n"), "/");
        assert_eq!(
            parse_cgroup_file("0::/user.slice/user-1000.slice/session-3.scope"),
            "/user.slice/user-1000.slice/session-3.scope"
        );
        let deleted = format!("0::/kubepods/pod{UID}/{ID} (deleted)\n");
        assert_eq!(
            parse_cgroup_file(&deleted),
            format!("/kubepods/pod{UID}/{ID}")
        );
        // Relative to a cgroup namespace.
        let relative = format!("0::/../../kubepods-pod{UID_US}.slice/cri-containerd-{ID}.scope\n");
        let info = attribute(&parse_cgroup_file(&relative));
        assert_eq!(info.container_id.as_deref(), Some(ID));
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn cgroup_v1_file_with_many_controllers() {
        let path = format!("/kubepods/burstable/pod{UID}/{ID}");
        let file = format!(
            "12:hugetlb:{path}\n11:perf_event:{path}\n10:freezer:{path}\n9:pids:{path}\n8:net_cls,net_prio:{path}\n7:devices:{path}\n6:blkio:{path}\n5:cpuset:{path}\n4:memory:{path}\n3:cpu,cpuacct:{path}\n2:rdma:/\n1:name=systemd:{path}\n"
        );
        assert_eq!(parse_cgroup_file(&file), path);
        let info = attribute(&parse_cgroup_file(&file));
        assert_eq!(info.container_id.as_deref(), Some(ID));
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
        assert_eq!(info.qos_class, Some(QosClass::Burstable));

        // name=systemd preferred over cpu and memory; cpu over memory.
        let file = "4:memory:/m\n3:cpuacct,cpu:/c\n1:name=systemd:/s\n";
        assert_eq!(parse_cgroup_file(file), "/s");
        let file = "4:memory:/m\n3:cpuacct,cpu:/c\n";
        assert_eq!(parse_cgroup_file(file), "/c");
        assert_eq!(parse_cgroup_file("4:memory:/m\n2:pids:/p\n"), "/m");
        // Only irrelevant controllers.
        assert_eq!(parse_cgroup_file("2:pids:/p\n"), "");
    }

    #[test]
    fn hybrid_file_prefers_the_line_naming_a_container() {
        // systemd in hybrid mode: the unified line is the root, the v1 lines hold the
        // container (Docker with the cgroupfs driver).
        let file = format!(
            "12:cpu,cpuacct:/docker/{ID}\n4:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        assert_eq!(parse_cgroup_file(&file), format!("/docker/{ID}"));
        // v2 preferred when both name the container.
        let file = format!("3:cpu:/docker/{ID}\n0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            parse_cgroup_file(&file),
            format!("/system.slice/docker-{ID}.scope")
        );
        // Neither names a container: the unified line.
        assert_eq!(parse_cgroup_file("3:cpu:/a\n0::/b\n"), "/b");
        // A pod without a container beats nothing.
        let file = format!("3:cpu:/kubepods/pod{UID}\n0::/\n");
        assert_eq!(parse_cgroup_file(&file), format!("/kubepods/pod{UID}"));
    }

    #[test]
    fn garbage_cgroup_files() {
        for file in [
            "",
            "\n\n",
            "garbage",
            "0:",
            "0::",
            "0::relative",
            "x::/docker/abc",
            ":::",
            "-1::/a",
            "\u{0}\u{1}:\u{2}:",
        ] {
            assert_eq!(parse_cgroup_file(file), "", "{file:?}");
        }
        // Colons in the path survive.
        assert_eq!(parse_cgroup_file("0::/a:b\n"), "/a:b");
        // Garbage lines around a good one.
        let file = format!("junk\n\n0::/docker/{ID}\nmore junk:\n");
        assert_eq!(parse_cgroup_file(&file), format!("/docker/{ID}"));
        // Windows line endings.
        let file = format!("0::/docker/{ID}\r\n");
        assert_eq!(
            attribute(&parse_cgroup_file(&file)).container_id.as_deref(),
            Some(ID)
        );
    }

    #[test]
    fn nspid_lines() {
        let status =
            "Name:\tpython3\nTgid:\t4321\nPid:\t4321\nNSpid:\t4321\t17\t1\nNSpgid:\t4321\n";
        assert_eq!(parse_nspid(status), vec![4321, 17, 1]);
        assert_eq!(parse_nspid("NSpid:\t99\n"), vec![99]);
        assert_eq!(parse_nspid("Pid:\t99\n"), Vec::<u32>::new());
        assert_eq!(parse_nspid("NSpid:\t99\tx\n"), Vec::<u32>::new());
        assert_eq!(parse_nspid("NSpid:\t99999999999\n"), Vec::<u32>::new());
        assert_eq!(parse_nspid("NSpid:\n"), Vec::<u32>::new());
        assert_eq!(parse_nspid(""), Vec::<u32>::new());
    }

    #[test]
    fn for_own_process() {
        let pid = std::process::id();
        let info = for_process(pid);
        if let Some(&first) = info.nspid.first() {
            assert_eq!(first, pid);
        }
        if let Some(id) = &info.container_id {
            assert!(is_container_id(id));
        }
        // A pid that cannot exist.
        assert_eq!(for_process(u32::MAX), ContainerInfo::default());
    }

    #[test]
    fn for_process_in_a_fake_proc() {
        let root = std::env::temp_dir().join(format!("pyperch-containers-{}", std::process::id()));
        let dir = root.join("42");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cgroup = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{ID}.scope\n"
        );
        std::fs::write(dir.join("cgroup"), cgroup).expect("write cgroup");
        // Missing status: empty info.
        assert_eq!(for_process_in(&root, 42), ContainerInfo::default());
        std::fs::write(dir.join("status"), "Name:\tpython3\nNSpid:\t42\t7\n")
            .expect("write status");
        let info = for_process_in(&root, 42);
        assert_eq!(info.container_id.as_deref(), Some(ID));
        assert_eq!(info.runtime, Some(Runtime::Containerd));
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
        assert_eq!(info.qos_class, Some(QosClass::Burstable));
        assert_eq!(info.nspid, vec![42, 7]);
        assert_eq!(info.namespace_pid(), Some(7));
        assert_eq!(info.short_id(), Some(&ID[..12]));
        // Binary garbage in both files.
        std::fs::write(dir.join("cgroup"), [0xff, 0xfe, b':', b':', b'/', 0x80]).expect("write");
        std::fs::write(dir.join("status"), [0xff, 0x00, 0x80]).expect("write");
        let info = for_process_in(&root, 42);
        assert_eq!(info.container_id, None);
        assert!(info.nspid.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::config;

    /// A segment from the pieces real cgroup paths are made of, or anything.
    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("docker".to_owned()),
            Just("kubepods".to_owned()),
            Just("burstable".to_owned()),
            Just("..".to_owned()),
            Just("libpod_parent".to_owned()),
            "(docker-|crio-|libpod-|cri-containerd-)?[0-9a-f]{62,66}(\\.scope)?",
            "(kubelet-)?kubepods(-burstable|-besteffort)?-pod[0-9a-f_]{30,40}\\.slice",
            "pod[0-9a-f-]{30,40}",
            "[^/\\n]{0,12}",
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec(segment(), 0..8).prop_map(|s| format!("/{}", s.join("/")))
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn fuzz_cgroup_path(path in path()) {
            let info = attribute(&path);
            prop_assert!(info.container_id.as_ref().is_none_or(|id| id.len() == CONTAINER_ID_LEN));
            prop_assert!(info.pod_uid.as_ref().is_none_or(|uid| uid.len() <= 36));
        }

        #[test]
        fn fuzz_cgroup_file(
            lines in prop::collection::vec(("[0-9]{0,3}|x", "(cpu|memory|name=systemd|cpu,cpuacct|)", path()), 0..6),
            noise in ".{0,80}",
        ) {
            let text: String = lines.iter().map(|(h, c, p)| format!("{h}:{c}:{p}\n")).collect::<String>() + &noise;
            prop_assert!(parse_cgroup_file(&text).len() <= text.len());
            prop_assert!(parse_nspid(&text).len() <= text.len());
        }
    }
}
