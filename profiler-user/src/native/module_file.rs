//! One executable file as `--native` needs it: its unwind sections (`.eh_frame`,
//! `.eh_frame_hdr`, `.debug_frame`), its loadable segments and its function symbols
//! (`.symtab` and `.dynsym`). Read through `discovery::open_checked` (inside the target's
//! root, identity-checked, non-blocking), each on a thread of its own (at most
//! `MAX_IN_FLIGHT` at once) that nobody waits for: whoever asked is told through a channel
//! when the read ends. Kept in a process-wide cache keyed by the file's identity (device,
//! inode), bounded in bytes.
//!
//! Every size comes from a hostile file: sections larger than `MAX_SECTION_BYTES` and symbol
//! tables with more than `MAX_SYMBOLS` entries are not read.

use std::{
    collections::HashMap,
    fs::File,
    ops::{Deref, Range},
    sync::{Arc, LazyLock, Mutex, mpsc},
    time::{Duration, Instant},
};

use object::{
    Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadCache, SymbolKind,
    read::elf::ElfFile64,
};

use crate::{
    aggregate::{NativeMapping, NativeOrigin},
    discovery::{FileKey, Mapping, open_checked},
};

/// Reads DWARF sections for `addr2line` (shared bytes, the file's own byte order).
type DwarfReader = addr2line::gimli::EndianArcSlice<addr2line::gimli::RunTimeEndian>;
/// Most bytes of DWARF debug sections kept for one file (past that: no line numbers).
const MAX_DEBUG_BYTES: usize = 96 << 20;
/// Inline levels looked at per address.
const MAX_INLINE_DEPTH: usize = 64;

/// Largest unwind section read from one file.
const MAX_SECTION_BYTES: u64 = 64 << 20;
/// Most function symbols kept from one file.
const MAX_SYMBOLS: usize = 2_000_000;
/// Longer symbol names are not kept (the frame then shows `library+0xADDRESS`).
const MAX_NAME_BYTES: usize = 4096;
/// Bytes the cache of files may hold; past that, files no process uses are dropped.
pub const FILES_BUDGET: usize = 256 << 20;
/// A file that failed is not tried again before this.
const RETRY_AFTER: Duration = Duration::from_secs(10);

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

/// What `--native` keeps of one file.
pub struct ModuleFile {
    /// The file's base name, as shown in frames (`libz.so.1`).
    pub name: Arc<str>,
    pub text: Option<Range<u64>>,
    pub got: Option<Range<u64>>,
    pub eh_frame: Option<(Range<u64>, SharedBytes)>,
    pub eh_frame_hdr: Option<(Range<u64>, SharedBytes)>,
    pub debug_frame: Option<SharedBytes>,
    pub segments: Vec<Segment>,
    /// The pprof mapping of each of `segments` (same index), at link addresses.
    mappings: Vec<Arc<NativeMapping>>,
    /// Sorted by start, without overlaps at the same start.
    symbols: Vec<Symbol>,
    /// Line tables from the file's DWARF (`.debug_info`, `.debug_line`...), when it has them.
    /// Parsed lazily per compilation unit by `addr2line`, behind a lock (not `Sync`).
    debug: Option<Mutex<addr2line::Context<DwarfReader>>>,
    /// Accounted size.
    pub bytes: usize,
}

impl ModuleFile {
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
        let debug = self.debug.as_ref()?;
        // A parser panic on a hostile file costs this frame its line, nothing more.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let context = debug.lock().ok()?;
            let mut frames = context.find_frames(address).skip_all_loads().ok()?;
            let mut found = None;
            for _ in 0..MAX_INLINE_DEPTH {
                let Ok(Some(frame)) = frames.next() else { break };
                if let Some(addr2line::Location { file: Some(file), line: Some(line), .. }) = frame.location {
                    if file.len() <= MAX_NAME_BYTES && line > 0 {
                        found = Some((Arc::from(file), line));
                    }
                }
            }
            found
        }))
        .ok()
        .flatten()
    }

    fn symbol_start(&self, address: u64) -> Option<u64> {
        let i = self.symbols.partition_point(|s| s.start <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        (address < s.end).then_some(s.start)
    }

    /// The address in the file of process address `avma` inside `mapping` (which maps this
    /// file at `mapping.offset`), through the segment holding that offset.
    pub fn file_address(&self, mapping_start: u64, mapping_offset: u64, avma: u64) -> Option<u64> {
        let offset = avma.checked_sub(mapping_start)?.checked_add(mapping_offset)?;
        let seg = self.segments.iter().find(|s| offset >= s.offset && offset - s.offset < s.size.max(1))?;
        Some(seg.address.wrapping_add(offset - seg.offset))
    }

    /// Process address at which file address 0 would be, for the mapping (`base_avma`).
    pub fn base_address(&self, mapping_start: u64, mapping_offset: u64) -> Option<u64> {
        let at = self.file_address(mapping_start, mapping_offset, mapping_start)?;
        Some(mapping_start.wrapping_sub(at))
    }
}

/// Reads `file` (see the module docs). `None` when it is not a little-endian x86_64 ELF.
fn read(file: File, name: &str, path: &str) -> Option<ModuleFile> {
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<object::LittleEndian, _>::parse(&cache).ok()?;
    if elf.architecture() != object::Architecture::X86_64 {
        return None;
    }
    let mut bytes = 512 + name.len();
    let mut section = |wanted: &str, keep_data: bool| -> Option<(Range<u64>, Option<SharedBytes>)> {
        let s = elf.section_by_name(wanted)?;
        let range = s.address()..s.address().checked_add(s.size())?;
        if !keep_data {
            return Some((range, None));
        }
        if s.size() > MAX_SECTION_BYTES {
            return None;
        }
        let data = s.data().ok()?;
        bytes += data.len();
        Some((range, Some(SharedBytes(Arc::from(data)))))
    };
    let text = section(".text", false).map(|(r, _)| r);
    let got = section(".got", false).map(|(r, _)| r);
    let eh_frame = section(".eh_frame", true).and_then(|(r, d)| Some((r, d?)));
    let eh_frame_hdr = section(".eh_frame_hdr", true).and_then(|(r, d)| Some((r, d?)));
    let debug_frame = section(".debug_frame", true).and_then(|(_, d)| d);
    let segments: Vec<Segment> = elf
        .segments()
        .take(64)
        .map(|s| {
            let (offset, size) = s.file_range();
            Segment { offset, address: s.address(), size }
        })
        .collect();
    let build_id: String = match elf.build_id() {
        Ok(Some(id)) if id.len() <= 64 => id.iter().map(|b| format!("{b:02x}")).collect(),
        _ => String::new(),
    };
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
    let debug = read_debug(&elf, &mut bytes);
    let mut symbols = Vec::new();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if symbols.len() >= MAX_SYMBOLS {
            break;
        }
        if sym.kind() != SymbolKind::Text || sym.size() == 0 || sym.address() == 0 {
            continue;
        }
        let Ok(raw) = sym.name() else { continue };
        if raw.is_empty() || raw.len() > MAX_NAME_BYTES {
            continue;
        }
        let shown = format!("{:#}", rustc_demangle::demangle(raw));
        let Some(end) = sym.address().checked_add(sym.size()) else { continue };
        bytes += shown.len() + 48;
        symbols.push(Symbol { start: sym.address(), end, name: Arc::from(shown) });
    }
    symbols.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    symbols.dedup_by_key(|s| s.start);
    Some(ModuleFile {
        name: Arc::from(name),
        text,
        got,
        eh_frame,
        eh_frame_hdr,
        debug_frame,
        segments,
        mappings,
        symbols,
        debug,
        bytes,
    })
}

/// The DWARF of `elf` as an `addr2line` context, when it has `.debug_info` and its debug
/// sections fit `MAX_DEBUG_BYTES` (each also within `MAX_SECTION_BYTES`); adds their size to
/// `bytes`.
fn read_debug<'d, R: object::ReadRef<'d>>(elf: &ElfFile64<'d, object::LittleEndian, R>, bytes: &mut usize) -> Option<Mutex<addr2line::Context<DwarfReader>>> {
    use addr2line::gimli;
    elf.section_by_name(".debug_info")?;
    let mut total = 0usize;
    let endian = gimli::RunTimeEndian::Little;
    let dwarf = gimli::Dwarf::load(|id: gimli::SectionId| -> Result<DwarfReader, ()> {
        // Variable locations are not needed for names and lines: not read.
        if matches!(id, gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists) {
            return Ok(gimli::EndianArcSlice::new(Arc::from(&[][..]), endian));
        }
        let data: Arc<[u8]> = match elf.section_by_name(id.name()) {
            Some(s) if s.size() <= MAX_SECTION_BYTES => {
                let data = s.uncompressed_data().map_err(|_| ())?;
                if data.len() as u64 > MAX_SECTION_BYTES {
                    return Err(());
                }
                total = total.saturating_add(data.len());
                if total > MAX_DEBUG_BYTES {
                    return Err(());
                }
                Arc::from(&data[..])
            }
            Some(_) => return Err(()),
            None => Arc::from(&[][..]),
        };
        Ok(gimli::EndianArcSlice::new(data, endian))
    })
    .ok()?;
    let context = addr2line::Context::from_dwarf(dwarf).ok()?;
    *bytes += total;
    Some(Mutex::new(context))
}

/// The base name of a mapped path.
pub fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A file being read, and who waits for it.
struct InFlight {
    /// Told when the file is read (or found unreadable); a waiter gone meanwhile is skipped.
    waiters: Vec<mpsc::Sender<Loaded>>,
}

#[derive(Default)]
struct Cache {
    files: HashMap<FileKey, (Arc<ModuleFile>, Instant)>,
    failed: HashMap<FileKey, Instant>,
    in_flight: HashMap<FileKey, InFlight>,
    bytes: usize,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Default::default);

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Files read at once, at most (each on a thread of its own). A file on a file system that
/// never answers keeps its thread for ever: past this many, no new file is started.
pub const MAX_IN_FLIGHT: usize = 16;
/// Waiters kept per file in flight (beyond: told nothing; they ask again later).
const MAX_WAITERS: usize = 256;

/// A file's read finished: the file, or `None` when it gave no unwind data.
pub type Loaded = (FileKey, Option<Arc<ModuleFile>>);

/// Where the file behind a mapping stands, without waiting.
pub enum Loading {
    /// Read already (cached).
    Ready(Arc<ModuleFile>),
    /// Being read: the waiter given to [`start_load`] is told on its end.
    InFlight,
    /// Not readable, not ELF x86_64, or failed recently (tried again after `RETRY_AFTER`).
    Unreadable,
    /// Too many files are being read already (tried again later, by a later request).
    Busy,
}

/// The file behind `mapping` of `pid`: from the cache, or read on a thread of its own, whose
/// end is sent to `waiter` (also when the file was in flight already). Never waits on the
/// file: the cache's lock is held only for bookkeeping.
pub fn start_load(pid: u32, mapping: &Mapping, waiter: &mpsc::Sender<Loaded>) -> Loading {
    let key = mapping.key();
    {
        let mut c = cache();
        if let Some((file, used)) = c.files.get_mut(&key) {
            *used = Instant::now();
            return Loading::Ready(file.clone());
        }
        if let Some(flight) = c.in_flight.get_mut(&key) {
            if flight.waiters.len() < MAX_WAITERS {
                flight.waiters.push(waiter.clone());
            }
            return Loading::InFlight;
        }
        if c.failed.get(&key).is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return Loading::Unreadable;
        }
        if c.in_flight.len() >= MAX_IN_FLIGHT {
            return Loading::Busy;
        }
        c.in_flight.insert(key, InFlight { waiters: vec![waiter.clone()] });
    }
    let owned = mapping.clone();
    let spawned = std::thread::Builder::new().name("pyperch-native".into()).spawn(move || {
        let name = base_name(&owned.path).to_string();
        // A file that makes the parser panic counts as unreadable.
        let result = std::panic::catch_unwind(|| open_checked(pid, &owned).ok().and_then(|file| read(file, &name, &owned.path)))
            .ok()
            .flatten()
            .map(Arc::new);
        let mut c = cache();
        let waiters = c.in_flight.remove(&key).map(|f| f.waiters).unwrap_or_default();
        match &result {
            Some(file) => insert(&mut c, key, file.clone()),
            None => {
                if c.failed.len() > 4096 {
                    c.failed.clear();
                }
                c.failed.insert(key, Instant::now());
            }
        }
        drop(c);
        for w in waiters {
            let _ = w.send((key, result.clone()));
        }
    });
    if spawned.is_err() {
        cache().in_flight.remove(&key);
        return Loading::Unreadable;
    }
    Loading::InFlight
}

/// Files being read now (a file that hangs stays counted until its read ends).
pub fn in_flight() -> usize {
    cache().in_flight.len()
}

/// Caches a file; over `FILES_BUDGET`, drops the least recently used files that no process
/// holds any more (a file in use stays: its processes' unwinders hold it anyway).
fn insert(c: &mut Cache, key: FileKey, file: Arc<ModuleFile>) {
    c.bytes = c.bytes.saturating_add(file.bytes);
    c.files.insert(key, (file, Instant::now()));
    if c.bytes <= FILES_BUDGET {
        return;
    }
    let mut unused: Vec<(Instant, FileKey)> =
        c.files.iter().filter(|(_, (f, _))| Arc::strong_count(f) == 1).map(|(k, (_, used))| (*used, *k)).collect();
    unused.sort_unstable();
    for (_, k) in unused {
        if c.bytes <= FILES_BUDGET {
            break;
        }
        if let Some((f, _)) = c.files.remove(&k) {
            c.bytes = c.bytes.saturating_sub(f.bytes);
        }
    }
}

/// Drops every cached file no process holds (called when processes go).
pub fn release_unused() {
    let mut c = cache();
    let before: Vec<FileKey> = c.files.iter().filter(|(_, (f, _))| Arc::strong_count(f) == 1).map(|(k, _)| *k).collect();
    for k in before {
        if let Some((f, _)) = c.files.remove(&k) {
            c.bytes = c.bytes.saturating_sub(f.bytes);
        }
    }
}

/// Bytes held by the cache of files.
pub fn cached_bytes() -> usize {
    cache().bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_executable_symbols_and_unwind_sections() {
        let exe = std::env::current_exe().expect("exe");
        let file = File::open(&exe).expect("open");
        let m = read(file, "self", "/proc/self/exe").expect("ELF");
        assert!(m.eh_frame.is_some());
        assert!(m.text.is_some());
        assert!(!m.symbols.is_empty());
        // The symbol of a function of this very test binary.
        let f = base_name as fn(&str) -> &str as usize as u64;
        // Find the mapping of our text to translate the address.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let mapping = crate::discovery::parse_maps(&maps).into_iter().find(|m| m.contains(f)).expect("mapping");
        let at = m.file_address(mapping.start, mapping.offset, f).expect("address");
        let name = m.symbol(at).expect("symbol");
        assert!(name.contains("base_name"), "{name}");
    }

    #[test]
    fn garbage_is_not_a_module() {
        let dir = std::env::temp_dir().join(format!("pyperch-native-{}", std::process::id()));
        std::fs::write(&dir, b"\x7fELF garbage").expect("write");
        assert!(read(File::open(&dir).expect("open"), "x", "x").is_none());
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
            let read = read(file, "fuzz", "/fuzz");
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
