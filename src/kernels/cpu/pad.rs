//! Padding: `Pad` and `PadV2` (a border of zeros or of a constant), `MirrorPad` (a border
//! reflected from the input: `REFLECT` leaves the edge out, `SYMMETRIC` repeats it) and
//! `MirrorPadGrad` (the border of a gradient added back onto the elements it reflects).
//!
//! The padding ops write their output a row of its last dimension at a time, the rows split
//! over the intra-op pool. Along each dimension, every output index reads one input index or
//! the constant ([`Sources`]); a row whose outer indices read the constant stays as it was
//! filled, the others copy the input's row into their middle (a slice copy, which is a
//! `memcpy` for the fixed-size dtypes) and the reflected ends around it. `MirrorPadGrad` folds
//! one padded dimension at a time: each of its rows of inner elements is added onto the row
//! it was reflected from, a plain loop over two slices that the compiler vectorizes (packed
//! `addps` for float32 on x86-64, checked once in the assembly).
//!
//! The checks and their messages are TensorFlow's (`pad_op.cc`, `mirror_pad_op.cc`), down to
//! the rank limits of its kernels: 8 for `Pad`, 5 for the mirror ops (UNIMPLEMENTED past
//! them). The output's size goes through the memory budget before it is allocated.

use std::sync::Arc;

use super::numeric::Real;
use super::split::ELEMENT_CYCLES;
use super::{checked_elements, input, int_values, stateless, Items};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::intra::IntraPool;
use crate::tensor::{Shape, Tensor};

/// Returns the factory for a padding op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Pad" | "PadV2" => |_| stateless(pad),
        "MirrorPad" => |node| Ok(Arc::new(MirrorPad(Mode::of(node)?))),
        "MirrorPadGrad" => |node| Ok(Arc::new(MirrorPadGrad(Mode::of(node)?))),
        _ => return None,
    };
    Some(factory)
}

/// The highest rank TensorFlow's `Pad` kernel takes.
const PAD_MAX_RANK: usize = 8;
/// The highest rank TensorFlow's `MirrorPad` and `MirrorPadGrad` kernels take.
const MIRROR_MAX_RANK: usize = 5;

/// Reads input 1, the `[rank, 2]` paddings of input `x`, as (before, after) pairs, after
/// TensorFlow's checks of the ranks; `separator` goes between the two shapes in the message
/// about a wrong row count, as each op writes it.
fn read_paddings(
    ctx: &OpContext<'_>,
    x: &Tensor,
    max_rank: usize,
    separator: &str,
) -> Result<Vec<(i64, i64)>> {
    let rank = x.rank();
    if rank > max_rank {
        return Err(ctx.named(Status::unimplemented(format!(
            "inputs rank not in [0,{max_rank}]: {rank}"
        ))));
    }
    let p = ctx.input(1)?;
    if p.rank() != 2 || p.dims()[1] != 2 {
        return Err(ctx.invalid(format!(
            "paddings must be a matrix with 2 columns: {}",
            p.shape()
        )));
    }
    if p.dims()[0] != rank {
        return Err(ctx.invalid(format!(
            "The first dimension of paddings must be the rank of inputs{}{separator}{}",
            p.shape(),
            x.shape()
        )));
    }
    let values = int_values(ctx, p, "paddings")?;
    Ok(values.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

/// Along each dimension of an output, where each of its indices reads from: an index of the
/// input, or (for a constant border) the constant. Worked out per index, so that no table as
/// long as a padded dimension is ever allocated.
struct Sources {
    /// Per dimension: the input's size and the (before, after) border.
    dims: Vec<(usize, usize, usize)>,
    /// `None` for a constant border; for a reflected one, the offset of the first reflected
    /// element from the edge (1 for `REFLECT`, which leaves the edge out, 0 for `SYMMETRIC`).
    mirror: Option<usize>,
}

impl Sources {
    /// A constant border of `pads` around an input of `dims`.
    fn constant(dims: &[usize], pads: &[(usize, usize)]) -> Sources {
        Sources {
            dims: dims
                .iter()
                .zip(pads)
                .map(|(&n, &(b, a))| (n, b, a))
                .collect(),
            mirror: None,
        }
    }

    /// A reflected border; the caller checked that the paddings fit the input.
    fn mirror(dims: &[usize], pads: &[(usize, usize)], offset: usize) -> Sources {
        Sources {
            mirror: Some(offset),
            ..Sources::constant(dims, pads)
        }
    }

    /// The input index output index `j` of dimension `d` reads: in a reflected border, the
    /// index `before - 1 - i` reads `i + offset` and the index `before + n + i` reads
    /// `n - 1 - offset - i`.
    fn source(&self, d: usize, j: usize) -> Option<usize> {
        let (n, before, _) = self.dims[d];
        if (before..before + n).contains(&j) {
            return Some(j - before);
        }
        let offset = self.mirror?;
        Some(if j < before {
            before - 1 - j + offset
        } else {
            n - 1 - (j - before - n) - offset
        })
    }

    fn out_dims(&self) -> Vec<usize> {
        self.dims.iter().map(|&(n, b, a)| b + n + a).collect()
    }
}

/// The padded tensor: `values` (row-major, dimensions `in_dims`) read through `sources`, every
/// element no source reaches being `fill`.
fn padded<T: Items>(
    intra: &IntraPool,
    values: &[T],
    in_dims: &[usize],
    sources: &Sources,
    fill: T,
) -> Vec<T> {
    let out_dims = sources.out_dims();
    let total: usize = out_dims.iter().product();
    let Some(last) = in_dims.len().checked_sub(1) else {
        return values.to_vec();
    };
    if total == 0 {
        return Vec::new();
    }
    let (width, (in_width, before, _)) = (out_dims[last], sources.dims[last]);
    let lead = &out_dims[..last];
    let mut in_strides = vec![in_width; last];
    for d in (0..last.saturating_sub(1)).rev() {
        in_strides[d] = in_strides[d + 1] * in_dims[d + 1];
    }
    // The reflected ends of a row (none for a constant border): at most one row's worth.
    let ends: Vec<(usize, usize)> = (0..before)
        .chain(before + in_width..width)
        .filter_map(|j| sources.source(last, j).map(|s| (j, s)))
        .collect();
    let mut out = vec![fill; total];
    let cycles = width as f64 * ELEMENT_CYCLES;
    intra.for_chunks(&mut out, width, cycles, |first, chunk| {
        // An odometer over the output's outer dimensions, from this chunk's first row.
        let mut at = vec![0usize; last];
        let mut rest = first;
        for d in (0..last).rev() {
            at[d] = rest % lead[d];
            rest /= lead[d];
        }
        for row in chunk.chunks_exact_mut(width) {
            let offset = (0..last).try_fold(0usize, |off, d| {
                sources.source(d, at[d]).map(|i| off + i * in_strides[d])
            });
            if let Some(offset) = offset {
                let src = &values[offset..offset + in_width];
                row[before..before + in_width].clone_from_slice(src);
                for &(j, s) in &ends {
                    row[j] = src[s].clone();
                }
            }
            for d in (0..last).rev() {
                at[d] += 1;
                if at[d] < lead[d] {
                    break;
                }
                at[d] = 0;
            }
        }
    });
    out
}

/// `Pad(input, paddings)` and `PadV2(input, paddings, constant_values)`.
fn pad(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    let pairs = read_paddings(ctx, &x, PAD_MAX_RANK, " ")?;
    let constant = if ctx.num_inputs() == 3 {
        let c = input(ctx, 2)?;
        if c.rank() != 0 {
            return Err(ctx.invalid(format!(
                "constant_values must be a scalar. Found: {}",
                c.shape()
            )));
        }
        super::same_dtype(ctx, &x, &c)?;
        Some(c)
    } else {
        None
    };
    let mut pads = Vec::with_capacity(pairs.len());
    for &(before, after) in &pairs {
        if before < 0 || after < 0 {
            return Err(ctx.invalid(format!("Paddings must be non-negative: {before} {after}")));
        }
        pads.push(border(ctx, before, after)?);
    }
    let sources = Sources::constant(x.dims(), &pads);
    let dims = out_dims(ctx, &sources)?;
    let out = dispatch_items!(ctx, x.dtype(), T => {
        let fill = fill_value::<T>(constant.as_ref())?;
        let values = T::items(&x)?;
        T::tensor(dims, padded(ctx.intra(), &values, x.dims(), &sources, fill))?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// What `Pad` fills the border with: `PadV2`'s constant, or TensorFlow's `T()` (0, false, the
/// empty string).
fn fill_value<T: Items + Default>(constant: Option<&Tensor>) -> Result<T> {
    Ok(match constant {
        Some(c) => T::items(c)?[0].clone(),
        None => T::default(),
    })
}

/// A pair of paddings as sizes; one past what a tensor can hold is RESOURCE_EXHAUSTED (so the
/// padded dimensions' sizes cannot overflow).
fn border(ctx: &OpContext<'_>, before: i64, after: i64) -> Result<(usize, usize)> {
    let fit = |v: i64| {
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= super::MAX_ELEMENTS)
    };
    match (fit(before), fit(after)) {
        (Some(b), Some(a)) => Ok((b, a)),
        _ => Err(ctx.named(Status::resource_exhausted(format!(
            "paddings {before}, {after} make a dimension larger than a tensor may hold"
        )))),
    }
}

/// The output's dimensions, after the memory budget agreed to hold them.
fn out_dims(ctx: &OpContext<'_>, sources: &Sources) -> Result<Vec<usize>> {
    let dims = sources.out_dims();
    checked_elements(ctx, &dims)?;
    Ok(dims)
}

/// How a mirror op reflects: the offset of the first reflected element from the edge.
#[derive(Clone, Copy)]
struct Mode {
    /// 1 for `REFLECT` (the edge is not repeated), 0 for `SYMMETRIC`.
    offset: usize,
}

impl Mode {
    fn of(node: &NodeDef) -> Result<Mode> {
        match attr::string_or(node, "mode", "")?.as_str() {
            "REFLECT" => Ok(Mode { offset: 1 }),
            "SYMMETRIC" => Ok(Mode { offset: 0 }),
            other => Err(Status::invalid_argument(format!(
                "node `{}` (op {}): mode must be either REFLECT or SYMMETRIC, got `{other}`",
                node.name, node.op
            ))),
        }
    }
}

/// `MirrorPad(input, paddings)`.
struct MirrorPad(Mode);

impl OpKernel for MirrorPad {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let pairs = read_paddings(ctx, &x, MIRROR_MAX_RANK, ", ")?;
        let mut pads = Vec::with_capacity(pairs.len());
        for (&(before, after), &n) in pairs.iter().zip(x.dims()) {
            if before < 0 || after < 0 {
                return Err(ctx.invalid(format!("paddings must be non-negative: {before} {after}")));
            }
            let n = n as i64;
            if self.0.offset == 0 && (before > n || after > n) {
                return Err(ctx.invalid(format!(
                    "paddings must be no greater than the dimension size: {before}, {after} \
                     greater than {n}"
                )));
            }
            if self.0.offset == 1 && (before >= n || after >= n) {
                return Err(ctx.invalid(format!(
                    "paddings must be less than the dimension size: {before}, {after} not \
                     less than {n}"
                )));
            }
            pads.push((before as usize, after as usize));
        }
        let sources = Sources::mirror(x.dims(), &pads, self.0.offset);
        let dims = out_dims(ctx, &sources)?;
        let out = dispatch_items!(ctx, x.dtype(), T => {
            let values = T::items(&x)?;
            T::tensor(dims, mirrored(ctx.intra(), &values, x.dims(), &sources))?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}

/// [`padded`] with a reflected border, which reads the input everywhere: what it is filled
/// with first does not matter (an input element). Only an empty output has an empty input,
/// once `MirrorPad`'s checks passed.
fn mirrored<T: Items>(
    intra: &IntraPool,
    values: &[T],
    dims: &[usize],
    sources: &Sources,
) -> Vec<T> {
    match values.first() {
        Some(fill) => padded(intra, values, dims, sources, fill.clone()),
        None => Vec::new(),
    }
}

/// `MirrorPadGrad(input, paddings)`: `input` is the gradient of a `MirrorPad` output; each
/// border element is added onto the element it was reflected from, and the border dropped.
struct MirrorPadGrad(Mode);

impl OpKernel for MirrorPadGrad {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let pairs = read_paddings(ctx, &x, MIRROR_MAX_RANK, " ")?;
        let mut pads = Vec::with_capacity(pairs.len());
        for (&(before, after), &n) in pairs.iter().zip(x.dims()) {
            if before < 0 || after < 0 {
                return Err(
                    ctx.invalid(format!("Paddings must be non-negative: {before}, {after}"))
                );
            }
            let (n, total) = (n as i64, before.saturating_add(after));
            if total >= n {
                return Err(ctx.invalid(format!(
                    "Total paddings must be less than the input dimension size: {total} was \
                     not less than {n}"
                )));
            }
            let out = n - total;
            if self.0.offset == 0 && (before > out || after > out) {
                return Err(ctx.invalid(format!(
                    "paddings must be no greater than the output dimension size: {before}, \
                     {after} greater than {out}"
                )));
            }
            if self.0.offset == 1 && (before >= out || after >= out) {
                return Err(ctx.invalid(format!(
                    "paddings must be less than the output dimension size: {before}, {after} \
                     not less than {out}"
                )));
            }
            pads.push((before as usize, after as usize));
        }
        if pads.iter().all(|&p| p == (0, 0)) {
            ctx.set_output(0, x);
            return Ok(());
        }
        let out = dispatch_real!(ctx, x.dtype(), T => {
            let mut dims = x.dims().to_vec();
            let mut values = x.values::<T>()?.into_owned();
            for (d, &(before, after)) in pads.iter().enumerate() {
                if before + after > 0 {
                    values = fold(ctx.intra(), &values, &mut dims, d, (before, after), self.0.offset);
                }
            }
            Tensor::from_vec(Shape::new(dims), values)?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Folds the border of dimension `d` of `values` (dimensions `dims`, updated) back onto the
/// elements it reflects: the output's row `t` of inner elements is the input's row `t +
/// before` plus the rows of the border that reflect it.
fn fold<T: Real>(
    intra: &IntraPool,
    values: &[T],
    dims: &mut [usize],
    d: usize,
    (before, after): (usize, usize),
    offset: usize,
) -> Vec<T> {
    let padded = dims[d];
    let n = padded - before - after;
    let inner: usize = dims[d + 1..].iter().product();
    let targets: Vec<usize> = (0..padded)
        .map(|p| {
            if p < before {
                before - 1 - p + offset
            } else if p < before + n {
                p - before
            } else {
                n - 1 - (p - before - n) - offset
            }
        })
        .collect();
    dims[d] = n;
    let block = n * inner;
    let total = dims.iter().product();
    let mut out = vec![T::default(); total];
    if block == 0 {
        return out;
    }
    let cycles = (padded * inner) as f64 * ELEMENT_CYCLES;
    intra.for_chunks(&mut out, block, cycles, |first, chunk| {
        for (o, dst) in chunk.chunks_exact_mut(block).enumerate() {
            let src = &values[(first + o) * padded * inner..][..padded * inner];
            for (&t, row) in targets.iter().zip(src.chunks_exact(inner)) {
                let into = &mut dst[t * inner..(t + 1) * inner];
                for (a, &b) in into.iter_mut().zip(row) {
                    *a = Real::add(*a, b);
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(sources: &Sources, dims: &[usize], values: &[i32], fill: i32) -> Vec<i32> {
        let pool = IntraPool::new("test-pad", 3);
        padded(&pool, values, dims, sources, fill)
    }

    #[test]
    fn constant_and_mirrored_borders() {
        // Every output index of a reflected border reads the input index numpy's `pad` reads.
        let reflect = Sources::mirror(&[3], &[(2, 2)], 1);
        let got: Vec<_> = (0..7).map(|j| reflect.source(0, j).unwrap()).collect();
        assert_eq!(got, [2, 1, 0, 1, 2, 1, 0]);
        let constant = Sources::constant(&[3], &[(1, 1)]);
        let got: Vec<_> = (0..5).map(|j| constant.source(0, j)).collect();
        assert_eq!(got, [None, Some(0), Some(1), Some(2), None]);
        let x = [1, 2, 3, 4, 5, 6];
        let s = Sources::constant(&[2, 3], &[(1, 0), (2, 1)]);
        assert_eq!(s.out_dims(), [3, 6]);
        #[rustfmt::skip]
        assert_eq!(run(&s, &[2, 3], &x, 9), [
            9, 9, 9, 9, 9, 9,
            9, 9, 1, 2, 3, 9,
            9, 9, 4, 5, 6, 9,
        ]);
        let reflect = Sources::mirror(&[2, 3], &[(1, 1), (2, 2)], 1);
        #[rustfmt::skip]
        assert_eq!(run(&reflect, &[2, 3], &x, 0), [
            6, 5, 4, 5, 6, 5, 4,
            3, 2, 1, 2, 3, 2, 1,
            6, 5, 4, 5, 6, 5, 4,
            3, 2, 1, 2, 3, 2, 1,
        ]);
        let symmetric = Sources::mirror(&[3], &[(2, 3)], 0);
        assert_eq!(
            run(&symmetric, &[3], &[1, 2, 3], 0),
            [2, 1, 1, 2, 3, 3, 2, 1]
        );
        // A scalar pads to itself; an empty dimension to an empty tensor.
        assert_eq!(run(&Sources::constant(&[], &[]), &[], &[7], 0), [7]);
        assert!(run(
            &Sources::constant(&[0, 2], &[(0, 0), (1, 1)]),
            &[0, 2],
            &[],
            0
        )
        .is_empty());
    }

    #[test]
    fn large_pads_split_over_the_pool_match_a_small_loop() {
        let (rows, cols) = (300, 257);
        let x: Vec<i32> = (0..rows * cols).map(|i| i as i32).collect();
        let s = Sources::mirror(&[rows, cols], &[(3, 5), (7, 2)], 1);
        let got = run(&s, &[rows, cols], &x, 0);
        let dims = s.out_dims();
        for (i, &v) in got.iter().enumerate() {
            let (r, c) = (i / dims[1], i % dims[1]);
            let want = s.source(0, r).unwrap() * cols + s.source(1, c).unwrap();
            assert_eq!(v, want as i32, "element ({r}, {c})");
        }
    }

    #[test]
    fn folding_adds_the_border_back_onto_its_reflection() {
        let pool = IntraPool::new("test-fold", 2);
        // REFLECT [a b c] by (2, 1) is [c b a b c b]; its gradient folds back.
        let mut dims = vec![6];
        let g = [1.0f64, 10.0, 100.0, 1000.0, 10000.0, 100000.0];
        let out = fold(&pool, &g, &mut dims, 0, (2, 1), 1);
        assert_eq!(dims, [3]);
        assert_eq!(out, [100.0, 1000.0 + 10.0 + 100000.0, 10000.0 + 1.0]);
        // SYMMETRIC [a b] by (1, 2) is [a a b b a].
        let mut dims = vec![5, 1];
        let out = fold(
            &pool,
            &[1.0f32, 2.0, 3.0, 4.0, 5.0],
            &mut dims,
            0,
            (1, 2),
            0,
        );
        assert_eq!((dims, out), (vec![2, 1], vec![1.0 + 2.0 + 5.0, 3.0 + 4.0]));
    }
}
