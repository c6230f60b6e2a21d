"""The `startup` section of the benchmark (`--only startup`, issue #26 "first contact"):
pyperch beside `py-spy record` on short programs, in one run.

- start-up CPU: the profiler's own CPU time (user + system, from wait4, its reaped children
  included) for a 1 s recording of an idle Python process (`--pid`), which is all start-up,
  attach and end: median of the repetitions;
- time to first sample: `record -- python slots.py`, which from its first line spins in 60
  consecutive 10 ms slots (slot_00 ... slot_59) and exits; the earliest slot in the profile is
  when the first sample came, after the program's first line (to 10 ms): median;
- samples kept during imports: `record -- python import_loop.py` (40 standard-library
  modules imported, removed from sys.modules, again, for 1 s): pyperch's `--stats` samples
  and drops, py-spy's own count of samples and errors.
The workloads are copied to a directory of their own (bench/workloads has a token.py that
would shadow the standard library's).
"""
import os
import re
import shutil
import statistics
import subprocess
import time
from .common import WORK, WORKLOADS, log
from .figures import fmt, pct

REPS = 5
RATE = 1000


def run_measured(argv, timeout=60):
    """Runs argv; (exit status, stdout, stderr, CPU seconds of the process and its reaped
    children, wall seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=timeout)
    # communicate() reaped it; the children's rusage of this process grew by its usage.
    wall = time.monotonic() - t0
    return p.returncode, out, err, wall


def children_cpu():
    r = os.times()
    return r.children_user + r.children_system


def cpu_of(argv, timeout=60):
    before = children_cpu()
    rc, out, err, wall = run_measured(argv, timeout)
    return rc, out, err, children_cpu() - before, wall


def sec_startup(bench, interp):
    o = bench.o
    work = os.path.join(WORK, "first-contact")
    os.makedirs(work, exist_ok=True)
    for name in ("slots.py", "import_loop.py"):
        shutil.copy(os.path.join(WORKLOADS, name), work)
    pyspy = os.path.join(o.venv, "bin", "py-spy")
    out = os.path.join(work, "out")
    res = {"python": interp.label}

    # Start-up CPU: a 1 s recording of an idle process.
    idle = subprocess.Popen([interp.exe, "-c", "import time; time.sleep(3600)"])
    try:
        time.sleep(0.5)
        cpu = {"pyperch": [], "py-spy": []}
        for _ in range(REPS):
            for tool in ("pyperch", "py-spy"):
                if tool == "pyperch":
                    argv = [o.pyperch, "record", "--pid", str(idle.pid), "--duration", "1", "-o", out + ".txt"]
                else:
                    argv = [pyspy, "record", "--pid", str(idle.pid), "--duration", "1", "--format", "raw", "-o", out + ".raw"]
                rc, _, err, secs, _ = cpu_of(argv)
                if rc == 0:
                    cpu[tool].append(secs)
                else:
                    log("startup: %s failed (%s): %s" % (tool, rc, err.strip()[-300:]))
        res["startup_cpu"] = {t: {"runs": v, "median": statistics.median(v) if v else None} for t, v in cpu.items()}
        log("startup CPU: pyperch %s s, py-spy %s s" % (
            fmt(res["startup_cpu"]["pyperch"]["median"], 3), fmt(res["startup_cpu"]["py-spy"]["median"], 3)))
    finally:
        idle.kill()
        idle.wait()

    # Time to first sample.
    slots = os.path.join(work, "slots.py")
    first = {"pyperch": [], "py-spy": []}
    for _ in range(REPS):
        for tool in ("pyperch", "py-spy"):
            path = out + (".txt" if tool == "pyperch" else ".raw")
            if os.path.exists(path):
                os.remove(path)
            if tool == "pyperch":
                argv = [o.pyperch, "record", "--rate", str(RATE), "-o", path, "--", interp.exe, slots]
            else:
                argv = [pyspy, "record", "--rate", str(RATE), "--format", "raw", "-o", path, "--", interp.exe, slots]
            run_measured(argv)
            seen = set()
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    seen = {int(m) for m in re.findall(r"slot_(\d\d)", f.read())}
            first[tool].append(10 * min(seen) if seen else None)
    res["first_sample_ms"] = {t: {"runs": v, "median": statistics.median([x for x in v if x is not None]) if any(x is not None for x in v) else None,
                                  "missed": sum(1 for x in v if x is None)} for t, v in first.items()}
    log("time to first sample: pyperch %s ms, py-spy %s ms" % (
        res["first_sample_ms"]["pyperch"]["median"], res["first_sample_ms"]["py-spy"]["median"]))

    # Samples kept during imports.
    loop = os.path.join(work, "import_loop.py")
    rc, _, err, _, _ = cpu_of([o.pyperch, "record", "--rate", str(RATE), "--stats", "-o", out + ".txt", "--", interp.exe, loop])
    total = re.search(r"^  samples: (\d+)", err, re.M)
    ok = re.search(r"^    ok\s+(\d+)", err, re.M)
    pp = {"samples": int(total.group(1)) if total else None, "ok": int(ok.group(1)) if ok else None}
    if pp["samples"] is not None and pp["ok"] is not None:
        # Samples with no Python frame (the interpreter starting or ending) are not drops.
        reasons = re.findall(r"^    ([a-z][^\d\n]*?)\s+(\d+) \(", err.split("\n  process ")[0], re.M)
        reasons = {k.strip(): int(v) for k, v in reasons}
        pp["idle"] = reasons.pop("idle (no Python frame)", 0)
        reasons.pop("ok", None)
        pp["reasons"] = reasons
        pp["dropped"] = sum(reasons.values())
        kept = pp["samples"] - pp["idle"]
        pp["dropped_share"] = pp["dropped"] / kept if kept else None
    rc, stdout, err, _, _ = cpu_of([pyspy, "record", "--rate", str(RATE), "--format", "raw", "-o", out + ".raw", "--", interp.exe, loop])
    # py-spy prints its summary on standard output.
    m = re.search(r"Samples: (\d+) Errors: (\d+)", stdout + err)
    ps = {"samples": int(m.group(1)) if m else None, "errors": int(m.group(2)) if m else None}
    res["imports"] = {"pyperch": pp, "py-spy": ps}
    log("imports: pyperch %s samples, %s dropped; py-spy %s samples, %s errors" % (
        pp.get("samples"), pp.get("dropped"), ps["samples"], ps["errors"]))
    bench.results["first_contact"] = res


def report(rep):
    """The section's Markdown lines (empty when it did not run)."""
    r = rep.r.get("first_contact")
    if not r:
        return []
    lines = []
    w = lines.append
    su, fs, im = r.get("startup_cpu", {}), r.get("first_sample_ms", {}), r.get("imports", {})
    w("## Short programs: start-up, first sample, imports")
    w("")
    w("pyperch beside `py-spy record`, CPython %s, %d repetitions (medians; each run listed). Start-up CPU: the profiler's own CPU time (user + system, its reaped children included) for `record --pid PID --duration 1` of an idle Python process: start-up, attach, one idle second and the end. Time to first sample: `record --rate %d -- python slots.py`, which spins from its first line in consecutive 10 ms slots, each in its own function: the earliest slot in the profile (0 ms: the first slot). Samples during imports: `record --rate %d -- python import_loop.py` (40 standard-library modules imported and removed from `sys.modules`, again and again, for 1 s): pyperch's samples and drops from `--stats` (samples without a Python frame, the interpreter starting or ending, left out), py-spy's own `Samples: Errors:` line (`bench/pyperch_bench/first_contact.py`)." % (
        r.get("python"), REPS, RATE, RATE))
    w("")
    w("| | pyperch | py-spy |")
    w("|---|---:|---:|")

    def runs(v, nd):
        return ", ".join("-" if x is None else fmt(x, nd) for x in v)
    p, s = su.get("pyperch", {}), su.get("py-spy", {})
    w("| start-up CPU (s) | **%s** (%s) | **%s** (%s) |" % (fmt(p.get("median"), 3), runs(p.get("runs", []), 3),
                                                       fmt(s.get("median"), 3), runs(s.get("runs", []), 3)))
    p, s = fs.get("pyperch", {}), fs.get("py-spy", {})
    w("| time to first sample after the first line (ms) | **%s** (%s) | **%s** (%s) |" % (
        fmt(p.get("median"), 0), runs(p.get("runs", []), 0), fmt(s.get("median"), 0), runs(s.get("runs", []), 0)))
    p, s = im.get("pyperch", {}), im.get("py-spy", {})
    reasons = ", ".join("%s %d" % kv for kv in sorted((p.get("reasons") or {}).items(), key=lambda kv: -kv[1]) if kv[1])
    w("| samples during imports: kept / with Python frames | **%s / %s** (%s%% dropped%s) | **%s / %s** (%s errors) |" % (
        p.get("ok"), (p["samples"] - p.get("idle", 0)) if p.get("samples") is not None else None,
        fmt(pct(p.get("dropped_share")), 1), (": " + reasons) if reasons else "",
        (s.get("samples") - s.get("errors")) if s.get("samples") is not None and s.get("errors") is not None else None,
        s.get("samples"), s.get("errors")))
    w("")
    return lines
