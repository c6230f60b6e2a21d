//! The outputs of `pyperch dump`: text for people (target text escaped, see `text`) and JSON
//! for scripts (the `ProcessDump` structure as is). [`write_text`] and [`write_json`] stream
//! to a writer, thread by thread: the output is never held whole in memory (a dump of
//! hundreds of thousands of frames writes as much text as that, but holds one thread's).

use std::collections::HashMap;
use std::fmt::Write;
use std::io;

use super::{Activity, ProcessDump, ThreadDump};
use crate::target::asyncio::TaskInfo;
use crate::text::field;

/// The dump as text: a header line, then each thread (main thread first) with its Python
/// stack from the root to the innermost frame, locals indented under their frame.
pub fn text(dump: &ProcessDump) -> String {
    let mut out = Vec::new();
    let _ = write_text(dump, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// [`text`], written to `sink` a thread at a time.
pub fn write_text(dump: &ProcessDump, sink: &mut impl io::Write) -> io::Result<()> {
    let mut out = String::new();
    let python = dump.threads.iter().filter(|t| t.python).count();
    let gil = match dump.gil_holder {
        Some(tid) => format!("GIL held by thread {tid}"),
        None => "no thread holds the GIL".into(),
    };
    let _ = writeln!(
        out,
        "Process {} ({}), Python {}: {} threads ({python} running Python), {gil}",
        dump.pid,
        field(&dump.command),
        dump.python_version,
        dump.threads.len(),
    );
    if dump.threads_ended > 0 {
        let _ = writeln!(out, "({} threads ended while the dump was taken and are not shown)", dump.threads_ended);
    }
    if dump.stacks_not_shown > 0 {
        let _ = writeln!(out, "({} stacks not shown: {})", dump.stacks_not_shown, super::over_budget_problem());
    }
    for thread in &dump.threads {
        out.push('\n');
        thread_text(&mut out, thread);
        sink.write_all(out.as_bytes())?;
        out.clear();
    }
    if let Some(tasks) = &dump.tasks {
        tasks_text(&mut out, tasks);
    }
    sink.write_all(out.as_bytes())
}

/// `--async`: every task, root tasks first, each with who awaits it and where it waits.
fn tasks_text(out: &mut String, tasks: &[TaskInfo]) {
    let _ = writeln!(out, "\nasyncio tasks: {}", tasks.len());
    // By address, so that each "awaited by" is one look-up (a task list of n tasks renders
    // in O(n log n), not O(n^2)).
    let by_address: HashMap<u64, &TaskInfo> = tasks.iter().map(|t| (t.address, t)).collect();
    let name_of = |address: u64| -> String {
        match by_address.get(&address) {
            Some(t) => format!("task {}", field(&t.name)),
            None => format!("task at {address:#x}"),
        }
    };
    let mut ordered: Vec<&TaskInfo> = tasks.iter().collect();
    ordered.sort_by_key(|t| (!t.awaited_by.is_empty(), t.address));
    for task in ordered {
        let awaited = if task.awaited_by.is_empty() {
            "not awaited by a task".to_string()
        } else {
            format!("awaited by {}", task.awaited_by.iter().map(|a| name_of(*a)).collect::<Vec<_>>().join(", "))
        };
        let _ = writeln!(out, "\n  task {} ({awaited})", field(&task.name));
        if let Some(tid) = task.running_on {
            let _ = writeln!(out, "    running on thread {tid}");
        } else if !task.settled {
            let _ = writeln!(out, "    (its coroutine chain changed while it was read: not shown)");
        } else {
            for frame in &task.suspended_at {
                let _ = writeln!(out, "    suspended in {} ({}:{})", field(&frame.function), field(&frame.file), frame.line);
            }
        }
    }
}

fn activity(thread: &ThreadDump) -> String {
    let kernel = &thread.kernel;
    let mut s = match kernel.activity {
        Activity::Running => "running".to_string(),
        Activity::Sleeping => "sleeping".to_string(),
        Activity::Waiting => "waiting".to_string(),
        Activity::Stopped => "stopped".to_string(),
        Activity::Dead => "exited".to_string(),
        Activity::Unknown => format!("in state {}", field(&kernel.state)),
    };
    match (&kernel.waiting_on, &kernel.syscall) {
        (Some(what), _) => {
            let _ = write!(s, " on {what}");
        }
        (None, Some(call)) => {
            let _ = write!(s, " in {call}");
        }
        (None, None) => {}
    }
    if let Some(wchan) = kernel.wchan.as_deref().filter(|_| kernel.activity != Activity::Running) {
        let _ = write!(s, " [kernel: {}]", field(wchan));
    }
    s
}

fn thread_text(out: &mut String, thread: &ThreadDump) {
    let mut head = format!("Thread {} \"{}\"", thread.tid, field(&thread.name));
    if thread.main {
        head.push_str(" (main)");
    }
    let _ = write!(out, "{head}: {}", activity(thread));
    if thread.holds_gil {
        out.push_str(", holds the GIL");
    }
    if thread.handling_exception == Some(true) {
        out.push_str(", handling an exception");
    }
    out.push('\n');
    if !thread.python {
        out.push_str("    (no Python thread state: a native thread)\n");
        return;
    }
    if let Some(problem) = &thread.problem {
        let _ = writeln!(out, "    (stack not shown: {})", field(problem));
    }
    let Some(stack) = &thread.stack else { return };
    if stack.is_empty() {
        out.push_str("    (no Python frames: idle or in C code)\n");
    }
    if thread.truncated {
        let _ = writeln!(out, "    ... (deeper than {} frames: the root end is cut)", super::stack::MAX_FRAMES);
    }
    for frame in stack {
        let line = frame.line.map_or_else(|| "?".to_string(), |l| l.to_string());
        let _ = writeln!(out, "    {} ({}:{line})", field(&frame.function), field(&frame.file));
        for local in frame.locals.iter().flatten() {
            let _ = writeln!(out, "        {} = {}", field(&local.name), field(&local.value.value));
        }
    }
}

/// The dump as one JSON document.
pub fn json(dump: &ProcessDump) -> String {
    serde_json::to_string_pretty(dump).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// [`json`], streamed to `sink` (followed by a newline).
pub fn write_json(dump: &ProcessDump, sink: &mut impl io::Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *sink, dump).map_err(io::Error::other)?;
    sink.write_all(b"\n")
}
