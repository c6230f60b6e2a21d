"""Time to first sample: from its first line, the program spins in 60 consecutive 10 ms slots,
each in its own function (slot_00 ... slot_59), then exits. The earliest slot a profile holds
says how long after the program's first line the profiler's first sample came (to 10 ms)."""
import time

SLOT_S = 0.010


def spin_until(end):
    while time.perf_counter() < end:
        pass


start = time.perf_counter()
for i in range(60):
    exec("def slot_%02d(end):\n    spin_until(end)\n" % i)
for i in range(60):
    globals()["slot_%02d" % i](start + SLOT_S * (i + 1))
