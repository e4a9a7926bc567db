//! The ops TensorFlow's feature columns turn raw features into ids and dense tensors with
//! (`core/ops/string_ops.cc`, `math_ops.cc`, `sparse_ops.cc`): `StringToHashBucketFast` and
//! `StringToHashBucketStrong` (a string's bucket among `num_buckets`, by farmhash's
//! `Fingerprint64` or a keyed SipHash), `Bucketize` (a number's bucket among sorted
//! boundaries) and `SparseToDense` (a dense tensor from indices, values and a default).
//! `GatherNd` and `ScatterNd`, which `SparseToDense`'s gradient uses, live in `gather_nd.rs`.
//!
//! Attrs, defaults and type sets are TensorFlow 2.21's. The ids and buckets are integers, so
//! no gradient flows through the hashes or `Bucketize` (TensorFlow marks the hashes not
//! differentiable and registers nothing for `Bucketize`); `SparseToDense`'s gradient is
//! TensorFlow's `_SparseToDenseGrad`.

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::gather_nd as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::proto::attr_value::{ListValue, Value};
use crate::proto::AttrValue;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    OpDef::build("StringToHashBucketFast")
        .input("input: string")
        .output("output: int64")
        .attr("num_buckets: int >= 1")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("StringToHashBucketStrong")
        .input("input: string")
        .output("output: int64")
        .attr("num_buckets: int >= 1")
        .attr("key: list(int)")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("Bucketize")
        .input("input: T")
        .output("output: int32")
        .attr("T: {int32, int64, float, double}")
        .attr("boundaries: list(float)")
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("SparseToDense")
        .input("sparse_indices: Tindices")
        .input("output_shape: Tindices")
        .input("sparse_values: T")
        .input("default_value: T")
        .output("dense: T")
        .attr("validate_indices: bool = true")
        .attr("T: type")
        .attr("Tindices: {int32, int64}")
        .shape(sparse_to_dense_shape)
        .grad(grad::sparse_to_dense)
        .register(r);
}

/// The output is `output_shape` read as a shape (TensorFlow's `MakeShapeFromShapeTensor`).
fn sparse_to_dense_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![ctx.shape_value(1)])
}

/// A `list(float)` attr value.
fn float_list(values: &[f32]) -> AttrValue {
    AttrValue {
        value: Some(Value::List(ListValue {
            f: values.to_vec(),
            ..Default::default()
        })),
    }
}

/// Constructors for the feature-column ops.
impl Graph {
    /// `StringToHashBucketFast(input)`: each string's farmhash `Fingerprint64` modulo
    /// `num_buckets`, as int64.
    pub fn string_to_hash_bucket_fast(
        &mut self,
        input: &Output,
        num_buckets: i64,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("StringToHashBucketFast")
                .input(input)
                .attr("num_buckets", value::int(num_buckets)),
        )
    }

    /// `StringToHashBucketStrong(input)`: each string's SipHash-2-4 under `key` modulo
    /// `num_buckets`, as int64.
    pub fn string_to_hash_bucket_strong(
        &mut self,
        input: &Output,
        num_buckets: i64,
        key: [i64; 2],
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("StringToHashBucketStrong")
                .input(input)
                .attr("num_buckets", value::int(num_buckets))
                .attr("key", value::int_list(key.to_vec())),
        )
    }

    /// `Bucketize(input)`: for each element, how many of the sorted `boundaries` are at most
    /// it, as int32.
    pub fn bucketize(&mut self, input: &Output, boundaries: &[f32]) -> Result<Output> {
        self.add1(
            NodeSpec::new("Bucketize")
                .input(input)
                .attr("boundaries", float_list(boundaries)),
        )
    }

    /// `SparseToDense(sparse_indices, output_shape, sparse_values, default_value)`.
    pub fn sparse_to_dense(
        &mut self,
        sparse_indices: &Output,
        output_shape: &Output,
        sparse_values: &Output,
        default_value: &Output,
        validate_indices: bool,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("SparseToDense")
                .input(sparse_indices)
                .input(output_shape)
                .input(sparse_values)
                .input(default_value)
                .attr("validate_indices", value::bool(validate_indices)),
        )
    }
}
