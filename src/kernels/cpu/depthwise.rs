//! Depthwise 2-D convolutions: `DepthwiseConv2dNative` and its two gradients,
//! `DepthwiseConv2dNativeBackpropInput` and `DepthwiseConv2dNativeBackpropFilter`, for float32
//! and float64, in `NHWC` and `NCHW`, with strides, dilations and `SAME` / `VALID` /
//! `EXPLICIT` padding.
//!
//! The filter is `[kh, kw, in_depth, multiplier]`: input channel `c` is convolved with its own
//! `multiplier` filters into output channels `c * multiplier .. (c + 1) * multiplier`. That is
//! a grouped convolution with one input channel per group, but each group's matrix product
//! would be `kh * kw` deep, too thin for a GEMM to pay off, so the loops here are direct: per
//! output pixel and tap, one pass over the channels, contiguous in `NHWC` (a vectorizable
//! multiply-add when the multiplier is 1, as in MobileNet). The geometry, attr checks and
//! layout transposes are the ones [`super::conv`] uses ([`crate::graph::window`]).

use super::checked_elements;
use super::conv::{check_rank4, from_nhwc, sizes_of, to_nhwc, Convolution, Pass};
use super::numeric::Real;
use crate::error::Result;
use crate::graph::window::{ConvAttrs, WindowDim};
use crate::kernels::OpContext;
use crate::tensor::{Shape, Tensor};

/// `DepthwiseConv2dNative` or one of its backprops, with its checked attrs.
pub(super) struct Depthwise {
    attrs: ConvAttrs,
    pass: Pass,
}

/// The sizes of one depthwise convolution, in `NHWC` terms.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    batch: usize,
    in_h: usize,
    in_w: usize,
    in_c: usize,
    kh: usize,
    kw: usize,
    multiplier: usize,
    dims: [WindowDim; 2],
}

impl Geometry {
    fn out_c(&self) -> usize {
        self.in_c * self.multiplier
    }

    fn output_nhwc(&self) -> [usize; 4] {
        [
            self.batch,
            self.dims[0].output,
            self.dims[1].output,
            self.out_c(),
        ]
    }

    /// Calls `f(x_offset, y_offset, filter_offset)` for every (output pixel, tap inside the
    /// input) pair: the offsets of the input pixel's channels, the output pixel's channels and
    /// the tap's filter row, in `NHWC` / `HWIM` order.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        let (oh, ow, oc) = (self.dims[0].output, self.dims[1].output, self.out_c());
        if oc == 0 {
            // No channels (or a multiplier of 0): nothing to add, and no chunks to cut.
            return;
        }
        for n in 0..self.batch {
            for y in 0..oh {
                for x in 0..ow {
                    let out = ((n * oh + y) * ow + x) * oc;
                    for i in 0..self.kh {
                        let Some(ih) = self.dims[0].tap(y, i) else {
                            continue;
                        };
                        for j in 0..self.kw {
                            let Some(iw) = self.dims[1].tap(x, j) else {
                                continue;
                            };
                            let src = ((n * self.in_h + ih) * self.in_w + iw) * self.in_c;
                            f(src, out, (i * self.kw + j) * oc);
                        }
                    }
                }
            }
        }
    }
}

impl Depthwise {
    /// Checks the filter against the input's `NHWC` dims and computes the geometry.
    fn geometry(
        &self,
        ctx: &OpContext<'_>,
        input: [usize; 4],
        filter: &[usize],
        what: &str,
    ) -> Result<Geometry> {
        let [batch, in_h, in_w, in_c] = input;
        if filter[2] != in_c {
            return Err(ctx.invalid(if what.is_empty() {
                format!(
                    "input and filter must have the same depth: {in_c} vs {}",
                    filter[2]
                )
            } else {
                format!("{what}: input and filter must have the same in_depth")
            }));
        }
        let dims = self
            .attrs
            .dims([in_h, in_w], [filter[0], filter[1]])
            .map_err(|e| ctx.named(e))?;
        Ok(Geometry {
            batch,
            in_h,
            in_w,
            in_c,
            kh: filter[0],
            kw: filter[1],
            multiplier: filter[3],
            dims,
        })
    }

    /// Checks that `out_backprop` has the dims the forward convolution would give, with
    /// TensorFlow's messages.
    fn check_out_backprop(
        &self,
        ctx: &OpContext<'_>,
        g: &Geometry,
        dy: &Tensor,
        what: &str,
    ) -> Result<()> {
        let [n, h, w, c] = self.attrs.format.nhwc(dy.dims());
        if n != g.batch {
            return Err(ctx.invalid(format!(
                "{what}: input and out_backprop must have the same batch size"
            )));
        }
        for (actual, d, name) in [(h, &g.dims[0], "rows"), (w, &g.dims[1], "cols")] {
            if actual != d.output {
                return Err(ctx.invalid(format!(
                    "{what}: Number of {name} of out_backprop doesn't match computed: \
                     actual = {actual}, computed = {}",
                    d.output
                )));
            }
        }
        if c != g.out_c() {
            return Err(ctx.invalid(format!(
                "{what}: depth_multiplier * in_depth not equal to out_depth"
            )));
        }
        Ok(())
    }
}

impl Convolution for Depthwise {
    fn new(attrs: ConvAttrs, pass: Pass) -> Self {
        Self { attrs, pass }
    }

    fn pass(&self) -> Pass {
        self.pass
    }

    fn forward<T: Real>(&self, ctx: &OpContext<'_>, x: &Tensor, f: &Tensor) -> Result<Tensor> {
        let format = self.attrs.format;
        check_rank4(ctx, x, "input")?;
        check_rank4(ctx, f, "filter")?;
        let g = self.geometry(ctx, format.nhwc(x.dims()), f.dims(), "")?;
        let nhwc = g.output_nhwc();
        checked_elements(ctx, &nhwc)?;
        let xv = x.values::<T>()?;
        let xs = to_nhwc(format, x.dims(), &xv);
        let fv = f.values::<T>()?;
        let (c, m, oc) = (g.in_c, g.multiplier, g.out_c());
        let mut out = vec![T::zero(); nhwc.iter().product()];
        g.for_each_tap(|src, dst, tap| {
            let (xr, fr) = (&xs[src..src + c], &fv[tap..tap + oc]);
            let or = &mut out[dst..dst + oc];
            if m == 1 {
                for ((o, &xv), &fv) in or.iter_mut().zip(xr).zip(fr) {
                    *o = *o + xv * fv;
                }
            } else {
                for ((o, &xv), fr) in or.chunks_exact_mut(m).zip(xr).zip(fr.chunks_exact(m)) {
                    for (o, &fv) in o.iter_mut().zip(fr) {
                        *o = *o + xv * fv;
                    }
                }
            }
        });
        Tensor::from_vec(
            Shape::new(format.from_nhwc(nhwc).to_vec()),
            from_nhwc(format, nhwc, out),
        )
    }

    fn backprop_input<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        sizes: &Tensor,
        f: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let what = "DepthwiseConv2DBackpropInput";
        let format = self.attrs.format;
        if sizes.rank() != 1 {
            return Err(ctx.invalid(format!(
                "Conv2DBackpropInput: input_sizes input must be 1-dim, not {}",
                sizes.rank()
            )));
        }
        let input_dims = sizes_of(ctx, sizes, "input_sizes")?;
        check_rank4(ctx, f, "filter")?;
        check_rank4(ctx, dy, "out_backprop")?;
        checked_elements(ctx, &input_dims)?;
        let g = self.geometry(ctx, format.nhwc(&input_dims), f.dims(), what)?;
        self.check_out_backprop(ctx, &g, dy, what)?;
        let fv = f.values::<T>()?;
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(format, dy.dims(), &dyv);
        let (c, m, oc) = (g.in_c, g.multiplier, g.out_c());
        let mut dx = vec![T::zero(); g.batch * g.in_h * g.in_w * c];
        g.for_each_tap(|src, dst, tap| {
            let (dr, fr) = (&dys[dst..dst + oc], &fv[tap..tap + oc]);
            let xr = &mut dx[src..src + c];
            if m == 1 {
                for ((x, &d), &fv) in xr.iter_mut().zip(dr).zip(fr) {
                    *x = *x + d * fv;
                }
            } else {
                for ((x, d), fr) in xr
                    .iter_mut()
                    .zip(dr.chunks_exact(m))
                    .zip(fr.chunks_exact(m))
                {
                    *x = d.iter().zip(fr).fold(*x, |s, (&d, &fv)| s + d * fv);
                }
            }
        });
        let nhwc = [g.batch, g.in_h, g.in_w, c];
        Tensor::from_vec(Shape::new(input_dims), from_nhwc(format, nhwc, dx))
    }

    fn backprop_filter<T: Real>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
        sizes: &Tensor,
        dy: &Tensor,
    ) -> Result<Tensor> {
        let what = "DepthwiseConv2DBackpropFilter";
        let format = self.attrs.format;
        if sizes.rank() != 1 || sizes.dims()[0] != 4 {
            return Err(ctx.invalid(format!(
                "{what}: filter must be 4-dimensional, got filter_sizes of shape {}",
                sizes.shape()
            )));
        }
        let filter_dims = sizes_of(ctx, sizes, "filter_sizes")?;
        check_rank4(ctx, x, "input")?;
        check_rank4(ctx, dy, "out_backprop")?;
        checked_elements(ctx, &filter_dims)?;
        let g = self.geometry(ctx, format.nhwc(x.dims()), &filter_dims, what)?;
        self.check_out_backprop(ctx, &g, dy, what)?;
        let xv = x.values::<T>()?;
        let xs = to_nhwc(format, x.dims(), &xv);
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(format, dy.dims(), &dyv);
        let (c, m, oc) = (g.in_c, g.multiplier, g.out_c());
        let mut df = vec![T::zero(); g.kh * g.kw * oc];
        g.for_each_tap(|src, dst, tap| {
            let (xr, dr) = (&xs[src..src + c], &dys[dst..dst + oc]);
            let fr = &mut df[tap..tap + oc];
            if m == 1 {
                for ((f, &xv), &d) in fr.iter_mut().zip(xr).zip(dr) {
                    *f = *f + xv * d;
                }
            } else {
                for ((f, &xv), d) in fr.chunks_exact_mut(m).zip(xr).zip(dr.chunks_exact(m)) {
                    for (f, &d) in f.iter_mut().zip(d) {
                        *f = *f + xv * d;
                    }
                }
            }
        });
        Tensor::from_vec(Shape::new(filter_dims), df)
    }
}
