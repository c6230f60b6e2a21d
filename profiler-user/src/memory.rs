//! Reads of a target process's memory (`process_vm_readv`).
//!
//! Every byte read here is untrusted: callers bound lengths and check what they read.
//! Reads are counted (calls and bytes) for `--stats`.

use std::sync::atomic::{AtomicU64, Ordering};

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
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: address as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: `local` describes `buf`, which is valid for writes of its length; the kernel
        // checks the remote range and fails without touching our memory if it is not mapped.
        let got = unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        READS.fetch_add(1, Ordering::Relaxed);
        if got < 0 {
            return Err(MemoryError::Read {
                pid: self.pid,
                address,
                len: buf.len(),
                source: std::io::Error::last_os_error(),
            });
        }
        BYTES_READ.fetch_add(got as u64, Ordering::Relaxed);
        if got as usize != buf.len() {
            return Err(MemoryError::Short { pid: self.pid, address, len: buf.len(), got: got as usize });
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
