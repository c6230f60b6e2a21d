//! `pyperch record`: one recording, from start to the written profile.

use std::{
    ffi::OsString,
    io::{IsTerminal, Write},
    os::unix::ffi::OsStrExt,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    aggregate::{LineNumbers, Timing},
    discovery::{self, DiscoveryError},
    explain::{self, RecordingFacts},
    launch::{self, Ending, RecordingEnd},
    filter::ProcessFilter,
    loader::{KernelCounters, KernelProgram, LoadError, error_chain},
    memory,
    output::{self, Format},
    output_file,
    host::privileges::{self, PrivilegeError},
    session::{
        Budgeted, DISCOVERY_INTERVAL, INSPECT_BUDGET, LAUNCH_DISCOVERY_INTERVAL, LoopControl, LoopEnd, Scope, Session,
        run_loop,
    },
    stats::Counters,
    text,
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
    /// With `pids`: also every descendant of them, present and future (`--subprocesses`).
    pub subprocesses: bool,
    /// Leave a launched command running when the recording ends (`--keep-running`).
    pub keep_running: bool,
    /// Which line frames show (`--function`, `--nolineno`).
    pub line_numbers: LineNumbers,
    /// Show full file paths instead of short names (`--full-filenames`).
    pub full_filenames: bool,
    /// Which time to profile (`--mode`, `--min-off-cpu`).
    pub time: crate::time_mode::TimeOptions,
    /// asyncio task stacks (`--async`, see `crate::asyncio`).
    pub async_stacks: bool,
    /// Native and kernel frames (`--native`, `--kernel`).
    pub native: crate::native::NativeOptions,
}

/// How the session ended.
#[derive(Debug)]
pub struct RecordSummary {
    /// Exit status of the launched command (128 + signal if killed), if one was launched.
    pub command_status: Option<i32>,
    pub samples_ok: u64,
}

/// Display escapes text from targets and paths (see `text`); `main` shows the chain through
/// `text::lines` as well.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot write the profile to {}: {source}", crate::text::field(.path))]
    Output { path: String, source: std::io::Error },
    #[error("could not write the profile: {0}")]
    Format(String),
    #[error("no process with PID {0} exists")]
    NoSuchProcess(u32),
    #[error("process {pid} ({}) is not a Python interpreter: no _PyRuntime in its executable or libraries", crate::text::field(.comm))]
    NotPython { pid: u32, comm: String },
    #[error("process {pid} ({}) cannot be profiled: {}", crate::text::field(.comm), crate::text::field(.reason))]
    Unsupported { pid: u32, comm: String, reason: String },
    #[error("cannot inspect process {pid}: {}", crate::text::field(.message))]
    Inspect { pid: u32, message: String },
    #[error("could not start {}: {source}", crate::text::field(.command))]
    Launch { command: String, source: std::io::Error },
    #[error("the sampling rate must be between 1 and {MAX_RATE} Hz (got {0})")]
    Rate(u64),
    #[error("the event loop failed: {0}")]
    Runtime(String),
    #[error("{0}")]
    Upload(String),
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error("no Python process matched {} during the recording", crate::text::field(.0))]
    NothingMatched(String),
    #[error("process {pid} does not match {}", crate::text::field(.filters))]
    PidFiltered { pid: u32, filters: String },
}



/// Runs a recording to the end and writes the profile.
pub fn record(options: RecordOptions) -> Result<RecordSummary, RecordError> {
    check_rate(options.rate)?;
    crate::loader::preflight()?;
    // Fail on an unwritable output before sampling starts, leaving an existing file alone.
    let output_error = |path: &std::path::Path, source| RecordError::Output { path: text::decode(path.as_os_str().as_bytes()), source };
    if let Some(path) = &options.output {
        output_file::check(path).map_err(|e| output_error(path, e))?;
    }
    // Only whether they exist is checked before attaching: inspecting them may leave a
    // thread behind (an opener waiting on a file that never answers), and the privilege drop
    // must run while pyperch has one thread; they are inspected once it has run.
    check_pids_exist(&options.pids)?;

    // A timeline needs each thread's records in time order: off-CPU records then go one by one.
    let time = crate::time_mode::TimeOptions { batch_off_cpu: !options.format.needs_timeline(), ..options.time };
    let mut kernel = KernelProgram::load_with(&time, options.native)?;
    let ring = kernel.take_ring_buffer()?;
    // Kernel symbols need privileges that are dropped once sampling starts: read them now.
    let kallsyms = options.native.kernel.then(crate::native::Kallsyms::load).flatten();
    if options.native.kernel && kallsyms.is_none() {
        eprintln!("pyperch: warning: /proc/kallsyms shows no addresses; kernel frames will read <kernel>_[k]");
    }
    let scope = match (options.pids.is_empty(), options.subprocesses) {
        (true, _) => Scope::Host,
        (false, false) => Scope::Pids(options.pids.iter().copied().collect()),
        (false, true) => Scope::Trees(options.pids.iter().copied().collect()),
    };
    let mut session = Session::new(kernel, scope, options.filter.clone(), options.threads);
    session.set_time_mode(options.time.mode, options.rate);
    session.set_async_stacks(options.async_stacks);
    session.profile.set_container_root(options.by_container);
    session.profile.set_line_numbers(options.line_numbers);
    if options.native.any() {
        session.set_native(crate::native::NativeContext::new(options.native, kallsyms));
    }
    if options.format.needs_timeline() {
        session.profile.keep_timeline(1_000_000_000 / options.rate.max(1));
    }
    // With chosen processes (and no --subprocesses) or a launched command, only their tasks
    // are interrupted (per-task events that follow new threads and children); otherwise
    // every CPU is.
    let launch_only = !options.command.is_empty() && options.pids.is_empty();
    let pids_only = options.command.is_empty() && !options.pids.is_empty() && !options.subprocesses;
    if pids_only {
        session.kernel.attach_tasks(options.rate, &options.pids)?;
    } else if !launch_only {
        session.kernel.attach(options.rate)?;
    }
    // Every registered process is watched from then on; the waits of threads already
    // switched out at their registration are charged from then (`read_blocked_threads`).
    if options.time.mode.off_cpu() {
        session.kernel.attach_off_cpu()?;
    }

    let mut child = None;
    if !options.command.is_empty() {
        let program = &options.command[0];
        let mut command = Command::new(program);
        command.args(&options.command[1..]);
        // Under sudo the command runs as the user who ran sudo, not as root.
        if let Some(user) = privileges::InvokingUser::from_sudo() {
            user.apply(&mut command);
        }
        let launch_error = |source| RecordError::Launch { command: program.to_string_lossy().into_owned(), source };
        let spawned = if launch_only {
            // Held before its exec until its events are open: sampled from its first
            // instruction (discovery registers its interpreter as soon as it is initialised).
            let attacher = session.kernel.task_attacher(options.rate)?;
            match launch::spawn_held(&mut command, |pid| attacher.open(pid)) {
                Ok((spawned, events)) => {
                    session.kernel.adopt_task_events(events);
                    spawned
                }
                Err(launch::HeldSpawnError::Spawn(source)) => return Err(launch_error(source)),
                Err(launch::HeldSpawnError::Before(e)) => return Err(e.into()),
            }
        } else {
            command.spawn().map_err(launch_error)?
        };
        session.scope = Scope::Launched { root: spawned.id() };
        child = Some(spawned);
    }
    // Attached and launched: keep only what sampling needs (before any other thread starts).
        privileges::drop_after_attach(&privileges::Keep { output: options.output.clone(), command: child.is_some() })?;
    let initial = if options.subprocesses {
        // The given processes need not be Python, nor match the filters: their descendants may.
        let mut ready = Vec::new();
        for &pid in &options.pids {
            match inspect_pids(&[pid], &options.filter) {
                Ok(mut p) => ready.append(&mut p),
                Err(RecordError::NotPython { .. } | RecordError::PidFiltered { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        ready
    } else {
        inspect_pids(&options.pids, &options.filter)?
    };
    if options.async_stacks && !options.subprocesses {
        // An explicit process that cannot have task stacks is refused, with the reason.
        if let Some(p) = initial.iter().find(|p| !crate::asyncio::supported(p.version)) {
            let reason = crate::asyncio::AsyncioError::TooOld { pid: p.pid, version: p.version }.to_string();
            return Err(RecordError::Unsupported { pid: p.pid, comm: p.comm.clone(), reason });
        }
    }
    for p in initial {
        session.add_process(p)?;
    }
    session.read_blocked_threads();

    let started = Instant::now();
    let start_time = SystemTime::now();
    let discovery_interval = if child.is_some() { LAUNCH_DISCOVERY_INTERVAL } else { DISCOVERY_INTERVAL };
    // `--pid` alone: the recording also ends once every given process has exited.
    let exit_watch = if pids_only { crate::session::exit_watch::ExitWatch::open(&options.pids) } else { None };
    let control = LoopControl {
        duration: options.duration,
        child: child.as_mut(),
        progress: true,
        discovery_interval,
        periodic: None,
        until_exited: exit_watch.as_ref(),
    };
    let end = run_loop(&mut session, ring, control)?;
    let elapsed = started.elapsed();
    // Sampling stopped as the loop ended.
    let kernel_counters = session.kernel.counters();
    let min_off_cpu_ns = u64::try_from(options.time.min_off_cpu.as_nanos()).unwrap_or(u64::MAX);
    session.add_unsent_off_cpu(crate::loader::monotonic_ns(), min_off_cpu_ns);
    let totals = session.totals();
    session.profile.set_timing(Timing {
        start: start_time,
        duration: elapsed,
        rate_hz: options.rate,
        dropped: explain::dropped_samples(&totals),
        lost: kernel_counters.ringbuf_full,
    });

    if !options.filter.is_empty() && session.registered == 0 {
        return Err(RecordError::NothingMatched(options.filter.describe()));
    }
    let processes = session.sampled_processes();
    let plural = if processes == 1 { "" } else { "es" };
    let title = format!("pyperch: {} samples of {processes} Python process{plural} at {} Hz", totals.ok(), options.rate);
    let write_error = |e: output::OutputError| RecordError::Format(e.to_string());
    // Short file names for people; pprof and OTLP keep full paths (their readers shorten them).
    let short;
    let shown = if options.full_filenames || matches!(options.format, Format::Pprof | Format::Otlp) {
        &session.profile
    } else {
        short = crate::filenames::with_short_names(&session.profile);
        &short
    };
    // An empty recording never replaces an existing file (nor creates one). Content is any
    // value in the profile: samples, and in the off-CPU modes measured waits too (a program
    // that only sleeps has a profile of where it sleeps).
    let empty = session.profile.total_samples() == 0;
    match &options.output {
        Some(_) if empty => {}
        Some(path) => {
            // A whole-host recording holds every process's code: its file is its owner's only.
            let host_wide = options.pids.is_empty() && options.command.is_empty();
            let fill = |file: &mut std::fs::File| output::write_profile(shown, options.format, &title, file);
            let written = if host_wide { output_file::write_private(path, fill) } else { output_file::write(path, fill) };
            written
                .map_err(|e| match e {
                    output_file::OutputFileError::Io(e) => output_error(path, e),
                    output_file::OutputFileError::Content(e) => write_error(e),
                })?;
        }
        None => write_stdout(shown, options.format, &title).map_err(write_error)?,
    }

    let mut summary = format!(
        "pyperch: recorded {:.1} s: {} samples ({} ok)",
        elapsed.as_secs_f64(),
        totals.samples(),
        totals.ok(),
    );
    if options.time.mode.off_cpu() {
        let off_cpu_ns = totals.off_cpu_ns + totals.off_cpu_short_ns;
        summary.push_str(&format!(", {:.3} s off-CPU", off_cpu_ns as f64 / 1e9));
        if session.blocked.charged_threads > 0 {
            let n = session.blocked.charged_threads;
            summary.push_str(&format!(
                " ({:.3} s of it in {n} thread{} blocked since the start)",
                session.blocked.charged_ns as f64 / 1e9,
                if n == 1 { "" } else { "s" }
            ));
        }
    }
    if let Some(part) = task_wait_summary(&totals) {
        summary.push_str(&part);
    }
    summary.push_str(&format!(" from {processes} Python process{plural}"));
    if kernel_counters.ringbuf_full > 0 {
        summary.push_str(&format!(", {} lost (ring buffer full)", kernel_counters.ringbuf_full));
    }
    match &options.output {
        Some(path) if !empty => summary.push_str(&format!("; wrote {}", text::path(path))),
        _ => {}
    }
    if end == LoopEnd::TargetsExited {
        let pids: Vec<String> = exit_watch.as_ref().map(|w| w.pids()).unwrap_or_default().iter().map(u32::to_string).collect();
        let (noun, verb) = if pids.len() == 1 { ("process", "has") } else { ("processes", "have") };
        summary.push_str(&format!(" (the recording ended: {noun} {} {verb} exited)", pids.join(", ")));
    }
    eprintln!("{summary}");
    if empty {
        let why = explain::empty_recording(RecordingFacts {
            launched: child.is_some(),
            command_exited: matches!(end, LoopEnd::CommandExited(_)),
            explicit_pids: !options.pids.is_empty(),
            registered: session.registered,
            kernel_samples: kernel_counters.sampled,
            busy_thread_samples: (elapsed.as_secs_f64() * options.rate as f64) as u64,
            mode: options.time.mode,
        });
        match &options.output {
            Some(path) => eprintln!(
                "pyperch: warning: the profile is empty: {why}; nothing was written to {} (an existing file is left unchanged)",
                text::path(path)
            ),
            None => eprintln!("pyperch: warning: the profile is empty: {why}"),
        }
    } else if let Some(warning) = explain::dropped_warning(&totals, kernel_counters.ringbuf_full) {
        eprintln!("pyperch: warning: {warning}");
    }
    if options.stats {
        eprint!("{}", stats_report(&session, &totals, kernel_counters));
    }
    // A launched command still running is ended with the recording (see `launch`); pyperch
    // then exits with 0, the profile being written. A command that ended the recording by
    // exiting gives pyperch its status.
    let command_status = match (end, child.as_mut()) {
        (LoopEnd::CommandExited(code), _) => Some(code),
        (_, None) => None,
        (end, Some(c)) => {
            let why = match end {
                LoopEnd::Interrupted => RecordingEnd::Interrupted,
                LoopEnd::Terminated => RecordingEnd::Terminated,
                _ => RecordingEnd::DurationElapsed,
            };
            let pid = c.id();
            match launch::end_command(c, why, options.keep_running) {
                Ending::LeftRunning => eprintln!("pyperch: the command (pid {pid}) keeps running (--keep-running)"),
                Ending::Exited(status) => {
                    eprintln!("pyperch: the recording ended; the command (pid {pid}) was ended (status {status})")
                }
            }
            None
        }
    };
    Ok(RecordSummary { command_status, samples_ok: totals.ok() })
}

/// The summary's part on suspended asyncio tasks' waits (`--async` with wall or off-CPU
/// time), when any were charged: they are time of tasks, beside the threads' time.
fn task_wait_summary(totals: &Counters) -> Option<String> {
    let w = &totals.task_waits;
    (w.wait_ns > 0).then(|| {
        format!(
            ", {:.3} s waited by suspended asyncio tasks (<task waiting>, up to {} tasks per process)",
            w.wait_ns as f64 / 1e9,
            w.max_tasks
        )
    })
}

/// The profile on standard output. On a terminal it is shown through `text::lines`, so no
/// name in it can steer the terminal; into a pipe or file the bytes are exact.
fn write_stdout(profile: &crate::aggregate::Profile, format: Format, title: &str) -> Result<(), output::OutputError> {
    let mut stdout = std::io::stdout().lock();
    if !stdout.is_terminal() {
        return output::write_profile(profile, format, title, &mut stdout);
    }
    let mut bytes = Vec::new();
    output::write_profile(profile, format, title, &mut bytes)?;
    let shown = text::lines(&text::decode(&bytes)).to_string();
    stdout
        .write_all(shown.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|source| output::OutputError::Write { format, source })
}

pub(crate) fn check_rate(rate: u64) -> Result<(), RecordError> {
    if rate == 0 || rate > MAX_RATE { Err(RecordError::Rate(rate)) } else { Ok(()) }
}

/// `NoSuchProcess` for the first of `pids` that does not exist; reads only `/proc/PID/stat`
/// on this thread (no helper thread, so it may run before the privilege drop).
pub(crate) fn check_pids_exist(pids: &[u32]) -> Result<(), RecordError> {
    match pids.iter().find(|&&pid| discovery::start_time(pid).is_none()) {
        Some(&pid) => Err(RecordError::NoSuchProcess(pid)),
        None => Ok(()),
    }
}

/// Explicit PIDs must exist, be Python and pass the filters; those whose interpreter is
/// not initialised yet are registered later by the session's scans.
/// Inspects each of `pids` with a time budget. Runs helper threads that may outlive it (a
/// file that never answers): call it only after [`privileges::drop_after_attach`].
pub(crate) fn inspect_pids(pids: &[u32], filter: &ProcessFilter) -> Result<Vec<discovery::PythonProcess>, RecordError> {
    let mut ready = Vec::new();
    for &pid in pids {
        if discovery::start_time(pid).is_none() {
            return Err(RecordError::NoSuchProcess(pid));
        }
        // A process whose files or /proc entries never answer must not hang the start.
        let budgeted = Budgeted::default();
        let checked_filter = filter.clone();
        let inspected = budgeted
            .run_for(pid, INSPECT_BUDGET, move || {
                (checked_filter.is_empty() || checked_filter.matches(pid)).then(|| discovery::inspect(pid))
            })
            .map_err(|_| RecordError::Inspect {
                pid,
                message: format!(
                    "its /proc entries or mapped files did not answer within {:.1} s",
                    INSPECT_BUDGET.as_secs_f64()
                ),
            })?;
        let Some(inspected) = inspected else {
            return Err(RecordError::PidFiltered { pid, filters: filter.describe() });
        };
        match inspected {
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
    let drain = session.drain_counts;
    let _ = writeln!(
        s,
        "  drain thread: {} records queued for the worker (at most {:.1} MiB at once); dropped: {} (a process's queue full, {} MiB), {} (all queues full, {} MiB), {} (still queued when the end's time ran out)",
        drain.queued,
        drain.peak_bytes as f64 / (1 << 20) as f64,
        drain.dropped_process_full,
        crate::session::drain::PROCESS_BYTES >> 20,
        drain.dropped_total_full,
        crate::session::drain::TOTAL_BYTES >> 20,
        drain.dropped_at_end
    );
    if session.samples_over_read_budget > 0 {
        let budget = crate::session::SAMPLE_READ_BUDGET;
        let _ = writeln!(
            s,
            "  samples over their read budget ({} reads, {} MiB): {}",
            budget.reads,
            budget.bytes >> 20,
            session.samples_over_read_budget
        );
    }
    let quarantined = crate::memory::deadline::QUARANTINED_TOTAL.load(std::sync::atomic::Ordering::Relaxed);
    if quarantined > 0 || session.quarantined_records > 0 {
        let _ = writeln!(
            s,
            "  quarantined: {} processes (a read of their memory did not answer within {:.1} s; nothing more read from them), {} of their records dropped; {} readers still blocked",
            quarantined,
            crate::memory::deadline::READ_DEADLINE.as_secs_f64(),
            session.quarantined_records,
            crate::memory::deadline::stuck_readers()
        );
    }
    if kernel.code_checks_cached + kernel.code_checks_read > 0 {
        let _ = writeln!(
            s,
            "  kernel code-object checks: {} from the kernel's cache (no code object created or freed since they were read), {} read from the target",
            kernel.code_checks_cached, kernel.code_checks_read
        );
    }
    if kernel.code_snapshots + kernel.code_snapshots_skipped > 0 {
        let _ = writeln!(
            s,
            "  kernel code-object copies: {} sent at sample time, {} not made (larger than the kernel's regions, or unreadable); {} for processes no longer profiled",
            kernel.code_snapshots, kernel.code_snapshots_skipped, session.unknown_process_snapshots
        );
    }
    if kernel.off_cpu_intervals + kernel.off_cpu_short + kernel.off_cpu_lost > 0 {
        let _ = writeln!(
            s,
            "  kernel off-CPU intervals: {} sent, {} short (summed), {} whose stack was not kept (summed); sent in {} batches, {} batches read at the end",
            kernel.off_cpu_intervals, kernel.off_cpu_short, kernel.off_cpu_lost, kernel.off_cpu_batches, session.off_cpu_batches_at_end
        );
    }
    if kernel.off_cpu_no_kernel_stack + session.kernel_stacks.missing > 0 || (session.off_cpu_kernel_stacks() && kernel.off_cpu_intervals > 0) {
        let _ = writeln!(
            s,
            "  kernel stacks of off-CPU intervals (--kernel): {} switch-outs without one (the stack map's slot held another stack, or it was full), {} intervals whose stack was not found; those are shown without kernel frames",
            kernel.off_cpu_no_kernel_stack, session.kernel_stacks.missing
        );
    }
    if kernel.not_gil_holder + kernel.gil_unknown > 0 {
        let _ = writeln!(
            s,
            "  kernel --mode gil: {} samples of threads not holding the GIL dropped, {} of versions that cannot tell the holder dropped",
            kernel.not_gil_holder, kernel.gil_unknown
        );
    }
    if kernel.not_handling_exception + kernel.exception_unknown + kernel.exception_chain_too_long > 0 {
        let _ = writeln!(
            s,
            "  kernel --mode exception: {} samples of threads not handling an exception dropped, {} of versions whose exception state is not known dropped, {} whose exception-state chain was longer than {} items dropped",
            kernel.not_handling_exception,
            kernel.exception_unknown,
            kernel.exception_chain_too_long,
            profiler_common::MAX_EXCEPTION_ITEMS
        );
    }
    if session.blocked.enabled() {
        let _ = writeln!(s, "  {}", session.blocked.report());
    }
    let _ = writeln!(s, "  {}", session.discovery_stats.report());
    if let Some(t) = session.profile.timeline() {
        let _ = writeln!(
            s,
            "  timeline (chrometrace): {} runs kept (cap {}), {} samples dropped over the cap, {} out of order",
            t.run_count(),
            crate::timeline::MAX_RUNS,
            t.dropped_over_cap,
            t.out_of_order
        );
    }
    let _ = writeln!(
        s,
        "  kernel process map: {} registrations refused (map full, retried later), {} slots freed by exits",
        session.kernel.map_full(),
        session.kernel.registered_exits()
    );
    let _ = writeln!(
        s,
        "  all target memory reads: {} reads, {} bytes (discovery included)",
        memory::READS.load(std::sync::atomic::Ordering::Relaxed),
        memory::BYTES_READ.load(std::sync::atomic::Ordering::Relaxed)
    );
    let files = discovery::file_counts();
    let problems: Vec<String> =
        files.problems.iter().filter(|(_, n)| *n > 0).map(|(p, n)| format!("{n} {}", p.label())).collect();
    let _ = writeln!(
        s,
        "  mapped files: {} parsed; problem files: {}; {} skips without opening ({} over a process's opener allowance, {} over all openers); {} hung now",
        discovery::cached_files(),
        if problems.is_empty() { "none".to_string() } else { problems.join(", ") },
        files.skips,
        files.over_allowance,
        files.over_total,
        files.hung_now
    );
    if let Some(line) = session.native_io_report() {
        let _ = writeln!(s, "  {line}");
    }
    let _ = writeln!(
        s,
        "  pod names (runtime annotations): {} containers named; {} bundles refused (not a regular file, over 1 MiB, not JSON, not Kubernetes names, or another pod's UID)",
        crate::host::pod_names::named(),
        crate::host::pod_names::refused()
    );
    for (pid, comm, version, alive, counters) in session.per_process() {
        let comm = crate::text::field(&comm);
        let _ = writeln!(s, "  process {pid} ({comm}, Python {version}{}):", if alive { "" } else { ", exited" });
        s.push_str(&counters.report("    "));
    }
    s
}

/// `error_chain` re-exported for the binary.
pub fn describe(e: &dyn std::error::Error) -> String {
    error_chain(e)
}

