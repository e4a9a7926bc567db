//! Hostile input against a running daemon (an in-process `Server` on 127.0.0.1:0).
//!
//! Requests go as raw bytes inside correct gRPC framing to the real service paths (a tonic
//! client with a codec that passes bytes through), so the daemon sees exactly what a broken or
//! malicious peer could send: truncated and malformed protobufs, fields of the wrong wire type,
//! negative and absurd shapes, tensors whose shape claims more elements than their content,
//! and tensors far larger than any step could hold. Each must get an error status
//! (INVALID_ARGUMENT or RESOURCE_EXHAUSTED with a message) and the daemon must keep serving:
//! every case ends with a GetStatus that succeeds.
//!
//! The second half keeps what fuzzing (`fuzz/run.sh`) found as regression tests, each with its
//! input also in `fuzz/corpus/<target>/`.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{
    CreateSessionRequest, GetStatusRequest, GraphDef, NamedTensorProto, NodeDef, RunGraphRequest,
    RunStepRequest, TensorProto, TensorShapeProto,
};
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tonic::transport::Channel;

/// Deadline of one call: every case is answered long before it.
const CALL_DEADLINE: Duration = Duration::from_secs(20);

/// The only device of the daemon under test.
const DEVICE: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

const RUN_STEP: &str = "/tensorflow.MasterService/RunStep";
const CREATE_SESSION: &str = "/tensorflow.MasterService/CreateSession";
const RUN_GRAPH: &str = "/tensorflow.WorkerService/RunGraph";
const REGISTER_GRAPH: &str = "/tensorflow.WorkerService/RegisterGraph";

/// A daemon and a channel to it.
struct Daemon {
    server: Server,
    channel: Channel,
}

impl Daemon {
    async fn start() -> Daemon {
        let server = tokio::task::spawn_blocking(Server::local)
            .await
            .expect("start task")
            .expect("the daemon starts");
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.local_addr()))
                .expect("loopback endpoint")
                .connect_timeout(CALL_DEADLINE)
                .timeout(CALL_DEADLINE)
                .connect()
                .await
                .expect("connect to the daemon");
        Daemon { server, channel }
    }

    /// Sends `body` as the request message of `path` and returns the raw answer.
    async fn raw(
        &self,
        path: &'static str,
        body: impl Into<Bytes>,
    ) -> Result<Bytes, tonic::Status> {
        support::raw_grpc::call(&self.channel, path, body.into()).await
    }

    /// Asserts the daemon still answers GetStatus with its device.
    async fn assert_serving(&self, after: &str) {
        let status = WorkerServiceClient::new(self.channel.clone())
            .get_status(GetStatusRequest {})
            .await
            .unwrap_or_else(|e| panic!("GetStatus after {after}: {e}"))
            .into_inner();
        assert_eq!(
            status.device_attributes.len(),
            1,
            "GetStatus after {after}: {status:?}"
        );
    }

    /// Sends `body` to `path`, expects an error with one of `codes` whose message contains
    /// `needle`, then checks the daemon still serves.
    async fn expect_refused(
        &self,
        case: &str,
        path: &'static str,
        body: impl Into<Bytes>,
        codes: &[tonic::Code],
        needle: &str,
    ) {
        match self.raw(path, body).await {
            Ok(answer) => panic!("{case}: {path} answered OK ({} bytes)", answer.len()),
            Err(status) => {
                assert!(
                    codes.contains(&status.code()),
                    "{case}: {path} answered {:?} ({}); expected one of {codes:?}",
                    status.code(),
                    status.message()
                );
                assert!(
                    status.message().contains(needle),
                    "{case}: message `{}` does not mention `{needle}`",
                    status.message()
                );
            }
        }
        self.assert_serving(case).await;
    }

    /// Creates a master session over x: Placeholder float [?,3], w: Const [3,2],
    /// y = MatMul(x, w); returns its handle.
    async fn matmul_session(&self) -> String {
        let w = Tensor::from_vec(vec![3, 2], vec![1f32, 2., 3., 4., 5., 6.]).expect("w");
        let graph = GraphDef {
            node: vec![
                node(
                    "x",
                    "Placeholder",
                    &[],
                    vec![
                        ("dtype", tessera::graph::attr::value::dtype(DType::Float)),
                        (
                            "shape",
                            tessera::graph::attr::value::shape(&PartialShape::new(vec![
                                None,
                                Some(3),
                            ])),
                        ),
                    ],
                ),
                node(
                    "w",
                    "Const",
                    &[],
                    vec![
                        ("dtype", tessera::graph::attr::value::dtype(DType::Float)),
                        ("value", tessera::graph::attr::value::tensor(w.to_proto())),
                    ],
                ),
                node(
                    "y",
                    "MatMul",
                    &["x", "w"],
                    vec![("T", tessera::graph::attr::value::dtype(DType::Float))],
                ),
            ],
            ..Default::default()
        };
        MasterServiceClient::new(self.channel.clone())
            .create_session(CreateSessionRequest {
                graph_def: Some(graph),
                ..Default::default()
            })
            .await
            .expect("CreateSession")
            .into_inner()
            .session_handle
    }
}

impl Daemon {
    /// Registers a one-node partition (a NoOp) in the legacy worker session; returns its
    /// handle.
    async fn noop_graph(&self) -> String {
        let mut noop = node("noop", "NoOp", &[], vec![]);
        noop.device = DEVICE.into();
        WorkerServiceClient::new(self.channel.clone())
            .register_graph(tessera::proto::RegisterGraphRequest {
                graph_def: Some(GraphDef {
                    node: vec![noop],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("RegisterGraph of a NoOp")
            .into_inner()
            .graph_handle
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.server.stop();
    }
}

fn node(
    name: &str,
    op: &str,
    inputs: &[&str],
    attrs: Vec<(&str, tessera::proto::AttrValue)>,
) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attr: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..Default::default()
    }
}

fn shape(dims: &[i64]) -> TensorShapeProto {
    TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| tessera::proto::tensor_shape_proto::Dim {
                size,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A RunStep feeding `tensor` as `x:0` and fetching `y:0`, errors as the call's status.
fn feed_x(session: &str, tensor: TensorProto) -> Vec<u8> {
    RunStepRequest {
        session_handle: session.into(),
        feed: vec![NamedTensorProto {
            name: "x:0".into(),
            tensor: Some(tensor),
        }],
        fetch: vec!["y:0".into()],
        ..Default::default()
    }
    .encode_to_vec()
}

/// A client-terminated rendezvous key for `name` on the daemon's device.
fn key(name: &str) -> String {
    format!("{DEVICE};0000000000000001;{DEVICE};{name};0:0")
}

/// DT_RESOURCE of shape [2^40] with a single handle to repeat over every element.
fn huge_resource_tensor() -> TensorProto {
    TensorProto {
        dtype: DType::Resource.to_proto() as i32,
        tensor_shape: Some(shape(&[1 << 40])),
        resource_handle_val: vec![tessera::proto::ResourceHandleProto {
            name: "v".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn float_tensor(dims: &[i64], content: Vec<u8>) -> TensorProto {
    TensorProto {
        dtype: DType::Float.to_proto() as i32,
        tensor_shape: Some(shape(dims)),
        tensor_content: content.into(),
        ..Default::default()
    }
}

use tonic::Code::{InvalidArgument, ResourceExhausted};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_truncated_protobufs_are_invalid_arguments() {
    let daemon = Daemon::start().await;
    let session = daemon.matmul_session().await;
    // A good request, to cut and to corrupt: x = [[1,2,3]] so y = [[22, 28]].
    let good = feed_x(
        &session,
        float_tensor(
            &[1, 3],
            [1f32, 2., 3.]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
    );
    let answer = daemon
        .raw(RUN_STEP, good.clone())
        .await
        .expect("the good request runs");
    let response = tessera::proto::RunStepResponse::decode(answer).expect("a RunStepResponse");
    let (_, y) = Tensor::from_named_proto(&response.tensor[0]).expect("y");
    // [1,2,3] · [[1,2],[3,4],[5,6]] = [1+6+15, 2+8+18].
    assert_eq!(y.values::<f32>().expect("float y").to_vec(), [22.0, 28.0]);

    // Cut inside the feed's tensor content: the length prefix claims more than follows.
    for cut in [good.len() - 1, good.len() - 7, 20, 1] {
        daemon
            .expect_refused(
                &format!("RunStep truncated to {cut} of {} bytes", good.len()),
                RUN_STEP,
                good[..cut].to_vec(),
                &[InvalidArgument],
                "RunStepRequest",
            )
            .await;
    }
    // Field 1 (session_handle, a string) sent as a varint: a wrong wire type.
    daemon
        .expect_refused(
            "session_handle as a varint",
            RUN_STEP,
            vec![0x08, 0x96, 0x01],
            &[InvalidArgument],
            "wire type",
        )
        .await;
    // A length prefix of 2^62 bytes.
    daemon
        .expect_refused(
            "absurd length prefix",
            RUN_STEP,
            vec![0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40],
            &[InvalidArgument],
            "RunStepRequest",
        )
        .await;
    // Bytes that are no protobuf at all, to both services.
    daemon
        .expect_refused(
            "garbage RunGraph",
            RUN_GRAPH,
            vec![0xff; 64],
            &[InvalidArgument],
            "RunGraphRequest",
        )
        .await;
    daemon
        .expect_refused(
            "garbage CreateSession",
            CREATE_SESSION,
            vec![0x12, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[InvalidArgument],
            "CreateSessionRequest",
        )
        .await;
    // A graph whose node is a string where a message belongs (NodeDef field 1 of GraphDef
    // with wire type 0).
    let bad_graph = [0x12, 0x02, 0x08, 0x01];
    daemon
        .expect_refused(
            "RegisterGraph with a mistyped node",
            REGISTER_GRAPH,
            bad_graph.to_vec(),
            &[InvalidArgument],
            "RegisterGraphRequest",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shapes_and_short_contents_are_refused_and_the_daemon_keeps_serving() {
    let daemon = Daemon::start().await;
    let session = daemon.matmul_session().await;
    let twelve_bytes: Vec<u8> = [1f32, 2., 3.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();

    let cases: Vec<(&str, TensorProto, tonic::Code, &str)> = vec![
        (
            "negative dimension",
            float_tensor(&[-5, 3], twelve_bytes.clone()),
            InvalidArgument,
            "-5",
        ),
        (
            "shape claims more elements than the content holds",
            // 1000 × 3 floats need 12000 bytes; 12 came.
            float_tensor(&[1000, 3], twelve_bytes.clone()),
            InvalidArgument,
            "12000",
        ),
        (
            "element count overflows",
            float_tensor(&[1 << 40, 1 << 40, 3], twelve_bytes.clone()),
            InvalidArgument,
            "elements",
        ),
        (
            "wrong dtype for the placeholder",
            TensorProto {
                dtype: DType::Int32.to_proto() as i32,
                tensor_shape: Some(shape(&[1, 3])),
                int_val: vec![1, 2, 3],
                ..Default::default()
            },
            InvalidArgument,
            "x",
        ),
        (
            "values in the field of another dtype",
            TensorProto {
                dtype: DType::Float.to_proto() as i32,
                tensor_shape: Some(shape(&[1, 3])),
                int64_val: vec![1, 2, 3],
                ..Default::default()
            },
            InvalidArgument,
            "int64_val",
        ),
        (
            "unknown dtype number",
            TensorProto {
                dtype: 9999,
                tensor_shape: Some(shape(&[1, 3])),
                ..Default::default()
            },
            InvalidArgument,
            "9999",
        ),
    ];
    for (case, tensor, code, needle) in cases {
        daemon
            .expect_refused(case, RUN_STEP, feed_x(&session, tensor), &[code], needle)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_tensors_are_refused_without_allocating_them() {
    let daemon = Daemon::start().await;
    let session = daemon.matmul_session().await;

    // One value broadcast over 2^31 × 3 floats (24 GiB): TensorFlow would fill it; the
    // daemon refuses instead of trying to allocate it from a 30-byte message, by the request
    // budget before decoding it.
    let broadcast = TensorProto {
        dtype: DType::Float.to_proto() as i32,
        tensor_shape: Some(shape(&[1 << 31, 3])),
        float_val: vec![1.0],
        ..Default::default()
    };
    daemon
        .expect_refused(
            "one value broadcast over 24 GiB",
            RUN_STEP,
            feed_x(&session, broadcast),
            &[ResourceExhausted],
            "limits.max_request_tensor_bytes",
        )
        .await;

    // One resource handle repeated 2^40 times (about 100 TiB of handles), sent into a step's
    // rendezvous: before the limit, filling it aborted the whole daemon on a failed
    // allocation. (As a RunStep feed the master refuses the dtype before converting.)
    let graph = daemon.noop_graph().await;
    let run_graph = RunGraphRequest {
        graph_handle: graph,
        step_id: 7,
        send: vec![NamedTensorProto {
            name: key("h"),
            tensor: Some(huge_resource_tensor()),
        }],
        ..Default::default()
    };
    daemon
        .expect_refused(
            "one resource handle repeated 2^40 times",
            RUN_GRAPH,
            run_graph.encode_to_vec(),
            &[ResourceExhausted],
            "limits.max_request_tensor_bytes",
        )
        .await;

    // 32 MiB of content under a shape that claims 64 MiB: the whole message arrives, is
    // checked and refused, and the daemon serves on.
    let content = vec![0u8; 32 << 20];
    daemon
        .expect_refused(
            "32 MiB content for a 64 MiB shape",
            RUN_STEP,
            feed_x(
                &session,
                float_tensor(&[(16 << 20) / 3 * 2 + 2, 3], content),
            ),
            &[InvalidArgument],
            "tensor_content",
        )
        .await;

    // A RunGraph send of a huge string tensor claimed by its length prefixes.
    let mut strings = Vec::new();
    prost::encoding::encode_varint(u64::MAX >> 1, &mut strings);
    let string_tensor = TensorProto {
        dtype: DType::String.to_proto() as i32,
        tensor_shape: Some(shape(&[1])),
        tensor_content: strings.into(),
        ..Default::default()
    };
    let run_graph = RunGraphRequest {
        graph_handle: "0000000000000000".into(),
        step_id: 1,
        send: vec![NamedTensorProto {
            name: "/job:localhost/replica:0/task:0/device:CPU:0;0000000000000001;\
                   /job:localhost/replica:0/task:0/device:CPU:0;s;0:0"
                .into(),
            tensor: Some(string_tensor),
        }],
        ..Default::default()
    };
    // No graph is registered: the unknown graph is reported before any tensor is read; the
    // same tensor as a feed goes through the conversion itself.
    let answer = daemon.raw(RUN_GRAPH, run_graph.encode_to_vec()).await;
    assert!(answer.is_err(), "RunGraph of an unknown graph answered OK");
    daemon.assert_serving("RunGraph of an unknown graph").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_requests_leaves_good_ones_working() {
    let daemon = Daemon::start().await;
    let session = daemon.matmul_session().await;
    let good = feed_x(
        &session,
        float_tensor(
            &[1, 3],
            [1f32, 0., 0.]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
    );
    // 200 bad requests in flight at once, then a good one.
    let bad: Vec<_> = (0..200u8)
        .map(|i| {
            let d = &daemon;
            // Cuts inside the last field (`fetch: "y:0"`, 5 bytes): its length prefix
            // promises more than follows.
            let body = good[..good.len() - 1 - (i as usize % 4)].to_vec();
            async move { d.raw(RUN_STEP, body).await }
        })
        .collect();
    for answer in futures::future::join_all(bad).await {
        let status = answer.expect_err("a truncated RunStep");
        assert_eq!(status.code(), InvalidArgument, "{}", status.message());
    }
    let answer = daemon
        .raw(RUN_STEP, good)
        .await
        .expect("the good request after the flood");
    let response = tessera::proto::RunStepResponse::decode(answer).expect("a RunStepResponse");
    let (_, y) = Tensor::from_named_proto(&response.tensor[0]).expect("y");
    // [1,0,0] · w = w's first row.
    assert_eq!(y.values::<f32>().expect("float y").to_vec(), [1.0, 2.0]);
}

// ---- Regression tests for what fuzzing and the cases above found ----

/// Found by the RunGraph case above (and `fuzz/corpus/tensor_proto/huge_resource_broadcast.pb`):
/// one `resource_handle_val` repeated over a shape of 2^40 elements made `Tensor::from_proto`
/// allocate ~100 TiB and abort the process. Now: RESOURCE_EXHAUSTED naming the limit.
#[test]
fn a_broadcast_beyond_the_proto_limit_is_resource_exhausted_not_an_abort() {
    let err = Tensor::from_proto(&huge_resource_tensor()).expect_err("2^40 handles");
    assert_eq!(err.code(), tessera::Code::ResourceExhausted, "{err}");
    assert!(
        err.message()
            .contains(&tessera::tensor::MAX_PROTO_TENSOR_BYTES.to_string()),
        "{err}"
    );

    // The limit is on memory: 2^31 / 4 floats fit exactly, one more element does not.
    let floats = |n: i64| TensorProto {
        dtype: DType::Float.to_proto() as i32,
        tensor_shape: Some(shape(&[n])),
        // Zero values: every element is 0.0. Nothing is allocated for the refused one.
        ..Default::default()
    };
    let limit = tessera::tensor::MAX_PROTO_TENSOR_BYTES as i64;
    let err = Tensor::from_proto(&floats(limit / 4 + 1)).expect_err("over 2 GiB of floats");
    assert_eq!(err.code(), tessera::Code::ResourceExhausted, "{err}");
    // A small broadcast is still TensorFlow's: one value fills every element.
    let four = Tensor::from_proto(&TensorProto {
        float_val: vec![2.5],
        ..floats(4)
    })
    .expect("four floats from one value");
    assert_eq!(four.values::<f32>().expect("floats").to_vec(), [2.5; 4]);
}

/// Found by the fuzzer (`fuzz/corpus/tensor_proto/resource_handles_3075x3075.pb`): a 40-byte
/// proto repeating a handle over a 3075 x 3075 shape passed the limit counting each handle's
/// struct alone, but took about twice that (the handle vector is copied once into the tensor's
/// buffer) plus its strings. Now both count, so the same shape with a 100-byte name is refused
/// before anything is allocated (9.5 million x (2 x 96 + 112) bytes is over 2 GiB), while a
/// small handle tensor still converts.
#[test]
fn repeated_resource_handles_are_refused_by_what_they_take_in_memory() {
    let handles = |dims: &[i64], name: &str| TensorProto {
        dtype: DType::Resource.to_proto() as i32,
        tensor_shape: Some(shape(dims)),
        resource_handle_val: vec![tessera::proto::ResourceHandleProto {
            name: name.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let long_name = "v".repeat(100);
    let err = Tensor::from_proto(&handles(&[3075, 3075], &long_name)).expect_err("2.9 GB");
    assert_eq!(err.code(), tessera::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("9455625 elements"), "{err}");
    let small = Tensor::from_proto(&handles(&[2, 3], &long_name)).expect("six handles");
    assert_eq!(small.num_elements(), 6);
}

/// Deep input: a chain of 20 000 Identity nodes (a few hundred KiB of GraphDef) through
/// CreateSession and a RunStep. Nothing on the way (import, shape inference, pruning,
/// placement, partitioning, the executor) may recurse once per node: on a daemon thread's
/// stack that would be a crash any client could cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_chain_of_nodes_runs_without_exhausting_the_stack() {
    const DEPTH: usize = 20_000;
    let daemon = Daemon::start().await;
    let v = Tensor::from_vec(vec![2], vec![1.5f32, -2.0]).expect("v");
    let mut nodes = vec![node(
        "n0",
        "Const",
        &[],
        vec![
            ("dtype", tessera::graph::attr::value::dtype(DType::Float)),
            ("value", tessera::graph::attr::value::tensor(v.to_proto())),
        ],
    )];
    for i in 1..=DEPTH {
        let input = format!("n{}", i - 1);
        nodes.push(node(
            &format!("n{i}"),
            "Identity",
            &[&input],
            vec![("T", tessera::graph::attr::value::dtype(DType::Float))],
        ));
    }
    let handle = MasterServiceClient::new(daemon.channel.clone())
        .create_session(CreateSessionRequest {
            graph_def: Some(GraphDef {
                node: nodes,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("CreateSession of a deep chain")
        .into_inner()
        .session_handle;
    let response = MasterServiceClient::new(daemon.channel.clone())
        .run_step(RunStepRequest {
            session_handle: handle,
            fetch: vec![format!("n{DEPTH}:0")],
            ..Default::default()
        })
        .await
        .expect("RunStep through the deep chain")
        .into_inner();
    let (_, out) = Tensor::from_named_proto(&response.tensor[0]).expect("the fetched tensor");
    // Identity all the way: the constant comes out unchanged.
    assert_eq!(out.values::<f32>().expect("floats").to_vec(), [1.5, -2.0]);
    daemon.assert_serving("the deep chain").await;
}

/// Deep input in the encoding itself: an attr value nested 10 000 times (`AttrValue.func` →
/// `NameAttrList.attr` → `AttrValue` ...) in a CreateSession. Decoding stops at prost's depth
/// limit: INVALID_ARGUMENT, no stack overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attr_nested_ten_thousand_deep_is_invalid_not_a_stack_overflow() {
    let daemon = Daemon::start().await;
    let length_delimited = |field: u32, body: &[u8]| {
        let mut out = Vec::with_capacity(body.len() + 12);
        prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
        out
    };
    // Innermost: AttrValue { i: 1 }. Each level wraps it: AttrValue { func (10):
    // NameAttrList { attr (2): entry { key (1): "a", value (2): <inner> } } }.
    let mut value = vec![0x18, 0x01];
    for _ in 0..10_000 {
        let mut entry = length_delimited(1, b"a");
        entry.extend(length_delimited(2, &value));
        value = length_delimited(10, &length_delimited(2, &entry));
    }
    // NodeDef { name (1): "n", op (2): "NoOp", attr (5): entry { "deep": value } }.
    let mut entry = length_delimited(1, b"deep");
    entry.extend(length_delimited(2, &value));
    let mut node_def = length_delimited(1, b"n");
    node_def.extend(length_delimited(2, b"NoOp"));
    node_def.extend(length_delimited(5, &entry));
    // CreateSessionRequest { graph_def (1): GraphDef { node (1): node_def } }.
    let body = length_delimited(1, &length_delimited(1, &node_def));
    daemon
        .expect_refused(
            "an attr nested 10 000 deep",
            CREATE_SESSION,
            body,
            &[InvalidArgument],
            "recursion limit",
        )
        .await;
}

/// Deep input in a cluster file: arrays and inline tables nested 100 000 deep are a syntax
/// error naming the file and position (the TOML parser stops at its depth limit).
#[test]
fn a_cluster_file_nested_a_hundred_thousand_deep_is_a_syntax_error() {
    let depth = 100_000;
    for text in [
        format!(
            "[cluster]\nworker = {}{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        ),
        format!("a = {}1{}\n", "{b=".repeat(depth), "}".repeat(depth)),
    ] {
        let err = tessera::cluster::TaskConfig::from_toml_with_env(
            &text,
            "deep.toml",
            Vec::<(String, String)>::new(),
        )
        .expect_err("a file nested 100 000 deep");
        let message = err.to_string();
        assert!(message.starts_with("deep.toml:"), "{message}");
        assert!(message.contains("recursion"), "{message}");
    }
}
