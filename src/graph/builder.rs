//! The graph under construction: a `GraphDef` plus what the builder knows about every output
//! (dtype, partial shape, small constant values), and the scopes new nodes inherit.
//!
//! Every node goes through [`Graph::add_node`]: it gets a unique name in the current name scope
//! (`MatMul`, `MatMul_1`, as TensorFlow names them), its type attrs are read off its inputs,
//! the op's attr defaults are filled in, input dtypes are checked, the control-dependency,
//! colocation and device scopes are applied, and the op's shape function runs, so a bad graph
//! fails here with the node's name rather than at run time. Imported graphs
//! ([`Graph::from_graph_def`](super::import)) go through the same checks.
//! Op constructors (`g.matmul(..)`) live in [`super::ops`].

use std::collections::HashMap;

use crate::cluster::DeviceName;
use crate::error::{Result, Status};
use crate::graph::attr::value;
use crate::graph::const_value;
use crate::graph::context::ControlFlow;
use crate::graph::ops::ControlFlowOp;
use crate::graph::registry::{self, ArgType, OpDef};
use crate::graph::scope::{self, DeviceFn, DeviceScope};
use crate::graph::shape_fn::ShapeCtx;
use crate::proto::{AttrValue, FunctionDefLibrary, GraphDef, NodeDef, VersionDef};
use crate::tensor::{DType, PartialShape};

/// One output of a node: the edge a consumer reads, with what is known of its tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// The producing node's name.
    pub node: String,
    /// The output index.
    pub index: usize,
    /// The tensor's dtype.
    pub dtype: DType,
    /// What is known of the tensor's shape.
    pub shape: PartialShape,
}

impl Output {
    /// Returns the tensor's name as fetched: `node:index`.
    pub fn name(&self) -> String {
        format!("{}:{}", self.node, self.index)
    }

    /// Returns the edge as a `NodeDef` input: `node` for output 0, `node:index` otherwise.
    pub fn input_name(&self) -> String {
        if self.index == 0 {
            self.node.clone()
        } else {
            self.name()
        }
    }
}

/// What the builder knows about one output.
#[derive(Clone, Debug)]
pub(crate) struct OutputMeta {
    pub dtype: DType,
    pub shape: PartialShape,
    /// The value, for small integer constants (and `Shape` of a fully known shape).
    pub value: Option<Vec<i64>>,
    /// For 1-D integer tensors holding a shape, what is known of that shape.
    pub shape_value: Option<PartialShape>,
    /// For resource handles, the shape of the value behind the handle.
    pub handle_shape: Option<PartialShape>,
}

/// One input argument of a node being added: a tensor, or a list for `N * T` / type-list args.
#[derive(Clone, Debug)]
pub enum Arg {
    /// A single tensor.
    One(Output),
    /// A list of tensors.
    List(Vec<Output>),
}

/// A node to add: op type, optional name, inputs per argument, attrs.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    op: String,
    name: Option<String>,
    args: Vec<Arg>,
    attrs: Vec<(String, AttrValue)>,
    pub(crate) control: Vec<String>,
}

impl NodeSpec {
    /// A node of op type `op`.
    pub fn new(op: &str) -> Self {
        Self {
            op: op.to_string(),
            name: None,
            args: Vec::new(),
            attrs: Vec::new(),
            control: Vec::new(),
        }
    }

    /// Names the node (made unique in the current scope); the default is the op type.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Adds the next input argument.
    pub fn input(mut self, o: &Output) -> Self {
        self.args.push(Arg::One(o.clone()));
        self
    }

    /// Adds the next input argument as a list (`N * T` or a type list).
    pub fn input_list(mut self, os: &[Output]) -> Self {
        self.args.push(Arg::List(os.to_vec()));
        self
    }

    /// Sets an attr.
    pub fn attr(mut self, name: &str, v: AttrValue) -> Self {
        self.attrs.push((name.to_string(), v));
        self
    }

    /// Adds a control input (a node that must run first).
    pub fn control(mut self, node: &str) -> Self {
        self.control.push(node.to_string());
        self
    }
}

/// A variable: its handle, the op that initializes it, and its value.
#[derive(Clone, Debug)]
pub struct Variable {
    /// The `VarHandleOp` output (a resource) of a resource variable, the `VariableV2` output
    /// (a reference) of a reference variable; gradients can be taken with respect to it.
    pub handle: Output,
    /// The name of the `AssignVariableOp` (resource) or `Assign` (reference) that writes the
    /// initial value.
    pub initializer: String,
    /// The value read when the variable was created: `w/Read/ReadVariableOp` for a resource
    /// variable, the `Identity` `w/read` for a reference variable.
    pub value: Output,
}

impl Variable {
    /// Whether the variable is a resource or a reference variable (from its handle's dtype).
    pub fn kind(&self) -> VariableKind {
        if self.handle.dtype == DType::Resource {
            VariableKind::Resource
        } else {
            VariableKind::Reference
        }
    }
}

/// How [`Graph::variable`] stores a variable, and so which ops read and update it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VariableKind {
    /// A resource variable, as TensorFlow 2 (and `use_resource=True`) makes them:
    /// `VarHandleOp` + `AssignVariableOp` + `ReadVariableOp`; optimizers update it with
    /// `ResourceApply*`.
    #[default]
    Resource,
    /// A reference variable, as TensorFlow 1 makes them: `VariableV2` + `Assign` + an
    /// `Identity` named `read`; optimizers update it with `Apply*` on its reference.
    Reference,
}

/// A dataflow graph being built (or imported) as a TensorFlow `GraphDef`.
#[derive(Clone, Default)]
pub struct Graph {
    pub(crate) nodes: Vec<NodeDef>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) meta: Vec<Vec<OutputMeta>>,
    names_in_use: HashMap<String, usize>,
    name_scope: String,
    devices: Vec<DeviceScope>,
    pub(crate) control: Vec<String>,
    colocation: Option<String>,
    variables: Vec<String>,
    variable_kind: VariableKind,
    pub(crate) cf: ControlFlow,
    pub(crate) versions: Option<VersionDef>,
    pub(crate) library: Option<FunctionDefLibrary>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the graph as a `GraphDef` (nodes in the order they were added).
    pub fn to_graph_def(&self) -> GraphDef {
        GraphDef {
            node: self.nodes.clone(),
            versions: Some(self.versions.clone().unwrap_or(VersionDef {
                producer: 2474,
                min_consumer: 12,
                bad_consumers: Vec::new(),
            })),
            library: self.library.clone(),
            ..Default::default()
        }
    }

    /// Returns the nodes.
    pub fn nodes(&self) -> &[NodeDef] {
        &self.nodes
    }

    /// Returns the node named `name`.
    pub fn node(&self, name: &str) -> Option<&NodeDef> {
        self.by_name.get(name).map(|&i| &self.nodes[i])
    }

    /// Returns output `index` of node `name`, or NOT_FOUND / INVALID_ARGUMENT naming it.
    pub fn output(&self, name: &str, index: usize) -> Result<Output> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| Status::not_found(format!("graph has no node `{name}`")))?;
        let m = self.meta[i].get(index).ok_or_else(|| {
            Status::invalid_argument(format!(
                "node `{name}` has {} outputs; output {index} does not exist",
                self.meta[i].len()
            ))
        })?;
        Ok(Output {
            node: name.to_string(),
            index,
            dtype: m.dtype,
            shape: m.shape.clone(),
        })
    }

    /// Returns the tensor named `node:i` (or `node` for output 0).
    pub fn tensor(&self, name: &str) -> Result<Output> {
        match name.rsplit_once(':') {
            Some((n, i)) if i.parse::<usize>().is_ok() => self.output(n, i.parse().unwrap_or(0)),
            _ => self.output(name, 0),
        }
    }

    /// Returns every output of node `name`.
    pub fn outputs_of(&self, name: &str) -> Result<Vec<Output>> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| Status::not_found(format!("graph has no node `{name}`")))?;
        (0..self.meta[i].len())
            .map(|k| self.output(name, k))
            .collect()
    }

    pub(crate) fn meta_of(&self, o: &Output) -> Option<&OutputMeta> {
        self.by_name
            .get(&o.node)
            .and_then(|&i| self.meta[i].get(o.index))
    }

    /// Returns a name unique in the graph for `name` in the current scope, as TensorFlow's
    /// `Graph.unique_name` does (`add`, `add_1`, ...; case-insensitive).
    pub fn unique_name(&mut self, name: &str) -> String {
        let name = if self.name_scope.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.name_scope)
        };
        let key = name.to_lowercase();
        let mut i = self.names_in_use.get(&key).copied().unwrap_or(0);
        self.names_in_use.insert(key.clone(), i + 1);
        if i == 0 {
            return name;
        }
        let mut candidate = format!("{key}_{i}");
        while self.names_in_use.contains_key(&candidate) {
            i += 1;
            candidate = format!("{key}_{i}");
        }
        self.names_in_use.insert(candidate, 1);
        format!("{name}_{i}")
    }

    pub(crate) fn mark_name_used(&mut self, name: &str) {
        self.names_in_use.entry(name.to_lowercase()).or_insert(1);
    }

    /// Returns the current name scope (`""` at the top).
    pub fn name_scope(&self) -> &str {
        &self.name_scope
    }

    /// Runs `f` in name scope `name` made unique (`layer1`, then `layer1_1`); a name ending in
    /// `/` re-enters that exact scope, and `""` returns to the top.
    pub fn with_name_scope<R>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        let scope = if name.is_empty() {
            String::new()
        } else if let Some(exact) = name.strip_suffix('/') {
            exact.to_string()
        } else {
            self.unique_name(name)
        };
        let saved = std::mem::replace(&mut self.name_scope, scope);
        let r = f(self);
        self.name_scope = saved;
        r
    }

    /// Runs `f` with nodes placed on `device`, merged field by field under inner scopes.
    pub fn with_device<R>(
        &mut self,
        device: &str,
        f: impl FnOnce(&mut Self) -> Result<R>,
    ) -> Result<R> {
        let spec = DeviceName::parse(device)?;
        self.devices.push(DeviceScope::Spec(spec));
        let r = f(self);
        self.devices.pop();
        r
    }

    /// Runs `f` with `device_fn` deciding the device of each new node.
    pub fn with_device_fn<R>(&mut self, device_fn: DeviceFn, f: impl FnOnce(&mut Self) -> R) -> R {
        self.devices.push(DeviceScope::Func(device_fn));
        let r = f(self);
        self.devices.pop();
        r
    }

    /// Runs `f` with every new node depending on `nodes` (control inputs `^node`).
    pub fn with_control_dependencies<R>(
        &mut self,
        nodes: &[&str],
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let saved = self.control.len();
        self.control.extend(nodes.iter().map(|s| s.to_string()));
        let r = f(self);
        self.control.truncate(saved);
        r
    }

    /// Runs `f` with no device scope applying (TensorFlow's `device(None)`).
    pub fn with_device_scopes_cleared<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let saved = std::mem::take(&mut self.devices);
        let r = f(self);
        self.devices = saved;
        r
    }

    /// Runs `f` with new nodes colocated with node `with`: they get `_class = ["loc:@with"]`
    /// and its device, and outer device scopes do not apply (as in TensorFlow).
    pub fn with_colocation<R>(&mut self, with: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        let saved_devices = std::mem::take(&mut self.devices);
        let saved = self.colocation.replace(with.to_string());
        let r = f(self);
        self.colocation = saved;
        self.devices = saved_devices;
        r
    }

    /// Adds a node with one output and returns it.
    pub fn add1(&mut self, spec: NodeSpec) -> Result<Output> {
        let op = spec.op.clone();
        let mut outs = self.add_node(spec)?;
        if outs.len() != 1 {
            return Err(Status::internal(format!(
                "op {op} has {} outputs, expected one",
                outs.len()
            )));
        }
        Ok(outs.remove(0))
    }

    /// Adds a node with no outputs (or whose outputs are not needed) and returns its name.
    pub fn add_op(&mut self, spec: NodeSpec) -> Result<String> {
        let name = self.add_returning_name(spec)?;
        Ok(name)
    }

    fn add_returning_name(&mut self, spec: NodeSpec) -> Result<String> {
        self.add_node(spec)?;
        Ok(self
            .nodes
            .last()
            .map(|n| n.name.clone())
            .unwrap_or_default())
    }

    /// Adds a node and returns its outputs; see the module doc for the checks made.
    pub fn add_node(&mut self, spec: NodeSpec) -> Result<Vec<Output>> {
        let def = registry::global().get(&spec.op).ok_or_else(|| {
            Status::not_found(format!("op `{}` is not registered in tessera", spec.op))
        })?;
        let name = match spec.name.as_deref().and_then(|n| n.strip_suffix('/')) {
            // A name ending in `/` is taken as is, as TensorFlow does for scope names.
            Some(exact) => {
                if self.by_name.contains_key(exact) {
                    return Err(Status::already_exists(format!(
                        "graph already has a node `{exact}`"
                    )));
                }
                self.mark_name_used(exact);
                exact.to_string()
            }
            None => self.unique_name(spec.name.as_deref().unwrap_or(def.name)),
        };
        let mut node = NodeDef {
            name: name.clone(),
            op: spec.op.clone(),
            ..Default::default()
        };
        for (k, v) in spec.attrs {
            node.attr.insert(k, v);
        }
        if spec.args.len() != def.inputs.len() {
            return Err(Status::invalid_argument(format!(
                "node `{name}` (op {}): takes {} input arguments ({}), {} given",
                def.name,
                def.inputs.len(),
                def.inputs
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                spec.args.len()
            )));
        }
        infer_type_attrs(def, &mut node, &spec.args)?;
        let inputs: Vec<Output> = spec
            .args
            .iter()
            .flat_map(|a| match a {
                Arg::One(o) => vec![o.clone()],
                Arg::List(l) => l.clone(),
            })
            .collect();
        for o in &inputs {
            if self.meta_of(o).is_none() {
                return Err(Status::invalid_argument(format!(
                    "node `{name}` (op {}): input `{}` is not an output of this graph",
                    def.name,
                    o.name()
                )));
            }
        }
        let mut inputs = inputs;
        let mut control: Vec<String> = self.control.clone();
        control.extend(spec.control);
        // Inside a cond branch or a loop body, external inputs go through a Switch or an
        // Enter first, and the op may get a control input from the context's pivot (see
        // `context.rs`). As in TensorFlow, the nodes this adds are named under the op's
        // own name (`cond/MatMul/Switch`, `while/MatMul/Enter`).
        let context = match self.cf.current {
            Some(c) => {
                let scope = format!("{name}/");
                Some(self.with_name_scope(&scope, |g| {
                    g.cf_add_op(c, &spec.op, &mut inputs, &mut control)
                })?)
            }
            None => None,
        };
        node.input = inputs.iter().map(Output::input_name).collect();
        for c in control {
            let dup = inputs.iter().any(|o| o.node == c)
                || node.input.iter().any(|i| i == &format!("^{c}"));
            if !dup {
                if !self.by_name.contains_key(&c) {
                    return Err(Status::invalid_argument(format!(
                        "node `{name}`: control dependency `{c}` is not a node of this graph"
                    )));
                }
                node.input.push(format!("^{c}"));
            }
        }
        if let Some(with) = &self.colocation {
            node.attr.insert(
                "_class".into(),
                value::string_list([format!("loc:@{with}")]),
            );
            if let Some(d) = self.node(with).map(|n| n.device.clone()) {
                node.device = d;
            }
        }
        node.device = scope::apply_device_scopes(&node, &self.devices)?;
        let meta = self.infer(def, &mut node)?;
        let outputs: Vec<Output> = meta
            .iter()
            .enumerate()
            .map(|(index, m)| Output {
                node: name.clone(),
                index,
                dtype: m.dtype,
                shape: m.shape.clone(),
            })
            .collect();
        self.insert(node, meta);
        if let Some(c) = context {
            self.cf_op_added(c, &name, &outputs);
        }
        Ok(outputs)
    }

    /// Replaces data input `index` of node `node` by `new` (TensorFlow's `_update_input`): how
    /// a loop's `Merge` gets its back edge from the `NextIteration` built after it.
    pub(crate) fn update_input(&mut self, node: &str, index: usize, new: &Output) -> Result<()> {
        let &i = self
            .by_name
            .get(node)
            .ok_or_else(|| Status::internal(format!("no node `{node}` to update")))?;
        let slot = self.nodes[i]
            .input
            .iter_mut()
            .filter(|s| !s.starts_with('^'))
            .nth(index)
            .ok_or_else(|| Status::internal(format!("node `{node}` has no input {index}")))?;
        *slot = new.input_name();
        Ok(())
    }

    /// Adds control input `^from` to node `node` (TensorFlow's `_add_control_input`).
    pub(crate) fn add_control_input(&mut self, node: &str, from: &str) -> Result<()> {
        let &i = self.by_name.get(node).ok_or_else(|| {
            Status::internal(format!("no node `{node}` to add a control input to"))
        })?;
        let dep = format!("^{from}");
        if !self.nodes[i].input.contains(&dep) {
            self.nodes[i].input.push(dep);
        }
        Ok(())
    }

    /// Records that output `o` has shape `shape` (TensorFlow's `set_shape`), returning it.
    pub(crate) fn set_output_shape(&mut self, o: &Output, shape: PartialShape) -> Output {
        if let Some(m) = self
            .by_name
            .get(&o.node)
            .copied()
            .and_then(|i| self.meta[i].get_mut(o.index))
        {
            m.shape = shape.clone();
        }
        Output { shape, ..o.clone() }
    }

    pub(crate) fn insert(&mut self, node: NodeDef, meta: Vec<OutputMeta>) {
        self.by_name.insert(node.name.clone(), self.nodes.len());
        self.nodes.push(node);
        self.meta.push(meta);
    }

    /// Fills attrs, checks input dtypes against the op definition and runs the shape function;
    /// the node's inputs must already be in the graph.
    pub(crate) fn infer(&self, def: &OpDef, node: &mut NodeDef) -> Result<Vec<OutputMeta>> {
        def.fill_and_check_attrs(node)?;
        let want = def.input_types(node)?;
        let data_inputs: Vec<&String> = node.input.iter().filter(|i| !i.starts_with('^')).collect();
        if want.len() != data_inputs.len() {
            return Err(Status::invalid_argument(format!(
                "node `{}` (op {}) has {} data inputs, the op takes {}",
                node.name,
                node.op,
                data_inputs.len(),
                want.len()
            )));
        }
        let mut metas = Vec::with_capacity(want.len());
        // A Merge's input from a NextIteration closes a while loop: the builder meets it
        // before its producer and knows only its dtype.
        let back_edge_meta = |dtype: DType| OutputMeta {
            dtype,
            shape: PartialShape::unknown(),
            value: None,
            shape_value: None,
            handle_shape: None,
        };
        let is_merge = ControlFlowOp::Merge.is(&node.op);
        for (k, (input, &dtype)) in data_inputs.iter().zip(&want).enumerate() {
            let (src, idx) = parse_input(input);
            let loop_back = back_edge_meta(dtype);
            let m = self
                .by_name
                .get(src)
                .and_then(|&i| self.meta[i].get(idx))
                .or(if is_merge && !self.by_name.contains_key(src) {
                    Some(&loop_back)
                } else {
                    None
                })
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "node `{}`: input {k} `{input}` is not an output of this graph",
                        node.name
                    ))
                })?;
            if m.dtype != dtype {
                return Err(Status::invalid_argument(format!(
                    "node `{}` (op {}): input {k} (`{input}`) is {}, the op expects {dtype} here",
                    node.name, node.op, m.dtype
                )));
            }
            metas.push(m.clone());
        }
        let out_types = def.output_types(node)?;
        let shapes: Vec<PartialShape> = metas.iter().map(|m| m.shape.clone()).collect();
        let values: Vec<Option<Vec<i64>>> = metas.iter().map(|m| m.value.clone()).collect();
        let shape_values: Vec<Option<PartialShape>> =
            metas.iter().map(|m| m.shape_value.clone()).collect();
        let handle_shapes: Vec<Option<PartialShape>> =
            metas.iter().map(|m| m.handle_shape.clone()).collect();
        let ctx = ShapeCtx {
            node,
            inputs: &shapes,
            values: &values,
            shape_values: &shape_values,
            handle_shapes: &handle_shapes,
            num_outputs: out_types.len(),
        };
        let mut out_shapes = match def.shape_fn {
            Some(f) => f(&ctx)?,
            None => Vec::new(),
        };
        out_shapes.resize(out_types.len(), PartialShape::unknown());
        let mut out: Vec<OutputMeta> = out_types
            .into_iter()
            .zip(out_shapes)
            .map(|(dtype, shape)| OutputMeta {
                dtype,
                shape,
                value: None,
                shape_value: None,
                handle_shape: None,
            })
            .collect();
        propagate_values(node, &metas, &mut out);
        Ok(out)
    }

    /// Adds a `NoOp` named `name` that runs after `deps`.
    pub fn group(&mut self, name: &str, deps: &[&str]) -> Result<String> {
        let mut spec = NodeSpec::new("NoOp").name(name);
        for d in deps {
            spec = spec.control(d);
        }
        self.add_op(spec)
    }

    /// Returns the kind of variable [`Graph::variable`] creates (resource by default).
    pub fn variable_kind(&self) -> VariableKind {
        self.variable_kind
    }

    /// Sets the kind of variable [`Graph::variable`] creates from now on; slots and the
    /// global step follow it (slots always take their variable's kind).
    pub fn set_variable_kind(&mut self, kind: VariableKind) {
        self.variable_kind = kind;
    }

    /// Runs `f` with [`Graph::variable`] creating variables of `kind`.
    pub fn with_variable_kind<R>(
        &mut self,
        kind: VariableKind,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let saved = std::mem::replace(&mut self.variable_kind, kind);
        let r = f(self);
        self.variable_kind = saved;
        r
    }

    /// Creates a variable named `name` (made unique) starting at `initial`, of the graph's
    /// current [`VariableKind`] (see [`Graph::variable_with_kind`]).
    pub fn variable(&mut self, name: &str, initial: &Output) -> Result<Variable> {
        self.variable_with_kind(name, initial, self.variable_kind)
    }

    /// Creates a variable of `kind`: a resource variable as TensorFlow's `get_variable` does
    /// (`VarHandleOp` `name`, `name/IsInitialized/VarIsInitializedOp`, `name/Assign` writing
    /// `initial`, and `name/Read/ReadVariableOp`, all colocated with the handle), or a
    /// reference variable as `tf.compat.v1.Variable` does (`VariableV2` `name`, `name/Assign`
    /// and the `Identity` `name/read`, colocated with it).
    pub fn variable_with_kind(
        &mut self,
        name: &str,
        initial: &Output,
        kind: VariableKind,
    ) -> Result<Variable> {
        match kind {
            VariableKind::Resource => self.resource_variable(name, initial),
            VariableKind::Reference => self.reference_variable(name, initial),
        }
    }

    fn reference_variable(&mut self, name: &str, initial: &Output) -> Result<Variable> {
        let shape = initial.shape.clone();
        let dtype = initial.dtype;
        if !shape.is_fully_defined() {
            return Err(Status::invalid_argument(format!(
                "reference variable `{name}`: its initial value `{}` has a partly unknown shape \
                 {shape}; give it a static shape",
                initial.name()
            )));
        }
        let scope = self.with_name_scope(name, |g| g.name_scope().to_string());
        let var = self.add1(
            NodeSpec::new("VariableV2")
                .name(&format!("{scope}/"))
                .attr("dtype", value::dtype(dtype))
                .attr("shape", value::shape(&shape))
                .attr("container", value::string(""))
                .attr("shared_name", value::string("")),
        )?;
        let at = format!("{scope}/");
        let (initializer, value) = self.with_name_scope(&at, |g| {
            g.with_colocation(&var.node.clone(), |g| -> Result<(String, Output)> {
                let assign = g.add_op(
                    NodeSpec::new("Assign")
                        .name("Assign")
                        .input(&var)
                        .input(initial)
                        .attr("validate_shape", value::bool(true))
                        .attr("use_locking", value::bool(true)),
                )?;
                let read = g.add1(NodeSpec::new("Identity").name("read").input(&var))?;
                Ok((assign, read))
            })
        })?;
        self.variables.push(initializer.clone());
        Ok(Variable {
            handle: var,
            initializer,
            value,
        })
    }

    fn resource_variable(&mut self, name: &str, initial: &Output) -> Result<Variable> {
        let shape = initial.shape.clone();
        let dtype = initial.dtype;
        let scope = self.with_name_scope(name, |g| g.name_scope().to_string());
        let handle = self.add1(
            NodeSpec::new("VarHandleOp")
                .name(&format!("{scope}/"))
                .attr("dtype", value::dtype(dtype))
                .attr("shape", value::shape(&shape))
                .attr("shared_name", value::string(&scope))
                .attr("debug_name", value::string(format!("{scope}/")))
                .attr("_class", value::string_list([format!("loc:@{scope}")])),
        )?;
        let at = format!("{scope}/");
        let (initializer, value) = self.with_name_scope(&at, |g| {
            g.with_colocation(&handle.node.clone(), |g| -> Result<(String, Output)> {
                g.with_name_scope("IsInitialized", |g| {
                    g.add1(NodeSpec::new("VarIsInitializedOp").input(&handle))
                })?;
                let assign = g.add_op(
                    NodeSpec::new("AssignVariableOp")
                        .name("Assign")
                        .input(&handle)
                        .input(initial)
                        .attr("validate_shape", value::bool(false)),
                )?;
                let read = g.with_name_scope("Read", |g| g.read_variable(&handle))?;
                Ok((assign, read))
            })
        })?;
        self.variables.push(initializer.clone());
        Ok(Variable {
            handle,
            initializer,
            value,
        })
    }

    /// Reads `var`: a new `ReadVariableOp` of a resource variable, the `Identity` `read` of a
    /// reference variable (TensorFlow 1 reads through that one snapshot).
    pub fn read(&mut self, var: &Variable) -> Result<Output> {
        match var.kind() {
            VariableKind::Resource => self.read_variable(&var.handle),
            VariableKind::Reference => Ok(var.value.clone()),
        }
    }

    /// Adds a `ReadVariableOp` of `handle` (a new read per use, as TensorFlow 2 does).
    pub fn read_variable(&mut self, handle: &Output) -> Result<Output> {
        let dtype = self.handle_dtype(handle)?;
        self.add1(
            NodeSpec::new("ReadVariableOp")
                .input(handle)
                .attr("dtype", value::dtype(dtype)),
        )
    }

    fn handle_dtype(&self, handle: &Output) -> Result<DType> {
        let node = self
            .node(&handle.node)
            .ok_or_else(|| Status::not_found(format!("no node `{}`", handle.node)))?;
        if node.op == "VarHandleOp" {
            return crate::graph::attr::dtype(node, "dtype");
        }
        Err(Status::invalid_argument(format!(
            "`{}` is not a variable handle (op {}); pass a VarHandleOp output",
            handle.name(),
            node.op
        )))
    }

    /// Adds a `NoOp` named `init` depending on every variable's initializer.
    pub fn global_variables_initializer(&mut self) -> Result<String> {
        let deps = self.variables.clone();
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        self.group("init", &deps)
    }
}

/// Splits a `NodeDef` input into node name and output index (`^x` is a control input).
pub fn parse_input(input: &str) -> (&str, usize) {
    let input = input.strip_prefix('^').unwrap_or(input);
    match input.rsplit_once(':') {
        Some((n, i)) => match i.parse() {
            Ok(i) => (n, i),
            Err(_) => (input, 0),
        },
        None => (input, 0),
    }
}

/// Sets type and number attrs the caller left out from the inputs given for each argument.
fn infer_type_attrs(def: &OpDef, node: &mut NodeDef, args: &[Arg]) -> Result<()> {
    for (arg_def, arg) in def.inputs.iter().zip(args) {
        let list: Vec<&Output> = match arg {
            Arg::One(o) => vec![o],
            Arg::List(l) => l.iter().collect(),
        };
        if let Some(n) = &arg_def.number_attr {
            node.attr
                .entry(n.clone())
                .or_insert_with(|| value::int(list.len() as i64));
        }
        match &arg_def.ty {
            ArgType::Attr(t) => {
                if let Some(first) = list.first() {
                    node.attr
                        .entry(t.clone())
                        .or_insert_with(|| value::dtype(first.dtype));
                }
            }
            ArgType::List(t) => {
                let types: Vec<DType> = list.iter().map(|o| o.dtype).collect();
                node.attr
                    .entry(t.clone())
                    .or_insert_with(|| value::dtype_list(&types));
            }
            ArgType::Fixed(_) => {}
        }
    }
    Ok(())
}

/// Records the values that shape inference of later nodes can use: small integer constants,
/// shapes read by `Shape`, variable shapes behind handles.
fn propagate_values(node: &NodeDef, inputs: &[OutputMeta], out: &mut [OutputMeta]) {
    match node.op.as_str() {
        "Const" => {
            if let Ok(t) = crate::graph::attr::tensor(node, "value") {
                if let Some(v) = const_value::int_values(t) {
                    if out[0].shape.rank() == Some(1) {
                        out[0].shape_value = Some(PartialShape::new(
                            v.iter()
                                .map(|&d| usize::try_from(d).ok())
                                .collect::<Vec<_>>(),
                        ));
                    }
                    out[0].value = Some(v);
                }
            }
        }
        "Shape" => {
            if let Some(s) = inputs.first().map(|m| m.shape.clone()) {
                if let Some(full) = s.to_shape() {
                    out[0].value = Some(full.dims().iter().map(|&d| d as i64).collect());
                }
                if s.rank().is_some() {
                    out[0].shape_value = Some(s);
                }
            }
        }
        "VarHandleOp" => {
            out[0].handle_shape = crate::graph::attr::shape(node, "shape").ok();
        }
        // Control-flow ops forward their input unchanged (a Switch on both outputs); a loop
        // variable's Merge changes every iteration, so it keeps nothing.
        "Identity" | "StopGradient" | "Enter" | "RefEnter" | "Exit" | "RefExit" | "Switch"
        | "RefSwitch" => {
            if let Some(i) = inputs.first() {
                let outputs = if node.op.contains("Switch") { 2 } else { 1 };
                for o in out.iter_mut().take(outputs) {
                    o.value = i.value.clone();
                    o.shape_value = i.shape_value.clone();
                    o.handle_shape = i.handle_shape.clone();
                }
            }
        }
        _ => {}
    }
}
