//! `_Send`, `_Recv`, `_HostSend`, `_HostRecv`: the two ends of an edge cut by partitioning.
//!
//! Both ends build the same rendezvous key from their attrs (`send_device`,
//! `send_device_incarnation`, `recv_device`, `tensor_name`, frame `0:0`) once, when the kernel
//! is created; inside a while loop the key carries the frame and iteration the node runs in.
//! A dead input is sent as TensorFlow sends it (`is_dead`, an empty value), and a `_Recv` that
//! receives a dead tensor leaves its output unset, which its executor reads as dead. `_Send` leaves its input in the step's rendezvous under that key. `_Recv` takes
//! it from the same rendezvous when the producer runs on this task (another device of the task,
//! or a client feed the master put in with RunGraph `send`), and otherwise pulls it from the
//! producer's task with RecvTensor through the step's remote-receive hook. Every wait has the
//! step's deadline (or [`DEFAULT_RECV_TIMEOUT`] outside a step that has none).
//!
//! A `_Recv` puts what it receives where its device keeps tensors (`OpContext::place`): into a
//! GPU's memory when the GPU computes its dtype, onto the host when it comes from another
//! device's memory. The `_Host*` variants differ from the plain ones only in where a GPU keeps
//! the tensor; on the CPU they are the same kernels.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::DeviceName;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::pool;
use crate::runtime::rendezvous::rendezvous_key_of;
use crate::runtime::rendezvous::ParsedKey;
use crate::tensor::{DType, Tensor};

/// How long a `_Recv` waits when its step set no deadline: long enough for any sane step,
/// short enough that a lost sender never hangs a thread forever.
pub const DEFAULT_RECV_TIMEOUT: Duration = Duration::from_secs(300);

/// Returns the factory for `op` if it is one of the send/receive ops.
pub fn kernel_for(op: &str) -> Option<KernelFactory> {
    match op {
        "_Send" | "_HostSend" => Some(SendKernel::create),
        "_Recv" | "_HostRecv" => Some(RecvKernel::create),
        _ => None,
    }
}

/// Deposits its input under its key.
struct SendKernel {
    key: ParsedKey,
}

impl SendKernel {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Self {
            key: rendezvous_key_of(node)?,
        }))
    }
}

impl OpKernel for SendKernel {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let rendezvous = ctx.rendezvous().ok_or_else(|| no_rendezvous(ctx))?;
        let key = self.key.in_frame(ctx.frame_iter())?;
        if ctx.is_input_dead() {
            return rendezvous.send(&key, Tensor::zeros(DType::Float, [0])?, true);
        }
        let value = ctx.input(0)?.clone();
        rendezvous.send(&key, value, false)
    }
}

/// Where a `_Recv` finds its tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The step's rendezvous on this task.
    Local,
    /// The producer's task, through RecvTensor.
    Remote,
}

/// Takes the tensor under its key, locally or from the producer's task.
struct RecvKernel {
    key: ParsedKey,
    dtype: Option<DType>,
    source: Source,
    /// A `_HostRecv`: the tensor stays in host memory whatever the device.
    host: bool,
}

impl RecvKernel {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let (key, source) = recv_source(node)?;
        Ok(Arc::new(Self {
            key,
            dtype: attr::dtype(node, "tensor_type").ok(),
            source,
            host: node.op == "_HostRecv",
        }))
    }
}

impl OpKernel for RecvKernel {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let deadline = ctx
            .deadline()
            .unwrap_or_else(|| Instant::now() + DEFAULT_RECV_TIMEOUT);
        let key = self.key.in_frame(ctx.frame_iter())?;
        let (tensor, is_dead) = match self.source {
            Source::Local => {
                let rendezvous = ctx.rendezvous().ok_or_else(|| no_rendezvous(ctx))?;
                rendezvous.recv_blocking(&key, deadline)?
            }
            Source::Remote => {
                let remote = ctx.remote_recv().ok_or_else(|| {
                    Status::failed_precondition(format!(
                        "node `{}` (op {}) receives `{}` from another task, but its step has no \
                         way to reach other tasks; run it through the RunGraph of a worker that \
                         was given its cluster's peers",
                        ctx.node().name,
                        ctx.node().op,
                        key
                    ))
                })?;
                let step = ctx.step().cloned().unwrap_or_default();
                let room = ctx.memory_room();
                pool::blocking(|| remote.recv(&step, &key, deadline, room))?
            }
        };
        if is_dead {
            // Dead: the output stays unset.
            return Ok(());
        }
        if let Some(dtype) = self.dtype {
            if tensor.dtype() != dtype {
                return Err(ctx.invalid(format!(
                    "received a {} tensor under `{}` but expects tensor_type {dtype}; the two \
                     ends of the pair disagree",
                    tensor.dtype(),
                    key
                )));
            }
        }
        // The tensor enters this device here: into a GPU's memory, or onto the host from
        // another device's.
        let tensor = if self.host {
            tensor.to_host().map_err(|e| ctx.named(e))?
        } else {
            ctx.place(tensor)?
        };
        ctx.set_output(0, tensor);
        Ok(())
    }
}

/// A `_Recv`'s key and where its tensor comes from. A client-terminated pair is fed by the
/// master through RunGraph `send` into this task's rendezvous, whichever task the client
/// device is on.
fn recv_source(node: &NodeDef) -> Result<(ParsedKey, Source)> {
    let key = rendezvous_key_of(node)?;
    let client_terminated = attr::bool_or(node, "client_terminated", false)?;
    let source = if client_terminated || same_task(key.src_device(), key.dst_device())? {
        Source::Local
    } else {
        Source::Remote
    };
    Ok((key, source))
}

/// The key of a `_Recv` (or `_HostRecv`) that takes its tensor from this task's rendezvous;
/// `None` for other ops and for receives from another task.
pub fn local_recv_key(node: &NodeDef) -> Option<ParsedKey> {
    if !matches!(node.op.as_str(), "_Recv" | "_HostRecv") {
        return None;
    }
    match recv_source(node) {
        Ok((key, Source::Local)) => Some(key),
        _ => None,
    }
}

/// Whether two full device names are on the same task.
fn same_task(a: &str, b: &str) -> Result<bool> {
    let task = |d: &str| DeviceName::parse(d).map(|n| n.task_name());
    Ok(task(a)? == task(b)?)
}

fn no_rendezvous(ctx: &OpContext<'_>) -> Status {
    Status::failed_precondition(format!(
        "node `{}` (op {}) needs a step rendezvous, which only distributed steps (RunGraph) have; \
         feed and fetch in-process sessions directly",
        ctx.node().name,
        ctx.node().op
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::rendezvous::PairAttrs;
    use crate::runtime::rendezvous::Rendezvous;
    use crate::runtime::resource::ResourceMgr;
    use crate::runtime::StepOptions;

    const A: &str = "/job:worker/replica:0/task:0/device:CPU:0";
    const B: &str = "/job:worker/replica:0/task:0/device:CPU:1";
    const PS: &str = "/job:ps/replica:0/task:0/device:CPU:0";

    fn pair(send_device: &str, recv_device: &str) -> (NodeDef, NodeDef) {
        let attrs = PairAttrs {
            tensor_name: "edge_3_x",
            send_device,
            incarnation: 17,
            recv_device,
            client_terminated: false,
        };
        (
            attrs.send("x_S0".into(), "x".into(), send_device, DType::Float),
            attrs.recv("x_S1".into(), recv_device, DType::Float),
        )
    }

    #[test]
    fn a_local_pair_meets_in_the_step_rendezvous() {
        let (send, recv) = pair(A, B);
        let options = StepOptions {
            step_id: 5,
            rendezvous: Some(Arc::new(Rendezvous::new(5))),
            deadline: Some(Instant::now() + Duration::from_secs(5)),
            ..Default::default()
        };
        let resources = ResourceMgr::new();
        let mut ctx = OpContext::new(&send, vec![Tensor::scalar(2.5f32)], &resources, A, 5)
            .with_step(&options);
        SendKernel::create(&send)
            .unwrap()
            .compute(&mut ctx)
            .unwrap();
        let mut ctx = OpContext::new(&recv, vec![], &resources, B, 5).with_step(&options);
        RecvKernel::create(&recv)
            .unwrap()
            .compute(&mut ctx)
            .unwrap();
        let out = ctx.take_outputs();
        assert_eq!(out[0].as_ref().unwrap().scalar_value::<f32>().unwrap(), 2.5);
    }

    #[test]
    fn a_cross_task_recv_without_a_remote_hook_fails_naming_the_node() {
        let (_, recv) = pair(PS, A);
        let options = StepOptions {
            rendezvous: Some(Arc::new(Rendezvous::new(1))),
            ..Default::default()
        };
        let resources = ResourceMgr::new();
        let mut ctx = OpContext::new(&recv, vec![], &resources, A, 1).with_step(&options);
        let err = RecvKernel::create(&recv)
            .unwrap()
            .compute(&mut ctx)
            .unwrap_err();
        assert_eq!(err.code(), crate::Code::FailedPrecondition);
        assert!(err.message().contains("`x_S1`"), "{err}");
    }

    #[test]
    fn a_send_outside_a_distributed_step_is_refused() {
        let (send, _) = pair(A, B);
        let resources = ResourceMgr::new();
        let mut ctx = OpContext::new(&send, vec![Tensor::scalar(1f32)], &resources, A, 1);
        let err = SendKernel::create(&send)
            .unwrap()
            .compute(&mut ctx)
            .unwrap_err();
        assert_eq!(err.code(), crate::Code::FailedPrecondition);
    }
}
