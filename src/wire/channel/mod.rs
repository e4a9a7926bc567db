//! The tensor channel: RecvTensor between tessera tasks over plain TCP on the task's own port,
//! beside gRPC, as TensorFlow's `grpc+verbs` and `grpc+mpi` move tensors outside gRPC while
//! everything else stays on it.
//!
//! ```text
//!  executor thread (_Recv)                                   task's port (one listener)
//!  TensorChannel ── hello (magic, token) ──────────────────► Acceptor: first bytes "TSRT"?
//!   (blocking socket, pooled                                  ├─ yes: serve_connection
//!    connections)  ◄── accepted ─────────────────────────────  │   (WorkerService::recv_tensor,
//!                  ── request (timeout, RecvTensorRequest) ─►  │    the handler gRPC calls)
//!                  ◄── head (code, lengths), meta, content ──  └─ no: tonic (HTTP/2, TLS)
//!  content read straight into a pooled, aligned buffer: the tensor's storage
//! ```
//!
//! Why: a RecvTensor over gRPC pays for HTTP/2 framing and three tasks handing the call along
//! (the caller, tonic's channel, hyper's connection), and the receiver copies the content once
//! out of hyper's frame buffers. Here the executor thread that needs the tensor writes the
//! request and reads the answer itself, the content lands in the buffer the tensor keeps, and
//! the sender writes the tensor's own bytes: the same copies as raw TCP.
//!
//! Negotiated, never required: the first bytes of a connection tell it apart from HTTP/2
//! (`PRI * HTTP/2.0`) and TLS (a handshake record, 0x16), so the port serves both and nothing
//! is configured. A peer that does not answer the hello with the magic (a TensorFlow task), a
//! task serving TLS (the channel has no TLS of its own, so it never carries what TLS should
//! protect) or a refused hello sends the call over gRPC instead. The cluster token, when set,
//! travels in the hello and is checked as gRPC checks it.
//!
//! Wire format, integers little-endian:
//!
//! ```text
//!  hello      "TSRT" │ version u16 │ token length u16 │ token
//!  answer     "TSRT" │ version u16 │ code u16 (0 accepted, else a status code) │ length u32 │ why
//!  request    timeout µs u64 (0: none) │ length u32 │ RecvTensorRequest
//!  response   code u32 │ meta length u32 │ content length u64 │ meta │ content
//!             OK: meta is the RecvTensorResponse without tensor_content, content is it
//!             an error: meta is the message, content is empty
//! ```
//!
//! One call at a time per connection; a caller needing several at once uses several
//! connections, so a slow tensor never holds up another. A caller that gives up (deadline,
//! aborted step) closes its connection, which cancels the wait on the sending side.

pub mod client;
pub mod server;

pub use client::{ChannelLimit, TensorChannel};
pub use server::{incoming, ChannelConfig};

use crate::error::{Code, Status};

/// The first bytes of a tensor-channel connection (and of the server's answer).
pub const MAGIC: [u8; 4] = *b"TSRT";

/// The protocol version this build speaks.
pub const VERSION: u16 = 1;

/// Bytes of a response head: code, meta length, content length.
pub const RESPONSE_HEAD_BYTES: usize = 16;

/// Bytes of a request head: timeout, request length.
pub const REQUEST_HEAD_BYTES: usize = 12;

/// Bytes of a hello answer before its message: magic, version, code, message length.
pub const ANSWER_HEAD_BYTES: usize = 12;

/// The largest RecvTensorRequest accepted (a step id and a rendezvous key).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The longest token a hello carries (its length field is 16 bits).
pub const MAX_TOKEN_BYTES: usize = u16::MAX as usize;

/// The hello that opens a connection.
pub fn hello(token: Option<&[u8]>) -> Vec<u8> {
    let token = token.unwrap_or_default();
    let token = &token[..token.len().min(MAX_TOKEN_BYTES)];
    let mut out = Vec::with_capacity(8 + token.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(token.len() as u16).to_le_bytes());
    out.extend_from_slice(token);
    out
}

/// The server's answer to a hello: accepted (`code` OK) or refused with why.
pub fn answer(code: Code, why: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(ANSWER_HEAD_BYTES + why.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(code as u16).to_le_bytes());
    out.extend_from_slice(&(why.len() as u32).to_le_bytes());
    out.extend_from_slice(why.as_bytes());
    out
}

/// A parsed answer head: what the server said, and how long its reason is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerHead {
    /// OK when the connection was accepted.
    pub code: Code,
    /// Bytes of the reason that follow.
    pub why_len: usize,
}

impl AnswerHead {
    /// Parses an answer head; `None` when it is not a tensor-channel answer of this version
    /// (a TensorFlow task answers a hello with HTTP/2 bytes, or closes).
    pub fn parse(head: &[u8; ANSWER_HEAD_BYTES]) -> Option<Self> {
        if head[..4] != MAGIC || u16::from_le_bytes([head[4], head[5]]) != VERSION {
            return None;
        }
        Some(Self {
            code: code_of(u16::from_le_bytes([head[6], head[7]]) as i32),
            why_len: u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize,
        })
    }
}

/// A request head: how long the caller waits (zero: no limit) and the request's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    /// Microseconds the caller waits.
    pub timeout_micros: u64,
    /// Bytes of the encoded RecvTensorRequest that follow.
    pub len: usize,
}

impl RequestHead {
    /// The head's bytes.
    pub fn encode(&self) -> [u8; REQUEST_HEAD_BYTES] {
        let mut out = [0u8; REQUEST_HEAD_BYTES];
        out[..8].copy_from_slice(&self.timeout_micros.to_le_bytes());
        out[8..].copy_from_slice(&(self.len as u32).to_le_bytes());
        out
    }

    /// Parses a head.
    pub fn decode(head: &[u8; REQUEST_HEAD_BYTES]) -> Self {
        let mut timeout = [0u8; 8];
        timeout.copy_from_slice(&head[..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[8..]);
        Self {
            timeout_micros: u64::from_le_bytes(timeout),
            len: u32::from_le_bytes(len) as usize,
        }
    }
}

/// A response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// The call's status code (OK: a tensor follows).
    pub code: Code,
    /// Bytes of the meta (the response without its content, or the error's message).
    pub meta_len: usize,
    /// Bytes of the tensor's content.
    pub content_len: usize,
}

impl ResponseHead {
    /// The head's bytes.
    pub fn encode(&self) -> [u8; RESPONSE_HEAD_BYTES] {
        let mut out = [0u8; RESPONSE_HEAD_BYTES];
        out[..4].copy_from_slice(&(self.code as u32).to_le_bytes());
        out[4..8].copy_from_slice(&(self.meta_len as u32).to_le_bytes());
        out[8..].copy_from_slice(&(self.content_len as u64).to_le_bytes());
        out
    }

    /// Parses a head.
    pub fn decode(head: &[u8; RESPONSE_HEAD_BYTES]) -> Self {
        let word =
            |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
        let mut content = [0u8; 8];
        content.copy_from_slice(&head[8..]);
        Self {
            code: code_of(word(0) as i32),
            meta_len: word(4) as usize,
            content_len: u64::from_le_bytes(content) as usize,
        }
    }

    /// The head of an error answer carrying `status`'s message.
    pub fn error(status: &Status) -> Self {
        Self {
            code: status.code(),
            meta_len: status.message().len(),
            content_len: 0,
        }
    }
}

/// A status code from the wire; codes this build does not know read as UNKNOWN.
fn code_of(raw: i32) -> Code {
    Code::try_from(raw).unwrap_or(Code::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_read_back_as_written() {
        let request = RequestHead {
            timeout_micros: 2_500_000,
            len: 93,
        };
        assert_eq!(RequestHead::decode(&request.encode()), request);
        let response = ResponseHead {
            code: Code::Aborted,
            meta_len: 17,
            content_len: 3 << 30,
        };
        assert_eq!(ResponseHead::decode(&response.encode()), response);
    }

    #[test]
    fn a_hello_never_looks_like_http2_or_tls() {
        let hello = hello(Some(b"0123456789abcdef"));
        assert_eq!(&hello[..4], b"TSRT");
        assert_ne!(&hello[..4], b"PRI ");
        assert_ne!(hello[0], 0x16);
        assert_eq!(&hello[8..], b"0123456789abcdef");
    }

    #[test]
    fn answers_of_another_protocol_or_version_are_not_answers() {
        let refused = answer(Code::Unauthenticated, "wrong token");
        let head: [u8; ANSWER_HEAD_BYTES] = refused[..ANSWER_HEAD_BYTES].try_into().unwrap();
        assert_eq!(
            AnswerHead::parse(&head),
            Some(AnswerHead {
                code: Code::Unauthenticated,
                why_len: 11
            })
        );
        // An HTTP/2 server's first bytes (a SETTINGS frame) are not an answer.
        let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(AnswerHead::parse(&settings), None);
        let mut newer = head;
        newer[4] = 2;
        assert_eq!(AnswerHead::parse(&newer), None);
    }
}
