//! GPU kernels through cudarc (feature `cuda`): cuBLAS for MatMul, NCCL for all-reduces,
//! NVRTC-compiled CUDA C for the rest. Nothing here links CUDA at build time: the driver,
//! cuBLAS, NCCL and NVRTC libraries are loaded when a GPU kernel first runs, which only
//! happens on a device that discovery found.
//!
//! - [`gpu`]: one GPU's context, stream, cuBLAS handle and compiled kernels, opened once.
//! - [`ops`]: the kernels and [`kernel_for`].
//! - [`conv`]: the convolutions and pooling ops, direct kernels over a window's geometry.
//! - [`layout`]: how the CUDA kernels index broadcast operands, reductions and sliding
//!   windows, worked out on the host.
//! - [`nccl`]: `NcclAllReduce` among GPUs through NCCL.
//!
//! Ops without a GPU kernel are placed on the CPU by soft placement. A GPU device's float32
//! tensors live in its memory ([`gpu::GpuMemory`], [`gpu::GpuBuffer`]) between kernels; the
//! `_Recv` and `Const` on a GPU put theirs there, and a tensor crosses back to the host when host
//! code reads it (the `_Send` to the CPU, a fetch).

mod conv;
pub mod gpu;
pub mod layout;
pub mod nccl;
pub mod ops;

pub use ops::kernel_for;
