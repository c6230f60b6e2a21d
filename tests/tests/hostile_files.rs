//! Hostile ELF files mapped by some process: sizes in a file are the file's word, so an
//! 8 GiB sparse file whose tables claim gigabytes must cost pyperch neither memory nor time
//! (the reported bug: `pyperch list` reached 8.2 GB resident). pyperch's peak resident set
//! (`VmHWM`) stays within [`RSS_BUDGET_KIB`], it finishes in time, and a benign Python beside
//! the hostile processes is profiled as usual.

use std::fs::{self, File};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyperch_tests::*;

/// pyperch's peak resident set, `list` and `record` alike (issue #9: 256 MiB for record).
const RSS_BUDGET_KIB: u64 = 256 * 1024;
const SPARSE_SIZE: u64 = 8 << 30;
const HOST_PREFERENCE: [&str; 5] = ["3.12", "3.11", "3.13", "3.10", "3.9"];

/// A temporary directory removed on drop (sparse files included).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The file offset of the header of the first section of type `kind`.
fn section_header(bytes: &[u8], kind: u32) -> Option<usize> {
    let shoff = u64_at(bytes, 40) as usize;
    let shnum = u16::from_le_bytes([bytes[60], bytes[61]]) as usize;
    (0..shnum)
        .map(|i| shoff + 64 * i)
        .find(|at| u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes")) == kind)
}

/// An 8 GiB sparse copy of `/bin/true` with `patches` (`(offset, bytes)`) applied.
fn sparse_copy(original: &[u8], path: &Path, patches: &[(usize, Vec<u8>)]) {
    let mut file = File::create(path).expect("create the sparse file");
    file.write_all(original).expect("write");
    for (at, bytes) in patches {
        file.seek(SeekFrom::Start(*at as u64)).expect("seek");
        file.write_all(bytes).expect("patch");
    }
    file.set_len(SPARSE_SIZE).expect("truncate to 8 GiB");
}

/// The hostile variants: `.dynsym` claiming 6 GiB, `.dynstr` claiming 6 GiB, and 2^40
/// section headers (extended numbering: `e_shnum` 0, section 0's `sh_size`).
fn hostile_files(dir: &Path) -> Vec<PathBuf> {
    let original = fs::read("/bin/true").expect("read /bin/true");
    let dynsym = section_header(&original, 11).expect("/bin/true has .dynsym");
    let link = u32::from_le_bytes(original[dynsym + 40..dynsym + 44].try_into().expect("4 bytes")) as usize;
    let dynstr = u64_at(&original, 40) as usize + 64 * link;
    let shoff = u64_at(&original, 40) as usize;
    let huge = (6u64 << 30).to_le_bytes().to_vec();
    let variants: [(&str, Vec<(usize, Vec<u8>)>); 3] = [
        ("dynsym", vec![(dynsym + 32, huge.clone())]),
        ("dynstr", vec![(dynstr + 32, huge.clone()), (dynsym + 32, huge)]),
        ("sections", vec![(60, vec![0, 0]), (shoff + 32, (1u64 << 40).to_le_bytes().to_vec())]),
    ];
    variants
        .into_iter()
        .map(|(name, patches)| {
            let path = dir.join(format!("huge-{name}"));
            sparse_copy(&original, &path, &patches);
            path
        })
        .collect()
}

const MAPPER_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0 || mmap(0, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) { perror(argv[i]); return 1; }
    }
    printf("ready\n");
    fflush(stdout);
    sleep(300);
    return 0;
}
"#;

/// Processes that each map one page of every hostile file and sleep.
struct Mappers(Vec<Child>);

impl Drop for Mappers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start_mappers(dir: &Path, files: &[PathBuf]) -> Option<Mappers> {
    let Some(gcc) = find_program("gcc").or_else(|| find_program("cc")) else {
        skip("no C compiler (gcc) to build the process that maps the hostile files");
        return None;
    };
    let source = dir.join("mapper.c");
    let binary = dir.join("mapper");
    fs::write(&source, MAPPER_C).expect("write mapper.c");
    let status = Command::new(gcc).arg("-O1").arg("-o").arg(&binary).arg(&source).status().expect("run gcc");
    assert!(status.success(), "gcc failed to build mapper.c: {status}");
    let mut mappers = Mappers(Vec::new());
    // One mapper per file and one with all of them.
    let sets: Vec<Vec<&PathBuf>> = files.iter().map(|f| vec![f]).chain([files.iter().collect()]).collect();
    for set in sets {
        let mut child = Command::new(&binary)
            .args(set)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the mapper");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "ready", "the mapper did not map the hostile files");
        mappers.0.push(child);
    }
    Some(mappers)
}

#[test]
fn hostile_sparse_elf_files_cost_neither_memory_nor_time() {
    if !is_root() {
        skip("pyperch needs root");
        return;
    }
    let Some(py) = first_python(&HOST_PREFERENCE) else {
        skip("no supported python is available");
        return;
    };
    let dir = TempDir(std::env::temp_dir().join("pyperch-tests").join(format!("hostile-{}", std::process::id())));
    fs::create_dir_all(&dir.0).expect("create the temporary directory");
    let files = hostile_files(&dir.0);
    let Some(_mappers) = start_mappers(&dir.0, &files) else { return };
    let mut benign = Workload::spawn(&py, "spin.py", &["leaf_red", "120"]).unwrap_or_else(|e| panic!("{e:#}"));
    note(format!("benign workload: pid {} = {}", benign.pid, py.describe()));

    // `pyperch list`: inspects every process, the hostile mappers included.
    let mut cmd = Command::new(pyperch_bin());
    cmd.arg("list");
    let running = Running::start(cmd).expect("start pyperch list");
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_peak_rss(running.pid(), done.clone());
    let list = running.finish(Duration::from_secs(60));
    done.store(true, Ordering::Relaxed);
    let list_peak = watcher.join().expect("watcher");
    let d = list.diag();
    assert!(!list.timed_out(), "pyperch list did not finish within 60 s{d}");
    assert!(list.success(), "pyperch list failed{d}");
    assert!(list.stdout.contains(&benign.pid.to_string()), "pyperch list does not show the benign python{d}");
    assert!(list_peak <= RSS_BUDGET_KIB, "pyperch list peaked at {list_peak} KiB resident (budget {RSS_BUDGET_KIB} KiB){d}");
    note(format!("pyperch list: {:.1} s, peak {list_peak} KiB resident", list.elapsed.as_secs_f64()));

    // `pyperch record` of the whole host: long enough, and at a rate high enough, that
    // sampling noise and perf's frequency ramp-up stay well inside the 10 % margin.
    let run = RecordRun::start(&["--duration", "4", "--rate", "199"]);
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_peak_rss(run.pid(), done.clone());
    let sampling = run.wait_until_sampling(Duration::from_secs(30));
    let (started, ticks_before) = (Instant::now(), cpu_ticks(benign.pid));
    let rec = run.finish();
    let (window, ticks_after) = (started.elapsed(), cpu_ticks(benign.pid));
    done.store(true, Ordering::Relaxed);
    let record_peak = watcher.join().expect("watcher");
    benign.terminate();
    let d = rec.diag_pid(benign.pid);
    rec.assert_ok();
    assert!(sampling, "pyperch record did not start sampling within 30 s{d}");
    assert!(record_peak <= RSS_BUDGET_KIB, "pyperch record peaked at {record_peak} KiB resident (budget {RSS_BUDGET_KIB} KiB){d}");

    // Expected: 199 Hz for 4 s, times the CPU share the workload had.
    let share = (ticks_after - ticks_before) as f64 / clock_ticks_per_second() / window.as_secs_f64();
    let expected = 199.0 * 4.0 * share.min(1.0);
    let mine = rec.profile.for_pid(benign.pid);
    let named = mine.with_leaf("leaf_red");
    note(format!(
        "pyperch record: {:.1} s, peak {record_peak} KiB resident; benign: {named} of {} samples in leaf_red, ~{expected:.0} expected (CPU share {share:.2})",
        rec.run.elapsed.as_secs_f64(),
        mine.total()
    ));
    assert!(named as f64 >= 0.9 * expected, "{named} samples in leaf_red, want >= 90 % of ~{expected:.0}{d}");
    assert!(named as f64 >= 0.9 * mine.total() as f64, "{named} of {} samples of the benign python in leaf_red{d}", mine.total());
    drop(dir);
}
