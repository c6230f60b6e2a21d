//! The full-screen view of `pyperch top` (ratatui on crossterm): a header with the processes
//! and the sample rate, a table of functions or lines, and a line of keys.
//!
//! Invariant: while a `Screen` exists the terminal is in raw mode on the alternate screen;
//! dropping it (on `q`, SIGTERM, Ctrl-C, an error or a panic unwinding) restores the terminal.

use std::io::{self, Stdout};
use std::time::Duration;

use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        cursor,
        event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
        execute,
        terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
    },
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Cell, Paragraph, Row, Table},
};

use super::model::{Granularity, Model, SortBy};
use super::{Header, MIN_COLUMNS, MIN_ROWS};
use crate::text::field;

/// How often keys are read.
pub const POLL: Duration = Duration::from_millis(100);

/// The terminal and what the user chose.
pub struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    sort: SortBy,
    granularity: Granularity,
    paused: bool,
    /// `None`: every process; else the pid shown.
    process: Option<u32>,
    /// Rows as last drawn (kept while paused).
    drawn: Vec<super::model::Row>,
    drawn_samples: (u64, u64),
}

impl Screen {
    pub fn open() -> io::Result<Self> {
        // A panic's message must land on the normal screen, not the alternate one that is
        // about to be left: restore first, then report as before.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        terminal::enable_raw_mode()?;
        let mut stdout = io::stdout();
        if let Err(e) = execute!(stdout, EnterAlternateScreen, cursor::Hide) {
            let _ = terminal::disable_raw_mode();
            return Err(e);
        }
        let terminal = match Terminal::new(CrosstermBackend::new(stdout)) {
            Ok(t) => t,
            Err(e) => {
                restore();
                return Err(e);
            }
        };
        Ok(Self {
            terminal,
            sort: SortBy::WindowOwn,
            granularity: Granularity::Functions,
            paused: false,
            process: None,
            drawn: Vec::new(),
            drawn_samples: (0, 0),
        })
    }

    /// Reads the keys pressed, and draws when a tick came or something changed. `false`: quit.
    pub fn frame(&mut self, model: &Model, header: &Header, tick: bool) -> io::Result<bool> {
        let mut changed = tick;
        while event::poll(Duration::ZERO)? {
            match event::read()? {
                Event::Key(key) if key.kind != KeyEventKind::Release => {
                    changed = true;
                    match key.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(false),
                        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(false),
                        KeyCode::Char('s') => self.sort = self.sort.next(),
                        KeyCode::Char('l') => {
                            self.granularity = match self.granularity {
                                Granularity::Functions => Granularity::Lines,
                                Granularity::Lines => Granularity::Functions,
                            }
                        }
                        KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
                        KeyCode::Char('f') => self.process = next_process(self.process, &model.pids()),
                        _ => {}
                    }
                }
                Event::Resize(..) => changed = true,
                _ => {}
            }
        }
        if !changed {
            return Ok(true);
        }
        let size = self.terminal.size()?;
        let limit = usize::from(size.height.saturating_sub(5)).max(1);
        if !self.paused {
            self.drawn = model.rows(self.granularity, self.process, self.sort, limit);
            self.drawn_samples = model.samples(self.process);
        }
        let too_small = size.width < MIN_COLUMNS || size.height < MIN_ROWS;
        let title = self.title(model, header);
        let status = self.status(header);
        let rows = &self.drawn;
        self.terminal.draw(|f| {
            let area = f.area();
            if too_small {
                f.render_widget(
                    Paragraph::new(format!(
                        "terminal too small: pyperch top needs {MIN_COLUMNS}x{MIN_ROWS} (q quits)"
                    )),
                    area,
                );
                return;
            }
            let [top, table_area, bottom] =
                Layout::vertical([Constraint::Length(2), Constraint::Min(1), Constraint::Length(1)]).areas(area);
            f.render_widget(Paragraph::new(vec![Line::from(title.0.clone()), Line::from(title.1.clone())]), top);
            let header_row = Row::new(
                ["OWN%", "TOTAL%", "OWN%ALL", "TOT%ALL", "FUNCTION", "FILE:LINE", "PID", "TID", "THREAD"].map(Cell::from),
            )
            .style(Style::default().add_modifier(Modifier::REVERSED));
            let body = rows.iter().map(|r| {
                let place = if r.key.line == 0 {
                    field(&r.key.file).to_string()
                } else {
                    format!("{}:{}", field(&r.key.file), r.key.line)
                };
                Row::new(vec![
                    Cell::from(format!("{:5.1}", r.window_own)),
                    Cell::from(format!("{:6.1}", r.window_total)),
                    Cell::from(format!("{:6.1}", r.all_own)),
                    Cell::from(format!("{:6.1}", r.all_total)),
                    Cell::from(field(&r.key.function).to_string()),
                    Cell::from(place),
                    Cell::from(r.key.pid.to_string()),
                    Cell::from(r.key.tid.map_or_else(|| "-".into(), |t| t.to_string())),
                    Cell::from(field(model.thread_name(r.key.tid)).to_string()),
                ])
            });
            let widths = [
                Constraint::Length(6),
                Constraint::Length(7),
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Percentage(35),
                Constraint::Fill(1),
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Length(20),
            ];
            f.render_widget(Table::new(body, widths).header(header_row), table_area);
            f.render_widget(Paragraph::new(status.clone()), bottom);
        })?;
        Ok(true)
    }

    fn title(&self, model: &Model, header: &Header) -> (String, String) {
        let processes: Vec<String> =
            model.processes.iter().take(6).map(|(pid, comm)| format!("{pid} {}", field(comm))).collect();
        let more = model.processes.len().saturating_sub(6);
        let list = if processes.is_empty() { "none yet".to_string() } else { processes.join(", ") };
        let list = if more > 0 { format!("{list} and {more} more") } else { list };
        (
            format!("pyperch top - {} Python processes: {list}", model.processes.len()),
            format!(
                "rate {} Hz, mode {}, {}: {} in the last {} s, {} since start{}",
                header.rate,
                header.mode,
                header.unit,
                self.drawn_samples.0,
                header.window,
                self.drawn_samples.1,
                if self.paused { "  [PAUSED]" } else { "" }
            ),
        )
    }

    fn status(&self, _header: &Header) -> String {
        let view = match self.granularity {
            Granularity::Functions => "functions",
            Granularity::Lines => "lines",
        };
        let process = self.process.map_or_else(|| "all".to_string(), |p| p.to_string());
        format!(
            "sort: {} | view: {view} | process: {process} || s sort  l lines/functions  p pause  f process  q quit",
            self.sort.label()
        )
    }
}

/// The process filter after `f`: all → each pid in turn → all.
fn next_process(current: Option<u32>, pids: &[u32]) -> Option<u32> {
    match current {
        None => pids.first().copied(),
        Some(p) => pids.iter().position(|&x| x == p).and_then(|i| pids.get(i + 1)).copied(),
    }
}

/// Leaves raw mode and the alternate screen, shows the cursor.
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_filter_cycles() {
        assert_eq!(next_process(None, &[3, 5]), Some(3));
        assert_eq!(next_process(Some(3), &[3, 5]), Some(5));
        assert_eq!(next_process(Some(5), &[3, 5]), None);
        assert_eq!(next_process(Some(4), &[3, 5]), None);
        assert_eq!(next_process(None, &[]), None);
    }
}
