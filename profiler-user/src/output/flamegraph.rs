//! Interactive SVG flame graphs, drawn by `inferno` from the folded stacks of [`super::collapsed`].
//!
//! The frames are exactly those of the collapsed format (process, optional thread, Python
//! frames root first), coloured with inferno's Python palette (stdlib yellow, site-packages
//! aqua, the rest red) and a name hash, so the same function keeps its colour between runs.
//! The SVG is rendered into memory first: if inferno fails, nothing is written to `out`.

use std::io::Write;

use inferno::flamegraph::{self, Options, Palette, color::MultiPalette};

use super::{Format, OutputError, collapsed};

/// Writes `profile` to `out` as an SVG flame graph headed `title`.
///
/// An empty profile is an error ([`OutputError::NoSamples`]), not an SVG with an error
/// message in it.
pub fn write(
    profile: &crate::aggregate::Profile,
    title: &str,
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let lines: Vec<String> = collapsed::folded_stacks(profile)
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    if lines.is_empty() {
        return Err(OutputError::NoSamples);
    }

    let mut options = Options::default();
    options.title = title.to_owned();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Profile;
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
    fn empty_profile_is_an_error() {
        let mut out = Vec::new();
        let result = write(&Profile::new(), "t", &mut out);
        assert!(matches!(result, Err(OutputError::NoSamples)), "{result:?}");
        assert!(out.is_empty());
    }
}
