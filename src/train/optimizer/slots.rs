//! The variables an optimizer adds to the graph besides its updates: slot variables (one per
//! trained variable and slot, colocated with it), the global step, and lookups that turn a
//! graph's `VarHandleOp`s back into [`Variable`]s.
//!
//! Names follow TensorFlow's `slot_creator`: the slot of `w1` for optimizer `Adam` is
//! `w1/Adam`, a second one `w1/Adam_1`, initialized by `w1/Adam/Initializer/zeros`. Every slot
//! node carries `_class = ["loc:@w1"]` and `w1`'s device, so placement keeps slot and variable
//! on the same task and the update never moves a slot over the network.

use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::graph::{Graph, NodeSpec, Output, Variable};
use crate::tensor::{DType, Shape};

/// The name of the global step variable (TensorFlow's `tf.compat.v1.GraphKeys.GLOBAL_STEP`).
pub const GLOBAL_STEP: &str = "global_step";

/// How a slot starts: TensorFlow's `zeros`, `ones` or constant initializers, which also name
/// the initializer node (`w1/Adam/Initializer/zeros`, `w1/Adagrad/Initializer/Const`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SlotInit {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element `v`.
    Constant(f64),
}

impl SlotInit {
    fn parts(self) -> (&'static str, f64) {
        match self {
            SlotInit::Zeros => ("zeros", 0.0),
            SlotInit::Ones => ("ones", 1.0),
            SlotInit::Constant(v) => ("Const", v),
        }
    }
}

/// Returns the dtype and fully known shape of `var`'s value, from its `VarHandleOp` or
/// `VariableV2`.
pub fn var_dtype_shape(g: &Graph, var: &Variable) -> Result<(DType, Shape)> {
    let node = g
        .node(&var.handle.node)
        .ok_or_else(|| Status::not_found(format!("graph has no variable `{}`", var.handle.node)))?;
    let dtype = attr::dtype(node, "dtype")?;
    let shape = attr::shape(node, "shape")?.to_shape().ok_or_else(|| {
        Status::invalid_argument(format!(
            "variable `{}` has a partly unknown shape {}; optimizer slots need a fully known \
             shape, so give the variable's initial value a static shape",
            node.name,
            attr::shape(node, "shape").unwrap_or_default()
        ))
    })?;
    Ok((dtype, shape))
}

/// Creates a slot variable of `var` named `<var>/<slot>` (made unique) with `var`'s dtype,
/// shape and kind (resource or reference), colocated with `var` and initialized by the global
/// initializer.
pub fn create_slot(g: &mut Graph, var: &Variable, slot: &str, init: SlotInit) -> Result<Variable> {
    let (dtype, shape) = var_dtype_shape(g, var)?;
    let var_name = var.handle.node.clone();
    g.with_name_scope("", |g| {
        let name = g.unique_name(&format!("{var_name}/{slot}"));
        g.with_colocation(&var_name, |g| {
            let initial = filled(g, &format!("{name}/Initializer"), &shape, dtype, init)?;
            g.variable_with_kind(&format!("{name}/"), &initial, var.kind())
        })
    })
}

/// Creates a variable that is no slot of one variable (Adam's `beta1_power`): named `name`
/// (made unique), a scalar of `dtype` starting at `initial`, colocated with `colocate_with`
/// and of its kind.
pub fn create_non_slot(
    g: &mut Graph,
    name: &str,
    dtype: DType,
    initial: f64,
    colocate_with: &Variable,
) -> Result<Variable> {
    let with = colocate_with.handle.node.clone();
    g.with_name_scope("", |g| {
        let name = g.unique_name(name);
        g.with_colocation(&with, |g| {
            let v = g.scalar(&format!("{name}/initial_value/"), dtype, initial)?;
            g.variable_with_kind(&format!("{name}/"), &v, colocate_with.kind())
        })
    })
}

/// Adds `<scope>/<zeros|ones|Const>`: a value of `shape` filled by `init` (a `Const` for a
/// scalar, a `Fill` of a shape and a scalar otherwise, so a large slot costs no large
/// constant in the graph).
fn filled(
    g: &mut Graph,
    scope: &str,
    shape: &Shape,
    dtype: DType,
    init: SlotInit,
) -> Result<Output> {
    let (kind, v) = init.parts();
    let name = format!("{scope}/{kind}");
    if shape.rank() == 0 {
        return g.scalar(&format!("{name}/"), dtype, v);
    }
    let dims: Vec<i64> = shape.dims().iter().map(|&d| d as i64).collect();
    let dims = g.const_vec_i32(&format!("{name}/shape_as_tensor/"), &dims)?;
    let v = g.scalar(&format!("{name}/Const/"), dtype, v)?;
    g.add1(
        NodeSpec::new("Fill")
            .name(&format!("{name}/"))
            .input(&dims)
            .input(&v),
    )
}

/// Returns the variable whose `VarHandleOp` (or `VariableV2`) is `name`, with the initializer
/// (`name/Assign`) and read (`name/Read/ReadVariableOp`, or `name/read`) that
/// [`Graph::variable`] creates.
pub fn variable_from_handle(g: &Graph, name: &str) -> Result<Variable> {
    let node = g
        .node(name)
        .ok_or_else(|| Status::not_found(format!("graph has no variable `{name}`")))?;
    let read = match node.op.as_str() {
        "VarHandleOp" => format!("{name}/Read/ReadVariableOp"),
        "VariableV2" => format!("{name}/read"),
        _ => {
            return Err(Status::invalid_argument(format!(
                "node `{name}` is a {}, not a variable (VarHandleOp or VariableV2)",
                node.op
            )))
        }
    };
    let initializer = format!("{name}/Assign");
    if g.node(&initializer).is_none() {
        return Err(Status::not_found(format!(
            "variable `{name}` has no initializer `{initializer}`; create variables with \
             Graph::variable"
        )));
    }
    Ok(Variable {
        handle: g.output(name, 0)?,
        initializer,
        value: g.output(&read, 0)?,
    })
}

/// Returns the graph's trainable variables in creation order: the floating-point
/// `VarHandleOp`s and `VariableV2`s that are not colocated with another variable. Slots, Adam's power
/// accumulators (colocated with what they serve) and the int64 global step are left out,
/// which is what TensorFlow's `TRAINABLE_VARIABLES` collection holds for graphs built with
/// the optimizers here.
pub fn trainable_variables(g: &Graph) -> Result<Vec<Variable>> {
    let mut vars = Vec::new();
    for node in g.nodes() {
        if !matches!(node.op.as_str(), "VarHandleOp" | "VariableV2") || node.name == GLOBAL_STEP {
            continue;
        }
        if !attr::dtype(node, "dtype")?.is_float() {
            continue;
        }
        let own = format!("loc:@{}", node.name);
        let colocated = attr::string_list(node, "_class")
            .map(|c| c.iter().any(|c| c != &own))
            .unwrap_or(false);
        if !colocated {
            vars.push(variable_from_handle(g, &node.name)?);
        }
    }
    Ok(vars)
}

/// Returns the global step if the graph has one.
pub fn global_step(g: &Graph) -> Option<Variable> {
    variable_from_handle(g, GLOBAL_STEP).ok()
}

/// TensorFlow's `get_or_create_global_step`: the int64 scalar variable `global_step` (of the
/// graph's [`VariableKind`](crate::graph::VariableKind)), initialized to 0 by
/// `global_step/Initializer/zeros`. It is placed like any variable (the device setter sends it
/// to a ps task).
pub fn get_or_create_global_step(g: &mut Graph) -> Result<Variable> {
    if let Some(node) = g.node(GLOBAL_STEP) {
        let is_var = matches!(node.op.as_str(), "VarHandleOp" | "VariableV2");
        if !is_var || attr::dtype(node, "dtype")? != DType::Int64 {
            return Err(Status::invalid_argument(format!(
                "node `{GLOBAL_STEP}` exists but is a {} of {}, not an int64 variable; \
                 rename it so the global step can be created",
                node.op,
                attr::dtype(node, "dtype")
                    .map(|d| d.to_string())
                    .unwrap_or_else(|_| "no dtype".into())
            )));
        }
        return variable_from_handle(g, GLOBAL_STEP);
    }
    g.with_name_scope("", |g| {
        let zero = g.with_colocation(GLOBAL_STEP, |g| {
            g.add1(
                NodeSpec::new("Const")
                    .name(&format!("{GLOBAL_STEP}/Initializer/zeros/"))
                    .attr("dtype", value::dtype(DType::Int64))
                    .attr(
                        "value",
                        value::tensor(crate::tensor::Tensor::scalar(0i64).to_proto()),
                    ),
            )
        })?;
        g.variable(&format!("{GLOBAL_STEP}/"), &zero)
    })
}
