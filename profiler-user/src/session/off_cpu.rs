//! Off-CPU time the kernel holds but has not sent: intervals still pending (their thread is
//! switched out) and short time not yet sent, charged at a period's end (`agent`, `top`) or at
//! the end of the recording.
//!
//! The kernel sends an interval once, when its thread runs again, with its whole length. A
//! view made of periods (the agent's profiles) charges each pending interval's time up to the
//! period's end from the stack the kernel kept for it, and remembers how far it charged
//! ([`ChargedParts`]); when the interval's record arrives, only the rest is charged. So a
//! thread blocked for ten minutes shows in each period's profile for the time it was blocked
//! in that period, and its time is counted once.

use std::collections::{HashMap, HashSet};

use profiler_common::{
    OffCpuInterval, OffCpuRecords, SampleHeader, ThreadSwitch, off_cpu_trailer, record_body, record_kind, write_off_cpu_record,
};

use std::sync::Arc;

use super::{Session, blocked_at_start};
use crate::time_mode::{OFF_CPU_SHORT, off_cpu_leaf};

/// How far pending off-CPU intervals were charged before their records arrived.
///
/// Keyed by (tid, `switched_out_ns`): a thread's next interval starts at another time, so a
/// part never applies to another interval. An entry is removed when its record arrives. It
/// is kept while its interval is *live*: pending, or ended with its record still in a CPU's
/// batch (with per-task events a batch waits for the next switch on its CPU, which may be
/// the end of the run). One whose record never comes (the kernel lost the kept stack and
/// summed the interval as short time) is dropped two periods after it was last live (time
/// for a record in the ring buffer to be read), so the map holds at most the live intervals
/// of three periods.
#[derive(Debug, Default)]
pub(crate) struct ChargedParts {
    /// (tid, switched out at) → (charged up to, `periods` when last charged).
    parts: HashMap<(u32, u64), (u64, u64)>,
    periods: u64,
}

impl ChargedParts {
    /// Where the charge of thread `tid`'s interval that began at `switched_out_ns` resumes.
    fn charged_until(&self, tid: u32, switched_out_ns: u64) -> u64 {
        self.parts.get(&(tid, switched_out_ns)).map_or(switched_out_ns, |&(until, _)| until.max(switched_out_ns))
    }

    /// Notes that the interval was charged up to `until`.
    fn note(&mut self, tid: u32, switched_out_ns: u64, until: u64) {
        self.parts.insert((tid, switched_out_ns), (until, self.periods));
    }

    /// The part of an interval of `off_ns` (its record has arrived) not charged yet.
    pub(crate) fn remaining(&mut self, tid: u32, switched_out_ns: u64, off_ns: u64) -> u64 {
        match self.parts.remove(&(tid, switched_out_ns)) {
            Some((until, _)) => off_ns.saturating_sub(until.saturating_sub(switched_out_ns)),
            None => off_ns,
        }
    }

    /// Drops what was noted of an interval charged to its end by other means.
    fn forget(&mut self, tid: u32, switched_out_ns: u64) {
        self.parts.remove(&(tid, switched_out_ns));
    }

    /// Ends a period in which `live` are the intervals still pending or whose records are
    /// still in a CPU's batch.
    fn end_period(&mut self, live: &HashSet<(u32, u64)>) {
        let periods = self.periods;
        self.parts.retain(|key, (_, at)| {
            if live.contains(key) {
                // As if charged in the next period: two more periods' ends keep it.
                *at = periods + 1;
            }
            *at + 1 >= periods
        });
        self.periods += 1;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.parts.len()
    }
}

/// At most this many threads' arrivals counts (`/proc/PID/task/TID/schedstat`, one short
/// line each) are read in one pass over the pending waits (a period's end, the end).
const MAX_ARRIVALS_READS: u32 = 4096;

impl Session {
    /// At the end of a period (`now_ns`, kernel monotonic clock): charges every pending
    /// interval of at least `--min-off-cpu` so far, from where it was last charged up to
    /// `now_ns` (or to when sampling stopped, if earlier), to the stack the kernel kept for
    /// it. Short time stays in the kernel, sent with the thread's next record.
    pub(crate) fn charge_pending_off_cpu(&mut self, now_ns: u64) {
        let now_ns = self.sampling_stopped_ns.map_or(now_ns, |stopped| stopped.min(now_ns));
        let min_off_cpu_ns = self.min_off_cpu_ns;
        if !self.time_mode.off_cpu() {
            return;
        }
        let mut live = HashSet::new();
        let mut reads = MAX_ARRIVALS_READS;
        let pending = self.kernel.pending_off_cpu();
        if self.blocked.enabled() {
            let first_switches: HashMap<u32, ThreadSwitch> = pending.iter().map(|(tid, s, _)| (*tid, *s)).collect();
            self.charge_blocked_at_start(now_ns, &first_switches, false, &mut reads);
        }
        for (tid, state, record) in pending {
            let out = state.switched_out_ns;
            if out == 0 {
                continue;
            }
            live.insert((tid, out));
            let from = self.charged.charged_until(tid, out);
            if now_ns.saturating_sub(out) < min_off_cpu_ns || now_ns <= from {
                continue;
            }
            // Sampling runs: the thread may have run and switched out again since its state
            // was read, and its kept record be another stack by now. The kernel writes the
            // record before the state, and a switch-in clears the state first, so a state
            // that still holds this switch-out after the record was read proves the record
            // is this interval's.
            let still = self.kernel.thread_switch(tid).is_some_and(|s| s.switched_out_ns == out);
            if !self.wait_unbroken(&state, tid, &mut reads) {
                // It may have run unseen during a pause: not charged now (if it did not, its
                // switch-in sends it whole; if it did, the kernel drops it there).
                continue;
            }
            if let (Some(bytes), true) = (record, still) {
                if self.charge_kept_record(tid, &state, bytes, now_ns, now_ns - from, 0) {
                    self.charged.note(tid, out, now_ns);
                }
            }
        }
        // An interval that ended since is live while its record waits in its CPU's batch:
        // read after the pending ones, so an interval that ended in between is seen here or
        // is in the ring buffer already.
        for batch in self.kernel.unsent_off_cpu_batches() {
            for record in OffCpuRecords::new(&batch) {
                let Ok(record) = record else { break };
                if let Some(interval) = record_body(record.1).and_then(|body| off_cpu_trailer(&record.0, body)) {
                    live.insert((record.0.tid, interval.switched_out_ns));
                }
            }
        }
        self.charged.end_period(&live);
    }

    /// Once sampling has stopped at `end_ns` (kernel monotonic clock; the time the programs
    /// were detached, if earlier): charges what the
    /// kernel holds but has not sent. A thread still switched out has its interval up to
    /// `end_ns` charged to the stack walked when it left (the part not charged at a period's
    /// end yet); threads' short intervals not yet sent are added as `<off-cpu: short>`; the
    /// waits of threads blocked since before the kernel watched them are charged as
    /// `blocked_at_start` says.
    pub(crate) fn add_unsent_off_cpu(&mut self, end_ns: u64, min_off_cpu_ns: u64) {
        let end_ns = self.sampling_stopped_ns.map_or(end_ns, |stopped| stopped.min(end_ns));
        if !self.time_mode.off_cpu() {
            return;
        }
        let pending = self.kernel.pending_off_cpu();
        let mut reads = MAX_ARRIVALS_READS;
        let first_switches: HashMap<u32, ThreadSwitch> = pending.iter().map(|(tid, s, _)| (*tid, *s)).collect();
        self.charge_blocked_at_start(end_ns, &first_switches, true, &mut reads);
        for (tid, state, record) in pending {
            let mut short = state.short_ns;
            let out = state.switched_out_ns;
            let length = end_ns.saturating_sub(out);
            if out != 0 && !self.wait_unbroken(&state, tid, &mut reads) {
                // It ran unseen during a pause: its end is unknown, and no time is charged.
                self.off_cpu_paused_dropped += 1;
                self.charged.forget(tid, out);
                self.add_short_off_cpu(state.tgid, state.generation, tid, short);
                continue;
            }
            match record {
                Some(bytes) if out != 0 && length >= min_off_cpu_ns => {
                    let from = self.charged.charged_until(tid, out);
                    let rest = end_ns.saturating_sub(from);
                    if self.charge_kept_record(tid, &state, bytes, end_ns, rest, short) {
                        short = 0;
                    }
                    self.charged.forget(tid, out);
                }
                // Short time is kept weighted: this interval's length times the weight of
                // the switch-out that began it (on its kept record).
                _ if out != 0 && length < min_off_cpu_ns => short = short.saturating_add(length.saturating_mul(kept_weight(record.as_deref()))),
                _ => {}
            }
            self.add_short_off_cpu(state.tgid, state.generation, tid, short);
        }
    }

    /// Whether thread `tid`'s pending interval (`state`) is still one wait now: no pause of
    /// the scheduler-switch program since it began, or the thread has not arrived on a CPU
    /// since (its arrivals count, read after the caller's time was taken, is the one kept at
    /// its switch-out). See `kernel::switch_gate`. `reads`: the schedstat reads this pass may
    /// still make; past them a wait across a pause is not proven (not charged).
    fn wait_unbroken(&self, state: &ThreadSwitch, tid: u32, reads: &mut u32) -> bool {
        let paused = self.kernel.switch_gate().is_some_and(|g| g.paused_since(state.switched_out_ns));
        if !paused {
            return true;
        }
        if *reads == 0 {
            return false;
        }
        *reads -= 1;
        crate::kernel::switch_gate::thread_arrivals(state.tgid, tid) == Some(state.arrivals)
    }

    /// Charges the waits of threads blocked since before their registration (see
    /// `blocked_at_start`) up to `now_ns`, given the kernel's per-thread entries by tid (read
    /// after `now_ns` was taken); `last`: the recording ends, every thread is closed.
    fn charge_blocked_at_start(&mut self, now_ns: u64, kernel: &HashMap<u32, profiler_common::ThreadSwitch>, last: bool, reads: &mut u32) {
        use blocked_at_start::{FirstSwitch, Step, step};
        self.blocked.receive(last);
        let mut open = std::mem::take(&mut self.blocked.open);
        for snapshot in &mut open {
            let process_gone = !self.targets.get(&snapshot.pid).is_some_and(|t| t.generation == snapshot.generation);
            let mut threads = std::mem::take(&mut snapshot.threads);
            // A pause of the scheduler-switch program since the registration: a switch may
            // have gone unseen. While the snapshot was read, nothing proves these waits (what
            // was charged before stands); after it, each thread's arrivals count does.
            let gate = self.kernel.switch_gate();
            let paused = gate.is_some_and(|g| g.paused_since(snapshot.registered_ns));
            let paused_while_read = paused && gate.is_some_and(|g| g.paused_within(snapshot.registered_ns, snapshot.taken_ns));
            threads.retain_mut(|thread| {
                let entry = kernel.get(&thread.read.tid);
                let first = FirstSwitch::of(entry, snapshot.pid, snapshot.generation);
                let unproven = paused_while_read
                    || (paused
                        && !blocked_at_start::proven_across_pauses(&thread.read, first, entry.map_or(0, |e| e.first_in_arrivals), || {
                            if *reads == 0 {
                                return None;
                            }
                            *reads -= 1;
                            crate::kernel::switch_gate::thread_arrivals(snapshot.pid, thread.read.tid)
                        }));
                if unproven {
                    if thread.charged_until <= snapshot.registered_ns {
                        self.blocked.count_dropped(blocked_at_start::Dropped::Paused);
                    }
                    return false;
                }
                // Only a thread with no switch seen can have ended unseen (its entry freed).
                let alive = first != FirstSwitch::None
                    || crate::target::thread_stacks::proc_threads::task_start(snapshot.pid, thread.read.tid) == Some(thread.read.start_time);
                match step(snapshot.registered_ns, snapshot.taken_ns, now_ns, thread, first, alive, last || process_gone) {
                    Step::Keep => true,
                    Step::Close(None) => false,
                    Step::Close(Some(why)) => {
                        self.blocked.count_dropped(why);
                        false
                    }
                    Step::Charge { ns, until, reason, first: first_charge } => {
                        let frames = thread.read.frames.as_deref().unwrap_or_default();
                        let tid = thread.read.tid;
                        if self.add_snapshot_stack(snapshot.pid, snapshot.generation, tid, frames, ns, reason) {
                            if first_charge {
                                self.blocked.charged_threads += 1;
                            }
                            self.blocked.charged_ns += ns;
                            thread.charged_until = until;
                        } else if first_charge {
                            self.blocked.count_dropped(blocked_at_start::Dropped::NotRead);
                            return false;
                        }
                        let over = last || process_gone || matches!(first, FirstSwitch::In(_));
                        !over
                    }
                }
            });
            snapshot.threads = threads;
        }
        self.blocked.open = open;
        self.blocked.close_empty();
    }

    /// Adds `ns` of off-CPU time for `reason` to the stack `frames` (root first, as read by
    /// a snapshot) of thread `tid` of registration `generation` of `pid`. False when the
    /// registration is gone or the profile is full.
    fn add_snapshot_stack(&mut self, pid: u32, generation: u32, tid: u32, frames: &[crate::target::thread_stacks::Frame], ns: u64, reason: u32) -> bool {
        if ns == 0 || !self.targets.get(&pid).is_some_and(|t| t.generation == generation) {
            return false;
        }
        let lines = self.profile.line_numbers();
        let mut stack = Vec::with_capacity(frames.len() + 1);
        let names = frames
            .iter()
            .map(|f| crate::sample::aggregate::FrameName {
                function: f.function.clone(),
                file: f.file.clone(),
                line: lines.pick(|| f.line.unwrap_or(0), f.first_line),
                native: None,
            })
            .chain(std::iter::once(crate::sample::aggregate::FrameName {
                function: Arc::from(off_cpu_leaf(reason)),
                file: Arc::from(""),
                line: 0,
                native: None,
            }));
        for name in names {
            let Some(id) = self.profile.try_intern(name) else { return false };
            stack.push(id);
        }
        let added = self.profile.add_weighted(pid, self.threads.then_some(tid), &stack, ns, 1);
        if added && let Some(t) = self.targets.get_mut(&pid) {
            t.counters.off_cpu_ns += ns;
        }
        added
    }

    pub(super) fn add_short_off_cpu(&mut self, tgid: u32, generation: u32, tid: u32, ns: u64) {
        if ns == 0 || !self.targets.get(&tgid).is_some_and(|t| t.generation == generation) {
            return;
        }
        let Some(id) = self.profile.try_intern(crate::sample::aggregate::FrameName {
            function: Arc::from(OFF_CPU_SHORT),
            file: Arc::from(""),
            line: 0,
            native: None,
        }) else {
            return;
        };
        let tid = self.threads.then_some(tid);
        let added = self.profile.add_weighted(tgid, tid, &[id], ns, 0);
        if let Some(t) = self.targets.get_mut(&tgid) {
            if added {
                t.counters.off_cpu_short_ns += ns;
            } else {
                t.counters.off_cpu_dropped_ns += ns;
            }
        }
    }

    /// Charges `off_ns` (times the kept record's weight, see `sample_flags::weight`; and
    /// `short_ns` of short time, weighted already) to the record the kernel kept for
    /// thread `tid`'s pending interval (`bytes`: header, frames, trailer slot), as of `time_ns`.
    /// False when the bytes are not such a record (nothing charged).
    fn charge_kept_record(&mut self, tid: u32, state: &ThreadSwitch, mut bytes: Vec<u8>, time_ns: u64, off_ns: u64, short_ns: u64) -> bool {
        let Some(mut header) = SampleHeader::read(&bytes) else { return false };
        if header.tid != tid || header.kind != record_kind::OFF_CPU {
            return false;
        }
        header.time_ns = time_ns;
        let trailer = OffCpuInterval {
            off_ns,
            short_ns,
            switched_out_ns: state.switched_out_ns,
            reason: state.reason,
            kernel_stack: state.kernel_stack,
        };
        let Some(end) = write_off_cpu_record(&mut bytes, &header, &trailer) else { return false };
        self.on_record_from(&bytes[..end], false);
        true
    }
}

/// The weight of the switch-out whose record the kernel kept (`bytes`; the sampled share's
/// divisor then, `sample_flags::weight`): 1 without a record or a share.
fn kept_weight(bytes: Option<&[u8]>) -> u64 {
    bytes.and_then(SampleHeader::read).map_or(1, |h| u64::from(profiler_common::sample_flags::weight(h.flags)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pending interval's short time at the end is weighted by its kept record's weight;
    /// without a record, or a share, it counts once.
    #[test]
    fn kept_weight_reads_the_records_flags() {
        use profiler_common::{SampleHeader, sample_flags::WEIGHT_SHIFT};
        assert_eq!(kept_weight(None), 1);
        assert_eq!(kept_weight(Some(&[0u8; 4])), 1, "too short to be a record");
        let mut header = SampleHeader { kind: record_kind::OFF_CPU, ..SampleHeader::default() };
        let mut bytes = vec![0u8; profiler_common::MAX_RECORD_SIZE];
        write_off_cpu_record(&mut bytes, &header, &OffCpuInterval::default()).expect("room");
        assert_eq!(kept_weight(Some(&bytes)), 1);
        header.flags = 16 << WEIGHT_SHIFT;
        write_off_cpu_record(&mut bytes, &header, &OffCpuInterval::default()).expect("room");
        assert_eq!(kept_weight(Some(&bytes)), 16);
    }

    #[test]
    fn a_record_charges_only_what_periods_did_not() {
        let mut c = ChargedParts::default();
        assert_eq!(c.charged_until(7, 100), 100);
        c.note(7, 100, 400);
        assert_eq!(c.charged_until(7, 100), 400);
        // The same thread's next interval is another one.
        assert_eq!(c.charged_until(7, 900), 900);
        assert_eq!(c.remaining(7, 900, 50), 50);
        // 100 → 1000 in all, 300 of it charged already.
        assert_eq!(c.remaining(7, 100, 900), 600);
        // Once: the entry is gone.
        assert_eq!(c.remaining(7, 100, 900), 900);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn parts_whose_record_never_comes_are_dropped_two_periods_later() {
        let mut c = ChargedParts::default();
        c.note(1, 10, 20);
        c.note(2, 10, 20);
        let pending: HashSet<(u32, u64)> = [(1, 10)].into_iter().collect();
        c.end_period(&pending);
        assert_eq!(c.len(), 2, "a record may still be in the ring buffer");
        c.end_period(&pending);
        assert_eq!(c.len(), 2, "or in its CPU's batch, sent a period later");
        c.end_period(&pending);
        assert_eq!(c.len(), 1, "thread 2's part is dropped, thread 1's still pending");
        assert_eq!(c.charged_until(1, 10), 20);
    }

    /// A record that waits in its CPU's batch for many periods (per-task events, nothing
    /// else switching on that CPU) keeps its part: charged whole again at the end otherwise.
    #[test]
    fn parts_whose_record_waits_in_a_batch_are_kept() {
        let mut c = ChargedParts::default();
        c.note(1, 10, 20);
        let in_batch: HashSet<(u32, u64)> = [(1, 10)].into_iter().collect();
        for _ in 0..10 {
            c.end_period(&in_batch);
        }
        c.end_period(&HashSet::new());
        c.end_period(&HashSet::new());
        assert_eq!(c.remaining(1, 10, 100), 90, "the part charged before is not charged again");
        c.note(2, 10, 20);
        c.end_period(&in_batch);
        c.end_period(&HashSet::new());
        c.end_period(&HashSet::new());
        assert_eq!(c.len(), 0, "two periods after it was last live, a part is dropped");
    }
}
