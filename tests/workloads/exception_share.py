"""Threads spinning inside and outside `except` blocks, for `--mode exception`.

Usage: exception_share.py OUT_JSON SECONDS GO_FILE

Prints "ready <pid>", waits until GO_FILE exists, then runs for SECONDS:
- in_handler: spins inside an `except` block (handling an exception the whole time);
- generator_in_handler: inside an `except` block, spins in a generator (whose own
  exception state is empty: `sys.exc_info()` there still reports the outer exception);
- outside_handler: spins, never raising;
- after_handler: raises and catches once, then spins after the `except` block (the
  thread's exception state then holds None or NULL: handling nothing).
Each thread first sets its OS name (prctl PR_SET_NAME, what /proc/PID/task/TID/comm shows)
to "pp-" and its function's name cut to 15 bytes, e.g. "pp-in_handler". Each thread asserts what `sys.exc_info()` says while it spins and writes its CPU time
(time.thread_time) to OUT_JSON. Then waits for SIGTERM. CPython 3.8 ... 3.15, stdlib only.
"""
import json
import os
import sys
import threading
import time

OUT, SECONDS, GO = sys.argv[1], float(sys.argv[2]), sys.argv[3]
RESULT = {}


def set_os_name():
    import ctypes
    name = ("pp-" + sys._getframe(1).f_code.co_name)[:15].encode()
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def spin(stop, handling):
    assert (sys.exc_info()[0] is not None) == handling
    x = 0
    while time.monotonic() < stop:
        for i in range(2000):
            x = (x + i) % 65521
    return x


def in_handler(stop):
    set_os_name()
    try:
        raise ValueError("handled for the whole run")
    except ValueError:
        spin(stop, True)
    RESULT["in_handler"] = time.thread_time()


def spinning_generator(stop):
    yield spin(stop, True)


def generator_in_handler(stop):
    set_os_name()
    try:
        raise KeyError("handled while a generator runs")
    except KeyError:
        for _ in spinning_generator(stop):
            pass
    RESULT["generator_in_handler"] = time.thread_time()


def outside_handler(stop):
    set_os_name()
    spin(stop, False)
    RESULT["outside_handler"] = time.thread_time()


def after_handler(stop):
    set_os_name()
    try:
        raise RuntimeError("caught at once")
    except RuntimeError:
        pass
    spin(stop, False)
    RESULT["after_handler"] = time.thread_time()


def main():
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(GO):
        time.sleep(0.01)
    stop = time.monotonic() + SECONDS
    targets = (in_handler, generator_in_handler, outside_handler, after_handler)
    # The Python name is what --threads shows when threading knows the thread: the same.
    threads = [threading.Thread(target=f, args=(stop,), name=("pp-" + f.__name__)[:15]) for f in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(OUT + ".tmp", "w") as f:
        json.dump(RESULT, f)
    os.rename(OUT + ".tmp", OUT)
    print("done", flush=True)
    while True:
        time.sleep(3600)


main()
