//! `BatchDataset(V2)` and `PaddedBatchDataset(V2)`: runs of `batch_size` elements stacked
//! along a new first dimension, the last run shorter unless `drop_remainder`. A plain batch
//! needs every element of a run to have the same shape (TensorFlow's error otherwise); a
//! padded batch pads each component to its `padded_shapes` entry, a -1 dimension to the
//! largest in the run, with the component's padding value.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{bool_input, dataset_input, dataset_op, int64_input, Dataset, DatasetNode};
use super::{Element, Iter, Origin};
use crate::error::{Result, Status};
use crate::kernels::cpu::rows;
use crate::kernels::{KernelFactory, OpContext};
use crate::tensor::{DType, Shape, Tensor};

pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "BatchDataset" | "BatchDatasetV2" => |n| dataset_op(n, batch),
        "PaddedBatchDataset" | "PaddedBatchDatasetV2" => |n| dataset_op(n, padded_batch),
        _ => return None,
    };
    Some(factory)
}

/// How a padded batch pads one component: each dimension's size (`None`: the run's largest)
/// and the value of the padding.
struct Padding {
    dims: Vec<Option<usize>>,
    value: Tensor,
}

struct Batch {
    origin: Origin,
    input: Arc<dyn Dataset>,
    size: usize,
    drop_remainder: bool,
    /// Per component, for a padded batch.
    padding: Option<Vec<Padding>>,
}

fn batch_size(ctx: &OpContext<'_>) -> Result<usize> {
    match int64_input(ctx, 1, "batch_size")? {
        n if n > 0 => Ok(n as usize),
        n => Err(ctx.invalid(format!("Batch size must be greater than zero, got {n}"))),
    }
}

fn batch(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let drop_remainder = if d.origin.op == "BatchDatasetV2" {
        bool_input(ctx, 2, "drop_remainder")?
    } else {
        false
    };
    Ok(Arc::new(Batch {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        size: batch_size(ctx)?,
        drop_remainder,
        padding: None,
    }))
}

fn padded_batch(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let n = crate::graph::attr::int(ctx.node(), "N")? as usize;
    // Inputs: dataset, batch_size, N padded shapes, N padding values, [drop_remainder].
    if ctx.num_inputs() < 2 + 2 * n {
        return Err(ctx.invalid(format!(
            "expected {} padded shapes and as many padding values",
            n
        )));
    }
    let mut padding = Vec::with_capacity(n);
    for i in 0..n {
        let shape = ctx.input(2 + i)?;
        if shape.rank() != 1 {
            return Err(ctx.invalid(format!(
                "padded_shapes[{i}] must be a vector, got shape {}",
                shape.shape()
            )));
        }
        let dims = shape
            .values::<i64>()?
            .iter()
            .map(|&d| match d {
                -1 => Ok(None),
                d if d >= 0 => Ok(Some(d as usize)),
                d => Err(ctx.invalid(format!(
                    "padded_shapes[{i}] has dimension {d}; use -1 to pad to the largest"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let value = ctx.input(2 + n + i)?.clone();
        if value.num_elements() != 1 {
            return Err(ctx.invalid(format!(
                "padding_values[{i}] must be a scalar, got shape {}",
                value.shape()
            )));
        }
        padding.push(Padding { dims, value });
    }
    let drop_remainder = if d.origin.op == "PaddedBatchDatasetV2" {
        bool_input(ctx, 2 + 2 * n, "drop_remainder")?
    } else {
        false
    };
    Ok(Arc::new(Batch {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        size: batch_size(ctx)?,
        drop_remainder,
        padding: Some(padding),
    }))
}

impl Dataset for Batch {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(BatchIter {
            input: Some(self.input.clone().iterate(ctx)?),
            dataset: self,
        }))
    }

    fn cardinality(&self) -> i64 {
        let n = self.input.cardinality();
        if n < 0 {
            return n;
        }
        let size = self.size as i64;
        if self.drop_remainder {
            n / size
        } else {
            (n + size - 1) / size
        }
    }
}

struct BatchIter {
    dataset: Arc<Batch>,
    input: Option<Box<dyn Iter>>,
}

impl Iter for BatchIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let d = self.dataset.clone();
        let Some(input) = self.input.as_mut() else {
            return Ok(None);
        };
        let mut run: Vec<Element> = Vec::with_capacity(d.size);
        while run.len() < d.size {
            match input.next(ctx)? {
                Some(element) => run.push(element),
                None => {
                    self.input = None;
                    break;
                }
            }
        }
        if run.is_empty() || (d.drop_remainder && run.len() < d.size) {
            return Ok(None);
        }
        let components = run[0].len();
        let mut out = Vec::with_capacity(components);
        for c in 0..components {
            let parts: Vec<&Tensor> = run.iter().map(|e| &e[c]).collect();
            let stacked = match &d.padding {
                None => stack(&d.origin, c, &parts),
                Some(padding) => pad_and_stack(&d.origin, c, &parts, &padding[c]),
            };
            out.push(stacked.map_err(|e| ctx.named(e))?);
        }
        Ok(Some(out))
    }
}

/// Stacks one component of a run, every part of the same dtype and shape.
fn stack(origin: &Origin, c: usize, parts: &[&Tensor]) -> Result<Tensor> {
    let first = parts[0];
    for (i, p) in parts.iter().enumerate().skip(1) {
        if p.shape() != first.shape() || p.dtype() != first.dtype() {
            return Err(origin.invalid(format!(
                "Cannot batch tensors with different shapes in component {c}. First element \
                 had shape {} and element {i} had shape {}; pad them with padded_batch, or \
                 make them one shape before batching",
                first.shape(),
                p.shape()
            )));
        }
    }
    rows::stack(first.dtype(), parts, first.shape())
}

/// Pads each part of one component to the component's padded shape and stacks them.
fn pad_and_stack(
    origin: &Origin,
    c: usize,
    parts: &[&Tensor],
    padding: &Padding,
) -> Result<Tensor> {
    let rank = padding.dims.len();
    let mut dims = vec![0usize; rank];
    for (i, p) in parts.iter().enumerate() {
        if p.rank() != rank {
            return Err(origin.invalid(format!(
                "element {i}'s component {c} has shape {}, of rank {}; its padded shape has rank \
                 {rank}",
                p.shape(),
                p.rank()
            )));
        }
        if p.dtype() != padding.value.dtype() {
            return Err(origin.invalid(format!(
                "element {i}'s component {c} is {}, its padding value {}",
                p.dtype(),
                padding.value.dtype()
            )));
        }
        for (k, (&have, want)) in p.dims().iter().zip(&padding.dims).enumerate() {
            match want {
                Some(w) if have > *w => {
                    return Err(origin.invalid(format!(
                        "Attempted to pad to a smaller size than the input element: component \
                         {c} of element {i} has shape {}, dimension {k} is padded to {w}",
                        p.shape()
                    )))
                }
                Some(w) => dims[k] = *w,
                None => dims[k] = dims[k].max(have),
            }
        }
    }
    let row = Shape::new(dims);
    let padded = parts
        .iter()
        .map(|p| pad(p, &row, &padding.value))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = padded.iter().collect();
    rows::stack(padding.value.dtype(), &refs, &row)
}

/// `t` placed at the origin of a tensor of shape `to` filled with `value`.
fn pad(t: &Tensor, to: &Shape, value: &Tensor) -> Result<Tensor> {
    if t.shape() == to {
        return Ok(t.clone());
    }
    let n = to.num_elements();
    let from = t.dims();
    // Copies each innermost run of `t` to where it lands in the padded tensor.
    let runs = |copy: &mut dyn FnMut(usize, usize, usize)| {
        let last = from.last().copied().unwrap_or(1);
        let outer: usize = from[..from.len().saturating_sub(1)].iter().product();
        let mut index = vec![0usize; from.len().saturating_sub(1)];
        for r in 0..outer {
            let mut dst = 0;
            for (k, &i) in index.iter().enumerate() {
                dst = dst * to.dims()[k] + i;
            }
            if !from.is_empty() {
                dst *= to.dims()[from.len() - 1];
            }
            copy(r * last, dst, last);
            for k in (0..index.len()).rev() {
                index[k] += 1;
                if index[k] < from[k] {
                    break;
                }
                index[k] = 0;
            }
        }
    };
    match t.dtype() {
        DType::String => {
            let fill = value.strings()?[0].clone();
            let mut out = vec![fill; n];
            let src = t.strings()?;
            runs(&mut |s, d, len| out[d..d + len].clone_from_slice(&src[s..s + len]));
            Tensor::from_strings(to.clone(), out)
        }
        dtype => {
            let size = dtype
                .size()
                .ok_or_else(|| Status::unimplemented(format!("padded_batch of {dtype} tensors")))?;
            let fill = value.to_host()?.shared_bytes().unwrap_or_default();
            let mut out = BytesMut::with_capacity(n * size);
            for _ in 0..n {
                out.extend_from_slice(&fill);
            }
            let host = t.to_host()?;
            let src: Bytes = host.shared_bytes().unwrap_or_default();
            runs(&mut |s, d, len| {
                out[d * size..(d + len) * size].copy_from_slice(&src[s * size..(s + len) * size])
            });
            Tensor::from_bytes(dtype, to.clone(), out.freeze())
        }
    }
}
