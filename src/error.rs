//! The one status type every layer returns to its callers, carrying TensorFlow's status codes.
//!
//! Layers keep their own `thiserror` enums (config, peer, session, executor, device); each has
//! a `code()` with an exhaustive match onto [`Code`] and converts into [`Status`]. This file is
//! the one place where [`Status`] meets `tonic::Status`, both ways, where the code travels in
//! a response body (`status_code` / `status_error_message`), and where an actor that did not
//! answer its mailbox becomes a status ([`mailbox_failure`]).

use std::fmt;

pub use crate::proto::error::Code;

/// A failed operation: TensorFlow's status code and a message that says what is wrong and what
/// to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: String,
}

/// Shorthand for results that fail with a [`Status`].
pub type Result<T, E = Status> = std::result::Result<T, E>;

macro_rules! constructors {
    ($($name:ident => $code:ident),* $(,)?) => {
        $(
            #[doc = concat!("A `", stringify!($code), "` status with this message.")]
            pub fn $name(message: impl Into<String>) -> Self {
                Self::new(Code::$code, message)
            }
        )*
    };
}

impl Status {
    /// A status with this code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    constructors! {
        cancelled => Cancelled,
        unknown => Unknown,
        invalid_argument => InvalidArgument,
        deadline_exceeded => DeadlineExceeded,
        not_found => NotFound,
        already_exists => AlreadyExists,
        permission_denied => PermissionDenied,
        unauthenticated => Unauthenticated,
        resource_exhausted => ResourceExhausted,
        failed_precondition => FailedPrecondition,
        aborted => Aborted,
        out_of_range => OutOfRange,
        unimplemented => Unimplemented,
        internal => Internal,
        unavailable => Unavailable,
        data_loss => DataLoss,
    }

    /// Returns the status code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// Returns the message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same status with `context` put in front of the message ("node `x`: ...").
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Whether a client should recreate its session and retry (TensorFlow's preemption codes).
    pub fn is_retryable(&self) -> bool {
        matches!(self.code, Code::Aborted | Code::Unavailable)
    }

    /// Reads a status stored in a response body; `None` when the code is OK.
    pub fn from_body(code: i32, message: &str) -> Option<Self> {
        let code = Code::try_from(code).unwrap_or(Code::Unknown);
        (code != Code::Ok).then(|| Self::new(code, message))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str_name(), self.message)
    }
}

impl std::error::Error for Status {}

/// The error's message followed by each distinct cause under it, for a message a person reads
/// ("tcp connect error: Connection refused (os error 111)").
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    message_chain(error.to_string(), error.source())
}

/// `first`, then each distinct message of `source` and its own sources, joined by `: `;
/// tonic's empty wrapper layers ("transport error") say nothing their neighbours do not.
pub fn message_chain(first: String, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut parts = vec![first];
    let mut source = source;
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p == &text) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.retain(|p| !p.is_empty() && p != "transport error");
    parts.join(": ")
}

impl From<Status> for tonic::Status {
    fn from(status: Status) -> Self {
        tonic::Status::new(tonic::Code::from_i32(status.code as i32), status.message)
    }
}

impl From<tonic::Status> for Status {
    fn from(status: tonic::Status) -> Self {
        let code = Code::try_from(status.code() as i32).unwrap_or(Code::Unknown);
        Self::new(code, status.message())
    }
}

impl From<prost::DecodeError> for Status {
    fn from(e: prost::DecodeError) -> Self {
        Self::invalid_argument(format!("malformed protobuf: {e}"))
    }
}

/// The status of a message whose actor did not answer: it stopped first (the task is shutting
/// down, or the session was closed while the call was on its way), which a caller may retry
/// elsewhere or later (UNAVAILABLE); or a mailbox deadline passed (DEADLINE_EXCEEDED).
/// `actor` names who was asked ("this task's master", "session 3f2a").
pub fn mailbox_failure(error: actix::MailboxError, actor: &str) -> Status {
    match error {
        actix::MailboxError::Closed => Status::unavailable(format!(
            "{actor} stopped before it answered: the task is shutting down or the session was \
             closed; retry, or create a new session"
        )),
        actix::MailboxError::Timeout => {
            Status::deadline_exceeded(format!("{actor} did not answer in time"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_tonic_with_every_code() {
        for raw in 0..=16 {
            let code = Code::try_from(raw).unwrap();
            let status = Status::new(code, "why");
            let back = Status::from(tonic::Status::from(status.clone()));
            assert_eq!(back, status);
        }
    }

    #[test]
    fn body_status_ok_is_none_and_unknown_codes_map_to_unknown() {
        assert_eq!(Status::from_body(0, ""), None);
        assert_eq!(Status::from_body(10, "x").unwrap().code(), Code::Aborted);
        assert_eq!(Status::from_body(99, "x").unwrap().code(), Code::Unknown);
    }

    #[test]
    fn context_prefixes_the_message() {
        let s = Status::not_found("no such node").context("fetch `y:0`");
        assert_eq!(s.to_string(), "NOT_FOUND: fetch `y:0`: no such node");
        assert!(Status::unavailable("").is_retryable());
        assert!(!Status::internal("").is_retryable());
    }
}
