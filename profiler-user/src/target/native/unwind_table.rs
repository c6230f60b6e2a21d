//! Compact unwind rows of one file for the walk in the kernel (`--native`; the design is in
//! docs/native-unwinding-plan.md): built here when a file is read (`module_file`), written
//! into the kernel's map by `kernel::unwind_tables` as [`compact`] rows. [`walk`] is the
//! kernel's walk in userspace, for the tests.
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
    #[error("its .eh_frame does not parse: {0}")]
    Parse(String),
    #[error("its .eh_frame describes more than {0} address ranges")]
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
            let cfa = if matches!(row.register(X86_64::RA), RegisterRule::Undefined) { Cfa::Outermost } else { cfa };
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
