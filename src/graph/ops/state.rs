//! Stateful ops: resource variables (`resource_variable_ops.cc`), TensorFlow 1's reference
//! variables and their updates (`state_ops.cc`, `RefIdentity` from `array_ops.cc`), random
//! numbers (`random_ops.cc`), and the internal `_Send` / `_Recv` pairs the master inserts
//! between partitions (`sendrecv_ops.cc`). The optimizer updates live in `training.rs`.
//!
//! A reference variable's ops pass the variable itself along `Ref(T)` edges: `VariableV2`
//! outputs a reference, `Assign` and the `Scatter*` updates take one and output it again, so a
//! chain `Assign -> ScatterAdd` updates one variable in order. Every other input of these ops
//! is a value.

use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::array as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

pub(super) fn register(r: &mut Registry) {
    OpDef::build("VarHandleOp")
        .output("resource: resource")
        .attr("container: string = ''")
        .attr("shared_name: string = ''")
        .attr("debug_name: string = ''")
        .attr("dtype: type")
        .attr("shape: shape")
        .attr("allowed_devices: list(string) = []")
        .stateful()
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("ReadVariableOp")
        .input("resource: resource")
        .output("value: dtype")
        .attr("dtype: type")
        .stateful()
        .shape(read_variable_shape)
        .grad(grad::read_variable)
        .register(r);
    // tessera's own: the reads of a SaveV2's resource variables, taken at one instant (see
    // `exec::consistent_save`), so that no checkpoint holds a variable and its slots from
    // different applies of one update.
    OpDef::build("_ReadVariablesTogether")
        .input("resources: N * resource")
        .output("values: dtypes")
        .attr("N: int >= 1")
        .attr("dtypes: list(type) >= 1")
        .stateful()
        .no_grad()
        .register(r);
    OpDef::build("AssignVariableOp")
        .input("resource: resource")
        .input("value: dtype")
        .attr("dtype: type")
        .attr("validate_shape: bool = false")
        .stateful()
        .shape(assign_shape)
        .no_grad()
        .register(r);
    for op in ["AssignAddVariableOp", "AssignSubVariableOp"] {
        OpDef::build(op)
            .input("resource: resource")
            .input("value: dtype")
            .attr("dtype: type")
            .stateful()
            .shape(assign_shape)
            .no_grad()
            .register(r);
    }
    OpDef::build("VarIsInitializedOp")
        .input("resource: resource")
        .output("is_initialized: bool")
        .stateful()
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("DestroyResourceOp")
        .input("resource: resource")
        .attr("ignore_lookup_error: bool = true")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    register_reference_variables(r);
    for op in ["RandomStandardNormal", "TruncatedNormal", "RandomUniform"] {
        OpDef::build(op)
            .input("shape: T")
            .output("output: dtype")
            .attr("seed: int = 0")
            .attr("seed2: int = 0")
            .attr("dtype: {float, double}")
            .attr("T: {int32, int64}")
            .stateful()
            .shape(sf::from_shape_input)
            .no_grad()
            .register(r);
    }
    for op in ["_Send", "_HostSend"] {
        OpDef::build(op)
            .input("tensor: T")
            .attr("T: type")
            .attr("tensor_name: string")
            .attr("send_device: string")
            .attr("send_device_incarnation: int")
            .attr("recv_device: string")
            .attr("client_terminated: bool = false")
            .stateful()
            .shape(sf::no_outputs)
            .no_grad()
            .register(r);
    }
    for op in ["_Recv", "_HostRecv"] {
        OpDef::build(op)
            .output("tensor: tensor_type")
            .attr("tensor_type: type")
            .attr("tensor_name: string")
            .attr("send_device: string")
            .attr("send_device_incarnation: int")
            .attr("recv_device: string")
            .attr("client_terminated: bool = false")
            .stateful()
            .no_grad()
            .register(r);
    }
}

/// The reference-variable ops, declared as `state_ops.cc` and `array_ops.cc` declare them.
fn register_reference_variables(r: &mut Registry) {
    OpDef::build("VariableV2")
        .output("ref: Ref(dtype)")
        .attr("shape: shape")
        .attr("dtype: type")
        .attr("container: string = ''")
        .attr("shared_name: string = ''")
        .stateful()
        .shape(explicit_shape)
        .no_grad()
        .register(r);
    OpDef::build("Variable")
        .output("ref: Ref(dtype)")
        .attr("shape: shape")
        .attr("dtype: type")
        .attr("container: string = ''")
        .attr("shared_name: string = ''")
        .stateful()
        .shape(legacy_variable_shape)
        .no_grad()
        .register(r);
    OpDef::build("IsVariableInitialized")
        .input("ref: Ref(dtype)")
        .output("is_initialized: bool")
        .attr("dtype: type")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("TemporaryVariable")
        .output("ref: Ref(dtype)")
        .attr("shape: shape")
        .attr("dtype: type")
        .attr("var_name: string = ''")
        .stateful()
        .shape(explicit_shape)
        .no_grad()
        .register(r);
    OpDef::build("DestroyTemporaryVariable")
        .input("ref: Ref(T)")
        .output("value: T")
        .attr("T: type")
        .attr("var_name: string")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("Assign")
        .input("ref: Ref(T)")
        .input("value: T")
        .output("output_ref: Ref(T)")
        .attr("T: type")
        .attr("validate_shape: bool = true")
        .attr("use_locking: bool = true")
        .shape(ref_assign_shape)
        .no_grad()
        .register(r);
    for op in ["AssignAdd", "AssignSub"] {
        OpDef::build(op)
            .input("ref: Ref(T)")
            .input("value: T")
            .output("output_ref: Ref(T)")
            .attr("T: {numbertype}")
            .attr("use_locking: bool = false")
            .shape(sf::merge_all)
            .no_grad()
            .register(r);
    }
    // TensorFlow's T sets: any type for ScatterUpdate, numbertype for the arithmetic,
    // {half, bfloat16, float, double, int32, int64} for ScatterMin/Max (tessera has no half
    // types, so the last two sets read the same here).
    let scatters: [(&'static str, &'static str, &'static str); 7] = [
        ("ScatterUpdate", "T: type", "use_locking: bool = true"),
        ("ScatterAdd", "T: {numbertype}", "use_locking: bool = false"),
        ("ScatterSub", "T: {numbertype}", "use_locking: bool = false"),
        ("ScatterMul", "T: {numbertype}", "use_locking: bool = false"),
        ("ScatterDiv", "T: {numbertype}", "use_locking: bool = false"),
        (
            "ScatterMin",
            "T: {float, double, int32, int64}",
            "use_locking: bool = false",
        ),
        (
            "ScatterMax",
            "T: {float, double, int32, int64}",
            "use_locking: bool = false",
        ),
    ];
    for (op, t, use_locking) in scatters {
        OpDef::build(op)
            .input("ref: Ref(T)")
            .input("indices: Tindices")
            .input("updates: T")
            .output("output_ref: Ref(T)")
            .attr(t)
            .attr("Tindices: {int32, int64}")
            .attr(use_locking)
            .shape(scatter_update_shape)
            .no_grad()
            .register(r);
    }
    OpDef::build("CountUpTo")
        .input("ref: Ref(T)")
        .output("output: T")
        .attr("limit: int")
        .attr("T: {int32, int64}")
        .shape(count_up_to_shape)
        .no_grad()
        .register(r);
    OpDef::build("RefIdentity")
        .input("input: Ref(T)")
        .output("output: Ref(T)")
        .attr("T: type")
        .shape(sf::unchanged)
        .grad(grad::identity)
        .register(r);
}

/// `VariableV2`, `TemporaryVariable`: the `shape` attr.
fn explicit_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![attr::shape(ctx.node, "shape")?])
}

/// The legacy `Variable`: its `shape` attr, except that a scalar shape means an unknown one
/// (the op cannot tell them apart).
fn legacy_variable_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let shape = attr::shape(ctx.node, "shape")?;
    Ok(vec![if shape.rank().unwrap_or(0) == 0 {
        PartialShape::unknown()
    } else {
        shape
    }])
}

/// `Assign`: with `validate_shape` the variable and the value share one shape; without it the
/// variable takes the value's shape.
fn ref_assign_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    if !attr::bool_or(ctx.node, "validate_shape", true)? {
        return Ok(vec![ctx.input(1)]);
    }
    sf::merge(ctx, &ctx.input(0), &ctx.input(1))
        .map(|s| vec![s])
        .map_err(|_| {
            ctx.error(format!(
                "Assign requires shapes of both tensors to match. lhs shape= {} rhs shape= {}; \
                 pass validate_shape=False to change the variable's shape",
                ctx.input(0),
                ctx.input(1)
            ))
        })
}

/// `Scatter*`: `updates` has shape `indices.shape + ref.shape[1:]` (or is a scalar); the output
/// is the variable.
fn scatter_update_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (var, indices) = (ctx.input(0), ctx.input(1));
    let (Some(var_dims), Some(index_dims)) = (var.dims(), indices.dims()) else {
        return Ok(vec![var]);
    };
    let Some((_, inner)) = var_dims.split_first() else {
        return Err(ctx.error("the variable must be at least 1-D, got a scalar"));
    };
    if ctx.input(2).rank() != Some(0) {
        let want = PartialShape::new([index_dims, inner].concat());
        sf::merge(ctx, &ctx.input(2), &want).map_err(|_| {
            ctx.error(format!(
                "updates must have shape indices.shape + ref.shape[1:] = {want} (or be a \
                 scalar), got {}",
                ctx.input(2)
            ))
        })?;
    }
    Ok(vec![var])
}

/// `CountUpTo`: the variable is a scalar and so is the output.
fn count_up_to_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![ctx.with_rank(0, 0)?])
}

fn read_variable_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![ctx
        .handle_shapes
        .first()
        .cloned()
        .flatten()
        .unwrap_or_else(PartialShape::unknown)])
}

fn assign_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    // Assigning a value of another shape is allowed only with validate_shape=false (the
    // default); AssignAdd/Sub must match.
    if ctx.node.op != "AssignVariableOp" {
        if let Some(Some(var)) = ctx.handle_shapes.first() {
            sf::merge(ctx, var, &ctx.input(1)).map_err(|_| {
                ctx.error(format!(
                    "value of shape {} does not match the variable's shape {var}",
                    ctx.input(1)
                ))
            })?;
        }
    }
    Ok(Vec::new())
}

/// Constructors for variable updates and random tensors.
impl Graph {
    /// `AssignVariableOp(handle, value)`; returns the node name.
    pub fn assign_variable(&mut self, handle: &Output, value: &Output) -> Result<String> {
        self.add_op(NodeSpec::new("AssignVariableOp").input(handle).input(value))
    }
    /// `AssignAddVariableOp(handle, value)`; returns the node name.
    pub fn assign_add_variable(&mut self, handle: &Output, value: &Output) -> Result<String> {
        self.add_op(
            NodeSpec::new("AssignAddVariableOp")
                .input(handle)
                .input(value),
        )
    }
    /// `ResourceApplyGradientDescent(var, alpha, delta)`; returns the node name.
    pub fn apply_gradient_descent(
        &mut self,
        var: &Output,
        alpha: &Output,
        delta: &Output,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("ResourceApplyGradientDescent")
                .input(var)
                .input(alpha)
                .input(delta),
        )
    }
    /// A random op (`RandomUniform`, `RandomStandardNormal`, `TruncatedNormal`) of `shape`.
    pub fn random(
        &mut self,
        op: &str,
        shape: &Output,
        dtype: DType,
        seed: i64,
        seed2: i64,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new(op)
                .input(shape)
                .attr("dtype", value::dtype(dtype))
                .attr("seed", value::int(seed))
                .attr("seed2", value::int(seed2)),
        )
    }
}
