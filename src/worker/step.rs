//! Running one step of a registered graph, and pulling tensors from other tasks.
//!
//! [`run_executors`] starts every per-device executor of a graph ([`Executor::spawn`]: nodes
//! that may wait or take long go to the executor pool, never onto the async runtime's thread;
//! only cheap ones run there, within a bounded budget) and waits for them without blocking: the
//! first error aborts the step's rendezvous with that status, so the other devices' pending
//! `_Recv`s (and other tasks' RecvTensors for this step) fail at once with the root cause
//! instead of timing out.
//!
//! Tensors from other tasks come through the step's remote-receive hook, which the peers
//! implement (`peer::RemoteFetcher`).

use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};

use crate::error::{Result, Status};
use crate::exec::Executor;
use crate::runtime::StepOptions;

/// Runs every executor for the step described by `options`; returns the step's first error.
///
/// Requires `options.rendezvous` (aborted with the first error) and `options.cancellation`
/// (cancelled with it, so no new node starts anywhere in the step).
pub async fn run_executors(executors: &[Arc<Executor>], options: StepOptions) -> Result<()> {
    let mut running = FuturesUnordered::new();
    for executor in executors {
        match executor.spawn(Vec::new(), &options) {
            Ok(step) => running.push(futures::future::Either::Left(step.finish())),
            Err(e) => running.push(futures::future::Either::Right(std::future::ready(Err(e)))),
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
