//! [`Session`]: the one type a training program holds, whichever target it runs on.
//!
//! TensorFlow picks the implementation from the target string: `""` runs in process
//! ([`LocalSession`]), `grpc://host:port` talks to that task's master ([`RemoteSession`]).
//! Both have the same synchronous API; this type dispatches to one of them.

use std::sync::Arc;

use super::local::{LocalSession, SessionOptions};
use super::remote::{ConnectOptions, RemoteSession};
use crate::error::Result;
use crate::proto::{CallableOptions, GraphDef, RunMetadata, RunOptions};
use crate::runtime::Device;
use crate::tensor::Tensor;

/// A session: a growing graph and the steps run on it, in process or in a remote master.
/// `Send + Sync`; calls may come from several threads.
pub struct Session {
    inner: Inner,
}

// One per session, so the local variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Inner {
    Local(LocalSession),
    Remote(RemoteSession),
}

impl Session {
    /// A session with its own CPU device and variables
    /// (`/job:localhost/replica:0/task:0/device:CPU:0`): TensorFlow's `tf.Session("")`.
    pub fn local() -> Self {
        Self::from(LocalSession::local())
    }

    /// An in-process session with its own `options.device_count` CPU devices (`CPU:0..N-1`),
    /// each with its own variables: TensorFlow's `device_count = {"CPU": N}`.
    pub fn local_with(options: SessionOptions) -> Self {
        Self::from(LocalSession::local_with(options))
    }

    /// An in-process session of its own on `devices`, the first the client's
    /// ([`LocalSession::on_devices`]).
    pub fn on_devices(devices: Vec<Arc<Device>>, options: SessionOptions) -> Self {
        Self::from(LocalSession::on_devices(devices, options))
    }

    /// An in-process session on an existing device, sharing its variables with every other
    /// session on it.
    pub fn on_device(device: Arc<Device>) -> Self {
        Self::from(LocalSession::on_device(device))
    }

    /// An in-process session on `device` with these options.
    pub fn with_options(device: Arc<Device>, options: SessionOptions) -> Self {
        Self::from(LocalSession::with_options(device, options))
    }

    /// A session in the master at `target` (`grpc://host:port`): TensorFlow's
    /// `tf.Session("grpc://host:port")`, with default [`ConnectOptions`].
    ///
    /// The API blocks: call it from a plain thread (or `spawn_blocking`), not from inside an
    /// async runtime, where every call fails with FAILED_PRECONDITION.
    pub fn connect(target: &str) -> Result<Self> {
        Self::connect_with(target, ConnectOptions::default())
    }

    /// A session in the master at `target` with these deadlines and session config.
    /// Fails with INVALID_ARGUMENT for a malformed target and UNAVAILABLE when the master
    /// cannot be reached within `options.connect_timeout`.
    pub fn connect_with(target: &str, options: ConnectOptions) -> Result<Self> {
        Ok(Self {
            inner: Inner::Remote(RemoteSession::connect(target, options)?),
        })
    }

    /// Returns the target: `""` in process, `grpc://host:port` for a remote master.
    pub fn target(&self) -> &str {
        match &self.inner {
            Inner::Local(_) => "",
            Inner::Remote(s) => s.target(),
        }
    }

    /// Returns the device an in-process session runs on; `None` for a remote session, whose
    /// devices are the master's ([`RemoteSession::list_devices`]).
    pub fn device(&self) -> Option<&Arc<Device>> {
        match &self.inner {
            Inner::Local(s) => Some(s.device()),
            Inner::Remote(_) => None,
        }
    }

    /// Returns the in-process session, if this is one.
    pub fn as_local(&self) -> Option<&LocalSession> {
        match &self.inner {
            Inner::Local(s) => Some(s),
            Inner::Remote(_) => None,
        }
    }

    /// Returns the remote session, if this is one.
    pub fn as_remote(&self) -> Option<&RemoteSession> {
        match &self.inner {
            Inner::Local(_) => None,
            Inner::Remote(s) => Some(s),
        }
    }

    /// Returns the graph version: one more after each [`extend`](Self::extend) in process; the
    /// master's version for a remote session (0 after the graph that created the session).
    pub fn graph_version(&self) -> u64 {
        match &self.inner {
            Inner::Local(s) => s.graph_version(),
            Inner::Remote(s) => s.graph_version(),
        }
    }

    /// Adds the nodes of `graph` to the session's graph. A node whose name is already taken
    /// fails the whole call with INVALID_ARGUMENT naming it, and nothing is added.
    pub fn extend(&self, graph: &GraphDef) -> Result<()> {
        match &self.inner {
            Inner::Local(s) => s.extend(graph),
            Inner::Remote(s) => s.extend(graph),
        }
    }

    /// Runs one step: feeds `(tensor name, value)` in any order, returns the fetched tensors in
    /// fetch order and runs `targets` (node names) for their effects.
    pub fn run(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>> {
        match &self.inner {
            Inner::Local(s) => s.run(feeds, fetches, targets),
            Inner::Remote(s) => s.run(feeds, fetches, targets),
        }
    }

    /// Runs one step as `options` ask and returns the step's `RunMetadata` with the fetches:
    /// TensorFlow's `session.run(fetches, feed_dict, options=run_options,
    /// run_metadata=metadata)`. `trace_level` above `NO_TRACE` (software, hardware and full
    /// traces are one here) fills `step_stats`: a `DeviceStepStats` per device the step ran
    /// on, with every node's times, thread, timeline label and output sizes
    /// ([`chrome_trace`](super::timeline::chrome_trace) turns it into a Chrome trace);
    /// `output_partition_graphs` fills `partition_graphs`; `timeout_in_ms` bounds the step.
    /// Steps run with [`run`](Self::run) record nothing.
    pub fn run_with_options(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: &RunOptions,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        match &self.inner {
            Inner::Local(s) => s.run_with_options(feeds, fetches, targets, options),
            Inner::Remote(s) => s.run_with_options(feeds, fetches, targets, options),
        }
    }

    /// Prepares a step signature once and returns a handle to run it with
    /// [`run_callable`](Self::run_callable).
    pub fn make_callable(&self, options: CallableOptions) -> Result<i64> {
        match &self.inner {
            Inner::Local(s) => s.make_callable(options),
            Inner::Remote(s) => s.make_callable(options),
        }
    }

    /// Runs the callable `handle` with `feeds` in its `CallableOptions.feed` order; returns the
    /// fetches in `CallableOptions.fetch` order. An unknown handle is INVALID_ARGUMENT.
    pub fn run_callable(&self, handle: i64, feeds: Vec<Tensor>) -> Result<Vec<Tensor>> {
        match &self.inner {
            Inner::Local(s) => s.run_callable(handle, feeds),
            Inner::Remote(s) => s.run_callable(handle, feeds),
        }
    }

    /// Forgets the callable `handle`; releasing an unknown or released handle is fine.
    pub fn release_callable(&self, handle: i64) -> Result<()> {
        match &self.inner {
            Inner::Local(s) => s.release_callable(handle),
            Inner::Remote(s) => s.release_callable(handle),
        }
    }

    /// Closes the session: running steps are cancelled, then every later call fails with
    /// FAILED_PRECONDITION. Closing twice is fine. Dropping a session closes it.
    pub fn close(&self) -> Result<()> {
        match &self.inner {
            Inner::Local(s) => s.close(),
            Inner::Remote(s) => s.close(),
        }
    }
}

impl From<LocalSession> for Session {
    fn from(session: LocalSession) -> Self {
        Self {
            inner: Inner::Local(session),
        }
    }
}

impl From<RemoteSession> for Session {
    fn from(session: RemoteSession) -> Self {
        Self {
            inner: Inner::Remote(session),
        }
    }
}
