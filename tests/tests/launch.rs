//! `pyperch record ... -- COMMAND`: launches the command, profiles it (and its Python
//! children) until it exits, and exits with the command's status.

use std::{ffi::OsString, time::Duration};

use pyperch_tests::*;

const HOST_PREFERENCE: [&str; 6] = ["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"];
const SID_PREFERENCE: [&str; 3] = ["sid-3.15", "sid-3.14", "sid-3.13"];

/// `pyperch record --duration 30 --format collapsed --output F -- PYTHON SCRIPT ARGS`.
fn launch(py: &Python, dir: &WorkDir, script: &str, args: &[&str]) -> Recording {
    let mut argv: Vec<String> = vec!["--duration".into(), "30".into(), "--".into()];
    argv.extend(
        py.argv()
            .into_iter()
            .map(|a: OsString| a.to_string_lossy().into_owned()),
    );
    argv.push(dir.guest_path(script));
    argv.extend(args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    record(&argv)
}

fn check_launch(py: &Python) {
    let dir = WorkDir::new(py, "launch").unwrap_or_else(|e| panic!("{e:#}"));
    let rec = launch(py, &dir, "launch.py", &[]);
    let d = rec.diag();
    assert!(!rec.run.timed_out(), "pyperch did not return{d}");
    assert!(
        rec.run.elapsed < Duration::from_secs(20),
        "pyperch took {:.1} s although the command ends after about 2 s (duration 30){d}",
        rec.run.elapsed.as_secs_f64()
    );
    assert_eq!(
        rec.run.code(),
        Some(3),
        "pyperch should exit with the command's status 3{d}"
    );
    assert!(rec.output.is_file(), "no profile written{d}");
    assert!(
        rec.profile.malformed.is_empty(),
        "malformed collapsed lines{d}"
    );
    assert!(
        rec.profile.with_function("launch_busy") > 0,
        "{}: no launch_busy in the profile{d}",
        py.describe()
    );
}

#[test]
fn launch_exit_status_and_profile() {
    let Some(py) = first_python(&HOST_PREFERENCE) else {
        return;
    };
    check_launch(&py);
}

#[test]
fn launch_under_chroot() {
    let Some(py) = first_python(&SID_PREFERENCE) else {
        return;
    };
    check_launch(&py);
}

/// The launched command is a Python parent that runs launch.py in a child interpreter:
/// the child's samples are in the profile, under the child's pid.
#[test]
fn launch_profiles_python_children() {
    let Some(py) = first_python(&HOST_PREFERENCE) else {
        return;
    };
    let dir = WorkDir::new(&py, "launch-children").unwrap_or_else(|e| panic!("{e:#}"));
    let rec = launch(&py, &dir, "launch_parent.py", &[]);
    let d = rec.diag();
    assert!(!rec.run.timed_out(), "pyperch did not return{d}");
    assert_eq!(
        rec.run.code(),
        Some(3),
        "pyperch should exit with the command's status 3{d}"
    );
    assert!(
        rec.profile.malformed.is_empty(),
        "malformed collapsed lines{d}"
    );
    let busy = rec.profile.filter(|s| s.has_function("launch_busy"));
    assert!(
        busy.total() > 0,
        "{}: no launch_busy from the child interpreter in the profile{d}",
        py.describe()
    );
    // launch_parent.py prints "child <pid>"; pyperch normally passes the command's stdout on.
    let child_pid = rec
        .run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("child ")?.trim().parse::<u32>().ok());
    match child_pid {
        Some(pid) => assert_eq!(
            busy.pids(),
            [pid].into(),
            "launch_busy should be attributed to the child pid {pid} only{d}"
        ),
        None => {
            note("the command's stdout did not come through pyperch; not checking the child's pid")
        }
    }
}

/// `record --rate 1000 [EXTRA] -- PYTHON first_line.py [ARGS]` (the program ends by itself).
fn launch_first_line(py: &Python, extra: &[&str], args: &[&str]) -> Recording {
    let dir = WorkDir::new(py, "first-line").unwrap_or_else(|e| panic!("{e:#}"));
    let mut argv: Vec<String> = vec!["--rate".into(), "1000".into(), "--stats".into()];
    argv.extend(extra.iter().map(|a| a.to_string()));
    argv.push("--".into());
    argv.extend(py.argv().into_iter().map(|a: OsString| a.to_string_lossy().into_owned()));
    argv.push(dir.guest_path("first_line.py"));
    argv.extend(args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    record(&argv)
}

/// Issue #26, "a launched program is sampled from its first line": a script whose first
/// statement is a 50 ms busy loop (first_line_spin), after which it exits. The command is
/// held before its exec until its perf events are open, and its interpreter is registered
/// as soon as it is initialised: the loop is in the profile. Before, discovery found the
/// interpreter on its 100 ms beat, and such a program left an empty profile.
fn check_first_line(label: &str) {
    let Some(py) = python(label) else {
        return;
    };
    let rec = launch_first_line(&py, &[], &[]);
    let d = rec.diag();
    assert_eq!(rec.run.code(), Some(0), "{}: pyperch should exit with the command's status 0{d}", py.describe());
    assert!(rec.profile.malformed.is_empty(), "malformed collapsed lines{d}");
    assert!(
        rec.profile.with_function("first_line_spin") > 0,
        "{}: the first statement's busy loop (first_line_spin) is not in the profile{d}",
        py.describe()
    );
}

#[test]
fn first_line_sampled_3_9() {
    check_first_line("3.9");
}

#[test]
fn first_line_sampled_3_12() {
    check_first_line("3.12");
}

#[test]
fn first_line_sampled_sid_3_15() {
    check_first_line("sid-3.15");
}
