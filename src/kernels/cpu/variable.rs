//! Resource variables: VarHandleOp (names a variable, creates nothing), ReadVariableOp,
//! AssignVariableOp (creates the variable on first assignment), AssignAddVariableOp,
//! AssignSubVariableOp, VarIsInitializedOp and DestroyResourceOp.
//!
//! Variables live in the device's [`ResourceMgr`] keyed by (container, name). An assignment
//! replaces the variable's tensor with a new one under the write lock, so a reader that holds
//! an earlier value keeps an unchanged snapshot; the optimizer updates write in place only
//! into a buffer no snapshot shares (see [`crate::tensor::Var`]).
//!
//! [`ResourceMgr`]: crate::runtime::resource::ResourceMgr

use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

use super::numeric::Real;
use super::split;
use super::{input, stateless};
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::resource::Var;
use crate::tensor::{DType, PartialShape, ResourceHandle, Shape, Tensor};

/// The `type_name` of a variable's resource handle.
pub const VAR_TYPE_NAME: &str = "Var";

/// Returns the factory for a resource-variable op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "VarHandleOp" => VarHandle::create,
        "ReadVariableOp" => ReadVariable::create,
        "_ReadVariablesTogether" => |_| Ok(Arc::new(ReadTogether)),
        "AssignVariableOp" => Assign::create,
        "AssignAddVariableOp" => |_| stateless(assign_add),
        "AssignSubVariableOp" => |_| stateless(assign_sub),
        "VarIsInitializedOp" => |_| stateless(is_initialized),
        "DestroyResourceOp" => Destroy::create,
        _ => return None,
    };
    Some(factory)
}

/// Returns input `i` as a variable handle.
pub(super) fn handle_input(ctx: &OpContext<'_>, i: usize) -> Result<ResourceHandle> {
    let t = ctx.input(i)?;
    if t.dtype() != DType::Resource {
        return Err(ctx.invalid(format!(
            "input {i} must be a resource handle, got {}",
            t.dtype()
        )));
    }
    t.resource_handle()
        .cloned()
        .map_err(|e| ctx.invalid(e.message()))
}

/// A FAILED_PRECONDITION naming the node: the variable must be initialized first.
pub(super) fn uninitialized(ctx: &OpContext<'_>, h: &ResourceHandle) -> Status {
    let node = ctx.node();
    Status::failed_precondition(format!(
        "node `{}` (op {}): Attempting to use uninitialized value {}: variable `{}` in container \
         `{}` has no value; run its initializer (e.g. the op from \
         tf.compat.v1.global_variables_initializer()) before reading or updating it",
        node.name,
        node.op,
        h.name,
        h.name,
        if h.container.is_empty() {
            "localhost"
        } else {
            &h.container
        }
    ))
}

/// Looks the handle's variable up; a missing variable is uninitialized (FAILED_PRECONDITION).
pub(super) fn lookup_var(ctx: &OpContext<'_>, h: &ResourceHandle) -> Result<Arc<Var>> {
    match ctx.resources.lookup::<Var>(&h.container, &h.name) {
        Ok(var) => Ok(var),
        Err(e) if e.code() == Code::NotFound => Err(uninitialized(ctx, h)),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

/// Read-locks a variable's value.
pub(super) fn read_lock<'a>(
    ctx: &OpContext<'_>,
    var: &'a Var,
) -> Result<RwLockReadGuard<'a, Option<Tensor>>> {
    var.value.read().map_err(|_| {
        Status::internal(format!(
            "node `{}`: variable lock poisoned",
            ctx.node().name
        ))
    })
}

/// Write-locks a variable's value.
pub(super) fn write_lock<'a>(
    ctx: &OpContext<'_>,
    var: &'a Var,
) -> Result<RwLockWriteGuard<'a, Option<Tensor>>> {
    if var.value.is_poisoned() {
        return Err(Status::internal(format!(
            "node `{}`: variable lock poisoned",
            ctx.node().name
        )));
    }
    Ok(var.write())
}

/// VarHandleOp: a scalar resource tensor naming (device, container, shared_name).
struct VarHandle {
    container: String,
    name: String,
}

impl VarHandle {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let shared_name = attr::string_or(node, "shared_name", "")?;
        Ok(Arc::new(VarHandle {
            container: attr::string_or(node, "container", "")?,
            name: if shared_name.is_empty() {
                node.name.clone()
            } else {
                shared_name
            },
        }))
    }
}

impl OpKernel for VarHandle {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let handle = ResourceHandle {
            device: ctx.device.to_string(),
            container: self.container.clone(),
            name: self.name.clone(),
            type_name: VAR_TYPE_NAME.to_string(),
        };
        ctx.set_output(0, Tensor::resource(handle));
        Ok(())
    }
}

/// ReadVariableOp: the variable's current value.
/// `_ReadVariablesTogether`: the values of several resource variables, all read at one instant
/// ([`crate::tensor::var::snapshot_all`]), so that an update of them is seen whole or not at all.
struct ReadTogether;

impl OpKernel for ReadTogether {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let handles = (0..ctx.num_inputs())
            .map(|i| handle_input(ctx, i))
            .collect::<Result<Vec<_>>>()?;
        let vars = handles
            .iter()
            .map(|h| lookup_var(ctx, h))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Var> = vars.iter().map(Arc::as_ref).collect();
        let values = crate::tensor::var::snapshot_all(&refs);
        for (i, (value, h)) in values.into_iter().zip(&handles).enumerate() {
            ctx.set_output(i, value.ok_or_else(|| uninitialized(ctx, h))?);
        }
        Ok(())
    }
}

struct ReadVariable {
    dtype: Option<DType>,
}

impl ReadVariable {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let dtype = match attr::get(node, "dtype") {
            Some(_) => Some(attr::dtype(node, "dtype")?),
            None => None,
        };
        Ok(Arc::new(ReadVariable { dtype }))
    }
}

impl OpKernel for ReadVariable {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = handle_input(ctx, 0)?;
        let var = lookup_var(ctx, &h)?;
        let value = read_lock(ctx, &var)?
            .clone()
            .ok_or_else(|| uninitialized(ctx, &h))?;
        if let Some(dtype) = self.dtype {
            if dtype != value.dtype() {
                return Err(ctx.invalid(format!(
                    "Trying to read variable `{}` with wrong dtype. Expected {dtype} got {}",
                    h.name,
                    value.dtype()
                )));
            }
        }
        ctx.set_output(0, value);
        Ok(())
    }
}

/// AssignVariableOp: sets the value, creating the variable when absent.
struct Assign {
    dtype: Option<DType>,
    validate_shape: bool,
}

impl Assign {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let dtype = match attr::get(node, "dtype") {
            Some(_) => Some(attr::dtype(node, "dtype")?),
            None => None,
        };
        Ok(Arc::new(Assign {
            dtype,
            validate_shape: attr::bool_or(node, "validate_shape", false)?,
        }))
    }
}

impl OpKernel for Assign {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = handle_input(ctx, 0)?;
        let value = input(ctx, 1)?;
        let dtype = self.dtype.unwrap_or(value.dtype());
        if value.dtype() != dtype {
            return Err(ctx.invalid(format!(
                "Trying to assign a {} value to variable `{}` declared as {dtype}",
                value.dtype(),
                h.name
            )));
        }
        let var = ctx
            .resources
            .lookup_or_create::<Var>(&h.container, &h.name, || {
                Ok(Var::new(dtype, PartialShape::from(value.shape())))
            })
            .map_err(|e| ctx.invalid(e.message()))?;
        if var.dtype != dtype {
            return Err(ctx.invalid(format!(
                "Trying to assign variable `{}` with wrong dtype. Expected {} got {dtype}",
                h.name, var.dtype
            )));
        }
        // The store's byte limit, checked before the write lock: the check reads every
        // variable of the store, this one included.
        let old_bytes = read_lock(ctx, &var)?
            .as_ref()
            .map_or(0, |t| t.byte_size() as u64);
        ctx.resources.check_var_bytes(
            &format!("node `{}`: variable `{}`", ctx.node().name, h.name),
            old_bytes,
            value.byte_size() as u64,
        )?;
        let mut slot = write_lock(ctx, &var)?;
        if self.validate_shape {
            if let Some(old) = slot.as_ref() {
                if old.shape() != value.shape() {
                    return Err(ctx.invalid(format!(
                        "Trying to assign to variable `{}` with tensor with wrong shape. Expected {} got {}",
                        h.name,
                        old.shape(),
                        value.shape()
                    )));
                }
            }
        }
        *slot = Some(value);
        Ok(())
    }
}

/// Adds (or subtracts) the value to an initialized variable of the same shape.
fn assign_update(ctx: &mut OpContext<'_>, subtract: bool) -> Result<()> {
    let delta = input(ctx, 1)?;
    let intra = ctx.intra();
    update_variable(ctx, delta.dtype(), delta.shape(), |value| {
        // In the variable's own buffer when no reader holds it (one pass, nothing allocated),
        // in a copy otherwise: a value read before keeps its elements.
        dispatch_real!(ctx, delta.dtype(), T => {
            let f: fn(T, T) -> T = if subtract { Real::sub } else { Real::add };
            let delta = delta.values::<T>()?;
            value.update_in_place::<T, _>(|v| split::zip_in_place(intra, v, &delta, f))?
        });
        Ok(())
    })
}

/// Runs `f` on the value of the variable input 0 names, write-locked, after the checks of
/// `AssignAddVariableOp` and `AssignSubVariableOp` for an update of `dtype` and `shape`
/// (initialized, the same dtype, the same shape), with their errors.
pub(super) fn update_variable<R>(
    ctx: &OpContext<'_>,
    dtype: DType,
    shape: &Shape,
    f: impl FnOnce(&mut Tensor) -> Result<R>,
) -> Result<R> {
    let h = handle_input(ctx, 0)?;
    let var = lookup_var(ctx, &h)?;
    let mut slot = write_lock(ctx, &var)?;
    let value = slot.as_mut().ok_or_else(|| uninitialized(ctx, &h))?;
    if value.dtype() != dtype {
        return Err(ctx.invalid(format!(
            "Trying to update variable `{}` of dtype {} with a {} value",
            h.name,
            value.dtype(),
            dtype
        )));
    }
    if value.shape() != shape {
        return Err(ctx.invalid(format!(
            "Cannot update variable `{}` with shape {} using a Tensor with shape {}, shapes must be equal.",
            h.name,
            value.shape(),
            shape
        )));
    }
    f(value)
}

fn assign_add(ctx: &mut OpContext<'_>) -> Result<()> {
    assign_update(ctx, false)
}

fn assign_sub(ctx: &mut OpContext<'_>) -> Result<()> {
    assign_update(ctx, true)
}

/// VarIsInitializedOp: whether the variable exists and holds a value.
fn is_initialized(ctx: &mut OpContext<'_>) -> Result<()> {
    let h = handle_input(ctx, 0)?;
    let initialized = match ctx.resources.lookup::<Var>(&h.container, &h.name) {
        Ok(var) => read_lock(ctx, &var)?.is_some(),
        Err(_) => false,
    };
    ctx.set_output(0, Tensor::scalar(initialized));
    Ok(())
}

/// DestroyResourceOp: deletes the resource; a missing one is fine with `ignore_lookup_error`.
struct Destroy {
    ignore_lookup_error: bool,
}

impl Destroy {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Destroy {
            ignore_lookup_error: attr::bool_or(node, "ignore_lookup_error", true)?,
        }))
    }
}

impl OpKernel for Destroy {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = handle_input(ctx, 0)?;
        match ctx.resources.delete(&h.container, &h.name) {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Code::NotFound && self.ignore_lookup_error => Ok(()),
            Err(e) => {
                let node = ctx.node();
                Err(Status::new(
                    e.code(),
                    format!("node `{}` (op {}): {}", node.name, node.op, e.message()),
                ))
            }
        }
    }
}
