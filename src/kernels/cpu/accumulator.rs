//! Gradient accumulator kernels for synchronous replicas: `ResourceConditionalAccumulator`
//! (creates the accumulator in the device's resources and returns its handle),
//! `ResourceAccumulatorApplyGradient`, `ResourceAccumulatorTakeGradient` (blocks, with a
//! deadline: the step's, else the accumulator's default wait), `ResourceAccumulatorSetGlobalStep`
//! and `ResourceAccumulatorNumAccumulated`.

use std::sync::Arc;

use super::queue::{default_wait, resource_name};
use super::variable::handle_input;
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::accumulator::{ConditionalAccumulator, Reduction};
use crate::runtime::wait::Wait;
use crate::tensor::{ResourceHandle, Tensor};

/// The `type_name` of an accumulator's resource handle.
pub const ACCUMULATOR_TYPE_NAME: &str = "ConditionalAccumulator";

/// Returns the factory for an accumulator op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "ResourceConditionalAccumulator" => CreateAccumulator::create,
        "ResourceAccumulatorApplyGradient" => |_| super::stateless(apply),
        "ResourceAccumulatorTakeGradient" => |_| super::stateless(take),
        "ResourceAccumulatorSetGlobalStep" => |_| super::stateless(set_global_step),
        "ResourceAccumulatorNumAccumulated" => |_| super::stateless(num_accumulated),
        _ => return None,
    };
    Some(factory)
}

fn accumulator(ctx: &OpContext<'_>) -> Result<Arc<ConditionalAccumulator>> {
    let h = handle_input(ctx, 0)?;
    match ctx
        .resources
        .lookup::<ConditionalAccumulator>(&h.container, &h.name)
    {
        Ok(a) => Ok(a),
        Err(e) if e.code() == Code::NotFound => Err(Status::not_found(format!(
            "node `{}` (op {}): accumulator `{}` does not exist on {}; run its \
             ResourceConditionalAccumulator op first",
            ctx.node().name,
            ctx.node().op,
            h.name,
            ctx.device
        ))),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

struct CreateAccumulator {
    container: String,
    name: String,
    node: NodeDef,
}

impl CreateAccumulator {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let (container, name) = resource_name(node)?;
        Ok(Arc::new(CreateAccumulator {
            container,
            name,
            node: node.clone(),
        }))
    }

    fn build(&self) -> Result<ConditionalAccumulator> {
        let node = &self.node;
        ConditionalAccumulator::new(
            self.name.clone(),
            attr::dtype(node, "dtype")?,
            attr::shape(node, "shape")?,
            Reduction::parse(&attr::string_or(node, "reduction_type", "MEAN")?)?,
            default_wait(node)?,
        )
    }
}

impl OpKernel for CreateAccumulator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let a = ctx
            .resources
            .lookup_or_create::<ConditionalAccumulator>(&self.container, &self.name, || {
                self.build()
            })
            .map_err(|e| ctx.named(e))?;
        let dtype = attr::dtype(&self.node, "dtype")?;
        if a.dtype() != dtype {
            return Err(ctx.invalid(format!(
                "accumulator `{}` already exists for {} gradients, this node declares {dtype}",
                self.name,
                a.dtype()
            )));
        }
        ctx.set_output(
            0,
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container: self.container.clone(),
                name: self.name.clone(),
                type_name: ACCUMULATOR_TYPE_NAME.to_string(),
            }),
        );
        Ok(())
    }
}

fn apply(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = accumulator(ctx)?;
    let local_step = super::int_scalar(ctx, ctx.input(1)?, "local_step")?;
    let gradient = ctx.input(2)?.clone();
    // `_replica` (set by the SyncReplicasOptimizer) names the sender for timeout errors.
    let replica = crate::graph::attr::string_or(ctx.node(), "_replica", "")?;
    let replica = Some(replica.as_str()).filter(|r| !r.is_empty());
    a.apply_from(local_step, &gradient, replica)
        .map_err(|e| ctx.named(e))?;
    Ok(())
}

fn take(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = accumulator(ctx)?;
    let n = super::int_scalar(ctx, ctx.input(1)?, "num_required")?;
    // `_timeout_ms` (tessera's, set by the SyncReplicasOptimizer) bounds the wait even inside
    // a step with a longer deadline, as a remote step always has one.
    let ms = crate::graph::attr::int_or(ctx.node(), "_timeout_ms", -1)?;
    let wait = Wait::new(
        (ms > 0).then(|| std::time::Duration::from_millis(ms as u64)),
        ctx.deadline(),
        a.default_wait(),
        ctx.cancellation().cloned(),
    );
    let average = a.take(n, &wait).map_err(|e| ctx.named(e))?;
    ctx.set_output(0, average);
    Ok(())
}

fn set_global_step(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = accumulator(ctx)?;
    let step = super::int_scalar(ctx, ctx.input(1)?, "new_global_step")?;
    a.set_global_step(step);
    Ok(())
}

fn num_accumulated(ctx: &mut OpContext<'_>) -> Result<()> {
    let a = accumulator(ctx)?;
    let n = i32::try_from(a.num_accumulated()).unwrap_or(i32::MAX);
    ctx.set_output(0, Tensor::scalar(n));
    Ok(())
}
