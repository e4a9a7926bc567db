//! Who is in the cluster and who this task is: [`ClusterSpec`], task and device names, the
//! `ServerDef` rules, and the task's configuration (TOML cluster file, `TESSERA__...`
//! environment, classic flags, `TF_CONFIG`).

pub mod config;
pub mod device_name;
pub mod server_def;
mod spec;

pub use config::{
    CheckpointsConfig, ClassicFlags, ConfigError, DataConfig, DeviceConfig, Limits, MetricsConfig,
    ReplicaConfig, Standbys, TaskConfig, Timeouts, STANDBY_JOB,
};
pub use device_name::DeviceName;
pub use server_def::{local_task, make_server_def, LocalTask, ServerDefArgs};
pub use spec::{ClusterSpec, JobTasks, TaskId};
