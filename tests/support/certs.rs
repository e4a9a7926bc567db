//! Certificates made at test time (rcgen): a CA, and leaf certificates it signs for loopback
//! (`localhost` and `127.0.0.1`), usable both to serve and as a client certificate. Files go
//! to a temporary directory that lives as long as the [`Pki`].

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tessera::security::TlsConfig;

/// A certificate authority and the directory its files are written to.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    name: String,
    dir: tempfile::TempDir,
    /// The CA certificate file (PEM).
    pub ca: PathBuf,
}

/// A leaf certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// A new CA whose subject is `name`, its certificate written to `<dir>/<name>-ca.pem`.
    pub fn new(name: &str) -> Pki {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-signed CA");
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let ca = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca, cert.pem()).expect("write the CA certificate");
        Pki {
            issuer: Issuer::new(params, key),
            name: name.to_string(),
            dir,
            ca,
        }
    }

    /// A certificate for `localhost` and `127.0.0.1`, signed by this CA, for both server and
    /// client use; written as `<dir>/<leaf>.pem` and `<dir>/<leaf>.key`.
    pub fn leaf(&self, leaf: &str) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{leaf} ({})", self.name));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).expect("signed leaf");
        let files = Leaf {
            cert: self.dir.path().join(format!("{leaf}.pem")),
            key: self.dir.path().join(format!("{leaf}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write the leaf certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write the leaf key");
        files
    }

    /// Returns the directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `[tls]` section of a cluster file for a task holding `leaf`.
    pub fn tls_section(&self, leaf: &Leaf) -> String {
        format!(
            "\n[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n",
            leaf.cert.display(),
            leaf.key.display(),
            self.ca.display()
        )
    }

    /// Client settings trusting this CA and showing `leaf` (no certificate when `None`).
    pub fn client(&self, leaf: Option<&Leaf>) -> TlsConfig {
        let tls = TlsConfig::new(&self.ca).expect("CA file loads");
        match leaf {
            Some(leaf) => tls
                .with_identity(&leaf.cert, &leaf.key)
                .expect("leaf files load"),
            None => tls,
        }
    }
}
