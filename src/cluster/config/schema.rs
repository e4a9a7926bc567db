//! The keys a cluster file may have and the type each must have.
//!
//! [`check_schema`] runs on the merged value tree (file, then environment) before serde sees
//! it. It refuses unknown keys and values of the wrong type itself, for two reasons: the
//! message can say whether the key came from the file or from a variable and list the keys that
//! are allowed, and the `config` crate would otherwise coerce (`1.5` and `true` both pass as
//! integers, rounded and as 1).

use super::file::Sources;
use super::ops::{CHECKPOINT_KEYS, DATA_KEYS, LIMIT_KEYS, METRICS_KEYS};
use super::ConfigError;

pub(super) const TOP_KEYS: &[&str] = &[
    "cluster",
    "task",
    "devices",
    "timeouts",
    "metrics",
    "limits",
    "checkpoints",
    "data",
    "tls",
    "auth",
];
pub(super) const TASK_KEYS: &[&str] = &["job", "index", "listen"];
pub(super) const DEVICE_KEYS: &[&str] = &[
    "cpu",
    "gpu",
    "gpu_memory_fraction",
    "allow_growth",
    "visible_gpus",
    "soft_placement",
    "cpu_memory_limit",
    "intra_op_threads",
];
pub(super) const TIMEOUT_KEYS: &[&str] = &[
    "connect",
    "rpc",
    "create_session",
    "shutdown_grace",
    "startup",
];
pub(super) const TLS_KEYS: &[&str] = &["cert", "key", "ca", "require_client_cert", "server_name"];
pub(super) const AUTH_KEYS: &[&str] = &["token_file"];

/// The type a key of `[task]`, `[devices]`, `[timeouts]`, `[tls]` or `[auth]` must have.
#[derive(Clone, Copy)]
enum Kind {
    Text,
    Integer,
    Number,
    Bool,
    Duration,
    GpuIds,
    Paths,
}

impl Kind {
    /// Returns the kind of `section.key`, or `None` for a key the schema does not have.
    fn of(section: &str, key: &str) -> Option<Self> {
        Some(match (section, key) {
            ("task", "job" | "listen") => Kind::Text,
            ("task", "index")
            | ("devices", "cpu" | "gpu" | "cpu_memory_limit" | "intra_op_threads") => Kind::Integer,
            ("devices", "gpu_memory_fraction") => Kind::Number,
            ("devices", "allow_growth" | "soft_placement") => Kind::Bool,
            ("devices", "visible_gpus") => Kind::GpuIds,
            ("timeouts", _) if TIMEOUT_KEYS.contains(&key) => Kind::Duration,
            ("metrics", "listen") => Kind::Text,
            ("limits", _) if LIMIT_KEYS.contains(&key) => Kind::Integer,
            ("tls", "cert" | "key" | "ca" | "server_name") | ("auth", "token_file") => Kind::Text,
            ("tls", "require_client_cert") => Kind::Bool,
            ("checkpoints" | "data", "allowed_dirs") => Kind::Paths,
            _ => return None,
        })
    }

    fn accepts(self, value: &config::ValueKind) -> bool {
        use config::ValueKind as V;
        match (self, value) {
            (Kind::Text | Kind::Duration, V::String(_)) => true,
            (Kind::Integer, V::I64(_)) => true,
            (Kind::Number, V::I64(_) | V::Float(_)) => true,
            (Kind::Bool, V::Boolean(_)) => true,
            // A list in the file, one id or "0,1" from the environment.
            (Kind::GpuIds, V::I64(_) | V::String(_)) => true,
            (Kind::GpuIds, V::Array(ids)) => ids.iter().all(|id| matches!(id.kind, V::I64(_))),
            // A list in the file, "a,b" from the environment.
            (Kind::Paths, V::String(_)) => true,
            (Kind::Paths, V::Array(dirs)) => dirs.iter().all(|d| matches!(d.kind, V::String(_))),
            _ => false,
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Kind::Text => "a string",
            Kind::Integer => "an integer",
            Kind::Number => "a number",
            Kind::Bool => "true or false",
            Kind::Duration => "a duration string such as \"10s\"",
            Kind::GpuIds => "a list of GPU ids such as [0, 1]",
            Kind::Paths => "a list of directories such as [\"/var/lib/tessera/ckpt\"]",
        }
    }
}

/// Describes a value for a message: `string "x"`, `integer 3`, `a list`.
pub(super) fn describe(value: &config::ValueKind) -> String {
    use config::ValueKind as V;
    match value {
        V::Nil => "nothing".into(),
        V::Boolean(b) => format!("boolean {b}"),
        V::I64(n) => format!("integer {n}"),
        V::I128(n) => format!("integer {n}"),
        V::U64(n) => format!("integer {n}"),
        V::U128(n) => format!("integer {n}"),
        V::Float(f) => format!("number {f}"),
        V::String(text) => format!("string {text:?}"),
        V::Table(_) => "a table".into(),
        V::Array(_) => "a list".into(),
    }
}

/// Refuses keys the schema does not have and values of the wrong type, naming the key, where
/// it came from and what is allowed. The `config` crate would coerce instead (`1.5` and `true`
/// both pass as integers), and serde's messages cannot say which source a key came from.
pub(super) fn check_schema(root: &config::Value, sources: &Sources) -> Result<(), ConfigError> {
    let config::ValueKind::Table(top) = &root.kind else {
        return Ok(());
    };
    let unknown = |key: String, origin: Option<&str>, scope: &str, allowed: &[&str]| {
        ConfigError::UnknownKey {
            at: sources.at_origin(origin, &key),
            key,
            scope: scope.to_owned(),
            allowed: allowed.join(", "),
        }
    };
    for name in sorted_keys(top) {
        let value = &top[name];
        let allowed = match name.as_str() {
            "task" => TASK_KEYS,
            "devices" => DEVICE_KEYS,
            "timeouts" => TIMEOUT_KEYS,
            "metrics" => METRICS_KEYS,
            "limits" => LIMIT_KEYS,
            "checkpoints" => CHECKPOINT_KEYS,
            "data" => DATA_KEYS,
            "tls" => TLS_KEYS,
            "auth" => AUTH_KEYS,
            "cluster" => continue,
            _ => {
                return Err(unknown(
                    name.clone(),
                    value.origin(),
                    "at the top level",
                    TOP_KEYS,
                ))
            }
        };
        let config::ValueKind::Table(section) = &value.kind else {
            return Err(ConfigError::InvalidValue {
                at: sources.at_origin(value.origin(), name),
                key: name.clone(),
                message: format!(
                    "expected a [{name}] table, found {}; write [{name}] with its keys",
                    describe(&value.kind)
                ),
            });
        };
        for key in sorted_keys(section) {
            let entry = &section[key];
            let full = format!("{name}.{key}");
            let Some(kind) = Kind::of(name, key) else {
                let scope = format!("in [{name}]");
                return Err(unknown(full, entry.origin(), &scope, allowed));
            };
            if !kind.accepts(&entry.kind) {
                return Err(ConfigError::InvalidValue {
                    at: sources.at_origin(entry.origin(), &full),
                    message: format!(
                        "expected {}, found {}; set {full} to {}",
                        kind.expected(),
                        describe(&entry.kind),
                        kind.expected()
                    ),
                    key: full,
                });
            }
        }
    }
    Ok(())
}

pub(super) fn sorted_keys(table: &config::Map<String, config::Value>) -> Vec<&String> {
    let mut keys: Vec<&String> = table.keys().collect();
    keys.sort();
    keys
}
