//! Byte budgets for reading a module file (`--native`).
//!
//! Every size in an ELF file is the file's word, and a sparse file can claim gigabytes at no
//! cost to whoever made it (a one-page mapping of a file whose `.symtab` claims 2 GiB took
//! `record --native` to 1.6 GB resident). So a module file is never parsed whole: only its
//! headers are read first, and every later read (section table, symbol and string tables,
//! unwind sections, DWARF) is asked of a [`FileBudget`] before any byte is read:
//!
//! - a table larger than its own cap (`MAX_*` in `module_file`, each far above real
//!   libraries) is refused;
//! - a table larger than what the file really has on disk is refused: its allowance is
//!   [`ALLOCATED_FACTOR`] times the file's allocated bytes (`st_blocks`, which a sparse file
//!   does not have; the factor leaves room for file systems that compress) plus
//!   [`ALLOCATED_SLACK`];
//! - all reads of one file together stay within [`MAX_FILE_READ_BYTES`] and that allowance.
//!
//! A refused table is treated as absent (a refused symbol table: frames show
//! `library+0xOFFSET`; refused unwind sections: the file is not used) and counted by reason
//! for `--stats` ([`report`]). Reads are `pread`s into buffers of exactly the size asked:
//! nothing is cached beyond what the caller keeps.

use std::{
    fs::File,
    os::unix::fs::{FileExt, MetadataExt},
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

/// Bytes read from one module file at most, all reads together.
pub const MAX_FILE_READ_BYTES: u64 = 96 << 20;
/// A table may claim at most this many times the file's allocated bytes.
pub const ALLOCATED_FACTOR: u64 = 8;
/// ... plus this (a small file stored inline, or a file system that reports no blocks).
pub const ALLOCATED_SLACK: u64 = 1 << 20;

/// Why a read was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The table claims more than its cap.
    OverCap,
    /// The table claims more than the file has on disk (sparse, or not that long).
    PastAllocated,
    /// The file's read budget is spent by earlier tables.
    BudgetSpent,
    /// Counts in the headers (sections, segments, symbols) past their cap.
    TooMany,
    /// DWARF line programs (or the inline calls around them) past their row budget.
    LineRows,
    /// What would be kept of the file passes its share of the cache (symbols and lines
    /// then left out; unwind data alone still over: the file is not used).
    OverShare,
    /// The kernel walk's rows (`.eh_frame`, or `.debug_frame` in a file without `.eh_frame`
    /// rows, past `MAX_TABLE_ROWS` address ranges, code above 4 GiB, or CFI that does not
    /// parse): the file is walked with frame pointers.
    UnwindRows,
    /// The rows of `.debug_frame` refused (as `UnwindRows`) in a file whose `.eh_frame` rows
    /// are kept: the ranges only `.debug_frame` describes end the walk (no unwind rows).
    DebugFrameRows,
}

const REASONS: usize = 8;
static REFUSED: [AtomicU64; REASONS] = [const { AtomicU64::new(0) }; REASONS];

impl Refusal {
    fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        match self {
            Refusal::OverCap => "over their cap",
            Refusal::PastAllocated => "larger than the file on disk",
            Refusal::BudgetSpent => "past the file's read budget",
            Refusal::TooMany => "too many headers or symbols",
            Refusal::LineRows => "line programs past their row budget",
            Refusal::OverShare => "past a file's share of the cache",
            Refusal::UnwindRows => "unwind rows the kernel walk cannot use (walked with frame pointers)",
            Refusal::DebugFrameRows => ".debug_frame rows the kernel walk cannot use (.eh_frame rows alone)",
        }
    }

    /// Counts one refusal (for `--stats`).
    pub fn count(self) {
        REFUSED[self.index()].fetch_add(1, Relaxed);
    }
}

/// Refusals so far, by reason.
pub fn refused(reason: Refusal) -> u64 {
    REFUSED[reason.index()].load(Relaxed)
}

/// Tables refused so far, all reasons.
pub fn refused_total() -> u64 {
    REFUSED.iter().map(|r| r.load(Relaxed)).sum()
}

/// The `--stats` words: `N refused (a over their cap, b larger than the file on disk, ...)`.
pub fn report() -> String {
    let reasons = [
        Refusal::OverCap,
        Refusal::PastAllocated,
        Refusal::BudgetSpent,
        Refusal::TooMany,
        Refusal::LineRows,
        Refusal::OverShare,
        Refusal::UnwindRows,
        Refusal::DebugFrameRows,
    ];
    let parts: Vec<String> =
        reasons.iter().filter(|r| refused(**r) > 0).map(|r| format!("{} {}", refused(*r), r.describe())).collect();
    if parts.is_empty() {
        "0 tables refused".to_string()
    } else {
        format!("{} tables refused ({})", refused_total(), parts.join(", "))
    }
}

/// The read budget of one file. Invariant: `spent <= limit`.
#[derive(Debug)]
pub struct FileBudget {
    /// The file's length (reads past it are refused).
    len: u64,
    /// Bytes the file may be read for, all reads together.
    limit: u64,
    /// Whether `limit` comes from the file's allocated size (else from the fixed cap).
    limit_is_allocated: bool,
    spent: u64,
}

impl FileBudget {
    /// The budget of a file `len` bytes long with `allocated` bytes on disk.
    pub fn new(len: u64, allocated: u64) -> FileBudget {
        let allowance = allocated.saturating_mul(ALLOCATED_FACTOR).saturating_add(ALLOCATED_SLACK);
        FileBudget { len, limit: allowance.min(MAX_FILE_READ_BYTES), limit_is_allocated: allowance < MAX_FILE_READ_BYTES, spent: 0 }
    }

    /// The budget of an open file (from `fstat`: its size and `st_blocks`).
    pub fn of(file: &File) -> std::io::Result<FileBudget> {
        let meta = file.metadata()?;
        Ok(FileBudget::new(meta.len(), meta.blocks().saturating_mul(512)))
    }

    /// Asks for `size` bytes at `offset` of a table whose cap is `cap`: charged when granted,
    /// refused (and counted) when it passes the cap, the file's end or allowance, or what is
    /// left of the budget.
    pub fn grant(&mut self, offset: u64, size: u64, cap: u64) -> Result<(), Refusal> {
        let refusal = if size > cap {
            Some(Refusal::OverCap)
        } else if offset.checked_add(size).is_none_or(|end| end > self.len) {
            Some(Refusal::PastAllocated)
        } else if self.spent.saturating_add(size) > self.limit {
            Some(if self.limit_is_allocated { Refusal::PastAllocated } else { Refusal::BudgetSpent })
        } else {
            None
        };
        match refusal {
            Some(r) => {
                r.count();
                Err(r)
            }
            None => {
                self.spent += size;
                Ok(())
            }
        }
    }

    /// Bytes granted so far.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// Reads `size` bytes at `offset` of `file` once [`grant`](Self::grant)ed. A short or
    /// failed read is `None` (not counted as a refusal: the file changed or failed).
    pub fn read(&mut self, file: &File, offset: u64, size: u64, cap: u64) -> Result<Option<Vec<u8>>, Refusal> {
        self.grant(offset, size, cap)?;
        let Ok(size) = usize::try_from(size) else { return Ok(None) };
        let mut buffer = vec![0u8; size];
        Ok(file.read_exact_at(&mut buffer, offset).ok().map(|()| buffer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_over_its_cap_is_refused_before_anything_is_read() {
        let mut b = FileBudget::new(1 << 40, 1 << 40);
        assert_eq!(b.grant(0, 2 << 30, 64 << 20), Err(Refusal::OverCap));
        assert_eq!(b.spent(), 0);
        assert_eq!(b.grant(0, 4096, 64 << 20), Ok(()));
        assert_eq!(b.spent(), 4096);
    }

    /// The reported case: a sparse file (one page on disk) whose `.symtab` claims 2 GiB, and
    /// tables within their caps that the file does not have on disk.
    #[test]
    fn a_sparse_file_gets_only_what_it_has_on_disk() {
        let page = 4096;
        let mut b = FileBudget::new(8 << 30, page);
        assert_eq!(b.grant(0, 2 << 30, u64::MAX), Err(Refusal::PastAllocated));
        // 8 x 4 KiB + 1 MiB may be read, not one byte more.
        let allowance = ALLOCATED_FACTOR * page + ALLOCATED_SLACK;
        assert_eq!(b.grant(0, allowance, u64::MAX), Ok(()));
        assert_eq!(b.grant(0, 1, u64::MAX), Err(Refusal::PastAllocated));
    }

    #[test]
    fn reads_past_the_end_or_the_file_budget_are_refused() {
        let mut b = FileBudget::new(1000, 1 << 40);
        assert_eq!(b.grant(900, 200, u64::MAX), Err(Refusal::PastAllocated));
        assert_eq!(b.grant(u64::MAX, 2, u64::MAX), Err(Refusal::PastAllocated));
        let mut b = FileBudget::new(1 << 40, 1 << 40);
        assert_eq!(b.grant(0, MAX_FILE_READ_BYTES - 10, u64::MAX), Ok(()));
        assert_eq!(b.grant(0, 11, u64::MAX), Err(Refusal::BudgetSpent));
        assert_eq!(b.grant(0, 10, u64::MAX), Ok(()));
        assert_eq!(b.spent(), MAX_FILE_READ_BYTES);
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let before = refused(Refusal::OverCap);
        let mut b = FileBudget::new(10, 10);
        let _ = b.grant(0, 11, 5);
        assert!(refused(Refusal::OverCap) > before);
        assert!(report().contains("over their cap"), "{}", report());
    }
}
