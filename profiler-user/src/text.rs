//! Text that comes from a target (command names, paths, function and file names, anything
//! read from `/proc` or target memory), made safe to show a person.
//!
//! # The rule
//!
//! Everything pyperch prints for people (stderr warnings and errors, `list`, `--stats`, the
//! agent's log lines) shows target text through this module, so no byte of a target can move
//! the cursor, recolour the terminal, rewrite a line or fake a log line:
//!
//! - **Decoding** ([`decode`]): bytes that are not UTF-8 become the four characters `\xNN`
//!   (lower-case hex), one per byte; valid UTF-8 is kept. This is how `/proc` text (a
//!   command name cut mid-character, a path in another encoding) becomes a `String`.
//! - **Escaping** ([`escape`], [`field`], [`lines`]): every character that steers a terminal
//!   or a reader is replaced by a visible escape: `\t`, `\n`, `\r`; other C0 controls and
//!   DEL as `\xNN` (e.g. ESC is `\x1b`); C1 controls (U+0080-U+009F), the line and paragraph
//!   separators (U+2028, U+2029) and every format character (Unicode category Cf, listed in
//!   [`FORMAT_CHARS`]: the soft hyphen U+00AD, zero-width U+200B-U+200D and U+2060, the
//!   bidirectional controls U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF, the
//!   tag characters U+E0000-U+E007F, ...) as `\u{NNNN}` (e.g. `\u{202e}`): none of them
//!   shows as a glyph, so a name holding one could pass for another.
//!   Everything else, including a backslash, is shown as is: the escaped form is for reading,
//!   not a reversible encoding. Since `\xNN` with NN >= 80 only ever stands for a byte that
//!   was not UTF-8 (a C1 *character* is `\u{NN}`), the two cannot be confused.
//! - **Bounding** ([`field`]): one field (a command name, a path, a reason) shows at most
//!   [`MAX_FIELD_CHARS`] characters of its text, then `...`.
//!
//! Profiles (collapsed, speedscope, pprof, SVG) are data, not terminal text: names keep their
//! exact characters there except where the file format itself would break (see
//! `output::collapsed` and `output::flamegraph`).

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// At most this many characters of a thread's name are shown (a `comm` has at most 15 bytes,
/// 60 characters once its non-UTF-8 bytes are written `\xNN`; this bounds anything longer).
pub const MAX_THREAD_NAME_CHARS: usize = 64;

/// Characters of one field's text shown before it is cut short with `...`.
pub const MAX_FIELD_CHARS: usize = 512;

/// The format characters (Unicode 16 general category Cf, inclusive ranges), plus the
/// unassigned rest of the tag block (U+E0000-U+E007F) and U+2065 between the invisible
/// operators and the bidi isolates: none shows as a glyph.
pub const FORMAT_CHARS: &[(char, char)] = &[
    ('\u{00ad}', '\u{00ad}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061c}', '\u{061c}'),
    ('\u{06dd}', '\u{06dd}'),
    ('\u{070f}', '\u{070f}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08e2}', '\u{08e2}'),
    ('\u{180e}', '\u{180e}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{fff9}', '\u{fffb}'),
    ('\u{110bd}', '\u{110bd}'),
    ('\u{110cd}', '\u{110cd}'),
    ('\u{13430}', '\u{1343f}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0000}', '\u{e007f}'),
];

/// Whether `c` is replaced by a visible escape when shown (see the module docs).
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}')
        || (c >= '\u{00ad}' && FORMAT_CHARS.iter().any(|&(lo, hi)| c >= lo && c <= hi))
}

/// Text from a target as a `String`: invalid UTF-8 bytes become `\xNN`, the rest is kept.
pub fn decode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `text` shown with every unsafe character escaped (no length bound).
pub fn escape(text: &str) -> Escaped<'_> {
    Escaped { text, limit: None, keep_newlines: false }
}

/// One field of target text (a command name, a path, a reason): escaped and at most
/// [`MAX_FIELD_CHARS`] characters of it shown.
pub fn field(text: &str) -> Escaped<'_> {
    Escaped { text, limit: Some(MAX_FIELD_CHARS), keep_newlines: false }
}

/// Multi-line text pyperch wrote itself around target fields (an error chain, a profile for
/// a terminal): like [`escape`] but `\n` stays a line break. Use it only on text whose target
/// fields already went through [`field`] or [`escape`], so a target cannot add lines.
pub fn lines(text: &str) -> Escaped<'_> {
    Escaped { text, limit: None, keep_newlines: true }
}

/// A path (from the target or the user) as one shown field: decoded, escaped, bounded.
pub fn path(path: &Path) -> String {
    field(&decode(path.as_os_str().as_bytes())).to_string()
}

/// Target text being shown; see [`escape`], [`field`] and [`lines`].
#[derive(Clone, Copy, Debug)]
pub struct Escaped<'a> {
    text: &'a str,
    limit: Option<usize>,
    keep_newlines: bool,
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Runs of safe characters are written in one piece.
        let mut safe_from = 0;
        for (shown, (i, c)) in self.text.char_indices().enumerate() {
            let keep = !needs_escape(c) || (self.keep_newlines && c == '\n');
            let over = self.limit.is_some_and(|limit| shown >= limit);
            if keep && !over {
                continue;
            }
            f.write_str(&self.text[safe_from..i])?;
            safe_from = i + c.len_utf8();
            if over {
                return f.write_str("...");
            }
            match c {
                '\t' => f.write_str("\\t")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                c if (c as u32) < 0x80 => write!(f, "\\x{:02x}", c as u32)?,
                c => write!(f, "\\u{{{:x}}}", c as u32)?,
            }
        }
        f.write_str(&self.text[safe_from..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped() {
        assert_eq!(escape("py\x1b[31mred\x07").to_string(), "py\\x1b[31mred\\x07");
        assert_eq!(escape("a\tb\nc\rd\x7f").to_string(), "a\\tb\\nc\\rd\\x7f");
        assert_eq!(escape("c1\u{9b}2J").to_string(), "c1\\u{9b}2J");
        assert_eq!(escape("evil\u{202e}txt.py\u{2028}x\u{2066}").to_string(), "evil\\u{202e}txt.py\\u{2028}x\\u{2066}");
        assert_eq!(escape("plain ünïcode \\ é 名前").to_string(), "plain ünïcode \\ é 名前");
        assert_eq!(escape("").to_string(), "");
    }

    /// Issue #28 item 9: invisible format characters (zero-width space, soft hyphen, tag
    /// characters, bidi controls, every other Cf) are shown as escapes.
    #[test]
    fn format_characters_are_escaped() {
        assert_eq!(escape("a\u{200b}b\u{ad}c").to_string(), "a\\u{200b}b\\u{ad}c");
        assert_eq!(escape("flag\u{e0001}\u{e0041}\u{e007f}").to_string(), "flag\\u{e0001}\\u{e0041}\\u{e007f}");
        for c in ['\u{202a}', '\u{202d}', '\u{2067}', '\u{2069}', '\u{2060}', '\u{2064}', '\u{600}', '\u{feff}', '\u{fffb}', '\u{1d173}', '\u{180e}'] {
            assert!(needs_escape(c), "{:x}", c as u32);
        }
        for c in ['a', '\u{ac}', '\u{ae}', '\u{2010}', '\u{fffc}', '\u{e0080}', '名'] {
            assert!(!needs_escape(c), "{:x}", c as u32);
        }
    }

    #[test]
    fn lines_keep_line_breaks_only() {
        assert_eq!(lines("one\ntwo\x1b[2J\r\n").to_string(), "one\ntwo\\x1b[2J\\r\n");
    }

    #[test]
    fn invalid_utf8_becomes_hex() {
        // A 15-byte command name cut inside a three-byte character.
        let comm = b"python-\xe2\x82\xac\xe2\x82\xac\xe2\x82";
        assert_eq!(decode(comm), "python-€€\\xe2\\x82");
        assert_eq!(decode(b"\xff\x1bok"), "\\xff\x1bok");
        assert_eq!(escape(&decode(b"\xff\x1bok")).to_string(), "\\xff\\x1bok");
        assert_eq!(decode("ok".as_bytes()), "ok");
    }

    #[test]
    fn fields_are_bounded() {
        let long = "x".repeat(MAX_FIELD_CHARS + 10);
        let shown = field(&long).to_string();
        assert_eq!(shown.len(), MAX_FIELD_CHARS + 3);
        assert!(shown.ends_with("x..."));
        let exact = "é".repeat(MAX_FIELD_CHARS);
        assert_eq!(field(&exact).to_string(), exact);
        // The bound counts characters of the text, escapes included once each.
        let escapes = "\x1b".repeat(MAX_FIELD_CHARS + 1);
        assert_eq!(field(&escapes).to_string(), format!("{}...", "\\x1b".repeat(MAX_FIELD_CHARS)));
    }

    #[test]
    fn paths() {
        use std::ffi::OsStr;
        let p = Path::new(OsStr::from_bytes(b"/tmp/a\nb/\xffc\x1b.py"));
        assert_eq!(path(p), "/tmp/a\\nb/\\xffc\\x1b.py");
    }
}
