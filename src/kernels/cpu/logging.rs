//! The kernels with side effects outside the graph: `PrintV2` and the TF1 `Print` (the task's
//! log, stdout or stderr), and `ReadFile` / `WriteFile` (whole files, through the task's
//! [`Files`](crate::format::files::Files): `WriteFile` writes where `[checkpoints]
//! allowed_dirs` allows, as checkpoints do, and `ReadFile` reads where `[data] allowed_dirs`
//! and the checkpoint directories allow, so a client cannot read `/etc/passwd` through it
//! when either is set).
//!
//! `PrintV2` writes its string and `end` where `output_stream` says: `stdout`, `stderr`
//! (TensorFlow's default), or `log(info)`, `log(warning)`, `log(error)`, which go to the
//! task's log through `tracing`. TensorFlow's `file://` stream is refused with UNIMPLEMENTED.
//! `Print` passes its first input through and logs `message` followed by each data tensor's
//! summary in brackets (TensorFlow's v1 layout, [`super::summary_text`]) at info, at most
//! `first_n` times when that is not negative. File errors carry TensorFlow's codes:
//! NOT_FOUND for a missing file, FAILED_PRECONDITION for a directory.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::input;
use super::summary_text::summarize;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a logging or file op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "PrintV2" => PrintV2::create,
        "Print" => |node| {
            Ok(Arc::new(Print {
                message: attr::string_or(node, "message", "")?,
                first_n: attr::int_or(node, "first_n", -1)?,
                summarize: attr::int_or(node, "summarize", 3)?,
                printed: AtomicI64::new(0),
            }))
        },
        "ReadFile" => |_| Ok(Arc::new(ReadFile)),
        "WriteFile" => |_| Ok(Arc::new(WriteFile)),
        _ => return None,
    };
    Some(factory)
}

/// Where `PrintV2` writes.
#[derive(Clone, Copy, Debug)]
enum Stream {
    Stdout,
    Stderr,
    Info,
    Warning,
    Error,
}

/// PrintV2(input): writes the scalar string and `end`.
struct PrintV2 {
    stream: Stream,
    end: String,
}

impl PrintV2 {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let name = attr::string_or(node, "output_stream", "stderr")?;
        let stream = match name.as_str() {
            "stdout" => Stream::Stdout,
            "stderr" => Stream::Stderr,
            "log(info)" => Stream::Info,
            "log(warning)" => Stream::Warning,
            "log(error)" => Stream::Error,
            other if other.starts_with("file://") => {
                return Err(Status::unimplemented(format!(
                    "node `{}` (op PrintV2): output_stream {other:?} is not supported by \
                     tessera; print to stdout, stderr or log(info) instead",
                    node.name
                )))
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "node `{}` (op PrintV2): Unknown output stream: {other}, Valid streams \
                     are: stdout stderr log(info) log(warning) log(error)",
                    node.name
                )))
            }
        };
        Ok(Arc::new(PrintV2 {
            stream,
            end: attr::string_or(node, "end", "\n")?,
        }))
    }
}

impl OpKernel for PrintV2 {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let t = input(ctx, 0)?;
        if t.dtype() != DType::String || t.rank() != 0 {
            return Err(ctx.invalid(format!(
                "Input is expected to be scalar, but got {}",
                t.shape()
            )));
        }
        let text = String::from_utf8_lossy(&t.strings()?[0]).into_owned();
        let node = &ctx.node().name;
        match self.stream {
            Stream::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = write!(out, "{text}{}", self.end);
                let _ = out.flush();
            }
            Stream::Stderr => eprint!("{text}{}", self.end),
            // The log adds its own line ends.
            Stream::Info => tracing::info!(node = %node, "{}", text),
            Stream::Warning => tracing::warn!(node = %node, "{}", text),
            Stream::Error => tracing::error!(node = %node, "{}", text),
        }
        Ok(())
    }
}

/// Print(input, data...): `input`, unchanged; logs the message and the data's summaries.
struct Print {
    message: String,
    first_n: i64,
    summarize: i64,
    printed: AtomicI64,
}

impl OpKernel for Print {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        ctx.set_output(0, x);
        if self.first_n >= 0 && self.printed.fetch_add(1, Ordering::Relaxed) >= self.first_n {
            return Ok(());
        }
        let mut text = self.message.clone();
        for t in &ctx.inputs()[1..] {
            text.push('[');
            text.push_str(&summarize(t, self.summarize, false)?);
            text.push(']');
        }
        tracing::info!(node = %ctx.node().name, "{}", text);
        Ok(())
    }
}

/// Input `i` as a path: a scalar string, else `what` followed by its shape.
fn path_input(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<String> {
    let t = input(ctx, i)?;
    if t.dtype() != DType::String || t.rank() != 0 {
        return Err(ctx.invalid(format!("{what}{}", t.shape())));
    }
    Ok(String::from_utf8_lossy(&t.strings()?[0]).into_owned())
}

/// An I/O error on `path` as TensorFlow reports it (`/path; No such file or directory`).
fn io_status(ctx: &OpContext<'_>, path: &str, e: &std::io::Error) -> Status {
    use std::io::ErrorKind;
    let status = match e.kind() {
        ErrorKind::NotFound => Status::not_found(format!("{path}; No such file or directory")),
        ErrorKind::PermissionDenied => {
            Status::permission_denied(format!("{path}; Permission denied"))
        }
        ErrorKind::IsADirectory => Status::failed_precondition(format!("{path}; Is a directory")),
        _ => Status::unknown(format!("{path}; {e}")),
    };
    ctx.named(status)
}

/// ReadFile(filename): the file's bytes, through the memory budget.
struct ReadFile;

impl OpKernel for ReadFile {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let path = path_input(
            ctx,
            0,
            "Input filename tensor must be scalar, but had shape: ",
        )?;
        let target = ctx.data_files().resolve(&path).map_err(|e| ctx.named(e))?;
        let mut file = target.open().map_err(|e| io_status(ctx, &path, &e))?;
        let meta = file.metadata().map_err(|e| io_status(ctx, &path, &e))?;
        if meta.is_dir() {
            return Err(ctx.named(Status::failed_precondition(format!(
                "{path}; Is a directory"
            ))));
        }
        ctx.check_fits(meta.len())?;
        let mut contents = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut contents)
            .map_err(|e| io_status(ctx, &path, &e))?;
        ctx.set_output(0, Tensor::string(Bytes::from(contents)));
        Ok(())
    }
}

/// WriteFile(filename, contents): creates the file's directory and writes the file.
struct WriteFile;

impl OpKernel for WriteFile {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let path = path_input(
            ctx,
            0,
            "Input filename tensor must be scalar, but had shape: ",
        )?;
        let contents = input(ctx, 1)?;
        if contents.dtype() != DType::String || contents.rank() != 0 {
            return Err(ctx.invalid(format!(
                "Contents tensor must be scalar, but had shape: {}",
                contents.shape()
            )));
        }
        let files = ctx.files();
        if let Some(dir) = Path::new(&path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            let dir_target = files.resolve(dir).map_err(|e| ctx.named(e))?;
            dir_target
                .create_dir_all()
                .map_err(|e| io_status(ctx, &dir.display().to_string(), &e))?;
        }
        let target = files.resolve(&path).map_err(|e| ctx.named(e))?;
        let mut file = target.create().map_err(|e| io_status(ctx, &path, &e))?;
        file.write_all(&contents.strings()?[0])
            .map_err(|e| io_status(ctx, &path, &e))?;
        Ok(())
    }
}
