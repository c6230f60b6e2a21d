//! Reading interpreter frames and their code objects' validation words from user memory.

use aya_ebpf::helpers::{bpf_probe_read_user, generated};
use profiler_common::{
    FRAME_READ_MAX, FrameBytes, FrameEntry, FrameLayout, NO_FIELD, code_check, code_check_applies, code_check_needs_strings,
    code_check_size, code_check_strings, decode_frame,
};

/// State of one walk, kept in the per-CPU scratch between loop callbacks.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WalkState {
    /// The next frame to read (0: the bottom was reached).
    pub frame: u64,
    pub hash: u64,
    pub n_full: u32,
    pub n_hashed: u32,
    pub status: u32,
    /// The check of the last code object computed in this walk, and its address: a code
    /// object met again in the same walk (recursion) has the same check, since the stopped
    /// thread's frames keep it and its strings alive and all the fields read are immutable.
    pub last_check: u32,
    /// Non-zero: this walk may take and keep validation words in the CPU's [`CheckCache`]
    /// (the process's code-generation counter was read at its start).
    pub cache_ok: u32,
    pub last_code: u64,
    /// Validation words taken from the cache / read from the target in this walk.
    pub checks_cached: u32,
    pub checks_read: u32,
}

/// Sets of [`CheckCache`] (a power of two), of [`CHECK_CACHE_WAYS`] slots each.
pub const CHECK_CACHE_SETS: usize = 256;
/// Slots per set: with one, two of a walk's code objects that hash to one set evict each
/// other at every walk (34 code objects in 256 sets: about two such pairs, four reads per
/// walk); with two, it takes three in one set.
pub const CHECK_CACHE_WAYS: usize = 2;

/// One code object's validation word, valid while its `stamp` is the cache's.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CachedCheck {
    pub code: u64,
    pub stamp: u64,
    pub check: u32,
    pub _pad: u32,
}

/// Validation words computed by earlier walks on this CPU, for the process and the value of
/// its code-generation counter they were computed under (`profiler_common::code_generation`):
/// while that counter reads the same, no code object can have been replaced at an address a
/// walk checked, so the word is the one a new read would give. A different process,
/// registration or counter value starts a new stamp, which voids every slot at once (the
/// stamp is 64 bits wide: it never comes back). Two-way set-associative by code address;
/// lives in the per-CPU scratch, so it is never shared between CPUs.
#[repr(C)]
pub struct CheckCache {
    tgid: u32,
    generation: u32,
    counter: u64,
    /// `_PyRuntime.interpreters.next_id` (3.13+; 0 before), read with the counter.
    next_interpreter_id: u64,
    /// 0: never used.
    stamp: u64,
    sets: [[CachedCheck; CHECK_CACHE_WAYS]; CHECK_CACHE_SETS],
}

impl CheckCache {
    /// Makes the cache the one of process `tgid` (registration `generation`) with its counter
    /// reading `counter` and its next interpreter id `next_interpreter_id`: kept as it is if
    /// it already was, else emptied.
    #[inline(always)]
    pub fn begin(&mut self, tgid: u32, generation: u32, counter: u64, next_interpreter_id: u64) {
        if self.stamp == 0
            || self.tgid != tgid
            || self.generation != generation
            || self.counter != counter
            || self.next_interpreter_id != next_interpreter_id
        {
            self.tgid = tgid;
            self.generation = generation;
            self.counter = counter;
            self.next_interpreter_id = next_interpreter_id;
            self.stamp = self.stamp.wrapping_add(1);
        }
    }

    /// Fibonacci hashing: code objects of one size class lie at a fixed stride, which
    /// shifted and xored address bits map onto few slots (a third of the chain's 34 code
    /// objects evicted each other on 3.15); the multiply spreads every address bit.
    #[inline(always)]
    fn set(code: u64) -> usize {
        (code.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize & (CHECK_CACHE_SETS - 1)
    }

    #[inline(always)]
    fn get(&self, code: u64) -> Option<u32> {
        if self.stamp == 0 {
            return None;
        }
        let set = &self.sets[Self::set(code)];
        let hit = |slot: &CachedCheck| (slot.code == code && slot.stamp == self.stamp).then_some(slot.check);
        hit(&set[0]).or_else(|| hit(&set[1]))
    }

    /// Keeps `check` for `code` in its set: in the first slot not of this stamp, else in the
    /// second (the first keeps what it holds, so a set asked for three code objects still
    /// hits on one).
    #[inline(always)]
    fn put(&mut self, code: u64, check: u32) {
        let stamp = self.stamp;
        let set = &mut self.sets[Self::set(code)];
        let way = if set[0].stamp != stamp { 0 } else { 1 };
        let slot = &mut set[way];
        slot.code = code;
        slot.stamp = stamp;
        slot.check = check;
    }
}

/// Reads one frame into `entry`; returns the address of the previous (calling) frame.
#[inline(always)]
pub fn read_frame(layout: &FrameLayout, frame: u64, buf: &mut FrameBytes, entry: &mut FrameEntry) -> Option<u64> {
    let size = layout.read_size & (FRAME_READ_MAX as u32 - 1);
    if size == 0 {
        return None;
    }
    // SAFETY: the helper writes at most `size` < FRAME_READ_MAX bytes into `buf`.
    let ret = unsafe {
        generated::bpf_probe_read_user(buf.as_mut_ptr() as *mut _, size, frame as *const _)
    };
    if ret != 0 {
        return None;
    }
    Some(decode_frame(layout, frame, buf, entry))
}

/// Bytes of target memory read at once into a [`FrameBlock`] (see [`read_frame_blocked`]).
pub const BLOCK_BYTES: usize = 4096;

/// Up to `BLOCK_BYTES` of target memory read in one helper call during this walk. Reset at
/// the start of every walk (`len == 0`): its bytes are never older than the walk that uses
/// them.
#[repr(C)]
pub struct FrameBlock {
    /// Target address of `bytes[0]`.
    pub start: u64,
    /// Valid bytes from `start`; 0: empty.
    pub len: u64,
    /// Room for any masked offset plus one `FrameBytes` view.
    pub bytes: [u8; BLOCK_BYTES + FRAME_READ_MAX + 8],
}

/// The two blocks a walk reads frames from. The frames of 3.11+ live one after another in the
/// thread's data stack, callers below callees, so the callers of a frame are usually already
/// in the `data_stack` block. Between them lie frames elsewhere: the evaluation function's
/// entry frames on the C stack (3.12+: one per call from C into Python; outer ones at higher
/// addresses), generator frames on the heap, 3.15's sentinel frame in the thread state. Those
/// go to the `elsewhere` block, so the walk coming back to the data stack finds its block
/// still there (on 3.15 the token workload's walk went from five reads to three).
#[repr(C)]
pub struct FrameBlocks {
    pub data_stack: FrameBlock,
    pub elsewhere: FrameBlock,
}

impl FrameBlocks {
    /// Empties both blocks (at the start of every walk).
    #[inline(always)]
    pub fn clear(&mut self) {
        self.data_stack.len = 0;
        self.elsewhere.len = 0;
    }

    /// Reads the block of `elsewhere` around the 8 bytes at `address` (see [`fill_around`])
    /// and returns the u64 at `address` from it, or from a read of its own
    /// when that fails; 0 on a fault. For 3.11/3.12's `_PyCFrame`, which lies in the
    /// evaluation function's C frame next to that call's entry frame: the walk's last frame
    /// then comes from this read.
    #[inline(always)]
    pub fn u64_around(&mut self, address: u64) -> u64 {
        let Some(end) = address.checked_add(8) else { return 0 };
        if fill_around(&mut self.elsewhere, address, end) {
            let view = self.elsewhere.view(address);
            // SAFETY: `view` holds `FrameBytes`' size from `address`, of which the block holds 8.
            return unsafe { core::ptr::read_unaligned(view.as_ptr() as *const u64) };
        }
        read_u64(address)
    }
}

/// How far below the data-stack block a frame may lie and still be taken for the next part
/// of the same data stack (a chunk is 16 KiB or more); frames further away are read into
/// the other block.
const DATA_STACK_REACH: u64 = 64 * 1024;

/// Reads one frame into `entry` as [`read_frame`] does, with the same result, but for layouts
/// whose frames live in the thread's data stack (3.11+: the layout has an owner field) from
/// `blocks`: a frame already inside one costs no read. Otherwise:
/// - a frame in the data stack (the first frame, or one below the data-stack block within
///   `DATA_STACK_REACH`) refills that block with at most `BLOCK_BYTES` that end where this
///   frame's bytes end and begin no lower than the frame's own page;
/// - any other frame refills the other block with the page it lies in ([`fill_around`]);
/// - a frame that still does not fit (a range that faults) is read on its own into `buf`.
/// The thread is stopped while the program runs, so bytes read in one call are the same
/// bytes a read per frame would give.
#[inline(always)]
pub fn read_frame_blocked(
    layout: &FrameLayout,
    frame: u64,
    blocks: &mut FrameBlocks,
    buf: &mut FrameBytes,
    entry: &mut FrameEntry,
) -> Option<u64> {
    let size = (layout.read_size & (FRAME_READ_MAX as u32 - 1)) as u64;
    if layout.owner == NO_FIELD || size == 0 {
        return read_frame(layout, frame, buf, entry);
    }
    let Some(end) = frame.checked_add(size) else {
        return read_frame(layout, frame, buf, entry);
    };
    if blocks.data_stack.holds(frame, end) {
        return Some(decode_frame(layout, frame, blocks.data_stack.view(frame), entry));
    }
    if blocks.elsewhere.holds(frame, end) {
        return Some(decode_frame(layout, frame, blocks.elsewhere.view(frame), entry));
    }
    let data = &blocks.data_stack;
    let in_data_stack = data.len == 0 || (frame < data.start && data.start - frame <= DATA_STACK_REACH);
    let block = if in_data_stack {
        // Never below the frame's own page: from there to the frame is readable whenever the
        // frame is, whereas the page below may not be mapped (a data-stack chunk begins a
        // mapping), and a read that faults costs far more (about 1 us per walk, measured on
        // the switch program) than the read per page it saves. Callers in a lower page refill.
        let page = frame & !(PAGE_BYTES - 1);
        let back = end.saturating_sub(BLOCK_BYTES as u64);
        let start = if back > page { back } else { page };
        let block = &mut blocks.data_stack;
        if !fill_block(block, start, end) {
            return read_frame(layout, frame, buf, entry);
        }
        block
    } else {
        let block = &mut blocks.elsewhere;
        if !fill_around(block, frame, end) {
            return read_frame(layout, frame, buf, entry);
        }
        block
    };
    Some(decode_frame(layout, frame, block.view(frame), entry))
}

/// Reads the page that `[start, end)` begins in (readable whenever `[start, end)` is), or,
/// when `[start, end)` runs into the next page, the `BLOCK_BYTES` that end where it ends:
/// frames outside the data stack lie both above (outer entry frames on the C stack) and below
/// (the callers in an older data-stack chunk) the one that missed. False (block emptied) on a
/// fault.
#[inline(always)]
fn fill_around(block: &mut FrameBlock, start: u64, end: u64) -> bool {
    let page_end = (start & !(PAGE_BYTES - 1)).saturating_add(PAGE_BYTES);
    let to = if end > page_end { end } else { page_end };
    fill_block(block, to.saturating_sub(BLOCK_BYTES as u64), to)
}

/// The smallest page size: memory from a page's start to a readable frame in it is readable.
const PAGE_BYTES: u64 = 4096;

/// Reads `[start, end)` (at most `BLOCK_BYTES`) into `block`; false (block emptied) on a fault.
#[inline(always)]
fn fill_block(block: &mut FrameBlock, start: u64, end: u64) -> bool {
    block.len = 0;
    let len = end.wrapping_sub(start);
    if len == 0 || len > BLOCK_BYTES as u64 {
        return false;
    }
    // SAFETY: the helper writes at most `len` <= BLOCK_BYTES bytes into `bytes`.
    let ret = unsafe {
        generated::bpf_probe_read_user(block.bytes.as_mut_ptr() as *mut _, len as u32, start as *const _)
    };
    if ret != 0 {
        return false;
    }
    block.start = start;
    block.len = len;
    true
}

/// `frame_code_check`, computed once per run of equal code addresses in a walk (the common
/// deep stack is recursion: one code object, hundreds of frames).
#[inline(always)]
pub fn walk_code_check(
    layout: &FrameLayout,
    entry: &FrameEntry,
    window: &mut FrameBytes,
    block: &mut FrameBlock,
    walk: &mut WalkState,
    cache: &mut CheckCache,
) -> u32 {
    if !code_check_applies(layout, entry) {
        return 0;
    }
    if entry.code == walk.last_code {
        return walk.last_check;
    }
    let cached = if walk.cache_ok != 0 { cache.get(entry.code) } else { None };
    let check = match cached {
        Some(check) => {
            walk.checks_cached += 1;
            check
        }
        None => {
            let mut cacheable = false;
            let check = frame_code_check(layout, entry, window, block, &mut cacheable);
            walk.checks_read += 1;
            if walk.cache_ok != 0 && cacheable && check != 0 {
                cache.put(entry.code, check);
            }
            check
        }
    };
    walk.last_code = entry.code;
    walk.last_check = check;
    check
}

/// The validation word of the frame's code object (`profiler_common::code_check`): the code
/// object's window, and, only when the window has no per-object version (before 3.12), one
/// 16-byte read of each of `co_name` and `co_filename`. 0: no check (a shim) or the window
/// was unreadable. `cacheable` is set when the word rests on the window alone (a non-zero
/// `co_version`): such a word never changes while the code object lives (a string's lazily
/// computed hash can change the other kind once), so it may be kept in a [`CheckCache`].
///
/// The window comes from `block` (reset at the start of every walk) when it is inside it;
/// otherwise the block is refilled with the `BLOCK_BYTES` around the window (or the window's
/// own page, when they are not all readable), and failing that the window is read on its own
/// into `window`. Code objects created together (a module's functions) lie close together on
/// the heap, so one read usually serves the windows of several frames. Every byte comes from
/// this program run, while the thread is stopped and its frames keep these code objects
/// alive: the word is the one a read of its own would give.
#[inline(always)]
pub fn frame_code_check(
    layout: &FrameLayout,
    entry: &FrameEntry,
    window: &mut FrameBytes,
    block: &mut FrameBlock,
    cacheable: &mut bool,
) -> u32 {
    if !code_check_applies(layout, entry) {
        return 0;
    }
    let size = code_check_size(layout);
    if size == 0 {
        return 0;
    }
    let address = entry.code.wrapping_add(layout.check_start as u64);
    let Some(bytes) = code_window(block, window, address, size as u64) else {
        return 0;
    };
    let (mut name, mut filename) = ([0u64; 2], [0u64; 2]);
    let needs_strings = code_check_needs_strings(layout, bytes);
    *cacheable = !needs_strings;
    if needs_strings {
        let (name_ptr, filename_ptr) = code_check_strings(layout, bytes);
        name = read_str_key(name_ptr + layout.check_str as u64);
        filename = read_str_key(filename_ptr + layout.check_str as u64);
    }
    code_check(layout, bytes, name, filename)
}

/// The `size` bytes at `address` (a code object's window), as a view into `block` or, when
/// that cannot hold them, read into `window`; `None` when unreadable.
#[inline(always)]
fn code_window<'a>(block: &'a mut FrameBlock, window: &'a mut FrameBytes, address: u64, size: u64) -> Option<&'a FrameBytes> {
    let Some(end) = address.checked_add(size) else { return None };
    if !block.holds(address, end) {
        // Around the window, within the pages the window itself lies in (readable whenever
        // it is): a read that faults on a neighbouring page costs more than it saves.
        let first_page = address & !(PAGE_BYTES - 1);
        let after_last_page = (end.saturating_sub(1) & !(PAGE_BYTES - 1)).saturating_add(PAGE_BYTES);
        let back = address.saturating_sub((BLOCK_BYTES / 2) as u64);
        let start = if back > first_page { back } else { first_page };
        let block_end = start.saturating_add(BLOCK_BYTES as u64);
        let block_end = if block_end < after_last_page { block_end } else { after_last_page };
        if !fill_block(block, start, block_end) {
            // SAFETY: the helper writes at most `size` < FRAME_READ_MAX bytes into `window`.
            let ret = unsafe {
                generated::bpf_probe_read_user(
                    window.as_mut_ptr() as *mut _,
                    (size as u32) & (FRAME_READ_MAX as u32 - 1),
                    address as *const _,
                )
            };
            return if ret == 0 { Some(window) } else { None };
        }
    }
    Some(block.view(address))
}

impl FrameBlock {
    /// Whether `[start, end)` was read into the block.
    #[inline(always)]
    fn holds(&self, start: u64, end: u64) -> bool {
        self.len != 0 && start >= self.start && end <= self.start.wrapping_add(self.len)
    }

    /// The block's bytes from `address` on (which `holds` must have approved).
    #[inline(always)]
    fn view(&self, address: u64) -> &FrameBytes {
        let offset = (address.wrapping_sub(self.start) as usize) & (BLOCK_BYTES - 1);
        // SAFETY: `offset` < BLOCK_BYTES and `bytes` has `FrameBytes`' size beyond that; `u8`
        // arrays have alignment 1.
        unsafe { &*(self.bytes.as_ptr().add(offset) as *const FrameBytes) }
    }
}

/// A `str`'s (length, cached hash), or zeros when unreadable.
#[inline(always)]
fn read_str_key(address: u64) -> [u64; 2] {
    // SAFETY: bpf_probe_read_user tolerates any address; failure reads as zeros.
    unsafe { bpf_probe_read_user(address as *const [u64; 2]) }.unwrap_or([0, 0])
}

pub fn read_u64(address: u64) -> u64 {
    // SAFETY: bpf_probe_read_user tolerates any address; failure reads as 0.
    unsafe { bpf_probe_read_user(address as *const u64) }.unwrap_or(0)
}
