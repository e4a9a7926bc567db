//! TensorList: the list value TensorFlow 2's functional `While` loops carry, and the kernels
//! that make and change one element at a time: `EmptyTensorList`, `TensorListReserve`,
//! `TensorListPushBack`, `TensorListPopBack`, `TensorListGetItem`, `TensorListSetItem`,
//! `TensorListLength`, `TensorListElementShape`, `TensorListResize`,
//! `TensorListConcatLists`; and the `ZerosLike` and `AddN` of lists that gradients of loops
//! take. The kernels that convert between a list and one tensor are in
//! [`super::list_tensor`].
//!
//! A list is a value, not a resource: a scalar variant tensor holding an
//! `Arc<`[`TensorList`]`>`. Lists are immutable once made, so every op that changes one
//! returns a new list: a copy of the element vector whose tensors share their buffers with
//! the input's (TensorFlow forwards the input's buffer instead when nobody else holds it;
//! tessera copies the vector of handles, which costs a pointer per element). An element may be
//! unset (reserved, never written): reading it gives zeros of the element shape when that is
//! known from the list, the op's `element_shape` input or the list's set elements, and fails
//! otherwise, as TensorFlow's `list_kernels` do; messages are TensorFlow's.

use std::sync::Arc;

use super::array::tf_dtype_name;
use super::rows;
use super::{input, int_scalar};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, PartialShape, Tensor};

/// Returns the factory for an element-wise TensorList op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "EmptyTensorList" => |n| ListOp::build(n, empty),
        "TensorListReserve" => |n| ListOp::build(n, reserve),
        "TensorListPushBack" => |n| ListOp::build(n, push_back),
        "TensorListPopBack" => |n| ListOp::build(n, pop_back),
        "TensorListGetItem" => |n| ListOp::build(n, get_item),
        "TensorListSetItem" => |n| ListOp::build(n, set_item),
        "TensorListLength" => |n| ListOp::build(n, length),
        "TensorListElementShape" => |n| ListOp::build(n, element_shape),
        "TensorListResize" => |n| ListOp::build(n, resize),
        "TensorListConcatLists" => |n| ListOp::build(n, concat_lists),
        _ => return super::list_tensor::kernel_for(op),
    };
    Some(factory)
}

/// A list of tensors of one dtype: TensorFlow's `TensorList`.
#[derive(Clone, Debug)]
pub struct TensorList {
    /// The dtype of every element.
    pub element_dtype: DType,
    /// What is known of every element's shape.
    pub element_shape: PartialShape,
    /// The elements; `None` for one reserved and never set.
    pub tensors: Vec<Option<Tensor>>,
    /// The most elements a push may make (-1: no limit).
    pub max_num_elements: i64,
}

impl TensorList {
    /// An empty list of `element_dtype` elements of `element_shape`.
    pub fn new(element_dtype: DType, element_shape: PartialShape) -> Self {
        Self {
            element_dtype,
            element_shape,
            tensors: Vec::new(),
            max_num_elements: -1,
        }
    }

    /// The list as a scalar variant tensor.
    pub fn into_tensor(self) -> Tensor {
        Tensor::variant(Arc::new(self))
    }

    /// The list held by the scalar variant tensor `t`.
    pub fn from_tensor(t: &Tensor) -> Result<Arc<TensorList>> {
        if t.rank() != 0 {
            return Err(Status::invalid_argument(format!(
                "Input list must be a scalar saw: {}",
                t.shape()
            )));
        }
        let not_a_list = || {
            Status::invalid_argument(format!(
                "Input handle is not a list. Saw: '{} tensor'",
                tf_dtype_name(t.dtype())
            ))
        };
        let value = t.variants().map_err(|_| not_a_list())?[0].clone();
        value.downcast::<TensorList>().map_err(|_| not_a_list())
    }
}

/// The signature of a TensorList kernel: its context and its node's attrs.
type ListFn = fn(&mut OpContext<'_>, &Attrs) -> Result<()>;

/// The attrs list kernels read, parsed once.
pub(super) struct Attrs {
    /// `element_dtype`, when the op has it.
    pub element_dtype: Option<DType>,
    /// `shape_type` (int32 unless set).
    pub shape_type: DType,
    /// `num_elements` (TensorListStack), -1 unless set.
    pub num_elements: i64,
    /// `resize_if_index_out_of_bounds` (TensorListSetItem).
    pub resize: bool,
    /// `element_shape` (TensorListConcat), unknown unless set.
    pub element_shape: PartialShape,
}

/// A TensorList kernel: a function and its node's attrs.
pub(super) struct ListOp {
    f: ListFn,
    attrs: Attrs,
}

impl ListOp {
    /// Builds the kernel for `node` computing with `f`.
    pub(super) fn build(node: &NodeDef, f: ListFn) -> Result<Arc<dyn OpKernel>> {
        let element_dtype = match attr::get(node, "element_dtype") {
            Some(_) => Some(attr::dtype(node, "element_dtype")?),
            None => None,
        };
        let shape_type = match attr::get(node, "shape_type") {
            Some(_) => attr::dtype(node, "shape_type")?,
            None => DType::Int32,
        };
        let element_shape = match attr::get(node, "element_shape") {
            Some(_) => attr::shape(node, "element_shape")?,
            None => PartialShape::unknown(),
        };
        Ok(Arc::new(ListOp {
            f,
            attrs: Attrs {
                element_dtype,
                shape_type,
                num_elements: attr::int_or(node, "num_elements", -1)?,
                resize: attr::bool_or(node, "resize_if_index_out_of_bounds", false)?,
                element_shape,
            },
        }))
    }
}

impl OpKernel for ListOp {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        (self.f)(ctx, &self.attrs)
    }
}

/// The list at input `i`.
pub(super) fn list_input(ctx: &OpContext<'_>, i: usize) -> Result<Arc<TensorList>> {
    TensorList::from_tensor(ctx.input(i)?).map_err(|e| ctx.named(e))
}

/// The op's `element_dtype` attr.
pub(super) fn element_dtype(ctx: &OpContext<'_>, a: &Attrs) -> Result<DType> {
    a.element_dtype
        .ok_or_else(|| ctx.invalid("the node has no `element_dtype` attr; set it"))
}

/// Fails unless the list holds elements of the op's `element_dtype`.
pub(super) fn check_dtype(ctx: &OpContext<'_>, a: &Attrs, list: &TensorList) -> Result<()> {
    let want = element_dtype(ctx, a)?;
    if want != list.element_dtype {
        return Err(ctx.invalid(format!(
            "Invalid data types; op elements {} but list elements {}",
            tf_dtype_name(want),
            tf_dtype_name(list.element_dtype)
        )));
    }
    Ok(())
}

/// Reads a shape tensor as TensorFlow's list ops take it: a vector of int32 or int64 sizes,
/// -1 for an unknown one, or the scalar -1 for an unknown rank.
pub(super) fn shape_from_tensor(ctx: &OpContext<'_>, t: &Tensor) -> Result<PartialShape> {
    if !matches!(t.dtype(), DType::Int32 | DType::Int64) {
        return Err(ctx.invalid(format!(
            "Expected an int32 or int64 shape tensor; found {}",
            tf_dtype_name(t.dtype())
        )));
    }
    let values = super::int_values(ctx, t, "element_shape")?;
    if t.rank() == 0 {
        return if values == [-1] {
            Ok(PartialShape::unknown())
        } else {
            Err(ctx.invalid(
                "The only valid scalar shape tensor is the fully unknown shape specified as -1.",
            ))
        };
    }
    if t.rank() != 1 {
        return Err(ctx.invalid(format!(
            "shape must be a vector, got a tensor of shape {}",
            t.shape()
        )));
    }
    let dims = values
        .iter()
        .map(|&d| match d {
            -1 => Ok(None),
            d if d >= 0 => Ok(Some(d as usize)),
            d => Err(ctx.invalid(format!("Dimension {d} must be >= -1"))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(PartialShape::new(dims))
}

/// The element shape input `i` says, merged with what the list knows.
pub(super) fn element_shape_from_input(
    ctx: &OpContext<'_>,
    list: &TensorList,
    i: usize,
) -> Result<PartialShape> {
    let shape = shape_from_tensor(ctx, ctx.input(i)?)?;
    shape
        .merge_with(&list.element_shape)
        .map_err(|e| ctx.named(e))
}

/// `shape` merged with the shapes of the set elements among `elements`.
pub(super) fn merge_set_shapes<'a>(
    ctx: &OpContext<'_>,
    mut shape: PartialShape,
    elements: impl IntoIterator<Item = &'a Option<Tensor>>,
) -> Result<PartialShape> {
    for t in elements.into_iter().flatten() {
        shape = shape
            .merge_with(&PartialShape::from(t.shape()))
            .map_err(|e| ctx.named(e))?;
    }
    Ok(shape)
}

/// Reads a scalar int32 input (an index, a count); `what` names it in TensorFlow's words.
fn scalar_i32(ctx: &OpContext<'_>, i: usize, what: &str) -> Result<i64> {
    let t = ctx.input(i)?;
    if t.rank() != 0 {
        return Err(ctx.invalid(format!("{what} must be a scalar, got shape {}", t.shape())));
    }
    int_scalar(ctx, t, what)
}

/// EmptyTensorList(element_shape, max_num_elements) -> handle.
fn empty(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let max = ctx.input(1)?;
    if max.rank() != 0 {
        return Err(ctx.invalid(format!(
            "max_num_elements expected to be a scalar but got shape: {}",
            max.shape()
        )));
    }
    let max = int_scalar(ctx, max, "max_num_elements")?;
    if max < -1 {
        return Err(ctx.invalid(format!(
            "max_num_elements must be -1 (no limit) or at least 0, got {max}"
        )));
    }
    let shape = shape_from_tensor(ctx, ctx.input(0)?)?;
    let mut list = TensorList::new(element_dtype(ctx, a)?, shape);
    list.max_num_elements = max;
    ctx.set_output(0, list.into_tensor());
    Ok(())
}

/// TensorListReserve(element_shape, num_elements) -> handle: `num_elements` unset elements.
fn reserve(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let n = ctx.input(1)?;
    if n.rank() != 0 {
        return Err(ctx.invalid(format!(
            "The num_elements to reserve must be a tensor size 1, but got {}",
            n.shape()
        )));
    }
    let n = int_scalar(ctx, n, "num_elements")?;
    if n < 0 {
        return Err(ctx.invalid(format!(
            "The num_elements to reserve must be a non negative number, but got {n}"
        )));
    }
    rows::check_slots("TensorList", n as usize).map_err(|e| ctx.named(e))?;
    let shape = shape_from_tensor(ctx, ctx.input(0)?)?;
    let mut list = TensorList::new(element_dtype(ctx, a)?, shape);
    list.tensors = vec![None; n as usize];
    ctx.set_output(0, list.into_tensor());
    Ok(())
}

/// TensorListPushBack(input_handle, tensor) -> output_handle.
fn push_back(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let t = input(ctx, 1)?;
    let dtype = element_dtype(ctx, a)?;
    if t.dtype() != dtype {
        return Err(ctx.invalid(format!(
            "Invalid data types; list elements {} but tried to append {}",
            tf_dtype_name(dtype),
            tf_dtype_name(t.dtype())
        )));
    }
    let list = list_input(ctx, 0)?;
    if !list.element_shape.is_compatible_with(t.shape()) {
        return Err(ctx.invalid(format!(
            "Tried to append a tensor with incompatible shape to a list. Op element shape: {} \
             list shape: {}",
            t.shape(),
            list.element_shape
        )));
    }
    check_dtype(ctx, a, &list)?;
    let len = list.tensors.len();
    if list.max_num_elements != -1 && len as i64 >= list.max_num_elements {
        return Err(ctx.invalid(format!(
            "Tried to push item into a full list list size: {len} max_num_elements: {}",
            list.max_num_elements
        )));
    }
    rows::check_slots("TensorList", len + 1).map_err(|e| ctx.named(e))?;
    let mut out = (*list).clone();
    out.tensors.push(Some(t));
    ctx.set_output(0, out.into_tensor());
    Ok(())
}

/// TensorListPopBack(input_handle, element_shape) -> (output_handle, tensor).
fn pop_back(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    check_dtype(ctx, a, &list)?;
    let Some(last) = list.tensors.last() else {
        return Err(ctx.invalid("Trying to pop from an empty list."));
    };
    let value = match last {
        Some(t) => t.clone(),
        None => {
            let shape = element_shape_from_input(ctx, &list, 1)?;
            let Some(shape) = shape.to_shape() else {
                return Err(ctx.invalid(format!(
                    "Trying to read an uninitialized tensor but element_shape is not fully \
                     defined.{shape}"
                )));
            };
            rows::zeros(list.element_dtype, &shape).map_err(|e| ctx.named(e))?
        }
    };
    let mut out = (*list).clone();
    out.tensors.pop();
    ctx.set_output(0, out.into_tensor());
    ctx.set_output(1, value);
    Ok(())
}

/// TensorListGetItem(input_handle, index, element_shape) -> item.
fn get_item(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    check_dtype(ctx, a, &list)?;
    let index = scalar_i32(ctx, 1, "index")?;
    let len = list.tensors.len();
    if index < 0 || index as usize >= len {
        return Err(ctx.invalid(format!(
            "Trying to access element {index} in a list with {len} elements."
        )));
    }
    let value = match &list.tensors[index as usize] {
        Some(t) => t.clone(),
        None => {
            let mut shape = element_shape_from_input(ctx, &list, 2)?;
            if !shape.is_fully_defined() {
                // Every set element has the shape an unset one reads as.
                shape = merge_set_shapes(ctx, shape, &list.tensors)?;
            }
            let Some(shape) = shape.to_shape() else {
                return Err(ctx.invalid(format!(
                    "Trying to read an uninitialized tensor but element_shape is not fully \
                     defined: {shape} and no list element is set."
                )));
            };
            rows::zeros(list.element_dtype, &shape).map_err(|e| ctx.named(e))?
        }
    };
    ctx.set_output(0, value);
    Ok(())
}

/// TensorListSetItem(input_handle, index, item) -> output_handle; with
/// `resize_if_index_out_of_bounds`, an index past the end first grows the list to it.
fn set_item(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    check_dtype(ctx, a, &list)?;
    let index = scalar_i32(ctx, 1, "index")?;
    let len = list.tensors.len();
    if index < 0 || (!a.resize && index as usize >= len) {
        return Err(ctx.invalid(format!(
            "Trying to modify element {index} in a list with {len} elements."
        )));
    }
    let item = input(ctx, 2)?;
    if item.dtype() != list.element_dtype {
        return Err(ctx.invalid(format!(
            "Invalid data types; list elements {} but tried to set {}",
            tf_dtype_name(list.element_dtype),
            tf_dtype_name(item.dtype())
        )));
    }
    if !list.element_shape.is_compatible_with(item.shape()) {
        return Err(ctx.invalid(format!(
            "Tried to set a tensor with incompatible shape at a list index. Item element shape: \
             {} list shape: {}",
            item.shape(),
            list.element_shape
        )));
    }
    let i = index as usize;
    let mut out = (*list).clone();
    if i >= len {
        rows::check_slots("TensorList", i + 1).map_err(|e| ctx.named(e))?;
        out.tensors.resize(i + 1, None);
    }
    out.tensors[i] = Some(item);
    ctx.set_output(0, out.into_tensor());
    Ok(())
}

/// TensorListLength(input_handle) -> length.
fn length(ctx: &mut OpContext<'_>, _: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    ctx.set_output(0, Tensor::scalar(list.tensors.len() as i32));
    Ok(())
}

/// TensorListElementShape(input_handle) -> element_shape: the sizes, -1 for unknown ones, or
/// the scalar -1 when even the rank is unknown.
fn element_shape(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    let (dims, values): (Vec<usize>, Vec<i64>) = match list.element_shape.dims() {
        None => (vec![], vec![-1]),
        Some(d) => (
            vec![d.len()],
            d.iter().map(|d| d.map_or(-1, |d| d as i64)).collect(),
        ),
    };
    let out = match a.shape_type {
        DType::Int64 => Tensor::from_vec(dims, values)?,
        _ => Tensor::from_vec(dims, values.iter().map(|&v| v as i32).collect())?,
    };
    ctx.set_output(0, out);
    Ok(())
}

/// TensorListResize(input_handle, size) -> output_handle: cut to `size` elements or grown
/// with unset ones.
fn resize(ctx: &mut OpContext<'_>, _: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    let size = scalar_i32(ctx, 1, "size")?;
    if size < 0 {
        return Err(ctx.invalid(format!(
            "TensorListSlice expects size to be non-negative. Got: {size}"
        )));
    }
    rows::check_slots("TensorList", size as usize).map_err(|e| ctx.named(e))?;
    let mut out = (*list).clone();
    out.tensors.resize(size as usize, None);
    ctx.set_output(0, out.into_tensor());
    Ok(())
}

/// TensorListConcatLists(input_a, input_b) -> output: each list of `input_a` followed by the
/// same-position list of `input_b`.
fn concat_lists(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let (ta, tb) = (input(ctx, 0)?, input(ctx, 1)?);
    if ta.shape() != tb.shape() {
        return Err(ctx.invalid(format!(
            "Incompatible input TensorList tensor shapes: {} vs. {}",
            ta.shape(),
            tb.shape()
        )));
    }
    let want = element_dtype(ctx, a)?;
    let (va, vb) = (
        ta.variants().map_err(|e| ctx.invalid(e.message()))?,
        tb.variants().map_err(|e| ctx.invalid(e.message()))?,
    );
    let mut outs = Vec::with_capacity(va.len());
    for (b, (x, y)) in va.iter().zip(vb).enumerate() {
        let la = x
            .clone()
            .downcast::<TensorList>()
            .map_err(|_| ctx.invalid(format!("input_a is not a TensorList at index {b}.")))?;
        let lb = y
            .clone()
            .downcast::<TensorList>()
            .map_err(|_| ctx.invalid(format!("input_b is not a TensorList at index {b}.")))?;
        for (which, l) in [("input_a", &la), ("input_b", &lb)] {
            if l.element_dtype != want {
                return Err(ctx.invalid(format!(
                    "{which}[{b}].dtype != element_dtype.  Saw: {} vs. {}",
                    tf_dtype_name(l.element_dtype),
                    tf_dtype_name(want)
                )));
            }
        }
        if la.element_shape != lb.element_shape {
            return Err(ctx.invalid(format!(
                "input_a and input_b TensorList element shapes are not identical at index {b}.  \
                 Saw {} vs. {}",
                la.element_shape, lb.element_shape
            )));
        }
        rows::check_slots("TensorList", la.tensors.len() + lb.tensors.len())
            .map_err(|e| ctx.named(e))?;
        let mut out = (*la).clone();
        out.tensors.extend(lb.tensors.iter().cloned());
        outs.push(Arc::new(out) as crate::tensor::VariantValue);
    }
    ctx.set_output(0, Tensor::from_variants(ta.shape().clone(), outs)?);
    Ok(())
}

/// `ZerosLike` of a variant tensor of lists: lists of the same length whose set elements are
/// zeros (unset ones stay unset), as TensorFlow's `TensorListZerosLike`.
pub(super) fn zeros_like(t: &Tensor) -> Result<Tensor> {
    let lists = t
        .variants()?
        .iter()
        .map(|v| {
            let list = v
                .clone()
                .downcast::<TensorList>()
                .map_err(|_| not_a_list("ZerosLike"))?;
            let tensors = list
                .tensors
                .iter()
                .map(|e| e.as_ref().map(zeros_of).transpose())
                .collect::<Result<Vec<_>>>()?;
            let zeros = TensorList {
                tensors,
                ..(*list).clone()
            };
            Ok(Arc::new(zeros) as crate::tensor::VariantValue)
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::from_variants(t.shape().clone(), lists)
}

/// Zeros shaped and typed like `t` (lists of zeros for a variant tensor).
fn zeros_of(t: &Tensor) -> Result<Tensor> {
    match t.dtype() {
        DType::Variant => zeros_like(t),
        dtype => rows::zeros(dtype, t.shape()),
    }
}

/// `a + b` for two variant tensors of lists (`AddN` of list gradients): element by element,
/// an unset element taking the other's value, as TensorFlow's `TensorListBinaryAdd`.
pub(super) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.shape() != b.shape() {
        return Err(Status::invalid_argument(format!(
            "Trying to add two variant tensors of different shapes: {} and {}",
            a.shape(),
            b.shape()
        )));
    }
    let sums = a
        .variants()?
        .iter()
        .zip(b.variants()?)
        .map(|(x, y)| {
            let la = x
                .clone()
                .downcast::<TensorList>()
                .map_err(|_| not_a_list("AddN"))?;
            let lb = y
                .clone()
                .downcast::<TensorList>()
                .map_err(|_| not_a_list("AddN"))?;
            Ok(Arc::new(add_lists(&la, &lb)?) as crate::tensor::VariantValue)
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::from_variants(a.shape().clone(), sums)
}

fn add_lists(a: &TensorList, b: &TensorList) -> Result<TensorList> {
    if a.element_dtype != b.element_dtype {
        return Err(Status::invalid_argument(format!(
            "Trying to add two lists of tensors of different dtypes. One is {} and the other is \
             {}",
            tf_dtype_name(a.element_dtype),
            tf_dtype_name(b.element_dtype)
        )));
    }
    let element_shape = a.element_shape.merge_with(&b.element_shape).map_err(|_| {
        Status::invalid_argument(format!(
            "Trying to add two lists of tensors with incompatible element shapes. One is {} and \
             the other is {}",
            a.element_shape, b.element_shape
        ))
    })?;
    if a.tensors.len() != b.tensors.len() {
        return Err(Status::invalid_argument(format!(
            "Trying to add two lists of tensors with different lengths. One is {} and the other \
             is {}",
            a.tensors.len(),
            b.tensors.len()
        )));
    }
    let tensors = a
        .tensors
        .iter()
        .zip(&b.tensors)
        .map(|(x, y)| match (x, y) {
            (None, y) => Ok(y.clone()),
            (x, None) => Ok(x.clone()),
            (Some(x), Some(y)) if x.dtype() == DType::Variant => add(x, y).map(Some),
            (Some(x), Some(y)) => rows::add(x, y).map(Some),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TensorList {
        element_dtype: a.element_dtype,
        element_shape,
        tensors,
        max_num_elements: a.max_num_elements,
    })
}

fn not_a_list(op: &str) -> Status {
    Status::invalid_argument(format!(
        "{op} of a variant tensor is defined for TensorLists only; this one holds another value"
    ))
}
