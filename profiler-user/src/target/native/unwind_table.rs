//! Compact unwind rows of one file for a walk in the kernel (issue #31; the design is in
//! docs/native-unwinding-plan.md). Not wired to the kernel yet: this builds and checks the
//! table a BPF map will hold.
//!
//! From a file's `.eh_frame` (gimli reads it), one [`Row`] per address range whose rules
//! differ from the previous range's: where the canonical frame address (CFA) is (`rsp + n`,
//! `rbp + n`, or the `.plt` expression), and where the caller's `rbp` was saved (`CFA + n`)
//! or that it is unchanged. On x86_64 the return address is always at `CFA - 8`, so it needs
//! no column. Ranges no FDE covers get a row of kind [`Cfa::None`] (the walk stops there
//! and says why).
//!
//! Invariants: rows are sorted by `pc`, strictly increasing, with no two neighbours equal
//! but for their `pc`; at most `max_rows` are built (a file claiming more is refused, not
//! cut: a cut table would unwind part of the file with the wrong rules); every offset fits
//! an `i32` or the range's rule is [`Cfa::Unsupported`].

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection, X86_64,
};

/// Where the canonical frame address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cfa {
    /// `rsp + n`.
    Rsp(i32),
    /// `rbp + n`.
    Rbp(i32),
    /// A DWARF expression: in practice the `.plt` stubs' `rsp + 8 + ((rip & 15) >= 11) * 8`.
    Expression,
    /// A rule the kernel walk does not follow (another register, an out-of-range offset).
    Unsupported,
    /// No FDE covers the address.
    None,
}

/// Where the caller's `rbp` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedRbp {
    /// Not saved by this frame: the caller's `rbp` is the current one.
    Same,
    /// Saved at `CFA + n`.
    AtCfa(i32),
    /// Another rule (the walk can go on without `rbp` only while no CFA needs it).
    Unknown,
}

/// The rules from `pc` (a file address) up to the next row's `pc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub pc: u64,
    pub cfa: Cfa,
    pub rbp: SavedRbp,
}

/// Why a file has no table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    #[error("its .eh_frame does not parse: {0}")]
    Parse(String),
    #[error("its .eh_frame describes more than {0} address ranges")]
    TooManyRows(usize),
}

impl From<gimli::Error> for TableError {
    fn from(e: gimli::Error) -> Self {
        TableError::Parse(e.to_string())
    }
}

/// The rows of `eh_frame` (the section's bytes, loaded at file address `eh_frame_address`;
/// `text_address` for FDEs whose pointers are text-relative), at most `max_rows`.
pub fn rows(eh_frame: &[u8], eh_frame_address: u64, text_address: Option<u64>, max_rows: usize) -> Result<Vec<Row>, TableError> {
    let section = EhFrame::new(eh_frame, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(eh_frame_address);
    if let Some(text) = text_address {
        bases = bases.set_text(text);
    }
    let mut context = Box::new(UnwindContext::new());
    // (start, end, cfa, rbp) of every table row, in FDE order.
    let mut ranges: Vec<(u64, u64, Cfa, SavedRbp)> = Vec::new();
    let mut entries = section.entries(&bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(|s, b, offset| s.cie_from_offset(b, offset)) else { continue };
        let mut table = fde.rows(&section, &bases, &mut context)?;
        while let Some(row) = table.next_row()? {
            if ranges.len() >= max_rows {
                return Err(TableError::TooManyRows(max_rows));
            }
            let cfa = match row.cfa() {
                CfaRule::RegisterAndOffset { register, offset } => match i32::try_from(*offset) {
                    Ok(n) if *register == X86_64::RSP => Cfa::Rsp(n),
                    Ok(n) if *register == X86_64::RBP => Cfa::Rbp(n),
                    _ => Cfa::Unsupported,
                },
                CfaRule::Expression(_) => Cfa::Expression,
            };
            let rbp = match row.register(X86_64::RBP) {
                RegisterRule::Undefined | RegisterRule::SameValue => SavedRbp::Same,
                RegisterRule::Offset(n) => i32::try_from(n).map_or(SavedRbp::Unknown, SavedRbp::AtCfa),
                _ => SavedRbp::Unknown,
            };
            if row.start_address() < row.end_address() {
                ranges.push((row.start_address(), row.end_address(), cfa, rbp));
            }
        }
    }
    ranges.sort_unstable_by_key(|r| r.0);
    let mut out: Vec<Row> = Vec::with_capacity(ranges.len());
    let mut covered_to = 0u64;
    for (start, end, cfa, rbp) in ranges {
        if start < covered_to {
            // Overlapping FDEs (rare, broken files): the first one's rules stand.
            if end <= covered_to {
                continue;
            }
        }
        if !out.is_empty() && start > covered_to {
            push(&mut out, Row { pc: covered_to, cfa: Cfa::None, rbp: SavedRbp::Unknown });
        }
        push(&mut out, Row { pc: start.max(covered_to), cfa, rbp });
        covered_to = end;
    }
    if !out.is_empty() {
        push(&mut out, Row { pc: covered_to, cfa: Cfa::None, rbp: SavedRbp::Unknown });
    }
    Ok(out)
}

/// Appends `row` unless it repeats the last one's rules.
fn push(out: &mut Vec<Row>, row: Row) {
    match out.last_mut() {
        Some(last) if last.cfa == row.cfa && last.rbp == row.rbp => {}
        Some(last) if last.pc == row.pc => *last = row,
        _ => out.push(row),
    }
}

/// The row that applies at `pc`, if any.
pub fn lookup(rows: &[Row], pc: u64) -> Option<&Row> {
    let i = rows.partition_point(|r| r.pc <= pc);
    rows.get(i.checked_sub(1)?)
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol};

    use super::*;

    /// (rows, symbol → address) of the file at `path`; `None` when it is not here.
    fn table_of(path: &str) -> Option<(Vec<Row>, std::collections::HashMap<String, u64>)> {
        let data = std::fs::read(path).ok()?;
        let file = object::File::parse(&*data).expect("ELF");
        let eh = file.section_by_name(".eh_frame").expect(".eh_frame");
        let text = file.section_by_name(".text").map(|s| s.address());
        let rows = rows(eh.data().expect("data"), eh.address(), text, 1 << 22).expect("rows");
        let symbols = file.dynamic_symbols().chain(file.symbols()).filter_map(|s| Some((s.name().ok()?.to_string(), s.address()))).collect();
        Some((rows, symbols))
    }

    fn check_invariants(rows: &[Row]) {
        for w in rows.windows(2) {
            assert!(w[0].pc < w[1].pc, "{:?} then {:?}", w[0], w[1]);
            assert!((w[0].cfa, w[0].rbp) != (w[1].cfa, w[1].rbp), "{:?} repeats {:?}", w[1], w[0]);
        }
    }

    /// libpython (pyenv 3.12, built with GCC's defaults): tens of thousands of rows, and at
    /// every function's first instruction the CFA is `rsp + 8` (the return address just
    /// pushed) with `rbp` untouched.
    #[test]
    fn libpython_rows() {
        let Some((rows, symbols)) = table_of("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0") else {
            eprintln!("skipping: pyenv 3.12.1 is not here");
            return;
        };
        check_invariants(&rows);
        assert!(rows.len() > 10_000, "{} rows", rows.len());
        for name in ["PyObject_Call", "_PyEval_EvalFrameDefault", "PyLong_FromLong", "PyDict_GetItem"] {
            let at = symbols[name];
            let row = lookup(&rows, at).unwrap_or_else(|| panic!("no row at {name}"));
            assert_eq!((row.cfa, row.rbp), (Cfa::Rsp(8), SavedRbp::Same), "{name} at {at:#x}");
        }
        let expressions = rows.iter().filter(|r| r.cfa == Cfa::Expression).count();
        let unsupported = rows.iter().filter(|r| r.cfa == Cfa::Unsupported).count();
        eprintln!("libpython3.12: {} rows, {expressions} expressions, {unsupported} unsupported", rows.len());
    }

    /// A function built with frame pointers: after its prologue the CFA is `rbp + 16` and the
    /// caller's `rbp` is at `CFA - 16`.
    #[test]
    fn frame_pointer_function() {
        let Some(cc) = ["cc", "gcc"].into_iter().find(|c| std::process::Command::new(c).arg("--version").output().is_ok()) else {
            eprintln!("skipping: no C compiler");
            return;
        };
        let dir = std::env::temp_dir().join(format!("pyperch-unwind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let source = dir.join("fp.c");
        std::fs::write(&source, "int fp_leaf(int x) { volatile int a[64]; a[x & 63] = x; return a[(x + 1) & 63]; }\n").expect("write");
        let lib = dir.join("libfp.so");
        let ok = std::process::Command::new(cc)
            .args(["-O1", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&source)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{cc} failed");
        let (rows, symbols) = table_of(&lib.to_string_lossy()).expect("the library");
        let _ = std::fs::remove_dir_all(&dir);
        check_invariants(&rows);
        let start = symbols["fp_leaf"];
        assert_eq!(lookup(&rows, start).map(|r| (r.cfa, r.rbp)), Some((Cfa::Rsp(8), SavedRbp::Same)));
        // Somewhere inside: the frame-pointer rule.
        let inside: Vec<&Row> = rows.iter().filter(|r| r.pc > start && r.pc < start + 64).collect();
        assert!(inside.iter().any(|r| r.cfa == Cfa::Rbp(16) && r.rbp == SavedRbp::AtCfa(-16)), "{inside:?}");
    }

    #[test]
    fn hostile_sections_are_errors_or_bounded() {
        assert_eq!(rows(&[], 0, None, 10), Ok(Vec::new()));
        // Garbage: an error or nothing, never a panic.
        let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let _ = rows(&junk, 0x1000, None, 1000);
        // A real table with a small cap: refused whole.
        if let Some(data) = std::fs::read("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0").ok() {
            let file = object::File::parse(&*data).expect("ELF");
            let eh = file.section_by_name(".eh_frame").expect(".eh_frame");
            assert_eq!(rows(eh.data().expect("data"), eh.address(), None, 100), Err(TableError::TooManyRows(100)));
        }
    }
}
