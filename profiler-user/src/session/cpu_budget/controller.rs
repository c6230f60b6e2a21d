//! The budget's controller: from pyperch's measured CPU each second, the sampled share's
//! divisor (the kernel keeps one CPU sample in that many). Pure and deterministic: fed
//! measurements, it answers divisors (the unit tests feed it a model of the cost).
//!
//! Invariants:
//! - the divisor stays in `1..=max_divisor` (`max_divisor` = rate ÷ [`FLOOR_HZ`]: the
//!   effective rate never falls below the floor);
//! - it cuts when the smoothed cost is above the budget, aiming at [`AIM`] of it, and raises
//!   only after [`CALM_SECONDS`] seconds in a row under [`RAISE_BELOW`] of it, at most
//!   [`MAX_RAISE`]-fold, aiming at [`AIM`] too: between the two thresholds it holds still
//!   (hysteresis), so a steady load gives a steady rate;
//! - the second after a change is not used (it mixes the old share's records, still being
//!   processed, with the new one's), and smoothing restarts after it; nor are the first
//!   [`START_SECONDS`] (start-up's one-time work);
//! - in the off-CPU modes, with a pausable scheduler-switch program (`kernel::switch_gate`),
//!   a second knob: the program's time slices `n` (attached one slice in `n`, in
//!   `1..=`[`MAX_SLICES`]). The program's call on every context switch is a fixed cost no
//!   divisor lowers, so once the divisor has reached [`PAUSE_FROM_DIVISOR`] a further cut
//!   raises `n` instead, and a raise lowers `n` first: the divisor is unbiased for waits of any
//!   length, pauses lose waits longer than the drain that end in one, so pauses are the last
//!   resort and the first given back. A cut from below never takes the divisor past
//!   `PAUSE_FROM_DIVISOR` at once; and a divisor cut that lowered the cost by less than half
//!   of what a cost proportional to the share would have lost shows the cost is mostly that
//!   fixed part: the next cuts pause at once, whatever the divisor (until the load falls).

/// The effective rate's floor: the divisor never exceeds rate ÷ this.
pub(crate) const FLOOR_HZ: u64 = 1;
/// A cut or a raise aims at this fraction of the budget (assuming the cost proportional to
/// the share; a fixed part makes a cut fall short, and the next second cuts again).
pub(crate) const AIM: f64 = 0.8;
/// The share is raised only while the smoothed cost stays under this fraction of the budget...
pub(crate) const RAISE_BELOW: f64 = 0.6;
/// ... for this many measured seconds in a row.
pub(crate) const CALM_SECONDS: u32 = 3;
/// A raise at most multiplies the share by this.
pub(crate) const MAX_RAISE: f64 = 2.0;
/// Seconds not used at the start: the loop's first seconds hold the start-up's one-time work
/// (the first discovery of the host's processes and their files), not the steady cost.
pub(crate) const START_SECONDS: u32 = 2;
/// The divisor from which a cut pauses the scheduler-switch program instead (when it can
/// be paused).
pub(crate) const PAUSE_FROM_DIVISOR: u32 = 16;
/// At most this many time slices: the program is attached at least one second in this many
/// (plus its drain).
pub(crate) const MAX_SLICES: u32 = 20;

/// Weight of the newest second in the smoothed cost (the rest is the previous smoothed
/// value): one second's spike (an agent's upload) moves it half way.
const SMOOTHING: f64 = 0.5;

/// The controller's state; see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct Controller {
    /// Percent of one CPU.
    budget: f64,
    max_divisor: u32,
    divisor: u32,
    smoothed: Option<f64>,
    /// Measured seconds in a row under `RAISE_BELOW` of the budget.
    calm: u32,
    /// Seconds still to skip after a change.
    skip: u32,
    /// The scheduler-switch program's time slices (1: always attached), and their most (1:
    /// it cannot be paused).
    slices: u32,
    max_slices: u32,
    /// The last divisor cut not judged yet: the smoothed cost before it, the divisors from
    /// and to.
    divisor_cut: Option<(f64, u32, u32)>,
    /// A divisor cut barely lowered the cost: it is mostly fixed, pauses take the cuts.
    fixed_cost: bool,
}

impl Controller {
    /// A controller for `budget_percent` of one CPU, sampling at `rate_hz`, starting with
    /// every sample kept.
    pub(crate) fn new(budget_percent: f64, rate_hz: u64) -> Self {
        let max_divisor = u32::try_from((rate_hz / FLOOR_HZ).max(1)).unwrap_or(u32::MAX).min(profiler_common::sample_flags::MAX_WEIGHT);
        Controller { budget: budget_percent, max_divisor, divisor: 1, smoothed: None, calm: 0, skip: START_SECONDS, slices: 1, max_slices: 1, divisor_cut: None, fixed_cost: false }
    }

    /// Lets it pause the scheduler-switch program (off-CPU modes, a pausable program).
    pub(crate) fn allow_pauses(&mut self) {
        self.max_slices = MAX_SLICES;
    }

    /// The scheduler-switch program's time slices in force (1: always attached).
    pub(crate) fn slices(&self) -> u32 {
        self.slices
    }

    /// Whether a cut should pause rather than lower the share further.
    fn cut_by_pausing(&self) -> bool {
        self.max_slices > 1
            && self.slices < self.max_slices
            && (self.fixed_cost || self.divisor >= PAUSE_FROM_DIVISOR.min(self.max_divisor))
    }

    /// Applies a change of either knob.
    fn changed(&mut self) {
        self.smoothed = None;
        self.skip = 1;
    }

    /// The divisor in force.
    pub(crate) fn divisor(&self) -> u32 {
        self.divisor
    }

    /// One second's measured cost (percent of one CPU: pyperch's threads plus its kernel
    /// programs); returns the divisor to use from now on.
    pub(crate) fn step(&mut self, measured_percent: f64) -> u32 {
        if !measured_percent.is_finite() || measured_percent < 0.0 {
            return self.divisor;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return self.divisor;
        }
        let smoothed = match self.smoothed {
            Some(s) => SMOOTHING * measured_percent + (1.0 - SMOOTHING) * s,
            None => measured_percent,
        };
        self.smoothed = Some(smoothed);
        if let Some((before, from, to)) = self.divisor_cut.take() {
            // What a cost proportional to the share would have lost, against what was lost.
            let expected = before * (1.0 - from as f64 / to as f64);
            if before - smoothed < 0.5 * expected {
                self.fixed_cost = true;
            }
        }
        let share = 1.0 / self.divisor as f64;
        let wanted_share = if smoothed > self.budget {
            self.calm = 0;
            if self.cut_by_pausing() {
                // The program's time falls with its attached share (1/n): aim as a cut does.
                let wanted = (self.slices as f64 * smoothed / (AIM * self.budget)).ceil();
                self.slices = (wanted as u32).clamp(self.slices + 1, self.max_slices);
                self.changed();
                return self.divisor;
            }
            share * (AIM * self.budget / smoothed)
        } else if smoothed < RAISE_BELOW * self.budget && (self.divisor > 1 || self.slices > 1) {
            self.calm += 1;
            if self.calm < CALM_SECONDS {
                return self.divisor;
            }
            self.calm = 0;
            let factor = if smoothed > 0.0 { (AIM * self.budget / smoothed).min(MAX_RAISE) } else { MAX_RAISE };
            if self.slices > 1 {
                // The fewest slices whose cost (proportional to the attached share) stays
                // at the aim: none fewer if that is these.
                let _ = factor;
                let wanted = (self.slices as f64 * smoothed / (AIM * self.budget)).ceil().max(1.0) as u32;
                if wanted < self.slices {
                    self.slices = wanted.max(self.slices / 2).max(1);
                    self.changed();
                }
                return self.divisor;
            }
            share * factor
        } else {
            self.calm = 0;
            return self.divisor;
        };
        let mut divisor = divisor_for(wanted_share, self.max_divisor);
        if self.max_slices > 1 && self.divisor < PAUSE_FROM_DIVISOR {
            // Pauses take the cut from there on (a fixed cost does not fall with the share).
            divisor = divisor.min(PAUSE_FROM_DIVISOR);
        }
        if divisor != self.divisor {
            if divisor > self.divisor {
                self.divisor_cut = Some((smoothed, self.divisor, divisor));
            } else {
                // The load fell: whether its cost is fixed is to be seen again.
                self.fixed_cost = false;
            }
            self.divisor = divisor;
            self.changed();
        }
        self.divisor
    }
}

/// The smallest divisor whose share is at most `share` (rounded up: never above the aim),
/// within `1..=max`.
fn divisor_for(share: f64, max: u32) -> u32 {
    if !(share > 0.0) {
        return max;
    }
    let d = (1.0 / share - 1e-9).ceil();
    if d >= max as f64 { max } else { (d as u32).max(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of pyperch's cost: `fixed` percent plus `per_share` percent at share 1.
    fn cost(fixed: f64, per_share: f64, divisor: u32) -> f64 {
        fixed + per_share / divisor as f64
    }

    /// Runs `seconds` steps of the model; returns the divisors chosen.
    fn run(c: &mut Controller, fixed: f64, per_share: f64, seconds: usize) -> Vec<u32> {
        (0..seconds).map(|_| c.step(cost(fixed, per_share, c.divisor()))).collect()
    }

    #[test]
    fn under_budget_keeps_every_sample() {
        let mut c = Controller::new(2.0, 999);
        assert!(run(&mut c, 0.1, 1.0, 60).iter().all(|&d| d == 1));
    }

    #[test]
    fn converges_under_budget_then_holds_still() {
        let mut c = Controller::new(2.0, 999);
        let divisors = run(&mut c, 0.2, 20.0, 120);
        let settled = &divisors[30..];
        assert!(settled.windows(2).all(|w| w[0] == w[1]), "no change once settled: {divisors:?}");
        let d = settled[0];
        let measured = cost(0.2, 20.0, d);
        assert!(measured <= 2.0, "{measured} over the budget at divisor {d}");
        assert!(measured >= RAISE_BELOW * 2.0, "{measured} needlessly far under the budget at divisor {d}");
    }

    #[test]
    fn noisy_measurements_do_not_make_it_oscillate() {
        let mut c = Controller::new(2.0, 999);
        run(&mut c, 0.2, 20.0, 30);
        // ±10 % noise, deterministic.
        let mut changes = 0;
        let mut last = c.divisor();
        for i in 0..300 {
            let noise = 1.0 + 0.1 * ((i * 7919 % 21) as f64 - 10.0) / 10.0;
            let d = c.step(cost(0.2, 20.0, c.divisor()) * noise);
            if d != last {
                changes += 1;
                last = d;
            }
        }
        assert!(changes <= 2, "{changes} changes in 300 s of noisy steady load");
    }

    #[test]
    fn recovers_when_the_load_falls() {
        let mut c = Controller::new(2.0, 999);
        run(&mut c, 0.2, 50.0, 30);
        assert!(c.divisor() > 20);
        // The load falls tenfold: the share comes back, to every sample eventually.
        let divisors = run(&mut c, 0.2, 1.0, 120);
        assert_eq!(*divisors.last().unwrap(), 1, "{divisors:?}");
        // Raised step by step, never more than MAX_RAISE-fold at once.
        for w in divisors.windows(2) {
            assert!(w[1] as f64 >= (w[0] as f64 / MAX_RAISE).floor(), "{divisors:?}");
        }
    }

    #[test]
    fn never_below_the_floor() {
        // A fixed cost above the budget: the share falls to the floor and stays there.
        let mut c = Controller::new(1.0, 999);
        let divisors = run(&mut c, 3.0, 50.0, 120);
        assert_eq!(*divisors.last().unwrap(), 999);
        assert!(divisors.iter().all(|&d| d <= 999));
        let mut slow = Controller::new(1.0, 1);
        assert!(run(&mut slow, 3.0, 50.0, 30).iter().all(|&d| d == 1), "1 Hz is the floor already");
    }

    #[test]
    fn a_spike_of_one_second_cuts_at_most_once() {
        let mut c = Controller::new(2.0, 999);
        run(&mut c, 0.2, 1.0, 10);
        assert_eq!(c.divisor(), 1);
        let d = c.step(6.0);
        assert!(d > 1);
        let after = run(&mut c, 0.2, 1.0, 2);
        assert!(after.iter().all(|&x| x == d), "the second after a change is not used: {after:?}");
    }

    #[test]
    fn the_start_up_burst_is_not_held_against_the_budget() {
        let mut c = Controller::new(2.0, 99);
        let first: Vec<u32> = [30.0, 10.0].iter().map(|&m| c.step(m)).collect();
        assert_eq!(first, vec![1, 1]);
        assert!(run(&mut c, 0.2, 1.0, 30).iter().all(|&d| d == 1));
    }

    #[test]
    fn ignores_unusable_measurements() {
        let mut c = Controller::new(2.0, 99);
        assert_eq!(c.step(f64::NAN), 1);
        assert_eq!(c.step(-1.0), 1);
        assert_eq!(c.step(f64::INFINITY), 1);
    }

    /// A model with the scheduler-switch program's fixed cost: `fixed` percent falls with
    /// the attached share only, `per_share` with both knobs.
    fn cost_paused(fixed: f64, per_share: f64, c: &Controller) -> f64 {
        (fixed + per_share / c.divisor() as f64) / c.slices() as f64
    }

    /// A fixed cost over the budget: the divisor stops at `PAUSE_FROM_DIVISOR` and pauses
    /// take the rest, settling under the budget; when the storm ends the pauses are given
    /// back first, then the share.
    #[test]
    fn pauses_take_a_fixed_cost_the_share_cannot() {
        let mut c = Controller::new(2.0, 1000);
        c.allow_pauses();
        let mut seen = Vec::new();
        for _ in 0..120 {
            let m = cost_paused(6.0, 40.0, &c);
            c.step(m);
            seen.push((c.divisor(), c.slices()));
        }
        let (d, n) = *seen.last().unwrap();
        assert_eq!(d, PAUSE_FROM_DIVISOR, "{seen:?}");
        assert!(n > 1 && n < MAX_SLICES, "{seen:?}");
        assert!(seen.iter().all(|&(d, _)| d <= PAUSE_FROM_DIVISOR), "the divisor never went past the pause point: {seen:?}");
        assert!(cost_paused(6.0, 40.0, &c) <= 2.0, "{seen:?}");
        assert!(seen[60..].windows(2).all(|w| w[0] == w[1]), "settled: {seen:?}");
        // The storm ends.
        for _ in 0..200 {
            let m = cost_paused(0.05, 0.5, &c);
            c.step(m);
        }
        assert_eq!((c.divisor(), c.slices()), (1, 1));
    }

    /// A cost mostly fixed (a non-Python switch storm: the program's early exit on every
    /// switch): the first divisor cut barely helps, so pauses take over at once, without
    /// walking the divisor up to `PAUSE_FROM_DIVISOR` first.
    #[test]
    fn a_fixed_cost_is_paused_without_waiting_for_the_divisor() {
        let mut c = Controller::new(2.0, 1000);
        c.allow_pauses();
        let mut seen = Vec::new();
        for _ in 0..60 {
            let m = cost_paused(2.4, 0.4, &c);
            c.step(m);
            seen.push((c.divisor(), c.slices()));
        }
        assert!(seen[..10].iter().any(|&(_, n)| n > 1), "paused within 10 s: {seen:?}");
        assert!(seen.iter().all(|&(d, _)| d <= 4), "the divisor stayed low: {seen:?}");
        assert!(cost_paused(2.4, 0.4, &c) <= 2.0, "{seen:?}");
    }

    /// Without pauses allowed nothing changes: the divisor alone, to the floor.
    #[test]
    fn no_pauses_unless_allowed() {
        let mut c = Controller::new(2.0, 1000);
        for _ in 0..120 {
            let m = cost_paused(6.0, 40.0, &c);
            c.step(m);
        }
        assert_eq!(c.slices(), 1);
        assert_eq!(c.divisor(), 1000);
    }

    #[test]
    fn divisor_rounds_up_within_bounds() {
        assert_eq!(divisor_for(1.0, 10), 1);
        assert_eq!(divisor_for(0.5, 10), 2);
        assert_eq!(divisor_for(0.4, 10), 3);
        assert_eq!(divisor_for(0.001, 10), 10);
        assert_eq!(divisor_for(0.0, 10), 10);
        assert_eq!(divisor_for(2.0, 10), 1);
    }
}
