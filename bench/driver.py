#!/usr/bin/env python3
"""The `cargo xtask bench` driver: runs the package bench/pyperch_bench (`--help` for its
options; bench/README.md for what it measures)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pyperch_bench.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
