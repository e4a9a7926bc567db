//! The linear-regression job the soak and storm tests train on a 1 ps + 2 worker cluster:
//! `pred = x·w + b` with `w`, `b` and the global step on the ps, the forward and backward pass
//! and the gradient-descent update on one worker, on batches from a fixed target
//! `y = x·[1, -2, 0.5] + 0.3`, so the loss must fall.

use tessera::graph::Graph;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::{get_or_create_global_step, Optimizer};

/// One client's graph, with the names it feeds, fetches and runs.
pub struct Model {
    pub graph: Graph,
    pub x: String,
    pub y: String,
    pub loss: String,
    pub train: String,
    pub init: String,
    /// The global step's value.
    pub step: String,
}

/// The graph of a client placing its computation on `/job:worker/task:{worker}`.
pub fn model(worker: usize) -> Model {
    let mut g = Graph::new();
    let (w, b, step) = g
        .with_device("/job:ps/task:0", |g| {
            let w0 = g.constant(&Tensor::from_vec(vec![3, 1], vec![0f32; 3])?)?;
            let w = g.variable("w", &w0)?;
            let b0 = g.constant(&Tensor::from_vec(vec![1], vec![0f32])?)?;
            let b = g.variable("b", &b0)?;
            let step = get_or_create_global_step(g)?;
            Ok::<_, tessera::Status>((w, b, step))
        })
        .expect("variables");
    let (x, y, loss, train) = g
        .with_device(&format!("/job:worker/task:{worker}"), |g| {
            let x = g.placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))?;
            let y = g.placeholder("y", DType::Float, PartialShape::new(vec![None, Some(1)]))?;
            let xw = g.matmul(&x, &w.value)?;
            let pred = g.add(&xw, &b.value)?;
            let err = g.sub(&pred, &y)?;
            let sq = g.mul(&err, &err)?;
            let loss = g.mean(&sq, &[0, 1], false)?;
            let train = Optimizer::gradient_descent(0.1).minimize(g, &loss, Some(&step))?;
            Ok::<_, tessera::Status>((x, y, loss, train))
        })
        .expect("the regression");
    let init = g.global_variables_initializer().expect("initializer");
    Model {
        x: x.name(),
        y: y.name(),
        loss: loss.name(),
        train,
        init,
        step: step.value.name(),
        graph: g,
    }
}

/// Batch `k` of 4 rows: x from a fixed cycle, y = x·[1, -2, 0.5] + 0.3.
pub fn batch(k: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..12)
        .map(|i| ((k * 5 + i * 7) % 13) as f32 / 6.5 - 1.0)
        .collect();
    let y: Vec<f32> = x
        .chunks(3)
        .map(|r| r[0] - 2.0 * r[1] + 0.5 * r[2] + 0.3)
        .collect();
    (
        Tensor::from_vec(vec![4, 3], x).expect("x"),
        Tensor::from_vec(vec![4, 1], y).expect("y"),
    )
}

/// The first value of a float tensor (a loss).
pub fn scalar(t: &Tensor) -> f32 {
    t.values::<f32>().expect("a float loss")[0]
}
