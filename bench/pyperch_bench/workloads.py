"""Interpreters and workload processes: the interpreters found (pyenv, the sid rootfs), and a
running workload that reports the truth it carries in snapshots."""
import json
import os
import re
import select
import signal
import subprocess
import time

from .children import kill_tree, reap, spawn
from .common import INSIDE, WORK, WORKLOADS, log
from .measurement import ctx_switches, sched_ns


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
