//! GraphDef bytes → `Graph::from_graph_def`, the import and validation every CreateSession,
//! ExtendSession and RegisterGraph runs before anything executes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera::graph::Graph;
use tessera::proto::GraphDef;

fuzz_target!(|data: &[u8]| {
    let Ok(graph) = GraphDef::decode(data) else {
        return;
    };
    let _ = Graph::from_graph_def(&graph);
});
