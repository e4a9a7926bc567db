//! Checkpoint kernels: SaveV2 and RestoreV2 (one bundle each; whole tensors, or slices of
//! partitioned variables named by `shape_and_slices` specs), MergeV2Checkpoints (joins the
//! shards of a sharded save, and the slice lists of a variable saved by several), and the
//! string helpers TensorFlow's saver graph builds its file names with: ShardedFilename,
//! StringJoin and StaticRegexFullMatch.
//!
//! The bundle format itself lives in [`crate::format::checkpoint::bundle`]; these kernels only
//! check their inputs and call it. Paths are the host's: in a cluster every task writing or
//! reading a checkpoint must see the same filesystem, as with TensorFlow. Every file goes
//! through the task's [`Files`](crate::format::files::Files), so `[checkpoints] allowed_dirs`
//! confines them when set.

use std::sync::Arc;

use bytes::Bytes;

use super::{input, stateless};
use crate::error::{Result, Status};
use crate::format::checkpoint::bundle::{self, SaveSpec};
use crate::format::checkpoint::slice::ShapeAndSlice;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a checkpoint or string op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "SaveV2" => |_| stateless(save_v2),
        "RestoreV2" => Restore::create,
        "MergeV2Checkpoints" => Merge::create,
        "ShardedFilename" => |_| stateless(sharded_filename),
        "StringJoin" => StringJoin::create,
        "StaticRegexFullMatch" => RegexFullMatch::create,
        _ => return None,
    };
    Some(factory)
}

/// Reads a scalar string input as UTF-8 (a path).
fn string_scalar(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<String> {
    let t = ctx.input(i)?;
    match (t.dtype(), t.num_elements()) {
        (DType::String, 1) => {
            let s = &t.strings()?[0];
            String::from_utf8(s.to_vec())
                .map_err(|_| ctx.invalid(format!("{what} is not valid UTF-8: {s:?}")))
        }
        _ => Err(ctx.invalid(format!(
            "{what} must be a scalar string, got a {} tensor of shape {}",
            t.dtype(),
            t.shape()
        ))),
    }
}

/// Reads a string input as UTF-8 strings.
fn string_values(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<Vec<String>> {
    let t = ctx.input(i)?;
    if t.dtype() != DType::String || t.rank() > 1 {
        return Err(ctx.invalid(format!(
            "{what} must be a string vector, got a {} tensor of shape {}",
            t.dtype(),
            t.shape()
        )));
    }
    t.strings()?
        .iter()
        .map(|s| {
            String::from_utf8(s.to_vec())
                .map_err(|_| ctx.invalid(format!("{what} holds non-UTF-8 bytes {s:?}")))
        })
        .collect()
}

/// Parses one shape-and-slice spec per name: `None` for `""` (a whole tensor), else the full
/// shape and the slice (`"10 4 0,5:-"`).
fn slice_specs(
    ctx: &OpContext<'_>,
    names: &[String],
    specs: &[String],
) -> Result<Vec<Option<ShapeAndSlice>>> {
    if names.len() != specs.len() {
        return Err(ctx.invalid(format!(
            "{} tensor names but {} shape_and_slices; give one spec (\"\" for a whole tensor) \
             per name",
            names.len(),
            specs.len()
        )));
    }
    names
        .iter()
        .zip(specs)
        .map(|(name, spec)| {
            if spec.is_empty() {
                return Ok(None);
            }
            ShapeAndSlice::parse(spec).map(Some).map_err(|e| {
                ctx.invalid(format!(
                    "tensor `{name}`: shape_and_slice \"{spec}\": {}",
                    e.message()
                ))
            })
        })
        .collect()
}

/// `SaveV2(prefix, tensor_names, shape_and_slices, tensors...)`: writes a one-shard bundle;
/// a tensor with a spec is saved as that slice of its variable.
fn save_v2(ctx: &mut OpContext<'_>) -> Result<()> {
    let prefix = string_scalar(ctx, 0, "prefix")?;
    let names = string_values(ctx, 1, "tensor_names")?;
    let specs = string_values(ctx, 2, "shape_and_slices")?;
    let slices = slice_specs(ctx, &names, &specs)?;
    if ctx.num_inputs() != 3 + names.len() {
        return Err(ctx.invalid(format!(
            "{} tensor names but {} tensors",
            names.len(),
            ctx.num_inputs() - 3
        )));
    }
    let saved: Vec<SaveSpec> = names
        .into_iter()
        .zip(slices)
        .zip(ctx.inputs()[3..].iter().cloned())
        .map(|((name, slice), tensor)| SaveSpec {
            name,
            slice,
            tensor,
        })
        .collect();
    bundle::write_specs_with(ctx.files(), &prefix, &saved)
        .map_err(|e| e.context(format!("node `{}` (op SaveV2)", ctx.node().name)))
}

/// `RestoreV2(prefix, tensor_names, shape_and_slices) -> tensors`: reads whole tensors, or
/// with a spec the slice it names, assembled from the slices the checkpoint stores.
struct Restore {
    dtypes: Vec<DType>,
}

impl Restore {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Self {
            dtypes: attr::dtype_list(node, "dtypes")?,
        }))
    }
}

impl OpKernel for Restore {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let prefix = string_scalar(ctx, 0, "prefix")?;
        let names = string_values(ctx, 1, "tensor_names")?;
        let specs = string_values(ctx, 2, "shape_and_slices")?;
        let slices = slice_specs(ctx, &names, &specs)?;
        if names.len() != self.dtypes.len() {
            return Err(ctx.invalid(format!(
                "{} tensor names but {} dtypes",
                names.len(),
                self.dtypes.len()
            )));
        }
        let node = ctx.node().name.clone();
        let in_node = |e: Status| e.context(format!("node `{node}` (op RestoreV2)"));
        let reader = bundle::BundleReader::open_with(ctx.files(), &prefix).map_err(in_node)?;
        for (i, ((name, slice), &want)) in names.iter().zip(&slices).zip(&self.dtypes).enumerate() {
            let (dtype, shape) = reader.dtype_and_shape(name).map_err(in_node)?;
            if dtype != want {
                return Err(ctx.invalid(format!(
                    "tensor `{name}` in checkpoint {prefix} is {dtype}, but the node restores it \
                     as {want}"
                )));
            }
            let tensor = match slice {
                None => reader.read(name),
                Some(spec) => {
                    if spec.full_shape != shape {
                        return Err(ctx.invalid(format!(
                            "tensor `{name}`: shape {} in shape_and_slice spec \"{spec}\" does \
                             not match the shape stored in checkpoint {prefix}: {shape}",
                            spec.full_shape
                        )));
                    }
                    reader.read_slice(name, &spec.slice)
                }
            };
            ctx.set_output(i, tensor.map_err(in_node)?);
        }
        Ok(())
    }
}

/// `MergeV2Checkpoints(checkpoint_prefixes, destination_prefix)`.
struct Merge {
    delete_old_dirs: bool,
    allow_missing_files: bool,
}

impl Merge {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Self {
            delete_old_dirs: attr::bool_or(node, "delete_old_dirs", true)?,
            allow_missing_files: attr::bool_or(node, "allow_missing_files", false)?,
        }))
    }
}

impl OpKernel for Merge {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let mut prefixes = string_values(ctx, 0, "checkpoint_prefixes")?;
        let destination = string_scalar(ctx, 1, "destination_prefix")?;
        let files = ctx.files();
        let node = format!("node `{}` (op MergeV2Checkpoints)", ctx.node().name);
        if self.allow_missing_files {
            // A prefix outside the allowed directories is refused, not taken for missing.
            let mut present = Vec::with_capacity(prefixes.len());
            for prefix in prefixes {
                let index = files
                    .resolve(bundle::index_filename(&prefix))
                    .map_err(|e| e.context(node.clone()))?;
                if index.exists() {
                    present.push(prefix);
                }
            }
            prefixes = present;
        }
        bundle::merge_bundles_with(files, &prefixes, &destination, self.delete_old_dirs)
            .map_err(|e| e.context(node))
    }
}

/// `ShardedFilename(basename, shard, num_shards)` → `basename-0000<shard>-of-0000<num_shards>`.
fn sharded_filename(ctx: &mut OpContext<'_>) -> Result<()> {
    let basename = string_scalar(ctx, 0, "basename")?;
    let shard = super::int_scalar(ctx, &input(ctx, 1)?, "shard")?;
    let num_shards = super::int_scalar(ctx, &input(ctx, 2)?, "num_shards")?;
    if shard < 0 || shard >= num_shards {
        return Err(ctx.invalid(format!(
            "shard {shard} is not in [0, num_shards = {num_shards})"
        )));
    }
    ctx.set_output(
        0,
        Tensor::string(format!("{basename}-{shard:05}-of-{num_shards:05}")),
    );
    Ok(())
}

/// `StringJoin(inputs, separator)`: joins scalars or same-shaped tensors element by element
/// (scalars broadcast).
struct StringJoin {
    separator: Vec<u8>,
}

impl StringJoin {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Self {
            separator: attr::string_or(node, "separator", "")?.into_bytes(),
        }))
    }
}

impl OpKernel for StringJoin {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let inputs = ctx.inputs().to_vec();
        let mut shape = crate::tensor::Shape::scalar();
        for t in &inputs {
            if t.dtype() != DType::String {
                return Err(ctx.invalid(format!("inputs must be strings, got {}", t.dtype())));
            }
            if t.rank() > 0 {
                if shape.rank() > 0 && shape != *t.shape() {
                    return Err(ctx.invalid(format!(
                        "input shapes do not match: {shape} vs. {}; inputs must be scalars or \
                         all of one shape",
                        t.shape()
                    )));
                }
                shape = t.shape().clone();
            }
        }
        let n = shape.num_elements();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut joined = Vec::new();
            for (k, t) in inputs.iter().enumerate() {
                if k > 0 {
                    joined.extend_from_slice(&self.separator);
                }
                let s = t.strings()?;
                joined.extend_from_slice(if t.rank() == 0 { &s[0] } else { &s[i] });
            }
            out.push(Bytes::from(joined));
        }
        ctx.set_output(0, Tensor::from_strings(shape, out)?);
        Ok(())
    }
}

/// `StaticRegexFullMatch(input, pattern)`: whether each string matches the whole pattern
/// (RE2 syntax; the `regex` crate accepts the subset TensorFlow's graphs use).
struct RegexFullMatch {
    regex: regex::bytes::Regex,
}

impl RegexFullMatch {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let pattern = attr::string_or(node, "pattern", "")?;
        let regex = regex::bytes::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
            Status::invalid_argument(format!(
                "node `{}` (op StaticRegexFullMatch): invalid pattern {pattern:?}: {e}",
                node.name
            ))
        })?;
        Ok(Arc::new(Self { regex }))
    }
}

impl OpKernel for RegexFullMatch {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let t = input(ctx, 0)?;
        if t.dtype() != DType::String {
            return Err(ctx.invalid(format!("input must be strings, got {}", t.dtype())));
        }
        let matches: Vec<bool> = t
            .strings()?
            .iter()
            .map(|s| self.regex.is_match(s))
            .collect();
        ctx.set_output(0, Tensor::from_vec(t.shape().clone(), matches)?);
        Ok(())
    }
}
