//! Training jobs: what `tessera train` runs in each task of a ps/worker cluster, and what
//! `tessera local` starts on one machine.
//!
//! - [`spec`]: the [`TrainSpec`] (model, optimizer, data, schedule, sync, checkpoints) and the
//!   checks that refuse bad input before training starts.
//! - [`model`]: the between-graph replicated training graph each worker builds.
//! - [`layers`]: the dense layers and Glorot-uniform initial values the models share.
//! - [`cnn`]: the convolutional network of `--model cnn`, on square grayscale images.
//! - [`embedding`]: the wide-and-deep model of `--model embedding`, on partitioned tables.
//! - [`role`]: what a ps, a worker and the chief do next to their daemon.
//! - [`agree`]: the chief's model flags, which every other worker must share.
//! - [`evaluator`]: the task outside the cluster that scores each checkpoint.
//! - [`signal`]: how the chief tells every task that training is over, through the runtime.
//! - [`progress`]: the chief's progress line.
//! - [`launcher`]: `tessera local`, the embedded cluster as child processes.

pub mod agree;
pub mod cnn;
pub mod embedding;
pub mod evaluator;
pub mod launcher;
pub mod layers;
pub mod model;
pub mod progress;
pub mod role;
pub mod signal;
pub mod spec;

pub use role::{
    check, check_tower_gpus, confine_checkpoints, confine_data, provide_tower_devices, run,
    ChiefReport, Finished, Replica, StopRequest,
};
pub use spec::{DataSource, ModelKind, SyncSpec, TrainSpec, MODEL_NAMES, OPTIMIZER_NAMES};
