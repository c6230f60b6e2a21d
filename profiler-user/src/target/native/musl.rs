//! Telling musl's libc among a process's mapped files, by the path the process maps it at.
//!
//! musl builds its own code without unwind tables (`-fno-asynchronous-unwind-tables`): its
//! `libc.so`, which is also its dynamic loader, keeps `.eh_frame` rows for a handful of
//! functions only (four in Debian's musl 1.2.3, none of them `read`, `__syscall_cp_asm` or
//! `__libc_start_main`). A native stack that reaches its code cannot be unwound further,
//! and the sample says so in musl's name (`sample::native`).
//!
//! The names are a table: musl's libc has no SONAME that says "musl" everywhere (Debian's has
//! none), but it is always mapped under one of these names.

/// Path tails musl's libc is mapped at: `*` stands for any run of characters without a `/`;
/// a pattern with `/` compares that many trailing components.
const MUSL_LIBC_PATHS: [&str; 3] = [
    // musl's own install and Alpine: the loader itself (`/lib/ld-musl-x86_64.so.1`).
    "ld-musl-*.so.1",
    // Alpine's `libc.musl-x86_64.so.1` (a link to the loader where a path is not resolved).
    "libc.musl-*.so.1",
    // Debian's and Ubuntu's musl: `/lib/ld-musl-x86_64.so.1` links to
    // `/usr/lib/x86_64-linux-musl/libc.so`, the path `/proc/PID/maps` shows.
    "*-linux-musl/libc.so",
];

/// Whether `path` (as the process maps it) is musl's libc.
pub fn is_musl_libc(path: &str) -> bool {
    MUSL_LIBC_PATHS.iter().any(|pattern| tail_matches(path, pattern))
}

/// Whether the last components of `path` (as many as `pattern` has) match `pattern`, whose
/// one `*` matches any characters but `/`.
fn tail_matches(path: &str, pattern: &str) -> bool {
    let components = pattern.split('/').count();
    let mut tail: Vec<&str> = path.rsplit('/').take(components).collect();
    if tail.len() < components {
        return false;
    }
    tail.reverse();
    let tail = tail.join("/");
    match pattern.split_once('*') {
        None => tail == pattern,
        Some((prefix, suffix)) => {
            tail.len() >= prefix.len() + suffix.len()
                && tail.starts_with(prefix)
                && tail.ends_with(suffix)
                && !tail[prefix.len()..tail.len() - suffix.len()].contains('/')
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn musl_libc_by_the_paths_processes_map_it_at() {
        for path in [
            "/lib/ld-musl-x86_64.so.1",
            "/usr/lib/ld-musl-aarch64.so.1",
            "/lib/libc.musl-x86_64.so.1",
            "/usr/lib/x86_64-linux-musl/libc.so",
            "/lib/x86_64-linux-musl/libc.so",
            // Inside a container's root, as the process sees it.
            "ld-musl-x86_64.so.1",
        ] {
            assert!(is_musl_libc(path), "{path}");
        }
        for path in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libc.so",
            "/usr/lib/x86_64-linux-musl/libc.so.6",
            "/usr/lib/x86_64-linux-musl/sub/libc.so",
            "/opt/ld-musl-x86_64.so.1.bak",
            "/opt/ld-musl-x86_64.so.1/libz.so",
            "/root/.cache/pyperch/musl/3.12.0/lib/libpython3.12.so.1.0",
            "libc.so",
            "",
            "/",
        ] {
            assert!(!is_musl_libc(path), "{path}");
        }
    }
}
