//! The cluster token: one shared secret every task and client of a cluster holds, sent on
//! every call as `authorization: Bearer <token>` and checked by every server.
//!
//! Two interceptors carry it: [`AttachToken`] on the client side of every channel (peers,
//! remote sessions, `tessera status`), and [`Authenticator`] in front of MasterService and
//! WorkerService. The health service is left without one, so load balancers and systemd
//! probes need no secret.
//!
//! The token never reaches a log or a message: [`ClusterToken`] has no `Display`, its `Debug`
//! prints `<redacted>`, and refusals say only whether a token was missing or wrong. The server
//! compares in constant time (`subtle`), so the time a refusal takes says nothing about how
//! many leading bytes were right.

use std::path::Path;
use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tracing::warn;

use super::{SecurityError, SecurityFile};

/// The metadata key the token travels under.
pub const AUTHORIZATION: &str = "authorization";

/// What precedes the token in the `authorization` value.
const BEARER: &str = "Bearer ";

/// Fewer characters than this cannot be a random secret.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The cluster's shared secret. Cheap to clone; `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterToken {
    /// `Bearer <token>`, ready to send.
    header: AsciiMetadataValue,
    /// The token's bytes, for the comparison.
    secret: Arc<[u8]>,
}

impl ClusterToken {
    /// Reads the token from `path`: the file's text without surrounding whitespace (a final
    /// newline is common). Fails naming the file when it cannot be read or the token is not
    /// usable (see [`ClusterToken::new`]); the message never contains the token.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SecurityError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|error| SecurityError::Read {
            what: SecurityFile::Token,
            path: path.to_owned(),
            error,
        })?;
        let text = String::from_utf8(bytes).map_err(|_| SecurityError::Content {
            what: SecurityFile::Token,
            path: path.to_owned(),
            problem: "is not text; write the token as printable ASCII, e.g. the output of \
                      `openssl rand -hex 32`"
                .into(),
        })?;
        Self::new(text.trim()).map_err(|problem| SecurityError::Content {
            what: SecurityFile::Token,
            path: path.to_owned(),
            problem,
        })
    }

    /// A token from its text: at least [`MIN_TOKEN_CHARS`] printable ASCII characters without
    /// spaces (it travels in an HTTP/2 header). The error says what is wrong, not the token.
    pub fn new(token: &str) -> Result<Self, String> {
        let fix = "use a random token such as the output of `openssl rand -hex 32`";
        if token.is_empty() {
            return Err(format!("holds no token; {fix}"));
        }
        if let Some(i) = token.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(format!(
                "token has a space, control or non-ASCII character at byte {i}; {fix}"
            ));
        }
        if token.len() < MIN_TOKEN_CHARS {
            return Err(format!(
                "token has {} characters, fewer than {MIN_TOKEN_CHARS}; {fix}",
                token.len()
            ));
        }
        let header = format!("{BEARER}{token}")
            .parse::<AsciiMetadataValue>()
            .map_err(|_| format!("token is not a valid header value; {fix}"))?;
        let mut header = header;
        // HPACK keeps sensitive values out of its shared compression table.
        header.set_sensitive(true);
        Ok(Self {
            header,
            secret: token.as_bytes().into(),
        })
    }

    /// The token's bytes, for protocols that carry it outside an HTTP/2 header (the tensor
    /// channel's hello).
    pub(crate) fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// Whether `presented` is this token, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.secret.as_ref().ct_eq(presented))
    }

    /// Checks a call's metadata carries this token.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Refusal> {
        let Some(value) = metadata.get(AUTHORIZATION) else {
            return Err(Refusal::Missing);
        };
        let value = value.as_bytes();
        let presented = match value.get(..BEARER.len()) {
            Some(scheme) if scheme.eq_ignore_ascii_case(BEARER.as_bytes()) => {
                &value[BEARER.len()..]
            }
            _ => return Err(Refusal::NotBearer),
        };
        if self.matches(presented) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(<redacted>)")
    }
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization` metadata.
    Missing,
    /// `authorization` is not `Bearer <token>`.
    NotBearer,
    /// A bearer token that is not the cluster's.
    Wrong,
}

impl Refusal {
    /// A short reason, for the log.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Missing => "no token",
            Refusal::NotBearer => "authorization is not a bearer token",
            Refusal::Wrong => "wrong token",
        }
    }
}

/// The server side: refuses calls without the cluster token with UNAUTHENTICATED and logs the
/// caller's address. Without a token configured, every call passes.
#[derive(Clone, Debug)]
pub struct Authenticator {
    token: Option<ClusterToken>,
    /// The service it guards, for the log.
    service: &'static str,
}

impl Authenticator {
    /// Guards `service` (named in logs) with `token`; `None` lets every call through.
    pub fn new(token: Option<ClusterToken>, service: &'static str) -> Self {
        Self { token, service }
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        match token.check(request.metadata()) {
            Ok(()) => Ok(request),
            Err(refusal) => {
                let peer = request
                    .remote_addr()
                    .map_or_else(|| "unknown".to_string(), |a| a.to_string());
                warn!(
                    peer = %peer,
                    service = self.service,
                    reason = refusal.reason(),
                    "refused an unauthenticated call"
                );
                let what = match refusal {
                    Refusal::Missing => "carried no cluster token",
                    Refusal::NotBearer => "carried an authorization that is not a bearer token",
                    Refusal::Wrong => "carried a wrong cluster token",
                };
                Err(tonic::Status::unauthenticated(format!(
                    "{} requires the cluster token and the call {what}; give the client the \
                     cluster's token file (auth.token_file, ConnectOptions::token or \
                     --token-file)",
                    self.service
                )))
            }
        }
    }
}

/// The client side: adds the cluster token to every call made through the channel it wraps;
/// without a token it adds nothing.
#[derive(Clone, Debug, Default)]
pub struct AttachToken {
    token: Option<ClusterToken>,
}

impl AttachToken {
    /// Sends `token` on every call; `None` sends none.
    pub fn new(token: Option<ClusterToken>) -> Self {
        Self { token }
    }
}

impl Interceptor for AttachToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, token.header.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    fn metadata(value: &str) -> MetadataMap {
        let mut map = MetadataMap::new();
        map.insert(AUTHORIZATION, value.parse().unwrap());
        map
    }

    #[test]
    fn the_right_bearer_token_passes_and_others_are_told_apart() {
        let token = ClusterToken::new(TOKEN).unwrap();
        assert_eq!(token.check(&metadata(&format!("Bearer {TOKEN}"))), Ok(()));
        // RFC 7235: the scheme is case-insensitive.
        assert_eq!(token.check(&metadata(&format!("bearer {TOKEN}"))), Ok(()));
        assert_eq!(token.check(&MetadataMap::new()), Err(Refusal::Missing));
        assert_eq!(
            token.check(&metadata(&format!("Basic {TOKEN}"))),
            Err(Refusal::NotBearer)
        );
        // One byte off at the end, a prefix, and the token with a byte more.
        for wrong in [
            "0123456789abcdef0124",
            "0123456789abcdef012",
            "0123456789abcdef01234",
        ] {
            assert_eq!(
                token.check(&metadata(&format!("Bearer {wrong}"))),
                Err(Refusal::Wrong),
                "{wrong}"
            );
        }
    }

    #[test]
    fn unusable_tokens_are_refused_without_echoing_them() {
        for (bad, why) in [
            ("", "holds no token"),
            ("short", "5 characters"),
            (
                "0123456789 abcdef",
                "space, control or non-ASCII character at byte 10",
            ),
            ("0123456789abcdef\u{e9}", "non-ASCII"),
        ] {
            let message = ClusterToken::new(bad).unwrap_err();
            assert!(message.contains(why), "{bad:?}: {message}");
            if !bad.is_empty() {
                assert!(!message.contains(bad), "{message}");
            }
        }
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = ClusterToken::new(TOKEN).unwrap();
        let debug = format!("{token:?} {:?}", AttachToken::new(Some(token.clone())));
        assert!(!debug.contains(TOKEN), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn a_token_file_is_trimmed_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        let token = ClusterToken::from_file(&path).unwrap();
        assert!(token.matches(TOKEN.as_bytes()));
        let missing = dir.path().join("absent");
        let err = ClusterToken::from_file(&missing).unwrap_err().to_string();
        assert!(err.starts_with(&missing.display().to_string()), "{err}");
        assert!(err.contains("cannot read the token file"), "{err}");
    }

    #[test]
    fn attach_sends_the_bearer_header_and_the_authenticator_accepts_it() {
        let token = ClusterToken::new(TOKEN).unwrap();
        let request = AttachToken::new(Some(token.clone()))
            .call(tonic::Request::new(()))
            .unwrap();
        assert_eq!(
            request.metadata().get(AUTHORIZATION).unwrap(),
            &format!("Bearer {TOKEN}")
        );
        let mut guard = Authenticator::new(Some(token), "MasterService");
        assert!(guard.call(request).is_ok());
        let refused = guard.call(tonic::Request::new(())).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(
            refused.message().contains("carried no cluster token"),
            "{refused}"
        );
        // Without a configured token, calls pass untouched.
        assert!(Authenticator::new(None, "MasterService")
            .call(tonic::Request::new(()))
            .is_ok());
    }
}
