//! What the kernel says about a process's threads: `/proc/PID/task/TID/{stat,comm,wchan,syscall}`.
//!
//! Every file is read with a small bound (a hostile or huge file cannot make us allocate) and
//! parsed without trusting it: a missing or malformed file gives `None`, never a panic.

use std::io::Read;
use std::path::Path;

use serde::Serialize;

/// At most this much of one `/proc` file is read.
const MAX_PROC_FILE: u64 = 4096;
/// At most this many threads are listed (a process cannot have more than the kernel's
/// `threads-max`, but the bound keeps the dump finite whatever `/proc` says).
pub const MAX_TASKS: usize = 65_536;

/// A `/proc` file as text (bounded, invalid UTF-8 as `\xNN`), or `None` if unreadable.
fn read_bounded(path: &Path) -> Option<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(MAX_PROC_FILE).read_to_end(&mut bytes).ok()?;
    Some(crate::text::decode(&bytes))
}

/// The thread ids of `pid`, sorted, or `None` if the process is gone.
pub fn task_ids(pid: u32) -> Option<Vec<u32>> {
    crate::target::discovery::task_ids(pid, MAX_TASKS)
}

/// `(state letter, start time)` of a process or thread from its `stat` text: fields 3 and 22,
/// counted after the last `)` since the command may hold both spaces and parentheses.
pub fn parse_state_and_start(text: &str) -> Option<(char, u64)> {
    let after = text.get(text.rfind(')')? + 1..)?;
    let mut fields = after.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

/// Whether process `pid` started at `start_time` still runs (a zombie does not: its memory is
/// gone).
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    read_bounded(Path::new(&format!("/proc/{pid}/stat")))
        .and_then(|t| parse_state_and_start(&t))
        .is_some_and(|(state, start)| start == start_time && !matches!(state, 'Z' | 'X' | 'x'))
}

/// The start time (`stat` field 22) of thread `tid` of `pid`, or `None` if it is gone.
pub fn task_start(pid: u32, tid: u32) -> Option<u64> {
    read_bounded(Path::new(&format!("/proc/{pid}/task/{tid}/stat"))).and_then(|t| parse_state_and_start(&t)).map(|(_, start)| start)
}

/// Whether process `pid` exists and has not exited (is not a zombie).
pub fn running(pid: u32) -> bool {
    read_bounded(Path::new(&format!("/proc/{pid}/stat")))
        .and_then(|t| parse_state_and_start(&t))
        .is_some_and(|(state, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// What a thread is doing, as far as the kernel tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activity {
    /// On a CPU or waiting for one (`R`).
    Running,
    /// In a timed sleep (`nanosleep`, `clock_nanosleep`, or `select` without descriptors).
    Sleeping,
    /// Blocked in the kernel on something else (a lock, I/O, a child...).
    Waiting,
    /// Stopped by a signal or a tracer.
    Stopped,
    /// Exited.
    Dead,
    Unknown,
}

/// One thread as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskState {
    /// (Shown by the `ThreadDump` that holds this state.)
    #[serde(skip)]
    pub tid: u32,
    /// `comm` of the thread (its OS name, at most 15 bytes).
    #[serde(skip)]
    pub name: String,
    pub activity: Activity,
    /// The `stat` state letter.
    pub state: String,
    /// The system call it is blocked in, by name where known (`futex`, `clock_nanosleep`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// What it waits on, in words (`a lock or condition (futex)`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<String>,
    /// The kernel function it sleeps in (`/proc/.../wchan`), when the kernel shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
}

/// x86_64 system call numbers worth naming, and what a thread blocked in one waits on.
const SYSCALLS: &[(u64, &str, Activity, &str)] = &[
    (0, "read", Activity::Waiting, "input (read)"),
    (7, "poll", Activity::Waiting, "file descriptors (poll)"),
    (23, "select", Activity::Waiting, "file descriptors (select)"),
    (34, "pause", Activity::Waiting, "a signal (pause)"),
    (35, "nanosleep", Activity::Sleeping, "a timer (nanosleep)"),
    (43, "accept", Activity::Waiting, "a connection (accept)"),
    (45, "recvfrom", Activity::Waiting, "network input (recvfrom)"),
    (47, "recvmsg", Activity::Waiting, "network input (recvmsg)"),
    (61, "wait4", Activity::Waiting, "a child process (wait4)"),
    (202, "futex", Activity::Waiting, "a lock or condition (futex)"),
    (230, "clock_nanosleep", Activity::Sleeping, "a timer (clock_nanosleep)"),
    (232, "epoll_wait", Activity::Waiting, "file descriptors (epoll_wait)"),
    (247, "waitid", Activity::Waiting, "a child process (waitid)"),
    (270, "pselect6", Activity::Waiting, "file descriptors (pselect6)"),
    (271, "ppoll", Activity::Waiting, "file descriptors (ppoll)"),
    (281, "epoll_pwait", Activity::Waiting, "file descriptors (epoll_pwait)"),
    (288, "accept4", Activity::Waiting, "a connection (accept4)"),
    (441, "epoll_pwait2", Activity::Waiting, "file descriptors (epoll_pwait2)"),
];

/// Parses `/proc/.../syscall`: `running`, `-1 SP PC` (blocked outside a system call), or
/// `NR ARG1 ... ARG6 SP PC` with hexadecimal arguments. Returns the number and first argument.
pub fn parse_syscall(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_ascii_whitespace();
    let nr: i64 = fields.next()?.parse().ok()?;
    let nr = u64::try_from(nr).ok()?;
    let arg1 = fields.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()).unwrap_or(0);
    Some((nr, arg1))
}

/// Classifies a thread from its state letter and the system call it is in.
pub fn classify(state: char, syscall: Option<(u64, u64)>) -> (Activity, Option<&'static str>, Option<&'static str>) {
    match state {
        'R' => (Activity::Running, None, None),
        'T' | 't' => (Activity::Stopped, None, None),
        'Z' | 'X' | 'x' => (Activity::Dead, None, None),
        'S' | 'D' | 'I' => {
            let Some((nr, arg1)) = syscall else { return (Activity::Waiting, None, None) };
            match SYSCALLS.iter().find(|s| s.0 == nr) {
                // `select(0, NULL, NULL, NULL, &timeout)` is how 3.8-3.10 implement time.sleep.
                Some((23 | 270, name, _, _)) if arg1 == 0 => (Activity::Sleeping, Some(name), Some("a timer (select)")),
                Some((_, name, activity, what)) => (*activity, Some(name), Some(what)),
                None => (Activity::Waiting, None, None),
            }
        }
        _ => (Activity::Unknown, None, None),
    }
}

/// Reads what the kernel says about thread `tid` of `pid`; `None` if the thread is gone.
pub fn task_state(pid: u32, tid: u32) -> Option<TaskState> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = read_bounded(Path::new(&format!("{dir}/stat")))?;
    let (state, _) = parse_state_and_start(&stat)?;
    let name = crate::target::discovery::read_task_comm(pid, tid);
    let syscall_text = read_bounded(Path::new(&format!("{dir}/syscall")));
    let syscall = syscall_text.as_deref().and_then(parse_syscall);
    let wchan = read_bounded(Path::new(&format!("{dir}/wchan")))
        .map(|w| w.trim().to_owned())
        .filter(|w| !w.is_empty() && w != "0");
    let (activity, name_of_call, what) = classify(state, syscall);
    Some(TaskState {
        tid,
        name: name.unwrap_or_default(),
        activity,
        state: state.to_string(),
        syscall: name_of_call.map(str::to_owned).or_else(|| {
            syscall.filter(|_| activity == Activity::Waiting).map(|(nr, _)| format!("system call {nr}"))
        }),
        waiting_on: what.map(str::to_owned),
        wchan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let text = "12 (a) b) c) S 1 12 12 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 4242 100 0 ";
        assert_eq!(parse_state_and_start(text), Some(('S', 4242)));
        assert_eq!(parse_state_and_start("12 (x"), None);
        assert_eq!(parse_state_and_start("12 (x) R 1"), None);
    }

    #[test]
    fn syscalls() {
        assert_eq!(parse_syscall("running"), None);
        assert_eq!(parse_syscall("-1 0x7ffd 0x7f00"), None);
        assert_eq!(parse_syscall("202 0x7f12 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"), Some((202, 0x7f12)));
        assert_eq!(parse_syscall("23 0x0 0x0"), Some((23, 0)));
        assert_eq!(classify('S', Some((202, 1))).0, Activity::Waiting);
        assert_eq!(classify('S', Some((230, 1))).0, Activity::Sleeping);
        assert_eq!(classify('S', Some((23, 0))).0, Activity::Sleeping);
        assert_eq!(classify('S', Some((23, 5))).0, Activity::Waiting);
        assert_eq!(classify('R', None).0, Activity::Running);
        assert_eq!(classify('Z', None).0, Activity::Dead);
        assert_eq!(classify('?', None).0, Activity::Unknown);
    }

    #[test]
    fn own_threads() {
        let me = std::process::id();
        let tids = task_ids(me).expect("own tasks");
        assert!(tids.contains(&me));
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let state = task_state(me, tid).expect("own state");
        assert_eq!(state.activity, Activity::Running);
    }
}
