"""The known CPU split of chain.py at the bottom of a deep recursion.

Usage: recursion.py SNAPSHOT_PATH MAX_SECONDS [DEPTH]

main() recurses through descend() until the stack holds DEPTH Python frames (default 300)
at the leaf: <module>, main, descend x (DEPTH - 4), split_loop, leaf_a|leaf_b; then
_harness.split_loop calls leaf_a (30 %) or leaf_b (70 %) forever and measures each call.
One unit of work ("iters") is one leaf call. Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402


def descend(h, n):
    if n > 1:
        return descend(h, n - 1)
    return _harness.split_loop(h)


def main():
    h = _harness.Harness()
    depth = int(h.args[0]) if h.args else 300
    if depth < 5:
        raise SystemExit("DEPTH must be at least 5")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), depth + 200))
    descend(h, depth - 4)


if __name__ == "__main__":
    main()
