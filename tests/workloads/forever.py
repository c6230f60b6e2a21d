"""Runs until killed, for the tests of how a recording ends a launched command.

Usage: forever.py MODE STATEFILE
  MODE busy         forever_busy spins on the CPU
  MODE sleep        forever_sleep sleeps (never on a CPU)
  MODE ignore_term  spins like busy, with SIGTERM ignored (only SIGKILL ends it)
  MODE count_sigint spins; counts SIGINTs without exiting; exits 0 on SIGTERM
STATEFILE gets "pid <pid>" at start; in count_sigint mode, "sigint <n>" after each SIGINT
and "term <n>" at SIGTERM (n = SIGINTs received so far).

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import signal
import sys
import time

sigints = 0


def note(state_file, line):
    with open(state_file, "a") as f:
        f.write(line + "\n")


def forever_busy():
    x = 0
    while True:
        for i in range(10000):
            x = (x + i) % 65521


def forever_sleep():
    while True:
        time.sleep(3600)


def main():
    mode, state_file = sys.argv[1], sys.argv[2]
    note(state_file, "pid %d" % os.getpid())
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "count_sigint":
        def on_sigint(signum, frame):
            global sigints
            sigints += 1
            note(state_file, "sigint %d" % sigints)

        def on_sigterm(signum, frame):
            note(state_file, "term %d" % sigints)
            os._exit(0)

        signal.signal(signal.SIGINT, on_sigint)
        signal.signal(signal.SIGTERM, on_sigterm)
    print("ready", flush=True)
    if mode == "sleep":
        forever_sleep()
    else:
        forever_busy()


if __name__ == "__main__":
    main()
