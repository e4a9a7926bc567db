//! `SessionGraph`: a master session's graph and what it builds from it, without actix.
//!
//! The graph grows by [`extend`](SessionGraph::extend) (ExtendSession), never changes
//! otherwise, and carries TensorFlow's graph version (0 at creation, +1 per extend). For a run
//! signature (sorted feeds, fetches, targets) [`SessionGraph::plan`] builds the per-task
//! partitions the way TensorFlow's master does (reference §5.1–5.3):
//!
//! ```text
//!   whole graph ──place──► placed graph ──rewrite_for_client──► client graph ──partition by task──► Plan
//!   (validated)   (cached per version;       (client-terminated _Recv/_Send      (one GraphDef per task,
//!                  earlier placements kept)   on the master's CPU:0, pruned)       feed and fetch keys)
//! ```
//!
//! The whole graph is placed once per version, as TensorFlow does, so a stateful node (a
//! `VarHandleOp`) lands on the same device whatever signature runs it; after an extend the old
//! nodes keep the devices they had.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::cluster::TaskId;
use crate::error::{Result, Status};
use crate::exec::control_loops::add_control_loops;
use crate::exec::partition::{by_task, partition, PartitionOptions};
use crate::exec::placement::{place, registered_kernel, PlacementOptions};
use crate::exec::subgraph::{rewrite_for_client, ClientSignature};
use crate::exec::TensorRef;
use crate::graph::attr;
use crate::graph::builder::Graph;
use crate::graph::registry;
use crate::proto::{DeviceAttributes, GraphDef, NodeDef};
use crate::runtime::rendezvous::rendezvous_key_of;
use crate::tensor::DType;

/// A step's signature: what a cached plan is keyed by. Feeds are sorted and every name is
/// canonical (`x:0`), so `["x", "y:0"]` and `["y:0", "x:0"]` share one plan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Fed tensors, sorted.
    pub feeds: Vec<String>,
    /// Fetched tensors, in the client's order.
    pub fetches: Vec<String>,
    /// Target nodes, in the client's order.
    pub targets: Vec<String>,
}

impl Signature {
    /// A signature from the names a client sent; feeds are sorted and names made canonical.
    /// INVALID_ARGUMENT for a malformed name or a tensor fed twice ("Duplicated feeds").
    pub fn new(feeds: &[String], fetches: &[String], targets: &[String]) -> Result<Self> {
        let mut canonical_feeds = feeds
            .iter()
            .map(|f| canonical(f, "feed"))
            .collect::<Result<Vec<_>>>()?;
        canonical_feeds.sort();
        if let Some(w) = canonical_feeds.windows(2).find(|w| w[0] == w[1]) {
            return Err(Status::invalid_argument(format!(
                "Duplicated feeds: `{}` is fed more than once; feed each tensor once",
                w[0]
            )));
        }
        Ok(Self {
            feeds: canonical_feeds,
            fetches: fetches
                .iter()
                .map(|f| canonical(f, "fetch"))
                .collect::<Result<_>>()?,
            targets: targets
                .iter()
                .map(|t| t.strip_prefix('^').unwrap_or(t).to_string())
                .collect(),
        })
    }
}

/// Returns the canonical name of a tensor (`x` → `x:0`), or INVALID_ARGUMENT naming it.
pub fn canonical(name: &str, role: &str) -> Result<String> {
    TensorRef::parse(name)
        .map(|r| r.canonical())
        .map_err(|e| e.context(format!("{role} `{name}`")))
}

/// One task's share of a step: the partition it registers and the client tensors it trades.
#[derive(Clone, Debug)]
pub struct PartitionPlan {
    /// The task that runs this partition.
    pub task: TaskId,
    /// The partition, every node on a device of `task`.
    pub graph: GraphDef,
    /// (canonical feed name, rendezvous key) of each client-terminated `_Recv`.
    pub feeds: Vec<(String, String)>,
    /// (canonical fetch name, rendezvous key) of each client-terminated `_Send`.
    pub fetches: Vec<(String, String)>,
}

/// Everything a signature needs: one partition per task it touches.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The partitions, in task-name order.
    pub partitions: Vec<PartitionPlan>,
}

/// The devices a session places on and the incarnations its pairs carry.
#[derive(Clone, Debug)]
pub struct DeviceSet {
    /// Devices nodes may be placed on (after `device_filters`).
    pub devices: Vec<DeviceAttributes>,
    /// Incarnation of every device found, by full name.
    pub incarnations: HashMap<String, u64>,
    /// The master task's `CPU:0`: the client's end of feeds and fetches.
    pub client_device: String,
    /// Whether a request that cannot be met may be relaxed (`allow_soft_placement`).
    pub allow_soft_placement: bool,
}

/// A master session's graph: validated, versioned, placed once per version.
pub struct SessionGraph {
    graph: Graph,
    names: HashSet<String>,
    version: i64,
    placed: Option<GraphDef>,
    /// Devices given to nodes by earlier placements, kept across extends.
    placements: HashMap<String, String>,
    /// Numbers the `_S<n>` nodes of every partitioning of this session.
    counter: u64,
}

impl SessionGraph {
    /// Validates `graph` (INVALID_ARGUMENT or NOT_FOUND naming the bad node) and starts at
    /// version 0.
    pub fn new(graph: &GraphDef) -> Result<Self> {
        let validated = Graph::from_graph_def(graph)?;
        Ok(Self {
            names: graph.node.iter().map(|n| n.name.clone()).collect(),
            graph: validated,
            version: 0,
            placed: None,
            placements: HashMap::new(),
            counter: 0,
        })
    }

    /// Returns the graph version.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// Adds `nodes` to the graph when `expected` is the current version; returns the new one.
    /// A version mismatch is ABORTED ("Current version is X but caller expected Y"), a name
    /// already in the graph INVALID_ARGUMENT; either way nothing changes.
    pub fn extend(&mut self, nodes: &GraphDef, expected: i64) -> Result<i64> {
        if expected != self.version {
            return Err(Status::aborted(format!(
                "Current version is {} but caller expected {expected}; another client extended \
                 this session's graph: fetch the current graph and retry",
                self.version
            )));
        }
        let mut added = HashSet::with_capacity(nodes.node.len());
        for node in &nodes.node {
            if self.names.contains(&node.name) || !added.insert(node.name.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "Duplicate node name in graph: `{}`; every node name must be unique in the \
                     session's graph",
                    node.name
                )));
            }
        }
        let mut whole = self.graph.to_graph_def();
        whole.node.extend(nodes.node.iter().cloned());
        if whole.library.is_none() {
            whole.library = nodes.library.clone();
        }
        self.graph = Graph::from_graph_def(&whole)?;
        self.names.extend(added.into_iter().map(str::to_string));
        self.version += 1;
        self.placed = None;
        Ok(self.version)
    }

    /// Checks a step's feeds and fetches against the graph before anything runs: NOT_FOUND
    /// naming a fetch, feed or target of a node the graph lacks, INVALID_ARGUMENT for an
    /// output index out of range or a feed whose dtype is not the tensor's.
    pub fn check_step(&self, signature: &Signature, feed_dtypes: &[(&str, i32)]) -> Result<()> {
        for fetch in &signature.fetches {
            self.output_of(fetch, "fetch")?;
        }
        for target in &signature.targets {
            if self.graph.node(target).is_none() {
                return Err(Status::not_found(format!(
                    "target `{target}` is not a node of the session's graph"
                )));
            }
        }
        for &(name, dtype) in feed_dtypes {
            let canonical = canonical(name, "feed")?;
            let output = self.output_of(&canonical, "feed")?;
            if output.dtype.to_proto() as i32 != dtype {
                let given = DType::from_i32(dtype)
                    .map(|d| d.to_string())
                    .unwrap_or_else(|_| format!("dtype {dtype}"));
                return Err(Status::invalid_argument(format!(
                    "feed `{name}`: the tensor is {}, but a {given} was fed; feed a {} tensor",
                    output.dtype, output.dtype
                )));
            }
        }
        Ok(())
    }

    fn output_of(&self, canonical: &str, role: &str) -> Result<crate::graph::builder::Output> {
        let (node, index) = canonical.rsplit_once(':').unwrap_or((canonical, "0"));
        if self.graph.node(node).is_none() {
            return Err(Status::not_found(format!(
                "{role} `{canonical}` names node `{node}`, which is not in the session's graph"
            )));
        }
        let index: usize = index.parse().unwrap_or(usize::MAX);
        self.graph
            .output(node, index)
            .map_err(|e| e.context(format!("{role} `{canonical}`")))
    }

    /// Builds the per-task partitions of `signature` over `devices`.
    pub fn plan(&mut self, signature: &Signature, devices: &DeviceSet) -> Result<Plan> {
        let placed = self.placed(devices)?.clone();
        let client_incarnation = incarnation_of(devices, &devices.client_device)?;
        let client = ClientSignature {
            feeds: &signature.feeds,
            fetches: &signature.fetches,
            targets: &signature.targets,
            client_device: &devices.client_device,
            client_incarnation,
        };
        let rewritten = rewrite_for_client(&placed, &client, &output_dtype)?;
        // While loops whose body spans devices get a control loop on each device.
        let rewritten = add_control_loops(&rewritten, &mut self.counter)?;
        let incarnation = |device: &str| devices.incarnations.get(device).copied();
        let options = PartitionOptions {
            node_to_loc: &by_task,
            incarnation: &incarnation,
            output_dtype: &output_dtype,
        };
        let parts = partition(&rewritten, &options, &mut self.counter)?;
        let mut partitions = Vec::with_capacity(parts.len());
        for (location, graph) in parts {
            let task = crate::cluster::DeviceName::parse(&location)?
                .task_id()
                .ok_or_else(|| {
                    Status::internal(format!("partition location `{location}` names no task"))
                })?;
            let (feeds, fetches) = client_keys(&graph)?;
            partitions.push(PartitionPlan {
                task,
                graph,
                feeds,
                fetches,
            });
        }
        Ok(Plan { partitions })
    }

    /// The whole graph placed on `devices`, placed on first use after each extend.
    fn placed(&mut self, devices: &DeviceSet) -> Result<&GraphDef> {
        if self.placed.is_none() {
            // Functional control flow (If, While, function calls) is lowered to v1 control flow
            // before placement, as TensorFlow's masters lower it, so a loop body can span tasks.
            let mut graph = crate::graph::lower::lower_functional_ops(&self.graph.to_graph_def())?;
            for node in &mut graph.node {
                if let Some(device) = self.placements.get(&node.name) {
                    node.device = device.clone();
                }
            }
            let has_kernel = registered_kernel;
            let options = PlacementOptions {
                default_device: &devices.client_device,
                allow_soft_placement: devices.allow_soft_placement,
                has_kernel: &has_kernel,
            };
            let placed = place(&graph, &devices.devices, &options)?;
            for node in &placed.node {
                self.placements
                    .insert(node.name.clone(), node.device.clone());
            }
            self.placed = Some(placed);
        }
        // Just filled when it was empty.
        self.placed
            .as_ref()
            .ok_or_else(|| Status::internal("placed graph missing"))
    }
}

fn incarnation_of(devices: &DeviceSet, device: &str) -> Result<u64> {
    devices.incarnations.get(device).copied().ok_or_else(|| {
        Status::failed_precondition(format!(
            "the master's own device `{device}` did not answer GetStatus; the session cannot \
             feed or fetch without it"
        ))
    })
}

/// The dtype of output `index` of `node`, from the op registry.
pub fn output_dtype(node: &NodeDef, index: usize) -> Result<DType> {
    let types = registry::lookup(node)?.output_types(node)?;
    types.get(index).copied().ok_or_else(|| {
        Status::invalid_argument(format!(
            "node `{}` has {} outputs; output {index} does not exist",
            node.name,
            types.len()
        ))
    })
}

type Keys = Vec<(String, String)>;

/// The (tensor name, rendezvous key) of the client-terminated `_Recv`s (feeds) and `_Send`s
/// (fetches) of a partition.
fn client_keys(graph: &GraphDef) -> Result<(Keys, Keys)> {
    let mut feeds = Vec::new();
    let mut fetches = Vec::new();
    for node in &graph.node {
        let is_pair = node.op == "_Recv" || node.op == "_Send";
        if !is_pair || !attr::bool_or(node, "client_terminated", false)? {
            continue;
        }
        let name = attr::string_or(node, "tensor_name", "")?;
        let key = rendezvous_key_of(node)?.as_str().to_string();
        if node.op == "_Recv" {
            feeds.push((name, key));
        } else {
            fetches.push((name, key));
        }
    }
    Ok((feeds, fetches))
}

/// Tasks of a plan, by name, for lookups.
pub fn tasks_of(plan: &Plan) -> BTreeMap<TaskId, usize> {
    plan.partitions
        .iter()
        .enumerate()
        .map(|(i, p)| (p.task.clone(), i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use crate::tensor::{PartialShape, Tensor};

    fn device(name: &str, incarnation: u64) -> DeviceAttributes {
        DeviceAttributes {
            name: name.into(),
            device_type: "CPU".into(),
            incarnation,
            ..Default::default()
        }
    }

    const PS: &str = "/job:ps/replica:0/task:0/device:CPU:0";
    const W0: &str = "/job:worker/replica:0/task:0/device:CPU:0";

    fn devices() -> DeviceSet {
        DeviceSet {
            devices: vec![device(PS, 0x11), device(W0, 0x22)],
            incarnations: [(PS.to_string(), 0x11), (W0.to_string(), 0x22)].into(),
            client_device: W0.into(),
            allow_soft_placement: false,
        }
    }

    /// `a` on the ps, `x` fed, `y = a + x` left to the default device (the client's task).
    fn graph() -> GraphDef {
        let mut g = Graph::new();
        let a = g
            .with_device("/job:ps/task:0", |g| {
                g.constant(&Tensor::from_vec(vec![2], vec![1.0f32, 2.0])?)
            })
            .unwrap();
        let x = g
            .placeholder("x", DType::Float, PartialShape::unknown())
            .unwrap();
        let y = g.add(&a, &x).unwrap();
        let mut def = g.to_graph_def();
        def.node.iter_mut().for_each(|n| {
            if n.name == y.node {
                n.name = "y".into()
            }
        });
        def
    }

    #[test]
    fn signatures_are_canonical_and_refuse_duplicated_feeds() {
        let s = Signature::new(&["y".into(), "x:0".into()], &["z".into()], &["^t".into()]).unwrap();
        assert_eq!(s.feeds, ["x:0", "y:0"]);
        assert_eq!(s.fetches, ["z:0"]);
        assert_eq!(s.targets, ["t"]);
        let err = Signature::new(&["x".into(), "x:0".into()], &[], &[]).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().starts_with("Duplicated feeds: `x:0`"),
            "{err}"
        );
    }

    #[test]
    fn a_plan_has_one_partition_per_task_and_the_client_keys_on_the_own_one() {
        let mut graph = SessionGraph::new(&graph()).unwrap();
        let signature = Signature::new(&["x:0".into()], &["y:0".into()], &[]).unwrap();
        let plan = graph.plan(&signature, &devices()).unwrap();
        let tasks: Vec<_> = plan
            .partitions
            .iter()
            .map(|p| p.task.device_prefix())
            .collect();
        assert_eq!(
            tasks,
            ["/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"]
        );
        let (ps, own) = (&plan.partitions[0], &plan.partitions[1]);
        assert!(ps.feeds.is_empty() && ps.fetches.is_empty());
        // Client keys: <client>;<its incarnation, 16 hex>;<client>;<tensor>;0:0.
        assert_eq!(
            own.feeds,
            [(
                "x:0".to_string(),
                format!("{W0};0000000000000022;{W0};x:0;0:0")
            )]
        );
        assert_eq!(
            own.fetches,
            [(
                "y:0".to_string(),
                format!("{W0};0000000000000022;{W0};y:0;0:0")
            )]
        );
        // The fed placeholder is pruned away.
        assert!(own.graph.node.iter().all(|n| n.name != "x"));
    }

    #[test]
    fn extend_keeps_earlier_placements_and_checks_the_version() {
        let mut graph = SessionGraph::new(&graph()).unwrap();
        let signature = Signature::new(&["x:0".into()], &["y:0".into()], &[]).unwrap();
        graph.plan(&signature, &devices()).unwrap();
        let err = graph.extend(&GraphDef::default(), 4).unwrap_err();
        assert_eq!(err.code(), Code::Aborted);
        assert!(
            err.message()
                .starts_with("Current version is 0 but caller expected 4"),
            "{err}"
        );
        let mut more = Graph::new();
        more.scalar("z", DType::Float, 1.0).unwrap();
        assert_eq!(graph.extend(&more.to_graph_def(), 0).unwrap(), 1);
        // `y` stays on the client's task even though the default device could now differ.
        let mut moved = devices();
        moved.client_device = PS.into();
        let plan = graph.plan(&signature, &moved).unwrap();
        let y_task = plan
            .partitions
            .iter()
            .find(|p| p.graph.node.iter().any(|n| n.name == "y"))
            .unwrap();
        assert_eq!(y_task.task.device_prefix(), "/job:worker/replica:0/task:0");
    }

    #[test]
    fn steps_are_checked_against_the_graph() {
        let graph = SessionGraph::new(&graph()).unwrap();
        let missing = Signature::new(&[], &["ghost:0".into()], &[]).unwrap();
        let err = graph.check_step(&missing, &[]).unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert!(err.message().contains("`ghost`"), "{err}");
        let out_of_range = Signature::new(&[], &["y:3".into()], &[]).unwrap();
        assert_eq!(
            graph.check_step(&out_of_range, &[]).unwrap_err().code(),
            Code::InvalidArgument
        );
        let fed = Signature::new(&["x:0".into()], &[], &[]).unwrap();
        let err = graph
            .check_step(&fed, &[("x:0", DType::Int64.to_proto() as i32)])
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().starts_with("feed `x:0`: the tensor is"),
            "{err}"
        );
        graph
            .check_step(&fed, &[("x:0", DType::Float.to_proto() as i32)])
            .unwrap();
    }
}
