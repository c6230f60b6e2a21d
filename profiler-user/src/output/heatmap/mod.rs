//! `--format heatmap`: a directory of HTML pages, one per source file, each line coloured
//! by its share of the samples, as CPython 3.15's `profiling.sampling --heatmap` offers.
//!
//! The directory holds `index.html` (the source files, most samples first, with links) and
//! `file-0001.html`, `file-0002.html`, ... (one per file, numbered in the index's order:
//! page names never come from the target's paths). Every page is self-contained HTML
//! (inline CSS, no script, nothing fetched).
//!
//! What is counted, per stack of the profile with value `v` (samples, or nanoseconds in the
//! time modes):
//! - only source frames: a Python frame with a file and a known line (`line > 0`), whose
//!   file is not a `<...>` name (`<frozen ...>`, `<string>`); native, kernel and marker
//!   frames are not source and are skipped;
//! - `self`: the innermost source frame's line gets `v` (so a Python line calling into C
//!   keeps the time spent below it, with or without `--native`);
//! - `total`: every distinct `file:line` of the stack gets `v` once, however often recursion
//!   repeats it; likewise each distinct file's total;
//! - shares are of the profile's total (every stack, Python or not).
//!
//! Hence for every line `self ≤ total ≤ profile total`, and the `self` values of all pages
//! add up to at most the profile's total.
//!
//! Sources are read as [`source`] describes (never blocking, regular files only, bounded);
//! a page whose file is not read still lists its counted lines, with a one-line note why.
//! A relative path (`python script.py` on 3.8) is taken relative to the process's working
//! directory as it was when the process was labelled. The pages show at most
//! [`MAX_LINES_TOTAL`] lines of source in all.
//! At most [`MAX_PAGES`] files get a page; the others are listed in the index without one.

pub mod page;
pub mod source;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;

use crate::sample::aggregate::{FrameName, Profile};

use super::file as output_file;

/// Source files that get a page (the busiest); the others are only listed in the index.
pub const MAX_PAGES: usize = 500;
/// Function names kept per line.
pub const MAX_FUNCTIONS_PER_LINE: usize = 6;
/// Lines of a source file shown at most (counted lines past it are still shown).
pub const MAX_LINES_SHOWN: usize = 50_000;
/// Lines of source shown over all the pages (each line is a table row, about 150 bytes of
/// HTML besides its text): past it, pages show only their counted lines.
pub const MAX_LINES_TOTAL: usize = 2_000_000;

/// Why the heatmap could not be written.
#[derive(Debug, thiserror::Error)]
pub enum HeatmapError {
    /// The output path cannot hold the directory.
    #[error("{0}")]
    Output(io::Error),
    /// A page could not be written.
    #[error("could not write {page}: {source}")]
    Page { page: String, source: io::Error },
}

/// Samples (or time) of one line.
#[derive(Debug, Default, Clone)]
pub struct LineCounts {
    /// Where the line was the innermost source frame.
    pub self_value: u64,
    /// In how many stacks (weighted) the line appears at all.
    pub total_value: u64,
    /// Functions seen at this line (at most [`MAX_FUNCTIONS_PER_LINE`]).
    pub functions: BTreeSet<Arc<str>>,
}

/// The counts of one source file.
#[derive(Debug, Default)]
pub struct FileCounts {
    /// The file's path as the profile names it.
    pub path: Arc<str>,
    pub self_value: u64,
    pub total_value: u64,
    /// By line number.
    pub lines: BTreeMap<u32, LineCounts>,
    /// Value per process that ran the file: the busiest one's root is where it is read.
    pub pids: BTreeMap<u32, u64>,
}

impl FileCounts {
    /// The process with the most value in this file (the smallest pid on ties).
    pub fn busiest_pid(&self) -> Option<u32> {
        self.pids.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(pid, _)| *pid)
    }
}

/// The line counts of a whole profile.
#[derive(Debug, Default)]
pub struct Counts {
    /// Source files, most total value first (then by path).
    pub files: Vec<FileCounts>,
    /// The profile's total value: the denominator of every share.
    pub total: u64,
}

/// Whether `frame` is a line of a source file (see the module docs).
fn is_source(frame: &FrameName) -> bool {
    frame.native.is_none() && frame.line > 0 && !frame.file.is_empty() && !frame.file.starts_with('<')
}

/// Counts `profile`'s values per source file and line (see the module docs).
pub fn count(profile: &Profile) -> Counts {
    let mut files: HashMap<Arc<str>, FileCounts> = HashMap::new();
    let mut seen_lines: Vec<(&str, u32)> = Vec::new();
    let mut seen_files: Vec<&str> = Vec::new();
    for (key, value) in profile.stacks() {
        seen_lines.clear();
        seen_files.clear();
        let frames: Vec<&FrameName> = key.frames.iter().map(|&id| profile.frame(id)).filter(|f| is_source(f)).collect();
        for (i, frame) in frames.iter().enumerate() {
            let leaf = i + 1 == frames.len();
            let file = files
                .entry(frame.file.clone())
                .or_insert_with(|| FileCounts { path: frame.file.clone(), ..Default::default() });
            let new_line = !seen_lines.contains(&(&*frame.file, frame.line));
            let new_file = !seen_files.contains(&&*frame.file);
            let line = file.lines.entry(frame.line).or_default();
            if new_line {
                line.total_value = line.total_value.saturating_add(value);
                seen_lines.push((&frame.file, frame.line));
            }
            if leaf {
                line.self_value = line.self_value.saturating_add(value);
                file.self_value = file.self_value.saturating_add(value);
            }
            if line.functions.len() < MAX_FUNCTIONS_PER_LINE {
                line.functions.insert(frame.function.clone());
            }
            if new_file {
                file.total_value = file.total_value.saturating_add(value);
                let by_pid = file.pids.entry(key.pid).or_default();
                *by_pid = by_pid.saturating_add(value);
                seen_files.push(&frame.file);
            }
        }
    }
    let mut files: Vec<FileCounts> = files.into_values().collect();
    files.sort_by(|a, b| b.total_value.cmp(&a.total_value).then_with(|| a.path.cmp(&b.path)));
    Counts { files, total: profile.total_samples() }
}

/// The name of the page of the `index`-th file (0-based): `file-0001.html`, ...
pub fn page_name(index: usize) -> String {
    format!("file-{:04}.html", index + 1)
}

/// Checks, before sampling, that the heatmap can later be written at `dir`: a directory to
/// create (in a writable folder) or an existing one to write into; a symbolic link, or a
/// regular file, is refused.
pub fn check(dir: &Path) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => output_file::check(dir),
        Err(e) => Err(e),
        Ok(meta) if meta.file_type().is_symlink() => Err(io::Error::other(
            "it is a symbolic link, which pyperch does not follow; name the directory it points to instead",
        )),
        Ok(meta) if meta.is_dir() => output_file::check(&dir.join("index.html")),
        Ok(meta) if meta.is_file() => Err(io::Error::other(
            "it is an existing file, and --format heatmap writes a directory (index.html and one page per source file); name a new or existing directory",
        )),
        Ok(_) => Err(io::Error::other("it is not a directory; --format heatmap writes a directory")),
    }
}

/// Writes the heatmap of `profile` into the directory `dir` (created if missing; see the
/// module docs). `title` heads the index. A `private` heatmap (a whole-host recording) gets
/// a directory and files readable by their owner only. Each page is written as
/// [`output_file::write`] writes files (never through a symbolic link, replaced whole);
/// pages of an earlier heatmap in the same directory that this one does not name are left.
pub fn write_dir(profile: &Profile, title: &str, dir: &Path, private: bool) -> Result<(), HeatmapError> {
    check(dir).map_err(HeatmapError::Output)?;
    if fs::symlink_metadata(dir).is_err() {
        fs::DirBuilder::new()
            .mode(if private { 0o700 } else { 0o777 })
            .create(dir)
            .map_err(HeatmapError::Output)?;
    }
    let counts = count(profile);
    let mode = profile.time_mode();
    let mut reader = source::Reader::new();
    let mut entries = Vec::new();
    let mut lines_left = MAX_LINES_TOTAL;
    for (i, file) in counts.files.iter().enumerate() {
        let page = (i < MAX_PAGES).then(|| page_name(i));
        if let Some(name) = &page {
            let pid = file.busiest_pid().unwrap_or(0);
            let cwd = profile.process(pid).and_then(|l| l.cwd.as_deref());
            let (text, root) = reader.read(pid, &absolute(&file.path, cwd));
            let view = page::FilePage { file, total: counts.total, mode, source: &text, root, pid, title, max_lines: lines_left };
            let (html, shown) = page::file_page(&view);
            lines_left = lines_left.saturating_sub(shown);
            write_page(dir, name, &html, private)?;
        }
        entries.push(page);
    }
    let html = page::index_page(&counts, &entries, mode, title, &super::recording_line(profile));
    write_page(dir, "index.html", &html, private)
}

/// `path` made absolute against the process's working directory `cwd` (as the process sees
/// it) when it is relative and `cwd` is known; else unchanged.
fn absolute<'a>(path: &'a str, cwd: Option<&str>) -> std::borrow::Cow<'a, str> {
    match cwd {
        Some(cwd) if !path.starts_with('/') && cwd.starts_with('/') => {
            std::borrow::Cow::Owned(format!("{}/{path}", cwd.trim_end_matches('/')))
        }
        _ => std::borrow::Cow::Borrowed(path),
    }
}

fn write_page(dir: &Path, name: &str, html: &str, private: bool) -> Result<(), HeatmapError> {
    let path = dir.join(name);
    let fill = |f: &mut fs::File| f.write_all(html.as_bytes());
    let written = if private { output_file::write_private(&path, fill) } else { output_file::write(&path, fill) };
    written.map_err(|e| HeatmapError::Page {
        page: name.to_string(),
        source: match e {
            output_file::OutputFileError::Io(e) | output_file::OutputFileError::Content(e) => e,
        },
    })
}

#[cfg(test)]
mod tests;
