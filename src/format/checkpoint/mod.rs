//! TensorFlow's V2 checkpoint format (tensor bundles), below the kernels that read and write it
//! (`SaveV2`, `RestoreV2`, `MergeV2Checkpoints`) and the trainer's saver.
//!
//! * [`table`]: the LevelDB-format sorted table of a bundle's `.index` file.
//! * [`bundle`]: writing, reading (checksums verified) and merging bundles.
//! * [`slice`](mod@slice): the slices of partitioned variables: `shape_and_slice` specs, the
//!   keys a bundle files them under, and assembling one slice from others.

pub mod bundle;
pub mod slice;
pub mod table;

pub use bundle::{merge_bundles, write_bundle, BundleReader, SaveSpec, StoredVariant};
pub use slice::{ShapeAndSlice, TensorSlice};
