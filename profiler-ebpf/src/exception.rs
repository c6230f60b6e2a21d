//! `--mode exception`: whether the sampled thread is handling an exception (inside an
//! `except` block, as `sys.exc_info()` would say), read from its thread state with the
//! per-version offsets of `ProcessInfo::exc_*` (userspace's table `layout::exception`).

use profiler_common::{ProcessInfo, counter};

use crate::frame_walk::read_u64;
use crate::maps::bump;
use crate::thread_state::{current_fsbase, find_thread_state};

/// Non-zero: the sampling program keeps only samples of threads handling an exception.
#[unsafe(no_mangle)]
static EXCEPTION_ONLY: u64 = 0;

/// Stack items followed from `exc_info` (a generator or coroutine that handles nothing adds
/// one empty item per level; deeper nesting than this counts as "not handling").
const MAX_STACK_ITEMS: usize = 8;

/// Whether the sample of running thread `tid` is wanted: always outside `--mode exception`;
/// in it, only when the thread's topmost non-empty exception stack item holds an exception
/// (neither NULL nor None), as CPython's `_PyErr_GetTopmostException` finds it. Other
/// samples are counted and dropped.
#[inline(always)]
pub fn sample_wanted(info: &ProcessInfo, tid: u32) -> bool {
    // SAFETY: a frozen load-time constant.
    if unsafe { core::ptr::read_volatile(&EXCEPTION_ONLY) } == 0 {
        return true;
    }
    if info.exc_info == 0 {
        bump(counter::EXCEPTION_UNKNOWN);
        return false;
    }
    let tstate = find_thread_state(info, tid, current_fsbase());
    let mut item = if tstate != 0 { read_u64(tstate + info.exc_info as u64) } else { 0 };
    let mut handling = false;
    for _ in 0..MAX_STACK_ITEMS {
        if item == 0 {
            break;
        }
        let value = read_u64(item + info.exc_handled as u64);
        if value != 0 && value != info.none_address {
            handling = true;
            break;
        }
        item = read_u64(item + info.exc_previous as u64);
    }
    if !handling {
        bump(counter::NOT_HANDLING_EXCEPTION);
    }
    handling
}
