//! Types shared by the kernel program (`profiler-ebpf`) and userspace (`profiler-user`).
//!
//! Everything here is `#[repr(C)]` plain data: the same bytes are written by one side and
//! read by the other, through a BPF map (`ProcessInfo`) or the ring buffer (`SampleHeader`
//! followed by `FrameEntry` values). Per-version interpreter layouts are *numbers* carried in
//! `ProcessInfo`; the kernel program has no knowledge of Python versions.
#![no_std]

mod record;
mod task_chain;
mod unwind;
pub use record::*;
pub use task_chain::*;
pub use unwind::*;

/// Frames a sample carries in full (code, instruction offset, owner). Frames below these are
/// only counted and hashed by the kernel; userspace completes them (see `tail_hash`).
pub const MAX_FULL_FRAMES: usize = 64;
/// Frames the kernel walks below the full ones, hashing each. A walk longer than
/// `MAX_FULL_FRAMES + MAX_HASHED_FRAMES` ends with `SampleStatus::Truncated`.
pub const MAX_HASHED_FRAMES: usize = 2048;
/// Thread states examined when matching a thread by id (the fallback lookup).
pub const MAX_THREAD_SCAN: usize = 64;
/// `--mode exception`: items of a thread's exception-state chain followed (`exc_info`, then
/// `previous_item`). Each running generator or coroutine adds one, so this is a thread 511
/// generators deep handling an exception from below them all; CPython's own cases need 10.
/// One read of at most 32 bytes per item (about 70 ns): at most about 40 us per sample, the
/// cost of walking some 2,500 frames.
pub const MAX_EXCEPTION_ITEMS: usize = 512;
/// Bytes read per exception-state item: `_PyErr_StackItem` is 32 bytes on 3.8-3.10
/// (`exc_type`, `exc_value`, `exc_traceback`, `previous_item`) and 16 on 3.11+ (`exc_value`,
/// `previous_item`), where the next 16 belong to the object holding the item (a generator or
/// the thread state), so they are readable too.
pub const EXCEPTION_ITEM_READ: usize = 32;
/// Upper bound on bytes read per frame (`FrameLayout::read_size`).
pub const FRAME_READ_MAX: usize = 128;
/// Marks an absent field in a layout.
pub const NO_FIELD: u32 = u32::MAX;

/// How the kernel finds a thread's `PyThreadState`.
pub mod tstate_lookup {
    /// Only by scanning the interpreter's thread list for the current thread's id.
    pub const LIST: u32 = 0;
    /// glibc pthread TSD slot of `autoTSSkey` (3.8-3.14), then the list as fallback.
    pub const PTHREAD_KEY: u32 = 1;
    /// A thread-local word at `fsbase - tls_offset` (3.15 `_Py_tss_gilstate`), then the list.
    pub const TLS: u32 = 2;
}

/// How `FrameLayout::instr` encodes the position in the bytecode.
pub mod instr_kind {
    /// `int f_lasti` in bytes (3.8, 3.9).
    pub const LASTI_BYTES: u32 = 0;
    /// `int f_lasti` in 2-byte code units (3.10).
    pub const LASTI_UNITS: u32 = 1;
    /// A pointer into the code object's `co_code_adaptive` (3.11+).
    pub const POINTER: u32 = 2;
}

/// Where the fields of one interpreter frame are. All offsets are from the frame address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameLayout {
    /// Bytes read per frame; covers every offset below. At most `FRAME_READ_MAX`.
    pub read_size: u32,
    /// Pointer to the calling frame (`f_back` / `previous`).
    pub previous: u32,
    /// Pointer to the code object (`f_code` / `f_executable`), masked by `code_mask`.
    pub code: u32,
    /// The instruction position, encoded as `instr_kind`.
    pub instr: u32,
    /// One of `instr_kind`.
    pub instr_kind: u32,
    /// `u8` owner of the frame (3.11+), or `NO_FIELD`.
    pub owner: u32,
    /// Offset of `co_code_adaptive` in a code object (for `instr_kind::POINTER`).
    pub code_adaptive: u32,
    /// The validation word of each frame's code object (see [`code_check`]) is computed from
    /// one read of `check_size` bytes at `code + check_start` (the "window"), which covers
    /// `co_firstlineno`, `co_filename`, `co_name` and, where the version has it, `co_version`.
    /// Every 8-byte word of the window must be immutable for the code object's life.
    /// `check_size == 0` disables the word (it is then 0).
    pub check_start: u32,
    /// Bytes of the window: a multiple of 8, below `FRAME_READ_MAX`.
    pub check_size: u32,
    /// Offset of the `co_name` pointer in the window.
    pub check_name: u32,
    /// Offset of the `co_filename` pointer in the window.
    pub check_filename: u32,
    /// Offset in the window of a `u32` that the interpreter sets once per code object from a
    /// counter and never reuses (`co_version`, 3.12+), or `NO_FIELD`. When present and non-zero
    /// the window alone identifies the code object and the strings are not read.
    pub check_version: u32,
    /// Offset in a `str` of its length; its cached hash follows (16 bytes read at once).
    pub check_str: u32,
    /// Frames whose owner is at least this are interpreter shims: their "code" is not a code
    /// object (None, or the trampoline), so they get no check. `NO_FIELD`: no shims.
    pub shim_owner: u32,
    /// Applied to the code pointer: clears the `_PyStackRef` tag bits in 3.14+.
    pub code_mask: u64,
    /// `bool is_entry` of the frame (3.11: the first frame of each evaluation-function call),
    /// read into `FrameEntry::flags` as `frame_flags::ENTRY`; or `NO_FIELD`. Inside `read_size`.
    pub is_entry: u32,
    /// `int32_t tlbc_index` of the frame (free-threaded 3.14+: which thread's copy of the
    /// bytecode `instr` points into), read into `FrameEntry::tlbc_index`; `NO_FIELD` or 0:
    /// none. Inside `read_size`.
    pub tlbc_index: u32,
    /// Code-object snapshots ([`CodeSnapshot`]): bytes of the code object copied (at most
    /// `SNAP_CODE_MAX`); 0 disables them. Offsets below are in the code object / its objects.
    pub snap_code_size: u32,
    /// Offset of the pointer to the `str` shown as the frame's name (`co_qualname`, or `co_name`
    /// where the version has no qualified name).
    pub snap_name: u32,
    /// Offset of the `co_filename` pointer.
    pub snap_filename: u32,
    /// Offset of the line table's pointer (`co_lnotab` / `co_linetable`, a `bytes`).
    pub snap_linetable: u32,
    /// Where a compact ASCII `str`'s characters start.
    pub snap_str_ascii: u32,
    /// Where a compact non-ASCII `str`'s characters start.
    pub snap_str_compact: u32,
    /// Offset of a `bytes` object's size, and of its data.
    pub snap_bytes_size: u32,
    pub snap_bytes_data: u32,
}

/// Bytes of a [`CodeSnapshot`]'s regions: the code object, its name, its file name, its line
/// table (each a power of two; an object larger than its region is not snapshot).
pub const SNAP_CODE_MAX: usize = 512;
pub const SNAP_NAME_MAX: usize = 512;
pub const SNAP_FILENAME_MAX: usize = 1024;
pub const SNAP_TABLE_MAX: usize = 65536;
/// Offsets of the regions in `CodeSnapshot::bytes`.
pub const SNAP_NAME_AT: usize = SNAP_CODE_MAX;
pub const SNAP_FILENAME_AT: usize = SNAP_NAME_AT + SNAP_NAME_MAX;
pub const SNAP_TABLE_AT: usize = SNAP_FILENAME_AT + SNAP_FILENAME_MAX;
pub const SNAP_BYTES: usize = SNAP_TABLE_AT + SNAP_TABLE_MAX;

/// A `record_kind::CODE_SNAPSHOT` record: what symbolization reads from one code object, copied
/// by the kernel while a sampled frame kept the code object alive (the thread stopped), so that
/// a code object freed before userspace reads the sample (a module's body, a class body, the
/// functions of a module dropped again) is still named. Sent once per code object and
/// validation word (the kernel remembers which it sent), before the first record whose frames
/// carry it. Each region holds the first `*_len` bytes of the object at `*_at` in the target,
/// copied at once: the code object (`FrameLayout::snap_code_size` bytes), the `str` of its name,
/// of its file name, and its line table's `bytes` object (header and data). Userspace decodes
/// them with the same checks as a read of live memory; a read outside the regions fails.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CodeSnapshot {
    /// What the regions hold (the fixed part of the record).
    pub head: CodeSnapshotHead,
    /// The regions at `0`, `SNAP_NAME_AT`, `SNAP_FILENAME_AT`, `SNAP_TABLE_AT`. A record
    /// ends after the line table's bytes.
    pub bytes: [u8; SNAP_BYTES],
}

/// The fixed part of a [`CodeSnapshot`]: the addresses its regions were copied from and how
/// many bytes of each it holds.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CodeSnapshotHead {
    /// `kind` is `record_kind::CODE_SNAPSHOT`; `tgid`, `generation`, `time_ns` as in samples.
    pub header: SampleHeader,
    pub code: u64,
    /// The code object's validation word ([`code_check`]) at the time of the copy.
    pub check: u32,
    pub code_len: u32,
    pub name_at: u64,
    pub name_len: u32,
    pub filename_len: u32,
    pub filename_at: u64,
    pub table_at: u64,
    pub table_len: u32,
    pub _pad: u32,
}

/// Bytes of a `CodeSnapshot` before its regions.
pub const CODE_SNAPSHOT_HEADER: usize = core::mem::size_of::<CodeSnapshotHead>();
const _: () = assert!(core::mem::size_of::<CodeSnapshot>() == CODE_SNAPSHOT_HEADER + SNAP_BYTES);

/// Bits of `FrameEntry::flags`.
pub mod frame_flags {
    /// The frame's `is_entry` is set (3.11; see `FrameLayout::is_entry`).
    pub const ENTRY: u8 = 1;
}

/// Where the fields of a `PyThreadState` (and what leads to it) are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadLayout {
    /// Offset of the current frame pointer (or of the `cframe` pointer, see below).
    pub frame: u32,
    /// When not `NO_FIELD`, `frame` points to a `_PyCFrame` and this is the frame pointer's
    /// offset in it (3.11, 3.12).
    pub cframe_frame: u32,
    /// `native_thread_id` (3.11+), compared with the kernel tid; or `NO_FIELD`.
    pub native_thread_id: u32,
    /// `thread_id` (`pthread_self()`, equal to fsbase on x86_64 glibc).
    pub thread_id: u32,
    /// `next` in the interpreter's thread list.
    pub next: u32,
    /// Offset of `threads.head` in `PyInterpreterState`.
    pub interp_threads_head: u32,
}

/// One registered process: the kernel map `PROCESSES` holds one per tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// One of `tstate_lookup`.
    pub tstate_lookup: u32,
    /// The `autoTSSkey` pthread key value (for `tstate_lookup::PTHREAD_KEY`).
    pub pthread_key: u32,
    /// For `tstate_lookup::TLS`: the tstate pointer is at `fsbase - tls_offset`.
    pub tls_offset: u64,
    /// glibc: offset of `specific_1stblock[0].data` in `struct pthread` (fsbase).
    pub tsd_first_block: u32,
    /// glibc: offset of the second-level `specific[]` pointer array in `struct pthread`.
    pub tsd_second_level: u32,
    /// Address of `_PyRuntime.interpreters.head` in the target.
    pub interpreters_head_addr: u64,
    pub thread: ThreadLayout,
    pub frame: FrameLayout,
    /// Set by userspace at registration, unique per registration, never 0: copied into every
    /// `SampleHeader` so that a sample is attributed to the registration (not merely the pid)
    /// it was taken under. A PID reused by another process never matches the old target.
    pub generation: u32,
    /// `gil_check::INTERP_HOLDER_IF_ENABLED`: offset in the interpreter of the GIL's `int
    /// enabled`; 0 otherwise.
    pub gil_enabled: u32,
    /// How to tell whether a thread holds the GIL (`--mode gil`): one of `gil_check`.
    pub gil_check: u32,
    /// `gil_check::INTERP_HOLDER`: offset in the interpreter of the `int` "GIL locked".
    pub gil_locked: u32,
    /// `RUNTIME_TSTATE`: address of the holder's tstate pointer; `INTERP_HOLDER`: its offset
    /// in the interpreter; `TSTATE_FLAG`: offset in the tstate of the `int` "holds the GIL".
    pub gil_holder: u64,
    /// Subinterpreters (3.13+): offset of `next` in `PyInterpreterState`, or `NO_FIELD` (then
    /// the kernel looks at the first interpreter's threads only and records no interpreter).
    /// When the process has more than one interpreter, a thread's own tstate in a
    /// subinterpreter is preferred over the one its thread-local slot holds (that one stays
    /// bound to the main interpreter while the thread runs code in a subinterpreter).
    pub interp_next: u32,
    /// Offset of `interp` in `PyThreadState`, or `NO_FIELD`: the thread's own interpreter,
    /// for subinterpreters (with `interp_next` and `interp_id`), for GIL waits
    /// (`gil_wait::INTERP_POINTER`: with per-interpreter GILs each has its own) and for the
    /// collector's flag (`gc_check::INTERP_FLAG`).
    pub tstate_interp: u32,
    /// Offset of the `int64_t id` in `PyInterpreterState` (with `interp_next`), or `NO_FIELD`
    /// for versions (3.8-3.12) whose subinterpreter API runs a thread on a thread state that
    /// belongs to another thread: then the kernel only tells that several interpreters exist
    /// (`SampleHeader::interpreter == INTERPRETER_UNKNOWN`) and prefers nothing.
    pub interp_id: u32,
    /// asyncio (`--async`, 3.14+): offset of `asyncio_running_task` in the thread state, read
    /// into `SampleHeader::running_task` at sample time; `NO_FIELD` (the default, and always
    /// without `--async`) records nothing. Userspace sets it once it found the `_asyncio`
    /// module's offsets, by registering the process again.
    pub running_task: u32,
    /// `--mode exception`: offset in the tstate of `exc_info` (the topmost
    /// `_PyErr_StackItem *`); 0 when the version's layout is not known (samples dropped).
    pub exc_info: u32,
    /// Offset in a `_PyErr_StackItem` of the word that says "handling": `exc_value` (3.11+)
    /// or `exc_type` (3.8-3.10).
    pub exc_handled: u32,
    /// Offset in a `_PyErr_StackItem` of `previous_item`.
    pub exc_previous: u32,
    pub _pad2: u32,
    /// Address of `_Py_NoneStruct`: a stack item holding None handles nothing.
    pub none_address: u64,
    /// Off-CPU reason `GIL_WAIT` (`--mode wall/off-cpu`): how to find the interpreter's
    /// `struct _gil_runtime_state`, one of `gil_wait`. A thread switched out asleep in a futex
    /// call whose address lies in that struct waits for the GIL.
    pub gil_wait_kind: u32,
    /// `sizeof(struct _gil_runtime_state)`: the futex addresses inside it are the GIL's.
    pub gil_wait_size: u32,
    /// `gil_wait::RUNTIME_ADDRESS`: the struct's address. `INTERP_POINTER`: offset in
    /// `PyInterpreterState` of the pointer to it (`ceval.gil`).
    pub gil_wait_at: u64,
    /// How to tell that the garbage collector runs (`SampleHeader::flags`' `sample_flags::GC`):
    /// one of `gc_check`.
    pub gc_check: u32,
    pub _pad3: u32,
    /// `gc_check::RUNTIME_FLAG`: address of the `int` "collecting"; `INTERP_FLAG`: its offset
    /// in `PyInterpreterState` (`gc.collecting`).
    pub gc_collecting: u64,
    /// How the kernel tells that no code object can have been replaced at an address since it
    /// last checked it (`code_generation`): one of `code_generation`.
    pub code_generation_kind: u32,
    /// Free-threaded builds: the offset of `tlbc_indices.tlbc_generation` (`uint32_t`) in
    /// `PyInterpreterState`, read into `SampleHeader::tlbc_generation`; 0 elsewhere.
    pub tlbc_generation: u32,
    /// `code_generation::CREATED_AT`: address of the `uint32_t` counter; `FREED_IN_INTERP`:
    /// offset in `PyInterpreterState` of the `uint64_t` counter.
    pub code_generation_at: u64,
    /// `--async`: what the kernel needs to read the running task's chain at sample time
    /// ([`TaskChain`]); not enabled by default.
    pub tasks: TaskLayout,
}

/// A counter in the target that changes whenever a code object may have been replaced at an
/// address (`ProcessInfo::code_generation_kind`). While it reads the same, a code object a
/// walk checked is still the one at its address, so its validation word is the same: the
/// kernel keeps the words it computed, per CPU, for as long as the counter stays put.
///
/// Why that is exact: a frame keeps its code object alive, so the object checked at address X
/// was alive then; a different object at X now must have been created after that one was
/// freed, i.e. after the check. Creating one bumps a creation counter before it can be used;
/// freeing one bumps a deallocation counter before its memory is released.
pub mod code_generation {
    /// No such counter known: every code object is checked by reading its window.
    pub const NONE: u32 = 0;
    /// 3.12: `_Py_next_func_version`, a process-wide `uint32_t` every new code object takes
    /// its `co_version` from and increments (it stops at 0 when exhausted: 0 proves nothing).
    pub const CREATED_AT: u32 = 1;
    /// 3.14+: `PyInterpreterState._code_object_generation` (`_Py_DebugOffsets`), a `uint64_t`
    /// that `code_dealloc` increments first; only used with one interpreter.
    pub const FREED_IN_INTERP: u32 = 2;
}

/// How the kernel finds the GIL's struct to tell a GIL wait (`ProcessInfo::gil_wait_kind`).
pub mod gil_wait {
    /// Not known (or no GIL): waits for the GIL show as `off_cpu_reason::SLEEP`.
    pub const UNKNOWN: u32 = 0;
    /// 3.8-3.11: one GIL for the process, `_PyRuntime.ceval.gil`, at a fixed address.
    pub const RUNTIME_ADDRESS: u32 = 1;
    /// 3.12+: the thread's interpreter points to the GIL it uses (`interp->ceval.gil`).
    pub const INTERP_POINTER: u32 = 2;
}

/// How a version says that its garbage collector is collecting (`ProcessInfo::gc_check`).
/// The flag is per runtime or per interpreter, not per thread: the kernel credits a sample to
/// the collector only when the flag reads exactly 1 *and* the sampled thread holds the GIL
/// (`gil_check`), which the collecting thread does throughout a collection.
pub mod gc_check {
    /// Not known (or no GIL to tell the collecting thread by): no sample is marked.
    pub const UNKNOWN: u32 = 0;
    /// 3.8: `_PyRuntime.gc.collecting`, at the address `ProcessInfo::gc_collecting`.
    pub const RUNTIME_FLAG: u32 = 1;
    /// 3.9+: `PyInterpreterState.gc.collecting` of the thread state's interpreter.
    pub const INTERP_FLAG: u32 = 2;
}

/// Slots of the kernel's `SAMPLE_SHARE` array (`--max-cpu`), written by userspace.
pub mod share_slot {
    /// The divisor: one CPU sample (and one switch-out walked) in this many; 0 or 1: all.
    pub const DIVISOR: u32 = 0;
    /// The scheduler-switch program's pauses: it is attached one time slice in this many
    /// (0 or 1: always), so a walked switch-out's weight is the divisor times this;
    /// [`DRAINING`] while a slice ends (no switch-out is walked, pending ones still end).
    pub const SWITCH_SLICES: u32 = 1;
    /// `SWITCH_SLICES` while the program drains before a pause.
    pub const DRAINING: u32 = u32::MAX;
    /// Number of slots.
    pub const SLOTS: u32 = 2;
}

/// Bits of `SampleHeader::flags`.
pub mod sample_flags {
    /// A CPU sample taken while the sampled thread ran the garbage collector (see `gc_check`).
    pub const GC: u32 = 1;
    /// Bits from here up: the sampled share's divisor in force when the CPU sample was taken
    /// (`SAMPLE_SHARE`: the kernel kept one sample in that many, at random), so the sample
    /// stands for that many samples at the requested rate; in an off-CPU record, the divisor
    /// in force at the switch-out (the kernel walked one switch-out in that many), so its
    /// interval stands for that many times its length. 0 (older records, no share) means 1.
    /// See [`weight`].
    pub const WEIGHT_SHIFT: u32 = 8;
    /// The largest divisor the flags can carry.
    pub const MAX_WEIGHT: u32 = u32::MAX >> WEIGHT_SHIFT;

    /// How many samples at the requested rate a CPU sample with these flags stands for
    /// (at least 1).
    pub const fn weight(flags: u32) -> u32 {
        let w = flags >> WEIGHT_SHIFT;
        if w == 0 { 1 } else { w }
    }
}

/// How a version tells which thread holds the GIL (`ProcessInfo::gil_check`).
pub mod gil_check {
    /// Not known for this version: `--mode gil` drops its samples (counted).
    pub const UNKNOWN: u32 = 0;
    /// 3.8-3.11: `_PyRuntime.gilstate.tstate_current` is the holder's tstate (NULL when free).
    pub const RUNTIME_TSTATE: u32 = 1;
    /// 3.12-3.14: the main interpreter's `_gil.locked` is set and `_gil.last_holder` is it.
    pub const INTERP_HOLDER: u32 = 2;
    /// 3.15: the tstate's own `holds_gil`.
    pub const TSTATE_FLAG: u32 = 3;
    /// Free-threaded 3.14: `INTERP_HOLDER` while the main interpreter's GIL is enabled (its
    /// `int` at `ProcessInfo::gil_enabled` not 0); while it is not, no thread holds a GIL and
    /// the sample is counted `counter::NO_GIL`.
    pub const INTERP_HOLDER_IF_ENABLED: u32 = 4;
}

/// Slots of the kernel program's per-CPU `COUNTERS` array.
pub mod counter {
    /// Samples of registered processes (records attempted).
    pub const SAMPLED: u32 = 0;
    /// Records that did not fit in the ring buffer.
    pub const RINGBUF_FULL: u32 = 1;
    /// Forks, execs and exits anywhere on the host: while this does not move, the set of
    /// processes is unchanged and userspace need not list /proc.
    pub const PROCESS_EVENTS: u32 = 2;
    /// Registered processes that exec'd: the kernel stopped sampling them (their layout no
    /// longer applies) and userspace must look at them again.
    pub const REGISTERED_EXECS: u32 = 3;
    /// Registered processes whose last thread exited: the kernel removed their entry from
    /// `PROCESSES` at once, so the slot is free and a reused PID is never sampled with it.
    pub const REGISTERED_EXITS: u32 = 4;
    /// Off-CPU intervals of registered threads that were walked and sent (`--mode wall/off-cpu`).
    pub const OFF_CPU_INTERVALS: u32 = 5;
    /// Off-CPU intervals shorter than `--min-off-cpu`: not sent, their time summed per thread.
    pub const OFF_CPU_SHORT: u32 = 6;
    /// Off-CPU intervals whose walked stack was not kept (more threads off at once than the
    /// kernel's slots): their time is summed per thread like short ones.
    pub const OFF_CPU_LOST: u32 = 7;
    /// `--mode gil`: samples dropped because the thread did not hold the GIL.
    pub const NOT_GIL_HOLDER: u32 = 8;
    /// `--mode gil`: samples dropped because the version cannot tell the GIL's holder.
    pub const GIL_UNKNOWN: u32 = 9;
    /// `--mode exception`: samples dropped because the thread handled no exception.
    pub const NOT_HANDLING_EXCEPTION: u32 = 10;
    /// `--mode exception`: samples dropped because the version's exception state is unknown.
    pub const EXCEPTION_UNKNOWN: u32 = 11;
    /// `--kernel` with off-CPU time: switch-outs whose kernel stack could not be kept (the
    /// stack map's slot held another stack, or the map was full); their interval is charged
    /// without kernel frames.
    pub const OFF_CPU_NO_KERNEL_STACK: u32 = 12;
    /// Code objects whose validation word a walk took from the kernel's per-CPU cache
    /// (`code_generation`: the target's counter had not moved since it was read).
    pub const CODE_CHECKS_CACHED: u32 = 13;
    /// Code objects whose validation word a walk read from the target.
    pub const CODE_CHECKS_READ: u32 = 14;
    /// Batches of off-CPU records sent to the ring buffer (`OffCpuBatch`).
    pub const OFF_CPU_BATCHES: u32 = 15;
    /// `--mode exception`: samples dropped because the thread's exception-state chain went on
    /// past the kernel's bound (`MAX_EXCEPTION_ITEMS`): neither kept nor counted as "not
    /// handling".
    pub const EXCEPTION_CHAIN_TOO_LONG: u32 = 16;
    /// Code-object snapshots sent (`CodeSnapshot`; lost ones are counted in `RINGBUF_FULL`).
    pub const CODE_SNAPSHOTS: u32 = 17;
    /// Code objects of sampled frames not snapshot: an object larger than its region, or
    /// unreadable.
    pub const CODE_SNAPSHOTS_SKIPPED: u32 = 18;
    /// `--mode gil`: samples of free-threaded processes running without a GIL (dropped).
    pub const NO_GIL: u32 = 19;
    /// Samples of registered processes not taken because of the sampled share
    /// (`--max-cpu`: the kernel keeps one in `SAMPLE_SHARE`'s divisor, at random).
    pub const SHARE_SKIPPED: u32 = 20;
    /// Switch-outs of registered threads not walked because of the sampled share
    /// (`--max-cpu` in `--mode wall`/`off-cpu`: the kernel walks one in `SAMPLE_SHARE`'s
    /// divisor, at random; the interval of one not walked is not sent).
    pub const SWITCH_SHARE_SKIPPED: u32 = 21;
    /// Off-CPU intervals dropped at a switch-in because their thread had arrived on a CPU
    /// since it switched out (its true end fell while the scheduler-switch program was
    /// paused, `--max-cpu`): charged to its end they would hold time it ran.
    pub const OFF_CPU_END_MISSED: u32 = 22;
    /// Number of slots.
    pub const SLOTS: u32 = 23;
}

/// Kinds of records in the `SAMPLES` ring buffer; every record starts with a `SampleHeader`
/// whose `kind` says how to read what follows the header and its full frames.
pub mod record_kind {
    /// A CPU-clock sample from the sampling program.
    pub const CPU_SAMPLE: u32 = 0;
    /// An off-CPU interval from the scheduler-switch programs: the thread's stack as it was
    /// while switched out, then (in the slot after the last full frame) an [`super::OffCpuInterval`].
    /// A ring-buffer item of this kind holds one or more such records, one after the other
    /// (a CPU's batch, [`super::OffCpuBatch`]).
    pub const OFF_CPU: u32 = 1;
    /// A CPU-clock sample with native context (`--native` / `--kernel`): the header and
    /// `n_full` frames as in `CPU_SAMPLE`, then a [`NativeTrailer`](super::NativeTrailer),
    /// then `kernel_stack_len` bytes of kernel return addresses (u64, leaf first), then
    /// `user_stack_len` bytes of the thread's user stack copied from `sp` upwards.
    pub const CPU_SAMPLE_NATIVE: u32 = 16;
    /// A [`CodeSnapshot`](super::CodeSnapshot): one code object's fields as the kernel copied them.
    pub const CODE_SNAPSHOT: u32 = 2;
    /// A [`TaskChain`](super::TaskChain): the running asyncio task's chain, sent right before
    /// the sample it belongs to.
    pub const TASK_CHAIN: u32 = 3;
}

/// Why a thread left the CPU (`OffCpuInterval::reason`).
pub mod off_cpu_reason {
    /// It blocked or slept (its state was not runnable when switched out).
    pub const SLEEP: u32 = 0;
    /// It was preempted while runnable.
    pub const PREEMPTED: u32 = 1;
    /// It blocked waiting for the GIL: asleep in a futex call on the interpreter's GIL struct
    /// (see `ProcessInfo::gil_wait_kind`).
    pub const GIL_WAIT: u32 = 2;
}

/// Trailer of an `record_kind::OFF_CPU` record, in the frame slot after its `n_full` frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuInterval {
    /// Length of the interval: from the switch out to the switch back in (`time_ns`).
    pub off_ns: u64,
    /// Time of the thread's intervals below the minimum since its last record (not walked),
    /// already weighted: each short interval's length times its own weight (see
    /// `sample_flags::weight`), so it is charged as it is.
    pub short_ns: u64,
    /// When the thread was switched out (kernel monotonic clock).
    pub switched_out_ns: u64,
    /// One of `off_cpu_reason`.
    pub reason: u32,
    /// `--kernel`: the kernel stack where the thread blocked, as its id in the kernel's
    /// `OFF_CPU_KERNEL_STACKS` map plus one; 0 when there is none.
    pub kernel_stack: u32,
}

/// Per-thread state of the scheduler-switch program: the first part of each value of the
/// kernel map `OFF_CPU_THREADS` (by tid), which the record walked at the thread's last
/// switch-out follows (`OFF_CPU_THREAD_SIZE` bytes in all).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSwitch {
    /// When the thread was last switched out; 0 while it runs (nothing to charge).
    pub switched_out_ns: u64,
    /// Time of short intervals not yet sent in a record (read by userspace at the end),
    /// weighted as `OffCpuInterval::short_ns`.
    pub short_ns: u64,
    pub tgid: u32,
    /// `ProcessInfo::generation` of the registration the time belongs to.
    pub generation: u32,
    /// One of `off_cpu_reason`, for the pending interval.
    pub reason: u32,
    /// `OffCpuInterval::kernel_stack` of the pending interval.
    pub kernel_stack: u32,
    /// When the thread's first switch seen under this registration was a switch-in (it was
    /// already switched out when its process was registered): the time of that switch-in.
    /// 0 when its first switch seen was a switch-out (it was running). No entry for the
    /// registration at all: no switch of the thread was seen since it was registered.
    pub first_in_ns: u64,
    /// The thread's arrivals on a CPU (`task_struct.sched_info.pcount`) when its pending
    /// interval began: its switch-in ends that interval only if it has not arrived since
    /// (the scheduler-switch program may be detached for a while, `--max-cpu`'s pauses).
    /// 0 when the kernel's BTF did not give the field.
    pub arrivals: u64,
    /// With `first_in_ns`: the thread's arrivals on a CPU just before that switch-in (the
    /// count does not include it yet). Equal to a count userspace read after the registration,
    /// it proves the thread did not run between that read and this switch-in, even across a
    /// pause of the program. 0 when the kernel's BTF did not give the field.
    pub first_in_arrivals: u64,
}

/// Outcome of one kernel walk.
pub mod sample_status {
    /// The walk reached the bottom frame (`previous == NULL`).
    pub const COMPLETE: u32 = 0;
    /// No `PyThreadState` was found for the thread (not a Python thread, or not yet).
    pub const NO_THREAD_STATE: u32 = 1;
    /// The thread state has no current frame (a thread not running Python code).
    pub const NO_FRAME: u32 = 2;
    /// The chain was longer than the kernel walks.
    pub const TRUNCATED: u32 = 3;
    /// Reading a frame failed (page not present, or a torn chain).
    pub const READ_FAULT: u32 = 4;
}

/// Start of every ring-buffer record; `n_full` `FrameEntry` values follow, leaf first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleHeader {
    pub time_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// One of `sample_status`.
    pub status: u32,
    /// Frames that follow this header in full.
    pub n_full: u32,
    /// Frames walked below the full ones, folded into `tail_hash`.
    pub n_hashed: u32,
    pub thread_state: u64,
    /// Address of the first hashed frame (the caller of the last full frame), or 0.
    pub tail_first: u64,
    /// `frame_hash` folded over the hashed frames, starting from `HASH_SEED`.
    pub tail_hash: u64,
    /// `ProcessInfo::generation` of the registration this sample was taken under.
    pub generation: u32,
    /// What the record is: one of `record_kind`. Userspace drops kinds it does not know.
    pub kind: u32,
    /// The id of the interpreter the thread state belongs to, plus 1, when the process had
    /// more than one interpreter at sample time (`ProcessInfo::interp_next`); 0 otherwise;
    /// `INTERPRETER_UNKNOWN` when it had several but the layout has no `interp_id`.
    pub interpreter: u64,
    /// The thread's running asyncio task (0: none) when `ProcessInfo::running_task` is set,
    /// else `RUNNING_TASK_UNKNOWN`.
    pub running_task: u64,
    /// Bits of `sample_flags`: in CPU samples; in off-CPU records only the weight (0 when 1);
    /// 0 in other records.
    pub flags: u32,
    /// Free-threaded builds: the thread's interpreter's bytecode-copy generation
    /// (`tlbc_indices.tlbc_generation`) as this sample read it, when
    /// `ProcessInfo::tlbc_generation` is set; 0 otherwise (not read, or unreadable).
    pub tlbc_generation: u32,
}

/// `SampleHeader::running_task` when the kernel did not record it.
pub const RUNNING_TASK_UNKNOWN: u64 = u64::MAX;

/// `SampleHeader::interpreter` of a process with several interpreters whose ids (and thread
/// states) cannot be trusted.
pub const INTERPRETER_UNKNOWN: u64 = u64::MAX;

/// One frame as the kernel read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FrameEntry {
    /// Frame address.
    pub frame: u64,
    /// Code object address (tag bits cleared). May be a non-code object for shims.
    pub code: u64,
    /// Byte offset of the instruction in the code (meaning depends on the version; see the
    /// userspace layout). `i32::MIN` when it could not be computed.
    pub instr_offset: i32,
    /// Validation word of the code object ([`code_check`]), for every frame the kernel walks
    /// (full frames carry it; hashed frames fold it into the tail hash). 0 for shims and when
    /// the code object could not be read.
    pub check: u32,
    /// Frame owner (3.11+), or `u8::MAX` when the version has no owner field.
    pub owner: u8,
    /// `frame_flags` bits.
    pub flags: u8,
    pub _pad: [u8; 2],
    /// The frame's `tlbc_index` (free-threaded builds, see `FrameLayout::tlbc_index`): 0 is
    /// the code object's own bytecode, where `instr_offset` is exact; another index means
    /// `instr_offset` is relative to `co_code_adaptive` although the frame runs the thread's
    /// copy, and userspace rebases it. Always 0 on other builds.
    pub tlbc_index: u32,
}

/// Bytes of user stack the kernel copies at most per sample (`--native-stack-bytes`).
pub const MAX_NATIVE_STACK_BYTES: usize = 16384;
/// Kernel frames recorded at most per sample (`--kernel`); the kernel's own limit is 127.
pub const MAX_KERNEL_FRAMES: usize = 127;

/// Where the user registers of a native sample came from.
pub mod native_regs {
    /// The interrupt hit user mode: the perf event's registers.
    pub const FROM_CONTEXT: u32 = 1;
    /// The interrupt hit kernel mode (a syscall, a fault): the task's saved user registers.
    pub const FROM_TASK: u32 = 2;
    /// No user registers could be read (no stack copy follows).
    pub const NONE: u32 = 0;
}

/// Native context of a `record_kind::CPU_SAMPLE_NATIVE` record, after its full frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeTrailer {
    /// User instruction pointer, stack pointer and frame pointer (rbp) of the thread.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of kernel return addresses that follow (a multiple of 8; 0 without `--kernel`,
    /// or when the interrupt hit user mode).
    pub kernel_stack_len: u32,
    /// Bytes of user stack that follow the kernel addresses (copied from `sp`).
    pub user_stack_len: u32,
    /// One of `native_regs`.
    pub regs: u32,
    /// How the user part reads: `walk_end::COPY`, a copy of the user stack; else the frames
    /// the kernel walked (`WALKED_FRAME_SIZE` bytes each) and why the walk ended.
    pub walk_end: u32,
}

pub const NATIVE_TRAILER_SIZE: usize = core::mem::size_of::<NativeTrailer>();

pub const SAMPLE_HEADER_SIZE: usize = core::mem::size_of::<SampleHeader>();
pub const FRAME_ENTRY_SIZE: usize = core::mem::size_of::<FrameEntry>();
/// The largest record the kernel writes (the full frames and one trailer slot).
pub const MAX_RECORD_SIZE: usize = SAMPLE_HEADER_SIZE + (MAX_FULL_FRAMES + 1) * FRAME_ENTRY_SIZE;
/// Bytes of a value of the kernel map `OFF_CPU_THREADS`: a [`ThreadSwitch`], then a record of
/// `MAX_RECORD_SIZE` bytes.
pub const OFF_CPU_THREAD_SIZE: usize = core::mem::size_of::<ThreadSwitch>() + MAX_RECORD_SIZE;

/// Slots of the kernel map `REGISTERED_HINT`: slot `tgid % REGISTERED_HINT_SLOTS` is not 0
/// once a process with such a tgid was registered (userspace sets it before it inserts the
/// process into `PROCESSES` and never clears it), so a switch of a thread whose slot is 0
/// belongs to no registered process and needs no `PROCESSES` lookup.
pub const REGISTERED_HINT_SLOTS: u32 = 4096;

/// Bytes of `record_kind::OFF_CPU` records one CPU gathers before it sends them to the ring
/// buffer as one item (a power of two).
pub const OFF_CPU_BATCH_BYTES: usize = 4096;

/// A CPU's batch of off-CPU records not sent yet: the value of the kernel map
/// `OFF_CPU_BATCH` (per CPU). `bytes[..len]` holds `records` whole records, one after the
/// other, each [`off_cpu_record_len`] bytes long; a ring-buffer item of kind `OFF_CPU` is
/// such a run of records too.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OffCpuBatch {
    /// Bytes used (at most `OFF_CPU_BATCH_BYTES`).
    pub len: u32,
    pub records: u32,
    /// Kernel time of the first record's switch-in (what the batch's age is counted from).
    pub first_ns: u64,
    /// Room for a record of `MAX_RECORD_SIZE` at any offset below `OFF_CPU_BATCH_BYTES`.
    pub bytes: [u8; OFF_CPU_BATCH_BYTES + MAX_RECORD_SIZE],
}

/// Bytes of an off-CPU record with `n_full` full frames: the header, the frames (at most
/// `MAX_FULL_FRAMES`) and the `OffCpuInterval` trailer's slot.
pub const fn off_cpu_record_len(n_full: u32) -> usize {
    let n = if n_full as usize > MAX_FULL_FRAMES { MAX_FULL_FRAMES } else { n_full as usize };
    SAMPLE_HEADER_SIZE + (n + 1) * FRAME_ENTRY_SIZE
}

/// The bytes of one frame as read from the target (`FrameLayout::read_size` of them, the rest
/// zero), with room for an 8-byte field at any masked offset.
pub type FrameBytes = [u8; FRAME_READ_MAX + 8];

/// Decodes one frame read at address `frame` into `entry`; returns the previous frame's
/// address. Kernel and userspace share this, so both see a frame the same way.
#[inline(always)]
pub fn decode_frame(layout: &FrameLayout, frame: u64, buf: &FrameBytes, entry: &mut FrameEntry) -> u64 {
    let code = field_u64(buf, layout.code) & layout.code_mask;
    let instr_offset = match layout.instr_kind {
        instr_kind::LASTI_BYTES => field_u64(buf, layout.instr) as u32 as i32,
        instr_kind::LASTI_UNITS => (field_u64(buf, layout.instr) as u32 as i32).wrapping_mul(2),
        _ => {
            let pointer = field_u64(buf, layout.instr);
            pointer.wrapping_sub(code).wrapping_sub(layout.code_adaptive as u64) as i64 as i32
        }
    };
    entry.frame = frame;
    entry.code = code;
    entry.instr_offset = instr_offset;
    entry.owner = if layout.owner == NO_FIELD { u8::MAX } else { field_u64(buf, layout.owner) as u8 };
    entry.flags = if layout.is_entry != NO_FIELD && field_u64(buf, layout.is_entry) as u8 != 0 { frame_flags::ENTRY } else { 0 };
    entry.tlbc_index =
        if layout.tlbc_index == NO_FIELD || layout.tlbc_index == 0 { 0 } else { field_u64(buf, layout.tlbc_index) as u32 };
    entry.check = 0;
    field_u64(buf, layout.previous)
}

/// Whether the frame's code object gets a validation word at all: not for shims (their
/// "code" is None or a trampoline), not without a code pointer or a window.
#[inline(always)]
pub fn code_check_applies(layout: &FrameLayout, entry: &FrameEntry) -> bool {
    let shim = layout.shim_owner != NO_FIELD && entry.owner != u8::MAX && entry.owner as u32 >= layout.shim_owner;
    !shim && entry.code != 0 && layout.check_size != 0
}

/// Bytes of the check window to read (masked so the BPF verifier sees the bound).
#[inline(always)]
pub fn code_check_size(layout: &FrameLayout) -> u32 {
    layout.check_size & (FRAME_READ_MAX as u32 - 1)
}

/// Whether [`code_check`] needs the `str` reads: the window has no per-object version, or it
/// reads 0 (the interpreter's counter ran out).
#[inline(always)]
pub fn code_check_needs_strings(layout: &FrameLayout, window: &FrameBytes) -> bool {
    layout.check_version == NO_FIELD || field_u64(window, layout.check_version) as u32 == 0
}

/// The `co_name` and `co_filename` pointers in a window.
#[inline(always)]
pub fn code_check_strings(layout: &FrameLayout, window: &FrameBytes) -> (u64, u64) {
    (field_u64(window, layout.check_name), field_u64(window, layout.check_filename))
}

/// The validation word of one code object, from its window and, when
/// [`code_check_needs_strings`], the (length, cached hash) pairs of its `co_name` and
/// `co_filename` (`[0, 0]` when unread or unreadable). Kernel and userspace both call this on
/// the same bytes, so a code object re-read by userspace checks equal only if it is the one
/// the kernel saw, as far as these fields tell:
/// - 3.12+: the window holds `co_version`, set once per code object from a per-interpreter
///   counter that never repeats (until it runs out at 2^32 code objects and stays 0): two code
///   objects at one address differ here even with identical name, file and first line;
/// - before: the window holds `co_firstlineno` and every immutable pointer from it to
///   `co_name` (3.8-3.10: `co_code`, `co_consts`, ..., `co_lnotab`/`co_linetable`; 3.11 up to
///   `co_linetable`), and the strings add their content's hash and length. The filename's
///   hash may be unset (-1: CPython computes it lazily); it is then stable until something
///   hashes the string, which changes the word once.
/// Never 0 (0 means "no check").
#[inline(always)]
pub fn code_check(layout: &FrameLayout, window: &FrameBytes, name: [u64; 2], filename: [u64; 2]) -> u32 {
    let size = code_check_size(layout);
    let mut h = HASH_SEED;
    let mut offset = 0u32;
    // At most FRAME_READ_MAX / 8 words; a constant bound for the verifier.
    for _ in 0..FRAME_READ_MAX / 8 {
        if offset >= size {
            break;
        }
        h = mix(h ^ field_u64(window, offset));
        offset += 8;
    }
    h = mix(h ^ name[0]);
    h = mix(h ^ name[1]);
    h = mix(h ^ filename[0]);
    h = mix(h ^ filename[1]);
    let word = (h ^ (h >> 32)) as u32;
    if word == 0 { 1 } else { word }
}

/// The little-endian u64 at `offset` in the frame bytes. Offsets are masked into the buffer,
/// which keeps the BPF verifier satisfied and makes any offset safe.
#[inline(always)]
pub fn field_u64(buf: &FrameBytes, offset: u32) -> u64 {
    let offset = (offset as usize) & (FRAME_READ_MAX - 1);
    // SAFETY: offset < FRAME_READ_MAX and the buffer has 8 bytes more than that.
    unsafe { core::ptr::read_unaligned(buf.as_ptr().add(offset) as *const u64) }
}

pub const HASH_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Folds one frame into a running tail hash. Kernel and userspace call this same function,
/// so a tail that userspace re-reads from the target hashes equal only if every frame
/// (address, code object address, position, owner, flags) is unchanged and every code object has the
/// same validation word (`check`): a same-named code object that replaced another at one
/// address (a module reload, a re-`exec`) changes the hash.
#[inline(always)]
pub fn frame_hash(h: u64, e: &FrameEntry) -> u64 {
    let mut h = h;
    h = mix(h ^ e.frame);
    h = mix(h ^ e.code);
    // The thread's bytecode copy in the high half: 0 on every build but free-threaded ones,
    // so their hashes are unchanged.
    h = mix(h ^ (e.instr_offset as u32 as u64) ^ ((e.tlbc_index as u64) << 32));
    mix(h ^ ((e.check as u64) | ((e.owner as u64) << 32) | ((e.flags as u64) << 40)))
}

#[inline(always)]
fn mix(mut x: u64) -> u64 {
    // A multiply-xorshift step (as in splitmix64); cheap in BPF, no rotates.
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 31)
}

/// Test-only switch of the sampling program (`pyperch_sample`, the `bpf_loop` walk), frozen
/// at load time from `PYPERCH_BENCH_STOP_AFTER` (see profiler-user's loader): the program
/// stops after the given part and sends nothing, so that `cargo xtask bench --only parts`
/// can derive each part's cost from the differences of the BPF run time per run. `NONE`
/// (0, the default) is the normal program; the verifier removes the checks as dead code.
pub mod bench_stop {
    /// The normal program: every part, and the record is sent.
    pub const NONE: u64 = 0;
    /// Stop after the registration lookup of the running process (and its counter).
    pub const REGISTRATION: u64 = 1;
    /// Stop after the thread-state lookup and the first frame pointer (the header filled).
    pub const THREAD_STATE: u64 = 2;
    /// Stop after the full frames (up to `MAX_FULL_FRAMES`).
    pub const FULL_FRAMES: u64 = 3;
    /// Stop after the hashed tail (the walk is complete; only the output is left).
    pub const TAIL: u64 = 4;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, contain only integers and have no padding that
    // is left uninitialised (explicit `_pad` fields), so any bit pattern is valid.
    unsafe impl aya::Pod for super::ProcessInfo {}
    unsafe impl aya::Pod for super::SampleHeader {}
    unsafe impl aya::Pod for super::FrameEntry {}
    unsafe impl aya::Pod for super::CoroutineKey {}
    unsafe impl aya::Pod for super::ThreadSwitch {}
    unsafe impl aya::Pod for super::NativeTrailer {}
    unsafe impl aya::Pod for super::UnwindRow {}
    unsafe impl aya::Pod for super::UnwindProcess {}
}

// The record layout is shared by two compilers: its sizes are fixed here, padding explicit.
const _: () = assert!(SAMPLE_HEADER_SIZE == 88);
const _: () = assert!(FRAME_ENTRY_SIZE == 32);
// The off-CPU trailer takes exactly one frame slot.
const _: () = assert!(core::mem::size_of::<OffCpuInterval>() == FRAME_ENTRY_SIZE);
const _: () = assert!(NATIVE_TRAILER_SIZE == 40);
const _: () = assert!(core::mem::size_of::<UnwindRow>() == 8);
const _: () = assert!(core::mem::size_of::<UnwindModule>() == 40);
const _: () = assert!(core::mem::size_of::<FrameLayout>() == 104);
const _: () = assert!(CODE_SNAPSHOT_HEADER == SAMPLE_HEADER_SIZE + 56);

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(version: u32) -> FrameLayout {
        FrameLayout { check_start: 0x40, check_size: 0x40, check_name: 0x38, check_filename: 0x30, check_version: version, check_str: 0x10, shim_owner: 3, ..Default::default() }
    }

    #[test]
    fn code_check_depends_on_every_input() {
        let l = layout(NO_FIELD);
        let mut w: FrameBytes = [0; FRAME_READ_MAX + 8];
        w[..0x40].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let base = code_check(&l, &w, [4, 5], [6, 7]);
        assert_ne!(base, 0);
        assert_eq!(base, code_check(&l, &w, [4, 5], [6, 7]));
        assert_ne!(base, code_check(&l, &w, [4, 6], [6, 7]), "name hash");
        assert_ne!(base, code_check(&l, &w, [4, 5], [7, 7]), "filename length");
        assert_ne!(base, code_check(&l, &w, [4, 5], [6, 8]), "filename hash");
        let mut w2 = w;
        w2[0x3f] ^= 1;
        assert_ne!(base, code_check(&l, &w2, [4, 5], [6, 7]), "last window byte");
        // Bytes past the window do not count.
        let mut w3 = w;
        w3[0x40] ^= 1;
        assert_eq!(base, code_check(&l, &w3, [4, 5], [6, 7]));
    }

    /// A frame's bytecode copy (free-threaded builds) is read when the layout has it and
    /// takes part in the hash; index 0, the only one of every other build, hashes as the
    /// hash did before the field existed (so tails cached by kernel and user agree as ever).
    #[test]
    fn tlbc_index_is_decoded_and_hashed_only_when_not_zero() {
        let mut buf: FrameBytes = [0; FRAME_READ_MAX + 8];
        buf[0x48..0x4c].copy_from_slice(&3i32.to_le_bytes());
        let base = FrameLayout { read_size: 0x50, previous: 8, instr_kind: instr_kind::POINTER, owner: 0x4e, ..Default::default() };
        let mut e = FrameEntry::default();
        decode_frame(&base, 0x7000, &buf, &mut e);
        assert_eq!(e.tlbc_index, 0, "layouts without the field (0 or NO_FIELD) never read it");
        decode_frame(&FrameLayout { tlbc_index: NO_FIELD, ..base }, 0x7000, &buf, &mut e);
        assert_eq!(e.tlbc_index, 0);
        decode_frame(&FrameLayout { tlbc_index: 0x48, ..base }, 0x7000, &buf, &mut e);
        assert_eq!(e.tlbc_index, 3);
        // The hash before the field existed, written out.
        let before = |h: u64, e: &FrameEntry| {
            let mut h = mix(h ^ e.frame);
            h = mix(h ^ e.code);
            h = mix(h ^ (e.instr_offset as u32 as u64));
            mix(h ^ ((e.check as u64) | ((e.owner as u64) << 32) | ((e.flags as u64) << 40)))
        };
        let plain = FrameEntry { frame: 0x7000, code: 0x9000, instr_offset: 42, check: 7, owner: 1, ..Default::default() };
        assert_eq!(frame_hash(HASH_SEED, &plain), before(HASH_SEED, &plain));
        let copy = FrameEntry { tlbc_index: 3, ..plain };
        assert_ne!(frame_hash(HASH_SEED, &copy), frame_hash(HASH_SEED, &plain));
    }

    #[test]
    fn strings_are_needed_only_without_a_version() {
        let mut w: FrameBytes = [0; FRAME_READ_MAX + 8];
        assert!(code_check_needs_strings(&layout(NO_FIELD), &w));
        assert!(code_check_needs_strings(&layout(0x1c), &w), "version 0: the counter ran out");
        w[0x1c] = 7;
        assert!(!code_check_needs_strings(&layout(0x1c), &w));
        // The neighbouring u32 (co_nfreevars at 0x18) does not count as the version.
        w[0x1c] = 0;
        w[0x18] = 1;
        assert!(code_check_needs_strings(&layout(0x1c), &w));
    }

    #[test]
    fn shims_get_no_check_and_the_tail_hash_covers_the_check() {
        let l = layout(0x1c);
        let shim = FrameEntry { code: 0x1000, owner: 3, ..Default::default() };
        assert!(!code_check_applies(&l, &shim));
        let frame = FrameEntry { code: 0x1000, owner: 0, check: 5, ..Default::default() };
        assert!(code_check_applies(&l, &frame));
        let other = FrameEntry { check: 6, ..frame };
        assert_ne!(frame_hash(HASH_SEED, &frame), frame_hash(HASH_SEED, &other));
    }
}
