//! The dense kind: [`ConditionalAccumulator`] (TensorFlow's `ConditionalAccumulator` /
//! `ResourceConditionalAccumulator`) sums whole tensors of one dtype and shape.

use super::{Accumulator, Reduction, Sum};
use crate::error::{Result, Status};
use crate::tensor::{DType, Shape, Tensor};

/// Sums gradients of one dtype and shape until the chief takes them.
pub type ConditionalAccumulator = Accumulator<DenseSum>;

/// The running sum of a [`ConditionalAccumulator`]: the shape of the gradients accepted since
/// the last take and their sum, in f64 (exact for every gradient dtype's range that matters
/// here).
#[derive(Default)]
pub struct DenseSum(Option<(Shape, Vec<f64>)>);

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
        let values = as_f64(gradient)?;
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
                    for (s, v) in sum.iter_mut().zip(values) {
                        *s += v;
                    }
                }
                _ => sum.0 = Some((gradient.shape().clone(), values)),
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
        let divisor = match self.reduction {
            Reduction::Mean => count as f64,
            Reduction::Sum => 1.0,
        };
        from_f64(self.dtype, shape, sum.into_iter().map(|v| v / divisor))
    }
}

fn as_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::Float => t.values::<f32>()?.iter().map(|&v| f64::from(v)).collect(),
        DType::Double => t.values::<f64>()?.into_owned(),
        DType::Int32 => t.values::<i32>()?.iter().map(|&v| f64::from(v)).collect(),
        DType::Int64 => t.values::<i64>()?.iter().map(|&v| v as f64).collect(),
        other => {
            return Err(Status::invalid_argument(format!(
                "an accumulator cannot hold {other} gradients"
            )))
        }
    })
}

fn from_f64(dtype: DType, shape: Shape, values: impl Iterator<Item = f64>) -> Result<Tensor> {
    match dtype {
        DType::Float => Tensor::from_vec(shape, values.map(|v| v as f32).collect()),
        DType::Double => Tensor::from_vec(shape, values.collect()),
        // Integer means truncate toward zero, as TensorFlow's integer division does.
        DType::Int32 => Tensor::from_vec(shape, values.map(|v| v.trunc() as i32).collect()),
        DType::Int64 => Tensor::from_vec(shape, values.map(|v| v.trunc() as i64).collect()),
        other => Err(Status::invalid_argument(format!(
            "an accumulator cannot hold {other} gradients"
        ))),
    }
}
