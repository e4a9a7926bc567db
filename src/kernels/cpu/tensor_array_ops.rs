//! TensorArray kernels: `TensorArrayV3`, `TensorArrayGradV3`, `TensorArrayGradWithShape`,
//! `TensorArrayWriteV3`, `TensorArrayReadV3`, `TensorArrayGatherV3`, `TensorArrayScatterV3`,
//! `TensorArrayConcatV3`, `TensorArraySplitV3`, `TensorArraySizeV3`, `TensorArrayCloseV3`. The
//! array itself and its semantics are in [`super::tensor_array`].
//!
//! **Where an array lives.** As in TensorFlow, an array belongs to the step that created it:
//! it is a resource in the device's [`ResourceMgr`](crate::runtime::resource::ResourceMgr),
//! in the step's container ([`step_container`]`(step_id)`, TensorFlow's `__per_step_<id>`),
//! under `_tensor_arrays<name>_<n>` where `<name>` is the `tensor_array_name` attr (else the
//! node's name) and `<n>` a process-wide counter, so two steps, or two runs of one node in a
//! step, never share an array. A gradient array is `_tensor_array_grads<name>_<n>@<source>`
//! in the same container, created by the first `TensorArrayGradV3` of a `source` and found by
//! the later ones. `TensorArrayCloseV3` clears an array and marks it closed (later uses fail,
//! as in TensorFlow); the entries themselves go when the step ends, through
//! [`ResourceMgr::cleanup_step`](crate::runtime::resource::ResourceMgr::cleanup_step), which
//! whoever runs the step calls (TensorFlow drops the step's container the same way).
//!
//! The `flow` tensors carry no data: they order the ops on one array in the graph, and each
//! op passes its `flow_in` on as `flow_out`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::array::tf_dtype_name;
use super::rows;
use super::tensor_array::{Options, TensorArray};
use super::variable::handle_input;
use super::{input, stateless};
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::resource::step_container;
use crate::tensor::{DType, PartialShape, ResourceHandle, Shape, Tensor};

/// The `type_name` of a TensorArray's resource handle.
pub const TENSOR_ARRAY_TYPE_NAME: &str = "TensorArray";

/// The prefix of a forward array's resource name (TensorFlow's container name for them).
const ARRAYS: &str = "_tensor_arrays";
/// The prefix of a gradient array's resource name.
const GRADS: &str = "_tensor_array_grads";

/// Numbers the arrays created in this process, so that every creation has its own name.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Returns the factory for a TensorArray op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "TensorArrayV3" => Create::create,
        "TensorArrayGradV3" | "TensorArrayGradWithShape" => Grad::create,
        "TensorArrayWriteV3" => |_| stateless(write),
        "TensorArrayReadV3" => Read::create,
        "TensorArrayGatherV3" => Gather::create,
        "TensorArrayScatterV3" => |_| stateless(scatter),
        "TensorArrayConcatV3" => Concat::create,
        "TensorArraySplitV3" => |_| stateless(split),
        "TensorArraySizeV3" => |_| stateless(size),
        "TensorArrayCloseV3" => |_| stateless(close),
        _ => return None,
    };
    Some(factory)
}

/// Looks up the array behind input 0, or an error naming the node and the array.
fn lookup(ctx: &OpContext<'_>) -> Result<Arc<TensorArray>> {
    let h = handle_input(ctx, 0)?;
    match ctx.resources.lookup::<TensorArray>(&h.container, &h.name) {
        Ok(ta) => Ok(ta),
        Err(e) if e.code() == Code::NotFound => Err(Status::not_found(format!(
            "node `{}` (op {}): TensorArray `{}` does not exist on {} (container `{}`); a \
             TensorArray lives for the step that created it: run its TensorArrayV3 in the same \
             step",
            ctx.node().name,
            ctx.node().op,
            h.name,
            ctx.device,
            h.container
        ))),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

/// The handle of the array named `name` in `container` on this device.
fn handle(ctx: &OpContext<'_>, container: &str, name: String) -> Tensor {
    Tensor::resource(ResourceHandle {
        device: ctx.device.to_string(),
        container: container.to_string(),
        name,
        type_name: TENSOR_ARRAY_TYPE_NAME.to_string(),
    })
}

/// Reads a scalar int32 input (an index, a size).
fn scalar_i32(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<i64> {
    let t = ctx.input(i)?;
    if t.rank() != 0 {
        return Err(ctx.invalid(format!(
            "{what} must be scalar, but had shape: {}",
            t.shape()
        )));
    }
    Ok(i64::from(
        t.scalar_value::<i32>()
            .map_err(|e| ctx.invalid(e.message()))?,
    ))
}

/// Reads a vector input of int32 (indices) or int64 (lengths) values.
fn vector(ctx: &OpContext<'_>, i: usize, message: &str) -> Result<Vec<i64>> {
    let t = ctx.input(i)?;
    if t.rank() != 1 {
        return Err(ctx.invalid(format!("{message}{}", t.shape())));
    }
    super::int_values(ctx, t, "indices")
}

/// The error for a value whose dtype is not the array's.
fn wrong_dtype(ctx: &OpContext<'_>, ta: &TensorArray, got: DType, verb: &str) -> Status {
    ctx.invalid(format!(
        "TensorArray dtype is {} but Op {verb} dtype {}.",
        tf_dtype_name(ta.dtype),
        tf_dtype_name(got)
    ))
}

/// TensorArrayV3(size) -> (handle, flow).
struct Create {
    dtype: DType,
    element_shape: PartialShape,
    dynamic_size: bool,
    clear_after_read: bool,
    identical_element_shapes: bool,
    name: String,
}

impl Create {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let name = attr::string_or(node, "tensor_array_name", "")?;
        Ok(Arc::new(Create {
            dtype: attr::dtype(node, "dtype")?,
            element_shape: match attr::get(node, "element_shape") {
                Some(_) => attr::shape(node, "element_shape")?,
                None => PartialShape::unknown(),
            },
            dynamic_size: attr::bool_or(node, "dynamic_size", false)?,
            clear_after_read: attr::bool_or(node, "clear_after_read", true)?,
            identical_element_shapes: attr::bool_or(node, "identical_element_shapes", false)?,
            name: if name.is_empty() {
                node.name.clone()
            } else {
                name
            },
        }))
    }
}

impl OpKernel for Create {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let size = scalar_i32(ctx, 0, "TensorArray size")?;
        if size < 0 {
            return Err(ctx.invalid("Size should be >= 0."));
        }
        let unique = format!("{}_{}", self.name, COUNTER.fetch_add(1, Ordering::Relaxed));
        let key = format!("{ARRAYS}{unique}");
        let container = step_container(ctx.step_id);
        let options = Options {
            dtype: self.dtype,
            size: size as usize,
            element_shape: self.element_shape.clone(),
            identical_element_shapes: self.identical_element_shapes,
            dynamic_size: self.dynamic_size,
            clear_after_read: self.clear_after_read,
            is_grad: false,
            marked_size: -1,
        };
        let array = TensorArray::new(unique, options).map_err(|e| ctx.named(e))?;
        ctx.resources
            .lookup_or_create(&container, &key, || Ok(array))
            .map_err(|e| ctx.named(e))?;
        ctx.set_output(0, handle(ctx, &container, key));
        ctx.set_output(1, Tensor::scalar(0f32));
        Ok(())
    }
}

/// TensorArrayGradV3(handle, flow_in) and TensorArrayGradWithShape(handle, flow_in,
/// shape_to_prepend) -> (grad_handle, flow_out): the gradient array of `source`.
struct Grad {
    source: String,
}

impl Grad {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Grad {
            source: attr::string_or(node, "source", "")?,
        }))
    }
}

impl OpKernel for Grad {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = handle_input(ctx, 0)?;
        let Some(forward_name) = h.name.strip_prefix(ARRAYS) else {
            return Err(ctx.invalid(format!("Wrong input container. {}", h.name)));
        };
        let forward = lookup(ctx)?;
        let named = |e| ctx.named(e);
        let prepend = if ctx.num_inputs() > 2 {
            super::shape_values(ctx, ctx.input(2)?, "shape_to_prepend")?
        } else {
            Vec::new()
        };
        let (size, marked_size, element_shape) = {
            let mut s = forward.open().map_err(named)?;
            // Once gradients are taken, the forward array may not grow any more.
            s.dynamic_size = false;
            if s.gradients_disallowed {
                return Err(ctx.invalid(format!(
                    "Unable to create a gradients TensorArray for {forward_name}.  Perhaps you \
                     used the multiple_writes_aggregate flag on a previous write?  Gradient \
                     calculation is impossible when multiple writes are performed to the same \
                     index."
                )));
            }
            let element_shape = match (s.element_shape.dims(), ctx.num_inputs() > 2) {
                (Some(dims), true) => PartialShape::new(
                    prepend
                        .iter()
                        .map(|&d| Some(d))
                        .chain(dims.iter().copied())
                        .collect::<Vec<_>>(),
                ),
                (None, true) => PartialShape::unknown(),
                (_, false) => s.element_shape.clone(),
            };
            (s.slots.len(), s.marked_size, element_shape)
        };
        let grad_name = format!("{forward_name}@{}", self.source);
        let key = format!("{GRADS}{grad_name}");
        ctx.resources
            .lookup_or_create(&h.container, &key, || {
                let grad = TensorArray::new(
                    grad_name,
                    Options {
                        dtype: forward.dtype,
                        size,
                        element_shape,
                        identical_element_shapes: forward.identical_element_shapes,
                        dynamic_size: false,
                        clear_after_read: true,
                        is_grad: true,
                        marked_size,
                    },
                )?;
                grad.copy_shapes_from(&forward, &prepend)?;
                Ok(grad)
            })
            .map_err(named)?;
        ctx.set_output(0, handle(ctx, &h.container, key));
        ctx.set_output(1, Tensor::scalar(0f32));
        Ok(())
    }
}

/// TensorArrayWriteV3(handle, index, value, flow_in) -> flow_out.
fn write(ctx: &mut OpContext<'_>) -> Result<()> {
    let flow = input(ctx, 3)?;
    let index = scalar_i32(ctx, 1, "TensorArray index")?;
    let ta = lookup(ctx)?;
    let value = input(ctx, 2)?;
    if value.dtype() != ta.dtype {
        return Err(wrong_dtype(ctx, &ta, value.dtype(), "is trying to write"));
    }
    ta.write(index, &value).map_err(|e| ctx.named(e))?;
    ctx.set_output(0, flow);
    Ok(())
}

/// TensorArrayReadV3(handle, index, flow_in) -> value.
struct Read {
    dtype: DType,
}

impl Read {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Read {
            dtype: attr::dtype(node, "dtype")?,
        }))
    }
}

impl OpKernel for Read {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let index = scalar_i32(ctx, 1, "TensorArray index")?;
        let ta = lookup(ctx)?;
        if self.dtype != ta.dtype {
            return Err(wrong_dtype(ctx, &ta, self.dtype, "requested"));
        }
        let value = ta.read(index).map_err(|e| ctx.named(e))?;
        ctx.set_output(0, value);
        Ok(())
    }
}

/// TensorArrayGatherV3(handle, indices, flow_in) -> value: the elements at `indices`, stacked.
struct Gather {
    dtype: DType,
    element_shape: PartialShape,
}

impl Gather {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Gather {
            dtype: attr::dtype(node, "dtype")?,
            element_shape: match attr::get(node, "element_shape") {
                Some(_) => attr::shape(node, "element_shape")?,
                None => PartialShape::unknown(),
            },
        }))
    }
}

impl OpKernel for Gather {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let ta = lookup(ctx)?;
        let named = |e| ctx.named(e);
        if self.dtype != ta.dtype {
            return Err(wrong_dtype(ctx, &ta, self.dtype, "requested"));
        }
        ta.set_element_shape(&self.element_shape).map_err(named)?;
        let indices = vector(
            ctx,
            1,
            "Expected indices to be a vector, but received shape: ",
        )?;
        if indices.is_empty() {
            let Some(shape) = self.element_shape.to_shape() else {
                return Err(ctx.named(Status::unimplemented(format!(
                    "TensorArray has size zero, but element shape {} is not fully defined. \
                     Currently only static shapes are supported when packing zero-size \
                     TensorArrays.",
                    self.element_shape
                ))));
            };
            let out = rows::stack(self.dtype, &[], &shape).map_err(named)?;
            ctx.set_output(0, out);
            return Ok(());
        }
        let values = ta.read_many(&indices).map_err(named)?;
        let first = values[0].shape().clone();
        if !self.element_shape.is_compatible_with(&first) {
            return Err(ctx.invalid(format!(
                "TensorArray was passed element_shape {} which does not match the Tensor at \
                 index 0: {first}",
                self.element_shape
            )));
        }
        for (i, v) in values.iter().enumerate().skip(1) {
            if v.shape() != &first {
                return Err(ctx.invalid(format!(
                    "TensorArray has inconsistent shapes.  Index 0 has shape: {first} but index \
                     {i} has shape: {}",
                    v.shape()
                )));
            }
        }
        super::checked_elements(ctx, &[values.len(), first.num_elements()])?;
        let refs: Vec<&Tensor> = values.iter().collect();
        let out = rows::stack(self.dtype, &refs, &first).map_err(named)?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// TensorArrayScatterV3(handle, indices, value, flow_in) -> flow_out: row `k` of `value` is
/// written at `indices[k]`.
fn scatter(ctx: &mut OpContext<'_>) -> Result<()> {
    let flow = input(ctx, 3)?;
    let ta = lookup(ctx)?;
    let value = input(ctx, 2)?;
    if value.dtype() != ta.dtype {
        return Err(wrong_dtype(ctx, &ta, value.dtype(), "is trying to write"));
    }
    if value.rank() == 0 {
        return Err(ctx.invalid(format!(
            "Input value for unpack must be at least a vector but received shape: {}",
            value.shape()
        )));
    }
    let indices = vector(
        ctx,
        1,
        "Expected indices to be a vector, but received shape: ",
    )?;
    let n = value.dims()[0];
    if indices.len() != n {
        return Err(ctx.invalid(format!(
            "Expected len(indices) == values.shape[0], but saw: {} vs. {n}",
            indices.len()
        )));
    }
    let named = |e| ctx.named(e);
    let max_index = indices.iter().copied().max().unwrap_or(-1);
    let size = ta.size().map_err(named)? as i64;
    let dynamic = ta.open().map_err(named)?.dynamic_size;
    let size = if dynamic {
        size.max(max_index + 1)
    } else {
        size
    };
    if max_index >= size {
        return Err(ctx.invalid(format!(
            "Max scatter index must be < array size ({max_index} vs. {size})"
        )));
    }
    let values = rows::unstack(&value).map_err(named)?;
    ta.write_many(&indices, &values).map_err(named)?;
    ctx.set_output(0, flow);
    Ok(())
}

/// TensorArrayConcatV3(handle, flow_in) -> (value, lengths): the elements joined along
/// dimension 0, and each one's length there.
struct Concat {
    dtype: DType,
    element_shape_except0: PartialShape,
}

impl Concat {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Concat {
            dtype: attr::dtype(node, "dtype")?,
            element_shape_except0: match attr::get(node, "element_shape_except0") {
                Some(_) => attr::shape(node, "element_shape_except0")?,
                None => PartialShape::unknown(),
            },
        }))
    }
}

impl OpKernel for Concat {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let ta = lookup(ctx)?;
        let named = |e| ctx.named(e);
        if self.dtype != ta.dtype {
            return Err(wrong_dtype(ctx, &ta, self.dtype, "requested"));
        }
        let n = ta.concat_size().map_err(named)?;
        if n == 0 {
            let Some(shape) = self.element_shape_except0.to_shape() else {
                return Err(ctx.named(Status::unimplemented(format!(
                    "TensorArray has size zero, but element_shape_except0 {} is not fully \
                     defined. Currently only static shapes are supported when concatenating \
                     zero-size TensorArrays.",
                    self.element_shape_except0
                ))));
            };
            ctx.set_output(0, rows::stack(self.dtype, &[], &shape).map_err(named)?);
            ctx.set_output(1, Tensor::from_vec([0], Vec::<i64>::new())?);
            return Ok(());
        }
        let indices: Vec<i64> = (0..n as i64).collect();
        let values = ta.read_many(&indices).map_err(named)?;
        let mut lengths = Vec::with_capacity(n);
        let mut rest = Shape::scalar();
        for (i, v) in values.iter().enumerate() {
            let Some((&len, tail)) = v.dims().split_first() else {
                return Err(ctx.invalid(format!(
                    "Concat saw a scalar shape at index {i} but requires at least vectors.  Did \
                     you mean to call pack?"
                )));
            };
            let tail = Shape::new(tail.to_vec());
            if i == 0 {
                if !self.element_shape_except0.is_compatible_with(&tail) {
                    return Err(ctx.invalid(format!(
                        "TensorArray was passed element_shape_except0 {} but index 0 has \
                         (excepting dimension 0) shape: {tail} which does not match.",
                        self.element_shape_except0
                    )));
                }
                rest = tail;
            } else if tail != rest {
                return Err(ctx.invalid(format!(
                    "TensorArray has inconsistent shapes.  Index 0 has (excepting dimension 0) \
                     shape: {rest} but index {i} has (excepting dimension 0) shape: {tail}"
                )));
            }
            lengths.push(len as i64);
        }
        let total: usize = lengths.iter().map(|&l| l as usize).sum();
        let mut dims = vec![total];
        dims.extend_from_slice(rest.dims());
        super::checked_elements(ctx, &dims)?;
        let refs: Vec<&Tensor> = values.iter().collect();
        let out = rows::join(self.dtype, &refs, Shape::new(dims)).map_err(named)?;
        ctx.set_output(0, out);
        ctx.set_output(1, Tensor::from_vec([n], lengths)?);
        Ok(())
    }
}

/// TensorArraySplitV3(handle, value, lengths, flow_in) -> flow_out: `value` cut along
/// dimension 0 into pieces of `lengths`, piece `k` written at index `k`.
fn split(ctx: &mut OpContext<'_>) -> Result<()> {
    let flow = input(ctx, 3)?;
    let ta = lookup(ctx)?;
    let named = |e| ctx.named(e);
    let value = input(ctx, 1)?;
    let lengths = vector(ctx, 2, "Expected lengths to be a vector, received shape: ")?;
    if let Some(&bad) = lengths.iter().find(|&&l| l < 0) {
        return Err(ctx.invalid(format!("Invalid value in lengths: {bad}")));
    }
    if value.rank() == 0 {
        return Err(ctx.invalid(format!(
            "Expected value to be at least a vector, but received shape: {}",
            value.shape()
        )));
    }
    let total = lengths.iter().try_fold(0i64, |t, &l| t.checked_add(l));
    if total != Some(value.dims()[0] as i64) {
        return Err(ctx.invalid(format!(
            "Expected sum of lengths to be equal to values.shape[0], but sum of lengths is {} \
             and value's shape is: {}",
            total.map_or_else(|| "too large".to_string(), |t| t.to_string()),
            value.shape()
        )));
    }
    let n = lengths.len();
    let size = ta.size().map_err(named)?;
    let dynamic = ta.open().map_err(named)?.dynamic_size;
    let size = if dynamic { size.max(n) } else { size };
    if size != n {
        return Err(ctx.invalid(format!(
            "TensorArray's size is not equal to the size of lengths ({size} vs. {n}), and the \
             TensorArray is not marked as dynamically resizeable"
        )));
    }
    if value.dtype() != ta.dtype {
        return Err(wrong_dtype(ctx, &ta, value.dtype(), "is trying to write"));
    }
    let mut pieces = Vec::with_capacity(n);
    let mut start = 0usize;
    for &len in &lengths {
        let end = start + len as usize;
        pieces.push(rows::slice_rows(&value, start, end).map_err(named)?);
        start = end;
    }
    ta.open().map_err(named)?.marked_size = n as i64;
    let indices: Vec<i64> = (0..n as i64).collect();
    ta.write_many(&indices, &pieces).map_err(named)?;
    ctx.set_output(0, flow);
    Ok(())
}

/// TensorArraySizeV3(handle, flow_in) -> size.
fn size(ctx: &mut OpContext<'_>) -> Result<()> {
    let ta = lookup(ctx)?;
    let n = ta.size().map_err(|e| ctx.named(e))?;
    ctx.set_output(0, Tensor::scalar(n as i32));
    Ok(())
}

/// TensorArrayCloseV3(handle): drops the elements; later uses of the array fail.
fn close(ctx: &mut OpContext<'_>) -> Result<()> {
    lookup(ctx)?.close();
    Ok(())
}
