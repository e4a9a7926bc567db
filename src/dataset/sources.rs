//! Where elements come from: tensors (`TensorDataset`: one element; `TensorSliceDataset`:
//! one per row), `RangeDataset`, and files (`TFRecordDataset`, `TextLineDataset`,
//! `FixedLengthRecordDataset`; uncompressed, `ZLIB` or `GZIP`).
//!
//! Files are opened through the task's read confinement (`OpContext::data_files`, `[data]
//! allowed_dirs`) as it was when the dataset was made, so a client cannot read outside the
//! directories the task allows (a refused path is PERMISSION_DENIED naming the path and
//! `data.allowed_dirs`, the key that allows more); they are opened one after
//! the other as the walk reaches them, so a missing file is NOT_FOUND at the element that
//! needs it, as in TensorFlow. A corrupt record is DATA_LOSS naming the file and the offset.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use flate2::read::{MultiGzDecoder, ZlibDecoder};

use super::{dataset_op, int64_input, Dataset, DatasetNode, Element, Iter, Origin};
use crate::error::{Result, Status};
use crate::format::files::Files;
use crate::format::tfrecord::RecordReader;
use crate::kernels::cpu::rows;
use crate::kernels::{KernelFactory, OpContext};
use crate::tensor::{DType, Shape, Tensor};

pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "TensorDataset" => |n| dataset_op(n, |ctx, d| tensors(ctx, d, false)),
        "TensorSliceDataset" => |n| dataset_op(n, |ctx, d| tensors(ctx, d, true)),
        "RangeDataset" => |n| dataset_op(n, range),
        "TFRecordDataset" | "TFRecordDatasetV2" => {
            |n| dataset_op(n, |ctx, d| files(ctx, d, Format::TfRecord))
        }
        "TextLineDataset" => |n| dataset_op(n, |ctx, d| files(ctx, d, Format::Lines)),
        "FixedLengthRecordDataset" | "FixedLengthRecordDatasetV2" => {
            |n| dataset_op(n, fixed_length)
        }
        _ => return None,
    };
    Some(factory)
}

/// The components of a `TensorDataset` (one element) or `TensorSliceDataset` (one element per
/// row of every component).
struct Tensors {
    origin: Origin,
    components: Vec<Tensor>,
    slices: bool,
}

fn tensors(ctx: &OpContext<'_>, d: &DatasetNode, slices: bool) -> Result<Arc<dyn Dataset>> {
    let components = ctx.inputs().to_vec();
    if components.is_empty() {
        return Err(ctx.invalid("a dataset of tensors needs at least one component"));
    }
    if slices {
        let rows = components[0].dims().first().copied();
        for (i, c) in components.iter().enumerate() {
            if c.rank() == 0 {
                return Err(ctx.invalid(format!(
                    "component {i} is a scalar; from_tensor_slices cuts each component along \
                     its first dimension, so each needs rank >= 1"
                )));
            }
            if c.dims().first().copied() != rows {
                return Err(ctx.invalid(format!(
                    "all components must have the same size in the 0th dimension: component 0 \
                     has {}, component {i} has {}",
                    rows.unwrap_or(0),
                    c.dims()[0]
                )));
            }
        }
    }
    Ok(Arc::new(Tensors {
        origin: d.origin.clone(),
        components,
        slices,
    }))
}

impl Dataset for Tensors {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, _: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(TensorsIter {
            dataset: self,
            next: 0,
        }))
    }

    fn cardinality(&self) -> i64 {
        if self.slices {
            self.components[0].dims()[0] as i64
        } else {
            1
        }
    }
}

struct TensorsIter {
    dataset: Arc<Tensors>,
    next: usize,
}

impl Iter for TensorsIter {
    fn next(&mut self, _: &OpContext<'_>) -> Result<Option<Element>> {
        let d = &self.dataset;
        if self.next as i64 >= d.cardinality() {
            return Ok(None);
        }
        let i = self.next;
        self.next += 1;
        if !d.slices {
            return Ok(Some(d.components.clone()));
        }
        d.components
            .iter()
            .map(|c| {
                let row = Shape::new(c.dims()[1..].to_vec());
                rows::slice_rows(c, i, i + 1)?.reshape(row)
            })
            .collect::<Result<Element>>()
            .map(Some)
    }
}

/// `RangeDataset`: `start, start + step, ...` up to `stop` (excluded), as the declared dtype.
struct Range {
    origin: Origin,
    start: i64,
    stop: i64,
    step: i64,
    dtype: DType,
}

fn range(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let start = int64_input(ctx, 0, "start")?;
    let stop = int64_input(ctx, 1, "stop")?;
    let step = int64_input(ctx, 2, "step")?;
    if step == 0 {
        return Err(ctx.invalid("step must be a non-zero integer"));
    }
    let dtype = d
        .signature
        .as_ref()
        .and_then(|s| s.types.first().copied())
        .unwrap_or(DType::Int64);
    if !matches!(
        dtype,
        DType::Int64 | DType::Int32 | DType::Float | DType::Double
    ) {
        return Err(ctx.invalid(format!(
            "a range of {dtype} is not supported; use int32, int64, float32 or float64"
        )));
    }
    Ok(Arc::new(Range {
        origin: d.origin.clone(),
        start,
        stop,
        step,
        dtype,
    }))
}

impl Dataset for Range {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, _: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(RangeIter {
            next: self.start,
            dataset: self,
        }))
    }

    fn cardinality(&self) -> i64 {
        let (start, stop, step) = (
            i128::from(self.start),
            i128::from(self.stop),
            i128::from(self.step),
        );
        let n = if step > 0 {
            (stop - start + step - 1).div_euclid(step)
        } else {
            (start - stop - step - 1).div_euclid(-step)
        };
        n.clamp(0, i128::from(i64::MAX)) as i64
    }
}

struct RangeIter {
    dataset: Arc<Range>,
    next: i64,
}

impl Iter for RangeIter {
    fn next(&mut self, _: &OpContext<'_>) -> Result<Option<Element>> {
        let d = &self.dataset;
        let v = self.next;
        if (d.step > 0 && v >= d.stop) || (d.step < 0 && v <= d.stop) {
            return Ok(None);
        }
        // Past i64's end the walk is over, as TensorFlow's range stops there too.
        self.next = v.checked_add(d.step).unwrap_or(d.stop);
        let t = match d.dtype {
            DType::Int32 => Tensor::scalar(v as i32),
            DType::Float => Tensor::scalar(v as f32),
            DType::Double => Tensor::scalar(v as f64),
            _ => Tensor::scalar(v),
        };
        Ok(Some(vec![t]))
    }
}

/// How a file source cuts its files into elements.
#[derive(Clone, Copy, Debug)]
enum Format {
    /// TFRecord framing, each record's CRCs checked.
    TfRecord,
    /// Lines, without their `\n` (and a `\r` before it).
    Lines,
    /// Records of a fixed size between a header and a footer.
    Fixed {
        header: u64,
        record: u64,
        footer: u64,
    },
}

/// How a file is compressed (`compression_type`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Compression {
    None,
    Zlib,
    Gzip,
}

impl Compression {
    fn parse(ctx: &OpContext<'_>, name: &[u8]) -> Result<Self> {
        match name {
            b"" => Ok(Self::None),
            b"ZLIB" => Ok(Self::Zlib),
            b"GZIP" => Ok(Self::Gzip),
            other => Err(ctx.invalid(format!(
                "compression_type `{}` is not supported; use \"\", \"ZLIB\" or \"GZIP\"",
                String::from_utf8_lossy(other)
            ))),
        }
    }
}

/// Records read from files, one file after the other.
struct FileRecords {
    origin: Origin,
    filenames: Vec<String>,
    compression: Compression,
    format: Format,
    files: Files,
}

fn files(ctx: &OpContext<'_>, d: &DatasetNode, format: Format) -> Result<Arc<dyn Dataset>> {
    let names = ctx.input(0)?;
    if names.dtype() != DType::String || names.rank() > 1 {
        return Err(ctx.invalid(format!(
            "filenames must be a string scalar or vector, got a {} tensor of shape {}",
            names.dtype(),
            names.shape()
        )));
    }
    let compression = match ctx.input(1)?.strings()?.first() {
        Some(name) => Compression::parse(ctx, name)?,
        None => Compression::None,
    };
    if d.origin.op == "TFRecordDatasetV2" {
        let offsets = ctx.input(3)?;
        if offsets.num_elements() > 0 {
            return Err(Status::unimplemented(
                "byte_offsets are not supported yet; read each file from its start",
            ));
        }
    }
    file_records(ctx, d, format, compression)
}

fn fixed_length(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let header = int64_input(ctx, 1, "header_bytes")?;
    let record = int64_input(ctx, 2, "record_bytes")?;
    let footer = int64_input(ctx, 3, "footer_bytes")?;
    if header < 0 || footer < 0 {
        return Err(ctx.invalid("header_bytes and footer_bytes must be >= 0"));
    }
    if record <= 0 {
        return Err(ctx.invalid(format!("record_bytes must be > 0, got {record}")));
    }
    let compression = if d.origin.op == "FixedLengthRecordDatasetV2" {
        match ctx.input(5)?.strings()?.first() {
            Some(name) => Compression::parse(ctx, name)?,
            None => Compression::None,
        }
    } else {
        Compression::None
    };
    let format = Format::Fixed {
        header: header as u64,
        record: record as u64,
        footer: footer as u64,
    };
    file_records(ctx, d, format, compression)
}

fn file_records(
    ctx: &OpContext<'_>,
    d: &DatasetNode,
    format: Format,
    compression: Compression,
) -> Result<Arc<dyn Dataset>> {
    let filenames = ctx
        .input(0)?
        .strings()?
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    Ok(Arc::new(FileRecords {
        origin: d.origin.clone(),
        filenames,
        compression,
        format,
        files: ctx.data_files().clone(),
    }))
}

impl Dataset for FileRecords {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, _: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        Ok(Box::new(FileRecordsIter {
            dataset: self,
            next_file: 0,
            reader: None,
        }))
    }
}

/// Cuts one open file into records.
enum Reader {
    TfRecord(RecordReader<Box<dyn Read + Send>>),
    Lines {
        input: BufReader<Box<dyn Read + Send>>,
        name: String,
    },
    Fixed {
        input: Box<dyn Read + Send>,
        name: String,
        /// The bytes after the header: records, then the footer.
        rest: Vec<u8>,
        record: usize,
        footer: usize,
        offset: usize,
    },
}

struct FileRecordsIter {
    dataset: Arc<FileRecords>,
    next_file: usize,
    reader: Option<Reader>,
}

impl FileRecordsIter {
    fn open(&self, name: &str) -> Result<Reader> {
        let d = &self.dataset;
        let file = d
            .files
            .resolve(name)?
            .open()
            .map_err(|e| open_error(name, e))?;
        let raw: Box<dyn Read + Send> = match d.compression {
            Compression::None => Box::new(BufReader::with_capacity(1 << 18, file)),
            Compression::Zlib => Box::new(ZlibDecoder::new(BufReader::new(file))),
            Compression::Gzip => Box::new(MultiGzDecoder::new(BufReader::new(file))),
        };
        Ok(match d.format {
            Format::TfRecord => Reader::TfRecord(RecordReader::new(raw, name)),
            Format::Lines => Reader::Lines {
                input: BufReader::new(raw),
                name: name.to_string(),
            },
            Format::Fixed {
                header,
                record,
                footer,
            } => {
                let mut input = raw;
                let mut skipped = Vec::new();
                (&mut input)
                    .take(header)
                    .read_to_end(&mut skipped)
                    .map_err(|e| read_error(name, e))?;
                Reader::Fixed {
                    input,
                    name: name.to_string(),
                    rest: Vec::new(),
                    record: record as usize,
                    footer: footer as usize,
                    offset: 0,
                }
            }
        })
    }
}

/// A file that cannot be opened: NOT_FOUND when it is missing, as TensorFlow's readers say.
fn open_error(name: &str, e: std::io::Error) -> Status {
    match e.kind() {
        std::io::ErrorKind::NotFound => Status::not_found(format!("{name}: no such file ({e})")),
        std::io::ErrorKind::PermissionDenied => {
            Status::permission_denied(format!("{name}: cannot open: {e}"))
        }
        _ => Status::unavailable(format!("{name}: cannot open: {e}")),
    }
}

fn read_error(name: &str, e: std::io::Error) -> Status {
    Status::data_loss(format!("{name}: cannot read: {e}"))
}

impl Reader {
    /// The next record of this file; `None` at its end.
    fn next(&mut self) -> Result<Option<Vec<u8>>> {
        match self {
            Reader::TfRecord(r) => r.next_record(),
            Reader::Lines { input, name } => {
                let mut line = Vec::new();
                let n = input
                    .read_until(b'\n', &mut line)
                    .map_err(|e| read_error(name, e))?;
                if n == 0 {
                    return Ok(None);
                }
                if line.last() == Some(&b'\n') {
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                }
                Ok(Some(line))
            }
            Reader::Fixed {
                input,
                name,
                rest,
                record,
                footer,
                offset,
            } => {
                // Keep a record and the footer read ahead, so the footer is never a record.
                let want = *offset + *record + *footer;
                if rest.len() < want {
                    let mut more = Vec::new();
                    (&mut *input)
                        .take((want - rest.len()) as u64 + (1 << 16))
                        .read_to_end(&mut more)
                        .map_err(|e| read_error(name, e))?;
                    rest.drain(..*offset);
                    *offset = 0;
                    rest.extend_from_slice(&more);
                }
                if rest.len() < *offset + *record + *footer {
                    return Ok(None);
                }
                let out = rest[*offset..*offset + *record].to_vec();
                *offset += *record;
                Ok(Some(out))
            }
        }
    }
}

impl Iter for FileRecordsIter {
    fn next(&mut self, _: &OpContext<'_>) -> Result<Option<Element>> {
        loop {
            if self.reader.is_none() {
                let Some(name) = self.dataset.filenames.get(self.next_file).cloned() else {
                    return Ok(None);
                };
                self.next_file += 1;
                let reader = self.open(&name).map_err(|e| self.dataset.origin.named(e))?;
                self.reader = Some(reader);
            }
            let reader = self.reader.as_mut().expect("a reader was just opened");
            match reader.next().map_err(|e| self.dataset.origin.named(e))? {
                Some(record) => return Ok(Some(vec![Tensor::string(record)])),
                None => self.reader = None,
            }
        }
    }
}
