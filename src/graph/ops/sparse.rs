//! The ops of embedding models (`core/ops/math_ops.cc`, `array_ops.cc`, `data_flow_ops.cc`,
//! `resource_variable_ops.cc`): row reads and updates of resource variables (`ResourceGather`,
//! `ResourceScatter*`, `VariableShape`, `DisableCopyOnRead`), segment reductions (unsorted,
//! sorted and sparse, with the sparse ones' gradient ops), `Unique` / `UniqueV2`,
//! `DynamicPartition` and `DynamicStitch` / `ParallelDynamicStitch`; `GatherV2` itself lives
//! with the slicing ops. Attrs, defaults and type sets are TensorFlow 2.21's (tessera has no
//! 16-bit or complex types, so those drop out of the sets).

use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::sparse as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

pub(super) fn register(r: &mut Registry) {
    register_resource_rows(r);
    register_segments(r);
    OpDef::build("Unique")
        .input("x: T")
        .output("y: T")
        .output("idx: out_idx")
        .attr("T: type")
        .attr("out_idx: {int32, int64} = DT_INT32")
        .shape(unique_shape)
        .no_grad()
        .register(r);
    OpDef::build("UniqueV2")
        .input("x: T")
        .input("axis: Taxis")
        .output("y: T")
        .output("idx: out_idx")
        .attr("T: type")
        .attr("Taxis: {int32, int64} = DT_INT64")
        .attr("out_idx: {int32, int64} = DT_INT32")
        .shape(unique_shape)
        .no_grad()
        .register(r);
    OpDef::build("DynamicPartition")
        .input("data: T")
        .input("partitions: int32")
        .output("outputs: num_partitions * T")
        .attr("num_partitions: int >= 1")
        .attr("T: type")
        .shape(partition_shape)
        .grad(grad::dynamic_partition)
        .register(r);
    for op in ["DynamicStitch", "ParallelDynamicStitch"] {
        OpDef::build(op)
            .input("indices: N * int32")
            .input("data: N * T")
            .output("merged: T")
            .attr("N: int >= 1")
            .attr("T: type")
            .shape(stitch_shape)
            .grad(grad::dynamic_stitch)
            .register(r);
    }
}

fn register_resource_rows(r: &mut Registry) {
    OpDef::build("ResourceGather")
        .input("resource: resource")
        .input("indices: Tindices")
        .output("output: dtype")
        .attr("batch_dims: int = 0")
        .attr("validate_indices: bool = true")
        .attr("dtype: type")
        .attr("Tindices: {int32, int64}")
        .stateful()
        .shape(resource_gather_shape)
        .grad(grad::resource_gather)
        .register(r);
    let scatters: [(&'static str, &'static str); 7] = [
        ("ResourceScatterUpdate", "dtype: type"),
        ("ResourceScatterAdd", "dtype: {numbertype}"),
        ("ResourceScatterSub", "dtype: {numbertype}"),
        ("ResourceScatterMul", "dtype: {numbertype}"),
        ("ResourceScatterDiv", "dtype: {numbertype}"),
        ("ResourceScatterMin", "dtype: {numbertype}"),
        ("ResourceScatterMax", "dtype: {numbertype}"),
    ];
    for (op, dtype) in scatters {
        OpDef::build(op)
            .input("resource: resource")
            .input("indices: Tindices")
            .input("updates: dtype")
            .attr(dtype)
            .attr("Tindices: {int32, int64}")
            .stateful()
            .shape(sf::no_outputs)
            .no_grad()
            .register(r);
    }
    OpDef::build("VariableShape")
        .input("input: resource")
        .output("output: out_type")
        .attr("out_type: {int32, int64} = DT_INT32")
        .stateful()
        .shape(variable_shape_shape)
        .no_grad()
        .register(r);
    OpDef::build("DisableCopyOnRead")
        .input("resource: resource")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
}

fn register_segments(r: &mut Registry) {
    for (op, t) in [
        ("UnsortedSegmentSum", "T: {numbertype}"),
        ("UnsortedSegmentProd", "T: {numbertype}"),
        ("UnsortedSegmentMax", "T: {realnumbertype}"),
        ("UnsortedSegmentMin", "T: {realnumbertype}"),
    ] {
        OpDef::build(op)
            .input("data: T")
            .input("segment_ids: Tindices")
            .input("num_segments: Tnumsegments")
            .output("output: T")
            .attr(t)
            .attr("Tindices: {int32, int64}")
            .attr("Tnumsegments: {int32, int64} = DT_INT32")
            .shape(unsorted_segment_shape)
            .grad(grad::unsorted_segment)
            .register(r);
    }
    for (op, t) in [
        ("SegmentSum", "T: {numbertype}"),
        ("SegmentMean", "T: {numbertype}"),
        ("SegmentProd", "T: {numbertype}"),
        ("SegmentMax", "T: {realnumbertype}"),
        ("SegmentMin", "T: {realnumbertype}"),
    ] {
        OpDef::build(op)
            .input("data: T")
            .input("segment_ids: Tindices")
            .output("output: T")
            .attr(t)
            .attr("Tindices: {int32, int64}")
            .shape(segment_shape)
            .grad(grad::segment)
            .register(r);
    }
    for (op, t) in [
        ("SparseSegmentSum", "T: {realnumbertype}"),
        ("SparseSegmentMean", "T: {float, double}"),
        ("SparseSegmentSqrtN", "T: {float, double}"),
    ] {
        OpDef::build(op)
            .input("data: T")
            .input("indices: Tidx")
            .input("segment_ids: Tsegmentids")
            .output("output: T")
            .attr(t)
            .attr("Tidx: {int32, int64} = DT_INT32")
            .attr("Tsegmentids: {int32, int64} = DT_INT32")
            .attr("sparse_gradient: bool = false")
            .shape(segment_shape)
            .grad(grad::sparse_segment)
            .register(r);
    }
    for (op, t) in [
        ("SparseSegmentSumWithNumSegments", "T: {realnumbertype}"),
        ("SparseSegmentMeanWithNumSegments", "T: {float, double}"),
        ("SparseSegmentSqrtNWithNumSegments", "T: {float, double}"),
    ] {
        OpDef::build(op)
            .input("data: T")
            .input("indices: Tidx")
            .input("segment_ids: Tsegmentids")
            .input("num_segments: Tnumsegments")
            .output("output: T")
            .attr(t)
            .attr("Tidx: {int32, int64} = DT_INT32")
            .attr("Tnumsegments: {int32, int64} = DT_INT32")
            .attr("Tsegmentids: {int32, int64} = DT_INT32")
            .attr("sparse_gradient: bool = false")
            .shape(sparse_segment_num_shape)
            .grad(grad::sparse_segment)
            .register(r);
    }
    for op in [
        "SparseSegmentSumGrad",
        "SparseSegmentMeanGrad",
        "SparseSegmentSqrtNGrad",
    ] {
        OpDef::build(op)
            .input("grad: T")
            .input("indices: Tidx")
            .input("segment_ids: Tsegmentids")
            .input("output_dim0: int32")
            .output("output: T")
            .attr("T: {float, double}")
            .attr("Tidx: {int32, int64} = DT_INT32")
            .attr("Tsegmentids: {int32, int64} = DT_INT32")
            .shape(sparse_segment_grad_shape)
            .no_grad()
            .register(r);
    }
    for op in [
        "SparseSegmentSumGradV2",
        "SparseSegmentMeanGradV2",
        "SparseSegmentSqrtNGradV2",
    ] {
        OpDef::build(op)
            .input("grad: T")
            .input("indices: Tidx")
            .input("segment_ids: Tsegmentids")
            .input("dense_output_dim0: int32")
            .output("output: T")
            .output("sorted_unique_indices: Tidx")
            .attr("T: {float, double}")
            .attr("Tidx: {int32, int64} = DT_INT32")
            .attr("Tsegmentids: {int32, int64} = DT_INT32")
            .shape(sparse_segment_grad_v2_shape)
            .no_grad()
            .register(r);
    }
}

/// `dim + rest`: a leading dimension before the dims of `tail` from `from` on (unknown rank
/// when `tail`'s is).
fn lead(dim: Option<usize>, tail: &PartialShape, from: usize) -> PartialShape {
    match tail.dims() {
        Some(d) if d.len() >= from => {
            let mut out = vec![dim];
            out.extend_from_slice(&d[from..]);
            PartialShape::new(out)
        }
        _ => PartialShape::unknown(),
    }
}

fn resource_gather_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let var = ctx.handle_shapes.first().cloned().flatten();
    let indices = ctx.input(1);
    let b = attr::int_or(ctx.node, "batch_dims", 0)?;
    let (Some(var), Some(i), true) = (var, indices.dims(), b >= 0) else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let Some(p) = var.dims() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    let b = b as usize;
    if p.len() <= b || i.len() < b {
        return Err(ctx.error(format!(
            "batch_dims {b} needs a variable of rank above {b} and indices of rank {b} or more; \
             got {var} and {indices}"
        )));
    }
    let mut out = p[..b].to_vec();
    out.extend_from_slice(&i[b..]);
    out.extend_from_slice(&p[b + 1..]);
    Ok(vec![PartialShape::new(out)])
}

fn variable_shape_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let rank = ctx
        .handle_shapes
        .first()
        .cloned()
        .flatten()
        .and_then(|s| s.rank());
    Ok(vec![PartialShape::new(vec![rank])])
}

fn unique_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let x = ctx.input(0);
    if ctx.node.op == "Unique" {
        let x = ctx.with_rank(0, 1)?;
        return Ok(vec![PartialShape::new(vec![None]), x]);
    }
    let y = x
        .rank()
        .map_or_else(PartialShape::unknown, PartialShape::unknown_dims);
    Ok(vec![y, PartialShape::new(vec![None])])
}

fn unsorted_segment_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (data, ids) = (ctx.input(0), ctx.input(1));
    let rows = ctx.scalar_value(2).and_then(|n| usize::try_from(n).ok());
    let Some(r) = ids.rank() else {
        return Ok(vec![PartialShape::unknown()]);
    };
    if let (Some(d), Some(i)) = (data.dims(), ids.dims()) {
        let prefix = d.len() >= i.len()
            && d.iter()
                .zip(i)
                .all(|(a, b)| sf::merge_dim(*a, *b).is_some());
        if !prefix {
            return Err(ctx.error(format!(
                "data.shape = {data} does not start with segment_ids.shape = {ids}"
            )));
        }
    }
    Ok(vec![lead(rows, &data, r)])
}

fn segment_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![lead(None, &ctx.input(0), 1)])
}

fn sparse_segment_num_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let rows = ctx.scalar_value(3).and_then(|n| usize::try_from(n).ok());
    Ok(vec![lead(rows, &ctx.input(0), 1)])
}

fn sparse_segment_grad_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let rows = ctx.scalar_value(3).and_then(|n| usize::try_from(n).ok());
    Ok(vec![lead(rows, &ctx.input(0), 1)])
}

fn sparse_segment_grad_v2_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(vec![
        lead(None, &ctx.input(0), 1),
        PartialShape::new(vec![None]),
    ])
}

fn partition_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (data, partitions) = (ctx.input(0), ctx.input(1));
    let piece = match partitions.rank() {
        Some(r) => lead(None, &data, r),
        None => PartialShape::unknown(),
    };
    Ok(vec![piece; ctx.num_outputs])
}

fn stitch_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let n = ctx.inputs.len() / 2;
    let (indices, data) = (ctx.input(0), ctx.input(n));
    Ok(vec![match indices.rank() {
        Some(r) => lead(None, &data, r),
        None => PartialShape::unknown(),
    }])
}

/// Constructors for the embedding ops.
impl Graph {
    /// `ResourceGather(handle, indices)` with `batch_dims`, reading a variable of `dtype`.
    pub fn resource_gather(
        &mut self,
        handle: &Output,
        indices: &Output,
        dtype: DType,
        batch_dims: i64,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("ResourceGather")
                .input(handle)
                .input(indices)
                .attr("dtype", value::dtype(dtype))
                .attr("batch_dims", value::int(batch_dims)),
        )
    }

    /// A row update of a resource variable, `op` one of `ResourceScatterUpdate`,
    /// `ResourceScatterAdd`, `...Sub`, `...Mul`, `...Div`, `...Min`, `...Max`; returns the node
    /// name.
    pub fn resource_scatter(
        &mut self,
        op: &str,
        handle: &Output,
        indices: &Output,
        updates: &Output,
    ) -> Result<String> {
        self.add_op(
            NodeSpec::new(op)
                .input(handle)
                .input(indices)
                .input(updates),
        )
    }

    /// `VariableShape(handle)` as int32.
    pub fn variable_shape(&mut self, handle: &Output) -> Result<Output> {
        self.unary("VariableShape", handle)
    }

    /// `Unique(x)`: the distinct values of a vector and each element's position among them.
    pub fn unique(&mut self, x: &Output) -> Result<(Output, Output)> {
        let mut outs = self.add_node(NodeSpec::new("Unique").input(x))?;
        let idx = outs.remove(1);
        Ok((outs.remove(0), idx))
    }

    /// A reduction over unsorted segments, `op` one of `UnsortedSegmentSum`, `...Max`,
    /// `...Min`, `...Prod`.
    pub fn unsorted_segment(
        &mut self,
        op: &str,
        data: &Output,
        segment_ids: &Output,
        num_segments: &Output,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new(op)
                .input(data)
                .input(segment_ids)
                .input(num_segments),
        )
    }

    /// `UnsortedSegmentSum(data, segment_ids, num_segments)`.
    pub fn unsorted_segment_sum(
        &mut self,
        data: &Output,
        segment_ids: &Output,
        num_segments: &Output,
    ) -> Result<Output> {
        self.unsorted_segment("UnsortedSegmentSum", data, segment_ids, num_segments)
    }

    /// A reduction over sorted segments, `op` one of `SegmentSum`, `...Mean`, `...Max`,
    /// `...Min`, `...Prod`.
    pub fn segment(&mut self, op: &str, data: &Output, segment_ids: &Output) -> Result<Output> {
        self.binary(op, data, segment_ids)
    }

    /// A sparse segment reduction, `op` one of `SparseSegmentSum`, `...Mean`, `...SqrtN`
    /// (with `num_segments`, the `...WithNumSegments` form).
    pub fn sparse_segment(
        &mut self,
        op: &str,
        data: &Output,
        indices: &Output,
        segment_ids: &Output,
        num_segments: Option<&Output>,
    ) -> Result<Output> {
        let mut spec = NodeSpec::new(op)
            .input(data)
            .input(indices)
            .input(segment_ids);
        if let Some(n) = num_segments {
            spec = NodeSpec::new(&format!("{op}WithNumSegments"))
                .input(data)
                .input(indices)
                .input(segment_ids)
                .input(n);
        }
        self.add1(spec)
    }

    /// `DynamicPartition(data, partitions)` into `num_partitions` outputs.
    pub fn dynamic_partition(
        &mut self,
        data: &Output,
        partitions: &Output,
        num_partitions: usize,
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("DynamicPartition")
                .input(data)
                .input(partitions)
                .attr("num_partitions", value::int(num_partitions as i64)),
        )
    }

    /// `DynamicStitch(indices, data)` (`parallel` picks `ParallelDynamicStitch`).
    pub fn dynamic_stitch(
        &mut self,
        indices: &[Output],
        data: &[Output],
        parallel: bool,
    ) -> Result<Output> {
        let op = if parallel {
            "ParallelDynamicStitch"
        } else {
            "DynamicStitch"
        };
        self.add1(NodeSpec::new(op).input_list(indices).input_list(data))
    }
}
