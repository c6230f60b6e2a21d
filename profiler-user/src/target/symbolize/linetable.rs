//! Instruction byte offset → source line, for the three encodings of a code object's line
//! table (notes §4). Pure functions over bytes read from a target.
//!
//! Invariants, for every function here:
//! - never panics and never indexes out of bounds, whatever the bytes;
//! - every loop consumes at least one table byte per iteration, so it ends after at most
//!   `table.len()` iterations (a varint is additionally capped at `MAX_VARINT_BYTES`);
//! - line arithmetic is done in `i64` with saturation; a result that is not a valid `u32`
//!   (a negative line, which only a corrupt table produces) is reported as `None`.
//!
//! `None` means "no line": the instruction has no line in the table (3.10 `-128` entries,
//! 3.11+ `NONE` entries, which CPython reports as `None`/`-1`), the offset lies past the end
//! of a 3.10+ table, or the table is corrupt. Callers that need *some* line (e.g. to group a
//! sample) may fall back to `firstlineno`; this module does not, so that the difference stays
//! visible.

use crate::target::layout::LineTableFormat;

/// A 3.11+ varint holds at most 32 bits: 6 bits per byte, so 6 bytes.
const MAX_VARINT_BYTES: usize = 6;

/// The line of the instruction at `byte_offset` (bytes from the start of the bytecode).
///
/// A negative offset (3.11/3.12 `prev_instr` before the first instruction, or the kernel's
/// "unknown" marker) gives `firstlineno`, as `PyCode_Addr2Line` does. See the module
/// documentation for when the result is `None`.
pub fn line_for_offset(format: LineTableFormat, table: &[u8], firstlineno: u32, byte_offset: i32) -> Option<u32> {
    let Ok(offset) = u32::try_from(byte_offset) else {
        return Some(firstlineno);
    };
    let decode = match format {
        LineTableFormat::Lnotab => lnotab_line,
        LineTableFormat::PairTable => pair_table_line,
        LineTableFormat::LocationTable => location_table_line,
    };
    decode(table, firstlineno, offset)
}

/// 3.8/3.9 `co_lnotab`: pairs `(u8 byte step, i8 line step)`. The line of `offset` is
/// `firstlineno` plus the line steps of every pair whose cumulative byte address is at most
/// `offset`. There is no "no line" value and no end: an offset past the last pair gets the
/// last line. A trailing odd byte is ignored.
pub fn lnotab_line(table: &[u8], firstlineno: u32, offset: u32) -> Option<u32> {
    let offset = i64::from(offset);
    let mut line = i64::from(firstlineno);
    let mut address: i64 = 0;
    for pair in table.chunks_exact(2) {
        address += i64::from(pair[0]);
        if address > offset {
            break;
        }
        line = line.saturating_add(i64::from(pair[1] as i8));
    }
    to_line(line)
}

/// 3.10 `co_linetable`: pairs `(u8 byte step, i8 line step)`, each covering the byte range
/// `[end, end + step)`; a line step of `-128` marks a range with no line (and leaves the
/// running line unchanged). Zero-length ranges only carry line steps. An offset past the
/// last range has no line.
pub fn pair_table_line(table: &[u8], firstlineno: u32, offset: u32) -> Option<u32> {
    const NO_LINE: i8 = -128;
    let offset = i64::from(offset);
    let mut line = i64::from(firstlineno);
    let mut end: i64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let step = pair[1] as i8;
        let current = if step == NO_LINE {
            None
        } else {
            line = line.saturating_add(i64::from(step));
            Some(line)
        };
        if start <= offset && offset < end {
            return current.and_then(to_line);
        }
    }
    None
}

/// How a 3.11+ location entry changes the running line, by entry code (bits 6-3 of its
/// first byte).
#[derive(Clone, Copy)]
enum LineStep {
    /// The line is unchanged (codes 0-9 SHORT, 10 ONE_LINE0).
    Same,
    /// A fixed step (11 ONE_LINE1, 12 ONE_LINE2).
    Fixed(i8),
    /// A signed varint follows the first byte (13 NO_COLUMNS, 14 LONG).
    Varint,
    /// The entry has no line; the running line is unchanged (15 NONE).
    NoLine,
}

const LINE_STEPS: [LineStep; 16] = {
    let mut steps = [LineStep::Same; 16];
    steps[11] = LineStep::Fixed(1);
    steps[12] = LineStep::Fixed(2);
    steps[13] = LineStep::Varint;
    steps[14] = LineStep::Varint;
    steps[15] = LineStep::NoLine;
    steps
};

/// 3.11+ location table. Each entry starts with a byte with bit 7 set: bits 6-3 are the
/// entry code (`LINE_STEPS`), bits 2-0 the number of 2-byte code units covered minus one.
/// Continuation bytes (columns, end lines) have bit 7 clear and are skipped, as CPython
/// does. An offset past the last entry, a `NONE` entry, a table that does not start with an
/// entry byte or a varint cut short has no line.
pub fn location_table_line(table: &[u8], firstlineno: u32, offset: u32) -> Option<u32> {
    let offset = i64::from(offset);
    let mut line = i64::from(firstlineno);
    let mut address: i64 = 0;
    let mut pos = 0;
    while let Some(&first) = table.get(pos) {
        if first & 0x80 == 0 {
            return None; // Only the very first byte can get here: the table is corrupt.
        }
        let code = usize::from((first >> 3) & 0x0f);
        let units = i64::from(first & 0x07) + 1;
        let rest = table.get(pos + 1..).unwrap_or(&[]);
        let current = match LINE_STEPS[code] {
            LineStep::Same => Some(line),
            LineStep::Fixed(step) => {
                line = line.saturating_add(i64::from(step));
                Some(line)
            }
            LineStep::Varint => {
                line = line.saturating_add(read_svarint(rest)?);
                Some(line)
            }
            LineStep::NoLine => None,
        };
        let end = address + 2 * units;
        if address <= offset && offset < end {
            return current.and_then(to_line);
        }
        address = end;
        // Skip to the next entry byte; `rest` starts after `first`, so this always advances.
        pos += 1 + rest.iter().take_while(|&&b| b & 0x80 == 0).count();
    }
    None
}

/// An unsigned 3.11+ varint: 6-bit groups, least significant first, bit 6 = more follow.
/// `None` if it runs past `bytes` or beyond 32 bits.
fn read_varint(bytes: &[u8]) -> Option<u32> {
    let mut value: u32 = 0;
    for (i, &b) in bytes.iter().take(MAX_VARINT_BYTES).enumerate() {
        let group = u32::from(b & 0x3f);
        let shift = 6 * i as u32;
        value |= group.checked_shl(shift).filter(|v| v >> shift == group)?;
        if b & 0x40 == 0 {
            return Some(value);
        }
    }
    None
}

/// A signed varint: the low bit is the sign, the rest the magnitude.
fn read_svarint(bytes: &[u8]) -> Option<i64> {
    let v = read_varint(bytes)?;
    let magnitude = i64::from(v >> 1);
    Some(if v & 1 == 1 { -magnitude } else { magnitude })
}

fn to_line(line: i64) -> Option<u32> {
    u32::try_from(line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One code object of a fixture (see `fixtures/gen_linetables.py`).
    #[derive(serde::Deserialize)]
    pub(super) struct FixtureCode {
        qualname: String,
        firstlineno: u32,
        pub(super) code_len: u32,
        /// `PyCode_Addr2Line(code, -2)`.
        negative: i64,
        pub(super) table: String,
        /// `[start, end, line]` byte ranges, end exclusive; `None` = no line.
        lines: Vec<(u32, u32, Option<u32>)>,
    }

    #[derive(serde::Deserialize)]
    pub(super) struct Fixture {
        python: String,
        format: String,
        pub(super) functions: Vec<FixtureCode>,
    }

    const FIXTURES: [(&str, &str); 8] = [
        ("3.8", include_str!("fixtures/linetables_3.8.json")),
        ("3.9", include_str!("fixtures/linetables_3.9.json")),
        ("3.10", include_str!("fixtures/linetables_3.10.json")),
        ("3.11", include_str!("fixtures/linetables_3.11.json")),
        ("3.12", include_str!("fixtures/linetables_3.12.json")),
        ("3.13", include_str!("fixtures/linetables_3.13.json")),
        ("3.14", include_str!("fixtures/linetables_3.14.json")),
        ("3.15", include_str!("fixtures/linetables_3.15.json")),
    ];

    fn format_of(name: &str) -> LineTableFormat {
        match name {
            "lnotab" => LineTableFormat::Lnotab,
            "pair_table" => LineTableFormat::PairTable,
            "location_table" => LineTableFormat::LocationTable,
            other => panic!("unknown format {other}"),
        }
    }

    pub(super) fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("fixture hex")).collect()
    }

    pub(super) fn load() -> Vec<(Fixture, LineTableFormat)> {
        FIXTURES
            .iter()
            .map(|(minor, text)| {
                let f: Fixture = serde_json::from_str(text).expect("fixture json");
                assert!(f.python.starts_with(&format!("{minor}.")), "{} in {minor}", f.python);
                let format = format_of(&f.format);
                (f, format)
            })
            .collect()
    }

    /// Every instruction offset of every code object agrees with what the interpreter that
    /// compiled it reports (`PyCode_Addr2Line`, cross-checked by the generator against
    /// `dis.findlinestarts` / `co_lines()` / `co_positions()`).
    #[test]
    fn matches_interpreters_at_every_offset() {
        let mut checked = 0usize;
        for (fixture, format) in load() {
            assert!(!fixture.functions.is_empty());
            for code in &fixture.functions {
                let table = unhex(&code.table);
                let mut covered = 0;
                for &(start, end, expected) in &code.lines {
                    assert_eq!(start, covered, "{} {}: runs are contiguous", fixture.python, code.qualname);
                    covered = end;
                    for offset in (start..end).step_by(2) {
                        let got = line_for_offset(format, &table, code.firstlineno, offset as i32);
                        assert_eq!(got, expected, "python {} {} offset {offset}", fixture.python, code.qualname);
                        checked += 1;
                    }
                }
                assert_eq!(covered, code.code_len, "{} {}", fixture.python, code.qualname);
                assert_eq!(
                    line_for_offset(format, &table, code.firstlineno, -2).map(i64::from),
                    Some(code.negative),
                    "python {} {} offset -2",
                    fixture.python,
                    code.qualname
                );
            }
        }
        assert!(checked > 10_000, "only {checked} offsets checked");
    }

    /// The fixtures exercise what they are meant to: no-line entries in 3.10+, long line
    /// steps (3.11+ multi-byte varints, 3.8-3.10 127-line pairs), large byte steps.
    #[test]
    fn fixtures_cover_the_hard_cases() {
        for (fixture, format) in load() {
            let any_no_line = fixture.functions.iter().any(|c| c.lines.iter().any(|r| r.2.is_none()));
            assert_eq!(any_no_line, format != LineTableFormat::Lnotab, "{}", fixture.python);
            let max_line = fixture.functions.iter().flat_map(|c| c.lines.iter().filter_map(|r| r.2)).max();
            assert!(max_line > Some(70_000), "{}: the module-level gap", fixture.python);
        }
    }

    #[test]
    fn negative_offsets_give_firstlineno() {
        for format in [LineTableFormat::Lnotab, LineTableFormat::PairTable, LineTableFormat::LocationTable] {
            assert_eq!(line_for_offset(format, &[], 7, -2), Some(7));
            assert_eq!(line_for_offset(format, &[0xff; 9], 7, i32::MIN), Some(7));
        }
    }

    #[test]
    fn lnotab_by_hand() {
        // 0..6 line 200, 6..10 line 202, then -128 lines (a plain step in this format), a
        // 255-byte step, then +100 lines.
        let t = [0, 0, 6, 2, 4, 0x80u8, 255, 0, 1, 100];
        let l = |o| lnotab_line(&t, 200, o);
        assert_eq!((l(0), l(4), l(6), l(8)), (Some(200), Some(200), Some(202), Some(202)));
        assert_eq!((l(10), l(265), l(266), l(100_000)), (Some(74), Some(74), Some(174), Some(174)));
        assert_eq!(lnotab_line(&t[..3], 200, 1000), Some(200), "odd byte ignored");
        assert_eq!(lnotab_line(&[0, 0x80], 10, 0), None, "a negative line");
    }

    #[test]
    fn pair_table_by_hand() {
        let t = [0, 3, 4, 0, 4, 0x80, 2, 1];
        let l = |o| pair_table_line(&t, 1, o);
        assert_eq!((l(0), l(2), l(4), l(6), l(8), l(10)), (Some(4), Some(4), None, None, Some(5), None));
    }

    #[test]
    fn location_table_by_hand() {
        // ONE_LINE1 x2 units; NONE x1; LONG +130 (varint 260 = 0x44 0x04) with 3 column
        // bytes, x1; SHORT x1 with 1 column byte; NO_COLUMNS -3 (varint 7) x1.
        let t =
            [0x80 | 11 << 3 | 1, 0, 0, 0x80 | 15 << 3, 0x80 | 14 << 3, 0x44, 0x04, 0, 1, 2, 0x80, 5, 0x80 | 13 << 3, 7];
        let l = |o| location_table_line(&t, 100, o);
        assert_eq!(
            (l(0), l(2), l(4), l(6), l(8), l(10), l(12)),
            (Some(101), Some(101), None, Some(231), Some(231), Some(228), None)
        );
        assert_eq!(location_table_line(&[0x05, 0x80], 1, 0), None, "no entry byte first");
        assert_eq!(location_table_line(&[0x80 | 14 << 3, 0x41], 1, 0), None, "cut varint");
        assert_eq!(
            location_table_line(&[0x80 | 14 << 3, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x01], 1, 0),
            None,
            "varint too long"
        );
    }

    /// Garbage, truncated and mutated tables never panic, and every call terminates.
    #[test]
    fn garbage_never_panics() {
        let mut state: u64 = 0x1234_5678_9abc_def0;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let formats = [LineTableFormat::Lnotab, LineTableFormat::PairTable, LineTableFormat::LocationTable];
        for _ in 0..2000 {
            let len = (next() % 64) as usize;
            let table: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            for format in formats {
                for _ in 0..8 {
                    let _ = line_for_offset(format, &table, next() as u32, next() as i32);
                }
                let _ = line_for_offset(format, &table, u32::MAX, i32::MAX);
            }
        }
        for (fixture, format) in load() {
            for code in fixture.functions.iter().take(4) {
                let mut table = unhex(&code.table);
                for cut in 0..table.len() {
                    let _ = line_for_offset(format, &table[..cut], code.firstlineno, code.code_len as i32 / 2);
                }
                for i in 0..table.len() {
                    table[i] ^= next() as u8;
                    let _ = line_for_offset(format, &table, code.firstlineno, (next() % 4096) as i32);
                }
            }
        }
    }
}

#[cfg(test)]
mod fuzz {
    use std::sync::LazyLock;

    use proptest::prelude::*;

    use super::tests::{load, unhex};
    use super::*;
    use crate::fuzzing::config;

    /// Real tables of every fixture, by format: `(format, table, code length)`.
    static TABLES: LazyLock<Vec<(LineTableFormat, Vec<u8>, u32)>> = LazyLock::new(|| {
        load()
            .into_iter()
            .flat_map(|(fixture, format)| {
                fixture.functions.into_iter().map(move |code| (format, unhex(&code.table), code.code_len))
            })
            .collect()
    });

    /// A real table with a few bytes changed, cut or extended; or random bytes.
    fn table() -> impl Strategy<Value = (LineTableFormat, Vec<u8>, u32)> {
        let formats = vec![LineTableFormat::Lnotab, LineTableFormat::PairTable, LineTableFormat::LocationTable];
        prop_oneof![
            (0..TABLES.len(), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6), any::<prop::sample::Index>())
                .prop_map(|(i, flips, cut)| {
                    let (format, mut table, len) = TABLES[i].clone();
                    if !table.is_empty() {
                        for (at, value) in flips {
                            let at = at.index(table.len());
                            table[at] = value;
                        }
                        table.truncate(cut.index(table.len() + 1));
                    }
                    (format, table, len)
                }),
            (prop::sample::select(formats), prop::collection::vec(any::<u8>(), 0..256), any::<u32>())
                .prop_map(|(format, table, len)| (format, table, len)),
        ]
    }

    proptest! {
        #![proptest_config(config(512))]

        /// Any table, any first line, any offset: no panic (overflow included, in debug
        /// builds), and a line is never conjured for a table that has no entry.
        #[test]
        fn fuzz_line_tables((format, table, len) in table(), firstlineno in prop_oneof![any::<u32>(), 0u32..1000], offsets in prop::collection::vec(any::<i32>(), 1..8)) {
            for offset in offsets.into_iter().chain([0, (len / 2) as i32, len as i32, i32::MAX, -1]) {
                let line = line_for_offset(format, &table, firstlineno, offset);
                if table.is_empty() && offset >= 0 && format != LineTableFormat::Lnotab {
                    prop_assert_eq!(line, None);
                }
            }
        }

        #[test]
        fn fuzz_varints(bytes in prop::collection::vec(any::<u8>(), 0..12)) {
            if read_varint(&bytes).is_some() {
                prop_assert!(bytes.iter().take(MAX_VARINT_BYTES).any(|b| b & 0x40 == 0));
            }
            let _ = read_svarint(&bytes);
        }
    }
}
