//! Reading one code object: names, first line and line table.

use std::sync::Arc;

use super::strings::{read_bytes, read_str};
use super::{MAX_LINETABLE_BYTES, MAX_NAME_CHARS, MAX_PATH_CHARS, SymbolError, linetable};
use crate::target::layout::{LineTableFormat, PythonLayout};
use crate::target::memory::{ReadMemory, field_i32, field_u64};

/// What symbolization needs from one code object, copied out of the target.
///
/// Invariants: `qualname` and `filename` hold at most `MAX_NAME_CHARS` / `MAX_PATH_CHARS`
/// characters; `linetable` at most `MAX_LINETABLE_BYTES` bytes, in `line_format`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname` where the version has it (3.11+), else `co_name`.
    pub qualname: Arc<str>,
    pub filename: Arc<str>,
    pub firstlineno: u32,
    /// `_co_firsttraceable` in code units (3.11+); 0 where the version has no such field.
    pub firsttraceable: u32,
    pub line_format: LineTableFormat,
    /// `co_lnotab` (3.8, 3.9) or `co_linetable` (3.10+), raw.
    pub linetable: Box<[u8]>,
}

impl CodeInfo {
    /// The line of the instruction at `byte_offset` into the bytecode; see
    /// `linetable::line_for_offset` (negative → `firstlineno`; `None` = no line).
    pub fn line(&self, byte_offset: i32) -> Option<u32> {
        linetable::line_for_offset(self.line_format, &self.linetable, self.firstlineno, byte_offset)
    }
}

/// The addresses of the target's type objects a code object and its fields must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeAddresses {
    /// `&PyCode_Type`.
    pub code: u64,
    /// `&PyUnicode_Type` / `&PyBytes_Type`, when known (unchecked when `None`).
    pub str: Option<u64>,
    pub bytes: Option<u64>,
}

/// Reads and validates one code object: its `ob_type` must equal `types.code`
/// (`&PyCode_Type` in the target), else `NotCode`; its names must be `str` objects and its
/// line table a `bytes` object (`WrongType`) when those types are known.
///
/// One read of `layout.code.size` bytes covers the code object's fields; then one or two
/// reads per string (`read_str`) and two for the line table (`read_bytes`).
pub fn read_code<M: ReadMemory + ?Sized>(
    mem: &M,
    layout: &PythonLayout,
    types: &TypeAddresses,
    code_address: u64,
) -> Result<CodeInfo, SymbolError> {
    let code = &layout.code;
    let objects = &layout.objects;
    let buf = mem.read_vec(code_address, code.size as usize)?;

    let field = |name: &'static str, offset: u32| {
        field_u64(&buf, offset as usize).ok_or(SymbolError::BadField {
            address: code_address,
            field: name,
            reason: "outside the layout's read size",
        })
    };
    let int_field = |name: &'static str, offset: u32| {
        let value = field_i32(&buf, offset as usize).ok_or(SymbolError::BadField {
            address: code_address,
            field: name,
            reason: "outside the layout's read size",
        })?;
        u32::try_from(value).map_err(|_| SymbolError::BadField {
            address: code_address,
            field: name,
            reason: "negative",
        })
    };

    let ob_type = field("ob_type", objects.ob_type)?;
    if ob_type != types.code {
        return Err(SymbolError::NotCode { address: code_address, ob_type });
    }
    let (name_field, name_offset) = match code.qualname {
        Some(offset) => ("co_qualname", offset),
        None => ("co_name", code.name),
    };
    let name_ptr = field(name_field, name_offset)?;
    let filename_ptr = field("co_filename", code.filename)?;
    let linetable_ptr = field("co_linetable", code.linetable)?;
    let firstlineno = int_field("co_firstlineno", code.firstlineno)?;
    let firsttraceable = match code.firsttraceable {
        Some(offset) => int_field("_co_firsttraceable", offset)?,
        None => 0,
    };

    let qualname = read_str(mem, objects, name_ptr, MAX_NAME_CHARS, types.str)?;
    let filename = read_str(mem, objects, filename_ptr, MAX_PATH_CHARS, types.str)?;
    let table = read_bytes(mem, objects, linetable_ptr, MAX_LINETABLE_BYTES, types.bytes)?;
    Ok(CodeInfo {
        qualname: qualname.into(),
        filename: filename.into(),
        firstlineno,
        firsttraceable,
        line_format: code.line_format,
        linetable: table.into_boxed_slice(),
    })
}
