//! The few kernel structure offsets pyperch needs, read from the kernel's BTF in one pass.
//!
//! A general BTF parser (btf-rs) builds an index of every one of the kernel's 100,000+ types
//! and costs 130-160 ms of CPU at each start; this reader walks the type section once,
//! allocates nothing per type, and looks only at the structures asked for (about 5 ms).
//!
//! Format (the kernel's `Documentation/bpf/btf.rst`): a header (magic 0xeb9f, then the
//! header's length and the offsets and lengths of the type and string sections, counted from
//! the header's end), then the types back to back: 12 bytes each (`name_off`, `info`,
//! `size/type`) followed by data whose length depends on the kind (`info` bits 24-28) and on
//! `vlen` (bits 0-15). A structure's members are 12 bytes each: `name_off`, `type`, `offset`
//! (the bit offset; when the structure's `kind_flag`, bit 31, is set, the low 24 bits).

/// Why the BTF could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("not BTF (bad magic or header)")]
    Header,
    #[error("the type section ends inside type {0}")]
    Truncated(u32),
    #[error("type {id} has kind {kind}, which this reader does not know")]
    UnknownKind { id: u32, kind: u32 },
}

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// The kernel's BTF, borrowed.
pub struct KernelBtf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
}

impl<'a> KernelBtf<'a> {
    /// Checks the header and finds the two sections; fails on anything out of bounds.
    pub fn new(bytes: &'a [u8]) -> Result<Self, BtfError> {
        let u32_at = |at: usize| -> Option<u32> { Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?)) };
        let magic = bytes.get(0..2).map(|m| u16::from_le_bytes([m[0], m[1]]));
        if magic != Some(MAGIC) {
            return Err(BtfError::Header);
        }
        let (Some(hdr_len), Some(type_off), Some(type_len), Some(str_off), Some(str_len)) =
            (u32_at(4), u32_at(8), u32_at(12), u32_at(16), u32_at(20))
        else {
            return Err(BtfError::Header);
        };
        let section = |off: u32, len: u32| -> Option<&'a [u8]> {
            let start = (hdr_len as usize).checked_add(off as usize)?;
            bytes.get(start..start.checked_add(len as usize)?)
        };
        let (Some(types), Some(strings)) = (section(type_off, type_len), section(str_off, str_len)) else {
            return Err(BtfError::Header);
        };
        Ok(Self { types, strings })
    }

    /// The byte offset of each `(structure, member)` asked for, in the order asked (`None`
    /// for a pair not found): the first structure of that name that has the member, and a
    /// direct member only (not one inside a nested anonymous structure).
    pub fn member_offsets(&self, wanted: &[(&str, &str)]) -> Result<Vec<Option<u64>>, BtfError> {
        let mut found: Vec<Option<u64>> = vec![None; wanted.len()];
        let mut at = 0usize;
        let mut id = 1u32;
        while at < self.types.len() {
            let word = |i: usize| -> Result<u32, BtfError> {
                let start = at + 4 * i;
                let b = self.types.get(start..start + 4).ok_or(BtfError::Truncated(id))?;
                Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            };
            let (name_off, info) = (word(0)?, word(1)?);
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let extra = match kind {
                1 | 14 | 17 => 4,
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                3 => 12,
                4 | 5 | 15 | 19 => 12 * vlen,
                6 | 13 => 8 * vlen,
                _ => return Err(BtfError::UnknownKind { id, kind }),
            };
            let end = at.checked_add(12 + extra).filter(|&e| e <= self.types.len()).ok_or(BtfError::Truncated(id))?;
            if kind == KIND_STRUCT {
                let name = self.name(name_off);
                if wanted.iter().any(|(s, _)| s.as_bytes() == name) {
                    for m in 0..vlen {
                        let base = 3 + 3 * m;
                        let member = self.name(word(base)?);
                        let offset = word(base + 2)?;
                        let bits = if kind_flag { offset & 0x00ff_ffff } else { offset };
                        for (slot, (s, field)) in found.iter_mut().zip(wanted) {
                            if slot.is_none() && s.as_bytes() == name && field.as_bytes() == member {
                                *slot = Some(u64::from(bits) / 8);
                            }
                        }
                    }
                    if found.iter().all(Option::is_some) {
                        break;
                    }
                }
            }
            at = end;
            id += 1;
        }
        Ok(found)
    }

    /// The NUL-terminated name at `offset` of the string section (empty when out of bounds).
    fn name(&self, offset: u32) -> &'a [u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: an int, a struct `s` with members `a` (bit 0) and `b` (bit 64), a struct
    /// `k` with kind_flag whose member `f` is a bitfield at bit 96, and an enum in between.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0k\0f\0e\0x\0";
        let name = |n: &str| -> u32 {
            let needle = format!("\0{n}\0");
            strings.windows(needle.len()).position(|w| w == needle.as_bytes()).unwrap() as u32 + 1
        };
        let mut types: Vec<u32> = Vec::new();
        types.extend([name("int"), 1 << 24, 4, 32]); // INT + 4 bytes
        types.extend([name("e"), (6 << 24) | 1, 4, name("x"), 0]); // ENUM, 1 value
        types.extend([name("s"), (4 << 24) | 2, 16, name("a"), 1, 0, name("b"), 1, 64]);
        types.extend([name("k"), (1 << 31) | (4 << 24) | 1, 16, name("f"), 1, (3 << 24) | 96]);
        let types: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut blob = Vec::new();
        blob.extend(MAGIC.to_le_bytes());
        blob.extend([1u8, 0]);
        for w in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            blob.extend(w.to_le_bytes());
        }
        blob.extend(&types);
        blob.extend(strings);
        blob
    }

    #[test]
    fn finds_members_and_bitfields() {
        let blob = sample();
        let btf = KernelBtf::new(&blob).unwrap();
        let found = btf.member_offsets(&[("s", "b"), ("k", "f"), ("s", "a"), ("s", "zz"), ("nope", "a")]).unwrap();
        assert_eq!(found, vec![Some(8), Some(12), Some(0), None, None]);
    }

    #[test]
    fn truncated_and_foreign_bytes_are_errors() {
        let blob = sample();
        assert!(matches!(KernelBtf::new(&blob[..20]), Err(BtfError::Header)));
        assert!(matches!(KernelBtf::new(b"\x7fELF and more bytes than a header"), Err(BtfError::Header)));
        // A type section cut inside the last structure.
        let mut cut = blob.clone();
        let type_len = u32::from_le_bytes(cut[12..16].try_into().unwrap()) - 4;
        cut[12..16].copy_from_slice(&type_len.to_le_bytes());
        let btf = KernelBtf::new(&cut).unwrap();
        assert!(matches!(btf.member_offsets(&[("k", "f")]), Err(BtfError::Truncated(4))));
    }

    /// The running kernel's offsets agree with a general BTF parser's (btf-rs).
    #[test]
    fn agrees_with_btf_rs_on_this_kernel() {
        use btf_rs::{Btf, Type};
        let Ok(bytes) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("SKIP: no /sys/kernel/btf/vmlinux");
            return;
        };
        let wanted = crate::kernel::loader::KERNEL_MEMBERS;
        let ours = KernelBtf::new(&bytes).unwrap().member_offsets(&wanted).unwrap();
        let btf = Btf::from_bytes(&bytes).unwrap();
        for ((s, m), ours) in wanted.iter().zip(ours) {
            let mut theirs = None;
            for ty in btf.resolve_types_by_name(s).unwrap() {
                let Type::Struct(st) = ty else { continue };
                if let Some(member) = st.members.iter().find(|x| btf.resolve_name(*x).ok().as_deref() == Some(*m)) {
                    theirs = Some(member.bit_offset() as u64 / 8);
                    break;
                }
            }
            assert_eq!(ours, theirs, "{s}.{m}");
            assert!(ours.is_some(), "{s}.{m} not found");
        }
    }
}
