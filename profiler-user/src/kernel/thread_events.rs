//! Per-task perf events: the CPU clock of chosen processes only, with the sampling program
//! attached, so that with `--pid` or a launched command the rest of the host is never
//! interrupted. Each event has `inherit` set: threads and child processes the task creates
//! after the event is opened get their own copy, with the same program.
//!
//! aya opens per-CPU and per-process events but cannot set `inherit`, so the events are
//! opened here with `perf_event_open` (perf-event-open-sys) and the program is attached
//! with `PERF_EVENT_IOC_SET_BPF`, which works on every kernel pyperch supports.

use std::{
    collections::HashSet,
    fs, io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use perf_event_open_sys::{self as sys, bindings};

/// Threads of one process that are given events; more are not looked at.
const MAX_TASKS: usize = 1 << 16;
/// Listings of a process's threads: threads created while the first events were being
/// opened (by a thread that had none yet) appear in a later listing.
const LISTINGS: usize = 4;

/// Threads of the given processes beyond which `--pid` samples with one event per CPU
/// instead of one per thread: with an event per thread, the kernel switches event contexts
/// at every context switch of the process, and a 500-thread process ran 20-38 % slower
/// (against 0-15 % with an event per CPU, `cargo xtask bench -- --only storms`).
pub const PER_TASK_MAX_THREADS: usize = 64;

/// Whether `pids` have more than `PER_TASK_MAX_THREADS` threads in all (counting stops
/// there; a process that cannot be listed counts for none).
pub fn many_threads(pids: &[u32]) -> bool {
    let mut threads = 0;
    for &pid in pids {
        let Ok(entries) = fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for _ in entries {
            threads += 1;
            if threads > PER_TASK_MAX_THREADS {
                return true;
            }
        }
    }
    false
}

/// Opens an inheriting CPU-clock event, sampling at `hz`, on every thread of `pid`, each
/// running the program `program`; adds them to `events`. A thread, or the whole process,
/// that exits meanwhile is skipped (discovery sees the exit).
pub fn open_for_process(pid: u32, hz: u64, program: RawFd, events: &mut Vec<OwnedFd>) -> io::Result<()> {
    let mut done: HashSet<u32> = HashSet::new();
    for _ in 0..LISTINGS {
        let tids = match list_tasks(pid) {
            Ok(tids) => tids,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let new: Vec<u32> = tids.into_iter().filter(|t| !done.contains(t)).collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            done.insert(tid);
            match open_for_task(tid, hz, program) {
                Ok(fd) => events.push(fd),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The thread ids in `/proc/PID/task` (at most `MAX_TASKS`).
fn list_tasks(pid: u32) -> io::Result<Vec<u32>> {
    let mut tids = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(entry) = entry else { continue };
        if let Some(tid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
            tids.push(tid);
            if tids.len() >= MAX_TASKS {
                break;
            }
        }
    }
    Ok(tids)
}

/// One inheriting CPU-clock event on task `tid` (any CPU), with `program` attached, enabled.
pub fn open_for_task(tid: u32, hz: u64, program: RawFd) -> io::Result<OwnedFd> {
    let mut attr = bindings::perf_event_attr {
        type_: bindings::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<bindings::perf_event_attr>() as u32,
        config: bindings::PERF_COUNT_SW_CPU_CLOCK as u64,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_freq = hz;
    attr.set_freq(1);
    attr.set_inherit(1);
    attr.set_disabled(1);
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: `attr` is a valid, fully initialised perf_event_attr of the size it states.
    let fd = unsafe { sys::perf_event_open(&mut attr, pid, -1, -1, bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: perf_event_open returned a new file descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    attach_and_enable(&fd, program)?;
    Ok(fd)
}

fn attach_and_enable(fd: &OwnedFd, program: RawFd) -> io::Result<()> {
    let program = u32::try_from(program).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` is an open perf event; SET_BPF takes a program fd, ENABLE no argument.
    unsafe {
        if sys::ioctls::SET_BPF(fd.as_raw_fd(), program) < 0 {
            return Err(io::Error::last_os_error());
        }
        if sys::ioctls::ENABLE(fd.as_raw_fd(), 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
