//! Lowering functional control flow to TensorFlow 1's, as TensorFlow's
//! `LowerFunctionalOpsPass` does before a master places a graph (`lower_if_op.cc`,
//! `lower_while_op.cc`, `lower_function_call_op.cc`, `inline_function_utils.cc`): after it,
//! placement and partitioning see ordinary nodes, so a loop body or a called function can span
//! devices and tasks, and the executor runs `Switch`/`Merge`/`Enter`/`Exit` frames.
//!
//! [`lower_functional_ops`] replaces
//!
//! - each `If`/`StatelessIf` `x` by a `Switch` of the predicate into two pivots
//!   (`x/pivot_t`, `x/pivot_f`), a `Switch` per input, both branches inlined (each gated on its
//!   pivot), a `Merge` per output and `x/branch_executed`, a `Merge` of the pivots that waits
//!   for both branches' side effects;
//! - each `While`/`StatelessWhile` `w` by the frame `w` (`parallel_iterations` from the attr):
//!   per loop variable an `Enter`, a `Merge` of it and the `NextIteration`, a `Switch` on the
//!   `LoopCond` of the inlined `cond`, an `Exit`, and the inlined `body` between the `Switch`
//!   and the `NextIteration`. Every loop variable takes that path, the loop-invariant ones too;
//!   a resource handle (`DT_RESOURCE`) instead enters once as a constant of the frame, and the
//!   loop's output for it is the handle it was given. `w/LoopExecuted` waits for every `Exit`;
//! - each `PartitionedCall`/`StatefulPartitionedCall` by its inlined function.
//!
//! Inlining a function as `c`: an `Identity` per argument (`c/input/_i`) and per result
//! (`c/output/_i`); the body nodes as `c/<node>`; the call's control inputs gate everything
//! through the NoOp `c/input_control_node` (the arguments and every body node without inputs
//! wait for it, so a body's constants run inside the caller's branch or loop iteration); the
//! NoOp `c/output_control_node` waits for the function's `control_ret` nodes and stands for
//! the call as a control input. New nodes take the lowered node's device; an inlined body node
//! keeps its own device, with the fields it leaves unset taken from the caller's (TensorFlow's
//! multi-device placement of inlined bodies).
//!
//! The lowered node's name stays in the graph, as an `IdentityN` of its outputs (a `NoOp`
//! when it has none), so clients still fetch `x:0` and target `x`; its consumers read the
//! `Merge`/`Exit`/output nodes directly, and its control successors wait on
//! `branch_executed`/`LoopExecuted`/`output_control_node`. Functional ops inside the inlined
//! bodies are lowered in turn. An op stays functional (its kernel runs it) when TensorFlow's
//! lowering would not take it: `_lower_using_switch_merge` set to false, a condition that is
//! not a bool (v1 `Switch` and `LoopCond` take bools), a loop whose variables are all
//! resources, or a function marked `_noinline`.

mod inline;

use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;

use inline::Inline;

use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::graph::function::{body_for, Body};
use crate::graph::registry;
use crate::proto::{attr_value, AttrValue, FunctionDefLibrary, GraphDef, NodeDef};
use crate::tensor::DType;

/// Returns `graph` with every `If`, `While` and `PartitionedCall` (and their stateless and
/// stateful forms) replaced by v1 control flow and the inlined bodies of their functions,
/// nested ones included (see the module doc). A graph without them comes back unchanged.
///
/// Errors: NOT_FOUND naming the node, its function attr and the function when the library
/// lacks it; INVALID_ARGUMENT naming the node when its inputs do not match its function's
/// arguments, or a function when its body is malformed; UNIMPLEMENTED for a function that
/// calls itself.
pub fn lower_functional_ops(graph: &GraphDef) -> Result<GraphDef> {
    if !graph.node.iter().any(|n| is_lowerable_op(&n.op)) {
        return Ok(graph.clone());
    }
    let mut lowering = Lowering {
        library: graph.library.as_ref(),
        nodes: Vec::with_capacity(graph.node.len()),
        names: graph.node.iter().map(|n| n.name.clone()).collect(),
        data: HashMap::new(),
        control: HashMap::new(),
        queue: VecDeque::new(),
    };
    let top = Rc::new(Vec::new());
    for node in &graph.node {
        lowering.add(node.clone(), &top);
    }
    while let Some((node, chain)) = lowering.queue.pop_front() {
        lowering.lower(node, &chain)?;
    }
    let mut nodes = std::mem::take(&mut lowering.nodes);
    for node in &mut nodes {
        for input in &mut node.input {
            *input = lowering.resolve(input, &node.name)?;
        }
    }
    Ok(GraphDef {
        node: nodes,
        ..graph.clone()
    })
}

/// Whether `op` is one [`lower_functional_ops`] replaces.
fn is_lowerable_op(op: &str) -> bool {
    matches!(
        op,
        "If" | "StatelessIf"
            | "While"
            | "StatelessWhile"
            | "PartitionedCall"
            | "StatefulPartitionedCall"
    )
}

/// The functions inlined on the way to a node, outermost first.
pub(super) type Chain = Rc<Vec<String>>;

pub(super) struct Lowering<'g> {
    library: Option<&'g FunctionDefLibrary>,
    /// The graph being built.
    nodes: Vec<NodeDef>,
    /// Every node name in use.
    names: HashSet<String>,
    /// Per lowered node: the tensors that replace its outputs.
    data: HashMap<String, Vec<String>>,
    /// Per lowered node: the node that replaces it as a control input.
    control: HashMap<String, String>,
    /// Functional nodes still to lower, with the functions inlined on the way to them.
    queue: VecDeque<(NodeDef, Chain)>,
}

impl Lowering<'_> {
    /// Adds `node` to the graph, or to the queue when it is to be lowered.
    pub(super) fn add(&mut self, node: NodeDef, chain: &Chain) {
        if is_lowerable_op(&node.op) {
            self.queue.push_back((node, chain.clone()));
        } else {
            self.nodes.push(node);
        }
    }

    /// A new node named `name`, with the registered defaults of its attrs.
    fn make(
        name: String,
        op: &str,
        inputs: Vec<String>,
        attrs: Vec<(&str, AttrValue)>,
        device: &str,
    ) -> Result<NodeDef> {
        let mut node = NodeDef {
            name,
            op: op.into(),
            input: inputs,
            device: device.into(),
            attr: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..Default::default()
        };
        registry::lookup(&node)?.fill_and_check_attrs(&mut node)?;
        Ok(node)
    }

    /// Adds a new node named `base`, or `base_1`, `base_2`, ... when the name is taken, and
    /// returns its name.
    pub(super) fn push(
        &mut self,
        base: &str,
        op: &str,
        inputs: Vec<String>,
        attrs: Vec<(&str, AttrValue)>,
        device: &str,
    ) -> Result<String> {
        let name = self.unique(base);
        let node = Self::make(name.clone(), op, inputs, attrs, device)?;
        self.nodes.push(node);
        Ok(name)
    }

    pub(super) fn unique(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 0;
        while self.names.contains(&name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.names.insert(name.clone());
        name
    }

    /// Lowers one functional node (see the module doc), or keeps it when it stays functional.
    fn lower(&mut self, node: NodeDef, chain: &Chain) -> Result<()> {
        let named = |e: Status| {
            if e.message().contains(&format!("`{}`", node.name)) {
                e
            } else {
                e.context(format!("lowering node `{}` (op {})", node.name, node.op))
            }
        };
        let lowered = match node.op.as_str() {
            "If" | "StatelessIf" => self.lower_if(&node, chain),
            "While" | "StatelessWhile" => self.lower_while(&node, chain),
            _ => self.lower_call(&node, chain),
        }
        .map_err(named)?;
        if !lowered {
            self.nodes.push(node);
        }
        Ok(())
    }

    /// The data inputs and control inputs (node names) of `node`.
    fn split_inputs(node: &NodeDef) -> (Vec<String>, Vec<String>) {
        let mut data = Vec::new();
        let mut controls = Vec::new();
        for input in &node.input {
            match input.strip_prefix('^') {
                Some(c) => controls.push(c.to_string()),
                None => data.push(input.clone()),
            }
        }
        (data, controls)
    }

    /// The function `attr` of `node` names, checked against the types the node passes (and,
    /// when given, returns).
    fn body(
        &self,
        node: &NodeDef,
        attr: &str,
        args: &[DType],
        results: Option<&[DType]>,
        chain: &Chain,
    ) -> Result<Body> {
        let body = body_for(node, attr, self.library)?;
        if chain.contains(&body.name) {
            return Err(Status::unimplemented(format!(
                "node `{}` (op {}): function `{}` calls itself (`{}` → `{}`); tessera does \
                 not run recursive functions",
                node.name,
                node.op,
                body.name,
                chain.join("` → `"),
                body.name
            )));
        }
        let arg_types: Vec<DType> = body.args.iter().map(|(_, t)| *t).collect();
        if arg_types != args {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op {}) passes ({}) to its {attr} `{}`, which takes ({})",
                node.name,
                node.op,
                list(args),
                body.name,
                list(&arg_types)
            )));
        }
        if let Some(results) = results {
            if body.output_types != results {
                return Err(Status::invalid_argument(format!(
                    "node `{}` (op {}) outputs ({}), but its {attr} `{}` returns ({})",
                    node.name,
                    node.op,
                    list(results),
                    body.name,
                    list(&body.output_types)
                )));
            }
        }
        Ok(body)
    }

    /// `If`/`StatelessIf` (TensorFlow's `lower_if_op.cc`).
    fn lower_if(&mut self, node: &NodeDef, chain: &Chain) -> Result<bool> {
        if !lowering_wanted(node)? || attr::dtype(node, "Tcond")? != DType::Bool {
            return Ok(false);
        }
        let (tin, tout) = (
            attr::dtype_list(node, "Tin")?,
            attr::dtype_list(node, "Tout")?,
        );
        let then_body = self.body(node, "then_branch", &tin, Some(&tout), chain)?;
        let else_body = self.body(node, "else_branch", &tin, Some(&tout), chain)?;
        let (data, controls) = Self::split_inputs(node);
        if data.len() != tin.len() + 1 {
            return Err(arity(node, data.len(), tin.len() + 1));
        }
        let (name, device) = (node.name.as_str(), node.device.as_str());
        let t = |d: DType| ("T", value::dtype(d));
        let pred = data[0].clone();
        let mut pred_inputs = vec![pred.clone(), pred.clone()];
        pred_inputs.extend(controls.iter().map(|c| format!("^{c}")));
        let switch_pred = self.push(
            &format!("{name}/switch_pred"),
            "Switch",
            pred_inputs,
            vec![t(DType::Bool)],
            device,
        )?;
        let pivot_f = self.push(
            &format!("{name}/pivot_f"),
            "Identity",
            vec![format!("{switch_pred}:0")],
            vec![t(DType::Bool)],
            device,
        )?;
        let pivot_t = self.push(
            &format!("{name}/pivot_t"),
            "Identity",
            vec![format!("{switch_pred}:1")],
            vec![t(DType::Bool)],
            device,
        )?;
        let mut switches = Vec::with_capacity(tin.len());
        for (k, (input, &dtype)) in data[1..].iter().zip(&tin).enumerate() {
            switches.push(self.push(
                &format!("{name}/switch_{k}"),
                "Switch",
                vec![input.clone(), pred.clone()],
                vec![t(dtype)],
                device,
            )?);
        }
        let then_call = self.inline(
            Inline {
                name: &format!("{name}/then"),
                device,
                body: then_body,
                inputs: switches.iter().map(|s| format!("{s}:1")).collect(),
                controls: vec![pivot_t.clone()],
            },
            chain,
        )?;
        let else_call = self.inline(
            Inline {
                name: &format!("{name}/else"),
                device,
                body: else_body,
                inputs: switches.iter().map(|s| format!("{s}:0")).collect(),
                controls: vec![pivot_f.clone()],
            },
            chain,
        )?;
        let mut merges = Vec::with_capacity(tout.len());
        for (i, &dtype) in tout.iter().enumerate() {
            merges.push(self.push(
                &format!("{name}/output_{i}"),
                "Merge",
                vec![then_call.outputs[i].clone(), else_call.outputs[i].clone()],
                vec![t(dtype), ("N", value::int(2))],
                device,
            )?);
        }
        let branch_executed = self.push(
            &format!("{name}/branch_executed"),
            "Merge",
            vec![
                pivot_t,
                pivot_f,
                format!("^{}", then_call.output_control),
                format!("^{}", else_call.output_control),
            ],
            vec![t(DType::Bool), ("N", value::int(2))],
            device,
        )?;
        let outputs: Vec<String> = merges.iter().map(|m| format!("{m}:0")).collect();
        self.keep_name(node, &tout, outputs, &branch_executed)?;
        Ok(true)
    }

    /// `While`/`StatelessWhile` (TensorFlow's `lower_while_op.cc`).
    fn lower_while(&mut self, node: &NodeDef, chain: &Chain) -> Result<bool> {
        if !lowering_wanted(node)? {
            return Ok(false);
        }
        let types = attr::dtype_list(node, "T")?;
        let cond_body = self.body(node, "cond", &types, None, chain)?;
        let body_body = self.body(node, "body", &types, Some(&types), chain)?;
        // v1 loops need a bool condition and a variable to carry the iterations.
        let loop_vars: Vec<usize> = (0..types.len())
            .filter(|&i| types[i] != DType::Resource)
            .collect();
        if cond_body.output_types != [DType::Bool] || loop_vars.is_empty() {
            return Ok(false);
        }
        let parallel_iterations = attr::int(node, "parallel_iterations")?;
        if parallel_iterations < 1 {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op {}): parallel_iterations is {parallel_iterations}; it must be \
                 at least 1",
                node.name, node.op
            )));
        }
        let (data, controls) = Self::split_inputs(node);
        if data.len() != types.len() {
            return Err(arity(node, data.len(), types.len()));
        }
        let (name, device) = (node.name.as_str(), node.device.as_str());
        let t = |d: DType| ("T", value::dtype(d));
        let gate = if controls.is_empty() {
            None
        } else {
            Some(self.push(
                &format!("{name}/LoopControlInputs"),
                "NoOp",
                controls.iter().map(|c| format!("^{c}")).collect(),
                vec![],
                device,
            )?)
        };
        let mut enters = Vec::with_capacity(types.len());
        for (i, (input, &dtype)) in data.iter().zip(&types).enumerate() {
            let mut inputs = vec![input.clone()];
            inputs.extend(gate.iter().map(|g| format!("^{g}")));
            enters.push(self.push(
                &format!("{name}/enter_{i}"),
                "Enter",
                inputs,
                vec![
                    t(dtype),
                    ("frame_name", value::string(name)),
                    ("is_constant", value::bool(dtype == DType::Resource)),
                    ("parallel_iterations", value::int(parallel_iterations)),
                ],
                device,
            )?);
        }
        // The Merges read the NextIterations, made after the body: their names come first.
        let mut merges = HashMap::new();
        let mut next_names = HashMap::new();
        for &i in &loop_vars {
            let next = self.unique(&format!("{name}/next_iteration_{i}"));
            let merge = self.push(
                &format!("{name}/merge_{i}"),
                "Merge",
                vec![enters[i].clone(), next.clone()],
                vec![t(types[i]), ("N", value::int(2))],
                device,
            )?;
            merges.insert(i, merge);
            next_names.insert(i, next);
        }
        let first = loop_vars[0];
        let cond_call = self.inline(
            Inline {
                name: &format!("{name}/cond"),
                device,
                body: cond_body,
                inputs: (0..types.len())
                    .map(|i| merges.get(&i).unwrap_or(&enters[i]).clone())
                    .collect(),
                controls: vec![merges[&first].clone()],
            },
            chain,
        )?;
        let loop_cond = self.push(
            &format!("{name}/LoopCond"),
            "LoopCond",
            vec![cond_call.outputs[0].clone()],
            vec![],
            device,
        )?;
        let mut switches = HashMap::new();
        for &i in &loop_vars {
            let switch = self.push(
                &format!("{name}/switch_{i}"),
                "Switch",
                vec![merges[&i].clone(), loop_cond.clone()],
                vec![t(types[i])],
                device,
            )?;
            switches.insert(i, switch);
        }
        let body_control = self.push(
            &format!("{name}/loop_body_control"),
            "Identity",
            vec![format!("{}:1", switches[&first])],
            vec![t(types[first])],
            device,
        )?;
        let body_call = self.inline(
            Inline {
                name: &format!("{name}/body"),
                device,
                body: body_body,
                inputs: (0..types.len())
                    .map(|i| match switches.get(&i) {
                        Some(s) => format!("{s}:1"),
                        None => enters[i].clone(),
                    })
                    .collect(),
                controls: vec![body_control],
            },
            chain,
        )?;
        let mut outputs = Vec::with_capacity(types.len());
        let mut exits = Vec::with_capacity(loop_vars.len());
        for i in 0..types.len() {
            let Some(switch) = switches.get(&i) else {
                // A resource handle leaves the loop as it entered.
                outputs.push(data[i].clone());
                continue;
            };
            let exit = self.push(
                &format!("{name}/exit_{i}"),
                "Exit",
                vec![format!("{switch}:0")],
                vec![t(types[i])],
                device,
            )?;
            let next = Self::make(
                next_names[&i].clone(),
                "NextIteration",
                vec![
                    body_call.outputs[i].clone(),
                    format!("^{}", body_call.output_control),
                ],
                vec![t(types[i])],
                device,
            )?;
            self.nodes.push(next);
            outputs.push(format!("{exit}:0"));
            exits.push(exit);
        }
        let executed = self.push(
            &format!("{name}/LoopExecuted"),
            "NoOp",
            exits.iter().map(|e| format!("^{e}")).collect(),
            vec![],
            device,
        )?;
        self.keep_name(node, &types, outputs, &executed)?;
        Ok(true)
    }

    /// `PartitionedCall`/`StatefulPartitionedCall` (TensorFlow's
    /// `lower_function_call_op.cc`).
    fn lower_call(&mut self, node: &NodeDef, chain: &Chain) -> Result<bool> {
        let (tin, tout) = (
            attr::dtype_list(node, "Tin")?,
            attr::dtype_list(node, "Tout")?,
        );
        let body = self.body(node, "f", &tin, Some(&tout), chain)?;
        let noinline = matches!(
            body.attrs.get("_noinline").and_then(|a| a.value.as_ref()),
            Some(attr_value::Value::B(true))
        );
        if noinline {
            return Ok(false);
        }
        let (data, controls) = Self::split_inputs(node);
        if data.len() != tin.len() {
            return Err(arity(node, data.len(), tin.len()));
        }
        let call = self.inline(
            Inline {
                name: &node.name,
                device: &node.device,
                body,
                inputs: data,
                controls,
            },
            chain,
        )?;
        let outputs = call.outputs.iter().map(|o| format!("{o}:0")).collect();
        self.keep_name(node, &tout, outputs, &call.output_control)?;
        Ok(true)
    }

    /// Puts a node named as the lowered `node` in its place (an `IdentityN` of `outputs`, or a
    /// `NoOp` when there are none, after `control`), and records what replaces its outputs and
    /// its control edges.
    fn keep_name(
        &mut self,
        node: &NodeDef,
        types: &[DType],
        outputs: Vec<String>,
        control: &str,
    ) -> Result<()> {
        let mut inputs = outputs.clone();
        inputs.push(format!("^{control}"));
        let kept = if outputs.is_empty() {
            Self::make(node.name.clone(), "NoOp", inputs, vec![], &node.device)?
        } else {
            let t = ("T", value::dtype_list(types));
            Self::make(
                node.name.clone(),
                "IdentityN",
                inputs,
                vec![t],
                &node.device,
            )?
        };
        self.nodes.push(kept);
        self.data.insert(node.name.clone(), outputs);
        self.control.insert(node.name.clone(), control.to_string());
        Ok(())
    }

    /// `input` of node `reader` with lowered nodes replaced: a data input by the tensor that
    /// now holds it, a control input by the node that now stands for the lowered one.
    fn resolve(&self, input: &str, reader: &str) -> Result<String> {
        let mut current = input.to_string();
        // Each step reaches a node made by an earlier lowering; there are finitely many.
        for _ in 0..=self.data.len() {
            if let Some(node) = current.strip_prefix('^') {
                match self.control.get(node) {
                    Some(c) if c != node => current = format!("^{c}"),
                    _ => return Ok(current),
                }
                continue;
            }
            let (node, slot) = match current.rsplit_once(':') {
                Some((n, s)) if s.parse::<usize>().is_ok() => (n, s.parse::<usize>().unwrap_or(0)),
                _ => (current.as_str(), 0),
            };
            let Some(outputs) = self.data.get(node) else {
                return Ok(current);
            };
            let next = outputs.get(slot).cloned().ok_or_else(|| {
                Status::invalid_argument(format!(
                    "node `{reader}` reads output {slot} of `{node}`, which has {} outputs",
                    outputs.len()
                ))
            })?;
            current = next;
        }
        Err(Status::internal(format!(
            "input `{input}` of node `{reader}` does not resolve after lowering"
        )))
    }
}

/// Whether `node` asks to be lowered: TensorFlow's `_lower_using_switch_merge`, when set.
fn lowering_wanted(node: &NodeDef) -> Result<bool> {
    attr::bool_or(node, "_lower_using_switch_merge", true)
}

fn arity(node: &NodeDef, got: usize, want: usize) -> Status {
    Status::invalid_argument(format!(
        "node `{}` (op {}) has {got} data inputs; its type attrs declare {want}",
        node.name, node.op
    ))
}

fn list(types: &[DType]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_without_functional_ops_comes_back_unchanged() {
        let graph = GraphDef {
            node: vec![NodeDef {
                name: "a".into(),
                op: "NoOp".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(lower_functional_ops(&graph).unwrap(), graph);
    }
}
