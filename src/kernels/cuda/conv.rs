//! The windowed GPU kernels (float32): `Conv2D`, `Conv2DBackpropInput` and
//! `Conv2DBackpropFilter` (`NHWC` and `NCHW`, strides, dilations, `SAME` / `VALID` /
//! `EXPLICIT` padding, grouped filters), and `MaxPool`, `MaxPoolGrad`, `AvgPool` and
//! `AvgPoolGrad` (`NHWC` and `NCHW`, `SAME` / `VALID`, and `EXPLICIT` for max pooling).
//!
//! Each op runs one direct kernel of `kernels.cu`, one thread per element it writes: per output
//! element for the forward ops, per filter element for the filter gradient (summing over the
//! batch and the output pixels), per input element for the input gradients (gathering over the
//! windows that cover it, so no two threads write one element and no atomics are needed).
//! Operands are checked on the host first by the CPU kernels' own checks
//! ([`crate::kernels::cpu::conv`], [`crate::kernels::cpu::pool`]), so shapes and errors are
//! the CPU's, and the geometry the kernels read is [`Window`]'s, computed by
//! [`crate::graph::window`] as the CPU kernels do.
//!
//! The pooling kernels follow the CPU kernels exactly: a window's maximum is its first tap
//! inside the input in row-major window order, replaced only by a greater one, so
//! `MaxPoolGrad` gives a tie's gradient to the first of the equal inputs; averages count only
//! the taps inside the input. A case with an empty operand runs the CPU kernel.

use std::mem::size_of_val;
use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::layout::Window;
use super::ops::{copied_in, float_input, i64s, on_cpu, with_gpu, F32};
use crate::error::Result;
use crate::graph::window::{ConvAttrs, PoolAttrs};
use crate::kernels::cpu::conv::{self, Pass};
use crate::kernels::cpu::pool;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Shape, Tensor};

/// Launches the window kernel `function` on `inputs` (the float32 tensors it reads, in its
/// parameter order) with `window`'s params, one thread per element of its output of `dims`;
/// returns the output, or `None` when the output or an input is empty (the CPU kernel's case).
fn window_launch(
    ctx: &OpContext<'_>,
    function: &str,
    inputs: &[&Tensor],
    dims: Vec<usize>,
    window: &Window,
) -> Result<Option<Tensor>> {
    let len: usize = dims.iter().product();
    if len == 0 || inputs.iter().any(|t| t.num_elements() == 0) {
        return Ok(None);
    }
    let bytes = copied_in(ctx, inputs) + len * F32 + size_of_val(&window.params[..]);
    with_gpu(ctx, bytes, |gpu| {
        let operands = inputs
            .iter()
            .map(|t| gpu.operand(t))
            .collect::<Result<Vec<_>>>()?;
        let params = gpu.params(&window.params)?;
        let mut out = gpu.zeros(len)?;
        let n = i64s(len);
        // SAFETY: every window kernel takes (its inputs, out, n, p); out holds n floats, p
        // holds Window::PARAMS entries, and the inputs have the shapes the checks above
        // matched against the window (x: its input, filter: its filter, dy: its output), so
        // every offset the kernel computes from p is inside them.
        unsafe {
            gpu.launch(function, len, |l| {
                for operand in &operands {
                    l.arg(&**operand);
                }
                l.arg(&mut out).arg(&n).arg(&params);
            })
        }?;
        gpu.output(out, Shape::new(dims)).map(Some)
    })
}

/// `Conv2D`, `Conv2DBackpropInput` or `Conv2DBackpropFilter`, with its checked attrs.
pub(super) struct Conv {
    attrs: ConvAttrs,
    pass: Pass,
}

impl Conv {
    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let pass = match node.op.as_str() {
            "Conv2D" => Pass::Forward,
            "Conv2DBackpropInput" => Pass::BackpropInput,
            _ => Pass::BackpropFilter,
        };
        Ok(Arc::new(Conv {
            attrs: ConvAttrs::of(node)?,
            pass,
        }))
    }

    /// The window of a convolution of an input of `input` dims by a filter of `filter` dims.
    fn window(&self, ctx: &OpContext<'_>, input: &[usize], filter: &[usize]) -> Result<Window> {
        Window::conv(&self.attrs, input, filter).map_err(|e| ctx.named(e))
    }
}

impl OpKernel for Conv {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let attrs = &self.attrs;
        let out = match self.pass {
            Pass::Forward => {
                let (x, f) = (float_input(ctx, 0)?, float_input(ctx, 1)?);
                conv::check_forward(attrs, ctx, &x, &f)?;
                let window = self.window(ctx, x.dims(), f.dims())?;
                let dims = window.output_dims();
                window_launch(ctx, "conv2d_f32", &[&x, &f], dims, &window)?
            }
            Pass::BackpropInput => {
                let (f, dy) = (float_input(ctx, 1)?, float_input(ctx, 2)?);
                let (input_dims, _) =
                    conv::check_backprop_input(attrs, ctx, ctx.input(0)?, &f, &dy)?;
                let window = self.window(ctx, &input_dims, f.dims())?;
                window_launch(
                    ctx,
                    "conv2d_input_grad_f32",
                    &[&f, &dy],
                    input_dims,
                    &window,
                )?
            }
            Pass::BackpropFilter => {
                let (x, dy) = (float_input(ctx, 0)?, float_input(ctx, 2)?);
                let (filter_dims, _) =
                    conv::check_backprop_filter(attrs, ctx, &x, ctx.input(1)?, &dy)?;
                let window = self.window(ctx, x.dims(), &filter_dims)?;
                window_launch(
                    ctx,
                    "conv2d_filter_grad_f32",
                    &[&x, &dy],
                    filter_dims,
                    &window,
                )?
            }
        };
        let Some(out) = out else {
            return on_cpu(ctx);
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// `MaxPool`, `MaxPoolGrad`, `AvgPool` or `AvgPoolGrad`, with its checked attrs.
pub(super) struct Pool {
    attrs: PoolAttrs,
}

impl Pool {
    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Pool {
            attrs: PoolAttrs::of(node)?,
        }))
    }

    /// The window of pooling an input of `input` dims.
    fn window(&self, ctx: &OpContext<'_>, input: &[usize]) -> Result<Window> {
        Window::pool(&self.attrs, input).map_err(|e| ctx.named(e))
    }
}

impl OpKernel for Pool {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let attrs = &self.attrs;
        let out = match ctx.node().op.as_str() {
            op @ ("MaxPool" | "AvgPool") => {
                let x = float_input(ctx, 0)?;
                pool::check_pool(attrs, ctx, &x)?;
                let window = self.window(ctx, x.dims())?;
                let function = if op == "MaxPool" {
                    "max_pool_f32"
                } else {
                    "avg_pool_f32"
                };
                window_launch(ctx, function, &[&x], window.output_dims(), &window)?
            }
            "MaxPoolGrad" => {
                let (x, y, dy) = (
                    float_input(ctx, 0)?,
                    float_input(ctx, 1)?,
                    float_input(ctx, 2)?,
                );
                pool::check_max_pool_grad(attrs, ctx, &x, &y, &dy)?;
                let window = self.window(ctx, x.dims())?;
                let dims = x.dims().to_vec();
                window_launch(ctx, "max_pool_grad_f32", &[&x, &dy], dims, &window)?
            }
            _ => {
                let dy = float_input(ctx, 1)?;
                let (input_dims, _) = pool::check_avg_pool_grad(attrs, ctx, ctx.input(0)?, &dy)?;
                let window = self.window(ctx, &input_dims)?;
                window_launch(ctx, "avg_pool_grad_f32", &[&dy], input_dims, &window)?
            }
        };
        let Some(out) = out else {
            return on_cpu(ctx);
        };
        ctx.set_output(0, out);
        Ok(())
    }
}
