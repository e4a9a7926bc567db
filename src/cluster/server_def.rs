//! `ServerDef` rules: building TensorFlow's `ServerDef` from a cluster and the task's choices
//! (`tf.train.Server`'s `_make_server_def`), and reading one back into the pieces of a
//! [`TaskConfig`] as TensorFlow's gRPC server does at start (find its own task, parse its
//! port, create its devices from `default_session_config`).
//!
//! Devices are fixed when the server starts, so the [`DeviceConfig`] travels in the
//! `ServerDef`'s `default_session_config` (`device_count`, `gpu_options`,
//! `allow_soft_placement`) and nowhere else.

use std::net::SocketAddr;
use std::num::NonZeroU32;

use prost::Message;

use super::{ClusterSpec, DeviceConfig, TaskConfig, TaskId, Timeouts};
use crate::error::{Result, Status};
use crate::proto::{ConfigProto, GpuOptions, ServerDef};

/// The protocol a `ServerDef` gets when none is given.
pub const DEFAULT_PROTOCOL: &str = "grpc";

/// What `_make_server_def` takes besides the cluster: each `None` is "not given".
#[derive(Clone, Debug, Default)]
pub struct ServerDefArgs {
    /// This task's job; may be left out when the cluster has one job.
    pub job_name: Option<String>,
    /// This task's index; may be left out when the job has one task.
    pub task_index: Option<u32>,
    /// `"grpc"` when left out.
    pub protocol: Option<String>,
    /// Merged into `default_session_config` (protobuf `MergeFrom`).
    pub config: Option<ConfigProto>,
}

/// Builds a `ServerDef` from a cluster, TensorFlow's way: the job may be left out only when
/// the cluster has exactly one, the task index only when that job has exactly one task.
pub fn make_server_def(cluster: &ClusterSpec, args: ServerDefArgs) -> Result<ServerDef> {
    let job_name = match args.job_name.filter(|j| !j.is_empty()) {
        Some(job) => job,
        None => match cluster.jobs().collect::<Vec<_>>().as_slice() {
            [only] => (*only).to_owned(),
            _ => {
                return Err(Status::invalid_argument(
                    "Must specify an explicit job_name.",
                ))
            }
        },
    };
    let task_index = match args.task_index {
        Some(index) => index,
        None => match cluster.task_indices(&job_name)?.as_slice() {
            [only] => *only,
            _ => {
                return Err(Status::invalid_argument(
                    "Must specify an explicit task_index.",
                ))
            }
        },
    };
    let mut def = ServerDef {
        cluster: Some(cluster.to_cluster_def()),
        job_name,
        task_index: index_to_proto(task_index)?,
        protocol: args.protocol.unwrap_or_else(|| DEFAULT_PROTOCOL.to_owned()),
        ..ServerDef::default()
    };
    if let Some(config) = args.config {
        merge_config(
            def.default_session_config
                .get_or_insert_with(Default::default),
            &config,
        )?;
    }
    Ok(def)
}

/// Overrides the fields of an existing `ServerDef` that `args` gives, as `_make_server_def`
/// does when handed a `ServerDef`: job, task and protocol replace, `config` merges.
pub fn override_server_def(mut def: ServerDef, args: ServerDefArgs) -> Result<ServerDef> {
    if let Some(job) = args.job_name {
        def.job_name = job;
    }
    if let Some(index) = args.task_index {
        def.task_index = index_to_proto(index)?;
    }
    if let Some(protocol) = args.protocol {
        def.protocol = protocol;
    }
    if let Some(config) = args.config {
        merge_config(
            def.default_session_config
                .get_or_insert_with(Default::default),
            &config,
        )?;
    }
    Ok(def)
}

/// Protobuf `MergeFrom`: set scalars replace, maps merge, repeated fields append, messages
/// merge recursively. Encoding `from` and merging its bytes is exactly that.
fn merge_config(into: &mut ConfigProto, from: &ConfigProto) -> Result<()> {
    into.merge(from.encode_to_vec().as_slice())
        .map_err(Status::from)
}

fn index_to_proto(index: u32) -> Result<i32> {
    i32::try_from(index).map_err(|_| {
        Status::invalid_argument(format!(
            "task index {index} does not fit a ServerDef (int32)"
        ))
    })
}

/// The local task a `ServerDef` describes, as TensorFlow's gRPC server finds it at start.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalTask {
    /// The cluster.
    pub cluster: ClusterSpec,
    /// This task.
    pub task: TaskId,
    /// This task's address in the cluster.
    pub address: String,
    /// The port to bind: `ServerDef.port` when set, else the one in the address.
    pub port: u16,
}

/// Finds this task of a `ServerDef` in its cluster and the port it binds.
///
/// Errors are TensorFlow's: `Job "J" was not defined in cluster` (INTERNAL), `Task N was not
/// defined in job "J"` and `Could not parse port for local server from "addr"`
/// (INVALID_ARGUMENT).
pub fn local_task(def: &ServerDef) -> Result<LocalTask> {
    let cluster = ClusterSpec::from_cluster_def(&def.cluster.clone().unwrap_or_default())?;
    let job = &def.job_name;
    let Ok(tasks) = cluster.tasks(job) else {
        return Err(Status::internal(format!(
            "Job \"{job}\" was not defined in cluster"
        )));
    };
    let address = u32::try_from(def.task_index)
        .ok()
        .and_then(|i| tasks.get(&i))
        .cloned()
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "Task {} was not defined in job \"{job}\"",
                def.task_index
            ))
        })?;
    let index = u32::try_from(def.task_index).unwrap_or_default();
    let port = if def.port != 0 {
        u16::try_from(def.port).map_err(|_| {
            Status::invalid_argument(format!(
                "ServerDef.port {} is out of range; use a port from 1 to 65535",
                def.port
            ))
        })?
    } else {
        address
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "Could not parse port for local server from \"{address}\""
                ))
            })?
    };
    Ok(LocalTask {
        cluster,
        task: TaskId::new(job.clone(), index),
        address,
        port,
    })
}

/// Reads the devices a server creates from its `default_session_config`. Fields left at
/// their protobuf defaults keep tessera's defaults, except `allow_soft_placement`, whose
/// proto default (false) is also TensorFlow's.
pub fn device_config(config: Option<&ConfigProto>) -> Result<DeviceConfig> {
    let defaults = DeviceConfig::default();
    let Some(config) = config else {
        return Ok(defaults);
    };
    let count = |kind: &str| config.device_count.get(kind).copied();
    let cpu_count = match count("CPU") {
        None => defaults.cpu_count,
        Some(n) => u32::try_from(n)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                "default_session_config.device_count[\"CPU\"] is {n}; a task needs at least one \
                 CPU device"
            ))
            })?,
    };
    let gpu_count = match count("GPU") {
        None => None,
        Some(n) => Some(u32::try_from(n).map_err(|_| {
            Status::invalid_argument(format!(
                "default_session_config.device_count[\"GPU\"] is {n}; use 0 or more"
            ))
        })?),
    };
    let gpu = config.gpu_options.clone().unwrap_or_default();
    let gpu_memory_fraction = match gpu.per_process_gpu_memory_fraction {
        0.0 => defaults.gpu_memory_fraction,
        f if f > 0.0 && f <= 1.0 => f,
        f => {
            return Err(Status::invalid_argument(format!(
                "gpu_options.per_process_gpu_memory_fraction {f} is outside (0, 1]; tessera \
                 does not use unified memory"
            )))
        }
    };
    let visible_devices = if gpu.visible_device_list.trim().is_empty() {
        Vec::new()
    } else {
        gpu.visible_device_list
            .split(',')
            .map(|id| id.trim().parse::<u32>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                Status::invalid_argument(format!(
                    "gpu_options.visible_device_list \"{}\" is not a comma-separated list of GPU \
                     ids",
                    gpu.visible_device_list
                ))
            })?
    };
    Ok(DeviceConfig {
        cpu_count,
        gpu_count,
        gpu_memory_fraction,
        allow_growth: gpu.allow_growth,
        visible_devices,
        soft_placement: config.allow_soft_placement,
        cpu_memory_limit: None,
        // TensorFlow's 0 (and a negative value) lets the runtime pick: one per core.
        intra_op_threads: u32::try_from(config.intra_op_parallelism_threads)
            .ok()
            .filter(|&n| n > 0),
    })
}

/// Writes a [`DeviceConfig`] as the `ConfigProto` fields that carry it.
pub fn session_config(devices: &DeviceConfig) -> ConfigProto {
    let mut config = ConfigProto::default();
    config.device_count.insert(
        "CPU".into(),
        devices.cpu_count.get().min(i32::MAX as u32) as i32,
    );
    if let Some(gpus) = devices.gpu_count {
        config
            .device_count
            .insert("GPU".into(), gpus.min(i32::MAX as u32) as i32);
    }
    config.gpu_options = Some(GpuOptions {
        per_process_gpu_memory_fraction: devices.gpu_memory_fraction,
        allow_growth: devices.allow_growth,
        visible_device_list: devices
            .visible_devices
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        ..GpuOptions::default()
    });
    config.allow_soft_placement = devices.soft_placement;
    config.intra_op_parallelism_threads = devices
        .intra_op_threads
        .map_or(0, |n| n.min(i32::MAX as u32) as i32);
    config
}

impl TaskConfig {
    /// Builds the configuration a `ServerDef` describes: its cluster and task, listening on
    /// every interface at the task's port, devices from `default_session_config`, default
    /// timeouts.
    pub fn from_server_def(def: &ServerDef) -> Result<Self> {
        let local = local_task(def)?;
        if !def.protocol.is_empty() && def.protocol != DEFAULT_PROTOCOL {
            return Err(Status::unimplemented(format!(
                "protocol \"{}\" is not supported; tessera serves \"grpc\"",
                def.protocol
            )));
        }
        Ok(Self {
            cluster: local.cluster,
            task: local.task,
            listen: SocketAddr::from(([0, 0, 0, 0], local.port)),
            devices: device_config(def.default_session_config.as_ref())?,
            timeouts: Timeouts::default(),
            metrics: Default::default(),
            limits: Default::default(),
            checkpoints: Default::default(),
            data: Default::default(),
            security: Default::default(),
            partial_cluster: false,
            standbys: Default::default(),
        })
    }

    /// Returns this configuration as a `ServerDef` (protocol `grpc`, devices in
    /// `default_session_config`).
    pub fn to_server_def(&self) -> Result<ServerDef> {
        let mut def = make_server_def(
            &self.cluster,
            ServerDefArgs {
                job_name: Some(self.task.job.clone()),
                task_index: Some(self.task.index),
                protocol: None,
                config: Some(session_config(&self.devices)),
            },
        )?;
        if self.listen.port() != 0 {
            def.port = i32::from(self.listen.port());
        }
        Ok(def)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_config_follows_protobuf_merge_rules() {
        let mut into = ConfigProto {
            allow_soft_placement: true,
            ..Default::default()
        };
        into.device_filters.push("/job:ps".into());
        into.device_count.insert("CPU".into(), 2);
        let mut from = ConfigProto::default();
        from.device_filters.push("/job:worker/task:1".into());
        from.device_count.insert("GPU".into(), 0);
        merge_config(&mut into, &from).unwrap();
        // A false bool in `from` is unset and does not clear `true`; lists append; maps merge.
        assert!(into.allow_soft_placement);
        assert_eq!(into.device_filters, ["/job:ps", "/job:worker/task:1"]);
        assert_eq!(into.device_count.len(), 2);
    }
}
