//! `GatherNd` and `ScatterNd` (`core/ops/array_ops.cc`): slices of a tensor picked by
//! n-dimensional indices, and their sum into a fresh zero tensor of a given shape. Each is the
//! other's gradient (`_GatherNdGrad` and `_ScatterNdGrad` in `array_grad.py`).
//!
//! Attrs, defaults and shape functions are TensorFlow 2.21's (`GatherNdShape`,
//! `ScatterNdShape`); tessera has no int16, so `Tindices` is int32 or int64.

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::gather_nd as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{merge_dim, ShapeCtx};
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("GatherNd")
        .input("params: Tparams")
        .input("indices: Tindices")
        .output("output: Tparams")
        .attr("Tparams: type")
        .attr("Tindices: {int32, int64}")
        .attr("bad_indices_policy: string = ''")
        .shape(gather_nd_shape)
        .grad(grad::gather_nd)
        .register(r);
    OpDef::build("ScatterNd")
        .input("indices: Tindices")
        .input("updates: T")
        .input("shape: Tindices")
        .output("output: T")
        .attr("T: type")
        .attr("Tindices: {int32, int64}")
        .attr("bad_indices_policy: string = ''")
        .shape(scatter_nd_shape)
        .grad(grad::scatter_nd)
        .register(r);
}

/// `indices.shape[:-1] + params.shape[indices.shape[-1]:]`.
fn gather_nd_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (params, indices) = (ctx.input(0), ctx.input(1));
    let Some(i) = indices.dims() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let Some((&r, outer)) = i.split_last() else {
        return Err(ctx.error("Shape must be at least rank 1 but is rank 0 for indices"));
    };
    let (Some(p), Some(r)) = (params.dims(), r) else {
        return Ok(vec![PartialShape::unknown()]);
    };
    if r > p.len() {
        return Err(ctx.error(format!(
            "indices.shape[-1] must be <= params.rank, but saw indices shape: {indices} and \
             params shape: {params}"
        )));
    }
    let mut out = outer.to_vec();
    out.extend_from_slice(&p[r..]);
    Ok(vec![PartialShape::new(out)])
}

/// The element count of a shape, when known.
fn known_elements(s: &PartialShape) -> Option<usize> {
    s.dims()?.iter().copied().product::<Option<usize>>()
}

/// Whether two runs of dims can describe the same dims, and both as shapes for a message.
fn dims_merge(a: &[Option<usize>], b: &[Option<usize>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| merge_dim(x, y).is_some())
}

/// The output is `shape` read as a shape; the indices' outer dims must match the updates'
/// and the output's inner dims the updates' rest, as TensorFlow's `ScatterNdShapeHelper`
/// checks.
fn scatter_nd_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (indices, updates) = (ctx.input(0), ctx.input(1));
    if indices.rank() == Some(0) {
        return Err(ctx.error("Shape must be at least rank 1 but is rank 0 for indices"));
    }
    let out = ctx.shape_value(2);
    let some = |s: &PartialShape| known_elements(s).is_some_and(|n| n > 0);
    if known_elements(&out) == Some(0) && (some(&indices) || some(&updates)) {
        return Err(ctx.error("Indices and updates specified for empty input"));
    }
    let (Some(i), Some(u)) = (indices.dims(), updates.dims()) else {
        return Ok(vec![out]);
    };
    let outer = i.len() - 1;
    let Some(ix) = i[outer].filter(|_| !u.is_empty()) else {
        return Ok(vec![out]);
    };
    let (prefix_i, prefix_u) = (&i[..outer], &u[..outer.min(u.len())]);
    if !dims_merge(prefix_i, prefix_u) {
        return Err(ctx.error(format!(
            "Dimensions [0,{outer}) of indices[shape={indices}] = {} must match dimensions \
             [0,{outer}) of updates[shape={updates}] = {}",
            PartialShape::new(prefix_i.to_vec()),
            PartialShape::new(prefix_u.to_vec())
        )));
    }
    if let Some(o) = out.dims() {
        let suffix_o = &o[ix.min(o.len())..];
        let suffix_u = &u[outer.min(u.len())..];
        if ix > o.len() || !dims_merge(suffix_o, suffix_u) {
            return Err(ctx.error(format!(
                "Dimensions [{ix},{}) of input[shape={out}] = {} must match dimensions \
                 [{outer},{}) of updates[shape={updates}] = {}",
                o.len(),
                PartialShape::new(suffix_o.to_vec()),
                u.len(),
                PartialShape::new(suffix_u.to_vec())
            )));
        }
    }
    Ok(vec![out])
}

/// Constructors for the n-dimensional gather and scatter.
impl Graph {
    /// `GatherNd(params, indices)`: `out[i] = params[indices[i]]`, each row of `indices`
    /// (its last dimension) indexing the leading dimensions of `params`.
    pub fn gather_nd(&mut self, params: &Output, indices: &Output) -> Result<Output> {
        self.binary("GatherNd", params, indices)
    }

    /// `ScatterNd(indices, updates, shape)`: zeros of `shape` with each slice of `updates`
    /// added at its row of `indices` (repeated indices add up).
    pub fn scatter_nd(
        &mut self,
        indices: &Output,
        updates: &Output,
        shape: &Output,
    ) -> Result<Output> {
        self.scatter_nd_with_policy(indices, updates, shape, "")
    }

    /// [`Graph::scatter_nd`] with TensorFlow's `bad_indices_policy` (`""`, `DEFAULT`, `ERROR`
    /// or `IGNORE`).
    pub fn scatter_nd_with_policy(
        &mut self,
        indices: &Output,
        updates: &Output,
        shape: &Output,
        bad_indices_policy: &str,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("ScatterNd")
                .input(indices)
                .input(updates)
                .input(shape)
                .attr("bad_indices_policy", value::string(bad_indices_policy)),
        )
    }
}
