//! Finding the running thread's `PyThreadState`: the thread-local slot CPython uses, checked
//! against the thread pointer, with the interpreter's thread list as fallback.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use profiler_common::{
    INTERPRETER_UNKNOWN, MAX_THREAD_SCAN, NO_FIELD, ProcessInfo, RUNNING_TASK_UNKNOWN, tstate_lookup,
};

use crate::frame_walk::read_u64;
use crate::target_bytes::TargetBytes;

/// Offset of `thread.fsbase` in `struct task_struct`, read from the kernel's BTF by
/// userspace and frozen at load time.
#[unsafe(no_mangle)]
static TASK_FSBASE_OFFSET: u64 = 0;

/// The running thread's thread pointer (`task_struct.thread.fsbase`), read with a helper
/// (every kernel; see [`current_fsbase_btf`] for 5.11+).
pub fn current_fsbase() -> u64 {
    // SAFETY: `bpf_get_current_task` returns the running task; the offset comes from BTF.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let offset = core::ptr::read_volatile(&TASK_FSBASE_OFFSET) as usize;
        bpf_probe_read_kernel(task.add(offset) as *const u64).unwrap_or(0)
    }
}

/// [`current_fsbase`] without a helper read: the task as typed kernel memory (BTF,
/// `bpf_get_current_task_btf`, 5.11+; only the `bpf_loop` programs, 5.17+, call this) and
/// one load at the offset frozen at load time, which the verifier checks against the
/// kernel's BTF. A load outside the kernel's idea of `task_struct` fails verification, not at
/// run time.
#[inline(always)]
pub fn current_fsbase_btf() -> u64 {
    // SAFETY: the helper returns the running task (never null); the offset is a frozen
    // load-time constant from BTF, checked again by the verifier.
    unsafe {
        let task = aya_ebpf::helpers::generated::bpf_get_current_task_btf() as *const u8;
        let offset = core::ptr::read_volatile(&TASK_FSBASE_OFFSET) as usize;
        core::ptr::read_volatile(task.add(offset) as *const u64)
    }
}

/// Whether `tstate` belongs to the running thread: its `thread_id` (`pthread_self()`, the
/// thread pointer) equals the thread's fsbase. Unlike `native_thread_id`, which holds the tid
/// as seen inside the target's PID namespace, this holds in containers too.
#[inline(always)]
pub fn is_current_thread(info: &ProcessInfo, tstate: u64, tid: u32, fsbase: u64) -> bool {
    pyperch_is_current_thread(tstate, info.thread.thread_id, info.thread.native_thread_id, tid, fsbase) != 0
}

/// `is_current_thread` with the two offsets as scalars, as a global function: the kernel
/// verifies it once on its own, so the thread-list scan below costs the verifier a few
/// instructions per iteration (5.10's verifier otherwise explores the branches of every
/// iteration past its instruction limit). Returns 1 for the running thread's state, else 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_is_current_thread(tstate: u64, thread_id: u32, native_thread_id: u32, tid: u32, fsbase: u64) -> i64 {
    is_current_by(thread_id, native_thread_id, tid, fsbase, |offset| read_u64(tstate + offset as u64)) as i64
}

/// The rule of [`is_current_thread`], with `field(offset)` reading the thread state's u64 at
/// `offset` (from the target, or from bytes already read): `thread_id` against fsbase where
/// the layout has it, else `native_thread_id` against the tid.
#[inline(always)]
fn is_current_by(thread_id: u32, native_thread_id: u32, tid: u32, fsbase: u64, field: impl Fn(u32) -> u64) -> bool {
    if thread_id != NO_FIELD {
        fsbase != 0 && field(thread_id) == fsbase
    } else {
        native_thread_id != NO_FIELD && field(native_thread_id) == tid as u64
    }
}

pub fn find_thread_state(info: &ProcessInfo, tid: u32, fsbase: u64) -> u64 {
    let several = if info.interp_id != NO_FIELD { several_interpreters(info) } else { None };
    find_thread_state_with(info, tid, fsbase, several)
}

/// [`find_thread_state`] with `several` = [`several_interpreters`] already read (its two
/// reads are shared with [`interpreter_of_with`] by the walk); it is only looked at when the
/// layout has `interp_id`.
#[inline(always)]
pub fn find_thread_state_with(info: &ProcessInfo, tid: u32, fsbase: u64, several: Option<u64>) -> u64 {
    if let Some(found) = in_subinterpreter(info, tid, fsbase, several) {
        return found;
    }
    let candidate = slot_candidate(info, fsbase);
    if candidate != 0 && is_current_thread(info, candidate, tid, fsbase) {
        return candidate;
    }
    scan_all_interpreters(info, tid, fsbase)
}

/// [`find_thread_state_with`] for the walk, which reads several fields of the thread state:
/// its first [`TSTATE_BYTES`] are read into `bytes` in one helper call, and the slot's
/// candidate is checked from them, so the check and the walk's later fields
/// ([`TstateBytes::field`]) cost one read instead of one each. Same result as
/// [`find_thread_state_with`]; when the block cannot be read, single reads as there.
#[inline(always)]
pub fn find_thread_state_into(
    info: &ProcessInfo,
    tid: u32,
    fsbase: u64,
    several: Option<u64>,
    bytes: &mut TstateBytes,
) -> u64 {
    bytes.clear();
    let found = match in_subinterpreter(info, tid, fsbase, several) {
        Some(found) => found,
        None => {
            let candidate = slot_candidate(info, fsbase);
            if candidate != 0 && bytes.read(candidate) {
                if bytes.is_current_thread(info, candidate, tid, fsbase) {
                    return candidate;
                }
                bytes.clear();
            } else if candidate != 0 && is_current_thread(info, candidate, tid, fsbase) {
                return candidate;
            }
            scan_all_interpreters(info, tid, fsbase)
        }
    };
    if found != 0 {
        bytes.read(found);
    }
    found
}

/// With subinterpreters, a thread running code in one has a thread state of its own there,
/// while its thread-local slot keeps the one bound to the main interpreter: that one is
/// looked for first. `None` when there are none or the thread is not in one.
#[inline(always)]
fn in_subinterpreter(info: &ProcessInfo, tid: u32, fsbase: u64, several: Option<u64>) -> Option<u64> {
    let head = several.filter(|_| info.interp_id != NO_FIELD)?;
    let found = scan_interpreters(info, head, tid, fsbase, true);
    (found != 0).then_some(found)
}

/// The thread state the thread's own slot (thread-local variable or pthread key) holds, not
/// yet checked; 0 when there is none.
#[inline(always)]
fn slot_candidate(info: &ProcessInfo, fsbase: u64) -> u64 {
    match info.tstate_lookup {
        tstate_lookup::PTHREAD_KEY if fsbase != 0 => pthread_getspecific(info, fsbase, info.pthread_key),
        tstate_lookup::TLS if fsbase != 0 => read_u64(fsbase.wrapping_sub(info.tls_offset)),
        _ => 0,
    }
}

/// The fallback: the interpreters' lists of thread states.
#[inline(always)]
fn scan_all_interpreters(info: &ProcessInfo, tid: u32, fsbase: u64) -> u64 {
    let head = read_u64(info.interpreters_head_addr);
    if head == 0 {
        return 0;
    }
    scan_interpreters(info, head, tid, fsbase, false)
}

/// Bytes of a thread state read at once by [`find_thread_state_into`]: every version's
/// `thread_id`, `native_thread_id`, `interp` and frame pointer lie in them.
pub const TSTATE_BYTES: usize = 256;

/// The first [`TSTATE_BYTES`] of the thread state the walk found, read in this program run
/// (the thread is stopped, so they are what single reads would give). Lives in the per-CPU
/// scratch; empty until read.
#[repr(C)]
pub struct TstateBytes {
    bytes: TargetBytes<{ TSTATE_BYTES + 8 }>,
}

impl TstateBytes {
    #[inline(always)]
    fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Reads the first `TSTATE_BYTES` at `tstate`; false (empty) on a fault.
    #[inline(always)]
    fn read(&mut self, tstate: u64) -> bool {
        self.bytes.read(tstate, TSTATE_BYTES as u64)
    }

    /// The u64 at `offset` in thread state `tstate`: from the bytes when they hold it, else
    /// read from the target (0 on a fault).
    #[inline(always)]
    pub fn field(&self, tstate: u64, offset: u32) -> u64 {
        self.bytes.u64_at(tstate.wrapping_add(offset as u64)).unwrap_or(0)
    }

    /// [`is_current_thread`] for thread state `tstate`, whose bytes these are.
    #[inline(always)]
    fn is_current_thread(&self, info: &ProcessInfo, tstate: u64, tid: u32, fsbase: u64) -> bool {
        is_current_by(info.thread.thread_id, info.thread.native_thread_id, tid, fsbase, |offset| {
            self.field(tstate, offset)
        })
    }
}

/// The first interpreter (`interpreters.head`) when the process has more than one and the
/// layout knows how to walk them (`ProcessInfo::interp_next`).
///
/// One read: in every version's `_PyRuntime.interpreters` (`struct pyinterpreters { mutex;
/// head; main; next_id }`) `main` is the pointer right after `head`. New interpreters are
/// pushed at the head of the list and the main one is its last, so there are others exactly
/// when `head` is not `main`.
#[inline(always)]
pub fn several_interpreters(info: &ProcessInfo) -> Option<u64> {
    several_interpreters_and_next_id(info).0
}

/// [`several_interpreters`], and in the same read the `next_id` that follows `main` (the id
/// the next interpreter created will take: it moves whenever one is created; 0 when
/// unread). Without `interp_next` nothing is read: `(None, 0)`.
#[inline(always)]
pub fn several_interpreters_and_next_id(info: &ProcessInfo) -> (Option<u64>, u64) {
    if info.interp_next == NO_FIELD {
        return (None, 0);
    }
    // SAFETY: bpf_probe_read_user tolerates any address; failure reads as zeros.
    let [head, main, next_id] =
        unsafe { aya_ebpf::helpers::bpf_probe_read_user(info.interpreters_head_addr as *const [u64; 3]) }
            .unwrap_or([0, 0, 0]);
    if head == 0 || main == 0 || head == main {
        return (None, next_id);
    }
    (Some(head), next_id)
}

/// Looks for the thread's state in the thread lists of the interpreters from `head` on
/// (only the first one without `interp_next`). With `only_subinterpreters`, the main
/// interpreter (the last in the list: new interpreters are pushed at its head) is skipped.
/// At most `MAX_THREAD_SCAN` steps (interpreters and thread states together).
///
/// The scan runs in one of two global functions (one per value of `only_subinterpreters`):
/// the kernel verifies each once on its own, with scalar arguments, instead of unrolling the
/// 64 steps at every place and in every verifier state that reaches a scan (that cost about
/// 0.1 s of CPU at every start on 6.18, most of the sampling program's verification).
#[inline(always)]
fn scan_interpreters(info: &ProcessInfo, head: u64, tid: u32, fsbase: u64, only_subinterpreters: bool) -> u64 {
    let ids = (tid as u64) | ((info.thread.native_thread_id as u64) << 32);
    let interp = (info.thread.interp_threads_head as u64) | ((info.interp_next as u64) << 32);
    let thread = (info.thread.next as u64) | ((info.thread.thread_id as u64) << 32);
    let found = if only_subinterpreters {
        pyperch_scan_subinterpreters(head, fsbase, ids, interp, thread)
    } else {
        pyperch_scan_interpreters(head, fsbase, ids, interp, thread)
    };
    found as u64
}

/// [`scan_interpreters`] over every interpreter from `head`. The offsets come packed in
/// pairs (low half first): `ids` = (tid, `native_thread_id`), `interp` =
/// (`interp_threads_head`, `interp_next`), `thread` = (`next`, `thread_id`). Returns the
/// thread state found, or 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_scan_interpreters(head: u64, fsbase: u64, ids: u64, interp: u64, thread: u64) -> i64 {
    scan_packed(head, fsbase, ids, interp, thread, false) as i64
}

/// [`pyperch_scan_interpreters`] skipping the main interpreter (see [`scan_interpreters`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_scan_subinterpreters(head: u64, fsbase: u64, ids: u64, interp: u64, thread: u64) -> i64 {
    scan_packed(head, fsbase, ids, interp, thread, true) as i64
}

#[inline(always)]
fn scan_packed(head: u64, fsbase: u64, ids: u64, interp_offsets: u64, thread_offsets: u64, only_subinterpreters: bool) -> u64 {
    let (tid, native_thread_id) = (ids as u32, (ids >> 32) as u32);
    let (threads_head, interp_next) = (interp_offsets as u32 as u64, (interp_offsets >> 32) as u32);
    let (next, thread_id) = (thread_offsets as u32 as u64, (thread_offsets >> 32) as u32);
    let mut interp = head;
    let mut tstate = read_u64(interp + threads_head);
    let mut next_interp = if interp_next == NO_FIELD { 0 } else { read_u64(interp + interp_next as u64) };
    if only_subinterpreters && next_interp == 0 {
        return 0;
    }
    for _ in 0..MAX_THREAD_SCAN {
        if tstate == 0 {
            // This interpreter's list is done: on to the next one.
            interp = next_interp;
            if interp == 0 {
                return 0;
            }
            next_interp = read_u64(interp + interp_next as u64);
            if only_subinterpreters && next_interp == 0 {
                return 0;
            }
            tstate = read_u64(interp + threads_head);
            continue;
        }
        if pyperch_is_current_thread(tstate, thread_id, native_thread_id, tid, fsbase) != 0 {
            return tstate;
        }
        tstate = read_u64(tstate + next);
    }
    0
}

/// For `SampleHeader::running_task`: the thread's running asyncio task, when asked for.
pub fn running_task_of(info: &ProcessInfo, tstate: u64, bytes: &TstateBytes) -> u64 {
    if info.running_task == NO_FIELD {
        return RUNNING_TASK_UNKNOWN;
    }
    bytes.field(tstate, info.running_task)
}

/// For `SampleHeader::interpreter`: the id of `tstate`'s interpreter plus 1 when the process
/// has more than one interpreter (`INTERPRETER_UNKNOWN` if its layout has no id), else 0.
/// `several` is [`several_interpreters`], read once by the caller (shared with
/// [`find_thread_state_with`]).
#[inline(always)]
pub fn interpreter_of_with(info: &ProcessInfo, tstate: u64, several: Option<u64>, bytes: &TstateBytes) -> u64 {
    if several.is_none() || tstate == 0 {
        return 0;
    }
    if info.interp_id == NO_FIELD || info.tstate_interp == NO_FIELD {
        return INTERPRETER_UNKNOWN;
    }
    let interp = bytes.field(tstate, info.tstate_interp);
    if interp == 0 {
        return 0;
    }
    // `read_u64` gives 0 on a failed read as well; a real id of u64::MAX cannot occur.
    read_u64(interp + info.interp_id as u64).wrapping_add(1)
}

/// glibc's `pthread_getspecific` for another thread, from its thread pointer.
fn pthread_getspecific(info: &ProcessInfo, fsbase: u64, key: u32) -> u64 {
    if key < 32 {
        read_u64(fsbase + info.tsd_first_block as u64 + 16 * key as u64)
    } else if key < 1024 {
        let block = read_u64(fsbase + info.tsd_second_level as u64 + 8 * (key as u64 >> 5));
        if block == 0 {
            return 0;
        }
        read_u64(block + 16 * (key as u64 & 31) + 8)
    } else {
        0
    }
}

