"""One long wait, measured by the workload itself, for the agent's wall mode.

Usage: long_wait.py OUT_JSON SECONDS GO_FILE

Prints "ready <pid>", waits until GO_FILE exists (the test creates it once the agent
watches the process), then sleeps SECONDS in one `time.sleep` call inside `long_sleep`, and
writes its start and end (Unix time, `time.time`) to OUT_JSON. Then waits in `after` until
SIGTERM. Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import json
import os
import sys
import threading
import time

OUT, SECONDS, GO = sys.argv[1], float(sys.argv[2]), sys.argv[3]


def long_sleep(seconds):
    time.sleep(seconds)


def after():
    threading.Event().wait()


def main():
    print("ready %d" % os.getpid(), flush=True)
    while not os.path.exists(GO):
        time.sleep(0.02)
    start = time.time()
    long_sleep(SECONDS)
    end = time.time()
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"start": start, "end": end}, f)
    os.rename(tmp, OUT)
    after()


if __name__ == "__main__":
    main()
