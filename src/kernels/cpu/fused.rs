//! The fused ops TensorFlow's graph optimizer (grappler's remapper) writes into the partitions a
//! TensorFlow master sends: `_FusedConv2D` and `_FusedMatMul` (a convolution or a matrix
//! product followed by `fused_ops`, e.g. `["BiasAdd", "Relu"]`) and `_FusedBatchNormEx` (a
//! batch normalization followed by an optional side input and an activation).
//!
//! A fused kernel owns no arithmetic: it is a chain of the kernels tessera already has
//! (`Conv2D`, `MatMul`, `BiasAdd`, `FusedBatchNormV3`, `Relu`, `Relu6`, `Elu`, `LeakyRelu`,
//! `Tanh`, `Sigmoid`, and for GELU `Mul`, `AddV2`, `Erf`), each built once from a `NodeDef`
//! that carries the fused node's name and the attrs that stage needs, and run in turn on the
//! previous stage's output. So a fused node computes exactly what its unfused graph computes on
//! tessera, and any fix to a kernel reaches its fused forms.
//!
//! The chains are parsed when the kernel is created (at RegisterGraph): a `fused_ops` list
//! tessera cannot run fails there with UNIMPLEMENTED naming the list and what is supported, and
//! a `num_args` that does not match the list with INVALID_ARGUMENT, as TensorFlow's kernels do.

use std::sync::Arc;

use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::{AttrValue, NodeDef};
use crate::tensor::{DType, Tensor};

/// Returns the factory of a fused op's kernel.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "_FusedConv2D" => |node| Ok(Arc::new(Chain::contraction(node, Contraction::Conv2D)?)),
        "_FusedMatMul" => |node| Ok(Arc::new(Chain::contraction(node, Contraction::MatMul)?)),
        "_FusedBatchNormEx" => |node| Ok(Arc::new(Chain::batch_norm_ex(node)?)),
        _ => return None,
    };
    Some(factory)
}

/// The activations a fused contraction may end with (TensorFlow's names in `fused_ops`).
const ACTIVATIONS: [&str; 8] = [
    "Relu",
    "Relu6",
    "Elu",
    "LeakyRelu",
    "Tanh",
    "Sigmoid",
    "GeluApproximate",
    "GeluExact",
];

/// The product a fused contraction starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contraction {
    Conv2D,
    MatMul,
}

impl Contraction {
    fn op(self) -> &'static str {
        match self {
            Contraction::Conv2D => "Conv2D",
            Contraction::MatMul => "MatMul",
        }
    }

    /// The attrs of the fused node the product's own kernel reads.
    fn attrs(self) -> &'static [&'static str] {
        match self {
            Contraction::Conv2D => &[
                "strides",
                "padding",
                "explicit_paddings",
                "data_format",
                "dilations",
                "use_cudnn_on_gpu",
            ],
            Contraction::MatMul => &["transpose_a", "transpose_b"],
        }
    }
}

/// Where a stage's input comes from.
#[derive(Clone, Debug)]
enum Arg {
    /// Input `i` of the fused node.
    Input(usize),
    /// Output `o` of stage `s`.
    Stage(usize, usize),
    /// A scalar of the node's dtype (GELU's constants).
    Scalar(f64),
}

/// One existing kernel in a chain, with the `NodeDef` it was built from.
struct Stage {
    node: NodeDef,
    kernel: Arc<dyn OpKernel>,
    args: Vec<Arg>,
}

/// A fused op as the chain of kernels it stands for.
struct Chain {
    /// The fused op and its `fused_ops` (or activation), for error messages.
    what: String,
    stages: Vec<Stage>,
    /// Which values are the fused node's outputs, in order.
    outputs: Vec<Arg>,
}

/// Builds a chain's stages from a fused node.
struct Builder<'a> {
    fused: &'a NodeDef,
    /// The fused node as errors name it.
    what: String,
    stages: Vec<Stage>,
}

impl<'a> Builder<'a> {
    fn new(fused: &'a NodeDef, what: String) -> Self {
        Builder {
            fused,
            what,
            stages: Vec::new(),
        }
    }

    /// Adds a stage running `op`'s CPU kernel on `args`, with the fused node's `copied` attrs
    /// (those it has) and `attrs`; returns the stage's first output.
    fn push(
        &mut self,
        op: &str,
        copied: &[&str],
        attrs: &[(&str, AttrValue)],
        args: Vec<Arg>,
    ) -> Result<Arg> {
        let mut node = NodeDef {
            name: self.fused.name.clone(),
            op: op.to_string(),
            device: self.fused.device.clone(),
            ..Default::default()
        };
        for key in copied.iter().chain(&["T"]) {
            if let Some(v) = self.fused.attr.get(*key) {
                node.attr.insert(key.to_string(), v.clone());
            }
        }
        for (key, v) in attrs {
            node.attr.insert(key.to_string(), v.clone());
        }
        let factory = super::kernel_for(op)
            .ok_or_else(|| Status::internal(format!("no CPU kernel for op {op}")))?;
        let kernel = factory(&node).map_err(|e| e.context(&self.what))?;
        self.stages.push(Stage { node, kernel, args });
        Ok(Arg::Stage(self.stages.len() - 1, 0))
    }

    /// Adds `activation` (one of [`ACTIVATIONS`]) on `x`; returns its output.
    fn activation(&mut self, activation: &str, x: Arg) -> Result<Arg> {
        let alpha = attr::float_or(self.fused, "leakyrelu_alpha", 0.2)?;
        match activation {
            "LeakyRelu" => self.push("LeakyRelu", &[], &[("alpha", value::float(alpha))], vec![x]),
            "GeluExact" => {
                // x/2 (1 + erf(x / sqrt 2)), as TensorFlow's `gelu(approximate=False)`.
                let scaled = self.mul(x.clone(), Arg::Scalar(std::f64::consts::FRAC_1_SQRT_2))?;
                let erf = self.push("Erf", &[], &[], vec![scaled])?;
                self.gelu_tail(x, erf)
            }
            "GeluApproximate" => {
                // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as `gelu(approximate=True)`.
                let square = self.mul(x.clone(), x.clone())?;
                let cube = self.mul(square, x.clone())?;
                let term = self.mul(cube, Arg::Scalar(0.044715))?;
                let inner = self.add(x.clone(), term)?;
                let sqrt_2_over_pi =
                    std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
                let scaled = self.mul(inner, Arg::Scalar(sqrt_2_over_pi))?;
                let tanh = self.push("Tanh", &[], &[], vec![scaled])?;
                self.gelu_tail(x, tanh)
            }
            op => self.push(op, &[], &[], vec![x]),
        }
    }

    /// `x/2 (1 + t)`, the end of both GELUs.
    fn gelu_tail(&mut self, x: Arg, t: Arg) -> Result<Arg> {
        let half = self.mul(x, Arg::Scalar(0.5))?;
        let one_plus = self.add(t, Arg::Scalar(1.0))?;
        self.mul(half, one_plus)
    }

    fn mul(&mut self, a: Arg, b: Arg) -> Result<Arg> {
        self.push("Mul", &[], &[], vec![a, b])
    }

    fn add(&mut self, a: Arg, b: Arg) -> Result<Arg> {
        self.push("AddV2", &[], &[], vec![a, b])
    }

    fn finish(self, outputs: Vec<Arg>) -> Chain {
        Chain {
            what: self.what,
            stages: self.stages,
            outputs,
        }
    }
}

/// `["BiasAdd", "Relu"]` as `[BiasAdd, Relu]`.
fn list(ops: &[String]) -> String {
    format!("[{}]", ops.join(", "))
}

impl Chain {
    /// `_FusedConv2D` or `_FusedMatMul`: the product, then `BiasAdd` (one arg) or, for a
    /// convolution, `FusedBatchNorm` in inference (four args: scale, offset, mean, variance),
    /// then at most one activation.
    fn contraction(node: &NodeDef, contraction: Contraction) -> Result<Chain> {
        let fused_ops = attr::string_list(node, "fused_ops")?;
        let what = format!(
            "{} `{}` with fused_ops {}",
            node.op,
            node.name,
            list(&fused_ops)
        );
        let (first, rest) = match fused_ops.split_first() {
            Some((first, rest)) => (first.as_str(), rest),
            None => ("", &[][..]),
        };
        let by_batch_norm = contraction == Contraction::Conv2D && first == "FusedBatchNorm";
        let supported = (first == "BiasAdd" || by_batch_norm)
            && match rest {
                [] => true,
                [activation] => ACTIVATIONS.contains(&activation.as_str()),
                _ => false,
            };
        if !supported {
            let firsts = match contraction {
                Contraction::Conv2D => "BiasAdd or FusedBatchNorm",
                Contraction::MatMul => "BiasAdd",
            };
            return Err(Status::unimplemented(format!(
                "{what}: tessera does not run this combination; it runs {firsts}, then at most \
                 one of {}",
                ACTIVATIONS.join(", ")
            )));
        }
        let host_args = attr::int_or(node, "num_host_args", 0)?;
        if host_args != 0 {
            return Err(Status::unimplemented(format!(
                "{what}: num_host_args {host_args} (quantized host arguments) is not supported; \
                 tessera runs float contractions"
            )));
        }
        let num_args = attr::int_or(node, "num_args", 0)?;
        let want = if by_batch_norm { 4 } else { 1 };
        if num_args != want {
            return Err(Status::invalid_argument(format!(
                "{what}: num_args is {num_args}, but {first} takes {want} extra argument{}",
                if want == 1 { "" } else { "s" }
            )));
        }
        let mut b = Builder::new(node, what);
        let product = b.push(
            contraction.op(),
            contraction.attrs(),
            &[],
            vec![Arg::Input(0), Arg::Input(1)],
        )?;
        let mut y = if by_batch_norm {
            let epsilon = attr::float_or(node, "epsilon", 1e-4)?;
            b.push(
                "FusedBatchNormV3",
                &["data_format"],
                &[
                    ("U", value::dtype(DType::Float)),
                    ("epsilon", value::float(epsilon)),
                    ("is_training", value::bool(false)),
                ],
                vec![
                    product,
                    Arg::Input(2),
                    Arg::Input(3),
                    Arg::Input(4),
                    Arg::Input(5),
                ],
            )?
        } else {
            b.push(
                "BiasAdd",
                &["data_format"],
                &[],
                vec![product, Arg::Input(2)],
            )?
        };
        if let [activation] = rest {
            y = b.activation(activation, y)?;
        }
        Ok(b.finish(vec![y]))
    }

    /// `_FusedBatchNormEx`: `FusedBatchNormV3` with the node's attrs, plus the side input when
    /// `num_side_inputs` is 1, then the activation (`Identity` or `Relu`, as TensorFlow's CPU
    /// kernel). Outputs: the activation's, then the batch normalization's statistics and
    /// reserve spaces as they are (`FusedBatchNormGradV3` reads them).
    fn batch_norm_ex(node: &NodeDef) -> Result<Chain> {
        let activation = attr::string_or(node, "activation_mode", "Identity")?;
        let side_inputs = attr::int_or(node, "num_side_inputs", 0)?;
        let what = format!(
            "{} `{}` with activation_mode {activation} and {side_inputs} side input{}",
            node.op,
            node.name,
            if side_inputs == 1 { "" } else { "s" }
        );
        if !matches!(activation.as_str(), "Identity" | "Relu") || !(0..=1).contains(&side_inputs) {
            return Err(Status::unimplemented(format!(
                "{what}: tessera does not run this combination; it runs activation_mode \
                 Identity or Relu with 0 or 1 side inputs"
            )));
        }
        let mut b = Builder::new(node, what);
        let bn = b.push(
            "FusedBatchNormV3",
            &[
                "U",
                "epsilon",
                "exponential_avg_factor",
                "data_format",
                "is_training",
            ],
            &[],
            (0..5).map(Arg::Input).collect(),
        )?;
        let Arg::Stage(bn_stage, _) = bn else {
            unreachable!("push returns a stage's output")
        };
        let mut y = bn;
        if side_inputs == 1 {
            y = b.add(y, Arg::Input(5))?;
        }
        if activation == "Relu" {
            y = b.activation("Relu", y)?;
        }
        let mut outputs = vec![y];
        outputs.extend((1..6).map(|o| Arg::Stage(bn_stage, o)));
        Ok(b.finish(outputs))
    }

    /// The value `arg` names, from the node's inputs or an earlier stage's outputs.
    fn value(
        &self,
        ctx: &OpContext<'_>,
        outputs: &[Vec<Option<Tensor>>],
        arg: &Arg,
    ) -> Result<Tensor> {
        match arg {
            Arg::Input(i) => ctx.input(*i).cloned(),
            Arg::Stage(s, o) => outputs[*s].get(*o).and_then(Option::clone).ok_or_else(|| {
                Status::internal(format!(
                    "{}: stage {} ({}) did not set output {o}",
                    self.what, s, self.stages[*s].node.op
                ))
            }),
            Arg::Scalar(v) => {
                let dtype = attr::dtype(ctx.node(), "T")?;
                match dtype {
                    DType::Double => Ok(Tensor::scalar(*v)),
                    _ => Ok(Tensor::scalar(*v as f32)),
                }
            }
        }
    }
}

impl OpKernel for Chain {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let mut outputs: Vec<Vec<Option<Tensor>>> = Vec::with_capacity(self.stages.len());
        for stage in &self.stages {
            let inputs = stage
                .args
                .iter()
                .map(|a| self.value(ctx, &outputs, a))
                .collect::<Result<Vec<_>>>()?;
            // The stage runs as its own node on the fused node's device, step and budgets.
            let mut sub = ctx.for_node(&stage.node, inputs);
            stage
                .kernel
                .compute(&mut sub)
                .map_err(|e| e.context(&self.what))?;
            outputs.push(sub.take_outputs());
        }
        for (i, arg) in self.outputs.iter().enumerate() {
            let t = self.value(ctx, &outputs, arg)?;
            ctx.set_output(i, t);
        }
        Ok(())
    }
}
