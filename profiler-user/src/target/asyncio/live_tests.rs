//! `AsyncReader::list_tasks` against real 3.14 and 3.15 interpreters (Debian sid root, run
//! under chroot; skipped with a message when absent): a root task awaits task A, which
//! gathers B1 and B2; B1 awaits C, which sleeps; B2 sleeps. Every task must be listed with
//! its awaiters and where its coroutine chain is suspended.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

const SID: &str = "/root/.cache/pyperch/sid-rootfs";
const SCRIPT: &str = r#"
import asyncio
async def c_sleep():
    # Every await of the chain is in place once this runs a second step: main awaits A,
    # A gathers, B1 awaits C.
    await asyncio.sleep(0.2)
    print("ready", flush=True)
    await asyncio.sleep(60)
async def b1():
    await asyncio.create_task(c_sleep(), name="C")
async def b2_inner():
    await asyncio.sleep(60)
async def b2():
    await b2_inner()
async def a():
    await asyncio.gather(asyncio.create_task(b1(), name="B1"), asyncio.create_task(b2(), name="B2"))
async def main():
    await asyncio.create_task(a(), name="A")
asyncio.run(main())
"#;

/// Kills the child when dropped.
pub(super) struct Guard(pub(super) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `script` under sid's `python3.<minor>` (chrooted), waits for its "ready" line and a
/// moment more (printed by a running task: time to suspend again), and inspects the process;
/// `None` (said on stderr) when that interpreter is absent or the test does not run as root.
pub(super) fn start_sid(minor: u32, script: &str) -> Option<(Guard, PythonProcess)> {
    let python = format!("/usr/bin/python3.{minor}");
    if !Path::new(SID).join(&python[1..]).exists() || !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: {SID}{python} is absent (or not root)");
        return None;
    }
    let mut child = Guard(
        Command::new("chroot").args([SID, &python, "-c", script]).stdout(Stdio::piped()).spawn().expect("spawn chroot"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().expect("piped")).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let process = loop {
        match discovery::inspect(pid) {
            Ok(p) => break p,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Some((child, process))
}

fn tasks_of(minor: u32) {
    let Some((_child, process)) = start_sid(minor, SCRIPT) else { return };
    let pid = process.pid;
    let reader = AsyncReader::new(&process).expect("asyncio reader");
    let tasks = reader.list_tasks(&ProcessMemory::new(pid)).expect("tasks");
    let by_name = |name: &str| tasks.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no task {name}: {tasks:#?}"));
    let (root, a, b1, b2, c) = (by_name("Task-1"), by_name("A"), by_name("B1"), by_name("B2"), by_name("C"));
    assert_eq!(tasks.len(), 5, "{tasks:#?}");
    assert!(root.awaited_by.is_empty());
    assert_eq!(a.awaited_by, [root.address]);
    assert_eq!(b1.awaited_by, [a.address]);
    assert_eq!(b2.awaited_by, [a.address]);
    assert_eq!(c.awaited_by, [b1.address]);
    let names = |t: &TaskInfo| t.suspended_at.iter().map(|f| f.function.clone()).collect::<Vec<_>>();
    assert!(tasks.iter().all(|t| t.settled && t.running_on.is_none()), "{tasks:#?}");
    assert_eq!(names(a), ["a"]);
    assert_eq!(names(b1), ["b1"]);
    assert_eq!(names(b2), ["b2", "b2_inner", "sleep"], "{b2:#?}");
    assert_eq!(names(c), ["c_sleep", "sleep"]);
    assert!(b2.suspended_at[1].file.ends_with("<string>") && b2.suspended_at[1].line == 12, "{b2:#?}");
}

#[test]
fn list_tasks_sid_3_14() {
    tasks_of(14);
}

#[test]
fn list_tasks_sid_3_15() {
    tasks_of(15);
}
