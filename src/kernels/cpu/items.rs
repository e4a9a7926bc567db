//! [`Items`]: the element types that ops which only move elements (gather, slice, concat,
//! select, ...) accept: every fixed-size dtype, and strings, which the graphs TensorFlow builds
//! move around too (`report_uninitialized_variables` gathers and concatenates variable names).
//!
//! The dtypes no kernel computes much on (uint8, int8, int16, uint16, uint32, uint64, float16,
//! bfloat16, complex64) are moved as [`Raw`] elements, their bytes, one carrier per element
//! size: each moving kernel is compiled 4 more times rather than 9. A carrier does not know its
//! dtype; the dispatch arm that picked it names the dtype for the tensors built while its body
//! runs ([`RawDType::enter`]).

use std::borrow::Cow;
use std::cell::Cell;

use bytes::Bytes;

use crate::error::{Result, Status};
use crate::tensor::{DType, Shape, Tensor};

/// An element type whose values can be read out of a tensor and put back into a new one.
pub trait Items: Clone + PartialEq + Send + Sync + 'static {
    /// Returns the tensor's elements (borrowed where possible).
    fn items(t: &Tensor) -> Result<Cow<'_, [Self]>>;
    /// Builds a tensor of this shape from its elements.
    fn tensor(shape: impl Into<Shape>, values: Vec<Self>) -> Result<Tensor>;
}

macro_rules! fixed_items {
    ($($t:ty),*) => {
        $(impl Items for $t {
            fn items(t: &Tensor) -> Result<Cow<'_, [Self]>> {
                t.values::<$t>()
            }
            fn tensor(shape: impl Into<Shape>, values: Vec<Self>) -> Result<Tensor> {
                Tensor::from_vec(shape, values)
            }
        })*
    };
}

fixed_items!(f32, f64, i32, i64, bool);

impl Items for Bytes {
    fn items(t: &Tensor) -> Result<Cow<'_, [Self]>> {
        t.strings().map(Cow::Borrowed)
    }
    fn tensor(shape: impl Into<Shape>, values: Vec<Self>) -> Result<Tensor> {
        Tensor::from_strings(shape, values)
    }
}

/// One element of a fixed-size dtype as its `N` little-endian bytes: what the moving kernels
/// carry for the dtypes they never compute on. Equality is bitwise (right for integers; the
/// kernels that compare float16, bfloat16 or complex64 values read them typed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Raw<const N: usize>(pub [u8; N]);

impl<const N: usize> Default for Raw<N> {
    /// All bits zero: 0, +0.0 and 0+0i alike.
    fn default() -> Self {
        Raw([0; N])
    }
}

// SAFETY: `[u8; N]` with repr(transparent): no padding, every bit pattern valid, alignment 1.
unsafe impl<const N: usize> bytemuck::Zeroable for Raw<N> {}
// SAFETY: as above.
unsafe impl<const N: usize> bytemuck::Pod for Raw<N> {}

thread_local! {
    /// The dtype [`Raw`] elements are built into on this thread, while a dispatch arm runs.
    static RAW_DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
}

/// While alive, names the dtype [`Items::tensor`] gives tensors of [`Raw`] elements built on
/// this thread; the dispatch macros hold one around each body that carries `Raw` elements.
/// Dropping it restores the dtype named before (dispatches nest).
pub struct RawDType(Option<DType>);

impl RawDType {
    /// Names `dtype` until the returned guard drops.
    pub fn enter(dtype: DType) -> Self {
        RawDType(RAW_DTYPE.with(|d| d.replace(Some(dtype))))
    }
}

impl Drop for RawDType {
    fn drop(&mut self) {
        RAW_DTYPE.with(|d| d.set(self.0));
    }
}

impl<const N: usize> Items for Raw<N> {
    fn items(t: &Tensor) -> Result<Cow<'_, [Self]>> {
        if t.dtype().size() != Some(N) {
            return Err(Status::internal(format!(
                "a {} tensor was read as {N}-byte elements",
                t.dtype()
            )));
        }
        // Alignment 1: always a borrow, never a copy.
        Ok(Cow::Borrowed(bytemuck::cast_slice(t.raw_bytes()?)))
    }

    fn tensor(shape: impl Into<Shape>, values: Vec<Self>) -> Result<Tensor> {
        let Some(dtype) = RAW_DTYPE.with(Cell::get).filter(|d| d.size() == Some(N)) else {
            return Err(Status::internal(format!(
                "{N}-byte elements were built into a tensor outside a dispatch that names \
                 their dtype"
            )));
        };
        let bytes = Bytes::copy_from_slice(bytemuck::cast_slice(&values));
        Tensor::from_bytes(dtype, shape, bytes)
    }
}
