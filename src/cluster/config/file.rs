//! The TOML cluster file and its `TESSERA__SECTION__KEY` environment overrides.
//!
//! The file goes through the `config` crate (file, then environment), then raw serde structs
//! with `deny_unknown_fields`, then `validate()` into typed values. Before serde sees the
//! values, `schema.rs` refuses unknown keys and wrongly typed values with messages that name
//! where each key came from.
//!
//! Two things the `config` crate does that shape this file: it lowercases environment variable
//! names (job names are lowercase by convention, so `TESSERA__CLUSTER__PS` means job `ps`), and
//! it hands sparse job tables over with string keys (`"3"`), which [`parse_cluster`] turns into
//! task indices itself. The cluster section is read from the `config` crate's value tree rather
//! than through serde, so each address keeps its origin (file or environment) for the message.
//! A job can also be one comma-separated string, since a variable cannot hold a TOML list.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::ops::{RawCheckpoints, RawData, RawLimits, RawMetrics};
use super::schema::{check_schema, describe, sorted_keys};
use super::security::{validate_security, RawAuth, RawTls};
use super::{
    check_address, check_duplicates, check_job_name, default_listen, find_task, ConfigError,
    DeviceConfig, TaskConfig, Timeouts,
};
use crate::cluster::spec::JobTasks;
use crate::cluster::ClusterSpec;

/// The environment variable prefix of overrides: `TESSERA__TASK__INDEX=1`.
pub const ENV_PREFIX: &str = "TESSERA";
/// Separates the prefix, sections and keys in override variable names.
pub const ENV_SEPARATOR: &str = "__";

/// The embedded default cluster file of `tessera local`: 1 ps and 2 workers on `127.0.0.1:0`.
pub(super) const LOCAL_TOML: &str = include_str!("../../../config/local.toml");

/// How the `config` crate marks values that came from the environment.
const ENV_ORIGIN: &str = "the environment";

// ---------------------------------------------------------------------------------------------
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    #[allow(dead_code)] // Read by `parse_cluster`; declared so the section is a known key.
    cluster: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    task: RawTask,
    #[serde(default)]
    devices: RawDevices,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    checkpoints: RawCheckpoints,
    #[serde(default)]
    data: RawData,
    tls: Option<RawTls>,
    #[serde(default)]
    auth: RawAuth,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    job: Option<String>,
    index: Option<i64>,
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevices {
    cpu: Option<i64>,
    gpu: Option<i64>,
    gpu_memory_fraction: Option<f64>,
    allow_growth: Option<bool>,
    visible_gpus: Option<GpuList>,
    soft_placement: Option<bool>,
    cpu_memory_limit: Option<i64>,
    intra_op_threads: Option<i64>,
}

/// `visible_gpus`: a list in the file; a single id or `"0,1"` from the environment.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum GpuList {
    List(Vec<i64>),
    One(i64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect: Option<String>,
    rpc: Option<String>,
    create_session: Option<String>,
    shutdown_grace: Option<String>,
    startup: Option<String>,
}

/// Where each value came from: the file, or the environment variable that overrode a key.
pub(super) struct Sources {
    file: String,
    /// Dotted lowercase key → the variable that set it.
    env: BTreeMap<String, String>,
}

impl Sources {
    /// Returns the name of the source of `key`, for a message.
    fn at(&self, key: &str) -> String {
        self.at_origin(None, key)
    }

    /// Returns the source of `key` given its `config` value origin: the variable that set the
    /// key, or one of its parts or its whole list (`cluster.worker[1]` from
    /// `TESSERA__CLUSTER__WORKER`), else the file.
    pub(super) fn at_origin(&self, origin: Option<&str>, key: &str) -> String {
        let key = key.split('[').next().unwrap_or(key);
        let set_by = |env_key: &&String| {
            env_key.as_str() == key
                || env_key
                    .strip_prefix(key)
                    .is_some_and(|r| r.starts_with('.'))
        };
        match self.env.iter().find(|(k, _)| set_by(k)) {
            Some((_, var)) => format!("environment variable {var}"),
            None if origin == Some(ENV_ORIGIN) => {
                format!("environment variable {}", env_var_name(key))
            }
            None => self.file.clone(),
        }
    }
}

/// Returns the override variable for a dotted key: `task.index` → `TESSERA__TASK__INDEX`.
fn env_var_name(key: &str) -> String {
    let mut name = String::from(ENV_PREFIX);
    for part in key.split('.') {
        name.push_str(ENV_SEPARATOR);
        name.push_str(&part.to_uppercase());
    }
    name
}

impl TaskConfig {
    /// Reads a TOML cluster file, then applies `TESSERA__...` environment overrides.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_file_with_env(path, std::env::vars())
    }

    /// Reads a TOML cluster file, then applies the `TESSERA__SECTION__KEY` overrides among
    /// `env` (other variables are ignored). Tests pass their own environment here.
    pub fn from_file_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: name.clone(),
            error,
        })?;
        Self::from_toml_with_env(&text, &name, env)
    }

    /// Parses cluster-file text, `name` standing for the file in messages, then applies the
    /// `TESSERA__...` overrides among `env`.
    pub fn from_toml_with_env(
        text: &str,
        name: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        // Parse once with `toml` for a message with the line and column; the `config` crate's
        // own parse error carries them only inside a multi-line snippet.
        let mut table = toml::from_str::<toml::Table>(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map_or((1, 1), |span| line_column(text, span.start));
            ConfigError::Syntax {
                source_name: name.to_owned(),
                line,
                column,
                message: format!("invalid TOML: {}", e.message().trim_end()),
            }
        })?;

        let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}").to_lowercase();
        let mut overrides = config::Map::new();
        let mut env_keys = BTreeMap::new();
        for (var, value) in env {
            let lower = var.to_lowercase();
            let Some(rest) = lower.strip_prefix(&prefix) else {
                continue;
            };
            if rest.split(ENV_SEPARATOR).any(str::is_empty) {
                return Err(ConfigError::Invalid(format!(
                    "environment variable {var}: names no key; overrides are named \
                     TESSERA__SECTION__KEY, e.g. TESSERA__TASK__INDEX"
                )));
            }
            env_keys.insert(rest.replace(ENV_SEPARATOR, "."), var.clone());
            overrides.insert(var, value);
        }

        // `TESSERA__CLUSTER__WORKER__1` overrides one task. The `config` crate would replace a
        // dense job (a list) with a table holding that one task, so the file's list becomes the
        // equivalent table first and the override merges into it.
        let mut text = std::borrow::Cow::Borrowed(text);
        if let Some(toml::Value::Table(jobs)) = table.get_mut("cluster") {
            let mut changed = false;
            for key in env_keys.keys() {
                let Some((job, _index)) =
                    key.strip_prefix("cluster.").and_then(|k| k.split_once('.'))
                else {
                    continue;
                };
                if let Some(toml::Value::Array(addrs)) = jobs.get(job) {
                    let as_table = addrs
                        .iter()
                        .enumerate()
                        .map(|(i, a)| (i.to_string(), a.clone()))
                        .collect::<toml::Table>();
                    jobs.insert(job.to_owned(), toml::Value::Table(as_table));
                    changed = true;
                }
            }
            if changed {
                text = std::borrow::Cow::Owned(table.to_string());
            }
        }
        let sources = Sources {
            file: name.to_owned(),
            env: env_keys,
        };

        let merged = config::Config::builder()
            .add_source(config::File::from_str(&text, config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator(ENV_SEPARATOR)
                    .separator(ENV_SEPARATOR)
                    .try_parsing(true)
                    .source(Some(overrides)),
            )
            .build()
            .map_err(|e| ConfigError::Invalid(format!("{name}: {e}")))?;

        check_schema(&merged.cache, &sources)?;
        let cluster_value = match &merged.cache.kind {
            config::ValueKind::Table(top) => top.get("cluster").cloned(),
            _ => None,
        };
        let raw: RawFile = merged
            .try_deserialize()
            .map_err(|e| deserialize_error(e, &sources))?;
        let cluster = parse_cluster(cluster_value, &sources)?;
        raw.validate(cluster, &sources)
    }

    /// This configuration (from `TF_CONFIG` or the classic flags: a cluster, a task, where to
    /// listen) with the `TESSERA__SECTION__KEY` overrides among `env` applied, as a cluster
    /// file's are: `TESSERA__METRICS__LISTEN` serves metrics for a Kubeflow TFJob's pod.
    /// `source` names where the cluster came from, in messages.
    pub fn with_env(
        self,
        source: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
        let env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(var, _)| var.to_uppercase().starts_with(&prefix))
            .collect();
        if env.is_empty() {
            return Ok(self);
        }
        let mut text = String::from("[cluster]\n");
        for job in self.cluster.jobs() {
            let tasks = self
                .cluster
                .job_tasks(job)
                .map_err(|e| ConfigError::Invalid(format!("{source}: {}", e.message())))?;
            let quoted = |a: &str| toml::Value::String(a.to_owned()).to_string();
            if tasks.iter().all(Option::is_some) {
                let addrs: Vec<String> = tasks.iter().flatten().map(|a| quoted(a)).collect();
                text.push_str(&format!("{job} = [{}]\n", addrs.join(", ")));
            } else {
                let sparse: Vec<String> = tasks
                    .iter()
                    .enumerate()
                    .filter_map(|(i, a)| a.as_deref().map(|a| format!("\"{i}\" = {}", quoted(a))))
                    .collect();
                text.push_str(&format!("{job} = {{ {} }}\n", sparse.join(", ")));
            }
        }
        text.push_str(&format!(
            "[task]\njob = \"{}\"\nindex = {}\nlisten = \"{}\"\n",
            self.task.job, self.task.index, self.listen
        ));
        Self::from_toml_with_env(&text, source, env)
    }

    /// Parses the embedded default cluster file of `tessera local`, with `env` overrides.
    pub fn from_embedded_local(
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::from_toml_with_env(LOCAL_TOML, "config/local.toml (embedded)", env)
    }
}

/// Returns the 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, column)
}

/// Turns a `config` deserialization error into one naming the key and its source.
fn deserialize_error(e: config::ConfigError, sources: &Sources) -> ConfigError {
    match e {
        config::ConfigError::Type {
            origin,
            unexpected,
            expected,
            key,
        } => {
            let key = key.unwrap_or_default();
            ConfigError::InvalidValue {
                at: sources.at_origin(origin.as_deref(), &key),
                message: format!(
                    "expected {expected}, found {unexpected}; set {key} to {expected}"
                ),
                key,
            }
        }
        config::ConfigError::At { error, origin, key } => {
            let key = key.unwrap_or_default();
            let at = sources.at_origin(origin.as_deref(), &key);
            let message = match *error {
                // Only `visible_gpus` is untagged; say what it accepts.
                config::ConfigError::Message(m) if m.contains("untagged") => format!(
                    "expected a list of GPU ids such as [0, 1] (or \"0,1\" in the environment); \
                     fix {key}"
                ),
                other => format!("{other}; fix {key}"),
            };
            ConfigError::InvalidValue { at, key, message }
        }
        other => ConfigError::Invalid(format!("{}: {other}", sources.file)),
    }
}

/// Reads `[cluster]` from the value tree: a job is a list of addresses, a table of
/// `index = "host:port"`, or (from the environment) one comma-separated string.
fn parse_cluster(
    value: Option<config::Value>,
    sources: &Sources,
) -> Result<ClusterSpec, ConfigError> {
    let invalid = |origin: Option<&str>, key: String, message: String| ConfigError::InvalidValue {
        at: sources.at_origin(origin, &key),
        key,
        message,
    };
    let Some(value) = value else {
        return Err(invalid(
            None,
            "cluster".into(),
            "missing; add a [cluster] table listing each job's addresses, e.g. \
             worker = [\"w0.example:2222\"]"
                .into(),
        ));
    };
    let config::ValueKind::Table(jobs) = value.kind else {
        return Err(invalid(
            value.origin(),
            "cluster".into(),
            "expected a table of jobs; write [cluster] with one key per job".into(),
        ));
    };
    if jobs.is_empty() {
        return Err(invalid(
            None,
            "cluster".into(),
            "no jobs; list at least one job, e.g. worker = [\"w0.example:2222\"]".into(),
        ));
    }
    let mut parsed = Vec::with_capacity(jobs.len());
    for job in sorted_keys(&jobs) {
        let tasks = &jobs[job];
        let key = format!("cluster.{job}");
        check_job_name(job).map_err(|m| invalid(tasks.origin(), key.clone(), m))?;
        let address = |v: &config::Value, key: String| -> Result<String, ConfigError> {
            match &v.kind {
                config::ValueKind::String(s) => {
                    check_address(s).map_err(|m| invalid(v.origin(), key, m))?;
                    Ok(s.clone())
                }
                other => Err(invalid(
                    v.origin(),
                    key,
                    format!(
                        "expected a \"host:port\" string, found {}; quote the address",
                        describe(other)
                    ),
                )),
            }
        };
        let tasks = match &tasks.kind {
            config::ValueKind::Array(addrs) => JobTasks::Dense(
                addrs
                    .iter()
                    .enumerate()
                    .map(|(i, v)| address(v, format!("{key}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            config::ValueKind::Table(entries) => {
                let mut sparse = BTreeMap::new();
                for index in sorted_keys(entries) {
                    let v = &entries[index];
                    let task_key = format!("{key}.{index}");
                    let i = index.parse::<u32>().ok().filter(|&i| i <= i32::MAX as u32);
                    let Some(i) = i else {
                        return Err(invalid(
                            v.origin(),
                            task_key,
                            format!(
                                "\"{index}\" is not a task index; keys of a sparse job are \
                                 task indices from 0 to {}",
                                i32::MAX
                            ),
                        ));
                    };
                    sparse.insert(i, address(v, task_key)?);
                }
                JobTasks::Sparse(sparse)
            }
            config::ValueKind::String(list) => JobTasks::Dense(
                list.split(',')
                    .enumerate()
                    .map(|(i, a)| {
                        let a = a.trim();
                        check_address(a)
                            .map_err(|m| invalid(tasks.origin(), format!("{key}[{i}]"), m))?;
                        Ok(a.to_owned())
                    })
                    .collect::<Result<_, ConfigError>>()?,
            ),
            other => {
                return Err(invalid(
                    tasks.origin(),
                    key,
                    format!(
                        "expected a list of \"host:port\" addresses or a table of \
                         index = \"host:port\", found {}",
                        describe(other)
                    ),
                ))
            }
        };
        let empty = match &tasks {
            JobTasks::Dense(v) => v.is_empty(),
            JobTasks::Sparse(m) => m.is_empty(),
        };
        if empty {
            return Err(invalid(
                None,
                key,
                "job has no tasks; list its addresses or remove the job".into(),
            ));
        }
        parsed.push((job.clone(), tasks));
    }
    let cluster = ClusterSpec::from_jobs(parsed);
    check_duplicates(&cluster, &sources.file, |job| format!("cluster.{job}"))?;
    Ok(cluster)
}

/// Parses a duration such as `10s`, `500ms`, `2m`, `1h` or `1m30s`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let fix = "write a number with a unit: ms, s, m or h (e.g. \"10s\", \"500ms\", \"1m30s\")";
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(format!("empty duration; {fix}"));
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_end = rest[digits..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |i| digits + i);
        let (number, unit) = (&rest[..digits], rest[digits..unit_end].trim());
        let n: u64 = number
            .parse()
            .map_err(|_| format!("\"{text}\" is not a duration; {fix}"))?;
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "" => return Err(format!("\"{text}\" has no unit; {fix}")),
            other => return Err(format!("\"{text}\" has an unknown unit \"{other}\"; {fix}")),
        };
        total = total.saturating_add(part);
        rest = &rest[unit_end..];
    }
    Ok(total)
}

impl RawFile {
    /// Checks every value and builds the typed configuration.
    fn validate(self, cluster: ClusterSpec, sources: &Sources) -> Result<TaskConfig, ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::InvalidValue {
            at: sources.at(key),
            key: key.to_owned(),
            message,
        };

        // This task.
        let jobs: Vec<&str> = cluster.jobs().collect();
        let Some(job) = self.task.job else {
            return Err(invalid(
                "task.job",
                format!(
                    "missing; set task.job (or TESSERA__TASK__JOB) to this task's job, one of: {}",
                    jobs.join(", ")
                ),
            ));
        };
        let Some(index) = self.task.index else {
            return Err(invalid(
                "task.index",
                "missing; set task.index (or TESSERA__TASK__INDEX) to this task's index in its \
                 job"
                .into(),
            ));
        };
        let index = u32::try_from(index).map_err(|_| {
            invalid(
                "task.index",
                format!("{index} is negative; task indices start at 0"),
            )
        })?;
        let task = find_task(
            &cluster,
            &job,
            index,
            (&sources.at("task.job"), &sources.at("task.index")),
            ("task.job", "task.index"),
        )?;
        let listen = match self.task.listen {
            None => default_listen(&cluster, &task),
            Some(text) => text.trim().parse::<SocketAddr>().map_err(|_| {
                invalid(
                    "task.listen",
                    format!(
                        "\"{text}\" is not an IP address and port; use e.g. \"0.0.0.0:2222\" \
                         (hostnames are not resolved here)"
                    ),
                )
            })?,
        };

        let devices = self.devices.validate(&invalid)?;
        let timeouts = self.timeouts.validate(&invalid)?;
        let metrics = self.metrics.validate(&invalid)?;
        let limits = self.limits.validate(&invalid)?;
        let checkpoints = self.checkpoints.validate(&invalid)?;
        let data = self.data.validate(&invalid)?;
        let security = validate_security(self.tls, self.auth, &invalid)?;
        TaskConfig {
            cluster,
            task,
            listen,
            devices,
            timeouts,
            metrics,
            limits,
            checkpoints,
            data,
            security,
            partial_cluster: false,
            standbys: Default::default(),
        }
        .split_standbys(&sources.at("cluster"))
    }
}

impl RawDevices {
    fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<DeviceConfig, ConfigError> {
        let defaults = DeviceConfig::default();
        let cpu_count = match self.cpu {
            None => defaults.cpu_count,
            Some(n) => u32::try_from(n)
                .ok()
                .and_then(NonZeroU32::new)
                .ok_or_else(|| {
                    invalid(
                        "devices.cpu",
                        format!(
                        "{n} CPU devices; a task needs at least CPU:0, set devices.cpu to 1 or \
                         more"
                    ),
                    )
                })?,
        };
        let gpu_count = match self.gpu {
            None => None,
            Some(n) => Some(u32::try_from(n).map_err(|_| {
                invalid(
                    "devices.gpu",
                    format!(
                        "{n} GPUs; set devices.gpu to 0 (no GPU) or more, or remove it for all"
                    ),
                )
            })?),
        };
        let gpu_memory_fraction = match self.gpu_memory_fraction {
            None => defaults.gpu_memory_fraction,
            Some(f) if f > 0.0 && f <= 1.0 => f,
            Some(f) => {
                return Err(invalid(
                    "devices.gpu_memory_fraction",
                    format!(
                        "{f} is outside (0, 1]; set the fraction of each GPU's memory to use, \
                         e.g. 0.9"
                    ),
                ))
            }
        };
        let visible_devices = match self.visible_gpus {
            None => Vec::new(),
            Some(list) => {
                let ids: Vec<i64> = match list {
                    GpuList::List(ids) => ids,
                    GpuList::One(id) => vec![id],
                    GpuList::Text(text) => text
                        .split(',')
                        .map(|s| s.trim().parse::<i64>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| {
                            invalid(
                                "devices.visible_gpus",
                                format!("\"{text}\" is not a list of GPU ids; write e.g. \"0,1\""),
                            )
                        })?,
                };
                let mut seen = Vec::with_capacity(ids.len());
                for id in ids {
                    let id = u32::try_from(id).map_err(|_| {
                        invalid(
                            "devices.visible_gpus",
                            format!("GPU id {id} is negative; GPU ids start at 0"),
                        )
                    })?;
                    if seen.contains(&id) {
                        return Err(invalid(
                            "devices.visible_gpus",
                            format!("GPU {id} is listed twice; list each GPU once"),
                        ));
                    }
                    seen.push(id);
                }
                seen
            }
        };
        Ok(DeviceConfig {
            cpu_count,
            gpu_count,
            gpu_memory_fraction,
            allow_growth: self.allow_growth.unwrap_or(defaults.allow_growth),
            visible_devices,
            soft_placement: self.soft_placement.unwrap_or(defaults.soft_placement),
            cpu_memory_limit: match self.cpu_memory_limit {
                None => None,
                Some(n) if n >= 1 => Some(n as u64),
                Some(n) => {
                    return Err(invalid(
                        "devices.cpu_memory_limit",
                        format!(
                            "{n} bytes is not positive; set the bytes each CPU device's steps \
                             and variables may take, or remove it for 80% of the host's memory"
                        ),
                    ))
                }
            },
            intra_op_threads: match self.intra_op_threads {
                None => None,
                Some(n) if (1..=4096).contains(&n) => Some(n as u32),
                Some(n) => {
                    return Err(invalid(
                        "devices.intra_op_threads",
                        format!(
                            "{n} threads is out of range; set 1 to 4096 threads for a kernel to \
                             split its work over, or remove it for one per core"
                        ),
                    ))
                }
            },
        })
    }
}

impl RawTimeouts {
    fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Timeouts, ConfigError> {
        let defaults = Timeouts::default();
        let one = |key: &str, text: Option<String>, default: Duration| match text {
            None => Ok(default),
            Some(text) => match parse_duration(&text) {
                Ok(d) if d.is_zero() => Err(invalid(
                    key,
                    format!("\"{text}\" is zero; a wait needs a positive deadline, e.g. \"10s\""),
                )),
                Ok(d) => Ok(d),
                Err(m) => Err(invalid(key, m)),
            },
        };
        Ok(Timeouts {
            connect: one("timeouts.connect", self.connect, defaults.connect)?,
            rpc: one("timeouts.rpc", self.rpc, defaults.rpc)?,
            create_session: one(
                "timeouts.create_session",
                self.create_session,
                defaults.create_session,
            )?,
            shutdown_grace: one(
                "timeouts.shutdown_grace",
                self.shutdown_grace,
                defaults.shutdown_grace,
            )?,
            startup: one("timeouts.startup", self.startup, defaults.startup)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_add_their_parts() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("10").unwrap_err().contains("has no unit"));
        assert!(parse_duration("3 weeks")
            .unwrap_err()
            .contains("unknown unit \"weeks\""));
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn env_var_names_are_uppercase_with_double_underscores() {
        assert_eq!(env_var_name("task.index"), "TESSERA__TASK__INDEX");
    }
}
