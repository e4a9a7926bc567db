//! Functional control flow: `If` and `StatelessIf`, whose branches are functions of the
//! graph's function library (TensorFlow 2 builds `tf.cond` this way in graphs, for instance
//! the `global_step/cond` that `MonitoredTrainingSession` reads the global step through).
//!
//! The executor creates these kernels itself ([`create`]), since they need the library of the
//! graph they belong to. Each branch is instantiated once: its nodes get their kernels for the
//! If's device, in an order where every node comes after its inputs. A run evaluates the
//! condition as TensorFlow does (a scalar is true when non-zero or a non-empty string; any
//! other tensor when it has elements), then runs the chosen branch's nodes one after the other
//! on the If's thread, with the If's inputs as the function's arguments, and returns what the
//! function's `ret` names.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Result, Status};
use crate::graph::registry;
use crate::kernels::{DeviceType, OpContext, OpKernel};
use crate::proto::{attr_value, FunctionDef, FunctionDefLibrary, NodeDef};
use crate::runtime::executor::KernelLookup;
use crate::tensor::{DType, Tensor};

/// Whether `op` is created by [`create`] (it needs its graph's function library).
pub fn is_functional(op: &str) -> bool {
    matches!(op, "If" | "StatelessIf")
}

/// The factory [`crate::kernels::kernel_for`] gives the functional ops: outside a graph there
/// is no library to find the branches in.
pub fn without_library(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
    Err(Status::failed_precondition(format!(
        "node `{}` (op {}) runs functions of its graph's library; it is created with the graph",
        node.name, node.op
    )))
}

/// Creates the kernel of an `If` or `StatelessIf` node whose branches are in `library`, their
/// nodes' kernels through `kernels` for `device_type`.
pub fn create(
    node: &NodeDef,
    library: Option<&FunctionDefLibrary>,
    device_type: DeviceType,
    kernels: &KernelLookup,
) -> Result<Arc<dyn OpKernel>> {
    let branch = |attr: &str| -> Result<Function> {
        let name = match node.attr.get(attr).and_then(|a| a.value.as_ref()) {
            Some(attr_value::Value::Func(f)) => f.name.clone(),
            _ => {
                return Err(Status::invalid_argument(format!(
                    "node `{}` (op {}) has no function attr `{attr}`",
                    node.name, node.op
                )))
            }
        };
        let def = library
            .and_then(|l| {
                l.function
                    .iter()
                    .find(|f| f.signature.as_ref().map(|s| &s.name) == Some(&name))
            })
            .ok_or_else(|| {
                Status::not_found(format!(
                    "node `{}` (op {}): its {attr} `{name}` is not in the graph's function \
                     library; send the graph with its library",
                    node.name, node.op
                ))
            })?;
        Function::instantiate(def, device_type, kernels)
    };
    Ok(Arc::new(If {
        then_branch: branch("then_branch")?,
        else_branch: branch("else_branch")?,
    }))
}

/// One instantiated function: its nodes in dependency order with their kernels.
struct Function {
    name: String,
    /// The argument names, in order.
    args: Vec<String>,
    nodes: Vec<(NodeDef, Arc<dyn OpKernel>)>,
    /// Per node and input: where the value comes from (control inputs dropped).
    inputs: Vec<Vec<Source>>,
    /// Where each output of the function comes from, in the signature's order.
    outputs: Vec<Source>,
}

/// Where a value inside a function comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Argument `i`.
    Arg(usize),
    /// Output `slot` of the function's node `node`.
    Node { node: usize, slot: usize },
}

impl Function {
    fn instantiate(
        def: &FunctionDef,
        device_type: DeviceType,
        kernels: &KernelLookup,
    ) -> Result<Function> {
        let signature = def.signature.clone().unwrap_or_default();
        let name = signature.name.clone();
        let bad = |what: String| Status::invalid_argument(format!("function `{name}`: {what}"));
        let args: Vec<String> = signature.input_arg.iter().map(|a| a.name.clone()).collect();
        // Nodes with their registered attr defaults, as graphs get them at import.
        let mut defs = Vec::with_capacity(def.node_def.len());
        for node in &def.node_def {
            let mut node = node.clone();
            registry::lookup(&node)?.fill_and_check_attrs(&mut node)?;
            defs.push(node);
        }
        let index: HashMap<&str, usize> = defs
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        // `arg`, or `node:out_arg:k`: the k-th tensor of the op's output argument `out_arg`.
        let resolve = |reference: &str| -> Result<Source> {
            if reference.starts_with('^') {
                return Err(bad(format!(
                    "`{reference}` is a control input where a value is needed"
                )));
            }
            let mut parts = reference.split(':');
            let head = parts.next().unwrap_or_default();
            match (parts.next(), parts.next()) {
                (None, _) => {
                    let i = args
                        .iter()
                        .position(|a| a == head)
                        .ok_or_else(|| bad(format!("`{reference}` names no argument")))?;
                    Ok(Source::Arg(i))
                }
                (Some(out_arg), k) => {
                    let node = *index
                        .get(head)
                        .ok_or_else(|| bad(format!("`{reference}` names no node")))?;
                    let k: usize = k
                        .unwrap_or("0")
                        .parse()
                        .map_err(|_| bad(format!("`{reference}` is not `node:output:index`")))?;
                    let op = registry::lookup(&defs[node])?;
                    let mut start = 0;
                    for arg in &op.outputs {
                        let count = registry::arg_count(&defs[node], arg)?;
                        if arg.name == out_arg {
                            if k >= count {
                                return Err(bad(format!("`{reference}` is past the output")));
                            }
                            return Ok(Source::Node {
                                node,
                                slot: start + k,
                            });
                        }
                        start += count;
                    }
                    Err(bad(format!(
                        "op {} has no output `{out_arg}`",
                        defs[node].op
                    )))
                }
            }
        };
        // Inputs of every node and the order to run them in (Kahn's algorithm).
        let mut inputs = Vec::with_capacity(defs.len());
        let mut preds: Vec<Vec<usize>> = Vec::with_capacity(defs.len());
        for node in &defs {
            let mut sources = Vec::new();
            let mut before = Vec::new();
            for input in &node.input {
                if let Some(control) = input.strip_prefix('^') {
                    let i = index
                        .get(control)
                        .ok_or_else(|| bad(format!("no node `{control}`")))?;
                    before.push(*i);
                    continue;
                }
                let source = resolve(input)?;
                if let Source::Node { node, .. } = source {
                    before.push(node);
                }
                sources.push(source);
            }
            inputs.push(sources);
            preds.push(before);
        }
        let order = dependency_order(&preds).ok_or_else(|| bad("its nodes form a cycle".into()))?;
        let mut outputs = Vec::with_capacity(signature.output_arg.len());
        for out in &signature.output_arg {
            let reference = def
                .ret
                .get(&out.name)
                .ok_or_else(|| bad(format!("no `ret` for output `{}`", out.name)))?;
            outputs.push(resolve(reference)?);
        }
        // Renumber the nodes in run order.
        let mut position = vec![0; defs.len()];
        for (p, &n) in order.iter().enumerate() {
            position[n] = p;
        }
        let renumber = |s: Source| match s {
            Source::Node { node, slot } => Source::Node {
                node: position[node],
                slot,
            },
            arg => arg,
        };
        let mut nodes = Vec::with_capacity(defs.len());
        let mut ordered_inputs = Vec::with_capacity(defs.len());
        for &n in &order {
            let node = defs[n].clone();
            let kernel = kernels(&node, device_type)
                .map_err(|e| e.context(format!("function `{name}`, node `{}`", node.name)))?;
            nodes.push((node, kernel));
            ordered_inputs.push(inputs[n].iter().copied().map(renumber).collect());
        }
        Ok(Function {
            name,
            args,
            nodes,
            inputs: ordered_inputs,
            outputs: outputs.into_iter().map(renumber).collect(),
        })
    }

    /// Runs the function on `args` in the context of the calling kernel `ctx`.
    fn call(&self, ctx: &OpContext<'_>, args: &[Tensor]) -> Result<Vec<Tensor>> {
        if args.len() != self.args.len() {
            return Err(ctx.invalid(format!(
                "function `{}` takes {} arguments, got {}",
                self.name,
                self.args.len(),
                args.len()
            )));
        }
        let mut values: Vec<Vec<Option<Tensor>>> = Vec::with_capacity(self.nodes.len());
        let value = |values: &Vec<Vec<Option<Tensor>>>, source: Source| -> Result<Tensor> {
            match source {
                Source::Arg(i) => Ok(args[i].clone()),
                Source::Node { node, slot } => {
                    values[node].get(slot).cloned().flatten().ok_or_else(|| {
                        ctx.named(Status::internal(format!(
                            "function `{}`: node `{}` produced no output {slot}",
                            self.name, self.nodes[node].0.name
                        )))
                    })
                }
            }
        };
        for ((node, kernel), sources) in self.nodes.iter().zip(&self.inputs) {
            let inputs = sources
                .iter()
                .map(|&s| value(&values, s))
                .collect::<Result<Vec<_>>>()?;
            let mut inner = OpContext::new(node, inputs, ctx.resources, ctx.device, ctx.step_id);
            if let Some(step) = ctx.step() {
                inner = inner.with_step(step);
            }
            kernel.compute(&mut inner).map_err(|e| {
                ctx.named(e.context(format!("function `{}`, node `{}`", self.name, node.name)))
            })?;
            values.push(inner.take_outputs());
        }
        self.outputs.iter().map(|&s| value(&values, s)).collect()
    }
}

/// An order of `preds.len()` nodes where each comes after its predecessors, or `None` for a
/// cycle.
fn dependency_order(preds: &[Vec<usize>]) -> Option<Vec<usize>> {
    let mut pending: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut successors = vec![Vec::new(); preds.len()];
    for (n, before) in preds.iter().enumerate() {
        for &p in before {
            successors[p].push(n);
        }
    }
    let mut ready: Vec<usize> = (0..preds.len()).filter(|&n| pending[n] == 0).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(preds.len());
    while let Some(n) = ready.pop() {
        order.push(n);
        for &s in &successors[n] {
            pending[s] -= 1;
            if pending[s] == 0 {
                ready.push(s);
            }
        }
    }
    (order.len() == preds.len()).then_some(order)
}

/// `If(cond, input...)`: runs `then_branch` or `else_branch` on the inputs.
struct If {
    then_branch: Function,
    else_branch: Function,
}

/// TensorFlow's truth of a condition tensor.
fn truth(ctx: &OpContext<'_>, cond: &Tensor) -> Result<bool> {
    if cond.rank() > 0 {
        return Ok(cond.num_elements() > 0);
    }
    Ok(match cond.dtype() {
        DType::Bool => cond.scalar_value::<bool>()?,
        DType::Float => cond.scalar_value::<f32>()? != 0.0,
        DType::Double => cond.scalar_value::<f64>()? != 0.0,
        DType::Int32 => cond.scalar_value::<i32>()? != 0,
        DType::Int64 => cond.scalar_value::<i64>()? != 0,
        DType::String => !cond.strings()?[0].is_empty(),
        other => {
            return Err(ctx.invalid(format!(
                "an If condition of type {other} has no truth value"
            )))
        }
    })
}

impl OpKernel for If {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let cond = ctx.input(0)?.clone();
        let args: Vec<Tensor> = (1..ctx.num_inputs())
            .map(|i| ctx.input(i).cloned())
            .collect::<Result<_>>()?;
        let branch = if truth(ctx, &cond)? {
            &self.then_branch
        } else {
            &self.else_branch
        };
        let outputs = branch.call(ctx, &args)?;
        for (i, t) in outputs.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}
