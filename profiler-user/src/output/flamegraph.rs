//! Interactive SVG flame graphs, drawn by `inferno` from the folded stacks of [`super::collapsed`].
//!
//! The frames are exactly those of the collapsed format (process, optional thread, Python
//! frames root first), coloured with inferno's Python palette (stdlib yellow, site-packages
//! aqua, the rest red) and a name hash, so the same function keeps its colour between runs.
//! The SVG is rendered into memory first: if inferno fails, nothing is written to `out`.
//!
//! The SVG always parses as XML whatever the targets named their functions and files: the
//! folded stacks hold no control character (see [`collapsed::sanitize`]), inferno escapes
//! `&`, `<`, `>` and quotes, and the two remaining characters XML 1.0 forbids, U+FFFE and
//! U+FFFF, are replaced by U+FFFD here ([`xml_safe`]).

use std::io::Write;

use inferno::flamegraph::{self, Options, Palette, color::MultiPalette};

use super::{Format, OutputError, collapsed};

/// Writes `profile` to `out` as an SVG flame graph headed `title`.
///
/// An empty profile is an error ([`OutputError::NoSamples`]), not an SVG with an error
/// message in it.
pub fn write(
    profile: &crate::sample::aggregate::Profile,
    title: &str,
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let lines: Vec<String> = collapsed::folded_stacks(profile)
        .into_iter()
        .map(|(stack, count)| format!("{} {count}", xml_safe(&stack)))
        .collect();
    if lines.is_empty() {
        return Err(OutputError::NoSamples);
    }

    let mut options = Options::default();
    options.title = title.to_owned();
    options.subtitle = Some(super::recording_line(profile));
    options.count_name = "samples".to_owned();
    options.colors = Palette::Multi(MultiPalette::Python);
    options.hash = true;

    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(OutputError::Flamegraph)?;
    out.write_all(&svg)
        .and_then(|()| out.flush())
        .map_err(OutputError::write(Format::Flamegraph))
}

/// Whether XML 1.0 allows `c` in a document (its `Char` production).
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

/// `text` with every character XML forbids replaced by U+FFFD.
fn xml_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().all(is_xml_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars().map(|c| if is_xml_char(c) { c } else { '\u{fffd}' }).collect::<String>().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::aggregate::Profile;
    use crate::output::tests::sample_profile;

    fn svg_of(profile: &Profile, title: &str) -> Result<String, OutputError> {
        let mut out = Vec::new();
        write(profile, title, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn svg_contains_names() {
        let svg = svg_of(&sample_profile(), "pyperch test & <title>");
        let svg = match svg {
            Ok(svg) => svg,
            Err(e) => panic!("flame graph failed: {e}"),
        };
        assert!(svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        for name in [
            "python3 (pid 100)",
            "gunicorn (pid 200)",
            "thread 202",
            "&lt;module&gt; (/srv/app.py:3)",
            "main (/srv/app.py:10)",
            "work (/srv/lib.py)",
            "odd,name x (/srv/we,ird.py:5)",
            "[no Python frames]",
        ] {
            assert!(svg.contains(name), "SVG lacks {name}");
        }
        assert!(svg.contains("pyperch test &amp; &lt;title&gt;"));
        assert!(svg.contains("samples"));
    }

    #[test]
    fn thread_frames_show_the_thread_name() {
        let mut p = sample_profile();
        p.set_thread_name(201, "web<1>&");
        let svg = svg_of(&p, "t").unwrap_or_else(|e| panic!("flame graph failed: {e}"));
        assert!(svg.contains("thread 201 web&lt;1&gt;&amp;"), "the thread frame lacks its name");
        assert!(svg.contains("thread 202"));
    }

    #[test]
    fn empty_profile_is_an_error() {
        let mut out = Vec::new();
        let result = write(&Profile::new(), "t", &mut out);
        assert!(matches!(result, Err(OutputError::NoSamples)), "{result:?}");
        assert!(out.is_empty());
    }

    #[test]
    fn hostile_names_keep_the_svg_well_formed() {
        use crate::sample::aggregate::{FrameName, ProcessLabel};
        use std::sync::Arc;
        let mut p = Profile::new();
        let f = p.intern(FrameName {
            function: Arc::from("evil\x1b[2J\u{7}\u{fffe}<x>&\u{202e}\u{ffff}\u{85}"),
            file: Arc::from("/tmp/a\nb\u{0}.py"),
            line: 1,
            native: None,
        });
        p.set_process(7, ProcessLabel { comm: "py\x1b]0;t\x07\u{fffe}".into(), ..Default::default() });
        p.add(7, None, &[f], 3);
        let svg = match svg_of(&p, "t") {
            Ok(svg) => svg,
            Err(e) => panic!("flame graph failed: {e}"),
        };
        let bad: Vec<char> = svg.chars().filter(|c| !is_xml_char(*c)).collect();
        assert!(bad.is_empty(), "characters XML forbids: {bad:?}");
        // inferno folds runs of spaces into one.
        for part in ["evil [2J \u{fffd}&lt;x&gt;&amp;\u{202e}\u{fffd}", "(/tmp/a b .py:1)", "py ]0,t \u{fffd} (pid 7)"] {
            assert!(svg.contains(part), "SVG lacks {part:?}");
        }
    }
}
