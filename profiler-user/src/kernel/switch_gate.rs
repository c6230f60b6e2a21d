//! The scheduler-switch program's attachment, held apart so that `--max-cpu` can pause it.
//!
//! The program runs on every context switch of the host. What it does for a switch is made
//! small by the sampled share, but its call is not: at hundreds of thousands of switches a
//! second that fixed cost alone is over a budget of a few percent of a CPU. The budget's
//! thread then attaches it one time slice in `n` and detaches it in between
//! ([`SwitchGate::open`], [`SwitchGate::close`]), and the kernel weighs each switch-out it
//! walks `n` times more (`share_slot::SWITCH_SLICES`).
//!
//! What a pause costs the profile, and how it is kept exact:
//! - a switch-out in a pause is not seen: slices are taken at a random offset in each
//!   second, so the switch-outs seen are a random `1/n` of all, each weighed `n`;
//! - before a pause the program drains (`share_slot::DRAINING`): it walks no new switch-out
//!   while pending intervals end, so waits shorter than the drain are never cut;
//! - a wait still pending when the pause begins ends exactly at its switch-in if the thread
//!   did not run in between; if it ran unseen, the kernel drops it at its switch-in
//!   (`counter::OFF_CPU_END_MISSED`, by the thread's arrivals count), and userspace checks the
//!   same count (`/proc/PID/task/TID/schedstat`) before it charges a wait that spans a pause
//!   ([`SwitchGate::paused_since`]). So waits longer than the drain that end in a pause are
//!   lost (under-counted), never charged with time the thread ran.
//!
//! The link is this module's own (`BPF_RAW_TRACEPOINT_OPEN` on the program's descriptor):
//! closing it detaches the program, from whichever thread holds the gate.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// `BPF_RAW_TRACEPOINT_OPEN`: attaches a BTF tracepoint program (its attach point comes from
/// its load; the name is NULL) and answers a link descriptor.
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;

/// `union bpf_attr`'s `raw_tracepoint` part.
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

#[derive(Debug)]
struct Link {
    /// The attachment, while attached.
    link: Option<OwnedFd>,
    /// Closed for good (`retire`): never attached again.
    retired: bool,
}

/// The scheduler-switch program's attachment; see the module docs. Shared by the session
/// (which attaches it first and retires it at the end) and the budget's thread (which pauses
/// it).
#[derive(Debug)]
pub struct SwitchGate {
    program: OwnedFd,
    link: Mutex<Link>,
    /// The end of the latest pause (kernel monotonic clock), `u64::MAX` during one, 0 if none
    /// yet.
    last_pause_end_ns: AtomicU64,
    /// Time spent paused, nanoseconds (pauses ended).
    paused_ns: AtomicU64,
    /// When the current pause began (0: none).
    pause_began_ns: AtomicU64,
    /// Pauses begun.
    pauses: AtomicU64,
}

impl SwitchGate {
    /// A gate over the program behind `program` (a descriptor of its own), not attached.
    pub fn new(program: OwnedFd) -> Self {
        SwitchGate {
            program,
            link: Mutex::new(Link { link: None, retired: false }),
            last_pause_end_ns: AtomicU64::new(0),
            paused_ns: AtomicU64::new(0),
            pause_began_ns: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Attaches the program (nothing if attached, or retired). The end of a pause.
    pub fn open(&self) -> std::io::Result<()> {
        let mut link = self.lock();
        if link.retired || link.link.is_some() {
            return Ok(());
        }
        let attr = RawTracepointAttr { prog_fd: self.program.as_raw_fd() as u32, ..Default::default() };
        // SAFETY: bpf(2) reads `size` bytes of `attr`, a live, initialised struct of that size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_RAW_TRACEPOINT_OPEN,
                &attr as *const RawTracepointAttr,
                std::mem::size_of::<RawTracepointAttr>() as u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor, owned by nobody else.
        link.link = Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        let began = self.pause_began_ns.swap(0, Ordering::Relaxed);
        let now = crate::kernel::loader::monotonic_ns();
        if began != 0 {
            self.paused_ns.fetch_add(now.saturating_sub(began), Ordering::Relaxed);
            self.last_pause_end_ns.store(now, Ordering::Release);
        }
        Ok(())
    }

    /// Detaches the program (nothing if detached): a pause begins once this returns.
    pub fn close(&self) {
        let mut link = self.lock();
        if link.link.take().is_some() && !link.retired {
            // Marked paused before anyone can read a pending interval begun before it.
            self.last_pause_end_ns.store(u64::MAX, Ordering::Release);
            self.pause_began_ns.store(crate::kernel::loader::monotonic_ns(), Ordering::Relaxed);
            self.pauses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Detaches the program for good (the end of sampling).
    pub fn retire(&self) {
        let mut link = self.lock();
        link.retired = true;
        link.link.take();
    }

    /// Whether the program may have missed a switch since `since_ns` (kernel monotonic
    /// clock): a pause ended after it, or one is under way.
    pub fn paused_since(&self, since_ns: u64) -> bool {
        self.last_pause_end_ns.load(Ordering::Acquire) >= since_ns.max(1)
    }

    /// Pauses begun, and the time spent paused up to `now_ns`.
    pub fn pauses(&self, now_ns: u64) -> (u64, u64) {
        let began = self.pause_began_ns.load(Ordering::Relaxed);
        let ongoing = if began != 0 { now_ns.saturating_sub(began) } else { 0 };
        (self.pauses.load(Ordering::Relaxed), self.paused_ns.load(Ordering::Relaxed) + ongoing)
    }
}

/// Thread `tid` of `pid`'s arrivals on a CPU (`sched_info.pcount`, the third field of
/// `/proc/PID/task/TID/schedstat`), `None` when it cannot be read (the thread is gone).
/// Bounded: the file is one short line.
pub fn thread_arrivals(pid: u32, tid: u32) -> Option<u64> {
    use std::io::Read;
    let file = std::fs::File::open(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    let mut text = String::new();
    file.take(256).read_to_string(&mut text).ok()?;
    arrivals_of(&text)
}

/// The arrivals field of a schedstat line.
fn arrivals_of(schedstat: &str) -> Option<u64> {
    schedstat.split_ascii_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_from_schedstat() {
        assert_eq!(arrivals_of("245089 0 17\n"), Some(17));
        assert_eq!(arrivals_of("245089 0\n"), None);
        assert_eq!(arrivals_of("a b c"), None);
        // This thread has run at least once.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(thread_arrivals(std::process::id(), tid).is_some_and(|n| n >= 1));
    }

    /// A pause is seen by every wait that began before its end, not by later ones.
    #[test]
    fn pauses_are_seen_by_waits_they_overlap() {
        let fd: OwnedFd = std::fs::File::open("/dev/null").expect("null").into();
        let gate = SwitchGate::new(fd);
        assert!(!gate.paused_since(1), "never paused");
        // Not attached: close does nothing.
        gate.close();
        assert_eq!(gate.pauses(0).0, 0);
        // A pause under way, as `close` leaves it.
        gate.last_pause_end_ns.store(u64::MAX, Ordering::Release);
        assert!(gate.paused_since(u64::MAX - 1));
        gate.last_pause_end_ns.store(1_000, Ordering::Release);
        assert!(gate.paused_since(999));
        assert!(gate.paused_since(1_000));
        assert!(!gate.paused_since(1_001));
    }
}
