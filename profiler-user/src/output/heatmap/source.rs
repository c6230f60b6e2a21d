//! Reading the source files a profile names, for the heatmap's pages.
//!
//! The paths come from the sampled processes (a code object's `co_filename`): any process can
//! name any path, so every read is hostile until checked. Invariants:
//!
//! - A path is resolved inside the root of a process that ran the file (`/proc/PID/root`, so a
//!   container's file is read from the container), with `openat2(RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS)`: symbolic links, in the directories too, never lead out of that
//!   root. A process that has exited since is read from the host's `/` instead (its page
//!   says so): for a process that ran in a container or chroot, that may be another file or
//!   none.
//! - The last component is opened `O_PATH | O_NOFOLLOW` (no filesystem `open` runs, a
//!   symbolic link is refused), `fstat`ed, and only a regular file of at most
//!   [`MAX_FILE_BYTES`] is reopened for reading (`O_NONBLOCK | O_NOCTTY`) and checked again
//!   to be the same file. A FIFO or a device is never opened for reading.
//! - A file is read only when whoever reads the heatmap could have read it anyway, or it is
//!   the process's own: readable by others (mode `o+r`), or owned by the user the process
//!   runs as. A process naming `/etc/shadow` as its source gets no copy of it in a page.
//! - Every file is read on a thread of its own; the writer waits at most [`FILE_DEADLINE`]
//!   for it (a file on a FUSE or network server that does not answer), and at most
//!   [`ALL_DEADLINE`] for all of them. A thread that does not answer is left behind (it ends
//!   if its read ever returns); after [`MAX_HUNG`] such threads no more files are read.
//! - At most [`MAX_TOTAL_BYTES`] are read over all files.
//!
//! A file that is not read gets a [`Source::Unreadable`] with the reason in one line.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

/// Bytes of one source file read at most; a larger file is not shown.
pub const MAX_FILE_BYTES: u64 = 2 << 20;
/// Bytes of source read over all the pages of one heatmap.
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;
/// How long one file's read is waited for.
pub const FILE_DEADLINE: Duration = Duration::from_secs(2);
/// How long all the files' reads are waited for together.
pub const ALL_DEADLINE: Duration = Duration::from_secs(20);
/// Reader threads left blocked after which no further file is read.
pub const MAX_HUNG: usize = 4;

/// One file's text, or why it is not shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The file's text (invalid UTF-8 replaced).
    Text(String),
    /// Why the file was not read, in one line for people.
    Unreadable(String),
}

/// Where the files of a process are looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// `/proc/PID/root` of a process still running.
    Process(u32),
    /// The host's `/` (the process has exited).
    Host,
}

/// Reads source files one after the other under the deadlines and budgets of the module
/// docs. One reader serves one heatmap.
pub struct Reader {
    started: Instant,
    hung: usize,
    bytes_left: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Reader::new()
    }
}

impl Reader {
    pub fn new() -> Reader {
        Reader { started: Instant::now(), hung: 0, bytes_left: MAX_TOTAL_BYTES }
    }

    /// The text of `path` as process `pid` sees it (see the module docs), and where it was
    /// looked for.
    pub fn read(&mut self, pid: u32, path: &str) -> (Source, Root) {
        // Where a refusal before any read says it would have looked.
        let root = Root::Process(pid);
        if !path.starts_with('/') {
            return (Source::Unreadable("the path is not absolute".into()), root);
        }
        if self.hung >= MAX_HUNG {
            return (Source::Unreadable(format!("not read: {MAX_HUNG} earlier files did not answer")), root);
        }
        let left = ALL_DEADLINE.saturating_sub(self.started.elapsed());
        if left.is_zero() {
            return (Source::Unreadable(format!("not read: reading the sources took over {} s", ALL_DEADLINE.as_secs())), root);
        }
        if self.bytes_left == 0 {
            return (Source::Unreadable(format!("not read: {} MiB of sources were read already", MAX_TOTAL_BYTES >> 20)), root);
        }
        let limit = self.bytes_left.min(MAX_FILE_BYTES);
        let (tx, rx) = mpsc::channel();
        let owned = path.to_owned();
        let spawned = std::thread::Builder::new()
            .name("pyperch-source".into())
            .spawn(move || {
                let _ = tx.send(read_file(pid, &owned, limit));
            });
        if let Err(e) = spawned {
            return (Source::Unreadable(format!("no thread to read it: {e}")), root);
        }
        let wait = FILE_DEADLINE.min(left);
        match rx.recv_timeout(wait) {
            Ok((Ok(text), root)) => {
                self.bytes_left = self.bytes_left.saturating_sub(text.len() as u64);
                (Source::Text(text), root)
            }
            Ok((Err(why), root)) => (Source::Unreadable(why), root),
            Err(_) => {
                self.hung += 1;
                (Source::Unreadable(format!("no answer within {:.1} s (a stalled file system?)", wait.as_secs_f64())), root)
            }
        }
    }
}

fn io(e: rustix::io::Errno) -> String {
    std::io::Error::from(e).to_string()
}

/// Opens and reads `path` inside the root of process `pid` (the host's `/` once it has
/// exited), at most `limit` bytes (see the module docs); also says which root that was.
fn read_file(pid: u32, path: &str, limit: u64) -> (Result<String, String>, Root) {
    let dir = |path: &str| rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
    let (root_fd, root) = match dir(&format!("/proc/{pid}/root")) {
        Ok(fd) => (fd, Root::Process(pid)),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::SRCH) => match dir("/") {
            Ok(fd) => (fd, Root::Host),
            Err(e) => return (Err(format!("cannot open /: {}", io(e))), Root::Host),
        },
        Err(e) => return (Err(format!("cannot open the process's root: {}", io(e))), Root::Process(pid)),
    };
    (read_in(&root_fd, root, path, limit), root)
}

/// Reads `path` inside the directory `root_fd` (the root `root`), at most `limit` bytes.
fn read_in(root_fd: &OwnedFd, root: Root, path: &str, limit: u64) -> Result<String, String> {
    let relative = path.trim_start_matches('/');
    let relative = if relative.is_empty() { "." } else { relative };
    let mut attempt = 0;
    let path_fd: OwnedFd = loop {
        match rustix::fs::openat2(
            root_fd,
            relative,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(rustix::io::Errno::AGAIN) if attempt < 3 => attempt += 1,
            Err(e) => return Err(io(e)),
            Ok(fd) => break fd,
        }
    };
    let first = rustix::fs::fstat(&path_fd).map_err(io)?;
    check(&first, root, limit)?;
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", path_fd.as_raw_fd()),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)?;
    let again = rustix::fs::fstat(&fd).map_err(io)?;
    if (again.st_dev, again.st_ino) != (first.st_dev, first.st_ino) {
        return Err("the file was replaced while it was opened".into());
    }
    check(&again, root, limit)?;
    let mut bytes = Vec::new();
    File::from(fd).take(limit + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > limit {
        return Err(format!("larger than {} KiB", limit >> 10));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Whether the file `stat` describes may be read (see the module docs), or why not.
fn check(stat: &rustix::fs::Stat, root: Root, limit: u64) -> Result<(), String> {
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        let what = match kind {
            FileType::Fifo => "a FIFO (named pipe)",
            FileType::Directory => "a directory",
            FileType::Symlink => "a symbolic link",
            FileType::Socket => "a socket",
            FileType::CharacterDevice | FileType::BlockDevice => "a device",
            _ => "not a regular file",
        };
        return Err(format!("it is {what}, not a regular file"));
    }
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > limit {
        return Err(format!("{size} bytes, larger than the {} KiB shown", limit >> 10));
    }
    let others_read = stat.st_mode & 0o004 != 0;
    let owner = match root {
        Root::Process(pid) => std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid()),
        Root::Host => None,
    };
    if !others_read && owner != Some(stat.st_uid) {
        return Err("neither readable by all users nor owned by the process's user".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pyperch-heatmap-source-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn text(dir: &std::path::Path, name: &str) -> Source {
        Reader::new().read(std::process::id(), &dir.join(name).to_string_lossy()).0
    }

    #[test]
    fn reads_regular_files_only() {
        let dir = scratch("kinds");
        std::fs::write(dir.join("a.py"), "x = 1\n").expect("write");
        std::fs::set_permissions(dir.join("a.py"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(text(&dir, "a.py"), Source::Text("x = 1\n".into()));
        let c = std::ffi::CString::new(dir.join("fifo.py").as_os_str().as_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(matches!(text(&dir, "fifo.py"), Source::Unreadable(w) if w.contains("FIFO")));
        std::os::unix::fs::symlink(dir.join("a.py"), dir.join("link.py")).expect("symlink");
        assert!(matches!(text(&dir, "link.py"), Source::Unreadable(_)));
        assert!(matches!(text(&dir, "missing.py"), Source::Unreadable(_)));
        assert!(matches!(text(&dir, ""), Source::Unreadable(w) if w.contains("directory")));
        assert!(matches!(Reader::new().read(1, "relative.py").0, Source::Unreadable(w) if w.contains("absolute")));
        let big = vec![b'#'; (MAX_FILE_BYTES + 1) as usize];
        std::fs::write(dir.join("big.py"), big).expect("write");
        assert!(matches!(text(&dir, "big.py"), Source::Unreadable(w) if w.contains("larger")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A private file of another user is not copied into a page.
    #[test]
    fn private_files_of_others_are_not_read() {
        let dir = scratch("private");
        let path = dir.join("secret.py");
        std::fs::write(&path, "secret\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path; uid 65534 is nobody.
        let chowned = unsafe { libc::chown(c.as_ptr(), 65534, 65534) } == 0;
        if chowned {
            assert!(matches!(text(&dir, "secret.py"), Source::Unreadable(w) if w.contains("owned")));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
