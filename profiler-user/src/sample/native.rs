//! One profiled process's native side: turns the native part of a sample into frames of the
//! profile and merges them with the sample's (already validated) Python frames.

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use profiler_common::{native_regs, walk_end};

use super::{
    FrameId,
    aggregate::{FrameName, Profile},
    native_merge::{self as merge, EvalGrouping, NativeFrame, WalkedFrame},
};
use crate::{
    target::native::{NativeContext, demangle::demangle, NativeOrigin, ProcessNative, UnwindEnd, is_eval_function, kernel_addresses, parse_native, process::UnwoundFrame},
    stats::Counters,
};

/// Frame names cached per process (by address), before the cache is emptied.
const MAX_CACHED_ADDRESSES: usize = 1 << 16;

/// Kernel functions of the tracing machinery that runs pyperch's own programs (BPF programs
/// and their trampolines, a tracepoint's dispatch), as opposed to the traced thread's code.
fn is_tracing_function(name: &str) -> bool {
    name.starts_with("bpf_") || name.starts_with("__bpf_") || name.starts_with("__traceiter_") || name.starts_with("trace_call_bpf")
}

/// The marker of a stop in musl's libc, whichever way the stack was unwound: musl keeps next
/// to no unwind rows for its own code (`target::native::musl`).
pub const MUSL_STOP_MARKER: &str = "<native unwind stopped in musl libc (no unwind tables)>";

/// Markers of a stack unwound from a copy of it that ended first, by `walk_end`.
const COPY_MARKERS: [(u32, &str); 2] = [
    (walk_end::COPY, "<truncated native>"),
    // Copied because the process's tables were still loading.
    (walk_end::COPY_WHILE_LOADING, "<truncated native (tables loading)>"),
];

/// The marker where a native stack stopped before its bottom (placed where the unwound part
/// ends: between Python frames, at the leaf, or at the root). `end` (a `walk_end`) is how
/// the kernel ended its walk, or that it copied the stack; `in_musl`: the frame the unwind
/// could not get past lies in musl's libc. A walk that ended there for want of rows (the
/// kernel's), or a copy unwound by pyperch (which stops at musl's code), says musl's name;
/// any other end says its own reason (`stats::walk_end_label`).
fn stop_marker(end: u32, in_musl: bool) -> Cow<'static, str> {
    if in_musl && (walk_end::is_copy(end) || end == walk_end::NO_ROW) {
        return Cow::Borrowed(MUSL_STOP_MARKER);
    }
    match COPY_MARKERS.iter().find(|(e, _)| *e == end) {
        Some((_, marker)) => Cow::Borrowed(marker),
        None => Cow::Owned(format!("<native unwind stopped {}>", crate::stats::walk_end_label(end))),
    }
}

/// The profile is at its byte budget and a new frame was needed.
pub struct ProfileFull;

pub struct NativeSampler {
    context: Arc<NativeContext>,
    grouping: EvalGrouping,
    unwinder: Option<ProcessNative>,
    /// Address → (frame, is the evaluation function); ids of the profile's current epoch.
    names: HashMap<u64, (FrameId, bool)>,
    unwound: Vec<UnwoundFrame>,
    native: Vec<NativeFrame>,
    /// `ProcessNative::removals` when `names` was last valid.
    removals: u64,
}

impl NativeSampler {
    pub fn new(pid: u32, context: Arc<NativeContext>, grouping: EvalGrouping) -> Self {
        let unwinder = context.io.as_ref().map(|io| ProcessNative::new(pid, io, context.tables.clone()));
        Self { context, grouping, unwinder, names: HashMap::new(), unwound: Vec::new(), native: Vec::new(), removals: 0 }
    }

    /// Whether the process's maps or files are still being read (never waits).
    pub fn waiting(&mut self) -> bool {
        match (self.unwinder.as_mut(), self.context.io.as_ref()) {
            (Some(u), Some(io)) => u.waiting(io),
            _ => false,
        }
    }

    /// Forgets cached frame ids (a new profile epoch).
    pub fn clear(&mut self) {
        self.names = HashMap::new();
    }

    /// Bytes held by the name cache (approximate).
    pub fn bytes(&self) -> usize {
        self.names.capacity() * 24
    }

    /// The final stack, root first, into `out`: `python` (root first, shown frames) with the
    /// native and kernel frames of `native_part` around it. `walked` is every interpreter
    /// frame of the sample, root first (for the evaluation-call boundaries). `collecting`:
    /// the kernel saw the thread run the garbage collector; without user frames (`--kernel`
    /// alone) a `<GC>` frame then ends the Python frames, under the kernel frames (with
    /// them, the collector's own C functions show).
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &mut self,
        python: &[FrameId],
        walked: &[WalkedFrame],
        native_part: &[u8],
        collecting: bool,
        profile: &mut Profile,
        counters: &mut Counters,
        out: &mut Vec<FrameId>,
    ) -> Result<(), ProfileFull> {
        out.clear();
        if self.names.len() > MAX_CACHED_ADDRESSES {
            self.clear();
        }
        let Some((trailer, kernel, user)) = parse_native(native_part) else {
            counters.native_malformed += 1;
            out.extend_from_slice(python);
            return Ok(());
        };
        // Leaf first from here on.
        let mut leaf_first: Vec<FrameId> = Vec::with_capacity(python.len() + 64);
        match self.unwinder.as_mut() {
            None => {
                if collecting {
                    leaf_first.push(self.marker(profile, crate::time_mode::GC_FRAME)?);
                }
                leaf_first.extend(python.iter().rev());
            }
            Some(_) if trailer.regs == native_regs::NONE || user.is_empty() => {
                counters.native_no_stack += 1;
                leaf_first.push(self.marker(profile, "<no native stack>")?);
                leaf_first.extend(python.iter().rev());
            }
            Some(unwinder) => {
                let mut unwound = std::mem::take(&mut self.unwound);
                let end = match self.context.io.as_ref() {
                    Some(io) if !profiler_common::walk_end::is_copy(trailer.walk_end) => {
                        counters.native_walk_ends[(trailer.walk_end as usize).min(profiler_common::walk_end::LAST as usize)] += 1;
                        unwinder.walked(user, trailer.walk_end, trailer.sp, io, &mut unwound)
                    }
                    Some(io) => {
                        if trailer.walk_end == profiler_common::walk_end::COPY_WHILE_LOADING {
                            counters.native_walk_ends[profiler_common::walk_end::COPY_WHILE_LOADING as usize] += 1;
                        }
                        unwinder.unwind(trailer.ip, trailer.sp, trailer.bp, user, io, &mut unwound)
                    }
                    None => UnwindEnd::Loading,
                };
                let in_musl = unwinder.stopped_in_musl_libc();
                if unwinder.removals != self.removals {
                    self.removals = unwinder.removals;
                    self.names = HashMap::new();
                }
                if end == UnwindEnd::Loading {
                    // Its maps or a file it runs in are still being read (off the loop): the
                    // Python frames alone, never a native stack guessed without them.
                    self.unwound = unwound;
                    counters.native_loading += 1;
                    leaf_first.push(self.marker(profile, "<loading native>")?);
                    leaf_first.extend(python.iter().rev());
                } else {
                    let mut native = std::mem::take(&mut self.native);
                    native.clear();
                    let mut result = Ok(());
                    for f in &unwound {
                        match self.user_frame(f.address, profile) {
                            Ok((id, is_eval)) => native.push(NativeFrame { id, is_eval, low: f.low, high: f.high }),
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    self.unwound = unwound;
                    if let Err(e) = result {
                        self.native = native;
                        return Err(e);
                    }
                    let walked_leaf_first: Vec<WalkedFrame> = walked.iter().rev().copied().collect();
                    let groups = merge::groups(&walked_leaf_first, self.grouping);
                    let truncated = self.marker(profile, &stop_marker(trailer.walk_end, in_musl))?;
                    let merged = groups.and_then(|g| merge::merge(&g, &native, end == UnwindEnd::Complete, truncated));
                    match merged {
                        Some(m) => {
                            counters.native_merged += 1;
                            if end == UnwindEnd::Truncated {
                                counters.native_truncated += 1;
                            }
                            leaf_first.extend(m);
                        }
                        None => {
                            counters.native_unmerged += 1;
                            leaf_first.push(self.marker(profile, "<unmerged native>")?);
                            leaf_first.extend(python.iter().rev());
                        }
                    }
                    self.native = native;
                }
            }
        }
        // Kernel frames go on top, leaf side.
        let mut kernel_ids = Vec::new();
        for a in kernel_addresses(kernel) {
            kernel_ids.push(self.kernel_frame(a, profile)?);
        }
        out.extend(leaf_first.iter().rev());
        out.extend(kernel_ids.iter().rev());
        Ok(())
    }

    fn marker(&mut self, profile: &mut Profile, text: &str) -> Result<FrameId, ProfileFull> {
        profile.try_intern(FrameName { function: Arc::from(text), file: Arc::from(""), line: 0, native: None }).ok_or(ProfileFull)
    }

    /// The frame of a user address: `function (library)`, `library+0xoffset` without a
    /// symbol, `<unknown native>` outside any file.
    fn user_frame(&mut self, address: u64, profile: &mut Profile) -> Result<(FrameId, bool), ProfileFull> {
        if let Some(&found) = self.names.get(&address) {
            return Ok(found);
        }
        let module = self.unwinder.as_ref().and_then(|u| u.module(address));
        let (name, is_eval) = match module.and_then(|m| Some((m, m.file_address(address)?))) {
            Some((m, at)) => match m.file.symbol(at) {
                Some(symbol) => {
                    // `function (file:line)` with DWARF line tables, else `function (library)`.
                    let (file, line) = m.file.line(at).unwrap_or_else(|| (m.file.name.clone(), 0));
                    let function = demangle(symbol).map_or_else(|| symbol.clone(), Arc::from);
                    (FrameName { function, file, line, native: m.file.origin(at) }, is_eval_function(symbol))
                }
                None => (
                    FrameName {
                        function: Arc::from(format!("{}+{:#x}", m.file.name, at)),
                        file: Arc::from(""),
                        line: 0,
                        native: m.file.origin(at),
                    },
                    false,
                ),
            },
            // In a mapped file without its module (evicted from the cache, or refused):
            // `library+0xOFFSET` (a file offset), else outside any file.
            None => {
                let shown = self.unwinder.as_ref().and_then(|u| u.unloaded_name(address));
                let function: Arc<str> = shown.map_or_else(|| Arc::from("<unknown native>"), Arc::from);
                (FrameName { function, file: Arc::from(""), line: 0, native: None }, false)
            }
        };
        let id = profile.try_intern(name).ok_or(ProfileFull)?;
        // Only named frames are cached by address: a module not loaded yet may load later.
        if module.is_some() {
            self.names.insert(address, (id, is_eval));
        }
        Ok((id, is_eval))
    }

    /// `--kernel` with off-CPU time: pushes onto `stack` (root first) the kernel frames of
    /// `leaf_first`, the kernel stack where a thread was switched out, root first: from the
    /// system call's entry down to the scheduler. The leaf-side frames of the tracing that
    /// took the stack (the BPF program and the tracepoint's dispatch) are left out: they are
    /// pyperch's, not the thread's.
    pub fn push_blocked_kernel_frames(&mut self, leaf_first: &[u64], profile: &mut Profile, stack: &mut Vec<FrameId>) -> Result<(), ProfileFull> {
        let tracing = leaf_first
            .iter()
            .take_while(|&&address| {
                self.context.kallsyms.as_ref().and_then(|k| k.symbol(address)).is_some_and(|name| is_tracing_function(name))
            })
            .count();
        for &address in leaf_first[tracing..].iter().rev() {
            let id = self.kernel_frame(address, profile)?;
            stack.push(id);
        }
        Ok(())
    }

    /// The frame of a kernel address: `function_[k]` (inferno colours the suffix). Its
    /// runtime address (the origin pprof writes) only with `--kernel-addresses`: otherwise no
    /// output holds a kernel address.
    fn kernel_frame(&mut self, address: u64, profile: &mut Profile) -> Result<FrameId, ProfileFull> {
        if let Some(&(id, _)) = self.names.get(&address) {
            return Ok(id);
        }
        // Without a symbol there is no function address: the frame carries no origin (one
        // `<kernel>_[k]` frame, not one per address).
        let (function, native) = match self.context.kallsyms.as_ref().and_then(|k| k.symbol_at(address)) {
            Some((start, name)) => {
                let origin = self
                    .context
                    .options
                    .kernel_addresses
                    .then(|| Arc::new(NativeOrigin { address: start, mapping: self.context.kernel_mapping.clone() }));
                (format!("{name}_[k]"), origin)
            }
            None => ("<kernel>_[k]".to_string(), None),
        };
        let id = profile.try_intern(FrameName { function: Arc::from(function), file: Arc::from(""), line: 0, native }).ok_or(ProfileFull)?;
        self.names.insert(address, (id, false));
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_markers_name_musl_where_its_libc_stopped_the_unwind() {
        // The kernel walk found no rows, in musl's libc and elsewhere.
        assert_eq!(stop_marker(walk_end::NO_ROW, true), MUSL_STOP_MARKER);
        assert_eq!(stop_marker(walk_end::NO_ROW, false), "<native unwind stopped in code without unwind rows>");
        // A copy unwound by pyperch stops at musl's code.
        assert_eq!(stop_marker(walk_end::COPY, true), MUSL_STOP_MARKER);
        assert_eq!(stop_marker(walk_end::COPY_WHILE_LOADING, true), MUSL_STOP_MARKER);
        assert_eq!(stop_marker(walk_end::COPY, false), "<truncated native>");
        assert_eq!(stop_marker(walk_end::COPY_WHILE_LOADING, false), "<truncated native (tables loading)>");
        // Other ends keep their own reason, wherever the frame lies.
        assert_eq!(stop_marker(walk_end::READ_FAULT, true), "<native unwind stopped at an unreadable stack word>");
        assert_eq!(stop_marker(walk_end::DEPTH, false), "<native unwind stopped at the depth limit>");
        assert!(MUSL_STOP_MARKER.starts_with("<native unwind stopped "));
    }
}
