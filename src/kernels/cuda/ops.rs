//! The GPU kernels (float32): MatMul and BatchMatMul through cuBLAS; the element-wise ops
//! (Add, Sub, Mul, RealDiv, Maximum, Minimum, Pow with numpy broadcasting; Neg, Square, Abs,
//! Sign, Sqrt, Rsqrt, Exp, Log, Reciprocal, Sigmoid, Tanh, Relu; the gradients ReluGrad,
//! SigmoidGrad, TanhGrad), BiasAdd and BiasAddGrad, the reductions Sum, Mean, Max, Min, Prod
//! and L2Loss, Softmax and LogSoftmax, the cross-entropy losses, and every optimizer update
//! through the NVRTC kernels of `kernels.cu`; the convolutions and pooling ops are in
//! [`super::conv`].
//!
//! A kernel's float32 tensors stay in the GPU's memory ([`GpuBuffer`]): it reads inputs where
//! an earlier kernel left them, copies in only those still on the host (a feed or a tensor from
//! another device, normally put on the GPU by its `_Recv` already), and leaves its outputs on
//! the GPU, all under the GPU's lock; a tensor crosses to the host only when host code reads
//! it (a `_Send`, a fetch). Every copy is counted in the device's [`GpuMemory`]. Inputs are
//! checked on the host first, from their shapes, by the CPU kernels' own checks, so bad input
//! reads the same on either device. Nodes of another dtype than float32 run the CPU
//! kernel (see [`kernel_for`]), and so do the cases a GPU kernel leaves to the CPU (a
//! cross-entropy whose operands broadcast, a matrix past cuBLAS's int range).
//!
//! The reductions run one thread per output element, folding in the CPU kernel's order: fast
//! for the many-output reductions of a training step (BiasAddGrad, per-example sums), one
//! thread's loop for a reduction to a scalar.

use std::mem::size_of_val;
use std::ops::Deref;
use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg, ValidAsZeroBits};

use super::conv::{Conv, Pool};
use super::gpu::{self, Gpu, GpuBuffer, GpuInner, GpuMemory, Operand};
use super::layout::{Broadcast, Reduction};
use crate::device::space::CopyCounter;
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::cpu::broadcast::{broadcast_shape, broadcast_to};
use crate::kernels::cpu::nn::{self, BiasLayout};
use crate::kernels::cpu::reduce;
use crate::kernels::cpu::training::{Rule, Update};
use crate::kernels::gpu_ops::HOST_MEMORY_OPS;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory of `op`'s GPU kernel, if tessera has one.
///
/// The kernels compute float32. A node of another dtype (`T` attr), such as the int32 shape
/// arithmetic of gradient graphs, gets the CPU kernel instead: tessera's tensors are host
/// memory, so it runs in place, as TensorFlow keeps int32 tensors of GPU ops in host memory.
pub fn kernel_for(op: &str) -> Option<KernelFactory> {
    if HOST_MEMORY_OPS.contains(&op) {
        return crate::kernels::cpu::kernel_for(op);
    }
    gpu_factory(op)?;
    Some(create)
}

/// Builds the GPU kernel of a float32 node, the CPU kernel of any other.
fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
    let missing = || {
        Status::unimplemented(format!(
            "no GPU kernel for op {} (node `{}`)",
            node.op, node.name
        ))
    };
    let gpu = gpu_factory(&node.op).ok_or_else(missing)?;
    if attr::dtype(node, "T").is_ok_and(|t| t == DType::Float) {
        return gpu(node);
    }
    let cpu = crate::kernels::cpu::kernel_for(&node.op).ok_or_else(missing)?;
    cpu(node)
}

/// The factory of `op`'s float32 GPU kernel: one for each op of [`crate::kernels::gpu_ops`]
/// that a GPU computes.
fn gpu_factory(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "MatMul" => MatMul::create,
        "BatchMatMulV2" | "BatchMatMul" => BatchMatMul::create,
        "Add" | "AddV2" | "Sub" | "Mul" | "RealDiv" | "Maximum" | "Minimum" | "Pow"
        | "ReluGrad" | "SigmoidGrad" | "TanhGrad" => Binary::create,
        "Neg" | "Square" | "Abs" | "Sign" | "Sqrt" | "Rsqrt" | "Exp" | "Log" | "Reciprocal"
        | "Inv" | "Sigmoid" | "Tanh" | "Relu" => Unary::create,
        "BiasAdd" | "BiasAddV1" => BiasAdd::create,
        "BiasAddGrad" => BiasAddGrad::create,
        "Sum" | "Mean" | "Max" | "Min" | "Prod" => Reduce::create,
        "L2Loss" => |_| Ok(Arc::new(L2Loss)),
        "Softmax" | "LogSoftmax" => Softmax::create,
        "SoftmaxCrossEntropyWithLogits" => |_| Ok(Arc::new(SoftmaxXent)),
        "SparseSoftmaxCrossEntropyWithLogits" => |_| Ok(Arc::new(SparseXent)),
        "NcclAllReduce" => super::nccl::create,
        "Conv2D" | "Conv2DBackpropInput" | "Conv2DBackpropFilter" => Conv::create,
        "MaxPool" | "MaxPoolGrad" | "AvgPool" | "AvgPoolGrad" => Pool::create,
        op if Rule::of(op).is_some() => |node| Ok(Arc::new(Apply(Update::new(node)?))),
        _ => return None,
    };
    Some(factory)
}

/// Runs the node's CPU kernel: for a case its GPU kernel leaves to the CPU, and to report bad
/// input in the CPU kernel's words.
pub(super) fn on_cpu(ctx: &mut OpContext<'_>) -> Result<()> {
    let node = ctx.node().clone();
    let factory = crate::kernels::cpu::kernel_for(&node.op).ok_or_else(|| {
        ctx.named(Status::internal(
            "a GPU kernel fell back to a CPU kernel that does not exist",
        ))
    })?;
    factory(&node)?.compute(ctx)
}

/// Input `i`, which must be float32 (the node's `T`).
pub(super) fn float_input(ctx: &OpContext<'_>, i: usize) -> Result<Tensor> {
    let t = ctx.input(i)?;
    if t.dtype() != DType::Float {
        return Err(ctx.invalid(format!(
            "input {i} is {}; this node's GPU kernel takes float32",
            t.dtype()
        )));
    }
    here_or_host(ctx, t)
}

/// `t` as this node's GPU kernel may read it under the GPU's lock ([`gpu::here_or_host`]).
fn here_or_host(ctx: &OpContext<'_>, t: &Tensor) -> Result<Tensor> {
    gpu::here_or_host(ctx.device, t).map_err(|e| ctx.named(e))
}

/// Runs `f` on the node's GPU, under its lock; `f` gets the GPU as the node uses it
/// ([`OnGpu`]). The `device_bytes` that `f` allocates on the GPU are charged to the
/// device's memory budget first (its `gpu_memory_fraction`), so a kernel that would take the
/// GPU past it fails with RESOURCE_EXHAUSTED before touching it. Errors other than out of
/// memory get the node's name in front.
pub(super) fn with_gpu<R>(
    ctx: &OpContext<'_>,
    device_bytes: usize,
    f: impl FnOnce(&OnGpu<'_>) -> Result<R>,
) -> Result<R> {
    let _charge = ctx.charge(device_bytes)?;
    let gpu = Gpu::for_device(ctx.device).map_err(|e| ctx.named(e))?;
    // The device's copy counter; a kernel run outside such a device (a test's context)
    // counts in one of its own.
    let counter = ctx
        .memory_space()
        .and_then(|s| s.as_any().downcast_ref::<GpuMemory>())
        .map_or_else(Arc::default, |m| Arc::clone(m.counter()));
    let inner = gpu.lock().map_err(|e| ctx.named(e))?;
    let on = OnGpu {
        inner: &inner,
        gpu: &gpu,
        node: &ctx.node().name,
        device: ctx.device,
        counter: &counter,
    };
    f(&on).map_err(|e| match e.code() {
        Code::ResourceExhausted => e,
        _ => ctx.named(e),
    })
}

/// The node's GPU as its kernel uses it, under the GPU's lock: its handles, the node's name
/// (named when the GPU is out of memory), and the device's copy counter.
pub(super) struct OnGpu<'g> {
    inner: &'g GpuInner,
    gpu: &'g Arc<Gpu>,
    node: &'g str,
    device: &'g str,
    counter: &'g Arc<CopyCounter>,
}

impl Deref for OnGpu<'_> {
    type Target = GpuInner;

    fn deref(&self) -> &GpuInner {
        self.inner
    }
}

impl OnGpu<'_> {
    /// Input `t` in the GPU's memory: where it is when the GPU holds it, else copied in
    /// (counted).
    pub(super) fn operand<'t>(&self, t: &'t Tensor) -> Result<Operand<'t>> {
        if let Some(slice) = GpuBuffer::on(t, self.gpu) {
            return Ok(Operand::Resident(slice));
        }
        Ok(Operand::Copied(self.copy_in(&t.values::<f32>()?)?))
    }

    /// Copies a tensor's elements from the host to the GPU (counted).
    fn copy_in<T: DeviceRepr + ValidAsZeroBits>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        let slice = self.inner.upload(self.node, host)?;
        self.counter.to_device(size_of_val(host));
        Ok(slice)
    }

    /// Copies a kernel's parameters (a broadcast or reduction layout) to the GPU; they are
    /// not tensors, and not counted as tensor copies.
    pub(super) fn params(&self, host: &[i64]) -> Result<CudaSlice<i64>> {
        self.inner.upload(self.node, host)
    }

    /// A new zeroed buffer of `len` floats on the GPU.
    pub(super) fn zeros(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.inner.zeros(self.node, len)
    }

    /// An output of shape `shape` left in the GPU's memory.
    pub(super) fn output(&self, slice: CudaSlice<f32>, shape: impl Into<Shape>) -> Result<Tensor> {
        GpuBuffer::tensor(self.device, self.gpu, slice, shape.into(), self.counter)
    }

    /// Copies `len` floats of `slice` to the host (counted).
    fn copy_out(&self, slice: &CudaSlice<f32>, len: usize) -> Result<Vec<f32>> {
        let host = self.inner.download(slice, len)?;
        self.counter.to_host(len * F32);
        Ok(host)
    }
}

/// The bytes a kernel copies to the GPU for `inputs`: those not in the GPU's memory already.
pub(super) fn copied_in(ctx: &OpContext<'_>, inputs: &[&Tensor]) -> usize {
    inputs
        .iter()
        .filter(|t| t.device_buffer().is_none_or(|b| b.device() != ctx.device))
        .map(|t| t.num_elements() * F32)
        .sum()
}

pub(super) fn i64s(n: usize) -> i64 {
    n as i64
}

/// Bytes of a float32.
pub(super) const F32: usize = std::mem::size_of::<f32>();

/// The one-input element-wise ops: `unary_f32` with the op's code.
struct Unary {
    op: i32,
}

impl Unary {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let op = unary_code(&node.op).expect("a unary op");
        Ok(Arc::new(Unary { op }))
    }
}

/// `unary_f32`'s code for `op`.
pub fn unary_code(op: &str) -> Option<i32> {
    Some(match op {
        "Neg" => 0,
        "Square" => 1,
        "Abs" => 2,
        "Sign" => 3,
        "Sqrt" => 4,
        "Rsqrt" => 5,
        "Exp" => 6,
        "Log" => 7,
        "Reciprocal" | "Inv" => 8,
        "Sigmoid" => 9,
        "Tanh" => 10,
        "Relu" => 11,
        _ => return None,
    })
}

impl OpKernel for Unary {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = float_input(ctx, 0)?;
        let len = x.num_elements();
        if len == 0 {
            ctx.set_output(0, Tensor::zeros(DType::Float, x.shape().clone())?);
            return Ok(());
        }
        let out = with_gpu(ctx, copied_in(ctx, &[&x]) + len * F32, |gpu| {
            let dx = gpu.operand(&x)?;
            let mut out = gpu.zeros(len)?;
            let n = i64s(len);
            // SAFETY: unary_f32(op, x, out, n); x and out hold n floats.
            unsafe {
                gpu.launch("unary_f32", len, |l| {
                    l.arg(&self.op).arg(&*dx).arg(&mut out).arg(&n);
                })
            }?;
            gpu.output(out, x.shape().clone())
        })?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Launches `binary_f32` with `op` on `a` and `b` laid out by `layout`; returns the output,
/// of shape `shape`.
fn binary_launch(
    ctx: &OpContext<'_>,
    op: i32,
    (a, b): (&Tensor, &Tensor),
    layout: &Broadcast,
    shape: Shape,
) -> Result<Tensor> {
    let len = layout.len();
    if len == 0 {
        return Tensor::zeros(DType::Float, shape);
    }
    let bytes = copied_in(ctx, &[a, b]) + len * F32 + size_of_val(&layout.layout[..]);
    with_gpu(ctx, bytes, |gpu| {
        let (da, db) = (gpu.operand(a)?, gpu.operand(b)?);
        let dl = gpu.params(&layout.layout)?;
        let mut out = gpu.zeros(len)?;
        let (n, rank) = (i64s(len), layout.rank() as i32);
        // SAFETY: binary_f32(op, a, b, out, n, rank, layout); out holds n floats, the layout
        // holds 3·rank entries, and its strides keep every index inside a and b (they are
        // the strides of a's and b's own shapes, 0 where those broadcast).
        unsafe {
            gpu.launch("binary_f32", len, |l| {
                l.arg(&op)
                    .arg(&*da)
                    .arg(&*db)
                    .arg(&mut out)
                    .arg(&n)
                    .arg(&rank)
                    .arg(&dl);
            })
        }?;
        gpu.output(out, shape)
    })
}

/// The two-input element-wise ops with numpy broadcasting, and the activation gradients
/// (which take two inputs of one shape).
struct Binary {
    op: i32,
    /// Whether the inputs must have one shape (the gradient ops do not broadcast).
    same_shape: bool,
}

impl Binary {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let op = binary_code(&node.op).expect("a binary op");
        Ok(Arc::new(Binary {
            op,
            same_shape: op >= RELU_GRAD,
        }))
    }
}

/// `binary_f32`'s code for `op` (BiasAdd's is Add's); the activation gradients come last,
/// from [`RELU_GRAD`] on.
pub fn binary_code(op: &str) -> Option<i32> {
    Some(match op {
        "Add" | "AddV2" | "BiasAdd" | "BiasAddV1" => 0,
        "Sub" => 1,
        "Mul" => 2,
        "RealDiv" => 3,
        "Maximum" => 4,
        "Minimum" => 5,
        "Pow" => 6,
        "ReluGrad" => RELU_GRAD,
        "SigmoidGrad" => 8,
        "TanhGrad" => 9,
        _ => return None,
    })
}

/// `binary_f32`'s first gradient op, whose inputs do not broadcast.
const RELU_GRAD: i32 = 7;

impl OpKernel for Binary {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (a, b) = (float_input(ctx, 0)?, float_input(ctx, 1)?);
        if self.same_shape {
            nn::same_shape(ctx, &a, &b)?;
        }
        let Some(layout) = Broadcast::new(a.dims(), b.dims()) else {
            // Shapes that do not broadcast: the CPU kernel's error names them.
            return on_cpu(ctx);
        };
        let dims = Shape::new(layout.dims.clone());
        let out = binary_launch(ctx, self.op, (&a, &b), &layout, dims)?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// BiasAdd: the bias added along the channel dimension (last for NHWC, second for NCHW).
struct BiasAdd(BiasLayout);

/// `binary_f32`'s and `reduce_f32`'s code for a node whose op has one.
fn code_of(ctx: &OpContext<'_>, code: fn(&str) -> Option<i32>) -> i32 {
    code(&ctx.node().op).expect("the factory was chosen by op")
}

impl BiasAdd {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(BiasAdd(BiasLayout::of(node)?)))
    }
}

impl OpKernel for BiasAdd {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (value, bias) = (float_input(ctx, 0)?, float_input(ctx, 1)?);
        self.0.check_bias(ctx, value.shape(), bias.shape())?;
        let layout = Broadcast::bias(value.dims(), self.0.channel_axis(value.rank()));
        let add = code_of(ctx, binary_code);
        let out = binary_launch(ctx, add, (&value, &bias), &layout, value.shape().clone())?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Launches `reduce_f32` with `op` over `x` as `reduction` describes; returns the output, of
/// shape `shape`.
fn reduce_launch(
    ctx: &OpContext<'_>,
    op: i32,
    x: &Tensor,
    reduction: &Reduction,
    shape: Shape,
) -> Result<Tensor> {
    let outputs = reduction.outputs;
    if outputs == 0 {
        return Tensor::zeros(DType::Float, shape);
    }
    let bytes = copied_in(ctx, &[x]) + outputs * F32 + size_of_val(&reduction.layout[..]);
    with_gpu(ctx, bytes, |gpu| {
        let dx = gpu.operand(x)?;
        let dl = gpu.params(&reduction.layout)?;
        let mut out = gpu.zeros(outputs)?;
        let (o, r) = (i64s(outputs), i64s(reduction.reduced_len));
        let (kept, reduced) = (reduction.kept as i32, reduction.reduced as i32);
        // SAFETY: reduce_f32(op, x, out, outputs, r, kept, reduced, layout); out holds
        // `outputs` floats, the layout 2·(kept + reduced) entries, and its dims and strides
        // are x's own, so every index is inside x (none is read when r is 0).
        unsafe {
            gpu.launch("reduce_f32", outputs, |l| {
                l.arg(&op)
                    .arg(&*dx)
                    .arg(&mut out)
                    .arg(&o)
                    .arg(&r)
                    .arg(&kept)
                    .arg(&reduced)
                    .arg(&dl);
            })
        }?;
        gpu.output(out, shape)
    })
}

/// BiasAddGrad: the gradient summed over every dimension but the channels.
struct BiasAddGrad(BiasLayout);

impl BiasAddGrad {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(BiasAddGrad(BiasLayout::of(node)?)))
    }
}

impl OpKernel for BiasAddGrad {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let backprop = float_input(ctx, 0)?;
        let (_, channels, _) = self.0.split(ctx, backprop.shape())?;
        let axis = self.0.channel_axis(backprop.rank());
        let reduction = Reduction::all_but(backprop.dims(), axis);
        let sum = code_of(ctx, reduce_code);
        let out = reduce_launch(ctx, sum, &backprop, &reduction, Shape::new(vec![channels]))?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Sum, Mean, Max, Min and Prod over any axes (`reduction_indices` input), with `keep_dims`.
struct Reduce {
    op: i32,
    keep_dims: bool,
}

impl Reduce {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Reduce {
            op: reduce_code(&node.op).expect("a reduction"),
            keep_dims: attr::bool_or(node, "keep_dims", false)?,
        }))
    }
}

/// `reduce_f32`'s code for `op` (L2Loss and BiasAddGrad included).
pub fn reduce_code(op: &str) -> Option<i32> {
    Some(match op {
        "Sum" | "BiasAddGrad" => 0,
        "Mean" => 1,
        "Max" => 2,
        "Min" => 3,
        "Prod" => 4,
        "L2Loss" => 5,
        _ => return None,
    })
}

impl OpKernel for Reduce {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = float_input(ctx, 0)?;
        let reduced = reduce::reduction_axes(ctx, &x, ctx.input(1)?)?;
        let reduction = Reduction::new(x.dims(), &reduced);
        let shape = reduce::reduced_shape(x.dims(), &reduced, self.keep_dims);
        let out = reduce_launch(ctx, self.op, &x, &reduction, shape)?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// L2Loss: half the sum of squares, a scalar.
struct L2Loss;

impl OpKernel for L2Loss {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = float_input(ctx, 0)?;
        let reduction = Reduction::new(x.dims(), &vec![true; x.rank()]);
        let half_sum_of_squares = code_of(ctx, reduce_code);
        let out = reduce_launch(ctx, half_sum_of_squares, &x, &reduction, Shape::scalar())?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Softmax and LogSoftmax over the last dimension.
struct Softmax {
    log: bool,
}

impl Softmax {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Softmax {
            log: node.op == "LogSoftmax",
        }))
    }
}

impl OpKernel for Softmax {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = float_input(ctx, 0)?;
        if x.rank() < 1 || x.num_elements() == 0 {
            // A scalar (the CPU kernel's error) or nothing to compute.
            return on_cpu(ctx);
        }
        let len = x.num_elements();
        let cols = x.dims()[x.rank() - 1];
        let rows = len / cols;
        let out = with_gpu(ctx, copied_in(ctx, &[&x]) + len * F32, |gpu| {
            let dx = gpu.operand(&x)?;
            let mut out = gpu.zeros(len)?;
            let (r, c, log) = (i64s(rows), i64s(cols), i32::from(self.log));
            // SAFETY: softmax_f32(x, out, rows, cols, take_log); both hold rows·cols floats.
            unsafe {
                gpu.launch("softmax_f32", rows, |l| {
                    l.arg(&*dx).arg(&mut out).arg(&r).arg(&c).arg(&log);
                })
            }?;
            gpu.output(out, x.shape().clone())
        })?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// The labels of a cross-entropy: dense float32 ones (a tensor the GPU may hold already), or
/// sparse class indices (checked on the host, so copied in from there).
enum Labels<'t> {
    Dense(&'t Tensor),
    Sparse(&'t [i64]),
}

/// Launches a cross-entropy kernel (`softmax_xent_f32` or `sparse_xent_f32`) on `logits`
/// ([rows, cols], not empty) and its per-row `labels`; returns (loss, backprop).
fn xent_launch(
    ctx: &OpContext<'_>,
    function: &str,
    logits: &Tensor,
    labels: Labels<'_>,
    (rows, cols): (usize, usize),
) -> Result<(Tensor, Tensor)> {
    let len = logits.num_elements();
    let labels_in = match labels {
        Labels::Dense(t) => copied_in(ctx, &[t]),
        Labels::Sparse(indices) => size_of_val(indices),
    };
    let bytes = copied_in(ctx, &[logits]) + labels_in + len * F32 + rows * F32;
    with_gpu(ctx, bytes, |gpu| {
        let dx = gpu.operand(logits)?;
        let (dense, sparse) = match labels {
            Labels::Dense(t) => (Some(gpu.operand(t)?), None),
            Labels::Sparse(indices) => (None, Some(gpu.copy_in(indices)?)),
        };
        let mut loss = gpu.zeros(rows)?;
        let mut back = gpu.zeros(len)?;
        let (r, c) = (i64s(rows), i64s(cols));
        // SAFETY: both kernels take (logits, labels, loss, backprop, rows, cols); logits and
        // backprop hold rows·cols floats, loss rows, and labels rows·cols floats (dense
        // labels) or rows class indices checked to be in [0, cols) (sparse labels).
        unsafe {
            gpu.launch(function, rows, |l| {
                l.arg(&*dx);
                match (&dense, &sparse) {
                    (Some(dense), _) => l.arg(&**dense),
                    (_, Some(sparse)) => l.arg(sparse),
                    (None, None) => unreachable!("labels are dense or sparse"),
                };
                l.arg(&mut loss).arg(&mut back).arg(&r).arg(&c);
            })
        }?;
        Ok((
            gpu.output(loss, Shape::new(vec![rows]))?,
            gpu.output(back, Shape::new(vec![rows, cols]))?,
        ))
    })
}

/// SoftmaxCrossEntropyWithLogits(logits, labels) → (loss [batch], backprop [batch, classes]).
struct SoftmaxXent;

impl OpKernel for SoftmaxXent {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (logits, labels) = (float_input(ctx, 0)?, float_input(ctx, 1)?);
        if logits.rank() != 2 || logits.shape() != labels.shape() || logits.num_elements() == 0 {
            // Operands that broadcast to [batch, classes], bad shapes or nothing to compute.
            return on_cpu(ctx);
        }
        let (rows, cols) = (logits.dims()[0], logits.dims()[1]);
        let (loss, backprop) = xent_launch(
            ctx,
            "softmax_xent_f32",
            &logits,
            Labels::Dense(&labels),
            (rows, cols),
        )?;
        ctx.set_output(0, loss);
        ctx.set_output(1, backprop);
        Ok(())
    }
}

/// SparseSoftmaxCrossEntropyWithLogits(logits, labels [batch] int32 or int64) → (loss
/// [batch], backprop [batch, classes]).
struct SparseXent;

impl OpKernel for SparseXent {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let logits = float_input(ctx, 0)?;
        let labels = nn::sparse_xent_labels(ctx, &logits, ctx.input(1)?)?;
        if logits.num_elements() == 0 {
            return on_cpu(ctx);
        }
        let (rows, cols) = (logits.dims()[0], logits.dims()[1]);
        let (loss, backprop) = xent_launch(
            ctx,
            "sparse_xent_f32",
            &logits,
            Labels::Sparse(&labels),
            (rows, cols),
        )?;
        ctx.set_output(0, loss);
        ctx.set_output(1, backprop);
        Ok(())
    }
}

/// `apply_f32`'s rule code and flags for `update`; `None` for the rules `apply_f32` does not
/// compute (they run the CPU computation on the host values).
pub fn apply_codes(update: &Update) -> Option<(i32, i32)> {
    let rule = match update.rule {
        Rule::GradientDescent => 0,
        Rule::Adagrad => 1,
        Rule::AdagradV2 => 2,
        Rule::Momentum => 3,
        Rule::Adam => 4,
        Rule::RmsProp => 5,
        Rule::CenteredRmsProp => 6,
        Rule::ProximalGradientDescent
        | Rule::Adadelta
        | Rule::ProximalAdagrad
        | Rule::Ftrl
        | Rule::FtrlV2
        | Rule::AdaMax
        | Rule::AddSign
        | Rule::PowerSign
        | Rule::AdagradDA => return None,
    };
    let flags = i32::from(update.use_nesterov) | i32::from(update.update_slots) << 1;
    Some((rule, flags))
}

/// An optimizer update on the GPU, in either form (ref or resource): the CPU kernel's
/// read-check-write of the variable and its slots ([`Update::apply`], which honours
/// `use_locking`), with `apply_f32` computing the new values; the rules `apply_f32` lacks
/// compute on the host ([`Update::compute_cpu`]).
struct Apply(Update);

impl Apply {
    /// The new values of the variable and its slots (`values`) after the update by `grad`.
    fn run(
        &self,
        ctx: &OpContext<'_>,
        values: &[&Tensor],
        grad: &Tensor,
        (rule, flags): (i32, i32),
    ) -> Result<Vec<Tensor>> {
        if values[0].dtype() != DType::Float {
            return Err(ctx.invalid(format!(
                "variable is {}; this node's GPU kernel takes float32",
                values[0].dtype()
            )));
        }
        let mut p = self.0.params::<f32>(ctx)?;
        p.resize(6, 0.0);
        let len = values[0].num_elements();
        if len == 0 {
            return Ok(values.iter().map(|&t| t.clone()).collect());
        }
        let n = i64s(len);
        // The variable and its slots (in host memory) are updated in copies on the GPU; the
        // gradient is read where it is (the spare slots are a float each). Host values are
        // read before the GPU is locked: reading a tensor off a GPU takes its lock.
        let grad = here_or_host(ctx, grad)?;
        let hosts = values
            .iter()
            .map(|t| t.values::<f32>())
            .collect::<Result<Vec<_>>>()?;
        let bytes = values.len() * len * F32 + copied_in(ctx, &[&grad]);
        let updated = with_gpu(ctx, bytes, |gpu| {
            let mut buffers = hosts
                .iter()
                .map(|host| gpu.copy_in(host))
                .collect::<Result<Vec<CudaSlice<f32>>>>()?;
            // The slots a rule does not have are one-float buffers the kernel never touches.
            for _ in values.len()..4 {
                buffers.push(gpu.zeros(1)?);
            }
            let g = gpu.operand(&grad)?;
            let [var, s0, s1, s2] = &mut buffers[..] else {
                unreachable!("four buffers")
            };
            // SAFETY: apply_f32(rule, flags, var, s0, s1, s2, grad, p0..p5, n); var, grad and
            // the rule's slots hold n floats (checked like the variable by `Update::apply`), and the
            // kernel touches no slot past the rule's count.
            unsafe {
                gpu.launch("apply_f32", len, |l| {
                    l.arg(&rule)
                        .arg(&flags)
                        .arg(var)
                        .arg(s0)
                        .arg(s1)
                        .arg(s2)
                        .arg(&*g);
                    for v in &p {
                        l.arg(v);
                    }
                    l.arg(&n);
                })
            }?;
            // The variables live in host memory: the new values go back there.
            buffers[..values.len()]
                .iter()
                .map(|b| gpu.copy_out(b, len))
                .collect::<Result<Vec<_>>>()
        })?;
        updated
            .into_iter()
            .zip(values)
            .map(|(v, t)| Tensor::from_vec(t.shape().clone(), v))
            .collect()
    }
}

impl OpKernel for Apply {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.0.apply(ctx, |ctx, values, grad| {
            let Some(codes) = apply_codes(&self.0) else {
                return self.0.compute_cpu(ctx, values, grad);
            };
            let current: Vec<&Tensor> = values.iter().map(|t| &**t).collect();
            let updated = self.run(ctx, &current, grad, codes)?;
            for (value, new) in values.iter_mut().zip(updated) {
                **value = new;
            }
            Ok(())
        })
    }
}

/// One row-major product shape, `C (m×n) = op(A) (m×k) · op(B) (k×n)`, as cuBLAS computes it.
struct Product {
    m: usize,
    n: usize,
    k: usize,
    transpose_a: bool,
    transpose_b: bool,
    /// Columns of A and of B as stored: their row-major leading dimensions.
    a_cols: usize,
    b_cols: usize,
}

impl Product {
    /// The product of `a` (rows × cols as stored) and `b` with the given transposes, or
    /// `None` when their inner dimensions differ.
    fn new(
        a: (usize, usize),
        b: (usize, usize),
        transpose_a: bool,
        transpose_b: bool,
    ) -> Option<Product> {
        let (m, k) = if transpose_a { (a.1, a.0) } else { a };
        let (k2, n) = if transpose_b { (b.1, b.0) } else { b };
        (k == k2).then_some(Product {
            m,
            n,
            k,
            transpose_a,
            transpose_b,
            a_cols: a.1,
            b_cols: b.1,
        })
    }

    /// `batch` products in one cuBLAS strided-batched SGEMM: product `i` multiplies the A at
    /// `a[i * a_stride..]` by the B at `b[i * b_stride..]` (a stride of 0 uses one matrix for
    /// every product); returns the `batch` row-major C matrices one after another as a tensor
    /// of shape `shape`, or `None` when a dimension is past cuBLAS's int range (the CPU kernel
    /// takes those).
    fn run(
        &self,
        ctx: &OpContext<'_>,
        batch: usize,
        (a, a_stride): (&Matrices<'_>, usize),
        (b, b_stride): (&Matrices<'_>, usize),
        shape: Shape,
    ) -> Result<Option<Tensor>> {
        let (m, n, k) = (self.m, self.n, self.k);
        let len = batch * m * n;
        if len == 0 || k == 0 {
            // Nothing to multiply: the sums of no products are zeros.
            return Tensor::zeros(DType::Float, shape).map(Some);
        }
        let dims = [m, n, k, batch, self.a_cols, self.b_cols];
        if dims.iter().any(|&d| d > i32::MAX as usize) {
            return Ok(None);
        }
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        // cuBLAS is column-major: a row-major r×c buffer is its c×r transpose with leading
        // dimension c. The row-major C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ,
        // an n×m matrix with leading dimension n, so B's buffer goes first: its column-major
        // view is op(B)ᵀ when B is not transposed.
        let config = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: op(self.transpose_b),
                transb: op(self.transpose_a),
                m: n as i32,
                n: m as i32,
                k: k as i32,
                alpha: 1.0f32,
                lda: self.b_cols as i32,
                ldb: self.a_cols as i32,
                beta: 0.0f32,
                ldc: n as i32,
            },
            batch_size: batch as i32,
            stride_a: b_stride as i64,
            stride_b: a_stride as i64,
            stride_c: (m * n) as i64,
        };
        let bytes = a.copied_in(ctx) + b.copied_in(ctx) + len * F32;
        with_gpu(ctx, bytes, |gpu| {
            let (da, db) = (a.operand(gpu)?, b.operand(gpu)?);
            let mut dc: CudaSlice<f32> = gpu.zeros(len)?;
            // cuBLAS runs in the calling thread's current context, which the copies above
            // made current; say so explicitly rather than rely on it.
            gpu.stream
                .context()
                .bind_to_thread()
                .map_err(super::gpu::driver_error)?;
            // SAFETY: product i reads B at i·b_stride and A at i·a_stride, each an exact
            // (rows × cols) matrix inside its buffer (the callers pass strides of 0 or of one
            // matrix, with `batch` matrices behind a non-zero stride), and writes the m·n
            // floats of C at i·m·n inside dc's batch·m·n.
            unsafe { gpu.blas.gemm_strided_batched(config, &*db, &*da, &mut dc) }
                .map_err(|e| Status::internal(format!("cuBLAS SGEMM: {e}")))?;
            gpu.output(dc, shape).map(Some)
        })
    }
}

/// The matrices of one product operand: an input tensor as it is (on the GPU or the host), or
/// its matrices gathered on the host for a broadcast batch.
enum Matrices<'a> {
    Tensor(&'a Tensor),
    Gathered(Vec<f32>),
}

impl Matrices<'_> {
    /// The bytes the operand copies to the GPU.
    fn copied_in(&self, ctx: &OpContext<'_>) -> usize {
        match self {
            Matrices::Tensor(t) => copied_in(ctx, &[t]),
            Matrices::Gathered(values) => size_of_val(&values[..]),
        }
    }

    /// The operand in the GPU's memory.
    fn operand(&self, gpu: &OnGpu<'_>) -> Result<Operand<'_>> {
        match self {
            Matrices::Tensor(t) => gpu.operand(t),
            Matrices::Gathered(values) => Ok(Operand::Copied(gpu.copy_in(values)?)),
        }
    }
}

/// MatMul through cuBLAS SGEMM, with `transpose_a` / `transpose_b`.
struct MatMul {
    transpose_a: bool,
    transpose_b: bool,
}

impl MatMul {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(MatMul {
            transpose_a: attr::bool_or(node, "transpose_a", false)?,
            transpose_b: attr::bool_or(node, "transpose_b", false)?,
        }))
    }
}

impl OpKernel for MatMul {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (a, b) = (float_input(ctx, 0)?, float_input(ctx, 1)?);
        let (sa, sb) = (a.shape(), b.shape());
        if sa.rank() != 2 || sb.rank() != 2 {
            return Err(ctx.invalid(format!("MatMul needs matrices, got {sa} and {sb}")));
        }
        let (da, db) = (sa.dims(), sb.dims());
        let product = Product::new(
            (da[0], da[1]),
            (db[0], db[1]),
            self.transpose_a,
            self.transpose_b,
        )
        .ok_or_else(|| {
            ctx.invalid(format!(
                "Matrix size-incompatible: In[0]: {sa}, In[1]: {sb} (transpose_a={}, \
                 transpose_b={})",
                self.transpose_a, self.transpose_b
            ))
        })?;
        let shape = Shape::new(vec![product.m, product.n]);
        let operands = (Matrices::Tensor(&a), Matrices::Tensor(&b));
        let Some(out) = product.run(ctx, 1, (&operands.0, 0), (&operands.1, 0), shape)? else {
            return on_cpu(ctx);
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// BatchMatMulV2 through cuBLAS strided-batched SGEMM: products over the last two dimensions
/// with `adj_x` / `adj_y` (real inputs, so adjoint is transpose), numpy-style broadcasting of
/// the others.
struct BatchMatMul {
    adj_x: bool,
    adj_y: bool,
}

impl BatchMatMul {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(BatchMatMul {
            adj_x: attr::bool_or(node, "adj_x", false)?,
            adj_y: attr::bool_or(node, "adj_y", false)?,
        }))
    }
}

/// The matrices of one BatchMatMul operand for the output's `batch` products, with their
/// stride: the operand itself when it has a matrix per product, its only matrix at stride 0
/// when it has one, else (a broadcast along some batch dimensions) its matrices gathered in
/// the output's order.
fn batch_operand<'a>(operand: &'a Tensor, batch: &[usize]) -> Result<(Matrices<'a>, usize)> {
    let dims = operand.dims();
    let (own, size) = dims.split_at(dims.len() - 2);
    let size: usize = size.iter().product();
    let count: usize = own.iter().product();
    let products: usize = batch.iter().product();
    if count == products {
        // Same count and broadcast-compatible: the same batch dimensions (a broadcast 1
        // against a longer dimension would make the count smaller).
        return Ok((Matrices::Tensor(operand), size));
    }
    if count == 1 {
        return Ok((Matrices::Tensor(operand), 0));
    }
    let values = operand.values::<f32>()?;
    let index: Vec<usize> = (0..count).collect();
    let order = broadcast_to(&index, own, batch).expect("batch dimensions broadcast");
    let gathered = order
        .iter()
        .flat_map(|&i| &values[i * size..(i + 1) * size])
        .copied()
        .collect();
    Ok((Matrices::Gathered(gathered), size))
}

impl OpKernel for BatchMatMul {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (x, y) = (float_input(ctx, 0)?, float_input(ctx, 1)?);
        let (sx, sy) = (x.shape(), y.shape());
        for (i, s) in [sx, sy].into_iter().enumerate() {
            if s.rank() < 2 {
                return Err(ctx.invalid(format!(
                    "In[{i}] ndims must be >= 2: {} (shape {s})",
                    s.rank()
                )));
            }
        }
        let (dx, dy) = (sx.dims(), sy.dims());
        let (rx, ry) = (dx.len(), dy.len());
        let product = Product::new(
            (dx[rx - 2], dx[rx - 1]),
            (dy[ry - 2], dy[ry - 1]),
            self.adj_x,
            self.adj_y,
        )
        .ok_or_else(|| {
            ctx.invalid(format!(
                "Matrix size-incompatible: In[0]: {sx}, In[1]: {sy} (adj_x={}, adj_y={})",
                self.adj_x, self.adj_y
            ))
        })?;
        let batch = broadcast_shape(&dx[..rx - 2], &dy[..ry - 2]).ok_or_else(|| {
            ctx.invalid(format!(
                "In[0] and In[1] must have compatible batch dimensions: {sx} vs. {sy}"
            ))
        })?;
        let products: usize = batch.iter().product();
        let mut dims = batch.clone();
        dims.extend([product.m, product.n]);
        let (xs, x_stride) = batch_operand(&x, &batch)?;
        let (ys, y_stride) = batch_operand(&y, &batch)?;
        let shape = Shape::new(dims);
        let Some(out) = product.run(ctx, products, (&xs, x_stride), (&ys, y_stride), shape)? else {
            return on_cpu(ctx);
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::resource::ResourceMgr;

    #[test]
    fn an_int32_node_gets_the_cpu_kernel_and_needs_no_gpu() {
        // Shape arithmetic of a gradient graph: [2, 3] * [4, 5] = [8, 15], on a GPU device
        // name, on a host without CUDA.
        let node = NodeDef {
            name: "gradients/Mul".into(),
            op: "Mul".into(),
            attr: [("T".to_string(), attr::value::dtype(DType::Int32))].into(),
            ..Default::default()
        };
        let kernel = kernel_for("Mul").unwrap()(&node).unwrap();
        let inputs = vec![
            Tensor::from_vec([2], vec![2i32, 3]).unwrap(),
            Tensor::from_vec([2], vec![4i32, 5]).unwrap(),
        ];
        let resources = ResourceMgr::new();
        let mut ctx = OpContext::new(
            &node,
            inputs,
            &resources,
            "/job:w/replica:0/task:0/device:GPU:0",
            1,
        );
        kernel.compute(&mut ctx).unwrap();
        let out = ctx.take_outputs().remove(0).unwrap();
        assert_eq!(out.values::<i32>().unwrap().as_ref(), &[8, 15]);
        assert!(kernel_for("DepthwiseConv2dNative").is_none());
    }

    #[test]
    fn batch_operands_are_passed_whole_shared_at_stride_zero_or_gathered() {
        // Four 1×2 matrices: [0, 1], [2, 3], [4, 5], [6, 7].
        let values: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let matrices = |dims: &[usize]| {
            let n = dims.iter().product();
            Tensor::from_vec(dims.to_vec(), values[..n].to_vec()).unwrap()
        };
        let four = matrices(&[4, 1, 2]);
        let (same, stride) = batch_operand(&four, &[4]).unwrap();
        assert!(matches!(same, Matrices::Tensor(t) if std::ptr::eq(t, &four)));
        assert_eq!(stride, 2);
        let one = matrices(&[1, 1, 2]);
        let (shared, stride) = batch_operand(&one, &[3]).unwrap();
        assert!(matches!(shared, Matrices::Tensor(t) if std::ptr::eq(t, &one)));
        assert_eq!(stride, 0);
        // [2, 1] batches against [2, 3]: each of the two matrices three times.
        let two = matrices(&[2, 1, 1, 2]);
        let (gathered, stride) = batch_operand(&two, &[2, 3]).unwrap();
        assert_eq!(stride, 2);
        let Matrices::Gathered(gathered) = gathered else {
            panic!("a broadcast batch is gathered on the host")
        };
        assert_eq!(
            gathered,
            [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0, 2.0, 3.0]
        );
    }

    #[test]
    fn batch_matmul_shape_errors_name_the_shapes_before_touching_a_gpu() {
        let node = NodeDef {
            name: "bmm".into(),
            op: "BatchMatMulV2".into(),
            attr: [("T".to_string(), attr::value::dtype(DType::Float))].into(),
            ..Default::default()
        };
        let kernel = kernel_for("BatchMatMulV2").unwrap()(&node).unwrap();
        let resources = ResourceMgr::new();
        let cases = [
            ([2, 3, 4], [2, 5, 6], "Matrix size-incompatible"),
            ([2, 3, 4], [3, 4, 6], "compatible batch dimensions"),
        ];
        for (x, y, want) in cases {
            let inputs = vec![
                Tensor::from_vec(x, vec![0f32; x.iter().product()]).unwrap(),
                Tensor::from_vec(y, vec![0f32; y.iter().product()]).unwrap(),
            ];
            let mut ctx = OpContext::new(
                &node,
                inputs,
                &resources,
                "/job:w/replica:0/task:0/device:GPU:0",
                1,
            );
            let err = kernel.compute(&mut ctx).unwrap_err();
            assert_eq!(err.code(), crate::Code::InvalidArgument, "{err}");
            assert!(err.message().contains(want), "{err}");
            assert!(err.message().contains("[2,3,4]"), "{err}");
        }
    }

    /// Runs `node`'s GPU kernel on a GPU device name with `inputs`; on a host without a GPU
    /// only the checks before the GPU is touched can answer.
    fn gpu_error(node: &NodeDef, inputs: Vec<Tensor>) -> Status {
        let kernel = kernel_for(&node.op).unwrap()(node).unwrap();
        let resources = ResourceMgr::new();
        let mut ctx = OpContext::new(
            node,
            inputs,
            &resources,
            "/job:w/replica:0/task:0/device:GPU:0",
            1,
        );
        kernel.compute(&mut ctx).unwrap_err()
    }

    fn float_node(op: &str) -> NodeDef {
        NodeDef {
            name: format!("n/{op}"),
            op: op.into(),
            attr: [("T".to_string(), attr::value::dtype(DType::Float))].into(),
            ..Default::default()
        }
    }

    /// A float32 node of a convolution or pooling op: SAME, stride 1, a 2×2 window (the
    /// pools' `ksize`).
    fn window_node(op: &str) -> NodeDef {
        let mut node = float_node(op);
        let attrs = [
            ("strides", attr::value::int_list(vec![1; 4])),
            ("padding", attr::value::string("SAME")),
            ("ksize", attr::value::int_list(vec![1, 2, 2, 1])),
        ];
        for (k, v) in attrs {
            if k != "ksize" || op.contains("Pool") {
                node.attr.insert(k.into(), v);
            }
        }
        node
    }

    fn sizes(dims: &[i32]) -> Tensor {
        Tensor::from_vec([dims.len()], dims.to_vec()).unwrap()
    }

    #[test]
    fn an_int32_pool_gets_the_cpu_kernel_and_needs_no_gpu() {
        let mut node = window_node("MaxPool");
        node.attr
            .insert("T".into(), attr::value::dtype(DType::Int32));
        let kernel = kernel_for("MaxPool").unwrap()(&node).unwrap();
        let x = Tensor::from_vec([1, 2, 2, 1], vec![3i32, 1, 4, 1]).unwrap();
        let resources = ResourceMgr::new();
        let device = "/job:w/replica:0/task:0/device:GPU:0";
        let mut ctx = OpContext::new(&node, vec![x], &resources, device, 1);
        kernel.compute(&mut ctx).unwrap();
        let out = ctx.take_outputs().remove(0).unwrap();
        assert_eq!(out.values::<i32>().unwrap().as_ref(), &[4, 1, 4, 1]);
    }

    #[test]
    fn bad_input_is_reported_in_the_cpu_kernels_words_before_touching_a_gpu() {
        let m = |dims: &[usize]| {
            Tensor::from_vec(dims.to_vec(), vec![0.5f32; dims.iter().product()]).unwrap()
        };
        let cases = [
            (
                float_node("ReluGrad"),
                vec![m(&[2, 3]), m(&[3])],
                "must have the same size and shape",
            ),
            (
                float_node("Sum"),
                vec![m(&[2, 3]), Tensor::from_vec([2], vec![1i32, 1]).unwrap()],
                "duplicate dimension: 1",
            ),
            (
                float_node("Max"),
                vec![m(&[2, 3]), Tensor::scalar(2i32)],
                "Invalid reduction dimension 2",
            ),
            (
                float_node("SparseSoftmaxCrossEntropyWithLogits"),
                vec![m(&[2, 3]), Tensor::from_vec([2], vec![0i64, 3]).unwrap()],
                "label value of 3 which is outside the valid range of [0, 3)",
            ),
            (
                float_node("BiasAdd"),
                vec![m(&[2, 3]), m(&[2])],
                "as many biases as the channel dimension",
            ),
            (float_node("BiasAddGrad"), vec![m(&[3])], "at least 2D"),
            // Shapes that do not broadcast: the CPU kernel's message names both.
            (
                float_node("Mul"),
                vec![m(&[2, 3]), m(&[4])],
                "Incompatible shapes",
            ),
            // The windowed ops check with the CPU kernels' checks.
            (
                window_node("Conv2D"),
                vec![m(&[1, 4, 4, 3]), m(&[2, 2, 2, 1])],
                "input depth must be evenly divisible by filter depth: 3 vs 2",
            ),
            (
                window_node("Conv2DBackpropFilter"),
                vec![m(&[1, 4, 4, 2]), sizes(&[2, 2, 2, 1]), m(&[1, 4, 3, 1])],
                "Size of out_backprop doesn't match computed: actual = 3, computed = 4",
            ),
            (
                window_node("MaxPoolGrad"),
                vec![m(&[1, 4, 4, 2]), m(&[1, 4, 4, 2]), m(&[1, 4, 4, 1])],
                "Expected grad shape to be [1,4,4,2], but got [1,4,4,1]",
            ),
            (
                window_node("AvgPool"),
                vec![m(&[4, 4, 2])],
                "tensor_in must be 4-dimensional",
            ),
        ];
        for (node, inputs, want) in cases {
            let err = gpu_error(&node, inputs);
            assert_eq!(
                err.code(),
                crate::Code::InvalidArgument,
                "{}: {err}",
                node.op
            );
            assert!(err.message().contains(want), "{}: {err}", node.op);
            assert!(err.message().contains(&node.name), "{}: {err}", node.op);
        }
    }

    #[test]
    fn a_kernel_past_the_gpus_memory_budget_is_resource_exhausted_before_touching_it() {
        let device = "/job:w/replica:0/task:0/device:GPU:0";
        let budget = crate::device::MemoryBudget::new(device, 3000);
        let resources = ResourceMgr::new();
        let m = || Tensor::from_vec([16, 16], vec![1f32; 256]).unwrap();
        // A 16×16 product holds three matrices of 1024 bytes on the GPU; Add the same and its
        // layout (dims and two operands' strides, 6 × 8 bytes).
        for (op, bytes) in [("MatMul", "3072 bytes"), ("Add", "3120 bytes")] {
            let node = float_node(op);
            let kernel = kernel_for(op).unwrap()(&node).unwrap();
            let mut ctx = OpContext::new(&node, vec![m(), m()], &resources, device, 1)
                .with_memory(Some(&budget));
            let err = kernel.compute(&mut ctx).unwrap_err();
            assert_eq!(err.code(), crate::Code::ResourceExhausted, "{op}: {err}");
            for part in [node.name.as_str(), bytes, "3000 bytes", "GPU:0"] {
                assert!(err.message().contains(part), "{op}: {part}: {err}");
            }
            assert_eq!(budget.in_use(), 0, "{op}: the failed charge took nothing");
        }
    }

    #[test]
    fn every_optimizer_update_has_a_gpu_kernel_that_checks_its_variables_first() {
        for op in [
            "ResourceApplyGradientDescent",
            "ResourceApplyAdagrad",
            "ResourceApplyAdagradV2",
            "ResourceApplyMomentum",
            "ResourceApplyAdam",
            "ResourceApplyRMSProp",
            "ResourceApplyCenteredRMSProp",
        ] {
            let node = float_node(op);
            let handle = |name: &str| {
                Tensor::resource(crate::tensor::ResourceHandle {
                    device: "/job:w/replica:0/task:0/device:GPU:0".into(),
                    container: "localhost".into(),
                    name: name.into(),
                    type_name: "Var".into(),
                })
            };
            // Every input a resource handle to a variable nobody created.
            let inputs: Vec<Tensor> = (0..10).map(|i| handle(&format!("v{i}"))).collect();
            let err = gpu_error(&node, inputs);
            assert_eq!(err.code(), crate::Code::FailedPrecondition, "{op}: {err}");
            assert!(
                err.message().contains("uninitialized value v0"),
                "{op}: {err}"
            );
        }
    }

    #[test]
    fn the_gpu_kernels_are_the_gpu_op_set() {
        for op in crate::graph::registry::global().op_names() {
            assert_eq!(
                gpu_factory(op).is_some(),
                crate::kernels::gpu_ops::computes(op),
                "{op}"
            );
            assert_eq!(
                kernel_for(op).is_some(),
                crate::kernels::gpu_ops::runs_on_gpu(op),
                "{op}"
            );
        }
    }

    #[test]
    fn apply_codes_follow_the_kernels_rule_list() {
        let code = |op: &str, attrs: &[(&str, bool)]| {
            let mut node = float_node(op);
            for &(k, v) in attrs {
                node.attr.insert(k.into(), attr::value::bool(v));
            }
            apply_codes(&Update::new(&node).unwrap()).unwrap()
        };
        assert_eq!(code("ResourceApplyGradientDescent", &[]), (0, 2));
        assert_eq!(
            code("ResourceApplyAdagrad", &[("update_slots", false)]),
            (1, 0)
        );
        assert_eq!(code("ResourceApplyAdagradV2", &[]), (2, 2));
        assert_eq!(
            code("ResourceApplyMomentum", &[("use_nesterov", true)]),
            (3, 3)
        );
        assert_eq!(code("ResourceApplyAdam", &[]), (4, 2));
        assert_eq!(code("ResourceApplyRMSProp", &[]), (5, 2));
        assert_eq!(code("ResourceApplyCenteredRMSProp", &[]), (6, 2));
    }
}
