//! Where a container's own runtime keeps the container's OCI runtime spec (`config.json`),
//! found from the process that runs the container rather than from a fixed path, so that a
//! node whose runtime keeps its state anywhere (kubeadm, k3s, RKE2, microk8s, docker's
//! embedded containerd, CRI-O with its own `root`/`runroot`) is covered.
//!
//! The container's first ancestor in pyperch's (the host's) PID namespace is its runtime's
//! monitor process, outside the container's cgroup; which runtime it is comes from the name
//! of its executable ([`MONITORS`]):
//!
//! | monitor | runtime | the container's `config.json` |
//! |---|---|---|
//! | `containerd-shim*` | containerd | the shim's working directory is a bundle directory `<state>/io.containerd.runtime.v2.task/<namespace>/<id'>` (one shim can run all of a pod's containers: `<id'>` may be another's); the container's own file is the sibling `<id>/config.json` |
//! | `conmon` | CRI-O | `<bundle>/config.json`, the bundle being the directory named by conmon's `-b`/`--bundle`, else its working directory; it must be CRI-O's `<runroot>/<driver>-containers/<id>/userdata` for this very container |
//!
//! What CRI-O and conmon do (cri-o/cri-o `internal/oci/runtime_oci.go` `CreateContainer` and
//! `server/container_create.go`, containers/storage `store.go`, containers/conmon
//! `src/cli.c`):
//! - CRI-O starts one conmon per container, with the arguments `-b <bundle> -c <id>
//!   --exit-dir <dir> -l <log path> --log-level <level> -n <name> -P <bundle>/conmon-pidfile
//!   -p <bundle>/pidfile --persist-dir <dir> -r <runtime> --runtime-arg --root=<runtime root>
//!   --socket-dir-path <dir> --syslog -u <id>` (`-s` with the systemd cgroup manager) and
//!   the bundle as its working directory; conmon forks, its child runs the OCI runtime's
//!   `create` and stays the container's parent (a subreaper) until it exits. Its cgroup is
//!   `crio-conmon-<id>` beside the container's (or `system.slice`), never the container's.
//! - The bundle is the container's run directory in containers/storage,
//!   `<runroot>/<driver>-containers/<id>/userdata` (`/run/containers/storage/overlay-containers/<id>/userdata`
//!   by default; `runroot` in crio.conf moves it). CRI-O writes the same `config.json` there
//!   and into the persistent `<root>/<driver>-containers/<id>/userdata` (`--persist-dir`).
//! - conmon parses its options with GLib's GOption: `--long value`, `--long=value`,
//!   `-x value`, flags grouped behind one dash, `--` ends the options, an unknown option
//!   makes it exit; without `-b` its bundle is its working directory; an exec session's
//!   conmon (`-e`/`--exec`) has no bundle.
//!
//! Invariants:
//! - a monitor inside the container's cgroup (a process of the container itself, sharing the
//!   host's PID namespace) is never taken for the runtime's;
//! - the path given is absolute inside the monitor's root (`/proc/<monitor>/root`), where the
//!   caller opens it (`openat2` with `RESOLVE_IN_ROOT`: no link leads out of it);
//! - conmon's command line is read at most [`MAX_CMDLINE_BYTES`] (a longer one is refused);
//! - a conmon bundle that is not an absolute path of plain components (a `.`, `..` or empty
//!   component could lead elsewhere than it says), that is not CRI-O's layout for this very
//!   container, or a conmon whose `--cid` names another container, is refused ([`Refused`])
//!   and nothing is read.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::host::containers::ContainerInfo;

/// Ancestors of a container's process looked at for its runtime's monitor.
const MAX_ANCESTORS: usize = 32;
/// CRI-O's conmon command line is under 2 KiB (a few 64-hex-digit paths); a longer one is not
/// read.
pub const MAX_CMDLINE_BYTES: u64 = 32 << 10;
/// The longest bundle path accepted (Linux's `PATH_MAX`).
const MAX_BUNDLE_BYTES: usize = 4096;

/// Why a monitor's bundle was refused (counted by the caller with the other refusals).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("conmon {pid}: command line longer than {MAX_CMDLINE_BYTES} bytes")]
    CommandLineTooLong { pid: u32 },
    #[error("conmon {pid}: runs container {cid:?}, not {id}")]
    OtherContainer { pid: u32, cid: String, id: String },
    #[error("conmon {pid}: bundle {bundle:?} is not an absolute path of plain components")]
    NotPlainPath { pid: u32, bundle: String },
    #[error("conmon {pid}: bundle {bundle:?} is not CRI-O's <runroot>/<driver>-containers/{id}/userdata")]
    NotCrioLayout { pid: u32, bundle: String, id: String },
}

/// How a monitor's executable is recognised, and where it says the container's spec is.
struct Monitor {
    /// The executable's file name, or its start when `prefix`.
    exe: &'static str,
    prefix: bool,
    /// The absolute path of container `id`'s `config.json` in monitor `pid`'s root, `None`
    /// when the monitor gives none (not a bundle directory, an exec session).
    config: fn(pid: u32, id: &str) -> Result<Option<PathBuf>, Refused>,
}

/// The monitors known, by executable name (see the module docs).
const MONITORS: [Monitor; 2] = [
    Monitor { exe: "containerd-shim", prefix: true, config: containerd_config },
    Monitor { exe: "conmon", prefix: false, config: conmon_config },
];

/// Where container `id`'s (of `info`) own runtime keeps its `config.json`: the monitor's root
/// (`/proc/<monitor>/root`) and the file's path relative to it. `Ok(None)` when the first
/// ancestor in pyperch's PID namespace is not a known monitor outside the container's
/// cgroup, or gives no bundle.
pub fn locate(info: &ContainerInfo, id: &str) -> Result<Option<(PathBuf, String)>, Refused> {
    let Some(pid) = monitor_pid(info) else { return Ok(None) };
    let Some(monitor) = monitor_of(pid) else { return Ok(None) };
    let cgroup = crate::host::containers::for_process(pid).cgroup_path;
    let container = info.cgroup_path.as_str();
    if container.is_empty() || cgroup.is_empty() || cgroup == container || cgroup.starts_with(&format!("{container}/")) {
        return Ok(None);
    }
    let Some(path) = (monitor.config)(pid, id)? else { return Ok(None) };
    let Some(relative) = path.to_str().map(|p| p.trim_start_matches('/').to_owned()) else { return Ok(None) };
    Ok(Some((PathBuf::from(format!("/proc/{pid}/root")), relative)))
}

/// The first ancestor of the container's process in pyperch's PID namespace (not PID 1).
fn monitor_pid(info: &ContainerInfo) -> Option<u32> {
    let own_ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let mut current = *info.nspid.first()?;
    for _ in 0..MAX_ANCESTORS {
        current = crate::target::discovery::parent_pid(current).filter(|p| *p > 1)?;
        if std::fs::read_link(format!("/proc/{current}/ns/pid")).ok()? == own_ns {
            return Some(current);
        }
    }
    None
}

/// The known monitor `pid` runs, by its executable's name (an executable replaced on disk
/// since reads `<path> (deleted)`).
fn monitor_of(pid: u32) -> Option<&'static Monitor> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let name = exe.file_name()?.to_str()?;
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    MONITORS.iter().find(|m| if m.prefix { name.starts_with(m.exe) } else { name == m.exe })
}

/// containerd's shim: its working directory is a bundle directory of its state directory.
fn containerd_config(pid: u32, id: &str) -> Result<Option<PathBuf>, Refused> {
    let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else { return Ok(None) };
    let Some(namespace_dir) = cwd.parent() else { return Ok(None) };
    let tasks = namespace_dir.parent().and_then(Path::file_name);
    if !cwd.is_absolute() || tasks != Some(OsStr::new("io.containerd.runtime.v2.task")) {
        return Ok(None);
    }
    Ok(Some(namespace_dir.join(id).join("config.json")))
}

/// conmon: its bundle from its command line, else its working directory (see the module
/// docs).
fn conmon_config(pid: u32, id: &str) -> Result<Option<PathBuf>, Refused> {
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/cmdline")) else { return Ok(None) };
    let mut cmdline = Vec::new();
    if file.take(MAX_CMDLINE_BYTES + 1).read_to_end(&mut cmdline).is_err() {
        return Ok(None);
    }
    if cmdline.len() as u64 > MAX_CMDLINE_BYTES {
        return Err(Refused::CommandLineTooLong { pid });
    }
    let args = ConmonArgs::parse(&cmdline);
    if args.exec {
        return Ok(None);
    }
    if let Some(cid) = args.cid
        && cid != id.as_bytes()
    {
        return Err(Refused::OtherContainer { pid, cid: String::from_utf8_lossy(cid).into_owned(), id: id.to_owned() });
    }
    let bundle = match args.bundle {
        Some(b) => PathBuf::from(OsStr::from_bytes(b)),
        None => match std::fs::read_link(format!("/proc/{pid}/cwd")) {
            Ok(cwd) => cwd,
            Err(_) => return Ok(None),
        },
    };
    crio_bundle(pid, &bundle, id).map(|b| Some(b.join("config.json")))
}

/// `bundle` if it is CRI-O's bundle directory of container `id`
/// (`<runroot>/<driver>-containers/<id>/userdata`, absolute, plain components; one trailing
/// `/` allowed).
fn crio_bundle(pid: u32, bundle: &Path, id: &str) -> Result<PathBuf, Refused> {
    let bytes = bundle.as_os_str().as_bytes();
    let shown = || String::from_utf8_lossy(bytes).into_owned();
    let trimmed = bytes.strip_suffix(b"/").unwrap_or(bytes);
    let plain = bytes.len() <= MAX_BUNDLE_BYTES
        && trimmed.first() == Some(&b'/')
        && trimmed[1..].split(|b| *b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..");
    if !plain {
        return Err(Refused::NotPlainPath { pid, bundle: shown() });
    }
    let mut components = trimmed[1..].rsplit(|b| *b == b'/');
    let (userdata, container, store) = (components.next(), components.next(), components.next());
    let driver = store.and_then(|s| s.strip_suffix(b"-containers"));
    let is_driver = driver.is_some_and(|d| !d.is_empty() && d.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
    if userdata != Some(b"userdata") || container != Some(id.as_bytes()) || !is_driver {
        return Err(Refused::NotCrioLayout { pid, bundle: shown(), id: id.to_owned() });
    }
    Ok(PathBuf::from(OsStr::from_bytes(trimmed)))
}

/// conmon's options that take a value (containers/conmon `src/cli.c`: every `G_OPTION_ARG_STRING`,
/// `_STRING_ARRAY`, `_INT` and `_INT64` entry): long names, and the short letters.
const CONMON_VALUE_LONG: [&str; 29] = [
    "bundle", "cid", "conmon-pidfile", "container-pidfile", "cuuid", "exec-process-spec", "exit-command",
    "exit-command-arg", "exit-delay", "exit-dir", "log-level", "log-path", "log-size-max", "log-global-size-max",
    "log-tag", "log-label", "name", "persist-dir", "pidfile", "restore", "restore-arg", "runtime", "runtime-arg",
    "runtime-opt", "sdnotify-socket", "socket-dir-path", "timeout", "log-max-files", "log-allowlist-dir",
];
const CONMON_VALUE_SHORT: &[u8] = b"bcPpulnr0T";

/// What pyperch needs of a conmon command line (NUL-separated, as `/proc/<pid>/cmdline`).
#[derive(Debug, Default, PartialEq, Eq)]
struct ConmonArgs<'a> {
    bundle: Option<&'a [u8]>,
    cid: Option<&'a [u8]>,
    exec: bool,
}

impl<'a> ConmonArgs<'a> {
    /// GOption's rules (see the module docs); the last value of an option wins. An option
    /// this table does not know (of a newer conmon) is taken for a flag.
    fn parse(cmdline: &'a [u8]) -> Self {
        let mut args = ConmonArgs::default();
        let mut words = cmdline.strip_suffix(b"\0").unwrap_or(cmdline).split(|b| *b == 0).skip(1);
        while let Some(word) = words.next() {
            if word == b"--" {
                break;
            }
            if let Some(long) = word.strip_prefix(b"--") {
                let (name, inline) = match long.iter().position(|b| *b == b'=') {
                    Some(at) => (&long[..at], Some(&long[at + 1..])),
                    None => (long, None),
                };
                let takes_value = CONMON_VALUE_LONG.iter().any(|n| n.as_bytes() == name);
                let value = if takes_value { inline.or_else(|| words.next()) } else { None };
                args.set(name, value);
            } else if let Some(shorts) = word.strip_prefix(b"-").filter(|s| !s.is_empty()) {
                // Grouped letters: each that takes a value takes the next word.
                for letter in shorts {
                    let value = if CONMON_VALUE_SHORT.contains(letter) { words.next() } else { None };
                    let name: &[u8] = match letter {
                        b'b' => b"bundle",
                        b'c' => b"cid",
                        b'e' => b"exec",
                        _ => b"",
                    };
                    args.set(name, value);
                }
            }
        }
        args
    }

    fn set(&mut self, name: &[u8], value: Option<&'a [u8]>) {
        match name {
            b"bundle" => self.bundle = value.or(self.bundle),
            b"cid" => self.cid = value.or(self.cid),
            b"exec" => self.exec = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    /// A NUL-separated command line, as `/proc/<pid>/cmdline` holds it.
    fn cmdline(words: &[&str]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for w in words {
            bytes.extend_from_slice(w.as_bytes());
            bytes.push(0);
        }
        bytes
    }

    /// The arguments CRI-O gives conmon (internal/oci/runtime_oci.go), with a custom runroot.
    fn crio_words(bundle: &str, id: &str) -> Vec<String> {
        let persist = bundle.replace("/run/custom", "/var/lib/custom");
        [
            "/usr/bin/conmon", "-b", bundle, "-c", id, "--exit-dir", "/var/run/crio/exits",
            "-l", "/var/log/pods/shop_web-0_1234/web/0.log", "--log-level", "info",
            "-n", "k8s_web_web-0_shop_1234_0", "-P", &format!("{bundle}/conmon-pidfile"),
            "-p", &format!("{bundle}/pidfile"), "--persist-dir", &persist, "-r", "/usr/bin/crun",
            "--runtime-arg", "--root=/run/crun", "--socket-dir-path", "/var/run/crio", "--syslog",
            "-u", id, "-s", "--log-size-max", "-1",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn parse(words: &[String]) -> (Option<String>, Option<String>, bool) {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let bytes = cmdline(&words);
        let a = ConmonArgs::parse(&bytes);
        let s = |v: Option<&[u8]>| v.map(|v| String::from_utf8_lossy(v).into_owned());
        (s(a.bundle), s(a.cid), a.exec)
    }

    #[test]
    fn crio_command_line() {
        let bundle = format!("/run/custom-containers/storage/overlay-containers/{ID}/userdata");
        let (b, c, exec) = parse(&crio_words(&bundle, ID));
        assert_eq!(b.as_deref(), Some(bundle.as_str()));
        assert_eq!(c.as_deref(), Some(ID));
        assert!(!exec);
    }

    #[test]
    fn goption_forms() {
        let w = |ws: &[&str]| ws.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // --long=value and --long value.
        assert_eq!(parse(&w(&["conmon", "--bundle=/a/b", "--cid", "x"])).0.as_deref(), Some("/a/b"));
        assert_eq!(parse(&w(&["conmon", "--bundle", "/a/b"])).0.as_deref(), Some("/a/b"));
        // The last value wins.
        assert_eq!(parse(&w(&["conmon", "-b", "/a", "-b", "/c"])).0.as_deref(), Some("/c"));
        // A value that looks like an option is the value, not the option.
        assert_eq!(parse(&w(&["conmon", "-n", "-b", "-l", "/log"])).0, None);
        assert_eq!(parse(&w(&["conmon", "--log-tag", "--bundle=/x"])).0, None);
        // After `--`, nothing is an option.
        assert_eq!(parse(&w(&["conmon", "--", "-b", "/a"])).0, None);
        // Grouped flags, and a grouped letter that takes a value takes the next word.
        assert_eq!(parse(&w(&["conmon", "-ti", "-b", "/a"])).0.as_deref(), Some("/a"));
        assert_eq!(parse(&w(&["conmon", "-sb", "/a", "-c", "x"])).0.as_deref(), Some("/a"));
        // An exec session's conmon.
        assert!(parse(&w(&["conmon", "-c", "x", "-e", "--exec-process-spec", "/p"])).2);
        assert!(parse(&w(&["conmon", "--exec"])).2);
        // No arguments, a missing value, junk: nothing, never a panic.
        assert_eq!(parse(&w(&["conmon"])), (None, None, false));
        assert_eq!(parse(&w(&["conmon", "-b"])).0, None);
        assert_eq!(ConmonArgs::parse(b""), ConmonArgs::default());
        assert_eq!(ConmonArgs::parse(b"\xff\0-\0--\0---\0-b"), ConmonArgs::default());
    }

    #[test]
    fn crio_layouts_and_refusals() {
        for root in ["/run/containers/storage", "/run/custom-containers/storage", "/var/lib/containers/storage", "/tmp/x/node/run/c"] {
            for driver in ["overlay", "vfs", "btrfs", "zfs"] {
                let bundle = format!("{root}/{driver}-containers/{ID}/userdata");
                assert_eq!(crio_bundle(1, Path::new(&bundle), ID).expect(&bundle), PathBuf::from(&bundle));
                assert_eq!(crio_bundle(1, Path::new(&format!("{bundle}/")), ID).expect(&bundle), PathBuf::from(&bundle));
            }
        }
        let other = "0000000000000000000000000000000000000000000000000000000000000abc";
        for bundle in [
            format!("/run/containers/storage/overlay-containers/{other}/userdata"),
            format!("/run/containers/storage/overlay-containers/{ID}"),
            format!("/run/containers/storage/overlay/{ID}/userdata"),
            format!("/run/containers/storage/-containers/{ID}/userdata"),
            format!("/run/containers/storage/Overlay-containers/{ID}/userdata"),
            format!("/run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}"),
            format!("/{ID}/userdata"),
        ] {
            assert!(matches!(crio_bundle(1, Path::new(&bundle), ID), Err(Refused::NotCrioLayout { .. })), "{bundle}");
        }
        for bundle in [
            format!("run/containers/storage/overlay-containers/{ID}/userdata"),
            format!("/run/containers/storage/../../etc/overlay-containers/{ID}/userdata"),
            format!("/run/containers/storage/./overlay-containers/{ID}/userdata"),
            format!("/run/containers//storage/overlay-containers/{ID}/userdata"),
            format!("/run/containers/storage/overlay-containers/{ID}/userdata//"),
            format!("/{}/overlay-containers/{ID}/userdata", "a".repeat(MAX_BUNDLE_BYTES)),
            "/".to_string(),
            String::new(),
        ] {
            assert!(matches!(crio_bundle(1, Path::new(&bundle), ID), Err(Refused::NotPlainPath { .. })), "{bundle}");
        }
    }

    #[test]
    fn no_monitor_no_bundle() {
        // This test's own ancestors hold no runtime monitor: no answer, whatever the id.
        let own = crate::host::containers::for_process(std::process::id());
        assert!(matches!(locate(&own, ID), Ok(None)));
        // No pid: no walk.
        assert!(matches!(locate(&ContainerInfo::default(), ID), Ok(None)));
    }
}
