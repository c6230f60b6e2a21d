"""Two threads passing a token back and forth through a pair of queues: a context-switch storm.

Usage: token.py SNAPSHOT_PATH MAX_SECONDS [WORK]

Thread `ping` puts the token into one queue and waits on the other; thread `pong` does the
reverse, so every hand-over blocks one thread and wakes the other: two context switches of
the workload's threads per hand-over (each thread sleeps once per round trip), tens of
thousands per second. Units of work are round trips. The main thread only sleeps (and
answers the snapshot signal). This is the workload of the `switches` benchmark section:
pyperch `--mode wall` charges every one of these intervals exactly at the switch, so its
cost per switch and the slowdown it causes show here.
Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import queue
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

# Loop iterations each thread runs per hand-over (optional first argument): sets the pace.
WORK = 2000


def work(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def ping(h, to_pong, from_pong, n_work):
    n = 0
    while not h.stop:
        to_pong.put(n)
        from_pong.get()
        work(n_work)
        n += 1
        h.iters["round_trips"] = n
    to_pong.put(None)


def pong(h, from_ping, to_ping, n_work):
    while True:
        token = from_ping.get()
        if token is None:
            break
        work(n_work)
        to_ping.put(token)


def main():
    h = _harness.Harness()
    n_work = int(h.args[0]) if h.args else WORK
    h.iters["round_trips"] = 0
    a, b = queue.Queue(), queue.Queue()
    threads = [threading.Thread(target=pong, args=(h, a, b, n_work), name="pong", daemon=True),
               threading.Thread(target=ping, args=(h, a, b, n_work), name="ping", daemon=True)]
    h.run_threads(threads)


if __name__ == "__main__":
    main()
