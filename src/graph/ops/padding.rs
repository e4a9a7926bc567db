//! Padding ops (`tensorflow/core/ops/array_ops.cc`): `Pad` and `PadV2` (the input inside a
//! border of zeros or of a constant), `MirrorPad` (a border reflected from the input, `REFLECT`
//! leaving out the edge, `SYMMETRIC` repeating it) and `MirrorPadGrad`, its gradient, which folds
//! the border back onto the input.
//!
//! The paddings are an `[rank, 2]` integer matrix of (before, after) pairs. When they are
//! constant the shape functions give the output's shape, so the executor's admission check
//! (`exec/executor/admit.rs`) can refuse a padded output that would not fit the device's
//! memory before the kernel allocates it.

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::array as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::tensor::PartialShape;

const PADDINGS: &str = "Tpaddings: {int32, int64} = DT_INT32";
const MODE: &str = "mode: {'REFLECT', 'SYMMETRIC'}";

pub(super) fn register(r: &mut Registry) {
    OpDef::build("Pad")
        .input("input: T")
        .input("paddings: Tpaddings")
        .output("output: T")
        .attr("T: type")
        .attr(PADDINGS)
        .shape(|c| padded(c, Fold::Out))
        .grad(grad::pad)
        .register(r);
    OpDef::build("PadV2")
        .input("input: T")
        .input("paddings: Tpaddings")
        .input("constant_values: T")
        .output("output: T")
        .attr("T: type")
        .attr(PADDINGS)
        .shape(|c| {
            if c.input(2).rank().is_some_and(|r| r != 0) {
                return Err(c.error(format!(
                    "constant_values must be a scalar, got shape {}",
                    c.input(2)
                )));
            }
            padded(c, Fold::Out)
        })
        .grad(grad::pad)
        .register(r);
    OpDef::build("MirrorPad")
        .input("input: T")
        .input("paddings: Tpaddings")
        .output("output: T")
        .attr("T: type")
        .attr(PADDINGS)
        .attr(MODE)
        .shape(|c| padded(c, Fold::Out))
        .grad(grad::mirror_pad)
        .register(r);
    OpDef::build("MirrorPadGrad")
        .input("input: T")
        .input("paddings: Tpaddings")
        .output("output: T")
        .attr("T: type")
        .attr(PADDINGS)
        .attr(MODE)
        .shape(|c| padded(c, Fold::In))
        .grad(grad::mirror_pad_grad)
        .register(r);
}

/// Whether the border is added to the input (`Pad`, `MirrorPad`) or taken off it
/// (`MirrorPadGrad`).
#[derive(Clone, Copy, PartialEq)]
enum Fold {
    Out,
    In,
}

/// The shape of input 0 with the paddings of input 1 added (or taken off): TensorFlow's
/// `PadShapeFn` and `MirrorPadShapeFn`. The paddings must be a `[rank, 2]` matrix; with their
/// values unknown only the rank is known.
fn padded(ctx: &ShapeCtx<'_>, fold: Fold) -> Result<Vec<PartialShape>> {
    let paddings = ctx.input(1);
    let input = ctx.input(0);
    let rows = match paddings.dims() {
        None => None,
        Some([rows, cols]) => {
            if cols.is_some_and(|c| c != 2) {
                return Err(ctx.error(format!(
                    "paddings must be a matrix with 2 columns, got shape {paddings}"
                )));
            }
            *rows
        }
        Some(_) => {
            return Err(ctx.error(format!(
                "paddings must be a matrix with 2 columns, got shape {paddings}"
            )))
        }
    };
    let values = ctx.value(1);
    let rank = rows
        .or_else(|| values.map(|v| v.len() / 2))
        .or_else(|| input.rank());
    if let (Some(r), Some(ir)) = (rank, input.rank()) {
        if r != ir {
            return Err(ctx.error(format!(
                "the paddings have {r} rows for an input of shape {input}; they need one per \
                 dimension"
            )));
        }
    }
    let Some(values) = values else {
        return Ok(vec![
            rank.map_or_else(PartialShape::unknown, PartialShape::unknown_dims)
        ]);
    };
    let rank = values.len() / 2;
    let dims = input
        .dims()
        .map(<[_]>::to_vec)
        .unwrap_or_else(|| vec![None; rank]);
    let mut out = Vec::with_capacity(rank);
    for (d, (pair, dim)) in values.chunks_exact(2).zip(dims).enumerate() {
        let (before, after) = (pair[0], pair[1]);
        if before < 0 || after < 0 {
            return Err(ctx.error(format!(
                "Paddings must be non-negative: {before} {after} (dimension {d})"
            )));
        }
        let border = (before as u64).saturating_add(after as u64);
        out.push(match (dim, fold) {
            (None, _) => None,
            (Some(n), Fold::Out) => usize::try_from(border).ok().and_then(|b| n.checked_add(b)),
            (Some(n), Fold::In) => {
                let left = (n as u64).checked_sub(border).ok_or_else(|| {
                    ctx.error(format!(
                        "dimension {d} of {input} is smaller than its paddings {before} + \
                         {after}"
                    ))
                })?;
                Some(left as usize)
            }
        });
    }
    Ok(vec![PartialShape::new(out)])
}

/// Padding constructors.
impl Graph {
    /// `Pad(x, paddings)`: `x` inside a border of zeros, `paddings` an `[rank, 2]` matrix of
    /// (before, after) counts.
    pub fn pad(&mut self, x: &Output, paddings: &Output) -> Result<Output> {
        self.binary("Pad", x, paddings)
    }

    /// `PadV2(x, paddings, constant_values)`: `x` inside a border of the scalar `constant`.
    pub fn pad_v2(&mut self, x: &Output, paddings: &Output, constant: &Output) -> Result<Output> {
        self.add1(
            NodeSpec::new("PadV2")
                .input(x)
                .input(paddings)
                .input(constant),
        )
    }

    /// `MirrorPad(x, paddings)` with `mode` `REFLECT` (the edge is not repeated) or
    /// `SYMMETRIC` (it is).
    pub fn mirror_pad(&mut self, x: &Output, paddings: &Output, mode: &str) -> Result<Output> {
        self.add1(
            NodeSpec::new("MirrorPad")
                .input(x)
                .input(paddings)
                .attr("mode", value::string(mode)),
        )
    }

    /// `MirrorPadGrad(grad, paddings)`: the gradient of a `MirrorPad` with these paddings and
    /// `mode`, the border added back onto the elements it was reflected from.
    pub fn mirror_pad_grad(
        &mut self,
        grad: &Output,
        paddings: &Output,
        mode: &str,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("MirrorPadGrad")
                .input(grad)
                .input(paddings)
                .attr("mode", value::string(mode)),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::builder::Graph;
    use crate::graph::const_value;
    use crate::tensor::{DType, PartialShape};

    #[test]
    fn padded_shapes_follow_constant_paddings() {
        let mut g = Graph::new();
        let x = g
            .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))
            .unwrap();
        let p = g
            .constant_proto("p", const_value::int32(&[2, 2], &[1, 2, 0, 4]))
            .unwrap();
        assert_eq!(g.pad(&x, &p).unwrap().shape.to_string(), "[?,7]");
        let m = g.mirror_pad(&x, &p, "REFLECT").unwrap();
        assert_eq!(m.shape.to_string(), "[?,7]");
        assert_eq!(
            g.mirror_pad_grad(&m, &p, "REFLECT")
                .unwrap()
                .shape
                .to_string(),
            "[?,3]"
        );
        // Fed paddings give the rank only.
        let fed = g
            .placeholder("f", DType::Int32, PartialShape::new(vec![Some(2), Some(2)]))
            .unwrap();
        assert_eq!(g.pad(&x, &fed).unwrap().shape.to_string(), "[?,?]");
    }

    #[test]
    fn bad_paddings_fail_naming_the_node() {
        let mut g = Graph::new();
        let x = g
            .placeholder("x", DType::Float, PartialShape::new(vec![Some(2), Some(3)]))
            .unwrap();
        let negative = g
            .constant_proto("p", const_value::int32(&[2, 2], &[1, -1, 0, 0]))
            .unwrap();
        let err = g.pad(&x, &negative).unwrap_err();
        assert!(
            err.message().contains("`Pad`") && err.message().contains("non-negative"),
            "{err}"
        );
        let one_row = g
            .constant_proto("p", const_value::int32(&[1, 2], &[1, 1]))
            .unwrap();
        let err = g.mirror_pad(&x, &one_row, "SYMMETRIC").unwrap_err();
        assert!(err.message().contains("`MirrorPad`"), "{err}");
        let three_columns = g
            .constant_proto("p", const_value::int32(&[2, 3], &[0; 6]))
            .unwrap();
        let err = g.pad(&x, &three_columns).unwrap_err();
        assert!(err.message().contains("2 columns"), "{err}");
    }
}
