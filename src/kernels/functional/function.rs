//! One instantiated function of a graph's library: its body nodes with their kernels, in an
//! order where each comes after its inputs, run one after the other on the calling kernel's
//! thread, with the caller's resources, device and step.

use std::cell::RefCell;
use std::sync::Arc;

use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::graph::function::{self as func, Body, BodySource};
use crate::graph::registry;
use crate::kernels::KernelLookup;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::{FunctionDefLibrary, NodeDef};
use crate::tensor::{DType, Tensor};

/// What instantiating a function needs: the library, the device type and the kernel lookup,
/// and the functions being instantiated (a function may not call itself).
pub(super) struct Library<'a> {
    pub library: Option<&'a FunctionDefLibrary>,
    pub device_type: DeviceType,
    pub kernels: &'a KernelLookup,
    /// The functions being instantiated, outermost first.
    pub stack: RefCell<Vec<String>>,
}

impl Library<'_> {
    /// Instantiates the function that `node`'s attr `attr` names.
    pub fn instantiate(&self, node: &NodeDef, attr: &str) -> Result<Function> {
        let body = func::body_for(node, attr, self.library)?;
        if self.stack.borrow().contains(&body.name) {
            let chain = self.stack.borrow().join("` → `");
            return Err(Status::unimplemented(format!(
                "node `{}` (op {}): function `{}` calls itself (`{chain}` → `{}`); tessera \
                 does not run recursive functions",
                node.name, node.op, body.name, body.name
            )));
        }
        self.stack.borrow_mut().push(body.name.clone());
        let function = Function::instantiate(body, self);
        self.stack.borrow_mut().pop();
        function
    }

    /// The kernel of a body node: functional ops are created with the library, the rest
    /// through the kernel lookup.
    fn kernel(&self, node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        if super::is_functional(&node.op) {
            super::create_with(node, self)
        } else {
            (self.kernels)(node, self.device_type)
        }
    }
}

/// A function ready to run: its nodes in run order with their kernels.
pub struct Function {
    /// The function's name in its library.
    pub name: String,
    /// The types of its arguments, in order.
    pub arg_types: Vec<DType>,
    /// The types of its results, in order.
    pub output_types: Vec<DType>,
    nodes: Vec<Step>,
    /// Where each output comes from (node indices in run order).
    outputs: Vec<BodySource>,
}

/// One body node: its kernel and where its inputs come from.
struct Step {
    node: NodeDef,
    kernel: Arc<dyn OpKernel>,
    /// Data inputs (node indices in run order).
    inputs: Vec<BodySource>,
    /// Per input: whether the op takes it as a reference (`Ref(T)`); empty when none is.
    ref_inputs: Vec<bool>,
}

impl Function {
    fn instantiate(body: Body, lib: &Library<'_>) -> Result<Function> {
        let order = body.run_order()?;
        let mut position = vec![0; body.nodes.len()];
        for (p, &n) in order.iter().enumerate() {
            position[n] = p;
        }
        let renumber = |s: &BodySource| match *s {
            BodySource::Node { node, slot } => BodySource::Node {
                node: position[node],
                slot,
            },
            arg => arg,
        };
        let name = body.name.clone();
        let mut nodes = Vec::with_capacity(order.len());
        for &n in &order {
            let node = body.nodes[n].clone();
            let in_function = |e: Status| {
                if e.message().contains(&format!("function `{name}`")) {
                    e
                } else {
                    e.context(format!("function `{name}`, node `{}`", node.name))
                }
            };
            let kernel = lib.kernel(&node).map_err(in_function)?;
            let ref_inputs = match registry::lookup(&node) {
                Ok(op) if op.inputs.iter().any(|a| a.is_ref) => {
                    op.ref_inputs(&node).map_err(in_function)?
                }
                _ => Vec::new(),
            };
            nodes.push(Step {
                inputs: body.inputs[n].iter().map(renumber).collect(),
                node,
                kernel,
                ref_inputs,
            });
        }
        Ok(Function {
            name,
            arg_types: body.args.iter().map(|(_, t)| *t).collect(),
            output_types: body.output_types.clone(),
            outputs: body.outputs.iter().map(renumber).collect(),
            nodes,
        })
    }

    /// Runs the function on `args` in the context of the calling kernel `ctx`: every body node
    /// runs (stateful ones for their effects even when no output needs them, as TensorFlow
    /// keeps them); returns the outputs as values.
    pub fn call(&self, ctx: &OpContext<'_>, args: &[Tensor]) -> Result<Vec<Tensor>> {
        if args.len() != self.arg_types.len() {
            return Err(ctx.invalid(format!(
                "function `{}` takes {} arguments, got {}",
                self.name,
                self.arg_types.len(),
                args.len()
            )));
        }
        let mut values: Vec<Vec<Option<Tensor>>> = Vec::with_capacity(self.nodes.len());
        let value = |values: &Vec<Vec<Option<Tensor>>>, source: BodySource| -> Result<Tensor> {
            match source {
                BodySource::Arg(i) => Ok(args[i].clone()),
                BodySource::Node { node, slot } => {
                    values[node].get(slot).cloned().flatten().ok_or_else(|| {
                        ctx.named(Status::internal(format!(
                            "function `{}`: node `{}` produced no output {slot}",
                            self.name, self.nodes[node].node.name
                        )))
                    })
                }
            }
        };
        for step in &self.nodes {
            let mut inputs = Vec::with_capacity(step.inputs.len());
            for (i, &source) in step.inputs.iter().enumerate() {
                let t = value(&values, source)?;
                // As in graphs: a reference reaches only a `Ref(T)` input as a reference.
                let by_ref = step.ref_inputs.get(i).copied().unwrap_or(false);
                inputs.push(if t.is_ref() && !by_ref {
                    t.deref().map_err(|e| self.in_node(ctx, step, e))?
                } else {
                    t
                });
            }
            let mut inner = ctx.for_node(&step.node, inputs);
            step.kernel
                .compute(&mut inner)
                .map_err(|e| self.in_node(ctx, step, e))?;
            values.push(inner.take_outputs());
        }
        self.outputs
            .iter()
            .map(|&s| {
                let t = value(&values, s)?;
                if t.is_ref() {
                    t.deref()
                } else {
                    Ok(t)
                }
            })
            .collect()
    }

    /// An error of body node `step`, named by function and node, and by the caller.
    fn in_node(&self, ctx: &OpContext<'_>, step: &Step, e: Status) -> Status {
        ctx.named(e.context(format!(
            "function `{}`, node `{}`",
            self.name, step.node.name
        )))
    }
}
