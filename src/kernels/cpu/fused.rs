//! The fused ops TensorFlow's graph optimizer (grappler's remapper) writes into the partitions a
//! TensorFlow master sends: `_FusedConv2D` and `_FusedMatMul` (a convolution or a matrix
//! product followed by `fused_ops`, e.g. `["BiasAdd", "Relu"]`) and `_FusedBatchNormEx` (a
//! batch normalization followed by an optional side input and an activation).
//!
//! A fused kernel is a chain of the kernels tessera already has (`Conv2D`, `MatMul`, `BiasAdd`,
//! `FusedBatchNormV3`, `Relu`, `Relu6`, `Elu`, `LeakyRelu`, `Tanh`, `Sigmoid`, and for GELU
//! `Mul`, `AddV2`, `Erf`), each built once from a `NodeDef` that carries the fused node's name
//! and the attrs that stage needs, and run in turn on the previous stage's output. The
//! commonest chains, a float32 product then `BiasAdd` and at most one activation other than
//! GELU, run the product's kernel and then add the bias and apply the activation to the
//! product where it lies, one pass over it split over the intra-op threads ([`Epilogue`]),
//! with the element functions of the unfused kernels: the same values, without two more
//! tensors and passes. So a fused node computes exactly what its unfused graph computes on
//! tessera, and any fix to a kernel reaches its fused forms. The worker fuses graphs that come
//! unfused (`exec::remap`).
//!
//! The chains are parsed when the kernel is created (at RegisterGraph): a `fused_ops` list
//! tessera cannot run fails there with UNIMPLEMENTED naming the list and what is supported, and
//! a `num_args` that does not match the list with INVALID_ARGUMENT, as TensorFlow's kernels do.

use std::sync::Arc;

use super::conv::{Conv2D, Convolution, Pass};
use super::matmul::MatMul;
use super::numeric::Float;
use super::split::lanes;
use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::graph::window::ConvAttrs;
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
    /// For a float32 product, `BiasAdd` and at most one activation: the product's kernel and
    /// what the stages after it compute, applied to its rows as it writes them.
    epilogue: Option<(Product, Epilogue)>,
}

/// The product of a contraction whose chain ends in an [`Epilogue`].
enum Product {
    MatMul(MatMul),
    Conv2D(Conv2D),
}

/// A bias added to each row of a contraction's float32 output, then an activation, in one
/// pass over it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Epilogue {
    Bias,
    Relu,
    Relu6,
    Elu,
    LeakyRelu(f32),
    Tanh,
    Sigmoid,
}

impl Epilogue {
    /// The epilogue of `fused_ops` (the bias, then `activation` if any), when there is one.
    fn of(activation: Option<&str>, leakyrelu_alpha: f32) -> Option<Self> {
        Some(match activation {
            None => Epilogue::Bias,
            Some("Relu") => Epilogue::Relu,
            Some("Relu6") => Epilogue::Relu6,
            Some("Elu") => Epilogue::Elu,
            Some("LeakyRelu") => Epilogue::LeakyRelu(leakyrelu_alpha),
            Some("Tanh") => Epilogue::Tanh,
            Some("Sigmoid") => Epilogue::Sigmoid,
            Some(_) => return None,
        })
    }

    /// Adds `bias` to each row of `values` (whole rows of `bias.len()`, at least 1) and
    /// applies the activation. Each element goes through the unfused kernels' functions, so
    /// the values are theirs.
    fn rows(self, values: &mut [f32], bias: &[f32]) {
        fn rows(values: &mut [f32], bias: &[f32], f: impl Fn(f32) -> f32) {
            for row in values.chunks_exact_mut(bias.len()) {
                for (v, &b) in row.iter_mut().zip(bias) {
                    *v = f(*v + b);
                }
            }
        }
        lanes(|| match self {
            Epilogue::Bias => rows(values, bias, |x| x),
            Epilogue::Relu => rows(values, bias, |x| if x > 0.0 { x } else { 0.0 }),
            Epilogue::Relu6 => rows(values, bias, |x| {
                if x > 6.0 {
                    6.0
                } else if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }),
            Epilogue::Elu => rows(values, bias, |x| if x > 0.0 { x } else { x.exp_m1() }),
            Epilogue::LeakyRelu(alpha) => {
                rows(values, bias, |x| if x > 0.0 { x } else { alpha * x })
            }
            Epilogue::Tanh => rows(values, bias, f32::tanh_fast),
            Epilogue::Sigmoid => rows(values, bias, f32::sigmoid_fast),
        })
    }
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
            epilogue: None,
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
        let alpha = attr::float_or(node, "leakyrelu_alpha", 0.2)?;
        let epilogue = match by_batch_norm {
            false => Epilogue::of(rest.first().map(String::as_str), alpha),
            true => None,
        };
        let product_node = &b.stages[0].node;
        let epilogue = match epilogue {
            Some(epilogue) => {
                let product = match contraction {
                    Contraction::MatMul => Product::MatMul(MatMul::of(product_node)?),
                    Contraction::Conv2D => {
                        Product::Conv2D(Conv2D::new(ConvAttrs::of(product_node)?, Pass::Forward))
                    }
                };
                Some((product, epilogue))
            }
            None => None,
        };
        let mut chain = b.finish(vec![y]);
        chain.epilogue = epilogue;
        Ok(chain)
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

    /// The product with its epilogue applied to its rows as they are written, when the inputs
    /// are float32 host tensors and the bias a vector as long as the product's rows; `None`
    /// otherwise, and the chain's own `BiasAdd` says what is wrong.
    fn fused(
        &self,
        ctx: &OpContext<'_>,
        product: &Product,
        epilogue: Epilogue,
    ) -> Result<Option<Tensor>> {
        let (a, b, bias) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
        let host_floats = [a, b, bias]
            .iter()
            .all(|t| t.dtype() == DType::Float && t.device_buffer().is_none());
        if !host_floats || bias.rank() != 1 || bias.num_elements() == 0 {
            return Ok(None);
        }
        let columns = match product {
            Product::MatMul(matmul) => matmul.columns(b),
            Product::Conv2D(_) => (b.rank() == 4).then(|| b.dims()[3]),
        };
        if columns != Some(bias.num_elements()) {
            return Ok(None);
        }
        let bias_values = bias.values::<f32>()?;
        let rows = |values: &mut [f32]| epilogue.rows(values, &bias_values);
        let out = match product {
            Product::MatMul(matmul) => matmul.product_with::<f32>(ctx, a, b, Some(&rows)),
            Product::Conv2D(conv) => conv.forward_with::<f32>(ctx, a, b, Some(&rows)),
        };
        out.map(Some).map_err(|e| e.context(&self.what))
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
        if let Some((product, epilogue)) = &self.epilogue {
            if let Some(out) = self.fused(ctx, product, *epilogue)? {
                ctx.set_output(0, out);
                return Ok(());
            }
        }
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
