//! The kernel's unwind tables (`--native`): the rows of every file a profiled process maps,
//! written into the array map `UNWIND_ROWS` through a shared mapping of it, and each
//! process's mappings in `UNWIND_PROCESSES` (see `profiler_common::unwind`).
//!
//! Invariants:
//! - a file's rows occupy one extent, written whole before any process entry points at it,
//!   and shared by every process mapping that same file read (the rows' `Arc`);
//! - an extent is freed with its last user, and reused only after `REUSE_AFTER` (a walk that
//!   looked up the process entry just before it changed may still be reading it);
//! - a file whose rows do not fit the free space is walked with frame pointers, and counted;
//! - no call reads a file or waits on a target: rows arrive built (`target::native`).

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::{MAX_UNWIND_MODULES, UnwindModule, UnwindProcess, UnwindRow, module_state};

use crate::target::native::tables::{MappingRows, MappingTable, TableSink};

/// Rows `UNWIND_ROWS` holds (8 bytes each: 16 MiB). numpy with OpenBLAS maps about 840,000.
pub const ROW_SLOTS: u32 = 1 << 21;
/// Processes `UNWIND_PROCESSES` holds (5 KiB each).
pub const PROCESS_SLOTS: u32 = 1024;
/// How long a freed extent waits before it is handed out again.
const REUSE_AFTER: Duration = Duration::from_secs(2);

/// The rows map, mapped into this process.
struct RowsMapping {
    base: *mut UnwindRow,
    slots: usize,
}

// SAFETY: the mapping is only written under `Tables`' mutex; the pointer itself is plain.
unsafe impl Send for RowsMapping {}

impl Drop for RowsMapping {
    fn drop(&mut self) {
        // SAFETY: `base` came from `mmap` with this length and is unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.slots * size_of::<UnwindRow>()) };
    }
}

struct Extent {
    rows: std::sync::Arc<[UnwindRow]>,
    first: u32,
    users: u32,
}

/// Which slots of the rows map are free. Invariant: `free` holds disjoint, non-adjacent
/// ranges below `next`, sorted by start; a range in `cooling` is in neither.
#[derive(Debug, Default)]
struct RowSpace {
    slots: u32,
    /// Free `(first, len)` ranges below `next`, sorted by `first`.
    free: Vec<(u32, u32)>,
    /// Freed ranges not to be reused before their time.
    cooling: Vec<(Instant, u32, u32)>,
    next: u32,
}

struct State {
    rows: RowsMapping,
    space: RowSpace,
    processes: BpfHashMap<MapData, u32, UnwindProcess>,
    /// `UNWIND_GENERATION`: bumped after every change to `processes`, so that the kernel's
    /// per-CPU cache of rows forgets the rows of mappings that changed.
    generation: aya::maps::Array<MapData, u32>,
    generation_value: u32,
    /// Extents in use, by the address of their rows.
    extents: HashMap<usize, Extent>,
    /// Each process's owner and the extents it uses.
    users: HashMap<u32, (u64, Vec<usize>)>,
}

/// The kernel's tables, shared by the threads that complete samples.
pub struct Tables {
    state: Mutex<State>,
    no_room: AtomicU64,
    over_modules: AtomicU64,
    map_errors: AtomicU64,
}

impl Tables {
    /// Maps the rows map (created `BPF_F_MMAPABLE` with `slots` entries) into this process.
    pub fn new(
        rows: &MapData,
        slots: u32,
        processes: BpfHashMap<MapData, u32, UnwindProcess>,
        generation: aya::maps::Array<MapData, u32>,
    ) -> std::io::Result<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        let len = slots as usize * size_of::<UnwindRow>();
        let fd = rows.fd().as_fd().as_raw_fd();
        // SAFETY: a shared, writable mapping of the map's fd, of its own size; checked below.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let state = State {
            rows: RowsMapping { base: base as *mut UnwindRow, slots: slots as usize },
            space: RowSpace { slots, ..RowSpace::default() },
            processes,
            generation,
            generation_value: 0,
            extents: HashMap::new(),
            users: HashMap::new(),
        };
        Ok(Self { state: Mutex::new(state), no_room: AtomicU64::new(0), over_modules: AtomicU64::new(0), map_errors: AtomicU64::new(0) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl RowSpace {
    /// A range of `len` free slots: cooled ranges first, then fresh ones past `next`.
    fn allocate(&mut self, len: u32, now: Instant) -> Option<u32> {
        let cooled: Vec<(u32, u32)> =
            self.cooling.iter().filter(|(at, _, _)| now >= *at).map(|&(_, first, len)| (first, len)).collect();
        self.cooling.retain(|(at, _, _)| now < *at);
        for range in cooled {
            self.release(range);
        }
        if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
            let (first, l) = self.free[i];
            if l == len {
                self.free.remove(i);
            } else {
                self.free[i] = (first + len, l - len);
            }
            return Some(first);
        }
        let end = self.next.checked_add(len)?;
        if end > self.slots {
            return None;
        }
        let first = self.next;
        self.next = end;
        Some(first)
    }

    /// Puts a range back in the free list, merged with its neighbours.
    fn release(&mut self, (first, len): (u32, u32)) {
        let at = self.free.partition_point(|&(f, _)| f < first);
        self.free.insert(at, (first, len));
        // Merge with the next, then with the previous.
        if at + 1 < self.free.len() && self.free[at].0 + self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
    }

    /// Frees `(first, len)` for reuse from `at` on.
    fn cool(&mut self, first: u32, len: u32, at: Instant) {
        self.cooling.push((at, first, len));
    }
}

impl State {
    /// Tells the kernel's row cache that mappings changed.
    fn bump_generation(&mut self) -> bool {
        self.generation_value = self.generation_value.wrapping_add(1);
        self.generation.set(0, self.generation_value, 0).is_ok()
    }


    /// The extent of `rows`, written now if it is not in the map yet; `None` without room.
    fn extent(&mut self, rows: &std::sync::Arc<[UnwindRow]>) -> Option<(usize, u32)> {
        let key = rows.as_ptr() as usize;
        if let Some(e) = self.extents.get_mut(&key) {
            e.users += 1;
            return Some((key, e.first));
        }
        let len = u32::try_from(rows.len()).ok()?;
        let first = self.space.allocate(len, Instant::now())?;
        // SAFETY: `[first, first + len)` lies inside the mapping (`allocate`), and no process
        // entry points at it (free, or past every extent handed out).
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), self.rows.base.add(first as usize), rows.len()) };
        self.extents.insert(key, Extent { rows: rows.clone(), first, users: 1 });
        Some((key, first))
    }

    /// Drops one use of each of `keys`; extents left without users cool down.
    fn unuse(&mut self, keys: &[usize]) {
        for key in keys {
            let Some(e) = self.extents.get_mut(key) else { continue };
            e.users -= 1;
            if e.users == 0 {
                let len = e.rows.len() as u32;
                let first = e.first;
                self.extents.remove(key);
                self.space.cool(first, len, Instant::now() + REUSE_AFTER);
            }
        }
    }
}

impl TableSink for Tables {
    fn set_process(&self, pid: u32, owner: u64, mappings: &[MappingTable]) {
        let mut state = self.lock();
        let mut value = Box::<UnwindProcess>::default();
        let mut used = Vec::new();
        if mappings.len() > MAX_UNWIND_MODULES {
            self.over_modules.fetch_add(1, Ordering::Relaxed);
        }
        for (slot, m) in value.modules.iter_mut().zip(mappings) {
            let (first_row, rows, state_word) = match &m.rows {
                MappingRows::Rows(rows) if rows.is_empty() => (0, 0, module_state::FRAME_POINTERS),
                MappingRows::Rows(rows) => match state.extent(rows) {
                    Some((key, first)) => {
                        used.push(key);
                        (first, rows.len() as u32, module_state::READY)
                    }
                    None => {
                        self.no_room.fetch_add(1, Ordering::Relaxed);
                        (0, 0, module_state::FRAME_POINTERS)
                    }
                },
                MappingRows::FramePointers => (0, 0, module_state::FRAME_POINTERS),
                MappingRows::Loading => (0, 0, module_state::LOADING),
            };
            *slot = UnwindModule { start: m.start, end: m.end, bias: m.bias, first_row, rows, state: state_word, _pad: 0 };
        }
        value.count = mappings.len().min(MAX_UNWIND_MODULES) as u32;
        if state.processes.insert(pid, *value, 0).is_err() {
            self.map_errors.fetch_add(1, Ordering::Relaxed);
            // Not in the kernel: the extents it would have used are not in use.
            state.unuse(&used);
            used.clear();
        }
        if !state.bump_generation() {
            self.map_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some((_, old)) = state.users.insert(pid, (owner, used)) {
            state.unuse(&old);
        }
    }

    fn remove_process(&self, pid: u32, owner: u64) {
        let mut state = self.lock();
        if state.users.get(&pid).is_none_or(|(o, _)| *o != owner) {
            return;
        }
        let _ = state.processes.remove(&pid);
        if !state.bump_generation() {
            self.map_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some((_, old)) = state.users.remove(&pid) {
            state.unuse(&old);
        }
    }

    fn report(&self) -> String {
        let state = self.lock();
        let used: u64 = state.extents.values().map(|e| e.rows.len() as u64).sum();
        format!(
            "kernel unwind tables: {} files, {} of {} rows in use, {} processes; {} files without room (frame pointers), {} processes over {} mappings, {} map errors",
            state.extents.len(),
            used,
            state.rows.slots,
            state.users.len(),
            self.no_room.load(Ordering::Relaxed),
            self.over_modules.load(Ordering::Relaxed),
            MAX_UNWIND_MODULES,
            self.map_errors.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Extents come from fresh space, then from freed ranges once cooled (merged with their
    /// neighbours); never beyond the map.
    #[test]
    fn row_space_reuses_cooled_ranges_only() {
        let t0 = Instant::now();
        let mut s = RowSpace { slots: 100, ..RowSpace::default() };
        assert_eq!(s.allocate(40, t0), Some(0));
        assert_eq!(s.allocate(40, t0), Some(40));
        assert_eq!(s.allocate(30, t0), None, "past the map");
        s.cool(0, 40, t0 + REUSE_AFTER);
        s.cool(40, 40, t0 + REUSE_AFTER);
        assert_eq!(s.allocate(30, t0), None, "still cooling");
        // Cooled: the two ranges merge into one of 80.
        assert_eq!(s.allocate(70, t0 + REUSE_AFTER), Some(0));
        assert_eq!(s.free, vec![(70, 10)]);
        assert_eq!(s.allocate(10, t0 + REUSE_AFTER), Some(70));
        assert!(s.free.is_empty());
        assert_eq!(s.allocate(20, t0 + REUSE_AFTER), Some(80));
        assert_eq!(s.allocate(1, t0 + REUSE_AFTER), None);
    }
}
