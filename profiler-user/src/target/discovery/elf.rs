//! What an ELF file says about the CPython in it, read once per file.
//!
//! Only a few ranges of a file are read (headers, symbol tables, a few bytes at known
//! addresses), through `object`'s `ReadCache`, so mapping a huge library costs little.
//! Everything read is untrusted: a malformed file is "not Python", never a panic.
//!
//! A file is Python when it defines `_PyRuntime` (in `.dynsym`, else `.symtab`) or has a
//! `.PyRuntime` section; it is an *old* Python (before 3.7, no `_PyRuntime`) when it only
//! defines `PyCode_Type`.
//!
//! # Bounded by bytes
//!
//! Every size and count in a file is the file's word, and a sparse file can claim gigabytes
//! at no cost to whoever made it. So, before anything is read:
//! - a table larger than its cap (`MAX_*` below, each far above what real CPython builds
//!   have) is not read at all: it is treated as absent, and [`oversized_tables`] counts it.
//!   A file whose `.dynsym` is oversized is therefore "not Python" unless its `.symtab` or a
//!   `.PyRuntime` section says otherwise;
//! - more than [`MAX_SECTIONS`] section headers or [`MAX_SEGMENTS`] program headers make the
//!   file "not Python" (counted too);
//! - every read goes through [`Budgeted`], which refuses reads once [`MAX_BYTES_READ`] bytes
//!   have been asked for, so a file costs at most that much memory and reading time however
//!   its tables are arranged (the `ReadCache` keeps what it read until the file is parsed);
//! - names are compared within [`MAX_NAME_BYTES`] bytes, so a string table without NULs
//!   costs no more than one with them (no quadratic scans).
//!
//! A range beyond the end of the file is refused by `ReadCache` without reading.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use object::elf::{EM_X86_64, ET_EXEC, PT_LOAD, R_X86_64_GLOB_DAT, SHN_UNDEF, SHT_DYNSYM, SHT_RELA, SHT_SYMTAB};
use object::read::ReadCache;
use object::read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::{Endianness, ReadRef};

use crate::target::layout::{Version, code_generation::has_creation_counter, debug_offsets};

type Elf = object::elf::FileHeader64<Endianness>;
type Sections<'a> = &'a [object::elf::SectionHeader64<Endianness>];

/// Section headers read at most (real CPython files have about 40).
pub const MAX_SECTIONS: usize = 4096;
/// Program headers read at most (real CPython files have at most 15).
pub const MAX_SEGMENTS: usize = 256;
/// A `.dynsym` larger than this is not read. Real `libpython`s have 45-65 KiB; 4 MiB is
/// 170,000 symbols.
const MAX_DYNSYM_BYTES: u64 = 4 << 20;
/// A `.symtab` larger than this is not read (only stripped-export embeddings need it; real
/// `libpython`s have under 400 KiB).
const MAX_SYMTAB_BYTES: u64 = 8 << 20;
/// The string table of a symbol table larger than this is not read (real: under 400 KiB).
const MAX_STRINGS_BYTES: u64 = 8 << 20;
/// A section-name table larger than this is not read (real: under 400 bytes).
const MAX_SECTION_NAMES_BYTES: u64 = 64 << 10;
/// Largest `.AsyncioDebug` section read (3.14/3.15: 0x68 bytes).
const MAX_ASYNCIO_DEBUG_BYTES: u64 = 4096;
/// `SHT_RELA` sections of `.dynsym` read at most, in total (real `.rela.dyn`: under 1 MiB).
const MAX_RELA_BYTES: u64 = 8 << 20;
/// A `.rodata` larger than this is not searched for a version string (real: under 3 MiB).
const MAX_RODATA_BYTES: u64 = 8 << 20;
/// Bytes read from one file at most, all reads together.
pub const MAX_BYTES_READ: u64 = 32 << 20;
/// Symbol and section names are compared within this many bytes; every wanted name is
/// shorter.
const MAX_NAME_BYTES: usize = 64;
/// Bytes of an accessor function decoded by `tls`.
const ACCESSOR_BYTES: usize = 64;

static OVERSIZED_TABLES: AtomicU64 = AtomicU64::new(0);

/// Tables (and header arrays) not read because they were larger than their cap, or because
/// the file's read budget was spent, since the process started.
pub fn oversized_tables() -> u64 {
    OVERSIZED_TABLES.load(Ordering::Relaxed)
}

fn count_oversized() {
    OVERSIZED_TABLES.fetch_add(1, Ordering::Relaxed);
}

/// A file that remembers the first read error, so that a file that could not be read (not
/// cached: retried later) is told from a malformed one (cached as "not Python").
struct Recording<R> {
    file: R,
    error: Option<io::Error>,
}

impl<R> Recording<R> {
    fn note<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result {
            if self.error.is_none() && !matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::Interrupted) {
                self.error = Some(io::Error::new(e.kind(), e.to_string()));
            }
        }
        result
    }
}

impl<R: Read> Read for Recording<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let result = self.file.read(buf);
        self.note(result)
    }
}

/// Seek errors are not noted: a file that cannot seek (not a regular file) is not an ELF file.
impl<R: Seek> Seek for Recording<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// `&ReadCache` with a budget: refuses any read once [`MAX_BYTES_READ`] bytes have been
/// asked for (a read served from the cache is charged again, which only errs on the safe
/// side). A refused read is an `Err`, which every caller treats as "absent" or "malformed".
struct Budgeted<'a, R: Read + Seek> {
    cache: &'a ReadCache<Recording<R>>,
    spent: &'a Cell<u64>,
}

impl<R: Read + Seek> Clone for Budgeted<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Read + Seek> Copy for Budgeted<'_, R> {}

impl<R: Read + Seek> Budgeted<'_, R> {
    fn charge(&self, size: u64) -> Result<(), ()> {
        let spent = self.spent.get().saturating_add(size);
        if spent > MAX_BYTES_READ {
            count_oversized();
            return Err(());
        }
        self.spent.set(spent);
        Ok(())
    }
}

impl<'a, R: Read + Seek> ReadRef<'a> for Budgeted<'a, R> {
    fn len(self) -> Result<u64, ()> {
        self.cache.len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        self.charge(size)?;
        self.cache.read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        // `ReadCache` looks at most 4096 bytes for the delimiter.
        self.charge(range.end.saturating_sub(range.start).min(4096))?;
        self.cache.read_bytes_at_until(range, delimiter)
    }
}

/// What a file is read from: a `File`, or bytes in tests.
trait Source: Read + Seek {}
impl<T: Read + Seek> Source for T {}

type Data<'a> = Budgeted<'a, Box<dyn Source>>;

/// The data of `section` if its size is at most `cap` (else counted and `None`).
fn bounded_data<'a>(
    section: &object::elf::SectionHeader64<Endianness>,
    endian: Endianness,
    data: Data<'a>,
    cap: u64,
) -> Option<&'a [u8]> {
    if section.sh_size(endian) > cap {
        count_oversized();
        return None;
    }
    section.data(endian, data).ok()
}

/// The NUL-terminated name at `start` of `strings`, looked for within [`MAX_NAME_BYTES`]
/// bytes (a longer name is returned cut, and matches no wanted name).
fn name_at(strings: &[u8], start: usize) -> &[u8] {
    let tail = strings.get(start..).unwrap_or_default();
    let tail = &tail[..tail.len().min(MAX_NAME_BYTES)];
    &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
}

/// A `PT_LOAD` segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
}

/// Facts about one CPython ELF file (executable or `libpython`), independent of any process.
/// Addresses are link-time (`st_value`); add the load bias for a process's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonFile {
    /// `ET_EXEC`: loaded at its link addresses (bias 0).
    pub is_exec: bool,
    pub loads: Vec<Segment>,
    /// `_PyRuntime` (or the `.PyRuntime` section).
    pub runtime: u64,
    /// Its size (0 if unknown).
    pub runtime_size: u64,
    pub code_type: Option<u64>,
    /// `PyUnicode_Type` and `PyBytes_Type`: the `ob_type` of the strings and line tables a
    /// code object points to.
    pub str_type: Option<u64>,
    pub bytes_type: Option<u64>,
    /// `_Py_NoneStruct`: None (`--mode exception`).
    pub none: Option<u64>,
    /// 3.12's `_Py_next_func_version` (a 4-byte object, `.dynsym` or `.symtab`): the counter
    /// every new code object bumps (`profiler_common::code_generation::CREATED_AT`).
    pub next_func_version: Option<u64>,
    /// The value of `Py_Version` (3.11+).
    pub py_version: Option<u64>,
    /// The first `MAX_ENCODED_SIZE` bytes of `_PyRuntime`, when they start with the
    /// `_Py_DebugOffsets` cookie (3.13+).
    pub debug_offsets: Option<Vec<u8>>,
    /// `N` when `PyGILState_GetThisThreadState` reads the word at `fsbase - N` (3.15 static).
    pub gilstate_tls: Option<u64>,
    /// The pthread key's offset in `_PyRuntime`, as `PyGILState_GetThisThreadState` uses it.
    pub tss_key_offset: Option<u32>,
    /// The smallest minor version consistent with the symbols present ([`MARKERS`]).
    pub marker_minor: u8,
    /// `(minor, micro)` of strings like `3.9.18` in `.rodata` (searched only when the file
    /// has neither `_Py_DebugOffsets` nor `Py_Version`).
    pub version_strings: Vec<(u8, u8)>,
    /// The `.AsyncioDebug` section (`_Py_AsyncioModuleDebugOffsets`, 3.14+), when the
    /// `_asyncio` module is built into this file.
    pub asyncio_debug: Option<Vec<u8>>,
}

/// What one file is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileFacts {
    /// Not an x86_64 ELF file, or no CPython in it.
    Other,
    /// Defines `PyCode_Type` but not `_PyRuntime`: a CPython older than 3.7.
    OldPython,
    Python(Box<PythonFile>),
    /// No CPython runtime, but a `.AsyncioDebug` section: the `_asyncio` extension module
    /// of 3.14+ built as a shared object. Holds the section's bytes (see `crate::target::asyncio`).
    AsyncioModule(Vec<u8>),
}

/// Symbols looked up in every ELF file.
const WANTED: &[&[u8]] = &[
    b"_PyRuntime",
    b"PyCode_Type",
    b"PyUnicode_Type",
    b"PyBytes_Type",
    b"Py_Version",
    b"PyGILState_GetThisThreadState",
    b"PyCode_NewWithPosOnlyArgs",
    b"PyFrame_GetCode",
    b"_Py_NoneStruct",
    b"_Py_next_func_version",
];

/// `(symbol, minor)`: a file defining `symbol` is CPython 3.minor or later.
/// (`.PyRuntime` implies 3.10, `Py_Version` 3.11.)
const MARKERS: &[(&[u8], u8)] =
    &[(b"_PyRuntime", 7), (b"PyCode_NewWithPosOnlyArgs", 8), (b"PyFrame_GetCode", 9), (b"Py_Version", 11)];

/// A defined symbol: value and size.
#[derive(Clone, Copy, Debug)]
struct Found {
    value: u64,
    size: u64,
}

#[derive(Default)]
struct Symbols {
    found: Vec<(&'static [u8], Found)>,
}

impl Symbols {
    fn get(&self, name: &[u8]) -> Option<Found> {
        self.found.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

/// A symbol table with its string table, read in one piece each (each within its cap).
struct Table<'a> {
    syms: &'a [object::elf::Sym64<Endianness>],
    strings: &'a [u8],
}

impl<'a> Table<'a> {
    fn load(
        data: Data<'a>,
        endian: Endianness,
        sections: Sections<'a>,
        index: usize,
        cap: u64,
    ) -> Option<Self> {
        let section = sections.get(index)?;
        let strings_section = sections.get(section.sh_link(endian) as usize)?;
        if section.sh_size(endian) > cap || strings_section.sh_size(endian) > MAX_STRINGS_BYTES {
            count_oversized();
            return None;
        }
        let syms = section.data_as_array(endian, data).ok()?;
        let strings = strings_section.data(endian, data).ok()?;
        Some(Self { syms, strings })
    }

    fn name(&self, endian: Endianness, sym: &object::elf::Sym64<Endianness>) -> &'a [u8] {
        name_at(self.strings, sym.st_name(endian) as usize)
    }

    /// Adds the defined symbols of [`WANTED`] not found yet.
    fn collect(&self, endian: Endianness, into: &mut Symbols) {
        for sym in self.syms {
            if sym.st_shndx(endian) == SHN_UNDEF {
                continue;
            }
            let name = self.name(endian, sym);
            if let Some(wanted) = WANTED.iter().find(|w| **w == name) {
                if into.get(wanted).is_none() {
                    into.found.push((wanted, Found { value: sym.st_value(endian), size: sym.st_size(endian) }));
                }
            }
        }
    }
}

/// Reads `len` bytes at link address `vaddr` from the file image (zeros past `p_filesz`).
fn read_vaddr(data: Data<'_>, loads: &[Segment], vaddr: u64, len: usize) -> Option<Vec<u8>> {
    let segment = loads.iter().find(|s| s.vaddr <= vaddr && vaddr < s.vaddr.saturating_add(s.memsz))?;
    let within = vaddr - segment.vaddr;
    let mut out = vec![0u8; len];
    if within < segment.filesz {
        let available = usize::try_from(segment.filesz - within).unwrap_or(usize::MAX).min(len);
        let bytes = data.read_bytes_at(segment.offset.checked_add(within)?, available as u64).ok()?;
        out[..available].copy_from_slice(bytes);
    }
    Some(out)
}

/// Parses the file. `Ok(Other)` for anything that is not a 64-bit little-endian x86_64 ELF
/// with CPython in it, including malformed and oversized files (see the module docs);
/// `Err` when reading the file failed (not to be cached: a later scan retries).
pub fn parse(file: File) -> io::Result<FileFacts> {
    parse_source(Box::new(file)).map(|(facts, _)| facts)
}

/// [`parse`], from any source; also gives the bytes read (at most [`MAX_BYTES_READ`]).
fn parse_source(source: Box<dyn Source>) -> io::Result<(FileFacts, u64)> {
    let cache = ReadCache::new(Recording { file: source, error: None });
    let spent = Cell::new(0);
    let facts = parse_data(Budgeted { cache: &cache, spent: &spent });
    match cache.into_inner().error {
        Some(error) => Err(error),
        None => Ok((facts, spent.get())),
    }
}

/// [`parse`] over budgeted data: anything unreadable is `Other`.
fn parse_data(data: Data<'_>) -> FileFacts {
    let Ok(header) = Elf::parse(data) else { return FileFacts::Other };
    let Ok(endian) = header.endian() else { return FileFacts::Other };
    if endian != Endianness::Little || header.e_machine(endian) != EM_X86_64 {
        return FileFacts::Other;
    }
    let (Ok(shnum), Ok(phnum)) = (header.shnum(endian, data), header.phnum(endian, data)) else {
        return FileFacts::Other;
    };
    if shnum > MAX_SECTIONS || phnum > MAX_SEGMENTS {
        count_oversized();
        return FileFacts::Other;
    }
    let (Ok(phdrs), Ok(sections)) = (header.program_headers(endian, data), header.section_headers(endian, data))
    else {
        return FileFacts::Other;
    };
    let section_names = header
        .shstrndx(endian, data)
        .ok()
        .and_then(|i| sections.get(i as usize))
        .and_then(|s| bounded_data(s, endian, data, MAX_SECTION_NAMES_BYTES))
        .unwrap_or_default();
    let section_name =
        |s: &object::elf::SectionHeader64<Endianness>| name_at(section_names, s.sh_name(endian) as usize);

    let mut symbols = Symbols::default();
    let dynsym_index = sections.iter().position(|s| s.sh_type(endian) == SHT_DYNSYM);
    let dynsym = dynsym_index.and_then(|i| Table::load(data, endian, sections, i, MAX_DYNSYM_BYTES));
    if let Some(table) = &dynsym {
        table.collect(endian, &mut symbols);
    }
    if symbols.get(b"_PyRuntime").is_none() {
        let symtab = sections.iter().position(|s| s.sh_type(endian) == SHT_SYMTAB);
        if let Some(table) = symtab.and_then(|i| Table::load(data, endian, sections, i, MAX_SYMTAB_BYTES)) {
            table.collect(endian, &mut symbols);
        }
    }
    let runtime_section = sections.iter().find(|s| section_name(s) == b".PyRuntime");
    let asyncio_debug = sections
        .iter()
        .find(|s| section_name(s) == b".AsyncioDebug")
        .and_then(|s| bounded_data(s, endian, data, MAX_ASYNCIO_DEBUG_BYTES))
        .map(<[u8]>::to_vec);
    let runtime = match (symbols.get(b"_PyRuntime"), runtime_section) {
        (Some(found), section) => {
            let size = if found.size != 0 { found.size } else { section.map_or(0, |s| s.sh_size(endian)) };
            Found { value: found.value, size }
        }
        (None, Some(section)) => Found { value: section.sh_addr(endian), size: section.sh_size(endian) },
        (None, None) if symbols.get(b"PyCode_Type").is_some() => return FileFacts::OldPython,
        (None, None) if asyncio_debug.is_some() => {
            return FileFacts::AsyncioModule(asyncio_debug.unwrap_or_default());
        }
        (None, None) => return FileFacts::Other,
    };

    let loads: Vec<Segment> = phdrs
        .iter()
        .filter(|p| p.p_type(endian) == PT_LOAD)
        .map(|p| Segment {
            vaddr: p.p_vaddr(endian),
            memsz: p.p_memsz(endian),
            offset: p.p_offset(endian),
            filesz: p.p_filesz(endian),
        })
        .collect();
    if loads.is_empty() {
        return FileFacts::Other;
    }

    let debug_offsets = read_vaddr(data, &loads, runtime.value, debug_offsets::MAX_ENCODED_SIZE)
        .filter(|bytes| debug_offsets::has_cookie(bytes));
    let py_version = symbols.get(b"Py_Version").and_then(|found| {
        let width = if found.size == 4 { 4 } else { 8 };
        let bytes = read_vaddr(data, &loads, found.value, width)?;
        let mut word = [0u8; 8];
        word[..width].copy_from_slice(&bytes);
        Some(u64::from_le_bytes(word))
    });

    // 3.12 (`layout::code_generation`) keeps its code-object counter out of `.dynsym`: look
    // in `.symtab` (builds that keep it, such as pyenv's) for that version only.
    let creation_counter = py_version.is_some_and(|v| has_creation_counter(Version::from_hex(v)));
    if creation_counter && symbols.get(b"_Py_next_func_version").is_none() {
        let symtab = sections.iter().position(|s| s.sh_type(endian) == SHT_SYMTAB);
        if let Some(table) = symtab.and_then(|i| Table::load(data, endian, sections, i, MAX_SYMTAB_BYTES)) {
            table.collect(endian, &mut symbols);
        }
    }
    let next_func_version = symbols
        .get(b"_Py_next_func_version")
        .filter(|f| f.size == 4 && creation_counter)
        .map(|f| f.value);

    let accessor = symbols
        .get(b"PyGILState_GetThisThreadState")
        .and_then(|found| Some((found.value, read_vaddr(data, &loads, found.value, ACCESSOR_BYTES)?)));
    let gilstate_tls = accessor.as_ref().and_then(|(vaddr, code)| super::tls::decode_tls_word(code, *vaddr));
    let tss_key_offset = accessor.as_ref().and_then(|(vaddr, code)| {
        let got_is_runtime = |slot: u64| {
            let (Some(dynsym), Some(dynsym_index)) = (&dynsym, dynsym_index) else { return false };
            got_slot_names(data, endian, sections, dynsym_index, dynsym, slot, b"_PyRuntime")
        };
        super::tls::decode_tss_key(code, *vaddr, runtime.value, runtime.size, got_is_runtime)
    });

    let mut marker_minor =
        MARKERS.iter().filter(|(name, _)| symbols.get(name).is_some()).map(|(_, minor)| *minor).max().unwrap_or(7);
    if runtime_section.is_some() {
        marker_minor = marker_minor.max(10);
    }

    let version_strings = if debug_offsets.is_none() && py_version.is_none() {
        sections
            .iter()
            .find(|s| section_name(s) == b".rodata")
            .and_then(|s| bounded_data(s, endian, data, MAX_RODATA_BYTES))
            .map(version_strings)
            .unwrap_or_default()
    } else {
        Vec::new()
    };

    FileFacts::Python(Box::new(PythonFile {
        is_exec: header.e_type(endian) == ET_EXEC,
        loads,
        runtime: runtime.value,
        runtime_size: runtime.size,
        code_type: symbols.get(b"PyCode_Type").map(|f| f.value),
        str_type: symbols.get(b"PyUnicode_Type").map(|f| f.value),
        bytes_type: symbols.get(b"PyBytes_Type").map(|f| f.value),
        none: symbols.get(b"_Py_NoneStruct").map(|f| f.value),
        next_func_version,
        py_version,
        debug_offsets,
        gilstate_tls,
        tss_key_offset,
        marker_minor,
        version_strings,
        asyncio_debug,
    }))
}

/// Whether the GOT slot at `slot` is filled (`R_X86_64_GLOB_DAT`) with the address of the
/// dynamic symbol `name`. Relocation sections beyond [`MAX_RELA_BYTES`] in total are not
/// read.
fn got_slot_names(
    data: Data<'_>,
    endian: Endianness,
    sections: Sections<'_>,
    dynsym_index: usize,
    dynsym: &Table<'_>,
    slot: u64,
    name: &[u8],
) -> bool {
    let mut budget = MAX_RELA_BYTES;
    sections
        .iter()
        .filter(|s| s.sh_type(endian) == SHT_RELA && s.sh_link(endian) as usize == dynsym_index)
        .filter(|s| match budget.checked_sub(s.sh_size(endian)) {
            Some(left) => {
                budget = left;
                true
            }
            None => {
                count_oversized();
                false
            }
        })
        .filter_map(|s| s.data_as_array::<object::elf::Rela64<Endianness>, _>(endian, data).ok())
        .flatten()
        .filter(|r| r.r_offset(endian) == slot && r.r_type(endian, false) == R_X86_64_GLOB_DAT)
        .any(|r| dynsym.syms.get(r.r_sym(endian, false) as usize).is_some_and(|sym| dynsym.name(endian, sym) == name))
}

/// Every distinct `(minor, micro)` of NUL-terminated strings ending in `3.<minor>.<micro>`
/// (optionally followed by a pre-release tag such as `rc1` and a `+`), not preceded by a
/// digit or a dot. `PY_VERSION` is one of them (the linker may merge it into the tail of a
/// longer string such as an install prefix).
pub fn version_strings(rodata: &[u8]) -> Vec<(u8, u8)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(pos) = rodata.get(at..).and_then(|rest| rest.windows(2).position(|w| w == b"3.")) {
        let start = at + pos;
        at = start + 2;
        if start > 0 && matches!(rodata[start - 1], b'0'..=b'9' | b'.') {
            continue;
        }
        if let Some(found) = parse_version_at(&rodata[start + 2..]) {
            if !out.contains(&found) {
                out.push(found);
            }
        }
    }
    out
}

/// Parses `<minor>.<micro>[a|b|rc<n>][+]\0` at the start of `bytes`.
fn parse_version_at(bytes: &[u8]) -> Option<(u8, u8)> {
    fn number(bytes: &[u8]) -> Option<(u8, &[u8])> {
        let len = bytes.iter().take(4).position(|b| !b.is_ascii_digit()).unwrap_or(bytes.len().min(4));
        let value = std::str::from_utf8(bytes.get(..len)?).ok()?.parse().ok()?;
        (len > 0).then_some((value, &bytes[len..]))
    }
    let (minor, rest) = number(bytes)?;
    let rest = rest.strip_prefix(b".")?;
    let (micro, mut rest) = number(rest)?;
    for tag in [&b"rc"[..], b"a", b"b"] {
        if let Some(after) = rest.strip_prefix(tag) {
            rest = number(after)?.1;
            break;
        }
    }
    let rest = rest.strip_prefix(b"+").unwrap_or(rest);
    (rest.first() == Some(&0)).then_some((minor, micro))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_strings_in_rodata() {
        let rodata = b"\x003.13.18\x00x\x003.2.0\x00/root/.pyenv/versions/3.9.18\x00lib3.9.18x\x00\
                       13.1.2\x00Python-3.10.0rc2+\x003.11\x00";
        assert_eq!(version_strings(rodata), [(13, 18), (2, 0), (9, 18), (10, 0)]);
        assert!(version_strings(b"3.").is_empty());
        assert!(version_strings(b"").is_empty());
    }

    #[test]
    fn parses_real_files() {
        let path = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0";
        let Ok(file) = File::open(path) else {
            eprintln!("skipping: {path} is absent");
            return;
        };
        let FileFacts::Python(facts) = parse(file).expect("parses") else { panic!("not Python") };
        assert_eq!(facts.runtime, 0x643340);
        assert_eq!(facts.runtime_size, 0x704a8);
        assert_eq!(facts.py_version.map(|v| v >> 16), Some(0x030c));
        assert_eq!(facts.tss_key_offset, Some(0x60c));
        assert_eq!(facts.gilstate_tls, None);
        assert!(facts.debug_offsets.is_none());
        assert!(!facts.is_exec);
        assert_eq!(facts.marker_minor, 11);

        let own = File::open("/proc/self/exe").expect("own executable");
        assert_eq!(parse(own).expect("parses"), FileFacts::Other);
        let not_elf = File::open("/proc/self/maps").expect("maps");
        assert_eq!(parse(not_elf).expect("parses"), FileFacts::Other);
    }

    /// `(file, pthread key offset, _Py_tss_gilstate TLS offset)` decoded from the accessor.
    const ACCESSORS: &[(&str, Option<u32>, Option<u64>)] = &[
        ("/root/.pyenv/versions/3.8.18/lib/libpython3.8.so.1.0", Some(0x574), None),
        ("/root/.pyenv/versions/3.9.18/lib/libpython3.9.so.1.0", Some(0x24c), None),
        ("/root/.pyenv/versions/3.10.13/lib/libpython3.10.so.1.0", Some(0x24c), None),
        ("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", Some(0x254), None),
        ("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0", Some(0x60c), None),
        ("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0", Some(0x874), None),
        ("/usr/bin/python3.11", Some(0x254), None),
        ("/root/.cache/pyperch/sid-rootfs/usr/bin/python3.13", Some(0x874), None),
        ("/root/.cache/pyperch/sid-rootfs/usr/bin/python3.14", Some(0x924), None),
        ("/root/.cache/pyperch/sid-rootfs/usr/bin/python3.15", None, Some(0x28)),
    ];

    #[test]
    fn accessors_of_real_files() {
        for (path, key, tls) in ACCESSORS {
            let Ok(file) = File::open(path) else {
                eprintln!("skipping: {path} is absent");
                continue;
            };
            let FileFacts::Python(facts) = parse(file).expect("parses") else { panic!("{path}: not Python") };
            assert_eq!((facts.tss_key_offset, facts.gilstate_tls), (*key, *tls), "{path}");
            assert!(facts.code_type.is_some(), "{path}");
            assert!(facts.str_type.is_some() && facts.bytes_type.is_some(), "{path}");
        }
    }
}

/// Test sources: a real file's bytes with patches over them, optionally extended with zeros
/// to any length, as a sparse file would be.
#[cfg(test)]
mod overlay {
    use std::io::{self, Read, Seek, SeekFrom};
    use std::sync::Arc;

    pub struct Overlay {
        pub base: Arc<[u8]>,
        /// `(offset, bytes)`, applied in order.
        pub patches: Vec<(u64, Vec<u8>)>,
        pub len: u64,
        pub pos: u64,
    }

    /// The base is left out: it is a whole real file.
    impl std::fmt::Debug for Overlay {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Overlay {{ base: {} bytes, len: {:#x}, patches: {:x?} }}", self.base.len(), self.len, self.patches)
        }
    }

    impl Overlay {
        pub fn new(base: Arc<[u8]>) -> Self {
            let len = base.len() as u64;
            Self { base, patches: Vec::new(), len, pos: 0 }
        }

        pub fn patch(mut self, offset: u64, bytes: &[u8]) -> Self {
            self.patches.push((offset, bytes.to_vec()));
            self
        }
    }

    impl Read for Overlay {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = (self.len.saturating_sub(self.pos)).min(buf.len() as u64) as usize;
            let buf = &mut buf[..n];
            buf.fill(0);
            let start = self.pos;
            for (i, b) in buf.iter_mut().enumerate() {
                if let Some(v) = self.base.get((start + i as u64) as usize) {
                    *b = *v;
                } else {
                    break;
                }
            }
            for (offset, bytes) in &self.patches {
                for (i, v) in bytes.iter().enumerate() {
                    let at = offset.saturating_add(i as u64);
                    if at >= start && at < start + n as u64 {
                        buf[(at - start) as usize] = *v;
                    }
                }
            }
            self.pos += n as u64;
            Ok(n)
        }
    }

    impl Seek for Overlay {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.pos = match pos {
                SeekFrom::Start(p) => p,
                SeekFrom::End(d) => self.len.saturating_add_signed(d),
                SeekFrom::Current(d) => self.pos.saturating_add_signed(d),
            };
            Ok(self.pos)
        }
    }
}

#[cfg(test)]
mod limits {
    use std::sync::Arc;

    use super::overlay::Overlay;
    use super::*;

    /// `(offset of the section header of the first section of type `kind`, its size field)`.
    fn section_header(bytes: &[u8], kind: u32) -> Option<usize> {
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap());
        let (shoff, shnum) = (u64_at(40) as usize, u16_at(60) as usize);
        (0..shnum).map(|i| shoff + 64 * i).find(|at| u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) == kind)
    }

    fn true_bytes() -> Option<Arc<[u8]>> {
        std::fs::read("/bin/true").ok().map(Into::into)
    }

    /// A sparse 8 GiB "copy" of `/bin/true` whose `.dynsym` claims gigabytes (the reported
    /// bug: 8.2 GB resident) costs no more than the read budget, and is not Python.
    #[test]
    fn huge_tables_in_a_sparse_file_are_not_read() {
        let Some(base) = true_bytes() else { return eprintln!("SKIP: no /bin/true") };
        let dynsym = section_header(&base, SHT_DYNSYM).expect("/bin/true has .dynsym");
        let link = u32::from_le_bytes(base[dynsym + 40..dynsym + 44].try_into().unwrap()) as usize;
        let shoff = u64::from_le_bytes(base[40..48].try_into().unwrap()) as usize;
        let dynstr = shoff + 64 * link;
        let sparse = |patches: &[(usize, u64)]| {
            let mut source = Overlay::new(base.clone());
            source.len = 8 << 30;
            for (at, value) in patches {
                source = source.patch(*at as u64, &value.to_le_bytes());
            }
            source
        };
        let cases = [
            vec![(dynsym + 32, 6 << 30)],
            vec![(dynstr + 32, 6 << 30)],
            vec![(dynsym + 32, 6 << 30), (dynsym + 24, 1 << 30), (dynstr + 32, 6 << 30)],
            vec![(dynsym + 32, MAX_DYNSYM_BYTES + 24)],
            vec![(dynsym + 32, u64::MAX)],
        ];
        for patches in cases {
            let before = oversized_tables();
            let (facts, spent) = parse_source(Box::new(sparse(&patches))).expect("parses");
            assert_eq!(facts, FileFacts::Other, "{patches:x?}");
            assert!(spent < 1 << 20, "{patches:x?}: {spent} bytes read");
            assert!(oversized_tables() > before || patches[0].1 == u64::MAX, "{patches:x?}: counted");
        }
        // Extended section numbering: e_shnum = 0 and section 0's sh_size holds the count.
        let (facts, spent) = parse_source(Box::new(sparse(&[(shoff + 32, 1 << 40)]).patch(60, &[0, 0]))).expect("parses");
        assert_eq!(facts, FileFacts::Other);
        assert!(spent < 1 << 20, "{spent} bytes read");
    }

    /// Within the caps, a file made of large tables is read at most `MAX_BYTES_READ` bytes.
    #[test]
    fn every_file_costs_at_most_the_budget() {
        let Some(base) = true_bytes() else { return eprintln!("SKIP: no /bin/true") };
        let shoff = u64::from_le_bytes(base[40..48].try_into().unwrap());
        let shnum = u64::from(u16::from_le_bytes(base[60..62].try_into().unwrap()));
        let mut source = Overlay::new(base.clone());
        source.len = 8 << 30;
        // Every section becomes a just-within-cap symbol table pointing at another.
        for i in 0..shnum {
            let at = shoff + 64 * i;
            source = source
                .patch(at + 4, &SHT_SYMTAB.to_le_bytes())
                .patch(at + 24, &(1u64 << 30).to_le_bytes())
                .patch(at + 32, &MAX_SYMTAB_BYTES.to_le_bytes())
                .patch(at + 40, &((i + 1) % shnum).to_le_bytes()[..4]);
        }
        let (facts, spent) = parse_source(Box::new(source)).expect("parses");
        assert_eq!(facts, FileFacts::Other);
        assert!(spent <= MAX_BYTES_READ, "{spent} bytes read");
    }

    #[test]
    fn names_are_compared_within_a_bound() {
        let strings = [b'x'; 1000];
        assert_eq!(name_at(&strings, 10).len(), MAX_NAME_BYTES);
        assert_eq!(name_at(b"\0_PyRuntime\0", 1), b"_PyRuntime");
        assert_eq!(name_at(b"abc", 7), b"");
        assert!(WANTED.iter().all(|w| w.len() < MAX_NAME_BYTES));
    }
}

#[cfg(test)]
mod fuzz {
    use std::sync::{Arc, LazyLock};

    use proptest::prelude::*;

    use super::overlay::Overlay;
    use super::*;
    use crate::fuzzing::config;

    /// Real ELF files to mutate: a `libpython` (exercises every Python path) and `/bin/true`.
    static BASES: LazyLock<Vec<Arc<[u8]>>> = LazyLock::new(|| {
        let candidates = [
            "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0",
            "/root/.pyenv/versions/3.9.18/lib/libpython3.9.so.1.0",
            "/root/.cache/pyperch/sid-rootfs/usr/bin/python3.15",
            "/bin/true",
        ];
        let found: Vec<Arc<[u8]>> =
            candidates.iter().filter_map(|path| std::fs::read(path).ok()).map(Into::into).collect();
        if found.len() < candidates.len() {
            eprintln!("fuzz: {} of {} base files present", found.len(), candidates.len());
        }
        found
    });

    /// Values that make size and offset arithmetic interesting.
    fn interesting(file_len: u64) -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(file_len),
            Just(file_len.wrapping_sub(1)),
            Just(u64::from(u32::MAX)),
            Just(1 << 32),
            Just(u64::MAX),
            Just(u64::MAX / 24),
            Just(i64::MAX as u64),
            Just(MAX_DYNSYM_BYTES),
            Just(8 << 30),
            0..file_len.max(1),
            any::<u64>(),
        ]
    }

    /// One patch: a header field (ELF header, a section or program header) set to an
    /// interesting value, or random bytes anywhere.
    fn patch(base: &[u8]) -> impl Strategy<Value = (u64, Vec<u8>)> + use<> {
        let len = base.len() as u64;
        let u64_at = |at: usize| base.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        let u16_at = |at: usize| base.get(at..at + 2).map_or(0, |b| u64::from(u16::from_le_bytes(b.try_into().unwrap())));
        let (phoff, phnum, shoff, shnum) = (u64_at(32), u16_at(56).max(1), u64_at(40), u16_at(60).max(1));
        let width = |v: u64, w: usize| v.to_le_bytes()[..w].to_vec();
        prop_oneof![
            // ELF header: e_type, e_phoff, e_shoff, e_phentsize/e_phnum, e_shnum, e_shstrndx.
            (prop::sample::select(vec![(16u64, 2usize), (32, 8), (40, 8), (54, 2), (56, 2), (60, 2), (62, 2)]), interesting(len))
                .prop_map(move |((at, w), v)| (at, width(v, w))),
            // A section header field: name, type, addr, offset, size, link, info, entsize.
            (0..shnum, prop::sample::select(vec![(0u64, 4usize), (4, 4), (16, 8), (24, 8), (32, 8), (40, 4), (44, 4), (56, 8)]), interesting(len))
                .prop_map(move |(i, (field, w), v)| (shoff + 64 * i + field, width(v, w))),
            // A program header field: type, offset, vaddr, filesz, memsz.
            (0..phnum, prop::sample::select(vec![(0u64, 4usize), (8, 8), (16, 8), (32, 8), (40, 8)]), interesting(len))
                .prop_map(move |(i, (field, w), v)| (phoff + 56 * i + field, width(v, w))),
            (0..len.max(1), prop::collection::vec(any::<u8>(), 1..16)),
        ]
    }

    fn mutated() -> impl Strategy<Value = Overlay> {
        assert!(!BASES.is_empty(), "no base ELF file to mutate");
        (0..BASES.len(), any::<bool>())
            .prop_flat_map(|(i, sparse)| {
                let base = BASES[i].clone();
                (Just(base.clone()), Just(sparse), prop::collection::vec(patch(&base), 1..6))
            })
            .prop_map(|(base, sparse, patches)| {
                let mut source = Overlay::new(base);
                if sparse {
                    source.len = 8 << 30;
                }
                source.patches = patches;
                source
            })
    }

    /// Everything a parse gives is bounded, and what follows it (version, layout) does not
    /// panic either.
    fn check(facts: &FileFacts, spent: u64) {
        assert!(spent <= MAX_BYTES_READ);
        if let FileFacts::Python(file) = facts {
            assert!(file.loads.len() <= MAX_SEGMENTS);
            assert!(file.debug_offsets.as_ref().is_none_or(|d| d.len() == debug_offsets::MAX_ENCODED_SIZE));
            assert!(file.version_strings.len() <= 256 * 256);
            if let Ok(version) = super::super::version::determine(file, std::path::Path::new("libpython3.12.so.1.0")) {
                let _ = super::super::version::layout(file, version);
            }
        }
    }

    proptest! {
        #![proptest_config(config(64))]

        #[test]
        fn fuzz_elf_mutations(source in mutated()) {
            let (facts, spent) = parse_source(Box::new(source)).expect("in-memory reads do not fail");
            check(&facts, spent);
        }

        #[test]
        fn fuzz_elf_arbitrary_bytes(mut bytes in prop::collection::vec(any::<u8>(), 0..4096), elf_header in any::<bool>()) {
            if elf_header && bytes.len() >= 20 {
                // A valid ident, class, endianness and machine, so parsing goes further.
                bytes[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
                bytes[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
            }
            let (facts, spent) = parse_source(Box::new(std::io::Cursor::new(bytes))).expect("in-memory reads do not fail");
            check(&facts, spent);
        }

        #[test]
        fn fuzz_version_strings(rodata in prop::collection::vec(prop_oneof![Just(b'3'), Just(b'.'), Just(0u8), Just(b'1'), any::<u8>()], 0..512)) {
            let found = version_strings(&rodata);
            prop_assert!(found.len() <= rodata.len() / 4 + 1);
        }
    }
}
