//! `--mode gil`: whether the sampled thread holds the GIL, read the way its version says
//! (`ProcessInfo::gil_check`, numbers from userspace's per-version tables).
//!
//! `--mode wall/off-cpu`: whether a thread switched out asleep waits for the GIL
//! ([`waiting_for_gil`], `ProcessInfo::gil_wait_kind`).

use aya_ebpf::helpers::{bpf_probe_read_user, generated};
use profiler_common::{NO_FIELD, ProcessInfo, counter, gil_check, gil_wait};

use crate::frame_walk::read_u64;
use crate::maps::bump;
use crate::thread_state::{TstateBytes, current_fsbase, find_thread_state};

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
    if info.gil_check == gil_check::INTERP_HOLDER_IF_ENABLED {
        let interp = read_u64(info.interpreters_head_addr);
        if interp != 0 && read_u32(interp + info.gil_enabled as u64) == 0 {
            bump(counter::NO_GIL);
            return false;
        }
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
            gil_check::INTERP_HOLDER | gil_check::INTERP_HOLDER_IF_ENABLED => {
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

/// x86_64 system calls whose first argument is the futex word the caller sleeps on: `futex`
/// and futex2's `futex_wait`. (`futex_waitv` takes an array, so is not recognised.)
const FUTEX_SYSCALLS: [u64; 2] = [202, 455];
/// Word indices in x86_64 `struct pt_regs` of `di` (first system-call argument) and
/// `orig_ax` (the system call number; -1 outside a system call).
const REG_DI: usize = 14;
const REG_ORIG_AX: usize = 15;

/// The GIL address (`ceval.gil`) of one interpreter of one process, as last read on this CPU,
/// with what proves it still holds: the same registration, interpreter address and
/// `_PyRuntime.interpreters.next_id`. An interpreter sets `ceval.gil` when it is created and
/// keeps it while it lives; a new interpreter at the same address would have been created
/// since, which moves `next_id` (read at the walk's start, before this cache is consulted,
/// so a creation racing with the walk shows as a change at the next walk). Without `next_id`
/// (0: the layout has no `interp_next`) nothing is kept. Lives in the per-CPU scratch.
#[repr(C)]
pub struct GilAddressCache {
    tgid: u32,
    generation: u32,
    interp: u64,
    next_interpreter_id: u64,
    /// 0: empty.
    gil: u64,
}

impl GilAddressCache {
    /// The GIL address of interpreter `interp` of process `tgid` (`info`): from the cache when
    /// it is provably the same, else read (and kept when it can be proved later).
    #[inline(always)]
    fn gil_of(&mut self, info: &ProcessInfo, tgid: u32, interp: u64, next_interpreter_id: u64) -> u64 {
        if self.gil != 0
            && next_interpreter_id != 0
            && self.next_interpreter_id == next_interpreter_id
            && self.interp == interp
            && self.tgid == tgid
            && self.generation == info.generation
        {
            return self.gil;
        }
        let gil = read_u64(interp.wrapping_add(info.gil_wait_at));
        if next_interpreter_id != 0 {
            *self = GilAddressCache { tgid, generation: info.generation, interp, next_interpreter_id, gil };
        }
        gil
    }
}

/// Whether the current thread (of process `tgid`), switched out asleep, is waiting for its
/// interpreter's GIL: it sleeps in a futex call (the GIL's mutex or condition variables, as
/// `take_gil` and the forced switch of `drop_gil` wait) on an address inside the
/// `struct _gil_runtime_state` that `info.gil_wait_*` locate. `tstate` is its thread state (0:
/// unknown), whose first bytes the walk read into `bytes`; `next_interpreter_id` is what the
/// walk read of `_PyRuntime.interpreters.next_id` (0: not read), for `gils`.
///
/// Reads two saved user registers (no helper call: the kernel gives the registers as typed
/// memory) and at most one user word, none when `gils` holds the interpreter's GIL address;
/// false whenever a read fails, so a GIL wait that cannot be told stays a plain sleep.
pub fn waiting_for_gil(
    info: &ProcessInfo,
    tgid: u32,
    tstate: u64,
    bytes: &TstateBytes,
    gils: &mut GilAddressCache,
    next_interpreter_id: u64,
) -> bool {
    let size = info.gil_wait_size as u64;
    if info.gil_wait_kind == gil_wait::UNKNOWN || size == 0 {
        return false;
    }
    let (syscall, futex) = syscall_and_first_argument();
    if !FUTEX_SYSCALLS.contains(&syscall) {
        return false;
    }
    let gil = match info.gil_wait_kind {
        gil_wait::RUNTIME_ADDRESS => info.gil_wait_at,
        gil_wait::INTERP_POINTER if tstate != 0 && info.tstate_interp != NO_FIELD => {
            let interp = bytes.field(tstate, info.tstate_interp);
            if interp == 0 {
                return false;
            }
            gils.gil_of(info, tgid, interp, next_interpreter_id)
        }
        _ => return false,
    };
    gil != 0 && futex >= gil && futex - gil < size
}

/// The current thread's system call number and first argument, from the user registers it
/// saved on entering the kernel.
#[inline(always)]
fn syscall_and_first_argument() -> (u64, u64) {
    // SAFETY: the helpers return the current task and its saved user registers, both typed
    // kernel memory (BTF) that the verifier lets the program load from at a constant offset;
    // `di` and `orig_ax` are words of `struct pt_regs`.
    unsafe {
        let task = generated::bpf_get_current_task_btf();
        let regs = generated::bpf_task_pt_regs(task) as *const u64;
        let first_argument = core::ptr::read_volatile(regs.add(REG_DI));
        let syscall = core::ptr::read_volatile(regs.add(REG_ORIG_AX));
        (syscall, first_argument)
    }
}
