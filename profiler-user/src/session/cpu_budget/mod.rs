//! `--max-cpu PERCENT`: pyperch holds its own CPU (its threads plus its kernel programs'
//! run time, [`meter`]) under a budget, in percent of one CPU, by sampling a share of the
//! CPU-clock events: the kernel keeps one sample in a divisor at random and marks each kept
//! sample with it (`sample_flags::WEIGHT_SHIFT`), and the session counts that sample as that
//! many ([`crate::sample::Charge`]), so profiles keep their values at the requested rate,
//! unbiased, only noisier. The divisor is chosen each second by the [`controller`] (with
//! hysteresis, never below the 1 Hz floor), on a thread of its own ("pyperch-budget"): its
//! reads never block and it is neither the drain thread nor the worker, so a worker
//! falling behind is measured, not waited for.
//!
//! What is measured and chosen is kept in [`BudgetState`] for `--stats` and the profiles'
//! metadata (the effective rate: min, time-weighted mean, last).

pub(crate) mod controller;
pub(crate) mod meter;

use std::{
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::kernel::loader::SampleShare;

/// How often pyperch's CPU is measured and the share chosen.
pub(crate) const TICK: Duration = Duration::from_secs(1);

pub use crate::sample::aggregate::{BudgetFacts, RateSummary};

/// Time-weighted effective rates.
#[derive(Clone, Copy, Debug, Default)]
struct RateAccumulator {
    seconds: f64,
    hz_seconds: f64,
    min_hz: Option<f64>,
    last_hz: Option<f64>,
}

impl RateAccumulator {
    fn add(&mut self, hz: f64, seconds: f64) {
        self.seconds += seconds;
        self.hz_seconds += hz * seconds;
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
}

/// What the budget's thread measured and chose; shared with the session.
#[derive(Clone, Debug)]
pub struct BudgetState {
    /// `--max-cpu`, percent of one CPU.
    pub budget_percent: f64,
    pub rate_hz: u64,
    /// Whether the kernel programs' run time is measured (BPF statistics on).
    pub bpf_measured: bool,
    /// Measured time and pyperch's CPU in it (threads, kernel programs), nanoseconds.
    pub wall_ns: u64,
    pub threads_ns: u64,
    pub bpf_ns: u64,
    /// The highest one second measured, percent of one CPU.
    pub peak_percent: f64,
    /// The divisor in force and how often it changed.
    pub divisor: u32,
    pub changes: u32,
    /// Failed writes of the kernel's share (the divisor then stays what it was).
    pub write_errors: u32,
    whole: RateAccumulator,
    interval: RateAccumulator,
}

impl BudgetState {
    fn new(budget_percent: f64, rate_hz: u64, bpf_measured: bool) -> Self {
        BudgetState {
            budget_percent,
            rate_hz,
            bpf_measured,
            wall_ns: 0,
            threads_ns: 0,
            bpf_ns: 0,
            peak_percent: 0.0,
            divisor: 1,
            changes: 0,
            write_errors: 0,
            whole: RateAccumulator::default(),
            interval: RateAccumulator::default(),
        }
    }

    fn hz(&self, divisor: u32) -> f64 {
        self.rate_hz as f64 / divisor.max(1) as f64
    }

    /// Accounts one measured span: `divisor` was in force during it.
    fn account(&mut self, wall_ns: u64, threads_ns: u64, bpf_ns: u64, divisor: u32) {
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
        self.whole.add(hz, seconds);
        self.interval.add(hz, seconds);
    }

    /// pyperch's mean CPU over the measured time, percent of one CPU.
    pub fn mean_percent(&self) -> f64 {
        if self.wall_ns == 0 { 0.0 } else { (self.threads_ns + self.bpf_ns) as f64 * 100.0 / self.wall_ns as f64 }
    }

    /// The effective rate over the whole run.
    pub fn rate(&self) -> RateSummary {
        self.whole.summary(self.hz(self.divisor))
    }

    /// The effective rate since the last call (the agent's interval), and a fresh start.
    pub fn take_interval(&mut self) -> RateSummary {
        let summary = self.interval.summary(self.hz(self.divisor));
        self.interval = RateAccumulator::default();
        summary
    }

    /// The whole run's facts for a profile.
    pub fn facts(&self) -> BudgetFacts {
        BudgetFacts { max_cpu_percent: self.budget_percent, rate: self.rate() }
    }

    /// `--stats` lines (each without its indent).
    pub fn report(&self) -> Vec<String> {
        let r = self.rate();
        let bpf = if self.bpf_measured {
            format!("{:.3} s", self.bpf_ns as f64 / 1e9)
        } else {
            "not measured (the kernel's BPF statistics could not be turned on)".to_string()
        };
        vec![
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
        ]
    }
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
    meter: meter::Meter,
    state: Arc<Mutex<BudgetState>>,
}

impl Prepared {
    /// For `budget_percent` of one CPU at `rate_hz`; needs the privileges `BPF_ENABLE_STATS`
    /// needs (call before the drop).
    pub(crate) fn new(
        budget_percent: f64,
        rate_hz: u64,
        mut share: SampleShare,
        programs: Vec<std::os::fd::OwnedFd>,
    ) -> Self {
        let meter = meter::Meter::new(programs, meter::enable_bpf_stats());
        let state = Arc::new(Mutex::new(BudgetState::new(budget_percent, rate_hz, meter.bpf_measured())));
        if share.set(1).is_err() {
            lock(&state).write_errors += 1;
        }
        Prepared { controller: controller::Controller::new(budget_percent, rate_hz), share, meter, state }
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
            let stop = !matches!(stopped.recv_timeout(TICK), Err(mpsc::RecvTimeoutError::Timeout));
            let (now, reading) = (Instant::now(), self.meter.read());
            let wall_ns = u64::try_from(now.duration_since(at).as_nanos()).unwrap_or(u64::MAX);
            let threads_ns = reading.threads_ns.saturating_sub(last.threads_ns);
            let bpf_ns = reading.bpf_ns.saturating_sub(last.bpf_ns);
            (last, at) = (reading, now);
            let in_force = self.controller.divisor();
            lock(&self.state).account(wall_ns, threads_ns, bpf_ns, in_force);
            if stop {
                return;
            }
            if wall_ns == 0 {
                continue;
            }
            let percent = (threads_ns + bpf_ns) as f64 * 100.0 / wall_ns as f64;
            let next = self.controller.step(percent);
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
        self.state.as_ref().map(|s| {
            let mut s = lock(s);
            BudgetFacts { max_cpu_percent: s.budget_percent, rate: s.take_interval() }
        })
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
        let mut s = BudgetState::new(2.0, 1000, true);
        s.account(1_000_000_000, 1, 0, 1);
        s.account(3_000_000_000, 1, 0, 4);
        s.divisor = 4;
        let r = s.rate();
        assert_eq!(r.min_hz, 250.0);
        assert_eq!(r.last_hz, 250.0);
        assert!((r.mean_hz - (1000.0 + 3.0 * 250.0) / 4.0).abs() < 1e-9);
        // The agent's interval starts afresh.
        assert_eq!(s.take_interval().mean_hz, r.mean_hz);
        s.account(1_000_000_000, 1, 0, 4);
        assert_eq!(s.take_interval(), RateSummary { min_hz: 250.0, mean_hz: 250.0, last_hz: 250.0 });
    }

    #[test]
    fn cpu_is_threads_plus_kernel_programs() {
        let mut s = BudgetState::new(2.0, 99, true);
        s.account(2_000_000_000, 30_000_000, 10_000_000, 1);
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
