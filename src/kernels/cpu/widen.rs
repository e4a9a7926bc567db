//! Arithmetic, comparisons, reductions and the float kernels for the narrow dtypes (uint8,
//! int8, int16, uint16, uint32, float16, bfloat16), computed by the float32 / int32 / int64
//! kernels: the inputs are converted up, the kernel runs, and its outputs of the wide dtype
//! are converted back.
//!
//! This gives TensorFlow's values, not an approximation of them: Eigen computes every float16
//! and bfloat16 operation in float32 and rounds the result to nearest even, which is what
//! converting back does; and integer arithmetic done in int32 (int64 for uint32) then cut to
//! the low bits equals the narrow type's wrapping arithmetic, while comparisons, maxima and
//! quotients of values in range are exact. Where TensorFlow accumulates in the narrow type
//! (a float16 sum over many elements), tessera rounds once at the end, which is at least as
//! close to the true value. No kernel is compiled again for these dtypes.
//!
//! The wrapper is picked by [`wrap`] for the ops in [`accepted`]; a narrow dtype an op does
//! not take fails with INVALID_ARGUMENT naming the node and the dtypes it takes.

use std::sync::{Arc, Mutex};

use super::cast;
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::DType;

/// The dtypes every op here computes in directly, then the narrow integers and the 16-bit
/// floats.
const FLOATS: [DType; 4] = [DType::Float, DType::Double, DType::Half, DType::BFloat16];
const REALS: [DType; 11] = [
    DType::Float,
    DType::Double,
    DType::Int32,
    DType::Int64,
    DType::UInt8,
    DType::Int8,
    DType::Int16,
    DType::UInt16,
    DType::UInt32,
    DType::Half,
    DType::BFloat16,
];

/// How an op takes the narrow dtypes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// Integers and 16-bit floats, its outputs of the input's dtype converted back.
    Reals,
    /// Integers and 16-bit floats; its outputs are indices (ArgMax), never converted back.
    RealsToIndices,
    /// The 16-bit floats only.
    Floats,
    /// Every dtype its own kernel takes; the 16-bit floats compared as numbers (Equal:
    /// integers compare as their bytes, which is exact, but float16's -0.0 equals 0.0).
    Equality,
}

/// How `op` takes the narrow dtypes; `None` for ops that do not compute on them.
fn takes(op: &str) -> Option<Takes> {
    Some(match op {
        "Add" | "AddV2" | "Sub" | "Mul" | "RealDiv" | "FloorDiv" | "FloorMod" | "Maximum"
        | "Minimum" | "SquaredDifference" | "Neg" | "Abs" | "Square" | "Sign" | "AddN" | "Less"
        | "LessEqual" | "Greater" | "GreaterEqual" | "Sum" | "Mean" | "Max" | "Min" | "Prod" => {
            Takes::Reals
        }
        "ArgMax" | "ArgMin" => Takes::RealsToIndices,
        "Sqrt" | "Rsqrt" | "Exp" | "Log" | "Reciprocal" | "Floor" | "Ceil" | "Round" | "Relu"
        | "Sigmoid" | "Tanh" | "Softmax" | "LogSoftmax" | "BiasAdd" | "MatMul"
        | "BatchMatMulV2" | "DivNoNan" | "Pow" => Takes::Floats,
        "Equal" | "NotEqual" => Takes::Equality,
        _ => return None,
    })
}

/// The dtypes `op` takes (for its error message), `None` for ops [`takes`] does not know.
pub(super) fn accepted(op: &str) -> Option<&'static [DType]> {
    match takes(op)? {
        Takes::Reals | Takes::RealsToIndices => Some(&REALS),
        Takes::Floats => Some(&FLOATS),
        Takes::Equality => None,
    }
}

/// The dtype a narrow dtype computes in; `None` for the dtypes kernels take as they are.
fn wide(dtype: DType) -> Option<DType> {
    match dtype {
        DType::UInt8 | DType::Int8 | DType::Int16 | DType::UInt16 => Some(DType::Int32),
        DType::UInt32 => Some(DType::Int64),
        DType::Half | DType::BFloat16 => Some(DType::Float),
        _ => None,
    }
}

/// `factory` for `op`, wrapped to take the narrow dtypes when `op` computes on them.
pub(super) fn wrap(op: &str, factory: KernelFactory) -> KernelFactory {
    if takes(op).is_some() {
        create
    } else {
        factory
    }
}

/// The factory of a wrapped op: its own kernel for the node as it is, and the same op for
/// the wide dtype made when a narrow input first arrives.
fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
    let factory = super::unwrapped_kernel_for(&node.op).ok_or_else(|| {
        crate::Status::internal(format!("op {} has no CPU kernel to widen", node.op))
    })?;
    let takes = takes(&node.op).expect("wrap picks only ops `takes` knows");
    // A node whose `T` names a narrow dtype gets its own kernel made for the wide one.
    let narrow = attr::get(node, "T")
        .and_then(|_| attr::dtype(node, "T").ok())
        .filter(|&t| wide(t).is_some());
    let direct = match narrow {
        Some(_) if takes != Takes::Equality => None,
        _ => Some(factory(node)?),
    };
    Ok(Arc::new(Widening {
        node: node.clone(),
        factory,
        takes,
        direct,
        widened: Mutex::new(None),
    }))
}

/// An op's kernel that computes narrow inputs in their wide dtype.
struct Widening {
    node: NodeDef,
    factory: KernelFactory,
    takes: Takes,
    /// The kernel for the node as it is (`None` when its `T` is narrow).
    direct: Option<Arc<dyn OpKernel>>,
    /// The wide node and kernel, made for the narrow dtype the last inputs had.
    widened: Mutex<Option<Widened>>,
}

/// A narrow dtype, and the node with `T` wide and its kernel made for inputs of it.
type Widened = (DType, Arc<NodeDef>, Arc<dyn OpKernel>);

impl Widening {
    /// The wide node and kernel for inputs of `narrow`, made once.
    fn widened(&self, narrow: DType, wide: DType) -> Result<(Arc<NodeDef>, Arc<dyn OpKernel>)> {
        let mut slot = self.widened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((dtype, node, kernel)) = slot.as_ref() {
            if *dtype == narrow {
                return Ok((node.clone(), kernel.clone()));
            }
        }
        let mut node = self.node.clone();
        if node.attr.contains_key("T") {
            node.attr
                .insert("T".into(), crate::graph::attr::value::dtype(wide));
        }
        let kernel = (self.factory)(&node)?;
        let node = Arc::new(node);
        *slot = Some((narrow, node.clone(), kernel.clone()));
        Ok((node, kernel))
    }
}

impl Widening {
    /// Runs the op's own kernel on the node as it is.
    fn compute_direct(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        match &self.direct {
            Some(kernel) => kernel.compute(ctx),
            // `T` names a narrow dtype the input does not have: the op's own kernel says so.
            None => (self.factory)(ctx.node())?.compute(ctx),
        }
    }
}

impl OpKernel for Widening {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let dtype = ctx.input(0)?.dtype();
        let accepted = accepted(&self.node.op);
        let Some(wide) = wide(dtype) else {
            // The dtypes no kernel here computes on: refused with the whole list.
            if let (DType::UInt64 | DType::Complex64, Some(accepted)) = (dtype, accepted) {
                return Err(super::unsupported_dtype(ctx, dtype, accepted));
            }
            return self.compute_direct(ctx);
        };
        let taken = match self.takes {
            Takes::Reals | Takes::RealsToIndices => true,
            Takes::Floats | Takes::Equality => dtype.is_half(),
        };
        if !taken {
            return match accepted {
                Some(accepted) => Err(super::unsupported_dtype(ctx, dtype, accepted)),
                None => self.compute_direct(ctx),
            };
        }
        let (node, kernel) = self.widened(dtype, wide)?;
        let inputs = ctx
            .inputs()
            .iter()
            .map(|t| {
                if t.dtype() == dtype {
                    cast::convert_to(ctx, t, wide)
                } else {
                    Ok(t.clone())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        // The wide node keeps the name: its kernel's errors name the node as it is.
        let outputs = {
            let mut inner = ctx.for_node(&node, inputs);
            kernel.compute(&mut inner)?;
            inner.take_outputs()
        };
        for (i, out) in outputs.into_iter().enumerate() {
            let Some(out) = out else { continue };
            let out = if self.takes != Takes::RealsToIndices && out.dtype() == wide {
                cast::convert_to(ctx, &out, dtype)?
            } else {
                out
            };
            ctx.set_output(i, out);
        }
        Ok(())
    }
}
