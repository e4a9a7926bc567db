//! The `[tls]` and `[auth]` sections of a cluster file, checked into a [`Security`].
//!
//! ```toml
//! [tls]
//! cert = "/etc/tessera/tls/ps0.pem"     # this task's certificate chain (PEM)
//! key = "/etc/tessera/tls/ps0.key"      # its private key (PEM)
//! ca = "/etc/tessera/tls/ca.pem"        # the CA that signs every task's certificate
//! require_client_cert = true            # mTLS (default): refuse callers the CA did not sign
//! server_name = "tessera.internal"      # optional: the name peers' certificates must carry
//!
//! [auth]
//! token_file = "/etc/tessera/token"     # the shared cluster token (never the token itself)
//! ```
//!
//! The files are read and checked here, at load, so `tessera validate` and a starting daemon
//! name the key and the file that is wrong (`cluster.toml: tls.key: /etc/...: does not go with
//! the certificate ...`), instead of failing at the first handshake with a peer. A task is
//! both a server and a client of its peers, so `[tls]` needs all three files.

use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;
use crate::security::{ClusterToken, Security, SecurityFile, TlsConfig};

/// `[tls]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
    require_client_cert: Option<bool>,
    server_name: Option<String>,
}

/// `[auth]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    token_file: Option<String>,
}

/// Checks `[tls]` (when present) and `[auth]`, reading every file they name. `invalid` makes
/// the error for a key, naming the file or variable it came from.
pub(super) fn validate_security(
    tls: Option<RawTls>,
    auth: RawAuth,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Security, ConfigError> {
    let tls = match tls {
        None => None,
        Some(raw) => Some(raw.validate(invalid)?),
    };
    let token = match auth.token_file {
        None => None,
        Some(path) => {
            let path = non_empty_path("auth.token_file", path, invalid)?;
            let token = ClusterToken::from_file(&path)
                .map_err(|e| invalid("auth.token_file", e.to_string()))?;
            Some(token)
        }
    };
    Ok(Security { tls, token })
}

impl RawTls {
    fn validate(
        self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<TlsConfig, ConfigError> {
        let required = |key: &str, value: Option<String>| match value {
            Some(path) => non_empty_path(key, path, invalid),
            None => Err(invalid(
                key,
                format!(
                    "missing; a task with [tls] serves TLS and dials its peers with it, so it \
                     needs its certificate, its key and the cluster's CA: set {key} (with \
                     tls.cert, tls.key and tls.ca), or remove [tls] for plain text"
                ),
            )),
        };
        let cert = required("tls.cert", self.cert)?;
        let key = required("tls.key", self.key)?;
        let ca = required("tls.ca", self.ca)?;
        let mut config = TlsConfig::from_files(&cert, &key, &ca).map_err(|e| {
            let key_name = match e.file() {
                SecurityFile::Certificate => "tls.cert",
                SecurityFile::PrivateKey => "tls.key",
                SecurityFile::Ca | SecurityFile::Token => "tls.ca",
            };
            invalid(key_name, e.to_string())
        })?;
        config = config.require_client_cert(self.require_client_cert.unwrap_or(true));
        if let Some(name) = self.server_name {
            let name = name.trim();
            if name.is_empty() {
                return Err(invalid(
                    "tls.server_name",
                    "is empty; give the DNS name the tasks' certificates carry, or remove the \
                     key to check each peer against the host it is dialled at"
                        .into(),
                ));
            }
            config = config.server_name(name);
        }
        Ok(config)
    }
}

fn non_empty_path(
    key: &str,
    path: String,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<PathBuf, ConfigError> {
    if path.trim().is_empty() {
        return Err(invalid(
            key,
            format!("is empty; set {key} to a file path (absolute paths are safest: relative ones are read from the daemon's working directory)"),
        ));
    }
    Ok(PathBuf::from(path))
}
