//! The kernels of `tf.io.parse_example` and `tf.io.parse_single_example`: `ParseExampleV2`
//! (a vector of serialized Examples, or one as a scalar) and `ParseSingleExample`.
//!
//! Dense features come out as `[batch] + shape` (a shape whose first dimension is unknown,
//! `FixedLenSequenceFeature`, is padded to the longest example with the default), a missing
//! one as its default, or an error when it has none; sparse (`VarLenFeature`) ones as
//! indices, values and dense shape. Ragged features are refused with UNIMPLEMENTED. Examples
//! are read by [`super::example_wire`], as TensorFlow's fast parser reads them, and the
//! messages are TensorFlow 2.21's: a batch names the example (`Name: ..., Key: ..., Index:
//! ...`), a single example only the key. Outputs go through the memory budget before they
//! are allocated.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::example_wire::{self as wire, Kind, Values};
use super::input;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::attr_value::Value;
use crate::proto::NodeDef;
use crate::tensor::{DType, PartialShape, Shape, Tensor};

/// Returns the factory for a parsing op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "ParseExampleV2" => |node| Parse::create(node, false),
        "ParseSingleExample" => |node| Parse::create(node, true),
        _ => return None,
    };
    Some(factory)
}

/// An INVALID_ARGUMENT naming `node`, for the checks a factory makes.
fn invalid(node: &NodeDef, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("node `{}` (op {}): {message}", node.name, node.op))
}

/// The kind of list a feature of `dtype` is read from.
fn kind_of(node: &NodeDef, dtype: DType) -> Result<Kind> {
    match dtype {
        DType::String => Ok(Kind::Bytes),
        DType::Float => Ok(Kind::Float),
        DType::Int64 => Ok(Kind::Int64),
        other => Err(invalid(
            node,
            format!("features are float, int64 or string, got {other}"),
        )),
    }
}

/// One dense feature's config.
struct Dense {
    kind: Kind,
    /// The shape, with `None` for the unknown first dimension of a variable-length one.
    shape: Vec<Option<usize>>,
    /// Elements per row: the product of the known dimensions.
    stride: usize,
}

impl Dense {
    fn variable(&self) -> bool {
        self.shape.first() == Some(&None)
    }
}

/// ParseExampleV2 / ParseSingleExample.
struct Parse {
    /// `ParseSingleExample`: keys in attrs, a scalar input, no `names`.
    single_op: bool,
    sparse: Vec<Kind>,
    dense: Vec<Dense>,
    ragged: usize,
    /// ParseSingleExample's keys (ParseExampleV2's come as inputs).
    sparse_keys: Vec<String>,
    dense_keys: Vec<String>,
}

impl Parse {
    fn create(node: &NodeDef, single_op: bool) -> Result<Arc<dyn OpKernel>> {
        let sparse = attr::dtype_list(node, "sparse_types")?
            .into_iter()
            .map(|d| kind_of(node, d))
            .collect::<Result<Vec<_>>>()?;
        let types = attr::dtype_list(node, "Tdense")?;
        let shapes = match attr::get(node, "dense_shapes") {
            Some(Value::List(l)) => l
                .shape
                .iter()
                .map(PartialShape::from_proto)
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        if shapes.len() != types.len() {
            return Err(invalid(
                node,
                format!(
                    "len(dense_keys) != len(dense_shapes): {} vs. {}",
                    types.len(),
                    shapes.len()
                ),
            ));
        }
        let mut dense = Vec::with_capacity(types.len());
        for (i, (dtype, shape)) in types.into_iter().zip(shapes).enumerate() {
            let Some(dims) = shape.dims().map(<[_]>::to_vec) else {
                return Err(invalid(node, format!("dense_shapes[{i}] has unknown rank")));
            };
            if dims.iter().skip(1).any(Option::is_none) {
                return Err(invalid(
                    node,
                    format!("dense_shapes[{i}] = {shape}: only the first dimension may be unknown"),
                ));
            }
            let stride = dims.iter().flatten().product();
            dense.push(Dense {
                kind: kind_of(node, dtype)?,
                shape: dims,
                stride,
            });
        }
        let num_sparse = attr::int_or(node, "num_sparse", 0)?;
        if num_sparse != sparse.len() as i64 {
            return Err(invalid(
                node,
                format!(
                    "len(sparse_types) != num_sparse: {} vs. {num_sparse}",
                    sparse.len()
                ),
            ));
        }
        let ragged = if single_op {
            0
        } else {
            attr::dtype_list(node, "ragged_value_types").map_or(0, |t| t.len())
        };
        let (sparse_keys, dense_keys) = if single_op {
            (
                attr::string_list(node, "sparse_keys")?,
                attr::string_list(node, "dense_keys")?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Arc::new(Parse {
            single_op,
            sparse,
            dense,
            ragged,
            sparse_keys,
            dense_keys,
        }))
    }
}

/// Reads a string input holding keys (any shape) as UTF-8.
fn keys(ctx: &OpContext<'_>, i: usize, what: &str, want: usize) -> Result<Vec<String>> {
    let t = input(ctx, i)?;
    if t.dtype() != DType::String {
        return Err(ctx.invalid(format!("{what} must be strings, got {}", t.dtype())));
    }
    let keys: Vec<String> = t
        .strings()?
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    if keys.len() != want {
        return Err(ctx.invalid(format!(
            "Expected len({what}) == {want} but got: {}",
            keys.len()
        )));
    }
    Ok(keys)
}

/// What a parse error names: the example (a batch) or only the key (one example).
struct Place<'a> {
    /// `Some((name, index))` in a batch.
    batch: Option<(&'a str, usize)>,
}

impl Place<'_> {
    /// `Name: n, Key: k, Index: i.  ` or `Key: k.  `.
    fn key(&self, key: &str) -> String {
        match self.batch {
            Some((name, i)) => format!("Name: {name}, Key: {key}, Index: {i}.  "),
            None => format!("Key: {key}.  "),
        }
    }

    /// The error for a required dense feature that is missing.
    fn required(&self, key: &str, kind: Kind) -> String {
        let name = match self.batch {
            Some((name, _)) => format!("Name: {name}, "),
            None => String::new(),
        };
        format!(
            "{name}Feature: {key} (data type: {}) is required but could not be found.",
            kind.dtype_name()
        )
    }
}

/// One example's values of a feature of `kind` under `key` (`None` when it is missing).
fn feature_values(
    features: &HashMap<&[u8], &[u8]>,
    key: &str,
    kind: Kind,
    place: &Place<'_>,
    sparse: bool,
) -> std::result::Result<Option<Values>, String> {
    let Some(&feature) = features.get(key.as_bytes()) else {
        return Ok(None);
    };
    let found = match wire::kind(feature) {
        Ok(None) => return Ok(None),
        Ok(Some(k)) => k,
        Err(()) => return Err(format!("{}Unsupported datatype.", place.key(key))),
    };
    if found != kind {
        return Err(if sparse {
            format!(
                "{}Data types don't match. Expected type: {}, Actual type: {}",
                place.key(key),
                kind.dtype_name(),
                found.dtype_name()
            )
        } else {
            format!(
                "{}Data types don't match. Data type: {} but expected type: {}",
                place.key(key),
                found.dtype_name(),
                kind.dtype_name()
            )
        });
    }
    match wire::values(feature, kind) {
        Some(v) => Ok(Some(v)),
        None => Err(format!("{}Can't parse serialized Example.", place.key(key))),
    }
}

fn values_len(v: &Values) -> usize {
    match v {
        Values::Bytes(b) => b.len(),
        Values::Float(f) => f.len(),
        Values::Int64(i) => i.len(),
    }
}

/// Values of one kind being gathered into an output.
enum Column {
    Bytes(Vec<Bytes>),
    Float(Vec<f32>),
    Int64(Vec<i64>),
}

impl Column {
    fn new(kind: Kind) -> Self {
        match kind {
            Kind::Bytes => Column::Bytes(Vec::new()),
            Kind::Float => Column::Float(Vec::new()),
            Kind::Int64 => Column::Int64(Vec::new()),
        }
    }

    /// Appends `v` (of the column's kind).
    fn extend(&mut self, v: Values) {
        match (self, v) {
            (Column::Bytes(c), Values::Bytes(v)) => c.extend(v),
            (Column::Float(c), Values::Float(v)) => c.extend(v),
            (Column::Int64(c), Values::Int64(v)) => c.extend(v),
            _ => {}
        }
    }

    /// Appends elements `range` of `t` (of the column's dtype), `times` times.
    fn extend_from(
        &mut self,
        t: &Tensor,
        range: std::ops::Range<usize>,
        times: usize,
    ) -> Result<()> {
        for _ in 0..times {
            match self {
                Column::Bytes(c) => c.extend_from_slice(&t.strings()?[range.clone()]),
                Column::Float(c) => c.extend_from_slice(&t.values::<f32>()?[range.clone()]),
                Column::Int64(c) => c.extend_from_slice(&t.values::<i64>()?[range.clone()]),
            }
        }
        Ok(())
    }

    fn tensor(self, shape: Vec<usize>) -> Result<Tensor> {
        match self {
            Column::Bytes(c) => Tensor::from_strings(shape, c),
            Column::Float(c) => Tensor::from_vec(shape, c),
            Column::Int64(c) => Tensor::from_vec(shape, c),
        }
    }
}

/// The bytes one element of `kind` takes in an output (a string's handle and a guess of 16).
fn element_bytes(kind: Kind) -> u64 {
    match kind {
        Kind::Bytes => std::mem::size_of::<Bytes>() as u64 + 16,
        Kind::Float => 4,
        Kind::Int64 => 8,
    }
}

/// The padded shape string TensorFlow shows for a variable-length dense feature: `[?,2]`.
fn shown(shape: &[Option<usize>]) -> String {
    PartialShape::new(shape.to_vec()).to_string()
}

impl OpKernel for Parse {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let serialized = input(ctx, 0)?;
        if serialized.dtype() != DType::String {
            return Err(ctx.invalid(format!(
                "serialized must be strings, got {}",
                serialized.dtype()
            )));
        }
        let (sparse_keys, dense_keys, names, defaults_at) = if self.single_op {
            if serialized.rank() != 0 {
                return Err(ctx.invalid(format!(
                    "Expected serialized to be a scalar, got shape: {}",
                    serialized.shape()
                )));
            }
            (
                self.sparse_keys.clone(),
                self.dense_keys.clone(),
                Vec::new(),
                1,
            )
        } else {
            if serialized.rank() > 1 {
                return Err(ctx.invalid(format!(
                    "Expected serialized to be a scalar or vector, got shape: {}",
                    serialized.shape()
                )));
            }
            let names = input(ctx, 1)?;
            if names.num_elements() > 0 && names.shape() != serialized.shape() {
                return Err(ctx.invalid(format!(
                    "Expected names have the same shape as serialized: name.shape={}, \
                     serialized.shape={}",
                    names.shape(),
                    serialized.shape()
                )));
            }
            let names: Vec<String> = match names.dtype() {
                DType::String => names
                    .strings()?
                    .iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect(),
                _ => Vec::new(),
            };
            let sparse_keys = keys(ctx, 2, "sparse_keys", self.sparse.len())?;
            let dense_keys = keys(ctx, 3, "dense_keys", self.dense.len())?;
            let ragged = input(ctx, 4)?.num_elements().max(self.ragged);
            if ragged > 0 {
                return Err(ctx.named(Status::unimplemented(
                    "ragged features (tf.io.RaggedFeature) are not supported by tessera yet; \
                     parse them as VarLenFeature (sparse) instead",
                )));
            }
            (sparse_keys, dense_keys, names, 5)
        };
        if sparse_keys.len() != self.sparse.len() || dense_keys.len() != self.dense.len() {
            return Err(ctx.invalid(format!(
                "{} sparse_keys for {} sparse_types, {} dense_keys for {} dense types",
                sparse_keys.len(),
                self.sparse.len(),
                dense_keys.len(),
                self.dense.len()
            )));
        }
        let defaults: Vec<Tensor> = (0..self.dense.len())
            .map(|d| input(ctx, defaults_at + d))
            .collect::<Result<_>>()?;
        for (d, (cfg, def)) in self.dense.iter().zip(&defaults).enumerate() {
            let want = match cfg.kind {
                Kind::Bytes => DType::String,
                Kind::Float => DType::Float,
                Kind::Int64 => DType::Int64,
            };
            if def.dtype() != want {
                return Err(ctx.invalid(format!(
                    "dense_defaults[{d}] is {}, but Tdense[{d}] is {want}",
                    def.dtype()
                )));
            }
            if cfg.variable() {
                if def.num_elements() != 1 {
                    return Err(ctx.invalid(format!(
                        "dense_shape[{d}] is a variable length shape: {}, therefore \
                         def_value[{d}] must contain a single element (the padding \
                         element).  But its shape is: {}",
                        shown(&cfg.shape),
                        def.shape()
                    )));
                }
            } else if def.num_elements() > 0 {
                let dims: Vec<usize> = cfg.shape.iter().flatten().copied().collect();
                if def.dims() != dims.as_slice() {
                    return Err(ctx.invalid(format!(
                        "def_value[{d}].shape() == {} is not compatible with dense_shapes_[{d}] \
                         == {}",
                        def.shape(),
                        Shape::new(dims)
                    )));
                }
            }
        }

        let batch = serialized.rank() == 1;
        let examples = serialized.strings()?;
        let n = examples.len();
        let mut dense_values: Vec<Vec<Option<Values>>> =
            vec![Vec::with_capacity(n); self.dense.len()];
        let mut sparse_values: Vec<Vec<Option<Values>>> =
            vec![Vec::with_capacity(n); self.sparse.len()];
        for (e, example) in examples.iter().enumerate() {
            let name = names.get(e).map_or("<unknown>", String::as_str);
            let place = Place {
                batch: batch.then_some((name, e)),
            };
            let Some(found) = wire::features(example) else {
                return Err(ctx.invalid(format!(
                    "Could not parse example input, value: '{}'",
                    String::from_utf8_lossy(example)
                )));
            };
            // The last of repeated keys counts, as in TensorFlow.
            let features: HashMap<&[u8], &[u8]> = found.into_iter().collect();
            for (d, (cfg, key)) in self.dense.iter().zip(&dense_keys).enumerate() {
                let v = feature_values(&features, key, cfg.kind, &place, false)
                    .map_err(|m| ctx.invalid(m))?;
                match &v {
                    None if !cfg.variable() && defaults[d].num_elements() == 0 => {
                        return Err(ctx.invalid(place.required(key, cfg.kind)));
                    }
                    Some(v) if cfg.variable() && values_len(v) % cfg.stride.max(1) != 0 => {
                        let count = values_len(v);
                        return Err(ctx.invalid(if batch {
                            format!(
                                "{}Number of {} values is not a multiple of stride length. Saw \
                                 {count} values but output shape is: {}",
                                place.key(key),
                                cfg.kind.list_name(),
                                shown(&cfg.shape)
                            )
                        } else {
                            format!(
                                "Error while parsing feature with key {key}: number of \
                                 elements should be divisible by {}, found {count} instead",
                                cfg.stride
                            )
                        }));
                    }
                    Some(v) if !cfg.variable() && values_len(v) != cfg.stride => {
                        return Err(ctx.invalid(
                            if batch && cfg.kind == Kind::Bytes && values_len(v) > cfg.stride {
                                // TensorFlow reads strings into a slice of the output's size.
                                format!("{}Can't parse serialized Example.", place.key(key))
                            } else if batch {
                                format!(
                                    "{}Number of {} values != expected.  Values size: {} but \
                                 output shape: {}",
                                    place.key(key),
                                    cfg.kind.list_name(),
                                    values_len(v),
                                    shown(&cfg.shape)
                                )
                            } else {
                                format!(
                                    "{}Can't parse serialized Example: Some {}_list slice was not \
                                 parsed.",
                                    place.key(key),
                                    cfg.kind.list_name()
                                )
                            },
                        ));
                    }
                    _ => {}
                }
                dense_values[d].push(v);
            }
            for (s, (&kind, key)) in self.sparse.iter().zip(&sparse_keys).enumerate() {
                let v = feature_values(&features, key, kind, &place, true)
                    .map_err(|m| ctx.invalid(m))?;
                sparse_values[s].push(v);
            }
        }
        let lead: Vec<usize> = if batch { vec![n] } else { Vec::new() };

        for (s, (kind, per_example)) in self.sparse.iter().zip(sparse_values).enumerate() {
            let total: usize = per_example.iter().flatten().map(values_len).sum();
            let widest = per_example
                .iter()
                .flatten()
                .map(values_len)
                .max()
                .unwrap_or(0);
            let depth = lead.len() + 1;
            ctx.check_fits((total as u64) * (8 * depth as u64 + element_bytes(*kind)))?;
            let mut indices = Vec::with_capacity(total * depth);
            let mut column = Column::new(*kind);
            for (e, v) in per_example.into_iter().enumerate() {
                let Some(v) = v else { continue };
                for j in 0..values_len(&v) {
                    if batch {
                        indices.push(e as i64);
                    }
                    indices.push(j as i64);
                }
                column.extend(v);
            }
            let ns = self.sparse.len();
            ctx.set_output(s, Tensor::from_vec(vec![total, depth], indices)?);
            ctx.set_output(ns + s, column.tensor(vec![total])?);
            let mut shape: Vec<i64> = lead.iter().map(|&b| b as i64).collect();
            shape.push(widest as i64);
            ctx.set_output(2 * ns + s, Tensor::from_vec(vec![depth], shape)?);
        }

        let first_dense = 3 * self.sparse.len();
        for (d, (cfg, per_example)) in self.dense.iter().zip(dense_values).enumerate() {
            let def = &defaults[d];
            let rows = if cfg.variable() {
                per_example
                    .iter()
                    .flatten()
                    .map(|v| values_len(v) / cfg.stride.max(1))
                    .max()
                    .unwrap_or(0)
            } else {
                0
            };
            let mut shape = lead.clone();
            if cfg.variable() {
                shape.push(rows);
                shape.extend(cfg.shape[1..].iter().flatten());
            } else {
                shape.extend(cfg.shape.iter().flatten());
            }
            let per = if cfg.variable() {
                rows * cfg.stride
            } else {
                cfg.stride
            };
            let elements = (per as u64).saturating_mul(n.max(1) as u64);
            ctx.check_fits(elements.saturating_mul(element_bytes(cfg.kind)))?;
            let mut column = Column::new(cfg.kind);
            for v in per_example {
                let have = v.as_ref().map_or(0, values_len);
                match v {
                    Some(v) => column.extend(v),
                    None if !cfg.variable() => column.extend_from(def, 0..per, 1)?,
                    None => {}
                }
                if cfg.variable() {
                    column.extend_from(def, 0..1, per - have)?;
                }
            }
            ctx.set_output(first_dense + d, column.tensor(shape)?);
        }
        Ok(())
    }
}
