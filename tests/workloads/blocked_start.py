"""Threads that are already blocked when pyperch starts, for `--mode wall`.

Usage: blocked_start.py GO_FILE

Starts three threads, waits until each is where it should be, then prints "ready <pid>":

- blocked_forever: waits on an Event nobody sets (in `blocked_forever`), for ever;
- late_waker: waits in `wait_for_go` on an Event that the main thread sets 1 s after
  GO_FILE appears (the test creates it once pyperch samples), then spins 3 ms and sleeps
  7 ms in a loop (`spin_sleep`);
- spinner: spins in `spin` for ever.

The main thread polls for GO_FILE every 10 ms, then sleeps. Runs unchanged on CPython
3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import threading
import time

GO = sys.argv[1]
clock = time.perf_counter
NEVER = threading.Event()
WAKE = threading.Event()


def blocked_forever():
    NEVER.wait()


def wait_for_go():
    WAKE.wait()


def spin_sleep():
    while True:
        end = clock() + 0.003
        while clock() < end:
            pass
        time.sleep(0.007)


def late_waker():
    wait_for_go()
    spin_sleep()


def spin():
    while True:
        pass


def main():
    for f in (blocked_forever, late_waker, spin):
        threading.Thread(target=f, name=f.__name__, daemon=True).start()
    # Long enough for both waiters to be asleep in their Event's lock.
    time.sleep(0.5)
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(GO):
        time.sleep(0.01)
    time.sleep(1.0)
    WAKE.set()
    while True:
        time.sleep(3600)


main()
