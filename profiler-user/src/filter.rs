//! Which processes to profile: `--container`, `--pod`, `--cgroup`, `--comm`, `--cmdline`.
//!
//! Filters are checked in userspace before a process is registered with the kernel, so the
//! kernel program drops the samples of every other process at its first map lookup. All
//! given filters must match (they combine with AND, and with `--pid`); within one flag
//! repeated values are alternatives (OR).

use regex::Regex;

use crate::containers;

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
}

impl ProcessFilter {
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
            && self.pods.is_empty()
            && self.cgroups.is_empty()
            && self.comm.is_none()
            && self.cmdline.is_none()
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
        if self.containers.is_empty() && self.pods.is_empty() && self.cgroups.is_empty() {
            return true;
        }
        let info = containers::for_process(pid);
        self.matches_container(&info)
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
    use crate::containers::attribute;

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
