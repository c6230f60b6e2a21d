"""Maps one page of each FILE given (read and execute, as a library's code is mapped) and
spins in hostile_spin until SIGTERM or MAX_SECONDS (tests/hostile_native.rs: the files are
sparse ELF files whose headers claim tables of gigabytes).

Usage: map_claiming.py MAX_SECONDS FILE...
Prints "ready <pid>" on stdout once the files are mapped.
"""
import mmap
import os
import signal
import sys
import time

STOP = []


def hostile_spin(deadline):
    x = 0
    while not STOP and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x


def main():
    max_seconds = float(sys.argv[1])
    maps = []
    for path in sys.argv[2:]:
        fd = os.open(path, os.O_RDONLY)
        maps.append(mmap.mmap(fd, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC))
        os.close(fd)
    signal.signal(signal.SIGTERM, lambda *_: STOP.append(1))
    print("ready %d" % os.getpid(), flush=True)
    hostile_spin(time.monotonic() + max_seconds)


main()
