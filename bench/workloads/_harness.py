"""Plumbing shared by the benchmark workloads (stdlib only; CPython 3.8 ... 3.15).

Every workload is started as

    python WORKLOAD.py SNAPSHOT_PATH MAX_SECONDS [ARGS...]

prints "ready <pid>" on stdout once it is in its hot loop, and then:

- on SIGUSR1 writes a snapshot of its own counters to SNAPSHOT_PATH (atomically, through a
  rename): {"seq", "t" (time.monotonic()), "iters" (units of work done so far), "cpu"
  ({label: CPU seconds spent in that part, measured with time.thread_time()}), "pid"}.
  The driver takes snapshots around each profiled window, so the throughput and the true
  CPU split of exactly that window come from differences of two snapshots;
- exits on SIGTERM or after MAX_SECONDS, whichever comes first (a safety net, so that no
  workload outlives the benchmark even if the driver dies).

The signal handler runs in the main thread between bytecodes and costs nothing while no
signal arrives, so the workloads run at full speed between snapshots.
"""
import json
import os
import signal
import sys
import time


class Harness(object):
    def __init__(self, argv=None):
        argv = sys.argv if argv is None else argv
        if len(argv) < 3:
            sys.stderr.write("usage: %s SNAPSHOT_PATH MAX_SECONDS [ARGS...]\n" % argv[0])
            sys.exit(2)
        self.path = argv[1]
        self.max_seconds = float(argv[2])
        self.args = argv[3:]
        self.deadline = time.monotonic() + self.max_seconds
        self.stop = False
        self.seq = 0
        # label -> units of work; label -> CPU seconds. Plain dicts: each thread touches
        # only its own keys, and the snapshot copies them under the GIL.
        self.iters = {}
        self.cpu = {}
        signal.signal(signal.SIGUSR1, self._snapshot)
        signal.signal(signal.SIGTERM, self._terminate)

    def expired(self):
        if self.stop:
            return True
        if time.monotonic() > self.deadline:
            self.stop = True
        return self.stop

    def ready(self, extra=""):
        sys.stdout.write("ready %d%s\n" % (os.getpid(), extra))
        sys.stdout.flush()

    def run_threads(self, threads):
        """Starts the workload's threads, says ready, and waits (idle, in the main thread,
        where snapshots are taken) until SIGTERM or MAX_SECONDS; then joins them."""
        for t in threads:
            t.start()
        self.ready()
        while not self.expired():
            time.sleep(0.05)
        for t in threads:
            t.join(5)

    def _snapshot(self, signum, frame):
        self.seq += 1
        data = {
            "seq": self.seq,
            "t": time.monotonic(),
            "iters": sum(self.iters.values()),
            "iters_by": dict(self.iters),
            "cpu": dict(self.cpu),
            "pid": os.getpid(),
        }
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)

    def _terminate(self, signum, frame):
        self.stop = True


# The known CPU split used by chain.py and recursion.py: at the bottom of the stack,
# split_loop calls leaf_a or leaf_b (identical busy loops) chosen at random with
# P(leaf_a) = SHARE_A, and measures the CPU time of every call with time.thread_time().

SHARE_A = 0.3
LEAF_ITERATIONS = 4000


def leaf_a(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def leaf_b(n):
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def split_loop(h):
    import random

    rng = random.Random(20240601)
    clock = time.thread_time
    cpu = h.cpu
    iters = h.iters
    cpu["leaf_a"] = 0.0
    cpu["leaf_b"] = 0.0
    iters["calls"] = 0
    h.ready()
    n = 0
    while True:
        if rng.random() < SHARE_A:
            t0 = clock()
            leaf_a(LEAF_ITERATIONS)
            cpu["leaf_a"] += clock() - t0
        else:
            t0 = clock()
            leaf_b(LEAF_ITERATIONS)
            cpu["leaf_b"] += clock() - t0
        n += 1
        iters["calls"] = n
        if (n & 63) == 0 and h.expired():
            break
