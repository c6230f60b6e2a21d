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
    sample::aggregate::{LineNumbers, Timing},
    cmd::explain::{self, RecordingFacts},
    cmd::launch::{self, Ending, RecordingEnd},
    filter::ProcessFilter,
    kernel::loader::error_chain,
    output::{self, Format},
    output::file as output_file,
    host::privileges,
    session::{
        LoopEnd, SessionError,
        builder::{Launcher, SessionBuilder, check_rate},
    },
    stats::Counters,
    text,
};

pub use crate::session::error::MAX_RATE;

/// What to record and where to write it.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Only these processes; empty = every Python process on the host.
    pub pids: Vec<u32>,
    /// Stop after this long; `None` = until the command exits or Ctrl-C.
    pub duration: Option<Duration>,
    pub rate: u64,
    /// `--max-cpu`: pyperch's CPU budget, percent of one CPU (`None`: off).
    pub max_cpu: Option<f64>,
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
    /// asyncio task stacks (`--async`, see `crate::target::asyncio`).
    pub async_stacks: bool,
    /// Native and kernel frames (`--native`, `--kernel`).
    pub native: crate::target::native::NativeOptions,
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
    /// The session could not start or run.
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("cannot write the profile to {}: {source}", crate::text::field(.path))]
    Output { path: String, source: std::io::Error },
    #[error("could not write the profile: {0}")]
    Format(String),
    #[error("no Python process matched {} during the recording", crate::text::field(.0))]
    NothingMatched(String),
}

/// Runs a recording to the end and writes the profile.
pub fn record(options: RecordOptions) -> Result<RecordSummary, RecordError> {
    check_rate(options.rate)?;
    // A timeline needs each thread's records in time order: off-CPU records then go one by one.
    let time = crate::time_mode::TimeOptions { batch_off_cpu: !options.format.needs_timeline(), ..options.time };
    let mut builder = SessionBuilder::new("pyperch", options.rate, time);
    builder.pids = options.pids.clone();
    builder.subprocesses = options.subprocesses;
    builder.filter = options.filter.clone();
    builder.threads = options.threads;
    builder.native = options.native;
    builder.async_stacks = options.async_stacks;
    builder.refuse_unsupported_async = true;
    builder.per_task_events = true;
    builder.launch = (!options.command.is_empty()).then(|| launcher(options.command.clone(), options.rate));
    builder.output = options.output.clone();
    builder.line_numbers = options.line_numbers;
    builder.container_root = options.by_container;
    builder.timeline = options.format.needs_timeline();
    builder.max_cpu = options.max_cpu;
    builder.preflight()?;
    // Fail on an unwritable output before sampling starts, leaving an existing file alone.
    let output_error = |path: &std::path::Path, source| RecordError::Output { path: text::decode(path.as_os_str().as_bytes()), source };
    if let Some(path) = &options.output {
        let checked = if options.format == Format::Heatmap { output::heatmap::check(path) } else { output_file::check(path) };
        checked.map_err(|e| output_error(path, e))?;
    }
    let mut started_session = builder.start()?;

    let started = Instant::now();
    let start_time = SystemTime::now();
    let end = started_session.run(options.duration, true, None)?;
    let session = &mut started_session.session;
    let (child, exit_watch) = (&mut started_session.child, &started_session.exit_watch);
    let elapsed = started.elapsed();
    // Sampling stopped as the loop ended.
    let kernel_counters = session.kernel.counters();
    let min_off_cpu_ns = u64::try_from(options.time.min_off_cpu.as_nanos()).unwrap_or(u64::MAX);
    session.add_unsent_off_cpu(crate::kernel::loader::monotonic_ns(), min_off_cpu_ns);
    let totals = session.totals();
    session.profile.set_timing(Timing {
        start: start_time,
        duration: elapsed,
        rate_hz: options.rate,
        dropped: explain::dropped_samples(&totals),
        lost: kernel_counters.ringbuf_full,
        budget: session.cpu_budget.facts(),
    });

    if !options.filter.is_empty() && session.registered == 0 {
        return Err(RecordError::NothingMatched(options.filter.describe()));
    }
    let processes = session.sampled_processes();
    let plural = if processes == 1 { "" } else { "es" };
    let title = format!("pyperch: {} samples of {processes} Python process{plural} at {} Hz", totals.ok(), options.rate);
    let write_error = |e: output::OutputError| RecordError::Format(e.to_string());
    // Short file names for people; pprof and OTLP keep full paths (their readers shorten them),
    // and a heatmap reads the files by their paths.
    let short;
    let shown = if options.full_filenames || matches!(options.format, Format::Pprof | Format::Otlp | Format::Heatmap) {
        &session.profile
    } else {
        short = crate::output::filenames::with_short_names(&session.profile);
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
            // A heatmap is a directory of pages (written by its module through output::file).
            if options.format == Format::Heatmap {
                output::heatmap::write_dir(shown, &title, path, host_wide).map_err(|e| match e {
                    output::heatmap::HeatmapError::Output(e) => output_error(path, e),
                    e => write_error(e.into()),
                })?;
            } else {
                let fill = |file: &mut std::fs::File| output::write_profile(shown, options.format, &title, file);
                let written = if host_wide { output_file::write_private(path, fill) } else { output_file::write(path, fill) };
                written.map_err(|e| match e {
                    output_file::OutputFileError::Io(e) => output_error(path, e),
                    output_file::OutputFileError::Content(e) => write_error(e),
                })?;
            }
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
        eprint!("{}", crate::session::report::stats_report(session, &totals, kernel_counters));
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
fn write_stdout(profile: &crate::sample::aggregate::Profile, format: Format, title: &str) -> Result<(), output::OutputError> {
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

/// Starts `command` (see [`Launcher`]): as the user who ran sudo, if pyperch runs under sudo;
/// held before its exec until its per-task events (at `rate`) are open when asked, so that it
/// is sampled from its first instruction (discovery registers its interpreter as soon as it
/// is initialised).
fn launcher(command: Vec<OsString>, rate: u64) -> Launcher {
    Box::new(move |kernel, held| {
        let program = &command[0];
        let mut spawn = Command::new(program);
        spawn.args(&command[1..]);
        // Under sudo the command runs as the user who ran sudo, not as root.
        if let Some(user) = privileges::InvokingUser::from_sudo() {
            user.apply(&mut spawn);
        }
        let launch_error = |source| SessionError::Launch { command: program.to_string_lossy().into_owned(), source };
        if held {
            let attacher = kernel.task_attacher(rate)?;
            match launch::spawn_held(&mut spawn, |pid| attacher.open(pid)) {
                Ok((spawned, events)) => {
                    kernel.adopt_task_events(events);
                    Ok(spawned)
                }
                Err(launch::HeldSpawnError::Spawn(source)) => Err(launch_error(source)),
                Err(launch::HeldSpawnError::Before(e)) => Err(e.into()),
            }
        } else {
            spawn.spawn().map_err(launch_error)
        }
    })
}

/// `error_chain` re-exported for the binary.
pub fn describe(e: &dyn std::error::Error) -> String {
    error_chain(e)
}

