//! `SerializeSparse` and `DeserializeSparse` (`core/ops/sparse_ops.cc`), with which tf.data
//! carries a sparse tensor as a vector of three strings or variants.
//!
//! Attrs, defaults and type sets are TensorFlow 2.21's; like TensorFlow, neither has a
//! gradient.

use crate::error::Result;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("SerializeSparse")
        .input("sparse_indices: int64")
        .input("sparse_values: T")
        .input("sparse_shape: int64")
        .output("serialized_sparse: out_type")
        .attr("T: type")
        .attr("out_type: {string, variant} = DT_STRING")
        .shape(|_| Ok(vec![PartialShape::new(vec![Some(3)])]))
        .no_grad()
        .register(r);
    OpDef::build("DeserializeSparse")
        .input("serialized_sparse: Tserialized")
        .output("sparse_indices: int64")
        .output("sparse_values: dtype")
        .output("sparse_shape: int64")
        .attr("dtype: type")
        .attr("Tserialized: {string, variant} = DT_STRING")
        .shape(deserialize_shape)
        .no_grad()
        .register(r);
}

/// Indices `[?, ?]`, values `[?]`, shape `[?]` (the rank is only known at run time).
fn deserialize_shape(_: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![
        PartialShape::new(vec![None, None]),
        PartialShape::new(vec![None]),
        PartialShape::new(vec![None]),
    ])
}
