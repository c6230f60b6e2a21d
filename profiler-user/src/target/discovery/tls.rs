//! Thread-state accessors decoded from machine code (x86_64).
//!
//! `PyGILState_GetThisThreadState` is exported by every CPython and is tiny. Its code says
//! where the calling thread's bound `PyThreadState` lives:
//! - 3.8-3.14: in the glibc TSD slot of the pthread key `_PyRuntime.autoTSSkey._key`; the
//!   function loads the key (or the `Py_tss_t` address) from `_PyRuntime`, so the key's
//!   offset in `_PyRuntime` can be read off it;
//! - 3.15 static executables: in the thread-local `_Py_tss_gilstate`, read with local-exec
//!   TLS: `mov %fs:-N,%rax; ret`, so the word is at `fsbase - N`.
//!
//! Decoding walks a handful of known instruction forms ([`FORMS`]) from the function's start
//! and stops at the first form it does not know: a result is only given when the code is
//! exactly understood. Any mismatch gives `None`, and the caller falls back to tables.

/// What one instruction does to the state we track.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// Irrelevant here (`endbr64`, `push`, `test`, a conditional branch we fall through...).
    None,
    /// `mov disp32(%rip),%rax` (`48 8b 05`): loads a GOT slot, operand = slot address.
    LoadGotRax,
    /// `lea disp32(%rax),%reg` (`48 8d 80+8*reg`): operand = displacement.
    LeaFromRax,
    /// `mov disp32(%rip),%edi` (`8b 3d`): operand = address of the loaded `int`.
    LoadRipEdi,
    /// `cmpl $imm8,disp32(%rip)` (`83 3d`): operand = address of the compared `int`.
    CompareRip,
    /// `mov $imm32,%edi` (`bf`): operand = the immediate (an address in non-PIE code).
    ImmediateEdi,
    /// `mov %fs:disp32,%rax` (`64 48 8b 04 25`): operand = displacement (sign-extended).
    TlsLoadRax,
    /// `ret` or `jmp`: the end of the straight-line code.
    End,
}

/// Operand kinds: where the 32-bit operand is and how to read it.
#[derive(Clone, Copy, Debug)]
enum Operand {
    Nothing,
    /// A `disp32` relative to the end of the instruction, at this byte.
    RipRelative(usize),
    /// A signed 32-bit value at this byte.
    Signed(usize),
    /// An unsigned 32-bit value at this byte.
    Unsigned(usize),
}

/// One instruction form: `(opcode bytes, mask over them, length, operand, effect)`.
type Form = (&'static [u8], &'static [u8], usize, Operand, Effect);

const FF: &[u8] = &[0xff; 5];

/// The instruction forms seen in `PyGILState_GetThisThreadState` of CPython 3.8-3.15 built
/// by GCC (pyenv and Debian builds). The `cmpq` forms test `autoInterpreterState` (3.8-3.11),
/// not the key.
const FORMS: &[Form] = &[
    (&[0xf3, 0x0f, 0x1e, 0xfa], FF, 4, Operand::Nothing, Effect::None), // endbr64
    (&[0x64, 0x48, 0x8b, 0x04, 0x25], FF, 9, Operand::Signed(5), Effect::TlsLoadRax),
    (&[0x48, 0x8b, 0x05], FF, 7, Operand::RipRelative(3), Effect::LoadGotRax),
    (&[0x48, 0x83, 0xb8], FF, 8, Operand::Nothing, Effect::None), // cmpq $imm8,disp32(%rax)
    (&[0x48, 0x83, 0x3d], FF, 8, Operand::Nothing, Effect::None), // cmpq $imm8,disp32(%rip)
    (&[0x48, 0x8d, 0x80], &[0xff, 0xff, 0xc7], 7, Operand::Signed(3), Effect::LeaFromRax),
    (&[0x83, 0x3d], FF, 7, Operand::RipRelative(2), Effect::CompareRip),
    (&[0x8b, 0x3d], FF, 6, Operand::RipRelative(2), Effect::LoadRipEdi),
    (&[0xbf], FF, 5, Operand::Unsigned(1), Effect::ImmediateEdi),
    (&[0x53], FF, 1, Operand::Nothing, Effect::None), // push %rbx
    (&[0x5b], FF, 1, Operand::Nothing, Effect::None), // pop %rbx
    (&[0x48, 0x89, 0xdf], FF, 3, Operand::Nothing, Effect::None), // mov %rbx,%rdi
    (&[0x85, 0xc0], FF, 2, Operand::Nothing, Effect::None), // test %eax,%eax
    (&[0x31, 0xc0], FF, 2, Operand::Nothing, Effect::None), // xor %eax,%eax
    (&[0x74], FF, 2, Operand::Nothing, Effect::None), // je rel8
    (&[0x0f, 0x84], FF, 6, Operand::Nothing, Effect::None), // je rel32
    (&[0xe8], FF, 5, Operand::Nothing, Effect::None), // call rel32
    (&[0xe9], FF, 5, Operand::Nothing, Effect::End),  // jmp rel32
    (&[0xc3], FF, 1, Operand::Nothing, Effect::End),  // ret
];

/// Instructions examined at most.
const MAX_INSTRUCTIONS: usize = 16;

/// One decoded instruction: its effect and operand value (addresses already resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Step {
    effect: Effect,
    value: i64,
}

fn read_i32(code: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(code.get(at..at + 4)?.try_into().ok()?))
}

/// Decodes straight-line code from `vaddr` until `ret`/`jmp`; `None` on an unknown form.
fn walk(code: &[u8], vaddr: u64) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    let mut at = 0usize;
    for _ in 0..MAX_INSTRUCTIONS {
        let rest = code.get(at..)?;
        let (_, _, len, operand, effect) = FORMS.iter().copied().find(|(bytes, mask, len, _, _)| {
            rest.len() >= *len && bytes.iter().zip(mask.iter()).zip(rest).all(|((b, m), r)| r & m == *b)
        })?;
        let end = vaddr.wrapping_add((at + len) as u64);
        let value = match operand {
            Operand::Nothing => 0,
            Operand::RipRelative(o) => end.wrapping_add(i64::from(read_i32(rest, o)?) as u64) as i64,
            Operand::Signed(o) => i64::from(read_i32(rest, o)?),
            Operand::Unsigned(o) => i64::from(read_i32(rest, o)? as u32),
        };
        steps.push(Step { effect, value });
        if effect == Effect::End {
            return Some(steps);
        }
        at += len;
    }
    None
}

/// The `N` of `PyGILState_GetThisThreadState` = `[endbr64;] mov %fs:-N,%rax; ret`: the
/// bound thread state of a thread is the word at `fsbase - N` (3.15 static executables).
pub fn decode_tls_word(code: &[u8], vaddr: u64) -> Option<u64> {
    let steps = walk(code, vaddr)?;
    let meaningful: Vec<_> = steps.iter().filter(|s| s.effect != Effect::None).collect();
    match meaningful.as_slice() {
        [Step { effect: Effect::TlsLoadRax, value }, Step { effect: Effect::End, .. }] if *value < 0 => {
            Some(value.unsigned_abs())
        }
        _ => None,
    }
}

/// The offset of the pthread key (`int`) in `_PyRuntime`, from `PyGILState_GetThisThreadState`
/// at `vaddr`. `runtime` and `runtime_size` give `_PyRuntime`'s extent; `got_is_runtime`
/// tells whether a GOT slot holds `&_PyRuntime` (PIC code loads it from there).
///
/// Every key address the code implies must agree, and lie inside `_PyRuntime`.
pub fn decode_tss_key(
    code: &[u8],
    vaddr: u64,
    runtime: u64,
    runtime_size: u64,
    got_is_runtime: impl Fn(u64) -> bool,
) -> Option<u32> {
    let steps = walk(code, vaddr)?;
    // `Py_tss_t` is `{int _is_initialized; pthread_key_t _key}`: the key is 4 bytes in.
    let mut keys = Vec::new();
    let mut rax_is_runtime = false;
    for step in steps {
        match step.effect {
            Effect::LoadGotRax => rax_is_runtime = got_is_runtime(step.value as u64),
            Effect::LeaFromRax if rax_is_runtime => keys.push(runtime.wrapping_add(step.value as u64).wrapping_add(4)),
            Effect::LoadRipEdi => keys.push(step.value as u64),
            Effect::CompareRip | Effect::ImmediateEdi => keys.push((step.value as u64).wrapping_add(4)),
            _ => {}
        }
    }
    let first = *keys.first()?;
    if keys.iter().any(|k| *k != first) || first < runtime || first + 4 > runtime.checked_add(runtime_size)? {
        return None;
    }
    u32::try_from(first - runtime).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Byte sequences as disassembled from the builds of the notes (section 2).

    /// Debian 3.15.2 at 0x42fa7d.
    const DEBIAN_3_15: &[u8] = &[0xf3, 0x0f, 0x1e, 0xfa, 0x64, 0x48, 0x8b, 0x04, 0x25, 0xd8, 0xff, 0xff, 0xff, 0xc3];
    /// Debian 3.13.18 at 0x56c7b0, `_PyRuntime` = 0xb176a0.
    const DEBIAN_3_13: &[u8] = &[
        0xf3, 0x0f, 0x1e, 0xfa, 0x83, 0x3d, 0x55, 0xb7, 0x5a, 0x00, 0x00, 0x0f, 0x84, 0xdb, 0xa4, 0xeb, 0xff, 0x8b,
        0x3d, 0x4d, 0xb7, 0x5a, 0x00, 0xe9, 0x44, 0x50, 0xeb, 0xff,
    ];
    /// Debian 3.14.10 at 0x42c79a, `_PyRuntime` = 0xba07c0.
    const DEBIAN_3_14: &[u8] = &[
        0xf3, 0x0f, 0x1e, 0xfa, 0x83, 0x3d, 0x3b, 0x49, 0x77, 0x00, 0x00, 0x74, 0x0a, 0xbf, 0xe0, 0x10, 0xba, 0x00,
        0xe9, 0x7f, 0x2e, 0x11, 0x00,
    ];
    /// pyenv 3.8.18 at 0x1b25b0, GOT slot 0x31ac78.
    const PYENV_3_8: &[u8] = &[
        0x48, 0x8b, 0x05, 0xc1, 0x86, 0x16, 0x00, 0x48, 0x83, 0xb8, 0x68, 0x05, 0x00, 0x00, 0x00, 0x74, 0x0f, 0x48,
        0x8d, 0xb8, 0x70, 0x05, 0x00, 0x00, 0xe9, 0x23, 0x7a, 0xeb, 0xff,
    ];
    /// pyenv 3.12.1 at 0x2d7c30, GOT slot 0x543d00.
    const PYENV_3_12: &[u8] = &[
        0x48, 0x8b, 0x05, 0xc9, 0xc0, 0x26, 0x00, 0x53, 0x48, 0x8d, 0x98, 0x08, 0x06, 0x00, 0x00, 0x48, 0x89, 0xdf,
        0xe8, 0xd9, 0x21, 0xe3, 0xff, 0x85, 0xc0, 0x74, 0x0d, 0x48, 0x89, 0xdf, 0x5b, 0xe9, 0xec, 0x36, 0xe3, 0xff,
    ];

    #[test]
    fn tls_word_of_3_15() {
        assert_eq!(decode_tls_word(DEBIAN_3_15, 0x42fa7d), Some(0x28));
        assert_eq!(decode_tls_word(&DEBIAN_3_15[4..], 0), Some(0x28));
        // Not a TLS load.
        assert_eq!(decode_tls_word(DEBIAN_3_13, 0x56c7b0), None);
        // Truncated.
        assert_eq!(decode_tls_word(&DEBIAN_3_15[..10], 0x42fa7d), None);
    }

    #[test]
    fn key_offsets() {
        let none = |_| false;
        assert_eq!(decode_tss_key(DEBIAN_3_13, 0x56c7b0, 0xb176a0, 0x45310, none), Some(0x874));
        assert_eq!(decode_tss_key(DEBIAN_3_14, 0x42c79a, 0xba07c0, 0x4d4c8, none), Some(0x924));
        assert_eq!(decode_tss_key(PYENV_3_8, 0x1b25b0, 0x372e00, 0x1000, |slot| slot == 0x31ac78), Some(0x574));
        assert_eq!(decode_tss_key(PYENV_3_12, 0x2d7c30, 0x643340, 0x704a8, |slot| slot == 0x543d00), Some(0x60c));
        // Without knowing the GOT slot, PIC code proves nothing.
        assert_eq!(decode_tss_key(PYENV_3_8, 0x1b25b0, 0x372e00, 0x1000, none), None);
        // A key outside `_PyRuntime`.
        assert_eq!(decode_tss_key(DEBIAN_3_13, 0x56c7b0, 0xb176a0, 0x100, none), None);
        assert_eq!(decode_tss_key(DEBIAN_3_15, 0x42fa7d, 0xc408a0, 0x549c8, none), None);
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::config;

    /// Code made of known instruction forms with random operands, and random bytes.
    fn code() -> impl Strategy<Value = Vec<u8>> {
        let form = (0..FORMS.len(), any::<[u8; 8]>()).prop_map(|(i, operand)| {
            let (opcode, _, len, _, _) = FORMS[i];
            let mut bytes = opcode.to_vec();
            bytes.extend_from_slice(&operand[..len.saturating_sub(opcode.len()).min(8)]);
            bytes
        });
        prop_oneof![
            prop::collection::vec(form, 0..24).prop_map(|forms| forms.concat()),
            prop::collection::vec(any::<u8>(), 0..96),
        ]
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn fuzz_accessor_decoding(code in code(), vaddr in any::<u64>(), runtime in any::<u64>(), size in any::<u64>(), got in any::<bool>()) {
            let _ = decode_tls_word(&code, vaddr);
            if let Some(key) = decode_tss_key(&code, vaddr, runtime, size, |_| got) {
                prop_assert!(u64::from(key) < size);
            }
        }
    }
}
