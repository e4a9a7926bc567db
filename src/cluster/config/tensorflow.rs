//! TensorFlow's own ways to say who a task is: the classic `--ps_hosts` / `--worker_hosts` /
//! `--job_name` / `--task_index` flags, and the `TF_CONFIG` JSON document (Estimator's
//! `RunConfig` rules, reference §1.4). Both give default devices and timeouts.

use super::{
    check_address, check_duplicates, check_job_name, default_listen, find_task, ClassicFlags,
    ConfigError, DeviceConfig, TaskConfig, Timeouts,
};
use crate::cluster::ClusterSpec;

impl TaskConfig {
    /// Builds the configuration from the classic flags.
    ///
    /// `--job_name` may be left out only when the cluster has one job, `--task_index` only when
    /// the job has one task (TensorFlow's `ServerDef` rules). The server listens on every
    /// interface at the port of its own address.
    pub fn from_classic_flags(flags: &ClassicFlags) -> Result<Self, ConfigError> {
        let invalid = |flag: &str, message: String| ConfigError::InvalidValue {
            at: "flags".into(),
            key: flag.to_owned(),
            message,
        };
        let mut jobs = Vec::new();
        for (job, flag, hosts) in [
            ("ps", "--ps_hosts", &flags.ps_hosts),
            ("worker", "--worker_hosts", &flags.worker_hosts),
        ] {
            let Some(hosts) = hosts.as_deref().map(str::trim).filter(|h| !h.is_empty()) else {
                continue;
            };
            let addrs = hosts
                .split(',')
                .map(|a| {
                    let a = a.trim();
                    check_address(a)
                        .map(|_| a.to_owned())
                        .map_err(|m| invalid(flag, m))
                })
                .collect::<Result<Vec<_>, _>>()?;
            jobs.push((job, addrs));
        }
        if jobs.is_empty() {
            return Err(invalid(
                "--ps_hosts/--worker_hosts",
                "no tasks; pass --worker_hosts (and --ps_hosts) as comma-separated host:port lists"
                    .into(),
            ));
        }
        let cluster = ClusterSpec::from_dense(jobs);
        check_duplicates(&cluster, "flags", |job| format!("--{job}_hosts"))?;

        let job = match &flags.job_name {
            Some(job) => job.clone(),
            None => match cluster.jobs().collect::<Vec<_>>().as_slice() {
                [only] => (*only).to_owned(),
                _ => {
                    return Err(invalid(
                        "--job_name",
                        "missing; the cluster has more than one job, so pass --job_name ps or \
                         --job_name worker"
                            .into(),
                    ))
                }
            },
        };
        let index = match flags.task_index {
            Some(index) => index,
            None => match cluster
                .tasks(&job)
                .map(|t| t.keys().copied().collect::<Vec<_>>())
            {
                Ok(indices) if indices.len() == 1 => indices[0],
                Ok(_) => {
                    return Err(invalid(
                        "--task_index",
                        format!(
                            "missing; job \"{job}\" has more than one task, so pass --task_index \
                             with this task's position in its --*_hosts list"
                        ),
                    ))
                }
                Err(_) => 0, // reported by `find_task` below
            },
        };
        let task = find_task(
            &cluster,
            &job,
            index,
            ("flags", "flags"),
            ("--job_name", "--task_index"),
        )?;
        let listen = default_listen(&cluster, &task);
        Ok(Self {
            cluster,
            task,
            listen,
            devices: DeviceConfig::default(),
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

    /// Builds the configuration from a `TF_CONFIG` JSON document.
    ///
    /// Follows Estimator's `RunConfig` when `cluster` has a `chief` job (legacy `master` also
    /// counts): it must have exactly one task. Without one, as a Kubeflow TFJob with PS and
    /// Worker replicas sets it, worker 0 is the chief (logged); a cluster with neither a chief
    /// nor a worker 0 is refused. `task.type` and `task.index` are required and must name a task
    /// of the cluster. An `evaluator` is not part of the cluster and is refused, as is a
    /// document without `cluster` (TensorFlow then trains in-process, with nothing to serve).
    pub fn from_tf_config(json: &str) -> Result<Self, ConfigError> {
        const AT: &str = "TF_CONFIG";
        let invalid = |key: &str, message: String| ConfigError::InvalidValue {
            at: AT.into(),
            key: key.to_owned(),
            message,
        };
        let doc: serde_json::Value =
            serde_json::from_str(json).map_err(|e| ConfigError::Syntax {
                source_name: AT.into(),
                line: e.line(),
                column: e.column(),
                message: format!("invalid JSON: {e}"),
            })?;
        let Some(doc) = doc.as_object() else {
            return Err(invalid(
                "(document)",
                "expected a JSON object with \"cluster\" and \"task\"".into(),
            ));
        };

        if let Some(layer) = doc.get("rpc_layer") {
            if layer.as_str() != Some("grpc") {
                return Err(invalid(
                    "rpc_layer",
                    format!(
                        "{layer} is not supported; tessera speaks \"grpc\", remove rpc_layer or \
                         set it to \"grpc\""
                    ),
                ));
            }
        }

        let task = doc.get("task").and_then(|t| t.as_object());
        let task_type = task.and_then(|t| t.get("type"));
        if task_type.and_then(|t| t.as_str()) == Some("evaluator") {
            return Err(ConfigError::NotAServer {
                at: AT.into(),
                key: "task.type".into(),
                message: "an \"evaluator\" is not part of the cluster and serves nothing; run \
                          it as a client process, not as a tessera daemon"
                    .into(),
            });
        }
        // Kubeflow's TFJob with dynamic workers (`enableDynamicWorker`) writes `sparseCluster`
        // instead: a ps sees only itself, a worker the ps tasks and itself.
        let (cluster_json, partial) = match (doc.get("cluster"), doc.get("sparseCluster")) {
            (Some(cluster), _) => (cluster.clone(), false),
            (None, Some(sparse)) => (sparse_view(sparse, task), true),
            (None, None) => {
                return Err(ConfigError::NotAServer {
                    at: AT.into(),
                    key: "cluster".into(),
                    message: "missing; without a cluster TensorFlow trains in-process and there \
                              is nothing to serve; add \"cluster\": {\"chief\": [...], \
                              \"worker\": [...]}"
                        .into(),
                })
            }
        };
        let cluster_json = &cluster_json;
        let cluster = ClusterSpec::from_json(cluster_json)
            .map_err(|s| invalid("cluster", s.message().to_owned()))?;
        for (task, addr) in cluster.all_tasks() {
            check_job_name(&task.job).map_err(|m| invalid(&format!("cluster.{}", task.job), m))?;
            check_address(addr)
                .map_err(|m| invalid(&format!("cluster.{}[{}]", task.job, task.index), m))?;
        }
        check_duplicates(&cluster, AT, |job| format!("cluster.{job}"))?;

        // The chief rule: exactly one chief task (legacy `master` stands in for it). Without
        // a chief job (a Kubeflow TFJob with PS and Worker replicas, between-graph ps/worker
        // programs), worker 0 is the chief, as `TFConfigClusterResolver` and
        // `MonitoredTrainingSession(is_chief=task_index == 0)` programs have it.
        let chief_job = ["chief", "master"]
            .into_iter()
            .find(|j| cluster.jobs().any(|n| n == *j));
        match chief_job.map(|j| (j, cluster.num_tasks(j).unwrap_or(0))) {
            None if partial => tracing::info!(
                task = ?task.and_then(|t| t.get("type")),
                "a sparse TF_CONFIG (a TFJob's dynamic workers): this task sees only part of \
                 the cluster; the chief is worker 0"
            ),
            None => {
                let worker0 = cluster
                    .all_tasks()
                    .find(|(t, _)| t.job == "worker" && t.index == 0)
                    .map(|(_, addr)| addr.to_owned());
                let Some(worker0) = worker0 else {
                    let jobs = cluster.jobs().collect::<Vec<_>>().join(", ");
                    let message = if cluster.jobs().any(|j| j == "worker") {
                        format!(
                            "has no \"chief\" job and no task 0 in \"worker\" to be the chief \
                             (jobs: {jobs}); add \"chief\": [\"host:port\"] or a worker with \
                             index 0"
                        )
                    } else {
                        format!(
                            "has neither a \"chief\" nor a \"worker\" job (jobs: {jobs}); add \
                             \"chief\": [\"host:port\"], or \"worker\": [...] whose task 0 \
                             becomes the chief"
                        )
                    };
                    return Err(invalid("cluster", message));
                };
                tracing::info!(
                    chief = %format!("/job:worker/task:0 ({worker0})"),
                    "no chief job in TF_CONFIG's cluster; worker 0 is the chief"
                );
            }
            Some((job, n)) if n != 1 => {
                return Err(invalid(
                    &format!("cluster.{job}"),
                    format!(
                        "The \"cluster\" in TF_CONFIG must have only one \"{job}\" node, found \
                         {n}; keep one and move the others to \"worker\""
                    ),
                ))
            }
            Some(_) => {}
        }

        let Some(task) = task else {
            return Err(invalid(
                "task",
                "missing; with \"cluster\" set, add \"task\": {\"type\": ..., \"index\": ...}"
                    .into(),
            ));
        };
        let job = match task_type {
            Some(serde_json::Value::String(t)) if !t.is_empty() => t.clone(),
            Some(other) => {
                return Err(invalid(
                    "task.type",
                    format!("{other} is not a job name; set it to a job of the cluster"),
                ))
            }
            None => {
                return Err(invalid(
                    "task.type",
                    "missing; set it to this task's job (chief, worker, ps)".into(),
                ))
            }
        };
        let index = match task.get("index") {
            Some(serde_json::Value::Number(n)) => {
                match n.as_u64().and_then(|i| u32::try_from(i).ok()) {
                    Some(i) => i,
                    None => {
                        return Err(invalid(
                            "task.index",
                            format!("{n} is not a task index; set it to an integer from 0"),
                        ))
                    }
                }
            }
            Some(other) => {
                return Err(invalid(
                    "task.index",
                    format!("{other} is not a task index; set it to an integer from 0"),
                ))
            }
            None => {
                return Err(invalid(
                    "task.index",
                    "missing; set it to this task's index in its job".into(),
                ))
            }
        };
        let task = find_task(&cluster, &job, index, (AT, AT), ("task.type", "task.index"))?;
        let listen = default_listen(&cluster, &task);
        Ok(Self {
            cluster,
            task,
            listen,
            devices: DeviceConfig::default(),
            timeouts: Timeouts::default(),
            metrics: Default::default(),
            limits: Default::default(),
            checkpoints: Default::default(),
            data: Default::default(),
            security: Default::default(),
            partial_cluster: partial,
            standbys: Default::default(),
        })
    }
}

/// The cluster a sparse `TF_CONFIG` gives `task`, as TensorFlow's `ClusterSpec` reads it: its
/// own job is the one-address list TFJob writes for a ps (`["ps-1:2222"]` for ps 1), which
/// is this task at its own index; a job without tasks (TFJob's `"worker": {}` for a ps) is
/// left out.
fn sparse_view(
    sparse: &serde_json::Value,
    task: Option<&serde_json::Map<String, serde_json::Value>>,
) -> serde_json::Value {
    let Some(jobs) = sparse.as_object() else {
        return sparse.clone(); // refused by ClusterSpec::from_json, with its message
    };
    let own_job = task.and_then(|t| t.get("type")).and_then(|t| t.as_str());
    let own_index = task.and_then(|t| t.get("index")).and_then(|i| i.as_u64());
    let mut view = serde_json::Map::new();
    for (job, tasks) in jobs {
        let empty = match tasks {
            serde_json::Value::Array(a) => a.is_empty(),
            serde_json::Value::Object(o) => o.is_empty(),
            _ => false,
        };
        if empty {
            continue;
        }
        let tasks = match (tasks, own_index) {
            (serde_json::Value::Array(addrs), Some(index))
                if Some(job.as_str()) == own_job && addrs.len() == 1 =>
            {
                serde_json::json!({ index.to_string(): addrs[0] })
            }
            _ => tasks.clone(),
        };
        view.insert(job.clone(), tasks);
    }
    serde_json::Value::Object(view)
}
