//! What a training program holds to run steps: the [`Session`], in process (TensorFlow's
//! target `""`, [`LocalSession`]) or in a task's master over gRPC (`grpc://host:port`,
//! [`RemoteSession`]).
//!
//! A step run with [`Session::run_with_options`] and a `trace_level` returns its trace, which
//! [`timeline::chrome_trace`] turns into a Chrome trace.

pub mod local;
pub mod multi_device;
pub mod remote;
pub mod session;
pub mod timeline;

pub use local::{LocalSession, SessionOptions};
pub use remote::{ConnectOptions, RemoteSession};
pub use session::Session;
pub use timeline::chrome_trace;
