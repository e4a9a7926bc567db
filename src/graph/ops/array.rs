//! Array ops (`tensorflow/core/ops/array_ops.cc`): constants and placeholders, identities
//! (with `CheckNumerics`, the identity that fails on NaN or Inf), shape queries and reshaping, concatenation (with `ConcatOffset`, which its gradient uses)
//! and stacking, filling, broadcasting. Slicing, splitting, gathering and tiling are in
//! [`super::slicing`].

use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::const_value;
use crate::graph::grads::array as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

const INDEX: &str = "{int32, int64} = DT_INT32";

pub(super) fn register(r: &mut Registry) {
    OpDef::build("Const")
        .output("output: dtype")
        .attr("value: tensor")
        .attr("dtype: type")
        .shape(const_shape)
        .no_grad()
        .register(r);
    OpDef::build("Placeholder")
        .output("output: dtype")
        .attr("dtype: type")
        .attr("shape: shape = unknown")
        .shape(placeholder_shape)
        .no_grad()
        .register(r);
    OpDef::build("PlaceholderWithDefault")
        .input("input: dtype")
        .output("output: dtype")
        .attr("dtype: type")
        .attr("shape: shape")
        .shape(placeholder_shape)
        .grad(grad::identity)
        .register(r);
    OpDef::build("Identity")
        .input("input: T")
        .output("output: T")
        .attr("T: type")
        .shape(sf::unchanged)
        .grad(grad::identity)
        .register(r);
    OpDef::build("IdentityN")
        .input("input: T")
        .output("output: T")
        .attr("T: list(type) >= 1")
        .shape(|c| Ok(c.inputs.to_vec()))
        .grad(grad::identity_n)
        .register(r);
    for op in ["CheckNumerics", "CheckNumericsV2"] {
        OpDef::build(op)
            .input("tensor: T")
            .output("output: T")
            .attr("T: {float, double}")
            .attr("message: string")
            .stateful()
            .shape(sf::unchanged)
            .grad(grad::check_numerics)
            .register(r);
    }
    OpDef::build("NoOp").no_grad().register(r);
    OpDef::build("StopGradient")
        .input("input: T")
        .output("output: T")
        .attr("T: type")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("Where")
        .input("input: T")
        .output("index: int64")
        .attr("T: type = DT_BOOL")
        .shape(where_shape)
        .no_grad()
        .register(r);
    OpDef::build("OneHot")
        .input("indices: TI")
        .input("depth: int32")
        .input("on_value: T")
        .input("off_value: T")
        .output("output: T")
        .attr("axis: int = -1")
        .attr("T: type")
        .attr("TI: {int32, int64} = DT_INT64")
        .shape(one_hot_shape)
        .no_grad()
        .register(r);
    OpDef::build("Reshape")
        .input("tensor: T")
        .input("shape: Tshape")
        .output("output: T")
        .attr("T: type")
        .attr(leak(format!("Tshape: {INDEX}")))
        .shape(reshape_shape)
        .grad(grad::reshape)
        .register(r);
    for op in ["Shape", "Size"] {
        OpDef::build(op)
            .input("input: T")
            .output("output: out_type")
            .attr("T: type")
            .attr(leak(format!("out_type: {INDEX}")))
            .shape(if op == "Shape" {
                shape_shape
            } else {
                sf::scalar
            })
            .no_grad()
            .register(r);
    }
    OpDef::build("ShapeN")
        .input("input: N * T")
        .output("output: N * out_type")
        .attr("N: int >= 1")
        .attr("T: type")
        .attr(leak(format!("out_type: {INDEX}")))
        .shape(|c| {
            Ok(c.inputs
                .iter()
                .map(|s| PartialShape::new(vec![s.rank()]))
                .collect())
        })
        .no_grad()
        .register(r);
    OpDef::build("ConcatOffset")
        .input("concat_dim: int32")
        .input("shape: N * shape_type")
        .output("offset: N * shape_type")
        .attr("N: int >= 2")
        .attr(leak(format!("shape_type: {INDEX}")))
        .shape(|c| {
            c.with_rank(0, 0)?;
            (1..c.inputs.len()).map(|i| c.with_rank(i, 1)).collect()
        })
        .no_grad()
        .register(r);
    OpDef::build("InvertPermutation")
        .input("x: T")
        .output("y: T")
        .attr(leak(format!("T: {INDEX}")))
        .shape(|c| Ok(vec![c.with_rank(0, 1)?]))
        .no_grad()
        .register(r);
    OpDef::build("Rank")
        .input("input: T")
        .output("output: int32")
        .attr("T: type")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("ExpandDims")
        .input("input: T")
        .input("dim: Tdim")
        .output("output: T")
        .attr("T: type")
        .attr(leak(format!("Tdim: {INDEX}")))
        .shape(expand_dims_shape)
        .grad(grad::reshape)
        .register(r);
    OpDef::build("Squeeze")
        .input("input: T")
        .output("output: T")
        .attr("T: type")
        .attr("squeeze_dims: list(int) >= 0 = []")
        .shape(squeeze_shape)
        .grad(grad::reshape)
        .register(r);
    OpDef::build("Transpose")
        .input("x: T")
        .input("perm: Tperm")
        .output("y: T")
        .attr("T: type")
        .attr(leak(format!("Tperm: {INDEX}")))
        .shape(transpose_shape)
        .grad(grad::transpose)
        .register(r);
    OpDef::build("ConcatV2")
        .input("values: N * T")
        .input("axis: Tidx")
        .output("output: T")
        .attr("N: int >= 2")
        .attr("T: type")
        .attr(leak(format!("Tidx: {INDEX}")))
        .shape(concat_shape)
        .grad(grad::concat)
        .register(r);
    OpDef::build("Pack")
        .input("values: N * T")
        .output("output: T")
        .attr("N: int >= 1")
        .attr("T: type")
        .attr("axis: int = 0")
        .shape(pack_shape)
        .grad(grad::pack)
        .register(r);
    OpDef::build("Unpack")
        .input("value: T")
        .output("output: num * T")
        .attr("num: int >= 0")
        .attr("T: type")
        .attr("axis: int = 0")
        .shape(unpack_shape)
        .grad(grad::unpack)
        .register(r);
    OpDef::build("Fill")
        .input("dims: index_type")
        .input("value: T")
        .output("output: T")
        .attr("T: type")
        .attr(leak(format!("index_type: {INDEX}")))
        .shape(sf::from_shape_input)
        .no_grad()
        .register(r);
    for op in ["ZerosLike", "OnesLike"] {
        OpDef::build(op)
            .input("x: T")
            .output("y: T")
            .attr("T: type")
            .shape(sf::unchanged)
            .no_grad()
            .register(r);
    }
    OpDef::build("BroadcastTo")
        .input("input: T")
        .input("shape: Tidx")
        .output("output: T")
        .attr("T: type")
        .attr(leak(format!("Tidx: {INDEX}")))
        .shape(broadcast_to_shape)
        .grad(grad::broadcast_to)
        .register(r);
    OpDef::build("BroadcastGradientArgs")
        .input("s0: T")
        .input("s1: T")
        .output("r0: T")
        .output("r1: T")
        .attr(leak(format!("T: {INDEX}")))
        .shape(|_| Ok(vec![PartialShape::unknown_dims(1); 2]))
        .no_grad()
        .register(r);
}

/// Attr specs are `&'static str`; the few built with `format!` are leaked once at registration.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn const_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![const_value::shape_of(attr::tensor(
        ctx.node, "value",
    )?)])
}

fn placeholder_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let declared = attr::shape(ctx.node, "shape")?;
    if ctx.inputs.is_empty() {
        return Ok(vec![declared]);
    }
    Ok(vec![sf::merge(ctx, &declared, &ctx.input(0))?])
}

fn where_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![PartialShape::new(vec![None, ctx.input(0).rank()])])
}

fn one_hot_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let Some(dims) = ctx.input(0).dims().map(<[_]>::to_vec) else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let axis = attr::int_or(ctx.node, "axis", -1)?;
    let depth = ctx.scalar_value(1).and_then(|d| usize::try_from(d).ok());
    let at = if axis == -1 {
        dims.len()
    } else {
        ctx.axis(axis, dims.len() + 1)?
    };
    let mut out = dims;
    out.insert(at, depth);
    Ok(vec![PartialShape::new(out)])
}

fn reshape_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let target = ctx.shape_value(1);
    let Some(tdims) = target.dims() else {
        return Ok(vec![target]);
    };
    // A -1 in a constant shape reads as unknown here; fill it in when the element count is known.
    let value = ctx.value(1);
    let n_in = input.to_shape().map(|s| s.num_elements());
    let known = tdims
        .iter()
        .copied()
        .flatten()
        .try_fold(1usize, usize::checked_mul);
    let Some(known) = known else {
        return Err(ctx.error(format!(
            "shape {target} has more elements than fit in memory"
        )));
    };
    let unknown = tdims.iter().filter(|d| d.is_none()).count();
    if let (Some(n), Some(v)) = (n_in, value) {
        if v.iter().filter(|&&d| d == -1).count() > 1 {
            return Err(ctx.error("shape may contain at most one -1"));
        }
        if unknown == 0 && known != n {
            return Err(ctx.error(format!(
                "cannot reshape a tensor of shape {input} ({n} elements) to {target}"
            )));
        }
        if unknown == 1 {
            if known == 0 || n % known != 0 {
                return Err(ctx.error(format!(
                    "cannot reshape {n} elements of {input} into {target}"
                )));
            }
            let dims = tdims
                .iter()
                .map(|d| d.or(Some(n / known)))
                .collect::<Vec<_>>();
            return Ok(vec![PartialShape::new(dims)]);
        }
    }
    Ok(vec![target])
}

fn shape_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![PartialShape::new(vec![ctx.input(0).rank()])])
}

fn expand_dims_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (Some(dims), Some(d)) = (ctx.input(0).dims().map(<[_]>::to_vec), ctx.scalar_value(1))
    else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let at = ctx.axis(d, dims.len() + 1)?;
    let mut out = dims;
    out.insert(at, Some(1));
    Ok(vec![PartialShape::new(out)])
}

fn squeeze_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let Some(dims) = input.dims() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let axes = attr::int_list(ctx.node, "squeeze_dims")?;
    let mut drop = vec![false; dims.len()];
    if axes.is_empty() {
        for (i, d) in dims.iter().enumerate() {
            match d {
                Some(1) => drop[i] = true,
                None => return Ok(vec![PartialShape::unknown()]),
                _ => {}
            }
        }
    } else {
        for &a in &axes {
            let i = ctx.axis(a, dims.len())?;
            if let Some(d) = dims[i].filter(|&d| d != 1) {
                return Err(ctx.error(format!(
                    "cannot squeeze dimension {i} of size {d} in {input}"
                )));
            }
            drop[i] = true;
        }
    }
    Ok(vec![PartialShape::new(
        dims.iter()
            .zip(&drop)
            .filter(|(_, &x)| !x)
            .map(|(d, _)| *d)
            .collect::<Vec<_>>(),
    )])
}

fn transpose_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let Some(perm) = ctx.value(1) else {
        return Ok(vec![input
            .rank()
            .map_or_else(PartialShape::unknown, PartialShape::unknown_dims)]);
    };
    let Some(dims) = input.dims() else {
        return Ok(vec![PartialShape::unknown_dims(perm.len())]);
    };
    if perm.len() != dims.len() {
        return Err(ctx.error(format!(
            "perm has {} entries for a tensor of shape {input}",
            perm.len()
        )));
    }
    let mut seen = vec![false; dims.len()];
    let mut out = Vec::with_capacity(dims.len());
    for &p in perm {
        let i = ctx.axis(p, dims.len())?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(ctx.error(format!("perm {perm:?} repeats dimension {i}")));
        }
        out.push(dims[i]);
    }
    Ok(vec![PartialShape::new(out)])
}

fn concat_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let n = ctx.inputs.len() - 1;
    let Some(axis) = ctx.scalar_value(n) else {
        let rank = (0..n).find_map(|i| ctx.input(i).rank());
        return Ok(vec![
            rank.map_or_else(PartialShape::unknown, PartialShape::unknown_dims)
        ]);
    };
    let mut out: Option<Vec<Option<usize>>> = None;
    let mut at = 0;
    for i in 0..n {
        let s = ctx.input(i);
        let Some(dims) = s.dims() else { continue };
        match &mut out {
            None => {
                at = ctx.axis(axis, dims.len())?;
                out = Some(dims.to_vec());
            }
            Some(o) => {
                if o.len() != dims.len() {
                    return Err(ctx.error(format!(
                        "input {i} has shape {s}, rank differs from input 0"
                    )));
                }
                for (k, (a, &b)) in o.iter_mut().zip(dims).enumerate() {
                    *a = if k == at {
                        a.zip(b).and_then(|(x, y)| x.checked_add(y))
                    } else {
                        sf::merge_dim(*a, b).ok_or_else(|| {
                            ctx.error(format!(
                                "input {i} of shape {s} differs from the others in dimension {k}"
                            ))
                        })?
                    };
                }
            }
        }
    }
    // Unknown-rank inputs make the concatenated dimension unknown.
    let all_known = (0..n).all(|i| ctx.input(i).rank().is_some());
    Ok(vec![match out {
        None => PartialShape::unknown(),
        Some(mut o) => {
            if !all_known {
                o[at] = None;
            }
            PartialShape::new(o)
        }
    }])
}

fn pack_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let merged = sf::merge_all(ctx)?.remove(0);
    let Some(dims) = merged.dims() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let at = ctx.axis(attr::int_or(ctx.node, "axis", 0)?, dims.len() + 1)?;
    let mut out = dims.to_vec();
    out.insert(at, Some(ctx.inputs.len()));
    Ok(vec![PartialShape::new(out)])
}

fn unpack_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let Some(dims) = input.dims() else {
        return Ok(vec![PartialShape::unknown(); ctx.num_outputs]);
    };
    let at = ctx.axis(attr::int_or(ctx.node, "axis", 0)?, dims.len())?;
    if let Some(d) = dims[at].filter(|&d| d != ctx.num_outputs) {
        return Err(ctx.error(format!(
            "num is {} but dimension {at} of {input} is {d}",
            ctx.num_outputs
        )));
    }
    let mut out = dims.to_vec();
    out.remove(at);
    Ok(vec![PartialShape::new(out); ctx.num_outputs])
}

fn broadcast_to_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let target = ctx.shape_value(1);
    sf::broadcast(ctx, &ctx.input(0), &target)?;
    Ok(vec![target])
}

/// Array op constructors.
impl Graph {
    /// `Identity(x)`.
    pub fn identity(&mut self, x: &Output) -> Result<Output> {
        self.unary("Identity", x)
    }
    /// `CheckNumerics(x)`: `x`, or INVALID_ARGUMENT saying `message` when it holds a NaN or an
    /// infinity (`tf.debugging.check_numerics`).
    pub fn check_numerics(&mut self, x: &Output, message: &str) -> Result<Output> {
        self.add1(
            NodeSpec::new("CheckNumerics")
                .input(x)
                .attr("message", value::string(message)),
        )
    }
    /// `StopGradient(x)`: the value of `x`, through which no gradient flows.
    pub fn stop_gradient(&mut self, x: &Output) -> Result<Output> {
        self.unary("StopGradient", x)
    }
    /// `Reshape(x, shape)`.
    pub fn reshape(&mut self, x: &Output, shape: &Output) -> Result<Output> {
        self.binary("Reshape", x, shape)
    }
    /// `Reshape` to a constant shape (in `Reshape/shape`, as TensorFlow names it).
    pub fn reshape_to(&mut self, x: &Output, dims: &[i64]) -> Result<Output> {
        super::with_aux_i32(self, "Reshape", "shape", dims, false, |g, name, c| {
            g.add1(NodeSpec::new("Reshape").name(name).input(x).input(&c))
        })
    }
    /// `ExpandDims` at a constant position (in `ExpandDims/dim`).
    pub fn expand_dims(&mut self, x: &Output, dim: i64) -> Result<Output> {
        super::with_aux_i32(self, "ExpandDims", "dim", &[dim], true, |g, name, c| {
            g.add1(NodeSpec::new("ExpandDims").name(name).input(x).input(&c))
        })
    }
    /// `Squeeze` of the given dims (all size-1 dims when empty).
    pub fn squeeze(&mut self, x: &Output, dims: &[i64]) -> Result<Output> {
        self.add1(
            NodeSpec::new("Squeeze")
                .input(x)
                .attr("squeeze_dims", value::int_list(dims.to_vec())),
        )
    }
    /// `Transpose` with a constant permutation (in `transpose/perm`... named `Transpose/perm`).
    pub fn transpose(&mut self, x: &Output, perm: &[i64]) -> Result<Output> {
        super::with_aux_i32(self, "Transpose", "perm", perm, false, |g, name, c| {
            g.add1(NodeSpec::new("Transpose").name(name).input(x).input(&c))
        })
    }
    /// `ConcatV2` along a constant axis (in `concat/axis`).
    pub fn concat(&mut self, xs: &[Output], axis: i64) -> Result<Output> {
        super::with_aux_i32(self, "concat", "axis", &[axis], true, |g, name, c| {
            g.add1(
                NodeSpec::new("ConcatV2")
                    .name(name)
                    .input_list(xs)
                    .input(&c),
            )
        })
    }
    /// `Pack` (stack) along `axis`.
    pub fn pack(&mut self, xs: &[Output], axis: i64) -> Result<Output> {
        self.add1(
            NodeSpec::new("Pack")
                .input_list(xs)
                .attr("axis", value::int(axis)),
        )
    }
    /// `Unpack` (unstack) into `num` tensors along `axis`.
    pub fn unpack(&mut self, x: &Output, num: usize, axis: i64) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("Unpack")
                .input(x)
                .attr("num", value::int(num as i64))
                .attr("axis", value::int(axis)),
        )
    }
    /// `Fill(dims, value)`.
    pub fn fill(&mut self, dims: &Output, value: &Output) -> Result<Output> {
        self.binary("Fill", dims, value)
    }
    /// `ZerosLike(x)`.
    pub fn zeros_like(&mut self, x: &Output) -> Result<Output> {
        self.unary("ZerosLike", x)
    }
    /// `OnesLike(x)`.
    pub fn ones_like(&mut self, x: &Output) -> Result<Output> {
        self.unary("OnesLike", x)
    }
    /// `BroadcastTo(x, shape)`.
    pub fn broadcast_to(&mut self, x: &Output, shape: &Output) -> Result<Output> {
        self.binary("BroadcastTo", x, shape)
    }
    /// `Shape(x)` as an op (never folded).
    pub fn shape(&mut self, x: &Output) -> Result<Output> {
        self.unary("Shape", x)
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::builder::Graph;
    use crate::tensor::{DType, PartialShape};

    fn ph(g: &mut Graph, name: &str, dims: Vec<Option<usize>>) -> crate::graph::builder::Output {
        g.placeholder(name, DType::Float, PartialShape::new(dims))
            .unwrap()
    }

    #[test]
    fn reshape_fills_in_minus_one_and_rejects_bad_counts() {
        let mut g = Graph::new();
        let x = ph(&mut g, "x", vec![Some(2), Some(6)]);
        assert_eq!(
            g.reshape_to(&x, &[3, -1]).unwrap().shape.to_string(),
            "[3,4]"
        );
        let err = g.reshape_to(&x, &[5, 2]).unwrap_err();
        assert!(err.message().contains("`Reshape_1`"), "{err}");
        // Reshaping to the shape of another tensor carries its known dims.
        let y = ph(&mut g, "y", vec![None, Some(12)]);
        let s = g.shape(&y).unwrap();
        let r = g.reshape(&x, &s).unwrap();
        assert_eq!(r.shape.to_string(), "[?,12]");
    }

    #[test]
    fn concat_pack_unpack_and_transpose() {
        let mut g = Graph::new();
        let a = ph(&mut g, "a", vec![Some(2), Some(3)]);
        let b = ph(&mut g, "b", vec![Some(2), Some(5)]);
        assert_eq!(
            g.concat(&[a.clone(), b.clone()], 1)
                .unwrap()
                .shape
                .to_string(),
            "[2,8]"
        );
        assert!(g.concat(&[a.clone(), b.clone()], 0).is_err());
        assert_eq!(
            g.pack(&[a.clone(), a.clone()], 1)
                .unwrap()
                .shape
                .to_string(),
            "[2,2,3]"
        );
        let parts = g.unpack(&a, 2, 0).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1].shape.to_string(), "[3]");
        assert_eq!(g.transpose(&b, &[1, 0]).unwrap().shape.to_string(), "[5,2]");
        assert!(g.node("concat/axis").is_some());
    }

    #[test]
    fn gather_expand_squeeze() {
        let mut g = Graph::new();
        let p = ph(&mut g, "p", vec![Some(10), Some(4)]);
        let i = g
            .placeholder("i", DType::Int32, PartialShape::new(vec![Some(3), Some(2)]))
            .unwrap();
        assert_eq!(g.gather(&p, &i, 0).unwrap().shape.to_string(), "[3,2,4]");
        let e = g.expand_dims(&p, -1).unwrap();
        assert_eq!(e.shape.to_string(), "[10,4,1]");
        assert_eq!(g.squeeze(&e, &[]).unwrap().shape.to_string(), "[10,4]");
        assert!(g.squeeze(&e, &[0]).is_err());
    }
}
