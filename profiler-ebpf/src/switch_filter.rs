//! The scheduler-switch program's early exit for the rest of the host: one map lookup per
//! switch when neither thread belongs to a registered process.
//!
//! A switch names two threads: `prev` (leaving) and `next` (coming in). Looking both up in
//! `PROCESSES` costs two hash lookups. But `prev` is, on its CPU, always the thread the
//! previous switch on that CPU let in, and that switch already looked it up as its `next`:
//! [`remember_next`] keeps that answer per CPU, and [`prev_is_unregistered`] reuses it, so an
//! unregistered `prev` costs an array read instead of a hash lookup.
//!
//! The kept answer is trusted only when it is certainly still true:
//! - it is about this very thread (same tid; after a missed switch, or at attach time, it
//!   is about another one or none, and `prev` is looked up as before);
//! - no process was registered since it was taken: userspace bumps `REGISTRATION_EPOCH`
//!   after every insert into `PROCESSES`, and the answer carries the epoch read *before*
//!   its lookup, so a registration racing with that lookup makes the answer stale, never
//!   wrongly trusted. (A registration landing between the epoch read of the switch-out and
//!   its decision is the same as one landing just after the switch: the thread is counted
//!   from its next switch-out.)
//! Only "not registered" answers are reused to skip `prev`: a registered `prev` whose stack
//! is walked is always looked up, since its walk needs the registration itself, and an
//! unregistration then shows as usual. A registered answer carries its registration's
//! generation ([`prev_generation`]): a switch-out the sampled share does not walk needs no
//! more (`sched_switch::RUNNING_THREADS`).

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
};

/// Registration hints (see `profiler_common::REGISTERED_HINT_SLOTS`): a slot of 0 proves the
/// tgids it stands for unregistered, without a hash lookup. Set by userspace before each
/// insert into `PROCESSES` (and before the epoch's bump after it), so an answer it gives is
/// as trustworthy as a lookup made under the same epoch.
#[map]
pub static REGISTERED_HINT: Array<u32> = Array::with_max_entries(profiler_common::REGISTERED_HINT_SLOTS, 0);

/// False only when no process with tgid `tgid` can be registered (its hint slot is 0).
#[inline(always)]
pub fn maybe_registered(tgid: u32) -> bool {
    REGISTERED_HINT.get(tgid % profiler_common::REGISTERED_HINT_SLOTS).is_none_or(|v| *v != 0)
}

/// Bumped by userspace after each registration (slot 0).
#[map]
pub static REGISTRATION_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// What this CPU's last switch decided about the thread it let in.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuCurrent {
    /// `REGISTRATION_EPOCH` when the answer was taken (read before the lookup).
    pub epoch: u64,
    pub tid: u32,
    /// 1: the thread's process was registered (or unknown); 0: not registered.
    pub registered: u32,
    /// The registration's `ProcessInfo::generation`, when `known` is 1 (registered, and
    /// looked up).
    pub generation: u32,
    pub known: u32,
}

#[map]
static CPU_CURRENT: PerCpuArray<CpuCurrent> = PerCpuArray::with_max_entries(1, 0);

/// The registration epoch now: read once per switch, before any lookup of this switch.
#[inline(always)]
pub fn epoch() -> u64 {
    REGISTRATION_EPOCH.get(0).map(|e| unsafe { core::ptr::read_volatile(e) }).unwrap_or(u64::MAX)
}

/// Whether `prev` (thread `tid`, leaving this CPU) is known, without a lookup, to belong to
/// no registered process.
#[inline(always)]
pub fn prev_is_unregistered(tid: u32, epoch: u64) -> bool {
    match CPU_CURRENT.get_ptr(0) {
        // SAFETY: a per-CPU value, written only by this program on this CPU, which does not
        // run reentrantly there.
        Some(c) => {
            let c = unsafe { &*c };
            c.registered == 0 && c.tid == tid && c.epoch == epoch
        }
        None => false,
    }
}

/// [`prev_generation`] and [`remember_next`]'s "no generation known": generations are u32,
/// so this is none of them. (A plain integer, not an `Option`: the verifier of older kernels
/// (6.1) refuses reads of an `Option`'s payload left uninitialised on the stack.)
pub const NO_GENERATION: u64 = u64::MAX;

/// The generation of the registration `prev` (thread `tid`, leaving this CPU) was found
/// under when it came in, if that answer is certainly still the latest registration of its
/// process (same thread, no registration since; its process may have been unregistered since,
/// which a caller that charges nothing need not know); [`NO_GENERATION`] otherwise.
#[inline(always)]
pub fn prev_generation(tid: u32, epoch: u64) -> u64 {
    let Some(c) = CPU_CURRENT.get_ptr(0) else { return NO_GENERATION };
    // SAFETY: as in `prev_is_unregistered`.
    let c = unsafe { &*c };
    if c.known == 1 && c.registered == 1 && c.tid == tid && c.epoch == epoch { c.generation as u64 } else { NO_GENERATION }
}

/// Keeps, for this CPU, whether `next` (thread `tid`) belongs to a registered process, and
/// the generation of its registration when looked up ([`NO_GENERATION`] otherwise), as
/// looked up under `epoch`.
#[inline(always)]
pub fn remember_next(tid: u32, registered: bool, generation: u64, epoch: u64) {
    if let Some(c) = CPU_CURRENT.get_ptr_mut(0) {
        let known = (generation != NO_GENERATION) as u32;
        // SAFETY: as in `prev_is_unregistered`.
        unsafe { *c = CpuCurrent { epoch, tid, registered: registered as u32, generation: generation as u32, known } };
    }
}
