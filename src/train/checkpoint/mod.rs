//! Checkpoints in TensorFlow's V2 format (tensor bundles), so that TensorFlow and tessera read
//! each other's checkpoints.
//!
//! * [`table`]: the LevelDB-format sorted table of a bundle's `.index` file.
//! * [`bundle`]: writing, reading (checksums verified) and merging bundles.
//! * [`slice`](mod@slice): the slices of partitioned variables: `shape_and_slice` specs, the
//!   keys a bundle files them under, and assembling one slice from others.
//! * [`state`]: the directory's `checkpoint` state file and [`latest_checkpoint`].
//! * [`saver`]: the save/restore ops of a graph (sharded per device as TensorFlow's
//!   `Saver(sharded=True)`), run by [`Saver`], with pruning to `max_to_keep`.
//! * [`export`]: a checkpoint as one safetensors file.
//!
//! The kernels (`SaveV2`, `RestoreV2`, `MergeV2Checkpoints`, ...) are in
//! `crate::kernels::cpu::io` and call [`bundle`].

pub mod bundle;
pub mod export;
pub mod saver;
pub mod slice;
pub mod state;
pub mod table;

pub use bundle::{merge_bundles, write_bundle, BundleReader, SaveSpec};
pub use saver::{build_saver_ops, build_saver_ops_for, SavedVariable, Saver, SaverDef, SessionRun};
pub use slice::{ShapeAndSlice, TensorSlice};
pub use state::{latest_checkpoint, read_state};
