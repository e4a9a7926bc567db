//! Optimizers as graph ops, built the way TensorFlow 1's `tf.compat.v1.train.*Optimizer`
//! builds them, so a tessera graph trains like (and looks like) a TensorFlow one.
//!
//! [`Optimizer::minimize`] is [`compute_gradients`](Optimizer::compute_gradients) (the graph's
//! [`gradients`]) followed by [`apply_gradients`](Optimizer::apply_gradients), which adds, for
//! optimizer `Adagrad`:
//!
//! ```text
//! w1/Adagrad (+ /Initializer, /Assign, /Read)     slot variables, colocated with w1 (slots.rs)
//! Adagrad/learning_rate                            hyper-parameters, Consts in the var's dtype
//! Adagrad/update_w1/ResourceApplyAdagrad           one update per variable, colocated with it
//! Adagrad/update (/NoOp, /NoOp_1: one per device)  the updates, grouped by device
//! Adagrad/Const, Adagrad (AssignAddVariableOp)     global_step += 1 after the updates
//! ```
//!
//! The train op is the node named after the optimizer: the global-step increment, or, without
//! a global step, the group of updates. Updates run on the variable's device (its ps task) and
//! only the gradients travel. Adam adds `beta1_power` / `beta2_power` colocated with the first
//! variable by name, multiplied by `beta1` / `beta2` after every step, as TensorFlow 1 does.
//!
//! Reference variables ([`VariableKind::Reference`], TensorFlow 1's `VariableV2`) get
//! reference slots and `Apply*` updates (`Adagrad/update_w1/ApplyAdagrad`), Adam's powers are
//! advanced with `Assign` and the global step with `AssignAdd`, as TensorFlow 1 builds them.
//!
//! An optimizer holds no graph state: each `apply_gradients` creates fresh slots.

pub mod slots;

use std::collections::{BTreeMap, HashMap};

use crate::error::{Result, Status};
use crate::graph::attr::value;
use crate::graph::{
    gradients_with, sparse_gradients, GradientOptions, GradientTensor, Graph, IndexedSlices,
    NodeSpec, Output, Variable, VariableKind,
};
use crate::tensor::DType;

pub use slots::{
    create_slot, get_or_create_global_step, global_step, trainable_variables, variable_from_handle,
    SlotInit, GLOBAL_STEP,
};

/// The learning rate: a number (a `Const` `<opt>/learning_rate` in the graph) or a tensor of
/// the graph (a decayed rate, a placeholder), cast to each variable's dtype if needed.
#[derive(Clone, Debug)]
pub enum LearningRate {
    /// A fixed rate.
    Value(f64),
    /// A scalar tensor computed in the graph.
    Tensor(Output),
}

impl From<f64> for LearningRate {
    fn from(v: f64) -> Self {
        LearningRate::Value(v)
    }
}

impl From<f32> for LearningRate {
    fn from(v: f32) -> Self {
        LearningRate::Value(v as f64)
    }
}

impl From<Output> for LearningRate {
    fn from(t: Output) -> Self {
        LearningRate::Tensor(t)
    }
}

impl From<&Output> for LearningRate {
    fn from(t: &Output) -> Self {
        LearningRate::Tensor(t.clone())
    }
}

/// The update rule and its hyper-parameters (TensorFlow 1's defaults in the constructors).
#[derive(Clone, Debug, PartialEq)]
pub enum Algorithm {
    /// `var -= lr * grad`.
    GradientDescent,
    /// Slot `Momentum`: `accum = momentum * accum + grad; var -= lr * accum` (or Nesterov's).
    Momentum {
        /// The momentum (0.9 is usual).
        momentum: f64,
        /// Whether to use Nesterov momentum.
        use_nesterov: bool,
    },
    /// Slot `Adagrad` (starting at `initial_accumulator_value`): `accum += grad^2; var -= lr *
    /// grad / sqrt(accum)`.
    Adagrad {
        /// The accumulator's starting value (0.1).
        initial_accumulator_value: f64,
    },
    /// Slots `Adam` (m) and `Adam_1` (v), and `beta1_power` / `beta2_power`.
    Adam {
        /// Decay of the first moment (0.9).
        beta1: f64,
        /// Decay of the second moment (0.999).
        beta2: f64,
        /// Added to the denominator (1e-8).
        epsilon: f64,
    },
    /// Slots `RMSProp` (mean square, starting at 1) and `RMSProp_1` (momentum), with
    /// `centered` `RMSProp_1` (mean gradient) and `RMSProp_2` (momentum).
    RmsProp {
        /// Decay of the mean square (0.9).
        decay: f64,
        /// The momentum (0.0).
        momentum: f64,
        /// Added inside the square root (1e-10).
        epsilon: f64,
        /// Whether to divide by the estimated variance rather than the mean square.
        centered: bool,
    },
}

impl Algorithm {
    /// TensorFlow's name for the optimizer, which names its scope and slots.
    pub fn default_name(&self) -> &'static str {
        match self {
            Algorithm::GradientDescent => "GradientDescent",
            Algorithm::Momentum { .. } => "Momentum",
            Algorithm::Adagrad { .. } => "Adagrad",
            Algorithm::Adam { .. } => "Adam",
            Algorithm::RmsProp { .. } => "RMSProp",
        }
    }
}

/// The optimizer names [`Optimizer::from_name`] accepts.
pub const OPTIMIZER_NAMES: [&str; 5] = ["sgd", "momentum", "adagrad", "adam", "rmsprop"];

/// An optimizer: an [`Algorithm`], a learning rate, a name and `use_locking`.
#[derive(Clone, Debug)]
pub struct Optimizer {
    algorithm: Algorithm,
    learning_rate: LearningRate,
    name: String,
    use_locking: bool,
    gate_gradients: Option<bool>,
}

impl Optimizer {
    /// An optimizer running `algorithm` at `learning_rate`, named as TensorFlow names it.
    pub fn new(algorithm: Algorithm, learning_rate: impl Into<LearningRate>) -> Self {
        Self {
            name: algorithm.default_name().to_string(),
            algorithm,
            learning_rate: learning_rate.into(),
            use_locking: false,
            gate_gradients: None,
        }
    }

    /// `tf.compat.v1.train.GradientDescentOptimizer(learning_rate)`.
    pub fn gradient_descent(learning_rate: impl Into<LearningRate>) -> Self {
        Self::new(Algorithm::GradientDescent, learning_rate)
    }

    /// `tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum, use_nesterov)`.
    pub fn momentum(learning_rate: impl Into<LearningRate>, momentum: f64, nesterov: bool) -> Self {
        Self::new(
            Algorithm::Momentum {
                momentum,
                use_nesterov: nesterov,
            },
            learning_rate,
        )
    }

    /// `tf.compat.v1.train.AdagradOptimizer(learning_rate)` (accumulators start at 0.1).
    pub fn adagrad(learning_rate: impl Into<LearningRate>) -> Self {
        Self::new(
            Algorithm::Adagrad {
                initial_accumulator_value: 0.1,
            },
            learning_rate,
        )
    }

    /// `tf.compat.v1.train.AdamOptimizer(learning_rate)` (beta1 0.9, beta2 0.999, epsilon 1e-8).
    pub fn adam(learning_rate: impl Into<LearningRate>) -> Self {
        Self::new(
            Algorithm::Adam {
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            learning_rate,
        )
    }

    /// `tf.compat.v1.train.RMSPropOptimizer(learning_rate)` (decay 0.9, momentum 0, epsilon
    /// 1e-10, not centered).
    pub fn rms_prop(learning_rate: impl Into<LearningRate>) -> Self {
        Self::new(
            Algorithm::RmsProp {
                decay: 0.9,
                momentum: 0.0,
                epsilon: 1e-10,
                centered: false,
            },
            learning_rate,
        )
    }

    /// The optimizer called `name` (one of [`OPTIMIZER_NAMES`], case-insensitive, or
    /// TensorFlow's class name) with its defaults; momentum is 0.9. An unknown name is
    /// INVALID_ARGUMENT listing the known ones.
    pub fn from_name(name: &str, learning_rate: f64) -> Result<Self> {
        let opt = match name.to_ascii_lowercase().as_str() {
            "sgd" | "gradientdescent" | "gradient_descent" => Self::gradient_descent(learning_rate),
            "momentum" => Self::momentum(learning_rate, 0.9, false),
            "nesterov" => Self::momentum(learning_rate, 0.9, true),
            "adagrad" => Self::adagrad(learning_rate),
            "adam" => Self::adam(learning_rate),
            "rmsprop" => Self::rms_prop(learning_rate),
            _ => {
                return Err(Status::invalid_argument(format!(
                    "unknown optimizer `{name}`; choose one of {}",
                    OPTIMIZER_NAMES.join(", ")
                )))
            }
        };
        Ok(opt)
    }

    /// Renames the optimizer (its scope and slot names).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Sets `use_locking` on the update ops.
    pub fn use_locking(mut self, use_locking: bool) -> Self {
        self.use_locking = use_locking;
        self
    }

    /// Gates the gradients (`GradientOptions::gate_gradients`, TensorFlow 1's `GATE_OP`) or
    /// not; by default they are gated when a variable is a reference variable.
    pub fn gate_gradients(mut self, gate: bool) -> Self {
        self.gate_gradients = Some(gate);
        self
    }

    /// The optimizer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The gradient of `loss` with respect to each of `var_list` (`None` where the loss does
    /// not depend on the variable), added under the graph's `gradients` scope.
    pub fn compute_gradients(
        &self,
        g: &mut Graph,
        loss: &Output,
        var_list: &[Variable],
    ) -> Result<Vec<(Option<Output>, Variable)>> {
        if !loss.dtype.is_float() {
            return Err(Status::invalid_argument(format!(
                "loss `{}` is {}; only a floating-point loss can be minimized",
                loss.name(),
                loss.dtype
            )));
        }
        let handles: Vec<Output> = var_list.iter().map(|v| v.handle.clone()).collect();
        // A reference variable's reads alias it, so an update must not run before every
        // gradient computed from a read of it: TensorFlow 1's GATE_OP, which waits for all
        // the input gradients of an op before any is used. Resource reads are snapshots.
        let gate = self
            .gate_gradients
            .unwrap_or_else(|| var_list.iter().any(|v| v.kind() == VariableKind::Reference));
        let options = GradientOptions {
            gate_gradients: gate,
        };
        let grads = gradients_with(g, std::slice::from_ref(loss), &handles, None, &options)?;
        Ok(grads.into_iter().zip(var_list.iter().cloned()).collect())
    }

    /// [`compute_gradients`](Self::compute_gradients), with the gradient of a variable that
    /// the loss reads only through row gathers (an embedding table: `ResourceGather`, or
    /// `GatherV2` on axis 0 of its read) as the rows it read ([`IndexedSlices`]), so that
    /// [`apply_gradient_tensors`](Self::apply_gradient_tensors) updates only those rows.
    /// Reference variables get dense gradients, gated as `compute_gradients` gates them.
    pub fn compute_sparse_gradients(
        &self,
        g: &mut Graph,
        loss: &Output,
        var_list: &[Variable],
    ) -> Result<Vec<(Option<GradientTensor>, Variable)>> {
        if self.needs_gating(var_list) {
            let dense = self.compute_gradients(g, loss, var_list)?;
            return Ok(dense
                .into_iter()
                .map(|(grad, var)| (grad.map(GradientTensor::Dense), var))
                .collect());
        }
        if !loss.dtype.is_float() {
            return Err(Status::invalid_argument(format!(
                "loss `{}` is {}; only a floating-point loss can be minimized",
                loss.name(),
                loss.dtype
            )));
        }
        let handles: Vec<Output> = var_list.iter().map(|v| v.handle.clone()).collect();
        let grads = sparse_gradients(g, std::slice::from_ref(loss), &handles, None)?;
        Ok(grads.into_iter().zip(var_list.iter().cloned()).collect())
    }

    /// Whether the updates must wait for every gradient (TensorFlow 1's GATE_OP): asked for,
    /// or by default when a reference variable is trained, as its reads alias it.
    fn needs_gating(&self, var_list: &[Variable]) -> bool {
        self.gate_gradients
            .unwrap_or_else(|| var_list.iter().any(|v| v.kind() == VariableKind::Reference))
    }

    /// Adds the updates of `grads_and_vars` (pairs without a gradient are skipped) and, with
    /// `global_step`, its increment after them; returns the train op's name (the optimizer's
    /// name, made unique).
    pub fn apply_gradients(
        &self,
        g: &mut Graph,
        grads_and_vars: &[(Option<Output>, Variable)],
        global_step: Option<&Variable>,
    ) -> Result<String> {
        let tensors: Vec<(Option<GradientTensor>, Variable)> = grads_and_vars
            .iter()
            .map(|(grad, var)| (grad.clone().map(GradientTensor::Dense), var.clone()))
            .collect();
        self.apply_gradient_tensors(g, &tensors, global_step)
    }

    /// [`apply_gradients`](Self::apply_gradients) for dense and sparse gradients. A sparse
    /// gradient updates only the rows it names, as TensorFlow's `_apply_sparse` does: gradient
    /// descent scatters `-lr * values` into the variable (`ResourceScatterAdd`, `ScatterSub`);
    /// Momentum, Adagrad and RMSProp apply their rule to the rows, a repeated row's values
    /// summed first (`ResourceSparseApply*`, `SparseApply*`). Adam decays both moments of
    /// every row at each step whatever the gradient, so its sparse update is its dense one on
    /// the gradient made dense, as in TensorFlow.
    pub fn apply_gradient_tensors(
        &self,
        g: &mut Graph,
        grads_and_vars: &[(Option<GradientTensor>, Variable)],
        global_step: Option<&Variable>,
    ) -> Result<String> {
        let mut pairs: Vec<(GradientTensor, Variable)> = Vec::new();
        for (grad, var) in grads_and_vars {
            let Some(grad) = grad else { continue };
            let grad = match (grad, &self.algorithm) {
                (GradientTensor::Slices(slices), Algorithm::Adam { .. }) => {
                    GradientTensor::Dense(slices.to_dense(g)?)
                }
                _ => grad.clone(),
            };
            pairs.push((grad, var.clone()));
        }
        if pairs.is_empty() {
            let names: Vec<&str> = grads_and_vars
                .iter()
                .map(|(_, v)| v.handle.node.as_str())
                .collect();
            return Err(Status::invalid_argument(format!(
                "No gradients provided for any variable: check that the loss depends on the \
                 variables [{}] through ops that have gradients",
                names.join(", ")
            )));
        }
        let mut plans = Vec::with_capacity(pairs.len());
        for (grad, var) in &pairs {
            let (dtype, shape) = slots::var_dtype_shape(g, var)?;
            let (grad_out, shape) = match grad {
                GradientTensor::Dense(t) => (t, crate::tensor::PartialShape::from(&shape)),
                // The rows' values: the variable's shape past its first dimension.
                GradientTensor::Slices(s) => (&s.values, slices_shape(&shape)),
            };
            if grad_out.dtype != dtype {
                return Err(Status::invalid_argument(format!(
                    "gradient `{}` is {} but variable `{}` is {dtype}",
                    grad_out.name(),
                    grad_out.dtype,
                    var.handle.node
                )));
            }
            if !grad_out.shape.is_compatible_with_partial(&shape) {
                return Err(Status::invalid_argument(format!(
                    "gradient `{}` has shape {} but variable `{}` takes {shape}",
                    grad_out.name(),
                    grad_out.shape,
                    var.handle.node
                )));
            }
            plans.push((grad.clone(), var.clone(), dtype));
        }
        // Slots first, at the top of the name space, as TensorFlow's init_scope does.
        let mut slot_vars = Vec::with_capacity(plans.len());
        for (_, var, _) in &plans {
            slot_vars.push(self.create_slots(g, var)?);
        }
        let powers = match &self.algorithm {
            Algorithm::Adam { beta1, beta2, .. } => {
                let first = plans
                    .iter()
                    .map(|(_, v, _)| v)
                    .min_by(|a, b| a.handle.node.cmp(&b.handle.node))
                    .ok_or_else(|| Status::internal("no variables"))?;
                let dtype = plans[0].2;
                Some((
                    slots::create_non_slot(g, "beta1_power", dtype, *beta1, first)?,
                    slots::create_non_slot(g, "beta2_power", dtype, *beta2, first)?,
                ))
            }
            _ => None,
        };
        let scope = g.with_name_scope("", |g| g.unique_name(&self.name));
        g.with_name_scope(&format!("{scope}/"), |g| {
            let mut params = Params::default();
            let power_reads = match &powers {
                Some((b1, b2)) => Some((g.read(b1)?, g.read(b2)?)),
                None => None,
            };
            let mut updates = Vec::with_capacity(plans.len());
            for ((grad, var, dtype), slot_vars) in plans.iter().zip(&slot_vars) {
                let inputs = self.update_inputs(g, &mut params, *dtype, &power_reads)?;
                let update = g.with_name_scope(&format!("update_{}", var.handle.node), |g| {
                    g.with_colocation(&var.handle.node, |g| {
                        self.update_op(g, var, slot_vars, &inputs, grad)
                    })
                })?;
                updates.push(update);
            }
            if let Some((b1, b2)) = &powers {
                let finish = self.advance_powers(g, &mut params, &updates, b1, b2, plans[0].2)?;
                updates.extend(finish);
            }
            match global_step {
                None => group_by_device(g, &scope, &updates),
                Some(step) => {
                    let update = g.unique_name("update");
                    let update = group_by_device(g, &update, &updates)?;
                    g.with_control_dependencies(&[update.as_str()], |g| {
                        g.with_colocation(&step.handle.node, |g| {
                            let one = g.add1(
                                NodeSpec::new("Const")
                                    .attr("dtype", value::dtype(DType::Int64))
                                    .attr(
                                        "value",
                                        value::tensor(
                                            crate::tensor::Tensor::scalar(1i64).to_proto(),
                                        ),
                                    ),
                            )?;
                            let op = match step.kind() {
                                VariableKind::Resource => "AssignAddVariableOp",
                                VariableKind::Reference => "AssignAdd",
                            };
                            g.add_op(
                                NodeSpec::new(op)
                                    .name(&format!("{scope}/"))
                                    .input(&step.handle)
                                    .input(&one),
                            )
                        })
                    })
                }
            }
        })
    }

    /// `compute_gradients` over the graph's [`trainable_variables`], then `apply_gradients`
    /// to those with a gradient; returns the train op's name.
    pub fn minimize(
        &self,
        g: &mut Graph,
        loss: &Output,
        global_step: Option<&Variable>,
    ) -> Result<String> {
        let vars = trainable_variables(g)?;
        self.minimize_vars(g, loss, &vars, global_step)
    }

    /// `minimize` over `var_list` only. A variable read only through row gathers gets a
    /// sparse gradient and a sparse update (see
    /// [`compute_sparse_gradients`](Self::compute_sparse_gradients)).
    pub fn minimize_vars(
        &self,
        g: &mut Graph,
        loss: &Output,
        var_list: &[Variable],
        global_step: Option<&Variable>,
    ) -> Result<String> {
        let grads = self.compute_sparse_gradients(g, loss, var_list)?;
        self.apply_gradient_tensors(g, &grads, global_step)
    }

    /// Creates the slots of `var`, in the order the update op takes them.
    fn create_slots(&self, g: &mut Graph, var: &Variable) -> Result<Vec<Variable>> {
        let name = self.name.as_str();
        match &self.algorithm {
            Algorithm::GradientDescent => Ok(Vec::new()),
            Algorithm::Momentum { .. } => Ok(vec![create_slot(g, var, name, SlotInit::Zeros)?]),
            Algorithm::Adagrad {
                initial_accumulator_value,
            } => Ok(vec![create_slot(
                g,
                var,
                name,
                SlotInit::Constant(*initial_accumulator_value),
            )?]),
            Algorithm::Adam { .. } => Ok(vec![
                create_slot(g, var, name, SlotInit::Zeros)?,
                create_slot(g, var, name, SlotInit::Zeros)?,
            ]),
            Algorithm::RmsProp { centered, .. } => {
                // TensorFlow creates rms, then mg (centered), then momentum; the update op
                // takes mg, ms, mom.
                let rms = create_slot(g, var, name, SlotInit::Ones)?;
                let mg = if *centered {
                    Some(create_slot(g, var, name, SlotInit::Zeros)?)
                } else {
                    None
                };
                let mom = create_slot(g, var, name, SlotInit::Zeros)?;
                Ok(match mg {
                    Some(mg) => vec![mg, rms, mom],
                    None => vec![rms, mom],
                })
            }
        }
    }

    /// The scalar inputs of one update, in the op's order (after the slots, before `grad`).
    fn update_inputs(
        &self,
        g: &mut Graph,
        params: &mut Params,
        dtype: DType,
        powers: &Option<(Output, Output)>,
    ) -> Result<Vec<Output>> {
        let lr = match &self.learning_rate {
            LearningRate::Value(v) => params.get(g, "learning_rate", *v, dtype)?,
            LearningRate::Tensor(t) => params.cast(g, t, dtype)?,
        };
        Ok(match &self.algorithm {
            Algorithm::GradientDescent | Algorithm::Adagrad { .. } => vec![lr],
            Algorithm::Momentum { momentum, .. } => {
                vec![lr, params.get(g, "momentum", *momentum, dtype)?]
            }
            Algorithm::Adam {
                beta1,
                beta2,
                epsilon,
            } => {
                let (b1p, b2p) = powers
                    .as_ref()
                    .ok_or_else(|| Status::internal("Adam without its power accumulators"))?;
                vec![
                    params.cast(g, b1p, dtype)?,
                    params.cast(g, b2p, dtype)?,
                    lr,
                    params.get(g, "beta1", *beta1, dtype)?,
                    params.get(g, "beta2", *beta2, dtype)?,
                    params.get(g, "epsilon", *epsilon, dtype)?,
                ]
            }
            Algorithm::RmsProp {
                decay,
                momentum,
                epsilon,
                ..
            } => vec![
                lr,
                params.get(g, "decay", *decay, dtype)?,
                params.get(g, "momentum", *momentum, dtype)?,
                params.get(g, "epsilon", *epsilon, dtype)?,
            ],
        })
    }

    /// Adds the update of one variable; returns its node name.
    fn update_op(
        &self,
        g: &mut Graph,
        var: &Variable,
        slot_vars: &[Variable],
        inputs: &[Output],
        grad: &GradientTensor,
    ) -> Result<String> {
        let slices = match grad {
            GradientTensor::Dense(grad) => {
                return self.apply_op(g, var, slot_vars, inputs, std::slice::from_ref(grad), "")
            }
            GradientTensor::Slices(slices) => slices,
        };
        if let Algorithm::GradientDescent = &self.algorithm {
            // `var[indices] -= lr * values`, repeated rows adding up.
            let step = g.mul(&slices.values, &inputs[0])?;
            return match var.kind() {
                VariableKind::Resource => {
                    let down = g.neg(&step)?;
                    g.resource_scatter("ResourceScatterAdd", &var.handle, &slices.indices, &down)
                }
                VariableKind::Reference => g.add_op(
                    NodeSpec::new("ScatterSub")
                        .input(&var.handle)
                        .input(&slices.indices)
                        .input(&step)
                        .attr("use_locking", value::bool(self.use_locking)),
                ),
            };
        }
        let IndexedSlices {
            values, indices, ..
        } = slices.deduplicated(g)?;
        self.apply_op(g, var, slot_vars, inputs, &[values, indices], "Sparse")
    }

    /// Adds `{Resource}{sparse}Apply{rule}` of one variable with `grad` (the gradient, or a
    /// sparse gradient's values and indices) in the gradient's place; returns its node name.
    fn apply_op(
        &self,
        g: &mut Graph,
        var: &Variable,
        slot_vars: &[Variable],
        inputs: &[Output],
        grad: &[Output],
        sparse: &str,
    ) -> Result<String> {
        let rule = match &self.algorithm {
            Algorithm::GradientDescent => "GradientDescent",
            Algorithm::Momentum { .. } => "Momentum",
            Algorithm::Adagrad { .. } => "Adagrad",
            Algorithm::Adam { .. } => "Adam",
            Algorithm::RmsProp {
                centered: false, ..
            } => "RMSProp",
            Algorithm::RmsProp { centered: true, .. } => "CenteredRMSProp",
        };
        // A reference variable is updated through its reference (`ApplyAdam`), a resource
        // variable through its handle (`ResourceApplyAdam`).
        let op = match var.kind() {
            VariableKind::Resource => format!("Resource{sparse}Apply{rule}"),
            VariableKind::Reference => format!("{sparse}Apply{rule}"),
        };
        let mut spec = NodeSpec::new(&op).input(&var.handle);
        for s in slot_vars {
            spec = spec.input(&s.handle);
        }
        spec = match &self.algorithm {
            // Momentum takes the gradient before the momentum.
            Algorithm::Momentum { use_nesterov, .. } => {
                spec = spec.input(&inputs[0]);
                for t in grad {
                    spec = spec.input(t);
                }
                spec.input(&inputs[1])
                    .attr("use_nesterov", value::bool(*use_nesterov))
            }
            _ => {
                for i in inputs.iter().chain(grad) {
                    spec = spec.input(i);
                }
                spec
            }
        };
        g.add_op(spec.attr("use_locking", value::bool(self.use_locking)))
    }

    /// Adam's `_finish`: after every update, `beta1_power *= beta1` and `beta2_power *=
    /// beta2`, colocated with the accumulators; returns the two assignments.
    fn advance_powers(
        &self,
        g: &mut Graph,
        params: &mut Params,
        updates: &[String],
        b1: &Variable,
        b2: &Variable,
        dtype: DType,
    ) -> Result<Vec<String>> {
        let Algorithm::Adam { beta1, beta2, .. } = &self.algorithm else {
            return Ok(Vec::new());
        };
        let beta1 = params.get(g, "beta1", *beta1, dtype)?;
        let beta2 = params.get(g, "beta2", *beta2, dtype)?;
        let deps: Vec<&str> = updates.iter().map(String::as_str).collect();
        g.with_control_dependencies(&deps, |g| {
            g.with_colocation(&b1.handle.node, |g| {
                let mut out = Vec::with_capacity(2);
                for (var, beta) in [(b1, &beta1), (b2, &beta2)] {
                    let now = g.read(var)?;
                    let next = g.mul(&now, beta)?;
                    out.push(match var.kind() {
                        VariableKind::Resource => g.assign_variable(&var.handle, &next)?,
                        VariableKind::Reference => g.add_op(
                            NodeSpec::new("Assign")
                                .input(&var.handle)
                                .input(&next)
                                .attr("use_locking", value::bool(self.use_locking)),
                        )?,
                    });
                }
                Ok(out)
            })
        })
    }
}

/// The shape of a sparse gradient's values for a variable of `shape`: any number of rows of
/// the variable's row shape.
fn slices_shape(shape: &crate::tensor::Shape) -> crate::tensor::PartialShape {
    let mut rows = vec![None];
    rows.extend(shape.dims().iter().skip(1).map(|&d| Some(d)));
    crate::tensor::PartialShape::new(rows)
}

/// The hyper-parameter constants of one `apply_gradients`, one per (name, dtype): the first
/// dtype gets `<opt>/<name>`, another a `Cast` of it (TensorFlow casts per variable too).
#[derive(Default)]
struct Params {
    consts: HashMap<String, Output>,
    casts: HashMap<(String, DType), Output>,
}

impl Params {
    fn get(&mut self, g: &mut Graph, name: &str, v: f64, dtype: DType) -> Result<Output> {
        let c = match self.consts.get(name) {
            Some(c) => c.clone(),
            None => {
                let c = g.scalar(name, dtype, v)?;
                self.consts.insert(name.to_string(), c.clone());
                c
            }
        };
        self.cast(g, &c, dtype)
    }

    fn cast(&mut self, g: &mut Graph, t: &Output, dtype: DType) -> Result<Output> {
        if t.dtype == dtype {
            return Ok(t.clone());
        }
        if !t.dtype.is_float() && !t.dtype.is_integer() {
            return Err(Status::invalid_argument(format!(
                "hyper-parameter `{}` is {}; give a number",
                t.name(),
                t.dtype
            )));
        }
        let key = (t.name(), dtype);
        if let Some(c) = self.casts.get(&key) {
            return Ok(c.clone());
        }
        let c = g.cast(t, dtype)?;
        self.casts.insert(key, c.clone());
        Ok(c)
    }
}

/// TensorFlow's `group(*deps, name=name)`: one `NoOp` named `name` (exact) when every dep is
/// on one device; otherwise a `NoOp` per device (`name/NoOp`, `name/NoOp_1`, by device name)
/// that the final `NoOp` waits for, so each task waits for its own updates locally and only
/// one control edge per task crosses the network.
pub fn group_by_device(g: &mut Graph, name: &str, deps: &[String]) -> Result<String> {
    let mut by_device: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for d in deps {
        let device = g.node(d).map(|n| n.device.clone()).unwrap_or_default();
        by_device.entry(device).or_default().push(d);
    }
    if by_device.len() <= 1 {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        return g.group(&format!("{name}/"), &deps);
    }
    let mut per_device = Vec::with_capacity(by_device.len());
    g.with_name_scope(&format!("{name}/"), |g| -> Result<()> {
        for (device, deps) in &by_device {
            let noop = if device.is_empty() {
                g.group("NoOp", deps)?
            } else {
                g.with_device(device, |g| g.group("NoOp", deps))?
            };
            per_device.push(noop);
        }
        Ok(())
    })?;
    let deps: Vec<&str> = per_device.iter().map(String::as_str).collect();
    g.group(&format!("{name}/"), &deps)
}
