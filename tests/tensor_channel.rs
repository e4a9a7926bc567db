//! The tensor channel (`tessera::wire::channel`): RecvTensor over plain TCP on a daemon's own
//! port, beside gRPC.
//!
//! A daemon (`Server`, 127.0.0.1:0) holds `Const ─► _Send` graphs registered by hand, as a
//! master would; this process pulls their tensors as another task's `_Recv` does, through the
//! `GrpcPeer`'s channel. Shown here:
//! - tensors arrive bit for bit (floats, and strings, which travel without a content), into a
//!   buffer aligned for their elements, over reused connections, before or after their step;
//! - errors keep their code and name the task; the deadline and a stopped step end a pull, and
//!   the sending side stops waiting for the tensor (its call is dropped) with the deadline sent;
//! - the cluster token is required; TLS turns the channel off on both sides; a task that does
//!   not speak it (TensorFlow) makes calls go over gRPC, without retrying each call;
//! - malformed requests are answered INVALID_ARGUMENT, and neither they nor a connection that
//!   stalls in its first bytes stop the port serving gRPC.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::certs::Pki;
use crate::support::worker_service::{recv_tensor_worker, worker_service};
use tessera::cluster::{TaskConfig, TaskId};
use tessera::graph::attr::value;
use tessera::peer::{CallOptions, GrpcPeer, Peer};
use tessera::proto::worker_service_server::WorkerService;
use tessera::proto::*;
use tessera::security::{ClusterToken, Security};
use tessera::server::Server;
use tessera::tensor::{DType, Tensor};
use tessera::wire::channel::{
    hello, incoming, ChannelConfig, ChannelLimit, TensorChannel, ANSWER_HEAD_BYTES,
    RESPONSE_HEAD_BYTES,
};
use tessera::Code;
use tokio::runtime::Runtime;
use tonic::{Request, Response};

const DAEMON_CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";
const PULLER_CPU: &str = "/job:localhost/replica:0/task:1/device:CPU:0";
const TOKEN: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// Deadline of every call and socket wait that should succeed.
const PATIENCE: Duration = Duration::from_secs(20);

/// A daemon and a peer of it, with the runtime the peer's gRPC calls run on.
struct Daemon {
    server: Server,
    rt: Runtime,
    peer: GrpcPeer,
    incarnation: u64,
}

impl Daemon {
    fn start(security: Security) -> Daemon {
        let config = TaskConfig {
            security: security.clone(),
            ..TaskConfig::local()
        };
        let server = Server::start(config).expect("daemon starts");
        let rt = Runtime::new().expect("runtime");
        let peer = {
            let _entered = rt.enter();
            GrpcPeer::connect_lazy_with(
                TaskId::new("localhost", 0),
                &server.local_addr().to_string(),
                PATIENCE,
                &security,
            )
            .expect("peer")
        };
        let status = rt
            .block_on(peer.get_status(GetStatusRequest {}, CallOptions::timeout(PATIENCE)))
            .expect("GetStatus");
        let incarnation = status
            .device_attributes
            .iter()
            .find(|d| d.name == DAEMON_CPU)
            .expect("the daemon's CPU:0")
            .incarnation;
        Daemon {
            server,
            rt,
            peer,
            incarnation,
        }
    }

    fn channel(&self) -> &TensorChannel {
        self.peer
            .tensor_channel()
            .expect("a plain-text peer has a channel")
    }

    /// Registers `Const(value) ─► _Send` on edge `edge`; returns the graph's handle and the
    /// rendezvous key its tensor is sent under.
    fn register(&self, edge: &str, value: &Tensor) -> (String, String) {
        let constant = NodeDef {
            name: format!("{edge}/c"),
            op: "Const".into(),
            device: DAEMON_CPU.into(),
            attr: [
                ("dtype".to_string(), value::dtype(value.dtype())),
                ("value".to_string(), value::tensor(value.to_proto())),
            ]
            .into(),
            ..Default::default()
        };
        let send = NodeDef {
            name: format!("{edge}/send"),
            op: "_Send".into(),
            device: DAEMON_CPU.into(),
            input: vec![constant.name.clone()],
            attr: [
                ("T".to_string(), value::dtype(value.dtype())),
                ("send_device".to_string(), value::string(DAEMON_CPU)),
                (
                    "send_device_incarnation".to_string(),
                    value::int(self.incarnation as i64),
                ),
                ("recv_device".to_string(), value::string(PULLER_CPU)),
                ("tensor_name".to_string(), value::string(edge)),
                ("client_terminated".to_string(), value::bool(false)),
            ]
            .into(),
            ..Default::default()
        };
        let registered = self
            .rt
            .block_on(self.peer.register_graph(
                RegisterGraphRequest {
                    graph_def: Some(GraphDef {
                        node: vec![constant, send],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                CallOptions::timeout(PATIENCE),
            ))
            .expect("RegisterGraph");
        let key = self.key(self.incarnation, edge);
        (registered.graph_handle, key)
    }

    fn key(&self, incarnation: u64, edge: &str) -> String {
        format!("{DAEMON_CPU};{incarnation:016x};{PULLER_CPU};{edge};0:0")
    }

    fn run(&self, handle: &str, step_id: i64) {
        let ran = self
            .rt
            .block_on(self.peer.run_graph(
                RunGraphRequest {
                    graph_handle: handle.to_string(),
                    step_id,
                    ..Default::default()
                },
                CallOptions::timeout(PATIENCE),
            ))
            .expect("RunGraph");
        assert_eq!(ran.status_code, 0, "{}", ran.status_error_message);
    }

    /// Whether the port still answers gRPC.
    fn serves_grpc(&self) -> bool {
        self.rt
            .block_on(
                self.peer
                    .get_status(GetStatusRequest {}, CallOptions::timeout(PATIENCE)),
            )
            .is_ok()
    }
}

fn request(step_id: i64, key: &str) -> RecvTensorRequest {
    RecvTensorRequest {
        step_id,
        rendezvous_key: key.to_string(),
        ..Default::default()
    }
}

fn in_a_while() -> Instant {
    Instant::now() + PATIENCE
}

fn never_stopped() -> Option<tessera::Status> {
    None
}

/// Pulls over `channel`, which must carry the call.
fn pull(channel: &TensorChannel, step_id: i64, key: &str) -> tessera::Result<Tensor> {
    let response = channel
        .recv_tensor(
            &request(step_id, key),
            in_a_while(),
            ChannelLimit::NONE,
            &never_stopped,
        )
        .expect("the channel carries the call")?;
    Tensor::from_proto(response.tensor.as_ref().expect("a tensor"))
}

#[test]
fn tensors_cross_bit_for_bit_into_aligned_buffers_over_reused_connections() {
    let daemon = Daemon::start(Security::plain());
    // Bit patterns a conversion would disturb: a NaN payload, -0.0, subnormals.
    let bits: Vec<f32> = (0..300_000u32)
        .map(|i| {
            let bits = i.wrapping_mul(2_654_435_761);
            // Every seventh a quiet NaN with a payload.
            f32::from_bits(if i % 7 == 0 { bits | 0x7fc0_0001 } else { bits })
        })
        .collect();
    let floats = Tensor::from_vec(vec![300, 1000], bits).unwrap();
    let words = Tensor::from_strings(
        vec![3],
        vec![
            bytes::Bytes::from_static(b"ps"),
            bytes::Bytes::new(),
            bytes::Bytes::from_static(&[0xff, 0, 7]),
        ],
    )
    .unwrap();
    let (float_graph, float_key) = daemon.register("edge_1_f", &floats);
    let (word_graph, word_key) = daemon.register("edge_2_s", &words);
    for step in 1..=3 {
        daemon.run(&float_graph, step);
        daemon.run(&word_graph, step);
        let got = pull(daemon.channel(), step, &float_key).unwrap();
        assert_eq!(got.dims(), [300, 1000]);
        let content = got.bytes().expect("floats have a content");
        assert_eq!(content, floats.bytes().unwrap(), "step {step}");
        assert_eq!(content.as_ptr() as usize % 64, 0, "content is aligned");
        let got = pull(daemon.channel(), step, &word_key).unwrap();
        assert_eq!(got.dtype(), DType::String);
        assert_eq!(
            got.strings().unwrap(),
            words.strings().unwrap(),
            "step {step}"
        );
    }
    // Six pulls, one after another: one connection did them all.
    assert_eq!(daemon.channel().idle_connections(), 1);
    daemon.server.stop();
}

#[test]
fn a_pull_made_before_its_step_runs_waits_for_the_tensor() {
    let daemon = Arc::new(Daemon::start(Security::plain()));
    let value = Tensor::from_vec(vec![4], vec![1.5f32, -2.0, 3.25, 0.0]).unwrap();
    let (graph, key) = daemon.register("edge_3_early", &value);
    let puller = {
        let daemon = Arc::clone(&daemon);
        std::thread::spawn(move || pull(daemon.channel(), 7, &key))
    };
    // The pull is on its way (or already waiting on the daemon) when the step runs.
    daemon.run(&graph, 7);
    let got = puller.join().unwrap().unwrap();
    assert_eq!(
        got.values::<f32>().unwrap().to_vec(),
        [1.5, -2.0, 3.25, 0.0]
    );
    daemon.server.stop();
}

#[test]
fn errors_keep_their_code_and_name_the_task_and_the_connection_serves_on() {
    let daemon = Daemon::start(Security::plain());
    let value = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
    let (graph, key) = daemon.register("edge_4_x", &value);
    // A key from an earlier incarnation of the daemon: ABORTED, as over gRPC.
    let stale = daemon.key(daemon.incarnation ^ 1, "edge_4_x");
    let err = pull(daemon.channel(), 1, &stale).unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err}");
    let named = format!(
        "RecvTensor on /job:localhost/replica:0/task:0 at {}",
        daemon.server.local_addr()
    );
    assert!(err.message().starts_with(&named), "{err}");
    // The same (idle) connection carries the next call.
    daemon.run(&graph, 2);
    assert_eq!(
        pull(daemon.channel(), 2, &key)
            .unwrap()
            .values::<f32>()
            .unwrap()
            .to_vec(),
        [1.0, 2.0]
    );
    daemon.server.stop();
}

#[test]
fn a_pull_ends_at_its_deadline_or_when_its_step_stops() {
    let daemon = Daemon::start(Security::plain());
    let value = Tensor::from_vec(vec![1], vec![9.0f32]).unwrap();
    let (graph, key) = daemon.register("edge_5_late", &value);
    let channel = daemon.channel();

    let deadline = Instant::now() + Duration::from_millis(300);
    let err = channel
        .recv_tensor(
            &request(1, &key),
            deadline,
            ChannelLimit::NONE,
            &never_stopped,
        )
        .expect("the channel carries the call")
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        err.message().contains("/job:localhost/replica:0/task:0"),
        "{err}"
    );

    // A step aborted elsewhere: the pull ends with the step's status, once it looks.
    let looks = AtomicUsize::new(0);
    let stopped = || {
        (looks.fetch_add(1, Ordering::SeqCst) >= 2)
            .then(|| tessera::Status::aborted("step 2 aborted by another partition"))
    };
    let err = channel
        .recv_tensor(
            &request(2, &key),
            in_a_while(),
            ChannelLimit::NONE,
            &stopped,
        )
        .expect("the channel carries the call")
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(err.message(), "step 2 aborted by another partition");

    // The abandoned pulls' connections were closed, not reused: a fresh one carries step 3.
    daemon.run(&graph, 3);
    assert_eq!(
        pull(channel, 3, &key)
            .unwrap()
            .values::<f32>()
            .unwrap()
            .to_vec(),
        [9.0]
    );
    daemon.server.stop();
}

#[test]
fn the_cluster_token_is_required_and_a_refused_channel_leaves_calls_to_grpc() {
    let token = ClusterToken::new(TOKEN).unwrap();
    let daemon = Daemon::start(Security {
        tls: None,
        token: Some(token),
    });
    let value = Tensor::from_vec(vec![3], vec![1i32, 2, 3]).unwrap();
    let (graph, key) = daemon.register("edge_6_i", &value);
    daemon.run(&graph, 1);
    // The peer holds the token: its channel is accepted.
    assert_eq!(
        pull(daemon.channel(), 1, &key)
            .unwrap()
            .values::<i32>()
            .unwrap()
            .to_vec(),
        [1, 2, 3]
    );
    // Without the token the hello is refused, so the call is left to gRPC (which refuses it
    // with UNAUTHENTICATED), and later calls do not try the channel again.
    let addr = daemon.server.local_addr().to_string();
    let tokenless = TensorChannel::new(
        TaskId::new("localhost", 0),
        &addr,
        PATIENCE,
        &Security::plain(),
    )
    .expect("plain text has a channel");
    daemon.run(&graph, 2);
    assert!(tokenless
        .recv_tensor(
            &request(2, &key),
            in_a_while(),
            ChannelLimit::NONE,
            &never_stopped
        )
        .is_none());
    assert!(tokenless
        .recv_tensor(
            &request(2, &key),
            in_a_while(),
            ChannelLimit::NONE,
            &never_stopped
        )
        .is_none());
    // Nothing was taken: the tensor is still there for the peer with the token.
    assert_eq!(
        pull(daemon.channel(), 2, &key)
            .unwrap()
            .values::<i32>()
            .unwrap()
            .to_vec(),
        [1, 2, 3]
    );
    daemon.server.stop();
}

#[test]
fn tls_turns_the_channel_off_on_both_sides() {
    let pki = Pki::new("channel");
    let leaf = pki.leaf("task");
    let tls = pki.client(Some(&leaf));
    let daemon = Daemon::start(Security {
        tls: Some(tls.clone()),
        token: None,
    });
    // A TLS peer has no channel: its tensors go over gRPC, inside TLS.
    assert!(daemon.peer.tensor_channel().is_none());
    let value = Tensor::from_vec(vec![1], vec![4.0f64]).unwrap();
    let (graph, key) = daemon.register("edge_7_d", &value);
    daemon.run(&graph, 1);
    let over_grpc = daemon
        .rt
        .block_on(
            daemon
                .peer
                .recv_tensor(request(1, &key), CallOptions::timeout(PATIENCE)),
        )
        .expect("RecvTensor over TLS");
    assert_eq!(
        Tensor::from_proto(over_grpc.tensor.as_ref().unwrap())
            .unwrap()
            .values::<f64>()
            .unwrap()
            .to_vec(),
        [4.0]
    );
    // A plain-text hello to the TLS port is refused, never served.
    let plain = TensorChannel::new(
        TaskId::new("localhost", 0),
        &daemon.server.local_addr().to_string(),
        PATIENCE,
        &Security::plain(),
    )
    .unwrap();
    daemon.run(&graph, 2);
    assert!(plain
        .recv_tensor(
            &request(2, &key),
            in_a_while(),
            ChannelLimit::NONE,
            &never_stopped
        )
        .is_none());
    let answer = raw_hello(daemon.server.local_addr(), None);
    assert_eq!(&answer[..4], b"TSRT");
    assert_eq!(
        u16::from_le_bytes([answer[6], answer[7]]),
        Code::FailedPrecondition as u16
    );
    daemon.server.stop();
}

#[test]
fn a_task_that_does_not_speak_the_channel_leaves_calls_to_grpc_without_retrying_each() {
    // Answers a hello as an HTTP/2 server would (a SETTINGS frame), then closes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                accepted.fetch_add(1, Ordering::SeqCst);
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
                let _ = stream.read(&mut [0u8; 64]);
                let _ = stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
            }
        });
    }
    let channel = TensorChannel::new(
        TaskId::new("ps", 0),
        &format!("http://{addr}"),
        PATIENCE,
        &Security::plain(),
    )
    .unwrap();
    let key = format!("{DAEMON_CPU};0000000000000001;{PULLER_CPU};edge_8_x;0:0");
    for _ in 0..3 {
        assert!(channel
            .recv_tensor(
                &request(1, &key),
                in_a_while(),
                ChannelLimit::NONE,
                &never_stopped
            )
            .is_none());
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "tried once, then left to gRPC"
    );
}

/// Opens a connection, says hello (with `token`), and returns the answer's head.
fn raw_hello(addr: std::net::SocketAddr, token: Option<&[u8]>) -> [u8; ANSWER_HEAD_BYTES] {
    let mut stream = connect(addr);
    stream.write_all(&hello(token)).unwrap();
    let mut head = [0u8; ANSWER_HEAD_BYTES];
    stream.read_exact(&mut head).unwrap();
    head
}

fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, PATIENCE).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_write_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// Writes a request head claiming `len` bytes, then `body`; returns the answer's code.
fn send_request(stream: &mut TcpStream, len: u32, body: &[u8]) -> u32 {
    let mut out = 1_000_000u64.to_le_bytes().to_vec();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
    stream.write_all(&out).unwrap();
    let mut head = [0u8; RESPONSE_HEAD_BYTES];
    stream.read_exact(&mut head).unwrap();
    let meta = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
    let mut message = vec![0u8; meta];
    stream.read_exact(&mut message).unwrap();
    u32::from_le_bytes(head[..4].try_into().unwrap())
}

#[test]
fn malformed_requests_are_refused_and_the_port_keeps_serving() {
    let daemon = Daemon::start(Security::plain());
    let addr = daemon.server.local_addr();
    // A connection that stalls inside the magic holds up nobody.
    let mut stalled = connect(addr);
    stalled.write_all(b"TS").unwrap();
    assert!(daemon.serves_grpc());

    let mut stream = connect(addr);
    stream.write_all(&hello(None)).unwrap();
    let mut head = [0u8; ANSWER_HEAD_BYTES];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(u16::from_le_bytes([head[6], head[7]]), 0, "accepted");
    // Bytes that are not a RecvTensorRequest: refused, and the connection goes on.
    assert_eq!(
        send_request(&mut stream, 3, &[0xff, 0xff, 0xff]),
        Code::InvalidArgument as u32
    );
    assert_eq!(
        send_request(&mut stream, 2, &[0x0a, 0x05]),
        Code::InvalidArgument as u32
    );
    // A request over the limit: refused, then the connection is closed.
    assert_eq!(
        send_request(&mut stream, 64 << 20, &[]),
        Code::InvalidArgument as u32
    );
    assert_eq!(stream.read(&mut [0u8; 1]).unwrap(), 0, "closed");
    // Another version's hello is answered in this version, which the caller does not take.
    let mut other = connect(addr);
    let mut newer = hello(None);
    newer[4] = 9;
    other.write_all(&newer).unwrap();
    let mut head = [0u8; ANSWER_HEAD_BYTES];
    other.read_exact(&mut head).unwrap();
    assert_eq!(u16::from_le_bytes([head[4], head[5]]), 1);

    assert!(daemon.serves_grpc());
    let value = Tensor::from_vec(vec![1], vec![2.0f32]).unwrap();
    let (graph, key) = daemon.register("edge_9_ok", &value);
    daemon.run(&graph, 1);
    assert_eq!(
        pull(daemon.channel(), 1, &key)
            .unwrap()
            .values::<f32>()
            .unwrap()
            .to_vec(),
        [2.0]
    );
    drop(stalled);
    daemon.server.stop();
}

/// A WorkerService whose RecvTensor never answers: it reports the deadline it was given, then
/// waits until its call is dropped, which it reports too.
struct NeverAnswers {
    events: std::sync::Mutex<std::sync::mpsc::Sender<String>>,
}

/// Sends "dropped" when the call holding it is dropped.
struct DropReport(std::sync::mpsc::Sender<String>);

impl Drop for DropReport {
    fn drop(&mut self) {
        let _ = self.0.send("dropped".into());
    }
}

type TonicResult<T> = std::result::Result<Response<T>, tonic::Status>;

recv_tensor_worker! { NeverAnswers, {
    async fn recv_tensor(&self, request: Request<RecvTensorRequest>) -> TonicResult<RecvTensorResponse> {
        let events = self.events.lock().unwrap().clone();
        let timeout = request.metadata().get("grpc-timeout").map(|v| v.to_str().unwrap().to_string());
        let _ = events.send(format!("timeout {timeout:?}"));
        let _report = DropReport(events);
        std::future::pending::<()>().await;
        unreachable!()
    }
    }
}

#[test]
fn a_caller_that_gives_up_ends_the_senders_wait() {
    let (events, reports) = std::sync::mpsc::channel();
    let rt = Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    // Only tensor-channel connections come here; the stream of the others (held to the end,
    // as dropping it stops the accept loop) is not served.
    let others = {
        let _entered = rt.enter();
        incoming(
            listener,
            Arc::new(NeverAnswers {
                events: std::sync::Mutex::new(events),
            }),
            ChannelConfig {
                serve: true,
                token: None,
                task: "/job:ps/replica:0/task:0".into(),
            },
            shutdown,
        )
    };
    let channel = TensorChannel::new(
        TaskId::new("ps", 0),
        &addr.to_string(),
        PATIENCE,
        &Security::plain(),
    )
    .unwrap();
    let key = format!("{DAEMON_CPU};0000000000000001;{PULLER_CPU};edge_10_x;0:0");
    let looks = AtomicUsize::new(0);
    let stopped = || {
        (looks.fetch_add(1, Ordering::SeqCst) >= 1).then(|| tessera::Status::cancelled("closed"))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = channel
        .recv_tensor(&request(1, &key), deadline, ChannelLimit::NONE, &stopped)
        .expect("the channel carries the call")
        .unwrap_err();
    assert_eq!(err.code(), Code::Cancelled);
    // The handler got the caller's deadline (30 s, less the time spent), in microseconds ...
    let timeout = reports.recv_timeout(PATIENCE).unwrap();
    let micros: u64 = timeout
        .strip_prefix("timeout Some(\"")
        .and_then(|t| t.strip_suffix("u\")"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{timeout}"));
    assert!((20_000_000..=30_000_000).contains(&micros), "{timeout}");
    // ... and its call was dropped once the caller closed the connection.
    assert_eq!(reports.recv_timeout(PATIENCE).unwrap(), "dropped");
    assert_eq!(channel.idle_connections(), 0);
    let _ = stop.send(true);
    drop(others);
}

#[test]
fn an_answer_announcing_more_than_the_limit_or_the_budget_room_is_refused_unread() {
    let daemon = Daemon::start(Security::plain());
    // 4096 floats: 16 KiB of content.
    let value = Tensor::from_vec(vec![4096], vec![0.5f32; 4096]).unwrap();
    let (graph, key) = daemon.register("edge_big", &value);
    for (step, limit, want) in [
        (
            1,
            ChannelLimit {
                max_message_bytes: 4096,
                room: u64::MAX,
            },
            "limits.max_message_bytes = 4096",
        ),
        (
            2,
            ChannelLimit {
                max_message_bytes: 1 << 30,
                room: 1000,
            },
            "memory budget has 1000 bytes left",
        ),
    ] {
        daemon.run(&graph, step);
        let err = daemon
            .channel()
            .recv_tensor(&request(step, &key), in_a_while(), limit, &never_stopped)
            .expect("the channel carries the call")
            .unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(err.message().contains(want), "{err}");
        assert!(err.message().contains("16384 bytes"), "{err}");
    }
    // The refused connections were dropped, not given back; a call within the limits works.
    assert_eq!(daemon.channel().idle_connections(), 0);
    daemon.run(&graph, 3);
    let got = pull(daemon.channel(), 3, &key).unwrap();
    assert_eq!(got.num_elements(), 4096);
    daemon.server.stop();
}

#[test]
fn answers_are_parsed_from_their_bytes_and_oversized_ones_are_not_allocated() {
    use prost::Message;
    use tessera::wire::channel::client::parse_answer;
    use tessera::wire::channel::ResponseHead;
    let value = Tensor::from_vec(vec![2], vec![1.5f32, -2.0]).unwrap();
    let mut meta_tensor = value.to_proto();
    let content = std::mem::take(&mut meta_tensor.tensor_content);
    let meta = RecvTensorResponse {
        tensor: Some(meta_tensor),
        ..Default::default()
    }
    .encode_to_vec();
    let answer = |code: Code, meta: &[u8], content: &[u8], claimed: usize| {
        let mut out = ResponseHead {
            code,
            meta_len: meta.len(),
            content_len: claimed,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(meta);
        out.extend_from_slice(content);
        out
    };
    let whole = answer(Code::Ok, &meta, &content, content.len());
    let response = parse_answer(&whole, ChannelLimit::NONE).unwrap();
    assert_eq!(
        Tensor::from_proto(response.tensor.as_ref().unwrap()).unwrap(),
        value
    );
    // The task's error comes back as its status.
    let failed = answer(Code::Aborted, b"step 3 aborted", &[], 0);
    let err = parse_answer(&failed, ChannelLimit::NONE).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::Aborted, "step 3 aborted")
    );
    // Cut short: the connection would be broken.
    let err = parse_answer(&whole[..whole.len() - 1], ChannelLimit::NONE).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    // 2^40 bytes of content claimed in a 40-byte answer: refused before any allocation.
    let claims = answer(Code::Ok, &meta, &content, 1 << 40);
    let err = parse_answer(&claims, ChannelLimit::NONE).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("limits.max_message_bytes"), "{err}");
}
