//! Native context for `--native` / `--kernel`: after the Python walk, the sampling program
//! hands its record here. When neither flag is set (the loader froze both globals to 0) the
//! record goes out unchanged as a `CPU_SAMPLE`. Otherwise it is copied into a per-CPU buffer
//! and followed by a `NativeTrailer` (the thread's user registers), the kernel stack
//! (`--kernel`) and the user frames (`--native`): the frames the kernel walks from the
//! registers with the files' unwind rows (`native_unwind`, the default), or a bounded copy of
//! the top of the user stack for userspace to unwind (`--native-walk copy`); all sent as one
//! `CPU_SAMPLE_NATIVE` record. The Python frames are never changed here.
//!
//! Two builds of [`emit`]: the `bpf_loop` sampler's (5.17+), and the bounded sampler's
//! (`BOUNDED`, for 5.10 to 5.16): the latter finds the user registers without the 5.11/5.15
//! helpers (from the task's kernel stack, see [`user_registers`]) and drives the walk's steps
//! from a bounded loop of calls to a global function instead of `bpf_loop`.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated,
    macros::map,
    maps::PerCpuArray,
    programs::PerfEventContext,
};
use profiler_common::{
    MAX_KERNEL_FRAMES, MAX_NATIVE_STACK_BYTES, MAX_WALKED_FRAMES, NATIVE_TRAILER_SIZE, WALKED_FRAME_SIZE, NativeTrailer, SampleHeader, native_regs,
    record_kind, walk_end,
};

use crate::maps::output_record;
use crate::native_unwind::{self, WalkState};

/// Bytes of user stack to copy per sample (0: `--native` is off). Frozen at load time.
#[unsafe(no_mangle)]
static NATIVE_STACK_BYTES: u64 = 0;
/// Non-zero: walk the user stack here (`native_unwind`) instead of copying
/// `NATIVE_STACK_BYTES` of it. Frozen at load time.
#[unsafe(no_mangle)]
static NATIVE_WALK: u64 = 0;
/// Non-zero: record the kernel stack (`--kernel`). Frozen at load time.
#[unsafe(no_mangle)]
static KERNEL_STACK: u64 = 0;
/// The offset of `task_struct.stack` (from BTF; 0: unknown) and of the user registers a task
/// saved on entering the kernel from the bottom of that stack (x86_64: `THREAD_SIZE -
/// sizeof(struct pt_regs)`). Frozen at load time; read only by the bounded sampler.
#[unsafe(no_mangle)]
static TASK_STACK_OFFSET: u64 = 0;
#[unsafe(no_mangle)]
static TASK_PT_REGS_OFFSET: u64 = 0;

/// Every offset into the buffer is masked with this (for the verifier). The real offsets are
/// far below: header and full frames at most 2112 bytes, trailer 40, kernel stack 1016.
const OFFSET_MASK: usize = 8191;
const KERNEL_STACK_BYTES: usize = MAX_KERNEL_FRAMES * 8;
/// The buffer: any masked offset plus its largest write (the user stack) fits. Per-CPU values
/// are limited to 32 KiB by the kernel.
const BUFFER_SIZE: usize = OFFSET_MASK + 1 + MAX_NATIVE_STACK_BYTES;

/// x86_64 `struct pt_regs`, in 8-byte words.
const PT_REGS_WORDS: usize = 21;
const REG_BP: usize = 4;
const REG_IP: usize = 16;
const REG_CS: usize = 17;
const REG_SP: usize = 19;

#[repr(C)]
struct NativeScratch {
    trailer: NativeTrailer,
    regs: [u64; PT_REGS_WORDS],
    walk: WalkState,
    buffer: [u8; BUFFER_SIZE],
}

#[map]
static NATIVE_SCRATCH: PerCpuArray<NativeScratch> = PerCpuArray::with_max_entries(1, 0);

/// Whether `--kernel` asked for kernel stacks (also kept for off-CPU intervals).
#[inline(always)]
pub fn kernel_stacks_wanted() -> bool {
    // SAFETY: a plain read of a global the loader froze.
    unsafe { core::ptr::read_volatile(&KERNEL_STACK) != 0 }
}

/// Whether records need native context at all.
#[inline(always)]
fn enabled() -> (u64, bool) {
    // SAFETY: a plain read of a global the loader froze.
    (unsafe { core::ptr::read_volatile(&NATIVE_STACK_BYTES) }, kernel_stacks_wanted())
}

/// Sends the record (`len` bytes at `record`, a `SampleHeader` and its full frames), with
/// native context when a flag asks for it. `BOUNDED`: the caller may not use `bpf_loop`
/// (nor the helpers of 5.11+).
pub fn emit<const BOUNDED: bool>(ctx: &PerfEventContext, record: *const c_void, len: usize) {
    let (stack_bytes, kernel) = enabled();
    if stack_bytes == 0 && !kernel {
        output_record(record, len);
        return;
    }
    let Some(s) = NATIVE_SCRATCH.get_ptr_mut(0) else { return };
    // SAFETY: a per-CPU array value; this program does not run reentrantly on one CPU.
    let s = unsafe { &mut *s };
    let python_len = len & OFFSET_MASK;
    // SAFETY: `record` has `len` readable bytes (the caller's guarantee); the buffer has room
    // for any masked length.
    let copied = unsafe {
        generated::bpf_probe_read_kernel(s.buffer.as_mut_ptr() as *mut c_void, python_len as u32, record)
    };
    if copied != 0 {
        return;
    }
    // The copy's header says what follows now.
    if python_len >= core::mem::size_of::<SampleHeader>() {
        // SAFETY: the buffer starts with the header just copied; `kind` is its last field.
        unsafe {
            let header = s.buffer.as_mut_ptr() as *mut SampleHeader;
            core::ptr::write_unaligned(core::ptr::addr_of_mut!((*header).kind), record_kind::CPU_SAMPLE_NATIVE);
        }
    }

    s.trailer = NativeTrailer::default();
    user_registers::<BOUNDED>(ctx, s);
    let mut offset = python_len + NATIVE_TRAILER_SIZE;

    if kernel {
        let at = offset & OFFSET_MASK;
        // SAFETY: the destination range lies inside the buffer (masked offset + constant size).
        let got = unsafe {
            generated::bpf_get_stack(
                ctx.ctx as *mut c_void,
                s.buffer.as_mut_ptr().add(at) as *mut c_void,
                KERNEL_STACK_BYTES as u32,
                0,
            )
        };
        if got > 0 {
            let got = (got as usize) & 1023;
            s.trailer.kernel_stack_len = got as u32;
            offset += got;
        }
    }

    // SAFETY: a plain read of a global the loader froze.
    let walk_here = unsafe { core::ptr::read_volatile(&NATIVE_WALK) } != 0;
    let mut copy = stack_bytes != 0 && s.trailer.regs != native_regs::NONE;
    if walk_here && copy {
        let at = offset & OFFSET_MASK;
        s.walk.ip = s.trailer.ip;
        s.walk.sp = s.trailer.sp;
        s.walk.bp = s.trailer.bp;
        s.walk.sp0 = s.trailer.sp;
        // SAFETY: a helper without arguments.
        s.walk.pid = (unsafe { generated::bpf_get_current_pid_tgid() } >> 32) as u32;
        if BOUNDED {
            walk_bounded(at);
        } else {
            // SAFETY: `at` plus the walk's largest write lies inside the buffer (see BUFFER_SIZE).
            let frames = unsafe { s.buffer.as_mut_ptr().add(at) };
            native_unwind::walk(&mut s.walk, frames);
        }
        if s.walk.end == walk_end::LOADING || s.walk.end == walk_end::NO_PROCESS {
            // The process's tables are not in the kernel yet (its first second or so): a copy
            // of the stack instead (over the frames), which userspace unwinds once it has read
            // the files, as with `--native-walk copy`.
            s.trailer.walk_end = walk_end::COPY_WHILE_LOADING;
        } else {
            let n = s.walk.n as usize & (MAX_WALKED_FRAMES * 2 - 1);
            let n = if n > MAX_WALKED_FRAMES { MAX_WALKED_FRAMES } else { n };
            s.trailer.user_stack_len = (n * WALKED_FRAME_SIZE) as u32;
            s.trailer.walk_end = s.walk.end;
            offset += n * WALKED_FRAME_SIZE;
            copy = false;
        }
    }
    if copy {
        let mut want = stack_bytes as usize;
        if want > MAX_NATIVE_STACK_BYTES {
            want = MAX_NATIVE_STACK_BYTES;
        }
        let at = offset & OFFSET_MASK;
        let sp = s.trailer.sp;
        // A read fails whole when it crosses the top of the stack's mapping (near the top of
        // a main thread's stack): then retry up to page boundaries, from the longest.
        let in_page = 4096 - (sp & 4095) as usize;
        for attempt in 0..6usize {
            let mut n = want;
            if attempt > 0 {
                // attempt 1: 4 pages beyond the first, ..., attempt 5: the first page only.
                let pages = 5 - attempt;
                let limit = in_page + pages * 4096;
                if limit < n {
                    n = limit;
                } else {
                    continue;
                }
            }
            let n = n & (MAX_NATIVE_STACK_BYTES * 2 - 1);
            if n == 0 || n > MAX_NATIVE_STACK_BYTES {
                break;
            }
            // SAFETY: `at + n` lies inside the buffer (see BUFFER_SIZE); `sp` is a user address.
            let ret = unsafe {
                generated::bpf_probe_read_user(s.buffer.as_mut_ptr().add(at) as *mut c_void, n as u32, sp as *const c_void)
            };
            if ret == 0 {
                s.trailer.user_stack_len = n as u32;
                offset += n;
                break;
            }
        }
    }

    // The trailer goes right after the Python part.
    let at = python_len & OFFSET_MASK;
    // SAFETY: the trailer is plain data; the destination lies inside the buffer.
    unsafe {
        generated::bpf_probe_read_kernel(
            s.buffer.as_mut_ptr().add(at) as *mut c_void,
            NATIVE_TRAILER_SIZE as u32,
            &s.trailer as *const NativeTrailer as *const c_void,
        );
    }
    let total = if offset > BUFFER_SIZE { BUFFER_SIZE } else { offset };
    output_record(s.buffer.as_ptr() as *const c_void, total);
}

/// The walk without `bpf_loop`: [`native_unwind::begin`], then one call of the global
/// function [`pyperch_native_step`] per frame, at most `MAX_WALKED_FRAMES` + 1 (the last
/// one says the walk is too deep). The frames go to the buffer at `at`.
#[inline(always)]
fn walk_bounded(at: usize) {
    let Some(s) = NATIVE_SCRATCH.get_ptr_mut(0) else { return };
    // SAFETY: this CPU's scratch value; this program does not run reentrantly on one CPU.
    let s = unsafe { &mut *s };
    // SAFETY: `at` is masked and the walk's largest write lies inside the buffer.
    let frames = unsafe { s.buffer.as_mut_ptr().add(at & OFFSET_MASK) };
    if native_unwind::begin(&mut s.walk, frames).is_none() {
        return;
    }
    for _ in 0..MAX_WALKED_FRAMES + 1 {
        if pyperch_native_step(at as u64) == 0 {
            break;
        }
    }
}

/// One frame of the bounded walk, as a global function: the kernel verifies it once, on its
/// own, so the loop above costs the verifier a few instructions per iteration (5.10's
/// verifier would otherwise explore the binary searches of every frame). Global functions
/// take scalars only: the walk's state is this CPU's scratch, `at` the frames' offset in its
/// buffer. Returns 1 while the walk goes on, 0 once it ended.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyperch_native_step(at: u64) -> i64 {
    let Some(s) = NATIVE_SCRATCH.get_ptr_mut(0) else { return 0 };
    // SAFETY: as in `walk_bounded`.
    let s = unsafe { &mut *s };
    // SAFETY: the masked offset plus the walk's largest write lies inside the buffer.
    let frames = unsafe { s.buffer.as_mut_ptr().add(at as usize & OFFSET_MASK) };
    native_unwind::step_frame(&mut s.walk, frames) as i64
}

/// The interrupted thread's user registers into the trailer: from the perf event when it hit
/// user mode, else the registers the thread saved when it entered the kernel (found with the
/// 5.11/5.15 helpers, or, `BOUNDED`, at their fixed place below the top of the task's kernel
/// stack). Either way only registers whose code segment is user mode's are taken.
fn user_registers<const BOUNDED: bool>(ctx: &PerfEventContext, s: &mut NativeScratch) {
    let regs = ctx.ctx as *const u64;
    // SAFETY: the perf-event context starts with the interrupted `pt_regs`.
    let cs = unsafe { core::ptr::read_volatile(regs.add(REG_CS)) };
    if cs & 3 == 3 {
        // SAFETY: as above, word reads inside `pt_regs`.
        unsafe {
            s.trailer.ip = core::ptr::read_volatile(regs.add(REG_IP));
            s.trailer.sp = core::ptr::read_volatile(regs.add(REG_SP));
            s.trailer.bp = core::ptr::read_volatile(regs.add(REG_BP));
        }
        s.trailer.regs = native_regs::FROM_CONTEXT;
        return;
    }
    let ret = if BOUNDED {
        saved_user_registers(&mut s.regs)
    } else {
        // SAFETY: the helpers return the current task and its saved user registers (kernel
        // memory, read with a probe that fails cleanly).
        unsafe {
            let task = generated::bpf_get_current_task_btf();
            let user = generated::bpf_task_pt_regs(task) as *const c_void;
            generated::bpf_probe_read_kernel(s.regs.as_mut_ptr() as *mut c_void, (PT_REGS_WORDS * 8) as u32, user)
        }
    };
    if ret != 0 || s.regs[REG_CS] & 3 != 3 {
        return;
    }
    s.trailer.ip = s.regs[REG_IP];
    s.trailer.sp = s.regs[REG_SP];
    s.trailer.bp = s.regs[REG_BP];
    s.trailer.regs = native_regs::FROM_TASK;
}

/// The current task's saved user registers without the 5.11+ helpers: `task->stack` (its
/// offset from BTF) plus the frozen offset of `pt_regs` at the top of that stack. Returns the
/// probe read's result (0: read), or -1 when the offsets are unknown.
#[inline(always)]
fn saved_user_registers(regs: &mut [u64; PT_REGS_WORDS]) -> i64 {
    // SAFETY: plain reads of globals the loader froze.
    let (stack_offset, regs_offset) =
        unsafe { (core::ptr::read_volatile(&TASK_STACK_OFFSET), core::ptr::read_volatile(&TASK_PT_REGS_OFFSET)) };
    if stack_offset == 0 || regs_offset == 0 {
        return -1;
    }
    let mut stack = 0u64;
    // SAFETY: probe reads of kernel memory (the running task, then its stack) into locals;
    // they fail cleanly on a bad address.
    unsafe {
        let task = generated::bpf_get_current_task() as *const u8;
        let ret = generated::bpf_probe_read_kernel(
            &mut stack as *mut u64 as *mut c_void,
            8,
            task.add(stack_offset as usize) as *const c_void,
        );
        if ret != 0 || stack == 0 {
            return -1;
        }
        generated::bpf_probe_read_kernel(
            regs.as_mut_ptr() as *mut c_void,
            (PT_REGS_WORDS * 8) as u32,
            stack.wrapping_add(regs_offset) as *const c_void,
        )
    }
}
