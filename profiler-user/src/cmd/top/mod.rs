//! `pyperch top`: a live view over the same sampling session `record` uses.
//!
//! Every tick (`TICK`), the session's samples since the previous tick are taken out of it
//! (`Session::take_interval`), counted into the `model` (a sliding window and the totals since
//! the start), and shown: full-screen (`screen`, ratatui) or as a plain table (`plain`).
//! Sampling, discovery and every safety rule are the session's; this module only reads.

pub mod model;
mod plain;
mod screen;

use std::io::IsTerminal;
use std::time::Duration;

use crate::{
    filter::ProcessFilter,
    session::{
        LoopEnd, Session, SessionError,
        builder::{SessionBuilder, check_rate},
    },
};
use model::{FrameRef, Model, Tick};

/// How often the view is refreshed (and a tick enters the window).
pub const TICK: Duration = Duration::from_secs(1);
/// The smallest screen the full-screen view draws in.
pub const MIN_COLUMNS: u16 = 60;
pub const MIN_ROWS: u16 = 10;

/// How `top` shows what it samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Display {
    /// Full-screen, interactive (needs a terminal).
    Screen,
    /// A plain table every tick.
    Plain,
    /// One plain table after `window` seconds, then exit.
    Once,
}

/// Options of `pyperch top`.
#[derive(Clone, Debug)]
pub struct TopOptions {
    /// Only these processes; empty = every Python process on the host.
    pub pids: Vec<u32>,
    pub filter: ProcessFilter,
    pub rate: u64,
    /// `--max-cpu`: pyperch's CPU budget, percent of one CPU (`None`: off).
    pub max_cpu: Option<f64>,
    /// Seconds in the sliding window.
    pub window: u32,
    pub display: Display,
    /// Rows shown in the plain tables.
    pub rows: usize,
    /// asyncio task stacks (`--async`, CPython 3.14+), as for `record`.
    pub async_stacks: bool,
    /// Which time is shown (`--mode`), as for `record`.
    pub time: crate::time_mode::TimeOptions,
}

/// Why `top` cannot show its screen.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(
        "pyperch top draws a full-screen view, but stdout is not a terminal: use --plain for a table every second, or --once for one table"
    )]
    NotATerminal,
    #[error("the terminal is {columns}x{rows}; pyperch top needs at least {MIN_COLUMNS}x{MIN_ROWS} (or use --plain)")]
    TooSmall { columns: u16, rows: u16 },
    #[error("cannot use the terminal: {0}")]
    Terminal(std::io::Error),
}

/// Runs `top` until `q`, Ctrl-C or SIGTERM (or after one table with `--once`).
pub fn top(options: TopOptions) -> Result<(), TopError> {
    check_rate(options.rate)?;
    if options.display == Display::Screen {
        if !std::io::stdout().is_terminal() {
            return Err(TopError::NotATerminal);
        }
        let (columns, rows) = ratatui::crossterm::terminal::size().map_err(TopError::Terminal)?;
        if columns < MIN_COLUMNS || rows < MIN_ROWS {
            return Err(TopError::TooSmall { columns, rows });
        }
    }
    let mut builder = SessionBuilder::new("pyperch", options.rate, options.time);
    builder.pids = options.pids.clone();
    builder.filter = options.filter.clone();
    // Per thread, for the thread column. The shares are of the session's values: samples, or
    // nanoseconds in the wall and off-CPU modes.
    builder.threads = true;
    builder.async_stacks = options.async_stacks;
    builder.refuse_unsupported_async = true;
    builder.max_cpu = options.max_cpu;
    builder.preflight()?;
    let mut started = builder.start()?;

    let mut model = Model::new(options.window.max(1) as usize);
    let header = Header {
        rate: options.rate,
        window: options.window.max(1),
        mode: options.time.mode.label(),
        unit: if options.time.mode.in_nanoseconds() { "ns" } else { "samples" },
    };
    let mut failure: Option<std::io::Error> = None;
    let end = match options.display {
        Display::Screen => {
            let mut view = screen::Screen::open().map_err(TopError::Terminal)?;
            let mut last_tick = std::time::Instant::now();
            let mut hook = |session: &mut Session| {
                // Keys are read every `screen::POLL`; samples enter the window every `TICK`.
                let tick = last_tick.elapsed() >= TICK;
                if tick {
                    last_tick = std::time::Instant::now();
                    collect(session, &mut model);
                }
                match view.frame(&model, &header, tick) {
                    Ok(true) => {}
                    Ok(false) => quit(),
                    Err(e) => {
                        failure.get_or_insert(e);
                        quit();
                    }
                }
            };
            let end = started.run(None, false, Some((screen::POLL, &mut hook)));
            // Restores the terminal on every way out (also SIGTERM).
            drop(view);
            end?
        }
        Display::Plain | Display::Once => {
            let once = options.display == Display::Once;
            let mut ticks = 0u32;
            let mut hook = |session: &mut Session| {
                collect(session, &mut model);
                ticks += 1;
                if once && ticks < header.window {
                    return;
                }
                print!("{}", plain::table(&model, &header, options.rows));
                if once {
                    quit();
                }
            };
            started.run(None, false, Some((TICK, &mut hook)))?
        }
    };
    if let Some(e) = failure {
        return Err(TopError::Terminal(e));
    }
    let _ = end == LoopEnd::Terminated;
    Ok(())
}

/// What the header shows besides the model.
pub struct Header {
    pub rate: u64,
    pub window: u32,
    /// What the samples measure: the `--mode` (`cpu`, `wall`, ...).
    pub mode: &'static str,
    /// What the counts are: `samples`, or `ns` in the modes that weigh time.
    pub unit: &'static str,
}

/// Ends the session's loop the way SIGTERM does: the loop has one way to stop on request,
/// its signal arm, and `q` takes it too.
fn quit() {
    // SAFETY: raise(2) with a valid signal number.
    unsafe { libc::raise(libc::SIGTERM) };
}

/// Moves the samples counted since the last tick out of the session into the model.
fn collect(session: &mut Session, model: &mut Model) {
    // Waits still going on count in the tick they fall in, not all in the tick they end.
    session.charge_pending_off_cpu(crate::kernel::loader::monotonic_ns());
    let part = session.take_interval();
    let mut tick = Tick::default();
    let mut frames = Vec::new();
    for (key, count) in part.stacks() {
        frames.clear();
        frames.extend(key.frames.iter().map(|id| {
            let f = part.frame(*id);
            FrameRef { function: &f.function, file: &f.file, line: f.line }
        }));
        tick.add(key.pid, key.tid, &frames, count);
        if let Some(name) = key.tid.and_then(|tid| crate::output::thread_name_text(&part, tid)) {
            if let Some(tid) = key.tid {
                model.set_thread_name(tid, name);
            }
        }
        if let Some(label) = part.process(key.pid) {
            model.processes.entry(key.pid).or_insert_with(|| label.comm.clone());
        }
    }
    for pid in part.pids() {
        if let Some(label) = part.process(pid) {
            model.processes.entry(pid).or_insert_with(|| label.comm.clone());
        }
    }
    model.push(tick);
}
