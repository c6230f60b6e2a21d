//! `--kernel` with off-CPU time: the kernel stacks where threads blocked, read from the
//! kernel's `OFF_CPU_KERNEL_STACKS` map by the id each interval carries, once per id.
//!
//! The kernel never replaces a kept stack (a slot holding another stack makes the switch-out
//! go without one), so an id names one stack for the whole recording and caching by id is
//! exact. The cache is bounded by bytes; past the bound it is emptied and refilled from the
//! map (one lookup per id).

use std::{collections::HashMap, sync::Arc};

use crate::kernel::loader::KernelProgram;

/// Most bytes of return addresses cached (the map holds at most 16 MiB).
const MAX_CACHED_BYTES: usize = 4 << 20;

/// Kernel stacks of off-CPU intervals by id, return addresses leaf first.
#[derive(Default)]
pub(crate) struct KernelStacks {
    stacks: HashMap<u32, Arc<[u64]>>,
    bytes: usize,
    /// Intervals whose stack id the map did not have (charged without kernel frames).
    pub(crate) missing: u64,
}

impl KernelStacks {
    /// The stack that `kernel_stack` (an `OffCpuInterval::kernel_stack`: id plus one) names;
    /// `None` for 0 or when the map has no such stack (counted in `missing`).
    pub(crate) fn get(&mut self, kernel: &KernelProgram, kernel_stack: u32) -> Option<Arc<[u64]>> {
        if kernel_stack == 0 {
            return None;
        }
        if let Some(stack) = self.stacks.get(&kernel_stack) {
            return Some(stack.clone());
        }
        let Some(addresses) = kernel.off_cpu_kernel_stack(kernel_stack) else {
            self.missing += 1;
            return None;
        };
        let stack: Arc<[u64]> = addresses.into();
        let size = stack.len() * 8 + 48;
        if self.bytes + size > MAX_CACHED_BYTES {
            self.stacks.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.stacks.insert(kernel_stack, stack.clone());
        Some(stack)
    }
}
