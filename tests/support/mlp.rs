//! A 4-5-3 MLP small enough to train in a test on any device set (ReLU, softmax cross-entropy,
//! batch-mean loss), with fixed initial weights, trained by gradient descent (learning rate
//! 0.5) for 10 steps on 8 examples whose features and labels follow closed formulas: once on
//! one device with the whole batch ([`single_device_model`]) and once as in-graph towers
//! ([`tower_model`]). With N towers each tower's loss is the mean over its 8/N examples, so the
//! averaged gradient equals the whole batch's gradient mathematically; only the float
//! summation order differs.

use tessera::client::Session;
use tessera::graph::{Graph, Output, Variable};
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;
use tessera::train::towers::{build_towers, TowerOptions};

pub const BATCH: usize = 8;
pub const FEATURES: usize = 4;
pub const HIDDEN: usize = 5;
pub const CLASSES: usize = 3;
pub const STEPS: usize = 10;
pub const LEARNING_RATE: f64 = 0.5;

/// Row `r` of the batch: x[r][c] = sin(1.3 r + 0.7 c + 0.1 step), label (r + step) mod 3.
pub fn batch(step: usize) -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(BATCH * FEATURES);
    let mut y = vec![0f32; BATCH * CLASSES];
    for r in 0..BATCH {
        for c in 0..FEATURES {
            x.push((1.3 * r as f32 + 0.7 * c as f32 + 0.1 * step as f32).sin());
        }
        y[r * CLASSES + (r + step) % CLASSES] = 1.0;
    }
    (
        Tensor::from_vec([BATCH, FEATURES], x).unwrap(),
        Tensor::from_vec([BATCH, CLASSES], y).unwrap(),
    )
}

/// Fixed initial values: w[i][j] = 0.3 cos(i + 2j + k) for the k-th variable.
pub fn initial(dims: &[usize], k: usize) -> Tensor {
    let n: usize = dims.iter().product();
    let cols = *dims.last().unwrap();
    let values = (0..n)
        .map(|e| 0.3 * ((e / cols) as f32 + 2.0 * (e % cols) as f32 + k as f32).cos())
        .collect();
    Tensor::from_vec(dims.to_vec(), values).unwrap()
}

pub struct Model {
    pub graph: Graph,
    pub vars: Vec<Variable>,
    pub init: String,
    pub train_op: String,
    pub loss: Output,
}

/// The variables (on CPU:0, where TensorFlow keeps shared tower variables).
pub fn variables(g: &mut Graph) -> Vec<Variable> {
    g.with_device("/device:CPU:0", |g| {
        let shapes: [(&str, Vec<usize>); 4] = [
            ("w1", vec![FEATURES, HIDDEN]),
            ("b1", vec![HIDDEN]),
            ("w2", vec![HIDDEN, CLASSES]),
            ("b2", vec![CLASSES]),
        ];
        let mut vars = Vec::new();
        for (k, (name, dims)) in shapes.iter().enumerate() {
            let value = g.constant(&initial(dims, k))?;
            vars.push(g.variable(name, &value)?);
        }
        Ok(vars)
    })
    .unwrap()
}

/// The tower function: batch-mean softmax cross-entropy of the MLP on `inputs` = [x, labels].
pub fn mlp_loss(g: &mut Graph, vars: &[Variable], inputs: &[Output]) -> tessera::Result<Output> {
    let w1 = g.read_variable(&vars[0].handle)?;
    let b1 = g.read_variable(&vars[1].handle)?;
    let w2 = g.read_variable(&vars[2].handle)?;
    let b2 = g.read_variable(&vars[3].handle)?;
    let h = g.matmul(&inputs[0], &w1)?;
    let h = g.bias_add(&h, &b1)?;
    let h = g.relu(&h)?;
    let logits = g.matmul(&h, &w2)?;
    let logits = g.bias_add(&logits, &b2)?;
    let (per_row, _) = g.softmax_cross_entropy(&logits, &inputs[1])?;
    g.mean(&per_row, &[0], false)
}

pub fn placeholders(g: &mut Graph) -> Vec<Output> {
    g.with_device("/device:CPU:0", |g| {
        Ok(vec![
            g.placeholder(
                "x",
                DType::Float,
                PartialShape::new(vec![None, Some(FEATURES)]),
            )?,
            g.placeholder(
                "labels",
                DType::Float,
                PartialShape::new(vec![None, Some(CLASSES)]),
            )?,
        ])
    })
    .unwrap()
}

/// One device, whole batch: `minimize` on the batch-mean loss.
pub fn single_device_model() -> Model {
    let mut g = Graph::new();
    let inputs = placeholders(&mut g);
    let vars = variables(&mut g);
    let loss = mlp_loss(&mut g, &vars, &inputs).unwrap();
    let train_op = Optimizer::gradient_descent(LEARNING_RATE)
        .minimize_vars(&mut g, &loss, &vars, None)
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    Model {
        graph: g,
        vars,
        init,
        train_op,
        loss,
    }
}

/// One tower per device of `devices`, averaged and applied on CPU:0.
pub fn tower_model(devices: Vec<String>) -> Model {
    tower_model_with(&TowerOptions::new(devices))
}

/// Towers as `options` say.
pub fn tower_model_with(options: &TowerOptions) -> Model {
    let mut g = Graph::new();
    let inputs = placeholders(&mut g);
    let vars = variables(&mut g);
    let built = build_towers(
        &mut g,
        &inputs,
        &vars,
        &Optimizer::gradient_descent(LEARNING_RATE),
        None,
        options,
        |g, parts| mlp_loss(g, &vars, parts),
    )
    .unwrap();
    let init = g.global_variables_initializer().unwrap();
    Model {
        graph: g,
        vars,
        init,
        train_op: built.train_op,
        loss: built.loss,
    }
}

/// Runs training step `step` of `model` (already initialised) on its batch; returns the loss
/// before the update.
pub fn train_step(session: &Session, model: &Model, step: usize) -> f32 {
    let (x, y) = batch(step);
    let out = session
        .run(
            &[("x:0", x), ("labels:0", y)],
            &[&model.loss.name()],
            &[&model.train_op],
        )
        .unwrap();
    out[0].scalar_value::<f32>().unwrap()
}

/// Trains `model` for STEPS steps; returns the losses before each step and the final values of
/// the variables.
pub fn train(session: &Session, model: &Model) -> (Vec<f32>, Vec<Vec<f32>>) {
    session.extend(&model.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();
    let losses = (0..STEPS)
        .map(|step| train_step(session, model, step))
        .collect();
    (losses, variable_values(session, model))
}

/// The values of `model`'s variables now.
pub fn variable_values(session: &Session, model: &Model) -> Vec<Vec<f32>> {
    let reads: Vec<String> = model.vars.iter().map(|v| v.value.name()).collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    session
        .run(&[], &reads, &[])
        .unwrap()
        .iter()
        .map(|t| t.values::<f32>().unwrap().into_owned())
        .collect()
}

pub fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = tolerance + tolerance * w.abs();
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: towers {g}, one device {w} (|diff| {} > {bound})",
            (g - w).abs()
        );
    }
}

/// The towers' run ([`train`]'s losses and variables) matches the one-device run within
/// `tolerance` absolute plus `tolerance` relative, and the one-device run trained.
pub fn assert_same_training(
    (tower_losses, tower_vars): &(Vec<f32>, Vec<Vec<f32>>),
    (losses, vars): &(Vec<f32>, Vec<Vec<f32>>),
    tolerance: f32,
) {
    assert_close("loss", tower_losses, losses, tolerance);
    for (k, (t, o)) in tower_vars.iter().zip(vars).enumerate() {
        assert_close(&format!("variable {k}"), t, o, tolerance);
    }
    // The runs trained: the parameters moved, and the loss fell.
    assert!(
        losses[STEPS - 1] < losses[0],
        "loss did not fall: {losses:?}"
    );
}
