//! Conv2D and DepthwiseConv2dNative, forward and both backprops: tessera's CPU kernels beside
//! TensorFlow's own CPU kernels (oneDNN, from the venv's TensorFlow) on the same shapes,
//! interleaved in one run.
//!
//! Shapes (NHWC input, stride 1, `SAME`): Conv2D (HWIO filter) [32,28,28,1] x [5,5,1,32],
//! [32,14,14,32] x [5,5,32,64], [32,32,32,64] x [3,3,64,64]; depthwise (HWCM filter, as in
//! MobileNet's blocks) [32,28,28,128] x [3,3,128,1] and [32,28,28,32] x [3,3,32,2]. Each
//! measurement is the best of three timings of enough calls to take about 0.2 s, per call;
//! tessera's and TensorFlow's alternate three times per case and pass, and the table shows each
//! side's median and the ratio (tessera / TensorFlow; the goal: forward within 2x, backprops
//! within 3x).
//!
//! tessera's side allocates as the `tessera` binary does (the host pool).
//!
//! TensorFlow's side is `benches/conv_tf.py`, run by `$TESSERA_TF_PYTHON` or
//! `target/tf-venv/bin/python` (what `scripts/test --setup` installs); without it only
//! tessera's times are printed, saying so.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use tessera::device::DeviceType;
use tessera::graph::attr::value;
use tessera::kernels::{create_kernel, OpContext, OpKernel};
use tessera::proto::NodeDef;
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, Tensor};

/// The daemon's allocator: a kernel's output and scratch come from the host pool, as in a
/// `tessera` task, instead of fresh pages faulted in on every call.
#[global_allocator]
static ALLOCATOR: tessera::device::host_pool::PooledAllocator =
    tessera::device::host_pool::PooledAllocator;

const DEVICE: &str = "/job:localhost/replica:0/task:0/device:CPU:0";
/// Each case: its name, the forward op (its backprops are the op's name + `BackpropInput` and
/// `BackpropFilter`), the input's dims and the filter's.
#[rustfmt::skip]
const CASES: [(&str, &str, [usize; 4], [usize; 4]); 5] = [
    ("28x28x1_5x5x32", "Conv2D", [32, 28, 28, 1], [5, 5, 1, 32]),
    ("14x14x32_5x5x64", "Conv2D", [32, 14, 14, 32], [5, 5, 32, 64]),
    ("32x32x64_3x3x64", "Conv2D", [32, 32, 32, 64], [3, 3, 64, 64]),
    ("dw_28x28x128_3x3x1", "DepthwiseConv2dNative", [32, 28, 28, 128], [3, 3, 128, 1]),
    ("dw_28x28x32_3x3x2", "DepthwiseConv2dNative", [32, 28, 28, 32], [3, 3, 32, 2]),
];
const PASSES: [&str; 3] = ["forward", "backprop_input", "backprop_filter"];
/// How long one timing runs.
const TIMING: Duration = Duration::from_millis(200);
/// Alternations of tessera and TensorFlow per case and pass.
const ROUNDS: usize = 3;

fn node(op: &str) -> NodeDef {
    NodeDef {
        name: op.into(),
        op: op.into(),
        attr: [
            ("T".to_string(), value::dtype(DType::Float)),
            ("strides".to_string(), value::int_list(vec![1, 1, 1, 1])),
            ("padding".to_string(), value::string("SAME")),
        ]
        .into(),
        ..Default::default()
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// One pass of one case, ready to run.
struct Call {
    node: NodeDef,
    kernel: std::sync::Arc<dyn OpKernel>,
    inputs: Vec<Tensor>,
}

impl Call {
    fn run(&self, resources: &ResourceMgr) -> Tensor {
        let mut ctx = OpContext::new(&self.node, self.inputs.clone(), resources, DEVICE, 1);
        self.kernel.compute(&mut ctx).expect("the kernel runs");
        ctx.take_outputs().swap_remove(0).expect("one output")
    }
}

fn calls(op: &str, x_dims: [usize; 4], f_dims: [usize; 4]) -> Vec<Call> {
    let n = |d: &[usize]| d.iter().product::<usize>();
    let x = Tensor::from_vec(x_dims.to_vec(), values(n(&x_dims), 1)).unwrap();
    let f = Tensor::from_vec(f_dims.to_vec(), values(n(&f_dims), 2)).unwrap();
    // A depthwise filter is [kh, kw, in, multiplier]: in * multiplier output channels.
    let out_c = match op {
        "Conv2D" => f_dims[3],
        _ => f_dims[2] * f_dims[3],
    };
    let y_dims = [x_dims[0], x_dims[1], x_dims[2], out_c];
    let dy = Tensor::from_vec(y_dims.to_vec(), values(n(&y_dims), 3)).unwrap();
    let sizes = |d: [usize; 4]| Tensor::from_vec(vec![4], d.map(|v| v as i32).to_vec()).unwrap();
    let make = |op: &str, inputs: Vec<Tensor>| {
        let node = node(op);
        let kernel = create_kernel(&node, DeviceType::Cpu).expect("a CPU kernel");
        Call {
            node,
            kernel,
            inputs,
        }
    };
    vec![
        make(op, vec![x.clone(), f.clone()]),
        make(
            &format!("{op}BackpropInput"),
            vec![sizes(x_dims), f, dy.clone()],
        ),
        make(&format!("{op}BackpropFilter"), vec![x, sizes(f_dims), dy]),
    ]
}

/// Best of three timings of `n` calls of `f`, per call.
fn time(n: usize, mut f: impl FnMut()) -> Duration {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..n {
                f();
            }
            start.elapsed() / n as u32
        })
        .min()
        .unwrap()
}

/// TensorFlow's side: the script, answering `CASE N` with `CASE SECONDS`.
struct TensorFlow {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl TensorFlow {
    fn start() -> Option<TensorFlow> {
        let python = std::env::var("TESSERA_TF_PYTHON").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/target/tf-venv/bin/python").to_string()
        });
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/conv_tf.py");
        let args: Vec<String> = CASES
            .iter()
            .map(|(name, op, x, f)| {
                let join = |d: &[usize; 4]| d.map(|v| v.to_string()).join(",");
                format!("{name}:{op}:{}:{}", join(x), join(f))
            })
            .collect();
        let mut child = match Command::new(&python)
            .arg(script)
            .args(&args)
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                println!("conv: no TensorFlow ({python}: {e}); tessera's times only");
                return None;
            }
        };
        let stdin = child.stdin.take()?;
        let mut stdout = BufReader::new(child.stdout.take()?);
        let mut ready = String::new();
        stdout.read_line(&mut ready).ok()?;
        if ready.trim() != "ready" {
            println!("conv: TensorFlow did not start ({ready:?}); tessera's times only");
            return None;
        }
        Some(TensorFlow {
            child,
            stdin,
            stdout,
        })
    }

    fn time(&mut self, case: &str, n: usize) -> Duration {
        writeln!(self.stdin, "{case} {n}").expect("ask TensorFlow");
        self.stdin.flush().expect("ask TensorFlow");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("TensorFlow answers");
        let seconds: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an answer: {line:?}"));
        Duration::from_secs_f64(seconds)
    }
}

impl Drop for TensorFlow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // `cargo test --benches` runs each bench once without `--bench`: build, do not measure.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let resources = ResourceMgr::new();
    let mut tf = TensorFlow::start();
    println!("| case | pass | tessera ms (runs) | TensorFlow ms (runs) | tessera / TensorFlow |");
    println!("|---|---|---|---|---|");
    for (name, op, x, f) in CASES {
        for (call, pass) in calls(op, x, f).iter().zip(PASSES) {
            // Calls per timing, from one call's time.
            let once = time(1, || drop(call.run(&resources)));
            let n = (TIMING.as_secs_f64() / once.as_secs_f64()).clamp(1.0, 1000.0) as usize;
            let case = format!("{name}/{pass}");
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                ours.push(time(n, || drop(call.run(&resources))));
                if let Some(tf) = &mut tf {
                    theirs.push(tf.time(&case, n));
                }
            }
            let runs = |v: &[Duration]| {
                v.iter()
                    .map(|d| format!("{:.2}", ms(*d)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (o, t) = (median(ours.clone()), theirs.clone());
            match t.is_empty() {
                true => println!("| {name} | {pass} | {:.2} ({}) | | |", ms(o), runs(&ours)),
                false => {
                    let t = median(t);
                    println!(
                        "| {name} | {pass} | {:.2} ({}) | {:.2} ({}) | {:.2} |",
                        ms(o),
                        runs(&ours),
                        ms(t),
                        runs(&theirs),
                        o.as_secs_f64() / t.as_secs_f64()
                    );
                }
            }
        }
    }
}
