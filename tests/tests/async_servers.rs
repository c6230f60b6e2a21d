//! `record --async` on real servers under load (issue #27, "Real servers"): an aiohttp app run
//! with `web.run_app` (server_aiohttp.py) and a Starlette app run with `uvicorn.run`
//! (server_uvicorn.py), each on sid 3.14 and 3.15, with the pinned PyPI releases `cargo xtask
//! test` installs into the sid rootfs (`/opt/pyperch-servers/python3.X`, on `PYTHONPATH`), and
//! on the free-threaded 3.14 of `PYPERCH_FT_PYTHON` with the same releases' cp314t wheels
//! (installed on the host, `PYPERCH_FT_SERVER_PACKAGES`).
//! Every request's handler awaits `handle -> step_a -> step_b -> step_c`, and step_c runs
//! `cpu_work` (3 ms of pure Python); server_load.py keeps four keep-alive connections busy.
//!
//! Of the samples whose leaf is `cpu_work`, at least 95 % must show the logical stack: task
//! frames from the root task (nothing of the event loop above it), the handler's coroutine
//! frames in order at the end; per-request tasks aggregate (no `task Task-<n>`); the frame
//! after the request's task frame is the request task's own coroutine (anything else is a
//! stack that never happened); with aiohttp the connection's task (`RequestHandler.start`,
//! web_protocol.py) sits above the request's task, which it creates as an eager task.
//! On 3.15 CPython's own profiler (`python3.15 -m profiling.sampling attach --async-aware`,
//! run in the server's root and mount namespace) samples the same process at the same time:
//! its share of such stacks is the reference, and pyperch's share may not be more than 5
//! points below it. CPython's profiler shows one task level here (the running request task,
//! whose eager start means nobody awaits it yet), so the comparison is on the shared form:
//! task frames first, handler frames last, no loop machinery.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use pyperch_tests::*;

/// Loop machinery that a logical stack must not show.
const MACHINERY: [&str; 6] = ["run_forever", "_run_once", "run_until_complete", "Handle._run", "Runner.run", "run_app"];

/// The handler's frames, outermost first, ending at the leaf.
const HANDLER: [&str; 5] = ["handle", "step_a", "step_b", "step_c", "cpu_work"];

/// Samples per recording window: `--rate 199` for 8 s.
const SECONDS: &str = "8";
const RATE: &str = "199";

#[derive(Clone, Copy, PartialEq)]
enum App {
    Aiohttp,
    Uvicorn,
}

impl App {
    fn script(self) -> &'static str {
        match self {
            App::Aiohttp => "server_aiohttp.py",
            App::Uvicorn => "server_uvicorn.py",
        }
    }

    /// The qualnames of the coroutines of the tasks a request's stack can show: aiohttp's
    /// connection task and request task; uvicorn's request task (its connections are
    /// protocol callbacks, not tasks).
    fn task_coroutines(self) -> &'static [&'static str] {
        match self {
            App::Aiohttp => &["RequestHandler.start", "RequestHandler._handle_request"],
            App::Uvicorn => &["RequestResponseCycle.run_asgi"],
        }
    }
}

/// The server, started as `unshare --mount` + `mount -t proc` + `chroot ROOTFS python3.X
/// SCRIPT`, so that CPython's profiler can run in its root with /proc (the mount is private
/// to the server's namespace). Killed on drop.
struct Server {
    child: Child,
    pid: u32,
    port: String,
    stderr: PathBuf,
    dir: WorkDir,
}

impl Server {
    /// In the sid rootfs (`rootfs`), or on the host for an interpreter without one (the
    /// free-threaded 3.14), with the server packages of `packages` on `PYTHONPATH`.
    fn start(py: &Python, app: App, rootfs: Option<&std::path::Path>, packages: &str) -> Result<Self, String> {
        let dir = WorkDir::new(py, "server").map_err(|e| format!("{e:#}"))?;
        let stderr = dir.host_path("server.stderr");
        let err = fs::File::create(&stderr).map_err(|e| format!("cannot create {}: {e}", stderr.display()))?;
        let mut cmd = match rootfs {
            Some(rootfs) => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c", r#"mount -t proc proc "$0/proc" && exec chroot "$0" "$@""#])
                    .arg(rootfs)
                    .arg(&py.exe);
                cmd
            }
            None => Command::new(&py.exe),
        };
        let mut child = cmd
            .arg(dir.guest_path(app.script()))
            .arg("90")
            .env("PYTHONPATH", packages)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONHOME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start unshare: {e}"))?;
        let pid = child.id();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server { child, pid, port: String::new(), stderr, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if let Some(port) = line.strip_prefix("ready port=") {
                server.port = port.trim().to_string();
                return Ok(server);
            }
        }
        Err(format!("{} {} printed no ready line; its stderr:\n{}", py.describe(), app.script(), server.stderr_text()))
    }

    fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        stop_child(&mut self.child, libc::SIGTERM, Duration::from_secs(10));
    }
}

/// The frames of a CPython `--collapsed` line: `tid:N;<task>:NAME:0;file.py:qual:LINE;...`.
#[derive(Debug)]
struct CpyStack {
    frames: Vec<(String, String)>,
    count: u64,
}

/// `(file, function)` pairs of each CPython collapsed line after its `tid:` frame.
fn parse_cpython(text: &str) -> Vec<CpyStack> {
    text.lines()
        .filter_map(|line| {
            let (stack, n) = line.rsplit_once(' ')?;
            let count = n.parse().ok()?;
            let frames = stack
                .split(';')
                .filter(|f| !f.starts_with("tid:"))
                .map(|f| {
                    let rest = f.rsplit_once(':').map_or(f, |(r, _line)| r);
                    match rest.split_once(':') {
                        Some((file, func)) => (file.to_string(), func.to_string()),
                        None => (String::new(), rest.to_string()),
                    }
                })
                .collect();
            Some(CpyStack { frames, count })
        })
        .collect()
}

fn ends_with_handler(names: &[&str]) -> bool {
    names.len() >= HANDLER.len()
        && names[names.len() - HANDLER.len()..].iter().zip(HANDLER).all(|(n, h)| name_matches(n, h))
}

fn has_machinery(names: &[&str]) -> bool {
    names.iter().any(|n| MACHINERY.iter().any(|m| name_matches(n, m)))
}

/// A share in percent (0 of 0 is 0).
fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 }
}

/// What pyperch's recording shows for the server.
struct PyperchShares {
    leaf: u64,
    chained: u64,
    /// aiohttp: chained samples with the connection's task above the request's task.
    conn_above: u64,
    /// `task Task-<n>` frames (auto names not aggregated), in samples of any leaf.
    unaggregated: u64,
    /// cpu_work samples with a task frame followed by another function than one of the
    /// app's task coroutines (a stack cut inside a coroutine chain: it never happened).
    wrong: u64,
    examples: Vec<String>,
    wrong_examples: Vec<String>,
}

fn is_auto_task_name(frame: &str) -> bool {
    frame.strip_prefix("task Task-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn pyperch_shares(profile: &Profile, app: App) -> PyperchShares {
    let mut r = PyperchShares { leaf: 0, chained: 0, conn_above: 0, unaggregated: 0, wrong: 0, examples: vec![], wrong_examples: vec![] };
    let mut sorted: Vec<&Stack> = profile.stacks.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
    for s in sorted {
        let frames = s.python_frames();
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        if names.iter().any(|n| is_auto_task_name(n)) {
            r.unaggregated += s.count;
        }
        if !s.leaf_is("cpu_work") {
            continue;
        }
        r.leaf += s.count;
        let tasks: Vec<usize> = (0..names.len()).filter(|&i| names[i].starts_with("task ")).collect();
        if tasks.iter().any(|&i| names.get(i + 1).is_none_or(|n| !app.task_coroutines().contains(n))) {
            r.wrong += s.count;
            if r.wrong_examples.len() < 3 {
                r.wrong_examples.push(format!("{} {}", s.frames.join(";"), s.count));
            }
            continue;
        }
        let chained = tasks.first() == Some(&0) && ends_with_handler(&names) && !has_machinery(&names);
        if !chained {
            continue;
        }
        r.chained += s.count;
        if r.examples.len() < 2 {
            r.examples.push(format!("{} {}", s.frames.join(";"), s.count));
        }
        // The connection's task, then its coroutine RequestHandler.start (web_protocol.py),
        // then (further down) the request's task.
        let conn = tasks.iter().any(|&i| {
            i + 1 < tasks[tasks.len() - 1]
                && frames[i + 1].name == "RequestHandler.start"
                && frames[i + 1].file.ends_with("web_protocol.py")
        });
        if conn {
            r.conn_above += s.count;
        }
    }
    r
}

/// CPython's profiler's share: of its `cpu_work`-leaf samples, those whose stack starts
/// with a `<task>` frame, ends with the handler's frames and holds no loop machinery.
struct CpythonShares {
    leaf: u64,
    chained: u64,
    /// Samples whose stacks hold two or more `<task>` frames.
    two_levels: u64,
    examples: Vec<String>,
}

fn cpython_shares(text: &str) -> CpythonShares {
    let mut stacks = parse_cpython(text);
    stacks.sort_by_key(|s| std::cmp::Reverse(s.count));
    let mut r = CpythonShares { leaf: 0, chained: 0, two_levels: 0, examples: vec![] };
    for s in &stacks {
        let names: Vec<&str> = s.frames.iter().map(|(_, f)| f.as_str()).collect();
        if names.last().is_none_or(|n| !name_matches(n, "cpu_work")) {
            continue;
        }
        r.leaf += s.count;
        let tasks = s.frames.iter().filter(|(file, _)| file == "<task>").count();
        if tasks >= 2 {
            r.two_levels += s.count;
        }
        let chained = s.frames.first().is_some_and(|(file, _)| file == "<task>") && ends_with_handler(&names) && !has_machinery(&names);
        if chained {
            r.chained += s.count;
            if r.examples.len() < 2 {
                let line = s.frames.iter().map(|(f, n)| format!("{f}:{n}")).collect::<Vec<_>>().join(";");
                r.examples.push(format!("{line} {}", s.count));
            }
        }
    }
    r
}

fn server_under_load(label: &str, app: App) {
    let Some(py) = python(label) else { return };
    // The packages as the server sees them, and where they are on the host.
    let (packages, on_host) = match (&py.rootfs, label) {
        (Some(rootfs), _) => (server_packages_dir(&py), rootfs.join(server_packages_dir(&py).trim_start_matches('/'))),
        (None, FT_3_14) => match std::env::var_os("PYPERCH_FT_SERVER_PACKAGES").filter(|v| !v.is_empty()) {
            Some(dir) => (PathBuf::from(&dir).to_string_lossy().into_owned(), PathBuf::from(dir)),
            None => return skip("PYPERCH_FT_SERVER_PACKAGES is not set (`cargo xtask test` installs the servers' cp314t wheels where PYPERCH_FT_PYTHON is set)"),
        },
        (None, _) => return skip(format!("{} is not run under chroot; the servers are installed in the sid rootfs", py.describe())),
    };
    if !on_host.join("aiohttp").is_dir() || !on_host.join("uvicorn").is_dir() {
        skip(format!("{} has no aiohttp/uvicorn (installed by `cargo xtask test`)", on_host.display()));
        return;
    }
    if !is_root() {
        skip("unshare, mount and pyperch need root");
        return;
    }
    let server = Server::start(&py, app, py.rootfs.as_deref(), &packages).unwrap_or_else(|e| panic!("{e}"));
    let pid = server.pid.to_string();
    let mut load = Workload::spawn(&py, "server_load.py", &[&server.port, "4", "90"]).unwrap_or_else(|e| panic!("{e:#}"));
    // Let the handlers' code warm up before the recordings.
    thread::sleep(Duration::from_millis(500));

    let reference = py.version() >= (3, 15);
    let cpy_out = server.dir.host_path("cpython.collapsed");
    let cpy = reference.then(|| {
        let mut cmd = Command::new("nsenter");
        cmd.args(["--target", &pid, "--mount", "--root", "--wd=/", "--"])
            .arg(&py.exe)
            .args(["-m", "profiling.sampling", "attach", "--async-aware", "-r", RATE, "-d", SECONDS, "--collapsed", "-o"])
            .arg(server.dir.guest_path("cpython.collapsed"))
            .arg(&pid);
        Running::start(cmd).expect("cannot start nsenter")
    });
    let rec = record(&["--pid", &pid, "--duration", SECONDS, "--rate", RATE, "--async", "--stats"]);
    let cpy = cpy.map(|c| c.finish(Duration::from_secs(60)));
    load.terminate();
    let load_done = load.stdout_lines().join(" | ");
    let d = format!("{}\n--- server stderr:\n{}\n--- load: {load_done}", rec.diag_pid(server.pid), server.stderr_text());
    rec.assert_ok();

    let mine = rec.profile.for_pid(server.pid);
    let p = pyperch_shares(&mine, app);
    let asyncio_stats = rec.run.stderr.lines().find(|l| l.trim_start().starts_with("asyncio: ")).unwrap_or("(no asyncio line)").trim().to_string();
    let p_share = pct(p.chained, p.leaf);
    note(format!(
        "{}, {}: pyperch: {} of {} cpu_work samples chained ({p_share:.1} %){}; unaggregated `task Task-<n>` in {} samples; task frames cut inside a coroutine chain (wrong) in {}; --stats {asyncio_stats}",
        py.describe(),
        app.script(),
        p.chained,
        p.leaf,
        if app == App::Aiohttp { format!(", connection task above the request's in {}", p.conn_above) } else { String::new() },
        p.unaggregated,
        p.wrong,
    ));
    note(format!("load: {load_done}"));
    for e in &p.examples {
        note(format!("pyperch example: {e}"));
    }
    for e in &p.wrong_examples {
        note(format!("pyperch WRONG: {e}"));
    }

    let mut reference_share = None;
    if let Some(run) = &cpy {
        let cd = run.diag();
        assert!(run.success(), "CPython's profiler failed on the server{cd}{d}");
        let text = fs::read_to_string(&cpy_out).unwrap_or_else(|e| panic!("CPython's profiler wrote no {}: {e}{cd}", cpy_out.display()));
        let c = cpython_shares(&text);
        let c_share = pct(c.chained, c.leaf);
        note(format!(
            "CPython's profiler: {} of {} cpu_work samples chained ({c_share:.1} %), {} with two or more task levels",
            c.chained, c.leaf, c.two_levels
        ));
        for e in &c.examples {
            note(format!("CPython example: {e}"));
        }
        // Its own sanity: enough samples, and the task form on nearly all of them.
        assert!(c.leaf >= 100, "CPython's profiler has only {} cpu_work samples{cd}", c.leaf);
        assert!(c_share >= 90.0, "CPython's profiler shows the task form in only {c_share:.1} % of cpu_work samples{cd}");
        reference_share = Some(c_share);
    } else {
        note("no CPython profiler before 3.15: pyperch's share alone is judged");
    }

    let shares = format!(
        "pyperch {p_share:.1} % ({} of {}){}",
        p.chained,
        p.leaf,
        reference_share.map(|c| format!(", CPython's profiler {c:.1} %")).unwrap_or_default()
    );
    assert!(p.leaf >= 100, "only {} samples in cpu_work ({shares}){d}", p.leaf);
    assert!(p.wrong == 0, "{} cpu_work samples show a task frame not followed by a task's coroutine ({:?}; stacks that never happened; {shares}): {:?}{d}", p.wrong, app.task_coroutines(), p.wrong_examples);
    assert!(p_share >= 95.0, "the task chain is shown in too few cpu_work samples: {shares}; --stats {asyncio_stats}{d}");
    if let Some(c) = reference_share {
        assert!(p_share + 5.0 >= c, "pyperch is more than 5 points below CPython's profiler: {shares}{d}");
    }
    assert!(p.unaggregated == 0, "{} samples show auto-named `task Task-<n>` frames (per-request tasks do not aggregate; {shares}){d}", p.unaggregated);
    if app == App::Aiohttp {
        assert!(
            p.conn_above * 100 >= p.chained * 95,
            "the connection's task (RequestHandler.start) is above the request's task in only {} of {} chained samples{d}",
            p.conn_above,
            p.chained
        );
    }
}

#[test]
fn async_server_aiohttp_sid_3_14() {
    server_under_load("sid-3.14", App::Aiohttp);
}

#[test]
fn async_server_aiohttp_sid_3_15() {
    server_under_load("sid-3.15", App::Aiohttp);
}

#[test]
fn async_server_uvicorn_sid_3_14() {
    server_under_load("sid-3.14", App::Uvicorn);
}

#[test]
fn async_server_uvicorn_sid_3_15() {
    server_under_load("sid-3.15", App::Uvicorn);
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` with the servers' cp314t wheels (issue #30:
/// a real PyPI program on a 3.14t, its C extensions built for free threading; skipped, saying
/// so, where either is missing). No CPython profiler runs on 3.14: pyperch's share is judged
/// alone, as on sid 3.14.
#[test]
fn async_server_aiohttp_ft_3_14() {
    server_under_load(FT_3_14, App::Aiohttp);
}

#[test]
fn async_server_uvicorn_ft_3_14() {
    server_under_load(FT_3_14, App::Uvicorn);
}
