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
//! shape. A lookup is [`Graph::embedding_lookup`] with the `div` strategy: ids in contiguous
//! ranges, as the parts slice the whole table, so a checkpoint restores under another ps
//! count. Each part's rows are gathered on its ps task, so a step moves the rows it reads, not
//! the table; the gradient of a part is the rows read and their gradients (`IndexedSlices`),
//! and the optimizer updates those rows only, on the ps.

use rand::rngs::StdRng;

use crate::data::synthetic::mix64;
use crate::error::{Result, Status};
use crate::graph::{
    fixed_size_partitioner, Graph, Output, PartitionStrategy, PartitionedVariable, Variable,
};
use crate::tensor::{DType, Shape};

use super::layers::{dense_forward, dense_variables};

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
        named.extend(dense_variables(g, rng, &self.widths())?);
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
    /// (`[b, columns]` int64), with `tables` the two tables [`Embedding::variables`] made
    /// (read row by row) and `values` reads of the dense layers' variables, in its order.
    pub fn forward(
        &self,
        g: &mut Graph,
        x: &Output,
        ids: &Output,
        tables: &[PartitionedVariable],
        values: &[Output],
    ) -> Result<Output> {
        let layers = self.widths().len() - 1;
        let [embedding, wide] = tables else {
            return Err(Status::internal(format!(
                "the embedding model has two tables, given {}",
                tables.len()
            )));
        };
        if values.len() != 2 * layers {
            return Err(Status::internal(format!(
                "the embedding model has {layers} dense layers, given {} values",
                values.len()
            )));
        }
        let columns = self.columns as i64;
        let rows = g.embedding_lookup(embedding, ids, PartitionStrategy::Div)?;
        let mut h = g.reshape_to(&rows, &[-1, columns * self.dim as i64])?;
        if self.dense > 0 {
            h = g.concat(&[h, x.clone()], 1)?;
        }
        let deep_logits = dense_forward(g, &h, values)?;
        let wide_rows = g.embedding_lookup(wide, ids, PartitionStrategy::Div)?;
        let wide_logits = g.sum(&wide_rows, &[1], false)?;
        g.add(&deep_logits, &wide_logits)
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
        let mut hit = [false; 100];
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
