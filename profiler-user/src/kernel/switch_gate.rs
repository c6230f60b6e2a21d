//! The scheduler-switch program's attachment, held apart so that `--max-cpu` can pause it.
//!
//! The program runs on every context switch of the host. What it does for a switch is made
//! small by the sampled share, but its call is not: at hundreds of thousands of switches a
//! second that fixed cost alone is over a budget of a few percent of a CPU. The budget's
//! thread then attaches it one time slice in `n` and detaches it in between
//! ([`SwitchGate::open`], [`SwitchGate::close`]), and the kernel weighs each switch-out it
//! walks `n` times more (`share_slot::SWITCH_SLICES`).
//!
//! What a pause costs the profile, and how it is kept exact:
//! - a switch-out in a pause is not seen: slices are taken at a random offset in each
//!   second, so the switch-outs seen are a random `1/n` of all, each weighed `n`;
//! - before a pause the program drains (`share_slot::DRAINING`): it walks no new switch-out
//!   while pending intervals end, so waits shorter than the drain are never cut;
//! - a wait still pending when the pause begins ends exactly at its switch-in if the thread
//!   did not run in between; if it ran unseen, the kernel drops it at its switch-in
//!   (`counter::OFF_CPU_END_MISSED`, by the thread's arrivals count), and userspace checks the
//!   same count (`/proc/PID/task/TID/schedstat`) before it charges a wait that spans a pause
//!   ([`SwitchGate::paused_since`]). So a wait longer than the drain that ends in a pause is
//!   lost, never charged with time the thread ran;
//! - and the waits that are kept stand for the lost ones: each second is a slot ([`Slot`])
//!   whose walk window starts at an offset drawn uniformly over the second and is taken
//!   around its end, so the chance that a wait which began in a walk window ends while the
//!   program is attached is known from its start, its end and the slots' log; a kept wait's
//!   time is divided by that chance ([`SwitchGate::end_weight`], Horvitz-Thompson), so long
//!   waits are not under-counted (only noisier). Taken around the end, the window leaves no
//!   instant of a slot with a small chance of being attached: a wait that ends in a later
//!   slot weighs `span / (window + drain)`, about `n`, wherever it ends. (Drawn within the
//!   second instead, the first instants of a slot were attached only when the offset fell
//!   right at its start, and the rare wait seen to end there weighed up to a thousand: a
//!   single one moved a storm's total by 9 %.)
//!
//! The link is this module's own (`BPF_RAW_TRACEPOINT_OPEN` on the program's descriptor):
//! closing it detaches the program, from whichever thread holds the gate.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// `BPF_RAW_TRACEPOINT_OPEN`: attaches a BTF tracepoint program (its attach point comes from
/// its load; the name is NULL) and answers a link descriptor.
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;

/// `union bpf_attr`'s `raw_tracepoint` part.
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

#[derive(Debug)]
struct Link {
    /// The attachment, while attached.
    link: Option<OwnedFd>,
    /// Closed for good (`retire`): never attached again.
    retired: bool,
}

/// The scheduler-switch program's attachment; see the module docs. Shared by the session
/// (which attaches it first and retires it at the end) and the budget's thread (which pauses
/// it).
#[derive(Debug)]
pub struct SwitchGate {
    program: OwnedFd,
    link: Mutex<Link>,
    /// The end of the latest pause (kernel monotonic clock), `u64::MAX` during one, 0 if none
    /// yet.
    last_pause_end_ns: AtomicU64,
    /// Time spent paused, nanoseconds (pauses ended).
    paused_ns: AtomicU64,
    /// When the current pause began (0: none).
    pause_began_ns: AtomicU64,
    /// Pauses begun.
    pauses: AtomicU64,
    /// The latest slots, oldest first (at most [`SLOTS_KEPT`]).
    slots: Mutex<std::collections::VecDeque<Slot>>,
    /// The latest pauses, for [`SwitchGate::paused_within`].
    pause_log: Mutex<PauseLog>,
}

/// Pauses kept: an hour of one a second. A query older than the log is answered "paused"
/// (not known).
const PAUSES_KEPT: usize = 3600;

/// The latest pauses, oldest first, as (began, ended) in kernel monotonic ns (`u64::MAX`:
/// under way). `began` is read before the program is detached and `ended` after it is
/// attached again, so each holds the whole pause.
#[derive(Debug, Default)]
struct PauseLog {
    pauses: std::collections::VecDeque<(u64, u64)>,
    /// The end of the latest pause no longer kept (0: none was dropped).
    forgotten_until: u64,
}

impl PauseLog {
    fn began(&mut self, at: u64) {
        if self.pauses.len() >= PAUSES_KEPT {
            if let Some((_, ended)) = self.pauses.pop_front() {
                self.forgotten_until = ended;
            }
        }
        self.pauses.push_back((at, u64::MAX));
    }

    fn ended(&mut self, at: u64) {
        if let Some(last) = self.pauses.back_mut() {
            last.1 = at;
        }
    }

    /// See [`SwitchGate::paused_within`].
    fn within(&self, a: u64, b: u64) -> bool {
        self.forgotten_until >= a.max(1) || self.pauses.iter().any(|&(began, ended)| began <= b && ended >= a)
    }
}

/// Slots kept: a wait's end weight needs only the slot of its end, and of its start when it
/// is the same, so a few seconds would do; a minute leaves room for a slow reader.
const SLOTS_KEPT: usize = 64;

/// One slot of the budget's schedule (a second, `span_ns`): with `slices` above 1 the
/// program is attached for `window_ns + drain_ns` from an offset `o` drawn uniformly in
/// `[0, span)`, taken around the slot's end (past it, the attached part continues at the
/// slot's start): it walks switch-outs for `window_ns`, drains for `drain_ns` (still
/// attached, walking none), and is detached for the rest. Around the end, every instant of
/// the slot is attached with the same chance, `(window + drain) / span`, so no wait's end has
/// a tiny one. With `slices` 1 it is attached all along.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slot {
    /// Kernel monotonic clock.
    pub start_ns: u64,
    pub span_ns: u64,
    pub slices: u32,
    pub window_ns: u64,
    pub drain_ns: u64,
}

impl Slot {
    fn contains(&self, t: u64) -> bool {
        t >= self.start_ns && t - self.start_ns < self.span_ns
    }
}

/// The length of `[a0, a1) ∩ [b0, b1]`.
fn overlap(a: (f64, f64), b: (f64, f64)) -> f64 {
    (a.1.min(b.1) - a.0.max(b.0)).max(0.0)
}

/// The chance that a wait from `s` to `e` (kernel monotonic ns) whose start was walked ended
/// while the program was attached, given the slots of its start (`start`, when it is the
/// slot of its end) and of its end (`end`): see the module docs. `None` when the design gives
/// it no chance (the schedule's own timing slipped): no weight is applied then.
fn end_chance(start: Option<&Slot>, end: &Slot, s: u64, e: u64) -> Option<f64> {
    if end.slices <= 1 {
        return Some(1.0);
    }
    let (span, w) = (end.span_ns as f64, end.window_ns as f64);
    let attached = w + end.drain_ns as f64;
    if attached >= span || w <= 0.0 {
        return Some(1.0);
    }
    let chance = match start {
        // Same slot: given that `s` was walked, `u = (s - o) mod span` is uniform on
        // `[0, w)`; `e`, `l` later, is attached when `(u + l) mod span <= attached` (as
        // `u + l < 2 span`: `u + l` in `[0, attached]` or in `[span, span + attached]`).
        Some(slot) if slot == end => {
            let l = e.saturating_sub(s) as f64;
            (overlap((0.0, w), (-l, attached - l)) + overlap((0.0, w), (span - l, span + attached - l))) / w
        }
        // Another slot: its offset is drawn anew, and every instant is attached alike.
        _ => attached / span,
    };
    (chance > 0.0).then_some(chance)
}

/// The most a wait's time is multiplied by (a wait that ended right at a slot's edge has a
/// small chance; the cap bounds the noise it adds).
const MAX_END_WEIGHT: f64 = 1000.0;

impl SwitchGate {
    /// A gate over the program behind `program` (a descriptor of its own), not attached.
    pub fn new(program: OwnedFd) -> Self {
        SwitchGate {
            program,
            link: Mutex::new(Link { link: None, retired: false }),
            last_pause_end_ns: AtomicU64::new(0),
            paused_ns: AtomicU64::new(0),
            pause_began_ns: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            slots: Mutex::new(std::collections::VecDeque::new()),
            pause_log: Mutex::new(PauseLog::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Attaches the program (nothing if attached, or retired). The end of a pause.
    pub fn open(&self) -> std::io::Result<()> {
        let mut link = self.lock();
        if link.retired || link.link.is_some() {
            return Ok(());
        }
        let attr = RawTracepointAttr { prog_fd: self.program.as_raw_fd() as u32, ..Default::default() };
        // SAFETY: bpf(2) reads `size` bytes of `attr`, a live, initialised struct of that size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_RAW_TRACEPOINT_OPEN,
                &attr as *const RawTracepointAttr,
                std::mem::size_of::<RawTracepointAttr>() as u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor, owned by nobody else.
        link.link = Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        let began = self.pause_began_ns.swap(0, Ordering::Relaxed);
        let now = crate::kernel::clock::monotonic_ns();
        if began != 0 {
            self.log().ended(now);
            self.paused_ns.fetch_add(now.saturating_sub(began), Ordering::Relaxed);
            self.last_pause_end_ns.store(now, Ordering::Release);
        }
        Ok(())
    }

    /// Detaches the program (nothing if detached): a pause begins once this returns.
    pub fn close(&self) {
        let mut link = self.lock();
        let before = crate::kernel::clock::monotonic_ns();
        if link.link.take().is_some() && !link.retired {
            self.log().began(before);
            // Marked paused before anyone can read a pending interval begun before it.
            self.last_pause_end_ns.store(u64::MAX, Ordering::Release);
            self.pause_began_ns.store(crate::kernel::clock::monotonic_ns(), Ordering::Relaxed);
            self.pauses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Detaches the program for good (the end of sampling).
    pub fn retire(&self) {
        let mut link = self.lock();
        link.retired = true;
        link.link.take();
    }

    /// Whether the program may have missed a switch since `since_ns` (kernel monotonic
    /// clock): a pause ended after it, or one is under way.
    pub fn paused_since(&self, since_ns: u64) -> bool {
        self.last_pause_end_ns.load(Ordering::Acquire) >= since_ns.max(1)
    }

    /// Whether the program was detached at any time from `a` to `b` (kernel monotonic ns), or
    /// may have been (the log no longer reaches back to `a`).
    pub fn paused_within(&self, a: u64, b: u64) -> bool {
        self.log().within(a, b)
    }

    fn log(&self) -> std::sync::MutexGuard<'_, PauseLog> {
        self.pause_log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes the slot that begins (the budget's thread, at each second).
    pub fn begin_slot(&self, slot: Slot) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() >= SLOTS_KEPT {
            slots.pop_front();
        }
        slots.push_back(slot);
    }

    /// What the time of a wait from `s` to `e` (kernel monotonic ns), whose switch-out was
    /// walked and whose switch-in was seen, is multiplied by: 1 ÷ the chance that it ended
    /// while the program was attached (1 when no pause could have hidden its end).
    pub fn end_weight(&self, s: u64, e: u64) -> f64 {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Some(end) = slots.iter().rev().find(|slot| slot.contains(e)) else { return 1.0 };
        let start = slots.iter().rev().find(|slot| slot.contains(s));
        match end_chance(start, end, s, e) {
            Some(chance) => (1.0 / chance).min(MAX_END_WEIGHT),
            None => 1.0,
        }
    }

    /// Pauses begun, and the time spent paused up to `now_ns`.
    pub fn pauses(&self, now_ns: u64) -> (u64, u64) {
        let began = self.pause_began_ns.load(Ordering::Relaxed);
        let ongoing = if began != 0 { now_ns.saturating_sub(began) } else { 0 };
        (self.pauses.load(Ordering::Relaxed), self.paused_ns.load(Ordering::Relaxed) + ongoing)
    }
}

/// Thread `tid` of `pid`'s arrivals on a CPU (`sched_info.pcount`, from
/// `/proc/PID/task/TID/schedstat`), `None` when it cannot be read (the thread is gone).
pub fn thread_arrivals(pid: u32, tid: u32) -> Option<u64> {
    crate::target::memory::deadline::task_arrivals(&pid.to_string(), tid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_within_a_span() {
        let mut log = PauseLog::default();
        assert!(!log.within(5, 10));
        log.began(20);
        assert!(log.within(5, 25), "under way");
        assert!(log.within(30, 40), "under way, after its start");
        assert!(!log.within(5, 19));
        log.ended(30);
        assert!(log.within(30, 40) && log.within(25, 26) && log.within(0, 20));
        assert!(!log.within(31, 40) && !log.within(5, 19));
        // Older than the log: not known, so paused.
        for t in 0..PAUSES_KEPT as u64 {
            log.began(100 + 10 * t);
            log.ended(105 + 10 * t);
        }
        assert!(log.within(21, 22), "the first pause was forgotten");
        assert!(!log.within(106 + 10 * (PAUSES_KEPT as u64 - 1), u64::MAX - 1));
    }

    const MS: u64 = 1_000_000;

    fn slot(start_ns: u64, slices: u32) -> Slot {
        Slot { start_ns, span_ns: 1000 * MS, slices, window_ns: 1000 * MS / slices as u64, drain_ns: 20 * MS }
    }

    /// The end weight is 1 ÷ the chance, over the drawn offsets, that a wait whose start was
    /// walked ends attached; checked against a simulation of the draw (offsets uniform over
    /// the slot, the attached part taken around its end).
    #[test]
    fn end_weight_matches_the_schedule() {
        let gate = SwitchGate::new(std::fs::File::open("/dev/null").expect("null").into());
        // Unknown slots, or a slot attached all along: no weight.
        assert_eq!(gate.end_weight(5, 10), 1.0);
        gate.begin_slot(slot(0, 1));
        gate.begin_slot(slot(1000 * MS, 5));
        gate.begin_slot(slot(2000 * MS, 5));
        assert_eq!(gate.end_weight(10 * MS, 900 * MS), 1.0, "ends in a slot attached all along");
        // Shorter than the drain, same slot: always ends attached.
        assert!((gate.end_weight(1400 * MS, 1415 * MS) - 1.0).abs() < 1e-9);
        // Ends in another slot, wherever in it: span / (w + drain) = 1000 / 220.
        for end in [2001, 2500, 2999] {
            let w = gate.end_weight(1400 * MS, end * MS);
            assert!((w - 1000.0 / 220.0).abs() < 1e-6, "{end}: {w}");
        }
        // Same-slot waits, simulated: (start, end) in ms of the slot; the last two start in
        // the part taken around the end, and the last one ends in it again.
        let simulate = |s1: f64, e1: f64| {
            let attached_at = |o: f64, t: f64, len: f64| (t - o).rem_euclid(1000.0) < len;
            let (mut walked, mut kept) = (0u64, 0u64);
            for i in 0..100_000u64 {
                let o = i as f64 / 100.0; // uniform over [0, 1000)
                if attached_at(o, s1, 200.0) {
                    walked += 1;
                    if attached_at(o, e1, 220.0) {
                        kept += 1;
                    }
                }
            }
            walked as f64 / kept as f64
        };
        for (s1, e1) in [(400u64, 550u64), (400, 610), (30, 150), (10, 995)] {
            let simulated = simulate(s1 as f64, e1 as f64);
            let w = gate.end_weight((1000 + s1) * MS, (1000 + e1) * MS);
            assert!((w - simulated).abs() / simulated < 0.01, "({s1}, {e1}): {w} vs {simulated}");
        }
        // A wait that could not have been seen to end by the design: no weight, not infinity.
        assert_eq!(gate.end_weight(1100 * MS, 1500 * MS), 1.0);
    }

    /// A pause is seen by every wait that began before its end, not by later ones.
    #[test]
    fn pauses_are_seen_by_waits_they_overlap() {
        let fd: OwnedFd = std::fs::File::open("/dev/null").expect("null").into();
        let gate = SwitchGate::new(fd);
        assert!(!gate.paused_since(1), "never paused");
        // Not attached: close does nothing.
        gate.close();
        assert_eq!(gate.pauses(0).0, 0);
        // A pause under way, as `close` leaves it.
        gate.last_pause_end_ns.store(u64::MAX, Ordering::Release);
        assert!(gate.paused_since(u64::MAX - 1));
        gate.last_pause_end_ns.store(1_000, Ordering::Release);
        assert!(gate.paused_since(999));
        assert!(gate.paused_since(1_000));
        assert!(!gate.paused_since(1_001));
    }
}
