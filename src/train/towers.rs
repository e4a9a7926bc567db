//! In-graph replication over the devices of one task: TensorFlow's multi-tower pattern
//! (`cifar10_multi_gpu_train`).
//!
//! [`build_towers`] clones a model function over N local devices (`/device:GPU:0..N-1`, or
//! `/device:CPU:0..N-1` on a host without GPUs):
//!
//! ```text
//!              ┌─ tower_0 (device 0): model(x_0) → loss_0 → gradients_0 ─┐
//!  batch ─split┤                   ...                                     ├─ average (CPU) ─ apply once
//!   (CPU)      └─ tower_N-1 (device N-1): model(x_N-1) → ... gradients ───┘
//! ```
//!
//! Each input is split along dimension 0 into N equal, contiguous parts on the averaging device
//! (`Reshape` to `[N, batch/N, ...]` then `Unpack`, TensorFlow's `tf.split(x, N)`); a batch that
//! N does not divide fails the step with the reshape's INVALID_ARGUMENT. The towers share the
//! variables: the model reads them (`ReadVariableOp`, placed with the variable by the resource
//! edge) and each tower's forward and backward ops run on its own device. The gradients are
//! averaged on the averaging device (`AddN` times `1/N`), and one `Optimizer::apply_gradients`
//! updates the variables. With tower losses that are batch means, the averaged gradient is the
//! gradient of the whole batch's mean loss, so N towers train like one device with the whole
//! batch (up to float rounding of the different summation order).
//!
//! With [`GradientSum::AllReduce`] the towers sum each gradient among themselves instead
//! (`NcclAllReduce`, one node per tower on its device: NCCL between GPUs, host memory
//! otherwise) and tower 0's sum is averaged and applied, so the gradients do not all travel to
//! the averaging device.
//!
//! `tessera train --towers N` calls [`build_towers`] (asynchronous training) or
//! [`average_towers`] (synchronous: the averaged gradients go to `SyncReplicasOptimizer`) with
//! [`local_devices`]`("CPU" or "GPU", N)` (`--tower_device`) in place of
//! `Optimizer::minimize` on its model, summing with [`GradientSum::AllReduce`] under
//! `--all_reduce`.

use crate::error::{Result, Status};
use crate::graph::indexed_slices::{GradientTensor, IndexedSlices};
use crate::graph::{Graph, Output, Variable};
use crate::tensor::PartialShape;
use crate::train::optimizer::Optimizer;

/// The name scope of tower `i`'s nodes: `tower_0`, `tower_1`, ... as TensorFlow names them.
pub fn tower_scope(i: usize) -> String {
    format!("tower_{i}")
}

/// `n` devices of type `device_type` (`"CPU"` or `"GPU"`): `/device:TYPE:0..n-1`.
pub fn local_devices(device_type: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("/device:{device_type}:{i}"))
        .collect()
}

/// The devices `--towers N` uses: `/device:CPU:0..N-1` (a GPU host would pass its GPUs to
/// [`local_devices`] instead).
pub fn tower_devices(n: usize) -> Vec<String> {
    local_devices("CPU", n)
}

/// Where the towers go and how they are joined.
#[derive(Clone, Debug)]
pub struct TowerOptions {
    /// One device per tower (partial names such as `/device:CPU:1` are merged with the graph's
    /// device scopes); at least one.
    pub devices: Vec<String>,
    /// Where the batch is split and the gradients and losses are averaged:
    /// `/device:CPU:0` by default, as TensorFlow keeps them on the host.
    pub average_device: String,
    /// How the towers' gradients are summed before they are averaged.
    pub gradient_sum: GradientSum,
}

/// How [`average_towers`] sums the towers' gradients of a variable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GradientSum {
    /// `AddN` of every tower's gradient on the averaging device (the default): each gradient
    /// travels to the averaging device.
    #[default]
    AddN,
    /// `NcclAllReduce` among the tower devices: each tower's node sums with the others where
    /// they are (through NCCL when the towers are GPUs, see `kernels/cuda/nccl.rs`; in host
    /// memory otherwise), and tower 0's sum is averaged and applied. The other towers' sums
    /// are control inputs of the average, so every member runs in each step.
    AllReduce,
}

impl TowerOptions {
    /// Towers on `devices`, averaged on `/device:CPU:0`.
    pub fn new(devices: Vec<String>) -> Self {
        Self {
            devices,
            average_device: "/device:CPU:0".into(),
            gradient_sum: GradientSum::AddN,
        }
    }
}

/// What [`build_towers`] added.
#[derive(Clone, Debug)]
pub struct Towers {
    /// Each tower's loss, on its device.
    pub tower_losses: Vec<Output>,
    /// The mean of the tower losses, on the averaging device: the whole batch's loss.
    pub loss: Output,
    /// The averaged gradient of each variable (`None` where no tower's loss depends on it).
    pub grads_and_vars: Vec<(Option<GradientTensor>, Variable)>,
    /// The optimizer's train op: run it once per step.
    pub train_op: String,
}

/// Clones `model` over `options.devices`, feeding tower `i` the `i`-th part of each of
/// `inputs` (split along dimension 0), averages the gradients of `var_list` on the averaging
/// device and applies them once with `optimizer` (incrementing `global_step` if given).
///
/// `model` is called once per tower, inside the tower's name scope (`tower_i/`) and device
/// scope, with that tower's parts of `inputs`; it returns the tower's scalar loss (a mean over
/// its examples). It must not create variables: create them before and read them in `model`.
///
/// Errors: INVALID_ARGUMENT for no devices, an input whose dimensions past the first are not
/// statically known, or a variable some towers have a gradient for and others not; whatever
/// `model`, the gradients or the optimizer return.
pub fn build_towers(
    g: &mut Graph,
    inputs: &[Output],
    var_list: &[Variable],
    optimizer: &Optimizer,
    global_step: Option<&Variable>,
    options: &TowerOptions,
    model: impl FnMut(&mut Graph, &[Output]) -> Result<Output>,
) -> Result<Towers> {
    let averaged = average_towers(g, inputs, var_list, optimizer, options, model)?;
    let train_op = optimizer.apply_gradient_tensors(g, &averaged.grads_and_vars, global_step)?;
    Ok(Towers {
        tower_losses: averaged.tower_losses,
        loss: averaged.loss,
        grads_and_vars: averaged.grads_and_vars,
        train_op,
    })
}

/// What [`average_towers`] added: the towers and their averaged gradients, not yet applied.
#[derive(Clone, Debug)]
pub struct AveragedTowers {
    /// Each tower's loss, on its device.
    pub tower_losses: Vec<Output>,
    /// The mean of the tower losses, on the averaging device: the whole batch's loss.
    pub loss: Output,
    /// The averaged gradient of each variable (`None` where no tower's loss depends on it):
    /// sparse where every tower's is.
    pub grads_and_vars: Vec<(Option<GradientTensor>, Variable)>,
}

/// [`build_towers`] without the update: the towers, their losses and the averaged gradients,
/// for a caller that applies them itself (synchronous replication hands them to
/// `SyncReplicasOptimizer`). `optimizer` only computes the gradients.
pub fn average_towers(
    g: &mut Graph,
    inputs: &[Output],
    var_list: &[Variable],
    optimizer: &Optimizer,
    options: &TowerOptions,
    mut model: impl FnMut(&mut Graph, &[Output]) -> Result<Output>,
) -> Result<AveragedTowers> {
    let n = options.devices.len();
    if n == 0 {
        return Err(Status::invalid_argument(
            "build_towers needs at least one tower device; pass e.g. tower_devices(2)",
        ));
    }
    let parts = g.with_device(&options.average_device, |g| {
        g.with_name_scope("split_batch", |g| {
            inputs
                .iter()
                .map(|x| split_batch(g, x, n))
                .collect::<Result<Vec<_>>>()
        })
    })?;

    let mut tower_losses = Vec::with_capacity(n);
    let mut tower_grads = Vec::with_capacity(n);
    for (i, device) in options.devices.iter().enumerate() {
        let tower_inputs: Vec<Output> = parts.iter().map(|p| p[i].clone()).collect();
        let (loss, grads) = g.with_device(device, |g| {
            g.with_name_scope(&tower_scope(i), |g| {
                let loss = model(g, &tower_inputs)?;
                let grads = optimizer.compute_sparse_gradients(g, &loss, var_list)?;
                Ok((loss, grads))
            })
        })?;
        tower_losses.push(loss);
        tower_grads.push(grads);
    }

    // With GradientSum::AllReduce, each variable's gradients are first summed among the tower
    // devices: `summed[j]` is tower 0's sum and the other towers' sum nodes.
    let mut summed: Vec<Option<(Output, Vec<String>)>> = vec![None; var_list.len()];
    if options.gradient_sum == GradientSum::AllReduce && n > 1 {
        for (j, var) in var_list.iter().enumerate() {
            let Some(grads) = tower_gradients(&tower_grads, j, var, n)? else {
                continue;
            };
            // NCCL sums dense tensors: a sparse gradient is made dense on its tower first.
            let grads = grads
                .iter()
                .zip(&options.devices)
                .map(|(grad, device)| g.with_device(device, |g| grad.to_dense(g)))
                .collect::<Result<Vec<_>>>()?;
            let shared_name = format!("all_reduce/{}", var.handle.node);
            let mut sums = Vec::with_capacity(n);
            for (i, (device, grad)) in options.devices.iter().zip(&grads).enumerate() {
                sums.push(g.with_device(device, |g| {
                    g.with_name_scope(&format!("{}/all_reduce", tower_scope(i)), |g| {
                        g.nccl_all_reduce(grad, "sum", n, &shared_name)
                    })
                })?);
            }
            let others = sums[1..].iter().map(|s| s.node.clone()).collect();
            summed[j] = Some((sums.swap_remove(0), others));
        }
    }

    let (loss, grads_and_vars) = g.with_device(&options.average_device, |g| {
        g.with_name_scope("average_gradients", |g| {
            let loss = mean_of(g, &tower_losses)?;
            let mut averaged = Vec::with_capacity(var_list.len());
            for (j, var) in var_list.iter().enumerate() {
                let mean = match summed[j].take() {
                    Some((sum, others)) => {
                        let others: Vec<&str> = others.iter().map(String::as_str).collect();
                        Some(GradientTensor::Dense(g.with_control_dependencies(
                            &others,
                            |g| {
                                let scale = g.scalar("scale", sum.dtype, 1.0 / n as f64)?;
                                g.mul(&sum, &scale)
                            },
                        )?))
                    }
                    None => match tower_gradients(&tower_grads, j, var, n)? {
                        Some(grads) => Some(mean_of_gradients(g, &grads)?),
                        None => None,
                    },
                };
                averaged.push((mean, var.clone()));
            }
            Ok((loss, averaged))
        })
    })?;
    Ok(AveragedTowers {
        tower_losses,
        loss,
        grads_and_vars,
    })
}

/// Every tower's gradient of variable `j` (`var`), `None` when no tower's loss depends on it,
/// INVALID_ARGUMENT when only some do.
fn tower_gradients(
    tower_grads: &[Vec<(Option<GradientTensor>, Variable)>],
    j: usize,
    var: &Variable,
    n: usize,
) -> Result<Option<Vec<GradientTensor>>> {
    let present: Vec<GradientTensor> = tower_grads.iter().filter_map(|t| t[j].0.clone()).collect();
    match present.len() {
        0 => Ok(None),
        k if k == n => Ok(Some(present)),
        k => Err(Status::invalid_argument(format!(
            "variable `{}` has a gradient in {k} of {n} towers; every tower must compute the \
             same model",
            var.handle.node
        ))),
    }
}

/// Splits `x` into `n` equal, contiguous parts along dimension 0: `Reshape` to
/// `[n, -1, d1, ...]`, then `Unpack` along 0 (each part is `[batch/n, d1, ...]`).
fn split_batch(g: &mut Graph, x: &Output, n: usize) -> Result<Vec<Output>> {
    if n == 1 {
        return Ok(vec![x.clone()]);
    }
    let rest = x
        .shape
        .dims()
        .and_then(|dims| dims.get(1..).map(<[Option<usize>]>::to_vec))
        .and_then(|rest| rest.into_iter().collect::<Option<Vec<usize>>>())
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "cannot split `{}` (shape {}) over {n} towers: its rank and every dimension but \
                 the first must be known; give the placeholder a shape such as [None, 784]",
                x.name(),
                x.shape
            ))
        })?;
    let mut dims = vec![n as i64, -1];
    dims.extend(rest.iter().map(|&d| d as i64));
    let stacked = g.reshape_to(x, &dims)?;
    let parts = g.unpack(&stacked, n, 0)?;
    // `Unpack` knows only that each part has the rest of the dims; say so for shape checks.
    let mut part_dims = vec![None];
    part_dims.extend(rest.iter().map(|&d| Some(d)));
    Ok(parts
        .into_iter()
        .map(|mut p| {
            if p.shape.rank().is_none() {
                p.shape = PartialShape::new(part_dims.clone());
            }
            p
        })
        .collect())
}

/// The mean of the towers' gradients of one variable: when every one is sparse, their rows
/// and indices concatenated, the rows times `1 / len` (rows named by several towers add up
/// where the optimizer applies them); otherwise the mean of the dense gradients.
fn mean_of_gradients(g: &mut Graph, grads: &[GradientTensor]) -> Result<GradientTensor> {
    let slices: Vec<&IndexedSlices> = grads
        .iter()
        .filter_map(|grad| match grad {
            GradientTensor::Slices(s) => Some(s),
            GradientTensor::Dense(_) => None,
        })
        .collect();
    if slices.len() < grads.len() {
        let dense = grads
            .iter()
            .map(|grad| grad.to_dense(g))
            .collect::<Result<Vec<_>>>()?;
        return Ok(GradientTensor::Dense(mean_of(g, &dense)?));
    }
    let [first, ..] = slices[..] else {
        return Err(Status::internal("mean of no gradients"));
    };
    if slices.len() == 1 {
        return Ok(grads[0].clone());
    }
    let values: Vec<Output> = slices.iter().map(|s| s.values.clone()).collect();
    let indices: Vec<Output> = slices.iter().map(|s| s.indices.clone()).collect();
    let values = g.concat(&values, 0)?;
    let scale = g.scalar("scale", values.dtype, 1.0 / slices.len() as f64)?;
    Ok(GradientTensor::Slices(IndexedSlices {
        values: g.mul(&values, &scale)?,
        indices: g.concat(&indices, 0)?,
        dense_shape: first.dense_shape.clone(),
    }))
}

/// The mean of same-shaped tensors: `AddN(xs) * (1 / len)` (or the tensor itself).
fn mean_of(g: &mut Graph, xs: &[Output]) -> Result<Output> {
    match xs {
        [] => Err(Status::internal("mean of no tensors")),
        [x] => Ok(x.clone()),
        _ => {
            let sum = g.add_n(xs)?;
            let scale = g.scalar("scale", sum.dtype, 1.0 / xs.len() as f64)?;
            g.mul(&sum, &scale)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn devices_are_numbered_from_zero() {
        assert_eq!(
            tower_devices(2),
            ["/device:CPU:0".to_string(), "/device:CPU:1".to_string()]
        );
        assert_eq!(local_devices("GPU", 1), ["/device:GPU:0".to_string()]);
    }

    #[test]
    fn an_input_with_unknown_feature_dims_cannot_be_split() {
        let mut g = Graph::new();
        let x = g
            .placeholder("x", DType::Float, PartialShape::new(vec![None, None]))
            .unwrap();
        let err = split_batch(&mut g, &x, 2).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("`x:0`"), "{err}");
    }

    #[test]
    fn no_devices_is_invalid_argument() {
        let mut g = Graph::new();
        let err = build_towers(
            &mut g,
            &[],
            &[],
            &Optimizer::gradient_descent(0.1),
            None,
            &TowerOptions::new(Vec::new()),
            |_, _| unreachable!(),
        )
        .unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
    }
}
