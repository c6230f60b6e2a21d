//! One process's native unwinder: its executable mappings (from `/proc/PID/maps`), each with
//! its file's unwind data (`module_file`), and the unwinding of one sample's registers and
//! copied stack with framehop (`.eh_frame` / `.debug_frame`, frame pointers where a module
//! has neither).
//!
//! The maps and files are read off the sampling loop (`io`): this side only asks and picks
//! up the answers that have arrived. Invariant: a sample with a frame in code whose mapping
//! or file is not read yet is never unwound through it (`UnwindEnd::Loading`).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};

use super::{
    io::{Asker, Inbox, MapsReply, MappedCode, MappedFile, NativeIo},
    file_cache::Loaded,
    module_file::{EarlyRows, ModuleFile, SharedBytes},
    tables::{MappingRows, MappingTable, TableSink},
};
use crate::target::discovery::{FileKey, Mapping};

/// Native frames unwound at most per sample.
pub const MAX_NATIVE_FRAMES: usize = 256;
/// Executable mappings tracked at most per process.
const MAX_MODULES: usize = 4096;
/// `/proc/PID/maps` is read again at most this often (when an address is in no module).
const REFRESH_INTERVAL: Duration = Duration::from_millis(500);
/// How soon the maps are asked for again when files of them were put off.
const DEFERRED_RETRY: Duration = Duration::from_millis(50);

/// An executable mapping of a file.
pub struct LoadedModule {
    pub start: u64,
    pub end: u64,
    offset: u64,
    /// The file's identity, to tell whether the cache still holds it.
    key: FileKey,
    pub file: Arc<ModuleFile>,
}

impl LoadedModule {
    /// The address in the file of process address `avma`.
    pub fn file_address(&self, avma: u64) -> Option<u64> {
        self.file.file_address(self.start, self.offset, avma)
    }
}

/// One unwound native frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwoundFrame {
    /// Address to look up (inside the call instruction for return addresses).
    pub address: u64,
    /// The stack it occupies: `[low, high)`.
    pub low: u64,
    pub high: u64,
}

/// How one unwind ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindEnd {
    /// Reached the bottom of the stack.
    Complete,
    /// The copied stack ended first, or a frame could not be unwound.
    Truncated,
    /// A frame lies in code whose mapping or file is still being read (off the sampling
    /// loop): the sample is shown with its Python frames only, behind `<loading native>`.
    Loading,
}

/// Where a process's maps stand, as the loop knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MapsState {
    /// Asked for, no answer yet.
    Requested,
    /// Not asked for now (answered, or the request was refused: `last_request` says when).
    Idle,
}

pub struct ProcessNative {
    pid: u32,
    unwinder: UnwinderX86_64<SharedBytes>,
    cache: CacheX86_64,
    /// Sorted by start.
    modules: Vec<LoadedModule>,
    /// Every executable mapping of the last maps read, sorted by start.
    mapped: Vec<Mapped>,
    /// Mappings whose file is being read, by file: added when it arrives.
    loading: HashMap<FileKey, Vec<Mapping>>,
    /// Files that arrived before the maps answer that lists them (the answer is sent after
    /// the reads start): looked up when it comes. Emptied with each maps answer.
    early: HashMap<FileKey, Option<Arc<ModuleFile>>>,
    /// The kernel walk's part of files still being read (`Loaded::Rows`): sent to the kernel
    /// at once, so that the walk goes through them while their symbols and lines are read.
    /// Only ever for keys in `loading` once a maps answer is applied.
    rows_first: HashMap<FileKey, Arc<EarlyRows>>,
    /// No maps answer yet: every sample waits.
    maps_known: bool,
    state: MapsState,
    last_request: Option<Instant>,
    /// The last maps answer had files put off: ask again (after `DEFERRED_RETRY`).
    deferred: bool,
    asker: Asker,
    inbox: Inbox,
    /// Bumped whenever a module goes away: names cached by address must be forgotten (a
    /// different file may be mapped there next).
    pub removals: u64,
    /// `file_cache::evictions()` when the modules were last checked against the cache.
    evictions: u64,
    /// Files were evicted from under this process: read the maps again (and so the files,
    /// once `file_cache` allows) at this time.
    reload_at: Option<Instant>,
    /// With the kernel walk: where the mappings go, this process's owner id there, and
    /// whether they changed since they were last sent.
    tables: Option<Arc<dyn TableSink>>,
    owner: u64,
    tables_dirty: bool,
    /// Where the last unwind ([`ProcessNative::unwind`] or [`ProcessNative::walked`]) stopped
    /// before the bottom: the frame it could not unwind (not among its frames), if known.
    stopped_at: Option<u64>,
}

/// The module of `modules` (sorted by start) holding `address`.
fn module_at(modules: &[LoadedModule], address: u64) -> Option<&LoadedModule> {
    let i = modules.partition_point(|m| m.start <= address);
    let m = modules.get(i.checked_sub(1)?)?;
    (address < m.end).then_some(m)
}

/// Owner ids for `TableSink` (a pid may be reused by a later `ProcessNative`).
static NEXT_OWNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Drop for ProcessNative {
    fn drop(&mut self) {
        if let Some(t) = &self.tables {
            t.remove_process(self.pid, self.owner);
        }
        super::file_cache::forget_queued(self.pid);
    }
}

/// An executable mapping of the last maps read.
struct Mapped {
    start: u64,
    end: u64,
    /// Its file is still being read (or was put off).
    loading: bool,
    /// File offset of `start`, and the file's base name (empty for anonymous mappings):
    /// frames in a file without its module show as `name+0xOFFSET`.
    offset: u64,
    name: Arc<str>,
}

/// How long after an eviction the maps (and so the evicted files) are asked for again.
const RELOAD_AFTER: Duration = Duration::from_secs(10);

impl ProcessNative {
    /// A process's unwinder; asks for its maps at once, so that they are likely there by its
    /// first sample.
    pub fn new(pid: u32, io: &NativeIo, tables: Option<Arc<dyn TableSink>>) -> Self {
        let (asker, inbox) = NativeIo::channels();
        let mut p = Self {
            pid,
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            modules: Vec::new(),
            mapped: Vec::new(),
            loading: HashMap::new(),
            early: HashMap::new(),
            rows_first: HashMap::new(),
            maps_known: false,
            state: MapsState::Idle,
            last_request: None,
            deferred: false,
            asker,
            inbox,
            removals: 0,
            evictions: super::file_cache::evictions(),
            reload_at: None,
            tables,
            owner: NEXT_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tables_dirty: false,
            stopped_at: None,
        };
        p.request(io);
        p
    }

    /// Whether the maps are not known yet, or files of them are still being read (takes in
    /// what has arrived; never waits). Asks again (rate-limited) when the maps are not known
    /// or files were put off.
    pub fn waiting(&mut self, io: &NativeIo) -> bool {
        self.poll();
        if !self.maps_known || self.deferred || self.reload_due() {
            self.refresh(io);
        }
        !self.maps_known || !self.loading.is_empty() || self.deferred
    }

    /// The module containing `address`.
    pub fn module(&self, address: u64) -> Option<&LoadedModule> {
        module_at(&self.modules, address)
    }

    fn mapping_at(&self, address: u64) -> Option<&Mapped> {
        let i = self.mapped.partition_point(|m| m.start <= address);
        let m = self.mapped.get(i.checked_sub(1)?)?;
        (address < m.end).then_some(m)
    }

    /// The executable mapping of the last maps read holding `address`: `Some(still loading)`.
    fn mapped(&self, address: u64) -> Option<bool> {
        self.mapping_at(address).map(|m| m.loading)
    }

    /// `name+0xOFFSET` of an address in a mapped file whose module is not loaded (evicted,
    /// or refused): the file's base name and the file offset.
    pub fn unloaded_name(&self, address: u64) -> Option<String> {
        let m = self.mapping_at(address).filter(|m| !m.name.is_empty())?;
        Some(format!("{}+{:#x}", m.name, (address - m.start).wrapping_add(m.offset)))
    }

    /// Whether an eviction asked for the maps to be read again and that time has come.
    fn reload_due(&self) -> bool {
        self.reload_at.is_some_and(|at| Instant::now() >= at)
    }

    /// Whether frames at `address` cannot be told yet: the maps are not known, its file is
    /// still being read, or it lies in no mapping known and a new maps read is under way
    /// (asked for here, at most every `REFRESH_INTERVAL`: a library loaded after the start).
    fn waits_for(&mut self, address: u64, io: &NativeIo) -> bool {
        if !self.maps_known {
            // Asked at the start; asked again if that answer was a failure or was refused.
            self.refresh(io);
            return true;
        }
        if self.module(address).is_some() {
            return false;
        }
        match self.mapped(address) {
            Some(loading) => loading,
            None => {
                self.refresh(io);
                self.state == MapsState::Requested
            }
        }
    }

    /// Unwinds one sample into `out`, leaf first: each frame's lookup address (the
    /// instruction pointer, then return addresses minus one) and the stack range it occupies
    /// (`[sp while it ran, sp of its caller)`). When the copied stack ends first, the last
    /// frame (whose extent is unknown) is left out. `UnwindEnd::Loading` (and `out` empty)
    /// when a frame lies in code whose file or mapping is still being read.
    pub fn unwind(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8], io: &NativeIo, out: &mut Vec<UnwoundFrame>) -> UnwindEnd {
        out.clear();
        self.stopped_at = None;
        self.take_answers(io);
        if self.waits_for(ip, io) {
            return UnwindEnd::Loading;
        }
        let mut read_stack = |address: u64| -> Result<u64, ()> {
            let at = address.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let mut end = UnwindEnd::Truncated;
        // The frame whose unwinding failed, if any.
        let mut stopped_at = None;
        let (unwinder, cache, modules) = (&self.unwinder, &mut self.cache, &self.modules);
        // The unwind tables come from the target's files: should the unwinder panic on one,
        // the sample keeps the frames found so far, as a truncated stack.
        let mut step = |address: FrameAddress, regs: &mut UnwindRegsX86_64| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                unwinder.unwind_frame(address, regs, &mut *cache, &mut read_stack)
            }))
            .unwrap_or(Err(framehop::Error::IntegerOverflow))
        };
        while out.len() < MAX_NATIVE_FRAMES {
            let low = regs.sp();
            // Shown, with an empty extent (its size is unknown), and no further: code without
            // CFI in a file that has CFI elsewhere, or musl's libc (next to no unwind rows).
            // framehop's guesses there (the return address at the stack pointer, else frame
            // pointers) read registers such code uses for anything. The kernel walk stops at
            // the same places.
            let lookup = address.address_for_lookup();
            if stops_unwind(modules, lookup) {
                out.push(UnwoundFrame { address: lookup, low, high: low });
                stopped_at = Some(lookup);
                break;
            }
            match step(address, &mut regs) {
                Ok(Some(return_address)) => {
                    out.push(UnwoundFrame { address: address.address_for_lookup(), low, high: regs.sp() });
                    // A caller's stack lies above its callee's: anything else is not a stack.
                    if regs.sp() <= low {
                        break;
                    }
                    match FrameAddress::from_return_address(return_address) {
                        Some(next) => address = next,
                        None => break,
                    }
                }
                Ok(None) => {
                    out.push(UnwoundFrame { address: address.address_for_lookup(), low, high: u64::MAX });
                    end = UnwindEnd::Complete;
                    break;
                }
                Err(_) => {
                    stopped_at = Some(address.address_for_lookup());
                    break;
                }
            }
        }
        let addresses: Vec<u64> = out.iter().map(|f| f.address).chain(stopped_at).collect();
        self.stopped_at = stopped_at.filter(|_| end != UnwindEnd::Complete);
        if self.waits_for_any(&addresses, io) {
            out.clear();
            return UnwindEnd::Loading;
        }
        end
    }

    /// Whether the last unwind stopped in musl's libc (see [`super::musl`]).
    pub fn stopped_in_musl_libc(&self) -> bool {
        self.stopped_at.and_then(|a| self.module(a)).is_some_and(|m| m.file.musl_libc)
    }

    /// A sample's start: takes in the answers that arrived, and asks for the maps again when
    /// files were put off or evicted (never waits).
    fn take_answers(&mut self, io: &NativeIo) {
        self.poll();
        if self.deferred || self.reload_due() {
            self.refresh(io);
        }
    }

    /// Whether any of `addresses` waits for its mapping or file ([`Self::waits_for`], asked of
    /// every one: each may start a maps read).
    fn waits_for_any(&mut self, addresses: &[u64], io: &NativeIo) -> bool {
        addresses.iter().fold(false, |waits, &a| self.waits_for(a, io) | waits)
    }

    /// Asks for the maps again, at most every `REFRESH_INTERVAL` and one request at a time;
    /// never waits.
    fn refresh(&mut self, io: &NativeIo) {
        // Files put off (too many in flight) are asked for again soon: slots free up as
        // reads end.
        let interval = if self.deferred { DEFERRED_RETRY } else { REFRESH_INTERVAL };
        if self.state == MapsState::Requested || self.last_request.is_some_and(|t| t.elapsed() < interval) {
            return;
        }
        self.request(io);
    }

    fn request(&mut self, io: &NativeIo) {
        self.last_request = Some(Instant::now());
        if io.request(self.pid, &self.asker) {
            self.state = MapsState::Requested;
            self.reload_at = None;
        }
    }

    /// Drops the modules whose file the cache evicted (their memory goes with the last
    /// process holding them); the maps are read again after `RELOAD_AFTER`.
    fn drop_evicted(&mut self) {
        let now = super::file_cache::evictions();
        if now == self.evictions {
            return;
        }
        self.evictions = now;
        let gone: Vec<u64> =
            self.modules.iter().filter(|m| !super::file_cache::is_cached(&m.key, &m.file)).map(|m| m.start).collect();
        if gone.is_empty() {
            return;
        }
        self.removals += 1;
        self.tables_dirty = true;
        for start in gone {
            self.unwinder.remove_module(start);
            self.modules.retain(|m| m.start != start);
        }
        self.reload_at.get_or_insert(Instant::now() + RELOAD_AFTER);
    }

    /// Takes in whatever answers have arrived; never waits.
    fn poll(&mut self) {
        self.poll_answers();
        self.sync_tables();
    }

    fn poll_answers(&mut self) {
        self.drop_evicted();
        while let Ok(reply) = self.inbox.maps.try_recv() {
            self.state = MapsState::Idle;
            if let MapsReply::Read(code) = reply {
                self.apply_maps(code);
            }
        }
        while let Ok(news) = self.inbox.files.try_recv() {
            let (key, file) = match news {
                Loaded::Rows(key, rows) => {
                    let listed = self.loading.contains_key(&key);
                    if listed || (self.state == MapsState::Requested && self.rows_first.len() < MAX_MODULES) {
                        self.rows_first.insert(key, rows);
                        self.tables_dirty |= listed;
                    }
                    continue;
                }
                Loaded::Read(key, file) => (key, file),
            };
            self.rows_first.remove(&key);
            match self.loading.remove(&key) {
                Some(mappings) => {
                    for m in mappings {
                        self.set_loaded(m.start, m.end);
                        if let Some(file) = &file {
                            self.add_module(&m, file.clone());
                        }
                    }
                }
                // Only a maps answer still to come can list it.
                None if self.state == MapsState::Requested && self.early.len() < MAX_MODULES => {
                    self.early.insert(key, file);
                }
                None => {}
            }
        }
    }

    /// The mappings of a maps answer: drops the modules gone, adds those ready.
    fn apply_maps(&mut self, code: Vec<MappedCode>) {
        self.maps_known = true;
        self.tables_dirty = true;
        let present: HashSet<(u64, u64)> = code.iter().map(|c| (c.mapping.start, c.mapping.end)).collect();
        let gone: Vec<u64> =
            self.modules.iter().filter(|m| !present.contains(&(m.start, m.end))).map(|m| m.start).collect();
        if !gone.is_empty() {
            self.removals += 1;
        }
        for start in gone {
            self.unwinder.remove_module(start);
            self.modules.retain(|m| m.start != start);
        }
        let loaded: HashSet<(u64, u64)> = self.modules.iter().map(|m| (m.start, m.end)).collect();
        let early = std::mem::take(&mut self.early);
        self.loading.clear();
        self.deferred = false;
        self.mapped.clear();
        for c in code {
            let (start, end, offset) = (c.mapping.start, c.mapping.end, c.mapping.offset);
            let name: Arc<str> = if c.mapping.is_file() { Arc::from(super::module_file::base_name(&c.mapping.path)) } else { Arc::from("") };
            let known = loaded.contains(&(start, end));
            let mut loading = false;
            match c.file {
                _ if known => {}
                MappedFile::Ready(file) => self.add_module(&c.mapping, file),
                MappedFile::Loading => match early.get(&c.mapping.key()) {
                    Some(Some(file)) => self.add_module(&c.mapping, file.clone()),
                    Some(None) => {}
                    None => {
                        loading = true;
                        self.loading.entry(c.mapping.key()).or_default().push(c.mapping);
                    }
                },
                MappedFile::Deferred => {
                    loading = true;
                    self.deferred = true;
                }
                MappedFile::None => {}
            }
            self.mapped.push(Mapped { start, end, loading, offset, name });
        }
        let loading = &self.loading;
        self.rows_first.retain(|key, _| loading.contains_key(key));
    }

    /// A mapping whose file is no longer being read.
    fn set_loaded(&mut self, start: u64, end: u64) {
        let i = self.mapped.partition_point(|m| m.start < start);
        if let Some(m) = self.mapped.get_mut(i).filter(|m| m.start == start && m.end == end) {
            m.loading = false;
            self.tables_dirty = true;
        }
    }

    /// Gives the unwinder the file behind mapping `m`.
    fn add_module(&mut self, m: &Mapping, file: Arc<ModuleFile>) {
        let at = self.modules.partition_point(|x| x.start < m.start);
        if self.modules.len() >= MAX_MODULES || self.modules.get(at).is_some_and(|x| x.start == m.start) {
            return;
        }
        // A file evicted between its read and now is not taken in (the cache no longer
        // counts it): read again later, as if evicted from this process.
        if !super::file_cache::is_cached(&m.key(), &file) {
            self.reload_at.get_or_insert(Instant::now() + RELOAD_AFTER);
            return;
        }
        let Some(base) = file.base_address(m.start, m.offset) else { return };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: file.text.clone(),
            got_svma: file.got.clone(),
            eh_frame_svma: file.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: file.eh_frame.as_ref().map(|(_, d)| d.clone()),
            eh_frame_hdr_svma: file.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: file.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            debug_frame: file.debug_frame.clone(),
            ..Default::default()
        };
        self.unwinder.add_module(Module::new(file.name.to_string(), m.start..m.end, base, info));
        self.modules.insert(at, LoadedModule { start: m.start, end: m.end, offset: m.offset, key: m.key(), file });
        self.tables_dirty = true;
    }

    /// Sends the mappings to the kernel's tables when they changed: every executable
    /// mapping of a file, with its rows once its file is read (frame pointers for a file
    /// without a table, or whose module was refused), waiting while it is being read.
    fn sync_tables(&mut self) {
        let Some(tables) = self.tables.as_ref().filter(|_| self.tables_dirty && self.maps_known) else { return };
        self.tables_dirty = false;
        let mut out = Vec::with_capacity(self.mapped.len());
        // Mappings still loading whose file's rows came first, by start.
        let first: HashMap<u64, &Arc<EarlyRows>> = self
            .loading
            .iter()
            .filter_map(|(key, mappings)| Some((self.rows_first.get(key)?, mappings)))
            .flat_map(|(rows, mappings)| mappings.iter().map(move |m| (m.start, rows)))
            .collect();
        for m in &self.mapped {
            let module = self.modules.iter().find(|x| x.start == m.start && x.end == m.end);
            let (bias, rows) = match module {
                Some(x) => match (x.file.base_address(x.start, x.offset), &x.file.unwind_rows) {
                    (Some(bias), Some(rows)) => (bias, MappingRows::Rows(rows.clone())),
                    (Some(bias), None) => (bias, MappingRows::FramePointers),
                    (None, _) => (0, MappingRows::FramePointers),
                },
                None if m.loading => match first.get(&m.start).map(|e| (e.base_address(m.start, m.offset), &e.rows)) {
                    Some((Some(bias), Some(rows))) => (bias, MappingRows::Rows(rows.clone())),
                    Some((Some(bias), None)) => (bias, MappingRows::FramePointers),
                    _ => (0, MappingRows::Loading),
                },
                // Anonymous code (a JIT's), or a file refused: frame pointers.
                None => (0, MappingRows::FramePointers),
            };
            out.push(MappingTable { start: m.start, end: m.end, bias, rows });
        }
        tables.set_process(self.pid, self.owner, &out);
    }

    /// The frames the kernel walked (`profiler_common::unwind`: `WALKED_FRAME_SIZE` bytes
    /// each, from stack pointer `sp`) into `out`, leaf first, as [`ProcessNative::unwind`]
    /// gives them; `end` is the walk's `walk_end`. `UnwindEnd::Loading` (and `out` empty)
    /// when the kernel did not have a table the walk needed yet, or a frame lies in code whose
    /// file or mapping is still being read here.
    pub fn walked(&mut self, frames: &[u8], end: u32, sp: u64, io: &NativeIo, out: &mut Vec<UnwoundFrame>) -> UnwindEnd {
        use profiler_common::{WALKED_FRAME_SIZE, walk_end};
        out.clear();
        self.stopped_at = None;
        self.take_answers(io);
        let mut low = sp;
        let n = frames.len() / WALKED_FRAME_SIZE;
        for (i, f) in frames.chunks_exact(WALKED_FRAME_SIZE).enumerate() {
            let ip = u64::from_le_bytes(f[..8].try_into().unwrap_or_default());
            let cfa = u32::from_le_bytes(f[8..12].try_into().unwrap_or_default());
            // The outermost frame reaches the top of the stack.
            let outermost = end == walk_end::OUTERMOST && i + 1 == n;
            let high = match cfa {
                0 if outermost => u64::MAX,
                // The frame the walk stopped in: its extent is unknown (added below).
                0 => break,
                cfa => sp.saturating_add(u64::from(cfa)),
            };
            if high <= low {
                break;
            }
            let address = if i == 0 { ip } else { ip.wrapping_sub(1) };
            out.push(UnwoundFrame { address, low, high: if outermost { u64::MAX } else { high } });
            low = high;
        }
        // The frame where the walk stopped (or the last one), for the loading check.
        let stopped = frames.chunks_exact(WALKED_FRAME_SIZE).nth(out.len()).map(|f| {
            let ip = u64::from_le_bytes(f[..8].try_into().unwrap_or_default());
            if out.is_empty() { ip } else { ip.wrapping_sub(1) }
        });
        // Outside every mapping the kernel had, and every one read here: a library mapped
        // since the maps were last read (`dlopen`), not code outside any file (JIT code lies in
        // a mapping read here): its table is on its way.
        let new_mapping = end == walk_end::NO_MODULE && stopped.is_some_and(|a| self.mapping_at(a).is_none());
        let kernel_waits = matches!(end, walk_end::LOADING | walk_end::NO_PROCESS) || new_mapping;
        let addresses: Vec<u64> = out.iter().map(|f| f.address).chain(stopped).collect();
        self.stopped_at = stopped.filter(|_| end != walk_end::OUTERMOST);
        if self.waits_for_any(&addresses, io) || kernel_waits {
            out.clear();
            return UnwindEnd::Loading;
        }
        if end == walk_end::OUTERMOST {
            return UnwindEnd::Complete;
        }
        // The frame the walk stopped in ran at its address (the sampled one, or a return
        // address its callee's rule found): shown, with an empty extent (it holds no shim the
        // merge could pair, its size being unknown).
        if let Some(address) = stopped {
            out.push(UnwoundFrame { address, low, high: low });
        }
        UnwindEnd::Truncated
    }
}

/// Whether an unwind stops at `address` instead of guessing: it lies in musl's libc (next to
/// no unwind rows, no frame pointers), or in a file whose unwind rows cover none of it (code
/// without CFI, such as OpenBLAS's kernels, in a file that has CFI elsewhere). The kernel's
/// walk stops at the same places (its rows say so); a file without any rows is walked with
/// frame pointers by both. One module lookup per frame.
fn stops_unwind(modules: &[LoadedModule], address: u64) -> bool {
    let Some(m) = module_at(modules, address) else { return false };
    if m.file.musl_libc {
        return true;
    }
    let (Some(rows), Some(at)) = (m.file.unwind_rows.as_ref(), m.file_address(address)) else { return false };
    let Ok(pc) = u32::try_from(at) else { return false };
    let i = rows.partition_point(|r| r.pc <= pc);
    i.checked_sub(1).and_then(|i| rows.get(i)).is_none_or(|r| r.cfa_kind() == profiler_common::cfa_kind::NONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maps and the files arrive through the worker while the caller only polls: the
    /// module of one of this test's own functions shows up without any call that waits.
    #[test]
    fn maps_and_files_arrive_while_the_caller_only_polls() {
        let io = NativeIo::new();
        io.start_worker();
        let mut p = ProcessNative::new(std::process::id(), &io, None);
        let f = maps_and_files_arrive_while_the_caller_only_polls as fn() as usize as u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.module(f).is_none() {
            assert!(Instant::now() < deadline, "the test binary's module never arrived");
            p.poll();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(p.maps_known);
        let m = p.module(f).expect("module");
        let name = m.file.symbol(m.file_address(f).expect("address")).expect("symbol");
        assert!(name.contains("maps_and_files_arrive"), "{name}");
        // Its mapping is no longer waiting for its file.
        assert_eq!(p.mapped(f), Some(false));
        assert!(io.stats.maps_reads.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    }

    /// What the kernel is sent of each mapping.
    #[derive(Default)]
    struct Recorded(std::sync::Mutex<Vec<(u64, u64, &'static str)>>);

    impl TableSink for Recorded {
        fn set_process(&self, _pid: u32, _owner: u64, mappings: &[MappingTable]) {
            let kinds = mappings.iter().map(|m| {
                let kind = match m.rows {
                    MappingRows::Rows(_) => "rows",
                    MappingRows::FramePointers => "frame pointers",
                    MappingRows::Loading => "loading",
                };
                (m.start, m.bias, kind)
            });
            *self.0.lock().expect("lock") = kinds.collect();
        }
        fn remove_process(&self, _pid: u32, _owner: u64) {}
        fn report(&self) -> String {
            String::new()
        }
    }

    /// A file's rows that arrive before its symbols and lines go to the kernel at once (with
    /// the mapping's load bias); a file still being read without them stays "loading".
    #[test]
    fn rows_that_come_first_are_sent_before_the_file_is_read() {
        let io = NativeIo::new();
        let sink = Arc::new(Recorded::default());
        let mut p = ProcessNative::new(std::process::id(), &io, Some(sink.clone()));
        let mapping = |start: u64, inode: u64| Mapping {
            start,
            end: start + 0x1000,
            perms: *b"r-xp",
            offset: 0x1000,
            dev: (8, 1),
            inode,
            path: format!("/lib/f{inode}.so"),
            deleted: false,
        };
        let (with_rows, without) = (mapping(0x7000_0000, 1), mapping(0x7100_0000, 2));
        p.maps_known = true;
        for m in [&with_rows, &without] {
            p.mapped.push(Mapped { start: m.start, end: m.end, loading: true, offset: m.offset, name: Arc::from("f") });
            p.loading.insert(m.key(), vec![m.clone()]);
        }
        let row = profiler_common::UnwindRow { pc: 0x1000, cfa_offset: 8, kinds: 1, rbp_words: 0 };
        let segments = vec![super::super::module_file::Segment { offset: 0, address: 0, size: 0x10000 }];
        p.rows_first.insert(with_rows.key(), Arc::new(EarlyRows { rows: Some(Arc::from(vec![row])), segments }));
        p.tables_dirty = true;
        p.sync_tables();
        let sent = sink.0.lock().expect("lock").clone();
        assert_eq!(sent, vec![(0x7000_0000, 0x7000_0000 - 0x1000, "rows"), (0x7100_0000, 0, "loading")]);
    }
}
