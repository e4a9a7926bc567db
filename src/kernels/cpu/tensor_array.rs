//! The TensorArray resource: a per-step array of tensors that TensorFlow 1 while loops
//! (`tf.compat.v1.nn.dynamic_rnn`) write one element per iteration into, and whose gradient
//! arrays their backward loops fill. Its kernels are in [`super::tensor_array_ops`].
//!
//! **Semantics** are TensorFlow's `tensor_array.h`, messages included: an index is written at
//! most once, except in gradient arrays, whose writes to one index add up (the partial
//! gradients of the several reads of a forward element); an element is not written after it
//! was read; with `clear_after_read` an element reads once; an unwritten element reads as zeros
//! when the element shape is fully known (in a gradient array, the shape of the forward
//! element), and fails otherwise; writes past the size fail unless `dynamic_size`, which a
//! gradient request turns off on the forward array. Every method takes the array's lock for
//! its whole work, so concurrent kernels see whole writes and reads.

use std::sync::{Mutex, MutexGuard};

use super::array::tf_dtype_name;
use super::rows;
use crate::error::{Result, Status};
use crate::runtime::resource::Resource;
use crate::tensor::{DType, PartialShape, Shape, Tensor};

/// One array: a dtype, an element shape (partly known) and its elements with their state.
pub struct TensorArray {
    /// The name in messages (`<name>_<n>`, `<name>_<n>@<source>` for a gradient array).
    pub(super) name: String,
    pub(super) dtype: DType,
    /// Writes to a written index add up instead of failing (gradient arrays).
    multiple_writes_aggregate: bool,
    clear_after_read: bool,
    is_grad: bool,
    /// Every element has the same shape: the first write fixes the element shape.
    pub(super) identical_element_shapes: bool,
    state: Mutex<State>,
}

/// What an array's lock guards.
pub(super) struct State {
    /// Set by `TensorArrayCloseV3`: every later use fails.
    pub(super) closed: bool,
    /// Writes past the end grow the array.
    pub(super) dynamic_size: bool,
    /// Set once a write aggregated: a gradient of this array would be wrong.
    pub(super) gradients_disallowed: bool,
    /// The size after the last split (what a gradient array concatenates); -1 before any.
    pub(super) marked_size: i64,
    pub(super) element_shape: PartialShape,
    pub(super) slots: Vec<Slot>,
}

/// One element and what has happened to it.
#[derive(Clone, Default)]
pub(super) struct Slot {
    /// The value; `None` with `written` set means zeros of `shape`.
    value: Option<Tensor>,
    shape: Option<Shape>,
    written: bool,
    read: bool,
    cleared: bool,
}

impl Resource for TensorArray {
    fn type_name(&self) -> &'static str {
        "TensorArray"
    }
}

/// How a new array behaves.
pub(super) struct Options {
    pub(super) dtype: DType,
    pub(super) size: usize,
    pub(super) element_shape: PartialShape,
    pub(super) identical_element_shapes: bool,
    pub(super) dynamic_size: bool,
    pub(super) clear_after_read: bool,
    pub(super) is_grad: bool,
    pub(super) marked_size: i64,
}

impl TensorArray {
    pub(super) fn new(name: String, o: Options) -> Result<Self> {
        rows::check_slots(&format!("TensorArray {name}"), o.size)?;
        Ok(Self {
            name,
            dtype: o.dtype,
            multiple_writes_aggregate: o.is_grad,
            clear_after_read: o.clear_after_read,
            is_grad: o.is_grad,
            identical_element_shapes: o.identical_element_shapes,
            state: Mutex::new(State {
                closed: false,
                dynamic_size: o.dynamic_size,
                gradients_disallowed: false,
                marked_size: o.marked_size,
                element_shape: o.element_shape,
                slots: vec![Slot::default(); o.size],
            }),
        })
    }

    /// Returns the element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Locks the state, failing when the array was closed.
    pub(super) fn open(&self) -> Result<MutexGuard<'_, State>> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.closed {
            return Err(Status::invalid_argument(format!(
                "TensorArray {} has already been closed.",
                self.name
            )));
        }
        Ok(s)
    }

    /// Drops the elements and marks the array closed: every later use fails.
    pub fn close(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.slots.clear();
        s.closed = true;
    }

    /// Returns the number of elements.
    pub fn size(&self) -> Result<usize> {
        Ok(self.open()?.slots.len())
    }

    /// Returns the element shape as known so far.
    pub fn element_shape(&self) -> Result<PartialShape> {
        Ok(self.open()?.element_shape.clone())
    }

    /// Writes `value` at `index` (adds it, in a gradient array whose index holds a value).
    pub fn write(&self, index: i64, value: &Tensor) -> Result<()> {
        let mut s = self.open()?;
        self.locked_write(&mut s, index, value)
    }

    /// Reads the element at `index`.
    pub fn read(&self, index: i64) -> Result<Tensor> {
        let mut s = self.open()?;
        self.locked_read(&mut s, index)
    }

    fn locked_write(&self, s: &mut State, index: i64, value: &Tensor) -> Result<()> {
        let name = &self.name;
        let len = s.slots.len();
        if index < 0 || (!s.dynamic_size && index as usize >= len) {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Tried to write to index {index} but array is not resizeable \
                 and size is: {len}"
            )));
        }
        let i = index as usize;
        if i >= len {
            rows::check_slots(&format!("TensorArray {name}"), i + 1)?;
            s.slots.resize(i + 1, Slot::default());
        }
        if value.dtype() != self.dtype {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Could not write to TensorArray index {index} because the \
                 value dtype is {} but TensorArray dtype is {}.",
                tf_dtype_name(value.dtype()),
                tf_dtype_name(self.dtype)
            )));
        }
        if !s.element_shape.is_compatible_with(value.shape()) {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Could not write to TensorArray index {index} because the \
                 value shape is {} which is incompatible with the TensorArray's inferred \
                 element shape: {} (consider setting infer_shape=False).",
                value.shape(),
                s.element_shape
            )));
        } else if self.identical_element_shapes && !s.element_shape.is_fully_defined() {
            s.element_shape = PartialShape::from(value.shape());
        }
        let slot = &mut s.slots[i];
        if slot.read {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Could not write to TensorArray index {index} because it has \
                 already been read."
            )));
        }
        if slot.written && !self.multiple_writes_aggregate {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Could not write to TensorArray index {index} because it has \
                 already been written to."
            )));
        }
        if !slot.written {
            slot.value = Some(value.clone());
            slot.shape = Some(value.shape().clone());
            slot.written = true;
            return Ok(());
        }
        // A gradient array: a second partial gradient for this element.
        let existing = slot.shape.clone().unwrap_or_default();
        if value.shape() != &existing {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Could not aggregate to TensorArray index {index} because \
                 the existing shape is {existing} but the new input shape is {}.",
                value.shape()
            )));
        }
        slot.value = Some(match &slot.value {
            // Only a shape was stored (zeros): the value is the sum.
            None => value.clone(),
            Some(v) if v.num_elements() == 0 => value.clone(),
            Some(v) => rows::add(v, value)?,
        });
        s.gradients_disallowed = true;
        Ok(())
    }

    fn locked_read(&self, s: &mut State, index: i64) -> Result<Tensor> {
        let name = &self.name;
        let len = s.slots.len();
        if index < 0 || (!self.is_grad && index as usize >= len) {
            return Err(Status::invalid_argument(format!(
                "Tried to read from index {index} but array size is: {len}"
            )));
        }
        let i = index as usize;
        if i >= len || !s.slots[i].written {
            // Never written (a gradient a stop_gradient kept from being written, or an element
            // nobody wrote): zeros of the element's shape, when it is known.
            let known = if self.is_grad && i < len {
                s.slots[i].shape.clone()
            } else {
                None
            };
            let shape = match known.or_else(|| s.element_shape.to_shape()) {
                Some(shape) => shape,
                None => {
                    return Err(Status::invalid_argument(format!(
                        "TensorArray {name}: Could not read from TensorArray index {index}.  \
                         Furthermore, the element shape is not fully defined: {}.  It is \
                         possible you are working with a resizeable TensorArray and \
                         stop_gradients is not allowing the gradients to be written.  If you \
                         set the full element_shape property on the forward TensorArray, the \
                         proper all-zeros tensor will be returned instead of incurring this \
                         error.",
                        s.element_shape
                    )))
                }
            };
            if i >= len {
                rows::check_slots(&format!("TensorArray {name}"), i + 1)?;
                s.slots.resize(i + 1, Slot::default());
                for slot in &mut s.slots[len..] {
                    slot.shape = Some(shape.clone());
                    slot.written = true;
                }
            } else {
                s.slots[i].shape = Some(shape);
                s.slots[i].written = true;
            }
        }
        let slot = &mut s.slots[i];
        if slot.cleared {
            return Err(Status::invalid_argument(format!(
                "TensorArray {name}: Could not read index {index} twice because it was cleared \
                 after a previous read (perhaps try setting clear_after_read = false?)."
            )));
        }
        let value = match &slot.value {
            Some(v) => v.clone(),
            None => rows::zeros(self.dtype, slot.shape.as_ref().expect("written slot"))?,
        };
        if self.clear_after_read {
            slot.value = None;
            slot.cleared = true;
        } else {
            slot.value = Some(value.clone());
        }
        slot.read = true;
        Ok(value)
    }

    /// Reads the elements at `indices`, in order.
    pub(super) fn read_many(&self, indices: &[i64]) -> Result<Vec<Tensor>> {
        let mut s = self.open()?;
        indices
            .iter()
            .map(|&i| self.locked_read(&mut s, i))
            .collect()
    }

    /// Writes `values[k]` at `indices[k]`, in order.
    pub(super) fn write_many(&self, indices: &[i64], values: &[Tensor]) -> Result<()> {
        let mut s = self.open()?;
        for (&i, v) in indices.iter().zip(values) {
            self.locked_write(&mut s, i, v)?;
        }
        Ok(())
    }

    /// Narrows the element shape to what `candidate` also says (a gather's `element_shape`).
    pub(super) fn set_element_shape(&self, candidate: &PartialShape) -> Result<()> {
        let mut s = self.open()?;
        s.element_shape = s.element_shape.merge_with(candidate)?;
        Ok(())
    }

    /// The number of elements a concat reads: the forward array's size after its last split
    /// for a gradient array (the same elements the forward split wrote), else the size.
    pub(super) fn concat_size(&self) -> Result<usize> {
        let s = self.open()?;
        Ok(match (self.is_grad, s.marked_size) {
            (true, m) if m >= 0 => m as usize,
            _ => s.slots.len(),
        })
    }

    /// Gives every element `rhs` wrote its shape here, as if zeros had been written (later
    /// aggregate writes replace them, reads return them): what a new gradient array starts
    /// from. `prepend` goes in front of each shape (TensorArrayGradWithShape).
    pub(super) fn copy_shapes_from(&self, rhs: &TensorArray, prepend: &[usize]) -> Result<()> {
        let mut s = self.open()?;
        let r = rhs.open()?;
        if s.slots.len() != r.slots.len() {
            return Err(Status::invalid_argument(format!(
                "TensorArray sizes do not match during CopyShapesFrom: {} has size {} but rhs \
                 {} has size {}",
                self.name,
                s.slots.len(),
                rhs.name,
                r.slots.len()
            )));
        }
        for (mine, theirs) in s.slots.iter_mut().zip(&r.slots) {
            if !theirs.written {
                continue;
            }
            let mut dims = prepend.to_vec();
            dims.extend_from_slice(theirs.shape.clone().unwrap_or_default().dims());
            mine.shape = Some(Shape::new(dims));
            mine.written = true;
        }
        Ok(())
    }
}
