"""Workloads whose CPU time is below the Python frames, for --native and --kernel.

Usage: native.py MODE OUT_JSON MAX_SECONDS [LIBRARY]

MODE is one of:
  ctypes  c_spin_caller calls pyperch_spin (a CPU-bound C function) and callback_caller
          calls pyperch_callback, which calls py_callback (Python) back; needs LIBRARY.
          Once both have run once (the library's code is paged in), writes
          {"warm": true} to OUT_JSON.
  zlib    zlib_caller compresses a large buffer; sort_caller sorts with key=sort_key.
  zero    a thread (zero_reader) reads /dev/zero in large chunks and sums part of each in
          Python; at exit its user and system time (getrusage(RUSAGE_THREAD)) go to
          OUT_JSON as {"utime": seconds, "stime": seconds}: between SIGUSR1 and SIGUSR2
          (the test sends them when the recording starts and ends, so that truth and
          profile cover the same window), or over its whole run if they never came.
Prints "ready" once running; exits on SIGTERM or after MAX_SECONDS.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import ctypes
import json
import os
import random
import resource
import signal
import sys
import threading
import time
import zlib

MODE, OUT, MAX_SECONDS = sys.argv[1], sys.argv[2], float(sys.argv[3])
STOP = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: STOP.set())
WINDOW_START = threading.Event()
WINDOW_END = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: WINDOW_START.set())
signal.signal(signal.SIGUSR2, lambda *_: WINDOW_END.set())


def c_spin_caller(lib):
    lib.pyperch_spin(3_000_000)


def py_callback(i):
    total = 0
    for k in range(3000):
        total += k * i
    return total & 0xFFFF


def callback_caller(lib, callback):
    lib.pyperch_callback(callback, 20)


def run_ctypes():
    lib = ctypes.CDLL(sys.argv[4])
    lib.pyperch_spin.argtypes = [ctypes.c_uint64]
    lib.pyperch_spin.restype = ctypes.c_uint64
    kind = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)
    lib.pyperch_callback.argtypes = [kind, ctypes.c_uint64]
    lib.pyperch_callback.restype = ctypes.c_uint64
    callback = kind(py_callback)
    c_spin_caller(lib)
    callback_caller(lib, callback)
    with open(OUT, "w") as f:
        json.dump({"warm": True}, f)
    yield
    while True:
        c_spin_caller(lib)
        callback_caller(lib, callback)
        yield


DATA = os.urandom(1 << 16) * 32


def zlib_caller():
    zlib.compress(DATA, 6)


def sort_key(x):
    return -x


def sort_caller():
    sorted(range(100_000), key=sort_key)


def run_zlib():
    yield
    while True:
        zlib_caller()
        sort_caller()
        yield


def thread_times():
    # The calling thread's user and system time (getrusage works without /proc, as under
    # chroot).
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime, usage.ru_stime


def zero_reader(result):
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    start = thread_times()
    cpu_start = time.thread_time()
    end = None
    windowed = False
    in_read = 0.0
    rng = random.Random(1)
    with open("/dev/zero", "rb", buffering=0) as f:
        while not STOP.is_set():
            if WINDOW_START.is_set() and not windowed:
                start, windowed = thread_times(), True
                cpu_start, in_read = time.thread_time(), 0.0
            if WINDOW_END.is_set() and end is None:
                end = thread_times()
                cpu_end = time.thread_time()
            before = time.thread_time()
            f.readinto(view)
            if end is None:
                in_read += time.thread_time() - before
            # A part of varying length (20,000 bytes on average): a loop of fixed length
            # takes nearly the sampling period of the test (2 ms at 499 Hz) on some versions,
            # and the samples then lock onto one phase of it, over-counting one side (seen:
            # 6 points too many in read()).
            total = 0
            for b in buf[: rng.randrange(5_000, 35_000)]:
                total += b
    if end is None:
        end = thread_times()
        cpu_end = time.thread_time()
    result["utime"] = end[0] - start[0]
    result["stime"] = end[1] - start[1]
    # Exact (scheduler-clock) CPU time of the window and the part of it spent inside
    # read(): the kernel's utime/stime split above is sampled at the scheduler tick.
    result["cpu"] = cpu_end - cpu_start
    result["in_read"] = in_read
    result["windowed"] = windowed


def run_zero():
    result = {}
    reader = threading.Thread(target=zero_reader, args=(result,))
    reader.start()
    yield
    while not STOP.is_set():
        time.sleep(0.05)
        yield
    reader.join()
    with open(OUT, "w") as f:
        json.dump(result, f)


steps = {"ctypes": run_ctypes, "zlib": run_zlib, "zero": run_zero}[MODE]()
next(steps)
print("ready", os.getpid(), flush=True)
deadline = time.monotonic() + MAX_SECONDS
for _ in steps:
    if STOP.is_set() or time.monotonic() > deadline:
        STOP.set()
        break
if MODE == "zero":
    for _ in steps:
        pass
