//! A ps task's standby: a second daemon that holds a copy of the task's variable shards, kept
//! current before any step that changed them is acknowledged, and that takes the task over
//! when it dies.
//!
//! Two daemons stand for one ps task (`/job:ps/task:i` in the `ps` job, its standby in the
//! `ps_standby` job of the cluster file, same index). Both are that task (same device names);
//! one is the **primary** and serves the WorkerService, the other the **standby**, which
//! refuses steps (UNAVAILABLE, naming its partner) and stores what the primary sends.
//!
//! ```text
//!  RunGraph ──► primary: the partition runs, its kernels write the shards
//!                  │ commit(step): wait for a batch taken after the step's writes
//!                  ▼
//!             pump: every variable whose write count moved ──Replicate──► standby stores it
//!                  │ the standby's answer
//!                  ▼
//!             RunGraph answers: the step's updates are on two hosts
//! ```
//!
//! - **State, not operations.** A batch carries the values of the variables written since the
//!   last batch ([`Var::writes`]), each read with what changed in it ([`Var::take_changes`]):
//!   the whole value, or only the rows a sparse update or a scatter wrote (an embedding
//!   table's few rows, not the table). The standby's copy is then the primary's at that
//!   instant. Steps that finish while a batch is in flight share the next one (group
//!   commit), so the cost grows with the bytes written, not with the number of steps. A batch
//!   carries the ids of the steps it covers and its sequence number: a replayed batch is
//!   skipped, and the standby counts every step id it stored and any it saw twice.
//! - **Catch-up.** The first batch to a standby that holds no copy (a new one, a restarted one,
//!   one that missed a batch) is whole: every variable of every shard.
//! - **Failover.** A caller that finds the primary unreachable asks the standby to take over
//!   ([`ReplicaState::promote`]); the standby does so only when the primary does not answer it
//!   either. Steps in flight fail with UNAVAILABLE and the monitored sessions retry them on the
//!   new primary. A promoted standby refuses batches from its old primary.
//! - **Rejoin.** A task starting asks its partner first ([`ReplicaState::join`]): a partner
//!   that is primary, or a standby that holds a copy (its primary was this task's last life),
//!   keeps the variables, and the starting task becomes its standby.
//! - **A dead standby** does not stop training: the primary logs it, sets
//!   `tessera_replica_standby_up` to 0 and acknowledges steps on its own without waiting,
//!   trying a whole copy in the background once a second until one lands.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tonic::{Request, Response};
use tracing::{info, warn};

use crate::cluster::ReplicaConfig;
use crate::error::{Code, Result, Status};
use crate::proto::replica::replica_service_client::ReplicaServiceClient;
use crate::proto::replica::replica_service_server::ReplicaService;
use crate::proto::replica::{
    PromoteRequest, PromoteResponse, ReplicaStatusRequest, ReplicaStatusResponse, ReplicateRequest,
    ReplicateResponse, Role, VariableValue,
};
use crate::runtime::resource::{ResourceMgr, Var};
use crate::security::AuthChannel;
use crate::tensor::var::Changes;
use crate::tensor::Tensor;

use super::ShardState;

/// Replication counters and gauges, each labelled with the `task`.
pub mod names {
    /// Standbys that took their task over (counter).
    pub const PROMOTIONS: &str = "tessera_replica_promotions_total";
    /// Time from taking a batch to the standby's answer: the replication lag a step waits
    /// (histogram).
    pub const REPLICATE_SECONDS: &str = "tessera_replica_replicate_duration_seconds";
    /// 1 while the primary's standby holds a current copy, 0 while it is down or catching up
    /// (gauge).
    pub const STANDBY_UP: &str = "tessera_replica_standby_up";
    /// Step ids a standby stored (counter).
    pub const STEPS: &str = "tessera_replica_steps_total";
    /// Step ids a standby was sent a second time and skipped (counter).
    pub const REPLAYED_STEPS: &str = "tessera_replica_replayed_steps_total";
}

/// How long a primary waits before trying a dead standby again.
const RETRY_DEAD_STANDBY: Duration = Duration::from_secs(1);
/// How long a standby asked to take over waits for its primary to answer.
const PROBE_PRIMARY: Duration = Duration::from_millis(750);
/// Step ids a standby remembers, to spot one sent twice.
const REMEMBERED_STEPS: usize = 1 << 16;

/// A variable: its shard's device, its container and its name.
type VarKey = (String, String, String);

/// One daemon's side of a ps task's pair: its role, the primary's pump and the standby's
/// store, over the task's shard stores. Plain state: the tonic front ([`ReplicaGrpc`]) and the
/// worker call it.
pub struct ReplicaState {
    config: ReplicaConfig,
    label: String,
    incarnation: u64,
    shards: Vec<ShardState>,
    partner: ReplicaServiceClient<AuthChannel>,
    rpc_timeout: Duration,
    state: Mutex<State>,
    /// What the last batch that reached the standby held: each variable's identity and write
    /// count. Only the pump touches it.
    sent: tokio::sync::Mutex<HashMap<VarKey, (usize, u64)>>,
}

struct State {
    role: Role,
    // The primary's side.
    waiting: Vec<(i64, oneshot::Sender<Result<()>>)>,
    pumping: bool,
    partner_synced: bool,
    next_sequence: u64,
    /// The standby is down: steps are acknowledged alone, and a whole copy is tried again
    /// from then on.
    retry_at: Option<Instant>,
    /// The pump's next batch is such a try, whether or not a step waits for it.
    probe: bool,
    /// The takeovers before the primary this daemon serves as or follows (see `epoch` in
    /// `replica.proto`).
    epoch: u64,
    // The standby's side.
    following: u64,
    stored_sequence: u64,
    synced: bool,
    seen: HashSet<i64>,
    seen_order: VecDeque<i64>,
    steps_stored: u64,
    steps_replayed: u64,
    /// The partner said the chief ended training.
    training_over: bool,
}

impl ReplicaState {
    /// The pair's side of this daemon, over `shards` (handles onto the task's shard stores),
    /// reaching the other daemon through `partner`. It starts as a standby holding no copy;
    /// [`join`](Self::join) settles its role.
    pub fn new(
        config: ReplicaConfig,
        incarnation: u64,
        shards: Vec<ShardState>,
        partner: ReplicaServiceClient<AuthChannel>,
        rpc_timeout: Duration,
    ) -> Self {
        Self {
            label: config.task.device_prefix(),
            config,
            incarnation,
            shards,
            partner,
            rpc_timeout,
            state: Mutex::new(State {
                role: Role::Standby,
                waiting: Vec::new(),
                pumping: false,
                partner_synced: false,
                next_sequence: 1,
                retry_at: None,
                probe: false,
                epoch: 0,
                following: 0,
                stored_sequence: 0,
                synced: false,
                seen: HashSet::new(),
                seen_order: VecDeque::new(),
                steps_stored: 0,
                steps_replayed: 0,
                training_over: false,
            }),
            sent: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Returns this daemon's role now.
    pub fn role(&self) -> Role {
        self.lock().role
    }

    /// OK while this daemon serves the task; UNAVAILABLE naming the partner while it stands by.
    pub fn check_serving(&self, rpc: &str) -> Result<()> {
        if self.role() == Role::Primary {
            return Ok(());
        }
        Err(Status::unavailable(format!(
            "{rpc}: {} at {} is the standby of the task; its primary is at {}",
            self.label, self.config.own, self.config.partner
        )))
    }

    /// Settles this daemon's role as it starts: the partner keeps the variables when it is the
    /// primary, or a standby holding a copy (whose primary was this task before it restarted:
    /// the partner takes over); otherwise the cluster file's role.
    pub async fn join(&self) -> Role {
        let asked = self.partner_status(true).await;
        let role = match asked {
            Ok(status) if status.role() == Role::Primary => Role::Standby,
            Ok(status) if status.role() == Role::Standby && status.synced => {
                let reason = format!("{} restarted at {}", self.label, self.config.own);
                match self.ask_partner_to_promote(&reason).await {
                    Ok(()) => Role::Standby,
                    Err(e) => {
                        warn!(task = %self.label, error = %e, "the standby holding the copy did not take over");
                        self.configured()
                    }
                }
            }
            _ => self.configured(),
        };
        let mut state = self.lock();
        // A promotion asked of this daemon meanwhile wins.
        if state.role != Role::Primary {
            state.role = role;
        }
        let role = state.role;
        drop(state);
        info!(task = %self.label, role = ?role, partner = %self.config.partner, "joined the ps task's pair");
        if role == Role::Primary {
            self.set_standby_up(false);
        }
        role
    }

    fn configured(&self) -> Role {
        if self.config.standby {
            Role::Standby
        } else {
            Role::Primary
        }
    }

    /// Waits until the writes of step `step_id` (finished before this call) are on the
    /// standby, or the standby is known down. UNAVAILABLE when this daemon lost the task to
    /// its standby meanwhile.
    pub async fn commit(self: &Arc<Self>, step_id: i64) -> Result<()> {
        let reply = {
            let mut state = self.lock();
            if state.role != Role::Primary {
                drop(state);
                return self.check_serving("RunGraph");
            }
            // The standby is down: the step does not wait for it. Once a second, a whole copy
            // is tried in the background; the standby holds the task's state again when it
            // lands.
            if let Some(at) = state.retry_at {
                if Instant::now() >= at && !state.pumping {
                    state.pumping = true;
                    state.probe = true;
                    state.retry_at = Some(Instant::now() + RETRY_DEAD_STANDBY);
                    let this = Arc::clone(self);
                    tokio::spawn(async move { this.pump().await });
                }
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            state.waiting.push((step_id, tx));
            if !state.pumping {
                state.pumping = true;
                let this = Arc::clone(self);
                tokio::spawn(async move { this.pump().await });
            }
            rx
        };
        reply
            .await
            .unwrap_or_else(|_| Err(Status::internal("the replication pump stopped")))
    }

    /// Sends batches while steps wait for one.
    async fn pump(self: Arc<Self>) {
        let mut waiters = Vec::new();
        loop {
            let (full, (sequence, epoch)) = {
                let mut state = self.lock();
                waiters.append(&mut state.waiting);
                let probe = std::mem::take(&mut state.probe);
                if (waiters.is_empty() && !probe) || state.role != Role::Primary {
                    state.pumping = false;
                    let role = state.role;
                    drop(state);
                    self.answer(waiters, role);
                    return;
                }
                let sequence = state.next_sequence;
                state.next_sequence += 1;
                (!state.partner_synced, (sequence, state.epoch))
            };
            let step_ids: Vec<i64> = waiters.iter().map(|(id, _)| *id).collect();
            let started = Instant::now();
            let result = self.send_batch(full, sequence, epoch, step_ids).await;
            crate::ops::metrics::seconds(names::REPLICATE_SECONDS, &self.label, started.elapsed());
            let mut state = self.lock();
            let mut standby_up = None;
            match result {
                Ok(()) => {
                    if !state.partner_synced {
                        info!(task = %self.label, standby = %self.config.partner, "the standby holds a copy");
                    }
                    state.partner_synced = true;
                    state.retry_at = None;
                    standby_up = Some(true);
                }
                // The standby holds no copy (it restarted): the next batch is whole, at once.
                Err(e) if e.code() == Code::Aborted => {
                    state.partner_synced = false;
                    continue;
                }
                // The standby took the task over: this daemon is the standby now.
                Err(e) if e.code() == Code::FailedPrecondition => {
                    warn!(task = %self.label, error = %e, "the standby took the task over; standing by");
                    state.role = Role::Standby;
                    state.synced = false;
                    state.following = 0;
                }
                Err(e) => {
                    if state.partner_synced || state.retry_at.is_none() {
                        warn!(task = %self.label, standby = %self.config.partner, error = %e,
                            "the standby is down: steps are acknowledged by this task alone until it is back");
                    }
                    state.partner_synced = false;
                    state.retry_at = Some(Instant::now() + RETRY_DEAD_STANDBY);
                    standby_up = Some(false);
                }
            }
            let role = state.role;
            drop(state);
            if let Some(up) = standby_up {
                self.set_standby_up(up);
            }
            self.answer(std::mem::take(&mut waiters), role);
        }
    }

    /// Completes the waiting steps: stored (or the standby is down) while primary, UNAVAILABLE
    /// once this daemon lost the task.
    fn answer(&self, waiters: Vec<(i64, oneshot::Sender<Result<()>>)>, role: Role) {
        for (_, tx) in waiters {
            let _ = tx.send(if role == Role::Primary {
                Ok(())
            } else {
                self.check_serving("RunGraph")
            });
        }
    }

    /// Sends the variables written since the last batch (all of them when `full`).
    async fn send_batch(
        &self,
        full: bool,
        sequence: u64,
        epoch: u64,
        step_ids: Vec<i64>,
    ) -> Result<()> {
        let mut sent = self.sent.lock().await;
        let (variables, marks) = if full {
            self.whole_copy()?
        } else {
            self.changes_since(&sent)
        };
        if variables.is_empty() && !full {
            sent.extend(marks);
            return Ok(());
        }
        let mut request = Request::new(ReplicateRequest {
            incarnation: self.incarnation,
            sequence,
            full,
            step_ids,
            variables,
            epoch,
        });
        request.set_timeout(self.rpc_timeout);
        self.call_partner(
            "Replicate",
            self.rpc_timeout,
            move |mut partner| async move { partner.replicate(request).await },
        )
        .await?;
        if full {
            sent.clear();
        }
        sent.extend(marks);
        Ok(())
    }

    /// Every initialized variable of every shard, each shard's read at one instant (the
    /// shard's snapshot), and what each was when read.
    fn whole_copy(&self) -> Result<Batch> {
        let (mut variables, mut marks) = (Vec::new(), Vec::new());
        for shard in &self.shards {
            let listed = shard.resources().variables();
            let mut names = Vec::with_capacity(listed.len());
            for ((container, name), var) in &listed {
                // The count first, then the value: a write in between is sent again next time.
                let mark = (Arc::as_ptr(var) as usize, var.writes());
                // The copy covers whatever changed.
                let _ = var.take_changes();
                if var.is_initialized() {
                    names.push((container.as_str(), name.as_str()));
                    marks.push((
                        (shard.device().to_string(), container.clone(), name.clone()),
                        mark,
                    ));
                }
            }
            for ((container, name), value) in names.iter().zip(shard.snapshot(&names)?) {
                variables.push(variable_value(
                    shard.device(),
                    container,
                    name,
                    &value,
                    Vec::new(),
                ));
            }
        }
        Ok((variables, marks))
    }

    /// The variables whose write count moved since `sent`: whole, or only the rows a row
    /// update wrote when the standby holds the same variable and they are under half of it.
    fn changes_since(&self, sent: &HashMap<VarKey, (usize, u64)>) -> Batch {
        let (mut variables, mut marks) = (Vec::new(), Vec::new());
        for shard in &self.shards {
            for ((container, name), var) in shard.resources().variables() {
                let key = (shard.device().to_string(), container, name);
                // The count first, then the value: a write in between is sent again next time.
                let mark = (Arc::as_ptr(&var) as usize, var.writes());
                let known = sent.get(&key);
                if known == Some(&mark) {
                    continue;
                }
                let (value, changes) = var.take_changes();
                let Some(value) = value else {
                    continue;
                };
                let same_var = known.is_some_and(|(at, _)| *at == mark.0);
                let rows = match changes {
                    Changes::Rows(rows) if same_var => rows_of(&value, &rows),
                    _ => None,
                };
                let (value, rows) = match rows {
                    Some((_, rows)) if rows.is_empty() => {
                        marks.push((key, mark));
                        continue;
                    }
                    Some((part, rows)) => (part, rows),
                    None => (value, Vec::new()),
                };
                variables.push(variable_value(&key.0, &key.1, &key.2, &value, rows));
                marks.push((key, mark));
            }
        }
        (variables, marks)
    }

    /// Stores a batch from the primary (the standby's side of `Replicate`).
    pub fn store(&self, batch: ReplicateRequest) -> Result<ReplicateResponse> {
        let mut state = self.lock();
        if state.role == Role::Primary {
            if batch.epoch <= state.epoch {
                return Err(Status::failed_precondition(format!(
                    "{} at {} serves the task now (epoch {}); its old primary stands by",
                    self.label, self.config.own, state.epoch
                )));
            }
            // Both serve, and the other took the task over later: it keeps the task.
            warn!(task = %self.label, epoch = state.epoch, theirs = batch.epoch,
                "the partner serves the task from a later takeover; standing by");
            state.role = Role::Standby;
            state.synced = false;
            state.following = 0;
        }
        let fresh = batch.incarnation != state.following || !state.synced;
        if fresh && !batch.full {
            return Err(Status::aborted(format!(
                "the standby of {} at {} holds no copy yet; send a whole one",
                self.label, self.config.own
            )));
        }
        if !fresh && batch.sequence <= state.stored_sequence {
            state.steps_replayed += batch.step_ids.len() as u64;
            ::metrics::counter!(names::REPLAYED_STEPS, "task" => self.label.clone())
                .increment(batch.step_ids.len() as u64);
            return Ok(ReplicateResponse {
                stored_sequence: state.stored_sequence,
            });
        }
        let mut values = Vec::with_capacity(batch.variables.len());
        for variable in &batch.variables {
            let shard = self.shard_of(&variable.device)?;
            let value = variable
                .value
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("a replicated variable without a value"))
                .and_then(Tensor::from_proto)
                .map_err(|e| e.context(format!("variable `{}`", variable.name)))?;
            values.push((shard, variable, value));
        }
        if batch.full {
            // A whole copy replaces what this standby held, each variable admitted against
            // the shard's limits as the primary's were.
            self.drop_all_variables();
            for (shard, variable, value) in values {
                shard.create(&variable.container, &variable.name, value)?;
            }
        } else {
            self.store_changes(values)?;
        }
        let mut stored = 0;
        for id in batch.step_ids {
            if state.seen.insert(id) {
                state.seen_order.push_back(id);
                if state.seen_order.len() > REMEMBERED_STEPS {
                    if let Some(old) = state.seen_order.pop_front() {
                        state.seen.remove(&old);
                    }
                }
                stored += 1;
            } else {
                state.steps_replayed += 1;
                ::metrics::counter!(names::REPLAYED_STEPS, "task" => self.label.clone())
                    .increment(1);
            }
        }
        state.steps_stored += stored;
        ::metrics::counter!(names::STEPS, "task" => self.label.clone()).increment(stored);
        state.following = batch.incarnation;
        state.stored_sequence = batch.sequence;
        state.synced = true;
        state.epoch = batch.epoch;
        Ok(ReplicateResponse {
            stored_sequence: batch.sequence,
        })
    }

    /// Stores a batch's changes: the whole values of the variables this standby holds, each
    /// shard's at one instant (the shard's restore); new variables; the rows of row updates.
    fn store_changes(&self, values: Vec<(&ShardState, &VariableValue, Tensor)>) -> Result<()> {
        for shard in &self.shards {
            let mut whole = Vec::new();
            for (of, variable, value) in &values {
                if !std::ptr::eq(*of, shard) {
                    continue;
                }
                let held = shard
                    .resources()
                    .lookup::<Var>(&variable.container, &variable.name)
                    .is_ok();
                if !variable.rows.is_empty() {
                    self.store_rows(shard.resources().as_ref(), variable, value.clone())?;
                } else if held {
                    let name = (variable.container.as_str(), variable.name.as_str());
                    whole.push((name, value.clone()));
                } else {
                    shard.create(&variable.container, &variable.name, value.clone())?;
                }
            }
            if !whole.is_empty() {
                shard.restore(whole)?;
            }
        }
        Ok(())
    }

    /// Writes the rows a batch carries into the variable this standby holds; ABORTED (send a
    /// whole copy) when it holds none like it.
    fn store_rows(
        &self,
        store: &ResourceMgr,
        variable: &VariableValue,
        part: Tensor,
    ) -> Result<()> {
        let no_copy = || {
            Status::aborted(format!(
                "the standby of {} holds no copy of `{}` to update rows of; send a whole one",
                self.label, variable.name
            ))
        };
        let var = store
            .lookup::<Var>(&variable.container, &variable.name)
            .map_err(|_| no_copy())?;
        let mut guard = var.write();
        let value = guard.as_mut().ok_or_else(no_copy)?;
        write_rows(value, &variable.rows, &part).ok_or_else(no_copy)
    }

    fn shard_of(&self, device: &str) -> Result<&ShardState> {
        self.shards
            .iter()
            .find(|shard| shard.device() == device)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "the standby of {} has no device {device}; give both daemons the same \
                     [devices]",
                    self.label
                ))
            })
    }

    /// Takes the task over, when the primary does not answer this daemon either. A standby
    /// without a whole copy takes it over empty (the chief then restores the last checkpoint,
    /// as after a ps restart).
    pub async fn promote(&self, reason: &str) -> Result<Role> {
        if self.role() == Role::Primary {
            return Ok(Role::Primary);
        }
        let primary = self.partner_status(false).await;
        if let Ok(status) = primary {
            if status.role() == Role::Primary {
                return Err(Status::failed_precondition(format!(
                    "{} at {} still answers as the primary; its standby at {} does not take \
                     over ({reason})",
                    self.label, self.config.partner, self.config.own
                )));
            }
        }
        {
            let mut state = self.lock();
            if state.role == Role::Primary {
                return Ok(Role::Primary);
            }
            if !state.synced {
                warn!(task = %self.label, "taking the task over without a whole copy: its variables start empty");
                self.drop_all_variables();
            }
            state.role = Role::Primary;
            state.epoch += 1;
            state.partner_synced = false;
            state.retry_at = None;
            state.next_sequence = 1;
        }
        self.sent.lock().await.clear();
        ::metrics::counter!(names::PROMOTIONS, "task" => self.label.clone()).increment(1);
        self.set_standby_up(false);
        warn!(task = %self.label, address = %self.config.own, reason, "the standby took the task over");
        Ok(Role::Primary)
    }

    /// This daemon's role for a partner's question; a joining partner gets a whole copy next,
    /// and a partner saying training is over is remembered.
    pub fn status(&self, request: &ReplicaStatusRequest) -> ReplicaStatusResponse {
        let mut state = self.lock();
        if request.joining && state.role == Role::Primary {
            state.partner_synced = false;
            state.retry_at = None;
        }
        state.training_over |= request.training_over;
        ReplicaStatusResponse {
            role: state.role as i32,
            synced: state.role == Role::Standby && state.synced,
            incarnation: self.incarnation,
            steps_stored: state.steps_stored,
            steps_replayed: state.steps_replayed,
            training_over: state.training_over,
            epoch: state.epoch,
        }
    }

    /// Asks the partner its role, saying whether this daemon is joining.
    async fn partner_status(&self, joining: bool) -> Result<ReplicaStatusResponse> {
        let mut request = Request::new(ReplicaStatusRequest {
            joining,
            incarnation: self.incarnation,
            training_over: false,
        });
        request.set_timeout(PROBE_PRIMARY);
        self.call_partner(
            "ReplicaStatus",
            PROBE_PRIMARY,
            move |mut partner| async move { partner.replica_status(request).await },
        )
        .await
    }

    async fn ask_partner_to_promote(&self, reason: &str) -> Result<()> {
        let mut request = Request::new(PromoteRequest {
            reason: reason.to_string(),
        });
        request.set_timeout(self.rpc_timeout);
        self.call_partner("Promote", self.rpc_timeout, move |mut partner| async move {
            partner.promote(request).await
        })
        .await
        .map(|_| ())
    }

    /// Runs one call to the partner, which must answer within `timeout` (the callers send it
    /// as `grpc-timeout` too, so the partner stops working on it then).
    async fn call_partner<T, F>(
        &self,
        rpc: &str,
        timeout: Duration,
        call: impl FnOnce(ReplicaServiceClient<AuthChannel>) -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(timeout, call(self.partner.clone())).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Status::from(status)),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the partner of {} at {} did not answer {rpc} within {timeout:?}",
                self.label, self.config.partner
            ))),
        }
    }

    /// Drops every variable of this daemon's shards (before a whole copy, or taking the task
    /// over without one).
    fn drop_all_variables(&self) {
        for shard in &self.shards {
            let store = shard.resources();
            for ((container, name), _) in store.variables() {
                let _ = store.delete(&container, &name);
            }
        }
    }

    fn set_standby_up(&self, up: bool) {
        ::metrics::gauge!(names::STANDBY_UP, "task" => self.label.clone()).set(if up {
            1.0
        } else {
            0.0
        });
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A batch's variables and what each was when read (its identity and write count).
type Batch = (Vec<VariableValue>, Vec<(VarKey, (usize, u64))>);

/// A variable of a batch: `value` whole, or the rows `rows` of it.
fn variable_value(
    device: &str,
    container: &str,
    name: &str,
    value: &Tensor,
    rows: Vec<i64>,
) -> VariableValue {
    VariableValue {
        device: device.to_string(),
        container: container.to_string(),
        name: name.to_string(),
        value: Some(value.to_proto()),
        rows,
    }
}

/// The rows `rows` of `value` stacked into one tensor, and their indices: `None` when the
/// value's elements are not plain bytes or the rows are half of it or more (the whole is as
/// cheap to send).
fn rows_of(value: &Tensor, rows: &BTreeSet<usize>) -> Option<(Tensor, Vec<i64>)> {
    let bytes = value.bytes()?;
    let dims = value.shape().dims();
    let (&count, inner) = dims.split_first()?;
    if rows.len() * 2 >= count {
        return None;
    }
    let row_bytes = bytes.len() / count.max(1);
    let mut part = Vec::with_capacity(rows.len() * row_bytes);
    for &row in rows {
        part.extend_from_slice(bytes.get(row * row_bytes..(row + 1) * row_bytes)?);
    }
    let mut shape = vec![rows.len()];
    shape.extend_from_slice(inner);
    let part = Tensor::from_bytes(value.dtype(), shape, part.into()).ok()?;
    Some((part, rows.iter().map(|&r| r as i64).collect()))
}

/// Replaces the rows `rows` of `value` by those of `part`, in place when nothing else holds
/// the value; `None` (and `value` untouched) when they do not fit it.
fn write_rows(value: &mut Tensor, rows: &[i64], part: &Tensor) -> Option<()> {
    let dims = value.shape().dims().to_vec();
    let (&count, inner) = dims.split_first()?;
    if part.dtype() != value.dtype() || part.shape().dims().get(1..)? != inner {
        return None;
    }
    let row_bytes = value.bytes()?.len() / count.max(1);
    let source = part.bytes()?;
    let rows: Vec<usize> = rows
        .iter()
        .map(|&r| usize::try_from(r).ok().filter(|&r| r < count))
        .collect::<Option<_>>()?;
    if source.len() != rows.len() * row_bytes {
        return None;
    }
    value
        .update_bytes_in_place(|buffer| {
            for (i, row) in rows.iter().enumerate() {
                buffer[row * row_bytes..(row + 1) * row_bytes]
                    .copy_from_slice(&source[i * row_bytes..(i + 1) * row_bytes]);
            }
        })
        .ok()
}

/// The ReplicaService gRPC front: one line per RPC into [`ReplicaState`].
#[derive(Clone)]
pub struct ReplicaGrpc(pub Arc<ReplicaState>);

#[tonic::async_trait]
impl ReplicaService for ReplicaGrpc {
    async fn replicate(
        &self,
        request: Request<ReplicateRequest>,
    ) -> std::result::Result<Response<ReplicateResponse>, tonic::Status> {
        Ok(Response::new(self.0.store(request.into_inner())?))
    }

    async fn promote(
        &self,
        request: Request<PromoteRequest>,
    ) -> std::result::Result<Response<PromoteResponse>, tonic::Status> {
        let role = self.0.promote(&request.into_inner().reason).await?;
        Ok(Response::new(PromoteResponse { role: role as i32 }))
    }

    async fn replica_status(
        &self,
        request: Request<ReplicaStatusRequest>,
    ) -> std::result::Result<Response<ReplicaStatusResponse>, tonic::Status> {
        Ok(Response::new(self.0.status(request.get_ref())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::TaskId;
    use crate::tensor::{DType, PartialShape};

    const CPU0: &str = "/job:ps/replica:0/task:0/device:CPU:0";

    /// A standby of ps task 0 whose primary (port 1 of loopback) never answers.
    fn standby() -> (ReplicaState, Arc<ResourceMgr>) {
        let store = Arc::new(ResourceMgr::new());
        let config = ReplicaConfig {
            task: TaskId::new("ps", 0),
            own: "127.0.0.1:2".into(),
            partner: "127.0.0.1:1".into(),
            standby: true,
        };
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1")
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy();
        let partner = ReplicaServiceClient::new(crate::security::Security::plain().attach(channel));
        let state = ReplicaState::new(
            config,
            7,
            vec![ShardState::over(CPU0, Arc::clone(&store))],
            partner,
            Duration::from_secs(1),
        );
        (state, store)
    }

    fn batch(sequence: u64, full: bool, steps: &[i64], w: f32) -> ReplicateRequest {
        ReplicateRequest {
            incarnation: 1,
            sequence,
            full,
            step_ids: steps.to_vec(),
            variables: vec![VariableValue {
                device: CPU0.into(),
                container: String::new(),
                name: "w".into(),
                value: Some(Tensor::from_vec([2], vec![w, w]).unwrap().to_proto()),
                rows: Vec::new(),
            }],
            epoch: 0,
        }
    }

    fn value(store: &ResourceMgr) -> Option<f32> {
        let var = store.lookup::<Var>("", "w").ok()?;
        Some(var.snapshot()?.values::<f32>().unwrap()[0])
    }

    #[tokio::test]
    async fn a_standby_stores_a_whole_copy_then_changes_and_skips_a_replay() {
        let (standby, store) = standby();
        // Without a copy, only a whole one is taken.
        let refused = standby.store(batch(1, false, &[10], 1.0)).unwrap_err();
        assert_eq!(refused.code(), Code::Aborted, "{refused}");
        standby.store(batch(1, true, &[10], 1.0)).unwrap();
        standby.store(batch(2, false, &[11, 12], 2.0)).unwrap();
        assert_eq!(value(&store), Some(2.0));
        assert_eq!(store.lookup::<Var>("", "w").unwrap().dtype, DType::Float);
        // The same batch again changes nothing and is counted as replayed.
        standby.store(batch(2, false, &[11, 12], 9.0)).unwrap();
        assert_eq!(value(&store), Some(2.0));
        let status = standby.status(&ReplicaStatusRequest::default());
        assert_eq!((status.steps_stored, status.steps_replayed), (3, 2));
        assert!(status.synced);
        assert_eq!(status.role(), Role::Standby);
        assert!(standby.check_serving("RunGraph").is_err());
    }

    #[tokio::test]
    async fn a_standby_whose_primary_is_gone_takes_over_with_its_copy() {
        let (standby, store) = standby();
        standby.store(batch(1, true, &[1], 4.0)).unwrap();
        assert_eq!(standby.promote("test").await.unwrap(), Role::Primary);
        assert_eq!(value(&store), Some(4.0));
        standby.check_serving("RunGraph").unwrap();
        // A promoted standby refuses its old primary's batches.
        let refused = standby.store(batch(2, false, &[2], 5.0)).unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    }

    #[tokio::test]
    async fn a_standby_promoted_while_catching_up_starts_empty() {
        // The primary died before the standby had a whole copy: what it holds may be half of
        // one, so it takes over empty and the chief restores the last checkpoint.
        let (standby, store) = standby();
        store
            .lookup_or_create::<Var>("", "stale", || {
                let var = Var::new(DType::Float, PartialShape::unknown());
                *var.write() = Some(Tensor::scalar(1.0f32));
                Ok(var)
            })
            .unwrap();
        assert_eq!(standby.promote("test").await.unwrap(), Role::Primary);
        assert!(store.variables().is_empty());
    }

    #[test]
    fn rows_travel_alone_and_land_in_place() {
        let value = Tensor::from_vec([4, 2], (0..8).map(|v| v as f32).collect()).unwrap();
        let (part, rows) = rows_of(&value, &BTreeSet::from([2])).unwrap();
        assert_eq!(rows, [2]);
        assert_eq!(part.values::<f32>().unwrap().as_ref(), [4.0, 5.0]);
        // Half the rows or more: the whole value is as cheap.
        assert!(rows_of(&value, &BTreeSet::from([0, 3])).is_none());

        let mut copy = Tensor::zeros(DType::Float, [4, 2]).unwrap();
        write_rows(&mut copy, &rows, &part).unwrap();
        assert_eq!(
            copy.values::<f32>().unwrap().as_ref(),
            [0.0, 0.0, 0.0, 0.0, 4.0, 5.0, 0.0, 0.0]
        );
        assert!(
            write_rows(&mut copy, &[9], &part).is_none(),
            "a row past the end"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_primary_sends_a_whole_copy_then_the_rows_a_sparse_update_wrote() {
        use crate::proto::replica::replica_service_server::ReplicaServiceServer;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let standby_addr = listener.local_addr().unwrap().to_string();
        let (standby, standby_store) = standby();
        let standby = Arc::new(standby);
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ReplicaServiceServer::new(ReplicaGrpc(Arc::clone(&standby))))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let store = Arc::new(ResourceMgr::new());
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{standby_addr}"))
            .unwrap()
            .connect_lazy();
        let primary = Arc::new(ReplicaState::new(
            ReplicaConfig {
                task: TaskId::new("ps", 0),
                own: "127.0.0.1:1".into(),
                partner: standby_addr,
                standby: false,
            },
            3,
            vec![ShardState::over(CPU0, Arc::clone(&store))],
            ReplicaServiceClient::new(crate::security::Security::plain().attach(channel)),
            Duration::from_secs(5),
        ));
        primary.lock().role = Role::Primary;
        let table = store
            .lookup_or_create::<Var>("", "table", || {
                Ok(Var::new(DType::Float, PartialShape::unknown()))
            })
            .unwrap();
        *table.write() = Some(Tensor::zeros(DType::Float, [100, 3]).unwrap());
        primary.commit(1).await.unwrap();
        let copy = || {
            standby_store
                .lookup::<Var>("", "table")
                .unwrap()
                .snapshot()
                .unwrap()
                .values::<f32>()
                .unwrap()
                .into_owned()
        };
        assert_eq!(copy(), vec![0.0; 300]);

        // A sparse update of row 7: it alone travels, and the copy equals the value.
        {
            let mut guard = table.write_rows();
            guard
                .as_mut()
                .unwrap()
                .update_in_place::<f32, _>(|v| v[21..24].copy_from_slice(&[1.0, 2.0, 3.0]))
                .unwrap();
            table.touched_rows(&[7]);
        }
        let (_, changes) = table.take_changes();
        assert_eq!(changes, Changes::Rows(BTreeSet::from([7])));
        table.touched_rows(&[7]);
        primary.commit(2).await.unwrap();
        assert_eq!(
            copy(),
            table
                .snapshot()
                .unwrap()
                .values::<f32>()
                .unwrap()
                .into_owned()
        );
        let status = standby.status(&ReplicaStatusRequest::default());
        assert_eq!((status.steps_stored, status.steps_replayed), (2, 0));
        serving.abort();
    }

    #[tokio::test]
    async fn a_primary_whose_standby_is_down_acknowledges_steps_alone_without_waiting() {
        // `standby()`'s partner (port 1 of loopback) refuses connections: a dead standby.
        let (primary, store) = standby();
        let primary = Arc::new(primary);
        primary.lock().role = Role::Primary;
        store
            .lookup_or_create::<Var>("", "w", || {
                let var = Var::new(DType::Float, PartialShape::unknown());
                *var.write() = Some(Tensor::scalar(1.0f32));
                Ok(var)
            })
            .unwrap();
        // The first step finds it down; the next ones do not wait for it.
        primary.commit(1).await.unwrap();
        assert!(primary.lock().retry_at.is_some());
        for step in 2..20 {
            primary.commit(step).await.unwrap();
            assert!(
                primary.lock().waiting.is_empty(),
                "step {step} waited for the standby"
            );
        }
    }

    #[tokio::test]
    async fn of_two_daemons_serving_the_later_takeover_keeps_the_task() {
        // This daemon serves from its first takeover (epoch 1)...
        let (daemon, store) = standby();
        daemon.store(batch(1, true, &[1], 4.0)).unwrap();
        assert_eq!(daemon.promote("test").await.unwrap(), Role::Primary);
        // ... so a partner that serves from none (it started while this one had taken over)
        // is refused, and stands by when told so.
        let refused = daemon.store(batch(1, true, &[2], 0.0)).unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
        assert_eq!(value(&store), Some(4.0));
        // A partner serving from a later takeover keeps the task: this daemon stands by and
        // takes its copy.
        let mut later = batch(1, true, &[3], 6.0);
        later.epoch = 2;
        daemon.store(later).unwrap();
        assert_eq!(daemon.role(), Role::Standby);
        assert_eq!(value(&store), Some(6.0));
        assert_eq!(daemon.status(&ReplicaStatusRequest::default()).epoch, 2);
    }
}
