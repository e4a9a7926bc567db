//! Element-wise kernels that write their output over an input they are the last reader of
//! (TensorFlow's `forward_input`, [`OpContext::forward_input`]): `Relu(MatMul(..))` writes the
//! activation where the product lies, `ReluGrad` where the incoming gradient lies. The output
//! then costs no allocation, and the step touches half the memory: the elements are read and
//! written in one pass over lines already in cache. When the input is held elsewhere (a fetch,
//! a variable's value, another reader still to run) the output goes to a fresh buffer, with
//! the same values.

use bytemuck::Pod;

use super::broadcast;
use super::split;
use crate::error::Result;
use crate::kernels::OpContext;
use crate::tensor::{Element, Tensor};

/// `f` of each element of input `i`, a `T` tensor.
pub(super) fn map<T: Element + Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    i: usize,
    f: impl Fn(T) -> T + Sync,
) -> Result<Tensor> {
    let intra = ctx.intra();
    if let Some(mut x) = ctx.forward_input(i) {
        x.update_in_place::<T, _>(|v| split::map_in_place(intra, v, f))?;
        return Ok(x);
    }
    let x = ctx.input(i)?;
    Tensor::from_vec(x.shape().clone(), split::map(intra, &x.values::<T>()?, f))
}

/// `f(a, b)` of each pair of elements of inputs 0 and 1, two `T` tensors of one shape (the
/// caller checked), written over either when it may be.
pub(super) fn zip<T: Element + Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor> {
    let intra = ctx.intra();
    if let Some(mut a) = ctx.forward_input(0) {
        let b = ctx.input(1)?.values::<T>()?;
        a.update_in_place::<T, _>(|a| split::zip_in_place(intra, a, &b, f))?;
        return Ok(a);
    }
    if let Some(mut b) = ctx.forward_input(1) {
        let a = ctx.input(0)?.values::<T>()?;
        b.update_in_place::<T, _>(|b| split::zip_in_place(intra, b, &a, |y, x| f(x, y)))?;
        return Ok(b);
    }
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    Tensor::from_vec(
        a.shape().clone(),
        split::zip(intra, &a.values::<T>()?, &b.values::<T>()?, f),
    )
}

/// `f(x, y)` of inputs 0 and 1, two `T` tensors, broadcast as [`broadcast::binary`] does;
/// written over an input whose shape is the output's (same shapes, a scalar, or a row
/// repeated over the other's leading dimensions) when it may be.
pub(super) fn binary<T: Element + Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor> {
    let (x, y) = (ctx.input(0)?, ctx.input(1)?);
    if x.dims() == y.dims() {
        return zip(ctx, f);
    }
    let side = broadcast::output_side(x, y);
    let intra = ctx.intra();
    match side.map(|side| (side, ctx.forward_input(side))) {
        Some((0, Some(mut x))) => {
            let y = ctx.input(1)?.values::<T>()?;
            x.update_in_place::<T, _>(|x| over(intra, x, &y, f))?;
            Ok(x)
        }
        Some((_, Some(mut y))) => {
            let x = ctx.input(0)?.values::<T>()?;
            y.update_in_place::<T, _>(|y| over(intra, y, &x, |b, a| f(a, b)))?;
            Ok(y)
        }
        _ => {
            let (x, y) = (ctx.input(0)?, ctx.input(1)?);
            broadcast::binary::<T, T>(ctx, x, y, f)
        }
    }
}

/// `f(a, b)` written over `a`, in the forms of `broadcast::over`: element by element, `b` a
/// scalar, or `b` a row of `a`.
fn over<T: Copy + Send + Sync>(
    intra: &crate::runtime::intra::IntraPool,
    a: &mut [T],
    b: &[T],
    f: impl Fn(T, T) -> T + Sync,
) {
    match b {
        [scalar] => {
            let scalar = *scalar;
            split::map_in_place(intra, a, |v| f(v, scalar));
        }
        _ if b.len() == a.len() => split::zip_in_place(intra, a, b, f),
        row => split::rows_in_place(intra, a, row, f),
    }
}

/// `f(e, r)` of each element `e` of input 0 and the element `r` of `row` in its column
/// (input 0's last dimension is `row.len()`): a bias added to every row.
pub(super) fn rows<T: Element + Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    row: &[T],
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor> {
    let intra = ctx.intra();
    if let Some(mut x) = ctx.forward_input(0) {
        x.update_in_place::<T, _>(|x| split::rows_in_place(intra, x, row, f))?;
        return Ok(x);
    }
    let x = ctx.input(0)?;
    Tensor::from_vec(
        x.shape().clone(),
        split::rows(intra, &x.values::<T>()?, row, f),
    )
}

#[cfg(test)]
mod tests {
    use crate::tensor::Tensor;

    /// Runs `op` (float32) on `inputs`; returns its output.
    fn run(op: &str, inputs: Vec<Tensor>) -> Tensor {
        super::super::run_float32(op, inputs, None).remove(0)
    }

    fn floats(shape: &[usize], values: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), values.to_vec()).unwrap()
    }

    fn address(t: &Tensor) -> *const u8 {
        t.bytes().unwrap().as_ptr()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.values::<f32>().unwrap().into_owned()
    }

    #[test]
    fn a_last_reader_writes_over_its_input_and_leaves_a_held_one_alone() {
        // Relu over the only holder's buffer.
        let x = floats(&[4], &[-1.0, 2.0, -3.0, 4.0]);
        let at = address(&x);
        let out = run("Relu", vec![x]);
        assert_eq!(values(&out), [0.0, 2.0, 0.0, 4.0]);
        assert_eq!(address(&out), at, "written over its input");

        // A clone held elsewhere (a fetch, another reader): a fresh buffer, the input intact.
        let x = floats(&[4], &[-1.0, 2.0, -3.0, 4.0]);
        let held = x.clone();
        let out = run("Relu", vec![x]);
        assert_eq!(values(&out), [0.0, 2.0, 0.0, 4.0]);
        assert_ne!(address(&out), address(&held));
        assert_eq!(values(&held), [-1.0, 2.0, -3.0, 4.0]);

        // A view on its way to the wire counts as a holder too.
        let x = floats(&[4], &[-1.0, 2.0, -3.0, 4.0]);
        let on_the_wire = x.shared_bytes().unwrap();
        let out = run("Tanh", vec![x]);
        assert_ne!(address(&out), on_the_wire.as_ptr());
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(&on_the_wire),
            [-1.0, 2.0, -3.0, 4.0]
        );
    }

    #[test]
    fn binary_ops_write_over_whichever_input_has_the_output_shape_and_may_be_taken() {
        // Sub(x, y) over y (x is held): the operands keep their order.
        let x = floats(&[3], &[10.0, 20.0, 30.0]);
        let held = x.clone();
        let y = floats(&[3], &[1.0, 2.0, 3.0]);
        let at = address(&y);
        let out = run("Sub", vec![x, y]);
        assert_eq!(values(&out), [9.0, 18.0, 27.0]);
        assert_eq!(address(&out), at);
        drop(held);

        // A row broadcast over the matrix, and a scalar.
        let m = floats(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let at = address(&m);
        let out = run("Sub", vec![m, floats(&[3], &[1.0, 1.0, 1.0])]);
        assert_eq!(values(&out), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(address(&out), at);
        let s = floats(&[2], &[1.0, 2.0]);
        let at = address(&s);
        let out = run("Sub", vec![floats(&[], &[10.0]), s]);
        assert_eq!(
            (values(&out), out.dims().to_vec()),
            (vec![9.0, 8.0], vec![2])
        );
        assert_eq!(address(&out), at);

        // The row cannot take the matrix's output: a fresh buffer.
        let row = floats(&[3], &[1.0, 1.0, 1.0]);
        let held = floats(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let out = run("Add", vec![held.clone(), row]);
        assert_eq!(values(&out), [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!(values(&held), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn bias_add_and_gradients_write_over_their_first_input() {
        let value = floats(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let at = address(&value);
        let out = run("BiasAdd", vec![value, floats(&[2], &[10.0, 20.0])]);
        assert_eq!(values(&out), [11.0, 22.0, 13.0, 24.0]);
        assert_eq!(address(&out), at);

        let g = floats(&[3], &[1.0, 2.0, 3.0]);
        let at = address(&g);
        let out = run("ReluGrad", vec![g, floats(&[3], &[1.0, -1.0, 2.0])]);
        assert_eq!(values(&out), [1.0, 0.0, 3.0]);
        assert_eq!(address(&out), at);
    }
}
