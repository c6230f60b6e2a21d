//! The life of a command launched by `pyperch record -- COMMAND` once its recording ends.
//!
//! A recording ends in one of four ways, and the command is handled accordingly:
//! - the command exits first: the recording ends with it; nothing to do (it is reaped);
//! - `--duration` elapsed, or pyperch got SIGTERM: the command (and every descendant it has
//!   at that moment) gets SIGTERM; whatever still runs [`GRACE`] later gets SIGKILL;
//! - Ctrl-C: the terminal already sent SIGINT to the whole foreground process group, the
//!   command included, so pyperch sends nothing at first: the command gets [`GRACE`] to exit
//!   on its own, then SIGTERM, then SIGKILL [`GRACE`] after that. (A SIGINT sent to pyperch
//!   alone, with `kill -INT`, is handled the same way: the command then sees SIGTERM first.)
//! - with `--keep-running`, the command is left alone and pyperch returns at once.
//!
//! The command itself is always reaped (it is pyperch's child). Descendants are signalled
//! only if they were descendants when the recording ended and still have the same start
//! time (no PID reuse); once orphaned they are reaped by init or the nearest subreaper.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    os::unix::process::CommandExt,
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use crate::target::discovery;

/// How long a launched command gets to exit after a signal before the next, harder one.
pub const GRACE: Duration = Duration::from_secs(2);
/// How often the command is checked while waiting for it.
const POLL: Duration = Duration::from_millis(20);
/// Bound on the descendants looked after (a fork bomb must not make pyperch loop forever).
const MAX_DESCENDANTS: usize = 4096;

/// Why the recording of a launched command ended before the command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordingEnd {
    /// `--duration` elapsed.
    DurationElapsed,
    /// Ctrl-C (SIGINT): the command got SIGINT from the terminal too.
    Interrupted,
    /// SIGTERM to pyperch: the command has not been told.
    Terminated,
}

/// What became of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited (or was killed) with this shell-style status.
    Exited(i32),
    /// `--keep-running`: left running.
    LeftRunning,
}

/// Ends `child` (and its descendants) after a recording that ended for `why`, unless
/// `keep_running`. Returns once the command is reaped; waits at most 2 × [`GRACE`] plus the
/// time a SIGKILL takes.
pub fn end_command(child: &mut Child, why: RecordingEnd, keep_running: bool) -> Ending {
    if let Ok(Some(status)) = child.try_wait() {
        return Ending::Exited(crate::session::exit_code(status));
    }
    if keep_running {
        return Ending::LeftRunning;
    }
    let root = child.id();
    if why == RecordingEnd::Interrupted {
        // The terminal's SIGINT reached the command too: give it the grace to stop itself.
        if let Some(status) = wait_for(child, GRACE) {
            return Ending::Exited(status);
        }
    }
    let family = descendants(root);
    signal(root, None, libc::SIGTERM);
    for (&pid, &start) in &family {
        signal(pid, Some(start), libc::SIGTERM);
    }
    let status = wait_for(child, GRACE);
    // Descendants that outlived the command get the same grace, counted from the SIGTERM.
    let deadline = Instant::now() + GRACE.saturating_sub(Duration::from_millis(100));
    let mut survivors: Vec<(u32, u64)> = family.into_iter().collect();
    while !survivors.is_empty() {
        survivors.retain(|&(pid, start)| discovery::start_time(pid) == Some(start));
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(POLL);
    }
    for (pid, start) in survivors {
        signal(pid, Some(start), libc::SIGKILL);
    }
    match status {
        Some(status) => Ending::Exited(status),
        None => {
            let _ = child.kill();
            Ending::Exited(child.wait().map(crate::session::exit_code).unwrap_or(128 + libc::SIGKILL))
        }
    }
}

/// Spawns `command` held just before its `exec`: the child sends its pid through a pipe and
/// waits; `before_exec(pid)` runs on another thread meanwhile (for example opening the
/// inheriting perf events that sample it), and the child execs only once it returned `Ok`.
/// So nothing the command runs happens before `before_exec` finished: its first instruction
/// is sampled. An `Err` from `before_exec` is returned and the child exits without
/// exec'ing (it reads end-of-file, and `spawn` fails with `ECANCELED`, then is reaped).
///
/// If the exec itself fails, `before_exec`'s value is dropped and the spawn error returned.
pub fn spawn_held<T: Send, E: Send>(
    command: &mut Command,
    before_exec: impl FnOnce(u32) -> Result<T, E> + Send,
) -> Result<(Child, T), HeldSpawnError<E>> {
    use std::io::{Read, Write};
    let (pid_read, pid_write) = pipe().map_err(HeldSpawnError::Spawn)?;
    let (go_read, go_write) = pipe().map_err(HeldSpawnError::Spawn)?;
    let (pid_write_fd, go_read_fd) = (pid_write.as_raw_fd(), go_read.as_raw_fd());
    let (pid_read_fd, go_write_fd) = (pid_read.as_raw_fd(), go_write.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec and makes only close, getpid,
    // write and read system calls on descriptors that exist in the child (copies of ours,
    // all close-on-exec); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // The child's copies of the parent's ends: without them, end-of-file reaches the
            // child when the parent's thread gives up.
            libc::close(go_write_fd);
            libc::close(pid_read_fd);
            let pid = (libc::getpid() as u32).to_ne_bytes();
            if libc::write(pid_write_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return Err(std::io::Error::last_os_error());
            }
            let mut go = 0u8;
            loop {
                match libc::read(go_read_fd, (&raw mut go).cast(), 1) {
                    1 => return Ok(()),
                    0 => return Err(std::io::Error::from_raw_os_error(libc::ECANCELED)),
                    _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                    _ => return Err(std::io::Error::last_os_error()),
                }
            }
        });
    }
    thread::scope(|scope| {
        let helper = scope.spawn(move || {
            let mut pid = [0u8; 4];
            std::fs::File::from(pid_read).read_exact(&mut pid).ok()?;
            let result = before_exec(u32::from_ne_bytes(pid));
            if result.is_ok() {
                let _ = std::fs::File::from(go_write).write_all(&[1]);
            }
            Some(result)
        });
        let spawned = command.spawn();
        // Our copies of the child's ends: the helper reads end-of-file if the child never
        // wrote its pid (the fork failed).
        drop(pid_write);
        drop(go_read);
        let prepared = helper.join().unwrap_or(None);
        match (spawned, prepared) {
            (Ok(child), Some(Ok(value))) => Ok((child, value)),
            (Ok(mut child), Some(Err(e))) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(HeldSpawnError::Before(e))
            }
            (Err(_), Some(Err(e))) => Err(HeldSpawnError::Before(e)),
            (Err(e), _) => Err(HeldSpawnError::Spawn(e)),
            (Ok(mut child), None) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(HeldSpawnError::Spawn(std::io::Error::other("the command never reported its pid")))
            }
        }
    })
}

/// Why [`spawn_held`] failed.
#[derive(Debug)]
pub enum HeldSpawnError<E> {
    /// The command could not be started.
    Spawn(std::io::Error),
    /// `before_exec` failed (the command never ran).
    Before(E),
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Waits up to `limit` for the command to exit; its status, if it did.
fn wait_for(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(crate::session::exit_code(status)),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL);
    }
}

/// Sends `signal` to `pid`, provided it still has start time `start` (when given).
fn signal(pid: u32, start: Option<u64>, signal: libc::c_int) {
    if start.is_some_and(|s| discovery::start_time(pid) != Some(s)) {
        return;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    if pid <= 1 {
        return;
    }
    // SAFETY: kill(2) with a positive pid only sends a signal; no memory is involved.
    unsafe { libc::kill(pid, signal) };
}

/// Every live descendant of `root` (not `root` itself), with its start time; at most
/// [`MAX_DESCENDANTS`].
pub fn descendants(root: u32) -> HashMap<u32, u64> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for pid in discovery::python_pids_candidates() {
        if let Some(parent) = discovery::parent_pid(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut found = HashMap::new();
    let mut seen = HashSet::from([root]);
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if found.len() >= MAX_DESCENDANTS || !seen.insert(child) {
                continue;
            }
            if let Some(start) = discovery::start_time(child) {
                found.insert(child, start);
                queue.push(child);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn exited_command_keeps_its_status() {
        let mut child = Command::new("sh").args(["-c", "exit 7"]).spawn().expect("sh");
        let _ = child.wait();
        assert_eq!(end_command(&mut child, RecordingEnd::DurationElapsed, false), Ending::Exited(7));
    }

    #[test]
    fn running_command_is_terminated_with_its_children() {
        // A shell that ignores nothing, with a sleeping child of its own.
        let mut child = Command::new("sh").args(["-c", "sleep 60 & wait"]).spawn().expect("sh");
        thread::sleep(Duration::from_millis(200));
        let family = descendants(child.id());
        assert!(!family.is_empty(), "the shell's sleep was not found");
        let started = Instant::now();
        let ending = end_command(&mut child, RecordingEnd::DurationElapsed, false);
        assert_eq!(ending, Ending::Exited(128 + libc::SIGTERM));
        assert!(started.elapsed() < GRACE * 2);
        thread::sleep(Duration::from_millis(100));
        for (pid, start) in family {
            assert_ne!(discovery::start_time(pid), Some(start), "descendant {pid} survived");
        }
    }

    #[test]
    fn stubborn_command_is_killed_after_the_grace() {
        let mut child = Command::new("sh").args(["-c", "trap '' TERM; while :; do sleep 0.05; done"]).spawn().expect("sh");
        thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let ending = end_command(&mut child, RecordingEnd::Terminated, false);
        assert_eq!(ending, Ending::Exited(128 + libc::SIGKILL));
        let took = started.elapsed();
        assert!(took >= GRACE && took < GRACE * 3, "{took:?}");
    }

    /// The held child runs nothing before `before_exec` returns: a marker file the command
    /// would create does not exist while it runs, and the pid given is the command's.
    #[test]
    fn held_spawn_runs_the_command_only_after_before_exec() {
        let marker = std::env::temp_dir().join(format!("pyperch-held-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let mut command = Command::new("touch");
        command.arg(&marker);
        let seen = marker.clone();
        let (mut child, (pid, existed)) = spawn_held(&mut command, move |pid| {
            thread::sleep(Duration::from_millis(200));
            Ok::<_, ()>((pid, seen.exists()))
        })
        .expect("spawn");
        assert_eq!(pid, child.id());
        assert!(!existed, "the command ran before before_exec returned");
        assert!(child.wait().expect("wait").success());
        assert!(marker.exists());
        let _ = std::fs::remove_file(&marker);
    }

    #[test]
    fn held_spawn_failures() {
        // before_exec fails: its error, and the command never runs.
        let marker = std::env::temp_dir().join(format!("pyperch-held-fail-{}", std::process::id()));
        let mut command = Command::new("touch");
        command.arg(&marker);
        let result = spawn_held(&mut command, |_| Err::<(), _>("refused"));
        assert!(matches!(result, Err(HeldSpawnError::Before("refused"))));
        thread::sleep(Duration::from_millis(100));
        assert!(!marker.exists());
        // The exec fails: the spawn error.
        let mut command = Command::new("/nonexistent/pyperch-no-such-command");
        let result = spawn_held(&mut command, |_| Ok::<_, ()>(()));
        assert!(matches!(result, Err(HeldSpawnError::Spawn(e)) if e.kind() == std::io::ErrorKind::NotFound));
    }

    #[test]
    fn keep_running_leaves_it_alone() {
        let mut child = Command::new("sleep").arg("60").spawn().expect("sleep");
        assert_eq!(end_command(&mut child, RecordingEnd::DurationElapsed, true), Ending::LeftRunning);
        assert!(matches!(child.try_wait(), Ok(None)));
        let _ = child.kill();
        let _ = child.wait();
    }
}
