//! TensorArray and stack ops (`tensorflow/core/ops/data_flow_ops.cc`): the per-step arrays
//! and stacks that TensorFlow 1 while loops and their gradients use. Kernels:
//! `kernels/cpu/tensor_array.rs` and `kernels/cpu/stack.rs`.
//!
//! Signatures, attrs and defaults are TensorFlow's. Shape functions are too, with one
//! difference: tessera does not track the element shape behind an array's handle, so a read
//! has an unknown shape where TensorFlow knows it from the creating op's `element_shape`.
//! Handles are vectors of 2 in the shape functions, as TensorFlow declares them (its
//! string handles were `[container, name]`), though the value is one resource handle.
//!
//! The checks of these declarations are TensorFlow 2.21's registered op definitions: every
//! TensorArray op and every `*V2` stack op is stateful (a read with `clear_after_read`, a pop
//! change what the next one sees, so two alike must never be merged); the deprecated
//! `StackPush`, `StackPop` and `StackClose` are not, as TensorFlow declares them.

use crate::error::Result;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    register_arrays(r);
    register_stacks(r);
}

fn register_arrays(r: &mut Registry) {
    OpDef::build("TensorArrayV3")
        .input("size: int32")
        .attr("dtype: type")
        .attr("element_shape: shape = { unknown_rank: true }")
        .attr("dynamic_size: bool = false")
        .attr("clear_after_read: bool = true")
        .attr("identical_element_shapes: bool = false")
        .attr("tensor_array_name: string = ''")
        .output("handle: resource")
        .output("flow: float")
        .stateful()
        .shape(|c| {
            c.with_rank(0, 0)?;
            Ok(vec![handle(), PartialShape::new(vec![])])
        })
        .no_grad()
        .register(r);
    OpDef::build("TensorArrayGradV3")
        .input("handle: resource")
        .input("flow_in: float")
        .output("grad_handle: resource")
        .output("flow_out: float")
        .attr("source: string")
        .stateful()
        .shape(grad_shape)
        .no_grad()
        .register(r);
    OpDef::build("TensorArrayGradWithShape")
        .input("handle: resource")
        .input("flow_in: float")
        .input("shape_to_prepend: int32")
        .output("grad_handle: resource")
        .output("flow_out: float")
        .attr("source: string")
        .stateful()
        .shape(grad_shape)
        .no_grad()
        .register(r);
    OpDef::build("TensorArrayWriteV3")
        .input("handle: resource")
        .input("index: int32")
        .input("value: T")
        .input("flow_in: float")
        .output("flow_out: float")
        .attr("T: type")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            c.with_rank(1, 0)?;
            c.with_rank(3, 0)?;
            sf::scalar(c)
        })
        .register(r);
    OpDef::build("TensorArrayReadV3")
        .input("handle: resource")
        .input("index: int32")
        .input("flow_in: float")
        .output("value: dtype")
        .attr("dtype: type")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            c.with_rank(1, 0)?;
            c.with_rank(2, 0)?;
            Ok(vec![PartialShape::unknown()])
        })
        .register(r);
    OpDef::build("TensorArrayGatherV3")
        .input("handle: resource")
        .input("indices: int32")
        .input("flow_in: float")
        .output("value: dtype")
        .attr("dtype: type")
        .attr("element_shape: shape = { unknown_rank: true }")
        .stateful()
        .shape(gather_shape)
        .register(r);
    OpDef::build("TensorArrayScatterV3")
        .input("handle: resource")
        .input("indices: int32")
        .input("value: T")
        .input("flow_in: float")
        .output("flow_out: float")
        .attr("T: type")
        .stateful()
        .shape(scatter_shape)
        .register(r);
    OpDef::build("TensorArrayConcatV3")
        .input("handle: resource")
        .input("flow_in: float")
        .output("value: dtype")
        .output("lengths: int64")
        .attr("dtype: type")
        .attr("element_shape_except0: shape = { unknown_rank: true }")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            c.with_rank(1, 0)?;
            Ok(vec![PartialShape::unknown(), PartialShape::new(vec![None])])
        })
        .register(r);
    OpDef::build("TensorArraySplitV3")
        .input("handle: resource")
        .input("value: T")
        .input("lengths: int64")
        .input("flow_in: float")
        .output("flow_out: float")
        .attr("T: type")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            c.with_rank(2, 1)?;
            c.with_rank(3, 0)?;
            sf::scalar(c)
        })
        .register(r);
    OpDef::build("TensorArraySizeV3")
        .input("handle: resource")
        .input("flow_in: float")
        .output("size: int32")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            sf::scalar(c)
        })
        .no_grad()
        .register(r);
    OpDef::build("TensorArrayCloseV3")
        .input("handle: resource")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            sf::no_outputs(c)
        })
        .no_grad()
        .register(r);
}

fn register_stacks(r: &mut Registry) {
    OpDef::build("StackV2")
        .input("max_size: int32")
        .output("handle: resource")
        .attr("elem_type: type")
        .attr("stack_name: string = ''")
        .stateful()
        .shape(|_| Ok(vec![handle()]))
        .no_grad()
        .register(r);
    OpDef::build("StackPushV2")
        .input("handle: resource")
        .input("elem: T")
        .output("output: T")
        .attr("T: type")
        .attr("swap_memory: bool = false")
        .stateful()
        .shape(|c| Ok(vec![c.input(1)]))
        .no_grad()
        .register(r);
    OpDef::build("StackPopV2")
        .input("handle: resource")
        .output("elem: elem_type")
        .attr("elem_type: type")
        .stateful()
        .shape(|_| Ok(vec![PartialShape::unknown()]))
        .no_grad()
        .register(r);
    OpDef::build("StackCloseV2")
        .input("handle: resource")
        .stateful()
        .shape(|c| {
            check_handle(c)?;
            sf::no_outputs(c)
        })
        .no_grad()
        .register(r);
    // The deprecated forms, whose handle is a reference to `["_stacks", name]`.
    OpDef::build("Stack")
        .output("handle: Ref(string)")
        .attr("elem_type: type")
        .attr("stack_name: string = ''")
        .stateful()
        .shape(|_| Ok(vec![handle()]))
        .no_grad()
        .register(r);
    OpDef::build("StackPush")
        .input("handle: Ref(string)")
        .input("elem: T")
        .output("output: T")
        .attr("T: type")
        .attr("swap_memory: bool = false")
        .shape(|c| Ok(vec![c.input(1)]))
        .no_grad()
        .register(r);
    OpDef::build("StackPop")
        .input("handle: Ref(string)")
        .output("elem: elem_type")
        .attr("elem_type: type")
        .shape(|_| Ok(vec![PartialShape::unknown()]))
        .no_grad()
        .register(r);
    OpDef::build("StackClose")
        .input("handle: Ref(string)")
        .shape(|c| {
            check_handle(c)?;
            sf::no_outputs(c)
        })
        .no_grad()
        .register(r);
}

/// The shape TensorFlow gives a TensorArray or stack handle: a vector of 2.
fn handle() -> PartialShape {
    PartialShape::new(vec![Some(2)])
}

/// Fails unless input 0 (a handle) can be a vector of 2.
fn check_handle(c: &ShapeCtx<'_>) -> Result<()> {
    let h = c.with_rank(0, 1)?;
    match h.dims() {
        Some([Some(n)]) if *n != 2 => Err(c.error(format!(
            "the handle must be a vector of 2 elements, got shape {h}"
        ))),
        _ => Ok(()),
    }
}

fn grad_shape(c: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    check_handle(c)?;
    Ok(vec![handle(), PartialShape::new(vec![])])
}

/// `[len(indices)] + element_shape`.
fn gather_shape(c: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    check_handle(c)?;
    let indices = c.with_rank(1, 1)?;
    c.with_rank(2, 0)?;
    let element = crate::graph::attr::shape(c.node, "element_shape")?;
    Ok(vec![match element.dims() {
        Some(dims) => {
            let mut out = indices.dims().map(<[_]>::to_vec).unwrap_or(vec![None]);
            out.extend_from_slice(dims);
            PartialShape::new(out)
        }
        None => PartialShape::unknown(),
    }])
}

/// The value has one row per index.
fn scatter_shape(c: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    check_handle(c)?;
    let indices = c.with_rank(1, 1)?;
    c.with_rank(3, 0)?;
    let value = c.input(2);
    if let (Some([Some(n)]), Some(&[Some(rows), ..])) = (indices.dims(), value.dims()) {
        if *n != rows {
            return Err(c.error(format!(
                "{n} indices for a value of shape {value}: need one index per row"
            )));
        }
    }
    sf::scalar(c)
}
