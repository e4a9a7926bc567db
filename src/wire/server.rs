//! `WorkerServer`: the WorkerService as tonic serves it, with RecvTensor answered by the fast
//! path (its response framed by hand around the tensor's shared buffer).
//!
//! It wraps tonic's generated `WorkerServiceServer` and routes by HTTP/2 path: RecvTensor goes
//! to [`recv_tensor`] below, everything else to the generated server. Both call the same
//! [`WorkerService`] implementation, so a handler is written once; only the response's
//! encoding differs, and its bytes are the same.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message;
use tonic::body::Body;
use tonic::codegen::http::{self, header, HeaderMap, HeaderValue};
use tonic::codegen::{BoxFuture, Service};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;

use super::message::{encode_recv_tensor_response, read_message, MessageBody};
use super::RECV_TENSOR_PATH;
use crate::proto::worker_service_server::{WorkerService, WorkerServiceServer};
use crate::proto::RecvTensorRequest;
use crate::wire::MAX_MESSAGE_BYTES;

/// The largest RecvTensor request read (a step id and a rendezvous key).
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// A WorkerService server whose RecvTensor responses share the tensor's buffer.
pub struct WorkerServer<T> {
    service: Arc<T>,
    generated: WorkerServiceServer<T>,
}

impl<T: WorkerService> WorkerServer<T> {
    /// Serves `service`, accepting and sending messages up to tessera's limit (2 GiB).
    pub fn new(service: T) -> Self {
        Self::from_arc(Arc::new(service))
    }

    /// [`new`](Self::new) for a service shared with other servers (the tensor channel).
    pub fn from_arc(service: Arc<T>) -> Self {
        let generated = WorkerServiceServer::from_arc(Arc::clone(&service))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Self { service, generated }
    }

    /// Refuses requests other than RecvTensor larger than `limit` bytes (the task's
    /// `limits.max_message_bytes`); RecvTensor requests are always small.
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.generated = self.generated.max_decoding_message_size(limit);
        self
    }
}

impl<T> Clone for WorkerServer<T> {
    fn clone(&self) -> Self {
        Self {
            service: Arc::clone(&self.service),
            generated: self.generated.clone(),
        }
    }
}

impl<T> NamedService for WorkerServer<T> {
    const NAME: &'static str = <WorkerServiceServer<T> as NamedService>::NAME;
}

impl<T: WorkerService> Service<http::Request<Body>> for WorkerServer<T> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != RECV_TENSOR_PATH {
            return self.generated.call(request);
        }
        let service = Arc::clone(&self.service);
        Box::pin(async move {
            Ok(match recv_tensor(service.as_ref(), request).await {
                Ok(response) => response,
                Err(status) => status.into_http(),
            })
        })
    }
}

/// Answers one RecvTensor call: reads the request, asks `service`, frames the response.
async fn recv_tensor<T: WorkerService>(
    service: &T,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, tonic::Status> {
    let (parts, body) = request.into_parts();
    if let Some(encoding) = parts.headers.get("grpc-encoding") {
        if encoding != "identity" {
            return Err(tonic::Status::unimplemented(format!(
                "RecvTensor requests compressed with {encoding:?} are not supported; send them \
                 uncompressed"
            )));
        }
    }
    let message = read_message(body, MAX_REQUEST_BYTES)
        .await?
        .message
        .ok_or_else(|| tonic::Status::invalid_argument("RecvTensor request carried no message"))?;
    // A request that does not parse is the caller's bad argument, as in crate::codec.
    let message = RecvTensorRequest::decode(message).map_err(|e| {
        tonic::Status::invalid_argument(format!(
            "RecvTensor request is not a RecvTensorRequest: {e}"
        ))
    })?;
    let request = tonic::Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        message,
    );
    let (metadata, message, _) = service.recv_tensor(request).await?.into_parts();
    let pieces = encode_recv_tensor_response(message, MAX_MESSAGE_BYTES)?;
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = http::Response::new(Body::new(MessageBody::new(pieces, Some(trailers))));
    let headers = response.headers_mut();
    *headers = metadata.into_headers();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    Ok(response)
}
