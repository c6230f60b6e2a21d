//! One process's native unwinder: its executable mappings (from `/proc/PID/maps`), each with
//! its file's unwind data (`module_file`), and the unwinding of one sample's registers and
//! copied stack with framehop (`.eh_frame` / `.debug_frame`, frame pointers where a module
//! has neither).

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};

use super::module_file::{self, LoadFailure, ModuleFile, SharedBytes};
use crate::discovery::read_maps;

/// Native frames unwound at most per sample.
pub const MAX_NATIVE_FRAMES: usize = 256;
/// Executable mappings tracked at most per process.
const MAX_MODULES: usize = 4096;
/// `/proc/PID/maps` is read again at most this often (when an address is in no module).
const REFRESH_INTERVAL: Duration = Duration::from_millis(500);

/// An executable mapping of a file.
pub struct LoadedModule {
    pub start: u64,
    pub end: u64,
    offset: u64,
    pub file: Arc<ModuleFile>,
}

impl LoadedModule {
    /// The address in the file of process address `avma`.
    pub fn file_address(&self, avma: u64) -> Option<u64> {
        self.file.file_address(self.start, self.offset, avma)
    }
}

/// One unwound native frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwoundFrame {
    /// Address to look up (inside the call instruction for return addresses).
    pub address: u64,
    /// The stack it occupies: `[low, high)`.
    pub low: u64,
    pub high: u64,
}

/// How one unwind ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindEnd {
    /// Reached the bottom of the stack.
    Complete,
    /// The copied stack ended first, or a frame could not be unwound.
    Truncated,
}

pub struct ProcessNative {
    pid: u32,
    unwinder: UnwinderX86_64<SharedBytes>,
    cache: CacheX86_64,
    /// Sorted by start.
    modules: Vec<LoadedModule>,
    /// Mapping starts already looked at (loaded, or not unwindable).
    known: HashSet<(u64, u64)>,
    last_refresh: Option<Instant>,
    /// Bumped whenever a module goes away: names cached by address must be forgotten (a
    /// different file may be mapped there next).
    pub removals: u64,
}

impl ProcessNative {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            modules: Vec::new(),
            known: HashSet::new(),
            last_refresh: None,
            removals: 0,
        }
    }

    /// The module containing `address`.
    pub fn module(&self, address: u64) -> Option<&LoadedModule> {
        let i = self.modules.partition_point(|m| m.start <= address);
        let m = self.modules.get(i.checked_sub(1)?)?;
        (address < m.end).then_some(m)
    }

    /// Unwinds one sample into `out`, leaf first: each frame's lookup address (the
    /// instruction pointer, then return addresses minus one) and the stack range it occupies
    /// (`[sp while it ran, sp of its caller)`). When the copied stack ends first, the last
    /// frame (whose extent is unknown) is left out.
    pub fn unwind(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8], out: &mut Vec<UnwoundFrame>) -> UnwindEnd {
        out.clear();
        if self.module(ip).is_none() {
            self.refresh();
        }
        let mut read_stack = |address: u64| -> Result<u64, ()> {
            let at = address.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let mut end = UnwindEnd::Truncated;
        let (unwinder, cache) = (&self.unwinder, &mut self.cache);
        // The unwind tables come from the target's files: should the unwinder panic on one,
        // the sample keeps the frames found so far, as a truncated stack.
        let mut step = |address: FrameAddress, regs: &mut UnwindRegsX86_64| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                unwinder.unwind_frame(address, regs, &mut *cache, &mut read_stack)
            }))
            .unwrap_or(Err(framehop::Error::IntegerOverflow))
        };
        while out.len() < MAX_NATIVE_FRAMES {
            let low = regs.sp();
            match step(address, &mut regs) {
                Ok(Some(return_address)) => {
                    out.push(UnwoundFrame { address: address.address_for_lookup(), low, high: regs.sp() });
                    // A caller's stack lies above its callee's: anything else is not a stack.
                    if regs.sp() <= low {
                        break;
                    }
                    match FrameAddress::from_return_address(return_address) {
                        Some(next) => address = next,
                        None => break,
                    }
                }
                Ok(None) => {
                    out.push(UnwoundFrame { address: address.address_for_lookup(), low, high: u64::MAX });
                    end = UnwindEnd::Complete;
                    break;
                }
                Err(_) => break,
            }
        }
        if out.iter().any(|f| self.module(f.address).is_none()) {
            self.refresh();
        }
        end
    }

    /// Reads `/proc/PID/maps` again (at most every `REFRESH_INTERVAL`): adds the executable
    /// file mappings not seen yet, drops those gone.
    fn refresh(&mut self) {
        if self.last_refresh.is_some_and(|t| t.elapsed() < REFRESH_INTERVAL) {
            return;
        }
        self.last_refresh = Some(Instant::now());
        let Ok(maps) = read_maps(self.pid) else { return };
        let executable: Vec<_> = maps.into_iter().filter(|m| m.perms[2] == b'x' && m.is_file()).collect();
        let present: HashSet<(u64, u64)> = executable.iter().map(|m| (m.start, m.end)).collect();
        let gone: Vec<u64> = self.modules.iter().filter(|m| !present.contains(&(m.start, m.end))).map(|m| m.start).collect();
        if !gone.is_empty() {
            self.removals += 1;
        }
        for start in gone {
            self.unwinder.remove_module(start);
            self.modules.retain(|m| m.start != start);
        }
        self.known.retain(|k| present.contains(k));
        for m in executable {
            if self.known.contains(&(m.start, m.end)) || self.modules.len() >= MAX_MODULES {
                continue;
            }
            let file = match module_file::load(self.pid, &m) {
                Ok(file) => file,
                // Looked at again on a later refresh.
                Err(LoadFailure::Pending) => continue,
                Err(LoadFailure::Unreadable) => {
                    self.known.insert((m.start, m.end));
                    continue;
                }
            };
            self.known.insert((m.start, m.end));
            let Some(base) = file.base_address(m.start, m.offset) else { continue };
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: file.text.clone(),
                got_svma: file.got.clone(),
                eh_frame_svma: file.eh_frame.as_ref().map(|(r, _)| r.clone()),
                eh_frame: file.eh_frame.as_ref().map(|(_, d)| d.clone()),
                eh_frame_hdr_svma: file.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
                eh_frame_hdr: file.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
                debug_frame: file.debug_frame.clone(),
                ..Default::default()
            };
            self.unwinder.add_module(Module::new(file.name.to_string(), m.start..m.end, base, info));
            let at = self.modules.partition_point(|x| x.start < m.start);
            self.modules.insert(at, LoadedModule { start: m.start, end: m.end, offset: m.offset, file });
        }
    }
}
