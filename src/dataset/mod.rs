//! `tf.data` on the task: datasets, and the iterators that walk them where the graph places
//! them (a between-graph worker's CPU), as TensorFlow's `core/kernels/data` does.
//!
//! A dataset op (`TensorSliceDataset`, `MapDataset`, `BatchDatasetV2`, ...) outputs a scalar
//! variant holding a [`Dataset`]: an immutable description that knows its input datasets and
//! what it does to their elements. Walking one takes an [`Iter`], made by
//! [`Dataset::iterate`]; an iterator op (`OneShotIterator`, `IteratorV2`, `AnonymousIteratorV3`)
//! creates a resource in the device's `ResourceMgr` that holds one, `MakeIterator` (or the
//! one-shot iterator's dataset factory) sets it, and `IteratorGetNext` asks it for the next
//! element. The end of the data is OUT_OF_RANGE ("End of sequence"), as TensorFlow's, so a
//! `MonitoredTrainingSession` stops cleanly on a finite dataset.
//!
//! The rooms: [`sources`] (tensors, ranges, TFRecord, text and fixed-length record files, read
//! through the task's file confinement), [`transform`] (map and filter running a graph
//! function, flat map, interleave, take, skip, repeat, zip, concatenate, cache, shard,
//! unbatch, and the options TensorFlow wraps pipelines in), [`batch`] (batch and padded
//! batch), [`shuffle`] (TensorFlow's shuffle buffer and seeds, element for element),
//! [`prefetch`] (a producer thread ahead of the consumer), [`iterator`] (the iterator
//! resources and their ops, and optionals).
//!
//! Functions (a map's `f`, a one-shot iterator's `dataset_factory`) come from the graph's
//! library through [`OpContext::functions`] and run on the thread that asks for the element,
//! with the caller's context, so a function's error names the function and its node, and the
//! `IteratorGetNext` that met it.
//!
//! Above the kernels (a function's nodes are kernels, and datasets move rows with theirs);
//! below the executor, which creates these kernels for the CPU ([`kernel_for`]).

mod batch;
mod iterator;
mod prefetch;
mod shuffle;
mod sources;
mod transform;

use std::sync::Arc;

use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext};
use crate::proto::NodeDef;
use crate::tensor::{DType, PartialShape, Tensor};

pub use iterator::IteratorResource;

/// One element of a dataset: one tensor per component.
pub type Element = Vec<Tensor>;

/// A dataset: what walking it yields, made once by its op and shared by every iterator.
pub trait Dataset: Send + Sync {
    /// The node that made the dataset, named in errors met while walking it.
    fn origin(&self) -> &Origin;

    /// Starts a walk from the first element. `ctx` is the context of the op that starts it
    /// (`MakeIterator`, or the `IteratorGetNext` of a repeat's next epoch).
    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>>;

    /// The number of elements, when known without walking (-1 infinite, -2 unknown: what
    /// `DatasetCardinality` answers, as TensorFlow's constants say).
    fn cardinality(&self) -> i64 {
        UNKNOWN
    }
}

/// [`Dataset::cardinality`] of an endless dataset.
pub const INFINITE: i64 = -1;
/// [`Dataset::cardinality`] when it is not known without walking.
pub const UNKNOWN: i64 = -2;

/// One walk through a dataset.
pub trait Iter: Send {
    /// The next element; `None` at the end. `ctx` is the asking op's context: functions run
    /// with it, and waits honour its step's deadline and cancellation.
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>>;
}

/// The node a dataset came from.
#[derive(Clone, Debug)]
pub struct Origin {
    /// The op (`MapDataset`).
    pub op: String,
    /// The node's name.
    pub name: String,
}

impl Origin {
    /// The origin of the dataset `node` makes.
    pub fn of(node: &NodeDef) -> Self {
        Self {
            op: node.op.clone(),
            name: node.name.clone(),
        }
    }

    /// `status` with the dataset's node in front of its message, keeping its code.
    pub fn named(&self, status: Status) -> Status {
        if status
            .message()
            .contains(&format!("`{}` (op {})", self.name, self.op))
        {
            return status;
        }
        status.context(format!("dataset `{}` (op {})", self.name, self.op))
    }

    /// An INVALID_ARGUMENT naming the dataset's node.
    pub fn invalid(&self, message: impl std::fmt::Display) -> Status {
        self.named(Status::invalid_argument(message.to_string()))
    }
}

/// The value a dataset op's variant output holds.
pub struct DatasetValue(pub Arc<dyn Dataset>);

/// A scalar variant tensor holding `dataset`.
pub fn dataset_tensor(dataset: Arc<dyn Dataset>) -> Tensor {
    Tensor::variant(Arc::new(DatasetValue(dataset)))
}

/// The dataset input `i` holds: INVALID_ARGUMENT naming the node when it holds none.
pub fn dataset_input(ctx: &OpContext<'_>, i: usize) -> Result<Arc<dyn Dataset>> {
    dataset_of(ctx, ctx.input(i)?).map_err(|e| ctx.named(e.context(format!("input {i}"))))
}

/// The dataset `t` holds.
fn dataset_of(ctx: &OpContext<'_>, t: &Tensor) -> Result<Arc<dyn Dataset>> {
    let not_one = || {
        ctx.invalid(format!(
            "expected a dataset (a scalar variant from a dataset op), got a {} tensor of shape {}",
            t.dtype(),
            t.shape()
        ))
    };
    if t.dtype() != DType::Variant || t.num_elements() != 1 {
        return Err(not_one());
    }
    let value = t.variants()?[0].clone();
    value
        .downcast::<DatasetValue>()
        .map(|d| d.0.clone())
        .map_err(|_| not_one())
}

/// Returns the factory of a `tf.data` op's kernel (they all run on the CPU).
pub fn kernel_for(op: &str) -> Option<KernelFactory> {
    sources::kernel_for(op)
        .or_else(|| transform::kernel_for(op))
        .or_else(|| batch::kernel_for(op))
        .or_else(|| shuffle::kernel_for(op))
        .or_else(|| prefetch::kernel_for(op))
        .or_else(|| iterator::kernel_for(op))
}

/// A scalar int64 (or int32) input: a count, a size, a seed, named `what` in errors.
fn int64_input(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<i64> {
    crate::kernels::cpu::int_scalar(ctx, ctx.input(i)?, what)
}

/// A scalar bool input, named `what` in errors.
fn bool_input(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<bool> {
    let t = ctx.input(i)?;
    if t.dtype() != DType::Bool || t.num_elements() != 1 {
        return Err(ctx.invalid(format!(
            "{what} must be a bool scalar, got a {} tensor of shape {}",
            t.dtype(),
            t.shape()
        )));
    }
    t.values::<bool>().map(|v| v[0])
}

/// The element signature a dataset node declares: its `output_types` (or `Toutput_types`)
/// and `output_shapes` attrs.
#[derive(Clone, Debug)]
struct Signature {
    types: Vec<DType>,
    shapes: Vec<PartialShape>,
}

impl Signature {
    fn of(node: &NodeDef) -> Result<Self> {
        let types = attr::dtype_list(node, "output_types")
            .or_else(|_| attr::dtype_list(node, "Toutput_types"))?;
        let shapes = match attr::get(node, "output_shapes") {
            Some(crate::proto::attr_value::Value::List(list)) => list
                .shape
                .iter()
                .map(PartialShape::from_proto)
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        Ok(Self { types, shapes })
    }

    /// What in `element` differs from the declared signature (its component count, a
    /// component's dtype, a shape incompatible with the declared one); `None` when nothing
    /// does.
    fn mismatch(&self, element: &[Tensor]) -> Option<String> {
        if element.len() != self.types.len() {
            return Some(format!(
                "{} components where {} are declared",
                element.len(),
                self.types.len()
            ));
        }
        for (i, (t, &want)) in element.iter().zip(&self.types).enumerate() {
            if t.dtype() != want {
                return Some(format!(
                    "component {i} is a {} tensor where {want} is declared",
                    t.dtype()
                ));
            }
            if let Some(shape) = self.shapes.get(i) {
                if !shape.is_compatible_with(t.shape()) {
                    return Some(format!(
                        "component {i} has shape {} where {shape} is declared",
                        t.shape()
                    ));
                }
            }
        }
        None
    }
}

/// What a dataset op's kernel knows of its node: where the dataset comes from, and the
/// element signature it declares (`None` for the file sources, whose elements are strings).
pub(crate) struct DatasetNode {
    origin: Origin,
    signature: Option<Signature>,
    node: NodeDef,
}

/// Builds a dataset op's dataset from its inputs (the op's context is `ctx`).
type MakeFn = fn(&OpContext<'_>, &DatasetNode) -> Result<Arc<dyn Dataset>>;

/// The kernel of a dataset op: builds its dataset each run and outputs it as a scalar variant.
struct DatasetOp {
    node: DatasetNode,
    make: MakeFn,
}

/// The kernel of the dataset op `node`, which `make` builds.
fn dataset_op(node: &NodeDef, make: MakeFn) -> Result<Arc<dyn crate::kernels::OpKernel>> {
    let signature = if attr::get(node, "output_types").is_some()
        || attr::get(node, "Toutput_types").is_some()
    {
        Some(Signature::of(node)?)
    } else {
        None
    };
    Ok(Arc::new(DatasetOp {
        node: DatasetNode {
            origin: Origin::of(node),
            signature,
            node: node.clone(),
        },
        make,
    }))
}

impl crate::kernels::OpKernel for DatasetOp {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dataset = (self.make)(ctx, &self.node).map_err(|e| ctx.named(e))?;
        ctx.set_output(0, dataset_tensor(dataset));
        Ok(())
    }
}
