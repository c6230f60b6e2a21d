"""How long a running thread is stopped, and how often: spins for SECONDS on CPU CPU reading
the clock, and counts every gap between two readings longer than 3 us (an interrupt, or
another task on that CPU). Prints one JSON object.

Usage: probe_gaps.py [SECONDS] [CPU]. The benchmark runs it alone and while pyperch samples
another (idle) process: the difference is what each sampling interrupt costs the thread it
lands on, before any stack is read.
"""
import json
import os
import sys
import time

THRESHOLD_NS = 3000


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    cpu = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    os.sched_setaffinity(0, {cpu})
    clock = time.perf_counter_ns
    gaps = stolen = 0
    start = prev = clock()
    end = start + int(seconds * 1e9)
    while prev < end:
        now = clock()
        if now - prev > THRESHOLD_NS:
            gaps += 1
            stolen += now - prev
        prev = now
    elapsed = (prev - start) / 1e9
    print(json.dumps({
        "seconds": elapsed,
        "gaps_per_s": gaps / elapsed,
        "mean_gap_us": stolen / gaps / 1000.0 if gaps else 0.0,
        "stolen_share": stolen / 1e9 / elapsed,
    }))


if __name__ == "__main__":
    main()
