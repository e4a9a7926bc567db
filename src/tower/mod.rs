//! `Tower`: the actor that owns one local device (`CPU:i` or `GPU:i`) and runs its part of
//! every step.
//!
//! Each tower runs on its own `actix::Arbiter` thread. The worker splits a registered graph per
//! device and hands each device's part of a step to its tower ([`StartStep`]); the tower starts
//! it ([`TowerState::start`]: cheap nodes on its thread, the rest on the device's pool) and
//! answers with the running step, which the worker awaits. The tower never waits for a step,
//! so it takes the next step's message at once, and a kernel that blocks holds one of the
//! device's pool threads, not the tower. The worker holds a [`TowerHandle`] per device.

mod state;

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, MessageResult, Recipient};

use crate::error::{mailbox_failure, Result};
use crate::exec::executor::RunningStep;
use crate::exec::Executor;
use crate::proto::DeviceAttributes;
use crate::runtime::pool::ThreadPool;
use crate::runtime::StepOptions;

pub use state::TowerState;

/// Starts a device's part of a step on its tower; answers the step running.
#[derive(Message)]
#[rtype(result = "Result<RunningStep>")]
pub struct StartStep {
    /// The device's partition of the registered graph.
    pub executor: Arc<Executor>,
    /// The step's id, deadline, cancellation, rendezvous and trace.
    pub options: StepOptions,
}

/// What the worker holds of a device's tower: its mailbox, and the pool its device runs on.
#[derive(Clone)]
pub struct TowerHandle {
    /// The device's full name.
    pub device: String,
    /// The threads of the device's executors.
    pub pool: ThreadPool,
    start: Recipient<StartStep>,
}

impl TowerHandle {
    /// Starts `executor`'s part of a step on the tower and returns the step running.
    pub async fn start(
        &self,
        executor: Arc<Executor>,
        options: StepOptions,
    ) -> Result<RunningStep> {
        let message = StartStep { executor, options };
        self.start
            .send(message)
            .await
            .map_err(|e| mailbox_failure(e, &format!("the tower of {}", self.device)))?
    }
}

impl std::fmt::Debug for TowerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TowerHandle")
            .field("device", &self.device)
            .finish()
    }
}

/// Asks a tower for its device's attributes.
#[derive(Debug, Message)]
#[rtype(result = "DeviceAttributes")]
pub struct DescribeDevice;

/// The actor shell around [`TowerState`].
pub struct Tower {
    state: TowerState,
}

impl Tower {
    /// A tower for `device`.
    pub fn new(device: DeviceAttributes) -> Self {
        Self {
            state: TowerState::new(device),
        }
    }

    /// Starts a tower for `device` on `arbiter`; returns its mailboxes.
    pub fn start_on(
        arbiter: &actix::ArbiterHandle,
        device: DeviceAttributes,
    ) -> (Recipient<DescribeDevice>, TowerHandle) {
        let state = TowerState::new(device);
        let handle_of = |start| TowerHandle {
            device: state.name().to_string(),
            pool: state.pool().clone(),
            start,
        };
        let tower = Tower::start_in_arbiter(arbiter, {
            let state = state.clone();
            move |_| Tower { state }
        });
        let handle = handle_of(tower.clone().recipient());
        (tower.recipient(), handle)
    }
}

impl Actor for Tower {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        tracing::debug!(device = %self.state.name(), "tower started");
    }
}

impl Handler<StartStep> for Tower {
    type Result = Result<RunningStep>;

    fn handle(&mut self, msg: StartStep, _ctx: &mut Self::Context) -> Self::Result {
        self.state.start(&msg.executor, &msg.options)
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
