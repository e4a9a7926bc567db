//! The operator's sections of a cluster file: `[metrics]` (where the Prometheus endpoint
//! listens, off when absent), `[limits]` (how much one request, session or shard may take) and
//! `[checkpoints]` (where clients' checkpoint and summary kernels may touch files) and `[data]`
//! (where the input kernels may read).
//!
//! Limits exist so that one careless or hostile client cannot take a shared task down: a
//! request over a limit is refused with RESOURCE_EXHAUSTED whose message names the limit's
//! config key and value and the request's size ([`Limits::exceeded`]), and the task keeps
//! serving everyone else. The defaults are generous enough that no ordinary training job meets
//! them; they only bound the pathological.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;
use crate::error::Status;
use crate::proto::{attr_value, GraphDef, TensorProto};
use crate::tensor::declared_bytes;

/// `[metrics]`: the Prometheus endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Where the HTTP endpoint listens (`127.0.0.1:9100`; port 0 lets the OS pick); `None`
    /// turns metrics off.
    pub listen: Option<SocketAddr>,
}

/// `[limits]`: the most one request, session or shard may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest gRPC request a task decodes, in bytes (`limits.max_message_bytes`).
    pub max_message_bytes: usize,
    /// Most nodes in one graph a client or master sends (`limits.max_graph_nodes`).
    pub max_graph_nodes: usize,
    /// Largest serialized graph a client or master sends, in bytes (`limits.max_graph_bytes`).
    pub max_graph_bytes: usize,
    /// Most sessions a task's master holds open at once (`limits.max_sessions`).
    pub max_sessions: usize,
    /// Most steps one session runs at once (`limits.max_steps_in_flight`).
    pub max_steps_in_flight: usize,
    /// Most bytes of variable values the task's variable shard holds
    /// (`limits.max_shard_bytes`).
    pub max_shard_bytes: u64,
    /// Most bytes the tensors of one request expand to in memory: a step's feeds, or the
    /// constants of a graph a client or master sends (`limits.max_request_tensor_bytes`).
    pub max_request_tensor_bytes: u64,
}

/// `[checkpoints]`: where the checkpoint and summary kernels may touch files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointsConfig {
    /// The directories `SaveV2`, `RestoreV2`, `MergeV2Checkpoints` and summary writers may
    /// use (`checkpoints.allowed_dirs`); `None` allows any path, as TensorFlow does.
    pub allowed_dirs: Option<Vec<PathBuf>>,
    /// How this task's operator allows another directory, for a refused path's message;
    /// `None`: the cluster file's key. Set by the program that runs the task (`tessera train`
    /// names its `--checkpoint_dir`), never read from a file or a client.
    pub widen_hint: Option<String>,
}

/// `[data]`: where the input kernels (`tf.data` file sources, `ReadFile`,
/// `InitializeTableFromTextFileV2`) may read. [`DataConfig::read_dirs`] says which
/// directories that is once `[checkpoints]` is known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataConfig {
    /// The directories the input kernels may read (`data.allowed_dirs`), besides the
    /// checkpoint directories; `None`: see [`DataConfig::read_dirs`].
    pub allowed_dirs: Option<Vec<PathBuf>>,
    /// How this task's operator allows another directory, for a refused path's message;
    /// `None`: the cluster file's key. Set by the program that runs the task (`tessera train`
    /// names its `--data`), never read from a file or a client.
    pub widen_hint: Option<String>,
}

impl DataConfig {
    /// The directories the input kernels may read, given the task's `[checkpoints]`: the data
    /// directories and the checkpoint directories together. With neither set, `None`: any
    /// path, as TensorFlow reads. With only `[checkpoints]` set, its directories alone: an
    /// operator who confined what clients may write has not said that they may read anywhere
    /// (`/etc/passwd` through `ReadFile`), so a refusal tells them to add the directory to
    /// `[data] allowed_dirs`.
    pub fn read_dirs(&self, checkpoints: &CheckpointsConfig) -> Option<Vec<PathBuf>> {
        if self.allowed_dirs.is_none() && checkpoints.allowed_dirs.is_none() {
            return None;
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        let both = self.allowed_dirs.iter().chain(&checkpoints.allowed_dirs);
        for dir in both.flatten() {
            if !dirs.contains(dir) {
                dirs.push(dir.clone());
            }
        }
        Some(dirs)
    }
}

/// The keys of `[checkpoints]`.
pub(super) const CHECKPOINT_KEYS: &[&str] = &["allowed_dirs"];

/// The keys of `[data]`.
pub(super) const DATA_KEYS: &[&str] = &["allowed_dirs"];

/// The keys of `[metrics]`.
pub(super) const METRICS_KEYS: &[&str] = &["listen"];

/// The keys of `[limits]`.
pub(super) const LIMIT_KEYS: &[&str] = &[
    "max_message_bytes",
    "max_graph_nodes",
    "max_graph_bytes",
    "max_sessions",
    "max_steps_in_flight",
    "max_shard_bytes",
    "max_request_tensor_bytes",
];

impl Default for Limits {
    fn default() -> Self {
        Self {
            // TensorFlow's own ceiling: protobuf's 2 GiB, as big variables travel in one message.
            max_message_bytes: i32::MAX as usize,
            max_graph_nodes: 1_000_000,
            max_graph_bytes: i32::MAX as usize,
            max_sessions: 1024,
            max_steps_in_flight: 256,
            // 64 GiB: more than a ps host usually has, so only a runaway model meets it.
            max_shard_bytes: 64 << 30,
            // Two of the largest tensors a message may describe.
            max_request_tensor_bytes: 4 << 30,
        }
    }
}

impl Limits {
    /// The RESOURCE_EXHAUSTED answer for a request over the limit at `key` (`max_graph_nodes`,
    /// written `limits.max_graph_nodes` in the message) whose value is `limit`: `what` says what
    /// the request asked for (`"the graph has 12 nodes"`).
    pub fn exceeded(key: &str, limit: impl std::fmt::Display, what: &str) -> Status {
        Status::resource_exhausted(format!(
            "{what}, over limits.{key} = {limit}; stay within it, or raise limits.{key} in the \
             task's [limits] section"
        ))
    }

    /// Refuses `graph` when it has over `max_graph_nodes` nodes, takes over `max_graph_bytes`
    /// serialized or its constants (every tensor attr, functions' included) expand to over
    /// `max_request_tensor_bytes`; `what` names it (`"CreateSession: the graph"`).
    pub fn check_graph(&self, what: &str, graph: &GraphDef) -> crate::Result<()> {
        let nodes = graph.node.len();
        let bytes = prost::Message::encoded_len(graph);
        if nodes > self.max_graph_nodes {
            return Err(Self::exceeded(
                "max_graph_nodes",
                self.max_graph_nodes,
                &format!("{what} has {nodes} nodes"),
            ));
        }
        if bytes > self.max_graph_bytes {
            return Err(Self::exceeded(
                "max_graph_bytes",
                self.max_graph_bytes,
                &format!("{what} is {bytes} bytes"),
            ));
        }
        let functions = graph.library.iter().flat_map(|l| &l.function);
        let all_nodes = graph.node.iter().chain(functions.flat_map(|f| &f.node_def));
        let constants = all_nodes
            .flat_map(|n| n.attr.values())
            .filter_map(|a| match &a.value {
                Some(attr_value::Value::Tensor(t)) => Some(t),
                _ => None,
            });
        self.check_request_tensors(&format!("{what}: its constants"), constants)
    }

    /// Refuses `tensors` (a step's feeds, a graph's constants) when, read into memory, they
    /// would take over `max_request_tensor_bytes` together; `what` names them
    /// (`"RunStep: the feeds"`). Counts declared shapes, before anything is decoded.
    pub fn check_request_tensors<'a>(
        &self,
        what: &str,
        tensors: impl IntoIterator<Item = &'a TensorProto>,
    ) -> crate::Result<()> {
        let mut total = 0u64;
        for tensor in tensors {
            total = total.saturating_add(declared_bytes(tensor));
            if total > self.max_request_tensor_bytes {
                return Err(Self::exceeded(
                    "max_request_tensor_bytes",
                    self.max_request_tensor_bytes,
                    &format!("{what} expand to over {total} bytes in memory"),
                ));
            }
        }
        Ok(())
    }
}

/// `[metrics]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    listen: Option<String>,
}

/// `[checkpoints]` as written: a list in the file, `"a,b"` from the environment.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCheckpoints {
    allowed_dirs: Option<PathList>,
}

/// `[data]` as written: a list in the file, `"a,b"` from the environment.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawData {
    allowed_dirs: Option<PathList>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PathList {
    List(Vec<String>),
    Joined(String),
}

impl PathList {
    /// The directories listed at `key`; an empty entry is refused, `example` and `empty`
    /// saying what to write instead.
    fn validate(
        self,
        key: &str,
        (example, empty): (&str, &str),
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Vec<PathBuf>, ConfigError> {
        let dirs: Vec<String> = match self {
            PathList::List(dirs) => dirs,
            PathList::Joined(text) => text.split(',').map(|d| d.trim().to_string()).collect(),
        };
        let mut allowed = Vec::with_capacity(dirs.len());
        for dir in dirs {
            if dir.is_empty() {
                return Err(invalid(
                    key,
                    format!(
                        "an entry is empty; list directories such as [\"{example}\"], or [] to \
                         {empty}"
                    ),
                ));
            }
            allowed.push(PathBuf::from(dir));
        }
        Ok(allowed)
    }
}

impl RawCheckpoints {
    pub(super) fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<CheckpointsConfig, ConfigError> {
        let allowed_dirs = match self.allowed_dirs {
            None => None,
            Some(list) => Some(list.validate(
                "checkpoints.allowed_dirs",
                ("/var/lib/tessera/ckpt", "refuse every checkpoint path"),
                invalid,
            )?),
        };
        Ok(CheckpointsConfig {
            allowed_dirs,
            widen_hint: None,
        })
    }
}

impl RawData {
    pub(super) fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<DataConfig, ConfigError> {
        let allowed_dirs = match self.allowed_dirs {
            None => None,
            Some(list) => Some(list.validate(
                "data.allowed_dirs",
                (
                    "/var/lib/tessera/data",
                    "read only under the checkpoint directories",
                ),
                invalid,
            )?),
        };
        Ok(DataConfig {
            allowed_dirs,
            widen_hint: None,
        })
    }
}

/// `[limits]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    max_message_bytes: Option<i64>,
    max_graph_nodes: Option<i64>,
    max_graph_bytes: Option<i64>,
    max_sessions: Option<i64>,
    max_steps_in_flight: Option<i64>,
    max_shard_bytes: Option<i64>,
    max_request_tensor_bytes: Option<i64>,
}

impl RawMetrics {
    pub(super) fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<MetricsConfig, ConfigError> {
        let listen = match self.listen {
            None => None,
            Some(text) => Some(text.trim().parse::<SocketAddr>().map_err(|_| {
                invalid(
                    "metrics.listen",
                    format!(
                        "\"{text}\" is not an IP address and port; use e.g. \"127.0.0.1:9100\" \
                         (port 0 lets the OS pick), or remove [metrics] to turn metrics off"
                    ),
                )
            })?),
        };
        Ok(MetricsConfig { listen })
    }
}

impl RawLimits {
    pub(super) fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Limits, ConfigError> {
        let defaults = Limits::default();
        // Every limit is a positive count; zero would refuse every request.
        let positive = |key: &str, value: Option<i64>, default: u64| -> Result<u64, ConfigError> {
            match value {
                None => Ok(default),
                Some(n) if n >= 1 => Ok(n as u64),
                Some(n) => Err(invalid(
                    &format!("limits.{key}"),
                    format!("{n} is not positive; set limits.{key} to 1 or more, or remove it for the default {default}"),
                )),
            }
        };
        let size = |key: &str, value: Option<i64>, default: usize| {
            positive(key, value, default as u64).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        };
        let max_message_bytes = size(
            "max_message_bytes",
            self.max_message_bytes,
            defaults.max_message_bytes,
        )?;
        // tonic and protobuf cannot take a message over 4 GiB; above that the limit means none.
        let max_message_bytes = max_message_bytes.min(u32::MAX as usize);
        Ok(Limits {
            max_message_bytes,
            max_graph_nodes: size(
                "max_graph_nodes",
                self.max_graph_nodes,
                defaults.max_graph_nodes,
            )?,
            max_graph_bytes: size(
                "max_graph_bytes",
                self.max_graph_bytes,
                defaults.max_graph_bytes,
            )?,
            max_sessions: size("max_sessions", self.max_sessions, defaults.max_sessions)?,
            max_steps_in_flight: size(
                "max_steps_in_flight",
                self.max_steps_in_flight,
                defaults.max_steps_in_flight,
            )?,
            max_shard_bytes: positive(
                "max_shard_bytes",
                self.max_shard_bytes,
                defaults.max_shard_bytes,
            )?,
            max_request_tensor_bytes: positive(
                "max_request_tensor_bytes",
                self.max_request_tensor_bytes,
                defaults.max_request_tensor_bytes,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(key: &str, message: String) -> ConfigError {
        ConfigError::InvalidValue {
            at: "test.toml".into(),
            key: key.into(),
            message,
        }
    }

    #[test]
    fn absent_limits_are_the_defaults() {
        let limits = RawLimits::default().validate(&invalid).unwrap();
        assert_eq!(limits, Limits::default());
        assert_eq!(limits.max_message_bytes, 2_147_483_647);
    }

    #[test]
    fn zero_or_negative_limits_are_refused_naming_the_key() {
        let raw = RawLimits {
            max_sessions: Some(0),
            ..Default::default()
        };
        let err = raw.validate(&invalid).unwrap_err().to_string();
        assert!(err.contains("limits.max_sessions"), "{err}");
        assert!(err.contains("0 is not positive"), "{err}");
    }

    #[test]
    fn the_exceeded_message_names_key_value_and_request() {
        let status = Limits::exceeded(
            "max_graph_nodes",
            10,
            "CreateSession: the graph has 12 nodes",
        );
        assert_eq!(status.code(), crate::Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "CreateSession: the graph has 12 nodes, over limits.max_graph_nodes = 10; stay within it, \
             or raise limits.max_graph_nodes in the task's [limits] section"
        );
    }

    #[test]
    fn reads_are_allowed_under_the_data_and_checkpoint_dirs_and_anywhere_when_neither_is_set() {
        let dirs = |names: &[&str]| Some(names.iter().map(PathBuf::from).collect::<Vec<_>>());
        let data = |names: Option<Vec<PathBuf>>| DataConfig {
            allowed_dirs: names,
            widen_hint: None,
        };
        let checkpoints = |names: Option<Vec<PathBuf>>| CheckpointsConfig {
            allowed_dirs: names,
            widen_hint: None,
        };
        assert_eq!(data(None).read_dirs(&checkpoints(None)), None);
        // Only checkpoints set: reads stay under them rather than anywhere.
        assert_eq!(
            data(None).read_dirs(&checkpoints(dirs(&["/ckpt"]))),
            dirs(&["/ckpt"])
        );
        assert_eq!(data(dirs(&[])).read_dirs(&checkpoints(None)), dirs(&[]));
        assert_eq!(
            data(dirs(&["/data", "/ckpt"])).read_dirs(&checkpoints(dirs(&["/ckpt", "/c2"]))),
            dirs(&["/data", "/ckpt", "/c2"])
        );
    }

    #[test]
    fn an_empty_data_dir_is_refused_naming_the_key() {
        let raw = RawData {
            allowed_dirs: Some(PathList::Joined("/data/a,,".into())),
        };
        let err = raw.validate(&invalid).unwrap_err().to_string();
        assert!(err.contains("data.allowed_dirs"), "{err}");
        assert!(err.contains("an entry is empty"), "{err}");
    }

    #[test]
    fn a_bad_metrics_address_is_refused() {
        let raw = RawMetrics {
            listen: Some("localhost:9100".into()),
        };
        let err = raw.validate(&invalid).unwrap_err().to_string();
        assert!(err.contains("metrics.listen"), "{err}");
        let ok = RawMetrics {
            listen: Some("127.0.0.1:0".into()),
        };
        assert_eq!(
            ok.validate(&invalid).unwrap().listen,
            Some("127.0.0.1:0".parse().unwrap())
        );
    }
}
