//! What the sample path keeps in memory per process, and its byte budgets.
//!
//! Each profiled process caches what was read from it: code objects (names, file names, line
//! tables), frame positions → shown frame, and validated deep-stack tails (`completion`).
//! Entries are accounted in bytes, approximately but honestly: the lengths of the strings and
//! tables they hold plus a fixed overhead per entry for the map slot, the allocation headers
//! and the struct (a 4 KiB qualified name costs its 4 KiB). Two budgets apply:
//! - per process (`PROCESS_BUDGET`): a cache that would exceed it is emptied first;
//! - across processes (`GLOBAL_BUDGET`): every process's share is summed in a process-wide
//!   ledger; past the budget the session empties the largest processes' caches until the sum
//!   is under `GLOBAL_LOW_WATER` (`session::cache_budget`).
//!
//! Emptying a cache never changes a result: every entry is read from the target again on next
//! use and validated again (a frame's code object by its type and validation word, a tail by
//! the kernel's hash). Each emptying is counted (`Counters::cache_evictions`, `--stats`).
//!
//! Names are kept whole (up to `symbolize::MAX_NAME_CHARS`): truncating them could make two
//! different functions look the same, and the byte accounting already bounds what long names
//! cost.

use std::{
    hash::Hash,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

use crate::target::symbolize::CodeInfo;

/// Bytes the caches of one process may hold.
pub(crate) const PROCESS_BUDGET: usize = 16 << 20;
/// Bytes the caches of all processes may hold together.
pub(crate) const GLOBAL_BUDGET: usize = 64 << 20;
/// Once over `GLOBAL_BUDGET`, caches are emptied (largest first) until the sum is below this,
/// so that a session near the budget does not empty one cache per sample.
pub(crate) const GLOBAL_LOW_WATER: usize = GLOBAL_BUDGET / 4 * 3;

/// Bytes held by the caches of every process of this pyperch (one session per process).
pub(crate) static CACHE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Accounted per cached code object beside its strings and line table: the map slot (address,
/// pointer, control byte, spare capacity), the shared allocation (`CodeEntry`, reference
/// counts) and the three allocation headers of the strings and the table.
const CODE_OVERHEAD: usize = 256;
/// Accounted per cached position: the map slot (key, value, control byte, spare capacity).
const POSITION_BYTES: usize = 48;

/// Accounted bytes of one cached code object.
pub(crate) fn code_bytes(info: &CodeInfo) -> usize {
    info.qualname.len() + info.filename.len() + info.linetable.len() + CODE_OVERHEAD
}

/// A map whose entries each carry an accounted size; `clear` frees its memory.
///
/// Looked up once per frame of every sample, so it hashes with hashbrown's default (foldhash,
/// seeded at random per process: keys come from targets, so a fixed seed would let one
/// craft collisions), several times faster on these small keys than std's SipHash.
pub(crate) struct SizedMap<K, V> {
    map: hashbrown::HashMap<K, V>,
    bytes: usize,
}

impl<K: Hash + Eq, V> Default for SizedMap<K, V> {
    fn default() -> Self {
        Self { map: hashbrown::HashMap::new(), bytes: 0 }
    }
}

impl<K: Hash + Eq, V> SizedMap<K, V> {
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    /// Inserts `value` accounted as `bytes` (a replaced entry stays accounted: an upper bound).
    pub(crate) fn insert(&mut self, key: K, value: V, bytes: usize) {
        self.map.insert(key, value);
        self.bytes = self.bytes.saturating_add(bytes);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Empties the map and frees its memory (its capacity too).
    pub(crate) fn clear(&mut self) {
        self.map = hashbrown::HashMap::new();
        self.bytes = 0;
    }
}

/// Bytes of one position entry.
pub(crate) const fn position_bytes() -> usize {
    POSITION_BYTES
}

/// One process's share of `CACHE_BYTES`: what it last reported, taken back when dropped.
pub(crate) struct LedgerShare {
    ledger: &'static AtomicUsize,
    reported: usize,
}

impl LedgerShare {
    pub(crate) fn new(ledger: &'static AtomicUsize) -> Self {
        Self { ledger, reported: 0 }
    }

    /// Reports that this process's caches now hold `bytes`.
    pub(crate) fn report(&mut self, bytes: usize) {
        if bytes >= self.reported {
            self.ledger.fetch_add(bytes - self.reported, Relaxed);
        } else {
            self.ledger.fetch_sub(self.reported - bytes, Relaxed);
        }
        self.reported = bytes;
    }
}

impl Drop for LedgerShare {
    fn drop(&mut self) {
        self.report(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static LEDGER: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn shares_add_up_and_are_taken_back_when_dropped() {
        let mut a = LedgerShare::new(&LEDGER);
        let mut b = LedgerShare::new(&LEDGER);
        a.report(1000);
        b.report(500);
        assert_eq!(LEDGER.load(Relaxed), 1500);
        a.report(200);
        assert_eq!(LEDGER.load(Relaxed), 700);
        drop(b);
        assert_eq!(LEDGER.load(Relaxed), 200);
        assert_eq!(a.reported, 200);
        drop(a);
        assert_eq!(LEDGER.load(Relaxed), 0);
    }

    #[test]
    fn sized_map_counts_bytes_and_clear_frees_them() {
        let mut m: SizedMap<u64, u32> = SizedMap::default();
        m.insert(1, 1, 100);
        m.insert(2, 2, 4196);
        assert_eq!(m.bytes(), 4296);
        assert_eq!(m.get(&2), Some(&2));
        m.clear();
        assert_eq!(m.bytes(), 0);
        assert_eq!(m.get(&2), None);
    }

    #[test]
    fn a_long_name_is_counted_by_its_bytes() {
        let info = CodeInfo {
            qualname: "q".repeat(4096).into(),
            filename: "/srv/app.py".into(),
            firstlineno: 1,
            firsttraceable: 0,
            line_format: crate::target::layout::LineTableFormat::Lnotab,
            linetable: vec![0; 10].into_boxed_slice(),
        };
        assert_eq!(code_bytes(&info), 4096 + 11 + 10 + CODE_OVERHEAD);
    }
}
