//! `pyperch top --plain` / `--once`: the same table as plain text, for logs and pipes.

use std::fmt::Write;

use super::Header;
use super::model::{Granularity, Model, SortBy};
use crate::text::field;

/// One table: a header line, then at most `limit` functions sorted by their own share in
/// the window.
pub fn table(model: &Model, header: &Header, limit: usize) -> String {
    let (window, all) = model.samples(None);
    let mut out = String::new();
    let processes: Vec<String> = model.processes.iter().map(|(pid, comm)| format!("{pid} {}", field(comm))).collect();
    let _ = writeln!(
        out,
        "pyperch top: {} Python processes ({}), rate {} Hz, mode {}, {window} {} in the last {} s, {all} since start",
        model.processes.len(),
        processes.join(", "),
        header.rate,
        header.mode,
        header.unit,
        header.window,
    );
    let _ = writeln!(out, "{:>6} {:>6} {:>7} {:>7}  {:<40} {:<40} {:>8} {:>8} THREAD", "OWN%", "TOTAL%", "OWN%ALL", "TOT%ALL", "FUNCTION", "FILE", "PID", "TID");
    for r in model.rows(Granularity::Functions, None, SortBy::WindowOwn, limit) {
        let _ = writeln!(
            out,
            "{:>6.1} {:>6.1} {:>7.1} {:>7.1}  {:<40} {:<40} {:>8} {:>8} {}",
            r.window_own,
            r.window_total,
            r.all_own,
            r.all_total,
            field(&r.key.function).to_string(),
            field(&r.key.file).to_string(),
            r.key.pid,
            r.key.tid.map_or_else(|| "-".into(), |t| t.to_string()),
            field(model.thread_name(r.key.tid)),
        );
    }
    out.push('\n');
    out
}
