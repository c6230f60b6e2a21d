//! The `--stats` report of a session (`record`, `agent`).

use crate::{target::discovery, kernel::loader::KernelCounters, target::memory, stats::Counters};

use super::Session;

/// The `--stats` report: the whole run, the kernel, then each process.
pub(crate) fn stats_report(session: &Session, totals: &Counters, kernel: KernelCounters) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "pyperch statistics (whole run):");
    s.push_str(&totals.report("  "));
    let _ = writeln!(
        s,
        "  kernel: {} samples of registered processes, {} lost (ring buffer full), {} malformed records",
        kernel.sampled, kernel.ringbuf_full, session.malformed_records
    );
    if let Some(budget) = session.cpu_budget.state() {
        for line in budget.report() {
            let _ = writeln!(s, "  {line}");
        }
        let _ = writeln!(
            s,
            "  CPU budget: {} samples of registered processes skipped by the sampled share, each kept one counting for the skipped",
            kernel.share_skipped
        );
        if budget.switches {
            let _ = writeln!(
                s,
                "  CPU budget: {} switch-outs of profiled threads not walked by the sampled share, each walked one counting for the skipped",
                kernel.switch_share_skipped
            );
        }
    }
    let drain = session.drain_counts;
    let _ = writeln!(
        s,
        "  drain thread: {} records queued for the worker (at most {:.1} MiB at once); dropped: {} (a process's queue full, {} MiB), {} (all queues full, {} MiB), {} (still queued when the end's time ran out)",
        drain.queued,
        drain.peak_bytes as f64 / (1 << 20) as f64,
        drain.dropped_process_full,
        crate::session::drain::PROCESS_BYTES >> 20,
        drain.dropped_total_full,
        crate::session::drain::TOTAL_BYTES >> 20,
        drain.dropped_at_end
    );
    if session.samples_over_read_budget > 0 {
        let budget = crate::session::SAMPLE_READ_BUDGET;
        let _ = writeln!(
            s,
            "  samples over their read budget ({} reads, {} MiB): {}",
            budget.reads,
            budget.bytes >> 20,
            session.samples_over_read_budget
        );
    }
    let quarantined = crate::target::memory::deadline::QUARANTINED_TOTAL.load(std::sync::atomic::Ordering::Relaxed);
    if quarantined > 0 || session.quarantined_records > 0 {
        let _ = writeln!(
            s,
            "  quarantined: {} processes (a read of their memory did not answer within {:.1} s; nothing more read from them), {} of their records dropped; {} readers still blocked",
            quarantined,
            crate::target::memory::deadline::READ_DEADLINE.as_secs_f64(),
            session.quarantined_records,
            crate::target::memory::deadline::stuck_readers()
        );
    }
    if kernel.code_checks_cached + kernel.code_checks_read > 0 {
        let _ = writeln!(
            s,
            "  kernel code-object checks: {} from the kernel's cache (no code object created or freed since they were read), {} read from the target",
            kernel.code_checks_cached, kernel.code_checks_read
        );
    }
    if kernel.code_snapshots + kernel.code_snapshots_skipped > 0 {
        let _ = writeln!(
            s,
            "  kernel code-object copies: {} sent at sample time, {} not made (larger than the kernel's regions, or unreadable); {} for processes no longer profiled",
            kernel.code_snapshots, kernel.code_snapshots_skipped, session.unknown_process_snapshots
        );
    }
    if kernel.off_cpu_intervals + kernel.off_cpu_short + kernel.off_cpu_lost > 0 {
        let _ = writeln!(
            s,
            "  kernel off-CPU intervals: {} sent, {} short (summed), {} whose stack was not kept (summed); sent in {} batches, {} batches read at the end",
            kernel.off_cpu_intervals, kernel.off_cpu_short, kernel.off_cpu_lost, kernel.off_cpu_batches, session.off_cpu_batches_at_end
        );
    }
    if let Some(gate) = session.kernel.switch_gate() {
        let (pauses, paused_ns) = gate.pauses(crate::kernel::loader::monotonic_ns());
        if pauses > 0 || kernel.off_cpu_end_missed + session.off_cpu_paused_dropped > 0 {
            let _ = writeln!(
                s,
                "  scheduler-switch program paused (--max-cpu: its cost on every context switch was over the budget): {} pauses, {:.1} s in all; off-CPU intervals dropped because their thread ran unseen during a pause: {} at their switch-in, {} at the end",
                pauses,
                paused_ns as f64 / 1e9,
                kernel.off_cpu_end_missed,
                session.off_cpu_paused_dropped
            );
        }
    }
    if kernel.off_cpu_no_kernel_stack + session.kernel_stacks.missing > 0 || (session.off_cpu_kernel_stacks() && kernel.off_cpu_intervals > 0) {
        let _ = writeln!(
            s,
            "  kernel stacks of off-CPU intervals (--kernel): {} switch-outs without one (the stack map's slot held another stack, or it was full), {} intervals whose stack was not found; those are shown without kernel frames",
            kernel.off_cpu_no_kernel_stack, session.kernel_stacks.missing
        );
    }
    if kernel.not_gil_holder + kernel.gil_unknown + kernel.no_gil > 0 {
        let _ = writeln!(
            s,
            "  kernel --mode gil: {} samples of threads not holding the GIL dropped, {} of versions that cannot tell the holder dropped, {} of free-threaded processes running without a GIL dropped",
            kernel.not_gil_holder, kernel.gil_unknown, kernel.no_gil
        );
    }
    if kernel.not_handling_exception + kernel.exception_unknown + kernel.exception_chain_too_long > 0 {
        let _ = writeln!(
            s,
            "  kernel --mode exception: {} samples of threads not handling an exception dropped, {} of versions whose exception state is not known dropped, {} whose exception-state chain was longer than {} items dropped",
            kernel.not_handling_exception,
            kernel.exception_unknown,
            kernel.exception_chain_too_long,
            profiler_common::MAX_EXCEPTION_ITEMS
        );
    }
    if session.blocked.enabled() {
        let _ = writeln!(s, "  {}", session.blocked.report());
    }
    let _ = writeln!(s, "  {}", session.discovery_stats.report());
    if let Some(t) = session.profile.timeline() {
        let _ = writeln!(
            s,
            "  timeline (chrometrace): {} runs kept (cap {}), {} samples dropped over the cap, {} out of order",
            t.run_count(),
            crate::sample::timeline::MAX_RUNS,
            t.dropped_over_cap,
            t.out_of_order
        );
    }
    let _ = writeln!(
        s,
        "  kernel process map: {} registrations refused (map full, retried later), {} slots freed by exits",
        session.kernel.map_full(),
        session.kernel.registered_exits()
    );
    let _ = writeln!(
        s,
        "  all target memory reads: {} reads, {} bytes (discovery included)",
        memory::READS.load(std::sync::atomic::Ordering::Relaxed),
        memory::BYTES_READ.load(std::sync::atomic::Ordering::Relaxed)
    );
    let files = discovery::file_counts();
    let problems: Vec<String> =
        files.problems.iter().filter(|(_, n)| *n > 0).map(|(p, n)| format!("{n} {}", p.label())).collect();
    let _ = writeln!(
        s,
        "  mapped files: {} parsed; problem files: {}; {} skips without opening ({} over a process's opener allowance, {} over all openers); {} hung now",
        discovery::cached_files(),
        if problems.is_empty() { "none".to_string() } else { problems.join(", ") },
        files.skips,
        files.over_allowance,
        files.over_total,
        files.hung_now
    );
    if let Some(line) = session.native_io_report() {
        let _ = writeln!(s, "  {line}");
    }
    let _ = writeln!(
        s,
        "  pod names (runtime annotations): {} containers named; {} bundles refused (not a regular file, over 1 MiB, not JSON, not Kubernetes names, another pod's UID, or a runtime monitor's bundle path not of its runtime's layout)",
        crate::host::pod_names::named(),
        crate::host::pod_names::refused()
    );
    for (pid, comm, version, alive, counters) in session.per_process() {
        let comm = crate::text::field(&comm);
        let _ = writeln!(s, "  process {pid} ({comm}, Python {version}{}):", if alive { "" } else { ", exited" });
        s.push_str(&counters.report("    "));
    }
    s
}

