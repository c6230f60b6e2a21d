//! Folded stacks (Brendan Gregg's "collapsed" format), the input of flamegraph.pl and inferno.
//!
//! One line per distinct stack: frames ROOT FIRST separated by `;`, then a space and the
//! sample count. The frames of a line are:
//! 1. `<comm> (pid <pid>)` (see [`super::UNKNOWN_COMM`] for unlabelled processes);
//! 2. `thread <tid>`, only when recording per thread, followed by ` <name>` when the
//!    thread's OS name is known (`/proc/PID/task/TID/comm`, sanitized as below and cut to
//!    [`super::MAX_THREAD_NAME_CHARS`] characters);
//! 3. each Python frame as `<function> (<file>:<line>)`, or `<function> (<file>)` when the
//!    line is unknown (0); a stack with no Python frames ends in
//!    [`super::NO_PYTHON_FRAMES`] instead.
//!
//! Names are sanitized so they cannot break the format: every `;` becomes `,` (a `;` would
//! split a frame in two) and every control character (newline, carriage return, tab, ...)
//! becomes a space (a newline would split the line). If sanitizing makes two stacks identical,
//! their counts are summed into one line. Lines are sorted bytewise, so the output is
//! deterministic.

use std::borrow::Cow;
use std::io::{BufWriter, Write};

use crate::sample::aggregate::{FrameId, FrameName, Profile};

use super::{Format, NO_PYTHON_FRAMES, OutputError, container_frames, process_name, thread_name_text};

/// What a `;` inside a name is replaced with.
pub const SEMICOLON_REPLACEMENT: char = ',';
/// What a control character (e.g. a newline) inside a name is replaced with.
pub const CONTROL_REPLACEMENT: char = ' ';

/// Writes the folded stacks of `profile` to `out`, one `stack count\n` line per stack.
pub fn write(profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
    let wrap = OutputError::write(Format::Collapsed);
    let mut out = BufWriter::new(out);
    let result = folded_stacks(profile)
        .iter()
        .try_for_each(|(stack, count)| writeln!(out, "{stack} {count}"))
        .and_then(|()| out.flush());
    result.map_err(wrap)
}

/// The stacks of `profile` as folded text without the count, paired with their counts:
/// sorted by the text, each text unique (counts of stacks that sanitize to the same text are
/// summed, saturating).
pub fn folded_stacks(profile: &Profile) -> Vec<(String, u64)> {
    let names = FrameTexts::new(profile);
    let mut processes: Vec<(u32, String)> = Vec::new();
    let mut stacks: Vec<(String, u64)> = Vec::with_capacity(profile.stack_count());
    for (key, count) in profile.stacks() {
        let process = match processes.binary_search_by_key(&key.pid, |(pid, _)| *pid) {
            Ok(i) => &processes[i].1,
            Err(i) => {
                let mut name = sanitize(&process_name(profile, key.pid)).into_owned();
                for frame in container_frames(profile, key.pid).iter().rev() {
                    name = format!("{};{name}", sanitize(frame));
                }
                processes.insert(i, (key.pid, name));
                &processes[i].1
            }
        };
        let mut line = String::with_capacity(process.len() + 24 * (key.frames.len() + 1));
        line.push_str(process);
        if let Some(tid) = key.tid {
            line.push_str(";thread ");
            line.push_str(&tid.to_string());
            if let Some(name) = thread_name_text(profile, tid) {
                line.push(' ');
                line.push_str(&name);
            }
        }
        if key.frames.is_empty() {
            line.push(';');
            line.push_str(NO_PYTHON_FRAMES);
        }
        for &id in &key.frames {
            line.push(';');
            line.push_str(&names.get(profile, id));
        }
        stacks.push((line, count));
    }
    stacks.sort_unstable();
    stacks.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.saturating_add(later.1);
        }
        same
    });
    stacks
}

/// Folded text of one frame: `<function> (<file>:<line>)`, or `<function> (<file>)` when the
/// line is unknown, or `<function>` alone without a file (kernel frames, markers, native
/// frames without a symbol); sanitized.
pub fn frame_text(frame: &FrameName) -> String {
    let function = sanitize(&frame.function);
    let file = sanitize(&frame.file);
    if file.is_empty() {
        // Not a Python function: `task <name>`, `interpreter <id>`, `<off-cpu: sleep>`...
        function.into_owned()
    } else if frame.line == 0 {
        format!("{function} ({file})")
    } else {
        format!("{function} ({file}:{})", frame.line)
    }
}

/// `text` with every `;` replaced by [`SEMICOLON_REPLACEMENT`] and every control character by
/// [`CONTROL_REPLACEMENT`]; borrowed when nothing needed replacing.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c == ';' || c.is_control();
    if !text.contains(unsafe_char) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                ';' => SEMICOLON_REPLACEMENT,
                c if c.is_control() => CONTROL_REPLACEMENT,
                c => c,
            })
            .collect(),
    )
}

/// Folded text of every interned frame, computed once per write.
struct FrameTexts(Vec<String>);

impl FrameTexts {
    fn new(profile: &Profile) -> Self {
        let count = u32::try_from(profile.frame_count()).unwrap_or(u32::MAX);
        FrameTexts((0..count).map(|id| frame_text(profile.frame(id))).collect())
    }

    /// The text of `id`; an id the profile never handed out is formatted on the spot (as the
    /// profile's placeholder frame).
    fn get<'a>(&'a self, profile: &Profile, id: FrameId) -> Cow<'a, str> {
        match usize::try_from(id).ok().and_then(|i| self.0.get(i)) {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(frame_text(profile.frame(id))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::sample_profile;

    #[test]
    fn exact_text() {
        let mut out = Vec::new();
        let written = write(&sample_profile(), &mut out);
        assert!(written.is_ok(), "{written:?}");
        let text = String::from_utf8(out).unwrap_or_default();
        let expected = "\
[unknown] (pid 300);main (/srv/app.py:10) 1
gunicorn (pid 200);thread 201;<module> (/srv/app.py:3);main (/srv/app.py:10) 4
gunicorn (pid 200);thread 202;<module> (/srv/app.py:3);main (/srv/app.py:10);work (/srv/lib.py) 5
gunicorn (pid 200);thread 202;[no Python frames] 2
python3 (pid 100);<module> (/srv/app.py:3);main (/srv/app.py:10) 3
python3 (pid 100);<module> (/srv/app.py:3);main (/srv/app.py:10);work (/srv/lib.py) 3
python3 (pid 100);<module> (/srv/app.py:3);odd,name x (/srv/we,ird.py:5) 1
";
        assert_eq!(text, expected);
        // Every line still has exactly the intended number of frames and a count.
        for line in text.lines() {
            let (stack, count) = line.rsplit_once(' ').unwrap_or_default();
            assert!(count.parse::<u64>().is_ok(), "{line}");
            assert!(!stack.split(';').any(str::is_empty), "{line}");
        }
    }

    #[test]
    fn sanitizing_collisions_are_merged() {
        use crate::sample::aggregate::FrameName;
        use std::sync::Arc;
        let mut p = Profile::new();
        let a = p.intern(FrameName {
            function: Arc::from("f;g"),
            file: Arc::from("m.py"),
            line: 1,
            native: None,
        });
        let b = p.intern(FrameName {
            function: Arc::from("f,g"),
            file: Arc::from("m.py"),
            line: 1,
            native: None,
        });
        p.add(1, None, &[a], 2);
        p.add(1, None, &[b], 3);
        assert_eq!(
            folded_stacks(&p),
            vec![("[unknown] (pid 1);f,g (m.py:1)".to_owned(), 5)]
        );
    }

    #[test]
    fn thread_names_follow_the_tid() {
        let mut p = sample_profile();
        p.set_thread_name(201, "web;worker\nx");
        let stacks: Vec<String> = folded_stacks(&p).into_iter().map(|(s, _)| s).collect();
        assert!(stacks.contains(&"gunicorn (pid 200);thread 201 web,worker x;<module> (/srv/app.py:3);main (/srv/app.py:10)".to_string()), "{stacks:?}");
        assert!(stacks.iter().any(|s| s.starts_with("gunicorn (pid 200);thread 202;")), "{stacks:?}");
    }

    #[test]
    fn sanitize_borrows_clean_text() {
        assert!(matches!(sanitize("plain name"), Cow::Borrowed(_)));
        assert_eq!(sanitize("a;b\r\nc\td"), "a,b  c d");
    }

    #[test]
    fn empty_profile_writes_nothing() {
        let mut out = Vec::new();
        assert!(write(&Profile::new(), &mut out).is_ok());
        assert!(out.is_empty());
    }
}
