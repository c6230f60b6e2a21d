//! Native and kernel frames (`--native`, `--kernel`).
//!
//! The kernel program appends to a sample the thread's user registers, a bounded copy of the
//! top of its user stack and its kernel stack (`profiler_common::NativeTrailer`). Here the
//! user stack is unwound (`process`, framehop over the files' unwind tables read by
//! `module_file`), named from the files' symbol tables and `/proc/kallsyms` (`kallsyms`),
//! and the Python frames are spliced in place of the interpreter's evaluation-function
//! frames (`sample::native_merge`). The Python frames themselves are exactly those of a sample without
//! `--native`: this module only adds frames around them.

pub mod budget;
pub mod demangle;
pub mod file_cache;
pub mod io;
pub mod kallsyms;
pub mod lines;
pub mod module_file;
mod musl;
mod origin;
pub mod process;
pub mod tables;
pub mod unwind_table;

use profiler_common::{MAX_NATIVE_STACK_BYTES, NativeTrailer};
use std::sync::Arc;


pub use io::NativeIo;
pub use origin::{NativeMapping, NativeOrigin};
pub use kallsyms::Kallsyms;
pub use process::{ProcessNative, UnwindEnd};

/// Bytes of user stack copied per sample by default (`--native-stack-bytes`).
pub const DEFAULT_STACK_BYTES: u32 = 16384;

/// How `--native` finds the user frames (`--native-walk`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NativeWalk {
    /// The kernel walks the stack at sample time with the files' unwind tables.
    #[default]
    Kernel,
    /// The kernel copies the top of the stack (`--native-stack-bytes`) and pyperch unwinds
    /// the copy later: deep or large frames end in `<truncated native>`.
    Copy,
}

/// What the kernel program records beside the Python frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeOptions {
    /// Bytes of user stack to copy (0: no native frames); with the kernel walk, non-zero
    /// only says that native frames are wanted.
    pub stack_bytes: u32,
    pub walk: NativeWalk,
    /// Record the kernel stack.
    pub kernel: bool,
    /// Write kernel frames' runtime addresses into outputs (`--kernel-addresses`). Off, a
    /// kernel frame is its name only: no output holds a kernel address (KASLR's base).
    pub kernel_addresses: bool,
}

impl NativeOptions {
    pub fn any(&self) -> bool {
        self.stack_bytes > 0 || self.kernel
    }

    /// Checks a `--native-stack-bytes` value.
    pub fn check_stack_bytes(bytes: u32) -> Result<u32, String> {
        if (512..=MAX_NATIVE_STACK_BYTES as u32).contains(&bytes) && bytes % 8 == 0 {
            Ok(bytes)
        } else {
            Err(format!("--native-stack-bytes must be a multiple of 8 from 512 to {MAX_NATIVE_STACK_BYTES} (got {bytes})"))
        }
    }
}

/// The session-wide part: options and kernel symbols.
pub struct NativeContext {
    pub options: NativeOptions,
    pub kallsyms: Option<Kallsyms>,
    /// pprof's mapping of every kernel frame: `[kernel]`, over the symbols' addresses; used
    /// only with `options.kernel_addresses`.
    pub kernel_mapping: Arc<NativeMapping>,
    /// With native frames: the reading of maps and files off the sampling loop.
    pub io: Option<NativeIo>,
    /// With the kernel walk: where each process's mappings and unwind rows go.
    pub tables: Option<std::sync::Arc<dyn tables::TableSink>>,
}

impl NativeContext {
    pub fn new(options: NativeOptions, kallsyms: Option<Kallsyms>, tables: Option<std::sync::Arc<dyn tables::TableSink>>) -> Self {
        let range = kallsyms.as_ref().and_then(Kallsyms::range).filter(|_| options.kernel_addresses);
        let (start, last) = range.unwrap_or((0, 0));
        let kernel_mapping = Arc::new(NativeMapping {
            file: Arc::from("[kernel]"),
            build_id: Arc::from(""),
            start,
            limit: last.saturating_add(1),
            offset: 0,
        });
        let io = (options.stack_bytes > 0).then(NativeIo::new);
        Self { options, kallsyms, kernel_mapping, io, tables }
    }
}

/// The interpreter's evaluation function: its native frames stand for Python frames. GCC
/// may split it (`_PyEval_EvalFrameDefault.cold`); those parts count too.
pub fn is_eval_function(name: &str) -> bool {
    name == "_PyEval_EvalFrameDefault" || name.starts_with("_PyEval_EvalFrameDefault.")
}

/// The native part of a record (what follows its full frames): the trailer, the kernel
/// addresses and the user stack bytes; `None` when the lengths do not fit the record
/// (`profiler_common::native_part`).
pub fn parse_native(bytes: &[u8]) -> Option<(NativeTrailer, &[u8], &[u8])> {
    profiler_common::native_part(bytes)
}

/// The kernel addresses of a record, leaf first.
pub fn kernel_addresses(kernel: &[u8]) -> impl Iterator<Item = u64> + '_ {
    kernel.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).take_while(|&a| a != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_part_lengths_are_checked() {
        let t = NativeTrailer { ip: 1, sp: 2, bp: 3, kernel_stack_len: 16, user_stack_len: 8, regs: 1, walk_end: 0 };
        let mut bytes = vec![0u8; profiler_common::NATIVE_TRAILER_SIZE];
        profiler_common::Plain::write_to(&t, &mut bytes);
        bytes.extend_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&[7; 8]);
        let (got, k, u) = parse_native(&bytes).expect("fits");
        assert_eq!(got, t);
        assert_eq!(kernel_addresses(k).collect::<Vec<_>>(), vec![0xffff_ffff_8100_0000]);
        assert_eq!(u, &[7; 8]);
        assert!(parse_native(&bytes[..bytes.len() - 1]).is_none(), "short record");
        assert!(parse_native(&bytes[..10]).is_none());
    }

    #[test]
    fn eval_function_names() {
        assert!(is_eval_function("_PyEval_EvalFrameDefault"));
        assert!(is_eval_function("_PyEval_EvalFrameDefault.cold"));
        assert!(!is_eval_function("_PyEval_EvalFrame"));
    }
}
