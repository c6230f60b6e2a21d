//! The command line's arguments: each command's flags and the groups they share (`--mode`,
//! `--lines`, the process filters, `--native`), with their parsers. One place defines what a
//! flag accepts and how it reads in `--help`; the commands in `cmd/` turn them into options.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::{
    cmd::agent::Grouping,
    sample::aggregate::LineNumbers,
    filter::ProcessFilter,
    output::Format,
    time_mode::{TimeMode, TimeOptions},
};

#[derive(clap::Args, Debug)]
pub(crate) struct TopArgs {
    /// Only this process (repeatable); default: every Python process on the host.
    #[arg(long = "pid", value_name = "PID")]
    pub(crate) pids: Vec<u32>,
    /// Samples per second per CPU (1 to 100000; 1k, 1khz, 500hz accepted).
    #[arg(long, default_value = "99", value_parser = parse_rate, value_name = "HZ")]
    pub(crate) rate: u64,
    /// Hold pyperch's own CPU under PERCENT of one CPU (see `record --help`). Default: off.
    #[arg(long, value_name = "PERCENT", value_parser = parse_max_cpu, default_value = "off")]
    pub(crate) max_cpu: MaxCpu,
    /// Seconds in the sliding window the OWN% and TOTAL% columns cover (1 to 3600).
    #[arg(long, default_value_t = 10, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub(crate) window: u32,
    /// No full screen: print a plain table every second (for logs and pipes).
    #[arg(long, conflicts_with = "once")]
    pub(crate) plain: bool,
    /// No full screen: print one plain table after --window seconds, then exit.
    #[arg(long)]
    pub(crate) once: bool,
    /// Rows in a plain table.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub(crate) rows: usize,
    /// asyncio (CPython 3.14+): show a thread running an event loop as its running task's
    /// logical stack (`task <name>` frames), as `record --async` does.
    #[arg(long = "async")]
    pub(crate) async_stacks: bool,
    #[command(flatten)]
    pub(crate) modes: ModeArgs,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
}

#[derive(clap::Args, Debug)]
pub(crate) struct DumpArgs {
    /// The process to dump.
    #[arg(long, value_name = "PID")]
    pub(crate) pid: u32,
    /// Print one JSON document (pid, python_version, gil_holder, threads[] with tid, name,
    /// activity, syscall, waiting_on, holds_gil, handling_exception, stack[] of
    /// function/file/line/locals).
    #[arg(long)]
    pub(crate) json: bool,
    /// Also show each frame's local variables: None, bool, int, float, str and bytes by value
    /// (cut short), containers as their type and length, other objects as their type.
    #[arg(long)]
    pub(crate) locals: bool,
    /// asyncio (CPython 3.14+): also list every task of the process: where each is
    /// suspended (or the thread running it) and which tasks await it.
    #[arg(long = "async")]
    pub(crate) async_tasks: bool,
}

/// Which time is profiled (`--mode`), and py-spy's names for the modes.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ModeArgs {
    /// Which time to profile: cpu (samples of threads on a CPU), wall (every thread's whole
    /// time: on-CPU samples weighted by the period plus exact off-CPU intervals, in
    /// nanoseconds), off-cpu (only the time threads spend switched out, in nanoseconds) or
    /// gil (samples of the threads holding the GIL only) or exception (samples of threads
    /// handling an exception, inside an `except` block, only).
    #[arg(long, value_enum, default_value = "cpu", value_name = "MODE")]
    pub(crate) mode: TimeMode,
    /// Off-CPU intervals shorter than this are not walked; their time is summed per thread
    /// as `<off-cpu: short>` (e.g. 100us, 1ms, 0 to walk every interval).
    #[arg(long, value_parser = parse_min_off_cpu, value_name = "DURATION", default_value = "100us")]
    pub(crate) min_off_cpu: Duration,
    /// Include threads that are not on a CPU (py-spy's --idle): the same as --mode wall.
    #[arg(long)]
    pub(crate) idle: bool,
    /// Only samples of the thread holding the GIL (py-spy's --gil): the same as --mode gil.
    #[arg(long)]
    pub(crate) gil: bool,
}

impl ModeArgs {
    /// The time settings; refuses, before anything is sampled, what pyperch does not have yet
    /// and contradictions.
    pub(crate) fn time(&self) -> Result<TimeOptions, Box<dyn std::error::Error>> {
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
/// The agent's default `--max-cpu`: 2 % of one CPU (see its `--help`).
pub(crate) const AGENT_MAX_CPU: &str = "2";

/// `--max-cpu`: a percentage of one CPU, or none (`off`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MaxCpu(pub(crate) Option<f64>);

pub(crate) fn parse_max_cpu(text: &str) -> Result<MaxCpu, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(MaxCpu(None));
    }
    crate::session::cpu_budget::parse_max_cpu(text).map(|p| MaxCpu(Some(p)))
}

pub(crate) fn parse_min_off_cpu(text: &str) -> Result<Duration, String> {
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
pub(crate) struct LineArgs {
    /// One frame per function, shown at the function's first line (py-spy's --function):
    /// samples on different lines of a function merge.
    #[arg(short = 'F', long)]
    pub(crate) function: bool,
    /// One frame per function, shown without a line number (py-spy's --nolineno).
    #[arg(long)]
    pub(crate) nolineno: bool,
}

impl LineArgs {
    pub(crate) fn mode(&self) -> LineNumbers {
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
pub(crate) struct FilterArgs {
    /// Only processes in this container (full id or a prefix such as the 12-hex short id;
    /// repeatable).
    #[arg(long = "container", value_name = "ID")]
    pub(crate) containers: Vec<String>,
    /// Only processes in this Kubernetes pod (UID; repeatable).
    #[arg(long = "pod", value_name = "UID")]
    pub(crate) pods: Vec<String>,
    /// Only processes whose cgroup path starts with this (repeatable).
    #[arg(long = "cgroup", value_name = "PATH")]
    pub(crate) cgroups: Vec<String>,
    /// Only processes whose command name (/proc/PID/comm) matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub(crate) comm: Option<String>,
    /// Only processes whose command line (arguments joined by spaces) matches this regex.
    #[arg(long, value_name = "REGEX")]
    pub(crate) cmdline: Option<String>,
    /// Only processes in a Kubernetes pod of this namespace (from the runtime's annotations;
    /// repeatable).
    #[arg(long = "namespace", value_name = "NAME")]
    pub(crate) namespaces: Vec<String>,
    /// Only processes in a Kubernetes pod whose name matches this regular expression (from
    /// the runtime's annotations).
    #[arg(long = "pod-name", value_name = "REGEX")]
    pub(crate) pod_name: Option<String>,
}

impl FilterArgs {
    pub(crate) fn build(self) -> Result<ProcessFilter, Box<dyn std::error::Error>> {
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
pub(crate) struct AgentArgs {
    /// Base URL of a Pyroscope backend (profiles go to URL/ingest, or
    /// URL/push.v1.PusherService/Push with --upload-api push): http:// or https://, no
    /// credentials.
    #[arg(long, value_name = "URL", required_unless_present = "otlp_endpoint")]
    pub(crate) upload_url: Option<String>,
    /// Base URL of an OpenTelemetry OTLP/HTTP endpoint (e.g. a Collector on port 4318): one
    /// OTLP profiles request per interval is posted to the profiles path under URL.
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// The backend's API: Pyroscope's HTTP ingest, or its push API (Connect, protobuf).
    #[arg(long, value_enum, default_value = "ingest", value_name = "API")]
    pub(crate) upload_api: crate::export::upload::Api,
    /// A PEM bundle of CAs trusted for https://, added to the system's CA bundle. A
    /// self-signed server certificate may be given here too: it is trusted as itself (its
    /// host name and dates still checked), as curl trusts it.
    #[arg(long, value_name = "FILE")]
    pub(crate) upload_ca_file: Option<PathBuf>,
    /// Accept only a server whose public key has this SHA-256, written as curl's
    /// --pinnedpubkey takes it (sha256//BASE64); repeat for a key rollover. Checked after the
    /// certificate itself.
    #[arg(long = "upload-pin", value_name = "sha256//BASE64")]
    pub(crate) upload_pins: Vec<String>,
    /// Basic-auth user name; the password comes from --upload-password-file or the
    /// PYPERCH_UPLOAD_PASSWORD environment variable, never from the command line.
    #[arg(long, value_name = "NAME")]
    pub(crate) upload_user: Option<String>,
    /// File holding the basic-auth password (final newline trimmed; re-read at each upload).
    #[arg(long, value_name = "FILE")]
    pub(crate) upload_password_file: Option<PathBuf>,
    /// File holding a bearer token (final newline trimmed; re-read at each upload).
    #[arg(long, value_name = "FILE")]
    pub(crate) upload_token_file: Option<PathBuf>,
    /// Tenant of a multi-tenant backend, sent as the X-Scope-OrgID header.
    #[arg(long, value_name = "ID")]
    pub(crate) tenant_id: Option<String>,
    /// An extra header on every upload to --upload-url, 'Name: value' (repeatable). The value
    /// shows in the process list: for a secret use --upload-header-file.
    #[arg(long = "upload-header", value_name = "HEADER")]
    pub(crate) upload_headers: Vec<String>,
    /// An extra header on every upload to --upload-url whose value is the content of FILE
    /// (final newline trimmed; re-read at each upload), given as NAME=FILE (repeatable).
    #[arg(long = "upload-header-file", value_name = "NAME=FILE")]
    pub(crate) upload_header_files: Vec<String>,
    /// Basic-auth user name for --otlp-endpoint; the password comes from --otlp-password-file
    /// or the PYPERCH_OTLP_PASSWORD environment variable. (--upload-url's credentials are
    /// never sent to the OTLP endpoint, nor these to --upload-url.)
    #[arg(long, value_name = "NAME")]
    pub(crate) otlp_user: Option<String>,
    /// File holding --otlp-user's password (final newline trimmed; re-read at each upload).
    #[arg(long, value_name = "FILE")]
    pub(crate) otlp_password_file: Option<PathBuf>,
    /// File holding a bearer token for --otlp-endpoint (re-read at each upload).
    #[arg(long, value_name = "FILE")]
    pub(crate) otlp_token_file: Option<PathBuf>,
    /// Tenant sent to --otlp-endpoint as the X-Scope-OrgID header.
    #[arg(long, value_name = "ID")]
    pub(crate) otlp_tenant_id: Option<String>,
    /// An extra header on every upload to --otlp-endpoint, 'Name: value' (repeatable).
    #[arg(long = "otlp-header", value_name = "HEADER")]
    pub(crate) otlp_headers: Vec<String>,
    /// An extra header on every upload to --otlp-endpoint from a file, NAME=FILE (repeatable).
    #[arg(long = "otlp-header-file", value_name = "NAME=FILE")]
    pub(crate) otlp_header_files: Vec<String>,
    /// Allow credentials (user, token, extra headers) to an http:// URL, unencrypted: only
    /// for a trusted path, such as a sidecar on localhost.
    #[arg(long)]
    pub(crate) allow_insecure_http: bool,
    /// Length of one profile, e.g. 15s, 1m, 500ms.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) interval: Duration,
    /// Application name (service_name) the profiles are filed under [default: pyperch;
    /// for a process in a Kubernetes pod named by its runtime: <namespace>/<container>].
    #[arg(long, value_name = "NAME")]
    pub(crate) app_name: Option<String>,
    /// One profile per process or per container.
    #[arg(long, value_enum, default_value = "process")]
    pub(crate) per: Grouping,
    /// Samples per second per CPU (1 to 100000; 1k, 1khz, 500hz accepted).
    #[arg(short, long, default_value = "99", value_parser = parse_rate, value_name = "HZ")]
    pub(crate) rate: u64,
    /// Hold the agent's own CPU (its threads plus its kernel programs, measured every second)
    /// under PERCENT of one CPU by sampling only a share of the perf events, each kept sample
    /// counting for the skipped ones (profiles keep their values, only noisier; never below
    /// 1 Hz), and back to the full rate when the load falls; `off` to turn it off. Default: 2,
    /// twice what a fixed 20 Hz sampler (the OpenTelemetry profiler) costs: room for 99 Hz on
    /// a few busy CPUs, a bound on a node with hundreds of busy threads.
    #[arg(long, value_name = "PERCENT", value_parser = parse_max_cpu, default_value = AGENT_MAX_CPU)]
    pub(crate) max_cpu: MaxCpu,
    /// Profile only this process (repeatable).
    #[arg(short, long = "pid", value_name = "PID")]
    pub(crate) pids: Vec<u32>,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Label samples with their thread id.
    #[arg(short, long)]
    pub(crate) threads: bool,
    /// Profiles kept while the endpoint is unreachable; the oldest are dropped first (1 to 65536).
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = parse_queue_size)]
    pub(crate) queue_size: usize,
    /// Stop after this long (default: until SIGTERM or Ctrl-C, flushing the last interval).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) duration: Option<Duration>,
    #[command(flatten)]
    pub(crate) lines: LineArgs,
    #[command(flatten)]
    pub(crate) modes: ModeArgs,
    /// Print counts of every sample outcome and cache at exit.
    #[arg(long)]
    pub(crate) stats: bool,
    /// asyncio (CPython 3.14+): show a thread running an event loop as its running task's
    /// logical stack (`task <name>` frames), as `record --async` does; with --mode wall or
    /// off-cpu, suspended tasks' time too, where each waits. Older versions keep plain stacks.
    #[arg(long = "async")]
    pub(crate) async_stacks: bool,
    #[command(flatten)]
    pub(crate) native: NativeArgs,
}

/// Native and kernel frames.
#[derive(clap::Args, Debug)]
pub(crate) struct NativeArgs {
    /// Show native frames (executable, libpython, shared libraries) with the Python frames
    /// in place of the interpreter's evaluation-loop frames.
    #[arg(long)]
    pub(crate) native: bool,
    /// Show the kernel stack of each sample on top of its user stack (frames end in `_[k]`).
    /// Kernel frames are names only: no kernel address is written anywhere.
    #[arg(long)]
    pub(crate) kernel: bool,
    /// With --kernel: also write kernel frames' runtime addresses (pprof's `[kernel]` mapping
    /// and locations). Off by default: they reveal the kernel's randomized base (KASLR) to
    /// whoever reads the profile.
    #[arg(long, requires = "kernel")]
    pub(crate) kernel_addresses: bool,
    /// With --native: how the native frames are found. `kernel` (the default) walks each
    /// sample's stack in the kernel with the unwind tables pyperch builds from every mapped
    /// file's .eh_frame: no depth limit from frame sizes. `copy` copies the top of the stack
    /// (--native-stack-bytes) for pyperch to unwind later (deeper stacks end in
    /// `<truncated native>`).
    #[arg(long, value_enum, default_value_t = crate::target::native::NativeWalk::Kernel, value_name = "HOW")]
    pub(crate) native_walk: crate::target::native::NativeWalk,
    /// With --native-walk copy: bytes of each sample's user stack copied by the kernel (512 to
    /// 16384; deeper native stacks end in `<truncated native>`).
    #[arg(long, default_value_t = crate::target::native::DEFAULT_STACK_BYTES, value_name = "BYTES")]
    pub(crate) native_stack_bytes: u32,
}

impl NativeArgs {
    pub(crate) fn options(&self) -> Result<crate::target::native::NativeOptions, String> {
        let stack_bytes = if self.native { crate::target::native::NativeOptions::check_stack_bytes(self.native_stack_bytes)? } else { 0 };
        Ok(crate::target::native::NativeOptions {
            stack_bytes,
            walk: self.native_walk,
            kernel: self.kernel,
            kernel_addresses: self.kernel && self.kernel_addresses,
        })
    }
}

/// A sampling rate in Hz: "99", "500hz", "1k" or "1khz" (the forms CPython's
/// `profiling.sampling -r` takes; the unit is case-blind). The range is checked where the
/// rate is used.
pub(crate) fn parse_rate(text: &str) -> Result<u64, String> {
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
pub(crate) fn parse_queue_size(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n @ 1..=65536) => Ok(n),
        _ => Err(format!("{text:?} is not a number of profiles from 1 to 65536")),
    }
}

/// "15s", "1m", "250ms", "2h" or a plain number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
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
pub(crate) const MAX_DURATION_SECS: f64 = 365.0 * 86400.0;

#[derive(clap::Args, Debug)]
pub(crate) struct RecordArgs {
    /// Profile only this process (repeatable). Default: every Python process on the host,
    /// including those that start while recording.
    #[arg(short, long = "pid", value_name = "PID", conflicts_with = "command")]
    pub(crate) pids: Vec<u32>,
    /// Stop after this many seconds (fractions allowed). Default: until Ctrl-C, or until the
    /// launched command exits, or (--pid without --subprocesses) until every given process
    /// has exited.
    #[arg(short, long, value_name = "SECS")]
    pub(crate) duration: Option<f64>,
    /// Samples per second per CPU (1 to 100000; also written as CPython's profiler takes it:
    /// 1k, 1khz, 500hz).
    #[arg(short, long, default_value = "99", value_parser = parse_rate, value_name = "HZ")]
    pub(crate) rate: u64,
    /// Hold pyperch's own CPU under PERCENT of one CPU (2 = 20 ms of CPU per second; above
    /// 100 for several CPUs). Every second pyperch measures its threads' CPU plus its kernel
    /// programs' run time and, over the budget, has the kernel keep only a share of the
    /// samples, at random; each kept sample counts for the skipped ones, so the profile's
    /// values stay those of --rate, only noisier. The share returns to all once the load
    /// falls; the effective rate never drops below 1 Hz. --stats shows the measured CPU and
    /// the effective rate (min, mean, last); pprof comments and OTLP attributes carry it.
    /// `off` (the default) samples at --rate whatever it costs.
    #[arg(long, value_name = "PERCENT", value_parser = parse_max_cpu, default_value = "off")]
    pub(crate) max_cpu: MaxCpu,
    /// Output format (`raw` is py-spy's name for collapsed). Default: from the output file's
    /// extension (.svg flamegraph, .json speedscope, .txt/.folded collapsed, .pb.gz pprof,
    /// .trace.json chrometrace, .gecko.json gecko), else flamegraph (collapsed on standard
    /// output). heatmap writes a directory (never inferred from the name): index.html and
    /// one HTML page per source file, each line with its self and total samples.
    #[arg(short, long, value_enum)]
    pub(crate) format: Option<Format>,
    /// Where to write the profile. Default: pyperch.svg for a flamegraph, pyperch.json for
    /// speedscope, standard output for collapsed stacks, the directory pyperch-heatmap for a
    /// heatmap (with --format heatmap, FILE names a directory, new or existing). Use - for
    /// standard output.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Keep threads apart: each stack starts with its process, then `thread <tid>`.
    #[arg(short, long)]
    pub(crate) threads: bool,
    /// Start every stack with `container <short id>` (or `host`).
    #[arg(long)]
    pub(crate) by_container: bool,
    /// With --pid: also profile every descendant of the given processes, including those
    /// started while recording (a launched command is always followed into its children).
    #[arg(short, long)]
    pub(crate) subprocesses: bool,
    #[command(flatten)]
    pub(crate) lines: LineArgs,
    /// Show full file paths. Default: short names (the part after site-packages/,
    /// dist-packages/ or the standard library's directory, else relative to the process's
    /// working directory); pprof always keeps full paths.
    #[arg(long)]
    pub(crate) full_filenames: bool,
    #[command(flatten)]
    pub(crate) modes: ModeArgs,
    /// When the recording ends before the launched command (--duration, Ctrl-C, SIGTERM),
    /// leave the command running. Default: end it (SIGTERM, then SIGKILL 2 s later).
    #[arg(long)]
    pub(crate) keep_running: bool,
    /// Accepted for py-spy compatibility: pyperch never pauses the processes it samples.
    #[arg(long, hide = true)]
    pub(crate) nonblocking: bool,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Print counts of every sample outcome, caches and target reads, for the run and per
    /// process, on stderr at the end.
    #[arg(long)]
    pub(crate) stats: bool,
    /// asyncio (CPython 3.14+): show a thread running an event loop as the logical stack of
    /// its running task (`task <name>` frames from the root task down to it, then its
    /// coroutine frames) instead of the loop's machinery. Older versions keep plain stacks
    /// (a --pid of one is refused).
    #[arg(long = "async")]
    pub(crate) async_stacks: bool,
    #[command(flatten)]
    pub(crate) native: NativeArgs,
    /// Launch this command and profile it and its Python children until it exits; pyperch
    /// then exits with the command's status. If the recording ends first, the command is
    /// ended (see --keep-running) and pyperch exits with 0 once the profile is written.
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
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
}
