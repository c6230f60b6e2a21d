//! `--max-cpu PERCENT`: pyperch holds its own CPU (its threads plus its kernel programs'
//! run time, [`meter`]) under a budget, in percent of one CPU, by sampling a share of the
//! CPU-clock events: the kernel keeps one sample in a divisor at random and marks each kept
//! sample with it (`sample_flags::WEIGHT_SHIFT`), and the session counts that sample as that
//! many ([`crate::sample::Charge`]), so profiles keep their values at the requested rate,
//! unbiased, only noisier. In the off-CPU modes (`wall`, `off-cpu`) the same divisor sets
//! the share of context switches walked: the kernel walks one switch-out of a profiled thread
//! in that many and marks its interval with it, and the session charges the interval's time
//! that many times (its short time comes weighted already). The divisor is chosen each second by the [`controller`] (with
//! hysteresis, never below the 1 Hz floor), on a thread of its own ("pyperch-budget"): its
//! reads never block and it is neither the drain thread nor the worker, so a worker
//! falling behind is measured, not waited for.
//!
//! In the off-CPU modes the scheduler-switch program's call on every context switch is a
//! fixed cost the divisor does not lower; past `controller::PAUSE_FROM_DIVISOR` the
//! controller pauses the program instead (attached one time slice in `n` of each second, at a
//! random offset, with a drain before each pause: `kernel::switch_gate`), and a walked
//! switch-out weighs `n` times more.
//!
//! What is measured and chosen is kept in [`BudgetState`] for `--stats` and the profiles'
//! metadata (the effective rate: min, time-weighted mean, last; in the off-CPU modes the
//! share of context switches walked: last, time-weighted mean).

pub(crate) mod controller;
pub(crate) mod meter;

use std::{
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::kernel::loader::SampleShare;
use crate::kernel::switch_gate::SwitchGate;

/// How long the scheduler-switch program drains before a pause: it walks no new switch-out,
/// and waits shorter than this that began in its slice end before it.
pub(crate) const DRAIN: Duration = Duration::from_millis(20);

/// How often pyperch's CPU is measured and the share chosen.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// What the scheduler-switch program does in a part of a slot (see `Prepared::tick`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Detached: sees nothing.
    Detached,
    /// Attached, walking its share of switch-outs.
    Walk,
    /// Attached, ending waits, walking none (before a pause).
    Drain,
}

pub use crate::sample::aggregate::{BudgetFacts, RateSummary, SwitchShare};

/// Time-weighted effective rates and shares.
#[derive(Clone, Copy, Debug, Default)]
struct RateAccumulator {
    seconds: f64,
    hz_seconds: f64,
    /// The share kept (1 ÷ divisor) times the seconds it was in force.
    share_seconds: f64,
    min_hz: Option<f64>,
    last_hz: Option<f64>,
}

impl RateAccumulator {
    /// `seconds` at effective rate `hz`, with one context switch in `divisor` walked.
    fn add(&mut self, hz: f64, divisor: u32, seconds: f64) {
        self.seconds += seconds;
        self.hz_seconds += hz * seconds;
        self.share_seconds += seconds / divisor.max(1) as f64;
        self.min_hz = Some(self.min_hz.map_or(hz, |m| m.min(hz)));
        self.last_hz = Some(hz);
    }

    /// The summary; `now_hz` (the rate in force) when nothing was accrued yet.
    fn summary(&self, now_hz: f64) -> RateSummary {
        if self.seconds <= 0.0 {
            return RateSummary { min_hz: now_hz, mean_hz: now_hz, last_hz: now_hz };
        }
        RateSummary {
            min_hz: self.min_hz.unwrap_or(now_hz).min(now_hz),
            mean_hz: self.hz_seconds / self.seconds,
            last_hz: now_hz,
        }
    }

    /// The share of context switches walked; the divisor in force now (`now_divisor`)
    /// gives it when nothing was accrued yet.
    fn switch_share(&self, now_divisor: u32) -> SwitchShare {
        let now_divisor = now_divisor.max(1);
        let mean_share = if self.seconds <= 0.0 { 1.0 / now_divisor as f64 } else { self.share_seconds / self.seconds };
        SwitchShare { last_one_in: now_divisor, mean_share }
    }
}

/// What the budget's thread measured and chose; shared with the session.
#[derive(Clone, Debug)]
pub struct BudgetState {
    /// `--max-cpu`, percent of one CPU.
    pub budget_percent: f64,
    pub rate_hz: u64,
    /// Whether the kernel programs' run time is measured (BPF statistics on).
    pub bpf_measured: bool,
    /// Whether context switches are walked (`--mode wall`/`off-cpu`): the divisor then sets
    /// their share too, and the facts and `--stats` say it.
    pub switches: bool,
    /// Measured time and pyperch's CPU in it (threads, kernel programs), nanoseconds.
    pub wall_ns: u64,
    pub threads_ns: u64,
    pub bpf_ns: u64,
    /// The highest one second measured, percent of one CPU.
    pub peak_percent: f64,
    /// The divisor in force and how often it changed.
    pub divisor: u32,
    /// The scheduler-switch program's time slices in force (1: always attached).
    pub slices: u32,
    pub changes: u32,
    /// Failed writes of the kernel's share (the divisor then stays what it was).
    pub write_errors: u32,
    whole: RateAccumulator,
    interval: RateAccumulator,
}

impl BudgetState {
    fn new(budget_percent: f64, rate_hz: u64, bpf_measured: bool, switches: bool) -> Self {
        BudgetState {
            budget_percent,
            rate_hz,
            bpf_measured,
            switches,
            wall_ns: 0,
            threads_ns: 0,
            bpf_ns: 0,
            peak_percent: 0.0,
            divisor: 1,
            slices: 1,
            changes: 0,
            write_errors: 0,
            whole: RateAccumulator::default(),
            interval: RateAccumulator::default(),
        }
    }

    fn hz(&self, divisor: u32) -> f64 {
        self.rate_hz as f64 / divisor.max(1) as f64
    }

    /// Accounts one measured span: `divisor` and `slices` were in force during it.
    fn account(&mut self, wall_ns: u64, threads_ns: u64, bpf_ns: u64, divisor: u32, slices: u32) {
        self.wall_ns += wall_ns;
        self.threads_ns += threads_ns;
        self.bpf_ns += bpf_ns;
        if wall_ns > 0 {
            let percent = (threads_ns + bpf_ns) as f64 * 100.0 / wall_ns as f64;
            // Only whole ticks count for the peak (a short last span is noisy).
            if wall_ns * 2 >= TICK.as_nanos() as u64 {
                self.peak_percent = self.peak_percent.max(percent);
            }
        }
        let (hz, seconds) = (self.hz(divisor), wall_ns as f64 / 1e9);
        self.whole.add(hz, switch_divisor(divisor, slices), seconds);
        self.interval.add(hz, switch_divisor(divisor, slices), seconds);
    }

    /// One context switch in this many is walked now.
    fn switch_divisor(&self) -> u32 {
        switch_divisor(self.divisor, self.slices)
    }

    /// pyperch's mean CPU over the measured time, percent of one CPU.
    pub fn mean_percent(&self) -> f64 {
        if self.wall_ns == 0 { 0.0 } else { (self.threads_ns + self.bpf_ns) as f64 * 100.0 / self.wall_ns as f64 }
    }

    /// The effective rate over the whole run.
    pub fn rate(&self) -> RateSummary {
        self.whole.summary(self.hz(self.divisor))
    }

    /// The share of context switches walked over the whole run (`None` outside the off-CPU
    /// modes).
    pub fn switch_share(&self) -> Option<SwitchShare> {
        self.switches.then(|| self.whole.switch_share(self.switch_divisor()))
    }

    /// The facts since the last call (the agent's interval), and a fresh start.
    pub fn take_interval(&mut self) -> BudgetFacts {
        let facts = BudgetFacts {
            max_cpu_percent: self.budget_percent,
            rate: self.interval.summary(self.hz(self.divisor)),
            switches: self.switches.then(|| self.interval.switch_share(self.switch_divisor())),
        };
        self.interval = RateAccumulator::default();
        facts
    }

    /// The whole run's facts for a profile.
    pub fn facts(&self) -> BudgetFacts {
        BudgetFacts { max_cpu_percent: self.budget_percent, rate: self.rate(), switches: self.switch_share() }
    }

    /// `--stats` lines (each without its indent).
    pub fn report(&self) -> Vec<String> {
        let r = self.rate();
        let bpf = if self.bpf_measured {
            format!("{:.3} s", self.bpf_ns as f64 / 1e9)
        } else {
            "not measured (the kernel's BPF statistics could not be turned on)".to_string()
        };
        let mut lines = vec![
            format!(
                "CPU budget (--max-cpu): {}% of one CPU; pyperch used {:.2}% on average over {:.1} s (peak second {:.2}%): threads {:.3} s, kernel programs {bpf}",
                fmt_percent(self.budget_percent),
                self.mean_percent(),
                self.wall_ns as f64 / 1e9,
                self.peak_percent,
                self.threads_ns as f64 / 1e9,
            ),
            format!(
                "CPU budget: effective rate {:.1} Hz min, {:.1} Hz mean, {:.1} Hz last, of {} Hz requested (sampled share 1/{} last, {} changes{})",
                r.min_hz,
                r.mean_hz,
                r.last_hz,
                self.rate_hz,
                self.divisor,
                self.changes,
                if self.write_errors > 0 { format!(", {} failed writes", self.write_errors) } else { String::new() },
            ),
        ];
        if let Some(sw) = self.switch_share() {
            let pauses = if self.slices > 1 {
                format!("; the scheduler-switch program attached one second in {} last, its cost on every switch being over the budget", self.slices)
            } else {
                String::new()
            };
            lines.push(format!("CPU budget: context switches walked {} (the samples' share, times the program's time slices{pauses})", sw.describe()));
        }
        lines
    }
}

/// One context switch in this many is walked: the divisor times the switch program's time
/// slices.
fn switch_divisor(divisor: u32, slices: u32) -> u32 {
    divisor.max(1).saturating_mul(slices.max(1))
}

/// A percentage without needless decimals (`2`, `0.5`).
fn fmt_percent(p: f64) -> String {
    let s = format!("{p:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The budget set up before the privilege drop (the share's map, the programs' descriptors,
/// the BPF statistics turned on), its thread not started yet.
pub(crate) struct Prepared {
    controller: controller::Controller,
    share: SampleShare,
    /// The scheduler-switch program's attachment, when it may be paused.
    gate: Option<Arc<SwitchGate>>,
    /// Random offsets of the attached slices (xorshift; the profile's unbiasedness needs
    /// them independent of the workload's period, not of an adversary).
    random: u64,
    meter: meter::Meter,
    state: Arc<Mutex<BudgetState>>,
}

impl Prepared {
    /// For `budget_percent` of one CPU at `rate_hz`; needs the privileges `BPF_ENABLE_STATS`
    /// needs (call before the drop).
    /// `switches`: the off-CPU modes (context switches are walked, at the same share).
    pub(crate) fn new(
        budget_percent: f64,
        rate_hz: u64,
        switches: bool,
        mut share: SampleShare,
        programs: Vec<std::os::fd::OwnedFd>,
    ) -> Self {
        let meter = meter::Meter::new(programs, meter::enable_bpf_stats());
        let state = Arc::new(Mutex::new(BudgetState::new(budget_percent, rate_hz, meter.bpf_measured(), switches)));
        if share.set(1).is_err() {
            lock(&state).write_errors += 1;
        }
        let random = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64) | 1) ^ u64::from(std::process::id());
        Prepared { controller: controller::Controller::new(budget_percent, rate_hz), share, gate: None, random: random.max(1), meter, state }
    }

    /// Lets the budget pause the scheduler-switch program (attached already).
    pub(crate) fn set_switch_gate(&mut self, gate: Arc<SwitchGate>) {
        self.controller.allow_pauses();
        self.gate = Some(gate);
    }

    /// A random fraction in [0, 1).
    fn next_random(&mut self) -> f64 {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Waits one tick, running the scheduler-switch program's time slice if it is paused
    /// (see `kernel::switch_gate`); true when asked to stop.
    fn tick(&mut self, stopped: &mpsc::Receiver<()>) -> bool {
        let wait = |d: Duration| !matches!(stopped.recv_timeout(d), Err(mpsc::RecvTimeoutError::Timeout));
        let slices = self.controller.slices();
        let Some(gate) = self.gate.clone() else { return wait(TICK) };
        let span_ns = TICK.as_nanos() as u64;
        gate.begin_slot(crate::kernel::switch_gate::Slot {
            start_ns: crate::kernel::loader::monotonic_ns(),
            span_ns,
            slices: slices.max(1),
            window_ns: span_ns / u64::from(slices.max(1)),
            drain_ns: DRAIN.as_nanos() as u64,
        });
        if slices <= 1 {
            let _ = self.share.set_switch_slices(1);
            if let Err(e) = gate.open() {
                log::warn!("CPU budget: could not attach the scheduler-switch program again: {e}");
            }
            return wait(TICK);
        }
        // The attached part, `window + DRAIN` from a uniform offset, taken around the slot's
        // end (`Slot`); the phases in time order. Each sets the program's state at its start
        // (so a slot that begins detached detaches, even after one attached all along).
        let window = TICK / slices;
        let offset = TICK.mul_f64(self.next_random());
        let phases = if offset + window + DRAIN <= TICK {
            [(Phase::Detached, offset), (Phase::Walk, window), (Phase::Drain, DRAIN), (Phase::Detached, TICK - offset - window - DRAIN)]
        } else {
            let head = offset + window + DRAIN - TICK;
            let walk_head = (offset + window).saturating_sub(TICK);
            [(Phase::Walk, walk_head), (Phase::Drain, head - walk_head), (Phase::Detached, offset - head), (Phase::Walk, TICK - offset)]
        };
        for (phase, length) in phases {
            if length.is_zero() {
                continue;
            }
            match phase {
                Phase::Detached => gate.close(),
                Phase::Walk | Phase::Drain => {
                    // The weight first, so that the first walks weigh right.
                    let slices = if phase == Phase::Walk { slices } else { profiler_common::share_slot::DRAINING };
                    let _ = self.share.set_switch_slices(slices);
                    if let Err(e) = gate.open() {
                        log::warn!("CPU budget: could not attach the scheduler-switch program again: {e}");
                    }
                }
            }
            if wait(length) {
                return true;
            }
        }
        false
    }

    /// What is measured and chosen, readable while the thread runs.
    pub(crate) fn state(&self) -> Arc<Mutex<BudgetState>> {
        self.state.clone()
    }

    /// Starts the budget's thread (after the privilege drop).
    pub(crate) fn start(self) -> std::io::Result<Running> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("pyperch-budget".into()).spawn(move || self.run(&stopped))?;
        Ok(Running { stop: Some(stop), thread: Some(thread) })
    }

    fn run(mut self, stopped: &mpsc::Receiver<()>) {
        let mut last = self.meter.read();
        let mut at = Instant::now();
        loop {
            let slices = self.controller.slices();
            let stop = self.tick(stopped);
            let (now, reading) = (Instant::now(), self.meter.read());
            let wall_ns = u64::try_from(now.duration_since(at).as_nanos()).unwrap_or(u64::MAX);
            let threads_ns = reading.threads_ns.saturating_sub(last.threads_ns);
            let bpf_ns = reading.bpf_ns.saturating_sub(last.bpf_ns);
            (last, at) = (reading, now);
            let in_force = self.controller.divisor();
            lock(&self.state).account(wall_ns, threads_ns, bpf_ns, in_force, slices);
            if stop {
                return;
            }
            if wall_ns == 0 {
                continue;
            }
            let percent = (threads_ns + bpf_ns) as f64 * 100.0 / wall_ns as f64;
            let next = self.controller.step(percent);
            let next_slices = self.controller.slices();
            if next_slices != slices {
                let mut state = lock(&self.state);
                state.slices = next_slices;
                state.changes += 1;
                log::debug!("CPU budget: {percent:.2}% measured, scheduler-switch program attached one second in {next_slices}");
            }
            if next != in_force {
                let written = self.share.set(next);
                let mut state = lock(&self.state);
                match written {
                    Ok(()) => {
                        state.divisor = next;
                        state.changes += 1;
                        log::debug!("CPU budget: {percent:.2}% measured, sampled share now 1/{next}");
                    }
                    Err(e) => {
                        state.write_errors += 1;
                        log::warn!("CPU budget: could not set the sampled share: {e}");
                    }
                }
            }
        }
    }
}

/// The budget's thread, running; stopped (and its last span accounted) by [`Running::stop`]
/// or on drop.
pub(crate) struct Running {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Stops the thread; its last span is accounted before this returns.
    pub(crate) fn stop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A session's budget: none, prepared (before the privilege drop), then running (during the
/// loop), then stopped with its state kept for `--stats` and the profile.
#[derive(Default)]
pub(crate) struct SessionBudget {
    prepared: Option<Prepared>,
    running: Option<Running>,
    state: Option<Arc<Mutex<BudgetState>>>,
}

impl SessionBudget {
    pub(crate) fn prepare(&mut self, prepared: Prepared) {
        self.state = Some(prepared.state());
        self.prepared = Some(prepared);
    }

    /// Lets the prepared budget pause the scheduler-switch program.
    pub(crate) fn set_switch_gate(&mut self, gate: Arc<SwitchGate>) {
        if let Some(p) = &mut self.prepared {
            p.set_switch_gate(gate);
        }
    }

    /// Starts the prepared budget's thread (the loop's start, after the privilege drop).
    pub(crate) fn start(&mut self) -> std::io::Result<()> {
        if let Some(p) = self.prepared.take() {
            self.running = Some(p.start()?);
        }
        Ok(())
    }

    /// Stops the thread (before sampling stops: the programs' descriptors are its own).
    pub(crate) fn stop(&mut self) {
        if let Some(mut r) = self.running.take() {
            r.stop();
        }
    }

    /// A copy of what was measured and chosen, if there is a budget.
    pub(crate) fn state(&self) -> Option<BudgetState> {
        self.state.as_ref().map(|s| lock(s).clone())
    }

    /// The whole run's facts for a profile, if there is a budget.
    pub(crate) fn facts(&self) -> Option<BudgetFacts> {
        self.state.as_ref().map(|s| lock(s).facts())
    }

    /// The facts of the agent's interval since the last call, if there is a budget.
    pub(crate) fn take_interval(&self) -> Option<BudgetFacts> {
        self.state.as_ref().map(|s| lock(s).take_interval())
    }
}

/// The state, even if a thread panicked holding it.
pub(crate) fn lock(state: &Mutex<BudgetState>) -> std::sync::MutexGuard<'_, BudgetState> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Checks `--max-cpu`: a percentage of one CPU above 0 (several CPUs: above 100).
pub(crate) fn parse_max_cpu(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().trim_end_matches('%').parse().map_err(|_| format!("'{s}' is not a percentage (for example 2 or 0.5)"))?;
    if !v.is_finite() || v <= 0.0 || v > 100_000.0 {
        return Err(format!("'{s}' is out of range: give a percentage of one CPU above 0, for example 2"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_rate_is_time_weighted() {
        let mut s = BudgetState::new(2.0, 1000, true, false);
        s.account(1_000_000_000, 1, 0, 1, 1);
        s.account(3_000_000_000, 1, 0, 4, 1);
        s.divisor = 4;
        let r = s.rate();
        assert_eq!(r.min_hz, 250.0);
        assert_eq!(r.last_hz, 250.0);
        assert!((r.mean_hz - (1000.0 + 3.0 * 250.0) / 4.0).abs() < 1e-9);
        // The agent's interval starts afresh.
        assert_eq!(s.take_interval().rate.mean_hz, r.mean_hz);
        s.account(1_000_000_000, 1, 0, 4, 1);
        assert_eq!(s.take_interval().rate, RateSummary { min_hz: 250.0, mean_hz: 250.0, last_hz: 250.0 });
        // CPU mode: no share of context switches is stated.
        assert_eq!(s.facts().switches, None);
        assert!(!s.report().iter().any(|l| l.contains("context switches")));
    }

    /// In the off-CPU modes the same divisor is the share of context switches walked: its
    /// mean is weighted by time (1 s of every switch, 3 s of one in 4: 7/16), the last is
    /// the divisor in force, and the agent's interval starts afresh.
    #[test]
    fn switch_share_is_time_weighted() {
        let mut s = BudgetState::new(2.0, 99, true, true);
        assert_eq!(s.facts().switches, Some(SwitchShare { last_one_in: 1, mean_share: 1.0 }), "nothing measured yet");
        s.account(1_000_000_000, 1, 0, 1, 1);
        s.account(3_000_000_000, 1, 0, 4, 1);
        s.divisor = 4;
        let sw = s.facts().switches.expect("off-CPU mode");
        assert_eq!(sw.last_one_in, 4);
        assert!((sw.mean_share - 7.0 / 16.0).abs() < 1e-12, "{sw:?}");
        let lines = s.report();
        assert!(lines.iter().any(|l| l.contains("context switches walked 1 in 4 last, mean share 43.75%")), "{lines:?}");
        assert_eq!(s.take_interval().switches, Some(sw));
        s.account(2_000_000_000, 1, 0, 4, 1);
        let interval = s.take_interval().switches.expect("off-CPU mode");
        assert!((interval.mean_share - 0.25).abs() < 1e-12, "{interval:?}");
        // The divisor 0 the kernel reads as 1 is never a division by zero.
        let mut z = BudgetState::new(2.0, 99, true, true);
        z.account(1_000_000_000, 1, 0, 0, 1);
        z.divisor = 0;
        assert_eq!(z.facts().switches, Some(SwitchShare { last_one_in: 1, mean_share: 1.0 }));
    }

    #[test]
    fn cpu_is_threads_plus_kernel_programs() {
        let mut s = BudgetState::new(2.0, 99, true, false);
        s.account(2_000_000_000, 30_000_000, 10_000_000, 1, 1);
        assert!((s.mean_percent() - 2.0).abs() < 1e-9);
        assert!((s.peak_percent - 2.0).abs() < 1e-9);
        let lines = s.report();
        assert!(lines[0].contains("2% of one CPU"), "{lines:?}");
        assert!(lines[0].contains("threads 0.030 s, kernel programs 0.010 s"), "{lines:?}");
        assert!(lines[1].contains("99.0 Hz min, 99.0 Hz mean, 99.0 Hz last, of 99 Hz"), "{lines:?}");
    }

    /// A kept sample carries its divisor above the GC bit; records without one weigh 1.
    #[test]
    fn sample_weight_from_flags() {
        use profiler_common::sample_flags::{GC, WEIGHT_SHIFT, weight};
        assert_eq!(weight(0), 1);
        assert_eq!(weight(GC), 1);
        assert_eq!(weight(GC | (8 << WEIGHT_SHIFT)), 8);
        assert_eq!(weight(100_000 << WEIGHT_SHIFT), 100_000);
    }

    #[test]
    fn max_cpu_is_checked() {
        assert_eq!(parse_max_cpu("2"), Ok(2.0));
        assert_eq!(parse_max_cpu("0.5%"), Ok(0.5));
        assert!(parse_max_cpu("0").is_err());
        assert!(parse_max_cpu("-1").is_err());
        assert!(parse_max_cpu("nan").is_err());
        assert!(parse_max_cpu("two").is_err());
    }
}
