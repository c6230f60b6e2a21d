//! pyperch's files opened by the viewers people use, not by our own code: the flame graph
//! SVG in headless Chromium (Debian's `chromium`), the speedscope JSON and the Gecko profile
//! in speedscope's web app (npm `speedscope`, served from localhost) inside that Chromium.
//!
//! Each test checks the rendered DOM (`--dump-dom`) for the workload's function name, and
//! keeps a screenshot under `target/tmp/viewers/` (its path is printed). `cargo xtask test`
//! installs Chromium and speedscope; without them the tests print SKIP.
//!
//! The heatmap (`--format heatmap`, a directory of HTML pages) is opened in the same
//! Chromium: its page's rendered text has the hot line with its share, its screenshot is a
//! real image; a hostile target's names are escaped, a FIFO or a stalled FUSE file for a
//! source does not block, and a chrooted process's source is read inside its root.
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

/// The `data-line`, `data-self` and `data-total` numbers of every row of a heatmap page.
fn heatmap_rows(html: &str) -> Vec<(u32, u64, u64)> {
    let attr = |row: &str, name: &str| -> Option<u64> {
        let at = row.find(&format!(" {name}=\""))? + name.len() + 3;
        row[at..].split('"').next()?.parse().ok()
    };
    html.split("<tr ")
        .skip(1)
        .filter_map(|row| Some((u32::try_from(attr(row, "data-line")?).ok()?, attr(row, "data-self")?, attr(row, "data-total")?)))
        .collect()
}

/// The profile's total as a heatmap page states it (`data-profile-total`).
fn heatmap_profile_total(html: &str) -> Option<u64> {
    let at = html.find("data-profile-total=\"")? + "data-profile-total=\"".len();
    html[at..].split('"').next()?.parse().ok()
}

/// The page `index.html` links for the file named (HTML-escaped) `escaped`.
fn heatmap_page_of(index: &str, escaped: &str) -> Option<String> {
    let link = index.find(&format!("\">{escaped}</a>"))?;
    let start = index[..link].rfind("<a href=\"")? + "<a href=\"".len();
    Some(index[start..link].to_string())
}

/// `part` of `whole` as the heatmap shows shares: two decimals and `%`.
fn heatmap_percent(part: u64, whole: u64) -> String {
    format!("{:.2}%", part as f64 * 100.0 / whole as f64)
}

/// Whether `png` is a PNG of `width` x `height` (its signature and IHDR chunk).
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&png[16..20]), be(&png[20..24])))
}

/// The 1-based number of the first line of the workload `script` that contains `text`.
fn line_of(script: &str, text: &str) -> u32 {
    let source = fs::read_to_string(workload_source(script)).expect("the workload's source");
    let i = source.lines().position(|l| l.contains(text)).unwrap_or_else(|| panic!("{script} has no line with {text:?}"));
    i as u32 + 1
}

/// `--format heatmap -o DIR` of two_lines.py (3 s): index.html links the workload's page;
/// its rows agree with each other (every line's total at least its self, the self values of
/// all pages at most the profile's total, main's call line on the stack of every sample of
/// two_lines_work), the two arithmetic lines hold most of the samples; Chromium renders the
/// page with the hot line's source text and its share, and its screenshot is a real
/// 1600x1000 image larger than that of a blank page.
#[test]
fn viewers_heatmap_pages_in_chromium() {
    let Some(py) = first_python(&PYTHONS) else {
        skip("no Python interpreter is available");
        return;
    };
    let w = Workload::spawn(&py, "two_lines.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let out = w.dir.host_path("heatmap");
    let out_str = out.to_string_lossy().into_owned();
    let pid = w.pid.to_string();
    let run = pyperch(&["record", "--pid", &pid, "--duration", "3", "--format", "heatmap", "-o", &out_str], Duration::from_secs(90));
    let d = run.diag();
    assert_eq!(run.code(), Some(0), "{}: pyperch failed{d}", py.describe());
    let read = |name: &str| fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{}: no {name} in the heatmap: {e}{d}", py.describe()));
    let index = read("index.html");
    let total = heatmap_profile_total(&index).unwrap_or_else(|| panic!("index.html states no profile total{d}"));
    let guest = w.dir.guest_path("two_lines.py");
    let page_name = heatmap_page_of(&index, &guest).unwrap_or_else(|| panic!("index.html links no page for {guest}:\n{index}"));
    assert!(page_name.starts_with("file-") && page_name.ends_with(".html") && !page_name.contains('/'), "{page_name}");
    let page = read(&page_name);
    assert!(!page.contains("source not readable"), "the workload's own source was not shown:\n{page}");
    // The workload still runs: its file is read inside its root (as it sees its paths).
    assert!(page.contains(&format!("source read inside the root of process {}", w.pid)), "the page does not say where its source was read:\n{page}");
    let rows = heatmap_rows(&page);

    // Internal consistency, over every page.
    let mut selves = 0;
    for entry in fs::read_dir(&out).expect("the heatmap directory").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("file-") {
            let html = fs::read_to_string(entry.path()).unwrap_or_default();
            assert_eq!(heatmap_profile_total(&html), Some(total), "{name}: another profile total");
            for (line, s, t) in heatmap_rows(&html) {
                assert!(s <= t && t <= total, "{name}: line {line} has self {s}, total {t} of {total}");
                selves += s;
            }
        }
    }
    assert!(selves <= total, "the pages' self values add up to {selves}, over the profile's {total}");

    let row = |line: u32| rows.iter().find(|r| r.0 == line).copied().unwrap_or((line, 0, 0));
    let (start, end) = function_lines("two_lines.py", WORK).expect("two_lines_work's lines");
    let work_self: u64 = rows.iter().filter(|r| (start..=end).contains(&r.0)).map(|r| r.1).sum();
    let call = row(line_of("two_lines.py", "two_lines_work(time.monotonic()"));
    assert!(call.2 >= work_self, "main's call line (total {}) is on the stack of every two_lines_work sample ({work_self})", call.2);
    let hot = [line_of("two_lines.py", "x * 31 + i"), line_of("two_lines.py", "x * 17 + i")].map(row);
    let hot_self = hot[0].1 + hot[1].1;
    note(format!("{}: profile total {total}; two_lines_work self {work_self}; hot lines {hot:?}", py.describe()));
    assert!(
        hot_self * 2 >= total && hot.iter().all(|h| h.1 * 10 >= total),
        "the two arithmetic lines {hot:?} should hold most of the {total} samples"
    );
    // Every line of the file is shown, numbered.
    let lines = fs::read_to_string(workload_source("two_lines.py")).unwrap_or_default().lines().count() as u32;
    assert!((1..=lines).all(|n| page.contains(&format!("id=\"L{n}\""))), "not every line of two_lines.py is on its page");

    if !have_chromium() {
        return;
    }
    let hottest = hot.iter().max_by_key(|h| h.1).copied().unwrap_or_default();
    let hot_text = if hottest.0 == hot[0].0 { "x = (x * 31 + i) % 65521" } else { "x = (x * 17 + i) % 65519" };
    let png = screenshot_dir().join("heatmap.png");
    let work = w.dir.host_path("");
    let dom = dom_and_screenshot(&format!("file://{}", out.join(&page_name).display()), &png, &work).unwrap_or_else(|e| panic!("{e}"));
    let text = visible_text(&dom);
    let share = heatmap_percent(hottest.1, total);
    assert!(text.contains(hot_text), "the rendered page lacks the hot line {hot_text:?}: {}", &text[..text.len().min(1500)]);
    assert!(
        text.contains(&format!("{} {share} {}", hottest.1, hottest.2)),
        "the rendered page lacks line {}'s self {} ({share}) and total {}",
        hottest.0,
        hottest.1,
        hottest.2
    );
    let blank = screenshot_dir().join("heatmap-blank.png");
    let shot = format!("--screenshot={}", blank.display());
    chromium("about:blank", &[shot.as_str()], &work).unwrap_or_else(|e| panic!("{e}"));
    let (page_png, blank_png) = (fs::read(&png).unwrap_or_default(), fs::read(&blank).unwrap_or_default());
    assert_eq!(png_size(&page_png), Some((1600, 1000)), "{} is not a 1600x1000 PNG", png.display());
    assert!(png_size(&blank_png).is_some(), "{} is not a PNG", blank.display());
    assert!(
        page_png.len() > blank_png.len() * 3 && page_png.len() > 10_000,
        "the heatmap's screenshot ({} bytes) is no larger than a blank page's ({} bytes)",
        page_png.len(),
        blank_png.len()
    );
    // The index renders its link to the page too.
    let index_dom = chromium(&format!("file://{}", out.join("index.html").display()), &["--dump-dom"], &work).unwrap_or_else(|e| panic!("{e}"));
    assert!(index_dom.contains(&format!("href=\"{page_name}\"")), "the rendered index has no link to {page_name}");
}

/// A heatmap of a process whose function is named `<script>alert(1)</script>` and whose
/// source file (`gone<b>&"x.py`) was replaced by a FIFO nobody writes: pyperch ends in time,
/// the page is written with the file's counted lines and "source not readable", every name
/// is escaped, and Chromium shows the names as text (no script element). Also: an existing
/// regular file and standard output are refused as heatmap destinations in one sentence.
#[test]
fn viewers_heatmap_hostile_names_and_sources() {
    const NAME: &str = "<script>alert(1)</script>";
    let Some(py) = first_python(&PYTHONS) else {
        skip("no Python interpreter is available");
        return;
    };
    let w = Workload::spawn(&py, "heatmap_hostile.py", &["{dir}", "60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let regular = w.dir.host_path("a-file");
    fs::write(&regular, "keep").expect("cannot write a file");
    let regular_str = regular.to_string_lossy().into_owned();
    for dest in [regular_str.as_str(), "-"] {
        let run = pyperch(&["record", "--pid", &pid, "--duration", "1", "--format", "heatmap", "-o", dest], Duration::from_secs(60));
        run.assert_clear_error();
        assert!(run.stderr.contains("directory"), "-o {dest}: the refusal does not say a directory is needed{}", run.diag());
    }
    assert_eq!(fs::read_to_string(&regular).unwrap_or_default(), "keep");

    let out = w.dir.host_path("heatmap");
    let out_str = out.to_string_lossy().into_owned();
    let run = pyperch(&["record", "--pid", &pid, "--duration", "2", "--format", "heatmap", "-o", &out_str], Duration::from_secs(60));
    let d = run.diag();
    assert_eq!(run.code(), Some(0), "{}: pyperch failed or hung{d}", py.describe());
    let index = fs::read_to_string(out.join("index.html")).unwrap_or_else(|e| panic!("no index.html: {e}{d}"));
    let escaped_path = format!("{}/gone&lt;b&gt;&amp;&quot;x.py", w.dir.guest_path("").trim_end_matches('/'));
    let page_name = heatmap_page_of(&index, &escaped_path).unwrap_or_else(|| panic!("index.html links no page for {escaped_path}:\n{index}"));
    let page = fs::read_to_string(out.join(&page_name)).unwrap_or_default();
    for html in [&index, &page] {
        assert!(!html.contains("<script") && !html.contains("<b>"), "a name went into the HTML unescaped:\n{html}");
    }
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the page does not name the function:\n{page}");
    assert!(page.contains("source not readable: it is a FIFO"), "the page does not say why its source is missing:\n{page}");
    let spin_line = 4; // `x = (x * 7 + 1) % 65521` in the workload's SOURCE
    let rows = heatmap_rows(&page);
    assert!(rows.iter().any(|r| r.0 == spin_line && r.1 > 0), "the page lacks the spinning line's count: {rows:?}");

    if !have_chromium() {
        return;
    }
    let png = screenshot_dir().join("heatmap-hostile.png");
    let dom = dom_and_screenshot(&format!("file://{}", out.join(&page_name).display()), &png, &w.dir.host_path(""))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!dom.contains("<script"), "Chromium's DOM has a script element");
    let text = visible_text(&dom);
    // The DOM keeps `<` and `>` of text escaped; the names read back as text.
    assert!(dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the rendered page does not show {NAME} as text: {text}");
    assert!(text.contains("source not readable: it is a FIFO"), "the rendered page lacks the note: {text}");
}

/// A source file on a FUSE file system whose server is stopped (`fuse_stall.py`, in a
/// mount namespace of its own; `heatmap_fuse.py` runs the file's code from there): the
/// heatmap's read of it never answers. pyperch still ends within its per-file deadline
/// (2 s) of the recording's end, and the file's page is written with its counted lines and
/// `source not readable: no answer within ...`.
#[test]
fn viewers_heatmap_source_on_stalled_fuse() {
    /// The `while` and the arithmetic line of SOURCE's spin.
    const SPIN_LINES: [u32; 2] = [5, 6];
    const SOURCE: &str = "import time\n\ndef spin(deadline):\n    x = 0\n    while time.monotonic() < deadline:\n        x = (x * 7 + 1) % 65521\n    return x\n";
    if !is_root() {
        skip("needs root (FUSE mount)");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        skip("/dev/fuse does not exist on this machine: the stalled file cannot be made");
        return;
    }
    // Debian's static interpreter: discovery finds Python in its executable and never looks
    // at the mapped file of the stalled mount.
    let exe = PathBuf::from("/usr/bin/python3.11");
    if !exe.is_file() {
        skip("Debian's python3.11 (/usr/bin/python3.11) is not installed");
        return;
    }
    let py = Python { label: "debian-3.11-heatmap".into(), major: 3, minor: 11, exe, rootfs: None };
    let dir = WorkDir::new(&py, "heatmap-fuse").unwrap_or_else(|e| panic!("{e:#}"));
    let (mnt, warm, source) = (dir.host_path("mnt"), dir.host_path("warm"), dir.host_path("spin_source.py"));
    fs::create_dir_all(&mnt).expect("cannot create the mount point");
    fs::write(&source, SOURCE).expect("cannot write the source");
    let served = mnt.join("lib.so");
    let server = Workload::spawn(
        &py,
        "fuse_stall.py",
        &[
            &mnt.to_string_lossy(),
            &format!("@{}", source.display()),
            &py.exe.to_string_lossy(),
            &workload_source("heatmap_fuse.py").to_string_lossy(),
            &served.to_string_lossy(),
            &warm.to_string_lossy(),
            "60",
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let fields = server.ready_fields();
    let pid_of = |k: &str| fields.get(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or_else(|| panic!("{k}= in {fields:?}"));
    let (server_pid, pid) = (pid_of("server"), pid_of("mapper"));
    let cleanup = KillPids(vec![server_pid, pid]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !warm.is_file() {
        assert!(std::time::Instant::now() < deadline, "the workload never ran the source from the FUSE mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) of the server our workload forked.
    unsafe { libc::kill(server_pid as libc::pid_t, libc::SIGSTOP) };
    note("the FUSE server holding the source is stopped: reading it hangs");

    let out = dir.host_path("heatmap");
    let (out_str, pid_arg) = (out.to_string_lossy().into_owned(), pid.to_string());
    let run = pyperch(&["record", "--pid", &pid_arg, "--duration", "2", "--format", "heatmap", "-o", &out_str], Duration::from_secs(60));
    drop(cleanup);
    drop(server);
    let d = run.diag();
    assert_eq!(run.code(), Some(0), "pyperch failed or hung{d}");
    // Start-up on a loaded 2-core machine, the 2 s recording, the 2 s read deadline.
    assert!(run.elapsed <= Duration::from_secs(20), "pyperch took {:?}{d}", run.elapsed);
    let index = fs::read_to_string(out.join("index.html")).unwrap_or_else(|e| panic!("no index.html: {e}{d}"));
    let served_str = served.to_string_lossy();
    let page_name = heatmap_page_of(&index, &served_str).unwrap_or_else(|| panic!("index.html links no page for {served_str}:\n{index}"));
    let page = fs::read_to_string(out.join(&page_name)).unwrap_or_default();
    assert!(page.contains("source not readable: no answer within"), "the page does not say the source did not answer:\n{page}");
    let said = page.lines().find(|l| l.contains("source not readable")).unwrap_or_default();
    note(format!("pyperch took {:.1} s; the page says: {said}", run.elapsed.as_secs_f64()));
    let rows = heatmap_rows(&page);
    assert!(rows.iter().any(|r| SPIN_LINES.contains(&r.0) && r.1 > 0), "the page lacks the spinning line's count: {rows:?}");
}

/// A chrooted interpreter (sid 3.15, as a container's process sees its own tree): its
/// source's path exists only inside its root, and the heatmap reads it there
/// (`/proc/PID/root`): the page shows the workload's hot line, not "source not readable".
#[test]
fn viewers_heatmap_reads_sources_inside_the_process_root() {
    let Some(py) = python("sid-3.15") else { return };
    assert!(py.is_chroot(), "{} is expected to run chrooted", py.describe());
    let w = Workload::spawn(&py, "two_lines.py", &["60"]).unwrap_or_else(|e| panic!("{e:#}"));
    let guest = w.dir.guest_path("two_lines.py");
    assert!(!Path::new(&guest).exists(), "{guest} exists on the host too: the test would prove nothing");
    let out = w.dir.host_path("heatmap");
    let (out_str, pid) = (out.to_string_lossy().into_owned(), w.pid.to_string());
    let run = pyperch(&["record", "--pid", &pid, "--duration", "2", "--format", "heatmap", "-o", &out_str], Duration::from_secs(90));
    let d = run.diag();
    assert_eq!(run.code(), Some(0), "{}: pyperch failed{d}", py.describe());
    let index = fs::read_to_string(out.join("index.html")).unwrap_or_else(|e| panic!("no index.html: {e}{d}"));
    let page_name = heatmap_page_of(&index, &guest).unwrap_or_else(|| panic!("index.html links no page for {guest}:\n{index}"));
    let page = fs::read_to_string(out.join(&page_name)).unwrap_or_default();
    assert!(page.contains(&format!("source read inside the root of process {}", w.pid)), "{page}");
    assert!(!page.contains("source not readable") && page.contains("x = (x * 31 + i) % 65521"), "the source was not read inside the process's root:\n{page}");
}
