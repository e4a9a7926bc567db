//! The element-wise ops convolutional models bring: `Floor`, `Ceil`, `Round`,
//! `SquaredDifference`, `LeakyRelu`, `Elu`, and the gradients of the last three through the
//! graph builder. The expected numbers are TensorFlow 2.21's for the same inputs
//! (`tf.floor`, `tf.math.ceil`, `tf.round`, `tf.math.squared_difference`, `tf.nn.leaky_relu`
//! with alpha 0.1, `tf.nn.elu`, and `tf.GradientTape` of `sum(op(x) * range(9))`).

use tessera::client::Session;
use tessera::graph::{gradients, Graph, Output};
use tessera::tensor::Tensor;

const X: [f32; 9] = [-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, -0.3, 1.7];
const Y: [f32; 3] = [1.0, -1.0, 0.25];

/// Runs `fetches` of `g` and returns each as floats.
fn run(g: &Graph, fetches: &[&Output]) -> Vec<Vec<f32>> {
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let names: Vec<String> = fetches.iter().map(|o| o.name()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let out = session.run(&[], &names, &[]).unwrap();
    out.iter()
        .map(|t| t.values::<f32>().unwrap().to_vec())
        .collect()
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{what}[{i}]: {g} vs TensorFlow's {w}"
        );
    }
}

/// `sum(y * [0, 1, ..., 8])`: each element's gradient is its index.
fn weighted_sum(g: &mut Graph, y: &Output) -> Output {
    let weights: Vec<f32> = (0..9).map(|i| i as f32).collect();
    let w = g
        .constant(&Tensor::from_vec([9], weights).unwrap())
        .unwrap();
    let flat = g.reshape_to(y, &[9]).unwrap();
    let product = g.mul(&flat, &w).unwrap();
    g.sum(&product, &[0], false).unwrap()
}

#[test]
fn floor_ceil_and_round_as_tensorflow_rounds() {
    let mut g = Graph::new();
    let x = g
        .constant(&Tensor::from_vec([9], X.to_vec()).unwrap())
        .unwrap();
    let floor = g.unary("Floor", &x).unwrap();
    let ceil = g.unary("Ceil", &x).unwrap();
    let round = g.unary("Round", &x).unwrap();
    let out = run(&g, &[&floor, &ceil, &round]);
    assert_eq!(out[0], [-3.0, -2.0, -1.0, 0.0, 0.0, 1.0, 2.0, -1.0, 1.0]);
    assert_eq!(out[1], [-2.0, -1.0, -0.0, 0.0, 1.0, 2.0, 3.0, -0.0, 2.0]);
    // Half to even: -2.5 → -2, -1.5 → -2, 0.5 → 0, 1.5 → 2, 2.5 → 2.
    assert_eq!(out[2], [-2.0, -2.0, -0.0, 0.0, 0.0, 2.0, 2.0, -0.0, 2.0]);
}

#[test]
fn squared_difference_broadcasts_and_its_gradient_reduces_to_each_input() {
    let mut g = Graph::new();
    let x = g
        .constant(&Tensor::from_vec([3, 3], X.to_vec()).unwrap())
        .unwrap();
    let y = g
        .constant(&Tensor::from_vec([3], Y.to_vec()).unwrap())
        .unwrap();
    let d = g.binary("SquaredDifference", &x, &y).unwrap();
    let loss = weighted_sum(&mut g, &d);
    let grads = gradients(&mut g, &[loss], &[x, y], None).unwrap();
    let (gx, gy) = (grads[0].clone().unwrap(), grads[1].clone().unwrap());
    let out = run(&g, &[&d, &gx, &gy]);
    assert_close(
        "SquaredDifference",
        &out[0],
        &[12.25, 0.25, 0.5625, 1.0, 2.25, 1.5625, 2.25, 0.49, 2.1025],
    );
    assert_close(
        "d/dx",
        &out[1],
        &[-0.0, -1.0, -3.0, -6.0, 12.0, 12.5, 18.0, 9.8, 23.2],
    );
    assert_close("d/dy", &out[2], &[-12.0, -20.8, -32.7]);
}

#[test]
fn leaky_relu_and_elu_and_their_gradients_match_tensorflow() {
    let mut g = Graph::new();
    let x = g
        .constant(&Tensor::from_vec([9], X.to_vec()).unwrap())
        .unwrap();
    let leaky = g.leaky_relu(&x, 0.1).unwrap();
    let elu = g.elu(&x).unwrap();
    let leaky_loss = weighted_sum(&mut g, &leaky);
    let elu_loss = weighted_sum(&mut g, &elu);
    let d_leaky = gradients(&mut g, &[leaky_loss], std::slice::from_ref(&x), None).unwrap()[0]
        .clone()
        .unwrap();
    let d_elu = gradients(&mut g, &[elu_loss], &[x], None).unwrap()[0]
        .clone()
        .unwrap();
    let out = run(&g, &[&leaky, &d_leaky, &elu, &d_elu]);
    assert_close(
        "LeakyRelu",
        &out[0],
        &[-0.25, -0.15, -0.05, 0.0, 0.5, 1.5, 2.5, -0.03, 1.7],
    );
    // At 0 the feature is not positive: the gradient is alpha times the incoming one.
    assert_close(
        "LeakyReluGrad",
        &out[1],
        &[0.0, 0.1, 0.2, 0.3, 4.0, 5.0, 6.0, 0.7, 8.0],
    );
    assert_close(
        "Elu",
        &out[2],
        &[
            -0.917_915,
            -0.776_869_8,
            -0.393_469_33,
            0.0,
            0.5,
            1.5,
            2.5,
            -0.259_181_8,
            1.7,
        ],
    );
    assert_close(
        "EluGrad",
        &out[3],
        &[
            0.0,
            0.223_130_17,
            1.213_061_3,
            3.0,
            4.0,
            5.0,
            6.0,
            5.185_727_6,
            8.0,
        ],
    );
}
