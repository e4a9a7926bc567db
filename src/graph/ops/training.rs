//! Dense optimizer updates (`training_ops.cc`), each in its two forms: `ApplyX` on reference
//! variables (`Ref(T)` inputs for the variable and its slots, the variable's reference out as
//! `out`) and `ResourceApplyX` on resource variables (handles in, nothing out). Scalar
//! hyper-parameters and the gradient are values of the variable's dtype `T` (AdagradDA's
//! `global_step` is int64).
//!
//! The signatures are TensorFlow's, input for input, so graphs written by
//! `tf.compat.v1.train.*Optimizer` import unchanged. None has a gradient.

use crate::error::Result;
use crate::graph::registry::{self, ArgType, OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

/// One dense update rule, as `training_ops.cc` declares its two ops (`sparse_training.rs`
/// derives the sparse forms from the same table).
pub(super) struct UpdateDef {
    /// The op's name without `Apply` / `ResourceApply`.
    pub(super) rule: &'static str,
    /// The variable's slots (after `var`).
    pub(super) slots: &'static [&'static str],
    /// The value inputs after the slots, in TensorFlow's order: of type `T` unless the entry
    /// names its type (`global_step: int64`).
    pub(super) values: &'static [&'static str],
    /// The attrs besides `T` and `use_locking`.
    pub(super) attrs: &'static [&'static str],
}

impl UpdateDef {
    /// The input spec of value input `value` (an entry of [`UpdateDef::values`]).
    pub(super) fn value_spec(value: &str) -> String {
        if value.contains(':') {
            value.to_string()
        } else {
            format!("{value}: T")
        }
    }
}

/// Every dense update.
pub(super) const UPDATES: &[UpdateDef] = &[
    UpdateDef {
        rule: "GradientDescent",
        slots: &[],
        values: &["alpha", "delta"],
        attrs: &[],
    },
    UpdateDef {
        rule: "ProximalGradientDescent",
        slots: &[],
        values: &["alpha", "l1", "l2", "delta"],
        attrs: &[],
    },
    UpdateDef {
        rule: "Adadelta",
        slots: &["accum", "accum_update"],
        values: &["lr", "rho", "epsilon", "grad"],
        attrs: &[],
    },
    UpdateDef {
        rule: "Adagrad",
        slots: &["accum"],
        values: &["lr", "grad"],
        attrs: &["update_slots: bool = true"],
    },
    UpdateDef {
        rule: "AdagradV2",
        slots: &["accum"],
        values: &["lr", "epsilon", "grad"],
        attrs: &["update_slots: bool = true"],
    },
    UpdateDef {
        rule: "AdagradDA",
        slots: &["gradient_accumulator", "gradient_squared_accumulator"],
        values: &["grad", "lr", "l1", "l2", "global_step: int64"],
        attrs: &[],
    },
    UpdateDef {
        rule: "ProximalAdagrad",
        slots: &["accum"],
        values: &["lr", "l1", "l2", "grad"],
        attrs: &[],
    },
    UpdateDef {
        rule: "Ftrl",
        slots: &["accum", "linear"],
        values: &["grad", "lr", "l1", "l2", "lr_power"],
        attrs: &["multiply_linear_by_lr: bool = false"],
    },
    UpdateDef {
        rule: "FtrlV2",
        slots: &["accum", "linear"],
        values: &["grad", "lr", "l1", "l2", "l2_shrinkage", "lr_power"],
        attrs: &["multiply_linear_by_lr: bool = false"],
    },
    UpdateDef {
        rule: "Momentum",
        slots: &["accum"],
        values: &["lr", "grad", "momentum"],
        attrs: &["use_nesterov: bool = false"],
    },
    UpdateDef {
        rule: "Adam",
        slots: &["m", "v"],
        values: &[
            "beta1_power",
            "beta2_power",
            "lr",
            "beta1",
            "beta2",
            "epsilon",
            "grad",
        ],
        attrs: &["use_nesterov: bool = false"],
    },
    UpdateDef {
        rule: "AdaMax",
        slots: &["m", "v"],
        values: &["beta1_power", "lr", "beta1", "beta2", "epsilon", "grad"],
        attrs: &[],
    },
    UpdateDef {
        rule: "RMSProp",
        slots: &["ms", "mom"],
        values: &["lr", "rho", "momentum", "epsilon", "grad"],
        attrs: &[],
    },
    UpdateDef {
        rule: "CenteredRMSProp",
        slots: &["mg", "ms", "mom"],
        values: &["lr", "rho", "momentum", "epsilon", "grad"],
        attrs: &[],
    },
    UpdateDef {
        rule: "AddSign",
        slots: &["m"],
        values: &["lr", "alpha", "sign_decay", "beta", "grad"],
        attrs: &[],
    },
    UpdateDef {
        rule: "PowerSign",
        slots: &["m"],
        values: &["lr", "logbase", "sign_decay", "beta", "grad"],
        attrs: &[],
    },
];

pub(super) fn register(r: &mut Registry) {
    for update in UPDATES {
        let UpdateDef {
            rule,
            slots,
            values,
            attrs,
        } = update;
        for resource in [false, true] {
            let op = if resource {
                format!("ResourceApply{rule}")
            } else {
                format!("Apply{rule}")
            };
            let var_type = if resource { "resource" } else { "Ref(T)" };
            let mut def = OpDef::build(leak(op)).input(leak(format!("var: {var_type}")));
            for slot in *slots {
                def = def.input(leak(format!("{slot}: {var_type}")));
            }
            for value in *values {
                def = def.input(leak(UpdateDef::value_spec(value)));
            }
            if !resource {
                def = def.output("out: Ref(T)");
            }
            def = def
                .attr("T: {numbertype}")
                .attr("use_locking: bool = false");
            for attr in *attrs {
                def = def.attr(attr);
            }
            // A resource form touches its variables only through handles, so it is marked
            // stateful; a ref form is tied to its variables by its ref edges (and TensorFlow
            // declares it without SetIsStateful).
            if resource {
                def = def.stateful();
            }
            def.shape(update_shape).no_grad().register(r);
        }
    }
}

/// Op and arg specs are `&'static str`; these are built from the table once, at registration.
pub(super) fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The shape function of every update (TensorFlow's `Apply*ShapeFn`): the variable, its slots
/// (the shapes behind resource handles, where known) and the gradient share one shape, and every
/// hyper-parameter is a scalar. A ref form outputs the variable's shape.
fn update_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let def = registry::global()
        .get(&ctx.node.op)
        .ok_or_else(|| ctx.error("not a registered optimizer update"))?;
    let mut shape = PartialShape::unknown();
    for (i, arg) in def.inputs.iter().enumerate() {
        let this = if arg.ty == ArgType::Fixed(DType::Resource) {
            ctx.handle_shapes
                .get(i)
                .cloned()
                .flatten()
                .unwrap_or_else(PartialShape::unknown)
        } else if arg.is_ref || matches!(arg.name.as_str(), "grad" | "delta") {
            ctx.input(i)
        } else {
            ctx.with_rank(i, 0).map_err(|_| {
                ctx.error(format!("{} is not a scalar: {}", arg.name, ctx.input(i)))
            })?;
            continue;
        };
        shape = sf::merge(ctx, &shape, &this).map_err(|_| {
            ctx.error(format!(
                "var and {} do not have the same shape: {shape} vs. {this}",
                arg.name
            ))
        })?;
    }
    Ok(if def.outputs.is_empty() {
        Vec::new()
    } else {
        vec![shape]
    })
}
