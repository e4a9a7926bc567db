//! Whole rows along dimension 0, for the kernels that keep tensors as sequences of elements
//! (`tensor_array`, `list`): cut a tensor into rows or runs of rows, join elements back
//! into one tensor, make the zeros an unwritten element reads as, and add two gradients.
//!
//! Cutting shares the buffer of fixed-size tensors (a `Bytes` slice, no copy); joining copies
//! once into the output. Every dtype a tensor can hold moves: fixed-size, strings, variants
//! (a list of lists); only numbers add.

use bytes::BytesMut;

use crate::error::{Result, Status};
use crate::tensor::{DType, Shape, Tensor};

/// Rows `[start, end)` of `t` (rank >= 1): a tensor of shape `[end - start] + dims[1..]`.
pub fn slice_rows(t: &Tensor, start: usize, end: usize) -> Result<Tensor> {
    let dims = t.dims();
    let Some(&n) = dims.first() else {
        return Err(Status::invalid_argument(format!(
            "a scalar has no rows to cut (shape {})",
            t.shape()
        )));
    };
    if start > end || end > n {
        return Err(Status::invalid_argument(format!(
            "rows [{start}, {end}) are out of range for a tensor with {n} rows"
        )));
    }
    let per_row: usize = dims[1..].iter().product();
    let mut out_dims = dims.to_vec();
    out_dims[0] = end - start;
    let (lo, hi) = (start * per_row, end * per_row);
    match t.dtype() {
        DType::String => Tensor::from_strings(out_dims, t.strings()?[lo..hi].to_vec()),
        DType::Variant => Tensor::from_variants(out_dims, t.variants()?[lo..hi].to_vec()),
        DType::Resource => Tensor::from_resources(out_dims, t.resources()?[lo..hi].to_vec()),
        dtype => {
            let size = dtype.size().expect("fixed-size dtype");
            let bytes = t
                .shared_bytes()
                .ok_or_else(|| Status::internal(format!("a {dtype} tensor without its bytes")))?;
            Tensor::from_bytes(dtype, out_dims, bytes.slice(lo * size..hi * size))
        }
    }
}

/// The rows of `t` (rank >= 1), each of shape `dims[1..]` (buffers shared).
pub fn unstack(t: &Tensor) -> Result<Vec<Tensor>> {
    let n = t.dims().first().copied().unwrap_or(0);
    let row_shape = Shape::new(t.dims().get(1..).unwrap_or_default().to_vec());
    (0..n)
        .map(|i| slice_rows(t, i, i + 1)?.reshape(row_shape.clone()))
        .collect()
}

/// Joins the elements of `parts` (all of `dtype`), in order, into one tensor of `shape`;
/// the caller has checked that the parts' shapes add up to it.
pub fn join(dtype: DType, parts: &[&Tensor], shape: Shape) -> Result<Tensor> {
    match dtype {
        DType::String => {
            let mut all = Vec::with_capacity(shape.num_elements());
            for p in parts {
                all.extend_from_slice(p.strings()?);
            }
            Tensor::from_strings(shape, all)
        }
        DType::Variant => {
            let mut all = Vec::with_capacity(shape.num_elements());
            for p in parts {
                all.extend_from_slice(p.variants()?);
            }
            Tensor::from_variants(shape, all)
        }
        DType::Resource => {
            let mut all = Vec::with_capacity(shape.num_elements());
            for p in parts {
                all.extend_from_slice(p.resources()?);
            }
            Tensor::from_resources(shape, all)
        }
        dtype => {
            let size = dtype.size().expect("fixed-size dtype");
            let mut all = BytesMut::with_capacity(shape.num_elements() * size);
            for p in parts {
                let bytes = p.bytes().ok_or_else(|| {
                    Status::internal(format!("a {dtype} tensor without its bytes"))
                })?;
                all.extend_from_slice(bytes);
            }
            Tensor::from_bytes(dtype, shape, all.freeze())
        }
    }
}

/// Stacks `rows` (all of `dtype` and shape `row`) along a new dimension 0.
pub fn stack(dtype: DType, rows: &[&Tensor], row: &Shape) -> Result<Tensor> {
    let mut dims = vec![rows.len()];
    dims.extend_from_slice(row.dims());
    join(dtype, rows, Shape::new(dims))
}

/// The most elements a TensorArray or TensorList may hold: each costs a slot's bookkeeping
/// even before it is written, so a size from a bad input must not reserve memory unchecked.
pub(super) const MAX_SLOTS: usize = 1 << 24;

/// Fails with RESOURCE_EXHAUSTED when `n` elements are more than [`MAX_SLOTS`]; `what`
/// names the container ("TensorArray `x`").
pub(super) fn check_slots(what: &str, n: usize) -> Result<()> {
    if n > MAX_SLOTS {
        return Err(Status::resource_exhausted(format!(
            "{what} would hold {n} elements; tessera holds at most {MAX_SLOTS} elements in one \
             TensorArray or TensorList"
        )));
    }
    Ok(())
}

/// The value an element that was never written reads as: zeros of `dtype` (empty strings,
/// `false`). RESOURCE_EXHAUSTED when the shape has more elements than one output may hold.
pub(super) fn zeros(dtype: DType, shape: &Shape) -> Result<Tensor> {
    let n = shape
        .dims()
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= super::MAX_ELEMENTS);
    if n.is_none() {
        return Err(Status::resource_exhausted(format!(
            "OOM when allocating the zeros of an unwritten element of shape {shape}; the most \
             one tensor may hold is {} elements",
            super::MAX_ELEMENTS
        )));
    }
    Tensor::zeros(dtype, shape.clone())
}

/// `a + b`, element-wise, for two numeric tensors of the same dtype and shape (the sum of two
/// partial gradients).
pub(super) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return Err(Status::invalid_argument(format!(
            "cannot add a {} tensor of shape {} to a {} tensor of shape {}",
            a.dtype(),
            a.shape(),
            b.dtype(),
            b.shape()
        )));
    }
    fn sum<T: crate::tensor::Element + std::ops::Add<Output = T>>(
        a: &Tensor,
        b: &Tensor,
    ) -> Result<Tensor> {
        let values = a
            .values::<T>()?
            .iter()
            .zip(b.values::<T>()?.iter())
            .map(|(&x, &y)| x + y)
            .collect();
        Tensor::from_vec(a.shape().clone(), values)
    }
    match a.dtype() {
        DType::Float => sum::<f32>(a, b),
        DType::Double => sum::<f64>(a, b),
        DType::Int32 => sum::<i32>(a, b),
        DType::Int64 => sum::<i64>(a, b),
        other => Err(Status::invalid_argument(format!(
            "tensors of type {other} cannot be added (accumulated gradients must be numbers)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_cut_and_join_back() {
        let t = Tensor::from_vec([3, 2], vec![1i32, 2, 3, 4, 5, 6]).unwrap();
        let rows = unstack(&t).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].dims(), &[2]);
        assert_eq!(rows[1].values::<i32>().unwrap().as_ref(), &[3, 4]);
        let middle = slice_rows(&t, 1, 3).unwrap();
        assert_eq!(middle.values::<i32>().unwrap().as_ref(), &[3, 4, 5, 6]);
        let refs: Vec<&Tensor> = rows.iter().collect();
        assert_eq!(stack(DType::Int32, &refs, &Shape::new([2])).unwrap(), t);
        assert!(slice_rows(&t, 2, 4).is_err());
        let s = Tensor::from_strings([2], vec!["a".into(), "b".into()]).unwrap();
        assert_eq!(unstack(&s).unwrap()[1], Tensor::string("b"));
    }

    #[test]
    fn only_numbers_add() {
        let a = Tensor::from_vec([2], vec![1.5f32, 2.0]).unwrap();
        let sum = add(&a, &a).unwrap();
        assert_eq!(sum.values::<f32>().unwrap().as_ref(), &[3.0, 4.0]);
        assert!(add(&Tensor::string("x"), &Tensor::string("y")).is_err());
        assert!(add(&a, &Tensor::from_vec([1], vec![1f32]).unwrap()).is_err());
    }
}
