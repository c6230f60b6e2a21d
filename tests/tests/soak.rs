//! Soak: `pyperch agent --interval 1s` against code objects with unique 4 KiB names created
//! continuously (~100 a second) and processes churning (one short-lived interpreter started
//! every ~100 ms, each with its own 4 KiB-named function), uploading to a local receiver
//! (one profile per interval: `--per container`, all of them being host processes).
//! The agent's resident memory (VmRSS) is read every second; after a warm-up (the first
//! half), its growth is fitted by least squares and must stay under `MAX_GROWTH_MIB_PER_HOUR`,
//! and its peak (VmHWM) under `PEAK_BUDGET_MIB`. The measured numbers are printed.
//!
//! Runs `PYPERCH_SOAK_SECONDS` (default 75 s, the CI run); `cargo xtask soak -- --minutes N`
//! runs it longer. Needs the test virtualenv for the receiver (SKIP without it).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use pyperch_tests::*;

/// The documented peak budget (docs/safety.md, "Memory").
const PEAK_BUDGET_MIB: f64 = 256.0;
/// Growth allowed after warm-up. A short run's fit is noisy (allocator steps), so the bound
/// is generous; the long run's measured figure is what docs/safety.md states.
const MAX_GROWTH_MIB_PER_HOUR: f64 = 64.0;
const DEFAULT_SECONDS: u64 = 75;

fn soak_seconds() -> u64 {
    std::env::var("PYPERCH_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s >= 20)
        .unwrap_or(DEFAULT_SECONDS)
}

/// Least-squares slope of `points` (x, y).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

#[test]
fn soak_agent_memory_stays_flat() {
    let Some(receiver_python) = pprof_python()
        .map_err(|why| skip(format!("no ingest receiver: {why}")))
        .ok()
    else {
        return;
    };
    let Some(py) = first_python(&["3.12", "3.13", "3.11", "3.10", "3.9", "3.8"]) else {
        return;
    };
    let seconds = soak_seconds();
    let workload_seconds = (seconds + 60).to_string();
    let mut workloads: Vec<Workload> = ["names", "churn"]
        .iter()
        .map(|mode| {
            Workload::spawn(&py, "soak.py", &[mode, &workload_seconds])
                .unwrap_or_else(|e| panic!("{e:#}"))
        })
        .collect();
    let receiver = IngestReceiver::start_brief(&receiver_python).unwrap_or_else(|e| panic!("{e:#}"));
    let app = format!("soak-{}", random_hex(6));
    let args: Vec<String> = [
        "agent",
        "--upload-url",
        &receiver.url(),
        "--interval",
        "1s",
        "--rate",
        "199",
        "--duration",
        &format!("{seconds}s"),
        "--app-name",
        &app,
        "--per",
        "container",
        "--cmdline",
        r"soak\.py",
        "--stats",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut child = Command::new(pyperch_bin())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start pyperch agent");
    let pid = child.id();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let stderr = child.stderr.take().unwrap();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });

    // (seconds since start, RSS in MiB), every second while the agent runs.
    let start = Instant::now();
    let mut rss: Vec<(f64, f64)> = Vec::new();
    let mut peak_kb = 0;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if let Some(kb) = status_kb(pid, "VmRSS") {
            rss.push((start.elapsed().as_secs_f64(), kb as f64 / 1024.0));
        }
        peak_kb = status_kb(pid, "VmHWM").unwrap_or(0).max(peak_kb);
        if start.elapsed() > Duration::from_secs(seconds + 60) {
            stop_child(&mut child, libc::SIGKILL, Duration::from_secs(5));
            break None;
        }
        thread::sleep(Duration::from_secs(1));
    };
    let _ = reader.join();
    for w in &mut workloads {
        w.terminate();
    }
    let lines = lines.lock().unwrap().clone();
    let tail: String = lines[lines.len().saturating_sub(60)..]
        .iter()
        .map(|l| format!("\n    {l}"))
        .collect();
    let d = format!("\n--- command: {} {}\n--- stderr (last 60 lines):{tail}", pyperch_bin().display(), args.join(" "));
    let status = status.unwrap_or_else(|| panic!("the agent did not exit after --duration {seconds}s{d}"));
    assert!(status.success(), "the agent failed: {}{d}", describe_status(status));

    let accepted = receiver.accepted();
    let samples: i64 = accepted.iter().map(|e| e["profile"]["sample_total"].as_i64().unwrap_or(0)).sum();
    let longest = accepted.iter().map(|e| e["profile"]["longest_name"].as_u64().unwrap_or(0)).max().unwrap_or(0);
    let errors: Vec<&serde_json::Value> = accepted
        .iter()
        .filter(|e| e["profile"]["errors"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    assert!(errors.is_empty(), "malformed profiles: {errors:?}{d}");
    assert!(samples > 0, "the receiver got no samples ({} profiles){d}", accepted.len());
    assert!(longest >= 4096, "no 4 KiB name arrived whole (longest {longest}){d}");

    let second_half: Vec<(f64, f64)> = rss.iter().copied().filter(|(t, _)| *t >= seconds as f64 / 2.0).collect();
    assert!(second_half.len() >= 5, "too few RSS readings: {rss:?}{d}");
    let growth = slope(&second_half) * 3600.0;
    let peak = peak_kb as f64 / 1024.0;
    let first = second_half.first().map_or(0.0, |p| p.1);
    let last = second_half.last().map_or(0.0, |p| p.1);
    let evictions: Vec<&String> = lines.iter().filter(|l| l.contains("cache evictions")).collect();
    note(format!(
        "soak: {seconds} s, {} profiles, {samples} samples; RSS after warm-up {first:.1} → {last:.1} MiB, \
         growth {growth:+.1} MiB/hour (least squares over the second half), peak {peak:.1} MiB; {}",
        accepted.len(),
        evictions.first().map_or("", |s| s.trim())
    ));
    assert!(peak < PEAK_BUDGET_MIB, "peak RSS {peak:.1} MiB over the {PEAK_BUDGET_MIB} MiB budget{d}");
    assert!(
        growth < MAX_GROWTH_MIB_PER_HOUR,
        "RSS grows {growth:.1} MiB/hour after warm-up (bound {MAX_GROWTH_MIB_PER_HOUR}); readings {rss:?}{d}"
    );
}
