"""The benchmark behind `cargo xtask bench`: pyperch beside py-spy, Austin and CPython's own
sampling profiler (see bench/README.md).

By job: `common` (paths, names, the log), `children` (every process started, killed at the
end), `workloads` (interpreters, workload processes and the truth they report), `peers` (the
tools' outputs taken apart), `measurement` (CPU, context switches, BPF run time, memory),
`accuracy` (stacks against the truth), `runs` (profiled runs, groups, sections),
`walk_parts` and `first_contact` (the `parts`, `idlehost` and `startup` sections),
`figures` and `report` (BENCHMARKS.md), `cli` (the options and the whole run).
Python 3.9+, standard library only; the unit tests are in bench/tests.
"""
