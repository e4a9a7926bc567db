//! Optimizer updates (`training_ops.cc`), each in both of TensorFlow's forms: `ApplyX` on
//! reference variables (the variable and its slots are `Ref(T)` inputs; output 0 is the
//! variable's reference) and `ResourceApplyX` on resource variables (handles looked up in the
//! device's resources; no outputs). Both forms of a rule share one implementation,
//! [`Update::apply`], and differ only in where the variables come from. The rules, as
//! TensorFlow's CPU functors compute them (`lr` etc. are the scalar inputs, `g` the gradient):
//!
//! - GradientDescent: `var -= alpha * delta`.
//! - ProximalGradientDescent: `prox = var - alpha * delta`, then `var = sign(prox) *
//!   max(|prox| - alpha * l1, 0) / (1 + alpha * l2)` (just `prox / (1 + alpha * l2)` when
//!   `l1 <= 0`).
//! - Adadelta: `accum = rho * accum + (1 - rho) * g^2`, `update = sqrt(accum_update + epsilon)
//!   / sqrt(accum + epsilon) * g`, `var -= lr * update`, `accum_update = rho * accum_update +
//!   (1 - rho) * update^2`.
//! - Adagrad: `accum += g^2` (when `update_slots`), `var -= lr * g / sqrt(accum)`; AdagradV2
//!   adds `epsilon` to the denominator.
//! - AdagradDA: `gradient_accumulator += g`, `gradient_squared_accumulator += g^2`, then with
//!   `t = global_step`: `var = -sign(ga) * lr * max(|ga| - l1 * t, 0) / (l2 * t * lr +
//!   sqrt(gsa))` (without the `max` when `l1 <= 0`).
//! - ProximalAdagrad: `accum += g^2`, `lr_t = lr / sqrt(accum)`, then ProximalGradientDescent's
//!   step with `lr_t` for `alpha`.
//! - Ftrl: `new_accum = accum + g^2`, `linear += g - (new_accum^-p - accum^-p) / lr * var` (`p`
//!   is `lr_power`, `^-p` is `sqrt` when `p = -0.5`), `var = (sign(linear) * l1 - linear) /
//!   (new_accum^-p / lr + 2 * l2)` where `|linear| > l1`, else 0; `accum = new_accum`. With
//!   `multiply_linear_by_lr`, `linear` accumulates `lr` times as much and `l1`, `l2` scale by
//!   `lr` to match. FtrlV2 adds `2 * l2_shrinkage * var` to `g` in the `linear` step.
//! - Momentum: `accum = accum * momentum + g`, then `var -= lr * accum`, or with
//!   `use_nesterov` `var -= lr * g + lr * momentum * accum`.
//! - Adam: `lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)`, `m += (g - m) * (1 -
//!   beta1)`, `v += (g^2 - v) * (1 - beta2)`, `var -= lr_t * m / (sqrt(v) + epsilon)` (with
//!   `use_nesterov`, `m * beta1 + (1 - beta1) * g` replaces `m`).
//! - AdaMax: `m += (g - m) * (1 - beta1)`, `v = max(beta2 * v, |g|)`, `var -= lr / (1 -
//!   beta1_power) * m / (v + epsilon)`.
//! - RMSProp: `ms += (g^2 - ms) * (1 - rho)`, `mom = mom * momentum + lr * g / sqrt(ms +
//!   epsilon)`, `var -= mom`; CenteredRMSProp also keeps `mg += (g - mg) * (1 - rho)` and
//!   divides by `sqrt(ms - mg^2 + epsilon)`.
//! - AddSign: `m = beta * m + (1 - beta) * g`, `var -= lr * (alpha + sign_decay * sign(g) *
//!   sign(m)) * g`; PowerSign scales `g` by `exp(logbase * sign_decay * sign(g) * sign(m))`.
//!
//! [`Update::step`] is the whole of a rule's arithmetic, on slices of equal length: the dense
//! kernels call it once on the whole variable, the sparse ones (`sparse_training.rs`) once per
//! row an index names, so the dense and sparse forms of a rule compute with one formula.
//!
//! `use_locking` is honoured as [`read_modify_write`] describes: `true` holds the variables'
//! write locks across the update and writes into their buffers in place; `false` (the default,
//! as in TensorFlow) updates a snapshot and stores it, never blocking readers.

use std::sync::Arc;

use super::numeric::{Float, Real};
use super::ref_variable::{read_modify_write, uninitialized_ref};
use super::variable::{handle_input, lookup_var, uninitialized};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{ResourceHandle, Tensor, Var};

/// Cycles a dense update costs per element and per slice it reads or writes (the variable,
/// its slots, the gradient), for the intra-op pool's cost model.
const APPLY_CYCLES_PER_SLICE: f64 = 2.0;

/// Returns the factory for an optimizer-update op, dense or sparse (`sparse_training.rs`).
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    if Rule::of(op).is_none() {
        return super::sparse_training::kernel_for(op);
    }
    Some(|node| Ok(Arc::new(Update::new(node)?)))
}

/// Reads AdagradDA's `global_step`, an int64 scalar, as a `T` (as TensorFlow's kernels cast it).
fn step_param<T: Float>(ctx: &OpContext<'_>, t: &Tensor, name: &str) -> Result<T> {
    if t.rank() != 0 {
        return Err(ctx.invalid(format!("{name} is not a scalar: {}", t.shape())));
    }
    let step = t
        .scalar_value::<i64>()
        .map_err(|_| ctx.invalid(format!("{name} must be int64, got {}", t.dtype())))?;
    <T as num_traits::NumCast>::from(step)
        .ok_or_else(|| ctx.invalid(format!("{name} {step} does not fit the variable's dtype")))
}

/// Reads a scalar hyper-parameter (`alpha`, `lr`, `epsilon`) of element type `T`.
fn scalar_param<T: Float>(ctx: &OpContext<'_>, t: &Tensor, name: &str) -> Result<T> {
    if t.num_elements() != 1 || t.rank() > 1 {
        return Err(ctx.invalid(format!("{name} is not a scalar: {}", t.shape())));
    }
    t.scalar_value::<T>()
        .map_err(|_| ctx.invalid(format!("{name} must be {}, got {}", T::DTYPE, t.dtype())))
}

/// Where an update op finds its variable and slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `ResourceApplyX`: resource handles, looked up in the device's resources.
    Resource,
    /// `ApplyX`: reference inputs (`Ref(T)`, from `VariableV2`); outputs the variable's ref.
    Ref,
}

impl Form {
    /// The form of update op `op`.
    pub fn of(op: &str) -> Form {
        if op.starts_with("Resource") {
            Form::Resource
        } else {
            Form::Ref
        }
    }
}

/// One input of an update op, in TensorFlow's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    /// The variable (input 0).
    Var,
    /// A slot variable the rule keeps beside it.
    Slot(&'static str),
    /// A scalar hyper-parameter.
    Param(&'static str),
    /// The gradient (`delta` for the gradient-descent rules).
    Grad(&'static str),
    /// AdagradDA's `global_step`: an int64 scalar, whatever `T` is.
    Step(&'static str),
}

/// The update rule of an optimizer op, which fixes its inputs ([`Rule::inputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// (Resource)ApplyGradientDescent.
    GradientDescent,
    /// (Resource)ApplyProximalGradientDescent.
    ProximalGradientDescent,
    /// (Resource)ApplyAdadelta.
    Adadelta,
    /// (Resource)ApplyAdagrad.
    Adagrad,
    /// (Resource)ApplyAdagradV2.
    AdagradV2,
    /// (Resource)ApplyAdagradDA.
    AdagradDA,
    /// (Resource)ApplyProximalAdagrad.
    ProximalAdagrad,
    /// (Resource)ApplyFtrl.
    Ftrl,
    /// (Resource)ApplyFtrlV2.
    FtrlV2,
    /// (Resource)ApplyMomentum.
    Momentum,
    /// (Resource)ApplyAdam.
    Adam,
    /// (Resource)ApplyAdaMax.
    AdaMax,
    /// (Resource)ApplyRMSProp.
    RmsProp,
    /// (Resource)ApplyCenteredRMSProp.
    CenteredRmsProp,
    /// (Resource)ApplyAddSign.
    AddSign,
    /// (Resource)ApplyPowerSign.
    PowerSign,
}

impl Rule {
    /// The rule of optimizer op `op` (`ApplyX` or `ResourceApplyX`), if it is one.
    pub fn of(op: &str) -> Option<Rule> {
        let name = op.strip_prefix("Resource").unwrap_or(op);
        Some(match name.strip_prefix("Apply")? {
            "GradientDescent" => Rule::GradientDescent,
            "ProximalGradientDescent" => Rule::ProximalGradientDescent,
            "Adadelta" => Rule::Adadelta,
            "Adagrad" => Rule::Adagrad,
            "AdagradV2" => Rule::AdagradV2,
            "AdagradDA" => Rule::AdagradDA,
            "ProximalAdagrad" => Rule::ProximalAdagrad,
            "Ftrl" => Rule::Ftrl,
            "FtrlV2" => Rule::FtrlV2,
            "Momentum" => Rule::Momentum,
            "Adam" => Rule::Adam,
            "AdaMax" => Rule::AdaMax,
            "RMSProp" => Rule::RmsProp,
            "CenteredRMSProp" => Rule::CenteredRmsProp,
            "AddSign" => Rule::AddSign,
            "PowerSign" => Rule::PowerSign,
            _ => return None,
        })
    }

    /// The op's inputs, in TensorFlow's order (`training_ops.cc`).
    fn inputs(self) -> &'static [Input] {
        use Input::{Grad, Param, Slot, Step, Var};
        match self {
            Rule::GradientDescent => &[Var, Param("alpha"), Grad("delta")],
            Rule::ProximalGradientDescent => {
                &[Var, Param("alpha"), Param("l1"), Param("l2"), Grad("delta")]
            }
            Rule::Adadelta => &[
                Var,
                Slot("accum"),
                Slot("accum_update"),
                Param("lr"),
                Param("rho"),
                Param("epsilon"),
                Grad("grad"),
            ],
            Rule::Adagrad => &[Var, Slot("accum"), Param("lr"), Grad("grad")],
            Rule::AdagradV2 => &[
                Var,
                Slot("accum"),
                Param("lr"),
                Param("epsilon"),
                Grad("grad"),
            ],
            Rule::AdagradDA => &[
                Var,
                Slot("gradient_accumulator"),
                Slot("gradient_squared_accumulator"),
                Grad("grad"),
                Param("lr"),
                Param("l1"),
                Param("l2"),
                Step("global_step"),
            ],
            Rule::ProximalAdagrad => &[
                Var,
                Slot("accum"),
                Param("lr"),
                Param("l1"),
                Param("l2"),
                Grad("grad"),
            ],
            Rule::Ftrl => &[
                Var,
                Slot("accum"),
                Slot("linear"),
                Grad("grad"),
                Param("lr"),
                Param("l1"),
                Param("l2"),
                Param("lr_power"),
            ],
            Rule::FtrlV2 => &[
                Var,
                Slot("accum"),
                Slot("linear"),
                Grad("grad"),
                Param("lr"),
                Param("l1"),
                Param("l2"),
                Param("l2_shrinkage"),
                Param("lr_power"),
            ],
            Rule::Momentum => &[
                Var,
                Slot("accum"),
                Param("lr"),
                Grad("grad"),
                Param("momentum"),
            ],
            Rule::Adam => &[
                Var,
                Slot("m"),
                Slot("v"),
                Param("beta1_power"),
                Param("beta2_power"),
                Param("lr"),
                Param("beta1"),
                Param("beta2"),
                Param("epsilon"),
                Grad("grad"),
            ],
            Rule::AdaMax => &[
                Var,
                Slot("m"),
                Slot("v"),
                Param("beta1_power"),
                Param("lr"),
                Param("beta1"),
                Param("beta2"),
                Param("epsilon"),
                Grad("grad"),
            ],
            Rule::RmsProp => &[
                Var,
                Slot("ms"),
                Slot("mom"),
                Param("lr"),
                Param("rho"),
                Param("momentum"),
                Param("epsilon"),
                Grad("grad"),
            ],
            Rule::CenteredRmsProp => &[
                Var,
                Slot("mg"),
                Slot("ms"),
                Slot("mom"),
                Param("lr"),
                Param("rho"),
                Param("momentum"),
                Param("epsilon"),
                Grad("grad"),
            ],
            Rule::AddSign => &[
                Var,
                Slot("m"),
                Param("lr"),
                Param("alpha"),
                Param("sign_decay"),
                Param("beta"),
                Grad("grad"),
            ],
            Rule::PowerSign => &[
                Var,
                Slot("m"),
                Param("lr"),
                Param("logbase"),
                Param("sign_decay"),
                Param("beta"),
                Grad("grad"),
            ],
        }
    }

    /// The names of the slot variables after `var`, in input order (inputs `1..=slots`).
    pub fn slots(self) -> Vec<&'static str> {
        self.inputs()
            .iter()
            .filter_map(|i| match i {
                Input::Slot(name) => Some(*name),
                _ => None,
            })
            .collect()
    }

    /// The input index and name of the gradient.
    pub(super) fn grad(self) -> (usize, &'static str) {
        self.inputs()
            .iter()
            .enumerate()
            .find_map(|(i, input)| match input {
                Input::Grad(name) => Some((i, *name)),
                _ => None,
            })
            .expect("every rule takes a gradient")
    }

    /// The scalar hyper-parameters: (input index, name), in the order [`Update::params`]
    /// returns them (input order; AdagradDA's `global_step` last, as a parameter too).
    pub fn params(self) -> Vec<(usize, &'static str)> {
        self.inputs()
            .iter()
            .enumerate()
            .filter_map(|(i, input)| match input {
                Input::Param(name) | Input::Step(name) => Some((i, *name)),
                _ => None,
            })
            .collect()
    }

    /// Whether input `i` is an int64 step count rather than a value of type `T`.
    fn is_step(self, i: usize) -> bool {
        matches!(self.inputs().get(i), Some(Input::Step(_)))
    }
}

/// One optimizer update op: its rule, its form and the attrs that change it.
#[derive(Clone, Copy, Debug)]
pub struct Update {
    /// The update rule.
    pub rule: Rule,
    /// Reference or resource variables.
    pub form: Form,
    /// `use_locking`: hold the write locks across the update (see [`read_modify_write`]).
    pub use_locking: bool,
    /// Momentum's and Adam's `use_nesterov`.
    pub use_nesterov: bool,
    /// Adagrad's `update_slots` (false leaves `accum` as it is).
    pub update_slots: bool,
    /// Ftrl's `multiply_linear_by_lr`.
    pub multiply_linear_by_lr: bool,
}

/// The variables an update changes: the variable first, then its slots.
pub(super) struct Targets {
    pub(super) vars: Vec<Arc<Var>>,
    /// Each variable's name, for messages.
    pub(super) names: Vec<String>,
    /// Each variable's handle (resource form only).
    pub(super) handles: Vec<Option<ResourceHandle>>,
}

impl Targets {
    /// The error for target `i` holding no value yet.
    pub(super) fn uninitialized(&self, ctx: &OpContext<'_>, i: usize) -> Status {
        match &self.handles[i] {
            Some(h) => uninitialized(ctx, h),
            None => uninitialized_ref(ctx, &self.names[i]),
        }
    }
}

impl Update {
    /// The update of `node`, an optimizer op ([`Rule::of`]).
    pub fn new(node: &NodeDef) -> Result<Update> {
        let rule = Rule::of(&node.op).ok_or_else(|| {
            Status::invalid_argument(format!(
                "node `{}`: {} is not an optimizer update",
                node.name, node.op
            ))
        })?;
        Update::with_rule(node, rule)
    }

    /// The update of `node` by `rule`, in the form its op's name says, with the node's attrs
    /// (shared with the sparse updates, whose names [`Rule::of`] does not know).
    pub(super) fn with_rule(node: &NodeDef, rule: Rule) -> Result<Update> {
        Ok(Update {
            rule,
            form: Form::of(&node.op),
            use_locking: attr::bool_or(node, "use_locking", false)?,
            use_nesterov: attr::bool_or(node, "use_nesterov", false)?,
            update_slots: attr::bool_or(node, "update_slots", true)?,
            multiply_linear_by_lr: attr::bool_or(node, "multiply_linear_by_lr", false)?,
        })
    }

    /// The scalar hyper-parameters of this step, in [`Rule::params`] order, checked as
    /// TensorFlow's CPU kernels check them.
    pub fn params<T: Float>(&self, ctx: &OpContext<'_>) -> Result<Vec<T>> {
        self.params_shifted(ctx, 0)
    }

    /// [`Update::params`] of an op that has `shift` more inputs right after the gradient than
    /// the dense form (the sparse forms' `indices`).
    pub(super) fn params_shifted<T: Float>(
        &self,
        ctx: &OpContext<'_>,
        shift: usize,
    ) -> Result<Vec<T>> {
        let (grad, _) = self.rule.grad();
        let p = self
            .rule
            .params()
            .into_iter()
            .map(|(i, name)| {
                let at = if i > grad { i + shift } else { i };
                if self.rule.is_step(i) {
                    step_param::<T>(ctx, ctx.input(at)?, name)
                } else {
                    scalar_param::<T>(ctx, ctx.input(at)?, name)
                }
            })
            .collect::<Result<Vec<T>>>()?;
        if self.rule == Rule::ProximalAdagrad {
            let zero = T::zero();
            if p[0] <= zero {
                return Err(ctx.invalid(format!("lr is not a positive scalar: {:?}", p[0])));
            }
            for (v, name) in [(p[1], "l1"), (p[2], "l2")] {
                if v < zero {
                    return Err(ctx.invalid(format!(
                        "{name} regularization strength is not a non-negative scalar: {v:?}"
                    )));
                }
            }
        }
        Ok(p)
    }

    /// Finds the variable and its slots: resource handles looked up in the device's
    /// resources, or the variables behind the reference inputs.
    pub(super) fn targets(&self, ctx: &OpContext<'_>) -> Result<Targets> {
        let n = 1 + self.rule.slots().len();
        let mut t = Targets {
            vars: Vec::with_capacity(n),
            names: Vec::with_capacity(n),
            handles: Vec::with_capacity(n),
        };
        for i in 0..n {
            match self.form {
                Form::Resource => {
                    let h = handle_input(ctx, i)?;
                    t.vars.push(lookup_var(ctx, &h)?);
                    t.names.push(h.name.clone());
                    t.handles.push(Some(h));
                }
                Form::Ref => {
                    let (var, name) = ctx.ref_input(i)?;
                    t.vars.push(var);
                    t.names.push(name);
                    t.handles.push(None);
                }
            }
        }
        for (i, a) in t.vars.iter().enumerate() {
            if let Some(j) = (i + 1..n).find(|&j| Arc::ptr_eq(a, &t.vars[j])) {
                return Err(ctx.invalid(format!(
                    "the variable and its slots must be distinct, but `{}` is passed twice",
                    t.names[j]
                )));
            }
        }
        Ok(t)
    }

    /// Runs one update: finds the variable and its slots, checks that they are initialized and
    /// agree with the gradient in dtype and shape, and lets `compute(ctx, values, grad)` change
    /// their values (var first, then the slots in input order), under the locking `use_locking`
    /// asks for. The ref form then outputs the variable's reference. The CPU and GPU kernels
    /// differ only in `compute`.
    pub fn apply(
        &self,
        ctx: &mut OpContext<'_>,
        compute: impl FnOnce(&OpContext<'_>, &mut [&mut Tensor], &Tensor) -> Result<()>,
    ) -> Result<()> {
        {
            let ctx: &OpContext<'_> = ctx;
            let targets = self.targets(ctx)?;
            let (grad_input, grad_name) = self.rule.grad();
            let grad = ctx.input(grad_input)?;
            let slots = self.rule.slots();
            let vars: Vec<&Var> = targets.vars.iter().map(|v| &**v).collect();
            let uninitialized = |i: usize| targets.uninitialized(ctx, i);
            read_modify_write(&vars, self.use_locking, uninitialized, |values| {
                let var = &*values[0];
                for (value, slot) in values[1..].iter().zip(&slots) {
                    check_like(ctx, &targets.names[0], var, value, slot)?;
                }
                check_like(ctx, &targets.names[0], var, grad, grad_name)?;
                compute(ctx, values, grad)
            })?;
        }
        if self.form == Form::Ref {
            let reference = ctx.input(0)?.clone();
            ctx.set_output(0, reference);
        }
        Ok(())
    }

    /// The CPU computation of [`Update::apply`]: updates `values` (var, then the slots) in
    /// place, for float32 and float64.
    pub fn compute_cpu(
        &self,
        ctx: &OpContext<'_>,
        values: &mut [&mut Tensor],
        grad: &Tensor,
    ) -> Result<()> {
        dispatch_float!(ctx, values[0].dtype(), T => self.run::<T>(ctx, values, grad))
    }

    fn run<T: Float + bytemuck::Pod>(
        &self,
        ctx: &OpContext<'_>,
        values: &mut [&mut Tensor],
        grad: &Tensor,
    ) -> Result<()> {
        let p = self.params::<T>(ctx)?;
        let g = grad.values::<T>()?;
        let intra = ctx.intra();
        with_elements::<T, _>(values, |vals| self.step_split(intra, &p, vals, &g))
    }

    /// [`Update::step`] over the intra-op pool: every rule is element-wise, so the variable,
    /// its slots and the gradient are cut into the same consecutive ranges, one piece each,
    /// and each piece updates its range as the whole would (the same values, bit for bit). A
    /// variable under the pool's threshold is updated inline.
    pub(super) fn step_split<T: Float>(
        &self,
        intra: &crate::runtime::intra::IntraPool,
        p: &[T],
        vals: &mut [&mut [T]],
        grad: &[T],
    ) {
        let len = grad.len();
        // A load and a store per slice and a few flops per element (Adam's square root and
        // division the most).
        let cycles = APPLY_CYCLES_PER_SLICE * (vals.len() + 1) as f64;
        let pieces = intra.pieces(len, cycles);
        if pieces <= 1 || vals.iter().any(|v| v.len() != len) {
            self.step(p, vals, grad);
            return;
        }
        let mut rests: Vec<&mut [T]> = vals.iter_mut().map(|v| &mut **v).collect();
        let mut grad_rest = grad;
        let mut parts = Vec::with_capacity(pieces);
        for range in crate::runtime::intra::split(len, pieces) {
            let n = range.len();
            let chunk: Vec<&mut [T]> = rests
                .iter_mut()
                .map(|rest| {
                    let (head, tail) = std::mem::take(rest).split_at_mut(n);
                    *rest = tail;
                    head
                })
                .collect();
            let (g, tail) = grad_rest.split_at(n);
            grad_rest = tail;
            parts.push((chunk, g));
        }
        intra.map(parts, |(mut chunk, g)| self.step(p, &mut chunk, g));
    }

    /// Updates `vals` (var, then the slots) element by element with hyper-parameters `p`
    /// ([`Update::params`]) and gradient `grad`; every slice has the gradient's length. The
    /// dense kernels pass whole variables, the sparse ones one row at a time.
    pub(super) fn step<T: Float>(&self, p: &[T], vals: &mut [&mut [T]], grad: &[T]) {
        let (zero, one) = (T::zero(), T::one());
        let two = one + one;
        let (var, slots) = vals.split_first_mut().expect("the variable comes first");
        match (self.rule, slots) {
            (Rule::GradientDescent, []) => {
                let alpha = p[0];
                for (v, &g) in var.iter_mut().zip(grad) {
                    *v = *v - alpha * g;
                }
            }
            (Rule::ProximalGradientDescent, []) => {
                let (alpha, l1, l2) = (p[0], p[1], p[2]);
                for (v, &g) in var.iter_mut().zip(grad) {
                    *v = proximal(*v - g * alpha, alpha, l1, l2);
                }
            }
            (Rule::Adadelta, [accum, accum_update]) => {
                let (lr, rho, eps) = (p[0], p[1], p[2]);
                for (i, &g) in grad.iter().enumerate() {
                    accum[i] = accum[i] * rho + g * g * (one - rho);
                    let update = (accum_update[i] + eps).sqrt() / (accum[i] + eps).sqrt() * g;
                    var[i] = var[i] - update * lr;
                    accum_update[i] = accum_update[i] * rho + update * update * (one - rho);
                }
            }
            (Rule::Adagrad | Rule::AdagradV2, [accum]) => {
                let lr = p[0];
                let epsilon = p.get(1).copied().unwrap_or(zero);
                // Zipped slices and the branch outside the loop: the loop vectorises.
                let elements = var.iter_mut().zip(accum.iter_mut()).zip(grad);
                if self.update_slots {
                    for ((v, a), &g) in elements {
                        *a = *a + g * g;
                        *v = *v - lr * g / (a.sqrt() + epsilon);
                    }
                } else {
                    for ((v, a), &g) in elements {
                        *v = *v - lr * g / (a.sqrt() + epsilon);
                    }
                }
            }
            (Rule::AdagradDA, [grad_accum, grad_squared_accum]) => {
                let (lr, l1, l2, global_step) = (p[0], p[1], p[2], p[3]);
                let denom_base = l2 * global_step * lr;
                for (i, &g) in grad.iter().enumerate() {
                    grad_accum[i] = grad_accum[i] + g;
                    grad_squared_accum[i] = grad_squared_accum[i] + g * g;
                    let ga = grad_accum[i];
                    let denom = denom_base + grad_squared_accum[i].sqrt();
                    var[i] = if l1 > zero {
                        -<T as Real>::sign(ga)
                            * lr
                            * <T as Real>::max(ga.abs() - l1 * global_step, zero)
                            / denom
                    } else {
                        -ga * lr / denom
                    };
                }
            }
            (Rule::ProximalAdagrad, [accum]) => {
                let (lr, l1, l2) = (p[0], p[1], p[2]);
                for (i, &g) in grad.iter().enumerate() {
                    accum[i] = accum[i] + g * g;
                    let lr_t = lr / accum[i].sqrt();
                    var[i] = proximal(var[i] - g * lr_t, lr_t, l1, l2);
                }
            }
            (Rule::Ftrl | Rule::FtrlV2, [accum, linear]) => {
                let (lr, l1, l2) = (p[0], p[1], p[2]);
                let (shrinkage, lr_power) = match self.rule {
                    Rule::FtrlV2 => (p[3], p[4]),
                    _ => (zero, p[3]),
                };
                // accum^-lr_power, with TensorFlow's exact square root for lr_power = -0.5.
                let minus_half = -(one / two);
                let power = |a: T| {
                    if lr_power == minus_half {
                        a.sqrt()
                    } else {
                        a.powf(-lr_power)
                    }
                };
                // With multiply_linear_by_lr, linear holds lr times the plain rule's linear.
                let l1_t = if self.multiply_linear_by_lr {
                    l1 * lr
                } else {
                    l1
                };
                for (i, &g) in grad.iter().enumerate() {
                    let shrunk = if self.rule == Rule::FtrlV2 {
                        g + two * shrinkage * var[i]
                    } else {
                        g
                    };
                    let new_accum = accum[i] + g * g;
                    let sigma = power(new_accum) - power(accum[i]);
                    let (step, quadratic) = if self.multiply_linear_by_lr {
                        (
                            shrunk * lr - sigma * var[i],
                            power(new_accum) + two * l2 * lr,
                        )
                    } else {
                        (
                            shrunk - sigma / lr * var[i],
                            power(new_accum) / lr + two * l2,
                        )
                    };
                    linear[i] = linear[i] + step;
                    var[i] = if linear[i].abs() > l1_t {
                        (<T as Real>::sign(linear[i]) * l1_t - linear[i]) / quadratic
                    } else {
                        zero
                    };
                    accum[i] = new_accum;
                }
            }
            (Rule::Momentum, [accum]) => {
                let (lr, momentum) = (p[0], p[1]);
                let elements = var.iter_mut().zip(accum.iter_mut()).zip(grad);
                if self.use_nesterov {
                    for ((v, a), &g) in elements {
                        *a = *a * momentum + g;
                        *v = *v - (g * lr + *a * momentum * lr);
                    }
                } else {
                    for ((v, a), &g) in elements {
                        *a = *a * momentum + g;
                        *v = *v - *a * lr;
                    }
                }
            }
            (Rule::Adam, [m, v]) => {
                let (b1p, b2p, lr, b1, b2, eps) = (p[0], p[1], p[2], p[3], p[4], p[5]);
                let alpha = lr * (one - b2p).sqrt() / (one - b1p);
                let elements = var.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(grad);
                if self.use_nesterov {
                    for (((x, m), v), &g) in elements {
                        *m = *m + (g - *m) * (one - b1);
                        *v = *v + (g * g - *v) * (one - b2);
                        *x = *x - (*m * b1 + (one - b1) * g) * alpha / (v.sqrt() + eps);
                    }
                } else {
                    for (((x, m), v), &g) in elements {
                        *m = *m + (g - *m) * (one - b1);
                        *v = *v + (g * g - *v) * (one - b2);
                        *x = *x - *m * alpha / (v.sqrt() + eps);
                    }
                }
            }
            (Rule::AdaMax, [m, v]) => {
                let (b1p, lr, b1, b2, eps) = (p[0], p[1], p[2], p[3], p[4]);
                for (i, &g) in grad.iter().enumerate() {
                    m[i] = m[i] + (g - m[i]) * (one - b1);
                    v[i] = <T as Real>::max(b2 * v[i], g.abs());
                    var[i] = var[i] - lr / (one - b1p) * (m[i] / (v[i] + eps));
                }
            }
            (Rule::RmsProp, [ms, mom]) => {
                let (lr, rho, momentum, eps) = (p[0], p[1], p[2], p[3]);
                let elements = var
                    .iter_mut()
                    .zip(ms.iter_mut())
                    .zip(mom.iter_mut())
                    .zip(grad);
                for (((v, ms), mom), &g) in elements {
                    *ms = *ms + (g * g - *ms) * (one - rho);
                    *mom = *mom * momentum + lr * g / (*ms + eps).sqrt();
                    *v = *v - *mom;
                }
            }
            (Rule::CenteredRmsProp, [mg, ms, mom]) => {
                let (lr, rho, momentum, eps) = (p[0], p[1], p[2], p[3]);
                for (i, &g) in grad.iter().enumerate() {
                    ms[i] = ms[i] + (g * g - ms[i]) * (one - rho);
                    mg[i] = mg[i] + (g - mg[i]) * (one - rho);
                    let denom = ms[i] - mg[i] * mg[i] + eps;
                    mom[i] = mom[i] * momentum + lr * g / denom.sqrt();
                    var[i] = var[i] - mom[i];
                }
            }
            (Rule::AddSign | Rule::PowerSign, [m]) => {
                let (lr, base, sign_decay, beta) = (p[0], p[1], p[2], p[3]);
                for (i, &g) in grad.iter().enumerate() {
                    m[i] = m[i] * beta + g * (one - beta);
                    let agree = <T as Real>::sign(g) * <T as Real>::sign(m[i]);
                    // AddSign's base is alpha, PowerSign's logbase.
                    let scale = if self.rule == Rule::AddSign {
                        base + sign_decay * agree
                    } else {
                        (base * sign_decay * agree).exp()
                    };
                    var[i] = var[i] - lr * scale * g;
                }
            }
            (rule, slots) => unreachable!("{rule:?} with {} slots", slots.len()),
        }
    }
}

/// The proximal step of the Fobos rules: `prox` shrunk toward 0 by `lr * l1` (when `l1 > 0`)
/// and scaled by `1 / (1 + lr * l2)`.
fn proximal<T: Float>(prox: T, lr: T, l1: T, l2: T) -> T {
    let (zero, one) = (T::zero(), T::one());
    let scale = one + l2 * lr;
    if l1 > zero {
        <T as Real>::sign(prox) * <T as Real>::max(prox.abs() - lr * l1, zero) / scale
    } else {
        prox / scale
    }
}

/// Checks that the variable's value and another input of the update (a slot's value, the
/// gradient) agree in dtype and shape, in TensorFlow's words.
pub(super) fn check_like(
    ctx: &OpContext<'_>,
    name: &str,
    var: &Tensor,
    t: &Tensor,
    what: &str,
) -> Result<()> {
    if var.dtype() != t.dtype() {
        return Err(ctx.invalid(format!(
            "variable `{name}` is {} but {what} is {}",
            var.dtype(),
            t.dtype()
        )));
    }
    if var.shape() != t.shape() {
        return Err(ctx.invalid(format!(
            "var and {what} do not have the same shape{} {}",
            var.shape(),
            t.shape()
        )));
    }
    Ok(())
}

/// Runs `f` on the elements of every tensor at once, each written in its own buffer when nothing
/// else shares it and in a copy otherwise ([`Tensor::update_in_place`]).
pub(super) fn with_elements<T: Float + bytemuck::Pod, R>(
    tensors: &mut [&mut Tensor],
    f: impl FnOnce(&mut [&mut [T]]) -> R,
) -> Result<R> {
    nest(tensors, Vec::new(), f)
}

/// [`with_elements`], one tensor per level: `done` holds the elements of the tensors before
/// `rest`.
fn nest<T: Float + bytemuck::Pod, R>(
    rest: &mut [&mut Tensor],
    done: Vec<&mut [T]>,
    f: impl FnOnce(&mut [&mut [T]]) -> R,
) -> Result<R> {
    match rest.split_first_mut() {
        None => {
            let mut done = done;
            Ok(f(&mut done))
        }
        Some((first, tail)) => first.update_in_place::<T, _>(move |elements| {
            let mut done: Vec<&mut [T]> = done;
            done.push(elements);
            nest(tail, done, f)
        })?,
    }
}

impl OpKernel for Update {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.apply(ctx, |ctx, values, grad| self.compute_cpu(ctx, values, grad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::intra::IntraPool;

    /// A dense update split over a pool gives the inline update's values, bit for bit, for
    /// every rule with slots and without.
    #[test]
    fn a_split_dense_update_equals_the_whole_one() {
        let pool = IntraPool::new("apply-test", 3);
        let n = 100_003; // past the pool's threshold, and not a multiple of its threads
        let grad: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
        assert!(
            pool.pieces(n, APPLY_CYCLES_PER_SLICE) > 1,
            "the updates must split"
        );
        for (op, slots, params) in [
            ("ApplyAdam", 2, vec![0.9f32, 0.99, 0.01, 0.9, 0.999, 1e-7]),
            ("ApplyAdagrad", 1, vec![0.1]),
            ("ApplyMomentum", 1, vec![0.05, 0.9]),
            ("ApplyGradientDescent", 0, vec![0.1]),
            ("ApplyFtrl", 2, vec![0.1, 0.01, 0.02, -0.5]),
        ] {
            let update = Update {
                rule: Rule::of(op).unwrap(),
                form: Form::Ref,
                use_locking: false,
                use_nesterov: false,
                update_slots: true,
                multiply_linear_by_lr: false,
            };
            let start = |k: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| 0.5 + ((i * (k + 3)) % 31) as f32 / 31.0)
                    .collect()
            };
            let mut whole: Vec<Vec<f32>> = (0..=slots).map(start).collect();
            let mut split: Vec<Vec<f32>> = whole.clone();
            let mut refs: Vec<&mut [f32]> = whole.iter_mut().map(|v| &mut v[..]).collect();
            update.step(&params, &mut refs, &grad);
            let mut refs: Vec<&mut [f32]> = split.iter_mut().map(|v| &mut v[..]).collect();
            update.step_split(&pool, &params, &mut refs, &grad);
            for (k, (w, s)) in whole.iter().zip(&split).enumerate() {
                let same = w.iter().zip(s).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{op}: slice {k} differs");
            }
            assert_ne!(whole[0], start(0), "{op} changed nothing");
        }
    }
}
