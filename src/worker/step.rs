//! Running one step of a registered graph, and pulling tensors from other tasks.
//!
//! [`run_executors`] hands every device's executor of a graph to the device's tower, which
//! starts it ([`Executor::spawn`]: nodes that may wait or take long go to the device's pool;
//! only cheap ones run on the calling thread, within a bounded budget), and waits for them
//! without blocking: the first error aborts the step's rendezvous with that status, so the other devices' pending
//! `_Recv`s (and other tasks' RecvTensors for this step) fail at once with the root cause
//! instead of timing out.
//!
//! Tensors from other tasks come through the step's remote-receive hook, which the peers
//! implement (`peer::RemoteFetcher`).

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::error::{Result, Status};
use crate::exec::Executor;
use crate::runtime::StepOptions;
use crate::tower::TowerHandle;

/// Runs every executor for the step described by `options`, each on its device's tower from
/// `towers` (started here when its device has none); returns the step's first error.
///
/// Requires `options.rendezvous` (aborted with the first error) and `options.cancellation`
/// (cancelled with it, so no new node starts anywhere in the step).
pub async fn run_executors(
    executors: &[Arc<Executor>],
    options: StepOptions,
    towers: &HashMap<String, TowerHandle>,
) -> Result<()> {
    let mut running = FuturesUnordered::<BoxFuture<'_, Result<Vec<_>>>>::new();
    for executor in executors {
        match towers.get(executor.device().name()) {
            Some(tower) => match tower.start(executor, &options) {
                Ok(step) => running.push(Box::pin(step.finish())),
                Err(e) => running.push(Box::pin(std::future::ready(Err(e)))),
            },
            None => match executor.spawn(Vec::new(), &options) {
                Ok(step) => running.push(Box::pin(step.finish())),
                Err(e) => running.push(Box::pin(std::future::ready(Err(e)))),
            },
        }
    }
    let mut first: Option<Status> = None;
    while let Some(result) = running.next().await {
        if let Err(status) = result {
            if first.is_none() {
                if let Some(rendezvous) = &options.rendezvous {
                    rendezvous.abort(status.clone());
                }
                if let Some(token) = &options.cancellation {
                    token.cancel(status.clone());
                }
                first = Some(status);
            }
        }
    }
    first.map_or(Ok(()), Err)
}
