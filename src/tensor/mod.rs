//! Tensors: a dtype, a shape and a buffer.
//!
//! Numeric and bool tensors keep their elements as little-endian bytes in a [`bytes::Bytes`], so
//! a tensor travels from a `TensorProto`'s `tensor_content` to a kernel and back onto the wire
//! without a copy where the bytes are aligned. Elements a kernel computed stay in the vector it
//! wrote them to, counted ([`Owned`]): a holder knows when nobody else holds them, so the last
//! reader of a kernel's output may write its own output over it ([`Tensor::update_in_place`],
//! TensorFlow's `forward_input`). String tensors hold one `Bytes` per element; resource
//! tensors hold [`ResourceHandle`]s naming a variable (or another resource) on a device.
//!
//! A tensor a GPU kernel computed stays in that device's memory ([`DeviceBuffer`]) until host
//! code needs its elements: [`Tensor::to_host`] copies it once (the copy is kept, so a second
//! reader does not copy again), and the element views ([`Tensor::values`]) go through it.
//!
//! Invariants: `data` holds exactly `shape.num_elements()` elements of `dtype`; bool bytes are
//! 0 or 1 (every constructor checks or guarantees it).

mod dtype;
mod proto;
mod shape;
pub mod var;

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use ndarray::{ArrayD, ArrayViewD, IxDyn};

pub use dtype::DType;
pub use half::{bf16, f16};
pub use proto::{declared_bytes, MAX_PROTO_TENSOR_BYTES};
pub use shape::{PartialShape, Shape};
pub use var::Var;

use crate::error::{Result, Status};

/// A handle to a resource (a variable, a queue, an accumulator) held by one device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResourceHandle {
    /// The full name of the device holding the resource.
    pub device: String,
    /// The resource container ("" is the default one).
    pub container: String,
    /// The resource's name within its container (a variable's `shared_name`).
    pub name: String,
    /// The type of the resource (`"Var"` for variables).
    pub type_name: String,
}

/// One element of a variant tensor: an opaque value a kernel family defines (a `TensorList`).
pub type VariantValue = Arc<dyn std::any::Any + Send + Sync>;

/// The elements of a tensor.
#[derive(Clone)]
enum Data {
    /// Fixed-size elements, little-endian, row-major, in bytes shared with something else (a
    /// wire message, a file): never written in place.
    Bytes(Bytes),
    /// Fixed-size elements, little-endian, row-major, in the vector a kernel wrote them to.
    Owned(Owned),
    /// One byte string per element.
    Strings(Arc<[Bytes]>),
    /// One handle per element.
    Resources(Arc<[ResourceHandle]>),
    /// One opaque value per element.
    Variants(Arc<[VariantValue]>),
    /// A reference to a variable's storage (a TensorFlow ref edge), with the variable's name.
    Ref(Arc<Var>, Arc<str>),
    /// Fixed-size elements in another device's memory.
    Device(Arc<OnDevice>),
}

/// Memory of a device other than the host (a GPU's) holding one tensor's elements, as its
/// kernels wrote them: little-endian, row-major, as [`Data::Bytes`] would hold them.
pub trait DeviceBuffer: Send + Sync + 'static {
    /// The full name of the device whose memory holds the elements.
    fn device(&self) -> &str;

    /// The number of bytes held.
    fn byte_len(&self) -> usize;

    /// Copies the elements into host memory: one device-to-host copy, which the device counts.
    fn copy_to_host(&self) -> Result<Bytes>;

    /// The buffer as `Any`, for the device's own kernels to reach their buffer type.
    fn as_any(&self) -> &dyn Any;
}

/// A device buffer and, once some host code has read it, its copy in host memory.
struct OnDevice {
    buffer: Box<dyn DeviceBuffer>,
    host: OnceLock<Bytes>,
}

impl OnDevice {
    /// The elements in host memory, copied on the first call.
    fn host(&self) -> Result<&Bytes> {
        if let Some(bytes) = self.host.get() {
            return Ok(bytes);
        }
        let bytes = self.buffer.copy_to_host()?;
        if bytes.len() != self.buffer.byte_len() {
            return Err(Status::internal(format!(
                "{} copied {} bytes of a {}-byte buffer to the host",
                self.buffer.device(),
                bytes.len(),
                self.buffer.byte_len()
            )));
        }
        // Two readers racing both copied; the first copy is kept.
        Ok(self.host.get_or_init(|| bytes))
    }
}

/// Elements a kernel computed, in the vector it wrote them to, shared by the tensors that hold
/// them and counted: a tensor that is their only holder may write over them. A view of them as
/// [`Bytes`] ([`Owned::share`]) holds a count too, so a buffer on its way to the wire is
/// never written over.
#[derive(Clone)]
pub struct Owned(Arc<dyn OwnedElements>);

/// A vector of plain elements seen as bytes.
trait OwnedElements: Send + Sync {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl<T: bytemuck::Pod + Send + Sync> OwnedElements for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
}

impl Owned {
    fn new<T: bytemuck::Pod + Send + Sync>(values: Vec<T>) -> Self {
        Self(Arc::new(values))
    }

    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }

    /// The bytes, writable, when nothing else holds them.
    fn unique_bytes(&mut self) -> Option<&mut [u8]> {
        Arc::get_mut(&mut self.0).map(|v| v.bytes_mut())
    }

    fn is_unique(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && Arc::weak_count(&self.0) == 0
    }

    /// The elements as `Bytes`, without a copy; while those live the elements are not unique.
    fn share(&self) -> Bytes {
        Bytes::from_owner(SharedOwned(self.clone()))
    }
}

/// [`Owned`] elements lent to a `Bytes`.
struct SharedOwned(Owned);

impl AsRef<[u8]> for SharedOwned {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl Data {
    /// The bytes of fixed-size elements in host memory.
    fn host_bytes(&self) -> Option<&[u8]> {
        match self {
            Data::Bytes(bytes) => Some(bytes),
            Data::Owned(owned) => Some(owned.bytes()),
            _ => None,
        }
    }
}

impl PartialEq for Data {
    fn eq(&self, other: &Self) -> bool {
        if let (Some(a), Some(b)) = (self.host_bytes(), other.host_bytes()) {
            return a == b;
        }
        match (self, other) {
            (Data::Strings(a), Data::Strings(b)) => a == b,
            (Data::Resources(a), Data::Resources(b)) => a == b,
            (Data::Variants(a), Data::Variants(b)) => {
                a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| Arc::ptr_eq(x, y))
            }
            (Data::Ref(a, _), Data::Ref(b, _)) => Arc::ptr_eq(a, b),
            (Data::Device(a), Data::Device(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A tensor: dtype, shape and elements, in host memory or a device's. Cheap to clone (the
/// buffer is shared).
#[derive(Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: Data,
}

/// A fixed-size element type a tensor can be viewed as.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;

    /// Views little-endian bytes as elements; `None` when the bytes are misaligned.
    fn cast_slice(bytes: &[u8]) -> Option<&[Self]>;

    /// Takes ownership of elements as little-endian bytes, without a copy.
    fn into_bytes(values: Vec<Self>) -> Bytes;

    /// Takes ownership of elements, counted (see [`Owned`]), without a copy.
    fn into_owned(values: Vec<Self>) -> Owned;

    /// Copies elements out of possibly misaligned little-endian bytes.
    fn read_unaligned(bytes: &[u8]) -> Vec<Self>;
}

/// Owns a `Vec<T>` of plain values and shows it as bytes, so that `Bytes` can hold it.
struct PodOwner<T: bytemuck::Pod>(Vec<T>);

impl<T: bytemuck::Pod> AsRef<[u8]> for PodOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

macro_rules! pod_element {
    ($t:ty, $dtype:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;

            fn cast_slice(bytes: &[u8]) -> Option<&[Self]> {
                bytemuck::try_cast_slice(bytes).ok()
            }

            fn into_bytes(values: Vec<Self>) -> Bytes {
                Bytes::from_owner(PodOwner(values))
            }

            fn into_owned(values: Vec<Self>) -> Owned {
                Owned::new(values)
            }

            fn read_unaligned(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of element size")))
                    .collect()
            }
        }
    };
}

pod_element!(f32, Float);
pod_element!(f64, Double);
pod_element!(i32, Int32);
pod_element!(i64, Int64);
pod_element!(u8, UInt8);
pod_element!(i8, Int8);
pod_element!(i16, Int16);
pod_element!(u16, UInt16);
pod_element!(u32, UInt32);
pod_element!(u64, UInt64);
pod_element!(half::f16, Half);
pod_element!(half::bf16, BFloat16);
pod_element!(Complex64, Complex64);

/// One `DT_COMPLEX64` element: a real and an imaginary float32, in that order (as `std::complex`
/// lays them out, and as `tensor_content` carries them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Complex64 {
    /// The real part.
    pub re: f32,
    /// The imaginary part.
    pub im: f32,
}

// SAFETY: two f32s with no padding (repr(C), size 8, align 4); every bit pattern is valid.
unsafe impl bytemuck::Zeroable for Complex64 {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Complex64 {}

impl Complex64 {
    /// The complex number `re + im·i`.
    pub fn new(re: f32, im: f32) -> Self {
        Self { re, im }
    }

    /// Reads one element from its 8 little-endian bytes.
    pub fn from_le_bytes(bytes: [u8; 8]) -> Self {
        let [a, b, c, d, e, f, g, h] = bytes;
        Self {
            re: f32::from_le_bytes([a, b, c, d]),
            im: f32::from_le_bytes([e, f, g, h]),
        }
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;

    fn cast_slice(bytes: &[u8]) -> Option<&[Self]> {
        // SAFETY: bool has size and alignment 1, and every constructor of a bool tensor checks
        // that each byte is 0 or 1, so every byte is a valid bool.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<bool>(), bytes.len()) })
    }

    fn into_bytes(values: Vec<Self>) -> Bytes {
        Bytes::from(values.into_iter().map(u8::from).collect::<Vec<u8>>())
    }

    fn into_owned(values: Vec<Self>) -> Owned {
        Owned::new(values.into_iter().map(u8::from).collect::<Vec<u8>>())
    }

    fn read_unaligned(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

/// FAILED_PRECONDITION for a read of the reference variable `name` before its initializer ran,
/// in TensorFlow's words.
fn uninitialized_ref(name: &str) -> Status {
    Status::failed_precondition(format!(
        "Attempting to use uninitialized value {name}: run its initializer (e.g. \
         tf.compat.v1.global_variables_initializer()) before reading it"
    ))
}

impl Tensor {
    /// A tensor of `T` with this shape; fails when the number of values does not match.
    pub fn from_vec<T: Element>(shape: impl Into<Shape>, values: Vec<T>) -> Result<Self> {
        let shape = shape.into();
        if values.len() != shape.num_elements() {
            return Err(Status::invalid_argument(format!(
                "{} values given for a {} tensor of shape {shape} ({} elements)",
                values.len(),
                T::DTYPE,
                shape.num_elements()
            )));
        }
        Ok(Self {
            dtype: T::DTYPE,
            shape,
            data: Data::Owned(T::into_owned(values)),
        })
    }

    /// A scalar tensor.
    pub fn scalar<T: Element>(value: T) -> Self {
        Self {
            dtype: T::DTYPE,
            shape: Shape::scalar(),
            data: Data::Owned(T::into_owned(vec![value])),
        }
    }

    /// A tensor of `dtype` whose elements are the little-endian `bytes`, without a copy.
    pub fn from_bytes(dtype: DType, shape: impl Into<Shape>, bytes: Bytes) -> Result<Self> {
        let shape = shape.into();
        let Some(size) = dtype.size() else {
            return Err(Status::invalid_argument(format!(
                "a {dtype} tensor cannot be built from raw bytes"
            )));
        };
        // Checked: the shape may come from a peer.
        let want = shape.num_elements().checked_mul(size);
        if want != Some(bytes.len()) {
            let want = want.map_or_else(|| "more than fit in memory".into(), |w| w.to_string());
            return Err(Status::invalid_argument(format!(
                "{} bytes given for a {dtype} tensor of shape {shape} (needs {want})",
                bytes.len()
            )));
        }
        if dtype == DType::Bool {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(Status::invalid_argument(format!(
                    "bool tensor of shape {shape} has byte {} at element {i}; bool bytes must \
                     be 0 or 1",
                    bytes[i]
                )));
            }
        }
        Ok(Self {
            dtype,
            shape,
            data: Data::Bytes(bytes),
        })
    }

    /// A string tensor.
    pub fn from_strings(shape: impl Into<Shape>, values: Vec<Bytes>) -> Result<Self> {
        let shape = shape.into();
        if values.len() != shape.num_elements() {
            return Err(Status::invalid_argument(format!(
                "{} strings given for a string tensor of shape {shape}",
                values.len()
            )));
        }
        Ok(Self {
            dtype: DType::String,
            shape,
            data: Data::Strings(values.into()),
        })
    }

    /// A scalar string tensor.
    pub fn string(value: impl Into<Bytes>) -> Self {
        Self {
            dtype: DType::String,
            shape: Shape::scalar(),
            data: Data::Strings(Arc::from([value.into()])),
        }
    }

    /// A scalar resource tensor holding one handle.
    pub fn resource(handle: ResourceHandle) -> Self {
        Self {
            dtype: DType::Resource,
            shape: Shape::scalar(),
            data: Data::Resources(Arc::from([handle])),
        }
    }

    /// A resource tensor of this shape.
    pub fn from_resources(shape: impl Into<Shape>, handles: Vec<ResourceHandle>) -> Result<Self> {
        let shape = shape.into();
        if handles.len() != shape.num_elements() {
            return Err(Status::invalid_argument(format!(
                "{} handles given for a resource tensor of shape {shape}",
                handles.len()
            )));
        }
        Ok(Self {
            dtype: DType::Resource,
            shape,
            data: Data::Resources(handles.into()),
        })
    }

    /// A variant tensor of this shape, one opaque value per element.
    pub fn from_variants(shape: impl Into<Shape>, values: Vec<VariantValue>) -> Result<Self> {
        let shape = shape.into();
        if values.len() != shape.num_elements() {
            return Err(Status::invalid_argument(format!(
                "{} values given for a variant tensor of shape {shape}",
                values.len()
            )));
        }
        Ok(Self {
            dtype: DType::Variant,
            shape,
            data: Data::Variants(values.into()),
        })
    }

    /// A scalar variant tensor.
    pub fn variant(value: VariantValue) -> Self {
        Self {
            dtype: DType::Variant,
            shape: Shape::scalar(),
            data: Data::Variants(Arc::from([value])),
        }
    }

    /// A reference to variable `var` named `name` (the value of a TensorFlow ref edge, such as
    /// `VariableV2`'s output). Its dtype is the variable's; it has no elements of its own:
    /// readers take the variable's value through [`Tensor::deref`].
    pub fn reference(var: Arc<Var>, name: impl Into<Arc<str>>) -> Self {
        Self {
            dtype: var.dtype,
            shape: Shape::scalar(),
            data: Data::Ref(var, name.into()),
        }
    }

    /// A tensor of `dtype` and `shape` whose elements are in `buffer`, on its device. INTERNAL
    /// when the buffer does not hold exactly the shape's elements of a fixed-size dtype.
    pub fn on_device(
        dtype: DType,
        shape: impl Into<Shape>,
        buffer: impl DeviceBuffer,
    ) -> Result<Self> {
        let shape = shape.into();
        let want = dtype
            .size()
            .and_then(|size| shape.num_elements().checked_mul(size));
        if want != Some(buffer.byte_len()) {
            return Err(Status::internal(format!(
                "a {}-byte buffer on {} cannot hold a {dtype} tensor of shape {shape}",
                buffer.byte_len(),
                buffer.device()
            )));
        }
        Ok(Self {
            dtype,
            shape,
            data: Data::Device(Arc::new(OnDevice {
                buffer: Box::new(buffer),
                host: OnceLock::new(),
            })),
        })
    }

    /// The device buffer holding the elements, when they are in a device's memory.
    pub fn device_buffer(&self) -> Option<&dyn DeviceBuffer> {
        match &self.data {
            Data::Device(on) => Some(on.buffer.as_ref()),
            _ => None,
        }
    }

    /// The same tensor in host memory: itself when it is there already; else its elements
    /// copied from the device (once: later calls and element views reuse that copy).
    pub fn to_host(&self) -> Result<Tensor> {
        match &self.data {
            Data::Device(on) => Ok(Self {
                dtype: self.dtype,
                shape: self.shape.clone(),
                data: Data::Bytes(on.host()?.clone()),
            }),
            _ => Ok(self.clone()),
        }
    }

    /// Whether this is a reference to a variable (see [`Tensor::reference`]).
    pub fn is_ref(&self) -> bool {
        matches!(self.data, Data::Ref(..))
    }

    /// The variable a reference tensor points to, with its name; `None` for a value.
    pub fn referenced(&self) -> Option<(&Arc<Var>, &str)> {
        match &self.data {
            Data::Ref(var, name) => Some((var, name)),
            _ => None,
        }
    }

    /// The value behind a reference tensor as it is now (a snapshot), or the tensor itself when
    /// it is a value. FAILED_PRECONDITION naming the variable when it is uninitialized, as
    /// TensorFlow says it.
    pub fn deref(&self) -> Result<Tensor> {
        match &self.data {
            Data::Ref(var, name) => var.snapshot().ok_or_else(|| uninitialized_ref(name)),
            _ => Ok(self.clone()),
        }
    }

    /// Replaces the references among `tensors` that `wanted` names (by index) with their
    /// values, all read at one instant ([`var::snapshot_all`]): an op reading several variables
    /// (a `SaveV2` of a variable and its optimizer slots) sees no update of them half-applied.
    /// FAILED_PRECONDITION naming the first variable that is uninitialized.
    pub fn deref_together(tensors: &mut [Tensor], wanted: impl Fn(usize) -> bool) -> Result<()> {
        let refs: Vec<usize> = (0..tensors.len())
            .filter(|&i| tensors[i].is_ref() && wanted(i))
            .collect();
        if let [only] = refs[..] {
            tensors[only] = tensors[only].deref()?;
            return Ok(());
        }
        let vars: Vec<&Var> = refs
            .iter()
            .filter_map(|&i| tensors[i].referenced().map(|(var, _)| var.as_ref()))
            .collect();
        let values = var::snapshot_all(&vars);
        for (&i, value) in refs.iter().zip(values) {
            tensors[i] = match value {
                Some(value) => value,
                None => {
                    let name = tensors[i].referenced().map_or("", |(_, name)| name);
                    return Err(uninitialized_ref(name));
                }
            };
        }
        Ok(())
    }

    /// Whether this tensor's elements are in a buffer nobody else holds, so that
    /// [`update_in_place`](Self::update_in_place) writes them where they lie.
    pub fn is_unique(&self) -> bool {
        match &self.data {
            Data::Bytes(bytes) => bytes.is_unique(),
            Data::Owned(owned) => owned.is_unique(),
            _ => false,
        }
    }

    /// Runs `f` on the elements as a mutable slice, in this tensor's own buffer when nothing
    /// else shares it and in a fresh copy otherwise (copy-on-write); either way the tensor
    /// then holds the result and every other holder of the old buffer still sees the old
    /// elements. See [`Var`] for why variables update this way.
    pub fn update_in_place<T: Element + bytemuck::Pod, R>(
        &mut self,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        self.expect_dtype(T::DTYPE)?;
        self.own_unique_bytes();
        if let Data::Owned(owned) = &mut self.data {
            if let Some(elements) = owned
                .unique_bytes()
                .and_then(|b| bytemuck::try_cast_slice_mut::<u8, T>(b).ok())
            {
                return Ok(f(elements));
            }
        }
        // Shared, or a view into a wire message: work on a copy, which this tensor then owns.
        let Some(bytes) = self.data.host_bytes() else {
            return Err(self.not_elements());
        };
        let mut elements = match T::cast_slice(bytes) {
            Some(aligned) => aligned.to_vec(),
            None => T::read_unaligned(bytes),
        };
        let result = f(&mut elements);
        self.data = Data::Owned(Owned::new(elements));
        Ok(result)
    }

    /// Runs `f` on the raw little-endian bytes of a fixed-size tensor in host memory, where
    /// they lie when nothing else shares them and in a fresh copy otherwise, as
    /// [`update_in_place`](Self::update_in_place) does for elements.
    pub fn update_bytes_in_place<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        self.own_unique_bytes();
        if let Data::Owned(owned) = &mut self.data {
            if let Some(bytes) = owned.unique_bytes() {
                return Ok(f(bytes));
            }
        }
        let Some(bytes) = self.data.host_bytes() else {
            return Err(self.not_elements());
        };
        let mut copy = bytes.to_vec();
        let result = f(&mut copy);
        self.data = Data::Owned(Owned::new(copy));
        Ok(result)
    }

    /// Makes bytes nothing else shares (a vector handed to `Bytes`) owned elements, without a
    /// copy, so that they can be written in place.
    fn own_unique_bytes(&mut self) {
        if let Data::Bytes(bytes) = &mut self.data {
            if bytes.is_unique() {
                match std::mem::take(bytes).try_into_mut() {
                    Ok(unique) => self.data = Data::Owned(Owned::new(Vec::<u8>::from(unique))),
                    Err(shared) => *bytes = shared,
                }
            }
        }
    }

    /// What an input a kernel took to write its output over leaves behind
    /// (`OpContext::forward_input`): an empty variant tensor, which no element-reading kernel
    /// accepts.
    pub fn forwarded() -> Self {
        Self {
            dtype: DType::Variant,
            shape: Shape::new(vec![0]),
            data: Data::Variants(Arc::from(Vec::new())),
        }
    }

    /// Returns the values of a variant tensor.
    pub fn variants(&self) -> Result<&[VariantValue]> {
        match &self.data {
            Data::Variants(v) => Ok(v),
            _ => Err(Status::invalid_argument(format!(
                "expected a variant tensor, got {} with shape {}",
                self.dtype, self.shape
            ))),
        }
    }

    /// A tensor of zeros (empty strings, `false`).
    pub fn zeros(dtype: DType, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        let n = shape.num_elements();
        match dtype.size() {
            Some(size) => Ok(Self {
                dtype,
                shape,
                data: Data::Owned(Owned::new(vec![0u8; n * size])),
            }),
            None if dtype == DType::String => Self::from_strings(shape, vec![Bytes::new(); n]),
            None => Err(Status::invalid_argument(format!(
                "a {dtype} tensor has no zero value"
            ))),
        }
    }

    /// A tensor from an ndarray, taking its buffer without a copy when it is in standard layout.
    pub fn from_array<T: Element>(array: ArrayD<T>) -> Self {
        let shape = Shape::new(array.shape().to_vec());
        let values = if array.is_standard_layout() {
            let (values, offset) = array.into_raw_vec_and_offset();
            match offset {
                Some(0) | None => values,
                Some(offset) => values[offset..offset + shape.num_elements()].to_vec(),
            }
        } else {
            array.iter().copied().collect()
        };
        Self {
            dtype: T::DTYPE,
            shape,
            data: Data::Owned(T::into_owned(values)),
        }
    }

    /// Returns the dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Returns the shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Returns the dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Returns the number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Returns the number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape.num_elements()
    }

    /// Returns the raw little-endian bytes of a fixed-size tensor in host memory (`None` for a
    /// tensor in a device's memory: see [`Tensor::to_host`]).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.data.host_bytes()
    }

    /// The raw little-endian bytes of a fixed-size tensor in host memory as a [`Bytes`] that
    /// shares them, without a copy (`None` as for [`bytes`](Self::bytes)).
    pub fn shared_bytes(&self) -> Option<Bytes> {
        match &self.data {
            Data::Bytes(bytes) => Some(bytes.clone()),
            Data::Owned(owned) => Some(owned.share()),
            _ => None,
        }
    }

    /// Returns the size of the elements in bytes (string lengths for string tensors).
    pub fn byte_size(&self) -> usize {
        match &self.data {
            Data::Bytes(b) => b.len(),
            Data::Owned(owned) => owned.bytes().len(),
            Data::Strings(s) => s.iter().map(Bytes::len).sum(),
            Data::Resources(r) => r.len() * std::mem::size_of::<ResourceHandle>(),
            Data::Variants(v) => v.len() * std::mem::size_of::<VariantValue>(),
            Data::Ref(..) => 0,
            Data::Device(on) => on.buffer.byte_len(),
        }
    }

    /// The same elements with another shape of as many elements.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if shape.num_elements() != self.num_elements() {
            return Err(Status::invalid_argument(format!(
                "cannot reshape a tensor of shape {} ({} elements) to {shape} ({} elements)",
                self.shape,
                self.num_elements(),
                shape.num_elements()
            )));
        }
        Ok(Self {
            shape,
            ..self.clone()
        })
    }

    /// The error for reading the elements of a tensor that holds none of its own (a reference).
    fn not_elements(&self) -> Status {
        match &self.data {
            Data::Ref(_, name) => Status::internal(format!(
                "a reference to variable `{name}` was read as a value; the executor reads \
                 references before kernels see them"
            )),
            Data::Device(on) => Status::internal(format!(
                "a {} tensor of shape {} in {}'s memory was updated as host memory; copy it \
                 to the host first",
                self.dtype,
                self.shape,
                on.buffer.device()
            )),
            _ => Status::invalid_argument(format!(
                "a {} tensor has no fixed-size elements",
                self.dtype
            )),
        }
    }

    fn expect_dtype(&self, dtype: DType) -> Result<()> {
        if self.dtype != dtype {
            return Err(Status::invalid_argument(format!(
                "expected a {dtype} tensor, got {} with shape {}",
                self.dtype, self.shape
            )));
        }
        Ok(())
    }

    /// Views the elements as `T`: borrowed when aligned, copied otherwise. A tensor in a
    /// device's memory is copied to the host first (see [`Tensor::to_host`]).
    pub fn values<T: Element>(&self) -> Result<Cow<'_, [T]>> {
        self.expect_dtype(T::DTYPE)?;
        let bytes = match &self.data {
            Data::Device(on) => on.host()?,
            data => data.host_bytes().ok_or_else(|| self.not_elements())?,
        };
        Ok(match T::cast_slice(bytes) {
            Some(slice) => Cow::Borrowed(slice),
            None => Cow::Owned(T::read_unaligned(bytes)),
        })
    }

    /// The elements of a fixed-size tensor as their little-endian bytes, whatever the dtype:
    /// what kernels that only move elements read (a tensor in a device's memory is copied to
    /// the host first).
    pub fn raw_bytes(&self) -> Result<&[u8]> {
        match &self.data {
            Data::Device(on) => Ok(on.host()?),
            data => data.host_bytes().ok_or_else(|| self.not_elements()),
        }
    }

    /// Returns the only element of a one-element tensor.
    pub fn scalar_value<T: Element>(&self) -> Result<T> {
        let values = self.values::<T>()?;
        match values.as_ref() {
            [v] => Ok(*v),
            _ => Err(Status::invalid_argument(format!(
                "expected a scalar, got a tensor of shape {}",
                self.shape
            ))),
        }
    }

    /// Returns the elements as an ndarray (a copy only when the bytes are misaligned).
    pub fn to_array<T: Element>(&self) -> Result<ArrayD<T>> {
        let values = self.values::<T>()?.into_owned();
        Ok(
            ArrayD::from_shape_vec(IxDyn(self.dims()), values)
                .expect("shape matches element count"),
        )
    }

    /// Calls `f` with an ndarray view of the elements, avoiding a copy when aligned.
    pub fn with_view<T: Element, R>(&self, f: impl FnOnce(ArrayViewD<'_, T>) -> R) -> Result<R> {
        let values = self.values::<T>()?;
        let view = ArrayViewD::from_shape(IxDyn(self.dims()), values.as_ref())
            .expect("shape matches element count");
        Ok(f(view))
    }

    /// Returns the elements of a string tensor.
    pub fn strings(&self) -> Result<&[Bytes]> {
        match &self.data {
            Data::Strings(s) => Ok(s),
            _ => Err(Status::invalid_argument(format!(
                "expected a string tensor, got {} with shape {}",
                self.dtype, self.shape
            ))),
        }
    }

    /// Returns the handles of a resource tensor.
    pub fn resources(&self) -> Result<&[ResourceHandle]> {
        match &self.data {
            Data::Resources(r) => Ok(r),
            _ => Err(Status::invalid_argument(format!(
                "expected a resource tensor, got {} with shape {}",
                self.dtype, self.shape
            ))),
        }
    }

    /// Returns the only handle of a scalar resource tensor.
    pub fn resource_handle(&self) -> Result<&ResourceHandle> {
        match self.resources()? {
            [h] => Ok(h),
            _ => Err(Status::invalid_argument(format!(
                "expected one resource handle, got a tensor of shape {}",
                self.shape
            ))),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Data::Ref(_, name) = &self.data {
            return write!(f, "Tensor<{} ref to variable `{name}`>", self.dtype);
        }
        if let Data::Device(on) = &self.data {
            // Printing must not copy the elements off the device.
            let device = on.buffer.device();
            return write!(f, "Tensor<{}{} on {device}>", self.dtype, self.shape);
        }
        write!(f, "Tensor<{}{}>", self.dtype, self.shape)?;
        const SHOWN: usize = 8;
        macro_rules! shown {
            ($t:ty) => {
                write!(
                    f,
                    " {:?}",
                    &self.values::<$t>().map_err(|_| fmt::Error)?[..self.num_elements().min(SHOWN)]
                )
            };
        }
        match self.dtype {
            DType::Float => shown!(f32),
            DType::Double => shown!(f64),
            DType::Int32 => shown!(i32),
            DType::Int64 => shown!(i64),
            DType::Bool => shown!(bool),
            DType::UInt8 => shown!(u8),
            DType::Int8 => shown!(i8),
            DType::Int16 => shown!(i16),
            DType::UInt16 => shown!(u16),
            DType::UInt32 => shown!(u32),
            DType::UInt64 => shown!(u64),
            DType::Half => shown!(f16),
            DType::BFloat16 => shown!(bf16),
            DType::Complex64 => shown!(Complex64),
            DType::String => write!(
                f,
                " {:?}",
                &self.strings().map_err(|_| fmt::Error)?[..self.num_elements().min(SHOWN)]
            ),
            DType::Resource => write!(f, " {:?}", self.resources().map_err(|_| fmt::Error)?),
            DType::Variant => write!(f, " ({} variant values)", self.num_elements()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_views_and_arrays() {
        let t = Tensor::from_vec([2, 3], vec![1.0f32, 2., 3., 4., 5., 6.]).unwrap();
        assert_eq!(t.dtype(), DType::Float);
        assert_eq!(
            t.values::<f32>().unwrap().as_ref(),
            &[1.0, 2., 3., 4., 5., 6.]
        );
        assert!(t.values::<i32>().is_err());
        let a = t.to_array::<f32>().unwrap();
        assert_eq!(a[[1, 2]], 6.0);
        assert_eq!(Tensor::from_array(a), t);
        assert!(Tensor::from_vec([2, 2], vec![1i64, 2, 3]).is_err());
    }

    #[test]
    fn misaligned_bytes_are_copied_not_rejected() {
        let raw = Bytes::from(vec![0u8, 0, 0, 128, 63, 0, 0, 0, 64]);
        let t = Tensor::from_bytes(DType::Float, [2], raw.slice(1..)).unwrap();
        assert_eq!(t.values::<f32>().unwrap().as_ref(), &[1.0, 2.0]);
    }

    #[test]
    fn bool_bytes_are_checked() {
        assert!(Tensor::from_bytes(DType::Bool, [2], Bytes::from_static(&[1, 2])).is_err());
        let t = Tensor::from_bytes(DType::Bool, [2], Bytes::from_static(&[1, 0])).unwrap();
        assert_eq!(t.values::<bool>().unwrap().as_ref(), &[true, false]);
    }
}
