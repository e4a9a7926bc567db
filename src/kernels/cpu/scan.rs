//! Cumulative sums and products along one axis: `Cumsum` and `Cumprod`, with TensorFlow's
//! `exclusive` (each element left out of its own total) and `reverse` (totals run from the
//! end) attrs.
//!
//! The input is seen as `[outer, n, inner]` around the axis. Each of the `outer` blocks is
//! scanned on its own, the blocks split over the intra-op pool; a block keeps one running
//! total per inner element and walks the axis in order, so the step is a plain loop over
//! `inner` elements that the compiler vectorizes (packed `addps`/`mulps` for float32 on x86-64,
//! checked once in the assembly), and the totals accumulate in the element type in order, as
//! Eigen's scan does.

use std::sync::Arc;

use super::numeric::Real;
use super::split::ELEMENT_CYCLES;
use super::{input, int_values};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::Tensor;

/// Returns the factory for a cumulative op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Cumsum" => |node| Scan::create(node, Combine::Sum),
        "Cumprod" => |node| Scan::create(node, Combine::Prod),
        _ => return None,
    };
    Some(factory)
}

/// What a scan accumulates.
#[derive(Clone, Copy)]
enum Combine {
    Sum,
    Prod,
}

/// `Cumsum(x, axis)` or `Cumprod(x, axis)`.
struct Scan {
    combine: Combine,
    exclusive: bool,
    reverse: bool,
}

impl Scan {
    fn create(node: &NodeDef, combine: Combine) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Scan {
            combine,
            exclusive: attr::bool_or(node, "exclusive", false)?,
            reverse: attr::bool_or(node, "reverse", false)?,
        }))
    }

    /// The scan of `values` seen as `[outer, n, inner]`.
    fn run<T: Real>(&self, ctx: &OpContext<'_>, values: &[T], n: usize, inner: usize) -> Vec<T> {
        // One instance of the loop per operation, so that it inlines and vectorizes.
        match self.combine {
            Combine::Sum => self.scan(ctx, values, n, inner, T::zero(), |a, b| Real::add(a, b)),
            Combine::Prod => self.scan(ctx, values, n, inner, T::one(), |a, b| Real::mul(a, b)),
        }
    }

    fn scan<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        values: &[T],
        n: usize,
        inner: usize,
        identity: T,
        op: impl Fn(T, T) -> T + Sync,
    ) -> Vec<T> {
        let block = n * inner;
        let mut out = vec![identity; values.len()];
        if block == 0 {
            return out;
        }
        let (exclusive, reverse) = (self.exclusive, self.reverse);
        let cycles = block as f64 * ELEMENT_CYCLES;
        ctx.intra()
            .for_chunks(&mut out, block, cycles, |first, chunk| {
                let mut total = vec![identity; inner];
                for (b, dst) in chunk.chunks_exact_mut(block).enumerate() {
                    let src = &values[(first + b) * block..][..block];
                    total.fill(identity);
                    for step in 0..n {
                        let i = if reverse { n - 1 - step } else { step };
                        let (from, to) =
                            (&src[i * inner..][..inner], &mut dst[i * inner..][..inner]);
                        if exclusive {
                            for ((t, o), &x) in total.iter_mut().zip(to).zip(from) {
                                *o = *t;
                                *t = op(*t, x);
                            }
                        } else {
                            for ((t, o), &x) in total.iter_mut().zip(to).zip(from) {
                                *t = op(*t, x);
                                *o = *t;
                            }
                        }
                    }
                }
            });
        out
    }
}

impl OpKernel for Scan {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (x, axis) = (input(ctx, 0)?, input(ctx, 1)?);
        if axis.rank() != 0 {
            return Err(ctx.invalid(format!(
                "ScanOp: axis must be a scalar, not {}",
                axis.shape()
            )));
        }
        let given = int_values(ctx, &axis, "axis")?[0];
        let rank = x.rank() as i64;
        let at = if given < 0 { given + rank } else { given };
        if !(0..rank).contains(&at) {
            // TensorFlow reports the axis after adding the rank to a negative one.
            return Err(ctx.invalid(format!(
                "ScanOp: Expected scan axis in the range [{}, {rank}), but got {at}",
                -rank
            )));
        }
        let at = at as usize;
        let n = x.dims()[at];
        let inner: usize = x.dims()[at + 1..].iter().product();
        let out = dispatch_real!(ctx, x.dtype(), T => {
            let values = x.values::<T>()?;
            Tensor::from_vec(x.shape().clone(), self.run::<T>(ctx, &values, n, inner))?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::resource::ResourceMgr;

    fn scan(combine: Combine, exclusive: bool, reverse: bool, x: &[i64], n: usize) -> Vec<i64> {
        let node = NodeDef::default();
        let resources = ResourceMgr::new();
        let ctx = OpContext::new(&node, vec![], &resources, "cpu", 1);
        let s = Scan {
            combine,
            exclusive,
            reverse,
        };
        s.run(&ctx, x, n, x.len() / n)
    }

    #[test]
    fn every_flag_along_the_outer_axis() {
        // [[1, 2], [3, 4], [5, 6]] scanned down the columns.
        let x = [1, 2, 3, 4, 5, 6];
        assert_eq!(scan(Combine::Sum, false, false, &x, 3), [1, 2, 4, 6, 9, 12]);
        assert_eq!(scan(Combine::Sum, true, false, &x, 3), [0, 0, 1, 2, 4, 6]);
        assert_eq!(scan(Combine::Sum, false, true, &x, 3), [9, 12, 8, 10, 5, 6]);
        assert_eq!(scan(Combine::Sum, true, true, &x, 3), [8, 10, 5, 6, 0, 0]);
        assert_eq!(
            scan(Combine::Prod, false, false, &x, 3),
            [1, 2, 3, 8, 15, 48]
        );
        assert_eq!(scan(Combine::Prod, true, true, &x, 3), [15, 24, 5, 6, 1, 1]);
    }
}
