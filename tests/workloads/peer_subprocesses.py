"""py-spy's "subprocesses" and "subprocesses_zombie_child" cases, written anew.

Usage: peer_subprocesses.py MODE DIR [MAX_SECONDS]    (default 120)
- three:  the process starts two multiprocessing children (the interpreter's default start
          method: fork before 3.14, forkserver from 3.14 on); all three spin in
          family_busy. Each child writes DIR/child-<pid>.
- zombie: one multiprocessing child ("fork" start method) that returns at once and is never
          joined, so it stays a zombie; the parent spins in family_busy.
Prints "ready <pid>" once the children are started.

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import multiprocessing
import os
import sys
import time


def family_busy(deadline):
    x = 0
    while time.monotonic() < deadline:
        for i in range(5000):
            x = (x + i) % 65521
    return x


def child(directory, seconds):
    with open(os.path.join(directory, "child-%d" % os.getpid()), "w") as f:
        f.write("started\n")
    family_busy(time.monotonic() + seconds)


def short_child():
    pass


def main():
    mode, directory = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
    deadline = time.monotonic() + seconds
    if mode == "three":
        kids = [multiprocessing.Process(target=child, args=(directory, seconds), daemon=True) for _ in range(2)]
        for k in kids:
            k.start()
    else:
        k = multiprocessing.get_context("fork").Process(target=short_child)
        k.start()
        # Waits for its exit without reaping it (WNOWAIT): it stays a zombie.
        os.waitid(os.P_PID, k.pid, os.WEXITED | os.WNOWAIT)
    print("ready", os.getpid(), flush=True)
    family_busy(deadline)


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
