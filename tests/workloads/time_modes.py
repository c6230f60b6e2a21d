"""Known wall and off-CPU time, measured by the workload itself, for `--mode wall/off-cpu`.

Usage: time_modes.py OUT_JSON SECONDS GO_FILE

Prints "ready <pid>", waits until GO_FILE exists (the test creates it once pyperch samples),
then runs these threads for SECONDS and writes what each measured to OUT_JSON:

- spin_sleep: spins 3 ms in `spin_part`, then sleeps 7 ms in `sleep_part` (time.sleep);
- lock_waiter: blocks in `wait_lock` on a lock that lock_holder holds 20 ms at a time;
- pipe_reader: blocks in `read_pipe` (os.read) on a pipe that pipe_feeder feeds every 10 ms.

Each function's time is its wall time around the call (time.perf_counter); each thread's
lifetime is from the first to the last line of its target. Then waits for SIGTERM.
Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import json
import os
import sys
import threading
import time

OUT, SECONDS, GO = sys.argv[1], float(sys.argv[2]), sys.argv[3]
clock = time.perf_counter
RESULT = {}
LOCK = threading.Lock()
READ_FD, WRITE_FD = os.pipe()


def spin_part(seconds):
    end = clock() + seconds
    while clock() < end:
        pass


def sleep_part(seconds):
    time.sleep(seconds)


def spin_sleep(stop):
    born = clock()
    spin = sleep = 0.0
    while clock() < stop:
        t0 = clock()
        spin_part(0.003)
        t1 = clock()
        sleep_part(0.007)
        t2 = clock()
        spin += t1 - t0
        sleep += t2 - t1
    RESULT["spin_sleep"] = {"spin_part": spin, "sleep_part": sleep, "lifetime": clock() - born}


def wait_lock():
    LOCK.acquire()
    LOCK.release()


def lock_waiter(stop):
    born = clock()
    waited = 0.0
    time.sleep(0.005)
    while clock() < stop:
        t0 = clock()
        wait_lock()
        waited += clock() - t0
        time.sleep(0.001)
    RESULT["lock_waiter"] = {"wait_lock": waited, "lifetime": clock() - born}


def lock_holder(stop):
    while clock() < stop:
        with LOCK:
            time.sleep(0.02)
        time.sleep(0.002)


def read_pipe():
    return os.read(READ_FD, 1)


def pipe_reader(stop):
    born = clock()
    waited = 0.0
    while True:
        t0 = clock()
        data = read_pipe()
        waited += clock() - t0
        if data == b"x":
            break
    RESULT["pipe_reader"] = {"read_pipe": waited, "lifetime": clock() - born}


def pipe_feeder(stop):
    while clock() < stop:
        time.sleep(0.01)
        os.write(WRITE_FD, b".")
    os.write(WRITE_FD, b"x")


def main():
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(GO):
        time.sleep(0.01)
    stop = clock() + SECONDS
    threads = [
        threading.Thread(target=f, args=(stop,), name=f.__name__)
        for f in (spin_sleep, lock_waiter, lock_holder, pipe_reader, pipe_feeder)
    ]
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
