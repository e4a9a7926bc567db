//! `VariableShard`: the actor that owns the variables of one device (their optimizer slots are
//! variables too), in a [`ResourceMgr`] keyed by (container, name).
//!
//! A daemon starts one shard per local device. Every session on the task shares the shards
//! (TensorFlow's default `isolate_session_state = false`), so variables outlive sessions and
//! worker restarts and die with the process. The worker asks each shard for its store once at
//! start ([`GetResources`]) and makes it the store of the shard's device, so kernels reach the
//! variables without a mailbox hop per update; a session created with `isolate_session_state`
//! gets stores of its own instead. Through its mailbox the shard takes consistent snapshots
//! ([`Snapshot`]) and restores ([`Restore`]); see [`ShardState`].

pub mod replica;
mod state;

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, MessageResult};

use crate::error::Result;
use crate::runtime::resource::ResourceMgr;
use crate::tensor::Tensor;

pub use state::ShardState;

/// Asks the shard for its resource store, to run kernels against it.
#[derive(Debug, Message)]
#[rtype(result = "Arc<ResourceMgr>")]
pub struct GetResources;

/// Asks for the values of the named variables (each `(container, name)`), read at one instant.
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<Tensor>>")]
pub struct Snapshot(pub Vec<(String, String)>);

/// Stores values into the named variables, all at one instant.
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct Restore(pub Vec<((String, String), Tensor)>);

/// The actor shell around [`ShardState`].
pub struct VariableShard {
    state: ShardState,
    /// The task whose metrics the shard's gauges carry, when it reports them.
    task: Option<String>,
}

impl VariableShard {
    /// A shard with an empty store, hosted on `device`.
    pub fn new(device: impl Into<String>) -> Self {
        Self {
            state: ShardState::new(device),
            task: None,
        }
    }

    /// The same shard, reporting its gauges for `task` once started.
    pub fn reporting_for(mut self, task: impl Into<String>) -> Self {
        self.task = Some(task.into());
        self
    }
}

impl Actor for VariableShard {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        if let Some(task) = &self.task {
            self.state.report_metrics(task);
        }
        tracing::debug!(device = %self.state.device(), "variable shard started");
    }
}

impl Handler<GetResources> for VariableShard {
    type Result = MessageResult<GetResources>;

    fn handle(&mut self, _msg: GetResources, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.resources())
    }
}

impl Handler<Snapshot> for VariableShard {
    type Result = Result<Vec<Tensor>>;

    fn handle(&mut self, msg: Snapshot, _ctx: &mut Self::Context) -> Self::Result {
        let names: Vec<(&str, &str)> = msg
            .0
            .iter()
            .map(|(c, n)| (c.as_str(), n.as_str()))
            .collect();
        self.state.snapshot(&names)
    }
}

impl Handler<Restore> for VariableShard {
    type Result = Result<()>;

    fn handle(&mut self, msg: Restore, _ctx: &mut Self::Context) -> Self::Result {
        let values = msg
            .0
            .iter()
            .map(|((c, n), value)| ((c.as_str(), n.as_str()), value.clone()))
            .collect();
        self.state.restore(values)
    }
}

#[cfg(test)]
mod tests {
    use actix::Recipient;

    use super::*;

    #[actix::test]
    async fn every_caller_gets_the_same_store() {
        let shard: Recipient<GetResources> =
            VariableShard::new("/job:ps/replica:0/task:0/device:CPU:0")
                .start()
                .recipient();
        let a = shard.send(GetResources).await.unwrap();
        let b = shard.send(GetResources).await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.is_empty());
    }

    #[actix::test]
    async fn snapshots_and_restores_through_the_mailbox() {
        let shard = VariableShard::new("/job:ps/replica:0/task:0/device:CPU:0").start();
        let store = shard.send(GetResources).await.unwrap();
        let var = store
            .lookup_or_create("", "w", || {
                Ok(crate::runtime::resource::Var::new(
                    crate::tensor::DType::Float,
                    crate::tensor::PartialShape::unknown(),
                ))
            })
            .unwrap();
        *var.write() = Some(Tensor::scalar(1.0f32));
        let names = vec![(String::new(), "w".to_string())];
        shard
            .send(Restore(vec![(names[0].clone(), Tensor::scalar(3.0f32))]))
            .await
            .unwrap()
            .unwrap();
        let values = shard.send(Snapshot(names)).await.unwrap().unwrap();
        assert_eq!(values[0].scalar_value::<f32>().unwrap(), 3.0);
        // The kernels' handle sees what the shard stored.
        assert_eq!(var.snapshot().unwrap().scalar_value::<f32>().unwrap(), 3.0);
    }
}
