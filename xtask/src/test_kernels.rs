//! `cargo xtask test-kernels`: boots Debian's own kernel packages under qemu and checks, in
//! each guest, that pyperch loads, samples real Python processes and gives the same correct
//! stacks as on the host.
//!
//! The guest is the host itself, read-only: its root is shared over 9p, and a small
//! initramfs (busybox-static and the kernel package's 9p/virtio modules) mounts it, mounts
//! fresh /proc, /sys, /dev and /tmp over it, and chroots into it to run a generated script
//! with the host's interpreters and the freshly built pyperch. The script writes its results
//! to a second, writable 9p share, which this task reads after the guest powers off.
//!
//! Kernels come from the machine's configured Debian mirror through apt with a private state
//! directory, and are cached in `~/.cache/pyperch/kernels/SUITE` (only vmlinuz and the few
//! modules the initramfs needs are kept).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::{Paths, apt_sources, build, find_program, is_root, run_checked, stack_check, step, warn};

/// The kernels tested: Debian release, suite, and whether that kernel has `bpf_loop`.
const KERNELS: [(&str, &str); 2] = [("Debian 11", "bullseye"), ("Debian 12", "bookworm")];

/// Module directories (under `lib/modules/RELEASE/kernel/`) the initramfs needs for 9p over
/// virtio; missing ones (fs/netfs before 6.0) are skipped.
const MODULE_DIRS: [&str; 5] = ["fs/9p", "net/9p", "drivers/virtio", "fs/fscache", "fs/netfs"];
/// Modules the initramfs loads (busybox modprobe resolves their dependencies).
const MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];

/// How long one guest may run (boot, two interpreters, one or two walks each); under
/// emulation (no KVM) a run takes about half a minute.
const GUEST_TIMEOUT: Duration = Duration::from_secs(480);
/// Seconds pyperch records each interpreter.
const RECORD_SECONDS: u32 = 3;

/// The initramfs's /init: mounts the host's root read-only and the output share, then runs
/// the test script chrooted in the host's root. Kernel command-line words with `=` that the
/// kernel does not know reach init as environment variables.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
depmod
for m in MODULES; do modprobe $m || echo "pyperch-guest: modprobe $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 host /host || echo "pyperch-guest: cannot mount the host's root"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out "/host$PYPERCH_GUEST_OUT" || echo "pyperch-guest: cannot mount the output share"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp
uname -r > "/host$PYPERCH_GUEST_OUT/release"
chroot /host /bin/sh "$PYPERCH_GUEST_SCRIPT" > "/host$PYPERCH_GUEST_OUT/script.log" 2>&1
echo done > "/host$PYPERCH_GUEST_OUT/done"
sync
poweroff -f
"#;

/// One interpreter to profile in the guest.
struct Interpreter {
    label: &'static str,
    path: PathBuf,
}

/// One run of pyperch in a guest: an interpreter, a walk (`None`: the kernel's choice), and
/// whether pyperch records the whole host (per-CPU events) rather than `--pid` (per-task).
struct Run<'a> {
    interpreter: &'a Interpreter,
    forced_walk: Option<&'static str>,
    whole_host: bool,
    /// `--mode exception` instead of the default mode: the verifier checks the exception-state
    /// chain walk only where the mode enables it (a frozen constant), and the workload handles
    /// no exception, so every sample must be dropped as not handling (counted in `--stats`).
    exception_mode: bool,
    /// `--mode wall` (kernels with `bpf_loop` only): the scheduler-switch program, loaded only
    /// in the off-CPU modes, must pass this kernel's verifier too.
    wall_mode: bool,
    /// `--native`: the native walk from unwind tables (with `bpf_loop`, or the bounded loop of
    /// global-function calls without it) must pass this kernel's verifier and walk whole stacks (3.11 runs the recursion in one evaluation
    /// call, so its native stack is short enough to end at `_start`).
    native_mode: bool,
}

impl Run<'_> {
    fn name(&self) -> String {
        let mut name = self.interpreter.label.to_string();
        if let Some(walk) = self.forced_walk {
            name = format!("{name}-{walk}");
        }
        if self.whole_host {
            name.push_str("-host");
        }
        if self.exception_mode {
            name.push_str("-exception");
        }
        if self.native_mode {
            name.push_str("-native");
        }
        if self.wall_mode {
            name.push_str("-wall");
        }
        name
    }
}

/// How much `run` boots.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every kernel, walk, scope and interpreter (`cargo xtask test-kernels`).
    Full,
    /// The short run at the end of an unfiltered `cargo xtask test` (CI): only the oldest
    /// kernel, the one without `bpf_loop` (its bounded walk runs nowhere else), with every
    /// interpreter and scope. The newer kernel's runs (the `bpf_loop` walk, and the bounded
    /// walk forced) are what the host's own end-to-end tests already run.
    Quick,
}

pub(crate) fn run(p: &Paths, scope: Scope) -> Result<()> {
    if !is_root() {
        bail!("test-kernels needs root (qemu shares the host's root with the guest, and apt installs qemu)");
    }
    install_package("qemu-system-x86_64", "qemu-system-x86")?;
    install_package("busybox (static)", "busybox-static")?;
    let pyperch = build(p)?;
    let interpreters = interpreters();
    if interpreters.is_empty() {
        bail!("no Python interpreter to profile (neither /usr/bin/python3.11 nor pyenv's 3.9)");
    }
    let work = p.target.join("test-kernels");
    if work.to_string_lossy().contains(char::is_whitespace) {
        bail!("the target directory {} has white space, which the kernel command line cannot carry", work.display());
    }
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let workload = work.join("workload.py");
    fs::write(&workload, stack_check::workload())?;

    let mut results = Vec::new();
    let kernels = match scope {
        Scope::Full => &KERNELS[..],
        Scope::Quick => &KERNELS[..1],
    };
    for &(release, suite) in kernels {
        let kernel = fetch_kernel(p, suite).with_context(|| format!("getting {release}'s kernel ({suite})"))?;
        let has_bpf_loop = kernel.version() >= (5, 17);
        let mut runs: Vec<Run> =
            interpreters.iter().map(|i| Run { interpreter: i, forced_walk: None, whole_host: false, exception_mode: false, wall_mode: false, native_mode: false }).collect();
        // The whole host too (one event per CPU instead of per-task events).
        runs.push(Run { interpreter: &interpreters[0], forced_walk: None, whole_host: true, exception_mode: false, wall_mode: false, native_mode: false });
        // `--mode exception`: its chain walk (bpf_loop, or the bounded loop without it).
        runs.push(Run { interpreter: &interpreters[0], forced_walk: None, whole_host: false, exception_mode: true, wall_mode: false, native_mode: false });
        // `--native`: the native walk from unwind tables (bpf_loop, or the bounded loop).
        runs.push(Run { interpreter: &interpreters[0], forced_walk: None, whole_host: false, exception_mode: false, wall_mode: false, native_mode: true });
        if has_bpf_loop {
            // The walk without bpf_loop, on a kernel that has it too: both walks, same checks.
            runs.extend(
                interpreters
                    .iter()
                    .map(|i| Run { interpreter: i, forced_walk: Some("bounded"), whole_host: false, exception_mode: false, wall_mode: false, native_mode: false }),
            );
            runs.push(Run { interpreter: &interpreters[0], forced_walk: Some("bounded"), whole_host: false, exception_mode: true, wall_mode: false, native_mode: false });
            // `--mode wall` (5.17+): the scheduler-switch program is loaded only then.
            runs.push(Run { interpreter: &interpreters[0], forced_walk: None, whole_host: false, exception_mode: false, wall_mode: true, native_mode: false });
            // `--native` with the bounded sampler forced.
            runs.push(Run { interpreter: &interpreters[0], forced_walk: Some("bounded"), whole_host: false, exception_mode: false, wall_mode: false, native_mode: true });
        }
        let out = work.join(suite);
        fs::create_dir_all(&out)?;
        let script = out.join("guest.sh");
        fs::write(&script, guest_script(&pyperch, &workload, &out, &runs))?;
        let initramfs = out.join("initramfs.cpio");
        build_initramfs(&kernel, &out.join("initramfs"), &initramfs)?;
        step(format!("test-kernels: booting {release}'s {} under qemu ({})", kernel.release, accelerator()));
        let started = Instant::now();
        let boot = boot(&kernel, &initramfs, &script, &out);
        let elapsed = started.elapsed().as_secs();
        for r in &runs {
            let mut walk = match (r.forced_walk, has_bpf_loop) {
                (Some(w), _) => format!("{w} walk (forced)"),
                (None, true) => "bpf_loop walk".to_string(),
                (None, false) => "bounded walk (no bpf_loop)".to_string(),
            };
            walk.push_str(if r.whole_host { ", whole host" } else { ", --pid" });
            if r.exception_mode {
                walk.push_str(", --mode exception");
            }
            if r.wall_mode {
                walk.push_str(", --mode wall");
            }
            if r.native_mode {
                walk.push_str(", --native");
            }
            let outcome = match &boot {
                Ok(()) if r.exception_mode => judge_exception_mode(&out, &r.name()),
                Ok(()) if r.wall_mode => judge_wall_mode(&out, &r.name()),
                Ok(()) if r.native_mode => judge_native_mode(&out, &r.name()),
                Ok(()) => judge(&out, &r.name(), &workload),
                Err(e) => Err(anyhow!("{e:#}")),
            };
            let line = format!(
                "{release} {} ({walk}), Python {}: {}",
                kernel.release,
                r.interpreter.label,
                match &outcome {
                    Ok(summary) => format!("PASS ({summary})"),
                    Err(e) => format!("FAIL: {e:#}"),
                }
            );
            step(format!("test-kernels: {line} [guest ran {elapsed} s]"));
            results.push((line, outcome.is_ok()));
        }
    }
    println!("\ntest-kernels summary:");
    for (line, _) in &results {
        println!("  {line}");
    }
    let failed = results.iter().filter(|(_, ok)| !ok).count();
    if failed > 0 {
        bail!("{failed} of {} kernel runs failed (guest logs in {})", results.len(), work.display());
    }
    Ok(())
}

/// The interpreters the guests profile: the host's Debian Python 3.11 and pyenv's 3.9 (a
/// shared-library build), each when present; a missing one is reported as skipped.
fn interpreters() -> Vec<Interpreter> {
    let mut found = Vec::new();
    let system = PathBuf::from("/usr/bin/python3.11");
    if system.is_file() {
        found.push(Interpreter { label: "3.11", path: system });
    } else {
        println!("SKIP test-kernels: /usr/bin/python3.11 is missing");
    }
    match pyenv_python("3.9") {
        Some(path) => found.push(Interpreter { label: "3.9", path }),
        None => println!("SKIP test-kernels: no pyenv Python 3.9 (PYENV_ROOT, ~/.pyenv, /root/.pyenv)"),
    }
    found
}

/// The newest pyenv `MINOR.*` build's `bin/pythonMINOR`.
pub(crate) fn pyenv_python(minor: &str) -> Option<PathBuf> {
    let roots = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))
        .chain([PathBuf::from("/root/.pyenv")]);
    for root in roots {
        let Ok(entries) = fs::read_dir(root.join("versions")) else { continue };
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let patch = name.strip_prefix(minor)?.strip_prefix('.')?.parse::<u32>().ok()?;
                Some((patch, e.path().join("bin").join(format!("python{minor}"))))
            })
            .filter(|(_, p)| p.is_file())
            .collect();
        versions.sort();
        if let Some((_, path)) = versions.pop() {
            return Some(path);
        }
    }
    None
}

/// The guest's test script (run by /bin/sh in the host's root): for each run, start the
/// workload, wait for it to be ready, record it, and leave the collapsed output, the
/// `--stats` text and pyperch's exit status in `out`.
fn guest_script(pyperch: &Path, workload: &Path, out: &Path, runs: &[Run]) -> String {
    let mut s = String::from("#!/bin/sh\ncd /tmp\n");
    for r in runs {
        let name = r.name();
        let env = r.forced_walk.map(|w| format!("PYPERCH_KERNEL_WALK={w} ")).unwrap_or_default();
        let mut scope = if r.whole_host { "" } else { "--pid $P " }.to_string();
        if r.exception_mode {
            scope.push_str("--mode exception ");
        }
        if r.wall_mode {
            scope.push_str("--mode wall ");
        }
        if r.native_mode {
            scope.push_str("--native ");
        }
        s.push_str(&format!(
            "echo \"run {name}\"
{py} {workload} > /tmp/{name}.ready 2>&1 &
P=$!
i=0
while [ $i -lt 600 ] && ! grep -q ready /tmp/{name}.ready; do sleep 0.2; i=$((i+1)); done
{env}{pyperch} record {scope}--duration {RECORD_SECONDS} -f collapsed -o {out}/{name}.collapsed --stats > {out}/{name}.stats 2>&1
echo $? > {out}/{name}.rc
kill $P
wait $P 2>/dev/null
",
            py = r.interpreter.path.display(),
            workload = workload.display(),
            pyperch = pyperch.display(),
            out = out.display(),
        ));
    }
    s
}

/// One run's `--stats` text, once the guest finished it and pyperch exited 0; else why not.
fn finished_run(out: &Path, name: &str) -> Result<String> {
    let read = |ext: &str| fs::read_to_string(out.join(format!("{name}.{ext}")));
    let stats = read("stats").unwrap_or_default();
    let rc = read("rc").map_err(|_| anyhow!("the guest did not finish this run (see {}/script.log)", out.display()))?;
    if rc.trim() != "0" {
        let last = stats.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        bail!("pyperch exited with status {}: {last}", rc.trim());
    }
    Ok(stats)
}

/// Reads one run's results: pyperch exited 0, every stack is one the workload can have, and
/// enough of them are whole (all `deep` frames, through the kernel's hashed tail).
fn judge(out: &Path, name: &str, workload: &Path) -> Result<String> {
    let read = |ext: &str| fs::read_to_string(out.join(format!("{name}.{ext}")));
    finished_run(out, name)?;
    let collapsed = read("collapsed").context("no collapsed output")?;
    let verdict = stack_check::check(&collapsed, &workload.to_string_lossy());
    if let Some(stack) = verdict.impossible {
        bail!("a stack the workload cannot have: {stack}");
    }
    if verdict.whole_deep_samples < 10 {
        bail!(
            "only {} samples with the whole {}-frame recursion ({} valid samples in all)",
            verdict.whole_deep_samples,
            stack_check::DEPTH + 1,
            verdict.valid_samples
        );
    }
    Ok(format!(
        "{} samples, all possible stacks; {} through all {} deep frames",
        verdict.valid_samples,
        verdict.whole_deep_samples,
        stack_check::DEPTH + 1
    ))
}

/// Reads one `--mode wall` run's results: pyperch exited 0 (both programs loaded, the
/// scheduler-switch program verified and attached) and wrote stacks.
fn judge_wall_mode(out: &Path, name: &str) -> Result<String> {
    let read = |ext: &str| fs::read_to_string(out.join(format!("{name}.{ext}")));
    finished_run(out, name)?;
    let collapsed = read("collapsed").context("no collapsed output")?;
    let stacks = collapsed.lines().filter(|l| !l.trim().is_empty()).count();
    let waits = collapsed.lines().filter(|l| l.contains("<off-cpu: ")).count();
    // The workload spins: off-CPU stacks come only from preemption, if any.
    if stacks == 0 {
        bail!("no stack in the collapsed output");
    }
    Ok(format!("{stacks} stacks, {waits} of them off-CPU"))
}

/// Reads one `--native` run's results: pyperch exited 0 (the native walk verified), walks
/// reached the outermost frame, and at least half of the samples are whole from `_start` to
/// the workload's frames.
fn judge_native_mode(out: &Path, name: &str) -> Result<String> {
    let stats = finished_run(out, name)?;
    let outermost = stats
        .lines()
        .find_map(|l| l.trim().strip_prefix("native walk in the kernel ended: at the outermost frame ")?.split(';').next()?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let collapsed = fs::read_to_string(out.join(format!("{name}.collapsed"))).context("no collapsed output")?;
    let (mut total, mut whole) = (0u64, 0u64);
    for line in collapsed.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else { continue };
        let Ok(count) = count.parse::<u64>() else { continue };
        total += count;
        if stack.contains(";_start") && stack.contains("deep") && !stack.contains("<native unwind stopped") {
            whole += count;
        }
    }
    if outermost == 0 || whole * 2 < total {
        bail!("{whole} of {total} samples whole from _start, {outermost} walks at the outermost frame (--stats: {})", stats.trim());
    }
    Ok(format!("{whole} of {total} samples whole from _start, {outermost} walks at the outermost frame"))
}

/// Reads one `--mode exception` run's results: pyperch exited 0 (its programs loaded, the
/// chain walk verified) and dropped the samples of the workload, which handles no exception,
/// as not handling one (its chain was walked to its end), keeping none.
fn judge_exception_mode(out: &Path, name: &str) -> Result<String> {
    let read = |ext: &str| fs::read_to_string(out.join(format!("{name}.{ext}")));
    let stats = finished_run(out, name)?;
    let dropped = stats
        .lines()
        .find_map(|l| l.trim().strip_prefix("kernel --mode exception: ")?.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    if dropped < 10 {
        bail!("only {dropped} samples dropped as not handling an exception (--stats: {})", stats.trim());
    }
    let kept = read("collapsed").unwrap_or_default().lines().filter(|l| l.contains("deep")).count();
    if kept > 0 {
        bail!("{kept} stacks of the workload, which handles no exception, were kept");
    }
    Ok(format!("{dropped} samples dropped as not handling an exception, none kept"))
}

/// A kernel package, unpacked into the cache.
struct Kernel {
    /// `uname -r`, e.g. `5.10.0-32-amd64`.
    release: String,
    vmlinuz: PathBuf,
    /// `lib/modules/RELEASE` with only `MODULE_DIRS`.
    modules: PathBuf,
}

impl Kernel {
    fn version(&self) -> (u32, u32) {
        let mut parts = self.release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }
}

/// The suite's `linux-image-amd64` kernel, downloaded and unpacked once.
fn fetch_kernel(p: &Paths, suite: &str) -> Result<Kernel> {
    let dir = p.cache.join("kernels").join(suite);
    let release_file = dir.join("release");
    if let Ok(release) = fs::read_to_string(&release_file) {
        let release = release.trim().to_string();
        let kernel = Kernel {
            vmlinuz: dir.join(format!("vmlinuz-{release}")),
            modules: dir.join("modules").join(&release),
            release,
        };
        if kernel.vmlinuz.is_file() && kernel.modules.is_dir() {
            return Ok(kernel);
        }
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let mirror = apt_sources::debian_mirror(&apt_sources::configured_sources(Path::new("/"))).ok_or_else(|| {
        anyhow!("no Debian archive in /etc/apt/sources.list or /etc/apt/sources.list.d/, so there is no mirror to get kernels from")
    })?;
    step(format!("test-kernels: downloading {suite}'s linux-image-amd64 from {mirror} (apt's configured mirror)"));
    let apt = dir.join("apt");
    for sub in ["state/lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(apt.join(sub))?;
    }
    fs::write(
        apt.join("sources.list"),
        format!("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {suite} main\n"),
    )?;
    let apt_options: Vec<String> = vec![
        format!("-oDir::Etc::SourceList={}", apt.join("sources.list").display()),
        "-oDir::Etc::SourceParts=/nonexistent".into(),
        format!("-oDir::State={}", apt.join("state").display()),
        format!("-oDir::Cache={}", apt.join("cache").display()),
        "-oDir::State::status=/dev/null".into(),
        "-oAPT::Sandbox::User=root".into(),
    ];
    run_checked(Command::new("apt-get").args(&apt_options).arg("update").stdout(Stdio::null()), "apt-get update")?;
    let depends = Command::new("apt-cache")
        .args(&apt_options)
        .args(["depends", "linux-image-amd64"])
        .output()
        .context("running apt-cache")?;
    let depends = String::from_utf8_lossy(&depends.stdout);
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|d| d.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{suite}'s linux-image-amd64 names no linux-image package"))?;
    run_checked(
        Command::new("apt-get").args(&apt_options).args(["download", &package]).current_dir(&dir),
        &format!("apt-get download {package}"),
    )?;
    let deb = fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| anyhow!("apt-get download left no .deb in {}", dir.display()))?;
    let unpacked = dir.join("unpacked");
    run_checked(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked), "dpkg-deb -x")?;
    let release = package.strip_prefix("linux-image-").unwrap_or(&package).to_string();
    let vmlinuz = dir.join(format!("vmlinuz-{release}"));
    fs::rename(unpacked.join(format!("boot/vmlinuz-{release}")), &vmlinuz)
        .with_context(|| format!("{package} has no boot/vmlinuz-{release}"))?;
    let modules = dir.join("modules").join(&release);
    for sub in MODULE_DIRS {
        let from = unpacked.join("lib/modules").join(&release).join("kernel").join(sub);
        if from.is_dir() {
            let to = modules.join("kernel").join(sub);
            fs::create_dir_all(to.parent().unwrap_or(&modules))?;
            fs::rename(&from, &to)?;
        }
    }
    fs::remove_dir_all(&unpacked)?;
    fs::remove_file(&deb)?;
    fs::remove_dir_all(&apt)?;
    fs::write(&release_file, &release)?;
    Ok(Kernel { release, vmlinuz, modules })
}

/// Writes an uncompressed newc initramfs: busybox-static, the modules, and /init.
fn build_initramfs(kernel: &Kernel, stage: &Path, archive: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(stage);
    for dir in ["bin", "proc", "sys", "dev", "host", "lib/modules"] {
        fs::create_dir_all(stage.join(dir))?;
    }
    fs::copy("/bin/busybox", stage.join("bin/busybox")).context("copying /bin/busybox")?;
    run_checked(
        Command::new("cp").arg("-r").arg(&kernel.modules).arg(stage.join("lib/modules")),
        "copying the kernel modules",
    )?;
    let init = stage.join("init");
    fs::write(&init, INIT.replace("MODULES", &MODULES.join(" ")))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let files = Command::new("find").arg(".").current_dir(stage).output().context("listing the initramfs")?;
    let output = fs::File::create(archive)?;
    let mut cpio = Command::new("/bin/busybox")
        .args(["cpio", "-o", "-H", "newc"])
        .current_dir(stage)
        .stdin(Stdio::piped())
        .stdout(output)
        .stderr(Stdio::null())
        .spawn()
        .context("running busybox cpio")?;
    {
        use std::io::Write;
        let mut stdin = cpio.stdin.take().ok_or_else(|| anyhow!("busybox cpio has no stdin"))?;
        stdin.write_all(&files.stdout)?;
    }
    let status = cpio.wait()?;
    if !status.success() {
        bail!("busybox cpio failed building {}", archive.display());
    }
    Ok(())
}

/// Boots the kernel with KVM when the machine offers it (emulation otherwise) and waits for
/// the guest to power off; the console goes to `out/console.log`.
fn boot(kernel: &Kernel, initramfs: &Path, script: &Path, out: &Path) -> Result<()> {
    let console = out.join("console.log");
    let append = format!(
        "console=ttyS0 panic=-1 quiet PYPERCH_GUEST_SCRIPT={} PYPERCH_GUEST_OUT={}",
        script.display(),
        out.display()
    );
    let qemu = find_program("qemu-system-x86_64").ok_or_else(|| anyhow!("qemu-system-x86_64 is not installed"))?;
    let mut child = Command::new(qemu)
        .args(["-m", "2048", "-smp", "2", "-accel", accelerator()])
        .args(["-display", "none", "-no-reboot", "-monitor", "none"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(append)
        .args(["-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"])
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=out,security_model=none,multidevs=remap", out.display()))
        .stdout(Stdio::null())
        .stderr(fs::File::create(out.join("qemu.log"))?)
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let deadline = Instant::now() + GUEST_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            if !out.join("done").is_file() {
                bail!(
                    "the guest stopped before finishing ({}; console in {})",
                    crate::describe(status),
                    console.display()
                );
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the guest did not finish within {} s (console in {})", GUEST_TIMEOUT.as_secs(), console.display());
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// KVM when the CPU offers hardware virtualisation (`vmx` or `svm`) and /dev/kvm exists;
/// emulation otherwise. (A /dev/kvm without them, as in a VM without nested
/// virtualisation, opens but its guests hang.)
fn accelerator() -> &'static str {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hardware = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if hardware && Path::new("/dev/kvm").exists() { "kvm" } else { "tcg,thread=multi" }
}

/// Installs a Debian package unless `dpkg` has it.
fn install_package(what: &str, package: &str) -> Result<()> {
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"));
    if installed {
        step(format!("{what}: present"));
        return Ok(());
    }
    step(format!("{what}: missing, running `apt-get install -y --no-install-recommends {package}`"));
    let mut install = Command::new("apt-get");
    install.args(["install", "-y", "--no-install-recommends", package]).env("DEBIAN_FRONTEND", "noninteractive");
    if run_checked(&mut install, &format!("installing {package}")).is_err() {
        warn(format!("installing {package} failed; running `apt-get update` and retrying"));
        run_checked(Command::new("apt-get").arg("update"), "apt-get update")?;
        run_checked(&mut install, &format!("installing {package}"))?;
    }
    Ok(())
}
