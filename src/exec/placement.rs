//! Placement: gives every node of a client graph a full device name from the cluster's device
//! set, the way TensorFlow's master does before it partitions a graph (reference §5.1).
//!
//! The master calls [`place`] once per graph with the devices of every task (from
//! `GetStatus`), the client's default device and `allow_soft_placement`. The rules:
//!
//! 1. A node's requested device (`NodeDef.device`, full, partial or legacy) is a hard
//!    constraint. `_Send`/`_Recv` and nodes already carrying a full name keep it.
//! 2. Nodes are grouped with union-find: a `_class` attr entry `loc:@x` puts the node in `x`'s
//!    group, and a resource edge (an input whose producer output is `DT_RESOURCE`: a
//!    `VarHandleOp`, or an `Identity`, `IdentityN` or control-flow op of a lowered `If` or
//!    `While` forwarding one) puts consumer and producer together, so
//!    `ReadVariableOp`, `AssignVariableOp` and the apply ops run where the variable lives. The
//!    group's requests are merged; a conflict is INVALID_ARGUMENT "Cannot colocate nodes ...",
//!    except that across a resource edge the variable's request wins over the consumer's (that
//!    is how `VarIsInitializedOp`, requested on the worker by replica_device_setter, lands on
//!    the ps next to its variable, as in TensorFlow). Soft placement drops conflicting device
//!    types and ids.
//! 3. A group's candidates are the devices matching its merged request whose type has a
//!    kernel for every op of the group, GPU before CPU, then by name; the first is taken. No
//!    candidate is INVALID_ARGUMENT "Cannot assign a device for operation ..." naming the node
//!    and the devices; soft placement first retries without the device type and id.
//! 4. Heuristics for unconstrained nodes: a generator (no data inputs) joins its consumers
//!    when they all share one device; a metadata op (`Shape`, `Size`, `Rank`, `ShapeN`)
//!    follows its input; anything else goes to the default device.
//!
//! Placement only reads the graph: it returns a copy with every `device` filled in.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::cluster::DeviceName;
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::exec::edges::GraphEdges;
use crate::graph::attr;
use crate::proto::{DeviceAttributes, GraphDef, NodeDef};
use crate::tensor::DType;

/// What placement needs besides the graph and the devices.
pub struct PlacementOptions<'a> {
    /// The device (full or partial) for nodes nothing else constrains: the master's task, e.g.
    /// `/job:worker/replica:0/task:1/device:CPU:0`. A partial spec such as
    /// `/job:worker/replica:0/task:1` lets such nodes take that task's GPU when every op has a
    /// GPU kernel.
    pub default_device: &'a str,
    /// TensorFlow's `ConfigProto.allow_soft_placement`: relax device type and id when a request
    /// cannot be met (no such GPU, no GPU kernel) instead of failing.
    pub allow_soft_placement: bool,
    /// Whether a kernel for `op` exists on `device_type`; [`registered_kernel`] in production,
    /// a fixed table in tests.
    pub has_kernel: &'a dyn Fn(&str, DeviceType) -> bool,
}

/// The production kernel predicate: tessera's kernel registry, datasets included.
pub fn registered_kernel(op: &str, device_type: DeviceType) -> bool {
    crate::exec::kernel_for(op, device_type).is_some()
}

/// Ops that only read their input's shape; TensorFlow places them with their input.
const METADATA_OPS: [&str; 4] = ["Shape", "ShapeN", "Size", "Rank"];

/// One device of the device set.
struct Device {
    name: String,
    spec: DeviceName,
    device_type: Option<DeviceType>,
}

/// Lower sorts first: GPU, then CPU, then types tessera has no kernels for.
fn priority(device_type: Option<DeviceType>) -> u8 {
    match device_type {
        Some(DeviceType::Gpu) => 0,
        Some(DeviceType::Cpu) => 1,
        None => 2,
    }
}

/// A colocation group, valid at its union-find root.
#[derive(Clone)]
struct Group {
    /// The merged request of all members.
    spec: DeviceName,
    /// The member whose request the spec came from (named in errors).
    source: Option<usize>,
    /// The group holds a resource producer with a request of its own, which a consumer's
    /// request may not override.
    pinned: bool,
}

/// Why two nodes are being colocated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Link {
    /// A `_class` `loc:@` entry.
    Class,
    /// A resource edge; the first node is the producer.
    Resource,
}

/// Returns true when a request constrains nothing (the empty device string).
fn is_unconstrained(spec: &DeviceName) -> bool {
    *spec == DeviceName::default()
}

/// Returns the request without its device type and id: what soft placement falls back to.
fn without_device(spec: &DeviceName) -> DeviceName {
    DeviceName {
        device_type: None,
        id: None,
        ..spec.clone()
    }
}

/// Returns true when the node produces a resource handle itself (not by forwarding one), or
/// the reference handle of a resource that TensorFlow still hands out by reference (a sparse
/// accumulator's `Ref(string)`, whose users must run where it lives as well).
fn is_resource_source(node: &NodeDef) -> bool {
    let typed = |name: &str| {
        attr::dtype(node, name)
            .map(|t| t == DType::Resource)
            .unwrap_or(false)
    };
    match node.op.as_str() {
        // Variables, and the other resources a graph creates and then uses by handle: the
        // ops using a queue or an accumulator run where it lives (the sync token queue and the
        // accumulators on the ps, when replica_device_setter put their users on a worker).
        "VarHandleOp"
        | "FIFOQueueV2"
        | "PaddingFIFOQueueV2"
        | "RandomShuffleQueueV2"
        | "PriorityQueueV2"
        | "ResourceConditionalAccumulator"
        | "SparseConditionalAccumulator" => true,
        "Placeholder" | "PlaceholderWithDefault" => typed("dtype"),
        "_Recv" | "_HostRecv" => typed("tensor_type"),
        "_Arg" => typed("T"),
        _ => false,
    }
}

struct Placer<'g, 'o> {
    graph: &'g GraphDef,
    edges: GraphEdges,
    devices: Vec<Device>,
    options: &'o PlacementOptions<'o>,
    default_spec: DeviceName,
    parent: Vec<usize>,
    groups: Vec<Group>,
}

/// Places `graph` on `devices`; returns a copy whose every node has a full device name.
pub fn place(
    graph: &GraphDef,
    devices: &[DeviceAttributes],
    options: &PlacementOptions<'_>,
) -> Result<GraphDef> {
    let mut placer = Placer::new(graph, devices, options)?;
    placer.colocate()?;
    let assigned = placer.assign()?;
    let mut placed = graph.clone();
    for (node, device) in placed.node.iter_mut().zip(assigned) {
        node.device = placer.devices[device].name.clone();
    }
    Ok(placed)
}

impl<'g, 'o> Placer<'g, 'o> {
    fn new(
        graph: &'g GraphDef,
        devices: &[DeviceAttributes],
        options: &'o PlacementOptions<'o>,
    ) -> Result<Self> {
        let mut parsed = Vec::with_capacity(devices.len());
        for d in devices {
            let spec = DeviceName::parse(&d.name)?;
            if !spec.is_fully_specified() {
                return Err(Status::invalid_argument(format!(
                    "device `{}` in the device set is not a full device name \
                     (/job:J/replica:R/task:T/device:TYPE:ID)",
                    d.name
                )));
            }
            let type_name = if d.device_type.is_empty() {
                spec.device_type.clone().unwrap_or_default()
            } else {
                d.device_type.to_uppercase()
            };
            // Canonical spelling, so legacy names in the set compare equal to parsed requests.
            parsed.push(Device {
                name: spec.to_string(),
                device_type: DeviceType::parse(&type_name),
                spec,
            });
        }
        parsed.sort_by(|a, b| {
            (priority(a.device_type), &a.name).cmp(&(priority(b.device_type), &b.name))
        });
        parsed.dedup_by(|a, b| a.name == b.name);
        if parsed.is_empty() {
            return Err(Status::invalid_argument(
                "cannot place a graph on an empty device set; the cluster reported no devices",
            ));
        }
        let default_spec = DeviceName::parse(options.default_device)
            .map_err(|e| e.context("the default device"))?;

        let edges = GraphEdges::new(graph)?;
        let mut groups = Vec::with_capacity(graph.node.len());
        for node in &graph.node {
            let spec = DeviceName::parse(&node.device)
                .map_err(|e| e.context(format!("device of node `{}`", node.name)))?;
            let requested = !is_unconstrained(&spec);
            groups.push(Group {
                source: requested.then_some(groups.len()),
                pinned: requested && is_resource_source(node),
                spec,
            });
        }
        Ok(Placer {
            graph,
            parent: (0..graph.node.len()).collect(),
            edges,
            devices: parsed,
            options,
            default_spec,
            groups,
        })
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn name(&self, i: usize) -> &str {
        &self.graph.node[i].name
    }

    /// Builds the colocation groups: `_class` entries first, then resource edges.
    fn colocate(&mut self) -> Result<()> {
        // TensorFlow's colocation classes: a node's `loc:@` entries, or its own name.
        let mut first_in_class: HashMap<String, usize> = HashMap::new();
        for i in 0..self.graph.node.len() {
            let node = &self.graph.node[i];
            let mut classes: Vec<String> = attr::string_list(node, "_class")
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.strip_prefix("loc:@").map(str::to_string))
                .collect();
            if classes.is_empty() {
                classes.push(node.name.clone());
            }
            for class in classes {
                match first_in_class.get(&class) {
                    Some(&other) => self.union(other, i, Link::Class)?,
                    None => {
                        first_in_class.insert(class, i);
                    }
                }
            }
        }
        let resource = self.resource_outputs();
        for e in 0..self.edges.edges.len() {
            let edge = self.edges.edges[e];
            if edge
                .src_slot
                .is_some_and(|slot| resource.contains(&(edge.src, slot)))
            {
                self.union(edge.src, edge.dst, Link::Resource)?;
            }
        }
        Ok(())
    }

    /// The outputs `(node, slot)` that hold a resource handle: output 0 of a resource source,
    /// and what forwards one: `Identity`, `IdentityN` (slot by slot), and the control-flow
    /// ops a lowered `If` or `While` passes a handle through (`Switch`, `Merge`, `Enter`,
    /// `Exit`, `NextIteration`), as TensorFlow colocates along every resource edge.
    fn resource_outputs(&self) -> HashSet<(usize, usize)> {
        let mut resource: HashSet<(usize, usize)> = (0..self.graph.node.len())
            .filter(|&i| is_resource_source(&self.graph.node[i]))
            .map(|i| (i, 0))
            .collect();
        // Loops make cycles, which the order leaves at its end: repeat until nothing changes.
        let order = self.edges.topological_order();
        loop {
            let before = resource.len();
            for &i in &order {
                let data: Vec<(usize, usize)> = self.edges.in_edges[i]
                    .iter()
                    .map(|&e| self.edges.edges[e])
                    .filter_map(|e| e.src_slot.map(|slot| (e.src, slot)))
                    .collect();
                let holds = |k: usize| data.get(k).is_some_and(|src| resource.contains(src));
                let forwarded: Vec<usize> = match self.graph.node[i].op.as_str() {
                    "Identity" | "Enter" | "RefEnter" | "Exit" | "RefExit" | "NextIteration"
                    | "RefNextIteration"
                        if holds(0) =>
                    {
                        vec![0]
                    }
                    "Switch" | "RefSwitch" if holds(0) => vec![0, 1],
                    "Merge" | "RefMerge" if (0..data.len()).any(holds) => vec![0],
                    "IdentityN" => (0..data.len()).filter(|&k| holds(k)).collect(),
                    _ => Vec::new(),
                };
                resource.extend(forwarded.into_iter().map(|slot| (i, slot)));
            }
            if resource.len() == before {
                return resource;
            }
        }
    }

    /// Joins the groups of `a` and `b`, merging their requests.
    fn union(&mut self, a: usize, b: usize, link: Link) -> Result<()> {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return Ok(());
        }
        let (ga, gb) = (self.groups[ra].clone(), self.groups[rb].clone());
        let mut spec = ga.spec.clone();
        let merge = if self.options.allow_soft_placement {
            spec.merge_soft(&gb.spec)
        } else {
            spec.merge(&gb.spec)
        };
        let merged = match merge {
            Ok(()) => Group {
                spec,
                source: ga.source.or(gb.source),
                pinned: ga.pinned || gb.pinned,
            },
            // The variable's device wins over what its consumer asked for.
            Err(_) if link == Link::Resource && !gb.pinned => Group {
                spec: ga.spec.clone(),
                source: ga.source,
                pinned: ga.pinned,
            },
            Err(e) => {
                let why = e.message();
                let x = ga.source.unwrap_or(a);
                let y = gb.source.unwrap_or(b);
                let reason = match link {
                    Link::Class => format!(
                        "`{}` is colocated with `{}` by a `_class` `loc:@` entry",
                        self.name(b),
                        self.name(a)
                    ),
                    Link::Resource => format!(
                        "`{}` reads or updates the resource that `{}` produces",
                        self.name(b),
                        self.name(a)
                    ),
                };
                return Err(Status::invalid_argument(format!(
                    "Cannot colocate nodes `{}` and `{}`: `{}` requests device `{}` and `{}` \
                     requests `{}` ({why}); {reason}. Request compatible devices for them{}",
                    self.name(x),
                    self.name(y),
                    self.name(x),
                    self.graph.node[x].device,
                    self.name(y),
                    self.graph.node[y].device,
                    if self.options.allow_soft_placement {
                        ""
                    } else {
                        " or enable allow_soft_placement if only the device type differs"
                    }
                )));
            }
        };
        self.parent[rb] = ra;
        self.groups[ra] = merged;
        Ok(())
    }

    /// The devices (indices, best first) matching `spec` with kernels for every op in `ops`.
    fn matching(&self, spec: &DeviceName, ops: &BTreeSet<&str>) -> Vec<usize> {
        (0..self.devices.len())
            .filter(|&d| {
                let device = &self.devices[d];
                spec.matches(&device.spec)
                    && device
                        .device_type
                        .is_some_and(|ty| ops.iter().all(|op| (self.options.has_kernel)(op, ty)))
            })
            .collect()
    }

    /// The candidate devices of a group, or the "Cannot assign a device" error.
    fn candidates(&self, root: usize, members: &[usize]) -> Result<Vec<usize>> {
        let group = &self.groups[root];
        let ops: BTreeSet<&str> = members
            .iter()
            .map(|&i| self.graph.node[i].op.as_str())
            .collect();
        let found = self.matching(&group.spec, &ops);
        if !found.is_empty() {
            return Ok(found);
        }
        if self.options.allow_soft_placement {
            let relaxed = self.matching(&without_device(&group.spec), &ops);
            if !relaxed.is_empty() {
                return Ok(relaxed);
            }
        }
        Err(self.unplaceable(group, members, &ops))
    }

    fn unplaceable(&self, group: &Group, members: &[usize], ops: &BTreeSet<&str>) -> Status {
        let node = group.source.or(members.first().copied()).unwrap_or(0);
        let available: Vec<String> = self.devices.iter().map(|d| d.name.clone()).collect();
        let requested = if is_unconstrained(&group.spec) {
            "any device".to_string()
        } else {
            format!("`{}`", group.spec)
        };
        let matched: Vec<&Device> = self
            .devices
            .iter()
            .filter(|d| group.spec.matches(&d.spec))
            .collect();
        let why = if matched.is_empty() {
            "no device matches the request".to_string()
        } else {
            let missing: Vec<String> = matched
                .iter()
                .flat_map(|d| {
                    ops.iter()
                        .filter(move |op| {
                            d.device_type
                                .is_none_or(|ty| !(self.options.has_kernel)(op, ty))
                        })
                        .map(move |op| format!("{op} on {}", d.name))
                })
                .collect();
            format!("the matching devices lack kernels: {}", missing.join(", "))
        };
        let others: Vec<&str> = members
            .iter()
            .filter(|&&m| m != node)
            .take(5)
            .map(|&m| self.name(m))
            .collect();
        let colocated = if others.is_empty() {
            String::new()
        } else {
            format!(" (colocated with `{}`)", others.join("`, `"))
        };
        // Soft placement only helps when the task exists and just lacks the type or id.
        let soft_would_help = !self.options.allow_soft_placement
            && !self.matching(&without_device(&group.spec), ops).is_empty();
        Status::invalid_argument(format!(
            "Cannot assign a device for operation `{}`{colocated}: requested {requested}, {why}; \
             available: {}. Request one of the available devices{}",
            self.name(node),
            available.join(", "),
            if soft_would_help {
                " or enable allow_soft_placement"
            } else {
                ""
            }
        ))
    }

    /// The device for a group no heuristic decided: the default device when the group is
    /// unconstrained and the default is a candidate, else the best candidate.
    fn fallback(&self, root: usize, candidates: &[usize]) -> usize {
        if is_unconstrained(&self.groups[root].spec) {
            if let Some(&d) = candidates
                .iter()
                .find(|&&d| self.default_spec.matches(&self.devices[d].spec))
            {
                return d;
            }
        }
        candidates[0]
    }

    /// Chooses a device for every group; returns each node's device index.
    fn assign(&mut self) -> Result<Vec<usize>> {
        let n = self.graph.node.len();
        let roots: Vec<usize> = (0..n).map(|i| self.find(i)).collect();
        // Ordered by root, so the first unplaceable group reported is the same every run.
        let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, &root) in roots.iter().enumerate() {
            members.entry(root).or_default().push(i);
        }
        let mut candidates: HashMap<usize, Vec<usize>> = HashMap::new();
        for (&root, m) in &members {
            candidates.insert(root, self.candidates(root, m)?);
        }

        let mut group_device: HashMap<usize, usize> = HashMap::new();
        let mut assigned: Vec<Option<usize>> = vec![None; n];
        let mut generators = Vec::new();
        for i in self.edges.topological_order() {
            let root = roots[i];
            if let Some(&d) = group_device.get(&root) {
                assigned[i] = Some(d);
                continue;
            }
            let unconstrained_single =
                members[&root].len() == 1 && is_unconstrained(&self.groups[root].spec);
            let data_inputs: Vec<usize> = self.edges.in_edges[i]
                .iter()
                .map(|&e| self.edges.edges[e])
                .filter(|e| e.src_slot.is_some())
                .map(|e| e.src)
                .collect();
            if unconstrained_single && data_inputs.is_empty() && !self.edges.out_edges[i].is_empty()
            {
                generators.push(i);
                continue;
            }
            let cands = &candidates[&root];
            let mut device = None;
            if METADATA_OPS.contains(&self.graph.node[i].op.as_str()) {
                device = data_inputs
                    .first()
                    .and_then(|&src| assigned[src])
                    .filter(|d| cands.contains(d));
            }
            let device = device.unwrap_or_else(|| self.fallback(root, cands));
            group_device.insert(root, device);
            assigned[i] = Some(device);
        }
        for i in generators {
            let root = roots[i];
            let cands = &candidates[&root];
            let mut consumers = self.edges.out_edges[i]
                .iter()
                .map(|&e| assigned[self.edges.edges[e].dst]);
            let first = consumers.next().flatten();
            let shared = first.filter(|d| consumers.all(|c| c == Some(*d)) && cands.contains(d));
            let device = shared.unwrap_or_else(|| self.fallback(root, cands));
            assigned[i] = Some(device);
        }
        // Every node was visited once by the topological order, or deferred and then assigned.
        assigned
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                d.ok_or_else(|| {
                    Status::internal(format!("placement left node `{}` unassigned", self.name(i)))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, op: &str, device: &str, inputs: &[&str]) -> NodeDef {
        NodeDef {
            name: name.into(),
            op: op.into(),
            device: device.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn cpu(name: &str) -> DeviceAttributes {
        DeviceAttributes {
            name: name.into(),
            device_type: "CPU".into(),
            ..Default::default()
        }
    }

    #[test]
    fn identity_forwards_resources_to_its_consumers() {
        let graph = GraphDef {
            node: vec![
                node("v", "VarHandleOp", "/job:ps/task:0", &[]),
                node("v/id", "Identity", "", &["v"]),
                node("read", "ReadVariableOp", "/job:worker/task:0", &["v/id"]),
            ],
            ..Default::default()
        };
        let devices = [
            cpu("/job:ps/replica:0/task:0/device:CPU:0"),
            cpu("/job:worker/replica:0/task:0/device:CPU:0"),
        ];
        let all = |_: &str, _: DeviceType| true;
        let options = PlacementOptions {
            default_device: "/job:worker/replica:0/task:0/device:CPU:0",
            allow_soft_placement: false,
            has_kernel: &all,
        };
        let placed = place(&graph, &devices, &options).unwrap();
        for n in &placed.node {
            assert_eq!(
                n.device, "/job:ps/replica:0/task:0/device:CPU:0",
                "{}",
                n.name
            );
        }
    }

    /// A lowered `While` passes a variable's handle through a constant `Enter` and its body's
    /// argument `Identity`; a lowered `If` through a `Switch`'s true output: the reads and
    /// updates behind them still run where the variable lives, whatever device the lowered
    /// nodes asked for.
    #[test]
    fn control_flow_ops_forward_resources_to_their_consumers() {
        let worker = "/job:worker/task:0";
        let graph = GraphDef {
            node: vec![
                node("v", "VarHandleOp", "/job:ps/task:0", &[]),
                node("pred", "Placeholder", worker, &[]),
                node("loop/enter", "Enter", worker, &["v"]),
                node("loop/body/input", "Identity", worker, &["loop/enter"]),
                node(
                    "loop/body/read",
                    "ReadVariableOp",
                    worker,
                    &["loop/body/input"],
                ),
                node("cond/switch", "Switch", worker, &["v", "pred"]),
                node("cond/then/input", "Identity", worker, &["cond/switch:1"]),
                node(
                    "cond/then/read",
                    "ReadVariableOp",
                    worker,
                    &["cond/then/input"],
                ),
                node("both", "IdentityN", worker, &["pred", "v"]),
                node("both/read", "ReadVariableOp", worker, &["both:1"]),
                node("not_a_handle", "Identity", worker, &["both"]),
            ],
            ..Default::default()
        };
        let devices = [
            cpu("/job:ps/replica:0/task:0/device:CPU:0"),
            cpu("/job:worker/replica:0/task:0/device:CPU:0"),
        ];
        let all = |_: &str, _: DeviceType| true;
        let options = PlacementOptions {
            default_device: "/job:worker/replica:0/task:0/device:CPU:0",
            allow_soft_placement: false,
            has_kernel: &all,
        };
        let placed = place(&graph, &devices, &options).unwrap();
        for n in &placed.node {
            let want = if ["pred", "not_a_handle"].contains(&n.name.as_str()) {
                "/job:worker/replica:0/task:0/device:CPU:0"
            } else {
                "/job:ps/replica:0/task:0/device:CPU:0"
            };
            assert_eq!(n.device, want, "{}", n.name);
        }
    }
}
