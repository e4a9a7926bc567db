//! The calling side of the tensor channel: RecvTensor as blocking socket I/O on the executor
//! thread whose `_Recv` waits for the tensor (it would block on the answer anyway), over
//! connections kept per task.
//!
//! A call takes an idle connection (or opens one: TCP, then the hello), writes its request and
//! reads the answer; the content goes straight into a pooled buffer, aligned for the tensor's
//! elements, which the tensor then keeps. A call that fails on the way (deadline, aborted step,
//! broken connection) drops its connection, which tells the sending task to stop waiting; one
//! that got its whole answer, a tensor or an error, gives the connection back.
//!
//! A call the channel cannot carry returns `None`, and the caller goes over gRPC: TLS on this
//! side; a task that does not speak the channel (TensorFlow), refuses it, or cannot be reached
//! just now. The channel then stays off for a while (`RETRY_AFTER_*`), so those calls do not
//! each pay for a failed attempt first.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use prost::Message;
use tracing::warn;

use super::{hello, AnswerHead, RequestHead, ResponseHead, ANSWER_HEAD_BYTES, RESPONSE_HEAD_BYTES};
use crate::cluster::TaskId;
use crate::error::{Code, Result, Status};
use crate::proto::{RecvTensorRequest, RecvTensorResponse};
use crate::security::{ClusterToken, Security};
use crate::wire::message::CONTENT_ALIGN;
use crate::wire::pool;
use crate::wire::transport::{deadline_exceeded, lost_connection};
use crate::wire::MAX_MESSAGE_BYTES;
use crate::worker::Rpc;

/// How often a call blocked on its socket looks at its step (aborted?) and its deadline.
pub const POLL: Duration = Duration::from_millis(20);

/// Idle connections kept per task; more are closed when their calls end.
const MAX_IDLE: usize = 16;

/// After a task refused the channel or answered the hello in another protocol.
const RETRY_AFTER_REFUSAL: Duration = Duration::from_secs(60);

/// After a connection to the task could not be opened (gRPC reports why, naming the task).
const RETRY_AFTER_CONNECT_FAILURE: Duration = Duration::from_secs(1);

/// The longest a hello waits for its answer.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// The tensor channel to one task.
pub struct TensorChannel {
    task: TaskId,
    /// `host:port`, as dialled.
    address: String,
    token: Option<ClusterToken>,
    connect_timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    /// Until when calls go over gRPC without trying the channel.
    off_until: Mutex<Option<Instant>>,
}

/// What a call's answer may announce: no more than `max_message_bytes` for its metadata or
/// its content, and no more content than the receiving device's memory budget has `room` for.
#[derive(Clone, Copy, Debug)]
pub struct ChannelLimit {
    /// `limits.max_message_bytes`.
    pub max_message_bytes: usize,
    /// What the receiving device's budget has left (`u64::MAX` without one).
    pub room: u64,
}

impl ChannelLimit {
    /// No limit beyond protobuf's 2 GiB.
    pub const NONE: ChannelLimit = ChannelLimit {
        max_message_bytes: MAX_MESSAGE_BYTES,
        room: u64::MAX,
    };

    /// Refuses an answer announcing `meta_len` + `content_len` bytes over the limits.
    fn check(&self, meta_len: usize, content_len: usize) -> std::result::Result<(), Status> {
        let max = self.max_message_bytes.min(MAX_MESSAGE_BYTES);
        if meta_len > max || content_len > max {
            return Err(crate::cluster::Limits::exceeded(
                "max_message_bytes",
                max,
                &format!("the RecvTensor answer announces {meta_len} + {content_len} bytes"),
            ));
        }
        if content_len as u64 > self.room {
            return Err(Status::resource_exhausted(format!(
                "the RecvTensor answer announces {content_len} bytes of tensor, but the \
                 receiving device's memory budget has {} bytes left; raise \
                 devices.cpu_memory_limit or use smaller tensors",
                self.room
            )));
        }
        Ok(())
    }
}

/// Why a call failed after it started on a connection.
enum Failure {
    /// The deadline passed.
    Deadline,
    /// The caller's step ended (aborted, cancelled) with this status.
    Stopped(Status),
    /// The connection broke or the answer made no sense: the connection is done.
    Broken(String),
    /// The answer announced more than the call's [`ChannelLimit`]: the connection is dropped
    /// unread, and the call fails with this status.
    TooBig(Status),
}

impl TensorChannel {
    /// A channel to `task` at `address` (`host:port`, or a `http://` URI), opening connections
    /// within `connect_timeout`; `None` when `security` speaks TLS (the channel is plain TCP).
    pub fn new(
        task: TaskId,
        address: &str,
        connect_timeout: Duration,
        security: &Security,
    ) -> Option<Self> {
        if security.is_tls() {
            return None;
        }
        let host_port = address.split_once("://").map_or(address, |(_, rest)| rest);
        Some(Self {
            task,
            address: host_port.trim_end_matches('/').to_string(),
            token: security.token.clone(),
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            off_until: Mutex::new(None),
        })
    }

    /// Returns the task at the other end.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// Pulls one tensor, blocking until it arrives, `deadline` passes or `stopped` returns a
    /// status (asked every [`POLL`]). `None` when the channel cannot carry the call now: the
    /// caller sends it over gRPC instead.
    ///
    /// Errors name the task: DEADLINE_EXCEEDED, the step's own status, UNAVAILABLE for a
    /// connection that broke, or the status the task answered with.
    pub fn recv_tensor(
        &self,
        request: &RecvTensorRequest,
        deadline: Instant,
        limit: ChannelLimit,
        stopped: &dyn Fn() -> Option<Status>,
    ) -> Option<Result<RecvTensorResponse>> {
        if self.is_off() {
            return None;
        }
        let started = Instant::now();
        let mut stream = match self.take_idle() {
            Some(stream) => stream,
            None => self.connect(deadline)?,
        };
        match call(&mut stream, request, deadline, limit, stopped) {
            Ok(answered) => {
                self.give_back(stream);
                Some(answered.map_err(|status| {
                    status.context(format_args!(
                        "{} on {} at {}",
                        Rpc::RecvTensor,
                        self.task.device_prefix(),
                        self.address
                    ))
                }))
            }
            Err(Failure::Deadline) => Some(Err(deadline_exceeded(
                &self.task,
                &format!("at {}", self.address),
                Rpc::RecvTensor,
                deadline.saturating_duration_since(started),
            ))),
            Err(Failure::Stopped(status)) => Some(Err(status)),
            Err(Failure::TooBig(status)) => Some(Err(status.context(format_args!(
                "{} from {} at {}",
                Rpc::RecvTensor,
                self.task.device_prefix(),
                self.address
            )))),
            Err(Failure::Broken(cause)) => Some(Err(lost_connection(
                &self.task,
                &self.address,
                Rpc::RecvTensor,
                &cause,
            ))),
        }
    }

    /// Connections waiting for the next call (for tests and operators).
    pub fn idle_connections(&self) -> usize {
        lock(&self.idle).len()
    }

    fn is_off(&self) -> bool {
        let mut off = lock(&self.off_until);
        match *off {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                *off = None;
                false
            }
            None => false,
        }
    }

    fn turn_off(&self, duration: Duration) {
        *lock(&self.off_until) = Some(Instant::now() + duration);
    }

    /// An idle connection that is still open (the task may have closed it since).
    fn take_idle(&self) -> Option<TcpStream> {
        loop {
            let stream = lock(&self.idle).pop()?;
            if is_open(&stream) {
                return Some(stream);
            }
        }
    }

    fn give_back(&self, stream: TcpStream) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(stream);
        }
    }

    /// Opens a connection and says hello; `None` (and the channel off for a while) when that
    /// fails or the task does not accept the channel.
    fn connect(&self, deadline: Instant) -> Option<TcpStream> {
        let opened = self.open(deadline);
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(_) => {
                self.turn_off(RETRY_AFTER_CONNECT_FAILURE);
                return None;
            }
        };
        let token = self.token.as_ref().map(|t| t.secret());
        let answered = stream
            .write_all(&hello(token))
            .and_then(|()| read_answer(&mut stream, deadline.min(Instant::now() + HELLO_DEADLINE)));
        match answered {
            Ok(Some((Code::Ok, _))) => Some(stream),
            Ok(Some((code, why))) => {
                warn!(
                    task = %self.task.device_prefix(),
                    address = %self.address,
                    code = ?code,
                    "the task refused the tensor channel, so tensors come over gRPC: {why}"
                );
                self.turn_off(RETRY_AFTER_REFUSAL);
                None
            }
            // Another protocol (a TensorFlow task answers in HTTP/2, or closes), or no answer.
            Ok(None) | Err(_) => {
                self.turn_off(RETRY_AFTER_REFUSAL);
                None
            }
        }
    }

    /// A TCP connection to the task, reads waking every [`POLL`].
    fn open(&self, deadline: Instant) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing");
        for addr in self.address.to_socket_addrs()? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
            }
            match TcpStream::connect_timeout(&addr, left.min(self.connect_timeout)) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    stream.set_read_timeout(Some(POLL))?;
                    stream.set_write_timeout(Some(self.connect_timeout))?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

impl std::fmt::Debug for TensorChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorChannel")
            .field("task", &self.task)
            .field("address", &self.address)
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Both guarded values stay consistent whatever a panicking holder did.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the other end has not closed `stream` (a peek that would block: nothing to read,
/// no end of stream).
fn is_open(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let open = matches!(
        stream.peek(&mut [0u8; 1]),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock
    );
    open && stream.set_nonblocking(false).is_ok()
}

/// Reads the hello's answer: `None` when it is not one (another protocol, or the connection
/// closed), else the code and the reason.
fn read_answer(stream: &mut TcpStream, deadline: Instant) -> io::Result<Option<(Code, String)>> {
    let never = || None;
    let mut head = [0u8; ANSWER_HEAD_BYTES];
    match read_full(stream, &mut head, deadline, &never) {
        Ok(()) => {}
        Err(Failure::Broken(_)) => return Ok(None),
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")),
    }
    let Some(head) = AnswerHead::parse(&head) else {
        return Ok(None);
    };
    let mut why = vec![0u8; head.why_len.min(64 << 10)];
    if read_full(stream, &mut why, deadline, &never).is_err() {
        return Ok(None);
    }
    Ok(Some((
        head.code,
        String::from_utf8_lossy(&why).into_owned(),
    )))
}

/// One call on an open connection. `Ok` once the whole answer was read (the connection can
/// serve another call), holding the tensor or the task's error.
fn call(
    stream: &mut TcpStream,
    request: &RecvTensorRequest,
    deadline: Instant,
    limit: ChannelLimit,
    stopped: &dyn Fn() -> Option<Status>,
) -> std::result::Result<Result<RecvTensorResponse>, Failure> {
    let body = request.encode_to_vec();
    let head = RequestHead {
        timeout_micros: deadline
            .saturating_duration_since(Instant::now())
            .as_micros()
            .clamp(1, u64::MAX as u128) as u64,
        len: body.len(),
    };
    let mut out = Vec::with_capacity(head.encode().len() + body.len());
    out.extend_from_slice(&head.encode());
    out.extend_from_slice(&body);
    stream
        .write_all(&out)
        .map_err(|e| Failure::Broken(e.to_string()))?;
    read_response(stream, deadline, limit, stopped)
}

/// Reads a whole answer from a peer (its bytes as they come, nothing trusted): `Ok` holding
/// the tensor or the task's error once it was read whole, a [`Failure`] otherwise.
fn read_response(
    stream: &mut impl Read,
    deadline: Instant,
    limit: ChannelLimit,
    stopped: &dyn Fn() -> Option<Status>,
) -> std::result::Result<Result<RecvTensorResponse>, Failure> {
    let mut head = [0u8; RESPONSE_HEAD_BYTES];
    read_full(stream, &mut head, deadline, stopped)?;
    let head = ResponseHead::decode(&head);
    limit
        .check(head.meta_len, head.content_len)
        .map_err(Failure::TooBig)?;
    let mut meta = vec![0u8; head.meta_len];
    read_full(stream, &mut meta, deadline, stopped)?;
    if head.code != Code::Ok {
        return Ok(Err(Status::new(
            head.code,
            String::from_utf8_lossy(&meta).into_owned(),
        )));
    }
    // The content goes where the tensor will keep it, at an address its elements can be read
    // from in place.
    let mut buffer = pool::take(head.content_len + CONTENT_ALIGN);
    let pad = (CONTENT_ALIGN - buffer.as_ptr() as usize % CONTENT_ALIGN) % CONTENT_ALIGN;
    buffer.resize_to(pad);
    read_full(
        stream,
        buffer.grow_for_write(head.content_len),
        deadline,
        stopped,
    )?;
    let content = buffer.freeze().slice(pad..);
    let mut response = RecvTensorResponse::decode(meta.as_slice())
        .map_err(|e| Failure::Broken(format!("the answer is not a RecvTensorResponse: {e}")))?;
    match response.tensor.as_mut() {
        Some(tensor) => tensor.tensor_content = content,
        None if content.is_empty() => {}
        None => {
            return Err(Failure::Broken(
                "the answer has content but no tensor".into(),
            ))
        }
    }
    Ok(Ok(response))
}

/// Parses `bytes` as a whole tensor-channel answer, as the client reads one from a peer:
/// the response head, then the metadata (the error message, or the RecvTensorResponse without
/// its content), then the content, each bounded by `limit` before anything is allocated.
/// INVALID_ARGUMENT or UNAVAILABLE for bytes that are not an answer, the task's status for an
/// error answer. For the fuzzer and tests; calls read from their socket the same way.
pub fn parse_answer(bytes: &[u8], limit: ChannelLimit) -> Result<RecvTensorResponse> {
    let mut reader = bytes;
    let far = Instant::now() + Duration::from_secs(3600);
    match read_response(&mut reader, far, limit, &|| None) {
        Ok(answered) => answered,
        Err(Failure::TooBig(status) | Failure::Stopped(status)) => Err(status),
        Err(Failure::Broken(cause)) => Err(Status::unavailable(cause)),
        Err(Failure::Deadline) => Err(Status::deadline_exceeded("the answer did not end")),
    }
}

/// Fills `buf` from `stream` (whose reads time out every [`POLL`]), giving up at `deadline` or
/// when `stopped` has a status.
fn read_full(
    stream: &mut impl Read,
    buf: &mut [u8],
    deadline: Instant,
    stopped: &dyn Fn() -> Option<Status>,
) -> std::result::Result<(), Failure> {
    let mut filled = 0;
    while filled < buf.len() {
        // Checked before every read, so that an answer trickling in cannot outlast it.
        if Instant::now() >= deadline {
            return Err(Failure::Deadline);
        }
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(Failure::Broken("the task closed the connection".into())),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if let Some(status) = stopped() {
                    return Err(Failure::Stopped(status));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::Broken(e.to_string())),
        }
    }
    Ok(())
}
