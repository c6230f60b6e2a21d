//! `pyperch list`: the Python processes pyperch sees, and why any cannot be profiled.

use std::fmt::Write as _;

use crate::{
    host::containers,
    session::{Budgeted, INSPECT_BUDGET},
    target::discovery::{self, DiscoveryError, Linkage},
};

/// One row of the listing: raw text (invalid UTF-8 as `\xNN`); [`render`] escapes it.
#[derive(Debug, Clone)]
pub struct Row {
    pub pid: u32,
    pub executable: String,
    pub version: String,
    pub linkage: String,
    pub threads: String,
    /// Short container id ("-" outside containers), pod UID, PID inside its namespace.
    pub container: String,
    pub pod: String,
    pub namespace_pid: String,
    /// "ok", or why the process cannot be profiled.
    pub status: String,
    /// Kubernetes `namespace/pod/container` from the runtime's annotations; [`UNANNOTATED`]
    /// for a container whose runtime keeps none; "-" outside containers.
    pub names: String,
}

/// The NAME cell of a container whose runtime keeps no Kubernetes annotations (plain
/// docker or podman, or a runtime pyperch does not know): it is shown by id only.
pub const UNANNOTATED: &str = "(unannotated)";

/// The NAME cell of a process: see [`Row::names`].
fn names_cell(info: &containers::ContainerInfo) -> String {
    if info.container_id.is_none() {
        return "-".into();
    }
    match crate::host::pod_names::for_container(info) {
        Some(n) => format!("{}/{}/{}", n.namespace, n.pod, n.container),
        None => UNANNOTATED.into(),
    }
}

/// Every Python process on the host (by content), supported or not.
pub fn python_processes() -> Vec<Row> {
    let own = std::process::id();
    let mut rows = Vec::new();
    // Each process is looked at with a time budget: one whose files never answer gets a row
    // saying so instead of hanging the listing.
    let budgeted = Budgeted::default();
    for pid in discovery::python_pids_candidates() {
        if pid == own {
            continue;
        }
        match budgeted.run_for(pid, INSPECT_BUDGET, move || row(pid)) {
            Ok(Some(row)) => rows.push(row),
            Ok(None) => {}
            Err(_) => rows.push(Row {
                status: format!("skipped: did not answer within {:.1} s", INSPECT_BUDGET.as_secs_f64()),
                ..unknown_row(pid, "?", "?", "?")
            }),
        }
    }
    rows.sort_by_key(|r| r.pid);
    rows
}

/// The row of process `pid`, if it is a Python process.
fn row(pid: u32) -> Option<Row> {
    let info = containers::for_process(pid);
    let container = info.short_id().map(str::to_string).unwrap_or_else(|| "-".into());
    let pod = info.pod_uid.clone().unwrap_or_else(|| "-".into());
    let namespace_pid = info.namespace_pid().map(|p| p.to_string()).unwrap_or_else(|| "-".into());
    let names = names_cell(&info);
    let (container, pod, namespace_pid) = (&container, &pod, &namespace_pid);
    let row = match discovery::inspect(pid) {
        Ok(p) => Some(Row {
            pid,
            executable: crate::text::decode(p.exe.as_os_str().as_encoded_bytes()),
            version: p.version_label(),
            linkage: match &p.linkage {
                Linkage::Static => "static".to_string(),
                Linkage::Shared { .. } => "shared".to_string(),
            },
            threads: p.thread_count().map(|n| n.to_string()).unwrap_or_else(|| "?".into()),
            container: container.clone(),
            pod: pod.clone(),
            namespace_pid: namespace_pid.clone(),
            status: match subinterpreter_gap(&p) {
                Some(gap) => format!("ok, but it has subinterpreters: {gap}"),
                None => "ok".to_string(),
            },
            names: String::new(),
        }),
        Err(DiscoveryError::Unsupported { reason, .. }) => {
            Some(Row { status: format!("unsupported: {reason}"), ..unknown_row(pid, container, pod, namespace_pid) })
        }
        Err(DiscoveryError::NotReady { reason, .. }) => {
            Some(Row { status: format!("starting: {reason}"), ..unknown_row(pid, container, pod, namespace_pid) })
        }
        Err(_) => None,
    };
    row.map(|row| Row { names, ..row })
}

/// Why the process's threads in subinterpreters cannot be sampled, when it has any now and
/// its version cannot (`layout::published::interpreter_support_gap`).
fn subinterpreter_gap(p: &discovery::PythonProcess) -> Option<&'static str> {
    let gap = crate::target::layout::published::interpreter_support_gap(p.version)?;
    let next = p.interpreters?.next;
    let mem = crate::target::memory::ProcessMemory::new(p.pid);
    let head = mem.read_u64(p.interpreters_head_address()).ok()?;
    let second = mem.read_u64(head.wrapping_add(next.into())).ok()?;
    (head != 0 && second != 0).then_some(gap)
}

/// A row for a Python process whose interpreter could not be inspected.
fn unknown_row(pid: u32, container: &str, pod: &str, namespace_pid: &str) -> Row {
    Row {
        pid,
        executable: std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| crate::text::decode(p.as_os_str().as_encoded_bytes()))
            .unwrap_or_else(|_| "?".into()),
        version: "?".into(),
        linkage: "?".into(),
        threads: "?".into(),
        container: container.to_string(),
        pod: pod.to_string(),
        namespace_pid: namespace_pid.to_string(),
        status: String::new(),
        names: "?".into(),
    }
}

/// The rows as an aligned table. Every cell is shown through [`crate::text::field`]: a
/// path, reason or label from a target cannot steer the terminal or break a row.
pub fn render(rows: &[Row]) -> String {
    let headers = ["PID", "NSPID", "EXECUTABLE", "VERSION", "LIBPYTHON", "THREADS", "CONTAINER", "POD", "NAME", "STATUS"];
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                r.pid.to_string(),
                r.namespace_pid.clone(),
                r.executable.clone(),
                r.version.clone(),
                r.linkage.clone(),
                r.threads.clone(),
                r.container.clone(),
                r.pod.clone(),
                r.names.clone(),
                r.status.clone(),
            ]
            .map(|cell| crate::text::field(&cell).to_string())
        })
        .collect();
    let mut widths = headers.map(|h| h.len());
    for row in &cells {
        for (i, c) in row.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[&str]| {
        for (i, c) in row.iter().enumerate() {
            if i + 1 == row.len() {
                let _ = write!(out, "{c}");
            } else {
                let _ = write!(out, "{c:<w$}  ", w = widths[i]);
            }
        }
        out.push('\n');
    };
    line(&mut out, &headers);
    for row in &cells {
        let refs: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &refs);
    }
    if rows.iter().any(|r| r.names == UNANNOTATED) {
        out.push_str(UNANNOTATED_NOTE);
        out.push('\n');
        if let Some(problem) = crate::host::pod_names::host_root_problem() {
            out.push_str(&format!("(unannotated): names unknown: {}\n", crate::text::field(&problem)));
        }
    }
    out
}

/// Printed under the table when a container has no names.
pub const UNANNOTATED_NOTE: &str = "(unannotated): the container's runtime keeps no Kubernetes annotations (plain docker or podman, or not a pod); it is shown by its id only";

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, names: &str) -> Row {
        Row {
            pid,
            executable: "/usr/bin/python3".into(),
            version: "3.12.1".into(),
            linkage: "shared".into(),
            threads: "1".into(),
            container: "4f1a2b3c4d5e".into(),
            pod: "-".into(),
            namespace_pid: "1".into(),
            status: "ok".into(),
            names: names.into(),
        }
    }

    #[test]
    fn name_column_and_unannotated_note() {
        let out = render(&[row(10, "shop/checkout-1/api")]);
        let mut lines = out.lines();
        assert_eq!(lines.next().unwrap().split_whitespace().collect::<Vec<_>>()[8..], ["NAME", "STATUS"]);
        let cells: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(cells[8..], ["shop/checkout-1/api", "ok"]);
        assert!(!out.contains(UNANNOTATED_NOTE));
        let out = render(&[row(10, "shop/checkout-1/api"), row(11, UNANNOTATED)]);
        assert!(out.contains(UNANNOTATED_NOTE), "{out}");
    }
}
