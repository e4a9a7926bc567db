//! TensorList ops (`tensorflow/core/ops/list_ops.cc`): the list values TensorFlow 2's
//! functional `While` loops carry (a `tf.TensorArray` under TensorFlow 2, the accumulators of
//! a loop's gradient). Kernels: `kernels/cpu/list.rs` and `kernels/cpu/list_tensor.rs`.
//!
//! Signatures, attrs and defaults are TensorFlow 2.21's (`TensorListSetItem` with its
//! `resize_if_index_out_of_bounds`, `TensorListGetItem` with its `Tshape`). A list's handle
//! is a scalar variant. TensorFlow's shape functions also track the element shape behind a
//! list's handle; tessera's see only the ops' own `element_shape` inputs, so an element read
//! from a list built elsewhere has the shape its reading op states (unknown when it states
//! none).

use crate::error::Result;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("EmptyTensorList")
        .input("element_shape: shape_type")
        .input("max_num_elements: int32")
        .output("handle: variant")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("TensorListReserve")
        .input("element_shape: shape_type")
        .input("num_elements: int32")
        .output("handle: variant")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("TensorListPushBack")
        .input("input_handle: variant")
        .input("tensor: element_dtype")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .shape(sf::scalar)
        .register(r);
    OpDef::build("TensorListPopBack")
        .input("input_handle: variant")
        .input("element_shape: int32")
        .output("output_handle: variant")
        .output("tensor: element_dtype")
        .attr("element_dtype: type")
        .shape(|c| Ok(vec![PartialShape::new(vec![]), shape_input(c, 1)]))
        .register(r);
    OpDef::build("TensorListLength")
        .input("input_handle: variant")
        .output("length: int32")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("TensorListElementShape")
        .input("input_handle: variant")
        .output("element_shape: shape_type")
        .attr("shape_type: {int32, int64}")
        .shape(|_| Ok(vec![PartialShape::unknown()]))
        .no_grad()
        .register(r);
    OpDef::build("TensorListGetItem")
        .input("input_handle: variant")
        .input("index: int32")
        .input("element_shape: Tshape")
        .output("item: element_dtype")
        .attr("element_dtype: type")
        .attr("Tshape: {int32, int64} = DT_INT32")
        .shape(|c| Ok(vec![shape_input(c, 2)]))
        .register(r);
    OpDef::build("TensorListSetItem")
        .input("input_handle: variant")
        .input("index: int32")
        .input("item: element_dtype")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .attr("resize_if_index_out_of_bounds: bool = false")
        .shape(sf::scalar)
        .register(r);
    OpDef::build("TensorListResize")
        .input("input_handle: variant")
        .input("size: int32")
        .output("output_handle: variant")
        .shape(|c| {
            c.with_rank(1, 0)?;
            sf::scalar(c)
        })
        .register(r);
    OpDef::build("TensorListStack")
        .input("input_handle: variant")
        .input("element_shape: int32")
        .output("tensor: element_dtype")
        .attr("element_dtype: type")
        .attr("num_elements: int = -1")
        .shape(|c| {
            let n = crate::graph::attr::int_or(c.node, "num_elements", -1)?;
            let first = usize::try_from(n).ok();
            Ok(vec![prepend(first, &shape_input(c, 1))])
        })
        .register(r);
    OpDef::build("TensorListFromTensor")
        .input("tensor: element_dtype")
        .input("element_shape: shape_type")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(sf::scalar)
        .register(r);
    OpDef::build("TensorListGather")
        .input("input_handle: variant")
        .input("indices: int32")
        .input("element_shape: int32")
        .output("values: element_dtype")
        .attr("element_dtype: type")
        .shape(|c| {
            let indices = c.input(1);
            let element = shape_input(c, 2);
            Ok(vec![match (indices.dims(), element.dims()) {
                (Some(i), Some(e)) => PartialShape::new([i, e].concat()),
                _ => PartialShape::unknown(),
            }])
        })
        .register(r);
    OpDef::build("TensorListScatter")
        .input("tensor: element_dtype")
        .input("indices: int32")
        .input("element_shape: shape_type")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(sf::scalar)
        .register(r);
    OpDef::build("TensorListScatterV2")
        .input("tensor: element_dtype")
        .input("indices: int32")
        .input("element_shape: shape_type")
        .input("num_elements: int32")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(sf::scalar)
        .register(r);
    OpDef::build("TensorListScatterIntoExistingList")
        .input("input_handle: variant")
        .input("tensor: element_dtype")
        .input("indices: int32")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .shape(|c| {
            if c.input(1).rank() == Some(0) {
                return Err(c.error("tensor must be at least a vector"));
            }
            c.with_rank(2, 1)?;
            sf::scalar(c)
        })
        .register(r);
    OpDef::build("TensorListConcat")
        .input("input_handle: variant")
        .output("tensor: element_dtype")
        .output("lengths: int64")
        .attr("element_dtype: type")
        .attr("element_shape: shape = { unknown_rank: true }")
        .shape(|c| {
            let element = crate::graph::attr::shape(c.node, "element_shape")?;
            concat_shape(c, &element)
        })
        .register(r);
    OpDef::build("TensorListConcatV2")
        .input("input_handle: variant")
        .input("element_shape: shape_type")
        .input("leading_dims: int64")
        .output("tensor: element_dtype")
        .output("lengths: int64")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(|c| concat_shape(c, &shape_input(c, 1)))
        .register(r);
    OpDef::build("TensorListSplit")
        .input("tensor: element_dtype")
        .input("element_shape: shape_type")
        .input("lengths: int64")
        .output("output_handle: variant")
        .attr("element_dtype: type")
        .attr("shape_type: {int32, int64}")
        .shape(|c| {
            if c.input(0).rank() == Some(0) {
                return Err(c.error("tensor must be at least a vector"));
            }
            c.with_rank(2, 1)?;
            sf::scalar(c)
        })
        .register(r);
    OpDef::build("TensorListConcatLists")
        .input("input_a: variant")
        .input("input_b: variant")
        .attr("element_dtype: type")
        .output("output: variant")
        .shape(sf::merge_all)
        .no_grad()
        .register(r);
}

/// Input `i` read as a list op's shape tensor: the scalar -1 is an unknown shape, a vector
/// holds the sizes (-1 for unknown ones).
fn shape_input(c: &ShapeCtx<'_>, i: usize) -> PartialShape {
    if c.input(i).rank() == Some(0) {
        return PartialShape::unknown();
    }
    c.shape_value(i)
}

/// `[first] + shape` (unknown when the shape's rank is).
fn prepend(first: Option<usize>, shape: &PartialShape) -> PartialShape {
    match shape.dims() {
        Some(dims) => PartialShape::new([&[first][..], dims].concat()),
        None => PartialShape::unknown(),
    }
}

/// A concat's outputs: `[?] + element_shape[1..]` and a vector of lengths.
fn concat_shape(c: &ShapeCtx<'_>, element: &PartialShape) -> Result<Vec<PartialShape>> {
    let tensor = match element.dims() {
        Some([]) => return Err(c.error("elements must be at least vectors to concatenate")),
        Some(dims) => PartialShape::new([&[None][..], &dims[1..]].concat()),
        None => PartialShape::unknown(),
    };
    Ok(vec![tensor, PartialShape::new(vec![None])])
}
