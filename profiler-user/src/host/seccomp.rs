//! The seccomp allow-list pyperch installs on every thread once it has dropped its
//! privileges ([`crate::host::privileges::drop_after_attach`]), and the container profile
//! (`deploy/kubernetes/seccomp-pyperch.json`) generated from the same lists.
//!
//! Invariants:
//! - [`AFTER_START`] is every system call sampling, symbolization, `--native`, `--async`,
//!   the agent's uploads over TLS, `top` and the end of a recording (with `--format heatmap`
//!   creating its directory: mkdir) make once pyperch has
//!   attached (measured with `strace -f` on each of them, see tests/README.md). Anything
//!   else fails with EPERM: never a silent kill, so a missing entry is an error message
//!   naming what failed, not a dead profiler. Each refusal is also counted (a SIGSYS
//!   handler sets the EPERM result; [`refused`]): the first prints one warning line at once,
//!   and pyperch names the count and the last call when it exits. Denied outright: execve, ptrace,
//!   process_vm_writev, the set*id calls, mount and namespace calls, loading BPF programs,
//!   perf_event_open, and new processes (clone without CLONE_THREAD; clone3 answers ENOSYS
//!   so that the C library falls back to clone, whose flags can be checked).
//! - Some entries are narrowed by argument: `mmap`/`mprotect` never with PROT_EXEC (no new
//!   executable memory), `ioctl` never TIOCSTI or TIOCLINUX (no typing into the terminal
//!   pyperch was started from), `bpf` only map commands on maps it already holds (and re-attaching its own
//!   scheduler-switch program),
//!   `prctl` only thread names, `prlimit64` only reads, `socket` only inet, unix and
//!   netlink (the resolver) sockets.
//! - [`AT_START`] adds what start-up needs (loading the program, opening perf events, the
//!   drop itself); the container profile allows both lists, since a runtime's filter is in
//!   place from the container's first instruction.
//! - `PYPERCH_SECCOMP=log` makes every refusal a kernel audit log line instead (the
//!   default action SECCOMP_RET_LOG), which is how the lists are checked on new code paths.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("pyperch could not build its seccomp filter: {0}")]
    Build(String),
    #[error("pyperch could not install its seccomp filter: {0}")]
    Install(String),
}

/// `(name, number)` pairs of system calls named as in the kernel.
macro_rules! syscalls {
    ($($name:ident),* $(,)?) => { &[$((stringify!($name), libc_sys::$name)),*] };
}

/// `libc::SYS_*` under their plain names, for the macro above.
#[allow(non_upper_case_globals)]
mod libc_sys {
    macro_rules! reexport {
        ($($name:ident => $sys:ident),* $(,)?) => { $(pub const $name: i64 = libc::$sys;)* };
    }
    reexport! {
        read => SYS_read, write => SYS_write, readv => SYS_readv, writev => SYS_writev,
        pread64 => SYS_pread64, pwrite64 => SYS_pwrite64, lseek => SYS_lseek, close => SYS_close,
        close_range => SYS_close_range, open => SYS_open, openat => SYS_openat, openat2 => SYS_openat2,
        stat => SYS_stat, fstat => SYS_fstat, lstat => SYS_lstat, newfstatat => SYS_newfstatat,
        statx => SYS_statx, statfs => SYS_statfs, fstatfs => SYS_fstatfs, access => SYS_access,
        faccessat => SYS_faccessat, faccessat2 => SYS_faccessat2, readlink => SYS_readlink,
        readlinkat => SYS_readlinkat, getdents64 => SYS_getdents64, getcwd => SYS_getcwd,
        fcntl => SYS_fcntl, dup => SYS_dup, dup2 => SYS_dup2, dup3 => SYS_dup3, ioctl => SYS_ioctl,
        pipe2 => SYS_pipe2, fsync => SYS_fsync, fdatasync => SYS_fdatasync, ftruncate => SYS_ftruncate,
        rename => SYS_rename, renameat => SYS_renameat, renameat2 => SYS_renameat2, unlink => SYS_unlink,
        unlinkat => SYS_unlinkat, mkdir => SYS_mkdir, mkdirat => SYS_mkdirat, fchmod => SYS_fchmod, copy_file_range => SYS_copy_file_range,
        sendfile => SYS_sendfile, splice => SYS_splice,
        mmap => SYS_mmap, mprotect => SYS_mprotect, munmap => SYS_munmap, mremap => SYS_mremap,
        madvise => SYS_madvise, brk => SYS_brk,
        futex => SYS_futex, sched_yield => SYS_sched_yield, sched_getaffinity => SYS_sched_getaffinity,
        set_robust_list => SYS_set_robust_list, get_robust_list => SYS_get_robust_list, rseq => SYS_rseq,
        set_tid_address => SYS_set_tid_address, clone => SYS_clone, clone3 => SYS_clone3,
        exit => SYS_exit, exit_group => SYS_exit_group, restart_syscall => SYS_restart_syscall,
        rt_sigaction => SYS_rt_sigaction, rt_sigprocmask => SYS_rt_sigprocmask,
        rt_sigreturn => SYS_rt_sigreturn, sigaltstack => SYS_sigaltstack, getpid => SYS_getpid,
        getppid => SYS_getppid, gettid => SYS_gettid, getuid => SYS_getuid, geteuid => SYS_geteuid,
        getgid => SYS_getgid, getegid => SYS_getegid, getgroups => SYS_getgroups,
        getresuid => SYS_getresuid, getresgid => SYS_getresgid, tgkill => SYS_tgkill, kill => SYS_kill,
        wait4 => SYS_wait4, waitid => SYS_waitid, pidfd_open => SYS_pidfd_open,
        poll => SYS_poll, ppoll => SYS_ppoll, epoll_create1 => SYS_epoll_create1, epoll_ctl => SYS_epoll_ctl,
        epoll_wait => SYS_epoll_wait, epoll_pwait => SYS_epoll_pwait, epoll_pwait2 => SYS_epoll_pwait2,
        eventfd2 => SYS_eventfd2, socketpair => SYS_socketpair,
        clock_nanosleep => SYS_clock_nanosleep, nanosleep => SYS_nanosleep, clock_gettime => SYS_clock_gettime,
        clock_getres => SYS_clock_getres, gettimeofday => SYS_gettimeofday, getrandom => SYS_getrandom,
        prlimit64 => SYS_prlimit64, getrlimit => SYS_getrlimit, getrusage => SYS_getrusage, sysinfo => SYS_sysinfo,
        uname => SYS_uname, prctl => SYS_prctl, capget => SYS_capget, process_vm_readv => SYS_process_vm_readv,
        bpf => SYS_bpf, socket => SYS_socket, connect => SYS_connect, sendto => SYS_sendto,
        recvfrom => SYS_recvfrom, sendmsg => SYS_sendmsg, recvmsg => SYS_recvmsg, sendmmsg => SYS_sendmmsg,
        getsockopt => SYS_getsockopt, setsockopt => SYS_setsockopt, getsockname => SYS_getsockname,
        getpeername => SYS_getpeername, shutdown => SYS_shutdown, bind => SYS_bind,
        // Start-up only.
        execve => SYS_execve, arch_prctl => SYS_arch_prctl, perf_event_open => SYS_perf_event_open,
        capset => SYS_capset, setgroups => SYS_setgroups, setresuid => SYS_setresuid,
        setresgid => SYS_setresgid, setuid => SYS_setuid, setgid => SYS_setgid, seccomp => SYS_seccomp,
        setrlimit => SYS_setrlimit, mlock => SYS_mlock, memfd_create => SYS_memfd_create,
        vfork => SYS_vfork, fork => SYS_fork, chdir => SYS_chdir, umask => SYS_umask,
        sched_setaffinity => SYS_sched_setaffinity,
    }
}

/// System calls allowed after the drop, with or without an argument check (see
/// [`narrowed`]).
pub const AFTER_START: &[(&str, i64)] = syscalls![
    read, write, readv, writev, pread64, pwrite64, lseek, close, close_range, open, openat, openat2,
    stat, fstat, lstat, newfstatat, statx, statfs, fstatfs, access, faccessat, faccessat2, readlink,
    readlinkat, getdents64, getcwd, fcntl, dup, dup2, dup3, ioctl, pipe2, fsync, fdatasync, ftruncate,
    rename, renameat, renameat2, unlink, unlinkat, mkdir, mkdirat, fchmod, copy_file_range, sendfile, splice,
    mmap, mprotect, munmap, mremap, madvise, brk,
    futex, sched_yield, sched_getaffinity, set_robust_list, get_robust_list, rseq, set_tid_address,
    clone, clone3, exit, exit_group, restart_syscall, rt_sigaction, rt_sigprocmask, rt_sigreturn,
    sigaltstack, getpid, getppid, gettid, getuid, geteuid, getgid, getegid, getgroups, getresuid,
    getresgid, tgkill, kill, wait4, waitid, pidfd_open,
    poll, ppoll, epoll_create1, epoll_ctl, epoll_wait, epoll_pwait, epoll_pwait2, eventfd2, socketpair,
    clock_nanosleep, nanosleep, clock_gettime, clock_getres, gettimeofday, getrandom,
    prlimit64, getrlimit, getrusage, sysinfo, uname, prctl, capget, process_vm_readv, bpf,
    socket, connect, sendto, recvfrom, sendmsg, recvmsg, sendmmsg, getsockopt, setsockopt,
    getsockname, getpeername, shutdown, bind,
];

/// What start-up adds: the process's own exec and set-up, loading and attaching the kernel
/// program, launching a command (`record -- COMMAND`: fork, setgroups/setgid/setuid in the
/// child, exec), and the drop itself. Only the container profile allows these.
pub const AT_START: &[(&str, i64)] = syscalls![
    execve, arch_prctl, perf_event_open, capset, setgroups, setresuid, setresgid, setuid, setgid,
    seccomp, setrlimit, mlock, memfd_create, vfork, fork, chdir, umask, sched_setaffinity,
];

const PROT_EXEC: u64 = libc::PROT_EXEC as u64;
const TIOCSTI: u64 = libc::TIOCSTI as u64;
const TIOCLINUX: u64 = 0x541C;

/// bpf() commands on maps and programs pyperch already holds (uapi `enum bpf_cmd`).
const BPF_MAP_COMMANDS: [u64; 11] = [
    1,  // BPF_MAP_LOOKUP_ELEM
    2,  // BPF_MAP_UPDATE_ELEM
    3,  // BPF_MAP_DELETE_ELEM
    4,  // BPF_MAP_GET_NEXT_KEY
    15, // BPF_OBJ_GET_INFO_BY_FD
    21, // BPF_MAP_LOOKUP_AND_DELETE_ELEM
    24, // BPF_MAP_LOOKUP_BATCH
    25, // BPF_MAP_LOOKUP_AND_DELETE_BATCH
    26, // BPF_MAP_UPDATE_BATCH
    27, // BPF_MAP_DELETE_BATCH
    // Attaching the scheduler-switch program again after a pause (`--max-cpu`,
    // `kernel::switch_gate`): a BTF tracepoint program takes its attach point from its load,
    // so this re-attaches only programs pyperch loaded, where they were meant to run.
    17, // BPF_RAW_TRACEPOINT_OPEN
];

/// prctl() options after the drop: thread names, reading the bounding set.
const PRCTL_OPTIONS: [u64; 3] = [libc::PR_SET_NAME as u64, libc::PR_GET_NAME as u64, libc::PR_CAPBSET_READ as u64];

/// socket() families: inet for uploads, unix, and netlink for the C library's resolver.
const SOCKET_FAMILIES: [u64; 4] =
    [libc::AF_UNIX as u64, libc::AF_INET as u64, libc::AF_INET6 as u64, libc::AF_NETLINK as u64];

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| SeccompError::Build(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conditions).map_err(|e| SeccompError::Build(e.to_string()))
}

/// One rule per allowed value of argument `arg` (rules are alternatives).
fn one_of(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    values.iter().map(|&v| rule(vec![cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)?])).collect()
}

/// The argument checks of the system calls allowed only in part (see the module docs).
fn narrowed(nr: i64) -> Result<Option<Vec<SeccompRule>>, SeccompError> {
    use SeccompCmpArgLen::{Dword, Qword};
    use SeccompCmpOp::{Eq, MaskedEq, Ne};
    let rules = match nr {
        libc::SYS_mmap | libc::SYS_mprotect => vec![rule(vec![cond(2, Dword, MaskedEq(PROT_EXEC), 0)?])?],
        libc::SYS_ioctl => vec![rule(vec![cond(1, Dword, Ne, TIOCSTI)?, cond(1, Dword, Ne, TIOCLINUX)?])?],
        libc::SYS_bpf => one_of(0, &BPF_MAP_COMMANDS)?,
        libc::SYS_prctl => one_of(0, &PRCTL_OPTIONS)?,
        // Reading a limit only: no new value.
        libc::SYS_prlimit64 => vec![rule(vec![cond(2, Qword, Eq, 0)?])?],
        libc::SYS_socket => one_of(0, &SOCKET_FAMILIES)?,
        // Threads only: a new process could exec outside this filter's reach of arguments.
        libc::SYS_clone => {
            let thread = libc::CLONE_THREAD as u64;
            vec![rule(vec![cond(0, Qword, MaskedEq(thread), thread)?])?]
        }
        _ => return Ok(None),
    };
    Ok(Some(rules))
}

/// What a refused system call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// EPERM, counted by a SIGSYS handler (SECCOMP_RET_TRAP; the default on x86_64).
    Counted,
    /// EPERM from the kernel (SECCOMP_RET_ERRNO), not counted.
    Eperm,
    /// Allowed, and logged by the kernel (`PYPERCH_SECCOMP=log`).
    Log,
}

impl Refusal {
    pub fn from_env() -> Refusal {
        match std::env::var("PYPERCH_SECCOMP").as_deref() {
            Ok("log") => Refusal::Log,
            _ if cfg!(target_arch = "x86_64") => Refusal::Counted,
            _ => Refusal::Eperm,
        }
    }
}

/// System calls refused so far, and the number of the last one (-1: none).
static REFUSED: AtomicU64 = AtomicU64::new(0);
static LAST_REFUSED: AtomicI64 = AtomicI64::new(-1);

/// How many system calls the filter refused, and the name (or number) of the last.
pub fn refused() -> Option<(u64, String)> {
    let count = REFUSED.load(Ordering::Relaxed);
    if count == 0 {
        return None;
    }
    let nr = LAST_REFUSED.load(Ordering::Relaxed);
    let name = AFTER_START
        .iter()
        .chain(AT_START)
        .find(|&&(_, n)| n == nr)
        .map(|&(name, _)| name.to_string())
        .unwrap_or_else(|| format!("system call {nr}"));
    Some((count, name))
}

/// The SIGSYS handler of [`Refusal::Counted`]: the refused call returns EPERM, as with
/// SECCOMP_RET_ERRNO, and is counted; the first one writes a fixed line to stderr.
#[cfg(target_arch = "x86_64")]
extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // Offset of `_sigsys._syscall` in x86_64's siginfo: signo, errno, code, padding, then
    // the union, whose SIGSYS member starts with the 8-byte call address.
    const SYSCALL_OFFSET: usize = 24;
    // SAFETY: the kernel passes a SA_SIGINFO handler a valid siginfo and ucontext; the
    // handler only reads the siginfo, writes the saved RAX (the call's result), updates
    // atomics and calls write(2), all async-signal-safe.
    unsafe {
        let nr = std::ptr::read_unaligned((info as *const u8).add(SYSCALL_OFFSET) as *const i32);
        let context = context as *mut libc::ucontext_t;
        (*context).uc_mcontext.gregs[libc::REG_RAX as usize] = -(libc::EPERM as i64);
        LAST_REFUSED.store(nr as i64, Ordering::Relaxed);
        if REFUSED.fetch_add(1, Ordering::Relaxed) == 0 {
            let line = b"pyperch: warning: the seccomp filter refused a system call (EPERM); pyperch names it when it exits, please report it\n";
            libc::write(2, line.as_ptr() as *const libc::c_void, line.len());
        }
    }
}

/// Installs [`on_sigsys`] for SIGSYS.
#[cfg(target_arch = "x86_64")]
fn install_sigsys_handler() -> Result<(), SeccompError> {
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (see it).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
            return Err(SeccompError::Install(format!("SIGSYS handler: {}", std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn install_sigsys_handler() -> Result<(), SeccompError> {
    Err(SeccompError::Install("counted refusals need x86_64".into()))
}

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError::Build(e.to_string()))
}

/// The two programs, in the order they are installed: one that makes clone3 answer ENOSYS,
/// then the allow-list (which allows clone3: the kernel takes an errno over an allow,
/// whatever the order, and the allow-list last since installing a filter is not on it).
pub fn programs(refusal: Refusal) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &(_, nr) in AFTER_START {
        rules.insert(nr, narrowed(nr)?.unwrap_or_default());
    }
    let mismatch = match refusal {
        Refusal::Counted => SeccompAction::Trap,
        Refusal::Eperm => SeccompAction::Errno(libc::EPERM as u32),
        Refusal::Log => SeccompAction::Log,
    };
    let build = |rules, mismatch, matched| -> Result<BpfProgram, SeccompError> {
        let filter = SeccompFilter::new(rules, mismatch, matched, arch()?).map_err(|e| SeccompError::Build(e.to_string()))?;
        filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError::Build(e.to_string()))
    };
    let allow = build(rules, mismatch, SeccompAction::Allow)?;
    let clone3 = build(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )?;
    Ok(vec![clone3, allow])
}

/// Installs the filters on every thread of the process (TSYNC). No-new-privileges must be
/// set already (it is, by the drop).
pub fn install(refusal: Refusal) -> Result<(), SeccompError> {
    if refusal == Refusal::Counted {
        install_sigsys_handler()?;
    }
    for program in programs(refusal)? {
        seccompiler::apply_filter_all_threads(&program).map_err(|e| SeccompError::Install(e.to_string()))?;
    }
    Ok(())
}

/// The container runtime's profile (Docker / OCI / Kubernetes `Localhost` format) allowing
/// both lists by name, everything else EPERM. Argument checks stay pyperch's own filter's.
pub fn container_profile() -> String {
    let mut names: Vec<&str> = AFTER_START.iter().chain(AT_START).map(|&(name, _)| name).collect();
    names.sort_unstable();
    names.dedup();
    let profile = serde_json::json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": libc::EPERM,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [{ "names": names, "action": "SCMP_ACT_ALLOW" }],
    });
    let mut text = serde_json::to_string_pretty(&profile).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_build() {
        let programs = programs(Refusal::Eperm).expect("filters");
        assert_eq!(programs.len(), 2);
        assert!(programs[0].len() < 4096, "{} instructions", programs[0].len());
        let names: std::collections::HashSet<_> = AFTER_START.iter().map(|p| p.1).collect();
        assert_eq!(names.len(), AFTER_START.len(), "a system call is listed twice");
        for denied in [libc::SYS_execve, libc::SYS_ptrace, libc::SYS_process_vm_writev, libc::SYS_setuid, libc::SYS_perf_event_open] {
            assert!(!names.contains(&denied), "{denied} must not be allowed after start");
        }
    }

    /// The profile shipped beside the DaemonSet is the one these lists give. Run with
    /// PYPERCH_UPDATE_SECCOMP_PROFILE=1 to rewrite it after changing a list.
    #[test]
    fn container_profile_in_deploy_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/seccomp-pyperch.json");
        let expected = container_profile();
        if std::env::var_os("PYPERCH_UPDATE_SECCOMP_PROFILE").is_some() {
            std::fs::write(&path, &expected).expect("write the profile");
        }
        let shipped = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(shipped == expected, "{} is stale: run this test with PYPERCH_UPDATE_SECCOMP_PROFILE=1", path.display());
    }

    /// In a forked child (the filter is for life): allowed calls work, refused ones get
    /// EPERM, clone3 ENOSYS, and PROT_EXEC mappings are refused.
    #[test]
    fn filter_refuses_with_eperm_in_a_child() {
        refuses_in_a_child(Refusal::Eperm);
    }

    /// The default: EPERM through the SIGSYS handler, counted, the last call named.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn filter_counts_refusals_in_a_child() {
        refuses_in_a_child(Refusal::Counted);
    }

    fn refuses_in_a_child(refusal: Refusal) {
        let programs = programs(refusal).expect("filters");
        // SAFETY: the child only makes raw system calls and exits with _exit; it allocates
        // nothing (the programs were built before the fork).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: in the forked child (see above).
            let mut code = unsafe { child_checks(&programs, refusal) };
            if code == 0 && refusal == Refusal::Counted {
                // ptrace, clone3 is not a refusal (ENOSYS), PROT_EXEC mmap, setuid, fork, TIOCSTI.
                if REFUSED.load(Ordering::Relaxed) != 5 || LAST_REFUSED.load(Ordering::Relaxed) != libc::SYS_ioctl {
                    code = 20;
                }
            }
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "the child was killed: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "check {} failed in the child", libc::WEXITSTATUS(status));
    }

    /// Returns 0, or the number of the check that failed.
    ///
    /// # Safety
    /// Only in a freshly forked child.
    unsafe fn child_checks(programs: &[BpfProgram], refusal: Refusal) -> i32 {
        // SAFETY: plain system calls with valid arguments, in the child.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return 1;
            }
            if refusal == Refusal::Counted && install_sigsys_handler().is_err() {
                return 11;
            }
            for p in programs {
                let prog = libc::sock_fprog { len: p.len() as u16, filter: p.as_ptr() as *mut libc::sock_filter };
                if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog as *const _) != 0 {
                    return 2;
                }
            }
            if libc::syscall(libc::SYS_getpid) <= 0 {
                return 3;
            }
            let errno = || *libc::__errno_location();
            if libc::syscall(libc::SYS_ptrace, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                return 4;
            }
            if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                return 5;
            }
            let exec = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            if exec != libc::MAP_FAILED || errno() != libc::EPERM {
                return 6;
            }
            let plain = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            if plain == libc::MAP_FAILED {
                return 7;
            }
            if libc::syscall(libc::SYS_setuid, 0) != -1 || errno() != libc::EPERM {
                return 8;
            }
            // A fork (clone without CLONE_THREAD) is refused.
            if libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                return 9;
            }
            let bad = libc::syscall(libc::SYS_ioctl, 0, libc::TIOCSTI, c"x".as_ptr());
            if bad != -1 || errno() != libc::EPERM {
                return 10;
            }
            0
        }
    }
}
