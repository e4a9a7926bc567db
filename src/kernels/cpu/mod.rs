//! CPU kernels, one file per op family; math through ndarray.
//!
//! [`kernel_for`] maps a TensorFlow op name onto the factory of its kernel. Each family file
//! (`math`, `matmul`, `nn` with `conv`, `depthwise`, `pool`, `batch_norm`, `lrn` and
//! `activation`, `fused` (TensorFlow's fused ops as chains of those kernels), `reduce`,
//! `scan` (cumulative sums and products), `top_k`, `compare`, `array`, `slicing`, `pad`,
//! `gather_nd`, `feature_columns` (its hashes in `fingerprint`), `strings` (RE2 through
//! `re2`, printf through `printf`, tensor summaries through `summary_text`), `parsing`
//! (`tf.train.Example` read by `example_wire`), `decode` (numbers, raw bytes, CSV),
//! `sparse_cross` and `sparse_rows` (crossed columns, empty rows filled, sparse reshapes),
//! `lookup` (hash tables as resources), `random` with `stateless_random`,
//! `sparse_serialization` (SerializeSparse, DeserializeSparse), `list` with `list_tensor`,
//! `linalg` (Einsum in `einsum`, MatrixInverse, HistogramFixedWidth),
//! `control_flow`, `segment`, `variable`, `ref_variable`, `resource_scatter`, `training` with
//! `sparse_training`, `io`, `queue`,
//! `accumulator`, `tensor_array_ops` (the array itself in `tensor_array`), `stack`, `summary`,
//! `logging` (Print, PrintV2, ReadFile, WriteFile))
//! exposes its own `kernel_for`; this module asks them in turn. Shared pieces: `broadcast` (numpy
//! broadcasting), `numeric` (element arithmetic traits), `items` (element types that can be
//! moved around, strings included) and `rows` (cutting and joining tensors along dimension 0,
//! for the TensorArray and TensorList kernels). Kernels that need no attrs are [`Stateless`]
//! wrappers around a plain function; the others parse their attrs once in the factory and keep
//! them in a struct.
//!
//! Dtypes are dispatched with the macros below: a kernel names the dtypes TensorFlow registers
//! it for, and any other dtype fails with INVALID_ARGUMENT naming the node and the dtypes it
//! accepts.

use std::sync::Arc;

use super::{Inline, KernelFactory, OpContext, OpKernel};
use crate::error::Result;
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Runs `$body` with the type alias `$T` bound to the Rust type of `$dtype`, for the listed
/// dtypes; any other dtype returns INVALID_ARGUMENT from the enclosing function.
///
/// After `raw`, groups of dtypes of one element size run `$body` with `$T` bound to that
/// size's [`items::Raw`] carrier, their dtype named ([`items::RawDType`]) while it runs.
macro_rules! dispatch {
    ($ctx:expr, $dtype:expr, [$($variant:ident => $t:ty),* $(,)?], $T:ident => $body:expr) => {
        dispatch!($ctx, $dtype, [$($variant => $t),*], raw [], $T => $body)
    };
    ($ctx:expr, $dtype:expr, [$($variant:ident => $t:ty),* $(,)?],
     raw [$($($raw:ident)|+ => $rt:ty),* $(,)?], $T:ident => $body:expr) => {{
        match $dtype {
            $(crate::tensor::DType::$variant => {
                #[allow(dead_code)]
                type $T = $t;
                $body
            })*
            // One arm per element size (one copy of `$body` per carrier, not per dtype).
            $(#[allow(unused_parens)]
            dtype @ ($(crate::tensor::DType::$raw)|+) => {
                #[allow(dead_code)]
                type $T = $rt;
                let _named = crate::kernels::cpu::items::RawDType::enter(dtype);
                $body
            })*
            other => {
                let accepted: &[crate::tensor::DType] =
                    &[$(crate::tensor::DType::$variant,)* $($(crate::tensor::DType::$raw,)+)*];
                return Err(crate::kernels::cpu::unsupported_dtype($ctx, other, accepted));
            }
        }
    }};
}

/// [`dispatch!`] over float32 and float64.
macro_rules! dispatch_float {
    ($ctx:expr, $dtype:expr, $T:ident => $body:expr) => {
        dispatch!($ctx, $dtype, [Float => f32, Double => f64], $T => $body)
    };
}

/// [`dispatch!`] over the numeric dtypes: float32, float64, int32, int64.
macro_rules! dispatch_real {
    ($ctx:expr, $dtype:expr, $T:ident => $body:expr) => {
        dispatch!($ctx, $dtype, [Float => f32, Double => f64, Int32 => i32, Int64 => i64], $T => $body)
    };
}

/// [`dispatch!`] over every fixed-size dtype: the numeric ones and bool.
macro_rules! dispatch_all {
    ($ctx:expr, $dtype:expr, $T:ident => $body:expr) => {
        dispatch!(
            $ctx,
            $dtype,
            [Float => f32, Double => f64, Int32 => i32, Int64 => i64, Bool => bool],
            $T => $body
        )
    };
}

/// [`dispatch!`] over every dtype whose elements can be moved around: the fixed-size ones
/// and strings (as [`Items`]); the dtypes kernels seldom compute on travel as their bytes
/// ([`items::Raw`]), as TensorFlow registers its moving kernels for every type.
macro_rules! dispatch_items {
    ($ctx:expr, $dtype:expr, $T:ident => $body:expr) => {
        dispatch!(
            $ctx,
            $dtype,
            [Float => f32, Double => f64, Int32 => i32, Int64 => i64, Bool => bool, String => bytes::Bytes],
            raw [
                UInt8 | Int8 => crate::kernels::cpu::items::Raw<1>,
                Int16 | UInt16 | Half | BFloat16 => crate::kernels::cpu::items::Raw<2>,
                UInt32 => crate::kernels::cpu::items::Raw<4>,
                UInt64 | Complex64 => crate::kernels::cpu::items::Raw<8>,
            ],
            $T => $body
        )
    };
}

mod accumulator;
mod activation;
mod approx;
mod array;
mod batch_norm;
mod blas;
pub mod broadcast;
mod cast;
pub mod collective;
mod compare;
mod control_flow;
pub(crate) mod conv;
mod decode;
mod depthwise;
mod einsum;
mod example_wire;
mod feature_columns;
mod fingerprint;
mod forward;
mod fused;
pub mod fused_element_wise;
mod gather_nd;
mod gemm;
mod io;
mod items;
mod linalg;
mod list;
mod list_tensor;
mod logging;
mod lookup;
mod lrn;
mod math;
mod matmul;
pub(crate) mod nn;
mod numeric;
mod pad;
mod parsing;
pub(crate) mod pool;
mod prefetch;
mod printf;
mod queue;
pub mod random;
mod re2;
pub(crate) mod reduce;
mod ref_variable;
mod resource_scatter;
pub mod rows;
mod scan;
mod segment;
mod sendrecv;
mod slicing;
mod sparse_cross;
mod sparse_rows;
mod sparse_serialization;
mod sparse_training;
mod split;
mod stack;
mod stateless_random;
mod strings;
pub mod summary;
mod summary_text;
mod tensor_array;
mod tensor_array_ops;
mod top_k;
pub mod training;
mod variable;
mod widen;

pub use items::Items;
pub use list::TensorList;
pub use numeric::{Float, Real};
pub use stack::Stack;
pub use tensor_array::TensorArray;

/// Returns the CPU kernel factory for `op`.
pub fn kernel_for(op: &str) -> Option<KernelFactory> {
    unwrapped_kernel_for(op).map(|factory| widen::wrap(op, factory))
}

/// The factory of `op`'s own kernel, before [`widen`] wraps it to take the narrow dtypes.
fn unwrapped_kernel_for(op: &str) -> Option<KernelFactory> {
    COMPUTING
        .iter()
        .chain(&MAY_WAIT)
        .find_map(|family| family(op))
}

/// A family's lookup of its ops' kernel factories.
type Family = fn(&str) -> Option<KernelFactory>;

/// The families whose kernels compute on their inputs and nothing else (a TensorList is a
/// value, so its ops are among them).
const COMPUTING: [Family; 25] = [
    math::kernel_for,
    nn::kernel_for,
    fused::kernel_for,
    fused_element_wise::kernel_for,
    reduce::kernel_for,
    scan::kernel_for,
    top_k::kernel_for,
    compare::kernel_for,
    array::kernel_for,
    slicing::kernel_for,
    gather_nd::kernel_for,
    feature_columns::kernel_for,
    strings::kernel_for,
    parsing::kernel_for,
    decode::kernel_for,
    sparse_cross::kernel_for,
    sparse_rows::kernel_for,
    pad::kernel_for,
    random::kernel_for,
    stateless_random::kernel_for,
    sparse_serialization::kernel_for,
    control_flow::kernel_for,
    list::kernel_for,
    segment::kernel_for,
    linalg::kernel_for,
];

/// The families whose kernels may wait: for a variable's lock, a tensor, the other members of
/// an all-reduce, a queue, accumulator or lookup table, a file (checkpoints, event files); and those that
/// keep a step's state (TensorArrays, stacks), which only take a short lock but change what
/// later nodes see.
const MAY_WAIT: [Family; 14] = [
    variable::kernel_for,
    ref_variable::kernel_for,
    resource_scatter::kernel_for,
    collective::kernel_for,
    training::kernel_for,
    sendrecv::kernel_for,
    io::kernel_for,
    queue::kernel_for,
    accumulator::kernel_for,
    lookup::kernel_for,
    tensor_array_ops::kernel_for,
    stack::kernel_for,
    summary::kernel_for,
    logging::kernel_for,
];

/// Whether a node may run inline on the thread that starts its step (see [`Inline`]). Only
/// the families that compute on their inputs and nothing else qualify, and `_Send`, which
/// never waits; receives from this task's rendezvous qualify once their value is there. The
/// rest may wait: for another task (`_Recv`), a queue or accumulator, a variable's lock that
/// another step's update holds, or a file.
pub fn inline_kind(node: &NodeDef) -> Inline {
    let op = node.op.as_str();
    if let Some(key) = sendrecv::local_recv_key(node) {
        return Inline::WhenSent(key);
    }
    let computes = COMPUTING.iter().any(|family| family(op).is_some());
    if computes || matches!(op, "_Send" | "_HostSend") {
        Inline::WhenCheap
    } else {
        Inline::Never
    }
}

/// The signature of a kernel that needs nothing from its node's attrs.
type ComputeFn = fn(&mut OpContext<'_>) -> Result<()>;

/// A kernel that is a plain function of its inputs.
struct Stateless(ComputeFn);

impl OpKernel for Stateless {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        (self.0)(ctx)
    }
}

/// Wraps an attr-free compute function as a kernel (for use in factories).
fn stateless(f: ComputeFn) -> Result<Arc<dyn OpKernel>> {
    Ok(Arc::new(Stateless(f)))
}

/// The error for an input dtype a kernel is not registered for.
pub(crate) fn unsupported_dtype(
    ctx: &OpContext<'_>,
    dtype: DType,
    accepted: &[DType],
) -> crate::Status {
    let names: Vec<&str> = accepted.iter().map(|d| d.name()).collect();
    ctx.invalid(format!(
        "no CPU kernel for dtype {dtype}; this op accepts {}",
        names.join(", ")
    ))
}

/// Returns input `i`, cloned (cheap: the buffer is shared) so that outputs can be set after.
fn input(ctx: &OpContext<'_>, i: usize) -> Result<Tensor> {
    ctx.input(i).cloned()
}

/// Fails unless `a` and `b` have the same dtype (TensorFlow's `T` attr binds both).
fn same_dtype(ctx: &OpContext<'_>, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(ctx.invalid(format!(
            "inputs have different dtypes: {} vs. {}; cast one of them",
            a.dtype(),
            b.dtype()
        )));
    }
    Ok(())
}

/// Reads an int32 or int64 tensor (a shape, axes, indices) as `i64`s.
fn int_values(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<Vec<i64>> {
    match t.dtype() {
        DType::Int32 => Ok(t.values::<i32>()?.iter().map(|&v| i64::from(v)).collect()),
        DType::Int64 => Ok(t.values::<i64>()?.into_owned()),
        other => Err(ctx.invalid(format!("{what} must be int32 or int64, got {other}"))),
    }
}

/// Reads a scalar (or one-element) int32/int64 tensor.
pub(crate) fn int_scalar(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<i64> {
    let values = int_values(ctx, t, what)?;
    match values.as_slice() {
        [v] if t.rank() <= 1 => Ok(*v),
        _ => Err(ctx.invalid(format!("{what} must be a scalar, got shape {}", t.shape()))),
    }
}

/// The most elements a kernel allocates for one output (2^32); bigger requests fail with
/// RESOURCE_EXHAUSTED instead of aborting the process on allocation.
const MAX_ELEMENTS: usize = 1 << 32;

/// Returns the element count of `dims`, or RESOURCE_EXHAUSTED when it is too big to allocate:
/// over [`MAX_ELEMENTS`], or more than the device's memory budget has left for elements of the
/// node's `dtype` or `T` (4 bytes when it has neither).
fn checked_elements(ctx: &OpContext<'_>, dims: &[usize]) -> Result<usize> {
    let n = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            let node = ctx.node();
            crate::Status::resource_exhausted(format!(
                "node `{}` (op {}): OOM when allocating tensor with shape {}; the most one \
                 output may hold is {MAX_ELEMENTS} elements",
                node.name,
                node.op,
                crate::tensor::Shape::new(dims.to_vec())
            ))
        })?;
    let node = ctx.node();
    let element = ["dtype", "T"]
        .iter()
        .find_map(|key| crate::graph::attr::dtype(node, key).ok())
        .and_then(|dtype| dtype.size())
        .unwrap_or(4);
    ctx.check_fits((n as u64).saturating_mul(element as u64))?;
    Ok(n)
}

/// Reads a 1-D int tensor holding a shape to allocate; every dimension must be non-negative
/// and the element count within [`MAX_ELEMENTS`].
fn shape_values(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<Vec<usize>> {
    if t.rank() > 1 {
        return Err(ctx.invalid(format!("{what} must be a vector, got shape {}", t.shape())));
    }
    let dims = int_values(ctx, t, what)?
        .into_iter()
        .map(|d| {
            usize::try_from(d)
                .map_err(|_| ctx.invalid(format!("{what} has a negative dimension {d}")))
        })
        .collect::<Result<Vec<_>>>()?;
    checked_elements(ctx, &dims)?;
    Ok(dims)
}

/// Maps an axis in `[-rank, rank)` onto `[0, rank)`.
fn normalize_axis(ctx: &OpContext<'_>, axis: i64, rank: usize, what: &str) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(ctx.invalid(format!(
            "{what} {axis} is out of range for a tensor of rank {rank}; expected a value in [{}, {r})",
            -r
        )));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// [`run_alone`] of float32 `op` (its `T`) with no other attributes, which must succeed.
#[cfg(test)]
pub(crate) fn run_float32(
    op: &str,
    inputs: Vec<Tensor>,
    intra: Option<&crate::runtime::intra::IntraPool>,
) -> Vec<Tensor> {
    let node = NodeDef {
        name: format!("{op}_node"),
        op: op.into(),
        attr: [(
            "T".to_string(),
            crate::graph::attr::value::dtype(DType::Float),
        )]
        .into(),
        ..NodeDef::default()
    };
    run_alone(&node, inputs, intra).unwrap()
}

/// A float32 tensor's elements as their bits, for the tests that compare kernels to the bit.
#[cfg(test)]
pub(crate) fn float32_bits(t: &Tensor) -> Vec<u32> {
    t.values::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Runs the CPU kernel of `node` on `inputs` in a context of its own (over `intra` when given,
/// the process's intra-op pool otherwise); returns its outputs. For the kernels' unit tests.
#[cfg(test)]
pub(crate) fn run_alone(
    node: &NodeDef,
    inputs: Vec<Tensor>,
    intra: Option<&crate::runtime::intra::IntraPool>,
) -> Result<Vec<Tensor>> {
    let kernel = super::create_kernel(node, crate::device::DeviceType::Cpu)?;
    let resources = crate::runtime::resource::ResourceMgr::new();
    let mut ctx = OpContext::new(node, inputs, &resources, "/device:CPU:0", 1);
    if let Some(intra) = intra {
        ctx = ctx.with_intra(intra);
    }
    kernel.compute(&mut ctx)?;
    Ok(ctx
        .take_outputs()
        .into_iter()
        .map(|t| t.expect("the kernel set every output"))
        .collect())
}
