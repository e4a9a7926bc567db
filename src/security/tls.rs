//! [`TlsConfig`]: a task's TLS material (its certificate and key, the cluster's CA), read and
//! checked once, then turned into tonic's server and client TLS settings.
//!
//! The CA is what makes a cluster: every task's certificate is signed by it, every task checks
//! the certificate of the task it dials against it, and with `require_client_cert` (mTLS, the
//! default) a task also refuses callers whose certificate it did not sign. A client that only
//! needs to reach a server-only TLS task (`tessera status`, a training program) gives just the
//! CA.
//!
//! Everything is checked when the files are read, so that a bad path or a key that belongs to
//! another certificate stops the daemon at start with the file named, and not at the first
//! handshake with a peer: each file must be PEM with the blocks it should have, the key must
//! be the certificate's, and the CA must hold at least one usable certificate. The checks run
//! the same rustls code the server later uses (through tonic), so what passes here serves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use super::{SecurityError, SecurityFile};
use crate::error::error_chain;

/// The TLS material of a task or client: the CA that signs the cluster's certificates, and
/// (to serve, or to dial an mTLS task) a certificate and its key. Cheap to clone; `Debug` shows
/// the paths only.
#[derive(Clone)]
pub struct TlsConfig {
    ca: Arc<PemFile>,
    identity: Option<Arc<(PemFile, PemFile)>>,
    require_client_cert: bool,
    server_name: Option<String>,
}

/// A PEM file as read, with its path for messages.
struct PemFile {
    path: PathBuf,
    pem: Vec<u8>,
}

impl TlsConfig {
    /// Reads the CA certificate file (PEM, one or more certificates): enough for a client of a
    /// task that does not ask for client certificates. Fails naming the file when it cannot be
    /// read or holds no certificate.
    pub fn new(ca: impl AsRef<Path>) -> Result<Self, SecurityError> {
        let ca = read(ca.as_ref(), SecurityFile::Ca)?;
        check_certificates(&ca, SecurityFile::Ca)?;
        let config = Self {
            ca: Arc::new(ca),
            identity: None,
            require_client_cert: true,
            server_name: None,
        };
        config.check_ca()?;
        Ok(config)
    }

    /// Reads a task's three files, in the order a person lists them: its certificate chain,
    /// its private key, then the CA. The first file that cannot be read or does not hold what
    /// it should is named in the error.
    pub fn from_files(
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        ca: impl AsRef<Path>,
    ) -> Result<Self, SecurityError> {
        let identity = load_identity(cert.as_ref(), key.as_ref())?;
        let mut config = Self::new(ca)?;
        config.identity = Some(Arc::new(identity));
        Ok(config)
    }

    /// Reads this side's certificate chain and private key (PEM): needed to serve, and to dial
    /// a task that requires client certificates. Fails naming the file that cannot be read,
    /// holds no certificate or key, or whose key is not the certificate's.
    pub fn with_identity(
        mut self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, SecurityError> {
        self.identity = Some(Arc::new(load_identity(cert.as_ref(), key.as_ref())?));
        Ok(self)
    }

    /// Whether a server with this configuration refuses callers without a certificate signed
    /// by the CA (mutual TLS). True unless set otherwise.
    pub fn require_client_cert(mut self, require: bool) -> Self {
        self.require_client_cert = require;
        self
    }

    /// Checks peers' certificates against `name` instead of the host of the address dialled
    /// (for clusters whose certificates name a service, while the cluster file lists IPs).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Whether `other` holds the same CA and the same certificate and key (or neither): a
    /// client holding a task's own settings passes that task's handshake both ways.
    pub fn same_material(&self, other: &TlsConfig) -> bool {
        let identity = |c: &TlsConfig| {
            c.identity
                .as_ref()
                .map(|pair| (pair.0.pem.clone(), pair.1.pem.clone()))
        };
        self.ca.pem == other.ca.pem && identity(self) == identity(other)
    }

    /// Returns whether a server refuses callers without a certificate signed by the CA.
    pub fn requires_client_cert(&self) -> bool {
        self.require_client_cert
    }

    /// Returns whether this side has a certificate and key of its own.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// Returns the CA file's path.
    pub fn ca_path(&self) -> &Path {
        &self.ca.path
    }

    /// tonic's server settings: this side's identity, and the CA as the root of client
    /// certificates (required, or optional when `require_client_cert` is off). The handshake
    /// must finish within `handshake_timeout`, so a silent caller cannot hold a connection.
    ///
    /// Fails with FAILED_PRECONDITION when there is no certificate and key to serve with.
    pub fn server(&self, handshake_timeout: Duration) -> crate::Result<ServerTlsConfig> {
        let Some(identity) = &self.identity else {
            return Err(crate::Status::failed_precondition(format!(
                "TLS with the CA {} has no certificate and key to serve with; set tls.cert and \
                 tls.key",
                self.ca.path.display()
            )));
        };
        let (cert, key) = &**identity;
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(&cert.pem, &key.pem))
            .client_ca_root(Certificate::from_pem(&self.ca.pem))
            .client_auth_optional(!self.require_client_cert)
            .timeout(handshake_timeout))
    }

    /// tonic's client settings: the CA as the only root, this side's identity when it has one,
    /// and the server name to check when one was set (else the host dialled).
    pub fn client(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca.pem));
        if let Some(identity) = &self.identity {
            let (cert, key) = &**identity;
            config = config.identity(Identity::from_pem(&cert.pem, &key.pem));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }

    /// Checks every certificate of the CA file is one rustls can use as a root; tonic's
    /// client would skip an unusable one silently and every handshake would then fail with an
    /// unknown issuer.
    fn check_ca(&self) -> Result<(), SecurityError> {
        for (i, cert) in CertificateDer::pem_slice_iter(&self.ca.pem).enumerate() {
            let cert = cert.map_err(|e| SecurityError::Content {
                what: SecurityFile::Ca,
                path: self.ca.path.clone(),
                problem: format!("is not a valid PEM certificate file ({e})"),
            })?;
            if let Err(e) = webpki::anchor_from_trusted_cert(&cert) {
                return Err(SecurityError::Content {
                    what: SecurityFile::Ca,
                    path: self.ca.path.clone(),
                    problem: format!(
                        "certificate {} is not an X.509 certificate a CA can be made of ({e}); \
                         give the PEM certificate of the cluster's CA",
                        i + 1
                    ),
                });
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let identity = self.identity.as_ref().map(|pair| {
            (
                pair.0.path.display().to_string(),
                pair.1.path.display().to_string(),
            )
        });
        f.debug_struct("TlsConfig")
            .field("ca", &self.ca.path)
            .field("cert_and_key", &identity)
            .field("require_client_cert", &self.require_client_cert)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Reads and checks a certificate chain and its private key.
fn load_identity(cert: &Path, key: &Path) -> Result<(PemFile, PemFile), SecurityError> {
    let cert = read(cert, SecurityFile::Certificate)?;
    check_certificates(&cert, SecurityFile::Certificate)?;
    let key = read(key, SecurityFile::PrivateKey)?;
    if let Err(e) = PrivateKeyDer::from_pem_slice(&key.pem) {
        let problem = match e {
            pem::Error::NoItemsFound => "holds no private key (no -----BEGIN PRIVATE KEY----- \
                                             block, nor an RSA or EC one); give the PEM key of the \
                                             certificate"
                .to_string(),
            other => format!("is not a valid PEM private key ({other})"),
        };
        return Err(SecurityError::Content {
            what: SecurityFile::PrivateKey,
            path: key.path,
            problem,
        });
    }
    // rustls checks that the key's public half is the certificate's; tonic runs it while
    // building a server's acceptor, which touches no socket.
    let identity = Identity::from_pem(&cert.pem, &key.pem);
    let probe = ServerTlsConfig::new().identity(identity);
    if let Err(e) = tonic::transport::Server::builder().tls_config(probe) {
        return Err(SecurityError::Content {
            what: SecurityFile::PrivateKey,
            problem: format!(
                "does not go with the certificate {} ({}); give the key the certificate \
                     was issued for",
                cert.path.display(),
                error_chain(&e)
            ),
            path: key.path,
        });
    }
    Ok((cert, key))
}

/// Reads a whole file, naming it (and what it should be) when that fails.
fn read(path: &Path, what: SecurityFile) -> Result<PemFile, SecurityError> {
    match std::fs::read(path) {
        Ok(pem) => Ok(PemFile {
            path: path.to_owned(),
            pem,
        }),
        Err(error) => Err(SecurityError::Read {
            what,
            path: path.to_owned(),
            error,
        }),
    }
}

/// Checks a file is PEM holding at least one certificate.
fn check_certificates(file: &PemFile, what: SecurityFile) -> Result<(), SecurityError> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&file.pem) {
        cert.map_err(|e| SecurityError::Content {
            what,
            path: file.path.clone(),
            problem: format!("is not a valid PEM {what} ({e})"),
        })?;
        count += 1;
    }
    if count == 0 {
        return Err(SecurityError::Content {
            what,
            path: file.path.clone(),
            problem: format!(
                "holds no certificate (no -----BEGIN CERTIFICATE----- block); give a PEM {what}"
            ),
        });
    }
    Ok(())
}
