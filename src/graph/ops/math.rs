//! Math ops (`tensorflow/core/ops/math_ops.cc`): element-wise arithmetic (with `DivNoNan`),
//! comparisons, logical ops, matrix products, reductions, the cumulative `Cumsum` and
//! `Cumprod`, `Cast`, `Range`, `Select`.

use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::math as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

/// TensorFlow's real number types that tessera computes on (the narrow ones through
/// `kernels::cpu::widen`).
const REAL: &str =
    "T: {float, double, int32, int64, uint8, int8, int16, uint16, uint32, half, bfloat16}";
const FLOAT: &str = "T: {float, double, half, bfloat16}";

pub(super) fn register(r: &mut Registry) {
    // Binary element-wise ops with broadcasting.
    for (op, g) in [
        ("Add", Some(grad::add as crate::graph::gradients::GradFn)),
        ("AddV2", Some(grad::add)),
        ("Sub", Some(grad::sub_grad)),
        ("Mul", Some(grad::mul_grad)),
        ("RealDiv", Some(grad::real_div)),
        ("Pow", Some(grad::pow)),
        ("Maximum", Some(grad::maximum)),
        ("Minimum", Some(grad::minimum)),
        ("SquaredDifference", Some(grad::squared_difference)),
        ("DivNoNan", Some(grad::div_no_nan)),
        ("FloorMod", None),
        ("FloorDiv", None),
    ] {
        let t = match op {
            "Add" => {
                "T: {float, double, int32, int64, uint8, int8, int16, uint16, uint32, half, \
                 bfloat16, string}"
            }
            "DivNoNan" => FLOAT,
            _ => REAL,
        };
        let b = OpDef::build(op)
            .input("x: T")
            .input("y: T")
            .output("z: T")
            .attr(t)
            .shape(sf::broadcast_binary);
        match g {
            Some(g) => b.grad(g).register(r),
            None => b.no_grad().register(r),
        }
    }
    // Unary element-wise ops.
    for (op, g) in [
        ("Neg", Some(grad::neg as crate::graph::gradients::GradFn)),
        ("Square", Some(grad::square)),
        ("Sqrt", Some(grad::sqrt)),
        ("Rsqrt", Some(grad::rsqrt)),
        ("Exp", Some(grad::exp)),
        ("Log", Some(grad::log)),
        ("Abs", Some(grad::abs)),
        ("Sign", None),
        ("Reciprocal", Some(grad::reciprocal)),
        ("Sigmoid", Some(grad::sigmoid)),
        ("Tanh", Some(grad::tanh)),
        ("Sin", Some(grad::sin)),
        ("Cos", Some(grad::cos)),
        ("Floor", None),
        ("Ceil", None),
        ("Round", None),
        ("Erf", Some(grad::erf)),
        ("Log1p", Some(grad::log1p)),
    ] {
        let t = match op {
            "Sqrt" | "Rsqrt" | "Exp" | "Log" | "Sigmoid" | "Tanh" | "Sin" | "Cos" | "Floor"
            | "Ceil" | "Round" | "Erf" | "Log1p" => FLOAT,
            _ => REAL,
        };
        let b = OpDef::build(op)
            .input("x: T")
            .output("y: T")
            .attr(t)
            .shape(sf::unchanged);
        match g {
            Some(g) => b.grad(g).register(r),
            None => b.no_grad().register(r),
        }
    }
    for op in ["SigmoidGrad", "TanhGrad"] {
        OpDef::build(op)
            .input("y: T")
            .input("dy: T")
            .output("z: T")
            .attr(FLOAT)
            .shape(sf::merge_all)
            .register(r);
    }
    // TensorFlow's `{numbertype, variant}`: the variant sum adds TensorList gradients.
    OpDef::build("AddN")
        .input("inputs: N * T")
        .output("sum: T")
        .attr("N: int >= 1")
        .attr("T: {float, double, int32, int64, variant}")
        .shape(sf::merge_all)
        .grad(grad::add_n)
        .register(r);
    for op in ["Equal", "NotEqual"] {
        OpDef::build(op)
            .input("x: T")
            .input("y: T")
            .output("z: bool")
            .attr("T: type")
            .attr("incompatible_shape_error: bool = true")
            .shape(sf::broadcast_binary)
            .no_grad()
            .register(r);
    }
    for op in ["Greater", "GreaterEqual", "Less", "LessEqual"] {
        OpDef::build(op)
            .input("x: T")
            .input("y: T")
            .output("z: bool")
            .attr(REAL)
            .shape(sf::broadcast_binary)
            .no_grad()
            .register(r);
    }
    for op in ["LogicalAnd", "LogicalOr"] {
        OpDef::build(op)
            .input("x: bool")
            .input("y: bool")
            .output("z: bool")
            .shape(sf::broadcast_binary)
            .no_grad()
            .register(r);
    }
    OpDef::build("LogicalNot")
        .input("x: bool")
        .output("y: bool")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("Select")
        .input("condition: bool")
        .input("t: T")
        .input("e: T")
        .output("output: T")
        .attr("T: type")
        .shape(select_shape)
        .grad(grad::select)
        .register(r);
    OpDef::build("SelectV2")
        .input("condition: bool")
        .input("t: T")
        .input("e: T")
        .output("output: T")
        .attr("T: type")
        .shape(select_v2_shape)
        .grad(grad::select_v2)
        .register(r);
    OpDef::build("MatMul")
        .input("a: T")
        .input("b: T")
        .output("product: T")
        .attr("transpose_a: bool = false")
        .attr("transpose_b: bool = false")
        .attr(REAL)
        .attr("grad_a: bool = false")
        .attr("grad_b: bool = false")
        .shape(matmul_shape)
        .grad(grad::matmul)
        .register(r);
    OpDef::build("BatchMatMulV2")
        .input("x: T")
        .input("y: T")
        .output("output: T")
        .attr(REAL)
        .attr("adj_x: bool = false")
        .attr("adj_y: bool = false")
        .attr("grad_x: bool = false")
        .attr("grad_y: bool = false")
        .shape(batch_matmul_shape)
        .grad(grad::batch_matmul)
        .register(r);
    for (op, g) in [
        ("Sum", grad::sum as crate::graph::gradients::GradFn),
        ("Mean", grad::mean),
        ("Max", grad::max_min),
        ("Min", grad::max_min),
        ("Prod", grad::prod),
    ] {
        OpDef::build(op)
            .input("input: T")
            .input("reduction_indices: Tidx")
            .output("output: T")
            .attr("keep_dims: bool = false")
            .attr(REAL)
            .attr("Tidx: {int32, int64} = DT_INT32")
            .shape(reduction_shape)
            .grad(g)
            .register(r);
    }
    for op in ["All", "Any"] {
        OpDef::build(op)
            .input("input: bool")
            .input("reduction_indices: Tidx")
            .output("output: bool")
            .attr("keep_dims: bool = false")
            .attr("Tidx: {int32, int64} = DT_INT32")
            .shape(reduction_shape)
            .no_grad()
            .register(r);
    }
    for op in ["ArgMax", "ArgMin"] {
        OpDef::build(op)
            .input("input: T")
            .input("dimension: Tidx")
            .output("output: output_type")
            .attr(REAL)
            .attr("Tidx: {int32, int64} = DT_INT32")
            .attr("output_type: {int32, int64} = DT_INT64")
            .shape(arg_reduce_shape)
            .no_grad()
            .register(r);
    }
    for (op, g) in [
        ("Cumsum", grad::cumsum as crate::graph::gradients::GradFn),
        ("Cumprod", grad::cumprod),
    ] {
        OpDef::build(op)
            .input("x: T")
            .input("axis: Tidx")
            .output("out: T")
            .attr("exclusive: bool = false")
            .attr("reverse: bool = false")
            .attr(REAL)
            .attr("Tidx: {int32, int64} = DT_INT32")
            .shape(scan_shape)
            .grad(g)
            .register(r);
    }
    OpDef::build("Cast")
        .input("x: SrcT")
        .output("y: DstT")
        .attr("SrcT: type")
        .attr("DstT: type")
        .attr("Truncate: bool = false")
        .shape(sf::unchanged)
        .grad(grad::cast)
        .register(r);
    OpDef::build("Range")
        .input("start: Tidx")
        .input("limit: Tidx")
        .input("delta: Tidx")
        .output("output: Tidx")
        .attr("Tidx: {float, double, int32, int64} = DT_INT32")
        .shape(range_shape)
        .no_grad()
        .register(r);
}

pub(super) fn matmul_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let a = ctx.with_rank(0, 2)?;
    let b = ctx.with_rank(1, 2)?;
    let ta = attr::bool_or(ctx.node, "transpose_a", false)?;
    let tb = attr::bool_or(ctx.node, "transpose_b", false)?;
    let (ad, bd) = (a.dims().unwrap_or_default(), b.dims().unwrap_or_default());
    let (m, ka) = if ta { (ad[1], ad[0]) } else { (ad[0], ad[1]) };
    let (kb, n) = if tb { (bd[1], bd[0]) } else { (bd[0], bd[1]) };
    sf::merge_dim(ka, kb).ok_or_else(|| {
        ctx.error(format!(
            "inner dimensions differ: a is {a}{}, b is {b}{} ({} vs {})",
            if ta { " (transposed)" } else { "" },
            if tb { " (transposed)" } else { "" },
            ka.map_or("?".into(), |d| d.to_string()),
            kb.map_or("?".into(), |d| d.to_string()),
        ))
    })?;
    Ok(vec![PartialShape::new(vec![m, n])])
}

fn batch_matmul_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (x, y) = (ctx.input(0), ctx.input(1));
    let (Some(xd), Some(yd)) = (x.dims(), y.dims()) else {
        return Ok(vec![PartialShape::unknown()]);
    };
    if xd.len() < 2 || yd.len() < 2 {
        return Err(ctx.error(format!("inputs must have rank >= 2, got {x} and {y}")));
    }
    let adj_x = attr::bool_or(ctx.node, "adj_x", false)?;
    let adj_y = attr::bool_or(ctx.node, "adj_y", false)?;
    let (xr, yr) = (xd.len(), yd.len());
    let (m, kx) = if adj_x {
        (xd[xr - 1], xd[xr - 2])
    } else {
        (xd[xr - 2], xd[xr - 1])
    };
    let (ky, n) = if adj_y {
        (yd[yr - 1], yd[yr - 2])
    } else {
        (yd[yr - 2], yd[yr - 1])
    };
    sf::merge_dim(kx, ky)
        .ok_or_else(|| ctx.error(format!("inner dimensions differ: {x} and {y}")))?;
    let batch = sf::broadcast(
        ctx,
        &PartialShape::new(xd[..xr - 2].to_vec()),
        &PartialShape::new(yd[..yr - 2].to_vec()),
    )?;
    let mut dims = batch.dims().map(<[_]>::to_vec).unwrap_or_default();
    dims.extend([m, n]);
    Ok(vec![PartialShape::new(dims)])
}

fn select_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let te = sf::merge(ctx, &ctx.input(1), &ctx.input(2))?;
    // The condition is either the same shape or a vector matching the first dimension.
    let c = ctx.input(0);
    if c.rank().is_some() && te.rank().is_some() && c.rank() == te.rank() {
        return Ok(vec![sf::merge(ctx, &c, &te)?]);
    }
    Ok(vec![te])
}

fn select_v2_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let te = sf::broadcast(ctx, &ctx.input(1), &ctx.input(2))?;
    Ok(vec![sf::broadcast(ctx, &ctx.input(0), &te)?])
}

/// The shape left after reducing `input` over the axes in input 1 (kept as 1 with `keep_dims`).
pub(crate) fn reduction_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let keep = attr::bool_or(ctx.node, "keep_dims", false)?;
    let Some(dims) = input.dims() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let Some(axes) = ctx.value(1) else {
        return Ok(vec![if keep {
            PartialShape::unknown_dims(dims.len())
        } else {
            PartialShape::unknown()
        }]);
    };
    let mut reduced = vec![false; dims.len()];
    for &a in axes {
        reduced[ctx.axis(a, dims.len())?] = true;
    }
    let out = dims
        .iter()
        .zip(&reduced)
        .filter_map(|(&d, &r)| match (r, keep) {
            (true, true) => Some(Some(1)),
            (true, false) => None,
            (false, _) => Some(d),
        })
        .collect::<Vec<_>>();
    Ok(vec![PartialShape::new(out)])
}

fn arg_reduce_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    let (Some(dims), Some(axis)) = (input.dims(), ctx.scalar_value(1)) else {
        return Ok(vec![match input.rank() {
            Some(r) if r > 0 => PartialShape::unknown_dims(r - 1),
            _ => PartialShape::unknown(),
        }]);
    };
    let axis = ctx.axis(axis, dims.len())?;
    let mut out = dims.to_vec();
    out.remove(axis);
    Ok(vec![PartialShape::new(out)])
}

/// A cumulative op's output: the input's shape. The axis must be a scalar in range.
fn scan_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    if let Some(r) = ctx.input(1).rank().filter(|&r| r != 0) {
        return Err(ctx.error(format!("axis must be a scalar, got rank {r}")));
    }
    if let (Some(rank), Some(axis)) = (input.rank(), ctx.scalar_value(1)) {
        ctx.axis(axis, rank)?;
    }
    Ok(vec![input])
}

fn range_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    if let (Some(s), Some(l), Some(d)) = (
        ctx.scalar_value(0),
        ctx.scalar_value(1),
        ctx.scalar_value(2),
    ) {
        if d == 0 {
            return Err(ctx.error("delta must not be 0"));
        }
        let n = ((l as f64 - s as f64) / d as f64).ceil().max(0.0) as usize;
        return Ok(vec![PartialShape::new(vec![Some(n)])]);
    }
    Ok(vec![PartialShape::unknown_dims(1)])
}

/// Math op constructors.
impl Graph {
    /// `x + y` (`AddV2`, broadcasting), named `add` as Python's `+` names it.
    pub fn add(&mut self, x: &Output, y: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("AddV2").name("add").input(x).input(y))
    }
    /// `x - y`, named `sub`.
    pub fn sub(&mut self, x: &Output, y: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("Sub").name("sub").input(x).input(y))
    }
    /// `x * y`, named `mul`.
    pub fn mul(&mut self, x: &Output, y: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("Mul").name("mul").input(x).input(y))
    }
    /// `x / y` (`RealDiv`), named `truediv`.
    pub fn div(&mut self, x: &Output, y: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("RealDiv").name("truediv").input(x).input(y))
    }
    /// `x / y`, or 0 where `y` is 0 (`DivNoNan`, broadcasting).
    pub fn div_no_nan(&mut self, x: &Output, y: &Output) -> Result<Output> {
        self.binary("DivNoNan", x, y)
    }
    /// The cumulative sum of `x` along `axis` (`Cumsum`): `exclusive` leaves each element out
    /// of its own sum, `reverse` sums from the end.
    pub fn cumsum(
        &mut self,
        x: &Output,
        axis: &Output,
        exclusive: bool,
        reverse: bool,
    ) -> Result<Output> {
        self.scan("Cumsum", x, axis, exclusive, reverse)
    }
    /// The cumulative product of `x` along `axis` (`Cumprod`), with [`Graph::cumsum`]'s flags.
    pub fn cumprod(
        &mut self,
        x: &Output,
        axis: &Output,
        exclusive: bool,
        reverse: bool,
    ) -> Result<Output> {
        self.scan("Cumprod", x, axis, exclusive, reverse)
    }
    fn scan(
        &mut self,
        op: &str,
        x: &Output,
        axis: &Output,
        exclusive: bool,
        reverse: bool,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new(op)
                .input(x)
                .input(axis)
                .attr("exclusive", value::bool(exclusive))
                .attr("reverse", value::bool(reverse)),
        )
    }
    /// `-x`.
    pub fn neg(&mut self, x: &Output) -> Result<Output> {
        self.unary("Neg", x)
    }
    /// The Gauss error function of `x` (`tf.math.erf`).
    pub fn erf(&mut self, x: &Output) -> Result<Output> {
        self.unary("Erf", x)
    }
    /// `log(1 + x)`, exact for small `x` (`tf.math.log1p`).
    pub fn log1p(&mut self, x: &Output) -> Result<Output> {
        self.unary("Log1p", x)
    }
    /// Sums tensors of one shape (`AddN`).
    pub fn add_n(&mut self, xs: &[Output]) -> Result<Output> {
        self.add1(NodeSpec::new("AddN").input_list(xs))
    }
    /// `a @ b` (`MatMul`).
    pub fn matmul(&mut self, a: &Output, b: &Output) -> Result<Output> {
        self.matmul_t(a, b, false, false)
    }
    /// `MatMul` with the transpose flags.
    pub fn matmul_t(&mut self, a: &Output, b: &Output, ta: bool, tb: bool) -> Result<Output> {
        self.add1(
            NodeSpec::new("MatMul")
                .input(a)
                .input(b)
                .attr("transpose_a", value::bool(ta))
                .attr("transpose_b", value::bool(tb)),
        )
    }
    /// Batched matrix product (`BatchMatMulV2`) with the adjoint flags.
    pub fn batch_matmul(
        &mut self,
        x: &Output,
        y: &Output,
        adj_x: bool,
        adj_y: bool,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("BatchMatMulV2")
                .input(x)
                .input(y)
                .attr("adj_x", value::bool(adj_x))
                .attr("adj_y", value::bool(adj_y)),
        )
    }
    /// A reduction op (`Sum`, `Mean`, `Max`, `Min`, `Prod`) over the axes tensor `axes`.
    pub fn reduce(
        &mut self,
        op: &str,
        x: &Output,
        axes: &Output,
        keep_dims: bool,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new(op)
                .input(x)
                .input(axes)
                .attr("keep_dims", value::bool(keep_dims)),
        )
    }
    /// A reduction over constant axes, with the axes in `Op/reduction_indices` as TensorFlow
    /// names them.
    pub fn reduce_axes(
        &mut self,
        op: &str,
        x: &Output,
        axes: &[i64],
        keep_dims: bool,
    ) -> Result<Output> {
        super::with_aux_i32(self, op, "reduction_indices", axes, false, |g, name, c| {
            g.add1(
                NodeSpec::new(op)
                    .name(name)
                    .input(x)
                    .input(&c)
                    .attr("keep_dims", value::bool(keep_dims)),
            )
        })
    }
    /// `Sum` over constant axes.
    pub fn sum(&mut self, x: &Output, axes: &[i64], keep_dims: bool) -> Result<Output> {
        self.reduce_axes("Sum", x, axes, keep_dims)
    }
    /// `Mean` over constant axes.
    pub fn mean(&mut self, x: &Output, axes: &[i64], keep_dims: bool) -> Result<Output> {
        self.reduce_axes("Mean", x, axes, keep_dims)
    }
    /// `ArgMax` (`ArgMin` with `op = "ArgMin"`) over `axis`, returning int64.
    pub fn arg_reduce(&mut self, op: &str, x: &Output, axis: &Output) -> Result<Output> {
        self.add1(NodeSpec::new(op).input(x).input(axis))
    }
    /// Converts `x` to `dtype`.
    pub fn cast(&mut self, x: &Output, dtype: DType) -> Result<Output> {
        self.add1(
            NodeSpec::new("Cast")
                .input(x)
                .attr("DstT", value::dtype(dtype)),
        )
    }
    /// `Select(condition, t, e)`; `v2` picks `SelectV2` (broadcasting).
    pub fn select(
        &mut self,
        condition: &Output,
        t: &Output,
        e: &Output,
        v2: bool,
    ) -> Result<Output> {
        let op = if v2 { "SelectV2" } else { "Select" };
        self.add1(NodeSpec::new(op).input(condition).input(t).input(e))
    }
    /// `Range(start, limit, delta)`.
    pub fn range(&mut self, start: &Output, limit: &Output, delta: &Output) -> Result<Output> {
        self.add1(
            NodeSpec::new("Range")
                .input(start)
                .input(limit)
                .input(delta),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::builder::Graph;
    use crate::tensor::{DType, PartialShape};

    #[test]
    fn matmul_shapes_and_inner_dimension_errors() {
        let mut g = Graph::new();
        let a = g
            .placeholder("a", DType::Float, PartialShape::new(vec![None, Some(64)]))
            .unwrap();
        let b = g
            .placeholder(
                "b",
                DType::Float,
                PartialShape::new(vec![Some(64), Some(32)]),
            )
            .unwrap();
        let c = g.matmul(&a, &b).unwrap();
        assert_eq!(c.shape.to_string(), "[?,32]");
        let t = g.matmul_t(&b, &b, true, false).unwrap();
        assert_eq!(t.shape.to_string(), "[32,32]");
        let err = g.matmul(&b, &b).unwrap_err();
        assert!(
            err.message().contains("`MatMul_2`") && err.message().contains("32 vs 64"),
            "{err}"
        );
    }

    #[test]
    fn reductions_drop_or_keep_axes() {
        let mut g = Graph::new();
        let x = g
            .placeholder(
                "x",
                DType::Float,
                PartialShape::new(vec![Some(2), None, Some(4)]),
            )
            .unwrap();
        assert_eq!(g.sum(&x, &[1], false).unwrap().shape.to_string(), "[2,4]");
        assert_eq!(
            g.sum(&x, &[-1, 0], true).unwrap().shape.to_string(),
            "[1,?,1]"
        );
        assert_eq!(
            g.mean(&x, &[0, 1, 2], false).unwrap().shape.to_string(),
            "[]"
        );
        assert!(g.sum(&x, &[3], false).is_err());
        assert!(g.node("Sum/reduction_indices").is_some());
    }

    #[test]
    fn batch_matmul_broadcasts_batch_dims() {
        let mut g = Graph::new();
        let x = g
            .placeholder(
                "x",
                DType::Float,
                PartialShape::new(vec![Some(5), Some(1), Some(2), Some(3)]),
            )
            .unwrap();
        let y = g
            .placeholder(
                "y",
                DType::Float,
                PartialShape::new(vec![Some(4), Some(3), Some(6)]),
            )
            .unwrap();
        assert_eq!(
            g.batch_matmul(&x, &y, false, false)
                .unwrap()
                .shape
                .to_string(),
            "[5,4,2,6]"
        );
    }
}
