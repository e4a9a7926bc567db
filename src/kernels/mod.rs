//! Op kernels: the code that computes one node for one step, per device type.
//!
//! A kernel is built once per node (its attrs parsed then) and reused for every step; the
//! executor calls [`OpKernel::compute`] with an [`OpContext`] holding the node's inputs.
//! [`kernel_for`] finds the factory for an op on a device type.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod emulated;
pub mod functional;
pub mod gpu_ops;

use std::sync::Arc;

use crate::device::memory::{Charge, MemoryBudget};
use crate::device::space::{self, MemorySpace};
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::format::files::{Files, AMBIENT};
use crate::proto::NodeDef;
use crate::runtime::intra::IntraPool;
use crate::runtime::rendezvous::Rendezvous;
use crate::runtime::resource::ResourceMgr;
use crate::runtime::step::{RemoteRecv, StepOptions};
use crate::tensor::Tensor;

/// What a kernel sees of its step: inputs, outputs, the device's resources.
pub struct OpContext<'a> {
    node: &'a NodeDef,
    inputs: Vec<Tensor>,
    outputs: Vec<Option<Tensor>>,
    /// The resources (variables) of the device running the kernel.
    pub resources: &'a ResourceMgr,
    /// The full name of the device running the kernel.
    pub device: &'a str,
    /// The step's id (random per step; seeds nothing by itself).
    pub step_id: i64,
    /// What the step brings besides inputs (rendezvous, deadline); `None` outside a step.
    step: Option<&'a StepOptions>,
    /// The device's memory budget, when it has a limit.
    memory: Option<&'a Arc<MemoryBudget>>,
    /// The device's own memory, when its tensors live apart from the host's.
    space: Option<&'a Arc<dyn MemorySpace>>,
    /// The paths the checkpoint and summary kernels may touch.
    files: &'a Files,
    /// The paths the input kernels may read.
    data_files: &'a Files,
    /// The device's intra-op threads, which a kernel splits large work over.
    intra: &'a IntraPool,
    /// The frame and iteration the node runs in: `(0, 0)` outside while loops. Rendezvous keys
    /// of `_Send`/`_Recv` inside a loop carry it, so each iteration's tensor has its own key.
    frame_iter: (u64, i64),
    /// Whether the node's inputs are dead (an untaken branch). Only transfer nodes
    /// (`_Send`/`_Recv`) run dead, to carry the deadness to the other side of their edge.
    input_dead: bool,
    /// The function library of the graph the node belongs to, for kernels that run
    /// functions they name (a `tf.data` map); `None` where there is none.
    functions: Option<&'a Arc<functional::FunctionLibrary>>,
    /// The session whose graph the node belongs to ("" where there is none): resources that
    /// TensorFlow keeps per session (an iterator without a `shared_name`) are named within it.
    session: &'a str,
}

impl<'a> OpContext<'a> {
    /// A context for one run of `node`'s kernel.
    pub fn new(
        node: &'a NodeDef,
        inputs: Vec<Tensor>,
        resources: &'a ResourceMgr,
        device: &'a str,
        step_id: i64,
    ) -> Self {
        Self {
            node,
            inputs,
            outputs: Vec::new(),
            resources,
            device,
            step_id,
            step: None,
            memory: None,
            space: None,
            files: &AMBIENT,
            data_files: &AMBIENT,
            intra: IntraPool::global(),
            frame_iter: (0, 0),
            input_dead: false,
            functions: None,
            session: "",
        }
    }

    /// A context for `node`, another node run inside this one's kernel (a fused op's stage, a
    /// function's body): the same device, resources, step, memory budget, files (both) and
    /// frame.
    pub fn for_node<'b>(&'b self, node: &'b NodeDef, inputs: Vec<Tensor>) -> OpContext<'b> {
        OpContext {
            node,
            inputs,
            outputs: Vec::new(),
            resources: self.resources,
            device: self.device,
            step_id: self.step_id,
            step: self.step,
            memory: self.memory,
            space: self.space,
            files: self.files,
            data_files: self.data_files,
            intra: self.intra,
            frame_iter: self.frame_iter,
            input_dead: false,
            functions: self.functions,
            session: self.session,
        }
    }

    /// The same context in session `session` (see [`OpContext::session`]).
    pub fn with_session(mut self, session: &'a str) -> Self {
        self.session = session;
        self
    }

    /// The session whose graph the node belongs to: a worker session's handle, a local
    /// session's name; "" where there is none.
    pub fn session(&self) -> &'a str {
        self.session
    }

    /// The same context with `functions`, the library of the node's graph.
    pub fn with_functions(
        mut self,
        functions: Option<&'a Arc<functional::FunctionLibrary>>,
    ) -> Self {
        self.functions = functions;
        self
    }

    /// The function library of the node's graph: FAILED_PRECONDITION naming the node where the
    /// node runs without one.
    pub fn functions(&self) -> Result<&'a Arc<functional::FunctionLibrary>> {
        self.functions.ok_or_else(|| {
            self.named(Status::failed_precondition(
                "this node runs functions of its graph's library, and it runs where no library \
                 is at hand",
            ))
        })
    }

    /// The same context in iteration `frame_iter.1` of the while-loop frame `frame_iter.0`.
    pub fn with_frame_iter(mut self, frame_iter: (u64, i64)) -> Self {
        self.frame_iter = frame_iter;
        self
    }

    /// Returns the frame and iteration the node runs in (`(0, 0)` outside loops).
    pub fn frame_iter(&self) -> (u64, i64) {
        self.frame_iter
    }

    /// The same context for a transfer node whose input is dead.
    pub fn with_dead_input(mut self, dead: bool) -> Self {
        self.input_dead = dead;
        self
    }

    /// Whether the node's input is dead (only transfer nodes run with a dead input).
    pub fn is_input_dead(&self) -> bool {
        self.input_dead
    }

    /// The same context on a device whose tensors live in `space` (`None`: host memory).
    pub fn with_memory_space(mut self, space: Option<&'a Arc<dyn MemorySpace>>) -> Self {
        self.space = space;
        self
    }

    /// Returns the device's own memory, when its tensors live apart from the host's.
    pub fn memory_space(&self) -> Option<&'a Arc<dyn MemorySpace>> {
        self.space
    }

    /// `tensor` where it belongs on this node's device ([`space::place`]): copied into a
    /// GPU's memory when the GPU computes its dtype, off another device's memory onto the
    /// host's. The kernels that bring tensors into a partition (`_Recv`, `Const`) call it.
    pub fn place(&self, tensor: Tensor) -> Result<Tensor> {
        space::place(self.space.map(|s| s.as_ref()), tensor).map_err(|e| self.named(e))
    }

    /// Returns reference input `i` (a `Ref(T)` input): the variable and its name.
    /// INVALID_ARGUMENT naming the node when the input holds a value instead.
    pub fn ref_input(&self, i: usize) -> Result<(Arc<crate::tensor::Var>, String)> {
        let t = self.input(i)?;
        t.referenced()
            .map(|(var, name)| (var.clone(), name.to_string()))
            .ok_or_else(|| {
                self.invalid(format!(
                    "input {i} must be a reference to a variable (a `Ref(T)` edge, e.g. from \
                     VariableV2), got a {} value",
                    t.dtype()
                ))
            })
    }

    /// The same context on a device whose memory `memory` accounts (see [`MemoryBudget`]):
    /// kernels that allocate device memory of their own charge it with [`OpContext::charge`].
    pub fn with_memory(mut self, memory: Option<&'a Arc<MemoryBudget>>) -> Self {
        self.memory = memory;
        self
    }

    /// The same context splitting large work over `intra`, the device's intra-op threads.
    pub fn with_intra(mut self, intra: &'a IntraPool) -> Self {
        self.intra = intra;
        self
    }

    /// The device's intra-op threads: large work splits over them (`IntraPool::parallel_for`).
    pub fn intra(&self) -> &'a IntraPool {
        self.intra
    }

    /// The same context on a device whose kernels may touch only the paths `files` allows.
    pub fn with_files(mut self, files: &'a Files) -> Self {
        self.files = files;
        self
    }

    /// The paths the checkpoint and summary kernels may touch: every file they open goes
    /// through it.
    pub fn files(&self) -> &'a Files {
        self.files
    }

    /// The same context on a device whose input kernels may read only the paths `files`
    /// allows.
    pub fn with_data_files(mut self, files: &'a Files) -> Self {
        self.data_files = files;
        self
    }

    /// The paths the input kernels (`tf.data` file sources, `ReadFile`, a table's text file)
    /// may read: every file they open goes through it.
    pub fn data_files(&self) -> &'a Files {
        self.data_files
    }

    /// Checks that `bytes` more would fit in the device's memory budget now, before the kernel
    /// allocates an output of a shape it was given; RESOURCE_EXHAUSTED naming the node, the
    /// bytes and the limit's config key otherwise. Always fine on a device without a limit.
    pub fn check_fits(&self, bytes: u64) -> Result<()> {
        match self.memory {
            Some(budget) => budget.check_fits(&self.node.name, &self.node.op, bytes),
            None => Ok(()),
        }
    }

    /// What the device's memory budget has left now (`u64::MAX` without a limit).
    pub fn memory_room(&self) -> u64 {
        self.memory.map_or(u64::MAX, |budget| budget.room())
    }

    /// Charges `bytes` of device memory this kernel is about to allocate to the device's
    /// budget, held until the returned charge is dropped; RESOURCE_EXHAUSTED naming the node,
    /// the bytes and the limit when that would go over it. `None` on a device without a limit.
    pub fn charge(&self, bytes: usize) -> Result<Option<Charge>> {
        self.memory
            .map(|budget| budget.charge(&self.node.name, &self.node.op, bytes as u64))
            .transpose()
    }

    /// The same context inside a step run with `options` (its rendezvous, deadline, remote
    /// receives).
    pub fn with_step(mut self, options: &'a StepOptions) -> Self {
        self.step = Some(options);
        self
    }

    /// Returns the step's rendezvous, if the step has one (distributed steps do).
    pub fn rendezvous(&self) -> Option<&'a Arc<Rendezvous>> {
        self.step.and_then(|s| s.rendezvous.as_ref())
    }

    /// Returns how to pull a tensor from another task, if the step may.
    pub fn remote_recv(&self) -> Option<&'a Arc<dyn RemoteRecv>> {
        self.step.and_then(|s| s.remote_recv.as_ref())
    }

    /// Returns what the step brings, when the kernel runs inside one.
    pub fn step(&self) -> Option<&'a StepOptions> {
        self.step
    }

    /// Returns the step's deadline, if it has one.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.step.and_then(|s| s.deadline)
    }

    /// Returns the step's cancellation token, if it has one (kernels that block poll it).
    pub fn cancellation(&self) -> Option<&'a crate::runtime::CancellationToken> {
        self.step.and_then(|s| s.cancellation.as_ref())
    }

    /// Returns the node being computed.
    pub fn node(&self) -> &NodeDef {
        self.node
    }

    /// Returns the number of data inputs.
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Returns input `i`, or INVALID_ARGUMENT naming the node when it has fewer inputs.
    pub fn input(&self, i: usize) -> Result<&Tensor> {
        self.inputs.get(i).ok_or_else(|| {
            Status::invalid_argument(format!(
                "node `{}` (op {}) needs input {i} but has {}",
                self.node.name,
                self.node.op,
                self.inputs.len()
            ))
        })
    }

    /// Input `i`, taken for this kernel to write its output over, when nothing else holds its
    /// elements: this node is their last reader, and no other tensor, fetch, variable or wire
    /// message shares them (TensorFlow's `forward_input`). `None`, with the input left where
    /// it is, otherwise. A taken input is gone from the inputs: the kernel reads it through
    /// the returned tensor only.
    pub fn forward_input(&mut self, i: usize) -> Option<Tensor> {
        let slot = self.inputs.get_mut(i)?;
        if !slot.is_unique() {
            return None;
        }
        Some(std::mem::replace(slot, Tensor::forwarded()))
    }

    /// Returns every input.
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// Sets output `i`.
    pub fn set_output(&mut self, i: usize, tensor: Tensor) {
        if self.outputs.len() <= i {
            self.outputs.resize(i + 1, None);
        }
        self.outputs[i] = Some(tensor);
    }

    /// Takes the outputs set so far (the executor calls this after `compute`).
    pub fn take_outputs(&mut self) -> Vec<Option<Tensor>> {
        std::mem::take(&mut self.outputs)
    }

    /// An INVALID_ARGUMENT status naming the node: `node `x` (op MatMul): <message>`.
    pub fn invalid(&self, message: impl std::fmt::Display) -> Status {
        self.named(Status::invalid_argument(message.to_string()))
    }

    /// The same status with the node put in front of its message, keeping its code.
    pub fn named(&self, status: Status) -> Status {
        status.context(format!("node `{}` (op {})", self.node.name, self.node.op))
    }
}

/// Whether the executor may run a node on the thread that starts a step (an async runtime's
/// thread) instead of handing it to its pool: a thread hop costs more than a small kernel,
/// but that thread must never wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inline {
    /// Never: the kernel may wait, or runs on a device stream.
    Never,
    /// When its last run was cheap and its inputs are no larger than then.
    WhenCheap,
    /// A receive from this task's rendezvous, once a value is there under the key.
    WhenSent(crate::runtime::rendezvous::ParsedKey),
}

/// How a node on a device of `device_type` may run inline (see [`Inline`]).
pub fn inline_kind(node: &NodeDef, device_type: DeviceType) -> Inline {
    match device_type {
        DeviceType::Cpu => cpu::inline_kind(node),
        DeviceType::Gpu => Inline::Never,
    }
}

/// The computation of one node, built once from its `NodeDef` and run every step.
pub trait OpKernel: Send + Sync {
    /// Computes the node's outputs from its inputs.
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()>;
}

/// Builds the kernel for a node (parsing its attrs once).
pub type KernelFactory = fn(&NodeDef) -> Result<Arc<dyn OpKernel>>;

/// Creates the kernel for a node on a device type. Production passes
/// [`crate::kernels::create_kernel`]; tests inject fakes.
pub type KernelLookup = dyn Fn(&NodeDef, DeviceType) -> Result<Arc<dyn OpKernel>> + Send + Sync;

/// Returns the kernel factory for `op` on `device_type`, if tessera has one. The functional
/// ops (`If`, `While`, `PartitionedCall` and their forms) run on the CPU; the executor creates
/// them with their graph's function library ([`functional::create`]), so their factory here
/// only answers that they exist.
pub fn kernel_for(op: &str, device_type: DeviceType) -> Option<KernelFactory> {
    match device_type {
        DeviceType::Cpu if functional::is_functional(op) => Some(functional::without_library),
        DeviceType::Cpu => cpu::kernel_for(op),
        #[cfg(feature = "cuda")]
        DeviceType::Gpu => cuda::kernel_for(op),
        #[cfg(not(feature = "cuda"))]
        DeviceType::Gpu => None,
    }
}

/// The memory a device of `device_type` named `name` keeps its kernels' tensors in, when it
/// is not the host's: a GPU's, with the `cuda` feature.
pub fn memory_space(device_type: DeviceType, name: &str) -> Option<Arc<dyn MemorySpace>> {
    match device_type {
        DeviceType::Cpu => None,
        #[cfg(feature = "cuda")]
        DeviceType::Gpu => Some(cuda::gpu::GpuMemory::new(name)),
        #[cfg(not(feature = "cuda"))]
        DeviceType::Gpu => {
            let _ = name;
            None
        }
    }
}

/// Builds the kernel for `node` on `device_type`, or NOT_FOUND / UNIMPLEMENTED naming the op.
pub fn create_kernel(node: &NodeDef, device_type: DeviceType) -> Result<Arc<dyn OpKernel>> {
    let factory = kernel_for(&node.op, device_type).ok_or_else(|| {
        Status::unimplemented(format!(
            "no {} kernel for op {} (node `{}`)",
            device_type.as_str(),
            node.op,
            node.name
        ))
    })?;
    factory(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::registry::global;

    /// Reports which registered ops have no CPU kernel; the compute ops the gradients emit
    /// must all have one, or a backward graph could not run.
    #[test]
    fn ops_emitted_by_gradients_have_cpu_kernels() {
        let needed = [
            "AddN",
            "AddV2",
            "BiasAddGrad",
            "BroadcastGradientArgs",
            "BroadcastTo",
            "Cast",
            "ConcatV2",
            "Equal",
            "Fill",
            "FloorMod",
            "GatherV2",
            "GatherNd",
            "ScatterNd",
            "Greater",
            "GreaterEqual",
            "LessEqual",
            "Log",
            "LogSoftmax",
            "MatMul",
            "Maximum",
            "Minimum",
            "Mul",
            "Neg",
            "OneHot",
            "Pack",
            "Pow",
            "Prod",
            "Range",
            "Rank",
            "RealDiv",
            "Reciprocal",
            "ReluGrad",
            "Reshape",
            "Select",
            "SelectV2",
            "Shape",
            "SigmoidGrad",
            "Sign",
            "Size",
            "Slice",
            "Softmax",
            "Squeeze",
            "Sub",
            "Sum",
            "TanhGrad",
            "Tile",
            "Transpose",
            "Unpack",
            "ZerosLike",
            "BatchMatMulV2",
            "ExpandDims",
            "Exp",
            "UnsortedSegmentSum",
            "UnsortedSegmentProd",
            "SegmentSum",
            "SegmentProd",
            "SparseSegmentSumGrad",
            "SparseSegmentMeanGrad",
            "SparseSegmentSqrtNGrad",
            "DynamicPartition",
            "ParallelDynamicStitch",
            "VariableShape",
            "LogicalAnd",
            "Cumsum",
            "Cumprod",
            "DivNoNan",
            "MirrorPad",
            "MirrorPadGrad",
            "CheckNumerics",
            "CheckNumericsV2",
        ];
        let missing: Vec<&str> = needed
            .iter()
            .copied()
            .filter(|op| global().get(op).is_none() || kernel_for(op, DeviceType::Cpu).is_none())
            .collect();
        assert!(missing.is_empty(), "ops without a CPU kernel: {missing:?}");
    }
}
