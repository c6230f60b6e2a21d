//! The `pyperch` command line. Errors end here as one sentence on stderr.

use std::{ffi::OsString, path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser, Subcommand};
use pyperch::{
    agent::{self, AgentOptions, Grouping, UploadOptions},
    aggregate::LineNumbers,
    filter::ProcessFilter,
    output::Format,
    record::{self, RecordOptions},
    time_mode::{TimeMode, TimeOptions},
};

/// A whole-host sampling profiler for CPython 3.8-3.15, built on eBPF.
///
/// pyperch samples every Python process on the machine (or the ones you choose) from the
/// kernel, with exact stacks and line numbers, without pausing or ptracing the targets.
/// It needs root (CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE) and a kernel with BTF (5.10+).
#[derive(Parser, Debug)]
#[command(name = "pyperch", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Sample Python stacks and write a profile.
    ///
    /// Examples:
    ///   pyperch record --duration 10 --output profile.svg      (every Python on the host)
    ///   pyperch record --pid 1234 --format speedscope -o p.json
    ///   pyperch record --threads -o app.svg -- python app.py   (launch and profile)
    #[command(verbatim_doc_comment)]
    Record(RecordArgs),
    /// List the Python processes pyperch sees: pid, executable, version, libpython linkage,
    /// threads, container and pod, and why any cannot be profiled.
    List,
    /// Profile the whole host without end, pushing one pprof per interval to a
    /// Pyroscope-compatible ingest endpoint (Pyroscope, Grafana).
    ///
    /// Example:
    ///   pyperch agent --upload-url http://pyroscope:4040 --interval 15s --app-name node-python
    #[command(verbatim_doc_comment)]
    Agent(AgentArgs),
    /// Print a shell completion script for bash, zsh, fish, elvish or powershell.
    ///
    /// Examples:
    ///   pyperch completions bash > /etc/bash_completion.d/pyperch
    ///   pyperch completions zsh > "${fpath[1]}/_pyperch"
    ///   pyperch completions fish > ~/.config/fish/completions/pyperch.fish
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Show every thread of one Python process now: its Python stack (root first, with
    /// lines), whether it holds the GIL, and whether it runs, sleeps or waits (and on what).
    ///
    /// The process is not stopped: each stack is read twice and shown only if both reads
    /// agree. Nothing in the target runs; it only needs root (CAP_SYS_PTRACE), not BPF.
    ///
    /// Examples:
    ///   pyperch dump --pid 1234                 (where is this hung process stuck?)
    ///   pyperch dump --pid 1234 --locals        (with each frame's local variables)
    ///   pyperch dump --pid 1234 --json | jq '.threads[] | select(.holds_gil)'
    #[command(verbatim_doc_comment)]
    Dump(DumpArgs),
    /// A live, full-screen view of what Python is running now: functions by their own and
    /// total share of samples over the last seconds and since the start, with file, line,
    /// process and thread. Whole-host without --pid.
    ///
    /// Keys: s sort order (own/total, window/since start), l functions/lines, p pause,
    /// f show one process after another (then all), q quit. Ctrl-C and SIGTERM quit too.
    ///
    /// Examples:
    ///   pyperch top                          (every Python process on the host)
    ///   pyperch top --pid 1234 --rate 199
    ///   pyperch top --once --window 5        (one plain table after 5 s, for scripts)
    #[command(verbatim_doc_comment)]
    Top(TopArgs),
}

#[derive(clap::Args, Debug)]
struct TopArgs {
    /// Only this process (repeatable); default: every Python process on the host.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Samples per second per CPU (1 to 100000; 1k, 1khz, 500hz accepted).
    #[arg(long, default_value = "99", value_parser = parse_rate, value_name = "HZ")]
    rate: u64,
    /// Seconds in the sliding window the OWN% and TOTAL% columns cover (1 to 3600).
    #[arg(long, default_value_t = 10, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=3600))]
    window: u32,
    /// No full screen: print a plain table every second (for logs and pipes).
    #[arg(long, conflicts_with = "once")]
    plain: bool,
    /// No full screen: print one plain table after --window seconds, then exit.
    #[arg(long)]
    once: bool,
    /// Rows in a plain table.
    #[arg(long, default_value_t = 20, value_name = "N")]
    rows: usize,
    /// asyncio (CPython 3.14+): show a thread running an event loop as its running task's
    /// logical stack (`task <name>` frames), as `record --async` does.
    #[arg(long = "async")]
    async_stacks: bool,
    #[command(flatten)]
    modes: ModeArgs,
    #[command(flatten)]
    filter: FilterArgs,
}

#[derive(clap::Args, Debug)]
struct DumpArgs {
    /// The process to dump.
    #[arg(long, value_name = "PID")]
    pid: u32,
    /// Print one JSON document (pid, python_version, gil_holder, threads[] with tid, name,
    /// activity, syscall, waiting_on, holds_gil, handling_exception, stack[] of
    /// function/file/line/locals).
    #[arg(long)]
    json: bool,
    /// Also show each frame's local variables: None, bool, int, float, str and bytes by value
    /// (cut short), containers as their type and length, other objects as their type.
    #[arg(long)]
    locals: bool,
    /// asyncio (CPython 3.14+): also list every task of the process: where each is
    /// suspended (or the thread running it) and which tasks await it.
    #[arg(long = "async")]
    async_tasks: bool,
}

/// Which time is profiled (`--mode`), and py-spy's names for the modes.
#[derive(clap::Args, Debug, Clone)]
struct ModeArgs {
    /// Which time to profile: cpu (samples of threads on a CPU), wall (every thread's whole
    /// time: on-CPU samples weighted by the period plus exact off-CPU intervals, in
    /// nanoseconds), off-cpu (only the time threads spend switched out, in nanoseconds) or
    /// gil (samples of the threads holding the GIL only) or exception (samples of threads
    /// handling an exception, inside an `except` block, only).
    #[arg(long, value_enum, default_value = "cpu", value_name = "MODE")]
    mode: TimeMode,
    /// Off-CPU intervals shorter than this are not walked; their time is summed per thread
    /// as `<off-cpu: short>` (e.g. 100us, 1ms, 0 to walk every interval).
    #[arg(long, value_parser = parse_min_off_cpu, value_name = "DURATION", default_value = "100us")]
    min_off_cpu: Duration,
    /// Include threads that are not on a CPU (py-spy's --idle): the same as --mode wall.
    #[arg(long)]
    idle: bool,
    /// Only samples of the thread holding the GIL (py-spy's --gil): the same as --mode gil.
    #[arg(long)]
    gil: bool,
}

impl ModeArgs {
    /// The time settings; refuses, before anything is sampled, what pyperch does not have yet
    /// and contradictions.
    fn time(&self) -> Result<TimeOptions, Box<dyn std::error::Error>> {
        let mode = match (self.idle, self.gil, self.mode) {
            (true, true, _) => return Err("--idle (--mode wall) and --gil (--mode gil) cannot be combined".into()),
            (false, false, mode) => mode,
            (true, false, TimeMode::Cpu | TimeMode::Wall) => TimeMode::Wall,
            (false, true, TimeMode::Cpu | TimeMode::Gil) => TimeMode::Gil,
            (true, false, other) => {
                return Err(format!("--idle is --mode wall; it cannot be combined with --mode {}", other.pprof_type()).into());
            }
            (false, true, other) => {
                return Err(format!("--gil is --mode gil; it cannot be combined with --mode {}", other.pprof_type()).into());
            }
        };
        Ok(TimeOptions { mode, min_off_cpu: self.min_off_cpu, batch_off_cpu: true })
    }
}

/// A duration with a unit (us, ms, s), or 0.
fn parse_min_off_cpu(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&text[..i], &text[i..]),
        None => return Err(format!("{text:?} needs a unit: us, ms or s (e.g. 100us)")),
    };
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 100us or 1ms"))?;
    let seconds = match unit {
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        _ => return Err(format!("{text:?} has an unknown unit (use us, ms or s)")),
    };
    if !(seconds >= 0.0 && seconds <= 60.0) {
        return Err(format!("{text:?} must be between 0 and 60 s"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// How frames show their line (py-spy's --function and --nolineno).
#[derive(clap::Args, Debug, Clone)]
struct LineArgs {
    /// One frame per function, shown at the function's first line (py-spy's --function):
    /// samples on different lines of a function merge.
    #[arg(short = 'F', long)]
    function: bool,
    /// One frame per function, shown without a line number (py-spy's --nolineno).
    #[arg(long)]
    nolineno: bool,
}

impl LineArgs {
    fn mode(&self) -> LineNumbers {
        if self.nolineno {
            LineNumbers::Hidden
        } else if self.function {
            LineNumbers::FunctionStart
        } else {
            LineNumbers::Current
        }
    }
}

/// Which processes to profile; all given filters must match.
#[derive(clap::Args, Debug, Clone)]
struct FilterArgs {
    /// Only processes in this container (full id or a prefix such as the 12-hex short id;
    /// repeatable).
    #[arg(long = "container", value_name = "ID")]
    containers: Vec<String>,
    /// Only processes in this Kubernetes pod (UID; repeatable).
    #[arg(long = "pod", value_name = "UID")]
    pods: Vec<String>,
    /// Only processes whose cgroup path starts with this (repeatable).
    #[arg(long = "cgroup", value_name = "PATH")]
    cgroups: Vec<String>,
    /// Only processes whose command name (/proc/PID/comm) matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    comm: Option<String>,
    /// Only processes whose command line (arguments joined by spaces) matches this regex.
    #[arg(long, value_name = "REGEX")]
    cmdline: Option<String>,
    /// Only processes in a Kubernetes pod of this namespace (from the runtime's annotations;
    /// repeatable).
    #[arg(long = "namespace", value_name = "NAME")]
    namespaces: Vec<String>,
    /// Only processes in a Kubernetes pod whose name matches this regular expression (from
    /// the runtime's annotations).
    #[arg(long = "pod-name", value_name = "REGEX")]
    pod_name: Option<String>,
}

impl FilterArgs {
    fn build(self) -> Result<ProcessFilter, Box<dyn std::error::Error>> {
        let regex = |flag: &str, r: Option<String>| -> Result<Option<regex::Regex>, Box<dyn std::error::Error>> {
            r.map(|r| regex::Regex::new(&r).map_err(|e| format!("{flag} {r:?} is not a valid regular expression: {e}").into()))
                .transpose()
        };
        Ok(ProcessFilter {
            containers: self.containers,
            pods: self.pods,
            cgroups: self.cgroups,
            comm: regex("--comm", self.comm)?,
            cmdline: regex("--cmdline", self.cmdline)?,
            namespaces: self.namespaces,
            pod_name: regex("--pod-name", self.pod_name)?,
        })
    }
}

#[derive(clap::Args, Debug)]
struct AgentArgs {
    /// Base URL of a Pyroscope backend (profiles go to URL/ingest, or
    /// URL/push.v1.PusherService/Push with --upload-api push): http:// or https://, no
    /// credentials.
    #[arg(long, value_name = "URL", required_unless_present = "otlp_endpoint")]
    upload_url: Option<String>,
    /// Base URL of an OpenTelemetry OTLP/HTTP endpoint (e.g. a Collector on port 4318): one
    /// OTLP profiles request per interval is posted to the profiles path under URL.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// The backend's API: Pyroscope's HTTP ingest, or its push API (Connect, protobuf).
    #[arg(long, value_enum, default_value = "ingest", value_name = "API")]
    upload_api: pyperch::upload::Api,
    /// A PEM bundle of CAs trusted for https://, added to the system's CA bundle.
    #[arg(long, value_name = "FILE")]
    upload_ca_file: Option<PathBuf>,
    /// Basic-auth user name; the password comes from --upload-password-file or the
    /// PYPERCH_UPLOAD_PASSWORD environment variable, never from the command line.
    #[arg(long, value_name = "NAME")]
    upload_user: Option<String>,
    /// File holding the basic-auth password (final newline trimmed; re-read at each upload).
    #[arg(long, value_name = "FILE")]
    upload_password_file: Option<PathBuf>,
    /// File holding a bearer token (final newline trimmed; re-read at each upload).
    #[arg(long, value_name = "FILE")]
    upload_token_file: Option<PathBuf>,
    /// Tenant of a multi-tenant backend, sent as the X-Scope-OrgID header.
    #[arg(long, value_name = "ID")]
    tenant_id: Option<String>,
    /// An extra header on every upload to --upload-url, 'Name: value' (repeatable). The value
    /// shows in the process list: for a secret use --upload-header-file.
    #[arg(long = "upload-header", value_name = "HEADER")]
    upload_headers: Vec<String>,
    /// An extra header on every upload to --upload-url whose value is the content of FILE
    /// (final newline trimmed; re-read at each upload), given as NAME=FILE (repeatable).
    #[arg(long = "upload-header-file", value_name = "NAME=FILE")]
    upload_header_files: Vec<String>,
    /// Basic-auth user name for --otlp-endpoint; the password comes from --otlp-password-file
    /// or the PYPERCH_OTLP_PASSWORD environment variable. (--upload-url's credentials are
    /// never sent to the OTLP endpoint, nor these to --upload-url.)
    #[arg(long, value_name = "NAME")]
    otlp_user: Option<String>,
    /// File holding --otlp-user's password (final newline trimmed; re-read at each upload).
    #[arg(long, value_name = "FILE")]
    otlp_password_file: Option<PathBuf>,
    /// File holding a bearer token for --otlp-endpoint (re-read at each upload).
    #[arg(long, value_name = "FILE")]
    otlp_token_file: Option<PathBuf>,
    /// Tenant sent to --otlp-endpoint as the X-Scope-OrgID header.
    #[arg(long, value_name = "ID")]
    otlp_tenant_id: Option<String>,
    /// An extra header on every upload to --otlp-endpoint, 'Name: value' (repeatable).
    #[arg(long = "otlp-header", value_name = "HEADER")]
    otlp_headers: Vec<String>,
    /// An extra header on every upload to --otlp-endpoint from a file, NAME=FILE (repeatable).
    #[arg(long = "otlp-header-file", value_name = "NAME=FILE")]
    otlp_header_files: Vec<String>,
    /// Allow credentials (user, token, extra headers) to an http:// URL, unencrypted: only
    /// for a trusted path, such as a sidecar on localhost.
    #[arg(long)]
    allow_insecure_http: bool,
    /// Length of one profile, e.g. 15s, 1m, 500ms.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    interval: Duration,
    /// Application name (service_name) the profiles are filed under [default: pyperch;
    /// for a process in a Kubernetes pod named by its runtime: <namespace>/<container>].
    #[arg(long, value_name = "NAME")]
    app_name: Option<String>,
    /// One profile per process or per container.
    #[arg(long, value_enum, default_value = "process")]
    per: Grouping,
    /// Samples per second per CPU (1 to 100000; 1k, 1khz, 500hz accepted).
    #[arg(short, long, default_value = "99", value_parser = parse_rate, value_name = "HZ")]
    rate: u64,
    /// Profile only this process (repeatable).
    #[arg(short, long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Label samples with their thread id.
    #[arg(short, long)]
    threads: bool,
    /// Profiles kept while the endpoint is unreachable; the oldest are dropped first (1 to 65536).
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = parse_queue_size)]
    queue_size: usize,
    /// Stop after this long (default: until SIGTERM or Ctrl-C, flushing the last interval).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    duration: Option<Duration>,
    #[command(flatten)]
    lines: LineArgs,
    #[command(flatten)]
    modes: ModeArgs,
    /// Print counts of every sample outcome and cache at exit.
    #[arg(long)]
    stats: bool,
    /// asyncio (CPython 3.14+): show a thread running an event loop as its running task's
    /// logical stack (`task <name>` frames), as `record --async` does; with --mode wall or
    /// off-cpu, suspended tasks' time too, where each waits. Older versions keep plain stacks.
    #[arg(long = "async")]
    async_stacks: bool,
    #[command(flatten)]
    native: NativeArgs,
}

/// Native and kernel frames.
#[derive(clap::Args, Debug)]
struct NativeArgs {
    /// Show native frames (executable, libpython, shared libraries) with the Python frames
    /// in place of the interpreter's evaluation-loop frames.
    #[arg(long)]
    native: bool,
    /// Show the kernel stack of each sample on top of its user stack (frames end in `_[k]`).
    /// Kernel frames are names only: no kernel address is written anywhere.
    #[arg(long)]
    kernel: bool,
    /// With --kernel: also write kernel frames' runtime addresses (pprof's `[kernel]` mapping
    /// and locations). Off by default: they reveal the kernel's randomized base (KASLR) to
    /// whoever reads the profile.
    #[arg(long, requires = "kernel")]
    kernel_addresses: bool,
    /// With --native: bytes of each sample's user stack copied by the kernel (512 to 16384;
    /// deeper native stacks end in `<truncated native>`).
    #[arg(long, default_value_t = pyperch::native::DEFAULT_STACK_BYTES, value_name = "BYTES")]
    native_stack_bytes: u32,
}

impl NativeArgs {
    fn options(&self) -> Result<pyperch::native::NativeOptions, String> {
        let stack_bytes = if self.native { pyperch::native::NativeOptions::check_stack_bytes(self.native_stack_bytes)? } else { 0 };
        Ok(pyperch::native::NativeOptions { stack_bytes, kernel: self.kernel, kernel_addresses: self.kernel && self.kernel_addresses })
    }
}

/// A sampling rate in Hz: "99", "500hz", "1k" or "1khz" (the forms CPython's
/// `profiling.sampling -r` takes; the unit is case-blind). The range is checked where the
/// rate is used.
fn parse_rate(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let unitless = lower.strip_suffix("hz").unwrap_or(&lower);
    let (number, scale) = match unitless.strip_suffix('k') {
        Some(n) => (n, 1000.0),
        None => (unitless, 1.0),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("{text:?} is not a rate like 99, 500hz or 1khz"))?;
    let hz = value * scale;
    if !(hz >= 1.0 && hz.is_finite() && hz.fract() == 0.0) || hz > u64::MAX as f64 {
        return Err(format!("{text:?} is not a whole number of samples per second (1 or more)"));
    }
    Ok(hz as u64)
}

/// `--queue-size`: 1 to 65536 profiles (the queue's byte budget bounds it too).
fn parse_queue_size(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n @ 1..=65536) => Ok(n),
        _ => Err(format!("{text:?} is not a number of profiles from 1 to 65536")),
    }
}

/// "15s", "1m", "250ms", "2h" or a plain number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&text[..i], &text[i..]),
        None => (text, "s"),
    };
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 15s, 1m or 500ms"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?} has an unknown unit (use ms, s, m or h)")),
    };
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!("{text:?} must be positive"));
    }
    if seconds > MAX_DURATION_SECS {
        return Err(format!("{text:?} is longer than the longest duration accepted, a year (8760h)"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The longest `--duration` or `--interval` accepted: a year. Longer ones would overflow
/// `Duration` and the clock's deadline arithmetic (1e20 s panicked inside the standard library).
const MAX_DURATION_SECS: f64 = 365.0 * 86400.0;

#[derive(clap::Args, Debug)]
struct RecordArgs {
    /// Profile only this process (repeatable). Default: every Python process on the host,
    /// including those that start while recording.
    #[arg(short, long = "pid", value_name = "PID", conflicts_with = "command")]
    pids: Vec<u32>,
    /// Stop after this many seconds (fractions allowed). Default: until Ctrl-C, or until the
    /// launched command exits, or (--pid without --subprocesses) until every given process
    /// has exited.
    #[arg(short, long, value_name = "SECS")]
    duration: Option<f64>,
    /// Samples per second per CPU (1 to 100000; also written as CPython's profiler takes it:
    /// 1k, 1khz, 500hz).
    #[arg(short, long, default_value = "99", value_parser = parse_rate, value_name = "HZ")]
    rate: u64,
    /// Output format (`raw` is py-spy's name for collapsed). Default: from the output file's
    /// extension (.svg flamegraph, .json speedscope, .txt/.folded collapsed, .pb.gz pprof,
    /// .trace.json chrometrace, .gecko.json gecko), else flamegraph (collapsed on standard
    /// output).
    #[arg(short, long, value_enum)]
    format: Option<Format>,
    /// Where to write the profile. Default: pyperch.svg for a flamegraph, pyperch.json for
    /// speedscope, standard output for collapsed stacks. Use - for standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Keep threads apart: each stack starts with its process, then `thread <tid>`.
    #[arg(short, long)]
    threads: bool,
    /// Start every stack with `container <short id>` (or `host`).
    #[arg(long)]
    by_container: bool,
    /// With --pid: also profile every descendant of the given processes, including those
    /// started while recording (a launched command is always followed into its children).
    #[arg(short, long)]
    subprocesses: bool,
    #[command(flatten)]
    lines: LineArgs,
    /// Show full file paths. Default: short names (the part after site-packages/,
    /// dist-packages/ or the standard library's directory, else relative to the process's
    /// working directory); pprof always keeps full paths.
    #[arg(long)]
    full_filenames: bool,
    #[command(flatten)]
    modes: ModeArgs,
    /// When the recording ends before the launched command (--duration, Ctrl-C, SIGTERM),
    /// leave the command running. Default: end it (SIGTERM, then SIGKILL 2 s later).
    #[arg(long)]
    keep_running: bool,
    /// Accepted for py-spy compatibility: pyperch never pauses the processes it samples.
    #[arg(long, hide = true)]
    nonblocking: bool,
    #[command(flatten)]
    filter: FilterArgs,
    /// Print counts of every sample outcome, caches and target reads, for the run and per
    /// process, on stderr at the end.
    #[arg(long)]
    stats: bool,
    /// asyncio (CPython 3.14+): show a thread running an event loop as the logical stack of
    /// its running task (`task <name>` frames from the root task down to it, then its
    /// coroutine frames) instead of the loop's machinery. Older versions keep plain stacks
    /// (a --pid of one is refused).
    #[arg(long = "async")]
    async_stacks: bool,
    #[command(flatten)]
    native: NativeArgs,
    /// Launch this command and profile it and its Python children until it exits; pyperch
    /// then exits with the command's status. If the recording ends first, the command is
    /// ended (see --keep-running) and pyperch exits with 0 once the profile is written.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    // A bug must still read as one sentence, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error in pyperch ({}); please report it", pyperch::text::lines(&info.to_string()));
    }));
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Target text inside errors is escaped by their Display; this catches the rest.
            eprintln!("error: {}", pyperch::text::lines(&record::describe(e.as_ref())));
            ExitCode::from(1)
        }
    };
    if let Some((count, last)) = pyperch::host::seccomp::refused() {
        eprintln!("pyperch: warning: the seccomp filter refused {count} system call(s) with EPERM (the last: {last}); please report it");
    }
    code
}

fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match cli.command {
        Commands::List => {
            if !pyperch::loader::has_capabilities() {
                eprintln!("pyperch: warning: without root, processes of other users cannot be inspected");
            }
            let rows = pyperch::list::python_processes();
            print!("{}", pyperch::list::render(&rows));
            if rows.is_empty() {
                eprintln!("pyperch: no Python process found");
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Top(args) => {
            use pyperch::top::{Display, TopOptions, top};
            let display = if args.once {
                Display::Once
            } else if args.plain {
                Display::Plain
            } else {
                Display::Screen
            };
            top(TopOptions {
                pids: args.pids,
                filter: args.filter.build()?,
                rate: args.rate,
                window: args.window,
                display,
                rows: args.rows,
                async_stacks: args.async_stacks,
                time: args.modes.time()?,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Dump(args) => {
            // Nothing to attach: the same drop (uid, capabilities, seccomp) before any read.
            pyperch::host::privileges::drop_after_attach(&pyperch::host::privileges::Keep::default())?;
            let dump = pyperch::dump::dump(args.pid, pyperch::dump::DumpOptions { locals: args.locals, async_tasks: args.async_tasks })?;
            use std::io::Write as _;
            // Streamed: the output is never held whole in memory.
            let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
            let written = if args.json {
                pyperch::dump::render::write_json(&dump, &mut stdout)
            } else {
                pyperch::dump::render::write_text(&dump, &mut stdout)
            };
            written.and_then(|()| stdout.flush()).map_err(|e| format!("cannot write the dump: {e}"))?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "pyperch", &mut script);
            use std::io::Write as _;
            std::io::stdout()
                .write_all(&script)
                .and_then(|()| std::io::stdout().flush())
                .map_err(|e| format!("cannot write the completion script: {e}"))?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Agent(args) => {
            let time = args.modes.time()?;
            agent::agent(AgentOptions {
                upload_url: args.upload_url,
                otlp_endpoint: args.otlp_endpoint,
                interval: args.interval,
                app_name: args.app_name.clone().unwrap_or_else(|| "pyperch".to_string()),
                rate: args.rate,
                threads: args.threads,
                stats: args.stats,
                pids: args.pids,
                filter: args.filter.build()?,
                group_by: args.per,
                queue_profiles: args.queue_size,
                queue_bytes: 128 << 20,
                duration: args.duration,
                line_numbers: args.lines.mode(),
                native: args.native.options()?,
                upload: UploadOptions {
                    api: args.upload_api,
                    ca_file: args.upload_ca_file,
                    credentials: agent::EndpointCredentials {
                        user: args.upload_user,
                        password_file: args.upload_password_file,
                        token_file: args.upload_token_file,
                        tenant_id: args.tenant_id,
                        headers: args.upload_headers,
                        header_files: args.upload_header_files,
                    },
                    otlp: agent::EndpointCredentials {
                        user: args.otlp_user,
                        password_file: args.otlp_password_file,
                        token_file: args.otlp_token_file,
                        tenant_id: args.otlp_tenant_id,
                        headers: args.otlp_headers,
                        header_files: args.otlp_header_files,
                    },
                    allow_insecure_http: args.allow_insecure_http,
                },
                app_name_given: args.app_name.is_some(),
                time,
                async_stacks: args.async_stacks,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Record(args) => {
            let time = args.modes.time()?;
            let (format, output) = resolve_output(args.format, args.output);
            let duration = match args.duration {
                Some(d) if !(d > 0.0 && d.is_finite()) => {
                    return Err(format!("--duration must be a positive number of seconds (got {d})").into());
                }
                Some(d) if d > MAX_DURATION_SECS => {
                    return Err(format!("--duration {d} is longer than the longest accepted, a year ({MAX_DURATION_SECS} s)").into());
                }
                Some(d) => Some(Duration::from_secs_f64(d)),
                None => None,
            };
            let summary = record::record(RecordOptions {
                pids: args.pids,
                duration,
                rate: args.rate,
                threads: args.threads,
                stats: args.stats,
                command: args.command,
                format,
                output,
                filter: args.filter.build()?,
                by_container: args.by_container,
                subprocesses: args.subprocesses,
                keep_running: args.keep_running,
                line_numbers: args.lines.mode(),
                full_filenames: args.full_filenames,
                time,
                async_stacks: args.async_stacks,
                native: args.native.options()?,
            })?;
            Ok(match summary.command_status {
                Some(code) => ExitCode::from(code.clamp(0, 255) as u8),
                None => ExitCode::SUCCESS,
            })
        }
    }
}

/// The format and destination, filling in what the user left out.
fn resolve_output(format: Option<Format>, output: Option<PathBuf>) -> (Format, Option<PathBuf>) {
    let to_stdout = output.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let output = if to_stdout { None } else { output };
    let format = format
        .or_else(|| output.as_deref().and_then(Format::from_path))
        .unwrap_or(if output.is_some() { Format::Flamegraph } else { Format::Collapsed });
    let output = match output {
        Some(p) => Some(p),
        None if to_stdout || format == Format::Collapsed => None,
        None => Some(PathBuf::from(format!("pyperch.{}", format.extension()))),
    };
    (format, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_as_cpython_writes_them() {
        assert_eq!(parse_rate("99"), Ok(99));
        assert_eq!(parse_rate("500hz"), Ok(500));
        assert_eq!(parse_rate("1k"), Ok(1000));
        assert_eq!(parse_rate("10kHz"), Ok(10_000));
        assert_eq!(parse_rate("1.5k"), Ok(1500));
        for bad in ["", "k", "0", "-5", "1.5", "fast", "1e400k", "1mhz"] {
            assert!(parse_rate(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn pid_and_command_are_one_or_the_other() {
        let e = Cli::try_parse_from(["pyperch", "record", "--pid", "1", "--", "python3", "x.py"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
