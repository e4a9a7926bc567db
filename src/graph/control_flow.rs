//! TensorFlow 1 control flow in the builder: [`Graph::cond`] and [`Graph::while_loop`] lay out
//! `Switch`/`Merge` and `Enter`/`Merge`/`Switch`/`NextIteration`/`Exit`/`LoopCond` exactly as
//! `tf.compat.v1.cond` and `tf.compat.v1.while_loop` do (`control_flow_ops.py`, `cond.py`).
//!
//! The builder keeps TensorFlow's control-flow contexts (`context.rs`): every cond branch and
//! every loop is a context, nested in the one it was built in, and every node built inside one
//! records it. While a context is current, [`Graph::add_node`] hands each new op to it first
//! (`CondContext._AddOpInternal`, `WhileContext._AddOpInternal`):
//!
//! - an input from outside a cond branch goes through a `Switch` on the branch's predicate
//!   (one per branch and value), and an input from outside a loop through an
//!   `Enter(is_constant=true)` into the loop's frame, nested contexts recursively
//!   (`AddValue`);
//! - an op with no inputs (a constant) gets a control input from the context's pivot
//!   (`cond/switch_t`, the loop body's first `Identity`) so that it runs in the branch or
//!   iteration; in a loop, so does an op whose inputs are all loop invariants;
//! - in a loop, control inputs from outside the loop are dropped, and each is replaced by an
//!   `Identity` of its first output built in the loop.
//!
//! In a gradient loop (see `grad_state.rs`), a value of the forward loop that a gradient needs
//! is not entered but read back from the stack the forward loop pushed it on.

use crate::error::{Result, Status};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::context::CtxId;
use crate::graph::registry;
use crate::tensor::{DType, PartialShape};

impl Graph {
    /// Builds `tf.compat.v1.cond(pred, true_fn, false_fn)`: a `Switch` of `pred` on itself
    /// whose outputs become the pivots `switch_t` / `switch_f`, `pred_id`, each branch built
    /// in its own context, and one `Merge` of the two branches' results per result (false
    /// branch first). Returns the Merges' outputs. Each branch must return as many tensors,
    /// of the same dtypes, and at least one.
    pub fn cond(
        &mut self,
        pred: &Output,
        true_fn: impl FnOnce(&mut Graph) -> Result<Vec<Output>>,
        false_fn: impl FnOnce(&mut Graph) -> Result<Vec<Output>>,
    ) -> Result<Vec<Output>> {
        if pred.dtype != DType::Bool {
            return Err(Status::invalid_argument(format!(
                "cond predicate `{}` is {}; pass a bool scalar",
                pred.name(),
                pred.dtype
            )));
        }
        self.with_name_scope("cond", |g| {
            let scope = g.name_scope().to_string();
            let sw = g.add_node(NodeSpec::new("Switch").input(pred).input(pred))?;
            let pivot_t = g.add1(NodeSpec::new("Identity").name("switch_t").input(&sw[1]))?;
            let pivot_f = g.add1(NodeSpec::new("Identity").name("switch_f").input(&sw[0]))?;
            let pred_id = g.add1(NodeSpec::new("Identity").name("pred_id").input(pred))?;
            let outer = g.cf.current;
            let ct = g.new_cond_context(outer, &pred_id, &pivot_t, 1);
            let res_t = g.cf_enter(Some(ct), |g| g.build_cond_branch(ct, true_fn))?;
            g.exit_result(ct, &res_t);
            let cf = g.new_cond_context(outer, &pred_id, &pivot_f, 0);
            let res_f = g.cf_enter(Some(cf), |g| g.build_cond_branch(cf, false_fn))?;
            g.exit_result(cf, &res_f);
            if res_t.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "cond `{scope}`: the branches must return at least one tensor"
                )));
            }
            if res_t.len() != res_f.len() {
                return Err(Status::invalid_argument(format!(
                    "cond `{scope}`: the true branch returns {} tensors and the false branch \
                     {}; return the same number from both",
                    res_t.len(),
                    res_f.len()
                )));
            }
            let mut merges = Vec::with_capacity(res_t.len());
            for (i, (t, f)) in res_t.iter().zip(&res_f).enumerate() {
                if t.dtype != f.dtype {
                    return Err(Status::invalid_argument(format!(
                        "cond `{scope}`: result {i} is {} from the true branch and {} from the \
                         false branch; both must have the same dtype",
                        t.dtype, f.dtype
                    )));
                }
                let op = if g.is_ref_output(t) && g.is_ref_output(f) {
                    "RefMerge"
                } else {
                    "Merge"
                };
                let m = g.add_node(NodeSpec::new(op).input_list(&[f.clone(), t.clone()]))?;
                merges.push(m[0].clone());
            }
            Ok(merges)
        })
    }

    /// Builds `tf.compat.v1.while_loop(cond_fn, body_fn, loop_vars, parallel_iterations)` in
    /// name scope `name` (`while` when empty): per loop variable `Enter` → `Merge` →
    /// `Switch(LoopCond)` → `Identity` (what the body sees) → body → `NextIteration` back into
    /// the Merge, and `Exit` from the Switch's false output. `cond_fn` gets the Merges and
    /// returns a bool scalar; `body_fn` gets the Identities and returns the next values, one
    /// per loop variable, each of its variable's dtype and a shape compatible with the
    /// variable's. Returns the Exits. Values from outside that the condition or body use
    /// enter the frame as loop invariants (`Enter(is_constant=true)`).
    pub fn while_loop(
        &mut self,
        cond_fn: impl FnOnce(&mut Graph, &[Output]) -> Result<Output>,
        body_fn: impl FnOnce(&mut Graph, &[Output]) -> Result<Vec<Output>>,
        loop_vars: &[Output],
        parallel_iterations: i64,
        name: &str,
    ) -> Result<Vec<Output>> {
        let name = if name.is_empty() { "while" } else { name };
        if loop_vars.is_empty() {
            return Err(Status::invalid_argument(format!(
                "while loop `{name}`: no loop variables; pass at least one"
            )));
        }
        if parallel_iterations < 1 {
            return Err(Status::invalid_argument(format!(
                "while loop `{name}`: parallel_iterations is {parallel_iterations}; it must be \
                 at least 1"
            )));
        }
        self.with_name_scope(name, |g| {
            let outer = g.cf.current;
            let frame = g.unique_name("while_context");
            let w = g.new_while_context(outer, &frame, parallel_iterations, None);
            // The loop variables are known in the loop until their Enters replace them.
            for v in loop_vars {
                g.add_name(w, &v.name());
            }
            g.cf_enter(Some(w), |g| g.build_loop(w, cond_fn, body_fn, loop_vars))
        })
    }

    fn build_cond_branch(
        &mut self,
        ctx: CtxId,
        f: impl FnOnce(&mut Graph) -> Result<Vec<Output>>,
    ) -> Result<Vec<Output>> {
        let results = f(self)?;
        results
            .iter()
            .map(|v| self.process_output_tensor(ctx, v))
            .collect()
    }

    /// A branch result from outside the branch (`lambda: x`) goes through a Switch too.
    fn process_output_tensor(&mut self, ctx: CtxId, val: &Output) -> Result<Output> {
        let key = val.name();
        if self.ctx(ctx).values.contains(&key) {
            return Ok(self
                .ctx(ctx)
                .external_values
                .get(&key)
                .cloned()
                .unwrap_or_else(|| val.clone()));
        }
        self.add_name(ctx, &key);
        let mut real = val.clone();
        if let Some(outer) = self.ctx(ctx).outer {
            real = self.cf_add_value(outer, val)?;
            let c = self.ctx_mut(ctx);
            c.values.insert(real.name());
            c.external_values.insert(real.name(), real.clone());
        }
        let (pred, branch) = self.cond_parts(ctx)?;
        let sw = self.switch_ref_or_tensor(&real, &pred, "Switch")?;
        let real = sw[branch].clone();
        self.ctx_mut(ctx).external_values.insert(key, real.clone());
        Ok(real)
    }

    fn build_loop(
        &mut self,
        w: CtxId,
        cond_fn: impl FnOnce(&mut Graph, &[Output]) -> Result<Output>,
        body_fn: impl FnOnce(&mut Graph, &[Output]) -> Result<Vec<Output>>,
        loop_vars: &[Output],
    ) -> Result<Vec<Output>> {
        let outer = self.ctx(w).outer;
        let real_vars = match outer {
            Some(o) => loop_vars
                .iter()
                .map(|v| self.cf_add_value(o, v))
                .collect::<Result<Vec<_>>>()?,
            None => loop_vars.to_vec(),
        };
        let (frame, parallel) = {
            let wc = self.while_parts(w)?;
            (wc.frame.clone(), wc.parallel_iterations)
        };
        let enters = self.cf_raw(Some(w), |g| {
            real_vars
                .iter()
                .map(|v| g.enter_op(v, &frame, false, parallel, "Enter"))
                .collect::<Result<Vec<_>>>()
        })?;
        // A loop inside a cond or another loop starts with that context's pivot.
        let mut control_pivot = None;
        let mut o = outer;
        while let (Some(c), None) = (o, &control_pivot) {
            control_pivot = self.control_pivot(c);
            o = self.ctx(c).outer;
        }
        if let Some(p) = control_pivot {
            for e in &enters {
                let input = self.data_input(&e.node, 0)?;
                if self.is_loop_constant_enter(&input.node) {
                    self.add_control_input(&e.node, &p.node)?;
                }
            }
        }
        {
            let c = self.ctx_mut(w);
            c.values = enters.iter().map(Output::name).collect();
        }
        self.while_mut(w)?.loop_enters = enters.clone();
        let mut merges = Vec::with_capacity(enters.len());
        for e in &enters {
            let op = if self.is_ref_output(e) {
                "RefMerge"
            } else {
                "Merge"
            };
            let m = self.add_node(NodeSpec::new(op).input_list(&[e.clone(), e.clone()]))?;
            merges.push(m[0].clone());
        }
        self.while_mut(w)?.pivot_for_pred = Some(merges[0].clone());
        let c = cond_fn(self, &merges)?;
        if c.dtype != DType::Bool || c.shape.rank().is_some_and(|r| r != 0) {
            return Err(Status::invalid_argument(format!(
                "while loop `{frame}`: the condition returned `{}` of {} {}; it must return a \
                 bool scalar",
                c.name(),
                c.dtype,
                c.shape
            )));
        }
        let pivot = self.add1(NodeSpec::new("LoopCond").name("LoopCond").input(&c))?;
        self.while_mut(w)?.pivot = Some(pivot.clone());
        let mut switches = Vec::with_capacity(merges.len());
        for m in &merges {
            let sw = self.switch_ref_or_tensor(m, &pivot, "Switch")?;
            self.cf.loop_switches.insert(sw[0].node.clone());
            switches.push(sw);
        }
        let mut body_vars = Vec::with_capacity(switches.len());
        for sw in &switches {
            let op = if self.is_ref_output(&sw[1]) {
                "RefIdentity"
            } else {
                "Identity"
            };
            let op = if registry::global().get(op).is_some() {
                op
            } else {
                "Identity"
            };
            body_vars.push(self.add1(NodeSpec::new(op).input(&sw[1]))?);
        }
        self.while_mut(w)?.pivot_for_body = Some(body_vars[0].clone());
        let results = body_fn(self, &body_vars)?;
        if results.len() != merges.len() {
            return Err(Status::invalid_argument(format!(
                "while loop `{frame}`: the body returned {} tensors for {} loop variables; \
                 return one per loop variable",
                results.len(),
                merges.len()
            )));
        }
        for (i, (m, v)) in merges.iter().zip(&results).enumerate() {
            if m.dtype != v.dtype {
                return Err(Status::invalid_argument(format!(
                    "while loop `{frame}`: loop variable {i} enters as {} and the body returns \
                     {} for it (`{}`); keep its dtype",
                    m.dtype,
                    v.dtype,
                    v.name()
                )));
            }
            self.add_next_and_back_edge(m, v, Some(i))?;
        }
        let mut exits = Vec::with_capacity(switches.len());
        for sw in &switches {
            let op = if self.is_ref_output(&sw[0]) {
                "RefExit"
            } else {
                "Exit"
            };
            exits.push(self.add1(NodeSpec::new(op).input(&sw[0]))?);
        }
        self.while_mut(w)?.loop_exits = exits.clone();
        self.exit_result(w, &exits);
        Ok(exits)
    }

    /// Adds `NextIteration(v)` and makes it input 1 of `merge` (`_AddNextAndBackEdge`); for a
    /// forward loop variable (`var` is its index) the value must keep the variable's shape.
    pub(crate) fn add_next_and_back_edge(
        &mut self,
        merge: &Output,
        v: &Output,
        var: Option<usize>,
    ) -> Result<Output> {
        let op = if self.is_ref_output(v) {
            "RefNextIteration"
        } else {
            "NextIteration"
        };
        let next = self.add1(NodeSpec::new(op).input(v))?;
        if let Some(i) = var {
            if !shape_less_than_or_equal(&next.shape, &merge.shape) {
                return Err(Status::invalid_argument(format!(
                    "while loop variable {i} (`{}`) enters the loop with shape {}, but has shape \
                     {} after one iteration (`{}`); keep its shape in the body",
                    merge.name(),
                    merge.shape,
                    next.shape,
                    v.name()
                )));
            }
        }
        self.update_input(&merge.node, 1, &next)?;
        Ok(next)
    }
}

/// Whether `a` is at least as specific as `b` (`_ShapeLessThanOrEqual`): same rank, and equal
/// wherever `b` knows a dimension.
fn shape_less_than_or_equal(a: &PartialShape, b: &PartialShape) -> bool {
    let Some(bd) = b.dims() else {
        return true;
    };
    let Some(ad) = a.dims() else {
        return false;
    };
    ad.len() == bd.len() && ad.iter().zip(bd).all(|(x, y)| y.is_none() || x == y)
}
