//! The ops tessera runs on a GPU, known in every build: placement asks it which nodes a GPU
//! can take, the CUDA kernels (feature `cuda`) and the emulated GPU ([`super::emulated`])
//! implement exactly these.

use crate::kernels::cpu::training::Rule;

/// Ops that only move, name or route tensors: the partitioner puts them on a GPU device
/// (`_Send`/`_Recv` for each edge that crosses it, the `Const` and `Identity` of a cut control
/// edge, the control loops of a loop that spans it), as TensorFlow registers them for GPUs.
/// Their CPU kernels serve a GPU device unchanged, for every dtype: they pass tensors along
/// wherever they are, and the ones that bring a tensor in (`_Recv`, `Const`) put it in the
/// device's memory.
pub const HOST_MEMORY_OPS: [&str; 22] = [
    "_Send",
    "_Recv",
    "_HostSend",
    "_HostRecv",
    "Const",
    "Identity",
    "IdentityN",
    "Snapshot",
    "StopGradient",
    "NoOp",
    "ControlTrigger",
    "Enter",
    "Exit",
    "Switch",
    "Merge",
    "NextIteration",
    "LoopCond",
    "RefEnter",
    "RefExit",
    "RefSwitch",
    "RefMerge",
    "RefNextIteration",
];

/// The compute ops with a float32 GPU kernel (besides every optimizer update, see
/// [`computes`]).
pub const COMPUTE_OPS: [&str; 48] = [
    "MatMul",
    "BatchMatMulV2",
    "BatchMatMul",
    "Add",
    "AddV2",
    "Sub",
    "Mul",
    "RealDiv",
    "Maximum",
    "Minimum",
    "Pow",
    "ReluGrad",
    "SigmoidGrad",
    "TanhGrad",
    "Neg",
    "Square",
    "Abs",
    "Sign",
    "Sqrt",
    "Rsqrt",
    "Exp",
    "Log",
    "Reciprocal",
    "Inv",
    "Sigmoid",
    "Tanh",
    "Relu",
    "BiasAdd",
    "BiasAddV1",
    "BiasAddGrad",
    "Sum",
    "Mean",
    "Max",
    "Min",
    "Prod",
    "L2Loss",
    "NcclAllReduce",
    "Softmax",
    "LogSoftmax",
    "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits",
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "MaxPool",
    "MaxPoolGrad",
    "AvgPool",
    "AvgPoolGrad",
];

/// Whether a GPU computes `op` (float32; other dtypes of it run their CPU kernel on the host
/// memory a GPU keeps them in).
pub fn computes(op: &str) -> bool {
    COMPUTE_OPS.contains(&op) || Rule::of(op).is_some()
}

/// Whether a node of `op` may be placed on a GPU.
pub fn runs_on_gpu(op: &str) -> bool {
    HOST_MEMORY_OPS.contains(&op) || computes(op)
}
