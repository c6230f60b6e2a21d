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
import os
import shutil
import signal
import sys
import time
import traceback

from . import common
from .children import kill_all, on_signal, sh
from .common import HERE, INSIDE, ROOT, WORK, WORKLOADS, log
from .measurement import cpu_times, loadavg, machine_info, other_load
from .peers import tool_versions
from .report import Report, compact, dumps_shallow
from .runs import Bench
from .workloads import discover_interps


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
    ap.add_argument("--only", default="", help="comma list of sections: compat,main,control,cpython,allcpu,deep,scale,native,switches,parts,idlehost,startup,freethreaded,storms")
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

    shutil.rmtree(WORK, ignore_errors=True)
    for d in ("out", "logs", "snaps", "bin"):
        os.makedirs(os.path.join(WORK, d), exist_ok=True)
    common.LOG = open(os.path.join(WORK, "logs", "bench.log"), "w")
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
