//! `--mode gil`: whether the sampled thread holds the GIL, read the way its version says
//! (`ProcessInfo::gil_check`, numbers from userspace's per-version tables).

use aya_ebpf::helpers::bpf_probe_read_user;
use profiler_common::{ProcessInfo, counter, gil_check};

use crate::frame_walk::read_u64;
use crate::maps::bump;
use crate::thread_state::{current_fsbase, find_thread_state};

/// Non-zero: the sampling program keeps only samples of threads holding the GIL. Set at load.
#[unsafe(no_mangle)]
static GIL_ONLY: u64 = 0;

pub(crate) fn read_u32(address: u64) -> u32 {
    // SAFETY: bpf_probe_read_user tolerates any address; failure reads as 0.
    unsafe { bpf_probe_read_user(address as *const u32) }.unwrap_or(0)
}

/// Whether the sample of running thread `tid` is wanted: always outside `--mode gil`; in it,
/// only when the thread holds the GIL (other samples are counted and dropped).
#[inline(always)]
pub fn sample_wanted(info: &ProcessInfo, tid: u32) -> bool {
    // SAFETY: a frozen load-time constant.
    if unsafe { core::ptr::read_volatile(&GIL_ONLY) } == 0 {
        return true;
    }
    let tstate = find_thread_state(info, tid, current_fsbase());
    let holds = match holds_gil(info, tstate) {
        Some(holds) => holds,
        None => {
            bump(counter::GIL_UNKNOWN);
            return false;
        }
    };
    if !holds {
        bump(counter::NOT_GIL_HOLDER);
    }
    holds
}

/// Whether thread state `tstate` (0: none found) holds the GIL now, read the way its version
/// says (`ProcessInfo::gil_check`); `None` when the version cannot tell.
#[inline(always)]
pub fn holds_gil(info: &ProcessInfo, tstate: u64) -> Option<bool> {
    let holds = tstate != 0
        && match info.gil_check {
            gil_check::RUNTIME_TSTATE => read_u64(info.gil_holder) == tstate,
            gil_check::INTERP_HOLDER => {
                let interp = read_u64(info.interpreters_head_addr);
                interp != 0
                    && read_u32(interp + info.gil_locked as u64) != 0
                    && read_u64(interp + info.gil_holder) == tstate
            }
            gil_check::TSTATE_FLAG => read_u32(tstate + info.gil_holder) != 0,
            _ => return None,
        };
    Some(holds)
}
