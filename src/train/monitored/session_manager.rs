//! Getting a session whose model is ready: TensorFlow's `SessionManager`.
//!
//! The chief creates a session and initialises the model (restoring it from a checkpoint when
//! the injected restore callback finds one, otherwise running `init_op`), runs `local_init_op`
//! and checks that nothing is left uninitialized. Other workers create a session and poll the
//! [`ReadyOp`] until the chief has initialised every variable, logging what they wait for,
//! and give up with DEADLINE_EXCEEDED naming the missing variables once `max_wait` has passed
//! (TensorFlow sleeps 30 s per poll and says only "Session was not ready").

use std::sync::Arc;
use std::time::Duration;

use crate::client::Session;
use crate::error::{Result, Status};
use crate::graph::builder::Variable;

use super::Clock;

/// Creates a fresh session on the master (TensorFlow's `SessionCreator` minus the model
/// preparation): called again after a preemption, so it must build a new session each time,
/// with the graph already extended into it.
pub type CreateSession = Box<dyn FnMut() -> Result<Session> + Send>;

/// Restores the model from the latest checkpoint into a session; returns whether it restored
/// anything (`false`: no checkpoint yet, so the chief runs `init_op`).
pub type RestoreFn = Arc<dyn Fn(&Session) -> Result<bool> + Send + Sync>;

/// Reports the variables that are not initialized (TensorFlow's `ready_op`, computed from one
/// `VarIsInitializedOp` per variable; an empty report means the model is ready).
#[derive(Clone, Debug, Default)]
pub struct ReadyOp {
    /// `(variable name, VarIsInitializedOp tensor name)` pairs.
    checks: Vec<(String, String)>,
    /// 1-D string tensors listing uninitialized names (TensorFlow's
    /// `report_uninitialized_variables` output), when the graph has one.
    reports: Vec<String>,
}

impl ReadyOp {
    /// Checks these variables through the `<name>/IsInitialized/VarIsInitializedOp` nodes
    /// that [`Graph::variable`](crate::graph::builder::Graph::variable) creates.
    pub fn for_variables(variables: &[&Variable]) -> Self {
        let checks = variables
            .iter()
            .map(|v| {
                let name = v.handle.node.clone();
                let tensor = format!("{name}/IsInitialized/VarIsInitializedOp:0");
                (name, tensor)
            })
            .collect();
        Self {
            checks,
            reports: Vec::new(),
        }
    }

    /// Also reads the 1-D string tensor `report` (names of uninitialized variables, empty when
    /// ready), as TensorFlow's `ready_op` is.
    pub fn with_report(mut self, report: &str) -> Self {
        self.reports.push(report.to_string());
        self
    }

    /// Checks `variable` through the boolean scalar tensor `is_initialized`.
    pub fn with_check(mut self, variable: &str, is_initialized: &str) -> Self {
        self.checks
            .push((variable.to_string(), is_initialized.to_string()));
        self
    }

    /// Returns the names of the variables not yet initialized in `session`, in check order.
    pub fn uninitialized(&self, session: &Session) -> Result<Vec<String>> {
        if self.checks.is_empty() && self.reports.is_empty() {
            return Ok(Vec::new());
        }
        let fetches: Vec<&str> = self
            .checks
            .iter()
            .map(|(_, t)| t.as_str())
            .chain(self.reports.iter().map(String::as_str))
            .collect();
        let values = session
            .run(&[], &fetches, &[])
            .map_err(|e| e.context("checking whether the model is ready"))?;
        let mut missing = Vec::new();
        for ((name, tensor), value) in self.checks.iter().zip(&values) {
            let ready: bool = value.scalar_value().map_err(|e| {
                e.context(format!(
                    "ready check `{tensor}` for `{name}` must be a bool scalar"
                ))
            })?;
            if !ready {
                missing.push(name.clone());
            }
        }
        for (report, value) in self.reports.iter().zip(&values[self.checks.len()..]) {
            let names = value.strings().map_err(|e| {
                e.context(format!(
                    "ready report `{report}` must be a 1-D string tensor"
                ))
            })?;
            missing.extend(
                names
                    .iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned()),
            );
        }
        Ok(missing)
    }
}

/// The ops that prepare a model (TensorFlow's `Scaffold`, without the saver and summaries).
#[derive(Clone, Debug, Default)]
pub struct Scaffold {
    /// Initialises the model when nothing was restored (e.g. `global_variables_initializer`).
    pub init_op: Option<String>,
    /// Runs in every new session after the model is ready (local variables, tables).
    pub local_init_op: Option<String>,
    /// Says which variables are still uninitialized.
    pub ready_op: ReadyOp,
}

/// Makes sessions whose model is ready, as chief or as a waiting worker.
pub struct SessionManager {
    create: CreateSession,
    scaffold: Scaffold,
    is_chief: bool,
    restore: Option<RestoreFn>,
    /// Whether the chief prepared a session before: a later one (a recovery) keeps a model
    /// that is still ready.
    prepared: bool,
    /// How long a worker sleeps between readiness polls.
    pub recovery_wait: Duration,
    /// How long a worker waits for the chief in all before DEADLINE_EXCEEDED.
    pub max_wait: Duration,
    clock: Arc<dyn Clock>,
}

impl SessionManager {
    /// A manager creating sessions with `create`; a chief initialises the model, a worker
    /// waits for it (polling every second for up to 30 s unless changed).
    pub fn new(create: CreateSession, scaffold: Scaffold, is_chief: bool) -> Self {
        Self {
            create,
            scaffold,
            is_chief,
            restore: None,
            prepared: false,
            recovery_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(30),
            clock: Arc::new(super::SystemClock),
        }
    }

    /// The chief restores through `restore` before falling back to `init_op`.
    pub fn with_restore(mut self, restore: RestoreFn) -> Self {
        self.restore = Some(restore);
        self
    }

    /// Polls every `interval`, giving up after `max_wait`.
    pub fn with_wait(mut self, interval: Duration, max_wait: Duration) -> Self {
        self.recovery_wait = interval;
        self.max_wait = max_wait;
        self
    }

    /// Measures and sleeps through `clock` (tests inject one that does not really sleep).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Whether this manager initialises the model.
    pub fn is_chief(&self) -> bool {
        self.is_chief
    }

    /// Returns the clock the manager sleeps on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A new session with a ready model: prepared by the chief, waited for by a worker.
    pub fn create_session(&mut self) -> Result<Session> {
        if self.is_chief {
            self.prepare_session()
        } else {
            self.wait_for_session()
        }
    }

    /// The chief's preparation: restore or `init_op`, then `local_init_op`, then the ready
    /// check, which must find nothing uninitialized.
    ///
    /// A recovery (every session after the chief's first) first checks whether the model is
    /// still ready: when the variables outlived the failure (a worker or the chief's session
    /// was lost, or a ps task's standby took over with its copy), they are kept as they are,
    /// where TensorFlow's chief would restore the last checkpoint and roll back every update
    /// since.
    pub fn prepare_session(&mut self) -> Result<Session> {
        let session = (self.create)()?;
        if self.prepared && self.scaffold.ready_op.uninitialized(&session)?.is_empty() {
            self.run_local_init(&session)?;
            tracing::info!("chief kept the model, still ready after the failure");
            return Ok(session);
        }
        let restored = match &self.restore {
            Some(restore) => restore(&session).map_err(|e| e.context("restoring the model"))?,
            None => false,
        };
        if !restored {
            match &self.scaffold.init_op {
                Some(init) => {
                    session
                        .run(&[], &[], &[init])
                        .map_err(|e| e.context(format!("running init_op `{init}`")))?;
                }
                None => {
                    return Err(Status::failed_precondition(
                        "The chief has no checkpoint to restore and no init_op; give the \
                         scaffold an init_op (e.g. global_variables_initializer) or a restore \
                         callback that finds a checkpoint",
                    ))
                }
            }
        }
        self.run_local_init(&session)?;
        let missing = self.scaffold.ready_op.uninitialized(&session)?;
        if !missing.is_empty() {
            return Err(Status::failed_precondition(format!(
                "Init operations did not make model ready: {} still uninitialized; add their \
                 initializers to init_op",
                missing.join(", ")
            )));
        }
        tracing::info!(restored, "chief prepared the model");
        self.prepared = true;
        Ok(session)
    }

    /// A worker's wait: a fresh session per poll until the ready check reports nothing
    /// missing, then `local_init_op`. DEADLINE_EXCEEDED names what was still missing.
    pub fn wait_for_session(&mut self) -> Result<Session> {
        let started = self.clock.now();
        loop {
            let session = (self.create)()?;
            let missing = self.scaffold.ready_op.uninitialized(&session)?;
            if missing.is_empty() {
                self.run_local_init(&session)?;
                return Ok(session);
            }
            let _ = session.close();
            let waited = self.clock.now().saturating_sub(started);
            if waited + self.recovery_wait > self.max_wait {
                return Err(Status::deadline_exceeded(format!(
                    "model not ready after {} s: waiting for {} to be initialized by the chief; \
                     check that the chief is running, or raise the wait",
                    self.max_wait.as_secs_f64(),
                    missing.join(", ")
                )));
            }
            tracing::info!(
                waiting_for = %missing.join(", "),
                waited_s = waited.as_secs_f64(),
                "waiting for the chief to initialize the model"
            );
            self.clock.sleep(self.recovery_wait);
        }
    }

    fn run_local_init(&self, session: &Session) -> Result<()> {
        if let Some(op) = &self.scaffold.local_init_op {
            session
                .run(&[], &[], &[op])
                .map_err(|e| e.context(format!("running local_init_op `{op}`")))?;
        }
        Ok(())
    }
}
