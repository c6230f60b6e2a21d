//! Shared set-up of the property-based fuzz tests (`proptest`), which live beside each parser
//! of untrusted input in a `fuzz` test module.
//!
//! Every target checks that its parser never panics (debug builds add overflow checks: run
//! `cargo test -p profiler-user fuzz` as well as the release unit tests), that its output is
//! bounded by its input and its caps, and that its work is bounded (loops by input size).
//!
//! Case counts: each target has a small default so that the unit tests stay quick;
//! `PYPERCH_FUZZ_CASES=N` (or proptest's own `PROPTEST_CASES=N`) sets every target's count,
//! which is what `cargo xtask fuzz` does for long runs.

use proptest::test_runner::Config;

/// The configuration of a target with `default_cases` cases unless the environment says.
pub fn config(default_cases: u32) -> Config {
    let from_env = |name| std::env::var(name).ok().and_then(|v: String| v.trim().parse().ok());
    let cases = from_env("PYPERCH_FUZZ_CASES").or_else(|| from_env("PROPTEST_CASES")).unwrap_or(default_cases);
    // No regression files written into the source tree: cases found are kept as plain tests.
    Config { cases, failure_persistence: None, ..Config::default() }
}
