//! Row access to resource variables, what embedding tables are read and updated through:
//! `ResourceGather` (rows of the variable, with batch dimensions), the
//! `ResourceScatter{Update,Add,Sub,Mul,Div,Min,Max}` row updates, `VariableShape` and
//! `DisableCopyOnRead`.
//!
//! A gather reads a snapshot of the value (no copy, see [`crate::tensor::Var`]) and copies out
//! only the rows it picks. A scatter holds the variable's write lock across its
//! read-modify-write, as TensorFlow's resource scatters do, and writes into the variable's
//! buffer in place unless a snapshot still shares it; so a step that touches a few rows of a
//! big table costs those rows, not the table.

use std::sync::Arc;

use super::numeric::Real;
use super::ref_variable::{read_modify_write_rows, scatter_rows};
use super::slicing::{gather_batched, unravel};
use super::variable::{handle_input, lookup_var, uninitialized};
use super::{input, int_values, Items};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Element, Tensor};

/// Returns the factory for a resource-variable row op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "ResourceGather" => ResourceGather::create,
        "ResourceScatterUpdate"
        | "ResourceScatterAdd"
        | "ResourceScatterSub"
        | "ResourceScatterMul"
        | "ResourceScatterDiv"
        | "ResourceScatterMin"
        | "ResourceScatterMax" => ResourceScatter::create,
        "VariableShape" => VariableShape::create,
        "DisableCopyOnRead" => |_| super::stateless(disable_copy_on_read),
        _ => return None,
    };
    Some(factory)
}

/// Returns a snapshot of the value of the variable input 0 names.
fn snapshot(ctx: &OpContext<'_>) -> Result<Tensor> {
    let h = handle_input(ctx, 0)?;
    let var = lookup_var(ctx, &h)?;
    let value = var.snapshot();
    value.ok_or_else(|| uninitialized(ctx, &h))
}

/// ResourceGather(resource, indices): `GatherV2(value, indices, axis=batch_dims)`.
/// `validate_indices` is accepted and ignored: indices are always checked, as on TensorFlow's
/// CPU.
struct ResourceGather {
    batch_dims: i64,
    dtype: Option<DType>,
}

impl ResourceGather {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let dtype = match attr::get(node, "dtype") {
            Some(_) => Some(attr::dtype(node, "dtype")?),
            None => None,
        };
        Ok(Arc::new(ResourceGather {
            batch_dims: attr::int_or(node, "batch_dims", 0)?,
            dtype,
        }))
    }
}

impl OpKernel for ResourceGather {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let indices = input(ctx, 1)?;
        let value = snapshot(ctx)?;
        if let Some(dtype) = self.dtype.filter(|&d| d != value.dtype()) {
            return Err(ctx.invalid(format!(
                "the variable holds {} but the op reads {dtype}; set dtype to {}",
                value.dtype(),
                value.dtype()
            )));
        }
        let b = self.batch_dims;
        if b < 0 {
            return Err(ctx.invalid(format!("batch_dims is negative ({b})")));
        }
        let (b, rank) = (b as usize, value.rank());
        if rank < b {
            return Err(ctx.invalid(format!(
                "params must have at least {b} (batch_dims) dimensions but it has shape {}",
                value.shape()
            )));
        }
        if rank == 0 {
            return Err(ctx.invalid("params must be at least 1 dimensional"));
        }
        if rank == b {
            return Err(ctx.invalid(format!(
                "batch_dims ({b}) must be less than rank(params) ({rank})."
            )));
        }
        if indices.rank() < b {
            return Err(ctx.invalid(format!(
                "Expected batch_dims in the range [{}, {}], but got {b}",
                -(indices.rank() as i64),
                indices.rank()
            )));
        }
        let out = gather_batched(ctx, &value, &indices, b, b)?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// How a resource scatter combines a row of the variable with a row of updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    Update,
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

/// ResourceScatter*(resource, indices, updates): `var[indices[i], ...] op= updates[i, ...]`,
/// with updates of shape `indices.shape + var.shape[1:]` or a scalar for every element of the
/// indexed rows; repeated indices apply in order.
struct ResourceScatter {
    combine: Combine,
}

impl ResourceScatter {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let combine = match node.op.trim_start_matches("ResourceScatter") {
            "Update" => Combine::Update,
            "Add" => Combine::Add,
            "Sub" => Combine::Sub,
            "Mul" => Combine::Mul,
            "Div" => Combine::Div,
            "Min" => Combine::Min,
            _ => Combine::Max,
        };
        Ok(Arc::new(ResourceScatter { combine }))
    }

    /// Checks shapes and indices against the variable's value; returns each update's row and
    /// the elements per row.
    fn rows(
        ctx: &OpContext<'_>,
        params: &Tensor,
        indices: &Tensor,
        updates: &Tensor,
    ) -> Result<(Vec<usize>, usize)> {
        let inner = params.dims().get(1..).unwrap_or_default();
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
        let Some(&limit) = params.dims().first() else {
            return Err(ctx.invalid(format!(
                "params must be at least 1-D, got shape {}",
                params.shape()
            )));
        };
        let rows = int_values(ctx, indices, "indices")?
            .iter()
            .enumerate()
            .map(|(i, &index)| {
                usize::try_from(index)
                    .ok()
                    .filter(|&r| r < limit)
                    .ok_or_else(|| {
                        let at = if indices.rank() == 0 {
                            String::new()
                        } else {
                            format!("[{}]", unravel(i, indices.dims()))
                        };
                        ctx.invalid(format!("indices{at} = {index} is not in [0, {limit})"))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((rows, inner.iter().product()))
    }

    /// Applies arithmetic updates in place.
    fn apply<T: Real + bytemuck::Pod>(
        &self,
        ctx: &OpContext<'_>,
        params: &mut Tensor,
        rows: &[usize],
        inner: usize,
        updates: &Tensor,
    ) -> Result<()> {
        let u = updates.values::<T>()?;
        if self.combine == Combine::Div && T::IS_INT && u.iter().any(|&v| Real::is_zero(v)) {
            return Err(ctx.invalid("updates must not contain 0"));
        }
        let f: fn(T, T) -> T = match self.combine {
            Combine::Update => |_, u| u,
            Combine::Add => Real::add,
            Combine::Sub => Real::sub,
            Combine::Mul => Real::mul,
            Combine::Div => Real::div,
            Combine::Min => Real::min,
            Combine::Max => Real::max,
        };
        params.update_in_place::<T, _>(|p| scatter_rows(p, rows, inner, &u, f))
    }
}

/// Replaces rows of a value whose elements cannot be written in place (bools, strings).
fn update_copy<T: Items + Copy + Element>(
    params: &mut Tensor,
    rows: &[usize],
    inner: usize,
    updates: &Tensor,
) -> Result<()> {
    let mut p = T::items(params)?.into_owned();
    scatter_rows(&mut p, rows, inner, &T::items(updates)?, |_, u| u);
    *params = T::tensor(params.shape().clone(), p)?;
    Ok(())
}

impl OpKernel for ResourceScatter {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let h = handle_input(ctx, 0)?;
        let (indices, updates) = (input(ctx, 1)?, input(ctx, 2)?);
        let var = lookup_var(ctx, &h)?;
        if updates.dtype() != var.dtype {
            return Err(ctx.invalid(format!(
                "DType of scatter resource and updates does not match. The variable holds {} \
                 and the updates are {}",
                var.dtype,
                updates.dtype()
            )));
        }
        read_modify_write_rows(
            &[&var],
            true,
            |_| uninitialized(ctx, &h),
            |values| {
                let params = &mut *values[0];
                let (rows, inner) = Self::rows(ctx, params, &indices, &updates)?;
                (|| -> Result<()> {
                    match (self.combine, params.dtype()) {
                        (Combine::Update, DType::Bool) => {
                            update_copy::<bool>(params, &rows, inner, &updates)
                        }
                        (Combine::Update, DType::String) => {
                            let mut p = params.strings()?.to_vec();
                            let u = updates.strings()?;
                            for (i, &row) in rows.iter().enumerate() {
                                for j in 0..inner {
                                    let v = if u.len() == 1 { 0 } else { i * inner + j };
                                    p[row * inner + j] = u[v].clone();
                                }
                            }
                            *params = Tensor::from_strings(params.shape().clone(), p)?;
                            Ok(())
                        }
                        (_, dtype) => dispatch_real!(ctx, dtype, T => {
                            self.apply::<T>(ctx, params, &rows, inner, &updates)
                        }),
                    }
                })()?;
                Ok(rows)
            },
        )
    }
}

/// VariableShape(input): the shape of the variable's value, as `out_type` (int32 default).
struct VariableShape {
    out_type: DType,
}

impl VariableShape {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let out_type = match attr::get(node, "out_type") {
            Some(_) => attr::dtype(node, "out_type")?,
            None => DType::Int32,
        };
        Ok(Arc::new(VariableShape { out_type }))
    }
}

impl OpKernel for VariableShape {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let value = snapshot(ctx)?;
        let dims = value.dims();
        let out = if self.out_type == DType::Int64 {
            Tensor::from_vec([dims.len()], dims.iter().map(|&d| d as i64).collect())?
        } else {
            let narrow = dims
                .iter()
                .map(|&d| i32::try_from(d))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|_| {
                    ctx.invalid(format!(
                        "the variable's shape {} does not fit int32; set out_type to int64",
                        value.shape()
                    ))
                })?;
            Tensor::from_vec([dims.len()], narrow)?
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// DisableCopyOnRead(resource): TensorFlow's switch from copy-on-read to copy-on-write for a
/// variable that sparse updates touch. tessera's variables are copy-on-write already (a read
/// is a reference-counted snapshot and an update copies only while a snapshot is still held,
/// see [`crate::tensor::Var`]), so this only checks that the variable exists.
fn disable_copy_on_read(ctx: &mut OpContext<'_>) -> Result<()> {
    let h = handle_input(ctx, 0)?;
    lookup_var(ctx, &h)?;
    Ok(())
}
