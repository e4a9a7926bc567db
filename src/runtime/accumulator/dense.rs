//! The dense kind: [`ConditionalAccumulator`] (TensorFlow's `ConditionalAccumulator` /
//! `ResourceConditionalAccumulator`) sums whole tensors of one dtype and shape.

use super::{Accumulator, Reduction, Sum};
use crate::error::{Result, Status};
use crate::tensor::{DType, Shape, Tensor};

/// Sums gradients of one dtype and shape until the chief takes them.
pub type ConditionalAccumulator = Accumulator<DenseSum>;

/// The running sum of a [`ConditionalAccumulator`]: the shape of the gradients accepted since
/// the last take and their sum, in the gradients' dtype, as TensorFlow's accumulator keeps it
/// (integers wrap as its do).
#[derive(Default)]
pub struct DenseSum(Option<(Shape, Values)>);

/// A running sum's values.
enum Values {
    Float(Vec<f32>),
    Double(Vec<f64>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
}

impl Values {
    /// A copy of `t`'s values, to add the next gradients to.
    fn of(t: &Tensor) -> Result<Self> {
        Ok(match t.dtype() {
            DType::Float => Values::Float(t.values::<f32>()?.into_owned()),
            DType::Double => Values::Double(t.values::<f64>()?.into_owned()),
            DType::Int32 => Values::Int32(t.values::<i32>()?.into_owned()),
            DType::Int64 => Values::Int64(t.values::<i64>()?.into_owned()),
            other => return Err(unsupported(other)),
        })
    }

    /// Adds `t`'s values, element by element, in place.
    fn add(&mut self, t: &Tensor) -> Result<()> {
        fn add<T: Copy>(sum: &mut [T], values: &[T], plus: impl Fn(T, T) -> T) {
            for (s, &v) in sum.iter_mut().zip(values) {
                *s = plus(*s, v);
            }
        }
        match self {
            Values::Float(sum) => add(sum, &t.values::<f32>()?, |a, b| a + b),
            Values::Double(sum) => add(sum, &t.values::<f64>()?, |a, b| a + b),
            Values::Int32(sum) => add(sum, &t.values::<i32>()?, i32::wrapping_add),
            Values::Int64(sum) => add(sum, &t.values::<i64>()?, i64::wrapping_add),
        }
        Ok(())
    }

    /// The sum divided by `count` (integers truncate toward zero, as TensorFlow's integer
    /// division does), as a tensor of `shape`.
    fn into_mean(self, shape: Shape, count: usize) -> Result<Tensor> {
        fn divide<T: Copy>(mut sum: Vec<T>, by: impl Fn(T) -> T) -> Vec<T> {
            for v in &mut sum {
                *v = by(*v);
            }
            sum
        }
        match self {
            Values::Float(sum) => Tensor::from_vec(shape, divide(sum, |v| v / count as f32)),
            Values::Double(sum) => Tensor::from_vec(shape, divide(sum, |v| v / count as f64)),
            Values::Int32(sum) => Tensor::from_vec(shape, divide(sum, |v| v / count as i32)),
            Values::Int64(sum) => Tensor::from_vec(shape, divide(sum, |v| v / count as i64)),
        }
    }

    /// The sum as a tensor of `shape`.
    fn into_tensor(self, shape: Shape) -> Result<Tensor> {
        match self {
            Values::Float(sum) => Tensor::from_vec(shape, sum),
            Values::Double(sum) => Tensor::from_vec(shape, sum),
            Values::Int32(sum) => Tensor::from_vec(shape, sum),
            Values::Int64(sum) => Tensor::from_vec(shape, sum),
        }
    }
}

fn unsupported(dtype: DType) -> Status {
    Status::invalid_argument(format!("an accumulator cannot hold {dtype} gradients"))
}

impl Sum for DenseSum {
    const KIND: &'static str = "accumulator";

    fn check_dtype(name: &str, dtype: DType) -> Result<()> {
        if !dtype.is_numeric() {
            return Err(Status::invalid_argument(format!(
                "accumulator `{name}`: dtype {dtype} is not numeric; gradients are float, \
                 double, int32 or int64"
            )));
        }
        Ok(())
    }
}

impl Accumulator<DenseSum> {
    /// Adds `gradient` computed at `local_step`; returns whether it was accepted (a gradient
    /// whose step is below the global step is stale and dropped).
    pub fn apply(&self, local_step: i64, gradient: &Tensor) -> Result<bool> {
        self.apply_from(local_step, gradient, None)
    }

    /// [`apply`](Self::apply) for a gradient from `replica` (e.g. `/job:worker/task:1`), which
    /// the accumulator remembers so that a take that times out can name who is missing.
    pub fn apply_from(
        &self,
        local_step: i64,
        gradient: &Tensor,
        replica: Option<&str>,
    ) -> Result<bool> {
        if gradient.dtype() != self.dtype {
            return Err(Status::invalid_argument(format!(
                "accumulator `{}` holds {} gradients, got a {} one",
                self.name,
                self.dtype,
                gradient.dtype()
            )));
        }
        if !self.shape.is_compatible_with(gradient.shape()) {
            return Err(Status::invalid_argument(format!(
                "accumulator `{}`: gradient of shape {} does not match the declared shape {}",
                self.name,
                gradient.shape(),
                self.shape
            )));
        }
        self.accept(local_step, replica, |sum, count| {
            match &mut sum.0 {
                Some((shape, sum)) if count > 0 => {
                    if shape != gradient.shape() {
                        return Err(Status::invalid_argument(format!(
                            "accumulator `{}`: gradient of shape {} does not match the shape \
                             {} of the gradients accumulated so far",
                            self.name,
                            gradient.shape(),
                            shape
                        )));
                    }
                    sum.add(gradient)?;
                }
                _ => sum.0 = Some((gradient.shape().clone(), Values::of(gradient)?)),
            }
            Ok(())
        })
    }

    /// Waits until `num_required` gradients were accepted, then returns their average (or sum),
    /// resets the accumulator and advances its global step by one.
    pub fn take(&self, num_required: i64, wait: &crate::runtime::wait::Wait) -> Result<Tensor> {
        let (count, shape, sum) = self.take_with(num_required, wait, |sum, count| {
            let (shape, sum) = sum.0.take().ok_or_else(|| {
                Status::internal(format!(
                    "accumulator `{}` counted gradients but holds none",
                    self.name
                ))
            })?;
            Ok((count, shape, sum))
        })?;
        match self.reduction {
            Reduction::Mean => sum.into_mean(shape, count),
            Reduction::Sum => sum.into_tensor(shape),
        }
    }
}
