//! Which files hold a write lease (or delegation), from `/proc/locks`.
//!
//! Opening a file under a write lease, even with `O_NONBLOCK`, starts breaking the lease:
//! the holder is signalled and loses the lease after `/proc/sys/fs/lease-break-time`. A
//! profiler must not do that to the processes it watches, so files listed here are not
//! opened at all (they are retried later). The list is read at most once per
//! [`REFRESH`], bounded in size, and parsed without trusting its content.

use std::collections::HashSet;
use std::io::Read;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::procfs::FileKey;

/// How long one reading of `/proc/locks` is trusted.
const REFRESH: Duration = Duration::from_millis(500);
/// `/proc/locks` beyond this size is ignored past the limit (a host with that many locks
/// still gets its first ones checked).
const MAX_LOCKS_BYTES: u64 = 4 << 20;

struct Snapshot {
    at: Instant,
    leased: HashSet<FileKey>,
}

static SNAPSHOT: LazyLock<Mutex<Option<Snapshot>>> = LazyLock::new(Default::default);

/// The files that hold a write lease or delegation in one `/proc/locks` text. Lines are
/// `ID: CLASS STATE TYPE PID MAJ:MIN:INODE START END` (hex device numbers, decimal inode);
/// blocked waiters (`ID: -> ...`) and malformed lines are skipped.
pub fn parse_write_leases(text: &str) -> HashSet<FileKey> {
    let mut leased = HashSet::new();
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(_id), Some(class)) = (fields.next(), fields.next()) else { continue };
        if class != "LEASE" && class != "DELEG" {
            continue;
        }
        // STATE (ACTIVE, BREAKING, BREAKER), then TYPE.
        let (Some(_state), Some(kind), Some(_pid), Some(file)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if kind != "WRITE" {
            continue;
        }
        if let Some(key) = parse_file(file) {
            leased.insert(key);
        }
    }
    leased
}

/// `MAJ:MIN:INODE`, hex device numbers and a decimal inode.
fn parse_file(text: &str) -> Option<FileKey> {
    let mut parts = text.split(':');
    let major = u32::from_str_radix(parts.next()?, 16).ok()?;
    let minor = u32::from_str_radix(parts.next()?, 16).ok()?;
    let inode = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some(FileKey { dev: (major, minor), inode })
}

fn read_locks() -> HashSet<FileKey> {
    let mut bytes = Vec::new();
    let read = std::fs::File::open("/proc/locks").and_then(|f| f.take(MAX_LOCKS_BYTES).read_to_end(&mut bytes));
    match read {
        Ok(_) => parse_write_leases(&String::from_utf8_lossy(&bytes)),
        Err(_) => HashSet::new(),
    }
}

/// Whether `key` holds a write lease now (as of a reading at most [`REFRESH`] old).
pub fn is_write_leased(key: FileKey) -> bool {
    let Ok(mut snapshot) = SNAPSHOT.lock() else { return false };
    let fresh = snapshot.as_ref().is_some_and(|s| s.at.elapsed() < REFRESH);
    if !fresh {
        *snapshot = Some(Snapshot { at: Instant::now(), leased: read_locks() });
    }
    snapshot.as_ref().is_some_and(|s| s.leased.contains(&key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_from_proc_locks() {
        let text = "\
1: LEASE  ACTIVE    WRITE 28561 fe:00:10035644 0 EOF
2: LEASE  BREAKING  READ 28561 fe:00:10035643 0 EOF
3: LEASE  BREAKING  WRITE 28561 08:1f:42 0 EOF
4: FLOCK  ADVISORY  WRITE 28632 fe:00:5480724 0 EOF
5: POSIX  ADVISORY  WRITE 700 00:2b:99 0 EOF
5: -> POSIX  ADVISORY  WRITE 701 00:2b:99 0 EOF
6: DELEG  ACTIVE    WRITE 0 00:31:7 0 EOF
7: LEASE  ACTIVE    WRITE 1 <none>:0 0 EOF
8: LEASE  ACTIVE    WRITE 1 zz:00:1 0 EOF
9: LEASE
garbage
";
        let leased = parse_write_leases(text);
        let mut keys: Vec<FileKey> = leased.into_iter().collect();
        keys.sort();
        assert_eq!(
            keys,
            vec![
                FileKey { dev: (0, 0x31), inode: 7 },
                FileKey { dev: (8, 0x1f), inode: 42 },
                FileKey { dev: (0xfe, 0), inode: 10035644 },
            ]
        );
    }

    #[test]
    fn reading_the_real_file_does_not_fail() {
        assert!(!is_write_leased(FileKey { dev: (0, 0), inode: 0 }));
    }
}
