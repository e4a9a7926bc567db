//! Training data: in-memory labelled examples, where they come from, and how a worker walks
//! through them.
//!
//! A [`Dataset`] holds `n` examples of `d` float32 features, `k` int64 ids (categorical
//! features an embedding model looks up; none for most data) and an int64 label each, or, for
//! regression, `t` float32 targets each (the label then 0). Sources:
//! [`synthetic`] (seeded Gaussian blobs, and clicks: ids and dense features with a 0/1 label),
//! [`csv`] (numeric features, id columns and an integer label column) and [`idx`] (MNIST's
//! format). A worker takes its [`shard`](Dataset::shard)
//! (examples `i` with `i % num_workers == index`, as `tf.data.Dataset.shard`), then iterates
//! [`batches`](Dataset::batches): fixed-size batches, shuffled with a seed per epoch so every
//! run sees the same order, returned as the tensors a training step feeds (`x: [b, d]`
//! float32, `ids: [b, k]` int64 when there are ids, `y: [b]` int64, or `[b, t]` float32 for
//! regression targets). [`synthetic::teacher`] makes seeded regression data.

pub mod csv;
pub mod digits;
pub mod idx;
pub mod synthetic;
pub mod tfrecord;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::error::{Result, Status};
use crate::tensor::{Shape, Tensor};

pub use synthetic::{blobs, clicks, teacher, BlobOptions, ClickOptions, TeacherOptions};

/// Labelled examples held in memory, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    features: Vec<f32>,
    labels: Vec<i64>,
    num_features: usize,
    /// `num_ids` ids per example, row-major.
    ids: Vec<i64>,
    num_ids: usize,
    /// `num_targets` float targets per example, row-major (regression; 0 for labelled data).
    targets: Vec<f32>,
    num_targets: usize,
}

impl Dataset {
    /// A data set of `labels.len()` examples whose features are consecutive runs of
    /// `num_features` values of `features`.
    pub fn new(features: Vec<f32>, labels: Vec<i64>, num_features: usize) -> Result<Self> {
        if num_features == 0 || features.len() != labels.len() * num_features {
            return Err(Status::invalid_argument(format!(
                "{} feature values do not make {} examples of {num_features} features",
                features.len(),
                labels.len()
            )));
        }
        Ok(Self {
            features,
            labels,
            num_features,
            ids: Vec::new(),
            num_ids: 0,
            targets: Vec::new(),
            num_targets: 0,
        })
    }

    /// A regression data set: `features.len() / num_features` examples, each with
    /// `num_features` features and `num_targets` float targets (consecutive runs).
    pub fn with_targets(
        features: Vec<f32>,
        num_features: usize,
        targets: Vec<f32>,
        num_targets: usize,
    ) -> Result<Self> {
        let n = features.len() / num_features.max(1);
        if num_features == 0
            || num_targets == 0
            || features.len() != n * num_features
            || targets.len() != n * num_targets
        {
            return Err(Status::invalid_argument(format!(
                "{} feature values and {} targets do not make examples of {num_features} \
                 features and {num_targets} targets",
                features.len(),
                targets.len()
            )));
        }
        Ok(Self {
            features,
            labels: vec![0; n],
            num_features,
            ids: Vec::new(),
            num_ids: 0,
            targets,
            num_targets,
        })
    }

    /// Float targets per example (0 for labelled data).
    pub fn num_targets(&self) -> usize {
        self.num_targets
    }

    /// Example `i`'s targets.
    pub fn targets(&self, i: usize) -> &[f32] {
        &self.targets[i * self.num_targets..(i + 1) * self.num_targets]
    }

    /// A data set of `labels.len()` examples, each with `num_features` of `features` and
    /// `num_ids` of `ids` (consecutive runs); one of the two counts may be 0.
    pub fn with_ids(
        features: Vec<f32>,
        num_features: usize,
        ids: Vec<i64>,
        num_ids: usize,
        labels: Vec<i64>,
    ) -> Result<Self> {
        let n = labels.len();
        if num_features + num_ids == 0
            || features.len() != n * num_features
            || ids.len() != n * num_ids
        {
            return Err(Status::invalid_argument(format!(
                "{} feature values and {} ids do not make {n} examples of {num_features} \
                 features and {num_ids} ids",
                features.len(),
                ids.len()
            )));
        }
        Ok(Self {
            features,
            labels,
            num_features,
            ids,
            num_ids,
            targets: Vec::new(),
            num_targets: 0,
        })
    }

    /// Ids per example (0 for data without id columns).
    pub fn num_ids(&self) -> usize {
        self.num_ids
    }

    /// Example `i`'s ids.
    pub fn ids(&self, i: usize) -> &[i64] {
        &self.ids[i * self.num_ids..(i + 1) * self.num_ids]
    }

    /// The same examples with each id replaced by `f(column, id)` (hashing ids into a
    /// table's rows, say).
    pub fn map_ids(mut self, f: impl Fn(usize, i64) -> i64) -> Self {
        if self.num_ids > 0 {
            for row in self.ids.chunks_exact_mut(self.num_ids) {
                for (column, id) in row.iter_mut().enumerate() {
                    *id = f(column, *id);
                }
            }
        }
        self
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The number of features per example.
    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// One more than the largest label (0 when empty).
    pub fn num_classes(&self) -> usize {
        self.labels.iter().max().map_or(0, |&m| m as usize + 1)
    }

    /// The features of example `i`.
    pub fn features(&self, i: usize) -> &[f32] {
        &self.features[i * self.num_features..(i + 1) * self.num_features]
    }

    /// The labels.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// The examples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Dataset {
        let mut features = Vec::with_capacity(indices.len() * self.num_features);
        let mut ids = Vec::with_capacity(indices.len() * self.num_ids);
        let mut labels = Vec::with_capacity(indices.len());
        let mut targets = Vec::with_capacity(indices.len() * self.num_targets);
        for &i in indices {
            features.extend_from_slice(self.features(i));
            ids.extend_from_slice(self.ids(i));
            labels.push(self.labels[i]);
            targets.extend_from_slice(self.targets(i));
        }
        Dataset {
            features,
            labels,
            num_features: self.num_features,
            ids,
            num_ids: self.num_ids,
            targets,
            num_targets: self.num_targets,
        }
    }

    /// Worker `index` of `num_workers`'s share: examples `i` with `i % num_workers == index`
    /// (`tf.data.Dataset.shard`), so the shards are disjoint and cover the data set.
    pub fn shard(&self, num_workers: usize, index: usize) -> Result<Dataset> {
        if num_workers == 0 || index >= num_workers {
            return Err(Status::invalid_argument(format!(
                "shard index {index} is out of range for {num_workers} workers; the index must \
                 be in 0..num_workers"
            )));
        }
        let idx: Vec<usize> = (index..self.len()).step_by(num_workers).collect();
        Ok(self.select(&idx))
    }

    /// A seeded random split: `(train, held_out)` with `round(len * held_out_fraction)`
    /// examples held out; the same seed gives the same split.
    pub fn split(&self, held_out_fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        if !(0.0..=1.0).contains(&held_out_fraction) {
            return Err(Status::invalid_argument(format!(
                "held-out fraction {held_out_fraction} is not in [0, 1]"
            )));
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let held = (self.len() as f64 * held_out_fraction).round() as usize;
        let (held_out, train) = order.split_at(held);
        Ok((self.select(train), self.select(held_out)))
    }

    /// The whole data set as one batch (for evaluation).
    pub fn to_batch(&self) -> Result<Batch> {
        Batch::new(self.clone())
    }

    /// Epoch `epoch`'s batches of `options.batch_size` examples, shuffled by
    /// `(options.seed, epoch)` when `options.shuffle`.
    pub fn batches(&self, options: &BatchOptions, epoch: u64) -> Result<Batches<'_>> {
        if options.batch_size == 0 {
            return Err(Status::invalid_argument(
                "batch size is 0; give a batch size of at least 1",
            ));
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        if options.shuffle {
            // Each epoch gets its own stream, derived from the seed and the epoch number.
            let seed = options
                .seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(epoch);
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        }
        Ok(Batches {
            data: self,
            order,
            next: 0,
            batch_size: options.batch_size,
            drop_remainder: options.drop_remainder,
        })
    }
}

/// How [`Dataset::batches`] cuts an epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOptions {
    /// Examples per batch.
    pub batch_size: usize,
    /// Whether to drop the last batch when it is smaller than `batch_size`.
    pub drop_remainder: bool,
    /// Whether to shuffle each epoch.
    pub shuffle: bool,
    /// The shuffle seed.
    pub seed: u64,
}

impl BatchOptions {
    /// Batches of `batch_size`, the last partial batch kept, shuffled with seed 0.
    pub fn new(batch_size: usize) -> Self {
        Self {
            batch_size,
            drop_remainder: false,
            shuffle: true,
            seed: 0,
        }
    }

    /// Sets the shuffle seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets whether to shuffle.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Sets whether to drop a last partial batch.
    pub fn drop_remainder(mut self, drop: bool) -> Self {
        self.drop_remainder = drop;
        self
    }
}

/// One batch, ready to feed.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Features, `[b, d]` float32.
    pub x: Tensor,
    /// Ids, `[b, k]` int64, when the data has id columns.
    pub ids: Option<Tensor>,
    /// Labels, `[b]` int64; or the targets, `[b, t]` float32, of regression data.
    pub y: Tensor,
}

impl Batch {
    fn new(part: Dataset) -> Result<Self> {
        let b = part.labels.len();
        let ids = match part.num_ids {
            0 => None,
            k => Some(Tensor::from_vec(Shape::new(vec![b, k]), part.ids)?),
        };
        Ok(Batch {
            x: Tensor::from_vec(Shape::new(vec![b, part.num_features]), part.features)?,
            ids,
            y: match part.num_targets {
                0 => Tensor::from_vec(Shape::new(vec![b]), part.labels)?,
                t => Tensor::from_vec(Shape::new(vec![b, t]), part.targets)?,
            },
        })
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.x.dims()[0]
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The batches of one epoch.
pub struct Batches<'a> {
    data: &'a Dataset,
    order: Vec<usize>,
    next: usize,
    batch_size: usize,
    drop_remainder: bool,
}

impl Iterator for Batches<'_> {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let left = self.order.len() - self.next;
        if left == 0 || (self.drop_remainder && left < self.batch_size) {
            return None;
        }
        let take = left.min(self.batch_size);
        let idx = &self.order[self.next..self.next + take];
        self.next += take;
        // The shapes agree by construction, so this cannot fail.
        Batch::new(self.data.select(idx)).ok()
    }
}
