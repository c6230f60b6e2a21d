//! Writing the `--output` file so that a recording never leaves a half-written or clobbered
//! file behind.
//!
//! Invariants:
//! - [`check`] runs before sampling and touches nothing at the path: it creates (and at once
//!   removes) a temporary file in the output's folder, so an unwritable folder is an error
//!   before any sampling, while an existing file stays as it is.
//! - [`write`] writes the whole profile to a new temporary file in the same folder
//!   (`.<name>.<pid>.<n>.pyperch-tmp`, created with `O_EXCL`, so never through a symlink),
//!   flushes it to disk, and renames it over the path. Until that rename the path is
//!   untouched; if anything fails, the temporary file is removed and the path still holds
//!   what it held before (or nothing).
//! - A symbolic link at the path is refused (by both [`check`] and [`write`]): pyperch runs
//!   as root and never writes through a link. Should one appear between the check and the
//!   rename, the rename replaces the link itself, never the file it points to.
//! - A new file gets mode 0666 minus the umask (0644 with the usual umask 022), as `>` in a
//!   shell would; a file that is replaced keeps its permission bits (not its owner: the new
//!   file belongs to the user running pyperch, root under sudo). A private output
//!   ([`write_private`]: a whole-host recording, which holds every process's code) is 0600
//!   minus the umask, and a replaced file keeps only its owner's bits of its mode.
//! - A character device at the path (such as `/dev/null`; only root can create one) is written
//!   in place: it cannot be replaced by renaming. A FIFO, socket or block device is refused
//!   by [`check`] before sampling: anyone can create a FIFO in a shared folder, and opening
//!   or writing one whose reader never reads would block the final write forever.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Temporary names tried before giving up (another pyperch with the same pid left files).
const TEMP_ATTEMPTS: u32 = 100;
/// Bytes of the output's file name kept in the temporary name (NAME_MAX is 255).
const NAME_BYTES_IN_TEMP: usize = 200;
/// Suffix of every temporary file.
pub const TEMP_SUFFIX: &str = ".pyperch-tmp";

/// Why the output cannot be written, or what the writer failed with.
#[derive(Debug, thiserror::Error)]
pub enum OutputFileError<E: std::error::Error + 'static> {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Content(E),
}

/// What is at the output path now.
enum Existing {
    Nothing,
    /// A regular file with these permission bits.
    File(u32),
    /// A character device: written in place.
    Special,
}

fn existing(path: &Path) -> io::Result<Existing> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(e) => return Err(e),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(io::Error::other(
            "it is a symbolic link, which pyperch does not follow; name the file it points to instead (or - for standard output)",
        ));
    }
    if kind.is_dir() {
        return Err(io::Error::other("it is a directory"));
    }
    if kind.is_file() {
        return Ok(Existing::File(meta.permissions().mode() & 0o777));
    }
    if kind.is_char_device() {
        return Ok(Existing::Special);
    }
    let what = if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    };
    Err(io::Error::other(format!(
        "it is {what}, whose final write could block forever; name a regular file (or - for standard output)"
    )))
}

/// Checks, before sampling, that a profile can later be written to `path`, without touching
/// what is there (see the module docs).
pub fn check(path: &Path) -> io::Result<()> {
    match existing(path)? {
        Existing::Special => Ok(()),
        Existing::Nothing | Existing::File(_) => TempFile::create(path).map(drop),
    }
}

/// Writes `path` through a temporary file renamed over it at the end (see the module docs).
/// `fill` writes the contents; if it or anything else fails, `path` is left unchanged.
pub fn write<E: std::error::Error + 'static>(
    path: &Path,
    fill: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(), OutputFileError<E>> {
    write_with(path, false, fill)
}

/// [`write`], readable by its owner only (mode 0600; see the module docs).
pub fn write_private<E: std::error::Error + 'static>(
    path: &Path,
    fill: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(), OutputFileError<E>> {
    write_with(path, true, fill)
}

fn write_with<E: std::error::Error + 'static>(
    path: &Path,
    private: bool,
    fill: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(), OutputFileError<E>> {
    let mode = match existing(path)? {
        Existing::Special => {
            let mut file = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
            return fill(&mut file).map_err(OutputFileError::Content);
        }
        Existing::Nothing => None,
        Existing::File(mode) => Some(mode),
    };
    let mut temp = TempFile::create(path)?;
    let mode = match (mode, private) {
        (Some(mode), true) => Some(mode & 0o600),
        (None, true) => Some(0o600),
        (mode, false) => mode,
    };
    if let Some(mode) = mode {
        temp.file.set_permissions(fs::Permissions::from_mode(mode))?;
    }
    fill(&mut temp.file).map_err(OutputFileError::Content)?;
    temp.file.sync_all()?;
    fs::rename(&temp.path, path)?;
    temp.renamed = true;
    // The rename itself reaches the disk with the folder.
    if let Ok(dir) = File::open(folder(path)) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// The folder `path` is in (`.` for a bare file name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A temporary file next to the output; removed on drop unless renamed.
struct TempFile {
    path: PathBuf,
    file: File,
    renamed: bool,
}

impl TempFile {
    fn create(target: &Path) -> io::Result<TempFile> {
        let Some(name) = target.file_name() else {
            return Err(io::Error::other("it does not name a file"));
        };
        let name = name.as_bytes();
        let name = String::from_utf8_lossy(&name[..name.len().min(NAME_BYTES_IN_TEMP)]).into_owned();
        let pid = std::process::id();
        let mut last = None;
        for n in 0..TEMP_ATTEMPTS {
            let path = folder(target).join(format!(".{name}.{pid}.{n}{TEMP_SUFFIX}"));
            // create_new is O_CREAT|O_EXCL: it fails on any existing name, a symlink included.
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path);
            match opened {
                Ok(file) => return Ok(TempFile { path, file, renamed: false }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary file name")))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pyperch-output-file-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_only_on_success() {
        let dir = scratch("replace");
        let out = dir.join("p.txt");
        fs::write(&out, "old").expect("write");
        fs::set_permissions(&out, fs::Permissions::from_mode(0o600)).expect("chmod");
        check(&out).expect("check");
        assert_eq!(fs::read_to_string(&out).expect("read"), "old");
        let failed = write(&out, |f| {
            f.write_all(b"half").expect("write");
            Err(io::Error::other("boom"))
        });
        assert!(matches!(failed, Err(OutputFileError::Content(_))));
        assert_eq!(fs::read_to_string(&out).expect("read"), "old");
        assert_eq!(names(&dir), ["p.txt"]);
        write(&out, |f| f.write_all(b"new")).expect("write");
        assert_eq!(fs::read_to_string(&out).expect("read"), "new");
        assert_eq!(fs::metadata(&out).expect("meta").permissions().mode() & 0o777, 0o600);
        assert_eq!(names(&dir), ["p.txt"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn private_outputs_are_for_their_owner_only() {
        let dir = scratch("private");
        let out = dir.join("host.pb.gz");
        write_private(&out, |f| f.write_all(b"new")).expect("write");
        assert_eq!(fs::metadata(&out).expect("meta").permissions().mode() & 0o777, 0o600);
        // A file replaced keeps no bits for group or others.
        fs::set_permissions(&out, fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private(&out, |f| f.write_all(b"again")).expect("write");
        assert_eq!(fs::metadata(&out).expect("meta").permissions().mode() & 0o777, 0o600);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn refuses_links_and_folders() {
        let dir = scratch("links");
        let victim = dir.join("victim");
        fs::write(&victim, "keep").expect("write");
        let link = dir.join("link.svg");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        assert!(check(&link).is_err());
        assert!(write(&link, |f| f.write_all(b"x")).is_err());
        assert!(check(&dir).is_err());
        assert!(check(&dir.join("missing").join("p.svg")).is_err());
        assert_eq!(fs::read_to_string(&victim).expect("read"), "keep");
        assert_eq!(names(&dir), ["link.svg", "victim"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn devices_are_written_in_place() {
        check(Path::new("/dev/null")).expect("check");
        write(Path::new("/dev/null"), |f| f.write_all(b"x")).expect("write");
        assert!(fs::symlink_metadata("/dev/null").expect("meta").file_type().is_char_device());
    }

    /// Issue #28 item 9: a FIFO at the output (anyone can make one in /tmp) is refused before
    /// sampling instead of blocking the final write.
    #[test]
    fn refuses_fifo() {
        let dir = scratch("fifo");
        let fifo = dir.join("p.svg");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = check(&fifo).expect_err("a FIFO is refused");
        assert!(err.to_string().contains("FIFO"), "{err}");
        assert!(write(&fifo, |f| f.write_all(b"x")).is_err());
    }
}
