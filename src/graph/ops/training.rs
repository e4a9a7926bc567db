//! Dense optimizer updates (`training_ops.cc`), each in its two forms: `ApplyX` on reference
//! variables (`Ref(T)` inputs for the variable and its slots, the variable's reference out as
//! `out`) and `ResourceApplyX` on resource variables (handles in, nothing out). Scalar
//! hyper-parameters and the gradient are values of the variable's dtype `T`.
//!
//! The signatures are TensorFlow's, input for input, so graphs written by
//! `tf.compat.v1.train.*Optimizer` import unchanged. None has a gradient.

use crate::error::Result;
use crate::graph::registry::{self, ArgType, OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

/// Every dense update: its name without `Apply`/`ResourceApply`, the variable's slots, the
/// value inputs in TensorFlow's order, and the attrs besides `T` and `use_locking`.
const UPDATES: &[(&str, &[&str], &[&str], &[&str])] = &[
    ("GradientDescent", &[], &["alpha", "delta"], &[]),
    (
        "ProximalGradientDescent",
        &[],
        &["alpha", "l1", "l2", "delta"],
        &[],
    ),
    (
        "Adadelta",
        &["accum", "accum_update"],
        &["lr", "rho", "epsilon", "grad"],
        &[],
    ),
    (
        "Adagrad",
        &["accum"],
        &["lr", "grad"],
        &["update_slots: bool = true"],
    ),
    (
        "AdagradV2",
        &["accum"],
        &["lr", "epsilon", "grad"],
        &["update_slots: bool = true"],
    ),
    (
        "ProximalAdagrad",
        &["accum"],
        &["lr", "l1", "l2", "grad"],
        &[],
    ),
    (
        "Ftrl",
        &["accum", "linear"],
        &["grad", "lr", "l1", "l2", "lr_power"],
        &["multiply_linear_by_lr: bool = false"],
    ),
    (
        "FtrlV2",
        &["accum", "linear"],
        &["grad", "lr", "l1", "l2", "l2_shrinkage", "lr_power"],
        &["multiply_linear_by_lr: bool = false"],
    ),
    (
        "Momentum",
        &["accum"],
        &["lr", "grad", "momentum"],
        &["use_nesterov: bool = false"],
    ),
    (
        "Adam",
        &["m", "v"],
        &[
            "beta1_power",
            "beta2_power",
            "lr",
            "beta1",
            "beta2",
            "epsilon",
            "grad",
        ],
        &["use_nesterov: bool = false"],
    ),
    (
        "AdaMax",
        &["m", "v"],
        &["beta1_power", "lr", "beta1", "beta2", "epsilon", "grad"],
        &[],
    ),
    (
        "RMSProp",
        &["ms", "mom"],
        &["lr", "rho", "momentum", "epsilon", "grad"],
        &[],
    ),
    (
        "CenteredRMSProp",
        &["mg", "ms", "mom"],
        &["lr", "rho", "momentum", "epsilon", "grad"],
        &[],
    ),
    (
        "AddSign",
        &["m"],
        &["lr", "alpha", "sign_decay", "beta", "grad"],
        &[],
    ),
    (
        "PowerSign",
        &["m"],
        &["lr", "logbase", "sign_decay", "beta", "grad"],
        &[],
    ),
];

pub(super) fn register(r: &mut Registry) {
    for &(rule, slots, values, attrs) in UPDATES {
        for resource in [false, true] {
            let op = if resource {
                format!("ResourceApply{rule}")
            } else {
                format!("Apply{rule}")
            };
            let var_type = if resource { "resource" } else { "Ref(T)" };
            let mut def = OpDef::build(leak(op)).input(leak(format!("var: {var_type}")));
            for slot in slots {
                def = def.input(leak(format!("{slot}: {var_type}")));
            }
            for value in values {
                def = def.input(leak(format!("{value}: T")));
            }
            if !resource {
                def = def.output("out: Ref(T)");
            }
            def = def
                .attr("T: {numbertype}")
                .attr("use_locking: bool = false");
            for attr in attrs {
                def = def.attr(attr);
            }
            // TensorFlow marks only the resource forms stateful (a ref input already orders
            // the ref forms).
            if resource {
                def = def.stateful();
            }
            def.shape(update_shape).no_grad().register(r);
        }
    }
}

/// Op and arg specs are `&'static str`; these are built from the table once, at registration.
fn leak(s: String) -> &'static str {
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
