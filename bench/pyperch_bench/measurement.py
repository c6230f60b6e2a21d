"""Measuring processes from outside: CPU time, context switches, the BPF programs' run time
(from `bpf_stats_enabled` and fdinfo), peak memory, and the machine's own load."""
import os
import platform
import re
import time

from .children import sh


# ---------------------------------------------------------------------------------------
# Measuring a process from outside.


def thread_sched_ns(pid):
    """CPU time (user + system) of each live thread of pid, in ns, from schedstat: {tid: ns}."""
    out = {}
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    out[tid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return out


def sched_ns(pid):
    """CPU time (user + system) of every live thread of pid, in ns, from schedstat."""
    threads = thread_sched_ns(pid)
    return None if threads is None else sum(threads.values())


def window_sched_ns(before, after):
    """CPU time between two `thread_sched_ns` readings: per thread alive at the second, its
    time since the first (all of it for a thread started since). A thread that ended in
    between is left out: its time before the window must not count against the window (the
    sum over live threads would then fall), and its time inside it is lost (short: the
    threads that end are pyperch's file readers, which do their work before the window)."""
    if before is None or after is None:
        return None
    return sum(ns - before.get(tid, 0) for tid, ns in after.items())


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
