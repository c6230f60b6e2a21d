//! Which processes to profile: `--container`, `--pod`, `--cgroup`, `--comm`, `--cmdline`,
//! `--namespace`, `--pod-name`.
//!
//! Filters are checked in userspace before a process is registered with the kernel, so the
//! kernel program drops the samples of every other process at its first map lookup. All
//! given filters must match (they combine with AND, and with `--pid`); within one flag
//! repeated values are alternatives (OR).

use regex::Regex;

use crate::host::containers;

#[derive(Debug, Clone, Default)]
pub struct ProcessFilter {
    /// Container id prefixes (full 64-hex ids or any prefix, e.g. the 12-hex short id).
    pub containers: Vec<String>,
    /// Kubernetes pod UIDs.
    pub pods: Vec<String>,
    /// cgroup path prefixes (as in /proc/PID/cgroup).
    pub cgroups: Vec<String>,
    /// Matched against /proc/PID/comm.
    pub comm: Option<Regex>,
    /// Matched against the command line, arguments separated by spaces.
    pub cmdline: Option<Regex>,
    /// Kubernetes namespaces (from the runtime's annotations, see [`crate::host::pod_names`]).
    pub namespaces: Vec<String>,
    /// Matched against the Kubernetes pod name (from the runtime's annotations).
    pub pod_name: Option<Regex>,
}

impl ProcessFilter {
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
            && self.pods.is_empty()
            && self.cgroups.is_empty()
            && self.comm.is_none()
            && self.cmdline.is_none()
            && !self.needs_pod_names()
    }

    /// Whether the filter needs the Kubernetes names of a process (`--namespace`,
    /// `--pod-name`).
    pub fn needs_pod_names(&self) -> bool {
        !self.namespaces.is_empty() || self.pod_name.is_some()
    }

    /// The filters as the user gave them, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        parts.extend(self.containers.iter().map(|c| format!("--container {c}")));
        parts.extend(self.pods.iter().map(|p| format!("--pod {p}")));
        parts.extend(self.cgroups.iter().map(|c| format!("--cgroup {c}")));
        if let Some(r) = &self.comm {
            parts.push(format!("--comm {}", r.as_str()));
        }
        if let Some(r) = &self.cmdline {
            parts.push(format!("--cmdline {}", r.as_str()));
        }
        parts.extend(self.namespaces.iter().map(|n| format!("--namespace {n}")));
        if let Some(r) = &self.pod_name {
            parts.push(format!("--pod-name {}", r.as_str()));
        }
        parts.join(" ")
    }

    /// Whether process `pid` passes every filter (reads /proc; a vanished process fails).
    pub fn matches(&self, pid: u32) -> bool {
        if let Some(re) = &self.comm {
            // Bytes, not read_to_string: a name cut mid-character must still match.
            let Ok(comm) = std::fs::read(format!("/proc/{pid}/comm")).map(|b| crate::text::decode(&b)) else {
                return false;
            };
            if !re.is_match(comm.trim_end_matches('\n')) {
                return false;
            }
        }
        if let Some(re) = &self.cmdline {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            let line: String = String::from_utf8_lossy(&raw).trim_end_matches('\0').replace('\0', " ");
            if !re.is_match(&line) {
                return false;
            }
        }
        if self.containers.is_empty() && self.pods.is_empty() && self.cgroups.is_empty() && !self.needs_pod_names() {
            return true;
        }
        let info = containers::for_process(pid);
        if !self.matches_container(&info) {
            return false;
        }
        !self.needs_pod_names() || self.matches_pod_names(crate::host::pod_names::for_container(&info).as_deref())
    }

    /// The `--namespace` / `--pod-name` part of the filter, on already-read names (`None`:
    /// no names known, which matches neither).
    pub fn matches_pod_names(&self, names: Option<&crate::host::pod_names::PodNames>) -> bool {
        if !self.needs_pod_names() {
            return true;
        }
        let Some(names) = names else { return false };
        if !self.namespaces.is_empty() && !self.namespaces.iter().any(|n| *n == names.namespace) {
            return false;
        }
        self.pod_name.as_ref().is_none_or(|re| re.is_match(&names.pod))
    }

    /// The container part of the filter, on already-read attribution.
    pub fn matches_container(&self, info: &containers::ContainerInfo) -> bool {
        if !self.containers.is_empty() {
            let Some(id) = info.container_id.as_deref() else { return false };
            if !self.containers.iter().any(|prefix| !prefix.is_empty() && id.starts_with(&prefix.to_ascii_lowercase())) {
                return false;
            }
        }
        if !self.pods.is_empty() {
            let Some(uid) = info.pod_uid.as_deref() else { return false };
            let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
            if !self.pods.iter().any(|p| norm(p) == norm(uid)) {
                return false;
            }
        }
        if !self.cgroups.is_empty() && !self.cgroups.iter().any(|c| info.cgroup_path.starts_with(c.as_str())) {
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::containers::attribute;

    const ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn container_pod_and_cgroup_filters() {
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234abcd_0000_1111_2222_333344445555.slice/cri-containerd-{ID}.scope"
        );
        let info = attribute(&path);
        let f = ProcessFilter { containers: vec![ID[..12].to_string()], ..Default::default() };
        assert!(f.matches_container(&info));
        let f = ProcessFilter { containers: vec!["ffff".into()], ..Default::default() };
        assert!(!f.matches_container(&info));
        let f = ProcessFilter { pods: vec!["1234abcd-0000-1111-2222-333344445555".into()], ..Default::default() };
        assert!(f.matches_container(&info));
        let f = ProcessFilter { cgroups: vec!["/kubepods.slice/".into()], ..Default::default() };
        assert!(f.matches_container(&info));
        let f = ProcessFilter { cgroups: vec!["/system.slice/".into()], ..Default::default() };
        assert!(!f.matches_container(&info));
        // A host process has no container: a container filter never matches it.
        let host = attribute("/user.slice/user-0.slice/session-1.scope");
        let f = ProcessFilter { containers: vec![ID[..12].to_string()], ..Default::default() };
        assert!(!f.matches_container(&host));
    }

    #[test]
    fn namespace_and_pod_name_filters() {
        use crate::host::pod_names::PodNames;
        let names = PodNames { namespace: "shop".into(), pod: "checkout-7d9f6b5c4-x2x7q".into(), container: "api".into() };
        let f = ProcessFilter { namespaces: vec!["shop".into()], ..Default::default() };
        assert!(!f.is_empty());
        assert!(f.matches_pod_names(Some(&names)));
        assert!(!f.matches_pod_names(None), "a process without names never matches a name filter");
        let f = ProcessFilter { namespaces: vec!["kube-system".into(), "shop".into()], ..Default::default() };
        assert!(f.matches_pod_names(Some(&names)));
        let f = ProcessFilter { namespaces: vec!["sho".into()], ..Default::default() };
        assert!(!f.matches_pod_names(Some(&names)), "namespaces match exactly");
        let f = ProcessFilter { pod_name: Some(Regex::new("^checkout-").unwrap()), ..Default::default() };
        assert!(f.matches_pod_names(Some(&names)));
        let f = ProcessFilter { pod_name: Some(Regex::new("^web-").unwrap()), namespaces: vec!["shop".into()], ..Default::default() };
        assert!(!f.matches_pod_names(Some(&names)));
        assert_eq!(f.describe(), "--namespace shop --pod-name ^web-");
        assert!(ProcessFilter::default().matches_pod_names(None));
    }

    #[test]
    fn comm_and_cmdline_on_this_process() {
        let me = std::process::id();
        let f = ProcessFilter { comm: Some(Regex::new(".").unwrap()), ..Default::default() };
        assert!(f.matches(me));
        let f = ProcessFilter { cmdline: Some(Regex::new("^$").unwrap()), ..Default::default() };
        assert!(!f.matches(me));
        assert!(ProcessFilter::default().is_empty());
        assert!(!f.matches(u32::MAX - 1));
    }
}
