//! Checkpoints in TensorFlow's V2 format (tensor bundles), so that TensorFlow and tessera read
//! each other's checkpoints.
//!
//! * [`crate::format::checkpoint`]: the format itself (the `.index` table, bundles, slices),
//!   below the kernels that use it; its main types are re-exported here.
//! * [`state`]: the directory's `checkpoint` state file and [`latest_checkpoint`].
//! * [`saver`]: the save/restore ops of a graph (sharded per device as TensorFlow's
//!   `Saver(sharded=True)`), run by [`Saver`], with pruning to `max_to_keep`.
//! * [`export`]: a checkpoint as one safetensors file.
//!
//! The kernels (`SaveV2`, `RestoreV2`, `MergeV2Checkpoints`, ...) are in
//! `crate::kernels::cpu::io` and call [`crate::format::checkpoint::bundle`].

pub mod export;
pub mod saver;
pub mod state;

pub use crate::format::checkpoint::{
    merge_bundles, write_bundle, BundleReader, SaveSpec, ShapeAndSlice, TensorSlice,
};
pub use saver::{build_saver_ops, build_saver_ops_for, SavedVariable, Saver, SaverDef, SessionRun};
pub use state::{latest_checkpoint, read_state};
