//! Broadcasting with numpy's (and TensorFlow's) rules: shapes are aligned on their last
//! dimension, and a dimension of 1 stretches to match the other.
//!
//! Element-wise binary kernels go through [`binary`], which takes fast paths for equal shapes
//! and scalar operands and otherwise zips ndarray broadcast views; index-based kernels
//! (BroadcastTo, Tile, slices) go through [`gather_dims`], which copies a cartesian product of
//! per-dimension source indices.

use ndarray::{ArrayViewD, IxDyn, Zip};

use super::{split, Items};
use crate::error::Result;
use crate::kernels::OpContext;
use crate::tensor::{Element, Shape, Tensor};

/// Returns the broadcast shape of `a` and `b`, or `None` when they are incompatible.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// The INVALID_ARGUMENT status for shapes that do not broadcast, worded as TensorFlow's.
pub fn incompatible(ctx: &OpContext<'_>, a: &Shape, b: &Shape) -> crate::Status {
    ctx.invalid(format!("Incompatible shapes: {a} vs. {b}"))
}

/// Applies `f` element-wise to `x` and `y` (both of element type `T`), broadcasting them.
/// Same shapes, a scalar, and a row repeated over the leading dimensions (a bias) split over
/// the device's intra-op threads; other broadcasts run on the calling thread.
pub fn binary<T: Element, U: Element>(
    ctx: &OpContext<'_>,
    x: &Tensor,
    y: &Tensor,
    f: impl Fn(T, T) -> U + Sync,
) -> Result<Tensor> {
    let xs = x.values::<T>()?;
    let ys = y.values::<T>()?;
    let intra = ctx.intra();
    match output_side(x, y) {
        Some(0) => return Tensor::from_vec(x.shape().clone(), over(intra, &xs, &ys, &f)),
        Some(_) => {
            let out = over(intra, &ys, &xs, &|b, a| f(a, b));
            return Tensor::from_vec(y.shape().clone(), out);
        }
        None => {}
    }
    let shape = broadcast_shape(x.dims(), y.dims())
        .ok_or_else(|| incompatible(ctx, x.shape(), y.shape()))?;
    let xv = view(x.dims(), &xs);
    let yv = view(y.dims(), &ys);
    let (Some(xb), Some(yb)) = (xv.broadcast(IxDyn(&shape)), yv.broadcast(IxDyn(&shape))) else {
        return Err(incompatible(ctx, x.shape(), y.shape()));
    };
    let out = Zip::from(&xb).and(&yb).map_collect(|&a, &b| f(a, b));
    Ok(Tensor::from_array(out))
}

/// `f(a, b)` of each element of `a` and its partner in `b`, in a form [`output_side`] found:
/// `b` one element, as many as `a`, or a row repeated over `a`'s leading dimensions. Split
/// over the pool.
fn over<T: Element, U: Element>(
    intra: &crate::runtime::intra::IntraPool,
    a: &[T],
    b: &[T],
    f: &(impl Fn(T, T) -> U + Sync),
) -> Vec<U> {
    match b {
        [b] => {
            let b = *b;
            split::map(intra, a, |v| f(v, b))
        }
        _ if b.len() == a.len() => split::zip(intra, a, b, f),
        row => split::rows(intra, a, row, f),
    }
}

/// Whether a tensor of `row_dims` is a row repeated over the leading dimensions of one of
/// `a_dims` (after dropping its own leading 1s), with at least one element.
fn is_row_of(a_dims: &[usize], row_dims: &[usize]) -> bool {
    let row_dims = &row_dims[row_dims.iter().take_while(|&&d| d == 1).count()..];
    row_dims.iter().product::<usize>() > 0
        && row_dims.len() <= a_dims.len()
        && a_dims.ends_with(row_dims)
}

/// Which input's shape [`binary`] gives its output when it splits the work over the pool (0 or
/// 1), in the order it tries the forms: same shapes, a scalar, a row; `None` for a general
/// broadcast.
pub(super) fn output_side(x: &Tensor, y: &Tensor) -> Option<usize> {
    if x.dims() == y.dims() || (y.num_elements() == 1 && y.rank() <= x.rank()) {
        Some(0)
    } else if x.num_elements() == 1 && x.rank() <= y.rank() {
        Some(1)
    } else if is_row_of(x.dims(), y.dims()) {
        Some(0)
    } else if is_row_of(y.dims(), x.dims()) {
        Some(1)
    } else {
        None
    }
}

/// Like [`binary`], for element types moved by reference ([`Items`], strings included).
pub fn binary_ref<T: Items, U: Element>(
    ctx: &OpContext<'_>,
    x: &Tensor,
    y: &Tensor,
    f: impl Fn(&T, &T) -> U,
) -> Result<Tensor> {
    let xs = T::items(x)?;
    let ys = T::items(y)?;
    if x.dims() == y.dims() {
        let out = xs.iter().zip(ys.iter()).map(|(a, b)| f(a, b)).collect();
        return Tensor::from_vec(x.shape().clone(), out);
    }
    let shape = broadcast_shape(x.dims(), y.dims())
        .ok_or_else(|| incompatible(ctx, x.shape(), y.shape()))?;
    let xv = view(x.dims(), &xs);
    let yv = view(y.dims(), &ys);
    let (Some(xb), Some(yb)) = (xv.broadcast(IxDyn(&shape)), yv.broadcast(IxDyn(&shape))) else {
        return Err(incompatible(ctx, x.shape(), y.shape()));
    };
    Ok(Tensor::from_array(Zip::from(&xb).and(&yb).map_collect(f)))
}

/// An ndarray view of row-major `values` with dimensions `dims`.
pub fn view<'a, T>(dims: &[usize], values: &'a [T]) -> ArrayViewD<'a, T> {
    ArrayViewD::from_shape(IxDyn(dims), values).expect("a tensor's values match its shape")
}

/// Copies the elements of `src` (row-major, dimensions `dims`) at the cartesian product of
/// `indices[d]` (source indices along each dimension `d`), in row-major order.
pub fn gather_dims<T: Clone>(src: &[T], dims: &[usize], indices: &[Vec<usize>]) -> Vec<T> {
    debug_assert_eq!(dims.len(), indices.len());
    let total: usize = indices.iter().map(Vec::len).product();
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return out;
    }
    if dims.is_empty() {
        out.push(src[0].clone());
        return out;
    }
    let mut strides = vec![1usize; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let last = dims.len() - 1;
    let mut counter = vec![0usize; dims.len()];
    // Offset of the current position without the innermost dimension.
    loop {
        let base: usize = (0..last).map(|d| indices[d][counter[d]] * strides[d]).sum();
        out.extend(indices[last].iter().map(|&i| src[base + i].clone()));
        // Advance the odometer over the outer dimensions.
        let mut d = last;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            counter[d] += 1;
            if counter[d] < indices[d].len() {
                break;
            }
            counter[d] = 0;
        }
    }
}

/// Broadcasts `src` (dimensions `from`) to `to`; `None` when `from` does not broadcast to `to`.
pub fn broadcast_to<T: Clone>(src: &[T], from: &[usize], to: &[usize]) -> Option<Vec<T>> {
    if from.len() > to.len() {
        return None;
    }
    let pad = to.len() - from.len();
    let mut dims = vec![1usize; pad];
    dims.extend_from_slice(from);
    let mut indices = Vec::with_capacity(to.len());
    for (&d, &t) in dims.iter().zip(to) {
        indices.push(match d {
            _ if d == t => (0..t).collect(),
            1 => vec![0; t],
            _ => return None,
        });
    }
    Some(gather_dims(src, &dims, &indices))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_like_numpy() {
        assert_eq!(broadcast_shape(&[2, 3], &[3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shape(&[2, 1], &[1, 4]), Some(vec![2, 4]));
        assert_eq!(broadcast_shape(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shape(&[0, 1], &[3]), Some(vec![0, 3]));
        assert_eq!(broadcast_shape(&[2, 3], &[4]), None);
    }

    #[test]
    fn gathers_cartesian_products() {
        // 2x3 source: [[0,1,2],[3,4,5]]; rows [1,0], columns [2,2,0].
        let src = [0, 1, 2, 3, 4, 5];
        let got = gather_dims(&src, &[2, 3], &[vec![1, 0], vec![2, 2, 0]]);
        assert_eq!(got, vec![5, 5, 3, 2, 2, 0]);
        assert_eq!(broadcast_to(&[1, 2], &[2], &[2, 2]), Some(vec![1, 2, 1, 2]));
        assert_eq!(
            broadcast_to(&[1, 2], &[2, 1], &[2, 3]),
            Some(vec![1, 1, 1, 2, 2, 2])
        );
        assert_eq!(broadcast_to(&[1, 2], &[2], &[3]), None);
    }
}
