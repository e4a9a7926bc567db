//! Summary kernels, as TensorFlow's `summary_op.cc` and `summary_kernels.cc` define them.
//!
//! TensorFlow 1's summary ops return a string scalar holding a serialized `Summary`, which a
//! program (or `MonitoredTrainingSession`'s summary saver) writes to an event file itself:
//! `ScalarSummary` (one `simple_value` per tag), `HistogramSummary` (over TensorFlow's default
//! buckets) and `MergeSummary` (the values of its inputs, a tag at most once).
//!
//! TensorFlow 2's ops write event files on the task that runs them: `SummaryWriter` makes the
//! handle of a writer in the device's resources (keyed by its `container` and `shared_name`,
//! as TensorFlow keys it), `CreateSummaryFileWriter` opens the writer's event file in
//! `logdir` on this task (once: it does nothing when the writer exists), `WriteSummary` (what
//! `tf.summary.scalar` and friends emit: a tensor and its serialized `SummaryMetadata`),
//! `WriteScalarSummary` and `WriteHistogramSummary` append events, `FlushSummaryWriter`
//! writes them out and `CloseSummaryWriter` flushes and drops the writer. As in TensorFlow,
//! events are written out once more than `max_queue` wait or `flush_millis` passed since the
//! last flush, and when the writer is dropped.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;

use super::variable::handle_input;
use crate::error::{Code, Result, Status};
use crate::format::events::{self, EventFileWriter, Histogram};
use crate::format::files::Files;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::summary::{value, Value};
use crate::proto::{Summary, SummaryMetadata};
use crate::runtime::resource::Resource;
use crate::tensor::{DType, ResourceHandle, Tensor};

/// The `type_name` of a summary writer's resource handle.
pub const WRITER_TYPE_NAME: &str = "SummaryWriterInterface";

/// Returns the factory for a summary op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "ScalarSummary" => |_| super::stateless(scalar_summary),
        "HistogramSummary" => |_| super::stateless(histogram_summary),
        "MergeSummary" => |_| super::stateless(merge_summary),
        "SummaryWriter" => WriterHandle::create,
        "CreateSummaryFileWriter" => |_| super::stateless(create_file_writer),
        "WriteSummary" => |_| super::stateless(write_summary),
        "WriteScalarSummary" => |_| super::stateless(write_scalar_summary),
        "WriteHistogramSummary" => |_| super::stateless(write_histogram_summary),
        "FlushSummaryWriter" => |_| super::stateless(flush_writer),
        "CloseSummaryWriter" => |_| super::stateless(close_writer),
        _ => return None,
    };
    Some(factory)
}

/// `tags`'s only element, for error messages: ` (tag 'x')`, or nothing.
fn single_tag(tags: &Tensor) -> String {
    match tags.strings() {
        Ok([tag]) => format!(" (tag '{}')", String::from_utf8_lossy(tag)),
        _ => String::new(),
    }
}

/// Reads every element of a real-number tensor as `f64`.
fn as_f64s(ctx: &OpContext<'_>, t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::Float => t.values::<f32>()?.iter().map(|&v| f64::from(v)).collect(),
        DType::Double => t.values::<f64>()?.into_owned(),
        DType::Int32 => t.values::<i32>()?.iter().map(|&v| f64::from(v)).collect(),
        DType::Int64 => t.values::<i64>()?.iter().map(|&v| v as f64).collect(),
        other => {
            return Err(super::unsupported_dtype(
                ctx,
                other,
                &[DType::Float, DType::Double, DType::Int32, DType::Int64],
            ))
        }
    })
}

/// A string input that must be a scalar (`what` names it in errors).
fn string_scalar<'a>(ctx: &OpContext<'_>, t: &'a Tensor, what: &str) -> Result<&'a Bytes> {
    if t.dtype() != DType::String || t.rank() != 0 {
        return Err(ctx.invalid(format!(
            "{what} must be a string scalar, got a {} tensor of shape {}",
            t.dtype(),
            t.shape()
        )));
    }
    t.strings()?
        .first()
        .ok_or_else(|| ctx.invalid(format!("{what} holds no string")))
}

/// A scalar int input (`step`, `max_queue`, `flush_millis`).
fn int_scalar(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<i64> {
    let t = ctx.input(i)?;
    if t.rank() != 0 {
        return Err(ctx.invalid(format!("{what} must be a scalar, got shape {}", t.shape())));
    }
    super::int_scalar(ctx, t, what)
}

/// The output: a string scalar holding `summary`.
fn set_summary(ctx: &mut OpContext<'_>, summary: &Summary) {
    ctx.set_output(0, Tensor::string(summary.encode_to_vec()));
}

/// `ScalarSummary(tags, values)`: one `simple_value` per tag; tags and values have one shape.
fn scalar_summary(ctx: &mut OpContext<'_>) -> Result<()> {
    let tags = ctx.input(0)?;
    let values = ctx.input(1)?;
    if tags.shape() != values.shape() {
        return Err(ctx.invalid(format!(
            "tags and values are not the same shape: {} != {}{}",
            tags.shape(),
            values.shape(),
            single_tag(tags)
        )));
    }
    let numbers = as_f64s(ctx, values)?;
    let summary = Summary {
        value: tags
            .strings()?
            .iter()
            .zip(numbers)
            .map(|(tag, v)| Value {
                tag: String::from_utf8_lossy(tag).into_owned(),
                value: Some(value::Value::SimpleValue(v as f32)),
                ..Value::default()
            })
            .collect(),
    };
    set_summary(ctx, &summary);
    Ok(())
}

/// `HistogramSummary(tag, values)`: a histogram of every value; a NaN or infinity names the
/// node, as TensorFlow's does.
fn histogram_summary(ctx: &mut OpContext<'_>) -> Result<()> {
    let tags = ctx.input(0)?;
    if tags.rank() != 0 {
        return Err(ctx.invalid(format!("tags must be scalar, got shape {}", tags.shape())));
    }
    let tag = String::from_utf8_lossy(string_scalar(ctx, tags, "tags")?).into_owned();
    let values = as_f64s(ctx, ctx.input(1)?)?;
    let histogram = Histogram::of(values)
        .ok_or_else(|| ctx.invalid(format!("Nan in summary histogram for: {}", ctx.node().name)))?;
    set_summary(ctx, &histogram.to_summary(&tag));
    Ok(())
}

/// `MergeSummary(inputs)`: the values of every serialized summary of every input, in order;
/// a non-empty tag seen twice is INVALID_ARGUMENT.
fn merge_summary(ctx: &mut OpContext<'_>) -> Result<()> {
    let mut merged = Summary::default();
    let mut tags = HashSet::new();
    for input in ctx.inputs() {
        if input.dtype() != DType::String {
            return Err(ctx.invalid(format!(
                "inputs must be serialized Summary strings, got {}",
                input.dtype()
            )));
        }
        for serialized in input.strings()? {
            let summary = Summary::decode(serialized.as_ref())
                .map_err(|_| ctx.invalid("Could not parse one of the summary inputs"))?;
            for value in summary.value {
                if !value.tag.is_empty() && !tags.insert(value.tag.clone()) {
                    return Err(ctx.invalid(format!(
                        "Duplicate tag {} found in summary inputs",
                        value.tag
                    )));
                }
                merged.value.push(value);
            }
        }
    }
    set_summary(ctx, &merged);
    Ok(())
}

/// A summary writer: an event file on this task and TensorFlow's flushing rule.
pub struct SummaryFileWriter {
    logdir: PathBuf,
    inner: Mutex<WriterState>,
}

struct WriterState {
    file: EventFileWriter,
    /// Events written since the last flush.
    pending: usize,
    last_flush: Instant,
    max_queue: usize,
    flush_every: Duration,
}

impl Resource for SummaryFileWriter {
    fn type_name(&self) -> &'static str {
        "summary writer"
    }
}

impl SummaryFileWriter {
    /// Opens a new event file in `logdir` (created when missing, through `files`), named with
    /// `suffix`.
    pub fn create(
        files: &Files,
        logdir: PathBuf,
        suffix: &str,
        max_queue: usize,
        flush_every: Duration,
    ) -> Result<Self> {
        let file = EventFileWriter::create_with(files, &logdir, suffix)?;
        Ok(Self {
            logdir,
            inner: Mutex::new(WriterState {
                file,
                pending: 0,
                last_flush: Instant::now(),
                max_queue,
                flush_every,
            }),
        })
    }

    /// The directory the writer writes into.
    pub fn logdir(&self) -> &std::path::Path {
        &self.logdir
    }

    /// The event file's path.
    pub fn path(&self) -> PathBuf {
        self.lock().file.path().to_path_buf()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an event at `step` holding `summary`; flushes once more than `max_queue`
    /// events wait or `flush_millis` passed.
    pub fn write(&self, step: i64, summary: Summary) -> Result<()> {
        let mut state = self.lock();
        state.file.write_summary(step, summary)?;
        state.pending += 1;
        if state.pending > state.max_queue || state.last_flush.elapsed() > state.flush_every {
            Self::flush_locked(&mut state)?;
        }
        Ok(())
    }

    /// Writes every waiting event to the file.
    pub fn flush(&self) -> Result<()> {
        Self::flush_locked(&mut self.lock())
    }

    fn flush_locked(state: &mut WriterState) -> Result<()> {
        state.file.flush()?;
        state.pending = 0;
        state.last_flush = Instant::now();
        Ok(())
    }
}

/// `SummaryWriter`: the handle of the writer at (`container`, `shared_name`).
struct WriterHandle {
    container: String,
    name: String,
}

impl WriterHandle {
    fn create(node: &crate::proto::NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(WriterHandle {
            container: attr::string_or(node, "container", "")?,
            name: attr::string_or(node, "shared_name", "")?,
        }))
    }
}

impl OpKernel for WriterHandle {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        ctx.set_output(
            0,
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container: self.container.clone(),
                name: self.name.clone(),
                type_name: WRITER_TYPE_NAME.to_string(),
            }),
        );
        Ok(())
    }
}

/// The writer behind input 0, or NOT_FOUND saying to run its `CreateSummaryFileWriter`.
fn writer(ctx: &OpContext<'_>) -> Result<(ResourceHandle, Arc<SummaryFileWriter>)> {
    let h = handle_input(ctx, 0)?;
    match ctx
        .resources
        .lookup::<SummaryFileWriter>(&h.container, &h.name)
    {
        Ok(w) => Ok((h, w)),
        Err(e) if e.code() == Code::NotFound => Err(Status::not_found(format!(
            "node `{}` (op {}): summary writer `{}` does not exist on {}; run its \
             CreateSummaryFileWriter op (the writer's init(), e.g. \
             tf.compat.v1.summary.initialize()) first",
            ctx.node().name,
            ctx.node().op,
            h.name,
            ctx.device
        ))),
        Err(e) => Err(ctx.named(e)),
    }
}

/// `CreateSummaryFileWriter(writer, logdir, max_queue, flush_millis, filename_suffix)`.
fn create_file_writer(ctx: &mut OpContext<'_>) -> Result<()> {
    let h = handle_input(ctx, 0)?;
    let logdir = string_scalar(ctx, ctx.input(1)?, "logdir")?;
    let logdir = PathBuf::from(String::from_utf8_lossy(logdir).into_owned());
    if logdir.as_os_str().is_empty() {
        return Err(ctx.invalid("logdir is empty; give the writer a directory"));
    }
    let max_queue = int_scalar(ctx, 2, "max_queue")?.max(0) as usize;
    let flush_millis = int_scalar(ctx, 3, "flush_millis")?.max(0) as u64;
    let suffix = string_scalar(ctx, ctx.input(4)?, "filename_suffix")?;
    let suffix = String::from_utf8_lossy(suffix).into_owned();
    let files = ctx.files();
    ctx.resources
        .lookup_or_create::<SummaryFileWriter>(&h.container, &h.name, || {
            SummaryFileWriter::create(
                files,
                logdir,
                &suffix,
                max_queue,
                Duration::from_millis(flush_millis),
            )
        })
        .map_err(|e| ctx.named(e))?;
    Ok(())
}

/// `WriteSummary(writer, step, tensor, tag, summary_metadata)`: an event whose value is the
/// tensor (strings as `string_val`, other dtypes as `tensor_content`) with its metadata.
fn write_summary(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, w) = writer(ctx)?;
    let step = int_scalar(ctx, 1, "step")?;
    let tensor = ctx.input(2)?;
    let tag = String::from_utf8_lossy(string_scalar(ctx, ctx.input(3)?, "tag")?).into_owned();
    let metadata = string_scalar(ctx, ctx.input(4)?, "summary_metadata")?;
    let metadata =
        if metadata.is_empty() {
            None
        } else {
            Some(SummaryMetadata::decode(metadata.as_ref()).map_err(|e| {
                ctx.invalid(format!("summary_metadata is not a SummaryMetadata: {e}"))
            })?)
        };
    let summary = Summary {
        value: vec![Value {
            tag,
            metadata,
            value: Some(value::Value::Tensor(tensor.to_proto())),
            ..Value::default()
        }],
    };
    w.write(step, summary).map_err(|e| ctx.named(e))
}

/// `WriteScalarSummary(writer, step, tag, value)`: the first element as a `simple_value`.
fn write_scalar_summary(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, w) = writer(ctx)?;
    let step = int_scalar(ctx, 1, "step")?;
    let tag = String::from_utf8_lossy(string_scalar(ctx, ctx.input(2)?, "tag")?).into_owned();
    let values = as_f64s(ctx, ctx.input(3)?)?;
    let value = *values
        .first()
        .ok_or_else(|| ctx.invalid(format!("the value of scalar summary `{tag}` is empty")))?;
    w.write(step, events::scalar_summary(&tag, value as f32))
        .map_err(|e| ctx.named(e))
}

/// `WriteHistogramSummary(writer, step, tag, values)`.
fn write_histogram_summary(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, w) = writer(ctx)?;
    let step = int_scalar(ctx, 1, "step")?;
    let tag = String::from_utf8_lossy(string_scalar(ctx, ctx.input(2)?, "tag")?).into_owned();
    let values = as_f64s(ctx, ctx.input(3)?)?;
    let summary = events::histogram_summary(&tag, values).map_err(|e| ctx.named(e))?;
    w.write(step, summary).map_err(|e| ctx.named(e))
}

/// `FlushSummaryWriter(writer)`.
fn flush_writer(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, w) = writer(ctx)?;
    w.flush().map_err(|e| ctx.named(e))
}

/// `CloseSummaryWriter(writer)`: flushes and drops the writer (its file is closed once no
/// running op holds it); closing a writer that does not exist is an error, as in TensorFlow.
fn close_writer(ctx: &mut OpContext<'_>) -> Result<()> {
    let (h, w) = writer(ctx)?;
    w.flush().map_err(|e| ctx.named(e))?;
    ctx.resources
        .delete(&h.container, &h.name)
        .map_err(|e| ctx.named(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::events::read_events;
    use crate::graph::attr::value as attr_value;
    use crate::proto::event::What;
    use crate::proto::NodeDef;
    use crate::runtime::resource::ResourceMgr;

    const DEVICE: &str = "/job:worker/replica:0/task:0/device:CPU:0";

    fn node(op: &str, attrs: &[(&str, crate::proto::AttrValue)]) -> NodeDef {
        NodeDef {
            name: format!("{op}_node"),
            op: op.into(),
            attr: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..NodeDef::default()
        }
    }

    fn run(rm: &ResourceMgr, node: &NodeDef, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let kernel = (kernel_for(&node.op).expect("a summary op"))(node)?;
        let mut ctx = OpContext::new(node, inputs, rm, DEVICE, 1);
        kernel.compute(&mut ctx)?;
        Ok(ctx.take_outputs().into_iter().flatten().collect())
    }

    fn strings(dims: &[usize], values: &[&str]) -> Tensor {
        Tensor::from_strings(
            dims.to_vec(),
            values.iter().map(|s| Bytes::from(s.to_string())).collect(),
        )
        .unwrap()
    }

    fn summary_of(out: &[Tensor]) -> Summary {
        Summary::decode(out[0].strings().unwrap()[0].as_ref()).unwrap()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn scalar_and_merge_summaries_are_tensorflows_bytes() {
        let rm = ResourceMgr::new();
        let scalar = node("ScalarSummary", &[]);
        let loss = run(
            &rm,
            &scalar,
            vec![Tensor::string("loss"), Tensor::scalar(0.25f64)],
        )
        .unwrap();
        // tf.compat.v1.summary.scalar("loss", tf.constant(0.25, tf.float64)), TF 2.21.
        assert_eq!(
            hex(loss[0].strings().unwrap()[0].as_ref()),
            "0a0b0a046c6f7373150000803e"
        );
        let ab = run(
            &rm,
            &scalar,
            vec![
                strings(&[2], &["a", "b"]),
                Tensor::from_vec([2], vec![1i32, 2]).unwrap(),
            ],
        )
        .unwrap();
        let merged = run(
            &rm,
            &node("MergeSummary", &[]),
            vec![loss[0].clone(), ab[0].clone()],
        )
        .unwrap();
        assert_eq!(
            hex(merged[0].strings().unwrap()[0].as_ref()),
            "0a0b0a046c6f7373150000803e0a080a0161150000803f0a080a01621500000040"
        );
        assert_eq!(summary_of(&merged).value.len(), 3);
    }

    #[test]
    fn summary_errors_are_tensorflows() {
        let rm = ResourceMgr::new();
        let scalar = node("ScalarSummary", &[]);
        let err = run(
            &rm,
            &scalar,
            vec![
                Tensor::string("a"),
                Tensor::from_vec([1], vec![1.0f32]).unwrap(),
            ],
        )
        .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message()
                .contains("tags and values are not the same shape: [] != [1] (tag 'a')"),
            "{err}"
        );
        let loss = run(
            &rm,
            &scalar,
            vec![Tensor::string("loss"), Tensor::scalar(1.0f32)],
        )
        .unwrap();
        let merge = node("MergeSummary", &[]);
        let err = run(&rm, &merge, vec![loss[0].clone(), loss[0].clone()]).unwrap_err();
        assert!(
            err.message()
                .contains("Duplicate tag loss found in summary inputs"),
            "{err}"
        );
        let err = run(&rm, &merge, vec![Tensor::string(&b"\xff\xff"[..])]).unwrap_err();
        assert!(
            err.message()
                .contains("Could not parse one of the summary inputs"),
            "{err}"
        );
        let histogram = node("HistogramSummary", &[]);
        let err = run(
            &rm,
            &histogram,
            vec![strings(&[1], &["a"]), Tensor::scalar(1.0f32)],
        )
        .unwrap_err();
        assert!(err.message().contains("tags must be scalar"), "{err}");
        let err = run(
            &rm,
            &histogram,
            vec![
                Tensor::string("a"),
                Tensor::from_vec([2], vec![1.0f32, f32::NAN]).unwrap(),
            ],
        )
        .unwrap_err();
        assert!(
            err.message()
                .contains("Nan in summary histogram for: HistogramSummary_node"),
            "{err}"
        );
    }

    #[test]
    fn a_writer_writes_an_event_file_in_its_logdir() {
        let dir = tempfile::tempdir().unwrap();
        let logdir = dir.path().join("logs");
        let rm = ResourceMgr::new();
        let handle = run(
            &rm,
            &node("SummaryWriter", &[("shared_name", attr_value::string("w"))]),
            vec![],
        )
        .unwrap()
        .remove(0);
        // Writing before the writer exists names the missing init.
        let write = node("WriteScalarSummary", &[]);
        let scalar = |step: i64, v: f32| {
            vec![
                handle.clone(),
                Tensor::scalar(step),
                Tensor::string("x"),
                Tensor::scalar(v),
            ]
        };
        let err = run(&rm, &write, scalar(0, 1.0)).unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert!(err.message().contains("CreateSummaryFileWriter"), "{err}");

        let create = node("CreateSummaryFileWriter", &[]);
        let inputs = vec![
            handle.clone(),
            Tensor::string(logdir.to_str().unwrap().to_string()),
            Tensor::scalar(10i32),
            Tensor::scalar(120_000i32),
            Tensor::string(".v2"),
        ];
        run(&rm, &create, inputs.clone()).unwrap();
        // A second run finds the writer and leaves it as it is.
        run(&rm, &create, inputs).unwrap();
        run(&rm, &write, scalar(3, 1.5)).unwrap();
        let metadata = SummaryMetadata {
            plugin_data: Some(crate::proto::summary_metadata::PluginData {
                plugin_name: "scalars".into(),
                content: Vec::new().into(),
            }),
            ..SummaryMetadata::default()
        };
        run(
            &rm,
            &node("WriteSummary", &[]),
            vec![
                handle.clone(),
                Tensor::scalar(4i64),
                Tensor::scalar(2.5f32),
                Tensor::string("y"),
                Tensor::string(metadata.encode_to_vec()),
            ],
        )
        .unwrap();
        run(
            &rm,
            &node("WriteHistogramSummary", &[]),
            vec![
                handle.clone(),
                Tensor::scalar(5i64),
                Tensor::string("h"),
                Tensor::from_vec([3], vec![1.0f32, 2.0, 3.0]).unwrap(),
            ],
        )
        .unwrap();
        run(&rm, &node("FlushSummaryWriter", &[]), vec![handle.clone()]).unwrap();
        let close = node("CloseSummaryWriter", &[]);
        run(&rm, &close, vec![handle.clone()]).unwrap();
        assert!(rm.is_empty(), "the writer is dropped");
        assert_eq!(
            run(&rm, &close, vec![handle]).unwrap_err().code(),
            Code::NotFound
        );

        let files: Vec<_> = std::fs::read_dir(&logdir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.ends_with(".v2"), "{name}");
        let events = read_events(&files[0]).unwrap();
        assert_eq!(events.len(), 4, "{events:?}");
        let values: Vec<(i64, Value)> = events[1..]
            .iter()
            .map(|e| match &e.what {
                Some(What::Summary(s)) => (e.step, s.value[0].clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(values[0].0, 3);
        assert_eq!(values[0].1.value, Some(value::Value::SimpleValue(1.5)));
        assert_eq!((values[1].0, values[1].1.tag.as_str()), (4, "y"));
        assert_eq!(values[1].1.metadata, Some(metadata));
        let Some(value::Value::Tensor(t)) = &values[1].1.value else {
            panic!("{values:?}");
        };
        assert_eq!(
            Tensor::from_proto(t)
                .unwrap()
                .scalar_value::<f32>()
                .unwrap(),
            2.5
        );
        assert!(matches!(values[2].1.value, Some(value::Value::Histo(_))));
    }
}
