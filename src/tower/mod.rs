//! `Tower`: the actor that owns one local device (`CPU:i` or `GPU:i`) and runs its part of
//! every step.
//!
//! A tower owns its device's execution ([`TowerState`]): the pool of threads its executors run
//! nodes on, named after the device (`tessera-CPU:0-N`). The worker splits a registered graph
//! per device and hands each device's part of a step to its tower through a [`TowerHandle`]:
//! the tower starts it (the nodes that proved cheap on the calling thread, every other node
//! on the device's pool) and answers with the running step, which the worker awaits. Starting
//! a step is a call into the tower's state, not a message through its mailbox: the hop to the
//! tower's own thread and back cost two thread wake-ups per device per step, 13 % of a trivial
//! RunStep in the `run_step` bench. The tower never waits for a step, so concurrent steps run
//! concurrently, and a kernel that blocks (`_Recv`, a queue's dequeue, an accumulator's take)
//! holds one of the device's pool threads, never the tower or another step.
//!
//! The actor runs on its own `actix::Arbiter` thread and answers [`DescribeDevice`].

mod state;

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, MessageResult, Recipient};

use crate::device::space::MemorySpace;
use crate::error::Result;
use crate::exec::executor::RunningStep;
use crate::exec::Executor;
use crate::proto::DeviceAttributes;
use crate::runtime::intra::IntraPool;
use crate::runtime::pool::ThreadPool;
use crate::runtime::StepOptions;

pub use state::TowerState;

/// Asks a tower for its device's attributes.
#[derive(Debug, Message)]
#[rtype(result = "DeviceAttributes")]
pub struct DescribeDevice;

/// What the worker holds of a device's tower: the tower's state, shared with its actor.
#[derive(Clone)]
pub struct TowerHandle {
    state: Arc<TowerState>,
}

impl TowerHandle {
    /// A handle on a tower's state (the actor's, or a tower without one in tests).
    pub fn new(state: Arc<TowerState>) -> Self {
        Self { state }
    }

    /// Returns the device's full name.
    pub fn device(&self) -> &str {
        self.state.name()
    }

    /// Returns the threads of the device's executors.
    pub fn pool(&self) -> &ThreadPool {
        self.state.pool()
    }

    /// The threads the device's kernels split large work over.
    pub fn intra(&self) -> &Arc<IntraPool> {
        self.state.intra()
    }

    /// The device's own memory, when its tensors live apart from the host's (a GPU).
    pub fn memory(&self) -> Option<&Arc<dyn MemorySpace>> {
        self.state.memory()
    }

    /// Starts `executor`'s part of a step on the tower and returns the step running.
    pub fn start(&self, executor: &Arc<Executor>, options: &StepOptions) -> Result<RunningStep> {
        self.state.start(executor, options)
    }
}

impl std::fmt::Debug for TowerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TowerHandle")
            .field("device", &self.device())
            .finish()
    }
}

/// The actor shell around [`TowerState`].
pub struct Tower {
    state: Arc<TowerState>,
}

impl Tower {
    /// A tower for `device`.
    pub fn new(device: DeviceAttributes) -> Self {
        Self {
            state: Arc::new(TowerState::new(device)),
        }
    }

    /// Starts a tower for `device` on `arbiter`; returns its mailbox and the worker's handle.
    pub fn start_on(
        arbiter: &actix::ArbiterHandle,
        device: DeviceAttributes,
        intra: Arc<IntraPool>,
    ) -> (Recipient<DescribeDevice>, TowerHandle) {
        let state = Arc::new(TowerState::new(device).with_intra(intra));
        let handle = TowerHandle::new(Arc::clone(&state));
        let tower = Tower::start_in_arbiter(arbiter, move |_| Tower { state });
        (tower.recipient(), handle)
    }
}

impl Actor for Tower {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        tracing::debug!(device = %self.state.name(), "tower started");
    }
}

impl Handler<DescribeDevice> for Tower {
    type Result = MessageResult<DescribeDevice>;

    fn handle(&mut self, _msg: DescribeDevice, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.describe())
    }
}

#[cfg(test)]
mod tests {
    use actix::Recipient;

    use super::*;

    #[actix::test]
    async fn a_tower_on_its_own_arbiter_describes_its_device() {
        let arbiter = actix::Arbiter::new();
        let device = DeviceAttributes {
            name: "/job:worker/replica:0/task:0/device:CPU:0".into(),
            device_type: "CPU".into(),
            incarnation: 42,
            ..Default::default()
        };
        let expected = device.clone();
        let tower: Recipient<DescribeDevice> =
            Tower::start_in_arbiter(&arbiter.handle(), move |_| Tower::new(device)).recipient();
        assert_eq!(tower.send(DescribeDevice).await.unwrap(), expected);
        arbiter.stop();
    }
}
