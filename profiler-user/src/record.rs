//! A recording session: discovery → kernel registration → ring buffer → completion →
//! symbolization → aggregation, until the duration ends, the launched command exits, or the
//! user interrupts; then the profile is written.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsString,
    fs::File,
    io::{IsTerminal, Write},
    path::PathBuf,
    process::{Child, Command},
    sync::{Arc, atomic::Ordering::Relaxed},
    time::{Duration, Instant},
};

use profiler_common::{FRAME_ENTRY_SIZE, FrameEntry, MAX_FULL_FRAMES, SAMPLE_HEADER_SIZE, SampleHeader, sample_status};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    aggregate::{FrameId, FrameName, ProcessLabel, Profile},
    completion::{TailCache, TailSource},
    discovery::{self, DiscoveryError, PythonProcess},
    layout::STR_HASH_OFFSET,
    loader::{KernelProgram, LoadError, error_chain},
    memory::{self, ProcessMemory},
    output::{self, Format},
    stats::{Counters, SampleOutcome},
    symbolize::{self, CodeInfo, SymbolError},
};

/// How often /proc is scanned for new Python processes.
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);
/// How often the ring buffer is drained when the kernel has not woken us (it wakes us only
/// once a batch has accumulated).
const DRAIN_INTERVAL: Duration = Duration::from_millis(20);
pub const MAX_RATE: u64 = 100_000;
/// Bounds on the per-process symbol caches (emptied and refilled when reached).
const MAX_CACHED_CODES: usize = 1 << 16;
const MAX_CACHED_POSITIONS: usize = 1 << 20;

/// What to record and where to write it.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Only these processes; empty = every Python process on the host.
    pub pids: Vec<u32>,
    /// Stop after this long; `None` = until the command exits or Ctrl-C.
    pub duration: Option<Duration>,
    pub rate: u64,
    /// Separate stacks by thread.
    pub threads: bool,
    pub stats: bool,
    /// Launch this command and profile it and its Python descendants.
    pub command: Vec<OsString>,
    pub format: Format,
    /// `None`: standard output.
    pub output: Option<PathBuf>,
}

/// How the session ended.
#[derive(Debug)]
pub struct RecordSummary {
    /// Exit status of the launched command (128 + signal if killed), if one was launched.
    pub command_status: Option<i32>,
    pub samples_ok: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot write the profile to {path}: {source}")]
    Output { path: String, source: std::io::Error },
    #[error("could not write the profile: {0}")]
    Format(String),
    #[error("no process with PID {0} exists")]
    NoSuchProcess(u32),
    #[error("process {pid} ({comm}) is not a Python interpreter: no _PyRuntime in its executable or libraries")]
    NotPython { pid: u32, comm: String },
    #[error("process {pid} ({comm}) cannot be profiled: {reason}")]
    Unsupported { pid: u32, comm: String, reason: String },
    #[error("cannot inspect process {pid}: {message}")]
    Inspect { pid: u32, message: String },
    #[error("could not start {command}: {source}")]
    Launch { command: String, source: std::io::Error },
    #[error("the sampling rate must be between 1 and {MAX_RATE} Hz (got {0})")]
    Rate(u64),
    #[error("the event loop failed: {0}")]
    Runtime(String),
}

/// Which processes the session profiles.
enum Scope {
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
        Self {
            process,
            mem,
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
            sample_status::TRUNCATED => return SampleOutcome::Truncated,
            _ => return SampleOutcome::KernelReadFault,
        }
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
        let info = symbolize::read_code(&self.mem, layout, self.process.code_type_address, address)
            .map_err(|_: SymbolError| FrameError::BadCode)?;
        let name = self.mem.read_u64(address + layout.code.name as u64).map_err(|_| FrameError::BadCode)?;
        let check = self.mem.read_u64(name + STR_HASH_OFFSET as u64).map_err(|_| FrameError::BadCode)? as u16;
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

/// The state of a recording.
struct Session {
    kernel: KernelProgram,
    scope: Scope,
    targets: HashMap<u32, Target>,
    /// Targets whose PID was reused by another process (kept for their counts).
    retired: Vec<Target>,
    /// Processes seen not to be profilable, by pid: (start time, executable) when seen.
    rejected: HashMap<u32, (u64, PathBuf)>,
    /// Unsupported interpreters already reported.
    reported: HashSet<(u32, u64)>,
    profile: Profile,
    threads: bool,
    unknown_process_samples: u64,
    malformed_records: u64,
    own_pid: u32,
}

impl Session {
    /// Registers a Python process with the kernel if its interpreter is ready.
    fn add_process(&mut self, process: PythonProcess) -> Result<bool, RecordError> {
        let pid = process.pid;
        let mem = ProcessMemory::new(pid);
        let info = match process.kernel_info(&mem) {
            Ok(info) => profiler_common::ProcessInfo { frame: process.layout.kernel_frame_layout(), ..info },
            Err(DiscoveryError::NotReady { .. }) => return Ok(false),
            Err(e) => return Err(RecordError::Inspect { pid, message: e.to_string() }),
        };
        self.kernel.register(pid, &info)?;
        self.profile.set_process(
            pid,
            ProcessLabel {
                comm: process.comm.clone(),
                exe: process.exe.display().to_string(),
                version: process.version.to_string(),
            },
        );
        self.targets.insert(pid, Target::new(process));
        Ok(true)
    }

    /// One pass over /proc: new processes, exited ones, reused PIDs.
    fn scan(&mut self) {
        // Exited targets: stop sampling them, keep their caches for samples in flight.
        for (pid, target) in self.targets.iter_mut() {
            if target.alive && !discovery::is_alive(*pid, target.process.start_time) {
                target.alive = false;
                self.kernel.unregister(*pid);
            }
        }
        if matches!(self.scope, Scope::Pids(_)) && self.targets.values().all(|t| t.alive) {
            // Explicit pids are all registered; nothing new can join.
            if let Scope::Pids(pids) = &self.scope {
                if pids.iter().all(|p| self.targets.contains_key(p)) {
                    return;
                }
            }
        }
        for pid in discovery::python_pids_candidates() {
            if pid == self.own_pid || !self.scope.accepts(pid) {
                continue;
            }
            let Some(start_time) = discovery::start_time(pid) else { continue };
            if let Some(target) = self.targets.get(&pid) {
                if target.process.start_time == start_time {
                    continue;
                }
                // The PID was reused: the old process is gone.
                self.kernel.unregister(pid);
                if let Some(old) = self.targets.remove(&pid) {
                    self.retire(old);
                }
            }
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if self.rejected.get(&pid) == Some(&(start_time, exe.clone())) {
                continue;
            }
            match discovery::inspect(pid) {
                Ok(process) => match self.add_process(process) {
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("pyperch: warning: {e}");
                        self.rejected.insert(pid, (start_time, exe));
                    }
                },
                Err(DiscoveryError::NotReady { .. }) => {}
                Err(DiscoveryError::Unsupported { pid, comm, reason }) => {
                    if self.reported.insert((pid, start_time)) {
                        eprintln!("pyperch: warning: skipping process {pid} ({comm}): {reason}");
                    }
                    self.rejected.insert(pid, (start_time, exe));
                }
                Err(_) => {
                    self.rejected.insert(pid, (start_time, exe));
                }
            }
        }
    }

    /// Keeps the counts of a target that is replaced (its PID was reused).
    fn retire(&mut self, mut old: Target) {
        old.alive = false;
        old.codes.clear();
        old.positions.clear();
        old.tails = TailCache::default();
        self.retired.push(old);
    }

    fn on_record(&mut self, bytes: &[u8]) {
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
        target.counters.memory_bytes += memory::BYTES_READ.load(Relaxed) - read_bytes;
    }

    fn totals(&self) -> Counters {
        let mut total = Counters::default();
        for t in self.targets.values().chain(&self.retired) {
            total.add(&t.counters);
        }
        for _ in 0..self.unknown_process_samples {
            total.count(SampleOutcome::UnknownProcess);
        }
        total
    }
}

/// Runs a recording to the end and writes the profile.
pub fn record(options: RecordOptions) -> Result<RecordSummary, RecordError> {
    if options.rate == 0 || options.rate > MAX_RATE {
        return Err(RecordError::Rate(options.rate));
    }
    crate::loader::preflight()?;
    // Fail on an unwritable output before sampling starts.
    let mut output_file = match &options.output {
        Some(path) => Some(
            File::create(path).map_err(|source| RecordError::Output { path: path.display().to_string(), source })?,
        ),
        None => None,
    };

    // Explicit PIDs must exist and be Python.
    let mut initial = Vec::new();
    for &pid in &options.pids {
        if discovery::start_time(pid).is_none() {
            return Err(RecordError::NoSuchProcess(pid));
        }
        match discovery::inspect(pid) {
            Ok(p) => initial.push(p),
            Err(DiscoveryError::NotReady { .. }) => {}
            Err(DiscoveryError::Gone { .. }) => return Err(RecordError::NoSuchProcess(pid)),
            Err(DiscoveryError::NotPython { pid, comm }) => return Err(RecordError::NotPython { pid, comm }),
            Err(DiscoveryError::Unsupported { pid, comm, reason }) => {
                return Err(RecordError::Unsupported { pid, comm, reason });
            }
            Err(e) => return Err(RecordError::Inspect { pid, message: e.to_string() }),
        }
    }

    let mut kernel = KernelProgram::load()?;
    let ring = kernel.take_ring_buffer()?;
    let scope = if !options.pids.is_empty() { Scope::Pids(options.pids.iter().copied().collect()) } else { Scope::Host };
    let mut session = Session {
        kernel,
        scope,
        targets: HashMap::new(),
        retired: Vec::new(),
        rejected: HashMap::new(),
        reported: HashSet::new(),
        profile: Profile::new(),
        threads: options.threads,
        unknown_process_samples: 0,
        malformed_records: 0,
        own_pid: std::process::id(),
    };
    for p in initial {
        session.add_process(p)?;
    }
    session.kernel.attach(options.rate)?;

    let mut child = None;
    if !options.command.is_empty() {
        let program = &options.command[0];
        let spawned = Command::new(program)
            .args(&options.command[1..])
            .spawn()
            .map_err(|source| RecordError::Launch { command: program.to_string_lossy().into_owned(), source })?;
        session.scope = Scope::Launched { root: spawned.id() };
        child = Some(spawned);
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RecordError::Runtime(e.to_string()))?;
    let started = Instant::now();
    let mut command_status = runtime.block_on(run_loop(&mut session, ring, options.duration, &mut child, started))?;
    let elapsed = started.elapsed();
    // Stop sampling before writing.
    let kernel_counters = session.kernel.counters();
    session.kernel.detach();

    // Write the profile.
    let totals = session.totals();
    let processes = session.profile_processes();
    let title = format!(
        "pyperch: {} samples of {} Python process{} at {} Hz",
        totals.ok(),
        processes,
        if processes == 1 { "" } else { "es" },
        options.rate
    );
    let write_result = match output_file.as_mut() {
        Some(file) => output::write_profile(&session.profile, options.format, &title, file)
            .map_err(|e| RecordError::Format(e.to_string()))
            .and_then(|_| file.flush().map_err(|e| RecordError::Format(e.to_string()))),
        None => {
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            output::write_profile(&session.profile, options.format, &title, &mut lock)
                .map_err(|e| RecordError::Format(e.to_string()))
        }
    };
    write_result?;

    let mut summary = format!(
        "pyperch: recorded {:.1} s: {} samples ({} ok) from {} Python process{}",
        elapsed.as_secs_f64(),
        totals.samples(),
        totals.ok(),
        processes,
        if processes == 1 { "" } else { "es" },
    );
    if kernel_counters.ringbuf_full > 0 {
        summary.push_str(&format!(", {} lost (ring buffer full)", kernel_counters.ringbuf_full));
    }
    if let Some(path) = &options.output {
        summary.push_str(&format!("; wrote {}", path.display()));
    }
    eprintln!("{summary}");
    if totals.samples() == 0 {
        let why = match (&options.command.is_empty(), options.pids.is_empty()) {
            (false, _) => "the command started no Python process that ran long enough to be sampled",
            (true, false) => "the given processes did not run Python code while recording",
            (true, true) => "no Python process ran on a CPU during the recording",
        };
        eprintln!("pyperch: warning: the profile is empty: {why}");
    }
    if options.stats {
        eprint!("{}", stats_report(&session, &totals, kernel_counters, session.malformed_records));
    }
    if let (Some(c), None) = (child.as_mut(), command_status) {
        // The recording ended before the command: let it finish, and report its status.
        eprintln!("pyperch: the recording ended; waiting for the command (pid {}) to exit", c.id());
        command_status = c.wait().ok().map(exit_code);
    }
    Ok(RecordSummary { command_status, samples_ok: totals.ok() })
}

impl Session {
    fn profile_processes(&self) -> usize {
        let mut pids: HashSet<u32> = HashSet::new();
        for t in self.targets.values().chain(&self.retired) {
            if t.counters.ok() > 0 {
                pids.insert(t.process.pid);
            }
        }
        pids.len()
    }
}

fn stats_report(session: &Session, totals: &Counters, kernel: crate::loader::KernelCounters, malformed: u64) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "pyperch statistics (whole run):");
    s.push_str(&totals.report("  "));
    let _ = writeln!(
        s,
        "  kernel: {} samples of registered processes, {} lost (ring buffer full), {} malformed records",
        kernel.sampled, kernel.ringbuf_full, malformed
    );
    let _ = writeln!(
        s,
        "  target memory: {} reads, {} bytes",
        memory::READS.load(std::sync::atomic::Ordering::Relaxed),
        memory::BYTES_READ.load(std::sync::atomic::Ordering::Relaxed)
    );
    let mut targets: Vec<&Target> = session.targets.values().chain(&session.retired).collect();
    targets.sort_by_key(|t| t.process.pid);
    for t in targets {
        let _ = writeln!(
            s,
            "  process {} ({}, Python {}{}):",
            t.process.pid,
            t.process.comm,
            t.process.version,
            if t.alive { "" } else { ", exited" }
        );
        s.push_str(&t.counters.report("    "));
    }
    s
}

async fn run_loop(
    session: &mut Session,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    duration: Option<Duration>,
    child: &mut Option<Child>,
    started: Instant,
) -> Result<Option<i32>, RecordError> {
    // SAFETY: the ring buffer owns its fd, which stays open for the AsyncFd's lifetime.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| RecordError::Runtime(e.to_string()))?;
    let mut discovery_tick = tokio::time::interval(DISCOVERY_INTERVAL);
    let mut drain_tick = tokio::time::interval(DRAIN_INTERVAL);
    let mut progress_tick = tokio::time::interval(Duration::from_secs(1));
    progress_tick.tick().await;
    let deadline = duration.map(|d| tokio::time::Instant::from_std(started + d));
    let interactive = std::io::stderr().is_terminal();
    let mut command_status = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| RecordError::Runtime(e.to_string()))?;
    loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(|e| RecordError::Runtime(e.to_string()))?;
                let rb = guard.get_inner_mut();
                while let Some(item) = rb.next() {
                    session.on_record(&item);
                }
                guard.clear_ready();
            }
            _ = drain_tick.tick() => {
                let rb = ring.get_mut();
                while let Some(item) = rb.next() {
                    session.on_record(&item);
                }
            }
            _ = discovery_tick.tick() => {
                if let Some(c) = child.as_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        command_status = Some(exit_code(status));
                        break;
                    }
                }
                session.scan();
            }
            _ = progress_tick.tick() => {
                let totals = session.totals();
                let line = format!(
                    "pyperch: {:>6.1} s  {:>9} samples  {:>4} processes",
                    started.elapsed().as_secs_f64(),
                    totals.samples(),
                    session.targets.values().filter(|t| t.alive).count()
                );
                if interactive {
                    eprint!("\r{line}\x1b[K");
                } else if started.elapsed().as_secs() % 5 == 0 {
                    eprintln!("{line}");
                }
            }
            _ = sleep => break,
            _ = &mut ctrl_c => break,
            _ = sigterm.recv() => break,
        }
    }
    if interactive {
        eprint!("\r\x1b[K");
    }
    // Samples already in the ring buffer still count.
    let rb = ring.get_mut();
    while let Some(item) = rb.next() {
        session.on_record(&item);
    }
    // A launched command still running when the duration ends keeps running; report none.
    Ok(command_status)
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// `error_chain` re-exported for the binary.
pub fn describe(e: &dyn std::error::Error) -> String {
    error_chain(e)
}
