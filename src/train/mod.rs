//! Training: what turns a graph into a model being trained.
//!
//! - [`optimizer`]: GradientDescent, Momentum, Adagrad, Adam and RMSProp as TensorFlow 1's
//!   optimizers build them (slot variables colocated with their variable, `ResourceApply*`
//!   updates, the global step).
//! - [`checkpoint`]: TensorFlow's V2 checkpoints (bundles, saver ops, the state file).
//! - [`monitored`]: the monitored training session (chief init or restore, workers waiting for
//!   the model, hooks, bounded recovery from lost tasks).
//! - [`sync_replicas`]: synchronous replication (accumulators, the token queue, the chief's loop).
//! - [`job`]: training jobs, `tessera train` and `tessera local`.
//! - [`towers`]: in-graph replication over the devices of one task (the multi-tower pattern).

pub mod checkpoint;
pub mod job;
pub mod monitored;
pub mod optimizer;
pub mod sync_replicas;
pub mod towers;
