//! 2-D pooling: `MaxPool`, `MaxPoolV2` (window and strides as inputs), their gradients
//! `MaxPoolGrad` and `MaxPoolGradV2`, `AvgPool` and `AvgPoolGrad`, in `NHWC` and `NCHW`, with
//! `SAME` and `VALID` padding (and `EXPLICIT` for `MaxPool`).
//!
//! Max pooling skips padded positions; its gradient goes to the first maximum of each window
//! in row-major window order (the earliest row, then column), as TensorFlow's CPU kernel
//! (`SpatialMaxPoolWithArgMaxHelper`) breaks ties. Average pooling divides by the number of
//! window positions inside the input, not the window's size, so `SAME` borders average only
//! real values; its gradient spreads each output's gradient evenly over those positions.
//! `NCHW` values are transposed to `NHWC` and back.

use std::sync::Arc;

use super::conv::{check_rank4, from_nhwc, sizes_of, to_nhwc};
use super::numeric::Real;
use super::{checked_elements, input, int_values, same_dtype};
use crate::error::Result;
use crate::graph::window::{PoolAttrs, WindowDim};
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Shape, Tensor};

/// Which pooling op a [`Pool`] kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolOp {
    Max,
    MaxGrad,
    Avg,
    AvgGrad,
}

/// A pooling kernel; `attrs` is `None` for the V2 ops, which read `ksize` and `strides` from
/// their inputs at every run.
pub(super) struct Pool {
    op: PoolOp,
    attrs: Option<PoolAttrs>,
}

impl Pool {
    fn parse(node: &NodeDef, op: PoolOp) -> Result<Arc<dyn OpKernel>> {
        let attrs = if node.op.ends_with("V2") {
            None
        } else {
            Some(PoolAttrs::of(node)?)
        };
        Ok(Arc::new(Pool { op, attrs }))
    }

    pub(super) fn create_max(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, PoolOp::Max)
    }

    pub(super) fn create_max_grad(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, PoolOp::MaxGrad)
    }

    pub(super) fn create_avg(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, PoolOp::Avg)
    }

    pub(super) fn create_avg_grad(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, PoolOp::AvgGrad)
    }

    /// The attrs, read from inputs `first` (ksize) and `first + 1` (strides) for V2 ops.
    fn attrs(&self, ctx: &OpContext<'_>, first: usize) -> Result<PoolAttrs> {
        if let Some(a) = &self.attrs {
            return Ok(a.clone());
        }
        let ksize = int_values(ctx, ctx.input(first)?, "ksize")?;
        let strides = int_values(ctx, ctx.input(first + 1)?, "strides")?;
        PoolAttrs::from_lists(ctx.node(), &ksize, &strides)
    }
}

/// The sizes of one pooling, in `NHWC` terms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    batch: usize,
    in_h: usize,
    in_w: usize,
    depth: usize,
    dims: [WindowDim; 2],
}

impl Geometry {
    fn new(ctx: &OpContext<'_>, attrs: &PoolAttrs, input_dims: &[usize]) -> Result<Geometry> {
        let [batch, in_h, in_w, depth] = attrs.format.nhwc(input_dims);
        let dims = attrs.dims([in_h, in_w]).map_err(|e| ctx.named(e))?;
        Ok(Geometry {
            batch,
            in_h,
            in_w,
            depth,
            dims,
        })
    }

    fn out_nhwc(&self) -> [usize; 4] {
        [
            self.batch,
            self.dims[0].output,
            self.dims[1].output,
            self.depth,
        ]
    }

    fn in_nhwc(&self) -> [usize; 4] {
        [self.batch, self.in_h, self.in_w, self.depth]
    }

    /// Calls `f(output pixel, input pixel)` for every window position inside the input, in
    /// row-major window order per output pixel; pixels are `NHWC` offsets of channel 0.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize)) {
        let [n, oh, ow, c] = self.out_nhwc();
        for b in 0..n {
            for y in 0..oh {
                for x in 0..ow {
                    let o = ((b * oh + y) * ow + x) * c;
                    for i in 0..self.dims[0].window {
                        let Some(iy) = self.dims[0].tap(y, i) else {
                            continue;
                        };
                        for j in 0..self.dims[1].window {
                            let Some(ix) = self.dims[1].tap(x, j) else {
                                continue;
                            };
                            f(o, ((b * self.in_h + iy) * self.in_w + ix) * c);
                        }
                    }
                }
            }
        }
    }
}

impl Geometry {
    /// The input offsets (`NHWC`, channel 0) of the window taps inside the input of output
    /// pixel `(y, x)` of image `n`, in row-major window order, into `taps`.
    fn window_taps(&self, n: usize, y: usize, x: usize, taps: &mut Vec<usize>) {
        taps.clear();
        for i in 0..self.dims[0].window {
            let Some(iy) = self.dims[0].tap(y, i) else {
                continue;
            };
            for j in 0..self.dims[1].window {
                if let Some(ix) = self.dims[1].tap(x, j) {
                    taps.push(((n * self.in_h + iy) * self.in_w + ix) * self.depth);
                }
            }
        }
    }

    /// Calls `f(o, taps)` for every output pixel of images `n0..n0 + images`: `o` its offset
    /// in those images' `NHWC` output (channel 0), `taps` as [`Self::window_taps`].
    fn for_each_window(&self, n0: usize, images: usize, mut f: impl FnMut(usize, &[usize])) {
        let [_, oh, ow, c] = self.out_nhwc();
        let mut taps = Vec::with_capacity(self.dims[0].window * self.dims[1].window);
        for b in 0..images {
            for y in 0..oh {
                for x in 0..ow {
                    self.window_taps(n0 + b, y, x, &mut taps);
                    f(((b * oh + y) * ow + x) * c, &taps);
                }
            }
        }
    }
}

/// Max pooling of images `n0..` of `NHWC` values `x` into `out` (as many images' outputs as it
/// holds). Each output pixel takes its first tap's channels whole, then each later tap's where
/// they are greater: TensorFlow's test `output < input || unset`, so a NaN stays only where it
/// came first. A window wholly in the padding gives `T::LOWEST`. The comparisons are selects,
/// which the compiler vectorizes over the channels.
fn max_images<T: Real>(x: &[T], g: &Geometry, n0: usize, out: &mut [T]) {
    let c = g.depth;
    let per_image = g.dims[0].output * g.dims[1].output * c;
    if per_image == 0 {
        return;
    }
    g.for_each_window(n0, out.len() / per_image, |o, taps| {
        let dst = &mut out[o..o + c];
        let Some((&first, rest)) = taps.split_first() else {
            dst.fill(T::LOWEST);
            return;
        };
        dst.copy_from_slice(&x[first..first + c]);
        for &at in rest {
            for (d, &v) in dst.iter_mut().zip(&x[at..at + c]) {
                *d = if *d < v { v } else { *d };
            }
        }
    });
}

/// MaxPoolGrad of images `n0..` into `dx` (their `NHWC` input gradient, zeros on entry): each
/// output's gradient `dy` added at the first maximum of its window in window order, the input
/// [`max_images`] took it from.
fn max_grad_images<T: Real>(x: &[T], dy: &[T], g: &Geometry, n0: usize, dx: &mut [T]) {
    let c = g.depth;
    let in_image = g.in_h * g.in_w * c;
    let out_image = g.dims[0].output * g.dims[1].output * c;
    if in_image == 0 || out_image == 0 {
        return;
    }
    let images = dx.len() / in_image;
    let base = n0 * in_image;
    let dy = &dy[n0 * out_image..(n0 + images) * out_image];
    // Per channel: the greatest value so far and which tap it was.
    let mut best = vec![T::LOWEST; c];
    let mut which = vec![0u32; c];
    g.for_each_window(n0, images, |o, taps| {
        let Some((&first, rest)) = taps.split_first() else {
            return;
        };
        best.copy_from_slice(&x[first..first + c]);
        which.fill(0);
        for (t, &at) in rest.iter().enumerate() {
            let t = t as u32 + 1;
            for ((b, w), &v) in best.iter_mut().zip(which.iter_mut()).zip(&x[at..at + c]) {
                let greater = *b < v;
                *b = if greater { v } else { *b };
                *w = if greater { t } else { *w };
            }
        }
        for (k, (&w, &d)) in which.iter().zip(&dy[o..o + c]).enumerate() {
            let at = taps[w as usize] + k - base;
            dx[at] = Real::add(dx[at], d);
        }
    });
}

/// Checks a forward pool's input (`MaxPool`, `AvgPool`) as TensorFlow does, in its words;
/// returns the pooling's geometry. The GPU kernels check with it too, so bad input reads the
/// same on either device.
pub(crate) fn check_pool(attrs: &PoolAttrs, ctx: &OpContext<'_>, x: &Tensor) -> Result<Geometry> {
    check_rank4(ctx, x, "tensor_in")?;
    let g = Geometry::new(ctx, attrs, x.dims())?;
    checked_elements(ctx, &g.out_nhwc())?;
    Ok(g)
}

/// Checks `MaxPoolGrad`'s original input and output and its gradient as [`check_pool`] does;
/// returns the pooling's geometry.
pub(crate) fn check_max_pool_grad(
    attrs: &PoolAttrs,
    ctx: &OpContext<'_>,
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
) -> Result<Geometry> {
    check_rank4(ctx, x, "tensor_in")?;
    check_rank4(ctx, y, "tensor_out")?;
    check_rank4(ctx, dy, "out_backprop")?;
    let g = Geometry::new(ctx, attrs, x.dims())?;
    let expected = Shape::new(attrs.format.from_nhwc(g.out_nhwc()).to_vec());
    for (name, t) in [("orig_output", y), ("grad", dy)] {
        if t.shape() != &expected {
            return Err(ctx.invalid(format!(
                "Expected {name} shape to be {expected}, but got {}",
                t.shape()
            )));
        }
    }
    Ok(g)
}

/// Checks `AvgPoolGrad`'s `orig_input_shape` and gradient as [`check_pool`] does; returns the
/// input's dims and the pooling's geometry.
pub(crate) fn check_avg_pool_grad(
    attrs: &PoolAttrs,
    ctx: &OpContext<'_>,
    sizes: &Tensor,
    dy: &Tensor,
) -> Result<(Vec<usize>, Geometry)> {
    if sizes.rank() != 1 {
        return Err(ctx.invalid(format!(
            "orig_input_shape must be 1-dimensional and 4 elements, got shape {}",
            sizes.shape()
        )));
    }
    let input_dims = sizes_of(ctx, sizes, "orig_input_shape")?;
    check_rank4(ctx, dy, "out_backprop")?;
    checked_elements(ctx, &input_dims)?;
    let g = Geometry::new(ctx, attrs, &input_dims)?;
    let expected = Shape::new(attrs.format.from_nhwc(g.out_nhwc()).to_vec());
    if dy.shape() != &expected {
        return Err(ctx.invalid(format!(
            "Expected grad shape to be {expected}, but got {}",
            dy.shape()
        )));
    }
    Ok((input_dims, g))
}

/// Cycles per output value of max pooling, per window tap, for the pool's cost model.
const CYCLES_PER_TAP: f64 = 1.0;

/// The number of window positions inside the input, per output pixel.
fn window_counts(g: &Geometry) -> Vec<usize> {
    let [n, oh, ow, _] = g.out_nhwc();
    let mut counts = vec![0usize; n * oh * ow];
    g.for_each_tap(|o, _| counts[o / g.depth.max(1)] += 1);
    counts
}

impl Pool {
    /// A forward pool: checks `x`, lays it out NHWC, has `pool` pool it over `g`'s windows
    /// into the NHWC output, and lays that back out in the node's format.
    fn forward<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
        pool: impl FnOnce(&[T], &Geometry) -> Vec<T>,
    ) -> Result<Tensor> {
        let attrs = self.attrs(ctx, 1)?;
        let g = check_pool(&attrs, ctx, x)?;
        let out_nhwc = g.out_nhwc();
        let xv = x.values::<T>()?;
        let out = pool(&to_nhwc(attrs.format, x.dims(), &xv), &g);
        let dims = attrs.format.from_nhwc(out_nhwc);
        Tensor::from_vec(
            Shape::new(dims.to_vec()),
            from_nhwc(attrs.format, out_nhwc, out),
        )
    }

    fn max<T: Real>(&self, ctx: &OpContext<'_>, x: &Tensor) -> Result<Tensor> {
        let intra = ctx.intra();
        self.forward(ctx, x, |xs: &[T], g| {
            let [_, oh, ow, c] = g.out_nhwc();
            let per_image = oh * ow * c;
            let mut out = vec![T::LOWEST; g.out_nhwc().iter().product()];
            let taps = (g.dims[0].window * g.dims[1].window) as f64;
            intra.for_chunks(
                &mut out,
                per_image,
                per_image as f64 * taps * CYCLES_PER_TAP,
                |n0, part| max_images(xs, g, n0, part),
            );
            out
        })
    }

    fn max_grad<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let attrs = self.attrs(ctx, 3)?;
        let g = check_max_pool_grad(&attrs, ctx, x, y, dy)?;
        let xv = x.values::<T>()?;
        let xs = to_nhwc(attrs.format, x.dims(), &xv);
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(attrs.format, dy.dims(), &dyv);
        let mut dx = vec![T::zero(); x.num_elements()];
        // Each image's gradient goes to its own inputs: images split over the threads, each
        // piece finding its windows' maxima and adding the output gradient there.
        let [_, oh, ow, c] = g.out_nhwc();
        let (out_image, in_image) = (oh * ow * c, g.in_h * g.in_w * g.depth);
        let taps = (g.dims[0].window * g.dims[1].window) as f64;
        let cost = out_image as f64 * (taps + 1.0) * CYCLES_PER_TAP;
        ctx.intra()
            .for_chunks(&mut dx, in_image.max(1), cost, |n0, part| {
                max_grad_images(&xs, &dys, &g, n0, part)
            });
        Tensor::from_vec(x.shape().clone(), from_nhwc(attrs.format, g.in_nhwc(), dx))
    }

    fn avg<T: Real>(&self, ctx: &OpContext<'_>, x: &Tensor) -> Result<Tensor> {
        self.forward(ctx, x, |xs: &[T], g| {
            let mut out = vec![T::zero(); g.out_nhwc().iter().product()];
            g.for_each_tap(|o, i| {
                for c in 0..g.depth {
                    out[o + c] = Real::add(out[o + c], xs[i + c]);
                }
            });
            let counts = window_counts(g);
            for (pixel, &n) in out.chunks_mut(g.depth.max(1)).zip(&counts) {
                for v in pixel {
                    *v = Real::div_count(*v, n.max(1));
                }
            }
            out
        })
    }

    fn avg_grad<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        sizes: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let attrs = self.attrs(ctx, 2)?;
        let (input_dims, g) = check_avg_pool_grad(&attrs, ctx, sizes, dy)?;
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(attrs.format, dy.dims(), &dyv);
        let counts = window_counts(&g);
        let mut dx = vec![T::zero(); input_dims.iter().product()];
        let depth = g.depth.max(1);
        g.for_each_tap(|o, i| {
            let n = counts[o / depth].max(1);
            for c in 0..g.depth {
                dx[i + c] = Real::add(dx[i + c], Real::div_count(dys[o + c], n));
            }
        });
        Tensor::from_vec(
            Shape::new(input_dims),
            from_nhwc(attrs.format, g.in_nhwc(), dx),
        )
    }
}

impl OpKernel for Pool {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let out = match self.op {
            PoolOp::Max => {
                let x = input(ctx, 0)?;
                dispatch_real!(ctx, x.dtype(), T => self.max::<T>(ctx, &x)?)
            }
            PoolOp::MaxGrad => {
                let (x, y, dy) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
                same_dtype(ctx, &x, &y)?;
                same_dtype(ctx, &x, &dy)?;
                dispatch_real!(ctx, x.dtype(), T => self.max_grad::<T>(ctx, &x, &y, &dy)?)
            }
            PoolOp::Avg => {
                let x = input(ctx, 0)?;
                dispatch_float!(ctx, x.dtype(), T => self.avg::<T>(ctx, &x)?)
            }
            PoolOp::AvgGrad => {
                let (sizes, dy) = (input(ctx, 0)?, input(ctx, 1)?);
                dispatch_float!(ctx, dy.dtype(), T => self.avg_grad::<T>(ctx, &sizes, &dy)?)
            }
        };
        ctx.set_output(0, out);
        Ok(())
    }
}
