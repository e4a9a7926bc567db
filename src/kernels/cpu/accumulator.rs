//! Gradient accumulator kernels for synchronous replicas, both kinds (see
//! [`crate::runtime::accumulator`]):
//! - dense, by resource handle: `ResourceConditionalAccumulator` (creates the accumulator in
//!   the device's resources and returns its handle), `ResourceAccumulatorApplyGradient`,
//!   `ResourceAccumulatorTakeGradient`;
//! - sparse, by reference handle as in TensorFlow (a `Ref(string)` to `[container, name]`,
//!   the way the old `Stack` ops hand theirs out): `SparseConditionalAccumulator`,
//!   `SparseAccumulatorApplyGradient`, `SparseAccumulatorTakeGradient`;
//! - either kind, by either handle, as TensorFlow's are shared by both kinds:
//!   `ResourceAccumulatorSetGlobalStep` / `AccumulatorSetGlobalStep` and
//!   `ResourceAccumulatorNumAccumulated` / `AccumulatorNumAccumulated`.
//!
//! A take blocks, with a deadline: its `_timeout_ms`, else the step's, else the accumulator's
//! default wait.

use std::sync::Arc;

use super::queue::{default_wait, resource_name};
use super::variable::handle_input;
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::accumulator::{
    Accumulator, ConditionalAccumulator, DenseSum, Reduction, SparseConditionalAccumulator,
    SparseSum, Sum,
};
use crate::runtime::wait::Wait;
use crate::tensor::{DType, PartialShape, ResourceHandle, Tensor, Var};

/// The `type_name` of an accumulator's resource handle.
pub const ACCUMULATOR_TYPE_NAME: &str = "ConditionalAccumulator";

/// Returns the factory for an accumulator op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "ResourceConditionalAccumulator" | "SparseConditionalAccumulator" => {
            CreateAccumulator::create
        }
        "ResourceAccumulatorApplyGradient" => |_| super::stateless(apply),
        "ResourceAccumulatorTakeGradient" => |_| super::stateless(take),
        "SparseAccumulatorApplyGradient" => SparseApply::create,
        "SparseAccumulatorTakeGradient" => |_| super::stateless(sparse_take),
        "ResourceAccumulatorSetGlobalStep" | "AccumulatorSetGlobalStep" => {
            |_| super::stateless(set_global_step)
        }
        "ResourceAccumulatorNumAccumulated" | "AccumulatorNumAccumulated" => {
            |_| super::stateless(num_accumulated)
        }
        _ => return None,
    };
    Some(factory)
}

/// The (container, name) of the accumulator behind input 0: a resource handle, or a reference
/// to (or the value of) TensorFlow's `[container, name]` string pair.
fn accumulator_key(ctx: &OpContext<'_>) -> Result<(String, String)> {
    let t = ctx.input(0)?;
    if t.dtype() == DType::Resource {
        let h = handle_input(ctx, 0)?;
        return Ok((h.container, h.name));
    }
    let value = t.deref().map_err(|e| ctx.named(e))?;
    match value.strings().map(<[_]>::to_vec).as_deref() {
        Ok([container, name]) => Ok((
            String::from_utf8_lossy(container).into_owned(),
            String::from_utf8_lossy(name).into_owned(),
        )),
        _ => Err(ctx.invalid(format!(
            "input 0 must be an accumulator handle: a resource, or the two strings \
             [container, name] that SparseConditionalAccumulator outputs; got {} of shape {}",
            value.dtype(),
            value.shape()
        ))),
    }
}

/// Looks up the accumulator of kind `S` behind input 0, or NOT_FOUND naming it and the op
/// that creates it.
fn lookup<S: Sum>(ctx: &OpContext<'_>, creator: &str) -> Result<Arc<Accumulator<S>>> {
    let (container, name) = accumulator_key(ctx)?;
    match ctx.resources.lookup::<Accumulator<S>>(&container, &name) {
        Ok(a) => Ok(a),
        Err(e) if e.code() == Code::NotFound => Err(Status::not_found(format!(
            "node `{}` (op {}): accumulator `{name}` does not exist on {}; run its {creator} \
             op first",
            ctx.node().name,
            ctx.node().op,
            ctx.device
        ))),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

fn dense(ctx: &OpContext<'_>) -> Result<Arc<ConditionalAccumulator>> {
    lookup(ctx, "ResourceConditionalAccumulator")
}

fn sparse(ctx: &OpContext<'_>) -> Result<Arc<SparseConditionalAccumulator>> {
    lookup(ctx, "SparseConditionalAccumulator")
}

/// `ResourceConditionalAccumulator` (output: a resource handle) and
/// `SparseConditionalAccumulator` (output: a reference to `[container, name]`).
struct CreateAccumulator {
    container: String,
    name: String,
    dtype: DType,
    shape: PartialShape,
    reduction: Reduction,
    node: NodeDef,
}

impl CreateAccumulator {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let (container, name) = resource_name(node)?;
        Ok(Arc::new(CreateAccumulator {
            container,
            name,
            dtype: attr::dtype(node, "dtype")?,
            shape: attr::shape(node, "shape")?,
            reduction: Reduction::parse(&attr::string_or(node, "reduction_type", "MEAN")?)?,
            node: node.clone(),
        }))
    }

    /// Finds the accumulator of kind `S` under this node's name, or creates it; one that
    /// exists must hold this node's dtype.
    fn find_or_create<S: Sum>(&self, ctx: &OpContext<'_>) -> Result<()> {
        let a = ctx
            .resources
            .lookup_or_create::<Accumulator<S>>(&self.container, &self.name, || {
                Accumulator::new(
                    self.name.clone(),
                    self.dtype,
                    self.shape.clone(),
                    self.reduction,
                    default_wait(&self.node)?,
                )
            })
            .map_err(|e| ctx.named(e))?;
        if a.dtype() != self.dtype {
            return Err(ctx.invalid(format!(
                "accumulator `{}` already exists for {} gradients, this node declares {}",
                self.name,
                a.dtype(),
                self.dtype
            )));
        }
        Ok(())
    }
}

impl OpKernel for CreateAccumulator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let handle = if ctx.node().op == "SparseConditionalAccumulator" {
            self.find_or_create::<SparseSum>(ctx)?;
            // TensorFlow's handle: a reference to the string pair [container, name].
            let pair = Tensor::from_strings(
                [2],
                vec![self.container.clone().into(), self.name.clone().into()],
            )?;
            let var = Var::new(DType::String, PartialShape::new(vec![Some(2)]));
            *var.write() = Some(pair);
            Tensor::reference(Arc::new(var), ctx.node().name.as_str())
        } else {
            self.find_or_create::<DenseSum>(ctx)?;
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container: self.container.clone(),
                name: self.name.clone(),
                type_name: ACCUMULATOR_TYPE_NAME.to_string(),
            })
        };
        ctx.set_output(0, handle);
        Ok(())
    }
}

/// The sender named by `_replica` (set by the SyncReplicasOptimizer), for timeout errors.
fn replica(ctx: &OpContext<'_>) -> Result<Option<String>> {
    let replica = attr::string_or(ctx.node(), "_replica", "")?;
    Ok(Some(replica).filter(|r| !r.is_empty()))
}

/// A take's wait: `_timeout_ms` (tessera's, set by the SyncReplicasOptimizer) bounds it even
/// inside a step with a longer deadline, as a remote step always has one.
fn take_wait(ctx: &OpContext<'_>, default: std::time::Duration) -> Result<Wait> {
    let ms = attr::int_or(ctx.node(), "_timeout_ms", -1)?;
    Ok(Wait::new(
        (ms > 0).then(|| std::time::Duration::from_millis(ms as u64)),
        ctx.deadline(),
        default,
        ctx.cancellation().cloned(),
    ))
}

fn apply(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = dense(ctx)?;
    let local_step = super::int_scalar(ctx, ctx.input(1)?, "local_step")?;
    let gradient = ctx.input(2)?.clone();
    a.apply_from(local_step, &gradient, replica(ctx)?.as_deref())
        .map_err(|e| ctx.named(e))?;
    Ok(())
}

fn take(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = dense(ctx)?;
    let n = super::int_scalar(ctx, ctx.input(1)?, "num_required")?;
    let average = a
        .take(n, &take_wait(ctx, a.default_wait())?)
        .map_err(|e| ctx.named(e))?;
    ctx.set_output(0, average);
    Ok(())
}

/// `SparseAccumulatorApplyGradient(handle, local_step, gradient_indices, gradient_values,
/// gradient_shape)`; `gradient_shape` is ignored unless `has_known_shape`.
struct SparseApply {
    has_known_shape: bool,
}

impl SparseApply {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(SparseApply {
            has_known_shape: attr::bool(node, "has_known_shape")?,
        }))
    }
}

impl OpKernel for SparseApply {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let a = sparse(ctx)?;
        let local_step = super::int_scalar(ctx, ctx.input(1)?, "local_step")?;
        let (indices, values) = (ctx.input(2)?, ctx.input(3)?);
        let shape = if self.has_known_shape {
            Some(ctx.input(4)?)
        } else {
            None
        };
        a.apply_from(local_step, indices, values, shape, replica(ctx)?.as_deref())
            .map_err(|e| ctx.named(e))?;
        Ok(())
    }
}

fn sparse_take(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = sparse(ctx)?;
    let n = super::int_scalar(ctx, ctx.input(1)?, "num_required")?;
    let taken = a
        .take(n, &take_wait(ctx, a.default_wait())?)
        .map_err(|e| ctx.named(e))?;
    ctx.set_output(0, taken.indices);
    ctx.set_output(1, taken.values);
    ctx.set_output(2, taken.shape);
    Ok(())
}

/// Runs `dense` or `sparse` on the accumulator behind input 0, whichever kind it is.
fn either_kind<R>(
    ctx: &OpContext<'_>,
    dense: impl FnOnce(&ConditionalAccumulator) -> R,
    sparse: impl FnOnce(&SparseConditionalAccumulator) -> R,
) -> Result<R> {
    let (container, name) = accumulator_key(ctx)?;
    if let Ok(a) = ctx
        .resources
        .lookup::<SparseConditionalAccumulator>(&container, &name)
    {
        return Ok(sparse(&a));
    }
    match ctx
        .resources
        .lookup::<ConditionalAccumulator>(&container, &name)
    {
        Ok(a) => Ok(dense(&a)),
        Err(e) if e.code() == Code::NotFound => Err(Status::not_found(format!(
            "node `{}` (op {}): accumulator `{name}` does not exist on {}; run its \
             ResourceConditionalAccumulator or SparseConditionalAccumulator op first",
            ctx.node().name,
            ctx.node().op,
            ctx.device
        ))),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

fn set_global_step(ctx: &mut OpContext<'_>) -> Result<()> {
    let step = super::int_scalar(ctx, ctx.input(1)?, "new_global_step")?;
    either_kind(
        ctx,
        |a| a.set_global_step(step),
        |a| a.set_global_step(step),
    )
}

fn num_accumulated(ctx: &mut OpContext<'_>) -> Result<()> {
    let n = either_kind(ctx, |a| a.num_accumulated(), |a| a.num_accumulated())?;
    ctx.set_output(0, Tensor::scalar(i32::try_from(n).unwrap_or(i32::MAX)));
    Ok(())
}
