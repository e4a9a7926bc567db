//! RunGraphRequest bytes → WorkerService RunGraph on a running daemon with two registered
//! partitions, as a master would register them:
//!
//! - graph `a`: `x = _Recv("x")`, `y = Mul(x, x)`, `_Send(y, "y")`, both ends client-side;
//! - graph `b`: `c = Const [1.5, 2.5]`, `_Send(c, "c")`.
//!
//! The input's graph handle `a` or `b` names them (any other is an unknown graph). In `send`
//! names and `recv_key`s, the incarnation `0000000000000000` stands for the device's real one
//! (random per start), so seeds written once keep working. After every call the step is
//! cleaned up (CleanupGraph), as the master does, so inputs do not depend on each other.
#![no_main]

#[path = "daemon.rs"]
mod daemon;

use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera::graph::attr::value;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{
    AttrValue, CleanupGraphRequest, GetStatusRequest, GraphDef, NodeDef, RegisterGraphRequest,
    RunGraphRequest,
};
use tessera::tensor::{DType, Tensor};

use daemon::DEVICE;

const PLACEHOLDER_INCARNATION: &str = "0000000000000000";

struct Setup {
    incarnation: String,
    /// `a`/`b` → the registered handle.
    graphs: HashMap<&'static str, String>,
}

fn node(name: &str, op: &str, inputs: &[&str], attrs: Vec<(&str, AttrValue)>) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        device: DEVICE.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attr: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..Default::default()
    }
}

/// The attrs of a client-terminated `_Send`/`_Recv` of `tensor_name` on this task's device.
fn edge(
    incarnation: u64,
    tensor_name: &str,
    dtype_attr: &'static str,
) -> Vec<(&'static str, AttrValue)> {
    vec![
        ("send_device", value::string(DEVICE)),
        ("send_device_incarnation", value::int(incarnation as i64)),
        ("recv_device", value::string(DEVICE)),
        ("tensor_name", value::string(tensor_name)),
        ("client_terminated", value::bool(true)),
        (dtype_attr, value::dtype(DType::Float)),
    ]
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let d = daemon::daemon();
        let mut client = WorkerServiceClient::new(d.channel.clone());
        d.runtime.block_on(async {
            let status = client
                .get_status(GetStatusRequest {})
                .await
                .expect("GetStatus on the fuzzed daemon")
                .into_inner();
            let incarnation = status
                .device_attributes
                .iter()
                .find(|a| a.name == DEVICE)
                .expect("the daemon has its CPU device")
                .incarnation;
            let c = Tensor::from_vec(vec![2], vec![1.5f32, 2.5]).expect("c");
            let a = vec![
                node("x", "_Recv", &[], edge(incarnation, "x", "tensor_type")),
                node(
                    "y",
                    "Mul",
                    &["x", "x"],
                    vec![("T", value::dtype(DType::Float))],
                ),
                node("send_y", "_Send", &["y"], edge(incarnation, "y", "T")),
            ];
            let b = vec![
                node(
                    "c",
                    "Const",
                    &[],
                    vec![
                        ("dtype", value::dtype(DType::Float)),
                        ("value", value::tensor(c.to_proto())),
                    ],
                ),
                node("send_c", "_Send", &["c"], edge(incarnation, "c", "T")),
            ];
            let mut graphs = HashMap::new();
            for (name, nodes) in [("a", a), ("b", b)] {
                let handle = client
                    .register_graph(RegisterGraphRequest {
                        graph_def: Some(GraphDef {
                            node: nodes,
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await
                    .expect("RegisterGraph on the fuzzed daemon")
                    .into_inner()
                    .graph_handle;
                graphs.insert(name, handle);
            }
            Setup {
                incarnation: format!("{incarnation:016x}"),
                graphs,
            }
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(mut request) = RunGraphRequest::decode(data) else {
        return;
    };
    let setup = setup();
    if let Some(handle) = setup.graphs.get(request.graph_handle.as_str()) {
        request.graph_handle = handle.clone();
    }
    for named in &mut request.send {
        named.name = named
            .name
            .replace(PLACEHOLDER_INCARNATION, &setup.incarnation);
    }
    for key in &mut request.recv_key {
        *key = key.replace(PLACEHOLDER_INCARNATION, &setup.incarnation);
    }
    let step_id = request.step_id;
    let d = daemon::daemon();
    let mut client = WorkerServiceClient::new(d.channel.clone());
    d.runtime.block_on(async {
        let answer = client.run_graph(request).await;
        daemon::check_answer("RunGraph", &answer);
        let cleanup = client.cleanup_graph(CleanupGraphRequest { step_id }).await;
        daemon::check_answer("CleanupGraph", &cleanup);
    });
});
