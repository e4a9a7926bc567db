//! TensorFlow 1's reference variables (`state_ops.cc`): `VariableV2` (and the legacy
//! `Variable`) hands out a reference to the variable's storage, and the ops that take a
//! `Ref(T)` input read or update that storage in place: `Assign`, `AssignAdd`, `AssignSub`,
//! `IsVariableInitialized`, the `Scatter*` row updates, `CountUpTo`, `RefIdentity`, and the
//! step-scoped `TemporaryVariable` / `DestroyTemporaryVariable`.
//!
//! A `VariableV2`'s [`Var`] lives in the device's [`ResourceMgr`] under (container,
//! `shared_name` or the node's name), created uninitialized with the `dtype` and `shape` attrs on
//! the node's first run, as TensorFlow's `VariableOp` keeps its `LegacyVar`; every run of every
//! session on the task reaches the same storage, and a checkpoint or `VarHandleOp` naming the
//! same key finds it too. The reference tensor it outputs carries the node's name, which the
//! "uninitialized value" errors quote.
//!
//! [`read_modify_write`] is the one place the `use_locking` policy lives, shared with the
//! optimizer updates of `training.rs` (both forms):
//! - `use_locking = true` holds the write locks of every variable it changes across the whole
//!   read-modify-write (taken in address order, so two updates sharing variables never wait on
//!   each other in a cycle), and writes into the value's buffer in place when no snapshot
//!   shares it ([`Tensor::update_in_place`]).
//! - `use_locking = false` is TensorFlow's lock-free update where it costs nothing: when a
//!   reader still holds a snapshot of a value (a pending send, a checkpoint), updating it in
//!   place is impossible anyway, so the update snapshots the values together (their read locks
//!   held for the reads alone), computes on its own copies and stores the results together
//!   (their write locks held for the stores alone): readers never wait for the computation,
//!   and concurrent updates may overwrite one another (Hogwild), each whole. When nobody else
//!   holds the values, it updates them in place under the write locks, as `use_locking = true`
//!   does, rather than copy the whole variable first: concurrent updates of one variable then
//!   apply one after the other, which `use_locking = false` allows.
//!
//! `Assign` replaces the whole value, so it takes the write lock briefly either way.
//!
//! [`ResourceMgr`]: crate::runtime::resource::ResourceMgr

use std::sync::{Arc, RwLockWriteGuard};

use super::numeric::Real;
use super::{input, int_values, stateless};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::resource::step_container;
use crate::tensor::var::{snapshot_all, store_all};
use crate::tensor::{DType, Element, PartialShape, Shape, Tensor, Var};

/// Returns the factory for a reference-variable op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "VariableV2" | "Variable" => Variable::create,
        "TemporaryVariable" => TemporaryVariable::create,
        "DestroyTemporaryVariable" => DestroyTemporaryVariable::create,
        "IsVariableInitialized" => |_| stateless(is_initialized),
        "Assign" => Assign::create,
        "AssignAdd" | "AssignSub" => AssignUpdate::create,
        "ScatterUpdate" | "ScatterAdd" | "ScatterSub" | "ScatterMul" | "ScatterDiv"
        | "ScatterMin" | "ScatterMax" => Scatter::create,
        "CountUpTo" => CountUpTo::create,
        "RefIdentity" => |_| stateless(ref_identity),
        _ => return None,
    };
    Some(factory)
}

/// FAILED_PRECONDITION naming the node: the reference variable `name` has no value yet.
pub(super) fn uninitialized_ref(ctx: &OpContext<'_>, name: &str) -> Status {
    ctx.named(Status::failed_precondition(format!(
        "Attempting to use uninitialized value {name}: run its initializer (e.g. the op from \
         tf.compat.v1.global_variables_initializer()) before reading or updating it"
    )))
}

/// Runs one read-modify-write of `vars` (distinct variables: a locked update of one variable
/// passed twice would wait on itself) under the `use_locking` policy (see the module doc): `f`
/// gets their current values, in order, and changes them in place; they are the variables'
/// values once `f` returns `Ok`. An uninitialized variable `i` fails with `uninitialized(i)`
/// before `f` runs. When `f` fails, an update in place leaves the values as `f` left them
/// (every `f` here checks its inputs before it writes) and one on snapshots stores nothing.
pub(super) fn read_modify_write<R>(
    vars: &[&Var],
    use_locking: bool,
    uninitialized: impl Fn(usize) -> Status,
    f: impl FnOnce(&mut [&mut Tensor]) -> Result<R>,
) -> Result<R> {
    if use_locking || unshared(vars) {
        let mut guards = lock_in_order(vars, Var::write);
        f(&mut values_of(&mut guards, uninitialized)?)
    } else {
        // Read together and stored together: the update computes from one consistent state
        // of its variables and leaves one.
        let mut snapshots = snapshot_all(vars)
            .into_iter()
            .enumerate()
            .map(|(i, value)| value.ok_or_else(|| uninitialized(i)))
            .collect::<Result<Vec<Tensor>>>()?;
        let result = f(&mut snapshots.iter_mut().collect::<Vec<_>>())?;
        store_all(vars, snapshots);
        Ok(result)
    }
}

/// [`read_modify_write`] for an update of some rows of its variables (a scatter, a sparse
/// apply): `f` returns the rows it wrote, which the variables record for their replica
/// ([`Var::touched_rows`]) when they were updated in place.
pub(super) fn read_modify_write_rows(
    vars: &[&Var],
    use_locking: bool,
    uninitialized: impl Fn(usize) -> Status,
    f: impl FnOnce(&mut [&mut Tensor]) -> Result<Vec<usize>>,
) -> Result<()> {
    if use_locking || unshared(vars) {
        let mut guards = lock_in_order(vars, Var::write_rows);
        let rows = f(&mut values_of(&mut guards, uninitialized)?)?;
        for var in vars {
            var.touched_rows(&rows);
        }
        Ok(())
    } else {
        read_modify_write(vars, false, uninitialized, |values| f(values).map(|_| ()))
    }
}

/// Whether nobody else holds the variables' values. Without use_locking, a value nobody else
/// holds is updated where it lies, under the locks: computing on a snapshot would copy the
/// whole variable first (3.2x the in-place update's time on a 16 MiB variable in the
/// `executor` bench). The test is a moment early; a snapshot taken since only makes the
/// locked update copy.
fn unshared(vars: &[&Var]) -> bool {
    vars.iter()
        .all(|v| v.read().as_ref().is_some_and(Tensor::is_unique))
}

/// Write-locks `vars` with `lock`, in address order (as every multi-variable update does).
fn lock_in_order<'a>(
    vars: &[&'a Var],
    lock: fn(&'a Var) -> RwLockWriteGuard<'a, Option<Tensor>>,
) -> Vec<Option<RwLockWriteGuard<'a, Option<Tensor>>>> {
    let mut order: Vec<usize> = (0..vars.len()).collect();
    order.sort_by_key(|&i| std::ptr::from_ref::<Var>(vars[i]) as usize);
    let mut guards: Vec<Option<RwLockWriteGuard<'a, Option<Tensor>>>> =
        vars.iter().map(|_| None).collect();
    for i in order {
        guards[i] = Some(lock(vars[i]));
    }
    guards
}

/// The locked values, in order; `uninitialized(i)` for the first that has none.
fn values_of<'g>(
    guards: &'g mut [Option<RwLockWriteGuard<'_, Option<Tensor>>>],
    uninitialized: impl Fn(usize) -> Status,
) -> Result<Vec<&'g mut Tensor>> {
    let mut values = Vec::with_capacity(guards.len());
    for (i, guard) in guards.iter_mut().enumerate() {
        let guard = guard.as_mut().expect("every variable is locked");
        values.push(guard.as_mut().ok_or_else(|| uninitialized(i))?);
    }
    Ok(values)
}

/// Sets output 0 to the reference input 0, as TensorFlow forwards `ref` to `output_ref`.
fn forward_ref(ctx: &mut OpContext<'_>) -> Result<()> {
    let reference = input(ctx, 0)?;
    ctx.set_output(0, reference);
    Ok(())
}

/// Fails unless `value` has the variable's dtype.
fn check_dtype(ctx: &OpContext<'_>, var: &Var, name: &str, value: &Tensor) -> Result<()> {
    if value.dtype() != var.dtype {
        return Err(ctx.invalid(format!(
            "variable `{name}` holds {} but the value is {}; cast the value to {}",
            var.dtype,
            value.dtype(),
            var.dtype
        )));
    }
    Ok(())
}

/// VariableV2 / Variable: a reference to the variable at (container, shared_name or the node's
/// name), created uninitialized on first use.
struct Variable {
    container: String,
    name: String,
    dtype: DType,
    shape: PartialShape,
}

impl Variable {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let shared_name = attr::string_or(node, "shared_name", "")?;
        Ok(Arc::new(Variable {
            container: attr::string_or(node, "container", "")?,
            name: if shared_name.is_empty() {
                node.name.clone()
            } else {
                shared_name
            },
            dtype: attr::dtype(node, "dtype")?,
            shape: attr::shape(node, "shape")?,
        }))
    }
}

impl OpKernel for Variable {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let var = ctx
            .resources
            .lookup_or_create::<Var>(&self.container, &self.name, || {
                Ok(Var::new(self.dtype, self.shape.clone()))
            })
            .map_err(|e| ctx.named(e))?;
        if var.dtype != self.dtype {
            return Err(ctx.invalid(format!(
                "Trying to share variable `{}` as {}, but it holds {}; give the variables \
                 different names or the same dtype",
                self.name, self.dtype, var.dtype
            )));
        }
        let name = ctx.node().name.clone();
        ctx.set_output(0, Tensor::reference(var, name));
        Ok(())
    }
}

// Temporary variables live in the step's container (`runtime::resource::step_container`): a
// `TemporaryVariable` whose `DestroyTemporaryVariable` never ran (a failed step) stays there
// until the step's end clears the container.

/// A temporary variable's name in its step container: unique per loop iteration, since
/// iterations of one loop may run at once.
fn temporary_name(ctx: &OpContext<'_>, var_name: &str) -> String {
    let (frame, iter) = ctx.frame_iter();
    format!("{var_name}/frame:{frame}/iter:{iter}")
}

/// TemporaryVariable: a variable that lives until its DestroyTemporaryVariable in the same
/// step, holding zeros of `shape` from the start.
struct TemporaryVariable {
    var_name: String,
    dtype: DType,
    shape: Shape,
}

impl TemporaryVariable {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let shape = attr::shape(node, "shape")?;
        let shape = shape.to_shape().ok_or_else(|| {
            Status::invalid_argument(format!(
                "node `{}` (op TemporaryVariable): shape {shape} must be fully defined",
                node.name
            ))
        })?;
        let var_name = attr::string_or(node, "var_name", "")?;
        Ok(Arc::new(TemporaryVariable {
            var_name: if var_name.is_empty() {
                node.name.clone()
            } else {
                var_name
            },
            dtype: attr::dtype(node, "dtype")?,
            shape,
        }))
    }
}

impl OpKernel for TemporaryVariable {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (container, name) = (
            step_container(ctx.step_id),
            temporary_name(ctx, &self.var_name),
        );
        if ctx.resources.lookup::<Var>(&container, &name).is_ok() {
            return Err(ctx.named(Status::already_exists(format!(
                "temporary variable `{name}` already exists in this step; give each \
                 TemporaryVariable its own var_name"
            ))));
        }
        let value = Tensor::zeros(self.dtype, self.shape.clone()).map_err(|e| ctx.named(e))?;
        let var = ctx
            .resources
            .lookup_or_create::<Var>(&container, &name, || {
                let var = Var::new(self.dtype, PartialShape::from(&self.shape));
                *var.write() = Some(value);
                Ok(var)
            })
            .map_err(|e| ctx.named(e))?;
        ctx.set_output(0, Tensor::reference(var, name));
        Ok(())
    }
}

/// DestroyTemporaryVariable: outputs the temporary variable's final value and removes it.
struct DestroyTemporaryVariable {
    var_name: String,
}

impl DestroyTemporaryVariable {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let var_name = attr::string_or(node, "var_name", "")?;
        if var_name.is_empty() {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op DestroyTemporaryVariable): Missing var_name attribute; set it to \
                 the var_name of the TemporaryVariable it destroys",
                node.name
            )));
        }
        Ok(Arc::new(DestroyTemporaryVariable { var_name }))
    }
}

impl OpKernel for DestroyTemporaryVariable {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (var, name) = ctx.ref_input(0)?;
        let value = var
            .snapshot()
            .ok_or_else(|| uninitialized_ref(ctx, &name))?;
        let (container, unique) = (
            step_container(ctx.step_id),
            temporary_name(ctx, &self.var_name),
        );
        ctx.resources
            .delete(&container, &unique)
            .map_err(|e| ctx.named(e))?;
        ctx.set_output(0, value);
        Ok(())
    }
}

/// IsVariableInitialized: whether the referenced variable holds a value.
fn is_initialized(ctx: &mut OpContext<'_>) -> Result<()> {
    let (var, _) = ctx.ref_input(0)?;
    ctx.set_output(0, Tensor::scalar(var.is_initialized()));
    Ok(())
}

/// RefIdentity: the same reference.
fn ref_identity(ctx: &mut OpContext<'_>) -> Result<()> {
    ctx.ref_input(0)?;
    forward_ref(ctx)
}

/// Assign: sets the variable's value (initializing it) and outputs the reference.
struct Assign {
    validate_shape: bool,
}

impl Assign {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Assign {
            validate_shape: attr::bool_or(node, "validate_shape", true)?,
        }))
    }
}

impl OpKernel for Assign {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (var, name) = ctx.ref_input(0)?;
        let value = input(ctx, 1)?;
        check_dtype(ctx, &var, &name, &value)?;
        // The store's byte limit, checked before the write lock: the check reads every
        // variable of the store, this one included.
        let old_bytes = var.read().as_ref().map_or(0, |t| t.byte_size() as u64);
        ctx.resources.check_var_bytes(
            &format!("node `{}`: variable `{name}`", ctx.node().name),
            old_bytes,
            value.byte_size() as u64,
        )?;
        let mut slot = var.write();
        if self.validate_shape {
            let fits = match slot.as_ref() {
                Some(old) => old.shape() == value.shape(),
                None => var.shape.is_compatible_with(value.shape()),
            };
            if !fits {
                let lhs = slot
                    .as_ref()
                    .map_or_else(|| var.shape.to_string(), |old| old.shape().to_string());
                return Err(ctx.invalid(format!(
                    "Assign requires shapes of both tensors to match. lhs shape= {lhs} rhs \
                     shape= {}; pass validate_shape=False to give variable `{name}` a new shape",
                    value.shape()
                )));
            }
        }
        *slot = Some(value);
        drop(slot);
        forward_ref(ctx)
    }
}

/// AssignAdd / AssignSub: adds (subtracts) a value of the variable's shape in place.
struct AssignUpdate {
    subtract: bool,
    use_locking: bool,
}

impl AssignUpdate {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(AssignUpdate {
            subtract: node.op == "AssignSub",
            use_locking: attr::bool_or(node, "use_locking", false)?,
        }))
    }
}

impl OpKernel for AssignUpdate {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (var, name) = ctx.ref_input(0)?;
        let delta = input(ctx, 1)?;
        check_dtype(ctx, &var, &name, &delta)?;
        read_modify_write(
            &[&var],
            self.use_locking,
            |_| uninitialized_ref(ctx, &name),
            |values| {
                let value = &mut *values[0];
                if value.shape() != delta.shape() {
                    return Err(ctx.invalid(format!(
                        "Cannot update variable `{name}` with shape {} using a Tensor with shape \
                         {}, shapes must be equal.",
                        value.shape(),
                        delta.shape()
                    )));
                }
                dispatch_real!(ctx, value.dtype(), T => {
                    let d = delta.values::<T>()?;
                    let f: fn(T, T) -> T = if self.subtract { Real::sub } else { Real::add };
                    value.update_in_place::<T, _>(|v| {
                        for (v, &d) in v.iter_mut().zip(d.iter()) {
                            *v = f(*v, d);
                        }
                    })
                })
            },
        )?;
        forward_ref(ctx)
    }
}

/// How a `Scatter*` op combines a row of the variable with a row of updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScatterOp {
    Update,
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

/// ScatterUpdate / ScatterAdd / ... : `ref[indices[i], ...] op= updates[i, ...]` in place, for
/// indices of any shape; updates of shape `indices.shape + ref.shape[1:]`, or a scalar for
/// every element of the indexed rows. Repeated indices apply in order.
struct Scatter {
    op: ScatterOp,
    use_locking: bool,
}

impl Scatter {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let op = match node.op.as_str() {
            "ScatterUpdate" => ScatterOp::Update,
            "ScatterAdd" => ScatterOp::Add,
            "ScatterSub" => ScatterOp::Sub,
            "ScatterMul" => ScatterOp::Mul,
            "ScatterDiv" => ScatterOp::Div,
            "ScatterMin" => ScatterOp::Min,
            _ => ScatterOp::Max,
        };
        Ok(Arc::new(Scatter {
            op,
            use_locking: attr::bool_or(node, "use_locking", op == ScatterOp::Update)?,
        }))
    }

    /// Checks the shapes and indices against the variable's current value; returns the row
    /// index of each update and the elements per row.
    fn rows(
        &self,
        ctx: &OpContext<'_>,
        params: &Tensor,
        indices: &Tensor,
        updates: &Tensor,
    ) -> Result<(Vec<usize>, usize)> {
        let Some((&rows, inner)) = params.dims().split_first() else {
            return Err(ctx.invalid(format!(
                "params must be at least 1-D, got shape {}",
                params.shape()
            )));
        };
        let want: Vec<usize> = indices.dims().iter().chain(inner).copied().collect();
        if updates.rank() != 0 && updates.dims() != want.as_slice() {
            return Err(ctx.invalid(format!(
                "Must have updates.shape = indices.shape + params.shape[1:] or updates.shape = \
                 [], got updates.shape {}, indices.shape {}, params.shape {}",
                updates.shape(),
                indices.shape(),
                params.shape()
            )));
        }
        let positions = int_values(ctx, indices, "indices")?;
        let rows = positions
            .iter()
            .enumerate()
            .map(|(i, &index)| {
                usize::try_from(index)
                    .ok()
                    .filter(|&r| r < rows)
                    .ok_or_else(|| {
                        ctx.invalid(format!(
                            "indices{} = {index} is not in [0, {rows})",
                            element_position(indices.dims(), i)
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((rows, inner.iter().product()))
    }

    /// Applies the updates to `params` in place.
    fn apply<T: Element + bytemuck::Pod>(
        params: &mut Tensor,
        rows: &[usize],
        inner: usize,
        updates: &Tensor,
        f: impl Fn(T, T) -> T,
    ) -> Result<()> {
        let u = updates.values::<T>()?;
        params.update_in_place::<T, _>(|p| scatter_rows(p, rows, inner, &u, f))
    }
}

/// `p[rows[i], j] = f(p[rows[i], j], u[i, j])` for rows of `inner` elements; a one-element `u`
/// updates every element of the rows.
pub(super) fn scatter_rows<T: Copy>(
    p: &mut [T],
    rows: &[usize],
    inner: usize,
    u: &[T],
    f: impl Fn(T, T) -> T,
) {
    for (i, &row) in rows.iter().enumerate() {
        let target = &mut p[row * inner..(row + 1) * inner];
        for (j, x) in target.iter_mut().enumerate() {
            let update = if u.len() == 1 { u[0] } else { u[i * inner + j] };
            *x = f(*x, update);
        }
    }
}

impl OpKernel for Scatter {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (var, name) = ctx.ref_input(0)?;
        let (indices, updates) = (input(ctx, 1)?, input(ctx, 2)?);
        check_dtype(ctx, &var, &name, &updates)?;
        read_modify_write_rows(
            &[&var],
            self.use_locking,
            |_| uninitialized_ref(ctx, &name),
            |values| {
                let params = &mut *values[0];
                let (rows, inner) = self.rows(ctx, params, &indices, &updates)?;
                (|| -> Result<()> {
                    if self.op == ScatterOp::Update && params.dtype() == DType::Bool {
                        // Bools are not plain bytes to write through: update a copy.
                        let mut p = params.values::<bool>()?.into_owned();
                        scatter_rows(&mut p, &rows, inner, &updates.values::<bool>()?, |_, u| u);
                        *params = Tensor::from_vec(params.shape().clone(), p)?;
                        return Ok(());
                    }
                    if self.op == ScatterOp::Update {
                        return dispatch_real!(ctx, params.dtype(), T => {
                            Self::apply::<T>(params, &rows, inner, &updates, |_, u| u)
                        });
                    }
                    dispatch_real!(ctx, params.dtype(), T => {
                        if self.op == ScatterOp::Div
                            && T::IS_INT
                            && updates.values::<T>()?.iter().any(|&u| Real::is_zero(u))
                        {
                            return Err(ctx.invalid(
                                "ScatterDiv by zero: an integer update is 0; integer division by \
                                 zero is undefined",
                            ));
                        }
                        let f: fn(T, T) -> T = match self.op {
                            ScatterOp::Add => Real::add,
                            ScatterOp::Sub => Real::sub,
                            ScatterOp::Mul => Real::mul,
                            ScatterOp::Div => Real::div,
                            ScatterOp::Min => Real::min,
                            ScatterOp::Max | ScatterOp::Update => Real::max,
                        };
                        Self::apply::<T>(params, &rows, inner, &updates, f)
                    })
                })()?;
                Ok(rows)
            },
        )?;
        forward_ref(ctx)
    }
}

/// Where flat element `i` of a tensor of shape `dims` sits, as TensorFlow writes it in
/// messages: `[1,0]`, or nothing for a scalar.
fn element_position(dims: &[usize], mut i: usize) -> String {
    if dims.is_empty() {
        return String::new();
    }
    let mut position = vec![0; dims.len()];
    for (p, &d) in position.iter_mut().zip(dims).rev() {
        *p = i % d.max(1);
        i /= d.max(1);
    }
    let parts: Vec<String> = position.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// CountUpTo: returns the scalar variable's value and increments it, until `limit`.
struct CountUpTo {
    limit: i64,
}

impl CountUpTo {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(CountUpTo {
            limit: attr::int(node, "limit")?,
        }))
    }

    fn count<T: Element + bytemuck::Pod + Into<i64> + TryFrom<i64>>(
        &self,
        ctx: &OpContext<'_>,
        value: &mut Tensor,
    ) -> Result<Tensor> {
        let before: T = value.scalar_value::<T>()?;
        if before.into() >= self.limit {
            return Err(ctx.named(Status::out_of_range(format!(
                "Reached limit of {}",
                self.limit
            ))));
        }
        let after = T::try_from(before.into() + 1)
            .map_err(|_| ctx.invalid("the counter overflows its dtype"))?;
        value.update_in_place::<T, _>(|v| v[0] = after)?;
        Ok(Tensor::scalar(before))
    }
}

impl OpKernel for CountUpTo {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (var, name) = ctx.ref_input(0)?;
        let before = read_modify_write(
            &[&var],
            true,
            |_| uninitialized_ref(ctx, &name),
            |values| {
                let value = &mut *values[0];
                if value.rank() != 0 {
                    return Err(ctx.invalid(format!(
                        "input is not a scalar: {}; CountUpTo counts in a scalar variable",
                        value.shape()
                    )));
                }
                match value.dtype() {
                    DType::Int32 => self.count::<i32>(ctx, value),
                    DType::Int64 => self.count::<i64>(ctx, value),
                    other => Err(super::unsupported_dtype(
                        ctx,
                        other,
                        &[DType::Int32, DType::Int64],
                    )),
                }
            },
        )?;
        ctx.set_output(0, before);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_read_as_tensorflow_writes_them() {
        assert_eq!(element_position(&[], 0), "");
        assert_eq!(element_position(&[4], 2), "[2]");
        assert_eq!(element_position(&[2, 3], 4), "[1,1]");
    }
}
