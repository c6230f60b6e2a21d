//! Tests against real interpreters: each spawns a Python that sleeps, inspects it, and checks
//! the result by doing in userspace what the kernel will do: find the main thread's
//! `PyThreadState` through the chosen lookup (with the thread's fsbase taken by ptrace),
//! read its top frame and check that the code object is `<module>` of type `PyCode_Type`.
//! Missing interpreters are skipped with a message.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_common::{NO_FIELD, ProcessInfo, tstate_lookup};

use super::*;
use crate::target::memory::{field_u8, field_u64};

const PYENV: &str = "/root/.pyenv/versions";
const SID: &str = "/root/.cache/pyperch/sid-rootfs";
/// Prints a line once running `<module>`, then sleeps there.
const SCRIPT: &str = "import time; print('ready', flush=True); time.sleep(30)";

/// Kills the child when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(program: &str, args: &[&str]) -> Option<Guard> {
    if !Path::new(program).exists() {
        eprintln!("skipping: {program} is absent");
        return None;
    }
    Some(Guard(Command::new(program).args(args).stdout(Stdio::piped()).spawn().expect("spawn")))
}

/// Waits for the child's first line: the interpreter then sleeps in `<module>`.
fn wait_ready(child: &mut Guard) {
    let stdout = child.0.stdout.as_mut().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read child output");
    assert_eq!(line.trim(), "ready");
}

/// Inspects until the process is Python and the interpreter ready (or 10 s pass).
fn inspect_ready(pid: u32) -> (PythonProcess, ProcessInfo) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = match inspect(pid) {
            Ok(process) => match process.kernel_info(&ProcessMemory::new(pid)) {
                Ok(info) => return (process, info),
                Err(e) => e.to_string(),
            },
            // Before `exec` (chroot), the process is not Python yet.
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "process {pid} never became ready: {last}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fsbase of thread `tid`, stopping it briefly with ptrace.
fn fsbase(tid: u32) -> u64 {
    let pid = tid as libc::pid_t;
    // SAFETY: plain ptrace calls on our own child; `regs` is a valid out-buffer.
    unsafe {
        assert_eq!(libc::ptrace(libc::PTRACE_ATTACH, pid, 0usize, 0usize), 0, "attach");
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, libc::__WALL), pid);
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        let got = libc::ptrace(libc::PTRACE_GETREGS, pid, 0usize, &mut regs as *mut _ as usize);
        libc::ptrace(libc::PTRACE_DETACH, pid, 0usize, 0usize);
        assert_eq!(got, 0, "getregs");
        regs.fs_base
    }
}

/// What the kernel does with `info` for the thread whose fsbase is `fs`.
fn lookup_tstate(mem: &ProcessMemory, info: &ProcessInfo, fs: u64) -> u64 {
    let read = |a: u64| mem.read_u64(a).unwrap_or(0);
    match info.tstate_lookup {
        tstate_lookup::PTHREAD_KEY if info.pthread_key < 32 => {
            read(fs + u64::from(info.tsd_first_block) + 16 * u64::from(info.pthread_key))
        }
        tstate_lookup::PTHREAD_KEY => {
            let block = read(fs + u64::from(info.tsd_second_level) + 8 * u64::from(info.pthread_key >> 5));
            read(block + 16 * u64::from(info.pthread_key & 31) + 8)
        }
        tstate_lookup::TLS => read(fs - info.tls_offset),
        _ => 0,
    }
}

/// A compact ASCII `str` of the target.
fn read_ascii(mem: &ProcessMemory, process: &PythonProcess, address: u64) -> String {
    let o = process.layout.objects;
    let len = mem.read_u64(address + u64::from(o.str_length)).expect("str length");
    assert!(len < 256, "{len}");
    let bytes = mem.read_vec(address + u64::from(o.str_ascii_data), len as usize).expect("str data");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Checks `process` by walking to the main thread's top frame.
fn check_walk(process: &PythonProcess, info: &ProcessInfo) {
    let pid = process.pid;
    let mem = ProcessMemory::new(pid);
    let layout = &process.layout;
    let read = |a: u64| mem.read_u64(a).expect("read");

    // `PyCode_Type.tp_name` is "code".
    let tp_name = read(process.code_type_address + 0x18);
    assert_eq!(mem.read_vec(tp_name, 5).expect("tp_name"), b"code\0");

    // The thread list (one thread) ...
    let interp = read(info.interpreters_head_addr);
    let listed = read(interp + u64::from(info.thread.interp_threads_head));
    assert_ne!(listed, 0);
    assert_eq!(read(listed + u64::from(info.thread.next)), 0, "one thread only");
    let fs = fsbase(pid);
    assert_eq!(read(listed + u64::from(info.thread.thread_id)), fs, "thread_id is pthread_self");
    if info.thread.native_thread_id != NO_FIELD {
        assert_eq!(read(listed + u64::from(info.thread.native_thread_id)), u64::from(pid));
    }
    // ... and the fast lookup agree.
    if info.tstate_lookup != tstate_lookup::LIST {
        assert_eq!(lookup_tstate(&mem, info, fs), listed, "fast lookup finds the main thread's state");
    }

    // The top frame runs `<module>` of `<string>`.
    let mut frame = read(listed + u64::from(info.thread.frame));
    if info.thread.cframe_frame != NO_FIELD {
        frame = read(frame + u64::from(info.thread.cframe_frame));
    }
    let f = info.frame;
    let bytes = mem.read_vec(frame, f.read_size as usize).expect("frame");
    let code = field_u64(&bytes, f.code as usize).expect("code") & f.code_mask;
    assert_eq!(read(code + u64::from(layout.objects.ob_type)), process.code_type_address, "a code object");
    assert_eq!(read_ascii(&mem, process, read(code + u64::from(layout.code.name))), "<module>");
    assert_eq!(read_ascii(&mem, process, read(code + u64::from(layout.code.filename))), "<string>");
    if f.owner != NO_FIELD {
        assert_eq!(field_u8(&bytes, f.owner as usize), Some(0), "owned by the thread");
    }
    if f.instr_kind == profiler_common::instr_kind::POINTER {
        let instr = field_u64(&bytes, f.instr as usize).expect("instr");
        let offset = instr.wrapping_sub(code + u64::from(f.code_adaptive)) as i64;
        assert!((0..0x200).contains(&offset), "instruction offset {offset}");
    }
    assert!(process.thread_count() >= Some(1));
}

fn pyenv(version: &str, minor: u8, micro: u8, key_offset: u32) {
    let program = format!("{PYENV}/{version}/bin/python3.{minor}");
    let Some(mut child) = spawn(&program, &["-c", SCRIPT]) else { return };
    wait_ready(&mut child);
    let pid = child.0.id();
    let (process, info) = inspect_ready(pid);
    assert_eq!(process.version, Version::new(3, minor, micro));
    assert_eq!(process.pid, pid);
    assert_eq!(process.exe, Path::new(&program).canonicalize().expect("exe"));
    assert_eq!(process.comm, format!("python3.{minor}"));
    assert_eq!(
        process.linkage,
        Linkage::Shared { library: format!("{PYENV}/{version}/lib/libpython3.{minor}.so.1.0").into() }
    );
    assert_eq!(process.layout.pthread_key, Some(key_offset));
    assert_eq!(
        process.tstate_lookup,
        ThreadStateLookup::PthreadKey { key_address: process.runtime_address + u64::from(key_offset) }
    );
    assert_eq!(info.tstate_lookup, tstate_lookup::PTHREAD_KEY);
    assert_eq!(process.start_time, start_time(pid).expect("alive"));
    assert_eq!(parent_pid(pid), Some(std::process::id()));
    check_walk(&process, &info);
}

#[test]
fn pyenv_3_8() {
    pyenv("3.8.18", 8, 18, 0x574);
}

#[test]
fn pyenv_3_9() {
    pyenv("3.9.18", 9, 18, 0x24c);
}

#[test]
fn pyenv_3_10() {
    pyenv("3.10.13", 10, 13, 0x24c);
}

#[test]
fn pyenv_3_11() {
    pyenv("3.11.7", 11, 7, 0x254);
}

#[test]
fn pyenv_3_12() {
    pyenv("3.12.1", 12, 1, 0x60c);
}

#[test]
fn pyenv_3_13() {
    pyenv("3.13.0", 13, 0, 0x874);
}

/// The host's own `python3` (Debian 12: a static, stripped 3.11 executable), whatever it is.
#[test]
fn host_python3() {
    let Some(mut child) = spawn("/usr/bin/python3", &["-c", SCRIPT]) else { return };
    wait_ready(&mut child);
    let (process, info) = inspect_ready(child.0.id());
    eprintln!("host python3: {} {:?} {:?}", process.version, process.linkage, process.tstate_lookup);
    check_walk(&process, &info);
}

/// A `libpython` deleted after it was loaded is read through `/proc/PID/map_files`.
#[test]
fn deleted_library() {
    let original = format!("{PYENV}/3.12.1/lib/libpython3.12.so.1.0");
    if !Path::new(&original).exists() {
        eprintln!("skipping: {original} is absent");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pyperch-deleted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let copy = dir.join("libpython3.12.so.1.0");
    std::fs::copy(&original, &copy).expect("copy libpython");
    let mut child = Guard(
        Command::new(format!("{PYENV}/3.12.1/bin/python3.12"))
            .args(["-c", SCRIPT])
            .env("LD_LIBRARY_PATH", &dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    wait_ready(&mut child);
    std::fs::remove_dir_all(&dir).expect("delete the copy");
    let (process, info) = inspect_ready(child.0.id());
    assert_eq!(process.linkage, Linkage::Shared { library: copy });
    assert_eq!(process.version, Version::new(3, 12, 1));
    check_walk(&process, &info);
}

fn unsupported(program: &str, args: &[&str], expect: &str) {
    let Some(child) = spawn(program, args) else { return };
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match inspect(pid) {
            Err(DiscoveryError::Unsupported { reason, .. }) => {
                assert!(reason.contains(expect), "{reason}");
                return;
            }
            other => assert!(Instant::now() < deadline, "{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn old_pythons_are_unsupported() {
    unsupported(&format!("{PYENV}/3.7.16/bin/python3.7"), &["-c", SCRIPT], "is older than 3.8");
    unsupported(&format!("{PYENV}/3.6.15/bin/python3.6"), &["-c", SCRIPT], "CPython 3.6 without _PyRuntime");
    unsupported(&format!("{PYENV}/2.7.18/bin/python2.7"), &["-c", "import time; time.sleep(30)"], "CPython 2.7");
}

fn sid(minor: u8, micro: u8) -> Option<(Guard, PythonProcess, ProcessInfo)> {
    let program = format!("/usr/bin/python3.{minor}");
    if !Path::new(SID).join(&program[1..]).exists() {
        eprintln!("skipping: {SID}{program} is absent");
        return None;
    }
    let mut child = Guard(
        Command::new("chroot")
            .args([SID, &program, "-c", SCRIPT])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn chroot"),
    );
    wait_ready(&mut child);
    let pid = child.0.id();
    let (process, info) = inspect_ready(pid);
    assert_eq!(process.version, Version::new(3, minor, micro));
    assert_eq!(process.exe, Path::new(&program));
    assert_eq!(process.linkage, Linkage::Static);
    assert!(procfs::in_root(pid, &program).exists(), "the executable is reachable through /proc/PID/root");
    check_walk(&process, &info);
    Some((child, process, info))
}

#[test]
fn debian_3_13_static() {
    let Some((_child, process, info)) = sid(13, 18) else { return };
    assert_eq!(process.runtime_address, 0xb176a0);
    assert_eq!(process.code_type_address, 0xada120);
    assert_eq!(process.tstate_lookup, ThreadStateLookup::PthreadKey { key_address: 0xb176a0 + 0x874 });
    assert_eq!(info.pthread_key, 1);
}

#[test]
fn debian_3_14_static() {
    let Some((_child, process, info)) = sid(14, 10) else { return };
    assert_eq!(process.runtime_address, 0xba07c0);
    assert_eq!(process.code_type_address, 0xb62360);
    assert_eq!(process.tstate_lookup, ThreadStateLookup::PthreadKey { key_address: 0xba07c0 + 0x924 });
    assert_eq!(info.pthread_key, 1);
    assert_eq!(info.frame.code_mask, !3);
}

#[test]
fn debian_3_15_static() {
    let Some((_child, process, info)) = sid(15, 2) else { return };
    assert_eq!(process.runtime_address, 0xc408a0);
    assert_eq!(process.code_type_address, 0xbf9b60);
    assert_eq!(process.tstate_lookup, ThreadStateLookup::Tls { fsbase_offset: 0x28 });
    assert_eq!((info.tstate_lookup, info.tls_offset), (tstate_lookup::TLS, 0x28));
    assert_eq!(process.layout.pthread_key, None);
}

/// Inspects every process of the host twice and prints the outcomes and timings
/// (`cargo test --release -p profiler-user --lib -- --ignored host_scan --nocapture`).
#[test]
#[ignore]
fn host_scan() {
    for round in 0..2 {
        let started = Instant::now();
        let pids = python_pids_candidates();
        let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
        for pid in &pids {
            let outcome = match inspect(*pid) {
                Ok(p) => format!("python {} {:?}", p.version, p.tstate_lookup).chars().take(40).collect(),
                Err(DiscoveryError::NotPython { .. }) => "not Python".into(),
                Err(e @ (DiscoveryError::Unsupported { .. } | DiscoveryError::NotReady { .. })) => e.to_string(),
                Err(e) => format!("{e:?}").split([' ', '(', '{']).next().unwrap_or_default().to_owned(),
            };
            *outcomes.entry(outcome).or_default() += 1;
        }
        eprintln!(
            "round {round}: {} processes in {:?}, {} files cached",
            pids.len(),
            started.elapsed(),
            cached_files()
        );
        for (outcome, n) in outcomes {
            eprintln!("  {n:5}  {outcome}");
        }
    }
}
