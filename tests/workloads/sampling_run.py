"""CPython profiling.sampling's integration script (test_integration.py), written anew: a
main loop that takes three paths in turn (a CPU-heavy loop, recursive Fibonacci, nested
functions) for SECONDS of its own CPU time (default 1.5), then exits with status 0 by
itself.

Usage: sampling_run.py [SECONDS]

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import sys
import time


def slow_fibonacci(n):
    if n <= 1:
        return n
    return slow_fibonacci(n - 1) + slow_fibonacci(n - 2)


def cpu_intensive_work():
    result = 0
    for i in range(10000):
        result += i * i
        if i % 100 == 0:
            result = result % 1000000
    return result


def medium_computation():
    result = 0
    for i in range(3000):
        result += i * i
    return result


def nested_calls():
    def level1():
        def level2():
            return medium_computation()
        return level2()
    return level1()


def main_loop(seconds):
    end = time.process_time() + seconds
    iteration = 0
    while time.process_time() < end:
        iteration += 1
        if iteration % 3 == 0:
            cpu_intensive_work()
        elif iteration % 3 == 1:
            slow_fibonacci(15)
        else:
            nested_calls()


main_loop(float(sys.argv[1]) if len(sys.argv) > 1 else 1.5)
