//! The integration tests, one module per file beside this one, built as one test binary.
//!
//! One binary links tessera once: a binary per file linked it 86 times, which took most of a
//! fresh build's time and about 9 GB of disk (86 binaries of about 108 MB). `cargo nextest`
//! still runs every test in its own process, so tests that set process-wide state (a metrics
//! recorder, the environment) stay apart. Run one file's tests by its module path: `cargo
//! nextest run tensorflow_v1::`. The CUDA tests (`gpu.rs`, `gpu_emulated.rs`) are their own
//! targets, built with `--features cuda`.

mod kernels_support;
mod support;

/// The allocator the `tessera` binary runs with, so the in-process tests run over it too.
#[global_allocator]
static ALLOCATOR: tessera::device::host_pool::PooledAllocator =
    tessera::device::host_pool::PooledAllocator;

mod auth;
mod builder_control_flow;
mod checkpoint_confinement;
mod checkpoint_format;
mod checkpoint_saver;
mod checkpoint_slices;
mod checkpoint_tf_compat;
mod cluster_spec;
mod cnn;
mod config;
mod control_flow;
mod control_flow_distributed;
mod daemon;
mod data;
mod data_confinement;
mod data_tensorflow;
mod datasets;
mod deploy_manifests;
mod device_names;
mod device_setter;
mod device_towers;
mod distributed;
mod embedding;
mod emulated_gpu;
mod executor;
mod executor_control_flow;
mod executor_inline;
mod faults;
mod functional_control_flow;
mod golden;
mod golden_control_flow;
mod gradients;
mod gradients_sparse;
mod graph_builder;
mod graph_golden;
mod hostile;
mod in_process_master;
mod kernels_array;
mod kernels_cnn;
mod kernels_cnn_elementwise;
mod kernels_conv;
mod kernels_dtypes;
mod kernels_everyday;
mod kernels_feature_columns;
mod kernels_fused;
mod kernels_golden;
mod kernels_linalg;
mod kernels_list;
mod kernels_math;
mod kernels_mlp;
mod kernels_nn;
mod kernels_ref;
mod kernels_sparse;
mod kernels_sparse_apply;
mod kernels_sparse_columns;
mod kernels_split_concat;
mod kernels_state;
mod kernels_stateless_sparse;
mod kernels_strings;
mod kernels_tensor_array;
mod layers;
mod limits;
mod limits_random;
mod loop_graphs;
mod master;
mod master_grpc;
mod metrics;
mod mlp_converges;
mod monitored;
mod op_coverage;
mod optimizers;
mod partition;
mod peer;
mod placement;
mod queues;
mod readme;
mod readme_commands;
mod readme_recipe;
mod remote_session;
mod rendezvous;
mod replication;
mod session;
mod soak;
mod sparse_accumulator;
mod step_trace;
mod storm;
mod sync_replicas;
mod systemd;
mod tensor;
mod tensor_channel;
mod tensorboard_events;
mod tensorflow_fused;
mod tensorflow_interop;
mod tensorflow_v1;
mod tls;
mod towers;
mod train;
mod train_stop;
mod variable_shard;
mod wire;
mod worker;
mod worker_grpc;

/// `autotests = false` (Cargo.toml): a file under `tests/` without its `mod` line here would
/// never be built or run, so every one must have it.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let root = std::fs::read_to_string(dir.join("integration.rs")).unwrap();
    let declared: std::collections::BTreeSet<&str> = root
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let own_targets = ["integration", "gpu", "gpu_emulated"];
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
            if !own_targets.contains(&stem.as_str()) && !declared.contains(stem.as_str()) {
                missing.push(stem);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{{{}}}.rs: add `mod NAME;` for each to tests/integration.rs, or they never run",
        missing.join(",")
    );
}
