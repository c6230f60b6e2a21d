//! What an ELF file says about the CPython in it, read once per file.
//!
//! Only a few ranges of a file are read (headers, symbol tables, a few bytes at known
//! addresses), through `object`'s `ReadCache`, so mapping a huge library costs little.
//! Everything read is untrusted: a malformed file is "not Python", never a panic.
//!
//! A file is Python when it defines `_PyRuntime` (in `.dynsym`, else `.symtab`) or has a
//! `.PyRuntime` section; it is an *old* Python (before 3.7, no `_PyRuntime`) when it only
//! defines `PyCode_Type`.

use std::fs::File;
use std::io;

use object::elf::{EM_X86_64, ET_EXEC, PT_LOAD, R_X86_64_GLOB_DAT, SHN_UNDEF, SHT_DYNSYM, SHT_RELA, SHT_SYMTAB};
use object::read::ReadCache;
use object::read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::{Endianness, ReadRef};

use crate::layout::debug_offsets;

type Elf = object::elf::FileHeader64<Endianness>;
type Data<'a> = &'a ReadCache<File>;

/// A `.symtab` larger than this is not read (only stripped-export embeddings need it).
const MAX_SYMTAB_BYTES: u64 = 16 << 20;
/// Bytes of an accessor function decoded by `tls`.
const ACCESSOR_BYTES: usize = 64;
/// A `.rodata` larger than this is not searched for a version string.
const MAX_RODATA_BYTES: u64 = 32 << 20;

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
}

/// What one file is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileFacts {
    /// Not an x86_64 ELF file, or no CPython in it.
    Other,
    /// Defines `PyCode_Type` but not `_PyRuntime`: a CPython older than 3.7.
    OldPython,
    Python(Box<PythonFile>),
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

/// A symbol table with its string table, read in one piece each.
struct Table<'a> {
    syms: &'a [object::elf::Sym64<Endianness>],
    strings: &'a [u8],
}

impl<'a> Table<'a> {
    fn load(
        data: Data<'a>,
        endian: Endianness,
        sections: &'a [object::elf::SectionHeader64<Endianness>],
        index: usize,
    ) -> Option<Self> {
        let section = sections.get(index)?;
        let syms = section.data_as_array(endian, data).ok()?;
        let strings = sections.get(section.sh_link(endian) as usize)?.data(endian, data).ok()?;
        Some(Self { syms, strings })
    }

    fn name(&self, endian: Endianness, sym: &object::elf::Sym64<Endianness>) -> &'a [u8] {
        let start = sym.st_name(endian) as usize;
        let tail = self.strings.get(start..).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
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

/// Parses the file. `Ok(Other)` for anything that is not a 64-bit little-endian x86_64 ELF;
/// `Err` when an x86_64 ELF could not be read through (not to be cached).
pub fn parse(file: File) -> io::Result<FileFacts> {
    let cache = ReadCache::new(file);
    let data: Data<'_> = &cache;
    let Ok(header) = Elf::parse(data) else { return Ok(FileFacts::Other) };
    let Ok(endian) = header.endian() else { return Ok(FileFacts::Other) };
    if endian != Endianness::Little || header.e_machine(endian) != EM_X86_64 {
        return Ok(FileFacts::Other);
    }
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("malformed ELF file: {what}"));
    let phdrs = header.program_headers(endian, data).map_err(|_| bad("program headers"))?;
    let sections = header.section_headers(endian, data).map_err(|_| bad("section headers"))?;
    let section_names = header
        .shstrndx(endian, data)
        .ok()
        .and_then(|i| sections.get(i as usize))
        .and_then(|s| s.data(endian, data).ok())
        .unwrap_or_default();
    let section_name = |s: &object::elf::SectionHeader64<Endianness>| {
        let tail = section_names.get(s.sh_name(endian) as usize..).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
    };

    let mut symbols = Symbols::default();
    let dynsym_index = sections.iter().position(|s| s.sh_type(endian) == SHT_DYNSYM);
    let dynsym = dynsym_index.and_then(|i| Table::load(data, endian, sections, i));
    if let Some(table) = &dynsym {
        table.collect(endian, &mut symbols);
    }
    if symbols.get(b"_PyRuntime").is_none() {
        let symtab =
            sections.iter().position(|s| s.sh_type(endian) == SHT_SYMTAB && s.sh_size(endian) <= MAX_SYMTAB_BYTES);
        if let Some(table) = symtab.and_then(|i| Table::load(data, endian, sections, i)) {
            table.collect(endian, &mut symbols);
        }
    }
    let runtime_section = sections.iter().find(|s| section_name(s) == b".PyRuntime");
    let runtime = match (symbols.get(b"_PyRuntime"), runtime_section) {
        (Some(found), section) => {
            let size = if found.size != 0 { found.size } else { section.map_or(0, |s| s.sh_size(endian)) };
            Found { value: found.value, size }
        }
        (None, Some(section)) => Found { value: section.sh_addr(endian), size: section.sh_size(endian) },
        (None, None) if symbols.get(b"PyCode_Type").is_some() => return Ok(FileFacts::OldPython),
        (None, None) => return Ok(FileFacts::Other),
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
        return Ok(FileFacts::Other);
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
            .find(|s| section_name(s) == b".rodata" && s.sh_size(endian) <= MAX_RODATA_BYTES)
            .and_then(|s| s.data(endian, data).ok())
            .map(version_strings)
            .unwrap_or_default()
    } else {
        Vec::new()
    };

    Ok(FileFacts::Python(Box::new(PythonFile {
        is_exec: header.e_type(endian) == ET_EXEC,
        loads,
        runtime: runtime.value,
        runtime_size: runtime.size,
        code_type: symbols.get(b"PyCode_Type").map(|f| f.value),
        str_type: symbols.get(b"PyUnicode_Type").map(|f| f.value),
        bytes_type: symbols.get(b"PyBytes_Type").map(|f| f.value),
        py_version,
        debug_offsets,
        gilstate_tls,
        tss_key_offset,
        marker_minor,
        version_strings,
    })))
}

/// Whether the GOT slot at `slot` is filled (`R_X86_64_GLOB_DAT`) with the address of the
/// dynamic symbol `name`.
fn got_slot_names(
    data: Data<'_>,
    endian: Endianness,
    sections: &[object::elf::SectionHeader64<Endianness>],
    dynsym_index: usize,
    dynsym: &Table<'_>,
    slot: u64,
    name: &[u8],
) -> bool {
    sections
        .iter()
        .filter(|s| s.sh_type(endian) == SHT_RELA && s.sh_link(endian) as usize == dynsym_index)
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
