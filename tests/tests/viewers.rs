//! pyperch's files opened by the viewers people use, not by our own code: the flame graph
//! SVG in headless Chromium (Debian's `chromium`), the speedscope JSON and the Gecko profile
//! in speedscope's web app (npm `speedscope`, served from localhost) inside that Chromium.
//!
//! Each test checks the rendered DOM (`--dump-dom`) for the workload's function name, and
//! keeps a screenshot under `target/tmp/viewers/` (its path is printed). `cargo xtask test`
//! installs Chromium and speedscope; without them the tests print SKIP.
//!
//! The Firefox Profiler's own processing code is not published on npm (there is no
//! `firefox-profiler` package), so the Gecko file is checked against the Gecko profile format
//! version it declares (31) by a schema test here, and imported by speedscope.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use pyperch_tests::*;

const PYTHONS: [&str; 6] = ["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"];
const CHROMIUM: &str = "/usr/bin/chromium";
/// The function two_lines.py spends its time in.
const WORK: &str = "two_lines_work";
/// Chromium's start-up and rendering on a loaded 2-core machine.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// Where screenshots are kept (not removed after the test).
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("viewers");
    fs::create_dir_all(&dir).expect("cannot create the screenshot directory");
    dir
}

/// Runs headless Chromium on `url` with `extra` arguments; returns its stdout.
fn chromium(url: &str, extra: &[&str], profile_dir: &Path) -> Result<String, String> {
    let user_data = profile_dir.join(format!("chromium-{}", unique_suffix()));
    fs::create_dir_all(&user_data).map_err(|e| format!("cannot create {}: {e}", user_data.display()))?;
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        // WebGL (speedscope's flame graphs) then runs on SwiftShader, which Chromium 137+ no
        // longer falls back to unless asked: without this the app shows "Something went wrong".
        "--enable-unsafe-swiftshader",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1600,1000",
    ])
    .arg(format!("--user-data-dir={}", user_data.display()))
    .args(extra)
    .arg(url);
    let run = Running::start(cmd).map_err(|e| format!("{e:#}"))?.finish(BROWSER_TIMEOUT);
    if !run.success() {
        return Err(format!("chromium failed{}", run.diag()));
    }
    Ok(run.stdout)
}

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The rendered DOM of `url` (after 5 s of virtual time, so that a web app has rendered) and a
/// screenshot of it at `png`.
fn dom_and_screenshot(url: &str, png: &Path, work_dir: &Path) -> Result<String, String> {
    let dom = chromium(url, &["--virtual-time-budget=5000", "--dump-dom"], work_dir)?;
    let shot = format!("--screenshot={}", png.display());
    chromium(url, &["--virtual-time-budget=5000", shot.as_str()], work_dir)?;
    if !png.is_file() {
        return Err(format!("chromium wrote no screenshot at {}", png.display()));
    }
    note(format!("screenshot: {}", png.display()));
    Ok(dom)
}

/// The rendered DOM of `url` once it contains `needle`: a web app that fetches and imports a
/// file (speedscope) renders after a time that depends on the machine's load, so the DOM is
/// dumped after 5 s of Chromium's virtual time and, while `needle` is missing, again after 15
/// and 30 s. When it never appears the last DOM is kept at `target/tmp/viewers/<name>.dom.html`
/// and the error shows its text, so that a failure says what the viewer showed instead.
fn rendered_dom_with(url: &str, needle: &str, name: &str, work_dir: &Path) -> Result<String, String> {
    let mut dom = String::new();
    for budget_ms in [5_000, 15_000, 30_000] {
        dom = chromium(url, &[format!("--virtual-time-budget={budget_ms}").as_str(), "--dump-dom"], work_dir)?;
        if dom.contains(needle) {
            return Ok(dom);
        }
        note(format!("{name}: no {needle} in the DOM after {budget_ms} ms of virtual time"));
    }
    let kept = screenshot_dir().join(format!("{name}.dom.html"));
    let _ = fs::write(&kept, &dom);
    let text: String = visible_text(&dom).chars().take(1500).collect();
    Err(format!("{name}: the page never showed {needle} (DOM kept at {}); its text: {text}", kept.display()))
}

/// The text of an HTML document without its tags, scripts and styles, whitespace collapsed.
fn visible_text(html: &str) -> String {
    let mut out = String::new();
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        out.push(' ');
        let tag = &rest[open..];
        let skip_to = ["<script", "<style"]
            .iter()
            .find(|t| tag.starts_with(**t))
            .and_then(|t| tag.find(&format!("</{}", &t[1..])))
            .unwrap_or(0);
        match tag[skip_to..].find('>') {
            Some(close) => rest = &tag[skip_to + close + 1..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Chromium, or why the test skips.
fn have_chromium() -> bool {
    if Path::new(CHROMIUM).is_file() {
        return true;
    }
    skip(format!("{CHROMIUM} is not installed (cargo xtask test installs Debian's chromium)"));
    false
}

/// speedscope's built web app (`dist/release` of the npm package), or why the test skips.
fn speedscope_app() -> Option<PathBuf> {
    let dir = std::env::var_os("PYPERCH_SPEEDSCOPE_DIR").map(PathBuf::from);
    match dir {
        Some(d) if d.join("index.html").is_file() => Some(d),
        Some(d) => {
            skip(format!("speedscope is not installed in {} (cargo xtask test installs it with npm)", d.display()));
            None
        }
        None => {
            skip("PYPERCH_SPEEDSCOPE_DIR is not set (cargo xtask test sets it)");
            None
        }
    }
}

/// `python3 -m http.server` on a free localhost port, serving `dir`; killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(dir: &Path) -> Result<Server, String> {
        let python = find_program("python3").ok_or("python3 is not installed")?;
        let mut child = Command::new(python)
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start python3 -m http.server: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        // "Serving HTTP on 127.0.0.1 port 12345 (http://127.0.0.1:12345/) ..."
        let read = BufReader::new(stdout).read_line(&mut line);
        let port = line.split_whitespace().skip_while(|w| *w != "port").nth(1).and_then(|p| p.parse().ok());
        match (read, port) {
            (Ok(_), Some(port)) => Ok(Server { child, port }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("http.server did not say its port: {line:?}"))
            }
        }
    }

    /// speedscope's page loading `file` (a name in the served directory) in `view`.
    fn speedscope_url(&self, file: &str, view: &str) -> String {
        let profile = format!("http://127.0.0.1:{}/{file}", self.port);
        let encoded: String = profile
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b".-_".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        format!("http://127.0.0.1:{}/index.html#profileURL={encoded}&view={view}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory holding speedscope's app (symlinked) and `files`, served from localhost.
fn serve_with_speedscope(app: &Path, dir: &Path, files: &[(&str, &[u8])]) -> Result<Server, String> {
    let site = dir.join("site");
    fs::create_dir_all(&site).map_err(|e| e.to_string())?;
    for entry in fs::read_dir(app).map_err(|e| e.to_string())?.flatten() {
        let _ = std::os::unix::fs::symlink(entry.path(), site.join(entry.file_name()));
    }
    for (name, bytes) in files {
        fs::write(site.join(name), bytes).map_err(|e| e.to_string())?;
    }
    Server::start(&site)
}

/// Records two_lines.py for 3 s in `format` into `file`; returns the bytes written.
fn record_two_lines(format: &str, file: &str) -> Option<(Vec<u8>, WorkDir)> {
    record_two_lines_with(format, file, &[]).map(|(bytes, dir, _)| (bytes, dir))
}

/// `record_two_lines` with `extra` flags for pyperch; also returns the workload's pid and its
/// main thread's OS name (`/proc/PID/task/PID/comm`, read while pyperch recorded it).
fn record_two_lines_with(format: &str, file: &str, extra: &[&str]) -> Option<(Vec<u8>, WorkDir, (u32, String))> {
    let Some(py) = first_python(&PYTHONS) else {
        skip("no Python interpreter is available");
        return None;
    };
    let w = Workload::spawn(&py, "two_lines.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let out = w.dir.host_path(file);
    let out_str = out.to_string_lossy().into_owned();
    let pid = w.pid.to_string();
    let mut args = vec!["record", "--pid", pid.as_str(), "--duration", "3", "--format", format, "-o", out_str.as_str()];
    args.extend_from_slice(extra);
    let run = pyperch(&args, Duration::from_secs(90));
    let comm = fs::read_to_string(format!("/proc/{pid}/task/{pid}/comm")).unwrap_or_default().trim_end().to_string();
    let d = run.diag();
    assert_eq!(run.code(), Some(0), "{}: pyperch failed{d}", py.describe());
    let bytes = fs::read(&out).unwrap_or_else(|e| panic!("{}: no {format} file: {e}{d}", py.describe()));
    let dir = WorkDir::new(&py, &format!("viewers-{format}")).unwrap_or_else(|e| panic!("{e:#}"));
    Some((bytes, dir, (w.pid, comm)))
}

/// The flame graph SVG opened as a file in Chromium: the rendered DOM has the function.
#[test]
fn viewers_flamegraph_svg_in_chromium() {
    if !have_chromium() {
        return;
    }
    let Some((svg, dir)) = record_two_lines("flamegraph", "profile.svg") else { return };
    let file = dir.host_path("profile.svg");
    fs::write(&file, &svg).expect("cannot write the SVG");
    let png = screenshot_dir().join("flamegraph.png");
    let dom = dom_and_screenshot(&format!("file://{}", file.display()), &png, &dir.host_path(""))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(dom.contains("<svg"), "Chromium did not render an SVG document: {}", &dom[..dom.len().min(500)]);
    assert!(dom.contains(WORK), "the rendered flame graph has no {WORK}");
}

/// The speedscope JSON (`--threads`) loaded by speedscope's app: its sandwich (function
/// table) view lists the function, and the profile is named after the process and the thread
/// with the thread's OS name.
#[test]
fn viewers_speedscope_json_in_speedscope() {
    if !have_chromium() {
        return;
    }
    let Some(app) = speedscope_app() else { return };
    let Some((json, dir, (pid, comm))) = record_two_lines_with("speedscope", "profile.speedscope.json", &["--threads"]) else { return };
    let parsed: serde_json::Value = serde_json::from_slice(&json).unwrap_or_else(|e| panic!("the speedscope file is not JSON: {e}"));
    let names: Vec<&str> = parsed["profiles"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    // The main thread's name is the process's (two_lines.py does not rename it).
    let main = format!("{comm} (pid {pid}) thread {pid} ({comm})");
    assert!(!comm.is_empty() && names.contains(&main.as_str()), "no profile named {main:?}: {names:?}");
    let server = serve_with_speedscope(&app, &dir.host_path(""), &[("profile.speedscope.json", &json)])
        .unwrap_or_else(|e| panic!("{e}"));
    let dom = rendered_dom_with(&server.speedscope_url("profile.speedscope.json", "sandwich"), WORK, "speedscope-sandwich", &dir.host_path(""))
        .unwrap_or_else(|e| panic!("speedscope's function table has no {WORK}: {e}"));
    assert!(dom.contains(&main), "speedscope does not show the profile name {main:?}");
    let png = screenshot_dir().join("speedscope.png");
    dom_and_screenshot(&server.speedscope_url("profile.speedscope.json", "left-heavy"), &png, &dir.host_path(""))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The Gecko profile format version pyperch writes (profiler-user/src/output/gecko.rs).
const GECKO_VERSION: u64 = 31;

/// Checks `json` against the Gecko profile format, version 31 (firefox-devtools/profiler
/// `src/types/gecko-profile.ts`): the fields the format requires with their types, every
/// table's schema and row width, and every index in range (a stack's prefix before it).
/// Returns every frame location a sample's stack contains.
fn check_gecko_schema(json: &serde_json::Value) -> Result<Vec<String>, String> {
    let meta = json["meta"].as_object().ok_or("no meta object")?;
    if meta.get("version").and_then(|v| v.as_u64()) != Some(GECKO_VERSION) {
        return Err(format!("meta.version is {:?}, not {GECKO_VERSION}", meta.get("version")));
    }
    for (field, is_number) in [("startTime", true), ("interval", true), ("stackwalk", true), ("debug", true),
        ("gcpoison", true), ("asyncstack", true), ("processType", true)] {
        if meta.get(field).is_none_or(|v| v.is_number() != is_number) {
            return Err(format!("meta.{field} is missing or not a number"));
        }
    }
    if !meta.get("shutdownTime").is_some_and(|v| v.is_null() || v.is_number()) {
        return Err("meta.shutdownTime is missing".into());
    }
    if !meta.get("markerSchema").is_some_and(|v| v.is_array()) {
        return Err("meta.markerSchema is not an array".into());
    }
    let categories = meta.get("categories").and_then(|c| c.as_array()).ok_or("meta.categories is not an array")?;
    for c in categories {
        if !(c["name"].is_string() && c["color"].is_string() && c["subcategories"].as_array().is_some_and(|s| !s.is_empty())) {
            return Err(format!("bad category {c}"));
        }
    }
    if !categories.iter().any(|c| c["name"] == "Python") {
        return Err("no Python category".into());
    }
    for list in ["libs", "pausedRanges", "processes"] {
        if !json[list].is_array() {
            return Err(format!("{list} is not an array"));
        }
    }
    let threads = json["threads"].as_array().ok_or("threads is not an array")?;
    if threads.is_empty() {
        return Err("no threads".into());
    }
    let mut locations = Vec::new();
    for t in threads {
        let name = t["name"].as_str().ok_or("a thread without a name")?;
        if !(t["pid"].is_u64() && t["tid"].is_u64() && t["processType"].is_string() && t["registerTime"].is_number()
            && t.get("unregisterTime").is_some())
        {
            return Err(format!("thread {name}: pid, tid, processType, registerTime or unregisterTime missing"));
        }
        let schema = |table: &str, columns: &[&str]| -> Result<&Vec<serde_json::Value>, String> {
            for (i, c) in columns.iter().enumerate() {
                if t[table]["schema"][c].as_u64() != Some(i as u64) {
                    return Err(format!("thread {name}: {table}.schema.{c} is not {i}"));
                }
            }
            let rows = t[table]["data"].as_array().ok_or(format!("thread {name}: {table}.data is not an array"))?;
            if let Some(row) = rows.iter().find(|r| r.as_array().map(Vec::len) != Some(columns.len())) {
                return Err(format!("thread {name}: {table} row {row} is not {} wide", columns.len()));
            }
            Ok(rows)
        };
        schema("markers", &["name", "startTime", "endTime", "phase", "category", "data"])?;
        let samples = schema("samples", &["stack", "time", "eventDelay"])?;
        let frames = schema("frameTable", &["location", "relevantForJS", "innerWindowID", "implementation", "line", "column", "category", "subcategory"])?;
        let stacks = schema("stackTable", &["prefix", "frame"])?;
        let strings = t["stringTable"].as_array().ok_or(format!("thread {name}: no stringTable"))?;
        if strings.iter().any(|s| !s.is_string()) {
            return Err(format!("thread {name}: a stringTable entry is not a string"));
        }
        for f in frames {
            let location = f[0].as_u64().filter(|&i| (i as usize) < strings.len());
            let category = f[6].as_u64().filter(|&c| (c as usize) < categories.len());
            if location.is_none() || category.is_none() || !f[1].is_boolean() || !(f[4].is_null() || f[4].is_u64()) {
                return Err(format!("thread {name}: bad frame {f}"));
            }
        }
        for (i, s) in stacks.iter().enumerate() {
            if !(s[0].is_null() || s[0].as_u64().is_some_and(|p| (p as usize) < i)) || s[1].as_u64().is_none_or(|f| f as usize >= frames.len()) {
                return Err(format!("thread {name}: bad stack {i}: {s}"));
            }
        }
        let mut last = f64::MIN;
        for s in samples {
            let time = s[1].as_f64().ok_or(format!("thread {name}: sample without time: {s}"))?;
            if time < last {
                return Err(format!("thread {name}: sample times go back at {s}"));
            }
            last = time;
            let mut at = s[0].as_u64();
            if at.is_some_and(|i| i as usize >= stacks.len()) {
                return Err(format!("thread {name}: sample stack out of range: {s}"));
            }
            while let Some(i) = at {
                let row = &stacks[i as usize];
                let frame = &frames[row[1].as_u64().unwrap_or(0) as usize];
                locations.push(strings[frame[0].as_u64().unwrap_or(0) as usize].as_str().unwrap_or("").to_string());
                at = row[0].as_u64();
            }
        }
    }
    Ok(locations)
}

/// `--format gecko`: valid against the Gecko profile format version 31, one track per thread
/// with sample times; each thread imported by speedscope (as the Firefox export it reads,
/// `{systemHost: {name: "Firefox"}, profile: <gecko profile>}`) lists the function.
#[test]
fn viewers_gecko_profile_schema_and_speedscope() {
    let Some((bytes, dir)) = record_two_lines("gecko", "profile.gecko.json") else { return };
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("the gecko file is not JSON: {e}"));
    let locations = check_gecko_schema(&json).unwrap_or_else(|e| panic!("not a Gecko profile of version {GECKO_VERSION}: {e}"));
    assert!(
        locations.iter().any(|l| l.starts_with(&format!("{WORK} ("))),
        "no sample has {WORK} on its stack"
    );
    note(format!(
        "checked against the Gecko profile format version {GECKO_VERSION} by schema, not by the Firefox Profiler's own code (it is not published on npm)"
    ));
    if !have_chromium() {
        return;
    }
    let Some(app) = speedscope_app() else { return };
    // speedscope imports one thread of a Firefox export: the busiest one.
    let threads = json["threads"].as_array().cloned().unwrap_or_default();
    let busiest = threads
        .iter()
        .max_by_key(|t| t["samples"]["data"].as_array().map_or(0, Vec::len))
        .cloned()
        .unwrap_or_default();
    // speedscope's importer closes a thread's frames only at a sample with no stack (it fails
    // with "non-empty stack" otherwise), as Firefox's own exports have at the end: the envelope
    // adds one (a valid Gecko sample: `stack` may be null) one sampling interval after the last.
    let interval = json["meta"]["interval"].as_f64().unwrap_or(1.0);
    let last = busiest["samples"]["data"].as_array().and_then(|d| d.last()).and_then(|s| s[1].as_f64()).unwrap_or(0.0);
    let duration = last + interval;
    let mut thread = busiest.clone();
    if let Some(data) = thread["samples"]["data"].as_array_mut() {
        data.push(serde_json::json!([null, duration, 0]));
    }
    let mut single = json.clone();
    single["threads"] = serde_json::Value::Array(vec![thread]);
    let envelope = serde_json::json!({"systemHost": {"name": "Firefox"}, "duration": duration, "profile": single});
    let envelope = serde_json::to_vec(&envelope).expect("JSON");
    let server = serve_with_speedscope(&app, &dir.host_path(""), &[("firefox-export.json", &envelope)])
        .unwrap_or_else(|e| panic!("{e}"));
    rendered_dom_with(&server.speedscope_url("firefox-export.json", "sandwich"), WORK, "gecko-in-speedscope-sandwich", &dir.host_path(""))
        .unwrap_or_else(|e| panic!("speedscope's import of the gecko profile has no {WORK}: {e}"));
    let png = screenshot_dir().join("gecko-in-speedscope.png");
    dom_and_screenshot(&server.speedscope_url("firefox-export.json", "left-heavy"), &png, &dir.host_path(""))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// `--format gecko` of a process with several threads: one Gecko thread (one track) per
/// sampled thread, each with the workload's native thread id and named after the thread's OS
/// name (without `--threads`: a track per thread is the format's layout), and each spinner's
/// function only on its own thread's samples.
#[test]
fn viewers_gecko_one_track_per_thread() {
    const SPINNERS: [&str; 4] = ["spin_alpha", "spin_beta", "spin_gamma", "spin_delta"];
    let Some(py) = first_python(&PYTHONS) else {
        skip("no Python interpreter is available");
        return;
    };
    let mut w = Workload::spawn(&py, "threads.py", &["120"]).unwrap_or_else(|e| panic!("{e:#}"));
    // "ready PID hash_worker=TID spin_alpha=TID ..." with native thread ids.
    let native: std::collections::BTreeMap<String, u64> =
        w.ready_fields().into_iter().filter_map(|(k, v)| Some((k, v.parse().ok()?))).collect();
    let out = w.dir.host_path("threads.gecko.json");
    let out_str = out.to_string_lossy().into_owned();
    let pid = w.pid.to_string();
    let run = pyperch(
        &["record", "--pid", pid.as_str(), "--duration", "4", "--rate", "199", "-o", out_str.as_str()],
        Duration::from_secs(90),
    );
    w.terminate();
    let d = format!("{}\n--- native thread ids: {native:?}", run.diag());
    assert_eq!(run.code(), Some(0), "{}: pyperch failed{d}", py.describe());
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{}: the .gecko.json output is not JSON: {e}{d}", py.describe()));
    check_gecko_schema(&json).unwrap_or_else(|e| panic!("{}: {e}{d}", py.describe()));
    let threads = json["threads"].as_array().cloned().unwrap_or_default();
    for spinner in SPINNERS {
        let tid = native[spinner];
        let with: Vec<u64> = threads
            .iter()
            .filter(|t| {
                let one = serde_json::json!({"meta": json["meta"], "libs": [], "pausedRanges": [], "processes": [], "threads": [t]});
                check_gecko_schema(&one).is_ok_and(|names| names.iter().any(|n| n.starts_with(&format!("{spinner} ("))))
            })
            .filter_map(|t| t["tid"].as_u64())
            .collect();
        assert_eq!(with, vec![tid], "{}: {spinner} should be on its own thread's track only{d}", py.describe());
        // threads.py names each thread after its function (prctl) before it says ready.
        let track = threads.iter().find(|t| t["tid"].as_u64() == Some(tid));
        assert_eq!(
            track.and_then(|t| t["name"].as_str()),
            Some(format!("{spinner} (tid {tid})").as_str()),
            "{}: the track of {spinner}{d}",
            py.describe()
        );
    }
    let pids: std::collections::BTreeSet<u64> = threads.iter().filter_map(|t| t["pid"].as_u64()).collect();
    assert_eq!(pids.into_iter().collect::<Vec<_>>(), vec![u64::from(w.pid)], "{}: tracks of other processes{d}", py.describe());
}
