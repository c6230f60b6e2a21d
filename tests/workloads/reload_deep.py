"""A module reloaded with alternating sources whose frames sit below the first 64.

Usage: reload_deep.py PHASES MILLISECONDS RESULT_JSON

The module `reloaded` (written into this script's directory) has `entry` and `descend`,
with identical bytecode in both variants; variant "b" starts 30 lines further down. Each
phase rewrites the file with a variant, reloads it, and runs
`reloaded.entry(20, deep_a or deep_b)`: 21 frames of the reloaded module, then 100 frames of
`deep_a`/`deep_b` (this file), then a spin. So the module's frames are more than 64 frames
from the leaf, and the leaf's name says which variant is running. Writes
{"phases", "reused", "lines": {"a": [...], "b": [...]}} to RESULT_JSON (`reused`: phases whose
`descend` code object sits where the other variant's was before). The variants go
a, a, b, b, a, a, ...: CPython tends to alternate between two addresses across reloads, so
this order puts each variant where the other one was.. Prints "ready <pid>" first.
"""
import gc
import importlib
import json
import os
import sys
import time

PHASES = int(sys.argv[1])
MS = float(sys.argv[2])
RESULT = sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
BODY = (
    "def entry(n, leaf, deadline, clock):\n"
    "    return descend(n, leaf, deadline, clock)\n"
    "def descend(n, leaf, deadline, clock):\n"
    "    if n == 0:\n"
    "        return leaf(100, deadline, clock)\n"
    "    return descend(n - 1, leaf, deadline, clock)\n"
)
PAD = {"a": 0, "b": 30}
LINES = {v: list(range(PAD[v] + 1, PAD[v] + 7)) for v in PAD}


def spin(deadline, clock):
    x = 0
    while clock() < deadline:
        x += 1
    return x


def deep_a(n, deadline, clock):
    if n == 0:
        return spin(deadline, clock)
    return deep_a(n - 1, deadline, clock)


def deep_b(n, deadline, clock):
    if n == 0:
        return spin(deadline, clock)
    return deep_b(n - 1, deadline, clock)


def write(variant):
    path = os.path.join(HERE, "reloaded.py")
    with open(path, "w") as f:
        f.write("\n" * PAD[variant] + BODY)
    # A different size already invalidates the source; this makes the mtime differ too.
    os.utime(path, ns=(time.time_ns(), time.time_ns()))
    importlib.invalidate_caches()


write("a")
import reloaded  # noqa: E402

print("ready %d" % os.getpid(), flush=True)
time.sleep(1.0)
reused = 0
held = {"a": set(), "b": set()}
for i in range(PHASES):
    variant = "a" if (i // 2) % 2 == 0 else "b"
    if i > 0:
        write(variant)
        importlib.reload(reloaded)
        gc.collect()
    address = id(reloaded.descend.__code__)
    if address in held["b" if variant == "a" else "a"]:
        reused += 1
    held[variant].add(address)
    leaf = deep_a if variant == "a" else deep_b
    reloaded.entry(20, leaf, time.thread_time() + MS / 1000.0, time.thread_time)
with open(RESULT, "w") as f:
    json.dump({"phases": PHASES, "reused": reused, "lines": LINES}, f)
