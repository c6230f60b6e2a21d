//! With `--native`, a process's first samples are held briefly while its maps and files are
//! read (off the sampling loop, `native::io`), so that the start of a recording gets native
//! frames rather than `<loading native>`.
//!
//! Bounds: a process holds records only from its first sample until its maps and files are
//! in, or for at most [`HOLD`], or until [`MAX_HELD_BYTES_PER_PROCESS`] (and
//! [`MAX_HELD_BYTES`] over all processes) are held; then every held record is processed, in
//! order, before any newer one of the process, and the process never holds again (a library
//! loaded later shows `<loading native>` until it is read). Nothing here waits: the loop
//! releases records on later samples and on its beat.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use super::Charge;

/// Longest a record is held.
pub(crate) const HOLD: Duration = Duration::from_secs(2);
/// Bytes of records one process may hold.
const MAX_HELD_BYTES_PER_PROCESS: usize = 8 << 20;
/// Bytes of records all processes may hold together.
pub(crate) const MAX_HELD_BYTES: usize = 64 << 20;

/// One process's held records.
#[derive(Default)]
pub(crate) struct HeldSamples {
    records: VecDeque<(Vec<u8>, Charge)>,
    bytes: usize,
    /// When the first record was held.
    since: Option<Instant>,
    /// Holding is over for this process.
    done: bool,
}

impl HeldSamples {
    /// Holds `record` if this process may still hold (`waiting`: its maps or files are not
    /// in yet); `total` is the bytes held by all processes. `false`: process it now (after
    /// the held ones, see `take`).
    pub(crate) fn hold(&mut self, record: &[u8], charge: Charge, waiting: bool, total: &mut usize) -> bool {
        if self.done {
            return false;
        }
        let expired = self.since.is_some_and(|t| t.elapsed() >= HOLD);
        let fits = self.bytes + record.len() <= MAX_HELD_BYTES_PER_PROCESS && *total + record.len() <= MAX_HELD_BYTES;
        if !waiting || expired || !fits {
            self.done = true;
            return false;
        }
        self.since.get_or_insert_with(Instant::now);
        self.bytes += record.len();
        *total += record.len();
        self.records.push_back((record.to_vec(), charge));
        true
    }

    /// Whether the held records are due: holding is over, or has lasted `HOLD`.
    pub(crate) fn due(&self, waiting: bool) -> bool {
        !self.records.is_empty() && (self.done || !waiting || self.since.is_some_and(|t| t.elapsed() >= HOLD))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Takes every held record, oldest first, and ends holding for this process.
    pub(crate) fn take(&mut self, total: &mut usize) -> VecDeque<(Vec<u8>, Charge)> {
        self.done = true;
        *total = total.saturating_sub(self.bytes);
        self.bytes = 0;
        std::mem::take(&mut self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_while_waiting_then_never_again() {
        let charge = Charge::new(1, None);
        let mut total = 0;
        let mut h = HeldSamples::default();
        assert!(h.hold(&[1; 10], charge.clone(), true, &mut total));
        assert!(h.hold(&[2; 10], charge.clone(), true, &mut total));
        assert_eq!(total, 20);
        assert!(!h.due(true));
        assert!(h.due(false));
        // Ready: the next record is not held, and the held ones come out in order.
        assert!(!h.hold(&[3; 10], charge.clone(), false, &mut total));
        let taken: Vec<u8> = h.take(&mut total).into_iter().map(|(r, _)| r[0]).collect();
        assert_eq!(taken, vec![1, 2]);
        assert_eq!(total, 0);
        assert!(!h.hold(&[4; 10], charge.clone(), true, &mut total), "holding is over for good");
        // Over the session-wide bound: not held.
        let mut other = HeldSamples::default();
        let mut full = MAX_HELD_BYTES;
        assert!(!other.hold(&[5; 10], charge.clone(), true, &mut full));
    }
}
