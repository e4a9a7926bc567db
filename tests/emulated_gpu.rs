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

/// The GPU's driver rule (`tessera::device::context`) holds on the emulated GPU: a call, or a
/// free of a buffer, from a thread where the GPU's context is not current fails, and a failed
/// free parks its error for the next call. A training step drops the GPU's tensors on other
/// threads (the CPU's `_Recv` of a gradient, the session handing a fetch back in host memory,
/// the caller here dropping what it fetched on a thread of its own); each goes back to the
/// GPU's tower and is freed on its threads, so every step runs and nothing leaks.
#[test]
fn a_gpu_is_called_only_under_its_context_and_frees_every_buffer_on_its_tower() {
    use tessera::device::space::Emulated;

    let session = emulated_session();
    let model = mlp::tower_model(vec!["/device:GPU:0".into()]);
    let graph = model.graph.to_graph_def();
    session.extend(&graph).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();
    let local = session.as_local().unwrap();
    let placement = local.placement().unwrap();
    let matmul = graph
        .node
        .iter()
        .find(|n| n.op == "MatMul" && placement[&n.name] == GPU)
        .map(|n| format!("{}:0", n.name))
        .unwrap();
    let gpu = local.devices().iter().find(|d| d.name() == GPU).unwrap();
    let memory = gpu.memory_space().unwrap();
    let context = memory
        .as_any()
        .downcast_ref::<Emulated>()
        .unwrap()
        .context();
    let loss = model.loss.name();

    let mut live = Vec::new();
    let mut allocated = Vec::new();
    for step in 0..20 {
        let (x, y) = mlp::batch(step);
        let out = session
            .run(
                &[("x:0", x), ("labels:0", y)],
                &[&loss, &matmul],
                &[&model.train_op],
            )
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        std::thread::scope(|s| {
            s.spawn(move || drop(out));
        });
        allocated.push(context.allocations());
        live.push(context.allocations() - context.frees());
    }
    assert!(context.frees() > 0, "no buffer was ever freed");
    // What is alive does not grow with the steps: no more than one step's buffers in flight.
    let per_step = (allocated[19] - allocated[9]) / 10;
    assert!(per_step > 0);
    assert!(
        live[19] <= live[9] + per_step,
        "live buffers went from {} after step 10 to {} after step 20 ({per_step} allocated a \
         step)",
        live[9],
        live[19]
    );
    // The test's thread is none of the GPU's: a call from it fails as the driver's would.
    let err = memory
        .upload(&tessera::tensor::Tensor::scalar(1.0f32))
        .unwrap_err();
    assert!(
        err.message().contains("CUDA_ERROR_INVALID_CONTEXT"),
        "{err}"
    );
}

/// A small CNN's tower (conv 3x3 SAME, bias, relu, max pool 2x2, dense, softmax
/// cross-entropy): `x` [8, 6, 6, 2], 4 filters, 3 classes, variables on CPU:0.
fn cnn_tower_model(device: &str) -> mlp::Model {
    use tessera::graph::Graph;
    use tessera::tensor::{DType, PartialShape};
    use tessera::train::optimizer::Optimizer;
    use tessera::train::towers::{build_towers, TowerOptions};

    let mut g = Graph::new();
    let (inputs, vars) = g
        .with_device("/device:CPU:0", |g| {
            let x = g.placeholder(
                "x",
                DType::Float,
                PartialShape::new(vec![None, Some(6), Some(6), Some(2)]),
            )?;
            let labels = g.placeholder(
                "labels",
                DType::Float,
                PartialShape::new(vec![None, Some(3)]),
            )?;
            let shapes: [Vec<usize>; 4] = [vec![3, 3, 2, 4], vec![4], vec![36, 3], vec![3]];
            let mut vars = Vec::new();
            for (k, dims) in shapes.iter().enumerate() {
                let value = g.constant(&mlp::initial(dims, k))?;
                vars.push(g.variable(&format!("v{k}"), &value)?);
            }
            Ok((vec![x, labels], vars))
        })
        .unwrap();
    let built = build_towers(
        &mut g,
        &inputs,
        &vars,
        &Optimizer::gradient_descent(0.1),
        None,
        &TowerOptions::new(vec![device.to_string()]),
        |g, parts| {
            let read = |g: &mut Graph, k: usize| g.read_variable(&vars[k].handle);
            let (filter, bias) = (read(g, 0)?, read(g, 1)?);
            let (w, b) = (read(g, 2)?, read(g, 3)?);
            let h = g.conv2d(&parts[0], &filter, &[1, 1, 1, 1], "SAME")?;
            let h = g.bias_add(&h, &bias)?;
            let h = g.relu(&h)?;
            let h = g.max_pool(&h, &[1, 2, 2, 1], &[1, 2, 2, 1], "VALID")?;
            let h = g.reshape_to(&h, &[-1, 36])?;
            let logits = g.matmul(&h, &w)?;
            let logits = g.bias_add(&logits, &b)?;
            let (per_row, _) = g.softmax_cross_entropy(&logits, &parts[1])?;
            g.mean(&per_row, &[0], false)
        },
    )
    .unwrap();
    let init = g.global_variables_initializer().unwrap();
    mlp::Model {
        graph: g,
        vars,
        init,
        train_op: built.train_op,
        loss: built.loss,
    }
}

/// Trains `model` for 10 steps on one batch of 8 images (a closed formula of their index, so
/// every run sees the same); returns the losses before each step and the variables after.
fn train_cnn(session: &Session, model: &mlp::Model) -> (Vec<f32>, Vec<Vec<f32>>) {
    use tessera::tensor::Tensor;

    session.extend(&model.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();
    let x: Vec<f32> = (0..8 * 6 * 6 * 2)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let labels: Vec<f32> = (0..8 * 3)
        .map(|i| if i % 3 == (i / 3) % 3 { 1.0 } else { 0.0 })
        .collect();
    let losses = (0..mlp::STEPS)
        .map(|_| {
            let feeds = [
                ("x:0", Tensor::from_vec([8, 6, 6, 2], x.clone()).unwrap()),
                (
                    "labels:0",
                    Tensor::from_vec([8, 3], labels.clone()).unwrap(),
                ),
            ];
            let out = session
                .run(&feeds, &[&model.loss.name()], &[&model.train_op])
                .unwrap();
            out[0].scalar_value::<f32>().unwrap()
        })
        .collect();
    (losses, mlp::variable_values(session, model))
}

#[test]
fn a_cnn_trains_on_an_emulated_gpu_tower_with_its_convolutions_and_pools_there() {
    let session = emulated_session();
    let model = cnn_tower_model("/device:GPU:0");
    let on_gpu = train_cnn(&session, &model);
    // The convolution, the pool and both of their gradients ran on the GPU.
    let placement = session.as_local().unwrap().placement().unwrap();
    let graph = model.graph.to_graph_def();
    for op in [
        "Conv2D",
        "Conv2DBackpropInput",
        "Conv2DBackpropFilter",
        "MaxPool",
        "MaxPoolGrad",
    ] {
        let node = graph.node.iter().find(|n| n.op == op);
        let node = node.unwrap_or_else(|| panic!("the model has no {op}"));
        assert_eq!(placement[&node.name], GPU, "{op} `{}`", node.name);
    }
    let on_cpu = train_cnn(&Session::local(), &cnn_tower_model("/device:CPU:0"));
    mlp::assert_same_training(&on_gpu, &on_cpu, 1e-5);
}
