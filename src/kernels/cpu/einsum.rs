//! `Einsum`: tensor contractions written as equations (`crate::graph::einsum` parses them),
//! computed as TensorFlow's `einsum_op_impl.h` does: each input is first reduced on its own
//! (a repeated label reads its diagonal, a label in no other operand is summed), transposed
//! and reshaped into a batch of matrices `[batch, free, contracted]`; a binary equation is then
//! one batched matrix product through the kernels' GEMM (`super::gemm`), the batch
//! broadcasting as `BatchMatMulV2`'s does; the result is transposed into the output's order,
//! a label repeated there writing a diagonal.
//!
//! The checks and messages are TensorFlow's: exactly one `->`, one or two inputs and as many
//! tensors, each input's rank against its subscript, every label one dimension, the ellipsis
//! dimensions broadcastable and, when there are any, an ellipsis in the output.

use std::collections::HashMap;
use std::sync::Arc;

use ndarray::{ArrayView2, ArrayViewMut2};

use super::broadcast::{broadcast_shape, broadcast_to};
use super::gemm::{matmul, Threads};
use super::numeric::Real;
use super::{input, same_dtype};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::graph::einsum::{Equation, Label};
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Shape, Tensor};

/// Einsum(inputs): the equation's contraction of one or two tensors.
pub(super) struct Einsum {
    equation: Equation,
}

impl Einsum {
    /// Parses the `equation` attr; a malformed one fails when the kernel is made, as
    /// TensorFlow's constructor does.
    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let text = attr::string_or(node, "equation", "")?;
        let equation = Equation::parse(&text).map_err(|m| {
            Status::invalid_argument(format!("node `{}` (op {}): {m}", node.name, node.op))
        })?;
        Ok(Arc::new(Einsum { equation }))
    }
}

/// Where every label of an equation lies, for the shapes of one run. Labels are numbered:
/// the named ones in order of appearance, then one per broadcast (ellipsis) dimension.
struct Plan {
    /// Each input's label per axis.
    inputs: Vec<Vec<usize>>,
    /// The output's label per axis.
    output: Vec<usize>,
    /// The output's size of each label (the broadcast size for ellipsis dimensions).
    sizes: Vec<usize>,
}

impl Plan {
    /// Resolves the equation against the inputs' shapes with TensorFlow's checks.
    fn new(ctx: &OpContext<'_>, eq: &Equation, shapes: &[&Shape]) -> Result<Plan> {
        let mut ids: HashMap<u8, usize> = HashMap::new();
        let mut sizes: Vec<usize> = Vec::new();
        let mut ellipsis_dims: Vec<Vec<usize>> = Vec::new();
        for (i, (labels, shape)) in eq.inputs.iter().zip(shapes).enumerate() {
            let named = labels.iter().filter(|l| **l != Label::Ellipsis).count();
            let rank = shape.rank();
            if Equation::has_ellipsis(labels) {
                if rank < named {
                    return Err(ctx.invalid(format!(
                        "Expected input {i} to have rank at least {named} but got: {rank}"
                    )));
                }
            } else if rank != named {
                return Err(ctx.invalid(format!(
                    "Expected input {i} to have rank {named} but got: {rank}"
                )));
            }
            let extra = rank - named;
            let mut axis = 0;
            let mut bcast = Vec::new();
            for label in labels {
                match *label {
                    Label::Ellipsis => {
                        bcast = shape.dims()[axis..axis + extra].to_vec();
                        axis += extra;
                    }
                    Label::Named(c) => {
                        let d = shape.dims()[axis];
                        match ids.get(&c) {
                            Some(&id) if sizes[id] != d => {
                                return Err(ctx.invalid(format!(
                                    "Expected dimension {} at axis {axis} of the input shaped \
                                     {shape} but got dimension {d}",
                                    sizes[id]
                                )));
                            }
                            Some(_) => {}
                            None => {
                                ids.insert(c, sizes.len());
                                sizes.push(d);
                            }
                        }
                        axis += 1;
                    }
                }
            }
            ellipsis_dims.push(bcast);
        }
        let bcast = match &ellipsis_dims[..] {
            [a] => a.clone(),
            [a, b] => broadcast_shape(a, b).ok_or_else(|| {
                ctx.invalid(format!(
                    "Invalid broadcasting dimensions: {} vs. {}",
                    shapes[0], shapes[1]
                ))
            })?,
            _ => unreachable!("one or two inputs"),
        };
        if !bcast.is_empty() && !Equation::has_ellipsis(&eq.output) {
            return Err(ctx.invalid(format!(
                "Output contains {} broadcasting dimension(s) but no ellipsis (...) was found \
                 in the output subscripts.",
                bcast.len()
            )));
        }
        let first_bcast = sizes.len();
        sizes.extend_from_slice(&bcast);
        let axes = |labels: &[Label], extra: usize| -> Result<Vec<usize>> {
            let mut out = Vec::new();
            for label in labels {
                match *label {
                    Label::Ellipsis => {
                        let start = first_bcast + bcast.len() - extra;
                        out.extend(start..first_bcast + bcast.len());
                    }
                    Label::Named(c) => out.push(*ids.get(&c).ok_or_else(|| {
                        ctx.invalid(format!(
                            "output label '{}' appears in no input subscript",
                            c as char
                        ))
                    })?),
                }
            }
            Ok(out)
        };
        let inputs = eq
            .inputs
            .iter()
            .zip(&ellipsis_dims)
            .map(|(labels, e)| axes(labels, e.len()))
            .collect::<Result<Vec<_>>>()?;
        let output = axes(&eq.output, bcast.len())?;
        Ok(Plan {
            inputs,
            output,
            sizes,
        })
    }
}

/// Every offset of the elements `sizes` and `strides` span, the last dimension fastest.
fn offsets(sizes: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut out = vec![0usize];
    for (&size, &stride) in sizes.iter().zip(strides) {
        let mut next = Vec::with_capacity(out.len() * size);
        for &o in &out {
            next.extend((0..size).map(|i| o + i * stride));
        }
        out = next;
    }
    out
}

/// The labels of `labels` without repeats, in order.
fn unique(labels: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    for &l in labels {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// A tensor of `dims` whose axes carry `labels`, as the tensor over the labels `keep` (each
/// of `labels`, in that order): a repeated label reads the diagonal, a label not kept is
/// summed over. Returns the values and the sizes of `keep`.
fn reduce_to<T: Real>(
    ctx: &OpContext<'_>,
    data: &[T],
    dims: &[usize],
    labels: &[usize],
    keep: &[usize],
) -> (Vec<T>, Vec<usize>) {
    let mut strides = vec![1usize; dims.len()];
    for a in (0..dims.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * dims[a + 1];
    }
    let label_stride = |l: usize| -> usize {
        labels
            .iter()
            .zip(&strides)
            .filter(|(&m, _)| m == l)
            .map(|(_, &s)| s)
            .sum()
    };
    let label_size = |l: usize| dims[labels.iter().position(|&m| m == l).expect("a label")];
    let keep_sizes: Vec<usize> = keep.iter().map(|&l| label_size(l)).collect();
    if keep == labels {
        return (data.to_vec(), keep_sizes);
    }
    let summed: Vec<usize> = unique(labels)
        .into_iter()
        .filter(|l| !keep.contains(l))
        .collect();
    let keep_strides: Vec<usize> = keep.iter().map(|&l| label_stride(l)).collect();
    let summed_sizes: Vec<usize> = summed.iter().map(|&l| label_size(l)).collect();
    let summed_strides: Vec<usize> = summed.iter().map(|&l| label_stride(l)).collect();
    let outer = offsets(&keep_sizes, &keep_strides);
    let inner = offsets(&summed_sizes, &summed_strides);
    let mut out = vec![T::zero(); outer.len()];
    ctx.intra()
        .for_chunks(&mut out, 1, 1.0 + inner.len() as f64, |first, chunk| {
            for (o, &base) in chunk.iter_mut().zip(&outer[first..]) {
                *o = inner
                    .iter()
                    .fold(T::zero(), |acc, &i| <T as Real>::add(acc, data[base + i]));
            }
        });
    (out, keep_sizes)
}

/// The tensor over `labels` (no repeats) as the output over `output` (a permutation of them,
/// where a repeated label writes a diagonal and leaves zeros elsewhere).
fn place<T: Real>(
    data: Vec<T>,
    labels: &[usize],
    sizes: &[usize],
    output: &[usize],
    out_dims: &[usize],
) -> Vec<T> {
    if output == labels {
        return data;
    }
    let mut strides = vec![1usize; labels.len()];
    for a in (0..labels.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * sizes[a + 1];
    }
    let position = |l: usize| labels.iter().position(|&m| m == l).expect("a label");
    // For each output axis: its stride in `data`, and the earlier axis it must equal.
    let axis_stride: Vec<usize> = output.iter().map(|&l| strides[position(l)]).collect();
    let same_as: Vec<Option<usize>> = output
        .iter()
        .enumerate()
        .map(|(a, l)| output[..a].iter().position(|m| m == l))
        .collect();
    let total: usize = out_dims.iter().product();
    let mut out = vec![T::zero(); total];
    let mut index = vec![0usize; output.len()];
    for o in out.iter_mut() {
        let diagonal = same_as
            .iter()
            .enumerate()
            .all(|(a, s)| s.is_none_or(|s| index[s] == index[a]));
        if diagonal {
            let offset: usize = (0..output.len())
                .filter(|&a| same_as[a].is_none())
                .map(|a| index[a] * axis_stride[a])
                .sum();
            *o = data[offset];
        }
        for a in (0..index.len()).rev() {
            index[a] += 1;
            if index[a] < out_dims[a] {
                break;
            }
            index[a] = 0;
        }
    }
    out
}

impl Einsum {
    fn compute_typed<T: Real>(&self, ctx: &OpContext<'_>, inputs: &[Tensor]) -> Result<Tensor> {
        let shapes: Vec<&Shape> = inputs.iter().map(Tensor::shape).collect();
        let plan = Plan::new(ctx, &self.equation, &shapes)?;
        let out_dims: Vec<usize> = plan.output.iter().map(|&l| plan.sizes[l]).collect();
        let output = unique(&plan.output);
        let values: Vec<_> = inputs
            .iter()
            .map(|t| t.values::<T>())
            .collect::<Result<_>>()?;
        let (z, z_labels, z_sizes) = match &plan.inputs[..] {
            [x] => {
                let (z, sizes) = reduce_to(ctx, &values[0], inputs[0].dims(), x, &output);
                (z, output.clone(), sizes)
            }
            [x, y] => {
                let ordered = |keep: &dyn Fn(usize) -> bool| -> Vec<usize> {
                    output.iter().copied().filter(|&l| keep(l)).collect()
                };
                let batch = ordered(&|l| x.contains(&l) && y.contains(&l));
                let free_x = ordered(&|l| x.contains(&l) && !y.contains(&l));
                let free_y = ordered(&|l| y.contains(&l) && !x.contains(&l));
                let contract: Vec<usize> = unique(x)
                    .into_iter()
                    .filter(|l| y.contains(l) && !output.contains(l))
                    .collect();
                let cat = |parts: &[&[usize]]| parts.concat();
                let (xr, xs) = reduce_to(
                    ctx,
                    &values[0],
                    inputs[0].dims(),
                    x,
                    &cat(&[&batch, &free_x, &contract]),
                );
                let (yr, ys) = reduce_to(
                    ctx,
                    &values[1],
                    inputs[1].dims(),
                    y,
                    &cat(&[&batch, &contract, &free_y]),
                );
                let nb = batch.len();
                let (xb, yb) = (&xs[..nb], &ys[..nb]);
                let ob: Vec<usize> = batch.iter().map(|&l| plan.sizes[l]).collect();
                let m: usize = xs[nb..nb + free_x.len()].iter().product();
                let k: usize = xs[nb + free_x.len()..].iter().product();
                let n: usize = ys[nb + contract.len()..].iter().product();
                let matrices: usize = ob.iter().product();
                let mut z = vec![T::zero(); matrices * m * n];
                if k > 0 && !z.is_empty() {
                    let xi =
                        broadcast_to(&(0..xb.iter().product()).collect::<Vec<usize>>(), xb, &ob)
                            .expect("broadcast checked");
                    let yi =
                        broadcast_to(&(0..yb.iter().product()).collect::<Vec<usize>>(), yb, &ob)
                            .expect("broadcast checked");
                    for (b, chunk) in z.chunks_exact_mut(m * n).enumerate() {
                        let a = ArrayView2::from_shape((m, k), &xr[xi[b] * m * k..][..m * k])
                            .expect("matrix slice");
                        let c = ArrayView2::from_shape((k, n), &yr[yi[b] * k * n..][..k * n])
                            .expect("matrix slice");
                        let mut o = ArrayViewMut2::from_shape((m, n), chunk).expect("output");
                        matmul(&a, &c, &mut o, false, Threads::Pool(ctx.intra()));
                    }
                }
                let labels = cat(&[&batch, &free_x, &free_y]);
                let mut sizes = ob;
                sizes.extend_from_slice(&xs[nb..nb + free_x.len()]);
                sizes.extend_from_slice(&ys[nb + contract.len()..]);
                (z, labels, sizes)
            }
            _ => unreachable!("one or two inputs"),
        };
        let out = place(z, &z_labels, &z_sizes, &plan.output, &out_dims);
        Tensor::from_vec(Shape::new(out_dims), out)
    }
}

impl OpKernel for Einsum {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let n = ctx.inputs().len();
        if n != self.equation.inputs.len() {
            return Err(ctx.invalid(format!(
                "Expected {} inputs but got: {n}",
                self.equation.inputs.len()
            )));
        }
        let inputs: Vec<Tensor> = (0..n).map(|i| input(ctx, i)).collect::<Result<_>>()?;
        if n == 2 {
            same_dtype(ctx, &inputs[0], &inputs[1])?;
        }
        let out =
            dispatch_real!(ctx, inputs[0].dtype(), T => self.compute_typed::<T>(ctx, &inputs)?);
        ctx.set_output(0, out);
        Ok(())
    }
}
