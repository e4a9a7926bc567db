//! A checkpoint as one safetensors file (`tessera export --safetensors OUT CKPT`), for the
//! Rust ML ecosystem (candle, burn, ...): every float32, float64, int32, int64 and bool tensor
//! under its checkpoint name; string tensors have no safetensors dtype and are skipped (and
//! reported).

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use super::state::latest_checkpoint;
use crate::error::{Result, Status};
use crate::format::checkpoint::bundle::{index_filename, write_atomic, BundleReader};
use crate::tensor::{DType, Tensor};

/// What an export wrote and skipped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    /// The names of the tensors written.
    pub written: Vec<String>,
    /// The tensors skipped, with why.
    pub skipped: Vec<(String, String)>,
}

/// Resolves a checkpoint argument: a prefix (`dir/model.ckpt-100`), or a directory whose
/// `checkpoint` state file names the latest one.
pub fn resolve_checkpoint(arg: &Path) -> Result<String> {
    if arg.is_dir() {
        return latest_checkpoint(arg)?
            .map(|p| p.to_string_lossy().into_owned())
            .ok_or_else(|| {
                Status::not_found(format!(
                    "checkpoint directory {} has no `checkpoint` state file naming a checkpoint; \
                     pass a prefix such as {}/model.ckpt-100",
                    arg.display(),
                    arg.display()
                ))
            });
    }
    let prefix = arg.to_string_lossy().into_owned();
    let prefix = prefix.strip_suffix(".index").unwrap_or(&prefix).to_string();
    if !index_filename(&prefix).exists() {
        return Err(Status::not_found(format!(
            "no checkpoint at {prefix} ({} does not exist); pass a checkpoint prefix or directory",
            index_filename(&prefix).display()
        )));
    }
    Ok(prefix)
}

/// Maps a tessera dtype onto safetensors', if it has one.
fn safetensors_dtype(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::Float => Some(Dtype::F32),
        DType::Double => Some(Dtype::F64),
        DType::Int32 => Some(Dtype::I32),
        DType::Int64 => Some(Dtype::I64),
        DType::Bool => Some(Dtype::BOOL),
        DType::UInt8 => Some(Dtype::U8),
        DType::Int8 => Some(Dtype::I8),
        DType::Int16 => Some(Dtype::I16),
        DType::UInt16 => Some(Dtype::U16),
        DType::UInt32 => Some(Dtype::U32),
        DType::UInt64 => Some(Dtype::U64),
        DType::Half => Some(Dtype::F16),
        DType::BFloat16 => Some(Dtype::BF16),
        DType::Complex64 | DType::String | DType::Resource | DType::Variant => None,
    }
}

/// Writes every exportable tensor of the checkpoint at `checkpoint` (prefix or directory) to
/// the safetensors file `out` (atomically); every checksum is verified on the way.
pub fn export_safetensors(checkpoint: &Path, out: &Path) -> Result<ExportSummary> {
    let prefix = resolve_checkpoint(checkpoint)?;
    let reader = BundleReader::open(&prefix)?;
    let mut summary = ExportSummary::default();
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for name in reader.entries().keys() {
        let (dtype, _) = reader.dtype_and_shape(name)?;
        if safetensors_dtype(dtype).is_none() {
            summary
                .skipped
                .push((name.clone(), format!("{dtype} has no safetensors dtype")));
            continue;
        }
        tensors.push((name.clone(), reader.read(name)?));
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let dtype = safetensors_dtype(t.dtype()).unwrap_or(Dtype::U8);
        let data: &[u8] = t.bytes().unwrap_or(&[]);
        let view = TensorView::new(dtype, t.dims().to_vec(), data)
            .map_err(|e| Status::internal(format!("tensor `{name}` cannot be exported: {e}")))?;
        views.push((name.clone(), view));
        summary.written.push(name.clone());
    }
    let bytes = safetensors::serialize(views, None)
        .map_err(|e| Status::internal(format!("cannot serialize {prefix} as safetensors: {e}")))?;
    write_atomic(out, &bytes)?;
    Ok(summary)
}
