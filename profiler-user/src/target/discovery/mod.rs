//! Finding Python processes by content, not by name.
//!
//! A process is Python when one of the files it maps (its executable first, then every
//! other file mapping, each once) is an ELF file defining `_PyRuntime`. From that file come
//! the version (`_Py_DebugOffsets`, `Py_Version`, the file name, in that order), the layout,
//! and how the kernel finds a thread's `PyThreadState`. Files are read through
//! `/proc/PID/root`, so chrooted and containerised processes work, and parsed once per
//! `(device, inode)` for the whole run (`files`).
//!
//! Outcomes of [`inspect`]: a [`PythonProcess`], or a [`DiscoveryError`] that says whether
//! to forget the process (`Gone`, `NotPython`, `Unsupported`), retry later (`NotReady`), or
//! report a problem (`Permission`, `Io`).

mod elf;
mod files;
pub(crate) mod leases;
pub(crate) mod procfs;
mod tls;
mod version;

#[cfg(test)]
mod live_tests;

use std::io;
use std::path::PathBuf;

use profiler_common::{NO_FIELD, ProcessInfo, tstate_lookup};

use crate::target::layout::{PythonLayout, Version};
use crate::target::memory::{MemoryError, ProcessMemory};

pub use elf::oversized_tables;
pub use files::{FileCounts, FileError, Problem as FileProblem, cached_files, counts as file_counts, hung_files, open_checked};
pub use procfs::{FileKey, read_maps, read_task_comm, task_ids};
pub use procfs::{Mapping, parse_maps, parse_maps_line};

/// glibc x86_64: offset of `specific_1stblock[0].data` in `struct pthread` (at fsbase).
pub const GLIBC_TSD_FIRST_BLOCK: u32 = 0x318;
/// glibc x86_64: offset of the second-level `specific[]` pointer array in `struct pthread`.
pub const GLIBC_TSD_SECOND_LEVEL: u32 = 0x510;
/// glibc's `PTHREAD_KEYS_MAX`.
const PTHREAD_KEYS_MAX: u32 = 1024;
/// x86_64 page size: mappings start at page boundaries.
const PAGE: u64 = 0x1000;

/// How the interpreter is linked into the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Linkage {
    /// The executable itself holds the interpreter.
    Static,
    /// A shared `libpython`; `library` is its path as the target sees it.
    Shared { library: PathBuf },
}

/// How the kernel finds the `PyThreadState` of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadStateLookup {
    /// The glibc TSD slot of the pthread key stored at `key_address` (an `int`, preceded by
    /// `Py_tss_t._is_initialized`), 3.8-3.14.
    PthreadKey { key_address: u64 },
    /// The thread-local word at `fsbase - fsbase_offset` (3.15 static executables).
    Tls { fsbase_offset: u64 },
    /// Only by scanning the interpreter's thread list.
    ListOnly,
}

/// A Python process we can profile. Addresses are in the target's address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonProcess {
    pub pid: u32,
    /// `/proc/PID/stat` field 22: with `pid`, identifies the process (detects PID reuse).
    pub start_time: u64,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// `readlink /proc/PID/exe`, as the target sees it.
    pub exe: PathBuf,
    pub version: Version,
    pub linkage: Linkage,
    /// Address of `_PyRuntime`.
    pub runtime_address: u64,
    /// Address of `PyCode_Type`: a code object's `ob_type` must equal it.
    pub code_type_address: u64,
    /// Addresses of `PyUnicode_Type` / `PyBytes_Type` when exported: the `str` and `bytes`
    /// objects a code object points to must have these types (unchecked when `None`).
    pub str_type_address: Option<u64>,
    pub bytes_type_address: Option<u64>,
    pub layout: PythonLayout,
    pub tstate_lookup: ThreadStateLookup,
    /// How to tell the GIL's holder (`--mode gil`).
    pub gil: crate::target::layout::gil::GilLayout,
    /// How to follow subinterpreters (3.12+; `None` before, see `layout::published`).
    pub interpreters: Option<crate::target::layout::published::InterpreterOffsets>,
    /// Object offsets for asyncio task stacks (3.14+, from `_Py_DebugOffsets`).
    pub objects: Option<crate::target::layout::published::ObjectOffsets>,
    /// The `.AsyncioDebug` section of the interpreter's file, when `_asyncio` is built into it
    /// (else it is in the `_asyncio` shared object, found once loaded: `crate::target::asyncio`).
    pub asyncio_debug: Option<Vec<u8>>,
    /// Where the thread state says which exception is handled (`--mode exception`).
    pub exception: crate::target::layout::exception::ExceptionLayout,
    /// `_Py_NoneStruct` (0 if not exported: then `--mode exception` cannot tell None).
    pub none_address: u64,
    /// Where the GIL's struct is (`<off-cpu: GIL wait>` in `--mode wall/off-cpu`).
    pub gil_wait: crate::target::layout::gil::GilWaitLayout,
    /// Where the garbage collector's `collecting` flag is (`<GC>` frames).
    pub gc: crate::target::layout::gc::GcLayout,
    /// The counter that proves code objects unreplaced (`profiler_common::code_generation`):
    /// its kind and its address (3.12) or offset in the interpreter (3.14+).
    pub code_generation: (u32, u64),
}

/// Display escapes the target's text (command names, reasons holding paths): see `text`.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("process {0} exited")]
    Gone(u32),
    #[error("process {pid} ({}) is not a Python process", crate::text::field(.comm))]
    NotPython { pid: u32, comm: String },
    #[error("process {pid} ({}) runs a Python pyperch cannot profile: {}", crate::text::field(.comm), crate::text::field(.reason))]
    Unsupported { pid: u32, comm: String, reason: String },
    #[error("process {pid} is not ready to be profiled yet: {}", crate::text::field(.reason))]
    NotReady { pid: u32, reason: String },
    #[error("permission denied reading {what} of process {pid}: pyperch must run as root")]
    Permission { pid: u32, what: String },
    #[error("could not read {what} of process {pid}: {source}")]
    Io {
        pid: u32,
        what: String,
        #[source]
        source: io::Error,
    },
}

/// Classifies an error reading something of `pid`.
fn io_error(pid: u32, what: &str, error: io::Error) -> DiscoveryError {
    if error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESRCH) {
        DiscoveryError::Gone(pid)
    } else if error.kind() == io::ErrorKind::PermissionDenied {
        DiscoveryError::Permission { pid, what: what.to_owned() }
    } else {
        DiscoveryError::Io { pid, what: what.to_owned(), source: error }
    }
}

fn memory_error(pid: u32, what: &str, error: MemoryError) -> DiscoveryError {
    match error {
        MemoryError::Read { source, .. } => match source.raw_os_error() {
            Some(libc::ESRCH) => DiscoveryError::Gone(pid),
            Some(libc::EPERM | libc::EACCES) => DiscoveryError::Permission { pid, what: what.to_owned() },
            _ => DiscoveryError::Io { pid, what: what.to_owned(), source },
        },
        other => DiscoveryError::Io { pid, what: what.to_owned(), source: io::Error::other(other.to_string()) },
    }
}

/// Every numeric entry of `/proc` (the caller filters).
pub fn python_pids_candidates() -> Vec<u32> {
    procfs::list_pids()
}

/// `/proc/PID/stat` field 22, or `None` if the process is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    procfs::read_stat(pid).ok().map(|s| s.start_time)
}

/// The CPU time `pid` has used (user + system, clock ticks), or `None` if it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    procfs::read_stat(pid).ok().map(|s| s.cpu_ticks)
}

/// Whether the process `pid` that started at `start_time` still exists.
pub fn is_alive(pid: u32, start_time: u64) -> bool {
    self::start_time(pid) == Some(start_time)
}

pub fn parent_pid(pid: u32) -> Option<u32> {
    procfs::read_stat(pid).ok().map(|s| s.ppid)
}

/// The load bias of a file: from its mapping at file offset 0 (else its lowest mapping) and
/// the `PT_LOAD` segment that mapping starts; 0 for `ET_EXEC`.
fn load_bias(file: &elf::PythonFile, mappings: &[&Mapping]) -> Option<u64> {
    if file.is_exec {
        return Some(0);
    }
    let mapping = mappings.iter().find(|m| m.offset == 0).or_else(|| mappings.iter().min_by_key(|m| m.start))?;
    let segment = file.loads.iter().find(|s| s.offset & !(PAGE - 1) == mapping.offset)?;
    let bias = mapping.start.wrapping_sub(segment.vaddr & !(PAGE - 1));
    (bias % PAGE == 0).then_some(bias)
}

/// Inspects process `pid` (see the module docs for the outcomes).
pub fn inspect(pid: u32) -> Result<PythonProcess, DiscoveryError> {
    let stat = procfs::read_stat(pid).map_err(|e| io_error(pid, "/proc stat", e))?;
    let comm = procfs::read_comm(pid).map_err(|e| io_error(pid, "command name", e))?;
    let mut maps = procfs::read_maps(pid).map_err(|e| io_error(pid, "memory maps", e))?;
    if maps.is_empty() {
        // Kernel threads (and zombies) map nothing.
        return Err(DiscoveryError::NotPython { pid, comm });
    }
    // The kernel prints paths relative to our root; a chrooted target sees them without
    // its root's prefix, and its files are opened through `/proc/PID/root`.
    let root = procfs::read_root(pid).map_err(|e| io_error(pid, "root directory", e))?;
    for m in maps.iter_mut().filter(|m| m.path.starts_with('/')) {
        m.path = procfs::target_view(&root, &m.path);
    }
    let exe = procfs::read_exe(pid).map_err(|e| io_error(pid, "executable path", e))?;
    let exe_str = procfs::target_view(&root, &crate::text::decode(exe.as_os_str().as_encoded_bytes()));
    let exe = PathBuf::from(&exe_str);
    let exe_key = procfs::exe_key(pid).ok();
    let is_exe = |m: &Mapping| m.path == exe_str || Some(m.key()) == exe_key;

    // Each file once, the executable first, then files named like libpython (each file not
    // parsed yet costs a thread and its parse: a launched command is registered sooner when
    // libpython comes before libc, libm and the rest), then the others in map order.
    let mut candidates: Vec<&Mapping> = Vec::new();
    for m in maps.iter().filter(|m| m.is_file()) {
        if !candidates.iter().any(|c| c.key() == m.key()) {
            candidates.push(m);
        }
    }
    let named_python = |m: &Mapping| m.path.rsplit('/').next().is_some_and(|name| name.starts_with("libpython"));
    candidates.sort_by_key(|m| (!is_exe(m), !named_python(m)));

    let mut found = None;
    let mut old_python: Option<&Mapping> = None;
    let mut denied = false;
    // A file that may become readable (leased, hung): not settled as "not Python" yet.
    let mut unread: Option<files::FileError> = None;
    for mapping in candidates {
        match files::facts(pid, mapping) {
            Ok(facts) => match &*facts {
                elf::FileFacts::Python(_) => {
                    found = Some((mapping, facts));
                    break;
                }
                elf::FileFacts::OldPython => old_python = old_python.or(Some(mapping)),
                elf::FileFacts::Other | elf::FileFacts::AsyncioModule(_) => {}
            },
            Err(e) => {
                denied |= e.is_permission();
                if e.is_retryable() && unread.is_none() {
                    unread = Some(e);
                }
            }
        }
    }
    let gone_or =
        |error: DiscoveryError| if is_alive(pid, stat.start_time) { error } else { DiscoveryError::Gone(pid) };
    let Some((mapping, facts)) = found else {
        if let Some(old) = old_python {
            let named = version::from_file_name(std::path::Path::new(&old.path))
                .map(|(major, minor)| format!("CPython {major}.{minor}"))
                .unwrap_or_else(|| "a CPython".into());
            let reason = format!("{named} without _PyRuntime (older than 3.7); pyperch supports 3.8 to 3.15");
            return Err(gone_or(DiscoveryError::Unsupported { pid, comm, reason }));
        }
        if denied {
            return Err(gone_or(DiscoveryError::Permission { pid, what: "mapped files".into() }));
        }
        if let Some(e) = unread {
            // Maybe Python, once that file can be read: look again later.
            return Err(gone_or(DiscoveryError::NotReady { pid, reason: format!("a mapped file cannot be read now: {e}") }));
        }
        return Err(gone_or(DiscoveryError::NotPython { pid, comm }));
    };
    let elf::FileFacts::Python(file) = &*facts else {
        return Err(DiscoveryError::NotPython { pid, comm });
    };
    let unsupported = |reason: String| gone_or(DiscoveryError::Unsupported { pid, comm: comm.clone(), reason });

    let path = PathBuf::from(&mapping.path);
    let version =
        version::determine(file, &path).map_err(|reason| unsupported(format!("{}: {reason}", path.display())))?;
    let mut layout = version::layout(file, version).map_err(unsupported)?;
    // The accessor's own code is the best witness of the key offset of this very build.
    if let (Some(_), Some(decoded)) = (layout.pthread_key, file.tss_key_offset) {
        layout.pthread_key = Some(decoded);
    }

    let same_file: Vec<&Mapping> = maps.iter().filter(|m| m.key() == mapping.key()).collect();
    let bias = load_bias(file, &same_file)
        .ok_or_else(|| unsupported(format!("the load address of {} cannot be worked out", path.display())))?;
    let runtime_address = file.runtime.wrapping_add(bias);
    if !maps.iter().any(|m| m.contains(runtime_address)) {
        return Err(unsupported(format!("_PyRuntime would be at {runtime_address:#x}, which is not mapped")));
    }
    let code_type_address = file
        .code_type
        .map(|v| v.wrapping_add(bias))
        .ok_or_else(|| unsupported(format!("{} does not export PyCode_Type", path.display())))?;

    let tstate_lookup = match (layout.pthread_key, file.gilstate_tls) {
        (Some(offset), _) => ThreadStateLookup::PthreadKey { key_address: runtime_address.wrapping_add(offset.into()) },
        (None, Some(fsbase_offset)) => ThreadStateLookup::Tls { fsbase_offset },
        (None, None) => ThreadStateLookup::ListOnly,
    };
    let linkage = if is_exe(mapping) { Linkage::Static } else { Linkage::Shared { library: path } };

    if !is_alive(pid, stat.start_time) {
        return Err(DiscoveryError::Gone(pid));
    }
    let published = file.debug_offsets.as_deref().and_then(|bytes| crate::target::layout::debug_offsets::decode(bytes).ok());
    let interpreters = crate::target::layout::published::interpreter_offsets(version, published.as_ref());
    let objects = published.as_ref().and_then(crate::target::layout::published::object_offsets);
    let gil = crate::target::layout::gil::gil_layout(version, file.debug_offsets.as_deref());
    let code_generation = crate::target::layout::code_generation::code_generation(
        version,
        file.next_func_version.map(|at| at.wrapping_add(bias)),
        published.as_ref(),
    );
    Ok(PythonProcess {
        code_generation,
        interpreters,
        objects,
        asyncio_debug: file.asyncio_debug.clone(),
        pid,
        start_time: stat.start_time,
        comm,
        exe,
        version,
        linkage,
        runtime_address,
        code_type_address,
        str_type_address: file.str_type.map(|v| v.wrapping_add(bias)),
        bytes_type_address: file.bytes_type.map(|v| v.wrapping_add(bias)),
        layout,
        tstate_lookup,
        gil,
        gc: crate::target::layout::gc::gc_layout(version, file.debug_offsets.as_deref(), gil.check),
        exception: crate::target::layout::exception::exception_layout(version),
        none_address: file.none.map(|v| v.wrapping_add(bias)).unwrap_or(0),
        gil_wait: crate::target::layout::gil::gil_wait_layout(version, file.debug_offsets.as_deref()),
    })
}

/// The `.AsyncioDebug` section of the `_asyncio` extension module mapped into `pid` (3.14
/// builds it as a shared object, loaded when asyncio is first imported), or `None` when no
/// mapped file whose name contains `_asyncio` has one. Files are read through the same
/// bounded, cached path as the interpreter's own (`files::facts`).
pub fn asyncio_module_section(pid: u32) -> Result<Option<Vec<u8>>, DiscoveryError> {
    let mut maps = procfs::read_maps(pid).map_err(|e| io_error(pid, "memory maps", e))?;
    let root = procfs::read_root(pid).map_err(|e| io_error(pid, "root directory", e))?;
    let mut seen = Vec::new();
    for m in maps.iter_mut().filter(|m| m.is_file()) {
        let name = m.path.rsplit('/').next().unwrap_or("");
        if !name.starts_with("_asyncio") || seen.contains(&m.key()) {
            continue;
        }
        seen.push(m.key());
        m.path = procfs::target_view(&root, &m.path);
        if let Ok(facts) = files::facts(pid, m) {
            if let elf::FileFacts::AsyncioModule(bytes) = &*facts {
                return Ok(Some(bytes.clone()));
            }
        }
    }
    Ok(None)
}

impl PythonProcess {
    /// The address of `_PyRuntime.interpreters.head` (the newest interpreter first).
    pub fn interpreters_head_address(&self) -> u64 {
        self.runtime_address.wrapping_add(self.layout.interpreters_head.into())
    }

    /// The version as shown: `3.14.7`, or `3.14.7t` for a free-threaded build.
    pub fn version_label(&self) -> String {
        if self.layout.free_threaded { format!("{}t", self.version) } else { self.version.to_string() }
    }

    /// Reads what the kernel needs now: the pthread key's value exists only once the
    /// interpreter created it, and the interpreter list only once it is initialised
    /// (`NotReady` until then). `Gone` if the process exited or its PID was reused.
    pub fn kernel_info(&self, mem: &ProcessMemory) -> Result<ProcessInfo, DiscoveryError> {
        let pid = self.pid;
        let not_ready = |reason: String| DiscoveryError::NotReady { pid, reason };
        let (lookup, pthread_key, tls_offset) = match self.tstate_lookup {
            ThreadStateLookup::PthreadKey { key_address } => {
                // `Py_tss_t` = `{int _is_initialized; pthread_key_t _key}`.
                let tss = mem
                    .read_vec(key_address.wrapping_sub(4), 8)
                    .map_err(|e| memory_error(pid, "the thread-state key", e))?;
                let initialized = crate::target::memory::field_i32(&tss, 0).unwrap_or(0);
                let key = crate::target::memory::field_u32(&tss, 4).unwrap_or(u32::MAX);
                if initialized != 1 {
                    return Err(not_ready(format!(
                        "the interpreter has not created its thread-state key yet (_is_initialized = {initialized})"
                    )));
                }
                if key >= PTHREAD_KEYS_MAX {
                    return Err(not_ready(format!(
                        "the thread-state key reads {key}, beyond glibc's {PTHREAD_KEYS_MAX} keys"
                    )));
                }
                (tstate_lookup::PTHREAD_KEY, key, 0)
            }
            ThreadStateLookup::Tls { fsbase_offset } => (tstate_lookup::TLS, 0, fsbase_offset),
            ThreadStateLookup::ListOnly => (tstate_lookup::LIST, 0, 0),
        };
        let interpreters_head_addr = self.interpreters_head_address();
        let head =
            mem.read_u64(interpreters_head_addr).map_err(|e| memory_error(pid, "_PyRuntime.interpreters.head", e))?;
        if head == 0 {
            return Err(not_ready("no interpreter exists yet (_PyRuntime.interpreters.head is NULL)".into()));
        }
        if !is_alive(pid, self.start_time) {
            return Err(DiscoveryError::Gone(pid));
        }
        Ok(ProcessInfo {
            tstate_lookup: lookup,
            pthread_key,
            tls_offset,
            tsd_first_block: GLIBC_TSD_FIRST_BLOCK,
            tsd_second_level: GLIBC_TSD_SECOND_LEVEL,
            interpreters_head_addr,
            thread: self.layout.thread,
            frame: self.layout.frame,
            // Set by the session when it registers the process.
            generation: 0,
            gil_enabled: self.gil.enabled,
            gil_check: self.gil.check,
            gil_locked: self.gil.locked,
            gil_holder: if self.gil.check == profiler_common::gil_check::RUNTIME_TSTATE {
                self.runtime_address.wrapping_add(self.gil.holder)
            } else {
                self.gil.holder
            },
            interp_next: self.interpreters.map_or(NO_FIELD, |i| i.next),
            tstate_interp: self.interpreters.and_then(|i| i.tstate_interp).unwrap_or(NO_FIELD),
            interp_id: self.interpreters.and_then(|i| i.id).unwrap_or(NO_FIELD),
            // Set by the session under `--async`.
            running_task: NO_FIELD,
            // Without None's address an item holding None would read as "handling".
            exc_info: if self.none_address != 0 { self.exception.exc_info } else { 0 },
            exc_handled: self.exception.handled,
            exc_previous: self.exception.previous,
            _pad2: 0,
            none_address: self.none_address,
            gil_wait_kind: self.gil_wait.kind,
            gil_wait_size: self.gil_wait.size,
            gil_wait_at: if self.gil_wait.kind == profiler_common::gil_wait::RUNTIME_ADDRESS {
                self.runtime_address.wrapping_add(self.gil_wait.at)
            } else {
                self.gil_wait.at
            },
            code_generation_kind: self.code_generation.0,
            tlbc_generation: self.layout.tlbc.map_or(0, |t| t.generation),
            code_generation_at: self.code_generation.1,
            tasks: Default::default(),
            gc_check: self.gc.check,
            _pad3: 0,
            gc_collecting: if self.gc.check == profiler_common::gc_check::RUNTIME_FLAG {
                self.runtime_address.wrapping_add(self.gc.collecting)
            } else {
                self.gc.collecting
            },
        })
    }

    /// Threads of the process, from `/proc/PID/status`.
    pub fn thread_count(&self) -> Option<u32> {
        procfs::read_thread_count(self.pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, offset: u64) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            perms: *b"r--p",
            offset,
            dev: (8, 1),
            inode: 7,
            path: "/lib/libpython3.12.so.1.0".into(),
            deleted: false,
        }
    }

    fn file(is_exec: bool, loads: &[(u64, u64)]) -> elf::PythonFile {
        elf::PythonFile {
            is_exec,
            loads: loads
                .iter()
                .map(|&(vaddr, offset)| elf::Segment { vaddr, memsz: 0x1000, offset, filesz: 0x1000 })
                .collect(),
            runtime: 0,
            runtime_size: 0,
            code_type: None,
            str_type: None,
            bytes_type: None,
            none: None,
            next_func_version: None,
            py_version: None,
            debug_offsets: None,
            gilstate_tls: None,
            tss_key_offset: None,
            marker_minor: 11,
            version_strings: Vec::new(),
            asyncio_debug: None,
        }
    }

    #[test]
    fn bias_from_first_mapping() {
        let lib = file(false, &[(0, 0), (0x1b000, 0x1b000), (0x53c6f0, 0x53b6f0)]);
        let maps = [mapping(0x7f00_0000_0000, 0), mapping(0x7f00_0001_b000, 0x1b000)];
        let refs: Vec<&Mapping> = maps.iter().collect();
        assert_eq!(load_bias(&lib, &refs), Some(0x7f00_0000_0000));
        // Only a later mapping visible: the segment with that page offset decides.
        assert_eq!(load_bias(&lib, &refs[1..]), Some(0x7f00_0000_0000));
        // A data segment whose vaddr and offset differ by a page.
        let data_only = [mapping(0x7f00_0053_c000, 0x53b000)];
        let refs: Vec<&Mapping> = data_only.iter().collect();
        assert_eq!(load_bias(&lib, &refs), Some(0x7f00_0000_0000));
        let exec = file(true, &[(0x400000, 0)]);
        assert_eq!(load_bias(&exec, &[]), Some(0));
        assert_eq!(load_bias(&lib, &[]), None);
    }

    #[test]
    fn not_python_and_gone() {
        let me = std::process::id();
        assert!(matches!(inspect(me), Err(DiscoveryError::NotPython { .. })), "{:?}", inspect(me));
        // A kernel thread (kthreadd) maps nothing.
        assert!(matches!(inspect(2), Err(DiscoveryError::NotPython { .. })));
        assert!(matches!(inspect(u32::MAX - 1), Err(DiscoveryError::Gone(_))));
        assert!(start_time(me).is_some());
        assert!(is_alive(me, start_time(me).unwrap_or(0)));
        assert!(!is_alive(me, start_time(me).unwrap_or(0) + 1));
        assert_eq!(parent_pid(1), Some(0));
        assert!(python_pids_candidates().contains(&me));
    }
}
