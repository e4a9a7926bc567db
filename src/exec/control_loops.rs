//! Control loops for while loops whose body spans devices, added by the master before it
//! partitions a placed graph, as TensorFlow's partitioner adds them (`AddControlFlow` in
//! `graph_partition.cc`).
//!
//! Every device that runs part of a loop's body must run the loop's frames and iterations
//! itself, though only one device (the leader) holds the loop's `LoopCond`. For each frame and
//! each device at the receiving end of an edge inside that frame, this adds a control loop of
//! dummy nodes on that device:
//!
//! ```text
//!   Const (root) or the outer loop's Merge ─► Enter ─► Merge ─► Switch(pred = LoopCond) ─┐
//!                                                      ▲                                 │ :1
//!                                                      └──────── NextIteration ◄─────────┘
//! ```
//!
//! The `Switch` reads the leader's `LoopCond` (an edge partitioning turns into a
//! `_Send`/`_Recv` pair inside the frame), so the device starts an iteration when the leader
//! does and ends the loop when it does. The `Merge` then gates, by a control edge, every
//! node that receives a value of the frame from another device: partitioning moves that edge
//! onto the `_Recv` it creates ([`gate_of`]), which therefore runs once per iteration of the
//! right frame, with the right rendezvous key. Nested loops stack: the outer control loop's
//! `Merge` feeds the inner one's `Enter`.

use std::collections::{BTreeMap, HashMap};

use crate::error::{Result, Status};
use crate::exec::edges::tensor_input;
use crate::exec::partition::new_node;
use crate::graph::{attr, ControlFlowOp};
use crate::proto::{GraphDef, NodeDef};
use crate::tensor::{DType, Shape, Tensor};

/// The name prefix of control-loop nodes.
const PREFIX: &str = "_cloop";

/// Returns `graph` with control loops for every while loop whose body spans devices, and
/// the gating control edges; `graph` itself when no loop does. `counter` numbers new nodes.
pub fn add_control_loops(graph: &GraphDef, counter: &mut u64) -> Result<GraphDef> {
    if !graph.node.iter().any(|n| ControlFlowOp::Enter.is(&n.op)) {
        return Ok(graph.clone());
    }
    let frames = Frames::of(graph)?;
    let index = node_index(graph);
    let mut out = graph.clone();
    let mut added: Vec<NodeDef> = Vec::new();
    // (frame, device) -> the control loop's Merge and Enter.
    let mut loops: BTreeMap<(String, String), (String, usize)> = BTreeMap::new();
    let mut gates: Vec<(usize, String)> = Vec::new();
    let mut next_name = |base: &str| {
        let name = format!("{PREFIX}{base}_S{counter}");
        *counter += 1;
        name
    };
    for (dst, node) in graph.node.iter().enumerate() {
        for input in &node.input {
            let src_name = input.trim_start_matches('^');
            let src_name = src_name.split(':').next().unwrap_or(src_name);
            let Some(&src) = index.get(src_name) else {
                continue;
            };
            let src_node = &graph.node[src];
            if src_node.device == node.device {
                continue;
            }
            let src_frame = frames.output_frame(src, src_node);
            let dst_frame = frames.input_frame(dst, node);
            if src_frame.is_empty() || src_frame != dst_frame {
                continue;
            }
            // The control loops of this frame and of every frame around it, on dst's device.
            let device = node.device.clone();
            let mut frame = src_frame.to_string();
            let mut child: Option<usize> = None;
            loop {
                if frame.is_empty() {
                    if let Some(enter) = child {
                        let mut constant =
                            new_node(next_name(&node.name), "Const", &device, Vec::new());
                        let empty = Tensor::zeros(DType::Float, Shape::new(vec![0]))?;
                        constant
                            .attr
                            .insert("dtype".into(), attr::value::dtype(DType::Float));
                        constant
                            .attr
                            .insert("value".into(), attr::value::tensor(empty.to_proto()));
                        added[enter].input = vec![constant.name.clone()];
                        added.push(constant);
                    }
                    break;
                }
                let key = (frame.clone(), device.clone());
                if let Some((merge, _)) = loops.get(&key) {
                    if let Some(enter) = child {
                        added[enter].input = vec![merge.clone()];
                    }
                    break;
                }
                let info = frames.info.get(&frame).ok_or_else(|| {
                    Status::internal(format!("while loop frame `{frame}` has no Enter"))
                })?;
                let loop_cond = info.loop_cond.as_ref().ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "while loop `{frame}` runs on several devices but has no LoopCond; a \
                         loop across devices needs its predicate"
                    ))
                })?;
                let enter_name = next_name(&node.name);
                let merge_name = next_name(&node.name);
                let switch_name = next_name(&node.name);
                let next_iteration = next_name(&node.name);
                let float = attr::value::dtype(DType::Float);
                let mut enter = new_node(enter_name.clone(), "Enter", &device, Vec::new());
                enter.attr.insert("T".into(), float.clone());
                enter
                    .attr
                    .insert("frame_name".into(), attr::value::string(&frame));
                enter
                    .attr
                    .insert("is_constant".into(), attr::value::bool(false));
                enter.attr.insert(
                    "parallel_iterations".into(),
                    attr::value::int(info.parallel_iterations),
                );
                let mut merge = new_node(
                    merge_name.clone(),
                    "Merge",
                    &device,
                    vec![enter_name.clone(), next_iteration.clone()],
                );
                merge.attr.insert("T".into(), float.clone());
                merge.attr.insert("N".into(), attr::value::int(2));
                let mut switch = new_node(
                    switch_name.clone(),
                    "Switch",
                    &device,
                    vec![merge_name.clone(), tensor_input(loop_cond, 0)],
                );
                switch.attr.insert("T".into(), float.clone());
                let mut next = new_node(
                    next_iteration,
                    "NextIteration",
                    &device,
                    vec![tensor_input(&switch_name, 1)],
                );
                next.attr.insert("T".into(), float);
                // The Switch reads the leader's predicate from another device: gate it too.
                if graph.node[index[loop_cond.as_str()]].device != device {
                    switch.input.push(format!("^{merge_name}"));
                }
                if let Some(inner_enter) = child {
                    added[inner_enter].input = vec![merge_name.clone()];
                }
                let enter_at = added.len();
                added.extend([enter, merge, switch, next]);
                loops.insert(key, (merge_name, enter_at));
                child = Some(enter_at);
                frame = info.parent.clone();
            }
            let merge = loops[&(src_frame.to_string(), device)].0.clone();
            gates.push((dst, merge));
        }
    }
    for (dst, merge) in gates {
        let control = format!("^{merge}");
        if !out.node[dst].input.contains(&control) {
            out.node[dst].input.push(control);
        }
    }
    out.node.extend(added);
    Ok(out)
}

/// The control-loop `Merge` that gates `node` (a control input it got from
/// [`add_control_loops`]), if any: a `_Recv` made for one of its inputs gets the same gate.
pub fn gate_of(node: &NodeDef) -> Option<&str> {
    node.input
        .iter()
        .filter_map(|i| i.strip_prefix('^'))
        .find(|i| i.starts_with(PREFIX))
}

/// Each node's index by name.
fn node_index(graph: &GraphDef) -> HashMap<&str, usize> {
    graph
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect()
}

/// A while loop frame: its parent frame, `parallel_iterations` and `LoopCond` node.
struct FrameInfo {
    parent: String,
    parallel_iterations: i64,
    loop_cond: Option<String>,
}

/// Every node's frame (`""` for the root) in a whole graph.
struct Frames {
    of: Vec<String>,
    info: HashMap<String, FrameInfo>,
}

impl Frames {
    fn of(graph: &GraphDef) -> Result<Frames> {
        let n = graph.node.len();
        let index = node_index(graph);
        let mut successors = vec![Vec::new(); n];
        let mut has_input = vec![false; n];
        for (dst, node) in graph.node.iter().enumerate() {
            for input in &node.input {
                let src = input.trim_start_matches('^');
                let src = src.split(':').next().unwrap_or(src);
                if let Some(&s) = index.get(src) {
                    successors[s].push(dst);
                    has_input[dst] = true;
                }
            }
        }
        let mut of: Vec<Option<String>> = vec![None; n];
        let mut info: HashMap<String, FrameInfo> = HashMap::new();
        let mut stack: Vec<usize> = (0..n).filter(|&i| !has_input[i]).collect();
        for &r in &stack {
            of[r] = Some(String::new());
        }
        while let Some(src) = stack.pop() {
            let node = &graph.node[src];
            let here = of[src].clone().unwrap_or_default();
            let there = match ControlFlowOp::of(&node.op) {
                Some(ControlFlowOp::Enter) => {
                    let name = attr::string_or(node, "frame_name", "")?;
                    let parallel = attr::int_or(node, "parallel_iterations", 10)?;
                    info.entry(name.clone()).or_insert(FrameInfo {
                        parent: here.clone(),
                        parallel_iterations: parallel,
                        loop_cond: None,
                    });
                    name
                }
                Some(ControlFlowOp::Exit) => info
                    .get(&here)
                    .map(|f| f.parent.clone())
                    .unwrap_or_default(),
                _ => here.clone(),
            };
            if node.op == "LoopCond" {
                if let Some(f) = info.get_mut(&here) {
                    f.loop_cond = Some(node.name.clone());
                }
            }
            for &dst in &successors[src] {
                if of[dst].is_none() {
                    of[dst] = Some(there.clone());
                    stack.push(dst);
                }
            }
        }
        Ok(Frames {
            of: of.into_iter().map(Option::unwrap_or_default).collect(),
            info,
        })
    }

    /// The frame of `node`'s outputs: an `Enter`'s are in the frame it enters, an `Exit`'s in
    /// the parent of the frame it leaves. (A node's own frame here is that of its inputs.)
    fn output_frame<'a>(&'a self, i: usize, node: &'a NodeDef) -> &'a str {
        match ControlFlowOp::of(&node.op) {
            Some(ControlFlowOp::Enter) => node
                .attr
                .get("frame_name")
                .and_then(|a| match &a.value {
                    Some(crate::proto::attr_value::Value::S(s)) => std::str::from_utf8(s).ok(),
                    _ => None,
                })
                .unwrap_or(""),
            Some(ControlFlowOp::Exit) => {
                self.info.get(&self.of[i]).map_or("", |f| f.parent.as_str())
            }
            _ => &self.of[i],
        }
    }

    /// The frame of `node`'s inputs.
    fn input_frame(&self, i: usize, _node: &NodeDef) -> &str {
        &self.of[i]
    }
}
