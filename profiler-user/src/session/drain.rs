//! The drain thread: the only thread that reads the ring buffer, and the one that answers
//! `--duration`, SIGINT and SIGTERM.
//!
//! Nothing a target can influence runs here: records are copied out of the ring buffer into
//! the [`Inbox`] and nothing else is done with them (no target memory, no files, no
//! parsing beyond the record's fixed header). The session's worker (`event_loop`) takes
//! them from there. So the ring buffer is drained and the end of a recording is noticed
//! whatever a target makes the worker wait for.
//!
//! The inbox is bounded: each process may have at most [`PROCESS_BYTES`] of records queued,
//! all of them at most [`TOTAL_BYTES`]; a record past either is dropped and counted. One
//! process can therefore never fill the queue for the others.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use profiler_common::{SampleHeader, record_kind};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
    sync::Notify,
};

/// Why the loop ended (the drain thread decides it, or the worker tells it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopEnd {
    DurationElapsed,
    /// The launched command exited with this status (128 + signal when killed).
    CommandExited(i32),
    /// Ctrl-C (SIGINT).
    Interrupted,
    /// SIGTERM.
    Terminated,
    /// Every process `record --pid` was given has exited.
    TargetsExited,
}

/// Bytes of records one process may have queued.
pub(crate) const PROCESS_BYTES: usize = 8 << 20;
/// Bytes of records all processes may have queued.
pub(crate) const TOTAL_BYTES: usize = 64 << 20;
/// How often the ring buffer is drained while the worker asks for it (`busy`): new
/// processes, late samples. A deep stack whose tail changes every few milliseconds must be
/// read within that time of its sample (tests/deep_stacks.rs `rebuilt_recursion_is_completed`:
/// with 10 ms, 97 % of a 3.9 recursion rebuilt every 5 ms was dropped; with 2 ms, 7 %); a
/// wake-up costs the drain thread a few microseconds, 500 a second while busy.
const BUSY_INTERVAL: Duration = Duration::from_millis(2);
/// How long the worker waits for the drain thread's last drain at the end.
const FINAL_WAIT: Duration = Duration::from_secs(1);
/// The key of CPUs' batches of off-CPU records, which hold several processes' records.
const OFF_CPU_BATCHES: u32 = u32::MAX;

/// What the drain thread counted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DrainCounts {
    /// Records moved into the inbox.
    pub(crate) queued: u64,
    /// Records dropped: their process had `PROCESS_BYTES` queued.
    pub(crate) dropped_process_full: u64,
    /// Records dropped: all processes together had `TOTAL_BYTES` queued.
    pub(crate) dropped_total_full: u64,
    /// The most bytes queued at once.
    pub(crate) peak_bytes: usize,
    /// Records still queued when the worker's time at the end ran out (dropped).
    pub(crate) dropped_at_end: u64,
}

/// Records on their way from the drain thread to the worker, in the order they were read.
#[derive(Default)]
struct Queued {
    records: VecDeque<Queue>,
    per_process: HashMap<u32, usize>,
    bytes: usize,
    end: Option<LoopEnd>,
    /// The drain thread made its last drain: nothing more arrives.
    closed: bool,
    counts: DrainCounts,
}

/// A queued record: the process it is queued under (see `record_key`), when the drain thread
/// queued it, and its bytes.
pub(crate) type Queue = (u32, Instant, Vec<u8>);

/// What the drain thread and the worker share.
pub(crate) struct Shared {
    queued: Mutex<Queued>,
    arrived: Condvar,
    /// Wakes the drain thread: the worker ended the loop, or wants the last drain.
    wake: Notify,
    final_drain: AtomicBool,
    /// `end` was called.
    ended: AtomicBool,
    /// Until when (milliseconds since `started`) the worker wants frequent drains.
    busy_until_ms: AtomicU64,
    started: Instant,
}

impl Shared {
    /// The worker wants the ring buffer drained often until `until`.
    pub(crate) fn busy_until(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.started).as_millis() as u64;
        let before = self.busy_until_ms.fetch_max(ms, Ordering::Relaxed);
        // The drain thread may be in a beat-long wait: it drains now and every busy interval
        // from here (a launched program's first imports, code objects churning).
        if before < self.started.elapsed().as_millis() as u64 {
            self.wake.notify_one();
        }
    }

    fn busy(&self) -> bool {
        (self.started.elapsed().as_millis() as u64) < self.busy_until_ms.load(Ordering::Relaxed)
    }

    /// Ends the loop (first reason wins) and wakes both sides.
    pub(crate) fn end(&self, why: LoopEnd) {
        if let Ok(mut q) = self.queued.lock() {
            q.end.get_or_insert(why);
        }
        self.ended.store(true, Ordering::Release);
        self.arrived.notify_all();
        self.wake.notify_one();
    }

    /// Whether the loop is to end (the worker looks between records).
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Why the loop ends, once it does.
    pub(crate) fn end_reason(&self) -> Option<LoopEnd> {
        if !self.has_ended() {
            return None;
        }
        self.queued.lock().map(|q| q.end).unwrap_or(Some(LoopEnd::Terminated))
    }

    /// Up to `max` records, waiting until `until` for one to arrive; and why the loop ends,
    /// once it does.
    pub(crate) fn take(&self, until: Instant, max: usize, out: &mut VecDeque<Queue>) -> Option<LoopEnd> {
        let Ok(mut q) = self.queued.lock() else { return Some(LoopEnd::Terminated) };
        while q.records.is_empty() && q.end.is_none() && !q.closed {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = match self.arrived.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(_) => return Some(LoopEnd::Terminated),
            };
        }
        let Queued { records, per_process, bytes, end, .. } = &mut *q;
        let n = records.len().min(max);
        for (key, queued_at, record) in records.drain(..n) {
            if let Some(b) = per_process.get_mut(&key) {
                *b = b.saturating_sub(record.len());
                if *b == 0 {
                    per_process.remove(&key);
                }
            }
            *bytes = bytes.saturating_sub(record.len());
            out.push_back((key, queued_at, record));
        }
        *end
    }

    /// Records dropped at the end (the worker's time ran out).
    pub(crate) fn dropped_at_end(&self, n: u64) {
        if let Ok(mut q) = self.queued.lock() {
            q.counts.dropped_at_end += n;
        }
    }

    pub(crate) fn counts(&self) -> DrainCounts {
        self.queued.lock().map(|q| q.counts).unwrap_or_default()
    }

    /// Moves one ring-buffer record into the queue, or drops and counts it.
    fn push(q: &mut Queued, record: &[u8]) {
        let key = record_key(record);
        let of_process = q.per_process.get(&key).copied().unwrap_or(0);
        if of_process + record.len() > PROCESS_BYTES {
            q.counts.dropped_process_full += 1;
            return;
        }
        if q.bytes + record.len() > TOTAL_BYTES {
            q.counts.dropped_total_full += 1;
            return;
        }
        *q.per_process.entry(key).or_insert(0) += record.len();
        q.bytes += record.len();
        q.counts.peak_bytes = q.counts.peak_bytes.max(q.bytes);
        q.counts.queued += 1;
        q.records.push_back((key, Instant::now(), record.to_vec()));
    }
}

/// The process a record is queued under: its header's, or `OFF_CPU_BATCHES` for a CPU's
/// batch of off-CPU records (several processes') and records too short to say.
fn record_key(record: &[u8]) -> u32 {
    let Some(header) = SampleHeader::read(record) else { return OFF_CPU_BATCHES };
    if header.kind == record_kind::OFF_CPU { OFF_CPU_BATCHES } else { header.tgid }
}

/// The running drain thread.
pub(crate) struct Drain {
    pub(crate) shared: Arc<Shared>,
    done: mpsc::Receiver<()>,
}

/// Starts the drain thread over `ring`: it drains on the kernel's wake-ups and at least every
/// `beat`, and ends the loop after `duration` or on SIGINT/SIGTERM. Returns once its signal
/// handlers are in place.
pub(crate) fn start(
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    duration: Option<Duration>,
    beat: Duration,
    started: Instant,
) -> std::io::Result<Drain> {
    let shared = Arc::new(Shared {
        queued: Mutex::new(Queued::default()),
        arrived: Condvar::new(),
        wake: Notify::new(),
        final_drain: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        busy_until_ms: AtomicU64::new(0),
        started,
    });
    let (ready_send, ready) = mpsc::channel::<std::io::Result<()>>();
    let (done_send, done) = mpsc::channel::<()>();
    let thread_shared = shared.clone();
    thread::Builder::new().name("pyperch-drain".into()).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                let _ = ready_send.send(Err(e));
                return;
            }
        };
        let result = runtime.block_on(drain_loop(ring, &thread_shared, duration, beat, &ready_send));
        if let Err(e) = result {
            // Set-up failed before `ready`, or the ring buffer's fd failed: the loop ends.
            let _ = ready_send.send(Err(e));
            thread_shared.end(LoopEnd::Terminated);
        }
        if let Ok(mut q) = thread_shared.queued.lock() {
            q.closed = true;
        }
        thread_shared.arrived.notify_all();
        let _ = done_send.send(());
    })?;
    match ready.recv() {
        Ok(Ok(())) => Ok(Drain { shared, done }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::other("the drain thread ended at start")),
    }
}

impl Drain {
    /// Asks for the last drain (sampling has stopped) and waits for it, at most
    /// `FINAL_WAIT`.
    pub(crate) fn finish(&self) {
        self.shared.final_drain.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let _ = self.done.recv_timeout(FINAL_WAIT);
    }
}

async fn drain_loop(
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    shared: &Shared,
    duration: Option<Duration>,
    beat: Duration,
    ready: &mpsc::Sender<std::io::Result<()>>,
) -> std::io::Result<()> {
    // SAFETY: the ring buffer owns its fd, which stays open for the AsyncFd's lifetime.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }?;
    let mut interrupts = signal(SignalKind::interrupt())?;
    let mut terms = signal(SignalKind::terminate())?;
    let _ = ready.send(Ok(()));
    let deadline = duration.map(|d| tokio::time::Instant::from_std(shared.started + d));
    let (mut ended, mut signalled) = (false, false);
    loop {
        let poll = if shared.busy() { BUSY_INTERVAL } else { beat };
        let until_deadline = async {
            match deadline {
                Some(d) if !ended => tokio::time::sleep_until(d).await,
                _ => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                move_records(shared, guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = tokio::time::sleep(poll) => move_records(shared, ring.get_mut()),
            _ = until_deadline => {
                ended = true;
                shared.end(LoopEnd::DurationElapsed);
            }
            _ = interrupts.recv() => {
                on_signal(shared, signalled, LoopEnd::Interrupted);
                (ended, signalled) = (true, true);
            }
            _ = terms.recv() => {
                on_signal(shared, signalled, LoopEnd::Terminated);
                (ended, signalled) = (true, true);
            }
            _ = shared.wake.notified() => move_records(shared, ring.get_mut()),
        }
        if shared.final_drain.load(Ordering::Acquire) {
            move_records(shared, ring.get_mut());
            return Ok(());
        }
    }
}

/// The loop ends on the first signal; a second one, while the worker is still finishing,
/// ends pyperch at once (as a second Ctrl-C does with most tools).
fn on_signal(shared: &Shared, signalled_before: bool, why: LoopEnd) {
    if signalled_before {
        eprintln!("pyperch: a second signal: ending now, without writing the profile");
        std::process::exit(if why == LoopEnd::Interrupted { 130 } else { 143 });
    }
    shared.end(why);
}

/// Copies every record waiting in the ring buffer into the inbox and wakes the worker.
fn move_records(shared: &Shared, ring: &mut aya::maps::RingBuf<aya::maps::MapData>) {
    let Ok(mut q) = shared.queued.lock() else { return };
    let before = q.records.len();
    while let Some(item) = ring.next() {
        Shared::push(&mut q, &item);
    }
    let arrived = q.records.len() != before;
    drop(q);
    if arrived {
        shared.arrived.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::Plain;

    fn record(tgid: u32, kind: u32, len: usize) -> Vec<u8> {
        let mut header = SampleHeader::default();
        header.tgid = tgid;
        header.kind = kind;
        let mut bytes = vec![0u8; len.max(profiler_common::SAMPLE_HEADER_SIZE)];
        header.write_to(&mut bytes);
        bytes
    }

    /// One process filling its allowance leaves room for the others; taking frees it.
    #[test]
    fn one_process_cannot_fill_the_queue() {
        let mut q = Queued::default();
        let big = record(7, record_kind::CPU_SAMPLE, 1 << 20);
        for _ in 0..20 {
            Shared::push(&mut q, &big);
        }
        assert_eq!(q.counts.queued, 8);
        assert_eq!(q.counts.dropped_process_full, 12);
        let other = record(8, record_kind::CPU_SAMPLE, 4096);
        Shared::push(&mut q, &other);
        assert_eq!(q.counts.queued, 9);
        assert_eq!(record_key(&record(9, record_kind::OFF_CPU, 64)), OFF_CPU_BATCHES);
        let shared = Shared {
            queued: Mutex::new(q),
            arrived: Condvar::new(),
            wake: Notify::new(),
            final_drain: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            busy_until_ms: AtomicU64::new(0),
            started: Instant::now(),
        };
        let mut out = VecDeque::new();
        assert_eq!(shared.take(Instant::now(), 4, &mut out), None);
        assert_eq!(out.len(), 4);
        out.clear();
        assert_eq!(shared.take(Instant::now(), 100, &mut out), None);
        assert_eq!(out.iter().map(|(k, _, _)| *k).collect::<Vec<_>>(), [7, 7, 7, 7, 8]);
        let q = shared.queued.lock().unwrap();
        assert!(q.per_process.is_empty() && q.bytes == 0);
    }
}
