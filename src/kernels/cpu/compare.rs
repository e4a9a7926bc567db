//! Comparisons and logic: Equal, NotEqual, Greater(Equal), Less(Equal) with broadcasting,
//! LogicalAnd / LogicalOr / LogicalNot, Select (TensorFlow 1 rules), SelectV2 (broadcasting)
//! and Where (the coordinates of the true elements).

use std::sync::Arc;

use ndarray::{IxDyn, Zip};

use super::broadcast::{self, broadcast_shape, view};
use super::Items;
use super::{input, same_dtype, stateless};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a comparison or logic op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Equal" => |n| Equality::create(n, false),
        "NotEqual" => |n| Equality::create(n, true),
        "Greater" => |_| stateless(greater),
        "GreaterEqual" => |_| stateless(greater_equal),
        "Less" => |_| stateless(less),
        "LessEqual" => |_| stateless(less_equal),
        "LogicalAnd" => |_| stateless(logical_and),
        "LogicalOr" => |_| stateless(logical_or),
        "LogicalNot" => |_| stateless(logical_not),
        "Select" => |_| stateless(select),
        "SelectV2" => |_| stateless(select_v2),
        "Where" => |_| stateless(where_true),
        _ => return None,
    };
    Some(factory)
}

/// Equal / NotEqual, over every dtype strings included; `incompatible_shape_error=false` turns shapes that do
/// not broadcast into a scalar answer (false for Equal, true for NotEqual) instead of an error.
struct Equality {
    negate: bool,
    incompatible_shape_error: bool,
}

impl Equality {
    fn create(node: &NodeDef, negate: bool) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Equality {
            negate,
            incompatible_shape_error: attr::bool_or(node, "incompatible_shape_error", true)?,
        }))
    }
}

impl OpKernel for Equality {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
        same_dtype(ctx, &x, &y)?;
        if !self.incompatible_shape_error && broadcast_shape(x.dims(), y.dims()).is_none() {
            ctx.set_output(0, Tensor::scalar(self.negate));
            return Ok(());
        }
        let negate = self.negate;
        let out = dispatch_items!(ctx, x.dtype(), T => {
            broadcast::binary_ref::<T, bool>(ctx, &x, &y, |a, b| (a == b) != negate)?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}

macro_rules! comparison {
    ($name:ident, |$a:ident, $b:ident| $body:expr) => {
        fn $name(ctx: &mut OpContext<'_>) -> Result<()> {
            let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
            same_dtype(ctx, &x, &y)?;
            let out = dispatch_real!(ctx, x.dtype(), T => {
                broadcast::binary::<T, bool>(ctx, &x, &y, |$a, $b| $body)?
            });
            ctx.set_output(0, out);
            Ok(())
        }
    };
}

comparison!(greater, |a, b| a > b);
comparison!(greater_equal, |a, b| a >= b);
comparison!(less, |a, b| a < b);
comparison!(less_equal, |a, b| a <= b);

/// Fails unless `t` is a bool tensor.
fn expect_bool(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<()> {
    if t.dtype() != DType::Bool {
        return Err(ctx.invalid(format!("{what} must be bool, got {}", t.dtype())));
    }
    Ok(())
}

fn logical(ctx: &mut OpContext<'_>, f: fn(bool, bool) -> bool) -> Result<()> {
    let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
    expect_bool(ctx, &x, "x")?;
    expect_bool(ctx, &y, "y")?;
    let out = broadcast::binary::<bool, bool>(ctx, &x, &y, f)?;
    ctx.set_output(0, out);
    Ok(())
}

fn logical_and(ctx: &mut OpContext<'_>) -> Result<()> {
    logical(ctx, |a, b| a && b)
}

fn logical_or(ctx: &mut OpContext<'_>) -> Result<()> {
    logical(ctx, |a, b| a || b)
}

fn logical_not(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    expect_bool(ctx, &x, "x")?;
    let out = Tensor::from_vec(
        x.shape().clone(),
        x.values::<bool>()?.iter().map(|&b| !b).collect(),
    )?;
    ctx.set_output(0, out);
    Ok(())
}

/// Select(condition, t, e), TensorFlow 1 rules: `t` and `e` have one shape; `condition` has
/// that shape too, or is a scalar, or a vector choosing whole rows along dimension 0.
fn select(ctx: &mut OpContext<'_>) -> Result<()> {
    let (cond, t, e) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
    expect_bool(ctx, &cond, "condition")?;
    same_dtype(ctx, &t, &e)?;
    if t.shape() != e.shape() {
        return Err(ctx.invalid(format!(
            "'then' and 'else' must have the same size.  but received: {} vs. {}",
            t.shape(),
            e.shape()
        )));
    }
    let c = cond.values::<bool>()?;
    // How many consecutive elements each condition value chooses.
    let run = if cond.shape() == t.shape() {
        1
    } else if cond.rank() == 0 {
        t.num_elements().max(1)
    } else if cond.rank() == 1 && t.rank() >= 1 && cond.dims()[0] == t.dims()[0] {
        t.dims()[1..].iter().product()
    } else {
        return Err(ctx.invalid(format!(
            "'condition' must be a scalar, a vector of size dim 0 of 'then', or have the shape \
             of 'then'; got condition {} and then {}",
            cond.shape(),
            t.shape()
        )));
    };
    let out = dispatch_items!(ctx, t.dtype(), T => {
        let (tv, ev) = (T::items(&t)?, T::items(&e)?);
        let mut out = Vec::with_capacity(tv.len());
        if run > 0 {
            for (i, (tc, ec)) in tv.chunks(run).zip(ev.chunks(run)).enumerate() {
                out.extend_from_slice(if c[i] { tc } else { ec });
            }
        }
        T::tensor(t.shape().clone(), out)?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// SelectV2(condition, t, e): element-wise choice with all three broadcast together.
fn select_v2(ctx: &mut OpContext<'_>) -> Result<()> {
    let (cond, t, e) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
    expect_bool(ctx, &cond, "condition")?;
    same_dtype(ctx, &t, &e)?;
    let shape = broadcast_shape(t.dims(), e.dims())
        .ok_or_else(|| broadcast::incompatible(ctx, t.shape(), e.shape()))?;
    let shape = broadcast_shape(cond.dims(), &shape).ok_or_else(|| {
        ctx.invalid(format!(
            "condition {}, then {} and else {} are not broadcastable",
            cond.shape(),
            t.shape(),
            e.shape()
        ))
    })?;
    let out = dispatch_items!(ctx, t.dtype(), T => select_broadcast::<T>(&cond, &t, &e, &shape)?);
    ctx.set_output(0, out);
    Ok(())
}

fn select_broadcast<T: Items>(
    cond: &Tensor,
    t: &Tensor,
    e: &Tensor,
    shape: &[usize],
) -> Result<Tensor> {
    let (cv, tv, ev) = (cond.values::<bool>()?, T::items(t)?, T::items(e)?);
    let to = IxDyn(shape);
    let broadcast_err = || crate::Status::internal("broadcast shape was checked");
    let c = view(cond.dims(), &cv);
    let c = c.broadcast(to.clone()).ok_or_else(broadcast_err)?;
    let tb = view(t.dims(), &tv);
    let tb = tb.broadcast(to.clone()).ok_or_else(broadcast_err)?;
    let eb = view(e.dims(), &ev);
    let eb = eb.broadcast(to).ok_or_else(broadcast_err)?;
    let out = Zip::from(&c)
        .and(&tb)
        .and(&eb)
        .map_collect(|&c, t, e| if c { t.clone() } else { e.clone() });
    let values = if out.is_standard_layout() {
        out.into_raw_vec_and_offset().0
    } else {
        out.iter().cloned().collect()
    };
    T::tensor(shape.to_vec(), values)
}

/// Where(input): the coordinates (int64 [n, rank]) of the true (non-zero) elements, in
/// row-major order.
fn where_true(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    let truth: Vec<bool> = if x.dtype() == DType::Bool {
        x.values::<bool>()?.into_owned()
    } else {
        dispatch!(ctx, x.dtype(),
            [Float => f32, Double => f64, Int32 => i32, Int64 => i64, Bool => bool,
             UInt8 => u8, Int8 => i8, Int16 => i16, UInt16 => u16, UInt32 => u32, UInt64 => u64,
             Half => half::f16, BFloat16 => half::bf16, Complex64 => crate::tensor::Complex64],
            T => x.values::<T>()?.iter().map(|&v| v != <T as Default>::default()).collect()
        )
    };
    let dims = x.dims();
    let rank = dims.len();
    let mut coords = Vec::new();
    let mut count = 0;
    for (flat, _) in truth.iter().enumerate().filter(|(_, &b)| b) {
        let mut rest = flat;
        let start = coords.len();
        coords.resize(start + rank, 0i64);
        for d in (0..rank).rev() {
            coords[start + d] = (rest % dims[d]) as i64;
            rest /= dims[d];
        }
        count += 1;
    }
    ctx.set_output(0, Tensor::from_vec([count, rank], coords)?);
    Ok(())
}
