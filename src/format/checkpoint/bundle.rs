//! Tensor bundles (TensorFlow's checkpoint format V2): writing a one-shard bundle, reading any
//! bundle back with every checksum verified, and merging shard bundles into one.
//!
//! A bundle at prefix `P` is `P.index` (a [`table`](super::table) mapping `""` to a
//! `BundleHeaderProto` and each tensor name to a `BundleEntryProto`) and the data files
//! `P.data-0000i-of-0000N` holding the tensors' bytes back to back: fixed-size elements in
//! little-endian order; strings as TensorFlow lays them out,
//!
//! ```text
//! varint64 len_0 … varint64 len_n-1 | masked CRC32C of the lengths (fixed32) | bytes_0 … bytes_n-1
//! ```
//!
//! where the lengths' checksum, and the entry's `crc32c`, cover each length as a 4-byte
//! little-endian integer (8 bytes past 4 GiB), not its varint bytes. The entry's `crc32c` is
//! the masked CRC32C of what TensorFlow feeds it: the raw bytes for fixed-size tensors; for
//! strings the lengths (as above), the stored length checksum, then the string bytes.
//! Variants (an iterator's position) are stored element after element as TensorFlow's
//! `WriteVariantTensor` does: the varint64 length of the element's serialized
//! `VariantTensorDataProto`, the proto, then the proto's masked CRC32C; only variant values
//! that are [`StoredVariant`]s can be saved.
//!
//! A partitioned variable is saved as slices (TensorFlow's `BundleWriter::AddSlice`): its
//! name's entry holds only the dtype, the full shape and the list of slices, and each slice is
//! an ordinary entry under the key [`slice_key`] gives it. A reader assembles any slice, or the
//! whole tensor, from whichever stored slices overlap it ([`BundleReader::read_slice`]), so a
//! restore may use another partitioning than the save; a merge joins the slice lists of the
//! shards.
//!
//! Writes are atomic: each file is written to `<name>.tempstate<random>`, synced, then renamed,
//! so a crash leaves either the old file or the whole new one.
//!
//! Every file is reached through a [`Files`]: the `*_with` forms take the task's (confined to
//! `[checkpoints] allowed_dirs` when set; the checkpoint kernels use them), the others reach any
//! path, for a client's own process.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message;

use super::slice::{copy_overlap, intersect, slice_key, ShapeAndSlice, TensorSlice};
use super::table::{self, io_error, mask_crc, unmask_crc, Table};
use crate::error::{Result, Status};
use crate::format::files::Files;
use crate::proto::bundle_header_proto::Endianness;
use crate::proto::{BundleEntryProto, BundleHeaderProto, VersionDef};
use crate::tensor::{DType, Shape, Tensor};

/// TensorFlow's `kTensorBundleVersion`: the producer version written in every header.
pub const BUNDLE_VERSION: i32 = 1;
/// TensorFlow's `kTensorBundleMinConsumer`.
pub const BUNDLE_MIN_CONSUMER: i32 = 0;

/// Returns `P.index`.
pub fn index_filename(prefix: &str) -> PathBuf {
    PathBuf::from(format!("{prefix}.index"))
}

/// Returns `P.data-0000<shard>-of-0000<num_shards>` (five digits each, as TensorFlow names them).
pub fn data_filename(prefix: &str, shard: i32, num_shards: i32) -> PathBuf {
    PathBuf::from(format!("{prefix}.data-{shard:05}-of-{num_shards:05}"))
}

/// Writes `bytes` to `path` atomically: a temp file next to it, synced, then renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(&Files::ambient(), path, bytes)
}

/// [`write_atomic`] through `files`: a path outside them is refused before anything is written.
pub fn write_atomic_with(files: &Files, path: &Path, bytes: &[u8]) -> Result<()> {
    let target = files.resolve(path)?;
    let temp = files.resolve(format!(
        "{}.tempstate{}",
        path.display(),
        rand::random::<u64>()
    ))?;
    let parent = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(|dir| files.resolve(dir))
        .transpose()?;
    let write = || -> std::io::Result<()> {
        let mut file = temp.create()?;
        file.write_all(bytes)?;
        file.sync_all()?;
        temp.rename_to(&target)?;
        // Sync the directory too, so the rename itself survives a crash.
        if let Some(dir) = &parent {
            dir.sync_dir()?;
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = temp.remove_file();
        Status::new(
            match e.kind() {
                std::io::ErrorKind::PermissionDenied => crate::Code::PermissionDenied,
                std::io::ErrorKind::NotFound => crate::Code::NotFound,
                _ => crate::Code::Internal,
            },
            format!("cannot write checkpoint file {}: {e}", path.display()),
        )
    })
}

/// Creates the directory that will hold the files of `prefix` through `files`, or fails naming
/// it.
pub fn create_prefix_dir(files: &Files, prefix: &str) -> Result<()> {
    let Some(dir) = Path::new(prefix)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    else {
        return Ok(());
    };
    files.resolve(dir)?.create_dir_all().map_err(|e| {
        Status::new(
            match e.kind() {
                std::io::ErrorKind::PermissionDenied => crate::Code::PermissionDenied,
                _ => crate::Code::FailedPrecondition,
            },
            format!(
                "cannot create checkpoint directory {}: {e}; choose a checkpoint directory \
                 this process can write",
                dir.display()
            ),
        )
    })
}

/// A variant value that can be saved in a checkpoint: its `VariantTensorDataProto`, as
/// TensorFlow encodes a variant for storage. Kernels that save state (an iterator's
/// `SerializeIterator`) output these; reading a variant entry gives them back.
#[derive(Clone, Debug)]
pub struct StoredVariant(pub crate::proto::VariantTensorDataProto);

/// Appends a tensor's stored bytes to `out`; returns the unmasked CRC32C TensorFlow records.
fn encode_tensor(t: &Tensor, out: &mut Vec<u8>) -> Result<u32> {
    if t.dtype() == DType::Variant {
        let mut crc = 0u32;
        for v in t.variants()? {
            let stored = v.clone().downcast::<StoredVariant>().map_err(|_| {
                Status::invalid_argument(
                    "this variant tensor cannot be saved in a checkpoint (only an iterator's \
                     serialized state can)",
                )
            })?;
            let proto = prost::Message::encode_to_vec(&stored.0);
            let mut len = Vec::new();
            table::put_varint(&mut len, proto.len() as u64);
            let checksum = mask_crc(crc32c::crc32c(&proto)).to_le_bytes();
            for part in [&len[..], &proto[..], &checksum[..]] {
                out.extend_from_slice(part);
                crc = crc32c::crc32c_append(crc, part);
            }
        }
        return Ok(crc);
    }
    if t.dtype() == DType::String {
        let strings = t.strings()?;
        let mut crc = 0u32;
        for s in strings {
            table::put_varint(out, s.len() as u64);
            crc = extend_length_crc(crc, s.len() as u64);
        }
        let length_checksum = mask_crc(crc).to_le_bytes();
        out.extend_from_slice(&length_checksum);
        crc = crc32c::crc32c_append(crc, &length_checksum);
        for s in strings {
            out.extend_from_slice(s);
            crc = crc32c::crc32c_append(crc, s);
        }
        return Ok(crc);
    }
    let bytes = t.bytes().ok_or_else(|| {
        Status::invalid_argument(format!(
            "a {} tensor cannot be saved in a checkpoint",
            t.dtype()
        ))
    })?;
    out.extend_from_slice(bytes);
    Ok(crc32c::crc32c(bytes))
}

/// Extends a string tensor's CRC with one length, as TensorFlow does: 4 bytes when it fits.
fn extend_length_crc(crc: u32, len: u64) -> u32 {
    match u32::try_from(len) {
        Ok(l) => crc32c::crc32c_append(crc, &l.to_le_bytes()),
        Err(_) => crc32c::crc32c_append(crc, &len.to_le_bytes()),
    }
}

/// Serializes `entries` (name → entry) under a header of `num_shards` as an index table.
fn build_index(num_shards: i32, entries: &BTreeMap<Vec<u8>, BundleEntryProto>) -> Result<Vec<u8>> {
    let header = BundleHeaderProto {
        num_shards,
        endianness: Endianness::Little as i32,
        version: Some(VersionDef {
            producer: BUNDLE_VERSION,
            min_consumer: BUNDLE_MIN_CONSUMER,
            bad_consumers: vec![],
        }),
    };
    let mut rows = Vec::with_capacity(entries.len() + 1);
    rows.push((Vec::new(), header.encode_to_vec()));
    for (key, entry) in entries {
        rows.push((key.clone(), entry.encode_to_vec()));
    }
    table::build_table(&rows, table::DEFAULT_BLOCK_SIZE)
}

/// Writes `tensors` as a one-shard bundle at `prefix` (creating its directory). Names must be
/// unique and non-empty; they are stored sorted, whatever the order given.
pub fn write_bundle(prefix: &str, tensors: &[(String, Tensor)]) -> Result<()> {
    write_bundle_with(&Files::ambient(), prefix, tensors)
}

/// [`write_bundle`] through `files`: a prefix outside them is refused before anything is
/// created or written.
pub fn write_bundle_with(files: &Files, prefix: &str, tensors: &[(String, Tensor)]) -> Result<()> {
    let specs: Vec<SaveSpec> = tensors
        .iter()
        .map(|(name, tensor)| SaveSpec::whole(name, tensor.clone()))
        .collect();
    write_specs_with(files, prefix, &specs)
}

/// One tensor to save: a whole tensor, or one slice of a partitioned variable (TensorFlow's
/// `SaveSpec`).
#[derive(Clone, Debug)]
pub struct SaveSpec {
    /// The name the checkpoint stores it under (the full variable's, for a slice).
    pub name: String,
    /// The slice the tensor holds; `None` for a whole tensor.
    pub slice: Option<ShapeAndSlice>,
    /// The values.
    pub tensor: Tensor,
}

impl SaveSpec {
    /// A whole tensor.
    pub fn whole(name: impl Into<String>, tensor: Tensor) -> Self {
        Self {
            name: name.into(),
            slice: None,
            tensor,
        }
    }

    /// Slice `slice` of variable `name`: `tensor` must have the slice's shape.
    pub fn slice(name: impl Into<String>, slice: ShapeAndSlice, tensor: Tensor) -> Self {
        Self {
            name: name.into(),
            slice: Some(slice),
            tensor,
        }
    }
}

/// Writes `specs` as a one-shard bundle at `prefix`; see [`write_specs_with`].
pub fn write_specs(prefix: &str, specs: &[SaveSpec]) -> Result<()> {
    write_specs_with(&Files::ambient(), prefix, specs)
}

/// Writes `specs` as a one-shard bundle at `prefix` through `files`, as TensorFlow's `SaveV2`:
/// whole tensors under their names, slices under their slice keys with the variable's entry
/// listing them (a slice that is the whole variable is saved as a whole tensor). A name given
/// twice, a slice given twice or overlapping another, or slices of one variable that disagree
/// on its dtype or full shape are INVALID_ARGUMENT, before anything is written.
pub fn write_specs_with(files: &Files, prefix: &str, specs: &[SaveSpec]) -> Result<()> {
    let data_path = data_filename(prefix, 0, 1);
    let index_path = index_filename(prefix);
    files.resolve(&data_path)?;
    files.resolve(&index_path)?;
    let mut data = Vec::new();
    let mut entries: BTreeMap<Vec<u8>, BundleEntryProto> = BTreeMap::new();
    for spec in specs {
        let name = &spec.name;
        let tensor = &spec.tensor;
        if name.is_empty() {
            return Err(Status::invalid_argument(
                "a checkpoint tensor name must not be empty (the empty key holds the header)",
            ));
        }
        let bad = |what: String| {
            Status::invalid_argument(format!("tensor `{name}` for checkpoint {prefix}: {what}"))
        };
        let key = match &spec.slice {
            Some(s) => {
                if tensor.shape() != &s.slice_shape() {
                    return Err(bad(format!(
                        "Slice in shape_and_slice specification does not match the shape of \
                         the tensor to save: \"{s}\", tensor: {}",
                        tensor.shape()
                    )));
                }
                if s.is_whole() {
                    name.as_bytes().to_vec()
                } else {
                    let whole = entries.get(name.as_bytes());
                    if whole.is_some_and(|e| e.slices.is_empty()) {
                        return Err(bad("it is given both whole and as slices".into()));
                    }
                    let full = entries.entry(name.as_bytes().to_vec()).or_insert_with(|| {
                        BundleEntryProto {
                            dtype: tensor.dtype().to_proto() as i32,
                            shape: Some(s.full_shape.to_proto()),
                            ..Default::default()
                        }
                    });
                    add_slice(full, tensor.dtype(), s).map_err(bad)?;
                    slice_key(name, &s.slice)
                }
            }
            None => name.as_bytes().to_vec(),
        };
        if entries.contains_key(&key) {
            return Err(bad(
                "it is given twice (or both whole and as slices); names must be unique".into(),
            ));
        }
        let offset = data.len();
        let crc =
            encode_tensor(tensor, &mut data).map_err(|e| e.context(format!("tensor `{name}`")))?;
        entries.insert(
            key,
            BundleEntryProto {
                dtype: tensor.dtype().to_proto() as i32,
                shape: Some(tensor.shape().to_proto()),
                shard_id: 0,
                offset: offset as i64,
                size: (data.len() - offset) as i64,
                crc32c: mask_crc(crc),
                slices: vec![],
            },
        );
    }
    create_prefix_dir(files, prefix)?;
    write_atomic_with(files, &data_path, &data)?;
    write_atomic_with(files, &index_path, &build_index(1, &entries)?)
}

/// Lists slice `s` of a `dtype` variable in its entry `full`: the entry must be of that dtype
/// and full shape, and the slice must not overlap one listed.
fn add_slice(
    full: &mut BundleEntryProto,
    dtype: DType,
    s: &ShapeAndSlice,
) -> std::result::Result<(), String> {
    if full.dtype != dtype.to_proto() as i32 {
        return Err(format!(
            "its slices disagree on the dtype: {} and {dtype}",
            DType::from_i32(full.dtype).map_or_else(|_| full.dtype.to_string(), |d| d.to_string())
        ));
    }
    let shape = full.shape.clone().unwrap_or_default();
    if shape != s.full_shape.to_proto() {
        return Err(format!(
            "its slices disagree on the full shape: {} and {}",
            Shape::from_proto(&shape).map_or_else(|_| "?".into(), |s| s.to_string()),
            s.full_shape
        ));
    }
    let ranges = s.ranges();
    for other in &full.slices {
        let other = TensorSlice::from_proto(other).map_err(|e| e.message().to_string())?;
        let theirs = other
            .ranges(s.full_shape.dims())
            .map_err(|e| e.message().to_string())?;
        if intersect(&ranges, &theirs).is_some() {
            return Err(format!(
                "slice {} overlaps slice {other} of the same variable; each element must be \
                 saved once",
                s.slice
            ));
        }
    }
    full.slices.push(s.slice.to_proto());
    Ok(())
}

/// A bundle opened for reading: its header and index, checked; data read on demand.
#[derive(Debug)]
pub struct BundleReader {
    files: Files,
    prefix: String,
    num_shards: i32,
    /// The tensors by name: whole ones, and the entries of sliced ones listing their slices.
    entries: BTreeMap<String, BundleEntryProto>,
    /// The stored slices, by slice key.
    slice_entries: BTreeMap<Vec<u8>, BundleEntryProto>,
    /// The slice lists already checked, by tensor name.
    checked: Mutex<HashMap<String, Arc<StoredSlices>>>,
}

/// A sliced tensor's stored slices, each with its box in the full tensor.
type StoredSlices = Vec<(TensorSlice, Vec<std::ops::Range<usize>>)>;

/// How many stored slices an error names.
const SLICES_NAMED: usize = 8;

impl BundleReader {
    /// Opens the bundle at `prefix`: NOT_FOUND naming `P.index` when it is missing, DATA_LOSS
    /// naming it when it is corrupt or its header is unreadable or from an unknown version.
    pub fn open(prefix: &str) -> Result<Self> {
        Self::open_with(&Files::ambient(), prefix)
    }

    /// [`open`](Self::open) through `files`; the data files are read through them too.
    pub fn open_with(files: &Files, prefix: &str) -> Result<Self> {
        let path = index_filename(prefix);
        let bytes = files
            .resolve(&path)?
            .read()
            .map_err(|e| io_error(&path, "read", &e))?;
        let table = Table::parse(&bytes, &path)?;
        let bad = |what: String| {
            Status::data_loss(format!(
                "checkpoint index {} is corrupt: {what}",
                path.display()
            ))
        };
        let header = table
            .get(b"")
            .ok_or_else(|| bad("no header entry (key \"\")".into()))
            .and_then(|v| {
                BundleHeaderProto::decode(v).map_err(|e| bad(format!("unreadable header: {e}")))
            })?;
        if header.endianness != Endianness::Little as i32 {
            return Err(Status::unimplemented(format!(
                "checkpoint {prefix} was written big-endian; tessera reads little-endian bundles"
            )));
        }
        if let Some(v) = &header.version {
            if v.min_consumer > BUNDLE_VERSION || v.bad_consumers.contains(&BUNDLE_VERSION) {
                return Err(Status::failed_precondition(format!(
                    "checkpoint {prefix} needs bundle format version {} or newer; tessera reads \
                     version {BUNDLE_VERSION}",
                    v.min_consumer
                )));
            }
        }
        if header.num_shards < 1 {
            return Err(bad(format!("header says {} shards", header.num_shards)));
        }
        let mut raw = BTreeMap::new();
        for (key, value) in table.entries() {
            if key.is_empty() {
                continue;
            }
            let entry = BundleEntryProto::decode(value.as_slice()).map_err(|e| {
                bad(format!(
                    "unreadable entry for `{}`: {e}",
                    String::from_utf8_lossy(key)
                ))
            })?;
            raw.insert(key.clone(), entry);
        }
        // The keys a sliced tensor's entry lists are its slices, not tensors of their own
        // (TensorFlow's checkpoint reader sets them apart the same way).
        let mut slice_entries = BTreeMap::new();
        let listed: Vec<Vec<u8>> = raw
            .iter()
            .filter(|(_, e)| !e.slices.is_empty())
            .flat_map(|(key, e)| {
                let name = String::from_utf8_lossy(key).into_owned();
                e.slices.iter().filter_map(move |s| {
                    TensorSlice::from_proto(s)
                        .ok()
                        .map(|s| slice_key(&name, &s))
                })
            })
            .collect();
        for key in listed {
            if let Some(entry) = raw.remove(&key) {
                slice_entries.insert(key, entry);
            }
        }
        let entries = raw
            .into_iter()
            .map(|(key, e)| (String::from_utf8_lossy(&key).into_owned(), e))
            .collect();
        Ok(Self {
            files: files.clone(),
            prefix: prefix.to_string(),
            num_shards: header.num_shards,
            entries,
            slice_entries,
            checked: Mutex::default(),
        })
    }

    /// Returns the bundle's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Returns the number of data files.
    pub fn num_shards(&self) -> i32 {
        self.num_shards
    }

    /// Returns the entries by name (sorted).
    pub fn entries(&self) -> &BTreeMap<String, BundleEntryProto> {
        &self.entries
    }

    /// Returns the entry of `name`, or NOT_FOUND naming the tensor and the index file.
    pub fn entry(&self, name: &str) -> Result<&BundleEntryProto> {
        self.entries.get(name).ok_or_else(|| {
            Status::not_found(format!(
                "Key {name} not found in checkpoint {}; the checkpoint holds {} tensors \
                 (was the variable renamed or added after the checkpoint was written?)",
                index_filename(&self.prefix).display(),
                self.entries.len()
            ))
        })
    }

    /// Returns the dtype and shape of `name`.
    pub fn dtype_and_shape(&self, name: &str) -> Result<(DType, Shape)> {
        let entry = self.entry(name)?;
        let dtype = DType::from_i32(entry.dtype)?;
        let shape = Shape::from_proto(&entry.shape.clone().unwrap_or_default())?;
        Ok((dtype, shape))
    }

    /// Reads tensor `name`, verifying its size and checksum: a missing data file is NOT_FOUND
    /// and a short or corrupt one DATA_LOSS, naming the file and the tensor. A tensor saved as
    /// slices is assembled from them; INVALID_ARGUMENT when they do not cover it.
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let entry = self.entry(name)?;
        if !entry.slices.is_empty() {
            let (_, shape) = self.dtype_and_shape(name)?;
            return self.read_slice(name, &TensorSlice::full(shape.rank()));
        }
        self.read_entry(name, entry)
    }

    /// Returns the slices tensor `name` is stored as (none for a tensor saved whole).
    pub fn slices(&self, name: &str) -> Result<Vec<TensorSlice>> {
        let entry = self.entry(name)?;
        entry
            .slices
            .iter()
            .map(|s| {
                TensorSlice::from_proto(s).map_err(|e| {
                    e.context(format!(
                        "tensor `{name}` in checkpoint {}",
                        index_filename(&self.prefix).display()
                    ))
                })
            })
            .collect()
    }

    /// Reads slice `slice` of tensor `name`, assembled from whichever stored slices overlap it
    /// (the whole tensor, when it was saved whole), as TensorFlow's `LookupSlice`: a slice
    /// that does not fit the tensor's shape, or that the stored slices do not cover, is
    /// INVALID_ARGUMENT; stored slices that overlap each other are DATA_LOSS.
    pub fn read_slice(&self, name: &str, slice: &TensorSlice) -> Result<Tensor> {
        let entry = self.entry(name)?;
        let (dtype, full) = self.dtype_and_shape(name)?;
        let index = index_filename(&self.prefix);
        let wanted = slice
            .ranges(full.dims())
            .map_err(|e| e.context(format!("reading tensor `{name}` from {}", index.display())))?;
        let out_shape = Shape::new(wanted.iter().map(|r| r.len()).collect::<Vec<_>>());
        if entry.slices.is_empty() {
            let whole = self.read_entry(name, entry)?;
            return cut(&whole, &full, &wanted, dtype, out_shape);
        }
        let stored = self.stored_slices(name, &full)?;
        let covered: usize = stored
            .iter()
            .filter_map(|(_, ranges)| intersect(ranges, &wanted))
            .map(|common| common.iter().map(|r| r.len()).product::<usize>())
            .sum();
        if covered != out_shape.num_elements() {
            let mut listed: Vec<String> = stored
                .iter()
                .take(SLICES_NAMED)
                .map(|(s, _)| s.to_string())
                .collect();
            if stored.len() > SLICES_NAMED {
                listed.push(format!("... ({} in all)", stored.len()));
            }
            return Err(Status::invalid_argument(format!(
                "Does not have sufficient slices for partitioned tensor {name} to restore in \
                 slice_spec: {slice} (checkpoint {} holds slices {}); restore a slice the \
                 saved ones cover",
                self.prefix,
                listed.join(", ")
            )));
        }
        // Every overlapping part is located (its bytes checked to lie in its file) before the
        // output is allocated.
        let mut parts = Vec::new();
        for (s, ranges) in stored.iter() {
            if intersect(ranges, &wanted).is_none() {
                continue;
            }
            let key = slice_key(name, s);
            let part_entry = self.slice_entries.get(&key).ok_or_else(|| {
                Status::data_loss(format!(
                    "checkpoint index {} is corrupt: tensor `{name}` lists slice {s} but the \
                     index holds no entry for it",
                    index.display()
                ))
            })?;
            let part = self.locate(&format!("{name}` slice `{s}"), part_entry)?;
            let part_dims: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
            if part.dtype != dtype || part.shape.dims() != part_dims.as_slice() {
                return Err(Status::data_loss(format!(
                    "checkpoint {}: slice {s} of tensor `{name}` is stored as a {} tensor of \
                     shape {}, not {dtype} of shape {}",
                    self.prefix,
                    part.dtype,
                    part.shape,
                    Shape::new(part_dims)
                )));
            }
            if *ranges == wanted {
                return part.read();
            }
            parts.push((part, ranges));
        }
        let mut bytes = dtype
            .size()
            .map(|size| vec![0u8; out_shape.num_elements() * size]);
        let n_strings = if bytes.is_none() {
            out_shape.num_elements()
        } else {
            0
        };
        let mut strings = vec![Bytes::new(); n_strings];
        for (part, ranges) in parts {
            let part = part.read()?;
            match (&mut bytes, dtype.size()) {
                (Some(out), Some(size)) => {
                    let src = part.bytes().unwrap_or_default();
                    copy_overlap(src, ranges, out, &wanted, size);
                }
                _ => copy_overlap(part.strings()?, ranges, &mut strings, &wanted, 1),
            }
        }
        match bytes {
            Some(b) => Tensor::from_bytes(dtype, out_shape, Bytes::from(b)),
            None => Tensor::from_strings(out_shape, strings),
        }
    }

    /// The slices tensor `name` (of shape `full`) is stored as, with their boxes, checked once
    /// per reader to fit the shape and not to overlap (a restore reads one slice per part, and
    /// the check is quadratic in the slices).
    fn stored_slices(&self, name: &str, full: &Shape) -> Result<Arc<StoredSlices>> {
        let mut cache = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stored) = cache.get(name) {
            return Ok(stored.clone());
        }
        let index = index_filename(&self.prefix);
        let lost = |what: String| {
            Status::data_loss(format!(
                "checkpoint index {} is corrupt: tensor `{name}` {what}",
                index.display()
            ))
        };
        let mut stored: StoredSlices = Vec::new();
        for s in self.slices(name)? {
            let ranges = s
                .ranges(full.dims())
                .map_err(|e| lost(format!("lists slice {s}: {}", e.message())))?;
            if let Some((other, _)) = stored.iter().find(|(_, r)| intersect(r, &ranges).is_some()) {
                return Err(lost(format!("lists overlapping slices {other} and {s}")));
            }
            stored.push((s, ranges));
        }
        let stored = Arc::new(stored);
        cache.insert(name.to_string(), stored.clone());
        Ok(stored)
    }

    /// Reads every stored tensor and slice, verifying sizes and checksums, without assembling
    /// anything: what a restore checks before it changes a variable.
    pub fn verify(&self) -> Result<()> {
        for (name, entry) in &self.entries {
            if entry.slices.is_empty() {
                self.read_entry(name, entry)?;
            }
        }
        for (key, entry) in &self.slice_entries {
            let label = String::from_utf8_lossy(key).into_owned();
            self.read_entry(&label, entry)?;
        }
        Ok(())
    }

    /// Reads the data of one stored entry (`name` names it in errors).
    fn read_entry(&self, name: &str, entry: &BundleEntryProto) -> Result<Tensor> {
        self.locate(name, entry)?.read()
    }

    /// Checks where one stored entry's bytes lie and opens its data file: an entry whose size
    /// does not fit its dtype and shape, or whose bytes run past the end of its file, is
    /// DATA_LOSS before anything is allocated for it, so a corrupt or hostile index cannot
    /// make a reader allocate more than the files hold.
    fn locate(&self, name: &str, entry: &BundleEntryProto) -> Result<Stored> {
        let dtype = DType::from_i32(entry.dtype)?;
        let shape = Shape::from_proto(&entry.shape.clone().unwrap_or_default())?;
        if entry.shard_id < 0 || entry.shard_id >= self.num_shards {
            return Err(Status::data_loss(format!(
                "entry `{name}` of {} names shard {} of {}",
                index_filename(&self.prefix).display(),
                entry.shard_id,
                self.num_shards
            )));
        }
        let path = data_filename(&self.prefix, entry.shard_id, self.num_shards);
        let lost = |what: String| lost_data(&path, name, what);
        let (offset, size) = match (u64::try_from(entry.offset), usize::try_from(entry.size)) {
            (Ok(o), Ok(s)) => (o, s),
            _ => {
                return Err(lost(format!(
                    "bad offset {} / size {}",
                    entry.offset, entry.size
                )))
            }
        };
        match dtype.size() {
            Some(elem) if shape.num_elements().checked_mul(elem) != Some(size) => {
                return Err(lost(format!(
                    "entry size {size} does not match a {dtype} tensor of shape {shape}"
                )));
            }
            // Each string takes at least its one-byte length.
            None if size < shape.num_elements() => {
                return Err(lost(format!(
                    "entry size {size} is too small for {} strings",
                    shape.num_elements()
                )));
            }
            _ => {}
        }
        let file = self
            .files
            .resolve(&path)?
            .open()
            .map_err(|e| io_error(&path, "open", &e))?;
        let len = file
            .metadata()
            .map_err(|e| io_error(&path, "read", &e))?
            .len();
        if offset.checked_add(size as u64).is_none_or(|end| end > len) {
            return Err(lost(format!(
                "file ends before bytes {offset}..{}",
                offset.saturating_add(size as u64)
            )));
        }
        Ok(Stored {
            name: name.to_string(),
            path,
            file,
            dtype,
            shape,
            offset,
            size,
            crc32c: unmask_crc(entry.crc32c),
        })
    }
}

/// One stored entry, located in its opened data file.
struct Stored {
    name: String,
    path: PathBuf,
    file: std::fs::File,
    dtype: DType,
    shape: Shape,
    offset: u64,
    size: usize,
    crc32c: u32,
}

impl Stored {
    /// Reads the entry's bytes, verifying the checksum.
    fn read(mut self) -> Result<Tensor> {
        let (path, name) = (&self.path, self.name.as_str());
        let lost = |what: String| lost_data(path, name, what);
        let (offset, size) = (self.offset, self.size);
        let mut buf = vec![0u8; size];
        self.file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => lost(format!(
                    "file ends before bytes {offset}..{}",
                    offset + size as u64
                )),
                _ => io_error(path, "read", &e),
            })?;
        let shape = self.shape;
        if self.dtype == DType::Variant {
            let (values, crc) = decode_variants(&buf, shape.num_elements()).map_err(lost)?;
            if crc != self.crc32c {
                return Err(lost("checksum mismatch".into()));
            }
            return Tensor::from_variants(shape, values);
        }
        if self.dtype == DType::String {
            let (strings, crc) = decode_strings(&buf, shape.num_elements()).map_err(lost)?;
            if crc != self.crc32c {
                return Err(lost("checksum mismatch".into()));
            }
            return Tensor::from_strings(shape, strings);
        }
        if crc32c::crc32c(&buf) != self.crc32c {
            return Err(lost("checksum mismatch".into()));
        }
        Tensor::from_bytes(self.dtype, shape, Bytes::from(buf))
            .map_err(|e| lost(e.message().to_string()))
    }
}

/// DATA_LOSS: data file `path` is corrupt where it holds tensor `name`.
fn lost_data(path: &Path, name: &str, what: String) -> Status {
    Status::data_loss(format!(
        "checkpoint data file {} is corrupt: {what} (tensor `{name}`)",
        path.display()
    ))
}

/// Returns box `wanted` of `whole` (a tensor of shape `full`), shaped `out_shape`.
fn cut(
    whole: &Tensor,
    full: &Shape,
    wanted: &[std::ops::Range<usize>],
    dtype: DType,
    out_shape: Shape,
) -> Result<Tensor> {
    if out_shape == *full {
        return Ok(whole.clone());
    }
    let all: Vec<std::ops::Range<usize>> = full.dims().iter().map(|&d| 0..d).collect();
    match (whole.bytes(), dtype.size()) {
        (Some(src), Some(size)) => {
            let mut out = vec![0u8; out_shape.num_elements() * size];
            copy_overlap(src, &all, &mut out, wanted, size);
            Tensor::from_bytes(dtype, out_shape, Bytes::from(out))
        }
        _ => {
            let mut out = vec![Bytes::new(); out_shape.num_elements()];
            copy_overlap(whole.strings()?, &all, &mut out, wanted, 1);
            Tensor::from_strings(out_shape, out)
        }
    }
}

/// Decodes `n` variants laid out as [`encode_tensor`] writes them; returns them and the
/// data's CRC.
fn decode_variants(
    buf: &[u8],
    n: usize,
) -> std::result::Result<(Vec<crate::tensor::VariantValue>, u32), String> {
    let mut pos = 0;
    let mut crc = 0u32;
    let mut values = Vec::with_capacity(n.min(buf.len()));
    for i in 0..n {
        let start = pos;
        let len = table::get_varint(buf, &mut pos)
            .ok_or(format!("length of variant {i} is truncated"))?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| pos.checked_add(l))
            .filter(|&e| e + 4 <= buf.len())
            .ok_or(format!("variant {i} runs past the entry"))?;
        let proto = &buf[pos..end];
        let checksum = u32::from_le_bytes(buf[end..end + 4].try_into().expect("4 bytes"));
        if unmask_crc(checksum) != crc32c::crc32c(proto) {
            return Err(format!("variant {i}'s checksum mismatch"));
        }
        crc = crc32c::crc32c_append(crc, &buf[start..end + 4]);
        let decoded = <crate::proto::VariantTensorDataProto as prost::Message>::decode(proto)
            .map_err(|e| format!("variant {i} is not a VariantTensorDataProto: {e}"))?;
        values.push(std::sync::Arc::new(StoredVariant(decoded)) as crate::tensor::VariantValue);
        pos = end + 4;
    }
    if pos != buf.len() {
        return Err(format!("{} bytes after the last variant", buf.len() - pos));
    }
    Ok((values, crc))
}

/// Decodes `n` strings laid out as TensorFlow writes them; returns them and the data's CRC.
fn decode_strings(buf: &[u8], n: usize) -> std::result::Result<(Vec<Bytes>, u32), String> {
    let mut pos = 0;
    let mut crc = 0u32;
    let mut lens = Vec::with_capacity(n.min(buf.len()));
    for i in 0..n {
        let len =
            table::get_varint(buf, &mut pos).ok_or(format!("length of string {i} is truncated"))?;
        crc = extend_length_crc(crc, len);
        lens.push(len);
    }
    let checksum = buf
        .get(pos..pos + 4)
        .ok_or("lengths' checksum is truncated")?;
    if unmask_crc(u32::from_le_bytes([
        checksum[0],
        checksum[1],
        checksum[2],
        checksum[3],
    ])) != crc
    {
        return Err("string lengths' checksum mismatch".into());
    }
    crc = crc32c::crc32c_append(crc, checksum);
    pos += 4;
    let mut strings = Vec::with_capacity(lens.len());
    for (i, len) in lens.into_iter().enumerate() {
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| pos.checked_add(l))
            .filter(|&e| e <= buf.len())
            .ok_or(format!("string {i} runs past the entry"))?;
        crc = crc32c::crc32c_append(crc, &buf[pos..end]);
        strings.push(Bytes::copy_from_slice(&buf[pos..end]));
        pos = end;
    }
    if pos != buf.len() {
        return Err(format!(
            "{} bytes left over after the strings",
            buf.len() - pos
        ));
    }
    Ok((strings, crc))
}

/// Merges the one-or-more-shard bundles at `prefixes` into one bundle at `destination`, as
/// TensorFlow's `MergeBundles`: data files are renamed to `destination.data-0000i-of-0000N` in
/// prefix order, the indices merged into `destination.index` (written atomically), the source
/// indices deleted, and with `delete_old_dirs` their directories removed when empty. The
/// slices a partitioned variable's entry lists in each shard are joined into one list (a
/// tensor saved whole in two shards is INVALID_ARGUMENT, as are overlapping slices).
pub fn merge_bundles(prefixes: &[String], destination: &str, delete_old_dirs: bool) -> Result<()> {
    merge_bundles_with(&Files::ambient(), prefixes, destination, delete_old_dirs)
}

/// [`merge_bundles`] through `files`: every source and the destination are checked before any
/// file is read, renamed or deleted.
pub fn merge_bundles_with(
    files: &Files,
    prefixes: &[String],
    destination: &str,
    delete_old_dirs: bool,
) -> Result<()> {
    let destination_index = files.resolve(index_filename(destination))?;
    let mut sources = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        let index = files.resolve(index_filename(prefix))?;
        let dir = Path::new(prefix)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(|dir| files.resolve(dir))
            .transpose()?;
        sources.push((index, dir));
    }
    create_prefix_dir(files, destination)?;
    let mut merged: BTreeMap<Vec<u8>, BundleEntryProto> = BTreeMap::new();
    let mut renames = Vec::new();
    for prefix in prefixes {
        let reader = BundleReader::open_with(files, prefix)?;
        let base = renames.len() as i32;
        for shard in 0..reader.num_shards {
            let from = files.resolve(data_filename(prefix, shard, reader.num_shards))?;
            if !from.exists() {
                return Err(Status::not_found(format!(
                    "checkpoint data file {} not found while merging into {destination}",
                    from.path().display()
                )));
            }
            renames.push(from);
        }
        let named = reader
            .entries
            .into_iter()
            .map(|(name, e)| (name.into_bytes(), e));
        for (key, mut entry) in named.chain(reader.slice_entries) {
            let duplicate = |key: &[u8]| {
                Status::invalid_argument(format!(
                    "Duplicate tensor keyed by {} encountered, when merging prefix: {prefix}",
                    String::from_utf8_lossy(key)
                ))
            };
            match merged.get_mut(&key) {
                // Each shard lists the slices of a partitioned variable it saved.
                Some(existing) if !existing.slices.is_empty() && !entry.slices.is_empty() => {
                    merge_slice_lists(existing, &entry).map_err(|what| {
                        Status::invalid_argument(format!(
                            "cannot merge the slices of tensor `{}` from {prefix}: {what}",
                            String::from_utf8_lossy(&key)
                        ))
                    })?;
                }
                Some(_) => return Err(duplicate(&key)),
                None => {
                    entry.shard_id += base;
                    merged.insert(key, entry);
                }
            }
        }
    }
    let total = renames.len() as i32;
    for (i, from) in renames.iter().enumerate() {
        let to = files.resolve(data_filename(destination, i as i32, total))?;
        from.rename_to(&to).map_err(|e| {
            Status::internal(format!(
                "cannot rename checkpoint data file {} to {}: {e}",
                from.path().display(),
                to.path().display()
            ))
        })?;
    }
    write_atomic_with(
        files,
        destination_index.path(),
        &build_index(total, &merged)?,
    )?;
    for (index, dir) in &sources {
        let _ = index.remove_file();
        if delete_old_dirs {
            if let Some(dir) = dir {
                // Only empty directories go; a shared directory keeps its other files.
                let _ = dir.remove_dir();
            }
        }
    }
    Ok(())
}

/// Appends the slices `more` lists to those of `existing` (entries of one sliced tensor from
/// two shards): dtype and full shape must agree and no slice may overlap another.
fn merge_slice_lists(
    existing: &mut BundleEntryProto,
    more: &BundleEntryProto,
) -> std::result::Result<(), String> {
    let dtype = DType::from_i32(more.dtype).map_err(|e| e.message().to_string())?;
    let shape = Shape::from_proto(&more.shape.clone().unwrap_or_default())
        .map_err(|e| e.message().to_string())?;
    for s in &more.slices {
        let slice = TensorSlice::from_proto(s).map_err(|e| e.message().to_string())?;
        let spec = ShapeAndSlice {
            full_shape: shape.clone(),
            slice,
        };
        spec.slice
            .ranges(shape.dims())
            .map_err(|e| e.message().to_string())?;
        add_slice(existing, dtype, &spec)?;
    }
    Ok(())
}

/// Deletes the files of the bundle at `prefix` (index and data files; missing ones ignored).
pub fn delete_bundle(prefix: &str) -> Result<()> {
    let files = Files::ambient();
    let path = Path::new(prefix);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = path
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _ = files.resolve(index_filename(prefix))?.remove_file();
    let _ = files.resolve(format!("{prefix}.meta"))?.remove_file();
    let data_prefix = format!("{base}.data-");
    if let Ok(names) = files.resolve(dir)?.entry_names() {
        for name in names {
            if name.to_string_lossy().starts_with(&data_prefix) {
                let _ = files.resolve(dir.join(name))?.remove_file();
            }
        }
    }
    Ok(())
}
