//! The kernels that turn strings into numbers: `StringToNumber`, `DecodeRaw` (fixed-size
//! elements from each string's bytes) and `DecodeCSV` (one output per column, with a default
//! for an empty or `na_value` field).
//!
//! Numbers parse as TensorFlow's `safe_strto*` (absl's `SimpleAtoi`/`SimpleAtod`) parse them:
//! surrounding ASCII whitespace (with `\v`) ignored, one `+` or `-`; floats also take `inf`,
//! `infinity` and `nan` in any case, hexadecimal (`0x1.8p1`), and overflow to infinity;
//! integers are decimal and must fit. CSV fields are split as TensorFlow's `ExtractFields`
//! splits them, quirks included (a newline at the start of a field is skipped, a doubled
//! quote inside a quoted field is one quote). Messages are TensorFlow 2.21's.

use std::sync::Arc;

use bytes::Bytes;

use super::strings::is_space;
use super::{input, unsupported_dtype};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a decoding op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "StringToNumber" => |node| {
            Ok(Arc::new(StringToNumber {
                dtype: attr::dtype(node, "out_type").unwrap_or(DType::Float),
            }))
        },
        "DecodeRaw" => |node| {
            Ok(Arc::new(DecodeRaw {
                dtype: attr::dtype(node, "out_type")?,
                little_endian: attr::bool_or(node, "little_endian", true)?,
            }))
        },
        "DecodeCSV" => DecodeCsv::create,
        _ => return None,
    };
    Some(factory)
}

/// An INVALID_ARGUMENT naming `node`, for the checks a factory makes.
fn invalid(node: &NodeDef, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("node `{}` (op {}): {message}", node.name, node.op))
}

/// `s` without its leading and trailing whitespace.
fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&c| !is_space(c)).unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&c| !is_space(c))
        .map_or(start, |e| e + 1);
    &s[start..end]
}

/// A number type `StringToNumber` and `DecodeCSV` produce.
trait Parsed: Sized {
    /// Parses `s` as TensorFlow's `safe_strto*`.
    fn parse(s: &[u8]) -> Option<Self>;
}

macro_rules! parsed_int {
    ($($t:ty),*) => {$(
        impl Parsed for $t {
            fn parse(s: &[u8]) -> Option<Self> {
                std::str::from_utf8(trim(s)).ok()?.parse().ok()
            }
        }
    )*};
}
parsed_int!(i32, i64);

/// The float `s` spells: `None` where absl's `SimpleAtod` refuses it.
fn parse_float<T: std::str::FromStr>(
    s: &[u8],
    from_f64: fn(f64) -> T,
    negate: fn(T) -> T,
) -> Option<T> {
    let text = std::str::from_utf8(trim(s)).ok()?;
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if body.is_empty() || body.starts_with(['+', '-']) {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    let magnitude = if let Some(hex) = lower.strip_prefix("0x") {
        from_f64(hex_float(hex)?)
    } else if lower.starts_with("nan(") && lower.ends_with(')') {
        from_f64(f64::NAN)
    } else if matches!(lower.as_str(), "inf" | "infinity" | "nan")
        || lower
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'+' | b'-'))
    {
        lower.parse().ok()?
    } else {
        return None;
    };
    Some(if negative {
        negate(magnitude)
    } else {
        magnitude
    })
}

/// A hexadecimal float's value (after `0x`): digits, an optional point, an optional `p`
/// exponent.
fn hex_float(s: &str) -> Option<f64> {
    let (digits, exp) = match s.split_once('p') {
        Some((d, e)) => (d, e.parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut value = 0f64;
    for c in int.chars().chain(frac.chars()) {
        value = value * 16.0 + f64::from(c.to_digit(16)?);
    }
    let shift = exp - 4 * frac.len() as i32;
    Some(value * 2f64.powi(shift))
}

impl Parsed for f32 {
    fn parse(s: &[u8]) -> Option<Self> {
        parse_float(s, |x| x as f32, |x| -x)
    }
}

impl Parsed for f64 {
    fn parse(s: &[u8]) -> Option<Self> {
        parse_float(s, |x| x, |x| -x)
    }
}

/// StringToNumber(string_tensor): each string as a number of `out_type`.
struct StringToNumber {
    dtype: DType,
}

fn convert<T: Parsed + crate::tensor::Element>(ctx: &OpContext<'_>, x: &Tensor) -> Result<Tensor> {
    let values = x
        .strings()?
        .iter()
        .map(|s| {
            T::parse(s).ok_or_else(|| {
                ctx.invalid(format!(
                    "StringToNumberOp could not correctly convert string: {}",
                    String::from_utf8_lossy(s)
                ))
            })
        })
        .collect::<Result<Vec<T>>>()?;
    Tensor::from_vec(x.shape().clone(), values)
}

impl OpKernel for StringToNumber {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        if x.dtype() != DType::String {
            return Err(unsupported_dtype(ctx, x.dtype(), &[DType::String]));
        }
        let out = match self.dtype {
            DType::Float => convert::<f32>(ctx, &x)?,
            DType::Double => convert::<f64>(ctx, &x)?,
            DType::Int32 => convert::<i32>(ctx, &x)?,
            DType::Int64 => convert::<i64>(ctx, &x)?,
            other => {
                let accepted = [DType::Float, DType::Double, DType::Int32, DType::Int64];
                return Err(unsupported_dtype(ctx, other, &accepted));
            }
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// DecodeRaw(bytes): each string's bytes as elements of `out_type`, in a new last dimension.
struct DecodeRaw {
    dtype: DType,
    little_endian: bool,
}

impl OpKernel for DecodeRaw {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        if x.dtype() != DType::String {
            return Err(unsupported_dtype(ctx, x.dtype(), &[DType::String]));
        }
        // Every fixed-size dtype TensorFlow decodes to (its half, bfloat16, complex64 and
        // small integers too, as bytes).
        let size = match (self.dtype, self.dtype.size()) {
            (DType::String | DType::Resource | DType::Variant, _) | (_, None) => {
                let accepted = [
                    DType::Float,
                    DType::Double,
                    DType::Int32,
                    DType::Int64,
                    DType::Bool,
                ];
                return Err(unsupported_dtype(ctx, self.dtype, &accepted));
            }
            (_, Some(size)) => size,
        };
        let strings = x.strings()?;
        let width = strings.first().map_or(0, Bytes::len);
        if let Some((i, s)) = strings.iter().enumerate().find(|(_, s)| s.len() != width) {
            return Err(ctx.invalid(format!(
                "DecodeRaw requires input strings to all be the same size, but element {i} has \
                 size {width} != {}",
                s.len()
            )));
        }
        let mut dims = x.dims().to_vec();
        if width % size != 0 {
            return Err(ctx.invalid(format!(
                "Input to DecodeRaw has length {width} that is not a multiple of {size}, the \
                 size of {}",
                self.dtype.name()
            )));
        }
        dims.push(width / size);
        ctx.check_fits((width * strings.len()) as u64)?;
        let mut raw = Vec::with_capacity(width * strings.len());
        for s in strings {
            if self.little_endian || size == 1 {
                raw.extend_from_slice(s);
            } else {
                for element in s.chunks_exact(size) {
                    raw.extend(element.iter().rev());
                }
            }
        }
        let out = if self.dtype == DType::Bool {
            let bools: Vec<bool> = raw.iter().map(|&b| b != 0).collect();
            Tensor::from_vec(dims, bools)?
        } else {
            Tensor::from_bytes(self.dtype, dims, Bytes::from(raw))?
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// DecodeCSV(records, record_defaults...): the fields of each record, one output per column.
struct DecodeCsv {
    types: Vec<DType>,
    delim: u8,
    quotes: bool,
    na_value: Vec<u8>,
    /// The columns kept (empty: all), strictly increasing.
    select: Vec<usize>,
}

impl DecodeCsv {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let types = attr::dtype_list(node, "OUT_TYPE")?;
        for &t in &types {
            if !matches!(
                t,
                DType::Float | DType::Double | DType::Int32 | DType::Int64 | DType::String
            ) {
                return Err(invalid(
                    node,
                    format!(
                        "Value for attr 'OUT_TYPE' of {} is not in the list of allowed values: \
                         float, double, int32, int64, string",
                        t.name()
                    ),
                ));
            }
        }
        let delim = attr::string_or(node, "field_delim", ",")?;
        let select = attr::int_list(node, "select_cols").unwrap_or_default();
        if !select.is_empty() && select.len() != types.len() {
            return Err(invalid(node, "select_cols should match output size"));
        }
        if select.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid(
                node,
                "select_cols should be strictly increasing indices",
            ));
        }
        if select.first().is_some_and(|&c| c < 0) {
            return Err(invalid(node, "select_cols should be non-negative indices"));
        }
        let [delim] = delim.as_bytes()[..] else {
            return Err(invalid(node, "field_delim should be only 1 char"));
        };
        Ok(Arc::new(DecodeCsv {
            types,
            delim,
            quotes: attr::bool_or(node, "use_quote_delim", true)?,
            na_value: attr::string_or(node, "na_value", "")?.into_bytes(),
            select: select.into_iter().map(|c| c as usize).collect(),
        }))
    }

    /// TensorFlow's `ExtractFields`: the selected fields of one record.
    fn fields(&self, ctx: &OpContext<'_>, input: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        if input.is_empty() {
            return Ok(out);
        }
        let (delim, n) = (self.delim, input.len());
        let all = self.select.is_empty();
        let (mut at, mut parsed, mut selected) = (0usize, 0usize, 0usize);
        while at < n {
            if input[at] == b'\n' || input[at] == b'\r' {
                at += 1;
                continue;
            }
            let include = all || self.select[selected] == parsed;
            let mut field = Vec::new();
            if self.quotes && input[at] == b'"' {
                at += 1;
                while at < n - 1 && (input[at] != b'"' || input[at + 1] != delim) {
                    if input[at] != b'"' {
                        if include {
                            field.push(input[at]);
                        }
                        at += 1;
                    } else {
                        if input[at + 1] != b'"' {
                            return Err(ctx.invalid(
                                "Quote inside a string has to be escaped by another quote",
                            ));
                        }
                        if include {
                            field.push(b'"');
                        }
                        at += 2;
                    }
                }
                if !(at < n && input[at] == b'"' && (at == n - 1 || input[at + 1] == delim)) {
                    return Err(
                        ctx.invalid("Quoted field has to end with quote followed by delim or end")
                    );
                }
                at += 2;
            } else {
                while at < n && input[at] != delim {
                    let c = input[at];
                    if (self.quotes && c == b'"') || c == b'\n' || c == b'\r' {
                        return Err(ctx.invalid("Unquoted fields cannot have quotes/CRLFs inside"));
                    }
                    if include {
                        field.push(c);
                    }
                    at += 1;
                }
                at += 1;
            }
            parsed += 1;
            if include {
                out.push(field);
                selected += 1;
                if !all && selected == self.select.len() {
                    return Ok(out);
                }
            }
        }
        let include = all || self.select[selected] == parsed;
        if include && input[n - 1] == delim {
            out.push(Vec::new());
        }
        Ok(out)
    }
}

/// One output column being filled.
enum Column {
    Float(Vec<f32>),
    Double(Vec<f64>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    String(Vec<Bytes>),
}

impl Column {
    fn new(dtype: DType, n: usize) -> Self {
        match dtype {
            DType::Float => Column::Float(Vec::with_capacity(n)),
            DType::Double => Column::Double(Vec::with_capacity(n)),
            DType::Int32 => Column::Int32(Vec::with_capacity(n)),
            DType::Int64 => Column::Int64(Vec::with_capacity(n)),
            _ => Column::String(Vec::with_capacity(n)),
        }
    }

    /// Appends the value of `field` (`None`: the column's default, element 0 of `default`);
    /// `Err(type name)` when it does not parse.
    fn push(
        &mut self,
        field: Option<Vec<u8>>,
        default: &Tensor,
    ) -> Result<std::result::Result<(), &'static str>> {
        fn one<T: Parsed + Copy + crate::tensor::Element>(
            column: &mut Vec<T>,
            field: Option<Vec<u8>>,
            default: &Tensor,
            name: &'static str,
        ) -> Result<std::result::Result<(), &'static str>> {
            match field {
                None => column.push(default.values::<T>()?[0]),
                Some(f) => match T::parse(&f) {
                    Some(v) => column.push(v),
                    None => return Ok(Err(name)),
                },
            }
            Ok(Ok(()))
        }
        match self {
            Column::Float(c) => one(c, field, default, "float"),
            Column::Double(c) => one(c, field, default, "double"),
            Column::Int32(c) => one(c, field, default, "int32"),
            Column::Int64(c) => one(c, field, default, "int64"),
            Column::String(c) => {
                c.push(match field {
                    None => default.strings()?[0].clone(),
                    Some(f) => Bytes::from(f),
                });
                Ok(Ok(()))
            }
        }
    }

    fn tensor(self, shape: crate::tensor::Shape) -> Result<Tensor> {
        match self {
            Column::Float(c) => Tensor::from_vec(shape, c),
            Column::Double(c) => Tensor::from_vec(shape, c),
            Column::Int32(c) => Tensor::from_vec(shape, c),
            Column::Int64(c) => Tensor::from_vec(shape, c),
            Column::String(c) => Tensor::from_strings(shape, c),
        }
    }
}

impl OpKernel for DecodeCsv {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let records = input(ctx, 0)?;
        if records.dtype() != DType::String {
            return Err(unsupported_dtype(ctx, records.dtype(), &[DType::String]));
        }
        let defaults: Vec<Tensor> = (0..self.types.len())
            .map(|i| input(ctx, 1 + i))
            .collect::<Result<_>>()?;
        for (i, (d, &t)) in defaults.iter().zip(&self.types).enumerate() {
            if d.rank() > 1 {
                return Err(ctx.invalid("Each record default should be at most rank 1"));
            }
            if d.num_elements() > 1 {
                return Err(ctx.invalid(format!(
                    "There should only be 1 default per field but field {i} has {}",
                    d.num_elements()
                )));
            }
            if d.dtype() != t {
                return Err(ctx.invalid(format!(
                    "record_defaults[{i}] is {}, but OUT_TYPE[{i}] is {t}",
                    d.dtype()
                )));
            }
        }
        let strings = records.strings()?;
        let bytes: usize = strings.iter().map(Bytes::len).sum();
        // Every field is at most its record; a number takes 8 bytes, a string its handle.
        let n = strings.len();
        ctx.check_fits((bytes + n * self.types.len() * std::mem::size_of::<Bytes>()) as u64)?;
        let mut columns: Vec<Column> = self.types.iter().map(|&t| Column::new(t, n)).collect();
        for (r, record) in strings.iter().enumerate() {
            let fields = self.fields(ctx, record)?;
            if fields.len() != self.types.len() {
                return Err(ctx.invalid(format!(
                    "Expect {} fields but have {} in record {r}",
                    self.types.len(),
                    fields.len()
                )));
            }
            for (f, (field, column)) in fields.into_iter().zip(&mut columns).enumerate() {
                let missing = field.is_empty() || field == self.na_value;
                if missing && defaults[f].num_elements() != 1 {
                    return Err(
                        ctx.invalid(format!("Field {f} is required but missing in record {r}!"))
                    );
                }
                let shown = String::from_utf8_lossy(&field).into_owned();
                let value = (!missing).then_some(field);
                if let Err(name) = column.push(value, &defaults[f])? {
                    return Err(ctx.invalid(format!(
                        "Field {f} in record {r} is not a valid {name}: {shown}"
                    )));
                }
            }
        }
        for (i, column) in columns.into_iter().enumerate() {
            ctx.set_output(i, column.tensor(records.shape().clone())?);
        }
        Ok(())
    }
}
