//! Names of native functions as people read them: Rust (`rustc-demangle`: legacy and v0
//! manglings) and C++ (`cpp_demangle`: the Itanium ABI of GCC and Clang, e.g.
//! `_ZNK9pocketfft6detail5cfftpIdE8pass_allILb1ENS0_5cmplxIdEEEEvPT0_d` →
//! `void pocketfft::detail::cfftp<double>::pass_all<true, pocketfft::detail::cmplx<double> >(...) const`).
//!
//! Invariants: a name comes from a target's file (hostile input): it is at most
//! [`MAX_MANGLED_BYTES`] long before it is parsed, the C++ parser's recursion is bounded
//! ([`RECURSION_LIMIT`]), a demangled name longer than [`MAX_DEMANGLED_BYTES`] is cut (at a
//! character boundary, ending in `...`), and anything that does not demangle is shown as it
//! is. Demangling is done once per frame address shown (the caller caches), never per sample.

/// Longer mangled names are shown as they are.
pub const MAX_MANGLED_BYTES: usize = 4096;
/// Longest demangled name kept (templates can expand a short name a thousandfold).
pub const MAX_DEMANGLED_BYTES: usize = 1024;
/// Nesting the C++ parser and printer may reach.
const RECURSION_LIMIT: u32 = 64;

/// The readable form of `raw`, or `None` when it is not a mangled name (or does not
/// demangle within the bounds).
pub fn demangle(raw: &str) -> Option<String> {
    if raw.len() > MAX_MANGLED_BYTES {
        return None;
    }
    if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        return Some(cut(format!("{rust:#}")));
    }
    // Itanium names start with `_Z` (`__Z` where a platform prefixes an underscore).
    if !(raw.starts_with("_Z") || raw.starts_with("__Z")) {
        return None;
    }
    let parse = cpp_demangle::ParseOptions::default().recursion_limit(RECURSION_LIMIT);
    let symbol = cpp_demangle::Symbol::new_with_options(raw.as_bytes(), &parse).ok()?;
    let print = cpp_demangle::DemangleOptions::default().recursion_limit(RECURSION_LIMIT);
    symbol.demangle(&print).ok().filter(|s| !s.is_empty()).map(cut)
}

/// `name` cut to [`MAX_DEMANGLED_BYTES`] at a character boundary, marked with `...`.
fn cut(mut name: String) -> String {
    if name.len() > MAX_DEMANGLED_BYTES {
        let mut end = MAX_DEMANGLED_BYTES - 3;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        name.push_str("...");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_names_as_cxxfilt_shows_them() {
        // numpy 2.3's pocketfft (the example) and plain functions, as `c++filt` gives them.
        let got = demangle("_ZNK9pocketfft6detail5cfftpIdE8pass_allILb1ENS0_5cmplxIdEEEEvPT0_d").expect("demangles");
        assert!(got.contains("pocketfft::detail::cfftp<double>::pass_all<true, pocketfft::detail::cmplx<double>"), "{got}");
        assert_eq!(demangle("_ZN3foo3barEv").as_deref(), Some("foo::bar()"));
        assert_eq!(demangle("_Z5helloi").as_deref(), Some("hello(int)"));
    }

    #[test]
    fn rust_names_lose_their_hash() {
        assert_eq!(demangle("_ZN4core3ptr13drop_in_place17h1234567890abcdefE").as_deref(), Some("core::ptr::drop_in_place"));
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo").as_deref(), Some("mycrate::foo"));
    }

    #[test]
    fn plain_and_hostile_names_stay_as_they_are() {
        for raw in ["PyObject_Call", "_PyEval_EvalFrameDefault", "", "_Z", "_ZZZZZZ", "main"] {
            assert_eq!(demangle(raw), None, "{raw}");
        }
        // Deep nesting stops at the recursion limit instead of the stack's end.
        let deep = format!("_Z1f{}i{}", "PFv".repeat(5000), "E".repeat(5000));
        let _ = demangle(&deep);
        let long = format!("_Z{}", "a".repeat(MAX_MANGLED_BYTES));
        assert_eq!(demangle(&long), None);
        // A name that expands beyond the cap is cut at a character boundary.
        let wide = format!("_ZN{}E", (0..60).map(|i| format!("{}{}", 14, format!("namespace{i:05}"))).collect::<String>());
        if let Some(shown) = demangle(&wide) {
            assert!(shown.len() <= MAX_DEMANGLED_BYTES, "{}", shown.len());
        }
    }
}
