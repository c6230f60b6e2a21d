"""Runs the Python source at PATH (a file on fuse_stall.py's mount) compiled under its own
name, for a heatmap whose source cannot be read: maps PATH (fuse_stall.py's ready signal),
compiles and runs its text, touches WARM once compiled (the server may then be stopped), and
spins in the source's spin(deadline) for SECONDS.

Usage: heatmap_fuse.py PATH WARM SECONDS

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import mmap
import sys
import time


def main():
    path, warm, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(path, "rb") as f:
        text = f.read()
        kept = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    namespace = {}
    exec(compile(text, path, "exec"), namespace)
    open(warm, "w").close()
    namespace["spin"](time.monotonic() + seconds)
    kept.close()


if __name__ == "__main__":
    main()
