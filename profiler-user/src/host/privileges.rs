//! Least privilege: which capabilities pyperch needs to start, which it keeps once its
//! kernel program is loaded and attached, and the identity a command launched under `sudo`
//! runs with.
//!
//! Start-up needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to load the program and open
//! the per-CPU perf events, and CAP_SYS_PTRACE to read Python processes. Once attached,
//! [`drop_after_attach`] keeps only what sampling still uses (see [`Keep`]), removes
//! everything else from the effective, permitted, inheritable, ambient and (when allowed)
//! bounding sets, sets no-new-privileges, switches to a user other than root ([`RunAs`]:
//! the sudo user, else nobody; no supplementary groups), and installs the seccomp
//! allow-list of [`crate::host::seccomp`] on every thread, so that a bug in a parser of hostile
//! input runs as an unprivileged user with three read-side capabilities and a fixed set
//! of system calls.
//!
//! Capabilities are per thread on Linux: the drop must run while pyperch has one thread
//! (before the event loop's and the uploader's threads exist), and it refuses otherwise.
//! The `caps` crate does the capget/capset/prctl work; `nix` the user database and setxid
//! calls.

use std::{
    collections::HashSet,
    ffi::{CString, OsString},
    fs,
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
};

use caps::{CapSet, Capability};
use nix::unistd::{Gid, Uid, User};

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error(
        "pyperch could not drop its capabilities: {threads} threads are running and capabilities are per thread (a bug, please report it)"
    )]
    Threads { threads: usize },
    #[error("pyperch could not drop its capabilities ({what}): {message}")]
    Drop { what: &'static str, message: String },
}

/// A capability pyperch checks for at start, and what it is for (for error messages).
struct Needed {
    cap: Capability,
    /// Another capability that serves instead (CAP_SYS_ADMIN covers BPF and PERFMON).
    or: Option<Capability>,
    purpose: &'static str,
}

const NEEDED_TO_START: [Needed; 3] = [
    Needed { cap: Capability::CAP_BPF, or: Some(Capability::CAP_SYS_ADMIN), purpose: "to load its eBPF program" },
    Needed {
        cap: Capability::CAP_PERFMON,
        or: Some(Capability::CAP_SYS_ADMIN),
        purpose: "to sample every CPU with perf events",
    },
    Needed { cap: Capability::CAP_SYS_PTRACE, or: None, purpose: "to read the memory of Python processes" },
];

/// The capabilities in a `Cap*:` line of /proc/self/status (0 when unreadable).
fn status_caps(field: &str) -> u64 {
    fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// The start-up capabilities missing from this process's effective set, described for the
/// user: e.g. `the capability CAP_PERFMON (to sample every CPU with perf events)`. `None`
/// when nothing is missing.
pub fn missing_to_start() -> Option<String> {
    missing_from(status_caps("CapEff:"))
}

fn missing_from(effective: u64) -> Option<String> {
    let has = |c: Capability| effective & c.bitmask() != 0;
    let missing: Vec<String> = NEEDED_TO_START
        .iter()
        .filter(|n| !has(n.cap) && !n.or.is_some_and(has))
        .map(|n| format!("{} ({})", n.cap, n.purpose))
        .collect();
    match missing.as_slice() {
        [] => None,
        [one] => Some(format!("the capability {one}")),
        [init @ .., last] => Some(format!("the capabilities {} and {last}", init.join(", "))),
    }
}

/// What pyperch keeps after attaching, each for one reason.
///
/// - CAP_SYS_PTRACE: `process_vm_readv` on every target, and /proc/PID/{maps,exe,root} of
///   processes of other users (the kernel's ptrace access check).
/// - CAP_DAC_READ_SEARCH: reading the interpreter's files (executable, libpython) through
///   /proc/PID/root whatever their owner and mode.
/// - CAP_CHECKPOINT_RESTORE: opening /proc/PID/map_files/<range>, how pyperch reads a mapped
///   file that was deleted or replaced, or that another mount namespace hides; the kernel
///   allows that only with CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE (Linux 5.9+), and the
///   narrower one is kept.
/// - CAP_BPF only on kernels older than 5.19 with `kernel.unprivileged_bpf_disabled` set:
///   there every bpf() command, map updates through fds pyperch already holds included,
///   needs it; from 5.19 only loading programs and creating maps do.
/// - CAP_DAC_OVERRIDE (and CAP_FOWNER) only for `record` with an output file whose
///   directory the user pyperch switches to ([`RunAs`]) could not write by its mode bits
///   (for example root's home when run as root without sudo, written as nobody), so that
///   the profile can still be put there at the end. Under sudo the output's folder is
///   usually the user's own, and nothing is kept for it.
/// - CAP_KILL only for `record -- COMMAND` run as root without sudo: the command runs as
///   root, and pyperch (now another user) must still be able to end it when the recording
///   ends.
#[derive(Debug, Clone, Default)]
pub struct Keep {
    /// The file `record` writes at the end, if any.
    pub output: Option<PathBuf>,
    /// Whether `record` launched a command, which it ends when the recording ends.
    pub command: bool,
}

/// What [`drop_after_attach`] kept.
#[derive(Debug, Clone)]
pub struct Kept {
    pub capabilities: Vec<Capability>,
    /// Whether the bounding set was reduced too (needs CAP_SETPCAP, which a container
    /// usually lacks; there the runtime already limited the bounding set).
    pub bounding_reduced: bool,
    /// The real uid after the drop, and whether it was switched (see [`RunAs`]).
    pub uid: u32,
    pub switched: bool,
}

/// The capabilities to keep, before intersecting with what the process has.
fn wanted(keep: &Keep, run_as: RunAs) -> HashSet<Capability> {
    let mut wanted: HashSet<Capability> =
        [Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH, Capability::CAP_CHECKPOINT_RESTORE].into();
    if bpf_needed_for_map_access() {
        wanted.insert(Capability::CAP_BPF);
    }
    // The command runs as the user pyperch had at start (or the sudo user, who is `run_as`).
    if keep.command && run_as.uid != nix::unistd::getuid() && InvokingUser::from_sudo().is_none() {
        wanted.insert(Capability::CAP_KILL);
    }
    if let Some(output) = &keep.output {
        let (dac_override, fowner) = output_needs(output, run_as);
        if dac_override {
            wanted.insert(Capability::CAP_DAC_OVERRIDE);
        }
        if fowner {
            wanted.insert(Capability::CAP_FOWNER);
        }
    }
    wanted
}

/// Linux 5.19 ("bpf: refine kernel.unprivileged_bpf_disabled behaviour") lets processes
/// without CAP_BPF use map fds they hold; before it the sysctl refused every command.
fn bpf_needed_for_map_access() -> bool {
    let disabled = fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(1);
    disabled != 0 && super::kernel_version() < (5, 19)
}

/// Whether writing `output` at the end (created, or renamed over, in its directory) needs
/// CAP_DAC_OVERRIDE (the directory is not writable by our uid and groups by its mode bits)
/// and CAP_FOWNER (a sticky directory of another owner holding someone else's file there).
fn output_needs(output: &Path, run_as: RunAs) -> (bool, bool) {
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // The identity the file is written with at the end: `run_as` once switched (with no
    // supplementary groups), else the current one.
    let (uid, groups): (u32, Vec<u32>) = if nix::unistd::geteuid().is_root() {
        (run_as.uid.as_raw(), vec![run_as.gid.as_raw()])
    } else {
        let groups = nix::unistd::getgroups().unwrap_or_default().into_iter().map(Gid::as_raw);
        (nix::unistd::geteuid().as_raw(), groups.chain([nix::unistd::getegid().as_raw()]).collect())
    };
    let may_write = |meta: &fs::Metadata, bits: u32| {
        let mode = meta.mode();
        if meta.uid() == uid {
            mode & (bits << 6) == bits << 6
        } else if groups.contains(&meta.gid()) {
            mode & (bits << 3) == bits << 3
        } else {
            mode & bits == bits
        }
    };
    // A device or FIFO at the path is opened for writing in place.
    if let Ok(meta) = fs::metadata(output) {
        let kind = meta.file_type();
        if !kind.is_file() && !kind.is_dir() && !kind.is_symlink() {
            return (!may_write(&meta, 0o2), false);
        }
    }
    let Ok(meta) = fs::metadata(&dir) else { return (true, true) };
    let writable = may_write(&meta, 0o3);
    let sticky = meta.mode() & 0o1000 != 0;
    let foreign_file = fs::symlink_metadata(output).is_ok_and(|m| m.uid() != uid);
    (!writable, sticky && meta.uid() != uid && foreign_file)
}

fn thread_count() -> usize {
    fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(1)
}

/// Drops every capability sampling no longer needs and sets no-new-privileges. Call it
/// after the kernel program is attached and any command is launched, while pyperch has
/// one thread.
pub fn drop_after_attach(keep: &Keep) -> Result<Kept, PrivilegeError> {
    // A helper thread that has just returned its result (a budgeted inspection) may take a
    // moment to leave the thread list.
    let mut threads = thread_count();
    for _ in 0..50 {
        if threads <= 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        threads = thread_count();
    }
    if threads > 1 {
        return Err(PrivilegeError::Threads { threads });
    }
    let err = |what: &'static str| move |e: caps::errors::CapsError| PrivilegeError::Drop { what, message: e.to_string() };
    let permitted = caps::read(None, CapSet::Permitted).map_err(err("reading the permitted set"))?;
    let mut run_as = Some(RunAs::chosen());
    let mut wanted_set = wanted(keep, run_as.unwrap_or_else(RunAs::current));
    // An output folder only root can write, without CAP_DAC_OVERRIDE to write it as another
    // user (a container that dropped it): pyperch stays root rather than fail at the end.
    if wanted_set.contains(&Capability::CAP_DAC_OVERRIDE) && !permitted.contains(&Capability::CAP_DAC_OVERRIDE) {
        eprintln!(
            "pyperch: warning: keeps running as uid 0 after start: the output's folder is writable only by root, and there is no CAP_DAC_OVERRIDE to write it as another user"
        );
        run_as = None;
        wanted_set = wanted(keep, RunAs::current());
    }
    let kept: HashSet<Capability> = wanted_set.intersection(&permitted).copied().collect();

    // The bounding set first: dropping from it needs CAP_SETPCAP in the effective set.
    let bounding_reduced = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false);
    if bounding_reduced {
        for cap in caps::read(None, CapSet::Bounding).map_err(err("reading the bounding set"))? {
            if !kept.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap).map_err(err("the bounding set"))?;
            }
        }
    }
    // Without CAP_SETPCAP the bounding set stays, but no-new-privileges already keeps an
    // execve from adding anything to the permitted set.
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| PrivilegeError::Drop { what: "no-new-privileges", message: e.to_string() })?;
    caps::clear(None, CapSet::Ambient).map_err(err("the ambient set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(err("the inheritable set"))?;
    let switched = match run_as {
        Some(run_as) => switch_user(run_as)?,
        None => false,
    };
    // Effective before permitted: the effective set must stay within the permitted one.
    caps::set(None, CapSet::Effective, &kept).map_err(err("the effective set"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(err("the permitted set"))?;
    crate::host::seccomp::install(crate::host::seccomp::Refusal::from_env())
        .map_err(|e| PrivilegeError::Drop { what: "the seccomp filter", message: e.to_string() })?;
    let mut capabilities: Vec<Capability> = kept.into_iter().collect();
    capabilities.sort_by_key(|c| c.index());
    Ok(Kept { capabilities, bounding_reduced, uid: nix::unistd::getuid().as_raw(), switched })
}

/// The identity pyperch runs as once attached.
///
/// Under sudo it is the invoking user (`SUDO_UID`, `SUDO_GID`): the launched command already
/// runs as that user, and the output file becomes theirs. Otherwise `nobody` (65534:65534),
/// which owns nothing. Either way supplementary groups are cleared. Processes of that user
/// can signal pyperch (and renice it), but not read or trace it: it holds capabilities they
/// lack, and the change of uid made it non-dumpable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: Uid,
    pub gid: Gid,
}

/// `nobody` and `nogroup` on Debian and most distributions (the overflow ids).
pub const NOBODY: u32 = 65534;

impl RunAs {
    /// The identity pyperch has now.
    pub fn current() -> RunAs {
        RunAs { uid: nix::unistd::geteuid(), gid: nix::unistd::getegid() }
    }

    pub fn chosen() -> RunAs {
        match InvokingUser::from_sudo() {
            Some(user) => RunAs { uid: user.uid, gid: user.gid },
            None => RunAs { uid: Uid::from_raw(NOBODY), gid: Gid::from_raw(NOBODY) },
        }
    }
}

/// Switches the real, effective and saved uid and gid to `run_as`, with no supplementary
/// groups, keeping the permitted capabilities (PR_SET_KEEPCAPS; the effective set is
/// emptied by the kernel and set again by the caller). `false` when it was not done:
/// pyperch does not run as root, or lacks CAP_SETUID/CAP_SETGID (said once on stderr).
fn switch_user(run_as: RunAs) -> Result<bool, PrivilegeError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(false);
    }
    let has = |c| caps::has_cap(None, CapSet::Effective, c).unwrap_or(false);
    if !has(Capability::CAP_SETUID) || !has(Capability::CAP_SETGID) {
        eprintln!(
            "pyperch: warning: keeps running as uid 0 after start: it lacks CAP_SETUID and CAP_SETGID to switch to uid {}",
            run_as.uid
        );
        return Ok(false);
    }
    let fail = |what: &'static str| move |e: nix::Error| PrivilegeError::Drop { what, message: e.to_string() };
    nix::sys::prctl::set_keepcaps(true).map_err(fail("keeping capabilities across the uid change"))?;
    nix::unistd::setgroups(&[]).map_err(fail("the supplementary groups"))?;
    nix::unistd::setresgid(run_as.gid, run_as.gid, run_as.gid).map_err(fail("the group id"))?;
    nix::unistd::setresuid(run_as.uid, run_as.uid, run_as.uid).map_err(fail("the user id"))?;
    nix::sys::prctl::set_keepcaps(false).map_err(fail("keeping capabilities across the uid change"))?;
    Ok(true)
}

/// The user who ran pyperch through sudo, for the launched command: present when the
/// real uid is 0 and `SUDO_UID` names another user.
#[derive(Debug, Clone)]
pub struct InvokingUser {
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups from the group database (initgroups' list).
    pub groups: Vec<Gid>,
    /// From the passwd entry, when there is one.
    pub name: Option<String>,
    pub home: Option<PathBuf>,
}

impl InvokingUser {
    /// From `SUDO_UID` / `SUDO_GID` and the user database. `None` without sudo, or when
    /// sudo was run by root.
    pub fn from_sudo() -> Option<Self> {
        if !nix::unistd::getuid().is_root() {
            return None;
        }
        let number = |var: &str| std::env::var(var).ok()?.trim().parse::<u32>().ok();
        let uid = Uid::from_raw(number("SUDO_UID")?);
        if uid.is_root() {
            return None;
        }
        let entry = User::from_uid(uid).ok().flatten();
        let gid = number("SUDO_GID").map(Gid::from_raw).or(entry.as_ref().map(|u| u.gid))?;
        let groups = entry
            .as_ref()
            .and_then(|u| CString::new(u.name.clone()).ok())
            .and_then(|name| nix::unistd::getgrouplist(&name, gid).ok())
            .unwrap_or_else(|| vec![gid]);
        Some(Self {
            uid,
            gid,
            groups,
            name: entry.as_ref().map(|u| u.name.clone()),
            home: entry.map(|u| u.dir),
        })
    }

    /// Makes `command` run as this user: supplementary groups, gid and uid are set in the
    /// child before exec (which also clears its capabilities, as for any non-root exec),
    /// and HOME, USER and LOGNAME come from the passwd entry, as `sudo -u USER` would set
    /// them; the rest of the environment is kept.
    pub fn apply(&self, command: &mut Command) {
        if let Some(home) = &self.home {
            command.env("HOME", home);
        }
        if let Some(name) = &self.name {
            command.env("USER", OsString::from(name)).env("LOGNAME", OsString::from(name));
        }
        let (uid, gid, groups) = (self.uid, self.gid, self.groups.clone());
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // setgroups, setgid and setuid system calls (async-signal-safe); `groups` was
        // allocated before the fork and is only read.
        unsafe {
            command.pre_exec(move || {
                nix::unistd::setgroups(&groups)?;
                nix::unistd::setgid(gid)?;
                nix::unistd::setuid(uid)?;
                Ok(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_missing_capability() {
        assert_eq!(missing_from(Capability::CAP_SYS_ADMIN.bitmask() | Capability::CAP_SYS_PTRACE.bitmask()), None);
        let all = Capability::CAP_BPF.bitmask() | Capability::CAP_PERFMON.bitmask() | Capability::CAP_SYS_PTRACE.bitmask();
        assert_eq!(missing_from(all), None);
        let no_perfmon = missing_from(all & !Capability::CAP_PERFMON.bitmask()).unwrap();
        assert_eq!(no_perfmon, "the capability CAP_PERFMON (to sample every CPU with perf events)");
        let none = missing_from(0).unwrap();
        assert!(none.starts_with("the capabilities CAP_BPF (to load its eBPF program), CAP_PERFMON"), "{none}");
        assert!(none.ends_with(" and CAP_SYS_PTRACE (to read the memory of Python processes)"), "{none}");
    }

    fn ourselves() -> RunAs {
        RunAs { uid: nix::unistd::geteuid(), gid: nix::unistd::getegid() }
    }

    fn nobody() -> RunAs {
        RunAs { uid: Uid::from_raw(NOBODY), gid: Gid::from_raw(NOBODY) }
    }

    #[test]
    fn output_in_a_directory_of_our_own_needs_nothing() {
        let dir = std::env::temp_dir().join(format!("pyperch-privileges-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        assert_eq!(output_needs(&dir.join("p.svg"), ourselves()), (false, false));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn output_in_another_users_directory_needs_dac_override() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("pyperch-privileges-other-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        assert_eq!(output_needs(&dir.join("p.svg"), ourselves()), (true, false));
        // Written as nobody after the switch: nobody's folder needs nothing, root's does.
        assert_eq!(output_needs(&dir.join("p.svg"), nobody()), (false, false));
        assert_eq!(output_needs(&std::env::temp_dir().join("x").join("p.svg"), nobody()), (true, true));
        // Sticky and world-writable, holding another user's file of that name: CAP_FOWNER.
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        let file = dir.join("p.svg");
        fs::write(&file, b"").unwrap();
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        assert_eq!(output_needs(&file, ourselves()), (false, true));
        let _ = fs::remove_dir_all(&dir);
    }
}
