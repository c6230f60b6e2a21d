//! `record --pid`: knowing, without reading /proc, when every chosen process has exited.
//!
//! One pidfd per process (`pidfd_open`, Linux 5.3+), taken when the recording starts: it
//! refers to that process and no other, so a PID reused later is never taken for it, and it
//! becomes readable once the process has exited (zombie or reaped). Checking is one `poll`
//! with a zero timeout: it never blocks the sampling loop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The chosen processes, watched for their exit.
pub(crate) struct ExitWatch {
    fds: Vec<(u32, OwnedFd)>,
}

impl ExitWatch {
    /// Watches `pids`; `None` when one of them cannot be watched (a kernel without pidfds, or
    /// a process already gone): the recording then ends as before (duration, Ctrl-C).
    pub(crate) fn open(pids: &[u32]) -> Option<ExitWatch> {
        let mut fds = Vec::with_capacity(pids.len());
        for &pid in pids {
            // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd < 0 {
                return None;
            }
            // SAFETY: `fd` is a new descriptor that nothing else owns.
            fds.push((pid, unsafe { OwnedFd::from_raw_fd(fd as i32) }));
        }
        (!fds.is_empty()).then_some(ExitWatch { fds })
    }

    /// Whether every watched process has exited.
    pub(crate) fn all_exited(&self) -> bool {
        self.fds.iter().all(|(_, fd)| {
            let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, zero timeout.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            n == 1 && p.revents & libc::POLLIN != 0
        })
    }

    /// The watched pids, in the order given.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.fds.iter().map(|(pid, _)| *pid).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_seen_to_exit() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().expect("sleep");
        let watch = ExitWatch::open(&[child.id()]).expect("pidfd_open");
        assert!(!watch.all_exited());
        let _ = child.wait();
        assert!(watch.all_exited());
        assert_eq!(watch.pids(), vec![child.id()]);
    }
}
