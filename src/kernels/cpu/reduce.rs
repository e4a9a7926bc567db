//! Reductions over axes given as a tensor: Sum, Mean, Max, Min, Prod (`keep_dims`, negative
//! axes, a scalar or a vector of int32/int64 axes), and ArgMax / ArgMin over one axis
//! (`output_type`).
//!
//! One pass over the input accumulates each element into its output slot, so a reduction makes
//! one allocation whatever axes it reduces.

use std::sync::Arc;

use super::numeric::Real;
use super::split::ELEMENT_CYCLES;
use super::{input, int_scalar, int_values, normalize_axis};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::intra::IntraPool;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a reduction op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Sum" => |n| Reduce::create(n, Reducer::Sum),
        "Mean" => |n| Reduce::create(n, Reducer::Mean),
        "Max" => |n| Reduce::create(n, Reducer::Max),
        "Min" => |n| Reduce::create(n, Reducer::Min),
        "Prod" => |n| Reduce::create(n, Reducer::Prod),
        "All" => |n| Logical::create(n, true),
        "Any" => |n| Logical::create(n, false),
        "ArgMax" => |n| ArgReduce::create(n, true),
        "ArgMin" => |n| ArgReduce::create(n, false),
        _ => return None,
    };
    Some(factory)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reducer {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

/// A reduction kernel: which reducer, and whether reduced dimensions stay as size 1.
struct Reduce {
    reducer: Reducer,
    keep_dims: bool,
}

impl Reduce {
    fn create(node: &NodeDef, reducer: Reducer) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Reduce {
            reducer,
            keep_dims: attr::bool_or(node, "keep_dims", false)?,
        }))
    }

    fn run<T: Real>(&self, intra: &IntraPool, x: &Tensor, reduced: &[bool]) -> Result<Tensor> {
        if nothing_to_reduce(x.dims(), reduced) {
            // TensorFlow forwards the input here, as the gradient of an element-wise op of two
            // same-shaped tensors asks (a `Sum` over the empty axes of `BroadcastGradientArgs`):
            // an LSTM's backward pass runs 128 of them a step.
            return x.reshape(reduced_shape(x.dims(), reduced, self.keep_dims));
        }
        let values = x.values::<T>()?;
        let (x, dims) = (&values[..], x.dims());
        // Each reducer is its own instance of `reduce_split`, so that its loops vectorize.
        let mut out = match self.reducer {
            Reducer::Sum | Reducer::Mean => {
                reduce_split(intra, x, dims, reduced, T::zero(), Real::add)
            }
            Reducer::Prod => reduce_split(intra, x, dims, reduced, T::one(), Real::mul),
            Reducer::Max => reduce_split(intra, x, dims, reduced, T::LOWEST, Real::max),
            Reducer::Min => reduce_split(intra, x, dims, reduced, T::HIGHEST, Real::min),
        };
        if self.reducer == Reducer::Mean {
            let count: usize = dims
                .iter()
                .zip(reduced)
                .filter(|(_, &r)| r)
                .map(|(&d, _)| d)
                .product();
            for v in &mut out {
                *v = Real::div_count(*v, count);
            }
        }
        Tensor::from_vec(reduced_shape(dims, reduced, self.keep_dims), out)
    }
}

/// The shape of a reduction's output: `dims` without the `reduced` axes, or with them as 1
/// when `keep_dims`.
pub(crate) fn reduced_shape(dims: &[usize], reduced: &[bool], keep_dims: bool) -> Shape {
    let dims: Vec<usize> = dims
        .iter()
        .zip(reduced)
        .filter_map(|(&d, &r)| match (r, keep_dims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Shape::new(dims)
}

/// The axes of `x` that the reduction indices `axes` (a scalar or vector, negative counting
/// from the end) mark, checked as TensorFlow checks them.
pub(crate) fn reduction_axes(ctx: &OpContext<'_>, x: &Tensor, axes: &Tensor) -> Result<Vec<bool>> {
    if axes.rank() > 1 {
        return Err(ctx.invalid(format!(
            "reduction indices must be a scalar or a vector, got shape {}",
            axes.shape()
        )));
    }
    let rank = x.rank();
    let mut reduced = vec![false; rank];
    for axis in int_values(ctx, axes, "reduction indices")? {
        if axis < -(rank as i64) || axis >= rank as i64 {
            return Err(ctx.invalid(format!(
                "Invalid reduction dimension {axis} for input with {rank} dimensions \
                 (input shape {})",
                x.shape()
            )));
        }
        let d = if axis < 0 { axis + rank as i64 } else { axis } as usize;
        if reduced[d] {
            return Err(ctx.invalid(format!(
                "Invalid reduction arguments: Axes contains duplicate dimension: {d}"
            )));
        }
        reduced[d] = true;
    }
    Ok(reduced)
}

impl OpKernel for Reduce {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let axes = input(ctx, 1)?;
        let reduced = reduction_axes(ctx, &x, &axes)?;
        let out = dispatch_real!(ctx, x.dtype(), T => self.run::<T>(ctx.intra(), &x, &reduced)?);
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Whether a reduction over the `reduced` axes of a tensor of `dims` leaves every element as
/// it is: each reduced axis has one element, so each output is one input (every reducer's
/// fold of a single value is that value, and a mean divides it by one).
fn nothing_to_reduce(dims: &[usize], reduced: &[bool]) -> bool {
    dims.iter().zip(reduced).all(|(&d, &r)| !r || d == 1)
}

/// `All` (`every`) or `Any` over bool tensors.
struct Logical {
    every: bool,
    keep_dims: bool,
}

impl Logical {
    fn create(node: &NodeDef, every: bool) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Logical {
            every,
            keep_dims: attr::bool_or(node, "keep_dims", false)?,
        }))
    }
}

impl OpKernel for Logical {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        if x.dtype() != DType::Bool {
            return Err(ctx.invalid(format!("input must be bool, got {}", x.dtype())));
        }
        let reduced = reduction_axes(ctx, &x, &input(ctx, 1)?)?;
        let values = x.values::<bool>()?;
        let f: fn(bool, bool) -> bool = if self.every {
            |a, b| a && b
        } else {
            |a, b| a || b
        };
        let out = reduce_axes(&values, x.dims(), &reduced, self.every, f);
        ctx.set_output(
            0,
            Tensor::from_vec(reduced_shape(x.dims(), &reduced, self.keep_dims), out)?,
        );
        Ok(())
    }
}

/// [`reduce_axes`], split over the intra-op pool when the reduced axes are the trailing ones
/// (each output folds one contiguous block: split over the outputs) or the leading ones (each
/// output folds one column: split over the columns). Each output element is folded in the
/// same order as [`reduce_axes`] folds it, so the bits do not depend on the split; other
/// reductions, and small ones, run on the calling thread.
fn reduce_split<T: Copy + Send + Sync, F: Fn(T, T) -> T + Copy + Sync>(
    intra: &IntraPool,
    x: &[T],
    dims: &[usize],
    reduced: &[bool],
    init: T,
    f: F,
) -> Vec<T> {
    let kept = reduced.iter().take_while(|&&r| !r).count();
    let suffix = reduced[kept..].iter().all(|&r| r);
    let leading = reduced.iter().take_while(|&&r| r).count();
    let prefix = reduced[leading..].iter().all(|&r| !r);
    let (outer, block): (usize, usize) =
        (dims[..kept].iter().product(), dims[kept..].iter().product());
    if suffix && kept > 0 && kept < dims.len() && block > 0 {
        let pieces = intra.pieces(outer, block as f64 * ELEMENT_CYCLES);
        if pieces > 1 {
            // As `reduce_axes` folds a block: each row of the last axis in lanes, in order.
            let row = dims[dims.len() - 1].max(1);
            let mut out = vec![init; outer];
            intra.for_chunks(&mut out, 1, block as f64 * ELEMENT_CYCLES, |first, outs| {
                for (k, o) in outs.iter_mut().enumerate() {
                    let at = (first + k) * block;
                    *o = x[at..at + block]
                        .chunks(row)
                        .fold(init, |acc, r| f(acc, fold_lanes(r, init, f)));
                }
            });
            return out;
        }
    }
    let (rows, columns): (usize, usize) = (
        dims[..leading].iter().product(),
        dims[leading..].iter().product(),
    );
    if prefix && leading > 0 && leading < dims.len() && columns > 0 {
        let pieces = intra.pieces(columns, rows as f64 * ELEMENT_CYCLES);
        if pieces > 1 {
            // As `reduce_axes` folds a column: row after row.
            let mut out = vec![init; columns];
            intra.for_chunks(&mut out, 1, rows as f64 * ELEMENT_CYCLES, |first, outs| {
                let n = outs.len();
                for r in 0..rows {
                    let at = r * columns + first;
                    for (o, &v) in outs.iter_mut().zip(&x[at..at + n]) {
                        *o = f(*o, v);
                    }
                }
            });
            return out;
        }
    }
    reduce_axes(x, dims, reduced, init, f)
}

/// Folds every element of `x` (dimensions `dims`) into the output slot of its kept coordinates.
fn reduce_axes<T: Copy, F: Fn(T, T) -> T + Copy>(
    x: &[T],
    dims: &[usize],
    reduced: &[bool],
    init: T,
    f: F,
) -> Vec<T> {
    let out_len: usize = dims
        .iter()
        .zip(reduced)
        .filter(|(_, &r)| !r)
        .map(|(&d, _)| d)
        .product();
    let mut out = vec![init; out_len];
    if x.is_empty() {
        return out;
    }
    if dims.is_empty() {
        out[0] = f(init, x[0]);
        return out;
    }
    // The output stride of each input dimension (0 for reduced ones).
    let mut ostride = vec![0usize; dims.len()];
    let mut s = 1;
    for d in (0..dims.len()).rev() {
        if !reduced[d] {
            ostride[d] = s;
            s *= dims[d];
        }
    }
    let last = dims.len() - 1;
    let inner = dims[last];
    let mut counter = vec![0usize; dims.len()];
    let mut base = 0usize;
    for row in x.chunks(inner) {
        if ostride[last] == 0 {
            out[base] = f(out[base], fold_lanes(row, init, f));
        } else {
            for (j, &v) in row.iter().enumerate() {
                out[base + j] = f(out[base + j], v);
            }
        }
        // Advance the odometer over the outer dimensions, keeping `base` in step.
        let mut d = last;
        while d > 0 {
            d -= 1;
            counter[d] += 1;
            base += ostride[d];
            if counter[d] < dims[d] {
                break;
            }
            base -= ostride[d] * dims[d];
            counter[d] = 0;
        }
    }
    out
}

/// How many running values [`fold_lanes`] keeps: sixteen f32s fill an AVX-512 register.
const LANES: usize = 16;

/// Folds `row` with `f` from `init` in [`LANES`] running values, one per position modulo the
/// lane count, then folds those together: the lanes are independent, so the loop runs at the
/// memory's speed instead of one dependent step per element (a float sum's order, and so its
/// last bits, differ from a left-to-right fold, as TensorFlow's tree reduction's do).
fn fold_lanes<T: Copy, F: Fn(T, T) -> T + Copy>(row: &[T], init: T, f: F) -> T {
    let mut lanes = [init; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = f(*lane, v);
        }
    }
    let total = lanes.iter().fold(init, |acc, &lane| f(acc, lane));
    rest.iter().fold(total, |acc, &v| f(acc, v))
}

/// ArgMax / ArgMin over one axis given as a scalar tensor.
struct ArgReduce {
    max: bool,
    output_type: DType,
}

impl ArgReduce {
    fn create(node: &NodeDef, max: bool) -> Result<Arc<dyn OpKernel>> {
        let output_type = match attr::get(node, "output_type") {
            Some(_) => attr::dtype(node, "output_type")?,
            None => DType::Int64,
        };
        if !output_type.is_integer() {
            return Err(crate::Status::invalid_argument(format!(
                "node `{}` (op {}): output_type must be int32 or int64, got {output_type}",
                node.name, node.op
            )));
        }
        Ok(Arc::new(ArgReduce { max, output_type }))
    }

    fn run<T: Real>(&self, x: &Tensor, axis: usize) -> Result<Vec<i64>> {
        let values = x.values::<T>()?;
        let dims = x.dims();
        let n = dims[axis];
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis + 1..].iter().product();
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| values[(o * n + k) * inner + i];
                let mut best = 0;
                for k in 1..n {
                    // Strict comparison keeps the first index among ties, as TensorFlow does.
                    let better = if self.max {
                        at(k) > at(best)
                    } else {
                        at(k) < at(best)
                    };
                    if better {
                        best = k;
                    }
                }
                out.push(best as i64);
            }
        }
        Ok(out)
    }
}

impl OpKernel for ArgReduce {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let axis_tensor = input(ctx, 1)?;
        let axis = int_scalar(ctx, &axis_tensor, "dimension")?;
        let rank = x.rank().max(1);
        if x.rank() == 0 {
            return Err(ctx.invalid("input must be at least rank 1, got a scalar"));
        }
        let axis = normalize_axis(ctx, axis, rank, "dimension")?;
        if x.dims()[axis] == 0 {
            return Err(ctx.invalid(format!(
                "Reduction axis {axis} is empty in shape {}",
                x.shape()
            )));
        }
        let indices = dispatch_real!(ctx, x.dtype(), T => self.run::<T>(&x, axis)?);
        let mut dims = x.dims().to_vec();
        dims.remove(axis);
        let out = match self.output_type {
            DType::Int32 => Tensor::from_vec(
                dims,
                indices.into_iter().map(|i| i as i32).collect::<Vec<_>>(),
            )?,
            _ => Tensor::from_vec(dims, indices)?,
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_any_axes_in_one_pass() {
        // x = [[[0,1],[2,3],[4,5]], [[6,7],[8,9],[10,11]]] of shape [2,3,2].
        let x: Vec<i64> = (0..12).collect();
        let add = |a: i64, b: i64| a + b;
        assert_eq!(
            reduce_axes(&x, &[2, 3, 2], &[true, false, false], 0, add),
            vec![6, 8, 10, 12, 14, 16]
        );
        assert_eq!(
            reduce_axes(&x, &[2, 3, 2], &[false, true, false], 0, add),
            vec![6, 9, 24, 27]
        );
        assert_eq!(
            reduce_axes(&x, &[2, 3, 2], &[false, false, true], 0, add),
            vec![1, 5, 9, 13, 17, 21]
        );
        assert_eq!(
            reduce_axes(&x, &[2, 3, 2], &[true, false, true], 0, add),
            vec![14, 22, 30]
        );
        assert_eq!(
            reduce_axes(&x, &[2, 3, 2], &[true, true, true], 0, add),
            vec![66]
        );
        assert_eq!(
            reduce_axes(&x, &[2, 3, 2], &[false, false, false], 0, add),
            x
        );
    }

    /// A reduction whose reduced axes all have one element hands its input on, as
    /// TensorFlow's does: every bit kept (a fold from zero would turn -0 into +0), in the
    /// reduced shape, for every reducer.
    #[test]
    fn reducing_only_axes_of_one_element_hands_the_input_on() {
        let values = vec![-0.0f32, 1.5, f32::NAN, -3.0, 7.25, f32::MIN_POSITIVE];
        let x = Tensor::from_vec(vec![2, 1, 3], values.clone()).unwrap();
        for (op, axes) in [
            ("Sum", vec![]),
            ("Sum", vec![1]),
            ("Mean", vec![-2]),
            ("Max", vec![1]),
        ] {
            let axes = Tensor::from_vec(vec![axes.len()], axes).unwrap();
            let out = &super::super::run_float32(op, vec![x.clone(), axes.clone()], None)[0];
            let dims: &[usize] = if axes.num_elements() == 0 {
                &[2, 1, 3]
            } else {
                &[2, 3]
            };
            assert_eq!(out.dims(), dims, "{op} over {axes:?}");
            let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
            assert_eq!(super::super::float32_bits(out), bits, "{op} over {axes:?}");
        }
        // An axis of more than one element is still reduced.
        let axes = Tensor::from_vec(vec![1], vec![2i32]).unwrap();
        let out = &super::super::run_float32("Sum", vec![x, axes], None)[0];
        assert_eq!(out.dims(), &[2, 1]);
        assert!(out.values::<f32>().unwrap()[0].is_nan());
        assert_eq!(out.values::<f32>().unwrap()[1], 4.25);
    }

    /// Reductions over trailing or leading axes split over a pool give the bits of one
    /// thread (each output folded in the same order); others fall back to one pass.
    #[test]
    fn split_reductions_keep_the_bits_of_one_pass() {
        let pool = IntraPool::new("reduce-test", 3);
        let dims = [16, 61, 173];
        let x: Vec<f32> = (0..16 * 61 * 173)
            .map(|i| ((i * 29 % 211) as f32 - 105.0) / 13.0)
            .collect();
        let add = |a: f32, b: f32| a + b;
        let max = |a: f32, b: f32| a.max(b);
        for reduced in [
            [false, false, true],
            [false, true, true],
            [true, false, false],
            [true, true, false],
            [true, false, true],
            [true, true, true],
        ] {
            let one = reduce_axes(&x, &dims, &reduced, 0.0, add);
            let split = reduce_split(&pool, &x, &dims, &reduced, 0.0, add);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&split), "{reduced:?}");
            let one = reduce_axes(&x, &dims, &reduced, f32::MIN, max);
            let split = reduce_split(&pool, &x, &dims, &reduced, f32::MIN, max);
            assert_eq!(one, split, "{reduced:?}");
        }
        assert!(
            pool.pieces(16 * 61, 173.0 * ELEMENT_CYCLES) > 1
                && pool.pieces(61 * 173, 16.0 * ELEMENT_CYCLES) > 1,
            "the trailing and the leading reductions must split"
        );
    }

    #[test]
    fn long_rows_fold_in_lanes_to_the_fold_of_every_element() {
        // 62 whole chunks of the lanes and 15 elements left over.
        let x: Vec<i64> = (1..=1007).collect();
        let add = |a: i64, b: i64| a + b;
        assert_eq!(reduce_axes(&x, &[1007], &[true], 0, add), [1007 * 1008 / 2]);
        let max = |a: i64, b: i64| a.max(b);
        assert_eq!(reduce_axes(&x, &[1007], &[true], i64::MIN, max), [1007]);
        let min = |a: i64, b: i64| a.min(b);
        assert_eq!(reduce_axes(&x, &[1007], &[true], i64::MAX, min), [1]);
        // Each row folds on its own.
        let rows = reduce_axes(&x[..1006], &[2, 503], &[false, true], 0, add);
        assert_eq!(rows, [(1..=503).sum::<i64>(), (504..=1006).sum()]);
        // Floats whose sum is exact in any order: a quarter, a half or nothing each.
        let y: Vec<f32> = (0..4099).map(|i| 0.25 * (i % 3) as f32).collect();
        let exact: f32 = (0..4099).map(|i| 0.25 * (i % 3) as f32).sum();
        let fadd = |a: f32, b: f32| a + b;
        assert_eq!(reduce_axes(&y, &[4099], &[true], 0.0, fadd), [exact]);
    }
}
