//! The kernels of an emulated GPU: a device whose memory is a separate space in host memory
//! ([`Emulated`]) and whose kernels are the CPU kernels.
//!
//! It takes the nodes a GPU takes ([`gpu_ops`]), so placement, partitioning, the `_Send`/
//! `_Recv` pairs at its edges and the copies in and out of its memory are those of a GPU; only
//! the arithmetic runs on the host. A compute kernel reads its inputs in the device's memory
//! where they are and leaves its outputs there; an input still in host memory is copied in
//! first, as a GPU kernel must, and counted. Tests train on it to hold a GPU step to the copies
//! its dataflow needs, on machines without a GPU.

use std::sync::Arc;

use crate::device::space::{self, Emulated, MemorySpace};
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{self, gpu_ops, KernelLookup, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Builds `node`'s kernel on an emulated GPU: the CPU kernel, in the device's memory for a
/// float32 node of an op a GPU computes, as it is for the routing ops and other dtypes.
/// UNIMPLEMENTED for an op a GPU does not run, as on a real one.
pub fn create_kernel(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
    if !gpu_ops::runs_on_gpu(&node.op) {
        return Err(Status::unimplemented(format!(
            "no GPU kernel for op {} (node `{}`)",
            node.op, node.name
        )));
    }
    let cpu = kernels::create_kernel(node, DeviceType::Cpu)?;
    let float = attr::dtype(node, "T").is_ok_and(|t| t == DType::Float);
    if gpu_ops::computes(&node.op) && float {
        Ok(Arc::new(InDeviceMemory(cpu)))
    } else {
        Ok(cpu)
    }
}

/// Whether a kernel exists for `op` on `device_type` when GPUs are emulated: the GPU op set
/// on a GPU, tessera's kernels elsewhere. A session's placement predicate.
pub fn has_kernel(op: &str, device_type: DeviceType) -> bool {
    match device_type {
        DeviceType::Gpu => {
            gpu_ops::runs_on_gpu(op) && kernels::kernel_for(op, DeviceType::Cpu).is_some()
        }
        DeviceType::Cpu => kernels::kernel_for(op, device_type).is_some(),
    }
}

/// The kernel lookup of a session whose GPUs are emulated: [`create_kernel`] on a GPU,
/// tessera's kernels elsewhere.
pub fn lookup() -> Arc<KernelLookup> {
    Arc::new(|node: &NodeDef, device_type| match device_type {
        DeviceType::Gpu => create_kernel(node),
        DeviceType::Cpu => kernels::create_kernel(node, device_type),
    })
}

/// A CPU kernel run on the emulated device's memory.
struct InDeviceMemory(Arc<dyn OpKernel>);

impl OpKernel for InDeviceMemory {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let memory = ctx
            .memory_space()
            .and_then(|s| s.as_any().downcast_ref::<Emulated>())
            .ok_or_else(|| {
                ctx.named(Status::failed_precondition(format!(
                    "an emulated GPU kernel runs on {}, which has no emulated memory; give the \
                     device `device::space::Emulated` memory",
                    ctx.device
                )))
            })?;
        let mut inputs = Vec::with_capacity(ctx.num_inputs());
        for input in ctx.inputs() {
            inputs.push(operand(memory, input).map_err(|e| ctx.named(e))?);
        }
        let mut outputs = {
            let mut inner = ctx.for_node(ctx.node(), inputs);
            self.0.compute(&mut inner)?;
            inner.take_outputs()
        };
        for (i, output) in outputs.iter_mut().enumerate() {
            if let Some(t) = output.take() {
                let t = if memory.holds(t.dtype()) && t.bytes().is_some() {
                    memory.adopt(&t).map_err(|e| ctx.named(e))?
                } else {
                    t
                };
                ctx.set_output(i, t);
            }
        }
        Ok(())
    }
}

/// Input `t` as the device's kernel reads it: in the device's memory (copied in first when it
/// is on the host or another device), or as it is for a dtype the device keeps on the host.
fn operand(memory: &Emulated, t: &Tensor) -> Result<Tensor> {
    if t.is_ref() {
        return Ok(t.clone());
    }
    let placed = space::place(Some(memory), t.clone())?;
    if placed.device_buffer().is_some() {
        memory.read(&placed)
    } else {
        Ok(placed)
    }
}
