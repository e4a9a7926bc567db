//! Graph plumbing and shape ops: Const, Placeholder, PlaceholderWithDefault, Identity,
//! IdentityN, StopGradient, NoOp; Reshape, Shape, ShapeN, Size, Rank, ConcatOffset,
//! InvertPermutation, ExpandDims, Squeeze; and the ops
//! that make tensors from shapes: Fill, ZerosLike, OnesLike, BroadcastTo, BroadcastGradientArgs,
//! Range, OneHot.
//!
//! Ops that only rename or reshape a tensor share its buffer instead of copying it, so they
//! work for every dtype, strings and resources included.

use std::sync::{Arc, OnceLock};

use num_traits::{NumCast, One, Zero};

use super::broadcast::{broadcast_to, incompatible};
use super::numeric::Real;
use super::{input, int_scalar, int_values, shape_values, stateless, Items};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, PartialShape, Shape, Tensor};

/// Returns the factory for a plumbing or shape op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Const" | "HostConst" => Const::create,
        "Placeholder" | "PlaceholderV2" => Placeholder::create,
        "PlaceholderWithDefault" | "Identity" | "StopGradient" | "Snapshot" | "PreventGradient" => {
            |_| stateless(identity)
        }
        "IdentityN" => |_| stateless(identity_n),
        "NoOp" => |_| stateless(|_| Ok(())),
        "Reshape" => |_| stateless(reshape),
        "Shape" => |n| ShapeOf::create(n, ShapeOp::Shape),
        "ShapeN" => |n| ShapeOf::create(n, ShapeOp::ShapeN),
        "ConcatOffset" => |_| stateless(concat_offset),
        "InvertPermutation" => |_| stateless(invert_permutation),
        "Size" => |n| ShapeOf::create(n, ShapeOp::Size),
        "Rank" => |n| ShapeOf::create(n, ShapeOp::Rank),
        "ExpandDims" => |_| stateless(expand_dims),
        "Squeeze" => Squeeze::create,
        "Fill" => |_| stateless(fill),
        "ZerosLike" => |_| stateless(zeros_like),
        "OnesLike" => |_| stateless(ones_like),
        "BroadcastTo" => |_| stateless(broadcast_to_kernel),
        "BroadcastGradientArgs" => |_| stateless(broadcast_gradient_args),
        "Range" => |_| stateless(range),
        "OneHot" => OneHot::create,
        _ => return None,
    };
    Some(factory)
}

/// TensorFlow's own name of a dtype in messages (`float`, not `float32`).
pub(super) fn tf_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Float => "float",
        DType::Double => "double",
        other => other.name(),
    }
}

/// Const: the tensor of its `value` attr, decoded once when the kernel is built.
struct Const {
    value: Tensor,
    /// A `HostConst`: its value stays in host memory whatever the device.
    host: bool,
    /// The value in its device's memory, copied there by the first step on a GPU and kept
    /// for every later one.
    placed: OnceLock<Tensor>,
}

impl Const {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let in_node = |e: crate::Status| {
            crate::Status::new(
                e.code(),
                format!("node `{}` (op {}): {}", node.name, node.op, e.message()),
            )
        };
        let value = Tensor::from_proto(attr::tensor(node, "value")?).map_err(in_node)?;
        if attr::get(node, "dtype").is_some() {
            let dtype = attr::dtype(node, "dtype")?;
            if dtype != value.dtype() {
                return Err(crate::Status::invalid_argument(format!(
                    "node `{}` (op Const): attr dtype is {dtype} but its value is a {} tensor",
                    node.name,
                    value.dtype()
                )));
            }
        }
        Ok(Arc::new(Const {
            value,
            host: node.op == "HostConst",
            placed: OnceLock::new(),
        }))
    }
}

impl OpKernel for Const {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let value = if self.host || ctx.memory_space().is_none() {
            self.value.clone()
        } else if let Some(placed) = self.placed.get() {
            placed.clone()
        } else {
            let placed = ctx.place(self.value.clone())?;
            self.placed.get_or_init(|| placed).clone()
        };
        ctx.set_output(0, value);
        Ok(())
    }
}

/// Placeholder: runs only when nothing was fed for it, and then fails as TensorFlow does.
struct Placeholder {
    message: String,
}

impl Placeholder {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let dtype = attr::dtype(node, "dtype")?;
        let shape = match attr::get(node, "shape") {
            Some(_) => attr::shape(node, "shape")?,
            None => PartialShape::unknown(),
        };
        let mut message = format!(
            "You must feed a value for placeholder tensor '{}' with dtype {}",
            node.name,
            tf_dtype_name(dtype)
        );
        if shape.rank().is_some() {
            message.push_str(&format!(" and shape {shape}"));
        }
        Ok(Arc::new(Placeholder { message }))
    }
}

impl OpKernel for Placeholder {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        Err(ctx.invalid(&self.message))
    }
}

/// Identity, StopGradient, PlaceholderWithDefault: the first input, unchanged.
fn identity(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    ctx.set_output(0, x);
    Ok(())
}

/// IdentityN: every input, unchanged.
fn identity_n(ctx: &mut OpContext<'_>) -> Result<()> {
    let inputs = ctx.inputs().to_vec();
    for (i, t) in inputs.into_iter().enumerate() {
        ctx.set_output(i, t);
    }
    Ok(())
}

/// Reshape(tensor, shape): at most one dimension may be -1 and is inferred.
fn reshape(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, shape) = (input(ctx, 0)?, input(ctx, 1)?);
    if shape.rank() > 1 {
        return Err(ctx.invalid(format!(
            "shape must be a vector, got shape {}",
            shape.shape()
        )));
    }
    let requested = int_values(ctx, &shape, "shape")?;
    let mut unknown = None;
    let mut known = 1usize;
    for (i, &d) in requested.iter().enumerate() {
        match d {
            -1 => {
                if let Some(first) = unknown {
                    return Err(ctx.invalid(format!(
                        "Only one input size may be -1, not both {first} and {i}"
                    )));
                }
                unknown = Some(i);
            }
            d if d < 0 => {
                return Err(ctx.invalid(format!("Size {i} must be non-negative, not {d}")));
            }
            d => known = known.saturating_mul(d as usize),
        }
    }
    let n = x.num_elements();
    let mut dims: Vec<usize> = requested.iter().map(|&d| d.max(0) as usize).collect();
    match unknown {
        Some(i) => {
            if known == 0 {
                if n != 0 {
                    return Err(ctx.invalid(format!(
                        "Input to reshape is a tensor with {n} values, but the requested shape has 0"
                    )));
                }
                return Err(ctx.invalid(
                    "Reshape cannot infer the missing input size for an empty tensor unless all \
                     specified input sizes are non-zero",
                ));
            }
            if n % known != 0 {
                return Err(ctx.invalid(format!(
                    "Input to reshape is a tensor with {n} values, but the requested shape requires \
                     a multiple of {known}"
                )));
            }
            dims[i] = n / known;
        }
        None if known != n => {
            return Err(ctx.invalid(format!(
                "Input to reshape is a tensor with {n} values, but the requested shape has {known}"
            )));
        }
        None => {}
    }
    let out = x.reshape(dims)?;
    ctx.set_output(0, out);
    Ok(())
}

#[derive(Clone, Copy)]
enum ShapeOp {
    Shape,
    ShapeN,
    Size,
    Rank,
}

/// Shape, ShapeN (the shape of each input), Size and Rank, as int32 or int64 (`out_type`;
/// Rank is always int32).
struct ShapeOf {
    op: ShapeOp,
    out_type: DType,
}

impl ShapeOf {
    fn create(node: &NodeDef, op: ShapeOp) -> Result<Arc<dyn OpKernel>> {
        let out_type = match (op, attr::get(node, "out_type")) {
            (ShapeOp::Rank, _) | (_, None) => DType::Int32,
            (_, Some(_)) => attr::dtype(node, "out_type")?,
        };
        if !out_type.is_integer() {
            return Err(crate::Status::invalid_argument(format!(
                "node `{}` (op {}): out_type must be int32 or int64, got {out_type}",
                node.name, node.op
            )));
        }
        Ok(Arc::new(ShapeOf { op, out_type }))
    }
}

/// Makes an int32 or int64 tensor from `i64` values.
fn int_tensor(dtype: DType, shape: impl Into<Shape>, values: Vec<i64>) -> Result<Tensor> {
    match dtype {
        DType::Int32 => Tensor::from_vec(
            shape,
            values.into_iter().map(|v| v as i32).collect::<Vec<_>>(),
        ),
        _ => Tensor::from_vec(shape, values),
    }
}

impl OpKernel for ShapeOf {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        if let ShapeOp::ShapeN = self.op {
            let inputs = ctx.inputs().to_vec();
            for (i, x) in inputs.iter().enumerate() {
                let dims: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
                ctx.set_output(i, int_tensor(self.out_type, [dims.len()], dims)?);
            }
            return Ok(());
        }
        let x = input(ctx, 0)?;
        let out = match self.op {
            ShapeOp::Shape | ShapeOp::ShapeN => {
                let dims: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
                int_tensor(self.out_type, [dims.len()], dims)?
            }
            ShapeOp::Size => int_tensor(
                self.out_type,
                Shape::scalar(),
                vec![x.num_elements() as i64],
            )?,
            ShapeOp::Rank => Tensor::scalar(x.rank() as i32),
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// ConcatOffset(concat_dim, shape...) -> offset...: where each input of a concat along
/// `concat_dim` starts in its output (the gradient of ConcatV2 slices with these).
fn concat_offset(ctx: &mut OpContext<'_>) -> Result<()> {
    let concat_dim = input(ctx, 0)?;
    if concat_dim.rank() != 0 {
        return Err(ctx.invalid(format!(
            "Concat dim tensor should be a scalar integer, but got shape {}",
            concat_dim.shape()
        )));
    }
    let shapes = ctx.inputs()[1..].to_vec();
    for (i, t) in shapes.iter().enumerate() {
        if t.rank() != 1 {
            return Err(ctx.invalid(format!(
                "input {} should be a vector, but got shape {}",
                i + 1,
                t.shape()
            )));
        }
    }
    let Some(first) = shapes.first() else {
        return Err(ctx.invalid("ConcatOffset needs at least one shape"));
    };
    let first_dims = int_values(ctx, first, "shape")?;
    let cdim = int_scalar(ctx, &concat_dim, "concat_dim")?;
    let rank = first_dims.len() as i64;
    let axis = if cdim < 0 { cdim + rank } else { cdim };
    if !(0..rank).contains(&axis) {
        return Err(ctx.invalid(format!("Concat dim is out of range: {cdim} vs. {rank}")));
    }
    let summary = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
    let mut offset = 0i64;
    for (i, t) in shapes.iter().enumerate() {
        let dims = int_values(ctx, t, "shape")?;
        if dims.len() != first_dims.len() {
            return Err(ctx.invalid(format!(
                "input {i} should contain {rank} elements, but got {}",
                dims.len()
            )));
        }
        let mut out = vec![0i64; dims.len()];
        for (j, (&d, &d0)) in dims.iter().zip(&first_dims).enumerate() {
            if j as i64 == axis {
                out[j] = offset;
                offset += d;
            } else if d != d0 {
                return Err(ctx.invalid(format!(
                    "All dimensions except {axis} must match. Input {i} has shape [{}] and \
                     doesn't match input 0 with shape [{}].",
                    summary(&dims),
                    summary(&first_dims)
                )));
            }
        }
        ctx.set_output(i, int_tensor(t.dtype(), [out.len()], out)?);
    }
    Ok(())
}

/// InvertPermutation(x) -> y: `y[x[i]] = i` (the gradient of Transpose permutes back with it).
fn invert_permutation(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    if x.rank() != 1 {
        return Err(ctx.invalid("invert_permutation expects a 1D vector."));
    }
    let perm = int_values(ctx, &x, "x")?;
    let n = perm.len();
    let mut out = vec![-1i64; n];
    for (i, &d) in perm.iter().enumerate() {
        let slot = usize::try_from(d)
            .ok()
            .filter(|&d| d < n)
            .ok_or_else(|| ctx.invalid(format!("{d} is not between 0 and {n}")))?;
        if out[slot] != -1 {
            return Err(ctx.invalid(format!("{d} is duplicated in the input.")));
        }
        out[slot] = i as i64;
    }
    ctx.set_output(0, int_tensor(x.dtype(), [n], out)?);
    Ok(())
}

/// ExpandDims(input, axis): inserts a dimension of 1 at `axis` in `[-rank-1, rank]`.
fn expand_dims(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, axis) = (input(ctx, 0)?, input(ctx, 1)?);
    let axis = int_scalar(ctx, &axis, "axis")?;
    let rank = x.rank() as i64;
    if axis < -rank - 1 || axis > rank {
        return Err(ctx.invalid(format!(
            "Tried to expand dim index {axis} for tensor with {rank} dimensions."
        )));
    }
    let at = if axis < 0 { axis + rank + 1 } else { axis } as usize;
    let mut dims = x.dims().to_vec();
    dims.insert(at, 1);
    let out = x.reshape(dims)?;
    ctx.set_output(0, out);
    Ok(())
}

/// Squeeze: drops the listed dimensions of size 1 (`squeeze_dims`), or every one when none is
/// listed.
struct Squeeze {
    dims: Vec<i64>,
}

impl Squeeze {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let mut dims = attr::int_list(node, "squeeze_dims")?;
        if dims.is_empty() {
            dims = attr::int_list(node, "axis")?;
        }
        Ok(Arc::new(Squeeze { dims }))
    }
}

impl OpKernel for Squeeze {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let rank = x.rank() as i64;
        let mut drop = vec![self.dims.is_empty(); x.rank()];
        for &d in &self.dims {
            if d < -rank || d >= rank {
                return Err(ctx.invalid(format!(
                    "Tried to squeeze dim index {d} for tensor with {rank} dimensions."
                )));
            }
            let at = if d < 0 { d + rank } else { d } as usize;
            if x.dims()[at] != 1 {
                return Err(ctx.invalid(format!(
                    "Can not squeeze dim[{at}], expected a dimension of 1, got {}",
                    x.dims()[at]
                )));
            }
            drop[at] = true;
        }
        let dims: Vec<usize> = x
            .dims()
            .iter()
            .zip(&drop)
            .filter(|(&s, &d)| !(d && s == 1))
            .map(|(&s, _)| s)
            .collect();
        let out = x.reshape(dims)?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Fill(dims, value): a tensor of shape `dims` holding `value` everywhere.
fn fill(ctx: &mut OpContext<'_>) -> Result<()> {
    let (dims, value) = (input(ctx, 0)?, input(ctx, 1)?);
    let dims = shape_values(ctx, &dims, "dims")?;
    if value.rank() != 0 {
        return Err(ctx.invalid(format!(
            "value must be a scalar, got shape {}",
            value.shape()
        )));
    }
    let n: usize = dims.iter().product();
    let out = dispatch_items!(ctx, value.dtype(), T => {
        let v = T::items(&value)?.first().cloned().ok_or_else(|| ctx.invalid("value is empty"))?;
        T::tensor(dims, vec![v; n])?
    });
    ctx.set_output(0, out);
    Ok(())
}

fn zeros_like(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    let out = match x.dtype() {
        // Lists of zeros, for the gradients of loops over TensorLists.
        DType::Variant => super::list::zeros_like(&x),
        dtype => Tensor::zeros(dtype, x.shape().clone()),
    }
    .map_err(|e| ctx.invalid(e.message()))?;
    ctx.set_output(0, out);
    Ok(())
}

fn ones_like(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    let n = x.num_elements();
    let shape = x.shape().clone();
    let out = match x.dtype() {
        DType::Bool => Tensor::from_vec(shape, vec![true; n])?,
        // The dtypes no arithmetic kernel is compiled for: ones converted as Cast does.
        DType::UInt8
        | DType::Int8
        | DType::Int16
        | DType::UInt16
        | DType::UInt32
        | DType::UInt64
        | DType::Half
        | DType::BFloat16
        | DType::Complex64 => {
            super::cast::convert_to(ctx, &Tensor::from_vec(shape, vec![1i32; n])?, x.dtype())?
        }
        dtype => dispatch_real!(ctx, dtype, T => Tensor::from_vec(shape, vec![T::one(); n])?),
    };
    ctx.set_output(0, out);
    Ok(())
}

/// BroadcastTo(input, shape).
fn broadcast_to_kernel(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, shape) = (input(ctx, 0)?, input(ctx, 1)?);
    let to = shape_values(ctx, &shape, "shape")?;
    let out = dispatch_items!(ctx, x.dtype(), T => {
        let values = T::items(&x)?;
        let out = broadcast_to(&values, x.dims(), &to).ok_or_else(|| {
            ctx.invalid(format!(
                "Unable to broadcast tensor of shape {} to tensor of shape {}",
                x.shape(),
                Shape::new(to.clone())
            ))
        })?;
        T::tensor(to, out)?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// BroadcastGradientArgs(s0, s1) -> (r0, r1): the dimensions each gradient must be summed over
/// to undo the broadcast of a binary op.
fn broadcast_gradient_args(ctx: &mut OpContext<'_>) -> Result<()> {
    let (s0, s1) = (input(ctx, 0)?, input(ctx, 1)?);
    let a = shape_values(ctx, &s0, "s0")?;
    let b = shape_values(ctx, &s1, "s1")?;
    let (mut r0, mut r1) = (Vec::new(), Vec::new());
    if a != b {
        let rank = a.len().max(b.len());
        let pad = |s: &[usize], i: usize| {
            if i + s.len() >= rank {
                s[i + s.len() - rank]
            } else {
                1
            }
        };
        for i in 0..rank {
            let (da, db) = (pad(&a, i), pad(&b, i));
            if da != db && da != 1 && db != 1 {
                return Err(incompatible(
                    ctx,
                    &Shape::new(a.clone()),
                    &Shape::new(b.clone()),
                ));
            }
            if da == 1 {
                r0.push(i as i64);
            }
            if db == 1 {
                r1.push(i as i64);
            }
        }
    }
    let (n0, n1) = (r0.len(), r1.len());
    ctx.set_output(0, int_tensor(s0.dtype(), [n0], r0)?);
    ctx.set_output(1, int_tensor(s0.dtype(), [n1], r1)?);
    Ok(())
}

/// Range(start, limit, delta): `start, start + delta, ...` up to but excluding `limit`.
fn range(ctx: &mut OpContext<'_>) -> Result<()> {
    let (start, limit, delta) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
    for (name, t) in [("start", &start), ("limit", &limit), ("delta", &delta)] {
        if t.rank() != 0 {
            return Err(ctx.invalid(format!("{name} must be a scalar, not shape {}", t.shape())));
        }
        super::same_dtype(ctx, &start, t)?;
    }
    let out = dispatch_real!(ctx, start.dtype(), T => {
        let (s, l, d) = (start.scalar_value::<T>()?, limit.scalar_value::<T>()?, delta.scalar_value::<T>()?);
        let (sf, lf, df) = (Real::to_f64(s), Real::to_f64(l), Real::to_f64(d));
        if Real::is_zero(d) {
            return Err(ctx.invalid(format!("Requires delta != 0: {df}")));
        }
        if df > 0.0 && sf > lf {
            return Err(ctx.invalid(format!("Requires start <= limit when delta > 0: {sf}/{lf}")));
        }
        if df < 0.0 && sf < lf {
            return Err(ctx.invalid(format!("Requires start >= limit when delta < 0: {sf}/{lf}")));
        }
        let size = if T::IS_INT {
            let (si, li, di) = (sf as i128, lf as i128, df as i128);
            ((li - si).abs() + di.abs() - 1) / di.abs()
        } else {
            ((lf - sf) / df).abs().ceil() as i128
        };
        let size = usize::try_from(size).map_err(|_| ctx.invalid("Range has too many elements"))?;
        super::checked_elements(ctx, &[size])?;
        let values: Vec<T> = (0..size)
            .map(|i| Real::add(s, Real::mul(<T as NumCast>::from(i).unwrap_or_else(T::zero), d)))
            .collect();
        Tensor::from_vec([size], values)?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// OneHot(indices, depth, on_value, off_value): `on_value` where the index equals the position
/// along the new `axis` dimension, `off_value` elsewhere (so out-of-range indices give a row of
/// `off_value`).
struct OneHot {
    axis: i64,
}

impl OneHot {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(OneHot {
            axis: attr::int_or(node, "axis", -1)?,
        }))
    }
}

impl OpKernel for OneHot {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (indices, depth, on, off) = (
            input(ctx, 0)?,
            input(ctx, 1)?,
            input(ctx, 2)?,
            input(ctx, 3)?,
        );
        let rank = indices.rank() as i64;
        if self.axis < -1 || self.axis > rank {
            return Err(ctx.invalid(format!(
                "Expected axis to be -1 or between [0, {rank}].  But received: {}",
                self.axis
            )));
        }
        let depth = int_scalar(ctx, &depth, "depth")?;
        let depth = usize::try_from(depth)
            .map_err(|_| ctx.invalid(format!("depth must be non-negative, got: {depth}")))?;
        super::same_dtype(ctx, &on, &off)?;
        let idx = int_values(ctx, &indices, "indices")?;
        let axis = if self.axis == -1 {
            indices.rank()
        } else {
            self.axis as usize
        };
        let outer: usize = indices.dims()[..axis].iter().product();
        let inner: usize = indices.dims()[axis..].iter().product();
        let mut dims = indices.dims().to_vec();
        dims.insert(axis, depth);
        super::checked_elements(ctx, &dims)?;
        let out = dispatch_all!(ctx, on.dtype(), T => {
            let (on, off) = (on.scalar_value::<T>()?, off.scalar_value::<T>()?);
            let mut out = Vec::with_capacity(outer * depth * inner);
            for o in 0..outer {
                for d in 0..depth as i64 {
                    out.extend(idx[o * inner..(o + 1) * inner].iter().map(|&i| if i == d { on } else { off }));
                }
            }
            Tensor::from_vec(dims, out)?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}
