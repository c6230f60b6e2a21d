//! The cgroup segments container runtimes name their containers' cgroups with.

use std::fmt;

use super::{CONTAINER_ID_LEN, cgroup_path::Segments, is_lower_hex, pod::pod_at};

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

/// The container whose id is in segment `i`, if segment `i` (with its parent) has one of
/// the known shapes: its runtime (when the shape says) and its id.
pub(super) fn container_at<'a>(path: &Segments<'a>, i: usize) -> Option<(Option<Runtime>, &'a str)> {
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

/// Exactly [`CONTAINER_ID_LEN`] lowercase hex digits.
pub(super) fn is_container_id(text: &str) -> bool {
    text.len() == CONTAINER_ID_LEN && is_lower_hex(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::containers::test_support::*;

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
}
