//! Writers that turn a finished [`Profile`] into files people can look at.
//!
//! Three formats, one module each:
//! - [`collapsed`]: Brendan Gregg's folded stacks, one `frame;frame;frame count` line per stack;
//! - [`speedscope`]: the JSON file format of <https://www.speedscope.app>;
//! - [`flamegraph`]: an interactive SVG flame graph drawn by `inferno` from the folded stacks;
//! - [`otlp`]: an OpenTelemetry `ExportProfilesServiceRequest` (OTLP profiles, protobuf);
//! - [`heatmap`]: a directory of HTML pages, one per source file, lines coloured by their
//!   share of the samples (the one format written to a directory, not a stream).
//!
//! Every writer is deterministic: the same profile always produces the same bytes (stacks are
//! sorted, never emitted in hash-map order).

pub mod chrometrace;
pub mod collapsed;
pub mod file;
pub mod filenames;
pub mod flamegraph;
pub mod gecko;
pub mod heatmap;
pub mod otlp;
pub mod pprof;
pub mod speedscope;

use std::fmt;
use std::io;
use std::path::Path;

use crate::sample::aggregate::Profile;

/// Placeholder process name for a pid that was sampled but never labelled (or whose `comm`
/// is empty).
pub const UNKNOWN_COMM: &str = "[unknown]";

/// Leaf frame standing in for a stack with no Python frames (a thread sampled while not
/// running Python code). Every format shows it, so the formats agree on what was sampled; in
/// the folded format it also keeps a `thread <tid>` frame from ending a line, where readers
/// (flamegraph.pl, inferno) would take the tid for a differential count column.
pub const NO_PYTHON_FRAMES: &str = "[no Python frames]";

/// An output file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Folded stacks (`frame;frame;frame count`), as read by flamegraph.pl, inferno and
    /// speedscope (`raw` is another name for it, as in py-spy).
    #[value(alias = "raw")]
    Collapsed,
    /// speedscope's JSON file format; open it at <https://www.speedscope.app>.
    Speedscope,
    /// An interactive SVG flame graph; open it in a web browser.
    Flamegraph,
    /// gzip-compressed profile.proto, as Go's pprof, Pyroscope and Parca read it.
    Pprof,
    /// Chrome trace event JSON, one track per thread over time; open it in Perfetto
    /// (ui.perfetto.dev) or chrome://tracing.
    Chrometrace,
    /// An OpenTelemetry OTLP profiles request (`ExportProfilesServiceRequest`, protobuf), as
    /// an OpenTelemetry Collector receives it.
    Otlp,
    /// The Gecko profile format (JSON), one track per thread with each sample's time; open it
    /// in the Firefox Profiler (profiler.firefox.com).
    Gecko,
    /// A directory (`-o DIR`) of HTML pages: `index.html` lists the source files by
    /// samples, and each file's page shows every line with its self and total samples,
    /// coloured by its share; open `DIR/index.html` in a web browser.
    Heatmap,
}

impl Format {
    /// Guesses the format from a file name's extension (case-insensitively):
    /// `.svg` → [`Format::Flamegraph`], `.json` / `.speedscope` → [`Format::Speedscope`],
    /// `.txt` / `.folded` / `.collapsed` → [`Format::Collapsed`], `.gz` / `.pprof` / `.pb` →
    /// [`Format::Pprof`], `.trace.json` → [`Format::Chrometrace`], `.otlp` / `.otlp.pb` →
    /// [`Format::Otlp`], `.gecko.json` → [`Format::Gecko`]. Anything else is `None`.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        if name.ends_with(".trace.json") || name.ends_with(".chrometrace.json") {
            return Some(Format::Chrometrace);
        }
        if name.ends_with(".gecko.json") {
            return Some(Format::Gecko);
        }
        if name.ends_with(".otlp") || name.ends_with(".otlp.pb") {
            return Some(Format::Otlp);
        }
        let extension = path.extension()?.to_str()?;
        let is = |candidate: &str| extension.eq_ignore_ascii_case(candidate);
        if is("svg") {
            Some(Format::Flamegraph)
        } else if is("json") || is("speedscope") {
            Some(Format::Speedscope)
        } else if is("txt") || is("folded") || is("collapsed") {
            Some(Format::Collapsed)
        } else if is("gz") || is("pprof") || is("pb") {
            Some(Format::Pprof)
        } else {
            None
        }
    }

    /// The conventional file extension, without the dot. [`Format::from_path`] maps it back
    /// to `self`, except for [`Format::Heatmap`] (a directory, whose format is never inferred).
    pub fn extension(&self) -> &'static str {
        match self {
            Format::Collapsed => "txt",
            Format::Speedscope => "json",
            Format::Flamegraph => "svg",
            Format::Pprof => "pb.gz",
            Format::Chrometrace => "trace.json",
            Format::Otlp => "otlp.pb",
            Format::Gecko => "gecko.json",
            // A directory name (`pyperch-heatmap` by default), never inferred from a path.
            Format::Heatmap => "heatmap",
        }
    }

    /// Whether the format shows when each sample was taken, so the recording must keep a
    /// per-thread [`crate::sample::timeline::Timeline`].
    pub fn needs_timeline(&self) -> bool {
        matches!(self, Format::Chrometrace | Format::Gecko)
    }

    /// The name used on the command line (`--format <name>`).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Collapsed => "collapsed",
            Format::Speedscope => "speedscope",
            Format::Flamegraph => "flamegraph",
            Format::Pprof => "pprof",
            Format::Chrometrace => "chrometrace",
            Format::Otlp => "otlp",
            Format::Gecko => "gecko",
            Format::Heatmap => "heatmap",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a profile could not be written.
#[derive(thiserror::Error, Debug)]
pub enum OutputError {
    /// The destination refused the bytes (disk full, closed pipe, ...).
    #[error("could not write the {format} profile: {source}")]
    Write {
        /// The format being written.
        format: Format,
        /// What the destination reported.
        source: io::Error,
    },
    /// serde_json failed for a reason other than I/O.
    #[error("could not encode the speedscope profile as JSON: {0}")]
    Json(serde_json::Error),
    /// A flame graph of nothing cannot be drawn.
    #[error(
        "the profile has no samples, so there is no flame graph to draw; was a Python process running while pyperch recorded? (the collapsed and speedscope formats can still be written)"
    )]
    NoSamples,
    /// inferno rejected the folded stacks or failed while drawing.
    #[error("inferno could not draw the flame graph: {0}")]
    Flamegraph(io::Error),
    /// The heatmap is a directory of pages, not one stream.
    #[error("--format heatmap writes a directory of HTML pages, not one stream; name a directory with -o DIR")]
    NeedsDirectory,
    /// A heatmap page or its directory could not be written.
    #[error(transparent)]
    Heatmap(#[from] heatmap::HeatmapError),
}

impl OutputError {
    /// Wraps an I/O error from the destination of a `format` profile.
    fn write(format: Format) -> impl FnOnce(io::Error) -> OutputError {
        move |source| OutputError::Write { format, source }
    }
}

/// Writes `profile` to `out` in `format`. `title` names the profile where the format has a
/// place for it (the speedscope file name, the flame graph heading); the folded format has
/// none and ignores it.
///
/// `out` is written through a buffer and flushed before returning `Ok`.
pub fn write_profile(
    profile: &Profile,
    format: Format,
    title: &str,
    out: &mut dyn io::Write,
) -> Result<(), OutputError> {
    match format {
        Format::Collapsed => collapsed::write(profile, out),
        Format::Speedscope => speedscope::write(profile, title, out),
        Format::Flamegraph => flamegraph::write(profile, title, out),
        Format::Chrometrace => chrometrace::write(profile, out),
        Format::Otlp => otlp::write(profile, &otlp::ResourceInfo::of_this_host(), out)
            .map_err(OutputError::write(Format::Otlp)),
        Format::Gecko => gecko::write(profile, out),
        Format::Heatmap => Err(OutputError::NeedsDirectory),
        Format::Pprof => {
            let timing = profile
                .timing()
                .map(|t| pprof::Timing::new(t.start, t.duration, t.rate_hz))
                .unwrap_or_default();
            pprof::write_with_timing(profile, &|key| pprof_labels(profile, key), &timing, out)
                .map_err(|e| OutputError::Write { format: Format::Pprof, source: e.into() })
        }
    }
}

/// How `profile` was recorded, as `(key, value)` pairs, for every format that has a place
/// for them (pprof comments, OTLP profile attributes, chrometrace `otherData`, gecko `meta`;
/// the SVG's and speedscope's titles carry [`recording_line`]). Collapsed stacks have no such
/// place. Without timing (a profile not from a recording) only the version and mode.
pub fn recording_facts(profile: &Profile) -> Vec<(&'static str, String)> {
    let mut facts = vec![
        ("pyperch.version", env!("CARGO_PKG_VERSION").to_string()),
        ("pyperch.mode", profile.time_mode().label().to_string()),
    ];
    if let Some(t) = profile.timing() {
        facts.push(("pyperch.rate_hz", t.rate_hz.to_string()));
        facts.push(("pyperch.duration_s", format!("{:.3}", t.duration.as_secs_f64())));
        facts.push(("pyperch.samples.dropped", t.dropped.to_string()));
        facts.push(("pyperch.samples.lost", t.lost.to_string()));
        if let Some(b) = t.budget {
            // The values are those of `rate_hz` (each kept sample counts for the skipped
            // ones); the rate samples were actually kept at is this.
            facts.push(("pyperch.max_cpu_percent", format!("{}", b.max_cpu_percent)));
            facts.push(("pyperch.rate_hz.effective.min", format!("{:.1}", b.rate.min_hz)));
            facts.push(("pyperch.rate_hz.effective.mean", format!("{:.1}", b.rate.mean_hz)));
            facts.push(("pyperch.rate_hz.effective.last", format!("{:.1}", b.rate.last_hz)));
            if let Some(sw) = b.switches {
                // The off-CPU modes: one switch-out in this many was walked, each walked
                // interval counting for the others.
                facts.push(("pyperch.context_switches_walked.one_in.last", sw.last_one_in.to_string()));
                facts.push(("pyperch.context_switches_walked.share.mean", format!("{:.4}", sw.mean_share)));
            }
        }
    }
    facts
}

/// [`recording_facts`] as one line for people: `pyperch 0.1.0, mode cpu, 99 Hz, 10.000 s,
/// 0 samples dropped, 0 lost`.
pub fn recording_line(profile: &Profile) -> String {
    let mut line = format!("pyperch {}, mode {}", env!("CARGO_PKG_VERSION"), profile.time_mode().label());
    if let Some(t) = profile.timing() {
        line.push_str(&format!(
            ", {} Hz, {:.3} s, {} samples dropped, {} lost",
            t.rate_hz,
            t.duration.as_secs_f64(),
            t.dropped,
            t.lost
        ));
        if let Some(b) = t.budget {
            line.push_str(&format!(", --max-cpu {}: effective {:.1} Hz mean, {:.1} min", b.max_cpu_percent, b.rate.mean_hz, b.rate.min_hz));
            if let Some(sw) = b.switches {
                line.push_str(&format!(", context switches walked {}", sw.describe()));
            }
        }
    }
    line
}

/// The labels of one pprof sample: `process.pid`, `process.executable.name`, `thread.id`
/// (per-thread profiles) and `thread.name` (when known, see [`thread_name_text`]),
/// `container.id` and `k8s.pod.uid` (when known), and the OpenTelemetry names `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name` (when the
/// runtime's annotations give them).
pub fn pprof_labels(profile: &Profile, key: &crate::sample::aggregate::StackKey) -> Vec<(String, String)> {
    let mut labels = vec![("process.pid".to_string(), key.pid.to_string())];
    if let Some(label) = profile.process(key.pid) {
        let exe_name = std::path::Path::new(&label.exe)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| label.comm.clone());
        labels.push(("process.executable.name".to_string(), exe_name));
        if let Some(id) = &label.container_id {
            labels.push(("container.id".to_string(), id.clone()));
        }
        if let Some(uid) = &label.pod_uid {
            labels.push(("k8s.pod.uid".to_string(), uid.clone()));
        }
        labels.extend(k8s_name_labels(label));
    }
    if let Some(tid) = key.tid {
        labels.push(("thread.id".to_string(), tid.to_string()));
        if let Some(name) = thread_name_text(profile, tid) {
            labels.push(("thread.name".to_string(), name));
        }
    }
    labels
}

pub use crate::text::MAX_THREAD_NAME_CHARS;

/// The name of thread `tid` as every format shows it, if known: the name the profile holds
/// (untrusted target text) with `;` and control characters replaced as in
/// [`collapsed::sanitize`], cut to [`MAX_THREAD_NAME_CHARS`] characters; `None` for an
/// unknown or empty name.
pub(crate) fn thread_name_text(profile: &Profile, tid: u32) -> Option<String> {
    let name = profile.thread_name(tid).filter(|n| !n.is_empty())?;
    Some(collapsed::sanitize(name).chars().take(MAX_THREAD_NAME_CHARS).collect())
}

/// The label of thread `tid` after its process's name: `thread <tid> (<name>)`, or
/// `thread <tid>` when its name is unknown (speedscope's profile names).
pub(crate) fn thread_label(profile: &Profile, tid: u32) -> String {
    match thread_name_text(profile, tid) {
        Some(name) => format!("thread {tid} ({name})"),
        None => format!("thread {tid}"),
    }
}

/// The title of thread `tid` of process `pid` on its own track (Gecko's thread `name`,
/// Chrome trace `thread_name`): `<name> (tid <tid>)` when its name is known, else
/// `main (tid <tid>)` for the main thread (tid = pid) and `thread <tid>` for the others.
pub(crate) fn thread_title(profile: &Profile, pid: u32, tid: u32) -> String {
    match thread_name_text(profile, tid) {
        Some(name) => format!("{name} (tid {tid})"),
        None if pid == tid => format!("main (tid {tid})"),
        None => format!("thread {tid}"),
    }
}

/// `<comm> (pid <pid>)`, unsanitized; [`UNKNOWN_COMM`] stands in for a missing or empty comm.
pub(crate) fn process_name(profile: &Profile, pid: u32) -> String {
    let comm = profile
        .process(pid)
        .map(|label| label.comm.as_str())
        .filter(|comm| !comm.is_empty())
        .unwrap_or(UNKNOWN_COMM);
    format!("{comm} (pid {pid})")
}

/// The OpenTelemetry semantic-convention labels of a process's Kubernetes names:
/// `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name` (empty when unknown).
pub fn k8s_name_labels(label: &crate::sample::aggregate::ProcessLabel) -> Vec<(String, String)> {
    match &label.pod_names {
        Some(n) => vec![
            ("k8s.namespace.name".to_string(), n.namespace.clone()),
            ("k8s.pod.name".to_string(), n.pod.clone()),
            ("k8s.container.name".to_string(), n.container.clone()),
        ],
        None => Vec::new(),
    }
}

/// With `Profile::set_container_root`, the frames that precede a process's frames:
/// `pod <namespace>/<name>` then `container <name>` when the runtime's annotations name
/// them, else `container <12-hex short id>`, or `host` for a process outside any known
/// container.
pub(crate) fn container_frames(profile: &Profile, pid: u32) -> Vec<String> {
    if !profile.container_root() {
        return Vec::new();
    }
    let label = profile.process(pid);
    if let Some(names) = label.and_then(|l| l.pod_names.as_deref()) {
        return vec![format!("pod {}", names.pod_path()), format!("container {}", names.container)];
    }
    vec![match label.and_then(|l| l.container_id.as_deref()) {
        Some(id) => format!("container {}", id.get(..12).unwrap_or(id)),
        None => "host".to_string(),
    }]
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::sample::aggregate::{FrameName, ProcessLabel};

    /// Two processes; pid 200 sampled per thread; a frame name holding `;` and a newline;
    /// an unknown line; a thread sampled outside Python; an unlabelled pid.
    /// With `--max-cpu`, the budget and the effective rate go where the recording's facts go
    /// (pprof comments, OTLP attributes, ...); the rate the values are at stays `rate_hz`.
    #[test]
    fn facts_carry_the_budget_and_effective_rate() {
        use crate::sample::aggregate::{BudgetFacts, RateSummary, SwitchShare};
        let mut p = sample_profile();
        let timing = |switches| crate::sample::aggregate::Timing {
            start: std::time::SystemTime::UNIX_EPOCH,
            duration: std::time::Duration::from_secs(10),
            rate_hz: 10_000,
            dropped: 0,
            lost: 0,
            budget: Some(BudgetFacts { max_cpu_percent: 2.0, rate: RateSummary { min_hz: 1250.0, mean_hz: 2500.0, last_hz: 1250.0 }, switches }),
        };
        p.set_timing(timing(None));
        assert!(!recording_facts(&p).iter().any(|(k, _)| k.starts_with("pyperch.context_switches")), "not in CPU mode");
        assert!(!recording_line(&p).contains("context switches"));
        p.set_timing(timing(Some(SwitchShare { last_one_in: 8, mean_share: 0.25 })));
        let facts = recording_facts(&p);
        for want in [
            ("pyperch.rate_hz", "10000"),
            ("pyperch.max_cpu_percent", "2"),
            ("pyperch.rate_hz.effective.min", "1250.0"),
            ("pyperch.rate_hz.effective.mean", "2500.0"),
            ("pyperch.rate_hz.effective.last", "1250.0"),
            ("pyperch.context_switches_walked.one_in.last", "8"),
            ("pyperch.context_switches_walked.share.mean", "0.2500"),
        ] {
            assert!(facts.iter().any(|(k, v)| *k == want.0 && v == want.1), "{facts:?} lacks {want:?}");
        }
        assert!(
            recording_line(&p).contains("--max-cpu 2: effective 2500.0 Hz mean, 1250.0 min, context switches walked 1 in 8 last, mean share 25.00%"),
            "{}",
            recording_line(&p)
        );
    }

    /// Every format with a place for it says how the profile was recorded (issue #26): the
    /// mode, rate, duration, pyperch's version and the dropped and lost counts.
    #[test]
    fn outputs_describe_the_recording() {
        let mut p = sample_profile();
        p.set_timeline(crate::sample::timeline::Timeline::default());
        p.set_timing(crate::sample::aggregate::Timing {
            start: std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
            duration: std::time::Duration::from_millis(2500),
            rate_hz: 199,
            dropped: 17,
            lost: 3,
            budget: None,
        });
        let text = |format: Format| {
            let mut out = Vec::new();
            write_profile(&p, format, "title", &mut out).unwrap_or_else(|e| panic!("{format:?}: {e}"));
            out
        };
        let line = format!("pyperch {}, mode cpu, 199 Hz, 2.500 s, 17 samples dropped, 3 lost", env!("CARGO_PKG_VERSION"));
        for format in [Format::Flamegraph, Format::Speedscope, Format::Gecko] {
            let out = String::from_utf8(text(format)).unwrap_or_default();
            assert!(out.contains(&line), "{format:?} lacks {line:?}");
        }
        let trace: serde_json::Value = serde_json::from_slice(&text(Format::Chrometrace)).unwrap_or_default();
        assert_eq!(trace["otherData"]["pyperch.rate_hz"], "199");
        assert_eq!(trace["otherData"]["pyperch.samples.lost"], "3");
        let gecko: serde_json::Value = serde_json::from_slice(&text(Format::Gecko)).unwrap_or_default();
        assert_eq!(gecko["meta"]["pyperch"]["pyperch.samples.dropped"], "17");
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(text(Format::Pprof).as_slice()), &mut raw).unwrap_or_default();
        let pprof = <pprof::proto::Profile as prost::Message>::decode(raw.as_slice()).unwrap_or_default();
        let string = |i: &i64| pprof.string_table.get(*i as usize).map_or("", String::as_str);
        let comments: Vec<&str> = pprof.comment.iter().map(string).collect();
        for want in ["pyperch.mode=cpu", "pyperch.rate_hz=199", "pyperch.duration_s=2.500", "pyperch.samples.dropped=17", "pyperch.samples.lost=3"] {
            assert!(comments.contains(&want), "pprof comments {comments:?} lack {want}");
        }
        assert!(comments.iter().any(|c| c.starts_with("pyperch.version=")), "{comments:?}");
    }

    pub(crate) fn sample_profile() -> Profile {
        let mut p = Profile::new();
        let frame = |p: &mut Profile, function: &str, file: &str, line: u32| {
            p.intern(FrameName {
                function: Arc::from(function),
                file: Arc::from(file),
                line,
                native: None,
            })
        };
        let module = frame(&mut p, "<module>", "/srv/app.py", 3);
        let main = frame(&mut p, "main", "/srv/app.py", 10);
        let work = frame(&mut p, "work", "/srv/lib.py", 0);
        let odd = frame(&mut p, "odd;name\nx", "/srv/we;ird.py", 5);
        let label = |comm: &str| ProcessLabel {
            comm: comm.into(),
            exe: "/usr/bin/python3.12".into(),
            version: "3.12.4".into(), ..Default::default()
        };
        p.set_process(100, label("python3"));
        p.set_process(200, label("gunicorn"));

        p.add(100, None, &[module, main], 3);
        p.add(100, None, &[module, main, work], 2);
        p.add(100, None, &[module, main, work], 1);
        p.add(100, None, &[module, odd], 1);
        p.add(200, Some(201), &[module, main], 4);
        p.add(200, Some(202), &[module, main, work], 5);
        p.add(200, Some(202), &[], 2);
        p.add(300, None, &[main], 1);
        p
    }

    #[test]
    fn format_from_path() {
        let f = |s: &str| Format::from_path(Path::new(s));
        assert_eq!(f("out.svg"), Some(Format::Flamegraph));
        assert_eq!(f("OUT.SVG"), Some(Format::Flamegraph));
        assert_eq!(f("p.json"), Some(Format::Speedscope));
        assert_eq!(f("p.speedscope.json"), Some(Format::Speedscope));
        assert_eq!(f("p.speedscope"), Some(Format::Speedscope));
        assert_eq!(f("p.txt"), Some(Format::Collapsed));
        assert_eq!(f("p.folded"), Some(Format::Collapsed));
        assert_eq!(f("dir/p.collapsed"), Some(Format::Collapsed));
        assert_eq!(f("p.html"), None);
        assert_eq!(f("profile"), None);
        assert_eq!(f("p.trace.json"), Some(Format::Chrometrace));
        assert_eq!(f("profile.trace.json"), Some(Format::Chrometrace));
        assert_eq!(f("p.gecko.json"), Some(Format::Gecko));
        assert_eq!(f("p.otlp"), Some(Format::Otlp));
        assert_eq!(f("p.OTLP.pb"), Some(Format::Otlp));
        assert_eq!(f("p.pb"), Some(Format::Pprof));
        for format in [Format::Collapsed, Format::Speedscope, Format::Flamegraph, Format::Chrometrace, Format::Otlp, Format::Gecko] {
            let path = format!("profile.{}", format.extension());
            assert_eq!(Format::from_path(Path::new(&path)), Some(format));
        }
    }

    #[test]
    fn format_names_match_clap() {
        use clap::ValueEnum;
        for format in Format::value_variants() {
            let value = format.to_possible_value();
            assert_eq!(value.as_ref().map(|v| v.get_name()), Some(format.name()));
        }
    }

    #[test]
    fn write_profile_dispatches() {
        let profile = sample_profile();
        for format in [Format::Collapsed, Format::Speedscope, Format::Flamegraph, Format::Otlp] {
            let mut out = Vec::new();
            let result = write_profile(&profile, format, "t", &mut out);
            assert!(result.is_ok(), "{format}: {result:?}");
            assert!(!out.is_empty(), "{format} wrote nothing");
        }
    }

    /// A destination that always fails, to check errors say what went wrong.
    struct Broken;
    impl io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn write_errors_are_reported() {
        let profile = sample_profile();
        for format in [Format::Collapsed, Format::Speedscope, Format::Flamegraph] {
            let result = write_profile(&profile, format, "t", &mut Broken);
            match result {
                Err(OutputError::Write { format: f, .. }) => assert_eq!(f, format),
                other => panic!("{format}: expected a write error, got {other:?}"),
            }
        }
        let message = write_profile(&profile, Format::Speedscope, "t", &mut Broken)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            message.as_deref(),
            Some("could not write the speedscope profile: disk full")
        );
    }

    #[test]
    fn thread_names_are_sanitized_bounded_and_labelled() {
        let mut p = sample_profile();
        p.set_thread_name(201, "web;worker\n\x1b[2J");
        p.set_thread_name(203, &"x".repeat(500));
        p.set_thread_name(204, "");
        assert_eq!(thread_name_text(&p, 201).as_deref(), Some("web,worker  [2J"));
        assert_eq!(thread_name_text(&p, 203).map(|n| n.chars().count()), Some(MAX_THREAD_NAME_CHARS));
        assert_eq!(thread_name_text(&p, 204), None, "an empty name is no name");
        assert_eq!(thread_name_text(&p, 202), None);
        assert_eq!(thread_label(&p, 201), "thread 201 (web,worker  [2J)");
        assert_eq!(thread_label(&p, 202), "thread 202");
        assert_eq!(thread_title(&p, 200, 201), "web,worker  [2J (tid 201)");
        assert_eq!(thread_title(&p, 200, 202), "thread 202");
        assert_eq!(thread_title(&p, 202, 202), "main (tid 202)");
    }

    #[test]
    fn pprof_labels_name_known_threads() {
        let mut p = sample_profile();
        p.set_thread_name(201, "web;worker");
        let labels_of = |tid: Option<u32>| {
            let key = p.stacks().find(|(k, _)| k.tid == tid).map(|(k, _)| k.clone()).expect("a stack");
            pprof_labels(&p, &key)
        };
        let named = labels_of(Some(201));
        assert!(named.contains(&("thread.id".to_string(), "201".to_string())), "{named:?}");
        assert!(named.contains(&("thread.name".to_string(), "web,worker".to_string())), "{named:?}");
        assert!(!labels_of(Some(202)).iter().any(|(k, _)| k == "thread.name"), "no name, no label");
        assert!(!labels_of(None).iter().any(|(k, _)| k.starts_with("thread.")), "no thread, no thread labels");
    }

    #[test]
    fn unknown_comm() {
        let profile = sample_profile();
        assert_eq!(process_name(&profile, 100), "python3 (pid 100)");
        assert_eq!(process_name(&profile, 300), "[unknown] (pid 300)");
    }
}

#[cfg(test)]
mod pod_name_tests {
    use std::sync::Arc;

    use super::*;
    use crate::sample::aggregate::{FrameName, ProcessLabel};
    use crate::host::pod_names::PodNames;

    const ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    /// pid 10 in a named pod, pid 20 in a container without names, pid 30 on the host.
    pub(crate) fn named_profile() -> Profile {
        let mut p = Profile::new();
        let f = p.intern(FrameName { function: Arc::from("work"), file: Arc::from("/app/w.py"), line: 3, native: None });
        let names = PodNames { namespace: "shop".into(), pod: "checkout-7d9f6b5c4-x2x7q".into(), container: "checkout-api".into() };
        p.set_process(
            10,
            ProcessLabel {
                comm: "python3".into(),
                exe: "/usr/bin/python3".into(),
                container_id: Some(ID.into()),
                pod_uid: Some("1234abcd-0000-1111-2222-333344445555".into()),
                pod_names: Some(Arc::new(names)),
                ..Default::default()
            },
        );
        p.set_process(20, ProcessLabel { comm: "python3".into(), container_id: Some(ID.replace('4', "5")), ..Default::default() });
        p.set_process(30, ProcessLabel { comm: "python3".into(), ..Default::default() });
        for pid in [10, 20, 30] {
            p.add(pid, None, &[f], 1);
        }
        p
    }

    #[test]
    fn by_container_frames_name_pod_and_container() {
        let mut p = named_profile();
        assert!(container_frames(&p, 10).is_empty(), "only with --by-container");
        p.set_container_root(true);
        assert_eq!(container_frames(&p, 10), ["pod shop/checkout-7d9f6b5c4-x2x7q", "container checkout-api"]);
        assert_eq!(container_frames(&p, 20), [format!("container {}", &ID.replace('4', "5")[..12])]);
        assert_eq!(container_frames(&p, 30), ["host"]);
        let stacks: Vec<String> = collapsed::folded_stacks(&p).into_iter().map(|(s, _)| s).collect();
        assert!(
            stacks.iter().any(|s| s.starts_with("pod shop/checkout-7d9f6b5c4-x2x7q;container checkout-api;python3 (pid 10);")),
            "{stacks:?}"
        );
    }

    #[test]
    fn pprof_and_otlp_carry_the_otel_names() {
        let p = named_profile();
        let key = p.stacks().find(|(k, _)| k.pid == 10).map(|(k, _)| k.clone()).expect("a stack of pid 10");
        let labels = pprof_labels(&p, &key);
        for (k, v) in [
            ("k8s.namespace.name", "shop"),
            ("k8s.pod.name", "checkout-7d9f6b5c4-x2x7q"),
            ("k8s.container.name", "checkout-api"),
            ("container.id", ID),
        ] {
            assert!(labels.contains(&(k.to_string(), v.to_string())), "{k} in {labels:?}");
        }
        let other = p.stacks().find(|(k, _)| k.pid == 20).map(|(k, _)| k.clone()).expect("pid 20");
        assert!(!pprof_labels(&p, &other).iter().any(|(k, _)| k.starts_with("k8s.")), "no names, no name labels");

        let attributes = |info: &otlp::ResourceInfo, pid: i64| -> Vec<(String, String)> {
            let req = otlp::request(&p, info);
            let resource = req
                .resource_profiles
                .iter()
                .filter_map(|r| r.resource.as_ref())
                .find(|r| {
                    r.attributes.iter().any(|a| {
                        a.key == "process.pid"
                            && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()), Some(otlp_value::Value::IntValue(p)) if *p == pid)
                    })
                })
                .expect("the process's resource");
            resource
                .attributes
                .iter()
                .filter_map(|a| match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(otlp_value::Value::StringValue(s)) => Some((a.key.clone(), s.clone())),
                    _ => None,
                })
                .collect()
        };
        let info = otlp::ResourceInfo { host_name: None, service_name: Some("pyperch".into()), service_name_from_pod: true };
        let attrs = attributes(&info, 10);
        for (k, v) in [
            ("k8s.namespace.name", "shop"),
            ("k8s.pod.name", "checkout-7d9f6b5c4-x2x7q"),
            ("k8s.container.name", "checkout-api"),
            ("service.name", "shop/checkout-api"),
        ] {
            assert!(attrs.contains(&(k.to_string(), v.to_string())), "{k} in {attrs:?}");
        }
        assert!(attributes(&info, 30).contains(&("service.name".to_string(), "pyperch".to_string())));
        let given = otlp::ResourceInfo { service_name_from_pod: false, ..info };
        assert!(attributes(&given, 10).contains(&("service.name".to_string(), "pyperch".to_string())), "--app-name wins");
    }

    use opentelemetry_proto::tonic::common::v1::any_value as otlp_value;
}
