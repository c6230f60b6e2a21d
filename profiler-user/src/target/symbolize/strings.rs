//! Reading `str` and `bytes` objects out of a target (notes §3, §4).
//!
//! Invariants: at most two reads per object (header, then data; a third for the data
//! pointer of a non-compact `str`); no read is larger than the caller's bound and
//! `memory::MAX_READ`; the object's type is checked when the caller knows the type's address
//! (a forged code object can point anywhere), and every header field is: length sign and
//! bound, `kind`, the compact/ASCII bits, and ASCII-ness of ASCII data.

use super::SymbolError;
use crate::target::layout::ObjectLayout;
use crate::target::memory::{MAX_READ, ReadMemory, field_u32, field_u64};

/// Bits of `PyASCIIObject.state` in default (GIL) builds of 3.8-3.15: `interned` in bits
/// 0-1, `kind` in bits 2-4 (bytes per character: 1, 2 or 4; 0 is the pre-3.12 "not ready"
/// wchar kind), `compact` bit 5, `ascii` bit 6 (bit 7 is `ready` up to 3.11 and
/// `statically_allocated` from 3.12; neither matters here).
///
/// Free-threaded builds keep `interned` in a whole byte, which shifts the others by 6 (kind
/// bits 8-10, compact 11, ascii 12; checked on 3.14.7t's DWARF): [`STATE_BITS_FREE_THREADED`].
#[derive(Clone, Copy, Debug)]
struct StateBits {
    kind_shift: u32,
    kind_mask: u32,
    compact: u32,
    ascii: u32,
}

const STATE_BITS: StateBits = StateBits { kind_shift: 2, kind_mask: 0b111, compact: 1 << 5, ascii: 1 << 6 };
const STATE_BITS_FREE_THREADED: StateBits =
    StateBits { kind_shift: 8, kind_mask: 0b111, compact: 1 << 11, ascii: 1 << 12 };

/// A `str` header, decoded and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StrHeader {
    /// Characters (not bytes).
    length: usize,
    /// Bytes per character: 1, 2 or 4.
    kind: usize,
    compact: bool,
    ascii: bool,
}

/// Whether a `str`'s `state` word says compact ASCII with one byte per character (the state
/// bits of `objects`' build).
pub fn is_compact_ascii(state: u32, objects: &ObjectLayout) -> bool {
    let bits = if objects.free_threaded { STATE_BITS_FREE_THREADED } else { STATE_BITS };
    state & bits.compact != 0 && state & bits.ascii != 0 && (state >> bits.kind_shift) & bits.kind_mask == 1
}

/// Decodes the `length` and `state` fields of a `str` header held in `buf`.
fn parse_str_header(
    buf: &[u8],
    objects: &ObjectLayout,
    address: u64,
    max_chars: usize,
) -> Result<StrHeader, SymbolError> {
    let bad = |reason| SymbolError::BadString { address, reason };
    let raw_len = field_u64(buf, objects.str_length as usize).ok_or(bad("length outside the header"))?;
    let state = field_u32(buf, objects.str_state as usize).ok_or(bad("state outside the header"))?;
    if (raw_len as i64) < 0 {
        return Err(bad("negative length"));
    }
    let length = usize::try_from(raw_len).map_err(|_| bad("length overflows"))?;
    let bits = if objects.free_threaded { STATE_BITS_FREE_THREADED } else { STATE_BITS };
    let kind = ((state >> bits.kind_shift) & bits.kind_mask) as usize;
    let compact = state & bits.compact != 0;
    let ascii = state & bits.ascii != 0;
    if !matches!(kind, 1 | 2 | 4) {
        return Err(bad("kind is not 1, 2 or 4 (not a ready str)"));
    }
    if ascii && kind != 1 {
        return Err(bad("ASCII with more than one byte per character"));
    }
    let limit = max_chars.min(MAX_READ / kind);
    if length > limit {
        return Err(SymbolError::TooLong { address, len: raw_len, max: limit });
    }
    Ok(StrHeader { length, kind, compact, ascii })
}

/// `PyTypeObject.tp_flags` (an `unsigned long`) in every 3.8-3.15 x86_64 default build (16
/// bytes further in free-threaded ones, whose object header is 16 bytes longer), and the
/// flags that mark subclasses of `str` and `bytes` (stable since 2.6).
const TP_FLAGS_OFFSET: u64 = 0xa8;
const TP_FLAGS_OFFSET_FREE_THREADED: u64 = 0xb8;
const TPFLAGS_UNICODE_SUBCLASS: u64 = 1 << 28;
const TPFLAGS_BYTES_SUBCLASS: u64 = 1 << 27;

/// What `check_type` accepts: objects of exactly `address`, or of a type with `subclass_flag`.
#[derive(Clone, Copy)]
struct ExpectedType {
    address: u64,
    subclass_flag: u64,
    name: &'static str,
}

/// `WrongType` unless the `ob_type` word in the header `buf` is the expected type (when
/// given) or a subclass of it (`compile()` keeps a `str` subclass as `co_filename`): one
/// more read, of the type's `tp_flags`, only when the type is not the exact one.
fn check_type<M: ReadMemory + ?Sized>(
    mem: &M,
    buf: &[u8],
    objects: &ObjectLayout,
    address: u64,
    expected: Option<ExpectedType>,
) -> Result<(), SymbolError> {
    let Some(expected) = expected else { return Ok(()) };
    let ob_type = field_u64(buf, objects.ob_type as usize).unwrap_or(0);
    if ob_type == expected.address {
        return Ok(());
    }
    let subclass = ob_type != 0
        && mem.read_type_word(ob_type.wrapping_add(if objects.free_threaded { TP_FLAGS_OFFSET_FREE_THREADED } else { TP_FLAGS_OFFSET })).is_ok_and(|flags| flags & expected.subclass_flag != 0);
    if !subclass {
        return Err(SymbolError::WrongType { address, expected: expected.name, ob_type });
    }
    Ok(())
}

/// Decodes `header.length` characters of `header.kind` bytes each.
///
/// Lone surrogates (legal in a Python `str`, e.g. a `surrogateescape`d file name) become
/// U+FFFD; a code point above U+10FFFF or a non-ASCII byte in an ASCII string is an error.
fn decode_chars(data: &[u8], header: StrHeader, address: u64) -> Result<String, SymbolError> {
    let bad = |reason| SymbolError::BadString { address, reason };
    let mut out = String::with_capacity(data.len());
    match header.kind {
        1 if header.ascii => {
            if !data.is_ascii() {
                return Err(bad("non-ASCII byte in an ASCII str"));
            }
            out.extend(data.iter().map(|&b| char::from(b)));
        }
        1 => out.extend(data.iter().map(|&b| char::from(b))),
        2 => {
            for c in data.chunks_exact(2) {
                let unit = u32::from(u16::from_le_bytes([c[0], c[1]]));
                out.push(char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
        }
        4 => {
            for c in data.chunks_exact(4) {
                let point = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                if point > 0x10_ffff {
                    return Err(bad("code point above U+10FFFF"));
                }
                out.push(char::from_u32(point).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
        }
        _ => return Err(bad("kind is not 1, 2 or 4 (not a ready str)")),
    }
    Ok(out)
}

/// Reads the `str` object at `address`: compact ASCII, compact latin-1 / UCS-2 / UCS-4, or
/// a ready non-compact (legacy) string through its data pointer. At most `max_chars`
/// characters (else `TooLong`); its `ob_type` must be `str_type` when that is given (else
/// `WrongType`).
pub fn read_str<M: ReadMemory + ?Sized>(
    mem: &M,
    objects: &ObjectLayout,
    address: u64,
    max_chars: usize,
    str_type: Option<u64>,
) -> Result<String, SymbolError> {
    read_str_cut(mem, objects, address, max_chars, usize::MAX, str_type).map(|(text, _)| text)
}

/// Reads at most the first `max_chars` characters of the `str` object at `address` (a longer
/// string is cut, not refused; the whole string is still bounded by one `MAX_READ`): for
/// names shown cut anyway. Same checks as [`read_str`]; returns the text and the full length.
pub fn read_str_prefix<M: ReadMemory + ?Sized>(
    mem: &M,
    objects: &ObjectLayout,
    address: u64,
    max_chars: usize,
    str_type: Option<u64>,
) -> Result<(String, usize), SymbolError> {
    read_str_cut(mem, objects, address, usize::MAX, max_chars, str_type)
}

/// The `str` object at `address`, refused when longer than `max_chars` (`TooLong`), its
/// first `cut` characters read; with its full length. The one body of [`read_str`] and
/// [`read_str_prefix`]: type, header and data checks, at most two reads (three for a
/// non-compact string), every read bounded by `parse_str_header` (length * kind <= MAX_READ).
fn read_str_cut<M: ReadMemory + ?Sized>(
    mem: &M,
    objects: &ObjectLayout,
    address: u64,
    max_chars: usize,
    cut: usize,
    str_type: Option<u64>,
) -> Result<(String, usize), SymbolError> {
    let header_len = (objects.str_length as usize + 8).max(objects.str_state as usize + 4).max(objects.ob_type as usize + 8);
    let buf = mem.read_vec(address, header_len)?;
    let expected = str_type.map(|a| ExpectedType { address: a, subclass_flag: TPFLAGS_UNICODE_SUBCLASS, name: "str" });
    check_type(mem, &buf, objects, address, expected)?;
    let mut header = parse_str_header(&buf, objects, address, max_chars)?;
    let full = header.length;
    header.length = header.length.min(cut);
    let data_address = if !header.compact {
        // PyUnicodeObject.data.any follows the compact header.
        let pointer = mem.read_u64(address.wrapping_add(u64::from(objects.str_compact_data)))?;
        if pointer == 0 {
            return Err(SymbolError::BadString { address, reason: "non-compact str without data" });
        }
        pointer
    } else if header.ascii {
        address.wrapping_add(u64::from(objects.str_ascii_data))
    } else {
        address.wrapping_add(u64::from(objects.str_compact_data))
    };
    let data = mem.read_vec(data_address, header.length * header.kind)?;
    Ok((decode_chars(&data, header, address)?, full))
}

/// Reads the contents of the `bytes` object at `address`: at most `max_len` bytes (else
/// `TooLong`); its `ob_type` must be `bytes_type` when that is given (else `WrongType`).
pub fn read_bytes<M: ReadMemory + ?Sized>(
    mem: &M,
    objects: &ObjectLayout,
    address: u64,
    max_len: usize,
    bytes_type: Option<u64>,
) -> Result<Vec<u8>, SymbolError> {
    let header = mem.read_vec(address, (objects.bytes_size as usize + 8).max(objects.ob_type as usize + 8))?;
    let expected = bytes_type.map(|a| ExpectedType { address: a, subclass_flag: TPFLAGS_BYTES_SUBCLASS, name: "bytes" });
    check_type(mem, &header, objects, address, expected)?;
    let bad = |reason| SymbolError::BadBytes { address, reason };
    let raw_len = field_u64(&header, objects.bytes_size as usize).ok_or(bad("size outside the header"))?;
    if (raw_len as i64) < 0 {
        return Err(bad("negative size"));
    }
    let limit = max_len.min(MAX_READ);
    let len = usize::try_from(raw_len).ok().filter(|&n| n <= limit);
    let len = len.ok_or(SymbolError::TooLong { address, len: raw_len, max: limit })?;
    Ok(mem.read_vec(address.wrapping_add(u64::from(objects.bytes_data)), len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const OBJECTS_312: ObjectLayout = ObjectLayout::TEST_312;

    fn header(len: u64, state: u32) -> Vec<u8> {
        let mut b = vec![0u8; 0x28];
        b[0x10..0x18].copy_from_slice(&len.to_le_bytes());
        b[0x20..0x24].copy_from_slice(&state.to_le_bytes());
        b
    }

    #[test]
    fn headers() {
        let p = |len, state, max| parse_str_header(&header(len, state), &OBJECTS_312, 1, max);
        let compact_ascii = 1 << 2 | 1 << 5 | 1 << 6;
        assert_eq!(p(3, compact_ascii, 10).unwrap(), StrHeader { length: 3, kind: 1, compact: true, ascii: true });
        assert_eq!(p(3, 4 << 2 | 1 << 5, 10).unwrap(), StrHeader { length: 3, kind: 4, compact: true, ascii: false });
        assert!(matches!(p(11, compact_ascii, 10), Err(SymbolError::TooLong { len: 11, max: 10, .. })));
        assert!(matches!(p(u64::MAX, compact_ascii, 10), Err(SymbolError::BadString { .. })));
        assert!(matches!(p(1, 3 << 2 | 1 << 5, 10), Err(SymbolError::BadString { .. })));
        assert!(matches!(p(1, 0, 10), Err(SymbolError::BadString { .. })), "wchar kind");
        assert!(matches!(p(1, 2 << 2 | 1 << 6, 10), Err(SymbolError::BadString { .. })));
        assert!(matches!(p(MAX_READ as u64, 4 << 2 | 1 << 5, usize::MAX), Err(SymbolError::TooLong { .. })));
        assert!(parse_str_header(&[0; 8], &OBJECTS_312, 1, 10).is_err(), "short buffer");
    }

    /// A free-threaded 3.14's `str` header: length at 0x20, state at 0x30 with `interned` a
    /// whole byte, so kind, compact and ascii sit 6 bits higher than in a default build.
    #[test]
    fn free_threaded_headers() {
        let objects = ObjectLayout::TEST_314T;
        let header = |len: u64, state: u32| {
            let mut b = vec![0u8; 0x38];
            b[0x20..0x28].copy_from_slice(&len.to_le_bytes());
            b[0x30..0x34].copy_from_slice(&state.to_le_bytes());
            b
        };
        let p = |len, state| parse_str_header(&header(len, state), &objects, 1, 100);
        // interned (a byte, here 1 = interned), kind 1, compact, ascii.
        let compact_ascii = 1 | 1 << 8 | 1 << 11 | 1 << 12;
        assert_eq!(p(5, compact_ascii).unwrap(), StrHeader { length: 5, kind: 1, compact: true, ascii: true });
        assert_eq!(p(2, 2 << 8 | 1 << 11).unwrap(), StrHeader { length: 2, kind: 2, compact: true, ascii: false });
        // A default build's bits read as a free-threaded header: no valid kind.
        assert!(p(5, 1 << 2 | 1 << 5 | 1 << 6).is_err());
    }

    #[test]
    fn chars() {
        let h = |kind, ascii| StrHeader { length: 0, kind, compact: true, ascii };
        assert_eq!(decode_chars(b"abc", h(1, true), 0).unwrap(), "abc");
        assert!(decode_chars(b"\xfc", h(1, true), 0).is_err());
        assert_eq!(decode_chars(b"f\xfcnf", h(1, false), 0).unwrap(), "fünf");
        assert_eq!(decode_chars(&[0x0d, 0x54, 0x00, 0xd8], h(2, false), 0).unwrap(), "名\u{fffd}");
        assert_eq!(decode_chars(&[0x23, 0xd5, 0x01, 0x00], h(4, false), 0).unwrap(), "𝔣");
        assert!(decode_chars(&[0, 0, 0x11, 0], h(4, false), 0).is_err());
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::tests::OBJECTS_312;
    use super::*;
    use crate::fuzzing::config;

    proptest! {
        #![proptest_config(config(1024))]

        /// Any header: a decoded length never exceeds the caller's bound or one `MAX_READ`.
        #[test]
        fn fuzz_str_header(
            mut buf in prop::collection::vec(any::<u8>(), 0..0x30),
            len in prop_oneof![any::<u64>(), 0u64..5000],
            state in any::<u32>(),
            max_chars in prop_oneof![Just(usize::MAX), 0usize..5000],
        ) {
            if buf.len() >= 0x24 {
                buf[0x10..0x18].copy_from_slice(&len.to_le_bytes());
                buf[0x20..0x24].copy_from_slice(&state.to_le_bytes());
            }
            if let Ok(header) = parse_str_header(&buf, &OBJECTS_312, 1, max_chars) {
                prop_assert!(header.length <= max_chars);
                prop_assert!(header.length.checked_mul(header.kind).is_some_and(|n| n <= MAX_READ));
            }
        }

        /// Any data: the text is at most twice the bytes (latin-1 to UTF-8).
        #[test]
        fn fuzz_str_chars(data in prop::collection::vec(any::<u8>(), 0..256), kind in prop::sample::select(vec![0usize, 1, 2, 3, 4, 8]), ascii in any::<bool>()) {
            let header = StrHeader { length: data.len(), kind, compact: true, ascii };
            if let Ok(text) = decode_chars(&data, header, 1) {
                prop_assert!(text.len() <= 2 * data.len());
            }
        }
    }
}
