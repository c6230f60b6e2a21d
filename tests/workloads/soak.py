"""The soak test's workload: code objects with unique 4 KiB names, and processes churning.

Usage: soak.py names SECONDS
       soak.py churn SECONDS

`names`: until SECONDS have passed, compiles a function whose name (and so qualified name)
is 4096 characters long and unique (a counter in it), from a unique file name, runs it for
about 5 ms of CPU time, then drops it and sleeps 5 ms: a continuous stream (~100 a second)
of code objects a profiler has never seen, each with a long name, at half a CPU.
`churn`: every ~100 ms starts a short-lived interpreter (this same script, mode `child`)
that runs one uniquely named 4 KiB function for ~30 ms of CPU and exits; exited children
are reaped as it goes. (Light enough for a shared 2-core machine.)
Prints "ready <pid>" once started. Runs on CPython 3.8 ... 3.15.
"""
import os
import subprocess
import sys
import time

NAME_CHARS = 4096


def unique_name(tag, i):
    head = "f_%s_%d_%d_" % (tag, os.getpid(), i)
    return head + "x" * (NAME_CHARS - len(head))


def run_one(tag, i, cpu_seconds):
    name = unique_name(tag, i)
    src = "def %s(deadline, clock):\n    x = 0\n    while clock() < deadline:\n        x += 1\n    return x\n" % name
    namespace = {}
    exec(compile(src, "<soak_%s_%d_%d>" % (tag, os.getpid(), i), "exec"), namespace)
    fn = namespace[name]
    fn(time.thread_time() + cpu_seconds, time.thread_time)


def names(seconds):
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        run_one("n", i, 0.005)
        time.sleep(0.005)
        i += 1


def churn(seconds):
    end = time.monotonic() + seconds
    children = []
    while time.monotonic() < end:
        children.append(
            subprocess.Popen([sys.executable, os.path.abspath(__file__), "child", "0"], stdin=subprocess.DEVNULL)
        )
        children = [c for c in children if c.poll() is None]
        time.sleep(0.1)
    for c in children:
        c.wait()


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode == "child":
        run_one("c", 0, 0.03)
        return
    print("ready %d" % os.getpid(), flush=True)
    if mode == "names":
        names(seconds)
    elif mode == "churn":
        churn(seconds)
    else:
        sys.exit("unknown mode %s" % mode)


if __name__ == "__main__":
    main()
