//! The largest entries of each row: `TopKV2` (the `k` largest values of the last dimension and
//! their indices) and `InTopKV2` (whether each row's target is among its `k` largest
//! predictions).
//!
//! `TopKV2` gives TensorFlow's answer index for index, including the order of `sorted=false`,
//! which TensorFlow leaves unspecified but which a stock graph sees: its CPU kernel
//! (`topk_op.cc`) takes the first maximum for `k = 1`, sorts the whole row for `k` = the row's
//! length, and otherwise keeps a heap of the best `k` (`gtl::TopN`) built with libstdc++'s
//! heap algorithms, whose layout is the unsorted order; [`heap`] replays those steps. Ties go
//! to the lower index. Rows are split over the intra-op pool.
//!
//! NaN has no place in TensorFlow's order (its comparator is not a strict weak order there, so
//! its answer depends on the row); here NaN counts as larger than every number, which keeps
//! the order total.

use std::cmp::Ordering;
use std::sync::Arc;

use super::numeric::Real;
use super::{checked_elements, input, int_values};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a top-k op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "TopKV2" => TopK::create,
        "InTopKV2" => |_| super::stateless(in_top_k),
        _ => return None,
    };
    Some(factory)
}

/// Reads a scalar `k` (TensorFlow's message names the shape it got otherwise).
fn scalar_k(ctx: &OpContext<'_>, t: &Tensor, rank_word: &str) -> Result<i64> {
    if t.rank() != 0 {
        return Err(ctx.invalid(format!("k must be {rank_word}, got shape {}", t.shape())));
    }
    Ok(int_values(ctx, t, "k")?[0])
}

/// `TopKV2(input, k)`.
struct TopK {
    sorted: bool,
    index_type: DType,
}

impl TopK {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(TopK {
            sorted: attr::bool_or(node, "sorted", true)?,
            index_type: attr::dtype(node, "index_type").unwrap_or(DType::Int32),
        }))
    }
}

impl OpKernel for TopK {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (x, k) = (input(ctx, 0)?, input(ctx, 1)?);
        let k = scalar_k(ctx, &k, "scalar")?;
        if k < 0 {
            return Err(ctx.invalid(format!("Need k >= 0, got {k}")));
        }
        let Some(&cols) = x.dims().last() else {
            return Err(ctx.invalid(format!("input must be >= 1-D, got shape {}", x.shape())));
        };
        if (cols as i64) < k {
            return Err(ctx.invalid(format!(
                "input must have at least k columns. Had {cols}, needed {k}"
            )));
        }
        let k = k as usize;
        let mut dims = x.dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = k;
        checked_elements(ctx, &dims)?;
        let rows: usize = x.dims()[..x.rank() - 1].iter().product();
        let mut picked = vec![0usize; rows * k];
        let sorted = self.sorted;
        let values = dispatch_real!(ctx, x.dtype(), T => {
            let v = x.values::<T>()?;
            if k > 0 {
                // A heap of k costs about log2(k + 1) comparisons an element (TensorFlow's own
                // estimate, with 4 cycles a comparison).
                let cycles = cols as f64 * 4.0 * ((k + 1) as f64).log2();
                ctx.intra().for_chunks(&mut picked, k, cycles, |first, chunk| {
                    for (r, into) in chunk.chunks_exact_mut(k).enumerate() {
                        let row = &v[(first + r) * cols..][..cols];
                        top_k_row(row, sorted, into);
                    }
                });
            }
            let values: Vec<T> = picked
                .chunks_exact(k.max(1))
                .enumerate()
                .flat_map(|(r, p)| p.iter().map(move |&c| r * cols + c))
                .map(|at| v[at])
                .collect();
            Tensor::from_vec(Shape::new(dims.clone()), values)?
        });
        let indices = match self.index_type {
            DType::Int64 => {
                let i: Vec<i64> = picked.iter().map(|&c| c as i64).collect();
                Tensor::from_vec(Shape::new(dims), i)?
            }
            _ => {
                let i: Vec<i32> = picked.iter().map(|&c| c as i32).collect();
                Tensor::from_vec(Shape::new(dims), i)?
            }
        };
        ctx.set_output(0, values);
        ctx.set_output(1, indices);
        Ok(())
    }
}

/// Whether `v` is NaN (never for integers).
fn is_nan<T: PartialOrd>(v: T) -> bool {
    v.partial_cmp(&v).is_none()
}

/// The order of a row's entries, best first: larger values first (NaN first of all), and
/// among equal values the lower index.
fn order<T: Real>(row: &[T], a: usize, b: usize) -> Ordering {
    let (x, y) = (row[a], row[b]);
    match y.partial_cmp(&x) {
        Some(Ordering::Equal) => a.cmp(&b),
        Some(o) => o,
        None => match (is_nan(x), is_nan(y)) {
            (true, true) => a.cmp(&b),
            (true, false) => Ordering::Less,
            _ => Ordering::Greater,
        },
    }
}

/// Writes the indices of the `into.len()` best entries of `row` (`0 < k <= row.len()`) in
/// TensorFlow's order.
fn top_k_row<T: Real>(row: &[T], sorted: bool, into: &mut [usize]) {
    let (k, cols) = (into.len(), row.len());
    if k == 1 {
        // The first maximum, as TensorFlow's `k == 1` path finds it.
        let mut best = 0;
        for (c, &v) in row.iter().enumerate().skip(1) {
            if v > row[best] {
                best = c;
            }
        }
        into[0] = best;
        return;
    }
    let better = |a: &usize, b: &usize| order(row, *a, *b);
    if k == cols || sorted {
        let mut all: Vec<usize> = (0..cols).collect();
        if k < cols {
            all.select_nth_unstable_by(k - 1, better);
            all.truncate(k);
        }
        all.sort_unstable_by(better);
        into.copy_from_slice(&all);
        return;
    }
    let top = heap::top_n(cols, k, |a, b| order(row, a, b) == Ordering::Less);
    into.copy_from_slice(&top);
}

/// `gtl::TopN`'s unsorted result for indices `0..n` pushed in order, with libstdc++'s heap
/// algorithms (`std::make_heap`, `push_heap`, `pop_heap`), `better(a, b)` being TensorFlow's
/// "greater" comparator: the first `k + 1` indices are made a heap whose front is the worst,
/// which is dropped; each later index better than the front replaces it (`pop_heap`, then
/// `push_heap` of the newcomer). The heap's layout is the order TensorFlow returns.
mod heap {
    /// libstdc++'s `__push_heap`: moves `value` up from `hole` towards `top`.
    fn push_up(
        h: &mut [usize],
        mut hole: usize,
        top: usize,
        value: usize,
        less: &impl Fn(usize, usize) -> bool,
    ) {
        while hole > top {
            let parent = (hole - 1) / 2;
            if !less(h[parent], value) {
                break;
            }
            h[hole] = h[parent];
            hole = parent;
        }
        h[hole] = value;
    }

    /// libstdc++'s `__adjust_heap`: sinks the hole at `hole` to a leaf, then pushes `value`
    /// up into it.
    fn adjust(
        h: &mut [usize],
        mut hole: usize,
        value: usize,
        less: &impl Fn(usize, usize) -> bool,
    ) {
        let len = h.len();
        let top = hole;
        let mut child = hole;
        while child < len.saturating_sub(1) / 2 {
            child = 2 * (child + 1);
            if less(h[child], h[child - 1]) {
                child -= 1;
            }
            h[hole] = h[child];
            hole = child;
        }
        if len % 2 == 0 && len >= 2 && child == (len - 2) / 2 {
            child = 2 * (child + 1);
            h[hole] = h[child - 1];
            hole = child - 1;
        }
        push_up(h, hole, top, value, less);
    }

    fn make_heap(h: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
        if h.len() < 2 {
            return;
        }
        for parent in (0..=(h.len() - 2) / 2).rev() {
            let value = h[parent];
            adjust(h, parent, value, less);
        }
    }

    /// Moves the front to the end; the rest stays a heap.
    fn pop_heap(h: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
        if h.len() < 2 {
            return;
        }
        let last = h.len() - 1;
        let value = h[last];
        h[last] = h[0];
        adjust(&mut h[..last], 0, value, less);
    }

    /// Adds the last element to the heap before it.
    fn push_heap(h: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
        let last = h.len() - 1;
        push_up(h, last, 0, h[last], less);
    }

    /// The best `k` of `0..n` (`k < n`) in `gtl::TopN`'s unsorted order.
    pub(super) fn top_n(n: usize, k: usize, better: impl Fn(usize, usize) -> bool) -> Vec<usize> {
        let mut h: Vec<usize> = (0..=k).collect();
        make_heap(&mut h, &better);
        pop_heap(&mut h, &better);
        h.pop();
        for c in k + 1..n {
            if better(c, h[0]) {
                pop_heap(&mut h, &better);
                h[k - 1] = c;
                push_heap(&mut h, &better);
            }
        }
        h
    }
}

/// `InTopKV2(predictions, targets, k)`: whether `predictions[i, targets[i]]` is among the `k`
/// largest of row `i`, as TensorFlow decides it: fewer than `k` entries of the row are
/// strictly larger (ties all count as in), and a target out of range or a row holding a NaN
/// or an infinity gives false.
fn in_top_k(ctx: &mut OpContext<'_>) -> Result<()> {
    let (predictions, targets, k) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
    let k = scalar_k(ctx, &k, "0-D")?;
    if predictions.rank() != 2 {
        return Err(ctx.invalid("predictions must be 2-dimensional"));
    }
    if targets.rank() != 1 {
        return Err(ctx.invalid("targets must be 1-dimensional"));
    }
    let (rows, classes) = (predictions.dims()[0], predictions.dims()[1]);
    if rows != targets.dims()[0] {
        return Err(ctx.invalid(format!(
            "First dimension of predictions {rows} must match length of targets {}",
            targets.dims()[0]
        )));
    }
    let p = match predictions.dtype() {
        DType::Float => predictions.values::<f32>()?,
        other => {
            return Err(super::unsupported_dtype(ctx, other, &[DType::Float]));
        }
    };
    let targets = int_values(ctx, &targets, "targets")?;
    let out: Vec<bool> = targets
        .iter()
        .enumerate()
        .map(|(r, &t)| {
            let row = &p[r * classes..][..classes];
            let Some(&target) = usize::try_from(t).ok().and_then(|t| row.get(t)) else {
                return false;
            };
            if !target.is_finite() || row.iter().any(|v| !v.is_finite()) {
                return false;
            }
            let larger = row.iter().filter(|&&v| v > target).count();
            (larger as i64) < k
        })
        .collect();
    ctx.set_output(0, Tensor::from_vec(Shape::new(vec![rows]), out)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(row: &[f32], k: usize, sorted: bool) -> Vec<usize> {
        let mut into = vec![0; k];
        top_k_row(row, sorted, &mut into);
        into
    }

    #[test]
    fn ties_go_to_the_lower_index_and_unsorted_is_tensorflows_heap() {
        let row = [3.0, 1.0, 3.0, 5.0, 2.0, 5.0, 0.0, 3.0];
        assert_eq!(top(&row, 3, true), [3, 5, 0]);
        assert_eq!(top(&row, 8, true), [3, 5, 0, 2, 7, 4, 1, 6]);
        assert_eq!(top(&row, 1, true), [3]);
        // What TensorFlow 2.21 returns for these with sorted=False.
        assert_eq!(top(&row, 3, false), [0, 3, 5]);
        assert_eq!(top(&row, 8, false), [3, 5, 0, 2, 7, 4, 1, 6]);
        assert_eq!(
            top(&[0.775, 0.194, -1.63, -1.195, 0.884], 3, false),
            [1, 0, 4]
        );
        // -0 and 0 are equal.
        assert_eq!(top(&[-0.0, 0.0, 0.0, -0.0], 2, true), [0, 1]);
        // NaN sorts first, and no order panics.
        assert_eq!(top(&[1.0, f32::NAN, 3.0, 2.0], 2, true), [1, 2]);
        assert_eq!(top(&[f32::NAN, 1.0, f32::NAN, 2.0], 4, false).len(), 4);
    }
}
