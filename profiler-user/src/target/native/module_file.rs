//! One executable file as `--native` needs it: its unwind sections (`.eh_frame`,
//! `.eh_frame_hdr`, `.debug_frame`), its loadable segments, its function symbols (`.symtab`
//! and `.dynsym`) and its DWARF line table (`lines`, built here). Read through
//! `discovery::open_checked` (inside the target's root, identity-checked, non-blocking), on
//! a thread `file_cache` starts for it, which also keeps the files read.
//!
//! Every size comes from a hostile file: the file is never parsed whole. Its headers are read
//! first, and each table after them only when its claimed size passes its cap (`MAX_*`), the
//! file's real allocated size and the file's read budget (`budget::FileBudget`); a refused
//! table is absent and counted on `--stats` with its reason.

use std::{
    fs::File,
    ops::{Deref, Range},
    sync::Arc,
};

use super::{
    budget::{FileBudget, Refusal},
    lines::LineTable,
};
use crate::target::native::{NativeMapping, NativeOrigin};

/// Most bytes of the DWARF sections line tables are built from, per file (past that: no
/// line numbers). Read, turned into a `LineTable`, then dropped.
const MAX_DEBUG_BYTES: u64 = 64 << 20;
/// Largest unwind or DWARF section read from one file.
const MAX_SECTION_BYTES: u64 = 64 << 20;
/// Section headers read at most (real libraries have under 100).
const MAX_SECTIONS: usize = 4096;
/// Program headers read at most (real: under 20).
const MAX_SEGMENTS: usize = 256;
/// Largest section-name table read (real: under 1 KiB).
const MAX_SECTION_NAMES_BYTES: u64 = 1 << 20;
/// Largest note section read (the build id's).
const MAX_NOTES_BYTES: u64 = 64 << 10;
/// Most function symbols kept from one file.
const MAX_SYMBOLS: usize = 2_000_000;
/// Largest symbol table read (`MAX_SYMBOLS` entries of 24 bytes).
const MAX_SYMTAB_BYTES: u64 = (MAX_SYMBOLS as u64) * 24;
/// Largest string table of a symbol table read.
const MAX_STRINGS_BYTES: u64 = 64 << 20;
/// Longer symbol names are not kept (the frame then shows `library+0xADDRESS`).
const MAX_NAME_BYTES: usize = 4096;
/// Unwind rows of one file at most (the kernel walk's table; OpenBLAS has about 415,000):
/// a file describing more has no table (frame pointers are followed through it).
const MAX_TABLE_ROWS: usize = 1 << 20;
/// Bytes one file may keep: past it, its lines and then its symbols are left out.
pub const MAX_FILE_BYTES: usize = super::file_cache::PROCESS_SHARE;

/// Shared, immutable bytes of one section (cheap to clone into every process's unwinder).
#[derive(Clone, Default)]
pub struct SharedBytes(pub Arc<[u8]>);

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// A function symbol: `[start, end)` in the file's address space.
struct Symbol {
    start: u64,
    end: u64,
    name: Arc<str>,
}

/// A loadable segment: file offset, address and file size.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub offset: u64,
    pub address: u64,
    pub size: u64,
}

/// What the kernel walk needs of a file, known before its symbols and lines are read (a
/// libpython built with `-g` takes 20 ms to this point and 200 ms in all): its rows (the
/// same `Arc` as the finished file's `unwind_rows`) and its segments (for the load bias).
#[derive(Debug)]
pub struct EarlyRows {
    /// `None`: the file has no table the walk can use (frame pointers).
    pub rows: Option<Arc<[profiler_common::UnwindRow]>>,
    pub segments: Vec<Segment>,
}

impl EarlyRows {
    /// As [`ModuleFile::base_address`].
    pub fn base_address(&self, mapping_start: u64, mapping_offset: u64) -> Option<u64> {
        base_address(&self.segments, mapping_start, mapping_offset)
    }
}

/// The address in the file of process address `avma` inside a mapping of it at
/// `mapping_offset`, through the segment holding that offset.
fn file_address(segments: &[Segment], mapping_start: u64, mapping_offset: u64, avma: u64) -> Option<u64> {
    let offset = avma.checked_sub(mapping_start)?.checked_add(mapping_offset)?;
    let seg = segments.iter().find(|s| offset >= s.offset && offset - s.offset < s.size.max(1))?;
    Some(seg.address.wrapping_add(offset - seg.offset))
}

fn base_address(segments: &[Segment], mapping_start: u64, mapping_offset: u64) -> Option<u64> {
    let at = file_address(segments, mapping_start, mapping_offset, mapping_start)?;
    Some(mapping_start.wrapping_sub(at))
}

/// What `--native` keeps of one file.
pub struct ModuleFile {
    /// The file's base name, as shown in frames (`libz.so.1`).
    pub name: Arc<str>,
    /// The file is musl's libc (by the path it was mapped at: `musl`), whose own code has
    /// next to no unwind rows: native stacks stop in it.
    pub musl_libc: bool,
    pub text: Option<Range<u64>>,
    pub got: Option<Range<u64>>,
    pub eh_frame: Option<(Range<u64>, SharedBytes)>,
    pub eh_frame_hdr: Option<(Range<u64>, SharedBytes)>,
    pub debug_frame: Option<SharedBytes>,
    /// The kernel walk's rows, from `.eh_frame` and `.debug_frame` ([`kernel_rows`]);
    /// `None` without a usable table.
    pub unwind_rows: Option<Arc<[profiler_common::UnwindRow]>>,
    pub segments: Vec<Segment>,
    /// The pprof mapping of each of `segments` (same index), at link addresses.
    mappings: Vec<Arc<NativeMapping>>,
    /// Sorted by start, without overlaps at the same start.
    symbols: Vec<Symbol>,
    /// The line table built from the file's DWARF, when it has one within its budgets.
    lines: Option<LineTable>,
    /// Accounted size.
    pub bytes: usize,
}

impl ModuleFile {
    /// A file with nothing in it but its accounted size (for the cache's tests).
    #[cfg(test)]
    pub(super) fn empty(bytes: usize) -> ModuleFile {
        ModuleFile {
            name: Arc::from("x"),
            musl_libc: false,
            text: None,
            got: None,
            eh_frame: None,
            eh_frame_hdr: None,
            debug_frame: None,
            unwind_rows: None,
            segments: Vec::new(),
            mappings: Vec::new(),
            symbols: Vec::new(),
            lines: None,
            bytes,
        }
    }

    /// The function containing `address` (file address space), if a symbol covers it.
    pub fn symbol(&self, address: u64) -> Option<&Arc<str>> {
        let i = self.symbols.partition_point(|s| s.start <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        (address < s.end).then_some(&s.name)
    }

    /// Where file address `address` is, for pprof: the start of its symbol (or `address`
    /// itself without one) in the mapping of its segment.
    pub fn origin(&self, address: u64) -> Option<Arc<NativeOrigin>> {
        let i = self.segments.iter().position(|s| address >= s.address && address - s.address < s.size.max(1))?;
        let start = self.symbol_start(address).unwrap_or(address);
        Some(Arc::new(NativeOrigin { address: start, mapping: self.mappings.get(i)?.clone() }))
    }

    /// `(source file, line)` of file address `address` from the DWARF line tables: the
    /// location in the outermost function (the symbol's own code, where an inlined call
    /// happened). `None` without debug information for it.
    pub fn line(&self, address: u64) -> Option<(Arc<str>, u32)> {
        self.lines.as_ref()?.line(address)
    }

    fn symbol_start(&self, address: u64) -> Option<u64> {
        let i = self.symbols.partition_point(|s| s.start <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        (address < s.end).then_some(s.start)
    }

    /// The address in the file of process address `avma` inside `mapping` (which maps this
    /// file at `mapping.offset`), through the segment holding that offset.
    pub fn file_address(&self, mapping_start: u64, mapping_offset: u64, avma: u64) -> Option<u64> {
        file_address(&self.segments, mapping_start, mapping_offset, avma)
    }

    /// Process address at which file address 0 would be, for the mapping (`base_avma`).
    pub fn base_address(&self, mapping_start: u64, mapping_offset: u64) -> Option<u64> {
        base_address(&self.segments, mapping_start, mapping_offset)
    }
}

/// The ELF types read (64-bit little-endian: x86_64 only).
type Header = object::elf::FileHeader64<object::LittleEndian>;
type SectionHeader = object::elf::SectionHeader64<object::LittleEndian>;
type ProgramHeader = object::elf::ProgramHeader64<object::LittleEndian>;
type Sym = object::elf::Sym64<object::LittleEndian>;
const LE: object::LittleEndian = object::LittleEndian;

/// A file's headers, read within its budget: the section table and its names.
struct Sections {
    headers: Vec<SectionHeader>,
    names: Vec<u8>,
}

impl Sections {
    fn name(&self, header: &SectionHeader) -> &[u8] {
        let tail = self.names.get(header.sh_name.get(LE) as usize..).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
    }

    fn by_name(&self, wanted: &str) -> Option<&SectionHeader> {
        self.headers.iter().find(|h| self.name(h) == wanted.as_bytes())
    }
}

/// `count` records of `T` read at `offset` (each within the budget), copied out.
fn read_array<T: object::pod::Pod + Copy>(
    file: &File,
    budget: &mut FileBudget,
    offset: u64,
    count: usize,
    cap: u64,
) -> Result<Vec<T>, Refusal> {
    let size = (count as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    let Some(bytes) = budget.read(file, offset, size, cap)? else { return Ok(Vec::new()) };
    Ok(object::pod::slice_from_all_bytes::<T>(&bytes).map(|s| s.to_vec()).unwrap_or_default())
}

/// The data of section `header` within `cap` and the file's budget; `None` when absent,
/// refused (counted), compressed (not read) or unreadable.
fn section_data(file: &File, budget: &mut FileBudget, header: &SectionHeader, cap: u64) -> Option<Vec<u8>> {
    if header.sh_type.get(LE) == object::elf::SHT_NOBITS || header.sh_flags.get(LE) & u64::from(object::elf::SHF_COMPRESSED) != 0 {
        return None;
    }
    budget.read(file, header.sh_offset.get(LE), header.sh_size.get(LE), cap).ok().flatten()
}

/// Reads `file` (see the module docs): the headers first, then only the tables needed, each
/// asked of the file's [`FileBudget`] before it is read. `None` when it is not a
/// little-endian x86_64 ELF, its headers are refused, or it has no unwind data left.
/// Reads the file within its budgets. `early` is given the kernel walk's part as soon as it
/// is known, before the symbols and lines (the file is then not refused any more: what no
/// share holds of those is left out).
pub(super) fn read(file: File, name: &str, path: &str, early: impl FnOnce(EarlyRows)) -> Option<ModuleFile> {
    let mut budget = FileBudget::of(&file).ok()?;
    let ehdr: Header = *read_array::<Header>(&file, &mut budget, 0, 1, 64).ok()?.first()?;
    if ehdr.e_ident.magic != object::elf::ELFMAG
        || ehdr.e_ident.class != object::elf::ELFCLASS64
        || ehdr.e_ident.data != object::elf::ELFDATA2LSB
        || ehdr.e_machine.get(LE) != object::elf::EM_X86_64
    {
        return None;
    }
    let sections = read_sections(&file, &mut budget, &ehdr)?;
    let mut bytes = 512 + name.len();
    let range = |h: &SectionHeader| {
        let start = h.sh_addr.get(LE);
        Some(start..start.checked_add(h.sh_size.get(LE))?)
    };
    let text = sections.by_name(".text").and_then(range);
    let got = sections.by_name(".got").and_then(range);
    let mut unwind = |wanted: &str| -> Option<(Range<u64>, SharedBytes)> {
        let h = sections.by_name(wanted)?;
        let data = section_data(&file, &mut budget, h, MAX_SECTION_BYTES)?;
        bytes += data.len();
        Some((range(h)?, SharedBytes(Arc::from(data))))
    };
    let eh_frame = unwind(".eh_frame");
    let eh_frame_hdr = unwind(".eh_frame_hdr");
    let debug_frame = unwind(".debug_frame").map(|(_, d)| d);
    let unwind_rows = kernel_rows(
        eh_frame.as_ref().map(|(range, data)| (&data.0[..], range.start)),
        debug_frame.as_deref(),
        text.as_ref().map(|t| t.start),
    );
    bytes += unwind_rows.as_ref().map_or(0, |r| r.len() * size_of::<profiler_common::UnwindRow>());
    // Program headers: the loadable segments.
    let phnum = usize::from(ehdr.e_phnum.get(LE));
    let segments: Vec<Segment> = if phnum == 0 || phnum > MAX_SEGMENTS {
        if phnum > MAX_SEGMENTS {
            Refusal::TooMany.count();
        }
        Vec::new()
    } else {
        read_array::<ProgramHeader>(&file, &mut budget, ehdr.e_phoff.get(LE), phnum, (MAX_SEGMENTS * 56) as u64)
            .unwrap_or_default()
            .iter()
            .filter(|p| p.p_type.get(LE) == object::elf::PT_LOAD)
            .take(64)
            .map(|p| Segment { offset: p.p_offset.get(LE), address: p.p_vaddr.get(LE), size: p.p_filesz.get(LE) })
            .collect()
    };
    let build_id = build_id(&file, &mut budget, &sections);
    let (file_name, build_id): (Arc<str>, Arc<str>) = (Arc::from(path), Arc::from(build_id));
    bytes += path.len() + build_id.len();
    let mappings = segments
        .iter()
        .map(|s| {
            Arc::new(NativeMapping {
                file: file_name.clone(),
                build_id: build_id.clone(),
                start: s.address,
                limit: s.address.saturating_add(s.size),
                offset: s.offset,
            })
        })
        .collect();
    // What no share of the cache can hold is left out: lines first, then symbols.
    let unwind_bytes = bytes;
    if unwind_bytes > MAX_FILE_BYTES {
        Refusal::OverShare.count();
        return None;
    }
    early(EarlyRows { rows: unwind_rows.clone(), segments: segments.clone() });
    // Symbols before lines: names matter more, should the read budget run short.
    let mut symbols = read_symbols(&file, &mut budget, &sections);
    let mut lines = read_lines(&file, &mut budget, &sections);
    let symbol_bytes: usize = symbols.iter().map(|s| s.name.len() + 48).sum();
    let line_bytes = lines.as_ref().map_or(0, |l| l.bytes());
    if unwind_bytes + symbol_bytes + line_bytes > MAX_FILE_BYTES && lines.take().is_some() {
        Refusal::OverShare.count();
    }
    if unwind_bytes + symbol_bytes > MAX_FILE_BYTES && !symbols.is_empty() {
        Refusal::OverShare.count();
        symbols = Vec::new();
    }
    bytes += symbols.iter().map(|s| s.name.len() + 48).sum::<usize>() + lines.as_ref().map_or(0, |l| l.bytes());
    Some(ModuleFile {
        name: Arc::from(name),
        musl_libc: super::musl::is_musl_libc(path),
        text,
        got,
        eh_frame,
        eh_frame_hdr,
        debug_frame,
        unwind_rows,
        segments,
        mappings,
        symbols,
        lines,
        bytes,
    })
}

/// The kernel walk's rows of a file from its `.eh_frame` (bytes, address) and
/// `.debug_frame` (`unwind_table::merge`: `.eh_frame` wins, `.debug_frame` fills its gaps),
/// `None` without either or when refused (counted: `Refusal::UnwindRows`, the file is then
/// walked with frame pointers). A `.debug_frame` the walk cannot use (it does not parse, has
/// too many rows alone or merged, or code above 4 GiB) leaves the `.eh_frame` rows alone
/// (`Refusal::DebugFrameRows`); an `.eh_frame` it cannot use refuses the file whatever its
/// `.debug_frame` (which rules `.eh_frame` meant to give is unknown).
fn kernel_rows(eh_frame: Option<(&[u8], u64)>, debug_frame: Option<&[u8]>, text: Option<u64>) -> Option<Arc<[profiler_common::UnwindRow]>> {
    use super::unwind_table::{compact, debug_frame_rows, merge, rows};
    // `.eh_frame`'s rows and their kernel form (each refusal counted once per file).
    let eh = match eh_frame.map(|(data, address)| rows(data, address, text, MAX_TABLE_ROWS).and_then(|r| Ok((compact(&r)?, r)))) {
        Some(Ok(eh)) => Some(eh),
        Some(Err(_)) => {
            Refusal::UnwindRows.count();
            return None;
        }
        None => None,
    };
    if let Some(debug) = debug_frame {
        let eh_rows = eh.as_ref().map_or(&[][..], |(_, r)| &r[..]);
        match debug_frame_rows(debug, MAX_TABLE_ROWS).and_then(|d| merge(eh_rows, &d, MAX_TABLE_ROWS)).and_then(|m| compact(&m)) {
            Ok(merged) => return Some(Arc::from(merged)),
            Err(_) if eh_rows.is_empty() => {
                Refusal::UnwindRows.count();
                return None;
            }
            Err(_) => Refusal::DebugFrameRows.count(),
        }
    }
    eh.map(|(compacted, _)| Arc::from(compacted))
}

/// The section headers and their names, within `MAX_SECTIONS` (extended numbering
/// included) and the budget.
fn read_sections(file: &File, budget: &mut FileBudget, ehdr: &Header) -> Option<Sections> {
    let shoff = ehdr.e_shoff.get(LE);
    if shoff == 0 || usize::from(ehdr.e_shentsize.get(LE)) != std::mem::size_of::<SectionHeader>() {
        return Some(Sections { headers: Vec::new(), names: Vec::new() });
    }
    let first: SectionHeader = *read_array::<SectionHeader>(file, budget, shoff, 1, 64).ok()?.first()?;
    let shnum = match ehdr.e_shnum.get(LE) {
        0 => first.sh_size.get(LE),
        n => u64::from(n),
    };
    if shnum > MAX_SECTIONS as u64 {
        Refusal::TooMany.count();
        return None;
    }
    let headers = read_array::<SectionHeader>(file, budget, shoff, shnum as usize, (MAX_SECTIONS * 64) as u64).ok()?;
    let shstrndx = match ehdr.e_shstrndx.get(LE) {
        object::elf::SHN_XINDEX => first.sh_link.get(LE) as usize,
        n => usize::from(n),
    };
    let names = headers.get(shstrndx).and_then(|h| section_data(file, budget, h, MAX_SECTION_NAMES_BYTES)).unwrap_or_default();
    Some(Sections { headers, names })
}

/// The GNU build id from the note sections, hex.
fn build_id(file: &File, budget: &mut FileBudget, sections: &Sections) -> String {
    for h in sections.headers.iter().filter(|h| h.sh_type.get(LE) == object::elf::SHT_NOTE) {
        let Some(notes) = section_data(file, budget, h, MAX_NOTES_BYTES) else { continue };
        let mut at = 0usize;
        while let Some(head) = notes.get(at..at + 12) {
            let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]) as usize;
            let (namesz, descsz, kind) = (word(0), word(4), word(8));
            let name_at = at + 12;
            let desc_at = name_at.saturating_add(namesz.saturating_add(3) & !3);
            let next = desc_at.saturating_add(descsz.saturating_add(3) & !3);
            let (Some(name), Some(desc)) = (notes.get(name_at..name_at.saturating_add(namesz)), notes.get(desc_at..desc_at.saturating_add(descsz))) else {
                break;
            };
            if kind == object::elf::NT_GNU_BUILD_ID as usize && name == b"GNU\0" && desc.len() <= 64 {
                return desc.iter().map(|b| format!("{b:02x}")).collect();
            }
            at = next;
        }
    }
    String::new()
}

/// Function symbols of `.symtab` and `.dynsym` (each table and its strings within their
/// caps and the budget; at most `MAX_SYMBOLS`), sorted by start without duplicates.
fn read_symbols(file: &File, budget: &mut FileBudget, sections: &Sections) -> Vec<Symbol> {
    let mut symbols = Vec::new();
    for kind in [object::elf::SHT_SYMTAB, object::elf::SHT_DYNSYM] {
        let Some(table) = sections.headers.iter().find(|h| h.sh_type.get(LE) == kind) else { continue };
        let Some(strings_header) = sections.headers.get(table.sh_link.get(LE) as usize) else { continue };
        // The symbols' size is checked (and refused) before their strings are read.
        let Some(raw) = section_data(file, budget, table, MAX_SYMTAB_BYTES) else { continue };
        let Some(strings) = section_data(file, budget, strings_header, MAX_STRINGS_BYTES) else { continue };
        let syms: &[Sym] = object::pod::slice_from_all_bytes(&raw).unwrap_or_default();
        for sym in syms {
            if symbols.len() >= MAX_SYMBOLS {
                Refusal::TooMany.count();
                break;
            }
            let st_type = sym.st_info & 0xf;
            let (start, size) = (sym.st_value.get(LE), sym.st_size.get(LE));
            if !matches!(st_type, object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC)
                || sym.st_shndx.get(LE) == object::elf::SHN_UNDEF
                || size == 0
                || start == 0
            {
                continue;
            }
            let tail = strings.get(sym.st_name.get(LE) as usize..).unwrap_or_default();
            let tail = &tail[..tail.len().min(MAX_NAME_BYTES + 1)];
            let Some(len) = tail.iter().position(|b| *b == 0) else { continue };
            let Ok(raw) = std::str::from_utf8(&tail[..len]) else { continue };
            if raw.is_empty() {
                continue;
            }
            // Kept as the file has it: `native::demangle` makes it readable where a frame
            // is shown (once per address), not for every symbol of every file.
            let Some(end) = start.checked_add(size) else { continue };
            symbols.push(Symbol { start, end, name: Arc::from(raw) });
        }
    }
    symbols.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    symbols.dedup_by_key(|s| s.start);
    symbols.shrink_to_fit();
    symbols
}

/// The DWARF sections that line tables need (the rest is never read).
const LINE_SECTIONS: [&str; 9] = [
    ".debug_info",
    ".debug_abbrev",
    ".debug_line",
    ".debug_str",
    ".debug_line_str",
    ".debug_ranges",
    ".debug_rnglists",
    ".debug_addr",
    ".debug_str_offsets",
];

/// The line table of the file's DWARF (built here, on the file's reader thread), when it
/// has `.debug_info` and its line sections fit `MAX_DEBUG_BYTES` together (each within
/// `MAX_SECTION_BYTES` and the budget). The sections are dropped once the table is built.
fn read_lines(file: &File, budget: &mut FileBudget, sections: &Sections) -> Option<LineTable> {
    sections.by_name(".debug_info")?;
    let claimed: u64 = LINE_SECTIONS.iter().filter_map(|n| sections.by_name(n)).map(|h| h.sh_size.get(LE)).fold(0, u64::saturating_add);
    if claimed > MAX_DEBUG_BYTES {
        Refusal::OverCap.count();
        return None;
    }
    let mut data: Vec<(&str, Vec<u8>)> = Vec::new();
    for name in LINE_SECTIONS {
        if let Some(h) = sections.by_name(name) {
            // A section refused leaves the table incomplete: none at all.
            data.push((name, section_data(file, budget, h, MAX_SECTION_BYTES)?));
        }
    }
    let lookup = |id: addr2line::gimli::SectionId| -> &[u8] {
        data.iter().find(|(n, _)| *n == id.name()).map_or(&[][..], |(_, d)| &d[..])
    };
    // A parser panic on a hostile file costs the file its lines, nothing more.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| LineTable::build(lookup))).ok()?.ok().flatten()
}

/// The base name of a mapped path.
pub fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_executable_symbols_and_unwind_sections() {
        let exe = std::env::current_exe().expect("exe");
        let file = File::open(&exe).expect("open");
        let m = read(file, "self", "/proc/self/exe", |_| {}).expect("ELF");
        assert!(m.eh_frame.is_some());
        assert!(m.text.is_some());
        assert!(!m.symbols.is_empty());
        // The symbol of a function of this very test binary.
        let f = base_name as fn(&str) -> &str as usize as u64;
        // Find the mapping of our text to translate the address.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let mapping = crate::target::discovery::parse_maps(&maps).into_iter().find(|m| m.contains(f)).expect("mapping");
        let at = m.file_address(mapping.start, mapping.offset, f).expect("address");
        let name = m.symbol(at).expect("symbol");
        assert!(name.contains("base_name"), "{name}");
    }

    /// The test binary's DWARF gives this very function's source file, from the table
    /// built when the file was read (no parsing at lookup). A test binary whose line
    /// sections outgrow `MAX_DEBUG_BYTES` (it grows with the crate) has no table: that is
    /// the cap's documented effect, checked instead.
    #[test]
    fn own_executable_lines_come_from_the_table_built_at_load() {
        let exe = std::env::current_exe().expect("exe");
        let m = read(File::open(&exe).expect("open"), "self", "/proc/self/exe", |_| {}).expect("ELF");
        let f = own_executable_lines_come_from_the_table_built_at_load as fn() as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let mapping = crate::target::discovery::parse_maps(&maps).into_iter().find(|m| m.contains(f)).expect("mapping");
        let at = m.file_address(mapping.start, mapping.offset, f).expect("address");
        let bytes = std::fs::read(&exe).expect("read");
        let elf = object::File::parse(&*bytes).expect("parse");
        use object::{Object as _, ObjectSection as _};
        let claimed: u64 = LINE_SECTIONS.iter().filter_map(|n| elf.section_by_name(n)).map(|s| s.size()).sum();
        if claimed > MAX_DEBUG_BYTES {
            assert!(m.line(at).is_none(), "{claimed} bytes of line sections, over the cap, yet a table");
            return;
        }
        let (file, line) = m.line(at).expect("a line from DWARF");
        assert!(file.ends_with("module_file.rs"), "{file}:{line}");
        assert!(line > 0);
    }

    /// A minimal x86_64 ELF file: one loadable page of code, a `.text` section, and a
    /// `.symtab` at `symtab_offset` claiming `symtab_size` bytes, padded (sparse) to
    /// `len` bytes. The case of issue #28 item 2 (2 GiB `.symtab`, one page on disk).
    pub(crate) fn claiming_elf(path: &std::path::Path, symtab_offset: u64, symtab_size: u64, len: u64) {
        let mut b = vec![0u8; 0x1000];
        let put = |b: &mut Vec<u8>, at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
        put(&mut b, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
        put(&mut b, 16, &3u16.to_le_bytes()); // ET_DYN
        put(&mut b, 18, &62u16.to_le_bytes()); // EM_X86_64
        put(&mut b, 20, &1u32.to_le_bytes());
        put(&mut b, 32, &64u64.to_le_bytes()); // e_phoff
        put(&mut b, 40, &0x200u64.to_le_bytes()); // e_shoff
        put(&mut b, 52, &64u16.to_le_bytes());
        put(&mut b, 54, &56u16.to_le_bytes());
        put(&mut b, 56, &1u16.to_le_bytes()); // e_phnum
        put(&mut b, 58, &64u16.to_le_bytes());
        put(&mut b, 60, &5u16.to_le_bytes()); // e_shnum
        put(&mut b, 62, &4u16.to_le_bytes()); // e_shstrndx
        // PT_LOAD R+X: the first page.
        put(&mut b, 64, &1u32.to_le_bytes());
        put(&mut b, 68, &5u32.to_le_bytes());
        put(&mut b, 64 + 32, &0x1000u64.to_le_bytes());
        put(&mut b, 64 + 40, &0x1000u64.to_le_bytes());
        put(&mut b, 0x100, b"\0.text\0.symtab\0.strtab\0.shstrtab\0");
        put(&mut b, 0x180, b"\0f\0");
        let section = |b: &mut Vec<u8>, i: usize, name: u32, kind: u32, addr: u64, offset: u64, size: u64, link: u32, entsize: u64| {
            let at = 0x200 + 64 * i;
            put(b, at, &name.to_le_bytes());
            put(b, at + 4, &kind.to_le_bytes());
            put(b, at + 16, &addr.to_le_bytes());
            put(b, at + 24, &offset.to_le_bytes());
            put(b, at + 32, &size.to_le_bytes());
            put(b, at + 40, &link.to_le_bytes());
            put(b, at + 56, &entsize.to_le_bytes());
        };
        section(&mut b, 1, 1, 1, 0x400, 0x400, 0x100, 0, 0); // .text
        section(&mut b, 2, 7, 2, 0, symtab_offset, symtab_size, 3, 24); // .symtab
        section(&mut b, 3, 15, 3, 0, 0x180, 3, 0, 0); // .strtab
        section(&mut b, 4, 23, 3, 0, 0x100, 0x21, 0, 0); // .shstrtab
        let mut file = File::create(path).expect("create");
        std::io::Write::write_all(&mut file, &b).expect("write");
        file.set_len(len).expect("sparse length");
    }

    #[test]
    fn a_sparse_file_claiming_a_2_gib_symtab_is_read_without_it() {
        let path = std::env::temp_dir().join(format!("pyperch-claiming-{}", std::process::id()));
        claiming_elf(&path, 0x1000, 2 << 30, (2 << 30) + 0x1000);
        let before = super::super::budget::refused_total();
        let m = read(File::open(&path).expect("open"), "claiming", "claiming", |_| {}).expect("its headers are fine");
        assert!(m.symbols.is_empty());
        assert_eq!(m.text, Some(0x400..0x500));
        assert!(m.bytes < 1 << 20, "{} bytes kept", m.bytes);
        assert!(super::super::budget::refused_total() > before, "the refusal is counted");
        // Within its cap but not on disk: refused too.
        claiming_elf(&path, 0x1000, 24 << 20, 64 << 20);
        let m = read(File::open(&path).expect("open"), "claiming", "claiming", |_| {}).expect("ELF");
        assert!(m.symbols.is_empty());
        let _ = std::fs::remove_file(&path);
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// A header field of `base` (ELF header, a section or program header) set to a
        /// value that makes size and offset arithmetic interesting, or random bytes.
        fn patch(base: &[u8]) -> impl Strategy<Value = (u64, Vec<u8>)> + use<> {
            let len = base.len() as u64;
            let u64_at = |at: usize| base.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
            let u16_at = |at: usize| base.get(at..at + 2).map_or(0, |b| u64::from(u16::from_le_bytes(b.try_into().unwrap_or([0; 2]))));
            let (phoff, phnum, shoff, shnum) = (u64_at(32), u16_at(56).max(1), u64_at(40), u16_at(60).max(1));
            let interesting = prop_oneof![
                Just(0u64),
                Just(1),
                Just(len),
                Just(u64::MAX),
                Just(u64::MAX / 24),
                Just(2 << 30),
                Just(MAX_SYMTAB_BYTES),
                Just(MAX_SECTION_BYTES + 1),
                0..len.max(1),
                any::<u64>(),
            ];
            let width = |v: u64, w: usize| v.to_le_bytes()[..w].to_vec();
            prop_oneof![
                (prop::sample::select(vec![(32u64, 8usize), (40, 8), (54, 2), (56, 2), (60, 2), (62, 2)]), interesting.clone())
                    .prop_map(move |((at, w), v)| (at, width(v, w))),
                (0..shnum, prop::sample::select(vec![(0u64, 4usize), (4, 4), (24, 8), (32, 8), (40, 4), (56, 8)]), interesting.clone())
                    .prop_map(move |(i, (field, w), v)| (shoff + 64 * i + field, width(v, w))),
                (0..phnum, prop::sample::select(vec![(0u64, 4usize), (8, 8), (16, 8), (32, 8)]), interesting)
                    .prop_map(move |(i, (field, w), v)| (phoff + 56 * i + field, width(v, w))),
                (0..len.max(1), prop::collection::vec(any::<u8>(), 1..16)),
            ]
        }

        fn bases() -> Vec<Vec<u8>> {
            let dir = std::env::temp_dir().join(format!("pyperch-fuzz-base-{}", std::process::id()));
            claiming_elf(&dir, 0x1000, 0x30, 0x1000);
            let mut bases = vec![std::fs::read(&dir).expect("read the base")];
            let _ = std::fs::remove_file(&dir);
            if let Ok(t) = std::fs::read("/bin/true") {
                bases.push(t);
            }
            bases
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
            /// A module file with any of its headers forged (sparse or not) never panics the
            /// reader and keeps no more than a file's share.
            #[test]
            fn forged_headers_are_read_within_budget(
                (base, patches, sparse) in (0..2usize, any::<bool>()).prop_flat_map(|(i, sparse)| {
                    let all = bases();
                    let base = all[i % all.len()].clone();
                    (Just(base.clone()), prop::collection::vec(patch(&base), 1..6), Just(sparse))
                })
            ) {
                let mut bytes = base;
                for (at, p) in &patches {
                    let Ok(at) = usize::try_from(*at) else { continue };
                    if let Some(slot) = at.checked_add(p.len()).and_then(|end| bytes.get_mut(at..end)) {
                        slot.copy_from_slice(p);
                    }
                }
                let path = std::env::temp_dir().join(format!("pyperch-fuzz-{}-{}", std::process::id(), random_suffix()));
                std::fs::write(&path, &bytes).expect("write");
                if sparse {
                    File::options().write(true).open(&path).and_then(|f| f.set_len(8 << 30)).expect("sparse");
                }
                let read_back = read(File::open(&path).expect("open"), "fuzz", "fuzz", |_| {});
                let _ = std::fs::remove_file(&path);
                if let Some(m) = read_back {
                    prop_assert!(m.bytes <= MAX_FILE_BYTES + (1 << 20), "{} bytes kept", m.bytes);
                    prop_assert!(m.segments.len() <= 64);
                    prop_assert!(m.symbols.len() <= MAX_SYMBOLS);
                }
            }
        }

        fn random_suffix() -> u64 {
            use std::sync::atomic::AtomicU64;
            static N: AtomicU64 = AtomicU64::new(0);
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// The kernel's rows of a file from both call frame sections: `.debug_frame` fills
    /// `.eh_frame`'s gaps; one it cannot use is left out (counted) beside a usable
    /// `.eh_frame`, refuses the file without one; an unusable `.eh_frame` refuses the file.
    #[test]
    fn kernel_rows_merge_or_refuse_by_section() {
        use super::super::{budget::refused, unwind_table::debug_frame_tests::cfi};
        let eh = cfi(false, &[(0x1000, 0x10, &[])]);
        let debug = cfi(true, &[(0x1000, 0x40, &[0x44, 0x0e, 16]), (0x1020, 0x10, &[])]);
        let high = cfi(true, &[(0x1_0000_0000, 0x10, &[])]);
        let pcs = |rows: Option<Arc<[profiler_common::UnwindRow]>>| rows.map(|r| r.iter().map(|r| (r.pc, r.cfa_kind())).collect::<Vec<_>>());
        use profiler_common::cfa_kind::{NONE, RSP};
        // .eh_frame's FDE covers 0x1000..0x1010 (rsp + 8 throughout); .debug_frame's first FDE
        // (rsp + 16 from 0x1004) fills on from there to 0x1040; its second lies inside the
        // first and is ignored.
        let merged = pcs(kernel_rows(Some((&eh, 0x8000)), Some(&debug), None)).expect("rows");
        assert_eq!(merged, vec![(0x1000, RSP), (0x1010, RSP), (0x1040, NONE)]);
        let before = (refused(Refusal::DebugFrameRows), refused(Refusal::UnwindRows));
        assert_eq!(pcs(kernel_rows(Some((&eh, 0x8000)), Some(&high), None)), Some(vec![(0x1000, RSP), (0x1010, NONE)]));
        assert!(refused(Refusal::DebugFrameRows) > before.0);
        assert_eq!(pcs(kernel_rows(None, Some(&high), None)), None);
        assert_eq!(pcs(kernel_rows(Some((&[0u8; 0][..], 0x8000)), Some(&high), None)), None);
        assert_eq!(pcs(kernel_rows(Some((&[0xff; 64][..], 0x8000)), Some(&debug), None)), None);
        let eh_high = cfi(false, &[(0x1_0000_0000, 0x10, &[])]);
        assert_eq!(pcs(kernel_rows(Some((&eh_high, 0x8000)), Some(&debug), None)), None);
        assert!(refused(Refusal::UnwindRows) >= before.1 + 4);
        // Neither section: no table; .eh_frame alone: as before.
        assert_eq!(pcs(kernel_rows(None, None, None)), None);
        assert_eq!(pcs(kernel_rows(Some((&eh, 0x8000)), None, None)), Some(vec![(0x1000, RSP), (0x1010, NONE)]));
    }

    #[test]
    fn garbage_is_not_a_module() {
        let dir = std::env::temp_dir().join(format!("pyperch-native-{}", std::process::id()));
        std::fs::write(&dir, b"\x7fELF garbage").expect("write");
        assert!(read(File::open(&dir).expect("open"), "x", "x", |_| {}).is_none());
        let _ = std::fs::remove_file(&dir);
    }
}

/// Fuzz target (see `crate::fuzzing`): `--native` reads the ELF files a target maps, its
/// symbols, unwind sections and DWARF line tables, from files the target may have written.
/// Mutations of a small real ELF with line tables (built with `cc -g` when there is a C
/// compiler, else the system's libz): reading and every lookup end without a panic.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// The seed file's bytes, built once per run.
    fn seed() -> &'static [u8] {
        static SEED: OnceLock<Vec<u8>> = OnceLock::new();
        SEED.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("pyperch-fuzz-elf-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&dir);
            let source = dir.join("seed.c");
            let out = dir.join("seed.so");
            let _ = std::fs::write(&source, "int leaf(int x) { return x * 3; }\nint caller(int y) { return leaf(y) + 1; }\n");
            let built = std::process::Command::new("cc")
                .args(["-g", "-O0", "-shared", "-fPIC", "-o"])
                .arg(&out)
                .arg(&source)
                .status()
                .is_ok_and(|s| s.success());
            let bytes = if built { std::fs::read(&out).ok() } else { None };
            let _ = std::fs::remove_dir_all(&dir);
            bytes.or_else(|| std::fs::read("/usr/lib/x86_64-linux-gnu/libz.so.1").ok()).unwrap_or_default()
        })
    }

    fn mutated() -> impl Strategy<Value = Vec<u8>> {
        let len = seed().len().max(1);
        (
            prop::collection::vec((prop_oneof![0..len.min(4096), 0..len, len.saturating_sub(4096)..len], any::<u8>()), 0..24),
            prop_oneof![3 => Just(None), 1 => (0..len).prop_map(Some)],
        )
            .prop_map(|(flips, cut)| {
                let mut bytes = seed().to_vec();
                for (at, value) in flips {
                    if let Some(b) = bytes.get_mut(at) {
                        *b = value;
                    }
                }
                if let Some(cut) = cut {
                    bytes.truncate(cut);
                }
                bytes
            })
    }

    proptest! {
        #![proptest_config(crate::fuzzing::config(24))]

        #[test]
        fn fuzz_native_module_file(bytes in mutated(), probes in prop::collection::vec(0u64..0x10000, 1..16)) {
            let path = std::env::temp_dir().join(format!("pyperch-fuzz-module-{}-{:?}", std::process::id(), std::thread::current().id()));
            std::fs::write(&path, &bytes).expect("write");
            let file = File::open(&path).expect("open");
            let read = read(file, "fuzz", "/fuzz", |_| {});
            let _ = std::fs::remove_file(&path);
            if let Some(m) = read {
                for address in probes {
                    let _ = (m.symbol(address), m.origin(address), m.line(address));
                    let _ = (m.file_address(0x1000, 0, address), m.base_address(address, 0));
                }
            }
        }
    }
}
