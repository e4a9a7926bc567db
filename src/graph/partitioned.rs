//! Partitioned variables: one logical variable stored as several part variables along one
//! axis, so a large matrix spreads over the ps tasks (TensorFlow's `partitioned_variables.py`).
//!
//! A partitioner maps the full shape to a part count per axis (only one axis above 1).
//! [`Graph::partitioned_variable`] creates the parts `<name>/part_<i>` through
//! [`Graph::variable`], so the device setter places each one independently (round robin
//! alternates them over the ps tasks). An uneven split gives the first parts one extra row.
//! Each part is initialized from its `Slice` of the full initial value, and records its
//! [`SaveSlice`] (full name, full shape, offset, length) so a checkpoint can store one logical
//! tensor and restore it under another partitioning. The model reads the concatenation of the
//! parts (`<name>/ConcatPartitions/concat`); gradients flow back through the concat to each
//! part, and optimizers treat each part as a variable of its own.
//!
//! [`Graph::embedding_lookup`] reads rows of a partitioned table without the concatenation,
//! as TensorFlow's `embedding_lookup` does: each id goes to its part (`mod` or `div`
//! [`PartitionStrategy`]), each part's rows are gathered next to the part (a
//! `ResourceGather` colocated with it, so on its ps task), and the rows are stitched back in
//! the ids' order. A step then moves the rows it reads, and the gradient of each part is
//! those rows ([`crate::graph::indexed_slices`]), not the table.

use std::sync::Arc;

use crate::error::{Result, Status};
use crate::graph::builder::{Graph, NodeSpec, Output, Variable};
use crate::tensor::{DType, Shape};

/// Maps a variable's full shape and dtype to the number of parts along each axis.
pub type Partitioner = Arc<dyn Fn(&Shape, DType) -> Result<Vec<usize>> + Send + Sync>;

/// TensorFlow's `fixed_size_partitioner(num_shards, axis)`: `min(num_shards, dim[axis])`
/// parts along `axis`.
pub fn fixed_size_partitioner(num_shards: usize, axis: usize) -> Partitioner {
    Arc::new(move |shape: &Shape, _dtype: DType| {
        if num_shards == 0 {
            return Err(Status::invalid_argument(
                "fixed_size_partitioner needs at least 1 shard, got 0",
            ));
        }
        let dim = axis_length(shape, axis)?;
        let mut parts = vec![1; shape.rank()];
        parts[axis] = num_shards.min(dim).max(1);
        Ok(parts)
    })
}

/// The length of `shape` along `axis`, or INVALID_ARGUMENT when it has no such axis.
fn axis_length(shape: &Shape, axis: usize) -> Result<usize> {
    shape.dims().get(axis).copied().ok_or_else(|| {
        Status::invalid_argument(format!(
            "cannot partition a variable of shape {shape} along axis {axis}: it has only {} axes",
            shape.rank()
        ))
    })
}

/// TensorFlow's `min_max_variable_partitioner(max_partitions, axis, min_slice_size,
/// bytes_per_string_element)`: as many parts along `axis` as make each at least
/// `min_slice_size` bytes (rounded up), at most `max_partitions` and the axis' length, at
/// least one. Strings count `bytes_per_string_element` bytes each.
pub fn min_max_variable_partitioner(
    max_partitions: usize,
    axis: usize,
    min_slice_size: usize,
    bytes_per_string_element: usize,
) -> Partitioner {
    Arc::new(move |shape: &Shape, dtype: DType| {
        if max_partitions == 0 || min_slice_size == 0 {
            return Err(Status::invalid_argument(format!(
                "min_max_variable_partitioner needs max_partitions and min_slice_size of at \
                 least 1, got {max_partitions} and {min_slice_size}"
            )));
        }
        let dim = axis_length(shape, axis)?;
        let element = match dtype {
            DType::String => bytes_per_string_element,
            other => other.size().ok_or_else(|| {
                Status::invalid_argument(format!(
                    "min_max_variable_partitioner: {other} has no fixed size per element"
                ))
            })?,
        };
        let bytes = shape.num_elements() * element;
        let wanted = bytes.div_ceil(min_slice_size);
        let mut parts = vec![1; shape.rank()];
        parts[axis] = dim.min(max_partitions).min(wanted).max(1);
        Ok(parts)
    })
}

/// Where one part sits in the full variable: what TensorFlow's `SaveSliceInfo` records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveSlice {
    /// The full variable's name (the name a checkpoint stores it under).
    pub full_name: String,
    /// The full variable's shape.
    pub full_shape: Vec<usize>,
    /// The part's offset along each axis.
    pub var_offset: Vec<usize>,
    /// The part's length along each axis.
    pub var_shape: Vec<usize>,
}

impl SaveSlice {
    /// TensorFlow's slice spec string: the full dims, then `offset,length` per axis joined by
    /// `:` (`"10 4 0,4:0,4"` for rows 0..4 of a `[10, 4]` variable).
    pub fn spec(&self) -> String {
        let full: Vec<String> = self.full_shape.iter().map(|d| d.to_string()).collect();
        let slices: Vec<String> = self
            .var_offset
            .iter()
            .zip(&self.var_shape)
            .map(|(o, l)| format!("{o},{l}"))
            .collect();
        format!("{} {}", full.join(" "), slices.join(":"))
    }
}

/// A variable stored as parts.
#[derive(Clone, Debug)]
pub struct PartitionedVariable {
    /// The logical variable's name.
    pub name: String,
    /// The full shape.
    pub shape: Shape,
    /// The dtype.
    pub dtype: DType,
    /// The partitioned axis.
    pub axis: usize,
    /// The parts, in order along the axis.
    pub parts: Vec<Variable>,
    /// Each part's place in the full variable.
    pub slices: Vec<SaveSlice>,
    /// The full value: the concatenation of the parts' reads (the one part's read when there
    /// is one).
    pub value: Output,
}

impl PartitionedVariable {
    /// The initializers of every part.
    pub fn initializers(&self) -> Vec<String> {
        self.parts.iter().map(|p| p.initializer.clone()).collect()
    }
}

/// How [`Graph::embedding_lookup`] assigns ids to the parts of a table of `rows` rows in `n`
/// parts (TensorFlow's `partition_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionStrategy {
    /// Id `i` is row `i / n` of part `i % n` (TensorFlow's default).
    Mod,
    /// Ids in contiguous ranges, as the parts slice the whole table (the first `rows % n`
    /// parts one row longer): id `i` is row `i - offset_p` of the part `p` whose rows hold it,
    /// so a checkpoint restores to the same lookups under another partitioning.
    Div,
}

/// Splits `dim` into `n` lengths, the first `dim % n` one longer.
pub fn part_lengths(dim: usize, n: usize) -> Vec<usize> {
    let (base, extra) = (dim / n, dim % n);
    (0..n).map(|i| base + usize::from(i < extra)).collect()
}

impl Graph {
    /// Creates variable `name` (made unique) from `initial` (fully known shape) as parts
    /// chosen by `partitioner`; see the module doc.
    pub fn partitioned_variable(
        &mut self,
        name: &str,
        initial: &Output,
        partitioner: &Partitioner,
    ) -> Result<PartitionedVariable> {
        let shape = initial.shape.to_shape().ok_or_else(|| {
            Status::invalid_argument(format!(
                "partitioned variable `{name}`: the initial value `{}` has a partly unknown \
                 shape {}; partitioning needs a fully known shape",
                initial.name(),
                initial.shape
            ))
        })?;
        let whole = shape.dims().to_vec();
        self.partitioned_variable_with(
            name,
            &shape,
            initial.dtype,
            partitioner,
            |g, part, slice| {
                if slice.var_shape == whole {
                    return Ok(initial.clone());
                }
                let to_i64 = |v: &[usize]| v.iter().map(|&d| d as i64).collect::<Vec<_>>();
                let at = format!("{part}/Initializer/Slice");
                let begin = g.const_vec_i32(&format!("{at}/begin/"), &to_i64(&slice.var_offset))?;
                let size = g.const_vec_i32(&format!("{at}/size/"), &to_i64(&slice.var_shape))?;
                g.add1(
                    NodeSpec::new("Slice")
                        .name(&format!("{at}/"))
                        .input(initial)
                        .input(&begin)
                        .input(&size),
                )
            },
        )
    }

    /// Creates variable `name` (made unique) of `shape` and `dtype` as parts chosen by
    /// `partitioner`, each initialised from what `init` builds for it (given the part's name
    /// and its [`SaveSlice`]: a random op of the part's shape, say), so that no node holds or
    /// computes the whole initial value.
    pub fn partitioned_variable_with(
        &mut self,
        name: &str,
        shape: &Shape,
        dtype: DType,
        partitioner: &Partitioner,
        mut init: impl FnMut(&mut Graph, &str, &SaveSlice) -> Result<Output>,
    ) -> Result<PartitionedVariable> {
        let counts = partitioner(shape, dtype)?;
        if counts.len() != shape.rank() || counts.iter().filter(|&&c| c > 1).count() > 1 {
            return Err(Status::invalid_argument(format!(
                "partitioned variable `{name}`: partitioner returned {counts:?} for shape {shape}; \
                 it must give one count per axis with at most one above 1"
            )));
        }
        let axis = counts.iter().position(|&c| c > 1).unwrap_or(0);
        let n = counts.get(axis).copied().unwrap_or(1).max(1);
        let full = self.with_name_scope(name, |g| g.name_scope().to_string());
        let dims: Vec<usize> = shape.dims().to_vec();
        let lengths = if dims.is_empty() {
            vec![1]
        } else {
            part_lengths(dims[axis], n)
        };
        let mut parts = Vec::with_capacity(n);
        let mut slices = Vec::with_capacity(n);
        let mut offset = 0;
        for (i, &len) in lengths.iter().enumerate() {
            let part = format!("{full}/part_{i}");
            let mut var_offset = vec![0; dims.len()];
            let mut var_shape = dims.clone();
            if !dims.is_empty() {
                var_offset[axis] = offset;
                var_shape[axis] = len;
                offset += len;
            }
            let slice = SaveSlice {
                full_name: full.clone(),
                full_shape: dims.clone(),
                var_offset,
                var_shape,
            };
            let initial = init(self, &part, &slice)?;
            parts.push(self.variable(&format!("{part}/"), &initial)?);
            slices.push(slice);
        }
        let value = if n == 1 {
            parts[0].value.clone()
        } else {
            let reads: Vec<Output> = parts.iter().map(|p| p.value.clone()).collect();
            self.with_name_scope(&format!("{full}/ConcatPartitions/"), |g| {
                g.concat(&reads, axis as i64)
            })?
        };
        Ok(PartitionedVariable {
            name: full,
            shape: shape.clone(),
            dtype,
            axis,
            parts,
            slices,
            value,
        })
    }

    /// The rows `ids` (int64 or int32, any shape) of the resource table `params`: a tensor of
    /// shape `ids.shape + params.shape[1:]`, read part by part; see the module doc. Ids must
    /// be in `0..rows` (a gather fails the step naming any other).
    pub fn embedding_lookup(
        &mut self,
        params: &PartitionedVariable,
        ids: &Output,
        strategy: PartitionStrategy,
    ) -> Result<Output> {
        if params.axis != 0 || params.shape.rank() < 1 {
            return Err(Status::invalid_argument(format!(
                "embedding_lookup on `{}`: its parts split axis {} of shape {}; a table is \
                 split along its rows (axis 0)",
                params.name, params.axis, params.shape
            )));
        }
        let name = format!("{}/embedding_lookup", params.name);
        let scope = self.with_name_scope(&name, |g| g.name_scope().to_string());
        self.with_name_scope(&format!("{scope}/"), |g| {
            let flat = g.reshape_to(ids, &[-1])?;
            let rows = g.lookup_rows(params, &flat, strategy)?;
            // ids.shape + params.shape[1:].
            let ids_shape = g.shape(ids)?;
            let row_dims: Vec<i64> = params.shape.dims()[1..].iter().map(|&d| d as i64).collect();
            let row_shape = g.const_vec_i32(&format!("{scope}/row_shape/"), &row_dims)?;
            let shape = g.concat(&[ids_shape, row_shape], 0)?;
            g.reshape(&rows, &shape)
        })
    }

    /// The rows `flat` (`[n]`) of `params`, in order: `[n, params.shape[1:]]`.
    fn lookup_rows(
        &mut self,
        params: &PartitionedVariable,
        flat: &Output,
        strategy: PartitionStrategy,
    ) -> Result<Output> {
        let gather = |g: &mut Graph, part: &Variable, ids: &Output| {
            g.with_colocation(&part.handle.node, |g| {
                g.resource_gather(&part.handle, ids, params.dtype, 0)
            })
        };
        let parts = &params.parts;
        if let [part] = &parts[..] {
            return gather(self, part, flat);
        }
        let dtype = flat.dtype;
        let n = parts.len();
        let rows = params.shape.dims()[0];
        let (part, row) = match strategy {
            PartitionStrategy::Mod => {
                let count = self.scalar("parts", dtype, n as f64)?;
                let part = self.binary("FloorMod", flat, &count)?;
                let row = self.binary("FloorDiv", flat, &count)?;
                (part, row)
            }
            PartitionStrategy::Div => {
                let (per, extras) = ((rows / n) as f64, (rows % n) as f64);
                let longer = self.scalar("ids_per_long_part", dtype, per + 1.0)?;
                let shorter = self.scalar("ids_per_part", dtype, per)?;
                let extras = self.scalar("long_parts", dtype, extras)?;
                // An id below `extras · (per + 1)` is in a long part, the others in a short.
                let in_long = self.binary("FloorDiv", flat, &longer)?;
                let past = self.sub(flat, &extras)?;
                let in_short = self.binary("FloorDiv", &past, &shorter)?;
                let part = self.binary("Maximum", &in_long, &in_short)?;
                let is_long = self.binary("Less", &part, &extras)?;
                let long_row = self.binary("FloorMod", flat, &longer)?;
                let short_row = self.binary("FloorMod", &past, &shorter)?;
                let row = self.select(&is_long, &long_row, &short_row, false)?;
                (part, row)
            }
        };
        let part = self.cast(&part, DType::Int32)?;
        let size = self.shape(flat)?;
        let size = self.reshape_to(&size, &[])?;
        let zero = self.scalar("zero", DType::Int32, 0.0)?;
        let one = self.scalar("one", DType::Int32, 1.0)?;
        let positions = self.range(&zero, &size, &one)?;
        let ids_by_part = self.dynamic_partition(&row, &part, n)?;
        let places = self.dynamic_partition(&positions, &part, n)?;
        let gathered = parts
            .iter()
            .zip(&ids_by_part)
            .map(|(p, ids)| gather(self, p, ids))
            .collect::<Result<Vec<_>>>()?;
        self.dynamic_stitch(&places, &gathered, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_max_partitions_as_tensorflow_does() {
        // TensorFlow 2.21's tf.compat.v1.min_max_variable_partitioner gave these.
        // (max_partitions, axis, min_slice_size, shape, dtype, TensorFlow's parts)
        type Case = (
            usize,
            usize,
            usize,
            &'static [usize],
            DType,
            &'static [usize],
        );
        let cases: [Case; 5] = [
            (3, 0, 16 << 10, &[1088, 16], DType::Float, &[3, 1]),
            (8, 0, 256 << 10, &[1088, 16], DType::Float, &[1, 1]),
            (20, 0, 64, &[10, 4], DType::String, &[10, 1]),
            (4, 1, 100, &[3, 50], DType::Double, &[1, 4]),
            (7, 0, 1000, &[1000, 1], DType::Int32, &[4, 1]),
        ];
        for (max, axis, min_slice, shape, dtype, want) in cases {
            let partitioner = min_max_variable_partitioner(max, axis, min_slice, 16);
            let got = partitioner(&Shape::new(shape.to_vec()), dtype).unwrap();
            assert_eq!(
                got, want,
                "{shape:?} {dtype} max {max} min slice {min_slice}"
            );
        }
        let bad = min_max_variable_partitioner(2, 3, 1024, 16);
        assert!(bad(&Shape::new(vec![4, 4]), DType::Float).is_err());
    }
}
