#!/usr/bin/env python3
"""The `cargo xtask bench` driver: pyperch side by side with py-spy, Austin and CPython's
own sampling profiler, on one machine, in one run.

`cargo xtask bench` builds pyperch, installs the peers and then runs this script (Python
3.9+, stdlib only, as root). It can also be run directly:

    python3 bench/driver.py --pyperch target/release/pyperch
        --venv ~/.cache/pyperch/bench-venv --rootfs ~/.cache/pyperch/sid-rootfs

and writes BENCHMARKS.md (tables, ratios against pyperch, the machine, the command) and
bench/results.json (the same numbers, and every raw measurement). bench/README.md explains
what is measured and how to read it.
"""
import argparse
import datetime
import json
import os
import platform
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

import walk_parts  # the sections `parts` and `idlehost` (bench/walk_parts.py)
import first_contact  # the section `startup` (bench/first_contact.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = os.path.join(HERE, "workloads")
WORK = "/tmp/pyperch-bench"  # scratch: profiles, snapshots, logs (host side)
INSIDE = "/tmp/pyperch-bench"  # the same directory inside the sid rootfs

TOOLS_312 = ["pyperch", "py-spy", "py-spy-nb", "austin"]
TOOLS_315 = ["pyperch", "cpython"]
TOOL_TITLES = {
    "pyperch": "pyperch",
    "py-spy": "py-spy 0.4 (default, pausing)",
    "py-spy-nb": "py-spy 0.4 --nonblocking",
    "austin": "Austin 3.7",
    "cpython": "CPython 3.15 profiling.sampling",
    "pyperch-ctl": "pyperch watching an idle process (control)",
    "pyperch-wall": "pyperch --mode wall",
    "py-spy-idle": "py-spy 0.4 --idle",
    "cpython-wall": "CPython 3.15 profiling.sampling --mode wall",
}
SHORT = {"pyperch-ctl": "control", "pyperch": "pyperch", "py-spy": "py-spy", "py-spy-nb": "py-spy nb", "austin": "austin", "cpython": "cpython",
         "pyperch-native": "pyperch --native", "pyperch-kernel": "pyperch --kernel", "py-spy-native": "py-spy --native",
         "pyperch-wall": "pyperch wall", "py-spy-idle": "py-spy --idle", "cpython-wall": "cpython wall"}
# Variants of a tool with extra flags: their reports and output parse as the base tool's.
BASE_TOOL = {"pyperch-native": "pyperch", "pyperch-kernel": "pyperch", "py-spy-native": "py-spy",
             "pyperch-wall": "pyperch", "py-spy-idle": "py-spy", "cpython-wall": "cpython"}
# The context-switch section (`--only switches`): every thread's whole time (issue 11's wall
# mode) on the token workload (two threads passing a token through queues), at about 100 Hz,
# the peers' default rate; and the scheduler-switch program's cost for the rest of the host.
TOOLS_SWITCH_312 = ["pyperch-wall", "py-spy-idle"]
TOOLS_SWITCH_315 = ["pyperch-wall", "cpython-wall"]
SWITCH_RATE = 100
# The native-stacks section (`--only native`): pyperch --native against py-spy --native, and
# pyperch --kernel against plain pyperch, on the chain workload.
TOOLS_NATIVE = ["pyperch-native", "py-spy-native"]
TOOLS_KERNEL = ["pyperch", "pyperch-kernel"]
WORKLOAD_TITLES = {
    "chain": "CPU split under a 30-call chain (depth 34)",
    "recursion": "recursion, depth 300",
    "threads8": "8 threads in distinct functions",
    "web": "web-like: template rendering + JSON encoding, many short calls",
    "frame_reuse": "frame reuse: a1-a2-a3-leaf / b1-b2-b3-leaf alternately",
}

LOG = None


def log(msg):
    line = "[bench %s] %s" % (time.strftime("%H:%M:%S"), msg)
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


# ---------------------------------------------------------------------------------------
# Child processes: every process we start is recorded and killed at the end, even on error.

CHILDREN = {}


def spawn(argv, **kw):
    kw.setdefault("stdin", subprocess.DEVNULL)
    p = subprocess.Popen(argv, start_new_session=True, **kw)
    CHILDREN[p.pid] = p
    return p


def reap(p):
    """Forget a child that has been waited for."""
    CHILDREN.pop(p.pid, None)


def kill_tree(p, sig=signal.SIGKILL):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all():
    for pid, p in list(CHILDREN.items()):
        if p.returncode is None:
            kill_tree(p, signal.SIGKILL)
    for pid, p in list(CHILDREN.items()):
        try:
            p.wait(timeout=5)
        except Exception:
            pass
        CHILDREN.pop(pid, None)


def on_signal(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


# ---------------------------------------------------------------------------------------
# Measuring a process from outside.


def sched_ns(pid):
    """CPU time (user + system) of every live thread of pid, in ns, from schedstat."""
    total = 0
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return total


def ctx_switches(pid):
    """Context switches so far (voluntary + involuntary) of every live thread of pid."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total


def switches_between(s0, s1):
    """Context switches per second of the target between two snapshots."""
    if not s0 or not s1 or s0.get("switches") is None or s1.get("switches") is None or s1["t"] <= s0["t"]:
        return None
    return (s1["switches"] - s0["switches"]) / (s1["t"] - s0["t"])


def bpf_fdinfo(pid):
    """({prog_id: (prog_type, run_time_ns, run_cnt)}, number of BPF links) of what pid holds,
    read from /proc/PID/fdinfo (the numbers `bpftool prog show` prints; run times count only
    while kernel.bpf_stats_enabled=1), or None when pid is gone. Types: 7 perf event, 17 raw
    tracepoint, 26 tracing (the switch program, a BTF tracepoint). The one reader of BPF
    fdinfo for every section."""
    progs, links = {}, 0
    try:
        fds = os.listdir("/proc/%d/fdinfo" % pid)
    except OSError:
        return None
    for fd in fds:
        try:
            with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                text = f.read()
        except OSError:
            continue
        if "link_type:" in text:
            links += 1
            continue
        m = [re.search(r"^%s:\s*(\d+)" % k, text, re.M) for k in ("prog_id", "prog_type", "run_time_ns", "run_cnt")]
        if all(m):
            progs[int(m[0].group(1))] = tuple(int(x.group(1)) for x in m[1:])
    return progs, links


def bpf_progs(pid):
    """{prog_id: (prog_type, run_time_ns, run_cnt)} of the BPF programs pid holds."""
    found = bpf_fdinfo(pid)
    return found[0] if found else {}


def stat_ticks_s(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def bpf_prog_stats(pid):
    """(run_time_ns, run_cnt, n_links) summed over the BPF programs pid holds, or None."""
    found = bpf_fdinfo(pid)
    if not found or not (found[0] or found[1]):
        return None
    progs, links = found
    return (sum(v[1] for v in progs.values()), sum(v[2] for v in progs.values()), links)


def vm_hwm_kb(pid):
    """Peak resident set of pid so far (VmHWM). Read from /proc while the process runs:
    getrusage's ru_maxrss of a child would include the driver's own memory, inherited
    through fork and exec."""
    try:
        with open("/proc/%d/status" % pid) as f:
            m = re.search(r"^VmHWM:\s*(\d+) kB", f.read(), re.M)
            return int(m.group(1)) if m else None
    except OSError:
        return None


# ---------------------------------------------------------------------------------------
# Interpreters and workload processes.


class Interp(object):
    def __init__(self, label, exe, rootfs=None):
        self.label = label
        self.exe = exe
        self.rootfs = rootfs

    def workload_argv(self, name, snap, max_seconds, args):
        if self.rootfs:
            script = "%s/workloads/%s.py" % (INSIDE, name)
            # A private mount namespace with /proc mounted inside the rootfs, so that
            # CPython's profiler (which nsenters this namespace) can read /proc there.
            # unshare, sh and chroot all exec: the PID we get is the interpreter's.
            return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                    'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"', self.rootfs,
                    self.exe, script, snap, str(max_seconds)] + [str(a) for a in args]
        return [self.exe, os.path.join(WORKLOADS, name + ".py"), snap, str(max_seconds)] + [str(a) for a in args]

    def host_path(self, inside_path):
        return os.path.join(self.rootfs, inside_path.lstrip("/")) if self.rootfs else inside_path


SNAP_COUNTER = [0]


class Target(object):
    """A running workload; snapshot() asks it for its counters (SIGUSR1)."""

    def __init__(self, interp, name, args=(), max_seconds=1200):
        SNAP_COUNTER[0] += 1
        self.interp = interp
        self.name = name
        self.args = list(args)
        snap_inside = "%s/snaps/%s-%d.json" % (INSIDE if interp.rootfs else WORK, name, SNAP_COUNTER[0])
        self.snap = interp.host_path(snap_inside)
        os.makedirs(os.path.dirname(self.snap), exist_ok=True)
        if os.path.exists(self.snap):
            os.unlink(self.snap)
        err = open(os.path.join(WORK, "logs", "%s-%d.err" % (name, SNAP_COUNTER[0])), "w")
        self.proc = spawn(interp.workload_argv(name, snap_inside, max_seconds, args),
                          stdout=subprocess.PIPE, stderr=err)
        self.seq = 0
        line = self._readline(30.0)
        m = re.match(r"ready (\d+)", line or "")
        if not m:
            self.stop()
            raise RuntimeError("workload %s on %s did not start (got %r; see %s)" % (name, interp.label, line, err.name))
        self.pid = int(m.group(1))
        if self.pid != self.proc.pid:
            raise RuntimeError("workload %s: pid %d is not the process we started (%d)" % (name, self.pid, self.proc.pid))

    def _readline(self, timeout):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
                if b"\n" in buf:
                    return buf.split(b"\n", 1)[0].decode(errors="replace")
            elif self.proc.poll() is not None:
                break
        return buf.decode(errors="replace") or None

    def snapshot(self, timeout=5.0):
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(self.snap) as f:
                    data = json.load(f)
                if data.get("seq", 0) > self.seq:
                    self.seq = data["seq"]
                    data["cpu_ns"] = sched_ns(self.pid)
                    data["switches"] = ctx_switches(self.pid)
                    return data
            except (OSError, ValueError):
                pass
            time.sleep(0.003)
        log("warning: no snapshot from %s (pid %d) within %.0f s" % (self.name, self.pid, timeout))
        return None

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            kill_tree(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc, signal.SIGKILL)
                self.proc.wait(timeout=5)
        reap(self.proc)


def rate_between(s0, s1):
    if not s0 or not s1 or s1["t"] <= s0["t"]:
        return None
    return (s1["iters"] - s0["iters"]) / (s1["t"] - s0["t"])


def rate_per_cpu(s0, s1):
    """Units of work per second of the target's own CPU time (all threads)."""
    if not s0 or not s1 or s0.get("cpu_ns") is None or s1.get("cpu_ns") is None or s1["cpu_ns"] <= s0["cpu_ns"]:
        return None
    return (s1["iters"] - s0["iters"]) / ((s1["cpu_ns"] - s0["cpu_ns"]) / 1e9)


def cpu_delta(s0, s1):
    if not s0 or not s1:
        return {}
    return {k: s1["cpu"].get(k, 0.0) - s0["cpu"].get(k, 0.0) for k in s1["cpu"]}


# ---------------------------------------------------------------------------------------
# Profile parsers: every tool's output becomes [(frames root->leaf, count)], frames as bare
# function names (qualnames reduced to their last part), pseudo-frames removed.


def norm_name(name):
    name = name.strip()
    if name.startswith("<") and name.endswith(">"):
        return name
    return name.rsplit(".", 1)[-1]


PSEUDO = {"<GC>", "<native>", "<interpreter trampoline>", "<shim>"}


def parse_paren_frames(stack):
    """pyperch collapsed and py-spy raw: `name (file:line)` frames."""
    frames = []
    for fr in stack.split(";"):
        m = re.match(r"^(.*) \(([^()]*)\)$", fr)
        if m:
            if re.match(r"^pid \d+$", m.group(2)):
                continue  # pyperch's process frame
            name = m.group(1)
        else:
            name = fr
            if re.match(r"^(thread|process) ", fr):
                continue
        name = norm_name(name)
        if name not in PSEUDO:
            frames.append(name)
    return frames


def parse_colon_frames(stack):
    """Austin and CPython collapsed: `file:name:line` frames (plus P/T/tid: prefixes)."""
    frames = []
    for fr in stack.split(";"):
        if re.match(r"^(P\d+|T\d+:\d+|T\d+|tid:\d+)$", fr):
            continue
        parts = fr.rsplit(":", 2)
        name = parts[1] if len(parts) == 3 else fr
        name = norm_name(name)
        if name not in PSEUDO:
            frames.append(name)
    return frames


def parse_profile(tool, path):
    tool = BASE_TOOL.get(tool, tool)
    stacks = []
    if not os.path.exists(path):
        return stacks
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if tool == "austin":
                # One line per sample; the trailing number is the sample's CPU time in us.
                stack = line.rsplit(" ", 1)[0] if " " in line else line
                stacks.append((parse_colon_frames(stack), 1))
                continue
            if " " not in line:
                continue
            stack, count = line.rsplit(" ", 1)
            try:
                n = int(count)
            except ValueError:
                continue
            if tool == "cpython":
                stacks.append((parse_colon_frames(stack), n))
            else:
                stacks.append((parse_paren_frames(stack), n))
    return stacks


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_tool_stderr(tool, text):
    tool = BASE_TOOL.get(tool, tool)
    text = ANSI.sub("", text)
    info = {}
    if tool == "pyperch":
        m = re.search(r"recorded ([\d.]+) s: (\d+) samples \((\d+) ok\) from (\d+) Python process", text)
        if m:
            info.update(recorded_s=float(m.group(1)), samples=int(m.group(2)), ok=int(m.group(3)), processes=int(m.group(4)))
        whole = text.split("  process ", 1)[0]
        m = re.search(r"kernel: (\d+) samples of registered processes, (\d+) lost", whole)
        if m:
            info.update(kernel_samples=int(m.group(1)), kernel_lost=int(m.group(2)))
        m = re.search(r"target memory: (\d+) reads, (\d+) bytes", whole)
        if m:
            info.update(target_reads=int(m.group(1)), target_bytes=int(m.group(2)))
        m = re.search(r"ring buffer: (\d+) bytes", whole)
        if m:
            info.update(ring_bytes=int(m.group(1)))
        m = re.search(r"native: (\d+) merged \((\d+) with a truncated native stack\), (\d+) unmerged", whole)
        if m:
            info.update(native_merged=int(m.group(1)), native_truncated=int(m.group(2)), native_unmerged=int(m.group(3)))
        m = re.search(r"frames from kernel (\d+), from cache (\d+), from memory (\d+)", whole)
        if m:
            info.update(frames_kernel=int(m.group(1)), frames_cache=int(m.group(2)), frames_memory=int(m.group(3)))
        outcomes = {}
        for mm in re.finditer(r"^    (\S[^\n]*?)\s+(\d+) \(\s*[\d.]+%\)", whole, re.M):
            outcomes[mm.group(1).strip()] = int(mm.group(2))
        info["outcomes"] = outcomes
        per = {}
        detail = {}
        for block in re.split(r"^  process ", text, flags=re.M)[1:]:
            mm = re.match(r"(\d+) \(([^)]*)\):", block)
            if not mm:
                continue
            pid = int(mm.group(1))
            d = {"name": mm.group(2), "outcomes": {}}
            ms = re.search(r"^    samples: (\d+)", block, re.M)
            d["samples"] = int(ms.group(1)) if ms else 0
            for mo in re.finditer(r"^      (\S[^\n]*?)\s+(\d+) \(\s*[\d.]+%\)", block, re.M):
                d["outcomes"][mo.group(1).strip()] = int(mo.group(2))
            d["ok"] = d["outcomes"].get("ok", 0)
            per[pid] = d["samples"]
            detail[pid] = d
        info["per_process"] = per
        info["per_process_detail"] = detail
        info["registered"] = len(re.findall(r"^  process \d+ ", text, re.M))
    elif tool in ("py-spy", "py-spy-nb"):
        m = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        if m:
            info.update(samples=int(m.group(1)), errors=int(m.group(2)))
        info["behind_warnings"] = len(re.findall(r"behind", text))
    elif tool == "austin":
        m = re.search(r"Error rate\s*:\s*(\d+)/(\d+)", text)
        if m:
            info.update(errors=int(m.group(1)), attempts=int(m.group(2)))
        m = re.search(r"Long sampling rate\s*:\s*(\d+)/(\d+)", text)
        if m:
            info.update(long_samples=int(m.group(1)))
        m = re.search(r"Sampling duration\s*:\s*([\d.]+) s", text)
        if m:
            info.update(sampling_s=float(m.group(1)))
        m = re.search(r"Frame sampling \(min/avg/max\)\s*:\s*(\d+)/(\d+)/(\d+)", text)
        if m:
            info.update(frame_sampling_avg_us=int(m.group(2)))
    elif tool == "cpython":
        m = re.search(r"Captured (\d+) samples in ([\d.]+) seconds", text)
        if m:
            info.update(samples=int(m.group(1)), seconds=float(m.group(2)))
        m = re.search(r"Error rate: ([\d.]+)", text)
        if m:
            info.update(error_rate_pct=float(m.group(1)))
        m = re.search(r"missed (\d+) samples from the expected total of (\d+)", text)
        if m:
            info.update(missed=int(m.group(1)), expected=int(m.group(2)))
    return info


# ---------------------------------------------------------------------------------------
# Accuracy.

LEAF_LABELS = {
    "chain": {"leaf_a": ["leaf_a"], "leaf_b": ["leaf_b"]},
    "recursion": {"leaf_a": ["leaf_a"], "leaf_b": ["leaf_b"]},
    "threads8": {"work_t%d" % k: ["work_t%d" % k, "spin_t%d" % k] for k in range(8)},
    "web": {"render_page": ["render_page"], "encode_payload": ["encode_payload"]},
    "frame_reuse": {"a": ["a_1", "a_2", "a_3"], "b": ["b_1", "b_2", "b_3"]},
}


def expected_prefix(workload, depth=None):
    if workload == "chain":
        return ["<module>", "main"] + ["chain_%02d" % i for i in range(30)] + ["split_loop"]
    if workload == "recursion":
        return ["<module>", "main"] + ["descend"] * (depth - 4) + ["split_loop"]
    if workload == "web":
        return ["<module>", "main", "serve", "handle_request"]
    if workload == "frame_reuse":
        return ["<module>", "main", "reuse_loop"]
    return None


def full_stack(workload, frames, depth=None):
    """Does this sample show the whole stack: the right root and, when it is in the hot
    part of the workload, every frame expected above it?"""
    if "_snapshot" in frames:
        # The harness's signal handler, running on top of whatever was executing.
        frames = frames[:frames.index("_snapshot")]
    if not frames:
        return False
    if workload == "threads8":
        if frames[0] == "_bootstrap":
            hit = [k for k in range(8) if "work_t%d" % k in frames]
            if not hit:
                return True
            k = hit[0]
            i = frames.index("work_t%d" % k)
            return frames[i - 1] == "run" and frames[i + 1:i + 2] in ([], ["spin_t%d" % k])
        return frames[0] == "<module>"
    if frames[0] != "<module>":
        return False
    if workload in ("chain", "recursion"):
        if "split_loop" in frames or "leaf_a" in frames or "leaf_b" in frames:
            pre = expected_prefix(workload, depth)
            return frames[:len(pre)] == pre
        return True
    if workload == "web":
        if "render_page" in frames or "encode_payload" in frames:
            pre = expected_prefix(workload)
            return frames[:len(pre)] == pre
        return True
    if workload == "frame_reuse":
        rest = [f for f in frames]
        if any(f in ("a_1", "a_2", "a_3", "b_1", "b_2", "b_3", "leaf") for f in rest):
            pre = expected_prefix(workload)
            if frames[:len(pre)] != pre:
                return False
            tail = frames[len(pre):]
            for chain in (["a_1", "a_2", "a_3", "leaf"], ["b_1", "b_2", "b_3", "leaf"]):
                if tail == chain[:len(tail)] and tail:
                    return True
            return False
        return True
    return True


def accuracy(workload, stacks, truth_cpu, depth=None):
    labels = LEAF_LABELS[workload]
    total = sum(n for _, n in stacks)
    counts = {k: 0 for k in labels}
    mixed = 0
    full = 0
    for frames, n in stacks:
        fs = set(frames)
        hit = [k for k, marks in labels.items() if any(m in fs for m in marks)]
        if len(hit) == 1:
            counts[hit[0]] += n
        elif len(hit) > 1:
            mixed += n
        if full_stack(workload, frames, depth):
            full += n
    labelled = sum(counts.values())
    if workload == "frame_reuse":
        truth = {k: 1.0 / len(labels) for k in labels}
    else:
        tot = sum(max(0.0, truth_cpu.get(k, 0.0)) for k in labels)
        truth = {k: (max(0.0, truth_cpu.get(k, 0.0)) / tot if tot > 0 else None) for k in labels}
    measured = {k: (counts[k] / labelled if labelled else None) for k in labels}
    errors = [abs(measured[k] - truth[k]) for k in labels if measured[k] is not None and truth[k] is not None]
    err_pp = 100.0 * max(errors) if errors and len(errors) == len(labels) else None
    # Sampling noise of one share at this many samples (1 standard error, percentage points).
    p = 1.0 / len(labels) if workload != "chain" and workload != "recursion" else 0.3
    noise_pp = 100.0 * (p * (1 - p) / labelled) ** 0.5 if labelled else None
    return {
        "samples": total,
        "labelled": labelled,
        "truth": truth,
        "measured": measured,
        "split_error_pp": err_pp,
        "noise_pp": noise_pp,
        "full_stack_share": (full / total if total else None),
        "mixed": mixed,
        "mixed_share": (mixed / total if total else None),
        "mixed_share_of_chain": (mixed / (labelled + mixed) if labelled + mixed else None),
    }


# ---------------------------------------------------------------------------------------
# Profiler runs.


class Bench(object):
    def __init__(self, opts):
        self.o = opts
        self.venv_bin = os.path.join(opts.venv, "bin")
        self.rootfs = opts.rootfs if opts.rootfs and os.path.isdir(os.path.join(opts.rootfs, "usr")) else None
        self.results = {"runs": [], "groups": [], "scale": [], "deep": [], "allcpu": None, "compat": {}}
        self.tool_versions = {}
        self.helper = None
        self.run_counter = 0

    # -- command lines ------------------------------------------------------------------

    def profiler_argv(self, tool, target, rate, duration, out_inside, whole_host=False):
        d = duration
        if tool in ("pyperch", "pyperch-ctl", "pyperch-native", "pyperch-kernel", "pyperch-wall"):
            argv = [self.o.pyperch, "record", "--duration", str(d), "--rate", str(rate),
                    "--format", "collapsed", "--output", out_inside, "--stats"]
            if tool == "pyperch-native":
                argv.append("--native")
            elif tool == "pyperch-kernel":
                argv.append("--kernel")
            elif tool == "pyperch-wall":
                argv += ["--mode", "wall"]
            if tool == "pyperch-ctl":
                # The control: the same perf events and BPF program on every CPU, but the
                # only registered process is an idle one, so on the busy target's CPU the
                # program exits early. What remains is the cost of the sampling interrupts.
                # `--subprocesses` keeps one event per CPU (plain `--pid` samples only the
                # chosen process's own tasks).
                argv[2:2] = ["--pid", str(self.helper.pid), "--subprocesses"]
            elif not whole_host:
                argv[2:2] = ["--pid", str(target.pid)]
            return argv
        if tool in ("py-spy", "py-spy-nb", "py-spy-native", "py-spy-idle"):
            argv = [os.path.join(self.venv_bin, "py-spy"), "record", "--pid", str(target.pid), "--rate", str(rate),
                    "--duration", str(int(round(d))), "--format", "raw", "-o", out_inside]
            if tool == "py-spy-nb":
                argv.append("--nonblocking")
            elif tool == "py-spy-native":
                argv.append("--native")
            elif tool == "py-spy-idle":
                argv.append("--idle")
            return argv
        if tool == "austin":
            # -s: on-CPU samples only (like the other tools' defaults); -i in microseconds.
            return [os.path.join(self.venv_bin, "austin"), "-s", "-i", "%dus" % max(1, int(round(1e6 / rate))),
                    "-x", str(int(round(d))), "-p", str(target.pid), "-o", out_inside]
        if tool in ("cpython", "cpython-wall"):
            # Runs in the target's mount namespace and root (the sid rootfs, /proc mounted).
            return ["nsenter", "--target", str(target.pid), "--mount", "--root", "--wd=/", "--",
                    "/usr/bin/python3.15", "-m", "profiling.sampling", "attach", "-a",
                    "--mode", "wall" if tool == "cpython-wall" else "cpu",
                    "-r", str(rate), "-d", str(int(round(d))), "--collapsed", "-o", out_inside, str(target.pid)]
        raise ValueError(tool)

    # -- one profiler run ---------------------------------------------------------------

    def profile(self, tool, target, rate, duration, whole_host=False, extra_targets=(), tag="", depth=None):
        """Run one profiler against target (or the whole host); measure it."""
        self.run_counter += 1
        rid = "%03d-%s-%s-%s%s" % (self.run_counter, tool, target.name if target else "host", rate, tag)
        if BASE_TOOL.get(tool, tool) == "cpython":
            out_inside = "%s/out/%s.txt" % (INSIDE, rid)
            out = os.path.join(self.rootfs, out_inside.lstrip("/"))
        else:
            out_inside = out = os.path.join(WORK, "out", rid + ".txt")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.exists(out):
            os.unlink(out)
        err_path = os.path.join(WORK, "logs", rid + ".err")
        argv = self.profiler_argv(tool, target, rate, duration, out_inside, whole_host)
        targets = ([target] if target else []) + list(extra_targets)
        s_launch = [t.snapshot() for t in targets]
        with open(err_path, "w") as err:
            t_launch = time.monotonic()
            p = spawn(argv, stdout=err, stderr=subprocess.STDOUT)
        # When does sampling start? pyperch: once its perf-event links exist; the peers
        # start sampling within a few milliseconds of their start (CPython's after its
        # interpreter starts, well inside the warm-up below).
        t0 = t_launch
        if tool.startswith("pyperch"):
            while time.monotonic() - t_launch < 60:
                st = bpf_prog_stats(p.pid)
                if st and st[2] > 0:
                    t0 = time.monotonic()
                    break
                if p.poll() is not None:
                    break
                time.sleep(0.01)
        startup_s = t0 - t_launch
        w_start_at = t0 + self.o.warm
        w_end_at = t0 + duration - self.o.tail
        marks = {}
        snaps = {}
        hwm = [0]
        last_bpf = [None]

        def mark():
            m = {"t": time.monotonic(), "sched_ns": sched_ns(p.pid), "ticks_s": stat_ticks_s(p.pid),
                 "bpf": bpf_prog_stats(p.pid) if tool.startswith("pyperch") else None,
                 "target_sched_ns": [sched_ns(t.pid) for t in targets]}
            h = vm_hwm_kb(p.pid)
            if h:
                hwm[0] = max(hwm[0], h)
            if m["bpf"]:
                last_bpf[0] = m["bpf"]
            return m

        deadline = t_launch + duration + 120
        rc = None
        ru = None
        while True:
            now = time.monotonic()
            if "w0" not in marks and now >= w_start_at:
                marks["w0"] = mark()
                snaps["w0"] = [t.snapshot() for t in targets]
            elif "w1" not in marks and now >= w_end_at:
                marks["w1"] = mark()
                snaps["w1"] = [t.snapshot() for t in targets]
            else:
                mark()
            pid, status, r = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                rc = os.waitstatus_to_exitcode(status)
                p.returncode = rc
                reap(p)
                ru = r
                break
            if time.monotonic() > deadline:
                log("warning: %s did not finish, killing it" % tool)
                kill_tree(p)
                pid, status, ru = os.wait4(p.pid, 0)
                p.returncode = rc = -9
                reap(p)
                break
            time.sleep(0.1)
        t_exit = time.monotonic()
        s_end = [t.snapshot() for t in targets]
        with open(err_path, errors="replace") as f:
            err_text = f.read()
        info = parse_tool_stderr(tool, err_text)
        stacks = parse_profile(tool, out)
        recorded = sum(n for _, n in stacks)
        if tool.startswith("pyperch") and whole_host and "ok" in info:
            recorded = info["ok"]
        # How long the tool actually sampled: its own report where it gives one; py-spy
        # collects rate x duration samples and may take longer than the duration to do so.
        sampling_s = info.get("recorded_s") or info.get("seconds") or info.get("sampling_s")
        if not sampling_s:
            sampling_s = max(duration, t_exit - t_launch - 0.05)
        run = {
            "id": rid, "tool": tool, "workload": target.name if target else None, "rate": rate, "duration": duration,
            "whole_host": whole_host, "argv": argv, "exit_code": rc, "startup_s": startup_s,
            "wall_s": t_exit - t_launch, "sampling_s": sampling_s, "recorded": recorded, "info": info,
            "rusage": {"utime": ru.ru_utime, "stime": ru.ru_stime} if ru else None,
            "peak_rss_kb": hwm[0] or None,
            "window": None, "target": None,
        }
        if rc != 0:
            run["stderr_tail"] = err_text[-2000:]
        if depth is not None:
            run["depth"] = depth
        if rc != 0:
            log("warning: %s exited with %s; stderr: %s" % (tool, rc, err_text.strip()[-400:]))
        win = {}
        if "w0" in marks and "w1" in marks:
            w0, w1 = marks["w0"], marks["w1"]
            wlen = w1["t"] - w0["t"]
            win["seconds"] = wlen
            if w0["sched_ns"] is not None and w1["sched_ns"] is not None and wlen > 0:
                win["cpu_s"] = (w1["sched_ns"] - w0["sched_ns"]) / 1e9
            if w0["bpf"] and w1["bpf"]:
                win["bpf_ns"] = w1["bpf"][0] - w0["bpf"][0]
                win["bpf_runs"] = w1["bpf"][1] - w0["bpf"][1]
            win["samples_est"] = recorded / sampling_s * wlen if sampling_s else 0
            tt = [(b - a) / 1e9 / wlen if a is not None and b is not None and wlen > 0 else None
                  for a, b in zip(w0["target_sched_ns"], w1["target_sched_ns"])]
            win["target_cpu_share"] = tt
        else:
            log("warning: %s ended before its steady window closed" % tool)
        run["window"] = win
        if last_bpf[0]:
            run["bpf_total_ns"] = last_bpf[0][0]
            run["bpf_total_runs"] = last_bpf[0][1]
        if target:
            i = 0
            run["target"] = {
                "launch": s_launch[i], "w0": snaps.get("w0", [None])[i], "w1": snaps.get("w1", [None])[i], "end": s_end[i],
                "rate_window": rate_between(snaps.get("w0", [None])[i], snaps.get("w1", [None])[i]),
                "rate_per_cpu_window": rate_per_cpu(snaps.get("w0", [None])[i], snaps.get("w1", [None])[i]),
                "truth_cpu": cpu_delta(s_launch[i], s_end[i]),
            }
        run["extra_targets"] = [{"pid": t.pid, "launch": s_launch[k], "end": s_end[k]} for k, t in enumerate(targets) if k > 0]
        run["metrics"] = self.metrics(run, stacks)
        self.results["runs"].append(run)
        mm = run["metrics"]
        log("  %-9s %-11s %6s Hz: %6d samples in %4.1f s (%5.1f%% of requested), CPU/sample %s us (steady) %s us (whole run), RSS %s MB%s" % (
            SHORT[tool], run["workload"] or "host", rate, recorded, sampling_s, 100 * (mm.get("achieved_ratio") or 0),
            fmt(mm.get("cpu_us_per_sample")), fmt(mm.get("run_cpu_us_per_sample")), fmt(mm.get("rss_mb"), 1),
            ", split err %s pp, full %s%%" % (fmt(mm["accuracy"]["split_error_pp"], 2), fmt(pct(mm["accuracy"]["full_stack_share"]), 1)) if mm.get("accuracy") else ""))
        return run

    def metrics(self, run, stacks):
        d = run.get("sampling_s") or run["duration"]
        rec = run["recorded"]
        busy = run.get("busy_threads", 1)
        mm = {}
        mm["achieved_hz"] = rec / d
        mm["requested_hz"] = run["rate"] * busy
        mm["achieved_ratio"] = mm["achieved_hz"] / mm["requested_hz"]
        info = run["info"]
        tool = BASE_TOOL.get(run["tool"], run["tool"])
        lost = None
        attempted = None
        if tool == "pyperch":
            if "kernel_lost" in info:
                lost = info["kernel_lost"] + (info.get("samples", 0) - info.get("ok", 0))
                attempted = info.get("kernel_samples", 0) + info["kernel_lost"]
        elif tool in ("py-spy", "py-spy-nb"):
            if "errors" in info:
                lost = info["errors"]
                attempted = info.get("samples", 0) + info["errors"]
        elif tool == "austin":
            if "errors" in info:
                lost = info["errors"]
                attempted = info.get("attempts")
        elif tool == "cpython":
            lost = 0
            if "error_rate_pct" in info and "samples" in info:
                lost += int(round(info["samples"] * info["error_rate_pct"] / 100.0))
            if "missed" in info:
                lost += info["missed"]
            attempted = (info.get("samples", 0) + info.get("missed", 0)) or None
        mm["lost"] = lost
        mm["lost_share"] = (lost / attempted) if lost is not None and attempted else (0.0 if lost == 0 else None)
        w = run["window"] or {}
        tc = [x for x in (w.get("target_cpu_share") or []) if x is not None]
        mm["target_cpu_share"] = sum(tc) if tc else None
        ns = w.get("samples_est") or 0
        if "cpu_s" in w and ns > 0:
            mm["user_cpu_us_per_sample"] = 1e6 * w["cpu_s"] / ns
            mm["bpf_ns_per_sample"] = (w["bpf_ns"] / ns) if "bpf_ns" in w else None
            mm["bpf_ns_per_run"] = (w["bpf_ns"] / w["bpf_runs"]) if w.get("bpf_runs") else None
            mm["cpu_us_per_sample"] = mm["user_cpu_us_per_sample"] + (mm["bpf_ns_per_sample"] or 0) / 1000.0
            mm["cpu_share_window"] = w["cpu_s"] / w["seconds"] if w["seconds"] else None
        ru = run["rusage"]
        if ru:
            mm["run_cpu_s"] = ru["utime"] + ru["stime"]
        if run.get("peak_rss_kb"):
            mm["rss_mb"] = run["peak_rss_kb"] / 1024.0
        if ru:
            if rec:
                mm["run_user_cpu_us_per_sample"] = 1e6 * mm["run_cpu_s"] / rec
                mm["run_cpu_us_per_sample"] = mm["run_user_cpu_us_per_sample"] + (run.get("bpf_total_ns", 0) / rec / 1000.0)
        if run["target"] and run["workload"] in LEAF_LABELS:
            depth = None
            if run["workload"] == "recursion":
                depth = run.get("depth", 300)
            mm["accuracy"] = accuracy(run["workload"], stacks, run["target"]["truth_cpu"], depth)
        if tool == "pyperch" and rec:
            if "ring_bytes" in info:
                mm["ring_bytes_per_sample"] = info["ring_bytes"] / rec
            if "target_reads" in info:
                mm["target_reads_per_sample"] = info["target_reads"] / rec
                mm["target_bytes_per_sample"] = info["target_bytes"] / rec
        return mm

    # -- groups: one target, several tools, interleaved with unprofiled windows -----------

    def group(self, interp, workload, rate, tools, reps, args=(), depth=None, kind="compare"):
        if self.o.filter and not re.search(self.o.filter, "%s@%d" % (workload, rate)):
            return None
        log("group: %s on %s, %d Hz, tools %s, %d repetition(s)" % (workload, interp.label, rate, ",".join(tools), reps))
        target = Target(interp, workload, args)
        self.helper = Target(interp, "idle") if "pyperch-ctl" in tools else None
        g = {"interp": interp.label, "workload": workload, "rate": rate, "tools": tools, "reps": reps,
             "baselines": [], "runs": [], "depth": depth, "kind": kind}
        try:
            time.sleep(0.5)
            b0 = target.snapshot()
            time.sleep(self.o.baseline)
            b1 = target.snapshot()
            g["baselines"].append(rate_between(b0, b1))
            g["baselines_per_cpu"] = [rate_per_cpu(b0, b1)]
            g["baseline_switches"] = [switches_between(b0, b1)]
            for r in range(reps):
                k = r % len(tools)
                order = tools[k:] + tools[:k]
                for tool in order:
                    if BASE_TOOL.get(tool, tool) == "cpython" and not self.rootfs:
                        continue
                    run = self.profile(tool, target, rate, self.o.duration, depth=depth)
                    before = g["baselines"][-1]
                    time.sleep(0.2)
                    b0 = target.snapshot()
                    time.sleep(self.o.baseline)
                    b1 = target.snapshot()
                    after = rate_between(b0, b1)
                    g["baselines"].append(after)
                    g["baseline_switches"].append(switches_between(b0, b1))
                    pr = run["target"]["rate_window"] if run["target"] else None
                    base = [x for x in (before, after) if x]
                    slow = None
                    if pr and base:
                        slow = 1.0 - pr / (sum(base) / len(base))
                    run["slowdown"] = slow
                    before_c = g["baselines_per_cpu"][-1]
                    after_c = rate_per_cpu(b0, b1)
                    g["baselines_per_cpu"].append(after_c)
                    prc = run["target"]["rate_per_cpu_window"] if run["target"] else None
                    base_c = [x for x in (before_c, after_c) if x]
                    run["slowdown_per_cpu"] = (1.0 - prc / (sum(base_c) / len(base_c))) if prc and base_c else None
                    run["group"] = len(self.results["groups"])
                    g["runs"].append({"id": run["id"], "tool": tool, "rep": r, "slowdown": slow,
                                      "rate_profiled": pr, "baseline_before": before, "baseline_after": after})
                    if not target.alive():
                        raise RuntimeError("workload %s died" % workload)
        finally:
            target.stop()
            if self.helper:
                self.helper.stop()
                self.helper = None
        self.results["groups"].append(g)
        return g

    def _out_path(self, run):
        if BASE_TOOL.get(run["tool"], run["tool"]) == "cpython":
            return os.path.join(self.rootfs, INSIDE.lstrip("/"), "out", run["id"] + ".txt")
        return os.path.join(WORK, "out", run["id"] + ".txt")

    # -- sections -------------------------------------------------------------------------

    def sec_compat(self, interps):
        """Every workload starts and works on every interpreter we have."""
        log("workloads on every interpreter: %s" % ", ".join(i.label for i in interps))
        names = ["chain", "recursion", "threads8", "web", "frame_reuse", "idle"]
        for it in interps:
            row = {}
            targets = []
            try:
                for n in names:
                    try:
                        targets.append((n, Target(it, n, max_seconds=20)))
                    except Exception as e:
                        row[n] = "failed to start: %s" % e
                s0 = {n: t.snapshot() for n, t in targets}
                time.sleep(0.6)
                s1 = {n: t.snapshot() for n, t in targets}
                for n, t in targets:
                    ok = s0[n] and s1[n] and (n == "idle" or s1[n]["iters"] > s0[n]["iters"])
                    row[n] = "ok" if ok else "no progress"
            finally:
                for _, t in targets:
                    kill_tree(t.proc, signal.SIGTERM)
                for _, t in targets:
                    t.stop()
            self.results["compat"][it.label] = row
            log("  %s: %s" % (it.label, ", ".join("%s %s" % (k, v) for k, v in row.items())))

    def sec_allcpu(self, interp):
        ncpu = os.cpu_count()
        log("10 kHz on every CPU: pyperch whole host, %d busy chain workloads" % ncpu)
        targets = [Target(interp, "chain") for _ in range(ncpu)]
        try:
            time.sleep(0.5)
            run = self.profile("pyperch", targets[0], 10000, self.o.duration + 1, whole_host=True,
                               extra_targets=targets[1:], tag="-allcpu")
            run["busy_threads"] = ncpu
            run["metrics"] = self.metrics(run, [])
            run["metrics"].pop("accuracy", None)
            info = run["info"]
            det = info.get("per_process_detail", {})
            ours = [det.get(t.pid, {"samples": 0, "ok": 0, "outcomes": {}}) for t in targets]
            run["ours_pids"] = [t.pid for t in targets]
            run["ours_samples"] = sum(d["samples"] for d in ours)
            run["ours_ok"] = sum(d["ok"] for d in ours)
            bad = {}
            for d in ours:
                for k, v in d["outcomes"].items():
                    if k != "ok":
                        bad[k] = bad.get(k, 0) + v
            run["ours_not_ok"] = bad
            # Lost = every ring-buffer loss (not attributable to a process, so all counted)
            # + every sample of the busy workloads that did not come out ok.
            lost = info.get("kernel_lost", 0) + sum(bad.values())
            run["ours_lost"] = lost
            run["ours_lost_share"] = lost / (run["ours_samples"] + info.get("kernel_lost", 0)) if run["ours_samples"] else None
            others = [d for pid, d in det.items() if pid not in run["ours_pids"]]
            run["others"] = {"processes": len(others), "samples": sum(d["samples"] for d in others),
                             "ok": sum(d["ok"] for d in others)}
            self.results["allcpu"] = run
        finally:
            for t in targets:
                t.stop()

    def sec_interrupts(self, interp):
        """What one sampling interrupt costs the thread it lands on: bench/probe_gaps.py spins
        on CPU 0 and times every gap in its clock readings, alone and while pyperch samples an
        idle process at 1 and 10 kHz (on the probe's CPU the BPF program finds an unregistered
        process and exits at once)."""
        probe = os.path.join(HERE, "probe_gaps.py")
        helper = Target(interp, "idle")
        res = []
        try:
            time.sleep(0.5)
            for rate in (None, 1000, 10000):
                log("interrupt cost: probe alone" if rate is None else "interrupt cost: probe beside pyperch at %d Hz" % rate)
                prof = None
                if rate:
                    # `--subprocesses`: one event per CPU, so the interrupts reach the probe.
                    argv = [self.o.pyperch, "record", "--pid", str(helper.pid), "--subprocesses", "--rate", str(rate),
                            "--duration", "6", "--format", "collapsed", "--output", os.devnull]
                    prof = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.5)
                out = subprocess.run([sys.executable, probe, "3", "0"], capture_output=True, text=True, timeout=60)
                if prof:
                    prof.wait(timeout=30)
                    reap(prof)
                try:
                    row = json.loads(out.stdout)
                except ValueError:
                    continue
                row["rate"] = rate
                res.append(row)
        finally:
            helper.stop()
        self.results["interrupts"] = res

    def sec_native(self, interp, reps):
        """--native against py-spy --native, and --kernel against neither, on the chain."""
        self.group(interp, "chain", 100, TOOLS_NATIVE, 1, kind="native")
        self.group(interp, "chain", 1000, TOOLS_NATIVE, reps, kind="native")
        self.group(interp, "chain", 1000, TOOLS_KERNEL, reps, kind="native")
        # Ring-buffer bandwidth and losses with --native at 10 kHz (py-spy cannot keep up).
        self.group(interp, "chain", 10000, ["pyperch-native"], 1, kind="native")

    def sec_switches(self, interp, interp315):
        """Issue 11's context-switch costs: `--mode wall` on the token workload (about 20,000
        context switches/s) beside py-spy --idle (3.12) and CPython's --mode wall (3.15), and
        the scheduler-switch program's cost per switch of unregistered processes."""
        self.group(interp, "token", SWITCH_RATE, TOOLS_SWITCH_312, self.o.reps, kind="switches")
        if interp315:
            self.group(interp315, "token", SWITCH_RATE, TOOLS_SWITCH_315, self.o.reps, kind="switches")
        self.sec_switch_storm(interp)

    def sec_switch_storm(self, interp):
        """A non-Python context-switch storm (`dd bs=1 | cat`: every one-byte write wakes the
        reader) while pyperch --mode wall registers only an idle Python process: the
        scheduler-switch program then runs for unregistered threads only. Its run time per run
        is compared with the sampling program's early exit (one map lookup) in the same run
        (`--subprocesses` keeps one perf event per CPU, so that program runs on the storm's
        CPUs too)."""
        helper = Target(interp, "idle")
        storm = spawn(["sh", "-c", "dd if=/dev/zero bs=1 count=2000000000 status=none | cat > /dev/null"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = []
        try:
            time.sleep(0.5)
            for rep in range(max(1, self.o.reps - 1)):
                log("switch storm: dd | cat beside pyperch --mode wall on an idle process (rep %d)" % (rep + 1))
                argv = [self.o.pyperch, "record", "--pid", str(helper.pid), "--subprocesses", "--mode", "wall",
                        "--rate", "1000", "--duration", str(self.o.duration), "--format", "collapsed", "--output", os.devnull]
                p = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                storm_pids = [int(x) for x in sh("pgrep -P %d" % storm.pid).split()]
                time.sleep(self.o.warm + 0.5)
                t0, a = time.monotonic(), bpf_progs(p.pid)
                c0 = sum(ctx_switches(x) or 0 for x in storm_pids)
                time.sleep(max(0.5, self.o.duration - self.o.warm - self.o.tail - 1.0))
                t1, b = time.monotonic(), bpf_progs(p.pid)
                c1 = sum(ctx_switches(x) or 0 for x in storm_pids)
                p.wait(timeout=60)
                reap(p)
                row = {"seconds": t1 - t0, "storm_switches_per_s": (c1 - c0) / (t1 - t0)}
                # The switch program is the one BTF tracepoint (program type "tracing", 26; the
                # raw tracepoints, 17, fire on forks, execs and exits); the perf-event one is
                # the sampler.
                for kind, ptype in (("switch", 26), ("sample", 7)):
                    deltas = [(b[i][2] - a[i][2], b[i][1] - a[i][1]) for i in b if i in a and b[i][0] == ptype]
                    if deltas:
                        runs, ns = max(deltas)
                        row[kind + "_runs_per_s"] = runs / (t1 - t0)
                        row[kind + "_ns_per_run"] = ns / runs if runs else None
                log("  storm %.0f switches/s; switch program %s runs/s, %s ns/run; sampler early exit %s ns/run" % (
                    row["storm_switches_per_s"], fmt(row.get("switch_runs_per_s"), 0), fmt(row.get("switch_ns_per_run"), 1),
                    fmt(row.get("sample_ns_per_run"), 1)))
                rows.append(row)
        finally:
            kill_tree(storm)
            reap(storm)
            helper.stop()
        self.results["switch_storm"] = rows

    def sec_deep(self, interp):
        for depth in (30, 300, 1500):
            log("deep stacks: recursion depth %d, pyperch at 1 kHz" % depth)
            target = Target(interp, "recursion", [depth])
            try:
                time.sleep(0.5)
                run = self.profile("pyperch", target, 1000, self.o.duration, tag="-deep%d" % depth, depth=depth)
                self.results["deep"].append(run)
            finally:
                target.stop()

    def sec_scale(self, interp, idle_interps):
        """1, 10 and 50 idle processes beside a busy one; the sizes are interleaved (1, 10, 50,
        then again) so that drift over the section is not mistaken for an effect of size."""
        busy = None
        idle_targets = []
        try:
            busy = Target(interp, "chain")
            for rep in range(self.o.scale_reps):
                for n in (1, 10, 50):
                    while len(idle_targets) > n:
                        idle_targets.pop().stop()
                    while len(idle_targets) < n:
                        it = idle_interps[len(idle_targets) % len(idle_interps)]
                        idle_targets.append(Target(it, "idle"))
                    time.sleep(0.5)
                    log("scale: pyperch whole host, 1 busy + %d idle Python processes (rep %d)" % (n, rep + 1))
                    run = self.profile("pyperch", busy, 1000, self.o.duration, whole_host=True, tag="-idle%d" % n)
                    run["idle"] = n
                    self.results["scale"].append(run)
        finally:
            for t in idle_targets:
                t.stop()
            if busy:
                busy.stop()

    # -- everything ----------------------------------------------------------------------

    def run_all(self):
        o = self.o
        py312 = Interp(o.python_label, o.python)
        interps = discover_interps(self.rootfs)
        sections = set(o.only.split(",")) if o.only else {"compat", "main", "control", "cpython", "allcpu", "deep", "scale", "native", "switches", "parts", "idlehost", "startup"}
        reps = o.reps
        if "compat" in sections:
            self.sec_compat(interps)
        if "main" in sections:
            self.group(py312, "chain", 100, TOOLS_312, 1)
            self.group(py312, "chain", 1000, TOOLS_312, reps)
            self.group(py312, "chain", 10000, TOOLS_312, 1)
            self.group(py312, "recursion", 1000, TOOLS_312, max(1, reps - 1), args=[300], depth=300)
            self.group(py312, "threads8", 1000, TOOLS_312, max(1, reps - 1))
            self.group(py312, "web", 1000, TOOLS_312, reps)
            self.group(py312, "frame_reuse", 1000, TOOLS_312, max(1, reps - 1))
        if "control" in sections:
            self.group(py312, "chain", 1000, ["pyperch", "pyperch-ctl"], reps, kind="control")
            self.group(py312, "chain", 10000, ["pyperch", "pyperch-ctl"], 1, kind="control")
            self.sec_interrupts(py312)
        if "cpython" in sections:
            if not self.rootfs:
                log("the sid rootfs is missing: skipping the CPython-profiler column")
            else:
                py315 = Interp("3.15 (Debian sid, static)", "/usr/bin/python3.15", self.rootfs)
                self.group(py315, "chain", 100, TOOLS_315, 1)
                self.group(py315, "chain", 1000, TOOLS_315, reps)
                self.group(py315, "chain", 10000, TOOLS_315, 1)
                self.group(py315, "recursion", 1000, TOOLS_315, max(1, reps - 1), args=[300], depth=300)
                self.group(py315, "threads8", 1000, TOOLS_315, max(1, reps - 1))
                self.group(py315, "web", 1000, TOOLS_315, reps)
                self.group(py315, "frame_reuse", 1000, TOOLS_315, max(1, reps - 1))
        if "allcpu" in sections:
            self.sec_allcpu(py312)
        if "deep" in sections:
            self.sec_deep(py312)
        if "native" in sections:
            self.sec_native(py312, reps)
        if "switches" in sections:
            py315 = Interp("3.15 (Debian sid, static)", "/usr/bin/python3.15", self.rootfs) if self.rootfs else None
            self.sec_switches(py312, py315)
        if "scale" in sections:
            idle_interps = [i for i in interps if not i.rootfs] or [py312]
            self.sec_scale(py312, idle_interps)
        if "parts" in sections:
            walk_parts.sec_parts(sys.modules[__name__], self, py312)
        if "startup" in sections:
            first_contact.sec_startup(sys.modules[__name__], self, py312)
        if "idlehost" in sections:
            walk_parts.sec_idlehost(sys.modules[__name__], self, py312, [i for i in interps if not i.rootfs] or [py312])


def discover_interps(rootfs):
    out = []
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    vdir = os.path.join(root, "versions")
    for minor in range(8, 14):
        cands = sorted(d for d in (os.listdir(vdir) if os.path.isdir(vdir) else []) if re.match(r"^3\.%d\.\d+$" % minor, d))
        if cands:
            exe = os.path.join(vdir, cands[-1], "bin", "python3.%d" % minor)
            if os.path.exists(exe):
                out.append(Interp(cands[-1], exe))
    if rootfs:
        for minor in (13, 14, 15):
            exe = "/usr/bin/python3.%d" % minor
            if os.path.exists(os.path.join(rootfs, exe.lstrip("/"))):
                out.append(Interp("3.%d (sid)" % minor, exe, rootfs))
    return out


# ---------------------------------------------------------------------------------------
# Report.


def fmt(x, nd=1):
    if x is None:
        return "n/a"
    if isinstance(x, float) and (x != x):
        return "n/a"
    return ("%%.%df" % nd) % x


def pct(x):
    return None if x is None else 100.0 * x


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def machine_info():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            info["cpu"] = m.group(1) if m else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    info["cpus"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            kb = int(re.search(r"MemTotal:\s*(\d+)", f.read()).group(1))
            info["memory_gb"] = round(kb / 1024 / 1024, 1)
    except (OSError, AttributeError):
        pass
    info["kernel"] = platform.release()
    try:
        with open("/etc/os-release") as f:
            m = re.search(r'PRETTY_NAME="([^"]*)"', f.read())
            info["os"] = m.group(1) if m else ""
    except OSError:
        pass
    return info


def ancestors():
    """This process and the ones that started it (cargo, xtask, a shell): not "other jobs"."""
    pids = set()
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def other_load(own_pids):
    """CPU-busy processes that are not ours (other jobs sharing the machine)."""
    out = sh("ps -eo pid,pcpu,comm --sort=-pcpu --no-headers | head -8")
    busy = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            try:
                pid, cpu = int(parts[0]), float(parts[1])
            except ValueError:
                continue
            if cpu >= 5.0 and pid not in own_pids and pid not in ancestors():
                busy.append("%s (%.0f%%)" % (parts[2], cpu))
    return busy


def cpu_times():
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat, and our
    own CPU seconds (this driver plus every child it has reaped, with their children)."""
    import resource
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    busy = (user + nice + system + irq + softirq) / hz
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return {"busy": busy, "steal": steal / hz, "ours": ours, "t": time.monotonic()}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


class Report(object):
    def __init__(self, bench, meta):
        self.b = bench
        self.r = bench.results
        self.meta = meta
        self.lines = []
        self.goals = []
        self.summary = []

    def w(self, s=""):
        self.lines.append(s)

    def runs_for(self, interp_label, workload, rate, tool, kind="compare"):
        out = []
        for gi, g in enumerate(self.r["groups"]):
            if g["interp"] == interp_label and g["workload"] == workload and g["rate"] == rate and g.get("kind", "compare") == kind:
                ids = {x["id"] for x in g["runs"] if x["tool"] == tool}
                out += [run for run in self.r["runs"] if run["id"] in ids]
        return out

    def agg(self, runs):
        """Median over repetitions of every number we report."""
        if not runs:
            return None
        ms = [r["metrics"] for r in runs]
        a = {"n": len(runs)}
        for key in ("achieved_hz", "achieved_ratio", "lost", "lost_share", "cpu_us_per_sample", "user_cpu_us_per_sample", "ring_bytes_per_sample",
                    "bpf_ns_per_sample", "bpf_ns_per_run", "run_cpu_us_per_sample", "rss_mb", "target_reads_per_sample",
                    "cpu_share_window", "target_cpu_share"):
            a[key] = median([m.get(key) for m in ms])
        a["slowdown"] = median([r.get("slowdown") for r in runs])
        a["slowdowns"] = [r.get("slowdown") for r in runs]
        a["slowdown_per_cpu"] = median([r.get("slowdown_per_cpu") for r in runs])
        acc = [m.get("accuracy") for m in ms if m.get("accuracy")]
        if acc:
            a["split_error_pp"] = median([x["split_error_pp"] for x in acc])
            a["noise_pp"] = median([x["noise_pp"] for x in acc])
            a["full_stack_share"] = median([x["full_stack_share"] for x in acc])
            a["mixed_share"] = median([x["mixed_share"] for x in acc])
            a["mixed_share_of_chain"] = median([x["mixed_share_of_chain"] for x in acc])
            a["mixed"] = sum(x["mixed"] for x in acc)
            a["samples_total"] = sum(x["samples"] for x in acc)
        a["bpf_total_ns"] = median([r.get("bpf_total_ns") for r in runs])
        a["bpf_total_runs"] = median([r.get("bpf_total_runs") for r in runs])
        return a

    def table(self, interp_label, workload, rates, tools):
        w = self.w
        if not any(self.runs_for(interp_label, workload, rate, tool) for rate in rates for tool in tools):
            w("(not run)")
            w()
            return {}
        w("| tool | rate (Hz) | achieved samples/s (% of requested; target on CPU) | lost | CPU us/sample: process | + BPF | = total | vs pyperch | BPF whole run: ms (program runs) | whole-run CPU us/sample | target slowdown | slowdown per target CPU-second | peak RSS MB | split error (pp) | full stack | impossible |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        summary = {}
        for rate in rates:
            base = self.agg(self.runs_for(interp_label, workload, rate, "pyperch"))
            for tool in tools:
                a = self.agg(self.runs_for(interp_label, workload, rate, tool))
                if not a:
                    continue
                summary[(rate, tool)] = a
                row = {"interp": interp_label, "workload": workload, "rate": rate, "tool": tool}
                row.update({k: v for k, v in a.items()})
                if tool != "pyperch" and base and base.get("cpu_us_per_sample") and a.get("cpu_us_per_sample"):
                    row["cpu_per_sample_vs_pyperch"] = a["cpu_us_per_sample"] / base["cpu_us_per_sample"]
                self.summary.append(row)
                ratio = ""
                if tool != "pyperch" and base and base.get("cpu_us_per_sample") and a.get("cpu_us_per_sample"):
                    ratio = "%.1fx" % (a["cpu_us_per_sample"] / base["cpu_us_per_sample"])
                elif tool == "pyperch":
                    ratio = "1x"
                slows = ", ".join(fmt(pct(s), 1) for s in a["slowdowns"] if s is not None)
                slow = "%s%%" % fmt(pct(a["slowdown"]), 1) + (" (%s)" % slows if a["n"] > 1 else "")
                lost = "n/a" if a["lost"] is None else "%d (%s%%)" % (a["lost"], fmt(pct(a["lost_share"]), 2))
                bpf = fmt((a["bpf_ns_per_sample"] or 0) / 1000.0, 2) if tool == "pyperch" else "-"
                imp = "-"
                if workload == "frame_reuse" and a.get("mixed_share") is not None:
                    imp = "%s%% of all, %s%% of chain samples (%d)" % (fmt(pct(a["mixed_share"]), 1), fmt(pct(a["mixed_share_of_chain"]), 1), a["mixed"])
                bpf_total = "-"
                if tool == "pyperch" and a.get("bpf_total_ns") is not None:
                    bpf_total = "%s (%s)" % (fmt(a["bpf_total_ns"] / 1e6, 1), fmt(a.get("bpf_total_runs"), 0))
                w("| %s | %d | %s (%s%%; %s%%) | %s | %s | %s | **%s** | %s | %s | %s | %s | %s%% | %s | %s ± %s | %s%% | %s |" % (
                    TOOL_TITLES[tool], rate, fmt(a["achieved_hz"], 0), fmt(pct(a["achieved_ratio"]), 0),
                    fmt(pct(a["target_cpu_share"]), 0), lost,
                    fmt(a["user_cpu_us_per_sample"], 2), bpf, fmt(a["cpu_us_per_sample"], 2), ratio, bpf_total,
                    fmt(a["run_cpu_us_per_sample"], 1), slow, fmt(pct(a["slowdown_per_cpu"]), 1), fmt(a["rss_mb"], 1),
                    fmt(a.get("split_error_pp"), 2), fmt(a.get("noise_pp"), 2), fmt(pct(a.get("full_stack_share")), 1), imp))
        w()
        return summary

    def build(self):
        r = self.r
        w = self.w
        meta = self.meta
        mi = meta["machine"]
        w("# pyperch benchmarks")
        w()
        w("pyperch side by side with py-spy, Austin and CPython's own sampling profiler, all run on one machine in one run.")
        w("Generated by `%s` on %s; the run took %.1f minutes. The same numbers, and every raw" % (
            meta["command"], meta["started"], meta["elapsed_s"] / 60.0))
        # Links relative to the report's own folder.
        md_dir = os.path.dirname(os.path.abspath(self.b.o.md))
        json_link = os.path.relpath(os.path.abspath(self.b.o.json), md_dir)
        readme_link = os.path.relpath(os.path.join(HERE, "README.md"), md_dir)
        w("measurement, are in [`%s`](%s); [`bench/README.md`](%s) explains the method and how to read these tables." % (
            os.path.relpath(os.path.abspath(self.b.o.json), ROOT), json_link, readme_link))
        w()
        w("## Machine")
        w()
        w("| | |")
        w("|---|---|")
        w("| CPU | %s, %d CPUs%s |" % (mi.get("cpu"), mi.get("cpus"), (" (%s guest)" % mi["virt"]) if mi.get("virt") and mi["virt"] != "none" else ""))
        w("| memory | %s GB |" % mi.get("memory_gb"))
        w("| kernel | Linux %s |" % mi.get("kernel"))
        w("| OS | %s |" % mi.get("os"))
        w("| load average at start / end | %s / %s |" % (meta["load_start"], meta["load_end"]))
        cu = meta.get("cpu_use")
        if cu and cu["wall_s"] > 0:
            w("| CPU used by other jobs during the run | %.0f CPU-seconds = %.0f%% of the machine's %d CPUs (whole machine busy %.0f%%, this benchmark %.0f%%, hypervisor steal %.1f%%) |" % (
                cu["others_cpu_s"], 100 * cu["others_cpu_s"] / (cu["wall_s"] * cu["cpus"]), cu["cpus"],
                100 * cu["busy_cpu_s"] / (cu["wall_s"] * cu["cpus"]), 100 * cu["ours_cpu_s"] / (cu["wall_s"] * cu["cpus"]),
                100 * cu["steal_cpu_s"] / (cu["wall_s"] * cu["cpus"])))
        w("| other busy processes at the start | %s |" % (", ".join(meta["other_busy"]) or "none"))
        w("| pyperch | %s (commit %s) |" % (meta["versions"].get("pyperch"), meta.get("commit", "?")))
        w("| peers | py-spy %s, Austin %s, CPython %s `profiling.sampling` |" % (
            meta["versions"].get("py-spy"), meta["versions"].get("austin"), meta["versions"].get("cpython")))
        w("| targets | CPython %s (pyenv, shared libpython) against every tool; Debian sid's static CPython 3.15 for pyperch against CPython's own profiler |" % meta["python_main"])
        w("| settings | %g s per profiled run (steady window from %g s after sampling starts to %g s before the end), %g s unprofiled windows between runs; repetitions at 1 kHz: %d for chain and web, %d for the other workloads; 1 at 100 Hz and 10 kHz |" % (
            self.b.o.duration, self.b.o.warm, self.b.o.tail, self.b.o.baseline, self.b.o.reps, max(1, self.b.o.reps - 1)))
        w()
        w("Reproduce with `%s` (as root, from the repository root)." % meta["command"])
        w()
        goals_at = len(self.lines)
        # Main tables.
        main = meta["python_main"]
        w("## pyperch, py-spy and Austin on CPython %s" % main)
        w()
        w("How to read these columns (details in [bench/README.md](bench/README.md)): achieved samples/s is what the profile holds ÷ the time the tool sampled, against the requested rate (one busy thread at a time), with the target's own CPU use beside it (pyperch, Austin `-s` and CPython `--mode cpu` sample only a thread that is on a CPU; py-spy counts every thread it does not consider idle). CPU us/sample = the profiler's CPU time (user + system, all threads) during the steady window ÷ the samples it recorded in that window; for pyperch, `+ BPF` adds the kernel program's own run time (`run_time_ns` of `pyperch_sample`) in the same window ÷ the same recorded samples, although the program also runs (and returns early) on every other CPU and process. `vs pyperch` = peer total ÷ pyperch total. Whole-run CPU includes start-up, attach and writing the output. Target slowdown = 1 − (workload iterations/s while profiled ÷ unprofiled, windows interleaved), median of the repetitions (each listed); per target CPU-second = the same with iterations per second of the target's own CPU time (blind to pauses, much less sensitive to other jobs). Split error = largest difference, in percentage points, between a profile's share of a function and the workload's own CPU-time measurement (± one standard error of sampling). Full stack = share of samples with every expected frame from the root down.")
        w()
        sums = {}
        for wl in ("chain", "recursion", "threads8", "web", "frame_reuse"):
            rates = [100, 1000, 10000] if wl == "chain" else [1000]
            w("### %s" % WORKLOAD_TITLES[wl])
            w()
            sums[wl] = self.table(main, wl, rates, TOOLS_312)
        sums315 = {}
        if self.b.rootfs:
            w("## pyperch and CPython's own profiler on CPython 3.15 (Debian sid)")
            w()
            w("CPython's profiler is `python3.15 -m profiling.sampling attach -a --mode cpu -r RATE -d SECS --collapsed`, run in the target's root (the sid rootfs) and mount namespace.")
            w()
            for wl in ("chain", "recursion", "threads8", "web", "frame_reuse"):
                rates = [100, 1000, 10000] if wl == "chain" else [1000]
                w("### %s (3.15)" % WORKLOAD_TITLES[wl])
                w()
                sums315[wl] = self.table("3.15 (Debian sid, static)", wl, rates, TOOLS_315)
        else:
            w("## CPython's own profiler")
            w()
            w("Skipped: the Debian sid root filesystem (`~/.cache/pyperch/sid-rootfs`) does not exist; `cargo xtask test` builds it.")
            w()
        # Control: the cost of the sampling interrupts alone.
        ctl_rows = []
        for rate in (1000, 10000):
            a = self.agg(self.runs_for(main, "chain", rate, "pyperch", kind="control"))
            c = self.agg(self.runs_for(main, "chain", rate, "pyperch-ctl", kind="control"))
            if a and c:
                ctl_rows.append((rate, a, c))
        if ctl_rows:
            w("## Where pyperch's target slowdown comes from")
            w()
            w("The chain workload on CPython %s again, with pyperch profiling it, and with pyperch *watching an idle Python process* instead (the control): the same perf events fire on every CPU and the same BPF program runs, but on the busy workload's CPU it finds an unregistered process and exits at once. The control's slowdown is the price of the sampling interrupts themselves on this machine (a VM: timer interrupts are expensive); the difference is what walking the stack adds. Runs interleaved with unprofiled windows, medians of the repetitions." % main)
            w()
            w("| rate (Hz) | pyperch: slowdown | per target CPU-second | BPF ns per program run | control: slowdown | per target CPU-second | BPF ns per program run |")
            w("|---:|---:|---:|---:|---:|---:|---:|")
            for rate, a, c in ctl_rows:
                w("| %d | %s%% (%s) | %s%% | %s | %s%% (%s) | %s%% | %s |" % (
                    rate, fmt(pct(a["slowdown"]), 1), ", ".join(fmt(pct(s), 1) for s in a["slowdowns"] if s is not None),
                    fmt(pct(a["slowdown_per_cpu"]), 1), fmt(a["bpf_ns_per_run"], 0),
                    fmt(pct(c["slowdown"]), 1), ", ".join(fmt(pct(s), 1) for s in c["slowdowns"] if s is not None),
                    fmt(pct(c["slowdown_per_cpu"]), 1), fmt(self.ctl_bpf_per_run(rate), 0)))
            w()
        ic = self.interrupt_cost()
        if ic:
            bpf_1k = next((a["bpf_ns_per_run"] for rate, a, c in ctl_rows if rate == 1000), None)
            w("The sampling interrupts measured directly: `bench/probe_gaps.py` spins on CPU 0 and times every gap longer than 3 us between two clock readings, alone and while pyperch samples an idle process (so on the probe's CPU the program exits at once). Extra gaps per second match the sampling rate; their extra time is what the interrupts take from whatever runs there.")
            w()
            w("| sampling | gaps > 3 us per second | mean gap (us) | time stolen from the spinning thread |")
            w("|---|---:|---:|---:|")
            for row in ic["rows"]:
                w("| %s | %s | %s | %s%% |" % ("none" if row["rate"] is None else "pyperch control, %d Hz" % row["rate"],
                                              fmt(row["gaps_per_s"], 0), fmt(row["mean_gap_us"], 1), fmt(pct(row["stolen_share"]), 2)))
            w()
            if ic.get("per_interrupt_us") is not None:
                w("Each sampling interrupt costs the interrupted thread about **%s us** on this machine (from the 10 kHz row, where the interrupts stand out most from the machine's other gaps); at 1 kHz that is **%s%%** of the CPU it runs on before pyperch reads a single frame, the floor under any profiler that stops the thread to sample it consistently. The kernel program's own work, %s us per sample at depth 34, comes on top." % (
                    fmt(ic["per_interrupt_us"], 1), fmt(pct(ic.get("share_1k")), 2),
                    fmt(bpf_1k / 1000.0 if bpf_1k is not None else None, 1)))
                w()
        # 10 kHz all CPUs.
        ac = r.get("allcpu")
        if ac:
            mm = ac["metrics"]
            info = ac["info"]
            ncpu = ac.get("busy_threads", os.cpu_count())
            w("## 10 kHz on every CPU")
            w()
            w("pyperch on the whole host (no `--pid`) at 10 kHz per CPU for %s s, with %d busy chain workloads (one per CPU)." % (ac["duration"], ncpu))
            w()
            w("| | |")
            w("|---|---|")
            oth = ac.get("others", {})
            w("| samples of the busy workloads (kernel) | %d (%s/s = %s%% of %d CPUs x 10 kHz) |" % (
                ac.get("ours_samples", 0), fmt(ac.get("ours_samples", 0) / ac["sampling_s"], 0),
                fmt(100.0 * ac.get("ours_samples", 0) / ac["sampling_s"] / (ncpu * 10000), 1), ncpu))
            w("| of which ok (in the profile) | %d |" % ac.get("ours_ok", 0))
            w("| of which not ok | %d (%s) |" % (sum(ac.get("ours_not_ok", {}).values()),
                                               ", ".join("%s %d" % kv for kv in ac.get("ours_not_ok", {}).items()) or "none"))
            w("| lost in the ring buffer (whole host) | %s |" % info.get("kernel_lost"))
            w("| **lost, busy workloads** (ring buffer + not ok) | **%s (%s%%)** |" % (ac.get("ours_lost"), fmt(pct(ac.get("ours_lost_share")), 3)))
            w("| all Python samples on the host (kernel) | %s, %d ok, %d not ok (%s) |" % (
                info.get("kernel_samples"), info.get("ok", 0), info.get("samples", 0) - info.get("ok", 0),
                ", ".join("%s %d" % (k, v) for k, v in info.get("outcomes", {}).items() if k != "ok") or "none"))
            w("| other Python processes that ran meanwhile | %d, with %d samples (%d ok) |" % (oth.get("processes", 0), oth.get("samples", 0), oth.get("ok", 0)))
            w("| CPU us/sample (all Python samples): process + BPF = total | %s + %s = %s |" % (fmt(mm.get("user_cpu_us_per_sample"), 2), fmt((mm.get("bpf_ns_per_sample") or 0) / 1000, 2), fmt(mm.get("cpu_us_per_sample"), 2)))
            w("| BPF whole run | %s ms in %s program runs (%s ns per run) |" % (
                fmt((ac.get("bpf_total_ns") or 0) / 1e6, 1), ac.get("bpf_total_runs", "?"),
                fmt((ac.get("bpf_total_ns") or 0) / ac["bpf_total_runs"], 0) if ac.get("bpf_total_runs") else "n/a"))
            w("| pyperch CPU share of one CPU (steady) | %s%% |" % fmt(pct(mm.get("cpu_share_window")), 1))
            w("| peak RSS | %s MB |" % fmt(mm.get("rss_mb"), 1))
            w()
        # Scale.
        if r["scale"]:
            w("## Whole-host scale: idle Python processes beside one busy one")
            w()
            w("pyperch on the whole host (no `--pid`) at 1 kHz; the idle processes sleep in Python, spread over the pyenv interpreters 3.8-3.13. py-spy, Austin and CPython's profiler attach to one process at a time and have no whole-host mode, so they have no column here. Medians of %d runs; the sizes are interleaved (1, 10, 50, 1, 10, 50, ...)." % self.b.o.scale_reps)
            w()
            w("| idle processes | Python processes pyperch registered | samples/s | CPU us/sample: process + BPF = total | whole-run CPU ms | BPF ns per program run | peak RSS MB |")
            w("|---:|---:|---:|---:|---:|---:|---:|")
            for n in (1, 10, 50):
                runs = [x for x in r["scale"] if x.get("idle") == n]
                if not runs:
                    continue
                a = self.agg(runs)
                procs = median([x["info"].get("registered") for x in runs])
                w("| %d | %s | %s | %s + %s = **%s** | %s | %s | **%s** |" % (
                    n, fmt(procs, 0), fmt(a["achieved_hz"], 0), fmt(a["user_cpu_us_per_sample"], 2),
                    fmt((a["bpf_ns_per_sample"] or 0) / 1000, 2), fmt(a["cpu_us_per_sample"], 2),
                    fmt(median([x["metrics"].get("run_cpu_s") for x in runs]) * 1000 if runs else None, 0),
                    fmt(a["bpf_ns_per_run"], 0), fmt(a["rss_mb"], 1)))
            w()
        # Deep stacks.
        if r["deep"]:
            w("## Deep stacks (pyperch only)")
            w()
            w("The recursion workload with the given number of Python frames at the leaf, pyperch `--pid` at 1 kHz. Kernel ns/sample = BPF run time in the steady window ÷ recorded samples (the early exits on the other CPU included); ring-buffer bytes = pyperch's record size, 56 + 24 x min(depth, 64) bytes; target reads = `target memory: N reads, M bytes` from `--stats` ÷ samples (reads of the target's memory by userspace to complete frames below the 64 the kernel sends in full, and to symbolize).")
            w()
            w("| depth | samples/s | kernel ns/sample | BPF whole run: ms (program runs) | BPF ns per program run | userspace CPU us/sample | whole-run CPU us/sample | ring-buffer bytes/sample | target reads/sample | target bytes/sample | frames: kernel / cache / memory | full stack | split error (pp) |")
            w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
            for run in r["deep"]:
                mm = run["metrics"]
                info = run["info"]
                depth = run["depth"]
                acc = mm.get("accuracy") or {}
                w("| %d | %s | %s | %s (%s) | %s | %s | %s | %d | %s | %s | %s / %s / %s | %s%% | %s |" % (
                    depth, fmt(mm["achieved_hz"], 0), fmt(mm.get("bpf_ns_per_sample"), 0),
                    fmt((run.get("bpf_total_ns") or 0) / 1e6, 1), run.get("bpf_total_runs", "?"), fmt(mm.get("bpf_ns_per_run"), 0),
                    fmt(mm.get("user_cpu_us_per_sample"), 2), fmt(mm.get("run_cpu_us_per_sample"), 1),
                    info.get("ring_bytes") and info["ring_bytes"] / max(1, run["recorded"]) or 56 + 24 * min(depth, 64),
                    fmt(mm.get("target_reads_per_sample"), 3), fmt(mm.get("target_bytes_per_sample"), 1),
                    info.get("frames_kernel", "?"), info.get("frames_cache", "?"), info.get("frames_memory", "?"),
                    fmt(pct(acc.get("full_stack_share")), 1), fmt(acc.get("split_error_pp"), 2)))
            w()
        # Native stacks.
        native_groups = [g for g in r["groups"] if g.get("kind") == "native"]
        if native_groups:
            w("## Native and kernel stacks (`--native`, `--kernel`)")
            w()
            w("The chain workload on CPython %s. CPU/sample = the profiler's own CPU in the steady window (user + system) plus, for pyperch, its BPF program's run time, per recorded sample; ring-buffer bytes/sample and losses from pyperch's `--stats` (losses: ring-buffer drops plus samples not kept), py-spy's from its error count. Goal: pyperch `--native` at most 1/20 of py-spy `--native`'s CPU per sample; `--kernel` at most 1 us per sample more than without." % main)
            w()
            w("| tool | rate (Hz) | runs | samples/s | CPU us/sample | of which BPF us | ring-buffer bytes/sample | lost |")
            w("|---|---:|---:|---:|---:|---:|---:|---:|")
            seen = set()
            for g in native_groups:
                for tool in g["tools"]:
                    key = (g["interp"], g["rate"], tool)
                    if key in seen:
                        continue
                    seen.add(key)
                    a = self.agg(self.runs_for(g["interp"], g["workload"], g["rate"], tool, kind="native"))
                    if not a:
                        continue
                    w("| %s | %d | %d | %s | %s | %s | %s | %s |" % (
                        SHORT[tool], g["rate"], a["n"], fmt(a["achieved_hz"], 0), fmt(a["cpu_us_per_sample"], 2),
                        fmt((a["bpf_ns_per_sample"] or 0) / 1000, 2) if tool.startswith("pyperch") else "-",
                        fmt(a["ring_bytes_per_sample"], 0) if a.get("ring_bytes_per_sample") else "-",
                        "%s (%s%%)" % (fmt(a["lost"], 0), fmt(pct(a["lost_share"]), 2)) if a["lost"] is not None else "?"))
            w()
        # Context switches (issue 11).
        sw = self.switch_rows()
        storm = self.storm_summary()
        if sw or storm:
            w("## Context switches: `--mode wall` and the rest of the host")
            w()
        if sw:
            w("The token workload: two threads pass a token through a pair of `queue.Queue`s, with a short busy loop per hand-over, so that every hand-over blocks one thread and wakes the other (about 20,000 context switches of its threads per second on this machine when nothing else runs; the rate falls when other jobs load the machine). Every tool records every thread's whole time at %d Hz: pyperch `--mode wall` (on-CPU samples plus every off-CPU interval charged exactly at the switch), py-spy `--idle` (3.12) and CPython's `profiling.sampling --mode wall` (3.15). Switches/s = voluntary + involuntary context switches of the workload's threads (from /proc) per second, in the unprofiled windows and in the profiled steady window. CPU us/switch = the profiler's CPU (user + system, all threads) in the steady window, plus for pyperch the run time of all its BPF programs in that window (`+ BPF`), ÷ the workload's context switches in that window. Target slowdown = 1 − (round trips/s profiled ÷ unprofiled, windows interleaved), median of the repetitions (each listed)." % SWITCH_RATE)
            w()
            w("| tool | target | switches/s unprofiled | switches/s profiled | target slowdown | CPU us/switch: process | + BPF | = total | profiler CPU share of one CPU | peak RSS MB |")
            w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for row in sw:
                w("| %s | %s | %s | %s | %s%% (%s) | %s | %s | **%s** | %s%% | %s |" % (
                    TOOL_TITLES[row["tool"]], row["interp"], fmt(row["base_switches"], 0), fmt(row["switches"], 0),
                    fmt(pct(row["slowdown"]), 1), ", ".join(fmt(pct(x), 1) for x in row["slowdowns"] if x is not None),
                    fmt(row["user_us"], 2), fmt(row["bpf_us"], 2) if row["tool"].startswith("pyperch") else "-",
                    fmt(row["total_us"], 2), fmt(pct(row["cpu_share"]), 1), fmt(row["rss_mb"], 1)))
            w()
        if storm:
            w("The rest of the host: a non-Python context-switch storm (`dd bs=1 | cat`, every one-byte write wakes the reader) while pyperch `--mode wall` registers only an idle Python process, so the scheduler-switch program sees unregistered threads only. Its run time per run (`run_time_ns` ÷ `run_cnt`) is set beside the sampling program's early exit in the same run, which is one map lookup (`--subprocesses` keeps one perf event per CPU at 1 kHz, so it runs on the storm's CPUs too). Medians of %d runs." % storm["n"])
            w()
            w("| storm switches/s | switch program runs/s (whole host) | switch program ns per run | sampling program's early exit (one lookup) ns per run |")
            w("|---:|---:|---:|---:|")
            w("| %s | %s | **%s** | %s |" % (fmt(storm["storm_switches_per_s"], 0), fmt(storm["switch_runs_per_s"], 0),
                                            fmt(storm["switch_ns_per_run"], 1), fmt(storm["sample_ns_per_run"], 1)))
            w()
        # Compat.
        if r["compat"]:
            w("## Workloads on every interpreter")
            w()
            names = ["chain", "recursion", "threads8", "web", "frame_reuse", "idle"]
            w("| interpreter | " + " | ".join(names) + " |")
            w("|---|" + "---|" * len(names))
            for label, row in r["compat"].items():
                w("| %s | %s |" % (label, " | ".join(row.get(n, "-") for n in names)))
            w()
        # The kernel program part by part, and the idle host (bench/walk_parts.py).
        self.lines += walk_parts.report(sys.modules[__name__], self)
        # Short programs (bench/first_contact.py).
        self.lines += first_contact.report(sys.modules[__name__], self)
        # Goals (inserted near the top).
        g = self.goals_section(sums, sums315)
        self.lines[goals_at:goals_at] = g
        return "\n".join(self.lines) + "\n"

    def switch_rows(self):
        """Per tool and target of the switches section: medians over its repetitions."""
        out = []
        for g in self.r["groups"]:
            if g.get("kind") != "switches":
                continue
            for tool in g["tools"]:
                runs = self.runs_for(g["interp"], g["workload"], g["rate"], tool, kind="switches")
                if not runs:
                    continue
                per = []
                for run in runs:
                    t = run.get("target") or {}
                    w = run.get("window") or {}
                    s0, s1 = t.get("w0"), t.get("w1")
                    n = (s1["switches"] - s0["switches"]) if s0 and s1 and s0.get("switches") is not None and s1.get("switches") is not None else None
                    if not n or "cpu_s" not in w:
                        continue
                    user = 1e6 * w["cpu_s"] / n
                    bpf = (w.get("bpf_ns") or 0) / 1000.0 / n
                    per.append({"user": user, "bpf": bpf, "total": user + bpf, "switches": switches_between(s0, s1),
                                "share": w["cpu_s"] / w["seconds"] if w.get("seconds") else None})
                a = self.agg(runs)
                out.append({"tool": tool, "interp": g["interp"], "n": len(runs),
                            "base_switches": median([x for x in g.get("baseline_switches", []) if x]),
                            "switches": median([x["switches"] for x in per]),
                            "slowdown": a["slowdown"], "slowdowns": a["slowdowns"],
                            "user_us": median([x["user"] for x in per]), "bpf_us": median([x["bpf"] for x in per]),
                            "total_us": median([x["total"] for x in per]), "cpu_share": median([x["share"] for x in per]),
                            "rss_mb": a["rss_mb"]})
        return out

    def storm_summary(self):
        rows = self.r.get("switch_storm") or []
        if not rows:
            return None
        keys = ("storm_switches_per_s", "switch_runs_per_s", "switch_ns_per_run", "sample_ns_per_run")
        out = {k: median([x.get(k) for x in rows]) for k in keys}
        out["n"] = len(rows)
        return out

    def interrupt_cost(self):
        """The probe's rows, and the cost of one sampling interrupt derived from them: from
        the highest rate, where the interrupts stand out most from the machine's other gaps."""
        rows = self.b.results.get("interrupts") or []
        if not rows:
            return None
        base = next((r for r in rows if r["rate"] is None), None)
        top = max((r for r in rows if r["rate"]), key=lambda r: r["rate"], default=None)
        out = {"rows": rows, "per_interrupt_us": None, "share_1k": None}
        if base and top:
            extra = top["gaps_per_s"] - base["gaps_per_s"]
            if extra > 0.5 * top["rate"]:
                out["per_interrupt_us"] = (top["stolen_share"] - base["stolen_share"]) / extra * 1e6
                out["share_1k"] = out["per_interrupt_us"] * 1e-6 * 1000
        return out

    def ctl_bpf_per_run(self, rate):
        runs = self.runs_for(self.meta["python_main"], "chain", rate, "pyperch-ctl", kind="control")
        vals = []
        for run in runs:
            w = run.get("window") or {}
            if w.get("bpf_runs"):
                vals.append(w["bpf_ns"] / w["bpf_runs"])
        return median(vals)

    def goals_section(self, sums, sums315):
        out = []
        rows = []
        r = self.r

        def verdict(ok):
            return "**met**" if ok else ("**NOT met**" if ok is not None else "not measured")

        # 1. CPU per sample ratios.
        limits = {"py-spy": 20, "py-spy-nb": 20, "austin": 4, "cpython": 4}
        cmp_rows = []
        all_ok = True
        any_cmp = False
        for label, ss in (("3.12", sums), ("3.15", sums315)):
            for wl, s in ss.items():
                for (rate, tool), a in s.items():
                    if tool == "pyperch":
                        continue
                    base = s.get((rate, "pyperch"))
                    if not base or not base.get("cpu_us_per_sample") or not a.get("cpu_us_per_sample"):
                        continue
                    ratio = a["cpu_us_per_sample"] / base["cpu_us_per_sample"]
                    ok = ratio >= limits[tool]
                    any_cmp = True
                    all_ok = all_ok and ok
                    cmp_rows.append((wl, rate, tool, base["cpu_us_per_sample"], a["cpu_us_per_sample"], ratio, limits[tool], ok))
        fails = [c for c in cmp_rows if not c[7]]
        at1k = [c for c in cmp_rows if c[1] == 1000 and c[0] == "chain"]
        desc = "; ".join("%s %s → %.1fx (needs %dx)" % (SHORT[c[2]], fmt(c[4], 1) + " us", c[5], c[6]) for c in at1k)
        rows.append(("Total CPU per sample (process + BPF) ≤ 1/20 of py-spy's, ≤ 1/4 of Austin's and of CPython's profiler: the reference case, depth 34 at 1 kHz",
                     "pyperch %s us (3.12), %s us (3.15); %s" % (
                         fmt(sums.get("chain", {}).get((1000, "pyperch"), {}).get("cpu_us_per_sample"), 2),
                         fmt(sums315.get("chain", {}).get((1000, "pyperch"), {}).get("cpu_us_per_sample"), 2), desc),
                     verdict(all(c[7] for c in at1k) if at1k else None)))
        rows.append(("The same, on every workload and rate",
                     "%d of %d workload x rate x peer comparisons met%s" % (
                         len(cmp_rows) - len(fails), len(cmp_rows),
                         (" (not met: %s)" % "; ".join("%s %s %d Hz %.1fx" % (c[0], SHORT[c[2]], c[1], c[5]) for c in fails)) if fails else ""),
                     verdict(all_ok if any_cmp else None)))
        # 2. Slowdown at 1 kHz.
        sl = []
        for label, ss in (("3.12", sums), ("3.15", sums315)):
            for wl, s in ss.items():
                a = s.get((1000, "pyperch"))
                if a and a.get("slowdown") is not None:
                    sl.append((label, wl, a["slowdown"]))
        ok = all(x[2] <= 0.02 for x in sl) if sl else None
        ctl = self.agg(self.runs_for(self.meta["python_main"], "chain", 1000, "pyperch-ctl", kind="control"))
        ctl_me = self.agg(self.runs_for(self.meta["python_main"], "chain", 1000, "pyperch", kind="control"))
        note = ""
        if ctl and ctl_me:
            note = "; control run (chain 3.12, interleaved): pyperch %s%%, the sampling interrupts alone %s%%" % (
                fmt(pct(ctl_me["slowdown"]), 1), fmt(pct(ctl["slowdown"]), 1))
        ic = self.interrupt_cost()
        if ic and ic.get("per_interrupt_us") is not None:
            note += "; measured directly, each sampling interrupt stops the thread it lands on for %s us on this machine, %s%% of a CPU at 1 kHz before any stack is read: the floor for in-kernel sampling here (see \"Where pyperch's target slowdown comes from\")" % (
                fmt(ic["per_interrupt_us"], 1), fmt(pct(ic.get("share_1k")), 2))
        rows.append(("Target slowdown at 1 kHz ≤ 2% (median of the interleaved repetitions)",
                     ", ".join("%s %s %s%%" % (wl, lab, fmt(pct(s), 1)) for lab, wl, s in sl) + note, verdict(ok)))
        # 3. 10 kHz all CPUs.
        ac = r.get("allcpu")
        if ac:
            ls = ac.get("ours_lost_share")
            ok = ls is not None and ls < 0.01
            ncpu = ac.get("busy_threads", 0)
            rows.append(("10 kHz on every CPU with under 1% of samples lost",
                         "%s%% of the busy workloads' samples lost (%s of %s: ring buffer + not ok); they got %s samples/s = %s%% of %d CPUs x 10 kHz" % (
                             fmt(pct(ls), 3), ac.get("ours_lost"), ac.get("ours_samples"),
                             fmt(ac.get("ours_samples", 0) / ac["sampling_s"], 0),
                             fmt(100.0 * ac.get("ours_samples", 0) / ac["sampling_s"] / (max(1, ncpu) * 10000), 1), ncpu),
                         verdict(ok)))
        else:
            rows.append(("10 kHz on every CPU with under 1% of samples lost", "not run", verdict(None)))
        # 4. Scale flatness.
        if r["scale"]:
            a1 = self.agg([x for x in r["scale"] if x.get("idle") == 1])
            a50 = self.agg([x for x in r["scale"] if x.get("idle") == 50])
            if a1 and a50 and a1.get("cpu_us_per_sample") and a1.get("rss_mb"):
                dc = a50["cpu_us_per_sample"] / a1["cpu_us_per_sample"] - 1
                dr = a50["rss_mb"] / a1["rss_mb"] - 1
                a10 = self.agg([x for x in r["scale"] if x.get("idle") == 10])
                worst_c = max(abs(x["cpu_us_per_sample"] / a1["cpu_us_per_sample"] - 1) for x in (a10, a50) if x)
                worst_r = max(abs(x["rss_mb"] / a1["rss_mb"] - 1) for x in (a10, a50) if x)
                ok = worst_c <= 0.10 and worst_r <= 0.10
                rows.append(("Profiler CPU and RSS flat (within 10%) from 1 to 50 idle Python processes",
                             "CPU/sample 1 → 50 idle: %s → %s us (%+.1f%%); RSS %s → %s MB (%+.1f%%); largest change over 10 and 50: CPU %.1f%%, RSS %.1f%%" % (
                                 fmt(a1["cpu_us_per_sample"], 2), fmt(a50["cpu_us_per_sample"], 2), 100 * dc,
                                 fmt(a1["rss_mb"], 1), fmt(a50["rss_mb"], 1), 100 * dr, 100 * worst_c, 100 * worst_r),
                             verdict(ok)))
        # 5. Accuracy.
        acc_rows = []
        acc_ok = True
        any_acc = False
        for label, ss, peers in (("3.12", sums, ["py-spy", "py-spy-nb", "austin"]), ("3.15", sums315, ["cpython"])):
            for wl, s in ss.items():
                me = s.get((1000, "pyperch"))
                if not me or me.get("split_error_pp") is None:
                    continue
                pe = [(p, s.get((1000, p))) for p in peers if s.get((1000, p)) and s[(1000, p)].get("split_error_pp") is not None]
                if not pe:
                    continue
                any_acc = True
                best_err = min(x[1]["split_error_pp"] for x in pe)
                best_full = max(x[1]["full_stack_share"] or 0 for x in pe)
                tol = 2 * (me.get("noise_pp") or 0)
                ok_err = me["split_error_pp"] <= best_err + tol
                ok_full = (me["full_stack_share"] or 0) >= best_full - 0.001
                acc_ok = acc_ok and ok_err and ok_full
                acc_rows.append("%s %s: error %s pp vs best peer %s pp, full %s%% vs %s%%%s" % (
                    wl, label, fmt(me["split_error_pp"], 2), fmt(best_err, 2), fmt(pct(me["full_stack_share"]), 1),
                    fmt(pct(best_full), 1), "" if (ok_err and ok_full) else " (NOT met)"))
        imp = []
        for label, ss in (("3.12", sums), ("3.15", sums315)):
            s = ss.get("frame_reuse") or {}
            for (rate, tool), a in s.items():
                if tool == "pyperch" and a.get("mixed") is not None:
                    imp.append((label, a["mixed"], a.get("samples_total")))
        imp_ok = all(x[1] == 0 for x in imp) if imp else None
        rows.append(("Accuracy at least as good as the best peer on every workload (split error within 2 standard errors of sampling noise, full-stack share not lower)",
                     "; ".join(acc_rows), verdict(acc_ok if any_acc else None)))
        rows.append(("Zero impossible stacks on the frame-reuse workload",
                     "; ".join("pyperch on %s: %d impossible of %s samples" % (l, m, t) for l, m, t in imp), verdict(imp_ok)))
        # 6. Context switches (issue 11).
        sw = [x for x in self.switch_rows()]
        mine = [x for x in sw if x["tool"] == "pyperch-wall"]
        if mine:
            ok = all(x["slowdown"] is not None and x["slowdown"] < 0.05 and x["total_us"] is not None and x["total_us"] < 2.0 for x in mine)
            rows.append(("`--mode wall` on a workload with about 20,000 context switches/s: target slowdown under 5% and profiler CPU (process + BPF) under 2 us per switch",
                         "; ".join("%s on %s: %s%% slowdown, %s us/switch at %s switches/s" % (
                             SHORT[x["tool"]], x["interp"], fmt(pct(x["slowdown"]), 1), fmt(x["total_us"], 2), fmt(x["switches"], 0)) for x in sw),
                         verdict(ok)))
        st = self.storm_summary()
        if st and st.get("switch_ns_per_run") is not None:
            ref = st.get("sample_ns_per_run")
            ok = ref is not None and st["switch_ns_per_run"] <= 1.25 * ref
            rows.append(("The scheduler-switch program costs unregistered processes at most a map lookup (at most 1.25x the sampling program's one-lookup early exit, same run)",
                         "%s ns per switch in a storm of %s switches/s; the one-lookup early exit: %s ns" % (
                             fmt(st["switch_ns_per_run"], 1), fmt(st["storm_switches_per_s"], 0), fmt(ref, 1)),
                         verdict(ok)))
        # Peers on frame reuse, for reference.
        out.append("## Goals")
        out.append("")
        out.append("| goal | measured | verdict |")
        out.append("|---|---|---|")
        for g, m, v in rows:
            out.append("| %s | %s | %s |" % (g, m.replace("|", "/"), v))
        out.append("")
        out.append("Every comparison of CPU per sample (pyperch total ÷ peer total, steady window):")
        out.append("")
        out.append("| workload | rate | peer | pyperch us/sample | peer us/sample | peer ÷ pyperch | needed | |")
        out.append("|---|---:|---|---:|---:|---:|---:|---|")
        for c in cmp_rows:
            out.append("| %s%s | %d | %s | %s | %s | %.1fx | %dx | %s |" % (
                c[0], " (3.15)" if c[2] == "cpython" else "", c[1], TOOL_TITLES[c[2]], fmt(c[3], 2), fmt(c[4], 1), c[5], c[6], "ok" if c[7] else "NOT met"))
        out.append("")
        self.goals = rows
        return out


# ---------------------------------------------------------------------------------------


def compact(obj):
    """Round floats to 7 significant digits, for a JSON file that reads (and diffs) well."""
    if isinstance(obj, float):
        return float("%.7g" % obj) if obj == obj else None
    if isinstance(obj, dict):
        return {str(k): compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [compact(v) for v in obj]
    return obj


def dumps_shallow(obj, depth=0, max_depth=3):
    """JSON with one line per item from max_depth levels down: readable, and much smaller
    than fully indented output."""
    pad = " " * depth
    if depth >= max_depth or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, default=str, separators=(",", ":"))
    if isinstance(obj, dict):
        items = ["%s %s: %s" % (pad, json.dumps(str(k)), dumps_shallow(v, depth + 1, max_depth)) for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = ["%s %s" % (pad, dumps_shallow(v, depth + 1, max_depth)) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def tool_versions(b):
    v = {}
    v["pyperch"] = sh("%s --version" % b.o.pyperch)
    v["py-spy"] = sh("%s/py-spy --version" % b.venv_bin).replace("py-spy ", "")
    v["austin"] = sh("%s/austin --version" % b.venv_bin).replace("austin ", "")
    if b.rootfs:
        v["cpython"] = sh("chroot %s /usr/bin/python3.15 -c 'import sys; print(sys.version.split()[0])'" % b.rootfs)
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pyperch", default=os.path.join(ROOT, "target/release/pyperch"))
    ap.add_argument("--venv", default=os.path.expanduser("~/.cache/pyperch/bench-venv"))
    ap.add_argument("--rootfs", default=os.path.expanduser("~/.cache/pyperch/sid-rootfs"))
    ap.add_argument("--python", default=None, help="interpreter for the main comparison (default: pyenv 3.12)")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per profiled run")
    ap.add_argument("--baseline", type=float, default=2.0, help="seconds per unprofiled window")
    ap.add_argument("--warm", type=float, default=0.8, help="steady window starts this long after sampling starts")
    ap.add_argument("--tail", type=float, default=0.3, help="steady window ends this long before the run's end")
    ap.add_argument("--reps", type=int, default=3, help="repetitions at 1 kHz (chain, web; one fewer elsewhere)")
    ap.add_argument("--scale-reps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma list of sections: compat,main,control,cpython,allcpu,deep,scale,native,switches,parts,idlehost,startup")
    ap.add_argument("--filter", default="", help="regex on WORKLOAD@RATE selecting the comparison groups to run")
    ap.add_argument("--quick", action="store_true", help="short runs, one repetition (for trying the harness)")
    ap.add_argument("--md", default=None,
                    help="report file (default BENCHMARKS.md; bench/partial-run.md with --only, --filter or --quick)")
    ap.add_argument("--json", default=None,
                    help="raw results (default bench/results.json; bench/partial-run.json with --only, --filter or --quick)")
    ap.add_argument("--command", default="cargo xtask bench", help="the command shown as the way to reproduce")
    o = ap.parse_args()
    # A partial run never overwrites the full run's report and results.
    partial = bool(o.only or o.filter or o.quick)
    if o.md is None:
        o.md = os.path.join(HERE, "partial-run.md") if partial else os.path.join(ROOT, "BENCHMARKS.md")
    if o.json is None:
        o.json = os.path.join(HERE, "partial-run.json") if partial else os.path.join(HERE, "results.json")
    if o.quick:
        o.duration, o.baseline, o.reps, o.scale_reps = 2.0, 1.0, 1, 1
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (pyperch loads eBPF; the peers attach with ptrace)")
    if o.python is None:
        cands = discover_interps(None)
        main_py = [i for i in cands if i.label.startswith("3.12.")] or [i for i in cands if i.label.startswith("3.11.")] or cands
        if not main_py:
            sys.exit("bench: no pyenv CPython 3.8-3.13 found for the main comparison (use --python)")
        o.python, o.python_label = main_py[0].exe, main_py[0].label
    else:
        o.python_label = sh("%s -c 'import sys; print(sys.version.split()[0])'" % o.python) or o.python
    for p in (o.pyperch, os.path.join(o.venv, "bin", "py-spy"), os.path.join(o.venv, "bin", "austin")):
        if not os.path.exists(p):
            sys.exit("bench: %s does not exist (cargo xtask bench builds and installs it)" % p)

    global LOG
    shutil.rmtree(WORK, ignore_errors=True)
    for d in ("out", "logs", "snaps", "bin"):
        os.makedirs(os.path.join(WORK, d), exist_ok=True)
    LOG = open(os.path.join(WORK, "logs", "bench.log"), "w")
    # Other people may rebuild target/release/pyperch while we run: use a private copy.
    binary = os.path.join(WORK, "bin", "pyperch")
    shutil.copy2(o.pyperch, binary)
    o.pyperch = binary

    b = Bench(o)
    if b.rootfs:
        dst = os.path.join(b.rootfs, INSIDE.lstrip("/"))
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(os.path.join(dst, "out"), exist_ok=True)
        os.makedirs(os.path.join(dst, "snaps"), exist_ok=True)
        shutil.copytree(WORKLOADS, os.path.join(dst, "workloads"), ignore=shutil.ignore_patterns("__pycache__"))
    else:
        log("warning: the sid rootfs %s does not exist: the CPython-profiler column is skipped" % o.rootfs)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    stats_path = "/proc/sys/kernel/bpf_stats_enabled"
    with open(stats_path) as f:
        stats_before = f.read().strip()
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    meta = {
        "command": o.command + (" -- --quick" if o.quick and "--quick" not in o.command else ""),
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "load_start": loadavg(),
        "other_busy": other_load(set()),
        "python_main": o.python_label,
        "commit": sh("git -C %s rev-parse --short HEAD" % ROOT),
        "options": {k: v for k, v in vars(o).items()},
    }
    meta["versions"] = tool_versions(b)
    log("pyperch %s; py-spy %s; austin %s; cpython %s" % (meta["versions"].get("pyperch"), meta["versions"].get("py-spy"),
                                                          meta["versions"].get("austin"), meta["versions"].get("cpython")))
    log("machine: %s; load %s; other busy processes: %s" % (meta["machine"], meta["load_start"], ", ".join(meta["other_busy"]) or "none"))
    failed = None
    ct0 = cpu_times()
    try:
        with open(stats_path, "w") as f:
            f.write("1")
        b.run_all()
    except KeyboardInterrupt as e:
        failed = "interrupted (%s)" % e
    except Exception as e:
        failed = "%s: %s" % (type(e).__name__, e)
        traceback.print_exc()
    finally:
        kill_all()
        try:
            with open(stats_path, "w") as f:
                f.write(stats_before)
        except OSError:
            pass
    meta["elapsed_s"] = time.monotonic() - t_start
    meta["load_end"] = loadavg()
    ct1 = cpu_times()
    wall = ct1["t"] - ct0["t"]
    ncpu = os.cpu_count() or 1
    busy = ct1["busy"] - ct0["busy"]
    ours = ct1["ours"] - ct0["ours"]
    meta["cpu_use"] = {"wall_s": wall, "cpus": ncpu, "busy_cpu_s": busy, "ours_cpu_s": ours,
                       "others_cpu_s": max(0.0, busy - ours), "steal_cpu_s": ct1["steal"] - ct0["steal"]}
    meta["failed"] = failed
    report = Report(b, meta)
    md = report.build()
    if failed:
        md = md.replace("# pyperch benchmarks\n", "# pyperch benchmarks\n\n**This run did not complete: %s.** The tables hold what was measured before it stopped.\n" % failed, 1)
    out = {"meta": meta,
           "goals": [{"goal": g, "measured": m, "verdict": v.strip("*")} for g, m, v in report.goals],
           "tables": report.summary,
           "results": b.results}
    with open(o.json, "w") as f:
        f.write(dumps_shallow(compact(out)) + "\n")
    with open(o.md, "w") as f:
        f.write(md)
    log("wrote %s and %s in %.1f minutes" % (o.md, o.json, meta["elapsed_s"] / 60))
    for g, m, v in report.goals:
        log("goal: %s -> %s" % (g, v.strip("*")))
    if failed:
        sys.exit("bench: %s" % failed)


if __name__ == "__main__":
    main()
