//! Python thread names, read from the interpreter's own registry of `threading.Thread`
//! objects in the target's memory, as py-spy does: `sys.modules["threading"]._active` maps
//! each thread's ident to its `Thread`, whose `_name` is the name `threading` shows and whose
//! `_native_id` is the OS thread id (set by `threading` itself on 3.8+ when the thread starts,
//! and for the main thread). Where `layout::threading` says each piece is, per version.
//!
//! Used off the sampling loop only: by the thread-name helper of a recording
//! (`session::thread_names`, every 300 ms) and by `dump`.
//!
//! Nothing read here is trusted: every read is charged to a byte budget per call
//! ([`READ_BUDGET`]), every dict is capped ([`MAX_MODULES`], [`MAX_ATTRIBUTES`],
//! [`MAX_THREADS`]), every object's type is compared with the type it must have (`dict`,
//! `module`, `str`, `int`: static types, recognised once by `tp_name` and then by address),
//! names are cut to [`MAX_NAME_CHARS`] characters, and a native id is used only if it is one
//! of the process's threads now. Threads of subinterpreters are not looked at (their
//! `threading` module is another one).

use std::collections::HashMap;

use crate::target::discovery::PythonProcess;
use crate::target::layout::debug_offsets;
use crate::target::layout::threading::{
    AttributeStorage, KeysLayout, TPFLAGS_HEAPTYPE, TPFLAGS_INLINE_VALUES, TPFLAGS_MANAGED_DICT, ThreadingLayout,
    threading_layout,
};
use crate::target::layout::{ObjectLayout, PythonLayout, Version};
use crate::target::memory::{MAX_READ, MemoryError, ProcessMemory, field_u64};

/// Bytes read from one process per [`RegistryReader::read`].
pub const READ_BUDGET: usize = 1 << 20;
/// Entries of `sys.modules` looked through for `threading`.
pub const MAX_MODULES: usize = 16_384;
/// Entries of the `threading` module's namespace looked through for `_active`.
const MAX_MODULE_NAMES: usize = 4096;
/// Threads of `_active` read.
pub const MAX_THREADS: usize = 4096;
/// Attributes of one `Thread` looked through for `_name` and `_native_id`.
pub const MAX_ATTRIBUTES: usize = 256;
/// Characters of a name kept (what every output shows at most, `text::MAX_THREAD_NAME_CHARS`).
pub const MAX_NAME_CHARS: usize = crate::text::MAX_THREAD_NAME_CHARS;
/// Reads after which the path from `sys.modules` to `_active` is found again (it is cached in
/// between, checked by type at every read).
const RESOLVE_EVERY: u32 = 32;
/// Bytes of a `str` header and short ASCII data read to compare a dict key with a name, in
/// a default build ([`key_peek`]: the names looked for are under 16 characters).
const KEY_PEEK: usize = 0x40;
const MAX_KEY_CHARS: usize = 16;

/// [`KEY_PEEK`] for `objects`' build (a free-threaded `str`'s data starts 16 bytes further).
fn key_peek(objects: &ObjectLayout) -> usize {
    KEY_PEEK.max(objects.str_ascii_data as usize + MAX_KEY_CHARS)
}
/// `tp_name`s read, at most.
const MAX_TYPE_NAME: usize = 16;

/// Why no names were read this time.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("no threading-registry layout: {0}")]
    Layout(String),
    #[error("the read budget of {READ_BUDGET} bytes ran out")]
    Budget,
    #[error("{0}")]
    Malformed(&'static str),
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// What the reader needs of a profiled process (copied out of its `PythonProcess`).
#[derive(Clone, Copy, Debug)]
pub struct RegistryTarget {
    pub pid: u32,
    pub start_time: u64,
    pub version: Version,
    pub runtime_address: u64,
    pub layout: PythonLayout,
    pub str_type: Option<u64>,
}

impl RegistryTarget {
    pub fn of(process: &PythonProcess) -> Self {
        Self {
            pid: process.pid,
            start_time: process.start_time,
            version: process.version,
            runtime_address: process.runtime_address,
            layout: process.layout,
            str_type: process.str_type_address,
        }
    }
}

/// Reads of one process within a byte budget.
struct Reads {
    mem: ProcessMemory,
    left: usize,
}

impl Reads {
    fn charge(&mut self, len: usize) -> Result<(), RegistryError> {
        self.left = self.left.checked_sub(len).ok_or(RegistryError::Budget)?;
        Ok(())
    }

    fn vec(&mut self, address: u64, len: usize) -> Result<Vec<u8>, RegistryError> {
        self.charge(len)?;
        Ok(self.mem.read_vec(address, len)?)
    }

    fn u64(&mut self, address: u64) -> Result<u64, RegistryError> {
        self.charge(8)?;
        Ok(self.mem.read_u64(address)?)
    }
}

/// Static types recognised by name once, then by address.
#[derive(Clone, Copy, Debug, Default)]
struct Types {
    dict: Option<u64>,
    module: Option<u64>,
    str: Option<u64>,
    int: Option<u64>,
}

/// The cached path to `_active`.
#[derive(Clone, Copy, Debug)]
struct Resolved {
    module_dict: u64,
    active: u64,
}

/// Reads the Python thread names of one process, keeping what it found (the address of
/// `_active`, the types) between reads.
pub struct RegistryReader {
    target: RegistryTarget,
    layout: Option<Result<ThreadingLayout, String>>,
    types: Types,
    resolved: Option<Resolved>,
    reads: u32,
    /// `(ma_keys, dk_nentries)` of `sys.modules` when `threading` was last looked for and not
    /// found: no module was added while they are unchanged.
    modules_without_threading: Option<(u64, u64)>,
    /// Within one read: type headers and keys objects already read (every `Thread` of a class
    /// shares both), by address.
    round_types: HashMap<u64, Vec<u8>>,
    round_keys: HashMap<u64, (KeysGeometry, Vec<u8>)>,
}

/// One `dict` entry (key and value pointers).
type Entry = (u64, u64);

impl RegistryReader {
    pub fn new(target: RegistryTarget) -> Self {
        Self {
            target,
            layout: None,
            types: Types::default(),
            resolved: None,
            reads: 0,
            modules_without_threading: None,
            round_types: HashMap::new(),
            round_keys: HashMap::new(),
        }
    }

    pub fn target(&self) -> &RegistryTarget {
        &self.target
    }

    /// The Python names of the threads of the process whose ids are in `tids` (its threads
    /// now): tid → name, cut to [`MAX_NAME_CHARS`]. Empty when the process has not imported
    /// `threading`.
    pub fn read(&mut self, tids: &[u32]) -> Result<HashMap<u32, String>, RegistryError> {
        let mut r = Reads { mem: ProcessMemory::new(self.target.pid), left: READ_BUDGET };
        self.round_types.clear();
        self.round_keys.clear();
        let layout = self.layout(&mut r)?;
        self.reads = self.reads.wrapping_add(1);
        if self.reads.is_multiple_of(RESOLVE_EVERY) {
            self.resolved = None;
        }
        let cached = self.resolved;
        let active = match cached {
            Some(resolved) if self.still_resolved(&mut r, resolved) => resolved.active,
            _ => {
                self.resolved = None;
                match self.resolve(&mut r, &layout)? {
                    Some(resolved) => {
                        self.resolved = Some(resolved);
                        resolved.active
                    }
                    None => return Ok(HashMap::new()),
                }
            }
        };
        let mut names = HashMap::new();
        let threads = match self.dict_entries(&mut r, &layout, active, MAX_THREADS) {
            Ok(threads) => threads,
            Err(e) => {
                self.resolved = None;
                return Err(e);
            }
        };
        let live: std::collections::HashSet<u32> = tids.iter().copied().collect();
        let mut key_names: HashMap<u64, Option<Attribute>> = HashMap::new();
        for (_ident, thread) in threads {
            let (name, native_id) = match self.thread_attributes(&mut r, &layout, thread, &mut key_names) {
                Ok(found) => found,
                Err(RegistryError::Budget) => break,
                // One unreadable Thread (ending, or not what it seems) does not hide the others.
                Err(_) => continue,
            };
            if let (Some(name), Some(tid)) = (name, native_id) {
                if live.contains(&tid) {
                    names.insert(tid, name);
                }
            }
        }
        Ok(names)
    }

    fn layout(&mut self, r: &mut Reads) -> Result<ThreadingLayout, RegistryError> {
        if self.layout.is_none() {
            let offsets = if self.target.version.publishes_debug_offsets() {
                let bytes = r.vec(self.target.runtime_address, debug_offsets::MAX_ENCODED_SIZE)?;
                match debug_offsets::decode(&bytes) {
                    Ok(o) => Some(o),
                    Err(e) => {
                        self.layout = Some(Err(e.to_string()));
                        None
                    }
                }
            } else {
                None
            };
            if self.layout.is_none() {
                self.layout = Some(threading_layout(self.target.version, offsets.as_ref()).map_err(|e| e.to_string()));
            }
        }
        match &self.layout {
            Some(Ok(layout)) => Ok(*layout),
            Some(Err(e)) => Err(RegistryError::Layout(e.clone())),
            None => Err(RegistryError::Layout("not read".into())),
        }
    }

    /// The cached path still holds: the module's namespace and `_active` are still dicts.
    fn still_resolved(&mut self, r: &mut Reads, resolved: Resolved) -> bool {
        let dict = self.types.dict;
        dict.is_some()
            && self.ob_type(r, resolved.module_dict).ok() == dict
            && self.ob_type(r, resolved.active).ok() == dict
    }

    /// Finds `sys.modules["threading"].__dict__["_active"]`; `None` if `threading` is not
    /// imported (or `_active` is not a dict).
    fn resolve(&mut self, r: &mut Reads, layout: &ThreadingLayout) -> Result<Option<Resolved>, RegistryError> {
        let t = &self.target;
        let interp = r.u64(t.runtime_address.wrapping_add(t.layout.interpreters_head.into()))?;
        if interp == 0 {
            return Ok(None);
        }
        let modules = r.u64(interp.wrapping_add(layout.interp_modules.into()))?;
        if modules == 0 || !self.is_type(r, modules, TypeKind::Dict)? {
            return Ok(None);
        }
        let shape = self.dict_shape(r, layout, modules)?;
        if self.modules_without_threading == Some(shape) {
            return Ok(None);
        }
        let entries = self.dict_entries(r, layout, modules, MAX_MODULES)?;
        let Some(module) = self.find_key(r, &entries, "threading")? else {
            self.modules_without_threading = Some(shape);
            return Ok(None);
        };
        self.modules_without_threading = None;
        if !self.is_type(r, module, TypeKind::Module)? {
            return Ok(None);
        }
        let module_dict = r.u64(module.wrapping_add(layout.module_dict.into()))?;
        if module_dict == 0 || !self.is_type(r, module_dict, TypeKind::Dict)? {
            return Ok(None);
        }
        let names = self.dict_entries(r, layout, module_dict, MAX_MODULE_NAMES)?;
        let Some(active) = self.find_key(r, &names, "_active")? else { return Ok(None) };
        if !self.is_type(r, active, TypeKind::Dict)? {
            return Ok(None);
        }
        Ok(Some(Resolved { module_dict, active }))
    }

    /// The value of the entry whose key is the `str` `wanted` (ASCII, under 16 characters).
    fn find_key(&mut self, r: &mut Reads, entries: &[Entry], wanted: &str) -> Result<Option<u64>, RegistryError> {
        for &(key, value) in entries {
            if self.key_is(r, key, wanted)? {
                return Ok(Some(value));
            }
        }
        Ok(None)
    }

    /// Whether the object at `key` is a `str` equal to `wanted`: one read of its header and
    /// first characters; its type is checked only when the text matches.
    fn key_is(&mut self, r: &mut Reads, key: u64, wanted: &str) -> Result<bool, RegistryError> {
        let objects = self.target.layout.objects;
        let Ok(buf) = r.vec(key, key_peek(&objects)) else {
            return if r.left == 0 { Err(RegistryError::Budget) } else { Ok(false) };
        };
        if !short_ascii_equals(&buf, &objects, wanted) {
            return Ok(false);
        }
        let ob_type = field_u64(&buf, objects.ob_type as usize).unwrap_or(0);
        Ok(self.type_matches(r, ob_type, TypeKind::Str))
    }

    /// `_name` (cut) and `_native_id` of the `Thread` at `thread`. `key_names` remembers,
    /// for this read, which attribute name each key object is (instances share their keys).
    fn thread_attributes(
        &mut self,
        r: &mut Reads,
        layout: &ThreadingLayout,
        thread: u64,
        key_names: &mut HashMap<u64, Option<Attribute>>,
    ) -> Result<(Option<String>, Option<u32>), RegistryError> {
        let entries = self.attribute_entries(r, layout, thread)?;
        let (mut name, mut native_id) = (None, None);
        for (key, value) in entries {
            let attribute = match key_names.get(&key) {
                Some(known) => *known,
                None => {
                    let found = if self.key_is(r, key, "_name")? {
                        Some(Attribute::Name)
                    } else if self.key_is(r, key, "_native_id")? {
                        Some(Attribute::NativeId)
                    } else {
                        None
                    };
                    key_names.insert(key, found);
                    found
                }
            };
            match attribute {
                Some(Attribute::Name) => name = self.read_name(r, value),
                Some(Attribute::NativeId) => native_id = self.read_small_int(r, layout, value),
                None => {}
            }
            if name.is_some() && native_id.is_some() {
                break;
            }
        }
        Ok((name, native_id))
    }

    /// A `str` value, cut to [`MAX_NAME_CHARS`]; `None` if it is not a `str`.
    fn read_name(&mut self, r: &mut Reads, value: u64) -> Option<String> {
        let objects = self.target.layout.objects;
        let ob_type = self.ob_type(r, value).ok()?;
        if !self.type_matches(r, ob_type, TypeKind::Str) {
            return None;
        }
        r.charge(KEY_PEEK + 4 * MAX_NAME_CHARS).ok()?;
        let (text, _) = crate::target::symbolize::read_str_prefix(&r.mem, &objects, value, MAX_NAME_CHARS, Some(ob_type)).ok()?;
        Some(text)
    }

    /// A non-negative `int` below 2**32 (a thread id); `None` for anything else (`None`).
    fn read_small_int(&mut self, r: &mut Reads, layout: &ThreadingLayout, value: u64) -> Option<u32> {
        let ob_type = self.ob_type(r, value).ok()?;
        if !self.type_matches(r, ob_type, TypeKind::Int) {
            return None;
        }
        let buf = r.vec(value, layout.int_digits as usize + 8).ok()?;
        let digits = match layout.int_tag {
            Some(tag) => {
                let tag = field_u64(&buf, tag as usize)?;
                if tag & 3 != 0 {
                    // Zero (1), negative (2) or invalid (3): no thread id.
                    return None;
                }
                tag >> 3
            }
            None => {
                let size = field_u64(&buf, layout.int_size as usize)? as i64;
                u64::try_from(size).ok()?
            }
        };
        let digit = |i: usize| crate::target::memory::field_u32(&buf, layout.int_digits as usize + 4 * i).map(u64::from);
        let value = match digits {
            1 => digit(0)?,
            2 => digit(0)? | digit(1)? << 30,
            _ => return None,
        };
        u32::try_from(value).ok().filter(|&v| v != 0)
    }

    /// The `(key, value)` pairs of an instance's attributes (see `AttributeStorage`).
    fn attribute_entries(&mut self, r: &mut Reads, layout: &ThreadingLayout, object: u64) -> Result<Vec<Entry>, RegistryError> {
        let ob_type = self.ob_type(r, object)?;
        let header = match self.round_types.get(&ob_type) {
            Some(header) => header.clone(),
            None => {
                let header = r.vec(ob_type, (layout.type_dictoffset as usize + 8).max(layout.type_flags as usize + 8))?;
                self.round_types.insert(ob_type, header.clone());
                header
            }
        };
        let flags = field_u64(&header, layout.type_flags as usize).ok_or(RegistryError::Malformed("type header"))?;
        if flags & TPFLAGS_HEAPTYPE == 0 {
            return Err(RegistryError::Malformed("a Thread of a static type"));
        }
        let at = |offset: i32| object.wrapping_add_signed(offset.into());
        let plain_dict = |this: &mut Self, r: &mut Reads| -> Result<Vec<Entry>, RegistryError> {
            let offset = field_u64(&header, layout.type_dictoffset as usize).unwrap_or(0) as i64;
            if offset <= 0 || offset > 4096 || offset % 8 != 0 {
                return Err(RegistryError::Malformed("no instance dict offset"));
            }
            let dict = r.u64(object.wrapping_add(offset as u64))?;
            this.checked_dict_entries(r, layout, dict)
        };
        let managed = flags & TPFLAGS_MANAGED_DICT != 0;
        match layout.attributes {
            AttributeStorage::DictOffset => plain_dict(self, r),
            _ if !managed => plain_dict(self, r),
            AttributeStorage::ManagedSplit { values, dict, cached_keys } => {
                let dict = r.u64(at(dict))?;
                if dict != 0 {
                    return self.checked_dict_entries(r, layout, dict);
                }
                let values = r.u64(at(values))?;
                self.cached_keys_entries(r, layout, ob_type, cached_keys, values)
            }
            AttributeStorage::ManagedTagged { word, cached_keys } => {
                let word = r.u64(at(word))?;
                if word & 1 == 0 {
                    return self.checked_dict_entries(r, layout, word);
                }
                self.cached_keys_entries(r, layout, ob_type, cached_keys, word.wrapping_add(1))
            }
            AttributeStorage::ManagedInline { dict, cached_keys } => {
                let dict = r.u64(at(dict))?;
                if dict != 0 {
                    return self.checked_dict_entries(r, layout, dict);
                }
                if flags & TPFLAGS_INLINE_VALUES == 0 {
                    return Err(RegistryError::Malformed("neither a dict nor inline values"));
                }
                let basicsize = field_u64(&header, layout.type_basicsize as usize).unwrap_or(0);
                if basicsize == 0 || basicsize > 4096 || !basicsize.is_multiple_of(8) {
                    return Err(RegistryError::Malformed("object size"));
                }
                let values = object.wrapping_add(basicsize);
                // `valid` (byte 3 of the values' header) is cleared once a dict took over.
                let head = r.vec(values, 8)?;
                if head.get(3) == Some(&0) {
                    return Err(RegistryError::Malformed("inline values no longer valid"));
                }
                self.cached_keys_entries(r, layout, ob_type, cached_keys, values)
            }
        }
    }

    /// Entries of a split table whose keys are the type's `ht_cached_keys` and values at
    /// `values` (a `PyDictValues`).
    fn cached_keys_entries(
        &mut self,
        r: &mut Reads,
        layout: &ThreadingLayout,
        ob_type: u64,
        cached_keys: u32,
        values: u64,
    ) -> Result<Vec<Entry>, RegistryError> {
        if values == 0 || values == 1 {
            return Err(RegistryError::Malformed("no values"));
        }
        let keys = r.u64(ob_type.wrapping_add(cached_keys.into()))?;
        self.keys_entries(r, layout, keys, Some(values), MAX_ATTRIBUTES)
    }

    fn checked_dict_entries(&mut self, r: &mut Reads, layout: &ThreadingLayout, dict: u64) -> Result<Vec<Entry>, RegistryError> {
        if dict == 0 || !self.is_type(r, dict, TypeKind::Dict)? {
            return Err(RegistryError::Malformed("attributes are not a dict"));
        }
        self.dict_entries(r, layout, dict, MAX_ATTRIBUTES)
    }

    /// `(ma_keys, dk_nentries)` of the dict at `dict`.
    fn dict_shape(&mut self, r: &mut Reads, layout: &ThreadingLayout, dict: u64) -> Result<(u64, u64), RegistryError> {
        let keys = r.u64(dict.wrapping_add(layout.dict.ma_keys.into()))?;
        let nentries = match layout.dict.keys {
            KeysLayout::Sized { nentries, .. } | KeysLayout::Log2 { nentries, .. } => r.u64(keys.wrapping_add(nentries.into()))?,
        };
        Ok((keys, nentries))
    }

    /// The live entries of the dict at `dict` (a checked dict), at most `max` slots read.
    fn dict_entries(&mut self, r: &mut Reads, layout: &ThreadingLayout, dict: u64, max: usize) -> Result<Vec<Entry>, RegistryError> {
        let size = (layout.dict.ma_keys.max(layout.dict.ma_values) + 8) as usize;
        let header = r.vec(dict, size)?;
        let keys = field_u64(&header, layout.dict.ma_keys as usize).unwrap_or(0);
        let values = field_u64(&header, layout.dict.ma_values as usize).unwrap_or(0);
        self.keys_entries(r, layout, keys, (values != 0).then_some(values), max)
    }

    /// The entries of the keys object at `keys`; with `values` (a split table), each value is
    /// taken from there by entry index. Entries without a key or value are left out.
    fn keys_entries(
        &mut self,
        r: &mut Reads,
        layout: &ThreadingLayout,
        keys: u64,
        values: Option<u64>,
        max: usize,
    ) -> Result<Vec<Entry>, RegistryError> {
        if keys == 0 {
            return Err(RegistryError::Malformed("no keys"));
        }
        let (geometry, entries) = match self.round_keys.get(&keys) {
            Some(known) => known.clone(),
            None => {
                let header = r.vec(keys, 0x30)?;
                let geometry = keys_geometry(&header, &layout.dict.keys).ok_or(RegistryError::Malformed("keys header"))?;
                let entry_bytes = geometry.count * geometry.entry_size;
                if geometry.count > max || entry_bytes > MAX_READ {
                    return Err(RegistryError::Malformed("more entries than allowed"));
                }
                let entries = r.vec(keys.wrapping_add(geometry.entries_offset), entry_bytes)?;
                // Only shared keys (of split tables) are worth keeping: other dicts own theirs.
                if values.is_some() {
                    self.round_keys.insert(keys, (geometry, entries.clone()));
                }
                (geometry, entries)
            }
        };
        if geometry.count > max {
            return Err(RegistryError::Malformed("more entries than allowed"));
        }
        let value_words = match values {
            Some(v) => {
                // From 3.13 the values block says how many values it has room for: the shared
                // keys may have more entries than this instance has values.
                let count = if layout.dict.values_start >= 8 {
                    let head = r.vec(v, 8)?;
                    geometry.count.min(usize::from(head[0]))
                } else {
                    geometry.count
                };
                Some(r.vec(v.wrapping_add(layout.dict.values_start.into()), count * 8)?)
            }
            None => None,
        };
        let mut out = Vec::with_capacity(geometry.count);
        for i in 0..geometry.count {
            let base = i * geometry.entry_size;
            let key = field_u64(&entries, base + geometry.key_at).unwrap_or(0);
            let value = match &value_words {
                Some(words) => field_u64(words, 8 * i).unwrap_or(0),
                None => field_u64(&entries, base + geometry.value_at).unwrap_or(0),
            };
            if key != 0 && value != 0 {
                out.push((key, value));
            }
        }
        Ok(out)
    }

    fn ob_type(&mut self, r: &mut Reads, object: u64) -> Result<u64, RegistryError> {
        r.u64(object.wrapping_add(self.target.layout.objects.ob_type.into()))
    }

    fn is_type(&mut self, r: &mut Reads, object: u64, kind: TypeKind) -> Result<bool, RegistryError> {
        let ob_type = self.ob_type(r, object)?;
        Ok(self.type_matches(r, ob_type, kind))
    }

    /// Whether `ob_type` is the static type `kind`: by address once known, else by `tp_name`
    /// (and not a heap type), then remembered. `str` is the exported `PyUnicode_Type` when
    /// discovery found it.
    fn type_matches(&mut self, r: &mut Reads, ob_type: u64, kind: TypeKind) -> bool {
        if ob_type == 0 {
            return false;
        }
        let slot = match kind {
            TypeKind::Dict => &mut self.types.dict,
            TypeKind::Module => &mut self.types.module,
            TypeKind::Str => {
                if self.target.str_type.is_some() {
                    return self.target.str_type == Some(ob_type);
                }
                &mut self.types.str
            }
            TypeKind::Int => &mut self.types.int,
        };
        if let Some(known) = *slot {
            return known == ob_type;
        }
        // `tp_name` and `tp_flags` where the layout puts them (16 bytes further in
        // free-threaded builds), else the default build's.
        let (name_at, flags_at) = match &self.layout {
            Some(Ok(layout)) => (layout.type_name as usize, layout.type_flags as usize),
            _ => (0x18, 0xa8),
        };
        let Ok(header) = r.vec(ob_type, name_at.max(flags_at) + 8) else { return false };
        let flags = field_u64(&header, flags_at).unwrap_or(0);
        let name_ptr = field_u64(&header, name_at).unwrap_or(0);
        if flags & TPFLAGS_HEAPTYPE != 0 || r.charge(MAX_TYPE_NAME + 16).is_err() {
            return false;
        }
        let name = r.mem.read_c_string(name_ptr, MAX_TYPE_NAME);
        if name.as_deref() != Some(kind.name()) {
            return false;
        }
        let slot = match kind {
            TypeKind::Dict => &mut self.types.dict,
            TypeKind::Module => &mut self.types.module,
            TypeKind::Str => &mut self.types.str,
            TypeKind::Int => &mut self.types.int,
        };
        *slot = Some(ob_type);
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TypeKind {
    Dict,
    Module,
    Str,
    Int,
}

impl TypeKind {
    fn name(self) -> &'static str {
        match self {
            TypeKind::Dict => "dict",
            TypeKind::Module => "module",
            TypeKind::Str => "str",
            TypeKind::Int => "int",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attribute {
    Name,
    NativeId,
}

/// Where a keys object's entries are and how many to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KeysGeometry {
    entries_offset: u64,
    count: usize,
    entry_size: usize,
    key_at: usize,
    value_at: usize,
}

/// Largest hash table accepted (slots); `sys.modules` of a big program has a few thousand.
const MAX_TABLE_SLOTS: u64 = 1 << 20;

/// Decodes a keys header (`header`: its first 0x30 bytes); `None` if malformed.
fn keys_geometry(header: &[u8], layout: &KeysLayout) -> Option<KeysGeometry> {
    match *layout {
        KeysLayout::Sized { size, nentries, indices } => {
            let slots = field_u64(header, size as usize)?;
            if !slots.is_power_of_two() || slots > MAX_TABLE_SLOTS {
                return None;
            }
            let index_bytes = if slots <= 0xff {
                1
            } else if slots <= 0xffff {
                2
            } else {
                4
            };
            let count = usize::try_from(field_u64(header, nentries as usize)?).ok()?;
            if count as u64 > slots {
                return None;
            }
            Some(KeysGeometry {
                entries_offset: u64::from(indices) + slots * index_bytes,
                count,
                entry_size: 24,
                key_at: 8,
                value_at: 16,
            })
        }
        KeysLayout::Log2 { log2_index_bytes, kind, nentries, indices } => {
            let log2_index_bytes = u32::from(*header.get(log2_index_bytes as usize)?);
            let index_table = 1u64.checked_shl(log2_index_bytes)?;
            if index_table > MAX_TABLE_SLOTS * 4 {
                return None;
            }
            let (entry_size, key_at, value_at) = match header.get(kind as usize)? {
                0 => (24, 8, 16),
                1 | 2 => (16, 0, 8),
                _ => return None,
            };
            let count = usize::try_from(field_u64(header, nentries as usize)?).ok()?;
            if count as u64 > index_table {
                return None;
            }
            Some(KeysGeometry { entries_offset: u64::from(indices) + index_table, count, entry_size, key_at, value_at })
        }
    }
}

/// Whether the `str` header and data in `buf` (read at the object's address) are the compact
/// ASCII string `wanted`.
fn short_ascii_equals(buf: &[u8], objects: &ObjectLayout, wanted: &str) -> bool {
    let length = field_u64(buf, objects.str_length as usize);
    let state = crate::target::memory::field_u32(buf, objects.str_state as usize).unwrap_or(0);
    let compact_ascii = crate::target::symbolize::is_compact_ascii(state, objects);
    let start = objects.str_ascii_data as usize;
    length == Some(wanted.len() as u64)
        && compact_ascii
        && buf.get(start..start + wanted.len()) == Some(wanted.as_bytes())
}

/// The Python names of the threads of `process` now (for `dump`): tid → name, empty when
/// they cannot be read.
pub fn read_once(process: &PythonProcess, tids: &[u32]) -> HashMap<u32, String> {
    RegistryReader::new(RegistryTarget::of(process)).read(tids).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECTS_312: ObjectLayout = ObjectLayout::TEST_312;

    #[test]
    fn short_keys() {
        let mut buf = vec![0u8; KEY_PEEK];
        buf[0x10..0x18].copy_from_slice(&5u64.to_le_bytes());
        buf[0x20..0x24].copy_from_slice(&(1u32 << 2 | 1 << 5 | 1 << 6).to_le_bytes());
        buf[0x28..0x2d].copy_from_slice(b"_name");
        assert!(short_ascii_equals(&buf, &OBJECTS_312, "_name"));
        assert!(!short_ascii_equals(&buf, &OBJECTS_312, "_nam"));
        buf[0x20] = 0;
        assert!(!short_ascii_equals(&buf, &OBJECTS_312, "_name"), "not compact ASCII");
        assert!(!short_ascii_equals(&[0; 8], &OBJECTS_312, "_name"));
    }

    #[test]
    fn keys_headers() {
        let mut h = vec![0u8; 0x30];
        // 3.11+: log2_index_bytes 3 (8-byte table), unicode kind, 5 entries.
        h[9] = 3;
        h[10] = 1;
        h[0x18..0x20].copy_from_slice(&5u64.to_le_bytes());
        let log2 = KeysLayout::Log2 { log2_index_bytes: 9, kind: 10, nentries: 0x18, indices: 0x20 };
        let g = keys_geometry(&h, &log2).expect("geometry");
        assert_eq!((g.entries_offset, g.count, g.entry_size), (0x28, 5, 16));
        h[10] = 7;
        assert!(keys_geometry(&h, &log2).is_none(), "unknown kind");
        h[10] = 0;
        h[9] = 200;
        assert!(keys_geometry(&h, &log2).is_none(), "huge index table");
        // 3.8-3.10: 8 slots of 1-byte indices.
        let sized = KeysLayout::Sized { size: 8, nentries: 0x20, indices: 0x28 };
        let mut h = vec![0u8; 0x30];
        h[8..16].copy_from_slice(&8u64.to_le_bytes());
        h[0x20..0x28].copy_from_slice(&3u64.to_le_bytes());
        let g = keys_geometry(&h, &sized).expect("geometry");
        assert_eq!((g.entries_offset, g.count, g.entry_size, g.key_at), (0x30, 3, 24, 8));
        h[8..16].copy_from_slice(&12u64.to_le_bytes());
        assert!(keys_geometry(&h, &sized).is_none(), "not a power of two");
        h[8..16].copy_from_slice(&8u64.to_le_bytes());
        h[0x20..0x28].copy_from_slice(&9u64.to_le_bytes());
        assert!(keys_geometry(&h, &sized).is_none(), "more entries than slots");
    }
}
