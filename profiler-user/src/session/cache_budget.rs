//! Keeps the caches of all processes within their budget (see `sample::caches`).

use std::sync::atomic::Ordering::Relaxed;

use super::Session;
use crate::sample::{
    aggregate::Profile,
    caches::{CACHE_BYTES, GLOBAL_BUDGET, GLOBAL_LOW_WATER},
};

impl Session {
    /// Keeps the caches of all processes within `GLOBAL_BUDGET`: past it, empties the largest
    /// until the sum is under `GLOBAL_LOW_WATER`. Cheap when under budget (one load).
    pub(crate) fn enforce_cache_budget(&mut self) {
        if CACHE_BYTES.load(Relaxed) <= GLOBAL_BUDGET {
            return;
        }
        let mut sizes: Vec<(usize, u32)> = self.targets.iter().map(|(pid, t)| (t.cache_bytes(), *pid)).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        for (_, pid) in sizes {
            if CACHE_BYTES.load(Relaxed) <= GLOBAL_LOW_WATER {
                break;
            }
            if let Some(target) = self.targets.get_mut(&pid) {
                target.clear_caches();
            }
        }
    }

    /// Hands over this interval's profile (the agent) and starts the next one, keeping the
    /// labels of processes still profiled. Caches holding the old interval's frame ids are
    /// emptied lazily: each target sees the new epoch at its next sample.
    pub(crate) fn take_interval(&mut self) -> Profile {
        let targets = &self.targets;
        self.profile.take_interval(|pid| targets.get(&pid).is_some_and(|t| t.alive))
    }
}

