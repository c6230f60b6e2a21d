//! Which time a profile shows (`--mode`): CPU samples, off-CPU intervals, or both.
//!
//! - `cpu` (default): CPU-clock samples of running threads; values are sample counts.
//! - `wall`: every thread's whole time: on-CPU samples weighted by the sampling period plus
//!   the exact off-CPU intervals the scheduler reports; values are nanoseconds.
//! - `off-cpu`: only the off-CPU intervals; values are nanoseconds.
//! - `gil`: CPU-clock samples of threads holding the GIL only (the kernel checks the holder
//!   as each version records it, see `layout::gil`); values are sample counts.
//! - `exception`: CPU-clock samples of threads handling an exception only (the kernel reads
//!   the thread state's exception stack, see `layout::exception`); values are sample counts.
//!
//! Off-CPU stacks end in a frame saying why the thread was off ([`OFF_CPU_SLEEP`],
//! [`OFF_CPU_PREEMPTED`], [`OFF_CPU_GIL_WAIT`]); intervals shorter than `--min-off-cpu` are not walked, and their
//! time shows per thread as [`OFF_CPU_SHORT`].

use std::time::Duration;

use profiler_common::off_cpu_reason;

/// `--mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeMode {
    /// On-CPU samples (today's behaviour): sample counts.
    #[default]
    Cpu,
    /// On-CPU samples weighted by the period plus exact off-CPU intervals: nanoseconds.
    Wall,
    /// Only the time threads spend switched out: nanoseconds.
    #[value(name = "off-cpu")]
    OffCpu,
    /// On-CPU samples of threads holding the GIL only: sample counts.
    Gil,
    /// On-CPU samples of threads handling an exception only (inside an `except` block, as
    /// `sys.exc_info()` says): sample counts.
    Exception,
}

/// Below this an off-CPU interval is summed, not walked (`--min-off-cpu` default). A walk costs
/// a few microseconds; 100 us keeps the walks at most a few percent of the waiting they
/// describe while every function waiting for a timer tick (1-4 ms) or longer is walked.
pub const DEFAULT_MIN_OFF_CPU: Duration = Duration::from_micros(100);

/// Leaf frame of time spent asleep (blocked: locks, I/O, sleeps; waiting for the GIL where
/// that cannot be told).
pub const OFF_CPU_SLEEP: &str = "<off-cpu: sleep>";
/// Leaf frame of time spent asleep waiting for the GIL (a futex call on the interpreter's GIL
/// struct, see `layout::gil::gil_wait_layout`).
pub const OFF_CPU_GIL_WAIT: &str = "<off-cpu: GIL wait>";
/// Leaf frame of time spent runnable but preempted.
pub const OFF_CPU_PREEMPTED: &str = "<off-cpu: preempted>";
/// The only frame of the summed time of intervals below `--min-off-cpu`.
pub const OFF_CPU_SHORT: &str = "<off-cpu: short>";
/// Leaf frame of a CPU sample taken while the sampled thread ran the garbage collector
/// (without `--native`, which shows the collector's own C functions instead).
pub const GC_FRAME: &str = "<GC>";

/// The leaf frame of an off-CPU interval for the kernel's `off_cpu_reason`; a reason this
/// build does not know reads as a plain sleep.
pub fn off_cpu_leaf(reason: u32) -> &'static str {
    match reason {
        off_cpu_reason::PREEMPTED => OFF_CPU_PREEMPTED,
        off_cpu_reason::GIL_WAIT => OFF_CPU_GIL_WAIT,
        _ => OFF_CPU_SLEEP,
    }
}

impl TimeMode {
    /// The mode's name on the command line.
    pub fn label(self) -> &'static str {
        match self {
            TimeMode::Cpu => "cpu",
            TimeMode::Wall => "wall",
            TimeMode::OffCpu => "off-cpu",
            TimeMode::Gil => "gil",
            TimeMode::Exception => "exception",
        }
    }

    /// Whether CPU-clock samples count.
    pub fn on_cpu(self) -> bool {
        matches!(self, TimeMode::Cpu | TimeMode::Wall | TimeMode::Gil | TimeMode::Exception)
    }

    /// Whether off-CPU intervals are taken (the scheduler-switch programs are attached).
    pub fn off_cpu(self) -> bool {
        matches!(self, TimeMode::Wall | TimeMode::OffCpu)
    }

    /// Whether profile values are nanoseconds (otherwise sample counts).
    pub fn in_nanoseconds(self) -> bool {
        self.off_cpu()
    }

    /// The pprof sample type of the time values: the mode's name.
    pub fn pprof_type(self) -> &'static str {
        self.label()
    }
}

/// The time settings of one recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeOptions {
    pub mode: TimeMode,
    /// Off-CPU intervals shorter than this are summed per thread, not walked.
    pub min_off_cpu: Duration,
    /// Off-CPU records are gathered per CPU and sent in batches (see
    /// `profiler-ebpf/src/off_cpu_batch.rs`); false when each thread's records must arrive in
    /// time order (a timeline is kept).
    pub batch_off_cpu: bool,
}

impl Default for TimeOptions {
    fn default() -> Self {
        TimeOptions { mode: TimeMode::Cpu, min_off_cpu: DEFAULT_MIN_OFF_CPU, batch_off_cpu: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_off_cpu_reason_has_its_leaf() {
        assert_eq!(off_cpu_leaf(off_cpu_reason::SLEEP), "<off-cpu: sleep>");
        assert_eq!(off_cpu_leaf(off_cpu_reason::PREEMPTED), "<off-cpu: preempted>");
        assert_eq!(off_cpu_leaf(off_cpu_reason::GIL_WAIT), "<off-cpu: GIL wait>");
        assert_eq!(off_cpu_leaf(77), "<off-cpu: sleep>");
    }
}
