//! The sparse ops of crossed and embedded feature columns (`core/ops/sparse_ops.cc`):
//! `SparseCross`, `SparseCrossHashed` and `SparseCrossV2` (every combination of one feature
//! per column, joined or hashed), `SparseFillEmptyRows` with its gradient op
//! `SparseFillEmptyRowsGrad`, and `SparseReshape`.
//!
//! Attrs, defaults and shape functions are TensorFlow 2.21's (the crosses' `sparse_types` and
//! `dense_types` are `list({int64, string})`, which the kernels check). No gradient flows
//! through the crosses or `SparseReshape` (TensorFlow registers none); `SparseFillEmptyRows`'s
//! is TensorFlow's `_SparseFillEmptyRowsGrad`.

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::sparse_columns as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

pub(super) fn register(r: &mut Registry) {
    OpDef::build("SparseCross")
        .input("indices: N * int64")
        .input("values: sparse_types")
        .input("shapes: N * int64")
        .input("dense_inputs: dense_types")
        .output("output_indices: int64")
        .output("output_values: out_type")
        .output("output_shape: int64")
        .attr("N: int >= 0")
        .attr("hashed_output: bool")
        .attr("num_buckets: int >= 0")
        .attr("hash_key: int")
        .attr("sparse_types: list(type) >= 0")
        .attr("dense_types: list(type) >= 0")
        .attr("out_type: {int64, string}")
        .attr("internal_type: {int64, string}")
        .shape(cross_shape)
        .no_grad()
        .register(r);
    OpDef::build("SparseCrossHashed")
        .input("indices: N * int64")
        .input("values: sparse_types")
        .input("shapes: N * int64")
        .input("dense_inputs: dense_types")
        .input("num_buckets: int64")
        .input("strong_hash: bool")
        .input("salt: int64")
        .output("output_indices: int64")
        .output("output_values: int64")
        .output("output_shape: int64")
        .attr("N: int >= 0")
        .attr("sparse_types: list(type) >= 0")
        .attr("dense_types: list(type) >= 0")
        .shape(cross_shape)
        .no_grad()
        .register(r);
    OpDef::build("SparseCrossV2")
        .input("indices: N * int64")
        .input("values: sparse_types")
        .input("shapes: N * int64")
        .input("dense_inputs: dense_types")
        .input("sep: string")
        .output("output_indices: int64")
        .output("output_values: string")
        .output("output_shape: int64")
        .attr("N: int >= 0")
        .attr("sparse_types: list(type) >= 0")
        .attr("dense_types: list(type) >= 0")
        .shape(cross_shape)
        .no_grad()
        .register(r);
    OpDef::build("SparseFillEmptyRows")
        .input("indices: int64")
        .input("values: T")
        .input("dense_shape: int64")
        .input("default_value: T")
        .output("output_indices: int64")
        .output("output_values: T")
        .output("empty_row_indicator: bool")
        .output("reverse_index_map: int64")
        .attr("T: type")
        .shape(fill_empty_rows_shape)
        .grad(grad::sparse_fill_empty_rows)
        .register(r);
    OpDef::build("SparseFillEmptyRowsGrad")
        .input("reverse_index_map: int64")
        .input("grad_values: T")
        .output("d_values: T")
        .output("d_default_value: T")
        .attr("T: type")
        .shape(fill_empty_rows_grad_shape)
        .no_grad()
        .register(r);
    OpDef::build("SparseReshape")
        .input("input_indices: int64")
        .input("input_shape: int64")
        .input("new_shape: int64")
        .output("output_indices: int64")
        .output("output_shape: int64")
        .shape(reshape_shape)
        .no_grad()
        .register(r);
}

/// A cross's outputs: `[?, 2]` indices, `[?]` values and a `[2]` shape.
fn cross_shape(_: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![
        PartialShape::new(vec![None, Some(2)]),
        PartialShape::new(vec![None]),
        PartialShape::new(vec![Some(2)]),
    ])
}

/// The dimension `d` of a shape, unknown when its rank is.
fn dim(s: &PartialShape, d: usize) -> Option<usize> {
    s.dims().and_then(|dims| dims.get(d).copied().flatten())
}

/// Merges two dimensions, or fails naming what disagrees.
fn merged(
    ctx: &ShapeCtx<'_>,
    a: Option<usize>,
    b: Option<usize>,
    what: &str,
) -> Result<Option<usize>> {
    sf::merge_dim(a, b).ok_or_else(|| {
        ctx.error(format!(
            "{what}: dimensions must be equal, but are {} and {}",
            a.unwrap_or(0),
            b.unwrap_or(0)
        ))
    })
}

/// TensorFlow's `SparseFillEmptyRows` shape function.
fn fill_empty_rows_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let indices = ctx.with_rank(0, 2)?;
    let values = ctx.with_rank(1, 1)?;
    let dense_shape = ctx.with_rank(2, 1)?;
    ctx.with_rank(3, 0)?;
    let n = merged(ctx, dim(&indices, 0), dim(&values, 0), "indices and values")?;
    let rank = merged(
        ctx,
        dim(&indices, 1),
        dim(&dense_shape, 0),
        "indices and dense_shape",
    )?;
    if rank == Some(0) {
        return Err(ctx.error("dense_shape must not be empty"));
    }
    let rows = dim(&ctx.shape_value(2), 0);
    Ok(vec![
        PartialShape::new(vec![None, rank]),
        PartialShape::new(vec![None]),
        PartialShape::new(vec![rows]),
        PartialShape::new(vec![n]),
    ])
}

/// `d_values` is as long as the reverse index map; `d_default_value` is a scalar.
fn fill_empty_rows_grad_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let map = ctx.with_rank(0, 1)?;
    ctx.with_rank(1, 1)?;
    Ok(vec![
        PartialShape::new(vec![dim(&map, 0)]),
        PartialShape::new(vec![]),
    ])
}

/// `SparseReshape`: `[nnz, len(new_shape)]` indices and a `[len(new_shape)]` shape.
fn reshape_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let indices = ctx.with_rank(0, 2)?;
    ctx.with_rank(1, 1)?;
    let new_shape = ctx.with_rank(2, 1)?;
    let rank = dim(&new_shape, 0);
    Ok(vec![
        PartialShape::new(vec![dim(&indices, 0), rank]),
        PartialShape::new(vec![rank]),
    ])
}

/// A sparse tensor as the three outputs of the ops that make one.
#[derive(Clone, Debug)]
pub struct SparseOutputs {
    /// `[n, rank]` int64 indices.
    pub indices: Output,
    /// `[n]` values.
    pub values: Output,
    /// `[rank]` int64 dense shape.
    pub dense_shape: Output,
}

impl SparseOutputs {
    fn of(mut outs: Vec<Output>) -> Self {
        let dense_shape = outs.remove(2);
        let values = outs.remove(1);
        let indices = outs.remove(0);
        SparseOutputs {
            indices,
            values,
            dense_shape,
        }
    }
}

/// A sparse column given to a cross: indices, values and dense shape.
pub type SparseColumn<'a> = (&'a Output, &'a Output, &'a Output);

fn cross_spec(op: &str, sparse: &[SparseColumn<'_>], dense: &[Output]) -> NodeSpec {
    let indices: Vec<Output> = sparse.iter().map(|c| c.0.clone()).collect();
    let values: Vec<Output> = sparse.iter().map(|c| c.1.clone()).collect();
    let shapes: Vec<Output> = sparse.iter().map(|c| c.2.clone()).collect();
    let types = |xs: &[Output]| xs.iter().map(|x| x.dtype).collect::<Vec<DType>>();
    NodeSpec::new(op)
        .input_list(&indices)
        .input_list(&values)
        .input_list(&shapes)
        .input_list(dense)
        .attr("N", value::int(sparse.len() as i64))
        .attr("sparse_types", value::dtype_list(&types(&values)))
        .attr("dense_types", value::dtype_list(&types(dense)))
}

/// Constructors for the sparse feature-column ops.
impl Graph {
    /// `SparseCross`: with `hashed_output`, the crosses' chained fingerprints from `hash_key`
    /// modulo `num_buckets` (int64); else their features joined by `_X_` (string).
    pub fn sparse_cross(
        &mut self,
        sparse: &[SparseColumn<'_>],
        dense: &[Output],
        hashed_output: bool,
        num_buckets: i64,
        hash_key: i64,
    ) -> Result<SparseOutputs> {
        let out = if hashed_output {
            DType::Int64
        } else {
            DType::String
        };
        let spec = cross_spec("SparseCross", sparse, dense)
            .attr("hashed_output", value::bool(hashed_output))
            .attr("num_buckets", value::int(num_buckets))
            .attr("hash_key", value::int(hash_key))
            .attr("out_type", value::dtype(out))
            .attr("internal_type", value::dtype(out));
        Ok(SparseOutputs::of(self.add_node(spec)?))
    }

    /// `SparseCrossHashed(..., num_buckets, strong_hash, salt)`.
    pub fn sparse_cross_hashed(
        &mut self,
        sparse: &[SparseColumn<'_>],
        dense: &[Output],
        num_buckets: &Output,
        strong_hash: &Output,
        salt: &Output,
    ) -> Result<SparseOutputs> {
        let spec = cross_spec("SparseCrossHashed", sparse, dense)
            .input(num_buckets)
            .input(strong_hash)
            .input(salt);
        Ok(SparseOutputs::of(self.add_node(spec)?))
    }

    /// `SparseCrossV2(..., sep)`: the crosses' features joined by `sep`.
    pub fn sparse_cross_v2(
        &mut self,
        sparse: &[SparseColumn<'_>],
        dense: &[Output],
        sep: &Output,
    ) -> Result<SparseOutputs> {
        let spec = cross_spec("SparseCrossV2", sparse, dense).input(sep);
        Ok(SparseOutputs::of(self.add_node(spec)?))
    }

    /// `SparseFillEmptyRows(indices, values, dense_shape, default_value)`: its four outputs
    /// (indices, values, empty-row indicator, reverse index map).
    pub fn sparse_fill_empty_rows(
        &mut self,
        indices: &Output,
        values: &Output,
        dense_shape: &Output,
        default_value: &Output,
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("SparseFillEmptyRows")
                .input(indices)
                .input(values)
                .input(dense_shape)
                .input(default_value),
        )
    }

    /// `SparseFillEmptyRowsGrad(reverse_index_map, grad_values)`: (d_values, d_default_value).
    pub fn sparse_fill_empty_rows_grad(
        &mut self,
        reverse_index_map: &Output,
        grad_values: &Output,
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("SparseFillEmptyRowsGrad")
                .input(reverse_index_map)
                .input(grad_values),
        )
    }

    /// `SparseReshape(input_indices, input_shape, new_shape)`: (indices, shape).
    pub fn sparse_reshape(
        &mut self,
        indices: &Output,
        shape: &Output,
        new_shape: &Output,
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("SparseReshape")
                .input(indices)
                .input(shape)
                .input(new_shape),
        )
    }
}
