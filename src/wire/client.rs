//! The receiving end of the RecvTensor fast path: one call over a tonic `Channel`, its response
//! gathered into one pooled, aligned buffer and decoded with `tensor_content` sliced out of it.
//!
//! The request goes out exactly as tonic's generated client sends it (POST to
//! [`RECV_TENSOR_PATH`], `content-type: application/grpc`, `te: trailers`, `grpc-timeout`), so
//! any WorkerService answers it: tessera's, or TensorFlow's.

use std::time::Duration;

use prost::Message;
use tonic::body::Body;
use tonic::codegen::http::{self, header, HeaderValue, StatusCode};
use tonic::codegen::Service;
use tonic::Code;

use super::message::{framed, read_message, MessageBody};
use super::RECV_TENSOR_PATH;
use crate::proto::{RecvTensorRequest, RecvTensorResponse};

/// Calls RecvTensor on the task behind `channel` (a tonic `Channel`, or one wrapped to carry
/// the cluster token), waiting at most `timeout` on the remote side
/// (sent as `grpc-timeout`; the caller keeps its own timer too). Accepts responses up to
/// `max_bytes`.
///
/// Errors are tonic statuses as tonic's generated client would return them: the remote status,
/// or a status whose `source()` is the transport error when the call could not be made.
pub async fn recv_tensor<C, B>(
    channel: &mut C,
    request: RecvTensorRequest,
    timeout: Duration,
    max_bytes: usize,
) -> Result<RecvTensorResponse, tonic::Status>
where
    C: Service<http::Request<Body>, Response = http::Response<B>>,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = framed(&[&request.encode_to_vec()], max_bytes)?;
    let mut http_request = http::Request::new(Body::new(MessageBody::new(vec![body], None)));
    *http_request.method_mut() = http::Method::POST;
    *http_request.uri_mut() = http::Uri::from_static(RECV_TENSOR_PATH);
    *http_request.version_mut() = http::Version::HTTP_2;
    let headers = http_request.headers_mut();
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    if let Ok(value) = HeaderValue::from_str(&grpc_timeout(timeout)) {
        headers.insert("grpc-timeout", value);
    }

    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| tonic::Status::from_error(e.into()))?;
    let response = channel
        .call(http_request)
        .await
        .map_err(|e| tonic::Status::from_error(e.into()))?;
    let (parts, body) = response.into_parts();
    // A trailers-only answer (an error before any message) carries its status in the headers.
    let head_status = tonic::Status::from_header_map(&parts.headers);
    if let Some(status) = &head_status {
        if status.code() != Code::Ok {
            return Err(status.clone());
        }
    }
    if parts.status != StatusCode::OK {
        return Err(http_status(parts.status));
    }
    let received = read_message(Body::new(body), max_bytes).await?;
    match received
        .trailers
        .as_ref()
        .and_then(tonic::Status::from_header_map)
        .or(head_status)
    {
        Some(status) if status.code() == Code::Ok => {}
        Some(status) => return Err(status),
        None => {
            return Err(tonic::Status::unknown(
                "RecvTensor response ended without a grpc-status",
            ))
        }
    }
    let message = received.message.ok_or_else(|| {
        tonic::Status::internal("RecvTensor response carried a status OK but no message")
    })?;
    // As in crate::codec: a message that does not parse is INVALID_ARGUMENT.
    RecvTensorResponse::decode(message).map_err(|e| {
        tonic::Status::invalid_argument(format!(
            "RecvTensor response is not a RecvTensorResponse: {e}"
        ))
    })
}

/// gRPC's code for a non-200 HTTP status (gRPC's http-grpc-status-mapping).
fn http_status(status: StatusCode) -> tonic::Status {
    let code = match status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    tonic::Status::new(
        code,
        format!("RecvTensor answered with HTTP status {status}"),
    )
}

/// `timeout` as a `grpc-timeout` value: at most 8 digits and a unit, the finest unit that fits.
pub fn grpc_timeout(timeout: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = timeout.as_nanos();
    for (unit, per) in [
        ("n", 1u128),
        ("u", 1_000),
        ("m", 1_000_000),
        ("S", 1_000_000_000),
        ("M", 60_000_000_000),
        ("H", 3_600_000_000_000),
    ] {
        // Rounded up: a deadline sent shorter than the caller's would fail calls early.
        let value = nanos.div_ceil(per);
        if value <= MAX {
            return format!("{value}{unit}");
        }
    }
    format!("{MAX}H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_use_the_finest_unit_with_at_most_eight_digits() {
        assert_eq!(grpc_timeout(Duration::from_nanos(1500)), "1500n");
        // 0.2 s = 200,000,000 ns (9 digits) = 200,000 µs.
        assert_eq!(grpc_timeout(Duration::from_millis(200)), "200000u");
        // 60 s = 60,000,000 µs (8 digits).
        assert_eq!(grpc_timeout(Duration::from_secs(60)), "60000000u");
        // 1000 s = 1,000,000 ms (7 digits); 1 µs over rounds up.
        assert_eq!(
            grpc_timeout(Duration::from_secs(1000) + Duration::from_micros(1)),
            "1000001m"
        );
        assert_eq!(grpc_timeout(Duration::from_secs(100_000_000)), "1666667M");
    }

    #[test]
    fn http_errors_map_as_grpc_says() {
        assert_eq!(
            http_status(StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
        assert_eq!(
            http_status(StatusCode::SERVICE_UNAVAILABLE).code(),
            Code::Unavailable
        );
        assert_eq!(http_status(StatusCode::IM_A_TEAPOT).code(), Code::Unknown);
    }
}
