//! The maps shared by the programs, and the ring-buffer output.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use profiler_common::{ProcessInfo, counter};

/// Registered processes, by tgid.
#[map]
pub static PROCESSES: HashMap<u32, ProcessInfo> = HashMap::with_max_entries(16384, 0);

#[map]
pub static SAMPLES: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

/// Unread bytes in `SAMPLES` above which a record wakes the reader (which otherwise drains
/// on its own beat). A wake-up of a reader whose CPU went idle costs it tens of microseconds
/// (measured: 256 KB woke it four times a second at 1 kHz, and cost 0.74 us of its CPU per
/// sample against 0.38 us with 4 MB); a quarter of the ring leaves 12 MB for the reader to
/// catch up (half a second of 2 CPUs sampling deep stacks at 10 kHz).
const WAKEUP_BYTES: u64 = 4 << 20;
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// `--max-cpu`'s sampled share (slots: `profiler_common::share_slot`): slot 0 holds a divisor `d`; the CPU samplers keep one
/// sample of a registered process in `d`, and the scheduler-switch program walks one
/// switch-out of a registered thread in `d`, each at random (0 and 1 keep every one). Written
/// by userspace's budget controller; a kept sample or walked interval carries `d` in its
/// flags (`sample_flags::WEIGHT_SHIFT`), so it stands for `d` of them and profiles stay
/// unbiased. One divisor for both: the controller sees one cost, and lowering both parts of
/// it by the same factor keeps its "cost proportional to the share" model true. Slot 1: the
/// scheduler-switch program's time slices under pauses ([`switch_share_draw`]).
#[map]
pub static SAMPLE_SHARE: Array<u32> = Array::with_max_entries(profiler_common::share_slot::SLOTS, 0);

/// The sampled share's verdict for one CPU sample: `Some(divisor)` to take it (the divisor
/// read once, so the weight is the one the choice was made with), `None` to skip it (counted
/// `SHARE_SKIPPED`).
#[inline(always)]
pub fn share_keeps() -> Option<u32> {
    let kept = share_draw();
    if kept == 0 {
        bump(counter::SHARE_SKIPPED);
        return None;
    }
    Some(kept)
}

/// [`share_keeps`] for any sampled event, not counted: the divisor (at least 1) to take it,
/// 0 to skip it (the caller counts it). A plain integer, not an `Option`: the verifier of
/// older kernels (6.1) refuses reads of an `Option`'s payload left uninitialised on the stack.
/// Without a share (divisor 0 or 1) it costs the one array lookup, no random draw.
#[inline(always)]
pub fn share_draw() -> u32 {
    let divisor = match SAMPLE_SHARE.get(profiler_common::share_slot::DIVISOR) {
        Some(d) if *d > 1 => *d,
        _ => return 1,
    };
    // SAFETY: a helper without arguments.
    let draw = unsafe { generated::bpf_get_prandom_u32() };
    if draw % divisor != 0 {
        return 0;
    }
    divisor
}

/// The scheduler-switch program's share of switch-outs: [`share_draw`] times its time
/// slices (`share_slot::SWITCH_SLICES`: attached one slice in that many), the weight of a
/// walked switch-out; 0 to walk none (not drawn, or the program drains before a pause).
#[inline(always)]
pub fn switch_share_draw() -> u32 {
    let slices = match SAMPLE_SHARE.get(profiler_common::share_slot::SWITCH_SLICES) {
        Some(s) if *s == profiler_common::share_slot::DRAINING => return 0,
        Some(s) if *s > 1 => *s,
        _ => 1,
    };
    let drawn = share_draw();
    // Both are bounded by userspace so that the product stays within `MAX_WEIGHT`.
    drawn.saturating_mul(slices)
}

/// Kernel-side counters, per CPU: see `profiler_common::counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::SLOTS, 0);

pub fn bump(index: u32) {
    add(index, 1);
}

/// Adds `n` to counter `index`.
pub fn add(index: u32, n: u64) {
    if let Some(count) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *count += n };
    }
}

/// Writes `len` bytes at `record` to `SAMPLES`, waking the reader only once a batch has
/// accumulated; a full ring is counted.
pub fn output_record(record: *const c_void, len: usize) {
    output_records(record, len, 1);
}

/// [`output_record`] for an item of `records` records (a full ring loses them all).
pub fn output_records(record: *const c_void, len: usize, records: u64) {
    let ring = &SAMPLES as *const RingBuf as *mut c_void;
    // Waking the reader for every record costs more than the walk itself; wake it only once
    // a batch has accumulated (userspace also drains on a short timer).
    // SAFETY: `ring` is the ring-buffer map.
    let pending = unsafe { generated::bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) };
    let flags = if pending >= WAKEUP_BYTES { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP };
    // SAFETY: the caller guarantees `len` bytes are readable at `record`.
    let ret = unsafe { generated::bpf_ringbuf_output(ring, record as *mut c_void, len as u64, flags) };
    if ret < 0 {
        add(counter::RINGBUF_FULL, records);
    }
}
