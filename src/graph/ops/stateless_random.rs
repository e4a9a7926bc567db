//! The stateless random ops of TensorFlow 2.21's initializers (`core/ops/stateless_random_ops.cc`,
//! `stateless_random_ops_v2.cc`): `StatelessRandomGetKeyCounter` turns a seed pair into a
//! Philox key and counter, `StatelessRandomUniformV2` draws uniform samples from them.
//!
//! Attrs, defaults and type sets are TensorFlow's. Neither op is differentiable (TensorFlow
//! registers no gradient for them), and both are stateless: the same inputs give the same
//! outputs.

use crate::error::Result;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("StatelessRandomGetKeyCounter")
        .input("seed: Tseed")
        .output("key: uint64")
        .output("counter: uint64")
        .attr("Tseed: {int32, int64} = DT_INT64")
        .shape(|_| {
            Ok(vec![
                PartialShape::new(vec![Some(1)]),
                PartialShape::new(vec![Some(2)]),
            ])
        })
        .no_grad()
        .register(r);
    OpDef::build("StatelessRandomUniformV2")
        .input("shape: Tshape")
        .input("key: uint64")
        .input("counter: uint64")
        .input("alg: int32")
        .output("output: dtype")
        .attr("dtype: {half, bfloat16, float, double} = DT_FLOAT")
        .attr("Tshape: {int32, int64} = DT_INT32")
        .shape(from_shape_value)
        .no_grad()
        .register(r);
}

/// The output's shape is the `shape` input read as one.
fn from_shape_value(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![ctx.shape_value(0)])
}
