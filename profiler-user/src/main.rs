//! The `pyperch` binary: parses the command line and runs the command (`pyperch::cmd`).
//! Errors end here as one sentence on stderr.

use std::process::ExitCode;

use clap::Parser;
use pyperch::cmd::{Cli, run};

fn main() -> ExitCode {
    // A bug must still read as one sentence, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error in pyperch ({}); please report it", pyperch::text::lines(&info.to_string()));
    }));
    // RUST_LOG turns on pyperch's own diagnostics, the kernel programs' among them
    // (`kernel::loader` enables aya-log's records at that level).
    if std::env::var_os("RUST_LOG").is_some_and(|v| !v.is_empty()) {
        env_logger::Builder::from_env("RUST_LOG").format_timestamp_millis().init();
    }
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Target text inside errors is escaped by their Display; this catches the rest.
            eprintln!("error: {}", pyperch::text::lines(&pyperch::cmd::record::describe(e.as_ref())));
            ExitCode::from(1)
        }
    };
    if let Some((count, last)) = pyperch::host::seccomp::refused() {
        eprintln!("pyperch: warning: the seccomp filter refused {count} system call(s) with EPERM (the last: {last}); please report it");
    }
    code
}
