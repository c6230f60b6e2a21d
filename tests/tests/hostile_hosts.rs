//! Issue #9, "never blocked by a file": hostile processes beside a benign Python one, while
//! pyperch records the whole host.
//!
//! Each scenario starts the hostile process(es) and a benign interpreter spinning in one
//! leaf function, then runs `pyperch record --duration 5 --stats` and checks that:
//! - pyperch ends within the duration plus [`END_MARGIN`] (start-up included);
//! - the benign process keeps at least 90 % of its expected samples, all in its own leaf
//!   (expected = rate x duration x the share of a CPU it got while sampled; beside 2,000
//!   processes, the duration less 1.5 s that discovery's first look at them may take);
//! - the hostile case is counted on the `mapped files:` line of `--stats`.
//!
//! Then SIGTERM during a second recording must end pyperch within [`SIGTERM_GRACE`].
//!
//! The hostile processes are small C programs compiled here with gcc (`cargo xtask test`
//! installs gcc and libc6-dev) and, for FUSE, `workloads/fuse_stall.py`, a server speaking
//! the kernel's protocol on /dev/fuse itself.

use std::{
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use pyperch_tests::*;

/// The rate and length of each recording: enough samples that noise and the start-up of
/// sampling stay well inside the 10 % margin.
const RATE: f64 = 199.0;
const DURATION: f64 = 8.0;
/// Start-up (BTF, loading and attaching the BPF program on a loaded 2-core machine) and
/// writing the profile, beyond `--duration`.
const END_MARGIN: Duration = Duration::from_secs(8);
/// How long pyperch may take to exit after SIGTERM (issue #28: honoured within 1 s
/// whatever a target does; the drain thread answers it, measured 0.04-0.1 s).
const SIGTERM_GRACE: Duration = Duration::from_secs(1);
/// pyperch's peak RSS in every case (docs/safety.md: 256 MiB).
const PEAK_RSS_KB: u64 = 256 * 1024;
/// Host interpreters for the benign process, preferred first.
const HOST_PYTHONS: [&str; 6] = ["3.12", "3.11", "3.10", "3.9", "3.13", "3.8"];
const LEAF: &str = "leaf_green";
const OTHER_LEAVES: [&str; 4] = ["leaf_red", "leaf_blue", "leaf_late", "leaf_old"];

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A scratch directory for C programs and data files, removed on drop (kept on failure).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join("pyperch-tests").join(format!(
            "hostile-{tag}-{}-{}",
            std::process::id(),
            random_hex(6)
        ));
        fs::create_dir_all(&dir).expect("cannot create a scratch directory");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        Scratch(dir)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Compiles `workloads/c/NAME.c` into `out`; `None` (after a SKIP line) without gcc.
fn compile(name: &str, out: &Path, extra: &[&str]) -> Option<PathBuf> {
    let Some(gcc) = find_program("gcc") else {
        skip("gcc is not installed (cargo xtask test installs it)");
        return None;
    };
    let src = workload_source(&format!("c/{name}.c"));
    let bin = out.join(name);
    let output = Command::new(gcc)
        .args(["-O2", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(extra)
        .output()
        .expect("cannot run gcc");
    assert!(
        output.status.success(),
        "gcc {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
    Some(bin)
}

/// A hostile child process started by a command; `pid` is from its `ready PID` line (the
/// child's own pid, except inside a PID namespace, where it is the inner one). The child is
/// killed on drop (with `unshare --kill-child`, so is what runs inside a namespace).
struct Hostile {
    child: Child,
    pid: u32,
}

impl Hostile {
    fn start(mut cmd: Command, what: &str) -> Hostile {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    if let Some(pid) = line
                        .strip_prefix("ready ")
                        .and_then(|p| p.trim().parse().ok())
                    {
                        return Hostile { child, pid };
                    }
                }
                Err(_) => {
                    let status = child.try_wait().ok().flatten();
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{what} did not print its ready line ({status:?})");
                }
            }
        }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The benign interpreter: a host python spinning in [`LEAF`].
fn benign() -> Option<Workload> {
    let Some(py) = first_python(&HOST_PYTHONS) else {
        skip("no host python for the benign process");
        return None;
    };
    Some(Workload::spawn(&py, "spin.py", &[LEAF, "120"]).unwrap_or_else(|e| panic!("{e:#}")))
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // Fields 14 and 15, counted from field 3 after the command.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// One whole-host recording beside the hostile processes, with what was measured.
struct Checked {
    rec: Recording,
    /// The `mapped files:` line of `--stats`.
    files_line: String,
    /// pyperch's own CPU use while sampling, in CPUs.
    pyperch_cpu: f64,
}

/// Records the whole host for [`DURATION`] s and checks the invariants of the module docs
/// for `benign` (whose leaf is `leaf`). `scenario` names the hostile case in messages.
fn record_beside(benign: &Workload, leaf: &str, scenario: &str) -> Checked {
    record_beside_after(benign, leaf, scenario, 0.0)
}

/// [`record_beside`], the benign process's samples expected only after `first_scan` s: the
/// time discovery's first look at the whole host may take before it reaches the benign
/// process (with thousands of processes to list and look at on two CPUs).
fn record_beside_after(benign: &Workload, leaf: &str, scenario: &str, first_scan: f64) -> Checked {
    let rate = format!("{RATE}");
    let duration = format!("{DURATION}");
    let started = Instant::now();
    let run = RecordRun::start(&["--duration", &duration, "--rate", &rate, "--stats"]);
    let pyperch_pid = run.pid();
    let sampling = run.wait_until_sampling(Duration::from_secs(30));
    // The benign process's CPU share and pyperch's CPU, over the sampling period (which
    // ends --duration after the event loop starts, just after sampling began).
    let (t0, cpu0, own0) = (
        Instant::now(),
        cpu_ticks(benign.pid),
        cpu_ticks(pyperch_pid),
    );
    thread::sleep(Duration::from_secs_f64(DURATION - 0.5));
    let (t1, cpu1, own1) = (
        Instant::now(),
        cpu_ticks(benign.pid),
        cpu_ticks(pyperch_pid),
    );
    let own_window = (t1 - t0).as_secs_f64();
    // Its peak RSS so far (read while it still runs: docs/safety.md's fault table).
    let peak_kb = status_kb(pyperch_pid, "VmHWM").unwrap_or(0);
    let rec = run.finish();
    let elapsed = started.elapsed();
    let d = rec.diag_pid(benign.pid);
    assert!(sampling, "{scenario}: pyperch never started sampling{d}");
    assert!(
        elapsed <= Duration::from_secs_f64(DURATION) + END_MARGIN,
        "{scenario}: pyperch record --duration {DURATION} took {elapsed:?} (limit: {:?}){d}",
        Duration::from_secs_f64(DURATION) + END_MARGIN
    );
    rec.assert_ok();
    let tck = clock_ticks_per_second();
    let share = match (cpu0, cpu1) {
        (Some(a), Some(b)) => {
            ((b.saturating_sub(a)) as f64 / tck / (t1 - t0).as_secs_f64()).min(1.0)
        }
        _ => panic!("{scenario}: cannot read the benign process's CPU time{d}"),
    };
    let pyperch_cpu = match (own0, own1) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / tck / own_window,
        _ => 0.0,
    };
    let expected = RATE * (DURATION - first_scan) * share;
    let mine = rec.profile.for_pid(benign.pid);
    let hits = mine.with_leaf(leaf);
    note(format!(
        "{scenario}: pyperch took {elapsed:.1?}, {:.0} % of a CPU while sampling and {:.1} MiB at its peak; pid {} ({}) had {:.0} % of a CPU: \
         {hits} samples in {leaf} of {} in all, {expected:.0} expected",
        pyperch_cpu * 100.0,
        peak_kb as f64 / 1024.0,
        benign.pid,
        benign.python.describe(),
        share * 100.0,
        mine.total()
    ));
    assert!(
        hits as f64 >= 0.9 * expected,
        "{scenario}: pid {} ({}) has {hits} samples in {leaf}, fewer than 90 % of the {expected:.0} expected \
         ({RATE} Hz x {:.1} s x {:.0} % of a CPU){d}",
        benign.pid,
        benign.python.describe(),
        DURATION - first_scan,
        share * 100.0
    );
    assert!(
        peak_kb < PEAK_RSS_KB,
        "{scenario}: pyperch's peak RSS was {peak_kb} kB, over the {PEAK_RSS_KB} kB docs/safety.md states{d}"
    );
    for other in OTHER_LEAVES.iter().filter(|o| **o != leaf) {
        assert_eq!(
            mine.with_function(other),
            0,
            "{scenario}: pid {} has samples in {other}{d}",
            benign.pid
        );
    }
    let files_line = rec
        .run
        .stderr_lines()
        .into_iter()
        .find(|l| l.trim_start().starts_with("mapped files:"))
        .unwrap_or_else(|| panic!("{scenario}: no `mapped files:` line in --stats{d}"))
        .to_string();
    note(format!("{scenario}: {}", files_line.trim()));
    Checked {
        rec,
        files_line,
        pyperch_cpu,
    }
}

/// The count before `label` on the `mapped files:` line (0 when absent).
fn problem_count(files_line: &str, label: &str) -> u64 {
    files_line
        .split([';', ','])
        .find_map(|part| {
            part.trim()
                .strip_suffix(label)?
                .split_whitespace()
                .last()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Removes a file on drop.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A FUSE file system of `count` files of 64 KiB (`workloads/fuse_stall.py`), each mapped by
/// one `map_hold` process, whose server is then stopped (SIGSTOP): looking at any of those
/// files hangs in the kernel. Returns the server workload, the mapper's pid and what kills
/// both; `None` (skipped) without root, /dev/fuse, a host python or gcc.
fn stalled_fuse(scratch: &Scratch, count: usize) -> Option<(Workload, u32, KillPids)> {
    let py = fuse_server_python()?;
    let mapper = compile("map_hold", &scratch.0, &[])?;
    Some(stalled_fuse_running(&py, scratch, count, &[mapper.to_string_lossy().into_owned()]))
}

/// Root, /dev/fuse and a host python for the FUSE server; `None` (skipped) otherwise.
fn fuse_server_python() -> Option<Python> {
    if !is_root() {
        skip("needs root");
        return None;
    }
    if !Path::new("/dev/fuse").exists() {
        skip("/dev/fuse does not exist on this machine: the FUSE case cannot be tested");
        return None;
    }
    let py = first_python(&HOST_PYTHONS);
    if py.is_none() {
        skip("no host python to run the FUSE server");
    }
    py
}

/// [`stalled_fuse`] with `command` (the files' paths appended) as the process that maps them.
fn stalled_fuse_running(py: &Python, scratch: &Scratch, count: usize, command: &[String]) -> (Workload, u32, KillPids) {
    let mnt = scratch.path("mnt");
    fs::create_dir_all(&mnt).expect("mkdir");
    let mut args = vec![mnt.to_string_lossy().into_owned(), format!("65536:{count}")];
    args.extend_from_slice(command);
    for i in 0..count {
        let name = if i == 0 { "lib.so".to_string() } else { format!("lib{i}.so") };
        args.push(mnt.join(name).to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Workload::spawn(py, "fuse_stall.py", &args).unwrap_or_else(|e| panic!("{e:#}"));
    let fields = server.ready_fields();
    let pid_of = |k: &str| fields.get(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or_else(|| panic!("{k}= in {fields:?}"));
    let (server_pid, mapper_pid) = (pid_of("server"), pid_of("mapper"));
    // From now on, nobody answers. Requests stay queued, so a waiter can still be killed;
    // a server that reads a request and never answers would leave the waiting thread
    // unkillable (and pyperch unable to exit): that case is not covered here.
    // SAFETY: kill(2) of the server our workload forked.
    unsafe { libc::kill(server_pid as libc::pid_t, libc::SIGSTOP) };
    note(format!("{count} files of a FUSE server mapped by pid {mapper_pid}; the server is stopped (SIGSTOP)"));
    (server, mapper_pid, KillPids(vec![server_pid, mapper_pid]))
}

/// Starts an endless recording, sends SIGTERM once it samples (plus a second), and checks
/// that pyperch exits within [`SIGTERM_GRACE`] and writes its profile.
fn sigterm_ends_it(scenario: &str) {
    let run = RecordRun::start(&["--duration", "120", "--stats"]);
    let started = Instant::now();
    let sampling = run.wait_until_sampling(Duration::from_secs(30));
    thread::sleep(Duration::from_secs(1));
    let pid = run.pid();
    let sent = started.elapsed();
    // SAFETY: kill(2) of the pyperch we started.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let rec = run.finish();
    let d = rec.diag();
    assert!(sampling, "{scenario}: pyperch never started sampling{d}");
    let after = rec.run.elapsed.saturating_sub(sent);
    note(format!(
        "{scenario}: pyperch exited {after:.2?} after SIGTERM"
    ));
    assert!(
        !rec.run.timed_out(),
        "{scenario}: pyperch did not exit after SIGTERM{d}"
    );
    assert!(
        after <= SIGTERM_GRACE,
        "{scenario}: pyperch took {after:?} to exit after SIGTERM{d}"
    );
    assert!(
        rec.output.is_file(),
        "{scenario}: no profile written after SIGTERM{d}"
    );
}

fn id_of(flag: &str, user: &str) -> u32 {
    let out = Command::new("id")
        .args([flag, user])
        .output()
        .expect("cannot run id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no user {user}"))
}

/// The write leases `/proc/locks` lists for `pid`.
fn write_leases_of(pid: u32) -> Vec<String> {
    fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&"LEASE")
                && f.get(3) == Some(&"WRITE")
                && f.get(4) == Some(&pid.to_string().as_str())
        })
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

/// In a module, so that `cargo xtask test -- hostile_hosts` selects exactly these.
mod hostile_hosts {
    use super::*;

    /// The reported bug: a process run as `nobody` maps three files of its own and holds a
    /// write lease on each, ignoring SIGIO. pyperch must not open them (even a non-blocking
    /// open would start breaking the leases): they are counted, and the leases survive.
    #[test]
    fn write_leases_held_by_nobody() {
        if !is_root() {
            skip("needs root");
            return;
        }
        let scratch = Scratch::new("lease");
        let Some(bin) = compile("lease_holder", &scratch.0, &[]) else {
            return;
        };
        let data = scratch.path("data");
        fs::create_dir_all(&data).expect("mkdir");
        let (uid, gid) = (id_of("-u", "nobody"), id_of("-g", "nobody"));
        std::os::unix::fs::chown(&data, Some(uid), Some(gid)).expect("chown");
        let Some(mut benign) = benign() else { return };
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg(&bin)
            .args(["a.so", "b.so", "c.so"].map(|f| data.join(f)));
        let holder = Hostile::start(cmd, "lease_holder as nobody");
        let before = write_leases_of(holder.pid);
        assert_eq!(
            before.len(),
            3,
            "lease_holder (pid {}) should hold 3 write leases: {before:?}",
            holder.pid
        );

        let checked = record_beside(&benign, LEAF, "write leases");
        let leased = problem_count(&checked.files_line, "under a write lease (not opened)");
        assert!(
            leased >= 3,
            "the 3 leased files are not counted: {}{}",
            checked.files_line,
            checked.rec.diag()
        );
        let after = write_leases_of(holder.pid);
        assert!(
            after.len() == 3 && after.iter().all(|l| l.contains("ACTIVE")),
            "pyperch broke the leases (before: {before:?}, after: {after:?})"
        );
        sigterm_ends_it("write leases");
        benign.terminate();
    }

    /// A process maps two files; then, in its mount namespace, a FIFO is mounted over the
    /// first one's path and a character device (like /dev/zero) over the second's. The maps
    /// still show the paths; pyperch must not open the FIFO or the device (it reads the mapped
    /// files through /proc/PID/map_files), and counts both.
    #[test]
    fn fifo_and_device_in_place_of_mapped_files() {
        if !is_root() {
            skip("needs root");
            return;
        }
        let scratch = Scratch::new("swap");
        let Some(bin) = compile("map_hold", &scratch.0, &[]) else {
            return;
        };
        let (a, b) = (scratch.path("a.so"), scratch.path("b.so"));
        for f in [&a, &b] {
            fs::write(f, vec![b'x'; 65536]).expect("write");
        }
        let fifo = scratch.path("fifo");
        run(Command::new("mkfifo").arg(&fifo), "mkfifo");
        let zero = scratch.path("zero");
        run(
            Command::new("mknod").arg(&zero).args(["c", "1", "5"]),
            "mknod",
        );
        let Some(mut benign) = benign() else { return };
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private"])
            .arg(&bin)
            .arg(&a)
            .arg(&b);
        let holder = Hostile::start(cmd, "map_hold in a mount namespace");
        for (what, over) in [(&fifo, &a), (&zero, &b)] {
            run(
                Command::new("nsenter")
                    .arg(format!("--target={}", holder.pid))
                    .args(["--mount", "mount", "--bind"])
                    .arg(what)
                    .arg(over),
                "nsenter mount --bind",
            );
        }
        let maps = fs::read_to_string(format!("/proc/{}/maps", holder.pid)).unwrap_or_default();
        for f in [&a, &b] {
            let shown = format!("{}\n", f.display());
            assert!(
                maps.contains(&shown),
                "the maps should still show {} (not deleted):\n{maps}",
                f.display()
            );
        }
        let through_root =
            |f: &Path| PathBuf::from(format!("/proc/{}/root{}", holder.pid, f.display()));
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::symlink_metadata(through_root(&a)).is_ok_and(|m| m.file_type().is_fifo()));
        assert!(
            fs::symlink_metadata(through_root(&b)).is_ok_and(|m| m.file_type().is_char_device())
        );

        let checked = record_beside(&benign, LEAF, "FIFO and device");
        let refused = problem_count(
            &checked.files_line,
            "path is not a regular file (FIFO or device)",
        );
        assert!(
            refused >= 2,
            "the FIFO and the device are not counted: {}{}",
            checked.files_line,
            checked.rec.diag()
        );
        sigterm_ends_it("FIFO and device");
        benign.terminate();
    }

    /// inotify watches on host files: any open or read of them is seen.
    struct Watch {
        fd: libc::c_int,
    }

    impl Watch {
        fn new(paths: &[&Path]) -> Watch {
            // SAFETY: plain syscalls; the paths are NUL-terminated copies.
            let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            assert!(fd >= 0, "inotify_init1 failed");
            for p in paths {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
                // SAFETY: as above.
                let wd = unsafe {
                    libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_OPEN | libc::IN_ACCESS)
                };
                assert!(wd >= 0, "cannot watch {}", p.display());
            }
            Watch { fd }
        }

        /// Events seen so far.
        fn events(&self) -> usize {
            let mut buf = [0u8; 4096];
            let mut n = 0;
            loop {
                // SAFETY: reading into a buffer we own, of its length.
                let got = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
                if got <= 0 {
                    return n;
                }
                let mut off = 0usize;
                while off + 16 <= got as usize {
                    let len =
                        u32::from_ne_bytes(buf[off + 12..off + 16].try_into().unwrap_or([0; 4]))
                            as usize;
                    n += 1;
                    off += 16 + len;
                }
            }
        }
    }

    impl Drop for Watch {
        fn drop(&mut self) {
            // SAFETY: our own descriptor.
            unsafe { libc::close(self.fd) };
        }
    }

    /// A process in a chroot and mount namespace (the sid rootfs) maps two files; then, in its
    /// namespace, their directory is covered by one holding absolute symbolic links to host
    /// paths: `lib -> /HOSTDIR/lib` (a directory on the way) and `b.so -> /HOSTDIR/b.so` (the
    /// last component). pyperch must resolve them inside the process's root, never open the
    /// host files (watched with inotify), count the refused link, and still profile the Python
    /// interpreter running in that root.
    #[test]
    fn absolute_symlinks_in_a_container_root() {
        if !is_root() {
            skip("needs root");
            return;
        }
        let Some(py) = first_python(&NAMESPACED_PREFERENCE) else {
            skip("no Debian sid python in the rootfs (cargo xtask test builds it)");
            return;
        };
        let Some(root) = py.rootfs.clone() else {
            skip("the sid python does not run in a rootfs");
            return;
        };
        // The Python in the root: the benign process of this scenario.
        let mut contained = Workload::spawn(&py, "spin.py", &["leaf_blue", "120"])
            .unwrap_or_else(|e| panic!("{e:#}"));
        // The hostile process, in the same root, with its own mount and PID namespaces.
        let guest = format!(
            "/tmp/pyperch-tests/hostile-root-{}-{}",
            std::process::id(),
            random_hex(6)
        );
        let host_side = root.join(guest.trim_start_matches('/'));
        let inside = Scratch(host_side.clone());
        fs::create_dir_all(inside.path("real/lib")).expect("mkdir");
        let Some(_) = compile("map_hold", &inside.0, &["-static"]) else {
            return;
        };
        fs::write(inside.path("real/lib/a.so"), vec![b'x'; 65536]).expect("write");
        fs::write(inside.path("real/b.so"), vec![b'y'; 65536]).expect("write");
        // Host files the links point at: never to be opened.
        let host = Scratch::new("host-secret");
        fs::create_dir_all(host.path("lib")).expect("mkdir");
        fs::write(host.path("lib/a.so"), b"host file").expect("write");
        fs::write(host.path("b.so"), b"host file").expect("write");
        let watch = Watch::new(&[&host.path("lib/a.so"), &host.path("b.so")]);

        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
        ])
        .arg(format!("--root={}", root.display()))
        .arg(format!("{guest}/map_hold"))
        .arg(format!("{guest}/real/lib/a.so"))
        .arg(format!("{guest}/real/b.so"));
        let launcher = Hostile::start(cmd, "map_hold in the sid root");
        // unshare --fork: map_hold is the launcher's only child; `ready` printed its inner pid.
        let deadline = Instant::now() + Duration::from_secs(10);
        let holder = loop {
            let child = fs::read_dir("/proc")
                .expect("/proc")
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .find(|p| {
                    fs::read_to_string(format!("/proc/{p}/stat"))
                        .ok()
                        .and_then(|s| {
                            s[s.rfind(')')? + 1..]
                                .split_whitespace()
                                .nth(1)?
                                .parse::<u32>()
                                .ok()
                        })
                        == Some(launcher.child.id())
                });
            if let Some(p) = child {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "cannot find map_hold under unshare"
            );
            thread::sleep(Duration::from_millis(20));
        };
        let covered = host_side.join("real");
        let script = format!(
            "mount -t tmpfs hostile {dir} && ln -s {h}/lib {dir}/lib && ln -s {h}/b.so {dir}/b.so",
            dir = covered.display(),
            h = host.0.display()
        );
        run(
            Command::new("nsenter")
                .arg(format!("--target={holder}"))
                .args(["--mount", "sh", "-c", &script]),
            "nsenter mount tmpfs + ln -s",
        );
        let maps = fs::read_to_string(format!("/proc/{holder}/maps")).unwrap_or_default();
        assert!(
            maps.contains("/real/lib/a.so\n") && maps.contains("/real/b.so\n"),
            "maps of map_hold:\n{maps}"
        );
        assert_eq!(
            watch.events(),
            0,
            "the host files were opened before the recording"
        );

        let checked = record_beside(&contained, "leaf_blue", "absolute symlinks");
        let events = watch.events();
        assert_eq!(
            events, 0,
            "pyperch opened or read host files through the container's symlinks ({events} events)"
        );
        let refused = problem_count(&checked.files_line, "path is a symbolic link (refused)");
        assert!(
            refused >= 1,
            "the symbolic link is not counted: {}{}",
            checked.files_line,
            checked.rec.diag()
        );
        sigterm_ends_it("absolute symlinks");
        assert_eq!(
            watch.events(),
            0,
            "pyperch opened or read host files through the container's symlinks"
        );
        contained.terminate();
        drop(launcher);
    }

    /// A FUSE file system whose server stops answering (SIGSTOP) while a process maps a file
    /// of it: looking at that file hangs in the kernel. pyperch must give up on it within its
    /// per-file budget, count it, and go on sampling and exit on time.
    #[test]
    fn fuse_server_that_never_answers() {
        let scratch = Scratch::new("fuse");
        let Some((server, _mapper, cleanup)) = stalled_fuse(&scratch, 1) else { return };
        let Some(mut benign) = benign() else { return };

        let checked = record_beside(&benign, LEAF, "FUSE");
        let hung = problem_count(
            &checked.files_line,
            "did not answer in time (skipped and retried later)",
        );
        assert!(
            hung >= 1,
            "the hung FUSE file is not counted: {}{}",
            checked.files_line,
            checked.rec.diag()
        );
        sigterm_ends_it("FUSE");
        benign.terminate();
        // Killing the server closes /dev/fuse: the kernel aborts the connection, and whatever
        // still waits on it gets an error.
        drop(cleanup);
        drop(server);
    }

    /// Issue #28, item 1: a Python process points a code object's qualname into an untouched
    /// page of a shared mapping of a file whose FUSE server it then stops. Reading that name
    /// blocks in the kernel for as long as the server is stopped. pyperch must not wait on it:
    /// the read is given up after its deadline, the process quarantined (counted), the
    /// bystander keeps its samples, the recording ends on time and SIGTERM is answered.
    #[test]
    fn qualname_in_a_page_whose_server_never_answers() {
        let Some(py) = fuse_server_python() else { return };
        let scratch = Scratch::new("fuse-qualname");
        let Some(gcc) = find_program("gcc") else {
            skip("gcc is not installed (cargo xtask test installs it)");
            return;
        };
        let lib = scratch.path("libforged.so");
        run(
            Command::new(gcc)
                .args(["-O2", "-shared", "-fPIC", "-o"])
                .arg(&lib)
                .arg(workload_source("forged_spin.c")),
            "gcc forged_spin.c",
        );
        // The forger maps the file and waits 3 s before it forges: the server is stopped first.
        let forger = [
            py.exe.to_string_lossy().into_owned(),
            workload_source("forged_memory.py").to_string_lossy().into_owned(),
            lib.to_string_lossy().into_owned(),
            "qualname_stalled_page".to_string(),
            "60".to_string(),
        ];
        let (server, forger_pid, cleanup) = stalled_fuse_running(&py, &scratch, 1, &forger);
        let Some(mut benign) = benign() else { return };
        thread::sleep(Duration::from_secs(3));

        let checked = record_beside(&benign, LEAF, "qualname in a stalled FUSE page");
        let quarantined = checked
            .rec
            .run
            .stderr_lines()
            .into_iter()
            .find(|l| l.trim_start().starts_with("quarantined:"))
            .map(|l| l.trim().to_string());
        note(format!("qualname in a stalled FUSE page: {quarantined:?}"));
        assert!(
            quarantined.as_deref().is_some_and(|l| l.starts_with("quarantined: 1 processes")),
            "the forger {forger_pid} (its memory never answers) is not counted as quarantined: {quarantined:?}{}",
            checked.rec.diag()
        );
        sigterm_ends_it("qualname in a stalled FUSE page");
        benign.terminate();
        drop(cleanup);
        drop(server);
    }

    /// Issue #28 item 9: `record --pid X` where X maps a file that never answers. Inspecting
    /// X leaves a thread waiting on the file; the privilege drop (one thread only) must not
    /// meet it ("(a bug, please report it)" before): X is inspected after the drop, and the
    /// Python process given beside it is sampled.
    #[test]
    fn record_pid_of_a_process_mapping_a_hung_file() {
        let scratch = Scratch::new("fuse-pid");
        let Some((server, mapper, cleanup)) = stalled_fuse(&scratch, 1) else { return };
        let Some(mut benign) = benign() else { return };
        let (mapper, pid) = (mapper.to_string(), benign.pid.to_string());
        let started = Instant::now();
        let run = pyperch(
            &["record", "--pid", &mapper, "--pid", &pid, "--duration", "3", "--rate", "199", "-f", "collapsed", "-o", "-"],
            Duration::from_secs(60),
        );
        let elapsed = started.elapsed();
        let d = run.diag();
        assert!(!run.stderr.contains("a bug"), "record --pid of a process mapping a hung file{d}");
        assert!(run.success(), "record --pid of a process mapping a hung file failed{d}");
        let leaf = run.stdout.lines().filter(|l| l.contains(LEAF)).count();
        note(format!("record --pid (hung file) --pid (python) --duration 3 took {elapsed:.1?}; {leaf} stacks in {LEAF}"));
        assert!(leaf >= 1, "the Python process given beside it has no samples{d}");
        benign.terminate();
        drop(cleanup);
        drop(server);
    }

    /// Issue #28 item 3: one process maps 20 files of a FUSE server that never answers. Each
    /// file's opener hangs; a single process must not take every opener slot (16 in all
    /// before, and a Python process started afterwards got no sample): it uses up its own
    /// allowance only, and a Python process started while recording keeps >= 90 % of its
    /// expected samples.
    #[test]
    fn one_process_with_twenty_hung_files() {
        let scratch = Scratch::new("fuse-twenty");
        let Some((server, _mapper, cleanup)) = stalled_fuse(&scratch, 20) else { return };
        // An interpreter whose executable no process has mapped yet (a fresh copy, a new
        // inode): pyperch must open and parse it, so it needs an opener of its own. (The
        // FUSE server is a host python: a process of the same interpreter would be
        // recognised from files already parsed.)
        let Some(sid) = ["sid-3.14", "sid-3.13", "sid-3.15"].iter().find_map(|l| python_quiet(l)) else {
            skip("no Debian sid python for a fresh interpreter");
            return;
        };
        let rootfs = sid.rootfs.clone().expect("a sid python runs in its rootfs");
        let fresh = PathBuf::from(format!("{}-pyperch-{}", sid.exe.display(), std::process::id()));
        let fresh_host = rootfs.join(fresh.strip_prefix("/").expect("absolute"));
        fs::copy(rootfs.join(sid.exe.strip_prefix("/").expect("absolute")), &fresh_host).expect("copy the interpreter");
        let _remove = RemoveOnDrop(fresh_host.clone());
        let py = Python { exe: fresh, ..sid };
        let duration = 12.0;
        let started = Instant::now();
        let run = RecordRun::start(&["--duration", "12", "--rate", &format!("{RATE}"), "--stats"]);
        let pyperch_pid = run.pid();
        let sampling = run.wait_until_sampling(Duration::from_secs(30));
        let sampling_at = Instant::now();
        // Discovery's first scans meet the 20 files (openers hang) before the Python starts.
        thread::sleep(Duration::from_secs(3));
        let mut benign = Workload::spawn(&py, "spin.py", &[LEAF, "120"]).unwrap_or_else(|e| panic!("{e:#}"));
        let (t0, cpu0) = (Instant::now(), cpu_ticks(benign.pid));
        let until = sampling_at + Duration::from_secs_f64(duration - 0.5);
        thread::sleep(until.saturating_duration_since(Instant::now()));
        let (t1, cpu1) = (Instant::now(), cpu_ticks(benign.pid));
        let hwm = status_kb(pyperch_pid, "VmHWM").unwrap_or(0);
        let rec = run.finish();
        let elapsed = started.elapsed();
        let d = rec.diag_pid(benign.pid);
        assert!(sampling, "pyperch never started sampling{d}");
        rec.assert_ok();
        let window = (t1 - t0).as_secs_f64();
        let share = match (cpu0, cpu1) {
            (Some(a), Some(b)) => (b.saturating_sub(a) as f64 / clock_ticks_per_second() / window).min(1.0),
            _ => panic!("cannot read the Python process's CPU time{d}"),
        };
        // Discovery registers a new process at its next scan (each second), after a look.
        let first_scan = 1.5;
        let expected = RATE * (window - first_scan) * share;
        let hits = rec.profile.for_pid(benign.pid).with_leaf(LEAF);
        let files_line = rec
            .run
            .stderr_lines()
            .into_iter()
            .find(|l| l.trim_start().starts_with("mapped files:"))
            .unwrap_or_default()
            .trim()
            .to_string();
        note(format!(
            "20 hung files in one process: record --duration 12 took {elapsed:.1?}, peak RSS {} MB; the Python started 3 s in \
             had {:.0} % of a CPU: {hits} samples in {LEAF}, {expected:.0} expected ({:.0} % kept); {files_line}",
            hwm / 1024,
            share * 100.0,
            if expected > 0.0 { 100.0 * hits as f64 / expected } else { 0.0 }
        ));
        assert!(
            elapsed <= Duration::from_secs_f64(duration) + END_MARGIN,
            "record --duration 12 took {elapsed:?}{d}"
        );
        assert!(
            hits as f64 >= 0.9 * expected,
            "the Python process started after the hostile one has {hits} samples in {LEAF}, fewer than 90 % of the \
             {expected:.0} expected{d}"
        );
        let over = files_line
            .split_once(" over a process's opener allowance")
            .and_then(|(before, _)| before.rsplit(['(', ' ']).next()?.parse::<u64>().ok())
            .unwrap_or(0);
        assert!(over >= 1, "the hostile process's files over its allowance are not counted: {files_line}{d}");
        sigterm_ends_it("20 hung FUSE files in one process");
        benign.terminate();
        drop(cleanup);
        drop(server);
    }

    /// 2,000 processes that load libpython (dlopen) but never initialise it: each looks like
    /// Python until its interpreter turns out never to start. pyperch's own CPU, the benign
    /// process's samples and the recording's end must not suffer.
    #[test]
    fn two_thousand_uninitialised_libpythons() {
        if !is_root() {
            skip("needs root");
            return;
        }
        let Some(lib) = HOST_PYTHONS
            .iter()
            .filter_map(|l| python_quiet(l))
            .find_map(|py| {
                let dir = py.exe.parent()?.parent()?.join("lib");
                let lib = dir.join(format!("libpython{}.{}.so.1.0", py.major, py.minor));
                lib.is_file().then_some(lib)
            })
        else {
            skip("no host python with a shared libpython");
            return;
        };
        let scratch = Scratch::new("dlopen");
        let Some(bin) = compile("dlopen_idle", &scratch.0, &["-ldl"]) else {
            return;
        };
        let Some(mut benign) = benign() else { return };
        let mut cmd = Command::new(&bin);
        cmd.arg(&lib).arg("2000");
        let idle = Hostile::start(cmd, "dlopen_idle 2000");
        let children = fs::read_to_string(format!("/proc/{}/task/{}/children", idle.pid, idle.pid))
            .unwrap_or_default();
        let count = children.split_whitespace().count() + 1;
        assert_eq!(count, 2000, "dlopen_idle should run 2,000 processes");
        note(format!("2,000 processes map {}", lib.display()));

        // The first scan lists and looks at 2,001 processes: seen to reach the benign one up
        // to 1.1 s after sampling began (once in about ten runs; usually at once).
        let checked = record_beside_after(&benign, LEAF, "2,000 idle libpythons", 1.5);
        assert!(
            checked.pyperch_cpu <= 0.5,
            "pyperch used {:.0} % of a CPU while sampling beside 2,000 idle libpythons{}",
            checked.pyperch_cpu * 100.0,
            checked.rec.diag()
        );
        sigterm_ends_it("2,000 idle libpythons");
        benign.terminate();
    }
}
