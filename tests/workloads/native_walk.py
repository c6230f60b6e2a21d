"""Native stacks the kernel walks (tests/tests/native_walk.rs).

Usage: native_walk.py MODE MAX_SECONDS [LIBRARY]

- `numpy`: a 400x400 matrix product and an FFT of it, in a loop (numpy from PyPI, with its
  OpenBLAS; run with OPENBLAS_NUM_THREADS=1): `matmul_line` and `fft_line` each spend their
  time in one line whose native stack goes down to the BLAS or pocketfft kernel.
- `big_frame`: `big_caller` calls the C function pyperch_big_frame (big_frame.c, LIBRARY),
  whose frame holds 24 KiB, and which calls `big_callback` back; `big_callback` spins.
- `debug_frame`: `df_caller` calls the C function pyperch_df_outer (debug_frame.c, LIBRARY,
  whose call frame information is only in `.debug_frame`), which spins in
  pyperch_df_leaf for a few hundred milliseconds per call.

Prints "ready" once running; exits on SIGTERM or after MAX_SECONDS.
"""
import ctypes
import os
import signal
import sys
import time

MODE, MAX_SECONDS = sys.argv[1], float(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def matmul_line(a):
    return a @ a


def fft_line(a):
    return __import__("numpy").fft.fft(a)


def run_numpy():
    import numpy as np

    a = np.random.default_rng(1).random((400, 400))
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + MAX_SECONDS
    while time.monotonic() < end:
        matmul_line(a)
        fft_line(a)


def big_callback(i):
    x = 0
    for k in range(20000):
        x += k * i
    return x & 0xFFFF


def big_caller(lib, callback):
    return lib.pyperch_big_frame(callback, 50)


def run_big_frame():
    lib = ctypes.CDLL(sys.argv[3])
    kind = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)
    callback = kind(big_callback)
    lib.pyperch_big_frame.argtypes = [kind, ctypes.c_uint64]
    lib.pyperch_big_frame.restype = ctypes.c_uint64
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + MAX_SECONDS
    while time.monotonic() < end:
        big_caller(lib, callback)


def df_caller(lib):
    return lib.pyperch_df_outer(300000000)


def run_debug_frame():
    lib = ctypes.CDLL(sys.argv[3])
    lib.pyperch_df_outer.argtypes = [ctypes.c_uint64]
    lib.pyperch_df_outer.restype = ctypes.c_uint64
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + MAX_SECONDS
    while time.monotonic() < end:
        df_caller(lib)


{"numpy": run_numpy, "big_frame": run_big_frame, "debug_frame": run_debug_frame}[MODE]()
