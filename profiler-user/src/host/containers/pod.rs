//! The kubelet's pod segments: the pod UID and the QoS class.

use std::fmt;

use super::{cgroup_path::Segments, is_lower_hex};

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

/// The pod UID (with dashes) and QoS class named by segment `i`, if it is a Kubernetes pod
/// segment in a known position.
pub(super) fn pod_at(path: &Segments<'_>, i: usize) -> Option<(String, Option<QosClass>)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::containers::{Runtime, test_support::*};

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
}
