//! Iterators: resources in the device's `ResourceMgr` holding one walk of a dataset, and the
//! ops on them.
//!
//! - `OneShotIterator` runs its `dataset_factory` function the first time it runs and walks
//!   what it returns; `Iterator`/`IteratorV2` (TF1's `make_initializable_iterator`) and the
//!   anonymous ones (TF2) are set by `MakeIterator`, which starts a new walk each time it runs.
//! - `IteratorGetNext(Sync)` gives the next element, OUT_OF_RANGE ("End of sequence") at the
//!   end; `IteratorGetNextAsOptional` an optional instead, which `OptionalHasValue` and
//!   `OptionalGetValue` open.
//! - `IteratorToStringHandle` / `IteratorFromStringHandle(V2)` pass a handle as a string (a
//!   serialized `ResourceHandleProto`, as TensorFlow writes it), so a `feedable` iterator can
//!   switch between datasets; `DeleteIterator` drops one.
//!
//! - `SerializeIterator` / `DeserializeIterator` save and restore where the walk is (what
//!   `make_saveable_from_iterator` puts in a checkpoint), so a restarted job resumes its input
//!   where it stopped: the state is the number of elements the walk has given since it
//!   started, and a restore starts the dataset's walk again and passes over that many. A
//!   pipeline walks the same elements again when its shuffles are seeded (an op or graph
//!   seed; unseeded, a restored walk is at the same position in another order, as any new
//!   walk of it would be); passing over them costs the input pipeline's time for those
//!   elements, without training on them.
//!
//! A walk is asked for one element at a time: concurrent `get_next`s of one iterator take
//! turns, as in TensorFlow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prost::Message;

use super::{dataset_input, dataset_of, Dataset, Element, Iter, Signature};
use crate::error::{Code, Result, Status};
use crate::format::checkpoint::StoredVariant;
use crate::graph::attr;
use crate::kernels::functional::Function;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::{NodeDef, ResourceHandleProto, VariantTensorDataProto};
use crate::runtime::resource::Resource;
use crate::tensor::{DType, ResourceHandle, Tensor};

/// The container of resources that have no name of their own (anonymous iterators, seed
/// generators): each gets a unique one.
pub(super) const ANONYMOUS: &str = "__anonymous";

/// The `type_name` of an iterator's handle.
const ITERATOR_TYPE: &str = "IteratorResource";

pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "OneShotIterator"
        | "Iterator"
        | "IteratorV2"
        | "AnonymousIterator"
        | "AnonymousIteratorV2"
        | "AnonymousIteratorV3" => IteratorOp::create,
        "MakeIterator" => |_| Ok(Arc::new(MakeIterator)),
        "IteratorGetNext" | "IteratorGetNextSync" | "IteratorGetNextAsOptional" => |n| {
            Ok(Arc::new(GetNext {
                optional: n.op == "IteratorGetNextAsOptional",
                signature: Signature::of(n)?,
            }))
        },
        "OptionalHasValue" | "OptionalGetValue" | "OptionalFromValue" | "OptionalNone" => {
            |n| Ok(Arc::new(OptionalOp { op: n.op.clone() }))
        }
        "DeleteIterator" => |_| Ok(Arc::new(DeleteIterator)),
        "IteratorToStringHandle" => |_| Ok(Arc::new(ToStringHandle)),
        "IteratorFromStringHandle" | "IteratorFromStringHandleV2" => {
            |_| Ok(Arc::new(FromStringHandle))
        }
        "SerializeIterator" => |_| Ok(Arc::new(SerializeIterator)),
        "DeserializeIterator" => |_| Ok(Arc::new(DeserializeIterator)),
        _ => return None,
    };
    Some(factory)
}

/// An iterator: the element signature its ops declare, and the walk it holds.
pub struct IteratorResource {
    signature: Signature,
    walk: Mutex<Option<Walk>>,
    /// A one-shot iterator's dataset factory: a restore makes the dataset anew, so that its
    /// walk is a first walk again (a shuffle reshuffled each walk draws its first seeds).
    factory: Mutex<Option<Arc<Function>>>,
}

/// One walk of a dataset, and how far it has gone.
struct Walk {
    dataset: Arc<dyn Dataset>,
    elements: Box<dyn Iter>,
    /// Elements given since the walk started.
    given: u64,
}

impl Resource for IteratorResource {
    fn type_name(&self) -> &'static str {
        "iterator"
    }
}

impl IteratorResource {
    /// Starts a new walk of `dataset`, passing over its first `skip` elements (what
    /// `MakeIterator` does with none to skip, and a restore with the saved position).
    fn start(&self, ctx: &OpContext<'_>, dataset: Arc<dyn Dataset>, skip: u64) -> Result<()> {
        let mut elements = dataset.clone().iterate(ctx)?;
        let mut given = 0;
        while given < skip && elements.next(ctx)?.is_some() {
            given += 1;
        }
        *self.walk.lock().expect("iterator lock poisoned") = Some(Walk {
            dataset,
            elements,
            given,
        });
        Ok(())
    }

    /// The next element of the walk; FAILED_PRECONDITION when it was never set.
    fn next(&self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let mut walk = self.walk.lock().expect("iterator lock poisoned");
        let Some(walk) = walk.as_mut() else {
            return Err(not_initialized(ctx));
        };
        let next = walk.elements.next(ctx)?;
        if next.is_some() {
            walk.given += 1;
        }
        Ok(next)
    }
}

fn not_initialized(ctx: &OpContext<'_>) -> Status {
    ctx.named(Status::failed_precondition(
        "GetNext() failed because the iterator has not been initialized. Ensure that you have \
         run the initializer operation for this iterator before getting the next element.",
    ))
}

/// The iterator behind input `i`: NOT_FOUND naming the node when there is none.
fn iterator_input(ctx: &OpContext<'_>, i: usize) -> Result<Arc<IteratorResource>> {
    let t = ctx.input(i)?;
    if t.dtype() != DType::Resource {
        return Err(ctx.invalid(format!(
            "input {i} must be an iterator's resource handle, got {}",
            t.dtype()
        )));
    }
    let h = t.resource_handle().map_err(|e| ctx.invalid(e.message()))?;
    ctx.resources
        .lookup::<IteratorResource>(&h.container, &h.name)
        .map_err(|e| match e.code() {
            Code::NotFound => ctx.named(Status::not_found(format!(
                "iterator `{}` does not exist on {} (deleted, or its handle came from another \
                 task); create it with its iterator op",
                h.name, ctx.device
            ))),
            _ => ctx.invalid(e.message()),
        })
}

/// The ops that create an iterator and output its handle.
struct IteratorOp {
    node: NodeDef,
    signature: Signature,
    /// The resource's name: `shared_name`, else `None` and the node's name within its session
    /// (every step that runs the node, whichever of the session's signatures it is in,
    /// reaches the same iterator, as TensorFlow's session keeps one kernel per stateful node,
    /// and another session running the same graph walks its own).
    name: Option<String>,
    anonymous: bool,
    container: String,
}

static NEXT_UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique_name(node: &NodeDef) -> String {
    format!(
        "_{}_{}",
        NEXT_UNIQUE.fetch_add(1, Ordering::Relaxed),
        node.name
    )
}

impl IteratorOp {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let anonymous = node.op.starts_with("Anonymous");
        let shared = attr::string_or(node, "shared_name", "")?;
        let name = (!anonymous && !shared.is_empty()).then_some(shared);
        let container = match anonymous {
            true => ANONYMOUS.to_string(),
            false => attr::string_or(node, "container", "")?,
        };
        Ok(Arc::new(IteratorOp {
            signature: Signature::of(node)?,
            node: node.clone(),
            name,
            anonymous,
            container,
        }))
    }
}

impl OpKernel for IteratorOp {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let name = match (&self.name, self.anonymous) {
            (Some(shared), _) => shared.clone(),
            (None, true) => unique_name(&self.node),
            (None, false) if ctx.session().is_empty() => self.node.name.clone(),
            (None, false) => format!("{}/{}", ctx.session(), self.node.name),
        };
        let iterator = ctx
            .resources
            .lookup_or_create(&self.container, &name, || {
                Ok(IteratorResource {
                    signature: self.signature.clone(),
                    walk: Mutex::new(None),
                    factory: Mutex::new(None),
                })
            })
            .map_err(|e| ctx.named(e))?;
        if iterator.signature.types != self.signature.types {
            return Err(ctx.invalid(format!(
                "iterator `{name}` exists with element types {:?}, this node declares {:?}",
                iterator.signature.types, self.signature.types
            )));
        }
        // A one-shot iterator's walk is made once per resource: every signature of the
        // session runs its own kernel for the node, and all reach the one iterator.
        let unmade = || {
            iterator
                .walk
                .lock()
                .expect("iterator lock poisoned")
                .is_none()
        };
        if self.node.op == "OneShotIterator" && unmade() {
            let factory = Arc::new(
                ctx.functions()?
                    .instantiate(&self.node, "dataset_factory")?,
            );
            let dataset = make_dataset(ctx, &factory)?;
            *iterator.factory.lock().expect("iterator lock poisoned") = Some(factory);
            iterator.start(ctx, dataset, 0)?;
        }
        ctx.set_output(
            0,
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container: self.container.clone(),
                name,
                type_name: ITERATOR_TYPE.into(),
            }),
        );
        if self.node.op == "AnonymousIteratorV2" {
            ctx.set_output(1, Tensor::variant(Arc::new(())));
        }
        Ok(())
    }
}

/// Runs a one-shot iterator's dataset factory.
fn make_dataset(ctx: &OpContext<'_>, factory: &Function) -> Result<Arc<dyn Dataset>> {
    let made = factory.call(ctx, &[])?;
    let [dataset] = made.as_slice() else {
        return Err(ctx.invalid(format!(
            "dataset_factory `{}` must return one dataset, it returned {} tensors",
            factory.name,
            made.len()
        )));
    };
    dataset_of(ctx, dataset)
}

/// `MakeIterator(dataset, iterator)`: starts a walk of the dataset in the iterator.
struct MakeIterator;

impl OpKernel for MakeIterator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dataset = dataset_input(ctx, 0)?;
        let iterator = iterator_input(ctx, 1)?;
        iterator
            .start(ctx, dataset, 0)
            .map_err(|e| named_once(ctx, e))
    }
}

/// `e` naming the node, unless it already does.
fn named_once(ctx: &OpContext<'_>, e: Status) -> Status {
    let node = ctx.node();
    if e.message()
        .contains(&format!("node `{}` (op {})", node.name, node.op))
    {
        e
    } else {
        ctx.named(e)
    }
}

/// What an optional variant holds: an element, or nothing.
struct OptionalValue(Option<Element>);

fn optional_tensor(value: Option<Element>) -> Tensor {
    Tensor::variant(Arc::new(OptionalValue(value)))
}

/// `IteratorGetNext(Sync)`: the next element; `IteratorGetNextAsOptional`: it as an optional.
struct GetNext {
    optional: bool,
    /// The element the node declares (`output_types`, `output_shapes`).
    signature: Signature,
}

impl OpKernel for GetNext {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let iterator = iterator_input(ctx, 0)?;
        let next = iterator.next(ctx).map_err(|e| named_once(ctx, e))?;
        if self.optional {
            ctx.set_output(0, optional_tensor(next));
            return Ok(());
        }
        let Some(element) = next else {
            return Err(ctx.named(Status::out_of_range("End of sequence")));
        };
        check_element(ctx, &self.signature, &element)?;
        for (i, t) in element.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}

/// Fails unless `element` has the types (and shapes compatible with those) the node declares.
fn check_element(ctx: &OpContext<'_>, signature: &Signature, element: &[Tensor]) -> Result<()> {
    match signature.mismatch(element) {
        Some(mismatch) => Err(ctx.invalid(format!("the dataset's element has {mismatch}"))),
        None => Ok(()),
    }
}

/// The optional ops: `OptionalHasValue`, `OptionalGetValue`, `OptionalFromValue`,
/// `OptionalNone`.
struct OptionalOp {
    op: String,
}

impl OpKernel for OptionalOp {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        match self.op.as_str() {
            "OptionalFromValue" => {
                let value = ctx.inputs().to_vec();
                ctx.set_output(0, optional_tensor(Some(value)));
                return Ok(());
            }
            "OptionalNone" => {
                ctx.set_output(0, optional_tensor(None));
                return Ok(());
            }
            _ => {}
        }
        let t = ctx.input(0)?;
        let value = match (t.dtype(), t.num_elements()) {
            (DType::Variant, 1) => t.variants()?[0].clone().downcast::<OptionalValue>().ok(),
            _ => None,
        };
        let Some(value) = value else {
            return Err(ctx.invalid("input 0 must be an optional (a scalar variant)"));
        };
        if self.op == "OptionalHasValue" {
            ctx.set_output(0, Tensor::scalar(value.0.is_some()));
            return Ok(());
        }
        let Some(element) = value.0.clone() else {
            return Err(ctx.invalid("The optional does not have a value"));
        };
        check_element(ctx, &Signature::of(ctx.node())?, &element)?;
        for (i, t) in element.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}

/// `DeleteIterator(handle, deleter)`.
struct DeleteIterator;

impl OpKernel for DeleteIterator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = ctx.input(0)?.resource_handle()?.clone();
        ctx.resources
            .delete(&h.container, &h.name)
            .map_err(|e| ctx.named(e))
    }
}

/// `IteratorToStringHandle`: the handle as a serialized `ResourceHandleProto`.
struct ToStringHandle;

impl OpKernel for ToStringHandle {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let iterator = iterator_input(ctx, 0);
        iterator?;
        let h = ctx.input(0)?.resource_handle()?.clone();
        ctx.set_output(0, Tensor::string(h.to_proto().encode_to_vec()));
        Ok(())
    }
}

/// `IteratorFromStringHandle(V2)`: a handle from its string form.
struct FromStringHandle;

impl OpKernel for FromStringHandle {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let t = ctx.input(0)?;
        let bytes = match (t.dtype(), t.num_elements()) {
            (DType::String, 1) => t.strings()?[0].clone(),
            _ => {
                return Err(ctx.invalid(format!(
                    "string_handle must be a scalar string, got a {} tensor of shape {}",
                    t.dtype(),
                    t.shape()
                )))
            }
        };
        let proto = ResourceHandleProto::decode(bytes).map_err(|e| {
            ctx.invalid(format!(
                "string_handle is not an iterator's string handle (from \
                 IteratorToStringHandle): {e}"
            ))
        })?;
        let handle = ResourceHandle::from_proto(&proto);
        ctx.set_output(0, Tensor::resource(handle));
        Ok(())
    }
}

/// The `type_name` of a saved iterator position.
const POSITION_TYPE: &str = "tessera.IteratorPosition";

/// `SerializeIterator`: where the walk is, as a variant a checkpoint can hold.
struct SerializeIterator;

impl OpKernel for SerializeIterator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let iterator = iterator_input(ctx, 0)?;
        let given = match iterator
            .walk
            .lock()
            .expect("iterator lock poisoned")
            .as_ref()
        {
            Some(walk) => walk.given,
            None => return Err(not_initialized(ctx)),
        };
        let proto = VariantTensorDataProto {
            type_name: POSITION_TYPE.into(),
            metadata: Default::default(),
            tensors: vec![Tensor::scalar(given as i64).to_proto()],
        };
        ctx.set_output(0, Tensor::variant(Arc::new(StoredVariant(proto))));
        Ok(())
    }
}

/// `DeserializeIterator(iterator, serialized)`: restarts the walk at the saved position.
struct DeserializeIterator;

impl OpKernel for DeserializeIterator {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let iterator = iterator_input(ctx, 0)?;
        let t = ctx.input(1)?;
        let stored = match (t.dtype(), t.num_elements()) {
            (DType::Variant, 1) => t.variants()?[0].clone().downcast::<StoredVariant>().ok(),
            _ => None,
        };
        let given = stored
            .filter(|s| s.0.type_name == POSITION_TYPE && s.0.tensors.len() == 1)
            .and_then(|s| Tensor::from_proto(&s.0.tensors[0]).ok())
            .and_then(|p| p.scalar_value::<i64>().ok())
            .filter(|&n| n >= 0);
        let Some(given) = given else {
            return Err(ctx.invalid(
                "the serialized state is not an iterator position saved by tessera's \
                 SerializeIterator (a checkpoint of TensorFlow's own iterator state cannot be \
                 restored here)",
            ));
        };
        let factory = iterator
            .factory
            .lock()
            .expect("iterator lock poisoned")
            .clone();
        let dataset = match factory {
            Some(factory) => make_dataset(ctx, &factory)?,
            None => match iterator
                .walk
                .lock()
                .expect("iterator lock poisoned")
                .as_ref()
            {
                Some(walk) => walk.dataset.clone(),
                None => {
                    // An initializable iterator restored before its initializer runs (what a
                    // monitored session does): its `MakeIterator` starts from the first
                    // element, as TensorFlow's does.
                    tracing::info!(
                        node = %ctx.node().name,
                        position = given,
                        "iterator restored before it was initialized; its initializer starts \
                         it from the first element"
                    );
                    return Ok(());
                }
            },
        };
        iterator
            .start(ctx, dataset, given as u64)
            .map_err(|e| named_once(ctx, e))
    }
}
