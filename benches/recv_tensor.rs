//! RecvTensor throughput for 1, 16, 64 and 256 MiB float tensors, beside raw TCP on loopback
//! moving the same bytes in the same run (goals: the tensor channel at least 0.9x raw TCP, gRPC
//! at least 0.75x, and no size cliff: each path's 256 MiB rate at least 0.9x its 16 MiB rate);
//! and RecvTensor from a daemon serving mutual TLS beside a raw TLS stream (rustls, the same
//! certificates, the same ring provider as tonic's) moving the same bytes (goal: at least 0.75x).
//!
//! ```text
//! raw TCP:    client ── 8-byte length ──► server ── N bytes ──► client (read_exact)
//! daemon:     RunGraph(step k): Const ─► _Send  (the tensor waits in the daemon's rendezvous)
//!   channel:  TensorChannel ── RecvTensor(step k, key) ──► daemon's port ── head, content ──►
//!             Tensor (what a worker's _Recv does between tessera tasks in plain text)
//!   gRPC:     GrpcPeer ── RecvTensor ──► daemon ── tensor_content ──► Tensor (what it does
//!             with TLS or a TensorFlow task)
//! tonic:      tonic's generated client ── RecvTensor ──► tonic's generated server answering a
//!             prebuilt tensor (prost encoding into tonic's buffers: the path before `wire`)
//!
//! raw TLS:    rustls client ══ 8-byte length ══► rustls server ══ N bytes ══► client
//!             (read_exact out of rustls's plaintext buffer)
//! TLS daemon: the daemon's graphs as above, served with `[tls]` (mTLS, certificates made by
//!             rcgen at start); GrpcPeer with the cluster's CA and a client certificate ──
//!             RecvTensor over HTTP/2 over TLS ──► Tensor (the tensor channel is plain text
//!             only, so a TLS cluster's tensors take this path)
//! ```
//!
//! Each pulls the buffer from the server side over long-lived connections, as a worker's
//! `_Recv` pulls a tensor from the producing task; the bench process is the receiving task, and
//! the calling thread blocks as an executor thread does. Only the pull is timed: the daemon's
//! RunGraph that produces the tensor and the CleanupGraph after it are not. Responses decode
//! into `Tensor`s sharing the received buffer.

#[path = "../tests/support/certs.rs"]
#[allow(dead_code)]
mod certs;
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use support::raw_tcp::{raw_pull, raw_server};
use tessera::cluster::{TaskConfig, TaskId};
use tessera::graph::attr::value;
use tessera::peer::{CallOptions, GrpcPeer, Peer};
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::worker_service_server::{WorkerService, WorkerServiceServer};
use tessera::proto::*;
use tessera::security::{Security, TlsConfig};
use tessera::server::Server;
use tessera::tensor::{DType, Tensor};
use tessera::wire::channel::ChannelLimit;
use tessera::wire::{server_builder, tune_endpoint, MAX_MESSAGE_BYTES};
use tokio::runtime::Runtime;
use tonic::transport::Channel;
use tonic::{Request, Response};

const MIB: usize = 1 << 20;
const SIZES_MIB: [usize; 4] = [1, 16, 64, 256];

// ---------------------------------------------------------------------------------------------
// Raw TCP baseline.

// ---------------------------------------------------------------------------------------------
// Raw TLS baseline: the raw TCP exchange inside a rustls session, with the daemon's certificates.

/// What both TLS paths share: the CA and the certificates it signed, as files (for the daemon
/// and its peer) and as rustls's configurations (for the raw stream).
struct TlsMaterial {
    _pki: certs::Pki,
    /// The daemon's `[tls]`: its certificate, its key, the CA; mutual TLS.
    task: TlsConfig,
    /// The receiving side's: the CA and a client certificate.
    client: TlsConfig,
    raw_server: Arc<rustls::ServerConfig>,
    raw_client: Arc<rustls::ClientConfig>,
}

fn pem_certificates(path: &std::path::Path) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).expect("read a certificate file");
    rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

fn pem_key(path: &std::path::Path) -> rustls::pki_types::PrivateKeyDer<'static> {
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).expect("read a key file");
    rustls::pki_types::PrivateKeyDer::from_pem_slice(&pem).expect("a PEM private key")
}

impl TlsMaterial {
    fn new() -> TlsMaterial {
        let pki = certs::Pki::new("bench");
        let task_leaf = pki.leaf("task");
        let client_leaf = pki.leaf("receiver");
        let task = TlsConfig::from_files(&task_leaf.cert, &task_leaf.key, &pki.ca)
            .expect("the task's TLS files");
        let client = pki.client(Some(&client_leaf));

        // The provider tonic's `tls-ring` uses, with rustls's default suites and versions.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in pem_certificates(&pki.ca) {
            roots.add(ca).expect("the CA as a root");
        }
        let roots = Arc::new(roots);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .expect("client verifier");
        let raw_server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(pem_certificates(&task_leaf.cert), pem_key(&task_leaf.key))
            .expect("server certificate");
        let raw_client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(
                pem_certificates(&client_leaf.cert),
                pem_key(&client_leaf.key),
            )
            .expect("client certificate");
        TlsMaterial {
            _pki: pki,
            task,
            client,
            raw_server: Arc::new(raw_server),
            raw_client: Arc::new(raw_client),
        }
    }
}

type RawTlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A rustls server answering each 8-byte length with that many bytes of `buffer`.
fn raw_tls_server(buffer: Vec<u8>, config: Arc<rustls::ServerConfig>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let buffer = buffer.clone();
            let config = Arc::clone(&config);
            thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(600)));
                let Ok(connection) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut len = [0u8; 8];
                while tls.read_exact(&mut len).is_ok() {
                    let n = u64::from_le_bytes(len) as usize;
                    if tls.write_all(&buffer[..n]).is_err() || tls.flush().is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Connects to the raw TLS server and finishes the handshake (a first 0-byte exchange).
fn raw_tls_connect(addr: std::net::SocketAddr, config: Arc<rustls::ClientConfig>) -> RawTlsStream {
    let stream = TcpStream::connect(addr).expect("connect raw TLS");
    stream.set_nodelay(true).expect("nodelay");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let connection = rustls::ClientConnection::new(config, name).expect("TLS client");
    let mut tls = rustls::StreamOwned::new(connection, stream);
    raw_tls_pull(&mut tls, &mut []);
    tls
}

fn raw_tls_pull(stream: &mut RawTlsStream, into: &mut [u8]) {
    stream
        .write_all(&(into.len() as u64).to_le_bytes())
        .expect("request");
    stream.flush().expect("request");
    stream.read_exact(into).expect("response");
}

// ---------------------------------------------------------------------------------------------
// RecvTensor over tonic.

/// A WorkerService answering RecvTensor with a prebuilt float tensor of the requested size
/// (the size travels in the key: `...;<bytes>`); every other RPC is UNIMPLEMENTED.
struct BenchWorker {
    /// The largest tensor; smaller ones are slices of it (sharing the buffer).
    content: bytes::Bytes,
}

#[tonic::async_trait]
impl WorkerService for BenchWorker {
    async fn recv_tensor(
        &self,
        request: Request<RecvTensorRequest>,
    ) -> Result<Response<RecvTensorResponse>, tonic::Status> {
        let key = request.into_inner().rendezvous_key;
        let bytes: usize = key
            .rsplit(';')
            .next()
            .and_then(|n| n.parse().ok())
            .filter(|&n| n <= self.content.len() && n % 4 == 0)
            .ok_or_else(|| tonic::Status::invalid_argument(format!("bad bench key {key}")))?;
        let tensor = TensorProto {
            dtype: DataType::DtFloat as i32,
            tensor_shape: Some(TensorShapeProto {
                dim: vec![tensor_shape_proto::Dim {
                    size: (bytes / 4) as i64,
                    name: String::new(),
                }],
                unknown_rank: false,
            }),
            tensor_content: self.content.slice(..bytes),
            ..Default::default()
        };
        Ok(Response::new(RecvTensorResponse {
            tensor: Some(tensor),
            send_start_micros: 1,
            ..Default::default()
        }))
    }

    async fn get_status(
        &self,
        _request: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("get_status"))
    }

    async fn create_worker_session(
        &self,
        _request: Request<CreateWorkerSessionRequest>,
    ) -> Result<Response<CreateWorkerSessionResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("create_worker_session"))
    }

    async fn delete_worker_session(
        &self,
        _request: Request<DeleteWorkerSessionRequest>,
    ) -> Result<Response<DeleteWorkerSessionResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("delete_worker_session"))
    }

    async fn register_graph(
        &self,
        _request: Request<RegisterGraphRequest>,
    ) -> Result<Response<RegisterGraphResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("register_graph"))
    }

    async fn deregister_graph(
        &self,
        _request: Request<DeregisterGraphRequest>,
    ) -> Result<Response<DeregisterGraphResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("deregister_graph"))
    }

    async fn run_graph(
        &self,
        _request: Request<RunGraphRequest>,
    ) -> Result<Response<RunGraphResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("run_graph"))
    }

    async fn cleanup_graph(
        &self,
        _request: Request<CleanupGraphRequest>,
    ) -> Result<Response<CleanupGraphResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("cleanup_graph"))
    }

    async fn cleanup_all(
        &self,
        _request: Request<CleanupAllRequest>,
    ) -> Result<Response<CleanupAllResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("cleanup_all"))
    }

    async fn mark_recv_finished(
        &self,
        _request: Request<MarkRecvFinishedRequest>,
    ) -> Result<Response<MarkRecvFinishedResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("mark_recv_finished"))
    }

    async fn logging(
        &self,
        _request: Request<LoggingRequest>,
    ) -> Result<Response<LoggingResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("logging"))
    }

    async fn tracing(
        &self,
        _request: Request<TracingRequest>,
    ) -> Result<Response<TracingResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("tracing"))
    }

    async fn recv_buf(
        &self,
        _request: Request<RecvBufRequest>,
    ) -> Result<Response<RecvBufResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("recv_buf"))
    }

    async fn complete_group(
        &self,
        _request: Request<CompleteGroupRequest>,
    ) -> Result<Response<CompleteGroupResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("complete_group"))
    }

    async fn complete_instance(
        &self,
        _request: Request<CompleteInstanceRequest>,
    ) -> Result<Response<CompleteInstanceResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("complete_instance"))
    }

    async fn get_step_sequence(
        &self,
        _request: Request<GetStepSequenceRequest>,
    ) -> Result<Response<GetStepSequenceResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("get_step_sequence"))
    }
}

/// Serves `BenchWorker` through tonic's generated server on its own runtime thread, with the
/// daemon's transport settings.
fn tonic_server(content: bytes::Bytes) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let worker = WorkerServiceServer::new(BenchWorker { content })
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            server_builder()
                .add_service(worker)
                .serve_with_incoming(incoming)
                .await
                .expect("bench server");
        });
    });
    addr
}

fn bench_request(bytes: usize) -> RecvTensorRequest {
    RecvTensorRequest {
        step_id: 1,
        rendezvous_key: format!(
            "/job:a/replica:0/task:0/device:CPU:0;0000000000000001;\
             /job:b/replica:0/task:0/device:CPU:0;edge_1_x;0:0;{bytes}"
        ),
        ..Default::default()
    }
}

/// RecvTensor through tonic's generated client and codec (the reference path).
fn recv_tensor_generated(
    rt: &Runtime,
    client: &WorkerServiceClient<Channel>,
    bytes: usize,
) -> Tensor {
    let mut client = client.clone();
    let response = rt
        .block_on(client.recv_tensor(bench_request(bytes)))
        .expect("RecvTensor")
        .into_inner();
    Tensor::from_proto(response.tensor.as_ref().expect("a tensor")).expect("decodes")
}

/// The daemon's side: for each size, a registered graph `Const (N bytes) ─► _Send` to the
/// bench process (`/job:localhost/replica:0/task:1`), run once per pull.
struct DaemonSource {
    server: Server,
    peer: GrpcPeer,
    /// (bytes, graph handle, rendezvous key) per size.
    graphs: Vec<(usize, String, String)>,
    next_step: i64,
}

const DAEMON_CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";
const BENCH_CPU: &str = "/job:localhost/replica:0/task:1/device:CPU:0";

fn call_options() -> CallOptions {
    CallOptions::timeout(Duration::from_secs(60))
}

impl DaemonSource {
    /// Starts the daemon, serving plain text or (with `tls`) mutual TLS, and registers its
    /// graphs through a peer that speaks the same.
    fn start(rt: &Runtime, tls: Option<&TlsMaterial>) -> DaemonSource {
        let mut config = TaskConfig::local();
        config.security.tls = tls.map(|t| t.task.clone());
        let server = Server::start(config).expect("in-process daemon");
        let security = Security {
            tls: tls.map(|t| t.client.clone()),
            token: None,
        };
        let peer = {
            let _entered = rt.enter();
            GrpcPeer::connect_lazy_with(
                TaskId::new("localhost", 0),
                &server.local_addr().to_string(),
                Duration::from_secs(10),
                &security,
            )
            .expect("peer")
        };
        let status = rt
            .block_on(peer.get_status(GetStatusRequest {}, call_options()))
            .expect("GetStatus");
        let incarnation = status
            .device_attributes
            .iter()
            .find(|d| d.name == DAEMON_CPU)
            .expect("the daemon's CPU:0")
            .incarnation;
        let mut graphs = Vec::new();
        for mib in SIZES_MIB {
            let bytes = mib * MIB;
            let value = Tensor::from_vec(vec![bytes / 4], vec![0.5f32; bytes / 4]).expect("fits");
            let edge = format!("edge_{mib}_c");
            let constant = NodeDef {
                name: format!("c{mib}"),
                op: "Const".into(),
                device: DAEMON_CPU.into(),
                attr: [
                    ("dtype".to_string(), value::dtype(DType::Float)),
                    ("value".to_string(), value::tensor(value.to_proto())),
                ]
                .into(),
                ..Default::default()
            };
            let send = NodeDef {
                name: format!("c{mib}/_send"),
                op: "_Send".into(),
                device: DAEMON_CPU.into(),
                input: vec![format!("c{mib}")],
                attr: [
                    ("T".to_string(), value::dtype(DType::Float)),
                    ("send_device".to_string(), value::string(DAEMON_CPU)),
                    (
                        "send_device_incarnation".to_string(),
                        value::int(incarnation as i64),
                    ),
                    ("recv_device".to_string(), value::string(BENCH_CPU)),
                    ("tensor_name".to_string(), value::string(&edge)),
                    ("client_terminated".to_string(), value::bool(false)),
                ]
                .into(),
                ..Default::default()
            };
            let registered = rt
                .block_on(peer.register_graph(
                    RegisterGraphRequest {
                        graph_def: Some(GraphDef {
                            node: vec![constant, send],
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    call_options(),
                ))
                .expect("RegisterGraph");
            let key = format!("{DAEMON_CPU};{incarnation:016x};{BENCH_CPU};{edge};0:0");
            graphs.push((bytes, registered.graph_handle, key));
        }
        DaemonSource {
            server,
            peer,
            graphs,
            next_step: 1,
        }
    }

    /// Runs the graph for `bytes` and pulls its tensor, over the tensor channel or gRPC;
    /// returns the time of the pull alone.
    fn pull(&mut self, rt: &Runtime, bytes: usize, over_channel: bool) -> Duration {
        let (_, handle, key) = self
            .graphs
            .iter()
            .find(|g| g.0 == bytes)
            .expect("a graph of this size");
        let step_id = self.next_step;
        self.next_step += 1;
        let ran = rt
            .block_on(self.peer.run_graph(
                RunGraphRequest {
                    graph_handle: handle.clone(),
                    step_id,
                    ..Default::default()
                },
                call_options(),
            ))
            .expect("RunGraph");
        assert_eq!(ran.status_code, 0, "{}", ran.status_error_message);
        let request = RecvTensorRequest {
            step_id,
            rendezvous_key: key.clone(),
            ..Default::default()
        };
        let started = Instant::now();
        let response = if over_channel {
            let channel = self
                .peer
                .tensor_channel()
                .expect("a plain-text peer has one");
            let deadline = Instant::now() + Duration::from_secs(60);
            channel
                .recv_tensor(&request, deadline, ChannelLimit::NONE, &|| None)
                .expect("the daemon speaks the tensor channel")
                .expect("RecvTensor")
        } else {
            rt.block_on(self.peer.recv_tensor(request, call_options()))
                .expect("RecvTensor")
        };
        let tensor =
            Tensor::from_proto(response.tensor.as_ref().expect("a tensor")).expect("decodes");
        let elapsed = started.elapsed();
        assert_eq!(tensor.dims(), [bytes / 4]);
        rt.block_on(
            self.peer
                .cleanup_graph(CleanupGraphRequest { step_id }, call_options()),
        )
        .expect("CleanupGraph");
        elapsed
    }
}

/// The six ways of moving `n` bytes, each returning the time of the move alone.
struct Pullers {
    rt: Runtime,
    stream: TcpStream,
    into: Vec<u8>,
    daemon: DaemonSource,
    generated: WorkerServiceClient<Channel>,
    tls_stream: RawTlsStream,
    tls_daemon: DaemonSource,
}

/// The measured paths, in the order of the summaries' columns.
const PATHS: [&str; 6] = [
    "raw_tcp (baseline)",
    "recv_tensor_channel",
    "recv_tensor_grpc",
    "recv_tensor_tonic_codec",
    "raw_tls (baseline)",
    "recv_tensor_grpc_tls",
];

impl Pullers {
    fn pull(&mut self, path: usize, n: usize) -> Duration {
        match path {
            0 => {
                let started = Instant::now();
                raw_pull(&mut self.stream, &mut self.into[..n]);
                started.elapsed()
            }
            1 => self.daemon.pull(&self.rt, n, true),
            2 => self.daemon.pull(&self.rt, n, false),
            3 => {
                let started = Instant::now();
                let tensor = recv_tensor_generated(&self.rt, &self.generated, n);
                let elapsed = started.elapsed();
                assert_eq!(tensor.dims(), [n / 4]);
                elapsed
            }
            4 => {
                let started = Instant::now();
                raw_tls_pull(&mut self.tls_stream, &mut self.into[..n]);
                started.elapsed()
            }
            _ => self.tls_daemon.pull(&self.rt, n, false),
        }
    }
}

/// Bytes each path moves per size in the interleaved summary.
const SUMMARY_BYTES: usize = 1 << 30;

fn bench(c: &mut Criterion) {
    let largest = SIZES_MIB[SIZES_MIB.len() - 1] * MIB;
    let buffer: Vec<u8> = (0..largest).map(|i| (i % 251) as u8).collect();
    let tls = TlsMaterial::new();
    let raw_addr = raw_server(buffer.clone());
    let raw_tls_addr = raw_tls_server(buffer.clone(), Arc::clone(&tls.raw_server));
    let generated_addr = tonic_server(bytes::Bytes::from(buffer));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    let generated = {
        let _entered = rt.enter();
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{generated_addr}"))
            .expect("uri");
        WorkerServiceClient::new(tune_endpoint(endpoint).connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    };
    let stream = TcpStream::connect(raw_addr).expect("connect raw");
    stream.set_nodelay(true).expect("nodelay");
    let daemon = DaemonSource::start(&rt, None);
    let tls_daemon = DaemonSource::start(&rt, Some(&tls));
    assert!(
        tls_daemon.peer.tensor_channel().is_none(),
        "a TLS peer has no plain-text tensor channel"
    );
    let tls_stream = raw_tls_connect(raw_tls_addr, Arc::clone(&tls.raw_client));
    let suite = tls_stream
        .conn
        .negotiated_cipher_suite()
        .map(|s| format!("{:?}", s.suite()))
        .unwrap_or_default();
    println!("raw TLS baseline: {suite} (rustls, ring provider, mutual TLS)");
    let mut pullers = Pullers {
        rt,
        stream,
        into: vec![0u8; largest],
        daemon,
        generated,
        tls_stream,
        tls_daemon,
    };

    let mut group = c.benchmark_group("recv_tensor");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for mib in SIZES_MIB {
        let bytes = mib * MIB;
        group.throughput(Throughput::Bytes(bytes as u64));
        for (path, name) in PATHS.iter().enumerate() {
            group.bench_with_input(BenchmarkId::new(*name, mib), &bytes, |b, &n| {
                b.iter_custom(|iters| (0..iters).map(|_| pullers.pull(path, n)).sum())
            });
        }
    }
    group.finish();

    // The ratios come from a separate pass that alternates the paths pull by pull, so that
    // load from other processes on the machine falls on all of them alike (criterion measures
    // one path for seconds, then the next).
    println!(
        "\nRecvTensor vs raw TCP on loopback (interleaved, {} MiB per path and size; \
         goals: channel ratio >= 0.90, gRPC ratio >= 0.75)",
        SUMMARY_BYTES / MIB
    );
    println!(
        "{:>8}  {:>13}  {:>13}  {:>6}  {:>10}  {:>6}  {:>17}  {:>6}",
        "size",
        "raw TCP GiB/s",
        "channel GiB/s",
        "ratio",
        "gRPC GiB/s",
        "ratio",
        "tonic codec GiB/s",
        "ratio"
    );
    let mut rates = Vec::new();
    for mib in SIZES_MIB {
        let n = mib * MIB;
        let rounds = (SUMMARY_BYTES / n).max(4);
        let mut totals = [Duration::ZERO; PATHS.len()];
        for round in 0..rounds {
            // Rotate which path goes first, so none always runs on a cold cache or socket.
            for k in 0..PATHS.len() {
                let path = (round + k) % PATHS.len();
                totals[path] += pullers.pull(path, n);
            }
        }
        let gib_per_s = |t: Duration| (n * rounds) as f64 / t.as_secs_f64() / (1u64 << 30) as f64;
        let [raw, channel, grpc, generated, raw_tls, grpc_tls] = totals.map(gib_per_s);
        println!(
            "{mib:>5} MiB  {raw:>13.2}  {channel:>13.2}  {:>6.2}  {grpc:>10.2}  {:>6.2}  \
             {generated:>17.2}  {:>6.2}",
            channel / raw,
            grpc / raw,
            generated / raw
        );
        rates.push((mib, [raw, channel, grpc, generated, raw_tls, grpc_tls]));
    }
    // The TLS pulls alternated with the others above; their table is printed apart.
    println!(
        "\nRecvTensor from a daemon serving mutual TLS vs a raw TLS stream (same run, \
         interleaved; goal: ratio >= 0.75)"
    );
    println!(
        "{:>8}  {:>13}  {:>14}  {:>6}  {:>6}",
        "size", "raw TLS GiB/s", "TLS gRPC GiB/s", "ratio", "goal"
    );
    for (mib, rate) in &rates {
        let (raw_tls, grpc_tls) = (rate[4], rate[5]);
        let verdict = if grpc_tls / raw_tls >= 0.75 {
            "met"
        } else {
            "missed"
        };
        println!(
            "{mib:>5} MiB  {raw_tls:>13.2}  {grpc_tls:>14.2}  {:>6.3}  {verdict:>6}",
            grpc_tls / raw_tls
        );
    }
    // A size cliff: the largest tensor moving slower than a mid-sized one.
    let rate_at = |mib: usize| rates.iter().find(|(m, _)| *m == mib).map(|(_, r)| *r);
    if let (Some(mid), Some(large)) = (rate_at(16), rate_at(256)) {
        println!(
            "256 MiB rate / 16 MiB rate (goal >= 0.90): raw TCP {:.2}, channel {:.2}, gRPC {:.2}, \
             tonic codec {:.2}, raw TLS {:.2}, TLS gRPC {:.2}",
            large[0] / mid[0],
            large[1] / mid[1],
            large[2] / mid[2],
            large[3] / mid[3],
            large[4] / mid[4],
            large[5] / mid[5]
        );
    }
    pullers.daemon.server.stop();
    pullers.tls_daemon.server.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
