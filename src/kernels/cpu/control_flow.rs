//! The kernels of TensorFlow 1's control-flow ops. What makes them control flow (dead tensors,
//! frames, iterations, `Merge` firing on its first live input) is the executor's
//! (`runtime/executor/frames.rs`); a kernel here only moves its input to the right output:
//!
//! - `Switch`/`RefSwitch(data, pred)`: `data` to `output_true` (slot 1) when `pred` holds, else
//!   to `output_false` (slot 0); the other output is left unset, which the executor reads as
//!   dead.
//! - `Merge`/`RefMerge`: the executor hands it its live input; the kernel forwards the first
//!   input it is given, with that input's index.
//! - `Enter`, `Exit`, `NextIteration`, `LoopCond` and their `Ref` forms: the input, unchanged
//!   (the executor moves the output into the child frame, the parent frame or the next
//!   iteration).
//! - `ControlTrigger`: nothing; it only orders its control successors.
//! - `Assert(condition, data...)`: INVALID_ARGUMENT showing the data when the condition is
//!   false (TensorFlow guards loops and conds with it, e.g. `dynamic_rnn`'s shape checks).

use super::{input, stateless};
use crate::error::Result;
use crate::kernels::{KernelFactory, OpContext};
use crate::tensor::{DType, Tensor};

/// Returns the factory for a control-flow op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Switch" | "RefSwitch" => |_| stateless(switch),
        "Merge" | "RefMerge" => |_| stateless(merge),
        "Enter" | "RefEnter" | "Exit" | "RefExit" | "NextIteration" | "RefNextIteration"
        | "LoopCond" => |_| stateless(forward),
        "ControlTrigger" => |_| stateless(|_| Ok(())),
        "Assert" => |_| stateless(assert),
        _ => return None,
    };
    Some(factory)
}

fn switch(ctx: &mut OpContext<'_>) -> Result<()> {
    let data = input(ctx, 0)?;
    let pred = ctx.input(1)?;
    if pred.dtype() != DType::Bool || pred.num_elements() != 1 {
        return Err(ctx.invalid(format!(
            "pred must be a scalar bool, got a {} tensor of shape {}",
            pred.dtype(),
            pred.shape()
        )));
    }
    let slot = usize::from(pred.scalar_value::<bool>()?);
    ctx.set_output(slot, data);
    Ok(())
}

fn merge(ctx: &mut OpContext<'_>) -> Result<()> {
    let value = input(ctx, 0)?;
    ctx.set_output(0, value);
    ctx.set_output(1, Tensor::scalar(0i32));
    Ok(())
}

fn forward(ctx: &mut OpContext<'_>) -> Result<()> {
    let value = input(ctx, 0)?;
    ctx.set_output(0, value);
    Ok(())
}

fn assert(ctx: &mut OpContext<'_>) -> Result<()> {
    let condition = ctx.input(0)?;
    if condition.dtype() != DType::Bool || condition.num_elements() != 1 {
        return Err(ctx.invalid(format!(
            "the condition must be a scalar bool, got a {} tensor of shape {}",
            condition.dtype(),
            condition.shape()
        )));
    }
    if condition.scalar_value::<bool>()? {
        return Ok(());
    }
    let data: Vec<String> = ctx.inputs()[1..].iter().map(|t| format!("{t:?}")).collect();
    Err(ctx.invalid(format!("assertion failed: [{}]", data.join("] ["))))
}
