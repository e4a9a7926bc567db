//! The parsing ops of input pipelines (`core/ops/parsing_ops.cc`): `ParseExampleV2` and
//! `ParseSingleExample` (`tf.io.parse_example` / `parse_single_example` over serialized
//! `tf.train.Example`s), `DecodeRaw`, `DecodeCSV` and `StringToNumber`.
//!
//! Attrs, defaults and shape functions are TensorFlow 2.21's, with one difference: the type
//! sets of list attrs (`Tdense: list({float,int64,string})`) are declared `list(type)`, as the
//! registry's spec parser reads them, and the kernels refuse other dtypes naming the node.
//! None has a gradient.

use crate::error::Result;
use crate::graph::attr;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::proto::attr_value::Value;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("ParseExampleV2")
        .input("serialized: string")
        .input("names: string")
        .input("sparse_keys: string")
        .input("dense_keys: string")
        .input("ragged_keys: string")
        .input("dense_defaults: Tdense")
        .output("sparse_indices: num_sparse * int64")
        .output("sparse_values: sparse_types")
        .output("sparse_shapes: num_sparse * int64")
        .output("dense_values: Tdense")
        .output("ragged_values: ragged_value_types")
        .output("ragged_row_splits: ragged_split_types")
        .attr("Tdense: list(type) >= 0")
        .attr("num_sparse: int >= 0")
        .attr("sparse_types: list(type) >= 0")
        .attr("ragged_value_types: list(type) >= 0")
        .attr("ragged_split_types: list(type) >= 0")
        .attr("dense_shapes: list(shape) >= 0")
        .shape(parse_example_shape)
        .no_grad()
        .register(r);
    OpDef::build("ParseSingleExample")
        .input("serialized: string")
        .input("dense_defaults: Tdense")
        .output("sparse_indices: num_sparse * int64")
        .output("sparse_values: sparse_types")
        .output("sparse_shapes: num_sparse * int64")
        .output("dense_values: Tdense")
        .attr("num_sparse: int >= 0")
        .attr("sparse_keys: list(string) >= 0")
        .attr("dense_keys: list(string) >= 0")
        .attr("sparse_types: list(type) >= 0")
        .attr("Tdense: list(type) >= 0")
        .attr("dense_shapes: list(shape) >= 0")
        .shape(parse_example_shape)
        .no_grad()
        .register(r);
    OpDef::build("DecodeRaw")
        .input("bytes: string")
        .output("output: out_type")
        .attr(concat!(
            "out_type: {half, float, double, int32, uint16, uint8, int16, int8, int64, ",
            "complex64, bool, bfloat16}"
        ))
        .attr("little_endian: bool = true")
        .shape(decode_raw_shape)
        .no_grad()
        .register(r);
    OpDef::build("DecodeCSV")
        .input("records: string")
        .input("record_defaults: OUT_TYPE")
        .output("output: OUT_TYPE")
        .attr("OUT_TYPE: list(type) >= 1")
        .attr("field_delim: string = ','")
        .attr("use_quote_delim: bool = true")
        .attr("na_value: string = ''")
        .attr("select_cols: list(int) = []")
        .shape(decode_csv_shape)
        .no_grad()
        .register(r);
    OpDef::build("StringToNumber")
        .input("string_tensor: string")
        .output("output: out_type")
        .attr("out_type: {float, double, int32, int64} = DT_FLOAT")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
}

/// The dense shapes attr, each as a partial shape (`-1` unknown).
fn dense_shapes(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    match attr::get(ctx.node, "dense_shapes") {
        Some(Value::List(l)) => l.shape.iter().map(PartialShape::from_proto).collect(),
        _ => Ok(Vec::new()),
    }
}

/// Sparse indices `[?, rank + 1]`, values `[?]`, shapes `[rank + 1]`; dense values the
/// serialized shape followed by their dense shape; ragged values and splits vectors.
/// `ParseSingleExample` reads one example (rank 0).
fn parse_example_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let single_op = ctx.node.op == "ParseSingleExample";
    let serialized = ctx.input(0);
    let lead: Option<Vec<Option<usize>>> = if single_op {
        Some(Vec::new())
    } else {
        match serialized.dims() {
            Some(d) if d.len() > 1 => {
                return Err(ctx.error(format!(
                    "Expected serialized to be a scalar or vector, got shape: {serialized}"
                )))
            }
            d => d.map(<[_]>::to_vec),
        }
    };
    let sparse = attr::int(ctx.node, "num_sparse").unwrap_or(0).max(0) as usize;
    let ragged = if single_op {
        0
    } else {
        attr::dtype_list(ctx.node, "ragged_value_types").map_or(0, |t| t.len())
    };
    let depth = lead.as_ref().map(|l| l.len() + 1);
    let mut out = Vec::with_capacity(ctx.num_outputs);
    out.extend(std::iter::repeat_n(
        PartialShape::new(vec![None, depth]),
        sparse,
    ));
    out.extend(std::iter::repeat_n(PartialShape::new(vec![None]), sparse));
    out.extend(std::iter::repeat_n(PartialShape::new(vec![depth]), sparse));
    for shape in dense_shapes(ctx)? {
        out.push(match (&lead, shape.dims()) {
            (Some(lead), Some(dims)) => {
                PartialShape::new(lead.iter().chain(dims).copied().collect::<Vec<_>>())
            }
            _ => PartialShape::unknown(),
        });
    }
    out.extend(std::iter::repeat_n(
        PartialShape::new(vec![None]),
        2 * ragged,
    ));
    Ok(out)
}

/// The input's shape with one more dimension, of unknown size.
fn decode_raw_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![match ctx.input(0).dims() {
        Some(d) => PartialShape::new(d.iter().copied().chain([None]).collect::<Vec<_>>()),
        None => PartialShape::unknown(),
    }])
}

/// Every column has the records' shape; each default is a scalar or a vector of at most one.
fn decode_csv_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    for i in 1..ctx.inputs.len() {
        let d = ctx.input(i);
        match d.dims() {
            Some(dims) if dims.len() > 1 => {
                return Err(ctx.error(format!(
                    "Shape must be at most rank 1 but is rank {} for record_defaults[{}]",
                    dims.len(),
                    i - 1
                )))
            }
            Some([Some(n)]) if *n > 1 => {
                return Err(ctx.error(format!(
                    "Shape of a default must be a length-0 or length-1 vector, or a scalar; \
                     record_defaults[{}] has shape {d}",
                    i - 1
                )))
            }
            _ => {}
        }
    }
    Ok(vec![ctx.input(0); ctx.inputs.len().saturating_sub(1)])
}
