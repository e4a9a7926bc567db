//! TensorFlow 1 control flow built with the graph builder (`Graph::cond`, `Graph::while_loop`):
//! the nodes laid out as `tf.compat.v1.cond` / `tf.compat.v1.while_loop` lay them out, the
//! values they compute in an in-process session, and their gradients, checked against central
//! differences in float64 and against the gradients TensorFlow 2.21 computes for the same
//! graphs and inputs (`tests/builder_control_flow_tf.py` prints them). Also: training a small
//! recurrent model with reference variables (`VariableV2`, `Apply*`) reaches the same losses as
//! with resource variables.

use tessera::client::Session;
use tessera::graph::{gradients, Graph, NodeSpec, Output, Variable, VariableKind};
use tessera::proto::NodeDef;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;
use tessera::{Code, Result};

/// The tests' inputs, as the TensorFlow script computes them: `((k * 37 + seed) % 23) / 23
/// - 0.5`.
fn values(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|k| ((k * 37 + seed) % 23) as f64 / 23.0 - 0.5)
        .collect()
}

fn f64s(dims: &[usize], seed: usize) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(dims.to_vec(), values(n, seed)).unwrap()
}

fn ph(g: &mut Graph, name: &str, dtype: DType, dims: &[usize]) -> Output {
    let dims: Vec<Option<usize>> = dims.iter().map(|&d| Some(d)).collect();
    g.placeholder(name, dtype, PartialShape::new(dims)).unwrap()
}

fn node<'a>(g: &'a Graph, name: &str) -> &'a NodeDef {
    g.node(name)
        .unwrap_or_else(|| panic!("no node `{name}`; nodes: {:?}", names(g)))
}

fn names(g: &Graph) -> Vec<String> {
    g.nodes().iter().map(|n| n.name.clone()).collect()
}

fn attr_bool(n: &NodeDef, name: &str) -> bool {
    tessera::graph::attr::bool_or(n, name, false).unwrap()
}

fn attr_str(n: &NodeDef, name: &str) -> String {
    tessera::graph::attr::string_or(n, name, "").unwrap()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: got {a}, want {b} (all: {got:?})"
        );
    }
}

/// A graph with its loss and the gradients of the loss with respect to some placeholders,
/// ready to run.
struct Differentiated {
    /// The graph with its gradients.
    graph: Graph,
    session: Session,
    loss: String,
    xs: Vec<String>,
    grads: Vec<String>,
}

impl Differentiated {
    fn new(mut g: Graph, loss: &Output, xs: &[Output]) -> Self {
        let grads = gradients(&mut g, std::slice::from_ref(loss), xs, None).unwrap();
        let grads = grads
            .iter()
            .enumerate()
            .map(|(i, gr)| {
                gr.as_ref()
                    .unwrap_or_else(|| panic!("no gradient for `{}`", xs[i].name()))
                    .name()
            })
            .collect();
        let session = Session::local();
        session.extend(&g.to_graph_def()).unwrap();
        Self {
            graph: g,
            session,
            loss: loss.name(),
            xs: xs.iter().map(Output::name).collect(),
            grads,
        }
    }

    /// Runs the loss and the gradients.
    fn run(&self, feeds: &[(&str, Tensor)]) -> (f64, Vec<Vec<f64>>) {
        let mut fetch = vec![self.loss.as_str()];
        fetch.extend(self.grads.iter().map(String::as_str));
        let out = self.session.run(feeds, &fetch, &[]).unwrap();
        let loss = out[0].scalar_value::<f64>().unwrap();
        let grads = out[1..]
            .iter()
            .map(|t| t.values::<f64>().unwrap().into_owned())
            .collect();
        (loss, grads)
    }

    fn loss_at(&self, feeds: &[(&str, Tensor)]) -> f64 {
        let out = self.session.run(feeds, &[&self.loss], &[]).unwrap();
        out[0].scalar_value::<f64>().unwrap()
    }

    /// Checks every gradient element against `(L(x + h) - L(x - h)) / 2h`.
    fn check_numerically(&self, what: &str, feeds: &[(&str, Tensor)], grads: &[Vec<f64>]) {
        let h = 1e-6;
        for (k, x) in self.xs.iter().enumerate() {
            let at = feeds
                .iter()
                .position(|(n, _)| n == x)
                .unwrap_or_else(|| panic!("{x} is not fed"));
            let base = feeds[at].1.values::<f64>().unwrap().into_owned();
            let dims = feeds[at].1.dims().to_vec();
            for j in 0..base.len() {
                let shifted = |delta: f64| {
                    let mut v = base.clone();
                    v[j] += delta;
                    let mut f = feeds.to_vec();
                    f[at].1 = Tensor::from_vec(dims.clone(), v).unwrap();
                    self.loss_at(&f)
                };
                let numeric = (shifted(h) - shifted(-h)) / (2.0 * h);
                let symbolic = grads[k][j];
                assert!(
                    (numeric - symbolic).abs() <= 1e-7 + 1e-6 * numeric.abs(),
                    "{what}: d loss / d {x}[{j}]: symbolic {symbolic}, numeric {numeric}"
                );
            }
        }
    }
}

/// `cond(p, lambda: tanh(x * y) + 0.5 * x, lambda: x * x * y)`, weighted and summed.
fn cond_graph() -> (Graph, Output, Vec<Output>) {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Double, &[3]);
    let y = ph(&mut g, "y", DType::Double, &[3]);
    let p = ph(&mut g, "p", DType::Bool, &[]);
    let (xt, yt) = (x.clone(), y.clone());
    let out = g
        .cond(
            &p,
            |g| {
                let xy = g.mul(&xt, &yt)?;
                let t = g.unary("Tanh", &xy)?;
                let half = g.scalar("Const", DType::Double, 0.5)?;
                let hx = g.mul(&half, &xt)?;
                Ok(vec![g.add(&t, &hx)?])
            },
            |g| {
                let xx = g.mul(&x, &x)?;
                Ok(vec![g.mul(&xx, &y)?])
            },
        )
        .unwrap();
    let w = g
        .constant(&Tensor::from_vec([3], vec![1.0f64, 2.0, 3.0]).unwrap())
        .unwrap();
    let weighted = g.mul(&out[0], &w).unwrap();
    let loss = g.sum(&weighted, &[0], false).unwrap();
    (g, loss, vec![x.clone(), y.clone()])
}

#[test]
fn a_cond_is_laid_out_as_tensorflow_lays_it_out_and_runs_one_branch() {
    let (g, _, _) = cond_graph();
    assert_eq!(node(&g, "cond/Switch").input, ["p", "p"]);
    assert_eq!(node(&g, "cond/switch_t").input, ["cond/Switch:1"]);
    assert_eq!(node(&g, "cond/switch_f").input, ["cond/Switch"]);
    assert_eq!(node(&g, "cond/pred_id").input, ["p"]);
    // Each branch switches the outside values it reads, on pred_id, and takes its side.
    assert_eq!(node(&g, "cond/mul/Switch").input, ["x", "cond/pred_id"]);
    assert_eq!(node(&g, "cond/mul/Switch_1").input, ["y", "cond/pred_id"]);
    assert_eq!(
        node(&g, "cond/mul").input,
        ["cond/mul/Switch:1", "cond/mul/Switch_1:1"]
    );
    assert_eq!(node(&g, "cond/mul_2/Switch").input, ["x", "cond/pred_id"]);
    assert_eq!(
        node(&g, "cond/mul_2").input,
        ["cond/mul_2/Switch", "cond/mul_2/Switch"]
    );
    // A constant in a branch runs only with it.
    assert_eq!(node(&g, "cond/Const").input, ["^cond/switch_t"]);
    // The merge takes the false branch first.
    assert_eq!(node(&g, "cond/Merge").input, ["cond/mul_3", "cond/add"]);

    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let (x, y) = (values(3, 1), values(3, 2));
    for p in [true, false] {
        let out = session
            .run(
                &[
                    ("x:0", f64s(&[3], 1)),
                    ("y:0", f64s(&[3], 2)),
                    ("p:0", Tensor::scalar(p)),
                ],
                &["cond/Merge:0", "cond/Merge:1"],
                &[],
            )
            .unwrap();
        let want: Vec<f64> = (0..3)
            .map(|i| {
                if p {
                    (x[i] * y[i]).tanh() + 0.5 * x[i]
                } else {
                    x[i] * x[i] * y[i]
                }
            })
            .collect();
        assert_close("cond value", &out[0].values::<f64>().unwrap(), &want, 1e-15);
        assert_eq!(out[1].scalar_value::<i32>().unwrap(), p as i32);
    }
}

#[test]
fn a_branch_returning_an_outside_tensor_returns_it_through_a_switch() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, &[]);
    let p = ph(&mut g, "p", DType::Bool, &[]);
    let xc = x.clone();
    let out = g
        .cond(
            &p,
            |_| Ok(vec![xc]),
            |g| Ok(vec![g.scalar("Const", DType::Float, -1.0)?]),
        )
        .unwrap();
    assert_eq!(node(&g, "cond/Switch_1").input, ["x", "cond/pred_id"]);
    assert_eq!(
        node(&g, "cond/Merge").input,
        ["cond/Const", "cond/Switch_1:1"]
    );
    assert_eq!(node(&g, "cond/Const").input, ["^cond/switch_f"]);
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    for (p, want) in [(true, 4.0f32), (false, -1.0)] {
        let r = session
            .run(
                &[("x:0", Tensor::scalar(4f32)), ("p:0", Tensor::scalar(p))],
                &[&out[0].name()],
                &[],
            )
            .unwrap();
        assert_eq!(r[0].scalar_value::<f32>().unwrap(), want);
    }
}

/// The recurrent loop of the TensorFlow script: `h = tanh(xs[i] w + h u + b)`, `acc += h * h`
/// for `i < steps`, `w`, `u`, `b` and `xs` read from outside the loop.
fn rnn_loop(
    g: &mut Graph,
    xs: &Output,
    h0: &Output,
    [w, u, b]: [&Output; 3],
    steps: i32,
    parallel_iterations: i64,
) -> Result<Vec<Output>> {
    let i0 = g.const_i32("Const", &[], &[0])?;
    let zero = g.constant(&Tensor::zeros(
        h0.dtype,
        h0.shape.to_shape().unwrap().dims().to_vec(),
    )?)?;
    let n = g.const_i32("steps", &[], &[steps])?;
    g.while_loop(
        |g, v| g.binary("Less", &v[0], &n),
        |g, v| {
            let x_t = g.gather(xs, &v[0], 0)?;
            let xw = g.matmul(&x_t, w)?;
            let hu = g.matmul(&v[1], u)?;
            let s = g.add(&xw, &hu)?;
            let s = g.add(&s, b)?;
            let h = g.unary("Tanh", &s)?;
            let one = g.const_i32("add/y", &[], &[1])?;
            let i = g.add(&v[0], &one)?;
            let hh = g.mul(&h, &h)?;
            let acc = g.add(&v[2], &hh)?;
            Ok(vec![i, h, acc])
        },
        &[i0, h0.clone(), zero],
        parallel_iterations,
        "",
    )
}

fn rnn_graph(parallel_iterations: i64) -> (Graph, Output, Vec<Output>) {
    let mut g = Graph::new();
    let xs = ph(&mut g, "xs", DType::Double, &[4, 2, 3]);
    let h0 = ph(&mut g, "h0", DType::Double, &[2, 2]);
    let w = ph(&mut g, "w", DType::Double, &[3, 2]);
    let u = ph(&mut g, "u", DType::Double, &[2, 2]);
    let b = ph(&mut g, "b", DType::Double, &[2]);
    let out = rnn_loop(&mut g, &xs, &h0, [&w, &u, &b], 4, parallel_iterations).unwrap();
    let v = g
        .constant(&Tensor::from_vec([2, 2], vec![1.0f64, -1.0, 0.5, 2.0]).unwrap())
        .unwrap();
    let acc = g.sum(&out[2], &[0, 1], false).unwrap();
    let hv = g.mul(&out[1], &v).unwrap();
    let hv = g.sum(&hv, &[0, 1], false).unwrap();
    let loss = g.add(&acc, &hv).unwrap();
    (g, loss, vec![xs, h0, w, u, b])
}

fn rnn_feeds() -> Vec<(&'static str, Tensor)> {
    vec![
        ("xs:0", f64s(&[4, 2, 3], 3)),
        ("h0:0", f64s(&[2, 2], 4)),
        ("w:0", f64s(&[3, 2], 5)),
        ("u:0", f64s(&[2, 2], 6)),
        ("b:0", f64s(&[2], 7)),
    ]
}

#[test]
fn a_while_loop_is_laid_out_as_tensorflow_lays_it_out_and_iterates() {
    let (g, _, _) = rnn_graph(10);
    let frame = "while/while_context";
    for (enter, input) in [
        ("while/Enter", "Const"),
        ("while/Enter_1", "h0"),
        ("while/Enter_2", "Const_1"),
    ] {
        let n = node(&g, enter);
        assert_eq!(n.op, "Enter");
        assert_eq!(n.input, [input]);
        assert_eq!(attr_str(n, "frame_name"), frame);
        assert!(!attr_bool(n, "is_constant"), "{enter}");
    }
    assert_eq!(
        node(&g, "while/Merge_1").input,
        ["while/Enter_1", "while/NextIteration_1"]
    );
    assert_eq!(node(&g, "while/LoopCond").input, ["while/Less"]);
    assert_eq!(
        node(&g, "while/Switch_1").input,
        ["while/Merge_1", "while/LoopCond"]
    );
    assert_eq!(node(&g, "while/Identity_1").input, ["while/Switch_1:1"]);
    assert_eq!(node(&g, "while/NextIteration_1").input, ["while/Tanh"]);
    assert_eq!(node(&g, "while/Exit_1").input, ["while/Switch_1"]);
    // Values from outside enter once, as loop invariants, where they are first used.
    let enter_w = node(&g, "while/MatMul/Enter");
    assert_eq!(enter_w.input, ["w"]);
    assert!(attr_bool(enter_w, "is_constant"));
    assert_eq!(attr_str(enter_w, "frame_name"), frame);
    assert_eq!(node(&g, "while/Less/Enter").input, ["steps"]);
    // A constant in the body runs once per iteration.
    assert_eq!(node(&g, "while/add/y").input, ["^while/Identity"]);

    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let out = session
        .run(
            &rnn_feeds(),
            &["while/Exit:0", "while/Exit_1:0", "while/Exit_2:0"],
            &[],
        )
        .unwrap();
    assert_eq!(out[0].scalar_value::<i32>().unwrap(), 4);
    // The same recurrence by hand.
    let (xs, w, u, b) = (values(24, 3), values(6, 5), values(4, 6), values(2, 7));
    let mut h = values(4, 4);
    let mut acc = [0.0f64; 4];
    for t in 0..4 {
        let mut next = [0.0f64; 4];
        for r in 0..2 {
            for c in 0..2 {
                let mut s = b[c];
                for k in 0..3 {
                    s += xs[t * 6 + r * 3 + k] * w[k * 2 + c];
                }
                for k in 0..2 {
                    s += h[r * 2 + k] * u[k * 2 + c];
                }
                next[r * 2 + c] = s.tanh();
            }
        }
        for i in 0..4 {
            acc[i] += next[i] * next[i];
        }
        h = next.to_vec();
    }
    assert_close("h", &out[1].values::<f64>().unwrap(), &h, 1e-14);
    assert_close("acc", &out[2].values::<f64>().unwrap(), &acc, 1e-14);
}

#[test]
fn conds_in_loops_and_loops_in_conds_compute_their_values() {
    // for i in 0..5: h = h * 2 if i is even else h + 1
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, &[]);
    let p = ph(&mut g, "p", DType::Bool, &[]);
    let i0 = g.const_i32("i0", &[], &[0]).unwrap();
    let out = g
        .while_loop(
            |g, v| {
                let n = g.const_i32("n", &[], &[5])?;
                g.binary("Less", &v[0], &n)
            },
            |g, v| {
                let two = g.const_i32("two", &[], &[2])?;
                let zero = g.const_i32("zero", &[], &[0])?;
                let r = g.binary("FloorMod", &v[0], &two)?;
                let even = g.binary("Equal", &r, &zero)?;
                let h = v[1].clone();
                let h2 = h.clone();
                let c = g.cond(
                    &even,
                    |g| {
                        let two = g.scalar("Const", DType::Float, 2.0)?;
                        Ok(vec![g.mul(&h, &two)?])
                    },
                    |g| {
                        let one = g.scalar("Const", DType::Float, 1.0)?;
                        Ok(vec![g.add(&h2, &one)?])
                    },
                )?;
                let one = g.const_i32("one", &[], &[1])?;
                Ok(vec![g.add(&v[0], &one)?, c[0].clone()])
            },
            &[i0, x.clone()],
            10,
            "",
        )
        .unwrap();
    // The cond's pivot and predicate live in the loop: the Switch of `h` is in the frame.
    assert_eq!(
        node(&g, "while/cond/Switch").input,
        ["while/Equal", "while/Equal"]
    );
    assert_eq!(
        node(&g, "while/cond/mul/Switch").input,
        ["while/Identity_1", "while/cond/pred_id"]
    );
    // if p: 3 iterations of h * x, else x * x.
    let xc = x.clone();
    let out2 = g
        .cond(
            &p,
            |g| {
                let i0 = g.const_i32("i0", &[], &[0])?;
                let r = g.while_loop(
                    |g, v| {
                        let n = g.const_i32("n", &[], &[3])?;
                        g.binary("Less", &v[0], &n)
                    },
                    |g, v| {
                        let one = g.const_i32("one", &[], &[1])?;
                        Ok(vec![g.add(&v[0], &one)?, g.mul(&v[1], &xc)?])
                    },
                    &[i0, xc.clone()],
                    10,
                    "",
                )?;
                Ok(vec![r[1].clone()])
            },
            |g| Ok(vec![g.mul(&x, &x)?]),
        )
        .unwrap();
    // The loop's invariant from outside the cond is switched into the branch, then entered.
    assert_eq!(
        node(&g, "cond/while/mul/Enter").input,
        ["cond/while/Switch:1"]
    );
    assert_eq!(node(&g, "cond/while/Switch").input, ["x", "cond/pred_id"]);
    assert_eq!(node(&g, "cond/while/Enter").input, ["cond/i0"]);
    assert_eq!(node(&g, "cond/i0").input, ["^cond/switch_t"]);

    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    for p in [true, false] {
        let r = session
            .run(
                &[("x:0", Tensor::scalar(1.5f32)), ("p:0", Tensor::scalar(p))],
                &[&out[1].name(), &out2[0].name()],
                &[],
            )
            .unwrap();
        // 1.5 -> 3 -> 4 -> 8 -> 9 -> 18
        assert_eq!(r[0].scalar_value::<f32>().unwrap(), 18.0);
        let want = if p { 1.5f32.powi(4) } else { 2.25 };
        assert_eq!(r[1].scalar_value::<f32>().unwrap(), want, "p = {p}");
    }
}

#[test]
fn loops_and_conds_that_do_not_fit_are_refused_with_the_reason() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, &[2]);
    let i0 = g.const_i32("i0", &[], &[0]).unwrap();
    let less = |g: &mut Graph, v: &[Output]| {
        let n = g.const_i32("n", &[], &[3])?;
        g.binary("Less", &v[0], &n)
    };
    let err = g
        .while_loop(
            less,
            |_, v| Ok(vec![v[0].clone()]),
            &[i0.clone(), x.clone()],
            10,
            "",
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("1 tensors for 2 loop variables"),
        "{err}"
    );

    let err = g
        .while_loop(
            less,
            |g, v| {
                let c = g.cast(&v[0], DType::Float)?;
                Ok(vec![c, v[1].clone()])
            },
            &[i0.clone(), x.clone()],
            10,
            "",
        )
        .unwrap_err();
    assert!(err.message().contains("keep its dtype"), "{err}");

    let err = g
        .while_loop(
            less,
            |g, v| {
                let one = g.const_i32("one", &[], &[1])?;
                let wide = g.concat(&[v[1].clone(), v[1].clone()], 0)?;
                Ok(vec![g.add(&v[0], &one)?, wide])
            },
            &[i0.clone(), x.clone()],
            10,
            "",
        )
        .unwrap_err();
    assert!(err.message().contains("after one iteration"), "{err}");

    let err = g
        .while_loop(
            |_, v| Ok(v[0].clone()),
            |_, v| Ok(v.to_vec()),
            std::slice::from_ref(&x),
            10,
            "",
        )
        .unwrap_err();
    assert!(err.message().contains("bool scalar"), "{err}");

    let err = g.cond(&x, |_| Ok(vec![]), |_| Ok(vec![])).unwrap_err();
    assert!(err.message().contains("pass a bool scalar"), "{err}");
    let p = ph(&mut g, "p", DType::Bool, &[]);
    let (a, b) = (x.clone(), i0.clone());
    let err = g.cond(&p, |_| Ok(vec![a]), |_| Ok(vec![b])).unwrap_err();
    assert!(err.message().contains("same dtype"), "{err}");
}

#[test]
fn cond_gradients_match_tensorflow_and_finite_differences() {
    let (g, loss, xs) = cond_graph();
    let d = Differentiated::new(g, &loss, &xs);
    // From tests/builder_control_flow_tf.py with TensorFlow 2.21.
    let tensorflow = [
        (
            true,
            -0.04863723874914053,
            [
                [0.10130151153848266, 1.390957684541362, 0.9143264336276811],
                [-0.440666750404835, 0.3040781990877261, -0.7158232477883898],
            ],
        ),
        (
            false,
            -0.11058601134215501,
            [
                [0.37712665406427226, 0.11909262759924386, 0.2807183364839319],
                [
                    0.20841209829867677,
                    0.04631379962192817,
                    0.17155009451795844,
                ],
            ],
        ),
    ];
    for (p, tf_loss, tf_grads) in tensorflow {
        let feeds = vec![
            ("x:0", f64s(&[3], 1)),
            ("y:0", f64s(&[3], 2)),
            ("p:0", Tensor::scalar(p)),
        ];
        let (l, grads) = d.run(&feeds);
        assert_close("cond loss", &[l], &[tf_loss], 1e-12);
        for (k, want) in tf_grads.iter().enumerate() {
            assert_close(&format!("cond p={p} grad {k}"), &grads[k], want, 1e-12);
        }
        d.check_numerically(&format!("cond p={p}"), &feeds, &grads);
    }
}

#[test]
fn while_loop_gradients_match_tensorflow_and_finite_differences() {
    for parallel_iterations in [10, 1] {
        let (g, loss, xs) = rnn_graph(parallel_iterations);
        let d = Differentiated::new(g, &loss, &xs);
        check_rnn_gradients(&d, parallel_iterations == 10);
    }
}

fn check_rnn_gradients(d: &Differentiated, numerically: bool) {
    let feeds = rnn_feeds();
    let (l, grads) = d.run(&feeds);
    // From tests/builder_control_flow_tf.py with TensorFlow 2.21: d/dxs (dense), d/dh0,
    // d/dw, d/du, d/db.
    assert_close("rnn loss", &[l], &[2.0225245832844547], 1e-12);
    let tensorflow: [&[f64]; 5] = [
        &[
            -0.1346406175230405,
            0.11561440246379126,
            0.09002722782318036,
            0.2907630665870783,
            -0.27196796076251584,
            -0.1970821839454393,
            0.2588697875803338,
            -0.2568911398747657,
            -0.17722775182295966,
            0.3332236239779101,
            -0.19158662154296557,
            -0.2115111444486054,
            0.37864297225702415,
            -0.2660492458024836,
            -0.24611825895207146,
            -0.4081275199686545,
            0.3000437362972449,
            0.26686986029450666,
            -0.45554420862492395,
            0.2835747655758662,
            0.29174150517097236,
            0.7765988671442616,
            -1.0235992317569151,
            -0.5619011537507229,
        ],
        &[
            -0.13975805245116266,
            0.11049696753566908,
            0.30574022195049355,
            -0.2569908053991005,
        ],
        &[
            -0.7997083132473997,
            1.9862882949957785,
            0.8386739817148218,
            -0.9030147431772477,
            -0.20782864738200668,
            -0.8746692923233541,
        ],
        &[
            0.28944881045754906,
            -0.5828569582347081,
            -0.31605286073416194,
            0.283596714250668,
        ],
        &[-0.3142734420549571, 2.916306662604337],
    ];
    for (k, want) in tensorflow.iter().enumerate() {
        assert_close(&format!("rnn grad {}", d.xs[k]), &grads[k], want, 1e-12);
    }
    if numerically {
        d.check_numerically("rnn", &feeds, &grads);
    }
}

#[test]
fn loop_variables_nobody_reads_get_zero_gradients() {
    // `a` is not read after the loop, and `c`'s next value ignores its previous one.
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Double, &[2]);
    let y = ph(&mut g, "y", DType::Double, &[2]);
    let i0 = g.const_i32("Const", &[], &[0]).unwrap();
    let xc = x.clone();
    let out = g
        .while_loop(
            |g, v| {
                let n = g.const_i32("Less/y", &[], &[3])?;
                g.binary("Less", &v[0], &n)
            },
            |g, v| {
                let one = g.const_i32("add/y", &[], &[1])?;
                let a = g.mul(&v[1], &xc)?;
                let c = g.unary("Tanh", &v[1])?;
                Ok(vec![g.add(&v[0], &one)?, a, c])
            },
            &[i0, x.clone(), y.clone()],
            10,
            "",
        )
        .unwrap();
    let loss = g.sum(&out[2], &[0], false).unwrap();
    let d = Differentiated::new(g, &loss, &[x, y]);
    let feeds = vec![("x:0", f64s(&[2], 9)), ("y:0", f64s(&[2], 10))];
    let (l, grads) = d.run(&feeds);
    // From tests/builder_control_flow_tf.py with TensorFlow 2.21.
    assert_close("unread loss", &[l], &[-0.12563721245709206], 1e-12);
    assert_close(
        "unread d/dx",
        &grads[0],
        &[0.0354441759500088, 0.738402248212795],
        1e-12,
    );
    assert_close("unread d/dy", &grads[1], &[0.0, 0.0], 0.0);
    d.check_numerically("unread", &feeds, &grads);
}

#[test]
fn a_while_loop_gradient_is_the_loop_tensorflow_builds() {
    let (mut g, loss, xs) = rnn_graph(10);
    gradients(&mut g, std::slice::from_ref(&loss), &xs, None).unwrap();
    // The forward loop counts its iterations ...
    assert_eq!(node(&g, "gradients/f_count_1").input, ["gradients/f_count"]);
    assert_eq!(
        attr_str(node(&g, "gradients/f_count_1"), "frame_name"),
        "while/while_context"
    );
    assert_eq!(node(&g, "gradients/f_count_2").op, "Exit");
    // ... and the gradient loop runs the count down in its own frame.
    let b_count = node(&g, "gradients/b_count_1");
    assert_eq!(b_count.input, ["gradients/f_count_2"]);
    assert_eq!(
        attr_str(b_count, "frame_name"),
        "gradients/while/while_context"
    );
    assert_eq!(node(&g, "gradients/b_count_2").op, "LoopCond");
    // The Tanh's output (first needed by the gradient of `h * h`) is pushed in every forward
    // iteration, after the counter's Add, and popped in the gradient loop, once for every
    // gradient that needs it; the pops gate the counter's next iteration.
    let push = node(&g, "gradients/while/mul_grad/Mul/StackPushV2");
    assert_eq!(
        push.input,
        [
            "gradients/while/mul_grad/Mul/Enter",
            "while/Tanh",
            "^gradients/Add"
        ]
    );
    assert_eq!(node(&g, "gradients/while/mul_grad/Mul/f_acc").op, "StackV2");
    assert!(node(&g, "gradients/NextIteration")
        .input
        .contains(&"^gradients/while/mul_grad/Mul/StackPushV2".to_string()));
    let pop = node(&g, "gradients/while/mul_grad/Mul/StackPopV2");
    assert_eq!(pop.input[1], "^gradients/Sub");
    assert_eq!(
        node(&g, "gradients/while/Tanh_grad/TanhGrad").input[0],
        "gradients/while/mul_grad/Mul/StackPopV2"
    );
    let sync = node(&g, "gradients/while/mul_grad/Mul/b_sync");
    assert_eq!(sync.op, "ControlTrigger");
    assert!(sync
        .input
        .contains(&"^gradients/while/mul_grad/Mul/StackPopV2".to_string()));
    // Loop variables leave through b_exit / b_switch; an invariant's gradient is summed.
    let b_exit = node(&g, "gradients/while/Exit_1_grad/b_exit");
    assert_eq!(b_exit.op, "Enter");
    assert_eq!(
        attr_str(b_exit, "frame_name"),
        "gradients/while/while_context"
    );
    assert!(!attr_bool(b_exit, "is_constant"));
    assert_eq!(
        node(&g, "gradients/while/Switch_1_grad/b_switch").op,
        "Merge"
    );
    let acc = node(&g, "gradients/while/MatMul/Enter_grad/b_acc_2");
    assert_eq!(acc.op, "Merge");
    assert_eq!(
        node(&g, "gradients/while/MatMul/Enter_grad/b_acc_3").op,
        "Exit"
    );
}

#[test]
fn gradients_through_a_cond_in_a_loop_match_tensorflow() {
    // The shape of x known, then unknown (the zeros for the untaken side are then shaped at
    // run time from a shape saved in the forward loop).
    for known in [true, false] {
        cond_in_loop_gradients(known);
    }
}

fn cond_in_loop_gradients(known: bool) {
    // for i in 0..4: h = h * x if i is even else h * h
    let mut g = Graph::new();
    let dims = if known { vec![Some(2)] } else { vec![None] };
    let x = g
        .placeholder("x", DType::Double, PartialShape::new(dims))
        .unwrap();
    let i0 = g.const_i32("Const", &[], &[0]).unwrap();
    let xc = x.clone();
    let out = g
        .while_loop(
            |g, v| {
                let n = g.const_i32("Less/y", &[], &[4])?;
                g.binary("Less", &v[0], &n)
            },
            |g, v| {
                let two = g.const_i32("mod/y", &[], &[2])?;
                let zero = g.const_i32("Equal/y", &[], &[0])?;
                let r = g.binary("FloorMod", &v[0], &two)?;
                let even = g.binary("Equal", &r, &zero)?;
                let (h, h2, xc) = (v[1].clone(), v[1].clone(), xc.clone());
                let c = g.cond(
                    &even,
                    |g| Ok(vec![g.mul(&h, &xc)?]),
                    |g| Ok(vec![g.unary("Square", &h2)?]),
                )?;
                let one = g.const_i32("add/y", &[], &[1])?;
                Ok(vec![g.add(&v[0], &one)?, c[0].clone()])
            },
            &[i0, x.clone()],
            10,
            "",
        )
        .unwrap();
    let loss = g.sum(&out[1], &[0], false).unwrap();
    let d = Differentiated::new(g, &loss, std::slice::from_ref(&x));
    // The zero gradient of the untaken side: a constant behind a Switch on the saved
    // predicate, or zeros of a shape pushed in the forward loop.
    let shape_saved = d.graph.nodes().iter().any(|n| {
        n.op == "StackPushV2" && d.graph.node(&n.input[1]).is_some_and(|p| p.op == "Shape")
    });
    assert_eq!(shape_saved, !known);
    let feeds = vec![("x:0", f64s(&[2], 8))];
    let (l, grads) = d.run(&feeds);
    // From tests/builder_control_flow_tf.py with TensorFlow 2.21.
    assert_close("cond in while loss", &[l], &[0.00039320767415101276], 1e-12);
    assert_close(
        "cond in while grad",
        &grads[0],
        &[-4.375844444404642e-07, 0.008612974619921656],
        1e-12,
    );
    d.check_numerically("cond in while", &feeds, &grads);
}

#[test]
fn gradients_through_a_loop_in_a_cond_match_tensorflow() {
    // if p: 3 iterations of h * x, else x * x.
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Double, &[2]);
    ph(&mut g, "p", DType::Bool, &[]);
    let p = g.output("p", 0).unwrap();
    let xc = x.clone();
    let xf = x.clone();
    let out = g
        .cond(
            &p,
            |g| {
                let i0 = g.const_i32("Const", &[], &[0])?;
                let r = g.while_loop(
                    |g, v| {
                        let n = g.const_i32("Less/y", &[], &[3])?;
                        g.binary("Less", &v[0], &n)
                    },
                    |g, v| {
                        let one = g.const_i32("add/y", &[], &[1])?;
                        Ok(vec![g.add(&v[0], &one)?, g.mul(&v[1], &xc)?])
                    },
                    &[i0, xc.clone()],
                    10,
                    "",
                )?;
                Ok(vec![r[1].clone()])
            },
            |g| Ok(vec![g.unary("Square", &xf)?]),
        )
        .unwrap();
    let loss = g.sum(&out[0], &[0], false).unwrap();
    let d = Differentiated::new(g, &loss, std::slice::from_ref(&x));
    let tensorflow = [
        (
            true,
            0.04397184472611233,
            [-0.014095504232760748, 0.3805786142845402],
        ),
        (
            false,
            0.23156899810964085,
            [-0.30434782608695654, 0.9130434782608696],
        ),
    ];
    for (p, tf_loss, tf_grad) in tensorflow {
        let feeds = vec![("x:0", f64s(&[2], 8)), ("p:0", Tensor::scalar(p))];
        let (l, grads) = d.run(&feeds);
        assert_close("while in cond loss", &[l], &[tf_loss], 1e-12);
        assert_close("while in cond grad", &grads[0], &tf_grad, 1e-12);
        d.check_numerically(&format!("while in cond p={p}"), &feeds, &grads);
    }
}

#[test]
fn gradients_of_nested_loops_are_refused_naming_the_loops() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, &[]);
    let i0 = g.const_i32("i0", &[], &[0]).unwrap();
    let n = g.const_i32("n", &[], &[2]).unwrap();
    let (n1, n2) = (n.clone(), n.clone());
    let out = g
        .while_loop(
            |g, v| g.binary("Less", &v[0], &n1),
            |g, v| {
                let j0 = g.const_i32("j0", &[], &[0])?;
                let n2 = n2.clone();
                let inner = g.while_loop(
                    |g, u| g.binary("Less", &u[0], &n2),
                    |g, u| {
                        let one = g.const_i32("one", &[], &[1])?;
                        Ok(vec![g.add(&u[0], &one)?, g.mul(&u[1], &u[1])?])
                    },
                    &[j0, v[1].clone()],
                    10,
                    "inner",
                )?;
                let one = g.const_i32("one", &[], &[1])?;
                Ok(vec![g.add(&v[0], &one)?, inner[1].clone()])
            },
            &[i0, x.clone()],
            10,
            "outer",
        )
        .unwrap();
    let err = gradients(&mut g, &[out[1].clone()], &[x], None).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(
        err.message().contains("outer/inner/while_context")
            && err.message().contains("outer/while_context"),
        "{err}"
    );
}

/// An Elman network over 6 steps of a sine wave, predicting the next value: `h = tanh(x_t w +
/// h u + b)`, `y = h v`; the variables of `kind`, read inside the loop. Returns the graph, the
/// loss and the train op of `optimizer`.
fn rnn_model(kind: VariableKind, optimizer: &Optimizer) -> (Graph, Output, String, String) {
    let mut g = Graph::new();
    g.set_variable_kind(kind);
    let xs = ph(&mut g, "xs", DType::Float, &[6, 4, 1]);
    let target = ph(&mut g, "target", DType::Float, &[4, 1]);
    let init = |g: &mut Graph, dims: &[usize], seed: usize| {
        let n = dims.iter().product();
        let v: Vec<f32> = values(n, seed).iter().map(|&v| v as f32).collect();
        g.constant(&Tensor::from_vec(dims.to_vec(), v).unwrap())
            .unwrap()
    };
    let w0 = init(&mut g, &[1, 3], 11);
    let u0 = init(&mut g, &[3, 3], 12);
    let b0 = init(&mut g, &[3], 13);
    let v0 = init(&mut g, &[3, 1], 14);
    let w = g.variable("w", &w0).unwrap();
    let u = g.variable("u", &u0).unwrap();
    let b = g.variable("b", &b0).unwrap();
    let v = g.variable("v", &v0).unwrap();
    assert_eq!(w.kind(), kind);
    let h0 = g
        .constant(&Tensor::zeros(DType::Float, vec![4, 3]).unwrap())
        .unwrap();
    let i0 = g.const_i32("i0", &[], &[0]).unwrap();
    let n = g.const_i32("n", &[], &[6]).unwrap();
    let vars: [Variable; 3] = [w, u, b];
    let out = g
        .while_loop(
            |g, l| g.binary("Less", &l[0], &n),
            |g, l| {
                let x_t = g.gather(&xs, &l[0], 0)?;
                let w = g.read(&vars[0])?;
                let u = g.read(&vars[1])?;
                let b = g.read(&vars[2])?;
                let xw = g.matmul(&x_t, &w)?;
                let hu = g.matmul(&l[1], &u)?;
                let s = g.add(&xw, &hu)?;
                let s = g.add(&s, &b)?;
                let h = g.unary("Tanh", &s)?;
                let one = g.const_i32("one", &[], &[1])?;
                Ok(vec![g.add(&l[0], &one)?, h])
            },
            &[i0, h0],
            10,
            "rnn",
        )
        .unwrap();
    let v_read = g.read(&v).unwrap();
    let y = g.matmul(&out[1], &v_read).unwrap();
    let err = g.sub(&y, &target).unwrap();
    let sq = g.mul(&err, &err).unwrap();
    let loss = g.mean(&sq, &[0, 1], false).unwrap();
    let train = optimizer.minimize(&mut g, &loss, None).unwrap();
    let init = g.global_variables_initializer().unwrap();
    (g, loss, train, init)
}

fn sine_batch(step: usize) -> (Tensor, Tensor) {
    let mut xs = vec![0f32; 6 * 4];
    let mut target = vec![0f32; 4];
    for b in 0..4 {
        let phase = 0.7 * (step * 4 + b) as f32;
        for t in 0..6 {
            xs[t * 4 + b] = (phase + 0.5 * t as f32).sin();
        }
        target[b] = (phase + 3.0).sin();
    }
    (
        Tensor::from_vec([6, 4, 1], xs).unwrap(),
        Tensor::from_vec([4, 1], target).unwrap(),
    )
}

fn train_losses(kind: VariableKind, optimizer: &Optimizer, steps: usize) -> (Graph, Vec<f32>) {
    let (g, loss, train, init) = rnn_model(kind, optimizer);
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init]).unwrap();
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let (xs, target) = sine_batch(step % 5);
        let out = session
            .run(
                &[("xs:0", xs), ("target:0", target)],
                &[&loss.name()],
                &[&train],
            )
            .unwrap();
        losses.push(out[0].scalar_value::<f32>().unwrap());
    }
    (g, losses)
}

#[test]
fn reference_variables_train_a_recurrent_model_to_the_losses_of_resource_variables() {
    for optimizer in [Optimizer::gradient_descent(0.2), Optimizer::adam(0.05)] {
        let name = optimizer.name().to_string();
        let (ref_graph, by_ref) = train_losses(VariableKind::Reference, &optimizer, 30);
        let (res_graph, by_resource) = train_losses(VariableKind::Resource, &optimizer, 30);
        let ops = |g: &Graph| -> Vec<String> { g.nodes().iter().map(|n| n.op.clone()).collect() };
        let (ref_ops, res_ops) = (ops(&ref_graph), ops(&res_graph));
        let apply = format!("Apply{name}");
        assert!(ref_ops.contains(&"VariableV2".to_string()), "{name}");
        assert!(ref_ops.contains(&apply), "{name}: {ref_ops:?}");
        assert!(!ref_ops
            .iter()
            .any(|o| o.starts_with("Resource") || o == "VarHandleOp"));
        assert!(res_ops.contains(&format!("ResourceApply{name}")), "{name}");
        assert!(!res_ops.contains(&"VariableV2".to_string()), "{name}");
        // The reads are TensorFlow 1's: `w/read` entered into the loop.
        assert_eq!(node(&ref_graph, "w/read").input, ["w"]);
        assert_eq!(node(&ref_graph, "rnn/MatMul/Enter").input, ["w/read"]);
        // Both kinds compute the same steps.
        for (i, (a, b)) in by_ref.iter().zip(&by_resource).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                "{name} step {i}: reference {a}, resource {b}"
            );
        }
        let (first, last) = (
            by_resource[..5].iter().sum::<f32>(),
            by_resource[25..].iter().sum::<f32>(),
        );
        assert!(last < 0.5 * first, "{name}: losses {by_resource:?}");
    }
}

#[test]
fn a_resource_variable_read_in_one_branch_gets_zeros_when_the_branch_does_not_run() {
    let mut g = Graph::new();
    let w0 = g
        .constant(&Tensor::from_vec([2], vec![3.0f32, -1.0]).unwrap())
        .unwrap();
    let w = g.variable("w", &w0).unwrap();
    let p = ph(&mut g, "p", DType::Bool, &[]);
    let x = ph(&mut g, "x", DType::Float, &[2]);
    let (wc, xc) = (w.clone(), x.clone());
    let out = g
        .cond(
            &p,
            |g| {
                let r = g.read(&wc)?;
                Ok(vec![g.mul(&r, &xc)?])
            },
            |g| Ok(vec![g.mul(&x, &x)?]),
        )
        .unwrap();
    let loss = g.sum(&out[0], &[0], false).unwrap();
    let gw = gradients(&mut g, &[loss], std::slice::from_ref(&w.handle), None).unwrap()[0]
        .clone()
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init]).unwrap();
    for (p, want) in [(true, [0.5f32, 2.0]), (false, [0.0, 0.0])] {
        let r = session
            .run(
                &[
                    ("p:0", Tensor::scalar(p)),
                    ("x:0", Tensor::from_vec([2], vec![0.5f32, 2.0]).unwrap()),
                ],
                &[&gw.name()],
                &[],
            )
            .unwrap();
        assert_eq!(r[0].values::<f32>().unwrap().as_ref(), want, "p = {p}");
    }
}

#[test]
fn a_constant_built_in_a_branch_depends_on_the_pivot_even_with_outer_control_dependencies() {
    let mut g = Graph::new();
    let p = ph(&mut g, "p", DType::Bool, &[]);
    let x = ph(&mut g, "x", DType::Float, &[]);
    let guard = g.add_op(NodeSpec::new("NoOp").name("guard")).unwrap();
    let out = g
        .with_control_dependencies(&[guard.as_str()], |g| {
            g.cond(
                &p,
                |g| Ok(vec![g.scalar("Const", DType::Float, 1.0)?]),
                |g| Ok(vec![g.identity(&x)?]),
            )
        })
        .unwrap();
    // The outer control dependency is kept, and since `guard` is outside the branch the
    // constant still waits for the pivot.
    let c = node(&g, "cond/Const");
    assert!(c.input.contains(&"^guard".to_string()), "{:?}", c.input);
    assert!(
        c.input.contains(&"^cond/switch_t".to_string()),
        "{:?}",
        c.input
    );
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let r = session
        .run(
            &[
                ("p:0", Tensor::scalar(false)),
                ("x:0", Tensor::scalar(7f32)),
            ],
            &[&out[0].name()],
            &[],
        )
        .unwrap();
    assert_eq!(r[0].scalar_value::<f32>().unwrap(), 7.0);
}

#[test]
fn a_control_dependency_from_outside_a_loop_enters_it_as_an_identity() {
    let mut g = Graph::new();
    let x = ph(&mut g, "x", DType::Float, &[]);
    let outside = g.scalar("outside", DType::Float, 5.0).unwrap();
    let i0 = g.const_i32("i0", &[], &[0]).unwrap();
    let out = g
        .while_loop(
            |g, v| {
                let n = g.const_i32("n", &[], &[3])?;
                g.binary("Less", &v[0], &n)
            },
            |g, v| {
                let one = g.const_i32("one", &[], &[1])?;
                let i = g.add(&v[0], &one)?;
                let h = g.with_control_dependencies(&["outside"], |g| g.add(&v[1], &v[1]))?;
                Ok(vec![i, h])
            },
            &[i0, x],
            10,
            "",
        )
        .unwrap();
    // The body op waits on an Identity of the outside value made in the loop, not on the
    // outside node itself, which would run once outside the frame.
    let add = node(&g, "while/add_1");
    assert!(
        !add.input.contains(&"^outside".to_string()),
        "{:?}",
        add.input
    );
    assert!(
        add.input.contains(&"^while/add_1/Identity".to_string()),
        "{:?}",
        add.input
    );
    // It reads only a loop invariant, so it runs once per iteration after the pivot.
    assert_eq!(
        node(&g, "while/add_1/Identity").input,
        ["while/add_1/Identity/Enter", "^while/Identity"]
    );
    assert_eq!(
        node(&g, "while/add_1/Identity/Enter").input,
        [outside.node.as_str()]
    );
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let r = session
        .run(&[("x:0", Tensor::scalar(1.5f32))], &[&out[1].name()], &[])
        .unwrap();
    assert_eq!(r[0].scalar_value::<f32>().unwrap(), 12.0);
}

#[test]
fn gradients_through_a_loop_the_builder_did_not_build_are_refused() {
    let (g, loss, xs) = rnn_graph(10);
    // The same graph read back from its GraphDef has no loop contexts.
    let mut imported = Graph::from_graph_def(&g.to_graph_def()).unwrap();
    let err = gradients(&mut imported, &[loss], &xs, None).unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(err.message().contains("while/Exit"), "{err}");
    assert!(err.message().contains("Graph::while_loop"), "{err}");
}

#[test]
fn the_device_setter_places_reference_variables_with_their_assign_read_slots_and_updates() {
    let mut g = Graph::new();
    g.set_variable_kind(VariableKind::Reference);
    let setter = tessera::graph::replica_device_setter(2, "/job:worker/task:0").unwrap();
    let loss = g.with_device_fn(setter, |g| {
        let x = ph(g, "x", DType::Float, &[4, 2]);
        let w0 = g
            .constant(&Tensor::zeros(DType::Float, vec![2, 1]).unwrap())
            .unwrap();
        let b0 = g
            .constant(&Tensor::zeros(DType::Float, vec![1]).unwrap())
            .unwrap();
        let w = g.variable("w", &w0).unwrap();
        let b = g.variable("b", &b0).unwrap();
        let wr = g.read(&w).unwrap();
        let y = g.matmul(&x, &wr).unwrap();
        let y = g.add(&y, &b.value).unwrap();
        let sq = g.mul(&y, &y).unwrap();
        g.mean(&sq, &[0, 1], false).unwrap()
    });
    Optimizer::momentum(0.1, 0.9, false)
        .minimize(&mut g, &loss, None)
        .unwrap();
    let dev = |n: &str| node(&g, n).device.clone();
    assert_eq!(node(&g, "w").op, "VariableV2");
    assert_eq!(dev("w"), "/job:ps/task:0");
    assert_eq!(dev("b"), "/job:ps/task:1");
    for (n, var) in [
        ("w/Assign", "w"),
        ("w/read", "w"),
        ("w/Momentum", "w"),
        ("b/Momentum", "b"),
        ("Momentum/update_w/ApplyMomentum", "w"),
        ("Momentum/update_b/ApplyMomentum", "b"),
    ] {
        assert_eq!(dev(n), dev(var), "{n}");
    }
    assert_eq!(node(&g, "w/Momentum").op, "VariableV2");
    assert_eq!(
        node(&g, "Momentum/update_w/ApplyMomentum").input[..2],
        ["w", "w/Momentum"]
    );
    assert_eq!(dev("MatMul"), "/job:worker/task:0");
}

/// A worker drops the `Identity` nodes that only hand a value on (grappler's dependency
/// optimizer; `exec::identities`), the while loop's and its gradient's included, and the loop
/// and its gradient compute the same bits as a local session, which runs every node.
#[test]
fn a_worker_drops_the_loops_hand_on_identities_and_keeps_the_bits() {
    use crate::support::cluster::InProcessCluster;
    use tessera::proto::RunOptions;

    let (mut g, loss, xs) = rnn_graph(10);
    let grads = gradients(&mut g, std::slice::from_ref(&loss), &xs, None).unwrap();
    let mut fetches = vec![
        "while/Exit:0".to_string(),
        "while/Exit_1:0".into(),
        loss.name(),
    ];
    fetches.extend(grads.iter().map(|g| g.as_ref().expect("a gradient").name()));
    let fetches: Vec<&str> = fetches.iter().map(String::as_str).collect();
    let identities = g.nodes().iter().filter(|n| n.op == "Identity").count();

    let local = Session::local();
    local.extend(&g.to_graph_def()).unwrap();
    let want = local.run(&rnn_feeds(), &fetches, &[]).unwrap();

    let cluster = InProcessCluster::start(&[("worker", 1)]);
    let remote = Session::connect(&cluster.target("worker", 0)).unwrap();
    remote.extend(&g.to_graph_def()).unwrap();
    let options = RunOptions {
        output_partition_graphs: true,
        ..Default::default()
    };
    let (got, metadata) = remote
        .run_with_options(&rnn_feeds(), &fetches, &[], &options)
        .unwrap();
    for ((got, want), name) in got.iter().zip(&want).zip(&fetches) {
        assert_eq!(got, want, "{name}");
    }
    let ran: Vec<&NodeDef> = metadata
        .partition_graphs
        .iter()
        .flat_map(|g| &g.node)
        .collect();
    let kept: Vec<&str> = ran
        .iter()
        .filter(|n| n.op == "Identity")
        .map(|n| n.name.as_str())
        .collect();
    // The body's view of `h` and of the sum are gone; the counter's stays, as the constants
    // in the body wait on it by control edges.
    assert!(kept.contains(&"while/Identity"), "{kept:?}");
    for dropped in ["while/Identity_1", "while/Identity_2"] {
        assert!(!kept.contains(&dropped), "{dropped} still runs: {kept:?}");
        assert!(
            ran.iter().all(|n| n.input.iter().all(|i| i != dropped)),
            "a reader of {dropped} was not rewired"
        );
    }
    assert!(
        kept.len() * 2 < identities,
        "{} of {identities} identities still run: {kept:?}",
        kept.len()
    );
}
