"""Functions named alike, compiled from alternating files, recreated at the same address.

Usage: same_name.py ITERATIONS MILLISECONDS RESULT_JSON

Iteration i compiles `def wrapper` from file "a.py" (i even) or "b.py" (i odd), with its
busy loop on different lines in each file, and calls it from run_a or run_b (so the caller
says which file is running) for MILLISECONDS of CPU time. Then every reference to it is
dropped and garbage collected, so the next wrapper's code object is likely allocated at the
same address. Writes {"iterations", "reused", "lines": {"a.py": [...], "b.py": [...]}} to
RESULT_JSON: `reused` counts iterations whose code object sits where a wrapper of the
other file was before. Prints "ready <pid>" first. Runs on CPython 3.8 ... 3.15.
"""
import gc
import json
import os
import sys
import time

ITERATIONS = int(sys.argv[1])
MS = float(sys.argv[2])
RESULT = sys.argv[3]

# Same name and bytecode (so the same allocation size); different file and lines.
BODY = "def wrapper(deadline, clock):\n    x = 0\n    while clock() < deadline:\n        x += 1\n    return x\n"
SOURCES = {"a.py": BODY, "b.py": "\n" * 20 + BODY}
LINES = {"a.py": list(range(1, 6)), "b.py": list(range(21, 26))}


def run_a(fn, deadline, clock):
    return fn(deadline, clock)


def run_b(fn, deadline, clock):
    return fn(deadline, clock)


print("ready %d" % os.getpid(), flush=True)
time.sleep(1.0)
reused = 0
held = {"a.py": set(), "b.py": set()}
for i in range(ITERATIONS):
    name = "a.py" if i % 2 == 0 else "b.py"
    namespace = {}
    exec(compile(SOURCES[name], name, "exec"), namespace)
    fn = namespace["wrapper"]
    address = id(fn.__code__)
    other = "b.py" if name == "a.py" else "a.py"
    if address in held[other]:
        reused += 1
    held[name].add(address)
    runner = run_a if name == "a.py" else run_b
    runner(fn, time.thread_time() + MS / 1000.0, time.thread_time)
    del fn, namespace
    gc.collect()
with open(RESULT, "w") as f:
    json.dump({"iterations": ITERATIONS, "reused": reused, "lines": LINES}, f)
