//! The RecvTensor fast path (`tessera::wire`) against tonic's generated code, both ways round:
//! every pairing of {hand-framed, generated} server and {GrpcPeer, generated} client moves the
//! same tensor, errors keep their codes, and the hand framing writes byte for byte what
//! TensorFlow wrote in a recorded RecvTensor response.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::worker_service::{recv_tensor_worker, worker_service};
use bytes::Bytes;
use prost::Message;
use tessera::cluster::TaskId;
use tessera::peer::{CallOptions, GrpcPeer, Peer};
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::worker_service_server::{WorkerService, WorkerServiceServer};
use tessera::proto::*;
use tessera::tensor::Tensor;
use tessera::wire::message::{
    content_offset, encode_recv_tensor_response, CONTENT_ALIGN, HEADER_BYTES,
};
use tessera::wire::WorkerServer;
use tessera::wire::{server_builder, MAX_MESSAGE_BYTES};
use tessera::Code;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response};

/// Every wait on a real socket in these tests gives up after this long.
const NETWORK_DEADLINE: Duration = Duration::from_secs(10);

/// Larger than gRPC's 4 MiB default limit and than one HTTP/2 frame or window; not a multiple
/// of a page, so nothing lines up by luck.
const TENSOR_BYTES: usize = (9 << 20) + 12;

/// Step 1 answers the big tensor, step 2 NOT_FOUND, step 3 TensorFlow's recorded response.
struct RecvWorker {
    content: Bytes,
    golden: RecvTensorResponse,
}

type TonicResult<T> = std::result::Result<Response<T>, tonic::Status>;

recv_tensor_worker! { RecvWorker, {
    async fn recv_tensor(&self, request: Request<RecvTensorRequest>) -> TonicResult<RecvTensorResponse> {
        match request.into_inner().step_id {
            1 => Ok(Response::new(big_response(self.content.clone()))),
            2 => Err(tonic::Status::not_found("no tensor under key k")),
            _ => Ok(Response::new(self.golden.clone())),
        }
    }
    }
}

fn big_content() -> Bytes {
    // A byte pattern with period 251 (prime), so a shifted or truncated copy cannot match.
    Bytes::from(
        (0..TENSOR_BYTES)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>(),
    )
}

fn big_response(content: Bytes) -> RecvTensorResponse {
    RecvTensorResponse {
        tensor: Some(TensorProto {
            dtype: DataType::DtFloat as i32,
            tensor_shape: Some(TensorShapeProto {
                dim: vec![tensor_shape_proto::Dim {
                    size: (TENSOR_BYTES / 4) as i64,
                    name: String::new(),
                }],
                unknown_rank: false,
            }),
            tensor_content: content,
            ..Default::default()
        }),
        send_start_micros: 17,
        ..Default::default()
    }
}

/// The golden fixtures: `$TESSERA_GOLDEN_DIR`, else `shared/golden` beside the checkout, else
/// `/work/shared/golden`.
fn golden(name: &str) -> Vec<u8> {
    let candidates: Vec<PathBuf> = std::env::var_os("TESSERA_GOLDEN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/golden")),
            PathBuf::from("/work/shared/golden"),
        ])
        .collect();
    let Some(dir) = candidates.iter().find(|d| d.is_dir()) else {
        panic!("golden fixtures not found; set TESSERA_GOLDEN_DIR (looked in {candidates:?})");
    };
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

/// TensorFlow's RecvTensor response for a float32 [64, 32] variable (8 KiB of content).
const GOLDEN_RESPONSE: &str = "traffic/0057_WorkerService_RecvTensor.resp.pb";

#[test]
fn tensorflows_recorded_response_is_framed_as_prost_encodes_it_and_reads_back_unchanged() {
    let wire = golden(GOLDEN_RESPONSE);
    let response = RecvTensorResponse::decode(wire.as_slice()).unwrap();
    let content = response.tensor.as_ref().unwrap().tensor_content.clone();
    assert_eq!(content.len(), 64 * 32 * 4);
    let pieces = encode_recv_tensor_response(response.clone(), MAX_MESSAGE_BYTES).unwrap();
    let sent: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
    // gRPC's header (uncompressed, big-endian length), then the message in field order, the
    // bytes tonic's generated server sends. TensorFlow writes the same fields with
    // send_start_micros (field 3) first; protobuf readers take either order.
    let prost = response.encode_to_vec();
    assert_eq!(sent[0], 0);
    assert_eq!(&sent[1..HEADER_BYTES], &(prost.len() as u32).to_be_bytes());
    assert_eq!(&sent[HEADER_BYTES..], prost.as_slice());
    assert_eq!(prost.len(), wire.len());
    assert_eq!(wire[0], 3 << 3, "TensorFlow starts with send_start_micros");
    assert_eq!(
        RecvTensorResponse::decode(&sent[HEADER_BYTES..]).unwrap(),
        response
    );

    // The receiver finds tensor_content (to align it) in TensorFlow's order too: where the
    // content's first 64 bytes sit in the recording.
    let expected = wire.windows(64).position(|w| w == &content[..64]);
    assert_eq!(content_offset(&wire[..64]), expected);
    assert_eq!(
        content_offset(&prost[..64]),
        prost.windows(64).position(|w| w == &content[..64])
    );
}

/// A server on an OS-chosen port: hand-framed (`WorkerServer`) or tonic's generated one.
struct TestServer {
    address: String,
    shutdown: oneshot::Sender<()>,
    serving: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl TestServer {
    async fn start(hand_framed: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let worker = RecvWorker {
            content: big_content(),
            golden: RecvTensorResponse::decode(golden(GOLDEN_RESPONSE).as_slice()).unwrap(),
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let incoming = TcpListenerStream::new(listener);
        let stopped = async {
            let _ = stopped.await;
        };
        let serving = if hand_framed {
            tokio::spawn(
                server_builder()
                    .add_service(WorkerServer::new(worker))
                    .serve_with_incoming_shutdown(incoming, stopped),
            )
        } else {
            tokio::spawn(
                server_builder()
                    .add_service(
                        WorkerServiceServer::new(worker)
                            .max_encoding_message_size(MAX_MESSAGE_BYTES),
                    )
                    .serve_with_incoming_shutdown(incoming, stopped),
            )
        };
        Self {
            address,
            shutdown,
            serving,
        }
    }

    async fn stop(self) {
        let _ = self.shutdown.send(());
        let served = tokio::time::timeout(NETWORK_DEADLINE, self.serving)
            .await
            .expect("the test server stops within the deadline");
        served.unwrap().unwrap();
    }
}

fn request(step_id: i64) -> RecvTensorRequest {
    RecvTensorRequest {
        step_id,
        rendezvous_key: "k".into(),
        ..Default::default()
    }
}

/// RecvTensor through `GrpcPeer` (the fast path's receiving end).
async fn via_peer(address: &str, step_id: i64) -> tessera::Result<RecvTensorResponse> {
    let peer =
        GrpcPeer::connect_lazy(TaskId::new("ps", 0), address, Duration::from_secs(5)).unwrap();
    peer.recv_tensor(request(step_id), CallOptions::timeout(NETWORK_DEADLINE))
        .await
}

/// RecvTensor through tonic's generated client, as any other gRPC peer would call it.
async fn via_tonic(address: &str, step_id: i64) -> Result<RecvTensorResponse, tonic::Status> {
    let mut client = WorkerServiceClient::connect(format!("http://{address}"))
        .await
        .unwrap()
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut call = tonic::Request::new(request(step_id));
    call.set_timeout(NETWORK_DEADLINE);
    client.recv_tensor(call).await.map(Response::into_inner)
}

#[tokio::test]
async fn every_pairing_of_fast_and_generated_ends_moves_the_same_tensor() {
    let expected_content = big_content();
    let golden_response = RecvTensorResponse::decode(golden(GOLDEN_RESPONSE).as_slice()).unwrap();
    for hand_framed in [true, false] {
        let server = TestServer::start(hand_framed).await;
        let from_peer = via_peer(&server.address, 1).await.unwrap();
        let from_tonic = via_tonic(&server.address, 1).await.unwrap();
        for response in [&from_peer, &from_tonic] {
            assert_eq!(response.send_start_micros, 17);
            let tensor = Tensor::from_proto(response.tensor.as_ref().unwrap()).unwrap();
            assert_eq!(tensor.dims(), [TENSOR_BYTES / 4]);
            let content = &response.tensor.as_ref().unwrap().tensor_content;
            assert!(content[..] == expected_content[..], "content differs");
        }
        // The peer's buffer puts the content on a cache line, so kernels read it in place.
        let content = &from_peer.tensor.as_ref().unwrap().tensor_content;
        assert_eq!(content.as_ptr() as usize % CONTENT_ALIGN, 0);

        // TensorFlow's own response survives both ends unchanged.
        assert_eq!(via_peer(&server.address, 3).await.unwrap(), golden_response);
        assert_eq!(
            via_tonic(&server.address, 3).await.unwrap(),
            golden_response
        );
        server.stop().await;
    }
}

#[tokio::test]
async fn errors_keep_their_code_and_message_on_every_pairing() {
    for hand_framed in [true, false] {
        let server = TestServer::start(hand_framed).await;
        let err = via_peer(&server.address, 2).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(
            err.message(),
            format!(
                "RecvTensor on /job:ps/replica:0/task:0 at {}: no tensor under key k",
                server.address
            )
        );
        let err = via_tonic(&server.address, 2).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(err.message(), "no tensor under key k");
        server.stop().await;
    }
}

#[tokio::test]
async fn a_task_that_is_not_there_is_unavailable_naming_it() {
    // Bound, then closed: nothing listens on this port.
    let address = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let err = via_peer(&address, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message()
            .contains(&format!("/job:ps/replica:0/task:0 at {address}")),
        "{err}"
    );
}
