//! Queue and gradient-accumulator ops (`data_flow_ops.cc`): the definitions `io.rs` does not
//! already register (`QueueEnqueueV2`, `QueueDequeueManyV2`, `QueueSizeV2`; the sparse
//! accumulator `SparseConditionalAccumulator`, `SparseAccumulatorApplyGradient`,
//! `SparseAccumulatorTakeGradient` and the reference-handle `AccumulatorSetGlobalStep`,
//! `AccumulatorNumAccumulated`, which TensorFlow shares between both kinds) and the builder
//! methods synchronous replication uses; and `NcclAllReduce` (`nccl_ops.cc`), which in-graph
//! towers use to sum gradients across devices. Kernels: `kernels/cpu/queue.rs`,
//! `kernels/cpu/accumulator.rs`, `kernels/cpu/collective.rs` and `kernels/cuda/nccl.rs`.

use crate::error::{Result, Status};
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::indexed_slices::IndexedSlices;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn as sf;
use crate::proto::AttrValue;
use crate::tensor::{DType, PartialShape};

pub(super) fn register(r: &mut Registry) {
    OpDef::build("QueueEnqueueV2")
        .input("handle: resource")
        .input("components: Tcomponents")
        .attr("Tcomponents: list(type) >= 1")
        .attr("timeout_ms: int = -1")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("QueueDequeueManyV2")
        .input("handle: resource")
        .input("n: int32")
        .output("components: component_types")
        .attr("component_types: list(type) >= 1")
        .attr("timeout_ms: int = -1")
        .stateful()
        .no_grad()
        .register(r);
    // tessera takes the types its kernels reduce (TensorFlow's also takes half).
    OpDef::build("NcclAllReduce")
        .input("input: T")
        .output("data: T")
        .attr("reduction: {'min', 'max', 'prod', 'sum'}")
        .attr("T: {float, double, int32, int64}")
        .attr("num_devices: int")
        .attr("shared_name: string")
        .stateful()
        .shape(sf::unchanged)
        .no_grad()
        .register(r);
    OpDef::build("QueueSizeV2")
        .input("handle: resource")
        .output("size: int32")
        .stateful()
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    register_sparse_accumulator(r);
}

/// The sparse accumulator's ops and the reference-handle ops both kinds share, with
/// TensorFlow's signatures (its ref forms are not marked stateful: their ref edges tie them to
/// the accumulator). TensorFlow's kernels take float and double (and half) values.
fn register_sparse_accumulator(r: &mut Registry) {
    OpDef::build("SparseConditionalAccumulator")
        .output("handle: Ref(string)")
        .attr("dtype: {numbertype}")
        .attr("shape: shape")
        .attr("container: string = ''")
        .attr("shared_name: string = ''")
        .attr("reduction_type: {'MEAN', 'SUM'} = 'MEAN'")
        .stateful()
        .shape(|_| Ok(vec![PartialShape::new(vec![Some(2)])]))
        .no_grad()
        .register(r);
    OpDef::build("SparseAccumulatorApplyGradient")
        .input("handle: Ref(string)")
        .input("local_step: int64")
        .input("gradient_indices: int64")
        .input("gradient_values: dtype")
        .input("gradient_shape: int64")
        .attr("dtype: {numbertype}")
        .attr("has_known_shape: bool")
        .shape(|c| {
            c.with_rank(1, 0)?;
            sf::no_outputs(c)
        })
        .no_grad()
        .register(r);
    OpDef::build("SparseAccumulatorTakeGradient")
        .input("handle: Ref(string)")
        .input("num_required: int32")
        .output("indices: int64")
        .output("values: dtype")
        .output("shape: int64")
        .attr("dtype: {numbertype}")
        .shape(|c| {
            c.with_rank(1, 0)?;
            // The rows and the dense shape come from the accumulator, unknown here.
            Ok(vec![PartialShape::unknown(); 3])
        })
        .no_grad()
        .register(r);
    OpDef::build("AccumulatorSetGlobalStep")
        .input("handle: Ref(string)")
        .input("new_global_step: int64")
        .shape(|c| {
            c.with_rank(1, 0)?;
            sf::no_outputs(c)
        })
        .no_grad()
        .register(r);
    OpDef::build("AccumulatorNumAccumulated")
        .input("handle: Ref(string)")
        .output("num_accumulated: int32")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
}

/// Where a blocking resource's waits end when neither the op nor the step sets a deadline:
/// tessera's `_wait_timeout_ms` attr on the creating op (`None` keeps the runtime default).
fn wait_attr(spec: NodeSpec, wait_ms: Option<u64>) -> NodeSpec {
    match wait_ms {
        Some(ms) => spec.attr("_wait_timeout_ms", value::int(ms as i64)),
        None => spec,
    }
}

/// `spec` with the attrs `extra` besides.
fn with_attrs(spec: NodeSpec, extra: &[(&str, AttrValue)]) -> NodeSpec {
    extra
        .iter()
        .fold(spec, |spec, (key, attr)| spec.attr(key, attr.clone()))
}

/// What the two accumulator-creating ops share: their attrs.
struct AccumulatorAttrs<'a> {
    dtype: DType,
    shape: &'a PartialShape,
    shared_name: &'a str,
    reduction_type: &'a str,
    wait_ms: Option<u64>,
}

impl AccumulatorAttrs<'_> {
    /// The node `op` named `name` with these attrs.
    fn spec(&self, op: &str, name: &str) -> NodeSpec {
        let spec = NodeSpec::new(op)
            .name(name)
            .attr("dtype", value::dtype(self.dtype))
            .attr("shape", value::shape(self.shape))
            .attr("shared_name", value::string(self.shared_name))
            .attr("reduction_type", value::string(self.reduction_type));
        wait_attr(spec, self.wait_ms)
    }
}

/// Constructors for queues and accumulators, and the all-reduce.
impl Graph {
    /// `NcclAllReduce(input)`: one of the `num_devices` nodes, each on its own device, that
    /// share `shared_name`; each outputs the `reduction` (`"sum"`, `"prod"`, `"min"` or
    /// `"max"`) of all their inputs. Every member must run in the same step.
    pub fn nccl_all_reduce(
        &mut self,
        input: &Output,
        reduction: &str,
        num_devices: usize,
        shared_name: &str,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("NcclAllReduce")
                .input(input)
                .attr("reduction", value::string(reduction))
                .attr("num_devices", value::int(num_devices as i64))
                .attr("shared_name", value::string(shared_name)),
        )
    }

    /// `FIFOQueueV2` named `name` of scalar-or-shaped components; `capacity` `None` is
    /// unbounded; `shared_name` shares it across sessions on the device.
    pub fn fifo_queue(
        &mut self,
        name: &str,
        component_types: &[DType],
        shapes: &[PartialShape],
        capacity: Option<usize>,
        shared_name: &str,
        wait_ms: Option<u64>,
    ) -> Result<Output> {
        let shapes = crate::proto::AttrValue {
            value: Some(crate::proto::attr_value::Value::List(
                crate::proto::attr_value::ListValue {
                    shape: shapes.iter().map(PartialShape::to_proto).collect(),
                    ..Default::default()
                },
            )),
        };
        let spec = NodeSpec::new("FIFOQueueV2")
            .name(name)
            .attr("component_types", value::dtype_list(component_types))
            .attr("shapes", shapes)
            .attr("capacity", value::int(capacity.map_or(-1, |c| c as i64)))
            .attr("shared_name", value::string(shared_name));
        self.add1(wait_attr(spec, wait_ms))
    }

    /// `QueueEnqueueV2(queue, components)`; returns the node name.
    pub fn queue_enqueue(
        &mut self,
        name: &str,
        queue: &Output,
        components: &[Output],
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("QueueEnqueueV2")
                .name(name)
                .input(queue)
                .input_list(components),
        )
    }

    /// `QueueEnqueueManyV2(queue, components)`; returns the node name.
    pub fn queue_enqueue_many(
        &mut self,
        name: &str,
        queue: &Output,
        components: &[Output],
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("QueueEnqueueManyV2")
                .name(name)
                .input(queue)
                .input_list(components),
        )
    }

    /// `QueueDequeueV2(queue)`: one element, one output per component.
    pub fn queue_dequeue(
        &mut self,
        name: &str,
        queue: &Output,
        component_types: &[DType],
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("QueueDequeueV2")
                .name(name)
                .input(queue)
                .attr("component_types", value::dtype_list(component_types)),
        )
    }

    /// `QueueDequeueManyV2(queue, n)`: `n` elements stacked per component.
    pub fn queue_dequeue_many(
        &mut self,
        name: &str,
        queue: &Output,
        n: &Output,
        component_types: &[DType],
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("QueueDequeueManyV2")
                .name(name)
                .input(queue)
                .input(n)
                .attr("component_types", value::dtype_list(component_types)),
        )
    }

    /// `QueueCloseV2(queue)`; returns the node name.
    pub fn queue_close(
        &mut self,
        name: &str,
        queue: &Output,
        cancel_pending_enqueues: bool,
    ) -> Result<String> {
        self.add_op(NodeSpec::new("QueueCloseV2").name(name).input(queue).attr(
            "cancel_pending_enqueues",
            value::bool(cancel_pending_enqueues),
        ))
    }

    /// `QueueSizeV2(queue)`.
    pub fn queue_size(&mut self, name: &str, queue: &Output) -> Result<Output> {
        self.add1(NodeSpec::new("QueueSizeV2").name(name).input(queue))
    }

    /// `ResourceConditionalAccumulator` named `name` for gradients of `dtype` and `shape`,
    /// shared as `shared_name`, averaging (`MEAN`) or summing (`SUM`).
    pub fn conditional_accumulator(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &PartialShape,
        shared_name: &str,
        reduction_type: &str,
        wait_ms: Option<u64>,
    ) -> Result<Output> {
        let attrs = AccumulatorAttrs {
            dtype,
            shape,
            shared_name,
            reduction_type,
            wait_ms,
        };
        self.add1(attrs.spec("ResourceConditionalAccumulator", name))
    }

    /// `ResourceAccumulatorApplyGradient(handle, local_step, gradient)`; returns the node name.
    pub fn accumulator_apply_gradient(
        &mut self,
        handle: &Output,
        local_step: &Output,
        gradient: &Output,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new("ResourceAccumulatorApplyGradient")
                .input(handle)
                .input(local_step)
                .input(gradient),
        )
    }

    /// `ResourceAccumulatorTakeGradient(handle, num_required)` of gradients of `dtype`, with
    /// its `num_required` constant named `<node>/num_required` as TensorFlow names it, and the
    /// extra attrs `extra` (`_timeout_ms`).
    pub fn accumulator_take_gradient(
        &mut self,
        handle: &Output,
        num_required: i32,
        dtype: DType,
        extra: &[(&str, AttrValue)],
    ) -> Result<Output> {
        let op = "ResourceAccumulatorTakeGradient";
        let mut outputs = self.take_gradient(op, handle, num_required, dtype, extra)?;
        outputs
            .pop()
            .ok_or_else(|| Status::internal(format!("{op} made no output")))
    }

    /// A take of `num_required` gradients of `dtype` by `op`, its `num_required` constant
    /// named `<node>/num_required`; returns its outputs.
    fn take_gradient(
        &mut self,
        op: &str,
        handle: &Output,
        num_required: i32,
        dtype: DType,
        extra: &[(&str, AttrValue)],
    ) -> Result<Vec<Output>> {
        let name = self.reserve_name(op);
        let n = self.const_i32(&format!("{name}/num_required/"), &[], &[num_required])?;
        let spec = NodeSpec::new(op)
            .name(&format!("{name}/"))
            .input(handle)
            .input(&n)
            .attr("dtype", value::dtype(dtype));
        self.add_node(with_attrs(spec, extra))
    }

    /// Sets the global step of the accumulator behind `handle`, either kind:
    /// `ResourceAccumulatorSetGlobalStep(handle, step)` for a resource handle,
    /// `AccumulatorSetGlobalStep` for a sparse accumulator's reference handle. Named `name`;
    /// returns the node name.
    pub fn accumulator_set_global_step(
        &mut self,
        name: &str,
        handle: &Output,
        step: &Output,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new(&by_handle(handle, "AccumulatorSetGlobalStep"))
                .name(name)
                .input(handle)
                .input(step),
        )
    }

    /// The number of gradients the accumulator behind `handle` (either kind) holds:
    /// `ResourceAccumulatorNumAccumulated(handle)` or `AccumulatorNumAccumulated(handle)`.
    pub fn accumulator_num_accumulated(&mut self, handle: &Output) -> Result<Output> {
        self.add1(NodeSpec::new(&by_handle(handle, "AccumulatorNumAccumulated")).input(handle))
    }

    /// `SparseConditionalAccumulator` named `name` for sparse gradients of `dtype` whose dense
    /// shape is `shape`, shared as `shared_name`, averaging (`MEAN`, row by row) or summing
    /// (`SUM`); its output is the accumulator's reference handle.
    pub fn sparse_conditional_accumulator(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &PartialShape,
        shared_name: &str,
        reduction_type: &str,
        wait_ms: Option<u64>,
    ) -> Result<Output> {
        let attrs = AccumulatorAttrs {
            dtype,
            shape,
            shared_name,
            reduction_type,
            wait_ms,
        };
        self.add1(attrs.spec("SparseConditionalAccumulator", name))
    }

    /// `SparseAccumulatorApplyGradient(handle, local_step, indices, values, dense_shape)` of
    /// `slices`, whose indices and dense shape must already be int64 (TensorFlow's Python
    /// casts them first: see `SyncReplicasOptimizer`); `has_known_shape` is true. Extra attrs
    /// (`_replica`) go in `extra`. Returns the node name.
    pub fn sparse_accumulator_apply_gradient(
        &mut self,
        handle: &Output,
        local_step: &Output,
        slices: &IndexedSlices,
        extra: &[(&str, AttrValue)],
    ) -> Result<String> {
        let spec = NodeSpec::new("SparseAccumulatorApplyGradient")
            .input(handle)
            .input(local_step)
            .input(&slices.indices)
            .input(&slices.values)
            .input(&slices.dense_shape)
            .attr("has_known_shape", value::bool(true));
        self.add_op(with_attrs(spec, extra))
    }

    /// `SparseAccumulatorTakeGradient(handle, num_required)` of gradients of `dtype`, with its
    /// `num_required` constant named `<node>/num_required` as TensorFlow names it, and the
    /// extra attrs `extra` (`_timeout_ms`); returns the rows as [`IndexedSlices`] (int64
    /// indices and dense shape).
    pub fn sparse_accumulator_take_gradient(
        &mut self,
        handle: &Output,
        num_required: i32,
        dtype: DType,
        extra: &[(&str, AttrValue)],
    ) -> Result<IndexedSlices> {
        let op = "SparseAccumulatorTakeGradient";
        let outputs = self.take_gradient(op, handle, num_required, dtype, extra)?;
        match <[Output; 3]>::try_from(outputs) {
            Ok([indices, values, dense_shape]) => Ok(IndexedSlices {
                values,
                indices,
                dense_shape,
            }),
            Err(outputs) => Err(Status::internal(format!(
                "{op} made {} outputs, not 3",
                outputs.len()
            ))),
        }
    }
}

/// `op` for a reference handle (a sparse accumulator's), `Resource<op>` for a resource one.
fn by_handle(handle: &Output, op: &str) -> String {
    if handle.dtype == DType::Resource {
        format!("Resource{op}")
    } else {
        op.to_string()
    }
}
