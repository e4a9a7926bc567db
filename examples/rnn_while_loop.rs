//! An Elman recurrent network unrolled by a TensorFlow 1 while loop: it reads 10 samples of a
//! sine wave (random phase, frequency and amplitude) and predicts the next one. The loop is
//! built with `Graph::while_loop` (Enter / Merge / Switch / NextIteration / Exit frames), the
//! gradients through it with the graph's `gradients` (a gradient loop reading the forward
//! values back from stacks), and Adam updates the weights; everything runs in an in-process
//! session. Pass `--reference` to keep the weights in TensorFlow 1 reference variables
//! (`VariableV2`, updated by `ApplyAdam`) instead of resource variables.
//!
//! Run: `cargo run --example rnn_while_loop [-- --reference]`

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::client::Session;
use tessera::graph::{Graph, Output, VariableKind};
use tessera::proto::CallableOptions;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;

/// Samples the network reads before predicting.
const STEPS: usize = 10;
/// Hidden units.
const HIDDEN: usize = 16;
/// Sequences per training step.
const BATCH: usize = 32;
/// Training steps.
const TRAIN_STEPS: usize = 300;

/// A batch: the inputs `[STEPS, BATCH, 1]` and the next values `[BATCH, 1]`.
fn batch(rng: &mut StdRng, n: usize) -> Result<(Tensor, Tensor)> {
    let mut xs = vec![0f32; STEPS * n];
    let mut next = vec![0f32; n];
    for b in 0..n {
        let phase = rng.random_range(0.0..std::f32::consts::TAU);
        let freq = rng.random_range(0.2..0.6f32);
        let amp = rng.random_range(0.5..1.0f32);
        for t in 0..STEPS {
            xs[t * n + b] = amp * (phase + freq * t as f32).sin();
        }
        next[b] = amp * (phase + freq * STEPS as f32).sin();
    }
    Ok((
        Tensor::from_vec([STEPS, n, 1], xs)?,
        Tensor::from_vec([n, 1], next)?,
    ))
}

/// Uniform weights in `[-limit, limit)`.
fn uniform(g: &mut Graph, rng: &mut StdRng, dims: &[usize], limit: f32) -> Result<Output> {
    let n = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-limit..limit)).collect();
    Ok(g.constant(&Tensor::from_vec(dims.to_vec(), v)?)?)
}

/// The model: `h = tanh(x_t w + h u + b)` over the sequence in a while loop, then
/// `prediction = h v + c`; returns the graph, the loss, the train op and the initializer.
fn build(kind: VariableKind) -> Result<(Graph, Output, String, String)> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut g = Graph::new();
    g.set_variable_kind(kind);
    let xs = g.placeholder(
        "xs",
        DType::Float,
        PartialShape::new([Some(STEPS), None, Some(1)]),
    )?;
    let next = g.placeholder("next", DType::Float, PartialShape::new([None, Some(1)]))?;
    let w0 = uniform(&mut g, &mut rng, &[1, HIDDEN], 1.0)?;
    let u0 = uniform(
        &mut g,
        &mut rng,
        &[HIDDEN, HIDDEN],
        (3.0 / HIDDEN as f32).sqrt(),
    )?;
    let v0 = uniform(&mut g, &mut rng, &[HIDDEN, 1], (3.0 / HIDDEN as f32).sqrt())?;
    let zeros =
        |g: &mut Graph, dims: &[usize]| g.constant(&Tensor::zeros(DType::Float, dims.to_vec())?);
    let b0 = zeros(&mut g, &[HIDDEN])?;
    let c0 = zeros(&mut g, &[1])?;
    let w = g.variable("rnn/w", &w0)?;
    let u = g.variable("rnn/u", &u0)?;
    let b = g.variable("rnn/b", &b0)?;
    let v = g.variable("out/v", &v0)?;
    let c = g.variable("out/c", &c0)?;

    // h0: zeros of [batch, HIDDEN], the batch taken from the fed sequence.
    let shape = g.shape(&xs)?;
    let one = g.const_vec_i32("one", &[1])?;
    let batch = g.slice(&shape, &one, &one)?;
    let hidden = g.const_vec_i32("hidden", &[HIDDEN as i64])?;
    let h_shape = g.concat(&[batch, hidden], 0)?;
    let zero = g.scalar("zero", DType::Float, 0.0)?;
    let h0 = g.fill(&h_shape, &zero)?;
    let i0 = g.const_i32("i0", &[], &[0])?;
    let steps = g.const_i32("steps", &[], &[STEPS as i32])?;
    let out = g.while_loop(
        |g, l| g.binary("Less", &l[0], &steps),
        |g, l| {
            let x_t = g.gather(&xs, &l[0], 0)?;
            let (w, u, b) = (g.read(&w)?, g.read(&u)?, g.read(&b)?);
            let xw = g.matmul(&x_t, &w)?;
            let hu = g.matmul(&l[1], &u)?;
            let s = g.add(&xw, &hu)?;
            let s = g.bias_add(&s, &b)?;
            let h = g.unary("Tanh", &s)?;
            let one = g.const_i32("one", &[], &[1])?;
            Ok(vec![g.add(&l[0], &one)?, h])
        },
        &[i0, h0],
        10,
        "rnn",
    )?;
    let (v, c) = (g.read(&v)?, g.read(&c)?);
    let y = g.matmul(&out[1], &v)?;
    let prediction = g.bias_add(&y, &c)?;
    let err = g.sub(&prediction, &next)?;
    let sq = g.mul(&err, &err)?;
    let loss = g.mean(&sq, &[0, 1], false)?;
    let train = Optimizer::adam(0.01).minimize(&mut g, &loss, None)?;
    let init = g.global_variables_initializer()?;
    Ok((g, loss, train, init))
}

fn main() -> Result<()> {
    let kind = if std::env::args().any(|a| a == "--reference") {
        VariableKind::Reference
    } else {
        VariableKind::Resource
    };
    let (g, loss, train, init) = build(kind)?;
    println!(
        "elman rnn ({HIDDEN} hidden, {:?} variables): {} nodes, {STEPS} steps per sequence",
        kind,
        g.nodes().len()
    );
    let session = Session::local();
    session.extend(&g.to_graph_def())?;
    session.run(&[], &[], &[&init])?;
    let feeds = vec!["xs:0".to_string(), "next:0".to_string()];
    let step = session.make_callable(CallableOptions {
        feed: feeds.clone(),
        fetch: vec![loss.name()],
        target: vec![train],
        ..Default::default()
    })?;
    let evaluate = session.make_callable(CallableOptions {
        feed: feeds,
        fetch: vec![loss.name()],
        ..Default::default()
    })?;
    let mut held_out_rng = StdRng::seed_from_u64(99);
    let (held_xs, held_next) = batch(&mut held_out_rng, 256)?;
    let held_out = |session: &Session| -> Result<f32> {
        let out = session.run_callable(evaluate, vec![held_xs.clone(), held_next.clone()])?;
        Ok(out[0].scalar_value::<f32>()?)
    };
    // Predicting the last sample seen is the baseline to beat.
    let xs = held_xs.values::<f32>()?;
    let next = held_next.values::<f32>()?;
    let last = &xs[(STEPS - 1) * 256..];
    let baseline = last
        .iter()
        .zip(next.iter())
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f32>()
        / 256.0;
    let initial = held_out(&session)?;
    println!(
        "held-out loss {initial:.4} before training (repeating the last sample: {baseline:.4})"
    );
    let mut rng = StdRng::seed_from_u64(1);
    for i in 1..=TRAIN_STEPS {
        let (xs, next) = batch(&mut rng, BATCH)?;
        let out = session.run_callable(step, vec![xs, next])?;
        if i % 25 == 0 {
            let l = out[0].scalar_value::<f32>().context("loss")?;
            println!("step {i:4}  batch loss {l:.4}");
        }
    }
    let last = held_out(&session)?;
    println!(
        "held-out loss {initial:.4} -> {last:.4} ({:.1}x lower; repeating the last sample: {baseline:.4})",
        initial / last
    );
    Ok(())
}
