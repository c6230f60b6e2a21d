"""Calls a C++ function template through ctypes, for --native's demangled names.

Usage: native_cpp.py LIBRARY MAX_SECONDS

cpp_caller calls pyperch_cpp_spin (extern "C"), which runs pyperch::Spinner<int>::spin
(native_cpp.cpp) for 0.2 s at a time. Prints "ready" once running; exits on SIGTERM or
after MAX_SECONDS.
"""
import ctypes
import signal
import sys
import time

LIB = ctypes.CDLL(sys.argv[1])
LIB.pyperch_cpp_spin.argtypes = [ctypes.c_double]
DEADLINE = time.monotonic() + float(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def cpp_caller():
    return LIB.pyperch_cpp_spin(0.2)


def main():
    print("ready", flush=True)
    while time.monotonic() < DEADLINE:
        cpp_caller()


main()
