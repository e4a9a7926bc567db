//! The remote session (TensorFlow's target `grpc://host:port`): the session lives in a task's
//! master, and this side speaks MasterService to it, as TensorFlow's `GrpcSession` does.
//!
//! A `grpcs://host:port` (or `https://host:port`) target, or [`ConnectOptions::tls`] with any
//! target, connects over TLS, checking the master's certificate against the given CA (and
//! showing the client's own certificate to a master that requires one). With
//! [`ConnectOptions::token`] every call carries the cluster token.
//!
//! ```text
//! extend (no session yet) ──► CreateSession(graph_def, config, target) → handle, version
//! extend (later)          ──► ExtendSession(handle, new nodes only, current version)
//! run                     ──► RunStep(feeds, fetches, targets, store_errors_in_response_body)
//! make/run/release_callable ► MakeCallable / RunCallable / ReleaseCallable
//! close                   ──► CloseSession(handle)
//! ```
//!
//! A target naming a task of this same process (`tessera train`'s client and its own task, a
//! test's in-process cluster) is reached through that task's master directly, as TensorFlow's
//! `LocalMaster`: the same calls, without gRPC on loopback (see [`crate::master::local`] for
//! who may skip the gRPC front; `rpc_options.use_rpc_for_inprocess_master` in the session's
//! config turns it off).
//!
//! The API is synchronous. Each session owns a small tokio runtime (over gRPC one worker
//! thread, which also keeps the HTTP/2 connection alive; to a master in this process none,
//! the calling thread runs the call) and blocks the calling thread on it. Calling it from
//! inside an async context would block that runtime's thread, so every call checks first and
//! fails with FAILED_PRECONDITION instead; async callers use `spawn_blocking`.
//!
//! Every call has a deadline: connecting has `connect_timeout`, each RPC `call_timeout`, sent
//! as `grpc-timeout` (RunStep: as `RunOptions.timeout_in_ms`, which bounds the step) so that
//! the master stops work nobody waits for, and enforced by a local timer (a master that never
//! answers cannot hold the caller). Unlike TensorFlow's wait-for-ready
//! calls, a dead master fails the call with UNAVAILABLE naming its address.

use std::collections::HashMap;
use std::error::Error as _;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{error_chain, Result, Status};
use crate::exec::TensorRef;
use crate::master::{local, MasterMailboxes};
use crate::proto::master_service_client::MasterServiceClient;
use crate::proto::{
    CallableOptions, CloseSessionRequest, CloseSessionResponse, ConfigProto, CreateSessionRequest,
    CreateSessionResponse, DeviceAttributes, ExtendSessionRequest, ExtendSessionResponse, GraphDef,
    ListDevicesRequest, ListDevicesResponse, MakeCallableRequest, MakeCallableResponse,
    ReleaseCallableRequest, ReleaseCallableResponse, RunCallableRequest, RunCallableResponse,
    RunMetadata, RunOptions, RunStepRequest, RunStepResponse,
};
use crate::security::{AuthChannel, ClusterToken, Security, TlsConfig};
use crate::tensor::Tensor;
use crate::wire::MAX_MESSAGE_BYTES;

/// The longest CloseSession waits (TensorFlow's master gives DeleteWorkerSession 10 s).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a remote session reaches its master.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// How long connecting to the master may take (TCP and HTTP/2 handshakes).
    pub connect_timeout: Duration,
    /// How long one call (a whole step, for `run`) may take before it fails with
    /// DEADLINE_EXCEEDED. Generous by default: a training step can be slow.
    pub call_timeout: Duration,
    /// The session's configuration, sent with CreateSession.
    pub config: ConfigProto,
    /// TLS to the master: the CA that signed its certificate, and this client's certificate
    /// and key for a master that requires one (mTLS). Required by `grpcs://` targets.
    pub tls: Option<TlsConfig>,
    /// The cluster token, sent on every call to a master that checks one.
    pub token: Option<ClusterToken>,
}

impl ConnectOptions {
    /// These options with a task's TLS and cluster token (`TaskConfig::security`), so that a
    /// program running beside a task reaches masters the way the task reaches its peers.
    pub fn with_security(mut self, security: &Security) -> Self {
        self.tls = security.tls.clone();
        self.token = security.token.clone();
        self
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(600),
            config: ConfigProto::default(),
            tls: None,
            token: None,
        }
    }
}

/// The master-side session as the client knows it.
#[derive(Debug, Default)]
struct Handle {
    /// The master's session handle; `None` until the first call creates the session.
    session: Option<String>,
    /// The master's graph version, sent back with each ExtendSession.
    version: i64,
    closed: bool,
}

/// A session in a remote master, driven synchronously; `Send + Sync`.
pub struct RemoteSession {
    /// The target as the user gave it (`grpc://host:port`).
    target: String,
    /// `host:port`, for messages.
    address: String,
    options: ConnectOptions,
    /// What to check when the connection fails (plain text against TLS, or the reverse).
    hint: &'static str,
    link: Link,
    /// Serializes session creation and graph growth, which must see each other's versions.
    handle: Mutex<Handle>,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

impl RemoteSession {
    /// Connects to the master at `target` (`grpc://host:port`). No session is created yet: the
    /// first [`extend`](Self::extend) (or step) creates it.
    ///
    /// Fails with INVALID_ARGUMENT for a malformed target (or a `grpcs://` one without
    /// [`ConnectOptions::tls`]), UNAVAILABLE when the master cannot be reached within
    /// `connect_timeout` (TLS handshake included), and FAILED_PRECONDITION inside an async
    /// context.
    pub fn connect(target: &str, options: ConnectOptions) -> Result<Self> {
        let (address, wants_tls) = parse_target(target)?;
        if wants_tls && options.tls.is_none() {
            return Err(bad_target(
                target,
                "it asks for TLS but ConnectOptions::tls is not set; set it to \
                 TlsConfig::new(CA file) with the CA that signed the master's certificate",
            ));
        }
        let security = Security {
            tls: options.tls.clone(),
            token: options.token.clone(),
        };
        not_in_async("Session::connect")?;
        let local = in_process_master(&address, &options);
        // A master in this process needs no connection kept alive, so no thread of the
        // session's own: the calling thread runs each call and its timer.
        let runtime = match local {
            Some(_) => tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build(),
            None => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("tessera-client")
                .enable_all()
                .build(),
        }
        .map_err(|e| Status::internal(format!("cannot build the client runtime: {e}")))?;
        let link = match local {
            Some(master) => Link::InProcess(master.mailboxes().clone()),
            None => Link::Grpc(connect_grpc(
                &runtime, target, &address, &security, &options,
            )?),
        };
        Ok(Self {
            target: target.to_string(),
            address,
            options,
            hint: security.connect_hint(),
            link,
            handle: Mutex::default(),
            runtime: Some(runtime),
        })
    }

    /// Returns the target this session talks to.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether the master is a task of this process, called through its mailbox instead of
    /// gRPC.
    pub fn is_in_process(&self) -> bool {
        matches!(self.link, Link::InProcess(_))
    }

    /// Returns the master's graph version (0 until the graph is first extended).
    pub fn graph_version(&self) -> u64 {
        self.lock().version.max(0) as u64
    }

    /// Returns the master's session handle, once created.
    pub fn session_handle(&self) -> Option<String> {
        self.lock().session.clone()
    }

    /// Sends the nodes of `graph`: CreateSession with them when no session exists yet,
    /// ExtendSession with them and the current version otherwise.
    pub fn extend(&self, graph: &GraphDef) -> Result<()> {
        let mut handle = self.lock();
        check_open(&handle)?;
        match handle.session.clone() {
            None => self.create(&mut handle, graph.clone()),
            Some(session) => {
                let request = ExtendSessionRequest {
                    session_handle: session,
                    graph_def: Some(graph.clone()),
                    current_graph_version: handle.version,
                };
                let reply =
                    self.call("ExtendSession", request, |link, r| link.extend_session(r))?;
                handle.version = reply.new_graph_version;
                Ok(())
            }
        }
    }

    /// Runs one step in the master: returns the fetched tensors in `fetches` order (the master
    /// answers in any order; they are matched by name).
    pub fn run(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>> {
        let options = RunOptions {
            timeout_in_ms: self.step_timeout_ms(),
            ..Default::default()
        };
        self.run_step(feeds, fetches, targets, options)
            .map(|(tensors, _)| tensors)
    }

    /// Runs one step in the master as `options` ask and returns the master's `RunMetadata`
    /// with the fetches: with `trace_level` above `NO_TRACE`, the step stats of every device
    /// of every task the step ran on; with `output_partition_graphs`, the graphs they ran. A
    /// `timeout_in_ms` longer than the session's step timeout is cut to it.
    pub fn run_with_options(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: &RunOptions,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        let session_ms = self.step_timeout_ms();
        let options = RunOptions {
            timeout_in_ms: match options.timeout_in_ms {
                ms if ms > 0 => ms.min(session_ms),
                _ => session_ms,
            },
            ..*options
        };
        self.run_step(feeds, fetches, targets, options)
    }

    /// RunStep with `options`; the fetches in `fetches` order and the metadata.
    fn run_step(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: RunOptions,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        let session = self.session()?;
        let request = RunStepRequest {
            session_handle: session,
            feed: feeds
                .iter()
                .map(|(name, tensor)| tensor.to_named_proto(*name))
                .collect(),
            fetch: unique_fetches(fetches),
            target: targets.iter().map(|t| t.to_string()).collect(),
            options: Some(options),
            store_errors_in_response_body: true,
            request_id: new_request_id(),
            ..Default::default()
        };
        let reply = self.call_with(
            Deadline::InRequest(STEP_ANSWER_MARGIN),
            self.options.call_timeout,
            "RunStep",
            request,
            |link, r| link.run_step(r),
        )?;
        if let Some(status) = Status::from_body(reply.status_code, &reply.status_error_message) {
            return Err(status);
        }
        let mut returned = HashMap::with_capacity(reply.tensor.len());
        for named in &reply.tensor {
            let (name, tensor) = Tensor::from_named_proto(named).map_err(|e| {
                e.context(format!("RunStep reply of the master at {}", self.address))
            })?;
            returned.insert(name, tensor);
        }
        let tensors = fetches
            .iter()
            .map(|fetch| {
                returned
                    .get(*fetch)
                    .or_else(|| {
                        // A master may answer under the canonical name (`y:0` for `y`).
                        let canonical = TensorRef::parse(fetch).ok()?.canonical();
                        returned.get(&canonical)
                    })
                    .cloned()
                    .ok_or_else(|| {
                        Status::internal(format!(
                            "the master at {} returned no tensor for fetch `{fetch}` (it \
                             returned {:?})",
                            self.address,
                            returned.keys().collect::<Vec<_>>()
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((tensors, reply.metadata.unwrap_or_default()))
    }

    /// Makes a callable in the master; returns its handle.
    pub fn make_callable(&self, options: CallableOptions) -> Result<i64> {
        let request = MakeCallableRequest {
            session_handle: self.session()?,
            options: Some(options),
            request_id: new_request_id(),
        };
        let reply = self.call("MakeCallable", request, |link, r| link.make_callable(r))?;
        Ok(reply.handle)
    }

    /// Runs the callable `handle` with `feeds` in its feed order; returns its fetches in order.
    pub fn run_callable(&self, handle: i64, feeds: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let request = RunCallableRequest {
            session_handle: self.session()?,
            handle,
            feed: feeds.iter().map(Tensor::to_proto).collect(),
            request_id: new_request_id(),
        };
        let reply = self.call("RunCallable", request, |link, r| link.run_callable(r))?;
        reply
            .fetch
            .iter()
            .enumerate()
            .map(|(i, proto)| {
                Tensor::from_proto(proto)
                    .map_err(|e| e.context(format!("fetch {i} of callable {handle}")))
            })
            .collect()
    }

    /// Releases the callable `handle` in the master.
    pub fn release_callable(&self, handle: i64) -> Result<()> {
        let request = ReleaseCallableRequest {
            session_handle: self.session()?,
            handle,
        };
        self.call("ReleaseCallable", request, |link, r| {
            link.release_callable(r)
        })?;
        Ok(())
    }

    /// Lists the devices the master sees for this session (its own and its workers').
    pub fn list_devices(&self) -> Result<Vec<DeviceAttributes>> {
        let request = ListDevicesRequest {
            session_handle: self.lock().session.clone().unwrap_or_default(),
        };
        let reply = self.call("ListDevices", request, |link, r| link.list_devices(r))?;
        Ok(reply
            .local_device
            .into_iter()
            .chain(reply.remote_device)
            .collect())
    }

    /// Closes the master's session (which cancels its running steps); later calls fail with
    /// FAILED_PRECONDITION. Closing twice, or a session never created, is fine.
    pub fn close(&self) -> Result<()> {
        let session = {
            let mut handle = self.lock();
            if handle.closed {
                return Ok(());
            }
            handle.closed = true;
            handle.session.take()
        };
        let Some(session) = session else {
            return Ok(());
        };
        // Closing also runs on drop: a hung master must not hold the caller for a whole step.
        self.call_within(
            self.options.call_timeout.min(CLOSE_TIMEOUT),
            "CloseSession",
            CloseSessionRequest {
                session_handle: session,
            },
            |link, r| link.close_session(r),
        )?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Handle> {
        self.handle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns the session handle, creating the session with an empty graph if needed.
    fn session(&self) -> Result<String> {
        let mut handle = self.lock();
        check_open(&handle)?;
        if let Some(session) = &handle.session {
            return Ok(session.clone());
        }
        self.create(&mut handle, GraphDef::default())?;
        handle
            .session
            .clone()
            .ok_or_else(|| Status::internal("CreateSession returned no session handle"))
    }

    /// CreateSession with `graph`; records the handle and version.
    fn create(&self, handle: &mut Handle, graph: GraphDef) -> Result<()> {
        let request = CreateSessionRequest {
            graph_def: Some(graph),
            config: Some(self.options.config.clone()),
            target: self.target.clone(),
        };
        let reply = self.call("CreateSession", request, |link, r| link.create_session(r))?;
        if reply.session_handle.is_empty() {
            return Err(Status::internal(format!(
                "the master at {} answered CreateSession without a session handle",
                self.address
            )));
        }
        handle.session = Some(reply.session_handle);
        handle.version = reply.graph_version;
        Ok(())
    }

    /// Runs one RPC made by `rpc` on the session's runtime, under the call deadline, and turns
    /// its failures into statuses that name the master.
    fn call<Req, Resp, F, Fut>(&self, name: &'static str, message: Req, rpc: F) -> Result<Resp>
    where
        F: FnOnce(Link, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.call_within(self.options.call_timeout, name, message, rpc)
    }

    /// A step's `RunOptions.timeout_in_ms`: the call's timeout, or the session's
    /// `operation_timeout_in_ms` when that is shorter (the request's value overrides the
    /// session's on the master, as in TensorFlow, so it must not lengthen it).
    fn step_timeout_ms(&self) -> i64 {
        let call = self.options.call_timeout.as_millis().max(1) as i64;
        match self.options.config.operation_timeout_in_ms {
            ms if ms > 0 => call.min(ms),
            _ => call,
        }
    }

    /// [`call`](Self::call) with its own deadline, sent as `grpc-timeout`.
    fn call_within<Req, Resp, F, Fut>(
        &self,
        timeout: Duration,
        name: &'static str,
        message: Req,
        rpc: F,
    ) -> Result<Resp>
    where
        F: FnOnce(Link, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.call_with(Deadline::Header, timeout, name, message, rpc)
    }

    /// Calls `rpc` with `message`, waiting at most `timeout` (plus the margin of
    /// [`Deadline::InRequest`]) for the answer.
    fn call_with<Req, Resp, F, Fut>(
        &self,
        deadline: Deadline,
        timeout: Duration,
        name: &'static str,
        message: Req,
        rpc: F,
    ) -> Result<Resp>
    where
        F: FnOnce(Link, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        not_in_async(name)?;
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("the session is being dropped"))?;
        let mut request = tonic::Request::new(message);
        let wait = match deadline {
            Deadline::Header => {
                request.set_timeout(timeout);
                timeout
            }
            Deadline::InRequest(margin) => timeout + margin,
        };
        let call = rpc(self.link.clone(), request);
        let started = Instant::now();
        runtime.block_on(async {
            match tokio::time::timeout(wait, call).await {
                Ok(Ok(reply)) => Ok(reply.into_inner()),
                Ok(Err(status)) => Err(self.rewrite(name, status, started.elapsed(), wait)),
                Err(_) => Err(self.deadline_exceeded(name, wait)),
            }
        })
    }

    /// Keeps a status the master sent as it is; names the master in failures of transport.
    fn rewrite(
        &self,
        name: &str,
        status: tonic::Status,
        elapsed: Duration,
        timeout: Duration,
    ) -> Status {
        // Whichever timer fired first (ours, or the master's `grpc-timeout`), a call that failed
        // at its deadline failed because of it.
        let timed_out = matches!(
            status.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        ) && elapsed >= timeout;
        if timed_out {
            return self.deadline_exceeded(name, timeout);
        }
        // tonic keeps the transport error as the source of statuses it made up itself; a
        // status the master sent has none.
        if status.source().is_none() {
            return Status::from(status);
        }
        let cause = error_chain(&status);
        match status.code() {
            tonic::Code::Unavailable => {
                unreachable(&self.target, &format!("{cause}; {}", self.hint))
            }
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                self.deadline_exceeded(name, timeout)
            }
            // The connection broke under the call (the master crashed, or refused this
            // side's TLS): UNAVAILABLE, the code clients retry on, whatever tonic called it.
            code => Status::unavailable(format!(
                "{name} to the master at {} failed in transport ({code:?}): {cause}; {}",
                self.target, self.hint
            )),
        }
    }

    fn deadline_exceeded(&self, name: &str, timeout: Duration) -> Status {
        Status::deadline_exceeded(format!(
            "the master at {} did not answer {name} within {timeout:?}; check that the task \
             is running, or raise ConnectOptions::call_timeout",
            self.target
        ))
    }
}

/// The master of a task in this process that `options` would get through to over gRPC, unless
/// the session's config asks for gRPC anyway.
fn in_process_master(address: &str, options: &ConnectOptions) -> Option<local::LocalMaster> {
    let wants_rpc = options
        .config
        .rpc_options
        .as_ref()
        .is_some_and(|rpc| rpc.use_rpc_for_inprocess_master);
    if wants_rpc {
        return None;
    }
    local::lookup(address).filter(|m| m.admits(options.tls.as_ref(), options.token.as_ref()))
}

/// Connects to the master at `address` over gRPC within `options.connect_timeout`.
fn connect_grpc(
    runtime: &tokio::runtime::Runtime,
    target: &str,
    address: &str,
    security: &Security,
    options: &ConnectOptions,
) -> Result<MasterServiceClient<AuthChannel>> {
    let endpoint = security
        .endpoint(address)
        .map_err(|e| bad_target(target, e.message()))?;
    let endpoint = crate::wire::tune_endpoint(endpoint).connect_timeout(options.connect_timeout);
    let connect_timeout = options.connect_timeout;
    let channel = runtime.block_on(async {
        match tokio::time::timeout(connect_timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => Err(unreachable(
                target,
                &format!("{}; {}", error_chain(&e), security.connect_hint()),
            )),
            Err(_) => Err(unreachable(
                target,
                &format!(
                    "no connection within {connect_timeout:?}; {}",
                    security.connect_hint()
                ),
            )),
        }
    })?;
    Ok(MasterServiceClient::new(security.attach(channel))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// How a session's calls reach its master.
#[derive(Clone)]
enum Link {
    /// MasterService over gRPC.
    Grpc(MasterServiceClient<AuthChannel>),
    /// A task of this process: its master's mailbox.
    InProcess(MasterMailboxes),
}

type Answer<T> = std::result::Result<tonic::Response<T>, tonic::Status>;

/// One method per MasterService call on [`Link`], answering as the gRPC client does.
macro_rules! link_calls {
    ($($call:ident: $request:ty => $response:ty;)*) => {
        impl Link {
            $(
                async fn $call(self, request: tonic::Request<$request>) -> Answer<$response> {
                    match self {
                        Link::Grpc(mut client) => client.$call(request).await,
                        Link::InProcess(master) => master
                            .$call(request.into_inner())
                            .await
                            .map(tonic::Response::new)
                            .map_err(tonic::Status::from),
                    }
                }
            )*
        }
    };
}

link_calls! {
    create_session: CreateSessionRequest => CreateSessionResponse;
    extend_session: ExtendSessionRequest => ExtendSessionResponse;
    run_step: RunStepRequest => RunStepResponse;
    close_session: CloseSessionRequest => CloseSessionResponse;
    list_devices: ListDevicesRequest => ListDevicesResponse;
    make_callable: MakeCallableRequest => MakeCallableResponse;
    run_callable: RunCallableRequest => RunCallableResponse;
    release_callable: ReleaseCallableRequest => ReleaseCallableResponse;
}

/// How a call tells the master its deadline.
#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// As `grpc-timeout`: the master's gRPC runtime arms a timer for the call.
    Header,
    /// Inside the request (RunStep's `RunOptions.timeout_in_ms`), which the master bounds the
    /// step by, as TensorFlow's does. No per-call timer on the master's gRPC runtime: arming
    /// one there wakes another of its threads, about 15 µs a step on a two-core machine. The
    /// local wait adds the margin, so that the master's own answer, naming the step, comes
    /// first.
    InRequest(Duration),
}

/// How much longer than a step's deadline the client waits for the master's answer.
const STEP_ANSWER_MARGIN: Duration = Duration::from_secs(2);

impl Drop for RemoteSession {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking here would stall the caller's runtime; the master collects the session.
            tracing::warn!(
                target = %self.target,
                "remote session dropped inside an async context without close(); not closing \
                 it in the master"
            );
            if let Some(runtime) = self.runtime.take() {
                runtime.shutdown_background();
            }
            return;
        }
        if let Err(e) = self.close() {
            tracing::warn!(target = %self.target, error = %e, "closing the remote session failed");
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

/// `grpc://host:port` → (`host:port`, false); `grpcs://` or `https://` → (`host:port`, true)
/// (TLS); anything else is INVALID_ARGUMENT naming the target.
pub(crate) fn parse_target(target: &str) -> Result<(String, bool)> {
    let (address, tls) = if let Some(address) = target.strip_prefix("grpc://") {
        (address, false)
    } else if let Some(address) = target
        .strip_prefix("grpcs://")
        .or_else(|| target.strip_prefix("https://"))
    {
        (address, true)
    } else {
        return Err(bad_target(
            target,
            "it does not start with `grpc://` (or `grpcs://` for TLS)",
        ));
    };
    let address = address.strip_suffix('/').unwrap_or(address);
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(bad_target(target, "it has no `:port`"));
    };
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
        return Err(bad_target(
            target,
            &format!("`{host}` is not a host name or address"),
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok((address.to_string(), tls)),
        _ => Err(bad_target(
            target,
            &format!("`{port}` is not a port (1 to 65535)"),
        )),
    }
}

fn bad_target(target: &str, why: &str) -> Status {
    Status::invalid_argument(format!(
        "bad session target `{target}`: {why}; write grpc://HOST:PORT, grpcs://HOST:PORT for \
         TLS (or \"\" for an in-process session)"
    ))
}

fn unreachable(target: &str, cause: &str) -> Status {
    Status::unavailable(format!(
        "the master at {target} is unreachable: {cause}; check that the task is running and \
         the address is right"
    ))
}

fn check_open(handle: &Handle) -> Result<()> {
    if handle.closed {
        return Err(Status::failed_precondition(
            "Session is closed; create a new session to run more steps",
        ));
    }
    Ok(())
}

/// Fails with FAILED_PRECONDITION when called on a tokio runtime's thread, where blocking on
/// the session's own runtime would panic (and would stall the caller's).
fn not_in_async(what: &str) -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Status::failed_precondition(format!(
            "{what} on a remote session was called from inside an async runtime; the session \
             API blocks, so call it from a plain thread or tokio::task::spawn_blocking"
        )));
    }
    Ok(())
}

/// A nonzero random id, so a master that deduplicates retried requests can tell calls apart.
fn new_request_id() -> i64 {
    loop {
        let id = rand::random::<i64>();
        if id != 0 {
            return id;
        }
    }
}

/// The fetches to ask the master for: each tensor once, by its canonical name (`y:0` for `y`),
/// as a tensor fetched twice (two hooks reading the global step) is still one tensor; the
/// reply is matched back to every fetch by name.
fn unique_fetches(fetches: &[&str]) -> Vec<String> {
    let mut seen = std::collections::HashSet::with_capacity(fetches.len());
    fetches
        .iter()
        .map(|f| {
            TensorRef::parse(f)
                .map(|t| t.canonical())
                .unwrap_or_else(|_| f.to_string())
        })
        .filter(|f| seen.insert(f.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn targets_parse_or_name_what_is_wrong() {
        let plain = |a: &str| (a.to_string(), false);
        assert_eq!(
            parse_target("grpc://localhost:2222").unwrap(),
            plain("localhost:2222")
        );
        assert_eq!(
            parse_target("grpc://127.0.0.1:1/").unwrap(),
            plain("127.0.0.1:1")
        );
        assert_eq!(parse_target("grpc://[::1]:80").unwrap(), plain("[::1]:80"));
        assert_eq!(
            parse_target("grpcs://h:2222").unwrap(),
            ("h:2222".to_string(), true)
        );
        assert_eq!(
            parse_target("https://h:1").unwrap(),
            ("h:1".to_string(), true)
        );
        for (bad, why) in [
            ("localhost:2222", "grpc://"),
            ("http://h:1", "grpc://"),
            ("grpc://h", ":port"),
            ("grpc://h:0", "`0` is not a port"),
            ("grpc://h:70000", "`70000` is not a port"),
            ("grpc://h:x", "`x` is not a port"),
            ("grpc://:22", "not a host"),
        ] {
            let err = parse_target(bad).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{bad}");
            assert!(err.message().contains(&format!("`{bad}`")), "{err}");
            assert!(err.message().contains(why), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn connecting_inside_an_async_context_is_refused_not_a_panic() {
        let err = RemoteSession::connect("grpc://127.0.0.1:9", ConnectOptions::default())
            .err()
            .unwrap();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("spawn_blocking"), "{err}");
    }
}
