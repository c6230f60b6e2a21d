//! Kubernetes names (namespace, pod, container) of a container, read from the OCI bundle
//! its runtime keeps on the node, without the Kubernetes API.
//!
//! containerd's CRI plugin and CRI-O write the pod's and container's names into the
//! `annotations` of every container's OCI runtime spec (`config.json`):
//!
//! | runtime | found from | fixed place (relative to the host's root) | keys |
//! |---|---|---|---|
//! | containerd | its shim (`containerd-shim*`): the sibling `<id>/config.json` of the shim's working directory, `<state>/io.containerd.runtime.v2.task/<namespace>/<id'>`, whatever the state directory (kubeadm's `/run/containerd`, k3s's and RKE2's `/run/k3s/containerd`, microk8s's, docker's embedded containerd's) | `run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json` | `io.kubernetes.cri.sandbox-namespace`, `io.kubernetes.cri.sandbox-name`, `io.kubernetes.cri.container-name`, `io.kubernetes.cri.sandbox-uid` |
//! | CRI-O | its monitor (`conmon`): `<bundle>/config.json`, the bundle named by conmon's `-b`/`--bundle` (else its working directory), which must be CRI-O's `<runroot>/<driver>-containers/<id>/userdata` whatever its `runroot` | `run/containers/storage/overlay-containers/<id>/userdata/config.json` (its run dir) or the same under `var/lib/containers/storage` | `io.kubernetes.pod.namespace`, `io.kubernetes.pod.name`, `io.kubernetes.container.name`, `io.kubernetes.pod.uid` (the kubelet's labels, which CRI-O copies into the annotations) |
//!
//! The bundle is first looked for where the container's own runtime keeps it
//! ([`crate::host::runtime_bundle`]): the container's first ancestor in pyperch's (the
//! host's) PID namespace is its runtime's monitor (outside the container's cgroup), and the
//! file is opened inside the monitor's root (`/proc/<monitor>/root`); a conmon bundle that is
//! not an absolute plain path, or not CRI-O's layout for this container, is refused and
//! counted. Then at the fixed places above, inside the host's root.
//!
//! The host's root is reached as `/proc/1/root` (the agent shares the host's PID namespace),
//! or as the directory the environment variable `PYPERCH_HOST_ROOT` names (for hosts whose
//! PID 1 is not the node's init).
//! Invariants, the same as for every file a target can influence:
//! - a bundle file is opened inside its root only (the monitor's or the host's; `openat2` with `RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS`, `O_NOFOLLOW` on the last component): no link leads out of it;
//! - it is first opened `O_PATH` and checked to be a regular file (no FIFO or device is ever
//!   opened for reading), then reopened `O_RDONLY | O_NONBLOCK` and checked to be the same
//!   file; at most [`MAX_CONFIG_BYTES`] are read, a longer file is refused;
//! - names are accepted only when they are Kubernetes names (DNS labels, pod names DNS
//!   subdomains) and only when the cgroup path and the annotations both give a pod UID and
//!   they agree (a missing UID on either side is refused and counted, like a mismatch): a
//!   wrong name is never shown, a missing one only leaves the ids;
//! - results are cached per container id; a found entry is forgotten once its bundle file is
//!   gone (the container was deleted), a miss is retried after [`MISS_RETRY`], and at most
//!   [`MAX_ENTRIES`] entries are kept.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};

use crate::host::containers::{CONTAINER_ID_LEN, ContainerInfo};

/// Where the host's root directory is seen from the agent (which shares the host's PID
/// namespace, as the DaemonSet runs it; on the host itself this is `/`).
pub const HOST_ROOT: &str = "/proc/1/root";
/// The environment variable that overrides [`HOST_ROOT`].
pub const HOST_ROOT_ENV: &str = "PYPERCH_HOST_ROOT";
/// A runtime spec is a few tens of KiB; a longer file is not read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// A container whose bundle had no usable annotations is looked at again after this long.
pub const MISS_RETRY: Duration = Duration::from_secs(30);
/// How often cached entries are checked for containers that are gone.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// Entries kept at most; past that the least recently checked is dropped.
pub const MAX_ENTRIES: usize = 4096;
/// `openat2` with `RESOLVE_IN_ROOT` fails with `EAGAIN` when a rename raced it.
const RESOLVE_RETRIES: usize = 3;

/// The annotation keys of one runtime.
struct Keys {
    namespace: &'static str,
    pod: &'static str,
    container: &'static str,
    pod_uid: &'static str,
}

/// containerd's CRI plugin.
const CONTAINERD_KEYS: Keys = Keys {
    namespace: "io.kubernetes.cri.sandbox-namespace",
    pod: "io.kubernetes.cri.sandbox-name",
    container: "io.kubernetes.cri.container-name",
    pod_uid: "io.kubernetes.cri.sandbox-uid",
};

/// CRI-O (the kubelet's own label names).
const CRIO_KEYS: Keys = Keys {
    namespace: "io.kubernetes.pod.namespace",
    pod: "io.kubernetes.pod.name",
    container: "io.kubernetes.container.name",
    pod_uid: "io.kubernetes.pod.uid",
};

/// Where each runtime keeps a container's `config.json`, relative to the host's root:
/// `(prefix, suffix)` around the container id.
const BUNDLES: [(&str, &str); 3] = [
    ("run/containerd/io.containerd.runtime.v2.task/k8s.io/", "/config.json"),
    ("run/containers/storage/overlay-containers/", "/userdata/config.json"),
    ("var/lib/containers/storage/overlay-containers/", "/userdata/config.json"),
];

/// The Kubernetes names of one container.
///
/// Invariant: `namespace` and `container` are DNS labels (1-63 of `[a-z0-9-]`), `pod` a DNS
/// subdomain (1-253 of `[a-z0-9.-]`), as the API server enforces for these names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNames {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl PodNames {
    /// `namespace/pod`, as `kubectl` and frames name a pod.
    pub fn pod_path(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }

    /// The agent's default `service_name` for the container: `namespace/container` (what
    /// Grafana Alloy's eBPF profiler sets).
    pub fn service_name(&self) -> String {
        format!("{}/{}", self.namespace, self.container)
    }
}

/// Why a bundle gave no names.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("no bundle file of a known runtime")]
    NotFound,
    #[error("{0}: not a regular file")]
    NotRegular(String),
    #[error("{0}: longer than {MAX_CONFIG_BYTES} bytes")]
    TooLarge(String),
    #[error("{0}: not a JSON runtime spec: {1}")]
    NotJson(String, serde_json::Error),
    #[error("{0}: no Kubernetes annotations")]
    NoAnnotations(String),
    #[error("{0}: an annotation is not a valid Kubernetes name")]
    InvalidName(String),
    #[error("{path}: the annotations name pod {annotated}, the cgroup pod {cgroup}")]
    PodMismatch { path: String, annotated: String, cgroup: String },
    #[error("{0}: {1}")]
    Io(String, io::Error),
    #[error(transparent)]
    Refused(#[from] crate::host::runtime_bundle::Refused),
}

/// The `annotations` of a runtime spec; everything else in it is ignored.
#[derive(serde::Deserialize)]
struct Spec {
    #[serde(default)]
    annotations: HashMap<String, serde_json::Value>,
}

/// The names in a runtime spec's annotations (containerd's keys first, then CRI-O's), and
/// the pod UID they give, if any. `Ok(None)`: no Kubernetes annotations.
pub fn parse_spec(path: &str, json: &[u8]) -> Result<Option<(PodNames, Option<String>)>, BundleError> {
    let spec: Spec = serde_json::from_slice(json).map_err(|e| BundleError::NotJson(path.to_owned(), e))?;
    let get = |key: &str| spec.annotations.get(key).and_then(|v| v.as_str());
    for keys in [&CONTAINERD_KEYS, &CRIO_KEYS] {
        let (Some(namespace), Some(pod), Some(container)) = (get(keys.namespace), get(keys.pod), get(keys.container))
        else {
            continue;
        };
        if !is_dns_label(namespace) || !is_dns_subdomain(pod) || !is_dns_label(container) {
            return Err(BundleError::InvalidName(path.to_owned()));
        }
        let names = PodNames { namespace: namespace.to_owned(), pod: pod.to_owned(), container: container.to_owned() };
        let uid = get(keys.pod_uid).filter(|u| !u.is_empty()).map(|u| u.to_ascii_lowercase().replace('_', "-"));
        return Ok(Some((names, uid)));
    }
    Ok(None)
}

/// A DNS-1123 label: 1-63 lowercase letters, digits and `-`, starting and ending
/// alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: 1-253 characters, dot-separated DNS labels.
pub fn is_dns_subdomain(s: &str) -> bool {
    (1..=253).contains(&s.len()) && s.split('.').all(is_dns_label)
}

/// What the cache knows of one container.
struct Entry {
    /// The names, or `None` for a miss.
    names: Option<Arc<PodNames>>,
    /// The annotations' pod UID, compared with the cgroup's at every lookup.
    pod_uid: Option<String>,
    /// The bundle file the names came from (the root it was read under, and its path
    /// relative to it), to notice it is gone.
    bundle: Option<(PathBuf, String)>,
    checked: Instant,
}

/// Names per container id, read under `root` (see the module docs).
pub struct PodNameCache {
    root: PathBuf,
    state: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    entries: HashMap<String, Entry>,
    last_sweep: Option<Instant>,
    /// Bundles refused (not regular, too large, not JSON, invalid names, pod mismatch, a
    /// monitor's bundle path not of its runtime's layout).
    refused: u64,
}

static HOST: LazyLock<PodNameCache> = LazyLock::new(|| {
    let root = std::env::var_os(HOST_ROOT_ENV).filter(|r| !r.is_empty()).map(PathBuf::from);
    PodNameCache::new(root.unwrap_or_else(|| PathBuf::from(HOST_ROOT)))
});

/// Whether the host's root can be opened; otherwise one sentence saying why (no name can
/// be read then).
pub fn host_root_problem() -> Option<String> {
    HOST.root_problem()
}

/// The names of the container `info` describes, read under the host's root; `None` outside
/// a container or when its runtime keeps no (valid, matching) annotations.
pub fn for_container(info: &ContainerInfo) -> Option<Arc<PodNames>> {
    HOST.lookup(info)
}

/// Containers whose names are cached now, on the host.
pub fn named() -> usize {
    HOST.state().entries.values().filter(|e| e.names.is_some()).count()
}

/// Bundles refused so far on the host (see [`PodNameCache::refused`]).
pub fn refused() -> u64 {
    HOST.refused()
}

impl PodNameCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PodNameCache { root: root.into(), state: Mutex::new(CacheState::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bundles found but refused: not a regular file, longer than [`MAX_CONFIG_BYTES`], not
    /// JSON, a name that is not a Kubernetes name, a pod UID other than the cgroup's, or a
    /// runtime monitor's bundle path that is not its runtime's layout
    /// ([`crate::host::runtime_bundle::Refused`]).
    pub fn refused(&self) -> u64 {
        self.state().refused
    }

    /// `None` if the root opens, else why not.
    pub fn root_problem(&self) -> Option<String> {
        match rustix::fs::open(&self.root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
            Ok(_) => None,
            Err(e) => Some(format!(
                "the host's root {} cannot be opened ({}); set {HOST_ROOT_ENV} to where it is seen",
                self.root.display(),
                io::Error::from(e)
            )),
        }
    }

    /// How many containers are cached.
    pub fn len(&self) -> usize {
        self.state().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names of the container in `info` (cached; see the module docs).
    pub fn lookup(&self, info: &ContainerInfo) -> Option<Arc<PodNames>> {
        let id = info.container_id.as_deref().filter(|id| id.len() == CONTAINER_ID_LEN)?;
        if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.sweep();
        let now = Instant::now();
        let cached = {
            let state = self.state();
            state.entries.get(id).and_then(|e| {
                let fresh = e.names.is_some() || now.duration_since(e.checked) < MISS_RETRY;
                fresh.then(|| (e.names.clone(), e.pod_uid.clone()))
            })
        };
        let (names, uid) = match cached {
            Some(hit) => hit,
            None => {
                let read = self.read(info, id);
                let mut state = self.state();
                let entry = match read {
                    Ok((names, uid, bundle)) => {
                        Entry { names: Some(Arc::new(names)), pod_uid: uid, bundle: Some(bundle), checked: now }
                    }
                    Err(e) => {
                        if !matches!(e, BundleError::NotFound | BundleError::NoAnnotations(_) | BundleError::Io(..)) {
                            state.refused += 1;
                        }
                        Entry { names: None, pod_uid: None, bundle: None, checked: now }
                    }
                };
                let hit = (entry.names.clone(), entry.pod_uid.clone());
                if state.entries.len() >= MAX_ENTRIES && !state.entries.contains_key(id) {
                    if let Some(oldest) = state.entries.iter().min_by_key(|(_, e)| e.checked).map(|(k, _)| k.clone()) {
                        state.entries.remove(&oldest);
                    }
                }
                state.entries.insert(id.to_owned(), entry);
                hit
            }
        };
        // Correct or nothing: names are shown only when the bundle's pod UID is the cgroup's.
        // A container that can write its own cgroup tree can name a sub-cgroup after another
        // container's id; the pod segment above it stays its own, so the UIDs differ. When
        // either side has no UID the check cannot be made, and the names are not shown.
        names.as_ref()?;
        match (uid.as_deref(), info.pod_uid.as_deref()) {
            (Some(annotated), Some(cgroup)) if annotated == cgroup => names,
            _ => {
                self.state().refused += 1;
                None
            }
        }
    }

    /// Forgets containers whose bundle file is gone, and misses due for a retry; at most
    /// once per [`SWEEP_EVERY`].
    fn sweep(&self) {
        let now = Instant::now();
        let bundles: Vec<(String, (PathBuf, String))> = {
            let mut state = self.state();
            if state.last_sweep.is_some_and(|t| now.duration_since(t) < SWEEP_EVERY) {
                return;
            }
            state.last_sweep = Some(now);
            state.entries.retain(|_, e| e.names.is_some() || now.duration_since(e.checked) < MISS_RETRY);
            state.entries.iter().filter_map(|(id, e)| Some((id.clone(), e.bundle.clone()?))).collect()
        };
        let gone: Vec<String> = bundles
            .into_iter()
            .filter(|(_, (root, bundle))| matches!(open_in_root(root, bundle), Err(rustix::io::Errno::NOENT)))
            .map(|(id, _)| id)
            .collect();
        if !gone.is_empty() {
            let mut state = self.state();
            for id in gone {
                state.entries.remove(&id);
            }
        }
    }

    /// Reads the bundle file of container `id` (of `info`): where its own runtime keeps it,
    /// else the first at a known place; its names, the pod UID of its annotations, and where it
    /// was read (root and path).
    fn read(&self, info: &ContainerInfo, id: &str) -> Result<(PodNames, Option<String>, (PathBuf, String)), BundleError> {
        let own = crate::host::runtime_bundle::locate(info, id)?.into_iter();
        let fixed = BUNDLES.iter().map(|(prefix, suffix)| (self.root.clone(), format!("{prefix}{id}{suffix}")));
        for (root, path) in own.chain(fixed) {
            let bytes = match read_file(&root, &path) {
                Ok(bytes) => bytes,
                Err(BundleError::Io(_, e)) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            return match parse_spec(&path, &bytes)? {
                Some((names, uid)) => Ok((names, uid, (root, path))),
                None => Err(BundleError::NoAnnotations(path)),
            };
        }
        Err(BundleError::NotFound)
    }
}

/// `path` (relative) opened `O_PATH` inside `root`, not following a final symlink.
fn open_in_root(root: &Path, path: &str) -> rustix::io::Result<OwnedFd> {
    let root = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut attempt = 0;
    loop {
        match rustix::fs::openat2(
            &root,
            path,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(rustix::io::Errno::AGAIN) if attempt < RESOLVE_RETRIES => attempt += 1,
            result => return result,
        }
    }
}

/// The bytes of regular file `path` under `root` (see the module docs).
fn read_file(root: &Path, path: &str) -> Result<Vec<u8>, BundleError> {
    let io_err = |e: rustix::io::Errno| BundleError::Io(path.to_owned(), e.into());
    let fd = open_in_root(root, path).map_err(io_err)?;
    let inode = regular_inode(&fd).map_err(io_err)?.ok_or_else(|| BundleError::NotRegular(path.to_owned()))?;
    let file = rustix::fs::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)?;
    if regular_inode(&file).map_err(io_err)? != Some(inode) {
        return Err(BundleError::NotRegular(path.to_owned()));
    }
    let mut bytes = Vec::new();
    File::from(file)
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| BundleError::Io(path.to_owned(), e))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(BundleError::TooLarge(path.to_owned()));
    }
    Ok(bytes)
}

/// The inode of `fd` if it is a regular file (attributes from the cache: no round trip to
/// a network or FUSE server).
fn regular_inode(fd: impl AsFd) -> rustix::io::Result<Option<u64>> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC, StatxFlags::TYPE | StatxFlags::INO)?;
    Ok((FileType::from_raw_mode(st.stx_mode.into()) == FileType::RegularFile).then_some(st.stx_ino))
}

/// The root a [`PodNameCache`] reads under, for messages.
impl PodNameCache {
    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::config;

    proptest! {
        #![proptest_config(config(256))]

        /// Any bytes: an error or names that are valid Kubernetes names, never a panic.
        #[test]
        fn fuzz_parse_spec(
            ns in "[a-z0-9.\\-_A-Z/\u{1b}]{0,70}",
            pod in "[a-z0-9.\\-]{0,260}",
            junk in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let spec = format!(r#"{{"annotations": {{"io.kubernetes.pod.namespace": {ns:?}, "io.kubernetes.pod.name": {pod:?}, "io.kubernetes.container.name": "c"}}}}"#);
            if let Ok(Some((names, _))) = parse_spec("f", spec.as_bytes()) {
                prop_assert!(is_dns_label(&names.namespace) && is_dns_subdomain(&names.pod));
            }
            let mut bytes = spec.into_bytes();
            bytes.extend(junk);
            let _ = parse_spec("f", &bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::containers::attribute;

    const ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    const ID2: &str = "0000000000000000000000000000000000000000000000000000000000000abc";
    const UID: &str = "1234abcd-0000-1111-2222-333344445555";

    fn containerd_spec(ns: &str, pod: &str, container: &str, uid: &str) -> String {
        serde_json::json!({
            "ociVersion": "1.1.0",
            "process": {"args": ["python3"]},
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-namespace": ns,
                "io.kubernetes.cri.sandbox-name": pod,
                "io.kubernetes.cri.container-name": container,
                "io.kubernetes.cri.sandbox-uid": uid,
                "io.kubernetes.cri.image-name": "registry.example/shop/checkout:1.2"
            }
        })
        .to_string()
    }

    struct Root(PathBuf);
    impl Root {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("pyperch-pod-names-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            Root(dir)
        }
        fn write(&self, rel: &str, contents: &[u8]) {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, contents).expect("write");
        }
    }
    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn containerd_path(id: &str) -> String {
        format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json")
    }

    fn info(cgroup: &str) -> ContainerInfo {
        attribute(cgroup)
    }

    #[test]
    fn containerd_and_crio_annotations() {
        let spec = containerd_spec("shop", "checkout-7d9f6b5c4-x2x7q", "checkout-api", UID);
        let (names, uid) = parse_spec("c", spec.as_bytes()).expect("parses").expect("names");
        assert_eq!(names.pod_path(), "shop/checkout-7d9f6b5c4-x2x7q");
        assert_eq!(names.container, "checkout-api");
        assert_eq!(names.service_name(), "shop/checkout-api");
        assert_eq!(uid.as_deref(), Some(UID));
        let crio = serde_json::json!({"annotations": {
            "io.kubernetes.pod.namespace": "kube-system",
            "io.kubernetes.pod.name": "coredns-5d78c9869d-abcde",
            "io.kubernetes.container.name": "coredns",
            "io.kubernetes.pod.uid": UID,
            "io.kubernetes.cri-o.ContainerType": "container"
        }})
        .to_string();
        let (names, uid) = parse_spec("c", crio.as_bytes()).expect("parses").expect("names");
        assert_eq!(names, PodNames { namespace: "kube-system".into(), pod: "coredns-5d78c9869d-abcde".into(), container: "coredns".into() });
        assert_eq!(uid.as_deref(), Some(UID));
        // podman / plain containerd: annotations, none of Kubernetes.
        let podman = r#"{"annotations": {"io.container.manager": "libpod", "org.opencontainers.image.stopSignal": "15"}}"#;
        assert!(parse_spec("c", podman.as_bytes()).expect("parses").is_none());
        assert!(parse_spec("c", b"{}").expect("parses").is_none());
        // Only some of the keys: not enough.
        let partial = r#"{"annotations": {"io.kubernetes.cri.sandbox-namespace": "a", "io.kubernetes.cri.sandbox-name": "b"}}"#;
        assert!(parse_spec("c", partial.as_bytes()).expect("parses").is_none());
    }

    #[test]
    fn hostile_specs_are_refused() {
        for (ns, pod, container) in [
            ("Shop", "p", "c"),
            ("shop", "p\u{1b}[31m", "c"),
            ("shop", "p", "c/d"),
            ("", "p", "c"),
            ("shop", "p", &"c".repeat(64)),
            ("shop", &"p".repeat(254), "c"),
            ("-shop", "p", "c"),
            ("shop", "p..q", "c"),
        ] {
            let spec = containerd_spec(ns, pod, container, UID);
            assert!(matches!(parse_spec("c", spec.as_bytes()), Err(BundleError::InvalidName(_))), "{ns:?} {pod:?} {container:?}");
        }
        for garbage in [&b""[..], b"[", b"null", b"{\"annotations\": 5}", &[0xff, 0xfe], b"{\"annotations\": {\"io.kubernetes.cri.sandbox-name\": 5}}"] {
            // Garbage is an error or no names, never a panic or a name.
            assert!(!matches!(parse_spec("c", garbage), Ok(Some(_))), "{garbage:?}");
        }
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_spec("c", deep.as_bytes()).is_err());
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(is_dns_label("a"));
        assert!(!is_dns_label("a_b"));
    }

    #[test]
    fn cache_reads_through_the_root_and_forgets_gone_containers() {
        let root = Root::new("cache");
        let cache = PodNameCache::new(&root.0);
        let cgroup = format!("/kubepods/burstable/pod{UID}/{ID}");
        // No bundle: nothing (a miss, cached).
        assert_eq!(cache.lookup(&info(&cgroup)), None);
        assert_eq!(cache.len(), 1);
        root.write(&containerd_path(ID), containerd_spec("shop", "checkout-1", "api", UID).as_bytes());
        // Within MISS_RETRY the miss stands; a fresh cache finds the names.
        assert_eq!(cache.lookup(&info(&cgroup)), None);
        let cache = PodNameCache::new(&root.0);
        let names = cache.lookup(&info(&cgroup)).expect("names");
        assert_eq!((names.namespace.as_str(), names.pod.as_str(), names.container.as_str()), ("shop", "checkout-1", "api"));
        // Cached: still found after the file changes.
        root.write(&containerd_path(ID), containerd_spec("shop", "other", "api", UID).as_bytes());
        assert_eq!(cache.lookup(&info(&cgroup)).expect("cached").pod, "checkout-1");
        // A pod UID other than the cgroup's: nothing, and counted.
        let other_pod = format!("/kubepods/burstable/pod1234abcd-0000-1111-2222-999999999999/{ID}");
        assert_eq!(cache.lookup(&info(&other_pod)), None);
        assert_eq!(cache.refused(), 1);
        // Issue #28 item 9: no pod UID in the cgroup path (the check cannot be made): nothing,
        // and counted.
        assert_eq!(cache.lookup(&info(&format!("/system.slice/docker-{ID}.scope"))), None);
        assert_eq!(cache.refused(), 2);
        // No container: nothing.
        assert_eq!(cache.lookup(&info("/user.slice")), None);
        // The container goes: forgotten at the next sweep.
        std::fs::remove_dir_all(root.0.join("run/containerd")).expect("rm");
        cache.state().last_sweep = None;
        assert_eq!(cache.lookup(&info(&format!("/kubepods/pod{UID}/{ID2}"))), None);
        assert!(!cache.state().entries.get(ID).is_some_and(|e| e.names.is_some()), "a gone container is forgotten");
    }

    #[test]
    fn crio_bundles_and_hostile_files() {
        let root = Root::new("crio");
        let crio = serde_json::json!({"annotations": {
            "io.kubernetes.pod.namespace": "shop",
            "io.kubernetes.pod.name": "web-0",
            "io.kubernetes.container.name": "web",
            "io.kubernetes.pod.uid": UID,
        }})
        .to_string();
        root.write(&format!("run/containers/storage/overlay-containers/{ID}/userdata/config.json"), crio.as_bytes());
        let cache = PodNameCache::new(&root.0);
        let cgroup = format!("/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope", UID.replace('-', "_"));
        assert_eq!(cache.lookup(&info(&cgroup)).expect("names").pod, "web-0");
        assert_eq!(cache.refused(), 0);

        // A symlink as the bundle file, pointing out of the root: refused, never followed.
        let outside = Root::new("outside");
        outside.write("config.json", containerd_spec("evil", "evil", "evil", UID).as_bytes());
        let dir = root.0.join(format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID2}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::os::unix::fs::symlink(outside.0.join("config.json"), dir.join("config.json")).expect("symlink");
        let cgroup2 = format!("/kubepods/pod{UID}/{ID2}");
        assert_eq!(cache.lookup(&info(&cgroup2)), None);
        // A symlinked directory pointing out of the root resolves inside the root (absent).
        std::fs::remove_dir_all(&dir).expect("rm");
        std::os::unix::fs::symlink(&outside.0, &dir).expect("symlink dir");
        let cache = PodNameCache::new(&root.0);
        assert_eq!(cache.lookup(&info(&cgroup2)), None);
        // A FIFO as the bundle file: refused without blocking.
        std::fs::remove_file(&dir).expect("rm link");
        std::fs::create_dir_all(&dir).expect("mkdir");
        rustix::fs::mknodat(rustix::fs::CWD, dir.join("config.json"), FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
        let cache = PodNameCache::new(&root.0);
        assert_eq!(cache.lookup(&info(&cgroup2)), None);
        assert_eq!(cache.refused(), 1);
        // Too large: refused.
        std::fs::remove_file(dir.join("config.json")).expect("rm fifo");
        let mut big = containerd_spec("shop", "p", "c", UID).into_bytes();
        big.resize(MAX_CONFIG_BYTES as usize + 10, b' ');
        std::fs::write(dir.join("config.json"), big).expect("write");
        let cache = PodNameCache::new(&root.0);
        assert_eq!(cache.lookup(&info(&cgroup2)), None);
        assert_eq!(cache.refused(), 1);
    }
}
