"""Known Python stacks above libpython and the C library, for interpreters built against
another C library than the host's (musl).

Usage: native_libc.py MODE OUT_JSON MAX_SECONDS

MODE is one of:
  chain    run_chain -> outer -> middle -> inner, inner spinning on one line: the exact Python
           stack (functions and lines) of nearly every sample.
  native   sum_caller runs sum(range(...)) (CPU in libpython's builtin sum, the leaf under
           the calling line); sort_caller runs sorted(..., key=sort_key) (libpython's list
           sort between the caller and the Python key function).
  syscalls read_caller reads /dev/zero one byte at a time (os.read: most of its CPU time
           inside the read system call, entered through the C library's syscall code);
           a second thread, sleeper, sleeps in time.sleep.
Once each function has run once, writes {"lines": {function: line}} to OUT_JSON: for each
caller (`<module>` and main too) the line of its call, for a leaf the line it spends its
time on, each taken from the interpreter (sys._getframe().f_lineno); then prints "ready".
Exits on SIGTERM or after MAX_SECONDS.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only; no ctypes, which a musl build without
libffi lacks).
"""
import json
import os
import signal
import sys
import threading
import time

MODE, OUT, MAX_SECONDS = sys.argv[1], sys.argv[2], float(sys.argv[3])
STOP = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: STOP.set())
LINES = {}


def here(name, ahead=1):
    # The line `ahead` lines below the caller's current one.
    LINES[name] = sys._getframe(1).f_lineno + ahead


def inner():
    here("inner")
    for i in range(200_000): x = (i * 7) % 65521
    return x


def middle():
    here("middle")
    return inner()


def outer():
    here("outer")
    return middle()


def run_chain():
    while True:
        here("run_chain")
        outer()
        yield


def sum_caller():
    here("sum_caller")
    return sum(range(2_000_000))


def sort_key(x):
    return -x


def sort_caller():
    here("sort_caller")
    return sorted(range(100_000), key=sort_key)


def run_native():
    while True:
        here("run_native")
        sum_caller()
        here("run_native_sort")
        sort_caller()
        yield


def read_caller(fd):
    here("read_caller")
    for _ in range(2000): os.read(fd, 1)


def sleeper():
    while not STOP.is_set():
        here("sleeper")
        time.sleep(0.05)


def run_syscalls():
    threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
    fd = os.open("/dev/zero", os.O_RDONLY)
    while True:
        here("run_syscalls")
        read_caller(fd)
        yield


def main():
    steps = {"chain": run_chain, "native": run_native, "syscalls": run_syscalls}[MODE]()
    deadline = time.monotonic() + MAX_SECONDS
    ready = False
    while not STOP.is_set() and time.monotonic() < deadline:
        here("main", 0); next(steps)
        if not ready:
            with open(OUT, "w") as f:
                json.dump({"lines": LINES}, f)
            print("ready", flush=True)
            ready = True


LINES["<module>"] = sys._getframe().f_lineno + 1
main()
