//! What kernels run against: the devices as the executor sees them ([`Device`]), the
//! per-device resource store (variables, queues, accumulators), the per-step state (the
//! rendezvous where sends meet receives and all-reduces meet, cancellation, deadlines and
//! waits, the step's trace) and the threads that run nodes.
//!
//! This layer sits below the kernels and knows neither the executor (the `exec` module) nor any
//! transport: a `_Recv` whose producer is on another task pulls through the
//! [`step::RemoteRecv`] hook, which the peers implement and the daemon injects.

pub mod accumulator;
pub mod cancel;
pub mod collective;
pub mod device;
pub mod intra;
pub mod pool;
pub mod queue;
pub mod rendezvous;
pub mod resource;
pub mod stats;
pub mod step;
pub mod wait;

pub use cancel::CancellationToken;
pub use device::Device;
pub use step::{RemoteRecv, StepOptions};
