"""Unit tests of the benchmark's pure parts (no profiler, no root): `cargo xtask test` runs
them with `python3 -m unittest discover -s bench/tests -t bench`."""
