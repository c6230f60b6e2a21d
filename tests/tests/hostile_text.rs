//! Issue #9 items 5 and 6: text from a target never reaches a terminal raw, text that is
//! not UTF-8 never hides a live process, and `--output` never clobbers or follows what is at
//! its path.
//!
//! The hostile process is a real CPython started from a copy of its executable whose file
//! name holds an invalid UTF-8 byte, an escape sequence, a bell and a newline (so its
//! `/proc/PID/exe`, its `/proc/PID/maps` line and its command name are all hostile), running
//! a function whose name and file name hold escape sequences, C1 controls, bidi overrides,
//! `;` and newlines (`workloads/hostile.py`).

use std::{
    ffi::OsStr,
    fs,
    os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use pyperch_tests::*;

/// Pythons run straight from the host (a copy of the executable must run).
const HOST_PYTHONS: [&str; 6] = ["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"];

/// The copied executable's file name: 13 bytes, so it is also the whole command name.
const HOSTILE_EXE: &[u8] = b"py\xff\x1b[31m\x07\nexe";
/// How pyperch shows it.
const HOSTILE_EXE_SHOWN: &str = "py\\xff\\x1b[31m\\x07\\nexe";

/// A process title of 15 bytes cut inside a three-byte character (`€` is e2 82 ac).
const TRUNCATED_COMM: &[u8] = b"pyt-\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82";
const TRUNCATED_COMM_SHOWN: &str = "pyt-€€€\\xe2\\x82";

/// A scratch folder, removed on drop unless the test failed.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir()
            .join("pyperch-tests")
            .join(format!("{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("cannot create a scratch folder");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .expect("read scratch folder")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Asserts that `text` (what pyperch printed on `what`) holds no raw control character but
/// the line break, no C1 control, no bidi override or line separator, and no byte that was
/// not UTF-8 (the helpers decode lossily, so one would show as U+FFFD).
fn assert_clean(text: &str, what: &str, d: &str) {
    let bad: Vec<(usize, char)> = text
        .char_indices()
        .filter(|&(_, c)| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{fffd}')
        })
        .collect();
    assert!(bad.is_empty(), "raw control or invalid characters on {what}: {bad:?}{d}");
}

/// `python` started from a copy of its executable named [`HOSTILE_EXE`] in `dir`.
fn hostile_python(py: &Python, dir: &Scratch) -> Python {
    let copy = dir.0.join(OsStr::from_bytes(HOSTILE_EXE));
    fs::copy(&py.exe, &copy).expect("cannot copy the interpreter");
    Python { exe: copy, ..py.clone() }
}

/// The frame texts of every `<title>` of an SVG, read by a real XML parser (expat, through
/// the test interpreter's xml.etree); panics if the SVG does not parse.
fn svg_titles(py: &Python, svg: &Path, d: &str) -> Vec<String> {
    let script = "import sys, json, xml.etree.ElementTree as ET\n\
                  root = ET.parse(sys.argv[1]).getroot()\n\
                  print(json.dumps([e.text or '' for e in root.iter() if e.tag.endswith('title')]))\n";
    let out = py.command().args(["-c", script]).arg(svg).output().expect("run the XML parser");
    assert!(
        out.status.success(),
        "the SVG does not parse as XML: {}{d}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("titles as JSON")
}

#[test]
fn hostile_names_are_escaped_and_profiles_stay_well_formed() {
    let Some(py) = first_python(&HOST_PYTHONS) else { return };
    let dir = Scratch::new("hostile-names");
    let hostile = hostile_python(&py, &dir);
    let w = Workload::spawn(&hostile, "hostile.py", &["-", "120"]).expect("start the hostile workload");
    let comm = fs::read(format!("/proc/{}/comm", w.pid)).expect("comm");
    assert_eq!(comm, [HOSTILE_EXE, b"\n"].concat(), "the command name is the executable's file name");

    // `list`: the executable cell is escaped, nothing raw reaches the terminal.
    let list = pyperch(&["list"], Duration::from_secs(60));
    let d = list.diag();
    assert!(list.success(), "pyperch list failed{d}");
    assert_clean(&list.stdout, "list's stdout", &d);
    assert_clean(&list.stderr, "list's stderr", &d);
    let row = list
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&w.pid.to_string()))
        .unwrap_or_else(|| panic!("pid {} is not listed{d}", w.pid));
    assert!(row.contains(HOSTILE_EXE_SHOWN), "the executable is not shown escaped: {row:?}{d}");
    assert!(row.ends_with("ok"), "the hostile process is not profilable: {row:?}{d}");

    // `record --stats` to an SVG: stderr clean, the comm escaped, the SVG parses.
    let pid = w.pid.to_string();
    let svg = dir.path("hostile.svg");
    let svg_arg = svg.to_str().expect("utf-8 path");
    let run = pyperch(
        &["record", "--pid", &pid, "--duration", "3", "--stats", "-o", svg_arg],
        Duration::from_secs(90),
    );
    let d = run.diag();
    assert!(run.success(), "pyperch record failed{d}");
    assert_clean(&run.stderr, "record's stderr", &d);
    assert_clean(&run.stdout, "record's stdout", &d);
    let stats_line = format!("process {pid} ({HOSTILE_EXE_SHOWN}, Python");
    assert!(run.stderr.contains(&stats_line), "no `{stats_line}` line in --stats{d}");
    let titles = svg_titles(&py, &svg, &d);
    let leaf = titles.iter().find(|t| t.starts_with("hostile_leaf"));
    assert!(leaf.is_some(), "the SVG lacks the hostile function; titles: {titles:?}{d}");
    assert!(
        titles.iter().any(|t| t.contains("(/tmp/evil")),
        "the SVG lacks the hostile file name; titles: {titles:?}{d}"
    );

    // Collapsed: one stack per line, the renamed function as one frame.
    let rec = record(&["--pid", &pid, "--duration", "3"]);
    let d = rec.diag();
    rec.assert_ok();
    assert_clean(&rec.run.stderr, "record's stderr", &d);
    assert_clean(&rec.collapsed.replace(['\u{202e}', '\u{2028}'], ""), "the collapsed file", &d);
    assert_eq!(rec.collapsed.lines().count(), rec.profile.stacks.len(), "one stack per line{d}");
    let mine = rec.profile.for_pid(w.pid);
    let hostile_leaf = mine.count(|s| {
        s.python_frames()
            .last()
            .is_some_and(|f| f.name.starts_with("hostile_leaf ]0,pwned") && f.file.starts_with("/tmp/evil [31m  file"))
    });
    assert!(
        hostile_leaf > 0,
        "no sample ends in the hostile function (with `;` as `,` and controls as spaces){d}"
    );
}

#[test]
fn collapsed_profile_on_a_terminal_is_escaped() {
    let Some(py) = first_python(&HOST_PYTHONS) else { return };
    let w = Workload::spawn(&py, "hostile.py", &["-", "120"]).expect("start the hostile workload");
    // script(1) gives pyperch a terminal for stdout and stderr, and copies what it shows.
    let command = format!("{} record --pid {} --duration 3", pyperch_bin().display(), w.pid);
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &command, "/dev/null"]);
    let run = Running::start(script).expect("start script").finish(Duration::from_secs(90));
    let d = run.diag();
    assert!(run.success(), "pyperch record on a terminal failed{d}");
    // The terminal adds \r to line ends; the progress line is pyperch's own \r and erase-line.
    let shown = run.stdout.replace("\x1b[K", "").replace('\r', "");
    assert_clean(&shown, "the terminal", &d);
    let frame = "hostile_leaf ]0,pwned  [2J\\u{202e}\\u{2028} ,semi line (/tmp/evil [31m  file\\u{202e}.py:";
    assert!(shown.contains(frame), "the terminal does not show `{frame}`{d}");
}

#[test]
fn truncated_multibyte_comm_is_still_listed_and_profiled() {
    let Some(py) = first_python(&HOST_PYTHONS) else { return };
    let hex: String = TRUNCATED_COMM.iter().map(|b| format!("{b:02x}")).collect();
    let w = Workload::spawn(&py, "hostile.py", &[&hex, "120"]).expect("start the workload");
    let comm = fs::read(format!("/proc/{}/comm", w.pid)).expect("comm");
    assert_eq!(comm, [TRUNCATED_COMM, b"\n"].concat(), "prctl(PR_SET_NAME) took");
    let pid = w.pid.to_string();

    let list = pyperch(&["list"], Duration::from_secs(60));
    let d = list.diag();
    let row = list.stdout.lines().find(|l| l.split_whitespace().next() == Some(pid.as_str()));
    assert!(row.is_some_and(|r| r.ends_with("ok")), "pid {pid} is not listed as profilable{d}");

    // By pid, and by a --comm filter on the readable part of the name.
    for args in [vec!["--pid", pid.as_str()], vec!["--comm", "^pyt-€€€"]] {
        let mut argv = vec!["--duration", "3", "--stats"];
        argv.extend(args);
        let rec = record(&argv);
        let d = rec.diag_pid(w.pid);
        rec.assert_ok();
        assert_clean(&rec.run.stderr, "record's stderr", &d);
        let stats_line = format!("process {pid} ({TRUNCATED_COMM_SHOWN}, Python");
        assert!(rec.run.stderr.contains(&stats_line), "no `{stats_line}` line in --stats{d}");
        let mine = rec.profile.for_pid(w.pid);
        assert!(mine.total() > 0, "no samples of the process with a truncated name{d}");
        let first = &mine.stacks[0].frames[0];
        assert_eq!(first, &format!("{TRUNCATED_COMM_SHOWN} (pid {pid})"), "process frame{d}");
    }
}

#[test]
fn unsupported_process_warning_is_escaped() {
    let Some(old) = first_python(&["3.7", "3.6"]) else { return };
    let comm: &[u8] = b"old\x1b[5m\x07py\xe2\x80\xae\xff";
    let hex: String = comm.iter().map(|b| format!("{b:02x}")).collect();
    let w = Workload::spawn(&old, "hostile.py", &[&hex, "120"]).expect("start the old workload");
    let rec = record(&["--duration", "2", "--comm", "^old"]);
    let d = rec.diag();
    assert_clean(&rec.run.stderr, "record's stderr", &d);
    let warning = format!("pyperch: warning: skipping process {} (old\\x1b[5m\\x07py\\u{{202e}}\\xff): ", w.pid);
    assert!(
        rec.run.stderr.lines().any(|l| l.starts_with(&warning)),
        "no warning starting `{warning}`{d}"
    );
}

/// The `Umask:` of this process (`/proc/self/status`).
fn umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").expect("status");
    let value = status.lines().find_map(|l| l.strip_prefix("Umask:")).expect("Umask line");
    u32::from_str_radix(value.trim(), 8).expect("octal umask")
}

#[test]
fn output_file_survives_failures_and_is_never_followed() {
    let Some(py) = first_python(&HOST_PYTHONS) else { return };
    let dir = Scratch::new("output-file");
    let keep = dir.path("keep.txt");
    fs::write(&keep, "precious").expect("write");
    let keep_arg = keep.to_str().expect("utf-8");

    // A failed recording: --pid of a program that is not Python, started under a hostile
    // name (its comm), so the error line must be escaped too.
    let sleeper_name = "sl\x1b]0;x\x07\u{202e}p";
    let sleeper = dir.path(sleeper_name);
    std::os::unix::fs::symlink("/bin/sleep", &sleeper).expect("symlink");
    let sleep = KillOnDrop::spawn(sleeper.to_str().expect("utf-8"), &["300"]).expect("start sleep");
    let sleep_pid = sleep.pid().to_string();
    let run = pyperch(&["record", "--pid", &sleep_pid, "--duration", "2", "-o", keep_arg], Duration::from_secs(60));
    let d = run.diag();
    run.assert_clear_error();
    assert_clean(&run.stderr, "record's stderr", &d);
    assert_eq!(
        run.error_line(),
        format!(
            "error: process {sleep_pid} (sl\\x1b]0;x\\x07\\u{{202e}}p) is not a Python interpreter: no _PyRuntime in its executable or libraries"
        ),
        "error line{d}"
    );
    assert_eq!(fs::read_to_string(&keep).expect("read"), "precious", "a failed recording changed the file{d}");
    drop(sleep);
    fs::remove_file(&sleeper).expect("remove symlink");

    // An empty recording: a Python process that never runs on a CPU.
    let idle = Workload::spawn(&py, "idle.py", &["300"]).expect("start idle.py");
    let idle_pid = idle.pid.to_string();
    let run = pyperch(&["record", "--pid", &idle_pid, "--duration", "2", "-o", keep_arg], Duration::from_secs(60));
    let d = run.diag();
    assert!(run.success(), "an empty recording failed{d}");
    assert!(run.stderr.contains("nothing was written to"), "no warning that nothing was written{d}");
    assert_eq!(fs::read_to_string(&keep).expect("read"), "precious", "an empty recording changed the file{d}");
    drop(idle);

    // A symlink at the output path: refused before sampling, its target untouched.
    let busy = Workload::spawn(&py, "hostile.py", &["-", "120"]).expect("start the busy workload");
    let busy_pid = busy.pid.to_string();
    let victim = dir.path("victim.txt");
    fs::write(&victim, "victim").expect("write");
    let link = dir.path("link.txt");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    let run = pyperch(
        &["record", "--pid", &busy_pid, "--duration", "2", "-o", link.to_str().expect("utf-8")],
        Duration::from_secs(60),
    );
    let d = run.diag();
    run.assert_clear_error();
    assert!(run.error_line().contains("symbolic link"), "error line{d}");
    assert_eq!(fs::read_to_string(&victim).expect("read"), "victim", "the link's target changed{d}");
    assert!(fs::symlink_metadata(&link).expect("link").file_type().is_symlink(), "the link was replaced{d}");

    // A new file: mode 0666 minus the umask. A replaced file: its permission bits kept.
    let fresh = dir.path("fresh.txt");
    fs::set_permissions(&keep, fs::Permissions::from_mode(0o600)).expect("chmod");
    for out in [&fresh, &keep] {
        let run = pyperch(
            &["record", "--pid", &busy_pid, "--duration", "2", "-o", out.to_str().expect("utf-8")],
            Duration::from_secs(60),
        );
        let d = run.diag();
        assert!(run.success(), "recording to {} failed{d}", out.display());
        let text = fs::read_to_string(out).expect("read");
        assert!(text.contains("hostile_leaf"), "{} does not hold the profile{d}", out.display());
    }
    let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&fresh), 0o666 & !umask(), "mode of a new output file");
    assert_eq!(mode(&keep), 0o600, "mode of a replaced output file");

    // No temporary file is left behind by any of these runs.
    assert_eq!(dir.names(), ["fresh.txt", "keep.txt", "link.txt", "victim.txt"], "files in the output folder");
}
