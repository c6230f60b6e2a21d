//! Builds the kernel program (`profiler-ebpf`) for `bpfel-unknown-none` with the nightly
//! toolchain and bpf-linker, and leaves the object in `OUT_DIR` for `include_bytes_aligned!`.
//! `cargo xtask setup` installs what this needs.
use std::{env, path::PathBuf};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../profiler-ebpf").canonicalize()?;
    let common_dir = manifest_dir.join("../profiler-common").canonicalize()?;
    println!("cargo:rerun-if-changed={}", common_dir.display());

    // bpf-linker lives in pyperch's tool cache (see `cargo xtask setup`); make it findable
    // without asking every developer to edit PATH.
    if let Some(home) = env::var_os("HOME") {
        let tools = PathBuf::from(home).join(".cache/pyperch/tools/bin");
        if tools.join("bpf-linker").exists() {
            let path = env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![tools];
            paths.extend(env::split_paths(&path));
            // SAFETY: build scripts are single-threaded at this point.
            unsafe { env::set_var("PATH", env::join_paths(paths)?) };
        }
    }
    let root_dir = ebpf_dir.to_str().ok_or_else(|| anyhow::anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [aya_build::Package { name: "profiler-ebpf", root_dir, ..Default::default() }],
        aya_build::Toolchain::default(),
    )
}
