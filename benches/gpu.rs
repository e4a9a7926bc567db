//! GPU throughput (feature `cuda`: `cargo bench --features cuda --bench gpu`). On a host
//! without a GPU it prints why and measures nothing.
//!
//! ```text
//! matmul/cublas    SGEMM of n×n float32 matrices already on the GPU, cuBLAS called directly
//!                  through cudarc: the same-run baseline
//! matmul/tessera   the MatMul GPU kernel on host inputs: copied in, cuBLAS SGEMM, the
//!                  product copied back to the host
//! matmul/resident  the MatMul GPU kernel as a step runs it between two GPU kernels: inputs
//!                  already in the GPU's memory, the product left there
//! train/cpu        one training step of an MLP (784→1024→10, batch 256, gradient descent)
//!                  as one tower on CPU:0
//! train/gpu        the same tower on GPU:0 (variables, batch split and update on CPU:0, as
//!                  TensorFlow places a tower's shared variables)
//! ```
//!
//! It prints MatMul TFLOP/s (2n³ flops per product) of the MatMul paths with tessera's share
//! of cuBLAS's, and training steps per second on the GPU against the CPU. On host inputs the
//! kernel pays two host-to-device copies and one back per product: its share grows with n as
//! the O(n³) product outweighs the O(n²) copies; on resident inputs it pays none.
//! `benches/gpu_torch.py` times PyTorch's same MLP step on the same card (`scripts/gpu-check`
//! runs both).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::CudaContext;
use tessera::client::{Session, SessionOptions};
use tessera::device::space::MemorySpace;
use tessera::device::DeviceType;
use tessera::device::{CudaProbe, GpuProbe, GpuScan};
use tessera::graph::{Graph, Output, Variable};
use tessera::kernels::cuda::gpu::GpuMemory;
use tessera::kernels::{kernel_for, OpContext, OpKernel};
use tessera::proto::NodeDef;
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;
use tessera::train::towers::{build_towers, TowerOptions};

const SIZES: [usize; 3] = [1024, 2048, 4096];
const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";

const BATCH: usize = 256;
const INPUTS: usize = 784;
const HIDDEN: usize = 1024;
const CLASSES: usize = 10;

/// Time and work measured per setup, summed over criterion's calls: (name, time, units).
static MEASURED: Mutex<Vec<(String, Duration, f64)>> = Mutex::new(Vec::new());

fn record(name: String, elapsed: Duration, units: f64) {
    let mut measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
    match measured.iter_mut().find(|m| m.0 == name) {
        Some(m) => {
            m.1 += elapsed;
            m.2 += units;
        }
        None => measured.push((name, elapsed, units)),
    }
}

/// Units per second of the setup `name`.
fn rate(name: &str) -> Option<f64> {
    let measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
    measured
        .iter()
        .find(|m| m.0 == name)
        .map(|m| m.2 / m.1.as_secs_f64())
}

/// A deterministic value in [-0.5, 0.5).
fn value(i: usize, salt: usize) -> f32 {
    ((i * 7919 + salt * 104_729) % 1000) as f32 / 1000.0 - 0.5
}

fn matrix(dims: &[usize], salt: usize, scale: f32) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(
        dims.to_vec(),
        (0..n).map(|i| value(i, salt) * scale).collect(),
    )
    .expect("matrix")
}

/// `iters` n×n SGEMMs on buffers already on GPU 0, cuBLAS called directly.
fn cublas_matmuls(n: usize, iters: u64) -> Duration {
    let ctx = CudaContext::new(0).expect("CUDA context");
    let stream = ctx.default_stream();
    let blas = CudaBlas::new(Arc::clone(&stream)).expect("cuBLAS");
    let a = stream
        .clone_htod(matrix(&[n, n], 1, 1.0).values::<f32>().unwrap().as_ref())
        .expect("copy a");
    let b = stream
        .clone_htod(matrix(&[n, n], 2, 1.0).values::<f32>().unwrap().as_ref())
        .expect("copy b");
    let mut c = stream.alloc_zeros::<f32>(n * n).expect("alloc c");
    let config = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: 1.0f32,
        lda: n as i32,
        ldb: n as i32,
        beta: 0.0f32,
        ldc: n as i32,
    };
    stream.synchronize().expect("synchronize");
    let began = Instant::now();
    for _ in 0..iters {
        // SAFETY: a, b and c each hold n·n floats, which n and the leading dimensions address.
        unsafe { blas.gemm(config, &a, &b, &mut c) }.expect("SGEMM");
    }
    stream.synchronize().expect("synchronize");
    began.elapsed()
}

/// A float32 MatMul node and its GPU kernel.
fn matmul_kernel() -> (NodeDef, Arc<dyn OpKernel>) {
    let mut node = NodeDef {
        name: "bench/MatMul".into(),
        op: "MatMul".into(),
        ..Default::default()
    };
    node.attr
        .insert("T".into(), tessera::graph::attr::value::dtype(DType::Float));
    let kernel = kernel_for("MatMul", DeviceType::Gpu).expect("GPU MatMul")(&node).expect("kernel");
    (node, kernel)
}

/// `iters` runs of tessera's MatMul GPU kernel on n×n host tensors.
fn tessera_matmuls(n: usize, iters: u64) -> Duration {
    let (node, kernel) = matmul_kernel();
    let inputs = vec![matrix(&[n, n], 1, 1.0), matrix(&[n, n], 2, 1.0)];
    let resources = ResourceMgr::new();
    let began = Instant::now();
    for _ in 0..iters {
        let mut ctx = OpContext::new(&node, inputs.clone(), &resources, GPU, 1);
        kernel.compute(&mut ctx).expect("MatMul on the GPU");
        std::hint::black_box(ctx.take_outputs());
    }
    began.elapsed()
}

/// `iters` runs of tessera's MatMul GPU kernel on n×n tensors already in the GPU's memory,
/// each product left there; the last product's copy to the host waits for the GPU's stream.
fn resident_matmuls(n: usize, iters: u64) -> Duration {
    let (node, kernel) = matmul_kernel();
    let memory: Arc<dyn MemorySpace> = GpuMemory::new(GPU);
    memory.bind().expect("the GPU's context");
    let inputs = vec![
        memory.upload(&matrix(&[n, n], 1, 1.0)).expect("copy a"),
        memory.upload(&matrix(&[n, n], 2, 1.0)).expect("copy b"),
    ];
    let resources = ResourceMgr::new();
    let mut last = None;
    let began = Instant::now();
    for _ in 0..iters {
        let mut ctx = OpContext::new(&node, inputs.clone(), &resources, GPU, 1)
            .with_memory_space(Some(&memory));
        kernel.compute(&mut ctx).expect("MatMul on the GPU");
        last = ctx.take_outputs().pop().flatten();
    }
    if let Some(product) = last {
        std::hint::black_box(product.to_host().expect("copy the product out"));
    }
    let elapsed = began.elapsed();
    memory.settle().expect("the GPU's parked errors");
    elapsed
}

/// The MLP as one tower on `device`, ready to step.
struct Mlp {
    session: Session,
    loss: String,
    train: String,
    feed: (Tensor, Tensor),
}

impl Mlp {
    fn on(session: Session, device: &str) -> Mlp {
        let mut g = Graph::new();
        let (inputs, vars) = g
            .with_device("/device:CPU:0", |g| {
                let x = g.placeholder(
                    "x",
                    DType::Float,
                    PartialShape::new(vec![None, Some(INPUTS)]),
                )?;
                let y = g.placeholder(
                    "labels",
                    DType::Float,
                    PartialShape::new(vec![None, Some(CLASSES)]),
                )?;
                let shapes = [
                    vec![INPUTS, HIDDEN],
                    vec![HIDDEN],
                    vec![HIDDEN, CLASSES],
                    vec![CLASSES],
                ];
                let mut vars: Vec<Variable> = Vec::new();
                for (k, dims) in shapes.iter().enumerate() {
                    let initial = g.constant(&matrix(dims, k + 3, 0.1))?;
                    vars.push(g.variable(&format!("v{k}"), &initial)?);
                }
                Ok((vec![x, y], vars))
            })
            .expect("variables");
        let loss = |g: &mut Graph, parts: &[Output]| -> tessera::Result<Output> {
            let w: Vec<Output> = vars
                .iter()
                .map(|v| g.read_variable(&v.handle))
                .collect::<tessera::Result<_>>()?;
            let h = g.matmul(&parts[0], &w[0])?;
            let h = g.bias_add(&h, &w[1])?;
            let h = g.relu(&h)?;
            let logits = g.matmul(&h, &w[2])?;
            let logits = g.bias_add(&logits, &w[3])?;
            let (per_row, _) = g.softmax_cross_entropy(&logits, &parts[1])?;
            g.mean(&per_row, &[0], false)
        };
        let built = build_towers(
            &mut g,
            &inputs,
            &vars,
            &Optimizer::gradient_descent(0.01),
            None,
            &TowerOptions::new(vec![device.to_string()]),
            loss,
        )
        .expect("tower");
        let init = g.global_variables_initializer().expect("init");
        session.extend(&g.to_graph_def()).expect("extend");
        session.run(&[], &[], &[&init]).expect("initialise");
        let mut labels = vec![0f32; BATCH * CLASSES];
        for r in 0..BATCH {
            labels[r * CLASSES + r % CLASSES] = 1.0;
        }
        let feed = (
            matrix(&[BATCH, INPUTS], 1, 1.0),
            Tensor::from_vec([BATCH, CLASSES], labels).expect("labels"),
        );
        Mlp {
            session,
            loss: built.loss.name(),
            train: built.train_op,
            feed,
        }
    }

    fn steps(&self, iters: u64) -> Duration {
        let began = Instant::now();
        for _ in 0..iters {
            let feeds = [
                ("x:0", self.feed.0.clone()),
                ("labels:0", self.feed.1.clone()),
            ];
            let out = self
                .session
                .run(&feeds, &[&self.loss], &[&self.train])
                .expect("training step");
            std::hint::black_box(out);
        }
        began.elapsed()
    }
}

fn bench(c: &mut Criterion) {
    let gpu_name = match CudaProbe.scan() {
        GpuScan::Found(gpus) if !gpus.is_empty() => gpus[0].name.clone(),
        GpuScan::Found(_) => {
            println!("gpu bench: skipped, the CUDA driver reports no GPU");
            return;
        }
        GpuScan::Unavailable { reason } => {
            println!("gpu bench: skipped, no GPU ({reason})");
            return;
        }
    };

    let mut group = c.benchmark_group("matmul");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for n in SIZES {
        let flops = 2.0 * (n as f64).powi(3);
        group.bench_with_input(BenchmarkId::new("cublas", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let elapsed = cublas_matmuls(n, iters);
                record(format!("cublas {n}"), elapsed, flops * iters as f64);
                elapsed
            })
        });
        group.bench_with_input(BenchmarkId::new("tessera", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let elapsed = tessera_matmuls(n, iters);
                record(format!("tessera {n}"), elapsed, flops * iters as f64);
                elapsed
            })
        });
        group.bench_with_input(BenchmarkId::new("resident", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let elapsed = resident_matmuls(n, iters);
                record(format!("resident {n}"), elapsed, flops * iters as f64);
                elapsed
            })
        });
    }
    group.finish();

    let cpu = Mlp::on(Session::local(), "/device:CPU:0");
    let gpu_session = Session::local_with(SessionOptions {
        gpu_count: 1,
        ..Default::default()
    });
    let gpu = Mlp::on(gpu_session, "/device:GPU:0");
    let mut group = c.benchmark_group("train");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for (name, mlp) in [("cpu", &cpu), ("gpu", &gpu)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let elapsed = mlp.steps(iters);
                record(format!("train {name}"), elapsed, iters as f64);
                elapsed
            })
        });
    }
    group.finish();

    println!("\nMatMul on {gpu_name}, float32, n×n · n×n");
    for n in SIZES {
        let (Some(base), Some(host), Some(resident)) = (
            rate(&format!("cublas {n}")),
            rate(&format!("tessera {n}")),
            rate(&format!("resident {n}")),
        ) else {
            continue;
        };
        println!(
            "  n = {n:5}  cuBLAS {:7.2} TFLOP/s (baseline)  tessera MatMul on host inputs \
             {:7.2} TFLOP/s (ratio {:.2}), on resident inputs {:7.2} TFLOP/s (ratio {:.2})",
            base / 1e12,
            host / 1e12,
            host / base,
            resident / 1e12,
            resident / base
        );
    }
    if let (Some(cpu), Some(gpu)) = (rate("train cpu"), rate("train gpu")) {
        println!(
            "training steps per second (MLP {INPUTS}-{HIDDEN}-{CLASSES}, batch {BATCH}): CPU \
             {cpu:.1} (baseline), GPU {gpu:.1}, ratio {:.2}; a GPU step {:.3} ms",
            gpu / cpu,
            1e3 / gpu
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
