//! Stack kernels: `StackV2`, `StackPushV2`, `StackPopV2`, `StackCloseV2`, and their older
//! forms `Stack`, `StackPush`, `StackPop`, `StackClose`, whose handle is a `Ref(string)`.
//!
//! TensorFlow 1 while loops keep the forward values their gradient needs on stacks: the
//! forward loop pushes one value per iteration (`f_acc`), the backward loop pops them in
//! reverse. A stack is a per-step resource, like a TensorArray (see
//! [`super::tensor_array`]): it lives in the step's container
//! ([`step_container`]`(step_id)`) under `_stacks<name>_<n>`, `<name>` being the `stack_name`
//! attr (else the node's name) and `<n>` a process-wide counter, and goes when the step ends
//! ([`ResourceMgr::cleanup_step`](crate::runtime::resource::ResourceMgr::cleanup_step)).
//!
//! The old forms' handle is a reference to a two-element string tensor (`["_stacks",
//! "<name>_<n>"]`, TensorFlow's layout) held by a [`Var`]; their kernels read the stack's name
//! out of it. `swap_memory` (moving values to host memory) is accepted and ignored: tessera's
//! CPU values already live in host memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::array::tf_dtype_name;
use super::variable::handle_input;
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::resource::{step_container, Resource};
use crate::tensor::{DType, PartialShape, ResourceHandle, Tensor, Var};

/// The `type_name` of a stack's resource handle.
pub const STACK_TYPE_NAME: &str = "Stack";

/// The prefix of a stack's resource name (TensorFlow's container name for stacks).
const STACKS: &str = "_stacks";

/// Numbers the stacks created in this process, so that every creation has its own name.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Returns the factory for a stack op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "StackV2" | "Stack" => Create::create,
        "StackPushV2" | "StackPush" => |_| super::stateless(push),
        "StackPopV2" | "StackPop" => Pop::create,
        "StackCloseV2" | "StackClose" => |_| super::stateless(close),
        _ => return None,
    };
    Some(factory)
}

/// A stack of tensors of one dtype, at most `max_size` deep.
pub struct Stack {
    name: String,
    elem_type: DType,
    max_size: usize,
    state: Mutex<State>,
}

struct State {
    closed: bool,
    items: Vec<Tensor>,
}

impl Resource for Stack {
    fn type_name(&self) -> &'static str {
        "stack"
    }
}

impl Stack {
    /// Locks the stack, failing when it was closed.
    fn open(&self) -> Result<MutexGuard<'_, State>> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.closed {
            return Err(Status::invalid_argument(format!(
                "Stack[{}] has already been closed.",
                self.name
            )));
        }
        Ok(s)
    }

    /// Pushes `value`; INVALID_ARGUMENT when the stack is full.
    pub fn push(&self, value: Tensor) -> Result<()> {
        let mut s = self.open()?;
        if s.items.len() >= self.max_size {
            return Err(Status::invalid_argument(format!(
                "Stack[{}] overflowed its max_size ({})",
                self.name, self.max_size
            )));
        }
        s.items.push(value);
        Ok(())
    }

    /// Pops the last value pushed; INVALID_ARGUMENT naming the stack when it is empty.
    pub fn pop(&self) -> Result<Tensor> {
        self.open()?.items.pop().ok_or_else(|| {
            Status::invalid_argument(format!("Stack[{}] is empty when calling Pop().", self.name))
        })
    }

    /// Returns the number of values on the stack.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .items
            .len()
    }

    /// Whether the stack holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The (container, name) of the stack behind input 0: a resource handle, or for the old ops a
/// reference to `["_stacks", "<name>"]`.
fn stack_key(ctx: &OpContext<'_>) -> Result<(String, String)> {
    let t = ctx.input(0)?;
    if t.dtype() == DType::Resource {
        let h = handle_input(ctx, 0)?;
        return Ok((h.container, h.name));
    }
    let value = match t.referenced() {
        Some((var, name)) => var.snapshot().ok_or_else(|| {
            ctx.named(Status::failed_precondition(format!(
                "stack handle `{name}` holds no value"
            )))
        })?,
        None => t.clone(),
    };
    match value.strings().map(<[_]>::to_vec).as_deref() {
        Ok([container, name]) => Ok((
            step_container(ctx.step_id),
            format!(
                "{}{}",
                String::from_utf8_lossy(container),
                String::from_utf8_lossy(name)
            ),
        )),
        _ => Err(ctx.invalid(format!(
            "Stack handle must have two elements, but had shape: {}",
            value.shape()
        ))),
    }
}

/// Looks up the stack behind input 0, or an error naming the node and the stack.
fn lookup(ctx: &OpContext<'_>) -> Result<Arc<Stack>> {
    let (container, name) = stack_key(ctx)?;
    match ctx.resources.lookup::<Stack>(&container, &name) {
        Ok(s) => Ok(s),
        Err(e) if e.code() == Code::NotFound => Err(Status::not_found(format!(
            "node `{}` (op {}): stack `{name}` does not exist on {} (container `{container}`); \
             a stack lives for the step that created it: run its StackV2 in the same step",
            ctx.node().name,
            ctx.node().op,
            ctx.device
        ))),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

/// StackV2(max_size) -> handle, and Stack() -> Ref(string) handle.
struct Create {
    elem_type: DType,
    name: String,
}

impl Create {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let name = attr::string_or(node, "stack_name", "")?;
        Ok(Arc::new(Create {
            elem_type: attr::dtype(node, "elem_type")?,
            name: if name.is_empty() {
                node.name.clone()
            } else {
                name
            },
        }))
    }
}

impl OpKernel for Create {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let mut max_size = i32::MAX as usize;
        if ctx.num_inputs() > 0 {
            let t = ctx.input(0)?;
            if t.rank() != 0 {
                return Err(ctx.invalid(format!(
                    "Stack size must be a scalar, but had shape: {}",
                    t.shape()
                )));
            }
            let size = t
                .scalar_value::<i32>()
                .map_err(|e| ctx.invalid(e.message()))?;
            if let Ok(size) = usize::try_from(size) {
                max_size = size;
            }
        }
        let name = format!("{}_{}", self.name, COUNTER.fetch_add(1, Ordering::Relaxed));
        let key = format!("{STACKS}{name}");
        let container = step_container(ctx.step_id);
        let stack = Stack {
            name: name.clone(),
            elem_type: self.elem_type,
            max_size,
            state: Mutex::new(State {
                closed: false,
                items: Vec::new(),
            }),
        };
        ctx.resources
            .lookup_or_create(&container, &key, || Ok(stack))
            .map_err(|e| ctx.named(e))?;
        let out = if ctx.node().op == "Stack" {
            // The old form: a reference to the handle TensorFlow keeps, ["_stacks", name].
            let handle = Tensor::from_strings([2], vec![STACKS.into(), name.into()])?;
            let var = Var::new(DType::String, PartialShape::new(vec![Some(2)]));
            *var.write() = Some(handle);
            Tensor::reference(Arc::new(var), ctx.node().name.as_str())
        } else {
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container,
                name: key,
                type_name: STACK_TYPE_NAME.to_string(),
            })
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// StackPushV2(handle, elem) -> elem: pushes and passes the value on.
fn push(ctx: &mut OpContext<'_>) -> Result<()> {
    let stack = lookup(ctx)?;
    let elem = ctx.input(1)?.clone();
    if elem.dtype() != stack.elem_type {
        return Err(ctx.invalid(format!(
            "Must have type {} but got {}",
            tf_dtype_name(stack.elem_type),
            tf_dtype_name(elem.dtype())
        )));
    }
    stack.push(elem.clone()).map_err(|e| ctx.named(e))?;
    ctx.set_output(0, elem);
    Ok(())
}

/// StackPopV2(handle) -> elem.
struct Pop {
    elem_type: DType,
}

impl Pop {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Pop {
            elem_type: attr::dtype(node, "elem_type")?,
        }))
    }
}

impl OpKernel for Pop {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let stack = lookup(ctx)?;
        if stack.elem_type != self.elem_type {
            return Err(ctx.invalid(format!(
                "Stack[{}] holds {} values but this node pops {}; set elem_type to the type the \
                 stack was created with",
                stack.name,
                tf_dtype_name(stack.elem_type),
                tf_dtype_name(self.elem_type)
            )));
        }
        let value = stack.pop().map_err(|e| ctx.named(e))?;
        ctx.set_output(0, value);
        Ok(())
    }
}

/// StackCloseV2(handle): drops the values; later uses of the stack fail.
fn close(ctx: &mut OpContext<'_>) -> Result<()> {
    let stack = lookup(ctx)?;
    let mut s = stack.state.lock().unwrap_or_else(|e| e.into_inner());
    s.items.clear();
    s.closed = true;
    Ok(())
}
