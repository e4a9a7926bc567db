//! TensorFlow's text summary of a tensor (`Tensor::SummarizeValue`), which `StringFormat`,
//! `PrintV2` (through `tf.print`'s format) and the TF1 `Print` write.
//!
//! Two layouts, as TensorFlow 2.21 has them: the v2 one (`print_v2`) nests brackets per
//! dimension, shows the first and last `summarize` entries of each with `...` between, puts
//! blank lines between the blocks of higher dimensions and quotes strings (`[[1 2]\n [3 4]]`,
//! `["a" "b"]`); the v1 one (`Print`) walks the first `summarize` elements in row-major order
//! and stops with `...` (`[[0 1 2...]...]`). Floats are written as the shortest of two
//! `%g` precisions that reads back (`printf::shortest_f32`), bools as `1` and `0`, strings
//! with C escapes (bytes from 0x80 up kept, for UTF-8).

use super::printf::{shortest_f32, shortest_f64};
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// The summary of `t` showing `summarize` entries per dimension (v2) or in all (v1); a
/// negative `summarize` shows every element.
pub(super) fn summarize(t: &Tensor, summarize: i64, v2: bool) -> Result<String> {
    let n = t.num_elements();
    let limit = if summarize < 0 {
        n
    } else {
        (summarize as usize).min(n)
    };
    let elements = elements(t, v2)?;
    let dims = t.dims();
    let mut out = String::new();
    if dims.is_empty() {
        for i in 0..limit {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&elements(i));
        }
        if n > limit {
            out.push_str("...");
        }
    } else if v2 {
        one_dim_v2(0, dims, limit, &elements, 0, &mut out);
    } else {
        let mut index = 0;
        one_dim_v1(0, dims, limit, &elements, &mut index, &mut out);
        if n > limit {
            out.push_str("...");
        }
    }
    Ok(out)
}

/// Formats element `i` (for the `i`s a summary shows).
type Elements<'a> = Box<dyn Fn(usize) -> String + 'a>;

/// Element `i` of `t` as the summaries write it.
fn elements(t: &Tensor, v2: bool) -> Result<Elements<'_>> {
    Ok(match t.dtype() {
        DType::Float => {
            let v = t.values::<f32>()?;
            Box::new(move |i| shortest_f32(v[i]))
        }
        DType::Double => {
            let v = t.values::<f64>()?;
            Box::new(move |i| shortest_f64(v[i]))
        }
        DType::Int32 => {
            let v = t.values::<i32>()?;
            Box::new(move |i| v[i].to_string())
        }
        DType::Int64 => {
            let v = t.values::<i64>()?;
            Box::new(move |i| v[i].to_string())
        }
        DType::Bool => {
            let v = t.values::<bool>()?;
            Box::new(move |i| if v[i] { "1" } else { "0" }.to_string())
        }
        DType::String => {
            let v = t.strings()?;
            Box::new(move |i| {
                let escaped = c_escape(&v[i]);
                if v2 {
                    format!("\"{escaped}\"")
                } else {
                    escaped
                }
            })
        }
        other => Box::new(move |_| format!("<{other}>")),
    })
}

/// absl's `Utf8SafeCEscape`: C escapes for quotes, backslashes and control bytes (octal),
/// bytes from 0x80 up kept as they are.
pub(super) fn c_escape(s: &[u8]) -> String {
    let mut out = Vec::with_capacity(s.len());
    for &c in s {
        match c {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\'' => out.extend_from_slice(b"\\'"),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e | 0x80..=0xff => out.push(c),
            _ => out.extend_from_slice(format!("\\{c:03o}").as_bytes()),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// TensorFlow's `PrintDimSpacing`: a space inside the innermost dimension, else a newline per
/// dimension below this one and an indent of one space per dimension above.
fn dim_spacing(dim: usize, rank: usize, out: &mut String) {
    if dim == rank - 1 {
        out.push(' ');
        return;
    }
    out.extend(std::iter::repeat_n('\n', rank - dim - 1));
    out.extend(std::iter::repeat_n(' ', dim + 1));
}

/// TensorFlow's `PrintOneDimV2`: the first and last `ends` entries of dimension `dim`.
fn one_dim_v2(
    dim: usize,
    dims: &[usize],
    ends: usize,
    elements: &Elements<'_>,
    index: usize,
    out: &mut String,
) {
    if dim == dims.len() {
        out.push_str(&elements(index));
        return;
    }
    out.push('[');
    let count = dims[dim];
    let start_of_end = ends.max(count.saturating_sub(ends));
    let per_entry: usize = dims[dim + 1..].iter().product();
    for i in 0..ends.min(count) {
        if i > 0 {
            dim_spacing(dim, dims.len(), out);
        }
        one_dim_v2(dim + 1, dims, ends, elements, index + per_entry * i, out);
    }
    if count > 2 * ends {
        dim_spacing(dim, dims.len(), out);
        out.push_str("...");
    }
    for i in start_of_end..count {
        dim_spacing(dim, dims.len(), out);
        one_dim_v2(dim + 1, dims, ends, elements, index + per_entry * i, out);
    }
    out.push(']');
}

/// TensorFlow's `PrintOneDim`: elements in row-major order until `limit` are shown.
fn one_dim_v1(
    dim: usize,
    dims: &[usize],
    limit: usize,
    elements: &Elements<'_>,
    index: &mut usize,
    out: &mut String,
) {
    if *index >= limit {
        return;
    }
    let count = dims[dim];
    if dim == dims.len() - 1 {
        for i in 0..count {
            if *index >= limit {
                if dim != 0 {
                    out.push_str("...");
                }
                return;
            }
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&elements(*index));
            *index += 1;
        }
        return;
    }
    for _ in 0..count {
        let mut open = false;
        if *index < limit {
            out.push('[');
            open = true;
        }
        one_dim_v1(dim + 1, dims, limit, elements, index, out);
        if *index < limit || open {
            out.push(']');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        Tensor::from_vec(dims.to_vec(), (0..n as i64).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn v2_summaries_are_tensorflows() {
        let s = |dims: &[usize], k| summarize(&range(dims), k, true).unwrap();
        assert_eq!(s(&[10], 3), "[0 1 2 ... 7 8 9]");
        assert_eq!(s(&[10], -1), "[0 1 2 3 4 5 6 7 8 9]");
        assert_eq!(s(&[10], 0), "[ ...]");
        assert_eq!(s(&[2, 0], 3), "[\n ...]");
        assert_eq!(s(&[0, 3], 3), "[]");
        assert_eq!(
            s(&[2, 3, 4], 1),
            "[[[0 ... 3]\n  ...\n  [8 ... 11]]\n\n [[12 ... 15]\n  ...\n  [20 ... 23]]]"
        );
        assert_eq!(s(&[], 0), "...");
    }

    #[test]
    fn v1_summaries_are_tensorflows() {
        let s = |dims: &[usize], k| summarize(&range(dims), k, false).unwrap();
        assert_eq!(s(&[2, 5], 3), "[0 1 2...]...");
        assert_eq!(s(&[2, 3, 4], 5), "[[0 1 2 3][4...]]...");
        assert_eq!(s(&[7], -1), "0 1 2 3 4 5 6");
        let strings =
            Tensor::from_strings(vec![1], vec![bytes::Bytes::from_static(b"\x01\"\xc3\xa9")])
                .unwrap();
        assert_eq!(summarize(&strings, 3, false).unwrap(), "\\001\\\"é");
    }
}
