//! The host pyperch runs on, and pyperch's own place in it: which container and Kubernetes pod
//! a process runs in (`containers`, from its cgroup path; `pod_names`, from the runtime's
//! files, which `runtime_bundle` finds from the container's own runtime), pyperch's
//! credentials (`privileges`: what it needs to start and drops once attached; `seccomp`: the
//! system calls it keeps), and the kernel itself (`kernel_btf`: structure offsets;
//! [`kernel_version`]).
//!
//! Nothing here imports the kernel program's loader, the session or a command: they ask the
//! host, not the other way round.

pub mod containers;
pub(crate) mod kernel_btf;
pub mod pod_names;
pub mod privileges;
pub mod runtime_bundle;
pub mod seccomp;

/// The running kernel's (major, minor) version; (0, 0) when it cannot be read.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
    (major, minor)
}
