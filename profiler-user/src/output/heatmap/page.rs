//! The heatmap's HTML: the index and one page per source file.
//!
//! Invariants: every piece of text from the profile or from a source file (paths, function
//! names, source lines, reasons) goes through [`escape`]; links only ever name pages this
//! module's caller numbered (`file-NNNN.html`); the pages carry their CSS inline and have no
//! script. Each line's row carries its numbers as `data-line`, `data-self` and `data-total`
//! attributes (raw values) for tools and tests.

use std::fmt::Write as _;

use super::source::{Root, Source};
use super::{Counts, FileCounts, LineCounts, MAX_LINES_SHOWN};
use crate::time_mode::TimeMode;

/// `text` for HTML text and attribute values: `& < > " '` escaped, control characters
/// (other than tab) shown as U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' => out.push('\t'),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// `value` as people read it: a sample count, or seconds in the time modes.
fn amount(mode: TimeMode, value: u64) -> String {
    if mode.in_nanoseconds() { format!("{:.3} s", value as f64 / 1e9) } else { value.to_string() }
}

/// What the values are, for headings.
fn unit(mode: TimeMode) -> &'static str {
    if mode.in_nanoseconds() { "time" } else { "samples" }
}

/// `part` of `whole` in percent, two decimals (`0.00%` of nothing).
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.00%".into();
    }
    format!("{:.2}%", part as f64 * 100.0 / whole as f64)
}

/// The background of a row whose value is `share` (0..=1) of the hottest one: none for
/// nothing, then from pale yellow to red.
fn heat(share: f64) -> String {
    if share <= 0.0 {
        return String::new();
    }
    let share = share.clamp(0.0, 1.0);
    let hue = 55.0 - 55.0 * share;
    let light = 93.0 - 35.0 * share;
    format!(" style=\"background:hsl({hue:.0},100%,{light:.0}%)\"")
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}\
h1{font-size:1.3em;word-break:break-all}\
p.meta,p.note{color:#555;margin:.3em 0}\
p.note{color:#a40000}\
table{border-collapse:collapse}\
th,td{padding:1px 8px;text-align:right;vertical-align:top}\
th{background:#eee;position:sticky;top:0}\
td.src,td.fn,td.path,th.src{text-align:left}\
td.src{font-family:ui-monospace,monospace;white-space:pre;min-width:40em}\
td.fn{color:#555;font-size:.9em}\
td.no{color:#888;font-family:ui-monospace,monospace}\
tr.past td.src{color:#888;font-style:italic}\
a{color:#0645ad}\
.legend span{display:inline-block;width:3em;height:1em;vertical-align:middle}";

fn head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{STYLE}</style></head><body>\n",
        escape(title)
    );
}

/// Background of a line that is on stacks but never the innermost (self 0, total > 0).
const ON_STACK: &str = " style=\"background:#e6eefa\"";

fn legend(out: &mut String) {
    out.push_str("<p class=\"meta legend\">colour: a line's self samples, from ");
    for share in [0.05, 0.25, 0.5, 0.75, 1.0] {
        let _ = write!(out, "<span{}></span>", heat(share));
    }
    let _ = writeln!(out, " the page's hottest line; <span{ON_STACK}></span> on the stack only (self 0)</p>");
}

/// One file's page and what it needs.
pub struct FilePage<'a> {
    pub file: &'a FileCounts,
    /// The profile's total value.
    pub total: u64,
    pub mode: TimeMode,
    pub source: &'a Source,
    /// Where the source was looked for.
    pub root: Root,
    /// The process whose root that is.
    pub pid: u32,
    /// The recording's title.
    pub title: &'a str,
    /// Lines of source this page may show at most (besides the counted lines past them).
    pub max_lines: usize,
}

/// The HTML page of one source file: every line numbered with its source text (up to
/// `max_lines` and [`MAX_LINES_SHOWN`]), its self and total values and shares, coloured by
/// its self value, and the functions seen on it; also how many lines of source it shows.
pub fn file_page(p: &FilePage<'_>) -> (String, usize) {
    let mut out = String::new();
    let path = escape(&p.file.path);
    head(&mut out, &format!("{} - pyperch heatmap", p.file.path));
    let _ = writeln!(out, "<p class=\"meta\"><a href=\"index.html\">&larr; all files</a> &middot; {}</p>", escape(p.title));
    let _ = writeln!(out, "<h1>{path}</h1>");
    let _ = writeln!(
        out,
        "<p class=\"meta\">{unit}: self {} ({}), total {} ({}) of {}{}</p>",
        amount(p.mode, p.file.self_value),
        percent(p.file.self_value, p.total),
        amount(p.mode, p.file.total_value),
        percent(p.file.total_value, p.total),
        amount(p.mode, p.total),
        hottest_line(p.file).map(|n| format!("; hottest line: <a href=\"#L{n}\">{n}</a>")).unwrap_or_default(),
        unit = unit(p.mode),
    );
    let _ = match p.root {
        Root::Process(pid) => writeln!(out, "<p class=\"meta\">source read inside the root of process {pid}</p>"),
        Root::Host => writeln!(
            out,
            "<p class=\"meta\">source read from the host's files: process {} has exited (for a process that ran in a container, this may not be its file)</p>",
            p.pid
        ),
    };
    let lines: Vec<&str> = match p.source {
        Source::Text(text) => {
            let mut lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
            if lines.last() == Some(&"") {
                lines.pop();
            }
            let cap = MAX_LINES_SHOWN.min(p.max_lines);
            if lines.len() > cap {
                let _ = writeln!(out, "<p class=\"note\">only the first {cap} lines of the file are shown (and the counted lines after them)</p>");
                lines.truncate(cap);
            }
            lines
        }
        Source::Unreadable(why) => {
            let _ = writeln!(out, "<p class=\"note\">source not readable: {}</p>", escape(why));
            Vec::new()
        }
    };
    legend(&mut out);
    let hottest = p.file.lines.values().map(|l| l.self_value).max().unwrap_or(0);
    let _ = writeln!(out, "<table data-profile-total=\"{}\">", p.total);
    out.push_str(
        "<tr><th>line</th><th>self</th><th>self %</th><th>total</th><th>total %</th><th class=\"src\">source</th><th class=\"src\">functions</th></tr>\n",
    );
    let empty = LineCounts::default();
    let shown = lines.len();
    for (i, text) in lines.iter().enumerate() {
        let number = u32::try_from(i + 1).unwrap_or(u32::MAX);
        row(&mut out, p, number, Some(text), p.file.lines.get(&number).unwrap_or(&empty), hottest);
    }
    for (&number, counts) in p.file.lines.range(u32::try_from(shown).unwrap_or(u32::MAX).saturating_add(1)..) {
        row(&mut out, p, number, None, counts, hottest);
    }
    out.push_str("</table>\n</body></html>\n");
    (out, shown)
}

/// The line with the most self value (the first on ties), if any has some.
fn hottest_line(file: &FileCounts) -> Option<u32> {
    let most = file.lines.values().map(|l| l.self_value).max().filter(|&v| v > 0)?;
    file.lines.iter().find(|(_, l)| l.self_value == most).map(|(n, _)| *n)
}

/// One line's row, coloured by its self value's share of the page's `hottest` self value;
/// `text` is `None` for a line not shown from the file.
fn row(out: &mut String, p: &FilePage<'_>, number: u32, text: Option<&str>, counts: &LineCounts, hottest: u64) {
    let background = match (counts.self_value, counts.total_value) {
        (0, 0) => String::new(),
        (0, _) => ON_STACK.to_string(),
        (s, _) => heat(s as f64 / hottest.max(1) as f64),
    };
    let class = if text.is_none() { " class=\"past\"" } else { "" };
    let _ = write!(
        out,
        "<tr id=\"L{number}\"{class} data-line=\"{number}\" data-self=\"{}\" data-total=\"{}\"{}><td class=\"no\">{number}</td>",
        counts.self_value,
        counts.total_value,
        background
    );
    if counts.total_value > 0 {
        let _ = write!(
            out,
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            amount(p.mode, counts.self_value),
            percent(counts.self_value, p.total),
            amount(p.mode, counts.total_value),
            percent(counts.total_value, p.total)
        );
    } else {
        out.push_str("<td></td><td></td><td></td><td></td>");
    }
    match text {
        Some(text) => {
            let _ = write!(out, "<td class=\"src\">{}</td>", escape(text));
        }
        None => out.push_str("<td class=\"src\">(not in the source shown)</td>"),
    }
    let functions: Vec<String> = counts.functions.iter().map(|f| escape(f)).collect();
    let _ = writeln!(out, "<td class=\"fn\">{}</td></tr>", functions.join(", "));
}

/// The index: every source file, most total first, linked to its page where it has one
/// (`pages[i]` is the page of `counts.files[i]`).
pub fn index_page(counts: &Counts, pages: &[Option<String>], mode: TimeMode, title: &str, recording: &str) -> String {
    let mut out = String::new();
    head(&mut out, &format!("{title} - pyperch heatmap"));
    let _ = writeln!(out, "<h1>{}</h1>", escape(title));
    let _ = writeln!(out, "<p class=\"meta\">{}</p>", escape(recording));
    let _ = writeln!(
        out,
        "<p class=\"meta\">{} source files; {unit} in all: {}. Self: where the line was the innermost Python line; total: where it was on the stack.</p>",
        counts.files.len(),
        amount(mode, counts.total),
        unit = unit(mode),
    );
    if pages.iter().any(Option::is_none) {
        let _ = writeln!(out, "<p class=\"note\">only the busiest {} files have a page</p>", super::MAX_PAGES);
    }
    let _ = writeln!(out, "<table data-profile-total=\"{}\">", counts.total);
    out.push_str(
        "<tr><th>#</th><th class=\"src\">file</th><th>self</th><th>self %</th><th>total</th><th>total %</th></tr>\n",
    );
    let hottest = counts.files.first().map_or(0, |f| f.total_value);
    for (i, file) in counts.files.iter().enumerate() {
        let share = if hottest == 0 { 0.0 } else { file.total_value as f64 / hottest as f64 };
        let path = escape(&file.path);
        let link = match pages.get(i).and_then(Option::as_ref) {
            Some(page) => format!("<a href=\"{page}\">{path}</a>"),
            None => path,
        };
        let _ = writeln!(
            out,
            "<tr data-self=\"{}\" data-total=\"{}\"{}><td>{}</td><td class=\"path\">{link}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            file.self_value,
            file.total_value,
            heat(share),
            i + 1,
            amount(mode, file.self_value),
            percent(file.self_value, counts.total),
            amount(mode, file.total_value),
            percent(file.total_value, counts.total),
        );
    }
    out.push_str("</table>\n</body></html>\n");
    out
}
