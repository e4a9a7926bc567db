//! Sparse optimizer updates (`training_ops.cc`): `SparseApplyX` on reference variables and
//! `ResourceSparseApplyX` on resource variables, for the rules that have them (ProximalGradient
//! Descent, Adadelta, Adagrad, AdagradV2, AdagradDA, ProximalAdagrad, Ftrl, FtrlV2, Momentum,
//! RMSProp, CenteredRMSProp). `grad` holds one row per entry of `indices` (int32 or int64), and
//! only the rows `indices` names change, in the variable and in every slot.
//!
//! Each row is updated by the dense rule's own arithmetic ([`Update::step`] on that row's
//! slices), so a dense and a sparse update of one row compute the same numbers. Rows are
//! updated in the order of `indices`, a repeated index once per occurrence, each update seeing
//! the one before, as TensorFlow's CPU kernels do.
//!
//! Inputs are checked as TensorFlow checks them, with its messages: the variable at least 1-D,
//! `indices` a vector, `grad` of the variable's rank with the variable's dimensions after the
//! first and one row per index, a non-empty row where TensorFlow asks for one, every index in
//! `[0, rows)` (checked before anything is written), and the hyper-parameter ranges the sparse
//! Ftrl and ProximalAdagrad kernels insist on.
//!
//! Locking: a sparse update always holds the write locks of the variable and its slots while
//! it changes their rows, whatever `use_locking` says. The lock-free path of
//! [`read_modify_write`](super::ref_variable::read_modify_write) updates a snapshot and stores it, which for a sparse update would copy
//! the whole table to change a few rows; under the lock the rows are written in place (unless
//! a reader still holds a snapshot of the value, which copy-on-write then leaves untouched), so
//! a step costs what its rows cost. Holding the lock is the stronger of TensorFlow's two
//! behaviours: concurrent updates never interleave within a row.

use std::sync::Arc;

use super::int_values;
use super::numeric::Float;
use super::prefetch::{prefetch, ROWS_AHEAD};
use super::ref_variable::read_modify_write_rows;
use super::training::{check_like, with_elements, Form, Rule, Update};
use crate::error::{Result, Status};
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Tensor, Var};

/// Returns the factory for a sparse optimizer-update op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    SparseUpdate::rule_of(op)?;
    Some(|node| Ok(Arc::new(SparseUpdate::new(node)?)))
}

/// One sparse update op: the dense update it applies row by row.
struct SparseUpdate {
    update: Update,
}

/// The rows one update touches: the row of each index, in order, and the elements per row.
struct Rows {
    rows: Vec<usize>,
    inner: usize,
}

impl SparseUpdate {
    /// The rule of `op` (`SparseApplyX` or `ResourceSparseApplyX`), if it is a sparse update.
    fn rule_of(op: &str) -> Option<Rule> {
        let name = op.strip_prefix("Resource").unwrap_or(op);
        let rule = Rule::of(name.strip_prefix("Sparse")?)?;
        // Exhaustive, so a new dense rule must say whether TensorFlow has its sparse form.
        match rule {
            Rule::GradientDescent | Rule::Adam | Rule::AdaMax | Rule::AddSign | Rule::PowerSign => {
                None
            }
            Rule::ProximalGradientDescent
            | Rule::Adadelta
            | Rule::Adagrad
            | Rule::AdagradV2
            | Rule::AdagradDA
            | Rule::ProximalAdagrad
            | Rule::Ftrl
            | Rule::FtrlV2
            | Rule::Momentum
            | Rule::RmsProp
            | Rule::CenteredRmsProp => Some(rule),
        }
    }

    /// The update of `node`, a sparse optimizer op ([`SparseUpdate::rule_of`]).
    fn new(node: &NodeDef) -> Result<SparseUpdate> {
        let rule = SparseUpdate::rule_of(&node.op).ok_or_else(|| {
            Status::invalid_argument(format!(
                "node `{}`: {} is not a sparse optimizer update",
                node.name, node.op
            ))
        })?;
        Ok(SparseUpdate {
            update: Update::with_rule(node, rule)?,
        })
    }

    /// Whether TensorFlow's kernel for this rule refuses rows of no elements.
    fn wants_elements(&self) -> bool {
        !matches!(
            self.update.rule,
            Rule::Adadelta | Rule::Momentum | Rule::RmsProp | Rule::CenteredRmsProp
        )
    }

    /// Checks `grad` and `indices` against the variable's value `var`, as TensorFlow's sparse
    /// kernels do and in their words; returns the rows to update.
    fn rows(
        &self,
        ctx: &OpContext<'_>,
        var: &Tensor,
        grad: &Tensor,
        indices: &Tensor,
    ) -> Result<Rows> {
        let Some((&rows, inner_dims)) = var.dims().split_first() else {
            return Err(ctx.invalid(format!(
                "var must be at least 1 dimensional, got shape {}; a sparse update changes \
                 rows of a vector, matrix or higher",
                var.shape()
            )));
        };
        if indices.rank() != 1 {
            return Err(ctx.invalid(format!(
                "indices must be one-dimensional, got shape {}",
                indices.shape()
            )));
        }
        if grad.rank() != var.rank() {
            return Err(ctx.invalid(format!(
                "grad must have the same number of dimensions as var: grad {}, var {}",
                grad.shape(),
                var.shape()
            )));
        }
        for (d, (&v, &g)) in var.dims().iter().zip(grad.dims()).enumerate().skip(1) {
            if v != g {
                return Err(ctx.invalid(format!(
                    "var and grad must match in dimension {d}: var {}, grad {}",
                    var.shape(),
                    grad.shape()
                )));
            }
        }
        let n = indices.dims()[0];
        if grad.dims()[0] != n {
            return Err(ctx.invalid(format!(
                "grad must be the same size as indices in the first dimension. grad {}, \
                 indices {}",
                grad.shape(),
                indices.shape()
            )));
        }
        let inner: usize = inner_dims.iter().product();
        if inner == 0 && self.wants_elements() {
            return Err(ctx.invalid(format!(
                "Inner dimension should be greater than zero. var {}",
                var.shape()
            )));
        }
        let rows = int_values(ctx, indices, "indices")?
            .into_iter()
            .enumerate()
            .map(|(i, index)| {
                usize::try_from(index)
                    .ok()
                    .filter(|&r| r < rows)
                    .ok_or_else(|| {
                        ctx.invalid(format!(
                            "Index {index} at offset {i} in indices is out of range; var has \
                             {rows} rows"
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Rows { rows, inner })
    }

    /// The hyper-parameter ranges TensorFlow's sparse kernels check beyond [`Update::params`]
    /// (which checks ProximalAdagrad's for both forms): Ftrl's.
    fn check_params<T: Float>(&self, ctx: &OpContext<'_>, p: &[T]) -> Result<()> {
        let zero = T::zero();
        let (lr, l1, l2, shrinkage, lr_power) = match self.update.rule {
            Rule::Ftrl => (p[0], p[1], p[2], None, p[3]),
            Rule::FtrlV2 => (p[0], p[1], p[2], Some(p[3]), p[4]),
            _ => return Ok(()),
        };
        let lr_ok = if self.update.multiply_linear_by_lr {
            lr >= zero
        } else {
            lr > zero
        };
        if !lr_ok {
            return Err(ctx.invalid(format!(
                "lr is not a positive scalar (or zero if multiply_linear_by_lr is set): {lr:?}"
            )));
        }
        for (v, what) in [
            (Some(l1), "l1 regularization strength"),
            (Some(l2), "l2 regularization strength"),
            (shrinkage, "l2 shrinkage regularization strength"),
        ] {
            if let Some(v) = v.filter(|&v| v < zero) {
                return Err(ctx.invalid(format!("{what} is not a non-negative scalar: {v:?}")));
            }
        }
        if lr_power > zero {
            return Err(ctx.invalid(format!(
                "lr_power is not a non-positive scalar: {lr_power:?}"
            )));
        }
        Ok(())
    }

    /// Updates the rows of `values` (var, then the slots) in place.
    fn run<T: Float + bytemuck::Pod>(
        &self,
        ctx: &OpContext<'_>,
        values: &mut [&mut Tensor],
        grad: &Tensor,
        rows: &Rows,
    ) -> Result<()> {
        let p = self.update.params_shifted::<T>(ctx, 1)?;
        self.check_params(ctx, &p)?;
        let g = grad.values::<T>()?;
        let inner = rows.inner;
        with_elements::<T, _>(values, |vals| {
            let n = vals.len();
            for (i, &row) in rows.rows.iter().enumerate() {
                // The rows are scattered over the variable: each is a cache miss in the
                // variable and in each slot, which the loop would otherwise wait for one
                // row at a time.
                if let Some(&ahead) = rows.rows.get(i + ROWS_AHEAD) {
                    for v in vals.iter() {
                        prefetch(&v[ahead * inner..(ahead + 1) * inner]);
                    }
                }
                // The variable and at most three slots: no allocation per row.
                let mut slices: [&mut [T]; 4] = Default::default();
                for (slice, v) in slices.iter_mut().zip(vals.iter_mut()) {
                    *slice = &mut v[row * inner..(row + 1) * inner];
                }
                self.update
                    .step(&p, &mut slices[..n], &g[i * inner..(i + 1) * inner]);
            }
        })
    }
}

impl OpKernel for SparseUpdate {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        {
            let ctx: &OpContext<'_> = ctx;
            let update = &self.update;
            let targets = update.targets(ctx)?;
            let (grad_input, _) = update.rule.grad();
            let grad = ctx.input(grad_input)?;
            let indices = ctx.input(grad_input + 1)?;
            let slots = update.rule.slots();
            let vars: Vec<&Var> = targets.vars.iter().map(|v| &**v).collect();
            let uninitialized = |i: usize| targets.uninitialized(ctx, i);
            // Always under the lock: see the module doc.
            read_modify_write_rows(&vars, true, uninitialized, |values| {
                let var = &*values[0];
                for (value, slot) in values[1..].iter().zip(&slots) {
                    check_like(ctx, &targets.names[0], var, value, slot)?;
                }
                if grad.dtype() != var.dtype() {
                    return Err(ctx.invalid(format!(
                        "variable `{}` is {} but grad is {}",
                        targets.names[0],
                        var.dtype(),
                        grad.dtype()
                    )));
                }
                let rows = self.rows(ctx, var, grad, indices)?;
                dispatch_float!(ctx, var.dtype(), T => self.run::<T>(ctx, values, grad, &rows))?;
                Ok(rows.rows)
            })?;
        }
        if self.update.form == Form::Ref {
            let reference = ctx.input(0)?.clone();
            ctx.set_output(0, reference);
        }
        Ok(())
    }
}
