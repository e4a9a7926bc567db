//! `NcclAllReduce` on GPUs: the members meet as on the host (`kernels/cpu/collective.rs`),
//! and when every member is a float32 tensor on its own GPU, the last to come reduces them
//! with one NCCL all-reduce across those GPUs (cudarc's bindings, `libnccl` loaded at run
//! time). Otherwise (members on CPUs too, two on one GPU, other dtypes, or no `libnccl` on the
//! host, logged once) they are reduced in host memory, with the same result.
//!
//! Each member's tensor is read where it is when its GPU holds it (copied in otherwise), the
//! GPUs reduce among themselves, and each result is copied back to the host, where its reader
//! (an optimizer's apply, on the variables' device) takes it; these copies are not in the
//! devices' copy counts. All of it runs under the GPUs' locks (taken in ordinal order, the only
//! place that holds several). The communicators of a set of GPUs are made once
//! (`ncclCommInitAll`) and kept for the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::nccl::{group_end, group_start, result::NcclError, Comm, ReduceOp};

use super::gpu::{here_or_host, Gpu, GpuBuffer, Operand};
use crate::cluster::DeviceName;
use crate::error::{Result, Status};
use crate::kernels::cpu::collective::{reduce_on_host, AllReduce, Reduction};
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Builds an `NcclAllReduce` member on a GPU.
pub fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
    AllReduce::create(node, reduce_on_gpus)
}

/// The communicators of one set of GPUs, rank `i` on the i-th GPU of the key.
struct Communicators(Vec<Comm>);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; every use is under the lock of `communicators()`.
unsafe impl Send for Communicators {}

/// The communicators made so far, by the driver ordinals of their GPUs in rank order.
fn communicators() -> &'static Mutex<HashMap<Vec<usize>, Communicators>> {
    static COMMS: OnceLock<Mutex<HashMap<Vec<usize>, Communicators>>> = OnceLock::new();
    COMMS.get_or_init(Mutex::default)
}

/// Whether `libnccl` can be loaded; says once when it cannot.
fn nccl_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: only tries to open the library and drops it.
        let present = unsafe { cudarc::nccl::sys::is_culib_present() };
        if !present {
            tracing::warn!("libnccl not found: all-reduces among GPUs sum in host memory");
        }
        present
    })
}

fn is_gpu(device: &str) -> bool {
    DeviceName::parse(device).is_ok_and(|name| name.device_type.as_deref() == Some("GPU"))
}

/// Reduces the members with NCCL when each is a float32 tensor of one shape on its own GPU
/// and `libnccl` is there; in host memory otherwise.
pub fn reduce_on_gpus(
    ctx: &OpContext<'_>,
    reduction: Reduction,
    members: &[(String, Tensor)],
) -> Result<Vec<Tensor>> {
    let first = &members[0].1;
    let alike = members.iter().all(|(device, t)| {
        is_gpu(device) && t.dtype() == DType::Float && t.shape() == first.shape()
    });
    if !alike || first.num_elements() == 0 || !nccl_present() {
        return reduce_on_host(ctx, reduction, members);
    }
    let gpus = members
        .iter()
        .map(|(device, _)| Gpu::for_device(device))
        .collect::<Result<Vec<_>>>()?;
    let mut ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
    ordinals.sort_unstable();
    ordinals.dedup();
    if ordinals.len() != gpus.len() {
        // Two members on one GPU: NCCL takes one rank per GPU.
        return reduce_on_host(ctx, reduction, members);
    }
    // The all-reduce holds every member's GPU lock.
    let members = members
        .iter()
        .map(|(device, t)| Ok((device.clone(), here_or_host(device, t)?)))
        .collect::<Result<Vec<_>>>()?;
    all_reduce(&ctx.node().name, reduction, &members, &gpus).map_err(|e| ctx.named(e))
}

/// The NCCL all-reduce of `members`, member `i` on `gpus[i]` (distinct GPUs, same shapes);
/// `node` is named if a GPU is out of memory.
fn all_reduce(
    node: &str,
    reduction: Reduction,
    members: &[(String, Tensor)],
    gpus: &[Arc<Gpu>],
) -> Result<Vec<Tensor>> {
    let nccl = |e: NcclError| Status::internal(format!("NCCL all-reduce: {e:?}"));
    let op = match reduction {
        Reduction::Sum => ReduceOp::Sum,
        Reduction::Prod => ReduceOp::Prod,
        Reduction::Min => ReduceOp::Min,
        Reduction::Max => ReduceOp::Max,
    };
    // Every GPU of the group, locked in ordinal order, then indexed by member.
    let mut by_ordinal: Vec<usize> = (0..gpus.len()).collect();
    by_ordinal.sort_by_key(|&i| gpus[i].ordinal());
    let mut locked: Vec<(usize, MutexGuard<'_, _>)> = by_ordinal
        .iter()
        .map(|&i| Ok((i, gpus[i].lock()?)))
        .collect::<Result<_>>()?;
    locked.sort_by_key(|(i, _)| *i);
    let inners: Vec<_> = locked.into_iter().map(|(_, guard)| guard).collect();

    let key: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
    let mut all = communicators()
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if !all.contains_key(&key) {
        let streams = inners
            .iter()
            .map(|inner| Arc::clone(&inner.stream))
            .collect();
        all.insert(
            key.clone(),
            Communicators(Comm::from_devices(streams).map_err(nccl)?),
        );
    }
    let comms = &all[&key].0;

    let len = members[0].1.num_elements();
    let mut sends = Vec::with_capacity(members.len());
    let mut recvs = Vec::with_capacity(members.len());
    for (((_, tensor), inner), gpu) in members.iter().zip(&inners).zip(gpus) {
        sends.push(match GpuBuffer::on(tensor, gpu) {
            Some(resident) => Operand::Resident(resident),
            None => Operand::Copied(inner.upload(node, &tensor.values::<f32>()?)?),
        });
        recvs.push(inner.zeros(node, len)?);
    }
    group_start().map_err(nccl)?;
    let mut launched = Ok(());
    for ((comm, send), recv) in comms.iter().zip(&sends).zip(&mut recvs) {
        launched = comm.all_reduce(&**send, recv, &op).map(drop).map_err(nccl);
        if launched.is_err() {
            break;
        }
    }
    // A group that was started is ended, whatever happened inside it.
    let ended = group_end().map(drop).map_err(nccl);
    launched.and(ended)?;
    members
        .iter()
        .zip(&inners)
        .zip(&recvs)
        .map(|(((_, tensor), inner), recv)| {
            Tensor::from_vec(tensor.shape().clone(), inner.download(recv, len)?)
        })
        .collect()
}
