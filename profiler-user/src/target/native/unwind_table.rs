//! Compact unwind rows of one file for the walk in the kernel (`--native`; the design is in
//! docs/native-unwinding-plan.md): built here when a file is read (`module_file`), written
//! into the kernel's map by `kernel::unwind_tables` as [`compact`] rows. [`walk`] is the
//! kernel's walk in userspace, for the tests.
//!
//! From a file's `.eh_frame` ([`rows`]) and `.debug_frame` ([`debug_frame_rows`]), which
//! gimli reads, merged by [`merge`] (`.eh_frame` wins where both have an FDE, `.debug_frame`
//! fills the ranges `.eh_frame` leaves without one), one [`Row`] per address range whose rules
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
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
    X86_64,
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
    /// The return address is undefined (`.cfi_undefined rip`): the outermost frame, such as
    /// `_start` or a thread's start function.
    Outermost,
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
    #[error("its call frame information does not parse: {0}")]
    Parse(String),
    #[error("its call frame information describes more than {0} address ranges")]
    TooManyRows(usize),
    #[error("its code lies above 4 GiB in the file's address space")]
    HighAddress,
}

/// The kernel's form of `rows` (`profiler_common::UnwindRow`): file addresses must fit 32
/// bits (the whole table is refused otherwise); a CFA offset outside `0..=65535` becomes an
/// unsupported rule and a saved `rbp` that is not a whole word within ±1 KiB of the CFA an
/// unknown one (the walk stops, or goes on without `rbp`, instead of guessing).
pub fn compact(rows: &[Row]) -> Result<Vec<profiler_common::UnwindRow>, TableError> {
    use profiler_common::{UnwindRow, cfa_kind, rbp_kind};
    rows.iter()
        .map(|r| {
            let pc = u32::try_from(r.pc).map_err(|_| TableError::HighAddress)?;
            let (cfa, offset) = match r.cfa {
                Cfa::Rsp(n) => u16::try_from(n).map_or((cfa_kind::UNSUPPORTED, 0), |n| (cfa_kind::RSP, n)),
                Cfa::Rbp(n) => u16::try_from(n).map_or((cfa_kind::UNSUPPORTED, 0), |n| (cfa_kind::RBP, n)),
                Cfa::Expression => (cfa_kind::PLT, 0),
                Cfa::Unsupported => (cfa_kind::UNSUPPORTED, 0),
                Cfa::None => (cfa_kind::NONE, 0),
                Cfa::Outermost => (cfa_kind::OUTERMOST, 0),
            };
            let (rbp, words) = match r.rbp {
                SavedRbp::Same => (rbp_kind::SAME, 0),
                SavedRbp::AtCfa(n) if n % 8 == 0 => i8::try_from(n / 8).map_or((rbp_kind::UNKNOWN, 0), |w| (rbp_kind::AT_CFA, w)),
                SavedRbp::AtCfa(_) | SavedRbp::Unknown => (rbp_kind::UNKNOWN, 0),
            };
            Ok(UnwindRow::new(pc, cfa, offset, rbp, words))
        })
        .collect()
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
    Ok(table(ranges(&section, &bases, |_| true, max_rows)?))
}

/// The rows of a file's `.debug_frame` (DWARF's own form of the same CFI, which `gcc -g`
/// emits instead of `.eh_frame` for code built without unwind tables,
/// `-fno-asynchronous-unwind-tables`): 64-bit addresses, little endian, FDE addresses are
/// file addresses. FDEs of code the linker discarded (address 0, or a tombstone near
/// `u64::MAX` whose range wraps) are skipped. At most `max_rows`.
pub fn debug_frame_rows(debug_frame: &[u8], max_rows: usize) -> Result<Vec<Row>, TableError> {
    let mut section = DebugFrame::new(debug_frame, LittleEndian);
    section.set_address_size(8);
    let kept = |fde: &gimli::FrameDescriptionEntry<EndianSlice<'_, LittleEndian>>| {
        fde.initial_address() != 0 && fde.initial_address().checked_add(fde.len()).is_some()
    };
    Ok(table(ranges(&section, &BaseAddresses::default(), kept, max_rows)?))
}

/// `eh` (the rows of `.eh_frame`) with every range it leaves without a rule (`Cfa::None`,
/// or outside its rows) taken from `debug` (the rows of `.debug_frame`): `.eh_frame` wins
/// wherever it has an FDE. Both inputs keep the invariants of the module docs, and so does
/// the result; more than `max_rows` rows are refused whole.
pub fn merge(eh: &[Row], debug: &[Row], max_rows: usize) -> Result<Vec<Row>, TableError> {
    // Every boundary of either table; between two, each table's rule is constant.
    let mut pcs: Vec<u64> = eh.iter().chain(debug).map(|r| r.pc).collect();
    pcs.sort_unstable();
    pcs.dedup();
    let none = Row { pc: 0, cfa: Cfa::None, rbp: SavedRbp::Unknown };
    let mut out: Vec<Row> = Vec::with_capacity(eh.len().max(debug.len()).min(max_rows));
    for pc in pcs {
        let rule = match lookup(eh, pc) {
            Some(r) if r.cfa != Cfa::None => r,
            _ => lookup(debug, pc).unwrap_or(&none),
        };
        if out.is_empty() && rule.cfa == Cfa::None {
            continue;
        }
        push(&mut out, Row { pc, ..*rule });
        if out.len() > max_rows {
            return Err(TableError::TooManyRows(max_rows));
        }
    }
    Ok(out)
}

/// One range of an FDE's table: `[start, end)` with its rules.
type Range = (u64, u64, Cfa, SavedRbp);

/// The ranges of every FDE of `section` that `keep` accepts, in section order; more than
/// `max_rows` are refused. The rows are counted before any is kept (a section claiming too
/// many costs parsing, not memory), then read again into a vector of exactly their number.
fn ranges<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    keep: impl Fn(&gimli::FrameDescriptionEntry<EndianSlice<'a, LittleEndian>>) -> bool,
    max_rows: usize,
) -> Result<Vec<Range>, TableError>
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let mut context = Box::new(UnwindContext::new());
    let mut count = 0usize;
    each_range(section, bases, &keep, &mut context, |_| {
        count += 1;
        if count > max_rows { Err(TableError::TooManyRows(max_rows)) } else { Ok(()) }
    })?;
    let mut ranges: Vec<Range> = Vec::with_capacity(count);
    each_range(section, bases, &keep, &mut context, |range| {
        // The section is the same bytes: this holds unless its reading changed.
        if ranges.len() >= count {
            return Err(TableError::TooManyRows(max_rows));
        }
        ranges.push(range);
        Ok(())
    })?;
    Ok(ranges)
}

/// Calls `each` with every non-empty range of the FDEs of `section` that `keep` accepts.
fn each_range<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    keep: &impl Fn(&gimli::FrameDescriptionEntry<EndianSlice<'a, LittleEndian>>) -> bool,
    context: &mut UnwindContext<usize>,
    mut each: impl FnMut(Range) -> Result<(), TableError>,
) -> Result<(), TableError>
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(|s, b, offset| s.cie_from_offset(b, offset)) else { continue };
        if !keep(&fde) {
            continue;
        }
        let mut table = fde.rows(section, bases, context)?;
        while let Some(row) = table.next_row()? {
            if row.start_address() >= row.end_address() {
                continue;
            }
            let cfa = match row.cfa() {
                CfaRule::RegisterAndOffset { register, offset } => match i32::try_from(*offset) {
                    Ok(n) if *register == X86_64::RSP => Cfa::Rsp(n),
                    Ok(n) if *register == X86_64::RBP => Cfa::Rbp(n),
                    _ => Cfa::Unsupported,
                },
                CfaRule::Expression(_) => Cfa::Expression,
            };
            let cfa = if matches!(row.register(X86_64::RA), RegisterRule::Undefined) { Cfa::Outermost } else { cfa };
            let rbp = match row.register(X86_64::RBP) {
                RegisterRule::Undefined | RegisterRule::SameValue => SavedRbp::Same,
                RegisterRule::Offset(n) => i32::try_from(n).map_or(SavedRbp::Unknown, SavedRbp::AtCfa),
                _ => SavedRbp::Unknown,
            };
            each((row.start_address(), row.end_address(), cfa, rbp))?;
        }
    }
    Ok(())
}

/// The rows of `ranges`: sorted, a `Cfa::None` row for every gap and after the last.
fn table(mut ranges: Vec<Range>) -> Vec<Row> {
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
    out
}

/// Appends `row` unless it repeats the last one's rules; a last row at the same `pc` (an
/// empty range) is replaced.
fn push(out: &mut Vec<Row>, row: Row) {
    if out.last().is_some_and(|last| last.pc == row.pc) {
        out.pop();
    }
    match out.last() {
        Some(last) if last.cfa == row.cfa && last.rbp == row.rbp => {}
        _ => out.push(row),
    }
}

/// The row that applies at `pc`, if any.
pub fn lookup(rows: &[Row], pc: u64) -> Option<&Row> {
    let i = rows.partition_point(|r| r.pc <= pc);
    rows.get(i.checked_sub(1)?)
}

/// The registers a walk starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One executable mapping of a process and the rows of its file: `file address = address -
/// bias`.
pub struct Module<'a> {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub rows: &'a [Row],
}

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkEnd {
    /// The return address is 0 (the outermost frame).
    Outermost,
    /// The address is in no module with a table.
    NoModule,
    /// The module's table has no row for the address (no FDE: hand-written code, stripped).
    NoRow,
    /// A rule the walk does not follow.
    Unsupported,
    /// A stack word did not read.
    ReadFault,
    /// The CFA did not move up the stack (a loop, or a wrong table).
    NotGrowing,
    /// `max_frames` frames were walked.
    Depth,
}

/// The walk the kernel is to do (docs/native-unwinding-plan.md), in userspace: from `regs`,
/// frame by frame through `modules` (sorted by start), reading stack words with `read`.
/// Returns the instruction pointers, innermost first, and why it stopped.
pub fn walk(mut regs: Regs, modules: &[Module<'_>], read: impl Fn(u64) -> Option<u64>, max_frames: usize) -> (Vec<u64>, WalkEnd) {
    let mut ips = Vec::new();
    for depth in 0..max_frames {
        ips.push(regs.ip);
        // A return address points after its call: look up the call itself.
        let lookup_ip = if depth == 0 { regs.ip } else { regs.ip.wrapping_sub(1) };
        let i = modules.partition_point(|m| m.start <= lookup_ip);
        let Some(module) = i.checked_sub(1).map(|i| &modules[i]).filter(|m| lookup_ip < m.end) else {
            return (ips, WalkEnd::NoModule);
        };
        let Some(row) = lookup(module.rows, lookup_ip.wrapping_sub(module.bias)) else { return (ips, WalkEnd::NoRow) };
        let cfa = match row.cfa {
            Cfa::Rsp(n) => regs.sp.wrapping_add_signed(i64::from(n)),
            Cfa::Rbp(n) => regs.bp.wrapping_add_signed(i64::from(n)),
            // The .plt stubs: rsp + 8, 8 more past the stub's push (CFI of binutils' PLT).
            Cfa::Expression => regs.sp + 8 + if (regs.ip & 15) >= 11 { 8 } else { 0 },
            Cfa::Unsupported => return (ips, WalkEnd::Unsupported),
            Cfa::None => return (ips, WalkEnd::NoRow),
            Cfa::Outermost => return (ips, WalkEnd::Outermost),
        };
        if cfa <= regs.sp {
            return (ips, WalkEnd::NotGrowing);
        }
        let Some(ra) = read(cfa - 8) else { return (ips, WalkEnd::ReadFault) };
        let bp = match row.rbp {
            SavedRbp::Same | SavedRbp::Unknown => regs.bp,
            SavedRbp::AtCfa(n) => match read(cfa.wrapping_add_signed(i64::from(n))) {
                Some(v) => v,
                None => return (ips, WalkEnd::ReadFault),
            },
        };
        if ra == 0 {
            return (ips, WalkEnd::Outermost);
        }
        regs = Regs { ip: ra, sp: cfa, bp };
    }
    (ips, WalkEnd::Depth)
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol};

    use super::*;

    /// The kernel's form refuses what it cannot hold instead of wrapping it.
    #[test]
    fn compact_rows_refuse_what_does_not_fit() {
        use profiler_common::{cfa_kind, rbp_kind};
        let rows = [
            Row { pc: 0x1000, cfa: Cfa::Rsp(8), rbp: SavedRbp::Same },
            Row { pc: 0x1004, cfa: Cfa::Rsp(70_000), rbp: SavedRbp::AtCfa(-16) },
            Row { pc: 0x1008, cfa: Cfa::Rbp(16), rbp: SavedRbp::AtCfa(-12) },
            Row { pc: 0x100c, cfa: Cfa::Rsp(-8), rbp: SavedRbp::AtCfa(-4096) },
            Row { pc: 0x1010, cfa: Cfa::Outermost, rbp: SavedRbp::Unknown },
        ];
        let c = compact(&rows).expect("fits");
        assert_eq!((c[0].cfa_kind(), c[0].cfa_offset, c[0].rbp_kind()), (cfa_kind::RSP, 8, rbp_kind::SAME));
        assert_eq!((c[1].cfa_kind(), c[1].rbp_kind(), c[1].rbp_words), (cfa_kind::UNSUPPORTED, rbp_kind::AT_CFA, -2));
        assert_eq!((c[2].cfa_kind(), c[2].cfa_offset, c[2].rbp_kind()), (cfa_kind::RBP, 16, rbp_kind::UNKNOWN));
        assert_eq!((c[3].cfa_kind(), c[3].rbp_kind()), (cfa_kind::UNSUPPORTED, rbp_kind::UNKNOWN));
        assert_eq!(c[4].cfa_kind(), cfa_kind::OUTERMOST);
        let high = [Row { pc: 1 << 32, cfa: Cfa::Rsp(8), rbp: SavedRbp::Same }];
        assert_eq!(compact(&high), Err(TableError::HighAddress));
    }


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


/// `.debug_frame` rows and their merge with `.eh_frame`'s.
#[cfg(test)]
pub(crate) mod debug_frame_tests {
    use object::{Object, ObjectSection, ObjectSymbol};

    use super::*;

    const RSP8: (Cfa, SavedRbp) = (Cfa::Rsp(8), SavedRbp::Same);

    fn row(pc: u64, cfa: Cfa, rbp: SavedRbp) -> Row {
        Row { pc, cfa, rbp }
    }

    fn none(pc: u64) -> Row {
        row(pc, Cfa::None, SavedRbp::Unknown)
    }

    /// A call frame section of one CIE (`rsp + 8`, the return address at `CFA - 8`, no
    /// augmentation) and `fdes` `(address, length, instructions)`, in `.eh_frame`'s form or
    /// `.debug_frame`'s (CIE id and CIE pointers differ).
    pub(crate) fn cfi(debug: bool, fdes: &[(u64, u64, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let pad = |entry: &mut Vec<u8>| {
            while (entry.len() + 4) % 8 != 0 {
                entry.push(0); // DW_CFA_nop
            }
        };
        let mut cie: Vec<u8> = if debug { 0xffff_ffffu32 } else { 0 }.to_le_bytes().to_vec();
        cie.extend([1, 0, 1, 0x78, 16]); // version 1, "", code 1, data -8, return address r16
        cie.extend([0x0c, 7, 8, 0x90, 1]); // def_cfa rsp+8; r16 at cfa-8
        pad(&mut cie);
        out.extend((cie.len() as u32).to_le_bytes());
        out.extend(cie);
        for (address, len, instructions) in fdes {
            let at = out.len();
            // .eh_frame: the distance back to the CIE from this field; .debug_frame: its offset.
            let pointer = if debug { 0 } else { at as u32 + 4 };
            let mut fde = pointer.to_le_bytes().to_vec();
            fde.extend(address.to_le_bytes());
            fde.extend(len.to_le_bytes());
            fde.extend(*instructions);
            pad(&mut fde);
            out.extend((fde.len() as u32).to_le_bytes());
            out.extend(fde);
        }
        out
    }

    /// advance 4, CFA rsp+16; advance 8, CFA rsp+8.
    const PUSH_POP: &[u8] = &[0x44, 0x0e, 16, 0x48, 0x0e, 8];

    #[test]
    fn debug_frame_gives_the_rows_eh_frame_would() {
        let fdes: [(u64, u64, &[u8]); 2] = [(0x1000, 0x20, PUSH_POP), (0x1040, 0x10, &[])];
        let want = vec![
            row(0x1000, Cfa::Rsp(8), SavedRbp::Same),
            row(0x1004, Cfa::Rsp(16), SavedRbp::Same),
            row(0x100c, Cfa::Rsp(8), SavedRbp::Same),
            none(0x1020),
            row(0x1040, Cfa::Rsp(8), SavedRbp::Same),
            none(0x1050),
        ];
        assert_eq!(debug_frame_rows(&cfi(true, &fdes), 100), Ok(want.clone()));
        assert_eq!(rows(&cfi(false, &fdes), 0x8000, None, 100), Ok(want));
        // Discarded code (address 0, a tombstone whose range wraps) is left out.
        let discarded: [(u64, u64, &[u8]); 3] = [(0, 0x30, &[]), (u64::MAX, 0x10, &[]), (0x2000, 4, &[])];
        assert_eq!(debug_frame_rows(&cfi(true, &discarded), 100), Ok(vec![row(0x2000, RSP8.0, RSP8.1), none(0x2004)]));
        // Refused whole past the cap.
        assert_eq!(debug_frame_rows(&cfi(true, &fdes), 3), Err(TableError::TooManyRows(3)));
    }

    #[test]
    fn eh_frame_wins_and_debug_frame_fills_its_gaps() {
        let a = (Cfa::Rsp(16), SavedRbp::AtCfa(-16));
        let eh = vec![row(0x1000, a.0, a.1), none(0x1010), row(0x1040, RSP8.0, RSP8.1), none(0x1050)];
        let b = (Cfa::Rbp(16), SavedRbp::AtCfa(-16));
        // .debug_frame overlaps eh's first FDE, fills the gap partly, runs on past eh's last.
        let debug = vec![row(0x0ff0, b.0, b.1), row(0x1020, RSP8.0, RSP8.1), none(0x1030), row(0x1048, b.0, b.1), none(0x1060)];
        let merged = merge(&eh, &debug, 100).expect("fits");
        assert_eq!(
            merged,
            vec![
                row(0x0ff0, b.0, b.1),
                row(0x1000, a.0, a.1),
                row(0x1010, b.0, b.1),
                row(0x1020, RSP8.0, RSP8.1),
                none(0x1030),
                row(0x1040, RSP8.0, RSP8.1),
                row(0x1050, b.0, b.1),
                none(0x1060),
            ]
        );
        // Either alone is itself; neighbours that become equal are merged.
        assert_eq!(merge(&eh, &[], 100), Ok(eh.clone()));
        assert_eq!(merge(&[], &debug, 100), Ok(debug.clone()));
        let joined = merge(&[row(0x10, RSP8.0, RSP8.1), none(0x20)], &[row(0x20, RSP8.0, RSP8.1), none(0x30)], 100);
        assert_eq!(joined, Ok(vec![row(0x10, RSP8.0, RSP8.1), none(0x30)]));
        // The cap holds for the result: refused, not cut.
        assert_eq!(merge(&eh, &debug, 7), Err(TableError::TooManyRows(7)));
        assert_eq!(merge(&eh, &debug, 8).map(|m| m.len()), Ok(8));
    }

    /// Builds `source` with `cc` and `flags`; the file's bytes.
    fn built(dir: &std::path::Path, name: &str, source: &str, flags: &[&str]) -> Option<Vec<u8>> {
        let src = dir.join(format!("{name}.c"));
        std::fs::write(&src, source).ok()?;
        let out = dir.join(format!("{name}.so"));
        let ok = std::process::Command::new("cc").args(flags).args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src).status().is_ok_and(|s| s.success());
        if ok { std::fs::read(&out).ok() } else { None }
    }

    /// The rules of `rows` within each function of `file`, relative to the function's start.
    fn per_function(file: &object::File<'_>, rows: &[Row], names: &[&str]) -> Vec<(String, Vec<(u64, Cfa, SavedRbp)>)> {
        names
            .iter()
            .map(|name| {
                let sym = file.symbols().find(|s| s.name() == Ok(*name)).unwrap_or_else(|| panic!("no {name}"));
                let (start, end) = (sym.address(), sym.address() + sym.size());
                let mut rules: Vec<(u64, Cfa, SavedRbp)> = Vec::new();
                let first = lookup(rows, start).unwrap_or_else(|| panic!("no row at {name}"));
                rules.push((0, first.cfa, first.rbp));
                rules.extend(rows.iter().filter(|r| r.pc > start && r.pc < end).map(|r| (r.pc - start, r.cfa, r.rbp)));
                (name.to_string(), rules)
            })
            .collect()
    }

    /// The same C code built by gcc twice, once with `.eh_frame` (`-fasynchronous-unwind-tables`)
    /// and once with its CFI in `.debug_frame` only (`-g -fno-asynchronous-unwind-tables
    /// -fno-unwind-tables`): each function has the same rules from either section.
    #[test]
    fn gcc_debug_frame_rows_equal_its_eh_frame_rows() {
        if !std::process::Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success()) {
            eprintln!("skipping: no C compiler");
            return;
        }
        let dir = std::env::temp_dir().join(format!("pyperch-debug-frame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let source = "#include <string.h>\n\
            __attribute__((noipa)) unsigned long df_leaf(unsigned long n) { volatile unsigned long x = 0; for (unsigned long i = 0; i < n; i++) x += i; return x; }\n\
            __attribute__((noipa)) unsigned long df_big(unsigned long n) { volatile char b[5000]; memset((void *)b, 1, sizeof b); return df_leaf(n + b[n % 5000]) + 1; }\n\
            __attribute__((noipa)) unsigned long df_fp(unsigned long n) { volatile unsigned long a[n % 64 + 2]; a[n % 64] = n; return df_big(a[n % 64]) + 2; }\n";
        let base = ["-O2", "-fomit-frame-pointer"];
        let eh = built(&dir, "eh", source, &[&base[..], &["-fasynchronous-unwind-tables"]].concat());
        let debug = built(&dir, "debug", source, &[&base[..], &["-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]].concat());
        let _ = std::fs::remove_dir_all(&dir);
        let (eh, debug) = (eh.expect("cc builds with .eh_frame"), debug.expect("cc builds with .debug_frame"));
        let (eh_file, debug_file) = (object::File::parse(&*eh).expect("ELF"), object::File::parse(&*debug).expect("ELF"));
        let eh_section = eh_file.section_by_name(".eh_frame").expect(".eh_frame");
        let eh_rows = rows(eh_section.data().expect("data"), eh_section.address(), None, 1 << 20).expect("eh rows");
        // The second file's .eh_frame holds no FDE for them: the rows come from .debug_frame.
        let dh = debug_file.section_by_name(".eh_frame").map(|s| rows(s.data().unwrap_or_default(), s.address(), None, 1 << 20).expect("rows"));
        let debug_rows = debug_frame_rows(debug_file.section_by_name(".debug_frame").expect(".debug_frame").data().expect("data"), 1 << 20).expect("debug rows");
        let merged = merge(dh.as_deref().unwrap_or_default(), &debug_rows, 1 << 20).expect("merged");
        for w in merged.windows(2) {
            assert!(w[0].pc < w[1].pc && (w[0].cfa, w[0].rbp) != (w[1].cfa, w[1].rbp), "{:?}", w);
        }
        let names = ["df_leaf", "df_big", "df_fp"];
        let (from_eh, from_debug) = (per_function(&eh_file, &eh_rows, &names), per_function(&debug_file, &merged, &names));
        assert_eq!(from_eh, from_debug);
        // df_big's 5000-byte frame and df_fp's variable-length array (CFA from rbp) are in there.
        assert!(from_debug[1].1.iter().any(|r| matches!(r.1, Cfa::Rsp(n) if n > 5000)), "{from_debug:?}");
        assert!(from_debug[2].1.iter().any(|r| matches!(r.1, Cfa::Rbp(16))), "{from_debug:?}");
        let leaf = debug_file.symbols().find(|s| s.name() == Ok("df_leaf")).expect("df_leaf").address();
        assert!(dh.as_deref().and_then(|r| lookup(r, leaf)).is_none_or(|r| r.cfa == Cfa::None), "df_leaf has .eh_frame rows");
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn rule() -> impl Strategy<Value = (Cfa, SavedRbp)> {
            (
                prop_oneof![Just(Cfa::None), Just(Cfa::Rsp(8)), Just(Cfa::Rsp(16)), Just(Cfa::Rbp(16)), Just(Cfa::Outermost)],
                prop_oneof![Just(SavedRbp::Same), Just(SavedRbp::AtCfa(-16)), Just(SavedRbp::Unknown)],
            )
        }

        /// A table keeping the invariants: sorted distinct `pc`s, a `None` row last.
        fn table() -> impl Strategy<Value = Vec<Row>> {
            prop::collection::vec((0u64..64, rule()), 0..12).prop_map(|steps| {
                let mut out = Vec::new();
                let mut pc = 0;
                for (step, (cfa, rbp)) in steps {
                    pc += step + 1;
                    if !(out.is_empty() && cfa == Cfa::None) {
                        push(&mut out, Row { pc, cfa, rbp });
                    }
                }
                if !out.is_empty() {
                    push(&mut out, none(pc + 1));
                }
                out
            })
        }

        /// A mutated call frame section: a few real FDEs, then bytes flipped and cut.
        fn section() -> impl Strategy<Value = (bool, Vec<u8>)> {
            let fde = (0u64..0x1_0000_0000, 0u64..0x100, prop::collection::vec(prop_oneof![Just(0x44u8), Just(0x0e), Just(16), Just(0x0a), Just(0x0b), any::<u8>()], 0..24));
            (any::<bool>(), prop::collection::vec(fde, 0..6), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6), any::<Option<prop::sample::Index>>())
                .prop_map(|(debug, fdes, flips, cut)| {
                    let fdes: Vec<(u64, u64, &[u8])> = fdes.iter().map(|(a, l, i)| (*a, *l, &i[..])).collect();
                    let mut bytes = cfi(debug, &fdes);
                    for (at, v) in flips {
                        let i = at.index(bytes.len());
                        bytes[i] = v;
                    }
                    if let Some(cut) = cut {
                        bytes.truncate(cut.index(bytes.len() + 1));
                    }
                    (debug, bytes)
                })
        }

        fn check(rows: &[Row], max_rows: usize) {
            // At most `max_rows` ranges, each with the gap after it.
            assert!(rows.len() <= 2 * max_rows + 1, "{} rows", rows.len());
            for w in rows.windows(2) {
                assert!(w[0].pc < w[1].pc && (w[0].cfa, w[0].rbp) != (w[1].cfa, w[1].rbp), "{w:?}");
            }
        }

        proptest! {
            #![proptest_config(crate::fuzzing::config(256))]

            /// Any `.eh_frame` or `.debug_frame` bytes: rows that keep the invariants, or an
            /// error; never a panic.
            #[test]
            fn fuzz_unwind_rows_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048), max_rows in 1usize..64) {
                if let Ok(r) = rows(&bytes, 0x4000, Some(0x1000), max_rows) { check(&r, max_rows); }
                if let Ok(r) = debug_frame_rows(&bytes, max_rows) { check(&r, max_rows); }
            }

            #[test]
            fn fuzz_unwind_rows_of_mutated_sections((debug, bytes) in section(), max_rows in 1usize..64) {
                let built = if debug { debug_frame_rows(&bytes, max_rows) } else { rows(&bytes, 0x4000, None, max_rows) };
                if let Ok(r) = built {
                    check(&r, max_rows);
                    let _ = compact(&r);
                }
            }

            /// The merge keeps the invariants, and at every address gives `.eh_frame`'s rule
            /// where it has one, else `.debug_frame`'s.
            #[test]
            fn merge_prefers_eh_frame_everywhere(eh in table(), debug in table(), probes in prop::collection::vec(0u64..1024, 1..32)) {
                let merged = merge(&eh, &debug, 1 << 10).expect("under the cap");
                check(&merged, 1 << 10);
                let rule = |rows: &[Row], pc| lookup(rows, pc).map(|r| (r.cfa, r.rbp)).filter(|r| r.0 != Cfa::None);
                for pc in probes {
                    let want = rule(&eh, pc).or_else(|| rule(&debug, pc));
                    prop_assert_eq!(rule(&merged, pc), want, "at {:#x}", pc);
                }
            }
        }
    }
}

#[cfg(test)]
mod walk_tests {
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

    use super::*;

    /// Rows and bias of every executable file mapping of this process.
    fn own_modules() -> Vec<(u64, u64, u64, Vec<Row>)> {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let mut out = Vec::new();
        for m in crate::target::discovery::parse_maps(&maps) {
            if m.perms[2] != b'x' || !m.path.starts_with('/') {
                continue;
            }
            let Ok(data) = std::fs::read(&m.path) else { continue };
            let Ok(file) = object::File::parse(&*data) else { continue };
            let Some(eh) = file.section_by_name(".eh_frame") else { continue };
            // The executable segment the mapping holds (its file offset need not be page
            // aligned: the mapping starts at the page below it).
            let len = m.end - m.start;
            let segment = file.segments().find(|s| {
                let (off, size) = s.file_range();
                let executable = matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
                executable && off < m.offset + len && m.offset < off + size
            });
            let Some(segment) = segment else { continue };
            let (seg_offset, _) = segment.file_range();
            // file address = avma - start + offset - p_offset + p_vaddr
            let bias = (m.start - m.offset + seg_offset).wrapping_sub(segment.address());
            let text = file.section_by_name(".text").map(|s| s.address());
            if let Ok(rows) = rows(eh.data().unwrap_or_default(), eh.address(), text, 1 << 22) {
                out.push((m.start, m.end, bias, rows));
            }
        }
        out.sort_by_key(|m| m.0);
        out
    }

    fn read_own(address: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        let local = libc::iovec { iov_base: word.as_mut_ptr() as *mut libc::c_void, iov_len: 8 };
        let remote = libc::iovec { iov_base: address as *mut libc::c_void, iov_len: 8 };
        // SAFETY: both iovecs describe 8 bytes; the remote one is only read by the kernel,
        // which fails cleanly (EFAULT) on an unmapped address.
        let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        (got == 8).then(|| u64::from_le_bytes(word))
    }

    /// Captures the registers here and hands them to `then`, called from this frame (so
    /// that this frame and its callers are still on the stack while `then` walks them).
    #[inline(never)]
    fn level_c(then: &dyn Fn(Regs) -> (Vec<u64>, WalkEnd)) -> (Vec<u64>, WalkEnd) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers into outputs; no memory is touched.
        unsafe {
            core::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp", ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp);
        }
        let out = then(std::hint::black_box(Regs { ip, sp, bp }));
        std::hint::black_box(out)
    }

    #[inline(never)]
    fn level_b(then: &dyn Fn(Regs) -> (Vec<u64>, WalkEnd)) -> (Vec<u64>, WalkEnd) {
        std::hint::black_box(level_c(then))
    }

    #[inline(never)]
    fn level_a(then: &dyn Fn(Regs) -> (Vec<u64>, WalkEnd)) -> (Vec<u64>, WalkEnd) {
        std::hint::black_box(level_b(then))
    }

    /// This very test's stack, walked with the rows of the files it runs (the test binary,
    /// libc): level_c, level_b and level_a in order, and the walk goes on past them to the
    /// thread's start without a wrong turn (every address named by a symbol).
    #[test]
    // Its own frame is asserted below: never inlined into the harness's `call_once` (which
    // other code's growth in the test binary made the compiler do).
    #[inline(never)]
    fn walks_its_own_stack() {
        let owned = own_modules();
        let modules: Vec<Module<'_>> = owned.iter().map(|(start, end, bias, rows)| Module { start: *start, end: *end, bias: *bias, rows }).collect();
        let (ips, end) = level_a(&|regs| walk(regs, &modules, read_own, 256));
        // Name the addresses from the test binary's symbols.
        let exe = std::fs::read("/proc/self/exe").expect("exe");
        let file = object::File::parse(&*exe).expect("ELF");
        let here = own_modules as fn() -> Vec<(u64, u64, u64, Vec<Row>)> as usize as u64;
        let m = owned.iter().find(|m| m.0 <= here && here < m.1).expect("own module");
        let mut symbols: Vec<(u64, u64, String)> =
            file.symbols().filter(|s| s.size() > 0).filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string()))).collect();
        symbols.sort();
        let name = |ip: u64| -> String {
            let at = ip.wrapping_sub(m.2);
            let i = symbols.partition_point(|s| s.0 <= at);
            i.checked_sub(1).map(|i| &symbols[i]).filter(|s| at < s.0 + s.1).map_or_else(|| format!("{ip:#x}"), |s| format!("{:#}", rustc_demangle::demangle(&s.2)))
        };
        let names: Vec<String> = ips.iter().map(|&ip| name(ip)).collect();
        eprintln!("walk ({end:?}): {names:#?}");
        let pos = |f: &str| names.iter().position(|n| n.ends_with(f)).unwrap_or_else(|| panic!("{f} not walked: {names:#?}"));
        let (c, b, a) = (pos("walk_tests::level_c"), pos("walk_tests::level_b"), pos("walk_tests::level_a"));
        assert!(c < b && b < a, "{names:#?}");
        assert!(names.iter().any(|n| n.ends_with("walk_tests::walks_its_own_stack")), "{names:#?}");
        assert!(ips.len() > a + 3, "the walk stopped right after level_a ({end:?}): {names:#?}");
    }
}

/// A manual check against another process (not run by default): `PYPERCH_WALK_PID=PID cargo
/// test --release -p profiler-user --lib walk_pid -- --ignored --nocapture` stops the
/// process with ptrace, walks its stack with the rows of the files it maps (read through
/// `/proc/PID/root`) and prints the frames by symbol, to set beside `gdb -p PID -batch -ex bt`.
#[cfg(test)]
mod walk_pid {
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

    use super::*;

    #[test]
    #[ignore]
    fn walk_pid_from_env() {
        let Some(pid) = std::env::var("PYPERCH_WALK_PID").ok().and_then(|p| p.parse::<i32>().ok()) else { return };
        let tid = std::env::var("PYPERCH_WALK_TID").ok().and_then(|p| p.parse::<i32>().ok()).unwrap_or(pid);
        // SAFETY: plain ptrace calls on a pid we name; the tracee is detached below.
        let regs = unsafe {
            assert_eq!(libc::ptrace(libc::PTRACE_ATTACH, tid, 0, 0), 0, "attach");
            let mut status = 0;
            libc::waitpid(tid, &mut status, libc::__WALL);
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            assert_eq!(libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _ as *mut libc::c_void), 0, "getregs");
            regs
        };
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
        let mut owned: Vec<(u64, u64, u64, Vec<Row>, Vec<(u64, u64, String)>)> = Vec::new();
        for m in crate::target::discovery::parse_maps(&maps) {
            if m.perms[2] != b'x' || !m.path.starts_with('/') {
                continue;
            }
            let Ok(data) = std::fs::read(format!("/proc/{pid}/root{}", m.path)) else { continue };
            let Ok(file) = object::File::parse(&*data) else { continue };
            let len = m.end - m.start;
            let Some(segment) = file.segments().find(|s| {
                let (off, size) = s.file_range();
                matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0) && off < m.offset + len && m.offset < off + size
            }) else {
                continue;
            };
            let bias = (m.start - m.offset + segment.file_range().0).wrapping_sub(segment.address());
            let rows = file
                .section_by_name(".eh_frame")
                .and_then(|eh| rows(eh.data().ok()?, eh.address(), file.section_by_name(".text").map(|s| s.address()), 1 << 22).ok())
                .unwrap_or_default();
            let mut symbols: Vec<(u64, u64, String)> = file
                .symbols()
                .chain(file.dynamic_symbols())
                .filter(|s| s.size() > 0)
                .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
                .collect();
            symbols.sort();
            eprintln!("{} {:#x}-{:#x}: {} rows", m.path, m.start, m.end, rows.len());
            owned.push((m.start, m.end, bias, rows, symbols));
        }
        owned.sort_by_key(|m| m.0);
        let modules: Vec<Module<'_>> = owned.iter().map(|m| Module { start: m.0, end: m.1, bias: m.2, rows: &m.3 }).collect();
        let read = |address: u64| -> Option<u64> {
            let mut word = [0u8; 8];
            let local = libc::iovec { iov_base: word.as_mut_ptr() as *mut libc::c_void, iov_len: 8 };
            let remote = libc::iovec { iov_base: address as *mut libc::c_void, iov_len: 8 };
            // SAFETY: 8-byte iovecs; the kernel checks the remote one.
            let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            (got == 8).then(|| u64::from_le_bytes(word))
        };
        let (ips, end) = walk(Regs { ip: regs.rip, sp: regs.rsp, bp: regs.rbp }, &modules, read, 512);
        // SAFETY: detaching the tracee attached above.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
        for (i, ip) in ips.iter().enumerate() {
            let at = if i == 0 { *ip } else { ip - 1 };
            let name = owned.iter().find(|m| m.0 <= at && at < m.1).and_then(|m| {
                let file_at = at.wrapping_sub(m.2);
                let k = m.4.partition_point(|s| s.0 <= file_at);
                k.checked_sub(1).map(|k| &m.4[k]).filter(|s| file_at < s.0 + s.1).map(|s| s.2.clone())
            });
            eprintln!("#{i:<3} {ip:#x} {}", name.map(|n| crate::target::native::demangle::demangle(&n).unwrap_or(n)).unwrap_or_default());
        }
        eprintln!("end: {end:?}");
    }
}
