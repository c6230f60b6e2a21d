//! Which CPython a file holds, and the layout that goes with it.
//!
//! Sources, most trusted first: `_Py_DebugOffsets.version` (3.13+), `Py_Version` (3.11+),
//! the file name (`libpython3.X.so...`, `python3.X`), then the symbols the file defines
//! (`elf::MARKERS`). The micro version of 3.8-3.10 comes from a `3.X.Y` string in the file
//! when all such strings agree, else it is 0.

use std::path::Path;

use super::elf::PythonFile;
use crate::target::layout::{OLDEST_SUPPORTED, PythonLayout, Version, debug_offsets, tables};

/// `(major, minor)` from names like `libpython3.9.so.1.0`, `libpython3.7m.so`, `python3.13t`
/// or `python3.12`; `None` for any other name.
pub fn from_file_name(path: &Path) -> Option<(u8, u8)> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_prefix("lib").unwrap_or(name).strip_prefix("python")?;
    let (major, rest) = rest.split_once('.')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (minor, rest) = rest.split_at(digits);
    // ABI flags (`m`, `d`, `t`, `u`), then the end, `.so...` or `-...`.
    let rest = rest.trim_start_matches(['m', 'd', 't', 'u']);
    if !(rest.is_empty() || rest.starts_with(".so") || rest.starts_with('-')) {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The micro version of `3.minor`, when the file's version strings agree on one.
fn micro_from_strings(file: &PythonFile, minor: u8) -> u8 {
    let mut micros = file.version_strings.iter().filter(|(m, _)| *m == minor).map(|(_, micro)| *micro);
    match (micros.next(), micros.next()) {
        (Some(micro), None) => micro,
        _ => 0,
    }
}

/// The version of the CPython in `file`, mapped from `path`; `Err` is a reason for the user.
pub fn determine(file: &PythonFile, path: &Path) -> Result<Version, String> {
    if let Some(version) = file.debug_offsets.as_deref().and_then(debug_offsets::peek_version) {
        return Ok(version);
    }
    if let Some(hex) = file.py_version {
        return Ok(Version::from_hex(hex));
    }
    match from_file_name(path) {
        Some((major, minor)) if major != 3 || minor >= file.marker_minor => {
            Ok(Version::new(major, minor, micro_from_strings(file, minor)))
        }
        Some((major, minor)) => Err(format!(
            "its file name says {major}.{minor} but it defines symbols of 3.{} or later",
            file.marker_minor
        )),
        // Without a telling name, the symbols pin down 3.7-3.10 (3.11+ has `Py_Version`).
        None if file.marker_minor <= 10 => {
            Ok(Version::new(3, file.marker_minor, micro_from_strings(file, file.marker_minor)))
        }
        None => Err("its version cannot be told: no _Py_DebugOffsets, no Py_Version, no version in its name".into()),
    }
}

/// The layout for `version`, from the tables (3.8-3.12) or the file's `_Py_DebugOffsets`
/// (3.13+); `Err` is a reason for the user.
pub fn layout(file: &PythonFile, version: Version) -> Result<PythonLayout, String> {
    if version < OLDEST_SUPPORTED {
        return Err(format!("CPython {version} is older than 3.8, the oldest version pyperch supports"));
    }
    if let Some(layout) = tables::layout_for(version) {
        return Ok(layout);
    }
    match &file.debug_offsets {
        Some(bytes) => debug_offsets::layout_from_bytes(bytes).map_err(|e| e.to_string()),
        None if version.publishes_debug_offsets() => {
            Err(format!("CPython {version} should start _PyRuntime with _Py_DebugOffsets but this file does not"))
        }
        None => Err(format!("CPython {version} is not supported (pyperch supports 3.8 to 3.15)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let cases = [
            ("/usr/lib/libpython3.9.so.1.0", Some((3, 9))),
            ("/root/.pyenv/versions/3.7.16/lib/libpython3.7m.so.1.0", Some((3, 7))),
            ("/usr/bin/python3.15", Some((3, 15))),
            ("python3.13t", Some((3, 13))),
            ("/usr/lib/libpython3.12d.so", Some((3, 12))),
            ("/usr/bin/python2.7", Some((2, 7))),
            ("/usr/bin/python3", None),
            ("/usr/bin/python3.x", None),
            ("/usr/bin/python3.10x.so", None),
            ("/usr/lib/libpython3.so", None),
            ("/usr/bin/python3.11-config", Some((3, 11))),
            ("/usr/bin/ruby3.1", None),
        ];
        for (path, expected) in cases {
            assert_eq!(from_file_name(Path::new(path)), expected, "{path}");
        }
    }

    fn file(marker_minor: u8, version_strings: Vec<(u8, u8)>) -> PythonFile {
        PythonFile {
            is_exec: false,
            loads: Vec::new(),
            runtime: 0,
            runtime_size: 0,
            code_type: None,
            str_type: None,
            bytes_type: None,
            none: None,
            next_func_version: None,
            py_version: None,
            debug_offsets: None,
            gilstate_tls: None,
            tss_key_offset: None,
            marker_minor,
            version_strings,
            asyncio_debug: None,
        }
    }

    #[test]
    fn versions_without_published_version() {
        let lib39 = Path::new("/x/libpython3.9.so.1.0");
        assert_eq!(determine(&file(9, vec![(9, 18), (2, 0)]), lib39), Ok(Version::new(3, 9, 18)));
        assert_eq!(determine(&file(9, vec![(9, 18), (9, 17)]), lib39), Ok(Version::new(3, 9, 0)));
        assert!(determine(&file(10, vec![]), lib39).is_err());
        let anonymous = Path::new("/opt/app/bin/app");
        assert_eq!(determine(&file(8, vec![(8, 18)]), anonymous), Ok(Version::new(3, 8, 18)));
        let mut f = file(11, vec![]);
        assert!(determine(&f, anonymous).is_err());
        f.py_version = Some(0x030b_07f0);
        assert_eq!(determine(&f, anonymous), Ok(Version::new(3, 11, 7)));
    }

    #[test]
    fn layouts_by_version() {
        let f = file(7, vec![]);
        assert!(layout(&f, Version::new(3, 7, 16)).expect_err("3.7").contains("older than 3.8"));
        assert!(layout(&f, Version::new(3, 13, 0)).expect_err("no DO").contains("_Py_DebugOffsets"));
        assert_eq!(layout(&f, Version::new(3, 10, 13)).map(|l| l.version), Ok(Version::new(3, 10, 13)));
    }
}
