//! Conversion between [`Tensor`] and TensorFlow's `TensorProto` (and `NamedTensorProto`).
//!
//! Reading follows TensorFlow's `Tensor::FromProto`: a non-empty `tensor_content` holds every
//! element (little-endian for fixed-size types; for strings and resources, TensorFlow's list
//! encoding: the varint length of every element first, then the elements' bytes); otherwise the
//! typed repeated field for the dtype holds the values, and fewer values than elements repeat the
//! last one (zero values give zeros). Unlike TensorFlow, which ignores surplus values and values
//! in a field of another dtype, both are an error here: a peer that sends them has a bug worth
//! hearing about.
//!
//! Writing puts fixed-size elements in `tensor_content` as they are (a `Bytes` clone, no copy),
//! strings in `string_val` and handles in `resource_handle_val`, the way `tf.make_tensor_proto`
//! does. [`Tensor::to_proto_content`] writes every dtype in `tensor_content`, the encoding
//! TensorFlow's own tensor encoder uses in RecvTensor responses.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use super::{Complex64, Data, Element, ResourceHandle, Shape, Tensor};
use crate::error::{Result, Status};
use crate::proto::{DataType, NamedTensorProto, ResourceHandleProto, TensorProto};
use crate::tensor::DType;

impl ResourceHandle {
    /// Reads a `ResourceHandleProto` (its hash code and dtypes/shapes are not kept).
    pub fn from_proto(proto: &ResourceHandleProto) -> Self {
        Self {
            device: proto.device.clone(),
            container: proto.container.clone(),
            name: proto.name.clone(),
            type_name: proto.maybe_type_name.clone(),
        }
    }

    /// Returns TensorFlow's `ResourceHandleProto`. `hash_code` is 0: TensorFlow derives it from
    /// its C++ type, which tessera has no way to reproduce.
    pub fn to_proto(&self) -> ResourceHandleProto {
        ResourceHandleProto {
            device: self.device.clone(),
            container: self.container.clone(),
            name: self.name.clone(),
            hash_code: 0,
            maybe_type_name: self.type_name.clone(),
            ..Default::default()
        }
    }
}

/// What a tensor proto is, for error messages: "float32 tensor of shape [2,3]".
struct Described<'a>(DType, &'a Shape);

impl std::fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tensor of shape {} ({} elements)",
            self.0,
            self.1,
            self.1.num_elements()
        )
    }
}

impl Tensor {
    /// Reads a `TensorProto` of a supported dtype (every [`DType`] but variant). Fixed-size
    /// elements in `tensor_content` are kept without a copy; typed values come from the field
    /// TensorFlow uses for the dtype: `int_val` for (u)int8 and (u)int16, `half_val` holding the
    /// 16 bits of each float16 or bfloat16, `uint32_val`, `uint64_val`, and `scomplex_val` as
    /// (real, imaginary) pairs for complex64.
    ///
    /// Fails with INVALID_ARGUMENT when the shape is not fully defined, the content length does
    /// not match the shape, there are more values than elements, a bool byte is not 0 or 1, or
    /// values sit in a field that does not belong to the dtype; with UNIMPLEMENTED for dtypes
    /// tessera does not support.
    pub fn from_proto(proto: &TensorProto) -> Result<Self> {
        if proto.dtype == DataType::DtInvalid as i32 {
            return Err(Status::invalid_argument(
                "TensorProto has no dtype (DT_INVALID); set dtype to the element type",
            ));
        }
        let dtype = DType::from_i32(proto.dtype).map_err(|e| e.context("TensorProto"))?;
        if dtype == DType::Variant {
            return Err(Status::unimplemented(
                "TensorProto of dtype variant: tessera keeps variant values (TensorLists) on the \
                 task that made them; keep the ops that use them on one task",
            ));
        }
        let shape = match &proto.tensor_shape {
            Some(shape) => Shape::from_proto(shape)
                .map_err(|e| e.context(format!("TensorProto of dtype {dtype}")))?,
            None => Shape::scalar(),
        };
        let n = checked_num_elements(dtype, &shape, handle_heap_bytes(proto))?;
        let what = Described(dtype, &shape);
        check_no_foreign_values(proto, dtype, &what)?;

        if !proto.tensor_content.is_empty() || (n == 0 && count_values(proto, dtype) == 0) {
            return from_content(dtype, shape, n, &proto.tensor_content);
        }
        let data = match dtype {
            DType::Float => fixed(&proto.float_val, n, &what)?,
            DType::Double => fixed(&proto.double_val, n, &what)?,
            DType::Int32 => fixed(&proto.int_val, n, &what)?,
            DType::Int64 => fixed(&proto.int64_val, n, &what)?,
            DType::Bool => fixed(&proto.bool_val, n, &what)?,
            DType::UInt8 => fixed(&narrow::<u8>(&proto.int_val, &what)?, n, &what)?,
            DType::Int8 => fixed(&narrow::<i8>(&proto.int_val, &what)?, n, &what)?,
            DType::Int16 => fixed(&narrow::<i16>(&proto.int_val, &what)?, n, &what)?,
            DType::UInt16 => fixed(&narrow::<u16>(&proto.int_val, &what)?, n, &what)?,
            DType::UInt32 => fixed(&proto.uint32_val, n, &what)?,
            DType::UInt64 => fixed(&proto.uint64_val, n, &what)?,
            DType::Half => {
                let bits = narrow::<u16>(&proto.half_val, &what)?;
                let values: Vec<half::f16> = bits.into_iter().map(half::f16::from_bits).collect();
                fixed(&values, n, &what)?
            }
            DType::BFloat16 => {
                let bits = narrow::<u16>(&proto.half_val, &what)?;
                let values: Vec<half::bf16> = bits.into_iter().map(half::bf16::from_bits).collect();
                fixed(&values, n, &what)?
            }
            DType::Complex64 => {
                if proto.scomplex_val.len() % 2 != 0 {
                    return Err(Status::invalid_argument(format!(
                        "TensorProto for a {what} carries {} floats in scomplex_val; they \
                         must come in (real, imaginary) pairs",
                        proto.scomplex_val.len()
                    )));
                }
                let values: Vec<Complex64> = proto
                    .scomplex_val
                    .chunks_exact(2)
                    .map(|pair| Complex64::new(pair[0], pair[1]))
                    .collect();
                fixed(&values, n, &what)?
            }
            DType::String => Data::Strings(broadcast(&proto.string_val, n, &what)?.into()),
            DType::Resource => {
                let Some(last) = proto.resource_handle_val.last() else {
                    return Err(Status::invalid_argument(format!(
                        "TensorProto for a {what} carries no resource_handle_val; a resource \
                         tensor has no zero value"
                    )));
                };
                let mut handles: Vec<_> = proto
                    .resource_handle_val
                    .iter()
                    .map(ResourceHandle::from_proto)
                    .collect();
                if handles.len() > n {
                    return Err(too_many(handles.len(), n, &what));
                }
                handles.resize(n, ResourceHandle::from_proto(last));
                Data::Resources(handles.into())
            }
            DType::Variant => unreachable!("variant protos are refused above"),
        };
        Ok(Self { dtype, shape, data })
    }

    /// Returns a `TensorProto` the way `tf.make_tensor_proto` writes one: fixed-size elements
    /// in `tensor_content` (sharing this tensor's buffer), strings in `string_val`, handles in
    /// `resource_handle_val`.
    pub fn to_proto(&self) -> TensorProto {
        if let Data::Ref(var, _) = &self.data {
            return var
                .snapshot()
                .map(|v| v.to_proto())
                .unwrap_or_else(|| self.proto_header());
        }
        if self.device_buffer().is_some() {
            return self
                .host_copy()
                .map_or_else(unreadable, |host| host.to_proto());
        }
        let mut proto = self.proto_header();
        match &self.data {
            Data::Bytes(bytes) => proto.tensor_content = bytes.clone(),
            Data::Owned(owned) => proto.tensor_content = owned.share(),
            Data::Strings(strings) => proto.string_val = strings.to_vec(),
            Data::Resources(handles) => {
                proto.resource_handle_val = handles.iter().map(ResourceHandle::to_proto).collect();
            }
            Data::Variants(_) | Data::Ref(..) | Data::Device(_) => {}
        }
        proto
    }

    /// The copy on the host of a tensor in a device's memory, which the wire carries; `None`
    /// (logged) when the device fails the copy.
    fn host_copy(&self) -> Option<Tensor> {
        match self.to_host() {
            Ok(host) => Some(host),
            Err(e) => {
                tracing::error!(error = %e, "a tensor could not be copied off its device");
                None
            }
        }
    }

    /// Returns a `TensorProto` with every dtype in `tensor_content`, as TensorFlow's tensor
    /// encoder writes RecvTensor responses: strings and resources as the varint length of every
    /// element, then the elements (serialized `ResourceHandleProto`s for resources).
    pub fn to_proto_content(&self) -> TensorProto {
        if let Data::Ref(var, _) = &self.data {
            return var
                .snapshot()
                .map(|v| v.to_proto_content())
                .unwrap_or_else(|| self.proto_header());
        }
        if self.device_buffer().is_some() {
            return self
                .host_copy()
                .map_or_else(unreadable, |host| host.to_proto_content());
        }
        let mut proto = self.proto_header();
        proto.tensor_content = match &self.data {
            Data::Bytes(bytes) => bytes.clone(),
            Data::Owned(owned) => owned.share(),
            Data::Strings(strings) => encode_list(strings.iter().map(Bytes::as_ref)),
            Data::Resources(handles) => {
                let encoded: Vec<Vec<u8>> = handles
                    .iter()
                    .map(|h| h.to_proto().encode_to_vec())
                    .collect();
                encode_list(encoded.iter().map(Vec::as_slice))
            }
            Data::Variants(_) | Data::Ref(..) | Data::Device(_) => Bytes::new(),
        };
        proto
    }

    /// Reads a `NamedTensorProto` into its name and tensor; errors name the tensor.
    pub fn from_named_proto(proto: &NamedTensorProto) -> Result<(String, Self)> {
        let tensor = match &proto.tensor {
            Some(t) => {
                Self::from_proto(t).map_err(|e| e.context(format!("tensor `{}`", proto.name)))?
            }
            None => {
                return Err(Status::invalid_argument(format!(
                    "NamedTensorProto `{}` has no tensor",
                    proto.name
                )))
            }
        };
        Ok((proto.name.clone(), tensor))
    }

    /// Returns a `NamedTensorProto` holding [`Tensor::to_proto`] under `name`.
    pub fn to_named_proto(&self, name: impl Into<String>) -> NamedTensorProto {
        NamedTensorProto {
            name: name.into(),
            tensor: Some(self.to_proto()),
        }
    }

    /// The dtype and shape of a proto for this tensor, without elements.
    fn proto_header(&self) -> TensorProto {
        TensorProto {
            dtype: self.dtype.to_proto() as i32,
            tensor_shape: Some(self.shape.to_proto()),
            ..Default::default()
        }
    }
}

/// The proto of a tensor whose elements could not be read off its device: `DT_INVALID`, which
/// every reader rejects, rather than a tensor of zeros.
fn unreadable() -> TensorProto {
    TensorProto::default()
}

/// The most memory a tensor read from a proto may take: protobuf's 2 GiB message ceiling.
///
/// A proto of a few bytes can describe an enormous tensor (one `float_val` fills every
/// element; the shape is free), and TensorFlow allocates whatever it claims. A peer must not
/// be able to make a task allocate gigabytes with a 30-byte message, so tensors whose elements
/// would take more than a whole message could carry are refused instead.
pub const MAX_PROTO_TENSOR_BYTES: usize = i32::MAX as usize;

/// The number of elements of `shape`, failing rather than overflowing on absurd peer shapes,
/// and refusing (RESOURCE_EXHAUSTED) tensors that would take over [`MAX_PROTO_TENSOR_BYTES`]
/// in memory.
///
/// `handle_heap` is what the strings of the largest handle given take on the heap: every
/// element of a handle tensor is a copy of one.
fn checked_num_elements(dtype: DType, shape: &Shape, handle_heap: usize) -> Result<usize> {
    let n = shape
        .dims()
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let per_element = bytes_per_element(dtype, handle_heap);
    let Some(n) = n else {
        return Err(Status::invalid_argument(format!(
            "a {dtype} tensor of shape {shape} has too many elements to hold in memory"
        )));
    };
    match n.checked_mul(per_element) {
        Some(bytes) if bytes <= MAX_PROTO_TENSOR_BYTES => Ok(n),
        _ => Err(Status::resource_exhausted(format!(
            "a {dtype} tensor of shape {shape} ({n} elements) would take over \
             {MAX_PROTO_TENSOR_BYTES} bytes, the most a TensorProto may describe; send it in \
             smaller pieces"
        ))),
    }
}

/// What one element of a `dtype` tensor read from a proto takes in memory. Strings and handles
/// are built in a vector, then moved into the tensor's shared buffer: for a moment each element
/// is held twice (repeated strings share their bytes; each handle copy has its own strings).
fn bytes_per_element(dtype: DType, handle_heap: usize) -> usize {
    match dtype {
        DType::String => 2 * std::mem::size_of::<Bytes>(),
        DType::Resource => 2 * std::mem::size_of::<ResourceHandle>() + handle_heap,
        _ => dtype.size().unwrap_or(1),
    }
}

/// The bytes `proto` would take once read into a tensor, from its dtype and shape alone (a
/// few bytes of proto may describe gigabytes): what request budgets count before anything is
/// decoded. Saturates instead of overflowing; a proto without a valid dtype or shape (an
/// element count past 2^64) counts its encoded size, as reading it fails anyway.
pub fn declared_bytes(proto: &TensorProto) -> u64 {
    let encoded = prost::Message::encoded_len(proto) as u64;
    let Ok(dtype) = DType::from_i32(proto.dtype) else {
        return encoded;
    };
    let Some(shape) = &proto.tensor_shape else {
        return encoded.max(bytes_per_element(dtype, 0) as u64);
    };
    // A count that overflows is no shape at all: reading it fails with INVALID_ARGUMENT.
    let Some(elements) = shape.dim.iter().try_fold(1u64, |n, d| {
        n.checked_mul(u64::try_from(d.size).unwrap_or(0))
    }) else {
        return encoded;
    };
    let per_element = bytes_per_element(dtype, handle_heap_bytes(proto)) as u64;
    elements.saturating_mul(per_element).max(encoded)
}

/// The most heap one copy of a handle in `proto` takes: each non-empty string is a block of at
/// least 32 bytes (the allocator's smallest), its length plus a header rounded up to 16.
/// The fuzzer found a 40-byte proto repeating a handle 9.5 million times; counting the struct
/// alone put it under the limit while it took over 2 GiB.
fn handle_heap_bytes(proto: &TensorProto) -> usize {
    let block = |s: &str| match s.len() {
        0 => 0,
        len => (len + 8).next_multiple_of(16).max(32),
    };
    proto
        .resource_handle_val
        .iter()
        .map(|h| {
            block(&h.device) + block(&h.container) + block(&h.name) + block(&h.maybe_type_name)
        })
        .max()
        .unwrap_or(0)
}

/// How many values the typed field of `dtype` holds.
fn count_values(proto: &TensorProto, dtype: DType) -> usize {
    match dtype {
        DType::Float => proto.float_val.len(),
        DType::Double => proto.double_val.len(),
        DType::Int32 => proto.int_val.len(),
        DType::Int64 => proto.int64_val.len(),
        DType::Bool => proto.bool_val.len(),
        DType::String => proto.string_val.len(),
        DType::Resource => proto.resource_handle_val.len(),
        DType::Variant => proto.variant_val.len(),
        DType::UInt8 | DType::Int8 | DType::Int16 | DType::UInt16 => proto.int_val.len(),
        DType::UInt32 => proto.uint32_val.len(),
        DType::UInt64 => proto.uint64_val.len(),
        DType::Half | DType::BFloat16 => proto.half_val.len(),
        DType::Complex64 => proto.scomplex_val.len(),
    }
}

/// Fails when values sit in a typed field other than the one of `dtype`, or alongside a
/// `tensor_content` (TensorFlow would silently ignore them).
fn check_no_foreign_values(proto: &TensorProto, dtype: DType, what: &Described<'_>) -> Result<()> {
    let fields: [(&str, usize, Option<DType>); 14] = [
        ("float_val", proto.float_val.len(), Some(DType::Float)),
        ("double_val", proto.double_val.len(), Some(DType::Double)),
        ("int_val", proto.int_val.len(), Some(DType::Int32)),
        ("int64_val", proto.int64_val.len(), Some(DType::Int64)),
        ("bool_val", proto.bool_val.len(), Some(DType::Bool)),
        ("string_val", proto.string_val.len(), Some(DType::String)),
        (
            "resource_handle_val",
            proto.resource_handle_val.len(),
            Some(DType::Resource),
        ),
        ("half_val", proto.half_val.len(), Some(DType::Half)),
        (
            "scomplex_val",
            proto.scomplex_val.len(),
            Some(DType::Complex64),
        ),
        ("dcomplex_val", proto.dcomplex_val.len(), None),
        ("variant_val", proto.variant_val.len(), None),
        ("uint32_val", proto.uint32_val.len(), Some(DType::UInt32)),
        ("uint64_val", proto.uint64_val.len(), Some(DType::UInt64)),
        ("float8_val", proto.float8_val.len(), None),
    ];
    for (field, count, owner) in fields {
        if count == 0 {
            continue;
        }
        if owner.map(typed_field) != Some(typed_field(dtype)) {
            return Err(Status::invalid_argument(format!(
                "TensorProto for a {what} carries {count} values in {field}, which does not \
                 belong to {dtype}; put them in {} or tensor_content",
                typed_field(dtype)
            )));
        }
        if !proto.tensor_content.is_empty() {
            return Err(Status::invalid_argument(format!(
                "TensorProto for a {what} carries both tensor_content ({} bytes) and {count} \
                 values in {field}; send only one of them",
                proto.tensor_content.len()
            )));
        }
    }
    Ok(())
}

/// The repeated field holding values of `dtype`.
fn typed_field(dtype: DType) -> &'static str {
    match dtype {
        DType::Float => "float_val",
        DType::Double => "double_val",
        DType::Int32 => "int_val",
        DType::Int64 => "int64_val",
        DType::Bool => "bool_val",
        DType::String => "string_val",
        DType::Resource => "resource_handle_val",
        DType::Variant => "variant_val",
        DType::UInt8 | DType::Int8 | DType::Int16 | DType::UInt16 => "int_val",
        DType::UInt32 => "uint32_val",
        DType::UInt64 => "uint64_val",
        DType::Half | DType::BFloat16 => "half_val",
        DType::Complex64 => "scomplex_val",
    }
}

/// The values of an `int32` field (`int_val`, `half_val`) that holds a narrower type, each
/// checked to fit: TensorFlow writes uint8 255 as 255, int8 -1 as -1, a float16 as its 16 bits.
fn narrow<T: TryFrom<i32>>(values: &[i32], what: &Described<'_>) -> Result<Vec<T>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            T::try_from(v).map_err(|_| {
                Status::invalid_argument(format!(
                    "TensorProto for a {what} carries {v} at value {i} of {}, out of the \
                     range of {}",
                    typed_field(what.0),
                    what.0
                ))
            })
        })
        .collect()
}

/// Builds the elements from `tensor_content` (possibly empty, for zero-element tensors).
fn from_content(dtype: DType, shape: Shape, n: usize, content: &Bytes) -> Result<Tensor> {
    let what = Described(dtype, &shape);
    match dtype {
        DType::String => {
            let strings = decode_list(content, n).map_err(|e| e.context(&what))?;
            Ok(Tensor {
                dtype,
                shape,
                data: Data::Strings(strings.into()),
            })
        }
        DType::Resource => {
            let handles = decode_list(content, n)
                .and_then(|items| {
                    items
                        .into_iter()
                        .map(|b| {
                            ResourceHandleProto::decode(b)
                                .map(|p| ResourceHandle::from_proto(&p))
                                .map_err(|e| {
                                    Status::invalid_argument(format!(
                                        "tensor_content holds a bad ResourceHandleProto: {e}"
                                    ))
                                })
                        })
                        .collect::<Result<Vec<_>>>()
                })
                .map_err(|e| e.context(&what))?;
            Ok(Tensor {
                dtype,
                shape,
                data: Data::Resources(handles.into()),
            })
        }
        _ => {
            let size = dtype.size().expect("fixed-size dtype");
            if content.len() != n * size {
                return Err(Status::invalid_argument(format!(
                    "tensor_content of a {what} has {} bytes; it needs {} ({} bytes per element)",
                    content.len(),
                    n * size,
                    size
                )));
            }
            if dtype == DType::Bool {
                if let Some(i) = content.iter().position(|&b| b > 1) {
                    return Err(Status::invalid_argument(format!(
                        "tensor_content of a {what} has byte {} at element {i}; bool bytes \
                         must be 0 or 1",
                        content[i]
                    )));
                }
            }
            // Shares the proto's buffer; `values()` copies later only if it is misaligned.
            Tensor::from_bytes(dtype, shape, content.clone())
        }
    }
}

/// Fixed-size values from a typed field, broadcast over `n` elements.
fn fixed<T: Element + Default>(values: &[T], n: usize, what: &Described<'_>) -> Result<Data> {
    Ok(Data::Owned(T::into_owned(broadcast(values, n, what)?)))
}

/// `n` elements from `values`: zero values give `T::default()`, fewer repeat the last value,
/// more are an error.
fn broadcast<T: Clone + Default>(values: &[T], n: usize, what: &Described<'_>) -> Result<Vec<T>> {
    if values.len() > n {
        return Err(too_many(values.len(), n, what));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        Status::resource_exhausted(format!("cannot allocate the elements of a {what}"))
    })?;
    out.extend_from_slice(values);
    let fill = values.last().cloned().unwrap_or_default();
    out.resize(n, fill);
    Ok(out)
}

/// The error for more values than elements.
fn too_many(count: usize, n: usize, what: &Described<'_>) -> Status {
    Status::invalid_argument(format!(
        "TensorProto for a {what} carries {count} values; at most {n} fit"
    ))
}

/// Encodes byte strings as TensorFlow's string list: every length as a varint, then the bytes.
pub(crate) fn encode_list<'a>(items: impl Iterator<Item = &'a [u8]> + Clone) -> Bytes {
    let total: usize = items.clone().map(|b| b.len() + 10).sum();
    let mut out = BytesMut::with_capacity(total);
    for item in items.clone() {
        prost::encoding::encode_varint(item.len() as u64, &mut out);
    }
    for item in items {
        out.put_slice(item);
    }
    out.freeze()
}

/// Decodes `n` byte strings from TensorFlow's string list encoding, slicing `content` without
/// copies. The lengths must account for every byte.
pub(crate) fn decode_list(content: &Bytes, n: usize) -> Result<Vec<Bytes>> {
    // Every element takes at least one byte (its length), which also bounds the allocation
    // below by the size of what the peer actually sent.
    if n > content.len() {
        return Err(Status::invalid_argument(format!(
            "tensor_content has {} bytes, too few for the lengths of {n} elements",
            content.len()
        )));
    }
    let mut cursor = content.clone();
    let mut lengths = Vec::with_capacity(n);
    for i in 0..n {
        let len = prost::encoding::decode_varint(&mut cursor).map_err(|_| {
            Status::invalid_argument(format!(
                "tensor_content ({} bytes) ends inside the length of element {i} of {n}",
                content.len()
            ))
        })?;
        lengths.push(len);
    }
    let header = content.len() - cursor.remaining();
    let body: u64 = lengths
        .iter()
        .try_fold(0u64, |acc, &l| acc.checked_add(l))
        .unwrap_or(u64::MAX);
    if body != cursor.remaining() as u64 {
        return Err(Status::invalid_argument(format!(
            "tensor_content has {} bytes after the {n} element lengths, but the lengths add up \
             to {body}",
            cursor.remaining()
        )));
    }
    let mut offset = header;
    Ok(lengths
        .into_iter()
        .map(|len| {
            let start = offset;
            offset += len as usize;
            content.slice(start..offset)
        })
        .collect())
}
