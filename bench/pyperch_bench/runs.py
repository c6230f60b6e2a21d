"""Profiler runs: one profiled run of a workload, its metrics, the groups and sections."""
import json
import os
import re
import signal
import subprocess
import sys
import time

from . import first_contact, storms, walk_parts
from .accuracy import LEAF_LABELS, accuracy
from .children import kill_tree, reap, sh, spawn
from .common import BASE_TOOL, HERE, INSIDE, SHORT, SWITCH_RATE, TOOLS_312, TOOLS_315, TOOLS_KERNEL, TOOLS_NATIVE, TOOLS_SWITCH_312, TOOLS_SWITCH_315, WORK, log
from .measurement import (bpf_prog_stats, bpf_progs, cpu_delta, ctx_switches, rate_between, rate_per_cpu, sched_ns, stat_ticks_s,
                          switches_between, thread_sched_ns, vm_hwm_kb, window_sched_ns)
from .peers import parse_profile, parse_tool_stderr
from .figures import fmt, pct
from .workloads import Interp, Target, discover_interps


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
        if tool in ("pyperch", "pyperch-ctl", "pyperch-native", "pyperch-native-copy", "pyperch-kernel", "pyperch-wall"):
            argv = [self.o.pyperch, "record", "--duration", str(d), "--rate", str(rate),
                    "--format", "collapsed", "--output", out_inside, "--stats"]
            if tool == "pyperch-native":
                argv.append("--native")
            elif tool == "pyperch-native-copy":
                argv += ["--native", "--native-walk", "copy"]
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
            m = {"t": time.monotonic(), "sched_ns": sched_ns(p.pid), "thread_ns": thread_sched_ns(p.pid), "ticks_s": stat_ticks_s(p.pid),
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
            window_ns = window_sched_ns(w0.get("thread_ns"), w1.get("thread_ns"))
            if window_ns is not None and wlen > 0:
                win["cpu_s"] = window_ns / 1e9
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
        # A native-heavy workload: numpy with its OpenBLAS (issue #31).
        venv = os.environ.get("PYPERCH_NUMPY_VENV", "")
        exe = os.path.join(venv, "bin", "python") if venv else ""
        if exe and os.path.exists(exe):
            os.environ["OPENBLAS_NUM_THREADS"] = "1"
            numpy_interp = Interp("3.12.1 + numpy 2.3.5", exe)
            self.group(numpy_interp, "numpy_mix", 1000, TOOLS_NATIVE, reps, kind="native")
        else:
            log("native: PYPERCH_NUMPY_VENV is not set: the numpy workload is not measured")

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

    def sec_freethreaded(self, reps):
        """pyperch on a free-threaded CPython 3.14t, taken from `PYPERCH_FT_PYTHON` (no package
        ships one, so it is built by hand; no peer here profiles one). Skipped, and said so in
        the report, where the variable is unset."""
        exe = os.environ.get("PYPERCH_FT_PYTHON", "")
        if not exe or not os.path.exists(exe):
            why = "PYPERCH_FT_PYTHON is not set" if not exe else "PYPERCH_FT_PYTHON names %s, which does not exist" % exe
            log("free-threaded: %s: not measured" % why)
            self.results["freethreaded_skipped"] = why
            return
        version = sh("%s -c 'import sys; print(sys.version.split()[0])'" % exe) or "3.14"
        ft = Interp("%st (free-threaded, built by hand)" % version, exe)
        self.group(ft, "chain", 1000, ["pyperch"], reps, kind="freethreaded")
        self.group(ft, "recursion", 1000, ["pyperch"], max(1, reps - 1), args=[300], depth=300, kind="freethreaded")
        self.group(ft, "threads8", 1000, ["pyperch"], max(1, reps - 1), kind="freethreaded")
        self.group(ft, "frame_reuse", 1000, ["pyperch"], max(1, reps - 1), kind="freethreaded")

    # -- everything ----------------------------------------------------------------------

    def run_all(self):
        o = self.o
        py312 = Interp(o.python_label, o.python)
        interps = discover_interps(self.rootfs)
        sections = set(o.only.split(",")) if o.only else {"compat", "main", "control", "cpython", "allcpu", "deep", "scale", "native", "switches", "parts", "idlehost", "startup", "freethreaded", "storms"}
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
        if "freethreaded" in sections:
            self.sec_freethreaded(reps)
        if "switches" in sections:
            py315 = Interp("3.15 (Debian sid, static)", "/usr/bin/python3.15", self.rootfs) if self.rootfs else None
            self.sec_switches(py312, py315)
        if "scale" in sections:
            idle_interps = [i for i in interps if not i.rootfs] or [py312]
            self.sec_scale(py312, idle_interps)
        if "parts" in sections:
            walk_parts.sec_parts(self, py312)
        if "startup" in sections:
            first_contact.sec_startup(self, py312)
        if "idlehost" in sections:
            walk_parts.sec_idlehost(self, py312, [i for i in interps if not i.rootfs] or [py312])
        if "storms" in sections:
            storms.sec_storms(self, py312)
