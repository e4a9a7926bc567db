//! Optimizer updates of resource variables, each replacing the variables' values with
//! TensorFlow's update rules (`training_ops.cc`):
//!
//! - ResourceApplyGradientDescent: `var -= alpha * delta`.
//! - ResourceApplyAdagrad: `accum += grad^2` (when `update_slots`), `var -= lr * grad /
//!   sqrt(accum)`; ResourceApplyAdagradV2 adds `epsilon` to the denominator.
//! - ResourceApplyMomentum: `accum = accum * momentum + grad`, then `var -= lr * accum`, or
//!   with `use_nesterov` `var -= lr * grad + lr * momentum * accum`.
//! - ResourceApplyAdam: `lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)`,
//!   `m += (grad - m) * (1 - beta1)`, `v += (grad^2 - v) * (1 - beta2)`, `var -= lr_t * m /
//!   (sqrt(v) + epsilon)` (with `use_nesterov`, `m * beta1 + (1 - beta1) * grad` replaces `m`).
//! - ResourceApplyRMSProp: `ms += (grad^2 - ms) * (1 - rho)`, `mom = mom * momentum + lr *
//!   grad / sqrt(ms + epsilon)`, `var -= mom`; ResourceApplyCenteredRMSProp also keeps `mg +=
//!   (grad - mg) * (1 - rho)` and divides by `sqrt(ms - mg^2 + epsilon)`.
//!
//! Each update holds the write locks of the variables it changes (var first, then its slots
//! in input order) for the whole computation, so concurrent steps apply their updates one
//! after the other. That is what `use_locking = true` asks for; tessera gives it always, since
//! an unlocked read-modify-write of a shared `Tensor` could lose a whole update rather than
//! the few elements TensorFlow's racy Hogwild updates lose.

use std::sync::Arc;

use super::numeric::Float;
use super::variable::{handle_input, lookup_var, uninitialized, write_lock};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{ResourceHandle, Tensor};

/// Returns the factory for an optimizer-update op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    Rule::of(op)?;
    Some(|node| Ok(Arc::new(Update::new(node)?)))
}

/// Reads a scalar hyper-parameter (`alpha`, `lr`, `epsilon`) of element type `T`.
fn scalar_param<T: Float>(ctx: &OpContext<'_>, t: &Tensor, name: &str) -> Result<T> {
    if t.num_elements() != 1 || t.rank() > 1 {
        return Err(ctx.invalid(format!("{name} is not a scalar: {}", t.shape())));
    }
    t.scalar_value::<T>()
        .map_err(|_| ctx.invalid(format!("{name} must be {}, got {}", T::DTYPE, t.dtype())))
}

/// Checks that the variable's value and an update tensor agree in dtype and shape.
fn check_like(
    ctx: &OpContext<'_>,
    h: &ResourceHandle,
    value: &Tensor,
    t: &Tensor,
    what: &str,
) -> Result<()> {
    if value.dtype() != t.dtype() {
        return Err(ctx.invalid(format!(
            "variable `{}` is {} but {what} is {}",
            h.name,
            value.dtype(),
            t.dtype()
        )));
    }
    if value.shape() != t.shape() {
        return Err(ctx.invalid(format!(
            "var and {what} do not have the same shape{} {}",
            value.shape(),
            t.shape()
        )));
    }
    Ok(())
}

/// The update rule of an optimizer op, which fixes its inputs: the variable and its slots
/// (resource inputs `0..=slots`), scalar hyper-parameters, and the gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// ResourceApplyGradientDescent: inputs var, alpha, delta.
    GradientDescent,
    /// ResourceApplyAdagrad: inputs var, accum, lr, grad.
    Adagrad,
    /// ResourceApplyAdagradV2: inputs var, accum, lr, epsilon, grad.
    AdagradV2,
    /// ResourceApplyMomentum: inputs var, accum, lr, grad, momentum (the gradient is input 3,
    /// not last).
    Momentum,
    /// ResourceApplyAdam: inputs var, m, v, beta1_power, beta2_power, lr, beta1, beta2,
    /// epsilon, grad.
    Adam,
    /// ResourceApplyRMSProp: inputs var, ms, mom, lr, rho, momentum, epsilon, grad.
    RmsProp,
    /// ResourceApplyCenteredRMSProp: inputs var, mg, ms, mom, lr, rho, momentum, epsilon, grad.
    CenteredRmsProp,
}

impl Rule {
    /// The rule of optimizer op `op`, if it is one.
    pub fn of(op: &str) -> Option<Rule> {
        Some(match op {
            "ResourceApplyGradientDescent" => Rule::GradientDescent,
            "ResourceApplyAdagrad" => Rule::Adagrad,
            "ResourceApplyAdagradV2" => Rule::AdagradV2,
            "ResourceApplyMomentum" => Rule::Momentum,
            "ResourceApplyAdam" => Rule::Adam,
            "ResourceApplyRMSProp" => Rule::RmsProp,
            "ResourceApplyCenteredRMSProp" => Rule::CenteredRmsProp,
            _ => return None,
        })
    }

    /// The number of slot variables after `var`.
    pub fn slots(self) -> usize {
        match self {
            Rule::GradientDescent => 0,
            Rule::Adagrad | Rule::AdagradV2 | Rule::Momentum => 1,
            Rule::Adam | Rule::RmsProp => 2,
            Rule::CenteredRmsProp => 3,
        }
    }

    /// The input index of the gradient.
    fn grad_input(self) -> usize {
        match self {
            Rule::GradientDescent => 2,
            Rule::Adagrad | Rule::Momentum => 3,
            Rule::AdagradV2 => 4,
            Rule::Adam => 9,
            Rule::RmsProp => 7,
            Rule::CenteredRmsProp => 8,
        }
    }

    /// The scalar hyper-parameters: (input index, name), in the order [`Rule::step`] takes
    /// them.
    pub fn params(self) -> &'static [(usize, &'static str)] {
        match self {
            Rule::GradientDescent => &[(1, "alpha")],
            Rule::Adagrad => &[(2, "lr")],
            Rule::AdagradV2 => &[(2, "lr"), (3, "epsilon")],
            Rule::Momentum => &[(2, "lr"), (4, "momentum")],
            Rule::Adam => &[
                (3, "beta1_power"),
                (4, "beta2_power"),
                (5, "lr"),
                (6, "beta1"),
                (7, "beta2"),
                (8, "epsilon"),
            ],
            Rule::RmsProp => &[(3, "lr"), (4, "rho"), (5, "momentum"), (6, "epsilon")],
            Rule::CenteredRmsProp => &[(4, "lr"), (5, "rho"), (6, "momentum"), (7, "epsilon")],
        }
    }
}

/// One optimizer update op: its rule and the attrs that change it.
#[derive(Clone, Copy, Debug)]
pub struct Update {
    /// The update rule.
    pub rule: Rule,
    /// Momentum's and Adam's `use_nesterov`.
    pub use_nesterov: bool,
    /// Adagrad's `update_slots` (false leaves `accum` as it is).
    pub update_slots: bool,
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
        Ok(Update {
            rule,
            use_nesterov: attr::bool_or(node, "use_nesterov", false)?,
            update_slots: attr::bool_or(node, "update_slots", true)?,
        })
    }

    /// The scalar hyper-parameters of this step, in [`Rule::params`] order.
    pub fn params<T: Float>(&self, ctx: &OpContext<'_>) -> Result<Vec<T>> {
        self.rule
            .params()
            .iter()
            .map(|&(i, name)| scalar_param::<T>(ctx, ctx.input(i)?, name))
            .collect()
    }

    /// Runs one update under the variables' write locks: looks up the variable and its slots,
    /// checks they are initialized and agree with the gradient in dtype and shape, and
    /// replaces their values with what `compute(values, grad)` returns (var first, then the
    /// slots in input order). The CPU and GPU kernels differ only in `compute`.
    pub fn locked(
        &self,
        ctx: &OpContext<'_>,
        compute: impl FnOnce(&[&Tensor], &Tensor) -> Result<Vec<Tensor>>,
    ) -> Result<()> {
        let n = 1 + self.rule.slots();
        let handles: Vec<ResourceHandle> = (0..n)
            .map(|i| handle_input(ctx, i))
            .collect::<Result<_>>()?;
        for (i, a) in handles.iter().enumerate() {
            if let Some(b) = handles[i + 1..].iter().find(|b| *b == a) {
                return Err(ctx.invalid(format!(
                    "the variable and its slots must be distinct, but `{}` is passed twice",
                    b.name
                )));
            }
        }
        let grad = ctx.input(self.rule.grad_input())?;
        let vars = handles
            .iter()
            .map(|h| lookup_var(ctx, h))
            .collect::<Result<Vec<_>>>()?;
        // Locks in input order: var first, then the slots, the same order in every update.
        let mut guards = Vec::with_capacity(n);
        for var in &vars {
            guards.push(write_lock(ctx, var)?);
        }
        let mut values = Vec::with_capacity(n);
        for (guard, h) in guards.iter().zip(&handles) {
            values.push(guard.as_ref().ok_or_else(|| uninitialized(ctx, h))?);
        }
        let var_value = values[0];
        for (v, h) in values.iter().zip(&handles).skip(1) {
            check_like(
                ctx,
                &handles[0],
                var_value,
                v,
                &format!("slot `{}`", h.name),
            )?;
        }
        let what = if self.rule == Rule::GradientDescent {
            "delta"
        } else {
            "grad"
        };
        check_like(ctx, &handles[0], var_value, grad, what)?;
        let new = compute(&values, grad)?;
        debug_assert_eq!(
            new.len(),
            n,
            "an update returns the variable and every slot"
        );
        for (guard, t) in guards.iter_mut().zip(new) {
            **guard = Some(t);
        }
        Ok(())
    }

    /// Updates `vals` (var, then the slots) in place element by element with hyper-parameters
    /// `p` ([`Update::params`]).
    fn step<T: Float>(&self, p: &[T], vals: &mut [Vec<T>], g: &[T]) {
        let one = T::one();
        let (var, slots) = vals.split_first_mut().expect("the variable comes first");
        match (self.rule, slots) {
            (Rule::GradientDescent, _) => {
                let alpha = p[0];
                for (v, &d) in var.iter_mut().zip(g) {
                    *v = *v - alpha * d;
                }
            }
            (Rule::Adagrad | Rule::AdagradV2, [accum]) => {
                let lr = p[0];
                let epsilon = p.get(1).copied().unwrap_or_else(T::zero);
                for ((v, a), &g) in var.iter_mut().zip(accum.iter_mut()).zip(g) {
                    if self.update_slots {
                        *a = *a + g * g;
                    }
                    *v = *v - lr * g / (a.sqrt() + epsilon);
                }
            }
            (Rule::Momentum, [accum]) => {
                let (lr, momentum) = (p[0], p[1]);
                for ((v, a), &g) in var.iter_mut().zip(accum.iter_mut()).zip(g) {
                    *a = *a * momentum + g;
                    *v = if self.use_nesterov {
                        *v - (g * lr + *a * momentum * lr)
                    } else {
                        *v - *a * lr
                    };
                }
            }
            (Rule::Adam, [m, v2]) => {
                let (b1p, b2p, lr, b1, b2, eps) = (p[0], p[1], p[2], p[3], p[4], p[5]);
                let alpha = lr * (one - b2p).sqrt() / (one - b1p);
                for (((v, m), s), &g) in var.iter_mut().zip(m.iter_mut()).zip(v2.iter_mut()).zip(g)
                {
                    *m = *m + (g - *m) * (one - b1);
                    *s = *s + (g * g - *s) * (one - b2);
                    let num = if self.use_nesterov {
                        *m * b1 + (one - b1) * g
                    } else {
                        *m
                    };
                    *v = *v - num * alpha / (s.sqrt() + eps);
                }
            }
            (Rule::RmsProp, [ms, mom]) => {
                let (lr, rho, momentum, eps) = (p[0], p[1], p[2], p[3]);
                for (((v, ms), mom), &g) in
                    var.iter_mut().zip(ms.iter_mut()).zip(mom.iter_mut()).zip(g)
                {
                    *ms = *ms + (g * g - *ms) * (one - rho);
                    *mom = *mom * momentum + lr * g / (*ms + eps).sqrt();
                    *v = *v - *mom;
                }
            }
            (Rule::CenteredRmsProp, [mg, ms, mom]) => {
                let (lr, rho, momentum, eps) = (p[0], p[1], p[2], p[3]);
                for ((((v, mg), ms), mom), &g) in var
                    .iter_mut()
                    .zip(mg.iter_mut())
                    .zip(ms.iter_mut())
                    .zip(mom.iter_mut())
                    .zip(g)
                {
                    *ms = *ms + (g * g - *ms) * (one - rho);
                    *mg = *mg + (g - *mg) * (one - rho);
                    let denom = *ms - *mg * *mg + eps;
                    *mom = *mom * momentum + lr * g / denom.sqrt();
                    *v = *v - *mom;
                }
            }
            (rule, slots) => unreachable!("{rule:?} with {} slots", slots.len()),
        }
    }

    /// The CPU computation of [`Update::locked`]: new values of var and its slots.
    fn run<T: Float>(
        &self,
        ctx: &OpContext<'_>,
        values: &[&Tensor],
        grad: &Tensor,
    ) -> Result<Vec<Tensor>> {
        let p = self.params::<T>(ctx)?;
        let mut vals: Vec<Vec<T>> = values
            .iter()
            .map(|t| t.values::<T>().map(|v| v.into_owned()))
            .collect::<Result<_>>()?;
        let g = grad.values::<T>()?;
        self.step::<T>(&p, &mut vals, &g);
        vals.into_iter()
            .zip(values)
            .map(|(v, t)| Tensor::from_vec(t.shape().clone(), v))
            .collect()
    }
}

impl OpKernel for Update {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.locked(ctx, |values, grad| {
            dispatch_float!(ctx, values[0].dtype(), T => self.run::<T>(ctx, values, grad))
        })
    }
}
