//! Executor overhead and throughput, each printed beside its baseline from the same run.
//!
//! - `chain`: a chain of 100 AddV2 nodes on a 16-element f32 tensor, one step through the
//!   executor vs calling the same 100 kernels directly in a loop. The difference per node is
//!   the executor's scheduling overhead.
//! - `matmul`: one MatMul node of n×n f32 (n = 128, 256, 512) through the executor vs
//!   `ndarray::Array2::dot` on the same operands, in GFLOP/s (2n³ flops per product).
//! - `apply` (in the printed table): one optimizer update of a 16 MiB variable (4M f32) through
//!   the executor, `ApplyGradientDescent` and `ApplyAdagrad` on reference variables with
//!   `use_locking` false (TensorFlow's default) and true, vs a plain loop doing the same
//!   arithmetic in place on `Vec`s: the memory-bandwidth floor of the update.
//!
//! Kernels: the real CPU kernels (`kernels::kernel_for`) where they exist; otherwise the
//! minimal kernels below (AddV2 and MatMul through ndarray), and the run says so.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use ndarray::{Array2, Ix2};
use tessera::device::DeviceType;
use tessera::exec::Executor;
use tessera::graph::attr;
use tessera::kernels::{self, OpContext, OpKernel};
use tessera::proto::{GraphDef, NodeDef};
use tessera::runtime::{Device, StepOptions};
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Result;

const CHAIN: usize = 100;

/// AddV2 of two same-shape f32 tensors, for runs where the real kernel has not landed.
struct MinimalAdd;

impl OpKernel for MinimalAdd {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let sum = ctx.input(0)?.to_array::<f32>()? + ctx.input(1)?.to_array::<f32>()?;
        ctx.set_output(0, Tensor::from_array(sum));
        Ok(())
    }
}

/// MatMul of two f32 matrices (no transposes), for runs without the real kernel.
struct MinimalMatMul;

impl OpKernel for MinimalMatMul {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let a = ctx
            .input(0)?
            .to_array::<f32>()?
            .into_dimensionality::<Ix2>()
            .map_err(|e| ctx.invalid(e))?;
        let b = ctx
            .input(1)?
            .to_array::<f32>()?
            .into_dimensionality::<Ix2>()
            .map_err(|e| ctx.invalid(e))?;
        ctx.set_output(0, Tensor::from_array(a.dot(&b).into_dyn()));
        Ok(())
    }
}

/// The real kernel when tessera has one, else the minimal one; records which.
fn lookup(node: &NodeDef, device: DeviceType) -> Result<Arc<dyn OpKernel>> {
    if kernels::kernel_for(&node.op, device).is_some() {
        return kernels::create_kernel(node, device);
    }
    Ok(match node.op.as_str() {
        "AddV2" => Arc::new(MinimalAdd),
        "MatMul" => Arc::new(MinimalMatMul),
        other => kernels::create_kernel(node, device).map_err(|e| e.context(other))?,
    })
}

fn kernel_source(op: &str) -> &'static str {
    if kernels::kernel_for(op, DeviceType::Cpu).is_some() {
        "real kernel"
    } else {
        "minimal bench kernel (real one not on main yet)"
    }
}

fn node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
    let mut n = NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    n.attr.insert("T".into(), attr::value::dtype(DType::Float));
    n
}

fn placeholder(name: &str) -> NodeDef {
    let mut n = node(name, "Placeholder", &[]);
    n.attr
        .insert("dtype".into(), attr::value::dtype(DType::Float));
    n.attr
        .insert("shape".into(), attr::value::shape(&PartialShape::unknown()));
    n
}

/// x, c fed; n1 = x + c, n_i = n_{i-1} + c, fetch n100.
fn chain_graph() -> GraphDef {
    let mut nodes = vec![placeholder("x"), placeholder("c")];
    for i in 1..=CHAIN {
        let prev = if i == 1 {
            "x".to_string()
        } else {
            format!("n{}", i - 1)
        };
        nodes.push(node(&format!("n{i}"), "AddV2", &[&prev, "c"]));
    }
    GraphDef {
        node: nodes,
        ..Default::default()
    }
}

fn matmul_graph() -> GraphDef {
    let mut mm = node("mm", "MatMul", &["a", "b"]);
    mm.attr
        .insert("transpose_a".into(), attr::value::bool(false));
    mm.attr
        .insert("transpose_b".into(), attr::value::bool(false));
    GraphDef {
        node: vec![placeholder("a"), placeholder("b"), mm],
        ..Default::default()
    }
}

/// Mean time per call of `f` and of `g`: each the best of seven batches of at least `batch`,
/// the batches of the two taken in turn so that both see the same load on a shared machine.
fn time_pair(mut f: impl FnMut(), mut g: impl FnMut(), batch: Duration) -> (Duration, Duration) {
    fn one(f: &mut impl FnMut(), batch: Duration) -> Duration {
        let start = Instant::now();
        let mut calls = 0u32;
        while start.elapsed() < batch {
            f();
            calls += 1;
        }
        start.elapsed() / calls
    }
    for _ in 0..3 {
        f();
        g();
    }
    let (mut best_f, mut best_g) = (Duration::MAX, Duration::MAX);
    for _ in 0..7 {
        best_f = best_f.min(one(&mut f, batch));
        best_g = best_g.min(one(&mut g, batch));
    }
    (best_f, best_g)
}

struct Chain {
    executor: Executor,
    feeds: Vec<Tensor>,
    nodes: Vec<(NodeDef, Arc<dyn OpKernel>)>,
    device: Arc<Device>,
}

impl Chain {
    fn new() -> Self {
        Self::on(Device::local_cpu())
    }

    /// The chain on `device`.
    fn on(device: Device) -> Self {
        let graph = chain_graph();
        let device = Arc::new(device);
        let executor = Executor::new(
            &graph,
            &["x", "c"],
            &[&format!("n{CHAIN}")],
            &[],
            device.clone(),
            &lookup,
        )
        .expect("chain executor");
        let ones = Tensor::from_vec([16], vec![1.0f32; 16]).expect("16 values");
        let nodes = graph.node[2..]
            .iter()
            .map(|n| (n.clone(), lookup(n, DeviceType::Cpu).expect("kernel")))
            .collect();
        Self {
            executor,
            feeds: vec![ones.clone(), ones],
            nodes,
            device,
        }
    }

    fn step(&self) -> Tensor {
        let out = self
            .executor
            .run(self.feeds.clone(), &StepOptions::default())
            .expect("chain step");
        out.into_iter().next().expect("one fetch")
    }

    /// The same kernels called one after another on this thread: no executor at all.
    fn direct(&self) -> Tensor {
        let mut value = self.feeds[0].clone();
        let c = &self.feeds[1];
        for (def, kernel) in &self.nodes {
            let mut ctx = OpContext::new(
                def,
                vec![value, c.clone()],
                self.device.resources(),
                self.device.name(),
                0,
            );
            kernel.compute(&mut ctx).expect("direct kernel");
            value = ctx.take_outputs().swap_remove(0).expect("one output");
        }
        value
    }
}

fn square(n: usize, seed: f32) -> Array2<f32> {
    Array2::from_shape_fn((n, n), |(i, j)| {
        ((i * 31 + j * 17) % 13) as f32 * 0.1 + seed
    })
}

fn bench_chain(c: &mut Criterion) {
    let chain = Chain::new();
    // 1 + 100 * 1 = 101 in every element.
    assert_eq!(chain.step().values::<f32>().unwrap()[0], 1.0 + CHAIN as f32);
    assert_eq!(chain.direct(), chain.step());
    let mut group = c.benchmark_group("chain100_addv2");
    group.throughput(Throughput::Elements(CHAIN as u64));
    group.bench_function("executor", |b| b.iter(|| black_box(chain.step())));
    group.bench_function("direct_kernel_calls", |b| {
        b.iter(|| black_box(chain.direct()))
    });
    // The same chain on a device with a memory budget: every output charged and released.
    let budgeted = Chain::on(Device::local_cpu().with_memory_limit(1 << 30));
    group.bench_function("executor_with_memory_budget", |b| {
        b.iter(|| black_box(budgeted.step()))
    });
    group.finish();
    let (plain, charged) = time_pair(
        || drop(black_box(chain.step())),
        || drop(black_box(budgeted.step())),
        Duration::from_millis(200),
    );
    println!(
        "chain100 step: {:.1} us without a memory budget, {:.1} us with one ({:.3}x)",
        plain.as_secs_f64() * 1e6,
        charged.as_secs_f64() * 1e6,
        charged.as_secs_f64() / plain.as_secs_f64()
    );
}

fn bench_matmul(c: &mut Criterion) {
    let graph = matmul_graph();
    let device = Arc::new(Device::local_cpu());
    let executor =
        Executor::new(&graph, &["a", "b"], &["mm"], &[], device, &lookup).expect("matmul executor");
    let mut group = c.benchmark_group("matmul_f32");
    for n in [128usize, 256, 512] {
        let (a, b) = (square(n, 0.0), square(n, 1.0));
        let feeds = vec![
            Tensor::from_array(a.clone().into_dyn()),
            Tensor::from_array(b.clone().into_dyn()),
        ];
        group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        group.bench_with_input(BenchmarkId::new("executor", n), &n, |bench, _| {
            bench.iter(|| {
                black_box(
                    executor
                        .run(feeds.clone(), &StepOptions::default())
                        .expect("matmul"),
                )
            })
        });
        group.bench_with_input(BenchmarkId::new("ndarray_dot", n), &n, |bench, _| {
            bench.iter(|| black_box(a.dot(&b)))
        });
    }
    group.finish();
}

/// The table this bench exists for: each result beside its baseline, timed in this run.
fn summary() {
    let batch = Duration::from_millis(100);
    println!("\n== executor vs baseline (same run; best of 7 alternating batches) ==");
    println!(
        "AddV2: {}; MatMul: {}",
        kernel_source("AddV2"),
        kernel_source("MatMul")
    );
    let chain = Chain::new();
    let (exec, direct) = time_pair(
        || drop(black_box(chain.step())),
        || drop(black_box(chain.direct())),
        batch,
    );
    let per_node = |d: Duration| d.as_nanos() as f64 / CHAIN as f64;
    println!(
        "chain of {CHAIN} AddV2 [16] f32: executor {:.0} ns/node, direct kernel calls {:.0} ns/node, \
         overhead {:.0} ns/node ({:.2}x)",
        per_node(exec),
        per_node(direct),
        per_node(exec) - per_node(direct),
        exec.as_secs_f64() / direct.as_secs_f64()
    );
    let graph = matmul_graph();
    let executor = Executor::new(
        &graph,
        &["a", "b"],
        &["mm"],
        &[],
        Arc::new(Device::local_cpu()),
        &lookup,
    )
    .expect("matmul");
    for n in [128usize, 256, 512] {
        let (a, b) = (square(n, 0.0), square(n, 1.0));
        let feeds = vec![
            Tensor::from_array(a.clone().into_dyn()),
            Tensor::from_array(b.clone().into_dyn()),
        ];
        let flops = 2.0 * (n as f64).powi(3);
        let (exec, dot) = time_pair(
            || {
                drop(black_box(
                    executor.run(feeds.clone(), &StepOptions::default()),
                ))
            },
            || drop(black_box(a.dot(&b))),
            batch,
        );
        println!(
            "matmul {n}x{n} f32: executor {:.2} GFLOP/s, ndarray::dot {:.2} GFLOP/s ({:.2}x)",
            flops / exec.as_secs_f64() / 1e9,
            flops / dot.as_secs_f64() / 1e9,
            dot.as_secs_f64() / exec.as_secs_f64()
        );
    }
}

/// Elements of the variable the `apply` rows update: 16 MiB of f32.
const APPLY_ELEMENTS: usize = 4 << 20;

/// A graph of reference variables `w` and `accum` (4M f32 each), their initializer `init`,
/// and `update`: `op` (ApplyGradientDescent or ApplyAdagrad) with the gradient fed as `g`.
fn apply_graph(op: &str, use_locking: bool) -> GraphDef {
    let float = attr::value::dtype(DType::Float);
    let node = |name: &str, kind: &str, inputs: &[&str], attrs: Vec<(&str, _)>| {
        let mut n = NodeDef {
            name: name.into(),
            op: kind.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        for (k, v) in attrs {
            n.attr.insert(k.to_string(), v);
        }
        n
    };
    let shape = attr::value::shape(&PartialShape::from(tessera::tensor::Shape::from(vec![
        APPLY_ELEMENTS,
    ])));
    let fill = |name: &str, x: f32| {
        let t = Tensor::from_vec([APPLY_ELEMENTS], vec![x; APPLY_ELEMENTS]).unwrap();
        node(
            name,
            "Const",
            &[],
            vec![
                ("dtype", float.clone()),
                ("value", attr::value::tensor(t.to_proto())),
            ],
        )
    };
    let mut nodes = vec![
        node(
            "w",
            "VariableV2",
            &[],
            vec![("dtype", float.clone()), ("shape", shape.clone())],
        ),
        node(
            "accum",
            "VariableV2",
            &[],
            vec![("dtype", float.clone()), ("shape", shape)],
        ),
        fill("one", 1.0),
        fill("tenth", 0.1),
        node(
            "init_w",
            "Assign",
            &["w", "one"],
            vec![("T", float.clone())],
        ),
        node(
            "init_accum",
            "Assign",
            &["accum", "tenth"],
            vec![("T", float.clone())],
        ),
        node("init", "NoOp", &["^init_w", "^init_accum"], vec![]),
        node("g", "Placeholder", &[], vec![("dtype", float.clone())]),
        node(
            "lr",
            "Const",
            &[],
            vec![
                ("dtype", float.clone()),
                (
                    "value",
                    attr::value::tensor(Tensor::scalar(0.01f32).to_proto()),
                ),
            ],
        ),
    ];
    let inputs: &[&str] = if op == "ApplyAdagrad" {
        &["w", "accum", "lr", "g"]
    } else {
        &["w", "lr", "g"]
    };
    nodes.push(node(
        "update",
        op,
        inputs,
        vec![
            ("T", float),
            ("use_locking", attr::value::bool(use_locking)),
        ],
    ));
    GraphDef {
        node: nodes,
        ..Default::default()
    }
}

/// The `apply` rows of the table: each update through the executor beside the plain loop.
fn apply_summary(batch: Duration) {
    let grad = vec![0.5f32; APPLY_ELEMENTS];
    let mut w = vec![1.0f32; APPLY_ELEMENTS];
    let mut accum = vec![0.1f32; APPLY_ELEMENTS];
    let lr = black_box(0.01f32);
    for op in ["ApplyGradientDescent", "ApplyAdagrad"] {
        let mut loop_update = || {
            if op == "ApplyAdagrad" {
                for ((w, a), g) in w.iter_mut().zip(accum.iter_mut()).zip(&grad) {
                    *a += g * g;
                    *w -= lr * g / a.sqrt();
                }
            } else {
                for (w, g) in w.iter_mut().zip(&grad) {
                    *w -= lr * g;
                }
            }
            black_box(&w);
        };
        for use_locking in [false, true] {
            let graph = apply_graph(op, use_locking);
            let device = Arc::new(Device::local_cpu());
            let init = Executor::new(&graph, &[], &[], &["init"], device.clone(), &lookup)
                .expect("apply init");
            init.run(Vec::new(), &StepOptions::default()).expect("init");
            let update = Executor::new(&graph, &["g"], &[], &["update"], device, &lookup)
                .expect("apply update");
            let feed = vec![Tensor::from_vec([APPLY_ELEMENTS], grad.clone()).unwrap()];
            let (exec, plain) = time_pair(
                || {
                    update
                        .run(feed.clone(), &StepOptions::default())
                        .expect("update");
                },
                &mut loop_update,
                batch,
            );
            let gib = |d: Duration| {
                // Bytes each update must move: read grad, read and write each variable.
                let arrays = if op == "ApplyAdagrad" { 5.0 } else { 3.0 };
                arrays * (APPLY_ELEMENTS * 4) as f64 / d.as_secs_f64() / (1u64 << 30) as f64
            };
            println!(
                "{op} on 16 MiB, use_locking={use_locking}: executor {:.2} ms ({:.1} GiB/s), \
                 plain loop {:.2} ms ({:.1} GiB/s), {:.2}x the loop's time",
                exec.as_secs_f64() * 1e3,
                gib(exec),
                plain.as_secs_f64() * 1e3,
                gib(plain),
                exec.as_secs_f64() / plain.as_secs_f64()
            );
        }
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_chain(&mut criterion);
    bench_matmul(&mut criterion);
    criterion.final_summary();
    // `cargo test --benches` runs each bench once without `--bench`; the table is for real runs.
    if std::env::args().any(|a| a == "--bench") {
        summary();
        apply_summary(Duration::from_millis(300));
    }
}
