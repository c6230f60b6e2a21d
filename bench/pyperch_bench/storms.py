"""The `storms` section of the benchmark (`--only storms`, issue #33): pyperch's cost held
under `--max-cpu 2` (the agent's default budget) while the host does what makes an unbounded
profiler's cost follow it, beside an unbudgeted pyperch and py-spy where py-spy can run it.

Storms (CPython 3.12 unless --python says otherwise):
- wall: `switch_threads.py`, 500 threads each sleeping 500 us in a loop (asking for 2,000
  switches a second each; the table says how many the machine gave), `--mode wall --pid P
  --subprocesses` (one perf event per CPU, as the agent and a whole-host recording have);
  py-spy `--idle` beside it;
- non-Python: `dd bs=1 | cat` (every one-byte write wakes the reader) beside the chain
  workload, pyperch `--mode wall` on the whole host; py-spy cannot profile a non-Python
  process (and has no whole-host mode);
- churn: `short_lived.py`, 1,000 short Python processes a minute, pyperch on the whole host
  (no `--pid`: each process is discovered as it starts); py-spy has no whole-host mode;
- cpu: `many_threads.py`, 500 CPU-bound threads (py-spy #872's shape), `--pid P
  --subprocesses` at 10 kHz; then unbudgeted, `--pid` alone at 10 kHz (one perf event per
  thread: the kernel switches each thread's event in and out at its every context switch, and
  CPython's GIL waiters wake every 5 ms), and `--pid P --subprocesses` at 100 Hz beside py-spy
  (default, pausing) at its default 100 Hz.
Every storm keeps one workload running and alternates unprofiled windows with the profiled
runs (budgeted pyperch, unbudgeted pyperch, py-spy), so each run has an unprofiled window
just before and after it. The profiler's CPU is measured from outside over the steady window
(its threads' schedstat, ended threads included up to their last poll, plus the run time of
its BPF programs from fdinfo), its peak RSS by polling VmHWM.

Then two rows: pyperch's CPU per sample with the same work in 8 and 500 threads at the same
rate, and the wall time of `pyperch dump --json` of the 500-thread process.
"""
import json
import os
import re
import signal
import statistics
import struct
import subprocess
import time

from .children import kill_tree, reap, sh, spawn
from .common import WORK, log
from .figures import fmt, pct
from .measurement import bpf_progs, ctx_switches, sched_ns, vm_hwm_kb
from .workloads import Target

BUDGET = 2
BASE_S = 2.0
# Budgeted runs: the controller measures every second; its first seconds are the settling.
BUDGETED = {"duration": 13.0, "warm": 5.0}
OTHER = {"duration": 8.0, "warm": 1.5}
TAIL = 0.5


def thread_ns(pid):
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


class CountedTarget(Target):
    """A workload whose threads keep their units of work in a shared file (SNAPSHOT.counts,
    one 8-byte counter per thread) instead of answering SIGUSR1: with 500 CPU-bound threads
    the main thread can wait seconds for the GIL, and a signal handler with it."""

    def snapshot(self, timeout=5.0):
        try:
            with open(self.snap + ".counts", "rb") as f:
                data = f.read()
        except OSError:
            return None
        iters = sum(struct.unpack("<%dq" % (len(data) // 8), data[:len(data) // 8 * 8]))
        return {"t": time.monotonic(), "iters": iters, "cpu": {}, "cpu_ns": sched_ns(self.pid), "switches": ctx_switches(self.pid)}


class SwitchStorm(object):
    """`dd bs=1 | cat`: a non-Python context-switch storm; its units of work are the two
    processes' context switches."""
    name = "dd|cat"

    def __init__(self):
        self.proc = spawn(["sh", "-c", "dd if=/dev/zero bs=1 count=20000000000 status=none | cat > /dev/null"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        self.pids = [int(x) for x in sh("pgrep -P %d" % self.proc.pid).split()]

    def snapshot(self):
        return {"t": time.monotonic(), "iters": sum(ctx_switches(p) or 0 for p in self.pids)}

    def stop(self):
        kill_tree(self.proc)
        self.proc.wait()
        reap(self.proc)


def shares(path, fa, fb, pid=None):
    """(share of fa, share of fb) among the samples (or weights) holding either, in a
    collapsed / raw file; only process pid's stacks where pid is given and the file names
    processes (pyperch's `(pid N)` frame)."""
    a = b = 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                stack, _, n = line.rstrip("\n").rpartition(" ")
                if not stack:
                    continue
                try:
                    n = int(n)
                except ValueError:
                    continue
                frames = stack.split(";")
                if pid is not None:
                    m = re.search(r"\(pid (\d+)\)", frames[0])
                    if m and int(m.group(1)) != pid:
                        continue
                names = {fr.split(" (", 1)[0].rsplit(".", 1)[-1] for fr in frames}
                if fa in names:
                    a += n
                elif fb in names:
                    b += n
    except OSError:
        return None
    return (a / (a + b), b / (a + b)) if a + b else None


def throughput(s0, s1, storm):
    """Units of work per second between two snapshots; for the churn storm, 1 / the mean
    lifetime of the children that ended in between."""
    if not s0 or not s1 or s1["t"] <= s0["t"]:
        return None
    if storm == "churn":
        n = s1["iters"] - s0["iters"]
        life = s1["cpu"].get("lifetime_s", 0) - s0["cpu"].get("lifetime_s", 0)
        return n / life if n > 0 and life > 0 else None
    return (s1["iters"] - s0["iters"]) / (s1["t"] - s0["t"])


def measured_run(argv, target, duration, warm, out, pyperch):
    """Runs a profiler; its CPU (threads + BPF), peak RSS and the target's throughput over the
    steady window [warm, duration - TAIL] after sampling began."""
    err_path = out + ".err"
    with open(err_path, "w") as err:
        t_launch = time.monotonic()
        p = spawn(argv, stdout=err, stderr=subprocess.STDOUT)
    t0 = t_launch
    if pyperch:
        while time.monotonic() - t_launch < 60 and p.poll() is None:
            if any(l.startswith("bpf_link") or l == "[perf_event]" for l in fd_links(p.pid)):
                break
            time.sleep(0.01)
        t0 = time.monotonic()
    w0_at, w1_at = t0 + warm, t0 + duration - TAIL
    hwm, last, first, bpf, snaps, marks = 0, {}, None, {}, {}, {}
    interrupted = None
    while p.poll() is None:
        now = time.monotonic()
        ns = thread_ns(p.pid) or {}
        if first is not None and "w1" not in marks:
            last.update(ns)
        hwm = max(hwm, vm_hwm_kb(p.pid) or 0)
        if first is None and now >= w0_at:
            first, last = dict(ns), dict(ns)
            marks["w0"] = now
            bpf["w0"] = bpf_progs(p.pid) if pyperch else {}
            snaps["w0"] = target.snapshot()
        elif first is not None and "w1" not in marks and now >= w1_at:
            marks["w1"] = now
            bpf["w1"] = bpf_progs(p.pid) if pyperch else {}
            snaps["w1"] = target.snapshot()
        if not pyperch and not interrupted and now > t_launch + duration + 3:
            # py-spy takes rate x duration samples and keeps going when it cannot keep up;
            # Ctrl-C makes it write what it has.
            os.kill(p.pid, signal.SIGINT)
            interrupted = now
        if now > t_launch + duration + 60:
            kill_tree(p)
        time.sleep(0.1)
    p.wait()
    reap(p)
    with open(err_path, errors="replace") as f:
        err_text = f.read()
    row = {"argv": " ".join(argv[1:]), "exit": p.returncode, "peak_rss_mb": hwm / 1024.0 if hwm else None,
           "wall_s": time.monotonic() - t_launch, "interrupted": bool(interrupted)}
    if p.returncode != 0:
        log("storms: %s exited with %s: %s" % (os.path.basename(argv[0]), p.returncode, err_text.strip()[-300:]))
    if "w1" in marks:
        secs = marks["w1"] - marks["w0"]
        user = sum(v - first.get(k, 0) for k, v in last.items()) / 1e9
        b0, b1 = bpf["w0"], bpf["w1"]
        bpf_s = sum(b1[i][1] - b0.get(i, (0, 0, 0))[1] for i in b1) / 1e9
        runs = sum(b1[i][2] - b0.get(i, (0, 0, 0))[2] for i in b1 if b1[i][0] == 7)
        row.update(seconds=secs, threads_s=user, bpf_s=bpf_s, cpu_pct=100.0 * (user + bpf_s) / secs,
                   sampler_runs=runs, rate=throughput(snaps["w0"], snaps["w1"], None))
        row["snaps"] = (snaps["w0"], snaps["w1"])
    m = re.search(r"CPU budget: effective rate ([\d.]+) Hz min, ([\d.]+) Hz mean, ([\d.]+) Hz last", err_text)
    if m:
        row["effective_hz"] = [float(x) for x in m.groups()]
    m = re.search(r"CPU budget \(--max-cpu\): .*?pyperch used ([\d.]+)%", err_text)
    if m:
        row["self_reported_pct"] = float(m.group(1))
    m = re.search(r"Samples: (\d+) Errors: (\d+)", err_text)
    if m:
        row["pyspy_samples"], row["pyspy_errors"] = int(m.group(1)), int(m.group(2))
        # Samples (ticks) per second over its whole run: below the rate when it fell behind.
        row["achieved_hz"] = row["pyspy_samples"] / row["wall_s"]
    return row


def fd_links(pid):
    out = []
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                out.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)).replace("anon_inode:", ""))
            except OSError:
                pass
    except OSError:
        pass
    return out


def storm(bench, key, target, runs, fa, fb, size_of, share_pid=None, truth=None):
    """Alternates unprofiled windows and runs: [(tool, argv builder, kind)]."""
    o = bench.o
    rows = []
    s = target.snapshot()
    time.sleep(BASE_S)
    base = [(s, target.snapshot())]
    for tool, rate, argv_of, kind in runs:
        if argv_of is None:
            rows.append({"tool": tool, "rate": rate, "na": kind})
            continue
        out = os.path.join(WORK, "out", "storm-%s-%s.txt" % (key, tool.replace(" ", "_")))
        if os.path.exists(out):
            os.unlink(out)
        t = BUDGETED if kind == "budgeted" else OTHER
        log("storms: %s, %s" % (key, tool))
        tt0 = truth.snapshot() if truth else None
        row = measured_run(argv_of(out), target, t["duration"], t["warm"], out, tool.startswith("pyperch"))
        tt1 = truth.snapshot() if truth else None
        if tt0 and tt1:
            a, b = (tt1["cpu"].get(k, 0) - tt0["cpu"].get(k, 0) for k in (fa, fb))
            row["truth"] = (a / (a + b), b / (a + b)) if a + b > 0 else None
        row.update(tool=tool, rate=rate, budget=BUDGET if kind == "budgeted" else None)
        row["shares"] = shares(out, fa, fb, share_pid)
        if row.get("snaps"):
            row["size"] = size_of(*row["snaps"])
        s = target.snapshot()
        time.sleep(BASE_S)
        base.append((s, target.snapshot()))
        rows.append(row)
        log("  CPU %s%% (threads %s s + BPF %s s over %s s), effective %s, RSS %s MB, shares %s" % (
            fmt(row.get("cpu_pct"), 2), fmt(row.get("threads_s"), 3), fmt(row.get("bpf_s"), 3), fmt(row.get("seconds"), 1),
            row.get("effective_hz"), fmt(row.get("peak_rss_mb"), 1), row["shares"]))
    # Slowdown: throughput in the steady window vs the unprofiled windows around the run.
    bases = [throughput(a, b, key) for a, b in base]
    k = 0
    for row in rows:
        if "na" in row:
            continue
        around = [x for x in (bases[k], bases[k + 1]) if x]
        k += 1
        snaps = row.pop("snaps", None)
        prof = throughput(snaps[0], snaps[1], key) if snaps else None
        row["slowdown"] = 1.0 - prof / statistics.mean(around) if prof and around else None
    free = next((r for r in rows if r["tool"] == "pyperch" and r.get("shares") and r["rate"] == rows[0]["rate"]), None)
    for row in rows:
        if row.get("shares") and free and row is not free:
            row["delta_pp"] = 100.0 * max(abs(row["shares"][0] - free["shares"][0]), abs(row["shares"][1] - free["shares"][1]))
    bench.results["storms"]["storms"][key] = {"rows": rows, "unprofiled": bases, "size": size_of(*base[0])}


def pyperch_argv(bench, extra, rate, budgeted):
    def argv(out):
        a = [bench.o.pyperch, "record"] + extra + ["--rate", str(rate), "--format", "collapsed", "--output", out, "--stats"]
        a += ["--duration", str((BUDGETED if budgeted else OTHER)["duration"])]
        if budgeted:
            a += ["--max-cpu", str(BUDGET)]
        return a
    return argv


def pyspy_argv(bench, pid, rate, extra=()):
    def argv(out):
        return [os.path.join(bench.o.venv, "bin", "py-spy"), "record", "--pid", str(pid), "--rate", str(rate),
                "--duration", str(int(OTHER["duration"])), "--format", "raw", "-o", out] + list(extra)
    return argv


def sec_storms(bench, interp):
    res = bench.results["storms"] = {"python": interp.label, "storms": {}}

    def switches_size(s0, s1):
        return {"switches_per_s": (s1["switches"] - s0["switches"]) / (s1["t"] - s0["t"])} if s0.get("switches") is not None else {}

    # 1. A Python switch storm: 500 threads x 2,000 sleeps a second, wall mode.
    t = Target(interp, "switch_threads", [500, 500])
    try:
        time.sleep(1.0)
        p = str(t.pid)
        storm(bench, "wall", t, [
            ("pyperch --max-cpu 2", 1000, pyperch_argv(bench, ["--pid", p, "--subprocesses", "--mode", "wall"], 1000, True), "budgeted"),
            ("pyperch", 1000, pyperch_argv(bench, ["--pid", p, "--subprocesses", "--mode", "wall"], 1000, False), "free"),
            ("py-spy --idle", 100, pyspy_argv(bench, t.pid, 100, ["--idle"]), "free"),
        ], "wait_a", "wait_b", switches_size)
    finally:
        t.stop()

    # 2. A non-Python switch storm beside the chain workload; pyperch on the whole host.
    chain = Target(interp, "chain")
    st = SwitchStorm()
    try:
        time.sleep(0.5)
        storm(bench, "nonpython", st, [
            ("pyperch --max-cpu 2", 1000, pyperch_argv(bench, ["--mode", "wall"], 1000, True), "budgeted"),
            ("pyperch", 1000, pyperch_argv(bench, ["--mode", "wall"], 1000, False), "free"),
            ("py-spy", None, None, "cannot: the storm is not Python, and py-spy has no whole-host mode"),
        ], "leaf_a", "leaf_b", lambda s0, s1: {"switches_per_s": (s1["iters"] - s0["iters"]) / (s1["t"] - s0["t"])},
            share_pid=chain.pid, truth=chain)
    finally:
        st.stop()
        chain.stop()

    # 3. Process churn: 1,000 short-lived Python processes a minute; pyperch on the whole host.
    t = Target(interp, "short_lived", [1000])
    try:
        time.sleep(2.0)
        storm(bench, "churn", t, [
            ("pyperch --max-cpu 2", 1000, pyperch_argv(bench, [], 1000, True), "budgeted"),
            ("pyperch", 1000, pyperch_argv(bench, [], 1000, False), "free"),
            ("py-spy", None, None, "cannot: no whole-host mode, it cannot follow processes it was not started with"),
        ], "short_lived_a", "short_lived_b",
            lambda s0, s1: {"processes_per_min": 60.0 * (s1["iters"] - s0["iters"]) / (s1["t"] - s0["t"])})
    finally:
        t.stop()

    # 4. 500 CPU-bound threads (py-spy #872), then the per-sample cost and dump rows.
    for n in (8, 500):
        t = CountedTarget(interp, "many_threads", [n])
        try:
            time.sleep(1.0)
            p = str(t.pid)
            if n == 500:
                storm(bench, "cpu", t, [
                    ("pyperch --max-cpu 2", 10000, pyperch_argv(bench, ["--pid", p, "--subprocesses"], 10000, True), "budgeted"),
                    ("pyperch", 10000, pyperch_argv(bench, ["--pid", p, "--subprocesses"], 10000, False), "free"),
                    ("pyperch, per-thread events (`--pid` alone)", 10000, pyperch_argv(bench, ["--pid", p], 10000, False), "free"),
                    ("pyperch", 100, pyperch_argv(bench, ["--pid", p, "--subprocesses"], 100, False), "free"),
                    ("py-spy", 100, pyspy_argv(bench, t.pid, 100), "free"),
                ], "leaf_a", "leaf_b", lambda s0, s1: {})
                dumps = []
                for _ in range(3):
                    t0 = time.monotonic()
                    r = subprocess.run([bench.o.pyperch, "dump", "--pid", p, "--json"], capture_output=True, text=True, timeout=60)
                    wall = time.monotonic() - t0
                    try:
                        threads = len(json.loads(r.stdout)["threads"]) if r.returncode == 0 else 0
                    except (ValueError, KeyError, TypeError):
                        threads = 0
                    dumps.append({"wall_s": wall, "exit": r.returncode, "threads": threads})
                res["dump"] = dumps
                log("storms: dump of 500 threads: %s s, %s threads" % (", ".join(fmt(d["wall_s"], 2) for d in dumps), [d["threads"] for d in dumps]))
            # Cost per sample at 1 kHz; --max-cpu 100 never bites here but keeps the kernel's
            # BPF statistics on, as in the test.
            out = os.path.join(WORK, "out", "storm-per-sample-%d.txt" % n)
            log("storms: cost per sample, %d threads" % n)
            row = measured_run(pyperch_argv(bench, ["--pid", p], 1000, False)(out) + ["--max-cpu", "100"], t,
                               OTHER["duration"], OTHER["warm"], out, True)
            runs = row.get("sampler_runs") or 0
            row["us_per_sample"] = 1e6 * (row["threads_s"] + row["bpf_s"]) / runs if runs else None
            row["bpf_us_per_sample"] = 1e6 * row["bpf_s"] / runs if runs else None
            row.pop("snaps", None)
            res["per_sample_%d" % n] = row
            log("  %s us per sample (%s BPF), %d samples" % (fmt(row["us_per_sample"], 2), fmt(row["bpf_us_per_sample"], 2), runs))
        finally:
            t.stop()


TITLES = {
    "wall": "Python switch storm: 500 threads, each sleeping 500 us in a loop (`--mode wall --pid P --subprocesses`)",
    "nonpython": "non-Python switch storm (`dd bs=1 | cat`) beside the chain workload (`--mode wall`, whole host)",
    "churn": "1,000 short-lived Python processes a minute (whole host)",
    "cpu": "500 CPU-bound threads, py-spy #872's shape (`--pid P --subprocesses`: one event per CPU, as the agent)",
}


def report(rep):
    r = rep.r.get("storms")
    if not r:
        return []
    lines = []
    w = lines.append
    w("## Storms: the CPU budget (`--max-cpu 2`) under load")
    w("")
    w("Issue #33, `cargo xtask bench -- --only storms` (`bench/pyperch_bench/storms.py`), CPython %s. Each storm keeps one workload running; pyperch with `--max-cpu %d` (the agent's default budget), pyperch without a budget, and py-spy where it can run are measured in turn, with unprofiled windows before and after each. **Profiler CPU**: %% of one CPU over the steady window (budgeted runs: seconds 5-12.5 after sampling began, the controller having settled; others 1.5-7.5), measured from outside: its threads' schedstat plus the run time of its BPF programs (fdinfo). **Slowdown**: the workload's units of work per second in that window against the unprofiled windows around it (sleeps done; the storm's context switches; for the churn, the children's mean lifetime). **Shares**: of the storm's two functions (3/4 : 1/4 by construction; the chain's split is random, its true CPU split during the run measured by the workload itself is shown); **Δ** is the larger difference, in points, from the unbudgeted pyperch's shares in the same storm. **Effective rate**: `--stats` (min / mean / last)." % (r["python"], BUDGET))
    w("")
    w("| storm (reached) | tool | rate (Hz) | budget | profiler CPU % of one CPU (threads + BPF) | effective rate, Hz | target slowdown | peak RSS (MB) | shares (%) | Δ vs unbudgeted (pp) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in ("wall", "nonpython", "churn", "cpu"):
        s = r["storms"].get(key)
        if not s:
            continue
        size = s.get("size") or {}
        reached = ""
        if "switches_per_s" in size:
            reached = " (%s switches/s unprofiled)" % fmt(size["switches_per_s"], 0)
        elif "processes_per_min" in size:
            reached = " (%s processes/min)" % fmt(size["processes_per_min"], 0)
        first = True
        for row in s["rows"]:
            name = (TITLES[key] + reached) if first else ""
            first = False
            if "na" in row:
                w("| %s | %s | | | %s | | | | | |" % (name, row["tool"], row["na"]))
                continue
            eff = row.get("effective_hz")
            sh_ = row.get("shares")
            cpu = "%s (%s + %s)" % (fmt(row.get("cpu_pct"), 2), fmt(pct(row["threads_s"] / row["seconds"]) if row.get("seconds") else None, 2),
                                    fmt(pct(row["bpf_s"] / row["seconds"]) if row.get("seconds") else None, 2))
            if row.get("budget"):
                cpu = "**%s**" % cpu
            w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, row["tool"], row.get("rate"), ("%d%%" % row["budget"]) if row.get("budget") else "-", cpu,
                " / ".join(fmt(x, 0) for x in eff) if eff and row.get("budget") else
                ("%s achieved (%s samples, %s errors%s)" % (fmt(row["achieved_hz"], 0), row["pyspy_samples"], row["pyspy_errors"],
                                                            ", stopped with Ctrl-C" if row.get("interrupted") else "")
                 if row.get("achieved_hz") is not None else "-"),
                ("%s%%" % fmt(pct(row.get("slowdown")), 1)) if row.get("slowdown") is not None else "n/a",
                fmt(row.get("peak_rss_mb"), 1), ("%s / %s" % (fmt(pct(sh_[0]), 1), fmt(pct(sh_[1]), 1))) + (
                    " (true %s / %s)" % (fmt(pct(row["truth"][0]), 1), fmt(pct(row["truth"][1]), 1)) if row.get("truth") else "") if sh_ else "n/a",
                fmt(row.get("delta_pp"), 1) if row.get("delta_pp") is not None else "-"))
    p8, p500 = r.get("per_sample_8"), r.get("per_sample_500")
    if p8 and p500:
        w("")
        w("| | 8 threads | 500 threads | 500 / 8 |")
        w("|---|---:|---:|---:|")
        ratio = p500["us_per_sample"] / p8["us_per_sample"] if p8.get("us_per_sample") and p500.get("us_per_sample") else None
        w("| cost per sample, same CPU-bound work, `--pid` at 1 kHz: us of pyperch CPU (threads + BPF) per sample (BPF part) | %s (%s) | %s (%s) | **%s×** |" % (
            fmt(p8["us_per_sample"], 2), fmt(p8["bpf_us_per_sample"], 2), fmt(p500["us_per_sample"], 2), fmt(p500["bpf_us_per_sample"], 2), fmt(ratio, 2)))
    d = r.get("dump")
    if d:
        walls = [x["wall_s"] for x in d if x["exit"] == 0]
        w("| `pyperch dump --pid P --json` of the 500-thread process: wall time, s (3 runs; threads in the dump) | | **%s** (%s; %s threads) | |" % (
            fmt(statistics.median(walls), 2) if walls else "failed", ", ".join(fmt(x["wall_s"], 2) for x in d),
            "/".join(str(x["threads"]) for x in d)))
    w("")
    return lines
