//! Lookup-table kernels (`tf.lookup`, vocabulary feature columns): `HashTableV2` and
//! `MutableHashTableV2` create a [`LookupTable`] in the device's resources and return its
//! handle; `LookupTableFindV2`, `LookupTableInsertV2`, `LookupTableImportV2`,
//! `LookupTableExportV2`, `LookupTableSizeV2`, `InitializeTableV2` and
//! `InitializeTableFromTextFileV2` work on the table behind a handle.
//!
//! The semantics are TensorFlow 2.21's (`lookup_table_op.{h,cc}`, `initializable_lookup_table.cc`,
//! `lookup_table_init_op.cc`, `lookup_util.cc`). A `HashTableV2` is written once: until an
//! initializer (`InitializeTableV2`, `LookupTableImportV2`, or a text file) runs, finding
//! fails with FAILED_PRECONDITION and its size is 0; a second initializer of the same number
//! of entries is a no-op, one of another number fails (a text file's never does), and a key
//! given two values fails. A `MutableHashTableV2` takes inserts (the last value wins), an
//! import replaces its contents, and a find takes one default or one per key. A text file is
//! read through the task's read confinement (`ctx.data_files()`, `[data] allowed_dirs`), one
//! entry per line: the key and value are the whole line (index -2), the line number plus
//! `offset` (-1) or a column split by `delimiter`; `vocab_size` reads that many lines and
//! fails on fewer.
//!
//! Key and value types: string, int64 or int32 keys; string, int64, int32, float, double or
//! bool values, as TensorFlow registers `HashTableV2`. Tables are stateful, so these kernels
//! are among the families that may wait (each takes the table's lock).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use super::queue::resource_name;
use super::variable::handle_input;
use super::{checked_elements, input};
use crate::error::{Code, Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::resource::Resource;
use crate::tensor::{DType, ResourceHandle, Shape, Tensor};

/// The `type_name` of a lookup table's resource handle.
pub const TABLE_TYPE_NAME: &str = "LookupInterface";

/// Returns the factory for a lookup-table op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "HashTableV2" => |n| CreateTable::create(n, false),
        "MutableHashTableV2" => |n| CreateTable::create(n, true),
        "LookupTableFindV2" => |_| super::stateless(find),
        "LookupTableInsertV2" => |_| super::stateless(insert),
        "LookupTableImportV2" => |_| super::stateless(import),
        "LookupTableExportV2" => |_| super::stateless(export),
        "LookupTableSizeV2" => |_| super::stateless(size),
        "InitializeTableV2" => |_| super::stateless(initialize),
        "InitializeTableFromTextFileV2" => FromTextFile::create,
        _ => return None,
    };
    Some(factory)
}

/// A key of a table (int32 keys are held widened).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Int(i64),
    Str(Bytes),
}

/// A value of a table.
#[derive(Clone, PartialEq)]
enum Val {
    I64(i64),
    I32(i32),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(Bytes),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Int(i) => write!(f, "{i}"),
            Key::Str(s) => f.write_str(&String::from_utf8_lossy(s)),
        }
    }
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::I64(v) => write!(f, "{v}"),
            Val::I32(v) => write!(f, "{v}"),
            Val::F32(v) => write!(f, "{v}"),
            Val::F64(v) => write!(f, "{v}"),
            Val::Bool(v) => write!(f, "{}", u8::from(*v)),
            Val::Str(s) => f.write_str(&String::from_utf8_lossy(s)),
        }
    }
}

/// The key dtypes and, for each, the value dtypes TensorFlow registers `HashTableV2` for.
fn supported(key: DType, value: DType) -> bool {
    use DType::*;
    match key {
        String => matches!(value, String | Int64 | Int32 | Float | Double | Bool),
        Int64 => matches!(value, String | Int64 | Int32 | Float | Double),
        Int32 => matches!(value, String | Int32 | Float | Double),
        _ => false,
    }
}

/// TensorFlow's name of a dtype in its messages (`DataTypeString`).
fn tf_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Float => "float",
        DType::Double => "double",
        other => other.name(),
    }
}

fn keys_of(t: &Tensor) -> Result<Vec<Key>> {
    Ok(match t.dtype() {
        DType::Int64 => t.values::<i64>()?.iter().map(|&k| Key::Int(k)).collect(),
        DType::Int32 => t
            .values::<i32>()?
            .iter()
            .map(|&k| Key::Int(i64::from(k)))
            .collect(),
        _ => t.strings()?.iter().cloned().map(Key::Str).collect(),
    })
}

fn vals_of(t: &Tensor) -> Result<Vec<Val>> {
    Ok(match t.dtype() {
        DType::Int64 => t.values::<i64>()?.iter().map(|&v| Val::I64(v)).collect(),
        DType::Int32 => t.values::<i32>()?.iter().map(|&v| Val::I32(v)).collect(),
        DType::Float => t.values::<f32>()?.iter().map(|&v| Val::F32(v)).collect(),
        DType::Double => t.values::<f64>()?.iter().map(|&v| Val::F64(v)).collect(),
        DType::Bool => t.values::<bool>()?.iter().map(|&v| Val::Bool(v)).collect(),
        _ => t.strings()?.iter().cloned().map(Val::Str).collect(),
    })
}

/// A tensor of `dtype` and `shape` holding `keys`.
fn key_tensor(dtype: DType, shape: impl Into<Shape>, keys: Vec<Key>) -> Result<Tensor> {
    let ints = || {
        keys.iter()
            .map(|k| if let Key::Int(i) = k { *i } else { 0 })
    };
    match dtype {
        DType::Int64 => Tensor::from_vec(shape, ints().collect::<Vec<_>>()),
        DType::Int32 => Tensor::from_vec(shape, ints().map(|i| i as i32).collect::<Vec<_>>()),
        _ => Tensor::from_strings(
            shape,
            keys.into_iter()
                .map(|k| match k {
                    Key::Str(s) => s,
                    Key::Int(i) => Bytes::from(i.to_string()),
                })
                .collect(),
        ),
    }
}

/// A tensor of `dtype` and `shape` holding `vals`.
fn val_tensor(dtype: DType, shape: impl Into<Shape>, vals: Vec<Val>) -> Result<Tensor> {
    macro_rules! collect {
        ($variant:ident) => {
            Tensor::from_vec(
                shape,
                vals.into_iter()
                    .map(|v| match v {
                        Val::$variant(x) => x,
                        _ => Default::default(),
                    })
                    .collect::<Vec<_>>(),
            )
        };
    }
    match dtype {
        DType::Int64 => collect!(I64),
        DType::Int32 => collect!(I32),
        DType::Float => collect!(F32),
        DType::Double => collect!(F64),
        DType::Bool => collect!(Bool),
        _ => Tensor::from_strings(
            shape,
            vals.into_iter()
                .map(|v| match v {
                    Val::Str(s) => s,
                    other => Bytes::from(other.to_string()),
                })
                .collect(),
        ),
    }
}

/// A hash table in a device's resources: TensorFlow's `HashTable` (written once, by an
/// initializer) or `MutableHashTableOfScalars`.
pub struct LookupTable {
    key: DType,
    value: DType,
    mutable: bool,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    /// Whether an initializer has run (always, for a mutable table).
    initialized: bool,
    map: HashMap<Key, Val>,
}

impl Resource for LookupTable {
    fn type_name(&self) -> &'static str {
        "lookup table"
    }
}

impl LookupTable {
    fn new(key: DType, value: DType, mutable: bool) -> Self {
        LookupTable {
            key,
            value,
            mutable,
            state: RwLock::new(State {
                initialized: mutable,
                map: HashMap::new(),
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// TensorFlow's `InitializableLookupTable::Initialize` with `total` entries offered: a
    /// no-op when already initialized with as many entries, FAILED_PRECONDITION when with
    /// another number; else every pair inserted, a key given two values refused.
    fn initialize(&self, ctx: &OpContext<'_>, total: usize, pairs: Vec<(Key, Val)>) -> Result<()> {
        let mut state = self.write();
        if state.initialized {
            if total == state.map.len() {
                return Ok(());
            }
            return Err(ctx.named(Status::failed_precondition(
                "Table was already initialized with different data.",
            )));
        }
        let mut map = HashMap::with_capacity(pairs.len());
        for (k, v) in pairs {
            match map.get(&k) {
                Some(old) if *old != v => {
                    return Err(ctx.named(Status::failed_precondition(format!(
                        "HashTable has different value for same key. Key {k} has {old} and \
                         trying to add value {v}"
                    ))));
                }
                Some(_) => {}
                None => {
                    map.insert(k, v);
                }
            }
        }
        state.map = map;
        state.initialized = true;
        Ok(())
    }
}

/// HashTableV2 / MutableHashTableV2: creates the table (or finds the one already there) and
/// outputs its handle.
struct CreateTable {
    container: String,
    name: String,
    key: DType,
    value: DType,
    mutable: bool,
}

impl CreateTable {
    fn create(node: &NodeDef, mutable: bool) -> Result<Arc<dyn OpKernel>> {
        let (container, name) = resource_name(node)?;
        let key = attr::dtype(node, "key_dtype")?;
        let value = attr::dtype(node, "value_dtype")?;
        if !supported(key, value) {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op {}): no CPU kernel for a table of {} keys and {} values; keys \
                 may be string, int64 or int32, values string, int64, int32, float, double or \
                 bool (bool only with string keys, string, int32, float or double with int32 \
                 keys)",
                node.name,
                node.op,
                tf_name(key),
                tf_name(value)
            )));
        }
        Ok(Arc::new(CreateTable {
            container,
            name,
            key,
            value,
            mutable,
        }))
    }
}

impl OpKernel for CreateTable {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let table = ctx
            .resources
            .lookup_or_create::<LookupTable>(&self.container, &self.name, || {
                Ok(LookupTable::new(self.key, self.value, self.mutable))
            })
            .map_err(|e| ctx.named(e))?;
        if table.key != self.key || table.value != self.value || table.mutable != self.mutable {
            return Err(ctx.invalid(format!(
                "Conflicting key/value dtypes {}->{} with {}-{} for table {}",
                tf_name(self.key),
                tf_name(self.value),
                tf_name(table.key),
                tf_name(table.value),
                self.name
            )));
        }
        ctx.set_output(
            0,
            Tensor::resource(ResourceHandle {
                device: ctx.device.to_string(),
                container: self.container.clone(),
                name: self.name.clone(),
                type_name: TABLE_TYPE_NAME.to_string(),
            }),
        );
        Ok(())
    }
}

/// The table behind input 0, or an error naming the node and the table.
fn table(ctx: &OpContext<'_>) -> Result<(ResourceHandle, Arc<LookupTable>)> {
    let h = handle_input(ctx, 0)?;
    match ctx.resources.lookup::<LookupTable>(&h.container, &h.name) {
        Ok(t) => Ok((h, t)),
        Err(e) if e.code() == Code::NotFound => Err(ctx.named(Status::not_found(format!(
            "lookup table `{}` does not exist on {}; run its HashTableV2 or \
             MutableHashTableV2 op in this step or an earlier one",
            h.name, ctx.device
        )))),
        Err(e) => Err(ctx.invalid(e.message())),
    }
}

/// TensorFlow's `MatchSignature` for a table op: inputs (resource, key, value) and
/// `outputs`, against the table's types.
fn match_signature(
    ctx: &OpContext<'_>,
    table: &LookupTable,
    have: [DType; 2],
    outputs: &[DType],
    expected_outputs: &[DType],
) -> Result<()> {
    if have == [table.key, table.value] && outputs == expected_outputs {
        return Ok(());
    }
    let names = |d: &[DType]| d.iter().map(|&d| tf_name(d)).collect::<Vec<_>>().join(", ");
    Err(ctx.invalid(format!(
        "Signature mismatch, have: resource, {}->{} expected: resource, {}->{}",
        names(&have),
        names(outputs),
        names(&[table.key, table.value]),
        names(expected_outputs)
    )))
}

/// The dtype of the node's attr `name`, or `fallback` when it has none.
fn attr_or(ctx: &OpContext<'_>, name: &str, fallback: DType) -> DType {
    attr::dtype(ctx.node(), name).unwrap_or(fallback)
}

/// LookupTableFindV2(table, keys, default_value): each key's value, or the default.
fn find(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, table) = table(ctx)?;
    let (keys, default) = (input(ctx, 1)?, input(ctx, 2)?);
    let out = attr_or(ctx, "Tout", default.dtype());
    match_signature(
        ctx,
        &table,
        [keys.dtype(), default.dtype()],
        &[out],
        &[table.value],
    )?;
    let state = table.read();
    if !state.initialized {
        return Err(ctx.named(Status::failed_precondition("Table not initialized.")));
    }
    if default.rank() != 0 && default.shape() != keys.shape() {
        return Err(ctx.invalid(format!(
            "Expected shape [] or {} for default value, got {}",
            keys.shape(),
            default.shape()
        )));
    }
    checked_elements(ctx, keys.dims())?;
    let defaults = vals_of(&default)?;
    // TensorFlow's static table takes the first default for every key; the mutable one each
    // key's own when there is one per key.
    let per_key = table.mutable && defaults.len() == keys.num_elements() && default.rank() > 0;
    let found: Vec<Val> = keys_of(&keys)?
        .iter()
        .enumerate()
        .map(|(i, k)| match state.map.get(k) {
            Some(v) => v.clone(),
            None => defaults[if per_key { i } else { 0 }].clone(),
        })
        .collect();
    drop(state);
    ctx.set_output(0, val_tensor(table.value, keys.shape().clone(), found)?);
    Ok(())
}

/// The checks TensorFlow makes of keys and values given to a table (`CheckKeyAndValueTensors`
/// with scalar keys and values): the same shape.
fn check_pairs(ctx: &OpContext<'_>, keys: &Tensor, values: &Tensor) -> Result<()> {
    if keys.shape() != values.shape() {
        return Err(ctx.invalid(format!(
            "Expected shape {} for value, got {}",
            keys.shape(),
            values.shape()
        )));
    }
    Ok(())
}

/// The (key, value) pairs of two tensors of the same shape.
fn pairs(keys: &Tensor, values: &Tensor) -> Result<Vec<(Key, Val)>> {
    Ok(keys_of(keys)?.into_iter().zip(vals_of(values)?).collect())
}

/// LookupTableInsertV2(table, keys, values): a mutable table takes each pair (the last value
/// of a key wins); a static one refuses.
fn insert(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, table) = table(ctx)?;
    let (keys, values) = (input(ctx, 1)?, input(ctx, 2)?);
    match_signature(ctx, &table, [keys.dtype(), values.dtype()], &[], &[])?;
    if !table.mutable {
        return Err(ctx.named(Status::unimplemented(
            "Insert not supported by InitializableLookupTable implementations",
        )));
    }
    check_pairs(ctx, &keys, &values)?;
    let pairs = pairs(&keys, &values)?;
    table.write().map.extend(pairs);
    Ok(())
}

/// LookupTableImportV2(table, keys, values): a static table is initialized with the pairs; a
/// mutable one's contents are replaced by them.
fn import(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, table) = table(ctx)?;
    let (keys, values) = (input(ctx, 1)?, input(ctx, 2)?);
    match_signature(ctx, &table, [keys.dtype(), values.dtype()], &[], &[])?;
    check_pairs(ctx, &keys, &values)?;
    let pairs = pairs(&keys, &values)?;
    if table.mutable {
        table.write().map = pairs.into_iter().collect();
        return Ok(());
    }
    table.initialize(ctx, keys.num_elements(), pairs)
}

/// LookupTableExportV2(table) -> (keys, values): every entry, in no particular order.
fn export(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, table) = table(ctx)?;
    let want = [
        attr_or(ctx, "Tkeys", table.key),
        attr_or(ctx, "Tvalues", table.value),
    ];
    if want != [table.key, table.value] {
        return Err(ctx.invalid(format!(
            "the table holds {} keys and {} values, this node exports {} and {}",
            tf_name(table.key),
            tf_name(table.value),
            tf_name(want[0]),
            tf_name(want[1])
        )));
    }
    let state = table.read();
    if !state.initialized {
        return Err(ctx.named(Status::aborted("HashTable is not initialized.")));
    }
    let n = state.map.len();
    checked_elements(ctx, &[n, 2])?;
    let (keys, vals): (Vec<Key>, Vec<Val>) = state
        .map
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .unzip();
    drop(state);
    ctx.set_output(0, key_tensor(table.key, vec![n], keys)?);
    ctx.set_output(1, val_tensor(table.value, vec![n], vals)?);
    Ok(())
}

/// LookupTableSizeV2(table): the number of entries (0 before a static table is initialized).
fn size(ctx: &mut OpContext<'_>) -> Result<()> {
    let (_, table) = table(ctx)?;
    let n = table.read().map.len() as i64;
    ctx.set_output(0, Tensor::from_vec(Shape::scalar(), vec![n])?);
    Ok(())
}

/// The table behind input 0, refused unless it takes initializers (a static one).
fn initializable(ctx: &OpContext<'_>) -> Result<Arc<LookupTable>> {
    let (h, table) = table(ctx)?;
    if table.mutable {
        let container = if h.container.is_empty() {
            "localhost"
        } else {
            &h.container
        };
        return Err(ctx.invalid(format!("Table {container} {} is not initializable", h.name)));
    }
    Ok(table)
}

/// InitializeTableV2(table, keys, values): initializes a static table from two vectors.
fn initialize(ctx: &mut OpContext<'_>) -> Result<()> {
    let table = initializable(ctx)?;
    let (keys, values) = (input(ctx, 1)?, input(ctx, 2)?);
    match_signature(ctx, &table, [keys.dtype(), values.dtype()], &[], &[])?;
    if keys.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Keys must be a vector, but received shape{}",
            keys.shape()
        )));
    }
    if values.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Values must be a vector, but received shape{}",
            values.shape()
        )));
    }
    if keys.num_elements() != values.num_elements() {
        return Err(ctx.invalid(format!(
            "Keys and values must have the same size {} vs {}",
            keys.num_elements(),
            values.num_elements()
        )));
    }
    let pairs = pairs(&keys, &values)?;
    table.initialize(ctx, keys.num_elements(), pairs)
}

/// What a text file's line gives a key or value: the whole line, its number, or a column.
const WHOLE_LINE: i64 = -2;
const LINE_NUMBER: i64 = -1;

/// InitializeTableFromTextFileV2(table, filename): initializes a static table from a text
/// file, one entry per line.
struct FromTextFile {
    key_index: i64,
    value_index: i64,
    vocab_size: i64,
    delimiter: u8,
    offset: i64,
}

impl FromTextFile {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let delimiter = attr::string_or(node, "delimiter", "\t")?;
        let &[delimiter] = delimiter.as_bytes() else {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op {}): delimiter should be only 1 char",
                node.name, node.op
            )));
        };
        Ok(Arc::new(FromTextFile {
            key_index: attr::int(node, "key_index")?,
            value_index: attr::int(node, "value_index")?,
            vocab_size: attr::int_or(node, "vocab_size", -1)?,
            delimiter,
            offset: attr::int_or(node, "offset", 0)?,
        }))
    }

    /// TensorFlow's checks of the indices against the table's types.
    fn check_indices(&self, ctx: &OpContext<'_>, table: &LookupTable) -> Result<()> {
        let integer = |d: DType| matches!(d, DType::Int32 | DType::Int64);
        let message = if self.key_index == LINE_NUMBER && table.key != DType::Int64 {
            format!(
                "Key index for line number requires table key dtype of int64, got {}",
                tf_name(table.key)
            )
        } else if self.key_index == WHOLE_LINE && !integer(table.key) && table.key != DType::String
        {
            format!(
                "Key index for whole line requires string or integer table key, got {}",
                tf_name(table.key)
            )
        } else if self.value_index == LINE_NUMBER && table.value != DType::Int64 {
            format!(
                "Value index for line number requires table value dtype of int64, got {}",
                tf_name(table.value)
            )
        } else if self.value_index == WHOLE_LINE
            && !integer(table.value)
            && table.value != DType::String
        {
            format!(
                "Value index for whole line requires table value dtype of integer or string, \
                 got {}",
                tf_name(table.value)
            )
        } else {
            return Ok(());
        };
        Err(ctx.invalid(message))
    }

    /// The entries of the file's `text` (TensorFlow's `TextFileLineIterator`); `file` names
    /// it in messages.
    fn entries(
        &self,
        ctx: &OpContext<'_>,
        table: &LookupTable,
        file: &str,
        text: &[u8],
    ) -> Result<Vec<(Key, Val)>> {
        let mut entries = Vec::new();
        let mut pos = 0usize;
        let mut line_no = 0i64;
        let split = self.key_index.max(self.value_index) >= 0;
        loop {
            if pos >= text.len() {
                if self.vocab_size != -1 && line_no != self.vocab_size {
                    return Err(ctx.invalid(format!(
                        "Invalid vocab_size in {file}: expected {} but got {line_no}",
                        self.vocab_size
                    )));
                }
                if line_no == 0 {
                    return Err(ctx.named(Status::out_of_range("Read less bytes than requested")));
                }
                return Ok(entries);
            }
            let end = text[pos..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(text.len(), |e| pos + e);
            let mut line = &text[pos..end];
            pos = end + 1;
            if let [head @ .., b'\r'] = line {
                line = head;
            }
            if self.vocab_size != -1 && line_no >= self.vocab_size {
                if line_no == 0 {
                    return Err(ctx.named(Status::out_of_range(format!(
                        "Finished reading 0 of lines from {file}"
                    ))));
                }
                return Ok(entries);
            }
            let shown = String::from_utf8_lossy(line);
            if line.is_empty() {
                return Err(ctx.invalid(format!(
                    "Invalid content in {file}: empty line found at position {pos}."
                )));
            }
            let tokens: Vec<&[u8]> = if split {
                line.split(|&b| b == self.delimiter).collect()
            } else {
                Vec::new()
            };
            let expected = (self.key_index.max(self.value_index) + 1).max(0) as usize;
            if split && tokens.len() < expected {
                return Err(ctx.invalid(format!(
                    "Invalid number of columns in {file} line {line_no} ({shown}) : expected at \
                     least {expected} got {}",
                    tokens.len()
                )));
            }
            let field = |index: i64, dtype: DType| -> Result<Val> {
                if index == LINE_NUMBER {
                    return Ok(Val::I64(line_no + self.offset));
                }
                let token = if index == WHOLE_LINE {
                    line
                } else {
                    tokens[index as usize]
                };
                self.parse(ctx, token, line_no, dtype)
            };
            let key = match field(self.key_index, table.key)? {
                Val::I64(i) => Key::Int(i),
                Val::I32(i) => Key::Int(i64::from(i)),
                Val::Str(s) => Key::Str(s),
                _ => return Err(ctx.invalid("table keys must be string, int64 or int32")),
            };
            let value = field(self.value_index, table.value)?;
            entries.push((key, value));
            line_no += 1;
        }
    }

    /// A field as `dtype` (TensorFlow's `safe_strto*`: surrounding spaces allowed).
    fn parse(&self, ctx: &OpContext<'_>, token: &[u8], line: i64, dtype: DType) -> Result<Val> {
        let text = String::from_utf8_lossy(token);
        let trimmed = text.trim();
        let bad = || {
            ctx.invalid(format!(
                "Field {text} in line {line} is not a valid {}.",
                tf_name(dtype)
            ))
        };
        Ok(match dtype {
            DType::Int32 => {
                let v: i32 = trimmed.parse().map_err(|_| bad())?;
                Val::I32(v.wrapping_add(self.offset as i32))
            }
            DType::Int64 => Val::I64(trimmed.parse().map_err(|_| bad())?),
            DType::Float => Val::F32(trimmed.parse().map_err(|_| bad())?),
            DType::Double => Val::F64(trimmed.parse().map_err(|_| bad())?),
            DType::Bool => {
                return Err(ctx.invalid(format!("Data type {} not supported.", tf_name(dtype))))
            }
            _ => Val::Str(Bytes::copy_from_slice(token)),
        })
    }
}

impl OpKernel for FromTextFile {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let table = initializable(ctx)?;
        let filename = input(ctx, 1)?;
        if filename.dtype() != DType::String || filename.rank() != 0 {
            return Err(ctx.invalid(format!(
                "filename should be a single string, but got {}",
                filename.shape()
            )));
        }
        let file = String::from_utf8_lossy(&filename.strings()?[0]).into_owned();
        if file.is_empty() {
            return Err(ctx.invalid("filename cannot be empty."));
        }
        self.check_indices(ctx, &table)?;
        let target = ctx.data_files().resolve(&file).map_err(|e| ctx.named(e))?;
        let text = target.read().map_err(|e| {
            let status = if e.kind() == std::io::ErrorKind::NotFound {
                Status::not_found(format!("{file}; No such file or directory"))
            } else {
                Status::unknown(format!("{file}: {e}"))
            };
            ctx.named(status)
        })?;
        ctx.check_fits(text.len() as u64)?;
        let entries = self.entries(ctx, &table, &file, &text)?;
        // A table already initialized keeps its entries: TensorFlow ignores a text file's
        // FAILED_PRECONDITION then.
        match table.initialize(ctx, entries.len(), entries) {
            Err(e) if e.code() == Code::FailedPrecondition && table.read().initialized => Ok(()),
            other => other,
        }
    }
}
