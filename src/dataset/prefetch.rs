//! `PrefetchDataset`: a producer thread walks the input ahead of the consumer, up to
//! `buffer_size` elements (AUTOTUNE: [`AUTOTUNED_BUFFER`]), so a training step's
//! `IteratorGetNext` finds its batch made while the previous step computed.
//!
//! The producer runs the input's functions with a context of its own: the task's device name,
//! the graph's function library and the file confinement of the walk's start, and a resource
//! store of its own (a map function in a prefetched pipeline reads no variables of the step).
//! Errors reach the consumer in order, after the elements made before them. The consumer
//! waits with its step's deadline and cancellation; dropping the walk stops the producer at
//! its next element.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::transform::AUTOTUNE;
use super::{dataset_input, dataset_op, int64_input, Dataset, DatasetNode, Element, Iter, Origin};
use crate::error::{Result, Status};
use crate::format::files::Files;
use crate::kernels::functional::FunctionLibrary;
use crate::kernels::{KernelFactory, OpContext};
use crate::proto::NodeDef;
use crate::runtime::resource::ResourceMgr;

/// The buffer an AUTOTUNE prefetch keeps (TensorFlow tunes it while it runs; a few batches
/// ahead is what it settles on for a training input).
const AUTOTUNED_BUFFER: usize = 4;

/// How often a waiting consumer looks at its step's deadline and cancellation.
const POLL: Duration = Duration::from_millis(20);

pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    match op {
        "PrefetchDataset" => Some(|n| dataset_op(n, prefetch)),
        _ => None,
    }
}

struct Prefetch {
    origin: Origin,
    input: Arc<dyn Dataset>,
    buffer: usize,
    node: NodeDef,
}

fn prefetch(ctx: &OpContext<'_>, d: &DatasetNode) -> Result<Arc<dyn Dataset>> {
    let buffer = match int64_input(ctx, 1, "buffer_size")? {
        AUTOTUNE => AUTOTUNED_BUFFER,
        n if n >= 0 => n as usize,
        n => {
            return Err(ctx.invalid(format!(
                "buffer_size must be >= 0 or AUTOTUNE (-1), got {n}"
            )))
        }
    };
    Ok(Arc::new(Prefetch {
        origin: d.origin.clone(),
        input: dataset_input(ctx, 0)?,
        buffer,
        node: d.node.clone(),
    }))
}

impl Dataset for Prefetch {
    fn origin(&self) -> &Origin {
        &self.origin
    }

    fn iterate(self: Arc<Self>, ctx: &OpContext<'_>) -> Result<Box<dyn Iter>> {
        if self.buffer == 0 {
            return self.input.clone().iterate(ctx);
        }
        let (tx, rx) = mpsc::sync_channel::<Result<Option<Element>>>(self.buffer);
        let env = Env {
            node: self.node.clone(),
            device: ctx.device.to_string(),
            files: ctx.files().clone(),
            data_files: ctx.data_files().clone(),
            functions: ctx.functions().ok().cloned(),
            resources: ResourceMgr::new(),
        };
        let input = self.input.clone();
        std::thread::Builder::new()
            .name("tessera-prefetch".into())
            .spawn(move || {
                let ctx = env.context();
                let produced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut walk = match input.iterate(&ctx) {
                        Ok(walk) => walk,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    loop {
                        let next = walk.next(&ctx);
                        let more = matches!(next, Ok(Some(_)));
                        if tx.send(next).is_err() || !more {
                            return;
                        }
                    }
                }));
                if produced.is_err() {
                    let _ = tx.send(Err(Status::internal(
                        "the prefetch producer panicked while making an element",
                    )));
                }
            })
            .map_err(|e| {
                Status::resource_exhausted(format!("cannot start a prefetch thread: {e}"))
            })?;
        Ok(Box::new(PrefetchIter {
            dataset: self,
            elements: Some(rx),
        }))
    }

    fn cardinality(&self) -> i64 {
        self.input.cardinality()
    }
}

/// What the producer thread runs the input's functions with.
struct Env {
    node: NodeDef,
    device: String,
    files: Files,
    data_files: Files,
    functions: Option<Arc<FunctionLibrary>>,
    resources: ResourceMgr,
}

impl Env {
    fn context(&self) -> OpContext<'_> {
        OpContext::new(&self.node, Vec::new(), &self.resources, &self.device, 0)
            .with_files(&self.files)
            .with_data_files(&self.data_files)
            .with_functions(self.functions.as_ref())
    }
}

struct PrefetchIter {
    dataset: Arc<Prefetch>,
    /// `None` once the producer has sent the end or an error.
    elements: Option<Receiver<Result<Option<Element>>>>,
}

impl Iter for PrefetchIter {
    fn next(&mut self, ctx: &OpContext<'_>) -> Result<Option<Element>> {
        let Some(elements) = &self.elements else {
            return Ok(None);
        };
        let started = Instant::now();
        loop {
            match elements.recv_timeout(POLL) {
                Ok(Ok(Some(element))) => return Ok(Some(element)),
                Ok(done) => {
                    self.elements = None;
                    return done;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.elements = None;
                    return Err(self.dataset.origin.named(Status::internal(
                        "the prefetch producer stopped without saying why",
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(token) = ctx.cancellation() {
                        if token.is_cancelled() {
                            return Err(ctx.named(
                                token
                                    .reason()
                                    .unwrap_or_else(|| Status::cancelled("the step was cancelled")),
                            ));
                        }
                    }
                    if ctx.deadline().is_some_and(|d| Instant::now() >= d) {
                        return Err(ctx.named(Status::deadline_exceeded(format!(
                            "waited {:.1} s for the next element of dataset `{}` (op {}); the \
                             input pipeline is slower than the step's deadline",
                            started.elapsed().as_secs_f64(),
                            self.dataset.origin.name,
                            self.dataset.origin.op
                        ))));
                    }
                }
            }
        }
    }
}
