//! The contraction fusion of TensorFlow's grappler remapper, run on every partition a worker
//! registers for a CPU device: `MatMul` or `Conv2D`, then `BiasAdd`, then optionally one
//! activation (`Relu`, `Relu6`, `Elu`, `LeakyRelu`, `Tanh`, `Sigmoid`) become one
//! `_FusedMatMul` or `_FusedConv2D` node, whose kernel adds the bias and applies the activation
//! to the product where it lies, one pass over it instead of two more tensors and passes.
//!
//! A TensorFlow master sends partitions its grappler already fused; a stock client talking to
//! tessera's master, and tessera's own sessions, send the graph as written, so the worker does
//! it. It fuses what TensorFlow's remapper fuses on a CPU: float32, NHWC, and only where the
//! product and the bias sum have no reader but the next node (a training step's gradients read
//! the activation's output and the product's inputs, never the intermediates), so no value
//! anything reads changes. The fused node keeps the name of the last node it replaces, so every
//! consumer, fetch and `_Send` finds it under the same name, with the control inputs of all
//! the nodes it replaces.
//!
//! Then [`fuse_element_wise`]: each tree of float32 element-wise ops whose inner values only
//! the tree reads becomes one `_FusedElementwise` node (tessera's own op, see
//! `kernels::cpu::fused_element_wise`), named as the tree's root; or, when the root's only
//! reader is a variable's `AssignAddVariableOp` or `AssignSubVariableOp`, one
//! `_FusedElementwiseAssign` with that assign, named as the assign.

use std::collections::HashMap;

use crate::error::{Result, Status};
use crate::exec::edges::{Edge, GraphEdges};
use crate::graph::attr::{self, value};
use crate::graph::registry;
use crate::kernels::cpu::fused_element_wise::{self, Element};
use crate::proto::{GraphDef, NodeDef};
use crate::tensor::DType;

/// The activations a fused contraction may end with, by their op names (which are also the
/// names `fused_ops` lists).
const ACTIVATIONS: [&str; 6] = ["Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"];

/// The one node that reads node `i`'s output 0, when it is the only reader of any of its
/// outputs and nothing waits on it by a control edge.
fn only_reader(edges: &GraphEdges, i: usize) -> Option<usize> {
    match edges.out_edges[i].as_slice() {
        &[e] if edges.edges[e].src_slot == Some(0) => Some(edges.edges[e].dst),
        _ => None,
    }
}

/// The node whose output 0 is node `i`'s first input.
fn first_producer(edges: &GraphEdges, i: usize) -> Option<usize> {
    let e = *edges.in_edges[i].first()?;
    let edge = &edges.edges[e];
    (edge.dst_input == 0 && edge.src_slot == Some(0)).then_some(edge.src)
}

/// One fusion found: the product, the bias sum and the activation (indices into the graph).
struct Fusion {
    product: usize,
    bias_add: usize,
    activation: Option<usize>,
}

/// Whether `node` computes float32 (its `T`).
fn is_float32(node: &NodeDef) -> bool {
    attr::dtype(node, "T").is_ok_and(|t| t == DType::Float)
}

/// Whether `node` is in NHWC (the default).
fn is_nhwc(node: &NodeDef) -> bool {
    attr::string_or(node, "data_format", "NHWC").is_ok_and(|f| f == "NHWC")
}

/// Finds the fusions of `graph` (each node in at most one).
fn find(graph: &GraphDef) -> Result<Vec<Fusion>> {
    let edges = GraphEdges::new(graph)?;
    let mut fusions = Vec::new();
    for (b, bias_add) in graph.node.iter().enumerate() {
        if bias_add.op != "BiasAdd" || !is_float32(bias_add) || !is_nhwc(bias_add) {
            continue;
        }
        let Some(p) = first_producer(&edges, b) else {
            continue;
        };
        let product = &graph.node[p];
        let fusable_product = match product.op.as_str() {
            "MatMul" => true,
            "Conv2D" => is_nhwc(product),
            _ => false,
        };
        if !fusable_product
            || !is_float32(product)
            || product.device != bias_add.device
            || only_reader(&edges, p) != Some(b)
        {
            continue;
        }
        let activation = only_reader(&edges, b).filter(|&a| {
            let node = &graph.node[a];
            ACTIVATIONS.contains(&node.op.as_str())
                && is_float32(node)
                && node.device == bias_add.device
                && first_producer(&edges, a) == Some(b)
        });
        fusions.push(Fusion {
            product: p,
            bias_add: b,
            activation,
        });
    }
    Ok(fusions)
}

/// The fused node standing for one fusion.
fn fused_node(graph: &GraphDef, fusion: &Fusion) -> Result<NodeDef> {
    let product = &graph.node[fusion.product];
    let bias_add = &graph.node[fusion.bias_add];
    let last = &graph.node[fusion.activation.unwrap_or(fusion.bias_add)];
    let is_conv = product.op == "Conv2D";
    let op = if is_conv {
        "_FusedConv2D"
    } else {
        "_FusedMatMul"
    };
    let def = registry::global()
        .get(op)
        .ok_or_else(|| Status::internal(format!("{op} is not in the op registry")))?;
    let mut node = NodeDef {
        name: last.name.clone(),
        op: op.to_string(),
        device: bias_add.device.clone(),
        ..Default::default()
    };
    // The product's two inputs and the bias, then every control input of the three nodes.
    node.input = product.input[..2].to_vec();
    node.input.push(bias_add.input[1].clone());
    let mut controls: Vec<&String> = Vec::new();
    for replaced in [
        Some(fusion.product),
        Some(fusion.bias_add),
        fusion.activation,
    ]
    .into_iter()
    .flatten()
    {
        for input in &graph.node[replaced].input {
            if input.starts_with('^') && !controls.contains(&input) {
                controls.push(input);
            }
        }
    }
    node.input.extend(controls.into_iter().cloned());

    node.attr
        .insert("T".to_string(), value::dtype(DType::Float));
    // The product's attrs the fused op declares too (a convolution's strides, padding, data
    // format and dilations; a product's transposes).
    for (key, v) in &product.attr {
        if key != "T" && def.attrs.iter().any(|a| a.name == *key) {
            node.attr.insert(key.clone(), v.clone());
        }
    }
    if is_conv {
        node.attr
            .insert("TArgs".to_string(), value::dtype_list(&[DType::Float]));
    }
    node.attr.insert("num_args".to_string(), value::int(1));
    let mut fused_ops = vec!["BiasAdd".to_string()];
    if let Some(a) = fusion.activation {
        let activation = &graph.node[a];
        fused_ops.push(activation.op.clone());
        if activation.op == "LeakyRelu" {
            let alpha = attr::float_or(activation, "alpha", 0.2)?;
            node.attr
                .insert("leakyrelu_alpha".to_string(), value::float(alpha));
        }
    }
    node.attr
        .insert("fused_ops".to_string(), value::string_list(fused_ops));
    Ok(node)
}

/// Fuses every `MatMul`/`Conv2D` + `BiasAdd` (+ activation) of `graph` (a partition for a CPU
/// device); returns how many fused nodes it made.
pub fn fuse_contractions(graph: &mut GraphDef) -> Result<usize> {
    let fusions = find(graph)?;
    if fusions.is_empty() {
        return Ok(0);
    }
    let mut replaced = vec![false; graph.node.len()];
    let mut fused = HashMap::new();
    for fusion in &fusions {
        let last = fusion.activation.unwrap_or(fusion.bias_add);
        fused.insert(last, fused_node(graph, fusion)?);
        for i in [
            Some(fusion.product),
            Some(fusion.bias_add),
            fusion.activation,
        ]
        .into_iter()
        .flatten()
        {
            replaced[i] = i != last;
        }
    }
    replace(graph, &replaced, fused);
    Ok(fusions.len())
}

/// Drops the `replaced` nodes of `graph` and puts each fused node where the node it is
/// named after was.
fn replace(graph: &mut GraphDef, replaced: &[bool], mut fused: HashMap<usize, NodeDef>) {
    let nodes = std::mem::take(&mut graph.node);
    graph.node = nodes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !replaced[*i])
        .map(|(i, node)| fused.remove(&i).unwrap_or(node))
        .collect();
}

/// The element-wise op a node runs, when the element-wise fusion may take it: float32, one of
/// [`Element::of`]'s ops, with as many data inputs as the op takes.
fn element(node: &NodeDef, edges: &GraphEdges, i: usize) -> Option<Element> {
    let op = Element::of(&node.op).filter(|_| is_float32(node))?;
    let data_inputs = edges.in_edges[i]
        .iter()
        .filter(|&&e| edges.edges[e].src_slot.is_some())
        .count();
    (data_inputs == op.arity()).then_some(op)
}

/// The variable update a tree under `root` may fuse with: the `AssignAddVariableOp` or
/// `AssignSubVariableOp` (float32, on the root's device) that is the root's only reader, as
/// its value, with nothing else (a fetch's `_Send`, a control edge) reading the root. Returns
/// the assign's index and the fused node's `update`.
fn variable_update(
    graph: &GraphDef,
    edges: &GraphEdges,
    root: usize,
) -> Option<(usize, &'static str)> {
    let [only] = edges.out_edges[root].as_slice() else {
        return None;
    };
    let edge = edges.edges[*only];
    let assign = &graph.node[edge.dst];
    let update = match assign.op.as_str() {
        "AssignAddVariableOp" => "add",
        "AssignSubVariableOp" => "sub",
        _ => return None,
    };
    let float = matches!(attr::dtype(assign, "dtype"), Ok(DType::Float));
    (edge.src_slot == Some(0)
        && edge.dst_input == 1
        && float
        && assign.device == graph.node[root].device)
        .then_some((edge.dst, update))
}

/// The most steps a fused element-wise node runs: each keeps a chunk of scratch per thread,
/// and trees this large are hostile more often than real (they stay unfused).
const MAX_STEPS: usize = 64;

/// One fused element-wise tree's program, built from its root down.
struct Program<'g> {
    graph: &'g GraphDef,
    edges: &'g GraphEdges,
    parent: &'g [Option<usize>],
    /// The fused node's inputs: (producer, output slot), each once.
    inputs: Vec<(usize, usize)>,
    /// Each step's op name and operands (an input, or an earlier step).
    steps: Vec<(String, [Option<Operand>; 2])>,
    /// The step each tree node became.
    step_of: HashMap<usize, usize>,
    controls: Vec<String>,
}

/// A step's operand while the program is built (the inputs' count is known at the end).
#[derive(Clone, Copy)]
enum Operand {
    Input(usize),
    Step(usize),
}

impl Program<'_> {
    /// Emits the steps of the tree under `root`, each node after the tree nodes it reads
    /// (first operand's first), without recursion: a hostile graph's chain may be long.
    fn emit(&mut self, root: usize) {
        let mut stack = vec![(root, false)];
        while let Some((i, ready)) = stack.pop() {
            if self.step_of.contains_key(&i) {
                continue;
            }
            let data: Vec<Edge> = self.edges.in_edges[i]
                .iter()
                .map(|&e| self.edges.edges[e])
                .filter(|e| e.src_slot.is_some())
                .collect();
            if !ready {
                stack.push((i, true));
                for edge in data.iter().rev() {
                    if self.parent[edge.src] == Some(i) {
                        stack.push((edge.src, false));
                    }
                }
                continue;
            }
            let mut operands = [None, None];
            for (slot, edge) in operands.iter_mut().zip(&data) {
                *slot = Some(match self.step_of.get(&edge.src) {
                    Some(&k) if self.parent[edge.src] == Some(i) => Operand::Step(k),
                    _ => Operand::Input(self.input(edge.src, edge.src_slot.unwrap_or(0))),
                });
            }
            for input in &self.graph.node[i].input {
                if input.starts_with('^') && !self.controls.contains(input) {
                    self.controls.push(input.clone());
                }
            }
            self.steps.push((self.graph.node[i].op.clone(), operands));
            self.step_of.insert(i, self.steps.len() - 1);
        }
    }

    /// The index of the fused node's input reading `src`'s output `slot`, added if new.
    fn input(&mut self, src: usize, slot: usize) -> usize {
        match self.inputs.iter().position(|&s| s == (src, slot)) {
            Some(index) => index,
            None => {
                self.inputs.push((src, slot));
                self.inputs.len() - 1
            }
        }
    }

    /// The fused node that also applies the tree's result to the variable of `assign` (the
    /// root's only reader), named as the assign (whose control readers then find it): its
    /// handle first, then the tree's inputs, every control input of both.
    fn assign_node(self, root: usize, assign: usize, update: &str) -> NodeDef {
        let assign = &self.graph.node[assign];
        let mut node = self.node(root);
        node.name = assign.name.clone();
        node.op = fused_element_wise::ASSIGN_OP.to_string();
        node.input.insert(0, assign.input[0].clone());
        for control in assign.input.iter().filter(|i| i.starts_with('^')) {
            if !node.input.contains(control) {
                node.input.push(control.clone());
            }
        }
        node.attr
            .insert("update".to_string(), value::string(update));
        node
    }

    /// The fused node, named as the tree's root (whose readers then find it).
    fn node(self, root: usize) -> NodeDef {
        let graph = self.graph;
        let n = self.inputs.len();
        let mut input: Vec<String> = self
            .inputs
            .iter()
            .map(|&(src, slot)| match slot {
                0 => graph.node[src].name.clone(),
                _ => format!("{}:{slot}", graph.node[src].name),
            })
            .collect();
        input.extend(self.controls);
        let encode = |o: Option<Operand>| match o {
            Some(Operand::Input(i)) => i as i64,
            Some(Operand::Step(k)) => (n + k) as i64,
            None => -1,
        };
        let operands = self
            .steps
            .iter()
            .flat_map(|(_, [a, b])| [encode(*a), encode(*b)])
            .collect();
        let ops: Vec<String> = self.steps.into_iter().map(|(op, _)| op).collect();
        let root = &graph.node[root];
        let mut node = NodeDef {
            name: root.name.clone(),
            op: fused_element_wise::OP.to_string(),
            device: root.device.clone(),
            input,
            ..Default::default()
        };
        node.attr
            .insert("T".to_string(), value::dtype(DType::Float));
        node.attr.insert("N".to_string(), value::int(n as i64));
        node.attr.insert("ops".to_string(), value::string_list(ops));
        node.attr
            .insert("operands".to_string(), value::int_list(operands));
        node
    }
}

/// Fuses every tree of two or more float32 element-wise ops of `graph` (a partition for a CPU
/// device) into one `_FusedElementwise` node; returns how many it made.
///
/// A node joins the tree of the one node that reads it when that reader is an element-wise op
/// on its device and reads all it gives (output 0, once or twice, and no control edge), so
/// every value a tree swallows was read by the tree alone. The root keeps its name, so its
/// readers, fetches and `_Send`s find the fused node; the control inputs of every node
/// replaced move onto it.
///
/// A tree (one op or more) whose root's only reader is a float32 `AssignAddVariableOp` or
/// `AssignSubVariableOp` on its device (an optimizer's update written as ops) fuses with that
/// assign instead: one `_FusedElementwiseAssign` under the assign's name, which writes the
/// tree's result into the variable as it computes it.
pub fn fuse_element_wise(graph: &mut GraphDef) -> Result<usize> {
    let edges = GraphEdges::new(graph)?;
    let count = graph.node.len();
    let ops: Vec<Option<Element>> = (0..count)
        .map(|i| element(&graph.node[i], &edges, i))
        .collect();
    let parent: Vec<Option<usize>> = (0..count)
        .map(|i| {
            ops[i]?;
            let outs = &edges.out_edges[i];
            let reader = edges.edges[*outs.first()?].dst;
            let only_reader = outs.iter().all(|&e| {
                let edge = &edges.edges[e];
                edge.dst == reader && edge.src_slot == Some(0)
            });
            (only_reader
                && ops[reader].is_some()
                && graph.node[reader].device == graph.node[i].device)
                .then_some(reader)
        })
        .collect();
    let mut has_children = vec![false; count];
    for &p in parent.iter().flatten() {
        has_children[p] = true;
    }
    let mut replaced = vec![false; count];
    let mut fused = HashMap::new();
    for root in 0..count {
        if ops[root].is_none() || parent[root].is_some() {
            continue;
        }
        let update = variable_update(graph, &edges, root);
        if !has_children[root] && update.is_none() {
            continue;
        }
        let mut program = Program {
            graph,
            edges: &edges,
            parent: &parent,
            inputs: Vec::new(),
            steps: Vec::new(),
            step_of: HashMap::new(),
            controls: Vec::new(),
        };
        program.emit(root);
        if program.steps.len() > MAX_STEPS {
            continue;
        }
        for &i in program.step_of.keys() {
            replaced[i] = i != root;
        }
        match update {
            Some((assign, update)) => {
                replaced[root] = true;
                fused.insert(assign, program.assign_node(root, assign, update));
            }
            None => {
                fused.insert(root, program.node(root));
            }
        }
    }
    let made = fused.len();
    if made > 0 {
        replace(graph, &replaced, fused);
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::registry::global;

    const CPU: &str = "/job:worker/replica:0/task:0/device:CPU:0";

    fn node(name: &str, op: &str, inputs: &[&str], dtype: DType) -> NodeDef {
        let mut n = NodeDef {
            name: name.into(),
            op: op.into(),
            device: CPU.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        n.attr.insert("T".into(), value::dtype(dtype));
        n
    }

    /// `x @ w + b`, then `activation` when given, read by a `ReluGrad`-like consumer and a
    /// fetch, as a dense layer of a training step.
    fn dense(activation: Option<&str>) -> GraphDef {
        let mut matmul = node("mm", "MatMul", &["x", "w", "^init"], DType::Float);
        matmul.attr.insert("transpose_b".into(), value::bool(true));
        let mut nodes = vec![
            node("x", "Placeholder", &[], DType::Float),
            node("w", "Placeholder", &[], DType::Float),
            node("b", "Placeholder", &[], DType::Float),
            node("init", "NoOp", &[], DType::Float),
            matmul,
            node("ba", "BiasAdd", &["mm", "b"], DType::Float),
        ];
        let last = match activation {
            Some(op) => {
                nodes.push(node("act", op, &["ba", "^init"], DType::Float));
                "act"
            }
            None => "ba",
        };
        nodes.push(node("grad", "ReluGrad", &["x", last], DType::Float));
        nodes.push(node("fetch", "Identity", &[last], DType::Float));
        GraphDef {
            node: nodes,
            ..Default::default()
        }
    }

    fn names(graph: &GraphDef) -> Vec<&str> {
        graph.node.iter().map(|n| n.name.as_str()).collect()
    }

    fn by_name<'g>(graph: &'g GraphDef, name: &str) -> &'g NodeDef {
        graph.node.iter().find(|n| n.name == name).unwrap()
    }

    #[test]
    fn a_dense_layer_becomes_one_fused_matmul_under_the_activations_name() {
        let mut graph = dense(Some("Relu"));
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 1);
        assert_eq!(
            names(&graph),
            ["x", "w", "b", "init", "act", "grad", "fetch"]
        );
        let fused = by_name(&graph, "act");
        assert_eq!(fused.op, "_FusedMatMul");
        // The product's inputs, the bias, then the control inputs once each.
        assert_eq!(fused.input, ["x", "w", "b", "^init"]);
        assert_eq!(
            attr::string_list(fused, "fused_ops").unwrap(),
            ["BiasAdd", "Relu"]
        );
        assert!(attr::bool_or(fused, "transpose_b", false).unwrap());
        assert_eq!(fused.device, CPU);
        // A node TensorFlow's registry accepts as it is.
        let mut checked = fused.clone();
        global()
            .get("_FusedMatMul")
            .unwrap()
            .fill_and_check_attrs(&mut checked)
            .unwrap();
        // Its readers are untouched.
        assert_eq!(by_name(&graph, "grad").input, ["x", "act"]);
    }

    #[test]
    fn each_activation_fuses_and_leaky_relu_keeps_its_alpha() {
        for op in ACTIVATIONS {
            let mut graph = dense(Some(op));
            if op == "LeakyRelu" {
                let act = graph.node.iter_mut().find(|n| n.name == "act").unwrap();
                act.attr.insert("alpha".into(), value::float(0.3));
            }
            assert_eq!(fuse_contractions(&mut graph).unwrap(), 1, "{op}");
            let fused = by_name(&graph, "act");
            assert_eq!(
                attr::string_list(fused, "fused_ops").unwrap(),
                ["BiasAdd", op]
            );
            if op == "LeakyRelu" {
                assert_eq!(attr::float_or(fused, "leakyrelu_alpha", 0.2).unwrap(), 0.3);
            }
        }
        // No activation, or one that is not fused: the bias alone.
        for activation in [None, Some("Softplus")] {
            let mut graph = dense(activation);
            assert_eq!(fuse_contractions(&mut graph).unwrap(), 1);
            let fused = by_name(&graph, "ba");
            assert_eq!(fused.op, "_FusedMatMul");
            assert_eq!(attr::string_list(fused, "fused_ops").unwrap(), ["BiasAdd"]);
            assert!(!names(&graph).contains(&"mm"));
        }
    }

    #[test]
    fn a_value_anything_else_reads_is_never_fused_away() {
        // The product read twice: nothing fuses.
        let mut graph = dense(Some("Relu"));
        graph
            .node
            .push(node("peek", "Identity", &["mm"], DType::Float));
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 0);
        // A control edge on the product: nothing fuses.
        let mut graph = dense(Some("Relu"));
        graph
            .node
            .push(node("after", "NoOp", &["^mm"], DType::Float));
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 0);
        // The bias sum read twice: the product and the bias fuse, the activation stays.
        let mut graph = dense(Some("Relu"));
        graph
            .node
            .push(node("peek", "Identity", &["ba"], DType::Float));
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 1);
        assert_eq!(by_name(&graph, "ba").op, "_FusedMatMul");
        assert_eq!(by_name(&graph, "act").op, "Relu");
        // float64, another device, NCHW: as TensorFlow's CPU remapper, nothing fuses.
        let mut graph = dense(Some("Relu"));
        for n in &mut graph.node {
            n.attr.insert("T".into(), value::dtype(DType::Double));
        }
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 0);
        let mut graph = dense(Some("Relu"));
        graph.node[4].device = CPU.replace("task:0", "task:1");
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 0);
        let mut graph = dense(None);
        graph.node[5]
            .attr
            .insert("data_format".into(), value::string("NCHW"));
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 0);
    }

    #[test]
    fn a_convolution_keeps_its_attrs_and_names_its_argument_types() {
        let mut conv = node("conv", "Conv2D", &["x", "f"], DType::Float);
        conv.attr
            .insert("strides".into(), value::int_list(vec![1, 2, 2, 1]));
        conv.attr.insert("padding".into(), value::string("SAME"));
        let mut graph = GraphDef {
            node: vec![
                node("x", "Placeholder", &[], DType::Float),
                node("f", "Placeholder", &[], DType::Float),
                node("b", "Placeholder", &[], DType::Float),
                conv,
                node("ba", "BiasAdd", &["conv", "b"], DType::Float),
                node("act", "Relu6", &["ba"], DType::Float),
            ],
            ..Default::default()
        };
        assert_eq!(fuse_contractions(&mut graph).unwrap(), 1);
        let fused = by_name(&graph, "act");
        assert_eq!(fused.op, "_FusedConv2D");
        assert_eq!(fused.input, ["x", "f", "b"]);
        assert_eq!(attr::string_or(fused, "padding", "").unwrap(), "SAME");
        let mut checked = fused.clone();
        let def = global().get("_FusedConv2D").unwrap();
        def.fill_and_check_attrs(&mut checked).unwrap();
        assert_eq!(def.input_types(&checked).unwrap(), vec![DType::Float; 3]);
    }

    /// The elements of an LSTM cell as a partition writes them: `new_c = c * sigmoid(f + 1)
    /// + sigmoid(i) * tanh(j)`, `h = tanh(new_c) * sigmoid(o)`, with `i, j, f, o` one split's
    /// outputs, read by `h`'s fetch (a `_Send`) only.
    fn lstm_cell() -> GraphDef {
        let mut nodes = vec![
            node("c", "Placeholder", &[], DType::Float),
            node("gates", "Split", &["axis", "x"], DType::Float),
            node("one", "Const", &[], DType::Float),
            node("axis", "Const", &[], DType::Int32),
            node("x", "Placeholder", &[], DType::Float),
            node("init", "NoOp", &[], DType::Float),
        ];
        for (name, op, inputs) in [
            ("f1", "AddV2", &["gates:2", "one"][..]),
            ("forget", "Sigmoid", &["f1"]),
            ("kept", "Mul", &["c", "forget"]),
            ("in", "Sigmoid", &["gates"]),
            ("cand", "Tanh", &["gates:1", "^init"]),
            ("added", "Mul", &["in", "cand"]),
            ("new_c", "AddV2", &["kept", "added"]),
            ("squashed", "Tanh", &["new_c"]),
            ("out", "Sigmoid", &["gates:3"]),
            ("h", "Mul", &["squashed", "out"]),
        ] {
            nodes.push(node(name, op, inputs, DType::Float));
        }
        nodes.push(node("send", "_Send", &["h"], DType::Float));
        GraphDef {
            node: nodes,
            ..Default::default()
        }
    }

    /// The program a fused node holds, as (op, operands) per step.
    fn program(fused: &NodeDef) -> Vec<(String, [i64; 2])> {
        let ops = attr::string_list(fused, "ops").unwrap();
        let operands = attr::int_list(fused, "operands").unwrap();
        ops.into_iter()
            .zip(operands.chunks(2).map(|p| [p[0], p[1]]))
            .collect()
    }

    #[test]
    fn an_lstm_cells_elements_become_one_fused_node_under_the_last_ones_name() {
        let mut graph = lstm_cell();
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 1);
        assert_eq!(
            names(&graph),
            ["c", "gates", "one", "axis", "x", "init", "h", "send"]
        );
        let fused = by_name(&graph, "h");
        assert_eq!(fused.op, "_FusedElementwise");
        assert_eq!(fused.device, CPU);
        // Each input once, in the order the steps read them, then the control input.
        assert_eq!(
            fused.input,
            ["gates:2", "one", "c", "gates", "gates:1", "gates:3", "^init"]
        );
        assert_eq!(attr::int_or(fused, "N", 0).unwrap(), 6);
        // Inputs 0..6, steps from 6; each step after those it reads, the first operand's
        // subtree first.
        let want: Vec<(String, [i64; 2])> = [
            ("AddV2", [0, 1]),
            ("Sigmoid", [6, -1]),
            ("Mul", [2, 7]),
            ("Sigmoid", [3, -1]),
            ("Tanh", [4, -1]),
            ("Mul", [9, 10]),
            ("AddV2", [8, 11]),
            ("Tanh", [12, -1]),
            ("Sigmoid", [5, -1]),
            ("Mul", [13, 14]),
        ]
        .into_iter()
        .map(|(op, o)| (op.to_string(), o))
        .collect();
        assert_eq!(program(fused), want);
        // A node TensorFlow's registry checks as any other.
        let mut checked = fused.clone();
        let def = global().get("_FusedElementwise").unwrap();
        def.fill_and_check_attrs(&mut checked).unwrap();
        assert_eq!(def.input_types(&checked).unwrap(), vec![DType::Float; 6]);
    }

    #[test]
    fn an_update_fuses_with_the_assign_that_is_its_only_reader() {
        let assign = |name: &str, op: &str, inputs: &[&str]| {
            let mut n = node(name, op, inputs, DType::Float);
            n.attr.remove("T");
            n.attr.insert("dtype".into(), value::dtype(DType::Float));
            n
        };
        let nodes = vec![
            node("w", "VarHandleOp", &[], DType::Float),
            node("v", "VarHandleOp", &[], DType::Float),
            node("g", "Placeholder", &[], DType::Float),
            node("lr", "Const", &[], DType::Float),
            node("dep", "NoOp", &[], DType::Float),
            // w.assign_sub(sqrt(g) * lr): a tree of two.
            node("root", "Sqrt", &["g"], DType::Float),
            node("scaled", "Mul", &["root", "lr"], DType::Float),
            assign("update_w", "AssignSubVariableOp", &["w", "scaled", "^dep"]),
            node("train", "NoOp", &["^update_w", "^update_v"], DType::Float),
            // v.assign_add(g * lr), the product also sent: the assign stays.
            node("shared", "Mul", &["g", "lr"], DType::Float),
            assign("update_v", "AssignAddVariableOp", &["v", "shared"]),
            node("send", "_Send", &["shared"], DType::Float),
        ];
        let mut graph = GraphDef {
            node: nodes,
            ..Default::default()
        };
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 1);
        let fused = by_name(&graph, "update_w");
        assert_eq!(fused.op, "_FusedElementwiseAssign");
        assert_eq!(fused.input, ["w", "g", "lr", "^dep"]);
        assert_eq!(attr::string_or(fused, "update", "").unwrap(), "sub");
        assert_eq!(
            program(fused),
            [("Sqrt".to_string(), [0, -1]), ("Mul".to_string(), [2, 1]),]
        );
        assert!(graph
            .node
            .iter()
            .all(|n| n.name != "root" && n.name != "scaled"));
        assert_eq!(by_name(&graph, "update_v").op, "AssignAddVariableOp");
        assert_eq!(by_name(&graph, "shared").op, "Mul");
        // A float64 update, or one on another device, stays as it is.
        for (dtype, device) in [(DType::Double, CPU), (DType::Float, "/device:CPU:1")] {
            let mut other = assign("update_x", "AssignSubVariableOp", &["w", "scaled"]);
            other.attr.insert("dtype".into(), value::dtype(dtype));
            other.device = device.into();
            let mut graph = GraphDef {
                node: vec![
                    node("w", "VarHandleOp", &[], DType::Float),
                    node("g", "Placeholder", &[], DType::Float),
                    node("scaled", "Neg", &["g"], DType::Float),
                    other,
                ],
                ..Default::default()
            };
            assert_eq!(fuse_element_wise(&mut graph).unwrap(), 0);
            assert_eq!(by_name(&graph, "scaled").op, "Neg");
        }
    }

    #[test]
    fn element_wise_values_read_elsewhere_stay_and_split_the_tree() {
        // The cell's new_c also read by the next step: it roots its own tree, and `h`'s tree
        // reads it as an input.
        let mut graph = lstm_cell();
        graph
            .node
            .push(node("next", "Identity", &["new_c"], DType::Float));
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 2);
        let new_c = by_name(&graph, "new_c");
        assert_eq!(new_c.op, "_FusedElementwise");
        assert_eq!(program(new_c).len(), 7);
        let h = by_name(&graph, "h");
        assert_eq!(h.input, ["new_c", "gates:3"]);
        assert_eq!(
            program(h),
            [
                ("Tanh".to_string(), [0, -1]),
                ("Sigmoid".to_string(), [1, -1]),
                ("Mul".to_string(), [2, 3]),
            ]
        );
        // A control edge out of a node keeps it: `squashed` stays, `h` fuses `out` alone.
        let mut graph = lstm_cell();
        graph
            .node
            .push(node("after", "NoOp", &["^squashed"], DType::Float));
        fuse_element_wise(&mut graph).unwrap();
        assert_eq!(by_name(&graph, "squashed").op, "_FusedElementwise");
        assert_eq!(
            program(by_name(&graph, "h")),
            [
                ("Sigmoid".to_string(), [0, -1]),
                ("Mul".to_string(), [1, 2]),
            ]
        );
        // float64, or another device: nothing fuses there.
        let mut graph = lstm_cell();
        for n in &mut graph.node {
            n.attr.insert("T".into(), value::dtype(DType::Double));
        }
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 0);
        let mut graph = lstm_cell();
        for n in graph.node.iter_mut().filter(|n| n.name != "h") {
            n.device = CPU.replace("task:0", "task:1");
        }
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 1);
        assert_eq!(by_name(&graph, "h").op, "Mul");
    }

    #[test]
    fn a_value_read_twice_by_one_node_is_one_step_and_long_chains_stay() {
        // relu(x) + relu(x), then negated.
        let mut graph = GraphDef {
            node: vec![
                node("x", "Placeholder", &[], DType::Float),
                node("r", "Relu", &["x"], DType::Float),
                node("twice", "AddV2", &["r", "r"], DType::Float),
                node("neg", "Neg", &["twice"], DType::Float),
            ],
            ..Default::default()
        };
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 1);
        let fused = by_name(&graph, "neg");
        assert_eq!(fused.input, ["x"]);
        assert_eq!(
            program(fused),
            [
                ("Relu".to_string(), [0, -1]),
                ("AddV2".to_string(), [1, 1]),
                ("Neg".to_string(), [2, -1]),
            ]
        );
        // A chain longer than a fused node runs stays as it is (and builds without recursion).
        let mut nodes = vec![node("x", "Placeholder", &[], DType::Float)];
        for i in 0..10_000 {
            let input = if i == 0 {
                "x".to_string()
            } else {
                format!("n{}", i - 1)
            };
            nodes.push(node(&format!("n{i}"), "Neg", &[&input], DType::Float));
        }
        let mut graph = GraphDef {
            node: nodes,
            ..Default::default()
        };
        assert_eq!(fuse_element_wise(&mut graph).unwrap(), 0);
        assert_eq!(graph.node.len(), 10_001);
    }
}
