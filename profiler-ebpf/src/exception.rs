//! `--mode exception`: whether the sampled thread is handling an exception, as CPython defines
//! it: some item of its exception-state chain (`PyThreadState.exc_info`, then each
//! `_PyErr_StackItem.previous_item`) holds one. That is what `sys.exc_info()` reports
//! (`_PyErr_GetTopmostException` skips the items that hold nothing) and what CPython 3.15's
//! profiler calls "has exception". Every running generator or coroutine pushes its own item,
//! which holds nothing unless the generator itself is inside an `except` block, so a thread
//! driving nested generators from an `except` block has its exception at the chain's far end.
//! Offsets per version: userspace's table `layout::exception` (`ProcessInfo::exc_*`).
//!
//! The chain is read from the running thread, stopped on this CPU: it is a consistent
//! snapshot. Its length is bounded by `MAX_EXCEPTION_ITEMS`; a chain still going there is
//! dropped and counted (`counter::EXCEPTION_CHAIN_TOO_LONG`), neither kept nor called
//! "not handling". Each item costs one read of `EXCEPTION_ITEM_READ` bytes (two 8-byte reads
//! where that fails).

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_probe_read_user, generated};
use profiler_common::{EXCEPTION_ITEM_READ, MAX_EXCEPTION_ITEMS, ProcessInfo, counter};

use crate::frame_walk::read_u64;
use crate::maps::bump;
use crate::thread_state::{current_fsbase, find_thread_state};

/// Non-zero: the sampling program keeps only samples of threads handling an exception.
#[unsafe(no_mangle)]
static EXCEPTION_ONLY: u64 = 0;

const WORDS: usize = EXCEPTION_ITEM_READ / 8;
const _: () = assert!(WORDS == 4, "the word masks below assume 4 words");

/// What the chain says (`ChainWalk::outcome`).
mod outcome {
    /// The walk stopped at the bound with items left.
    pub const TOO_LONG: u64 = 0;
    /// An item holds an exception.
    pub const HANDLING: u64 = 1;
    /// The chain ended (NULL `previous_item`) and no item held one.
    pub const NOT_HANDLING: u64 = 2;
}

/// The walk of one chain: where it is, the offsets it reads with, and its outcome so far.
#[repr(C)]
struct ChainWalk {
    item: u64,
    handled: u64,
    previous: u64,
    none: u64,
    outcome: u64,
}

impl ChainWalk {
    /// One item: returns 1 when the walk is over (outcome set), 0 to go on. An unreadable
    /// word reads as 0 (no exception / end of the chain).
    #[inline(always)]
    fn step(&mut self) -> i64 {
        if self.item == 0 {
            self.outcome = outcome::NOT_HANDLING;
            return 1;
        }
        // The offsets are below `EXCEPTION_ITEM_READ` (userspace's table); the masks keep
        // the indices in bounds for the verifier.
        // SAFETY: bpf_probe_read_user tolerates any address.
        let (value, previous) = match unsafe { bpf_probe_read_user(self.item as *const [u64; WORDS]) } {
            Ok(words) => (words[(self.handled / 8) as usize & (WORDS - 1)], words[(self.previous / 8) as usize & (WORDS - 1)]),
            Err(_) => (read_u64(self.item.wrapping_add(self.handled)), read_u64(self.item.wrapping_add(self.previous))),
        };
        if value != 0 && value != self.none {
            self.outcome = outcome::HANDLING;
            return 1;
        }
        self.item = previous;
        0
    }

    /// The outcome after at most `MAX_EXCEPTION_ITEMS` steps: a walk that stopped at the
    /// bound exactly where the chain ends handles nothing.
    #[inline(always)]
    fn finish(&self) -> u64 {
        if self.outcome == outcome::TOO_LONG && self.item == 0 { outcome::NOT_HANDLING } else { self.outcome }
    }
}

/// Whether the sample of running thread `tid` is wanted: always outside `--mode exception`;
/// in it, only when the thread handles an exception (module docs). Other samples are counted
/// and dropped. `bounded`: the program has no `bpf_loop` (kernels before 5.17), so the chain
/// is walked by [`pyperch_exception_chain`]'s bounded loop instead.
#[inline(always)]
pub fn sample_wanted(info: &ProcessInfo, tid: u32, bounded: bool) -> bool {
    // SAFETY: a frozen load-time constant.
    if unsafe { core::ptr::read_volatile(&EXCEPTION_ONLY) } == 0 {
        return true;
    }
    if info.exc_info == 0 {
        bump(counter::EXCEPTION_UNKNOWN);
        return false;
    }
    let tstate = find_thread_state(info, tid, current_fsbase());
    let item = if tstate != 0 { read_u64(tstate.wrapping_add(info.exc_info as u64)) } else { 0 };
    let (handled, previous, none) = (info.exc_handled as u64, info.exc_previous as u64, info.none_address);
    let result = if bounded {
        pyperch_exception_chain(item, handled, previous, none) as u64
    } else {
        let mut walk = ChainWalk { item, handled, previous, none, outcome: outcome::TOO_LONG };
        // SAFETY: bpf_loop calls the callback with a pointer to `walk`, which outlives the call.
        unsafe {
            generated::bpf_loop(
                MAX_EXCEPTION_ITEMS as u32,
                chain_loop_step as *mut c_void,
                &mut walk as *mut ChainWalk as *mut c_void,
                0,
            );
        }
        walk.finish()
    };
    match result {
        outcome::HANDLING => true,
        outcome::NOT_HANDLING => {
            bump(counter::NOT_HANDLING_EXCEPTION);
            false
        }
        _ => {
            bump(counter::EXCEPTION_CHAIN_TOO_LONG);
            false
        }
    }
}

/// bpf_loop callback: one [`ChainWalk::step`].
extern "C" fn chain_loop_step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `sample_wanted` passes a live `ChainWalk`.
    let walk = unsafe { &mut *(context as *mut ChainWalk) };
    walk.step()
}

/// The whole chain walk in a bounded loop (for kernels without `bpf_loop`), as a global
/// function: the verifier checks it once, on its own, and its callers see a call returning
/// any number (global functions take scalars only). Returns an `outcome`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_exception_chain(item: u64, handled: u64, previous: u64, none: u64) -> i64 {
    let mut walk = ChainWalk { item, handled, previous, none, outcome: outcome::TOO_LONG };
    for _ in 0..MAX_EXCEPTION_ITEMS {
        if walk.step() != 0 {
            break;
        }
    }
    walk.finish() as i64
}
