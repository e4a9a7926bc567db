//! RecvTensor throughput for 1, 16, 64 and 256 MiB float tensors, beside raw TCP on loopback
//! moving the same bytes in the same run (goals: the tensor channel at least 0.9x raw TCP, gRPC
//! at least 0.75x, and no size cliff: each path's 256 MiB rate at least 0.9x its 16 MiB rate).
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
//! ```
//!
//! Each pulls the buffer from the server side over long-lived connections, as a worker's
//! `_Recv` pulls a tensor from the producing task; the bench process is the receiving task, and
//! the calling thread blocks as an executor thread does. Only the pull is timed: the daemon's
//! RunGraph that produces the tensor and the CleanupGraph after it are not. Responses decode
//! into `Tensor`s sharing the received buffer.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tessera::cluster::TaskId;
use tessera::graph::attr::value;
use tessera::peer::{CallOptions, GrpcPeer, Peer};
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::worker_service_server::{WorkerService, WorkerServiceServer};
use tessera::proto::*;
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

/// A server answering each 8-byte length with that many bytes of `buffer`.
fn raw_server(buffer: Vec<u8>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let buffer = buffer.clone();
            thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let mut len = [0u8; 8];
                while stream.read_exact(&mut len).is_ok() {
                    let n = u64::from_le_bytes(len) as usize;
                    if stream.write_all(&buffer[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn raw_pull(stream: &mut TcpStream, into: &mut [u8]) {
    stream
        .write_all(&(into.len() as u64).to_le_bytes())
        .expect("request");
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
    fn start(rt: &Runtime) -> DaemonSource {
        let server = Server::local().expect("in-process daemon");
        let peer = {
            let _entered = rt.enter();
            GrpcPeer::connect_lazy(
                TaskId::new("localhost", 0),
                &server.local_addr().to_string(),
                Duration::from_secs(10),
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

/// The four ways of moving `n` bytes, each returning the time of the move alone.
struct Pullers {
    rt: Runtime,
    stream: TcpStream,
    into: Vec<u8>,
    daemon: DaemonSource,
    generated: WorkerServiceClient<Channel>,
}

/// The measured paths, in the order of the summary's columns.
const PATHS: [&str; 4] = [
    "raw_tcp (baseline)",
    "recv_tensor_channel",
    "recv_tensor_grpc",
    "recv_tensor_tonic_codec",
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
            _ => {
                let started = Instant::now();
                let tensor = recv_tensor_generated(&self.rt, &self.generated, n);
                let elapsed = started.elapsed();
                assert_eq!(tensor.dims(), [n / 4]);
                elapsed
            }
        }
    }
}

/// Bytes each path moves per size in the interleaved summary.
const SUMMARY_BYTES: usize = 1 << 30;

fn bench(c: &mut Criterion) {
    let largest = SIZES_MIB[SIZES_MIB.len() - 1] * MIB;
    let buffer: Vec<u8> = (0..largest).map(|i| (i % 251) as u8).collect();
    let raw_addr = raw_server(buffer.clone());
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
    let daemon = DaemonSource::start(&rt);
    let mut pullers = Pullers {
        rt,
        stream,
        into: vec![0u8; largest],
        daemon,
        generated,
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
        let [raw, channel, grpc, generated] = totals.map(gib_per_s);
        println!(
            "{mib:>5} MiB  {raw:>13.2}  {channel:>13.2}  {:>6.2}  {grpc:>10.2}  {:>6.2}  \
             {generated:>17.2}  {:>6.2}",
            channel / raw,
            grpc / raw,
            generated / raw
        );
        rates.push((mib, [raw, channel, grpc, generated]));
    }
    // A size cliff: the largest tensor moving slower than a mid-sized one.
    let rate_at = |mib: usize| rates.iter().find(|(m, _)| *m == mib).map(|(_, r)| *r);
    if let (Some(mid), Some(large)) = (rate_at(16), rate_at(256)) {
        println!(
            "256 MiB rate / 16 MiB rate (goal >= 0.90): raw TCP {:.2}, channel {:.2}, gRPC {:.2}, \
             tonic codec {:.2}",
            large[0] / mid[0],
            large[1] / mid[1],
            large[2] / mid[2],
            large[3] / mid[3]
        );
    }
    pullers.daemon.server.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
