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
