"""Code objects created and dropped in a loop, each running for a known CPU time.

Usage: code_churn.py COUNT MILLISECONDS RESULT_JSON

For i in 0..COUNT: compiles a distinct function fn_<i> (file name "<churn_<i>>", its busy
line at 3 + i % 5), runs it for MILLISECONDS of CPU time, then drops every reference to
it and collects garbage, so the next code object is likely allocated at the same address.
A profiler that keys names by address alone then shows fn_<i> for later functions.
Writes {"count": COUNT, "cpu_ms": {name: ms}} to RESULT_JSON at the end; prints
"ready <pid>" before the first function. Runs on CPython 3.8 ... 3.15.
"""
import gc
import json
import os
import sys
import time

COUNT = int(sys.argv[1])
MS = float(sys.argv[2])
RESULT = sys.argv[3]

print("ready %d" % os.getpid(), flush=True)
time.sleep(1.0)  # lets the profiler register us before the first function
cpu = {}
for i in range(COUNT):
    name = "fn_%d" % i
    padding = "\n" * (i % 5)
    src = "def %s(deadline, clock):\n%s    x = 0\n    while clock() < deadline:\n        x += 1\n    return x\n" % (name, padding)
    namespace = {}
    exec(compile(src, "<churn_%d>" % i, "exec"), namespace)
    fn = namespace[name]
    start = time.thread_time()
    fn(start + MS / 1000.0, time.thread_time)
    cpu[name] = (time.thread_time() - start) * 1000.0
    del fn, namespace
    gc.collect()
with open(RESULT, "w") as f:
    json.dump({"count": COUNT, "cpu_ms": cpu}, f)
