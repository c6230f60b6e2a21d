//! The commands, at the edge: the command line (`Cli`), and one file per command that turns
//! its arguments into options for the layers below (the session, `dump`'s stack reading,
//! discovery). Nothing below `cmd/` imports from it.

pub mod agent;
mod args;
pub mod dump;
pub mod explain;
pub mod launch;
pub mod list;
pub mod record;
pub mod top;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser, Subcommand};

use crate::output::Format;
use agent::{AgentOptions, UploadOptions};
use record::RecordOptions;
use args::{AgentArgs, DumpArgs, MAX_DURATION_SECS, RecordArgs, TopArgs};

/// A whole-host sampling profiler for CPython 3.8-3.15, built on eBPF.
///
/// pyperch samples every Python process on the machine (or the ones you choose) from the
/// kernel, with exact stacks and line numbers, without pausing or ptracing the targets.
/// It needs root (CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE) and a kernel with BTF (5.10+).
#[derive(Parser, Debug)]
#[command(name = "pyperch", version, propagate_version = true)]
pub struct Cli {
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


/// Runs the command; an error is one sentence for stderr.
pub fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match cli.command {
        Commands::List => {
            if !crate::kernel::loader::has_capabilities() {
                eprintln!("pyperch: warning: without root, processes of other users cannot be inspected");
            }
            let rows = crate::cmd::list::python_processes();
            print!("{}", crate::cmd::list::render(&rows));
            if rows.is_empty() {
                eprintln!("pyperch: no Python process found");
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Top(args) => {
            use crate::cmd::top::{Display, TopOptions, top};
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
                max_cpu: args.max_cpu.0,
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
            crate::host::privileges::drop_after_attach(&crate::host::privileges::Keep::default())?;
            let dump = crate::cmd::dump::dump(args.pid, crate::cmd::dump::DumpOptions { locals: args.locals, async_tasks: args.async_tasks })?;
            use std::io::Write as _;
            // Streamed: the output is never held whole in memory.
            let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
            let written = if args.json {
                crate::cmd::dump::render::write_json(&dump, &mut stdout)
            } else {
                crate::cmd::dump::render::write_text(&dump, &mut stdout)
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
                max_cpu: args.max_cpu.0,
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
                    pins: args.upload_pins,
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
            if format == Format::Heatmap && output.is_none() {
                return Err("--format heatmap writes a directory of HTML pages, not standard output; name one with -o DIR".into());
            }
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
                max_cpu: args.max_cpu.0,
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
        None if format == Format::Heatmap => Some(PathBuf::from("pyperch-heatmap")),
        None => Some(PathBuf::from(format!("pyperch.{}", format.extension()))),
    };
    (format, output)
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_and_command_are_one_or_the_other() {
        let e = Cli::try_parse_from(["pyperch", "record", "--pid", "1", "--", "python3", "x.py"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
