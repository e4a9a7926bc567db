//! Gradients of math ops (TensorFlow's `math_grad.py`).

use super::{const_ints, div, mul, named, sub, sum_to_shape};
use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::gradients::{unbroadcast, GradCtx};
use crate::tensor::DType;

type Grads = Result<Vec<Option<Output>>>;

fn both(g: &mut Graph, c: &GradCtx, gx: Output, gy: Output) -> Grads {
    let (gx, gy) = unbroadcast(g, c.input(0)?, c.input(1)?, gx, gy)?;
    Ok(vec![Some(gx), Some(gy)])
}

/// `Add` / `AddV2`: the gradient, summed back over broadcast dimensions.
pub fn add(g: &mut Graph, c: &GradCtx) -> Grads {
    let gr = c.grad(0)?.clone();
    both(g, c, gr.clone(), gr)
}

/// `Sub`: `grad` and `-grad`.
pub fn sub_grad(g: &mut Graph, c: &GradCtx) -> Grads {
    let gr = c.grad(0)?.clone();
    let neg = g.neg(&gr)?;
    both(g, c, gr, neg)
}

/// `SquaredDifference`: `2 (x - y) grad` and its negation.
pub fn squared_difference(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let two = g.scalar("Const", x.dtype, 2.0)?;
    let d = named(g, "Sub", "Sub", &x, &y)?;
    let scaled = named(g, "Mul", "Mul", &two, &gr)?;
    let gx = named(g, "Mul", "Mul", &scaled, &d)?;
    let gy = g.neg(&gx)?;
    both(g, c, gx, gy)
}

/// `Mul`: `grad * y` and `x * grad`.
pub fn mul_grad(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let gx = named(g, "Mul", "Mul", &gr, &y)?;
    let gy = named(g, "Mul", "Mul", &x, &gr)?;
    both(g, c, gx, gy)
}

/// `RealDiv`: `grad / y` and `grad * (-x / y / y)`.
pub fn real_div(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let gx = named(g, "RealDiv", "RealDiv", &gr, &y)?;
    let nx = g.neg(&x)?;
    let a = named(g, "RealDiv", "RealDiv", &nx, &y)?;
    let b = named(g, "RealDiv", "RealDiv", &a, &y)?;
    let gy = mul(g, &gr, &b)?;
    both(g, c, gx, gy)
}

/// `DivNoNan`: `div_no_nan(grad, y)` and `grad * div_no_nan(div_no_nan(-x, y), y)`, so a zero
/// divisor passes back zeros.
pub fn div_no_nan(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let gx = g.div_no_nan(&gr, &y)?;
    let nx = g.neg(&x)?;
    let a = g.div_no_nan(&nx, &y)?;
    let b = g.div_no_nan(&a, &y)?;
    let gy = mul(g, &gr, &b)?;
    both(g, c, gx, gy)
}

/// `Pow`: `grad * y * x^(y-1)` and `grad * z * log(x)` (0 where `x <= 0`).
pub fn pow(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, y, z, gr) = (
        c.input(0)?.clone(),
        c.input(1)?.clone(),
        c.output(0)?.clone(),
        c.grad(0)?.clone(),
    );
    let one = g.scalar("Const", y.dtype, 1.0)?;
    let ym1 = sub(g, &y, &one)?;
    let p = named(g, "Pow", "Pow", &x, &ym1)?;
    let t = mul(g, &y, &p)?;
    let gx = mul(g, &gr, &t)?;
    let zeros = g.zeros_like(&x)?;
    let positive = named(g, "Greater", "Greater", &x, &zeros)?;
    let log = g.unary("Log", &x)?;
    let safe_log = g.select(&positive, &log, &zeros, true)?;
    let t = mul(g, &z, &safe_log)?;
    let gy = mul(g, &gr, &t)?;
    both(g, c, gx, gy)
}

fn max_min_grad(g: &mut Graph, c: &GradCtx, cmp: &str) -> Grads {
    let (x, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let zeros = g.zeros_like(&gr)?;
    let xmask = g.binary(cmp, &x, &y)?;
    let gx = g.select(&xmask, &gr, &zeros, true)?;
    let gy = g.select(&xmask, &zeros, &gr, true)?;
    both(g, c, gx, gy)
}

/// `Maximum`: the gradient goes to `x` where `x >= y`, else to `y`.
pub fn maximum(g: &mut Graph, c: &GradCtx) -> Grads {
    max_min_grad(g, c, "GreaterEqual")
}

/// `Minimum`: the gradient goes to `x` where `x <= y`, else to `y`.
pub fn minimum(g: &mut Graph, c: &GradCtx) -> Grads {
    max_min_grad(g, c, "LessEqual")
}

/// `Neg`: `-grad`.
pub fn neg(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.neg(c.grad(0)?)?)])
}

/// `Square`: `grad * (x * 2)`.
pub fn square(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, gr) = (c.input(0)?.clone(), c.grad(0)?.clone());
    let two = g.scalar("Const", x.dtype, 2.0)?;
    let x2 = named(g, "Mul", "Mul", &x, &two)?;
    Ok(vec![Some(named(g, "Mul", "Mul", &gr, &x2)?)])
}

/// `Sqrt`: `grad * 0.5 / y` (TensorFlow's `SqrtGrad`, written with basic ops).
pub fn sqrt(g: &mut Graph, c: &GradCtx) -> Grads {
    let (y, gr) = (c.output(0)?.clone(), c.grad(0)?.clone());
    let half = g.scalar("Const", y.dtype, 0.5)?;
    let h = mul(g, &gr, &half)?;
    Ok(vec![Some(div(g, &h, &y)?)])
}

/// `Rsqrt`: `grad * -0.5 * y^3` (TensorFlow's `RsqrtGrad`).
pub fn rsqrt(g: &mut Graph, c: &GradCtx) -> Grads {
    let (y, gr) = (c.output(0)?.clone(), c.grad(0)?.clone());
    let k = g.scalar("Const", y.dtype, -0.5)?;
    let y2 = mul(g, &y, &y)?;
    let y3 = mul(g, &y2, &y)?;
    let t = mul(g, &y3, &k)?;
    Ok(vec![Some(mul(g, &gr, &t)?)])
}

/// `Exp`: `grad * y`.
pub fn exp(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(mul(g, c.grad(0)?, c.output(0)?)?)])
}

/// `Sin`: `grad * cos(x)`.
pub fn sin(g: &mut Graph, c: &GradCtx) -> Grads {
    let cos = g.unary("Cos", c.input(0)?)?;
    Ok(vec![Some(mul(g, c.grad(0)?, &cos)?)])
}

/// `Cos`: `-grad * sin(x)`.
pub fn cos(g: &mut Graph, c: &GradCtx) -> Grads {
    let sin = g.unary("Sin", c.input(0)?)?;
    let neg = g.unary("Neg", &sin)?;
    Ok(vec![Some(mul(g, c.grad(0)?, &neg)?)])
}

/// `Log`: `grad * 1/x`.
pub fn log(g: &mut Graph, c: &GradCtx) -> Grads {
    let r = g.unary("Reciprocal", c.input(0)?)?;
    Ok(vec![Some(mul(g, c.grad(0)?, &r)?)])
}

/// `Erf`: `grad * 2/sqrt(pi) * exp(-x^2)`.
pub fn erf(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, gr) = (c.input(0)?.clone(), c.grad(0)?.clone());
    let k = g.scalar("Const", gr.dtype, std::f64::consts::FRAC_2_SQRT_PI)?;
    let sq = g.unary("Square", &x)?;
    let neg = g.neg(&sq)?;
    let e = g.unary("Exp", &neg)?;
    let scaled = mul(g, &gr, &k)?;
    Ok(vec![Some(mul(g, &scaled, &e)?)])
}

/// `Log1p`: `grad * 1/(1 + x)`.
pub fn log1p(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let one = g.scalar("add/x", x.dtype, 1.0)?;
    let shifted = g.add1(NodeSpec::new("AddV2").name("add").input(&one).input(&x))?;
    let r = g.unary("Reciprocal", &shifted)?;
    Ok(vec![Some(mul(g, c.grad(0)?, &r)?)])
}

/// `Abs`: `grad * sign(x)`.
pub fn abs(g: &mut Graph, c: &GradCtx) -> Grads {
    let s = g.unary("Sign", c.input(0)?)?;
    Ok(vec![Some(mul(g, c.grad(0)?, &s)?)])
}

/// `Reciprocal`: `-grad * y^2` (TensorFlow's `ReciprocalGrad`).
pub fn reciprocal(g: &mut Graph, c: &GradCtx) -> Grads {
    let y = c.output(0)?.clone();
    let y2 = mul(g, &y, &y)?;
    let t = mul(g, c.grad(0)?, &y2)?;
    Ok(vec![Some(g.neg(&t)?)])
}

/// `Sigmoid`: `SigmoidGrad(y, grad)`.
pub fn sigmoid(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.binary(
        "SigmoidGrad",
        c.output(0)?,
        c.grad(0)?,
    )?)])
}

/// `Tanh`: `TanhGrad(y, grad)`.
pub fn tanh(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.binary(
        "TanhGrad",
        c.output(0)?,
        c.grad(0)?,
    )?)])
}

/// `AddN`: every input gets the gradient.
pub fn add_n(_: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(c.grad(0)?.clone()); c.inputs.len()])
}

/// `Select`: the gradient where the condition picked each branch, zeros elsewhere.
pub fn select(g: &mut Graph, c: &GradCtx) -> Grads {
    let (cond, gr) = (c.input(0)?.clone(), c.grad(0)?.clone());
    let zeros = g.zeros_like(c.input(1)?)?;
    let gt = g.select(&cond, &gr, &zeros, false)?;
    let ge = g.select(&cond, &zeros, &gr, false)?;
    Ok(vec![None, Some(gt), Some(ge)])
}

/// `SelectV2`: like `Select`, then summed back over broadcast dimensions of each branch.
pub fn select_v2(g: &mut Graph, c: &GradCtx) -> Grads {
    let (cond, gr) = (c.input(0)?.clone(), c.grad(0)?.clone());
    let zeros = g.zeros_like(&gr)?;
    let gt = g.select(&cond, &gr, &zeros, true)?;
    let gt = sum_to_shape(g, &gt, c.input(1)?)?;
    let ge = g.select(&cond, &zeros, &gr, true)?;
    let ge = sum_to_shape(g, &ge, c.input(2)?)?;
    Ok(vec![None, Some(gt), Some(ge)])
}

fn mm(g: &mut Graph, a: &Output, b: &Output, ta: bool, tb: bool, which: &str) -> Result<Output> {
    g.add1(
        NodeSpec::new("MatMul")
            .input(a)
            .input(b)
            .attr("transpose_a", value::bool(ta))
            .attr("transpose_b", value::bool(tb))
            .attr(which, value::bool(true)),
    )
}

/// `MatMul`, for every combination of transposes (TensorFlow's `_MatMulGrad`).
pub fn matmul(g: &mut Graph, c: &GradCtx) -> Grads {
    let (a, b, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let ta = attr::bool_or(&c.node, "transpose_a", false)?;
    let tb = attr::bool_or(&c.node, "transpose_b", false)?;
    let (ga, gb) = match (ta, tb) {
        (false, false) => (
            mm(g, &gr, &b, false, true, "grad_a")?,
            mm(g, &a, &gr, true, false, "grad_b")?,
        ),
        (false, true) => (
            mm(g, &gr, &b, false, false, "grad_a")?,
            mm(g, &gr, &a, true, false, "grad_b")?,
        ),
        (true, false) => (
            mm(g, &b, &gr, false, true, "grad_a")?,
            mm(g, &a, &gr, false, false, "grad_b")?,
        ),
        (true, true) => (
            mm(g, &b, &gr, true, true, "grad_a")?,
            mm(g, &gr, &a, true, true, "grad_b")?,
        ),
    };
    Ok(vec![Some(ga), Some(gb)])
}

fn bmm(
    g: &mut Graph,
    x: &Output,
    y: &Output,
    adj_x: bool,
    adj_y: bool,
    which: &str,
) -> Result<Output> {
    g.add1(
        NodeSpec::new("BatchMatMulV2")
            .input(x)
            .input(y)
            .attr("adj_x", value::bool(adj_x))
            .attr("adj_y", value::bool(adj_y))
            .attr(which, value::bool(true)),
    )
}

/// `BatchMatMulV2`, for every combination of adjoints, summed back over broadcast batch dims.
pub fn batch_matmul(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let ax = attr::bool_or(&c.node, "adj_x", false)?;
    let ay = attr::bool_or(&c.node, "adj_y", false)?;
    let (gx, gy) = match (ax, ay) {
        (false, false) => (
            bmm(g, &gr, &y, false, true, "grad_x")?,
            bmm(g, &x, &gr, true, false, "grad_y")?,
        ),
        (false, true) => (
            bmm(g, &gr, &y, false, false, "grad_x")?,
            bmm(g, &gr, &x, true, false, "grad_y")?,
        ),
        (true, false) => (
            bmm(g, &y, &gr, false, true, "grad_x")?,
            bmm(g, &x, &gr, false, false, "grad_y")?,
        ),
        (true, true) => (
            bmm(g, &y, &gr, true, true, "grad_x")?,
            bmm(g, &gr, &x, true, true, "grad_y")?,
        ),
    };
    let gx = sum_to_shape(g, &gx, &x)?;
    let gy = sum_to_shape(g, &gy, &y)?;
    Ok(vec![Some(gx), Some(gy)])
}

/// Reshapes the gradient of a reduction so it broadcasts against the input: the reduced
/// axes become 1 (`Reshape`). Returns it and whether every axis was reduced.
fn grad_kept_dims(g: &mut Graph, c: &GradCtx) -> Result<(Output, bool)> {
    let (x, gr) = (c.input(0)?.clone(), c.grad(0)?.clone());
    let (Some(axes), Some(rank)) = (const_ints(g, c.input(1)?), x.shape.rank()) else {
        return Ok((kept_dims_at_run_time(g, c)?, false));
    };
    let mut reduced = vec![false; rank];
    for a in axes {
        let i = if a < 0 { a + rank as i64 } else { a };
        let slot = usize::try_from(i)
            .ok()
            .and_then(|i| reduced.get_mut(i))
            .ok_or_else(|| c.err(format!("axis {a} out of range")))?;
        *slot = true;
    }
    let all = reduced.iter().all(|&r| r);
    let kept = match x.shape.to_shape() {
        // Every axis reduced: a constant [1, 1, ...] shape whatever the dims (TensorFlow's form).
        _ if all => g.reshape_to(&gr, &vec![1; rank])?,
        Some(s) => {
            let dims: Vec<i64> = s
                .dims()
                .iter()
                .zip(&reduced)
                .map(|(&d, &r)| if r { 1 } else { d as i64 })
                .collect();
            g.reshape_to(&gr, &dims)?
        }
        None => {
            // kept = shape(x) * mask + (1 - mask), with mask 1 on the dims that stay.
            let sx = g.shape(&x)?;
            let mask: Vec<i64> = reduced.iter().map(|&r| if r { 0 } else { 1 }).collect();
            let inv: Vec<i64> = reduced.iter().map(|&r| if r { 1 } else { 0 }).collect();
            let m = g.const_vec_i32("Const", &mask)?;
            let k = mul(g, &sx, &m)?;
            let ones = g.const_vec_i32("Const", &inv)?;
            let kept_shape = named(g, "AddV2", "add", &k, &ones)?;
            g.reshape(&gr, &kept_shape)?
        }
    };
    Ok((kept, all))
}

/// The gradient reshaped to TensorFlow's `reduced_shape(shape(x), axes)` when the axes (or
/// the rank) are only known at run time: `hit = min(sum(one_hot((axes + r) % r, r)), 1)`
/// marks the reduced dims, and the shape is `shape(x) * (1 - hit) + hit`.
fn kept_dims_at_run_time(g: &mut Graph, c: &GradCtx) -> Result<Output> {
    let (x, gr) = (c.input(0)?.clone(), c.grad(0)?.clone());
    let sx = g.shape(&x)?;
    let rank = g.unary("Rank", &x)?;
    let axes = c.input(1)?.clone();
    let axes = if axes.dtype == DType::Int32 {
        axes
    } else {
        g.cast(&axes, DType::Int32)?
    };
    let on = g.const_i32("Const", &[], &[1])?;
    // A scalar has rank 0 and no axes; max(rank, 1) keeps FloorMod away from zero.
    let modulus = named(g, "Maximum", "Maximum", &rank, &on)?;
    let shifted = named(g, "AddV2", "add", &axes, &rank)?;
    let axes = named(g, "FloorMod", "mod", &shifted, &modulus)?;
    let flat = g.reshape_to(&axes, &[-1])?;
    let off = g.const_i32("Const", &[], &[0])?;
    let oh = g.add1(
        NodeSpec::new("OneHot")
            .input(&flat)
            .input(&rank)
            .input(&on)
            .input(&off)
            .attr("axis", value::int(-1)),
    )?;
    let hits = g.sum(&oh, &[0], false)?;
    let hit = named(g, "Minimum", "Minimum", &hits, &on)?;
    let keep = sub(g, &on, &hit)?;
    let kept = mul(g, &sx, &keep)?;
    let kept_shape = named(g, "AddV2", "add", &kept, &hit)?;
    g.reshape(&gr, &kept_shape)
}

/// `Sum`: the gradient broadcast back over the reduced axes (`Reshape` + `Tile` when every
/// axis is reduced, as TensorFlow does; `Reshape` + `BroadcastTo` otherwise).
pub fn sum(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let (kept, all) = grad_kept_dims(g, c)?;
    let shape = match x.shape.to_shape() {
        Some(s) => {
            let dims: Vec<i64> = s.dims().iter().map(|&d| d as i64).collect();
            g.const_vec_i32("Const", &dims)?
        }
        None => g.shape(&x)?,
    };
    let out = if all {
        g.tile(&kept, &shape)?
    } else {
        g.broadcast_to(&kept, &shape)?
    };
    Ok(vec![Some(out), None])
}

/// `Mean`: the `Sum` gradient divided by the number of elements averaged.
pub fn mean(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let y = c.output(0)?.clone();
    let sum_grad = sum(g, c)?
        .remove(0)
        .ok_or_else(|| c.err("no sum gradient"))?;
    let factor = match (x.shape.to_shape(), y.shape.to_shape()) {
        (Some(xs), Some(ys)) => {
            let f = xs.num_elements() / ys.num_elements().max(1);
            g.scalar("Const", sum_grad.dtype, f as f64)?
        }
        _ => {
            // prod(shape(x)[axes]), with axes made non-negative: (axes + rank) % rank.
            let sx = g.shape(&x)?;
            let size = match x.shape.rank() {
                Some(rank) => g.const_i32("Size", &[], &[rank as i32])?,
                None => g.unary("Size", &sx)?,
            };
            let axes = c.input(1)?.clone();
            let axes = if axes.dtype == DType::Int32 {
                axes
            } else {
                g.cast(&axes, DType::Int32)?
            };
            let a = named(g, "AddV2", "add", &axes, &size)?;
            let m = named(g, "FloorMod", "mod", &a, &size)?;
            let picked = g.gather(&sx, &m, 0)?;
            let all = g.const_vec_i32("Const", &[0])?;
            let p = g.reduce("Prod", &picked, &all, false)?;
            g.cast(&p, sum_grad.dtype)?
        }
    };
    Ok(vec![Some(div(g, &sum_grad, &factor)?), None])
}

/// `Max` / `Min`: the gradient split evenly among the elements equal to the result.
pub fn max_min(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let (gk, _) = grad_kept_dims(g, c)?;
    let y = c.output(0)?.clone();
    let kept_shape = g.shape(&gk)?;
    let yk = g.reshape(&y, &kept_shape)?;
    let eq = g.binary("Equal", &yk, &x)?;
    let ind = g.cast(&eq, x.dtype)?;
    let n = g.reduce("Sum", &ind, c.input(1)?, true)?;
    let share = div(g, &ind, &n)?;
    Ok(vec![Some(mul(g, &share, &gk)?), None])
}

/// `Prod`: `grad * prod / x`. Exact where `x` has no zeros; TensorFlow's form, exact with zeros
/// too, multiplies exclusive `Cumprod`s from both ends (not done here yet).
pub fn prod(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let (gk, _) = grad_kept_dims(g, c)?;
    let y = c.output(0)?.clone();
    let kept_shape = g.shape(&gk)?;
    let yk = g.reshape(&y, &kept_shape)?;
    let t = mul(g, &gk, &yk)?;
    Ok(vec![Some(div(g, &t, &x)?), None])
}

/// The flags of a cumulative op's node.
fn scan_flags(c: &GradCtx) -> Result<(bool, bool)> {
    Ok((
        attr::bool_or(&c.node, "exclusive", false)?,
        attr::bool_or(&c.node, "reverse", false)?,
    ))
}

/// `Cumsum`: the cumulative sum of the gradient in the other direction.
pub fn cumsum(g: &mut Graph, c: &GradCtx) -> Grads {
    let (exclusive, reverse) = scan_flags(c)?;
    let dx = g.cumsum(c.grad(0)?, c.input(1)?, exclusive, !reverse)?;
    Ok(vec![Some(dx), None])
}

/// `Cumprod` (TensorFlow's `_CumprodGrad`): `div_no_nan(cumsum(cumprod(x) * grad), x)`, the
/// sum running the other way; exact where `x` has no zeros (0 where it has).
pub fn cumprod(g: &mut Graph, c: &GradCtx) -> Grads {
    let (exclusive, reverse) = scan_flags(c)?;
    let (x, axis) = (c.input(0)?.clone(), c.input(1)?.clone());
    let prod = g.cumprod(&x, &axis, exclusive, reverse)?;
    let weighted = mul(g, &prod, c.grad(0)?)?;
    let out = g.cumsum(&weighted, &axis, exclusive, !reverse)?;
    Ok(vec![Some(g.div_no_nan(&out, &x)?), None])
}

/// `Cast`: the gradient cast back, between float types only.
pub fn cast(g: &mut Graph, c: &GradCtx) -> Grads {
    let src = attr::dtype(&c.node, "SrcT")?;
    let Some(gr) = c.grads.first().cloned().flatten() else {
        return Ok(vec![None]);
    };
    if src.is_float() && gr.dtype.is_float() {
        return Ok(vec![Some(g.cast(&gr, src)?)]);
    }
    Ok(vec![None])
}

#[allow(dead_code)]
fn unsupported(c: &GradCtx, why: &str) -> Status {
    Status::unimplemented(format!(
        "gradient of node `{}` (op {}): {why}",
        c.node.name, c.node.op
    ))
}
