//! A MasterService for client tests: sessions are in-process `LocalSession`s, and every
//! request is recorded, so a test can check what the remote client put on the wire and that
//! it reads replies the way TensorFlow's master writes them.
//!
//! Where the real master's behaviour is loose, this one is deliberately awkward: fetched
//! tensors come back in reverse fetch order (TensorFlow does not guarantee the order), and
//! errors go in the response body when asked (or, with `errors_in_status`, as gRPC status).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tessera::client::LocalSession;
use tessera::proto::master_service_server::{MasterService, MasterServiceServer};
use tessera::proto::*;
use tessera::tensor::Tensor;
use tessera::Status;
use tokio::sync::oneshot;
use tonic::{Request, Response};

/// One request the fake master received.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // a test's record of calls, a few at a time
pub enum Call {
    Create(CreateSessionRequest),
    Extend(ExtendSessionRequest),
    RunStep(RunStepRequest),
    MakeCallable(MakeCallableRequest),
    RunCallable(RunCallableRequest),
    ReleaseCallable(ReleaseCallableRequest),
    Close(CloseSessionRequest),
    ListDevices(ListDevicesRequest),
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, (Arc<LocalSession>, i64)>,
    next: u64,
}

#[derive(Clone, Default)]
struct Service {
    state: Arc<Mutex<State>>,
    calls: Arc<Mutex<Vec<Call>>>,
    errors_in_status: Arc<AtomicBool>,
}

/// A running fake master on `127.0.0.1:PORT`; stopped on drop.
pub struct FakeMaster {
    pub addr: SocketAddr,
    service: Service,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeMaster {
    /// Starts the fake master on an OS-chosen loopback port.
    pub fn start() -> FakeMaster {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("bound address");
        let service = Service::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = service.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("fake master runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                tonic::transport::Server::builder()
                    .add_service(MasterServiceServer::new(served))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("fake master serves");
            });
        });
        FakeMaster {
            addr,
            service,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Returns `grpc://127.0.0.1:PORT`.
    pub fn target(&self) -> String {
        format!("grpc://{}", self.addr)
    }

    /// Returns the requests received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.service.calls.lock().unwrap().clone()
    }

    /// Returns the number of sessions open in the master.
    pub fn open_sessions(&self) -> usize {
        self.service.state.lock().unwrap().sessions.len()
    }

    /// Sends step errors as gRPC status even when the client asks for them in the body.
    pub fn errors_in_status(&self, on: bool) {
        self.service.errors_in_status.store(on, Ordering::SeqCst);
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Service {
    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
    }

    fn session(&self, handle: &str) -> Result<(Arc<LocalSession>, i64), tonic::Status> {
        self.state
            .lock()
            .unwrap()
            .sessions
            .get(handle)
            .cloned()
            .ok_or_else(|| tonic::Status::not_found(format!("Session {handle} is not found")))
    }
}

#[tonic::async_trait]
impl MasterService for Service {
    async fn create_session(
        &self,
        request: Request<CreateSessionRequest>,
    ) -> Result<Response<CreateSessionResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::Create(request.clone()));
        let session = LocalSession::local();
        if let Some(graph) = &request.graph_def {
            session.extend(graph)?;
        }
        let mut state = self.state.lock().unwrap();
        state.next += 1;
        let handle = format!("{:016x}", 0xfeed_0000 + state.next);
        state
            .sessions
            .insert(handle.clone(), (Arc::new(session), 0));
        Ok(Response::new(CreateSessionResponse {
            session_handle: handle,
            graph_version: 0,
        }))
    }

    async fn extend_session(
        &self,
        request: Request<ExtendSessionRequest>,
    ) -> Result<Response<ExtendSessionResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::Extend(request.clone()));
        let (session, version) = self.session(&request.session_handle)?;
        if version != request.current_graph_version {
            return Err(tonic::Status::aborted(format!(
                "Current version is {version} but caller expected {}.",
                request.current_graph_version
            )));
        }
        session.extend(&request.graph_def.unwrap_or_default())?;
        let new_version = version + 1;
        self.state
            .lock()
            .unwrap()
            .sessions
            .insert(request.session_handle, (session, new_version));
        Ok(Response::new(ExtendSessionResponse {
            new_graph_version: new_version,
        }))
    }

    async fn partial_run_setup(
        &self,
        _request: Request<PartialRunSetupRequest>,
    ) -> Result<Response<PartialRunSetupResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("PartialRunSetup"))
    }

    async fn run_step(
        &self,
        request: Request<RunStepRequest>,
    ) -> Result<Response<RunStepResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::RunStep(request.clone()));
        let (session, _) = self.session(&request.session_handle)?;
        let step = || -> Result<Vec<NamedTensorProto>, Status> {
            let mut feeds = Vec::new();
            for named in &request.feed {
                feeds.push(Tensor::from_named_proto(named)?);
            }
            let feeds: Vec<(&str, Tensor)> =
                feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let fetches: Vec<&str> = request.fetch.iter().map(String::as_str).collect();
            let targets: Vec<&str> = request.target.iter().map(String::as_str).collect();
            let fetched = session.run(&feeds, &fetches, &targets)?;
            // Reverse order: clients must match fetches by name.
            Ok(fetches
                .iter()
                .zip(&fetched)
                .rev()
                .map(|(name, t)| t.to_named_proto(*name))
                .collect())
        };
        match step() {
            Ok(tensor) => Ok(Response::new(RunStepResponse {
                tensor,
                ..Default::default()
            })),
            Err(status)
                if request.store_errors_in_response_body
                    && !self.errors_in_status.load(Ordering::SeqCst) =>
            {
                Ok(Response::new(RunStepResponse {
                    status_code: status.code() as i32,
                    status_error_message: status.message().to_string(),
                    ..Default::default()
                }))
            }
            Err(status) => Err(status.into()),
        }
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::Close(request.clone()));
        let removed = self
            .state
            .lock()
            .unwrap()
            .sessions
            .remove(&request.session_handle);
        let (session, _) = removed.ok_or_else(|| {
            tonic::Status::not_found(format!("Session {} is not found", request.session_handle))
        })?;
        session.close()?;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn list_devices(
        &self,
        request: Request<ListDevicesRequest>,
    ) -> Result<Response<ListDevicesResponse>, tonic::Status> {
        self.record(Call::ListDevices(request.into_inner()));
        Ok(Response::new(ListDevicesResponse {
            local_device: vec![DeviceAttributes {
                name: "/job:localhost/replica:0/task:0/device:CPU:0".into(),
                device_type: "CPU".into(),
                incarnation: 7,
                ..Default::default()
            }],
            remote_device: Vec::new(),
        }))
    }

    async fn reset(
        &self,
        _request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, tonic::Status> {
        Ok(Response::new(ResetResponse {}))
    }

    async fn make_callable(
        &self,
        request: Request<MakeCallableRequest>,
    ) -> Result<Response<MakeCallableResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::MakeCallable(request.clone()));
        let (session, _) = self.session(&request.session_handle)?;
        let handle = session.make_callable(request.options.unwrap_or_default())?;
        Ok(Response::new(MakeCallableResponse { handle }))
    }

    async fn run_callable(
        &self,
        request: Request<RunCallableRequest>,
    ) -> Result<Response<RunCallableResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::RunCallable(request.clone()));
        let (session, _) = self.session(&request.session_handle)?;
        let mut feeds = Vec::new();
        for proto in &request.feed {
            feeds.push(Tensor::from_proto(proto)?);
        }
        let fetched = session.run_callable(request.handle, feeds)?;
        Ok(Response::new(RunCallableResponse {
            fetch: fetched.iter().map(Tensor::to_proto).collect(),
            metadata: None,
        }))
    }

    async fn release_callable(
        &self,
        request: Request<ReleaseCallableRequest>,
    ) -> Result<Response<ReleaseCallableResponse>, tonic::Status> {
        let request = request.into_inner();
        self.record(Call::ReleaseCallable(request.clone()));
        let (session, _) = self.session(&request.session_handle)?;
        session.release_callable(request.handle)?;
        Ok(Response::new(ReleaseCallableResponse {}))
    }
}
