//! Functions of a graph's library (`FunctionDef`s), as TensorFlow 2 writes them for `tf.cond`,
//! `tf.while_loop` and `tf.function` in a graph: what the functional ops' kernels and the
//! lowering to v1 control flow ([`super::lower`]) both read.
//!
//! A function body names its arguments by name (`x`), the outputs of its nodes as
//! `node:output_arg:index` (`mul:z:0`: the first tensor of `Mul`'s output argument `z`), and
//! control inputs as `^node`; `ret` maps each output argument to such a reference and
//! `control_ret` names the nodes that must run for their side effects. A body node's attr may
//! be a placeholder (`$T`) that the caller's function attr (`NameAttrList.attr`) fills in.

use std::collections::HashMap;

use crate::error::{Result, Status};
use crate::graph::registry;
use crate::proto::{attr_value, AttrValue, FunctionDef, FunctionDefLibrary, NameAttrList, NodeDef};
use crate::tensor::DType;

/// Where a value inside a function body comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodySource {
    /// Argument `i` of the function.
    Arg(usize),
    /// Output `slot` of body node `node`.
    Node {
        /// The node's index in [`Body::nodes`].
        node: usize,
        /// The output slot, counted over all the op's outputs as a graph edge `name:slot` is.
        slot: usize,
    },
}

/// A function's body with attrs filled in and references resolved.
#[derive(Clone, Debug)]
pub struct Body {
    /// The function's name.
    pub name: String,
    /// The argument names and types, in order.
    pub args: Vec<(String, DType)>,
    /// The output types, in order.
    pub output_types: Vec<DType>,
    /// The body nodes: placeholders filled from the caller's attrs, registered defaults added.
    pub nodes: Vec<NodeDef>,
    /// Per node: its data inputs, in order.
    pub inputs: Vec<Vec<BodySource>>,
    /// Per node: the body nodes it has control inputs on.
    pub controls: Vec<Vec<usize>>,
    /// Where each output of the function comes from, in the signature's order.
    pub outputs: Vec<BodySource>,
    /// The nodes the function must run for their side effects (`control_ret`).
    pub control_outputs: Vec<usize>,
    /// The function's own attrs (`_noinline`, ...).
    pub attrs: HashMap<String, AttrValue>,
}

/// Returns the function attr `attr` of `node`, or INVALID_ARGUMENT naming both.
pub fn func_attr<'a>(node: &'a NodeDef, attr: &str) -> Result<&'a NameAttrList> {
    match node.attr.get(attr).and_then(|a| a.value.as_ref()) {
        Some(attr_value::Value::Func(f)) => Ok(f),
        _ => Err(Status::invalid_argument(format!(
            "node `{}` (op {}) has no function attr `{attr}`",
            node.name, node.op
        ))),
    }
}

/// Finds the function that `node`'s attr `attr` names in `library` and resolves its body:
/// NOT_FOUND naming the node, the attr and the function when the library lacks it;
/// INVALID_ARGUMENT naming the function when its body is malformed.
pub fn body_for(node: &NodeDef, attr: &str, library: Option<&FunctionDefLibrary>) -> Result<Body> {
    let f = func_attr(node, attr)?;
    let def = library
        .and_then(|l| {
            l.function
                .iter()
                .find(|d| d.signature.as_ref().map(|s| &s.name) == Some(&f.name))
        })
        .ok_or_else(|| {
            Status::not_found(format!(
                "node `{}` (op {}): its {attr} `{}` is not in the graph's function library; \
                 send the graph with its library",
                node.name, node.op, f.name
            ))
        })?;
    Body::new(def, &f.attr)
}

impl Body {
    /// Resolves `def`'s body, filling attr placeholders from `attrs` (the caller's function
    /// attr).
    pub fn new(def: &FunctionDef, attrs: &HashMap<String, AttrValue>) -> Result<Body> {
        let signature = def.signature.clone().unwrap_or_default();
        let name = signature.name.clone();
        let bad = |what: String| Status::invalid_argument(format!("function `{name}`: {what}"));
        let arg_type = |arg: &crate::proto::op_def::ArgDef| -> Result<DType> {
            if !arg.number_attr.is_empty() || !arg.type_list_attr.is_empty() {
                return Err(bad(format!(
                    "argument `{}` is a list; tessera runs functions of single tensors",
                    arg.name
                )));
            }
            if !arg.type_attr.is_empty() {
                return match attrs.get(&arg.type_attr).and_then(|a| a.value.as_ref()) {
                    Some(attr_value::Value::Type(t)) => DType::from_i32(*t),
                    _ => Err(bad(format!(
                        "argument `{}` has type `{}`, which the caller does not set",
                        arg.name, arg.type_attr
                    ))),
                };
            }
            DType::from_i32(arg.r#type).map_err(|e| e.context(format!("function `{name}`")))
        };
        let args = signature
            .input_arg
            .iter()
            .map(|a| Ok((a.name.clone(), arg_type(a)?)))
            .collect::<Result<Vec<_>>>()?;
        let output_types = signature
            .output_arg
            .iter()
            .map(arg_type)
            .collect::<Result<Vec<_>>>()?;
        let mut nodes = Vec::with_capacity(def.node_def.len());
        for node in &def.node_def {
            let mut node = node.clone();
            fill_placeholders(&mut node, attrs)
                .map_err(|e| e.context(format!("function `{name}`")))?;
            registry::lookup(&node)
                .and_then(|op| op.fill_and_check_attrs(&mut node))
                .map_err(|e| e.context(format!("function `{name}`, node `{}`", node.name)))?;
            nodes.push(node);
        }
        let index: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        if index.len() != nodes.len() {
            return Err(bad("two body nodes have the same name".into()));
        }
        let resolve = |reference: &str| -> Result<BodySource> {
            if reference.starts_with('^') {
                return Err(bad(format!(
                    "`{reference}` is a control input where a value is needed"
                )));
            }
            let mut parts = reference.split(':');
            let head = parts.next().unwrap_or_default();
            match (parts.next(), parts.next()) {
                (None, _) => args
                    .iter()
                    .position(|(a, _)| a == head)
                    .map(BodySource::Arg)
                    .ok_or_else(|| bad(format!("`{reference}` names no argument"))),
                (Some(out_arg), k) => {
                    let node = *index
                        .get(head)
                        .ok_or_else(|| bad(format!("`{reference}` names no node")))?;
                    let k: usize = k
                        .unwrap_or("0")
                        .parse()
                        .map_err(|_| bad(format!("`{reference}` is not `node:output:index`")))?;
                    let op = registry::lookup(&nodes[node])?;
                    let mut start = 0;
                    for arg in &op.outputs {
                        let count = registry::arg_count(&nodes[node], arg)?;
                        if arg.name == out_arg {
                            if k >= count {
                                return Err(bad(format!("`{reference}` is past the output")));
                            }
                            return Ok(BodySource::Node {
                                node,
                                slot: start + k,
                            });
                        }
                        start += count;
                    }
                    Err(bad(format!(
                        "op {} has no output `{out_arg}`",
                        nodes[node].op
                    )))
                }
            }
        };
        let mut inputs = Vec::with_capacity(nodes.len());
        let mut controls = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let mut data = Vec::new();
            let mut control = Vec::new();
            for input in &node.input {
                match input.strip_prefix('^') {
                    Some(c) => control.push(
                        *index
                            .get(c)
                            .ok_or_else(|| bad(format!("`{input}` names no node")))?,
                    ),
                    None => data.push(resolve(input)?),
                }
            }
            inputs.push(data);
            controls.push(control);
        }
        let mut outputs = Vec::with_capacity(signature.output_arg.len());
        for out in &signature.output_arg {
            let reference = def
                .ret
                .get(&out.name)
                .ok_or_else(|| bad(format!("no `ret` for output `{}`", out.name)))?;
            outputs.push(resolve(reference)?);
        }
        // In the signature's order, then any `control_ret` it does not list, by name.
        let mut control_keys: Vec<&String> = signature
            .control_output
            .iter()
            .filter(|k| def.control_ret.contains_key(*k))
            .collect();
        let mut rest: Vec<&String> = def
            .control_ret
            .keys()
            .filter(|k| !signature.control_output.contains(k))
            .collect();
        rest.sort();
        control_keys.extend(rest);
        let mut control_outputs = Vec::with_capacity(control_keys.len());
        for node in control_keys.into_iter().map(|k| &def.control_ret[k]) {
            control_outputs.push(
                *index
                    .get(node.as_str())
                    .ok_or_else(|| bad(format!("control output `{node}` names no node")))?,
            );
        }
        Ok(Body {
            name,
            args,
            output_types,
            nodes,
            inputs,
            controls,
            outputs,
            control_outputs,
            attrs: def.attr.clone(),
        })
    }

    /// An order of the body's nodes where each comes after its data and control inputs;
    /// INVALID_ARGUMENT naming the function for a cycle.
    pub fn run_order(&self) -> Result<Vec<usize>> {
        let n = self.nodes.len();
        let mut pending = vec![0usize; n];
        let mut successors = vec![Vec::new(); n];
        for (i, (data, control)) in self.inputs.iter().zip(&self.controls).enumerate() {
            let mut before: Vec<usize> = data
                .iter()
                .filter_map(|s| match s {
                    BodySource::Node { node, .. } => Some(*node),
                    BodySource::Arg(_) => None,
                })
                .chain(control.iter().copied())
                .collect();
            before.sort_unstable();
            before.dedup();
            pending[i] = before.len();
            for p in before {
                successors[p].push(i);
            }
        }
        let mut ready: Vec<usize> = (0..n).rev().filter(|&i| pending[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop() {
            order.push(i);
            for &s in &successors[i] {
                pending[s] -= 1;
                if pending[s] == 0 {
                    ready.push(s);
                }
            }
        }
        if order.len() != n {
            return Err(Status::invalid_argument(format!(
                "function `{}`: its nodes form a cycle",
                self.name
            )));
        }
        Ok(order)
    }
}

/// Replaces each attr of `node` that is a placeholder (`$T`) with the caller's value.
fn fill_placeholders(node: &mut NodeDef, attrs: &HashMap<String, AttrValue>) -> Result<()> {
    for (key, value) in node.attr.iter_mut() {
        if let Some(attr_value::Value::Placeholder(p)) = &value.value {
            *value = attrs.get(p).cloned().ok_or_else(|| {
                Status::invalid_argument(format!(
                    "node `{}` takes its attr `{key}` from the caller's `{p}`, which the \
                     caller does not set",
                    node.name
                ))
            })?;
        }
    }
    Ok(())
}
