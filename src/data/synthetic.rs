//! Seeded synthetic data: Gaussian blobs, one per class, clicks (ids and dense features with a
//! 0/1 label, for embedding models), and a teacher's regression targets.
//!
//! Class `k`'s center is drawn uniformly from `[-center_box, center_box]^d`; its examples are
//! the center plus isotropic Gaussian noise of standard deviation `std`. With the defaults
//! (centers in `[-10, 10]`, `std` 1) the classes are far apart relative to their spread, so a
//! softmax regression or a small MLP trains to high accuracy. The same options and seed give
//! the same data on every task, which is how workers agree on a data set without sharing it.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use super::Dataset;
use crate::error::{Result, Status};

/// What [`blobs`] generates.
#[derive(Clone, Debug, PartialEq)]
pub struct BlobOptions {
    /// The number of examples.
    pub num_examples: usize,
    /// The number of classes (labels `0..num_classes`).
    pub num_classes: usize,
    /// The number of features.
    pub num_features: usize,
    /// The half-width of the box the centers are drawn from.
    pub center_box: f32,
    /// The noise's standard deviation.
    pub std: f32,
    /// The seed.
    pub seed: u64,
}

impl BlobOptions {
    /// `num_examples` examples of `num_features` features in `num_classes` classes, centers
    /// in `[-10, 10]`, noise 1, seed 0.
    pub fn new(num_examples: usize, num_classes: usize, num_features: usize) -> Self {
        Self {
            num_examples,
            num_classes,
            num_features,
            center_box: 10.0,
            std: 1.0,
            seed: 0,
        }
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the noise's standard deviation.
    pub fn std(mut self, std: f32) -> Self {
        self.std = std;
        self
    }
}

/// Generates Gaussian blobs; example `i` belongs to class `i % num_classes`, so every class
/// is equally represented.
pub fn blobs(options: &BlobOptions) -> Result<Dataset> {
    let BlobOptions {
        num_examples,
        num_classes,
        num_features,
        center_box,
        std,
        seed,
    } = *options;
    if num_classes == 0 || num_features == 0 {
        return Err(Status::invalid_argument(format!(
            "blobs need at least one class and one feature, got {num_classes} classes of \
             {num_features} features"
        )));
    }
    if !(center_box.is_finite() && center_box >= 0.0) {
        return Err(Status::invalid_argument(format!(
            "blob center box {center_box} must be a finite number >= 0"
        )));
    }
    let noise = Normal::new(0.0f32, std).map_err(|e| {
        Status::invalid_argument(format!("blob noise std {std} is not usable: {e}"))
    })?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let centers: Vec<f32> = (0..num_classes * num_features)
        .map(|_| rng.random_range(-center_box..=center_box))
        .collect();
    let mut features = Vec::with_capacity(num_examples * num_features);
    let mut labels = Vec::with_capacity(num_examples);
    for i in 0..num_examples {
        let k = i % num_classes;
        let center = &centers[k * num_features..(k + 1) * num_features];
        features.extend(center.iter().map(|&c| c + noise.sample(&mut rng)));
        labels.push(k as i64);
    }
    Dataset::new(features, labels, num_features)
}
/// What [`teacher`] generates: examples of `inputs` standard normal features whose
/// `outputs` targets are a fixed rank-`rank` linear map of them plus a little noise.
#[derive(Clone, Debug, PartialEq)]
pub struct TeacherOptions {
    /// The number of examples.
    pub num_examples: usize,
    /// Features per example.
    pub inputs: usize,
    /// Targets per example.
    pub outputs: usize,
    /// The rank of the teacher's map.
    pub rank: usize,
    /// The targets' noise (standard deviation).
    pub noise: f32,
    /// The seed.
    pub seed: u64,
}

impl TeacherOptions {
    /// 2048 examples of 1024 features and 4096 targets from a rank-8 teacher, noise 0.01,
    /// seed 0.
    pub fn new() -> Self {
        Self {
            num_examples: 2048,
            inputs: 1024,
            outputs: 4096,
            rank: 8,
            noise: 0.01,
            seed: 0,
        }
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

impl Default for TeacherOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// Generates regression data: `x` standard normal, `y = x · U · V + noise` with `U`
/// (`inputs × rank`) and `V` (`rank × outputs`) drawn once from the seed, scaled so that each
/// target has variance about 1. The map has rank `rank`, so its cost is linear in the sizes.
pub fn teacher(options: &TeacherOptions) -> Result<Dataset> {
    let TeacherOptions {
        num_examples,
        inputs,
        outputs,
        rank,
        noise,
        seed,
    } = *options;
    if inputs == 0 || outputs == 0 || rank == 0 {
        return Err(Status::invalid_argument(format!(
            "a teacher needs at least one input, output and rank, got {inputs} inputs, \
             {outputs} outputs, rank {rank}"
        )));
    }
    let normal = Normal::new(0.0f32, 1.0).expect("a unit normal");
    let noise = Normal::new(0.0f32, noise).map_err(|e| {
        Status::invalid_argument(format!("teacher noise {noise} is not usable: {e}"))
    })?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // x·U has variance inputs·σ_U² per entry and (x·U)·V rank·inputs·σ_U²·σ_V²: 1 with
    // σ_U² = 1/inputs, σ_V² = 1/rank.
    let (su, sv) = ((inputs as f32).sqrt().recip(), (rank as f32).sqrt().recip());
    let u: Vec<f32> = (0..inputs * rank)
        .map(|_| su * normal.sample(&mut rng))
        .collect();
    let v: Vec<f32> = (0..rank * outputs)
        .map(|_| sv * normal.sample(&mut rng))
        .collect();
    let mut features = Vec::with_capacity(num_examples * inputs);
    let mut targets = Vec::with_capacity(num_examples * outputs);
    let mut hidden = vec![0f32; rank];
    for _ in 0..num_examples {
        let x: Vec<f32> = (0..inputs).map(|_| normal.sample(&mut rng)).collect();
        hidden.fill(0.0);
        for (i, &xi) in x.iter().enumerate() {
            for (r, h) in hidden.iter_mut().enumerate() {
                *h += xi * u[i * rank + r];
            }
        }
        for o in 0..outputs {
            let y: f32 = (0..rank).map(|r| hidden[r] * v[r * outputs + o]).sum();
            targets.push(y + noise.sample(&mut rng));
        }
        features.extend(x);
    }
    Dataset::with_targets(features, inputs, targets, outputs)
}

/// What [`clicks`] generates: a click log's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ClickOptions {
    /// The number of examples.
    pub num_examples: usize,
    /// Id columns per example (a user, an item, a context...).
    pub id_columns: usize,
    /// Distinct ids per column.
    pub vocabulary: u64,
    /// Dense features per example.
    pub dense: usize,
    /// The seed.
    pub seed: u64,
}

impl ClickOptions {
    /// 20,000 examples of 4 id columns (100,000 ids each) and 4 dense features, seed 0.
    pub fn new() -> Self {
        Self {
            num_examples: 20_000,
            id_columns: 4,
            vocabulary: 100_000,
            dense: 4,
            seed: 0,
        }
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

impl Default for ClickOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// A seeded, well-mixed 64-bit hash (SplitMix64's finaliser).
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A synthetic click log: each example has `id_columns` ids, drawn so that few ids are
/// frequent and most are rare (id `⌊vocabulary · u³⌋`, `u` uniform), and `dense` standard
/// normal features; its label is 1 with probability `σ(Σ_c e_c(id_c) + v·x − 1)`, where each
/// id's effect `e_c(id)` is a fixed pseudo-random number in `[-1.5, 1.5]` (a hash of the
/// seed, the column and the id) and `v` alternates `±0.5`. A model that learns the frequent
/// ids' effects and the dense weights predicts the label better than its mean; ids seen once
/// teach it little, as in real logs.
pub fn clicks(options: &ClickOptions) -> Result<Dataset> {
    let ClickOptions {
        num_examples,
        id_columns,
        vocabulary,
        dense,
        seed,
    } = *options;
    if id_columns == 0 || vocabulary == 0 {
        return Err(Status::invalid_argument(format!(
            "clicks need at least one id column of at least one id, got {id_columns} columns \
             of {vocabulary} ids"
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, 1.0).map_err(|e| Status::internal(e.to_string()))?;
    let effect = |column: usize, id: i64| {
        let h = mix64(seed ^ mix64((column as u64) << 40 ^ id as u64));
        (h >> 11) as f64 / (1u64 << 53) as f64 * 3.0 - 1.5
    };
    let mut features = Vec::with_capacity(num_examples * dense);
    let mut ids = Vec::with_capacity(num_examples * id_columns);
    let mut labels = Vec::with_capacity(num_examples);
    for _ in 0..num_examples {
        let mut logit = -1.0;
        for column in 0..id_columns {
            let u: f64 = rng.random();
            let id = ((vocabulary as f64 * u * u * u) as u64).min(vocabulary - 1) as i64;
            logit += effect(column, id);
            ids.push(id);
        }
        for j in 0..dense {
            let x = normal.sample(&mut rng);
            logit += if j % 2 == 0 { 0.5 } else { -0.5 } * f64::from(x);
            features.push(x);
        }
        let p = 1.0 / (1.0 + (-logit).exp());
        labels.push(i64::from(rng.random::<f64>() < p));
    }
    Dataset::with_ids(features, dense, ids, id_columns, labels)
}
