//! Linear algebra and histograms (`core/ops/linalg_ops.cc`, `math_ops.cc`): `Einsum`
//! (`tf.einsum`), `MatrixInverse` (`tf.linalg.inv`) and `HistogramFixedWidth`
//! (`tf.histogram_fixed_width`), declared as TensorFlow 2.21 declares them.
//!
//! `Einsum`'s shape function reads the equation as its kernel does (`crate::graph::einsum`)
//! and refuses what the kernel would, where the shapes are known. The gradients are
//! TensorFlow's `_EinsumGrad` and `_MatrixInverseGrad` (`grads/linalg.rs`); TensorFlow
//! registers none for `HistogramFixedWidth` (its counts are integers).

use std::collections::HashMap;

use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::einsum::{Equation, Label};
use crate::graph::grads::linalg as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::{DType, PartialShape};

pub(super) fn register(r: &mut Registry) {
    OpDef::build("Einsum")
        .input("inputs: N * T")
        .output("output: T")
        .attr("equation: string")
        .attr("N: int >= 1")
        .attr("T: type")
        .shape(einsum_shape)
        .grad(grad::einsum)
        .register(r);
    OpDef::build("MatrixInverse")
        .input("input: T")
        .output("output: T")
        .attr("adjoint: bool = false")
        .attr("T: {double, float, half, complex64, complex128}")
        .shape(square_matrices)
        .grad(grad::matrix_inverse)
        .register(r);
    OpDef::build("HistogramFixedWidth")
        .input("values: T")
        .input("value_range: T")
        .input("nbins: int32")
        .output("out: dtype")
        .attr("T: {int32, int64, float, double}")
        .attr("dtype: {int32, int64} = DT_INT32")
        .shape(histogram_shape)
        .no_grad()
        .register(r);
}

/// `Einsum`'s output: each output label's dimension where an input knows it, the ellipsis
/// the broadcast of the inputs' (unknown rank when an input with one has unknown rank).
fn einsum_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let text = attr::string_or(ctx.node, "equation", "")?;
    let eq = Equation::parse(&text).map_err(|m| ctx.error(m))?;
    if eq.inputs.len() != ctx.inputs.len() {
        return Err(ctx.error(format!(
            "Expected {} inputs but got: {}",
            eq.inputs.len(),
            ctx.inputs.len()
        )));
    }
    let mut dims: HashMap<u8, Option<usize>> = HashMap::new();
    let mut bcast: Option<Vec<Option<usize>>> = Some(Vec::new());
    for (i, labels) in eq.inputs.iter().enumerate() {
        let named = labels.iter().filter(|l| **l != Label::Ellipsis).count();
        let ellipsis = Equation::has_ellipsis(labels);
        let shape = ctx.input(i);
        let Some(d) = shape.dims() else {
            if ellipsis {
                bcast = None;
            }
            continue;
        };
        if ellipsis && d.len() < named {
            return Err(ctx.error(format!(
                "Expected input {i} to have rank at least {named} but got: {}",
                d.len()
            )));
        }
        if !ellipsis && d.len() != named {
            return Err(ctx.error(format!(
                "Expected input {i} to have rank {named} but got: {}",
                d.len()
            )));
        }
        let extra = d.len() - named;
        let mut axis = 0;
        for label in labels {
            match *label {
                Label::Ellipsis => {
                    let mine = &d[axis..axis + extra];
                    if let Some(b) = bcast.as_mut() {
                        *b = broadcast_partial(ctx, b, mine, &shape)?;
                    }
                    axis += extra;
                }
                Label::Named(c) => {
                    let entry = dims.entry(c).or_insert(d[axis]);
                    *entry = sf::merge_dim(*entry, d[axis]).ok_or_else(|| {
                        ctx.error(format!(
                            "Expected dimension {} at axis {axis} of the input shaped {shape} \
                             but got dimension {}",
                            entry.map_or(-1, |d| d as i64),
                            d[axis].map_or(-1, |d| d as i64)
                        ))
                    })?;
                    axis += 1;
                }
            }
        }
    }
    let has_out_ellipsis = Equation::has_ellipsis(&eq.output);
    if let Some(b) = &bcast {
        if !b.is_empty() && !has_out_ellipsis {
            return Err(ctx.error(format!(
                "Output contains {} broadcasting dimension(s) but no ellipsis (...) was found \
                 in the output subscripts.",
                b.len()
            )));
        }
    }
    let mut out = Vec::new();
    for label in &eq.output {
        match *label {
            Label::Ellipsis => match &bcast {
                Some(b) => out.extend_from_slice(b),
                None => return Ok(vec![PartialShape::unknown()]),
            },
            Label::Named(c) => out.push(dims.get(&c).copied().flatten()),
        }
    }
    Ok(vec![PartialShape::new(out)])
}

/// Numpy's broadcast of two partly known ellipsis shapes.
fn broadcast_partial(
    ctx: &ShapeCtx<'_>,
    a: &[Option<usize>],
    b: &[Option<usize>],
    shape: &PartialShape,
) -> Result<Vec<Option<usize>>> {
    let rank = a.len().max(b.len());
    let at = |s: &[Option<usize>], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            Some(1)
        }
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (Some(1), d) | (d, Some(1)) => Ok(d),
            (Some(x), Some(y)) if x == y => Ok(Some(x)),
            (Some(_), Some(_)) => Err(ctx.error(format!(
                "Invalid broadcasting dimensions: the ellipsis of the input shaped {shape} \
                 does not broadcast with the other input's"
            ))),
            _ => Ok(None),
        })
        .collect()
}

/// `MatrixInverse`'s output is its input's shape, which must end in square matrices.
fn square_matrices(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let x = ctx.input(0);
    if let Some(d) = x.dims() {
        if d.len() < 2 {
            return Err(ctx.error(format!(
                "Shape must be at least rank 2 but is rank {}",
                d.len()
            )));
        }
        let (r, c) = (d[d.len() - 2], d[d.len() - 1]);
        let n = sf::merge_dim(r, c).ok_or_else(|| {
            ctx.error(format!(
                "Dimensions must be equal, but are {} and {}",
                r.unwrap_or(0),
                c.unwrap_or(0)
            ))
        })?;
        let mut dims = d.to_vec();
        let len = dims.len();
        dims[len - 2] = n;
        dims[len - 1] = n;
        return Ok(vec![PartialShape::new(dims)]);
    }
    Ok(vec![x])
}

/// `HistogramFixedWidth`'s output is `[nbins]`, known when `nbins` is a constant.
fn histogram_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let range = ctx.input(1);
    if let Some(d) = range.dims() {
        if d.len() != 1 {
            return Err(ctx.error(format!("Shape must be rank 1 but is rank {}", d.len())));
        }
        if let Some(n) = d[0].filter(|&n| n != 2) {
            return Err(ctx.error(format!("Dimension must be 2 but is {n}")));
        }
    }
    if let Some(r) = ctx.input(2).rank().filter(|&r| r != 0) {
        return Err(ctx.error(format!("Shape must be rank 0 but is rank {r}")));
    }
    let nbins = ctx.scalar_value(2).and_then(|n| usize::try_from(n).ok());
    Ok(vec![PartialShape::new(vec![nbins])])
}

/// Constructors for the linear-algebra ops.
impl Graph {
    /// `tf.einsum(equation, *inputs)`: an implicit equation (`"ij,jk"`) is completed as
    /// `tf.einsum` completes it (`"ij,jk->ik"`).
    pub fn einsum(&mut self, equation: &str, inputs: &[Output]) -> Result<Output> {
        self.add1(
            NodeSpec::new("Einsum")
                .input_list(inputs)
                .attr("equation", value::string(Equation::explicit(equation))),
        )
    }

    /// `MatrixInverse(input)`: the inverse of each innermost matrix (of its adjoint with
    /// `adjoint`).
    pub fn matrix_inverse(&mut self, input: &Output, adjoint: bool) -> Result<Output> {
        self.add1(
            NodeSpec::new("MatrixInverse")
                .input(input)
                .attr("adjoint", value::bool(adjoint)),
        )
    }

    /// `HistogramFixedWidth(values, value_range, nbins)` counted as `dtype`.
    pub fn histogram_fixed_width(
        &mut self,
        values: &Output,
        value_range: &Output,
        nbins: &Output,
        dtype: DType,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("HistogramFixedWidth")
                .input(values)
                .input(value_range)
                .input(nbins)
                .attr("dtype", value::dtype(dtype)),
        )
    }
}
