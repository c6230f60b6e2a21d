//! The kernel's native unwinder (`--native`): unwind rows built by userspace from each file's
//! `.eh_frame`, the per-process list of executable mappings that points into them, and how
//! the walked frames travel in a `CPU_SAMPLE_NATIVE` record.
//!
//! Userspace writes rows into the array map `UNWIND_ROWS` (an extent per file, shared by
//! every process mapping the file) and a [`UnwindProcess`] per process into
//! `UNWIND_PROCESSES`; the sampling program walks from the thread's registers with them and
//! appends one [`WALKED_FRAME_SIZE`]-byte entry per frame. Invariant: an extent is written
//! whole before any `UnwindProcess` points at it, and reused only after no process has
//! pointed at it for a grace period.

/// Rows of a file whose rules cover `[pc, next row's pc)`; `pc` is a file address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    /// The CFA's offset from its register (`cfa_kind`).
    pub cfa_offset: u16,
    /// `cfa_kind` in the low four bits, `rbp_kind` in the high four.
    pub kinds: u8,
    /// Where the caller's `rbp` was saved, in 8-byte words from the CFA (`rbp_kind::AT_CFA`).
    pub rbp_words: i8,
}

impl UnwindRow {
    pub const fn new(pc: u32, cfa: u8, cfa_offset: u16, rbp: u8, rbp_words: i8) -> Self {
        Self { pc, cfa_offset, kinds: (cfa & 15) | (rbp << 4), rbp_words }
    }
    pub const fn cfa_kind(&self) -> u8 {
        self.kinds & 15
    }
    pub const fn rbp_kind(&self) -> u8 {
        self.kinds >> 4
    }
}

/// Where the canonical frame address is (`UnwindRow::cfa_kind`).
pub mod cfa_kind {
    /// No unwind information covers the address.
    pub const NONE: u8 = 0;
    /// `rsp + cfa_offset`.
    pub const RSP: u8 = 1;
    /// `rbp + cfa_offset`.
    pub const RBP: u8 = 2;
    /// The `.plt` stubs' expression: `rsp + 8`, plus 8 past the stub's push (`rip & 15 >= 11`).
    pub const PLT: u8 = 3;
    /// A rule the walk does not follow.
    pub const UNSUPPORTED: u8 = 4;
    /// The return address is undefined: the outermost frame.
    pub const OUTERMOST: u8 = 5;
    /// Not in any file's rows: the kernel's own marker for a mapping walked with frame
    /// pointers (`rbp + 16` is the CFA, the caller's `rbp` at `rbp`).
    pub const FRAME_POINTERS: u8 = 6;
}

/// Where the caller's `rbp` is (`UnwindRow::rbp_kind`).
pub mod rbp_kind {
    /// Unchanged by this frame.
    pub const SAME: u8 = 0;
    /// Saved at `CFA + 8 * rbp_words`.
    pub const AT_CFA: u8 = 1;
    /// Unknown: the walk goes on, but no later frame may compute its CFA from `rbp`.
    pub const UNKNOWN: u8 = 2;
}

/// One executable mapping of a process: `file address = address - bias`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindModule {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    /// Its file's rows: `UNWIND_ROWS[first_row .. first_row + rows]`.
    pub first_row: u32,
    pub rows: u32,
    /// One of `module_state`.
    pub state: u32,
    pub _pad: u32,
}

/// Whether a mapping's rows can be used (`UnwindModule::state`).
pub mod module_state {
    /// Its rows are in `UNWIND_ROWS`.
    pub const READY: u32 = 0;
    /// Its file is still being read, or its rows are not written yet.
    pub const LOADING: u32 = 1;
    /// Its file has no usable table (none, refused, or no room in `UNWIND_ROWS`): frame
    /// pointers are followed instead (`rbp + 16` is the CFA, the caller's `rbp` at `rbp`).
    pub const FRAME_POINTERS: u32 = 2;
}

/// Executable mappings kept per process (sorted by start).
pub const MAX_UNWIND_MODULES: usize = 128;

/// The value of `UNWIND_PROCESSES` (by tgid).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UnwindProcess {
    pub count: u32,
    pub _pad: u32,
    pub modules: [UnwindModule; MAX_UNWIND_MODULES],
}

impl Default for UnwindProcess {
    fn default() -> Self {
        Self { count: 0, _pad: 0, modules: [UnwindModule::default(); MAX_UNWIND_MODULES] }
    }
}

/// Native frames the kernel walks at most per sample.
pub const MAX_WALKED_FRAMES: usize = 128;

/// Bytes per walked frame in a record: the instruction pointer (u64; a return address for
/// every frame but the first), then the frame's CFA as an offset from the trailer's `sp`
/// (u32; 0 when unknown, for the frame the walk stopped in).
pub const WALKED_FRAME_SIZE: usize = 12;

/// Why the kernel's walk ended (`NativeTrailer::walk_end`; 0: the record holds a stack
/// copy instead, `--native-walk copy`).
pub mod walk_end {
    pub const COPY: u32 = 0;
    /// The return address was 0: the outermost frame.
    pub const OUTERMOST: u32 = 1;
    /// The address is in no executable mapping known to the kernel.
    pub const NO_MODULE: u32 = 2;
    /// The mapping's table is not loaded yet (or the process's mappings are not known yet).
    pub const LOADING: u32 = 3;
    /// No unwind row covers the address.
    pub const NO_ROW: u32 = 4;
    /// A rule the walk does not follow.
    pub const UNSUPPORTED: u32 = 5;
    /// A stack word did not read.
    pub const READ_FAULT: u32 = 6;
    /// The CFA did not move up the stack.
    pub const NOT_GROWING: u32 = 7;
    /// `MAX_WALKED_FRAMES` were walked.
    pub const DEPTH: u32 = 8;
    /// The process's mapping list is not in the kernel yet.
    pub const NO_PROCESS: u32 = 9;
    /// The walk could not start (`LOADING` or `NO_PROCESS`): the record holds a copy of the
    /// stack instead, as with `COPY`, for userspace to unwind once it has read the files.
    pub const COPY_WHILE_LOADING: u32 = 10;
    /// Highest value.
    pub const LAST: u32 = 10;

    /// Whether the user part of a record with this end is a stack copy (else walked frames).
    pub const fn is_copy(end: u32) -> bool {
        end == COPY || end == COPY_WHILE_LOADING
    }
}
