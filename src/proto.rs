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
