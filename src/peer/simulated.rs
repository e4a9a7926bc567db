//! `SimulatedPeer`: a task in a test, with no network and a script instead of a worker.
//!
//! Masters and workers are tested against peers that behave like a cluster's tasks, good or
//! bad (STYLE.md, test levels 2 and 3):
//! - **scripted replies** per RPC: a queue of replies taken in order, then a closure that
//!   answers the rest, then a default (GetStatus lists the task's devices, RegisterGraph
//!   answers a fresh handle, everything else an empty response);
//! - **recorded requests** per RPC, and the order of all calls, for assertions;
//! - **delays** per call or for every call, and **drops** (the call never answers, so the
//!   caller's deadline must fire), all on tokio's clock so tests pause it;
//! - **unreachable**: calls fail at once with the UNAVAILABLE a [`GrpcPeer`](super::GrpcPeer)
//!   gives for a dead task;
//! - **restart**: the task comes back with a new random incarnation. GetStatus reports it, and
//!   RecvTensor for a key made with the old one answers ABORTED with TensorFlow's message
//!   ("RecvTensor expects a different device incarnation ..."), checked before any script.
//!
//! All devices of a simulated task share the task's incarnation (TensorFlow draws one per
//! device; one per task is enough to tell a restarted task apart).
//!
//! [`SimulatedCluster`] builds one simulated peer per task of a [`ClusterSpec`].

use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{deadline_exceeded, unreachable, CallOptions, Connector, Peer, PeerCache, PeerFuture};
use crate::cluster::{ClusterSpec, TaskId};
use crate::error::{Result, Status};
#[allow(clippy::wildcard_imports)] // The table names every request and response.
use crate::proto::*;
use crate::runtime::rendezvous::{check_incarnation, ParsedKey};
use crate::worker::service::worker_rpcs;
use crate::worker::Rpc;

/// A WorkerService request a [`SimulatedPeer`] can be scripted for, tied to its RPC and
/// response type (so `peer.reply::<RunGraphRequest>(Ok(RunGraphResponse { .. }))` type-checks).
pub trait SimulatedRpc: Clone + Send + 'static {
    /// The RPC this request belongs to.
    const RPC: Rpc;
    /// The RPC's response.
    type Response: Default + Send + 'static;
}

/// [`SimulatedRpc`] for every request of the service's table.
macro_rules! simulated_rpcs {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        impl SimulatedRpc for $req {
            const RPC: Rpc = Rpc::$rpc;
            type Response = $resp;
        }
    )*};
}

worker_rpcs!(simulated_rpcs);

/// What a scripted call does.
enum Step<T> {
    /// Answers after a delay (zero for at once).
    Reply(Duration, Result<T>),
    /// Never answers.
    Drop,
}

type Answer<R> = Box<dyn FnMut(&R) -> Result<<R as SimulatedRpc>::Response> + Send>;

/// One RPC's script and record.
struct Slot<R: SimulatedRpc> {
    steps: VecDeque<Step<R::Response>>,
    answer: Option<Answer<R>>,
    received: Vec<R>,
}

impl<R: SimulatedRpc> Default for Slot<R> {
    fn default() -> Self {
        Self {
            steps: VecDeque::new(),
            answer: None,
            received: Vec::new(),
        }
    }
}

struct State {
    incarnation: u64,
    /// Local device names ("CPU:0") and types ("CPU").
    devices: Vec<(String, String)>,
    /// `Slot<R>` per RPC, keyed by `R::RPC`.
    slots: HashMap<Rpc, Box<dyn Any + Send>>,
    calls: Vec<Rpc>,
    delay: Duration,
    dropping: bool,
    unreachable: bool,
    graphs_registered: u64,
}

impl State {
    fn slot<R: SimulatedRpc>(&mut self) -> &mut Slot<R> {
        self.slots
            .entry(R::RPC)
            .or_insert_with(|| Box::new(Slot::<R>::default()))
            .downcast_mut::<Slot<R>>()
            // Slots are only ever inserted under their own request type's RPC.
            .expect("slot type matches its RPC")
    }

    /// Full device names with the current incarnation.
    fn device_attributes(&self, task: &TaskId) -> Vec<DeviceAttributes> {
        self.devices
            .iter()
            .map(|(local, device_type)| DeviceAttributes {
                name: format!("{}/device:{local}", task.device_prefix()),
                device_type: device_type.clone(),
                memory_limit: 256 << 20,
                incarnation: self.incarnation,
                ..Default::default()
            })
            .collect()
    }
}

/// A simulated task's WorkerService. See the module docs.
pub struct SimulatedPeer {
    task: TaskId,
    address: String,
    state: Mutex<State>,
}

impl SimulatedPeer {
    /// A task with one device, `CPU:0`, at a made-up address.
    pub fn new(task: TaskId, address: impl Into<String>) -> Self {
        Self {
            task,
            address: address.into(),
            state: Mutex::new(State {
                incarnation: new_incarnation(0),
                devices: vec![("CPU:0".into(), "CPU".into())],
                slots: HashMap::new(),
                calls: Vec::new(),
                delay: Duration::ZERO,
                dropping: false,
                unreachable: false,
                graphs_registered: 0,
            }),
        }
    }

    /// The same task with these local devices instead (`"CPU:0"`, `"GPU:1"`); a name without a
    /// `TYPE:id` form is taken as its own type.
    pub fn with_devices(self, devices: &[&str]) -> Self {
        {
            let mut state = self.lock();
            state.devices = devices
                .iter()
                .map(|d| {
                    let device_type = d.split_once(':').map_or(*d, |(t, _)| t);
                    (d.to_string(), device_type.to_string())
                })
                .collect();
        }
        self
    }

    /// Returns the address the task pretends to live at.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Returns the task's current incarnation.
    pub fn incarnation(&self) -> u64 {
        self.lock().incarnation
    }

    /// Restarts the task: it gets a new random incarnation, different from the old one, and
    /// returns it. Scripts and records are kept.
    pub fn restart(&self) -> u64 {
        let mut state = self.lock();
        state.incarnation = new_incarnation(state.incarnation);
        state.incarnation
    }

    /// Queues `reply` for the next unscripted call of `R`'s RPC.
    pub fn reply<R: SimulatedRpc>(&self, reply: Result<R::Response>) {
        self.push::<R>(Step::Reply(Duration::ZERO, reply));
    }

    /// Queues `reply`, given after `delay`, for the next unscripted call of `R`'s RPC.
    pub fn reply_after<R: SimulatedRpc>(&self, delay: Duration, reply: Result<R::Response>) {
        self.push::<R>(Step::Reply(delay, reply));
    }

    /// Queues a call of `R`'s RPC that never answers.
    pub fn drop_next<R: SimulatedRpc>(&self) {
        self.push::<R>(Step::Drop);
    }

    /// Answers the calls of `R`'s RPC that the queue does not cover with `answer`.
    pub fn answer_with<R: SimulatedRpc>(
        &self,
        answer: impl FnMut(&R) -> Result<R::Response> + Send + 'static,
    ) {
        self.lock().slot::<R>().answer = Some(Box::new(answer));
    }

    /// Returns the requests of `R`'s RPC sent to the task so far, in order, dropped and
    /// unreachable ones included.
    pub fn requests<R: SimulatedRpc>(&self) -> Vec<R> {
        self.lock().slot::<R>().received.clone()
    }

    /// Returns every call received so far, in order.
    pub fn calls(&self) -> Vec<Rpc> {
        self.lock().calls.clone()
    }

    /// Delays every call by `delay` (on top of a scripted reply's own delay).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Makes every call, from now on, never answer (a partitioned or hung task) or answer again.
    /// Dropped calls are recorded but leave the script alone.
    pub fn set_dropping(&self, dropping: bool) {
        self.lock().dropping = dropping;
    }

    /// Makes every call fail at once with UNAVAILABLE, as for a dead task, or succeed again.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.lock().unreachable = unreachable;
    }

    fn push<R: SimulatedRpc>(&self, step: Step<R::Response>) {
        self.lock().slot::<R>().steps.push_back(step);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Only a panicking test holds the lock when it poisons; the state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `request`, decides the reply and delivers it under the call's deadline.
    ///
    /// `check` runs before the script (the RecvTensor incarnation check), `default` answers when
    /// nothing is scripted.
    fn serve<R: SimulatedRpc>(
        &self,
        request: R,
        options: CallOptions,
        check: impl FnOnce(&State, &R) -> Result<()>,
        default: impl FnOnce(&mut State, &R) -> Result<R::Response>,
    ) -> PeerFuture<'_, R::Response> {
        let (delay, reply) = {
            let mut state = self.lock();
            state.calls.push(R::RPC);
            state.slot::<R>().received.push(request.clone());
            if state.unreachable {
                let cause = "connection refused (simulated)";
                return Box::pin(std::future::ready(Err(unreachable(
                    &self.task,
                    &self.address,
                    cause,
                ))));
            }
            let delay = state.delay;
            // A dropped call never reaches the task: it leaves the script for the next one.
            let checked = if state.dropping {
                None
            } else {
                Some(check(&state, &request))
            };
            let step = match checked {
                None => Step::Drop,
                Some(Err(e)) => Step::Reply(Duration::ZERO, Err(e)),
                Some(Ok(())) => match state.slot::<R>().steps.pop_front() {
                    Some(step) => step,
                    None => {
                        let slot = state.slot::<R>();
                        let reply = match slot.answer.as_mut() {
                            Some(answer) => answer(&request),
                            None => default(&mut state, &request),
                        };
                        Step::Reply(Duration::ZERO, reply)
                    }
                },
            };
            match step {
                Step::Drop => (delay, None),
                Step::Reply(extra, reply) => (delay + extra, Some(reply)),
            }
        };
        let place = format!("at {}", self.address);
        Box::pin(async move {
            let answer = async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                match reply {
                    Some(reply) => reply,
                    None => std::future::pending().await,
                }
            };
            tokio::time::timeout_at(options.deadline_at(), answer)
                .await
                .unwrap_or_else(|_| {
                    Err(deadline_exceeded(
                        &self.task,
                        &place,
                        R::RPC,
                        options.budget(),
                    ))
                })
        })
    }
}

/// A random non-zero incarnation other than `old`.
fn new_incarnation(old: u64) -> u64 {
    loop {
        let incarnation: u64 = rand::random();
        if incarnation != 0 && incarnation != old {
            return incarnation;
        }
    }
}

fn no_check<R>(_: &State, _: &R) -> Result<()> {
    Ok(())
}

fn empty<R: SimulatedRpc>(_: &mut State, _: &R) -> Result<R::Response> {
    Ok(R::Response::default())
}

impl std::fmt::Debug for SimulatedPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedPeer")
            .field("task", &self.task)
            .field("address", &self.address)
            .finish()
    }
}

/// Implements [`Peer`]: each call is served from its script, or else by [`simulated_call!`]'s
/// default for it.
macro_rules! simulated {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        fn $method(&self, request: $req, options: CallOptions) -> PeerFuture<'_, $resp> {
            simulated_call!($method, self, request, options)
        }
    )*};
}

/// The unscripted answers: GetStatus lists the task's devices, RegisterGraph answers a fresh
/// handle, RecvTensor checks the key's incarnation first; every other call answers an empty
/// response.
macro_rules! simulated_call {
    (get_status, $peer:ident, $request:ident, $options:ident) => {
        $peer.serve($request, $options, no_check, |state, _| {
            Ok(GetStatusResponse {
                device_attributes: state.device_attributes(&$peer.task),
            })
        })
    };
    (register_graph, $peer:ident, $request:ident, $options:ident) => {
        $peer.serve($request, $options, no_check, |state, _| {
            state.graphs_registered += 1;
            Ok(RegisterGraphResponse {
                graph_handle: format!("graph-{}", state.graphs_registered),
            })
        })
    };
    (recv_tensor, $peer:ident, $request:ident, $options:ident) => {{
        let check = |state: &State, request: &RecvTensorRequest| {
            let key = ParsedKey::parse(&request.rendezvous_key)?;
            let devices = state.device_attributes(&$peer.task);
            check_incarnation(
                &key,
                devices.iter().map(|d| (d.name.as_str(), d.incarnation)),
            )
        };
        $peer.serve($request, $options, check, empty)
    }};
    ($method:ident, $peer:ident, $request:ident, $options:ident) => {
        $peer.serve($request, $options, no_check, empty)
    };
}

impl Peer for SimulatedPeer {
    fn task(&self) -> &TaskId {
        &self.task
    }

    worker_rpcs!(simulated);
}

/// One [`SimulatedPeer`] per task of a cluster, addressed as in its spec.
pub struct SimulatedCluster {
    spec: ClusterSpec,
    peers: BTreeMap<TaskId, Arc<SimulatedPeer>>,
}

impl SimulatedCluster {
    /// Simulated peers for every task of `spec`, each with one `CPU:0`.
    pub fn new(spec: &ClusterSpec) -> Self {
        let peers = spec
            .all_tasks()
            .map(|(task, address)| {
                let peer = Arc::new(SimulatedPeer::new(task.clone(), address));
                (task, peer)
            })
            .collect();
        Self {
            spec: spec.clone(),
            peers,
        }
    }

    /// Returns the simulated peer of `task`, to script or inspect it.
    pub fn peer(&self, task: &TaskId) -> Result<Arc<SimulatedPeer>> {
        self.peers.get(task).cloned().ok_or_else(|| {
            Status::invalid_argument(format!(
                "task {} is not in the simulated cluster",
                task.device_prefix()
            ))
        })
    }

    /// Returns every simulated peer, by task.
    pub fn peers(&self) -> impl Iterator<Item = (&TaskId, &Arc<SimulatedPeer>)> {
        self.peers.iter()
    }

    /// A [`PeerCache`] for `own` whose every task, `own` included, is this cluster's simulated
    /// peer: what a master under test would get from its daemon.
    pub fn peer_cache(&self, own: &TaskId) -> Result<PeerCache> {
        let local: Arc<dyn Peer> = self.peer(own)?;
        let peers = self.peers.clone();
        let connector: Connector = Arc::new(move |task: &TaskId, _address: &str| {
            peers
                .get(task)
                .cloned()
                .map(|p| p as Arc<dyn Peer>)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "task {} is not in the simulated cluster",
                        task.device_prefix()
                    ))
                })
        });
        PeerCache::with_connector(self.spec.clone(), local, connector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[tokio::test(start_paused = true)]
    async fn with_devices_lists_full_names_and_types() {
        let peer = SimulatedPeer::new(TaskId::new("worker", 1), "w1:2222")
            .with_devices(&["CPU:0", "GPU:0", "GPU:1"]);
        let status = peer
            .get_status(
                GetStatusRequest {},
                CallOptions::timeout(Duration::from_secs(1)),
            )
            .await
            .unwrap();
        let devices: Vec<_> = status
            .device_attributes
            .iter()
            .map(|d| (d.name.as_str(), d.device_type.as_str()))
            .collect();
        assert_eq!(
            devices,
            [
                ("/job:worker/replica:0/task:1/device:CPU:0", "CPU"),
                ("/job:worker/replica:0/task:1/device:GPU:0", "GPU"),
                ("/job:worker/replica:0/task:1/device:GPU:1", "GPU"),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unreachable_fails_at_once_like_a_dead_task() {
        let peer = SimulatedPeer::new(TaskId::new("ps", 0), "ps0:2222");
        peer.set_unreachable(true);
        let err = peer
            .cleanup_graph(
                CleanupGraphRequest { step_id: 1 },
                CallOptions::timeout(Duration::from_secs(1)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert!(err
            .message()
            .starts_with("/job:ps/replica:0/task:0 at ps0:2222 unreachable:"));
        peer.set_unreachable(false);
        peer.cleanup_graph(
            CleanupGraphRequest { step_id: 2 },
            CallOptions::timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap();
        let steps: Vec<_> = peer
            .requests::<CleanupGraphRequest>()
            .iter()
            .map(|r| r.step_id)
            .collect();
        assert_eq!(steps, [1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn register_graph_answers_fresh_handles() {
        let peer = SimulatedPeer::new(TaskId::new("ps", 0), "ps0:2222");
        let options = CallOptions::timeout(Duration::from_secs(1));
        let a = peer
            .register_graph(RegisterGraphRequest::default(), options)
            .await
            .unwrap();
        let b = peer
            .register_graph(RegisterGraphRequest::default(), options)
            .await
            .unwrap();
        assert_ne!(a.graph_handle, b.graph_handle);
    }
}
