//! Random shapes through the kernels whose output a request's small inputs decide (products,
//! convolutions, `Fill`, `Range`, `Tile`, `Concat`, `Pad`, gathers, random ops), on a task whose CPU
//! may hold 1 MiB: every step either runs or is refused with a code TensorFlow would give for
//! its input (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...), never an internal error or an abort
//! (the task is this test's own process), and the task answers the next request.
//!
//! The cases come from a seeded generator, so a failure names a case that replays. Shapes are
//! drawn mostly small, sometimes large, zero, negative or past 2^31; the ones that fit run for
//! real, so the work per case is bounded by the budget (a convolution's filter stays small).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use tessera::client::Session;
use tessera::cluster::TaskConfig;
use tessera::graph::attr::value;
use tessera::graph::builder::{Graph, NodeSpec, Output};
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Code;

/// The CPU budget: every output past it is refused before it is allocated.
const BUDGET: u64 = 1 << 20;
/// Cases per run.
const CASES: usize = 1000;

/// One dimension: mostly small, sometimes large, zero, negative or huge.
fn dim(rng: &mut StdRng) -> i64 {
    match rng.random_range(0..20) {
        0 => 0,
        1 => -rng.random_range(1..5),
        2 => rng.random_range(1i64 << 20..1i64 << 33),
        3..=5 => rng.random_range(100..5000),
        _ => rng.random_range(1..9),
    }
}

fn dims(rng: &mut StdRng, rank: usize) -> Vec<i64> {
    (0..rank).map(|_| dim(rng)).collect()
}

/// A shape as a fed int64 vector.
fn shape_feed(values: &[i64]) -> Tensor {
    Tensor::from_vec(vec![values.len()], values.to_vec()).unwrap()
}

/// The graph: every kernel under test, each reading its shapes from int64 feeds.
struct Kernels {
    graph: Graph,
}

impl Kernels {
    fn new() -> Self {
        Self {
            graph: Graph::new(),
        }
    }

    fn shape(&mut self, name: &str) -> Output {
        self.graph
            .placeholder(name, DType::Int64, PartialShape::unknown())
            .unwrap()
    }

    fn fill(&mut self, name: &str, value: Tensor) -> Output {
        let dims = self.shape(&format!("{name}_dims"));
        let value = self.graph.constant(&value).unwrap();
        self.graph
            .add1(NodeSpec::new("Fill").name(name).input(&dims).input(&value))
            .unwrap()
    }

    fn op(&mut self, spec: NodeSpec) {
        self.graph.add1(spec).unwrap();
    }
}

/// Builds every case's node: `fill_a`, `fill_b` (floats), `fill_i` (int32 zeros) from fed
/// dims, and the kernels over them.
fn build() -> Graph {
    let mut k = Kernels::new();
    let a = k.fill("fill_a", Tensor::scalar(0.5f32));
    let b = k.fill("fill_b", Tensor::scalar(0.25f32));
    let i = k.fill("fill_i", Tensor::scalar(0i32));
    let filter = k.fill("filter", Tensor::scalar(0.125f32));
    let multiples = k.shape("multiples");
    let limit = k.shape("limit");
    let delta = k.shape("delta");
    let start = k.graph.constant(&Tensor::scalar(0i64)).unwrap();
    let axis0 = k.graph.constant(&Tensor::scalar(0i32)).unwrap();
    let random_shape = k.shape("random_shape");
    let paddings = k
        .graph
        .placeholder("paddings", DType::Int64, PartialShape::unknown())
        .unwrap();
    k.op(NodeSpec::new("MatMul").name("matmul").input(&a).input(&b));
    k.op(NodeSpec::new("BatchMatMulV2")
        .name("batch_matmul")
        .input(&a)
        .input(&b));
    k.op(NodeSpec::new("Conv2D")
        .name("conv")
        .input(&a)
        .input(&filter)
        .attr("strides", value::int_list(vec![1, 1, 1, 1]))
        .attr("padding", value::string("SAME")));
    k.op(NodeSpec::new("Tile")
        .name("tile")
        .input(&a)
        .input(&multiples));
    k.op(NodeSpec::new("ConcatV2")
        .name("concat")
        .input_list(&[a.clone(), b.clone(), a.clone(), b.clone()])
        .input(&axis0));
    k.op(NodeSpec::new("Range")
        .name("range")
        .input(&start)
        .input(&limit)
        .input(&delta));
    k.op(NodeSpec::new("RandomUniform")
        .name("random")
        .input(&random_shape)
        .attr("dtype", value::dtype(DType::Float)));
    k.op(NodeSpec::new("Pad").name("pad").input(&a).input(&paddings));
    k.op(NodeSpec::new("GatherV2")
        .name("gather")
        .input(&a)
        .input(&i)
        .input(&axis0));
    k.graph
}

/// One case: the node fetched and its feeds, in words for a failure.
struct Case {
    fetch: &'static str,
    feeds: Vec<(String, Tensor)>,
    what: String,
}

fn case(rng: &mut StdRng) -> Case {
    let fetch = [
        "matmul",
        "batch_matmul",
        "conv",
        "tile",
        "concat",
        "range",
        "random",
        "gather",
        "pad",
    ][rng.random_range(0..9)];
    let mut feeds: Vec<(String, Vec<i64>)> = Vec::new();
    match fetch {
        "matmul" => {
            let (m, k, n) = (dim(rng), dim(rng), dim(rng));
            // Mostly agreeing inner dimensions, sometimes not.
            let k2 = if rng.random_bool(0.8) { k } else { dim(rng) };
            feeds.push(("fill_a_dims".into(), vec![m, k]));
            feeds.push(("fill_b_dims".into(), vec![k2, n]));
        }
        "batch_matmul" => {
            let (batch, m, k, n) = (dim(rng), dim(rng), dim(rng), dim(rng));
            feeds.push(("fill_a_dims".into(), vec![batch, m, k]));
            feeds.push(("fill_b_dims".into(), vec![1, k, n]));
        }
        "conv" => {
            let mut x = dims(rng, 4);
            // A small filter over the input's channels: the work stays bounded.
            x[3] = rng.random_range(1..5);
            let f = vec![
                rng.random_range(1..4),
                rng.random_range(1..4),
                x[3],
                rng.random_range(1..5),
            ];
            feeds.push(("fill_a_dims".into(), x));
            feeds.push(("filter_dims".into(), f));
        }
        "tile" => {
            let rank = rng.random_range(1..4);
            feeds.push(("fill_a_dims".into(), dims(rng, rank)));
            feeds.push(("multiples".into(), dims(rng, rank)));
        }
        "concat" => {
            let rank = rng.random_range(1..4);
            let mut shape = dims(rng, rank);
            feeds.push(("fill_a_dims".into(), shape.clone()));
            if rng.random_bool(0.2) {
                shape[0] = dim(rng);
            }
            feeds.push(("fill_b_dims".into(), shape));
        }
        "range" => {
            feeds.push(("limit".into(), vec![dim(rng) * rng.random_range(1..1000)]));
            feeds.push(("delta".into(), vec![rng.random_range(-2..4)]));
        }
        "random" => {
            let rank = rng.random_range(0..4);
            feeds.push(("random_shape".into(), dims(rng, rank)));
        }
        "pad" => {
            let rank = rng.random_range(1..4);
            feeds.push(("fill_a_dims".into(), dims(rng, rank)));
            feeds.push(("paddings".into(), dims(rng, 2 * rank)));
        }
        _ => {
            feeds.push(("fill_a_dims".into(), dims(rng, 2)));
            let rank = rng.random_range(1..3);
            feeds.push(("fill_i_dims".into(), dims(rng, rank)));
        }
    }
    let what = format!("{fetch} with {feeds:?}");
    let feeds = feeds
        .into_iter()
        .map(|(name, v)| {
            let t = if name == "limit" || name == "delta" {
                Tensor::scalar(v[0])
            } else if name == "paddings" {
                Tensor::from_vec(vec![v.len() / 2, 2], v).unwrap()
            } else {
                shape_feed(&v)
            };
            (format!("{name}:0"), t)
        })
        .collect();
    Case { fetch, feeds, what }
}

#[test]
fn random_shapes_through_the_expanding_kernels_never_abort_the_task() {
    let mut config = TaskConfig::local();
    config.devices.cpu_memory_limit = Some(BUDGET);
    let server = Server::start(config).unwrap();
    let session = Session::connect(&format!("grpc://{}", server.local_addr())).unwrap();
    session.extend(&build().to_graph_def()).unwrap();

    let mut rng = StdRng::seed_from_u64(20261128);
    let (mut ran, mut refused) = (0, 0);
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for n in 0..CASES {
        let case = case(&mut rng);
        let feeds: Vec<(&str, Tensor)> = case
            .feeds
            .iter()
            .map(|(name, t)| (name.as_str(), t.clone()))
            .collect();
        match session.run(&feeds, &[&format!("{}:0", case.fetch)], &[]) {
            Ok(_) => {
                ran += 1;
                *seen.entry(format!("{} ran", case.fetch)).or_default() += 1;
            }
            Err(e) => {
                *seen
                    .entry(format!("{} {:?}", case.fetch, e.code()))
                    .or_default() += 1;
                assert!(
                    matches!(
                        e.code(),
                        Code::InvalidArgument | Code::ResourceExhausted | Code::OutOfRange
                    ),
                    "case {n} ({}): {e}",
                    case.what
                );
                refused += 1;
            }
        }
        // The task answers the next request.
        let small = [("fill_a_dims:0", shape_feed(&[2, 2]))];
        let values = session.run(&small, &["fill_a:0"], &[]).unwrap();
        assert_eq!(
            values[0].values::<f32>().unwrap().as_ref(),
            &[0.5; 4],
            "after case {n}"
        );
    }
    eprintln!("{seen:?}");
    // Both outcomes were exercised.
    assert!(
        ran > CASES / 10 && refused > CASES / 10,
        "{ran} ran, {refused} refused"
    );
    server.stop();
}
