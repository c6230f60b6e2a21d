//! `pyperch top` against real interpreters, inside tmux (the screen is read with
//! `tmux capture-pane`), every version 3.8-3.15 found.
//!
//! split.py spends ~30 % of its CPU time in leaf_a and ~70 % in leaf_b and measures the split
//! itself; the screen must show both with shares within 5 points of that after a few seconds.
//! Keys change the view, `q` and SIGTERM end top with the terminal restored (tmux's
//! `alternate_on` back to 0).

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use pyperch_tests::*;

static SESSION: AtomicU32 = AtomicU32::new(0);

/// A tmux session running one command in a 200x50 pane; killed on drop. After the command
/// ends the pane shows `EXITED <status>` and stays open.
struct Tmux {
    name: String,
    tmux: PathBuf,
}

impl Tmux {
    fn start(command: &str) -> Option<Self> {
        let Some(tmux) = find_program("tmux") else {
            skip("tmux is not installed (`cargo xtask test` installs it)");
            return None;
        };
        let name = format!("pyperch-top-{}-{}", std::process::id(), SESSION.fetch_add(1, Ordering::Relaxed));
        let shell = format!("{command}; echo EXITED $?; sleep 120");
        let status = Command::new(&tmux)
            .args(["new-session", "-d", "-s", &name, "-x", "200", "-y", "50", &shell])
            .status()
            .expect("run tmux");
        assert!(status.success(), "tmux new-session failed");
        Some(Self { name, tmux })
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new(&self.tmux).args(args).output().expect("run tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", &self.name])
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.name, keys]);
    }

    fn alternate_on(&self) -> bool {
        self.tmux(&["display-message", "-p", "-t", &self.name, "#{alternate_on}"]).trim() == "1"
    }

    /// The pid of the command (the child of the pane's shell).
    fn command_pid(&self) -> Option<u32> {
        let shell: u32 = self.tmux(&["display-message", "-p", "-t", &self.name, "#{pane_pid}"]).trim().parse().ok()?;
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// Polls the screen until `ok` accepts it (or `timeout`); returns the last screen.
    fn wait_for(&self, timeout: Duration, ok: impl Fn(&str) -> bool) -> (bool, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return (true, screen);
            }
            if Instant::now() >= deadline {
                return (false, screen);
            }
            sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new(&self.tmux).args(["kill-session", "-t", &self.name]).status();
    }
}

/// OWN% (window) of the row whose function is `name`.
fn own_share(screen: &str, name: &str) -> Option<f64> {
    screen.lines().find_map(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        (fields.get(4) == Some(&name)).then(|| fields[0].parse().ok()).flatten()
    })
}

/// "samples: N in the last" of the header.
fn window_samples(screen: &str) -> u64 {
    screen
        .split("samples: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn screen_shares_keys_quit(label: &str) {
    let Some(py) = python(label) else { return };
    let mut w = Workload::spawn(&py, "split.py", &["{dir}/split.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let bin = pyperch_bin();
    let Some(tmux) = Tmux::start(&format!("{} top --pid {} --rate 499", bin.display(), w.pid)) else { return };
    let what = py.describe();
    // About 3 s of samples (more on a loaded machine: at least 300 samples).
    sleep(Duration::from_secs(3));
    let (enough, screen) = tmux.wait_for(Duration::from_secs(30), |s| window_samples(s) >= 300);
    assert!(enough, "{what}: top did not show 300 samples in 33 s:\n{screen}");
    let status = w.terminate();
    assert!(status.is_some_and(|s| s.success()), "{what}: split.py did not exit cleanly");
    let measured = w.read_json("split.json").unwrap_or_else(|e| panic!("{e:#}"));
    let a_secs = json_f64(&measured, &["leaf_a"]).unwrap();
    let b_secs = json_f64(&measured, &["leaf_b"]).unwrap();
    let truth = 100.0 * a_secs / (a_secs + b_secs);
    let a = own_share(&screen, "leaf_a").unwrap_or_else(|| panic!("{what}: no leaf_a row:\n{screen}"));
    let b = own_share(&screen, "leaf_b").unwrap_or_else(|| panic!("{what}: no leaf_b row:\n{screen}"));
    let shown = 100.0 * a / (a + b);
    note(format!("{what}: leaf_a {a:.1} %, leaf_b {b:.1} % on screen; leaf_a share {shown:.1} % vs measured {truth:.1} %"));
    assert!((shown - truth).abs() <= 5.0, "{what}: leaf_a share {shown:.1} % vs measured {truth:.1} %:\n{screen}");
    assert!(a + b >= 90.0, "{what}: the leaves run nearly all the time, shown {a} + {b}:\n{screen}");
    assert!(screen.contains("split.py"), "{what}: file column:\n{screen}");
    assert!(screen.contains(&format!("1 Python processes: {} ", w.pid)), "{what}: header:\n{screen}");
    assert!(screen.contains("rate 499 Hz"), "{what}: header:\n{screen}");
    assert!(tmux.alternate_on(), "{what}: full screen expected");

    // Keys.
    tmux.keys("l");
    let (ok, s) = tmux.wait_for(Duration::from_secs(5), |s| s.contains("view: lines") && s.contains("split.py:"));
    assert!(ok, "{what}: `l` shows lines:\n{s}");
    tmux.keys("s");
    let (ok, s) = tmux.wait_for(Duration::from_secs(5), |s| s.contains("sort: total (window)"));
    assert!(ok, "{what}: `s` changes the sort order:\n{s}");
    tmux.keys("f");
    let (ok, s) = tmux.wait_for(Duration::from_secs(5), |s| s.contains(&format!("process: {}", w.pid)));
    assert!(ok, "{what}: `f` shows one process:\n{s}");
    tmux.keys("p");
    let (ok, s) = tmux.wait_for(Duration::from_secs(5), |s| s.contains("[PAUSED]"));
    assert!(ok, "{what}: `p` pauses:\n{s}");
    tmux.keys("q");
    let (ok, s) = tmux.wait_for(Duration::from_secs(10), |s| s.contains("EXITED 0"));
    assert!(ok, "{what}: `q` ends top with status 0:\n{s}");
    assert!(!tmux.alternate_on(), "{what}: the terminal is back from the alternate screen");
    assert!(!s.contains("OWN%"), "{what}: the table is gone after q:\n{s}");
}

#[test]
fn top_screen_3_8() {
    screen_shares_keys_quit("3.8");
}

#[test]
fn top_screen_3_9() {
    screen_shares_keys_quit("3.9");
}

#[test]
fn top_screen_3_10() {
    screen_shares_keys_quit("3.10");
}

#[test]
fn top_screen_3_11() {
    screen_shares_keys_quit("3.11");
}

#[test]
fn top_screen_3_12() {
    screen_shares_keys_quit("3.12");
}

#[test]
fn top_screen_3_13() {
    screen_shares_keys_quit("3.13");
}

#[test]
fn top_screen_sid_3_13() {
    screen_shares_keys_quit("sid-3.13");
}

#[test]
fn top_screen_sid_3_14() {
    screen_shares_keys_quit("sid-3.14");
}

#[test]
fn top_screen_sid_3_15() {
    screen_shares_keys_quit("sid-3.15");
}

/// The free-threaded 3.14 of `PYPERCH_FT_PYTHON` (skipped, saying so, where it is unset).
#[test]
fn top_screen_ft_3_14() {
    screen_shares_keys_quit(FT_3_14);
}

/// Whole host (no --pid): the workload is among the processes; SIGTERM ends top with the
/// terminal restored.
#[test]
fn top_whole_host_and_sigterm() {
    let Some(py) = first_python(&["sid-3.14", "3.12", "3.11"]) else { return };
    let w = Workload::spawn(&py, "split.py", &["{dir}/split.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let Some(tmux) = Tmux::start(&format!("{} top --rate 199", pyperch_bin().display())) else { return };
    let (ok, s) = tmux.wait_for(Duration::from_secs(30), |s| s.contains(&format!("{} ", w.pid)) && s.contains("leaf_b"));
    assert!(ok, "whole-host top does not show pid {} and leaf_b:\n{s}", w.pid);
    assert!(tmux.alternate_on());
    let pid = tmux.command_pid().expect("pid of pyperch in the pane");
    // SAFETY: kill(2) on the pyperch this test started.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let (ok, s) = tmux.wait_for(Duration::from_secs(10), |s| s.contains("EXITED 0"));
    assert!(ok, "SIGTERM did not end top with status 0:\n{s}");
    assert!(!tmux.alternate_on(), "the terminal is back from the alternate screen after SIGTERM");
    assert!(!s.contains("OWN%"), "the table is gone after SIGTERM:\n{s}");
}

/// Not a terminal: one clear sentence pointing to --plain/--once; --once prints one table.
#[test]
fn top_plain_and_not_a_terminal() {
    let Some(py) = first_python(&["sid-3.14", "3.12", "3.11"]) else { return };
    let w = Workload::spawn(&py, "split.py", &["{dir}/split.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    let run = pyperch(&["top", "--pid", &pid], Duration::from_secs(30));
    run.assert_clear_error();
    assert!(run.error_line().contains("--plain"), "{}", run.diag());
    let once = pyperch(&["top", "--pid", &pid, "--once", "--window", "2", "--rate", "199"], Duration::from_secs(60));
    let d = once.diag();
    assert!(once.success(), "top --once failed{d}");
    assert!(once.stdout.starts_with("pyperch top: 1 Python processes"), "{d}");
    assert!(once.stdout.contains("leaf_b") && once.stdout.contains("leaf_a"), "{d}");
    assert_eq!(once.stdout.matches("pyperch top:").count(), 1, "one table{d}");
}

/// `top --mode wall`: off-CPU time is shown beside on-CPU time (`<off-cpu: sleep>` under the
/// sleeping function, nanoseconds in the header); the default cpu mode shows none of it.
#[test]
fn top_wall_mode() {
    let Some(py) = first_python(&["3.12", "sid-3.14", "3.11"]) else { return };
    let w = Workload::spawn(&py, "time_modes.py", &["{dir}/result.json", "120", "{dir}/go"]).unwrap_or_else(|e| panic!("{e:#}"));
    std::fs::write(w.dir.host_path("go"), b"go").expect("cannot write the go file");
    let pid = w.pid.to_string();
    let args = |mode: &str| -> Vec<String> {
        ["top", "--pid", &pid, "--once", "--window", "3", "--rate", "199", "--rows", "60", "--mode", mode]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let run_mode = |mode: &str| {
        let a = args(mode);
        pyperch(&a.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(60))
    };
    let wall = run_mode("wall");
    let cpu = run_mode("cpu");
    let d = format!("{}{}", wall.diag(), cpu.diag());
    assert!(wall.success() && cpu.success(), "top --once failed{d}");
    assert!(wall.stdout.contains("mode wall") && wall.stdout.contains(" ns in the last 3 s"), "wall header{d}");
    for f in ["<off-cpu: sleep>", "sleep_part", "spin_part", "wait_lock", "read_pipe"] {
        assert!(wall.stdout.contains(f), "top --mode wall does not show {f}{d}");
    }
    assert!(cpu.stdout.contains("mode cpu") && cpu.stdout.contains(" samples in the last 3 s"), "cpu header{d}");
    assert!(cpu.stdout.contains("spin_part") && !cpu.stdout.contains("<off-cpu"), "top --mode cpu shows off-CPU time{d}");
}
