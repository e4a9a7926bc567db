//! A training step on a GPU tower copies only what its dataflow moves: its feeds, its fetches
//! and the tensors that cross between the GPU and the host. Shown on an emulated GPU
//! (`SessionOptions::emulated_gpus`), whose memory is a separate space in host memory that
//! counts every copy in and out, so it runs on any machine; its kernels are the CPU kernels,
//! so the tower trains exactly like one CPU up to the towers' summation order (see
//! tests/towers.rs for the 1e-5 tolerance). What a step must copy is worked out in
//! `support::gpu_copies`; tests/gpu.rs holds a real GPU to the same count.

use tessera::client::{Session, SessionOptions};

use crate::support::gpu_copies::{self, GPU};
use crate::support::mlp;

fn emulated_session() -> Session {
    Session::local_with(SessionOptions {
        emulated_gpus: 1,
        ..Default::default()
    })
}

#[test]
fn a_gpu_tower_step_copies_only_its_feeds_fetches_and_cross_device_tensors() {
    gpu_copies::check_tower_step_copies(&emulated_session());
}

#[test]
fn the_mlp_trains_on_an_emulated_gpu_tower_like_on_the_cpu() {
    let on_gpu = mlp::train(
        &emulated_session(),
        &mlp::tower_model(vec!["/device:GPU:0".into()]),
    );
    let on_cpu = mlp::train(&Session::local(), &mlp::single_device_model());
    mlp::assert_same_training(&on_gpu, &on_cpu, 1e-5);
}

#[test]
fn fetches_of_gpu_tensors_come_back_in_host_memory() {
    let session = emulated_session();
    let model = mlp::tower_model(vec!["/device:GPU:0".into()]);
    session.extend(&model.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();
    // A tensor the GPU computed: the tower's first MatMul.
    let placement = session.as_local().unwrap().placement().unwrap();
    let graph = model.graph.to_graph_def();
    let matmul = graph
        .node
        .iter()
        .find(|n| n.op == "MatMul" && placement[&n.name] == GPU)
        .unwrap();
    let (x, _) = mlp::batch(0);
    let out = session
        .run(&[("x:0", x)], &[&format!("{}:0", matmul.name)], &[])
        .unwrap();
    assert!(out[0].device_buffer().is_none(), "{:?}", out[0]);
    assert!(out[0].bytes().is_some());
    assert_eq!(out[0].dims(), [mlp::BATCH, mlp::HIDDEN]);
}
