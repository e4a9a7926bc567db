//! TensorFlow's wire messages and the two gRPC services, generated from `proto/` by `build.rs`.
//!
//! Packages, names and field numbers are TensorFlow's, so that stock TensorFlow clients and tasks
//! understand tessera tasks. Only the fields tessera uses are declared; proto3 skips the rest.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod tensorflow {
    include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));

    /// TensorFlow's status codes (`tensorflow.error.Code`).
    pub mod error {
        include!(concat!(env!("OUT_DIR"), "/tensorflow.error.rs"));
    }
}

pub use tensorflow::*;

/// tessera's own service (`proto/tessera/replica.proto`): a ps task's standby.
pub mod replica {
    include!(concat!(env!("OUT_DIR"), "/tessera.rs"));
}

/// A node with only a name, an op and inputs, for the unit tests of graph rewrites.
#[cfg(test)]
pub(crate) fn test_node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}
