"""A native-heavy workload: numpy from PyPI (2.3.5 with its OpenBLAS), a 400x400 matrix
product and an FFT of it in turn (run with OPENBLAS_NUM_THREADS=1).

Usage: numpy_mix.py SNAPSHOT_PATH MAX_SECONDS

Native stacks go down through numpy's ufunc machinery (PyUFunc_GeneralizedFunctionInternal
holds 16 KiB on its stack) to the BLAS kernel and pocketfft. One unit of work ("iters") is one
product plus one FFT; the CPU time of each is measured with time.thread_time().
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

import numpy as np  # noqa: E402


def matmul_line(a):
    return a @ a


def fft_line(a):
    return np.fft.fft(a)


def main():
    h = _harness.Harness()
    a = np.random.default_rng(1).random((400, 400))
    clock = time.thread_time
    cpu, iters = h.cpu, h.iters
    cpu["matmul"] = 0.0
    cpu["fft"] = 0.0
    iters["calls"] = 0
    h.ready()
    n = 0
    while not h.expired():
        t0 = clock()
        matmul_line(a)
        t1 = clock()
        fft_line(a)
        cpu["matmul"] += t1 - t0
        cpu["fft"] += clock() - t1
        n += 1
        iters["calls"] = n


if __name__ == "__main__":
    main()
