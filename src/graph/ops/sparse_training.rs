//! Sparse optimizer updates (`training_ops.cc`): `SparseApplyX` on reference variables and
//! `ResourceSparseApplyX` on resource variables change only the rows of `var` (and of its
//! slots) that `indices` names, with `grad` holding one row per index. Each is its dense
//! rule's signature ([`UPDATES`]) with `indices: Tindices` right after the gradient (which the
//! sparse ProximalGradientDescent calls `grad`, not `delta`), and a `Tindices: {int32, int64}`
//! attr; GradientDescent, Adam, AdaMax, AddSign and PowerSign have no sparse form (their
//! optimizers update through the scatter ops). None has a gradient.

use super::training::{leak, UpdateDef, UPDATES};
use crate::error::Result;
use crate::graph::registry::{self, ArgType, OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

/// The dense rules TensorFlow also has in sparse form.
pub const SPARSE_RULES: &[&str] = &[
    "ProximalGradientDescent",
    "Adadelta",
    "Adagrad",
    "AdagradV2",
    "AdagradDA",
    "ProximalAdagrad",
    "Ftrl",
    "FtrlV2",
    "Momentum",
    "RMSProp",
    "CenteredRMSProp",
];

pub(super) fn register(r: &mut Registry) {
    for update in UPDATES.iter().filter(|u| SPARSE_RULES.contains(&u.rule)) {
        for resource in [false, true] {
            let op = if resource {
                format!("ResourceSparseApply{}", update.rule)
            } else {
                format!("SparseApply{}", update.rule)
            };
            let var_type = if resource { "resource" } else { "Ref(T)" };
            let mut def = OpDef::build(leak(op)).input(leak(format!("var: {var_type}")));
            for slot in update.slots {
                def = def.input(leak(format!("{slot}: {var_type}")));
            }
            for &value in update.values {
                let value = if value == "delta" { "grad" } else { value };
                def = def.input(leak(UpdateDef::value_spec(value)));
                if value == "grad" {
                    def = def.input("indices: Tindices");
                }
            }
            if !resource {
                def = def.output("out: Ref(T)");
            }
            def = def
                .attr("T: {numbertype}")
                .attr("Tindices: {int32, int64}")
                .attr("use_locking: bool = false");
            for attr in update.attrs {
                def = def.attr(attr);
            }
            // As for the dense forms: the resource form is stateful, the ref form is tied to
            // its variables by its ref edges.
            if resource {
                def = def.stateful();
            }
            def.shape(sparse_update_shape).no_grad().register(r);
        }
    }
}

/// The shape function of every sparse update (TensorFlow's `Apply*ShapeFn` with `sparse`):
/// the variable and its slots share one shape; `indices` is a vector as long as `grad`'s first
/// dimension; `grad`'s other dimensions are the variable's; every hyper-parameter is a
/// scalar. A ref form outputs the variable's shape.
fn sparse_update_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let def = registry::global()
        .get(&ctx.node.op)
        .ok_or_else(|| ctx.error("not a registered optimizer update"))?;
    let mut shape = PartialShape::unknown();
    let mut grad = None;
    for (i, arg) in def.inputs.iter().enumerate() {
        let this = if arg.ty == ArgType::Fixed(DType::Resource) {
            ctx.handle_shapes
                .get(i)
                .cloned()
                .flatten()
                .unwrap_or_else(PartialShape::unknown)
        } else if arg.is_ref {
            ctx.input(i)
        } else if arg.name == "grad" {
            grad = Some(i);
            continue;
        } else if arg.name == "indices" {
            continue;
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
    let g = grad.expect("every sparse update takes a gradient");
    let indices = ctx
        .with_rank(g + 1, 1)
        .map_err(|_| ctx.error("indices must be one-dimensional"))?;
    let grad_shape = ctx.input(g);
    if let Some(dims) = grad_shape.dims() {
        let Some((&first, rest)) = dims.split_first() else {
            return Err(ctx.error(format!("grad must be at least 1-D, got {grad_shape}")));
        };
        let rows = indices.dims().and_then(|d| d[0]);
        if sf::merge_dim(first, rows).is_none() {
            return Err(ctx.error(format!(
                "grad must be the same size as indices in the first dimension: grad \
                 {grad_shape}, indices {indices}"
            )));
        }
        let trailing = PartialShape::new(
            std::iter::once(None)
                .chain(rest.iter().copied())
                .collect::<Vec<_>>(),
        );
        shape = sf::merge(ctx, &shape, &trailing).map_err(|_| {
            ctx.error(format!(
                "grad's dimensions after the first must be the variable's: var {shape}, grad \
                 {grad_shape}"
            ))
        })?;
    }
    Ok(if def.outputs.is_empty() {
        Vec::new()
    } else {
        vec![shape]
    })
}
