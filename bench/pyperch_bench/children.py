"""Child processes: every process the benchmark starts is recorded and killed at the end,
even on error; `sh` for one-line commands."""
import os
import signal
import subprocess



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


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""
