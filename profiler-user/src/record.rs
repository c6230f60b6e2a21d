//! `pyperch record`: one recording, from start to the written profile.

use std::{
    ffi::OsString,
    fs::File,
    io::Write,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    aggregate::Timing,
    discovery::{self, DiscoveryError},
    filter::ProcessFilter,
    loader::{KernelCounters, KernelProgram, LoadError, error_chain},
    memory,
    output::{self, Format},
    session::{
        DISCOVERY_INTERVAL, LAUNCH_DISCOVERY_INTERVAL, LoopControl, LoopEnd, Scope, Session, exit_code, run_loop,
    },
    stats::Counters,
};

pub const MAX_RATE: u64 = 100_000;

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
    /// Only processes passing these filters.
    pub filter: ProcessFilter,
    /// Start every stack with the process's container.
    pub by_container: bool,
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
    #[error("{0}")]
    Upload(String),
    #[error("no Python process matched {0} during the recording")]
    NothingMatched(String),
    #[error("process {pid} does not match {filters}")]
    PidFiltered { pid: u32, filters: String },
}



/// Runs a recording to the end and writes the profile.
pub fn record(options: RecordOptions) -> Result<RecordSummary, RecordError> {
    check_rate(options.rate)?;
    crate::loader::preflight()?;
    // Fail on an unwritable output before sampling starts.
    let mut output_file = match &options.output {
        Some(path) => Some(
            File::create(path).map_err(|source| RecordError::Output { path: path.display().to_string(), source })?,
        ),
        None => None,
    };
    let initial = inspect_pids(&options.pids, &options.filter)?;

    let mut kernel = KernelProgram::load()?;
    let ring = kernel.take_ring_buffer()?;
    let scope = if options.pids.is_empty() { Scope::Host } else { Scope::Pids(options.pids.iter().copied().collect()) };
    let mut session = Session::new(kernel, scope, options.filter.clone(), options.threads);
    session.profile.set_container_root(options.by_container);
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

    let runtime = runtime()?;
    let started = Instant::now();
    let start_time = SystemTime::now();
    let discovery_interval = if child.is_some() { LAUNCH_DISCOVERY_INTERVAL } else { DISCOVERY_INTERVAL };
    let control =
        LoopControl { duration: options.duration, child: child.as_mut(), progress: true, discovery_interval, periodic: None };
    let end = runtime.block_on(run_loop(&mut session, ring, control))?;
    let elapsed = started.elapsed();
    // Stop sampling before writing.
    let kernel_counters = session.kernel.counters();
    session.kernel.detach();
    session.profile.set_timing(Timing { start: start_time, duration: elapsed, rate_hz: options.rate });

    let totals = session.totals();
    if !options.filter.is_empty() && session.registered == 0 {
        return Err(RecordError::NothingMatched(options.filter.describe()));
    }
    let processes = session.sampled_processes();
    let plural = if processes == 1 { "" } else { "es" };
    let title = format!("pyperch: {} samples of {processes} Python process{plural} at {} Hz", totals.ok(), options.rate);
    let write_error = |e: output::OutputError| RecordError::Format(e.to_string());
    match output_file.as_mut() {
        Some(file) => {
            output::write_profile(&session.profile, options.format, &title, file).map_err(write_error)?;
            file.flush().map_err(|e| RecordError::Format(e.to_string()))?;
        }
        None => {
            let mut lock = std::io::stdout().lock();
            output::write_profile(&session.profile, options.format, &title, &mut lock).map_err(write_error)?;
        }
    }

    let mut summary = format!(
        "pyperch: recorded {:.1} s: {} samples ({} ok) from {processes} Python process{plural}",
        elapsed.as_secs_f64(),
        totals.samples(),
        totals.ok(),
    );
    if kernel_counters.ringbuf_full > 0 {
        summary.push_str(&format!(", {} lost (ring buffer full)", kernel_counters.ringbuf_full));
    }
    if let Some(path) = &options.output {
        summary.push_str(&format!("; wrote {}", path.display()));
    }
    eprintln!("{summary}");
    if totals.ok() == 0 {
        let why = match (options.command.is_empty(), options.pids.is_empty()) {
            (false, _) => "the command started no Python process that ran long enough to be sampled",
            (true, false) => "the given processes did not run Python code while recording",
            (true, true) => "no Python process ran on a CPU during the recording",
        };
        eprintln!("pyperch: warning: the profile is empty: {why}");
    }
    if options.stats {
        eprint!("{}", stats_report(&session, &totals, kernel_counters));
    }
    let mut command_status = match end {
        LoopEnd::CommandExited(code) => Some(code),
        _ => None,
    };
    if let (Some(c), None) = (child.as_mut(), command_status) {
        // The recording ended before the command: let it finish, and report its status.
        eprintln!("pyperch: the recording ended; waiting for the command (pid {}) to exit", c.id());
        command_status = c.wait().ok().map(exit_code);
    }
    Ok(RecordSummary { command_status, samples_ok: totals.ok() })
}

pub(crate) fn check_rate(rate: u64) -> Result<(), RecordError> {
    if rate == 0 || rate > MAX_RATE { Err(RecordError::Rate(rate)) } else { Ok(()) }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, RecordError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| RecordError::Runtime(e.to_string()))
}

/// Explicit PIDs must exist, be Python and pass the filters; those whose interpreter is
/// not initialised yet are registered later by the session's scans.
pub(crate) fn inspect_pids(pids: &[u32], filter: &ProcessFilter) -> Result<Vec<discovery::PythonProcess>, RecordError> {
    let mut ready = Vec::new();
    for &pid in pids {
        if discovery::start_time(pid).is_none() {
            return Err(RecordError::NoSuchProcess(pid));
        }
        if !filter.is_empty() && !filter.matches(pid) {
            return Err(RecordError::PidFiltered { pid, filters: filter.describe() });
        }
        match discovery::inspect(pid) {
            Ok(p) => ready.push(p),
            Err(DiscoveryError::NotReady { .. }) => {}
            Err(DiscoveryError::Gone { .. }) => return Err(RecordError::NoSuchProcess(pid)),
            Err(DiscoveryError::NotPython { pid, comm }) => return Err(RecordError::NotPython { pid, comm }),
            Err(DiscoveryError::Unsupported { pid, comm, reason }) => {
                return Err(RecordError::Unsupported { pid, comm, reason });
            }
            Err(e) => return Err(RecordError::Inspect { pid, message: e.to_string() }),
        }
    }
    Ok(ready)
}

/// The `--stats` report: the whole run, the kernel, then each process.
pub(crate) fn stats_report(session: &Session, totals: &Counters, kernel: KernelCounters) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "pyperch statistics (whole run):");
    s.push_str(&totals.report("  "));
    let _ = writeln!(
        s,
        "  kernel: {} samples of registered processes, {} lost (ring buffer full), {} malformed records",
        kernel.sampled, kernel.ringbuf_full, session.malformed_records
    );
    let _ = writeln!(
        s,
        "  kernel process map: {} registrations refused (map full, retried later), {} slots freed by exits",
        session.kernel.map_full,
        session.kernel.registered_exits()
    );
    let _ = writeln!(
        s,
        "  all target memory reads: {} reads, {} bytes (discovery included)",
        memory::READS.load(std::sync::atomic::Ordering::Relaxed),
        memory::BYTES_READ.load(std::sync::atomic::Ordering::Relaxed)
    );
    for (pid, comm, version, alive, counters) in session.per_process() {
        let _ = writeln!(s, "  process {pid} ({comm}, Python {version}{}):", if alive { "" } else { ", exited" });
        s.push_str(&counters.report("    "));
    }
    s
}

/// `error_chain` re-exported for the binary.
pub fn describe(e: &dyn std::error::Error) -> String {
    error_chain(e)
}

