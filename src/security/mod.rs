//! How a task protects its RPCs: TLS (or mutual TLS) on the wire, and the cluster token on
//! every call. Plain text without a token is the default, as in TensorFlow.
//!
//! ```text
//!  cluster file [tls] cert/key/ca ──► TlsConfig ──► server: tonic ServerTlsConfig (mTLS: the CA
//!              [auth] token_file ──► ClusterToken     roots client certificates)
//!                                        │          clients: ClientTlsConfig (the CA is the only
//!                                        ▼            root) on every Endpoint
//!   server: Authenticator in front of MasterService and WorkerService (health stays open)
//!   client: AttachToken on every channel (peers, remote sessions, `tessera status`)
//! ```
//!
//! [`Security`] is the pair a task holds in its `TaskConfig`
//! and a client in its `ConnectOptions`; everything that opens a channel goes through
//! [`Security::endpoint`] and [`Security::attach`], and the server through
//! [`Security::server_tls`] and [`Security::guard`], so no channel can forget either half.

mod tls;
mod token;

pub use tls::TlsConfig;
pub use token::{
    AttachToken, Authenticator, ClusterToken, Refusal, AUTHORIZATION, MIN_TOKEN_CHARS,
};

use std::path::PathBuf;
use std::time::Duration;

use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, ServerTlsConfig};

use crate::error::{error_chain, Code, Result, Status};

/// A channel that sends the cluster token (if any) on every call.
pub type AuthChannel = InterceptedService<Channel, AttachToken>;

/// The files TLS and the token are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityFile {
    /// This side's certificate chain (`tls.cert`).
    Certificate,
    /// Its private key (`tls.key`).
    PrivateKey,
    /// The cluster's CA certificate (`tls.ca`).
    Ca,
    /// The cluster token (`auth.token_file`).
    Token,
}

impl std::fmt::Display for SecurityFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SecurityFile::Certificate => "certificate file",
            SecurityFile::PrivateKey => "private key file",
            SecurityFile::Ca => "CA certificate file",
            SecurityFile::Token => "token file",
        })
    }
}

/// Why TLS or token material was refused; names the file.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The file cannot be read.
    #[error("{}: cannot read the {what}: {error}; check the path and its permissions", path.display())]
    Read {
        /// Which file it is.
        what: SecurityFile,
        /// The file as given.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        error: std::io::Error,
    },
    /// The file was read but does not hold what it should.
    #[error("{}: {problem}", path.display())]
    Content {
        /// Which file it is.
        what: SecurityFile,
        /// The file as given.
        path: PathBuf,
        /// What is wrong and what to change.
        problem: String,
    },
}

impl SecurityError {
    /// Returns which file is at fault.
    pub fn file(&self) -> SecurityFile {
        match self {
            SecurityError::Read { what, .. } | SecurityError::Content { what, .. } => *what,
        }
    }

    /// Returns the status code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            SecurityError::Read { error, .. } => match error.kind() {
                std::io::ErrorKind::NotFound => Code::NotFound,
                std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
                _ => Code::FailedPrecondition,
            },
            SecurityError::Content { .. } => Code::InvalidArgument,
        }
    }
}

impl From<SecurityError> for Status {
    fn from(e: SecurityError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

/// TLS and the cluster token of a task or client; both off by default.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// TLS material; `None` speaks plain text.
    pub tls: Option<TlsConfig>,
    /// The cluster token; `None` sends none and (in a server) checks none.
    pub token: Option<ClusterToken>,
}

impl Security {
    /// Plain text, no token.
    pub fn plain() -> Self {
        Self::default()
    }

    /// Returns whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Returns the URI scheme of this side's connections: `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.is_tls() {
            "https"
        } else {
            "http"
        }
    }

    /// An endpoint for `host:port` with TLS when configured (checking the peer's certificate
    /// against the CA, and showing ours when we have one). An address that already names a
    /// scheme must name this side's (`https://` only with TLS).
    ///
    /// Fails with INVALID_ARGUMENT naming the address when it is not a valid URI authority or
    /// its scheme disagrees.
    pub fn endpoint(&self, address: &str) -> Result<Endpoint> {
        let host_port = match address.split_once("://") {
            None => address,
            Some((scheme, rest)) if scheme == self.scheme() => rest,
            Some((scheme, _)) => {
                let fix = if self.is_tls() {
                    "this side speaks TLS; give host:port or https://host:port"
                } else {
                    "this side speaks plain text; give host:port, or configure TLS ([tls] in \
                     the cluster file, ConnectOptions::tls) to dial https://"
                };
                return Err(Status::invalid_argument(format!(
                    "address `{address}` has scheme {scheme}://; {fix}"
                )));
            }
        };
        let uri = format!("{}://{host_port}", self.scheme());
        let endpoint = Endpoint::from_shared(uri).map_err(|e| {
            Status::invalid_argument(format!(
                "address `{address}` is not a valid host:port ({e})"
            ))
        })?;
        match &self.tls {
            None => Ok(endpoint),
            Some(tls) => endpoint.tls_config(tls.client()).map_err(|e| {
                Status::invalid_argument(format!(
                    "cannot set up TLS to `{address}` with the CA {}: {}",
                    tls.ca_path().display(),
                    error_chain(&e)
                ))
            }),
        }
    }

    /// Wraps a channel so that every call through it carries the cluster token.
    pub fn attach(&self, channel: Channel) -> AuthChannel {
        InterceptedService::new(channel, AttachToken::new(self.token.clone()))
    }

    /// tonic's server TLS settings, `None` for plain text; a TLS handshake must finish within
    /// `handshake_timeout`.
    pub fn server_tls(&self, handshake_timeout: Duration) -> Result<Option<ServerTlsConfig>> {
        self.tls
            .as_ref()
            .map(|tls| tls.server(handshake_timeout))
            .transpose()
    }

    /// Puts the token check in front of `service` (MasterService, WorkerService); without a
    /// token every call passes.
    pub fn guard<S: NamedService>(&self, service: S) -> InterceptedService<S, Authenticator> {
        let name = S::NAME.rsplit('.').next().unwrap_or(S::NAME);
        InterceptedService::new(service, Authenticator::new(self.token.clone(), name))
    }

    /// A hint for a connection that failed, for the message a person reads: a plain-text
    /// client that hit a TLS task (or the reverse) sees only a broken connection.
    pub fn connect_hint(&self) -> &'static str {
        if self.is_tls() {
            "if the task serves plain text, drop the TLS settings; if it serves TLS, check \
             that its certificate is signed by the CA given here and names the host dialled, \
             and (for mutual TLS) that this side's certificate is signed by the task's CA"
        } else {
            "if the task serves TLS, connect with TLS (a grpcs:// target with \
             ConnectOptions::tls, or the [tls] section of the cluster file)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_endpoints_use_http_and_refuse_https() {
        let plain = Security::plain();
        assert_eq!(
            plain.endpoint("h:1").unwrap().uri().to_string(),
            "http://h:1/"
        );
        assert_eq!(
            plain.endpoint("http://h:1").unwrap().uri().to_string(),
            "http://h:1/"
        );
        let err = plain.endpoint("https://h:1").unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("`https://h:1`"), "{err}");
        assert!(err.message().contains("configure TLS"), "{err}");
    }

    #[test]
    fn a_bad_address_is_named() {
        let err = Security::plain().endpoint("h:x y").unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("`h:x y`"), "{err}");
    }

    #[test]
    fn a_missing_file_maps_to_not_found() {
        let err = TlsConfig::new("/nonexistent/ca.pem").unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert!(
            err.to_string()
                .starts_with("/nonexistent/ca.pem: cannot read the CA certificate file"),
            "{err}"
        );
    }
}
