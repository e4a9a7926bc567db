//! Synchronous replication: TensorFlow's `SyncReplicasOptimizer` built into the graph, and
//! the chief's aggregation loop ([`ChiefQueueRunner`]).
//!
//! Every worker builds the same graph (between-graph replication). For each variable, on the
//! variable's device, an accumulator shared as `<var>:0/grad_accum` collects the workers'
//! gradients tagged with their local step: a `ResourceConditionalAccumulator` for a dense
//! gradient, a `SparseConditionalAccumulator` for the rows of a sparse one
//! ([`GradientTensor::Slices`], an embedding table's), which then travel and add up as rows
//! and reach the wrapped optimizer's sparse update as rows, never as the table (TensorFlow's
//! `apply_indexed_slices_grad` / `take_indexed_slices_grad`). A FIFO queue `sync_token_q`
//! next to the global step hands out tokens. Node names follow `graph_sync.pbtxt` and what
//! TensorFlow 2.21's `SyncReplicasOptimizer` builds for an embedding:
//!
//! ```text
//! sync_rep_local_step               LOCAL variable per worker (its own container in-process)
//! AssignVariableOp                  local_step_init_op: local step := global step
//! sync_replicas/conditional_accumulator[_k], .../ResourceAccumulatorApplyGradient[_k]
//!                                   a dense gradient
//! sync_replicas/sparse_conditional_accumulator[_k], sync_replicas/Cast[_k] (int32 indices and
//! the dense shape to int64), .../SparseAccumulatorApplyGradient[_k]
//!                                   a sparse gradient
//! sync_token_q_Dequeue, AssignVariableOp_1, ReadVariableOp_2
//!                                   worker train op: after every apply, take a token and make
//!                                   it the local step (the barrier)
//! sync_replicas/ResourceAccumulatorTakeGradient[_k], .../SparseAccumulatorTakeGradient[_k]
//!                                   chief: wait for replicas_to_aggregate
//! <opt>/update_<var>/..., <opt>/update, <opt>      the update, then global_step += 1
//! Fill, sync_token_q_EnqueueMany    sync_op: tokens_per_step copies of the new global step
//! sync_replicas/SetGlobalStep[_k], sync_replicas/group_deps   chief_init_op (the sparse
//!                                   accumulators' through `AccumulatorSetGlobalStep`)
//! sync_token_q_Close, sync_token_q_Close_1          close (the second cancels pending enqueues)
//! ```
//!
//! One difference: TensorFlow declares a sparse accumulator's shape `()`, so its take reports
//! the dense shape's first dimension as -1 and checks no index against the table's rows.
//! tessera declares the variable's shape, as the dense path does: an index past the table is
//! refused where the gradients meet, and the dense shape handed on is the table's.
//!
//! A sparse accumulator averages row by row as TensorFlow's does (see
//! [`crate::runtime::accumulator`]): a row is divided by the number of gradients that had it,
//! not by `replicas_to_aggregate`.
//!
//! Backup workers: with `total_num_replicas > replicas_to_aggregate` the chief updates as soon
//! as `replicas_to_aggregate` gradients arrived; the late ones are stale (their local step is
//! behind the accumulator's) and dropped, and `tokens_per_step = max(total, aggregate)` tokens
//! let every worker go on. Unlike TensorFlow, nothing waits forever: the accumulators and the
//! token queue carry a wait (`_wait_timeout_ms`: 30 s unless set, twice that for the queue),
//! and the take (`_timeout_ms`) and the token dequeue (`timeout_ms`) carry it too, so that it
//! holds inside a remote step, whose own deadline is longer. With a replica gone and no backup
//! the chief's take fails with DEADLINE_EXCEEDED saying how many gradients arrived and, when
//! the replicas name themselves ([`SyncReplicasOptimizer::replica_id`]), which one sent none;
//! the [`ChiefQueueRunner`] closes the token queue, and the waiting workers end with
//! OUT_OF_RANGE. The token `Fill` and enqueue run on the global step's device, as in
//! TensorFlow, so an update involves the ps alone.
//!
//! In a monitored session, [`SyncReplicasHook`] does the rest of TensorFlow's
//! `make_session_run_hook`: local-step or chief init after each session creation, the init
//! tokens and the queue runner (on a session of its own, local or remote) on the chief, and
//! the closing of the token queue at the end.
//!
//! The update is the wrapped [`Optimizer`]'s `apply_gradient_tensors` on the averaged
//! gradients (gradient descent under `GradientDescent` unless
//! [`SyncReplicasOptimizer::wrapping`] names another), so momentum, Adam and the others keep
//! their slots next to their variables, and rows are applied as rows (`ResourceScatterAdd`,
//! `ResourceSparseApply*`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::client::{Session, SessionOptions};
use crate::error::{Code, Result, Status};
use crate::graph::attr::value;
use crate::graph::indexed_slices::{GradientTensor, IndexedSlices};
use crate::graph::{Graph, NodeSpec, Output, Variable};
use crate::proto::GraphDef;
use crate::runtime::Device;
use crate::tensor::{DType, PartialShape, Tensor};
use crate::train::monitored::{CreateSession, Hook, RunArgs, RunContext};
use crate::train::optimizer::Optimizer;

/// Builds synchronous-replica training around gradient descent.
#[derive(Clone, Debug)]
pub struct SyncReplicasOptimizer {
    optimizer: Optimizer,
    replicas_to_aggregate: usize,
    total_num_replicas: usize,
    wait: Option<Duration>,
    local_step_container: String,
    replica: Option<String>,
}

impl SyncReplicasOptimizer {
    /// Aggregates `replicas_to_aggregate` gradients per update out of `total_num_replicas`
    /// workers (`None`: as many as aggregated; more: backup workers).
    pub fn new(
        learning_rate: f64,
        replicas_to_aggregate: usize,
        total_num_replicas: Option<usize>,
    ) -> Result<Self> {
        Self::wrapping(
            Optimizer::gradient_descent(learning_rate),
            replicas_to_aggregate,
            total_num_replicas,
        )
    }

    /// Wraps `optimizer` (TensorFlow's `SyncReplicasOptimizer(opt, ...)`): the averaged
    /// gradients are applied through [`Optimizer::apply_gradients`], so any update rule works,
    /// its slots created next to their variables on the ps.
    pub fn wrapping(
        optimizer: Optimizer,
        replicas_to_aggregate: usize,
        total_num_replicas: Option<usize>,
    ) -> Result<Self> {
        if replicas_to_aggregate == 0 {
            return Err(Status::invalid_argument(
                "replicas_to_aggregate must be at least 1",
            ));
        }
        let total = total_num_replicas.unwrap_or(replicas_to_aggregate);
        if total == 0 {
            return Err(Status::invalid_argument(
                "total_num_replicas must be at least 1",
            ));
        }
        Ok(Self {
            optimizer,
            replicas_to_aggregate,
            total_num_replicas: total,
            wait: None,
            local_step_container: String::new(),
            replica: None,
        })
    }

    /// Bounds how long the chief waits for gradients and a worker for its token when the step
    /// has no deadline of its own (default [`crate::runtime::wait::DEFAULT_WAIT`]).
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Puts this worker's `sync_rep_local_step` in `container`. In TensorFlow the local step
    /// lives on each worker's own device; workers sharing one device in-process need distinct
    /// containers instead.
    pub fn local_step_container(mut self, container: &str) -> Self {
        self.local_step_container = container.to_string();
        self
    }

    /// Names this replica (e.g. `/job:worker/task:1`) on its gradients (the `_replica` attr of
    /// its `ResourceAccumulatorApplyGradient`s and `SparseAccumulatorApplyGradient`s), so that
    /// when it stops contributing the chief's timed-out take says which replica is missing.
    pub fn replica_id(mut self, replica: &str) -> Self {
        self.replica = Some(replica.to_string());
        self
    }

    /// Returns how many tokens the chief enqueues per update: `max(total, aggregate)`.
    pub fn tokens_per_step(&self) -> usize {
        self.total_num_replicas.max(self.replicas_to_aggregate)
    }

    /// Adds the synchronous training ops for `grads_and_vars` (dense gradients of float
    /// variables) and returns their names: [`apply_gradient_tensors`] of dense gradients.
    ///
    /// [`apply_gradient_tensors`]: Self::apply_gradient_tensors
    pub fn apply_gradients(
        &self,
        g: &mut Graph,
        grads_and_vars: &[(Output, Variable)],
        global_step: &Variable,
    ) -> Result<SyncReplicasOps> {
        let tensors: Vec<(GradientTensor, Variable)> = grads_and_vars
            .iter()
            .map(|(grad, var)| (GradientTensor::Dense(grad.clone()), var.clone()))
            .collect();
        self.apply_gradient_tensors(g, &tensors, global_step)
    }

    /// Adds the synchronous training ops for `grads_and_vars`, dense gradients and sparse ones
    /// (as [`Optimizer::compute_sparse_gradients`] gives an embedding table's), and returns
    /// their names. A sparse gradient is accumulated, averaged and applied as rows (see the
    /// module doc); its values must be float or double.
    pub fn apply_gradient_tensors(
        &self,
        g: &mut Graph,
        grads_and_vars: &[(GradientTensor, Variable)],
        global_step: &Variable,
    ) -> Result<SyncReplicasOps> {
        if grads_and_vars.is_empty() {
            return Err(Status::invalid_argument(
                "SyncReplicasOptimizer.apply_gradients needs at least one (gradient, variable)",
            ));
        }
        let wait = self.wait.unwrap_or(crate::runtime::wait::DEFAULT_WAIT);
        let wait_ms = timeout_ms(wait) as u64;
        let i64_scalar = PartialShape::new(Vec::<Option<usize>>::new());

        // The worker-local step, colocated with a NoOp on the worker (not on a ps).
        let local_anchor = g.group("NoOp", &[])?;
        let local_step = g.with_colocation(&local_anchor, |g| self.local_step_var(g))?;
        let gs_read = g.read_variable(&global_step.handle)?;
        let local_step_init = g.add_op(
            NodeSpec::new("AssignVariableOp")
                .input(&local_step.handle)
                .input(&gs_read)
                .attr("validate_shape", value::bool(true)),
        )?;
        g.with_control_dependencies(&[local_step_init.as_str()], |g| {
            g.read_variable(&local_step.handle)
        })?;

        // Per variable: accumulator, apply (workers), take (chief), all on the var's device.
        let mut accumulators = Vec::with_capacity(grads_and_vars.len());
        let mut applies = Vec::with_capacity(grads_and_vars.len());
        let mut averaged = Vec::with_capacity(grads_and_vars.len());
        let scope = g.with_name_scope("sync_replicas", |g| g.name_scope().to_string());
        g.with_name_scope(&format!("{scope}/"), |g| -> Result<()> {
            for (grad, var) in grads_and_vars {
                let (accum, apply, take) = match grad {
                    GradientTensor::Dense(grad) => {
                        let (accum, apply, take) = self.dense_accumulation(
                            g,
                            grad,
                            var,
                            &local_step,
                            wait,
                            Some(wait_ms),
                        )?;
                        (accum, apply, GradientTensor::Dense(take))
                    }
                    GradientTensor::Slices(slices) => {
                        let (accum, apply, take) = self.sparse_accumulation(
                            g,
                            slices,
                            var,
                            &local_step,
                            wait,
                            Some(wait_ms),
                        )?;
                        (accum, apply, GradientTensor::Slices(take))
                    }
                };
                accumulators.push(accum);
                applies.push(apply);
                averaged.push((take, var.clone()));
            }
            Ok(())
        })?;

        // The chief's update of the averaged gradients, then global_step += 1.
        let update_op = self.update(g, &averaged, global_step)?;

        // The token queue next to the global step.
        let gs_node = global_step.handle.node.clone();
        let queue = g.with_colocation(&gs_node, |g| {
            g.fifo_queue(
                "sync_token_q",
                &[DType::Int64],
                std::slice::from_ref(&i64_scalar),
                None,
                "sync_token_q",
                // A worker's token comes after the chief's take, which may itself wait
                // `wait`: twice as long lets the chief's error (naming the accumulator) and
                // its closing of the queue come first.
                Some(wait_ms.saturating_mul(2)),
            )
        })?;
        let apply_refs: Vec<&str> = applies.iter().map(String::as_str).collect();
        // The op's own `timeout_ms` bounds the wait inside a step with a longer deadline (a
        // remote step always has one); twice the take's wait, as for the queue's default.
        let token = g.with_control_dependencies(&apply_refs, |g| {
            g.with_colocation(&gs_node, |g| {
                g.add_node(
                    NodeSpec::new("QueueDequeueV2")
                        .name("sync_token_q_Dequeue")
                        .input(&queue)
                        .attr("component_types", value::dtype_list(&[DType::Int64]))
                        .attr("timeout_ms", value::int(wait_ms.saturating_mul(2) as i64)),
                )
            })
        })?;
        let assign_token = g.add_op(
            NodeSpec::new("AssignVariableOp")
                .input(&local_step.handle)
                .input(&token[0])
                .attr("validate_shape", value::bool(true)),
        )?;
        let train_op = g.with_control_dependencies(&[assign_token.as_str()], |g| {
            g.read_variable(&local_step.handle)
        })?;

        let (sync_op, global_step_after) =
            g.with_control_dependencies(&[update_op.as_str()], |g| -> Result<_> {
                // On the global step's device, as TensorFlow puts it: the whole update then
                // runs on the ps, with nothing to wait for from the chief's task.
                let gs_node = global_step.handle.node.clone();
                let (enqueue, read) = g.with_colocation(&gs_node, |g| -> Result<_> {
                    let fill = g.reserve_name("Fill");
                    let dims = g.const_i32(
                        &format!("{fill}/dims/"),
                        &[1],
                        &[self.tokens_per_step() as i32],
                    )?;
                    let read = g.with_name_scope(&format!("{fill}/"), |g| {
                        g.read_variable(&global_step.handle)
                    })?;
                    let tokens = g.add1(
                        NodeSpec::new("Fill")
                            .name(&format!("{fill}/"))
                            .input(&dims)
                            .input(&read),
                    )?;
                    let enqueue =
                        g.queue_enqueue_many("sync_token_q_EnqueueMany", &queue, &[tokens])?;
                    Ok((enqueue, read))
                })?;
                Ok((enqueue, read))
            })?;
        let close_op = g.queue_close("sync_token_q_Close", &queue, false)?;
        let cancel_close_op = g.queue_close("sync_token_q_Close", &queue, true)?;

        // chief_init_op: the local step, and every accumulator (both kinds) at the current
        // global step.
        let chief_init_op = g.with_name_scope(&format!("{scope}/"), |g| -> Result<String> {
            let mut deps = vec![local_step_init.clone()];
            for accum in &accumulators {
                let step = g.read_variable(&global_step.handle)?;
                deps.push(g.accumulator_set_global_step("SetGlobalStep", accum, &step)?);
            }
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            g.group("group_deps", &deps)
        })?;

        Ok(SyncReplicasOps {
            train_op: train_op.name(),
            sync_op,
            global_step_after: global_step_after.name(),
            update_op,
            chief_init_op,
            local_step_init_op: local_step_init,
            close_op,
            cancel_close_op,
            token_queue: queue,
            global_step: global_step.clone(),
            local_step,
            accumulators: accumulators.iter().map(|a| a.node.clone()).collect(),
            replicas_to_aggregate: self.replicas_to_aggregate,
            total_num_replicas: self.total_num_replicas,
        })
    }

    /// A dense gradient's accumulator (`conditional_accumulator`), its apply (the workers')
    /// and its take of `replicas_to_aggregate` gradients (the chief's), all next to `var`.
    fn dense_accumulation(
        &self,
        g: &mut Graph,
        grad: &Output,
        var: &Variable,
        local_step: &Variable,
        wait: Duration,
        wait_ms: Option<u64>,
    ) -> Result<(Output, String, Output)> {
        let var_node = var.handle.node.clone();
        let accum = g.with_colocation(&var_node, |g| {
            g.conditional_accumulator(
                "conditional_accumulator",
                grad.dtype,
                &grad.shape,
                &format!("{var_node}:0/grad_accum"),
                "MEAN",
                wait_ms,
            )
        })?;
        let step = g.read_variable(&local_step.handle)?;
        g.with_colocation(&var_node, |g| -> Result<_> {
            let apply = match &self.replica {
                None => g.accumulator_apply_gradient(&accum, &step, grad)?,
                Some(replica) => g.add_op(
                    NodeSpec::new("ResourceAccumulatorApplyGradient")
                        .input(&accum)
                        .input(&step)
                        .input(grad)
                        .attr("_replica", value::string(replica)),
                )?,
            };
            // `_timeout_ms` bounds the take even inside a step with a longer deadline.
            let take = g.accumulator_take_gradient(
                &accum,
                self.replicas_to_aggregate as i32,
                grad.dtype,
                &[("_timeout_ms", value::int(timeout_ms(wait)))],
            )?;
            Ok((accum.clone(), apply, take))
        })
    }

    /// A sparse gradient's accumulator (`sparse_conditional_accumulator`, declared with the
    /// variable's shape), its apply (the workers': the indices and the dense shape cast to
    /// int64 first, as TensorFlow's `apply_grad` casts them) and its take (the chief's),
    /// whose rows go on to the wrapped optimizer; all next to `var`.
    fn sparse_accumulation(
        &self,
        g: &mut Graph,
        slices: &IndexedSlices,
        var: &Variable,
        local_step: &Variable,
        wait: Duration,
        wait_ms: Option<u64>,
    ) -> Result<(Output, String, IndexedSlices)> {
        let var_node = var.handle.node.clone();
        let dtype = slices.values.dtype;
        if !matches!(dtype, DType::Float | DType::Double) {
            return Err(Status::invalid_argument(format!(
                "the sparse gradient of variable `{var_node}` is {dtype}; synchronous replicas \
                 accumulate sparse gradients of float or double only \
                 (SparseConditionalAccumulator), so train a float or double variable"
            )));
        }
        let accum = g.with_colocation(&var_node, |g| {
            g.sparse_conditional_accumulator(
                "sparse_conditional_accumulator",
                dtype,
                &var.value.shape,
                &format!("{var_node}:0/grad_accum"),
                "MEAN",
                wait_ms,
            )
        })?;
        let step = g.read_variable(&local_step.handle)?;
        g.with_colocation(&var_node, |g| -> Result<_> {
            let int64 = |g: &mut Graph, t: &Output| match t.dtype {
                DType::Int64 => Ok(t.clone()),
                _ => g.cast(t, DType::Int64),
            };
            let rows = IndexedSlices {
                indices: int64(g, &slices.indices)?,
                values: slices.values.clone(),
                dense_shape: int64(g, &slices.dense_shape)?,
            };
            let replica: Vec<(&str, crate::proto::AttrValue)> = match &self.replica {
                Some(replica) => vec![("_replica", value::string(replica))],
                None => Vec::new(),
            };
            let apply = g.sparse_accumulator_apply_gradient(&accum, &step, &rows, &replica)?;
            let take = g.sparse_accumulator_take_gradient(
                &accum,
                self.replicas_to_aggregate as i32,
                dtype,
                &[("_timeout_ms", value::int(timeout_ms(wait)))],
            )?;
            Ok((accum.clone(), apply, take))
        })
    }

    /// `sync_rep_local_step`: a local int64 variable initialised to 0 (not in the global
    /// initializer: each worker initialises its own through `local_step_init_op`).
    fn local_step_var(&self, g: &mut Graph) -> Result<Variable> {
        let init = g.constant_proto(
            "sync_rep_local_step/Initializer/initial_value",
            Tensor::scalar(0i64).to_proto(),
        )?;
        let handle = g.add1(
            NodeSpec::new("VarHandleOp")
                .name("sync_rep_local_step")
                .attr("dtype", value::dtype(DType::Int64))
                .attr(
                    "shape",
                    value::shape(&PartialShape::new(Vec::<Option<usize>>::new())),
                )
                .attr("container", value::string(&self.local_step_container))
                .attr("shared_name", value::string("sync_rep_local_step"))
                .attr("debug_name", value::string("sync_rep_local_step/")),
        )?;
        let (initializer, value) = g.with_name_scope("sync_rep_local_step/", |g| -> Result<_> {
            g.with_name_scope("IsInitialized", |g| {
                g.add1(NodeSpec::new("VarIsInitializedOp").input(&handle))
            })?;
            let assign = g.add_op(
                NodeSpec::new("AssignVariableOp")
                    .name("Assign")
                    .input(&handle)
                    .input(&init),
            )?;
            let read = g.with_name_scope("Read", |g| g.read_variable(&handle))?;
            Ok((assign, read))
        })?;
        Ok(Variable {
            handle,
            initializer,
            value,
        })
    }

    /// The wrapped optimizer's update of the averaged gradients (`<opt>/update_<var>/...`,
    /// slots colocated with their variables, rows applied as rows), then `<opt>`
    /// (global_step += 1); returns the latter.
    fn update(
        &self,
        g: &mut Graph,
        averaged: &[(GradientTensor, Variable)],
        global_step: &Variable,
    ) -> Result<String> {
        let pairs: Vec<(Option<GradientTensor>, Variable)> = averaged
            .iter()
            .map(|(grad, var)| (Some(grad.clone()), var.clone()))
            .collect();
        g.with_name_scope("", |g| {
            self.optimizer
                .apply_gradient_tensors(g, &pairs, Some(global_step))
        })
    }
}

/// A take's `_timeout_ms`: `wait` in milliseconds, at least 1.
fn timeout_ms(wait: Duration) -> i64 {
    wait.as_millis().clamp(1, i64::MAX as u128) as i64
}

/// The names of what [`SyncReplicasOptimizer::apply_gradient_tensors`] added.
#[derive(Clone, Debug)]
pub struct SyncReplicasOps {
    /// The worker's train op, a tensor (`ReadVariableOp_2:0`): applies its gradients, waits for
    /// a token and returns the new local step. Fetch it.
    pub train_op: String,
    /// The chief's aggregation step (a target): take, update, enqueue the next tokens.
    pub sync_op: String,
    /// The global step after the update, readable in the same run as `sync_op`.
    pub global_step_after: String,
    /// The update plus the global-step increment.
    pub update_op: String,
    /// The chief's init: its local step and every accumulator's global step.
    pub chief_init_op: String,
    /// A non-chief worker's init: its local step from the global step.
    pub local_step_init_op: String,
    /// Closes the token queue (pending enqueues finish).
    pub close_op: String,
    /// Closes the token queue and cancels pending enqueues.
    pub cancel_close_op: String,
    /// The token queue's handle.
    pub token_queue: Output,
    /// The global step.
    pub global_step: Variable,
    /// The worker's local step.
    pub local_step: Variable,
    /// The accumulator nodes, one per variable in `grads_and_vars` order (a
    /// `ResourceConditionalAccumulator` per dense gradient, a `SparseConditionalAccumulator`
    /// per sparse one).
    pub accumulators: Vec<String>,
    /// Gradients per update.
    pub replicas_to_aggregate: usize,
    /// Workers training.
    pub total_num_replicas: usize,
}

impl SyncReplicasOps {
    /// Adds the op enqueuing the first tokens (`sync_token_q_EnqueueMany_k`): `num_tokens`
    /// copies of the global step, or `replicas_to_aggregate` with -1. Fewer than
    /// `replicas_to_aggregate - total_num_replicas` is INVALID_ARGUMENT, as in TensorFlow.
    pub fn get_init_tokens_op(&self, g: &mut Graph, num_tokens: i64) -> Result<String> {
        let min = self.replicas_to_aggregate as i64 - self.total_num_replicas as i64;
        if num_tokens != -1 && num_tokens < min.max(0) {
            return Err(Status::invalid_argument(format!(
                "Too few tokens to finish the first step: {num_tokens} (given) vs {min} \
                 (needed: replicas_to_aggregate - total_num_replicas)"
            )));
        }
        let n = if num_tokens == -1 {
            self.replicas_to_aggregate as i64
        } else {
            num_tokens
        };
        g.with_colocation(&self.global_step.handle.node.clone(), |g| {
            let fill = g.reserve_name("Fill");
            let dims = g.const_i32(&format!("{fill}/dims/"), &[1], &[n as i32])?;
            let read = g.with_name_scope(&format!("{fill}/"), |g| {
                g.read_variable(&self.global_step.handle)
            })?;
            let tokens = g.add1(
                NodeSpec::new("Fill")
                    .name(&format!("{fill}/"))
                    .input(&dims)
                    .input(&read),
            )?;
            g.queue_enqueue_many("sync_token_q_EnqueueMany", &self.token_queue, &[tokens])
        })
    }
}

/// The chief's aggregation loop: runs `sync_op` in its own thread, on its own session, until
/// asked to stop, until the global step reaches `last_step`, until the token queue is closed,
/// or until a step fails. On any end it closes the token queue (cancelling pending enqueues)
/// so that no worker waits for a token that will not come.
pub struct ChiefQueueRunner {
    session: Arc<Session>,
    ops: SyncReplicasOps,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<Result<u64>>>>,
}

impl ChiefQueueRunner {
    /// Starts the loop on a session of its own over `graph` on `device` (the chief's graph and
    /// device); `last_step` ends it once the global step reaches it.
    pub fn start(
        device: Arc<Device>,
        graph: &GraphDef,
        options: SessionOptions,
        ops: &SyncReplicasOps,
        last_step: Option<i64>,
    ) -> Result<Self> {
        let session = Session::with_options(device, options);
        session.extend(graph)?;
        Self::start_on(session, ops, last_step)
    }

    /// Starts the loop on `session`, which already holds the chief's graph: a remote session
    /// to the chief's master (`Session::connect`) as well as an in-process one. The loop owns
    /// the session (a step of its own may wait in a take) and closes it when stopped.
    pub fn start_on(
        session: Session,
        ops: &SyncReplicasOps,
        last_step: Option<i64>,
    ) -> Result<Self> {
        let session = Arc::new(session);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (session, ops, stop) = (session.clone(), ops.clone(), stop.clone());
            std::thread::Builder::new()
                .name("chief-queue-runner".into())
                .spawn(move || run_loop(&session, &ops, &stop, last_step))
                .map_err(|e| {
                    Status::internal(format!("cannot start the chief queue runner: {e}"))
                })?
        };
        Ok(Self {
            session,
            ops: ops.clone(),
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Whether the loop is still running.
    pub fn is_running(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Waits for the loop to end by itself; returns the number of updates it ran, or the error
    /// that ended it.
    pub fn join(&self) -> Result<u64> {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        match thread {
            None => Err(Status::failed_precondition(
                "the chief queue runner was already joined",
            )),
            Some(t) => t
                .join()
                .map_err(|_| Status::internal("the chief queue runner panicked"))?,
        }
    }

    /// Asks the loop to stop: closes the token queue, cancels the step it is waiting in, and
    /// joins it. A stop is not an error; an error the loop met before is returned.
    pub fn stop(&self) -> Result<u64> {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self
            .session
            .run(&[], &[], &[self.ops.cancel_close_op.as_str()])
        {
            tracing::warn!(error = %e, "closing the token queue failed");
        }
        self.session.close()?;
        self.join()
    }
}

impl Drop for ChiefQueueRunner {
    fn drop(&mut self) {
        if self
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            let _ = self.stop();
        }
    }
}

fn run_loop(
    session: &Session,
    ops: &SyncReplicasOps,
    stop: &AtomicBool,
    last_step: Option<i64>,
) -> Result<u64> {
    let mut updates = 0u64;
    let result = loop {
        if stop.load(Ordering::Acquire) {
            break Ok(updates);
        }
        match session.run(
            &[],
            &[ops.global_step_after.as_str()],
            &[ops.sync_op.as_str()],
        ) {
            Ok(fetched) => {
                updates += 1;
                let step = fetched
                    .first()
                    .map(|t| t.scalar_value::<i64>())
                    .transpose()?
                    .unwrap_or_default();
                tracing::debug!(global_step = step, "synchronous update applied");
                if last_step.is_some_and(|last| step >= last) {
                    break Ok(updates);
                }
            }
            // A closed queue is how the others say training is over.
            Err(e) if e.code() == Code::OutOfRange || e.code() == Code::Cancelled => {
                break Ok(updates)
            }
            Err(e) if stop.load(Ordering::Acquire) => {
                tracing::debug!(error = %e, "chief queue runner stopped");
                break Ok(updates);
            }
            Err(e) => {
                tracing::error!(error = %e, "synchronous aggregation failed");
                break Err(e);
            }
        }
    };
    if !stop.load(Ordering::Acquire) {
        if let Err(e) = session.run(&[], &[], &[ops.cancel_close_op.as_str()]) {
            tracing::warn!(error = %e, "closing the token queue failed");
        }
    }
    result
}

/// The chief's side of what TensorFlow's `make_session_run_hook` sets up.
struct ChiefSide {
    init_tokens_op: String,
    runner_session: CreateSession,
    last_step: Option<i64>,
    runner: Option<ChiefQueueRunner>,
}

/// Synchronous replication in a [`MonitoredSession`](crate::train::monitored::MonitoredSession)
/// (TensorFlow's `SyncReplicasOptimizer.make_session_run_hook`), local or remote alike.
///
/// After every session creation (again after a recovery) a worker initialises its local step;
/// the chief runs `chief_init_op` and the init tokens and starts a [`ChiefQueueRunner`] on a
/// session of its own. A runner that fails (a replica gone, no backup) fails the chief's next
/// step with its error; at the end the chief stops the runner, which closes the token queue so
/// that no worker waits for a token that will not come, and reports the error that ended it.
pub struct SyncReplicasHook {
    ops: SyncReplicasOps,
    chief: Option<ChiefSide>,
}

impl SyncReplicasHook {
    /// A non-chief worker's hook.
    pub fn worker(ops: &SyncReplicasOps) -> Self {
        Self {
            ops: ops.clone(),
            chief: None,
        }
    }

    /// The chief's hook: `init_tokens_op` (from [`SyncReplicasOps::get_init_tokens_op`]) is
    /// run after `chief_init_op`; `runner_session` makes the aggregation loop's session (with
    /// the graph extended into it), `last_step` ends the loop.
    pub fn chief(
        ops: &SyncReplicasOps,
        init_tokens_op: &str,
        runner_session: CreateSession,
        last_step: Option<i64>,
    ) -> Self {
        Self {
            ops: ops.clone(),
            chief: Some(ChiefSide {
                init_tokens_op: init_tokens_op.to_string(),
                runner_session,
                last_step,
                runner: None,
            }),
        }
    }

    /// The error that ended the chief's loop, once it ended with one.
    fn runner_failure(&mut self) -> Result<()> {
        let Some(chief) = &mut self.chief else {
            return Ok(());
        };
        match &chief.runner {
            Some(runner) if !runner.is_running() => {}
            _ => return Ok(()),
        }
        let runner = chief.runner.take();
        match runner.map(|r| r.join()) {
            Some(Err(e)) => Err(e.context("the chief's synchronous aggregation loop failed")),
            _ => Ok(()),
        }
    }
}

impl Hook for SyncReplicasHook {
    fn after_create_session(&mut self, session: &Session) -> Result<()> {
        let Some(chief) = &mut self.chief else {
            session
                .run(&[], &[], &[self.ops.local_step_init_op.as_str()])
                .map_err(|e| e.context("initialising the worker's sync_rep_local_step"))?;
            return Ok(());
        };
        // A recovery: the old loop's session is gone with the old cluster state.
        if let Some(old) = chief.runner.take() {
            if let Err(e) = old.stop() {
                tracing::warn!(error = %e, "the previous chief queue runner ended with an error");
            }
        }
        session
            .run(
                &[],
                &[],
                &[
                    self.ops.chief_init_op.as_str(),
                    chief.init_tokens_op.as_str(),
                ],
            )
            .map_err(|e| e.context("running the chief's sync init and init tokens"))?;
        let runner_session = (chief.runner_session)()
            .map_err(|e| e.context("creating the chief queue runner's session"))?;
        chief.runner = Some(ChiefQueueRunner::start_on(
            runner_session,
            &self.ops,
            chief.last_step,
        )?);
        Ok(())
    }

    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        self.runner_failure()?;
        Ok(RunArgs::default())
    }

    fn end(&mut self, _session: &Session) -> Result<()> {
        self.runner_failure()?;
        match self.chief.as_mut().and_then(|c| c.runner.take()) {
            Some(runner) => runner.stop().map(|_| ()),
            None => Ok(()),
        }
    }
}
