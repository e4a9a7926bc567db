//! Tasks of one job train one model: the chief publishes the flags that define it (the model,
//! its sizes, the optimizer, the schedule, the data), and every other worker compares its own
//! before it trains, failing at once with the flags that differ. Without this a worker started
//! with another `--hidden` waits for a model that never becomes ready to it.
//!
//! The flags travel as a string resource variable on ps task 0's CPU ([`FLAGS_VARIABLE`]),
//! written by the chief before it initialises the model, read through the worker's own master;
//! it is not among the checkpointed variables. Its sessions are [`super::signal`]'s.

use std::time::{Duration, Instant};

use crate::client::Session;
use crate::cluster::TaskId;
use crate::error::{Code, Result, Status};
use crate::graph::{Graph, Variable};
use crate::tensor::Tensor;

use super::spec::{ModelKind, TrainSpec};

/// The shared name of the variable holding the chief's flags.
pub const FLAGS_VARIABLE: &str = "tessera_model_flags";
/// The pause between two reads while the chief has not published yet.
const POLL: Duration = Duration::from_secs(1);

/// The flags every task of a job must agree on, as `(flag, value)` in a fixed order.
pub fn agreed_flags(spec: &TrainSpec) -> Vec<(&'static str, String)> {
    let list = |v: &[usize]| {
        let items: Vec<String> = v.iter().map(usize::to_string).collect();
        items.join(",")
    };
    let model = match &spec.model {
        ModelKind::Softmax => "softmax",
        ModelKind::Mlp { .. } => "mlp",
        ModelKind::Cnn { .. } => "cnn",
        ModelKind::Embedding { .. } => "embedding",
        ModelKind::Regression => "regression",
    };
    let mut flags = vec![("--model", model.to_string())];
    match &spec.model {
        ModelKind::Mlp { hidden } => flags.push(("--hidden", list(hidden))),
        ModelKind::Cnn { filters } => flags.push(("--filters", list(filters))),
        ModelKind::Embedding { rows, dim, hidden } => {
            flags.push(("--table_rows", rows.to_string()));
            flags.push(("--embedding_dim", dim.to_string()));
            flags.push(("--hidden", list(hidden)));
        }
        ModelKind::Softmax | ModelKind::Regression => {}
    }
    flags.push(("--optimizer", spec.optimizer.clone()));
    flags.push(("--learning_rate", spec.learning_rate.to_string()));
    flags.push(("--steps", spec.steps.to_string()));
    flags.push((
        "--sync",
        match &spec.sync {
            Some(sync) => format!("on, --replicas_to_aggregate {}", sync.replicas_to_aggregate),
            None => "off".into(),
        },
    ));
    flags.push(("--data", spec.data.describe()));
    flags
}

/// The flags as the variable holds them: one `flag=value` per line.
fn encode(flags: &[(&str, String)]) -> String {
    flags
        .iter()
        .map(|(flag, value)| format!("{flag}={value}\n"))
        .collect()
}

/// The flags that differ between the chief's `published` text and `own`, as messages.
pub fn differences(published: &str, own: &[(&str, String)]) -> Vec<String> {
    let theirs: Vec<(&str, &str)> = published
        .lines()
        .filter_map(|line| line.split_once('='))
        .collect();
    let mut differ = Vec::new();
    for (flag, mine) in own {
        match theirs.iter().find(|(f, _)| f == flag) {
            Some((_, chief)) if chief == mine => {}
            Some((_, chief)) => {
                differ.push(format!("{flag}: the chief has {chief}, this task {mine}"))
            }
            None => differ.push(format!("{flag}: the chief has none, this task {mine}")),
        }
    }
    for (flag, chief) in &theirs {
        if !own.iter().any(|(f, _)| f == flag) {
            differ.push(format!("{flag}: the chief has {chief}, this task none"));
        }
    }
    differ
}

/// The variable on `ps0`'s CPU, initialised (when the chief runs its initializer) to `flags`.
fn graph(ps0: &TaskId, flags: &str) -> Result<(Graph, Variable, String)> {
    let mut g = Graph::new();
    let device = format!("{}/device:CPU:0", ps0.device_prefix());
    let (var, initialized) = g.with_device(&device, |g| {
        let text = g.constant(&Tensor::string(flags.as_bytes().to_vec()))?;
        let var = g.variable(FLAGS_VARIABLE, &text)?;
        Ok::<_, Status>((
            var,
            format!("{FLAGS_VARIABLE}/IsInitialized/VarIsInitializedOp:0"),
        ))
    })?;
    Ok((g, var, initialized))
}

/// A session on the master at `target` holding `graph`, which needs only `ps0` and `own`.
fn session(target: &str, graph: &Graph, ps0: &TaskId, own: &TaskId) -> Result<Session> {
    super::signal::session(target, graph, &[ps0.device_prefix(), own.device_prefix()])
}

/// The chief's published flags, or `None` while it has not published them.
fn read(
    target: &str,
    g: &Graph,
    (ps0, own): (&TaskId, &TaskId),
    initialized: &str,
    value: &str,
) -> Result<Option<String>> {
    let s = session(target, g, ps0, own)?;
    let text = (|| {
        if !s.run(&[], &[initialized], &[])?[0].scalar_value::<bool>()? {
            return Ok(None);
        }
        let text = s.run(&[], &[value], &[])?;
        let text = text[0].strings()?.first().cloned().unwrap_or_default();
        Ok(Some(String::from_utf8_lossy(&text).into_owned()))
    })();
    let _ = s.close();
    text
}

/// The chief's half: writes its flags to `ps0` through its master at `target`; the chief is
/// `own`.
pub fn publish(target: &str, ps0: &TaskId, own: &TaskId, spec: &TrainSpec) -> Result<()> {
    let (g, var, _) = graph(ps0, &encode(&agreed_flags(spec)))?;
    let s = session(target, &g, ps0, own)?;
    s.run(&[], &[], &[&var.initializer])?;
    let _ = s.close();
    Ok(())
}

/// A worker's half: waits up to `wait` for the chief's flags on `ps0` and compares them with
/// its own; INVALID_ARGUMENT naming every flag that differs, and `task`.
pub fn check(
    target: &str,
    ps0: &TaskId,
    task: &TaskId,
    spec: &TrainSpec,
    wait: Duration,
) -> Result<()> {
    let own = agreed_flags(spec);
    let (g, var, initialized) = graph(ps0, &encode(&own))?;
    let value = var.value.name();
    let started = Instant::now();
    let mut said = false;
    let published = loop {
        // The ps may not be up yet (UNAVAILABLE), nor the chief's flags written: both are
        // waited for, as a cluster's tasks start in any order.
        match read(target, &g, (ps0, task), &initialized, &value) {
            Ok(Some(text)) => break text,
            Ok(None) => {}
            // Refused (UNAVAILABLE), or bound but not serving yet (DEADLINE_EXCEEDED).
            Err(e) if matches!(e.code(), Code::Unavailable | Code::DeadlineExceeded) => {
                if !said {
                    said = true;
                    tracing::info!(
                        "waiting for {ps0} to come up (normal while a cluster starts): {e}"
                    );
                }
            }
            Err(e) => return Err(e),
        }
        if started.elapsed() >= wait {
            return Err(Status::deadline_exceeded(format!(
                "{task}: the chief published no model within {} s; check that worker 0 is \
                 running, or wait longer (--wait_for_model)",
                wait.as_secs()
            )));
        }
        std::thread::sleep(POLL.min(wait.saturating_sub(started.elapsed())));
    };
    let differ = differences(&published, &own);
    if differ.is_empty() {
        return Ok(());
    }
    Err(Status::new(
        Code::InvalidArgument,
        format!(
            "{task} trains another model than the chief's: {}; start every task of the job with \
             the same flags",
            differ.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_flag_with_both_values() {
        let chief = TrainSpec {
            model: ModelKind::Mlp { hidden: vec![128] },
            ..TrainSpec::default()
        };
        let worker = TrainSpec {
            model: ModelKind::Mlp { hidden: vec![64] },
            optimizer: "gd".into(),
            ..TrainSpec::default()
        };
        let published = encode(&agreed_flags(&chief));
        assert!(differences(&published, &agreed_flags(&chief)).is_empty());
        assert_eq!(
            differences(&published, &agreed_flags(&worker)),
            [
                "--hidden: the chief has 128, this task 64",
                "--optimizer: the chief has adam, this task gd"
            ]
        );
        let softmax = TrainSpec {
            model: ModelKind::Softmax,
            ..TrainSpec::default()
        };
        assert_eq!(
            differences(&published, &agreed_flags(&softmax)),
            [
                "--model: the chief has mlp, this task softmax",
                "--hidden: the chief has 128, this task none"
            ]
        );
    }
}
