"""Four threads in four known states, for `pyperch dump`.

Usage: dump.py OUT_JSON [MAX_SECONDS]

- "locked":  blocked_on_lock() blocks in LOCK.acquire() on a lock the main thread holds;
- "sleeper": sleeper() sleeps in time.sleep, with known local variables;
- "spinner": spin() loops in pure Python (the only thread that wants the GIL);
- "recurse": recurse(n) descends DEPTH frames, then blocks on an Event at the bottom.

The main thread waits on STOP (an Event). Once every thread is in place, it writes OUT_JSON:
each thread's native id and, for the three blocked threads, its stack as the interpreter
itself sees it (sys._current_frames), root first, as [function, file, line]; then prints
"ready". Exits on SIGTERM or after MAX_SECONDS (default 120).

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import json
import os
import signal
import sys
import threading
import time

DEPTH = 40
LOCK = threading.Lock()
STOP = threading.Event()
BOTTOM = threading.Event()
TIDS = {}
IN_PLACE = threading.Barrier(5)


def blocked_on_lock():
    TIDS["locked"] = threading.get_native_id()
    IN_PLACE.wait()
    LOCK.acquire()


def sleeper():
    label = "sleeper-\u00fcber"
    count = 12345678901234567890
    small = -42
    ratio = 0.25
    flag = True
    nothing = None
    blob = b"\x00ab'"
    items = [1, 2, 3]
    mapping = {"a": 1, "b": 2}
    long_text = "ab" * 50
    TIDS["sleeper"] = threading.get_native_id()
    IN_PLACE.wait()
    while True:
        time.sleep(1000)


def spin():
    TIDS["spinner"] = threading.get_native_id()
    IN_PLACE.wait()
    x = 0
    while True:
        x = (x + 1) % 65521


def recurse(n):
    if n == 0:
        TIDS["recurse"] = threading.get_native_id()
        IN_PLACE.wait()
        BOTTOM.wait()
        return 0
    return recurse(n - 1) + 1


def frames_of(tid_by_ident):
    """Root-first [function, file, line] of every thread, by native id."""
    out = {}
    for ident, frame in sys._current_frames().items():
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append([getattr(code, "co_qualname", code.co_name), code.co_filename, frame.f_lineno])
            frame = frame.f_back
        stack.reverse()
        if ident in tid_by_ident:
            out[tid_by_ident[ident]] = stack
    return out


def main():
    out_path = sys.argv[1]
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    LOCK.acquire()
    threads = [
        threading.Thread(target=blocked_on_lock, name="locked", daemon=True),
        threading.Thread(target=sleeper, name="sleeper", daemon=True),
        threading.Thread(target=spin, name="spinner", daemon=True),
        threading.Thread(target=recurse, args=(DEPTH,), name="recurse", daemon=True),
    ]
    for t in threads:
        t.start()
    IN_PLACE.wait()
    # Let the blocked threads reach their blocking call.
    time.sleep(0.5)
    by_ident = {t.ident: t.name for t in threads}
    stacks = frames_of(by_ident)
    result = {
        "main": threading.get_native_id(),
        "tids": TIDS,
        "stacks": {name: stacks.get(name) for name in ("locked", "sleeper", "recurse")},
        "spin_file": __file__,
    }
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.rename(out_path + ".tmp", out_path)
    print("ready", os.getpid(), flush=True)
    STOP.wait(limit)
    os._exit(0)


main()
