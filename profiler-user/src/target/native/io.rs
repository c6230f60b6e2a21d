//! The native side's file and /proc work, off the sampling loop.
//!
//! `--native` needs each process's executable mappings (`/proc/PID/maps`) and, for each
//! mapped file, its unwind tables and symbols (`module_file`). Either can block for as long
//! as the target or a file system likes (a maps read waits on the target's memory-map lock;
//! a file on a FUSE mount may never answer). None of it runs on the sampling loop:
//!
//! - The loop asks for a process's maps with [`NativeIo::request`], which never waits: the
//!   request goes into a bounded queue (full: refused, counted, asked again later).
//! - One worker thread takes the requests in turn. It reads the maps with a time budget
//!   (`session::budget`, the pattern of discovery's looks at processes: a read that overruns
//!   is left to finish on its own thread, at most `MAX_OVERRUNNING_PER_PROCESS` of them for one process), then starts
//!   the reading of every file not cached yet, largest code first (`file_cache::start_load`,
//!   at most `file_cache::MAX_IN_FLIGHT` files at once, each on a thread of its own, the rest
//!   queued) and sends the process its mappings at once, without waiting for the files.
//! - Each file's reader sends the file to every process that asked for it when it is done.
//!
//! The loop picks up whatever has arrived (`try_recv`) before it unwinds a sample, and never
//! waits. The worker thread stops when the session drops its `NativeIo`; it is never joined,
//! so ending a session never waits on a target either.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
        mpsc,
    },
    time::Duration,
};

use super::{
    file_cache::{self, Loaded, Loading},
    module_file::ModuleFile,
};
use crate::{
    target::discovery::{Mapping, read_maps},
    target::budget::{Budgeted, Overrun},
};

/// Requests waiting for the worker, at most (one per process at a time).
const MAX_QUEUED: usize = 1024;
/// Time given to one read of `/proc/PID/maps`.
pub const MAPS_BUDGET: Duration = Duration::from_millis(1000);
/// Executable mappings looked at per process, at most.
pub const MAX_EXECUTABLE_MAPPINGS: usize = 4096;

/// One executable mapping of a process, and where its file stands.
pub struct MappedCode {
    pub mapping: Mapping,
    pub file: MappedFile,
}

/// The file of an executable mapping.
pub enum MappedFile {
    /// Read: its unwind tables and symbols.
    Ready(Arc<ModuleFile>),
    /// Being read: it comes through the process's file channel.
    Loading,
    /// Anonymous or pseudo mapping (JIT code, `[vdso]`), or a file that gives no unwind data.
    None,
    /// Not started (too many files in flight, and too many queued): asked again with the
    /// next maps read.
    Deferred,
}

/// The answer to one maps request.
pub enum MapsReply {
    /// The executable mappings as read now, sorted by start.
    Read(Vec<MappedCode>),
    /// The maps could not be read (gone, or did not answer within `MAPS_BUDGET`).
    Failed,
}

/// Where a process receives its answers.
pub struct Inbox {
    pub maps: mpsc::Receiver<MapsReply>,
    pub files: mpsc::Receiver<Loaded>,
}

/// A request: a process's maps, and where to send them and its files.
struct Request {
    pid: u32,
    maps: mpsc::Sender<MapsReply>,
    files: mpsc::Sender<Loaded>,
}

/// Counts for `--stats`.
#[derive(Default)]
pub struct IoStats {
    pub maps_reads: AtomicU64,
    /// Maps reads that did not answer within `MAPS_BUDGET`, or were not started because too
    /// many earlier ones are still blocked.
    pub maps_timed_out: AtomicU64,
    /// Requests refused because the queue was full (asked again later).
    pub queue_full: AtomicU64,
    /// Files whose reading was put off because too many were in flight and queued.
    pub files_deferred: AtomicU64,
}

/// The session's handle on the worker; dropping it stops the worker at its next request.
pub struct NativeIo {
    requests: mpsc::SyncSender<Request>,
    /// The worker's end, until `start_worker` hands it to the worker thread.
    pending_worker: Mutex<Option<mpsc::Receiver<Request>>>,
    pub stats: Arc<IoStats>,
}

/// What a process keeps to ask: its own channels' senders.
pub struct Asker {
    maps: mpsc::Sender<MapsReply>,
    files: mpsc::Sender<Loaded>,
}

impl NativeIo {
    /// The queue, without its worker: requests wait in it until `start_worker` (threads may
    /// start only once the session has dropped its capabilities, which needs one thread).
    pub fn new() -> NativeIo {
        let (requests, receive) = mpsc::sync_channel::<Request>(MAX_QUEUED);
        NativeIo { requests, pending_worker: Mutex::new(Some(receive)), stats: Arc::default() }
    }

    /// Starts the worker thread (once; later calls do nothing). Without a thread, requests
    /// stay unanswered: samples then keep their Python frames behind `<loading native>`.
    pub fn start_worker(&self) {
        let Some(receive) = self.pending_worker.lock().ok().and_then(|mut r| r.take()) else { return };
        let stats = self.stats.clone();
        let _ = std::thread::Builder::new().name("pyperch-native-io".into()).spawn(move || {
            let budgeted = Budgeted::default();
            while let Ok(request) = receive.recv() {
                serve(&budgeted, &stats, request);
            }
        });
    }

    /// A new process's channels.
    pub fn channels() -> (Asker, Inbox) {
        let (maps, maps_in) = mpsc::channel();
        let (files, files_in) = mpsc::channel();
        (Asker { maps, files }, Inbox { maps: maps_in, files: files_in })
    }

    /// Asks for `pid`'s maps (and the files behind them); never waits. `false` when the
    /// request was refused (queue full, or no worker): ask again later.
    pub fn request(&self, pid: u32, asker: &Asker) -> bool {
        let request = Request { pid, maps: asker.maps.clone(), files: asker.files.clone() };
        match self.requests.try_send(request) {
            Ok(()) => true,
            Err(_) => {
                self.stats.queue_full.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// The `--stats` line.
    pub fn report(&self) -> String {
        let s = &self.stats;
        format!(
            "native files (read off the sampling loop): {} maps reads, {} did not answer within {:.1} s; {} requests refused (queue full); {} file reads put off (too many in flight and queued); {} files being read now; {} bytes of files cached; {}; {}",
            s.maps_reads.load(Relaxed),
            s.maps_timed_out.load(Relaxed),
            MAPS_BUDGET.as_secs_f64(),
            s.queue_full.load(Relaxed),
            s.files_deferred.load(Relaxed),
            file_cache::in_flight(),
            file_cache::cached_bytes(),
            file_cache::report(),
            super::budget::report(),
        )
    }
}

/// One request, on the worker thread.
fn serve(budgeted: &Budgeted, stats: &IoStats, request: Request) {
    let pid = request.pid;
    stats.maps_reads.fetch_add(1, Relaxed);
    let maps = match budgeted.run_for(pid, MAPS_BUDGET, move || read_maps(pid)) {
        Ok(Ok(maps)) => maps,
        Ok(Err(_)) => {
            let _ = request.maps.send(MapsReply::Failed);
            return;
        }
        Err(Overrun::TimedOut | Overrun::TooManyBlocked | Overrun::NoThread) => {
            stats.maps_timed_out.fetch_add(1, Relaxed);
            let _ = request.maps.send(MapsReply::Failed);
            return;
        }
    };
    let mut code: Vec<Mapping> =
        maps.into_iter().filter(|m| m.perms[2] == b'x' && m.start < m.end).take(MAX_EXECUTABLE_MAPPINGS).collect();
    // The largest code first: its file takes longest to read (libpython, a BLAS), and the
    // kernel walk needs every file of a stack before it walks it.
    code.sort_by_key(|m| std::cmp::Reverse(m.end - m.start));
    let mut code: Vec<MappedCode> = code
        .into_iter()
        .map(|mapping| {
            let file = if !mapping.is_file() {
                MappedFile::None
            } else {
                match file_cache::start_load(pid, &mapping, &request.files) {
                    Loading::Ready(file) => MappedFile::Ready(file),
                    Loading::InFlight => MappedFile::Loading,
                    Loading::Unreadable => MappedFile::None,
                    Loading::Busy => {
                        stats.files_deferred.fetch_add(1, Relaxed);
                        MappedFile::Deferred
                    }
                }
            };
            MappedCode { mapping, file }
        })
        .collect();
    code.sort_by_key(|c| c.mapping.start);
    let _ = request.maps.send(MapsReply::Read(code));
}
