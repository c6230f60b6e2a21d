//! The cgroup path a process is attributed by, and its segments.

use super::{ContainerInfo, pod::pod_at, runtimes::container_at};

/// Picks, from the contents of `/proc/PID/cgroup`, the cgroup path to attribute.
///
/// Each line is `hierarchy-id:controllers:path`. Candidates, in order of preference:
/// 1. the cgroup v2 line (`0::/path`);
/// 2. the v1 `name=systemd` line;
/// 3. the v1 line whose controllers include `cpu`;
/// 4. the v1 line whose controllers include `memory`.
///
/// The first candidate from which [`attribute`] derives a container id is returned; failing
/// that, the first from which it derives a pod UID; failing that, the first candidate. (On
/// a "hybrid" host the v2 line may say `/` while the v1 controllers hold the container's
/// path, hence the look past the first candidate.) A trailing ` (deleted)` (a cgroup removed
/// while the process still runs) is stripped. Malformed lines, and paths not starting with
/// `/`, are skipped; with no usable line the result is empty.
pub fn parse_cgroup_file(contents: &str) -> String {
    let mut unified: Option<&str> = None;
    let mut systemd: Option<&str> = None;
    let mut cpu: Option<&str> = None;
    let mut memory: Option<&str> = None;
    for line in contents.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        if !path.starts_with('/') || hierarchy.parse::<u32>().is_err() {
            continue;
        }
        if hierarchy == "0" && controllers.is_empty() {
            unified.get_or_insert(path);
            continue;
        }
        for controller in controllers.split(',') {
            let slot = match controller {
                "name=systemd" => &mut systemd,
                "cpu" => &mut cpu,
                "memory" => &mut memory,
                _ => continue,
            };
            slot.get_or_insert(path);
        }
    }
    let candidates: Vec<&str> = [unified, systemd, cpu, memory]
        .into_iter()
        .flatten()
        .collect();
    let chosen = candidates
        .iter()
        .find(|path| attribute(path).container_id.is_some())
        .or_else(|| {
            candidates
                .iter()
                .find(|path| attribute(path).pod_uid.is_some())
        })
        .or(candidates.first());
    chosen.map(|path| (*path).to_owned()).unwrap_or_default()
}

/// Derives the container and pod from a cgroup path. Pure; `nspid` is left empty and
/// `cgroup_path` is set to `cgroup_path`.
///
/// The container is the outermost (leftmost) segment of one of these shapes; segments
/// after it (cgroups the container made inside its own, like crun's `/container`, or a
/// nested runtime's) do not change the attribution. Outermost, because a container that can
/// write its own cgroup tree (cgroup v2 delegation) can create a sub-cgroup named after
/// another container's id and move into it: it must not borrow that container's id (and
/// with it the pod names and `service_name`). Docker in Docker is the outer container.
///
/// | segment(s) | runtime |
/// |---|---|
/// | `docker-<id>.scope` | Docker |
/// | `docker/<id>` (two segments) | Docker |
/// | `cri-containerd-<id>.scope`, `nerdctl-<id>.scope` | containerd |
/// | `crio-<id>.scope` | CRI-O |
/// | `libpod-<id>.scope`, `libpod_parent/libpod-<id>` | Podman |
/// | `<pod segment>/<id>` (cgroupfs-driver Kubernetes) | unknown (`None`) |
/// | `<pod segment>/crio-<id>` (cgroupfs-driver CRI-O) | CRI-O |
///
/// Pod segments, which also give the QoS class:
/// - systemd driver: `<prefix>kubepods[-burstable|-besteffort]-pod<uid>.slice`, the UID
///   with `_` for `-` (any `<prefix>-`, such as kind's `kubelet-`, is allowed);
/// - cgroupfs driver: `kubepods[/burstable|/besteffort]/pod<uid>`; when the path is shown
///   relative to the reader's cgroup namespace (it starts with `/..`), the part above the pod
///   segment may be cut off, and then `burstable/pod<uid>`, `besteffort/pod<uid>` and a bare
///   leading `pod<uid>` (QoS class unknown) are accepted too.
///
/// The pod is the segment just above the container's; with no container, a pod segment
/// that ends the path. Anything else, including a bare 64-hex segment in any other position,
/// yields no container id.
pub fn attribute(cgroup_path: &str) -> ContainerInfo {
    let mut info = ContainerInfo {
        cgroup_path: cgroup_path.to_owned(),
        ..ContainerInfo::default()
    };
    let Some(path) = Segments::parse(cgroup_path) else {
        return info;
    };
    let segments = &path.segments;

    let container = (0..segments.len())
        .find_map(|i| container_at(&path, i).map(|(runtime, id)| (i, runtime, id)));
    let pod_index = match container {
        Some((i, runtime, id)) => {
            info.container_id = Some(id.to_owned());
            info.runtime = runtime;
            i.checked_sub(1)
        }
        None => segments.len().checked_sub(1),
    };
    if let Some((uid, qos)) = pod_index.and_then(|i| pod_at(&path, i)) {
        info.pod_uid = Some(uid);
        info.qos_class = qos;
    }
    info
}

/// A cgroup path split into its segments.
///
/// Invariant: no segment is empty, `.` or `..`; `relative` says whether the path began with
/// `/..` segments (a path shown relative to the reader's cgroup namespace), which were
/// removed.
pub(super) struct Segments<'a> {
    pub(super) segments: Vec<&'a str>,
    pub(super) relative: bool,
}

impl<'a> Segments<'a> {
    /// `None` for a path that is not absolute or has `..` after its first real segment.
    pub(super) fn parse(path: &'a str) -> Option<Self> {
        let rest = path.strip_prefix('/')?;
        let mut segments = Vec::new();
        let mut relative = false;
        for segment in rest.split('/') {
            match segment {
                "" | "." => {}
                ".." if segments.is_empty() => relative = true,
                ".." => return None,
                _ => segments.push(segment),
            }
        }
        Some(Segments { segments, relative })
    }

    pub(super) fn get(&self, i: usize) -> Option<&'a str> {
        self.segments.get(i).copied()
    }

    /// The segment before `i`, if any.
    pub(super) fn before(&self, i: usize) -> Option<&'a str> {
        i.checked_sub(1).and_then(|j| self.get(j))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::containers::{QosClass, Runtime, test_support::*};

    #[test]
    fn unknown_shapes_give_no_id() {
        // containerd outside Kubernetes: `/<namespace>/<id>` is ambiguous.
        nothing(&format!("/default/{ID}"));
        nothing(&format!("/moby/{ID}"));
        nothing(&format!("/{ID}"));
        nothing(&format!("/ecs/{ID2}/{ID}"));
        nothing(&format!("/system.slice/{ID}.scope"));
        nothing(&format!("/system.slice/unknown-{ID}.scope"));
        // Ids must be exactly 64 lowercase hex digits.
        let upper = ID.to_uppercase();
        nothing(&format!("/docker/{upper}"));
        nothing(&format!("/system.slice/docker-{upper}.scope"));
        nothing(&format!("/docker/{}", &ID[..63]));
        nothing(&format!("/docker/{ID}0"));
        nothing(&format!("/system.slice/docker-{}.scope", &ID[1..]));
        nothing(&format!("/system.slice/docker-{ID}z.scope"));
        nothing(&format!("/system.slice/docker-{}g.scope", &ID[1..]));
        // Malformed pod UIDs.
        nothing(&format!("/kubepods/burstable/pod{}/{ID}", &UID[1..]));
        nothing(&format!(
            "/kubepods/burstable/pod{}/{ID}",
            UID.to_uppercase()
        ));
        nothing(&format!("/kubepods/burstable/pod/{ID}"));
        nothing("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod.slice");
        nothing(&format!("/kubepods.slice/kubepods-other-pod{UID_US}.slice"));
        nothing(&format!(
            "/kubepods.slice/other-burstable-pod{UID_US}.slice"
        ));
        nothing(&format!("/kubepods.slice/burstable-pod{UID_US}.slice"));
        nothing(&format!("/x/kubepods-pod{UID}.slice"));
        // A known container followed by an unknown 64-hex segment: the known one counts.
        check(
            &format!("/docker/{ID}/{ID2}"),
            Some(ID),
            Some(Runtime::Docker),
            None,
            None,
        );
        // Host processes.
        nothing("/");
        nothing("/init.scope");
        nothing("/user.slice/user-1000.slice/session-2.scope");
        nothing("");
        nothing("relative/docker/x");
        nothing(&format!("docker/{ID}"));
    }

    #[test]
    fn garbage_paths_do_not_panic() {
        let long = "a/".repeat(10_000);
        for path in [
            "//",
            "/..",
            "/../..",
            "/.",
            "/\u{0}",
            "/é/ü",
            "/-.slice",
            "/pod.slice",
            "/-pod.slice",
            "/kubepods-pod.slice",
            "/.scope",
            "/docker-.scope",
            "/crio-",
            long.as_str(),
            &format!("/{long}"),
        ] {
            let info = attribute(path);
            assert_eq!(info.container_id, None, "{path:?}");
        }
        // Non-ASCII of the right byte length must not be sliced mid-character.
        let multibyte = "é".repeat(32);
        nothing(&format!("/docker/{multibyte}"));
        nothing(&format!("/system.slice/docker-{multibyte}.scope"));
        nothing(&format!("/kubepods/pod{}/{ID}", "é".repeat(18)));
    }

    #[test]
    fn cgroup_v2_file() {
        let file = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            parse_cgroup_file(&file),
            format!("/system.slice/docker-{ID}.scope")
        );
        assert_eq!(parse_cgroup_file("0::/\n"), "/");
        assert_eq!(
            parse_cgroup_file("0::/user.slice/user-1000.slice/session-3.scope"),
            "/user.slice/user-1000.slice/session-3.scope"
        );
        let deleted = format!("0::/kubepods/pod{UID}/{ID} (deleted)\n");
        assert_eq!(
            parse_cgroup_file(&deleted),
            format!("/kubepods/pod{UID}/{ID}")
        );
        // Relative to a cgroup namespace.
        let relative = format!("0::/../../kubepods-pod{UID_US}.slice/cri-containerd-{ID}.scope\n");
        let info = attribute(&parse_cgroup_file(&relative));
        assert_eq!(info.container_id.as_deref(), Some(ID));
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn cgroup_v1_file_with_many_controllers() {
        let path = format!("/kubepods/burstable/pod{UID}/{ID}");
        let file = format!(
            "12:hugetlb:{path}\n11:perf_event:{path}\n10:freezer:{path}\n9:pids:{path}\n8:net_cls,net_prio:{path}\n7:devices:{path}\n6:blkio:{path}\n5:cpuset:{path}\n4:memory:{path}\n3:cpu,cpuacct:{path}\n2:rdma:/\n1:name=systemd:{path}\n"
        );
        assert_eq!(parse_cgroup_file(&file), path);
        let info = attribute(&parse_cgroup_file(&file));
        assert_eq!(info.container_id.as_deref(), Some(ID));
        assert_eq!(info.pod_uid.as_deref(), Some(UID));
        assert_eq!(info.qos_class, Some(QosClass::Burstable));

        // name=systemd preferred over cpu and memory; cpu over memory.
        let file = "4:memory:/m\n3:cpuacct,cpu:/c\n1:name=systemd:/s\n";
        assert_eq!(parse_cgroup_file(file), "/s");
        let file = "4:memory:/m\n3:cpuacct,cpu:/c\n";
        assert_eq!(parse_cgroup_file(file), "/c");
        assert_eq!(parse_cgroup_file("4:memory:/m\n2:pids:/p\n"), "/m");
        // Only irrelevant controllers.
        assert_eq!(parse_cgroup_file("2:pids:/p\n"), "");
    }

    #[test]
    fn hybrid_file_prefers_the_line_naming_a_container() {
        // systemd in hybrid mode: the unified line is the root, the v1 lines hold the
        // container (Docker with the cgroupfs driver).
        let file = format!(
            "12:cpu,cpuacct:/docker/{ID}\n4:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        assert_eq!(parse_cgroup_file(&file), format!("/docker/{ID}"));
        // v2 preferred when both name the container.
        let file = format!("3:cpu:/docker/{ID}\n0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            parse_cgroup_file(&file),
            format!("/system.slice/docker-{ID}.scope")
        );
        // Neither names a container: the unified line.
        assert_eq!(parse_cgroup_file("3:cpu:/a\n0::/b\n"), "/b");
        // A pod without a container beats nothing.
        let file = format!("3:cpu:/kubepods/pod{UID}\n0::/\n");
        assert_eq!(parse_cgroup_file(&file), format!("/kubepods/pod{UID}"));
    }

    #[test]
    fn garbage_cgroup_files() {
        for file in [
            "",
            "\n\n",
            "garbage",
            "0:",
            "0::",
            "0::relative",
            "x::/docker/abc",
            ":::",
            "-1::/a",
            "\u{0}\u{1}:\u{2}:",
        ] {
            assert_eq!(parse_cgroup_file(file), "", "{file:?}");
        }
        // Colons in the path survive.
        assert_eq!(parse_cgroup_file("0::/a:b\n"), "/a:b");
        // Garbage lines around a good one.
        let file = format!("junk\n\n0::/docker/{ID}\nmore junk:\n");
        assert_eq!(parse_cgroup_file(&file), format!("/docker/{ID}"));
        // Windows line endings.
        let file = format!("0::/docker/{ID}\r\n");
        assert_eq!(
            attribute(&parse_cgroup_file(&file)).container_id.as_deref(),
            Some(ID)
        );
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::host::containers::{CONTAINER_ID_LEN, parse_nspid};
    use crate::fuzzing::config;

    /// A segment from the pieces real cgroup paths are made of, or anything.
    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("docker".to_owned()),
            Just("kubepods".to_owned()),
            Just("burstable".to_owned()),
            Just("..".to_owned()),
            Just("libpod_parent".to_owned()),
            "(docker-|crio-|libpod-|cri-containerd-)?[0-9a-f]{62,66}(\\.scope)?",
            "(kubelet-)?kubepods(-burstable|-besteffort)?-pod[0-9a-f_]{30,40}\\.slice",
            "pod[0-9a-f-]{30,40}",
            "[^/\\n]{0,12}",
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec(segment(), 0..8).prop_map(|s| format!("/{}", s.join("/")))
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn fuzz_cgroup_path(path in path()) {
            let info = attribute(&path);
            prop_assert!(info.container_id.as_ref().is_none_or(|id| id.len() == CONTAINER_ID_LEN));
            prop_assert!(info.pod_uid.as_ref().is_none_or(|uid| uid.len() <= 36));
        }

        #[test]
        fn fuzz_cgroup_file(
            lines in prop::collection::vec(("[0-9]{0,3}|x", "(cpu|memory|name=systemd|cpu,cpuacct|)", path()), 0..6),
            noise in ".{0,80}",
        ) {
            let text: String = lines.iter().map(|(h, c, p)| format!("{h}:{c}:{p}\n")).collect::<String>() + &noise;
            prop_assert!(parse_cgroup_file(&text).len() <= text.len());
            prop_assert!(parse_nspid(&text).len() <= text.len());
        }
    }
}
