//! The process-wide cache of parsed files, keyed by `(device, inode)` as `/proc/PID/maps`
//! reports them, so each distinct file on the host is opened and parsed once however many
//! processes map it.
//!
//! Files are opened as the target sees them: through `/proc/PID/root/<path>` (chroots and
//! containers), checked to be the mapped inode; if that fails (deleted or replaced file, or
//! another mount namespace hides it), through `/proc/PID/map_files/<range>`. Only regular
//! files are opened. Failures to open or read are not cached: a later scan retries.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use super::elf::{self, FileFacts};
use super::procfs::{self, FileKey, Mapping};

static FILES: LazyLock<Mutex<HashMap<FileKey, Arc<FileFacts>>>> = LazyLock::new(Default::default);

/// Opens `path` if it is a regular file, optionally with the expected inode.
fn open_regular(path: &Path, inode: Option<u64>) -> io::Result<File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    if inode.is_some_and(|inode| inode != meta.ino()) {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} was replaced", path.display())));
    }
    File::open(path)
}

/// Opens the file behind `mapping` of process `pid`.
pub fn open_mapped(pid: u32, mapping: &Mapping) -> io::Result<File> {
    let through_root = if mapping.deleted {
        None
    } else {
        Some(open_regular(&procfs::in_root(pid, &mapping.path), Some(mapping.inode)))
    };
    match through_root {
        Some(Ok(file)) => Ok(file),
        Some(Err(first)) => open_regular(&procfs::map_file(pid, mapping), None).map_err(|_| first),
        None => open_regular(&procfs::map_file(pid, mapping), None),
    }
}

/// What the file behind `mapping` is, from the cache or parsed now.
pub fn facts(pid: u32, mapping: &Mapping) -> io::Result<Arc<FileFacts>> {
    let key = mapping.key();
    if let Some(found) = FILES.lock().ok().and_then(|cache| cache.get(&key).cloned()) {
        return Ok(found);
    }
    let parsed = Arc::new(elf::parse(open_mapped(pid, mapping)?)?);
    if let Ok(mut cache) = FILES.lock() {
        cache.insert(key, parsed.clone());
    }
    Ok(parsed)
}

/// Files parsed so far (for statistics).
pub fn cached_files() -> usize {
    FILES.lock().map(|cache| cache.len()).unwrap_or(0)
}
