//! pyperch's own CPU: its threads' (`getrusage(RUSAGE_SELF)`: user + system time of every
//! thread, not of children such as a launched command) plus its kernel programs' run time
//! (`run_time_ns` in `/proc/self/fdinfo/FD` of each program's descriptor), which the kernel
//! counts only while its BPF statistics are on: [`enable_bpf_stats`] turns them on for as
//! long as its descriptor is held (`BPF_ENABLE_STATS`, Linux 5.8+, needs CAP_SYS_ADMIN: taken
//! before the privilege drop), or they may be on already (`kernel.bpf_stats_enabled=1`).
//!
//! Everything read here is pyperch's own (its rusage, its descriptors' fdinfo): nothing a
//! target controls, and nothing that blocks.

use std::os::fd::{AsRawFd, OwnedFd};

/// The sysctl that says whether the kernel counts BPF programs' run time.
const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
/// fdinfo is a few hundred bytes; more is not read.
const FDINFO_BYTES: u64 = 4096;

/// Whether the kernel's BPF run-time statistics are on while the returned descriptor is held
/// (`Some(Some(fd))`: turned on here; `Some(None)`: on already by the sysctl; `None`: off,
/// BPF time cannot be measured).
pub(crate) fn enable_bpf_stats() -> Option<Option<OwnedFd>> {
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(Some(fd)),
        Err(e) => {
            if std::fs::read_to_string(STATS_SYSCTL).is_ok_and(|v| v.trim() == "1") {
                Some(None)
            } else {
                log::debug!("BPF run-time statistics unavailable: {e}");
                None
            }
        }
    }
}

/// One reading: cumulative nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// pyperch's threads, user + system.
    pub(crate) threads_ns: u64,
    /// pyperch's kernel programs (0 when not measured).
    pub(crate) bpf_ns: u64,
}

/// Reads pyperch's CPU; holds the program descriptors and the statistics' descriptor.
pub(crate) struct Meter {
    programs: Vec<OwnedFd>,
    /// Keeps the kernel's BPF statistics on (when this turned them on).
    _stats: Option<OwnedFd>,
    /// Whether the programs' run time is counted.
    bpf_measured: bool,
}

impl Meter {
    /// A meter over `programs` (descriptors of pyperch's kernel programs); `stats` is what
    /// [`enable_bpf_stats`] answered.
    pub(crate) fn new(programs: Vec<OwnedFd>, stats: Option<Option<OwnedFd>>) -> Self {
        let bpf_measured = stats.is_some();
        Meter { programs, _stats: stats.flatten(), bpf_measured }
    }

    /// Whether the kernel programs' run time is part of the readings.
    pub(crate) fn bpf_measured(&self) -> bool {
        self.bpf_measured
    }

    pub(crate) fn read(&self) -> Reading {
        let bpf_ns = if self.bpf_measured { self.programs.iter().map(|fd| program_run_time_ns(fd)).sum() } else { 0 };
        Reading { threads_ns: own_cpu_ns(), bpf_ns }
    }
}

/// User + system time of every thread of this process, in nanoseconds.
fn own_cpu_ns() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer, which is valid and large enough.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: getrusage succeeded and filled it (it was zeroed before in any case).
    let usage = unsafe { usage.assume_init() };
    timeval_ns(usage.ru_utime).saturating_add(timeval_ns(usage.ru_stime))
}

fn timeval_ns(t: libc::timeval) -> u64 {
    (t.tv_sec.max(0) as u64).saturating_mul(1_000_000_000).saturating_add((t.tv_usec.max(0) as u64).saturating_mul(1_000))
}

/// `run_time_ns` of the program behind `fd` (0 when not readable).
fn program_run_time_ns(fd: &OwnedFd) -> u64 {
    use std::io::Read;
    let Ok(file) = std::fs::File::open(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())) else { return 0 };
    let mut text = String::new();
    if file.take(FDINFO_BYTES).read_to_string(&mut text).is_err() {
        return 0;
    }
    run_time_ns_of(&text)
}

/// The `run_time_ns:` field of a BPF program's fdinfo text (0 when absent).
fn run_time_ns_of(fdinfo: &str) -> u64 {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("run_time_ns:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_time_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nprog_type:\t7\nprog_jited:\t1\nprog_tag:\tab\nmemlock:\t4096\nprog_id:\t42\nrun_time_ns:\t123456\nrun_cnt:\t7\nrecursion_misses:\t0\nverified_insns:\t100\n";
        assert_eq!(run_time_ns_of(text), 123_456);
        assert_eq!(run_time_ns_of("prog_id:\t1\n"), 0);
        assert_eq!(run_time_ns_of("run_time_ns:\tnonsense\n"), 0);
    }

    #[test]
    fn own_cpu_grows_with_work() {
        let before = own_cpu_ns();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(own_cpu_ns() > before);
    }
}
