"""A process whose profile names hostile things, for --format heatmap: it spins for about
SECONDS (default 30) in a function compiled from DIR/gone<b>&"x.py, named
<script>alert(1)</script> (co_name, and co_qualname from 3.11), after replacing that source
file by a FIFO nobody writes to. A heatmap must escape both names, must not block on the
FIFO, and still write the file's page with its counted lines.

Usage: heatmap_hostile.py DIR [SECONDS]

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time

SOURCE = """\
def spin(deadline):
    x = 0
    while time.monotonic() < deadline:
        x = (x * 7 + 1) % 65521
    return x
"""
NAME = "<script>alert(1)</script>"


def main():
    folder = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    path = os.path.join(folder, 'gone<b>&"x.py')
    with open(path, "w") as f:
        f.write(SOURCE)
    namespace = {"time": time}
    exec(compile(SOURCE, path, "exec"), namespace)
    spin = namespace["spin"]
    renamed = {"co_name": NAME}
    if sys.version_info >= (3, 11):
        renamed["co_qualname"] = NAME
    spin.__code__ = spin.__code__.replace(**renamed)
    os.remove(path)
    os.mkfifo(path)
    print("ready", flush=True)
    spin(time.monotonic() + seconds)


if __name__ == "__main__":
    main()
