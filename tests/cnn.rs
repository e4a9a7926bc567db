//! A small convolutional network built with the graph builder (conv 3x3 SAME -> bias -> relu
//! -> max pool 2x2 -> dense -> softmax cross-entropy, batch mean), end to end through the
//! gradients, the kernels and an in-process session:
//!
//! - its gradients against central differences, in float64 (every kernel on its path has a
//!   float64 version, so the differences are exact to about 1e-9);
//! - its loss and gradients against TensorFlow 2.21's `tf.GradientTape` on the same weights
//!   and inputs (`tests/kernels_conv_tf.py cnn`, live: skipped without TensorFlow, a failure
//!   under CI);
//! - training on the built-in handwritten digits (8x8 images) to a held-out accuracy of 95 % (measured: 97.5 %).

use std::process::Command;

use crate::support::tensorflow::{python_with, Client};
use rand::{Rng, SeedableRng};
use tessera::client::Session;
use tessera::graph::{gradients, Graph, Output};
use tessera::tensor::{DType, Element, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_conv_tf.py");
const CLASSES: usize = 10;

/// The network's parameters' shapes: conv filter, conv bias, dense weights, dense bias, for
/// `filters` convolution filters on 8x8x1 inputs.
fn param_shapes(filters: usize) -> [Vec<usize>; 4] {
    [
        vec![3, 3, 1, filters],
        vec![filters],
        vec![16 * filters, CLASSES],
        vec![CLASSES],
    ]
}

/// Builds the network on `x` [batch, 8, 8, 1] with `params`; returns (logits, batch-mean loss
/// against the one-hot `labels`).
fn cnn(g: &mut Graph, x: &Output, labels: &Output, params: &[Output]) -> (Output, Output) {
    let filters = params[1].shape.dims().unwrap()[0].unwrap() as i64;
    let h = g.conv2d(x, &params[0], &[1, 1, 1, 1], "SAME").unwrap();
    let h = g.bias_add(&h, &params[1]).unwrap();
    let h = g.relu(&h).unwrap();
    let h = g
        .max_pool(&h, &[1, 2, 2, 1], &[1, 2, 2, 1], "VALID")
        .unwrap();
    assert_eq!(h.shape.to_string(), format!("[?,4,4,{filters}]"));
    let h = g.reshape_to(&h, &[-1, 16 * filters]).unwrap();
    let logits = g.matmul(&h, &params[2]).unwrap();
    let logits = g.bias_add(&logits, &params[3]).unwrap();
    let (per_row, _) = g.softmax_cross_entropy(&logits, labels).unwrap();
    let loss = g.mean(&per_row, &[0], false).unwrap();
    (logits, loss)
}

/// The network with every parameter a placeholder (`p0`..`p3`), its loss and the loss's
/// gradients with respect to them.
struct Probe {
    graph: Graph,
    loss: Output,
    grads: Vec<Output>,
}

fn probe(dtype: DType, filters: usize) -> Probe {
    let mut g = Graph::new();
    let known = |d: &[usize]| PartialShape::new(d.iter().map(|&d| Some(d)).collect::<Vec<_>>());
    let x = g
        .placeholder(
            "x",
            dtype,
            PartialShape::new(vec![None, Some(8), Some(8), Some(1)]),
        )
        .unwrap();
    let labels = g
        .placeholder(
            "labels",
            dtype,
            PartialShape::new(vec![None, Some(CLASSES)]),
        )
        .unwrap();
    let params: Vec<Output> = param_shapes(filters)
        .iter()
        .enumerate()
        .map(|(i, s)| g.placeholder(&format!("p{i}"), dtype, known(s)).unwrap())
        .collect();
    let (_, loss) = cnn(&mut g, &x, &labels, &params);
    let grads = gradients(&mut g, std::slice::from_ref(&loss), &params, None)
        .unwrap()
        .into_iter()
        .map(|g| g.expect("every parameter reaches the loss"))
        .collect();
    Probe {
        graph: g,
        loss,
        grads,
    }
}

impl Probe {
    /// Runs the loss and, with `grads`, the gradients on these values.
    fn run<T: Element>(
        &self,
        session: &Session,
        x: &Tensor,
        labels: &Tensor,
        params: &[Vec<T>],
        shapes: &[Vec<usize>],
        grads: bool,
    ) -> Vec<Tensor> {
        let mut feeds = vec![("x:0", x.clone()), ("labels:0", labels.clone())];
        let names = ["p0:0", "p1:0", "p2:0", "p3:0"];
        for ((name, v), s) in names.iter().zip(params).zip(shapes) {
            feeds.push((name, Tensor::from_vec(s.clone(), v.clone()).unwrap()));
        }
        let mut fetches = vec![self.loss.name()];
        if grads {
            fetches.extend(self.grads.iter().map(Output::name));
        }
        let fetches: Vec<&str> = fetches.iter().map(String::as_str).collect();
        session.run(&feeds, &fetches, &[]).unwrap()
    }
}

/// One-hot rows for `labels`.
fn one_hot<T: Element + From<u8>>(labels: &[usize]) -> Vec<T> {
    let mut out = vec![T::from(0); labels.len() * CLASSES];
    for (r, &l) in labels.iter().enumerate() {
        out[r * CLASSES + l] = T::from(1);
    }
    out
}

#[test]
fn cnn_gradients_match_central_differences() {
    let filters = 3;
    let batch = 4;
    let p = probe(DType::Double, filters);
    let session = Session::local();
    session.extend(&p.graph.to_graph_def()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let x: Vec<f64> = (0..batch * 64)
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    let x = Tensor::from_vec([batch, 8, 8, 1], x).unwrap();
    let labels = Tensor::from_vec([batch, CLASSES], one_hot::<f64>(&[3, 1, 4, 1])).unwrap();
    let shapes = param_shapes(filters);
    let mut params: Vec<Vec<f64>> = shapes
        .iter()
        .map(|s| {
            let n: usize = s.iter().product();
            (0..n).map(|_| rng.random_range(-0.5..0.5)).collect()
        })
        .collect();
    let out = p.run(&session, &x, &labels, &params, &shapes, true);
    let analytic: Vec<Vec<f64>> = out[1..]
        .iter()
        .map(|t| t.values::<f64>().unwrap().into_owned())
        .collect();
    let eps = 1e-5;
    let mut checked = 0;
    for k in 0..params.len() {
        // Every conv parameter and bias; every third dense weight (the dense layer is plain
        // MatMul, checked elsewhere).
        let stride = if k == 2 { 3 } else { 1 };
        for i in (0..params[k].len()).step_by(stride) {
            let saved = params[k][i];
            params[k][i] = saved + eps;
            let up = p.run(&session, &x, &labels, &params, &shapes, false)[0]
                .scalar_value::<f64>()
                .unwrap();
            params[k][i] = saved - eps;
            let down = p.run(&session, &x, &labels, &params, &shapes, false)[0]
                .scalar_value::<f64>()
                .unwrap();
            params[k][i] = saved;
            let numeric = (up - down) / (2.0 * eps);
            let got = analytic[k][i];
            assert!(
                (got - numeric).abs() <= 1e-7 + 1e-5 * numeric.abs(),
                "parameter {k} element {i}: gradient {got}, central difference {numeric}"
            );
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked}");
}

#[test]
fn cnn_loss_and_gradients_match_tensorflow_gradient_tape() {
    let test = "cnn_loss_and_gradients_match_tensorflow_gradient_tape";
    let Some(python) = python_with(test, &["tensorflow", "numpy"]) else {
        return;
    };
    let mut command = Command::new(python);
    command.arg(SCRIPT).arg("cnn");
    let tf = Client::spawn(command).finish_quietly().json;
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let x = floats(&tf["x"]);
    let batch = x.len() / 64;
    let x = Tensor::from_vec([batch, 8, 8, 1], x).unwrap();
    let labels = Tensor::from_vec([batch, CLASSES], floats(&tf["labels"])).unwrap();
    let keys = ["conv", "conv_b", "dense", "dense_b"];
    let params: Vec<Vec<f32>> = keys.iter().map(|k| floats(&tf["weights"][k])).collect();
    let p = probe(DType::Float, 4);
    let session = Session::local();
    session.extend(&p.graph.to_graph_def()).unwrap();
    let out = p.run(&session, &x, &labels, &params, &param_shapes(4), true);
    let loss = out[0].scalar_value::<f32>().unwrap();
    let want = tf["loss"].as_f64().unwrap() as f32;
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs(),
        "loss: tessera {loss}, TensorFlow {want}"
    );
    for (k, (got, key)) in out[1..].iter().zip(keys).enumerate() {
        let got = got.values::<f32>().unwrap();
        let want = floats(&tf["grads"][key]);
        assert_eq!(got.len(), want.len(), "{key}");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * scale,
                "gradient {k} ({key}) element {i}: tessera {g}, TensorFlow {w}"
            );
        }
    }
}

#[test]
fn a_cnn_learns_the_handwritten_digits() {
    let filters = 8;
    let data = tessera::data::digits::digits().unwrap();
    let (train, test) = data.split(0.2, 1).unwrap();
    let mut g = Graph::new();
    let x = g
        .placeholder(
            "x",
            DType::Float,
            PartialShape::new(vec![None, Some(8), Some(8), Some(1)]),
        )
        .unwrap();
    let labels = g
        .placeholder(
            "labels",
            DType::Float,
            PartialShape::new(vec![None, Some(CLASSES)]),
        )
        .unwrap();
    // Glorot-uniform weights, zero biases, from a seeded generator.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut vars = Vec::new();
    let mut params = Vec::new();
    for (i, shape) in param_shapes(filters).iter().enumerate() {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = if shape.len() == 1 {
            vec![0.0; n]
        } else {
            let fan_in: usize = shape[..shape.len() - 1].iter().product();
            let fan_out = shape[shape.len() - 1] * if shape.len() == 4 { 9 } else { 1 };
            let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
            (0..n).map(|_| rng.random_range(-limit..limit)).collect()
        };
        let init = g
            .constant(&Tensor::from_vec(shape.clone(), values).unwrap())
            .unwrap();
        let var = g.variable(&format!("v{i}"), &init).unwrap();
        params.push(g.read_variable(&var.handle).unwrap());
        vars.push(var);
    }
    let (logits, loss) = cnn(&mut g, &x, &labels, &params);
    let train_op = Optimizer::adam(0.01)
        .minimize_vars(&mut g, &loss, &vars, None)
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init]).unwrap();

    let images = |b: &tessera::data::Batch| {
        let n = b.len();
        let x = b.x.values::<f32>().unwrap().into_owned();
        let labels: Vec<usize> =
            b.y.values::<i64>()
                .unwrap()
                .iter()
                .map(|&l| l as usize)
                .collect();
        (
            Tensor::from_vec([n, 8, 8, 1], x).unwrap(),
            Tensor::from_vec([n, CLASSES], one_hot::<f32>(&labels)).unwrap(),
            labels,
        )
    };
    let options = tessera::data::BatchOptions::new(64).seed(3);
    let (mut step, steps) = (0, 300);
    let mut first_loss = None;
    let mut last_loss = 0.0;
    'epochs: for epoch in 0.. {
        for b in train.batches(&options, epoch).unwrap() {
            let (bx, by, _) = images(&b);
            let out = session
                .run(
                    &[("x:0", bx), ("labels:0", by)],
                    &[&loss.name()],
                    &[&train_op],
                )
                .unwrap();
            last_loss = out[0].scalar_value::<f32>().unwrap();
            first_loss.get_or_insert(last_loss);
            step += 1;
            if step == steps {
                break 'epochs;
            }
        }
    }
    let (tx, ty, tl) = images(&test.to_batch().unwrap());
    let out = session
        .run(&[("x:0", tx), ("labels:0", ty)], &[&logits.name()], &[])
        .unwrap();
    let logits = out[0].values::<f32>().unwrap();
    let correct = logits
        .chunks(CLASSES)
        .zip(&tl)
        .filter(|(row, &l)| {
            let best = (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap();
            best == l
        })
        .count();
    let accuracy = correct as f64 / tl.len() as f64;
    eprintln!(
        "cnn on the digits: {steps} steps, loss {:.4} -> {last_loss:.4}, held-out accuracy \
         {:.2} % on {} examples",
        first_loss.unwrap(),
        accuracy * 100.0,
        tl.len()
    );
    assert!(accuracy >= 0.95, "held-out accuracy {accuracy}");
}
