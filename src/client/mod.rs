//! What a training program holds to run steps: the [`Session`], in process (TensorFlow's
//! target `""`, [`LocalSession`]) or in a task's master over gRPC (`grpc://host:port`,
//! [`RemoteSession`]).

pub mod local;
pub mod multi_device;
pub mod remote;
pub mod session;

pub use local::{LocalSession, SessionOptions};
pub use remote::{ConnectOptions, RemoteSession};
pub use session::Session;
