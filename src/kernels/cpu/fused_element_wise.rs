//! `_FusedElementwise`, tessera's own fused op: a tree of float32 element-wise ops (the
//! arithmetic, the activations and their gradients, an optimizer's update written as ops) that
//! the worker's remapper found in a partition (`exec::remap::fuse_element_wise`), run as one
//! kernel. The elements go through every step a chunk at a time while the chunk is in L1,
//! instead of one pass over memory and one executor dispatch per op, and the result is written
//! over an input this node is the last reader of when it may be.
//!
//! The node's attrs are the program: `ops` names each step's op (TensorFlow's names), and
//! `operands` gives two operands per step (the second -1 for a unary op), each an input index
//! (`0..N`) or `N + k` for the result of step `k` (an earlier one). The last step's result is
//! the output. Every element goes through the unfused kernels' own functions ([`Element`]), so
//! the values are exactly the unfused graph's.
//!
//! The chunked pass needs every input to have the output's shape or to be a single element;
//! anything else (a row broadcast over a matrix, say) runs the steps one by one, broadcasting
//! as the unfused kernels do, with the same values and the same errors.

use std::borrow::Cow;
use std::sync::Arc;

use super::broadcast;
use super::numeric::{Float, Real};
use super::split::{self, lanes, ELEMENT_CYCLES};
use super::variable::update_variable;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::runtime::intra::IntraPool;
use crate::tensor::{DType, Shape, Tensor};

/// The fused op's name.
pub const OP: &str = "_FusedElementwise";

/// The name of the fused op that also applies the tree's result to a variable: a tree whose
/// only reader was an `AssignAddVariableOp` or `AssignSubVariableOp` (an optimizer's update
/// written as ops), fused with it. Its input 0 is the variable's handle, the tree's inputs
/// follow, and attr `update` is `add` or `sub`; it has no output. Each chunk of the tree's
/// result goes into the variable's elements while it is in L1, in the variable's own buffer
/// when no reader holds it: one pass over the variable, and no tensor for the update.
pub const ASSIGN_OP: &str = "_FusedElementwiseAssign";

/// Returns the factory of a fused op's kernel.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    match op {
        OP => Some(|node| Ok(Arc::new(FusedElementwise::new(node)?) as Arc<dyn OpKernel>)),
        ASSIGN_OP => Some(|node| {
            let subtract = match attr::string_or(node, "update", "")?.as_str() {
                "add" => false,
                "sub" => true,
                other => {
                    return Err(Status::invalid_argument(format!(
                        "{ASSIGN_OP} node `{}`: update must be `add` or `sub`, not `{other}`",
                        node.name
                    )))
                }
            };
            let program = FusedElementwise::new(node)?;
            Ok(Arc::new(FusedElementwiseAssign { program, subtract }) as Arc<dyn OpKernel>)
        }),
        _ => None,
    }
}

/// An element-wise op a fused node may run, with the function its unfused kernel applies to
/// float32 elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    Add,
    Sub,
    Mul,
    RealDiv,
    DivNoNan,
    Maximum,
    Minimum,
    SquaredDifference,
    ReluGrad,
    SigmoidGrad,
    TanhGrad,
    Neg,
    Square,
    Abs,
    Sqrt,
    Rsqrt,
    Exp,
    Log,
    Reciprocal,
    Relu,
    Relu6,
    Tanh,
    Sigmoid,
}

impl Element {
    /// The element-wise op named `op` (a TensorFlow op name), when it can be fused.
    pub fn of(op: &str) -> Option<Self> {
        use Element::*;
        Some(match op {
            "Add" | "AddV2" => Add,
            "Sub" => Sub,
            "Mul" => Mul,
            "RealDiv" => RealDiv,
            "DivNoNan" => DivNoNan,
            "Maximum" => Maximum,
            "Minimum" => Minimum,
            "SquaredDifference" => SquaredDifference,
            "ReluGrad" => ReluGrad,
            "SigmoidGrad" => SigmoidGrad,
            "TanhGrad" => TanhGrad,
            "Neg" => Neg,
            "Square" => Square,
            "Abs" => Abs,
            "Sqrt" => Sqrt,
            "Rsqrt" => Rsqrt,
            "Exp" => Exp,
            "Log" => Log,
            "Reciprocal" | "Inv" => Reciprocal,
            "Relu" => Relu,
            "Relu6" => Relu6,
            "Tanh" => Tanh,
            "Sigmoid" => Sigmoid,
            _ => return None,
        })
    }

    /// How many inputs the op takes.
    pub fn arity(self) -> usize {
        use Element::*;
        match self {
            Add | Sub | Mul | RealDiv | DivNoNan | Maximum | Minimum | SquaredDifference
            | ReluGrad | SigmoidGrad | TanhGrad => 2,
            _ => 1,
        }
    }

    /// Whether the op requires its two inputs to have one shape (the gradient ops do not
    /// broadcast, as TensorFlow's do not).
    fn same_shapes(self) -> bool {
        matches!(
            self,
            Element::ReluGrad | Element::SigmoidGrad | Element::TanhGrad
        )
    }

    /// The op of a unary step on one element.
    #[inline(always)]
    fn unary(self, x: f32) -> f32 {
        use Element::*;
        match self {
            Neg => Real::neg(x),
            Square => Real::mul(x, x),
            Abs => Real::abs(x),
            Sqrt => x.sqrt(),
            Rsqrt => 1.0 / x.sqrt(),
            Exp => x.exp(),
            Log => x.ln(),
            Reciprocal => 1.0 / x,
            Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            Relu6 => {
                if x > 6.0 {
                    6.0
                } else if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            Tanh => x.tanh_fast(),
            Sigmoid => x.sigmoid_fast(),
            _ => unreachable!("{self:?} is binary"),
        }
    }

    /// The op of a binary step on one pair of elements.
    #[inline(always)]
    fn binary(self, a: f32, b: f32) -> f32 {
        use Element::*;
        match self {
            Add => Real::add(a, b),
            Sub => Real::sub(a, b),
            Mul => Real::mul(a, b),
            RealDiv => Real::div(a, b),
            DivNoNan => {
                if b == 0.0 {
                    0.0
                } else {
                    a / b
                }
            }
            Maximum => Real::max(a, b),
            Minimum => Real::min(a, b),
            SquaredDifference => {
                let d = Real::sub(a, b);
                Real::mul(d, d)
            }
            // ReluGrad(gradients, features).
            ReluGrad => {
                if b > 0.0 {
                    a
                } else {
                    0.0
                }
            }
            // SigmoidGrad(y, dy) and TanhGrad(y, dy).
            SigmoidGrad => b * a * (1.0 - a),
            TanhGrad => b * (1.0 - a * a),
            _ => unreachable!("{self:?} is unary"),
        }
    }

    /// The step over slices of one length: `out[i] = op(a[i], b[i])` (`b` unused by a unary
    /// op). The op is matched outside the loops, so each op has its own loop, which the
    /// compiler vectorizes.
    #[inline(always)]
    fn run(self, a: &[f32], b: &[f32], out: &mut [f32]) {
        macro_rules! each {
            ($($op:ident),*) => {
                match self {
                    $(Element::$op => {
                        const OP: Element = Element::$op;
                        if OP.arity() == 1 {
                            for (o, &x) in out.iter_mut().zip(a) {
                                *o = OP.unary(x);
                            }
                        } else {
                            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                                *o = OP.binary(x, y);
                            }
                        }
                    })*
                }
            };
        }
        each!(
            Add,
            Sub,
            Mul,
            RealDiv,
            DivNoNan,
            Maximum,
            Minimum,
            SquaredDifference,
            ReluGrad,
            SigmoidGrad,
            TanhGrad,
            Neg,
            Square,
            Abs,
            Sqrt,
            Rsqrt,
            Exp,
            Log,
            Reciprocal,
            Relu,
            Relu6,
            Tanh,
            Sigmoid
        )
    }
}

/// Where a step's operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    Input(usize),
    Step(usize),
}

/// One step of the program.
#[derive(Clone, Copy, Debug)]
struct Step {
    op: Element,
    a: Operand,
    /// The second operand of a binary op.
    b: Option<Operand>,
}

/// The kernel: the program, parsed once from the node's attrs.
pub(super) struct FusedElementwise {
    steps: Vec<Step>,
    inputs: usize,
}

/// Elements per chunk: a chunk of every step's result stays in L1 (16 steps of 2 KiB).
const CHUNK: usize = 512;

impl FusedElementwise {
    fn new(node: &NodeDef) -> Result<Self> {
        let bad =
            |why: String| Status::invalid_argument(format!("{OP} node `{}`: {why}", node.name));
        let dtype = attr::dtype(node, "T")?;
        if dtype != DType::Float {
            return Err(bad(format!("runs float32 only, not {dtype}")));
        }
        let inputs = attr::int_or(node, "N", 0)?;
        let inputs = usize::try_from(inputs)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| bad(format!("N must be at least 1, not {inputs}")))?;
        let ops = attr::string_list(node, "ops")?;
        let operands = attr::int_list(node, "operands")?;
        if ops.is_empty() || operands.len() != 2 * ops.len() {
            return Err(bad(format!(
                "needs at least one op and two operands per op, not {} ops and {} operands",
                ops.len(),
                operands.len()
            )));
        }
        let mut steps = Vec::with_capacity(ops.len());
        for (k, name) in ops.iter().enumerate() {
            let op = Element::of(name).ok_or_else(|| {
                bad(format!(
                    "step {k}: `{name}` is not an element-wise op it runs"
                ))
            })?;
            let operand = |v: i64| -> Result<Operand> {
                match usize::try_from(v) {
                    Ok(i) if i < inputs => Ok(Operand::Input(i)),
                    Ok(i) if i - inputs < k => Ok(Operand::Step(i - inputs)),
                    _ => Err(bad(format!(
                        "step {k}: operand {v} is neither an input (0..{inputs}) nor an \
                         earlier step"
                    ))),
                }
            };
            let a = operand(operands[2 * k])?;
            let b = match (op.arity(), operands[2 * k + 1]) {
                (1, -1) => None,
                (2, v) => Some(operand(v)?),
                (_, v) => {
                    return Err(bad(format!(
                        "step {k}: `{name}` is unary; its second operand must be -1, not {v}"
                    )))
                }
            };
            steps.push(Step { op, a, b });
        }
        Ok(Self { steps, inputs })
    }

    /// Whether each step's operands may be read a chunk at a time: every input has the output's
    /// dimensions or one element, and a gradient step's two operands both have the output's
    /// dimensions (else the unfused op's shape check decides).
    fn chunked(&self, inputs: &[Tensor], dims: &[usize]) -> bool {
        let whole: Vec<bool> = inputs.iter().map(|t| t.dims() == dims).collect();
        if inputs
            .iter()
            .zip(&whole)
            .any(|(t, &w)| !w && t.num_elements() != 1)
        {
            return false;
        }
        let mut step_whole = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let is_whole = |o: Operand| match o {
                Operand::Input(i) => whole[i],
                Operand::Step(k) => step_whole[k],
            };
            let a = is_whole(step.a);
            let b = step.b.map(is_whole);
            if step.op.same_shapes() && !(a && b == Some(true)) {
                return false;
            }
            step_whole.push(a || b.unwrap_or(false));
        }
        true
    }

    /// The steps over whole inputs (and single elements), a chunk at a time, split over the
    /// intra-op pool; the result written over an input of the output's shape when this node
    /// may take it.
    fn compute_chunked(&self, ctx: &mut OpContext<'_>, dims: Vec<usize>) -> Result<Tensor> {
        let mut forwarded = None;
        for i in 0..self.inputs {
            if ctx.input(i).is_ok_and(|t| t.dims() == dims.as_slice()) {
                if let Some(t) = ctx.forward_input(i) {
                    forwarded = Some((i, t));
                    break;
                }
            }
        }
        let taken = forwarded.as_ref().map(|(i, _)| *i);
        let len: usize = dims.iter().product();
        let values = (0..self.inputs)
            .map(|i| match Some(i) == taken {
                true => Ok(Cow::Borrowed(&[][..])),
                false => ctx.input(i)?.values::<f32>(),
            })
            .collect::<Result<Vec<_>>>()?;
        let sources = sources(&values, len, taken);
        let intra = ctx.intra();
        let pass = |out: &mut [f32]| self.pass(intra, &sources, out, None);
        match forwarded {
            Some((_, mut tensor)) => {
                tensor.update_in_place::<f32, _>(pass)?;
                Ok(tensor)
            }
            None => {
                let mut out = vec![0.0f32; len];
                pass(&mut out);
                Tensor::from_vec(dims, out)
            }
        }
    }

    /// The steps over all of `out` (see [`run_piece`](Self::run_piece)), split over the
    /// intra-op pool.
    fn pass(
        &self,
        intra: &IntraPool,
        sources: &[Source<'_>],
        out: &mut [f32],
        update: Option<fn(f32, f32) -> f32>,
    ) {
        let cycles = self.steps.len() as f64 * ELEMENT_CYCLES;
        intra.for_chunks(out, 1, cycles, |start, piece| {
            lanes(|| self.run_piece(sources, start, piece, update))
        })
    }

    /// The steps over `piece`, the output's elements from `start` on, a chunk at a time; with
    /// `update`, each chunk of the result goes into the piece's elements through it
    /// (`x = update(x, result)`) instead of over them.
    #[inline(always)]
    fn run_piece(
        &self,
        sources: &[Source<'_>],
        start: usize,
        piece: &mut [f32],
        update: Option<fn(f32, f32) -> f32>,
    ) {
        let last = self.steps.len() - 1;
        let mut scratch = vec![0.0f32; CHUNK * last];
        let scalars: Vec<Vec<f32>> = sources
            .iter()
            .map(|s| match s {
                Source::Scalar(v) => vec![*v; CHUNK],
                _ => Vec::new(),
            })
            .collect();
        // The forwarded input's chunk, read from here while its place is written.
        let forwarded = sources.iter().any(|s| matches!(s, Source::Output));
        let mut own = [0.0f32; CHUNK];
        let mut result = [0.0f32; CHUNK];
        let mut offset = 0;
        while offset < piece.len() {
            let n = CHUNK.min(piece.len() - offset);
            let at = start + offset;
            let chunk = &mut piece[offset..offset + n];
            if forwarded {
                own[..n].copy_from_slice(chunk);
            }
            for (k, step) in self.steps.iter().enumerate() {
                let (done, rest) = scratch.split_at_mut(k * CHUNK);
                let operand = |o: Operand| -> &[f32] {
                    match o {
                        Operand::Input(i) => match sources[i] {
                            Source::Whole(v) => &v[at..at + n],
                            Source::Scalar(_) => &scalars[i][..n],
                            Source::Output => &own[..n],
                        },
                        Operand::Step(j) => &done[j * CHUNK..j * CHUNK + n],
                    }
                };
                let a = operand(step.a);
                let b = step.b.map_or(&[][..], operand);
                match (k == last, update) {
                    (true, None) => step.op.run(a, b, chunk),
                    (true, Some(_)) => step.op.run(a, b, &mut result[..n]),
                    (false, _) => step.op.run(a, b, &mut rest[..n]),
                }
            }
            if let Some(update) = update {
                for (x, &r) in chunk.iter_mut().zip(&result[..n]) {
                    *x = update(*x, r);
                }
            }
            offset += n;
        }
    }

    /// The steps one at a time over whole tensors, broadcasting as the unfused kernels do (and
    /// failing where they fail); the program's inputs are the node's from `first` on.
    fn compute_stepwise(&self, ctx: &OpContext<'_>, first: usize) -> Result<Tensor> {
        let mut results: Vec<Tensor> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let operand = |o: Operand| match o {
                Operand::Input(i) => ctx.input(first + i),
                Operand::Step(k) => Ok(&results[k]),
            };
            let a = operand(step.a)?;
            let op = step.op;
            let out = match step.b {
                None => {
                    let values = a.values::<f32>()?.iter().map(|&x| op.unary(x)).collect();
                    Tensor::from_vec(a.shape().clone(), values)?
                }
                Some(b) => {
                    let b = operand(b)?;
                    if op.same_shapes() {
                        super::nn::same_shape(ctx, a, b)?;
                    }
                    broadcast::binary::<f32, f32>(ctx, a, b, |x, y| op.binary(x, y))?
                }
            };
            results.push(out);
        }
        Ok(results.pop().expect("a program has at least one step"))
    }
}

/// Where the chunked pass reads each input from, for an output of `len` elements: `taken` is
/// the input forwarded into the output, if any.
fn sources<'v>(values: &'v [Cow<'_, [f32]>], len: usize, taken: Option<usize>) -> Vec<Source<'v>> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| match v.len() {
            _ if Some(i) == taken => Source::Output,
            n if n == len => Source::Whole(v),
            _ => Source::Scalar(v[0]),
        })
        .collect()
}

/// Where the chunked pass reads an input from.
enum Source<'a> {
    /// The output's shape: its elements.
    Whole(&'a [f32]),
    /// One element, broadcast.
    Scalar(f32),
    /// Forwarded: the output's own buffer.
    Output,
}

impl FusedElementwise {
    /// Checks the node has the program's N float32 inputs after its first `first`; returns the
    /// result's dimensions, when the inputs broadcast together (the unfused graph's shape).
    fn result_dims(&self, ctx: &OpContext<'_>, first: usize) -> Result<Option<Vec<usize>>> {
        if ctx.num_inputs() != first + self.inputs {
            return Err(ctx.invalid(format!(
                "has {} inputs; its program reads N = {} after {first}",
                ctx.num_inputs(),
                self.inputs
            )));
        }
        let inputs = &ctx.inputs()[first..];
        if let Some(t) = inputs.iter().find(|t| t.dtype() != DType::Float) {
            return Err(ctx.invalid(format!("runs float32 only; an input is {}", t.dtype())));
        }
        Ok(inputs.iter().try_fold(Vec::new(), |dims, t| {
            broadcast::broadcast_shape(&dims, t.dims())
        }))
    }
}

impl OpKernel for FusedElementwise {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let out = match self.result_dims(ctx, 0)? {
            Some(dims) if self.chunked(ctx.inputs(), &dims) => self.compute_chunked(ctx, dims)?,
            _ => self.compute_stepwise(ctx, 0)?,
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// The kernel of [`ASSIGN_OP`]: the program, and whether the variable takes its result away.
struct FusedElementwiseAssign {
    program: FusedElementwise,
    subtract: bool,
}

impl OpKernel for FusedElementwiseAssign {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let program = &self.program;
        let update: fn(f32, f32) -> f32 = if self.subtract { Real::sub } else { Real::add };
        let intra = ctx.intra();
        match program.result_dims(ctx, 1)? {
            Some(dims) if program.chunked(&ctx.inputs()[1..], &dims) => {
                let len: usize = dims.iter().product();
                let values = ctx.inputs()[1..]
                    .iter()
                    .map(|t| t.values::<f32>())
                    .collect::<Result<Vec<_>>>()?;
                let sources = sources(&values, len, None);
                let shape = Shape::new(dims);
                update_variable(ctx, DType::Float, &shape, |value| {
                    value.update_in_place::<f32, _>(|v| {
                        program.pass(intra, &sources, v, Some(update))
                    })
                })
            }
            _ => {
                let delta = program.compute_stepwise(ctx, 1)?;
                update_variable(ctx, DType::Float, delta.shape(), |value| {
                    let delta = delta.values::<f32>()?;
                    value.update_in_place::<f32, _>(|v| {
                        split::zip_in_place(intra, v, &delta, update)
                    })
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::float32_bits;
    use super::*;
    use crate::graph::attr::value;

    const UNARY: [&str; 13] = [
        "Neg",
        "Square",
        "Abs",
        "Sqrt",
        "Rsqrt",
        "Exp",
        "Log",
        "Reciprocal",
        "Inv",
        "Relu",
        "Relu6",
        "Tanh",
        "Sigmoid",
    ];
    const BINARY: [&str; 12] = [
        "Add",
        "AddV2",
        "Sub",
        "Mul",
        "RealDiv",
        "DivNoNan",
        "Maximum",
        "Minimum",
        "SquaredDifference",
        "ReluGrad",
        "SigmoidGrad",
        "TanhGrad",
    ];

    /// Runs `node` on `inputs`; its output, or its error.
    fn run_node(node: &NodeDef, inputs: Vec<Tensor>) -> Result<Tensor> {
        Ok(super::super::run_alone(node, inputs, None)?.remove(0))
    }

    /// One unfused float32 op.
    fn unfused(op: &str, inputs: Vec<Tensor>) -> Result<Tensor> {
        let node = NodeDef {
            name: op.to_lowercase(),
            op: op.into(),
            attr: [("T".to_string(), value::dtype(DType::Float))].into(),
            ..Default::default()
        };
        run_node(&node, inputs)
    }

    /// A fused node running `ops` with `operands` over `inputs`.
    fn fused(ops: &[&str], operands: &[i64], inputs: Vec<Tensor>) -> Result<Tensor> {
        let mut node = NodeDef {
            name: "fused".into(),
            op: OP.into(),
            ..Default::default()
        };
        node.attr.insert("T".into(), value::dtype(DType::Float));
        node.attr
            .insert("N".into(), value::int(inputs.len() as i64));
        node.attr.insert("ops".into(), value::string_list(ops));
        node.attr
            .insert("operands".into(), value::int_list(operands.to_vec()));
        run_node(&node, inputs)
    }

    fn floats(dims: &[usize], values: Vec<f32>) -> Tensor {
        Tensor::from_vec(dims.to_vec(), values).unwrap()
    }

    /// Values over every branch of the ops: signs, zero, the activations' edges, the
    /// special values, and enough of them (past a chunk) to split.
    fn values(len: usize, seed: f32) -> Vec<f32> {
        let special = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            6.0,
            7.5,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            -40.0,
            30.0,
        ];
        (0..len)
            .map(|i| match i % 3 {
                0 => special[(i / 3) % special.len()],
                _ => ((i as f32 * 0.7311 + seed).sin()) * 9.0,
            })
            .collect()
    }

    #[test]
    fn every_op_computes_its_unfused_kernels_bits() {
        let len = 3 * CHUNK + 17;
        for op in UNARY {
            let x = floats(&[len], values(len, 0.3));
            let want = unfused(op, vec![x.clone()]).unwrap();
            let got = fused(&[op], &[0, -1], vec![x]).unwrap();
            assert_eq!(float32_bits(&got), float32_bits(&want), "{op}");
        }
        for op in BINARY {
            let a = floats(&[len], values(len, 0.3));
            let b = floats(&[len], values(len, 1.9));
            let want = unfused(op, vec![a.clone(), b.clone()]).unwrap();
            let got = fused(&[op], &[0, 1], vec![a, b]).unwrap();
            assert_eq!(float32_bits(&got), float32_bits(&want), "{op}");
        }
    }

    #[test]
    fn a_tree_with_scalars_is_its_unfused_chain() {
        // new_c = c * sigmoid(f + 1) + sigmoid(i) * tanh(j); out = tanh(new_c) * sigmoid(o),
        // an LSTM cell's elements, with the forget bias a scalar.
        let dims = [7, 300];
        let len = 2100;
        let [c, f, i, j, o] =
            [0.1, 0.2, 0.3, 0.4, 0.5].map(|seed| floats(&dims, values(len, seed)));
        let one = floats(&[], vec![1.0]);
        let step = |op: &str, inputs: Vec<&Tensor>| {
            unfused(op, inputs.into_iter().cloned().collect()).unwrap()
        };
        let forget = step("Sigmoid", vec![&step("AddV2", vec![&f, &one])]);
        let kept = step("Mul", vec![&c, &forget]);
        let added = step(
            "Mul",
            vec![&step("Sigmoid", vec![&i]), &step("Tanh", vec![&j])],
        );
        let new_c = step("AddV2", vec![&kept, &added]);
        let want = step(
            "Mul",
            vec![&step("Tanh", vec![&new_c]), &step("Sigmoid", vec![&o])],
        );
        // Inputs 0..6: c, f, one, i, j, o; steps from 6.
        let got = fused(
            &[
                "AddV2", "Sigmoid", "Mul", "Sigmoid", "Tanh", "Mul", "AddV2", "Tanh", "Sigmoid",
                "Mul",
            ],
            &[
                1, 2, // 6: f + 1
                6, -1, // 7: sigmoid
                0, 7, // 8: c * forget
                3, -1, // 9: sigmoid(i)
                4, -1, // 10: tanh(j)
                9, 10, // 11: the product
                8, 11, // 12: new_c
                12, -1, // 13: tanh(new_c)
                5, -1, // 14: sigmoid(o)
                13, 14, // 15: out
            ],
            vec![c, f, one, i, j, o],
        )
        .unwrap();
        assert_eq!(got.dims(), &dims);
        assert_eq!(float32_bits(&got), float32_bits(&want));
    }

    #[test]
    fn the_output_goes_over_an_input_nothing_else_holds_and_never_over_a_held_one() {
        let len = 2 * CHUNK + 5;
        let x = floats(&[len], values(len, 0.7));
        let y = floats(&[len], values(len, 0.9));
        let want = unfused(
            "Mul",
            vec![unfused("Neg", vec![x.clone()]).unwrap(), y.clone()],
        )
        .unwrap();
        // x held by the test: the output goes over y, which nothing else holds.
        let y_at = y.bytes().unwrap().as_ptr();
        let got = fused(&["Neg", "Mul"], &[0, -1, 2, 1], vec![x.clone(), y]).unwrap();
        assert_eq!(float32_bits(&got), float32_bits(&want));
        assert_eq!(got.bytes().unwrap().as_ptr(), y_at);
        // Both held: a fresh buffer, the inputs as they were.
        let y = floats(&[len], values(len, 0.9));
        let got = fused(&["Neg", "Mul"], &[0, -1, 2, 1], vec![x.clone(), y.clone()]).unwrap();
        assert_eq!(float32_bits(&got), float32_bits(&want));
        let unchanged =
            |t: &Tensor, seed| float32_bits(t) == float32_bits(&floats(&[len], values(len, seed)));
        assert!(unchanged(&x, 0.7) && unchanged(&y, 0.9));
    }

    #[test]
    fn other_broadcasts_run_step_by_step_with_the_unfused_values_and_errors() {
        // A bias row over a matrix, then a scalar: not chunked, the same values.
        let m = floats(&[4, 3], values(12, 0.2));
        let row = floats(&[3], vec![1.0, -2.0, 0.5]);
        let s = floats(&[], vec![3.0]);
        let want = unfused(
            "Mul",
            vec![
                unfused("AddV2", vec![m.clone(), row.clone()]).unwrap(),
                s.clone(),
            ],
        )
        .unwrap();
        let got = fused(&["AddV2", "Mul"], &[0, 1, 3, 2], vec![m, row, s.clone()]).unwrap();
        assert_eq!(got.dims(), &[4, 3]);
        assert_eq!(float32_bits(&got), float32_bits(&want));

        // A gradient of two shapes fails as the unfused op does, a scalar operand included.
        let g = floats(&[3], vec![1.0, 2.0, 3.0]);
        let err = fused(&["ReluGrad"], &[0, 1], vec![g.clone(), s.clone()]).unwrap_err();
        let unfused_err = unfused("ReluGrad", vec![g.clone(), s.clone()]).unwrap_err();
        assert_eq!(err.code(), unfused_err.code());
        assert!(err.message().contains("same size and shape"), "{err}");
        // Shapes that do not broadcast: INVALID_ARGUMENT as Add gives.
        let err = fused(&["AddV2"], &[0, 1], vec![g, floats(&[2], vec![1.0, 2.0])]).unwrap_err();
        assert!(err.message().contains("Incompatible shapes"), "{err}");
    }

    #[test]
    fn malformed_programs_are_refused_naming_the_step() {
        let x = || vec![floats(&[2], vec![1.0, 2.0])];
        for (ops, operands, want) in [
            (&["Neg"][..], &[0, 5][..], "unary"),
            (&["Softplus"][..], &[0, -1][..], "`Softplus`"),
            (&["Add"][..], &[0, 1][..], "operand 1"),
            (
                &["Neg", "Neg"][..],
                &[2, -1, 0, -1][..],
                "step 0: operand 2",
            ),
            (&["Neg"][..], &[0][..], "two operands per op"),
        ] {
            let err = fused(ops, operands, x()).unwrap_err();
            assert!(err.message().contains(want), "{ops:?} {operands:?}: {err}");
        }
    }
}
