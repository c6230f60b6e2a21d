//! The sampling program for kernels without `bpf_loop` (before 5.17): the same walk as
//! `sampling`, built from bounded loops the verifier unrolls in its analysis, chained with
//! tail calls. Userspace loads this pair instead of `pyperch_sample` when the kernel lacks
//! `bpf_loop` (see profiler-user's loader); both send the same records.
//!
//! `pyperch_sample_bounded` reads the leading `MAX_FULL_FRAMES` frames in one loop, then
//! tail-calls `pyperch_sample_tail`, which hashes up to `TAIL_CHUNK` frames per run and
//! tail-calls itself until the bottom, a fault, or `MAX_HASHED_FRAMES` hashed frames: at most
//! `MAX_HASHED_FRAMES / TAIL_CHUNK` = 32 tail calls, the kernel's limit on every version. The
//! walk state lives in the per-CPU scratch between the programs (a tail call keeps the CPU).

use aya_ebpf::{
    macros::{map, perf_event},
    maps::ProgramArray,
    programs::PerfEventContext,
};
use profiler_common::{MAX_FULL_FRAMES, MAX_HASHED_FRAMES, record_kind, sample_status};

use crate::thread_state::current_fsbase;
use crate::sampling::{
    emit_sample, finish_walk, full_frame_step, hashed_frame_step, scratch_mut, set_weight, start_tail, start_walk, wanted_sample,
};

/// Hashed frames per run of `pyperch_sample_tail`.
const TAIL_CHUNK: usize = 64;
const _: () = assert!(MAX_HASHED_FRAMES / TAIL_CHUNK <= 32, "the tail walk needs more than 32 tail calls");
const _: () = assert!(MAX_HASHED_FRAMES % TAIL_CHUNK == 0);

/// Slot of `pyperch_sample_tail` in `WALK_PROGRAMS` (userspace fills it after loading).
pub const TAIL_SLOT: u32 = 0;

#[map]
static WALK_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

#[perf_event]
pub fn pyperch_sample_bounded(ctx: PerfEventContext) -> u32 {
    let Some((info, tgid, tid, weight)) = wanted_sample(true) else {
        return 0;
    };
    let Some(scratch) = scratch_mut() else {
        return 0;
    };
    let started = start_walk(info, ((tgid as u64) << 32) | tid as u64, record_kind::CPU_SAMPLE, current_fsbase(), scratch);
    // Kept in the scratch header through the tail calls.
    set_weight(scratch, weight);
    if !started {
        emit_sample::<true>(&ctx, scratch, 0);
        return 0;
    }
    for index in 0..MAX_FULL_FRAMES {
        if pyperch_full_frame(index as u64) != 0 {
            break;
        }
    }
    let Some(scratch) = scratch_mut() else { return 0 };
    if start_tail(scratch) {
        // SAFETY: the slot holds `pyperch_sample_tail`, a perf-event program; on success this
        // does not return.
        unsafe { WALK_PROGRAMS.tail_call(&ctx, TAIL_SLOT) };
        // The tail call failed (the slot is empty): the walk ends here, truncated.
    }
    let n_full = finish_walk(scratch);
    emit_sample::<true>(&ctx, scratch, n_full);
    0
}

/// One full frame (`sampling::full_frame_step`) as a global function: kernels verify a
/// global function once, on its own, and a call to it as a call returning any number, so the
/// loops above cost the verifier a few instructions per iteration instead of a whole frame
/// read each (which takes 5.10's verifier past its million-instruction limit). Global
/// functions may only take scalars: the walk state is in the per-CPU scratch.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_full_frame(index: u64) -> i64 {
    full_frame_step(index)
}

/// One hashed frame (`sampling::hashed_frame_step`), as a global function (see above).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_hashed_frame() -> i64 {
    hashed_frame_step()
}

/// Hashes up to `TAIL_CHUNK` more frames, then continues in a fresh run of itself or ends the
/// walk.
#[perf_event]
pub fn pyperch_sample_tail(ctx: PerfEventContext) -> u32 {
    for _ in 0..TAIL_CHUNK {
        let Some(scratch) = scratch_mut() else { return 0 };
        if scratch.walk.n_hashed as usize >= MAX_HASHED_FRAMES {
            break;
        }
        if pyperch_hashed_frame() != 0 {
            break;
        }
    }
    let Some(scratch) = scratch_mut() else { return 0 };
    let walk = &scratch.walk;
    if walk.status == sample_status::TRUNCATED && walk.frame != 0 && (walk.n_hashed as usize) < MAX_HASHED_FRAMES {
        // SAFETY: as in `pyperch_sample_bounded`.
        unsafe { WALK_PROGRAMS.tail_call(&ctx, TAIL_SLOT) };
    }
    let Some(scratch) = scratch_mut() else { return 0 };
    let n_full = finish_walk(scratch);
    emit_sample::<true>(&ctx, scratch, n_full);
    0
}
