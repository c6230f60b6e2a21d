//! Every pprof pyperch writes, read by a third-party reader: `go tool pprof -raw` (Go from
//! Debian's `golang-go`, installed by `cargo xtask test`; without it the tests SKIP).
//!
//! `record --format pprof` of a spinning interpreter: Go's reader reports the sample types
//! `samples/count` and `cpu/nanoseconds`, the period type `cpu nanoseconds` with the period
//! 10⁹/rate, the workload's functions with their full file paths, and totals equal to
//! pyperch's own count of the samples it kept (the `ok` line of `--stats`), and that count
//! × period for `cpu/nanoseconds`; with `--threads`, every sample's `thread.id` and
//! `thread.name` labels (the main thread's OS name, from /proc). The agent's uploads (also
//! with `--threads`) carry the same labels.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use pyperch_tests::*;

/// The sampling rate of the recordings (Hz).
const RATE: u64 = 97;

/// `go`, or `None` after a SKIP message.
fn go() -> Option<PathBuf> {
    let go = find_program("go");
    if go.is_none() {
        skip("go is not installed (`cargo xtask test` installs Debian's golang-go)");
    }
    go
}

/// What `go tool pprof -raw` printed about one profile.
#[derive(Debug, Default)]
struct Raw {
    /// The header of the `Samples:` section, e.g. `["samples/count", "cpu/nanoseconds"]`.
    sample_types: Vec<String>,
    /// `PeriodType:` (e.g. `cpu nanoseconds`).
    period_type: String,
    /// `Period:`.
    period: u64,
    /// Per sample type, the sum of its values over all samples.
    totals: Vec<u64>,
    /// How many samples it printed.
    samples: usize,
    /// Each sample's labels line (`key:[value] key:[value]`, sorted by key), as printed.
    labels: Vec<String>,
    /// The `Locations` section's lines.
    locations: Vec<String>,
}

/// Runs `go tool pprof -raw FILE` and parses what it prints; `Err` with its output when it
/// fails.
fn go_pprof_raw(go: &Path, file: &Path) -> Result<(Raw, String), String> {
    let scratch = std::env::temp_dir()
        .join("pyperch-tests")
        .join(format!("go-{}", random_hex(8)));
    let _ = std::fs::create_dir_all(&scratch);
    let out = Command::new(go)
        .args(["tool", "pprof", "-raw"])
        .arg(file)
        .env("HOME", &scratch)
        .env("GOCACHE", scratch.join("cache"))
        .env("PPROF_TMPDIR", &scratch)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {} tool pprof: {e}", go.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!(
        "--- go tool pprof -raw {} ({}):\n{text}\n--- its stderr:\n{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(all);
    }
    let mut raw = Raw::default();
    #[derive(PartialEq)]
    enum Section {
        Header,
        Samples,
        Locations,
        Other,
    }
    let mut section = Section::Header;
    let mut header_seen = false;
    for line in text.lines() {
        let trimmed = line.trim();
        match trimmed {
            "Samples:" => {
                section = Section::Samples;
                continue;
            }
            "Locations" => {
                section = Section::Locations;
                continue;
            }
            "Mappings" => {
                section = Section::Other;
                continue;
            }
            _ => {}
        }
        match section {
            Section::Header => {
                if let Some(v) = trimmed.strip_prefix("PeriodType:") {
                    raw.period_type = v.trim().to_string();
                } else if let Some(v) = trimmed.strip_prefix("Period:") {
                    raw.period = v.trim().parse().unwrap_or(0);
                }
            }
            Section::Samples => {
                if !header_seen {
                    raw.sample_types = trimmed.split_whitespace().map(str::to_string).collect();
                    raw.totals = vec![0; raw.sample_types.len()];
                    header_seen = true;
                    continue;
                }
                // `  v1  v2: loc loc ...`; label lines (`key:[value]`) have no leading number.
                let Some((values, _)) = trimmed.split_once(':') else {
                    continue;
                };
                let values: Vec<u64> = match values
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                {
                    Ok(v) => v,
                    Err(_) => {
                        if trimmed.contains(":[") {
                            raw.labels.push(trimmed.to_string());
                        }
                        continue;
                    }
                };
                raw.samples += 1;
                if values.len() == raw.totals.len() {
                    for (t, v) in raw.totals.iter_mut().zip(values) {
                        *t += v;
                    }
                }
            }
            Section::Locations => raw.locations.push(trimmed.to_string()),
            Section::Other => {}
        }
    }
    Ok((raw, all))
}

/// The OS name of `pid`'s main thread (`/proc/PID/task/PID/comm`), read while it runs.
fn main_thread_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// With `--threads`, every sample of the single-threaded workload `pid` carries the labels
/// `thread.id` (its pid) and `thread.name` (`comm`, its main thread's OS name), as Go's reader
/// prints them (`key:[value]`, sorted by key).
fn check_thread_labels(raw: &Raw, pid: u32, comm: &str, d: &str) {
    assert!(!comm.is_empty(), "no name of the workload's main thread{d}");
    let want = format!("thread.id:[{pid}] thread.name:[{comm}]");
    assert_eq!(raw.labels.len(), raw.samples, "one labels line per sample{d}");
    assert!(raw.samples > 0, "no samples{d}");
    for line in &raw.labels {
        assert!(line.contains(&want), "labels {line:?} lack {want:?}{d}");
    }
}

/// The count of the `ok` line of the whole-run part of a `--stats` report.
fn stats_ok(stderr: &str) -> Option<u64> {
    let mut lines = stderr
        .lines()
        .skip_while(|l| !l.contains("pyperch statistics (whole run):"));
    lines.next()?;
    lines.map(str::trim).find_map(|l| {
        l.strip_prefix("ok ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn pprof_readers_go_tool_pprof_reads_record() {
    let Some(go) = go() else { return };
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "sid-3.14", "3.10", "3.9", "3.8"]) else {
        return;
    };
    let mut w =
        Workload::spawn(&py, "spin.py", &["leaf_red", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let dir = std::env::temp_dir()
        .join("pyperch-tests")
        .join(format!("pprof-readers-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("profile.pb.gz");
    let pid = w.pid.to_string();
    let rate = RATE.to_string();
    let run = pyperch(
        &[
            "record",
            "--pid",
            &pid,
            "--duration",
            "3",
            "--rate",
            &rate,
            "--stats",
            "--threads",
            "--format",
            "pprof",
            "--output",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(90),
    );
    let comm = main_thread_name(w.pid);
    w.terminate();
    let d = run.diag();
    assert!(run.success(), "pyperch record failed{d}");
    let kept =
        stats_ok(&run.stderr).unwrap_or_else(|| panic!("no `ok` count in the --stats report{d}"));
    assert!(
        kept > 0,
        "pyperch kept no sample of the spinning workload{d}"
    );

    let (raw, printed) = go_pprof_raw(&go, &out)
        .unwrap_or_else(|all| panic!("go tool pprof cannot read the file{d}\n{all}"));
    let d = format!("{d}\n{printed}");
    assert_eq!(
        raw.sample_types,
        ["samples/count", "cpu/nanoseconds"],
        "sample types{d}"
    );
    assert_eq!(raw.period_type, "cpu nanoseconds", "period type{d}");
    let period = 1_000_000_000 / RATE;
    assert_eq!(raw.period, period, "period{d}");
    assert_eq!(
        raw.totals,
        [kept, kept * period],
        "totals (samples, cpu ns) against pyperch's {kept} kept samples{d}"
    );
    check_thread_labels(&raw, w.pid, &comm, &d);
    // The profile says how it was recorded (issue #26): `go tool pprof -comments`.
    let comments = Command::new(&go).args(["tool", "pprof", "-comments"]).arg(&out).output().expect("cannot run go tool pprof");
    let comments = String::from_utf8_lossy(&comments.stdout);
    for want in ["pyperch.mode=cpu".to_string(), format!("pyperch.rate_hz={RATE}"), "pyperch.samples.lost=0".to_string()] {
        assert!(comments.lines().any(|l| l.trim() == want), "go tool pprof -comments does not list {want}: {comments}{d}");
    }
    assert!(comments.contains("pyperch.version=") && comments.contains("pyperch.duration_s=3."), "comments: {comments}{d}");

    let script = w.dir.guest_path("spin.py");
    for function in ["leaf_red", "<module>"] {
        let wanted = format!(" {function} {script}:");
        assert!(
            raw.locations.iter().any(|l| l.contains(&wanted)),
            "no location of `{function}` in {script} (full path){d}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sample counts of the agent's `interval N: S samples from ...` status lines.
fn interval_samples(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("pyperch agent: interval ")?;
            let (_, rest) = rest.split_once(": ")?;
            rest.split_once(" samples from ")?.0.parse().ok()
        })
        .collect()
}

#[test]
fn pprof_readers_go_tool_pprof_reads_agent_uploads() {
    let Some(go) = go() else { return };
    let python = match pprof_python() {
        Ok(p) => p,
        Err(why) => {
            skip(format!("no ingest receiver: {why}"));
            return;
        }
    };
    let Some(py) = first_python(&["3.12", "3.11", "3.13", "sid-3.14", "3.10", "3.9", "3.8"]) else {
        return;
    };
    let mut w =
        Workload::spawn(&py, "spin.py", &["leaf_red", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let receiver = IngestReceiver::start(&python, 0.0).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let rate = RATE.to_string();
    let url = receiver.url();
    let run = pyperch(
        &[
            "agent",
            "--upload-url",
            &url,
            "--app-name",
            "readers",
            "--pid",
            &pid,
            "--rate",
            &rate,
            "--interval",
            "1s",
            "--duration",
            "3s",
            "--threads",
        ],
        Duration::from_secs(90),
    );
    let comm = main_thread_name(w.pid);
    w.terminate();
    let d = run.diag();
    assert!(run.success(), "pyperch agent failed{d}");
    let kept: u64 = interval_samples(&run.stderr).iter().sum();
    assert!(
        kept > 0,
        "the agent kept no sample of the spinning workload{d}"
    );
    let accepted = receiver.accepted();
    assert!(!accepted.is_empty(), "the receiver accepted nothing{d}");

    let period = 1_000_000_000 / RATE;
    let script = w.dir.guest_path("spin.py");
    let mut total = [0u64; 2];
    let mut d = d;
    for entry in &accepted {
        let file = PathBuf::from(
            entry["body_file"]
                .as_str()
                .unwrap_or_else(|| panic!("no body_file in {entry}{d}")),
        );
        let (raw, printed) = go_pprof_raw(&go, &file)
            .unwrap_or_else(|all| panic!("go tool pprof cannot read an upload{d}\n{all}"));
        d = format!("{d}\n--- query {}\n{printed}", entry["query"]);
        assert_eq!(
            raw.sample_types,
            ["samples/count", "cpu/nanoseconds"],
            "sample types{d}"
        );
        assert_eq!(raw.period_type, "cpu nanoseconds", "period type{d}");
        assert_eq!(raw.period, period, "period{d}");
        assert_eq!(
            raw.totals[1],
            raw.totals[0] * period,
            "cpu ns = samples × period{d}"
        );
        check_thread_labels(&raw, w.pid, &comm, &d);
        assert!(
            raw.locations
                .iter()
                .any(|l| l.contains(&format!(" leaf_red {script}:"))),
            "no location of leaf_red in {script}{d}"
        );
        let (app, labels) = parse_pyroscope_name(entry["query"]["name"].as_str().unwrap_or(""))
            .unwrap_or_else(|| panic!("unreadable ingest name{d}"));
        assert_eq!(app, "readers", "service name (the part before `{{`){d}");
        assert_eq!(
            labels.get("process.pid"),
            Some(&pid),
            "process.pid of the upload{d}"
        );
        total[0] += raw.totals[0];
        total[1] += raw.totals[1];
    }
    assert_eq!(
        total,
        [kept, kept * period],
        "uploaded totals against the agent's {kept} samples{d}"
    );
}
