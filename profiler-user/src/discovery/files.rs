//! The process-wide cache of parsed files, keyed by `(device, inode)` as `/proc/PID/maps`
//! reports them, so each distinct file on the host is opened and parsed once however many
//! processes map it.
//!
//! Files are opened as the target sees them: through `/proc/PID/root/<path>` (chroots and
//! containers), checked to be the mapped inode; if that fails (deleted or replaced file, or
//! another mount namespace hides it), through `/proc/PID/map_files/<range>`. Only regular
//! files are opened. Failures to open or read are not cached: a later scan retries.
//!
//! The cache is bounded: an entry not used for `IDLE_EXPIRY` is dropped (its file is
//! typically mapped by no process any more), and past `FILES_BUDGET` accounted bytes the least
//! recently used entries go. A dropped entry is parsed again if a process maps the file later.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::elf::{self, FileFacts};
use super::procfs::{self, FileKey, Mapping};

static FILES: LazyLock<Mutex<HashMap<FileKey, Cached>>> = LazyLock::new(Default::default);

/// Accounted bytes the cache may hold.
const FILES_BUDGET: usize = 4 << 20;
/// Entries unused this long are dropped.
const IDLE_EXPIRY: Duration = Duration::from_secs(600);
/// Accounted per entry beside its variable parts: key, map slot, `FileFacts`, headers.
const ENTRY_OVERHEAD: usize = 512;

struct Cached {
    facts: Arc<FileFacts>,
    bytes: usize,
    used: Instant,
}

/// Accounted bytes of one entry.
fn entry_bytes(facts: &FileFacts) -> usize {
    ENTRY_OVERHEAD
        + match facts {
            FileFacts::Python(p) => {
                p.loads.len() * std::mem::size_of::<elf::Segment>() + p.debug_offsets.as_ref().map_or(0, |d| d.len())
            }
            _ => 0,
        }
}

/// Drops expired entries, then the least recently used ones until `incoming` more bytes fit.
fn prune(cache: &mut HashMap<FileKey, Cached>, incoming: usize) {
    let now = Instant::now();
    cache.retain(|_, c| now.duration_since(c.used) < IDLE_EXPIRY);
    let mut total: usize = cache.values().map(|c| c.bytes).sum::<usize>() + incoming;
    if total <= FILES_BUDGET {
        return;
    }
    let mut by_age: Vec<(Instant, FileKey, usize)> = cache.iter().map(|(k, c)| (c.used, *k, c.bytes)).collect();
    by_age.sort_unstable_by_key(|(used, _, _)| *used);
    for (_, key, bytes) in by_age {
        if total <= FILES_BUDGET {
            break;
        }
        cache.remove(&key);
        total -= bytes;
    }
}

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
    if let Ok(mut cache) = FILES.lock() {
        if let Some(found) = cache.get_mut(&key) {
            found.used = Instant::now();
            return Ok(found.facts.clone());
        }
    }
    let parsed = Arc::new(elf::parse(open_mapped(pid, mapping)?)?);
    if let Ok(mut cache) = FILES.lock() {
        let bytes = entry_bytes(&parsed);
        prune(&mut cache, bytes);
        cache.insert(key, Cached { facts: parsed.clone(), bytes, used: Instant::now() });
    }
    Ok(parsed)
}

/// Files parsed so far (for statistics).
pub fn cached_files() -> usize {
    FILES.lock().map(|cache| cache.len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: usize, age: Duration) -> Cached {
        let used = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        Cached { facts: Arc::new(FileFacts::Other), bytes, used }
    }

    fn key(inode: u64) -> FileKey {
        FileKey { dev: (8, 1), inode }
    }

    #[test]
    fn prune_drops_idle_entries_then_the_least_recently_used() {
        let mut cache = HashMap::new();
        cache.insert(key(1), entry(100, IDLE_EXPIRY + Duration::from_secs(1)));
        cache.insert(key(2), entry(FILES_BUDGET / 2, Duration::from_secs(30)));
        cache.insert(key(3), entry(FILES_BUDGET / 2, Duration::from_secs(20)));
        prune(&mut cache, 0);
        assert!(!cache.contains_key(&key(1)), "idle entries expire");
        assert_eq!(cache.len(), 2, "within the budget nothing else goes");
        prune(&mut cache, 1000);
        assert!(!cache.contains_key(&key(2)), "the least recently used goes first");
        assert!(cache.contains_key(&key(3)));
    }
}
