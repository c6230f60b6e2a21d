//! A short, bounded rendering of one Python object read out of a target, without running any
//! of its code: `None`, `bool`, `int`, `float`, `str` and `bytes` by value (cut to a few dozen
//! characters), `list`, `tuple`, `dict`, `set` and `frozenset` as their type and length, and
//! anything else as its type name.
//!
//! A type is recognised by its `tp_name` only when it is a static type (not
//! `Py_TPFLAGS_HEAPTYPE`): a class defined in Python code named `int` renders as an object.
//! Every read is bounded and checked; an unreadable or malformed object renders as
//! `<unreadable>`, never as a guess.

use serde::Serialize;

use crate::target::layout::ObjectLayout;
use crate::target::layout::inspection::ValueLayout;
use crate::target::memory::{ProcessMemory, field_u64};
use crate::target::symbolize::read_str;

/// Characters of a `str` (or bytes of a `bytes`) shown before it is cut.
pub const MAX_SHOWN_CHARS: usize = 64;
/// Longest `str` read to show its start; longer ones show their length only.
const MAX_STR_READ: usize = 4096;
/// Longest `tp_name` read.
const MAX_TYPE_NAME: usize = 128;
/// `Py_TPFLAGS_HEAPTYPE`.
const TPFLAGS_HEAPTYPE: u64 = 1 << 9;
/// An `int` with more 30-bit digits than this is shown by its digit count only.
const MAX_INT_DIGITS: u64 = 4;

/// One rendered value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rendered {
    /// The type's name (`tp_name`), or empty when unreadable.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The rendering: a Python literal for scalars, `<list of 3>` for containers.
    pub value: String,
}

impl Rendered {
    fn unreadable() -> Self {
        Self { type_name: String::new(), value: "<unreadable>".into() }
    }
}

/// Reads and renders the object at `address`.
pub fn render(mem: &ProcessMemory, objects: &ObjectLayout, values: &ValueLayout, address: u64) -> Rendered {
    try_render(mem, objects, values, address).unwrap_or_else(Rendered::unreadable)
}

fn try_render(mem: &ProcessMemory, objects: &ObjectLayout, values: &ValueLayout, address: u64) -> Option<Rendered> {
    let ob_type = mem.read_u64(address.wrapping_add(objects.ob_type.into())).ok()?;
    let name_ptr = mem.read_u64(ob_type.wrapping_add(values.type_name.into())).ok()?;
    let flags = mem.read_u64(ob_type.wrapping_add(values.type_flags.into())).ok()?;
    let type_name = mem.read_c_string(name_ptr, MAX_TYPE_NAME)?;
    let builtin = flags & TPFLAGS_HEAPTYPE == 0;
    let value = if builtin { render_builtin(mem, objects, values, address, &type_name) } else { None };
    let value = value.unwrap_or_else(|| format!("<{} object>", crate::text::field(&type_name)));
    Some(Rendered { type_name, value })
}

fn render_builtin(
    mem: &ProcessMemory,
    objects: &ObjectLayout,
    values: &ValueLayout,
    address: u64,
    type_name: &str,
) -> Option<String> {
    let word = |offset: u32| mem.read_u64(address.wrapping_add(offset.into())).ok();
    let length = |offset: u32| word(offset).map(|n| n as i64).filter(|n| *n >= 0);
    Some(match type_name {
        "NoneType" => "None".into(),
        "bool" => if read_int(mem, values, address)? != 0 { "True".into() } else { "False".into() },
        "int" => read_int_text(mem, values, address)?,
        "float" => render_float(f64::from_bits(word(values.float_value)?)),
        "str" => render_str(mem, objects, address)?,
        "bytes" => render_bytes(mem, objects, address)?,
        "list" | "tuple" => format!("<{type_name} of {}>", length(values.var_size)?),
        "dict" => format!("<dict of {}>", length(values.dict_used)?),
        "set" | "frozenset" => format!("<{type_name} of {}>", length(values.set_used)?),
        _ => return None,
    })
}

fn render_float(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf".into() } else { "-inf".into() }
    } else if v != 0.0 && !(1e-4..1e16).contains(&v.abs()) {
        // Python's repr switches to an exponent outside this range.
        let e = format!("{v:e}");
        match e.split_once('e') {
            Some((m, x)) if !x.starts_with('-') => format!("{m}e+{x}"),
            _ => e,
        }
    } else if v == v.trunc() {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// `(negative, digit count)` of an `int`.
fn int_shape(mem: &ProcessMemory, values: &ValueLayout, address: u64) -> Option<(bool, u64)> {
    match values.long_tag {
        Some(tag_offset) => {
            // 3.12+: lv_tag = digits << 3 | sign (0 positive, 1 zero, 2 negative).
            let tag = mem.read_u64(address.wrapping_add(tag_offset.into())).ok()?;
            let sign = tag & 3;
            if sign == 3 {
                return None;
            }
            let digits = tag >> 3;
            Some((sign == 2, if sign == 1 { 0 } else { digits }))
        }
        None => {
            let size = mem.read_u64(address.wrapping_add(values.var_size.into())).ok()? as i64;
            Some((size < 0, size.unsigned_abs()))
        }
    }
}

/// The value of a small `int` (up to `MAX_INT_DIGITS` 30-bit digits), as i128.
fn read_int(mem: &ProcessMemory, values: &ValueLayout, address: u64) -> Option<i128> {
    let (negative, digits) = int_shape(mem, values, address)?;
    if digits > MAX_INT_DIGITS {
        return None;
    }
    let buf = mem.read_vec(address.wrapping_add(values.long_digits.into()), digits as usize * 4).ok()?;
    let mut value: i128 = 0;
    for chunk in buf.chunks_exact(4).rev() {
        let digit = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        if digit >= 1 << 30 {
            return None;
        }
        value = (value << 30) | i128::from(digit);
    }
    Some(if negative { -value } else { value })
}

fn read_int_text(mem: &ProcessMemory, values: &ValueLayout, address: u64) -> Option<String> {
    let (_, digits) = int_shape(mem, values, address)?;
    if digits > MAX_INT_DIGITS {
        return Some(format!("<int of {} bits>", digits.saturating_mul(30)));
    }
    Some(read_int(mem, values, address)?.to_string())
}

/// A `str` as a Python literal, cut to `MAX_SHOWN_CHARS` (`...` marks the cut).
fn render_str(mem: &ProcessMemory, objects: &ObjectLayout, address: u64) -> Option<String> {
    let full_length = mem.read_u64(address.wrapping_add(objects.str_length.into())).ok()?;
    // Read at most the shown characters plus one: longer strings are read as a prefix, by
    // presenting a bounded length to the reader (`read_str` refuses longer ones).
    let text = match read_str(mem, objects, address, MAX_STR_READ, None) {
        Ok(text) => text,
        Err(crate::target::symbolize::SymbolError::TooLong { .. }) => return Some(format!("<str of {full_length} characters>")),
        Err(_) => return None,
    };
    let mut out = String::from("'");
    for c in text.chars().take(MAX_SHOWN_CHARS) {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&c.escape_default().to_string()),
            c => out.push(c),
        }
    }
    out.push('\'');
    if full_length > MAX_SHOWN_CHARS as u64 {
        out.push_str(&format!("... ({full_length} characters)"));
    }
    Some(out)
}

/// A `bytes` as a Python literal, cut to `MAX_SHOWN_CHARS` bytes.
fn render_bytes(mem: &ProcessMemory, objects: &ObjectLayout, address: u64) -> Option<String> {
    let size = mem.read_u64(address.wrapping_add(objects.bytes_size.into())).ok()? as i64;
    let size = u64::try_from(size).ok()?;
    let shown = size.min(MAX_SHOWN_CHARS as u64) as usize;
    let data = mem.read_vec(address.wrapping_add(objects.bytes_data.into()), shown).ok()?;
    let mut out = String::from("b'");
    for &b in &data {
        match b {
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    if size > shown as u64 {
        out.push_str(&format!("... ({size} bytes)"));
    }
    Some(out)
}

/// The names in a tuple of `str` (e.g. `co_varnames`), at most `max` of them; `None` when the
/// tuple is unreadable. A name that does not read is `?`.
pub fn read_name_tuple(
    mem: &ProcessMemory,
    objects: &ObjectLayout,
    values: &ValueLayout,
    tuple: u64,
    max: usize,
) -> Option<Vec<String>> {
    let header = mem.read_vec(tuple, (values.tuple_items as usize).max(values.var_size as usize + 8)).ok()?;
    let count = field_u64(&header, values.var_size as usize)? as i64;
    let count = usize::try_from(count).ok()?.min(max);
    let items = mem.read_vec(tuple.wrapping_add(values.tuple_items.into()), count * 8).ok()?;
    Some(
        items
            .chunks_exact(8)
            .map(|c| {
                let ptr = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                read_str(mem, objects, ptr, crate::target::symbolize::MAX_NAME_CHARS, None).unwrap_or_else(|_| "?".into())
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats() {
        assert_eq!(render_float(0.25), "0.25");
        assert_eq!(render_float(3.0), "3.0");
        assert_eq!(render_float(f64::NAN), "nan");
        assert_eq!(render_float(f64::NEG_INFINITY), "-inf");
        assert_eq!(render_float(1e300), "1e+300");
        assert_eq!(render_float(-2.5e-7), "-2.5e-7");
        assert_eq!(render_float(0.0), "0.0");
    }
}
