"""CPython profiling.sampling's "script/module with arguments" CLI cases, written anew:
writes the arguments it was given (after OUT) as a JSON list into OUT, then spins in
argv_busy for SECONDS (from PYPERCH_ARGV_SECONDS, default 1) and exits with status 0.
Run as a script (`python sampling_argv.py OUT ...`) or as a module (`python -m
sampling_argv OUT ...`, with its directory on PYTHONPATH).

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import json
import os
import sys
import time


def argv_busy(deadline):
    x = 0
    while time.monotonic() < deadline:
        x = (x + 1) % 65521
    return x


def main():
    with open(sys.argv[1], "w") as f:
        json.dump({"argv": sys.argv[2:], "name": __name__, "spec": __spec__.name if __spec__ else None}, f)
    argv_busy(time.monotonic() + float(os.environ.get("PYPERCH_ARGV_SECONDS", "1")))


main()
