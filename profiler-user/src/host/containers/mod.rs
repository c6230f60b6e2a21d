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
//!
//! By job: [`cgroup_path`] picks the path from `/proc/PID/cgroup` and splits it into segments;
//! [`runtimes`] knows the segment shapes container runtimes name their cgroups with; [`pod`]
//! the kubelet's pod segments (UID and QoS class); this module reads `/proc` and holds what
//! they find ([`ContainerInfo`]).

mod cgroup_path;
mod pod;
mod runtimes;

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

pub use cgroup_path::{attribute, parse_cgroup_file};
pub use pod::QosClass;
pub use runtimes::Runtime;

/// Files read from `/proc` are small; anything longer than this is not what we expect, and
/// only this much of it is read.
const MAX_PROC_FILE: u64 = 64 * 1024;

/// Length of a full container id, in (lowercase hex) characters.
pub const CONTAINER_ID_LEN: usize = 64;

/// Length of the abbreviated id that `docker ps` and `crictl ps` show.
pub const SHORT_ID_LEN: usize = 12;

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

/// Only `0-9a-f` (an empty text too).
pub(super) fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod test_support;

#[cfg(test)]
mod tests {
    use super::*;
    use super::runtimes::is_container_id;
    use super::test_support::ID;
    use super::test_support::{UID, UID_US};

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
