"""The report: BENCHMARKS.md (tables, ratios against pyperch, the goals) and the JSON file's
shape."""
import json
import os

from . import first_contact, storms, walk_parts
from .common import HERE, ROOT, SHORT, SWITCH_RATE, TOOLS_312, TOOLS_315, TOOL_TITLES, WORKLOAD_TITLES
from .figures import fmt, median, pct
from .measurement import switches_between


# ---------------------------------------------------------------------------------------
# Report.


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
        self.freethreaded_section()
        # Native stacks.
        native_groups = [g for g in r["groups"] if g.get("kind") == "native"]
        if native_groups:
            w("## Native and kernel stacks (`--native`, `--kernel`)")
            w()
            w("The chain workload on CPython %s, and numpy 2.3.5 (a 400x400 matrix product and an FFT in turn, OpenBLAS on one thread; `numpy_mix`) where the numpy venv exists. `pyperch --native` walks the stack in the kernel from unwind tables; `--native-walk copy` copies 16 KiB of it for userspace to unwind. CPU/sample = the profiler's own CPU in the steady window (user + system) plus, for pyperch, its BPF program's run time, per recorded sample; ring-buffer bytes/sample and losses from pyperch's `--stats` (losses: ring-buffer drops plus samples not kept), py-spy's from its error count. Goal: pyperch `--native` at most 1/20 of py-spy `--native`'s CPU per sample; `--kernel` at most 1 us per sample more than without." % main)
            w()
            w("| workload | tool | rate (Hz) | runs | samples/s | CPU us/sample | of which BPF us | ring-buffer bytes/sample | lost |")
            w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
            seen = set()
            for g in native_groups:
                for tool in g["tools"]:
                    key = (g["interp"], g["workload"], g["rate"], tool)
                    if key in seen:
                        continue
                    seen.add(key)
                    a = self.agg(self.runs_for(g["interp"], g["workload"], g["rate"], tool, kind="native"))
                    if not a:
                        continue
                    w("| %s | %s | %d | %d | %s | %s | %s | %s | %s |" % (
                        g["workload"], SHORT[tool], g["rate"], a["n"], fmt(a["achieved_hz"], 0), fmt(a["cpu_us_per_sample"], 2),
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
        # The kernel program part by part, and the idle host (walk_parts.py).
        self.lines += walk_parts.report(self)
        # Short programs (first_contact.py).
        self.lines += first_contact.report(self)
        # Storms under the CPU budget (storms.py).
        self.lines += storms.report(self)
        # Goals (inserted near the top).
        g = self.goals_section(sums, sums315)
        self.lines[goals_at:goals_at] = g
        return "\n".join(self.lines) + "\n"

    def freethreaded_section(self):
        """pyperch on a free-threaded 3.14t beside pyperch on the main interpreter, same
        workloads at 1 kHz (no peer here profiles a free-threaded build)."""
        r, w = self.r, self.w
        groups = [g for g in r["groups"] if g.get("kind") == "freethreaded"]
        if not groups and not r.get("freethreaded_skipped"):
            return
        w("## Free-threaded CPython 3.14t (pyperch only)")
        w()
        if not groups:
            w("Not measured in this run: %s (a free-threaded CPython is built by hand; see docs/free-threaded.md)." % r["freethreaded_skipped"])
            w()
            return
        main = self.meta["python_main"]
        w("pyperch `--pid` at 1 kHz on CPython %s, each workload's threads running truly in parallel, beside pyperch on CPython %s (the main comparison above). CPU per sample = pyperch's process CPU plus BPF run time in the steady window, per recorded sample; split error and full stacks as in the tables above; mixed = stacks of the frame-reuse workload that never happened." % (groups[0]["interp"], main))
        w()
        w("| workload | samples/s | CPU us/sample (3.14t) | CPU us/sample (%s) | kernel ns/sample (3.14t) | target slowdown (3.14t) | split error pp (noise) | full stacks | mixed stacks |" % main)
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for g in groups:
            a = self.agg(self.runs_for(g["interp"], g["workload"], g["rate"], "pyperch", kind="freethreaded"))
            if not a:
                continue
            b = self.agg(self.runs_for(main, g["workload"], g["rate"], "pyperch"))
            mixed = "%d of %d" % (a.get("mixed", 0), a.get("samples_total", 0)) if g["workload"] == "frame_reuse" and "mixed" in a else "-"
            w("| %s | %s | %s | %s | %s | %s | %s (%s) | %s%% | %s |" % (
                WORKLOAD_TITLES.get(g["workload"], g["workload"]), fmt(a.get("achieved_hz"), 0), fmt(a.get("cpu_us_per_sample"), 2),
                fmt(b and b.get("cpu_us_per_sample"), 2), fmt(a.get("bpf_ns_per_sample"), 0), fmt(pct(a.get("slowdown")), 1) + "%",
                fmt(a.get("split_error_pp"), 2), fmt(a.get("noise_pp"), 2), fmt(pct(a.get("full_stack_share")), 1), mixed))
        w()

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
