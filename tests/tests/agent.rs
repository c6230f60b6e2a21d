//! `pyperch agent` against an ingest receiver on 127.0.0.1 started by the test
//! (tests/fixtures/ingest_receiver.py), which decodes every pprof with the official
//! profile.proto: labels, names, lines and sample counts are checked against the workloads
//! (a container of a Kubernetes pod, a Docker container, a process outside containers). The
//! receiver refuses for 30 s, then accepts: no crash, bounded memory, the loss counted, data
//! after the recovery arrives, and SIGTERM in the middle of an interval flushes it.
//!
//! Network faults, against tests/fixtures/faulty_ingest.py: a server that never answers
//! (SIGTERM still exits within the 10 s grace), one that answers 400 (profiles dropped and
//! counted as rejected, one try each), a redirect (not followed), an endless answer (memory
//! bounded, no hang); and an IPv6 literal URL, and credentials in the URL (refused).
//!
//! Needs the test virtualenv with `protobuf` and `grpcio-tools` (`cargo xtask test` creates
//! it); without it the tests SKIP.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use pyperch_tests::*;

const LEAVES: [&str; 5] = [
    "leaf_red",
    "leaf_green",
    "leaf_blue",
    "leaf_late",
    "leaf_old",
];
/// pyperch's default sampling rate (Hz).
const RATE: u64 = 99;
/// The agent's resident memory must stay below this (kB).
const MAX_HWM_KB: u64 = 300 * 1024;

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A workload to start: (cgroup, own namespaces?, leaf, container id, pod UID).
type Plan = (String, bool, &'static str, Option<String>, Option<String>);

/// One workload and what the agent should say about it.
struct Member {
    proc: Contained,
    leaf: &'static str,
    container: Option<String>,
    pod: Option<String>,
}

/// The labels naming a member's container and pod (none for a host process).
fn container_labels(m: &Member) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if let Some(c) = &m.container {
        labels.insert("container.id".to_string(), c.clone());
    }
    if let Some(p) = &m.pod {
        labels.insert("k8s.pod.uid".to_string(), p.clone());
    }
    labels
}

/// Three spinning interpreters: `k8s` (leaf_red, a containerd container of a Kubernetes
/// pod), `docker` (leaf_green) and `host` (leaf_blue, no namespaces, a cgroup naming no
/// container). Their command lines share `token`.
struct Workloads {
    members: Vec<Member>,
    token: String,
    _cgroups: Cgroups,
}

impl Workloads {
    fn start(with_second_pod_container: bool) -> Option<Workloads> {
        let (py, cgroups) = namespaced_python_and_cgroups()?;
        Some(Self::start_on(py, cgroups, with_second_pod_container))
    }

    /// The same with the interpreter `py` (its own namespaces without a new root where it
    /// has no rootfs of its own).
    fn start_on(py: Python, mut cgroups: Cgroups, with_second_pod_container: bool) -> Workloads {
        let token = format!("e2e{}", random_hex(10));
        let pod = random_pod_uid();
        let mut plan: Vec<Plan> = Vec::new();
        let id = random_hex(64);
        plan.push((
            kubepods_cgroup(&pod, &id),
            true,
            "leaf_red",
            Some(id),
            Some(pod.clone()),
        ));
        if with_second_pod_container {
            let id = random_hex(64);
            plan.push((
                kubepods_cgroup(&pod, &id),
                true,
                "leaf_late",
                Some(id),
                Some(pod.clone()),
            ));
        }
        let id = random_hex(64);
        plan.push((docker_cgroup(&id), true, "leaf_green", Some(id), None));
        plan.push((
            format!("/pyperch-e2e-{}.slice/host.scope", random_hex(8)),
            false,
            "leaf_blue",
            None,
            None,
        ));
        let mut members = Vec::new();
        for (i, (cg, ns, leaf, container, pod)) in plan.into_iter().enumerate() {
            let proc = Contained::spawn(
                &py,
                &mut cgroups,
                &cg,
                ns,
                "spin.py",
                &[leaf, "300"],
                &format!("{token}-{i}"),
            )
            .unwrap_or_else(|e| panic!("{e:#}"));
            members.push(Member {
                proc,
                leaf,
                container,
                pod,
            });
        }
        let w = Workloads {
            members,
            token,
            _cgroups: cgroups,
        };
        note(format!("processes:{}", w.summary()));
        w
    }

    fn by_pid(&self, pid: u32) -> Option<&Member> {
        self.members.iter().find(|m| m.proc.host_pid == pid)
    }

    fn summary(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("\n    {} running {}", m.proc.describe(), m.leaf))
            .collect()
    }
}

/// A running `pyperch agent`, its stderr collected line by line as it comes.
struct Agent {
    child: Child,
    argv: Vec<String>,
    /// (Unix time, line)
    lines: Arc<Mutex<Vec<(f64, String)>>>,
    reader: Option<thread::JoinHandle<()>>,
    start: Instant,
}

impl Agent {
    fn start(args: &[&str]) -> Agent {
        let mut cmd = Command::new(pyperch_bin());
        cmd.arg("agent")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let argv: Vec<String> = std::iter::once(pyperch_bin().display().to_string())
            .chain(std::iter::once("agent".to_string()))
            .chain(args.iter().map(|a| a.to_string()))
            .collect();
        let mut child = cmd.spawn().expect("cannot start pyperch agent");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push((now_unix(), line));
            }
        });
        Agent {
            child,
            argv,
            lines,
            reader: Some(reader),
            start: Instant::now(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }

    fn statuses(&self) -> Vec<Status> {
        self.lines()
            .iter()
            .filter_map(|l| Status::parse(l))
            .collect()
    }

    /// The status lines printed before Unix time `t`.
    fn statuses_before(&self, t: f64) -> Vec<Status> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at < t)
            .filter_map(|(_, l)| Status::parse(l))
            .collect()
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    fn diag(&self) -> String {
        let lines = self.lines();
        let mut s = format!(
            "\n--- command: {}\n--- after {:.1} s; stderr ({} lines, last 40):\n",
            self.argv.join(" "),
            self.start.elapsed().as_secs_f64(),
            lines.len()
        );
        for l in &lines[lines.len().saturating_sub(40)..] {
            s.push_str("    ");
            s.push_str(l);
            s.push('\n');
        }
        s
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `pyperch agent: interval N: ...` status line.
#[derive(Clone, Debug)]
struct Status {
    n: u64,
    samples: u64,
    processes: u64,
    queued: u64,
    sent: u64,
    failed: u64,
    rejected: u64,
    dropped: u64,
    waiting: u64,
    /// What follows the counts (`(last error: ...)`, `; no Python process matches ...`).
    tail: String,
}

impl Status {
    fn parse(line: &str) -> Option<Status> {
        let rest = line.strip_prefix("pyperch agent: interval ")?;
        let (n, rest) = rest.split_once(": ")?;
        let (samples, rest) = rest.split_once(" samples from ")?;
        let (processes, rest) = rest.split_once(" processes, ")?;
        let (queued, rest) = rest.split_once(" profiles queued; sent ")?;
        let (sent, rest) = rest.split_once(", failed attempts ")?;
        let (failed, rest) = rest.split_once(", rejected ")?;
        let (rejected, rest) = rest.split_once(", dropped ")?;
        let (dropped, rest) = rest.split_once(", waiting ")?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        Some(Status {
            n: n.parse().ok()?,
            samples: samples.parse().ok()?,
            processes: processes.parse().ok()?,
            queued: queued.parse().ok()?,
            sent: sent.parse().ok()?,
            failed: failed.parse().ok()?,
            rejected: rejected.parse().ok()?,
            dropped: dropped.parse().ok()?,
            waiting: rest[..digits].parse().ok()?,
            tail: rest[digits..].to_string(),
        })
    }
}

/// An accepted upload, decoded.
#[derive(Debug)]
struct Upload {
    /// When the receiver got it (Unix seconds).
    t: f64,
    from: u64,
    until: u64,
    app: String,
    name_labels: BTreeMap<String, String>,
    entry: Value,
}

impl Upload {
    fn of(entry: &Value) -> Option<Upload> {
        let q = &entry["query"];
        let (app, name_labels) = parse_pyroscope_name(q["name"].as_str()?)?;
        Some(Upload {
            t: entry["t"].as_f64()?,
            from: q["from"].as_str()?.parse().ok()?,
            until: q["until"].as_str()?.parse().ok()?,
            app,
            name_labels,
            entry: entry.clone(),
        })
    }

    fn samples(&self) -> Vec<Value> {
        self.entry["profile"]["samples"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn total(&self) -> i64 {
        self.samples()
            .iter()
            .map(|s| s["values"][0].as_i64().unwrap_or(0))
            .sum()
    }

    fn pid(&self) -> Option<u32> {
        self.name_labels.get("process.pid")?.parse().ok()
    }

    fn brief(&self) -> String {
        format!(
            "{}{:?} from {} until {} ({} samples, received at {:.1})",
            self.app,
            self.name_labels,
            self.from,
            self.until,
            self.total(),
            self.t
        )
    }
}

/// The checks every accepted request passes, whatever the grouping: the ingest query, the
/// content type, a consistent pprof with the right types and period.
/// Every profile the receiver accepted, each request checked, and the diagnostics `d` with
/// a line per profile added.
fn accepted_uploads(receiver: &IngestReceiver, app: &str, d: &str) -> (Vec<Upload>, String) {
    let accepted: Vec<Upload> = receiver
        .accepted()
        .iter()
        .map(|e| {
            check_request(e, app, d);
            Upload::of(e).unwrap()
        })
        .collect();
    let listing: String = accepted.iter().map(|u| format!("\n    {}", u.brief())).collect();
    let d = format!("{d}\n--- accepted profiles:{listing}");
    (accepted, d)
}

fn check_request(entry: &Value, app: &str, d: &str) {
    let q = &entry["query"];
    assert_eq!(entry["path"], "/ingest", "path of {entry}{d}");
    assert_eq!(
        entry["content_type"], "application/octet-stream",
        "content type of {entry}{d}"
    );
    assert_eq!(q["format"], "pprof", "format of {entry}{d}");
    assert_eq!(q["spyName"], "pyperch", "spyName of {entry}{d}");
    assert_eq!(
        q["sampleRate"],
        RATE.to_string(),
        "sampleRate of {entry}{d}"
    );
    let up = Upload::of(entry)
        .unwrap_or_else(|| panic!("cannot read name/from/until of {}{d}", entry["query"]));
    assert_eq!(up.app, app, "application name of {}{d}", up.brief());
    assert!(
        up.from < up.until && up.until <= up.from + 4,
        "from/until of a 2 s interval: {}{d}",
        up.brief()
    );
    let p = &entry["profile"];
    assert_eq!(
        p["errors"],
        serde_json::json!([]),
        "inconsistent pprof {}{d}",
        up.brief()
    );
    assert_eq!(p["gzipped"], true, "the body is not gzip{d}");
    assert_eq!(
        p["sample_type"],
        serde_json::json!([["samples", "count"], ["cpu", "nanoseconds"]]),
        "sample_type{d}"
    );
    // Pyroscope takes `service_name` from the part of `name` before `{` (the app name) and
    // `__name__` from the sample types: neither may appear again among the labels.
    for reserved in ["service_name", "__name__"] {
        assert!(
            !up.name_labels.contains_key(reserved),
            "{reserved} repeated in the ingest name {}{d}",
            up.brief()
        );
    }
    let period = 1_000_000_000 / RATE as i64;
    for s in up.samples() {
        assert_eq!(
            s["values"][1].as_i64(),
            s["values"][0].as_i64().map(|n| n * period),
            "cpu/nanoseconds = samples × period in {s}{d}"
        );
    }
    assert_eq!(
        p["period_type"],
        serde_json::json!(["cpu", "nanoseconds"]),
        "period_type{d}"
    );
    assert_eq!(
        p["period"].as_i64(),
        Some(1_000_000_000 / RATE as i64),
        "period{d}"
    );
    assert!(
        up.total() > 0,
        "an empty profile was uploaded: {}{d}",
        up.brief()
    );
}

/// The samples of member `m` across `uploads`: labels right on every sample, stacks in its
/// own leaf (≥ 80 %) at lines of that function in its script, never in another leaf.
fn check_member_stacks(m: &Member, uploads: &[&Upload], d: &str) {
    let pid = m.proc.host_pid.to_string();
    let (first, last) = function_lines("spin.py", m.leaf).expect("spin.py has the leaf");
    let (mut total, mut in_leaf) = (0i64, 0i64);
    for up in uploads {
        for s in up.samples() {
            if s["labels"]["process.pid"] != pid.as_str() {
                continue;
            }
            let n = s["values"][0].as_i64().unwrap_or(0);
            total += n;
            let labels = s["labels"].as_object().unwrap();
            let get = |k: &str| labels.get(k).and_then(Value::as_str).map(str::to_string);
            assert_eq!(
                get("process.executable.name"),
                Some(m.proc.exe_name()),
                "process.executable.name of a sample of {}{d}",
                m.proc.describe()
            );
            assert_eq!(
                get("container.id"),
                m.container,
                "container.id of a sample of {}{d}",
                m.proc.describe()
            );
            assert_eq!(
                get("k8s.pod.uid"),
                m.pod,
                "k8s.pod.uid of a sample of {}{d}",
                m.proc.describe()
            );
            let stack = s["stack"].as_array().cloned().unwrap_or_default();
            let names: Vec<&str> = stack.iter().filter_map(|f| f[0].as_str()).collect();
            for other in LEAVES.iter().filter(|o| **o != m.leaf) {
                assert!(
                    !names.contains(other),
                    "{} has a stack in {other}, which it never runs: {names:?}{d}",
                    m.proc.describe()
                );
            }
            if names.first() == Some(&m.leaf) {
                in_leaf += n;
                let line = stack[0][2].as_i64().unwrap_or(0);
                assert!(
                    (first as i64..=last as i64).contains(&line),
                    "{}: {} at line {line}, outside {first}..={last}{d}",
                    m.proc.describe(),
                    m.leaf
                );
                assert_eq!(
                    stack[0][1].as_str(),
                    Some(m.proc.script_path().as_str()),
                    "{}: the leaf's file{d}",
                    m.proc.describe()
                );
                // Leaf first: the callers follow, `<module>` last.
                assert!(
                    names.len() >= 3 && names[1] == "main" && names[names.len() - 1] == "<module>",
                    "{}: stack not leaf first: {names:?}{d}",
                    m.proc.describe()
                );
            }
        }
    }
    assert!(total > 0, "no samples of {}{d}", m.proc.describe());
    assert!(
        in_leaf as f64 >= 0.8 * total as f64,
        "{}: {in_leaf} of {total} samples end in {}{d}",
        m.proc.describe(),
        m.leaf
    );
}

fn skip_without_receiver() -> Option<std::path::PathBuf> {
    match pprof_python() {
        Ok(p) => Some(p),
        Err(why) => {
            skip(format!("no ingest receiver: {why}"));
            None
        }
    }
}

#[test]
fn agent_survives_an_outage_and_flushes_on_sigterm() {
    const OUTAGE: f64 = 30.0;
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some(w) = Workloads::start(false) else {
        return;
    };
    let receiver = IngestReceiver::start(&python, OUTAGE).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("e2e-{}", random_hex(6));
    let url = receiver.url();
    let mut agent = Agent::start(&[
        "--upload-url",
        &url,
        "--interval",
        "2s",
        "--app-name",
        &app,
        "--queue-size",
        "4",
        "--cmdline",
        &w.token,
    ]);
    let mut max_hwm = 0u64;
    let mut rss_log: Vec<(f64, u64)> = Vec::new();
    let mut watch = |agent: &mut Agent, max_hwm: &mut u64| {
        if let Some(status) = agent.exited() {
            panic!(
                "pyperch agent exited ({}) while running{}\n--- processes:{}",
                describe_status(status),
                agent.diag(),
                w.summary()
            );
        }
        let pid = agent.pid();
        if let Some(h) = status_kb(pid, "VmHWM") {
            *max_hwm = (*max_hwm).max(h);
        }
        if let Some(r) = status_kb(pid, "VmRSS") {
            rss_log.push((now_unix(), r));
        }
        thread::sleep(Duration::from_millis(200));
    };

    // The outage: the receiver answers 503.
    while now_unix() < receiver.refuse_until + 0.5 {
        watch(&mut agent, &mut max_hwm);
    }
    let outage_statuses = agent.statuses_before(receiver.refuse_until);
    let diag = |agent: &Agent| format!("{}\n--- processes:{}", agent.diag(), w.summary());
    assert!(
        receiver
            .accepted()
            .iter()
            .all(|e| e["t"].as_f64().unwrap_or(0.0) >= receiver.refuse_until),
        "the receiver accepted profiles during its outage"
    );

    // The recovery: each workload's data from after the outage arrives (the next retry
    // may come up to 30 s later, or at the next interval's push).
    let recovered_from = receiver.refuse_until.floor() as u64;
    let deadline = Instant::now() + Duration::from_secs(45);
    let pids: BTreeSet<u32> = w.members.iter().map(|m| m.proc.host_pid).collect();
    loop {
        let fresh: BTreeSet<u32> = receiver
            .accepted()
            .iter()
            .filter_map(Upload::of)
            .filter(|u| u.from >= recovered_from)
            .filter_map(|u| u.pid())
            .collect();
        if pids.is_subset(&fresh) {
            break;
        }
        if Instant::now() > deadline {
            let got: Vec<String> = receiver
                .accepted()
                .iter()
                .filter_map(Upload::of)
                .map(|u| u.brief())
                .collect();
            let missing: Vec<String> = w
                .members
                .iter()
                .filter(|m| !fresh.contains(&m.proc.host_pid))
                .map(|m| m.proc.describe())
                .collect();
            panic!(
                "45 s after the outage, no profile from after the recovery (at {:.1}) has \
                 arrived for {missing:#?}; accepted: {got:#?}{}",
                receiver.refuse_until,
                diag(&agent)
            );
        }
        watch(&mut agent, &mut max_hwm);
    }

    // SIGTERM in the middle of an interval: 1 s after a status line (2 s intervals).
    let seen = agent.statuses().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.statuses().len() == seen {
        assert!(
            Instant::now() < deadline,
            "no status line for 10 s{}",
            diag(&agent)
        );
        watch(&mut agent, &mut max_hwm);
    }
    thread::sleep(Duration::from_millis(1000));
    let sigterm_at = now_unix();
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(15));
    let d = diag(&agent);
    let status =
        status.unwrap_or_else(|| panic!("pyperch agent did not exit within 15 s of SIGTERM{d}"));
    assert!(
        status.success(),
        "pyperch agent: {} after SIGTERM{d}",
        describe_status(status)
    );
    let lines = agent.lines();
    assert!(
        !lines.iter().any(|l| l.contains("panicked")),
        "pyperch agent panicked{d}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("pyperch agent: all profiles delivered"),
        "the last line after SIGTERM{d}"
    );

    // The loss is counted.
    let statuses = agent.statuses();
    assert!(statuses.len() >= 15, "too few status lines{d}");
    for (i, s) in statuses.iter().enumerate() {
        assert_eq!(s.n, i as u64 + 1, "status lines out of order{d}");
    }
    let last = statuses.last().unwrap();
    let during = outage_statuses
        .last()
        .cloned()
        .unwrap_or_else(|| last.clone());
    assert!(
        during.dropped > 0 && during.failed > 0 && during.sent == 0,
        "during the outage the status should count dropped profiles and failed attempts, with none sent: {during:?}{d}"
    );
    assert_eq!(
        last.rejected, 0,
        "a 503 is retried, never counted as a rejection{d}"
    );
    assert!(
        outage_statuses.iter().all(|s| s.waiting <= 4),
        "more than --queue-size 4 profiles waiting{d}"
    );
    assert!(
        outage_statuses
            .iter()
            .any(|s| s.tail.contains("last error") && s.tail.contains("503")),
        "no status line reports the 503 as the last error{d}"
    );
    let entries = receiver.entries();
    let refused = entries.iter().filter(|e| e["status"] == 503).count();
    assert!(refused > 0, "the agent never tried during the outage{d}");
    assert!(
        during.failed as usize <= refused,
        "{} failed attempts counted, but only {refused} requests were refused{d}",
        during.failed
    );
    let bad: Vec<&Value> = entries
        .iter()
        .filter(|e| e["status"] != 503 && e["status"] != 200)
        .collect();
    assert!(
        bad.is_empty(),
        "requests the receiver could not take: {bad:#?}{d}"
    );

    // Every accepted profile: request, labels, stacks.
    let (accepted, d) = accepted_uploads(&receiver, &app, &d);
    let queued_total: u64 = statuses.iter().map(|s| s.queued).sum();
    let slack = (accepted.len() as u64 + last.dropped).checked_sub(queued_total);
    assert!(
        matches!(slack, Some(0..=2)),
        "{} delivered + {} dropped should account for the {queued_total} profiles queued{d}",
        accepted.len(),
        last.dropped
    );
    for up in &accepted {
        let pid = up
            .pid()
            .unwrap_or_else(|| panic!("no process.pid in the name of {}{d}", up.brief()));
        let m = w
            .by_pid(pid)
            .unwrap_or_else(|| panic!("a profile of pid {pid}, which --cmdline excludes{d}"));
        let mut want = container_labels(m);
        want.insert("process.pid".to_string(), pid.to_string());
        want.insert("process.executable.name".to_string(), m.proc.exe_name());
        assert_eq!(
            up.name_labels,
            want,
            "labels in the name of {}{d}",
            up.brief()
        );
        for s in up.samples() {
            assert_eq!(
                s["labels"]["process.pid"],
                pid.to_string().as_str(),
                "a sample of another process in {}{d}",
                up.brief()
            );
        }
        // One single-threaded process: at most one CPU's worth of samples.
        let secs = (up.until - up.from + 1) as f64;
        assert!(
            up.total() as f64 <= RATE as f64 * secs * 1.1,
            "too many samples for one process in {}{d}",
            up.brief()
        );
    }
    for m in &w.members {
        let mine: Vec<&Upload> = accepted
            .iter()
            .filter(|u| u.pid() == Some(m.proc.host_pid))
            .collect();
        check_member_stacks(m, &mine, &d);
        // The partial interval flushed by SIGTERM: received after it, continuing the
        // previous interval, shorter than a full one.
        let mut by_from = mine.clone();
        by_from.sort_by_key(|u| u.from);
        let final_up = by_from.last().unwrap();
        assert!(
            final_up.t >= sigterm_at,
            "{}: nothing received after SIGTERM (its last profile: {}){d}",
            m.proc.describe(),
            final_up.brief()
        );
        let prev = by_from[by_from.len().saturating_sub(2)];
        assert_eq!(
            final_up.from,
            prev.until,
            "{}: the flushed interval does not continue the previous one{d}",
            m.proc.describe()
        );
        // SIGTERM came about 1 s into a 2 s interval.
        let nanos = |u: &Upload, k: &str| u.entry["profile"][k].as_i64().unwrap_or(0);
        let duration = nanos(final_up, "duration_nanos");
        assert!(
            (300_000_000..1_800_000_000).contains(&duration),
            "{}: the flushed interval lasted {duration} ns, not about 1 s: {}{d}",
            m.proc.describe(),
            final_up.brief()
        );
        let prev_end = nanos(prev, "time_nanos") + nanos(prev, "duration_nanos");
        assert!(
            (nanos(final_up, "time_nanos") - prev_end).abs() < 100_000_000,
            "{}: the flushed interval starts at {} ns, the previous one ended at {prev_end} ns{d}",
            m.proc.describe(),
            nanos(final_up, "time_nanos")
        );
    }

    // Sample counts: the last intervals' uploads add up to their status lines.
    let mut groups: BTreeMap<u64, Vec<&Upload>> = BTreeMap::new();
    for up in &accepted {
        groups.entry(up.from).or_default().push(up);
    }
    let groups: Vec<&Vec<&Upload>> = groups.values().collect();
    for k in 1..=3.min(groups.len()) {
        let g = groups[groups.len() - k];
        let s = &statuses[statuses.len() - k];
        let sum: i64 = g.iter().map(|u| u.total()).sum();
        assert_eq!(
            (sum as u64, g.len() as u64, g.len() as u64),
            (s.samples, s.processes, s.queued),
            "interval {}: (samples, processes, profiles) uploaded vs. its status line {s:?}{d}",
            s.n
        );
    }

    // Bounded memory.
    assert!(max_hwm > 0, "could not read the agent's VmHWM{d}");
    assert!(
        max_hwm < MAX_HWM_KB,
        "the agent's peak RSS {} MB is over {} MB{d}",
        max_hwm / 1024,
        MAX_HWM_KB / 1024
    );
    let rss_at = |t: f64| {
        rss_log
            .iter()
            .find(|(at, _)| *at >= t)
            .map(|(_, r)| *r)
            .unwrap_or(0)
    };
    let early = rss_at(receiver.refuse_until - OUTAGE + 10.0);
    let late = rss_at(receiver.refuse_until - 0.5);
    note(format!(
        "{} uploads accepted, {} refused; dropped {}; peak RSS {} MB; RSS 10 s into the outage {} MB, at its end {} MB",
        accepted.len(),
        refused,
        last.dropped,
        max_hwm / 1024,
        early / 1024,
        late / 1024
    ));
    assert!(
        late <= early + 32 * 1024,
        "the agent's RSS grew from {} MB to {} MB during the outage{d}",
        early / 1024,
        late / 1024
    );
    drop(w);
}

#[test]
fn agent_one_profile_per_container() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some(w) = Workloads::start(true) else {
        return;
    };
    one_profile_per_container(&python, &w);
}

/// The same with free-threaded 3.14 processes (issue #30: the agent and containers on a
/// 3.14t; skipped, saying so, where `PYPERCH_FT_PYTHON` is unset): each in its own PID and
/// mount namespaces (on the host's root: the interpreter is built by hand) and a container's
/// cgroup, one profile per container with its labels, every stack its own.
#[test]
fn agent_one_profile_per_container_ft_3_14() {
    let Some(python) = skip_without_receiver() else { return };
    let Some(py) = pyperch_tests::python(FT_3_14) else { return };
    let cgroups = match Cgroups::new() {
        Ok(c) => c,
        Err(why) => return skip(format!("cannot create cgroups: {why}")),
    };
    let w = Workloads::start_on(py, cgroups, true);
    one_profile_per_container(&python, &w);
}

fn one_profile_per_container(python: &std::path::Path, w: &Workloads) {
    let receiver = IngestReceiver::start(python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("e2e-{}", random_hex(6));
    let url = receiver.url();
    let mut agent = Agent::start(&[
        "--upload-url",
        &url,
        "--interval",
        "2s",
        "--duration",
        "5s",
        "--per",
        "container",
        "--app-name",
        &app,
        "--cmdline",
        &w.token,
    ]);
    let status = agent.wait_exit(Duration::from_secs(40));
    let d = format!("{}\n--- processes:{}", agent.diag(), w.summary());
    let status = status.unwrap_or_else(|| panic!("pyperch agent --duration 5s did not exit{d}"));
    assert!(
        status.success(),
        "pyperch agent: {}{d}",
        describe_status(status)
    );
    assert_eq!(
        agent.lines().last().map(String::as_str),
        Some("pyperch agent: all profiles delivered"),
        "the last line{d}"
    );
    let (accepted, d) = accepted_uploads(&receiver, &app, &d);
    // Expected groups: each container (with its pod), and `host` (no labels).
    let mut seen = BTreeSet::new();
    for up in &accepted {
        let group: Vec<&Member> = w
            .members
            .iter()
            .filter(|m| m.container == up.name_labels.get("container.id").cloned())
            .collect();
        assert_eq!(
            group.len(),
            1,
            "a profile of no known group: {}{d}",
            up.brief()
        );
        let m = group[0];
        let want = container_labels(m);
        assert_eq!(
            up.name_labels,
            want,
            "labels in the name of {}{d}",
            up.brief()
        );
        for s in up.samples() {
            assert_eq!(
                s["labels"]["process.pid"],
                m.proc.host_pid.to_string().as_str(),
                "{}: a sample of another process{d}",
                up.brief()
            );
        }
        seen.insert(m.proc.host_pid);
    }
    for m in &w.members {
        assert!(
            seen.contains(&m.proc.host_pid),
            "no profile for the group of {}{d}",
            m.proc.describe()
        );
        let mine: Vec<&Upload> = accepted
            .iter()
            .filter(|u| u.name_labels.get("container.id") == m.container.as_ref())
            .collect();
        check_member_stacks(m, &mine, &d);
    }
}

#[test]
fn agent_filter_matching_nothing_says_so() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    // A Python process that the filter does not match.
    let Some(py) = first_python(&["sid-3.14", "3.12", "3.11", "3.13", "3.10", "3.9", "3.8"]) else {
        return;
    };
    let mut bystander =
        Workload::spawn(&py, "spin.py", &["leaf_red", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let receiver = IngestReceiver::start(&python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let url = receiver.url();
    let pattern = format!("no-such-{}", random_hex(8));
    let mut agent = Agent::start(&[
        "--upload-url",
        &url,
        "--interval",
        "1s",
        "--duration",
        "3s",
        "--cmdline",
        &pattern,
    ]);
    let status = agent.wait_exit(Duration::from_secs(30));
    bystander.terminate();
    let d = agent.diag();
    let status = status.unwrap_or_else(|| panic!("pyperch agent --duration 3s did not exit{d}"));
    assert!(
        status.code().is_some(),
        "pyperch agent died from a signal{d}"
    );
    let statuses = agent.statuses();
    assert!(!statuses.is_empty(), "no status lines{d}");
    let message = format!("no Python process matches --cmdline {pattern}");
    for s in &statuses {
        assert!(
            s.tail.contains(&message),
            "interval {} does not say `{message}`{d}",
            s.n
        );
        assert_eq!(s.samples, 0, "samples although nothing matches{d}");
    }
    assert!(
        receiver.accepted().is_empty(),
        "profiles were uploaded although nothing matches{d}"
    );
}

#[test]
fn agent_sigterm_during_an_outage_reports_what_was_not_delivered() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some(py) = first_python(&["sid-3.14", "3.12", "3.11", "3.13", "3.10", "3.9", "3.8"]) else {
        return;
    };
    let tag = format!("e2e{}", random_hex(10));
    let mut spinner = Workload::spawn(&py, "spin.py", &["leaf_red", "60", &tag])
        .unwrap_or_else(|e| panic!("{e:#}"));
    // Down for longer than the test: nothing can be delivered.
    let receiver = IngestReceiver::start(&python, 120.0).unwrap_or_else(|e| panic!("{e:#}"));
    let url = receiver.url();
    let mut agent = Agent::start(&["--upload-url", &url, "--interval", "1s", "--cmdline", &tag]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.statuses().len() < 3 {
        assert!(
            Instant::now() < deadline && agent.exited().is_none(),
            "no 3 status lines within 20 s{}",
            agent.diag()
        );
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(Duration::from_millis(500));
    let sigterm = Instant::now();
    agent.signal(libc::SIGTERM);
    // 10 s to drain the queue, then out.
    let status = agent.wait_exit(Duration::from_secs(20));
    let took = sigterm.elapsed();
    spinner.terminate();
    let d = agent.diag();
    let status =
        status.unwrap_or_else(|| panic!("pyperch agent did not exit within 20 s of SIGTERM{d}"));
    assert!(
        status.success(),
        "pyperch agent: {}{d}",
        describe_status(status)
    );
    assert!(
        took < Duration::from_secs(15),
        "pyperch agent took {:.1} s to exit after SIGTERM (it should give up after 10 s){d}",
        took.as_secs_f64()
    );
    let last = agent.lines().last().cloned().unwrap_or_default();
    let unsent: u64 = last
        .strip_prefix("pyperch agent: ")
        .and_then(|r| r.strip_suffix(" profiles could not be delivered before exit"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!("the last line should say how many profiles were not delivered{d}")
        });
    let statuses = agent.statuses();
    let queued: u64 = statuses.iter().map(|s| s.queued).sum();
    let dropped = statuses.last().map_or(0, |s| s.dropped);
    assert_eq!(
        unsent + dropped,
        queued,
        "undelivered {unsent} + dropped {dropped} should be all {queued} profiles queued{d}"
    );
    assert!(unsent > 0, "nothing left to deliver?{d}");
    assert!(
        receiver.accepted().is_empty(),
        "the receiver accepted something during its outage{d}"
    );
}

// ---------------------------------------------------------------------------------------
// Network faults: misbehaving endpoints (tests/fixtures/faulty_ingest.py), an IPv6 literal,
// credentials in the URL.
// ---------------------------------------------------------------------------------------

/// The agent's overall deadline for one upload attempt (see profiler-user/src/export/upload/http.rs).
const UPLOAD_DEADLINE: Duration = Duration::from_secs(10);
/// The agent's grace for draining its queue at exit (see docs/agent.md).
const FINAL_DRAIN: Duration = Duration::from_secs(10);

/// A Python server fixture that prints `port N ...` first and logs one JSON line per
/// request; stopped on drop.
struct FixtureServer {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl FixtureServer {
    /// `python SCRIPT ARGS...`, where `{log}` in `args` stands for the log file.
    fn start(python: &std::path::Path, script: &str, args: &[&str]) -> FixtureServer {
        let dir = std::env::temp_dir()
            .join("pyperch-tests")
            .join(format!("net-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("requests.jsonl");
        let log_text = log.display().to_string();
        let mut cmd = Command::new(python);
        cmd.arg(fixture_path(script)).args(args.iter().map(|a| a.replace("{log}", &log_text)));
        let (child, port) = spawn_fixture_server(&mut cmd, &format!("{script} {args:?}"));
        FixtureServer {
            child,
            port,
            log,
            dir,
        }
    }

    /// The misbehaving endpoint on 127.0.0.1 in `mode` (see faulty_ingest.py).
    fn faulty(python: &std::path::Path, mode: &[&str]) -> FixtureServer {
        let mut args = vec!["--log", "{log}", "--lifetime", "120"];
        args.extend_from_slice(mode);
        FixtureServer::start(python, "faulty_ingest.py", &args)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request logged so far.
    fn entries(&self) -> Vec<Value> {
        json_lines(&self.log)
    }
}

impl Drop for FixtureServer {
    fn drop(&mut self) {
        stop_child(&mut self.child, libc::SIGTERM, Duration::from_secs(3));
        if !thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A spinning Python process with a unique command-line tag, for `--cmdline TAG`.
fn tagged_spinner() -> Option<(Workload, String)> {
    let py = first_python(&["sid-3.14", "3.12", "3.11", "3.13", "3.10", "3.9", "3.8"])?;
    let tag = format!("e2e{}", random_hex(10));
    let w = Workload::spawn(&py, "spin.py", &["leaf_red", "60", &tag])
        .unwrap_or_else(|e| panic!("{e:#}"));
    Some((w, tag))
}

/// Waits (up to `timeout`) for a status line that satisfies `pred`; panics with `what`.
fn wait_status(
    agent: &mut Agent,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&Status) -> bool,
) -> Status {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = agent.statuses().into_iter().find(|s| pred(s)) {
            return s;
        }
        assert!(
            Instant::now() < deadline && agent.exited().is_none(),
            "no status line with {what} within {:.0} s{}",
            timeout.as_secs_f64(),
            agent.diag()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// No line of the agent holds an escape or other control character, and none is long.
fn assert_clean_lines(agent: &Agent) {
    for l in agent.lines() {
        assert!(
            !l.contains(|c: char| c.is_control()),
            "a control character reached the agent's stderr: {l:?}"
        );
        assert!(
            l.len() < 1500,
            "an agent line of {} bytes: {l:.300}...",
            l.len()
        );
    }
}

/// The `  uploads: ...` line of `--stats`: (sent, failed attempts, rejected, dropped, unsent).
fn stats_uploads(agent: &Agent) -> Option<(u64, u64, u64, u64, u64)> {
    let lines = agent.lines();
    let rest = lines
        .iter()
        .find_map(|l| l.trim_start().strip_prefix("uploads: sent "))?;
    let (sent, rest) = rest.split_once(", failed attempts ")?;
    let (failed, rest) = rest.split_once(", rejected ")?;
    let (rejected, rest) = rest.split_once(", dropped ")?;
    let (dropped, rest) = rest.split_once(" (")?;
    let (unsent, _) = rest.split_once(" of them not delivered at exit)")?;
    Some((
        sent.parse().ok()?,
        failed.parse().ok()?,
        rejected.parse().ok()?,
        dropped.parse().ok()?,
        unsent.parse().ok()?,
    ))
}

#[test]
fn agent_sigterm_while_the_server_is_silent_exits_within_grace() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some((mut spinner, tag)) = tagged_spinner() else {
        return;
    };
    // Accepts connections and reads requests, never answers.
    let server = FixtureServer::faulty(&python, &["silent"]);
    let url = server.url();
    let mut agent = Agent::start(&[
        "--upload-url",
        &url,
        "--interval",
        "1s",
        "--cmdline",
        &tag,
        "--stats",
    ]);
    // The first attempt gives up at the upload deadline: a counted failure, and the
    // status says why.
    let failed = wait_status(
        &mut agent,
        UPLOAD_DEADLINE + Duration::from_secs(15),
        "a failed attempt",
        |s| s.failed > 0,
    );
    assert!(
        failed.tail.contains("no complete answer within 10 s"),
        "the last error should be the deadline: {failed:?}{}",
        agent.diag()
    );
    // A second attempt is under way (the backoff after the first is 0.5 s): SIGTERM now.
    thread::sleep(Duration::from_millis(1500));
    let sigterm = Instant::now();
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(FINAL_DRAIN + Duration::from_secs(15));
    let took = sigterm.elapsed();
    spinner.terminate();
    let d = agent.diag();
    let status = status.unwrap_or_else(|| {
        panic!("pyperch agent did not exit within 25 s of SIGTERM (silent server){d}")
    });
    assert!(
        status.success(),
        "pyperch agent: {}{d}",
        describe_status(status)
    );
    // The grace (10 s) plus the final flush; a request in flight must not extend it.
    assert!(
        took < FINAL_DRAIN + Duration::from_secs(4),
        "pyperch agent took {:.1} s to exit after SIGTERM (grace 10 s){d}",
        took.as_secs_f64()
    );
    let (sent, failed_attempts, rejected, dropped, unsent) =
        stats_uploads(&agent).unwrap_or_else(|| panic!("no `uploads:` line in --stats{d}"));
    assert_eq!((sent, rejected), (0, 0), "nothing can be sent or rejected{d}");
    assert!(failed_attempts >= 1, "failed attempts not counted{d}");
    assert!(unsent >= 1, "profiles were waiting at exit{d}");
    assert!(dropped >= unsent, "undelivered profiles are counted as dropped{d}");
    assert!(
        agent
            .lines()
            .iter()
            .any(|l| l == &format!("pyperch agent: {unsent} profiles could not be delivered before exit")),
        "the agent should say how many profiles were not delivered{d}"
    );
    let requests = server.entries().len() as u64;
    assert!(
        requests >= failed_attempts,
        "{requests} requests reached the server, but {failed_attempts} failed attempts were counted{d}"
    );
    assert_clean_lines(&agent);
}

#[test]
fn agent_drops_profiles_the_endpoint_rejects() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some((mut spinner, tag)) = tagged_spinner() else {
        return;
    };
    // 400 to everything, with escape sequences and 5000 bytes in the body.
    let server = FixtureServer::faulty(&python, &["status", "400"]);
    let url = server.url();
    let mut agent = Agent::start(&[
        "--upload-url",
        &url,
        "--interval",
        "1s",
        "--duration",
        "4s",
        "--cmdline",
        &tag,
        "--stats",
    ]);
    let status = agent.wait_exit(Duration::from_secs(30));
    spinner.terminate();
    let d = agent.diag();
    let status = status.unwrap_or_else(|| panic!("pyperch agent --duration 4s did not exit{d}"));
    assert!(
        status.success(),
        "pyperch agent: {}{d}",
        describe_status(status)
    );
    let statuses = agent.statuses();
    let queued: u64 = statuses.iter().map(|s| s.queued).sum();
    assert!(queued >= 3, "too few profiles made in 4 s{d}");
    let (sent, failed, rejected, dropped, unsent) =
        stats_uploads(&agent).unwrap_or_else(|| panic!("no `uploads:` line in --stats{d}"));
    // Every profile had exactly one try, was refused and dropped: never retried, never
    // blocking the ones after it.
    assert_eq!(
        (sent, failed, rejected, dropped, unsent),
        (0, 0, queued, 0, 0),
        "(sent, failed, rejected, dropped, unsent) of {queued} profiles{d}"
    );
    let entries = server.entries();
    assert_eq!(
        entries.len() as u64,
        queued,
        "one request per profile, no retry{d}"
    );
    let intervals: BTreeSet<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["query"]["from"].as_str().unwrap_or("").to_string(),
                e["query"]["until"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        intervals.len() as u64,
        queued,
        "the same profile was sent twice{d}"
    );
    assert!(
        statuses.windows(2).all(|w| w[0].rejected <= w[1].rejected)
            && statuses.iter().any(|s| s.rejected > 0 && s.tail
                .contains("rejected the profile with 400, not retried: [31mrefused [0m ]0;title xxx")),
        "the status lines should count rejections and show the escaped answer{d}"
    );
    assert_eq!(
        agent.lines().iter().find(|l| l.starts_with("pyperch agent: queue drained")).map(String::as_str),
        Some(format!("pyperch agent: queue drained; {queued} profiles were rejected by the ingest endpoint").as_str()),
        "{d}"
    );
    assert_clean_lines(&agent);
}

#[test]
fn agent_does_not_follow_redirects() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some((mut spinner, tag)) = tagged_spinner() else {
        return;
    };
    // A working receiver, and an endpoint that redirects there.
    let receiver = IngestReceiver::start(&python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let target = format!("{}/ingest", receiver.url());
    let server = FixtureServer::faulty(&python, &["redirect", &target]);
    let url = server.url();
    let mut agent = Agent::start(&["--upload-url", &url, "--interval", "1s", "--cmdline", &tag]);
    let failing = wait_status(&mut agent, Duration::from_secs(20), "2 failed attempts", |s| {
        s.failed >= 2
    });
    spinner.terminate();
    let d = agent.diag();
    assert!(
        failing.tail.contains(&format!(
            "answered 302 (a redirect to {target}), which is not followed"
        )),
        "the status should say the redirect was not followed: {failing:?}{d}"
    );
    assert_eq!(failing.sent, 0, "{d}");
    assert_eq!(failing.rejected, 0, "{d}");
    assert!(
        server.entries().len() as u64 >= failing.failed,
        "attempts counted that never reached the server{d}"
    );
    assert!(
        receiver.entries().is_empty(),
        "the redirect target got requests: {:?}{d}",
        receiver.entries()
    );
    assert_clean_lines(&agent);
}

#[test]
fn agent_uploads_to_an_ipv6_literal() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    if let Err(e) = std::net::TcpListener::bind("[::1]:0") {
        skip(format!("no IPv6 loopback on this machine ([::1]: {e})"));
        return;
    }
    let Some((mut spinner, tag)) = tagged_spinner() else {
        return;
    };
    let receiver = FixtureServer::start(
        &python,
        "ingest_receiver.py",
        &["serve", "--log", "{log}", "--host", "::1"],
    );
    let url = format!("http://[::1]:{}", receiver.port);
    let app = format!("e2e-{}", random_hex(6));
    let mut agent = Agent::start(&[
        "--upload-url",
        &url,
        "--app-name",
        &app,
        "--interval",
        "1s",
        "--duration",
        "3s",
        "--cmdline",
        &tag,
    ]);
    let status = agent.wait_exit(Duration::from_secs(30));
    spinner.terminate();
    let d = agent.diag();
    let status = status.unwrap_or_else(|| panic!("pyperch agent --duration 3s did not exit{d}"));
    assert!(
        status.success(),
        "pyperch agent: {}{d}",
        describe_status(status)
    );
    assert_eq!(
        agent.lines().last().map(String::as_str),
        Some("pyperch agent: all profiles delivered"),
        "{d}"
    );
    let accepted: Vec<Value> = receiver
        .entries()
        .into_iter()
        .filter(|e| e["status"] == 200)
        .collect();
    assert!(!accepted.is_empty(), "no profile arrived over IPv6{d}");
    let queued: u64 = agent.statuses().iter().map(|s| s.queued).sum();
    assert_eq!(accepted.len() as u64, queued, "profiles lost{d}");
    for e in &accepted {
        check_request(e, &app, &d);
        let up = Upload::of(e).unwrap();
        assert_eq!(
            up.name_labels.get("process.pid"),
            Some(&spinner.pid.to_string()),
            "{}{d}",
            up.brief()
        );
    }
}

#[test]
fn agent_memory_stays_bounded_against_an_endless_answer() {
    let Some(python) = skip_without_receiver() else {
        return;
    };
    let Some((mut spinner, tag)) = tagged_spinner() else {
        return;
    };
    // 503 and then body bytes (escape sequences among them) until the agent hangs up.
    let server = FixtureServer::faulty(&python, &["endless"]);
    let url = server.url();
    let mut agent = Agent::start(&["--upload-url", &url, "--interval", "1s", "--cmdline", &tag]);
    let pid = agent.pid();
    let mut max_hwm = 0;
    let deadline = Instant::now() + Duration::from_secs(25);
    // Attempts at about 1, 1.5, 2.5, 4.5 s: each cut short, far before the 10 s deadline.
    while agent.statuses().last().is_none_or(|s| s.failed < 3) {
        assert!(
            Instant::now() < deadline && agent.exited().is_none(),
            "no 3 failed attempts within 25 s: the agent hangs on the endless answer?{}",
            agent.diag()
        );
        max_hwm = max_hwm.max(status_kb(pid, "VmHWM").unwrap_or(0));
        thread::sleep(Duration::from_millis(100));
    }
    max_hwm = max_hwm.max(status_kb(pid, "VmHWM").unwrap_or(0));
    spinner.terminate();
    let d = agent.diag();
    let last = agent.statuses().last().cloned().unwrap();
    assert!(
        last.tail.contains("the ingest endpoint answered 503: [2J ]0;pwned AAAA") && last.tail.contains("..."),
        "the last error should show the escaped, cut answer: {last:?}{d}"
    );
    assert!(max_hwm > 0, "could not read the agent's VmHWM{d}");
    assert!(
        max_hwm < ENDLESS_MAX_HWM_KB,
        "the agent's peak RSS {} MB is over {} MB{d}",
        max_hwm / 1024,
        ENDLESS_MAX_HWM_KB / 1024
    );
    eprintln!("agent peak RSS against the endless answer: {} MB", max_hwm / 1024);
    assert_clean_lines(&agent);
}

/// The agent's peak RSS while an endpoint streams an endless answer (kB).
const ENDLESS_MAX_HWM_KB: u64 = 150 * 1024;

#[test]
fn agent_refuses_credentials_in_the_url() {
    let secret = format!("pw{}", random_hex(8));
    let url = format!("http://user:{secret}@127.0.0.1:9/");
    let mut agent = Agent::start(&["--upload-url", &url, "--interval", "1s"]);
    let status = agent.wait_exit(Duration::from_secs(10));
    let d = agent.diag().replace(&secret, "<secret>");
    let status = status.unwrap_or_else(|| panic!("pyperch agent did not exit{d}"));
    assert!(
        !status.success() && status.code().is_some(),
        "pyperch agent: {}{d}",
        describe_status(status)
    );
    let lines = agent.lines();
    assert_eq!(lines.len(), 1, "one sentence expected{d}");
    assert!(
        lines[0].contains("the upload URL must not contain a user name or password"),
        "{d}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(&secret)),
        "the password was printed{d}"
    );
}

/// `--mode wall`: a wait longer than the interval is charged to the profiles of the periods
/// it falls in, not all to the one in which it ends. long_wait.py sleeps 5 s in one call
/// (measured with `time.time`) while the agent writes a profile every second: each profile
/// that lies inside the sleep holds about one period of `long_sleep` time (at least 90 % of
/// its duration, never more than it), and all profiles together hold the measured sleep within
/// 2 %, so nothing is counted twice. The profiles' sample types are wall/nanoseconds.
#[test]
fn agent_wall_mode_charges_each_wait_to_its_interval() {
    const SLEEP: f64 = 5.0;
    let Some(python) = skip_without_receiver() else { return };
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"]) else {
        skip("no Python interpreter is available");
        return;
    };
    let w = Workload::spawn(&py, "long_wait.py", &["{dir}/result.json", &SLEEP.to_string(), "{dir}/go"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let receiver = IngestReceiver::start(&python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("e2e-{}", random_hex(6));
    let url = receiver.url();
    let pid = w.pid.to_string();
    let rate = RATE.to_string();
    let mut agent = Agent::start(&[
        "--upload-url", &url, "--interval", "1s", "--app-name", &app, "--mode", "wall", "--pid", &pid, "--rate", &rate,
    ]);
    // The process is registered before the scheduler-switch program is attached, and this
    // line follows both: the sleep that starts after it is watched from its beginning.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !agent.lines().iter().any(|l| l.starts_with("pyperch agent: sampling at")) {
        assert!(Instant::now() < deadline && agent.exited().is_none(), "the agent did not start{}", agent.diag());
        thread::sleep(Duration::from_millis(50));
    }
    fs::write(w.dir.host_path("go"), b"go").expect("cannot write the go file");
    let result = w.dir.host_path("result.json");
    let measured: Value = loop {
        if let Ok(v) = serde_json::from_str(&fs::read_to_string(&result).unwrap_or_default()) {
            break v;
        }
        assert!(Instant::now() < deadline && agent.exited().is_none(), "long_wait.py wrote no result{}", agent.diag());
        thread::sleep(Duration::from_millis(100));
    };
    // Two more profiles, then the agent flushes and exits.
    thread::sleep(Duration::from_millis(2500));
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(30)).is_some(), "the agent did not exit{}", agent.diag());
    let (start, end) = (measured["start"].as_f64().unwrap_or(0.0), measured["end"].as_f64().unwrap_or(0.0));
    let slept_ns = (end - start) * 1e9;
    let mut d = format!("{}\n--- measured sleep {start:.3} .. {end:.3}\n--- profiles (start, duration s, long_sleep s):", agent.diag());
    let mut rows = Vec::new();
    for entry in receiver.accepted() {
        let p = &entry["profile"];
        assert_eq!(p["errors"], serde_json::json!([]), "inconsistent pprof{d}");
        assert_eq!(p["sample_type"], serde_json::json!([["samples", "count"], ["wall", "nanoseconds"]]), "sample_type{d}");
        let from = p["time_nanos"].as_f64().unwrap_or(0.0) / 1e9;
        let duration = p["duration_nanos"].as_f64().unwrap_or(0.0) / 1e9;
        let asleep: i64 = p["samples"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["stack"].as_array().into_iter().flatten().any(|f| f[0] == "long_sleep"))
            .map(|s| s["values"][1].as_i64().unwrap_or(0))
            .sum();
        d.push_str(&format!("\n    {from:.3} {duration:.3} {:.3}", asleep as f64 / 1e9));
        rows.push((from, duration, asleep as f64));
    }
    let total: f64 = rows.iter().map(|r| r.2).sum();
    let error = 100.0 * (total - slept_ns).abs() / slept_ns;
    note(format!("long_sleep: {:.4} s in {} profiles, measured {:.4} s ({error:.2} % off)", total / 1e9, rows.len(), slept_ns / 1e9));
    assert!(error <= 2.0, "long_sleep: {:.4} s profiled in all, {:.4} s measured{d}", total / 1e9, slept_ns / 1e9);
    let mut inside = 0;
    for &(from, duration, asleep) in &rows {
        assert!(asleep <= duration * 1e9 * 1.02 + 2e6, "a profile of {duration:.3} s holds {:.3} s of long_sleep{d}", asleep / 1e9);
        // Profiles that lie inside the sleep (with 50 ms of margin for the clocks' reads).
        if from >= start + 0.05 && from + duration <= end - 0.05 {
            inside += 1;
            assert!(asleep >= duration * 1e9 * 0.9, "a profile inside the sleep holds only {:.3} of its {duration:.3} s{d}", asleep / 1e9);
        }
    }
    assert!(inside >= 2, "only {inside} profiles lie inside the sleep{d}");
    drop(w);
}

/// Waits are a profile in the agent too (issue #26): two threads asleep since before the
/// agent started never switch while it runs, yet every interval's profile holds their whole
/// wait (charged from a stack read from memory, interval by interval), not only the end.
#[test]
fn agent_wall_mode_charges_threads_asleep_since_before_it_started() {
    let Some(python) = skip_without_receiver() else { return };
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"]) else {
        skip("no Python interpreter is available");
        return;
    };
    let w = Workload::spawn(&py, "sleepers.py", &["2", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let receiver = IngestReceiver::start(&python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("e2e-{}", random_hex(6));
    let (url, pid, rate) = (receiver.url(), w.pid.to_string(), RATE.to_string());
    let mut agent = Agent::start(&["--upload-url", &url, "--interval", "1s", "--app-name", &app, "--mode", "wall", "--pid", &pid, "--rate", &rate]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while agent.lines().iter().filter(|l| l.starts_with("pyperch agent: interval")).count() < 4 {
        assert!(Instant::now() < deadline && agent.exited().is_none(), "the agent did not report 4 intervals{}", agent.diag());
        thread::sleep(Duration::from_millis(100));
    }
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(30)).is_some(), "the agent did not exit{}", agent.diag());
    let mut d = format!("{}\n--- profiles (duration s, wait_here s, main_sleep s):", agent.diag());
    let mut full = 0;
    for entry in receiver.accepted() {
        let p = &entry["profile"];
        assert_eq!(p["errors"], serde_json::json!([]), "inconsistent pprof{d}");
        let duration = p["duration_nanos"].as_f64().unwrap_or(0.0) / 1e9;
        let ns_in = |name: &str| -> f64 {
            p["samples"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["stack"].as_array().into_iter().flatten().any(|f| f[0] == name))
                .map(|s| s["values"][1].as_f64().unwrap_or(0.0))
                .sum::<f64>()
                / 1e9
        };
        let (workers, main) = (ns_in("wait_here"), ns_in("main_sleep"));
        d.push_str(&format!("\n    {duration:.3} {workers:.3} {main:.3}"));
        // Never more than the interval's time per thread.
        assert!(workers <= 2.0 * duration * 1.05 + 0.01 && main <= duration * 1.05 + 0.01, "a profile holds more wait than its time{d}");
        if duration > 0.5 && workers >= 2.0 * duration * 0.9 && main >= duration * 0.9 {
            full += 1;
        }
    }
    assert!(full >= 2, "only {full} profiles hold the sleepers' whole wait{d}");
    drop(w);
}

/// The task frames of every accepted upload's samples: (stack of function names root first,
/// value of the profile's last sample type).
fn uploaded_stacks(receiver: &IngestReceiver) -> Vec<(Vec<String>, i64)> {
    let mut out = Vec::new();
    for entry in receiver.accepted() {
        let p = &entry["profile"];
        for s in p["samples"].as_array().into_iter().flatten() {
            // The receiver lists a sample's frames leaf first, as pprof does.
            let mut names: Vec<String> =
                s["stack"].as_array().into_iter().flatten().filter_map(|f| f[0].as_str().map(str::to_string)).collect();
            names.reverse();
            let values = s["values"].as_array().cloned().unwrap_or_default();
            out.push((names, values.last().and_then(Value::as_i64).unwrap_or(0)));
        }
    }
    out
}

/// `agent --async` (issue #27, item 5): uploaded profiles carry task frames. Task C runs
/// CPU-bound code awaited by task B, awaited by task A (tests/workloads/asyncio_tasks.py
/// chain mode, CPython 3.14): its samples arrive as
/// `task A; a_coro; task B; b_coro; task C; c_coro; c_work` (SHAPE of `--async`).
/// With `--mode wall`, the suspended tasks A and B are charged where they wait too.
fn agent_async(label: &str, mode: &str) {
    let Some(receiver_python) = skip_without_receiver() else { return };
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "asyncio_tasks.py", &["chain", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let receiver = IngestReceiver::start(&receiver_python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("e2e-{}", random_hex(6));
    let (url, pid) = (receiver.url(), w.pid.to_string());
    let mut agent = Agent::start(&[
        "--upload-url", &url, "--interval", "1s", "--app-name", &app, "--pid", &pid, "--rate", "199", "--async", "--mode", mode,
    ]);
    let deadline = Instant::now() + Duration::from_secs(90);
    while agent.lines().iter().filter(|l| l.starts_with("pyperch agent: interval")).count() < 4 {
        assert!(Instant::now() < deadline && agent.exited().is_none(), "the agent did not report 4 intervals{}", agent.diag());
        thread::sleep(Duration::from_millis(100));
    }
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(30)).is_some(), "the agent did not exit{}", agent.diag());
    w.terminate();
    let stacks = uploaded_stacks(&receiver);
    let mut d = agent.diag();
    d.push_str("\n--- uploaded stacks:");
    for (names, value) in stacks.iter().take(40) {
        d.push_str(&format!("\n    {value} {}", names.join(";")));
    }
    // On-CPU time only: an off-CPU interval of the thread running task C (preempted) has no
    // running task recorded by the kernel, and keeps its plain stack (counted in --stats).
    let on_cpu = |n: &Vec<String>| !n.last().is_some_and(|f| f.starts_with("<off-cpu"));
    let with_c: Vec<&(Vec<String>, i64)> =
        stacks.iter().filter(|(n, _)| on_cpu(n) && n.iter().any(|f| f == "c_work")).collect();
    assert!(!with_c.is_empty(), "no uploaded sample in c_work{d}");
    let chained: i64 = with_c
        .iter()
        .filter(|(n, _)| n.windows(7).any(|w| w == ["task A", "a_coro", "task B", "b_coro", "task C", "c_coro", "c_work"]))
        .map(|(_, v)| v)
        .sum();
    let all: i64 = with_c.iter().map(|(_, v)| v).sum();
    note(format!("{}: agent --async --mode {mode}: {chained} of {all} in c_work uploaded with the task chain", py.describe()));
    assert!(chained * 10 >= all * 9, "only {chained} of {all} uploaded in c_work carry task A; a_coro; task B; b_coro; task C{d}");
    if mode == "wall" {
        // A waits in a_coro for B, B in b_coro for C: each charged about the whole time.
        for (task, coro) in [("task B", "b_coro"), ("task A", "a_coro")] {
            let waited: i64 = stacks
                .iter()
                .filter(|(n, _)| n.last().map(String::as_str) == Some("<task waiting>"))
                .filter(|(n, _)| n.iter().rposition(|f| f.starts_with("task ")).is_some_and(|i| n[i] == task && n.get(i + 1).map(String::as_str) == Some(coro)))
                .map(|(_, v)| v)
                .sum();
            assert!(waited > 1_000_000_000, "{task} is charged only {waited} ns of waiting in {coro}{d}");
        }
    }
}

#[test]
fn agent_async_uploads_task_frames_sid_3_14() {
    agent_async("sid-3.14", "cpu");
}

#[test]
fn agent_async_wall_uploads_task_waits_sid_3_14() {
    agent_async("sid-3.14", "wall");
}

/// The same on a free-threaded 3.14 (issue #30; skipped, saying so, where
/// `PYPERCH_FT_PYTHON` is unset).
#[test]
fn agent_async_uploads_task_frames_ft_3_14() {
    agent_async(FT_3_14, "cpu");
}

/// `agent --async` on a Python too old for task stacks (3.12): the agent profiles it as it
/// is (plain stacks uploaded) and says so in one warning line naming the process, where
/// `record --async --pid` refuses it (tests/tests/asyncio.rs).
#[test]
fn agent_async_says_which_processes_keep_plain_stacks() {
    let Some(receiver_python) = skip_without_receiver() else { return };
    let Some(py) = first_python(&["3.12", "3.13", "3.11"]) else { return };
    let mut w = Workload::spawn(&py, "asyncio_tasks.py", &["chain", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let receiver = IngestReceiver::start(&receiver_python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("e2e-{}", random_hex(6));
    let (url, pid) = (receiver.url(), w.pid.to_string());
    let mut agent = Agent::start(&["--upload-url", &url, "--interval", "1s", "--duration", "3s", "--app-name", &app, "--pid", &pid, "--async"]);
    let status = agent.wait_exit(Duration::from_secs(40));
    w.terminate();
    let d = agent.diag();
    assert!(status.is_some_and(|s| s.success()), "the agent failed{d}");
    let warning = format!("pyperch: warning: process {pid} (");
    let lines: Vec<String> = agent.lines().into_iter().filter(|l| l.starts_with(&warning)).collect();
    note(format!("{}: {lines:?}", py.describe()));
    assert_eq!(lines.len(), 1, "one warning line for the process{d}");
    assert!(lines[0].contains("keeps plain stacks under --async") && lines[0].contains("3.14 or later"), "{d}");
    let stacks = uploaded_stacks(&receiver);
    assert!(stacks.iter().any(|(n, _)| n.iter().any(|f| f == "c_work")), "no plain stack with c_work uploaded{d}");
}
