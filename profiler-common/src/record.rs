//! Reading ring-buffer records and kernel-map values from bytes: the one parser every
//! userspace reader uses (the kernel program writes these types, it never parses them).
//!
//! Every read is checked for length and returns `None` (or a [`MalformedBatch`]) when the
//! bytes are too short; nothing here panics on any input. The only `unsafe` are the three
//! default methods of [`Plain`], each a copy between a value and its bytes.

use crate::{
    CodeSnapshot, CodeSnapshotHead, FRAME_ENTRY_SIZE, FrameEntry, MAX_FULL_FRAMES, MAX_NATIVE_STACK_BYTES, NATIVE_TRAILER_SIZE, NativeTrailer,
    OffCpuInterval, SAMPLE_HEADER_SIZE, SampleHeader, TaskChain, TaskLevel, ThreadSwitch, off_cpu_record_len, record_kind,
};

/// Plain data: a value that is nothing but its bytes.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of integers (and arrays or other `Plain` types
/// of them) with no implicit padding (explicit `_pad` fields): then every bit pattern of
/// `size_of::<Self>()` bytes is a valid value, and every byte of a value is initialised.
pub unsafe trait Plain: Copy + 'static {
    /// Bytes of one value.
    const SIZE: usize = core::mem::size_of::<Self>();

    /// The value in the first `SIZE` bytes of `bytes`; `None` when they are fewer.
    #[inline]
    fn read(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..Self::SIZE)?;
        // SAFETY: `bytes` holds `SIZE` bytes, any of which make a valid `Self` (trait
        // contract); the read is unaligned.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const Self) })
    }

    /// The value at `offset` in `bytes`; `None` when it does not fit.
    #[inline]
    fn read_at(bytes: &[u8], offset: usize) -> Option<Self> {
        Self::read(bytes.get(offset..)?)
    }

    /// The value's bytes.
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: every byte of a `Plain` value is initialised (no implicit padding), and
        // the slice borrows `self` for its `SIZE` bytes.
        unsafe { core::slice::from_raw_parts(self as *const Self as *const u8, Self::SIZE) }
    }

    /// The value's bytes, writable: any bytes written make a valid value.
    #[inline]
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_bytes`; any bit pattern is a valid `Self`, so writes cannot make
        // an invalid value; the slice borrows `self` mutably.
        unsafe { core::slice::from_raw_parts_mut(self as *mut Self as *mut u8, Self::SIZE) }
    }

    /// Writes the value into the first `SIZE` bytes of `out`; `false` (nothing written) when
    /// `out` is shorter.
    #[inline]
    fn write_to(&self, out: &mut [u8]) -> bool {
        match out.get_mut(..Self::SIZE) {
            Some(out) => {
                out.copy_from_slice(self.as_bytes());
                true
            }
            None => false,
        }
    }

    /// Overwrites the value's first bytes with those of `bytes` (at most `SIZE`); returns how
    /// many were copied. The rest of the value is left as it was.
    #[inline]
    fn fill_from(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(Self::SIZE);
        self.as_bytes_mut()[..n].copy_from_slice(&bytes[..n]);
        n
    }
}

// SAFETY: each is `#[repr(C)]`, integers (and arrays of integers or of `Plain` types) only,
// padding explicit; the size assertions in `lib.rs` and `task_chain.rs` pin the layouts.
unsafe impl Plain for SampleHeader {}
unsafe impl Plain for FrameEntry {}
unsafe impl Plain for OffCpuInterval {}
unsafe impl Plain for NativeTrailer {}
unsafe impl Plain for ThreadSwitch {}
unsafe impl Plain for TaskLevel {}
unsafe impl Plain for TaskChain {}
unsafe impl Plain for CodeSnapshot {}
unsafe impl Plain for CodeSnapshotHead {}

impl SampleHeader {
    /// The header at the start of a record; `None` when the record is shorter than one.
    #[inline]
    pub fn read(bytes: &[u8]) -> Option<SampleHeader> {
        <SampleHeader as Plain>::read(bytes)
    }
}

/// What follows a record's header (its frames and any trailer); `None` when the record is
/// shorter than a header.
#[inline]
pub fn record_body(record: &[u8]) -> Option<&[u8]> {
    record.get(SAMPLE_HEADER_SIZE..)
}

/// A record split into its header and its body; `None` when shorter than a header.
#[inline]
pub fn split_record(record: &[u8]) -> Option<(SampleHeader, &[u8])> {
    Some((SampleHeader::read(record)?, record_body(record)?))
}

/// The full frames of a record, leaf first: `header.n_full` of them, at most
/// `MAX_FULL_FRAMES`, and only whole entries present in the body.
#[derive(Clone, Copy, Debug)]
pub struct FullFrames<'a> {
    bytes: &'a [u8],
}

impl<'a> FullFrames<'a> {
    /// The full frames of the record with `header` and `body` (what follows the header).
    #[inline]
    pub fn new(header: &SampleHeader, body: &'a [u8]) -> Self {
        let n = (header.n_full as usize).min(MAX_FULL_FRAMES).min(body.len() / FRAME_ENTRY_SIZE);
        FullFrames { bytes: &body[..n * FRAME_ENTRY_SIZE] }
    }

    /// Frames present.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes.len() / FRAME_ENTRY_SIZE
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Frame `i` (0 is the leaf); `None` past the last.
    #[inline]
    pub fn get(&self, i: usize) -> Option<FrameEntry> {
        FrameEntry::read_at(self.bytes, i.checked_mul(FRAME_ENTRY_SIZE)?)
    }

    /// The frames, leaf first.
    #[inline]
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = FrameEntry> + ExactSizeIterator + 'a {
        self.bytes.chunks_exact(FRAME_ENTRY_SIZE).map(|c| FrameEntry::read(c).unwrap_or_default())
    }
}

/// Offset in a record's body of the slot after its full frames: where an off-CPU record's
/// [`OffCpuInterval`] and a native record's [`NativeTrailer`] are. `n_full` is the header's,
/// bounded by `MAX_FULL_FRAMES` (the body's length is checked by the readers).
#[inline]
pub fn trailer_offset(n_full: u32) -> usize {
    (n_full as usize).min(MAX_FULL_FRAMES) * FRAME_ENTRY_SIZE
}

/// The off-CPU trailer of a `record_kind::OFF_CPU` record (`body`: what follows its header),
/// in the slot after its full frames. `None` when the record is too short to hold it.
#[inline]
pub fn off_cpu_trailer(header: &SampleHeader, body: &[u8]) -> Option<OffCpuInterval> {
    OffCpuInterval::read_at(body, trailer_offset(header.n_full))
}

/// Sets the header and the off-CPU trailer of a whole off-CPU record (`record`: header
/// included) in place; returns the record's length, or `None` (nothing written) when the
/// record is too short for them.
pub fn write_off_cpu_record(record: &mut [u8], header: &SampleHeader, trailer: &OffCpuInterval) -> Option<usize> {
    let end = off_cpu_record_len(header.n_full);
    if record.len() < end {
        return None;
    }
    let at = SAMPLE_HEADER_SIZE + trailer_offset(header.n_full);
    header.write_to(record);
    trailer.write_to(&mut record[at..]);
    Some(end)
}

/// The native part of a `record_kind::CPU_SAMPLE_NATIVE` record (what follows its full
/// frames): the trailer, the kernel addresses and the user stack bytes; `None` when the
/// lengths do not fit the record (kernel bytes not whole addresses, a user stack larger than
/// the kernel copies, either past the end).
pub fn native_part(bytes: &[u8]) -> Option<(NativeTrailer, &[u8], &[u8])> {
    let trailer = NativeTrailer::read(bytes)?;
    let rest = &bytes[NATIVE_TRAILER_SIZE..];
    let k = trailer.kernel_stack_len as usize;
    let u = trailer.user_stack_len as usize;
    if k % 8 != 0 || u > MAX_NATIVE_STACK_BYTES {
        return None;
    }
    // Walked frames: whole entries, at most the kernel's count, a known end.
    if trailer.walk_end > crate::walk_end::LAST
        || (!crate::walk_end::is_copy(trailer.walk_end)
            && (u % crate::WALKED_FRAME_SIZE != 0 || u / crate::WALKED_FRAME_SIZE > crate::MAX_WALKED_FRAMES))
    {
        return None;
    }
    let kernel = rest.get(..k)?;
    let user = rest.get(k..k.checked_add(u)?)?;
    Some((trailer, kernel, user))
}

/// A batch held bytes that are not a whole off-CPU record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MalformedBatch;

/// The whole off-CPU records one after another in a batch (`OffCpuBatch::bytes`, or a
/// ring-buffer item of kind `OFF_CPU`), each as its header and its bytes (header included),
/// [`off_cpu_record_len`] long; ends at the first record that is malformed (`Err`, once).
#[derive(Clone, Debug)]
pub struct OffCpuRecords<'a> {
    bytes: &'a [u8],
}

impl<'a> OffCpuRecords<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        OffCpuRecords { bytes }
    }
}

impl<'a> Iterator for OffCpuRecords<'a> {
    type Item = Result<(SampleHeader, &'a [u8]), MalformedBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.bytes.is_empty() {
            return None;
        }
        let bytes = core::mem::take(&mut self.bytes);
        let Some(header) = SampleHeader::read(bytes) else { return Some(Err(MalformedBatch)) };
        let len = off_cpu_record_len(header.n_full);
        if header.kind != record_kind::OFF_CPU || bytes.len() < len {
            return Some(Err(MalformedBatch));
        }
        let (record, rest) = bytes.split_at(len);
        self.bytes = rest;
        Some(Ok((header, record)))
    }
}

impl ThreadSwitch {
    /// A value of the kernel map `OFF_CPU_THREADS` taken apart: the thread's state and the
    /// record walked at its last switch-out (the bytes after it); `None` when shorter than
    /// the state.
    pub fn split(value: &[u8]) -> Option<(ThreadSwitch, &[u8])> {
        Some((ThreadSwitch::read(value)?, value.get(ThreadSwitch::SIZE..)?))
    }
}

impl TaskChain {
    /// A value with every byte 0.
    pub fn zeroed() -> TaskChain {
        let mut chain = TaskChain {
            header: SampleHeader::default(),
            status: 0,
            n_levels: 0,
            n_frames: 0,
            steps: 0,
            levels: [TaskLevel::default(); crate::MAX_TASK_LEVELS],
            names: [[0; crate::TASK_NAME_BYTES]; crate::MAX_TASK_LEVELS],
            frames: [FrameEntry::default(); crate::MAX_TASK_FRAMES],
        };
        chain.as_bytes_mut().fill(0);
        chain
    }
}

impl CodeSnapshotHead {
    /// The fixed part of `record` (a whole `record_kind::CODE_SNAPSHOT` record, header
    /// included; its regions follow it, the record ending after its line table). `None` when
    /// shorter than the fixed part (`CODE_SNAPSHOT_HEADER`).
    pub fn read(record: &[u8]) -> Option<CodeSnapshotHead> {
        <CodeSnapshotHead as Plain>::read(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TASK_CHAIN_SIZE, off_cpu_reason};

    fn header(kind: u32, n_full: u32) -> SampleHeader {
        SampleHeader { kind, n_full, tgid: 7, tid: 8, time_ns: 9, ..Default::default() }
    }

    /// A record of `header`, `n` frames numbered by their address, and `extra` bytes.
    fn record(h: &SampleHeader, n: usize, extra: &[u8]) -> [u8; 1024] {
        let mut out = [0u8; 1024];
        h.write_to(&mut out);
        for i in 0..n {
            let e = FrameEntry { frame: 0x1000 + i as u64, code: 0x2000, instr_offset: i as i32, ..Default::default() };
            e.write_to(&mut out[SAMPLE_HEADER_SIZE + i * FRAME_ENTRY_SIZE..]);
        }
        let at = SAMPLE_HEADER_SIZE + n * FRAME_ENTRY_SIZE;
        out[at..at + extra.len()].copy_from_slice(extra);
        out
    }

    #[test]
    fn a_header_needs_its_whole_size() {
        let h = header(record_kind::CPU_SAMPLE, 2);
        let bytes = record(&h, 2, &[]);
        assert_eq!(SampleHeader::read(&bytes), Some(h));
        assert_eq!(SampleHeader::read(&bytes[..SAMPLE_HEADER_SIZE]), Some(h));
        assert_eq!(SampleHeader::read(&bytes[..SAMPLE_HEADER_SIZE - 1]), None);
        assert_eq!(SampleHeader::read(&[]), None);
        assert_eq!(split_record(&bytes[..SAMPLE_HEADER_SIZE]).map(|(_, b)| b.len()), Some(0));
        assert!(split_record(&bytes[..10]).is_none());
        // Unaligned bytes read the same.
        let mut shifted = [0u8; SAMPLE_HEADER_SIZE + 1];
        shifted[1..].copy_from_slice(h.as_bytes());
        assert_eq!(SampleHeader::read(&shifted[1..]), Some(h));
    }

    #[test]
    fn full_frames_are_bounded_by_the_body_and_the_maximum() {
        let h = header(record_kind::CPU_SAMPLE, 3);
        let bytes = record(&h, 3, &[]);
        let body = &bytes[SAMPLE_HEADER_SIZE..SAMPLE_HEADER_SIZE + 3 * FRAME_ENTRY_SIZE];
        let frames = FullFrames::new(&h, body);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames.get(2).map(|e| e.frame), Some(0x1002));
        assert_eq!(frames.get(3), None);
        assert_eq!(frames.get(usize::MAX), None);
        assert!(frames.iter().rev().map(|e| e.frame).eq([0x1002, 0x1001, 0x1000]));
        // Truncated: only whole entries.
        let cut = FullFrames::new(&h, &body[..2 * FRAME_ENTRY_SIZE + 5]);
        assert_eq!(cut.len(), 2);
        assert_eq!(cut.iter().count(), 2);
        // A forged count reads no further than the body, nor past the maximum.
        let forged = SampleHeader { n_full: u32::MAX, ..h };
        assert_eq!(FullFrames::new(&forged, body).len(), 3);
        let long = [0u8; (MAX_FULL_FRAMES + 4) * FRAME_ENTRY_SIZE];
        assert_eq!(FullFrames::new(&forged, &long).len(), MAX_FULL_FRAMES);
        assert!(FullFrames::new(&h, &[]).is_empty());
    }

    /// The trailer is the slot after the record's full frames; a record too short for it is
    /// malformed (`None`), and a forged `n_full` cannot read past the body.
    #[test]
    fn off_cpu_trailer_follows_the_full_frames() {
        let interval = OffCpuInterval { off_ns: 7_000_000, short_ns: 5, switched_out_ns: 9, reason: off_cpu_reason::PREEMPTED, kernel_stack: 0 };
        let h = header(record_kind::OFF_CPU, 2);
        let bytes = record(&h, 2, interval.as_bytes());
        let len = off_cpu_record_len(2);
        let body = &bytes[SAMPLE_HEADER_SIZE..len];
        assert_eq!(off_cpu_trailer(&h, body), Some(interval));
        assert_eq!(off_cpu_trailer(&h, &body[..body.len() - 1]), None);
        let forged = SampleHeader { n_full: u32::MAX, ..h };
        assert_eq!(off_cpu_trailer(&forged, body), None);
        // Written back in place, with another header.
        let mut out = bytes;
        let later = SampleHeader { time_ns: 99, ..h };
        let other = OffCpuInterval { off_ns: 1, ..interval };
        assert_eq!(write_off_cpu_record(&mut out[..len], &later, &other), Some(len));
        assert_eq!(split_record(&out[..len]).and_then(|(h, b)| Some((h, off_cpu_trailer(&h, b)?))), Some((later, other)));
        assert_eq!(write_off_cpu_record(&mut out[..len - 1], &later, &other), None);
    }

    #[test]
    fn a_batch_ends_at_its_first_malformed_record() {
        let interval = OffCpuInterval { off_ns: 5, ..Default::default() };
        let a = record(&header(record_kind::OFF_CPU, 1), 1, interval.as_bytes());
        let b = record(&header(record_kind::OFF_CPU, 0), 0, interval.as_bytes());
        let (la, lb) = (off_cpu_record_len(1), off_cpu_record_len(0));
        let mut batch = [0u8; 2048];
        batch[..la].copy_from_slice(&a[..la]);
        batch[la..la + lb].copy_from_slice(&b[..lb]);
        let whole = &batch[..la + lb];
        let got: [_; 2] = [OffCpuRecords::new(whole).count(), OffCpuRecords::new(whole).filter(|r| r.is_ok()).count()];
        assert_eq!(got, [2, 2]);
        let mut it = OffCpuRecords::new(whole);
        assert_eq!(it.next().and_then(|r| r.ok()).map(|(h, r)| (h.n_full, r.len())), Some((1, la)));
        assert_eq!(it.next().and_then(|r| r.ok()).map(|(h, r)| (h.n_full, r.len())), Some((0, lb)));
        assert!(it.next().is_none());
        // Cut inside the second record: one good, then one error, then the end.
        let mut it = OffCpuRecords::new(&whole[..la + lb - 1]);
        assert!(matches!(it.next(), Some(Ok(_))));
        assert_eq!(it.next().map(|r| r.err()), Some(Some(MalformedBatch)));
        assert!(it.next().is_none());
        // A record of another kind, or bytes shorter than a header.
        let c = record(&header(record_kind::CPU_SAMPLE, 0), 0, &[]);
        assert_eq!(OffCpuRecords::new(&c[..lb]).next().map(|r| r.err()), Some(Some(MalformedBatch)));
        assert_eq!(OffCpuRecords::new(&c[..3]).next().map(|r| r.err()), Some(Some(MalformedBatch)));
        assert!(OffCpuRecords::new(&[]).next().is_none());
    }

    #[test]
    fn native_part_lengths_are_checked() {
        let t = NativeTrailer { ip: 1, sp: 2, bp: 3, kernel_stack_len: 16, user_stack_len: 8, regs: 1, walk_end: 0 };
        let mut bytes = [0u8; NATIVE_TRAILER_SIZE + 24];
        t.write_to(&mut bytes);
        bytes[NATIVE_TRAILER_SIZE..NATIVE_TRAILER_SIZE + 8].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
        bytes[NATIVE_TRAILER_SIZE + 16..].copy_from_slice(&[7; 8]);
        let (got, k, u) = native_part(&bytes).expect("fits");
        assert_eq!(got, t);
        assert_eq!(k.len(), 16);
        assert_eq!(u, &[7; 8]);
        assert!(native_part(&bytes[..bytes.len() - 1]).is_none(), "short record");
        assert!(native_part(&bytes[..10]).is_none(), "shorter than the trailer");
        let mut odd = bytes;
        NativeTrailer { kernel_stack_len: 12, ..t }.write_to(&mut odd);
        assert!(native_part(&odd).is_none(), "kernel bytes not whole addresses");
        let mut huge = bytes;
        NativeTrailer { kernel_stack_len: u32::MAX - 7, user_stack_len: 8, ..t }.write_to(&mut huge);
        assert!(native_part(&huge).is_none(), "lengths past the end");
        NativeTrailer { user_stack_len: MAX_NATIVE_STACK_BYTES as u32 + 1, ..t }.write_to(&mut huge);
        assert!(native_part(&huge).is_none(), "more user stack than the kernel copies");
    }

    #[test]
    fn thread_switch_values_split() {
        let s = ThreadSwitch { switched_out_ns: 5, tgid: 3, reason: 2, ..Default::default() };
        let mut value = [0u8; crate::OFF_CPU_THREAD_SIZE];
        s.write_to(&mut value);
        let (got, record) = ThreadSwitch::split(&value).expect("whole");
        assert_eq!(got, s);
        assert_eq!(record.len(), crate::MAX_RECORD_SIZE);
        assert!(ThreadSwitch::split(&value[..ThreadSwitch::SIZE - 1]).is_none());
    }

    #[test]
    fn task_chains_and_snapshots_round_trip() {
        let mut chain = TaskChain::zeroed();
        chain.status = 2;
        chain.levels[3].task = 0x77;
        chain.names[15][127] = 9;
        let bytes = chain.as_bytes();
        assert_eq!(bytes.len(), TASK_CHAIN_SIZE);
        let back = TaskChain::read(bytes).expect("whole");
        assert_eq!((back.status, back.levels[3].task, back.names[15][127]), (2, 0x77, 9));
        assert!(TaskChain::read(&bytes[..TASK_CHAIN_SIZE - 1]).is_none());

        let h = header(record_kind::CODE_SNAPSHOT, 0);
        let mut rec = [0u8; crate::CODE_SNAPSHOT_HEADER + 4];
        h.write_to(&mut rec);
        rec[SAMPLE_HEADER_SIZE..SAMPLE_HEADER_SIZE + 8].copy_from_slice(&0x5000u64.to_le_bytes());
        rec[crate::CODE_SNAPSHOT_HEADER..].copy_from_slice(&[1, 2, 3, 4]);
        let head = CodeSnapshotHead::read(&rec).expect("header present");
        assert_eq!((head.header, head.code), (h, 0x5000));
        assert!(CodeSnapshotHead::read(&rec[..crate::CODE_SNAPSHOT_HEADER - 1]).is_none());
    }
}
