//! A stock TensorFlow 2.21 master driving a tessera worker through the fused ops its graph
//! optimizer writes, live (`tests/tensorflow_fused.py` is TensorFlow's side): a TensorFlow 1
//! CNN (conv + bias + ReLU, max pooling, dense + bias + ReLU, softmax cross-entropy, Momentum;
//! and the same with batch normalization in training mode) whose every op is placed on
//! `/job:worker/task:0`, a `tessera serve` task, through a TensorFlow server as `/job:chief`
//! (the client's master). The master sends the fused nodes its grappler writes, which depend on
//! TensorFlow's build: with oneDNN (CPUs with AVX-512) `_FusedConv2D [BiasAdd, Relu]`,
//! `_FusedMatMul [BiasAdd, Relu]`, `_FusedMatMul [BiasAdd]` and, with batch normalization,
//! `_FusedBatchNormEx Relu`; without it no `Relu` in a `_FusedMatMul` and no batch
//! normalization. The worker must run every one TensorFlow writes for the same graph alone (the
//! test reads them back from the partition graphs each reports); the losses of every step must be TensorFlow's alone (same script, same seeds) to
//! float rounding (1e-4 relative; about 1e-6 where measured).
//!
//! They need a Python with TensorFlow and tf-keras (`$TESSERA_TF_PYTHON`, else `python3`);
//! without one they print why and pass, except under CI, where they fail.

use std::process::{Command, Stdio};

use crate::support::cluster::{Bound, TEST_TIMEOUTS};
use crate::support::tensorflow::{python_with, Client, TfServer, Trained};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorflow_fused.py");

fn run(python: &str, args: &[&str]) -> Trained {
    let mut command = Command::new(python);
    command.arg(SCRIPT).args(args).stdin(Stdio::null());
    Client::spawn(command).finish()
}

fn losses(trained: &Trained) -> Vec<f64> {
    let values = trained.json["losses"].as_array();
    let values = values.unwrap_or_else(|| panic!("no losses in {}", trained.json));
    values.iter().map(|v| v.as_f64().unwrap()).collect()
}

/// Trains through TensorFlow's master onto a tessera worker and alone; checks that the worker
/// ran every fused node TensorFlow's own grappler wrote for the same graph alone (which ones
/// depends on TensorFlow's build: see the module's comment) and that the losses agree.
fn trains_like_tensorflow(test: &str, batch_norm: bool) {
    let Some(python) = python_with(test, &["tensorflow", "tf_keras"]) else {
        return;
    };
    let bound = Bound::bind(&[("worker", 1)]);
    let worker = bound.addr("worker", 0).to_string();
    let chief = TfServer::start(&python, SCRIPT, &["server", "--worker", &worker]);
    let _cluster = bound.start(&[("chief", 0, chief.addr)], TEST_TIMEOUTS);
    let master = format!("grpc://{}", chief.addr);
    let mut args = vec!["train", "--master", &master];
    let mut alone_args = vec!["train", "--alone"];
    if batch_norm {
        args.push("--batch-norm");
        alone_args.push("--batch-norm");
    }
    let on_tessera = run(&python, &args);
    let alone = run(&python, &alone_args);

    let fused = on_tessera.strings("fused");
    let want_fused = alone.strings("fused");
    assert!(
        want_fused.iter().any(|f| f.starts_with("_Fused")),
        "TensorFlow alone fused nothing: {want_fused:?}"
    );
    for want in &want_fused {
        assert!(
            fused.contains(want),
            "{want} not among the fused nodes tessera ran: {fused:?}"
        );
    }
    let (got, want) = (losses(&on_tessera), losses(&alone));
    assert_eq!(got.len(), want.len(), "steps");
    assert!(
        (got[0] - want[0]).abs() <= 1e-5 * want[0],
        "first loss {}, TensorFlow's {}",
        got[0],
        want[0]
    );
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(0.1),
            "step {step}: loss {g}, TensorFlow's alone {w}\ntessera: {got:?}\nTensorFlow: {want:?}"
        );
    }
    eprintln!(
        "{} steps through TensorFlow's master on a tessera worker ({fused:?}): losses {:.6} -> \
         {:.6}, TensorFlow alone {:.6} -> {:.6}",
        got.len(),
        got[0],
        got.last().unwrap(),
        want[0],
        want.last().unwrap()
    );
}

#[test]
fn a_tensorflow_master_runs_a_fused_cnn_on_a_tessera_worker() {
    trains_like_tensorflow("tensorflow master fused cnn", false);
}

#[test]
fn a_tensorflow_master_runs_a_fused_batch_norm_cnn_on_a_tessera_worker() {
    trains_like_tensorflow("tensorflow master fused batch norm cnn", true);
}
