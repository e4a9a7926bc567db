//! The wide-and-deep model of `--model embedding`: each example's ids (hashed into a table's
//! rows as the data is loaded, [`bucket`]) look up rows of two tables partitioned over every
//! ps task, beside its dense features.
//!
//! ```text
//! ids [b, c] int64 (rows of the tables), x [b, d] float32
//! deep: embedding rows [b, c·dim] ++ x → dense layers with ReLU (--hidden) → [b, classes]
//! wide: wide rows [b, c, classes] summed over the columns           → [b, classes]
//! logits = deep + wide
//! ```
//!
//! The tables (`embedding` `[rows, dim]`, initialised from a truncated normal of standard
//! deviation `1/√dim`; `wide` `[rows, classes]`, zeros) are partitioned variables of one part
//! per ps task (`fixed_size_partitioner`), each part initialised by an op of the part's own
//! shape. A lookup is TensorFlow's `embedding_lookup` with the `div` strategy: ids in
//! contiguous ranges, as the parts slice the whole table, so a checkpoint restores under
//! another ps count. Each part's `ResourceGather` is colocated with the part, so a step moves
//! the rows it reads, not the table; the gradient of a part is the rows read and their
//! gradients (`IndexedSlices`), and the optimizer updates those rows only, on the ps.

use rand::rngs::StdRng;
use rand::Rng;

use crate::data::synthetic::mix64;
use crate::error::{Result, Status};
use crate::graph::{fixed_size_partitioner, Graph, Output, PartitionedVariable, Variable};
use crate::tensor::{DType, Shape, Tensor};

/// The ids placeholder.
pub const IDS: &str = "ids:0";

/// The embedding table's rows when `--table_rows` is not given.
pub const DEFAULT_ROWS: usize = 1_000_000;
/// The embedding's width when `--embedding_dim` is not given.
pub const DEFAULT_DIM: usize = 32;

/// The row of a table of `rows` rows that id `id` of column `column` is hashed to: distinct
/// columns hash the same id to unrelated rows.
pub fn bucket(column: usize, id: i64, rows: usize) -> i64 {
    let h = mix64(mix64(column as u64) ^ id as u64);
    (h % rows as u64) as i64
}

/// The shape of one `--model embedding` network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Embedding {
    /// Rows of each table.
    rows: usize,
    /// The embedding's width.
    dim: usize,
    /// Hidden dense widths of the deep part, input side first (may be empty).
    hidden: Vec<usize>,
    /// Ids per example.
    columns: usize,
    /// Dense features per example.
    dense: usize,
    /// Logits per example.
    classes: usize,
    /// Parts per table: one per ps task (at most `rows`).
    parts: usize,
}

/// What [`Embedding::variables`] created.
pub struct EmbeddingVariables {
    /// Every variable, named, in the order [`Embedding::forward`] takes them: the embedding
    /// table's parts, the wide table's parts, then each dense layer's `w` and `b`.
    pub named: Vec<(String, Variable)>,
    /// The two tables (for the saver: each part saved as its slice of the whole table).
    pub tables: Vec<PartitionedVariable>,
}

impl Embedding {
    /// The network for examples of `columns` ids and `dense` features in `classes` classes,
    /// its tables of `rows` rows split over `num_ps` ps tasks.
    pub fn new(
        rows: usize,
        dim: usize,
        hidden: &[usize],
        columns: usize,
        dense: usize,
        classes: usize,
        num_ps: usize,
    ) -> Result<Self> {
        if columns == 0 {
            return Err(Status::invalid_argument(
                "--model embedding looks up ids, but the data has no id columns; use --data \
                 clicks, or --data csv:PATH with --id_columns naming its id columns",
            ));
        }
        if rows == 0 || dim == 0 || hidden.contains(&0) {
            return Err(Status::invalid_argument(format!(
                "--table_rows {rows}, --embedding_dim {dim}, --hidden {hidden:?}: the table \
                 needs at least one row of at least one value, and each hidden layer a unit"
            )));
        }
        Ok(Self {
            rows,
            dim,
            hidden: hidden.to_vec(),
            columns,
            dense,
            classes,
            parts: num_ps.clamp(1, rows),
        })
    }

    /// The widths of the deep part's dense layers, its input first, the logits last.
    fn widths(&self) -> Vec<usize> {
        let mut widths = vec![self.columns * self.dim + self.dense];
        widths.extend(&self.hidden);
        widths.push(self.classes);
        widths
    }

    /// Creates the tables (their part initialisers seeded by `seed`) and the dense layers
    /// (Glorot-uniform weights from `rng`, zero biases).
    pub fn variables(
        &self,
        g: &mut Graph,
        rng: &mut StdRng,
        seed: u64,
    ) -> Result<EmbeddingVariables> {
        let partitioner = fixed_size_partitioner(self.parts, 0);
        let scale = 1.0 / (self.dim as f64).sqrt();
        let embedding = g.partitioned_variable_with(
            "embedding",
            &Shape::new(vec![self.rows, self.dim]),
            DType::Float,
            &partitioner,
            |g, part, slice| {
                let dims: Vec<i64> = slice.var_shape.iter().map(|&d| d as i64).collect();
                let shape = g.const_vec_i32(&format!("{part}/Initializer/shape/"), &dims)?;
                let offset = slice.var_offset[0] as u64;
                let normal = g.random(
                    "TruncatedNormal",
                    &shape,
                    DType::Float,
                    (seed & 0x7fff_ffff) as i64,
                    (mix64(offset) & 0x7fff_ffff) as i64,
                )?;
                let scale = g.scalar(&format!("{part}/Initializer/stddev"), DType::Float, scale)?;
                g.mul(&normal, &scale)
            },
        )?;
        let wide = g.partitioned_variable_with(
            "wide",
            &Shape::new(vec![self.rows, self.classes]),
            DType::Float,
            &partitioner,
            |g, part, slice| {
                let dims: Vec<i64> = slice.var_shape.iter().map(|&d| d as i64).collect();
                let shape = g.const_vec_i32(&format!("{part}/Initializer/shape/"), &dims)?;
                let zero = g.scalar(&format!("{part}/Initializer/zero"), DType::Float, 0.0)?;
                g.fill(&shape, &zero)
            },
        )?;
        let mut named = Vec::new();
        for table in [&embedding, &wide] {
            for (i, part) in table.parts.iter().enumerate() {
                named.push((format!("{}/part_{i}", table.name), part.clone()));
            }
        }
        for (layer, pair) in self.widths().windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
            let values = (0..fan_in * fan_out)
                .map(|_| rng.random_range(-limit..limit))
                .collect();
            let w0 = g.constant(&Tensor::from_vec([fan_in, fan_out], values)?)?;
            let name = format!("layer{layer}/w");
            named.push((name.clone(), g.variable(&name, &w0)?));
            let b0 = g.constant(&Tensor::zeros(DType::Float, [fan_out])?)?;
            let name = format!("layer{layer}/b");
            named.push((name.clone(), g.variable(&name, &b0)?));
        }
        Ok(EmbeddingVariables {
            named,
            tables: vec![embedding, wide],
        })
    }

    /// How many of [`Embedding::variables`]' variables are table parts (they come first).
    pub fn table_parts(&self) -> usize {
        2 * self.parts
    }

    /// The logits `[b, classes]` of the dense features `x` (`[b, dense]`) and the rows `ids`
    /// (`[b, columns]` int64), with `vars` the variables in the order
    /// [`Embedding::variables`] returns them and `values` reads of the dense layers' (the
    /// tables are read row by row, through their handles).
    pub fn forward(
        &self,
        g: &mut Graph,
        x: &Output,
        ids: &Output,
        vars: &[Variable],
        values: &[Output],
    ) -> Result<Output> {
        let layers = self.widths().len() - 1;
        if vars.len() < self.table_parts() || values.len() != 2 * layers {
            return Err(Status::internal(format!(
                "the embedding model has {} table parts and {layers} dense layers, given {} \
                 variables and {} dense values",
                self.table_parts(),
                vars.len(),
                values.len()
            )));
        }
        let (embedding, wide) = vars[..self.table_parts()].split_at(self.parts);
        let columns = self.columns as i64;
        let flat = g.reshape_to(ids, &[-1])?;
        let rows = g.with_name_scope("embedding_lookup", |g| self.lookup(g, embedding, &flat))?;
        let mut h = g.reshape_to(&rows, &[-1, columns * self.dim as i64])?;
        if self.dense > 0 {
            h = g.concat(&[h, x.clone()], 1)?;
        }
        for (layer, pair) in values.chunks_exact(2).enumerate() {
            let z = g.matmul(&h, &pair[0])?;
            h = g.bias_add(&z, &pair[1])?;
            if layer + 1 < layers {
                h = g.relu(&h)?;
            }
        }
        let wide_rows = g.with_name_scope("wide_lookup", |g| self.lookup(g, wide, &flat))?;
        let wide_rows = g.reshape_to(&wide_rows, &[-1, columns, self.classes as i64])?;
        let wide_logits = g.sum(&wide_rows, &[1], false)?;
        g.add(&h, &wide_logits)
    }

    /// The rows `flat` (`[n]` int64, each in `0..rows`) of the table whose parts are `parts`:
    /// TensorFlow's `embedding_lookup` with the `div` strategy. Part `p` holds rows
    /// `offset_p..offset_p + len_p`, the first `rows % parts` parts one row longer; each id
    /// goes to its part (`DynamicPartition`), each part's rows are gathered on the part's
    /// device, and `DynamicStitch` puts them back in the ids' order.
    fn lookup(&self, g: &mut Graph, parts: &[Variable], flat: &Output) -> Result<Output> {
        let gather = |g: &mut Graph, part: &Variable, ids: &Output| {
            g.with_colocation(&part.handle.node, |g| {
                g.resource_gather(&part.handle, ids, DType::Float, 0)
            })
        };
        if let [part] = parts {
            return gather(g, part, flat);
        }
        let (per, extras) = (
            (self.rows / self.parts) as f64,
            (self.rows % self.parts) as f64,
        );
        let longer = g.scalar("ids_per_long_part", DType::Int64, per + 1.0)?;
        let shorter = g.scalar("ids_per_part", DType::Int64, per)?;
        let extras = g.scalar("long_parts", DType::Int64, extras)?;
        // An id below `extras · (per + 1)` is in a long part, the others in a short one.
        let in_long = g.binary("FloorDiv", flat, &longer)?;
        let past = g.sub(flat, &extras)?;
        let in_short = g.binary("FloorDiv", &past, &shorter)?;
        let part = g.binary("Maximum", &in_long, &in_short)?;
        let is_long = g.binary("Less", &part, &extras)?;
        let long_row = g.binary("FloorMod", flat, &longer)?;
        let short_row = g.binary("FloorMod", &past, &shorter)?;
        let row = g.select(&is_long, &long_row, &short_row, false)?;
        let part = g.cast(&part, DType::Int32)?;
        let n = g.shape(flat)?;
        let n = g.reshape_to(&n, &[])?;
        let zero = g.scalar("zero", DType::Int32, 0.0)?;
        let one = g.scalar("one", DType::Int32, 1.0)?;
        let positions = g.range(&zero, &n, &one)?;
        let rows = g.dynamic_partition(&row, &part, parts.len())?;
        let places = g.dynamic_partition(&positions, &part, parts.len())?;
        let gathered = parts
            .iter()
            .zip(&rows)
            .map(|(p, ids)| gather(g, p, ids))
            .collect::<Result<Vec<_>>>()?;
        g.dynamic_stitch(&places, &gathered, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_hash_into_the_table_and_columns_apart() {
        let rows = 1000;
        for id in [-5, 0, 1, 7, i64::MAX] {
            let b = bucket(0, id, rows);
            assert!((0..rows as i64).contains(&b), "{b}");
            assert_eq!(b, bucket(0, id, rows), "deterministic");
        }
        // The same id in two columns lands apart (for these ids).
        let same = (0..100)
            .filter(|&id| bucket(0, id, rows) == bucket(1, id, rows))
            .count();
        assert!(same <= 2, "{same} of 100 ids collide across columns");
        // Ids spread over the rows.
        let mut hit = vec![false; 100];
        for id in 0..1000 {
            hit[bucket(2, id, 100) as usize] = true;
        }
        assert!(
            hit.iter().all(|&h| h),
            "1000 ids reach every one of 100 rows"
        );
    }

    #[test]
    fn a_model_without_id_columns_is_refused_naming_the_flags() {
        let err = Embedding::new(10, 4, &[8], 0, 3, 2, 2).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("--id_columns"), "{err}");
        assert!(Embedding::new(0, 4, &[8], 2, 3, 2, 2).is_err());
        // More ps tasks than rows: one part per row.
        assert_eq!(Embedding::new(3, 4, &[], 2, 0, 2, 5).unwrap().parts, 3);
    }
}
