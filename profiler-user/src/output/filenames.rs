//! Short file names for people: what a frame's file is called in flame graphs, collapsed
//! stacks, speedscope and Chrome traces (pprof keeps the full path in `Function.filename`).
//!
//! The short name of a file, first rule that applies:
//! 1. the part after the last `site-packages/` or `dist-packages/` directory
//!    (`requests/sessions.py`);
//! 2. the part after the standard library's directory, `lib/pythonX.Y/` (or `lib64/`,
//!    `X.Yt` for free-threaded builds): `json/decoder.py`;
//! 3. the path relative to the process's working directory when it lies below it;
//! 4. else the full path. Names that are not paths (`<frozen ...>`, `<string>`) stay as they are.

use std::{borrow::Cow, collections::HashMap, path::Path, sync::Arc};

use crate::sample::aggregate::{FrameId, FrameName, Profile};

/// The short name of `file` for a process whose working directory is `cwd` (as the process
/// sees it; `None` when unknown).
pub fn shorten<'a>(file: &'a str, cwd: Option<&str>) -> Cow<'a, str> {
    if !file.starts_with('/') {
        return Cow::Borrowed(file);
    }
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            let rest = &file[i + marker.len()..];
            if !rest.is_empty() {
                return Cow::Borrowed(rest);
            }
        }
    }
    if let Some(rest) = after_stdlib_dir(file) {
        return Cow::Borrowed(rest);
    }
    if let Some(cwd) = cwd.filter(|c| c.starts_with('/') && *c != "/") {
        if let Some(rest) = file.strip_prefix(cwd.trim_end_matches('/')).and_then(|r| r.strip_prefix('/')) {
            if !rest.is_empty() {
                return Cow::Borrowed(rest);
            }
        }
    }
    Cow::Borrowed(file)
}

/// The part of `file` after its last `/lib/pythonX.Y/` (or `/lib64/`, `X.Yt`) directory.
fn after_stdlib_dir(file: &str) -> Option<&str> {
    let mut best = None;
    for (i, _) in file.match_indices("/python") {
        let lib = &file[..i];
        if !(lib.ends_with("/lib") || lib.ends_with("/lib64")) {
            continue;
        }
        let tail = &file[i + "/python".len()..];
        let Some(slash) = tail.find('/') else { continue };
        let version = tail[..slash].strip_suffix('t').unwrap_or(&tail[..slash]);
        let mut parts = version.split('.');
        let numeric = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if numeric(parts.next()) && numeric(parts.next()) && parts.next().is_none() {
            let rest = &tail[slash + 1..];
            if !rest.is_empty() {
                best = Some(rest);
            }
        }
    }
    best
}

/// The working directory of process `pid` as the process sees it (without its root
/// directory when it is chrooted below ours); `None` when unreadable.
pub fn process_cwd(pid: u32) -> Option<String> {
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    let root = std::fs::read_link(format!("/proc/{pid}/root")).ok();
    let cwd = cwd.to_str()?;
    match root.as_deref().and_then(Path::to_str) {
        Some(root) if root != "/" && !root.is_empty() => match cwd.strip_prefix(root) {
            Some("") => Some("/".to_owned()),
            Some(rest) if rest.starts_with('/') => Some(rest.to_owned()),
            _ => Some(cwd.to_owned()),
        },
        _ => Some(cwd.to_owned()),
    }
}

/// `profile` with every frame's file shortened for its process (see the module docs).
/// Frames that become equal merge; counts, labels and timing are kept.
pub fn with_short_names(profile: &Profile) -> Profile {
    let mut short = profile.empty_like();
    // (the process's working directory, original frame) → frame in `short`
    let mut mapped: HashMap<(Option<Arc<str>>, FrameId), FrameId> = HashMap::new();
    let mut cwds: HashMap<u32, Option<Arc<str>>> = HashMap::new();
    for pid in profile.pids() {
        if let Some(label) = profile.process(pid) {
            short.set_process(pid, label.clone());
        }
    }
    let mut frames = Vec::new();
    for (key, count, events) in profile.stacks_with_events() {
        let cwd = cwds
            .entry(key.pid)
            .or_insert_with(|| profile.process(key.pid).and_then(|l| l.cwd.as_deref()).map(Arc::from))
            .clone();
        frames.clear();
        for &id in key.frames.iter() {
            let new = *mapped.entry((cwd.clone(), id)).or_insert_with(|| {
                let frame = profile.frame(id);
                let file = match shorten(&frame.file, cwd.as_deref()) {
                    Cow::Borrowed(f) if f.len() == frame.file.len() => frame.file.clone(),
                    f => Arc::from(f.as_ref()),
                };
                short.intern(FrameName { function: frame.function.clone(), file, line: frame.line, native: frame.native.clone() })
            });
            frames.push(new);
        }
        short.add_weighted(key.pid, key.tid, &frames, count, events);
    }
    if let Some(timeline) = profile.timeline() {
        let remap = |pid: u32, id: FrameId| {
            let cwd = profile.process(pid).and_then(|l| l.cwd.as_deref()).map(Arc::from);
            mapped.get(&(cwd, id)).copied()
        };
        short.set_timeline(timeline.remapped(remap));
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_in_order() {
        let s = |f: &str, cwd: Option<&str>| shorten(f, cwd).into_owned();
        assert_eq!(s("/srv/venv/lib/python3.12/site-packages/requests/api.py", None), "requests/api.py");
        assert_eq!(s("/usr/lib/python3/dist-packages/yaml/__init__.py", Some("/usr")), "yaml/__init__.py");
        assert_eq!(s("/usr/lib/python3.12/json/decoder.py", None), "json/decoder.py");
        assert_eq!(s("/root/.pyenv/versions/3.9.18/lib/python3.9/threading.py", None), "threading.py");
        assert_eq!(s("/opt/py/lib64/python3.13t/asyncio/tasks.py", None), "asyncio/tasks.py");
        assert_eq!(s("/home/me/app/server.py", Some("/home/me")), "app/server.py");
        assert_eq!(s("/home/me/app/server.py", Some("/home/me/")), "app/server.py");
        assert_eq!(s("/home/meow/server.py", Some("/home/me")), "/home/meow/server.py");
        assert_eq!(s("/home/me/app/server.py", Some("/")), "/home/me/app/server.py");
        assert_eq!(s("/home/me/app/server.py", None), "/home/me/app/server.py");
        assert_eq!(s("<frozen importlib._bootstrap>", Some("/")), "<frozen importlib._bootstrap>");
        // Not a standard library directory.
        assert_eq!(s("/srv/lib/pythonic/x.py", None), "/srv/lib/pythonic/x.py");
        assert_eq!(s("/srv/lib/python3.12/", None), "/srv/lib/python3.12/");
        assert_eq!(s("/srv/site-packages/", None), "/srv/site-packages/");
    }

    #[test]
    fn profile_frames_merge_per_process() {
        use crate::sample::aggregate::ProcessLabel;
        let mut p = Profile::new();
        let frame = |p: &mut Profile, file: &str| {
            p.intern(FrameName { function: Arc::from("f"), file: Arc::from(file), line: 1, native: None })
        };
        let a = frame(&mut p, "/a/lib/python3.12/site-packages/m.py");
        let b = frame(&mut p, "/b/lib/python3.12/site-packages/m.py");
        let c = frame(&mut p, "/w/app.py");
        p.set_process(1, ProcessLabel { comm: "py".into(), cwd: Some("/w".into()), ..Default::default() });
        p.add(1, None, &[c, a], 2);
        p.add(1, None, &[c, b], 3);
        p.add(2, None, &[c], 1);
        let short = with_short_names(&p);
        let mut stacks: Vec<(u32, Vec<String>, u64)> = short
            .stacks()
            .map(|(k, n)| (k.pid, k.frames.iter().map(|&id| short.frame(id).file.to_string()).collect(), n))
            .collect();
        stacks.sort();
        assert_eq!(
            stacks,
            vec![(1, vec!["app.py".into(), "m.py".into()], 5), (2, vec!["/w/app.py".into()], 1)]
        );
        assert_eq!(short.total_samples(), 6);
    }
}
