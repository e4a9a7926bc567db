//! One run signature of an in-process session over several local devices (`CPU:0`, `CPU:1`,
//! ...): the in-process counterpart of what a master and one worker do together.
//!
//! ```text
//!   placed graph ──rewrite_for_client──► client graph ──partition by device──► one Executor
//!                                                                             per device
//! ```
//!
//! Feeds and fetches become client-terminated `_Recv`/`_Send` nodes on the session's first
//! device ([`rewrite_for_client`]); edges between devices become `_Send`/`_Recv` pairs
//! ([`partition`]). A step puts the feeds in a fresh [`Rendezvous`], runs every device's
//! executor on the executor pool, and takes the fetches out of the rendezvous. The first failing
//! device aborts the rendezvous, so the others' pending receives fail at once with the root
//! cause instead of waiting for their deadline.

use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::error::{Result, Status};
use crate::exec::executor::{Executor, TensorRef};
use crate::exec::partition::{self, PartitionOptions};
use crate::exec::subgraph::{rewrite_for_client, ClientSignature};
use crate::graph::attr;
use crate::graph::registry;
use crate::kernels::KernelLookup;
use crate::proto::{GraphDef, NodeDef};
use crate::runtime::pool::ThreadPool;
use crate::runtime::rendezvous::rendezvous_key_of;
use crate::runtime::rendezvous::{ParsedKey, Rendezvous};
use crate::runtime::Device;
use crate::runtime::StepOptions;
use crate::tensor::{DType, Tensor};

/// How long a step without a deadline waits for its executors: a little longer than a `_Recv`
/// waits when its step has none (300 s), so that a lost send fails the step with the
/// receiver's own error instead of hanging it.
const NO_DEADLINE_WAIT: Duration = Duration::from_secs(310);

/// The executors of one signature over several devices, and where its feeds and fetches meet
/// them.
pub struct MultiDeviceStep {
    executors: Vec<Arc<Executor>>,
    /// Rendezvous keys of the feeds, in the signature's feed order.
    feeds: Vec<ParsedKey>,
    /// Rendezvous keys of the fetches, in the signature's fetch order.
    fetches: Vec<ParsedKey>,
}

/// The devices of a multi-device session and how to reach them.
pub struct LocalDevices<'a> {
    /// Every device; the first talks to the client (feeds and fetches cross it).
    pub devices: &'a [Arc<Device>],
    /// Each device's incarnation, by full name.
    pub incarnations: &'a HashMap<String, u64>,
    /// The session's name (see `Executor::in_session`).
    pub session: &'a str,
}

impl MultiDeviceStep {
    /// Builds the step for `feeds`, `fetches` (canonical `node:i`) and `targets` over `placed`
    /// (a graph whose every node has one of `local.devices`' full names).
    /// `counter` numbers the new `_Send`/`_Recv` nodes; the session keeps it so names never
    /// repeat.
    pub fn build(
        placed: &GraphDef,
        feeds: &[String],
        fetches: &[String],
        targets: &[String],
        local: &LocalDevices<'_>,
        kernels: &KernelLookup,
        counter: &mut u64,
    ) -> Result<Self> {
        let client = local
            .devices
            .first()
            .ok_or_else(|| Status::internal("a multi-device session without devices"))?;
        let incarnation = |device: &str| {
            let canonical = crate::cluster::DeviceName::parse(device).ok()?.to_string();
            local.incarnations.get(&canonical).copied()
        };
        // Client endpoints are named by canonical tensor name (`x:0`), one per tensor however
        // often it is fetched.
        let canonical = |names: &[String], role: &str| {
            names
                .iter()
                .map(|n| {
                    Ok(TensorRef::parse(n)
                        .map_err(|e| e.context(role))?
                        .canonical())
                })
                .collect::<Result<Vec<String>>>()
        };
        let feeds = canonical(feeds, "feed")?;
        let fetches = canonical(fetches, "fetch")?;
        let mut unique_fetches = fetches.clone();
        unique_fetches.sort();
        unique_fetches.dedup();
        let signature = ClientSignature {
            feeds: &feeds,
            fetches: &unique_fetches,
            targets,
            client_device: client.name(),
            client_incarnation: incarnation(client.name()).unwrap_or(1),
        };
        let rewritten = rewrite_for_client(placed, &signature, &output_dtype)?;
        let options = PartitionOptions {
            node_to_loc: &partition::by_device,
            incarnation: &incarnation,
            output_dtype: &output_dtype,
        };
        let parts = partition::partition(&rewritten, &options, counter)?;

        let by_name: HashMap<&str, &Arc<Device>> =
            local.devices.iter().map(|d| (d.name(), d)).collect();
        let mut executors = Vec::with_capacity(parts.len());
        let mut feed_keys = HashMap::new();
        let mut fetch_keys = HashMap::new();
        for (loc, part) in &parts {
            let device = by_name.get(loc.as_str()).ok_or_else(|| {
                Status::internal(format!(
                    "partitioning produced a piece for `{loc}`, which is not a device of this \
                     session"
                ))
            })?;
            collect_client_keys(part, &mut feed_keys, &mut fetch_keys)?;
            let targets: Vec<&str> = part.node.iter().map(|n| n.name.as_str()).collect();
            let executor = Executor::new(part, &[], &[], &targets, Arc::clone(device), kernels)
                .map_err(|e| e.context(format!("on {loc}")))?
                .in_session(local.session);
            executors.push(Arc::new(executor));
        }
        let keys = |names: &[String], table: &HashMap<String, ParsedKey>, role: &str| {
            names
                .iter()
                .map(|name| {
                    table.get(name).cloned().ok_or_else(|| {
                        Status::internal(format!("{role} `{name}` has no client endpoint"))
                    })
                })
                .collect::<Result<Vec<_>>>()
        };
        Ok(Self {
            feeds: keys(&feeds, &feed_keys, "feed")?,
            fetches: keys(&fetches, &fetch_keys, "fetch")?,
            executors,
        })
    }

    /// Returns the per-device executors, in device-name order.
    pub fn executors(&self) -> &[Arc<Executor>] {
        &self.executors
    }

    /// Runs one step: `feeds` in the signature's feed order; returns the fetches in its fetch
    /// order. `options.rendezvous` is replaced by the step's own.
    pub fn run(&self, feeds: Vec<Tensor>, options: &StepOptions) -> Result<Vec<Tensor>> {
        if feeds.len() != self.feeds.len() {
            return Err(Status::invalid_argument(format!(
                "{} feed tensors given; this step takes {}",
                feeds.len(),
                self.feeds.len()
            )));
        }
        let rendezvous = Arc::new(Rendezvous::new(options.step_id));
        for (key, tensor) in self.feeds.iter().zip(feeds) {
            rendezvous.send(key, tensor, false)?;
        }
        let options = StepOptions {
            rendezvous: Some(Arc::clone(&rendezvous)),
            ..options.clone()
        };
        let (done, finished) = mpsc::channel();
        for executor in &self.executors {
            let executor = Arc::clone(executor);
            let options = options.clone();
            let done = done.clone();
            ThreadPool::global().spawn(move || {
                let _ = done.send(executor.run(Vec::new(), &options).map(|_| ()));
            });
        }
        drop(done);
        let deadline = options
            .deadline
            .unwrap_or_else(|| Instant::now() + NO_DEADLINE_WAIT);
        let mut first: Option<Status> = None;
        for _ in 0..self.executors.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let (result, give_up) = match finished.recv_timeout(left) {
                Ok(result) => (result, false),
                Err(mpsc::RecvTimeoutError::Timeout) => (
                    Err(Status::deadline_exceeded(format!(
                        "step {} did not finish on every device before its deadline",
                        options.step_id
                    ))),
                    true,
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => (
                    Err(Status::internal(format!(
                        "step {}: an executor thread ended without reporting",
                        options.step_id
                    ))),
                    true,
                ),
            };
            if let Err(status) = result {
                if first.is_none() {
                    rendezvous.abort(status.clone());
                    first = Some(status);
                }
            }
            if give_up {
                break;
            }
        }
        if let Some(status) = first {
            return Err(status);
        }
        // Every executor finished, so every fetch was sent: the receives do not wait.
        // A tensor fetched twice was sent once.
        let soon = Instant::now() + Duration::from_secs(1);
        let mut received: HashMap<&str, Tensor> = HashMap::with_capacity(self.fetches.len());
        for key in &self.fetches {
            if !received.contains_key(key.as_str()) {
                let (tensor, _) = rendezvous.recv_blocking(key, soon)?;
                received.insert(key.as_str(), tensor);
            }
        }
        Ok(self
            .fetches
            .iter()
            .map(|key| received[key.as_str()].clone())
            .collect())
    }
}

/// Adds the client-terminated `_Recv`s (feeds) and `_Send`s (fetches) of `part`, by tensor
/// name, to the tables.
fn collect_client_keys(
    part: &GraphDef,
    feeds: &mut HashMap<String, ParsedKey>,
    fetches: &mut HashMap<String, ParsedKey>,
) -> Result<()> {
    for node in &part.node {
        let is_pair = node.op == "_Recv" || node.op == "_Send";
        if !is_pair || !attr::bool_or(node, "client_terminated", false)? {
            continue;
        }
        let name = attr::string_or(node, "tensor_name", "")?;
        let key = rendezvous_key_of(node)?;
        if node.op == "_Recv" {
            feeds.insert(name, key);
        } else {
            fetches.insert(name, key);
        }
    }
    Ok(())
}

/// The dtype of output `slot` of `node`, from the op registry.
fn output_dtype(node: &NodeDef, slot: usize) -> Result<DType> {
    let types = registry::lookup(node)?.output_types(node)?;
    types.get(slot).copied().ok_or_else(|| {
        Status::invalid_argument(format!(
            "node `{}` (op {}) has {} outputs; output {slot} does not exist",
            node.name,
            node.op,
            types.len()
        ))
    })
}
