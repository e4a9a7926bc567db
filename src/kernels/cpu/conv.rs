//! 2-D convolutions: `Conv2D` and its two gradients, `Conv2DBackpropInput` and
//! `Conv2DBackpropFilter`, for float32 and float64, in `NHWC` and `NCHW`, with strides,
//! dilations, `SAME` / `VALID` / `EXPLICIT` padding and grouped filters (an input depth that is
//! a multiple of the filter's).
//!
//! Each is one matrix product per group ([`super::gemm`]: the `gemm` crate for float32 and
//! float64) on an im2col matrix: one row per output pixel, one column per filter tap and input
//! channel (`kh, kw, c`, the order of a `HWIO` filter, so the filter is that matrix as it
//! lies). Forward: `patches @ filter`; filter gradient: `patches^T @ out_backprop`; input
//! gradient: `out_backprop @ filter^T` scattered back onto the input (col2im). A batch large
//! enough is split into one range of images per core, each built and multiplied on its own
//! thread (the filter gradient sums the ranges' parts), and within a range the patches are
//! built and multiplied a block of rows at a time, small enough to stay in the core's cache,
//! so memory stays bounded for any batch. `NCHW` values are
//! transposed to `NHWC` and back around the same code.
//!
//! Geometry and attr checks live in [`crate::graph::window`], shared with the shape functions.

use std::borrow::Cow;
use std::sync::Arc;

use ndarray::{s, ArrayView2, ArrayViewMut2};

use super::gemm::{matmul, RowsFn, Threads};
use super::numeric::Real;
use super::{checked_elements, input, int_values, same_dtype};
use crate::error::Result;
use crate::graph::window::{ConvAttrs, DataFormat, WindowDim};
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::intra::{split, IntraPool};
use crate::tensor::{Shape, Tensor};

/// The most elements of patches built at once for the forward pass and the input gradient
/// (128 Ki: 512 KiB of float32), so that a block of patch rows is still in the core's cache
/// when the product reads it.
const PATCH_ELEMENTS: usize = 1 << 17;

/// The same for the filter gradient (4 Mi: 16 MiB of float32), whose product sums over the
/// patch rows into the whole filter: fewer, longer sums beat cache-sized blocks there.
const FILTER_PATCH_ELEMENTS: usize = 1 << 22;

/// Which of a convolution's three ops a kernel computes: the op or one of its two gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    BackpropInput,
    BackpropFilter,
}

/// A family of convolutions (`Conv2D`, `DepthwiseConv2dNative`): the three passes over its
/// checked attrs. [`create`] makes its kernels and [`compute`] runs them, so the families
/// share reading the inputs, checking their dtypes and dispatching on them.
pub(super) trait Convolution: Send + Sync + Sized + 'static {
    /// The kernel for `pass` with these attrs.
    fn new(attrs: ConvAttrs, pass: Pass) -> Self;
    /// Which op the kernel computes.
    fn pass(&self) -> Pass;
    /// `op(x, filter)`.
    fn forward<T: Real>(&self, ctx: &OpContext<'_>, x: &Tensor, f: &Tensor) -> Result<Tensor>;
    /// The input's gradient, from the input's sizes, the filter and the output's gradient.
    fn backprop_input<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        sizes: &Tensor,
        f: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor>;
    /// The filter's gradient, from the input, the filter's sizes and the output's gradient.
    fn backprop_filter<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
        sizes: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor>;
}

/// The kernel of family `K` for `pass`, its attrs checked once.
pub(super) fn create<K: Convolution>(node: &NodeDef, pass: Pass) -> Result<Arc<dyn OpKernel>> {
    Ok(Arc::new(Kernel(K::new(ConvAttrs::of(node)?, pass))))
}

/// A convolution family's kernel.
pub(super) struct Kernel<K>(K);

impl<K: Convolution> OpKernel for Kernel<K> {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let k = &self.0;
        let (a, b) = (input(ctx, 0)?, input(ctx, 1)?);
        let out = match k.pass() {
            Pass::Forward => {
                same_dtype(ctx, &a, &b)?;
                dispatch_float!(ctx, a.dtype(), T => k.forward::<T>(ctx, &a, &b)?)
            }
            Pass::BackpropInput => {
                let dy = input(ctx, 2)?;
                same_dtype(ctx, &b, &dy)?;
                dispatch_float!(ctx, b.dtype(), T => k.backprop_input::<T>(ctx, &a, &b, &dy)?)
            }
            Pass::BackpropFilter => {
                let dy = input(ctx, 2)?;
                same_dtype(ctx, &a, &dy)?;
                dispatch_float!(ctx, a.dtype(), T => k.backprop_filter::<T>(ctx, &a, &b, &dy)?)
            }
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// `Conv2D`, `Conv2DBackpropInput` or `Conv2DBackpropFilter`, with its checked attrs.
pub(super) struct Conv2D {
    attrs: ConvAttrs,
    pass: Pass,
}

/// The sizes of one convolution, in `NHWC` terms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    batch: usize,
    in_h: usize,
    in_w: usize,
    in_c: usize,
    /// The filter's (height, width, input depth, output depth).
    filter: [usize; 4],
    groups: usize,
    dims: [WindowDim; 2],
}

impl Geometry {
    fn out_h(&self) -> usize {
        self.dims[0].output
    }
    fn out_w(&self) -> usize {
        self.dims[1].output
    }
    fn out_c(&self) -> usize {
        self.filter[3]
    }
    /// Columns of the patch matrix: taps times the input channels of one group.
    fn k(&self) -> usize {
        self.filter[0] * self.filter[1] * self.filter[2]
    }
    /// Output channels per group.
    fn group_out(&self) -> usize {
        self.out_c() / self.groups
    }
    /// Output pixels (patch rows) built at once, for blocks of at most `elements` values.
    fn rows_per_block(&self, elements: usize) -> usize {
        (elements / self.k().max(1)).max(1)
    }
    /// The output's (or out_backprop's) dims in `format`.
    fn output_dims(&self, format: DataFormat) -> [usize; 4] {
        format.from_nhwc([self.batch, self.out_h(), self.out_w(), self.out_c()])
    }
}

impl Conv2D {
    /// `Conv2D(x, f)`, then `epilogue` on each block of its output rows (`[pixels,
    /// out_channels]` in NHWC order, whatever the data format, while the block is in cache):
    /// what a fused kernel does to the product where it lies (a bias, an activation).
    pub(super) fn forward_with<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
        f: &Tensor,
        epilogue: Option<RowsFn<'_, T>>,
    ) -> Result<Tensor> {
        let format = self.attrs.format;
        let g = check_forward(&self.attrs, ctx, x, f)?;
        let out_dims = g.output_dims(format);
        let xv = x.values::<T>()?;
        let xs = to_nhwc(format, x.dims(), &xv);
        let fv = f.values::<T>()?;
        let (m_img, k, oc, og) = (g.out_h() * g.out_w(), g.k(), g.out_c(), g.group_out());
        let mut out = vec![T::zero(); g.batch * m_img * oc];
        let intra = ctx.intra();
        let threads = product_threads(&g, intra);
        in_pieces(&g, intra, &mut out, m_img * oc, |n0, n1, part| {
            let mut patches = Vec::new();
            let first = n0 * m_img;
            for_blocks(&g, n0, n1, PATCH_ELEMENTS, |r0, r1| {
                let rows = r1 - r0;
                let chunk = &mut part[(r0 - first) * oc..(r1 - first) * oc];
                for group in 0..g.groups {
                    im2col(&xs, &g, r0, r1, group, &mut patches);
                    let a = ArrayView2::from_shape((rows, k), &patches[..]).expect("patch matrix");
                    let w = ArrayView2::from_shape((k, oc), &fv[..]).expect("filter matrix");
                    let w = w.slice(s![.., group * og..(group + 1) * og]);
                    let o =
                        ArrayViewMut2::from_shape((rows, oc), &mut *chunk).expect("output rows");
                    let mut o = o.slice_move(s![.., group * og..(group + 1) * og]);
                    matmul(&a, &w, &mut o, false, threads);
                }
                if let Some(epilogue) = epilogue {
                    epilogue(chunk);
                }
            });
        });
        let nhwc = [g.batch, g.out_h(), g.out_w(), oc];
        Tensor::from_vec(Shape::new(out_dims.to_vec()), from_nhwc(format, nhwc, out))
    }
}

impl Convolution for Conv2D {
    fn new(attrs: ConvAttrs, pass: Pass) -> Self {
        Self { attrs, pass }
    }

    fn pass(&self) -> Pass {
        self.pass
    }

    fn forward<T: Real>(&self, ctx: &OpContext<'_>, x: &Tensor, f: &Tensor) -> Result<Tensor> {
        self.forward_with::<T>(ctx, x, f, None)
    }

    fn backprop_input<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        sizes: &Tensor,
        f: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let format = self.attrs.format;
        let (input_dims, g) = check_backprop_input(&self.attrs, ctx, sizes, f, dy)?;
        let fv = f.values::<T>()?;
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(format, dy.dims(), &dyv);
        let (k, oc, og) = (g.k(), g.out_c(), g.group_out());
        let image = g.in_h * g.in_w * g.in_c;
        let mut dx = vec![T::zero(); g.batch * image];
        let intra = ctx.intra();
        let threads = product_threads(&g, intra);
        in_pieces(&g, intra, &mut dx, image, |n0, n1, part| {
            let mut patches = Vec::new();
            for_blocks(&g, n0, n1, PATCH_ELEMENTS, |r0, r1| {
                let rows = r1 - r0;
                let d = ArrayView2::from_shape((rows, oc), &dys[r0 * oc..r1 * oc])
                    .expect("out_backprop rows");
                let w = ArrayView2::from_shape((k, oc), &fv[..]).expect("filter matrix");
                for group in 0..g.groups {
                    let cols = s![.., group * og..(group + 1) * og];
                    // Overwritten whole by the product: only its length matters.
                    patches.resize(rows * k, T::zero());
                    let mut p = ArrayViewMut2::from_shape((rows, k), &mut patches[..])
                        .expect("patch matrix");
                    matmul(&d.slice(cols), &w.slice(cols).t(), &mut p, false, threads);
                    col2im(&patches, &g, r0, r1, group, part, n0);
                }
            });
        });
        let nhwc = [g.batch, g.in_h, g.in_w, g.in_c];
        Tensor::from_vec(Shape::new(input_dims), from_nhwc(format, nhwc, dx))
    }

    fn backprop_filter<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
        sizes: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let format = self.attrs.format;
        let (filter_dims, g) = check_backprop_filter(&self.attrs, ctx, x, sizes, dy)?;
        let xv = x.values::<T>()?;
        let xs = to_nhwc(format, x.dims(), &xv);
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(format, dy.dims(), &dyv);
        let (k, oc, og) = (g.k(), g.out_c(), g.group_out());
        // Each range of images sums its part of the gradient; the parts are added.
        let intra = ctx.intra();
        let threads = product_threads(&g, intra);
        let parts = map_pieces(&g, intra, |n0, n1| {
            let mut dw = vec![T::zero(); k * oc];
            let mut patches = Vec::new();
            for_blocks(&g, n0, n1, FILTER_PATCH_ELEMENTS, |r0, r1| {
                let rows = r1 - r0;
                let d = ArrayView2::from_shape((rows, oc), &dys[r0 * oc..r1 * oc])
                    .expect("out_backprop rows");
                for group in 0..g.groups {
                    let cols = s![.., group * og..(group + 1) * og];
                    im2col(&xs, &g, r0, r1, group, &mut patches);
                    let a = ArrayView2::from_shape((rows, k), &patches[..]).expect("patch matrix");
                    let w = ArrayViewMut2::from_shape((k, oc), &mut dw[..]).expect("filter matrix");
                    let mut w = w.slice_move(cols);
                    matmul(&a.t(), &d.slice(cols), &mut w, true, threads);
                }
            });
            dw
        });
        Tensor::from_vec(Shape::new(filter_dims), sum_parts(parts))
    }
}

/// The element-wise sum of a filter gradient's parts (one per range of images, at least one).
pub(super) fn sum_parts<T: Real>(mut parts: Vec<Vec<T>>) -> Vec<T> {
    let mut sum = parts.swap_remove(0);
    for part in parts {
        for (total, v) in sum.iter_mut().zip(part) {
            *total = Real::add(*total, v);
        }
    }
    sum
}

/// Checks `Conv2D`'s input and filter as TensorFlow does, in its words; returns the
/// convolution's geometry. The GPU kernel checks with it too, so bad input reads the same on
/// either device.
pub(crate) fn check_forward(
    attrs: &ConvAttrs,
    ctx: &OpContext<'_>,
    x: &Tensor,
    f: &Tensor,
) -> Result<Geometry> {
    check_rank4(ctx, x, "input")?;
    check_rank4(ctx, f, "filter")?;
    let g = geometry(attrs, ctx, attrs.format.nhwc(x.dims()), f.dims())?;
    checked_elements(ctx, &g.output_dims(attrs.format))?;
    Ok(g)
}

/// Checks `Conv2DBackpropInput`'s `input_sizes`, filter and `out_backprop` as
/// [`check_forward`] does; returns the input's dims and the convolution's geometry.
pub(crate) fn check_backprop_input(
    attrs: &ConvAttrs,
    ctx: &OpContext<'_>,
    sizes: &Tensor,
    f: &Tensor,
    dy: &Tensor,
) -> Result<(Vec<usize>, Geometry)> {
    let op = &ctx.node().op;
    if sizes.rank() != 1 {
        return Err(ctx.invalid(format!(
            "{op}: input_sizes input must be 1-dim, not {}",
            sizes.rank()
        )));
    }
    let input_dims = sizes_of(ctx, sizes, "input_sizes")?;
    check_rank4(ctx, f, "filter")?;
    check_rank4(ctx, dy, "out_backprop")?;
    checked_elements(ctx, &input_dims)?;
    let g = geometry(attrs, ctx, attrs.format.nhwc(&input_dims), f.dims())?;
    check_out_backprop(attrs, ctx, &g, dy)?;
    Ok((input_dims, g))
}

/// Checks `Conv2DBackpropFilter`'s input, `filter_sizes` and `out_backprop` as
/// [`check_forward`] does; returns the filter's dims and the convolution's geometry.
pub(crate) fn check_backprop_filter(
    attrs: &ConvAttrs,
    ctx: &OpContext<'_>,
    x: &Tensor,
    sizes: &Tensor,
    dy: &Tensor,
) -> Result<(Vec<usize>, Geometry)> {
    let op = &ctx.node().op;
    if sizes.rank() != 1 {
        return Err(ctx.invalid(format!(
            "{op}: filter_sizes input must be 1-dim, not {}",
            sizes.rank()
        )));
    }
    let filter_dims = sizes_of(ctx, sizes, "filter_sizes")?;
    check_rank4(ctx, x, "input")?;
    check_rank4(ctx, dy, "out_backprop")?;
    checked_elements(ctx, &filter_dims)?;
    let g = geometry(attrs, ctx, attrs.format.nhwc(x.dims()), &filter_dims)?;
    check_out_backprop(attrs, ctx, &g, dy)?;
    Ok((filter_dims, g))
}

/// Checks the filter against the input's `NHWC` dims and computes the geometry, with
/// TensorFlow's messages.
fn geometry(
    attrs: &ConvAttrs,
    ctx: &OpContext<'_>,
    input: [usize; 4],
    filter: &[usize],
) -> Result<Geometry> {
    let [batch, in_h, in_w, in_c] = input;
    let filter = [filter[0], filter[1], filter[2], filter[3]];
    let depth = filter[2];
    if depth == 0 {
        return Err(ctx.invalid(format!(
            "filter depth must be stricly positive, got 0 (filter shape {})",
            Shape::new(filter.to_vec())
        )));
    }
    if in_c % depth != 0 {
        return Err(ctx.invalid(format!(
            "input depth must be evenly divisible by filter depth: {in_c} vs {depth}"
        )));
    }
    let groups = in_c / depth;
    if groups == 0 || filter[3] % groups != 0 {
        return Err(ctx.invalid(format!(
            "output depth must be evenly divisible by number of groups: {} vs {groups}",
            filter[3]
        )));
    }
    let dims = attrs
        .dims([in_h, in_w], [filter[0], filter[1]])
        .map_err(|e| ctx.named(e))?;
    Ok(Geometry {
        batch,
        in_h,
        in_w,
        in_c,
        filter,
        groups,
        dims,
    })
}

/// Checks that `out_backprop` has the dims the forward convolution would give.
fn check_out_backprop(
    attrs: &ConvAttrs,
    ctx: &OpContext<'_>,
    g: &Geometry,
    dy: &Tensor,
) -> Result<()> {
    let op = &ctx.node().op;
    let format = attrs.format;
    let [n, h, w, c] = format.nhwc(dy.dims());
    if n != g.batch {
        return Err(ctx.invalid(format!(
            "{op}: input and out_backprop must have the same batch size. Input batch: {}, \
             outbackprop batch: {n}, batch_dim: 0",
            g.batch
        )));
    }
    for (a, actual) in [h, w].into_iter().enumerate() {
        let d = &g.dims[a];
        if actual != d.output {
            return Err(ctx.invalid(format!(
                "{op}: Size of out_backprop doesn't match computed: actual = {actual}, \
                 computed = {} spatial_dim: {} input: {} filter: {} output: {actual} \
                 stride: {} dilation: {}",
                d.output,
                format.axes()[a + 1],
                d.input,
                d.window,
                d.stride,
                d.dilation
            )));
        }
    }
    if c != g.out_c() {
        return Err(ctx.invalid(format!(
            "{op}: filter and out_backprop must have the same out_depth ({} vs. {c})",
            g.out_c()
        )));
    }
    Ok(())
}

/// Fails unless `t` is 4-D, naming it as TensorFlow does.
pub(super) fn check_rank4(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<()> {
    if t.rank() != 4 {
        return Err(ctx.invalid(format!("{what} must be 4-dimensional: {}", t.shape())));
    }
    Ok(())
}

/// Reads a 4-element shape input (`input_sizes`, `filter_sizes`, `orig_input_shape`).
pub(super) fn sizes_of(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<Vec<usize>> {
    let values = int_values(ctx, t, what)?;
    if values.len() != 4 || values.iter().any(|&v| v < 0) {
        return Err(ctx.invalid(format!(
            "{what} must hold 4 non-negative sizes, got {values:?}"
        )));
    }
    Ok(values.into_iter().map(|v| v as usize).collect())
}

/// Cycles one multiply-add of a convolution costs, patch copies included, for the pool's
/// cost model.
const CYCLES_PER_MULTIPLY_ADD: f64 = 0.25;

/// The ranges of images the convolution of `g` runs in: one per intra-op thread its work is
/// worth, at most one per image.
fn image_ranges(g: &Geometry, intra: &IntraPool) -> Vec<(usize, usize)> {
    let per_image = g.out_h() * g.out_w() * g.k() * g.out_c();
    let pieces = intra.pieces(g.batch, per_image as f64 * CYCLES_PER_MULTIPLY_ADD);
    split(g.batch, pieces).map(|r| (r.start, r.end)).collect()
}

/// How the products inside a convolution use the threads: split over the pool when the
/// images are not (a batch of one large image), else one thread each.
fn product_threads<'a>(g: &Geometry, intra: &'a IntraPool) -> Threads<'a> {
    if image_ranges(g, intra).len() > 1 {
        Threads::One
    } else {
        Threads::Pool(intra)
    }
}

/// Cuts `out` (`per_image` values per image of `g`'s batch) at [`image_ranges`] and runs
/// `f(n0, n1, part)` for each range on the intra-op pool, `part` holding images `n0..n1`.
fn in_pieces<T: Send>(
    g: &Geometry,
    intra: &IntraPool,
    out: &mut [T],
    per_image: usize,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    let mut rest = out;
    let mut parts = Vec::new();
    for (n0, n1) in image_ranges(g, intra) {
        let (part, tail) = rest.split_at_mut((n1 - n0) * per_image);
        parts.push((n0, n1, part));
        rest = tail;
    }
    intra.map(parts, |(n0, n1, part)| f(n0, n1, part));
}

/// Runs `f(n0, n1)` for each of [`image_ranges`] on the intra-op pool; returns their results
/// in order.
fn map_pieces<R: Send>(
    g: &Geometry,
    intra: &IntraPool,
    f: impl Fn(usize, usize) -> R + Sync,
) -> Vec<R> {
    intra.map(image_ranges(g, intra), |(n0, n1)| f(n0, n1))
}

/// Calls `f(r0, r1)` for consecutive blocks of the patch rows (output pixels, numbered over
/// the whole batch) of images `n0..n1`, each of at most `elements` patch values.
fn for_blocks(
    g: &Geometry,
    n0: usize,
    n1: usize,
    elements: usize,
    mut f: impl FnMut(usize, usize),
) {
    let per_image = g.out_h() * g.out_w();
    let (mut r0, end) = (n0 * per_image, n1 * per_image);
    let step = g.rows_per_block(elements);
    while r0 < end {
        let r1 = (r0 + step).min(end);
        f(r0, r1);
        r0 = r1;
    }
}

/// Builds rows `r0..r1` of the batch's patch matrix for one group's input channels: a row per
/// output pixel, `(kh, kw, c)` columns, zeros where a tap falls in the padding.
fn im2col<T: Real>(x: &[T], g: &Geometry, r0: usize, r1: usize, group: usize, out: &mut Vec<T>) {
    let [kh, kw, depth, _] = g.filter;
    let (oh, ow, k) = (g.out_h(), g.out_w(), g.k());
    let c0 = group * depth;
    // Each value is written once: copied from the input, or zero where a tap falls in the
    // padding (no zero-filling of the whole matrix first).
    out.clear();
    out.reserve((r1 - r0) * k);
    for r in r0..r1 {
        let (n, pixel) = (r / (oh * ow), r % (oh * ow));
        let (y, x_) = (pixel / ow, pixel % ow);
        for i in 0..kh {
            let Some(ih) = g.dims[0].tap(y, i) else {
                out.resize(out.len() + kw * depth, T::zero());
                continue;
            };
            let at = |iw: usize| ((n * g.in_h + ih) * g.in_w + iw) * g.in_c + c0;
            match row_taps(g, x_) {
                Some((j0, j1, iw0)) => {
                    out.resize(out.len() + j0 * depth, T::zero());
                    if j1 > j0 {
                        out.extend_from_slice(&x[at(iw0)..at(iw0) + (j1 - j0) * depth]);
                    }
                    out.resize(out.len() + (kw - j1) * depth, T::zero());
                }
                None => {
                    for j in 0..kw {
                        match g.dims[1].tap(x_, j) {
                            Some(iw) => out.extend_from_slice(&x[at(iw)..at(iw) + depth]),
                            None => out.resize(out.len() + depth, T::zero()),
                        }
                    }
                }
            }
        }
    }
}

/// When the taps of one filter row at output column `x_` lie next to each other in the input
/// (no dilation across the row, every input channel in the group): `(j0, j1, iw0)`, the taps
/// `j0..j1` inside the input, from input column `iw0` on; the others fall in the padding.
fn row_taps(g: &Geometry, x_: usize) -> Option<(usize, usize, usize)> {
    let d = &g.dims[1];
    if d.dilation != 1 || g.filter[2] != g.in_c {
        return None;
    }
    let kw = g.filter[1];
    let start = x_ * d.stride;
    let j0 = d.pad_before.saturating_sub(start).min(kw);
    let j1 = (d.input + d.pad_before).saturating_sub(start).clamp(j0, kw);
    Some((j0, j1, (start + j0).saturating_sub(d.pad_before)))
}

/// Adds rows `r0..r1` of a patch matrix (as [`im2col`] lays it out) back onto the input
/// positions they came from, in `dx`, which holds the images from image `first` on.
fn col2im<T: Real>(
    patches: &[T],
    g: &Geometry,
    r0: usize,
    r1: usize,
    group: usize,
    dx: &mut [T],
    first: usize,
) {
    let [kh, kw, depth, _] = g.filter;
    let (oh, ow, k) = (g.out_h(), g.out_w(), g.k());
    let c0 = group * depth;
    let add = |dst: &mut [T], src: &[T]| {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = Real::add(*d, v);
        }
    };
    for (r, row) in (r0..r1).zip(patches.chunks_exact(k.max(1))) {
        let (n, pixel) = (r / (oh * ow) - first, r % (oh * ow));
        let (y, x_) = (pixel / ow, pixel % ow);
        for i in 0..kh {
            let Some(ih) = g.dims[0].tap(y, i) else {
                continue;
            };
            let at = |iw: usize| ((n * g.in_h + ih) * g.in_w + iw) * g.in_c + c0;
            let taps = &row[i * kw * depth..(i + 1) * kw * depth];
            match row_taps(g, x_) {
                Some((j0, j1, iw0)) if j1 > j0 => {
                    let len = (j1 - j0) * depth;
                    add(
                        &mut dx[at(iw0)..at(iw0) + len],
                        &taps[j0 * depth..j0 * depth + len],
                    );
                }
                Some(_) => {}
                None => {
                    for j in 0..kw {
                        if let Some(iw) = g.dims[1].tap(x_, j) {
                            add(
                                &mut dx[at(iw)..at(iw) + depth],
                                &taps[j * depth..(j + 1) * depth],
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The values of a 4-D tensor in `format`, laid out `NHWC` (borrowed when they already are).
pub(super) fn to_nhwc<'a, T: Copy>(format: DataFormat, dims: &[usize], v: &'a [T]) -> Cow<'a, [T]> {
    match format {
        DataFormat::Nhwc => Cow::Borrowed(v),
        DataFormat::Nchw => {
            let [n, c, h, w] = [dims[0], dims[1], dims[2], dims[3]];
            let mut out = Vec::with_capacity(v.len());
            for b in 0..n {
                for y in 0..h {
                    for x in 0..w {
                        out.extend((0..c).map(|ch| v[((b * c + ch) * h + y) * w + x]));
                    }
                }
            }
            Cow::Owned(out)
        }
    }
}

/// Lays out `NHWC` values of dims `nhwc` in `format`.
pub(super) fn from_nhwc<T: Copy>(format: DataFormat, nhwc: [usize; 4], v: Vec<T>) -> Vec<T> {
    match format {
        DataFormat::Nhwc => v,
        DataFormat::Nchw => {
            let [n, h, w, c] = nhwc;
            let mut out = Vec::with_capacity(v.len());
            for b in 0..n {
                for ch in 0..c {
                    for y in 0..h {
                        out.extend((0..w).map(|x| v[((b * h + y) * w + x) * c + ch]));
                    }
                }
            }
            out
        }
    }
}
