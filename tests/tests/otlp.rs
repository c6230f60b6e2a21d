//! OpenTelemetry profiles, read back by an independent implementation: the PyPI
//! `opentelemetry-proto` package's `ExportProfilesServiceRequest` (schema v1development),
//! through tests/fixtures/otlp_receiver.py in the test virtualenv (`cargo xtask test`
//! installs the pinned release).
//!
//! - `record --format otlp --threads` of threads.py: one resource for the process with the
//!   semantic-convention attributes, each spinning thread's samples under its own function,
//!   `thread.id` and `thread.name` (the OS name the workload gave the thread), the total equal to pyperch's own count of samples, sane tables.
//! - `agent --otlp-endpoint` to the fixture's OTLP/HTTP receiver: every interval's request
//!   arrives at `/v1development/profiles` as `application/x-protobuf`, decodes, and holds
//!   exactly the samples the agent's status lines announced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pyperch_tests::*;
use serde_json::Value;

const SPINNERS: [&str; 4] = ["spin_alpha", "spin_beta", "spin_gamma", "spin_delta"];

/// The test venv's python when it can import the OTLP profiles classes; else prints SKIP.
fn otlp_python() -> Option<PathBuf> {
    let python = test_venv().join("bin/python");
    let importable = Command::new(&python)
        .args(["-c", "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        skip(format!(
            "{} cannot import opentelemetry-proto's profiles classes (`cargo xtask test` installs them from PyPI; was PyPI reachable?)",
            python.display()
        ));
        return None;
    }
    Some(python)
}

/// `otlp_receiver.py decode FILE`.
fn decode(python: &Path, file: &Path) -> Value {
    let out = Command::new(python)
        .arg(fixture_path("otlp_receiver.py"))
        .arg("decode")
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run otlp_receiver.py");
    assert!(
        out.status.success(),
        "opentelemetry-proto could not decode {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("otlp_receiver.py printed JSON")
}

/// This host's node name, as pyperch reports it in `host.name`.
fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string()
}

/// `(K ok)` of `pyperch: recorded X s: N samples (K ok) from ...`.
fn ok_samples(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find(|l| l.starts_with("pyperch: recorded "))?
        .split_once(" samples (")?
        .1
        .split_once(" ok)")?
        .0
        .parse()
        .ok()
}

/// Every sample of a decoded request: (resource attributes, sample).
fn samples(request: &Value) -> Vec<(&Value, &Value)> {
    let mut out = Vec::new();
    for r in request["resources"].as_array().into_iter().flatten() {
        for p in r["profiles"].as_array().into_iter().flatten() {
            for s in p["samples"].as_array().into_iter().flatten() {
                out.push((&r["attributes"], s));
            }
        }
    }
    out
}

fn value(sample: &Value) -> u64 {
    sample["values"][0].as_u64().unwrap_or(0)
}

/// The leaf function of a decoded sample.
fn leaf(sample: &Value) -> &str {
    sample["stack"][0][0].as_str().unwrap_or("")
}

/// Checks one decoded profile's types and the request's invariants.
fn check_shape(request: &Value, rate: u64, d: &str) {
    assert_eq!(request["errors"], serde_json::json!([]), "schema invariants broken{d}");
    for r in request["resources"].as_array().into_iter().flatten() {
        assert_eq!(r["scope"][0], "pyperch", "scope of {r}{d}");
        for p in r["profiles"].as_array().into_iter().flatten() {
            assert_eq!(p["sample_type"], serde_json::json!(["samples", "count"]), "{d}");
            assert_eq!(p["period_type"], serde_json::json!(["cpu", "nanoseconds"]), "{d}");
            assert_eq!(p["period"].as_u64(), Some(1_000_000_000 / rate), "{d}");
            assert!(p["time_unix_nano"].as_u64().unwrap_or(0) > 1_600_000_000_000_000_000, "time of {p}{d}");
            assert!(p["duration_nano"].as_u64().unwrap_or(0) > 0, "duration{d}");
            // How it was recorded, as the profile's attributes (issue #26).
            let a = &p["attributes"];
            assert_eq!(a["pyperch.mode"], "cpu", "profile attributes {a}{d}");
            assert_eq!(a["pyperch.rate_hz"], rate.to_string(), "profile attributes {a}{d}");
            for key in ["pyperch.version", "pyperch.duration_s", "pyperch.samples.dropped", "pyperch.samples.lost"] {
                assert!(a[key].is_string(), "no {key} in the profile attributes {a}{d}");
            }
        }
    }
}

fn record_otlp(label: &str) {
    let Some(decoder) = otlp_python() else { return };
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "threads.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let native: BTreeMap<String, u64> =
        w.ready_fields().into_iter().filter_map(|(k, v)| Some((k, v.parse().ok()?))).collect();
    let dir = std::env::temp_dir().join("pyperch-tests").join(format!("otlp-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profile.otlp.pb");
    let pid = w.pid.to_string();
    let run = pyperch(
        &["record", "--pid", &pid, "--duration", "4", "--rate", "199", "--threads", "--output", file.to_str().unwrap()],
        Duration::from_secs(90),
    );
    w.terminate();
    let d = format!("{}\n--- native thread ids of the workload: {native:?}", run.diag());
    assert!(run.success(), "pyperch record --format otlp failed{d}");
    let request = decode(&decoder, &file);
    let d = format!("{d}\n--- decoded request: {request}");
    check_shape(&request, 199, &d);
    // `record` has no CPU budget unless asked (`--max-cpu`): no effective rate is claimed.
    for r in request["resources"].as_array().into_iter().flatten() {
        for p in r["profiles"].as_array().into_iter().flatten() {
            assert!(p["attributes"].get("pyperch.max_cpu_percent").is_none(), "a budget without --max-cpu{d}");
        }
    }

    // One resource: the workload, with the semantic conventions' attributes.
    let resources = request["resources"].as_array().cloned().unwrap_or_default();
    assert_eq!(resources.len(), 1, "resources{d}");
    let attrs = &resources[0]["attributes"];
    assert_eq!(attrs["process.pid"].as_u64(), Some(u64::from(w.pid)), "process.pid is an int{d}");
    let exe = std::fs::read_link(format!("/proc/{}/exe", w.pid)).ok();
    let exe_name = exe.as_ref().and_then(|e| e.file_name()).map(|n| n.to_string_lossy().into_owned());
    if let Some(exe_name) = exe_name {
        assert_eq!(attrs["process.executable.name"].as_str(), Some(exe_name.as_str()), "{d}");
    }
    assert_eq!(attrs["process.runtime.name"], "CPython", "{d}");
    assert!(
        attrs["process.runtime.version"].as_str().is_some_and(|v| v.starts_with(label)),
        "runtime version{d}"
    );
    assert_eq!(attrs["host.name"].as_str(), Some(node_name().as_str()), "{d}");
    assert!(attrs.get("service.name").is_none(), "record has no service name{d}");

    // Counts: the request holds every sample pyperch counted, no more.
    let all = samples(&request);
    let total: u64 = all.iter().map(|(_, s)| value(s)).sum();
    let ok = ok_samples(&run.stderr).unwrap_or_else(|| panic!("no `pyperch: recorded` line{d}"));
    assert_eq!(total, ok, "OTLP samples vs pyperch's count{d}");
    assert!(total > 100, "too few samples{d}");

    // Stacks and thread ids: each spinner's samples carry its own native thread id, and its
    // stack runs from the spinner to threading's bootstrap.
    for (_, s) in &all {
        assert!(s["attributes"]["thread.id"].is_u64(), "thread.id of {s}{d}");
        let stack = s["stack"].as_array().unwrap();
        assert!(!stack.is_empty(), "{s}{d}");
    }
    for name in SPINNERS {
        let tid = native.get(name).copied().unwrap_or_else(|| panic!("no tid of {name}{d}"));
        let of_thread: Vec<_> = all.iter().filter(|(_, s)| s["attributes"]["thread.id"].as_u64() == Some(tid)).collect();
        let n: u64 = of_thread.iter().map(|(_, s)| value(s)).sum();
        assert!(n > 0, "no samples of {name} (tid {tid}){d}");
        // threads.py names each thread after its function (prctl) before it says ready.
        for (_, s) in &of_thread {
            assert_eq!(s["attributes"]["thread.name"].as_str(), Some(name), "thread.name of tid {tid}: {s}{d}");
        }
        let in_leaf: u64 = of_thread.iter().filter(|(_, s)| leaf(s) == name).map(|(_, s)| value(s)).sum();
        assert!(in_leaf * 10 >= n * 9, "{name}: {in_leaf} of {n} samples end in it{d}");
        for (_, s) in of_thread.iter().filter(|(_, s)| leaf(s) == name) {
            let top = &s["stack"][0];
            assert!(top[1].as_str().is_some_and(|f| f.ends_with("threads.py")), "file of {name}: {top}{d}");
            if let Some((first, last)) = function_lines("threads.py", name) {
                let line = top[2].as_u64().unwrap_or(0);
                assert!(
                    (u64::from(first)..=u64::from(last)).contains(&line),
                    "{name} at line {line}, outside {first}..={last}{d}"
                );
            }
            let frames: Vec<_> = s["stack"].as_array().unwrap().iter().filter_map(|f| f[0].as_str()).collect();
            assert!(frames.iter().any(|f| f.contains("_bootstrap")), "{name}'s stack {frames:?}{d}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn otlp_record_3_12() {
    record_otlp("3.12");
}

#[test]
fn otlp_record_3_9() {
    record_otlp("3.9");
}

/// otlp_receiver.py `serve`; stopped on drop.
struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Receiver {
    fn start(python: &Path) -> Receiver {
        let dir = std::env::temp_dir().join("pyperch-tests").join(format!("otlp-net-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("requests.jsonl");
        let mut cmd = Command::new(python);
        cmd.arg(fixture_path("otlp_receiver.py")).args(["serve", "--log"]).arg(&log);
        let (child, port) = spawn_fixture_server(&mut cmd, "otlp_receiver.py");
        Receiver { child, port, log }
    }

    fn entries(&self) -> Vec<Value> {
        json_lines(&self.log)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        stop_child(&mut self.child, libc::SIGTERM, Duration::from_secs(3));
        if !std::thread::panicking() {
            if let Some(dir) = self.log.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// `X` of every `pyperch agent: interval N: X samples from ...` line.
fn interval_samples(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("pyperch agent: interval ")?.split_once(": ")?.1.split_once(" samples from ")?.0.parse().ok())
        .collect()
}

#[test]
fn otlp_agent_posts_requests() {
    let Some(decoder) = otlp_python() else { return };
    let Some(py) = first_python(&["3.12", "3.13", "3.11"]) else { return };
    let receiver = Receiver::start(&decoder);
    let mut w = Workload::spawn(&py, "spin.py", &["leaf_red", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let app = format!("e2e-otlp-{}", random_hex(6));
    let url = format!("http://127.0.0.1:{}", receiver.port);
    let run = pyperch(
        &[
            "agent", "--otlp-endpoint", &url, "--pid", &pid, "--interval", "2s", "--duration", "7s", "--rate", "99",
            "--app-name", &app, "--stats",
        ],
        Duration::from_secs(90),
    );
    w.terminate();
    let entries = receiver.entries();
    let listing: String = entries
        .iter()
        .map(|e| format!("\n    {} {} {} bytes -> {}", e["path"], e["content_type"], e["body_bytes"], e["status"]))
        .collect();
    let d = format!("{}\n--- requests received:{listing}", run.diag());
    assert!(run.success(), "pyperch agent failed{d}");
    assert!(run.stderr.lines().any(|l| l == "pyperch agent: all OTLP requests delivered"), "{d}");

    let announced = interval_samples(&run.stderr);
    let intervals_with_samples = announced.iter().filter(|n| **n > 0).count();
    assert!(intervals_with_samples >= 3, "intervals {announced:?}{d}");
    assert_eq!(entries.len(), intervals_with_samples, "one request per interval with samples{d}");
    let mut total = 0;
    for e in &entries {
        assert_eq!(e["path"], "/v1development/profiles", "{d}");
        assert_eq!(e["query"], "", "{d}");
        assert_eq!(e["content_type"], "application/x-protobuf", "{d}");
        assert_eq!(e["status"], 200, "{e}{d}");
        let request = &e["request"];
        check_shape(request, 99, &format!("{d}\n--- request: {request}"));
        for r in request["resources"].as_array().into_iter().flatten() {
            // The agent's CPU budget (on by default, issue #33) and the interval's effective
            // rate, as the profile's attributes.
            for p in r["profiles"].as_array().into_iter().flatten() {
                let a = &p["attributes"];
                assert_eq!(a["pyperch.max_cpu_percent"], "2", "the agent's default budget in {a}{d}");
                for key in ["pyperch.rate_hz.effective.min", "pyperch.rate_hz.effective.mean", "pyperch.rate_hz.effective.last"] {
                    let hz: f64 = a[key].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {key} in {a}{d}"));
                    assert!((1.0..=99.0).contains(&hz), "{key} {hz} outside 1-99 Hz{d}");
                }
            }
            let attrs = &r["attributes"];
            assert_eq!(attrs["process.pid"].as_u64(), Some(u64::from(w.pid)), "{r}{d}");
            assert_eq!(attrs["service.name"].as_str(), Some(app.as_str()), "{r}{d}");
            assert_eq!(attrs["host.name"].as_str(), Some(node_name().as_str()), "{r}{d}");
        }
        let all = samples(request);
        let n: u64 = all.iter().map(|(_, s)| value(s)).sum();
        let in_leaf: u64 = all.iter().filter(|(_, s)| leaf(s) == "leaf_red").map(|(_, s)| value(s)).sum();
        assert!(in_leaf * 10 >= n * 9, "{in_leaf} of {n} samples in leaf_red{d}");
        assert!(all.iter().all(|(_, s)| s["attributes"] == serde_json::json!({})), "thread.id without --threads{d}");
        total += n;
    }
    assert_eq!(total, announced.iter().sum::<u64>(), "samples received vs announced {announced:?}{d}");
    let stats = run.stderr.lines().find(|l| l.trim_start().starts_with("otlp uploads: sent "));
    assert!(
        stats.is_some_and(|l| l.trim_start().starts_with(&format!("otlp uploads: sent {}, failed attempts 0, rejected 0, dropped 0", entries.len()))),
        "--stats upload line {stats:?}{d}"
    );
}

#[test]
fn otlp_agent_needs_a_destination() {
    let run = pyperch(&["agent", "--duration", "1s"], Duration::from_secs(30));
    assert!(!run.success(), "{}", run.diag());
    assert!(run.stderr.contains("--upload-url"), "{}", run.diag());
    let run = pyperch(&["agent", "--otlp-endpoint", "ftp://collector:4318"], Duration::from_secs(30));
    assert!(!run.success(), "{}", run.diag());
    run.assert_clear_error();
    assert!(run.stderr.contains("--otlp-endpoint"), "{}", run.diag());
}

/// `agent --native --kernel`: every interval's profile carries the native frames in place
/// (libz under the Python function that called zlib.compress), through the OTLP receiver.
#[test]
fn otlp_agent_native_frames() {
    let Some(decoder) = otlp_python() else { return };
    let Some(py) = first_python(&["3.12", "3.13"]) else { return };
    let receiver = Receiver::start(&decoder);
    let mut w = Workload::spawn(&py, "native.py", &["zlib", "{dir}/out.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let url = format!("http://127.0.0.1:{}", receiver.port);
    let run = pyperch(
        &[
            "agent", "--otlp-endpoint", &url, "--pid", &pid, "--interval", "2s", "--duration", "7s", "--rate", "199",
            "--native", "--kernel", "--stats",
        ],
        Duration::from_secs(90),
    );
    w.terminate();
    let entries = receiver.entries();
    let d = format!("{}\n--- {} requests received", run.diag(), entries.len());
    assert!(run.success(), "pyperch agent failed{d}");
    assert!(entries.len() >= 3, "{d}");
    let (mut zlib, mut placed) = (0, 0);
    for e in &entries {
        let request = &e["request"];
        check_shape(request, 199, &format!("{d}\n--- request: {request}"));
        for (_, s) in samples(request) {
            let frames = s["stack"].as_array().cloned().unwrap_or_default();
            let function = |f: &Value| f[0].as_str().unwrap_or("").to_string();
            let file = |f: &Value| f[1].as_str().unwrap_or("").to_string();
            // Leaf first: the first Python frame (with a .py file) from the leaf.
            let Some(python) = frames.iter().position(|f| file(f).ends_with(".py")) else { continue };
            if function(&frames[python]) != "zlib_caller" {
                continue;
            }
            zlib += value(s);
            if frames[..python].iter().any(|f| file(f).starts_with("libz.so")) {
                placed += value(s);
            }
        }
    }
    note(format!("agent --native: libz under zlib_caller in {placed} of {zlib} samples"));
    assert!(zlib >= 50, "only {zlib} samples ending in zlib_caller{d}");
    assert!(placed * 10 >= zlib * 8, "libz frames under zlib_caller in only {placed} of {zlib} samples{d}");
}
