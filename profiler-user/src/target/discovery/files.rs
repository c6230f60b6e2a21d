//! The process-wide cache of parsed files, keyed by `(device, inode)` as `/proc/PID/maps`
//! reports them, so each distinct file on the host is opened and parsed once however many
//! processes map it; and the only place discovery opens a target's files.
//!
//! Every mapped file is hostile until checked. The invariants, in the order they apply:
//!
//! - A file under a write lease (`/proc/locks`) is not opened at all: even a non-blocking
//!   open would start breaking the holder's lease. It is retried later.
//! - The path is resolved inside the target's root, never outside it: `openat2` from an
//!   `O_PATH` descriptor of `/proc/PID/root` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`
//!   (an absolute symlink in a container's tree stays in the container), and a symbolic link
//!   as the last component is refused (`O_NOFOLLOW`).
//! - Nothing is opened for reading before it is known to be the mapped file: the path is
//!   first opened `O_PATH` (no device is opened, no lease broken, no filesystem `open`
//!   runs), checked with `statx(AT_STATX_DONT_SYNC)` (no round trip to a network or FUSE
//!   server) to be a regular file with the mapping's inode and device (an anonymous device,
//!   as overlayfs has, may differ: before Linux 6.7 maps showed the backing file's), and only then
//!   reopened through `/proc/self/fd/N` with `O_RDONLY | O_NONBLOCK | O_NOCTTY` and checked
//!   again. A lease taken in between makes that open fail at once (`EWOULDBLOCK`).
//! - If the path does not lead to the mapped file (deleted, replaced by a FIFO or a device,
//!   a symbolic link, another mount namespace), the file is reached through
//!   `/proc/PID/map_files/<range>` (needs `CAP_SYS_ADMIN`), with the same checks.
//! - Opening and parsing run on a short-lived thread of their own; the caller waits at most
//!   [`WAIT_BUDGET`] (the file then counts as not answering in time). The opener goes on:
//!   later inspections skip the file without touching it until it returns (its result is
//!   then cached), and one running longer than [`OPEN_BUDGET`] (a FUSE or network server
//!   that does not answer) is hung. Each process has an allowance of
//!   [`MAX_OPENERS_PER_PROCESS`] openers running at once for its files: past that, its other
//!   files not yet parsed are skipped (and counted), so one process mapping many files of a
//!   server that never answers uses up its own allowance, never the others'. [`MAX_OPENERS`]
//!   bounds the threads of all processes together (a resource bound, not a budget any single
//!   process can reach).
//! - A file that could not be read is not opened again before a backoff (1 s, doubling to
//!   60 s). Each kind of problem is counted once per distinct file ([`counts`]).
//!
//! Successes are cached for the whole run; failures are not.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};

use super::elf::{self, FileFacts};
use super::leases;
use super::procfs::{self, FileKey, Mapping};

/// How long an inspection waits for one file to be opened and parsed; the opener goes on
/// in the background, and its result is cached for a later inspection.
pub const WAIT_BUDGET: Duration = Duration::from_millis(200);
/// An opener running longer than this is hung: it counts in [`hung_files`] (and, like any
/// running opener, against its process's [`MAX_OPENERS_PER_PROCESS`]).
pub const OPEN_BUDGET: Duration = Duration::from_secs(1);
/// How many openers may run at once for the files of one process (each holds a thread until
/// its file answers); past that, that process's files not yet parsed are skipped.
pub const MAX_OPENERS_PER_PROCESS: usize = 4;
/// How many openers may run at once in all (threads, whatever processes they are for).
pub const MAX_OPENERS: usize = 256;
/// Backoff before a failed file is tried again: doubles from the first to the last.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Problem files remembered (for backoff and counting); past that the oldest entries are
/// forgotten, which only means an earlier retry and a second count.
const MAX_REMEMBERED: usize = 4096;
/// `openat2` with `RESOLVE_IN_ROOT` fails with `EAGAIN` when a rename raced it.
const RESOLVE_RETRIES: usize = 3;

/// Why a mapped file was not read (or not through its path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Problem {
    /// It holds a write lease (or delegation): not opened, retried later.
    Leased,
    /// Its path leads to a FIFO, a device, a directory... not a regular file.
    NotRegular,
    /// Its path ends in a symbolic link (or crosses a magic link): refused.
    Symlink,
    /// Its path leads to another file than the mapped one.
    Replaced,
    /// Opening or reading it took longer than [`WAIT_BUDGET`].
    Hung,
}

impl Problem {
    pub const ALL: [Problem; 5] =
        [Problem::Leased, Problem::NotRegular, Problem::Symlink, Problem::Replaced, Problem::Hung];

    pub fn label(self) -> &'static str {
        match self {
            Problem::Leased => "under a write lease (not opened)",
            Problem::NotRegular => "path is not a regular file (FIFO or device)",
            Problem::Symlink => "path is a symbolic link (refused)",
            Problem::Replaced => "path leads to another file",
            Problem::Hung => "did not answer in time (skipped and retried later)",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A mapped file that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A hostile or unusual file: see [`Problem`]. Retried after a backoff.
    #[error("{path}: {problem}")]
    Problem { path: String, problem: Problem },
    /// Anything else (the process exited, permissions, not an ELF file we can read...).
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    pub fn problem(&self) -> Option<Problem> {
        match self {
            FileError::Problem { problem, .. } => Some(*problem),
            FileError::Io { .. } => None,
        }
    }

    pub fn is_permission(&self) -> bool {
        matches!(self, FileError::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied)
    }

    /// Whether the file may well be readable later (lease given up, server answering):
    /// the process should be looked at again rather than settled.
    pub fn is_retryable(&self) -> bool {
        matches!(self.problem(), Some(Problem::Leased | Problem::Hung))
    }
}

/// How a file that could not be read through its path failed (before the fallback).
#[derive(Debug)]
enum OpenFailure {
    Problem(Problem),
    Io(io::Error),
}

impl From<io::Error> for OpenFailure {
    fn from(e: io::Error) -> Self {
        OpenFailure::Io(e)
    }
}

impl From<rustix::io::Errno> for OpenFailure {
    fn from(e: rustix::io::Errno) -> Self {
        match e {
            rustix::io::Errno::WOULDBLOCK => OpenFailure::Problem(Problem::Leased),
            rustix::io::Errno::LOOP => OpenFailure::Problem(Problem::Symlink),
            e => OpenFailure::Io(e.into()),
        }
    }
}

/// What is remembered about a file that failed.
struct Failure {
    problem: Problem,
    failures: u32,
    retry_at: Instant,
    seen: Instant,
}

/// A parsed file, with its accounted size and when it was last used.
struct Parsed {
    facts: Arc<FileFacts>,
    bytes: usize,
    used: Instant,
}

/// Accounted bytes the parsed-file cache may hold.
const PARSED_BUDGET: usize = 4 << 20;
/// Parsed files unused this long are dropped (typically mapped by no process any more; a
/// file dropped is parsed again if a process maps it later).
const PARSED_IDLE_EXPIRY: Duration = Duration::from_secs(600);
/// Accounted per entry beside its variable parts: key, map slot, `FileFacts`, headers.
const PARSED_OVERHEAD: usize = 512;

fn parsed_bytes(facts: &FileFacts) -> usize {
    PARSED_OVERHEAD
        + match facts {
            FileFacts::Python(p) => {
                p.loads.len() * std::mem::size_of::<elf::Segment>() + p.debug_offsets.as_ref().map_or(0, |d| d.len())
            }
            FileFacts::AsyncioModule(bytes) => bytes.len(),
            _ => 0,
        }
}

/// An opener running now.
struct InFlight {
    since: Instant,
    /// The process whose inspection started it (its allowance is charged).
    pid: u32,
}

#[derive(Default)]
struct State {
    parsed: HashMap<FileKey, Parsed>,
    /// Files whose opener runs now: since when, and for which process.
    in_flight: HashMap<FileKey, InFlight>,
    failed: HashMap<FileKey, Failure>,
    /// Each problem seen, once per distinct file (and problem).
    seen: HashSet<(FileKey, Problem)>,
    counts: HashMap<Problem, u64>,
    /// Inspections that skipped a file because it was hung, leased or backing off.
    skips: u64,
    /// Files skipped because their process had [`MAX_OPENERS_PER_PROCESS`] openers running.
    over_allowance: u64,
    /// Files skipped because [`MAX_OPENERS`] openers were running.
    over_total: u64,
}

impl State {
    /// Caches a parsed file, first dropping idle entries, then the least recently used ones
    /// until it fits in `PARSED_BUDGET`.
    fn remember(&mut self, key: FileKey, facts: Arc<FileFacts>) {
        let now = Instant::now();
        let bytes = parsed_bytes(&facts);
        self.parsed.retain(|_, p| now.duration_since(p.used) < PARSED_IDLE_EXPIRY);
        let mut total: usize = self.parsed.values().map(|p| p.bytes).sum::<usize>() + bytes;
        if total > PARSED_BUDGET {
            let mut by_age: Vec<(Instant, FileKey, usize)> = self.parsed.iter().map(|(k, p)| (p.used, *k, p.bytes)).collect();
            by_age.sort_unstable_by_key(|(used, _, _)| *used);
            for (_, old, old_bytes) in by_age {
                if total <= PARSED_BUDGET {
                    break;
                }
                self.parsed.remove(&old);
                total -= old_bytes;
            }
        }
        self.parsed.insert(key, Parsed { facts, bytes, used: now });
    }

    fn note(&mut self, key: FileKey, problem: Problem) {
        if self.seen.len() < MAX_REMEMBERED * 4 && self.seen.insert((key, problem)) {
            *self.counts.entry(problem).or_default() += 1;
        }
    }

    fn fail(&mut self, key: FileKey, problem: Problem) {
        self.note(key, problem);
        let now = Instant::now();
        let failures = self.failed.get(&key).map_or(0, |f| f.failures).saturating_add(1);
        let backoff = FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(6)).min(MAX_BACKOFF);
        if self.failed.len() >= MAX_REMEMBERED && !self.failed.contains_key(&key) {
            if let Some(oldest) = self.failed.iter().min_by_key(|(_, f)| f.seen).map(|(k, _)| *k) {
                self.failed.remove(&oldest);
            }
        }
        self.failed.insert(key, Failure { problem, failures, retry_at: now + backoff, seen: now });
    }
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Default::default);

fn state() -> std::sync::MutexGuard<'static, State> {
    // A panic while holding the lock leaves plain data behind: keep going with it.
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The problems met so far, each counted once per distinct file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileCounts {
    pub problems: Vec<(Problem, u64)>,
    /// Files whose opener has been running longer than [`OPEN_BUDGET`] now.
    pub hung_now: usize,
    /// Times an inspection skipped a file without touching it (hung, leased, backing off,
    /// or an opener allowance used up).
    pub skips: u64,
    /// Of those, skips because the process had [`MAX_OPENERS_PER_PROCESS`] openers running.
    pub over_allowance: u64,
    /// Of those, skips because [`MAX_OPENERS`] openers were running in all.
    pub over_total: u64,
}

pub fn counts() -> FileCounts {
    let state = state();
    FileCounts {
        problems: Problem::ALL.iter().map(|p| (*p, state.counts.get(p).copied().unwrap_or(0))).collect(),
        hung_now: hung_in(&state),
        skips: state.skips,
        over_allowance: state.over_allowance,
        over_total: state.over_total,
    }
}

fn hung_in(state: &State) -> usize {
    state.in_flight.values().filter(|f| f.since.elapsed() >= OPEN_BUDGET).count()
}

/// Files whose open (or read) has been in flight longer than [`OPEN_BUDGET`].
pub fn hung_files() -> usize {
    hung_in(&state())
}

/// Files parsed so far (for statistics).
pub fn cached_files() -> usize {
    state().parsed.len()
}

/// `statx` of an open descriptor without asking a network or FUSE server
/// (`AT_STATX_DONT_SYNC`): the cached attributes are what we compare.
fn stat_fd(fd: impl AsFd) -> rustix::io::Result<rustix::fs::Statx> {
    rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC, StatxFlags::TYPE | StatxFlags::INO)
}

/// Whether two devices may show the same file: equal, or either one an anonymous device
/// (major 0: overlayfs, btrfs subvolumes...), whose file `/proc/PID/maps` showed by its
/// backing file's device before Linux 6.7 while `stat` through the path shows the stacked
/// one.
fn same_device(a: (u32, u32), b: (u32, u32)) -> bool {
    a == b || a.0 == 0 || b.0 == 0
}

/// Checks that `fd` is a regular file with the mapping's identity: its inode, and its device
/// when `check_device` (see [`same_device`]); `/proc/PID/map_files`, which by construction
/// is the mapped file, is checked by inode only.
fn check(fd: impl AsFd, key: FileKey, check_device: bool) -> Result<(), OpenFailure> {
    let st = stat_fd(fd)?;
    let kind = FileType::from_raw_mode(st.stx_mode.into());
    match kind {
        FileType::RegularFile => {}
        FileType::Symlink => return Err(OpenFailure::Problem(Problem::Symlink)),
        _ => return Err(OpenFailure::Problem(Problem::NotRegular)),
    }
    let device = (st.stx_dev_major, st.stx_dev_minor);
    if st.stx_ino != key.inode || (check_device && !same_device(device, key.dev)) {
        return Err(OpenFailure::Problem(Problem::Replaced));
    }
    Ok(())
}

/// Reopens a checked `O_PATH` descriptor for reading, without blocking (a lease taken
/// since gives `EWOULDBLOCK` at once), and checks the result is still that file.
fn reopen(path_fd: &OwnedFd, key: FileKey, check_device: bool) -> Result<File, OpenFailure> {
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", path_fd.as_raw_fd()),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    check(&fd, key, check_device)?;
    Ok(File::from(fd))
}

/// Opens `path` (as the target sees it) inside the target's root, `O_PATH`.
fn open_in_root(pid: u32, path: &str) -> Result<OwnedFd, OpenFailure> {
    let root = rustix::fs::open(
        procfs::proc_path(pid, "root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let relative = procfs::root_relative(path);
    let mut attempt = 0;
    loop {
        match rustix::fs::openat2(
            &root,
            relative,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(rustix::io::Errno::AGAIN) if attempt < RESOLVE_RETRIES => attempt += 1,
            result => return Ok(result?),
        }
    }
}

/// The file behind `mapping` of `pid` through its path inside the target's root.
fn open_by_path(pid: u32, mapping: &Mapping) -> Result<File, OpenFailure> {
    let fd = open_in_root(pid, &mapping.path)?;
    check(&fd, mapping.key(), true)?;
    reopen(&fd, mapping.key(), true)
}

/// The file behind `mapping` of `pid` through `/proc/PID/map_files/<range>`.
fn open_map_file(pid: u32, mapping: &Mapping) -> Result<File, OpenFailure> {
    // A magic link to the mapped file itself: followed, but opened O_PATH only.
    let fd = rustix::fs::open(procfs::map_file(pid, mapping), OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    check(&fd, mapping.key(), false)?;
    reopen(&fd, mapping.key(), false)
}

/// Opens the file behind `mapping` of process `pid` for reading (see the module docs).
/// Problems met on the way are reported through `note` even when the fallback succeeds.
fn open_mapped(pid: u32, mapping: &Mapping, note: &mut impl FnMut(Problem)) -> Result<File, OpenFailure> {
    let first = if mapping.deleted { None } else { Some(open_by_path(pid, mapping)) };
    let first = match first {
        Some(Ok(file)) => return Ok(file),
        // Someone holds the file under a lease: the other way in would break it too.
        Some(Err(OpenFailure::Problem(Problem::Leased))) => return Err(OpenFailure::Problem(Problem::Leased)),
        Some(Err(e)) => Some(e),
        None => None,
    };
    if let Some(OpenFailure::Problem(problem)) = &first {
        note(*problem);
    }
    match (open_map_file(pid, mapping), first) {
        (Ok(file), _) => Ok(file),
        (Err(fallback @ OpenFailure::Problem(Problem::Leased)), _) => Err(fallback),
        (Err(_), Some(first)) => Err(first),
        (Err(fallback), None) => Err(fallback),
    }
}

/// Opens the file behind `mapping` of `pid` for reading with every check of this module
/// (lease, root-confined path, identity, non-blocking open), on the caller's thread and
/// without the parsed-file cache: for callers that read other parts of the file and run this
/// on a thread of their own with a time limit (`native`).
pub fn open_checked(pid: u32, mapping: &Mapping) -> Result<File, FileError> {
    if leases::is_write_leased(mapping.key()) {
        return Err(FileError::Problem { path: mapping.path.clone(), problem: Problem::Leased });
    }
    open_mapped(pid, mapping, &mut |_| {}).map_err(|e| match e {
        OpenFailure::Problem(problem) => FileError::Problem { path: mapping.path.clone(), problem },
        OpenFailure::Io(source) => FileError::Io { path: mapping.path.clone(), source },
    })
}

/// Opens and parses, on the caller's thread (the opener thread of [`facts`]).
fn load(pid: u32, mapping: &Mapping) -> Result<Arc<FileFacts>, (Option<Problem>, FileError)> {
    let path = mapping.path.clone();
    let key = mapping.key();
    let mut noted = Vec::new();
    let opened = open_mapped(pid, mapping, &mut |p| noted.push(p));
    if !noted.is_empty() {
        let mut state = state();
        for p in noted {
            state.note(key, p);
        }
    }
    let file = opened.map_err(|e| match e {
        OpenFailure::Problem(problem) => (Some(problem), FileError::Problem { path: path.clone(), problem }),
        OpenFailure::Io(source) => (None, FileError::Io { path: path.clone(), source }),
    })?;
    elf::parse(file).map(Arc::new).map_err(|source| (None, FileError::Io { path, source }))
}

/// What the file behind `mapping` is, from the cache or parsed now (waiting at most
/// [`WAIT_BUDGET`]; see the module docs).
pub fn facts(pid: u32, mapping: &Mapping) -> Result<Arc<FileFacts>, FileError> {
    let key = mapping.key();
    let skipped = |state: &mut State, problem| {
        state.skips += 1;
        Err(FileError::Problem { path: mapping.path.clone(), problem })
    };
    {
        let mut state = state();
        if let Some(found) = state.parsed.get_mut(&key) {
            found.used = Instant::now();
            return Ok(found.facts.clone());
        }
        if state.in_flight.contains_key(&key) {
            return skipped(&mut state, Problem::Hung);
        }
        if let Some(failure) = state.failed.get(&key) {
            if Instant::now() < failure.retry_at {
                let problem = failure.problem;
                return skipped(&mut state, problem);
            }
        }
        if state.in_flight.len() >= MAX_OPENERS {
            state.over_total += 1;
            return skipped(&mut state, Problem::Hung);
        }
        if state.in_flight.values().filter(|f| f.pid == pid).count() >= MAX_OPENERS_PER_PROCESS {
            state.over_allowance += 1;
            return skipped(&mut state, Problem::Hung);
        }
    }
    if leases::is_write_leased(key) {
        let mut state = state();
        state.fail(key, Problem::Leased);
        return skipped(&mut state, Problem::Leased);
    }
    state().in_flight.insert(key, InFlight { since: Instant::now(), pid });

    let (done, outcome) = mpsc::sync_channel(1);
    let owned = mapping.clone();
    let opener = std::thread::Builder::new().name("pyperch-open".into()).spawn(move || {
        let result = load(pid, &owned);
        let mut state = state();
        state.in_flight.remove(&key);
        match &result {
            Ok(parsed) => {
                state.remember(key, parsed.clone());
                state.failed.remove(&key);
            }
            Err((Some(problem), _)) => state.fail(key, *problem),
            Err((None, _)) => {}
        }
        drop(state);
        // The caller may have given up waiting: then nobody receives this.
        let _ = done.send(result.map_err(|(_, e)| e));
    });
    if let Err(source) = opener {
        state().in_flight.remove(&key);
        return Err(FileError::Io { path: mapping.path.clone(), source });
    }
    match outcome.recv_timeout(WAIT_BUDGET) {
        Ok(result) => result,
        Err(_) => {
            let mut state = state();
            state.note(key, Problem::Hung);
            Err(FileError::Problem { path: mapping.path.clone(), problem: Problem::Hung })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pyperch-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn mapping_of(path: &std::path::Path, shown_as: &str) -> Mapping {
        let meta = std::fs::metadata(path).expect("metadata");
        let dev = meta.dev();
        Mapping {
            start: 0x1000,
            end: 0x2000,
            perms: *b"r--p",
            offset: 0,
            dev: (rustix::fs::major(dev), rustix::fs::minor(dev)),
            inode: meta.ino(),
            path: shown_as.into(),
            deleted: false,
        }
    }

    /// Our own root is `/`: a file is opened through `/proc/self/root` and checked.
    #[test]
    fn regular_file_through_the_root() {
        let dir = scratch("regular");
        let file = dir.join("lib.so");
        std::fs::write(&file, b"not an elf file").expect("write");
        let m = mapping_of(&file, &file.to_string_lossy());
        let opened = open_by_path(std::process::id(), &m);
        assert!(opened.is_ok(), "{opened:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A FIFO swapped in for the mapped path is refused without being opened (an open of a
    /// FIFO with no writer would block).
    #[test]
    fn fifo_and_symlink_at_the_path_are_refused() {
        let dir = scratch("fifo");
        let file = dir.join("lib.so");
        std::fs::write(&file, b"data").expect("write");
        let m = mapping_of(&file, &file.to_string_lossy());
        std::fs::rename(&file, dir.join("old.so")).expect("rename");
        rustix::fs::mknodat(rustix::fs::CWD, &file, FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
        let pid = std::process::id();
        assert!(matches!(open_by_path(pid, &m), Err(OpenFailure::Problem(Problem::NotRegular))));
        std::fs::remove_file(&file).expect("rm");
        std::os::unix::fs::symlink(dir.join("old.so"), &file).expect("symlink");
        assert!(matches!(open_by_path(pid, &m), Err(OpenFailure::Problem(Problem::Symlink))));
        std::fs::remove_file(&file).expect("rm");
        std::fs::write(&file, b"another file").expect("write");
        assert!(matches!(open_by_path(pid, &m), Err(OpenFailure::Problem(Problem::Replaced))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An absolute symbolic link inside a root is resolved inside that root, never on the
    /// host: tested with a directory as the root (what `/proc/PID/root` gives for a chroot).
    #[test]
    fn absolute_symlinks_stay_in_the_root() {
        let dir = scratch("root");
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("lib")).expect("mkdir");
        let host = dir.join("host-secret");
        std::fs::write(&host, b"host").expect("write");
        // root/lib/escape -> /<host dir> (absolute): in the root that is root/<host dir>.
        std::os::unix::fs::symlink(&dir, root.join("lib/escape")).expect("symlink");
        let root_fd =
            rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).expect("root");
        let through = rustix::fs::openat2(
            &root_fd,
            "lib/escape/host-secret",
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        );
        assert_eq!(through.err(), Some(rustix::io::Errno::NOENT));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn devices() {
        assert!(same_device((8, 1), (8, 1)));
        assert!(!same_device((8, 1), (8, 2)));
        assert!(same_device((0, 52), (8, 1)), "overlayfs before 6.7: maps show the backing device");
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let mut state = State::default();
        let key = FileKey { dev: (1, 2), inode: 3 };
        state.fail(key, Problem::Leased);
        let first = state.failed[&key].retry_at;
        state.fail(key, Problem::Leased);
        assert!(state.failed[&key].retry_at > first);
        for _ in 0..40 {
            state.fail(key, Problem::Leased);
        }
        assert!(state.failed[&key].retry_at <= Instant::now() + MAX_BACKOFF);
        assert_eq!(state.counts[&Problem::Leased], 1, "counted once per file");
    }
}
