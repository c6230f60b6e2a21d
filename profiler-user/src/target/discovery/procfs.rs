//! What `/proc` says about a process: memory maps, `stat`, `status`, `comm`, `exe`.
//!
//! Parsers are pure functions over the text (tested on fixtures); the readers around them
//! only add the path. Every file here may vanish at any moment (the process exits): readers
//! return `io::Error` and the caller decides whether the process is gone.
//!
//! `/proc` text is never read with `read_to_string`: a command name is any 15 bytes (a
//! process title cut mid-character is common) and paths are bytes, so a file that is not
//! UTF-8 must not look like a vanished process. Files are read as bytes and decoded with
//! [`crate::text::decode`] (invalid bytes become `\xNN`); the numeric fields parsed here are
//! ASCII either way.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp`-style permissions.
    pub perms: [u8; 4],
    /// Offset in the file of `start`.
    pub offset: u64,
    /// Device of the file, `(major, minor)`.
    pub dev: (u32, u32),
    /// 0 for anonymous and pseudo mappings.
    pub inode: u64,
    /// The path as the process sees it (without a ` (deleted)` suffix), `[heap]`-style
    /// pseudo names, or empty for anonymous memory.
    pub path: String,
    /// The kernel marked the file deleted.
    pub deleted: bool,
}

/// A file as the kernel identifies it: the key of the process-wide file cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: (u32, u32),
    pub inode: u64,
}

impl Mapping {
    /// A mapping of a regular file we may open: it has an inode and an absolute path that
    /// is not a device (opening device nodes can have side effects, e.g. watchdogs).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/') && !self.path.starts_with("/dev/")
    }

    pub fn key(&self) -> FileKey {
        FileKey { dev: self.dev, inode: self.inode }
    }

    pub fn contains(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }
}

const DELETED: &str = " (deleted)";

/// Parses one maps line; `None` for a malformed line.
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut next_field = || {
        let trimmed = rest.trim_start_matches(' ');
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (field, tail) = trimmed.split_at(end);
        rest = tail;
        (!field.is_empty()).then_some(field)
    };
    let range = next_field()?;
    let perms = next_field()?;
    let offset = next_field()?;
    let dev = next_field()?;
    let inode = next_field()?;
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let perms: [u8; 4] = perms.as_bytes().try_into().ok()?;
    let mut path = rest.trim_start_matches(' ').trim_end_matches('\n');
    let deleted = path.starts_with('/') && path.ends_with(DELETED);
    if deleted {
        path = &path[..path.len() - DELETED.len()];
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
        inode: inode.parse().ok()?,
        path: path.to_owned(),
        deleted,
    })
}

/// Parses `/proc/PID/maps`, skipping malformed lines.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

/// The fields of `/proc/PID/stat` we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Field 4.
    pub ppid: u32,
    /// Field 22, in clock ticks since boot: with the PID, identifies a process.
    pub start_time: u64,
    /// Fields 14 and 15 (user and system time), in clock ticks.
    pub cpu_ticks: u64,
}

/// Parses `/proc/PID/stat`. The command (field 2) may hold spaces and parentheses, so
/// fields are counted from its last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let after_comm = &text[text.rfind(')')? + 1..];
    // Fields from 3 (state) on.
    let fields: Vec<&str> = after_comm.split_ascii_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        ppid: fields.get(4 - 3)?.parse().ok()?,
        start_time: field(22)?,
        cpu_ticks: field(14)?.saturating_add(field(15)?),
    })
}

/// The `Threads:` count of `/proc/PID/status`.
pub fn parse_status_threads(text: &str) -> Option<u32> {
    text.lines().find_map(|line| line.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok())
}

pub fn proc_path(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// The target's root directory as this process sees it (`/` unless the target is chrooted
/// within our mount namespace).
pub fn read_root(pid: u32) -> io::Result<PathBuf> {
    std::fs::read_link(proc_path(pid, "root"))
}

/// A path the kernel printed for us (`/proc/PID/maps`, `/proc/PID/exe` are relative to the
/// *reader's* root) as the target sees it: without the target's root when that is a prefix.
pub fn target_view(root: &Path, path: &str) -> String {
    let root = root.to_string_lossy();
    if root == "/" || root.is_empty() {
        return path.to_owned();
    }
    match path.strip_prefix(root.as_ref()) {
        Some(rest) if rest.starts_with('/') => rest.to_owned(),
        _ => path.to_owned(),
    }
}

/// A path of the target's file system, reached through `/proc/PID/root` (so files of
/// chrooted and containerised processes are found). For display and tests only: opening it
/// would follow symbolic links out of the target's root; `files` opens with `openat2`.
#[cfg(test)]
pub fn in_root(pid: u32, path: &str) -> PathBuf {
    proc_path(pid, "root").join(path.trim_start_matches('/'))
}

/// A path as the target sees it, relative to its root (for `openat2` from a descriptor of
/// `/proc/PID/root`): without its leading slashes.
pub fn root_relative(path: &str) -> &str {
    match path.trim_start_matches('/') {
        "" => ".",
        rest => rest,
    }
}

/// The file behind one mapping, even if deleted or replaced (needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN).
pub fn map_file(pid: u32, mapping: &Mapping) -> PathBuf {
    proc_path(pid, &format!("map_files/{:x}-{:x}", mapping.start, mapping.end))
}

/// A `/proc` text file as a `String`, invalid UTF-8 decoded as `\xNN`.
fn read_text(path: &Path) -> io::Result<String> {
    Ok(crate::text::decode(&std::fs::read(path)?))
}

/// At most this much of `/proc/PID/maps` is read: a process with tens of thousands of
/// mappings of long paths cannot make discovery allocate more. The interpreter's own files
/// are mapped early, so they are near the start.
pub const MAX_MAPS_BYTES: u64 = 16 << 20;

/// `/proc/PID/maps` (at most `MAX_MAPS_BYTES`; a line cut there does not parse and is
/// dropped). A path that is not UTF-8 keeps its invalid bytes as `\xNN` text, so it
/// names no file under `/proc/PID/root`: such a file is opened through
/// `/proc/PID/map_files` instead (see `files::open_mapped`), found by its inode either way.
pub fn read_maps(pid: u32) -> io::Result<Vec<Mapping>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(proc_path(pid, "maps"))?.take(MAX_MAPS_BYTES).read_to_end(&mut bytes)?;
    Ok(parse_maps(&crate::text::decode(&bytes)))
}

pub fn read_stat(pid: u32) -> io::Result<Stat> {
    let text = read_text(&proc_path(pid, "stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("malformed /proc/{pid}/stat")))
}

/// `/proc/PID/comm` without its newline; invalid UTF-8 (a name cut mid-character) as `\xNN`.
pub fn read_comm(pid: u32) -> io::Result<String> {
    let mut text = read_text(&proc_path(pid, "comm"))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// The thread ids of `pid` (at most `limit` of them), sorted, or `None` if the process is
/// gone.
pub fn task_ids(pid: u32, limit: usize) -> Option<Vec<u32>> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut tids: Vec<u32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).take(limit).collect();
    tids.sort_unstable();
    Some(tids)
}

/// `/proc/PID/task/TID/comm` without its newline, at most 64 bytes read (the kernel keeps
/// 15); invalid UTF-8 as `\xNN`. `None` if the thread is gone or its name is empty.
pub fn read_task_comm(pid: u32, tid: u32) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(64);
    std::fs::File::open(format!("/proc/{pid}/task/{tid}/comm")).ok()?.take(64).read_to_end(&mut bytes).ok()?;
    let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    (!text.is_empty()).then(|| crate::text::decode(text))
}

/// The device and inode of the target's executable, from the kernel's cached attributes
/// (`statx` with `AT_STATX_DONT_SYNC` through the `/proc/PID/exe` magic link: no path is
/// walked and no FUSE or network server is asked), as `/proc/PID/maps` shows them.
pub fn exe_key(pid: u32) -> io::Result<FileKey> {
    let st = rustix::fs::statx(
        rustix::fs::CWD,
        proc_path(pid, "exe"),
        rustix::fs::AtFlags::STATX_DONT_SYNC,
        rustix::fs::StatxFlags::INO,
    )?;
    Ok(FileKey { dev: (st.stx_dev_major, st.stx_dev_minor), inode: st.stx_ino })
}

/// `readlink /proc/PID/exe`, as the target sees it (with ` (deleted)` removed).
pub fn read_exe(pid: u32) -> io::Result<PathBuf> {
    let link = std::fs::read_link(proc_path(pid, "exe"))?;
    let bytes = link.as_os_str().as_bytes();
    let bytes = bytes.strip_suffix(DELETED.as_bytes()).unwrap_or(bytes);
    Ok(PathBuf::from(OsStr::from_bytes(bytes)))
}

pub fn read_thread_count(pid: u32) -> Option<u32> {
    parse_status_threads(&read_text(&proc_path(pid, "status")).ok()?)
}

/// Every numeric entry of `/proc`.
pub fn list_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00401000 r--p 00000000 fd:01 1234567                            /usr/bin/python3.15
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f1c2a000000-7f1c2a100000 r-xp 00025000 08:02 42                         /opt/my app/lib/libpython3.9.so.1.0 (deleted)
7f1c2b000000-7f1c2b001000 rw-p 00000000 00:00 0 
7ffd1b3f0000-7ffd1b3f2000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
garbage line
";

    #[test]
    fn maps_lines() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 6);
        assert_eq!(
            maps[0],
            Mapping {
                start: 0x400000,
                end: 0x401000,
                perms: *b"r--p",
                offset: 0,
                dev: (0xfd, 1),
                inode: 1234567,
                path: "/usr/bin/python3.15".into(),
                deleted: false,
            }
        );
        assert!(maps[0].is_file());
        assert_eq!(maps[1].path, "[heap]");
        assert!(!maps[1].is_file());
        assert_eq!(maps[2].path, "/opt/my app/lib/libpython3.9.so.1.0");
        assert!(maps[2].deleted);
        assert_eq!(maps[2].offset, 0x25000);
        assert_eq!(maps[2].key(), FileKey { dev: (8, 2), inode: 42 });
        assert_eq!(maps[3].path, "");
        assert!(!maps[3].is_file());
        assert_eq!(maps[4].path, "[vdso]");
        assert_eq!(maps[5].end, 0xffffffffff601000);
    }

    #[test]
    fn device_mappings_are_not_files() {
        let m = parse_maps_line("7f0000000000-7f0000001000 rw-s 00000000 00:06 501 /dev/nvidia0").expect("line");
        assert!(!m.is_file());
    }

    #[test]
    fn stat_with_awkward_comm() {
        let line = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 3 0 987654 1000000 500 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 2 0 0 0 0 0";
        assert_eq!(parse_stat(line), Some(Stat { ppid: 17, start_time: 987654, cpu_ticks: 8 }));
        assert_eq!(parse_stat("12 (x) S 1"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn stat_and_maps_that_are_not_utf8() {
        // A process title cut inside a multi-byte character, and a path in Latin-1.
        let stat = b"4242 (caf\xc3\xa9-\xe2\x82) S 17 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 3 0 987654 1000000 500";
        assert_eq!(parse_stat(&crate::text::decode(stat)), Some(Stat { ppid: 17, start_time: 987654, cpu_ticks: 8 }));
        let maps = b"7f1c2a000000-7f1c2a100000 r-xp 00000000 08:02 42 /opt/caf\xe9/libpython3.12.so\n";
        let parsed = parse_maps(&crate::text::decode(maps));
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].path, "/opt/caf\\xe9/libpython3.12.so");
        assert_eq!(parsed[0].inode, 42);
    }

    #[test]
    fn status_threads() {
        assert_eq!(parse_status_threads("Name:\tpython3\nThreads:\t4\nSigQ:\t0/1\n"), Some(4));
        assert_eq!(parse_status_threads("Name:\tx\n"), None);
    }

    #[test]
    fn chroot_paths() {
        let root = Path::new("/srv/jail");
        assert_eq!(target_view(root, "/srv/jail/usr/bin/python3"), "/usr/bin/python3");
        assert_eq!(target_view(root, "/srv/jailbreak/x"), "/srv/jailbreak/x");
        assert_eq!(target_view(root, "/usr/lib/libc.so.6"), "/usr/lib/libc.so.6");
        assert_eq!(target_view(Path::new("/"), "/usr/bin/python3"), "/usr/bin/python3");
    }

    #[test]
    fn root_paths() {
        assert_eq!(in_root(7, "/usr/bin/python3"), PathBuf::from("/proc/7/root/usr/bin/python3"));
        assert_eq!(root_relative("//usr/bin/python3"), "usr/bin/python3");
        assert_eq!(root_relative("/"), ".");
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::config;

    /// Lines near the real shape (fields from plausible and hostile pieces), and any text.
    fn maps_line() -> impl Strategy<Value = String> {
        let hex = prop_oneof!["[0-9a-f]{1,16}", "[0-9a-fA-F]{17,24}", ".{0,4}"];
        let path = prop_oneof!["", "/[^\n]{0,40}", "/[^\n]{0,40} \\(deleted\\)", "\\[[a-z]{0,8}\\]", " {0,3}"];
        prop_oneof![
            (hex.clone(), hex.clone(), "[-rwxps]{0,5}", hex.clone(), hex.clone(), hex, "[0-9]{0,22}", path).prop_map(
                |(start, end, perms, offset, major, minor, inode, path)| {
                    format!("{start}-{end} {perms} {offset} {major}:{minor} {inode}                  {path}")
                }
            ),
            ".{0,200}",
        ]
    }

    fn stat_line() -> impl Strategy<Value = String> {
        prop_oneof![
            ("[0-9]{1,7}", "[^\\n]{0,20}", prop::collection::vec("-?[0-9]{0,21}|[A-Z]", 0..60))
                .prop_map(|(pid, comm, fields)| format!("{pid} ({comm}) {}", fields.join(" "))),
            ".{0,300}",
        ]
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn fuzz_maps_line(line in maps_line()) {
            if let Some(m) = parse_maps_line(&line) {
                prop_assert!(m.path.len() <= line.len());
                let _ = (m.is_file(), m.key(), m.contains(m.start));
            }
            prop_assert!(parse_maps(&line).len() <= line.lines().count());
        }

        #[test]
        fn fuzz_stat_line(line in stat_line()) {
            let _ = parse_stat(&line);
            let _ = parse_status_threads(&line);
        }
    }
}
