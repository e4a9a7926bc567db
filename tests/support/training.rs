//! A training job small enough to check by hand: one variable on the ps, updated by the
//! workers through a remote session, so each step crosses every kind of RPC a cluster makes
//! (client → master, master → workers and ps, worker → worker and ps tensors).
//!
//! `w` (3×1) lives on `/job:ps/task:0`; a step computes `h = x·w` on worker 0, the gradient
//! of `½‖x·w‖²`, `g = xᵀ·h`, on the last worker, and applies `w ← w − 0.5·g` on the ps, with
//! `count += 1` beside it. With `x = [[1, 0, 0], [0, 1, 0]]` the gradient is `w` with its
//! last entry zeroed, so each step halves `w[0]` and `w[1]` and leaves `w[2]`:
//! from `[2, 4, 8]`, step 1 gives `[1, 2, 8]` and step 2 `[0.5, 1, 8]`, all exact in f32.

use tessera::client::Session;
use tessera::graph::Graph;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Result;

/// The graph and the names a test runs and fetches.
pub struct Job {
    pub graph: Graph,
    pub init: String,
    pub train: String,
    pub x: String,
    pub w: String,
    pub count: String,
}

/// The job for a cluster with `workers` workers (1 or more): `h` on worker 0, the gradient on
/// the last one.
pub fn job(workers: usize) -> Result<Job> {
    let mut g = Graph::new();
    let (w, count) = g.with_device("/job:ps/task:0", |g| {
        let initial = g.constant(&Tensor::from_vec(vec![3, 1], vec![2.0f32, 4.0, 8.0])?)?;
        let w = g.variable("w", &initial)?;
        let zero = g.scalar("zero", DType::Float, 0.0)?;
        let count = g.variable("count", &zero)?;
        Ok((w, count))
    })?;
    let init = g.global_variables_initializer()?;
    let x = g.placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))?;
    let lr = g.scalar("lr", DType::Float, 0.5)?;
    let one = g.scalar("one", DType::Float, 1.0)?;
    let h = g.with_device("/job:worker/task:0", |g| g.matmul(&x, &w.value))?;
    let last = format!("/job:worker/task:{}", workers.max(1) - 1);
    let grad = g.with_device(&last, |g| g.matmul_t(&x, &h, true, false))?;
    let update = g.apply_gradient_descent(&w.handle, &lr, &grad)?;
    let inc = g.assign_add_variable(&count.handle, &one)?;
    let train = g.group("train", &[&update, &inc])?;
    Ok(Job {
        graph: g,
        init,
        train,
        x: x.name(),
        w: w.value.name(),
        count: count.value.name(),
    })
}

/// The batch every step feeds.
pub fn batch() -> Tensor {
    Tensor::from_vec(vec![2, 3], vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0]).unwrap()
}

/// Initialises and runs two steps; returns `w` and `count` after each step.
pub fn run_two_steps(sess: &Session, job: &Job) -> Result<Vec<(Vec<f32>, f32)>> {
    sess.extend(&job.graph.to_graph_def())?;
    sess.run(&[], &[], &[&job.init])?;
    let mut seen = Vec::new();
    for _ in 0..2 {
        sess.run(&[(&job.x, batch())], &[], &[&job.train])?;
        let fetched = sess.run(&[], &[&job.w, &job.count], &[])?;
        let w = fetched[0].values::<f32>()?.to_vec();
        let count = fetched[1].values::<f32>()?[0];
        seen.push((w, count));
    }
    Ok(seen)
}

/// What [`run_two_steps`] returns, worked out by hand in the module doc.
pub fn expected_two_steps() -> Vec<(Vec<f32>, f32)> {
    vec![(vec![1.0, 2.0, 8.0], 1.0), (vec![0.5, 1.0, 8.0], 2.0)]
}
