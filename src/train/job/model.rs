//! The graph every worker of a job builds (between-graph replication): the model's variables
//! on the ps tasks through [`replica_device_setter`], its computation on the worker's own
//! task, the optimizer's updates next to the variables, and the saver's ops on the ps tasks.
//!
//! ```text
//! x [b, d] float32, y [b] int64                     placeholders, fed per step
//!   (the embedding model's ids [b, c] int64 too)
//! layer<k>/w, layer<k>/b                           variables (round robin over the ps tasks);
//!   the cnn's: conv<k>/w, conv<k>/b, dense/w, dense/b  (see [`super::cnn`]);
//!   the embedding model's tables: embedding/part_<p>, wide/part_<p>, one part per ps task
//!   (see [`super::embedding`])
//! logits → SparseSoftmaxCrossEntropyWithLogits → loss (mean)
//!   regression: y [b, t] float32; x · W + b → squared error → loss (mean)
//! async: <Optimizer> (minimize, global_step += 1)  sync: SyncReplicasOptimizer's ops
//! save/...                                         the chief's checkpoints
//! ```
//!
//! Every worker builds the same variables with the same names and initial values (seeded),
//! so whichever worker is chief initialises the model the others wait for.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::error::{Result, Status};
use crate::graph::indexed_slices::GradientTensor;
use crate::graph::{replica_device_setter, Graph, Output, PartitionedVariable, Variable};
use crate::proto::GraphDef;
use crate::tensor::{DType, PartialShape, Tensor};
use crate::train::checkpoint::saver::{build_saver_ops_for, SavedVariable, SaverDef};
use crate::train::monitored::ReadyOp;
use crate::train::optimizer::{get_or_create_global_step, variable_from_handle};
use crate::train::sync_replicas::{SyncReplicasOps, SyncReplicasOptimizer};
use crate::train::towers::{
    average_towers, build_towers, local_devices, GradientSum, TowerOptions,
};

use super::cnn::Cnn;
use super::embedding::Embedding;
use super::layers::{dense_forward, dense_variables};
use super::spec::{ModelKind, TrainSpec};

/// The features placeholder.
pub const X: &str = "x:0";
/// The labels placeholder.
pub const Y: &str = "y:0";
pub use super::embedding::IDS;

/// Where this worker sits in the cluster.
#[derive(Clone, Debug)]
pub struct Placement {
    /// ps tasks (the variables are spread over them).
    pub num_ps: u32,
    /// This task's job: `worker`, or `chief` where the cluster has a chief job (a Kubeflow
    /// TFJob's Chief replica).
    pub job: String,
    /// Whether this task is the chief: the `chief` task, or worker 0 without one.
    pub chief: bool,
    /// This task's index in its job.
    pub worker_index: u32,
    /// Training replicas in the cluster: the workers, and the chief when it has a job of
    /// its own.
    pub num_workers: usize,
}

/// How a step trains.
#[derive(Clone, Debug)]
pub enum TrainOp {
    /// Run this node: apply this worker's gradients and add one to the global step.
    Async(String),
    /// Synchronous replication: fetch `ops.train_op`; the chief also runs the aggregation
    /// loop and enqueues the first tokens with `init_tokens`.
    Sync {
        ops: Box<SyncReplicasOps>,
        init_tokens: String,
    },
}

/// The names of what the training graph holds.
#[derive(Clone, Debug)]
pub struct TrainGraph {
    pub graph: GraphDef,
    /// `[b, classes]` logits.
    pub logits: String,
    /// The mean cross-entropy of the batch.
    pub loss: String,
    /// A read of the global step.
    pub global_step: String,
    pub train: TrainOp,
    /// Initialises every variable.
    pub init_op: String,
    /// Runs in every new session (the sync replicas' local step); `None` for async.
    pub local_init_op: Option<String>,
    /// Reports the variables the chief has not yet initialised.
    pub ready: ReadyOp,
    /// Names of the variables the checkpoints hold.
    pub saved: Vec<String>,
    /// The trainable variables: `(name, a read of its value)`, input side first.
    pub trainable: Vec<(String, String)>,
    /// The saver's ops.
    pub saver: SaverDef,
}

/// What the examples are: float features, ids (the embedding model's), classes.
#[derive(Clone, Copy, Debug)]
pub struct Examples {
    /// Float features per example.
    pub features: usize,
    /// Ids per example (0 without id columns).
    pub ids: usize,
    /// Classes (one more than the largest label).
    pub classes: usize,
}

/// Builds worker `placement.worker_index`'s copy of the training graph for examples of
/// `features` features in `classes` classes.
pub fn build(
    spec: &TrainSpec,
    placement: &Placement,
    features: usize,
    classes: usize,
) -> Result<TrainGraph> {
    let examples = Examples {
        features,
        ids: 0,
        classes,
    };
    build_for(spec, placement, examples)
}

/// [`build`] for examples that may have ids.
pub fn build_for(
    spec: &TrainSpec,
    placement: &Placement,
    examples: Examples,
) -> Result<TrainGraph> {
    let Examples {
        features,
        ids: num_ids,
        classes,
    } = examples;
    let loss_kind = match spec.model {
        ModelKind::Regression => Loss::SquaredError,
        _ => Loss::CrossEntropy,
    };
    if loss_kind == Loss::CrossEntropy && classes < 2 {
        return Err(Status::invalid_argument(format!(
            "the data has {classes} class(es); a classifier needs labels of at least two \
             classes (0 and 1)"
        )));
    }
    let net = match &spec.model {
        ModelKind::Cnn { filters } => Net::Conv(Cnn::new(features, filters, classes)?),
        ModelKind::Softmax | ModelKind::Mlp { .. } | ModelKind::Regression => Net::Dense {
            hidden: spec.model.hidden().to_vec(),
        },
        ModelKind::Embedding { rows, dim, hidden } => Net::Embed(Embedding::new(
            *rows,
            *dim,
            hidden,
            num_ids,
            features,
            classes,
            placement.num_ps.max(1) as usize,
        )?),
    };
    let worker = format!("/job:{}/task:{}", placement.job, placement.worker_index);
    let setter = replica_device_setter(placement.num_ps.max(1), &worker)?;
    let mut g = Graph::new();
    let built = g.with_device_fn(setter, |g| -> Result<_> {
        let global_step = get_or_create_global_step(g)?;
        let x = g.placeholder("x", DType::Float, PartialShape::new([None, Some(features)]))?;
        let mut inputs = vec![x];
        if let Net::Embed(_) = net {
            let shape = PartialShape::new([None, Some(num_ids)]);
            inputs.push(g.placeholder("ids", DType::Int64, shape)?);
        }
        let y = match loss_kind {
            Loss::CrossEntropy => g.placeholder("y", DType::Int64, PartialShape::new([None]))?,
            // The targets: `classes` of them per example.
            Loss::SquaredError => {
                g.placeholder("y", DType::Float, PartialShape::new([None, Some(classes)]))?
            }
        };
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let (params, tables) = net.variables(g, &mut rng, spec.seed, features, classes)?;
        let variables: Vec<Variable> = params.iter().map(|(_, v)| v.clone()).collect();
        // The whole batch's logits (the held-out evaluation; the loss too without towers).
        let logits = net.forward(g, &inputs, &variables, &tables, false)?;
        let (loss, train) = if spec.towers > 1 {
            inputs.push(y.clone());
            let model = Model {
                net: &net,
                variables: &variables,
                tables: &tables,
                loss: loss_kind,
            };
            tower_train_op(g, spec, &model, &worker, &inputs, &global_step)?
        } else {
            let loss = mean_loss(g, loss_kind, &logits, &y)?;
            let train = train_op(g, spec, &worker, &loss, &variables, &global_step)?;
            (loss, train)
        };
        // The histograms' variables: not the tables, whose every read would move them whole.
        let trainable: Vec<(String, String)> = params
            .iter()
            .skip(net.table_parts())
            .map(|(name, v)| (name.clone(), v.value.name()))
            .collect();
        Ok((global_step, logits, loss, train, trainable, tables))
    })?;
    let (global_step, logits, loss, train, trainable, tables) = built;
    let saved = saved_variables(&g)?;
    let saver = build_saver_ops_for(&mut g, &SavedVariable::all(&saved, &tables))?;
    let init_op = g.global_variables_initializer()?;
    let mut ready = ReadyOp::default();
    for name in saved.keys() {
        ready = ready.with_check(name, &format!("{name}/IsInitialized/VarIsInitializedOp:0"));
    }
    let (train, local_init_op) = match train {
        TrainOp::Sync { ops, .. } => {
            let init_tokens = ops.get_init_tokens_op(&mut g, -1)?;
            let local = if placement.chief {
                ops.chief_init_op.clone()
            } else {
                ops.local_step_init_op.clone()
            };
            (TrainOp::Sync { ops, init_tokens }, Some(local))
        }
        other => (other, None),
    };
    Ok(TrainGraph {
        graph: g.to_graph_def(),
        logits: logits.name(),
        loss: loss.name(),
        global_step: global_step.value.name(),
        train,
        init_op,
        local_init_op,
        ready,
        saved: saved.keys().cloned().collect(),
        trainable,
        saver,
    })
}

/// Variables with the names the histograms and tests know them by, input side first.
type Named = Vec<(String, Variable)>;

/// The network a [`ModelKind`] builds: its variables, and its logits from their values.
enum Net {
    /// Dense layers (softmax regression, the MLP): `layer<k>/w`, `layer<k>/b`.
    Dense { hidden: Vec<usize> },
    /// The convolutional network ([`Cnn`]).
    Conv(Cnn),
    /// The wide-and-deep model on partitioned tables ([`Embedding`]).
    Embed(Embedding),
}

impl Net {
    /// Creates the variables (seeded by `rng`, the tables' initialisers by `seed`) for
    /// examples of `features` features in `classes` classes; returns them named, input side
    /// first, and the partitioned tables among them (the embedding model's).
    fn variables(
        &self,
        g: &mut Graph,
        rng: &mut StdRng,
        seed: u64,
        features: usize,
        classes: usize,
    ) -> Result<(Named, Vec<PartitionedVariable>)> {
        let hidden = match self {
            Self::Conv(cnn) => return Ok((cnn.variables(g, rng)?, Vec::new())),
            Self::Embed(net) => {
                let made = net.variables(g, rng, seed)?;
                return Ok((made.named, made.tables));
            }
            Self::Dense { hidden } => hidden,
        };
        let mut widths = vec![features];
        widths.extend(hidden);
        widths.push(classes);
        Ok((dense_variables(g, rng, &widths)?, Vec::new()))
    }

    /// How many of the variables (the first) are parts of partitioned tables, read row by
    /// row rather than whole.
    fn table_parts(&self) -> usize {
        match self {
            Self::Embed(net) => net.table_parts(),
            Self::Dense { .. } | Self::Conv(_) => 0,
        }
    }

    /// The logits of `inputs` (`x`, and the embedding model's ids) with `vars` the variables
    /// in the order [`Net::variables`] returns them (`tables` the partitioned ones among
    /// them), read through their own read nodes or, with `fresh_reads` (a tower's), through
    /// new reads.
    fn forward(
        &self,
        g: &mut Graph,
        inputs: &[Output],
        vars: &[Variable],
        tables: &[PartitionedVariable],
        fresh_reads: bool,
    ) -> Result<Output> {
        let values = vars[self.table_parts()..]
            .iter()
            .map(|v| {
                if fresh_reads {
                    g.read_variable(&v.handle)
                } else {
                    Ok(v.value.clone())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        match (self, inputs) {
            (Self::Conv(cnn), [x, ..]) => cnn.forward(g, x, &values),
            (Self::Dense { .. }, [x, ..]) => dense_forward(g, x, &values),
            (Self::Embed(net), [x, ids, ..]) => net.forward(g, x, ids, tables, &values),
            _ => Err(Status::internal(format!(
                "the model takes its features (and ids), given {} inputs",
                inputs.len()
            ))),
        }
    }
}

/// What a model's loss measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// The sparse softmax cross-entropy of the logits against int64 labels (the classifiers).
    CrossEntropy,
    /// The squared error of the outputs against float targets (the regression).
    SquaredError,
}

/// The batch's mean loss of `out` (logits, or the regression's outputs) against `y`.
fn mean_loss(g: &mut Graph, loss: Loss, out: &Output, y: &Output) -> Result<Output> {
    match loss {
        Loss::CrossEntropy => {
            let (xent, _) = g.sparse_softmax_cross_entropy(out, y)?;
            g.mean(&xent, &[0], false)
        }
        Loss::SquaredError => {
            let error = g.sub(out, y)?;
            let squared = g.mul(&error, &error)?;
            g.mean(&squared, &[0, 1], false)
        }
    }
}

/// The network and the variables it was built with.
struct Model<'a> {
    net: &'a Net,
    variables: &'a [Variable],
    tables: &'a [PartitionedVariable],
    loss: Loss,
}

/// `--towers N`: the batch split over the worker's `CPU:0..N-1` or `GPU:0..N-1` (each tower
/// reads the variables and computes its part's mean loss and gradients on its own device; the
/// setter adds this worker's job and task), the gradients summed (on `CPU:0`, or among the
/// towers with `--all_reduce`) and averaged on `CPU:0`, then the same update as without
/// towers. `inputs` are the model's inputs, the labels last. Returns the mean of the tower
/// losses (the whole batch's mean loss) and the train op.
fn tower_train_op(
    g: &mut Graph,
    spec: &TrainSpec,
    built: &Model<'_>,
    replica: &str,
    inputs: &[Output],
    global_step: &Variable,
) -> Result<(Output, TrainOp)> {
    let variables = built.variables;
    let optimizer = spec.optimizer()?;
    let options = TowerOptions {
        gradient_sum: if spec.all_reduce {
            GradientSum::AllReduce
        } else {
            GradientSum::AddN
        },
        ..TowerOptions::new(local_devices(spec.tower_device.as_str(), spec.towers))
    };
    let model = |g: &mut Graph, parts: &[Output]| -> Result<Output> {
        let (labels, features) = parts
            .split_last()
            .ok_or_else(|| Status::internal("a tower has no inputs"))?;
        let logits = built
            .net
            .forward(g, features, variables, built.tables, true)?;
        mean_loss(g, built.loss, &logits, labels)
    };
    if spec.sync.is_none() {
        let towers = build_towers(
            g,
            inputs,
            variables,
            &optimizer,
            Some(global_step),
            &options,
            model,
        )?;
        return Ok((towers.loss, TrainOp::Async(towers.train_op)));
    }
    let averaged = average_towers(g, inputs, variables, &optimizer, &options, model)?;
    let train = sync_train_op(g, spec, replica, averaged.grads_and_vars, global_step)?;
    Ok((averaged.loss, train))
}

/// The optimizer's ops: `minimize` for asynchronous training, SyncReplicas around the
/// optimizer for synchronous, its gradients tagged with `replica` (this worker's task).
fn train_op(
    g: &mut Graph,
    spec: &TrainSpec,
    replica: &str,
    loss: &Output,
    variables: &[Variable],
    global_step: &Variable,
) -> Result<TrainOp> {
    let optimizer = spec.optimizer()?;
    match &spec.sync {
        None => Ok(TrainOp::Async(optimizer.minimize_vars(
            g,
            loss,
            variables,
            Some(global_step),
        )?)),
        Some(_) => {
            let grads = optimizer.compute_sparse_gradients(g, loss, variables)?;
            sync_train_op(g, spec, replica, grads, global_step)
        }
    }
}

/// SyncReplicas around the optimizer over `grads` (every variable must have a gradient), the
/// gradients tagged with `replica`.
fn sync_train_op(
    g: &mut Graph,
    spec: &TrainSpec,
    replica: &str,
    grads: Vec<(Option<GradientTensor>, Variable)>,
    global_step: &Variable,
) -> Result<TrainOp> {
    let sync = spec
        .sync
        .as_ref()
        .ok_or_else(|| Status::internal("sync_train_op called for asynchronous training"))?;
    let pairs: Vec<(GradientTensor, Variable)> = grads
        .into_iter()
        .map(|(grad, var)| {
            let grad = grad.ok_or_else(|| {
                Status::internal(format!(
                    "no gradient reaches `{}` from the loss",
                    var.handle.node
                ))
            })?;
            Ok((grad, var))
        })
        .collect::<Result<_>>()?;
    let opt = SyncReplicasOptimizer::wrapping(
        spec.optimizer()?,
        sync.replicas_to_aggregate,
        Some(sync.total_num_replicas),
    )?
    .replica_id(replica);
    // A table's rows meet in a sparse accumulator and are applied as rows.
    let ops = opt.apply_gradient_tensors(g, &pairs, global_step)?;
    Ok(TrainOp::Sync {
        ops: Box::new(ops),
        init_tokens: String::new(),
    })
}

/// Every variable on a ps task (the model, the optimizer's slots, the global step), by name:
/// what a checkpoint holds and what the chief must initialise. The sync replicas' local step
/// lives on each worker and is neither.
fn saved_variables(g: &Graph) -> Result<BTreeMap<String, Variable>> {
    let mut saved = BTreeMap::new();
    for node in g.nodes() {
        if node.op == "VarHandleOp" && node.device.starts_with("/job:ps") {
            saved.insert(node.name.clone(), variable_from_handle(g, &node.name)?);
        }
    }
    if saved.is_empty() {
        return Err(Status::internal(
            "the training graph placed no variable on a ps task; the cluster needs a ps job",
        ));
    }
    Ok(saved)
}

/// The fraction of rows of `logits` (`[n, classes]` float32) whose largest entry is at the
/// row's label.
pub fn accuracy(logits: &Tensor, labels: &[i64]) -> Result<f64> {
    let values = logits.values::<f32>()?;
    if labels.is_empty() || values.len() % labels.len() != 0 {
        return Err(Status::internal(format!(
            "{} logits do not make one row per label of {}",
            values.len(),
            labels.len()
        )));
    }
    let classes = values.len() / labels.len();
    let correct = values
        .chunks_exact(classes)
        .zip(labels)
        .filter(|(row, &label)| {
            let best = row
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as i64);
            best == Some(label)
        })
        .count();
    Ok(correct as f64 / labels.len() as f64)
}

/// A model's scores on held-out examples.
#[derive(Clone, Debug, PartialEq)]
pub struct Scores {
    /// The fraction of examples whose largest logit is at their label (NaN for a regression:
    /// see `regression`).
    pub accuracy: f64,
    /// The mean cross-entropy of the logits' softmax against the labels (natural log; NaN for
    /// a regression).
    pub log_loss: f64,
    /// Two classes: the area under the ROC curve of class 1's probability (`None` when the
    /// examples are all of one class).
    pub auc: Option<f64>,
    /// Two classes: the log loss of predicting, for every example, the training labels'
    /// mean: what a model must beat to have learnt anything.
    pub baseline_log_loss: Option<f64>,
    /// A regression's scores, in place of the classifier's above.
    pub regression: Option<RegressionScores>,
}

/// A regression's scores on held-out examples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegressionScores {
    /// The mean over examples and targets of the squared error.
    pub mean_squared_error: f64,
    /// The same for predicting zeros: the targets' mean square, what a model must beat to
    /// have learnt anything.
    pub zeros_mean_squared_error: f64,
}

impl Scores {
    /// The scores of `logits` (`[n_i, classes]` float32 chunks, `n` rows in all) against
    /// `labels` (`n`), the baseline from `train_labels`.
    pub fn of(logits: &[Tensor], labels: &[i64], train_labels: &[i64]) -> Result<Scores> {
        let mut rows: Vec<f32> = Vec::new();
        for chunk in logits {
            rows.extend_from_slice(&chunk.values::<f32>()?);
        }
        if labels.is_empty() || rows.is_empty() || rows.len() % labels.len() != 0 {
            return Err(Status::internal(format!(
                "{} logits do not make one row per label of {}",
                rows.len(),
                labels.len()
            )));
        }
        let classes = rows.len() / labels.len();
        let accuracy = accuracy(
            &Tensor::from_vec([labels.len(), classes], rows.clone())?,
            labels,
        )?;
        if let Some(bad) = labels.iter().find(|&&l| l < 0 || l as usize >= classes) {
            return Err(Status::internal(format!(
                "label {bad} has no logit among {classes} classes"
            )));
        }
        let mut log_loss = 0.0;
        let mut positive = Vec::with_capacity(labels.len());
        for (row, &label) in rows.chunks_exact(classes).zip(labels) {
            let max = row
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            let log_p = |c: usize| f64::from(row[c]) - max - sum.ln();
            log_loss -= log_p(label as usize);
            if classes == 2 {
                positive.push(log_p(1).exp());
            }
        }
        log_loss /= labels.len() as f64;
        let (auc, baseline_log_loss) = if classes == 2 {
            let mean = train_labels.iter().filter(|&&l| l == 1).count() as f64
                / train_labels.len().max(1) as f64;
            let mean = mean.clamp(1e-7, 1.0 - 1e-7);
            let baseline = labels
                .iter()
                .map(|&l| {
                    if l == 1 {
                        -mean.ln()
                    } else {
                        -(1.0 - mean).ln()
                    }
                })
                .sum::<f64>()
                / labels.len() as f64;
            (auc(&positive, labels), Some(baseline))
        } else {
            (None, None)
        };
        Ok(Scores {
            accuracy,
            log_loss,
            auc,
            baseline_log_loss,
            regression: None,
        })
    }

    /// The scores of a regression's `outputs` (`[n_i, t]` float32 chunks) against `targets`
    /// (`n · t` values, row-major).
    pub fn of_regression(outputs: &[Tensor], targets: &[f32]) -> Result<Scores> {
        let mut predicted: Vec<f32> = Vec::with_capacity(targets.len());
        for chunk in outputs {
            predicted.extend_from_slice(&chunk.values::<f32>()?);
        }
        if targets.is_empty() || predicted.len() != targets.len() {
            return Err(Status::internal(format!(
                "{} outputs for {} targets",
                predicted.len(),
                targets.len()
            )));
        }
        let mean = |f: &dyn Fn(usize) -> f64| {
            (0..targets.len()).map(f).sum::<f64>() / targets.len() as f64
        };
        let error = |i: usize| f64::from(predicted[i]) - f64::from(targets[i]);
        Ok(Scores {
            accuracy: f64::NAN,
            log_loss: f64::NAN,
            auc: None,
            baseline_log_loss: None,
            regression: Some(RegressionScores {
                mean_squared_error: mean(&|i| error(i) * error(i)),
                zeros_mean_squared_error: mean(&|i| f64::from(targets[i]).powi(2)),
            }),
        })
    }
}

/// The area under the ROC curve of `scores` for labels 0/1: the probability that a random
/// positive scores above a random negative, ties counting half (the Mann-Whitney U statistic
/// over the product of the class sizes). `None` when one class is missing.
pub fn auc(scores: &[f64], labels: &[i64]) -> Option<f64> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    // Ranks from 1, tied scores sharing their mean rank.
    let mut rank_sum = 0.0;
    let mut at = 0;
    while at < order.len() {
        let mut end = at;
        while end + 1 < order.len() && scores[order[end + 1]] == scores[order[at]] {
            end += 1;
        }
        let mean_rank = (at + end) as f64 / 2.0 + 1.0;
        rank_sum += order[at..=end].iter().filter(|&&i| labels[i] == 1).count() as f64 * mean_rank;
        at = end + 1;
    }
    let positives = labels.iter().filter(|&&l| l == 1).count() as f64;
    let negatives = labels.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return None;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceType;
    use std::collections::BTreeSet;

    #[test]
    fn accuracy_counts_rows_whose_argmax_is_the_label() {
        // Rows' argmaxes: 1, 0, 2; labels 1, 1, 2 → 2 of 3.
        let logits = Tensor::from_vec(
            [3, 3],
            vec![0.1f32, 0.9, 0.0, 5.0, 1.0, 1.0, -1.0, -2.0, 0.5],
        )
        .unwrap();
        let got = accuracy(&logits, &[1, 1, 2]).unwrap();
        assert!((got - 2.0 / 3.0).abs() < 1e-12, "{got}");
    }

    #[test]
    fn variables_go_to_the_ps_and_the_computation_to_the_worker() {
        let spec = TrainSpec {
            model: two_hidden_layers(),
            ..TrainSpec::default()
        };
        let placement = Placement {
            num_ps: 2,
            job: "worker".into(),
            chief: false,
            worker_index: 1,
            num_workers: 2,
        };
        let built = build(&spec, &placement, 4, 3).unwrap();
        let device = |name: &str| {
            built
                .graph
                .node
                .iter()
                .find(|n| n.name == name)
                .map(|n| n.device.clone())
                .unwrap_or_else(|| panic!("no node {name}"))
        };
        // Round robin over two ps tasks in creation order: global_step, layer0/w, layer0/b...
        assert_eq!(device("global_step"), "/job:ps/task:0");
        assert_eq!(device("layer0/w"), "/job:ps/task:1");
        assert_eq!(device("layer0/b"), "/job:ps/task:0");
        assert!(
            device("x").starts_with("/job:worker/task:1"),
            "{}",
            device("x")
        );
        assert!(built.saved.contains(&"global_step".to_string()));
        assert!(built.saved.contains(&"layer2/w".to_string()));
    }

    /// An MLP of three layers (two hidden).
    fn two_hidden_layers() -> crate::train::job::ModelKind {
        crate::train::job::ModelKind::Mlp {
            hidden: vec![64, 32],
        }
    }

    /// Worker 1's graph in a cluster of 1 ps and 2 workers, for 4 features and 3 classes.
    fn worker_1_of_2(spec: &TrainSpec) -> TrainGraph {
        let placement = Placement {
            num_ps: 1,
            job: "worker".into(),
            chief: false,
            worker_index: 1,
            num_workers: 2,
        };
        build(spec, &placement, 4, 3).unwrap()
    }

    #[test]
    fn gpu_towers_summing_with_all_reduce_put_one_member_per_variable_on_each_gpu() {
        let spec = TrainSpec {
            towers: 2,
            tower_device: DeviceType::Gpu,
            all_reduce: true,
            model: two_hidden_layers(),
            ..TrainSpec::default()
        };
        let built = worker_1_of_2(&spec);
        let variables = built
            .graph
            .node
            .iter()
            .filter(|n| {
                n.op == "VarHandleOp"
                    && n.name.starts_with("layer")
                    && (n.name.ends_with("/w") || n.name.ends_with("/b"))
            })
            .count();
        let mut members = [0usize; 2];
        for node in &built.graph.node {
            for (i, count) in members.iter_mut().enumerate() {
                if node.name.starts_with(&format!("tower_{i}/")) {
                    let want = format!("/job:worker/task:1/device:GPU:{i}");
                    assert_eq!(node.device, want, "`{}` ({})", node.name, node.op);
                    *count += usize::from(node.op == "NcclAllReduce");
                }
            }
        }
        assert_eq!(members, [variables; 2], "{variables} trained variables");
        assert!(variables >= 6, "three layers, a weight and a bias each");
    }

    #[test]
    fn towers_split_the_batch_over_the_workers_cpus_and_keep_the_variables_on_the_ps() {
        let spec = TrainSpec {
            towers: 2,
            ..TrainSpec::default()
        };
        let built = worker_1_of_2(&spec);
        let mut per_tower = [0usize; 2];
        for node in &built.graph.node {
            if node.op == "VarHandleOp" {
                assert_eq!(node.device, "/job:ps/task:0", "`{}`", node.name);
            }
            for (i, count) in per_tower.iter_mut().enumerate() {
                if node.name.starts_with(&format!("tower_{i}/")) {
                    let want = format!("/job:worker/task:1/device:CPU:{i}");
                    assert_eq!(node.device, want, "`{}` ({})", node.name, node.op);
                    *count += 1;
                }
            }
            if node.name.starts_with("split_batch/") || node.name.starts_with("average_gradients/")
            {
                assert_eq!(
                    node.device, "/job:worker/task:1/device:CPU:0",
                    "`{}`",
                    node.name
                );
            }
        }
        // Three layers: at least a MatMul forward and two backward per layer in each tower.
        assert!(per_tower.iter().all(|&c| c >= 9), "{per_tower:?}");
        // The loss is the towers' mean; the logits (for evaluation) take the whole batch.
        assert!(
            built.loss.starts_with("average_gradients/"),
            "{}",
            built.loss
        );
        assert!(!built.logits.starts_with("tower_"), "{}", built.logits);
        assert!(matches!(built.train, TrainOp::Async(_)));
    }

    /// The node `name` of the built graph.
    fn node_named<'a>(built: &'a TrainGraph, name: &str) -> &'a crate::proto::NodeDef {
        built
            .graph
            .node
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The cnn with its default filters.
    fn cnn() -> crate::train::job::ModelKind {
        crate::train::job::ModelKind::from_name("cnn", &[]).unwrap()
    }

    #[test]
    fn the_cnns_variables_go_to_the_ps_and_its_convolutions_to_the_worker() {
        let spec = TrainSpec {
            model: cnn(),
            ..TrainSpec::default()
        };
        let placement = Placement {
            num_ps: 2,
            job: "worker".into(),
            chief: false,
            worker_index: 1,
            num_workers: 2,
        };
        // 8x8 images (the digits), 10 classes.
        let built = build(&spec, &placement, 64, 10).unwrap();
        let names: Vec<&str> = built.trainable.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["conv0/w", "conv0/b", "conv1/w", "conv1/b", "dense/w", "dense/b"]
        );
        let node = |name: &str| node_named(&built, name);
        // Round robin over two ps tasks in creation order: global_step, conv0/w, conv0/b...
        assert_eq!(node("global_step").device, "/job:ps/task:0");
        assert_eq!(node("conv0/w").device, "/job:ps/task:1");
        assert_eq!(node("conv0/b").device, "/job:ps/task:0");
        assert_eq!(node("dense/b").device, "/job:ps/task:0");
        for name in &names {
            assert!(built.saved.contains(&name.to_string()), "{name} not saved");
        }
        let mut computed = BTreeMap::new();
        for node in &built.graph.node {
            if node.op == "VarHandleOp" {
                assert!(node.device.starts_with("/job:ps/"), "`{}`", node.name);
            }
            let heavy = [
                "Conv2D",
                "Conv2DBackpropInput",
                "Conv2DBackpropFilter",
                "MaxPool",
                "MaxPoolGrad",
                "MatMul",
            ];
            if heavy.contains(&node.op.as_str()) {
                assert!(
                    node.device.starts_with("/job:worker/task:1"),
                    "`{}` ({}) on {}",
                    node.name,
                    node.op,
                    node.device
                );
                *computed.entry(node.op.as_str()).or_insert(0) += 1;
            }
        }
        // Two convolutions and pools forward and backward (the first conv needs no input
        // gradient).
        assert_eq!(computed.get("Conv2D"), Some(&2), "{computed:?}");
        assert_eq!(
            computed.get("Conv2DBackpropFilter"),
            Some(&2),
            "{computed:?}"
        );
        assert_eq!(computed.get("MaxPoolGrad"), Some(&2), "{computed:?}");
    }

    #[test]
    fn the_cnns_towers_convolve_on_the_workers_cpus() {
        let spec = TrainSpec {
            model: cnn(),
            towers: 2,
            ..TrainSpec::default()
        };
        let placement = Placement {
            num_ps: 1,
            job: "worker".into(),
            chief: false,
            worker_index: 1,
            num_workers: 2,
        };
        let built = build(&spec, &placement, 784, 10).unwrap();
        let mut convs = [0usize; 2];
        for node in &built.graph.node {
            if node.op == "VarHandleOp" {
                assert_eq!(node.device, "/job:ps/task:0", "`{}`", node.name);
            }
            for (i, count) in convs.iter_mut().enumerate() {
                if node.name.starts_with(&format!("tower_{i}/")) {
                    let want = format!("/job:worker/task:1/device:CPU:{i}");
                    assert_eq!(node.device, want, "`{}` ({})", node.name, node.op);
                    *count += usize::from(node.op.starts_with("Conv2D"));
                }
            }
        }
        // Per tower: two forward convolutions and both backprops of each.
        assert_eq!(convs, [6, 6]);
    }

    #[test]
    fn the_cnn_refuses_examples_that_are_not_square_images() {
        let spec = TrainSpec {
            model: cnn(),
            ..TrainSpec::default()
        };
        let placement = Placement {
            num_ps: 1,
            job: "worker".into(),
            chief: true,
            worker_index: 0,
            num_workers: 1,
        };
        let err = build(&spec, &placement, 30, 10).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("30 features per example"), "{err}");
    }

    #[test]
    fn scores_give_the_log_loss_the_auc_and_the_label_means_log_loss() {
        // Two chunks of logits for 4 examples of 2 classes; labels 1, 0, 1, 0.
        let chunk = |v: Vec<f32>| Tensor::from_vec([v.len() / 2, 2], v).unwrap();
        let logits = [
            chunk(vec![0.0, 2.0, 1.0, 0.0]),
            chunk(vec![0.0, 0.5, 0.0, 1.0]),
        ];
        let scores = Scores::of(&logits, &[1, 0, 1, 0], &[1, 0, 0, 0]).unwrap();
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        // p(label): σ(2), 1 − σ(−1), σ(0.5), 1 − σ(1).
        let want = -[sigmoid(2.0), sigmoid(1.0), sigmoid(0.5), sigmoid(-1.0)]
            .iter()
            .map(|p: &f64| p.ln())
            .sum::<f64>()
            / 4.0;
        assert!(
            (scores.log_loss - want).abs() < 1e-6,
            "{scores:?} vs {want}"
        );
        // Class 1's scores: σ(2), σ(−1), σ(0.5), σ(1); positives rank 4 and 2 of 4.
        assert_eq!(scores.auc, Some(0.75));
        assert_eq!(scores.accuracy, 0.75);
        // The training labels' mean is 1/4: −(2 ln ¼ + 2 ln ¾) / 4.
        let baseline = -(2.0 * 0.25f64.ln() + 2.0 * 0.75f64.ln()) / 4.0;
        assert!((scores.baseline_log_loss.unwrap() - baseline).abs() < 1e-12);
        // Ten classes have neither.
        let ten = Tensor::from_vec([1, 10], vec![0.0f32; 10]).unwrap();
        let scores = Scores::of(&[ten], &[3], &[3]).unwrap();
        assert!((scores.log_loss - 10f64.ln()).abs() < 1e-6);
        assert_eq!((scores.auc, scores.baseline_log_loss), (None, None));
    }

    #[test]
    fn the_auc_counts_ties_as_half_and_needs_both_classes() {
        assert_eq!(auc(&[0.1, 0.2, 0.3], &[0, 0, 1]), Some(1.0));
        assert_eq!(auc(&[0.3, 0.2, 0.1], &[0, 0, 1]), Some(0.0));
        assert_eq!(auc(&[0.5, 0.5], &[0, 1]), Some(0.5));
        assert_eq!(auc(&[0.5, 0.5, 0.7, 0.1], &[1, 0, 1, 0]), Some(0.875));
        assert_eq!(auc(&[0.1, 0.2], &[1, 1]), None);
    }

    /// Worker 1's graph of the embedding model (10 × 4 tables, adagrad, `towers` towers,
    /// `sync` or not) over two ps tasks, for examples of 3 features and 2 ids in 2 classes.
    fn embedding_graph_with(
        towers: usize,
        sync: Option<crate::train::job::SyncSpec>,
    ) -> TrainGraph {
        let spec = TrainSpec {
            model: crate::train::job::ModelKind::Embedding {
                rows: 10,
                dim: 4,
                hidden: vec![8],
            },
            optimizer: "adagrad".into(),
            towers,
            sync,
            ..TrainSpec::default()
        };
        let placement = Placement {
            num_ps: 2,
            job: "worker".into(),
            chief: false,
            worker_index: 1,
            num_workers: 2,
        };
        let examples = Examples {
            features: 3,
            ids: 2,
            classes: 2,
        };
        build_for(&spec, &placement, examples).unwrap()
    }

    fn embedding_graph(towers: usize) -> TrainGraph {
        embedding_graph_with(towers, None)
    }

    #[test]
    fn the_embedding_tables_are_split_over_the_ps_tasks_read_and_updated_row_by_row_there() {
        for towers in [1, 2] {
            let built = embedding_graph(towers);
            let node = |name: &str| node_named(&built, name);
            let parts = [
                "embedding/part_0",
                "embedding/part_1",
                "wide/part_0",
                "wide/part_1",
            ];
            let devices: BTreeSet<&str> = parts.iter().map(|p| node(p).device.as_str()).collect();
            assert_eq!(
                devices,
                ["/job:ps/task:0", "/job:ps/task:1"].into(),
                "each table has a part on each ps task"
            );
            for part in parts {
                let on = |op: &str| {
                    built
                        .graph
                        .node
                        .iter()
                        .filter(|n| n.op == op && n.input.first().map(String::as_str) == Some(part))
                        .map(|n| n.device.clone())
                        .collect::<Vec<_>>()
                };
                // Gathered where it lives (once for the evaluation's logits, once per
                // tower), updated there by Adagrad's sparse apply, never densely.
                let gathers = on("ResourceGather");
                assert_eq!(
                    gathers.len(),
                    1 + usize::from(towers > 1) * towers,
                    "{part}"
                );
                assert!(
                    gathers.iter().all(|d| *d == node(part).device),
                    "{part}: {gathers:?}"
                );
                assert_eq!(
                    on("ResourceSparseApplyAdagrad"),
                    vec![node(part).device.clone()]
                );
                assert!(
                    on("ResourceApplyAdagrad").is_empty(),
                    "{part} updated densely"
                );
            }
            // The histograms leave the tables out: a read would move them whole.
            assert!(
                built.trainable.iter().all(|(n, _)| n.starts_with("layer")),
                "{:?}",
                built.trainable
            );
        }
    }

    #[test]
    fn synchronous_replicas_meet_on_a_tables_rows_in_sparse_accumulators() {
        let sync = crate::train::job::SyncSpec {
            replicas_to_aggregate: 2,
            total_num_replicas: 2,
        };
        let built = embedding_graph_with(1, Some(sync));
        let count = |op: &str| built.graph.node.iter().filter(|n| n.op == op).count();
        // One sparse accumulator per table part (2 tables x 2 parts), a dense one for each of
        // the two dense layers' weight and bias.
        assert_eq!(count("SparseConditionalAccumulator"), 4);
        assert_eq!(count("ResourceConditionalAccumulator"), 4);
        assert_eq!(count("ResourceSparseApplyAdagrad"), 4);
        assert_eq!(count("ResourceApplyAdagrad"), 4);
    }

    #[test]
    fn the_embedding_tables_are_saved_as_slices_of_the_whole_table() {
        let built = embedding_graph(1);
        let specs: Vec<String> = built
            .graph
            .node
            .iter()
            .filter(|n| n.name.starts_with("save/SaveV2") && n.name.contains("shape_and_slices"))
            .flat_map(|n| {
                let proto = crate::graph::attr::tensor(n, "value").expect("a constant");
                let tensor = Tensor::from_proto(proto).unwrap();
                let specs: Vec<String> = tensor
                    .strings()
                    .unwrap()
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect();
                specs
            })
            .collect();
        // Rows 0..5 and 5..10 of each 10-row table, under the table's own name.
        for want in [
            "10 4 0,5:0,4",
            "10 4 5,5:0,4",
            "10 2 0,5:0,2",
            "10 2 5,5:0,2",
        ] {
            assert!(specs.iter().any(|s| s == want), "{want} not in {specs:?}");
        }
    }
}
