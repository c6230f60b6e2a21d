//! Reads of a target process's memory (`process_vm_readv`).
//!
//! Every byte read here is untrusted: callers bound lengths and check what they read.
//! Reads are counted (calls and bytes) for `--stats`. A read may block on the target (a page
//! of a file whose server does not answer): threads that must not wait read with a deadline,
//! and a target that does not answer is quarantined ([`deadline`]).

pub mod deadline;

use std::{
    cell::Cell,
    sync::atomic::{AtomicU64, Ordering},
};

/// Reads and bytes read from targets, for the whole run.
pub static READS: AtomicU64 = AtomicU64::new(0);
pub static BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Largest single read a caller may ask for (strings, line tables, frames).
pub const MAX_READ: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("read of {len} bytes at {address:#x} in process {pid} failed: {source}")]
    Read { pid: u32, address: u64, len: usize, source: std::io::Error },
    #[error("short read of {got} of {len} bytes at {address:#x} in process {pid}")]
    Short { pid: u32, address: u64, len: usize, got: usize },
    #[error("refusing a read of {len} bytes (more than {MAX_READ}) at {address:#x}")]
    TooLarge { address: u64, len: usize },
    #[error("null pointer read")]
    Null,
    /// A read past the budget `with_read_budget` set on this thread (nothing was read).
    #[error("the read budget ran out")]
    OverBudget,
    /// A read of this process's memory did not answer within the deadline once: no more
    /// are made ([`deadline`]).
    #[error("process {pid} is quarantined (a read of its memory did not answer in time)")]
    Quarantined { pid: u32 },
    /// A guarded read could not be made (no reader thread could be had).
    #[error("read at {address:#x} in process {pid} not made: no reader thread free")]
    Unanswered { pid: u32, address: u64 },
    /// A read from a kernel copy (`symbolize::SnapshotMemory`) outside the bytes copied.
    #[error("{len} bytes at {address:#x} were not copied by the kernel")]
    NotCopied { address: u64, len: usize },
}

/// Something target memory can be read from: the live process ([`ProcessMemory`]), or bytes
/// the kernel copied from it at sample time (`symbolize::SnapshotMemory`).
pub trait ReadMemory {
    /// Fills `buf` from `address`, or fails; never returns a partial buffer.
    fn read_into(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError>;

    /// A word of a type object (long-lived: always read from the live process).
    fn read_type_word(&self, address: u64) -> Result<u64, MemoryError>;

    fn read_vec(&self, address: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        if len > MAX_READ {
            return Err(MemoryError::TooLarge { address, len });
        }
        let mut buf = vec![0u8; len];
        self.read_into(address, &mut buf)?;
        Ok(buf)
    }

    fn read_u64(&self, address: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read_into(address, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

impl ReadMemory for ProcessMemory {
    fn read_into(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.read(address, buf)
    }

    fn read_type_word(&self, address: u64) -> Result<u64, MemoryError> {
        ProcessMemory::read_u64(self, address)
    }
}

/// Reads and bytes one `with_read_budget` call allows, and what it used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadBudget {
    pub reads: u64,
    pub bytes: u64,
    /// A read was refused because it would have gone past the budget.
    pub exhausted: bool,
}

thread_local! {
    /// What this thread may still read (`with_read_budget`); `None`: no limit.
    static BUDGET: Cell<Option<ReadBudget>> = const { Cell::new(None) };
}

/// Runs `f` with at most `limit.reads` reads of `limit.bytes` bytes in all from targets, on
/// this thread: a read past either is refused (`MemoryError::OverBudget`) without reading.
/// Returns what `f` returned and what it used (with `exhausted` set if a read was refused).
/// Budgets do not nest: the inner one replaces the outer one until it ends.
pub fn with_read_budget<R>(limit: ReadBudget, f: impl FnOnce() -> R) -> (R, ReadBudget) {
    let before = BUDGET.with(|b| b.replace(Some(ReadBudget { exhausted: false, ..limit })));
    let result = f();
    let left = BUDGET.with(|b| b.replace(before)).unwrap_or_default();
    let used = ReadBudget {
        reads: limit.reads.saturating_sub(left.reads),
        bytes: limit.bytes.saturating_sub(left.bytes),
        exhausted: left.exhausted,
    };
    (result, used)
}

/// Whether a read on this thread was refused by the budget `with_read_budget` set.
pub fn budget_exhausted() -> bool {
    BUDGET.with(|b| b.get().is_some_and(|left| left.exhausted))
}

/// Takes one read of `len` bytes from this thread's budget, if it has one; `false`: refused.
fn charge_budget(len: usize) -> bool {
    BUDGET.with(|b| match b.get() {
        None => true,
        Some(left) if left.reads == 0 || (len as u64) > left.bytes => {
            b.set(Some(ReadBudget { exhausted: true, ..left }));
            false
        }
        Some(left) => {
            b.set(Some(ReadBudget { reads: left.reads - 1, bytes: left.bytes - len as u64, exhausted: left.exhausted }));
            true
        }
    })
}

/// The address space of one process, by PID.
#[derive(Debug, Clone, Copy)]
pub struct ProcessMemory {
    pid: u32,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        Self { pid }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Fills `buf` from `address`, or fails; never returns a partial buffer.
    pub fn read(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        if address == 0 {
            return Err(MemoryError::Null);
        }
        if buf.len() > MAX_READ {
            return Err(MemoryError::TooLarge { address, len: buf.len() });
        }
        if buf.is_empty() {
            return Ok(());
        }
        if !charge_budget(buf.len()) {
            return Err(MemoryError::OverBudget);
        }
        if deadline::is_quarantined(self.pid) {
            return Err(MemoryError::Quarantined { pid: self.pid });
        }
        let got = if deadline::guarded() {
            deadline::read(self.pid, address, buf)?
        } else {
            raw_read(self.pid, address, buf).map_err(|source| MemoryError::Read {
                pid: self.pid,
                address,
                len: buf.len(),
                source,
            })?
        };
        READS.fetch_add(1, Ordering::Relaxed);
        BYTES_READ.fetch_add(got as u64, Ordering::Relaxed);
        if got != buf.len() {
            return Err(MemoryError::Short { pid: self.pid, address, len: buf.len(), got });
        }
        Ok(())
    }

    /// Follows a chain of records linked by a pointer (frames by their `previous`): reads
    /// `size` bytes at `first`, then at the address found at `link` in them, and so on, until
    /// `max` records were read or a link is 0; their bytes go end to end into `out` (cleared
    /// first). Returns the link after the last record read (0: the chain ended there).
    ///
    /// A read that fails after the first ends the chain early, and the link returned is the
    /// address that failed (so the caller's next read there says why); the first read's
    /// failure is returned. On a guarded thread the whole chain is one round trip to its
    /// reader, within one deadline: a stack that changes every millisecond is read before
    /// it changed. Each record counts as one read of the budget, charged before reading.
    pub fn read_chain(&self, first: u64, chain: Chain, out: &mut Vec<u8>) -> Result<u64, MemoryError> {
        out.clear();
        if first == 0 {
            return Err(MemoryError::Null);
        }
        let Chain { size, link, max } = chain;
        if size == 0 || link + 8 > size || size.saturating_mul(max) > MAX_READ {
            return Err(MemoryError::TooLarge { address: first, len: size.saturating_mul(max) });
        }
        let max = (0..max).take_while(|_| charge_budget(size)).count();
        if max == 0 {
            return Err(MemoryError::OverBudget);
        }
        if deadline::is_quarantined(self.pid) {
            return Err(MemoryError::Quarantined { pid: self.pid });
        }
        let chain = Chain { size, link, max };
        let read = if deadline::guarded() {
            deadline::read_chain(self.pid, first, chain, out)?
        } else {
            raw_chain(self.pid, first, chain, out)
        };
        let records = out.len() / size;
        READS.fetch_add(records as u64, Ordering::Relaxed);
        BYTES_READ.fetch_add(out.len() as u64, Ordering::Relaxed);
        match read {
            ChainEnd::Next(next) => Ok(next),
            ChainEnd::FirstFailed(source) => Err(MemoryError::Read { pid: self.pid, address: first, len: size, source }),
        }
    }

    pub fn read_vec(&self, address: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        if len > MAX_READ {
            return Err(MemoryError::TooLarge { address, len });
        }
        let mut buf = vec![0u8; len];
        self.read(address, &mut buf)?;
        Ok(buf)
    }

    pub fn read_u64(&self, address: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(address, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A NUL-terminated C string of at most `max` bytes, printable ASCII only (type names and
    /// the like); `None` if unreadable, longer, or not printable. Read in 16-byte pieces, so a
    /// string near the end of a mapping still reads.
    pub fn read_c_string(&self, address: u64, max: usize) -> Option<String> {
        let mut out = Vec::new();
        let mut at = address;
        while out.len() < max {
            let mut chunk = [0u8; 16];
            self.read(at, &mut chunk).ok()?;
            for &b in &chunk {
                if b == 0 {
                    return String::from_utf8(out).ok();
                }
                if !(0x20..0x7f).contains(&b) || out.len() >= max {
                    return None;
                }
                out.push(b);
            }
            at = at.wrapping_add(16);
        }
        None
    }

    pub fn read_u32(&self, address: u64) -> Result<u32, MemoryError> {
        let mut b = [0u8; 4];
        self.read(address, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// One `process_vm_readv` of `buf.len()` bytes at `address` in `pid` on this thread: the
/// bytes read (a short count at the end of a mapping).
fn raw_read(pid: u32, address: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: address as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: `local` describes `buf`, which is valid for writes of its length; the kernel
    // checks the remote range and fails without touching our memory if it is not mapped.
    let got = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if got < 0 { Err(std::io::Error::last_os_error()) } else { Ok(got as usize) }
}

/// The shape of a chain of records for [`ProcessMemory::read_chain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Bytes read per record.
    pub size: usize,
    /// Offset in a record of the next record's address (8 bytes, little-endian).
    pub link: usize,
    /// Records read at most.
    pub max: usize,
}

/// How a chain read ended.
#[derive(Debug)]
pub(crate) enum ChainEnd {
    /// The link after the last record read (0: the chain ended; else where it stopped).
    Next(u64),
    /// The first record could not be read (nothing was).
    FirstFailed(std::io::Error),
}

/// [`ProcessMemory::read_chain`] on this thread: each record by [`raw_read`], appended to
/// `out`.
fn raw_chain(pid: u32, first: u64, chain: Chain, out: &mut Vec<u8>) -> ChainEnd {
    let mut address = first;
    for i in 0..chain.max {
        let start = out.len();
        out.resize(start + chain.size, 0);
        let failed = match raw_read(pid, address, &mut out[start..]) {
            Ok(got) if got == chain.size => None,
            Ok(got) => Some(std::io::Error::other(format!("short read of {got} of {} bytes", chain.size))),
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            out.truncate(start);
            return if i == 0 { ChainEnd::FirstFailed(e) } else { ChainEnd::Next(address) };
        }
        address = field_u64(&out[start..], chain.link).unwrap_or(0);
        if address == 0 {
            break;
        }
    }
    ChainEnd::Next(address)
}

/// Little-endian integer fields out of a buffer read from a target; out-of-range offsets
/// read as `None` rather than panicking.
pub fn field_u64(buf: &[u8], offset: usize) -> Option<u64> {
    let bytes = buf.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

pub fn field_u32(buf: &[u8], offset: usize) -> Option<u32> {
    let bytes = buf.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

pub fn field_i32(buf: &[u8], offset: usize) -> Option<i32> {
    field_u32(buf, offset).map(|v| v as i32)
}

pub fn field_u8(buf: &[u8], offset: usize) -> Option<u8> {
    buf.get(offset).copied()
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// A budget refuses the read that would pass it, reads nothing then, and says so; outside
    /// it reads are not limited.
    #[test]
    fn reads_past_the_budget_are_refused() {
        let value = 7u64;
        let mem = ProcessMemory::new(std::process::id());
        let address = &value as *const u64 as u64;
        let (results, used) = with_read_budget(ReadBudget { reads: 2, bytes: 64, exhausted: false }, || {
            (0..3).map(|_| mem.read_u64(address).ok()).collect::<Vec<_>>()
        });
        assert_eq!(results, [Some(7), Some(7), None]);
        assert_eq!(used, ReadBudget { reads: 2, bytes: 16, exhausted: true });
        let (big, used) = with_read_budget(ReadBudget { reads: 5, bytes: 4, exhausted: false }, || mem.read_u64(address));
        assert!(matches!(big, Err(MemoryError::OverBudget)));
        assert_eq!(used, ReadBudget { reads: 0, bytes: 0, exhausted: true });
        assert_eq!(mem.read_u64(address).ok(), Some(7));
    }
}

#[cfg(test)]
mod chain_tests {
    use super::*;

    /// Records of 24 bytes linked at offset 8, in this process's memory: `n` of them, the
    /// last one's link `last_link`.
    fn records(n: usize, last_link: u64) -> Vec<Box<[u64; 3]>> {
        let mut chain: Vec<Box<[u64; 3]>> = (0..n).map(|i| Box::new([i as u64, 0, 0xabcd])).collect();
        for i in 0..n {
            let next = if i + 1 < n { &*chain[i + 1] as *const [u64; 3] as u64 } else { last_link };
            chain[i][1] = next;
        }
        chain
    }

    const SHAPE: Chain = Chain { size: 24, link: 8, max: 100 };

    fn ids(out: &[u8]) -> Vec<u64> {
        out.chunks(24).filter_map(|r| field_u64(r, 0)).collect()
    }

    /// A chain is followed to its null link, or up to `max` records (then the next link is
    /// returned), on a guarded thread (one round trip to its reader) as on any other.
    #[test]
    fn chains_are_followed_to_their_end_or_max() {
        let mem = ProcessMemory::new(std::process::id());
        let chain = records(5, 0);
        let first = &*chain[0] as *const [u64; 3] as u64;
        let third = &*chain[2] as *const [u64; 3] as u64;
        for guarded in [false, true] {
            let (whole, cut) = std::thread::scope(|s| {
                s.spawn(|| {
                    if guarded {
                        deadline::guard_this_thread();
                    }
                    let mut out = Vec::new();
                    let whole = mem.read_chain(first, SHAPE, &mut out).ok().map(|next| (next, ids(&out)));
                    let cut = mem.read_chain(first, Chain { max: 2, ..SHAPE }, &mut out).ok().map(|next| (next, ids(&out)));
                    (whole, cut)
                })
                .join()
                .unwrap_or((None, None))
            });
            assert_eq!(whole, Some((0, vec![0, 1, 2, 3, 4])), "guarded: {guarded}");
            assert_eq!(cut, Some((third, vec![0, 1])), "guarded: {guarded}");
        }
    }

    /// A link to memory that cannot be read ends the chain there (its address returned, so
    /// the next read says why); a first record that cannot be read is an error; shapes
    /// whose link is outside the record, or past `MAX_READ` in all, are refused.
    #[test]
    fn unreadable_links_and_bad_shapes() {
        let mem = ProcessMemory::new(std::process::id());
        let unmapped = 8u64; // the first page is never mapped
        let chain = records(3, unmapped);
        let first = &*chain[0] as *const [u64; 3] as u64;
        let mut out = Vec::new();
        assert_eq!(mem.read_chain(first, SHAPE, &mut out).ok(), Some(unmapped));
        assert_eq!(ids(&out), [0, 1, 2]);
        assert!(matches!(mem.read_chain(unmapped, SHAPE, &mut out), Err(MemoryError::Read { .. })));
        assert!(out.is_empty());
        assert!(matches!(mem.read_chain(0, SHAPE, &mut out), Err(MemoryError::Null)));
        assert!(matches!(mem.read_chain(first, Chain { link: 20, ..SHAPE }, &mut out), Err(MemoryError::TooLarge { .. })));
        assert!(matches!(mem.read_chain(first, Chain { max: MAX_READ, ..SHAPE }, &mut out), Err(MemoryError::TooLarge { .. })));
        // The budget is charged one read per record, before reading.
        let (result, used) = with_read_budget(ReadBudget { reads: 2, bytes: 1 << 20, exhausted: false }, || {
            mem.read_chain(first, SHAPE, &mut out).map(|_| ids(&out))
        });
        assert_eq!(result.ok(), Some(vec![0, 1]));
        assert!(used.exhausted);
    }
}
