//! Test support shared by the integration tests that need running tasks (`crate::support` in
//! tests/integration.rs; `mod support;` in the CUDA tests, which use only part of it).
#![allow(dead_code)]

pub mod certs;
pub mod cluster;
pub mod fake_master;
pub mod finite_differences;
pub mod gpu_copies;
pub mod kernel_check;
pub mod mlp;
pub mod prometheus;
pub mod raw_grpc;
pub mod regression;
pub mod requirement;
pub mod tensorflow;
pub mod training;
pub mod v1_graph;
pub mod worker_service;
