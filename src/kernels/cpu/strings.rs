//! The string kernels of everyday programs (TensorFlow's `string_ops.cc`): `StringSplit` and
//! `StringSplitV2` (sparse outputs: indices, values, dense shape), `Substr`, `RegexReplace`
//! and `StaticRegexReplace` (RE2 through [`super::re2`]), `StringLength`, `StringLower`,
//! `StringUpper`, `StringStrip`, `AsString` (C's printf through [`super::printf`]) and
//! `StringFormat` (tensor summaries through [`super::summary_text`]). `StringJoin` lives with
//! the checkpoint kernels that first needed it (`io.rs`).
//!
//! Values and messages are TensorFlow 2.21's. Tokens and substrings share the input's buffer
//! (`Bytes::slice`), so they cost no copy; outputs whose size comes from the input's values
//! (token counts, `AsString`'s width, a summary of every element, rewritten strings) go
//! through the memory budget before they are allocated.

use std::sync::Arc;

use bytes::Bytes;

use super::printf::{self, Conv, Spec};
use super::re2::Re2;
use super::summary_text::summarize;
use super::{input, int_values, unsupported_dtype};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a string op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "StringSplit" => |node| {
            Ok(Arc::new(Split::Any {
                skip_empty: attr::bool_or(node, "skip_empty", true)?,
            }))
        },
        "StringSplitV2" => |node| {
            Ok(Arc::new(Split::Python {
                maxsplit: attr::int_or(node, "maxsplit", -1)?,
            }))
        },
        "Substr" => |node| {
            Ok(Arc::new(Substr {
                chars: unit_is_chars(node)?,
            }))
        },
        "RegexReplace" => RegexReplace::create,
        "StaticRegexReplace" => StaticRegexReplace::create,
        "StringLength" => |node| {
            Ok(Arc::new(Length {
                chars: unit_is_chars(node)?,
            }))
        },
        "StringLower" => |node| Case::create(node, false),
        "StringUpper" => |node| Case::create(node, true),
        "StringStrip" => |_| Ok(Arc::new(Strip)),
        "AsString" => AsString::create,
        "StringFormat" => StringFormat::create,
        _ => return None,
    };
    Some(factory)
}

/// An INVALID_ARGUMENT naming `node`, for the checks a factory makes.
fn invalid(node: &NodeDef, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("node `{}` (op {}): {message}", node.name, node.op))
}

/// Input `i`, which must be a string tensor.
fn strings_input(ctx: &OpContext<'_>, i: usize) -> Result<Tensor> {
    let t = input(ctx, i)?;
    if t.dtype() != DType::String {
        return Err(unsupported_dtype(ctx, t.dtype(), &[DType::String]));
    }
    Ok(t)
}

/// Input `i` as one string: a string scalar, else `message` followed by its shape.
fn scalar_string(ctx: &OpContext<'_>, i: usize, message: &str) -> Result<Bytes> {
    let t = strings_input(ctx, i)?;
    if t.rank() != 0 {
        return Err(ctx.invalid(format!("{message}{}", t.shape())));
    }
    Ok(t.strings()?[0].clone())
}

/// The `unit` attr: `BYTE` or `UTF8_CHAR`.
fn unit_is_chars(node: &NodeDef) -> Result<bool> {
    match attr::string_or(node, "unit", "BYTE")?.as_str() {
        "BYTE" => Ok(false),
        "UTF8_CHAR" => Ok(true),
        other => Err(invalid(
            node,
            format!("unit must be BYTE or UTF8_CHAR, got {other:?}"),
        )),
    }
}

/// The bytes a tensor of `n` strings holding `bytes` in all takes (buffers and handles).
fn string_bytes(n: usize, bytes: usize) -> u64 {
    (n as u64).saturating_mul(std::mem::size_of::<Bytes>() as u64) + bytes as u64
}

/// C's `isspace` in the "C" locale.
pub(super) fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// How a split kernel cuts a string.
enum Split {
    /// `StringSplit`: at any byte of the delimiter (each byte on its own when it is empty).
    Any { skip_empty: bool },
    /// `StringSplitV2`: Python's `str.split(sep, maxsplit)`.
    Python { maxsplit: i64 },
}

impl Split {
    /// The token ranges of `s` cut at `sep`.
    fn tokens(&self, s: &[u8], sep: &[u8]) -> Vec<(usize, usize)> {
        match *self {
            Split::Any { skip_empty } => {
                // TensorFlow skips an empty string whatever `skip_empty` says.
                if sep.is_empty() || s.is_empty() {
                    return (0..s.len()).map(|i| (i, i + 1)).collect();
                }
                let mut out = Vec::new();
                let mut start = 0;
                for (i, c) in s.iter().enumerate() {
                    if sep.contains(c) {
                        out.push((start, i));
                        start = i + 1;
                    }
                }
                out.push((start, s.len()));
                if skip_empty {
                    out.retain(|(a, b)| a < b);
                }
                out
            }
            Split::Python { maxsplit } => python_split(s, sep, maxsplit),
        }
    }
}

/// TensorFlow's `SplitV2`, which follows Python's `str.split`.
fn python_split(s: &[u8], sep: &[u8], maxsplit: i64) -> Vec<(usize, usize)> {
    if maxsplit == 0 {
        return vec![(0, s.len())];
    }
    let mut out = Vec::new();
    let mut at = 0;
    if sep.is_empty() {
        let skip = |mut i: usize| {
            while i < s.len() && is_space(s[i]) {
                i += 1;
            }
            i
        };
        at = skip(at);
        while at < s.len() {
            let mut end = at;
            while end < s.len() && !is_space(s[end]) {
                end += 1;
            }
            out.push((at, end));
            at = skip(end);
            if maxsplit > 0 && out.len() as i64 == maxsplit {
                out.push((at, s.len()));
                return out;
            }
        }
        return out;
    }
    while let Some(found) = find(&s[at..], sep) {
        out.push((at, at + found));
        at += found + sep.len();
        if maxsplit > 0 && out.len() as i64 == maxsplit {
            break;
        }
    }
    out.push((at, s.len()));
    out
}

/// The first position of `needle` (not empty) in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl OpKernel for Split {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        if x.rank() != 1 {
            return Err(ctx.invalid(format!("input must be a vector, got shape: {}", x.shape())));
        }
        let what = match self {
            Split::Any { .. } => "delimiter must be a scalar, got shape: ",
            Split::Python { .. } => "sep must be a scalar, got shape: ",
        };
        let sep = scalar_string(ctx, 1, what)?;
        let rows = x.strings()?;
        let tokens: Vec<Vec<(usize, usize)>> = rows.iter().map(|s| self.tokens(s, &sep)).collect();
        let count: usize = tokens.iter().map(Vec::len).sum();
        // Two int64 per index row, a handle per token (the tokens share the input's bytes).
        ctx.check_fits(string_bytes(count, 16 * count))?;
        let mut indices = Vec::with_capacity(2 * count);
        let mut values = Vec::with_capacity(count);
        let mut widest = 0;
        for (row, (s, ranges)) in rows.iter().zip(&tokens).enumerate() {
            widest = widest.max(ranges.len());
            for (j, &(a, b)) in ranges.iter().enumerate() {
                indices.extend([row as i64, j as i64]);
                values.push(s.slice(a..b));
            }
        }
        ctx.set_output(0, Tensor::from_vec(vec![count, 2], indices)?);
        ctx.set_output(1, Tensor::from_strings(vec![count], values)?);
        let shape = vec![rows.len() as i64, widest as i64];
        ctx.set_output(2, Tensor::from_vec(vec![2], shape)?);
        Ok(())
    }
}

/// Substr(input, pos, len): the `len` bytes (or UTF-8 characters) of each string from `pos`
/// (from the end when negative; to the end when `len` is negative).
struct Substr {
    chars: bool,
}

/// The byte offset of character `k` of `s` (`s.len()` past the last).
fn char_offset(s: &[u8], k: usize) -> usize {
    s.iter()
        .enumerate()
        .filter(|(_, &c)| (c & 0xc0) != 0x80)
        .map(|(i, _)| i)
        .nth(k)
        .unwrap_or(s.len())
}

/// The number of UTF-8 characters of `s` (bytes that do not continue one).
fn char_count(s: &[u8]) -> usize {
    s.iter().filter(|&&c| (c & 0xc0) != 0x80).count()
}

impl Substr {
    /// The substring of `s`, or `None` when `pos` is out of range.
    fn cut(&self, s: &Bytes, pos: i64, len: i64) -> Option<Bytes> {
        let size = if self.chars { char_count(s) } else { s.len() } as i64;
        // TensorFlow's bounds: -size <= pos <= size.
        if pos.unsigned_abs() >= (size + i64::from(pos >= 0)) as u64 {
            return None;
        }
        let start = if pos < 0 { pos + size } else { pos };
        let end = if len < 0 {
            size
        } else {
            start.saturating_add(len).min(size)
        };
        let (a, b) = if self.chars {
            (char_offset(s, start as usize), char_offset(s, end as usize))
        } else {
            (start as usize, end as usize)
        };
        Some(s.slice(a..b))
    }
}

impl OpKernel for Substr {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        let (pos_t, len_t) = (input(ctx, 1)?, input(ctx, 2)?);
        if pos_t.shape() != len_t.shape() {
            return Err(ctx.invalid(format!(
                "pos and len should have the same shape, got: {} vs. {}",
                pos_t.shape(),
                len_t.shape()
            )));
        }
        let pos = int_values(ctx, &pos_t, "pos")?;
        let len = int_values(ctx, &len_t, "len")?;
        let strings = x.strings()?;
        let out_of_range = |s: &Bytes, p: i64, at: String| {
            ctx.invalid(format!(
                "pos {p} out of range for string b'{}' at index {at}",
                String::from_utf8_lossy(s)
            ))
        };
        // Elementwise when the shapes agree or pos is a scalar; else broadcast, which
        // TensorFlow implements for one and two dimensions.
        let (shape, pairs): (Shape, Pairs) = if x.shape() == pos_t.shape() || pos_t.rank() == 0 {
            let n = strings.len();
            let scalar = pos_t.rank() == 0;
            let pairs = (0..n)
                .map(|i| (i, if scalar { 0 } else { i }, i.to_string()))
                .collect();
            (x.shape().clone(), pairs)
        } else {
            broadcast_pairs(ctx, x.dims(), pos_t.dims())?
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (i, j, at) in pairs {
            let s = &strings[i];
            match self.cut(s, pos[j], len[j]) {
                Some(sub) => out.push(sub),
                None => return Err(out_of_range(s, pos[j], at)),
            }
        }
        ctx.set_output(0, Tensor::from_strings(shape, out)?);
        Ok(())
    }
}

/// Per output element: the input element, the pos/len element, the index for messages.
type Pairs = Vec<(usize, usize, String)>;

/// The output shape of broadcasting `a` against `b` (rank 1 or 2) and, per output element,
/// the element of each it reads and its index as TensorFlow's messages write it.
fn broadcast_pairs(ctx: &OpContext<'_>, a: &[usize], b: &[usize]) -> Result<(Shape, Pairs)> {
    let rank = a.len().max(b.len());
    let pad = |d: &[usize]| -> Vec<usize> {
        let mut p = vec![1; rank - d.len()];
        p.extend_from_slice(d);
        p
    };
    let (pa, pb) = (pad(a), pad(b));
    let mut out = Vec::with_capacity(rank);
    for (&x, &y) in pa.iter().zip(&pb) {
        match (x, y) {
            _ if x == y => out.push(x),
            (1, y) => out.push(y),
            (x, 1) => out.push(x),
            _ => {
                return Err(ctx.invalid(format!(
                    "Incompatible shapes: {} vs. {}",
                    Shape::new(a.to_vec()),
                    Shape::new(b.to_vec())
                )))
            }
        }
    }
    if rank > 2 {
        return Err(ctx.named(Status::unimplemented(format!(
            "Substr broadcast not implemented for {rank} dimensions"
        ))));
    }
    let flat = |p: &[usize], idx: &[usize]| -> usize {
        idx.iter()
            .zip(p)
            .fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
    };
    let n: usize = out.iter().product();
    let mut pairs = Vec::with_capacity(n);
    for k in 0..n {
        let idx: Vec<usize> = if rank == 2 {
            vec![k / out[1], k % out[1]]
        } else {
            vec![k]
        };
        let at = if rank == 2 {
            format!("({}, {})", idx[0], idx[1])
        } else {
            k.to_string()
        };
        pairs.push((flat(&pa, &idx), flat(&pb, &idx), at));
    }
    Ok((Shape::new(out), pairs))
}

/// Rewrites every string of `x` with `re` and `rewrite`, through the memory budget.
fn replace_all(
    ctx: &mut OpContext<'_>,
    x: &Tensor,
    re: &Re2,
    rewrite: &[u8],
    global: bool,
) -> Result<()> {
    let strings = x.strings()?;
    let mut out = Vec::with_capacity(strings.len());
    let mut total = 0usize;
    for s in strings {
        let replaced = if global {
            re.global_replace(s, rewrite)
        } else {
            re.replace(s, rewrite)
        };
        let s = match replaced {
            Some(r) => Bytes::from(r),
            None => s.clone(),
        };
        total += s.len();
        // Rewrites can grow without bound: check every megabyte of output.
        if total >> 20 != (total - s.len()) >> 20 {
            ctx.check_fits(string_bytes(out.len(), total))?;
        }
        out.push(s);
    }
    ctx.set_output(0, Tensor::from_strings(x.shape().clone(), out)?);
    Ok(())
}

/// RegexReplace(input, pattern, rewrite): the pattern comes as a tensor, compiled per step
/// (the last one kept, as TensorFlow keeps it).
struct RegexReplace {
    global: bool,
    last: std::sync::Mutex<Option<(Bytes, Arc<Re2>)>>,
}

impl RegexReplace {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Self {
            global: attr::bool_or(node, "replace_global", true)?,
            last: Default::default(),
        }))
    }
}

impl OpKernel for RegexReplace {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        let pattern = scalar_string(ctx, 1, "Pattern must be scalar, but received ")?;
        let rewrite = scalar_string(ctx, 2, "Replacement rewrite must be scalar, but received ")?;
        let cached = self.last.lock().ok().and_then(|l| {
            l.as_ref()
                .filter(|(p, _)| *p == pattern)
                .map(|(_, r)| r.clone())
        });
        let re = match cached {
            Some(re) => re,
            None => {
                let text = String::from_utf8_lossy(&pattern);
                let re = Arc::new(Re2::new(&text).map_err(|e| ctx.invalid(e))?);
                if let Ok(mut last) = self.last.lock() {
                    *last = Some((pattern.clone(), re.clone()));
                }
                re
            }
        };
        replace_all(ctx, &x, &re, &rewrite, self.global)
    }
}

/// StaticRegexReplace(input): the pattern and rewrite are attrs, compiled once.
struct StaticRegexReplace {
    re: Re2,
    rewrite: Vec<u8>,
    global: bool,
}

impl StaticRegexReplace {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let pattern = attr::string_or(node, "pattern", "")?;
        Ok(Arc::new(Self {
            re: Re2::new(&pattern).map_err(|e| invalid(node, e))?,
            rewrite: attr::string_or(node, "rewrite", "")?.into_bytes(),
            global: attr::bool_or(node, "replace_global", true)?,
        }))
    }
}

impl OpKernel for StaticRegexReplace {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        replace_all(ctx, &x, &self.re, &self.rewrite, self.global)
    }
}

/// StringLength(input): each string's length in bytes or UTF-8 characters, as int32.
struct Length {
    chars: bool,
}

impl OpKernel for Length {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        let lengths: Vec<i32> = x
            .strings()?
            .iter()
            .map(|s| {
                if self.chars {
                    char_count(s) as i32
                } else {
                    s.len() as i32
                }
            })
            .collect();
        ctx.set_output(0, Tensor::from_vec(x.shape().clone(), lengths)?);
        Ok(())
    }
}

/// StringLower / StringUpper(input): ASCII letters only, or with `encoding = "utf-8"` every
/// character by Unicode's full case mapping (invalid bytes become U+FFFD, as ICU makes them).
struct Case {
    upper: bool,
    utf8: bool,
}

impl Case {
    fn create(node: &NodeDef, upper: bool) -> Result<Arc<dyn OpKernel>> {
        let encoding = attr::string_or(node, "encoding", "")?;
        let utf8 = match encoding.as_str() {
            "" => false,
            "utf-8" => true,
            other => {
                return Err(invalid(
                    node,
                    format!("only utf-8 or '' (no encoding) is supported, received {other}"),
                ))
            }
        };
        Ok(Arc::new(Case { upper, utf8 }))
    }
}

impl OpKernel for Case {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        let out: Vec<Bytes> = x
            .strings()?
            .iter()
            .map(|s| {
                Bytes::from(match (self.utf8, self.upper) {
                    (false, false) => s.to_ascii_lowercase(),
                    (false, true) => s.to_ascii_uppercase(),
                    (true, false) => String::from_utf8_lossy(s).to_lowercase().into_bytes(),
                    (true, true) => String::from_utf8_lossy(s).to_uppercase().into_bytes(),
                })
            })
            .collect();
        ctx.set_output(0, Tensor::from_strings(x.shape().clone(), out)?);
        Ok(())
    }
}

/// StringStrip(input): each string without its leading and trailing ASCII whitespace.
struct Strip;

impl OpKernel for Strip {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = strings_input(ctx, 0)?;
        let out: Vec<Bytes> = x
            .strings()?
            .iter()
            .map(|s| {
                let start = s.iter().position(|&c| !is_space(c)).unwrap_or(s.len());
                let end = s
                    .iter()
                    .rposition(|&c| !is_space(c))
                    .map_or(start, |e| e + 1);
                s.slice(start..end)
            })
            .collect();
        ctx.set_output(0, Tensor::from_strings(x.shape().clone(), out)?);
        Ok(())
    }
}

/// AsString(input): each element through the printf format TensorFlow builds from the attrs:
/// `%{fill}{width}.{precision}{f|e|g}` for floats, `%{fill}{width}d` for integers,
/// `%{fill}{width}s` for strings; bools are `true` and `false`.
struct AsString {
    spec: Spec,
    conv: Conv,
}

impl AsString {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let dtype = attr::dtype(node, "T")?;
        let precision = attr::int_or(node, "precision", -1)?;
        let scientific = attr::bool_or(node, "scientific", false)?;
        let shortest = attr::bool_or(node, "shortest", false)?;
        let width = attr::int_or(node, "width", -1)?;
        let fill = attr::string_or(node, "fill", "")?;
        if scientific && shortest {
            return Err(invalid(
                node,
                "Cannot select both scientific and shortest notation",
            ));
        }
        if fill.len() > 1 {
            return Err(invalid(node, "Fill string must be one or fewer characters"));
        }
        let flag = fill.bytes().next();
        if let Some(c) = flag {
            if !matches!(c, b' ' | b'+' | b'-' | b'0' | b'#') {
                return Err(invalid(
                    node,
                    format!("Fill argument not supported: \"{fill}\""),
                ));
            }
        }
        match dtype {
            DType::Float | DType::Double | DType::String => {}
            DType::Int32 | DType::Int64 | DType::Bool => {
                if scientific || shortest {
                    return Err(invalid(
                        node,
                        format!(
                            "scientific and shortest format not supported for datatype {}",
                            dtype.name()
                        ),
                    ));
                }
                if precision >= 0 {
                    return Err(invalid(
                        node,
                        format!("precision not supported for datatype {}", dtype.name()),
                    ));
                }
            }
            other => {
                return Err(invalid(
                    node,
                    format!(
                        "Type {} not supported; AsString converts float, double, int32, int64, \
                         bool and string",
                        other.name()
                    ),
                ))
            }
        }
        let spec = Spec {
            width: usize::try_from(width).unwrap_or(0),
            precision: usize::try_from(precision).ok(),
            ..Spec::default()
        }
        .with_flag(flag);
        let conv = if shortest {
            Conv::General
        } else if scientific {
            Conv::Exp
        } else {
            Conv::Fixed
        };
        Ok(Arc::new(AsString { spec, conv }))
    }
}

impl OpKernel for AsString {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let n = x.num_elements();
        // Each string is at least `width` bytes; a float in %f up to 330 digits.
        let widest = self.spec.width.max(24) + self.spec.precision.unwrap_or(6);
        ctx.check_fits(string_bytes(n, n.saturating_mul(widest)))?;
        let (spec, conv) = (&self.spec, self.conv);
        // TensorFlow's CPU kernels read subnormal floats as zero (`ScopedFlushDenormal`).
        let flush = |v: f64| {
            if v.is_subnormal() {
                0f64.copysign(v)
            } else {
                v
            }
        };
        let out: Vec<Bytes> = match x.dtype() {
            DType::Float => x
                .values::<f32>()?
                .iter()
                .map(|&v| Bytes::from(printf::float(flush(f64::from(v)), spec, conv)))
                .collect(),
            DType::Double => x
                .values::<f64>()?
                .iter()
                .map(|&v| Bytes::from(printf::float(flush(v), spec, conv)))
                .collect(),
            DType::Int32 => x
                .values::<i32>()?
                .iter()
                .map(|&v| Bytes::from(printf::int(i64::from(v), spec)))
                .collect(),
            DType::Int64 => x
                .values::<i64>()?
                .iter()
                .map(|&v| Bytes::from(printf::int(v, spec)))
                .collect(),
            DType::Bool => x
                .values::<bool>()?
                .iter()
                .map(|&v| Bytes::from_static(if v { b"true" } else { b"false" }))
                .collect(),
            DType::String => x
                .strings()?
                .iter()
                .map(|s| Bytes::from(printf::string(s, spec)))
                .collect(),
            other => {
                let accepted = [
                    DType::Float,
                    DType::Double,
                    DType::Int32,
                    DType::Int64,
                    DType::Bool,
                    DType::String,
                ];
                return Err(unsupported_dtype(ctx, other, &accepted));
            }
        };
        ctx.set_output(0, Tensor::from_strings(x.shape().clone(), out)?);
        Ok(())
    }
}

/// StringFormat(inputs...): the template with each placeholder replaced by the summary of
/// the next input (TensorFlow's v2 layout, `summarize` entries at each end of a dimension).
struct StringFormat {
    /// The template cut at its placeholders: one more piece than inputs.
    pieces: Vec<String>,
    summarize: i64,
}

impl StringFormat {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let template = attr::string_or(node, "template", "%s")?;
        let placeholder = attr::string_or(node, "placeholder", "%s")?;
        let inputs = attr::dtype_list(node, "T").map(|t| t.len()).unwrap_or(0);
        let pieces: Vec<String> = if placeholder.is_empty() {
            vec![template]
        } else {
            template.split(&placeholder).map(str::to_string).collect()
        };
        if pieces.len() - 1 != inputs {
            return Err(invalid(
                node,
                format!(
                    "num placeholders in template and num inputs must match: {} vs. {inputs}",
                    pieces.len() - 1
                ),
            ));
        }
        Ok(Arc::new(StringFormat {
            pieces,
            summarize: attr::int_or(node, "summarize", 3)?,
        }))
    }
}

impl OpKernel for StringFormat {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        if ctx.num_inputs() + 1 != self.pieces.len() {
            return Err(ctx.invalid(format!(
                "num placeholders in template and num inputs must match: {} vs. {}",
                self.pieces.len() - 1,
                ctx.num_inputs()
            )));
        }
        // A summary writes at most about 30 bytes per element it shows.
        let shown: usize = ctx
            .inputs()
            .iter()
            .map(|t| {
                let n = t.num_elements();
                if self.summarize < 0 {
                    n
                } else {
                    n.min(
                        (self.summarize as usize)
                            .saturating_mul(2)
                            .saturating_pow(t.rank() as u32),
                    )
                }
            })
            .sum();
        ctx.check_fits(shown.saturating_mul(30) as u64)?;
        let mut out = self.pieces[0].clone();
        for (t, piece) in ctx.inputs().iter().zip(&self.pieces[1..]) {
            out.push_str(&summarize(t, self.summarize, true)?);
            out.push_str(piece);
        }
        ctx.set_output(0, Tensor::string(out));
        Ok(())
    }
}
