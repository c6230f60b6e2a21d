//! The native walk (`--native`): from the sampled thread's user registers, frame by frame
//! through the unwind rows userspace built from each file's `.eh_frame`
//! (`profiler_common::unwind`), at sample time. Each frame costs two binary searches over map
//! values (the process's mappings, then the file's rows) and one or two 8-byte reads of the
//! user stack; no copy of the stack is made, so no frame size limits the depth.
//!
//! Invariants: every frame written is one the thread's stack holds right now (the thread is
//! stopped on this CPU); the walk stops at the first frame it cannot unwind and says why
//! (`walk_end`), never guesses past it; a CFA must lie above the frame's stack pointer.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use profiler_common::{
    MAX_UNWIND_MODULES, MAX_WALKED_FRAMES, UnwindProcess, UnwindRow, WALKED_FRAME_SIZE, cfa_kind, module_state,
    rbp_kind, walk_end,
};

/// `BPF_F_MMAPABLE`: userspace writes the rows through a shared mapping of the array.
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Every file's rows, in extents userspace hands out (its size is set at load time).
#[map]
pub static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Each profiled process's executable mappings, by tgid (its size is set at load time).
#[map]
pub static UNWIND_PROCESSES: HashMap<u32, UnwindProcess> = HashMap::with_max_entries(1, 0);

/// Bumped by userspace after every change to `UNWIND_PROCESSES`: a cached row of an older
/// generation is not used.
#[map]
pub static UNWIND_GENERATION: Array<u32> = Array::with_max_entries(1, 0);

/// A row found for (process, instruction address) by an earlier walk on this CPU.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CachedRow {
    pc: u64,
    pid: u32,
    generation: u32,
    row: UnwindRow,
}

/// Rows cached per CPU, direct-mapped by address: samples of one program repeat the same
/// return addresses, and a hit skips both binary searches.
const ROW_CACHE_SLOTS: u32 = 4096;
#[map]
static ROW_CACHE: PerCpuArray<CachedRow> = PerCpuArray::with_max_entries(ROW_CACHE_SLOTS, 0);

/// Steps of the binary searches: `MAX_UNWIND_MODULES` mappings, and up to 2^24 rows a file.
const MODULE_STEPS: usize = 8;
const ROW_STEPS: usize = 25;
const _: () = assert!(MAX_UNWIND_MODULES <= 1 << (MODULE_STEPS - 1));
const _: () = assert!(MAX_UNWIND_MODULES.is_power_of_two());

/// The walk's registers and progress, between the loop's steps.
#[repr(C)]
pub struct WalkState {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The first frame's stack pointer: CFAs are written as offsets from it.
    pub sp0: u64,
    pub pid: u32,
    /// Frames written.
    pub n: u32,
    pub end: u32,
    /// 0 once a frame's saved `rbp` could not be found: no later CFA may come from `rbp`.
    pub bp_valid: u32,
    /// `UNWIND_GENERATION` when the walk started.
    pub generation: u32,
    pub _pad: u32,
}

/// Where the walk writes (`frames` points at room for `MAX_WALKED_FRAMES` entries), and the
/// process's mappings, looked up once per walk.
pub struct WalkTarget {
    pub state: *mut WalkState,
    pub frames: *mut u8,
    pub process: *const UnwindProcess,
}

/// Walks the current thread's native stack from `state` (registers set, `n` 0) into
/// `frames`; `state.n` and `state.end` say what was written and why it stopped. Needs
/// `bpf_loop` (5.17+); kernels without it drive [`begin`] and [`step_frame`] from a bounded
/// loop (`native_stack`).
pub fn walk(state: &mut WalkState, frames: *mut u8) {
    let Some(process) = begin(state, frames) else { return };
    let mut target = WalkTarget { state: state as *mut WalkState, frames, process: process as *const UnwindProcess };
    // SAFETY: bpf_loop calls the callback with a pointer to `target`, which outlives the call.
    unsafe {
        generated::bpf_loop(
            MAX_WALKED_FRAMES as u32 + 1,
            step_callback as *mut c_void,
            &mut target as *mut WalkTarget as *mut c_void,
            0,
        );
    }
}

/// Starts a walk: resets `state`'s progress and looks up its process's mappings. `None`
/// when the process has none in the kernel yet: the walk then already ended
/// (`walk_end::NO_PROCESS`, its first frame written).
#[inline(always)]
pub fn begin(state: &mut WalkState, frames: *mut u8) -> Option<&'static UnwindProcess> {
    state.n = 0;
    state.end = walk_end::DEPTH;
    state.bp_valid = 1;
    state.generation = UNWIND_GENERATION.get(0).copied().unwrap_or(0);
    // SAFETY: a map lookup; the value stays valid for this program run.
    let process = unsafe { UNWIND_PROCESSES.get(&state.pid) };
    if process.is_none() {
        write_frame(frames, 0, state.ip, 0);
        state.n = 1;
        state.end = walk_end::NO_PROCESS;
    }
    process
}

/// One frame of a walk [`begin`] started, for a bounded loop: looks the process up again
/// (a loop body cannot keep a map value's pointer across calls). Returns false once the walk
/// ended (`state.end` says why).
#[inline(always)]
pub fn step_frame(state: &mut WalkState, frames: *mut u8) -> bool {
    // SAFETY: a map lookup; the value stays valid for this program run.
    let Some(process) = (unsafe { UNWIND_PROCESSES.get(&state.pid) }) else {
        state.end = walk_end::NO_PROCESS;
        return false;
    };
    match step(state, frames, process) {
        Ok(()) => true,
        Err(end) => {
            state.end = end;
            false
        }
    }
}

extern "C" fn step_callback(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `walk` passes a live `WalkTarget` whose pointers outlive the loop.
    let target = unsafe { &*(context as *const WalkTarget) };
    // SAFETY: as above: the state is this CPU's scratch value.
    let state = unsafe { &mut *target.state };
    // SAFETY: as above: a map value looked up by `walk`, valid for this program run.
    let process = unsafe { &*target.process };
    match step(state, target.frames, process) {
        Ok(()) => 0,
        Err(end) => {
            state.end = end;
            1
        }
    }
}

/// Reads a u64 of the current thread's user memory.
#[inline(always)]
fn read_user(address: u64) -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: a probe read into a local; it fails cleanly on a bad address.
    let ret = unsafe {
        generated::bpf_probe_read_user(&mut value as *mut u64 as *mut c_void, 8, address as *const c_void)
    };
    (ret == 0).then_some(value)
}

/// `rbp_at` values that are not addresses (no stack lies at the first or last page).
const RBP_SAME: u64 = 0;
const RBP_UNKNOWN: u64 = u64::MAX;

/// Reads two consecutive u64s of the current thread's user memory.
#[inline(always)]
fn read_user_pair(address: u64) -> Option<[u64; 2]> {
    let mut value = [0u64; 2];
    // SAFETY: a probe read into a local; it fails cleanly on a bad address.
    let ret = unsafe {
        generated::bpf_probe_read_user(value.as_mut_ptr() as *mut c_void, 16, address as *const c_void)
    };
    (ret == 0).then_some(value)
}

/// Writes frame `n`'s entry (its ip, and its CFA offset, 0 until known).
#[inline(always)]
fn write_frame(frames: *mut u8, n: usize, ip: u64, cfa_offset: u32) {
    let at = (n & (MAX_WALKED_FRAMES - 1)) * WALKED_FRAME_SIZE;
    // SAFETY: `frames` has room for `MAX_WALKED_FRAMES` entries and `at` indexes one of them.
    unsafe {
        core::ptr::write_unaligned(frames.add(at) as *mut u64, ip);
        core::ptr::write_unaligned(frames.add(at + 8) as *mut u32, cfa_offset);
    }
}

/// One frame: writes it, finds its rules, and moves the registers to its caller.
#[inline(always)]
fn step(s: &mut WalkState, frames: *mut u8, process: &UnwindProcess) -> Result<(), u32> {
    let n = s.n as usize;
    if n >= MAX_WALKED_FRAMES {
        return Err(walk_end::DEPTH);
    }
    write_frame(frames, n, s.ip, 0);
    s.n += 1;
    // A return address points after its call: look up the call itself.
    let lookup = if n == 0 { s.ip } else { s.ip.wrapping_sub(1) };
    let (slot, cached) = cached_row(s, lookup);
    let row = match cached {
        Some(row) => row,
        None => {
            let row = module_row(process, lookup)?;
            if let Some(entry) = ROW_CACHE.get_ptr_mut(slot) {
                // SAFETY: this CPU's value; this program does not run reentrantly on one CPU.
                unsafe { *entry = CachedRow { pc: lookup, pid: s.pid, generation: s.generation, row } };
            }
            row
        }
    };
    let cfa = match row.cfa_kind() {
        cfa_kind::RSP => s.sp.wrapping_add(row.cfa_offset as u64),
        cfa_kind::RBP if s.bp_valid != 0 => s.bp.wrapping_add(row.cfa_offset as u64),
        cfa_kind::PLT => s.sp + 8 + if (s.ip & 15) >= 11 { 8 } else { 0 },
        cfa_kind::FRAME_POINTERS if s.bp_valid != 0 => s.bp.wrapping_add(16),
        cfa_kind::NONE => return Err(walk_end::NO_ROW),
        cfa_kind::OUTERMOST => return Err(walk_end::OUTERMOST),
        _ => return Err(walk_end::UNSUPPORTED),
    };
    // Where the caller's rbp is: `RBP_SAME`, `RBP_UNKNOWN`, or its address.
    let rbp_at = rbp_rule(&row, cfa);
    if cfa <= s.sp {
        return Err(walk_end::NOT_GROWING);
    }
    let offset = cfa - s.sp0;
    if offset > u32::MAX as u64 {
        return Err(walk_end::NOT_GROWING);
    }
    // The return address, and the caller's rbp: one read of both when it was pushed right
    // below the return address (the usual `push rbp` prologue, and frame pointers).
    let (ra, caller_bp) = if rbp_at == cfa.wrapping_sub(16) {
        let [bp, ra] = read_user_pair(rbp_at).ok_or(walk_end::READ_FAULT)?;
        (ra, Some(bp))
    } else {
        let ra = read_user(cfa - 8).ok_or(walk_end::READ_FAULT)?;
        let bp = match rbp_at {
            RBP_SAME => Some(s.bp),
            RBP_UNKNOWN => None,
            at => Some(read_user(at).ok_or(walk_end::READ_FAULT)?),
        };
        (ra, bp)
    };
    write_frame(frames, n, s.ip, offset as u32);
    if ra == 0 {
        return Err(walk_end::OUTERMOST);
    }
    match caller_bp {
        Some(bp) => s.bp = bp,
        None => s.bp_valid = 0,
    }
    s.ip = ra;
    s.sp = cfa;
    Ok(())
}

/// The cache slot of `lookup` in this walk's process, and its row if cached.
#[inline(always)]
fn cached_row(s: &WalkState, lookup: u64) -> (u32, Option<UnwindRow>) {
    let slot = ((lookup ^ (lookup >> 12) ^ s.pid as u64) as u32) & (ROW_CACHE_SLOTS - 1);
    let hit = ROW_CACHE
        .get(slot)
        .filter(|e| e.pc == lookup && e.pid == s.pid && e.generation == s.generation)
        .map(|e| e.row);
    (slot, hit)
}

/// The row of `lookup` from the process's mappings: a binary search for the mapping, then
/// one for the row in its file's table (a `cfa_kind::FRAME_POINTERS` row, the caller's rbp
/// at CFA - 16, for a mapping walked with frame pointers).
#[inline(always)]
fn module_row(process: &UnwindProcess, lookup: u64) -> Result<UnwindRow, u32> {
    let count = if process.count as usize > MAX_UNWIND_MODULES { MAX_UNWIND_MODULES as u32 } else { process.count };
    let (mut lo, mut hi) = (0u32, count);
    for _ in 0..MODULE_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + hi) / 2;
        if process.modules[mid as usize & (MAX_UNWIND_MODULES - 1)].start <= lookup {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return Err(walk_end::NO_MODULE);
    }
    let module = &process.modules[(lo - 1) as usize & (MAX_UNWIND_MODULES - 1)];
    if lookup >= module.end {
        return Err(walk_end::NO_MODULE);
    }
    match module.state {
        module_state::READY => find_row(module.first_row, module.rows, lookup.wrapping_sub(module.bias)),
        // The caller's rbp was pushed right below the return address: at CFA - 16.
        module_state::FRAME_POINTERS => Ok(UnwindRow::new(0, cfa_kind::FRAME_POINTERS, 0, rbp_kind::AT_CFA, -2)),
        _ => Err(walk_end::LOADING),
    }
}

/// Where the caller's rbp is under `row` with this CFA: `RBP_SAME`, `RBP_UNKNOWN`, or its
/// address.
#[inline(always)]
fn rbp_rule(row: &UnwindRow, cfa: u64) -> u64 {
    match row.rbp_kind() {
        rbp_kind::SAME => RBP_SAME,
        rbp_kind::AT_CFA => cfa.wrapping_add((row.rbp_words as i64 * 8) as u64),
        _ => RBP_UNKNOWN,
    }
}

/// The row of file address `pc` among `rows` rows from `first`: the last whose `pc` is at
/// most `pc`.
#[inline(always)]
fn find_row(first: u32, rows: u32, pc: u64) -> Result<UnwindRow, u32> {
    if pc > u32::MAX as u64 {
        return Err(walk_end::NO_ROW);
    }
    let pc = pc as u32;
    let (mut lo, mut hi) = (0u32, rows);
    for _ in 0..ROW_STEPS {
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let row = UNWIND_ROWS.get(first.wrapping_add(mid)).ok_or(walk_end::NO_ROW)?;
        if row.pc <= pc {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return Err(walk_end::NO_ROW);
    }
    UNWIND_ROWS.get(first.wrapping_add(lo - 1)).copied().ok_or(walk_end::NO_ROW)
}
