"""Threads with Python names, for the thread-name tests (py-spy's test_thread_names).

Usage: thread_names.py DIR [MAX_SECONDS]

Keeps these threads spinning until SIGTERM or MAX_SECONDS (default 60):
- CustomThreadName-1, -2, -3: threading.Thread(name=...), as in py-spy's test; -2 carries
  40 more attributes (its attributes no longer fit the keys its class shares: a dict of its
  own) and -3's __dict__ was asked for (3.11+ then materialise the dict), so each way an
  instance can keep its attributes is read;
- one whose name is 52 characters long, far more than the 15 bytes the OS keeps;
- RenameMe-Before, which renames itself (thread.name = ...) to Renamed-After-Start once
  the file DIR/rename exists, then prints "renamed";
- one started with _thread.start_new_thread, which threading does not know (as a thread
  started from C), whose OS name (prctl PR_SET_NAME) is os-named-thread.
The main thread waits. Prints "ready <pid> <name>=<native thread id> ... main=<pid>" once
every thread runs.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import _thread
import os
import signal
import sys
import threading
import time

LONG_NAME = "A-Python-thread-name-of-52-characters-is-shown-whole"
STOP = threading.Event()
TIDS = {}
LOCK = threading.Lock()
COUNT = 6


def register(name):
    with LOCK:
        TIDS[name] = threading.get_native_id()


def spin():
    x = 0
    while not STOP.is_set():
        for i in range(5000):
            x = (x + i) % 65521


def named():
    register(threading.current_thread().name)
    spin()


def renamed(rename_file):
    register("RenameMe-Before")
    x = 0
    while not STOP.is_set():
        for i in range(5000):
            x = (x + i) % 65521
        if os.path.exists(rename_file) and threading.current_thread().name != "Renamed-After-Start":
            threading.current_thread().name = "Renamed-After-Start"
            print("renamed", flush=True)


def os_named():
    import ctypes
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"os-named-thread"), 0, 0, 0)  # PR_SET_NAME
    register("os-named-thread")
    spin()


def main():
    directory = sys.argv[1]
    max_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())
    assert len(LONG_NAME) == 52
    threads = [threading.Thread(target=named, name="CustomThreadName-%d" % i) for i in (1, 2, 3)]
    for i in range(40):
        setattr(threads[1], "extra_attribute_%d" % i, i)
    vars(threads[2])
    threads.append(threading.Thread(target=named, name=LONG_NAME))
    threads.append(threading.Thread(target=renamed, args=(os.path.join(directory, "rename"),),
                                    name="RenameMe-Before"))
    for t in threads:
        t.start()
    _thread.start_new_thread(os_named, ())
    while True:
        with LOCK:
            if len(TIDS) == COUNT:
                break
        time.sleep(0.01)
    print("ready %d %s main=%d" % (os.getpid(), " ".join("%s=%d" % kv for kv in sorted(TIDS.items())),
                                   os.getpid()), flush=True)
    deadline = time.monotonic() + max_seconds
    while not STOP.is_set() and time.monotonic() < deadline:
        STOP.wait(0.2)
    STOP.set()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
