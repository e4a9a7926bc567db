//! Gradients of array ops (TensorFlow's `array_grad.py`) and of reading a variable.
//!
//! The gradients of `Slice` and `StridedSlice` (unit strides, no ellipsis or new axes) differ
//! from TensorFlow's, which use `Pad`: they pad the gradient with zeros by concatenating
//! `Fill`ed blocks before and after, one dimension at a time (they were written before tessera
//! had `Pad`). The gather's gradient lives in `sparse.rs`.

use super::{const_ints, mul, named, sum_to_shape};
use crate::error::Result;
use crate::graph::attr;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::gradients::GradCtx;
use crate::tensor::DType;

type Grads = Result<Vec<Option<Output>>>;

/// `Identity` (and `PlaceholderWithDefault`): the gradient itself.
pub fn identity(_: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![c.grads.first().cloned().flatten()])
}

/// `IdentityN`: each gradient to its input.
pub fn identity_n(_: &mut Graph, c: &GradCtx) -> Grads {
    Ok(c.grads.clone())
}

/// `ReadVariableOp`: the gradient of the value read is the gradient of the variable's handle.
pub fn read_variable(_: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![c.grads.first().cloned().flatten()])
}

/// `Reshape`, `ExpandDims`, `Squeeze`: the gradient reshaped to the input's shape.
pub fn reshape(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let s = g.shape_of(&x)?;
    let r = g.reshape(c.grad(0)?, &s)?;
    let mut out = vec![Some(r)];
    out.resize(c.inputs.len(), None);
    Ok(out)
}

/// `Transpose`: the gradient transposed by the inverse permutation.
pub fn transpose(g: &mut Graph, c: &GradCtx) -> Grads {
    let perm = const_ints(g, c.input(1)?)
        .ok_or_else(|| c.err("the permutation must be a constant for the gradient"))?;
    let mut inv = vec![0i64; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        let p = if p < 0 { p + perm.len() as i64 } else { p };
        *inv.get_mut(p as usize)
            .ok_or_else(|| c.err(format!("bad permutation {perm:?}")))? = i as i64;
    }
    Ok(vec![Some(g.transpose(c.grad(0)?, &inv)?), None])
}

/// A 1-D int32 vector `e` with 1 at `axis` and 0 elsewhere.
fn unit(g: &mut Graph, rank: usize, axis: usize) -> Result<Output> {
    let v: Vec<i64> = (0..rank).map(|i| i64::from(i == axis)).collect();
    g.const_vec_i32("Const", &v)
}

/// `ConcatV2`: each input gets its slice of the gradient along the axis.
pub fn concat(g: &mut Graph, c: &GradCtx) -> Grads {
    let n = c.inputs.len() - 1;
    let axis = const_ints(g, &c.inputs[n])
        .and_then(|v| v.first().copied())
        .ok_or_else(|| c.err("the axis must be a constant"))?;
    let gr = c.grad(0)?.clone();
    let rank = gr
        .shape
        .rank()
        .or_else(|| c.inputs[0].shape.rank())
        .ok_or_else(|| c.err("the rank must be known"))?;
    let axis = if axis < 0 { axis + rank as i64 } else { axis } as usize;
    let mut out = Vec::with_capacity(n + 1);
    let statically = c.inputs[..n].iter().all(|x| x.shape.is_fully_defined());
    if statically {
        let mut offset = 0i64;
        for x in &c.inputs[..n] {
            let dims: Vec<i64> = x
                .shape
                .dims()
                .unwrap_or_default()
                .iter()
                .map(|d| d.unwrap_or(0) as i64)
                .collect();
            let mut begin = vec![0i64; rank];
            begin[axis] = offset;
            offset += dims[axis];
            let b = g.const_vec_i32("Const", &begin)?;
            let s = g.const_vec_i32("Const", &dims)?;
            out.push(Some(g.slice(&gr, &b, &s)?));
        }
    } else {
        // begin_i = sum_{j<i} shape(x_j) * e_axis; size_i = shape(x_i).
        let e = unit(g, rank, axis)?;
        let mut begin = g.const_vec_i32("Const", &vec![0; rank])?;
        for x in &c.inputs[..n] {
            let s = g.shape(x)?;
            out.push(Some(g.slice(&gr, &begin, &s)?));
            let step = mul(g, &s, &e)?;
            begin = named(g, "AddV2", "add", &begin, &step)?;
        }
    }
    out.push(None);
    Ok(out)
}

/// `Pack`: the gradient unpacked along the axis.
pub fn pack(g: &mut Graph, c: &GradCtx) -> Grads {
    let axis = attr::int_or(&c.node, "axis", 0)?;
    let parts = g.unpack(c.grad(0)?, c.inputs.len(), axis)?;
    Ok(parts.into_iter().map(Some).collect())
}

/// `Unpack`: the output gradients packed along the axis.
pub fn unpack(g: &mut Graph, c: &GradCtx) -> Grads {
    let axis = attr::int_or(&c.node, "axis", 0)?;
    let grads: Vec<Output> = c
        .grads
        .iter()
        .cloned()
        .collect::<Option<_>>()
        .ok_or_else(|| c.err("missing output gradient"))?;
    Ok(vec![Some(g.pack(&grads, axis)?)])
}

/// The gradients of a split's pieces, zeros for a piece no gradient reached, joined along
/// the split dimension `axis`.
fn join_pieces(g: &mut Graph, c: &GradCtx, axis: &Output) -> Result<Output> {
    let grads = c
        .grads
        .iter()
        .enumerate()
        .map(|(i, grad)| match grad {
            Some(grad) => Ok(grad.clone()),
            None => g.add1(NodeSpec::new("ZerosLike").input(c.output(i)?)),
        })
        .collect::<Result<Vec<_>>>()?;
    g.add1(NodeSpec::new("ConcatV2").input_list(&grads).input(axis))
}

/// `Split(split_dim, value)`: the pieces' gradients, concatenated.
pub fn split(g: &mut Graph, c: &GradCtx) -> Grads {
    let axis = c.input(0)?.clone();
    Ok(vec![None, Some(join_pieces(g, c, &axis)?)])
}

/// `SplitV(value, size_splits, split_dim)`: the pieces' gradients, concatenated.
pub fn split_v(g: &mut Graph, c: &GradCtx) -> Grads {
    let axis = c.input(2)?.clone();
    Ok(vec![Some(join_pieces(g, c, &axis)?), None, None])
}

/// Pads `grad` with zeros to `x`'s shape, `grad` sitting at `begin` (an int32 vector).
fn pad_into(
    g: &mut Graph,
    grad: &Output,
    x: &Output,
    begin: &Output,
    rank: usize,
) -> Result<Output> {
    let sx = g.shape(x)?;
    let sg = g.shape(grad)?;
    let rest = named(g, "Sub", "sub", &sx, begin)?;
    let after = named(g, "Sub", "sub", &rest, &sg)?;
    let zero = g.scalar("zeros", grad.dtype, 0.0)?;
    let mut cur = grad.clone();
    for d in 0..rank {
        let e = unit(g, rank, d)?;
        let keep: Vec<i64> = (0..rank).map(|i| i64::from(i != d)).collect();
        let keep = g.const_vec_i32("Const", &keep)?;
        let sc = g.shape(&cur)?;
        let base = mul(g, &sc, &keep)?;
        let b = mul(g, begin, &e)?;
        let before_shape = named(g, "AddV2", "add", &base, &b)?;
        let a = mul(g, &after, &e)?;
        let after_shape = named(g, "AddV2", "add", &base, &a)?;
        let before = g.fill(&before_shape, &zero)?;
        let after_block = g.fill(&after_shape, &zero)?;
        cur = g.concat(&[before, cur, after_block], d as i64)?;
    }
    Ok(cur)
}

fn as_i32(g: &mut Graph, t: &Output) -> Result<Output> {
    if t.dtype == DType::Int32 {
        Ok(t.clone())
    } else {
        g.cast(t, DType::Int32)
    }
}

/// `Slice`: the gradient padded with zeros back to the input's shape.
pub fn slice(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let rank = x
        .shape
        .rank()
        .or_else(|| c.inputs[1].shape.dims().and_then(|d| d[0]))
        .ok_or_else(|| c.err("the input's rank must be known"))?;
    let begin = as_i32(g, c.input(1)?)?;
    Ok(vec![
        Some(pad_into(g, c.grad(0)?, &x, &begin, rank)?),
        None,
        None,
    ])
}

/// `StridedSlice` with unit strides and no ellipsis / new axes: shrunk axes are restored as 1,
/// then the gradient is padded like `Slice`'s. Other forms are UNIMPLEMENTED.
pub fn strided_slice(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let unsupported = || {
        crate::error::Status::unimplemented(format!(
            "gradient of node `{}` (StridedSlice): only constant begin/end with unit strides, no \
             ellipsis or new axes, on an input of known shape are supported (tessera has no \
             StridedSliceGrad); use Slice",
            c.node.name
        ))
    };
    let (Some(b), Some(e), Some(s)) = (
        const_ints(g, &c.inputs[1]),
        const_ints(g, &c.inputs[2]),
        const_ints(g, &c.inputs[3]),
    ) else {
        return Err(unsupported());
    };
    if b.len() != e.len() || b.len() != s.len() {
        return Err(c.err("begin, end and strides must have the same length"));
    }
    let m = |n: &str| attr::int_or(&c.node, n, 0);
    let (bm, em, shrink) = (m("begin_mask")?, m("end_mask")?, m("shrink_axis_mask")?);
    let Some(dims) = x.shape.to_shape() else {
        return Err(unsupported());
    };
    if m("ellipsis_mask")? != 0 || m("new_axis_mask")? != 0 || s.iter().any(|&v| v != 1) {
        return Err(unsupported());
    }
    let rank = dims.rank();
    let mut begin = Vec::with_capacity(rank);
    let mut size = Vec::with_capacity(rank);
    for (i, &d) in dims.dims().iter().enumerate() {
        let d = d as i64;
        if i >= b.len() {
            begin.push(0);
            size.push(d);
            continue;
        }
        let norm = |v: i64| (if v < 0 { v + d } else { v }).clamp(0, d);
        let lo = if bm & (1 << i) != 0 { 0 } else { norm(b[i]) };
        let hi = if shrink & (1 << i) != 0 {
            lo + 1
        } else if em & (1 << i) != 0 {
            d
        } else {
            norm(e[i])
        };
        begin.push(lo);
        size.push((hi - lo).max(0));
    }
    let gr = g.reshape_to(c.grad(0)?, &size)?;
    let begin = g.const_vec_i32("Const", &begin)?;
    Ok(vec![
        Some(pad_into(g, &gr, &x, &begin, rank)?),
        None,
        None,
        None,
    ])
}

/// `Tile`: the gradient summed over the tiled copies (TensorFlow's `_TileGrad`).
pub fn tile(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let multiples = as_i32(g, c.input(1)?)?;
    let sx = g.shape(&x)?;
    // split_shape interleaves (multiple, dim) pairs; summing the even axes undoes the tiling.
    let stacked = g.pack(&[multiples, sx.clone()], 0)?;
    let t = g.transpose(&stacked, &[1, 0])?;
    let split = g.reshape_to(&t, &[-1])?;
    let reshaped = g.reshape(c.grad(0)?, &split)?;
    let size = g.unary("Size", &split)?;
    let start = g.const_i32("Const", &[], &[0])?;
    let two = g.const_i32("Const", &[], &[2])?;
    let axes = g.range(&start, &size, &two)?;
    let summed = g.reduce("Sum", &reshaped, &axes, false)?;
    let out = g.reshape(&summed, &sx)?;
    Ok(vec![Some(out), None])
}

/// `BroadcastTo`: the gradient summed back over the broadcast dimensions.
pub fn broadcast_to(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    Ok(vec![Some(sum_to_shape(g, c.grad(0)?, &x)?), None])
}

/// `Pad` and `PadV2` (TensorFlow's `_PadGrad`): the input's part of the gradient, a `Slice`
/// starting at the paddings' first column, of the input's shape.
pub fn pad(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let paddings = c.input(1)?.clone();
    let at = g.const_vec_i32("Const", &[0, 0])?;
    let size = match x.shape.rank() {
        Some(rank) => g.const_vec_i32("Const", &[rank as i64, 1])?,
        None => {
            let rank = g.unary("Rank", &x)?;
            let one = g.const_i32("Const", &[], &[1])?;
            g.pack(&[rank, one], 0)?
        }
    };
    let before = g.slice(&paddings, &at, &size)?;
    let begin = g.reshape_to(&before, &[-1])?;
    // The slice's begin and size share one index dtype: the paddings'.
    let sizes = match (x.shape.to_shape(), paddings.dtype) {
        (Some(_), DType::Int32) => g.shape_of(&x)?,
        _ => g.add1(
            NodeSpec::new("Shape")
                .input(&x)
                .attr("out_type", attr::value::dtype(paddings.dtype)),
        )?,
    };
    let dx = g.slice(c.grad(0)?, &begin, &sizes)?;
    let mut out = vec![Some(dx), None];
    out.resize(c.inputs.len(), None);
    Ok(out)
}

/// `MirrorPad`: `MirrorPadGrad` of the gradient, in the same mode.
pub fn mirror_pad(g: &mut Graph, c: &GradCtx) -> Grads {
    let mode = attr::string_or(&c.node, "mode", "REFLECT")?;
    let dx = g.mirror_pad_grad(c.grad(0)?, c.input(1)?, &mode)?;
    Ok(vec![Some(dx), None])
}

/// `MirrorPadGrad`: `MirrorPad` of the gradient, in the same mode.
pub fn mirror_pad_grad(g: &mut Graph, c: &GradCtx) -> Grads {
    let mode = attr::string_or(&c.node, "mode", "REFLECT")?;
    let dx = g.mirror_pad(c.grad(0)?, c.input(1)?, &mode)?;
    Ok(vec![Some(dx), None])
}

/// `CheckNumerics` and `CheckNumericsV2`: the gradient, checked the same way, with
/// TensorFlow's message (`"... detected in gradient. %s" % op.get_attr("message")`, which
/// Python writes as a bytes literal: `b'loss'`).
pub fn check_numerics(g: &mut Graph, c: &GradCtx) -> Grads {
    let message = attr::string_or(&c.node, "message", "")?;
    let message = format!(
        "Not a number (NaN) or infinity (Inf) values detected in gradient. {}",
        python_bytes_repr(message.as_bytes())
    );
    let dx = g.add1(
        NodeSpec::new(&c.node.op)
            .input(c.grad(0)?)
            .attr("message", attr::value::string(message)),
    )?;
    Ok(vec![Some(dx)])
}

/// `repr(b)` of Python bytes: `b'...'`, in double quotes when the bytes hold a `'` and no `"`.
fn python_bytes_repr(bytes: &[u8]) -> String {
    let quote = if bytes.contains(&b'\'') && !bytes.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    let mut out = String::from("b");
    out.push(quote as char);
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            _ if b == quote => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push(quote as char);
    out
}

#[cfg(test)]
mod tests {
    use super::python_bytes_repr;

    #[test]
    fn messages_are_quoted_as_python_quotes_bytes() {
        assert_eq!(python_bytes_repr(b"loss"), "b'loss'");
        assert_eq!(python_bytes_repr(b"it's"), "b\"it's\"");
        assert_eq!(python_bytes_repr(b"a'\"b\n\xff"), "b'a\\'\"b\\n\\xff'");
    }
}
