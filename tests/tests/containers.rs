//! Containers and Kubernetes nodes, without a container runtime: Python processes in their
//! own PID and mount namespaces (`unshare --pid --mount --fork --root=<sid rootfs>`), placed
//! in cgroups named like containerd's under Kubernetes
//! (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`)
//! and Docker's (`system.slice/docker-<id>.scope`), with fresh random ids every run.
//!
//! Checked: `pyperch list` (NSPID, CONTAINER, POD), `record --by-container` attribution,
//! the pprof labels (decoded with the official profile.proto), every filter (`--container`,
//! `--pod`, `--cgroup`, `--comm`, `--cmdline`, alone and combined, with `--pid`), cgroup paths
//! of unknown shapes (no container id, never a wrong one), and filters matching nothing (a
//! clear error, not a silent empty profile).

use std::collections::{BTreeMap, BTreeSet};

use pyperch_tests::*;

/// The interpreters run inside the namespaces (Debian sid's, with `--root=<rootfs>`).
const LEAVES: [&str; 5] = [
    "leaf_red",
    "leaf_green",
    "leaf_blue",
    "leaf_late",
    "leaf_old",
];
/// Per filtered recording: long enough for ~100 samples per process on a 2-CPU machine.
const SHORT: &str = "2.5";

/// Four spinning interpreters:
/// - `c1` (leaf_red) and `c2` (leaf_green): two containers of one Kubernetes pod;
/// - `d` (leaf_blue): a Docker container;
/// - `outsider` (leaf_late): no namespaces, in a cgroup that names no container.
///
/// Every command line holds `token`; each member's own tag is `token-<name>`.
struct Fleet {
    c1: Contained,
    c2: Contained,
    d: Contained,
    outsider: Contained,
    pod_uid: String,
    c1_id: String,
    c2_id: String,
    d_id: String,
    token: String,
    // Dropped last: the processes above are gone by then.
    _cgroups: Cgroups,
}

impl Fleet {
    /// `None` (after a SKIP message) when the interpreters or cgroups are not available.
    fn start() -> Option<Fleet> {
        let (py, cgroups) = namespaced_python_and_cgroups()?;
        Some(Self::start_on(py, cgroups))
    }

    /// The free-threaded 3.14 of `PYPERCH_FT_PYTHON`, each member in its own namespaces on the
    /// host's root (the interpreter is built by hand, not in the sid rootfs); `None` after a
    /// SKIP message where it is unset or cgroups are not available.
    fn start_free_threaded() -> Option<Fleet> {
        let py = python(FT_3_14)?;
        match Cgroups::new() {
            Ok(cgroups) => Some(Self::start_on(py, cgroups)),
            Err(why) => {
                skip(format!("cannot create cgroups: {why}"));
                None
            }
        }
    }

    fn start_on(py: Python, mut cgroups: Cgroups) -> Fleet {
        let token = format!("e2e{}", random_hex(10));
        let pod_uid = random_pod_uid();
        let (c1_id, c2_id, d_id) = (random_hex(64), random_hex(64), random_hex(64));
        let outsider_cg = format!("/pyperch-e2e-{}.slice/outsider.scope", random_hex(8));
        let mut spawn = |cg: &str, ns: bool, leaf: &str, name: &str| {
            Contained::spawn(
                &py,
                &mut cgroups,
                cg,
                ns,
                "spin.py",
                &[leaf, "120"],
                &format!("{token}-{name}"),
            )
            .unwrap_or_else(|e| panic!("{e:#}"))
        };
        let c1 = spawn(&kubepods_cgroup(&pod_uid, &c1_id), true, "leaf_red", "c1");
        let c2 = spawn(&kubepods_cgroup(&pod_uid, &c2_id), true, "leaf_green", "c2");
        let d = spawn(&docker_cgroup(&d_id), true, "leaf_blue", "d");
        let outsider = spawn(&outsider_cg, false, "leaf_late", "outsider");
        let fleet = Fleet {
            c1,
            c2,
            d,
            outsider,
            pod_uid,
            c1_id,
            c2_id,
            d_id,
            token,
            _cgroups: cgroups,
        };
        note(format!("processes:{}", fleet.summary()));
        fleet
    }

    /// (member, its leaf, its container id, its pod uid)
    fn members(&self) -> Vec<(&Contained, &'static str, Option<&str>, Option<&str>)> {
        vec![
            (
                &self.c1,
                "leaf_red",
                Some(self.c1_id.as_str()),
                Some(self.pod_uid.as_str()),
            ),
            (
                &self.c2,
                "leaf_green",
                Some(self.c2_id.as_str()),
                Some(self.pod_uid.as_str()),
            ),
            (&self.d, "leaf_blue", Some(self.d_id.as_str()), None),
            (&self.outsider, "leaf_late", None, None),
        ]
    }

    fn summary(&self) -> String {
        self.members()
            .iter()
            .map(|(m, leaf, _, _)| format!("\n    {} running {leaf}", m.describe()))
            .collect()
    }
}

/// The rows of `pyperch list`, by PID: the columns PID NSPID EXECUTABLE VERSION LIBPYTHON
/// THREADS CONTAINER POD, then STATUS (which may hold spaces), then NAME (shown before
/// STATUS).
fn list_rows(stdout: &str) -> BTreeMap<u32, Vec<String>> {
    let mut rows = BTreeMap::new();
    for line in stdout.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 10 {
            continue;
        }
        let Ok(pid) = fields[0].parse::<u32>() else {
            continue;
        };
        let mut row: Vec<String> = fields[..8].iter().map(|s| s.to_string()).collect();
        row.push(fields[9..].join(" "));
        row.push(fields[8].to_string());
        rows.insert(pid, row);
    }
    rows
}

/// A `--by-container` stack split into its group (`container <short id>` or `host`) and the
/// rest (which starts with `<comm> (pid N)`, like a plain stack).
fn split_group(st: &Stack) -> (String, Stack) {
    let group = st.frames.first().cloned().unwrap_or_default();
    let rest = Stack {
        frames: st.frames.iter().skip(1).cloned().collect(),
        count: st.count,
    };
    (group, rest)
}

/// The stacks of `m` are right: present, ≥ 80 % in its own leaf at lines of that function
/// in its script, none in another member's leaf, under its own comm.
fn check_samples(profile: &Profile, m: &Contained, leaf: &str, d: &str) {
    let mine = profile.for_pid(m.host_pid);
    let total = mine.total();
    assert!(total > 0, "no samples of {}{d}", m.describe());
    let hits = mine.with_leaf(leaf);
    assert!(
        hits as f64 >= 0.8 * total as f64,
        "{}: {hits} of {total} samples end in {leaf} (want >= 80 %){d}",
        m.describe()
    );
    for other in LEAVES.iter().filter(|o| *o != &leaf) {
        assert_eq!(
            mine.with_function(other),
            0,
            "{} has samples in {other}, which it never runs{d}",
            m.describe()
        );
    }
    let (first, last) = function_lines("spin.py", leaf).expect("spin.py has the leaf");
    for st in mine.stacks.iter().filter(|s| s.leaf_is(leaf)) {
        let f = st.leaf().unwrap();
        assert_eq!(
            f.file,
            m.script_path(),
            "{}: leaf frame in the wrong file{d}",
            m.describe()
        );
        let line = f.line.unwrap_or(0);
        assert!(
            (first..=last).contains(&line),
            "{}: {leaf} at line {line}, outside {first}..={last}{d}",
            m.describe()
        );
    }
    for st in &mine.stacks {
        assert_eq!(
            st.comm(),
            Some(m.comm.as_str()),
            "{}: the root frame should name its comm{d}",
            m.describe()
        );
    }
}

#[test]
fn list_shows_namespace_pid_container_and_pod() {
    let Some(fleet) = Fleet::start() else {
        return;
    };
    list_shows(&fleet);
}

/// Free-threaded 3.14 processes in containers (issue #30): the same columns, and the
/// VERSION names the build (`3.14.7t`).
#[test]
fn list_shows_namespace_pid_container_and_pod_ft_3_14() {
    let Some(fleet) = Fleet::start_free_threaded() else { return };
    list_shows(&fleet);
}

fn list_shows(fleet: &Fleet) {
    for (m, _, _, _) in fleet.members() {
        let nspid = m.nspid();
        let want = if m.namespaced {
            vec![m.host_pid, 1]
        } else {
            vec![m.host_pid]
        };
        assert_eq!(nspid, want, "NSpid of {} (test set-up)", m.describe());
    }
    let run = pyperch(&["list"], std::time::Duration::from_secs(60));
    let d = format!("{}\n--- processes:{}", run.diag(), fleet.summary());
    assert!(run.success(), "pyperch list failed{d}");
    let rows = list_rows(&run.stdout);
    for (m, _, id, pod) in fleet.members() {
        let row = rows
            .get(&m.host_pid)
            .unwrap_or_else(|| panic!("pyperch list does not show {}{d}", m.describe()));
        let want_nspid = if m.namespaced {
            "1".to_string()
        } else {
            m.host_pid.to_string()
        };
        assert_eq!(row[1], want_nspid, "NSPID of {}{d}", m.describe());
        assert!(
            row[2].ends_with(&format!("/{}", m.exe_name())),
            "EXECUTABLE of {}: {}{d}",
            m.describe(),
            row[2]
        );
        assert_eq!(
            row[6],
            id.map_or("-".to_string(), |i| i[..12].to_string()),
            "CONTAINER of {}{d}",
            m.describe()
        );
        assert_eq!(row[7], pod.unwrap_or("-"), "POD of {}{d}", m.describe());
        if m.python.label == FT_3_14 {
            assert!(row[3].starts_with("3.14.") && row[3].ends_with('t'), "VERSION of {}: {}{d}", m.describe(), row[3]);
        }
        assert_eq!(row[8], "ok", "STATUS of {}{d}", m.describe());
    }
}

#[test]
fn by_container_attribution() {
    let Some(fleet) = Fleet::start() else {
        return;
    };
    attribution(&fleet);
}

/// The same with free-threaded 3.14 processes (issue #30).
#[test]
fn by_container_attribution_ft_3_14() {
    let Some(fleet) = Fleet::start_free_threaded() else { return };
    attribution(&fleet);
}

fn attribution(fleet: &Fleet) {
    // Whole host: other Python processes may be sampled too; only ours are checked.
    let rec = record(&["--duration", "4", "--by-container", "--stats"]);
    rec.assert_ok();
    let d = format!("{}\n--- processes:{}", rec.diag(), fleet.summary());
    // Group of each pid, and the profile without the group frames.
    let mut groups: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    let mut pids_of_group: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    let mut plain = Profile::default();
    for st in &rec.profile.stacks {
        let (group, rest) = split_group(st);
        assert!(
            group == "host" || group.starts_with("container "),
            "stack does not start with `container <id>` or `host`: {}{d}",
            st.frames.join(";")
        );
        let pid = rest.pid().unwrap_or_else(|| {
            panic!(
                "the frame after the group is not `<comm> (pid N)`: {}{d}",
                st.frames.join(";")
            )
        });
        groups.entry(pid).or_default().insert(group.clone());
        pids_of_group.entry(group).or_default().insert(pid);
        plain.stacks.push(rest);
    }
    for (m, leaf, id, _) in fleet.members() {
        let want = id.map_or("host".to_string(), |i| format!("container {}", &i[..12]));
        check_samples(&plain, m, leaf, &d);
        assert_eq!(
            groups.get(&m.host_pid).cloned().unwrap_or_default(),
            BTreeSet::from([want.clone()]),
            "{} should be under `{want}` only{d}",
            m.describe()
        );
        if id.is_some() {
            assert_eq!(
                pids_of_group.get(&want).cloned().unwrap_or_default(),
                BTreeSet::from([m.host_pid]),
                "`{want}` should hold {} only{d}",
                m.describe()
            );
        }
    }
}

#[test]
fn pprof_labels_name_the_container_and_pod() {
    let python = match pprof_python() {
        Ok(p) => p,
        Err(why) => {
            skip(format!("cannot decode pprof: {why}"));
            return;
        }
    };
    let Some(fleet) = Fleet::start() else {
        return;
    };
    let dir = std::env::temp_dir()
        .join("pyperch-tests")
        .join(format!("pprof-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("profile.pb.gz");
    let run = pyperch(
        &[
            "record",
            "--duration",
            "4",
            "--format",
            "pprof",
            "--output",
            out.to_str().unwrap(),
            "--cmdline",
            &fleet.token,
        ],
        std::time::Duration::from_secs(60),
    );
    let d = format!("{}\n--- processes:{}", run.diag(), fleet.summary());
    assert!(run.success(), "pyperch record failed{d}");
    let decoded = decode_pprof(&python, &out).unwrap_or_else(|e| panic!("{e:#}{d}"));
    let d = format!(
        "{d}\n--- decoded (first 3000 chars): {}",
        decoded.to_string().chars().take(3000).collect::<String>()
    );
    assert_eq!(
        decoded["errors"],
        serde_json::json!([]),
        "the pprof is not consistent{d}"
    );
    let samples = decoded["samples"].as_array().cloned().unwrap_or_default();
    for (m, leaf, id, pod) in fleet.members() {
        let pid = m.host_pid.to_string();
        let mine: Vec<&serde_json::Value> = samples
            .iter()
            .filter(|s| s["labels"]["process.pid"] == pid.as_str())
            .collect();
        let total: i64 = mine
            .iter()
            .map(|s| s["values"][0].as_i64().unwrap_or(0))
            .sum();
        assert!(total > 0, "no samples labelled process.pid={pid}{d}");
        let in_leaf: i64 = mine
            .iter()
            .filter(|s| s["stack"][0][0] == leaf)
            .map(|s| s["values"][0].as_i64().unwrap_or(0))
            .sum();
        assert!(
            in_leaf as f64 >= 0.8 * total as f64,
            "{}: {in_leaf} of {total} samples end in {leaf}{d}",
            m.describe()
        );
        for s in &mine {
            let labels = s["labels"].as_object().unwrap();
            let str_label = |k: &str| labels.get(k).and_then(|v| v.as_str()).map(str::to_string);
            assert_eq!(
                str_label("process.executable.name"),
                Some(m.exe_name()),
                "executable label of {}{d}",
                m.describe()
            );
            assert_eq!(
                str_label("container.id").as_deref(),
                id,
                "container.id label of {}{d}",
                m.describe()
            );
            assert_eq!(
                str_label("k8s.pod.uid").as_deref(),
                pod,
                "k8s.pod.uid label of {}{d}",
                m.describe()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One filtered recording: exactly `want` of the fleet's processes (and nothing else) are
/// in the profile, each with its right stacks.
fn check_filter(fleet: &Fleet, args: &[&str], want: &[&Contained]) {
    // --stats: a failure shows why samples were lost (e.g. "no thread state").
    let mut argv = vec!["--duration", SHORT, "--stats"];
    argv.extend_from_slice(args);
    let rec = record(&argv);
    let d = format!(
        "{}\n--- filter: {}\n--- processes:{}",
        rec.diag(),
        args.join(" "),
        fleet.summary()
    );
    rec.assert_ok();
    let want_pids: BTreeSet<u32> = want.iter().map(|m| m.host_pid).collect();
    assert_eq!(
        rec.profile.pids(),
        want_pids,
        "`{}` should keep exactly these pids{d}",
        args.join(" ")
    );
    for (m, leaf, _, _) in fleet.members() {
        if want_pids.contains(&m.host_pid) {
            check_samples(&rec.profile, m, leaf, &d);
        }
    }
}

/// A filtered recording that matches none of the processes: exit 1 with the one error line
/// `error: no Python process matched <described> during the recording`.
fn check_no_match(args: &[&str], described: &str, d_extra: &str) {
    check_error(
        args,
        &format!("error: no Python process matched {described} during the recording"),
        d_extra,
    );
}

/// A filtered recording that must fail with exactly this error line (exit 1).
fn check_error(args: &[&str], error_line: &str, d_extra: &str) {
    let mut argv = vec!["--duration", "1.5"];
    argv.extend_from_slice(args);
    let rec = record(&argv);
    let d = format!("{}{d_extra}", rec.diag());
    rec.run.assert_clear_error();
    assert_eq!(rec.run.code(), Some(1), "exit status{d}");
    assert_eq!(rec.run.error_line(), error_line, "the error line{d}");
    assert!(
        rec.profile.stacks.is_empty(),
        "a profile was written although nothing matched{d}"
    );
}

#[test]
fn each_filter_selects_exactly_its_processes() {
    let Some(f) = Fleet::start() else {
        return;
    };
    let (c1, c2, d, outsider) = (&f.c1, &f.c2, &f.d, &f.outsider);
    let c1_short = &f.c1_id[..12];
    let d_short = &f.d_id[..12];
    let pod_cg = kubepods_pod_cgroup(&f.pod_uid);
    let c1_comm = format!("^{}$", c1.comm);
    let c2_comm = format!("^{}$", c2.comm);
    let d_cg = docker_cgroup(&f.d_id);
    let pid_c2 = c2.host_pid.to_string();
    let pid_outsider = outsider.host_pid.to_string();
    let c1_upper = c1_short.to_uppercase();
    let c1_or_outsider = format!("{}-(c1|outsider)$", f.token);

    // Side by side, four at a time: each check is which processes a filter keeps and that
    // their samples end in their own leaf, whatever CPU share the recordings get.
    let cases: Vec<(Vec<&str>, Vec<&Contained>)> = vec![
        // --container: the short id, the full id, a shorter prefix, upper case; repeatable (OR).
        (vec!["--container", c1_short], vec![c1]),
        (vec!["--container", &f.d_id], vec![d]),
        (vec!["--container", &f.c2_id[..6]], vec![c2]),
        (vec!["--container", &c1_upper], vec![c1]),
        (vec!["--container", c1_short, "--container", d_short], vec![c1, d]),
        // --pod: both containers of the pod (dashed UID as the kubelet shows it).
        (vec!["--pod", &f.pod_uid], vec![c1, c2]),
        // --cgroup: prefixes of the paths in /proc/PID/cgroup.
        (vec!["--cgroup", &pod_cg], vec![c1, c2]),
        (vec!["--cgroup", &d_cg], vec![d]),
        (vec!["--cgroup", &outsider.cgroup], vec![outsider]),
        // --comm and --cmdline (regular expressions).
        (vec!["--comm", &c2_comm], vec![c2]),
        (vec!["--cmdline", &c1_or_outsider], vec![c1, outsider]),
        // Combined: AND, also with --pid.
        (vec!["--pod", &f.pod_uid, "--comm", &c1_comm], vec![c1]),
        (vec!["--cgroup", "/system.slice/", "--cmdline", &f.token], vec![d]),
        (vec!["--pid", &pid_c2, "--pod", &f.pod_uid], vec![c2]),
    ];
    side_by_side(&cases, 4, |(args, want)| check_filter(&f, args, want));
    let extra = format!("\n--- processes:{}", f.summary());
    check_no_match(
        &["--pod", &f.pod_uid, "--cgroup", "/system.slice/"],
        &format!("--pod {} --cgroup /system.slice/", f.pod_uid),
        &extra,
    );
    // --pid naming a process that the other filters exclude.
    check_error(
        &["--pid", &pid_outsider, "--container", c1_short],
        &format!("error: process {pid_outsider} does not match --container {c1_short}"),
        &extra,
    );
}

#[test]
fn filters_matching_nothing_are_a_clear_error() {
    // With Python processes in containers running, so that there is something not to match.
    let Some(f) = Fleet::start() else {
        return;
    };
    let extra = format!("\n--- processes:{}", f.summary());
    let id = random_hex(12);
    let uid = random_pod_uid();
    let cg = format!("/pyperch-no-such-{}.slice/", random_hex(8));
    let comm = format!("^nosuch{}$", random_hex(6));
    let cmdline = format!("no-such-{}", random_hex(8));
    let cases = [
        (
            vec!["--container", id.as_str()],
            format!("--container {id}"),
        ),
        (vec!["--pod", uid.as_str()], format!("--pod {uid}")),
        (vec!["--cgroup", cg.as_str()], format!("--cgroup {cg}")),
        (vec!["--comm", comm.as_str()], format!("--comm {comm}")),
        (
            vec!["--cmdline", cmdline.as_str()],
            format!("--cmdline {cmdline}"),
        ),
    ];
    // Side by side: each is an exit status and an error line.
    side_by_side(&cases, cases.len(), |(args, described)| check_no_match(args, described, &extra));
}

#[test]
fn unknown_cgroup_shapes_give_no_container_id() {
    let Some(py) = first_python(&NAMESPACED_PREFERENCE) else {
        return;
    };
    let mut cgroups = match Cgroups::new() {
        Ok(c) => c,
        Err(why) => {
            skip(format!("cannot create cgroups: {why}"));
            return;
        }
    };
    let token = format!("e2e{}", random_hex(10));
    let pod = random_pod_uid();
    // (cgroup path, the 64-hex-looking id it holds, the pod it may legitimately name)
    let mut shapes: Vec<(String, String, Option<String>)> = Vec::new();
    // containerd outside Kubernetes: `/<namespace>/<id>` is ambiguous, so not read.
    let id = random_hex(64);
    shapes.push((format!("/pyperch-e2e-{}/{id}", random_hex(8)), id, None));
    // One hex digit short.
    let id = random_hex(63);
    shapes.push((format!("/system.slice/docker-{id}.scope"), id, None));
    // Upper case is not an id a runtime writes.
    let id = random_hex(64).to_uppercase();
    shapes.push((format!("/system.slice/docker-{id}.scope"), id, None));
    // A runtime prefix nobody uses.
    let id = random_hex(64);
    shapes.push((format!("/system.slice/pyperchrt-{id}.scope"), id, None));
    // A pod slice whose container segment has no runtime prefix.
    let id = random_hex(64);
    shapes.push((
        format!("{}{id}.scope", kubepods_pod_cgroup(&pod)),
        id,
        Some(pod.clone()),
    ));

    let procs: Vec<Contained> = shapes
        .iter()
        .enumerate()
        .map(|(i, (cg, _, _))| {
            Contained::spawn(
                &py,
                &mut cgroups,
                cg,
                true,
                "spin.py",
                &[LEAVES[i % 3], "120"],
                &format!("{token}-{i}"),
            )
            .unwrap_or_else(|e| panic!("{e:#}"))
        })
        .collect();
    let summary: String = procs
        .iter()
        .map(|m| format!("\n    {}", m.describe()))
        .collect();

    // pyperch list: CONTAINER "-"; POD "-" or the right pod, never another.
    let run = pyperch(&["list"], std::time::Duration::from_secs(60));
    let d = format!("{}\n--- processes:{summary}", run.diag());
    assert!(run.success(), "pyperch list failed{d}");
    let rows = list_rows(&run.stdout);
    for (m, (cg, _, pod)) in procs.iter().zip(&shapes) {
        let row = rows
            .get(&m.host_pid)
            .unwrap_or_else(|| panic!("pyperch list does not show {}{d}", m.describe()));
        assert_eq!(row[1], "1", "NSPID of {}{d}", m.describe());
        assert_eq!(row[6], "-", "a container id for the cgroup {cg}{d}");
        assert!(
            row[7] == "-" || Some(&row[7]) == pod.as_ref(),
            "a wrong pod {} for the cgroup {cg}{d}",
            row[7]
        );
    }

    // Recording: each is `host`, and no container filter picks it.
    let rec = record(&[
        "--duration",
        "4",
        "--by-container",
        "--stats",
        "--cmdline",
        &token,
    ]);
    rec.assert_ok();
    let d = format!("{}\n--- processes:{summary}", rec.diag());
    for (i, m) in procs.iter().enumerate() {
        let mine: Vec<&Stack> = rec
            .profile
            .stacks
            .iter()
            .filter(|s| split_group(s).1.pid() == Some(m.host_pid))
            .collect();
        assert!(!mine.is_empty(), "no samples of {}{d}", m.describe());
        for st in mine {
            assert_eq!(
                st.frames[0],
                "host",
                "{} is attributed to a container{d}",
                m.describe()
            );
            assert!(
                split_group(st).1.has_function(LEAVES[i % 3]),
                "{}: wrong stack {}{d}",
                m.describe(),
                st.frames.join(";")
            );
        }
    }
    let extra = format!("\n--- processes:{summary}");
    for (_, id, _) in &shapes {
        let prefix = id[..12].to_lowercase();
        check_no_match(
            &["--container", &prefix, "--cmdline", &token],
            &format!("--container {prefix} --cmdline {token}"),
            &extra,
        );
    }
    drop(procs);
}
