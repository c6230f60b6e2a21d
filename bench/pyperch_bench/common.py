"""Paths, the tools' and workloads' names, and the log every part writes to."""
import os
import time



HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/


ROOT = os.path.dirname(HERE)


WORKLOADS = os.path.join(HERE, "workloads")


# Scratch: profiles, snapshots, logs (host side). PYPERCH_BENCH_WORK moves it, so that two
# benchmark runs on one machine (two clones) do not remove each other's files.
WORK = os.environ.get("PYPERCH_BENCH_WORK") or "/tmp/pyperch-bench"


INSIDE = "/tmp/pyperch-bench"  # the same directory inside the sid rootfs


TOOLS_312 = ["pyperch", "py-spy", "py-spy-nb", "austin"]


TOOLS_315 = ["pyperch", "cpython"]


TOOL_TITLES = {
    "pyperch": "pyperch",
    "py-spy": "py-spy 0.4 (default, pausing)",
    "py-spy-nb": "py-spy 0.4 --nonblocking",
    "austin": "Austin 3.7",
    "cpython": "CPython 3.15 profiling.sampling",
    "pyperch-ctl": "pyperch watching an idle process (control)",
    "pyperch-wall": "pyperch --mode wall",
    "py-spy-idle": "py-spy 0.4 --idle",
    "cpython-wall": "CPython 3.15 profiling.sampling --mode wall",
}


SHORT = {"pyperch-ctl": "control", "pyperch": "pyperch", "py-spy": "py-spy", "py-spy-nb": "py-spy nb", "austin": "austin", "cpython": "cpython",
         "pyperch-native": "pyperch --native", "pyperch-native-copy": "pyperch --native-walk copy",
         "pyperch-kernel": "pyperch --kernel", "py-spy-native": "py-spy --native",
         "pyperch-wall": "pyperch wall", "py-spy-idle": "py-spy --idle", "cpython-wall": "cpython wall"}


# Variants of a tool with extra flags: their reports and output parse as the base tool's.
BASE_TOOL = {"pyperch-native": "pyperch", "pyperch-native-copy": "pyperch", "pyperch-kernel": "pyperch", "py-spy-native": "py-spy",
             "pyperch-wall": "pyperch", "py-spy-idle": "py-spy", "cpython-wall": "cpython"}


# The context-switch section (`--only switches`): every thread's whole time (issue 11's wall
# mode) on the token workload (two threads passing a token through queues), at about 100 Hz,
# the peers' default rate; and the scheduler-switch program's cost for the rest of the host.
TOOLS_SWITCH_312 = ["pyperch-wall", "py-spy-idle"]


TOOLS_SWITCH_315 = ["pyperch-wall", "cpython-wall"]


SWITCH_RATE = 100


# The native-stacks section (`--only native`): pyperch --native (walked in the kernel, and the
# stack copy) against py-spy --native, and pyperch --kernel against plain pyperch, on the chain
# workload and on numpy (`numpy_mix`, where `PYPERCH_NUMPY_VENV` names the numpy venv).
TOOLS_NATIVE = ["pyperch-native", "pyperch-native-copy", "py-spy-native"]


TOOLS_KERNEL = ["pyperch", "pyperch-kernel"]


WORKLOAD_TITLES = {
    "chain": "CPU split under a 30-call chain (depth 34)",
    "recursion": "recursion, depth 300",
    "threads8": "8 threads in distinct functions",
    "web": "web-like: template rendering + JSON encoding, many short calls",
    "frame_reuse": "frame reuse: a1-a2-a3-leaf / b1-b2-b3-leaf alternately",
}


LOG = None


def log(msg):
    line = "[bench %s] %s" % (time.strftime("%H:%M:%S"), msg)
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()
