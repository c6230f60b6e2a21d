"""A known CPU split under a 30-call chain.

Usage: chain.py SNAPSHOT_PATH MAX_SECONDS

main() descends through 30 distinct functions (chain_00 ... chain_29) into
_harness.split_loop, which calls leaf_a (30 %) or leaf_b (70 %), identical busy loops,
and measures the CPU time of each call itself. A sample taken in a leaf has 34 Python
frames: <module>, main, chain_00 ... chain_29, split_loop, leaf_a|leaf_b.
One unit of work ("iters") is one leaf call. Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

def chain_00(h):
    return chain_01(h)


def chain_01(h):
    return chain_02(h)


def chain_02(h):
    return chain_03(h)


def chain_03(h):
    return chain_04(h)


def chain_04(h):
    return chain_05(h)


def chain_05(h):
    return chain_06(h)


def chain_06(h):
    return chain_07(h)


def chain_07(h):
    return chain_08(h)


def chain_08(h):
    return chain_09(h)


def chain_09(h):
    return chain_10(h)


def chain_10(h):
    return chain_11(h)


def chain_11(h):
    return chain_12(h)


def chain_12(h):
    return chain_13(h)


def chain_13(h):
    return chain_14(h)


def chain_14(h):
    return chain_15(h)


def chain_15(h):
    return chain_16(h)


def chain_16(h):
    return chain_17(h)


def chain_17(h):
    return chain_18(h)


def chain_18(h):
    return chain_19(h)


def chain_19(h):
    return chain_20(h)


def chain_20(h):
    return chain_21(h)


def chain_21(h):
    return chain_22(h)


def chain_22(h):
    return chain_23(h)


def chain_23(h):
    return chain_24(h)


def chain_24(h):
    return chain_25(h)


def chain_25(h):
    return chain_26(h)


def chain_26(h):
    return chain_27(h)


def chain_27(h):
    return chain_28(h)


def chain_28(h):
    return chain_29(h)


def chain_29(h):
    return _harness.split_loop(h)


def main():
    h = _harness.Harness()
    chain_00(h)


if __name__ == "__main__":
    main()
