//! One sentence for a recording that came out empty or thin, so that nobody is left with
//! "0 samples" and no idea why.

use crate::{
    stats::{Counters, SampleOutcome},
    time_mode::TimeMode,
};

/// What the recording saw, as far as explaining an empty profile goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordingFacts {
    /// A command was launched (`record -- COMMAND`).
    pub launched: bool,
    /// The launched command exited before the recording's end.
    pub command_exited: bool,
    /// Explicit `--pid`s were given.
    pub explicit_pids: bool,
    /// Python processes registered with the kernel during the recording.
    pub registered: u64,
    /// Samples the kernel took of them (whatever became of them).
    pub kernel_samples: u64,
    /// Samples one thread busy on a CPU for the whole recording would have had
    /// (rate × duration).
    pub busy_thread_samples: u64,
    /// `--mode`: which threads' time the recording kept. In `wall`/`off-cpu` a sleeping
    /// thread is content, so "asleep" is no reason for an empty profile; in `gil` and
    /// `exception` the hint names what those modes keep.
    pub mode: TimeMode,
}

/// How the time modes help a recording of sleeping threads (`--mode cpu`).
pub const ASLEEP_HINT: &str = "--mode cpu (the default) samples threads only while they run on a CPU; to see where threads wait, \
                               record with --mode wall (py-spy's --idle) or --mode off-cpu";

/// What an on-CPU `mode` keeps, and how to see threads that wait instead: the end of the
/// sentence for a recording whose processes were asleep.
fn asleep_hint(mode: TimeMode) -> &'static str {
    match mode {
        TimeMode::Gil => {
            "--mode gil (py-spy's --gil) samples only the thread holding the GIL while it runs on a CPU; to see \
             where threads wait, record with --mode wall (py-spy's --idle) or --mode off-cpu"
        }
        TimeMode::Exception => {
            "--mode exception samples only threads handling an exception while they run on a CPU; to see where \
             threads wait, record with --mode wall (py-spy's --idle) or --mode off-cpu"
        }
        TimeMode::Cpu | TimeMode::Wall | TimeMode::OffCpu => ASLEEP_HINT,
    }
}

/// Why a recording with no sample in its profile is empty, as one sentence.
pub fn empty_recording(facts: RecordingFacts) -> String {
    if facts.registered == 0 {
        return if facts.launched && facts.command_exited {
            "the command exited before pyperch could sample a Python interpreter in it \
             (it was too short, or it ran no Python)"
                .to_owned()
        } else if facts.launched {
            "the command is not a Python interpreter and started none (pyperch profiles CPython only)".to_owned()
        } else if facts.explicit_pids {
            "the given processes never became ready to sample (their interpreter was not initialised)".to_owned()
        } else {
            "no Python process was found during the recording (see `pyperch list`)".to_owned()
        };
    }
    let who = if facts.launched {
        "the command's Python processes"
    } else if facts.explicit_pids {
        "the given processes"
    } else {
        "the Python processes found"
    };
    if facts.mode.off_cpu() {
        return format!(
            "no thread of {who} ran or waited in Python code while the kernel watched them \
             (threads blocked since before the start are read from memory: --stats counts those \
             that woke before they were read or could not be read)"
        );
    }
    // Asleep: on a CPU less than a tenth of the time (a few samples of start-up or
    // shutdown, outside Python code, do not make a process busy).
    if facts.kernel_samples.saturating_mul(10) <= facts.busy_thread_samples || facts.kernel_samples == 0 {
        let when = match facts.kernel_samples {
            0 => "the whole time".to_owned(),
            n => format!("nearly the whole time ({n} sample{} on a CPU, none in Python code)", if n == 1 { "" } else { "s" }),
        };
        return format!("{who} were asleep {when}: {}", asleep_hint(facts.mode));
    }
    "the sampled threads were never running Python code (they were in C code, starting up or \
     shutting down), or every sample was dropped (see --stats)"
        .to_owned()
}

/// Outcomes that lose a sample that ran Python code (not `Ok`, not a thread outside Python).
const DROPS: [SampleOutcome; 6] = [
    SampleOutcome::Truncated,
    SampleOutcome::KernelReadFault,
    SampleOutcome::StaleTail,
    SampleOutcome::BadCodeObject,
    SampleOutcome::ChangedCodeObject,
    SampleOutcome::UnknownProcess,
];

/// Samples that ran Python code and were dropped (every outcome in `DROPS`), as profiles
/// report them (`pyperch.samples.dropped`).
pub fn dropped_samples(totals: &Counters) -> u64 {
    DROPS.iter().map(|o| totals.outcomes.get(o).copied().unwrap_or(0)).sum()
}

/// A warning when more than a tenth of the samples were dropped, naming the main reason;
/// `ring_lost` are the samples the kernel could not hand over (ring buffer full).
pub fn dropped_warning(totals: &Counters, ring_lost: u64) -> Option<String> {
    let count = |o: SampleOutcome| totals.outcomes.get(&o).copied().unwrap_or(0);
    let mut reasons: Vec<(u64, &str)> = DROPS.iter().map(|&o| (count(o), o.label())).collect();
    reasons.push((ring_lost, "ring buffer full (pyperch could not keep up; try a lower --rate)"));
    let dropped: u64 = reasons.iter().map(|(n, _)| n).sum();
    let all = totals.samples().saturating_add(ring_lost);
    if all == 0 || dropped.saturating_mul(10) <= all {
        return None;
    }
    let (_, main) = reasons.iter().max_by_key(|(n, _)| *n)?;
    Some(format!(
        "{:.0}% of the samples ({dropped} of {all}) were dropped, mostly: {main} (see --stats)",
        100.0 * dropped as f64 / all as f64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_reasons() {
        let f = RecordingFacts { launched: true, command_exited: true, ..Default::default() };
        assert!(empty_recording(f).contains("exited before"));
        let f = RecordingFacts { launched: true, ..Default::default() };
        assert!(empty_recording(f).contains("not a Python interpreter"));
        let f = RecordingFacts { explicit_pids: true, registered: 1, ..Default::default() };
        let s = empty_recording(f);
        assert!(s.contains("asleep the whole time") && s.contains("--idle"), "{s}");
        let f = RecordingFacts { explicit_pids: true, registered: 1, mode: TimeMode::Gil, ..Default::default() };
        let s = empty_recording(f);
        assert!(s.contains("--mode gil") && s.contains("GIL") && !s.contains("--mode cpu"), "{s}");
        let f = RecordingFacts { registered: 1, kernel_samples: 1, busy_thread_samples: 200, ..Default::default() };
        assert!(empty_recording(f).contains("asleep nearly the whole time (1 sample on a CPU"));
        let f = RecordingFacts { registered: 1, kernel_samples: 50, busy_thread_samples: 200, ..Default::default() };
        assert!(empty_recording(f).contains("never running Python code"));
        // In the modes that measure waits, sleeping is content: never the "asleep" hint.
        let f = RecordingFacts { explicit_pids: true, registered: 1, mode: TimeMode::Wall, ..Default::default() };
        let s = empty_recording(f);
        assert!(s.contains("ran or waited") && !s.contains("--idle"), "{s}");
    }

    #[test]
    fn dropped_over_a_tenth() {
        let mut c = Counters::default();
        for _ in 0..90 {
            c.count(SampleOutcome::Ok);
        }
        for _ in 0..10 {
            c.count(SampleOutcome::StaleTail);
        }
        assert_eq!(dropped_warning(&c, 0), None);
        let w = dropped_warning(&c, 5).unwrap_or_default();
        assert!(w.starts_with("14% of the samples (15 of 105)") && w.contains("stale tail"), "{w}");
        assert_eq!(dropped_warning(&Counters::default(), 0), None);
    }
}
