//! pyperch's kernel programs.
//!
//! One module per program: `sampling` (the perf-event walk), `sched_switch` (off-CPU intervals
//! at context switches, walked with the same walk) and `process_events` (fork, exit and exec
//! tracepoints), over shared `maps`, `thread_state` lookup and `frame_walk` reads.
//!
//! The sampling program runs on every CPU-clock perf event. For a thread of a registered process it finds the
//! thread's `PyThreadState`, walks the interpreter frames from the current one towards the
//! bottom, and writes one record to the `SAMPLES` ring buffer: a `SampleHeader`, then the
//! leading frames in full; the frames below are counted and folded into a hash so userspace
//! can complete the stack and prove the completion matches what the kernel saw.
//!
//! While this program runs, the sampled thread is stopped on this CPU, so the chain it reads
//! is a consistent snapshot of that thread's frames.
#![no_std]
#![no_main]

mod code_snapshot;
mod frame_walk;
mod exception;
mod gc;
mod gil;
mod interp_window;
mod maps;
mod off_cpu_batch;
mod native_stack;
mod native_unwind;
mod process_events;
mod sampling;
mod sched_switch;
mod switch_filter;
mod task_chain;
mod target_bytes;
mod sampling_bounded;
mod thread_state;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program with a reachable panic path.
    unsafe { core::hint::unreachable_unchecked() }
}
