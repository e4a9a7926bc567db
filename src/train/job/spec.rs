//! What a training job is asked to do: the [`TrainSpec`] every task of a job is started with
//! (the model, the optimizer, the data, the schedule, synchronous or not, checkpoints,
//! summaries), and the checks that refuse bad input before any task starts training.
//!
//! Every task of a job gets the same spec (the same flags), so every worker builds the same
//! graph and reads the same data set, of which it trains on its own shard.

use std::path::{Path, PathBuf};

use crate::data::csv::{read_csv, CsvOptions, LabelColumn};
use crate::data::idx::{read_idx_dims, read_mnist};
use crate::data::tfrecord::{read_tfrecord, TfRecordOptions};
use crate::data::{blobs, clicks, teacher, BlobOptions, ClickOptions, Dataset, TeacherOptions};
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::train::checkpoint::saver::{ensure_dir_writable, ensure_writable};
use crate::train::optimizer::Optimizer;

use super::cnn::DEFAULT_FILTERS;
use super::embedding::{bucket, DEFAULT_DIM, DEFAULT_ROWS};

/// The built-in models, by the names `--model` accepts.
pub const MODEL_NAMES: [&str; 5] = ["softmax", "mlp", "cnn", "embedding", "regression"];

/// The optimizers `--optimizer` accepts (aliases such as `sgd` work too).
pub const OPTIMIZER_NAMES: [&str; 5] = ["gd", "momentum", "adagrad", "adam", "rmsprop"];

/// A built-in model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Softmax regression: one dense layer from the features to the classes.
    Softmax,
    /// A perceptron with ReLU hidden layers of these widths.
    Mlp {
        /// Hidden layer widths, input side first; at least one.
        hidden: Vec<usize>,
    },
    /// A convolutional network on square grayscale images ([`super::cnn`]): 3×3 convolutions
    /// with ReLU and 2×2 max pooling, then a dense layer to the classes.
    Cnn {
        /// Filters per convolution, input side first; at least one.
        filters: Vec<usize>,
    },
    /// A wide-and-deep model ([`super::embedding`]): the examples' ids hashed into two tables
    /// partitioned over every ps task, an embedding of `dim` per id into dense layers, and a
    /// weight per id and class added to their logits.
    Embedding {
        /// Rows of each table (ids are hashed into them).
        rows: usize,
        /// The embedding's width.
        dim: usize,
        /// Hidden dense widths of the deep part, input side first.
        hidden: Vec<usize>,
    },
    /// Linear regression: `x · W + b` against real-valued targets, squared error (the data's
    /// features and targets set the sizes; `--data teacher` by default).
    Regression,
}

impl ModelKind {
    /// The model called `name` (one of [`MODEL_NAMES`], `softmax_regression` too) with these
    /// hidden widths (used by `mlp` only; `cnn` gets [`DEFAULT_FILTERS`], see
    /// [`ModelKind::with_filters`]); an unknown name lists the known ones.
    pub fn from_name(name: &str, hidden: &[usize]) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "softmax" | "softmax_regression" | "linear" => Ok(Self::Softmax),
            "mlp" => {
                if hidden.is_empty() || hidden.contains(&0) {
                    return Err(Status::invalid_argument(format!(
                        "--hidden {hidden:?}: an mlp needs at least one hidden layer, each of \
                         at least one unit (e.g. --hidden 64,32)"
                    )));
                }
                Ok(Self::Mlp {
                    hidden: hidden.to_vec(),
                })
            }
            "cnn" => Ok(Self::Cnn {
                filters: DEFAULT_FILTERS.to_vec(),
            }),
            "embedding" | "wide_and_deep" => Ok(Self::Embedding {
                rows: DEFAULT_ROWS,
                dim: DEFAULT_DIM,
                hidden: hidden.to_vec(),
            }),
            "regression" | "linear_regression" => Ok(Self::Regression),
            _ => Err(Status::invalid_argument(format!(
                "unknown model `{name}`; choose one of {} (--model)",
                MODEL_NAMES.join(", ")
            ))),
        }
    }

    /// The model in words: `softmax regression`, `an MLP (128)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Softmax => "softmax regression".into(),
            Self::Regression => "linear regression".into(),
            Self::Mlp { hidden } => {
                let widths: Vec<String> = hidden.iter().map(usize::to_string).collect();
                format!("an MLP ({})", widths.join(", "))
            }
            Self::Cnn { filters } => {
                let filters: Vec<String> = filters.iter().map(usize::to_string).collect();
                format!("a CNN (conv {})", filters.join(", "))
            }
            Self::Embedding { rows, dim, hidden } => {
                let widths: Vec<String> = hidden.iter().map(usize::to_string).collect();
                format!(
                    "a wide-and-deep model ({rows} x {dim} embedding table, dense ({}))",
                    widths.join(", ")
                )
            }
        }
    }

    /// Applies `--table_rows` and `--embedding_dim`, which only `embedding` takes; `None`
    /// keeps the model's own.
    pub fn with_table(self, rows: Option<usize>, dim: Option<usize>) -> Result<Self> {
        match self {
            Self::Embedding {
                rows: r,
                dim: d,
                hidden,
            } => {
                let (rows, dim) = (rows.unwrap_or(r), dim.unwrap_or(d));
                if rows == 0 || dim == 0 {
                    return Err(Status::invalid_argument(format!(
                        "--table_rows {rows} --embedding_dim {dim}: the table needs at least \
                         one row of at least one value"
                    )));
                }
                Ok(Self::Embedding { rows, dim, hidden })
            }
            other if rows.is_none() && dim.is_none() => Ok(other),
            _ => Err(Status::invalid_argument(
                "--table_rows and --embedding_dim apply to --model embedding only; remove \
                 them or train the embedding model",
            )),
        }
    }

    /// Applies `--filters` (the convolutions' filter counts), which only `cnn` takes; empty
    /// keeps the model as it is.
    pub fn with_filters(self, filters: &[usize]) -> Result<Self> {
        if filters.is_empty() {
            return Ok(self);
        }
        match self {
            Self::Cnn { .. } => {
                if filters.contains(&0) {
                    return Err(Status::invalid_argument(format!(
                        "--filters {filters:?}: every convolution needs at least one filter \
                         (e.g. --filters 16,32)"
                    )));
                }
                Ok(Self::Cnn {
                    filters: filters.to_vec(),
                })
            }
            _ => Err(Status::invalid_argument(
                "--filters applies to --model cnn only; remove it or train the cnn",
            )),
        }
    }

    /// The hidden dense widths (empty for softmax regression and the cnn).
    pub fn hidden(&self) -> &[usize] {
        match self {
            Self::Softmax | Self::Cnn { .. } | Self::Regression => &[],
            Self::Mlp { hidden } | Self::Embedding { hidden, .. } => hidden,
        }
    }
}

/// Where the examples come from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    /// The built-in handwritten digits (1797 8×8 images, 10 classes; [`crate::data::digits`]).
    Digits,
    /// The built-in seeded data set: Gaussian blobs (examples, classes, features, noise).
    Synthetic {
        examples: usize,
        classes: usize,
        features: usize,
        std: f32,
    },
    /// A CSV file of numeric features and an integer label (the last column unless the
    /// options say otherwise), with or without a header line.
    Csv { path: PathBuf, options: CsvOptions },
    /// MNIST's IDX files: images, labels.
    Idx { images: PathBuf, labels: PathBuf },
    /// A TFRecord file of `tf.train.Example`s ([`crate::data::tfrecord`]).
    TfRecord {
        path: PathBuf,
        options: TfRecordOptions,
    },
    /// The built-in seeded click log ([`crate::data::clicks`]): ids and dense features with
    /// a 0/1 label, for the embedding model.
    Clicks(ClickOptions),
    /// The built-in seeded regression data ([`crate::data::teacher`]): targets from a fixed
    /// low-rank linear map of the features, for the regression model.
    Teacher(TeacherOptions),
}

impl DataSource {
    /// The synthetic data set (`--data synthetic`): 4000 examples of 32 features in 10
    /// overlapping classes (centers about 46 apart, noise 10 per feature: the nearest center is
    /// right about 9 times in 10).
    pub fn synthetic() -> Self {
        Self::Synthetic {
            examples: 4000,
            classes: 10,
            features: 32,
            std: 10.0,
        }
    }

    /// Parses `--data`: `digits`, `synthetic`, `csv:PATH` or `idx:IMAGES,LABELS`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "digits" => return Ok(Self::Digits),
            "synthetic" => return Ok(Self::synthetic()),
            "clicks" => return Ok(Self::Clicks(ClickOptions::new())),
            "teacher" => return Ok(Self::Teacher(TeacherOptions::new())),
            _ => {}
        }
        if let Some(path) = text.strip_prefix("csv:") {
            if path.is_empty() {
                return Err(Status::invalid_argument(
                    "--data csv: needs a file, as csv:PATH",
                ));
            }
            return Ok(Self::Csv {
                path: PathBuf::from(path),
                options: CsvOptions::default(),
            });
        }
        if let Some(path) = text.strip_prefix("tfrecord:") {
            if path.is_empty() {
                return Err(Status::invalid_argument(
                    "--data tfrecord: needs a file, as tfrecord:PATH",
                ));
            }
            return Ok(Self::TfRecord {
                path: PathBuf::from(path),
                options: TfRecordOptions::default(),
            });
        }
        if let Some(rest) = text.strip_prefix("idx:") {
            if let Some((images, labels)) = rest.split_once(',') {
                if !images.is_empty() && !labels.is_empty() {
                    return Ok(Self::Idx {
                        images: PathBuf::from(images),
                        labels: PathBuf::from(labels),
                    });
                }
            }
            return Err(Status::invalid_argument(format!(
                "--data {text}: write idx:IMAGES,LABELS (two IDX files, e.g. MNIST's \
                 train-images-idx3-ubyte,train-labels-idx1-ubyte)"
            )));
        }
        Err(Status::invalid_argument(format!(
            "--data {text}: unknown data source; use digits, synthetic, clicks, teacher, \
             csv:PATH, tfrecord:PATH or idx:IMAGES,LABELS"
        )))
    }

    /// The files it reads (`csv:PATH`, `tfrecord:PATH`, both of `idx:IMAGES,LABELS`); none
    /// for the built-in data sets.
    pub fn files(&self) -> Vec<&Path> {
        match self {
            Self::Csv { path, .. } | Self::TfRecord { path, .. } => vec![path.as_path()],
            Self::Idx { images, labels } => vec![images.as_path(), labels.as_path()],
            Self::Digits | Self::Synthetic { .. } | Self::Clicks(_) | Self::Teacher(_) => {
                Vec::new()
            }
        }
    }

    /// The data in words, for the job's first line.
    pub fn describe(&self) -> String {
        match self {
            Self::Digits => "the handwritten digits (1797 8x8 images, built in)".into(),
            Self::Synthetic {
                examples, classes, ..
            } => format!("{examples} synthetic examples of {classes} Gaussian blobs"),
            Self::Csv { path, .. } => format!("the CSV file {}", path.display()),
            Self::Idx { images, .. } => format!("the IDX images {}", images.display()),
            Self::TfRecord { path, .. } => format!("the TFRecord file {}", path.display()),
            Self::Clicks(options) => format!(
                "{} synthetic clicks ({} id columns of {} ids, {} dense features)",
                options.num_examples, options.id_columns, options.vocabulary, options.dense
            ),
            Self::Teacher(options) => format!(
                "{} examples of {} features with {} targets from a rank-{} teacher",
                options.num_examples, options.inputs, options.outputs, options.rank
            ),
        }
    }

    /// Applies `--inputs`, `--outputs` and `--teacher_rank`, which only the teacher's data
    /// takes; `None` keeps its own.
    pub fn with_teacher_sizes(
        self,
        inputs: Option<usize>,
        outputs: Option<usize>,
        rank: Option<usize>,
    ) -> Result<Self> {
        match self {
            Self::Teacher(mut options) => {
                options.inputs = inputs.unwrap_or(options.inputs);
                options.outputs = outputs.unwrap_or(options.outputs);
                options.rank = rank.unwrap_or(options.rank);
                if options.inputs == 0 || options.outputs == 0 || options.rank == 0 {
                    return Err(Status::invalid_argument(format!(
                        "--inputs {} --outputs {} --teacher_rank {}: each must be at least 1",
                        options.inputs, options.outputs, options.rank
                    )));
                }
                Ok(Self::Teacher(options))
            }
            other if inputs.is_none() && outputs.is_none() && rank.is_none() => Ok(other),
            _ => Err(Status::invalid_argument(
                "--inputs, --outputs and --teacher_rank apply to --data teacher only; remove \
                 them or train on the teacher's data",
            )),
        }
    }

    /// Applies `--feature_keys` and `--label_key`, which only a TFRecord source takes.
    pub fn with_tfrecord_options(
        self,
        feature_keys: &[String],
        label_key: Option<&str>,
    ) -> Result<Self> {
        match self {
            Self::TfRecord { path, mut options } => {
                if let Some(bad) = feature_keys.iter().find(|k| k.trim().is_empty()) {
                    return Err(Status::invalid_argument(format!(
                        "--feature_keys {feature_keys:?} has an empty key `{bad}`; list the \
                         Example's keys, comma-separated"
                    )));
                }
                options.feature_keys = feature_keys.to_vec();
                if let Some(label) = label_key {
                    options.label_key = label.to_string();
                }
                Ok(Self::TfRecord { path, options })
            }
            other if feature_keys.is_empty() && label_key.is_none() => Ok(other),
            _ => Err(Status::invalid_argument(
                "--feature_keys and --label_key apply to --data tfrecord:PATH only; remove \
                 them or read a TFRecord file",
            )),
        }
    }

    /// Applies `--label_column`, `--csv_header` and `--id_columns`, which only a CSV source
    /// takes.
    pub fn with_csv_options(
        self,
        label_column: Option<&str>,
        header: bool,
        id_columns: &[String],
    ) -> Result<Self> {
        match self {
            Self::Csv { path, mut options } => {
                if let Some(label) = label_column {
                    options.label_column = Some(LabelColumn::parse(label)?);
                }
                if header {
                    options.header = Some(true);
                }
                options.id_columns = id_columns
                    .iter()
                    .map(|c| LabelColumn::parse_for(c, "--id_columns"))
                    .collect::<Result<_>>()?;
                Ok(Self::Csv { path, options })
            }
            other if label_column.is_none() && !header && id_columns.is_empty() => Ok(other),
            _ => Err(Status::invalid_argument(
                "--label_column, --csv_header and --id_columns apply to --data csv:PATH only; \
                 remove them or read a CSV file",
            )),
        }
    }

    /// Reads (or generates, with `seed`) every example.
    pub fn load(&self, seed: u64) -> Result<Dataset> {
        match self {
            Self::Digits => crate::data::digits::digits(),
            Self::Synthetic {
                examples,
                classes,
                features,
                std,
            } => blobs(
                &BlobOptions::new(*examples, *classes, *features)
                    .seed(seed)
                    .std(*std),
            ),
            Self::Csv { path, options } => read_csv(path, options),
            Self::Idx { images, labels } => read_mnist(images, labels),
            Self::TfRecord { path, options } => read_tfrecord(path, options),
            Self::Clicks(options) => clicks(&options.clone().seed(seed)),
            Self::Teacher(options) => teacher(&options.clone().seed(seed)),
        }
    }
}

/// Synchronous replication: gradients of `replicas_to_aggregate` workers averaged per update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncSpec {
    /// Gradients per update.
    pub replicas_to_aggregate: usize,
    /// Workers training (more than `replicas_to_aggregate`: backups).
    pub total_num_replicas: usize,
}

/// Everything a task needs to know about the job.
#[derive(Clone, Debug)]
pub struct TrainSpec {
    /// The model.
    pub model: ModelKind,
    /// The optimizer's name (one of [`OPTIMIZER_NAMES`]).
    pub optimizer: String,
    /// The learning rate.
    pub learning_rate: f64,
    /// Examples per step and worker.
    pub batch_size: usize,
    /// In-graph towers per worker: each step's batch is split over this many devices of the
    /// worker and their gradients averaged (1: no towers).
    pub towers: usize,
    /// The kind of device the towers run on: the worker's `CPU:0..N-1` or `GPU:0..N-1`.
    pub tower_device: DeviceType,
    /// Sum the towers' gradients among the tower devices with `NcclAllReduce` (NCCL between
    /// GPUs) instead of `AddN` on the worker's CPU:0.
    pub all_reduce: bool,
    /// Training ends when the global step reaches this.
    pub steps: i64,
    /// Synchronous replication, or `None` for asynchronous.
    pub sync: Option<SyncSpec>,
    /// Where the chief saves checkpoints and restores from (`None`: no checkpoints).
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every this many global steps (and at the end).
    pub save_every_steps: u64,
    /// Where the chief writes its TensorBoard event files (`None`: no summaries).
    pub logdir: Option<PathBuf>,
    /// The chief writes its summaries (loss, steps per second, the variables' histograms)
    /// every this many global steps.
    pub summary_every_steps: u64,
    /// The chief traces its first step at or after this global step (every task of the step,
    /// `FULL_TRACE`) and writes it as a Chrome trace file beside its event files.
    pub trace_step: Option<i64>,
    /// The examples.
    pub data: DataSource,
    /// Seeds the data, the initial weights and the batch order.
    pub seed: u64,
    /// The fraction of examples held out for the final accuracy.
    pub held_out_fraction: f64,
    /// How long a non-chief worker waits for the chief to initialise the model.
    pub wait_for_model: std::time::Duration,
}

impl Default for TrainSpec {
    /// The main job's defaults: an MLP (128) trained by Adam, 0.01, batches of 64, 1000
    /// steps, asynchronously, on the built-in handwritten digits, a fifth held out.
    fn default() -> Self {
        Self {
            model: ModelKind::Mlp { hidden: vec![128] },
            optimizer: "adam".into(),
            learning_rate: 0.01,
            batch_size: 64,
            towers: 1,
            tower_device: DeviceType::Cpu,
            all_reduce: false,
            steps: 1000,
            sync: None,
            checkpoint_dir: None,
            save_every_steps: 100,
            logdir: None,
            summary_every_steps: 10,
            trace_step: None,
            data: DataSource::Digits,
            seed: 1,
            held_out_fraction: 0.2,
            wait_for_model: crate::cluster::Timeouts::default().startup,
        }
    }
}

impl TrainSpec {
    /// Checks what can be checked without the data or the cluster: the optimizer's name, the
    /// numbers (the batch must divide over the towers), and that synchronous training fits
    /// the workers (`num_workers`).
    pub fn validate(&self, num_workers: usize) -> Result<()> {
        self.optimizer()?;
        if self.batch_size == 0 {
            return Err(Status::invalid_argument(
                "--batch_size 0: a step needs at least one example",
            ));
        }
        if self.towers == 0 {
            return Err(Status::invalid_argument(
                "--towers 0: a worker needs at least one tower (1 trains without towers)",
            ));
        }
        if self.batch_size % self.towers != 0 {
            return Err(Status::invalid_argument(format!(
                "--batch_size {} does not divide over --towers {}: each tower takes an equal \
                 part of the batch; pass a batch size that is a multiple of {}",
                self.batch_size, self.towers, self.towers
            )));
        }
        if self.all_reduce && self.towers < 2 {
            return Err(Status::invalid_argument(format!(
                "--all_reduce with --towers {}: it sums gradients among towers; pass --towers 2 \
                 or more",
                self.towers
            )));
        }
        if self.steps < 1 {
            return Err(Status::invalid_argument(format!(
                "--steps {}: train for at least one step",
                self.steps
            )));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return Err(Status::invalid_argument(format!(
                "--learning_rate {}: must be a positive number",
                self.learning_rate
            )));
        }
        if !(0.0 < self.held_out_fraction && self.held_out_fraction < 1.0) {
            return Err(Status::invalid_argument(format!(
                "--held_out {}: the held-out fraction must be in (0, 1)",
                self.held_out_fraction
            )));
        }
        if let Some(step) = self.trace_step {
            if step < 0 {
                return Err(Status::invalid_argument(format!(
                    "--trace_step {step}: a global step is 0 or more"
                )));
            }
            if self.logdir.is_none() {
                return Err(Status::invalid_argument(
                    "--trace_step writes its trace beside the event files; give --logdir",
                ));
            }
        }
        if self.summary_every_steps == 0 {
            return Err(Status::invalid_argument(
                "--summary_every 0: summaries need a period of at least one step",
            ));
        }
        if let Some(sync) = &self.sync {
            if sync.replicas_to_aggregate == 0 || sync.replicas_to_aggregate > num_workers {
                return Err(Status::invalid_argument(format!(
                    "--replicas_to_aggregate {}: must be between 1 and the {num_workers} \
                     workers of the cluster",
                    sync.replicas_to_aggregate
                )));
            }
        }
        Ok(())
    }

    /// The optimizer, or INVALID_ARGUMENT listing the known ones.
    pub fn optimizer(&self) -> Result<Optimizer> {
        let name = match self.optimizer.to_ascii_lowercase().as_str() {
            "gd" => "sgd".to_string(),
            other => other.to_string(),
        };
        Optimizer::from_name(&name, self.learning_rate).map_err(|_| {
            Status::invalid_argument(format!(
                "unknown optimizer `{}`; choose one of {} (--optimizer)",
                self.optimizer,
                OPTIMIZER_NAMES.join(", ")
            ))
        })
    }

    /// The chief's check before training: the checkpoint directory exists (or can be
    /// created) and takes new files. Nothing already in it is touched.
    pub fn check_checkpoint_dir(&self) -> Result<()> {
        match &self.checkpoint_dir {
            Some(dir) => ensure_writable(dir),
            None => Ok(()),
        }
    }

    /// The chief's check before training: the log directory exists (or can be created) and
    /// takes new files. Nothing already in it is touched.
    pub fn check_logdir(&self) -> Result<()> {
        match &self.logdir {
            Some(dir) => ensure_dir_writable(dir, "log directory", "--logdir"),
            None => Ok(()),
        }
    }

    /// The cnn on IDX images: refuses images that are not square (`[n, 16, 4]` flattens to
    /// 64 features, which the cnn alone would take for 8x8).
    fn check_image_dims(&self) -> Result<()> {
        let (ModelKind::Cnn { .. }, DataSource::Idx { images, .. }) = (&self.model, &self.data)
        else {
            return Ok(());
        };
        match read_idx_dims(images)?[..] {
            [_, rows, cols] if rows != cols => Err(Status::invalid_argument(format!(
                "{}: its images are {rows}x{cols} pixels; --model cnn needs square images \
                 (e.g. MNIST's 28x28), so pad or crop them, or use --model mlp",
                images.display()
            ))),
            _ => Ok(()),
        }
    }

    /// Loads the data and splits it: `(training set, held-out set)`, the same split on every
    /// task. Refuses a data set too small to hold out anything or to fill a batch.
    pub fn load_data(&self) -> Result<(Dataset, Dataset)> {
        self.check_image_dims()?;
        let data = self.data.load(self.seed)?;
        let data = match (&self.model, data.num_ids()) {
            (ModelKind::Embedding { .. }, 0) => {
                return Err(Status::invalid_argument(format!(
                    "--model embedding looks up ids, but {} has no id columns; use --data \
                     clicks, or --data csv:PATH with --id_columns naming its id columns",
                    self.data.describe()
                )))
            }
            (ModelKind::Embedding { rows, .. }, _) => {
                let rows = *rows;
                data.map_ids(move |column, id| bucket(column, id, rows))
            }
            (_, 0) => data,
            (model, _) => {
                return Err(Status::invalid_argument(format!(
                    "{} has id columns, which only --model embedding looks up (not {}); use \
                     it, or drop --id_columns",
                    self.data.describe(),
                    model.describe()
                )))
            }
        };
        match (&self.model, data.num_targets()) {
            (ModelKind::Regression, 0) => {
                return Err(Status::invalid_argument(format!(
                    "--model regression fits real-valued targets, but {} has class labels; use \
                     --data teacher",
                    self.data.describe()
                )))
            }
            (ModelKind::Regression, _) | (_, 0) => {}
            (model, _) => {
                return Err(Status::invalid_argument(format!(
                    "{} has real-valued targets, which only --model regression fits (not {}); \
                     use it",
                    self.data.describe(),
                    model.describe()
                )))
            }
        }
        let (train, held_out) = data.split(self.held_out_fraction, self.seed)?;
        if train.is_empty() || held_out.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{} examples are too few to hold out {} of them and train on the rest; \
                 use more data or change --held_out",
                data.len(),
                self.held_out_fraction
            )));
        }
        Ok((train, held_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = ModelKind::from_name("resnet", &[]).unwrap_err();
        assert!(err.message().contains("softmax, mlp, cnn"), "{err}");
        let spec = TrainSpec {
            optimizer: "lbfgs".into(),
            ..TrainSpec::default()
        };
        let err = spec.validate(2).unwrap_err();
        assert!(
            err.message()
                .contains("gd, momentum, adagrad, adam, rmsprop"),
            "{err}"
        );
    }

    #[test]
    fn data_sources_parse() {
        assert_eq!(
            DataSource::parse("csv:/tmp/a.csv").unwrap(),
            DataSource::Csv {
                path: "/tmp/a.csv".into(),
                options: CsvOptions::default()
            }
        );
        assert_eq!(
            DataSource::parse("csv:a.csv")
                .unwrap()
                .with_csv_options(Some("species"), true, &[])
                .unwrap(),
            DataSource::Csv {
                path: "a.csv".into(),
                options: CsvOptions {
                    label_column: Some(LabelColumn::Name("species".into())),
                    header: Some(true),
                    id_columns: Vec::new(),
                }
            }
        );
        assert_eq!(
            DataSource::parse("csv:a.csv")
                .unwrap()
                .with_csv_options(Some("0"), false, &[])
                .unwrap(),
            DataSource::Csv {
                path: "a.csv".into(),
                options: CsvOptions {
                    label_column: Some(LabelColumn::Index(0)),
                    header: None,
                    id_columns: Vec::new(),
                }
            }
        );
        let err = DataSource::synthetic()
            .with_csv_options(Some("0"), false, &[])
            .unwrap_err();
        assert!(err.message().contains("csv:PATH only"), "{err}");
        assert_eq!(
            DataSource::parse("idx:a,b").unwrap(),
            DataSource::Idx {
                images: "a".into(),
                labels: "b".into()
            }
        );
        assert!(DataSource::parse("idx:a").is_err());
        assert!(DataSource::parse("parquet:x").is_err());
    }

    #[test]
    fn the_cnn_refuses_idx_images_that_are_not_square() {
        use crate::data::idx::{write_idx, IdxArray};
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, dims: Vec<usize>| {
            let path = dir.path().join(name);
            let data = vec![1u8; dims.iter().product()];
            write_idx(&path, &IdxArray { dims, data }).unwrap();
            path
        };
        let labels = write("labels", vec![10]);
        // 16x4: 64 features, a square count of pixels in an image that is not square.
        let spec = |images| TrainSpec {
            model: ModelKind::from_name("cnn", &[]).unwrap(),
            data: DataSource::Idx {
                images,
                labels: labels.clone(),
            },
            ..TrainSpec::default()
        };
        let err = spec(write("tall", vec![10, 16, 4]))
            .load_data()
            .unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("16x4 pixels"), "{err}");
        spec(write("square", vec![10, 8, 8])).load_data().unwrap();
        let mlp = TrainSpec {
            model: ModelKind::Mlp { hidden: vec![8] },
            ..spec(write("tall_mlp", vec![10, 16, 4]))
        };
        mlp.load_data().unwrap();
    }

    #[test]
    fn towers_must_be_positive_and_divide_the_batch() {
        let spec = |batch_size, towers| TrainSpec {
            batch_size,
            towers,
            ..TrainSpec::default()
        };
        let err = spec(64, 0).validate(2).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("--towers 0"), "{err}");
        // 64 = 3·21 + 1: not a multiple of 3.
        let err = spec(64, 3).validate(2).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(
            err.message().contains("--batch_size 64") && err.message().contains("--towers 3"),
            "{err}"
        );
        spec(64, 4).validate(2).unwrap();
        spec(64, 1).validate(2).unwrap();
        // Summing among towers needs at least two of them.
        let all_reduce = |towers| TrainSpec {
            all_reduce: true,
            ..spec(64, towers)
        };
        let err = all_reduce(1).validate(2).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(
            err.message().contains("--all_reduce with --towers 1"),
            "{err}"
        );
        all_reduce(2).validate(2).unwrap();
    }

    #[test]
    fn sync_takes_any_optimizer_but_needs_enough_workers() {
        let mut spec = TrainSpec {
            sync: Some(SyncSpec {
                replicas_to_aggregate: 2,
                total_num_replicas: 2,
            }),
            ..TrainSpec::default()
        };
        spec.validate(2).unwrap();
        spec.optimizer = "gd".into();
        spec.validate(2).unwrap();
        let err = spec.validate(1).unwrap_err();
        assert!(
            err.message().contains("--replicas_to_aggregate 2"),
            "2 replicas of 1 worker: {err}"
        );
    }
}
