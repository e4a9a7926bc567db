//! Slicing, splitting, gathering and tiling ops (`tensorflow/core/ops/array_ops.cc`): `Slice`,
//! `StridedSlice`, `Split`, `SplitV`, `GatherV2`, `Tile`.

use crate::error::Result;
use crate::graph::attr;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::array as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("Slice")
        .input("input: T")
        .input("begin: Index")
        .input("size: Index")
        .output("output: T")
        .attr("T: type")
        .attr("Index: {int32, int64}")
        .shape(slice_shape)
        .grad(grad::slice)
        .register(r);
    OpDef::build("StridedSlice")
        .input("input: T")
        .input("begin: Index")
        .input("end: Index")
        .input("strides: Index")
        .output("output: T")
        .attr("T: type")
        .attr("Index: {int32, int64}")
        .attr("begin_mask: int = 0")
        .attr("end_mask: int = 0")
        .attr("ellipsis_mask: int = 0")
        .attr("new_axis_mask: int = 0")
        .attr("shrink_axis_mask: int = 0")
        .shape(strided_slice_shape)
        .grad(grad::strided_slice)
        .register(r);
    OpDef::build("StridedSliceGrad")
        .input("shape: Index")
        .input("begin: Index")
        .input("end: Index")
        .input("strides: Index")
        .input("dy: T")
        .output("output: T")
        .attr("T: type")
        .attr("Index: {int32, int64}")
        .attr("begin_mask: int = 0")
        .attr("end_mask: int = 0")
        .attr("ellipsis_mask: int = 0")
        .attr("new_axis_mask: int = 0")
        .attr("shrink_axis_mask: int = 0")
        .shape(crate::graph::shape_fn::from_shape_input)
        .no_grad()
        .register(r);
    OpDef::build("Split")
        .input("split_dim: int32")
        .input("value: T")
        .output("output: num_split * T")
        .attr("num_split: int >= 1")
        .attr("T: type")
        .shape(split_shape)
        .grad(grad::split)
        .register(r);
    OpDef::build("SplitV")
        .input("value: T")
        .input("size_splits: Tlen")
        .input("split_dim: int32")
        .output("output: num_split * T")
        .attr("num_split: int >= 1")
        .attr("T: type")
        .attr("Tlen: {int8, int32, int64} = DT_INT64")
        .shape(split_v_shape)
        .grad(grad::split_v)
        .register(r);
    OpDef::build("GatherV2")
        .input("params: Tparams")
        .input("indices: Tindices")
        .input("axis: Taxis")
        .output("output: Tparams")
        .attr("batch_dims: int = 0")
        .attr("Tparams: type")
        .attr("Tindices: {int32, int64}")
        .attr("Taxis: {int32, int64}")
        .shape(gather_shape)
        .grad(crate::graph::grads::sparse::gather_v2)
        .register(r);
    OpDef::build("Tile")
        .input("input: T")
        .input("multiples: Tmultiples")
        .output("output: T")
        .attr("T: type")
        .attr("Tmultiples: {int32, int64} = DT_INT32")
        .shape(tile_shape)
        .grad(grad::tile)
        .register(r);
}

/// Each piece of a Split: the input with `num_split` times fewer entries along `split_dim`.
fn split_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(1);
    let n = ctx.num_outputs;
    let (Some(dims), Some(axis)) = (input.dims(), ctx.scalar_value(0)) else {
        let piece = input
            .rank()
            .map_or_else(PartialShape::unknown, PartialShape::unknown_dims);
        return Ok(vec![piece; n]);
    };
    let axis = ctx.axis(axis, dims.len())?;
    let mut out = dims.to_vec();
    if let Some(d) = dims[axis] {
        if d % n != 0 {
            return Err(ctx.error(format!(
                "Number of ways to split should evenly divide the split dimension, but got \
                 split_dim {axis} (size = {d}) and num_split {n}"
            )));
        }
        out[axis] = Some(d / n);
    }
    Ok(vec![PartialShape::new(out); n])
}

/// The pieces of a SplitV: the input with `size_splits[i]` entries along `split_dim`.
fn split_v_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let n = ctx.num_outputs;
    let (Some(dims), Some(axis)) = (input.dims(), ctx.scalar_value(2)) else {
        let piece = input
            .rank()
            .map_or_else(PartialShape::unknown, PartialShape::unknown_dims);
        return Ok(vec![piece; n]);
    };
    let axis = ctx.axis(axis, dims.len())?;
    let sizes = ctx.value(1).map(<[i64]>::to_vec);
    let known: i64 = sizes.iter().flatten().filter(|&&s| s != -1).sum();
    Ok((0..n)
        .map(|i| {
            let mut out = dims.to_vec();
            out[axis] = match sizes.as_ref().and_then(|s| s.get(i)) {
                Some(&-1) => dims[axis].and_then(|d| usize::try_from(d as i64 - known).ok()),
                Some(&s) => usize::try_from(s).ok(),
                None => None,
            };
            PartialShape::new(out)
        })
        .collect())
}

fn slice_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let (Some(begin), Some(size)) = (ctx.value(1), ctx.value(2)) else {
        return Ok(vec![ctx
            .shape_value(2)
            .dims()
            .map_or_else(PartialShape::unknown, |d| {
                PartialShape::unknown_dims(d.len())
            })]);
    };
    if begin.len() != size.len() || input.rank().is_some_and(|r| r != begin.len()) {
        return Err(ctx.error(format!(
            "begin {begin:?} and size {size:?} must both have one entry per dimension of {input}"
        )));
    }
    let dims = input
        .dims()
        .map(<[_]>::to_vec)
        .unwrap_or_else(|| vec![None; begin.len()]);
    let mut out = Vec::with_capacity(dims.len());
    for (i, ((&b, &s), d)) in begin.iter().zip(size).zip(dims).enumerate() {
        let o = if s == -1 {
            d.and_then(|d| usize::try_from(d as i64 - b).ok())
        } else {
            usize::try_from(s).ok()
        };
        if let (Some(d), Some(o)) = (d, o) {
            if b < 0 || b as usize + o > d {
                return Err(ctx.error(format!(
                    "slice [{b}, {b}+{o}) is out of bounds for dimension {i} of {input}"
                )));
            }
        }
        out.push(o);
    }
    Ok(vec![PartialShape::new(out)])
}

fn strided_slice_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let mask = |n: &str| attr::int_or(ctx.node, n, 0);
    let (bm, em, ellipsis, new_axis, shrink) = (
        mask("begin_mask")?,
        mask("end_mask")?,
        mask("ellipsis_mask")?,
        mask("new_axis_mask")?,
        mask("shrink_axis_mask")?,
    );
    let (Some(dims), Some(b), Some(e), Some(s)) =
        (input.dims(), ctx.value(1), ctx.value(2), ctx.value(3))
    else {
        return Ok(vec![PartialShape::unknown()]);
    };
    if b.len() != e.len() || b.len() != s.len() {
        return Err(ctx.error(format!(
            "begin {b:?}, end {e:?} and strides {s:?} must have the same length"
        )));
    }
    if ellipsis != 0 || new_axis != 0 {
        // The general form is resolved at run time; only the plain form is inferred here.
        return Ok(vec![PartialShape::unknown()]);
    }
    let mut out = Vec::new();
    for (i, &d) in dims.iter().enumerate() {
        if i >= b.len() {
            out.push(d);
            continue;
        }
        let stride = s[i];
        if stride == 0 {
            return Err(ctx.error("strides must be non-zero"));
        }
        if shrink & (1 << i) != 0 {
            continue;
        }
        let Some(d) = d.map(|d| d as i64) else {
            out.push(None);
            continue;
        };
        let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v + d } else { v };
        let (lo, hi) = if stride > 0 { (0, d) } else { (-1, d - 1) };
        let start = if bm & (1 << i) != 0 {
            if stride > 0 {
                0
            } else {
                d - 1
            }
        } else {
            clamp(norm(b[i]), lo, hi)
        };
        let end = if em & (1 << i) != 0 {
            if stride > 0 {
                d
            } else {
                -1
            }
        } else {
            clamp(norm(e[i]), lo, hi)
        };
        let n = if stride > 0 {
            (end - start + stride - 1) / stride
        } else {
            (start - end + (-stride) - 1) / -stride
        };
        out.push(Some(n.max(0) as usize));
    }
    Ok(vec![PartialShape::new(out)])
}

fn gather_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (params, indices) = (ctx.input(0), ctx.input(1));
    let (Some(p), Some(i), Some(axis)) = (params.dims(), indices.dims(), ctx.scalar_value(2))
    else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let axis = ctx.axis(axis, p.len())?;
    let b = attr::int_or(ctx.node, "batch_dims", 0)?;
    let b = if b < 0 { b + i.len() as i64 } else { b };
    if b < 0 || b as usize > i.len() || b as usize > axis {
        return Err(ctx.error(format!(
            "batch_dims {} must be in [-{rank}, {rank}] (the indices' rank) and at most the \
             axis {axis}",
            attr::int_or(ctx.node, "batch_dims", 0)?,
            rank = i.len()
        )));
    }
    let mut out = p[..axis].to_vec();
    out.extend_from_slice(&i[b as usize..]);
    out.extend_from_slice(&p[axis + 1..]);
    Ok(vec![PartialShape::new(out)])
}

fn tile_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let Some(dims) = input.dims() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let Some(m) = ctx.value(1) else {
        return Ok(vec![PartialShape::unknown_dims(dims.len())]);
    };
    if m.len() != dims.len() {
        return Err(ctx.error(format!(
            "multiples has {} entries for input of shape {input}",
            m.len()
        )));
    }
    Ok(vec![PartialShape::new(
        dims.iter()
            .zip(m)
            .map(|(d, &k)| d.and_then(|d| d.checked_mul(k.max(0) as usize)))
            .collect::<Vec<_>>(),
    )])
}

/// Slicing constructors.
impl Graph {
    /// `Slice(x, begin, size)`.
    pub fn slice(&mut self, x: &Output, begin: &Output, size: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("Slice").input(x).input(begin).input(size))
    }
    /// `GatherV2(params, indices, axis)` with a constant axis (in `GatherV2/axis`).
    pub fn gather(&mut self, params: &Output, indices: &Output, axis: i64) -> Result<Output> {
        super::with_aux_i32(self, "GatherV2", "axis", &[axis], true, |g, name, c| {
            g.add1(
                NodeSpec::new("GatherV2")
                    .name(name)
                    .input(params)
                    .input(indices)
                    .input(&c),
            )
        })
    }
    /// `GatherV2(params, indices, axis)` with `batch_dims` leading dimensions shared by
    /// `params` and `indices`.
    pub fn gather_batch(
        &mut self,
        params: &Output,
        indices: &Output,
        axis: i64,
        batch_dims: i64,
    ) -> Result<Output> {
        super::with_aux_i32(self, "GatherV2", "axis", &[axis], true, |g, name, c| {
            g.add1(
                NodeSpec::new("GatherV2")
                    .name(name)
                    .input(params)
                    .input(indices)
                    .input(&c)
                    .attr("batch_dims", crate::graph::attr::value::int(batch_dims)),
            )
        })
    }
    /// `Tile(x, multiples)`.
    pub fn tile(&mut self, x: &Output, multiples: &Output) -> Result<Output> {
        self.binary("Tile", x, multiples)
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::attr::value;
    use crate::graph::builder::{Graph, NodeSpec};
    use crate::tensor::{DType, PartialShape};

    #[test]
    fn slice_and_strided_slice_shapes() {
        let mut g = Graph::new();
        let x = g
            .placeholder("x", DType::Float, PartialShape::new(vec![Some(3), Some(4)]))
            .unwrap();
        let (b, s) = (
            g.const_vec_i32("b", &[1, 1]).unwrap(),
            g.const_vec_i32("s", &[2, -1]).unwrap(),
        );
        assert_eq!(g.slice(&x, &b, &s).unwrap().shape.to_string(), "[2,3]");
        let s_bad = g.const_vec_i32("s", &[3, 1]).unwrap();
        assert!(g
            .slice(&x, &b, &s_bad)
            .unwrap_err()
            .message()
            .contains("out of bounds"));
        // x[1:, ::2] and x[1, :] (shrinking axis 0).
        let (b, e, st) = (
            g.const_vec_i32("b", &[1, 0]).unwrap(),
            g.const_vec_i32("e", &[3, 4]).unwrap(),
            g.const_vec_i32("st", &[1, 2]).unwrap(),
        );
        let ss = |g: &mut Graph, shrink: i64| {
            g.add1(
                NodeSpec::new("StridedSlice")
                    .input(&x)
                    .input(&b)
                    .input(&e)
                    .input(&st)
                    .attr("shrink_axis_mask", value::int(shrink)),
            )
            .unwrap()
        };
        assert_eq!(ss(&mut g, 0).shape.to_string(), "[2,2]");
        assert_eq!(ss(&mut g, 1).shape.to_string(), "[2]");
    }

    #[test]
    fn tile_multiplies_dims() {
        let mut g = Graph::new();
        let x = g
            .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))
            .unwrap();
        let m = g.const_vec_i32("m", &[2, 2]).unwrap();
        assert_eq!(g.tile(&x, &m).unwrap().shape.to_string(), "[?,6]");
    }
}
