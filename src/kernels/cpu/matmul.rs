//! Matrix products through the kernels' GEMM (`super::gemm`: the `gemm` crate for floats,
//! split over the device's intra-op threads): MatMul with `transpose_a` / `transpose_b`, and
//! BatchMatMulV2 with `adj_x` / `adj_y` and numpy-style broadcasting of the batch dimensions,
//! whose matrices are split over the threads when there are several.

use std::sync::Arc;

use ndarray::{ArrayView2, ArrayViewMut2, Ix2};

use super::broadcast::{broadcast_shape, broadcast_to, view};
use super::gemm::{matmul, RowsFn, Threads};
use super::numeric::Real;
use super::split::ELEMENT_CYCLES;
use super::{input, same_dtype};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Shape, Tensor};

/// MatMul: `a @ b` of two matrices, either transposed first.
pub(super) struct MatMul {
    transpose_a: bool,
    transpose_b: bool,
}

impl MatMul {
    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(MatMul::of(node)?))
    }

    /// The kernel of `node`'s attrs.
    pub(super) fn of(node: &NodeDef) -> Result<MatMul> {
        Ok(MatMul {
            transpose_a: attr::bool_or(node, "transpose_a", false)?,
            transpose_b: attr::bool_or(node, "transpose_b", false)?,
        })
    }

    /// The number of columns `a @ b` has, when `b` is a matrix.
    pub(super) fn columns(&self, b: &Tensor) -> Option<usize> {
        let dims = b.dims();
        (dims.len() == 2).then(|| dims[usize::from(!self.transpose_b)])
    }

    /// `a @ b`, then `rows` on chunks of its rows (whole rows, over the intra-op threads):
    /// what a fused kernel does to the product where it lies (a bias, an activation).
    pub(super) fn product_with<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        a: &Tensor,
        b: &Tensor,
        rows: Option<RowsFn<'_, T>>,
    ) -> Result<Tensor> {
        for (i, t) in [a, b].into_iter().enumerate() {
            if t.rank() != 2 {
                return Err(ctx.invalid(format!(
                    "In[{i}] is not a matrix. Instead it has shape {}",
                    t.shape()
                )));
            }
        }
        let av = a.values::<T>()?;
        let bv = b.values::<T>()?;
        let am = view(a.dims(), &av)
            .into_dimensionality::<Ix2>()
            .expect("rank checked");
        let bm = view(b.dims(), &bv)
            .into_dimensionality::<Ix2>()
            .expect("rank checked");
        let am = if self.transpose_a {
            am.reversed_axes()
        } else {
            am
        };
        let bm = if self.transpose_b {
            bm.reversed_axes()
        } else {
            bm
        };
        if am.ncols() != bm.nrows() {
            return Err(ctx.invalid(format!(
                "Matrix size-incompatible: In[0]: {}, In[1]: {} (transpose_a={}, transpose_b={})",
                a.shape(),
                b.shape(),
                self.transpose_a,
                self.transpose_b
            )));
        }
        let (m, n) = (am.nrows(), bm.ncols());
        let mut out = vec![T::zero(); m * n];
        let mut om = ArrayViewMut2::from_shape((m, n), &mut out[..]).expect("output matrix");
        matmul(&am, &bm, &mut om, false, Threads::Pool(ctx.intra()));
        if let (Some(rows), true) = (rows, n > 0) {
            ctx.intra()
                .for_chunks(&mut out, n, n as f64 * ELEMENT_CYCLES, |_, chunk| {
                    rows(chunk)
                });
        }
        Tensor::from_vec(Shape::new(vec![m, n]), out)
    }
}

impl OpKernel for MatMul {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (a, b) = (input(ctx, 0)?, input(ctx, 1)?);
        same_dtype(ctx, &a, &b)?;
        let out = dispatch_real!(ctx, a.dtype(), T => self.product_with::<T>(ctx, &a, &b, None)?);
        ctx.set_output(0, out);
        Ok(())
    }
}

/// BatchMatMulV2: matrix products over the last two dimensions, broadcasting the others.
pub(super) struct BatchMatMul {
    adj_x: bool,
    adj_y: bool,
}

impl BatchMatMul {
    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(BatchMatMul {
            adj_x: attr::bool_or(node, "adj_x", false)?,
            adj_y: attr::bool_or(node, "adj_y", false)?,
        }))
    }

    fn product<T: Real>(&self, ctx: &OpContext<'_>, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        for (name, t) in [("x", x), ("y", y)] {
            if t.rank() < 2 {
                return Err(ctx.invalid(format!(
                    "In[{}] ndims must be >= 2: {} (input {name} has shape {})",
                    usize::from(name == "y"),
                    t.rank(),
                    t.shape()
                )));
            }
        }
        let (rx, ry) = (x.rank(), y.rank());
        let (xr, xc) = (x.dims()[rx - 2], x.dims()[rx - 1]);
        let (yr, yc) = (y.dims()[ry - 2], y.dims()[ry - 1]);
        let (m, k) = if self.adj_x { (xc, xr) } else { (xr, xc) };
        let (k2, n) = if self.adj_y { (yc, yr) } else { (yr, yc) };
        if k != k2 {
            return Err(ctx.invalid(format!(
                "Matrix size-incompatible: In[0]: {}, In[1]: {} (adj_x={}, adj_y={})",
                x.shape(),
                y.shape(),
                self.adj_x,
                self.adj_y
            )));
        }
        let (bx, by) = (&x.dims()[..rx - 2], &y.dims()[..ry - 2]);
        let batch = broadcast_shape(bx, by).ok_or_else(|| {
            ctx.invalid(format!(
                "In[0] and In[1] must have compatible batch dimensions: {} vs. {}",
                x.shape(),
                y.shape()
            ))
        })?;
        let matrices: usize = batch.iter().product();
        if matrices == 0 || m * n == 0 {
            // Nothing to compute: an empty output, however large its batch (the index lists
            // below would be as long as the batch).
            let mut dims = batch;
            dims.extend([m, n]);
            return Tensor::from_vec(Shape::new(dims), Vec::<T>::new());
        }
        let nbx: usize = bx.iter().product();
        let nby: usize = by.iter().product();
        // For each output batch entry, which matrix of x and of y it multiplies.
        let xi =
            broadcast_to(&(0..nbx).collect::<Vec<_>>(), bx, &batch).expect("broadcast checked");
        let yi =
            broadcast_to(&(0..nby).collect::<Vec<_>>(), by, &batch).expect("broadcast checked");

        let xv = x.values::<T>()?;
        let yv = y.values::<T>()?;
        let mut out = vec![T::zero(); xi.len() * m * n];
        if m * n > 0 {
            // The batch's matrices split over the threads when there are several; a batch
            // of one splits its product instead.
            let intra = ctx.intra();
            let matrices = xi.len();
            let pieces = intra.pieces(matrices, (m * n * k) as f64 / 8.0);
            let threads = if pieces > 1 {
                Threads::One
            } else {
                Threads::Pool(intra)
            };
            let product = |b: usize, chunk: &mut [T]| {
                let xs = &xv[xi[b] * xr * xc..(xi[b] + 1) * xr * xc];
                let ys = &yv[yi[b] * yr * yc..(yi[b] + 1) * yr * yc];
                let a = ArrayView2::from_shape((xr, xc), xs).expect("matrix slice");
                let c = ArrayView2::from_shape((yr, yc), ys).expect("matrix slice");
                let a = if self.adj_x { a.reversed_axes() } else { a };
                let c = if self.adj_y { c.reversed_axes() } else { c };
                let mut o = ArrayViewMut2::from_shape((m, n), chunk).expect("output slice");
                matmul(&a, &c, &mut o, false, threads);
            };
            let mut chunks: Vec<(usize, &mut [T])> = out.chunks_mut(m * n).enumerate().collect();
            let per_piece = matrices.div_ceil(pieces);
            let mut groups = Vec::new();
            while !chunks.is_empty() {
                let rest = chunks.split_off(per_piece.min(chunks.len()));
                groups.push(std::mem::replace(&mut chunks, rest));
            }
            intra.map(groups, |group| {
                for (b, chunk) in group {
                    product(b, chunk);
                }
            });
        }
        let mut dims = batch;
        dims.extend([m, n]);
        Tensor::from_vec(Shape::new(dims), out)
    }
}

impl OpKernel for BatchMatMul {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
        same_dtype(ctx, &x, &y)?;
        let out = dispatch_real!(ctx, x.dtype(), T => self.product::<T>(ctx, &x, &y)?);
        ctx.set_output(0, out);
        Ok(())
    }
}
