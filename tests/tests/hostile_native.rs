//! `--native` and `--kernel` on a hostile host (issue #28, items 2 and 7; issue #31's unwind
//! tables).
//!
//! - Item 2: a Python process maps one page of a sparse ELF file whose section headers
//!   claim a 2 GiB `.symtab` (and of a second one whose 40 MiB `.symtab` is within the cap
//!   but not on disk); the files are built here, header by header. `record --native
//!   --duration 5`, run inside a memory cgroup limited to 512 MiB (the DaemonSet's limit;
//!   cgroup v2's `memory.max`, or v1's `memory.limit_in_bytes` where the memory controller
//!   is on v1), ends on time, is never OOM-killed, peaks under [`RSS_BUDGET_KIB`] resident,
//!   counts both refusals on `--stats`, and a bystander Python keeps >= 90 % of its samples.
//!   Before the fix, pyperch reached 1.59 GB resident and was OOM-killed in 3.2 s.
//! - Item 7: `record --kernel` writes no kernel address into pprof or OTLP (the KASLR base
//!   stays on the host): every varint of the decoded files is below the kernel's half of
//!   the address space, `go tool pprof -raw` shows no `[kernel]` mapping, and
//!   opentelemetry-proto's decoding shows no such location or mapping address, while the
//!   kernel frames are still there by name. With `--kernel-addresses` (the control) the
//!   same scan finds them. Whole-host outputs are mode 0600.
//! - Issue #31: the hostile-ELF cases applied to the kernel walk's unwind tables
//!   (`native_hostile_unwind_sections`): files whose `.eh_frame` or `.debug_frame` claims
//!   4 GiB, is garbage, loops its CIE pointers, runs past its end, holds more rows than a
//!   table may, or describes code above 4 GiB. On time, within the RSS budget, each refusal
//!   counted, a bystander's stacks whole.

use std::{
    fs::{self, File},
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use pyperch_tests::*;

/// pyperch's peak resident set during the recording (issue #9's budget for `record`).
const RSS_BUDGET_KIB: u64 = 256 * 1024;
/// The memory cgroup's limit: the DaemonSet's.
const CGROUP_LIMIT: u64 = 512 << 20;
/// `--duration` of the recording, and the time allowed past it (start-up excluded: from
/// sampling's start to the exit).
const DURATION_S: f64 = 5.0;
const END_SLACK_S: f64 = 3.0;
const HOST_PREFERENCE: [&str; 5] = ["3.12", "3.11", "3.13", "3.10", "3.9"];
/// Addresses at or above this are the kernel's (x86_64, 4- and 5-level paging).
const KERNEL_HALF: u64 = 0xff00_0000_0000_0000;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join("pyperch-tests").join(format!("{tag}-{}", random_hex(8)));
        fs::create_dir_all(&dir).expect("create the temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Writes a minimal x86_64 ELF shared object: one loadable R+X page holding the headers
/// and a `.text`, section headers `.text`, `.symtab` (at `symtab_offset`, claiming
/// `symtab_size` bytes of 24-byte symbols), `.strtab`, `.shstrtab`; then makes the file
/// `len` bytes long without writing them (sparse: one page on disk).
fn claiming_elf(path: &Path, symtab_offset: u64, symtab_size: u64, len: u64) {
    let mut b = vec![0u8; 0x1000];
    fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
        b[at..at + bytes.len()].copy_from_slice(bytes);
    }
    // ELF header: 64-bit, little-endian, version 1, ET_DYN, EM_X86_64.
    put(&mut b, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    put(&mut b, 16, &3u16.to_le_bytes());
    put(&mut b, 18, &62u16.to_le_bytes());
    put(&mut b, 20, &1u32.to_le_bytes());
    put(&mut b, 32, &64u64.to_le_bytes()); // e_phoff
    put(&mut b, 40, &0x200u64.to_le_bytes()); // e_shoff
    put(&mut b, 52, &64u16.to_le_bytes()); // e_ehsize
    put(&mut b, 54, &56u16.to_le_bytes()); // e_phentsize
    put(&mut b, 56, &1u16.to_le_bytes()); // e_phnum
    put(&mut b, 58, &64u16.to_le_bytes()); // e_shentsize
    put(&mut b, 60, &5u16.to_le_bytes()); // e_shnum
    put(&mut b, 62, &4u16.to_le_bytes()); // e_shstrndx
    // PT_LOAD, R+X, the first page.
    put(&mut b, 64, &1u32.to_le_bytes());
    put(&mut b, 68, &5u32.to_le_bytes());
    put(&mut b, 64 + 32, &0x1000u64.to_le_bytes()); // p_filesz
    put(&mut b, 64 + 40, &0x1000u64.to_le_bytes()); // p_memsz
    put(&mut b, 0x100, b"\0.text\0.symtab\0.strtab\0.shstrtab\0");
    put(&mut b, 0x180, b"\0f\0");
    // (name, type, address, offset, size, link, entsize) of sections 1..=4.
    let sections: [(u32, u32, u64, u64, u64, u32, u64); 4] = [
        (1, 1, 0x400, 0x400, 0x100, 0, 0),
        (7, 2, 0, symtab_offset, symtab_size, 3, 24),
        (15, 3, 0, 0x180, 3, 0, 0),
        (23, 3, 0, 0x100, 0x21, 0, 0),
    ];
    for (i, (name, kind, address, offset, size, link, entsize)) in sections.into_iter().enumerate() {
        let at = 0x200 + 64 * (i + 1);
        put(&mut b, at, &name.to_le_bytes());
        put(&mut b, at + 4, &kind.to_le_bytes());
        put(&mut b, at + 16, &address.to_le_bytes());
        put(&mut b, at + 24, &offset.to_le_bytes());
        put(&mut b, at + 32, &size.to_le_bytes());
        put(&mut b, at + 40, &link.to_le_bytes());
        put(&mut b, at + 56, &entsize.to_le_bytes());
    }
    let mut file = File::create(path).expect("create the hostile file");
    file.write_all(&b).expect("write its headers");
    file.set_len(len).expect("make it sparse");
}

/// A memory cgroup of the test's own: cgroup v2 (`memory.max`) when the memory controller
/// is there, else v1's memory hierarchy. Removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn create(limit: u64) -> Option<MemoryCgroup> {
        let name = format!("pyperch-test-{}", random_hex(8));
        if let Some(root) = cgroup2_root().filter(|r| {
            fs::read_to_string(r.join("cgroup.controllers")).is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
        }) {
            let _ = fs::write(root.join("cgroup.subtree_control"), "+memory");
            let dir = root.join(&name);
            if fs::create_dir(&dir).is_ok() {
                let cg = MemoryCgroup { dir, v2: true };
                if fs::write(cg.dir.join("memory.max"), limit.to_string()).is_ok() {
                    let _ = fs::write(cg.dir.join("memory.swap.max"), "0");
                    return Some(cg);
                }
            }
        }
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let dir = v1.join(&name);
        fs::create_dir(&dir).ok()?;
        let cg = MemoryCgroup { dir, v2: false };
        fs::write(cg.dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        let _ = fs::write(cg.dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        Some(cg)
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The cgroup's peak memory charge, bytes (v2 `memory.peak`, v1 `max_usage_in_bytes`).
    fn peak(&self) -> Option<u64> {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// OOM kills inside the cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn describe(&self) -> String {
        format!("{} (cgroup {})", self.dir.display(), if self.v2 { "v2" } else { "v1" })
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The number before `label` in `line`, if any.
fn count_before(line: &str, label: &str) -> Option<u64> {
    let at = line.find(label)?;
    line[..at].split([' ', ',', ';', ':', '(']).rfind(|w| !w.is_empty())?.parse().ok()
}

/// Issue #28 item 2: hostile ELF files under `record --native`, in a 512 MiB memory cgroup.
#[test]
fn native_sparse_symtab_in_a_512_mib_memory_cgroup() {
    if !is_root() {
        skip("pyperch needs root");
        return;
    }
    let Some(py) = first_python(&HOST_PREFERENCE).filter(|p| !p.is_chroot()) else {
        skip("no supported python outside a chroot is available");
        return;
    };
    let Some(cgroup) = MemoryCgroup::create(CGROUP_LIMIT) else {
        skip("no memory cgroup can be created (neither cgroup v2 with the memory controller nor v1's memory hierarchy)");
        return;
    };
    let dir = TempDir::new("hostile-native");
    // The reported file: a 2 GiB `.symtab` (past its cap). And one within the cap (40 MiB)
    // that the file does not have on disk.
    let huge = dir.0.join("libclaims-2gib-symtab.so");
    claiming_elf(&huge, 0x1000, 2 << 30, (2 << 30) + 0x1000);
    let sparse = dir.0.join("libclaims-40mib-symtab.so");
    claiming_elf(&sparse, 0x1000, 40 << 20, 64 << 20);
    let (huge_s, sparse_s) = (huge.to_string_lossy().into_owned(), sparse.to_string_lossy().into_owned());
    let mut hostile = Workload::spawn(&py, "map_claiming.py", &["120", &huge_s, &sparse_s]).unwrap_or_else(|e| panic!("{e:#}"));
    let mut bystander = Workload::spawn(&py, "spin.py", &["leaf_red", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    note(format!("hostile: pid {}, bystander: pid {} ({}); {}", hostile.pid, bystander.pid, py.describe(), cgroup.describe()));

    let output = dir.0.join("profile.collapsed");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("echo $$ > '{}' && exec \"$0\" \"$@\"", cgroup.procs().display()))
        .arg(pyperch_bin())
        .args(["record", "--format", "collapsed", "--output"])
        .arg(&output)
        .args(["--native", "--duration", "5", "--rate", "199", "--stats"]);
    let BesideRun { run, sampling, to_end, rss_peak, expected, share } = record_beside(cmd, bystander.pid);
    let cgroup_peak = cgroup.peak();
    let oom_kills = cgroup.oom_kills();
    hostile.terminate();
    bystander.terminate();
    let profile = Profile::parse(&fs::read_to_string(&output).unwrap_or_default());
    let d = format!("{}\n--- heaviest stacks:\n{}", run.diag(), profile.head(20));

    assert_eq!(oom_kills, 0, "pyperch was OOM-killed in the {} MiB cgroup{d}", CGROUP_LIMIT >> 20);
    assert!(!run.timed_out(), "pyperch record --duration 5 did not end within 90 s{d}");
    assert!(run.success(), "pyperch record failed{d}");
    assert!(sampling, "pyperch record did not start sampling within 60 s{d}");
    let stats = run.stderr_lines().into_iter().find(|l| l.trim_start().starts_with("native files")).unwrap_or("").to_string();
    let refused = count_before(&stats, "tables refused").unwrap_or(0);
    let mine = profile.for_pid(bystander.pid);
    // With --native the leaf is a C function of the interpreter: the last Python frame counts.
    let kept = mine.count(|s| s.frames.iter().rev().find(|f| f.contains(".py:")).is_some_and(|f| f.starts_with("leaf_red (")));
    note(format!(
        "record --native in a {} MiB cgroup: {to_end:.1} s from sampling to exit ({:.1} s in all), peak {rss_peak} KiB resident (budget {RSS_BUDGET_KIB} KiB), cgroup peak {} MiB, 0 OOM kills; bystander {kept} samples in leaf_red of ~{expected:.0} expected ({:.0} %, CPU share {share:.2}); hostile {} samples; {}",
        CGROUP_LIMIT >> 20,
        run.elapsed.as_secs_f64(),
        cgroup_peak.map_or("?".to_string(), |p| (p >> 20).to_string()),
        100.0 * kept as f64 / expected.max(1.0),
        profile.for_pid(hostile.pid).total(),
        stats.trim(),
    ));
    assert!(to_end <= DURATION_S + END_SLACK_S, "the recording ended {to_end:.1} s after sampling began (want <= {DURATION_S} + {END_SLACK_S} s){d}");
    assert!(rss_peak <= RSS_BUDGET_KIB, "pyperch peaked at {rss_peak} KiB resident (budget {RSS_BUDGET_KIB} KiB){d}");
    assert!(stats.contains("over their cap"), "--stats does not count the 2 GiB .symtab as over its cap: {stats:?}{d}");
    assert!(stats.contains("larger than the file on disk"), "--stats does not count the 40 MiB .symtab as not on disk: {stats:?}{d}");
    assert!(refused >= 2, "--stats counts {refused} refused tables: {stats:?}{d}");
    assert!(kept as f64 >= 0.9 * expected, "bystander: {kept} samples in leaf_red, want >= 90 % of ~{expected:.0}{d}");
}

/// A `record --native --duration DURATION_S --rate 199` run beside a bystander, measured.
struct BesideRun {
    run: Run,
    /// Whether pyperch began sampling within 60 s.
    sampling: bool,
    /// Seconds from sampling's start to pyperch's exit.
    to_end: f64,
    /// pyperch's peak resident set, KiB.
    rss_peak: u64,
    /// The bystander's samples expected at its CPU share, and that share.
    expected: f64,
    share: f64,
}

/// Runs `cmd` (pyperch recording for `DURATION_S` at 199 Hz) and measures it: its peak
/// resident set, the time from sampling's start to its exit, and the bystander's CPU share
/// while sampled (as hostile_hosts.rs measures it: over the sampling period but for its last
/// half second, in which the recording may be ending).
fn record_beside(cmd: Command, bystander: u32) -> BesideRun {
    let running = Running::start(cmd).expect("start pyperch");
    let pid = running.pid();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_peak_rss(pid, done.clone());
    let sampling = sampling_began(pid, Duration::from_secs(60));
    let (started, ticks_before) = (Instant::now(), cpu_ticks(bystander));
    thread::sleep(Duration::from_secs_f64(DURATION_S - 0.5));
    let (window, ticks_after) = (started.elapsed(), cpu_ticks(bystander));
    let run = running.finish(Duration::from_secs(90));
    let to_end = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let rss_peak = watcher.join().expect("watcher");
    let share = (ticks_after - ticks_before) as f64 / clock_ticks_per_second() / window.as_secs_f64();
    BesideRun { run, sampling, to_end, rss_peak, expected: 199.0 * DURATION_S * share.min(1.0), share }
}

/// Rows a file's unwind table may have (`MAX_TABLE_ROWS` in profiler-user's module_file.rs).
const MAX_TABLE_ROWS: usize = 1 << 20;

/// One call frame section (`.eh_frame` or `.debug_frame` form): a CIE (`rsp + 8`, return
/// address at `CFA - 8`, no augmentation: FDE addresses are absolute 8-byte words), then
/// `fdes` as `(address, length, instructions)`.
fn cfi(debug: bool, fdes: &[(u64, u64, Vec<u8>)]) -> Vec<u8> {
    fn pad(entry: &mut Vec<u8>) {
        while (entry.len() + 4) % 8 != 0 {
            entry.push(0); // DW_CFA_nop
        }
    }
    let mut out = Vec::new();
    let mut cie = if debug { 0xffff_ffffu32 } else { 0 }.to_le_bytes().to_vec();
    cie.extend([1, 0, 1, 0x78, 16, 0x0c, 7, 8, 0x90, 1]);
    pad(&mut cie);
    out.extend((cie.len() as u32).to_le_bytes());
    out.extend(cie);
    for (address, len, instructions) in fdes {
        // .eh_frame: the distance back to the CIE from this field; .debug_frame: its offset.
        let pointer = if debug { 0 } else { out.len() as u32 + 4 };
        let mut fde = pointer.to_le_bytes().to_vec();
        fde.extend(address.to_le_bytes());
        fde.extend(len.to_le_bytes());
        fde.extend(instructions);
        pad(&mut fde);
        out.extend((fde.len() as u32).to_le_bytes());
        out.extend(fde);
    }
    out
}

/// An FDE's instructions for `rows` rows: advance 1, CFA `rsp + 16`, advance 1, `rsp + 8`...
fn many_rows(rows: usize) -> Vec<u8> {
    (0..rows).flat_map(|i| [0x41, 0x0e, if i % 2 == 0 { 16 } else { 8 }]).collect()
}

/// Hostile contents of one call frame section, by name; `(bytes, claimed size)`.
fn hostile_cfi(debug: bool, case: &str) -> (Vec<u8>, Option<u64>) {
    let section = match case {
        // The section header claims 4 GiB; the file has none of it on disk.
        "claims-4gib" => return (Vec::new(), Some(4 << 30)),
        "garbage" => {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            (0..64 << 10)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        }
        // FDEs whose CIE pointers lead to themselves and to each other, never to a CIE
        // (`.eh_frame`'s pointers only lead backwards: there the second leads to the first).
        "cie-loop" => {
            let mut b = cfi(debug, &[]);
            let first = b.len() as u32;
            let (second, third) = (first + 28, first + 56);
            for (at, target) in [(first, first), (second, if debug { third } else { first }), (third, second)] {
                let pointer = if debug { target } else { at + 4 - target };
                b.extend(24u32.to_le_bytes());
                b.extend(pointer.to_le_bytes());
                b.extend(0x410u64.to_le_bytes());
                b.extend(0x10u64.to_le_bytes());
                b.extend([0u8; 4]);
            }
            b
        }
        // An FDE whose length runs 2 GiB past the section's end.
        "past-end" => {
            let mut b = cfi(debug, &[(0x400, 0x10, vec![])]);
            b.extend(0x7fff_fff0u32.to_le_bytes());
            b.extend([0u8; 60]);
            b
        }
        // One FDE describing more address ranges than a table may have.
        "too-many-rows" => cfi(debug, &[(0x1000, 4 << 20, many_rows(MAX_TABLE_ROWS + 64))]),
        // Code above 4 GiB (the kernel's rows hold 32-bit addresses).
        "above-4gib" => cfi(debug, &[(0x400, 0x10, vec![]), (0x1_0000_0400, 0x40, vec![0x44, 0x0e, 16])]),
        other => panic!("no hostile case {other}"),
    };
    (section, None)
}

/// Writes an x86_64 ELF shared object: one loadable R+X page of headers and `.text`, then
/// each of `sections` (`(name, SHF_ALLOC?, bytes, claimed size)`) at the next page boundary,
/// its header claiming `claimed` bytes where given; the file is then `len` bytes long
/// (sparse past what was written) when that is longer.
fn unwind_elf(path: &Path, sections: &[(&str, bool, Vec<u8>, Option<u64>)], len: u64) {
    fn put(b: &mut Vec<u8>, at: usize, bytes: &[u8]) {
        if b.len() < at + bytes.len() {
            b.resize(at + bytes.len(), 0);
        }
        b[at..at + bytes.len()].copy_from_slice(bytes);
    }
    let mut b = vec![0u8; 0x1000];
    let count = sections.len() + 3; // null, .text, ..., .shstrtab
    put(&mut b, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    put(&mut b, 16, &3u16.to_le_bytes());
    put(&mut b, 18, &62u16.to_le_bytes());
    put(&mut b, 20, &1u32.to_le_bytes());
    put(&mut b, 32, &64u64.to_le_bytes()); // e_phoff
    put(&mut b, 40, &0x200u64.to_le_bytes()); // e_shoff
    put(&mut b, 52, &64u16.to_le_bytes());
    put(&mut b, 54, &56u16.to_le_bytes());
    put(&mut b, 56, &1u16.to_le_bytes()); // e_phnum
    put(&mut b, 58, &64u16.to_le_bytes());
    put(&mut b, 60, &(count as u16).to_le_bytes()); // e_shnum
    put(&mut b, 62, &((count - 1) as u16).to_le_bytes()); // e_shstrndx
    put(&mut b, 64, &1u32.to_le_bytes()); // PT_LOAD
    put(&mut b, 68, &5u32.to_le_bytes()); // R+X
    put(&mut b, 64 + 32, &0x1000u64.to_le_bytes());
    put(&mut b, 64 + 40, &0x1000u64.to_le_bytes());
    let mut names = b"\0.text\0.shstrtab\0".to_vec();
    let header = |b: &mut Vec<u8>, i: usize, name: usize, kind: u32, flags: u64, address: u64, offset: u64, size: u64| {
        let at = 0x200 + 64 * i;
        put(b, at, &(name as u32).to_le_bytes());
        put(b, at + 4, &kind.to_le_bytes());
        put(b, at + 8, &flags.to_le_bytes());
        put(b, at + 16, &address.to_le_bytes());
        put(b, at + 24, &offset.to_le_bytes());
        put(b, at + 32, &size.to_le_bytes());
        put(b, at + 48, &8u64.to_le_bytes());
    };
    header(&mut b, 1, 1, 1, 6, 0x400, 0x400, 0x100); // .text: PROGBITS, ALLOC|EXECINSTR
    let mut offset = 0x1000u64;
    for (i, (name, alloc, data, claimed)) in sections.iter().enumerate() {
        let name_at = names.len();
        names.extend(name.as_bytes());
        names.push(0);
        // An allocated section sits at the address of its file offset.
        header(&mut b, i + 2, name_at, 1, if *alloc { 2 } else { 0 }, if *alloc { offset } else { 0 }, offset, claimed.unwrap_or(data.len() as u64));
        put(&mut b, offset as usize, data);
        offset = (offset + data.len() as u64).next_multiple_of(0x1000).max(offset + 0x1000);
    }
    header(&mut b, count - 1, 7, 3, 0, 0, 0x100, names.len() as u64);
    assert!(names.len() <= 0x100, "section names overflow their slot");
    put(&mut b, 0x100, &names);
    let mut file = File::create(path).expect("create the hostile file");
    file.write_all(&b).expect("write it");
    if len > b.len() as u64 {
        file.set_len(len).expect("make it sparse");
    }
}

/// Hostile unwind sections (issue #31, the cases of issue #28 item 2 applied to the kernel
/// walk's tables): a Python process maps one page each of ELF files whose `.eh_frame` or
/// `.debug_frame` is hostile: a header claiming 4 GiB of a sparse file, 64 KiB of garbage,
/// FDEs whose CIE pointers loop, an FDE running 2 GiB past the section's end, one FDE of
/// more rows than a table may have (1,048,576), code above 4 GiB; and a file with a good
/// `.eh_frame` whose `.debug_frame` has too many rows. `record --native --duration 5
/// --stats` of the whole host ends on time, peaks under [`RSS_BUDGET_KIB`], counts the
/// refusals (the sections over their cap; the tables the kernel walk cannot use; the
/// `.debug_frame` left out beside a good `.eh_frame`), and a bystander spin.py keeps >= 90 %
/// of its expected samples, each whole from `_start` to its Python leaf.
#[test]
fn native_hostile_unwind_sections() {
    if !is_root() {
        skip("pyperch needs root");
        return;
    }
    let Some(py) = first_python(&HOST_PREFERENCE).filter(|p| !p.is_chroot()) else {
        skip("no supported python outside a chroot is available");
        return;
    };
    let dir = TempDir::new("hostile-unwind");
    let mut paths = Vec::new();
    for (debug, section) in [(false, ".eh_frame"), (true, ".debug_frame")] {
        for case in ["claims-4gib", "garbage", "cie-loop", "past-end", "too-many-rows", "above-4gib"] {
            let (bytes, claimed) = hostile_cfi(debug, case);
            let path = dir.0.join(format!("lib{}-{case}.so", section.trim_start_matches('.')));
            let len = if claimed.is_some() { (4 << 30) + (64 << 10) } else { 0 };
            unwind_elf(&path, &[(section, !debug, bytes, claimed)], len);
            paths.push(path);
        }
    }
    // A good .eh_frame (the .text's one FDE) beside a .debug_frame of too many rows.
    let both = dir.0.join("libgood-eh-frame-hostile-debug-frame.so");
    let good = cfi(false, &[(0x400, 0x100, vec![0x44, 0x0e, 16])]);
    unwind_elf(&both, &[(".eh_frame", true, good, None), (".debug_frame", false, hostile_cfi(true, "too-many-rows").0, None)], 0);
    paths.push(both);
    let mut args = vec!["120".to_string()];
    args.extend(paths.iter().map(|p| p.to_string_lossy().into_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut hostile = Workload::spawn(&py, "map_claiming.py", &args).unwrap_or_else(|e| panic!("{e:#}"));
    let mut bystander = Workload::spawn(&py, "spin.py", &["leaf_red", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    note(format!("hostile: pid {} mapping {} files, bystander: pid {} ({})", hostile.pid, paths.len(), bystander.pid, py.describe()));

    let output = dir.0.join("profile.collapsed");
    let mut cmd = Command::new(pyperch_bin());
    cmd.args(["record", "--format", "collapsed", "--output"]).arg(&output).args(["--native", "--duration", "5", "--rate", "199", "--stats"]);
    let BesideRun { run, sampling, to_end, rss_peak, expected, share } = record_beside(cmd, bystander.pid);
    hostile.terminate();
    bystander.terminate();
    let profile = Profile::parse(&fs::read_to_string(&output).unwrap_or_default());
    let d = format!("{}\n--- heaviest stacks:\n{}", run.diag(), profile.head(20));

    assert!(!run.timed_out(), "pyperch record --duration 5 did not end within 90 s{d}");
    assert!(run.success(), "pyperch record failed{d}");
    assert!(sampling, "pyperch record did not start sampling within 60 s{d}");
    let stats = run.stderr_lines().into_iter().find(|l| l.trim_start().starts_with("native files")).unwrap_or("").to_string();
    let over_cap = count_before(&stats, "over their cap").unwrap_or(0);
    let unusable = count_before(&stats, "unwind rows the kernel walk cannot use").unwrap_or(0);
    let debug_left_out = count_before(&stats, ".debug_frame rows the kernel walk cannot use").unwrap_or(0);
    let mine = profile.for_pid(bystander.pid);
    // Its native stack whole: the process frame, then `_start`, and no marker of a stop.
    const STOPPED: [&str; 5] = ["<native unwind stopped", "<truncated native", "<unmerged native>", "<no native stack>", "<loading native>"];
    let whole = |s: &Stack| {
        s.frames.get(1).is_some_and(|f| f.starts_with("_start (")) && !s.frames.iter().any(|f| STOPPED.iter().any(|m| f.starts_with(m)))
    };
    let in_leaf = |s: &Stack| s.frames.iter().rev().find(|f| f.contains(".py:")).is_some_and(|f| f.starts_with("leaf_red ("));
    let kept = mine.count(in_leaf);
    let exact = mine.count(|s| in_leaf(s) && whole(s));
    let loading = mine.count(|s| s.frames.iter().any(|f| f == "<loading native>" || f == "<truncated native (tables loading)>"));
    note(format!(
        "record --native: {to_end:.1} s from sampling to exit ({:.1} s in all), peak {rss_peak} KiB resident (budget {RSS_BUDGET_KIB} KiB); bystander {kept} samples in leaf_red of ~{expected:.0} expected ({:.0} %, CPU share {share:.2}), {exact} of them whole from _start, {loading} taken while its tables loaded; hostile {} samples; {}",
        run.elapsed.as_secs_f64(),
        100.0 * kept as f64 / expected.max(1.0),
        profile.for_pid(hostile.pid).total(),
        stats.trim(),
    ));
    assert!(to_end <= DURATION_S + END_SLACK_S, "the recording ended {to_end:.1} s after sampling began (want <= {DURATION_S} + {END_SLACK_S} s){d}");
    assert!(rss_peak <= RSS_BUDGET_KIB, "pyperch peaked at {rss_peak} KiB resident (budget {RSS_BUDGET_KIB} KiB){d}");
    // Both 4 GiB claims; past-end, too-many-rows and above-4gib of either section.
    assert!(over_cap >= 2, "--stats counts {over_cap} sections over their cap (want both 4 GiB claims): {stats:?}{d}");
    assert!(unusable >= 6, "--stats counts {unusable} unusable unwind tables (want >= 6): {stats:?}{d}");
    assert!(debug_left_out >= 1, "--stats does not count the .debug_frame left out beside a good .eh_frame: {stats:?}{d}");
    assert!(kept as f64 >= 0.9 * expected, "bystander: {kept} samples in leaf_red, want >= 90 % of ~{expected:.0}{d}");
    assert!(exact + loading >= kept, "bystander: {exact} of {kept} samples whole ({loading} while loading){d}");
}

/// Every 10-byte varint (the protobuf encoding of a value >= 2^63) in `bytes` that decodes to
/// an address in the kernel's half: kernel addresses written as protobuf integers.
fn kernel_varints(bytes: &[u8]) -> Vec<u64> {
    let mut found = Vec::new();
    for start in 0..bytes.len().saturating_sub(9) {
        let v = &bytes[start..start + 10];
        if v[..9].iter().all(|b| b & 0x80 != 0) && v[9] == 0x01 && (start == 0 || bytes[start - 1] & 0x80 == 0) {
            let value = v.iter().enumerate().fold(0u64, |acc, (i, b)| acc | (u64::from(b & 0x7f) << (7 * i)));
            if value >= KERNEL_HALF {
                found.push(value);
            }
        }
    }
    found
}

/// The file's bytes, gunzipped when it is gzip (pprof).
fn decoded(path: &Path) -> Vec<u8> {
    let raw = fs::read(path).expect("read the output");
    if raw.starts_with(&[0x1f, 0x8b]) {
        let out = Command::new("gzip").arg("-dc").arg(path).output().expect("run gzip -dc");
        assert!(out.status.success(), "gzip -dc {} failed", path.display());
        out.stdout
    } else {
        raw
    }
}

/// `go tool pprof -raw`'s location addresses and mapping files, when Go is installed.
fn go_pprof_addresses(path: &Path, scratch: &Path) -> Option<(Vec<u64>, Vec<String>, String)> {
    let go = find_program("go")?;
    let printed = Command::new(go)
        .args(["tool", "pprof", "-raw"])
        .arg(path)
        .env("HOME", scratch)
        .env("GOCACHE", scratch.join("gocache"))
        .env("PPROF_TMPDIR", scratch)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&printed.stdout).into_owned();
    assert!(printed.status.success(), "go tool pprof cannot read {}:\n{text}", path.display());
    let (mut section, mut addresses, mut mappings) = ("", Vec::new(), Vec::new());
    for line in text.lines().map(str::trim) {
        if line == "Locations" || line == "Mappings" {
            section = line;
            continue;
        }
        let Some((_, rest)) = line.split_once(": ") else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        match section {
            "Locations" if words.len() >= 2 && words[1].starts_with("M=") => {
                addresses.push(u64::from_str_radix(words[0].trim_start_matches("0x"), 16).unwrap_or(0));
            }
            "Mappings" if words.len() >= 2 => {
                for part in words[0].split('/') {
                    addresses.push(u64::from_str_radix(part.trim_start_matches("0x"), 16).unwrap_or(0));
                }
                mappings.push(words[1].to_string());
            }
            _ => {}
        }
    }
    Some((addresses, mappings, text))
}

/// opentelemetry-proto's decoding of an OTLP file: every location address and mapping
/// bound, when the test venv has the classes.
fn otlp_addresses(path: &Path) -> Option<Vec<u64>> {
    let python = test_venv().join("bin/python");
    let script = "import sys\n\
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest as R\n\
r = R(); r.ParseFromString(open(sys.argv[1], 'rb').read()); d = r.dictionary\n\
for l in d.location_table: print(l.address)\n\
for m in d.mapping_table: print(m.memory_start); print(m.memory_limit)\n";
    let out = Command::new(python).arg("-c").arg(script).arg(path).stdin(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect())
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("the output exists").permissions().mode() & 0o777
}

/// Issue #28 item 7: `record --kernel` writes no kernel address into pprof or OTLP unless
/// `--kernel-addresses` asks for them; whole-host outputs are mode 0600.
#[test]
fn kernel_frames_leave_no_kernel_address_in_pprof_or_otlp() {
    if !is_root() {
        skip("pyperch needs root");
        return;
    }
    let Some(py) = python("3.12") else { return };
    let dir = TempDir::new("kernel-addresses");
    let mut w = Workload::spawn(&py, "native.py", &["zero", "{dir}/zero.json", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    let pid = w.pid.to_string();
    // Whole host (no --pid): pprof and OTLP; then the control, with --kernel-addresses.
    let outputs = [
        ("host.pb.gz", vec!["--format", "pprof"], true),
        ("host.otlp.pb", vec!["--format", "otlp"], true),
        ("control.pb.gz", vec!["--format", "pprof", "--pid", &pid, "--kernel-addresses"], false),
    ];
    let mut results = Vec::new();
    for (name, flags, host_wide) in &outputs {
        let path = dir.0.join(name);
        let mut args = vec!["record", "--kernel", "--duration", "2", "--rate", "199", "--output", path.to_str().expect("path")];
        args.extend(flags.iter().copied());
        let run = pyperch(&args, Duration::from_secs(90));
        assert!(run.success(), "pyperch {} failed{}", args.join(" "), run.diag());
        let bytes = decoded(&path);
        let kernel = kernel_varints(&bytes);
        let named = bytes.windows(4).filter(|w| w == b"_[k]").count();
        note(format!(
            "{name}: mode {:o}, {} kernel addresses, {named} kernel frame names",
            mode(&path),
            kernel.len()
        ));
        assert!(named > 0, "{name}: no kernel frame (`_[k]`) at all{}", run.diag());
        if *host_wide {
            assert_eq!(mode(&path), 0o600, "{name}: a whole-host output must be readable by its owner only");
        }
        results.push((path, kernel, run));
    }
    w.terminate();
    let [(host_pprof, pprof_kernel, _), (host_otlp, otlp_kernel, _), (control, control_kernel, _)] = &results[..] else {
        unreachable!()
    };
    // The scan finds kernel addresses where they are asked for: it can see them.
    assert!(!control_kernel.is_empty(), "the control (--kernel-addresses) shows no kernel address: the scan would miss them");
    assert!(pprof_kernel.is_empty(), "pprof holds kernel addresses: {:x?}", &pprof_kernel[..pprof_kernel.len().min(5)]);
    assert!(otlp_kernel.is_empty(), "OTLP holds kernel addresses: {:x?}", &otlp_kernel[..otlp_kernel.len().min(5)]);
    // Third-party readers agree.
    match go_pprof_addresses(host_pprof, &dir.0) {
        Some((addresses, mappings, text)) => {
            let high: Vec<&u64> = addresses.iter().filter(|a| **a >= KERNEL_HALF).collect();
            assert!(high.is_empty() && !mappings.iter().any(|m| m == "[kernel]"), "go tool pprof shows kernel addresses:\n{text}");
            let (control_addresses, control_mappings, _) = go_pprof_addresses(control, &dir.0).expect("go ran once");
            assert!(
                control_mappings.iter().any(|m| m == "[kernel]") && control_addresses.iter().any(|a| *a >= KERNEL_HALF),
                "the control has no [kernel] mapping with kernel addresses"
            );
            note(format!("go tool pprof -raw: {} addresses, none in the kernel's half; mappings {mappings:?}", addresses.len()));
        }
        None => skip("go is not installed: go tool pprof's reading skipped (`cargo xtask test` installs golang-go)"),
    }
    match otlp_addresses(host_otlp) {
        Some(addresses) => {
            assert!(addresses.iter().all(|a| *a < KERNEL_HALF), "opentelemetry-proto decodes kernel addresses: {addresses:x?}");
            note(format!("opentelemetry-proto: {} location and mapping addresses, none in the kernel's half", addresses.len()));
        }
        None => skip("the test venv cannot decode OTLP profiles: opentelemetry-proto's reading skipped"),
    }
}

/// The unit of the scan: a 10-byte varint of a kernel address is found, smaller ones not.
#[test]
fn kernel_varint_scan_finds_encoded_kernel_addresses() {
    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }
    let mut bytes = vec![0x08];
    bytes.extend(varint(0x7fff_1234_5678));
    bytes.push(0x10);
    bytes.extend(varint(0xffff_ffff_8100_1234));
    assert_eq!(kernel_varints(&bytes), vec![0xffff_ffff_8100_1234]);
    assert!(kernel_varints(&varint(u64::MAX >> 1)).is_empty());
}
