//! Each GPU kernel against its CPU kernel on the same inputs (feature `cuda`; run with
//! `cargo test --features cuda --test gpu`). Without a GPU every test that runs a kernel prints
//! why it skipped and passes, under CI too; NVRTC, which needs no GPU, is required under CI
//! (`support::requirement`), and the check that every node placed on a GPU has a GPU kernel
//! runs everywhere, on a stand-in GPU device.
//!
//! Tolerance: the GPU sums in another order (cuBLAS blocks the dot products, the reductions
//! run one thread per output) and uses its own `expf`/`logf` (a few ulp), so values agree to
//! about k·2⁻²⁴ relative for a sum of k terms; with k ≤ 64 here we allow 1e-5 absolute plus
//! 1e-5 relative, and exact equality for the kernels that do one operation per element. The
//! MLP trained for 10 steps on the GPU compounds those differences over its steps: 1e-4.

#![cfg(feature = "cuda")]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tessera::client::{Session, SessionOptions};
use tessera::device::DeviceType;
use tessera::device::{CudaProbe, GpuProbe, GpuScan};
use tessera::graph::attr::value;
use tessera::kernels::cpu::collective::Reduction;
use tessera::kernels::cuda::nccl::reduce_on_gpus;
use tessera::kernels::KernelLookup;
use tessera::kernels::{create_kernel, OpContext};
use tessera::proto::{AttrValue, NodeDef};
use tessera::runtime::resource::ResourceMgr;
use tessera::runtime::Device;
use tessera::tensor::{DType, Tensor};
use tessera::train::towers::{GradientSum, TowerOptions};

mod support;

use support::gpu_copies;
use support::kernel_check::{self, positive, tensor, update_cases, CPU, GPU};
use support::mlp;
use support::requirement;

const TOLERANCE: f32 = 1e-5;

/// Whether a GPU is there; prints why not when it is not.
fn have_gpu(test: &str) -> bool {
    match CudaProbe.scan() {
        GpuScan::Found(gpus) if !gpus.is_empty() => true,
        GpuScan::Found(_) => {
            requirement::no_gpu(test, "the CUDA driver reports no GPU");
            false
        }
        GpuScan::Unavailable { reason } => {
            requirement::no_gpu(test, &format!("no GPU ({reason})"));
            false
        }
    }
}

fn node(op: &str, attrs: &[(&str, AttrValue)]) -> NodeDef {
    kernel_check::node(op, attrs)
}

/// The same op on both devices, every output compared.
fn check(op: &str, attrs: &[(&str, AttrValue)], inputs: &[Tensor]) {
    let node = node(op, attrs);
    let cpu = kernel_check::cpu(&node, inputs);
    let gpu = kernel_check::run_on(&node, DeviceType::Gpu, GPU, inputs, &ResourceMgr::new());
    assert_eq!(gpu.len(), cpu.len(), "{op}: output count");
    for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        kernel_check::assert_close(&format!("{op} output {i}"), g, c, TOLERANCE);
    }
}

#[test]
fn matmul_matches_the_cpu_with_every_transpose() {
    if !have_gpu("matmul") {
        return;
    }
    let (m, k, n) = (17, 64, 9);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a_dims = if ta { [k, m] } else { [m, k] };
        let b_dims = if tb { [n, k] } else { [k, n] };
        let (a, b) = (tensor(&a_dims, 0.1), tensor(&b_dims, 0.7));
        check(
            "MatMul",
            &[
                ("transpose_a", value::bool(ta)),
                ("transpose_b", value::bool(tb)),
            ],
            &[a, b],
        );
    }
}

#[test]
fn batch_matmul_matches_the_cpu_with_adjoints_and_broadcast_batches() {
    if !have_gpu("batch matmul") {
        return;
    }
    let (m, k, n) = (5, 33, 7);
    let matrix =
        |adj: bool, rows: usize, cols: usize| if adj { [cols, rows] } else { [rows, cols] };
    // Same batches; one side's single matrix for every product; a broadcast on both sides
    // ([2, 1] against [3]: each operand's matrices gathered into the output's 2 × 3 order).
    let batches: [(&[usize], &[usize]); 4] =
        [(&[3], &[3]), (&[1], &[4]), (&[2, 3], &[]), (&[2, 1], &[3])];
    for (bx, by) in batches {
        for (adj_x, adj_y) in [(false, false), (true, false), (false, true), (true, true)] {
            let x_dims = [bx, &matrix(adj_x, m, k)].concat();
            let y_dims = [by, &matrix(adj_y, k, n)].concat();
            check(
                "BatchMatMulV2",
                &[("adj_x", value::bool(adj_x)), ("adj_y", value::bool(adj_y))],
                &[tensor(&x_dims, 0.2), tensor(&y_dims, 1.3)],
            );
        }
    }
}

#[test]
fn element_wise_ops_match_the_cpu_with_numpy_broadcasting() {
    if !have_gpu("element-wise") {
        return;
    }
    let x = tensor(&[6, 5], 0.3);
    for op in [
        "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Pow",
    ] {
        let base = if op == "Pow" {
            positive(&[6, 5], 0.3)
        } else {
            x.clone()
        };
        check(op, &[], &[base.clone(), tensor(&[6, 5], 1.1)]);
        check(op, &[], &[base.clone(), tensor(&[5], 2.0)]);
        check(op, &[], &[Tensor::scalar(1.5f32), base]);
        // Broadcasts on both sides.
        check(op, &[], &[positive(&[6, 1], 0.2), tensor(&[1, 5], 0.4)]);
    }
    for op in [
        "Neg",
        "Square",
        "Abs",
        "Sign",
        "Exp",
        "Reciprocal",
        "Sigmoid",
        "Tanh",
        "Relu",
    ] {
        check(op, &[], std::slice::from_ref(&x));
    }
    for op in ["Sqrt", "Rsqrt", "Log"] {
        check(op, &[], &[positive(&[6, 5], 0.3)]);
    }
    for op in ["ReluGrad", "SigmoidGrad", "TanhGrad"] {
        check(op, &[], &[tensor(&[6, 5], 0.9), x.clone()]);
    }
    for (format, bias) in [("NHWC", [5]), ("NCHW", [3])] {
        let attrs = [("data_format", value::string(format))];
        let value = tensor(&[2, 3, 4, 5], 0.6);
        check("BiasAdd", &attrs, &[value.clone(), tensor(&bias, 0.4)]);
        check("BiasAddGrad", &attrs, &[value]);
    }
}

#[test]
fn reductions_match_the_cpu_over_any_axes() {
    if !have_gpu("reductions") {
        return;
    }
    let x = tensor(&[4, 6, 5], 0.2);
    for op in ["Sum", "Mean", "Max", "Min", "Prod"] {
        for axes in [
            vec![0],
            vec![1],
            vec![2],
            vec![0, 2],
            vec![1, 2],
            vec![-1],
            vec![],
        ] {
            for keep in [false, true] {
                let axes_t = Tensor::from_vec([axes.len()], axes.clone()).unwrap();
                let node_attrs = [
                    ("keep_dims", value::bool(keep)),
                    ("Tidx", value::dtype(DType::Int32)),
                ];
                check(op, &node_attrs, &[x.clone(), axes_t]);
            }
        }
    }
    check("L2Loss", &[], &[x]);
}

#[test]
fn softmax_and_the_cross_entropies_match_the_cpu() {
    if !have_gpu("softmax") {
        return;
    }
    let logits = tensor(&[7, 10], 0.5);
    check("Softmax", &[], std::slice::from_ref(&logits));
    check("LogSoftmax", &[], std::slice::from_ref(&logits));
    // One-hot labels: row r's class is (3 r) mod 10.
    let classes: Vec<i64> = (0..7).map(|r| (3 * r) % 10).collect();
    let mut labels = vec![0f32; 70];
    for (r, &class) in classes.iter().enumerate() {
        labels[r * 10 + class as usize] = 1.0;
    }
    let labels = Tensor::from_vec([7, 10], labels).unwrap();
    check(
        "SoftmaxCrossEntropyWithLogits",
        &[],
        &[logits.clone(), labels],
    );
    let sparse = Tensor::from_vec([7], classes.clone()).unwrap();
    check(
        "SparseSoftmaxCrossEntropyWithLogits",
        &[("Tlabels", value::dtype(DType::Int64))],
        &[logits.clone(), sparse],
    );
    let sparse32 = Tensor::from_vec([7], classes.iter().map(|&c| c as i32).collect()).unwrap();
    check(
        "SparseSoftmaxCrossEntropyWithLogits",
        &[("Tlabels", value::dtype(DType::Int32))],
        &[logits, sparse32],
    );
}

/// A shape tensor (`input_sizes`, `filter_sizes`, `orig_input_shape`) of `dims`.
fn sizes(dims: &[usize]) -> Tensor {
    Tensor::from_vec([4], dims.iter().map(|&d| d as i32).collect::<Vec<_>>()).unwrap()
}

#[test]
fn convolutions_and_their_gradients_match_the_cpu() {
    if !have_gpu("convolutions") {
        return;
    }
    // The attrs of a convolution in `format` (strides and dilations in that format too).
    let attrs = |format: &str, strides: [i64; 4], dilations: [i64; 4], padding: &str| {
        vec![
            ("data_format", value::string(format)),
            ("strides", value::int_list(strides.to_vec())),
            ("dilations", value::int_list(dilations.to_vec())),
            ("padding", value::string(padding)),
        ]
    };
    let mut explicit = attrs("NHWC", [1, 2, 1, 1], [1; 4], "EXPLICIT");
    let paddings = vec![0, 0, 1, 2, 0, 1, 0, 0];
    explicit.push(("explicit_paddings", value::int_list(paddings)));
    // (input in the attrs' format, HWIO filter, attrs): SAME padding one more pixel after,
    // VALID at stride 2 with dilation 2 and grouped filters (depth 2 of 4 channels), EXPLICIT.
    let cases = [
        (
            [1, 5, 7, 3],
            [3, 2, 3, 4],
            attrs("NHWC", [1; 4], [1; 4], "SAME"),
        ),
        (
            [2, 4, 9, 8],
            [3, 2, 2, 6],
            attrs("NCHW", [1, 1, 2, 2], [1, 1, 2, 2], "VALID"),
        ),
        (
            [1, 2, 7, 6],
            [2, 3, 2, 3],
            attrs("NCHW", [1, 1, 2, 2], [1; 4], "SAME"),
        ),
        ([2, 5, 6, 2], [2, 2, 2, 3], explicit),
    ];
    for (input, filter, attrs) in cases {
        let (x, f) = (tensor(&input, 0.4), tensor(&filter, 1.2));
        check("Conv2D", &attrs, &[x.clone(), f.clone()]);
        let y = &kernel_check::cpu(&node("Conv2D", &attrs), &[x.clone(), f.clone()])[0];
        let dy = tensor(y.dims(), 2.1);
        check(
            "Conv2DBackpropInput",
            &attrs,
            &[sizes(&input), f, dy.clone()],
        );
        check("Conv2DBackpropFilter", &attrs, &[x, sizes(&filter), dy]);
    }
}

#[test]
fn pooling_and_its_gradients_match_the_cpu_ties_included() {
    if !have_gpu("pooling") {
        return;
    }
    // (format, input in that format, ksize and strides in that format, padding).
    let cases = [
        ("NHWC", [2, 5, 7, 3], [1, 2, 3, 1], [1, 1, 1, 1], "SAME"),
        ("NCHW", [2, 3, 7, 6], [1, 1, 3, 2], [1, 1, 2, 2], "SAME"),
        ("NHWC", [1, 9, 8, 4], [1, 3, 3, 1], [1, 2, 2, 1], "VALID"),
    ];
    for (format, input, ksize, strides, padding) in cases {
        let attrs = [
            ("data_format", value::string(format)),
            ("ksize", value::int_list(ksize.to_vec())),
            ("strides", value::int_list(strides.to_vec())),
            ("padding", value::string(padding)),
        ];
        let x = tensor(&input, 0.9);
        // Whole numbers: windows with equal maxima, whose gradient goes to the first.
        let ties = Tensor::from_vec(
            input.to_vec(),
            x.values::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.round())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        for x in [&x, &ties] {
            check("MaxPool", &attrs, std::slice::from_ref(x));
            let y = &kernel_check::cpu(&node("MaxPool", &attrs), std::slice::from_ref(x))[0];
            let dy = tensor(y.dims(), 1.7);
            check("MaxPoolGrad", &attrs, &[x.clone(), y.clone(), dy]);
        }
        check("AvgPool", &attrs, std::slice::from_ref(&x));
        let y = &kernel_check::cpu(&node("AvgPool", &attrs), std::slice::from_ref(&x))[0];
        check(
            "AvgPoolGrad",
            &attrs,
            &[sizes(&input), tensor(y.dims(), 0.2)],
        );
    }
}

#[test]
fn every_optimizer_update_matches_the_cpu() {
    if !have_gpu("optimizers") {
        return;
    }
    for case in update_cases(&[8, 3]) {
        let on_cpu = case.run(DeviceType::Cpu, CPU);
        let on_gpu = case.run(DeviceType::Gpu, GPU);
        for (i, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
            let what = format!("{} variable {i} after the update", case.node().name);
            kernel_check::assert_close(&what, g, c, TOLERANCE);
        }
    }
}

#[test]
fn the_mlp_trains_on_a_gpu_tower_like_on_the_cpu() {
    let session = Session::local_with(SessionOptions {
        gpu_count: 1,
        ..Default::default()
    });
    let local = session.as_local().unwrap();
    if !local
        .devices()
        .iter()
        .any(|d| d.device_type() == DeviceType::Gpu)
    {
        requirement::no_gpu("mlp on gpu", "the session found no GPU");
        return;
    }
    let model = mlp::tower_model(vec!["/device:GPU:0".into()]);
    let on_gpu = mlp::train(&session, &model);
    let on_cpu = mlp::train(&Session::local(), &mlp::single_device_model());
    mlp::assert_same_training(&on_gpu, &on_cpu, 1e-4);
    // The tower's forward and backward float ops that have a GPU kernel ran there.
    let placement = local.placement().unwrap();
    let on_gpu = [
        "MatMul",
        "BiasAdd",
        "Relu",
        "ReluGrad",
        "SoftmaxCrossEntropyWithLogits",
    ];
    let mut placed = 0;
    for node in &model.graph.to_graph_def().node {
        if node.name.starts_with("tower_0/") && on_gpu.contains(&node.op.as_str()) {
            assert_eq!(
                placement[&node.name], GPU,
                "node `{}` ({})",
                node.name, node.op
            );
            placed += 1;
        }
    }
    // Two forward MatMuls and their four gradients, two BiasAdds, Relu and its gradient, the
    // loss.
    assert!(placed >= 11, "{placed} tower ops on the GPU");
}

/// A real GPU tower's step copies what the emulated GPU's does (tests/emulated_gpu.rs): its
/// feeds, fetches and cross-device tensors, each once.
#[test]
fn a_gpu_tower_step_copies_only_its_feeds_fetches_and_cross_device_tensors() {
    if !have_gpu("gpu copies") {
        return;
    }
    gpu_copies::check_tower_step_copies(&Session::local_with(SessionOptions {
        gpu_count: 1,
        ..Default::default()
    }));
}

/// Every node that placement and partitioning put on a GPU has a GPU kernel, including the
/// `_Send`s, `_Recv`s and control edges the partitioner adds there. Needs no GPU: the session
/// has a stand-in `GPU:0` whose nodes get their GPU kernel created (not run) and then run their
/// CPU kernel, so the tower trains as on one CPU.
#[test]
fn every_node_placed_on_a_gpu_tower_has_a_gpu_kernel() {
    let on_gpu: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let seen = Arc::clone(&on_gpu);
    let kernels: Arc<KernelLookup> = Arc::new(move |node: &NodeDef, device_type| {
        if device_type == DeviceType::Gpu {
            create_kernel(node, DeviceType::Gpu)?;
            seen.lock().unwrap().insert(node.op.clone());
        }
        create_kernel(node, DeviceType::Cpu)
    });
    const LOCAL: &str = "/job:localhost/replica:0/task:0/device";
    let devices = vec![
        Arc::new(Device::new(format!("{LOCAL}:CPU:0"), DeviceType::Cpu)),
        Arc::new(Device::new(format!("{LOCAL}:GPU:0"), DeviceType::Gpu)),
    ];
    let session = Session::on_devices(
        devices,
        SessionOptions {
            kernels,
            ..Default::default()
        },
    );
    let model = mlp::tower_model(vec!["/device:GPU:0".into()]);
    let on_stand_in = mlp::train(&session, &model);
    let on_cpu = mlp::train(&Session::local(), &mlp::single_device_model());
    mlp::assert_same_training(&on_stand_in, &on_cpu, 1e-5);
    let ops = on_gpu.lock().unwrap();
    for op in ["_Recv", "_Send", "MatMul", "SoftmaxCrossEntropyWithLogits"] {
        assert!(ops.contains(op), "no {op} on the GPU; there were {ops:?}");
    }
}

#[test]
fn nccl_all_reduce_of_one_gpu_gives_back_its_tensor() {
    if !have_gpu("nccl") {
        return;
    }
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        eprintln!("nccl: libnccl not found, so the host sum was checked instead");
    }
    let node = node("NcclAllReduce", &[]);
    let resources = ResourceMgr::new();
    let ctx = OpContext::new(&node, Vec::new(), &resources, GPU, 1);
    let x = tensor(&[3, 5], 0.8);
    let out = reduce_on_gpus(&ctx, Reduction::Sum, &[(GPU.to_string(), x.clone())]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].values::<f32>().unwrap(), x.values::<f32>().unwrap());
}

/// Towers on `devices` summing their gradients with NcclAllReduce train like one CPU.
fn all_reduce_towers_train_like_the_cpu(devices: &[&str], gpus: u32) {
    let session = Session::local_with(SessionOptions {
        device_count: 2,
        gpu_count: gpus,
        ..Default::default()
    });
    let options = TowerOptions {
        gradient_sum: GradientSum::AllReduce,
        ..TowerOptions::new(devices.iter().map(|d| d.to_string()).collect())
    };
    let towers = mlp::train(&session, &mlp::tower_model_with(&options));
    let reference = mlp::train(&Session::local(), &mlp::single_device_model());
    mlp::assert_same_training(&towers, &reference, 1e-4);
}

#[test]
fn a_gpu_and_a_cpu_tower_sum_their_gradients_with_all_reduce() {
    if !have_gpu("all-reduce gpu+cpu") {
        return;
    }
    // Members on a GPU and a CPU: reduced in host memory.
    all_reduce_towers_train_like_the_cpu(&["/device:GPU:0", "/device:CPU:1"], 1);
}

#[test]
fn two_gpu_towers_sum_their_gradients_with_nccl() {
    let gpus = match CudaProbe.scan() {
        GpuScan::Found(gpus) => gpus.len(),
        GpuScan::Unavailable { .. } => 0,
    };
    if gpus < 2 {
        requirement::no_gpu(
            "nccl towers",
            &format!("{gpus} GPU(s) here and NCCL needs two"),
        );
        return;
    }
    all_reduce_towers_train_like_the_cpu(&["/device:GPU:0", "/device:GPU:1"], 2);
}

#[test]
fn the_kernels_compile_with_nvrtc_and_every_entry_point_is_in_the_ptx() {
    // NVRTC needs no GPU, so this runs wherever libnvrtc is found (CI must have it).
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        requirement::missing(
            "nvrtc",
            "libnvrtc not found",
            "scripts/test installs NVIDIA's nvidia-cuda-nvrtc-cu12 wheel and puts its lib/ on \
             LD_LIBRARY_PATH; or add a CUDA toolkit's lib64 to LD_LIBRARY_PATH",
        );
        return;
    }
    let ptx = tessera::kernels::cuda::gpu::compile().unwrap().to_src();
    for function in tessera::kernels::cuda::gpu::FUNCTIONS {
        assert!(
            ptx.contains(&format!(".entry {function}(")),
            "no entry point {function} in the PTX"
        );
    }
}
