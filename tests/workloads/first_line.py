"""A program whose first statement is a 50 ms busy loop in a uniquely named function, then
which exits: `record -- python first_line.py` must show first_line_spin (the program is
sampled from its first line, not from whenever discovery happens to find it)."""
import time


def first_line_spin():
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:
        pass


first_line_spin()
