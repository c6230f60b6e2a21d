//! The sampling session shared by `record` and `agent`: which processes are profiled, the
//! kernel registrations, and the path of every sample from the ring buffer to the profile
//! (completion → symbolization → aggregation).

use std::{
    collections::{HashMap, HashSet},
    io::IsTerminal,
    path::PathBuf,
    process::Child,
    sync::{Arc, atomic::Ordering::Relaxed},
    time::{Duration, Instant},
};

use profiler_common::{FRAME_ENTRY_SIZE, FrameEntry, MAX_FULL_FRAMES, SAMPLE_HEADER_SIZE, SampleHeader, sample_status};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    aggregate::{FrameId, FrameName, ProcessLabel, Profile},
    completion::{TailCache, TailSource},
    containers,
    discovery::{self, DiscoveryError, PythonProcess},
    filter::ProcessFilter,
    layout::STR_HASH_OFFSET,
    loader::KernelProgram,
    memory::{self, ProcessMemory},
    record::RecordError,
    stats::{Counters, SampleOutcome},
    symbolize::{self, CodeInfo, SymbolError, TypeAddresses},
};

/// How often the session looks for new Python processes (a launched command's children are
/// looked for more often: short scripts matter there). A look costs almost nothing while the
/// kernel has seen no fork, exec or exit since the previous one; otherwise /proc is listed.
/// The ring buffer is drained on the same beat (more often after late samples, see
/// `DRAIN_INTERVAL_BUSY`).
pub(crate) const DISCOVERY_INTERVAL: Duration = Duration::from_millis(250);
pub(crate) const LAUNCH_DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);
/// The beat once every explicitly given pid is registered: nothing can join any more, so the
/// beat only drains the ring buffer (the kernel wakes us early when a batch accumulates).
const SETTLED_PIDS_INTERVAL: Duration = Duration::from_secs(1);
/// Processes already looked at are checked again (PID reuse, exec) this often; young ones
/// are looked at on every scan that lists /proc.
const FULL_SCAN_PERIOD: Duration = Duration::from_secs(10);
/// Processes younger than this (in clock ticks: 10 s at Linux's 100 Hz) are looked at on every
/// scan that lists /proc.
const YOUNG_PROCESS_TICKS: u64 = 1000;
/// How often the ring buffer is drained when the kernel has not woken us (it wakes us only
/// once a batch has accumulated): on the discovery beat, which keeps a session's fixed cost
/// low; but after a sample came too late (its code object or deep stack had already changed
/// when we read it: code churning, processes exiting), often, so that short-lived code
/// objects are read before they are freed.
const DRAIN_INTERVAL_BUSY: Duration = Duration::from_millis(10);
/// How long after the last late sample the busy interval is kept.
const BUSY_HOLD: Duration = Duration::from_secs(5);
/// How often the progress line is updated (on the next beat after it is due).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Bounds on the per-process symbol caches (emptied and refilled when reached).
const MAX_CACHED_CODES: usize = 1 << 16;
const MAX_CACHED_POSITIONS: usize = 1 << 20;
/// Exited processes whose counts are kept for `--stats` (the oldest are summed up).
const MAX_RETIRED: usize = 4096;

/// Which processes the session profiles.
pub(crate) enum Scope {
    Host,
    Pids(HashSet<u32>),
    /// A launched command and its descendants.
    Launched { root: u32 },
}

impl Scope {
    fn accepts(&self, pid: u32) -> bool {
        match self {
            Scope::Host => true,
            Scope::Pids(pids) => pids.contains(&pid),
            Scope::Launched { root } => {
                let mut p = pid;
                for _ in 0..64 {
                    if p == *root {
                        return true;
                    }
                    match discovery::parent_pid(p) {
                        Some(parent) if parent > 1 => p = parent,
                        _ => return false,
                    }
                }
                false
            }
        }
    }
}

/// One Python process being profiled, with its caches.
struct Target {
    process: PythonProcess,
    mem: ProcessMemory,
    /// Code objects by address, with their validation word.
    codes: HashMap<u64, Arc<CodeEntry>>,
    /// (code, validation word, instruction offset, owned by a generator) → the frame shown,
    /// or `None` for a frame CPython itself hides (not started yet).
    positions: HashMap<(u64, u16, i32, bool), Option<FrameId>>,
    tails: TailCache,
    counters: Counters,
    /// Still running and registered with the kernel.
    alive: bool,
    /// `/proc/PID/exe` when registered: a change means the process exec'd another program.
    exe_link: PathBuf,
    /// Scratch stack (root first), reused between samples.
    stack: Vec<FrameId>,
}

/// A symbolized code object and the validation word it had when read.
struct CodeEntry {
    info: CodeInfo,
    check: u16,
}

/// Why a frame could not be turned into a name.
enum FrameError {
    /// Not readable, or not a code object.
    BadCode,
    /// The code object at that address is not the one the kernel saw.
    Changed,
}

impl Target {
    fn new(process: PythonProcess) -> Self {
        let mem = ProcessMemory::new(process.pid);
        let exe_link = std::fs::read_link(format!("/proc/{}/exe", process.pid)).unwrap_or_default();
        Self {
            process,
            mem,
            exe_link,
            codes: HashMap::new(),
            positions: HashMap::new(),
            tails: TailCache::default(),
            counters: Counters::default(),
            alive: true,
            stack: Vec::with_capacity(64),
        }
    }

    fn process_sample(&mut self, header: &SampleHeader, body: &[u8], profile: &mut Profile, threads: bool) -> SampleOutcome {
        match header.status {
            sample_status::COMPLETE => {}
            sample_status::NO_THREAD_STATE => return SampleOutcome::NoThreadState,
            sample_status::NO_FRAME => return SampleOutcome::Idle,
            sample_status::TRUNCATED if full_frames_repeat(header, body) => return SampleOutcome::CyclicChain,
            sample_status::TRUNCATED => return SampleOutcome::Truncated,
            _ => return SampleOutcome::KernelReadFault,
        }
        // Read through the sampled thread: it was running a moment ago, whereas the process's
        // first thread may have exited (its pid then no longer has an address space).
        self.mem = ProcessMemory::new(header.tid);
        let n_full = (header.n_full as usize).min(MAX_FULL_FRAMES).min(body.len() / FRAME_ENTRY_SIZE);
        let full = |i: usize| -> FrameEntry {
            // SAFETY: i < n_full ≤ body.len() / FRAME_ENTRY_SIZE; FrameEntry is plain data.
            unsafe { std::ptr::read_unaligned(body.as_ptr().add(i * FRAME_ENTRY_SIZE) as *const FrameEntry) }
        };
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let mut result = Ok(());
        if header.n_hashed > 0 {
            let layout = self.process.layout.frame;
            let tail = match self.tails.complete(&self.mem, &layout, header.tail_first, header.n_hashed, header.tail_hash) {
                Ok(tail) => tail,
                Err(_) => {
                    self.stack = stack;
                    return SampleOutcome::StaleTail;
                }
            };
            match tail.source {
                TailSource::Hit => self.counters.frame_cache_hits += 1,
                TailSource::Partial => self.counters.frame_cache_partial_hits += 1,
                TailSource::Miss => self.counters.frame_cache_misses += 1,
            }
            self.counters.frames_from_memory += tail.frames_from_memory as u64;
            self.counters.frames_from_cache += (tail.tail.frames.len() - tail.frames_from_memory) as u64;
            match tail.tail.symbols.get() {
                Some(ids) => stack.extend_from_slice(ids),
                None => {
                    for entry in tail.tail.frames.iter().rev() {
                        match self.frame_id(entry, None, profile) {
                            Ok(Some(id)) => stack.push(id),
                            Ok(None) => {}
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    if result.is_ok() {
                        let _ = tail.tail.symbols.set(stack.as_slice().into());
                    }
                }
            }
        }
        self.counters.frames_from_kernel += n_full as u64;
        if result.is_ok() {
            for i in (0..n_full).rev() {
                let entry = full(i);
                match self.frame_id(&entry, Some(entry.check), profile) {
                    Ok(Some(id)) => stack.push(id),
                    Ok(None) => {}
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        let outcome = match result {
            Err(FrameError::BadCode) => SampleOutcome::BadCodeObject,
            Err(FrameError::Changed) => SampleOutcome::ChangedCodeObject,
            Ok(()) if stack.is_empty() => SampleOutcome::Idle,
            Ok(()) => {
                profile.add(header.tgid, threads.then_some(header.tid), &stack, 1);
                SampleOutcome::Ok
            }
        };
        self.stack = stack;
        outcome
    }

    /// The frame shown for one interpreter frame; `None` for frames CPython hides (shims,
    /// frames not started yet). `check` is the kernel's validation word for the frame's code
    /// object (full frames), `None` for frames completed in userspace.
    fn frame_id(&mut self, entry: &FrameEntry, check: Option<u16>, profile: &mut Profile) -> Result<Option<FrameId>, FrameError> {
        let semantics = self.process.layout.frame_semantics;
        if let Some(shim) = semantics.shim_owner {
            if entry.owner != u8::MAX && entry.owner >= shim {
                return Ok(None);
            }
        }
        let generator = semantics.owner_generator.is_some_and(|g| g == entry.owner);
        if let Some(check) = check {
            if let Some(id) = self.positions.get(&(entry.code, check, entry.instr_offset, generator)) {
                self.counters.code_cache_hits += 1;
                return Ok(*id);
            }
        }
        let code = self.code_entry(entry.code, check)?;
        let key = (entry.code, code.check, entry.instr_offset, generator);
        if let Some(id) = self.positions.get(&key) {
            return Ok(*id);
        }
        let info = &code.info;
        let incomplete = !generator
            && self.process.layout.code.firsttraceable.is_some()
            && (entry.instr_offset as i64) < 2 * info.firsttraceable as i64;
        let id = if incomplete {
            None
        } else {
            let line = info.line(entry.instr_offset).unwrap_or(0);
            Some(profile.intern(FrameName { function: info.qualname.clone(), file: info.filename.clone(), line }))
        };
        if self.positions.len() >= MAX_CACHED_POSITIONS {
            self.positions.clear();
        }
        self.positions.insert(key, id);
        Ok(id)
    }

    /// The code object at `address`, from the cache when its validation word matches
    /// `expected` (or when no word is expected), else read again.
    fn code_entry(&mut self, address: u64, expected: Option<u16>) -> Result<Arc<CodeEntry>, FrameError> {
        if let Some(code) = self.codes.get(&address) {
            if expected.is_none_or(|e| e == code.check) {
                self.counters.code_cache_hits += 1;
                return Ok(code.clone());
            }
            // Freed and replaced by another code object since we read it.
            self.counters.stale_invalidations += 1;
        }
        self.counters.code_cache_misses += 1;
        let layout = &self.process.layout;
        let types = TypeAddresses {
            code: self.process.code_type_address,
            str: self.process.str_type_address,
            bytes: self.process.bytes_type_address,
        };
        let info =
            symbolize::read_code(&self.mem, layout, &types, address).map_err(|_: SymbolError| FrameError::BadCode)?;
        // Target pointers: wrapping, since a forged one may sit at the top of the address space.
        let name = self.mem.read_u64(address.wrapping_add(layout.code.name as u64)).map_err(|_| FrameError::BadCode)?;
        let check =
            self.mem.read_u64(name.wrapping_add(STR_HASH_OFFSET as u64)).map_err(|_| FrameError::BadCode)? as u16;
        let code = Arc::new(CodeEntry { info, check });
        if self.codes.len() >= MAX_CACHED_CODES {
            self.codes.clear();
        }
        self.codes.insert(address, code.clone());
        if expected.is_some_and(|e| e != check) {
            // It changed again after the sample: what we read is not what was sampled.
            return Err(FrameError::Changed);
        }
        Ok(code)
    }
}

/// Whether the full frames of a record visit one frame address twice: the chain loops (a
/// forged or corrupt interpreter state), rather than being deeper than the kernel walks.
fn full_frames_repeat(header: &SampleHeader, body: &[u8]) -> bool {
    let n = (header.n_full as usize).min(MAX_FULL_FRAMES).min(body.len() / FRAME_ENTRY_SIZE);
    let mut addresses = [0u64; MAX_FULL_FRAMES];
    for (i, slot) in addresses.iter_mut().enumerate().take(n) {
        // `FrameEntry::frame` is the entry's first field.
        let at = i * FRAME_ENTRY_SIZE;
        *slot = body.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    }
    let addresses = &mut addresses[..n];
    addresses.sort_unstable();
    addresses.windows(2).any(|w| w[0] == w[1])
}

/// The state of a recording.
pub(crate) struct Session {
    pub(crate) kernel: KernelProgram,
    pub(crate) scope: Scope,
    pub(crate) filter: ProcessFilter,
    targets: HashMap<u32, Target>,
    /// Counts of processes no longer profiled (exited, or their PID reused).
    retired: Vec<Retired>,
    /// Summed counts of retired processes pushed out of `retired`.
    retired_overflow: Counters,
    /// Processes seen not to be profilable, by pid.
    rejected: HashMap<u32, Rejection>,
    /// Unsupported interpreters already reported.
    reported: HashSet<(u32, u64)>,
    pub(crate) profile: Profile,
    threads: bool,
    unknown_process_samples: u64,
    pub(crate) malformed_records: u64,
    own_pid: u32,
    /// Processes that were ever registered.
    pub(crate) registered: u64,
    /// PIDs present at the last scan whose state is settled (registered or rejected), with
    /// their start times.
    settled: HashMap<u32, u64>,
    /// When processes already looked at were last checked again.
    last_full_scan: Option<Instant>,
    /// The kernel's fork/exec/exit count at the last scan (`None`: not tracked).
    last_process_events: Option<u64>,
    /// The kernel's count of registered processes that exec'd, at the last scan.
    last_registered_execs: Option<u64>,
    /// PIDs at the last scan whose state is not settled: interpreters still starting, "not
    /// Python" verdicts to check again. They are looked at on every scan.
    pending: HashSet<u32>,
    /// Samples dropped because what they point to had changed before we read it.
    late_samples: u64,
    clock: TickClock,
}

/// A process found not profilable, and whether to look again: a process caught in the middle
/// of `exec` can look like anything, so a "not Python" verdict is re-checked a few times.
struct Rejection {
    start_time: u64,
    exe: PathBuf,
    checks: u32,
    recheck_at: Option<Instant>,
}

/// "Not Python" verdicts are re-checked this many times, this far apart.
const RECHECKS: u32 = 3;
const RECHECK_DELAY: Duration = Duration::from_millis(300);

/// The counts of a process no longer profiled.
pub(crate) struct Retired {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) version: String,
    pub(crate) counters: Counters,
}

impl Session {
    pub(crate) fn new(kernel: KernelProgram, scope: Scope, filter: ProcessFilter, threads: bool) -> Self {
        Session {
            kernel,
            scope,
            filter,
            targets: HashMap::new(),
            retired: Vec::new(),
            retired_overflow: Counters::default(),
            rejected: HashMap::new(),
            reported: HashSet::new(),
            profile: Profile::new(),
            threads,
            unknown_process_samples: 0,
            malformed_records: 0,
            own_pid: std::process::id(),
            registered: 0,
            settled: HashMap::new(),
            last_full_scan: None,
            last_process_events: None,
            last_registered_execs: None,
            pending: HashSet::new(),
            late_samples: 0,
            clock: TickClock::new(),
        }
    }

    /// Registers a Python process with the kernel if its interpreter is ready.
    pub(crate) fn add_process(&mut self, process: PythonProcess) -> Result<bool, RecordError> {
        let pid = process.pid;
        let mem = ProcessMemory::new(pid);
        let info = match process.kernel_info(&mem) {
            Ok(info) => profiler_common::ProcessInfo { frame: process.layout.kernel_frame_layout(), ..info },
            Err(DiscoveryError::NotReady { .. }) => return Ok(false),
            Err(e) => return Err(RecordError::Inspect { pid, message: e.to_string() }),
        };
        self.kernel.register(pid, &info)?;
        let container = containers::for_process(pid);
        self.profile.set_process(
            pid,
            ProcessLabel {
                comm: process.comm.clone(),
                exe: process.exe.display().to_string(),
                version: process.version.to_string(),
                container_id: container.container_id,
                pod_uid: container.pod_uid,
            },
        );
        self.targets.insert(pid, Target::new(process));
        self.registered += 1;
        Ok(true)
    }

    /// Looks for new processes, exited ones, reused PIDs. /proc is listed only when the kernel
    /// saw a fork, exec or exit since the last scan, or every FULL_SCAN_PERIOD.
    pub(crate) fn scan(&mut self) {
        // Every FULL_SCAN_PERIOD, settled processes are looked at again: PID reuse,
        // `exec`, and changes that filters depend on. In between, only new PIDs cost work.
        let full = self.last_full_scan.is_none_or(|t| t.elapsed() >= FULL_SCAN_PERIOD);
        // Read before listing: an event during the listing shows at the next scan.
        let events = self.kernel.process_events();
        // Registered processes that exec'd, which the kernel unregistered: find which below.
        let execs = self.kernel.registered_execs();
        let kernel_dropped_some = execs != self.last_registered_execs;
        let unchanged = events.is_some() && events == self.last_process_events && !kernel_dropped_some;
        self.last_process_events = events;
        self.last_registered_execs = execs;
        if !full && unchanged {
            // The same processes as at the last scan: only pending ones need another look.
            let now = self.clock.now_ticks();
            for pid in self.pending.clone() {
                self.look_at(pid, now);
            }
            return;
        }
        if full {
            self.last_full_scan = Some(Instant::now());
        }
        let listing = match &self.scope {
            // Explicit pids: no need to list the whole of /proc.
            Scope::Pids(pids) => {
                pids.iter().copied().filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()).collect()
            }
            _ => discovery::python_pids_candidates(),
        };
        let present: HashSet<u32> = listing.iter().copied().collect();
        // Exited targets: stop sampling them, keep their caches for samples in flight.
        let mut execed = Vec::new();
        for (pid, target) in self.targets.iter_mut() {
            if !target.alive {
                continue;
            }
            if !present.contains(pid) || (full && !discovery::is_alive(*pid, target.process.start_time)) {
                target.alive = false;
                self.kernel.unregister(*pid);
            } else if (kernel_dropped_some && !self.kernel.is_registered(*pid))
                || (full && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe != target.exe_link))
            {
                // Same process, new program: its layout and caches no longer apply.
                self.kernel.unregister(*pid);
                execed.push(*pid);
            }
        }
        for pid in execed {
            self.settled.remove(&pid);
            if let Some(old) = self.targets.remove(&pid) {
                self.retire(old);
            }
        }
        self.settled.retain(|pid, _| present.contains(pid));
        self.pending.retain(|pid| present.contains(pid));
        let now = self.clock.now_ticks();
        if let Scope::Pids(pids) = &self.scope {
            if pids.iter().all(|p| self.targets.get(p).is_some_and(|t| t.alive)) {
                // Explicit pids are all registered; nothing new can join.
                return;
            }
        }
        for pid in listing {
            // Young processes stay under watch: a shell about to exec Python looks settled.
            let settled_and_old =
                self.settled.get(&pid).is_some_and(|start| now.saturating_sub(*start) > YOUNG_PROCESS_TICKS);
            if pid == self.own_pid || (!full && settled_and_old) {
                continue;
            }
            self.look_at(pid, now);
        }
    }

    /// Considers one process and files it as settled or pending.
    fn look_at(&mut self, pid: u32, now: u64) {
        match self.consider(pid, now) {
            Some(start_time) => {
                self.settled.insert(pid, start_time);
                self.pending.remove(&pid);
            }
            None => {
                self.settled.remove(&pid);
                self.pending.insert(pid);
            }
        }
    }

    /// Looks at one process: registers it if it is a Python process to profile. Returns its
    /// start time when its state is settled (registered, or rejected for good), `None` while
    /// it is pending (an interpreter still starting, or a verdict to check again soon).
    fn consider(&mut self, pid: u32, now: u64) -> Option<u64> {
        let start_time = discovery::start_time(pid)?;
        // Only a young process can be caught in the middle of exec.
        let young = now.saturating_sub(start_time) <= YOUNG_PROCESS_TICKS;
        if !self.scope.accepts(pid) {
            return Some(start_time);
        }
        if self.targets.get(&pid).is_some_and(|t| t.alive && t.process.start_time == start_time) {
            return Some(start_time);
        }
        if !self.filter.is_empty() && !self.filter.matches(pid) {
            return Some(start_time);
        }
        if self.targets.contains_key(&pid) {
            // The PID was reused (or the process exec'd): the old process is gone.
            self.kernel.unregister(pid);
            if let Some(old) = self.targets.remove(&pid) {
                self.retire(old);
            }
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let mut checks = 0;
        if let Some(r) = self.rejected.get(&pid) {
            if r.start_time == start_time && r.exe == exe {
                match r.recheck_at {
                    Some(at) if Instant::now() >= at => checks = r.checks,
                    Some(_) => return None,
                    None => return Some(start_time),
                }
            }
        }
        let reject = |checks: u32, retry: bool| Rejection {
            start_time,
            exe: exe.clone(),
            checks: checks + 1,
            recheck_at: (retry && young && checks < RECHECKS).then(|| Instant::now() + RECHECK_DELAY),
        };
        let rejection = match discovery::inspect(pid) {
            Ok(process) => match self.add_process(process) {
                Ok(registered) => return registered.then_some(start_time),
                Err(e) => {
                    eprintln!("pyperch: warning: {e}");
                    reject(checks, false)
                }
            },
            Err(DiscoveryError::NotReady { .. }) => return None,
            Err(DiscoveryError::Unsupported { pid, comm, reason }) => {
                if self.reported.insert((pid, start_time)) {
                    eprintln!("pyperch: warning: skipping process {pid} ({comm}): {reason}");
                }
                reject(checks, false)
            }
            Err(_) => reject(checks, true),
        };
        let settled = rejection.recheck_at.is_none();
        self.rejected.insert(pid, rejection);
        settled.then_some(start_time)
    }

    /// Keeps the counts of a target no longer profiled, and frees its caches.
    fn retire(&mut self, old: Target) {
        self.retired.push(Retired {
            pid: old.process.pid,
            comm: old.process.comm.clone(),
            version: old.process.version.to_string(),
            counters: old.counters,
        });
        if self.retired.len() > MAX_RETIRED {
            let oldest = self.retired.remove(0);
            self.retired_overflow.add(&oldest.counters);
        }
    }

    /// Forgets exited processes (keeping their counts); for long-running sessions, where
    /// samples still in flight for them no longer matter.
    pub(crate) fn prune_exited(&mut self) {
        let dead: Vec<u32> = self.targets.iter().filter(|(_, t)| !t.alive).map(|(pid, _)| *pid).collect();
        for pid in dead {
            if let Some(t) = self.targets.remove(&pid) {
                self.retire(t);
            }
        }
    }

    /// How long until the next scan, given the configured discovery interval.
    fn scan_interval(&self, configured: Duration) -> Duration {
        match &self.scope {
            Scope::Pids(pids) if pids.iter().all(|p| self.targets.get(p).is_some_and(|t| t.alive)) => {
                configured.max(SETTLED_PIDS_INTERVAL)
            }
            _ => configured,
        }
    }

    /// Processes being profiled now.
    pub(crate) fn live_processes(&self) -> usize {
        self.targets.values().filter(|t| t.alive).count()
    }

    /// Processes with at least one sample in the profile.
    pub(crate) fn sampled_processes(&self) -> usize {
        let mut pids: HashSet<u32> = HashSet::new();
        for t in self.targets.values() {
            if t.counters.ok() > 0 {
                pids.insert(t.process.pid);
            }
        }
        for r in &self.retired {
            if r.counters.ok() > 0 {
                pids.insert(r.pid);
            }
        }
        pids.len()
    }

    /// Per-process counts, live and retired, by pid.
    pub(crate) fn per_process(&self) -> Vec<(u32, String, String, bool, &Counters)> {
        let mut rows: Vec<(u32, String, String, bool, &Counters)> = self
            .targets
            .values()
            .map(|t| (t.process.pid, t.process.comm.clone(), t.process.version.to_string(), t.alive, &t.counters))
            .chain(self.retired.iter().map(|r| (r.pid, r.comm.clone(), r.version.clone(), false, &r.counters)))
            .collect();
        rows.sort_by_key(|r| r.0);
        rows
    }

    pub(crate) fn on_record(&mut self, bytes: &[u8]) {
        if bytes.len() < SAMPLE_HEADER_SIZE {
            self.malformed_records += 1;
            return;
        }
        // SAFETY: the record starts with a SampleHeader (plain data), checked for length.
        let header: SampleHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const SampleHeader) };
        let Some(target) = self.targets.get_mut(&header.tgid) else {
            self.unknown_process_samples += 1;
            return;
        };
        let (reads, read_bytes) = (memory::READS.load(Relaxed), memory::BYTES_READ.load(Relaxed));
        let outcome = target.process_sample(&header, &bytes[SAMPLE_HEADER_SIZE..], &mut self.profile, self.threads);
        target.counters.count(outcome);
        target.counters.ring_bytes += bytes.len() as u64;
        // Reads happen on this thread only, so the difference is this sample's.
        target.counters.memory_reads += memory::READS.load(Relaxed) - reads;
        if matches!(outcome, SampleOutcome::ChangedCodeObject | SampleOutcome::BadCodeObject | SampleOutcome::StaleTail) {
            self.late_samples += 1;
        }
        target.counters.memory_bytes += memory::BYTES_READ.load(Relaxed) - read_bytes;
    }

    pub(crate) fn totals(&self) -> Counters {
        let mut total = self.retired_overflow.clone();
        for t in self.targets.values() {
            total.add(&t.counters);
        }
        for r in &self.retired {
            total.add(&r.counters);
        }
        for _ in 0..self.unknown_process_samples {
            total.count(SampleOutcome::UnknownProcess);
        }
        total
    }
}



/// Work done every period inside the loop (the agent's uploads).
pub(crate) type PeriodicHook<'a> = dyn FnMut(&mut Session) + 'a;

/// What ends a session's event loop, and what runs periodically inside it.
pub(crate) struct LoopControl<'a> {
    /// Stop after this long.
    pub(crate) duration: Option<Duration>,
    /// Stop when this launched command exits.
    pub(crate) child: Option<&'a mut Child>,
    /// Show progress on stderr (elapsed, samples, processes).
    pub(crate) progress: bool,
    /// How often to look for new processes.
    pub(crate) discovery_interval: Duration,
    /// Called every period with the session (the agent's uploads).
    pub(crate) periodic: Option<(Duration, &'a mut PeriodicHook<'a>)>,
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopEnd {
    DurationElapsed,
    /// The launched command exited with this status (128 + signal when killed).
    CommandExited(i32),
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

/// Runs the session: reads samples as the kernel sends them, scans for processes, until
/// `control` says stop. Samples still in the ring buffer at the end are processed too.
pub(crate) async fn run_loop(
    session: &mut Session,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    mut control: LoopControl<'_>,
) -> Result<LoopEnd, RecordError> {
    let runtime_error = |e: std::io::Error| RecordError::Runtime(e.to_string());
    // SAFETY: the ring buffer owns its fd, which stays open for the AsyncFd's lifetime.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| RecordError::Runtime(e.to_string()))?;
    let started = Instant::now();
    // One timer drives draining, discovery and progress, so that an idle session wakes only
    // on the discovery beat.
    let beat = control.discovery_interval;
    let drain = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(drain);
    let mut next_scan = Instant::now();
    // Progress lines are due at whole seconds of the recording.
    let mut progress_due: u32 = 1;
    let mut late_at_last_drain = session.late_samples;
    let mut last_late: Option<Instant> = None;
    let period = control.periodic.as_ref().map(|(d, _)| *d).unwrap_or(Duration::from_secs(3600));
    let mut periodic_tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let deadline = control.duration.map(|d| tokio::time::Instant::from_std(started + d));
    let interactive = std::io::stderr().is_terminal();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(runtime_error)?;
    let end = loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(runtime_error)?;
                let rb = guard.get_inner_mut();
                while let Some(item) = rb.next() {
                    session.on_record(&item);
                }
                guard.clear_ready();
            }
            _ = &mut drain => {
                let rb = ring.get_mut();
                while let Some(item) = rb.next() {
                    session.on_record(&item);
                }
                let now = Instant::now();
                if session.late_samples != late_at_last_drain {
                    last_late = Some(now);
                    late_at_last_drain = session.late_samples;
                }
                if now >= next_scan {
                    if let Some(c) = control.child.as_mut() {
                        if let Ok(Some(status)) = c.try_wait() {
                            break LoopEnd::CommandExited(exit_code(status));
                        }
                    }
                    session.scan();
                    next_scan = now + session.scan_interval(beat);
                }
                if control.progress && now >= started + PROGRESS_INTERVAL * progress_due {
                    show_progress(session, started, progress_due, interactive);
                    progress_due = (now.duration_since(started).as_secs() as u32).saturating_add(1);
                }
                let busy = last_late.is_some_and(|t| now.duration_since(t) < BUSY_HOLD);
                let next = if busy { now + DRAIN_INTERVAL_BUSY } else { next_scan };
                drain.as_mut().reset(tokio::time::Instant::from_std(next));
            }
            _ = periodic_tick.tick(), if control.periodic.is_some() => {
                let rb = ring.get_mut();
                while let Some(item) = rb.next() {
                    session.on_record(&item);
                }
                if let Some((_, hook)) = control.periodic.as_mut() {
                    hook(session);
                }
            }
            _ = sleep => break LoopEnd::DurationElapsed,
            _ = &mut ctrl_c => break LoopEnd::Interrupted,
            _ = sigterm.recv() => break LoopEnd::Interrupted,
        }
    };
    if interactive && control.progress {
        eprint!("\r\x1b[K");
    }
    let rb = ring.get_mut();
    while let Some(item) = rb.next() {
        session.on_record(&item);
    }
    Ok(end)
}

/// Updates the progress line on stderr: in place on a terminal, every 5 s otherwise.
/// `second` is the whole second of the recording the line is due for.
fn show_progress(session: &Session, started: Instant, second: u32, interactive: bool) {
    let line = format!(
        "pyperch: {:>6.1} s  {:>9} samples  {:>4} processes",
        started.elapsed().as_secs_f64(),
        session.totals().samples(),
        session.live_processes()
    );
    if interactive {
        eprint!("\r{line}\x1b[K");
    } else if second.is_multiple_of(5) {
        eprintln!("{line}");
    }
}

/// Time since boot in clock ticks, the unit of a process's start time: /proc/uptime read
/// once, then advanced with a monotonic clock.
struct TickClock {
    ticks_at_start: f64,
    started: Instant,
    hz: f64,
}

impl TickClock {
    fn new() -> Self {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let uptime = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        Self { ticks_at_start: uptime * hz, started: Instant::now(), hz }
    }

    fn now_ticks(&self) -> u64 {
        (self.ticks_at_start + self.started.elapsed().as_secs_f64() * self.hz) as u64
    }
}

/// The exit status of a finished command, shell-style.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}
