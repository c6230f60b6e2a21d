"""The kernel program's cost, part by part, and what pyperch costs on an idle host.

Two sections of the benchmark (`--only parts,idlehost`); the children, log and helpers are the
package's own (`children`, `common`, `measurement`).

`parts`: BPF_PROG_TEST_RUN cannot run perf-event programs, so the sampling program is timed
where it runs: pyperch `--pid` samples a busy workload of known depth at a high rate (per-task
events: the program runs only on the target's thread), and the kernel's own statistics
(`kernel.bpf_stats_enabled`: `run_time_ns` and `run_cnt` of the perf-event program, from
`/proc/PID/fdinfo`) give the mean time per run over a steady window. The same run is repeated
with the program stopped after each part (`PYPERCH_BENCH_STOP_AFTER`, frozen into the
program at load time, test-only: registration, thread-state, full-frames, tail, and the whole
program with the output); each part's cost is the difference of two neighbouring means. The
stops are interleaved over the repetitions, and medians are taken.

`idlehost`: the early exit for an unregistered process (pyperch watching an idle process with
one event per CPU: every run on the busy CPUs finds an unregistered process), and a steady
whole-host recording with 50 idle Python processes and nothing busy: pyperch's userspace CPU
per second, the BPF time per second, and the early exits' share of it.
"""
import os
import subprocess
import time
from .children import kill_tree, reap, spawn
from .common import WORK, log
from .measurement import bpf_fdinfo, bpf_progs, sched_ns
from .peers import parse_tool_stderr
from .figures import fmt, median, pct
from .workloads import Target

# The parts in program order: (name of the stop, label). "none" is the whole program.
STOPS = [("registration", "registration lookup"), ("thread-state", "thread-state lookup"),
         ("full-frames", "full frames"), ("tail", "hashed tail"), ("none", "output (ring buffer)")]
# Targets: (label, workload, args, depth at the leaf, what its frames are).
PART_TARGETS = [
    ("recursion 5", "recursion", [5], 5, "5 frames"),
    ("chain 34", "chain", [], 34, "34 frames, 34 distinct code objects"),
    ("recursion 300", "recursion", [300], 300, "300 frames, one code object below the top 4"),
]
PERF_EVENT_PROG_TYPE = 7  # BPF_PROG_TYPE_PERF_EVENT, as fdinfo prints it
PARTS_RATE = 10000
IDLE_PROCESSES = 50


def perf_prog_stats(pid):
    """(run_time_ns, run_cnt) of the perf-event programs pid holds, or None."""
    progs = [v for v in bpf_progs(pid).values() if v[0] == PERF_EVENT_PROG_TYPE]
    return (sum(v[1] for v in progs), sum(v[2] for v in progs)) if progs else None


def links_of(pid):
    found = bpf_fdinfo(pid)
    return found[1] if found else 0


def windowed_run(bench, argv, duration, env_extra=None, tag="run"):
    """Runs pyperch (argv), waits until it has attached, and measures its perf-event
    program and its own CPU over the steady window (warm-up and tail as the driver's).
    Returns a dict with the window's numbers and the parsed `--stats`."""
    bench.run_counter += 1
    rid = "%03d-walkparts-%s" % (bench.run_counter, tag)
    env = dict(os.environ)
    env.update(env_extra or {})
    err_path = os.path.join(WORK, "logs", rid + ".err")
    with open(err_path, "w") as err:
        t_launch = time.monotonic()
        p = spawn(argv, stdout=err, stderr=subprocess.STDOUT, env=env)
    t0 = t_launch
    while time.monotonic() - t_launch < 60:
        if perf_prog_stats(p.pid) and links_of(p.pid) > 0:
            t0 = time.monotonic()
            break
        if p.poll() is not None:
            break
        time.sleep(0.01)
    marks = {}
    for name, at in (("w0", t0 + bench.o.warm), ("w1", t0 + duration - bench.o.tail)):
        while time.monotonic() < at and p.poll() is None:
            time.sleep(0.01)
        marks[name] = (time.monotonic(), perf_prog_stats(p.pid), sched_ns(p.pid))
    last = perf_prog_stats(p.pid)
    while p.poll() is None:
        last = perf_prog_stats(p.pid) or last
        time.sleep(0.05)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        p.wait(timeout=5)
    reap(p)
    with open(err_path, errors="replace") as f:
        text = f.read()
    run = {"id": rid, "argv": argv, "env": env_extra or {}, "exit_code": p.returncode,
           "info": parse_tool_stderr("pyperch", text), "bpf_total": last}
    (ta, ba, ca), (tb, bb, cb) = marks["w0"], marks["w1"]
    if ba and bb and tb > ta:
        run["window_s"] = tb - ta
        run["bpf_ns"] = bb[0] - ba[0]
        run["bpf_runs"] = bb[1] - ba[1]
        run["ns_per_run"] = run["bpf_ns"] / run["bpf_runs"] if run["bpf_runs"] else None
        run["cpu_s"] = (cb - ca) / 1e9 if ca is not None and cb is not None else None
    if p.returncode != 0:
        log("warning: pyperch exited with %s; see %s" % (p.returncode, err_path))
    return run


def pyperch_argv(bench, rate, duration, pid=None, subprocesses=False, output=os.devnull):
    argv = [bench.o.pyperch, "record", "--rate", str(rate), "--duration", str(duration),
            "--format", "collapsed", "--output", output, "--stats"]
    if pid is not None:
        argv[2:2] = ["--pid", str(pid)] + (["--subprocesses"] if subprocesses else [])
    return argv


def sec_parts(bench, interp):
    """Per-part cost of the sampling program on targets of known depth."""
    o = bench.o
    reps = max(1, o.reps)
    out = []
    for label, workload, args, depth, what in PART_TARGETS:
        log("parts: %s on %s, pyperch --pid at %d Hz, %d repetition(s) of %d stops" % (
            label, interp.label, PARTS_RATE, reps, len(STOPS)))
        target = Target(interp, workload, args)
        row = {"label": label, "workload": workload, "depth": depth, "what": what, "runs": {s: [] for s, _ in STOPS}}
        try:
            time.sleep(0.5)
            for r in range(reps):
                k = r % len(STOPS)
                for stop, _ in STOPS[k:] + STOPS[:k]:
                    out_path = os.path.join(WORK, "out", "parts-%s-%s-%d.txt" % (workload, stop, r)) if stop == "none" else os.devnull
                    run = windowed_run(bench, pyperch_argv(bench, PARTS_RATE, o.duration, pid=target.pid, output=out_path),
                                       o.duration, {"PYPERCH_BENCH_STOP_AFTER": stop}, tag="%s%d-%s" % (workload, depth, stop))
                    row["runs"][stop].append(run)
                    log("  %-13s %-12s %s ns per run (%s runs)" % (label, stop, fmt(run.get("ns_per_run"), 0), run.get("bpf_runs")))
                    if not target.alive():
                        raise RuntimeError("workload %s died" % workload)
        finally:
            target.stop()
        row["ns_per_run"] = {s: median([x.get("ns_per_run") for x in row["runs"][s]]) for s, _ in STOPS}
        # Frames per sample the kernel walked: from the complete runs' --stats.
        frames = []
        for x in row["runs"]["none"]:
            i = x["info"]
            if i.get("samples") and "frames_kernel" in i:
                frames.append((i["frames_kernel"] + i.get("frames_cache", 0) + i.get("frames_memory", 0)) / i["samples"])
                row["full_per_sample"] = i["frames_kernel"] / i["samples"]
        row["frames_per_sample"] = median(frames)
        out.append(row)
    bench.results["walk_parts"] = out


def part_costs(row):
    """The parts of one target: [(stop, ns)], each the difference of neighbouring stops."""
    ns = row["ns_per_run"]
    costs, prev = [], 0.0
    for stop, _ in STOPS:
        v = ns.get(stop)
        costs.append((stop, None if v is None else v - prev))
        prev = v if v is not None else prev
    return costs


def sec_idlehost(bench, interp, idle_interps):
    o = bench.o
    res = {}
    helper = Target(interp, "idle")
    try:
        time.sleep(0.5)
        log("idle host: the early exit (pyperch watching one idle process, one event per CPU, %d Hz)" % PARTS_RATE)
        run = windowed_run(bench, pyperch_argv(bench, PARTS_RATE, o.duration, pid=helper.pid, subprocesses=True),
                           o.duration, tag="earlyexit")
        res["early_exit"] = run
        log("  early exit: %s ns per run (%s runs, %s of them of the registered idle process)" % (
            fmt(run.get("ns_per_run"), 0), run.get("bpf_runs"), run["info"].get("kernel_samples")))
    finally:
        helper.stop()
    idle = []
    try:
        while len(idle) < IDLE_PROCESSES:
            idle.append(Target(idle_interps[len(idle) % len(idle_interps)], "idle"))
        time.sleep(1.0)
        log("idle host: pyperch whole host at 1000 Hz with %d idle Python processes" % IDLE_PROCESSES)
        duration = 2 * o.duration
        run = windowed_run(bench, pyperch_argv(bench, 1000, duration), duration, tag="idlehost")
        res["idle_host"] = run
        info = run["info"]
        if run.get("window_s"):
            run["user_ms_per_s"] = 1e3 * run["cpu_s"] / run["window_s"] if run.get("cpu_s") is not None else None
            run["bpf_ms_per_s"] = run["bpf_ns"] / 1e6 / run["window_s"]
            run["runs_per_s"] = run["bpf_runs"] / run["window_s"]
        total = run.get("bpf_total")
        early = res["early_exit"].get("ns_per_run")
        if total and total[1] and early is not None and "kernel_samples" in info:
            exits = max(0, total[1] - info["kernel_samples"])
            run["early_exits"] = exits
            run["early_exit_share"] = min(1.0, exits * early / total[0]) if total[0] else None
        log("  %s ms/s userspace CPU, %s ms/s BPF (%s runs/s), early exits %s%% of the BPF time; registered %s" % (
            fmt(run.get("user_ms_per_s"), 2), fmt(run.get("bpf_ms_per_s"), 2), fmt(run.get("runs_per_s"), 0),
            fmt(pct(run.get("early_exit_share")), 1), info.get("registered")))
    finally:
        for t in idle:
            t.stop()
    bench.results["idle_host"] = res


def report(rep):
    """The sections' Markdown lines (empty when neither ran)."""
    r = rep.r
    lines = []

    def w(s=""):
        lines.append(s)
    parts = r.get("walk_parts")
    if parts:
        w("## The kernel program, part by part")
        w()
        w("BPF_PROG_TEST_RUN cannot run perf-event programs, so the sampling program is timed where it runs: pyperch `--pid` samples a busy workload of known depth at %d Hz (per-task events: the program runs only on the target's thread), and the kernel's statistics (`kernel.bpf_stats_enabled`: `run_time_ns` ÷ `run_cnt` of the perf-event program) give the mean time per run over the steady window. The run is repeated with the program stopped after each part (`PYPERCH_BENCH_STOP_AFTER`, frozen into the program at load time, test-only); a part's cost is the difference between the means with and without it. Stops interleaved, medians of %d repetitions; CPython %s. The run-time statistics add their own clock readings to every run (in the registration row)." % (
            PARTS_RATE, max(1, rep.b.o.reps), rep.meta["python_main"]))
        w()
        w("| part (ns per sample) | " + " | ".join("%s (%s)" % (row["label"], row["what"]) for row in parts) + " |")
        w("|---|" + "---:|" * len(parts))
        costs = [dict(part_costs(row)) for row in parts]
        for stop, label in STOPS:
            w("| %s | %s |" % (label, " | ".join(fmt(c.get(stop), 0) for c in costs)))
        w("| **whole program** | %s |" % " | ".join("**%s**" % fmt(row["ns_per_run"].get("none"), 0) for row in parts))
        per = []
        for row, c in zip(parts, costs):
            fs = row.get("frames_per_sample") or row["depth"]
            full = min(fs, 64)
            f = c.get("full-frames")
            t = c.get("tail")
            s = "%s per full frame (%s frames)" % (fmt(f / full if f is not None and full else None, 0), fmt(full, 1))
            if fs > 64 and t is not None:
                s += ", %s per hashed frame (%s)" % (fmt(t / (fs - 64), 0), fmt(fs - 64, 1))
            per.append(s)
        w("| per frame (ns) | %s |" % " | ".join(per))
        w()
        w("Frames per sample are the mean the kernel walked in the complete runs (`--stats`: frames from kernel, cache and memory ÷ samples).")
        w()
    ih = r.get("idle_host")
    if ih:
        ee = ih.get("early_exit") or {}
        run = ih.get("idle_host") or {}
        info = run.get("info", {})
        w("## An idle host: the early exit and the fixed cost")
        w()
        w("The early exit for an unregistered process: pyperch watching one idle Python process with one event per CPU (`--pid PID --subprocesses`) at %d Hz, so every run finds an unregistered process (or the idle task) and returns. Then a steady whole-host recording (no `--pid`) at 1 kHz with %d idle Python processes (spread over the pyenv interpreters) and nothing busy of ours: pyperch's own CPU per second of the steady window, the BPF time per second, and the share of the BPF time the early exits take (runs that were not samples of a registered process × the early exit's cost ÷ all BPF time, over the whole run)." % (PARTS_RATE, IDLE_PROCESSES))
        w()
        w("| | |")
        w("|---|---|")
        w("| early exit, per run | **%s ns** (%s runs) |" % (fmt(ee.get("ns_per_run"), 0), ee.get("bpf_runs")))
        w("| idle host: Python processes registered | %s |" % info.get("registered"))
        w("| idle host: pyperch userspace CPU | **%s ms per second** (%s%% of one CPU) |" % (
            fmt(run.get("user_ms_per_s"), 2), fmt((run.get("user_ms_per_s") or 0) / 10, 2)))
        w("| idle host: BPF time | %s ms per second in %s runs per second |" % (fmt(run.get("bpf_ms_per_s"), 3), fmt(run.get("runs_per_s"), 0)))
        w("| idle host: samples of registered processes | %s of %s runs |" % (info.get("kernel_samples"), (run.get("bpf_total") or [None, None])[1]))
        w("| idle host: early exits' share of the BPF time | **%s%%** |" % fmt(pct(run.get("early_exit_share")), 1))
        w()
    return lines
