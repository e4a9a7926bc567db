//! TensorBoard's event files, as TensorFlow 2.21's `EventsWriter` writes them: TFRecords of
//! serialized [`Event`]s in
//! `<logdir>/events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>.<n><suffix>`, where `n`
//! counts the writers this process opened, from 0, as its summary writers (the
//! `CreateSummaryFileWriter` op) name them; `tf.summary.create_file_writer` passes the suffix
//! `.v2`, tessera's trainer none. (`tf.compat.v1.summary.FileWriter` names its files
//! `...<host><suffix>`, without pid and count; TensorBoard reads either.) The first record is
//! `Event { wall_time: <those seconds>, file_version: "brain.Event:2" }`, then one event per
//! summary.
//!
//! The summaries themselves are built here too, byte for byte as TensorFlow's kernels build
//! them: scalars as `simple_value`, histograms as a [`HistogramProto`] over TensorFlow's
//! default buckets (`tensorflow/core/lib/histogram/histogram.cc`: limits growing by 10 % from
//! 1e-12 to 1e20, mirrored below zero, runs of empty buckets folded into one).

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use super::files::Files;
use super::tfrecord::{RecordReader, RecordWriter};
use crate::error::{Result, Status};
use crate::proto::event::What;
use crate::proto::summary::{value, Value};
use crate::proto::{Event, HistogramProto, Summary};

/// The `file_version` of an event file's first record.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The suffix TensorFlow 2's `tf.summary.create_file_writer` gives its files.
pub const V2_SUFFIX: &str = ".v2";

/// An event file's name, as TensorFlow 2.21 names them:
/// `events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<writer count><suffix>`.
pub fn event_file_name(
    unix_seconds: u64,
    hostname: &str,
    pid: u32,
    count: u64,
    suffix: &str,
) -> String {
    format!("events.out.tfevents.{unix_seconds:010}.{hostname}.{pid}.{count}{suffix}")
}

/// The event files this process opened so far (the name's counter, so that two writers of
/// one process in one second and directory never share a file).
static FILES_OPENED: AtomicU64 = AtomicU64::new(0);

/// This host's name, as `gethostname(2)` gives it (`localhost` when it cannot).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if !name.is_empty() => name.to_string(),
        _ => "localhost".to_string(),
    }
}

/// Seconds since the Unix epoch, with the fraction (an event's `wall_time`).
pub fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Writes one event file.
pub struct EventFileWriter {
    path: PathBuf,
    records: RecordWriter<BufWriter<File>>,
}

impl EventFileWriter {
    /// Creates `logdir` (and its parents) and a new event file in it named by
    /// [`event_file_name`] for now, this host and process, and writes the file-version event.
    pub fn create(logdir: &Path, suffix: &str) -> Result<Self> {
        Self::create_with(&Files::ambient(), logdir, suffix)
    }

    /// [`create`](Self::create) through `files`: a `logdir` outside them is refused before
    /// anything is created.
    pub fn create_with(files: &Files, logdir: &Path, suffix: &str) -> Result<Self> {
        let seconds = wall_time() as u64;
        let count = FILES_OPENED.fetch_add(1, Ordering::Relaxed);
        let name = event_file_name(seconds, &hostname(), std::process::id(), count, suffix);
        let path = logdir.join(name);
        let target = files.resolve(&path)?;
        files.resolve(logdir)?.create_dir_all().map_err(|e| {
            Status::permission_denied(format!(
                "cannot create the summary directory `{}`: {e}; choose a writable directory \
                 (--logdir)",
                logdir.display()
            ))
        })?;
        let file = target.create().map_err(|e| {
            Status::permission_denied(format!(
                "cannot create the event file `{}`: {e}; choose a writable directory (--logdir)",
                path.display()
            ))
        })?;
        let mut writer = Self {
            path,
            records: RecordWriter::new(BufWriter::new(file)),
        };
        writer.write_event(&Event {
            wall_time: seconds as f64,
            step: 0,
            what: Some(What::FileVersion(FILE_VERSION.to_string())),
        })?;
        writer.flush()?;
        Ok(writer)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `event` (buffered until [`flush`](Self::flush)).
    pub fn write_event(&mut self, event: &Event) -> Result<()> {
        let path = &self.path;
        self.records.write(&event.encode_to_vec()).map_err(|e| {
            Status::unknown(format!(
                "cannot write to the event file `{}`: {e}",
                path.display()
            ))
        })
    }

    /// Appends an event at `step`, now, holding `summary`.
    pub fn write_summary(&mut self, step: i64, summary: Summary) -> Result<()> {
        self.write_event(&Event {
            wall_time: wall_time(),
            step,
            what: Some(What::Summary(summary)),
        })
    }

    /// Appends the scalar `tag` = `value` at `step`.
    pub fn write_scalar(&mut self, step: i64, tag: &str, value: f32) -> Result<()> {
        self.write_summary(step, scalar_summary(tag, value))
    }

    /// Appends a histogram of `values` as `tag` at `step`; a NaN or infinite value is
    /// INVALID_ARGUMENT, as in TensorFlow.
    pub fn write_histogram(
        &mut self,
        step: i64,
        tag: &str,
        values: impl IntoIterator<Item = f64>,
    ) -> Result<()> {
        let summary = histogram_summary(tag, values)?;
        self.write_summary(step, summary)
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> Result<()> {
        let path = &self.path;
        self.records.flush().map_err(|e| {
            Status::unknown(format!(
                "cannot flush the event file `{}`: {e}",
                path.display()
            ))
        })
    }

    /// Flushes and closes the file.
    pub fn close(mut self) -> Result<()> {
        self.flush()?;
        let path = self.path.clone();
        let file = self.records.into_inner().into_inner().map_err(|e| {
            Status::unknown(format!(
                "cannot flush the event file `{}`: {e}",
                path.display()
            ))
        })?;
        file.sync_all().map_err(|e| {
            Status::unknown(format!(
                "cannot close the event file `{}`: {e}",
                path.display()
            ))
        })
    }
}

/// Reads every event of the file at `path` (its CRCs checked).
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let file = File::open(path).map_err(|e| {
        Status::not_found(format!(
            "cannot open the event file `{}`: {e}",
            path.display()
        ))
    })?;
    let name = path.display().to_string();
    RecordReader::new(BufReader::new(file), name.clone())
        .map(|record| {
            let bytes = record?;
            Event::decode(bytes.as_slice())
                .map_err(|e| Status::data_loss(format!("{name}: a record is not an Event: {e}")))
        })
        .collect()
}

/// A summary of one scalar: `Summary { value { tag, simple_value } }`.
pub fn scalar_summary(tag: &str, value: f32) -> Summary {
    Summary {
        value: vec![Value {
            tag: tag.to_string(),
            value: Some(value::Value::SimpleValue(value)),
            ..Value::default()
        }],
    }
}

/// A summary of one histogram of `values`, as TensorFlow's `WriteHistogramSummary` makes
/// it; a NaN or infinite value is INVALID_ARGUMENT ("Nan in summary histogram for: TAG").
pub fn histogram_summary(tag: &str, values: impl IntoIterator<Item = f64>) -> Result<Summary> {
    let histogram = Histogram::of(values)
        .ok_or_else(|| Status::invalid_argument(format!("Nan in summary histogram for: {tag}")))?;
    Ok(histogram.to_summary(tag))
}

/// TensorFlow's default bucket limits: `-DBL_MAX`, the negated limits, 0, then the limits
/// `1e-12 * 1.1^k` below 1e20, then `DBL_MAX` (1551 in all).
pub fn default_bucket_limits() -> &'static [f64] {
    static LIMITS: OnceLock<Vec<f64>> = OnceLock::new();
    LIMITS.get_or_init(|| {
        let mut positive = Vec::new();
        let mut v = 1.0e-12;
        while v < 1.0e20 {
            positive.push(v);
            v *= 1.1;
        }
        positive.push(f64::MAX);
        let mut limits: Vec<f64> = positive.iter().rev().map(|v| -v).collect();
        limits.push(0.0);
        limits.extend(&positive);
        limits
    })
}

/// A histogram over [`default_bucket_limits`]: bucket `i` counts the values `v` with
/// `limit[i-1] <= v < limit[i]` (TensorFlow's `upper_bound`).
#[derive(Clone, Debug)]
pub struct Histogram {
    min: f64,
    max: f64,
    num: f64,
    sum: f64,
    sum_squares: f64,
    buckets: Vec<f64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram (min `DBL_MAX`, max `-DBL_MAX`, as TensorFlow's `Clear`).
    pub fn new() -> Self {
        Self {
            min: f64::MAX,
            max: -f64::MAX,
            num: 0.0,
            sum: 0.0,
            sum_squares: 0.0,
            buckets: vec![0.0; default_bucket_limits().len()],
        }
    }

    /// The histogram of `values`, or `None` when one of them is NaN or infinite (TensorFlow
    /// refuses those).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut histogram = Self::new();
        for v in values {
            if !v.is_finite() {
                return None;
            }
            histogram.add(v);
        }
        Some(histogram)
    }

    /// `Summary { value { tag, histo } }` of this histogram.
    pub fn to_summary(&self, tag: &str) -> Summary {
        Summary {
            value: vec![Value {
                tag: tag.to_string(),
                value: Some(value::Value::Histo(self.to_proto())),
                ..Value::default()
            }],
        }
    }

    /// Counts `value`.
    pub fn add(&mut self, value: f64) {
        let limits = default_bucket_limits();
        let bucket = limits.partition_point(|&limit| limit <= value);
        // A value at or above DBL_MAX (only DBL_MAX itself: infinities are refused) goes to
        // the last bucket, where TensorFlow's index would run past the end.
        let bucket = bucket.min(self.buckets.len() - 1);
        self.buckets[bucket] += 1.0;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.num += 1.0;
        self.sum += value;
        self.sum_squares += value * value;
    }

    /// The histogram as TensorFlow's `EncodeToProto(proto, false)` writes it: each run of
    /// empty buckets folded into one (its limit the run's last), and one bucket (`DBL_MAX`,
    /// 0) when every bucket is empty.
    pub fn to_proto(&self) -> HistogramProto {
        let limits = default_bucket_limits();
        let mut proto = HistogramProto {
            min: self.min,
            max: self.max,
            num: self.num,
            sum: self.sum,
            sum_squares: self.sum_squares,
            ..HistogramProto::default()
        };
        let mut i = 0;
        while i < self.buckets.len() {
            let (mut end, mut count) = (limits[i], self.buckets[i]);
            i += 1;
            if count <= 0.0 {
                while i < self.buckets.len() && self.buckets[i] <= 0.0 {
                    end = limits[i];
                    count = self.buckets[i];
                    i += 1;
                }
            }
            proto.bucket_limit.push(end);
            proto.bucket.push(count);
        }
        if proto.bucket.is_empty() {
            proto.bucket_limit.push(f64::MAX);
            proto.bucket.push(0.0);
        }
        proto
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_name_follows_tensorflows_pattern() {
        assert_eq!(
            event_file_name(1_700_000_000, "h0", 21741, 0, ""),
            "events.out.tfevents.1700000000.h0.21741.0"
        );
        assert_eq!(
            event_file_name(42, "h0", 7, 2, V2_SUFFIX),
            "events.out.tfevents.0000000042.h0.7.2.v2"
        );
    }

    #[test]
    fn the_default_buckets_are_tensorflows() {
        let limits = default_bucket_limits();
        assert_eq!(limits.len(), 1551);
        assert_eq!(limits[0], -f64::MAX);
        assert_eq!(limits[774], -1e-12);
        assert_eq!(limits[775], 0.0);
        assert_eq!(limits[776], 1e-12);
        assert_eq!(limits[1550], f64::MAX);
        assert!(limits.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_histogram_folds_runs_of_empty_buckets() {
        let summary = histogram_summary("w", [1.0, 2.0, 3.0, -1.0, 0.0]).unwrap();
        let Some(value::Value::Histo(h)) = &summary.value[0].value else {
            panic!("not a histogram: {summary:?}");
        };
        assert_eq!(
            (h.min, h.max, h.num, h.sum, h.sum_squares),
            (-1.0, 3.0, 5.0, 5.0, 15.0)
        );
        // Every value lands in a bucket; the limits rise; counts alternate with empty runs.
        assert_eq!(h.bucket.iter().sum::<f64>(), 5.0);
        assert_eq!(h.bucket.len(), h.bucket_limit.len());
        assert!(h.bucket_limit.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*h.bucket_limit.last().unwrap(), f64::MAX);
        // 0 lands in [0, 1e-12): the bucket whose limit is 1e-12.
        let zero = h.bucket_limit.iter().position(|&l| l == 1e-12).unwrap();
        assert_eq!(h.bucket[zero], 1.0);
        let empty = Histogram::new().to_proto();
        assert_eq!(
            (empty.bucket_limit, empty.bucket),
            (vec![f64::MAX], vec![0.0])
        );
    }

    /// `tf.compat.v1.summary.histogram` and `scalar` in TensorFlow 2.21, serialized.
    const TF_HISTOGRAM_F32: &str = "0ae7010a01772ae10109000000000000f0bf110000000000000840190000000000001840217100000000001440290000000000002e4032582b14facdbe24f0bf08996919155aedbf000000000000000011ea2d819997713d08996919155aed3f2b14facdbe24f03fdc94cd2e8d75ff3fe011f10c744d014068bc10359a0707400d9cc5a029550940ffffffffffffef7f3a580000000000000000000000000000f03f000000000000000000000000000000400000000000000000000000000000f03f0000000000000000000000000000f03f0000000000000000000000000000f03f0000000000000000";
    const TF_HISTOGRAM_F64: &str = "0a97010a01642a910109956479e17ffd85bd11ea8ca039593e294619000000000000084021ea8ca039593e29462945f3c2e4e4e9634c3230472dd6ba96d086bdccb4c24ca0bd84bdfae55a25d31fde3fb03125ee8091e03f4c549f0223831544ffffffffffffef7f3a300000000000000000000000000000f03f0000000000000000000000000000f03f0000000000000000000000000000f03f";
    const TF_SCALAR: &str = "0a0b0a046c6f7373150000803e";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn summaries_are_byte_for_byte_tensorflows() {
        let f32s = [1.0f32, 2.0, 3.0, -1.0, 0.0, 1e-13];
        let h = histogram_summary("w", f32s.iter().map(|&v| f64::from(v))).unwrap();
        assert_eq!(hex(&h.encode_to_vec()), TF_HISTOGRAM_F32);
        let h = histogram_summary("d", [0.5, 1e30, -2.5e-12]).unwrap();
        assert_eq!(hex(&h.encode_to_vec()), TF_HISTOGRAM_F64);
        assert_eq!(
            hex(&scalar_summary("loss", 0.25).encode_to_vec()),
            TF_SCALAR
        );
    }

    #[test]
    fn a_nan_in_a_histogram_names_the_tag() {
        let err = histogram_summary("weights", [1.0, f64::NAN]).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert_eq!(err.message(), "Nan in summary histogram for: weights");
    }

    #[test]
    fn an_event_file_reads_back_with_the_record_reader() {
        let dir = tempfile::tempdir().unwrap();
        let logdir = dir.path().join("run").join("train");
        let mut writer = EventFileWriter::create(&logdir, "").unwrap();
        writer.write_scalar(3, "loss", 0.25).unwrap();
        writer.write_histogram(3, "w", [0.5, 1.5]).unwrap();
        let path = writer.path().to_path_buf();
        writer.close().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        let host_and_pid = format!(".{}.{}.", hostname(), std::process::id());
        assert!(name.contains(&host_and_pid), "{name}");
        assert_eq!(path.parent().unwrap(), logdir);

        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0].what,
            Some(What::FileVersion("brain.Event:2".into()))
        );
        assert!(events[0].wall_time > 1.6e9);
        assert_eq!(events[1].step, 3);
        assert_eq!(
            events[1].what,
            Some(What::Summary(scalar_summary("loss", 0.25)))
        );
        let Some(What::Summary(s)) = &events[2].what else {
            panic!("{:?}", events[2]);
        };
        assert_eq!(s.value[0].tag, "w");
        assert!(matches!(s.value[0].value, Some(value::Value::Histo(_))));
    }

    #[test]
    fn an_unwritable_logdir_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let err = EventFileWriter::create(&file.join("sub"), "")
            .err()
            .unwrap();
        assert_eq!(err.code(), crate::Code::PermissionDenied);
        assert!(err.message().contains("a-file/sub"), "{err}");
    }
}
