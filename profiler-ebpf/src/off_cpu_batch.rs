//! Off-CPU records gathered per CPU and sent to the ring buffer in batches.
//!
//! Every switch-in that ends a registered thread's wait sends a record. Sent one by one,
//! each `bpf_ringbuf_output` takes the ring's lock and moves its positions, cache lines that
//! the CPUs of a switching pair of threads pass back and forth at every switch (measured on
//! 2 CPUs: about 300 ns per record, 50 ns with both threads on one CPU). So a record is
//! appended to this CPU's batch (`OFF_CPU_BATCH`, an `OffCpuBatch`) instead, and the batch
//! goes to the ring as one item:
//! - before a record that would not fit (`OFF_CPU_BATCH_BYTES`);
//! - once its oldest record is `OFF_CPU_BATCH_AGE_NS` old, checked when a record is added and
//!   at every CPU-clock sample on the CPU (`send_if_old`). With the sampler on every CPU
//!   (`agent`, `top`, `record` without `--pid`; the CPU clock fires on idle CPUs too),
//!   records reach userspace within that age or a sampling period, whichever is longer: the
//!   pending waits charged at a period's end rely on it. With per-task events (`record
//!   --pid`) a batch may wait for the next switch on its CPU, or for the end;
//! - at once, record by record, when `OFF_CPU_BATCH_AGE_NS` is 0 (a recording that keeps a
//!   timeline, which needs each thread's records in time order).
//! After detaching, userspace reads what is left in every CPU's batch.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, generated::bpf_probe_read_kernel},
    macros::map,
    maps::PerCpuArray,
};
use profiler_common::{MAX_RECORD_SIZE, OFF_CPU_BATCH_BYTES, OffCpuBatch, counter};

use crate::maps::{bump, output_records};

/// A batch is sent once its oldest record is this old (nanoseconds); 0: records are sent at
/// once. Set at load time.
#[unsafe(no_mangle)]
static OFF_CPU_BATCH_AGE_NS: u64 = 0;

#[map]
static OFF_CPU_BATCH: PerCpuArray<OffCpuBatch> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's batch.
#[inline(always)]
fn batch_mut() -> Option<&'static mut OffCpuBatch> {
    // SAFETY: a per-CPU value; the programs that touch it (scheduler switch, CPU-clock
    // sample) run with interrupts off on their CPU and never interrupt one another there.
    OFF_CPU_BATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The batch age after which it is sent (0: no batching).
#[inline(always)]
fn max_age_ns() -> u64 {
    // SAFETY: a frozen load-time constant.
    unsafe { core::ptr::read_volatile(&OFF_CPU_BATCH_AGE_NS) }
}

/// Sends the `len` bytes of the off-CPU record at `record` (switched in at `now`): appended
/// to this CPU's batch, which goes to the ring buffer first if the record would not fit, and
/// with it if its oldest record is old enough.
pub fn send_off_cpu_record(record: *const c_void, len: usize, now: u64) {
    let max_age = max_age_ns();
    let batch = match batch_mut() {
        Some(batch) if max_age != 0 => batch,
        _ => return output_records(record, len, 1),
    };
    let len = if len > MAX_RECORD_SIZE { MAX_RECORD_SIZE } else { len };
    if batch.len as usize + len > OFF_CPU_BATCH_BYTES {
        send(batch);
    }
    // Reloaded and masked, so that the verifier sees the offset's bound whatever the
    // compiler knows of it (below `OFF_CPU_BATCH_BYTES` here in any case).
    // SAFETY: a plain read of the batch's own field.
    let at = unsafe { core::ptr::read_volatile(&batch.len) } as usize & (OFF_CPU_BATCH_BYTES - 1);
    // SAFETY: `at + len` is within `bytes` (`at` below `OFF_CPU_BATCH_BYTES`, `len` at most
    // `MAX_RECORD_SIZE`); `record` holds `len` readable bytes (the caller's map value).
    let copied = unsafe {
        bpf_probe_read_kernel(batch.bytes.as_mut_ptr().add(at) as *mut c_void, len as u32, record)
    };
    if copied != 0 {
        // Not expected (kernel memory the program owns); counted as a record lost.
        bump(counter::RINGBUF_FULL);
        return;
    }
    if batch.records == 0 {
        batch.first_ns = now;
    }
    batch.len = (at + len) as u32;
    batch.records += 1;
    if now.wrapping_sub(batch.first_ns) >= max_age {
        send(batch);
    }
}

/// Sends this CPU's batch if it holds a record at least `OFF_CPU_BATCH_AGE_NS` old (at every
/// CPU-clock sample). Without batching (no off-CPU time, or a timeline) the frozen 0 ends it
/// before any lookup.
#[inline(always)]
pub fn send_if_old() {
    let max_age = max_age_ns();
    if max_age == 0 {
        return;
    }
    let Some(batch) = batch_mut() else { return };
    if batch.records == 0 {
        return;
    }
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(batch.first_ns) >= max_age {
        send(batch);
    }
}

/// Sends the batch as one ring-buffer item and empties it.
fn send(batch: &mut OffCpuBatch) {
    // SAFETY: as in `send_off_cpu_record`.
    let len = unsafe { core::ptr::read_volatile(&batch.len) } as usize;
    let len = if len > OFF_CPU_BATCH_BYTES { OFF_CPU_BATCH_BYTES } else { len };
    if len != 0 {
        output_records(batch.bytes.as_ptr() as *const c_void, len, batch.records as u64);
        bump(counter::OFF_CPU_BATCHES);
    }
    batch.len = 0;
    batch.records = 0;
}
