//! The evaluator: a task outside the cluster (TensorFlow's `evaluator` in `TF_CONFIG`, a
//! Kubeflow TFJob's Evaluator replica) that scores each checkpoint the chief writes on the
//! held-out examples, in process, and ends once it scored the one at the last step.
//!
//! It builds the chief's graph (so the variables' names and partitions are the checkpoint's),
//! drops the graph's device names (every node on its own CPU), restores each new checkpoint
//! and evaluates as the chief does: the same data, seed and split, so the last checkpoint's
//! scores are the chief's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::Session;
use crate::cluster::ClusterSpec;
use crate::error::{Result, Status};
use crate::runtime::device::Device;
use crate::train::checkpoint::saver::Saver;
use crate::train::checkpoint::state::latest_checkpoint;

use super::model::{self, Placement, Scores};
use super::role::{evaluate, examples, Replica, StopRequest};
use super::spec::TrainSpec;

/// How often the evaluator looks for a new checkpoint.
const POLL: Duration = Duration::from_secs(1);

/// One checkpoint scored.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub checkpoint: PathBuf,
    pub global_step: i64,
    pub scores: Scores,
    pub held_out_examples: usize,
}

/// Scores every new checkpoint under `spec.checkpoint_dir` of the job `cluster` describes,
/// handing each to `report`, until one at `spec.steps` or later (Ok) or `stop` (Ok, early).
/// Waits for the first checkpoint up to `startup`.
pub fn run(
    spec: &TrainSpec,
    cluster: &ClusterSpec,
    startup: Duration,
    stop: &StopRequest,
    report: &mut dyn FnMut(&Evaluation),
) -> Result<()> {
    let dir = spec.checkpoint_dir.clone().ok_or_else(|| {
        Status::invalid_argument(
            "an evaluator scores the chief's checkpoints: give it the job's --checkpoint_dir",
        )
    })?;
    let (train, held_out) = spec.load_data()?;
    // The chief's graph: its variables are the checkpoint's.
    let placement = Placement {
        num_ps: cluster.num_tasks("ps").unwrap_or(1).max(1) as u32,
        job: "worker".into(),
        chief: true,
        worker_index: 0,
        num_workers: Replica::count(cluster).max(1),
    };
    let built = model::build_for(spec, &placement, examples(&train, &held_out))?;
    let mut graph = built.graph.clone();
    for node in &mut graph.node {
        node.device.clear();
    }
    let session = Session::on_device(Arc::new(Device::local_cpu()));
    session.extend(&graph)?;
    let saver = Saver::new(built.saver.clone(), 1);

    let started = Instant::now();
    let mut last: Option<PathBuf> = None;
    loop {
        if stop.is_requested() {
            return Ok(());
        }
        match latest_checkpoint(&dir)? {
            Some(prefix) if last.as_ref() != Some(&prefix) => {
                let evaluation = score(&session, &saver, &built, &prefix, &held_out, &train)?;
                report(&evaluation);
                last = Some(prefix);
                if evaluation.global_step >= spec.steps {
                    return Ok(());
                }
            }
            None if started.elapsed() >= startup => {
                return Err(Status::deadline_exceeded(format!(
                    "no checkpoint in {} after {} s; check that the chief runs with the same \
                     --checkpoint_dir, or wait longer (--startup_timeout)",
                    dir.display(),
                    startup.as_secs()
                )));
            }
            _ => {}
        }
        std::thread::sleep(POLL);
    }
}

/// Restores `prefix` into `session` and scores it.
fn score(
    session: &Session,
    saver: &Saver,
    built: &model::TrainGraph,
    prefix: &Path,
    held_out: &crate::data::Dataset,
    train: &crate::data::Dataset,
) -> Result<Evaluation> {
    saver
        .restore(session, prefix)
        .map_err(|e| e.context(format!("restoring {}", prefix.display())))?;
    let global_step = session.run(&[], &[&built.global_step], &[])?[0].scalar_value::<i64>()?;
    let scores = evaluate(session, built, held_out, train)?;
    Ok(Evaluation {
        checkpoint: prefix.to_path_buf(),
        global_step,
        scores,
        held_out_examples: held_out.len(),
    })
}
