//! From decoded `_Py_DebugOffsets` to the [`PythonLayout`] the walk and symbolization use:
//! the published offsets plus `tables::extras_for` (what CPython does not publish), each
//! checked against the kernel's read sizes.

use profiler_common::{FRAME_READ_MAX, ThreadLayout, instr_kind};

use super::{DebugOffsets, DebugOffsetsError};
use crate::target::layout::tables::{self, Extras};
use crate::target::layout::{CodeLayout, ObjectLayout, PythonLayout, TlbcLayout};

impl DebugOffsets {
    /// The complete layout: the decoded offsets plus `tables::extras_for(version)`.
    pub fn layout(&self) -> Result<PythonLayout, DebugOffsetsError> {
        let extras: &Extras = tables::extras_for(self.version, self.free_threaded)
            .ok_or(DebugOffsetsError::NoExtras { version: self.version })?;
        let o = |group, field| self.offset(group, field);

        let thread = ThreadLayout {
            frame: o("thread_state", "current_frame")?,
            cframe_frame: profiler_common::NO_FIELD,
            native_thread_id: o("thread_state", "native_thread_id")?,
            thread_id: o("thread_state", "thread_id")?,
            next: o("thread_state", "next")?,
            interp_threads_head: o("interpreter_state", "threads_head")?,
        };
        let code_adaptive = o("code_object", "co_code_adaptive")?;
        let frame = tables::frame_layout(
            o("interpreter_frame", "previous")?,
            o("interpreter_frame", "executable")?,
            o("interpreter_frame", "instr_ptr")?,
            instr_kind::POINTER,
            o("interpreter_frame", "owner")?,
            code_adaptive,
            extras.code_mask,
        );
        // Free-threaded builds: the frame's bytecode copy (a placeholder 0 elsewhere).
        let frame = match self.get("interpreter_frame", "tlbc_index") {
            Some(at) if self.free_threaded && at != 0 => {
                let at = o("interpreter_frame", "tlbc_index")?;
                if at + 4 > frame.read_size {
                    return Err(self.out_of_range("interpreter_frame", "tlbc_index", at.into(), frame.read_size.into()));
                }
                profiler_common::FrameLayout { tlbc_index: at, ..frame }
            }
            _ => frame,
        };
        if !tables::frame_layout_is_sane(&frame) {
            return Err(self.out_of_range(
                "interpreter_frame",
                "(read size)",
                frame.read_size.into(),
                FRAME_READ_MAX as u64 - 1,
            ));
        }
        if extras.firsttraceable + 4 > code_adaptive {
            return Err(self.out_of_range(
                "code_object",
                "_co_firsttraceable (from pyperch's table)",
                extras.firsttraceable.into(),
                code_adaptive.into(),
            ));
        }
        let (filename, name, qualname) =
            (o("code_object", "filename")?, o("code_object", "name")?, o("code_object", "qualname")?);
        let (firstlineno, linetable) = (o("code_object", "firstlineno")?, o("code_object", "linetable")?);
        let code = CodeLayout {
            size: tables::code_read_size(
                filename,
                name,
                Some(qualname),
                firstlineno,
                linetable,
                Some(extras.firsttraceable),
                code_adaptive,
            ),
            filename,
            name,
            qualname: Some(qualname),
            firstlineno,
            linetable,
            line_format: extras.line_format,
            firsttraceable: Some(extras.firsttraceable),
            version: Some(extras.code_version),
        };
        let (_, window) = crate::target::layout::check_window(&code);
        if window as usize >= FRAME_READ_MAX || extras.code_version + 4 > code_adaptive {
            return Err(self.out_of_range("code_object", "(validation window)", window.into(), FRAME_READ_MAX as u64 - 1));
        }
        let str_compact_data = match self.get("unicode_object", "compactunicodeobject_size") {
            Some(_) => o("unicode_object", "compactunicodeobject_size")?,
            None => extras.str_compact_data,
        };
        let objects = ObjectLayout {
            free_threaded: self.free_threaded,
            ob_type: o("pyobject", "ob_type")?,
            str_length: o("unicode_object", "length")?,
            str_state: o("unicode_object", "state")?,
            str_ascii_data: o("unicode_object", "asciiobject_size")?,
            str_compact_data,
            bytes_size: o("bytes_object", "ob_size")?,
            bytes_data: o("bytes_object", "ob_sval")?,
        };
        // Free-threaded builds: where the threads' bytecode copies are (the kernel's offsets
        // are relative to the code object's own bytecode; `symbolize::tlbc` rebases them).
        let tlbc = match (self.free_threaded, frame.tlbc_index) {
            (true, at) if at != 0 => Some(TlbcLayout {
                code_tlbc: o("code_object", "co_tlbc")?,
                code_adaptive,
                code_size: o("tuple_object", "ob_size")?,
                generation: o("interpreter_state", "tlbc_generation")?,
                interp_next: o("interpreter_state", "next")?,
            }),
            _ => None,
        };
        Ok(PythonLayout {
            version: self.version,
            free_threaded: self.free_threaded,
            tlbc,
            interpreters_head: o("runtime_state", "interpreters_head")?,
            pthread_key: extras.pthread_key,
            thread,
            frame,
            frame_semantics: extras.frame_semantics,
            code,
            objects,
        })
    }
}
