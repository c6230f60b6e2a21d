//! Source lines of native code, from a file's DWARF, built once when the file is loaded (on
//! the file's reader thread, never on the thread that drains samples) into a compact table
//! that lookups only search.
//!
//! Two sorted arrays: the rows of every line program (address → file, line), and the
//! outermost inlined calls (`DW_TAG_inlined_subroutine` directly inside a subprogram: its
//! ranges → the call's file and line). An address inside an inlined call is shown at the
//! call (the line in the function the symbol names), else at its line-program row: the same
//! location `addr2line` gives for the outermost frame.
//!
//! Bounded: at most [`MAX_ROWS`] rows, [`MAX_INLINED`] inlined ranges, [`MAX_ENTRIES`]
//! DWARF entries looked at and [`MAX_FILES`] file names per file; past any of them the
//! whole table is dropped (counted as `Refusal::LineRows`), never a partial table.

use std::{collections::HashMap, sync::Arc};

use addr2line::gimli;

use super::budget::Refusal;

/// Line-program rows kept per file (16 bytes each).
pub const MAX_ROWS: usize = 2_000_000;
/// Inlined-call ranges kept per file (24 bytes each).
pub const MAX_INLINED: usize = 1_000_000;
/// DWARF entries looked at per file.
pub const MAX_ENTRIES: usize = 8_000_000;
/// Distinct source file names per file.
pub const MAX_FILES: usize = 100_000;
/// Longer file names are not kept.
const MAX_PATH_BYTES: usize = 4096;
/// No file (a sequence's end).
const NO_FILE: u32 = u32::MAX;

type Reader<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    address: u64,
    /// `NO_FILE` at a sequence's end.
    file: u32,
    line: u32,
}

#[derive(Clone, Copy, Debug)]
struct Inlined {
    start: u64,
    end: u64,
    file: u32,
    line: u32,
}

/// The line table of one file.
#[derive(Debug, Default)]
pub struct LineTable {
    files: Vec<Arc<str>>,
    rows: Vec<Row>,
    inlined: Vec<Inlined>,
}

impl LineTable {
    /// Bytes held (approximate).
    pub fn bytes(&self) -> usize {
        self.rows.len() * 16 + self.inlined.len() * 24 + self.files.iter().map(|f| f.len() + 32).sum::<usize>()
    }

    /// `(source file, line)` of file address `address`: in the outermost function.
    pub fn line(&self, address: u64) -> Option<(Arc<str>, u32)> {
        let i = self.inlined.partition_point(|r| r.start <= address);
        if let Some(r) = i.checked_sub(1).and_then(|i| self.inlined.get(i)).filter(|r| address < r.end) {
            return Some((self.files.get(r.file as usize)?.clone(), r.line));
        }
        let i = self.rows.partition_point(|r| r.address <= address);
        let row = self.rows.get(i.checked_sub(1)?)?;
        if row.file == NO_FILE || row.line == 0 {
            return None;
        }
        Some((self.files.get(row.file as usize)?.clone(), row.line))
    }

    /// Builds the table from the DWARF sections `section(name)` gives (empty when absent).
    /// `Err(Refusal::LineRows)` (counted) when a budget is passed; `Ok(None)` when there are
    /// no lines or the DWARF is malformed.
    pub fn build<'a>(section: impl Fn(gimli::SectionId) -> &'a [u8]) -> Result<Option<LineTable>, Refusal> {
        let endian = gimli::RunTimeEndian::Little;
        let dwarf = gimli::Dwarf::load(|id| -> Result<Reader<'a>, ()> { Ok(gimli::EndianSlice::new(section(id), endian)) })
            .map_err(|()| Refusal::LineRows)?;
        let mut b = Builder { dwarf: &dwarf, table: LineTable::default(), names: HashMap::new(), entries: 0 };
        let result = b.all_units();
        match result {
            Err(Some(r)) => {
                r.count();
                Err(r)
            }
            // Malformed DWARF: no lines (what was read so far may be wrong).
            Err(None) => Ok(None),
            Ok(()) => {
                let mut table = b.table;
                // End markers sort before a new sequence's first row at the same address.
                table.rows.sort_by_key(|r| (r.address, r.file != NO_FILE));
                table.inlined.sort_by_key(|r| (r.start, r.end));
                table.rows.shrink_to_fit();
                table.inlined.shrink_to_fit();
                Ok((!table.rows.is_empty()).then_some(table))
            }
        }
    }
}

struct Builder<'d, 'a> {
    dwarf: &'d gimli::Dwarf<Reader<'a>>,
    table: LineTable,
    /// (unit offset, file index) → index in `table.files`.
    names: HashMap<(usize, u64), u32>,
    entries: usize,
}

/// `Err(Some(refusal))`: a budget passed; `Err(None)`: malformed.
type Step = Result<(), Option<Refusal>>;

impl<'a> Builder<'_, 'a> {
    fn all_units(&mut self) -> Step {
        let mut units = self.dwarf.units();
        while let Some(header) = units.next().map_err(|_| None)? {
            let unit_key = header.offset().as_debug_info_offset().map(|o| o.0).unwrap_or(0);
            let Ok(unit) = self.dwarf.unit(header) else { continue };
            self.line_rows(&unit, unit_key)?;
            self.inlined_calls(&unit, unit_key)?;
        }
        Ok(())
    }

    /// The index of file `index` of `unit`'s line program, named once.
    fn file(&mut self, unit: &gimli::Unit<Reader<'a>>, unit_key: usize, index: u64) -> Result<u32, Option<Refusal>> {
        if let Some(&i) = self.names.get(&(unit_key, index)) {
            return Ok(i);
        }
        if self.table.files.len() >= MAX_FILES {
            return Err(Some(Refusal::LineRows));
        }
        let name = self.path(unit, index).unwrap_or_else(|| "??".to_string());
        let i = self.table.files.len() as u32;
        self.table.files.push(Arc::from(name));
        self.names.insert((unit_key, index), i);
        Ok(i)
    }

    /// The path of file `index` of `unit`'s line program: `comp_dir/dir/name` as far as known.
    fn path(&self, unit: &gimli::Unit<Reader<'a>>, index: u64) -> Option<String> {
        let program = unit.line_program.as_ref()?;
        let header = program.header();
        let file = header.file(index)?;
        let text = |value| -> Option<String> {
            let r = self.dwarf.attr_string(unit, value).ok()?;
            Some(String::from_utf8_lossy(r.slice()).into_owned())
        };
        let name = text(file.path_name())?;
        let mut path = String::new();
        if !name.starts_with('/') {
            if let Some(dir) = file.directory(header).and_then(text) {
                if !dir.starts_with('/') {
                    if let Some(comp) = unit.comp_dir.as_ref() {
                        path.push_str(&String::from_utf8_lossy(comp.slice()));
                        path.push('/');
                    }
                }
                if !dir.is_empty() {
                    path.push_str(&dir);
                    path.push('/');
                }
            }
        }
        path.push_str(&name);
        (path.len() <= MAX_PATH_BYTES).then_some(path)
    }

    fn line_rows(&mut self, unit: &gimli::Unit<Reader<'a>>, unit_key: usize) -> Step {
        let Some(program) = unit.line_program.clone() else { return Ok(()) };
        let mut rows = program.rows();
        // Sequences the linker dropped start at 0: left out (they would overlap real code).
        let mut skipping = false;
        let mut first = true;
        loop {
            let (file_index, address, line, end) = match rows.next_row() {
                Ok(Some((_, row))) => (row.file_index(), row.address(), row.line().map_or(0, |l| l.get()), row.end_sequence()),
                Ok(None) => break,
                Err(_) => return Err(None),
            };
            if first {
                skipping = address == 0;
                first = false;
            }
            if end {
                first = true;
            }
            if skipping {
                continue;
            }
            if self.table.rows.len() >= MAX_ROWS {
                return Err(Some(Refusal::LineRows));
            }
            let file = if end { NO_FILE } else { self.file(unit, unit_key, file_index)? };
            let line = u32::try_from(line).unwrap_or(0);
            self.table.rows.push(Row { address, file, line });
        }
        Ok(())
    }

    fn inlined_calls(&mut self, unit: &gimli::Unit<Reader<'a>>, unit_key: usize) -> Step {
        let mut cursor = unit.entries();
        let mut depth: isize = 0;
        // Depths of the enclosing entries' tags (only as deep as needed).
        let mut tags: Vec<gimli::DwTag> = Vec::new();
        loop {
            let (delta, entry) = match cursor.next_dfs() {
                Ok(Some(found)) => found,
                Ok(None) => break,
                Err(_) => return Err(None),
            };
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(Some(Refusal::LineRows));
            }
            depth += delta;
            let Ok(at) = usize::try_from(depth) else { return Err(None) };
            tags.truncate(at);
            let parent = tags.last().copied();
            tags.push(entry.tag());
            if entry.tag() != gimli::DW_TAG_inlined_subroutine || parent != Some(gimli::DW_TAG_subprogram) {
                continue;
            }
            let file = match entry.attr_value(gimli::DW_AT_call_file) {
                Ok(Some(gimli::AttributeValue::FileIndex(f))) => f,
                Ok(Some(v)) => match v.udata_value() {
                    Some(f) => f,
                    None => continue,
                },
                _ => continue,
            };
            let line = match entry.attr_value(gimli::DW_AT_call_line) {
                Ok(Some(v)) => v.udata_value().and_then(|l| u32::try_from(l).ok()).unwrap_or(0),
                _ => 0,
            };
            if line == 0 {
                continue;
            }
            let Ok(mut ranges) = self.dwarf.die_ranges(unit, entry) else { continue };
            let file = self.file(unit, unit_key, file)?;
            while let Ok(Some(range)) = ranges.next() {
                if range.begin == 0 || range.begin >= range.end {
                    continue;
                }
                if self.table.inlined.len() >= MAX_INLINED {
                    return Err(Some(Refusal::LineRows));
                }
                self.table.inlined.push(Inlined { start: range.begin, end: range.end, file, line });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An address inside an outermost inlined call is shown at the call; elsewhere at its
    /// row; past a sequence's end, nowhere.
    #[test]
    fn lookups_prefer_the_inlined_call_site_and_stop_at_sequence_ends() {
        let table = LineTable {
            files: vec![Arc::from("/src/a.c"), Arc::from("/src/inl.h")],
            rows: vec![
                Row { address: 0x100, file: 0, line: 10 },
                Row { address: 0x110, file: 1, line: 3 },
                Row { address: 0x120, file: 0, line: 12 },
                Row { address: 0x130, file: NO_FILE, line: 0 },
            ],
            inlined: vec![Inlined { start: 0x110, end: 0x120, file: 0, line: 11 }],
        };
        assert_eq!(table.line(0x104), Some((Arc::from("/src/a.c"), 10)));
        assert_eq!(table.line(0x114), Some((Arc::from("/src/a.c"), 11)), "the call, not the inlined callee");
        assert_eq!(table.line(0x12f), Some((Arc::from("/src/a.c"), 12)));
        assert_eq!(table.line(0x130), None);
        assert_eq!(table.line(0x50), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Any bytes as DWARF: no panic, and a table (if any) within its budgets.
        #[test]
        fn any_dwarf_bytes_build_a_bounded_table_or_none(
            info in prop::collection::vec(any::<u8>(), 0..512),
            abbrev in prop::collection::vec(any::<u8>(), 0..128),
            line in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let section = |id: gimli::SectionId| -> &[u8] {
                match id {
                    gimli::SectionId::DebugInfo => &info,
                    gimli::SectionId::DebugAbbrev => &abbrev,
                    gimli::SectionId::DebugLine => &line,
                    _ => &[],
                }
            };
            if let Ok(Some(table)) = LineTable::build(section) {
                prop_assert!(table.rows.len() <= MAX_ROWS && table.inlined.len() <= MAX_INLINED && table.files.len() <= MAX_FILES);
            }
        }
    }
}
