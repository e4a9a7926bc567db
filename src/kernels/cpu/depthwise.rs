//! Depthwise 2-D convolutions: `DepthwiseConv2dNative` and its two gradients,
//! `DepthwiseConv2dNativeBackpropInput` and `DepthwiseConv2dNativeBackpropFilter`, for float32
//! and float64, in `NHWC` and `NCHW`, with strides, dilations and `SAME` / `VALID` /
//! `EXPLICIT` padding.
//!
//! The filter is `[kh, kw, in_depth, multiplier]`: input channel `c` is convolved with its own
//! `multiplier` filters into output channels `c * multiplier .. (c + 1) * multiplier`. That is
//! a grouped convolution with one input channel per group, but each group's matrix product
//! would be `kh * kw` deep, too thin for a GEMM to pay off, so the loops here are direct: per
//! output pixel and tap, one multiply-add over the channels, contiguous in `NHWC`, compiled for
//! AVX2 where the CPU has it ([`lanes`]). With several filters per channel the input's
//! channels are first repeated once per filter, so the loop is the same one. The geometry,
//! attr checks and layout transposes are the ones [`super::conv`] uses
//! ([`crate::graph::window`]).
//!
//! Each pass splits over the intra-op pool by what its pieces write apart: the forward pass by
//! rows of output pixels, the input gradient by images (an output row's taps reach several
//! input rows), and the filter gradient by images too, each range of images summing a
//! gradient of its own that are then added, as the convolution's filter gradient does.

use std::borrow::Cow;
use std::ops::Range;

use super::checked_elements;
use super::conv::{check_rank4, from_nhwc, sizes_of, sum_parts, to_nhwc, Convolution, Pass};
use super::numeric::Real;
use super::split::lanes;
use crate::error::Result;
use crate::graph::window::{ConvAttrs, WindowDim};
use crate::kernels::OpContext;
use crate::runtime::intra::{split, IntraPool};
use crate::tensor::{Shape, Tensor};

/// Cycles one multiply-add of a depthwise convolution costs, for the pool's cost model: the
/// loads and store around it, over a tap's few channels.
const CYCLES_PER_MULTIPLY_ADD: f64 = 0.5;

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

    /// The same convolution with each input channel repeated once per filter: one filter per
    /// channel, so every pass is one multiply-add per output channel, contiguous.
    fn expanded(&self) -> Geometry {
        Geometry {
            in_c: self.out_c(),
            multiplier: 1,
            ..*self
        }
    }

    /// `x` (`NHWC`) and the geometry to convolve it with: as they are with one filter per
    /// channel, else with each channel repeated once per filter ([`Self::expanded`]), copied
    /// over the pool.
    fn one_filter_per_channel<'a, T: Real>(
        &self,
        intra: &IntraPool,
        x: Cow<'a, [T]>,
    ) -> (Cow<'a, [T]>, Geometry) {
        let m = self.multiplier;
        if m <= 1 {
            return (x, *self);
        }
        let mut repeated = vec![T::zero(); x.len() * m];
        intra.for_chunks(&mut repeated, m, m as f64, |first, part| {
            for (copies, &v) in part.chunks_exact_mut(m).zip(&x[first..]) {
                copies.fill(v);
            }
        });
        (Cow::Owned(repeated), self.expanded())
    }

    /// Values of one image of the input.
    fn in_image(&self) -> usize {
        self.in_h * self.in_w * self.in_c
    }

    /// Values of one row of output pixels.
    fn out_row(&self) -> usize {
        self.dims[1].output * self.out_c()
    }

    /// The pool's cost of one row of output pixels: its multiply-adds.
    fn row_cycles(&self) -> f64 {
        (self.out_row() * self.kh * self.kw) as f64 * CYCLES_PER_MULTIPLY_ADD
    }

    /// Calls `f(x_offset, y_offset, filter_offset)` for every (output pixel, tap inside the
    /// input) pair of the output pixel rows `rows` (numbered over the batch): the offsets of
    /// the input pixel's channels, the output pixel's channels and the tap's filter row, in
    /// `NHWC` / `HWIM` order.
    #[inline(always)]
    fn for_each_tap(&self, rows: Range<usize>, mut f: impl FnMut(usize, usize, usize)) {
        let (oh, ow, oc) = (self.dims[0].output, self.dims[1].output, self.out_c());
        if oc == 0 || oh == 0 {
            // No channels (or a multiplier of 0): nothing to add, and no chunks to cut.
            return;
        }
        for row in rows {
            let (n, y) = (row / oh, row % oh);
            for x in 0..ow {
                let out = (row * ow + x) * oc;
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
        let fv = f.values::<T>()?;
        let (xs, g) = g.one_filter_per_channel(ctx.intra(), to_nhwc(format, x.dims(), &xv));
        let oc = g.out_c();
        let mut out = vec![T::zero(); nhwc.iter().product()];
        let row = g.out_row();
        if !out.is_empty() {
            // Pieces of whole output rows; `dst` counts over the batch, `part` starts at row
            // `first`.
            ctx.intra()
                .for_chunks(&mut out, row, g.row_cycles(), |first, part| {
                    let (rows, base) = (first..first + part.len() / row, first * row);
                    lanes(|| {
                        g.for_each_tap(rows, |src, dst, tap| {
                            let out = &mut part[dst - base..dst - base + oc];
                            multiply_add(out, &xs[src..src + oc], &fv[tap..tap + oc]);
                        })
                    })
                });
        }
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
        let (m, nhwc) = (g.multiplier, [g.batch, g.in_h, g.in_w, g.in_c]);
        // With several filters per channel, each filter's share of the gradient first, then
        // the channel's shares added.
        let g = if m > 1 { g.expanded() } else { g };
        let oc = g.out_c();
        let (image, oh) = (g.in_image(), g.dims[0].output);
        let mut dx = vec![T::zero(); g.batch * image];
        if !dx.is_empty() {
            // Pieces of whole images: an output row's taps reach the rows above and below it.
            let cycles = oh as f64 * g.row_cycles();
            ctx.intra()
                .for_chunks(&mut dx, image, cycles, |first, part| {
                    let images = first..first + part.len() / image;
                    let (rows, base) = (images.start * oh..images.end * oh, first * image);
                    lanes(|| {
                        g.for_each_tap(rows, |src, dst, tap| {
                            let dx = &mut part[src - base..src - base + oc];
                            multiply_add(dx, &dys[dst..dst + oc], &fv[tap..tap + oc]);
                        })
                    })
                });
        }
        if m > 1 {
            let shares = dx;
            dx = vec![T::zero(); shares.len() / m];
            ctx.intra().for_chunks(&mut dx, 1, m as f64, |first, part| {
                for (x, shares) in part.iter_mut().zip(shares[first * m..].chunks_exact(m)) {
                    *x = shares.iter().fold(T::zero(), |s, &v| s + v);
                }
            });
        }
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
        let dyv = dy.values::<T>()?;
        let dys = to_nhwc(format, dy.dims(), &dyv);
        let (xs, g) = g.one_filter_per_channel(ctx.intra(), to_nhwc(format, x.dims(), &xv));
        let (oc, oh) = (g.out_c(), g.dims[0].output);
        // Each range of images sums its part of the gradient; the parts are added.
        let intra = ctx.intra();
        let pieces = intra.pieces(g.batch, oh as f64 * g.row_cycles());
        let ranges: Vec<Range<usize>> = split(g.batch, pieces).collect();
        let parts = intra.map(ranges, |images| {
            let mut df = vec![T::zero(); g.kh * g.kw * oc];
            lanes(|| {
                g.for_each_tap(images.start * oh..images.end * oh, |src, dst, tap| {
                    let df = &mut df[tap..tap + oc];
                    multiply_add(df, &xs[src..src + oc], &dys[dst..dst + oc]);
                })
            });
            df
        });
        Tensor::from_vec(Shape::new(filter_dims), sum_parts(parts))
    }
}

/// `acc[i] += a[i] * b[i]` over one pixel's channels: the inner loop of every pass, inlined into
/// the AVX2 copy [`lanes`] compiles.
#[inline(always)]
fn multiply_add<T: Real>(acc: &mut [T], a: &[T], b: &[T]) {
    for ((acc, &a), &b) in acc.iter_mut().zip(a).zip(b) {
        *acc = *acc + a * b;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{float32_bits, run_alone};
    use super::*;
    use crate::graph::attr::value;
    use crate::proto::NodeDef;

    fn node(op: &str, format: &str, padding: &str, stride: i64) -> NodeDef {
        let strides = match format {
            "NHWC" => vec![1, stride, stride, 1],
            _ => vec![1, 1, stride, stride],
        };
        NodeDef {
            name: op.into(),
            op: op.into(),
            attr: [
                ("T".to_string(), value::dtype(crate::tensor::DType::Float)),
                ("strides".to_string(), value::int_list(strides)),
                ("padding".to_string(), value::string(padding)),
                ("data_format".to_string(), value::string(format)),
            ]
            .into(),
            ..Default::default()
        }
    }

    /// Whole numbers in [-4, 4] over 8: every product and sum below is exact in float32, so
    /// each pass's values do not depend on the order it adds them in.
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + seed * 13) % 9) as f32 / 8.0 - 0.5)
            .collect()
    }

    /// Every pass split over three threads gives one thread's values: by output rows (the
    /// forward pass), by images (the input's gradient), and by images summed apart (the
    /// filter's), with one filter per channel and with three, in both layouts and strides.
    #[test]
    fn every_pass_split_over_the_pool_gives_one_threads_values() {
        let (one, three) = (IntraPool::new("dw-one", 1), IntraPool::new("dw-three", 3));
        let (batch, h, w, c, k) = (7usize, 32usize, 30usize, 16usize, 3usize);
        for (format, padding, stride) in [("NHWC", "SAME", 1), ("NCHW", "VALID", 2)] {
            for m in [1usize, 3] {
                let x_dims = match format {
                    "NHWC" => vec![batch, h, w, c],
                    _ => vec![batch, c, h, w],
                };
                let f_dims = vec![k, k, c, m];
                let x = Tensor::from_vec(x_dims.clone(), values(batch * h * w * c, 1)).unwrap();
                let f = Tensor::from_vec(f_dims.clone(), values(k * k * c * m, 2)).unwrap();
                let forward = node("DepthwiseConv2dNative", format, padding, stride);
                let y = run_alone(&forward, vec![x.clone(), f.clone()], Some(&one)).unwrap();
                let y_dims = y[0].dims().to_vec();
                let rows = y_dims[0]
                    * if format == "NHWC" {
                        y_dims[1]
                    } else {
                        y_dims[2]
                    };
                let row = (y_dims.iter().product::<usize>() / rows) as f64;
                assert!(
                    three.pieces(rows, row * (k * k) as f64 * CYCLES_PER_MULTIPLY_ADD) > 1,
                    "it must split"
                );
                let dy =
                    Tensor::from_vec(y_dims.clone(), values(y_dims.iter().product(), 3)).unwrap();
                let sizes = |d: &[usize]| {
                    Tensor::from_vec(vec![4], d.iter().map(|&v| v as i32).collect()).unwrap()
                };
                let cases = [
                    (forward, vec![x.clone(), f.clone()]),
                    (
                        node(
                            "DepthwiseConv2dNativeBackpropInput",
                            format,
                            padding,
                            stride,
                        ),
                        vec![sizes(&x_dims), f.clone(), dy.clone()],
                    ),
                    (
                        node(
                            "DepthwiseConv2dNativeBackpropFilter",
                            format,
                            padding,
                            stride,
                        ),
                        vec![x.clone(), sizes(&f_dims), dy.clone()],
                    ),
                ];
                for (node, inputs) in cases {
                    let whole = run_alone(&node, inputs.clone(), Some(&one)).unwrap();
                    let split = run_alone(&node, inputs, Some(&three)).unwrap();
                    let what = format!("{} {format} {padding} stride {stride} m {m}", node.op);
                    assert_eq!(whole[0].dims(), split[0].dims(), "{what}");
                    assert_eq!(float32_bits(&whole[0]), float32_bits(&split[0]), "{what}");
                    assert!(
                        whole[0].values::<f32>().unwrap().iter().any(|&v| v != 0.0),
                        "{what}: all zeros"
                    );
                }
            }
        }
    }
}
