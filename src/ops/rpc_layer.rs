//! `RpcLayer`: the tower layer around the task's tonic server that counts every RPC by
//! service, method and status code, times it, and turns tonic's "message too large" refusal
//! into the RESOURCE_EXHAUSTED answer of `limits.max_message_bytes`.
//!
//! The code is read from the response's headers. A handler's error (and a request tonic refuses
//! before the handler, such as an oversized one) goes out as a trailers-only response whose
//! headers carry `grpc-status`; a response without it carries a message, so its code is OK. An
//! error while encoding a message already started would only show in the trailers; tessera's
//! answers are built before they are sent, so that case does not arise in practice.
//!
//! tonic refuses a request over its decoding limit with OUT_OF_RANGE and its own wording; the
//! limit is an operator's setting, so the answer says which key sets it, as every other limit's
//! does ([`Limits::exceeded`](crate::cluster::Limits::exceeded)).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::codegen::http;
use tower::{Layer, Service};

use super::metrics::{RPCS, RPC_SECONDS};
use crate::cluster::Limits;

/// The services whose methods are counted by name; any other path counts as `unknown`, so a
/// client cannot grow the series without bound by inventing paths.
const KNOWN_SERVICES: &[(&str, &str)] = &[
    ("tensorflow.MasterService", "MasterService"),
    ("tensorflow.WorkerService", "WorkerService"),
    ("grpc.health.v1.Health", "Health"),
];

/// The layer: what every wrapped service shares.
#[derive(Clone)]
pub struct RpcLayer {
    shared: Arc<Shared>,
}

struct Shared {
    /// The task label of every series.
    task: String,
    /// `limits.max_message_bytes`, for the refusal's message.
    max_message_bytes: usize,
}

impl RpcLayer {
    /// A layer counting `task`'s RPCs; `max_message_bytes` is the limit tonic enforces.
    pub fn new(task: impl Into<String>, max_message_bytes: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                task: task.into(),
                max_message_bytes,
            }),
        }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The wrapped service.
#[derive(Clone)]
pub struct RpcService<S> {
    inner: S,
    shared: Arc<Shared>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RpcService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    ResBody: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let (service, method) = method_of(request.uri().path());
        let shared = Arc::clone(&self.shared);
        let started = Instant::now();
        let call = self.inner.call(request);
        Box::pin(async move {
            let mut response = call.await?;
            let mut code = code_of(response.headers());
            if code == tonic::Code::OutOfRange {
                if let Some(status) = oversized(response.headers(), shared.max_message_bytes) {
                    replace_status(response.headers_mut(), &status);
                    code = status.code();
                }
            }
            count(
                shared.task.clone(),
                service,
                method,
                code,
                started.elapsed(),
            );
            Ok(response)
        })
    }
}

/// Counts and times one call of `service`'s `method` that ended with `code`; for calls that
/// reach the task outside tonic too (the tensor channel).
pub(crate) fn count(
    task: String,
    service: &'static str,
    method: String,
    code: tonic::Code,
    elapsed: Duration,
) {
    metrics::counter!(
        RPCS,
        "task" => task.clone(),
        "service" => service,
        "method" => method.clone(),
        "code" => code_name(code),
    )
    .increment(1);
    metrics::histogram!(
        RPC_SECONDS,
        "task" => task,
        "service" => service,
        "method" => method,
    )
    .record(elapsed.as_secs_f64());
}

/// Splits `/tensorflow.MasterService/RunStep` into (`MasterService`, `RunStep`); paths of
/// other services are (`unknown`, `unknown`).
fn method_of(path: &str) -> (&'static str, String) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (Some(service), Some(method)) = (parts.next(), parts.next()) else {
        return ("unknown", "unknown".into());
    };
    let known = KNOWN_SERVICES.iter().find(|(full, _)| *full == service);
    match known {
        // Methods are a fixed set per service, but a client may still send any name: keep
        // only names that look like one (letters), capped in length.
        Some((_, short))
            if method.len() <= 64 && method.chars().all(|c| c.is_ascii_alphabetic()) =>
        {
            (short, method.to_owned())
        }
        Some((_, short)) => (short, "unknown".into()),
        None => ("unknown", "unknown".into()),
    }
}

/// The gRPC code in a response's headers; OK when absent (the answer carries a message).
fn code_of(headers: &http::HeaderMap) -> tonic::Code {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32)
}

/// The code's name as TensorFlow writes it (`RESOURCE_EXHAUSTED`), for the `code` label.
fn code_name(code: tonic::Code) -> &'static str {
    crate::error::Code::try_from(code as i32)
        .unwrap_or(crate::error::Code::Unknown)
        .as_str_name()
}

/// When the headers carry tonic's refusal of an oversized request, the RESOURCE_EXHAUSTED
/// status naming `limits.max_message_bytes` and the request's size.
fn oversized(headers: &http::HeaderMap, limit: usize) -> Option<tonic::Status> {
    let status = tonic::Status::from_header_map(headers)?;
    let message = status.message();
    if !message.contains("decoded message length too large") {
        return None;
    }
    // "Error, decoded message length too large: found N bytes, the limit is: M bytes"
    let found = message
        .split("found ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("?");
    let status = Limits::exceeded(
        "max_message_bytes",
        limit,
        &format!("the request is {found} bytes"),
    );
    Some(tonic::Status::from(status))
}

/// Replaces the status of a trailers-only response.
fn replace_status(headers: &mut http::HeaderMap, status: &tonic::Status) {
    headers.remove("grpc-status");
    headers.remove("grpc-message");
    headers.remove("grpc-status-details-bin");
    if status.add_header(headers).is_err() {
        // Only unencodable details fail; the code alone still goes out.
        headers.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_methods_keep_their_names_and_others_are_unknown() {
        assert_eq!(
            method_of("/tensorflow.MasterService/RunStep"),
            ("MasterService", "RunStep".to_owned())
        );
        assert_eq!(
            method_of("/grpc.health.v1.Health/Check"),
            ("Health", "Check".to_owned())
        );
        assert_eq!(
            method_of("/evil.Service/X"),
            ("unknown", "unknown".to_owned())
        );
        assert_eq!(
            method_of("/tensorflow.WorkerService/a%20b"),
            ("WorkerService", "unknown".to_owned())
        );
        assert_eq!(method_of("/"), ("unknown", "unknown".to_owned()));
    }

    #[test]
    fn tonics_size_refusal_becomes_resource_exhausted_naming_the_key() {
        let refusal = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 2048 bytes, the limit is: 1024 bytes",
        );
        let mut headers = http::HeaderMap::new();
        refusal.add_header(&mut headers).unwrap();
        assert_eq!(code_of(&headers), tonic::Code::OutOfRange);
        let status = oversized(&headers, 1024).unwrap();
        replace_status(&mut headers, &status);
        assert_eq!(code_of(&headers), tonic::Code::ResourceExhausted);
        let sent = tonic::Status::from_header_map(&headers).unwrap();
        assert!(
            sent.message()
                .starts_with("the request is 2048 bytes, over limits.max_message_bytes = 1024"),
            "{}",
            sent.message()
        );
    }

    #[test]
    fn other_out_of_range_errors_pass_unchanged() {
        let mut headers = http::HeaderMap::new();
        tonic::Status::out_of_range("End of sequence")
            .add_header(&mut headers)
            .unwrap();
        assert!(oversized(&headers, 1024).is_none());
        assert_eq!(code_of(&http::HeaderMap::new()), tonic::Code::Ok);
    }
}
