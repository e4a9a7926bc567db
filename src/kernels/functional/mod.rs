//! Functional control flow as TensorFlow 2 writes it in graphs: `If`/`StatelessIf`
//! (`tf.cond`), `Case`/`StatelessCase` (`tf.switch_case`), `While`/`StatelessWhile`
//! (`tf.while_loop`) and `PartitionedCall`/`StatefulPartitionedCall` (a `tf.function` called
//! in a graph), whose branches, conditions, bodies and callees are functions of the graph's
//! library.
//!
//! The executor creates these kernels itself ([`create`]), since they need the library of the
//! graph they belong to. Each function is instantiated once ([`function::Function`]): its
//! nodes get their kernels for the calling node's device, functional ones recursively with
//! the same library, in an order where every node comes after its inputs. A run calls the
//! functions on the calling kernel's thread, with its resources (resource variables live in
//! the device's `ResourceMgr`, which bodies share with their caller), device and step.
//!
//! - `If` evaluates its condition by TensorFlow's truth rule ([`truth`]) and runs one branch.
//! - `Case` runs the branch its int32 index names, the last one for an index out of range
//!   (TensorFlow's default branch).
//! - `While` runs `cond` on the loop variables and `body` while the condition is true, and
//!   returns the final variables. Before each iteration it checks the step's cancellation and
//!   deadline, so a loop that never ends fails its step with DEADLINE_EXCEEDED naming the
//!   node and how many iterations it ran.
//! - `PartitionedCall` runs `f` on its inputs (`config`, `config_proto` and `executor_type`
//!   are accepted and ignored: the body runs on the caller's device).
//!
//! Masters lower these ops to v1 control flow before they place a graph
//! ([`crate::graph::lower`]); the kernels run them where a graph is run as it is (a local
//! session, a function body that stays functional).

mod function;

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use function::Function;
use function::Library;

use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::KernelLookup;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::{attr_value, AttrValue, FunctionDefLibrary, NodeDef};
use crate::tensor::{DType, Tensor};

/// How long before the step's deadline a `While` gives up: its own error, which names the
/// node and its iteration count, then reaches the caller rather than the executor's generic
/// one for the step.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// Whether `op` is created by [`create`] (it needs its graph's function library).
pub fn is_functional(op: &str) -> bool {
    matches!(
        op,
        "If" | "StatelessIf"
            | "Case"
            | "StatelessCase"
            | "While"
            | "StatelessWhile"
            | "PartitionedCall"
            | "StatefulPartitionedCall"
    )
}

/// The factory [`crate::kernels::kernel_for`] gives the functional ops: outside a graph there
/// is no library to find the functions in.
pub fn without_library(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
    Err(Status::failed_precondition(format!(
        "node `{}` (op {}) runs functions of its graph's library; it is created with the graph",
        node.name, node.op
    )))
}

/// Creates a kernel: the lookup a function library instantiates its bodies' nodes with.
pub type KernelFn = fn(&NodeDef, DeviceType) -> Result<Arc<dyn OpKernel>>;

/// A graph's function library, kept for kernels that instantiate functions when they run
/// rather than when they are created (a `tf.data` map function: the dataset op that names it
/// may itself run inside a function). Kernels reach it through [`OpContext::functions`].
pub struct FunctionLibrary {
    library: Option<FunctionDefLibrary>,
    device_type: DeviceType,
    kernels: KernelFn,
}

impl FunctionLibrary {
    /// The functions of `library`, their nodes' kernels created through `kernels` for
    /// `device_type`.
    pub fn new(
        library: Option<FunctionDefLibrary>,
        device_type: DeviceType,
        kernels: KernelFn,
    ) -> Self {
        Self {
            library,
            device_type,
            kernels,
        }
    }

    /// Instantiates the function that `node`'s attr `attr` names: NOT_FOUND naming the node,
    /// the attr and the function when the library has no such function.
    pub fn instantiate(&self, node: &NodeDef, attr: &str) -> Result<Function> {
        let lib = Library {
            library: self.library.as_ref(),
            device_type: self.device_type,
            kernels: &self.kernels,
            stack: RefCell::new(Vec::new()),
        };
        lib.instantiate(node, attr)
    }
}

/// Creates the kernel of a functional node whose functions are in `library`, their nodes'
/// kernels through `kernels` for `device_type`.
pub fn create(
    node: &NodeDef,
    library: Option<&FunctionDefLibrary>,
    device_type: DeviceType,
    kernels: &KernelLookup,
) -> Result<Arc<dyn OpKernel>> {
    let lib = Library {
        library,
        device_type,
        kernels,
        stack: RefCell::new(Vec::new()),
    };
    create_with(node, &lib)
}

/// Creates a functional node's kernel, instantiating its functions from `lib`.
fn create_with(node: &NodeDef, lib: &Library<'_>) -> Result<Arc<dyn OpKernel>> {
    let types = |name: &str| attr::dtype_list(node, name);
    let bad = |what: String| {
        Status::invalid_argument(format!("node `{}` (op {}): {what}", node.name, node.op))
    };
    // Argument and result types must be what the node says it passes and returns.
    let check = |f: &Function, role: &str, args: &[DType], outputs: Option<&[DType]>| {
        if f.arg_types != args {
            return Err(bad(format!(
                "its {role} `{}` takes ({}), but the node passes ({})",
                f.name,
                list(&f.arg_types),
                list(args)
            )));
        }
        if let Some(outputs) = outputs {
            if f.output_types != outputs {
                return Err(bad(format!(
                    "its {role} `{}` returns ({}), but the node outputs ({})",
                    f.name,
                    list(&f.output_types),
                    list(outputs)
                )));
            }
        }
        Ok(())
    };
    match node.op.as_str() {
        "If" | "StatelessIf" => {
            let (tin, tout) = (types("Tin")?, types("Tout")?);
            let then_branch = lib.instantiate(node, "then_branch")?;
            let else_branch = lib.instantiate(node, "else_branch")?;
            check(&then_branch, "then_branch", &tin, Some(&tout))?;
            check(&else_branch, "else_branch", &tin, Some(&tout))?;
            Ok(Arc::new(If {
                then_branch,
                else_branch,
            }))
        }
        "Case" | "StatelessCase" => {
            let (tin, tout) = (types("Tin")?, types("Tout")?);
            let funcs = match attr::get(node, "branches") {
                Some(attr_value::Value::List(l)) if !l.func.is_empty() => l.func.clone(),
                _ => return Err(bad("attr `branches` must be a non-empty list(func)".into())),
            };
            // Each branch is instantiated through a single-func attr named for its place.
            let mut branches = Vec::with_capacity(funcs.len());
            for (i, f) in funcs.into_iter().enumerate() {
                let role = format!("branches[{i}]");
                let mut one = node.clone();
                one.attr.insert(
                    role.clone(),
                    AttrValue {
                        value: Some(attr_value::Value::Func(f)),
                    },
                );
                let branch = lib.instantiate(&one, &role)?;
                check(&branch, &role, &tin, Some(&tout))?;
                branches.push(branch);
            }
            Ok(Arc::new(Case { branches }))
        }
        "While" | "StatelessWhile" => {
            let t = types("T")?;
            let cond = lib.instantiate(node, "cond")?;
            let body = lib.instantiate(node, "body")?;
            check(&cond, "cond", &t, None)?;
            if cond.output_types.len() != 1 {
                return Err(bad(format!(
                    "its cond `{}` returns {} tensors; a loop condition is one tensor",
                    cond.name,
                    cond.output_types.len()
                )));
            }
            check(&body, "body", &t, Some(&t))?;
            Ok(Arc::new(While { cond, body }))
        }
        "PartitionedCall" | "StatefulPartitionedCall" => {
            let (tin, tout) = (types("Tin")?, types("Tout")?);
            let f = lib.instantiate(node, "f")?;
            check(&f, "f", &tin, Some(&tout))?;
            Ok(Arc::new(Call { f }))
        }
        other => Err(bad(format!("{other} is not a functional op"))),
    }
}

fn list(types: &[DType]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// TensorFlow's truth of a condition tensor: a scalar is true when non-zero (a string when
/// non-empty); any other tensor when it has elements.
pub fn truth(ctx: &OpContext<'_>, cond: &Tensor) -> Result<bool> {
    if cond.rank() > 0 {
        return Ok(cond.num_elements() > 0);
    }
    Ok(match cond.dtype() {
        DType::Bool => cond.scalar_value::<bool>()?,
        DType::Float => cond.scalar_value::<f32>()? != 0.0,
        DType::Double => cond.scalar_value::<f64>()? != 0.0,
        DType::Int32 => cond.scalar_value::<i32>()? != 0,
        DType::Int64 => cond.scalar_value::<i64>()? != 0,
        DType::String => !cond.strings()?[0].is_empty(),
        other => {
            return Err(ctx.invalid(format!(
                "a condition of type {other} has no truth value; use a bool, number or string"
            )))
        }
    })
}

/// `If(cond, input...)`: runs `then_branch` or `else_branch` on the inputs.
struct If {
    then_branch: Function,
    else_branch: Function,
}

impl OpKernel for If {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let cond = ctx.input(0)?.clone();
        let args = ctx.inputs()[1..].to_vec();
        let branch = if truth(ctx, &cond)? {
            &self.then_branch
        } else {
            &self.else_branch
        };
        let outputs = branch.call(ctx, &args)?;
        for (i, t) in outputs.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}

/// `Case(branch_index, input...)`: runs `branches[branch_index]` on the inputs; an index out
/// of range runs the last branch, TensorFlow's default branch.
struct Case {
    branches: Vec<Function>,
}

impl OpKernel for Case {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let index = ctx.input(0)?.clone();
        if index.rank() != 0 || index.dtype() != DType::Int32 {
            return Err(ctx.invalid("branch_index must be scalar"));
        }
        let i = index.scalar_value::<i32>()?;
        let last = self.branches.len() - 1;
        let branch = &self.branches[usize::try_from(i).map_or(last, |i| i.min(last))];
        let args = ctx.inputs()[1..].to_vec();
        let outputs = branch.call(ctx, &args)?;
        for (i, t) in outputs.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}

/// `While(input...)`: `input = body(input)` while `cond(input)`; outputs the final `input`.
struct While {
    cond: Function,
    body: Function,
}

impl While {
    /// Fails when the step is cancelled or its deadline (less [`DEADLINE_SLACK`]) has passed,
    /// naming the node and the iterations it ran.
    fn check_step(&self, ctx: &OpContext<'_>, iterations: u64) -> Result<()> {
        if let Some(token) = ctx.cancellation() {
            if token.is_cancelled() {
                let reason = token
                    .reason()
                    .unwrap_or_else(|| Status::cancelled("the step was cancelled"));
                return Err(ctx.named(
                    reason.context(format!("while loop stopped after {iterations} iterations")),
                ));
            }
        }
        if let Some(deadline) = ctx.deadline() {
            if Instant::now() + DEADLINE_SLACK >= deadline {
                return Err(ctx.named(Status::deadline_exceeded(format!(
                    "the step's deadline came after {iterations} iterations of the while loop \
                     (cond `{}`, body `{}`), which had not ended; a loop that never ends? \
                     Check its condition or raise the step timeout",
                    self.cond.name, self.body.name
                ))));
            }
        }
        Ok(())
    }
}

impl OpKernel for While {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let mut vars = ctx.inputs().to_vec();
        let mut iterations: u64 = 0;
        loop {
            self.check_step(ctx, iterations)?;
            let cond = self.cond.call(ctx, &vars)?;
            if !truth(ctx, &cond[0])? {
                break;
            }
            vars = self.body.call(ctx, &vars)?;
            iterations += 1;
        }
        for (i, t) in vars.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}

/// `PartitionedCall(args...)`: `f(args)`.
struct Call {
    f: Function,
}

impl OpKernel for Call {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let args = ctx.inputs().to_vec();
        let outputs = self.f.call(ctx, &args)?;
        for (i, t) in outputs.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}
