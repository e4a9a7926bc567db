//! The serving side of the tensor channel: the task's accept loop, which hands HTTP/2 and TLS
//! connections to tonic and serves tensor-channel connections itself.
//!
//! ```text
//!  TcpListener ─► accept ─► route (peek the first bytes, within SNIFF_DEADLINE)
//!                             ├─ "TSRT": serve_connection ─ hello ─ loop { request ─► recv_tensor
//!                             │                                             (or the caller left)
//!                             │                                      ─► head, meta, content }
//!                             └─ anything else: the stream tonic serves (TLS, gRPC, health)
//! ```
//!
//! Peeking consumes nothing, so tonic reads a connection from its first byte. A connection that
//! sends nothing within the deadline goes to tonic too, which treats it as it always has.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use futures::Stream;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::{
    answer, RequestHead, ResponseHead, MAGIC, MAX_REQUEST_BYTES, REQUEST_HEAD_BYTES, VERSION,
};
use crate::error::{Code, Status};
use crate::ops::rpc_layer;
use crate::proto::worker_service_server::WorkerService;
use crate::proto::{RecvTensorRequest, RecvTensorResponse};
use crate::security::ClusterToken;

/// How long a new connection may stay silent before it is handed to tonic undecided.
pub const SNIFF_DEADLINE: Duration = Duration::from_secs(10);

/// How long a tensor-channel client may take to finish its hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// How long the accept loop pauses after a failed accept (out of file descriptors, say), so
/// that it does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connections routed to tonic but not yet taken by it.
const TONIC_BACKLOG: usize = 128;

/// How the task serves its tensor channel.
#[derive(Clone, Debug)]
pub struct ChannelConfig {
    /// Whether tensor-channel connections are accepted; false when the port serves TLS (the
    /// channel is plain TCP, so it must not carry what TLS protects).
    pub serve: bool,
    /// The cluster token a hello must carry, when the cluster has one.
    pub token: Option<ClusterToken>,
    /// The task's label in metrics.
    pub task: String,
}

/// Accepts `listener`'s connections until `shutdown` turns true: tensor-channel connections
/// are served here by `service`'s `recv_tensor`, the handler gRPC calls; every other
/// connection comes out of the returned stream, for tonic's `serve_with_incoming`. Must be
/// called inside a tokio runtime, which runs the loop and the connections.
pub fn incoming<T: WorkerService>(
    listener: TcpListener,
    service: Arc<T>,
    config: ChannelConfig,
    shutdown: watch::Receiver<bool>,
) -> impl Stream<Item = io::Result<TcpStream>> + Send + 'static {
    let (to_tonic, for_tonic) = mpsc::channel(TONIC_BACKLOG);
    tokio::spawn(accept_loop(
        listener,
        service,
        Arc::new(config),
        to_tonic,
        shutdown,
    ));
    futures::stream::unfold(for_tonic, |mut for_tonic| async move {
        let stream = for_tonic.recv().await?;
        Some((Ok(stream), for_tonic))
    })
}

async fn accept_loop<T: WorkerService>(
    listener: TcpListener,
    service: Arc<T>,
    config: Arc<ChannelConfig>,
    to_tonic: mpsc::Sender<TcpStream>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = to_tonic.closed() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                if let Err(e) = stream.set_nodelay(true) {
                    debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
                }
                tokio::spawn(route(
                    stream,
                    Arc::clone(&service),
                    Arc::clone(&config),
                    to_tonic.clone(),
                ));
            }
            Err(e) => {
                warn!(error = %e, "accepting a connection failed; retrying");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Serves `stream` as a tensor channel when it opens with the magic, else hands it to tonic.
async fn route<T: WorkerService>(
    stream: TcpStream,
    service: Arc<T>,
    config: Arc<ChannelConfig>,
    to_tonic: mpsc::Sender<TcpStream>,
) {
    match tokio::time::timeout(SNIFF_DEADLINE, opens_with_magic(&stream)).await {
        Ok(Ok(true)) => serve_connection(stream, service.as_ref(), &config).await,
        Ok(Ok(false)) | Err(_) => {
            // Only fails once tonic has stopped, and then nobody serves the connection anyway.
            let _ = to_tonic.send(stream).await;
        }
        Ok(Err(e)) => debug!(error = %e, "a connection broke before its first bytes"),
    }
}

/// Whether the connection's first bytes are the magic, without consuming them.
async fn opens_with_magic(stream: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; MAGIC.len()];
    loop {
        let n = stream.peek(&mut first).await?;
        if n == 0 || first[..n] != MAGIC[..n] {
            return Ok(false);
        }
        if n == MAGIC.len() {
            return Ok(true);
        }
        // A prefix of the magic and nothing more yet (clients write the hello whole, so this is
        // rare): the socket stays readable while bytes wait, so look again shortly.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Serves one tensor-channel connection until the client closes it or breaks the protocol.
pub async fn serve_connection<T: WorkerService>(
    mut stream: TcpStream,
    service: &T,
    config: &ChannelConfig,
) {
    let peer = stream.peer_addr().ok();
    if let Err(e) = serve(&mut stream, service, config).await {
        debug!(peer = ?peer, error = %e, "tensor channel connection ended");
    }
}

async fn serve<T: WorkerService>(
    stream: &mut TcpStream,
    service: &T,
    config: &ChannelConfig,
) -> io::Result<()> {
    let admitted = match tokio::time::timeout(HELLO_DEADLINE, read_hello(stream)).await {
        Ok(hello) => admit(config, &hello?),
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no hello in time")),
    };
    match admitted {
        Ok(()) => stream.write_all(&answer(Code::Ok, "")).await?,
        Err(status) => {
            stream
                .write_all(&answer(status.code(), status.message()))
                .await?;
            return Ok(());
        }
    }
    let (mut reader, mut writer) = stream.split();
    loop {
        let mut head = [0u8; REQUEST_HEAD_BYTES];
        match reader.read_exact(&mut head).await {
            Ok(_) => {}
            // The client closed an idle connection: the normal end.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let head = RequestHead::decode(&head);
        if head.len > MAX_REQUEST_BYTES {
            let status = Status::invalid_argument(format!(
                "tensor channel request of {} bytes; requests are at most {MAX_REQUEST_BYTES}",
                head.len
            ));
            // The request's bytes are not read, so the connection cannot go on.
            return write_error(&mut writer, &status).await;
        }
        let mut body = vec![0u8; head.len];
        reader.read_exact(&mut body).await?;
        let started = Instant::now();
        let request = match RecvTensorRequest::decode(body.as_slice()) {
            Ok(request) => request,
            Err(e) => {
                let status = Status::invalid_argument(format!(
                    "tensor channel request is not a RecvTensorRequest: {e}"
                ));
                write_error(&mut writer, &status).await?;
                continue;
            }
        };
        let mut call = tonic::Request::new(request);
        if head.timeout_micros > 0 {
            call.set_timeout(Duration::from_micros(head.timeout_micros));
        }
        let answered = tokio::select! {
            answered = service.recv_tensor(call) => answered,
            // The caller gave up (its deadline, an aborted step) and closed the connection;
            // dropping the call ends the wait for the tensor.
            _ = closed(&mut reader) => return Ok(()),
        };
        let code = match &answered {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        rpc_layer::count(
            config.task.clone(),
            "TensorChannel",
            "RecvTensor".into(),
            code,
            started.elapsed(),
        );
        match answered {
            Ok(response) => write_response(&mut writer, response.into_inner()).await?,
            Err(status) => write_error(&mut writer, &Status::from(status)).await?,
        }
    }
}

/// Reads a hello after its magic: checks the version and returns the token it carries.
async fn read_hello(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = [0u8; 8];
    stream.read_exact(&mut head).await?;
    debug_assert_eq!(head[..4], MAGIC);
    let version = u16::from_le_bytes([head[4], head[5]]);
    let token_len = u16::from_le_bytes([head[6], head[7]]) as usize;
    let mut token = vec![0u8; token_len];
    stream.read_exact(&mut token).await?;
    if version != VERSION {
        // Answered with this side's version, which the client does not take as an answer: it
        // falls back to gRPC.
        stream
            .write_all(&answer(
                Code::Unimplemented,
                &format!("tensor channel version {version}; this task speaks {VERSION}"),
            ))
            .await?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("tensor channel version {version}"),
        ));
    }
    Ok(token)
}

/// Whether a hello carrying `token` may use the channel.
fn admit(config: &ChannelConfig, token: &[u8]) -> Result<(), Status> {
    if !config.serve {
        return Err(Status::failed_precondition(
            "this task serves TLS, so its tensor channel (plain TCP) is off; tensors go over \
             gRPC",
        ));
    }
    match &config.token {
        Some(expected) if !expected.matches(token) => Err(Status::unauthenticated(
            "the tensor channel's hello carried no cluster token or a wrong one; give this \
             task's [auth] token_file",
        )),
        _ => Ok(()),
    }
}

/// Resolves when the client closes the connection (or sends bytes it should not while a call
/// is in flight, which ends it as well).
async fn closed<R: AsyncRead + Unpin>(reader: &mut R) {
    let _ = reader.read(&mut [0u8; 1]).await;
}

/// Writes an OK answer: the head, the response without its content, then the content as the
/// tensor's own bytes.
async fn write_response<W: AsyncWriteExt + Unpin>(
    writer: &mut W,
    mut response: RecvTensorResponse,
) -> io::Result<()> {
    let content = response
        .tensor
        .as_mut()
        .map(|tensor| std::mem::take(&mut tensor.tensor_content))
        .unwrap_or_default();
    let meta = response.encode_to_vec();
    let head = ResponseHead {
        code: Code::Ok,
        meta_len: meta.len(),
        content_len: content.len(),
    };
    let mut first = Vec::with_capacity(head.encode().len() + meta.len());
    first.extend_from_slice(&head.encode());
    first.extend_from_slice(&meta);
    let mut whole = Bytes::from(first).chain(content);
    writer.write_all_buf(&mut whole).await
}

async fn write_error<W: AsyncWriteExt + Unpin>(writer: &mut W, status: &Status) -> io::Result<()> {
    let mut out = ResponseHead::error(status).encode().to_vec();
    out.extend_from_slice(status.message().as_bytes());
    writer.write_all(&out).await
}
