//! RunStepRequest bytes → MasterService RunStep on a running daemon whose session holds
//! TensorFlow's `session` scenario graph (x: Placeholder float [?,3], w: Const [3,2],
//! y = MatMul(x, w)).
//!
//! An empty session handle, or the handle of the recorded TensorFlow session the seeds come
//! from (`ee59f00a1ec829a6`), is replaced by the live session's, so the fuzzer reaches the
//! step itself; any other handle exercises the unknown-session path.
#![no_main]

#[path = "daemon.rs"]
mod daemon;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera::graph::attr::value;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::{CreateSessionRequest, GraphDef, NodeDef, RunStepRequest};
use tessera::tensor::{DType, PartialShape, Tensor};

const RECORDED_HANDLE: &str = "ee59f00a1ec829a6";

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

/// The live session's handle, created on the first input.
fn session() -> &'static str {
    static HANDLE: OnceLock<String> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let d = daemon::daemon();
        let w = Tensor::from_vec(vec![3, 2], vec![1f32, 2., 3., 4., 5., 6.]).expect("w");
        let graph = GraphDef {
            node: vec![
                node(
                    "x",
                    "Placeholder",
                    &[],
                    vec![
                        ("dtype", value::dtype(DType::Float)),
                        (
                            "shape",
                            value::shape(&PartialShape::new(vec![None, Some(3)])),
                        ),
                    ],
                ),
                node(
                    "w",
                    "Const",
                    &[],
                    vec![
                        ("dtype", value::dtype(DType::Float)),
                        ("value", value::tensor(w.to_proto())),
                    ],
                ),
                node(
                    "y",
                    "MatMul",
                    &["x", "w"],
                    vec![("T", value::dtype(DType::Float))],
                ),
            ],
            ..Default::default()
        };
        let mut client = MasterServiceClient::new(d.channel.clone());
        d.runtime
            .block_on(client.create_session(CreateSessionRequest {
                graph_def: Some(graph),
                ..Default::default()
            }))
            .expect("CreateSession on the fuzzed daemon")
            .into_inner()
            .session_handle
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(mut request) = RunStepRequest::decode(data) else {
        return;
    };
    if request.session_handle.is_empty() || request.session_handle == RECORDED_HANDLE {
        request.session_handle = session().to_string();
    }
    let d = daemon::daemon();
    let mut client = MasterServiceClient::new(d.channel.clone());
    let answer = d.runtime.block_on(client.run_step(request));
    daemon::check_answer("RunStep", &answer);
});
