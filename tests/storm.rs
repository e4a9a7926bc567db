//! Storm: a live cluster (1 ps + 2 worker `tessera serve` processes) trains while hostile and
//! heavy clients hammer every task, and nothing of it may cost the training a step or a daemon
//! its life or its memory.
//!
//! Two training clients, one per worker, run `steps` steps each of linear regression on the ps's
//! variables, counting the global step. Meanwhile, until both finish, storm clients loop:
//! - `malformed`: garbage and truncated protobufs to RunStep, CreateSession, RunGraph and
//!   RegisterGraph on every task;
//! - `broadcast`: 30-byte TensorProtos describing 2 GiB each, as RunStep feeds and RunGraph
//!   sends: refused by `limits.max_request_tensor_bytes` before decoding;
//! - `kernel`: a step whose Fill asks for 1 GiB: refused by `devices.cpu_memory_limit` before
//!   allocating;
//! - `sessions`: sessions opened on worker 1's master until `limits.max_sessions` refuses one,
//!   then closed;
//! - `slow`: tensor-channel connections that ask for a tensor that never comes and never read
//!   the answer, and connections dropped mid-frame (half a request head; half an HTTP/2
//!   frame).
//!
//! Then: both clients trained every step (global step = 2 × steps) and the loss fell; every
//! daemon is still running; every request of the storm got an error with its code and a
//! message (the slow and dropped connections get none: they only must not hurt); on every
//! task the memory gauges stayed within the budget (`tessera_device_memory_peak_bytes` ≤
//! `tessera_device_memory_limit_bytes`) and the host pool kept at most an eighth of the budget
//! (`tessera_host_pool_kept_bytes`); each daemon's peak RSS, sampled every 100 ms, stayed
//! under the budget plus [`RSS_SLACK`].
//!
//! `storm_short` runs in CI (about a minute at most). `storm_long` is ignored by default:
//! `cargo nextest run storm::storm_long --run-ignored only --no-capture`, with `STORM_STEPS`
//! (default 3000) steps per client; its table is in BENCHES.md ("Storm").

use crate::support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::cluster::{Cluster, TEST_TIMEOUTS};
use crate::support::regression::{batch, model, scalar, Model};
use bytes::Bytes;
use prost::Message;
use tessera::client::Session;
use tessera::graph::builder::NodeSpec;
use tessera::graph::Graph;
use tessera::proto::{
    tensor_shape_proto, CloseSessionRequest, CreateSessionRequest, DataType, GraphDef,
    NamedTensorProto, RunGraphRequest, RunStepRequest, TensorProto, TensorShapeProto,
};
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::wire::channel::{hello, RequestHead};

/// Each CPU device's memory budget in the storm's cluster.
const CPU_BUDGET: u64 = 256 << 20;
/// What a daemon's RSS may hold beyond its budget: code, the runtime, gRPC and channel
/// buffers, allocator caches.
const RSS_SLACK: u64 = 256 << 20;
/// The most one request's tensors may expand to.
const REQUEST_BUDGET: u64 = 64 << 20;
/// Sessions one master holds at most.
const MAX_SESSIONS: usize = 8;
/// The longest the storm may take in CI.
const STORM_DEADLINE: Duration = Duration::from_secs(60);

const JOBS: [(&str, usize); 3] = [("ps", 0), ("worker", 0), ("worker", 1)];

const RUN_STEP: &str = "/tensorflow.MasterService/RunStep";
const CREATE_SESSION: &str = "/tensorflow.MasterService/CreateSession";
const RUN_GRAPH: &str = "/tensorflow.WorkerService/RunGraph";
const REGISTER_GRAPH: &str = "/tensorflow.WorkerService/RegisterGraph";

fn cluster_file_extra() -> String {
    let devices = format!("[devices]\ngpu = 0\ncpu_memory_limit = {CPU_BUDGET}\n");
    TEST_TIMEOUTS.replace("[devices]\ngpu = 0\n", &devices)
        + &format!(
            "\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n[limits]\nmax_sessions = {MAX_SESSIONS}\n\
             max_request_tensor_bytes = {REQUEST_BUDGET}\n"
        )
}

/// What the storm's clients got, by client and status code.
#[derive(Default)]
struct Tally {
    sent: BTreeMap<&'static str, u64>,
    errors: BTreeMap<(&'static str, String), u64>,
}

impl Tally {
    /// Records one request of `client`, which must have failed with one of `codes` and a
    /// message that contains `needle`.
    fn refused<T>(
        &mut self,
        client: &'static str,
        result: Result<T, tonic::Status>,
        codes: &[tonic::Code],
        needle: &str,
    ) {
        *self.sent.entry(client).or_default() += 1;
        let status = match result {
            Ok(_) => panic!("{client}: a hostile request was answered as if it were fine"),
            Err(status) => status,
        };
        assert!(
            codes.contains(&status.code()) && !status.message().is_empty(),
            "{client}: expected one of {codes:?}, got {status}"
        );
        assert!(
            status.message().contains(needle),
            "{client}: `{needle}` not in: {}",
            status.message()
        );
        *self
            .errors
            .entry((client, format!("{:?}", status.code())))
            .or_default() += 1;
    }

    /// Records one connection of `client` that needs no answer.
    fn sent(&mut self, client: &'static str) {
        *self.sent.entry(client).or_default() += 1;
    }
}

/// Trains `steps` steps through worker `w`'s master; returns the first and last loss.
fn train(target: &str, m: &Model, w: usize, steps: usize) -> (f32, f32) {
    let sess = Session::connect(target).expect("connect a training client");
    sess.extend(&m.graph.to_graph_def()).expect("extend");
    let mut losses = (f32::NAN, f32::NAN);
    for k in 0..steps {
        let (x, y) = batch(k * 2 + w);
        let out = sess
            .run(&[(&m.x, x), (&m.y, y)], &[&m.loss], &[&m.train])
            .unwrap_or_else(|e| panic!("worker {w}: training step {k} failed in the storm: {e}"));
        let loss = scalar(&out[0]);
        if k == 0 {
            losses.0 = loss;
        }
        losses.1 = loss;
    }
    sess.close().expect("close a training session");
    losses
}

/// A float tensor of `elements` described by one value: 30 bytes, `4 × elements` in memory.
fn broadcast(elements: i64) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![tensor_shape_proto::Dim {
                size: elements,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        float_val: vec![1.0],
        ..Default::default()
    }
}

/// Fill of a fed shape, for the `kernel` client.
fn fill_graph() -> GraphDef {
    let mut g = Graph::new();
    let dims = g
        .placeholder("dims", DType::Int32, PartialShape::unknown())
        .unwrap();
    let one = g.constant(&Tensor::scalar(1.0f32)).unwrap();
    g.with_device("/job:worker/task:1", |g| {
        g.add_op(NodeSpec::new("Fill").name("huge").input(&dims).input(&one))
    })
    .unwrap();
    g.to_graph_def()
}

/// A tonic channel to `addr`.
async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// One round of every storm client against `addrs` (ps, worker 0, worker 1).
async fn storm_round(
    addrs: &[SocketAddr],
    channels: &[tonic::transport::Channel],
    fill_session: &str,
    round: usize,
    tally: &Mutex<Tally>,
) {
    use tonic::Code::{InvalidArgument, ResourceExhausted};
    let task = round % addrs.len();
    let ch = &channels[task];
    // Malformed protobufs on every service path.
    let garbage: [&[u8]; 3] = [
        b"\xff\xff\xff\xff",
        b"\x0a\x05ab",
        b"\x12\x80\x80\x80\x80\x10",
    ];
    for (path, body) in [
        (RUN_STEP, garbage[round % 3]),
        (CREATE_SESSION, garbage[(round + 1) % 3]),
        (RUN_GRAPH, garbage[(round + 2) % 3]),
        (REGISTER_GRAPH, garbage[round % 3]),
    ] {
        let result = support::raw_grpc::call(ch, path, Bytes::from_static(body)).await;
        tally
            .lock()
            .unwrap()
            .refused("malformed", result, &[InvalidArgument], "");
    }
    // 2 GiB broadcast tensors, as feeds and as a peer's sends.
    let feeds = RunStepRequest {
        session_handle: "any".into(),
        feed: (0..4)
            .map(|i| NamedTensorProto {
                name: format!("x{i}:0"),
                tensor: Some(broadcast(1 << 29)),
            })
            .collect(),
        ..Default::default()
    };
    let result = support::raw_grpc::call(ch, RUN_STEP, feeds.encode_to_vec().into()).await;
    tally.lock().unwrap().refused(
        "broadcast",
        result,
        &[ResourceExhausted],
        "limits.max_request_tensor_bytes",
    );
    let sends = RunGraphRequest {
        graph_handle: "any".into(),
        send: vec![NamedTensorProto {
            name: "k".into(),
            tensor: Some(broadcast(1 << 29)),
        }],
        ..Default::default()
    };
    let result = support::raw_grpc::call(ch, RUN_GRAPH, sends.encode_to_vec().into()).await;
    tally.lock().unwrap().refused(
        "broadcast",
        result,
        &[ResourceExhausted],
        "limits.max_request_tensor_bytes",
    );
    // A kernel asking for 1 GiB on worker 1.
    let fill = RunStepRequest {
        session_handle: fill_session.into(),
        feed: vec![Tensor::from_vec(vec![1], vec![1i32 << 28])
            .unwrap()
            .to_named_proto("dims:0")],
        fetch: vec!["huge:0".into()],
        ..Default::default()
    };
    let mut master =
        tessera::proto::master_service_client::MasterServiceClient::new(channels[2].clone());
    let result = master.run_step(fill).await;
    tally.lock().unwrap().refused(
        "kernel",
        result,
        &[ResourceExhausted],
        "devices.cpu_memory_limit",
    );
    // Sessions on worker 1's master until refused, then closed.
    if round % 4 == 0 {
        let mut opened = Vec::new();
        let refusal = loop {
            let created = master
                .create_session(CreateSessionRequest {
                    graph_def: Some(GraphDef::default()),
                    ..Default::default()
                })
                .await;
            match created {
                Ok(reply) => opened.push(reply.into_inner().session_handle),
                Err(status) => break status,
            }
            assert!(
                opened.len() <= MAX_SESSIONS,
                "sessions: {} sessions opened past limits.max_sessions = {MAX_SESSIONS}",
                opened.len()
            );
        };
        tally.lock().unwrap().refused(
            "sessions",
            Err::<(), _>(refusal),
            &[ResourceExhausted],
            "limits.max_sessions",
        );
        for session_handle in opened {
            master
                .close_session(CloseSessionRequest { session_handle })
                .await
                .expect("close a storm session");
        }
    }
    // Slow readers and connections dropped mid-frame, on a blocking thread.
    let addr = addrs[task];
    tokio::task::spawn_blocking(move || slow_and_dropped(addr))
        .await
        .expect("slow clients");
    let mut tally = tally.lock().unwrap();
    tally.sent("slow reader");
    tally.sent("dropped mid-frame");
}

/// A tensor-channel RecvTensor for a tensor that never comes, whose answer is never read (the
/// connection is dropped once it arrived), and two connections cut inside a frame.
fn slow_and_dropped(addr: SocketAddr) {
    let request = tessera::proto::RecvTensorRequest {
        step_id: 0x5107,
        rendezvous_key: "/job:ps/replica:0/task:0/device:CPU:0;0000000000000001;\
                         /job:worker/replica:0/task:0/device:CPU:0;never;0:0"
            .into(),
        ..Default::default()
    }
    .encode_to_vec();
    let head = RequestHead {
        timeout_micros: 200_000,
        len: request.len(),
    };
    let mut slow = TcpStream::connect(addr).expect("connect a slow reader");
    slow.write_all(&hello(None)).unwrap();
    let mut answer = [0u8; 12];
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    slow.read_exact(&mut answer).expect("the hello's answer");
    slow.write_all(&head.encode()).unwrap();
    slow.write_all(&request).unwrap();
    // Wait for the answer to arrive (the task gives up on the tensor after the request's
    // 200 ms), then go without reading it.
    let _ = slow.peek(&mut [0u8; 1]);
    drop(slow);
    // Half a request head after the hello, then gone.
    let mut cut = TcpStream::connect(addr).expect("connect");
    cut.write_all(&hello(None)).unwrap();
    cut.write_all(&head.encode()[..5]).unwrap();
    drop(cut);
    // The HTTP/2 preface and half a SETTINGS frame, then gone.
    let mut cut = TcpStream::connect(addr).expect("connect");
    cut.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x0c\x04\x00")
        .unwrap();
    drop(cut);
}

/// `GET /metrics` from `addr`; returns the body.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: tessera\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the metrics");
    text
}

/// The value of `name` for the CPU:0 device in a scrape.
fn cpu0_gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.contains("device:CPU:0"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} for CPU:0 in:\n{text}"))
}

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn storm(steps: usize, deadline: Duration) {
    let mut cluster = Cluster::start_with(&[("ps", 1), ("worker", 2)], &cluster_file_extra());
    let addrs: Vec<SocketAddr> = JOBS.iter().map(|(j, i)| cluster.addr(j, *i)).collect();
    let pids: Vec<u32> = JOBS
        .iter()
        .map(|(j, i)| cluster.pid(j, *i).expect("a running daemon"))
        .collect();
    let targets: Vec<String> = (0..2).map(|w| cluster.target("worker", w)).collect();
    let models: Vec<Model> = (0..2).map(model).collect();
    let setup = Session::connect(&targets[0]).expect("connect for init");
    setup
        .extend(&models[0].graph.to_graph_def())
        .expect("extend for init");
    setup.run(&[], &[], &[&models[0].init]).expect("init");

    let done = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let peak_rss = Arc::new(Mutex::new(vec![0u64; pids.len()]));
    let began = Instant::now();
    let (stop_sampling, sampling_stopped) = mpsc::channel::<()>();
    let (losses, rounds) = thread::scope(|s| {
        // RSS sampler: every 100 ms until the sender goes.
        let sampler = {
            let (peak_rss, pids) = (Arc::clone(&peak_rss), pids.clone());
            s.spawn(move || loop {
                let mut peaks = peak_rss.lock().unwrap();
                for (peak, &pid) in peaks.iter_mut().zip(&pids) {
                    *peak = (*peak).max(rss(pid));
                }
                drop(peaks);
                match sampling_stopped.recv_timeout(Duration::from_millis(100)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            })
        };
        // The storm, on its own runtime, until training is done.
        let storm = {
            let (done, tally, addrs) = (Arc::clone(&done), Arc::clone(&tally), addrs.clone());
            s.spawn(move || {
                let rt = tokio::runtime::Runtime::new().expect("storm runtime");
                rt.block_on(async move {
                    let mut channels = Vec::new();
                    for &addr in &addrs {
                        channels.push(channel(addr).await);
                    }
                    let mut master =
                        tessera::proto::master_service_client::MasterServiceClient::new(
                            channels[2].clone(),
                        );
                    let fill_session = master
                        .create_session(CreateSessionRequest {
                            graph_def: Some(fill_graph()),
                            ..Default::default()
                        })
                        .await
                        .expect("the kernel client's session")
                        .into_inner()
                        .session_handle;
                    let mut round = 0;
                    while !done.load(Ordering::Acquire) && began.elapsed() < deadline {
                        storm_round(&addrs, &channels, &fill_session, round, &tally).await;
                        round += 1;
                    }
                    round
                })
            })
        };
        let trainers: Vec<_> = (0..2)
            .map(|w| {
                let (target, m) = (&targets[w], &models[w]);
                s.spawn(move || train(target, m, w, steps))
            })
            .collect();
        let losses: Vec<(f32, f32)> = trainers
            .into_iter()
            .map(|t| t.join().expect("a training client"))
            .collect();
        done.store(true, Ordering::Release);
        drop(stop_sampling);
        let rounds = storm.join().expect("the storm");
        sampler.join().expect("the sampler");
        (losses, rounds)
    });
    let duration = began.elapsed();

    // Training lost nothing.
    let global = setup
        .run(&[], &[&models[0].step], &[])
        .expect("read the global step")[0]
        .scalar_value::<i64>()
        .expect("an int64 step");
    assert_eq!(global, 2 * steps as i64, "global steps lost in the storm");
    for (w, (first, last)) in losses.iter().enumerate() {
        assert!(
            last < first,
            "worker {w}: the loss did not fall: {first} -> {last}"
        );
    }
    setup.close().expect("close");
    // Every daemon lives and kept within its budget.
    let tally = tally.lock().unwrap();
    let peaks = peak_rss.lock().unwrap().clone();
    println!(
        "storm: {} training steps in {:.1} s beside {rounds} storm rounds",
        2 * steps,
        duration.as_secs_f64()
    );
    println!("| client | requests | errors by code |");
    println!("|---|---|---|");
    for (client, sent) in &tally.sent {
        let errors: Vec<String> = tally
            .errors
            .iter()
            .filter(|((c, _), _)| c == client)
            .map(|((_, code), n)| format!("{code} {n}"))
            .collect();
        println!("| {client} | {sent} | {} |", errors.join(", "));
    }
    println!("| daemon | peak RSS (MiB) | peak charged (KiB) | budget (MiB) |");
    println!("|---|---|---|---|");
    for (i, (job, index)) in JOBS.iter().enumerate() {
        assert!(
            cluster.is_running(job, *index),
            "/job:{job}/task:{index} died in the storm"
        );
        let metrics = cluster.task(job, *index).metrics.expect("metrics are on");
        let text = scrape(metrics);
        let peak = cpu0_gauge(&text, "tessera_device_memory_peak_bytes");
        let limit = cpu0_gauge(&text, "tessera_device_memory_limit_bytes");
        println!(
            "| /job:{job}/task:{index} | {:.1} | {:.1} | {:.0} |",
            mib(peaks[i]),
            peak / 1024.0,
            limit / (1 << 20) as f64
        );
        assert_eq!(limit as u64, CPU_BUDGET);
        // The host pool keeps at most an eighth of the budget of freed buffers.
        let kept = text
            .lines()
            .find(|l| l.starts_with("tessera_host_pool_kept_bytes"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no tessera_host_pool_kept_bytes in:\n{text}"));
        assert!(
            kept <= (CPU_BUDGET / 8) as f64,
            "/job:{job}/task:{index}: the host pool keeps {kept} bytes, over an eighth of the \
             budget"
        );
        assert!(
            peak <= limit,
            "/job:{job}/task:{index}: {peak} bytes charged, over the budget of {limit}"
        );
        assert!(
            peaks[i] <= CPU_BUDGET + RSS_SLACK,
            "/job:{job}/task:{index}: peak RSS {:.1} MiB, over the budget plus slack ({:.0} MiB)",
            mib(peaks[i]),
            mib(CPU_BUDGET + RSS_SLACK)
        );
    }
    for client in [
        "malformed",
        "broadcast",
        "kernel",
        "sessions",
        "slow reader",
    ] {
        assert!(
            tally.sent.get(client).copied().unwrap_or(0) > 0,
            "the storm sent nothing as {client}"
        );
    }
}

#[test]
fn storm_short() {
    storm(1500, STORM_DEADLINE);
}

#[test]
#[ignore = "long: run with --ignored --nocapture (STORM_STEPS, default 3000)"]
fn storm_long() {
    let steps: usize = std::env::var("STORM_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    storm(steps, Duration::from_secs(3600));
}
