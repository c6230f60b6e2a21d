//! Bad input and hostile conditions: each gives one clear `error: ` sentence (or carries on
//! where that is the right thing), never a panic.

use std::{process::Command, time::Duration};

use pyperch_tests::*;

const HOST_PREFERENCE: [&str; 6] = ["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"];

#[test]
fn not_root_is_a_clear_error() {
    if !is_root() {
        skip("this test drops root privileges, so it must start as root");
        return;
    }
    let copy = WorldRunnableCopy::new().unwrap_or_else(|e| panic!("{e:#}"));
    let bin = &copy.bin;
    let out = copy.dir.join("profile.collapsed");
    let mut cmd = if let Some(setpriv) = find_program("setpriv") {
        let mut c = Command::new(setpriv);
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ]);
        c
    } else if let Some(runuser) = find_program("runuser") {
        let mut c = Command::new(runuser);
        c.args(["-u", "nobody", "--"]);
        c
    } else {
        skip("neither setpriv nor runuser is installed");
        return;
    };
    cmd.arg(bin)
        .args([
            "record",
            "--duration",
            "2",
            "--format",
            "collapsed",
            "--output",
        ])
        .arg(&out)
        .current_dir("/");
    let run = Running::start(cmd)
        .expect("cannot start pyperch as nobody")
        .finish(Duration::from_secs(60));
    let d = run.diag();
    run.assert_clear_error();
    let lines = run.stderr_lines();
    assert_eq!(lines.len(), 1, "expected exactly one line on stderr{d}");
    let lower = lines[0].to_lowercase();
    assert!(
        lower.contains("root") || lower.contains("cap_bpf"),
        "the error should mention root or CAP_BPF{d}"
    );
}

/// `pyperch record --pid PID` for 30 s, which must fail with one clear line before sampling.
fn record_pid_refused(pid: &str) -> Run {
    let run = pyperch(
        &["record", "--pid", pid, "--duration", "30", "--format", "collapsed", "--output", "/dev/null"],
        Duration::from_secs(90),
    );
    let d = run.diag();
    run.assert_clear_error();
    assert!(
        run.elapsed < Duration::from_secs(20),
        "the error should come before sampling, not after the duration{d}"
    );
    run
}

#[test]
fn missing_pid_is_a_clear_error() {
    let pid = unused_pid(4_194_000).to_string();
    let run = record_pid_refused(&pid);
    let d = run.diag();
    assert!(
        run.error_line().contains(&pid),
        "the error should name pid {pid}{d}"
    );
}

#[test]
fn non_python_pid_is_a_clear_error() {
    let sleeper = KillOnDrop::spawn("sleep", &["60"]).expect("cannot start sleep");
    let pid = sleeper.pid().to_string();
    let run = record_pid_refused(&pid);
    let d = run.diag();
    let line = run.error_line().to_lowercase();
    assert!(
        line.contains("python") && (line.contains("not") || line.contains("no ")),
        "the error should say that pid {pid} (sleep) is not Python{d}"
    );
}

/// `record --pid P`: P exits 2 s into the recording; its samples are kept and the recording
/// ends with it (not at its 120 s `--duration`), saying so.
#[test]
fn target_exiting_mid_recording_keeps_its_samples() {
    let Some(py) = first_python(&HOST_PREFERENCE) else {
        return;
    };
    let mut w = Workload::spawn(&py, "exit_early.py", &["2"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    // The workload exits 2 s after it is told that sampling has begun (on a loaded machine
    // pyperch's start can take longer than the workload's whole life otherwise).
    // A long --duration: the recording ends when the process exits (`--pid` alone).
    let run = RecordRun::start(&["--pid", &pid, "--duration", "120", "--rate", "199"]);
    let sampling = run.wait_until_sampling(Duration::from_secs(60));
    // SAFETY: kill(2) with the pid of a child we spawned; no memory effects.
    unsafe { libc::kill(w.pid as libc::pid_t, libc::SIGUSR1) };
    let rec = run.finish();
    assert!(sampling, "pyperch did not start sampling within 60 s{}", rec.diag());
    let status = w.wait_exit(Duration::from_secs(30));
    rec.assert_ok();
    let d = rec.diag_pid(w.pid);
    assert!(
        status.is_some_and(|s| s.success()),
        "exit_early.py did not exit cleanly: {status:?}{d}"
    );
    assert!(
        rec.run.stderr.contains(&format!("(the recording ended: process {pid} has exited)")),
        "the recording did not end with the process{d}"
    );
    let mine = rec.profile.for_pid(w.pid);
    let named = mine.count(|s| {
        s.python_frames().iter().any(|f| {
            f.is("short_lived_busy") && f.file.ends_with("exit_early.py") && f.line.is_some()
        })
    });
    assert!(
        named > 0,
        "no samples of short_lived_busy (exit_early.py:LINE) from pid {pid}{d}"
    );
}

#[test]
fn unsupported_interpreter_is_listed_with_a_reason() {
    let Some(old) = first_python(&["3.7", "3.6"]) else {
        return;
    };
    let Some(good) = first_python(&HOST_PREFERENCE) else {
        return;
    };
    let old_w =
        Workload::spawn(&old, "spin.py", &["leaf_old", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let good_w = Workload::spawn(&good, "spin.py", &["leaf_green", "120"])
        .unwrap_or_else(|e| panic!("{e:#}"));

    let list = pyperch(&["list"], Duration::from_secs(60));
    let d = format!(
        "{}\n--- pid {} = {} (unsupported), pid {} = {} (supported)\n",
        list.diag(),
        old_w.pid,
        old.describe(),
        good_w.pid,
        good.describe()
    );
    assert!(list.success(), "pyperch list failed{d}");
    let row = |pid: u32| -> Option<String> {
        let p = pid.to_string();
        list.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(p.as_str()))
            .map(str::to_string)
    };
    let old_row = row(old_w.pid).unwrap_or_else(|| panic!("pid {} is not listed{d}", old_w.pid));
    let good_row = row(good_w.pid).unwrap_or_else(|| panic!("pid {} is not listed{d}", good_w.pid));
    let old_version = format!("{}.{}", old.major, old.minor);
    let good_version = format!("{}.{}", good.major, good.minor);
    assert!(
        old_row.contains(&old_version),
        "the row of the {old_version} process should show its version{d}"
    );
    assert!(
        old_row.to_lowercase().contains("support"),
        "the row of the {old_version} process should give the reason it is unsupported{d}"
    );
    assert!(
        good_row.contains(&good_version),
        "the row of the {good_version} process should show its version{d}"
    );
    let good_lower = good_row.to_lowercase();
    assert!(
        !good_lower.contains("unsupported") && !good_lower.contains("not supported"),
        "the {good_version} process should be listed as supported{d}"
    );

    let rec = record(&["--duration", "3", "--rate", "199"]);
    rec.assert_ok();
    let d = rec.diag_pid(good_w.pid);
    assert!(
        rec.profile.for_pid(good_w.pid).with_leaf("leaf_green") > 0,
        "the supported {} process beside an unsupported {} one should be profiled{d}",
        good.describe(),
        old.describe()
    );
}

#[test]
fn unwritable_output_fails_before_sampling() {
    let run = pyperch(
        &[
            "record",
            "--duration",
            "30",
            "--format",
            "flamegraph",
            "--output",
            "/nonexistent-dir/x.svg",
        ],
        Duration::from_secs(90),
    );
    let d = run.diag();
    run.assert_clear_error();
    assert!(
        run.elapsed < Duration::from_secs(15),
        "the error should come before sampling, not after the duration{d}"
    );
    assert!(
        run.error_line().contains("/nonexistent-dir"),
        "the error should name the output path{d}"
    );
}

/// Issue #28 item 9: durations past any clock (`--duration 1e20`, `--interval` of 10^23
/// hours), `top --window` and `--queue-size` out of range are one sentence (they panicked
/// inside the standard library before); a FIFO at `--output` is refused before sampling (its
/// final write would block until a reader came).
#[test]
fn huge_durations_and_a_fifo_output_are_clear_errors() {
    for args in [
        &["record", "--duration", "1e20", "-o", "/tmp/never.svg"][..],
        &["record", "--duration", "inf"],
        &["agent", "--otlp-endpoint", "http://127.0.0.1:1", "--interval", "100000000000000000000000h"],
        &["agent", "--otlp-endpoint", "http://127.0.0.1:1", "--duration", "99999999999999h"],
        &["agent", "--otlp-endpoint", "http://127.0.0.1:1", "--queue-size", "0"],
        &["top", "--once", "--window", "4294967295"],
    ] {
        let run = pyperch(args, Duration::from_secs(30));
        run.assert_clear_error();
        note(format!("{}: {}", args.join(" "), run.error_line()));
    }
    if !is_root() {
        skip("the FIFO case records (needs root)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pyperch-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let fifo = dir.join("profile.svg");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let run = pyperch(&["record", "--duration", "1", "-o", &fifo.to_string_lossy()], Duration::from_secs(30));
    run.assert_clear_error();
    assert!(run.error_line().contains("FIFO"), "{}", run.diag());
    note(format!("FIFO at --output: {} after {:.2?}", run.error_line(), run.elapsed));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #32 item 6: the kernel programs' own diagnostics (aya-log) reach pyperch's log under
/// `RUST_LOG` (as with `cargo xtask run -- ...`): a registered process exiting is said by the
/// exit tracepoint's program, at debug level; without `RUST_LOG` nothing is said.
#[test]
fn kernel_log_says_a_registered_process_exited() {
    let Some(py) = first_python(&HOST_PREFERENCE) else {
        return;
    };
    let expected = |pid: u32| format!("registered process {pid} exited: its kernel slot is free");
    for (env, wanted) in [(&[("RUST_LOG", "profiler=debug,pyperch=info")][..], true), (&[][..], false)] {
        let mut w = Workload::spawn(&py, "exit_early.py", &["1"]).unwrap_or_else(|e| panic!("{e:#}"));
        let pid = w.pid.to_string();
        let run = RecordRun::start_env(&["--pid", &pid, "--duration", "120", "--rate", "99"], env);
        let sampling = run.wait_until_sampling(Duration::from_secs(60));
        // SAFETY: kill(2) with the pid of a child we spawned; no memory effects.
        unsafe { libc::kill(w.pid as libc::pid_t, libc::SIGUSR1) };
        let rec = run.finish();
        assert!(sampling, "pyperch did not start sampling within 60 s{}", rec.diag());
        let _ = w.wait_exit(Duration::from_secs(30));
        rec.assert_ok();
        let said = rec.run.stderr.contains(&expected(w.pid));
        note(format!("RUST_LOG {:?}: the kernel's line {}", env.first().map(|e| e.1), if said { "shown" } else { "not shown" }));
        assert_eq!(said, wanted, "RUST_LOG {env:?}: the kernel's exit line {}{}", if wanted { "is missing" } else { "appears" }, rec.diag());
    }
}
