//! The process-wide cache of the files `--native` reads (`module_file`): each file is read
//! on a thread of its own that nobody waits for (at most `MAX_IN_FLIGHT` at once, and at
//! most `MAX_IN_FLIGHT_PER_PROCESS` started for one process): whoever asked is told through
//! a channel when the read ends. A read asked for beyond those limits waits in a bounded
//! queue (`MAX_QUEUED`, at most `MAX_QUEUED_PER_PROCESS` of one process) and starts as soon
//! as a reader ends, so a process's files are read back to back (numpy maps about 40).
//! Files are kept by identity (device, inode), bounded in bytes.
//!
//! The cache ([`FILES_BUDGET`]) evicts the least recently used files even while processes
//! use them: an evicted file's processes drop it at their next sample (`evicted_since`), its
//! frames then show as `library+0xOFFSET`, and it is read again after `RETRY_AFTER`. A file
//! is charged to the process it was first read for; past [`PROCESS_SHARE`] that process's
//! own files go first, so one process never pushes every other one's files out.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
        mpsc,
    },
    time::{Duration, Instant},
};

use super::module_file::{EarlyRows, ModuleFile, base_name, read};
use crate::target::discovery::{FileKey, Mapping, open_checked};

/// Bytes the cache of files may hold; past that, the least recently used files are dropped
/// (in use or not).
pub const FILES_BUDGET: usize = 256 << 20;
/// Bytes of cached files charged to one process before its own files are evicted first.
pub const PROCESS_SHARE: usize = FILES_BUDGET / 4;
/// A file that failed, or was evicted, is not read again before this.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// A file being read, and who waits for it.
struct InFlight {
    /// The process it is read for (charged to its allowance while in flight).
    pid: u32,
    /// Told when the file is read (or found unreadable); a waiter gone meanwhile is skipped.
    waiters: Vec<mpsc::Sender<Loaded>>,
}

/// A cached file.
struct Entry {
    file: Arc<ModuleFile>,
    used: Instant,
    /// The process it was read for (charged for its bytes).
    owner: u32,
}

/// A read put off because too many were in flight; started when a reader ends.
struct Queued {
    pid: u32,
    mapping: Mapping,
    waiter: mpsc::Sender<Loaded>,
}

#[derive(Default)]
struct Cache {
    files: HashMap<FileKey, Entry>,
    /// Files that failed or were evicted, and when (not read again before `RETRY_AFTER`).
    failed: HashMap<FileKey, Instant>,
    in_flight: HashMap<FileKey, InFlight>,
    /// Reads waiting for a reader, oldest first (at most `MAX_QUEUED`).
    queued: VecDeque<Queued>,
    bytes: usize,
    /// Bytes of `files` charged to each process.
    charged: HashMap<u32, usize>,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Default::default);
/// Files evicted so far: a process whose count differs drops the files no longer cached.
static EVICTIONS: AtomicU64 = AtomicU64::new(0);
/// Loads not started at once because the asking process had `MAX_IN_FLIGHT_PER_PROCESS`
/// in flight (queued, or put off when the queue was full).
static PROCESS_BUSY: AtomicU64 = AtomicU64::new(0);

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Files read at once, at most (each on a thread of its own). A file on a file system that
/// never answers keeps its thread for ever: past this many, no new file is started.
pub const MAX_IN_FLIGHT: usize = 16;
/// Files in flight started for one process, at most: a process whose mapped files never
/// answer holds only these, and every other process keeps the rest of `MAX_IN_FLIGHT`.
pub const MAX_IN_FLIGHT_PER_PROCESS: usize = 4;
/// Waiters kept per file in flight (beyond: told nothing; they ask again later).
const MAX_WAITERS: usize = 256;
/// Reads waiting for a reader, at most; beyond, a read is put off (`Loading::Busy`) until
/// its process asks again.
pub const MAX_QUEUED: usize = 4096;
/// Reads of one process waiting, at most: one process's mappings cannot fill the queue.
pub const MAX_QUEUED_PER_PROCESS: usize = 512;

/// News of a file being read, to each process waiting for it.
pub enum Loaded {
    /// The kernel walk's part, before the symbols and lines (only to the processes waiting
    /// at that moment; the others get the file whole).
    Rows(FileKey, Arc<EarlyRows>),
    /// The read finished: the file, or `None` when it gave no unwind data.
    Read(FileKey, Option<Arc<ModuleFile>>),
}

/// Where the file behind a mapping stands, without waiting.
pub enum Loading {
    /// Read already (cached).
    Ready(Arc<ModuleFile>),
    /// Being read, or queued to be: the waiter given to [`start_load`] is told on its end.
    InFlight,
    /// Not readable, not ELF x86_64, or failed or evicted recently (tried again after
    /// `RETRY_AFTER`).
    Unreadable,
    /// Too many files are being read and queued already, in all or for this process
    /// (tried again later, by a later request).
    Busy,
}

/// The file behind `mapping` of `pid`: from the cache, or read on a thread of its own (now,
/// or queued until a reader ends), whose end is sent to `waiter` (also when the file was in
/// flight already). Never waits on the file: the cache's lock is held only for bookkeeping.
pub fn start_load(pid: u32, mapping: &Mapping, waiter: &mpsc::Sender<Loaded>) -> Loading {
    let key = mapping.key();
    let mut c = cache();
    match known(&mut c, key, waiter) {
        Some(Known::Cached(file)) => return Loading::Ready(file),
        Some(Known::Joined) => return Loading::InFlight,
        Some(Known::Failed) => return Loading::Unreadable,
        None => {}
    }
    if !admit(&c, pid) {
        // Asked again (the process reads its maps again while files load): queued once.
        if c.queued.iter().any(|q| q.pid == pid && q.mapping.key() == key) {
            return Loading::InFlight;
        }
        let of_pid = c.queued.iter().filter(|q| q.pid == pid).count();
        if c.queued.len() >= MAX_QUEUED || of_pid >= MAX_QUEUED_PER_PROCESS {
            return Loading::Busy;
        }
        c.queued.push_back(Queued { pid, mapping: mapping.clone(), waiter: waiter.clone() });
        return Loading::InFlight;
    }
    if spawn_reader(&mut c, pid, mapping.clone(), vec![waiter.clone()]) { Loading::InFlight } else { Loading::Unreadable }
}

/// Starts reading `mapping`'s file for `pid` on a thread of its own (counted in flight);
/// its end goes to `waiters`, then the next queued read starts. `false` when no thread
/// could be started.
fn spawn_reader(c: &mut Cache, pid: u32, mapping: Mapping, waiters: Vec<mpsc::Sender<Loaded>>) -> bool {
    let key = mapping.key();
    c.in_flight.insert(key, InFlight { pid, waiters });
    let spawned = std::thread::Builder::new().name("pyperch-native".into()).spawn(move || {
        let name = base_name(&mapping.path).to_string();
        // A file that makes the parser panic counts as unreadable.
        let early = |rows: EarlyRows| {
            let rows = Arc::new(rows);
            let waiters = cache().in_flight.get(&key).map(|f| f.waiters.clone()).unwrap_or_default();
            for w in waiters {
                let _ = w.send(Loaded::Rows(key, rows.clone()));
            }
        };
        let result = std::panic::catch_unwind(|| open_checked(pid, &mapping).ok().and_then(|file| read(file, &name, &mapping.path, early)))
            .ok()
            .flatten()
            .map(Arc::new);
        let mut c = cache();
        let waiters = c.in_flight.remove(&key).map(|f| f.waiters).unwrap_or_default();
        match &result {
            Some(file) => insert(&mut c, key, file.clone(), pid),
            None => note_failed(&mut c, key),
        }
        start_queued(&mut c);
        drop(c);
        for w in waiters {
            let _ = w.send(Loaded::Read(key, result.clone()));
        }
    });
    if spawned.is_err() {
        c.in_flight.remove(&key);
        return false;
    }
    true
}

/// What the cache already knows of a file, without starting a read.
enum Known {
    Cached(Arc<ModuleFile>),
    /// In flight: `waiter` joined its waiters (if there was room).
    Joined,
    /// Failed or evicted recently.
    Failed,
}

/// The file `key` if cached (marked used), in flight (with `waiter` joined), or failed
/// recently; `None` when a read has to start.
fn known(c: &mut Cache, key: FileKey, waiter: &mpsc::Sender<Loaded>) -> Option<Known> {
    if let Some(entry) = c.files.get_mut(&key) {
        entry.used = Instant::now();
        return Some(Known::Cached(entry.file.clone()));
    }
    if let Some(flight) = c.in_flight.get_mut(&key) {
        if flight.waiters.len() < MAX_WAITERS {
            flight.waiters.push(waiter.clone());
        }
        return Some(Known::Joined);
    }
    c.failed.get(&key).is_some_and(|at| at.elapsed() < RETRY_AFTER).then_some(Known::Failed)
}

/// Starts the oldest queued read a reader may now take; queued reads whose file was read,
/// or is in flight, or failed meanwhile, are answered (or joined) on the way.
fn start_queued(c: &mut Cache) {
    let mut i = 0;
    while i < c.queued.len() {
        let key = c.queued[i].mapping.key();
        let waiter = c.queued[i].waiter.clone();
        if let Some(known) = known(c, key, &waiter) {
            c.queued.remove(i);
            match known {
                Known::Cached(file) => drop(waiter.send(Loaded::Read(key, Some(file)))),
                Known::Failed => drop(waiter.send(Loaded::Read(key, None))),
                Known::Joined => {}
            }
            continue;
        }
        if may_start(c, c.queued[i].pid) {
            if let Some(q) = c.queued.remove(i) {
                if !spawn_reader(c, q.pid, q.mapping, vec![q.waiter.clone()]) {
                    let _ = q.waiter.send(Loaded::Read(key, None));
                }
            }
            return;
        }
        i += 1;
    }
}

/// Forgets `pid`'s queued reads (its process is no longer profiled).
pub fn forget_queued(pid: u32) {
    cache().queued.retain(|q| q.pid != pid);
}

/// Whether a new file may start being read for `pid`: fewer than `MAX_IN_FLIGHT` in flight
/// in all, and fewer than `MAX_IN_FLIGHT_PER_PROCESS` started for `pid` (counted).
fn admit(c: &Cache, pid: u32) -> bool {
    if c.in_flight.len() >= MAX_IN_FLIGHT {
        return false;
    }
    if !may_start(c, pid) {
        PROCESS_BUSY.fetch_add(1, Relaxed);
        return false;
    }
    true
}

/// `admit` without counting.
fn may_start(c: &Cache, pid: u32) -> bool {
    c.in_flight.len() < MAX_IN_FLIGHT && c.in_flight.values().filter(|f| f.pid == pid).count() < MAX_IN_FLIGHT_PER_PROCESS
}

fn note_failed(c: &mut Cache, key: FileKey) {
    if c.failed.len() > 4096 {
        c.failed.retain(|_, at| at.elapsed() < RETRY_AFTER);
        if c.failed.len() > 4096 {
            c.failed.clear();
        }
    }
    c.failed.insert(key, Instant::now());
}

/// Files being read now (a file that hangs stays counted until its read ends).
pub fn in_flight() -> usize {
    cache().in_flight.len()
}

/// Caches a file read for `owner`. Past `PROCESS_SHARE` charged to `owner`, its own least
/// recently used files are evicted first; past `FILES_BUDGET`, anyone's, in use or not.
/// The file just read is kept either way (it fits: at most `MAX_FILE_BYTES`).
fn insert(c: &mut Cache, key: FileKey, file: Arc<ModuleFile>, owner: u32) {
    let size = file.bytes;
    c.bytes = c.bytes.saturating_add(size);
    *c.charged.entry(owner).or_default() += size;
    if let Some(old) = c.files.insert(key, Entry { file, used: Instant::now(), owner }) {
        uncharge(c, old.owner, old.file.bytes);
    }
    if c.charged.get(&owner).copied().unwrap_or(0) > PROCESS_SHARE {
        evict(c, key, Some(owner), PROCESS_SHARE);
    }
    if c.bytes > FILES_BUDGET {
        evict(c, key, None, FILES_BUDGET);
    }
}

fn uncharge(c: &mut Cache, owner: u32, size: usize) {
    c.bytes = c.bytes.saturating_sub(size);
    if let Some(charged) = c.charged.get_mut(&owner) {
        *charged = charged.saturating_sub(size);
        if *charged == 0 {
            c.charged.remove(&owner);
        }
    }
}

/// Evicts least recently used files (of `owner` only, when given), never `keep`, until the
/// bytes counted (the owner's, or all) are within `limit`.
fn evict(c: &mut Cache, keep: FileKey, owner: Option<u32>, limit: usize) {
    let mut order: Vec<(Instant, FileKey)> = c
        .files
        .iter()
        .filter(|(k, e)| **k != keep && owner.is_none_or(|o| e.owner == o))
        .map(|(k, e)| (e.used, *k))
        .collect();
    order.sort_unstable();
    for (_, k) in order {
        let over = match owner {
            Some(o) => c.charged.get(&o).copied().unwrap_or(0) > limit,
            None => c.bytes > limit,
        };
        if !over {
            break;
        }
        if let Some(e) = c.files.remove(&k) {
            uncharge(c, e.owner, e.file.bytes);
            note_failed(c, k);
            EVICTIONS.fetch_add(1, Relaxed);
        }
    }
}

/// Files evicted so far (compare with a previous value to know whether to look).
pub fn evictions() -> u64 {
    EVICTIONS.load(Relaxed)
}

/// Whether `file` (read for `key`) is still the cached one.
pub fn is_cached(key: &FileKey, file: &Arc<ModuleFile>) -> bool {
    cache().files.get(key).is_some_and(|e| Arc::ptr_eq(&e.file, file))
}

/// Drops every cached file no process holds (called when processes go).
pub fn release_unused() {
    let mut c = cache();
    let unused: Vec<FileKey> = c.files.iter().filter(|(_, e)| Arc::strong_count(&e.file) == 1).map(|(k, _)| *k).collect();
    for k in unused {
        if let Some(e) = c.files.remove(&k) {
            uncharge(&mut c, e.owner, e.file.bytes);
        }
    }
}

/// Bytes held by the cache of files.
pub fn cached_bytes() -> usize {
    cache().bytes
}

/// The `--stats` words of the cache: evictions and loads put off per process.
pub fn report() -> String {
    format!(
        "{} files evicted (budget {} MiB, {} MiB per process); {} file reads queued (a process's {} in flight)",
        evictions(),
        FILES_BUDGET >> 20,
        PROCESS_SHARE >> 20,
        PROCESS_BUSY.load(Relaxed),
        MAX_IN_FLIGHT_PER_PROCESS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dummy(bytes: usize) -> Arc<ModuleFile> {
        Arc::new(ModuleFile::empty(bytes))
    }

    fn key(inode: u64) -> FileKey {
        FileKey { dev: (1, 1), inode }
    }

    /// Issue #28 item 3, native part: a process whose files never answer holds at most
    /// `MAX_IN_FLIGHT_PER_PROCESS` readers; every other process still gets the rest.
    #[test]
    fn one_process_cannot_hold_every_file_reader() {
        let mut c = Cache::default();
        let mut started = 0;
        for i in 0..MAX_IN_FLIGHT as u64 {
            if admit(&c, 666) {
                c.in_flight.insert(key(1000 + i), InFlight { pid: 666, waiters: Vec::new() });
                started += 1;
            }
        }
        assert_eq!(started, MAX_IN_FLIGHT_PER_PROCESS);
        // Other processes fill the rest, one slot each or more, up to the global cap.
        let mut others = 0;
        for pid in 1..=MAX_IN_FLIGHT as u32 {
            if admit(&c, pid) {
                c.in_flight.insert(key(2000 + u64::from(pid)), InFlight { pid, waiters: Vec::new() });
                others += 1;
            }
        }
        assert_eq!(others, MAX_IN_FLIGHT - MAX_IN_FLIGHT_PER_PROCESS);
        assert!(!admit(&c, 9999), "the global cap still holds");
    }

    /// More files than a process may read at once: the rest wait in the queue and each
    /// starts as a reader ends; every file asked for is answered, none is put off.
    #[test]
    fn reads_beyond_a_process_allowance_are_queued_and_all_answered() {
        use std::collections::HashSet;
        let pid = std::process::id();
        let maps = crate::target::discovery::read_maps(pid).expect("own maps");
        let mut seen = HashSet::new();
        let files: Vec<Mapping> =
            maps.into_iter().filter(|m| m.is_file() && m.perms[2] == b'x' && seen.insert(m.key())).collect();
        // Files are opened through the asking process's /proc entry: this process's own.
        let reader = pid;
        let (tx, rx) = mpsc::channel();
        let mut waiting = HashSet::new();
        for _ in 0..2 {
            for m in &files {
                match start_load(reader, m, &tx) {
                    Loading::InFlight => {
                        waiting.insert(m.key());
                    }
                    Loading::Ready(_) | Loading::Unreadable => {}
                    Loading::Busy => panic!("a read was put off with room in the queue"),
                }
            }
        }
        {
            let c = cache();
            assert!(c.in_flight.values().filter(|f| f.pid == reader).count() <= MAX_IN_FLIGHT_PER_PROCESS);
            let queued: Vec<FileKey> = c.queued.iter().filter(|q| q.pid == reader).map(|q| q.mapping.key()).collect();
            assert_eq!(queued.len(), queued.iter().collect::<HashSet<_>>().len(), "asked twice, queued once");
        }
        while !waiting.is_empty() {
            if let Loaded::Read(key, _) = rx.recv_timeout(Duration::from_secs(30)).expect("every queued read is answered") {
                waiting.remove(&key);
            }
        }
    }

    /// Files in use are evicted too, least recently used first; a process past its share
    /// loses its own files, never another process's.
    #[test]
    fn the_cache_evicts_files_in_use_and_keeps_each_process_within_its_share() {
        let mut c = Cache::default();
        let held: Vec<Arc<ModuleFile>> = (0..3).map(|_| dummy(FILES_BUDGET / 4 - 1)).collect();
        // Three processes' files, all held by their processes.
        for (i, f) in held.iter().enumerate() {
            insert(&mut c, key(i as u64), f.clone(), 100 + i as u32);
        }
        assert_eq!(c.files.len(), 3);
        // Process 200 reads many files: past its share, its own older ones go.
        for i in 10..20 {
            insert(&mut c, key(i), dummy(PROCESS_SHARE / 3), 200);
            assert!(c.charged.get(&200).copied().unwrap_or(0) <= PROCESS_SHARE);
        }
        assert!((0..3).all(|i| c.files.contains_key(&key(i))), "other processes' files stay");
        // Past the global budget, the least recently used file goes although in use.
        insert(&mut c, key(50), dummy(FILES_BUDGET / 4), 300);
        assert!(c.bytes <= FILES_BUDGET, "{} bytes cached", c.bytes);
        assert!(!c.files.contains_key(&key(0)), "the oldest file, in use, was evicted");
        assert!(c.failed.contains_key(&key(0)), "and is not read again at once");
        assert_eq!(c.bytes, c.files.values().map(|e| e.file.bytes).sum::<usize>());
        assert_eq!(c.bytes, c.charged.values().sum::<usize>());
    }
}
