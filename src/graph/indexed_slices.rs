//! Sparse gradients: the gradient of a gather as the rows it read and their gradients
//! (TensorFlow's `IndexedSlices`), so that an optimizer can update only those rows of an
//! embedding table instead of adding a dense, mostly-zero tensor of the table's shape.
//!
//! [`sparse_gradients`] is [`gradients`] for tensors some of which are only read through
//! gathers: a variable's handle whose every use on the way to `ys` is a `ResourceGather` (or a
//! `ReadVariableOp` whose every use is an axis-0 `GatherV2`), or a tensor (a reference
//! variable, say) whose every use is an axis-0 `GatherV2` of it or an `Identity` of it whose
//! every use is one. Those get [`GradientTensor::Slices`]: the gradients of the gathers'
//! outputs (one backward graph for everything, from one [`gradients`] call), reshaped to rows
//! and concatenated, with the gathers' indices; any other tensor gets the dense gradient
//! [`gradients`] gives it. The dense API is untouched: [`gradients`] still returns dense
//! tensors, and [`GradientTensor::to_dense`] turns slices into the same tensor
//! (`UnsortedSegmentSum` of the rows, as TensorFlow densifies `IndexedSlices`).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::error::{Result, Status};
use crate::graph::attr;
use crate::graph::builder::{Graph, Output};
use crate::graph::gradients::gradients;
use crate::proto::NodeDef;
use crate::tensor::DType;

/// Rows of a tensor of shape `dense_shape`: row `indices[i]` holds `values[i, ...]`, rows
/// named twice adding up, rows never named being zero.
#[derive(Clone, Debug)]
pub struct IndexedSlices {
    /// `[n, dense_shape[1:]...]`.
    pub values: Output,
    /// `[n]`, int32 or int64.
    pub indices: Output,
    /// The dense tensor's shape, a 1-D int32 tensor (int64 where it comes from a sparse
    /// accumulator's take).
    pub dense_shape: Output,
}

/// A gradient: a dense tensor, or the rows a gather touched.
#[derive(Clone, Debug)]
pub enum GradientTensor {
    Dense(Output),
    Slices(IndexedSlices),
}

impl GradientTensor {
    /// The gradient as a dense tensor.
    pub fn to_dense(&self, g: &mut Graph) -> Result<Output> {
        match self {
            GradientTensor::Dense(t) => Ok(t.clone()),
            GradientTensor::Slices(s) => s.to_dense(g),
        }
    }
}

impl IndexedSlices {
    /// The dense tensor: the rows summed into `dense_shape[0]` rows.
    pub fn to_dense(&self, g: &mut Graph) -> Result<Output> {
        let zero = g.const_i32("Const", &[], &[0])?;
        let rows = g.gather(&self.dense_shape, &zero, 0)?;
        let dense = g.unsorted_segment_sum(&self.values, &self.indices, &rows)?;
        g.reshape(&dense, &self.dense_shape)
    }

    /// The same slices with each index once, the rows of a repeated index summed
    /// (TensorFlow's `_deduplicate_indexed_slices`: `Unique`, then `UnsortedSegmentSum`):
    /// what an update that overwrites rows (`ResourceScatterUpdate`, the `SparseApply*` ops)
    /// needs.
    pub fn deduplicated(&self, g: &mut Graph) -> Result<IndexedSlices> {
        let (unique, positions) = g.unique(&self.indices)?;
        let shape = g.shape(&unique)?;
        let zero = g.const_i32("Const", &[], &[0])?;
        let count = g.gather(&shape, &zero, 0)?;
        let values = g.unsorted_segment_sum(&self.values, &positions, &count)?;
        Ok(IndexedSlices {
            values,
            indices: unique,
            dense_shape: self.dense_shape.clone(),
        })
    }
}

/// A gather that reads rows of one of the `xs`: its output, its indices and where the shape
/// of what it reads comes from.
struct Piece {
    output: Output,
    indices: Output,
    /// The gathered tensor (`GatherV2`), or the variable's handle (`ResourceGather`).
    source: Output,
}

/// The (node, input) name of a data input: `("a", 1)` for `a:1`, `None` for `^a`.
fn parse_input(input: &str) -> Option<(&str, usize)> {
    if input.starts_with('^') {
        return None;
    }
    Some(match input.rsplit_once(':') {
        Some((n, i)) => match i.parse() {
            Ok(i) => (n, i),
            Err(_) => (input, 0),
        },
        None => (input, 0),
    })
}

/// The names of the nodes `ys` depend on through data edges, theirs included.
fn reaching(g: &Graph, ys: &[Output]) -> HashSet<String> {
    let mut seen: HashSet<String> = ys.iter().map(|y| y.node.clone()).collect();
    let mut queue: VecDeque<String> = seen.iter().cloned().collect();
    while let Some(name) = queue.pop_front() {
        let Some(node) = g.node(&name) else { continue };
        for (input, _) in node.input.iter().filter_map(|i| parse_input(i)) {
            if seen.insert(input.to_string()) {
                queue.push_back(input.to_string());
            }
        }
    }
    seen
}

/// Every (consumer, input position) of each output, among the nodes in `within`.
fn consumers<'a>(
    g: &'a Graph,
    within: &HashSet<String>,
) -> HashMap<(String, usize), Vec<(&'a NodeDef, usize)>> {
    let mut out: HashMap<(String, usize), Vec<(&NodeDef, usize)>> = HashMap::new();
    for node in g.nodes().iter().filter(|n| within.contains(&n.name)) {
        for (pos, input) in node.input.iter().enumerate() {
            if let Some((name, index)) = parse_input(input) {
                out.entry((name.to_string(), index))
                    .or_default()
                    .push((node, pos));
            }
        }
    }
    out
}

/// The gather `node` is, when it reads rows (axis 0, no batch dims) of its input `pos`.
fn as_piece(g: &Graph, node: &NodeDef, pos: usize) -> Option<Piece> {
    let batch_dims = attr::int_or(node, "batch_dims", 0).ok()?;
    if pos != 0 || batch_dims != 0 {
        return None;
    }
    let input = |i: usize| g.tensor(node.input.get(i)?).ok();
    match node.op.as_str() {
        "GatherV2" => {
            let axis = input(2)?;
            let axis = g.meta_of(&axis)?.value.clone()?;
            (axis.as_slice() == [0]).then_some(())?;
        }
        "ResourceGather" => {}
        _ => return None,
    }
    Some(Piece {
        output: g.output(&node.name, 0).ok()?,
        indices: input(1)?,
        source: input(0)?,
    })
}

/// The gathers through which alone `x` reaches `ys`, or `None` when something else reads it
/// (or nothing does).
fn pieces_of(
    g: &Graph,
    x: &Output,
    uses: &HashMap<(String, usize), Vec<(&NodeDef, usize)>>,
    ys: &[Output],
) -> Option<Vec<Piece>> {
    let used_by = |o: &Output| uses.get(&(o.node.clone(), o.index));
    let is_y = |o: &Output| ys.iter().any(|y| y.node == o.node && y.index == o.index);
    if is_y(x) {
        return None;
    }
    let mut pieces = Vec::new();
    for &(node, pos) in used_by(x)? {
        // A read of the variable (a resource's ReadVariableOp, a reference variable's
        // Identity) counts as the variable when all its own uses are gathers.
        let reads = match node.op.as_str() {
            "ReadVariableOp" => x.dtype == DType::Resource,
            "Identity" => x.dtype != DType::Resource,
            _ => false,
        };
        if reads {
            let read = g.output(&node.name, 0).ok()?;
            if is_y(&read) {
                return None;
            }
            for &(reader, pos) in used_by(&read)? {
                (reader.op == "GatherV2").then_some(())?;
                pieces.push(as_piece(g, reader, pos)?);
            }
        } else {
            let expected = if x.dtype == DType::Resource {
                "ResourceGather"
            } else {
                "GatherV2"
            };
            (node.op == expected).then_some(())?;
            pieces.push(as_piece(g, node, pos)?);
        }
    }
    (!pieces.is_empty()).then_some(pieces)
}

/// The shape of what a piece gathers from, as a 1-D int32 tensor.
fn source_shape(g: &mut Graph, source: &Output) -> Result<Output> {
    if source.dtype != DType::Resource {
        let s = g.shape_of(source)?;
        return if s.dtype == DType::Int32 {
            Ok(s)
        } else {
            g.cast(&s, DType::Int32)
        };
    }
    let known = g
        .meta_of(source)
        .and_then(|m| m.handle_shape.as_ref()?.to_shape());
    match known {
        Some(s) => {
            let dims: Vec<i64> = s.dims().iter().map(|&d| d as i64).collect();
            g.const_vec_i32("Shape", &dims)
        }
        None => g.variable_shape(source),
    }
}

/// Joins the gradients of a tensor's gathers into one set of slices.
fn slices(
    g: &mut Graph,
    pieces: &[Piece],
    grads: &[Option<Output>],
) -> Result<Option<IndexedSlices>> {
    let dense_shape = source_shape(g, &pieces[0].source)?;
    let one = g.const_vec_i32("Const", &[1])?;
    let rest_size = g.const_vec_i32("Const", &[-1])?;
    let row_shape = g.slice(&dense_shape, &one, &rest_size)?;
    let (mut values, mut indices) = (Vec::new(), Vec::new());
    for (piece, grad) in pieces.iter().zip(grads) {
        let Some(grad) = grad else { continue };
        let n = g.unary("Size", &piece.indices)?;
        let n = g.reshape_to(&n, &[1])?;
        let shape = g.concat(&[n, row_shape.clone()], 0)?;
        values.push(g.reshape(grad, &shape)?);
        indices.push(g.reshape_to(&piece.indices, &[-1])?);
    }
    if values.is_empty() {
        return Ok(None);
    }
    if indices.iter().any(|i| i.dtype != indices[0].dtype) {
        indices = indices
            .iter()
            .map(|i| {
                if i.dtype == DType::Int64 {
                    Ok(i.clone())
                } else {
                    g.cast(i, DType::Int64)
                }
            })
            .collect::<Result<_>>()?;
    }
    let (values, indices) = if values.len() == 1 {
        (values.remove(0), indices.remove(0))
    } else {
        (g.concat(&values, 0)?, g.concat(&indices, 0)?)
    };
    Ok(Some(IndexedSlices {
        values,
        indices,
        dense_shape,
    }))
}

/// [`gradients`] that returns the gradient of a tensor read only through row gathers as
/// [`IndexedSlices`] (see the module doc); the others are dense.
pub fn sparse_gradients(
    g: &mut Graph,
    ys: &[Output],
    xs: &[Output],
    grad_ys: Option<&[Output]>,
) -> Result<Vec<Option<GradientTensor>>> {
    if xs.is_empty() {
        return Err(Status::invalid_argument(
            "sparse_gradients needs at least one tensor to differentiate with respect to",
        ));
    }
    let within = reaching(g, ys);
    let plans: Vec<Option<Vec<Piece>>> = {
        let uses = consumers(g, &within);
        xs.iter().map(|x| pieces_of(g, x, &uses, ys)).collect()
    };
    // One backward graph: the dense xs and the outputs of the sparse xs' gathers.
    let mut wrt = Vec::new();
    for (x, plan) in xs.iter().zip(&plans) {
        match plan {
            Some(pieces) => wrt.extend(pieces.iter().map(|p| p.output.clone())),
            None => wrt.push(x.clone()),
        }
    }
    let mut grads = gradients(g, ys, &wrt, grad_ys)?.into_iter();
    let mut out = Vec::with_capacity(xs.len());
    for plan in &plans {
        out.push(match plan {
            None => grads.next().flatten().map(GradientTensor::Dense),
            Some(pieces) => {
                let piece_grads: Vec<Option<Output>> = grads.by_ref().take(pieces.len()).collect();
                slices(g, pieces, &piece_grads)?.map(GradientTensor::Slices)
            }
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_parse_as_tensorflow_writes_them() {
        assert_eq!(parse_input("a"), Some(("a", 0)));
        assert_eq!(parse_input("a/b:2"), Some(("a/b", 2)));
        assert_eq!(parse_input("^a"), None);
    }
}
