//! Reads code objects, `str` and `bytes` out of real interpreters (pyenv 3.8-3.13 and, when
//! the Debian sid rootfs exists, its static 3.13/3.14/3.15) and compares with what the
//! interpreter itself says. Missing interpreters are skipped with a message.
//!
//! The layouts are the project's own: `layout::tables` up to 3.12, and for 3.13+ the
//! target's `_Py_DebugOffsets` (found through the exported `_PyRuntime`) decoded by
//! `layout::debug_offsets`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use super::*;
use crate::target::layout::{LineTableFormat, PythonLayout, Version, debug_offsets, tables};
use crate::target::memory::ProcessMemory;

const PYENV: &str = "/root/.pyenv/versions";
const SID: &str = "/root/.cache/pyperch/sid-rootfs";

fn format_for(minor: u8) -> LineTableFormat {
    match minor {
        ..=9 => LineTableFormat::Lnotab,
        10 => LineTableFormat::PairTable,
        _ => LineTableFormat::LocationTable,
    }
}

/// The project's layout of the target: `tables::layout_for` up to 3.12, else decoded from
/// the `_Py_DebugOffsets` at the start of the target's `_PyRuntime`.
fn target_layout(mem: &ProcessMemory, report: &LiveReport) -> PythonLayout {
    let (major, minor, micro) = report.version;
    let version = Version::new(major, minor, micro);
    if minor <= 12 {
        return tables::layout_for(version).unwrap_or_else(|| panic!("no table layout for {version}"));
    }
    let runtime = report.runtime.unwrap_or_else(|| panic!("{version}: _PyRuntime not found by ctypes"));
    let bytes = mem.read_vec(runtime, debug_offsets::MAX_ENCODED_SIZE).expect("reading _Py_DebugOffsets");
    debug_offsets::layout_from_bytes(&bytes).unwrap_or_else(|e| panic!("{version}: {e}"))
}

/// Run with `-c`: compiles varied code under a non-ASCII (UCS-4) file name, prints one JSON
/// document describing it as the interpreter sees it, then `READY`, then blocks on stdin.
const DRIVER: &str = r#"
import ctypes, dis, json, sys
SRC = '''
def f\u00fcnf():
    pass
def \U0001d523():
    pass
def \U00020000\U00020001():
    pass
def \u540d\u524d():
    pass
class Klass:
    def method(self):
        def inner():
            pass
        return inner
def gen():
    yield 1
''' + "\n" * 300 + '''
def late(x):
    return [y for y in x]
'''
FILENAME = "/tmp/pyperch-\u00e9t\u00e9/\U0001d523\u540d.py"
def walk(code):
    out = [code]
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            out.extend(walk(c))
    return out
def firsttraceable(code):
    if sys.version_info < (3, 11):
        return 0
    return next((i.offset // 2 for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
keep = walk(compile(SRC, FILENAME, "exec"))
keep += walk(compile("def " + "a" * 300 + "(): pass", "plain.py", "exec"))
class S(str):
    pass
strs = ["", "ascii", "h\u00e9llo", "\u540d\u524d", "\U0001d523x", "y" * 5000, S("plain"), S("h\u00e9llo \U0001d523")]
blobs = [b"", bytes(range(256)) * 3]
fake = b"\xff" * 16
try:
    runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
except ValueError:
    runtime = None
codes = [{
    "address": id(c),
    "qualname": getattr(c, "co_qualname", c.co_name),
    "filename": c.co_filename,
    "firstlineno": c.co_firstlineno,
    "firsttraceable": firsttraceable(c),
    "table": (c.co_lnotab if sys.version_info < (3, 10) else c.co_linetable).hex(),
} for c in keep]
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "code_type": id(type(keep[0])),
    "str_type": id(str),
    "bytes_type": id(bytes),
    "non_code": id(keep),
    "codes": codes,
    "strs": [[id(s), str(s)] for s in strs],
    "blobs": [[id(b), b.hex()] for b in blobs],
    "fake_str": id(fake),
    "runtime": runtime,
}))
print("READY", flush=True)
sys.stdin.read()
"#;

#[derive(serde::Deserialize)]
struct LiveCode {
    address: u64,
    qualname: String,
    filename: String,
    firstlineno: u32,
    firsttraceable: u32,
    table: String,
}

#[derive(serde::Deserialize)]
struct LiveReport {
    version: (u8, u8, u8),
    code_type: u64,
    str_type: u64,
    bytes_type: u64,
    non_code: u64,
    codes: Vec<LiveCode>,
    strs: Vec<(u64, String)>,
    blobs: Vec<(u64, String)>,
    fake_str: u64,
    /// `&_PyRuntime`, from the exported symbol.
    runtime: Option<u64>,
}

/// Kills and reaps the interpreter however the test ends.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// Spawns `argv` with the driver; `None` (with a message) when the interpreter is absent.
fn spawn(argv: &[&str], exe: &str) -> Option<(Target, LiveReport)> {
    if !std::path::Path::new(exe).exists() {
        eprintln!("skipping: {exe} is not installed");
        return None;
    }
    let child = Command::new(argv[0])
        .args(&argv[1..])
        .arg("-c")
        .arg(DRIVER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {argv:?}: {e}"));
    let mut target = Target(child);
    let stdout = target.0.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let report = lines.next().expect("a report line").expect("utf-8 report");
    assert_eq!(lines.next().expect("READY").expect("READY"), "READY");
    let report: LiveReport = serde_json::from_str(&report).expect("report json");
    Some((target, report))
}

fn check(argv: &[&str], exe: &str, minor: u8) {
    let Some((target, report)) = spawn(argv, exe) else { return };
    assert_eq!((report.version.0, report.version.1), (3, minor), "{argv:?}");
    let mem = ProcessMemory::new(target.0.id());
    let layout = target_layout(&mem, &report);
    let types = TypeAddresses { code: report.code_type, str: Some(report.str_type), bytes: Some(report.bytes_type) };
    assert_eq!(layout.code.line_format, format_for(minor));

    // Every code object, names and tables as the interpreter reports them.
    let mut non_bmp_names = 0;
    for expected in &report.codes {
        let info = read_code(&mem, &layout, &types, expected.address)
            .unwrap_or_else(|e| panic!("3.{minor} {}: {e}", expected.qualname));
        assert_eq!(&*info.qualname, expected.qualname, "3.{minor}");
        assert_eq!(&*info.filename, expected.filename, "3.{minor}");
        assert_eq!(info.firstlineno, expected.firstlineno, "3.{minor} {}", expected.qualname);
        assert_eq!(info.firsttraceable, expected.firsttraceable, "3.{minor} {}", expected.qualname);
        assert_eq!(info.line_format, format_for(minor));
        assert_eq!(&*info.linetable, unhex(&expected.table).as_slice(), "3.{minor} {}", expected.qualname);
        assert_eq!(info.line(-2), Some(expected.firstlineno));
        non_bmp_names += usize::from(expected.qualname.chars().any(|c| c > '\u{ffff}'));
    }
    assert!(non_bmp_names > 0, "3.{minor}: no UCS-4 name was exercised");
    // The kernel's copies of the same code objects decode to what a live read gives; a copy
    // missing a part fails rather than reading live memory.
    let frame_layout = layout.kernel_frame_layout();
    assert_ne!(frame_layout.snap_code_size, 0, "3.{minor}: no snapshots for this layout");
    for expected in &report.codes {
        let live = read_code(&mem, &layout, &types, expected.address).expect("read above");
        let record = kernel_copy(&mem, &frame_layout, expected.address)
            .unwrap_or_else(|| panic!("3.{minor} {}: the kernel's copy failed", expected.qualname));
        let snap = decode_snapshot(&record, &layout, &types, &mem).unwrap_or_else(|e| panic!("3.{minor} {}: {e}", expected.qualname));
        assert_eq!(snap.info, live, "3.{minor}");
        assert_eq!((snap.code, snap.check), (expected.address, 7));
        let mut cut = record.clone();
        let at = std::mem::offset_of!(profiler_common::CodeSnapshotHead, filename_len);
        cut[at..at + 4].copy_from_slice(&8u32.to_le_bytes());
        assert!(decode_snapshot(&cut, &layout, &types, &mem).is_err(), "3.{minor}: a cut copy decoded");
    }
    assert!(report.codes.iter().any(|c| c.qualname.contains("<locals>") || minor < 11));
    assert!(report.codes.iter().any(|c| c.firsttraceable > 0) || minor < 11, "3.{minor}: firsttraceable");

    // Not code objects: a list, a str, a garbage and a null address.
    let not_code = |address| read_code(&mem, &layout, &types, address);
    assert!(matches!(not_code(report.non_code), Err(SymbolError::NotCode { .. })), "3.{minor} list");
    assert!(matches!(not_code(report.strs[1].0), Err(SymbolError::NotCode { .. })), "3.{minor} str");
    assert!(matches!(not_code(0x10), Err(SymbolError::Memory(_))), "3.{minor} garbage address");
    assert!(matches!(not_code(0), Err(SymbolError::Memory(_))), "3.{minor} null");

    // Strings of every kind, compact and not (str subclass instances are legacy strings,
    // accepted through their type's subclass flag).
    for (address, expected) in &report.strs {
        let got = read_str(&mem, &layout.objects, *address, 10_000, Some(report.str_type)).unwrap_or_else(|e| panic!("3.{minor}: {e}"));
        assert_eq!(&got, expected, "3.{minor}");
    }
    let (long, _) = report.strs[5];
    assert!(matches!(
        read_str(&mem, &layout.objects, long, MAX_NAME_CHARS, Some(report.str_type)),
        Err(SymbolError::TooLong { len: 5000, .. })
    ));
    assert!(matches!(
        read_str(&mem, &layout.objects, report.fake_str, MAX_NAME_CHARS, None),
        Err(SymbolError::BadString { .. })
    ));
    // A bytes object is not a str (and a str is not bytes), whatever its header says.
    assert!(matches!(
        read_str(&mem, &layout.objects, report.fake_str, MAX_NAME_CHARS, Some(report.str_type)),
        Err(SymbolError::WrongType { expected: "str", .. })
    ));
    assert!(matches!(
        read_bytes(&mem, &layout.objects, report.strs[1].0, 4096, Some(report.bytes_type)),
        Err(SymbolError::WrongType { expected: "bytes", .. })
    ));

    for (address, expected) in &report.blobs {
        let got = read_bytes(&mem, &layout.objects, *address, 4096, Some(report.bytes_type)).unwrap_or_else(|e| panic!("3.{minor}: {e}"));
        assert_eq!(got, unhex(expected), "3.{minor}");
    }
    let (big, _) = report.blobs[1];
    assert!(matches!(read_bytes(&mem, &layout.objects, big, 100, Some(report.bytes_type)), Err(SymbolError::TooLong { len: 768, .. })));

    drop(target); // Kills and reaps the interpreter.
}

fn pyenv(version: &str, minor: u8) {
    let exe = format!("{PYENV}/{version}/bin/python");
    check(&[exe.as_str()], &exe, minor);
}

fn sid(minor: u8) {
    let inner = format!("/usr/bin/python3.{minor}");
    let exe = format!("{SID}{inner}");
    check(&["chroot", SID, inner.as_str()], &exe, minor);
}

#[test]
fn live_3_8() {
    pyenv("3.8.18", 8);
}

#[test]
fn live_3_9() {
    pyenv("3.9.18", 9);
}

#[test]
fn live_3_10() {
    pyenv("3.10.13", 10);
}

#[test]
fn live_3_11() {
    pyenv("3.11.7", 11);
}

#[test]
fn live_3_12() {
    pyenv("3.12.1", 12);
}

#[test]
fn live_3_13() {
    pyenv("3.13.0", 13);
}

#[test]
fn live_sid_3_13() {
    sid(13);
}

#[test]
fn live_sid_3_14() {
    sid(14);
}

#[test]
fn live_sid_3_15() {
    sid(15);
}

/// A `CodeSnapshot` record of the code object at `code`, made by the rules of the kernel's
/// `code_snapshot::fill` (same sizes, same fallbacks) from live memory; check word 7.
fn kernel_copy(mem: &ProcessMemory, layout: &profiler_common::FrameLayout, code: u64) -> Option<Vec<u8>> {
    use profiler_common::*;
    let mut snap = CodeSnapshotHead::default();
    let mut bytes = vec![0u8; SNAP_BYTES];
    let size = (layout.snap_code_size as usize).min(SNAP_CODE_MAX - 8);
    mem.read(code, &mut bytes[..size]).ok()?;
    snap.code_len = size as u32;
    let word = |at: u32| u64::from_le_bytes(bytes[at as usize..at as usize + 8].try_into().unwrap());
    let (name, filename, table) = (word(layout.snap_name), word(layout.snap_filename), word(layout.snap_linetable));
    let copy_str = |to: &mut [u8], cap: usize, address: u64| -> Option<u32> {
        let length = mem.read_u64(address + layout.check_str as u64).ok()?;
        if length >= cap as u64 {
            return None;
        }
        let widest = ((layout.snap_str_compact as u64 + length * 4) as usize).min(cap - 8);
        if mem.read(address, &mut to[..widest]).is_ok() {
            return Some(widest as u32);
        }
        let ascii = layout.snap_str_ascii as usize + length as usize + 1;
        (ascii <= cap - 8).then_some(())?;
        mem.read(address, &mut to[..ascii]).ok()?;
        Some(ascii as u32)
    };
    snap.name_at = name;
    snap.filename_at = filename;
    snap.table_at = table;
    snap.name_len = copy_str(&mut bytes[SNAP_NAME_AT..], SNAP_NAME_MAX, name)?;
    snap.filename_len = copy_str(&mut bytes[SNAP_FILENAME_AT..], SNAP_FILENAME_MAX, filename)?;
    let table_len = layout.snap_bytes_data as usize + mem.read_u64(table + layout.snap_bytes_size as u64).ok()? as usize;
    (table_len < SNAP_TABLE_MAX).then_some(())?;
    mem.read(table, &mut bytes[SNAP_TABLE_AT..SNAP_TABLE_AT + table_len]).ok()?;
    snap.table_len = table_len as u32;
    snap.code = code;
    snap.check = 7;
    snap.header.kind = record_kind::CODE_SNAPSHOT;
    let len = CODE_SNAPSHOT_HEADER + SNAP_TABLE_AT + table_len;
    let mut record = Vec::with_capacity(len);
    record.extend_from_slice(snap.as_bytes());
    record.extend_from_slice(bytes.get(..SNAP_TABLE_AT + table_len)?);
    Some(record)
}
